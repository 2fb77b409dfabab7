/*
 * Push completion (ncfsm_loop_opts.completion = NCFSM_COMPLETION_PUSH;
 * issue 11, item 2): the loop polls as usual for its burst after each
 * progress; when the burst is over and only works in flight wait, it puts
 * one host function after the last work of each such stream (the backend's
 * host_notify: cudaLaunchHostFunc on NCCL; the sim runs it when its progress
 * reaches that point) and polls every push_fallback_us only. Checked on the
 * sim: every work completes with the right data; host functions were
 * enqueued and woke the loop; one per stream and wait, not one per launch;
 * none while the burst sees the works complete; a state that needs polls
 * (a launch in progress) still gets its burst; and a loop closed while host
 * functions are pending frees nothing they still use (the notifier
 * outlives the loop: ASan).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "fsm/objects.h"
#include "helpers.h"

static int32_t buf[2][64][16];
static int done_ok, done_bad;
static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  (void)arg;
  st == NCFSM_OK ? done_ok++ : done_bad++;
}

/* Rank r's AllReduce of buf[r][k] (16 ints) on c, counted by on_done. */
static void submit(ncfsm_comm *c, int r, int k) {
  assert_int_equal(ncfsm_allreduce(c, buf[r][k], buf[r][k], 16, NCFSM_INT32, NCFSM_OP_SUM, NULL, on_done, NULL, NULL),
                   NCFSM_OK);
}

/* burst 0: no immediate re-polls, so every wait goes to the streams */
static ncfsm_loop *push_loop(unsigned fallback_us, int burst) {
  ncfsm_loop_opts lo;
  ncfsm_loop_opts_init(&lo);
  lo.completion = NCFSM_COMPLETION_PUSH;
  lo.push_fallback_us = fallback_us;
  if (!burst) lo.poll_burst = lo.poll_burst_us = 0;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(&lo, &loop), NCFSM_OK);
  return loop;
}

static void make_ready(ncfsm_loop *loop, ncfsm_comm **c, int n, ncfsm_sim_opts *so) {
  ncfsm_comm_opts o;
  test_comm_opts(&o, so);
  make_comms(loop, n, &o, c, 0);
  for (int r = 0; r < n; r++) run_until_state(loop, c[r], NCFSM_STATE_READY);
}

/* Turns until the loop went over to push (its slow timer is armed). */
static void run_until_push_armed(ncfsm_loop *loop) {
  for (int i = 0; i < 100000 && !(loop->timer_state == NCFSM__TS_PUSH); i++) run_turns(loop, 1);
  assert_true((loop->timer_state == NCFSM__TS_PUSH));
}

static void test_push_completes(void **state) {
  (void)state;
  ncfsm_loop *loop = push_loop(10000, 0);
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  so.launch_polls = 2;
  ncfsm_comm *c[2];
  make_ready(loop, c, 2, &so);
  done_ok = done_bad = 0;
  /* rank 0 first: its works wait in flight, and the loop goes over to push */
  for (int r = 0; r < 2; r++) {
    for (int k = 0; k < 64; k++) {
      for (int i = 0; i < 16; i++) buf[r][k][i] = r + k;
      submit(c[r], r, k);
    }
    if (r == 0) run_until_push_armed(loop);
  }
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  assert_int_equal(done_ok, 128);
  assert_int_equal(done_bad, 0);
  for (int k = 0; k < 64; k++)
    for (int r = 0; r < 2; r++) assert_int_equal(buf[r][k][15], 2 * k + 1);
  ncfsm__notifier *n = loop->notifier;
  assert_non_null(n);
  printf("push: %llu host functions enqueued, %llu woke the loop\n", (unsigned long long)atomic_load(&n->posted),
         (unsigned long long)atomic_load(&n->wakes));
  assert_true(atomic_load(&n->posted) > 0);
  assert_true(atomic_load(&n->wakes) > 0);
  teardown_all(loop, c, 2);
}

/* A work that never completes (its peer never posts): the slow fallback
 * timer may be armed; the abort must still go through at once, and the loop
 * may close while the host function of the dropped op is pending. */
static void test_push_close_with_pending(void **state) {
  (void)state;
  ncfsm_loop *loop = push_loop(1000000, 0); /* a fallback far longer than the test */
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  ncfsm_comm *c[2];
  make_ready(loop, c, 2, &so);
  done_ok = done_bad = 0;
  submit(c[0], 0, 0);
  run_turns(loop, 20);
  assert_int_equal(done_ok + done_bad, 0);
  assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
  run_turns(loop, 2);
  assert_int_equal(done_bad, 1);
  teardown_all(loop, c, 2);
}

/* With push on, a launch whose group end stays in progress still gets the
 * immediate polls of R2 (not the slow fallback): it completes within a few
 * turns of NOWAIT runs. */
