/*
 * local_drift: one process drives the ranks of one clique (one GPU each on
 * the nccl backend), the loop runs on its own thread (ncfsm_loop_start_thread)
 * and each rank's AllReduces are submitted by a thread of its own, as fast as
 * it can: the ranks drift apart (R13). Before the per-comm launch queues the
 * works stopped completing after about 1,000 ops on 2 H200s (NCCL 2.28.3 and
 * 2.28.9). Every op is out of place on its own slice of one buffer, so every
 * op's result is checked at the end: sum over ranks of (rank + 1) * (k + 1).
 *
 *   local_drift [--ops N] [--count C] [--ranks R] [--late-ms MS]
 *               [--single-thread] [--timeout-ms MS] [--require-gpu]
 *
 * The backend comes from NCFSM_BACKEND (auto: nccl when GPUs are visible).
 * Exit 0: every op completed with NCFSM_OK and correct data; 1: failure;
 * 77: skipped (--require-gpu and fewer than R GPUs, or no nccl backend).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ncfsm.h>

#define MAXR 8

static int nops = 3000, count = 64, nranks = 2, late_ms = 100, single = 0, require_gpu = 0;
static uint64_t timeout_ms = 15000;

static ncfsm_comm *comm[MAXR];
static float *sendb[MAXR], *recvb[MAXR];
static atomic_int done[MAXR], bad_status[MAXR];
static atomic_int submitted[MAXR];
static atomic_int max_submit_drift; /* largest (rank 0 submitted - another rank submitted) */
static ncfsm_result_t first_bad[MAXR];

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  int r = (int)(intptr_t)arg;
  if (st != NCFSM_OK && atomic_fetch_add(&bad_status[r], 1) == 0) first_bad[r] = st;
  atomic_fetch_add(&done[r], 1);
}

static int submit_one(int r, int k) {
  ncfsm_result_t rc = ncfsm_allreduce(comm[r], sendb[r] + (size_t)k * count, recvb[r] + (size_t)k * count,
                                      (size_t)count, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_done,
                                      (void *)(intptr_t)r, NULL);
  if (rc != NCFSM_OK) {
    fprintf(stderr, "rank %d op %d: submit %s: %s\n", r, k, ncfsm_err_name(rc), ncfsm_comm_last_error(comm[r]));
    return -1;
  }
  int mine = atomic_fetch_add(&submitted[r], 1) + 1;
  for (int p = 0; p < nranks; p++) {
    int d = mine - atomic_load(&submitted[p]), m = atomic_load(&max_submit_drift);
    while (d > m && !atomic_compare_exchange_weak(&max_submit_drift, &m, d)) {}
  }
  return 0;
}

