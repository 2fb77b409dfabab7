/* The comm's MISMATCH rows (strict verification, R11) in each state that has
 * one, and DRAINING's failures through the verification (tests/rows/rows_comm.h):
 * two ranks over the in-process bootstrap whose collectives differ in count;
 * their batch fails with NCFSM_ERR_MISMATCH on both ranks before NCCL sees
 * it, and the comm goes on in its state. */
#include <string.h>

#include "rows_comm.h"

/* Two ranks with strict verification over one bootstrap group, READY. */
static ncfsm_loop *strict_pair(const char *name, uint64_t stall_ms, ncfsm_comm **c, ncfsm_boot **b) {
  ncfsm_comm_opts o = copts(name);
  o.verify = NCFSM_VERIFY_STRICT;
  o.verify_stall_ms = stall_ms;
  ncfsm_loop *loop = loop_new();
  comms_boot(loop, 2, (const ncfsm_comm_opts *[]){&o, NULL}, c, b, 0);
  for (int r = 0; r < 2; r++) want_state(c[r], NCFSM_STATE_READY);
  return loop;
}

/* The collective whose count differs across the ranks (4 on rank 0, 8 on rank 1). */
static ncfsm_work *differing(ncfsm_comm *c, int r) {
  ncfsm_work *w = NULL;
  assert_int_equal(ncfsm_allreduce(c, g_buf[4 + r], g_buf[4 + r], r ? 8 : 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL,
                                   &w),
                   NCFSM_OK);
  return w;
}

static void mismatched(ncfsm_comm *c, ncfsm_work *w) {
  want_work(w, NCFSM_WORK_FAILED, NCFSM_ERR_MISMATCH, -1);
  want_text(c, false, "differs across ranks in count (R11)");
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
}

/* READY -MISMATCH-> READY, and GROUP_OPEN -MISMATCH-> GROUP_OPEN: the
 * exchange settles while a group holds the next op of both ranks. */
void test_mismatch_ready_and_group(void **state) {
  (void)state;
  static const char *const R[][3] = {{"READY", "MISMATCH", NULL}, {"GROUP_OPEN", "MISMATCH", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = strict_pair("strict", 0, c, b);
  uint64_t calls = backend_calls(c[0]);
  ncfsm_work *m[2];
  for (int r = 0; r < 2; r++) m[r] = differing(c[r], r);
  for (int r = 0; r < 2; r++) mismatched(c[r], m[r]);
  assert_int_equal(backend_calls(c[0]), calls); /* nothing of it reached NCCL */
  for (int r = 0; r < 2; r++) m[r] = differing(c[r], r);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = op(c[r], r);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_comm_state(c[r]), NCFSM_STATE_GROUP_OPEN);
    until_work(c[r], m[r], NCFSM_WORK_FAILED); /* settled with the group open */
    mismatched(c[r], m[r]);
  }
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  for (int r = 0; r < 2; r++) {
    want_work(w[r], NCFSM_WORK_COMPLETED, NCFSM_OK, -1);
    assert_int_equal(ncfsm_work_release(w[r]), NCFSM_OK);
  }
  assert_int_equal(g_buf[0][0], 3);
  world_down(loop, c, 2, b, 2);
  rows_expect_end(&e);
}

/* LAUNCH_IN_PROGRESS -MISMATCH-> and DRAIN_LAUNCH_IN_PROGRESS -MISMATCH->: a
 * verified collective's launch never becomes final (the kit's SLOW fault) when
 * the next one's exchange settles; rank 0 has finalized meanwhile. */
void test_mismatch_launching(void **state) {
  (void)state;
  static const char *const R[][3] = {{"LAUNCH_IN_PROGRESS", "MISMATCH", NULL},
                                     {"DRAIN_LAUNCH_IN_PROGRESS", "MISMATCH", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  kit_begin("comm.mismatch_launching");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_SLOW, "strictslow", -1);
  f.when = NCFSM_AT_STATE;
  f.state = NCFSM_STATE_LAUNCH_IN_PROGRESS;
  f.polls = -1;
  kit_fault(&f);
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = strict_pair("strictslow", 0, c, b);
  ncfsm_work *a[2], *m[2];
  for (int r = 0; r < 2; r++) a[r] = op(c[r], r);
  for (int r = 0; r < 2; r++) until_state(c[r], NCFSM_STATE_LAUNCH_IN_PROGRESS);
  for (int r = 0; r < 2; r++) m[r] = differing(c[r], r);
  assert_int_equal(ncfsm_comm_finalize(c[0]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_DRAIN_LAUNCH_IN_PROGRESS);
  for (int r = 0; r < 2; r++) mismatched(c[r], m[r]);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_DRAIN_LAUNCH_IN_PROGRESS);
  assert_int_equal(ncfsm_comm_state(c[1]), NCFSM_STATE_LAUNCH_IN_PROGRESS);
  assert_int_equal(ncfsm_work_state(a[0]), NCFSM_WORK_LAUNCHING);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_work_release(a[r]), NCFSM_OK);
  world_down(loop, c, 2, b, 2);
  kit_end();
  rows_expect_end(&e);
}

