/*
 * Every row of fsm/timer.def walked (tests/rows/rows.h): a loop's progress
 * timer through its burst of immediate re-polls (own base: NOW; embedded:
 * SOON), its back-off, and push completion (PUSH, the fallback timer, a
 * refused host function), on the sim. The timer has no public face: each
 * scenario reads its state (loop->timer_state) after each turn, and checks
 * what the schedule promises: the work still completes, the back-off
 * doubles, progress restarts the burst, one host function per wait.
 */
#include <string.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "core/sim/sim-internal.h"
#include "fsm/objects.h"
#include "rows_world.h"

#define M "timer"

static int32_t buf[2][8];

static ncfsm_work *op(ncfsm_comm *c, int r) {
  ncfsm_work *w = NULL;
  for (int i = 0; i < 8; i++) buf[r][i] = r + 1;
  assert_int_equal(ncfsm_allreduce(c, buf[r], buf[r], 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w), NCFSM_OK);
  return w;
}

static unsigned tstate(void *arg) {
  ncfsm_loop *loop = arg;
  pthread_mutex_lock(&loop->mu);
  unsigned s = loop->timer_state;
  pthread_mutex_unlock(&loop->mu);
  return s;
}

static void run_until_timer(ncfsm_loop *loop, unsigned s) {
  run_until_is(loop, tstate, loop, s, ncfsm__m_timer.states[s].name);
}

/* Two READY ranks on a loop with these options (own base, or embedded in base). */
static ncfsm_loop *pair(const ncfsm_loop_opts *lo, struct event_base *base, ncfsm_comm **c) {
  ncfsm_loop *loop = NULL;
  if (base) assert_int_equal(ncfsm_loop_new_embedded(base, lo, &loop), NCFSM_OK);
  else assert_int_equal(ncfsm_loop_new(lo, &loop), NCFSM_OK);
  static ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  opts_init(&o, &so, "timer");
  comms_init(loop, 2, (const ncfsm_comm_opts *[]){&o, NULL}, c);
  for (int r = 0; r < 2; r++) want_state(c[r], NCFSM_STATE_READY);
  return loop;
}

static void loop_opts(ncfsm_loop_opts *lo, int completion, unsigned burst) {
  assert_int_equal(ncfsm_loop_opts_init(lo), NCFSM_OK);
  lo->completion = completion;
  lo->poll_burst = burst;
  lo->poll_burst_us = burst ? 1000000 : 0; /* a burst that outlasts the scenario, or none */
}

/* IDLE -PROGRESS-> IDLE, IDLE -ARM [IMMEDIATE_OWN]-> NOW, NOW -DIRECT-> IDLE:
 * a launch restarts the burst; the thread driving its own base re-polls at once. */
static void test_burst_own_base(void **state) {
  (void)state;
  unsigned p0 = rows_hits(M, "IDLE", "PROGRESS", "ANY"), n0 = rows_hits(M, "IDLE", "ARM", "IMMEDIATE_OWN"),
           d0 = rows_hits(M, "NOW", "DIRECT", "ANY");
  ncfsm_loop_opts lo;
  loop_opts(&lo, NCFSM_COMPLETION_POLL, 64);
  ncfsm_comm *c[2];
  ncfsm_loop *loop = pair(&lo, NULL, c);
  ncfsm_work *w0 = op(c[0], 0);
  run_turns(loop, 1); /* the launch: progress */
  assert_int_equal(tstate(loop), NCFSM__TS_NOW);
  assert_int_equal(loop->burst_start_ns != 0, 1);
  ncfsm_work *w1 = op(c[1], 1);
  assert_int_equal(work_final(w0), NCFSM_OK);
  assert_int_equal(work_final(w1), NCFSM_OK);
  assert_int_equal(buf[0][0], 3);
  ROW_FIRED(M, "IDLE", "PROGRESS", "ANY", p0);
  ROW_FIRED(M, "IDLE", "ARM", "IMMEDIATE_OWN", n0);
  ROW_FIRED(M, "NOW", "DIRECT", "ANY", d0);
  assert_int_equal(ncfsm_work_release(w0), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(w1), NCFSM_OK);
  teardown_all(loop, c, 2);
}

