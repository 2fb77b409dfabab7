/*
 * Every row of fsm/work.def walked (tests/rows/rows.h): a work from its
 * submission to each of its final states, from each state it can be in
 * (QUEUED, VERIFYING, LAUNCHING, IN_FLIGHT), on the sim through the public
 * API. Each scenario checks what the row promises: the final state and
 * status, the callback's status (once), the seq taken at launch, the times.
 */
#include <string.h>

#include "rows_world.h"

#define M "work"
#define FAST_MS 30 /* a watchdog for phases that never end */

static float sb[4][8], rb[4][8];

static ncfsm_work *allreduce(ncfsm_comm *c, int r, size_t count, int cbi) {
  ncfsm_work *w = NULL;
  for (int i = 0; i < 8; i++) sb[r][i] = (float)(r + 1);
  assert_int_equal(ncfsm_allreduce(c, sb[r], rb[r], count, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL,
                                   cbi >= 0 ? count_cb : NULL, (void *)(intptr_t)cbi, &w),
                   NCFSM_OK);
  return w;
}

/* QUEUED -LAUNCH-> LAUNCHING -LAUNCH_FINAL-> IN_FLIGHT -COMPLETE-> COMPLETED. */
static void test_completes(void **state) {
  (void)state;
  reset_cbs();
  unsigned l0 = rows_hits(M, "QUEUED", "LAUNCH", "ANY"), f0 = rows_hits(M, "LAUNCHING", "LAUNCH_FINAL", "ANY"),
           c0 = rows_hits(M, "IN_FLIGHT", "COMPLETE", "ANY");
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = allreduce(c[r], r, 8, r);
  assert_int_equal(ncfsm_work_fingerprint(w[0])->seq, NCFSM_SEQ_NONE); /* taken at launch */
  for (int r = 0; r < 2; r++) want_work(w[r], NCFSM_WORK_COMPLETED, NCFSM_OK, r);
  ROW_FIRED(M, "QUEUED", "LAUNCH", "ANY", l0);
  ROW_FIRED(M, "LAUNCHING", "LAUNCH_FINAL", "ANY", f0);
  ROW_FIRED(M, "IN_FLIGHT", "COMPLETE", "ANY", c0);
  assert_int_equal(ncfsm_work_fingerprint(w[0])->seq, 0);
  ncfsm_work_times t;
  assert_int_equal(ncfsm_work_get_times(w[0], &t), NCFSM_OK);
  assert_true(t.submit_ns && t.launch_ns >= t.submit_ns && t.final_ns >= t.launch_ns && t.complete_ns >= t.final_ns);
  assert_true(rb[0][0] == 3.0f && rb[1][7] == 3.0f);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_work_release(w[r]), NCFSM_OK);
  teardown_all(loop, c, 2);
}

/* QUEUED -FAIL-> FAILED: a call of its group failed, so it never reaches NCCL (R3). */
static void test_queued_fail(void **state) {
  (void)state;
  reset_cbs();
  unsigned f0 = rows_hits(M, "QUEUED", "FAIL", "ANY");
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  uint64_t calls = backend_calls(c[0]);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  ncfsm_work *w = allreduce(c[0], 0, 8, 0);
  assert_int_equal(ncfsm_allreduce(c[0], sb[0], rb[0], 8, (ncfsm_dtype_t)99, NCFSM_OP_SUM, NULL, NULL, NULL, NULL),
                   NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_ERR_INVALID_ARGUMENT);
  want_work(w, NCFSM_WORK_FAILED, NCFSM_ERR_GROUP, 0);
  ROW_FIRED(M, "QUEUED", "FAIL", "ANY", f0);
  assert_int_equal(backend_calls(c[0]), calls); /* nothing reached the backend */
  assert_int_equal(ncfsm_work_fingerprint(w)->seq, NCFSM_SEQ_NONE);
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  teardown_all(loop, c, 1);
}

/* QUEUED -TIME_OUT-> TIMED_OUT: deferred behind an init that never ends. */
static void test_queued_time_out(void **state) {
  (void)state;
  reset_cbs();
  unsigned t0 = rows_hits(M, "QUEUED", "TIME_OUT", "ANY");
  kit_begin("work.queued_timeout");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_INIT_HANG, "hang", -1);
  kit_fault(&f);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  opts_init(&o, &so, "hang");
  o.timeout_ms = FAST_MS;
  ncfsm_loop *loop = loop_new();
  ncfsm_comm *c[1];
  comms_init(loop, 1, (const ncfsm_comm_opts *[]){&o}, c);
  ncfsm_work *w = allreduce(c[0], 0, 8, 0); /* DEFER: queued until READY */
  want_work(w, NCFSM_WORK_TIMED_OUT, NCFSM_ERR_TIMEOUT, 0);
  ROW_FIRED(M, "QUEUED", "TIME_OUT", "ANY", t0);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_INIT_FAILED);
  want_text(c[0], true, "watchdog");
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  world_down(loop, c, 1, NULL, 0);
  kit_end();
}