static void *submitter(void *arg) {
  int r = (int)(intptr_t)arg;
  if (r > 0 && late_ms > 0) usleep((useconds_t)late_ms * 1000u); /* rank 0 runs ahead */
  for (int k = 0; k < nops; k++)
    if (submit_one(r, k)) return (void *)1;
  return NULL;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--ops") && i + 1 < argc) nops = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--count") && i + 1 < argc) count = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) nranks = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--late-ms") && i + 1 < argc) late_ms = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--timeout-ms") && i + 1 < argc) timeout_ms = (uint64_t)atoll(argv[++i]);
    else if (!strcmp(argv[i], "--single-thread")) single = 1;
    else if (!strcmp(argv[i], "--require-gpu")) require_gpu = 1;
    else {
      fprintf(stderr, "usage: %s [--ops N] [--count C] [--ranks R] [--late-ms MS] [--single-thread] "
                      "[--timeout-ms MS] [--require-gpu]\n", argv[0]);
      return 2;
    }
  }
  if (nops < 1 || count < 1 || nranks < 2 || nranks > MAXR) {
    fprintf(stderr, "local_drift: need --ops >= 1, --count >= 1, 2 <= --ranks <= %d\n", MAXR);
    return 2;
  }
  ncfsm_backend_info bi;
  ncfsm_result_t qr = ncfsm_backend_query(NCFSM_BACKEND_AUTO, &bi);
  if (require_gpu && (qr != NCFSM_OK || bi.kind != NCFSM_BACKEND_NCCL || bi.device_count < nranks)) {
    printf("local_drift: SKIP: needs the nccl backend and %d GPUs (%s)\n", nranks,
           qr == NCFSM_OK ? "found fewer" : bi.why);
    return 77;
  }
  if (qr != NCFSM_OK) {
    fprintf(stderr, "local_drift: no backend: %s\n", bi.why);
    return 1;
  }
  printf("local_drift: backend %s (NCCL %d), %d ranks in one process, loop thread, %s, %d ops of %d "
         "floats per rank, rank>0 starts %d ms late, watchdog %" PRIu64 " ms\n",
         bi.name, bi.nccl_version, nranks, single ? "one submitting thread" : "one submitting thread per rank",
         nops, count, single ? 0 : late_ms, timeout_ms);

  ncfsm_loop *loop;
  if (ncfsm_loop_new(NULL, &loop) != NCFSM_OK) return 1;
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.timeout_ms = timeout_ms;
  o.name = "drift";
  int devices[MAXR];
  for (int r = 0; r < nranks; r++) devices[r] = bi.kind == NCFSM_BACKEND_NCCL ? r : 0;
  if (ncfsm_comm_init_all(loop, nranks, &o, devices, comm) != NCFSM_OK) {
    fprintf(stderr, "local_drift: init_all: %s\n", ncfsm_loop_last_error(loop));
    return 1;
  }
  for (int r = 0; r < nranks; r++)
    if (ncfsm_comm_wait_state(comm[r], NCFSM_STATE_READY, 120000) != NCFSM_OK) {
      fprintf(stderr, "rank %d: not READY: %s\n", r, ncfsm_comm_last_error(comm[r]));
      return 1;
    }
  size_t elems = (size_t)nops * (size_t)count;
  float *host = malloc(elems * sizeof *host);
  if (!host) return 1;
  for (int r = 0; r < nranks; r++) {
    if (ncfsm_mem_alloc(comm[r], elems * sizeof(float), (void **)&sendb[r]) != NCFSM_OK ||
        ncfsm_mem_alloc(comm[r], elems * sizeof(float), (void **)&recvb[r]) != NCFSM_OK) {
      fprintf(stderr, "rank %d: cannot allocate %zu bytes\n", r, 2 * elems * sizeof(float));
      return 1;
    }
    for (int k = 0; k < nops; k++)
      for (int i = 0; i < count; i++) host[(size_t)k * count + i] = (float)((r + 1) * (k + 1));
    ncfsm_memcpy(comm[r], sendb[r], host, elems * sizeof(float), 1);
    memset(host, 0, elems * sizeof *host);
    ncfsm_memcpy(comm[r], recvb[r], host, elems * sizeof(float), 1);
  }
  if (ncfsm_loop_start_thread(loop) != NCFSM_OK) {
    fprintf(stderr, "local_drift: loop thread: %s\n", ncfsm_loop_last_error(loop));
    return 1;
  }
  double t0 = now_ms();
  pthread_t th[MAXR];
  int submit_failed = 0;
  if (single) {
    for (int k = 0; k < nops && !submit_failed; k++)
      for (int r = 0; r < nranks; r++) submit_failed |= submit_one(r, k) != 0;
  } else {
    for (int r = 0; r < nranks; r++) pthread_create(&th[r], NULL, submitter, (void *)(intptr_t)r);
    for (int r = 0; r < nranks; r++) {
      void *ret;
      pthread_join(th[r], &ret);
      submit_failed |= ret != NULL;
    }
  }
  /* Wait for every callback (or the watchdog plus a margin). */
  int max_drift = 0;
  double limit = t0 + (double)timeout_ms + 30000.0;
  for (;;) {
    int all = 1, lo = nops, hi = 0;
    for (int r = 0; r < nranks; r++) {
      int d = atomic_load(&done[r]);
      if (d < atomic_load(&submitted[r])) all = 0;
      if (d < lo) lo = d;
      if (d > hi) hi = d;
    }
    if (hi - lo > max_drift) max_drift = hi - lo;
    if (all || now_ms() > limit) break;
    usleep(1000);
  }
  double elapsed = now_ms() - t0;
  ncfsm_loop_stop_thread(loop);
  int failures = submit_failed;
  for (int r = 0; r < nranks; r++) {
    int d = atomic_load(&done[r]), s = atomic_load(&submitted[r]), b = atomic_load(&bad_status[r]);
    int wrong = 0, first_wrong = -1;
    ncfsm_memcpy(comm[r], host, recvb[r], elems * sizeof(float), 0);
    for (int k = 0; k < s; k++) {
      float want = (float)(nranks * (nranks + 1) / 2 * (k + 1));
      for (int i = 0; i < count; i++)
        if (host[(size_t)k * count + i] != want) {
          if (first_wrong < 0) first_wrong = k;
          wrong++;
          break;
        }
    }
    printf("rank %d: submitted %d, callbacks %d, not OK %d%s%s%s, wrong data in %d ops, state %s\n", r, s, d,
           b, b ? " (first: " : "", b ? ncfsm_err_name(first_bad[r]) : "", b ? ")" : "", wrong,
           ncfsm_state_name(ncfsm_comm_state(comm[r])));
    if (first_wrong >= 0) printf("        first wrong op %d\n", first_wrong);
    if (s != nops || d != s || b || wrong) failures++;
    if (b || d != s) printf("        last error: %s\n", ncfsm_comm_last_error(comm[r]));
  }
  printf("local_drift: %d ops per rank in %.1f ms; largest drift between ranks: %d ops submitted, %d ops "
         "completed: %s\n", nops, elapsed, atomic_load(&max_submit_drift), max_drift, failures ? "FAIL" : "PASS");
  for (int r = 0; r < nranks; r++) {
    if (ncfsm_comm_state(comm[r]) == NCFSM_STATE_READY) {
      ncfsm_comm_finalize(comm[r]);
    }
  }
  for (int r = 0; r < nranks; r++) {
    if (ncfsm_comm_wait_state(comm[r], NCFSM_STATE_FINALIZED, 60000) == NCFSM_OK) ncfsm_comm_destroy(comm[r]);
    if (ncfsm_comm_state(comm[r]) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(comm[r]);
    ncfsm_mem_free(comm[r], sendb[r]);
    ncfsm_mem_free(comm[r], recvb[r]);
    ncfsm_comm_release(comm[r]);
  }
  free(host);
  if (ncfsm_loop_close(loop) != NCFSM_OK) {
    fprintf(stderr, "local_drift: loop close: %s\n", ncfsm_loop_last_error(loop));
    failures++;
  }
  return failures ? 1 : 0;
}
