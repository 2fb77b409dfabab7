/*
 * ncfsm-store: the tcp bootstrap's key-value store as a standalone process.
 *
 *   NCFSM_STORE_TOKEN=$(openssl rand -hex 16) ncfsm-store --listen 127.0.0.1:29500
 *   ncfsm-store --listen 127.0.0.1:0 --token T --print-port   # prints the port picked
 *
 * The token is read from NCFSM_STORE_TOKEN unless --token is given (argv is
 * visible to every user through ps; prefer the environment). The limits
 * (docs/bootstrap.md, "Limits"; channels and notices: "Channels", "Notices")
 * come from NCFSM_STORE_* and then from the flags. Stops on
 * SIGINT/SIGTERM and then exits 0. Exit status 2 for a bad argument, 1 when
 * the store cannot start (no token, a non-loopback address without
 * --allow-remote, the port is taken).
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "bootstrap/tcp-internal.h"
#include "ncfsm/bootstrap.h"
#include "core/log.h"

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

/* A positive integer no larger than max (decimal, or 0x hex); else a clear
 * error and -1. */
static int parse_num(const char *opt, const char *v, unsigned long long max, const char *unit,
                     unsigned long long *out) {
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 0); /* accepts a sign: refused below */
  if (strchr(v, '-') || end == v || *end || errno || x == 0 || x > max) {
    fprintf(stderr, "ncfsm-store: %s '%s': expected a number%s from 1 to %llu\n", opt, v, unit, max);
    return -1;
  }
  *out = x;
  return 0;
}
static int parse_size(const char *opt, const char *v, unsigned long long max, unsigned long long *out) {
  return parse_num(opt, v, max, " of bytes", out);
}

/* The numeric limit flags: name, bytes or not, and where they go. */
typedef struct num_flag {
  const char *name;
  int bytes;
  unsigned long long max;
} num_flag;
static const num_flag num_flags[] = {
    {"--auth-timeout-ms", 0, 86400000ull}, {"--frame-timeout-ms", 0, 86400000ull},
    {"--max-inflight", 1, UINT64_MAX},     {"--out-high", 1, UINT64_MAX},
    {"--out-max", 1, UINT64_MAX},          {"--out-stall-ms", 0, 86400000ull},
    {"--max-out", 1, UINT64_MAX},
    {"--max-conns", 0, 1u << 30},          {"--max-parked", 0, UINT32_MAX},
    {"--auth-fail-burst", 0, UINT32_MAX},  {"--auth-fail-per-s", 0, UINT32_MAX},
    {"--world-size", 0, 1u << 22},         {"--heartbeat-ms", 0, 3600000ull},
    {"--silence-ms", 0, 86400000ull},      {"--max-channels", 0, UINT32_MAX},
    {"--notices-per-s", 0, UINT32_MAX},
};

static void set_num(ncfsm__store_opts *o, const char *name, unsigned long long x) {
  if (!strcmp(name, "--auth-timeout-ms")) o->auth_timeout_ms = x;
  else if (!strcmp(name, "--frame-timeout-ms")) o->frame_timeout_ms = x;
  else if (!strcmp(name, "--max-inflight")) o->max_inflight = x;
  else if (!strcmp(name, "--out-high")) o->out_high = x;
  else if (!strcmp(name, "--out-max")) o->out_max = x;
  else if (!strcmp(name, "--out-stall-ms")) o->out_stall_ms = x;
  else if (!strcmp(name, "--max-out")) o->max_out = x;
  else if (!strcmp(name, "--max-conns")) o->max_conns = (int)x;
  else if (!strcmp(name, "--max-parked")) o->max_parked = (uint32_t)x;
  else if (!strcmp(name, "--auth-fail-burst")) o->auth_fail_burst = (uint32_t)x;
  else if (!strcmp(name, "--auth-fail-per-s")) o->auth_fail_per_s = (uint32_t)x;
  else if (!strcmp(name, "--world-size")) o->world_size = (uint32_t)x;
  else if (!strcmp(name, "--heartbeat-ms")) o->heartbeat_ms = x;
  else if (!strcmp(name, "--silence-ms")) o->silence_ms = x;
  else if (!strcmp(name, "--max-channels")) o->max_channels = (uint32_t)x;
  else if (!strcmp(name, "--notices-per-s")) o->notices_per_s = (uint32_t)x;
}

static const num_flag *find_num_flag(const char *a) {
  for (size_t i = 0; i < sizeof num_flags / sizeof num_flags[0]; i++)
    if (!strcmp(a, num_flags[i].name)) return &num_flags[i];
  return NULL;
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
  (void)sig;
  (void)what;
  event_base_loopexit(arg, NULL);
}

int main(int argc, char **argv) {
  ncfsm__log_init();
  ncfsm__store_opts o;
  ncfsm__store_opts_init(&o);
  o.listen = ncfsm__env_str("NCFSM_STORE_ADDR", "127.0.0.1:29500");
  o.token = ncfsm__env_str("NCFSM_STORE_TOKEN", NULL);
  ncfsm__store_opts_env(&o);
  int print_port = 0;
  const char *secret_of = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const num_flag *nf = find_num_flag(a);
    int takes_value = !strcmp(a, "--listen") || !strcmp(a, "--token") || !strcmp(a, "--value-max") ||
                      !strcmp(a, "--max-bytes") || !strcmp(a, "--print-rank-secret") || nf;
    if (takes_value && i + 1 >= argc) {
      fprintf(stderr, "ncfsm-store: %s needs a value\n", a);
      usage(stderr);
      return 2;
    }
    unsigned long long x;
    if (!strcmp(a, "--listen")) {
      o.listen = argv[++i];
    } else if (!strcmp(a, "--token")) {
      o.token = argv[++i];
    } else if (!strcmp(a, "--value-max")) {
      if (parse_size(a, argv[++i], UINT32_MAX, &x)) return 2;
      o.value_max = (uint32_t)x;
    } else if (!strcmp(a, "--max-bytes")) {
      if (parse_size(a, argv[++i], UINT64_MAX, &x)) return 2;
      o.max_bytes = x;
    } else if (nf) {
      if (parse_num(a, argv[++i], nf->max, nf->bytes ? " of bytes" : "", &x)) return 2;
      set_num(&o, a, x);
    } else if (!strcmp(a, "--no-heartbeat")) {
      o.heartbeat_off = 1;
    } else if (!strcmp(a, "--rejoin")) {
      o.rejoin = 1;
    } else if (!strcmp(a, "--rank-secrets")) {
      o.rank_secrets = 1;
    } else if (!strcmp(a, "--print-rank-secret")) {
      secret_of = argv[++i];
    } else if (!strcmp(a, "--allow-remote")) {
      o.allow_remote = 1;
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
  char err[512];
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