/* QUEUED -ABORT-> ABORTED: the comm is aborted before the loop launched it. */
static void test_queued_abort(void **state) {
  (void)state;
  reset_cbs();
  unsigned a0 = rows_hits(M, "QUEUED", "ABORT", "ANY");
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  ncfsm_work *w = allreduce(c[0], 0, 8, 0);
  assert_int_equal(ncfsm_work_state(w), NCFSM_WORK_QUEUED);
  assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
  want_work(w, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED, 0);
  ROW_FIRED(M, "QUEUED", "ABORT", "ANY", a0);
  assert_int_equal(ncfsm_work_fingerprint(w)->seq, NCFSM_SEQ_NONE);
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  teardown_all(loop, c, 1);
}

/* Two ranks over the in-process bootstrap with strict verification. */
static ncfsm_loop *strict_pair(ncfsm_comm **c, ncfsm_boot **b, ncfsm_comm_opts *o, ncfsm_sim_opts *so,
                               uint64_t stall_ms) {
  opts_init(o, so, "strict");
  o->verify = NCFSM_VERIFY_STRICT;
  o->verify_stall_ms = stall_ms;
  ncfsm_loop *loop = loop_new();
  comms_boot(loop, 2, (const ncfsm_comm_opts *[]){o, NULL}, c, b, 0);
  for (int r = 0; r < 2; r++) want_state(c[r], NCFSM_STATE_READY);
  return loop;
}

static bool verifying(void *arg) { return ncfsm_work_state(arg) == NCFSM_WORK_VERIFYING; }

/* QUEUED -VERIFY-> VERIFYING -VERIFIED-> QUEUED, and VERIFYING -FAIL-> FAILED
 * (the ranks' fingerprints differ: R11, nothing reaches NCCL). */
static void test_verified_and_mismatch(void **state) {
  (void)state;
  reset_cbs();
  unsigned v0 = rows_hits(M, "QUEUED", "VERIFY", "ANY"), d0 = rows_hits(M, "VERIFYING", "VERIFIED", "ANY"),
           f0 = rows_hits(M, "VERIFYING", "FAIL", "ANY");
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_comm_opts o;
  ncfsm_sim_opts so;
  ncfsm_loop *loop = strict_pair(c, b, &o, &so, 0);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = allreduce(c[r], r, 8, r);
  assert_int_equal(ncfsm_work_state(w[0]), NCFSM_WORK_VERIFYING);
  for (int r = 0; r < 2; r++) want_work(w[r], NCFSM_WORK_COMPLETED, NCFSM_OK, r);
  ROW_FIRED(M, "QUEUED", "VERIFY", "ANY", v0);
  ROW_FIRED(M, "VERIFYING", "VERIFIED", "ANY", d0);
  uint64_t calls = backend_calls(c[0]);
  ncfsm_work *m[2];
  for (int r = 0; r < 2; r++) m[r] = allreduce(c[r], r, r ? 8 : 4, 2 + r); /* counts differ */
  for (int r = 0; r < 2; r++) want_work(m[r], NCFSM_WORK_FAILED, NCFSM_ERR_MISMATCH, 2 + r);
  ROW_FIRED(M, "VERIFYING", "FAIL", "ANY", f0);
  assert_int_equal(backend_calls(c[0]), calls);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_READY); /* still usable */
  want_text(c[0], false, "differs across ranks in count");
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_work_release(w[r]), NCFSM_OK);
    assert_int_equal(ncfsm_work_release(m[r]), NCFSM_OK);
  }
  world_down(loop, c, 2, b, 2);
}

/* VERIFYING -ABORT-> ABORTED: the peer never submits; the comm is aborted. */
static void test_verifying_abort(void **state) {
  (void)state;
  reset_cbs();
  unsigned a0 = rows_hits(M, "VERIFYING", "ABORT", "ANY");
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_comm_opts o;
  ncfsm_sim_opts so;
  ncfsm_loop *loop = strict_pair(c, b, &o, &so, 0);
  ncfsm_work *w = allreduce(c[0], 0, 8, 0);
  run_turns(loop, 5);
  assert_int_equal(ncfsm_work_state(w), NCFSM_WORK_VERIFYING);
  assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
  want_work(w, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED, 0);
  ROW_FIRED(M, "VERIFYING", "ABORT", "ANY", a0);
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  world_down(loop, c, 2, b, 2);
}

