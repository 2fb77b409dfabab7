/*
 * ncfsm-store: the tcp bootstrap's key-value store as a standalone process.
 *
 *   NCFSM_STORE_TOKEN=$(openssl rand -hex 16) ncfsm-store --listen 127.0.0.1:29500
 *   ncfsm-store --listen 127.0.0.1:0 --token T --print-port   # prints the port picked
 *
 * The token is read from NCFSM_STORE_TOKEN unless --token is given (argv is
 * visible to every user through ps; prefer the environment). The limits
 * (docs/bootstrap.md, "Limits"; channels and notices: "Channels", "Notices")
 * come from NCFSM_STORE_* and then from the flags, both in the ranges of the
 * settings table (core/settings.def). Stops on SIGINT/SIGTERM and then exits
 * 0. Exit status 2 for a bad argument or a variable the table refuses (or an
 * NCFSM_STORE_* that is not a setting), 1 when the store cannot start (no
 * token, an address without a port or with one past 65535, a non-loopback
 * address without --allow-remote, the port is taken).
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "bootstrap/boot-internal.h"
#include "bootstrap/tcp-internal.h"
#include "ncfsm/bootstrap.h"
#include "core/log.h"
#include "core/settings.h"

static void usage(FILE *f) {
  fprintf(f, "usage: ncfsm-store [--listen HOST:PORT] [--token T] [--value-max BYTES]\n"
             "                   [--max-bytes BYTES] [--allow-remote] [--print-port] [LIMITS]\n"
             "  --listen      address to listen on (default $NCFSM_STORE_ADDR or 127.0.0.1:29500;\n"
             "                port 0 picks a free port)\n"
             "  --token       job token (default $NCFSM_STORE_TOKEN; required)\n"
             "  --value-max   largest value accepted (default 1048576)\n"
             "  --max-bytes   keys, values, gathers and parked requests (default 1 GiB)\n"
             "  --allow-remote  listen on a non-loopback address (no TLS: trusted networks only)\n"
             "  --print-port  print \"PORT\\n\" on stdout once listening\n"
             "limits (each also NCFSM_STORE_<NAME>, e.g. NCFSM_STORE_MAX_CONNS):\n"
             "  --auth-timeout-ms MS   HELLO within this of the accept (10000)\n"
             "  --frame-timeout-ms MS  a frame whole within this of its first byte (10000)\n"
             "  --max-inflight BYTES   unfinished frames of all connections (64 MiB)\n"
             "  --out-high BYTES       stop reading a client with more replies queued (4 MiB)\n"
             "  --out-max BYTES        close a client with more replies queued (256 MiB)\n"
             "  --out-stall-ms MS      close a client that read no reply for this long (60000)\n"
             "  --max-out BYTES        all clients' queued replies: stop reading past it (256 MiB)\n"
             "  --max-conns N          refuse connections past N (open-file limit - 64)\n"
             "  --max-parked N         parked requests per connection (1024)\n"
             "  --auth-fail-burst N    failed HELLOs per address before throttling (10)\n"
             "  --auth-fail-per-s N    then this many per second (2)\n"
             "  --world-size N         the job's size, fixed at start (default: rank 0's HELLO\n"
             "                         gives it; the other ranks' HELLOs wait for rank 0's)\n"
             "  --heartbeat-ms MS      PINGs on each rank's heartbeat connection this often (1000)\n"
             "  --silence-ms MS        a rank (or, for the ranks, the store) silent this long is\n"
             "                         lost (4000; at least twice the heartbeat)\n"
             "  --no-heartbeat         no heartbeat connections (NCFSM_STORE_HEARTBEAT=0)\n"
             "  --rejoin               a rank whose connection ended may connect again\n"
             "  --rank-secrets         a rank's HELLO must carry its secret, not the token\n"
             "  --max-channels N       channels one rank may hold, until every member closed\n"
             "                         them (1024)\n"
             "  --notices-per-s N      notices one connection may send per second; the store\n"
             "                         drops the others (1000)\n"
             "  --print-rank-secret R/N  print rank R of N's secret (from the token) and exit\n");
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
  (void)sig;
  (void)what;
  event_base_loopexit(arg, NULL);
}

/* Why the environment cannot be taken (into err), or NULL: an unknown NCFSM_STORE_* name, or a
 * value of NCFSM_STORE_ADDR, NCFSM_STORE_TOKEN or the store's rows that the table refuses. */
static const char *env_refused(ncfsm__store_opts *o, char *err, size_t n) {
  ncfsm__setting_val addr, token;
  if (ncfsm__boot_env_unknown(err, n) ||
      ncfsm__setting_get(&ncfsm__settings[NCFSM__SET_STORE_ADDR], &addr, err, n) ||
      ncfsm__setting_get(&ncfsm__settings[NCFSM__SET_STORE_TOKEN], &token, err, n) ||
      ncfsm__store_opts_from_env(o, err, n))
    return err;
  o->listen = addr.s ? addr.s : "127.0.0.1:29500";
  o->token = token.s;
  return NULL;
}