/* IDLE -ARM-> BACKOFF, BACKOFF -FIRED-> IDLE (doubling), BACKOFF -PROGRESS-> IDLE:
 * without a burst a pending work is polled on a back-off timer; a submitted op
 * (progress) drops it. */
static void test_backoff(void **state) {
  (void)state;
  unsigned a0 = rows_hits(M, "IDLE", "ARM", "ANY"), f0 = rows_hits(M, "BACKOFF", "FIRED", "ANY"),
           p0 = rows_hits(M, "BACKOFF", "PROGRESS", "ANY");
  ncfsm_loop_opts lo;
  loop_opts(&lo, NCFSM_COMPLETION_POLL, 0);
  ncfsm_comm *c[2];
  ncfsm_loop *loop = pair(&lo, NULL, c);
  ncfsm_work *w0 = op(c[0], 0); /* rank 1's is not submitted yet: it waits in flight */
  run_until_timer(loop, NCFSM__TS_BACKOFF);
  unsigned b = loop->backoff;
  for (int k = 0; k < 3; k++) assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_ONCE), NCFSM_OK); /* its timer fires */
  assert_int_equal(tstate(loop), NCFSM__TS_BACKOFF);
  assert_true(loop->backoff > b); /* the interval doubled (up to poll_max_us) */
  assert_int_equal(ncfsm_work_state(w0), NCFSM_WORK_IN_FLIGHT);
  ncfsm_work *w1 = op(c[1], 1);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT), NCFSM_OK); /* a direct turn: the launch */
  assert_int_equal(work_final(w0), NCFSM_OK);
  assert_int_equal(work_final(w1), NCFSM_OK);
  ROW_FIRED(M, "IDLE", "ARM", "ANY", a0);
  ROW_FIRED(M, "BACKOFF", "FIRED", "ANY", f0);
  ROW_FIRED(M, "BACKOFF", "PROGRESS", "ANY", p0);
  assert_int_equal(ncfsm_work_release(w0), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(w1), NCFSM_OK);
  teardown_all(loop, c, 2);
}

/* IDLE -ARM [IMMEDIATE]-> SOON, SOON -PROGRESS-> SOON, SOON -ARM-> SOON,
 * SOON -FIRED-> IDLE: a loop embedded in the application's base re-polls
 * through a zero timer of that base. */
static void test_embedded_soon(void **state) {
  (void)state;
  unsigned s0 = rows_hits(M, "IDLE", "ARM", "IMMEDIATE"), p0 = rows_hits(M, "SOON", "PROGRESS", "ANY"),
           a0 = rows_hits(M, "SOON", "ARM", "ANY"), f0 = rows_hits(M, "SOON", "FIRED", "ANY");
  assert_int_equal(evthread_use_pthreads(), 0);
  struct event_base *base = event_base_new();
  assert_non_null(base);
  ncfsm_loop_opts lo;
  loop_opts(&lo, NCFSM_COMPLETION_POLL, 64);
  ncfsm_comm *c[2];
  ncfsm_loop *loop = pair(&lo, base, c);
  ncfsm_work *w0 = op(c[0], 0);
  run_turns(loop, 1);
  assert_int_equal(tstate(loop), NCFSM__TS_SOON);
  ncfsm_work *w1 = op(c[1], 1);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT), NCFSM_OK); /* a direct turn while SOON: progress */
  /* SOON, or IDLE when the call's libevent pass (at least every poll_max_us: a polled loop's
   * sockets) fired the zero timer already */
  assert_true(tstate(loop) == NCFSM__TS_SOON || tstate(loop) == NCFSM__TS_IDLE);
  for (int i = 0; i < 1000 && (ncfsm_work_state(w0) != NCFSM_WORK_COMPLETED || ncfsm_work_state(w1) != NCFSM_WORK_COMPLETED);
       i++)
    event_base_loop(base, EVLOOP_ONCE); /* the application's loop: the zero timer fires */
  assert_int_equal(ncfsm_work_status(w0), NCFSM_OK);
  assert_int_equal(ncfsm_work_status(w1), NCFSM_OK);
  assert_int_equal(buf[1][7], 3);
  ROW_FIRED(M, "IDLE", "ARM", "IMMEDIATE", s0);
  ROW_FIRED(M, "SOON", "PROGRESS", "ANY", p0);
  ROW_FIRED(M, "SOON", "ARM", "ANY", a0);
  ROW_FIRED(M, "SOON", "FIRED", "ANY", f0);
  assert_int_equal(ncfsm_work_release(w0), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(w1), NCFSM_OK);
  teardown_all(loop, c, 2);
  event_base_free(base);
}