/* VERIFYING -TIME_OUT-> TIMED_OUT: the exchange stalls (the peer never submits). */
static void test_verifying_time_out(void **state) {
  (void)state;
  reset_cbs();
  unsigned t0 = rows_hits(M, "VERIFYING", "TIME_OUT", "ANY");
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_comm_opts o;
  ncfsm_sim_opts so;
  ncfsm_loop *loop = strict_pair(c, b, &o, &so, FAST_MS);
  ncfsm_work *w = allreduce(c[0], 0, 8, 0);
  run_until(loop, verifying, w, "the work verifies");
  want_work(w, NCFSM_WORK_TIMED_OUT, NCFSM_ERR_TIMEOUT, 0);
  ROW_FIRED(M, "VERIFYING", "TIME_OUT", "ANY", t0);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_ERROR);
  want_text(c[0], true, "not every rank submitted collective seq 0");
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  world_down(loop, c, 2, b, 2);
}

/* One rank (a clique of one), with the kit's fault on its launch. */
static ncfsm_loop *faulted_one(ncfsm_comm **c, ncfsm_fault *f, uint64_t timeout_ms, const char *kit) {
  kit_begin(kit);
  kit_fault(f);
  static ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  opts_init(&o, &so, "one");
  o.timeout_ms = timeout_ms;
  ncfsm_loop *loop = loop_new();
  comms_init(loop, 1, (const ncfsm_comm_opts *[]){&o}, c);
  want_state(c[0], NCFSM_STATE_READY);
  return loop;
}

static bool launching(void *arg) { return ncfsm_comm_state(arg) == NCFSM_STATE_LAUNCH_IN_PROGRESS; }

/* LAUNCHING -FAIL-> FAILED: the launch's poll returns an async error (R10). */
static void test_launching_fail(void **state) {
  (void)state;
  reset_cbs();
  unsigned f0 = rows_hits(M, "LAUNCHING", "FAIL", "ANY");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_ASYNC_ERROR, "one", 0);
  f.when = NCFSM_AT_STATE;
  f.state = NCFSM_STATE_LAUNCH_IN_PROGRESS;
  ncfsm_comm *c[1];
  ncfsm_loop *loop = faulted_one(c, &f, 0, "work.launching_fail");
  ncfsm_work *w = allreduce(c[0], 0, 8, 0);
  want_work(w, NCFSM_WORK_FAILED, NCFSM_ERR_ASYNC, 0);
  ROW_FIRED(M, "LAUNCHING", "FAIL", "ANY", f0);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_ERROR);
  assert_int_equal(ncfsm_work_fingerprint(w)->seq, 0); /* it was launched */
  assert_int_equal(ncfsm_work_launched(w), 0);         /* never final: never IN_FLIGHT */
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  world_down(loop, c, 1, NULL, 0);
  kit_end();
}

/* LAUNCHING -TIME_OUT-> TIMED_OUT and LAUNCHING -ABORT-> ABORTED: a launch that never becomes final. */
static void test_launching_time_out_and_abort(void **state) {
  (void)state;
  reset_cbs();
  unsigned t0 = rows_hits(M, "LAUNCHING", "TIME_OUT", "ANY"), a0 = rows_hits(M, "LAUNCHING", "ABORT", "ANY");
  for (int k = 0; k < 2; k++) {
    ncfsm_fault f = kit_fault_of(NCFSM_FAULT_SLOW, "one", 0);
    f.when = NCFSM_AT_STATE;
    f.state = NCFSM_STATE_LAUNCH_IN_PROGRESS;
    f.polls = -1; /* for ever */
    ncfsm_comm *c[1];
    ncfsm_loop *loop = faulted_one(c, &f, k ? 0 : FAST_MS, "work.launching_slow");
    ncfsm_work *w = allreduce(c[0], 0, 8, k);
    run_until(loop, launching, c[0], "the launch is in progress");
    assert_int_equal(ncfsm_work_state(w), NCFSM_WORK_LAUNCHING);
    if (k) {
      assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
      want_work(w, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED, k);
    } else {
      want_work(w, NCFSM_WORK_TIMED_OUT, NCFSM_ERR_TIMEOUT, k);
      want_text(c[0], true, "state LAUNCH_IN_PROGRESS did not end");
    }
    assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
    world_down(loop, c, 1, NULL, 0);
    kit_end();
  }
  ROW_FIRED(M, "LAUNCHING", "TIME_OUT", "ANY", t0);
  ROW_FIRED(M, "LAUNCHING", "ABORT", "ANY", a0);
}

