/*
 * engine_dumps: flight recorder dumps made by the engine (sim backend), for
 * the ncfsm-trace cases of issue 21 that hand-written fixtures cannot
 * vouch for. Each rank runs on its own thread with its own loop, the ranks
 * joined by the in-process bootstrap; every rank's recorder (a ring of
 * --trace-buffer entries, default 32) is dumped into DIR: on the error that
 * failed the comm (opts.dump_dir), or on request at the end.
 *
 *   engine_dumps CASE DIR [--ops N] [--trace-buffer N]
 *
 *   async_group  3 ranks, async verification (window 1, stall bound 10 s):
 *                N good AllReduce (default 1000), then one group of
 *                AllReduce, Broadcast (count 16 on rank 1, 32 on the
 *                others), AllReduce.
 *   skip_strict  2 ranks, strict verification (stall bound 1 s): one
 *                AllReduce, then rank 0 skips the next one.
 *   skip_async   the same under async verification (window 1).
 *
 * Prints one line per rank (state, how its works ended, its failure).
 * Exit 0 when the case ran as intended (the divergence failed the comm of
 * the ranks that waited, and every rank was dumped), 1 otherwise, 2 usage.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ncfsm.h"
#include "ncfsm/bootstrap.h"

enum { MAX_RANKS = 4, COUNT = 32 };

typedef struct rank_run {
  int rank;
  ncfsm_state_t state;
  int ok, failed;
  ncfsm_result_t cause;
  const char *error; /* a harness error, or NULL */
  char failure[600];
} rank_run;

static const char *g_case, *g_dir;
static int g_nranks, g_ops = 1000;
static unsigned g_trace_buffer = 32;
static atomic_int g_finished; /* ranks done submitting and waiting */
static rank_run g_runs[MAX_RANKS];
static float g_buf[MAX_RANKS][4][COUNT];

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  rank_run *r = arg;
  if (st == NCFSM_OK)
    r->ok++;
  else if (!r->failed++)
    r->cause = st;
}

static ncfsm_result_t allreduce(ncfsm_comm *c, rank_run *r, int b) {
  return ncfsm_allreduce(c, g_buf[r->rank][b], g_buf[r->rank][b], COUNT, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_done,
                         r, NULL);
}

/* Submits the case's collectives; returns how many. */
static int submit(ncfsm_loop *loop, ncfsm_comm *c, rank_run *r) {
  int n = 0;
  if (!strcmp(g_case, "async_group")) {
    for (int k = 0; k < g_ops; k++, n++)
      if (allreduce(c, r, 0) != NCFSM_OK) r->error = "allreduce";
    if (ncfsm_group_start(loop) != NCFSM_OK) r->error = "group start";
    if (allreduce(c, r, 1) != NCFSM_OK) r->error = "group allreduce";
    size_t count = r->rank == 1 ? 16 : 32;
    if (ncfsm_broadcast(c, g_buf[r->rank][2], g_buf[r->rank][2], count, NCFSM_FLOAT32, 0, NULL, on_done, r, NULL) !=
        NCFSM_OK)
      r->error = "group broadcast";
    if (allreduce(c, r, 3) != NCFSM_OK) r->error = "group allreduce";
    if (ncfsm_group_end(loop) != NCFSM_OK) r->error = "group end";
    n += 3;
  } else { /* skip_strict, skip_async */
    if (allreduce(c, r, 0) != NCFSM_OK) r->error = "allreduce";
    n++;
    if (r->rank != 0) {
      if (allreduce(c, r, 1) != NCFSM_OK) r->error = "allreduce";
      n++;
    }
  }
  return n;
}