static void test_push_keeps_launch_polls(void **state) {
  (void)state;
  ncfsm_loop *loop = push_loop(1000000, 0);
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  so.launch_polls = 3;
  ncfsm_comm *c[2];
  make_ready(loop, c, 2, &so);
  done_ok = done_bad = 0;
  for (int r = 0; r < 2; r++)
    submit(c[r], r, 1);
  for (int i = 0; i < 200 && done_ok < 2; i++) run_turns(loop, 1);
  assert_int_equal(done_ok, 2);
  teardown_all(loop, c, 2);
}

/* A late peer: rank 0's AllReduce waits; after the burst one host function
 * goes on its stream, and no more however long the wait; rank 1's arrival
 * completes both, and the host function wakes the loop. */
static void test_push_one_per_wait(void **state) {
  (void)state;
  ncfsm_loop *loop = push_loop(1000000, 1);
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  ncfsm_comm *c[2];
  make_ready(loop, c, 2, &so);
  done_ok = done_bad = 0;
  ncfsm__notifier *n = loop->notifier;
  assert_non_null(n);
  uint64_t posted0 = atomic_load(&n->posted), wakes0 = atomic_load(&n->wakes);
  for (int i = 0; i < 16; i++) buf[0][2][i] = 1, buf[1][2][i] = 2;
  submit(c[0], 0, 2);
  run_until_push_armed(loop);
  assert_int_equal(atomic_load(&n->posted) - posted0, 1);
  run_turns(loop, 50);
  assert_int_equal(atomic_load(&n->posted) - posted0, 1); /* one per stream and wait */
  assert_int_equal(done_ok + done_bad, 0);
  submit(c[1], 1, 2);
  for (int i = 0; i < 1000 && done_ok < 2; i++) run_turns(loop, 1);
  assert_int_equal(done_ok, 2);
  assert_int_equal(buf[0][2][15], 3);
  assert_true(atomic_load(&n->wakes) - wakes0 >= 1);
  teardown_all(loop, c, 2);
}

/* Works that complete within the burst never cost a host function (one
 * would hold the stream's later work until it has run). */
static void test_push_none_within_burst(void **state) {
  (void)state;
  ncfsm_loop_opts lo;
  ncfsm_loop_opts_init(&lo);
  lo.completion = NCFSM_COMPLETION_PUSH;
  lo.poll_burst = 1u << 30; /* the burst never ends */
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(&lo, &loop), NCFSM_OK);
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  ncfsm_comm *c[2];
  make_ready(loop, c, 2, &so);
  done_ok = done_bad = 0;
  for (int k = 0; k < 32; k++)
    for (int r = 0; r < 2; r++)
      submit(c[r], r, k);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  assert_int_equal(done_ok, 64);
  assert_int_equal(atomic_load(&loop->notifier->posted), 0);
  teardown_all(loop, c, 2);
}

/* auto: polls (no host function) until push_after_us passed without
 * progress, then pushes; the wait is never handed to the stream earlier. */
static void test_auto_pushes_after(void **state) {
  (void)state;
  ncfsm_loop_opts lo;
  ncfsm_loop_opts_init(&lo);
  lo.completion = NCFSM_COMPLETION_AUTO;
  lo.push_after_us = 20000;
  lo.push_fallback_us = 1000000;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(&lo, &loop), NCFSM_OK);
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  ncfsm_comm *c[2];
  make_ready(loop, c, 2, &so);
  done_ok = done_bad = 0;
  ncfsm__notifier *n = loop->notifier;
  assert_non_null(n);
  uint64_t t0 = ncfsm__now_ns();
  submit(c[0], 0, 3);
  for (int i = 0; i < 1000000 && !(loop->timer_state == NCFSM__TS_PUSH); i++) {
    run_turns(loop, 1);
    if (ncfsm__now_ns() - t0 < 20000000ull) assert_false((loop->timer_state == NCFSM__TS_PUSH)); /* polls before push_after_us */
  }
  assert_true((loop->timer_state == NCFSM__TS_PUSH));
  assert_true(ncfsm__now_ns() - t0 >= 20000000ull);
  assert_int_equal(atomic_load(&n->posted), 1);
  submit(c[1], 1, 3);
  for (int i = 0; i < 1000 && done_ok < 2; i++) run_turns(loop, 1);
  assert_int_equal(done_ok, 2);
  assert_true(atomic_load(&n->wakes) >= 1);
  teardown_all(loop, c, 2);
}

/* A completion mode that does not exist is refused, not taken for poll. */
static void test_bad_completion(void **state) {
  (void)state;
  ncfsm_loop_opts lo;
  ncfsm_loop_opts_init(&lo);
  lo.completion = 7;
  ncfsm_loop *loop = NULL;
  assert_int_equal(ncfsm_loop_new(&lo, &loop), NCFSM_ERR_INVALID_ARGUMENT);
  assert_null(loop);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_push_completes),
      cmocka_unit_test(test_push_close_with_pending),
      cmocka_unit_test(test_push_keeps_launch_polls),
      cmocka_unit_test(test_push_one_per_wait),
      cmocka_unit_test(test_push_none_within_burst),
      cmocka_unit_test(test_auto_pushes_after),
      cmocka_unit_test(test_bad_completion),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
