/*
 * ncfsm_comm_close and ncfsm_loop_shutdown: the nonblocking close with a
 * callback, from each kind of state (fsm/comm.def, column close).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "helpers.h"

typedef struct closed {
  int n;
  ncfsm_result_t status;
  ncfsm_state_t state; /* in the callback */
  char failure[256];
  int works_done_before; /* works' callbacks that ran before the close's */
} closed;

static int works_done;

static void on_work(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  (void)st;
  (void)arg;
  works_done++;
}

static void on_closed(ncfsm_comm *c, ncfsm_result_t status, void *arg) {
  closed *x = arg;
  x->status = status;
  x->state = ncfsm_comm_state(c);
  x->works_done_before = works_done;
  snprintf(x->failure, sizeof x->failure, "%s", ncfsm_comm_failure(c));
  __atomic_fetch_add(&x->n, 1, __ATOMIC_RELEASE); /* last: test_close_from_thread polls it */
}

static void run_until_closed(ncfsm_loop *loop, const closed *x, int n) {
  for (int i = 0; i < 20000; i++) {
    int done = 0;
    for (int k = 0; k < n; k++) done += x[k].n;
    if (done == n) return;
    run_turns(loop, 1);
  }
  fail_msg("the close callbacks did not run");
}

/* Two ready ranks close with works in flight: each work completes (R4:
 * finalize flushes them), then finalize and destroy; status OK, once,
 * with the handle RELEASED; ncfsm_loop_run returns by itself afterwards. */
static void test_close_ready(void **state) {
  (void)state;
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  static float buf[2][8];
  works_done = 0;
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], 8, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_work, NULL, NULL),
                     NCFSM_OK);
  closed x[2] = {{0}};
  uint64_t calls0 = backend_calls(c[0]);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_close(c[r], on_closed, &x[r]), NCFSM_OK);
  assert_int_equal(x[0].n, 0); /* never inside the call */
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_READY);
  assert_true(backend_calls(c[0]) == calls0);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(x[r].n, 1);
    assert_int_equal(x[r].status, NCFSM_OK);
    assert_int_equal(x[r].state, NCFSM_STATE_RELEASED);
    assert_string_equal(x[r].failure, "");
  }
  assert_int_equal(works_done, 2);
  assert_true(x[0].works_done_before >= 1 && x[1].works_done_before == 2);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* A second close is refused with guard NOT_CLOSING's hint; abort still
 * ends it at once and the close's callback reports it. */
static void test_close_twice(void **state) {
  (void)state;
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  closed x[2] = {{0}};
  assert_int_equal(ncfsm_comm_close(c[0], on_closed, &x[0]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_close(c[0], on_closed, &x[0]), NCFSM_ERR_ILLEGAL_STATE);
  const char *err = ncfsm_comm_last_error(c[0]);
  assert_non_null(strstr(err, "ncfsm_comm_close"));
  assert_non_null(strstr(err, "READY"));
  assert_non_null(strstr(err, "was accepted already"));
  assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_close(c[1], on_closed, &x[1]), NCFSM_OK);
  run_until_closed(loop, x, 2);
  assert_int_equal(x[0].n, 1);
  assert_int_equal(x[0].state, NCFSM_STATE_RELEASED);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* NEW: released at the next turn; a comm whose init is in progress is
 * aborted (R1): status NCFSM_ERR_ABORTED. */
static void test_close_new_and_initialising(void **state) {
  (void)state;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  so.init_polls = NEVER;
  test_comm_opts(&o, &so);
  ncfsm_comm *fresh, *c[2];
  assert_int_equal(ncfsm_comm_new(loop, &o, &fresh), NCFSM_OK);
  make_comms(loop, 2, &o, c, 0);
  run_until_state(loop, c[0], NCFSM_STATE_INIT_IN_PROGRESS);
  closed x[3] = {{0}};
  assert_int_equal(ncfsm_comm_close(fresh, on_closed, &x[0]), NCFSM_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_close(c[r], on_closed, &x[1 + r]), NCFSM_OK);
  run_until_closed(loop, x, 3);
  assert_int_equal(x[0].status, NCFSM_OK);
  for (int r = 1; r < 3; r++) {
    assert_int_equal(x[r].status, NCFSM_ERR_ABORTED);
    assert_int_equal(x[r].state, NCFSM_STATE_RELEASED);
  }
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* A failed comm (policy STAY: it waits in ERROR) is aborted; the status
 * is its failure's cause and ncfsm_comm_failure says why in the callback. */
static void test_close_failed(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  so.async_error_at_op = 0;
  test_comm_opts(&o, &so);
  o.on_error = NCFSM_ON_ERROR_STAY;
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms_with(2, c, &o);
  static float buf[2][4];
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], 4, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL),
                     NCFSM_OK);
  run_until_state(loop, c[0], NCFSM_STATE_ERROR);
  closed x[2] = {{0}};
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_close(c[r], on_closed, &x[r]), NCFSM_OK);
  run_until_closed(loop, x, 2);
  assert_int_equal(x[0].status, NCFSM_ERR_ASYNC);
  assert_true(x[0].failure[0] != 0);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* In an open group the close waits for the group's end (R3): the group's
 * works launch and complete, then the comm closes. */