static void *rank_main(void *arg) {
  rank_run *r = arg;
  ncfsm_loop *loop = NULL;
  ncfsm_boot *boot = NULL;
  ncfsm_comm *c = NULL;
  if (ncfsm_loop_new(NULL, &loop) != NCFSM_OK) {
    r->error = "loop";
    return NULL;
  }
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  bo.kind = NCFSM_BOOT_LOCAL;
  bo.local_group = g_case;
  bo.rank = r->rank;
  bo.size = g_nranks;
  ncfsm_sim_opts so;
  if (ncfsm_sim_opts_init(&so) != NCFSM_OK) {
    r->error = "ncfsm_sim_opts_init";
    return NULL;
  }
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.backend = NCFSM_BACKEND_SIM;
  o.sim = &so;
  o.on_error = NCFSM_ON_ERROR_STAY;
  o.timeout_ms = 20000; /* the watchdog: far later than verification acts */
  o.name = g_case;
  o.dump_dir = g_dir;
  o.trace_buffer = g_trace_buffer;
  int strict = !strcmp(g_case, "skip_strict");
  o.verify = strict ? NCFSM_VERIFY_STRICT : NCFSM_VERIFY_ASYNC;
  o.verify_window = 1;
  /* the skips are caught at the stall bound; the group by its exchange, and
   * a loaded machine must not make a stall of it */
  o.verify_stall_ms = !strcmp(g_case, "async_group") ? 10000 : 1000;
  int n = 0;
  if (ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &boot) != NCFSM_OK) r->error = "bootstrap";
  if (!r->error && ncfsm_comm_new(loop, &o, &c) != NCFSM_OK) r->error = "comm new";
  if (!r->error && ncfsm_comm_init_boot(c, boot) != NCFSM_OK) r->error = "comm init";
  if (!r->error && ncfsm_comm_wait_state(c, NCFSM_STATE_READY, 10000) != NCFSM_OK) r->error = "comm ready";
  if (!r->error) n = submit(loop, c, r);
  /* A rank is finished when its comm failed, or a stall bound after its
   * works ended (its last verification exchanges need the others); every
   * rank runs until all are finished (20 s at most), so that no bootstrap
   * closes early (a closed one would be a lost rank, not a skip). */
  double limit = now_ms() + 20000, t_done = 0, grace = (double)o.verify_stall_ms;
  int counted = 0;
  while (!r->error && now_ms() < limit) {
    if (ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT) != NCFSM_OK) r->error = "loop run";
    if (r->ok + r->failed == n && t_done == 0) t_done = now_ms();
    int done = ncfsm_comm_state(c) == NCFSM_STATE_ERROR || (t_done > 0 && now_ms() - t_done > grace);
    if (done && !counted) counted = 1, atomic_fetch_add(&g_finished, 1);
    if (counted && atomic_load(&g_finished) == g_nranks) break;
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  if (c) {
    r->state = ncfsm_comm_state(c);
    snprintf(r->failure, sizeof r->failure, "%s", ncfsm_comm_failure(c));
    /* a comm that failed was dumped then (opts.dump_dir); the others now */
    if (r->state != NCFSM_STATE_ERROR && ncfsm_comm_dump(c, NULL) != NCFSM_OK) r->error = "dump";
    if (ncfsm_comm_state(c) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(c);
    ncfsm_comm_release(c);
  }
  ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
  if (boot) ncfsm_boot_close(boot);
  if (ncfsm_loop_close(loop) != NCFSM_OK && !r->error) r->error = "loop close";
  return NULL;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--ops") && i + 1 < argc)
      g_ops = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--trace-buffer") && i + 1 < argc)
      g_trace_buffer = (unsigned)atoi(argv[++i]);
    else if (argv[i][0] != '-' && !g_case)
      g_case = argv[i];
    else if (argv[i][0] != '-' && !g_dir)
      g_dir = argv[i];
    else
      g_case = NULL, i = argc;
  }
  if (g_case && !strcmp(g_case, "async_group"))
    g_nranks = 3;
  else if (g_case && (!strcmp(g_case, "skip_strict") || !strcmp(g_case, "skip_async")))
    g_nranks = 2;
  if (!g_nranks || !g_dir || g_ops < 1 || g_trace_buffer < 1) {
    fprintf(stderr, "usage: engine_dumps async_group|skip_strict|skip_async DIR [--ops N] [--trace-buffer N]\n");
    return 2;
  }
  pthread_t th[MAX_RANKS];
  for (int r = 0; r < g_nranks; r++) {
    g_runs[r].rank = r;
    pthread_create(&th[r], NULL, rank_main, &g_runs[r]);
  }
  for (int r = 0; r < g_nranks; r++) pthread_join(th[r], NULL);
  int rc = 0;
  for (int r = 0; r < g_nranks; r++) {
    rank_run *x = &g_runs[r];
    printf("rank %d: %s, %d ok, %d failed (%s)%s%s\n", r, ncfsm_state_name(x->state), x->ok, x->failed,
           x->failed ? ncfsm_err_name(x->cause) : "-", *x->failure ? ": " : "", x->failure);
    if (x->error) {
      printf("rank %d: harness error: %s\n", r, x->error);
      rc = 1;
    }
  }
  /* the ranks that waited for the divergent collective must have failed */
  for (int r = 0; r < g_nranks; r++)
    if ((!strcmp(g_case, "async_group") || r != 0) && g_runs[r].state != NCFSM_STATE_ERROR) {
      printf("rank %d: expected the comm in ERROR\n", r);
      rc = 1;
    }
  return rc; /* the dump thread writes the files before the process exits */
}