/* DRAINING -MISMATCH->: both ranks finalize with the collective's exchange
 * out (the queue is not drained until it settles); then FINALIZED. */
void test_mismatch_draining(void **state) {
  (void)state;
  static const char *const R[][3] = {{"DRAINING", "MISMATCH", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = strict_pair("strictdrain", 0, c, b);
  ncfsm_work *m[2];
  for (int r = 0; r < 2; r++) {
    m[r] = differing(c[r], r);
    assert_int_equal(ncfsm_comm_finalize(c[r]), NCFSM_OK);
  }
  for (int r = 0; r < 2; r++) mismatched(c[r], m[r]);
  for (int r = 0; r < 2; r++) want_state(c[r], NCFSM_STATE_FINALIZED);
  world_down(loop, c, 2, b, 2);
  rows_expect_end(&e);
}

/* SPLITTING -MISMATCH->: rank 0 splits first and waits for rank 1; the
 * collective queued on it settles meanwhile (rank 1: READY -MISMATCH->). */
void test_mismatch_splitting(void **state) {
  (void)state;
  static const char *const R[][3] = {{"SPLITTING", "MISMATCH", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_comm *c[4];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = strict_pair("strictsplit", 0, c, b);
  ncfsm_comm_opts ko = copts("strictchild"); /* verification off: a child has no bootstrap */
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_new(loop, &ko, &c[2 + r]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_split(c[0], 0, 0, c[2]), NCFSM_OK);
  ncfsm_work *m[2];
  for (int r = 0; r < 2; r++) m[r] = differing(c[r], r);
  mismatched(c[0], m[0]);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_SPLITTING);
  mismatched(c[1], m[1]);
  assert_int_equal(ncfsm_comm_split(c[1], 0, 1, c[3]), NCFSM_OK);
  for (int r = 0; r < 2; r++) want_state(c[2 + r], NCFSM_STATE_READY);
  world_down(loop, c, 4, b, 2);
  rows_expect_end(&e);
}

/* DRAINING -ASYNC_ERROR-> (the exchange's channel fails: the peer's comm
 * closed) and DRAINING -TIMEOUT-> (the exchange stalls): rank 0 finalizes with a
 * collective its peer never submits. */
void test_draining_verify_failures(void **state) {
  (void)state;
  static const char *const R[][3] = {{"DRAINING", "ASYNC_ERROR", NULL}, {"DRAINING", "TIMEOUT", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  for (int how = 0; how < 2; how++) {
    ncfsm_comm *c[2];
    ncfsm_boot *b[2];
    ncfsm_loop *loop = strict_pair("strictdrainfail", how ? FAST_MS : 0, c, b);
    ncfsm_work *w = op(c[0], 0);
    assert_int_equal(ncfsm_comm_finalize(c[0]), NCFSM_OK);
    run_turns(loop, 3);
    assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_DRAINING); /* its exchange is out */
    if (!how) /* rank 1's comm closes: so does its verification's channel, under rank 0's exchange */
      assert_int_equal(ncfsm_comm_abort(c[1]), NCFSM_OK);
    want_state(c[0], NCFSM_STATE_ERROR);
    want_text(c[0], true, how ? "strict verification: not every rank submitted collective seq 0" : "NCFSM_ERR_BOOTSTRAP");
    want_text(c[0], true, "in state DRAINING");
    want_work(w, how ? NCFSM_WORK_TIMED_OUT : NCFSM_WORK_FAILED, how ? NCFSM_ERR_TIMEOUT : NCFSM_ERR_BOOTSTRAP, -1);
    assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
    world_down(loop, c, 2, b, 2);
  }
  rows_expect_end(&e);
}