int main(int argc, char **argv) {
  ncfsm__log_init();
  ncfsm__store_opts o;
  ncfsm__store_opts_init(&o);
  char err[512];
  if (env_refused(&o, err, sizeof err)) {
    fprintf(stderr, "ncfsm-store: %s\n", err);
    return 2;
  }
  int print_port = 0;
  const char *secret_of = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const ncfsm__store_flag *sf = ncfsm__store_flag_find(a);
    int takes_value = !strcmp(a, "--listen") || !strcmp(a, "--token") || !strcmp(a, "--print-rank-secret") ||
                      (sf && ncfsm__store_flag_takes_value(sf));
    if (takes_value && i + 1 >= argc) {
      fprintf(stderr, "ncfsm-store: %s needs a value\n", a);
      usage(stderr);
      return 2;
    }
    if (!strcmp(a, "--listen")) {
      o.listen = argv[++i];
    } else if (!strcmp(a, "--token")) {
      o.token = argv[++i];
    } else if (sf) {
      if (ncfsm__store_flag_set(&o, sf, takes_value ? argv[++i] : NULL, err, sizeof err) != 0) {
        fprintf(stderr, "ncfsm-store: %s\n", err);
        return 2;
      }
    } else if (!strcmp(a, "--print-rank-secret")) {
      secret_of = argv[++i];
    } else if (!strcmp(a, "--print-port")) {
      print_port = 1;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "ncfsm-store: unknown argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (secret_of) { /* for launchers: rank R of N's secret */
    unsigned r, n;
    char end;
    char out[65];
    if (sscanf(secret_of, "%u/%u%c", &r, &n, &end) != 2 || r >= n || n > (1u << 22)) {
      fprintf(stderr, "ncfsm-store: --print-rank-secret '%s': expected RANK/SIZE with RANK < SIZE\n",
              secret_of);
      return 2;
    }
    if (ncfsm_boot_rank_secret(o.token, (int)r, (int)n, out) != NCFSM_OK) {
      fprintf(stderr, "ncfsm-store: --print-rank-secret needs the job token: set "
                      "NCFSM_STORE_TOKEN or --token\n");
      return 1;
    }
    printf("%s\n", out);
    return 0;
  }
  signal(SIGPIPE, SIG_IGN);
  struct event_base *base = event_base_new();
  if (!base) {
    fprintf(stderr, "ncfsm-store: event_base_new failed\n");
    return 1;
  }
  ncfsm__store *s;
  if (ncfsm__store_open(base, &o, &s, err, sizeof err) != 0) {
    fprintf(stderr, "ncfsm-store: %s\n", err);
    event_base_free(base);
    return 1;
  }
  struct event *sint = evsignal_new(base, SIGINT, on_signal, base);
  struct event *sterm = evsignal_new(base, SIGTERM, on_signal, base);
  evsignal_add(sint, NULL);
  evsignal_add(sterm, NULL);
  if (print_port) printf("%d\n", ncfsm__store_port(s));
  else fprintf(stderr, "ncfsm-store: listening on %s (port %d)\n", o.listen, ncfsm__store_port(s));
  fflush(stdout);
  event_base_dispatch(base);
  ncfsm__store_stats st;
  ncfsm__store_stats_get(s, &st);
  fprintf(stderr,
          "ncfsm-store: stopping: %llu connections, %llu authenticated, %llu bad token, %llu bad "
          "frames, %llu frames; %llu refused busy, %llu throttled, %llu slow frames, %llu unread "
          "replies, %llu over the input budget, %llu over max parked, %llu ranks gone, %llu rank "
          "conflicts, %llu rejoins refused, %llu allgathers/broadcasts failed, %llu broadcasts done, "
          "%llu agreements done, %llu "
          "agreements failed, %llu LOST frames sent, %d groups held (survivors' and channels), %llu "
          "HELLOs waited for rank 0's, %llu heartbeat connections, %llu ranks lost silent, %llu "
          "channel opens, %llu refused, %d channels held, %llu notices in, %llu out, %llu "
          "dropped, %llu version-1 clients refused; peak %llu bytes held, %llu inflight, %llu "
          "queued out\n",
          (unsigned long long)st.accepted, (unsigned long long)st.authenticated,
          (unsigned long long)st.rejected_token, (unsigned long long)st.closed_bad_frame,
          (unsigned long long)st.frames, (unsigned long long)st.refused_busy,
          (unsigned long long)st.throttled, (unsigned long long)st.closed_slow,
          (unsigned long long)st.closed_unread, (unsigned long long)st.closed_budget,
          (unsigned long long)st.closed_parked, (unsigned long long)st.ranks_gone,
          (unsigned long long)st.rank_conflicts, (unsigned long long)st.rejoin_refused,
          (unsigned long long)st.gathers_failed, (unsigned long long)st.bcasts_done,
          (unsigned long long)st.agreements_done,
          (unsigned long long)st.agreements_failed, (unsigned long long)st.lost_pushed, st.groups,
          (unsigned long long)st.hellos_held, (unsigned long long)st.hb_conns,
          (unsigned long long)st.closed_silent, (unsigned long long)st.chans_opened,
          (unsigned long long)st.chans_refused, st.chans_held, (unsigned long long)st.notices_in,
          (unsigned long long)st.notices_out, (unsigned long long)st.notices_dropped,
          (unsigned long long)st.old_clients, (unsigned long long)st.peak_bytes,
          (unsigned long long)st.peak_inflight, (unsigned long long)st.peak_out);
  ncfsm__store_close(s);
  event_free(sint);
  event_free(sterm);
  event_base_free(base);
  return 0;
}
