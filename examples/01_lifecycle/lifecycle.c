/*
 * 01_lifecycle: two ranks driven by one thread, walked through a
 * communicator's whole life; every transition is printed from the trace.
 * Runs on real NCCL when GPUs are visible (one GPU per rank), else on the sim.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ncfsm.h"

#define NRANKS 2
#define COUNT 1024

#define CHECK(call)                                                                       \
  do {                                                                                    \
    ncfsm_result_t r_ = (call);                                                           \
    if (r_ != NCFSM_OK) {                                                                 \
      fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #call, ncfsm_err_name(r_)); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

static uint64_t t0;
static int quiet;    /* during the burst: count launches instead of printing */
static int launches;

static void trace(const ncfsm_trace_rec *r, void *arg) {
  (void)arg;
  if (!t0) t0 = r->time_ns;
  double ms = (double)(r->time_ns - t0) / 1e6;
  if (quiet) {
    if (r->kind == NCFSM_OBJ_COMM && r->rank == 0 && r->event == NCFSM_EV_LAUNCH_PENDING) launches++;
    return;
  }
  if (r->kind == NCFSM_OBJ_COMM) {
    printf("[%8.3f ms] comm rank %d  %-18s --%s--> %s\n", ms, r->rank, ncfsm_state_name(r->state),
           ncfsm_event_name(r->event), ncfsm_state_name(r->next));
  } else {
    char seq[24] = "-"; /* a work takes its seq when it is launched */
    if (r->seq != NCFSM_SEQ_NONE) snprintf(seq, sizeof seq, "%" PRIu64, r->seq);
    printf("[%8.3f ms] work rank %d seq %s  %s -> %s\n", ms, r->rank, seq,
           r->state < 0 ? "(new)" : ncfsm_work_state_name(r->state), ncfsm_work_state_name(r->next));
  }
}

static int done_count;
static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  (void)arg;
  if (st == NCFSM_OK) done_count++;
}

int main(void) {
  ncfsm_loop *loop;
  CHECK(ncfsm_loop_new(NULL, &loop));
  ncfsm_loop_set_trace(loop, trace, NULL);

  ncfsm_comm_opts o;
  CHECK(ncfsm_comm_opts_init(&o)); /* fails on a refused NCFSM_* value (docs/settings.md) */
  o.name = "lifecycle";
  o.timeout_ms = 30000;
  int devices[NRANKS] = {0, 1};
  ncfsm_comm *comm[NRANKS];
  printf("== init %d ranks\n", NRANKS);
  CHECK(ncfsm_comm_init_all(loop, NRANKS, &o, devices, comm));
  for (int r = 0; r < NRANKS; r++) CHECK(ncfsm_comm_wait_state(comm[r], NCFSM_STATE_READY, 60000));

  int32_t host[COUNT];
  void *buf[NRANKS];
  for (int r = 0; r < NRANKS; r++) {
    for (int i = 0; i < COUNT; i++) host[i] = (r + 1) * i;
    CHECK(ncfsm_mem_alloc(comm[r], sizeof host, &buf[r]));
    CHECK(ncfsm_memcpy(comm[r], buf[r], host, sizeof host, 1));
  }

  printf("== one group: in-place AllReduce on every rank (R3: only the outermost end launches)\n");
  ncfsm_work *w[NRANKS];
  CHECK(ncfsm_group_start(loop));
  for (int r = 0; r < NRANKS; r++)
    CHECK(ncfsm_allreduce(comm[r], buf[r], buf[r], COUNT, NCFSM_INT32, NCFSM_OP_SUM, NULL, on_done,
                          NULL, &w[r]));
  CHECK(ncfsm_group_end(loop));
  for (int r = 0; r < NRANKS; r++) {
    CHECK(ncfsm_work_wait(w[r], 60000));
    ncfsm_work_release(w[r]);
  }
  for (int r = 0; r < NRANKS; r++) {
    CHECK(ncfsm_memcpy(comm[r], host, buf[r], sizeof host, 0));
    for (int i = 0; i < COUNT; i++)
      if (host[i] != 3 * i) {
        fprintf(stderr, "rank %d: element %d is %d, expected %d\n", r, i, host[i], 3 * i);
        return 1;
      }
  }
  printf("   data check: PASS (every element = 3*i)\n");

  printf("== 100 ungrouped Broadcasts per rank (coalesced into NCCL groups per loop turn)\n");
  quiet = 1;
  for (int k = 0; k < 100; k++)
    for (int r = 0; r < NRANKS; r++)
      CHECK(ncfsm_broadcast(comm[r], buf[r], buf[r], COUNT, NCFSM_INT32, k % NRANKS, NULL, on_done,
                            NULL, NULL));
  CHECK(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT));
  quiet = 0;
  uint64_t seq0, hash0, hash1;
  CHECK(ncfsm_comm_position(comm[0], &seq0, &hash0));
  CHECK(ncfsm_comm_position(comm[1], NULL, &hash1));
  printf("   %d works completed in %d launches of rank 0 (in-place on one buffer: R12 keeps them\n"
         "   in separate launches; both ranks share each launch); rank 0 next seq %" PRIu64 "\n",
         done_count, launches, seq0);
  printf("   fingerprint hash rank 0 %016" PRIx64 ", rank 1 %016" PRIx64 "\n", hash0, hash1);
  if (hash0 != hash1) {
    fprintf(stderr, "fingerprint hashes differ across ranks\n");
    return 1;
  }

  printf("== misuse is rejected before NCCL sees it\n");
  CHECK(ncfsm_comm_finalize(comm[0]));
  ncfsm_result_t r2 = ncfsm_comm_finalize(comm[0]);
  printf("   second finalize: %s\n   %s\n", ncfsm_err_name(r2), ncfsm_comm_last_error(comm[0]));
  ncfsm_result_t r3 = ncfsm_group_end(loop);
  printf("   group end without start: %s\n   %s\n", ncfsm_err_name(r3), ncfsm_loop_last_error(loop));

  printf("== finalize, destroy, release\n");
  CHECK(ncfsm_comm_finalize(comm[1]));
  for (int r = 0; r < NRANKS; r++) CHECK(ncfsm_comm_wait_state(comm[r], NCFSM_STATE_FINALIZED, 60000));
  for (int r = 0; r < NRANKS; r++) {
    CHECK(ncfsm_mem_free(comm[r], buf[r]));
    CHECK(ncfsm_comm_destroy(comm[r]));
    CHECK(ncfsm_comm_release(comm[r]));
  }
  CHECK(ncfsm_loop_close(loop));
  if (done_count != NRANKS + 100 * NRANKS) {
    fprintf(stderr, "%d works completed successfully, expected %d\n", done_count, NRANKS + 100 * NRANKS);
    return 1;
  }
  printf("== done: %d works completed, all states as expected\n", done_count);
  return 0;
}