static bool in_flight(void *arg) { return ncfsm_work_state(arg) == NCFSM_WORK_IN_FLIGHT; }

/* IN_FLIGHT -FAIL-> FAILED: its peer never submitted, and the comm fails
 * with the async error of the next op (R10: outputs untrusted). */
static void test_in_flight_fail(void **state) {
  (void)state;
  reset_cbs();
  unsigned f0 = rows_hits(M, "IN_FLIGHT", "FAIL", "ANY");
  kit_begin("work.in_flight_fail");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_ASYNC_ERROR, "pair", 0);
  f.at = 1;
  kit_fault(&f);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  opts_init(&o, &so, "pair");
  ncfsm_loop *loop = loop_new();
  ncfsm_comm *c[2];
  comms_init(loop, 2, (const ncfsm_comm_opts *[]){&o, NULL}, c);
  for (int r = 0; r < 2; r++) want_state(c[r], NCFSM_STATE_READY);
  ncfsm_work *w0 = allreduce(c[0], 0, 8, 0); /* rank 1 never joins it */
  run_until(loop, in_flight, w0, "the first op is in flight");
  ncfsm_work *w1 = allreduce(c[0], 0, 4, 1); /* op 1: the async error */
  want_work(w0, NCFSM_WORK_FAILED, NCFSM_ERR_ASYNC, 0);
  want_work(w1, NCFSM_WORK_FAILED, NCFSM_ERR_ASYNC, 1);
  ROW_FIRED(M, "IN_FLIGHT", "FAIL", "ANY", f0);
  ncfsm_work_times t;
  assert_int_equal(ncfsm_work_get_times(w0, &t), NCFSM_OK);
  assert_true(t.final_ns != 0 && t.complete_ns == 0); /* it was in flight, and never seen complete */
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_ERROR);
  assert_int_equal(ncfsm_work_release(w0), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(w1), NCFSM_OK);
  world_down(loop, c, 2, NULL, 0);
  kit_end();
}

/* IN_FLIGHT -TIME_OUT-> TIMED_OUT (its own deadline: ncfsm_work_set_timeout)
 * and IN_FLIGHT -ABORT-> ABORTED: the peer never submits. */
static void test_in_flight_time_out_and_abort(void **state) {
  (void)state;
  reset_cbs();
  unsigned t0 = rows_hits(M, "IN_FLIGHT", "TIME_OUT", "ANY"), a0 = rows_hits(M, "IN_FLIGHT", "ABORT", "ANY");
  for (int k = 0; k < 2; k++) {
    ncfsm_comm *c[2];
    ncfsm_loop *loop = ready_comms(2, c);
    ncfsm_work *w = allreduce(c[0], 0, 8, k);
    if (!k) assert_int_equal(ncfsm_work_set_timeout(w, FAST_MS), NCFSM_OK);
    run_until(loop, in_flight, w, "the op is in flight");
    if (k) {
      assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
      want_work(w, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED, k);
    } else {
      want_work(w, NCFSM_WORK_TIMED_OUT, NCFSM_ERR_TIMEOUT, k);
      want_text(c[0], true, "ALLREDUCE seq 0 did not complete within 30 ms");
    }
    assert_int_equal(ncfsm_work_set_timeout(w, 5), NCFSM_ERR_ILLEGAL_STATE); /* final */
    assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
    teardown_all(loop, c, 2);
  }
  ROW_FIRED(M, "IN_FLIGHT", "TIME_OUT", "ANY", t0);
  ROW_FIRED(M, "IN_FLIGHT", "ABORT", "ANY", a0);
}

static void test_every_row_walked(void **state) {
  (void)state;
  rows_check_all(M, NULL, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_completes, kit_teardown),
      cmocka_unit_test_teardown(test_queued_fail, kit_teardown),
      cmocka_unit_test_teardown(test_queued_time_out, kit_teardown),
      cmocka_unit_test_teardown(test_queued_abort, kit_teardown),
      cmocka_unit_test_teardown(test_verified_and_mismatch, kit_teardown),
      cmocka_unit_test_teardown(test_verifying_abort, kit_teardown),
      cmocka_unit_test_teardown(test_verifying_time_out, kit_teardown),
      cmocka_unit_test_teardown(test_launching_fail, kit_teardown),
      cmocka_unit_test_teardown(test_launching_time_out_and_abort, kit_teardown),
      cmocka_unit_test_teardown(test_in_flight_fail, kit_teardown),
      cmocka_unit_test_teardown(test_in_flight_time_out_and_abort, kit_teardown),
      cmocka_unit_test(test_every_row_walked),
  };
  return cmocka_run_group_tests(tests, rows_setup, NULL);
}
