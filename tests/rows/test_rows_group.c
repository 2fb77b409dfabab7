/*
 * Every row of fsm/group.def walked (tests/rows/rows.h): a loop's group
 * opened, nested, ended from the wrong thread, failed by a call inside it,
 * refused for mixing blocking modes or for overlapping buffers (R3, R12),
 * through ncfsm_group_start / ncfsm_group_end and the ops. Each scenario
 * checks the calls' results, the depth, the works' final status, and that
 * nothing of a failed group reached the backend.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "rows_world.h"

#define M "group"

static float buf[4][16];

static ncfsm_work *op(ncfsm_comm *c, float *send, float *recv, int cbi) {
  ncfsm_work *w = NULL;
  assert_int_equal(ncfsm_allreduce(c, send, recv, 8, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, count_cb, (void *)(intptr_t)cbi,
                                   &w),
                   NCFSM_OK);
  return w;
}

/* ---- another thread's group calls --------------------------------------------------------- */

struct other {
  ncfsm_loop *loop;
  ncfsm_result_t start, end;
  char err[512];
};

static void *other_main(void *arg) {
  struct other *x = arg;
  x->start = ncfsm_group_start(x->loop);
  x->end = ncfsm_group_end(x->loop);
  snprintf(x->err, sizeof x->err, "%s", ncfsm_loop_last_error(x->loop));
  return NULL;
}

/* Another thread's start and end are refused; the group is unchanged (R3). */
static void other_thread_calls(ncfsm_loop *loop) {
  struct other x = {loop, NCFSM_OK, NCFSM_OK, ""};
  int depth = ncfsm_group_depth(loop);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, other_main, &x), 0);
  pthread_join(th, NULL);
  assert_int_equal(x.start, NCFSM_ERR_WRONG_THREAD);
  assert_int_equal(x.end, NCFSM_ERR_WRONG_THREAD);
  assert_non_null(strstr(x.err, "only the thread that opened it may nest or end it"));
  assert_int_equal(ncfsm_group_depth(loop), depth);
}

/* NONE -START-> OPEN, OPEN -START-> (nest), OPEN -END [NESTED]-> (unnest),
 * OPEN -END-> NONE (launch), and another thread's calls while OPEN. */
static void test_nested_launch(void **state) {
  (void)state;
  reset_cbs();
  unsigned s0 = rows_hits(M, "NONE", "START", "ANY"), n0 = rows_hits(M, "OPEN", "START", "ANY"),
           u0 = rows_hits(M, "OPEN", "END", "NESTED"), l0 = rows_hits(M, "OPEN", "END", "ANY"),
           ts0 = rows_hits(M, "OPEN", "START", "OTHER_THREAD"), te0 = rows_hits(M, "OPEN", "END", "OTHER_THREAD");
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_depth(loop), 2);
  other_thread_calls(loop);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < 8; i++) buf[r][i] = (float)(r + 1);
    w[r] = op(c[r], buf[r], buf[r], r);
  }
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_GROUP_OPEN);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK); /* nested: nothing launches */
  assert_int_equal(ncfsm_group_depth(loop), 1);
  run_turns(loop, 3);
  assert_int_equal(ncfsm_work_state(w[0]), NCFSM_WORK_QUEUED);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_depth(loop), 0);
  for (int r = 0; r < 2; r++) want_work(w[r], NCFSM_WORK_COMPLETED, NCFSM_OK, r);
  assert_true(buf[0][0] == 3.0f && buf[1][7] == 3.0f);
  ROW_FIRED(M, "NONE", "START", "ANY", s0);
  ROW_FIRED(M, "OPEN", "START", "ANY", n0);
  ROW_FIRED(M, "OPEN", "END", "NESTED", u0);
  ROW_FIRED(M, "OPEN", "END", "ANY", l0);
  ROW_FIRED(M, "OPEN", "START", "OTHER_THREAD", ts0);
  ROW_FIRED(M, "OPEN", "END", "OTHER_THREAD", te0);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_work_release(w[r]), NCFSM_OK);
  teardown_all(loop, c, 2);
}

