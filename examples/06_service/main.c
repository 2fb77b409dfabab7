/*
 * 06_service: a nonblocking averaging service on ncfsm (issue 16), one rank
 * per process: under mpirun (PMIx), from the environment (the TCP store:
 * NCFSM_STORE_ADDR, NCFSM_RANK, NCFSM_WORLD_SIZE), or alone (one rank).
 *
 *   POST /submit   a vector of --count floats (application/json array, or
 *                  application/octet-stream float32): 202, or 400/405/413/415
 *   GET  /average  the average of every vector posted to any rank so far
 *   GET  /status   /metrics   /healthz   (ncfsm_http)
 *
 * SIGTERM or SIGINT stops every rank after the next round. Exit status: 0
 * after a clean stop, 3 when the communicator failed or was aborted, 1 on a
 * set-up error, 77 with --require-gpu and no GPU. See README.md and
 * docs/service.md.
 */
#include <event2/event.h>
#include <event2/thread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "avg_service.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: 06_service [--addr A] [--port P] [--port-file F] [--count N] [--batch B]\n"
          "                  [--interval-ms T] [--max-body BYTES] [--timeout-ms MS] [--on-error stay|abort]\n"
          "                  [--stop-grace-ms MS] [--naive] [--require-gpu]\n"
          "                  [--sim-async-error-at K] [--busy-bytes B --busy-ops K]\n"
          "  --port 0 (default) picks a free port: printed, and written to --port-file\n"
          "  --naive: each collective is waited for inside the event callback that starts it\n"
          "  --sim-async-error-at K: the sim fails this rank's K-th op (0-based) with an async error\n"
          "  --busy-bytes/--busy-ops: K AllReduces of B bytes back to back before the rounds start\n");
}

static void on_signal(evutil_socket_t sig, short what, void *arg) { avg_request_stop(arg); }

int main(int argc, char **argv) {
  avg_opts o;
  avg_opts_init(&o);
  int require_gpu = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int used = 1;
    if (!strcmp(a, "--naive")) { o.naive = 1; used = 0; }
    else if (!strcmp(a, "--require-gpu")) { require_gpu = 1; used = 0; }
    else if (!strcmp(a, "--help")) { usage(stdout); return 0; }
    else if (!v) { usage(stderr); return 1; }
    else if (!strcmp(a, "--addr")) o.address = v;
    else if (!strcmp(a, "--port")) o.port = (unsigned)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--port-file")) o.port_file = v;
    else if (!strcmp(a, "--count")) o.count = strtoul(v, NULL, 10);
    else if (!strcmp(a, "--batch")) o.batch = (unsigned)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--interval-ms")) o.interval_ms = (unsigned)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--max-body")) o.max_body = strtoul(v, NULL, 10);
    else if (!strcmp(a, "--timeout-ms")) o.timeout_ms = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--stop-grace-ms")) o.stop_grace_ms = (unsigned)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--sim-async-error-at")) o.sim_async_error_at = strtoll(v, NULL, 10);
    else if (!strcmp(a, "--busy-bytes")) o.busy_bytes = strtoul(v, NULL, 10);
    else if (!strcmp(a, "--busy-ops")) o.busy_ops = (unsigned)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--on-error") && (!strcmp(v, "stay") || !strcmp(v, "abort")))
      o.on_error = !strcmp(v, "stay") ? NCFSM_ON_ERROR_STAY : NCFSM_ON_ERROR_ABORT;
    else { usage(stderr); return 1; }
    i += used;
  }
  if (require_gpu) {
    ncfsm_backend_info bi;
    if (ncfsm_backend_query(NCFSM_BACKEND_NCCL, &bi) != NCFSM_OK || bi.device_count < 1) {
      printf("SKIP: --require-gpu and no GPU is visible\n");
      return 77;
    }
    o.backend = NCFSM_BACKEND_NCCL;
  }
  /* The base is shared with ncfsm's loop and woken from other threads
   * (bootstrap completions): locks first, then a base with precise timers
   * (ncfsm's poll back-off is in microseconds). */
  if (evthread_use_pthreads() != 0) return 1;
  struct event_config *cfg = event_config_new();
  event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
  struct event_base *base = event_base_new_with_config(cfg);
  event_config_free(cfg);
  if (!base) return 1;
  avg_service *s = NULL;
  if (avg_start(base, &o, &s) != 0) {
    avg_finish(s);
    event_base_free(base);
    return 1;
  }
  printf("06_service rank %d of %d: listening on http://%s:%d (%s)\n", avg_rank(s), avg_size(s), o.address,
         avg_port(s), o.naive ? "naive: blocking collectives in the callbacks" : "ncfsm, nonblocking");
  fflush(stdout);
  struct event *sigterm = evsignal_new(base, SIGTERM, on_signal, s);
  struct event *sigint = evsignal_new(base, SIGINT, on_signal, s);
  event_add(sigterm, NULL);
  event_add(sigint, NULL);
  event_base_dispatch(base);
  avg_counters *c = avg_get_counters(s);
  printf("06_service rank %d: %llu rounds, %llu vectors averaged, %llu submits, %llu rejected requests\n",
         avg_rank(s), (unsigned long long)c->rounds, (unsigned long long)c->vectors_averaged,
         (unsigned long long)c->submits, (unsigned long long)c->rejects);
  int rc = avg_finish(s);
  event_free(sigterm);
  event_free(sigint);
  event_base_free(base);
  return rc;
}
