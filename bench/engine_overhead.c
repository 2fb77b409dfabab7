/*
 * bench/engine_overhead: host cost per submitted op of the engine itself
 * (legality, argument checks, fingerprint, batching, launch, completion,
 * callback), measured with the null backend whose calls cost nothing.
 *
 *   engine_overhead [ops-per-run] [runs]       ns/op, median of runs
 *   valgrind --tool=callgrind --collect-atstart=no engine_overhead --callgrind
 *                                              instructions for a measured block
 *
 * Three submission patterns:
 *   pingpong  submit one op, run the loop until it completes (the latency path)
 *   burst     submit N ops on ONE buffer, then run the loop: R12 keeps dependent
 *             ops apart, so each op is its own launch
 *   coalesce  submit N ops over 64 distinct buffers, then run the loop: up to
 *             coalesce_max (64) ops share one backend group
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <valgrind/callgrind.h>

#include "ncfsm.h"

static long done;
static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  (void)arg;
  if (st == NCFSM_OK) done++;
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static float buf[16];
static float ring[64][2];

static void coalesce(ncfsm_loop *loop, ncfsm_comm *c, long n) {
  for (long i = 0; i < n; i++)
    if (ncfsm_allreduce(c, ring[i & 63], ring[i & 63], 1, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_done, NULL,
                        NULL) != NCFSM_OK)
      abort();
  ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT);
}

static void burst(ncfsm_loop *loop, ncfsm_comm *c, long n) {
  for (long i = 0; i < n; i++)
    if (ncfsm_allreduce(c, buf, buf + 8, 1, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_done, NULL, NULL) != NCFSM_OK)
      abort();
  ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT);
}

static void pingpong(ncfsm_loop *loop, ncfsm_comm *c, long n) {
  for (long i = 0; i < n; i++) {
    if (ncfsm_allreduce(c, buf, buf + 8, 1, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_done, NULL, NULL) != NCFSM_OK)
      abort();
    ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT);
  }
}

int main(int argc, char **argv) {
  int callgrind = argc > 1 && !strcmp(argv[1], "--callgrind");
  long n = (!callgrind && argc > 1) ? atol(argv[1]) : 100000;
  int runs = (!callgrind && argc > 2) ? atoi(argv[2]) : 9;
  if (callgrind) n = 10000, runs = 1;
  setenv("NCFSM_BACKEND", "null", 1);

  ncfsm_loop *loop;
  ncfsm_comm *c;
  ncfsm_comm_opts o;
  ncfsm_unique_id id;
  if (ncfsm_loop_new(NULL, &loop) != NCFSM_OK) return 1;
  ncfsm_comm_opts_init(&o);
  o.backend = NCFSM_BACKEND_AUTO;
  if (ncfsm_get_unique_id(o.backend, &id) != NCFSM_OK || ncfsm_comm_new(loop, &o, &c) != NCFSM_OK ||
      ncfsm_comm_init(c, 1, 0, &id) != NCFSM_OK || ncfsm_comm_wait_state(c, NCFSM_STATE_READY, 1000) != NCFSM_OK) {
    fprintf(stderr, "setup failed\n");
    return 1;
  }
  burst(loop, c, 1000); /* warm the work and event free lists */
  coalesce(loop, c, 1000);
  pingpong(loop, c, 1000);

  struct { const char *name; void (*fn)(ncfsm_loop *, ncfsm_comm *, long); } pat[] = {
      {"pingpong", pingpong}, {"burst", burst}, {"coalesce", coalesce}};
  const int npat = (int)(sizeof pat / sizeof pat[0]);
  if (callgrind) {
    for (int p = 0; p < npat; p++) {
      CALLGRIND_ZERO_STATS;
      CALLGRIND_TOGGLE_COLLECT;
      pat[p].fn(loop, c, n);
      CALLGRIND_TOGGLE_COLLECT;
      char name[64];
      snprintf(name, sizeof name, "%s_%ld_ops", pat[p].name, n);
      CALLGRIND_DUMP_STATS_AT(name);
    }
    printf("callgrind: dumped %d blocks of %ld ops each\n", npat, n);
  } else {
    printf("%-10s %10s %12s %12s   (%d runs of %ld ops, null backend)\n", "pattern", "ns/op", "min", "max",
           runs, n);
    for (int p = 0; p < npat; p++) {
      double t[64];
      if (runs > 64) runs = 64;
      for (int r = 0; r < runs; r++) {
        long before = done;
        double t0 = now_ns();
        pat[p].fn(loop, c, n);
        t[r] = (now_ns() - t0) / (double)n;
        if (done - before != n) {
          fprintf(stderr, "only %ld of %ld works completed\n", done - before, n);
          return 1;
        }
      }
      qsort(t, (size_t)runs, sizeof t[0], cmp_d);
      printf("%-10s %10.1f %12.1f %12.1f\n", pat[p].name, t[runs / 2], t[0], t[runs - 1]);
    }
  }
  ncfsm_comm_abort(c);
  ncfsm_comm_release(c);
  ncfsm_loop_close(loop);
  return 0;
}