/* IDLE -ARM [COVERED]-> PUSH, PUSH -FIRED-> IDLE (the fallback), PUSH
 * -PROGRESS-> IDLE (the stream's host function woke the loop): one host
 * function for the wait, however often the fallback fires. */
static void test_push(void **state) {
  (void)state;
  unsigned c0 = rows_hits(M, "IDLE", "ARM", "COVERED"), f0 = rows_hits(M, "PUSH", "FIRED", "ANY"),
           p0 = rows_hits(M, "PUSH", "PROGRESS", "ANY");
  ncfsm_loop_opts lo;
  loop_opts(&lo, NCFSM_COMPLETION_PUSH, 0);
  lo.push_fallback_us = 1000;
  ncfsm_comm *c[2];
  ncfsm_loop *loop = pair(&lo, NULL, c);
  ncfsm_work *w0 = op(c[0], 0);
  run_until_timer(loop, NCFSM__TS_PUSH);
  for (int k = 0; k < 3; k++) assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_ONCE), NCFSM_OK); /* the fallback */
  assert_int_equal(tstate(loop), NCFSM__TS_PUSH);
  assert_int_equal(atomic_load(&loop->notifier->posted), 1);
  ROW_FIRED(M, "PUSH", "FIRED", "ANY", f0);
  ncfsm_work *w1 = op(c[1], 1);
  assert_int_equal(work_final(w0), NCFSM_OK);
  assert_int_equal(work_final(w1), NCFSM_OK);
  assert_true(atomic_load(&loop->notifier->wakes) >= 1);
  ROW_FIRED(M, "IDLE", "ARM", "COVERED", c0);
  ROW_FIRED(M, "PUSH", "PROGRESS", "ANY", p0);
  assert_int_equal(ncfsm_work_release(w0), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(w1), NCFSM_OK);
  teardown_all(loop, c, 2);
}

/* PUSH -PUSH_FAILED-> BACKOFF: the backend cannot enqueue the host function
 * (the sim's allocation fails): the loop polls instead, for good, and the
 * work still completes. */
static void test_push_failed(void **state) {
  (void)state;
  unsigned f0 = rows_hits(M, "PUSH", "PUSH_FAILED", "ANY");
  ncfsm_loop_opts lo;
  loop_opts(&lo, NCFSM_COMPLETION_PUSH, 0);
  ncfsm_comm *c[2];
  ncfsm_loop *loop = pair(&lo, NULL, c);
  ncfsm_work *w0 = op(c[0], 0);
  rows_fail_calloc(1, sizeof(sim_note), 1);
  run_until_timer(loop, NCFSM__TS_BACKOFF);
  for (int k = 0; k < 50 && !rows_calloc_failed(); k++) assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_ONCE), NCFSM_OK);
  assert_int_equal(rows_calloc_failed(), 1);
  ROW_FIRED(M, "PUSH", "PUSH_FAILED", "ANY", f0);
  assert_int_equal(loop->opts.completion, NCFSM_COMPLETION_POLL);
  assert_int_equal(atomic_load(&loop->notifier->posted), 0);
  ncfsm_work *w1 = op(c[1], 1);
  assert_int_equal(work_final(w0), NCFSM_OK);
  assert_int_equal(work_final(w1), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(w0), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(w1), NCFSM_OK);
  teardown_all(loop, c, 2);
}

static void test_every_row_walked(void **state) {
  (void)state;
  /* no dead row: the seven that no path reached (a timer firing in IDLE or
   * NOW, ARM in NOW, BACKOFF or PUSH) were removed from fsm/timer.def */
  rows_check_all(M, NULL, 0);

}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_burst_own_base, kit_teardown),
      cmocka_unit_test_teardown(test_backoff, kit_teardown),
      cmocka_unit_test_teardown(test_embedded_soon, kit_teardown),
      cmocka_unit_test_teardown(test_push, kit_teardown),
      cmocka_unit_test_teardown(test_push_failed, kit_teardown),
      cmocka_unit_test(test_every_row_walked),
  };
  return cmocka_run_group_tests(tests, rows_setup, NULL);
}