static void test_close_in_group(void **state) {
  (void)state;
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  static float buf[2][4];
  works_done = 0;
  closed x[2] = {{0}};
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], 4, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_work, NULL, NULL),
                     NCFSM_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_close(c[r], on_closed, &x[r]), NCFSM_OK);
  run_turns(loop, 20);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_GROUP_OPEN);
  assert_int_equal(x[0].n, 0);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  run_until_closed(loop, x, 2);
  assert_int_equal(works_done, 2);
  assert_int_equal(x[0].status, NCFSM_OK);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* Only one rank closes: its finalize never completes, the watchdog ends
 * it at the comm's deadline and the close aborts it (status TIMEOUT). */
static void test_close_alone_times_out(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  so.finalize_polls = NEVER;
  test_comm_opts(&o, &so);
  o.timeout_ms = 200;
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms_with(2, c, &o);
  closed x = {0};
  assert_int_equal(ncfsm_comm_close(c[0], on_closed, &x), NCFSM_OK);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK); /* the watchdog's deadline, then the abort */
  assert_int_equal(x.n, 1);
  assert_int_equal(x.status, NCFSM_ERR_TIMEOUT);
  assert_non_null(strstr(x.failure, "FINALIZING"));
  /* rank 1 learnt it (verification, in memory): its comm failed naming rank 0 */
  assert_non_null(strstr(ncfsm_comm_failure(c[1]), "rank 0's comm failed first"));
  if (ncfsm_comm_state(c[1]) != NCFSM_STATE_CLOSED) assert_int_equal(ncfsm_comm_abort(c[1]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_wait_state(c[1], NCFSM_STATE_CLOSED, 5000), NCFSM_OK);
  assert_int_equal(ncfsm_comm_release(c[1]), NCFSM_OK);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* ncfsm_loop_shutdown closes every comm (one closing already keeps its own
 * callback), then its callback runs once; a second shutdown is refused;
 * ncfsm_loop_close succeeds after ncfsm_loop_run returns. */
static int downs;
static void on_down(ncfsm_loop *loop, void *arg) {
  (void)loop;
  (void)arg;
  downs++;
}

static void test_loop_shutdown(void **state) {
  (void)state;
  ncfsm_comm *c[3];
  ncfsm_loop *loop = ready_comms(3, c);
  ncfsm_comm *fresh;
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  assert_int_equal(ncfsm_comm_new(loop, &o, &fresh), NCFSM_OK);
  closed x = {0};
  assert_int_equal(ncfsm_comm_close(c[0], on_closed, &x), NCFSM_OK);
  downs = 0;
  assert_int_equal(ncfsm_loop_shutdown(loop, on_down, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_loop_shutdown(loop, on_down, NULL), NCFSM_ERR_ILLEGAL_STATE);
  assert_non_null(strstr(ncfsm_loop_last_error(loop), "called already"));
  assert_int_equal(downs, 0);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  assert_int_equal(downs, 1);
  assert_int_equal(x.n, 1);
  assert_int_equal(x.status, NCFSM_OK);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* A loop with no comm: the shutdown's callback runs at the next turn. */
static void test_loop_shutdown_empty(void **state) {
  (void)state;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  downs = 0;
  assert_int_equal(ncfsm_loop_shutdown(loop, on_down, NULL), NCFSM_OK);
  assert_int_equal(downs, 0);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  assert_int_equal(downs, 1);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* The close from another thread while the loop runs on its own thread. */
static void *closer(void *arg) {
  void **a = arg;
  assert_int_equal(ncfsm_comm_close(a[0], on_closed, a[1]), NCFSM_OK);
  return NULL;
}

static void test_close_from_thread(void **state) {
  (void)state;
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  closed x[2] = {{0}};
  assert_int_equal(ncfsm_loop_start_thread(loop), NCFSM_OK);
  pthread_t t[2];
  void *args[2][2] = {{c[0], &x[0]}, {c[1], &x[1]}};
  for (int r = 0; r < 2; r++) assert_int_equal(pthread_create(&t[r], NULL, closer, args[r]), 0);
  for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
  for (int i = 0; i < 20000; i++) {
    if (__atomic_load_n(&x[0].n, __ATOMIC_ACQUIRE) && __atomic_load_n(&x[1].n, __ATOMIC_ACQUIRE)) break;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(ncfsm_loop_stop_thread(loop), NCFSM_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(x[r].n, 1);
    assert_int_equal(x[r].status, NCFSM_OK);
  }
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_close_ready),
      cmocka_unit_test(test_close_twice),
      cmocka_unit_test(test_close_new_and_initialising),
      cmocka_unit_test(test_close_failed),
      cmocka_unit_test(test_close_in_group),
      cmocka_unit_test(test_close_alone_times_out),
      cmocka_unit_test(test_loop_shutdown),
      cmocka_unit_test(test_loop_shutdown_empty),
      cmocka_unit_test(test_close_from_thread),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
