/*
 * ncfsm-store: the tcp bootstrap's key-value store as a standalone process.
 *
 *   NCFSM_STORE_TOKEN=$(openssl rand -hex 16) ncfsm-store --listen 127.0.0.1:29500
 *   ncfsm-store --listen 127.0.0.1:0 --token T --print-port   # prints the port picked
 *
 * The token is read from NCFSM_STORE_TOKEN unless --token is given (argv is
 * visible to every user through ps; prefer the environment). Stops on
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
#include "core/log.h"

static void usage(FILE *f) {
  fprintf(f, "usage: ncfsm-store [--listen HOST:PORT] [--token T] [--value-max BYTES]\n"
             "                   [--max-bytes BYTES] [--allow-remote] [--print-port]\n"
             "  --listen      address to listen on (default $NCFSM_STORE_ADDR or 127.0.0.1:29500;\n"
             "                port 0 picks a free port)\n"
             "  --token       job token (default $NCFSM_STORE_TOKEN; required)\n"
             "  --value-max   largest value accepted (default 1048576)\n"
             "  --max-bytes   total bytes the store may hold (default 1 GiB)\n"
             "  --allow-remote  listen on a non-loopback address (no TLS: trusted networks only)\n"
             "  --print-port  print \"PORT\\n\" on stdout once listening\n");
}

/* A positive integer no larger than max (decimal, or 0x hex); else a clear
 * error and -1. */
static int parse_size(const char *opt, const char *v, unsigned long long max, unsigned long long *out) {
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 0); /* accepts a sign: refused below */
  if (strchr(v, '-') || end == v || *end || errno || x == 0 || x > max) {
    fprintf(stderr, "ncfsm-store: %s '%s': expected a number of bytes from 1 to %llu\n", opt, v, max);
    return -1;
  }
  *out = x;
  return 0;
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
  o.allow_remote = ncfsm__env_ll("NCFSM_STORE_ALLOW_REMOTE", 0) != 0;
  int print_port = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int takes_value = !strcmp(a, "--listen") || !strcmp(a, "--token") || !strcmp(a, "--value-max") ||
                      !strcmp(a, "--max-bytes");
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
          "frames, %llu frames\n",
          (unsigned long long)st.accepted, (unsigned long long)st.authenticated,
          (unsigned long long)st.rejected_token, (unsigned long long)st.closed_bad_frame,
          (unsigned long long)st.frames);
  ncfsm__store_close(s);
  event_free(sint);
  event_free(sterm);
  event_base_free(base);
  return 0;
}