/* NONE -END-> NONE: an end without a start is refused (R3: ncclInvalidUsage). */
static void test_end_without_start(void **state) {
  (void)state;
  unsigned e0 = rows_hits(M, "NONE", "END", "ANY");
  ncfsm_loop *loop = loop_new();
  assert_int_equal(ncfsm_group_end(loop), NCFSM_ERR_INVALID_USAGE);
  assert_non_null(strstr(ncfsm_loop_last_error(loop), "not in a group"));
  assert_int_equal(ncfsm_group_depth(loop), 0);
  ROW_FIRED(M, "NONE", "END", "ANY", e0);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* OPEN -CALL_FAILED-> FAILED, then in FAILED: a second failed call, a nested
 * start and end, another thread's calls, and the outermost end that fails
 * every work with NCFSM_ERR_GROUP and returns the first call's error. */
static void test_failed_group(void **state) {
  (void)state;
  reset_cbs();
  const char *rows[][3] = {{"OPEN", "CALL_FAILED", "ANY"},   {"FAILED", "CALL_FAILED", "ANY"},
                           {"FAILED", "START", "ANY"},       {"FAILED", "END", "NESTED"},
                           {"FAILED", "START", "OTHER_THREAD"}, {"FAILED", "END", "OTHER_THREAD"},
                           {"FAILED", "END", "ANY"}};
  unsigned before[7];
  for (int i = 0; i < 7; i++) before[i] = rows_hits(M, rows[i][0], rows[i][1], rows[i][2]);
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  uint64_t calls = backend_calls(c[0]);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  ncfsm_work *w = op(c[0], buf[0], buf[1], 0);
  assert_int_equal(ncfsm_allreduce(c[0], buf[0], buf[1], 8, (ncfsm_dtype_t)99, NCFSM_OP_SUM, NULL, NULL, NULL, NULL),
                   NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_comm_finalize(c[0]), NCFSM_ERR_ILLEGAL_STATE); /* a second failed call (R3: GROUP_OPEN) */
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  other_thread_calls(loop);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK); /* nested: only the depth changes */
  assert_int_equal(ncfsm_group_depth(loop), 1);
  assert_int_equal(ncfsm_work_state(w), NCFSM_WORK_QUEUED);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_ERR_INVALID_ARGUMENT); /* the first call's error */
  assert_non_null(strstr(ncfsm_loop_last_error(loop), "the group failed: an earlier call in it returned "
                                                      "NCFSM_ERR_INVALID_ARGUMENT"));
  want_work(w, NCFSM_WORK_FAILED, NCFSM_ERR_GROUP, 0);
  assert_int_equal(backend_calls(c[0]), calls);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_READY);
  for (int i = 0; i < 7; i++) ROW_FIRED(M, rows[i][0], rows[i][1], rows[i][2], before[i]);
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  teardown_all(loop, c, 1);
}

/* OPEN -END [MIXED]-> NONE: a blocking and a nonblocking comm in one group are
 * refused before the backend (R3). */
static void test_mixed(void **state) {
  (void)state;
  reset_cbs();
  unsigned m0 = rows_hits(M, "OPEN", "END", "MIXED");
  ncfsm_sim_opts so;
  ncfsm_comm_opts nb, bl;
  opts_init(&nb, &so, "nonblocking");
  opts_init(&bl, &so, "blocking");
  bl.blocking = 1;
  ncfsm_loop *loop = loop_new();
  ncfsm_comm *c[2];
  comms_init(loop, 1, (const ncfsm_comm_opts *[]){&nb}, &c[0]);
  comms_init(loop, 1, (const ncfsm_comm_opts *[]){&bl}, &c[1]);
  for (int r = 0; r < 2; r++) want_state(c[r], NCFSM_STATE_READY);
  uint64_t calls[2] = {backend_calls(c[0]), backend_calls(c[1])};
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = op(c[r], buf[r], buf[r + 2], r);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_ERR_INVALID_USAGE);
  assert_non_null(strstr(ncfsm_loop_last_error(loop), "mixes blocking and nonblocking communicators"));
  /* defect (listed in allowed[] of test_every_row_walked): the row's action says
   * NCFSM_ERR_INVALID_USAGE, the works get NCFSM_ERR_GROUP */
  for (int r = 0; r < 2; r++) want_work(w[r], NCFSM_WORK_FAILED, NCFSM_ERR_GROUP, r);
  for (int r = 0; r < 2; r++) assert_int_equal(backend_calls(c[r]), calls[r]);
  ROW_FIRED(M, "OPEN", "END", "MIXED", m0);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_work_release(w[r]), NCFSM_OK);
  teardown_all(loop, c, 2);
}

/* OPEN -END [OVERLAP]-> NONE: two ops of one group write the same buffer (R12). */
static void test_overlap(void **state) {
  (void)state;
  reset_cbs();
  unsigned o0 = rows_hits(M, "OPEN", "END", "OVERLAP");
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  uint64_t calls = backend_calls(c[0]);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  ncfsm_work *w[2];
  for (int k = 0; k < 2; k++) w[k] = op(c[0], buf[0], buf[0], k); /* in place, twice */
  assert_int_equal(ncfsm_group_end(loop), NCFSM_ERR_OVERLAP);
  assert_non_null(strstr(ncfsm_loop_last_error(loop), "overlap where one writes"));
  for (int k = 0; k < 2; k++) want_work(w[k], NCFSM_WORK_FAILED, NCFSM_ERR_OVERLAP, k);
  assert_int_equal(backend_calls(c[0]), calls);
  ROW_FIRED(M, "OPEN", "END", "OVERLAP", o0);
  for (int k = 0; k < 2; k++) assert_int_equal(ncfsm_work_release(w[k]), NCFSM_OK);
  teardown_all(loop, c, 1);
}

static void test_every_row_walked(void **state) {
  (void)state;
  rows_check_all(M, NULL, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nested_launch), cmocka_unit_test(test_end_without_start),
      cmocka_unit_test(test_failed_group),  cmocka_unit_test(test_mixed),
      cmocka_unit_test(test_overlap),       cmocka_unit_test(test_every_row_walked),
  };
  return cmocka_run_group_tests(tests, rows_setup, NULL);
}
