/*
 * Every row of fsm/group.def and fsm/held.def walked (tests/rows/rows.h): a
 * loop's group opened, nested, ended from the wrong thread, failed by a call
 * inside it, refused for mixing blocking modes or for overlapping buffers
 * (R3, R12); a group its thread holds back from the loop, ended with one op
 * or none, nested, spilled into the loop's group by a second op or another
 * call, seen by other threads as another thread's group, its op failed by an
 * abort meanwhile; through ncfsm_group_start / ncfsm_group_end and the ops.
 * Each scenario checks the calls' results, the depth, the works' final
 * status, and that nothing of a failed group reached the backend.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "fsm/objects.h" /* loop->held_taken: the start race, forced */
#include "rows_world.h"

#define M "group"
#define H "held" /* fsm/held.def */

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

/* ---- a group held back on its thread (fsm/held.def) --------------------------------------- */

/* Another thread's view of a held group: its comm's state, and its calls. */
struct peer {
  ncfsm_loop *loop;
  ncfsm_comm *c, *other; /* c: the held op's comm; other: a comm with no op in the group */
  ncfsm_state_t state;
  ncfsm_result_t start, end, op_c, op_other, abort_c, finalize_c;
  int depth; /* ncfsm_group_depth from this thread */
  ncfsm_work *w_other;
  bool abort; /* abort c instead of the calls */
  char err[512], op_err[512];
};

static void *peer_main(void *arg) {
  struct peer *x = arg;
  x->state = ncfsm_comm_state(x->c);
  if (x->abort) {
    x->abort_c = ncfsm_comm_abort(x->c);
    return NULL;
  }
  x->depth = ncfsm_group_depth(x->loop);
  x->finalize_c = ncfsm_comm_finalize(x->c); /* GROUP_OPEN: refused, the held op stays */
  x->depth = ncfsm_group_depth(x->loop);
  x->finalize_c = ncfsm_comm_finalize(x->c); /* GROUP_OPEN: refused, the held op stays */
  x->start = ncfsm_group_start(x->loop);
  x->end = ncfsm_group_end(x->loop);
  snprintf(x->err, sizeof x->err, "%s", ncfsm_loop_last_error(x->loop));
  x->op_c = ncfsm_allreduce(x->c, buf[3], buf[3], 8, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL);
  snprintf(x->op_err, sizeof x->op_err, "%s", ncfsm_comm_last_error(x->c));
  x->op_other = ncfsm_allreduce(x->other, buf[2], buf[2], 8, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, count_cb,
                                (void *)(intptr_t)1, &x->w_other);
  return NULL;
}

/* The comm's state as another thread reads it (the holder's own call would spill the group). */
static void *state_main(void *arg) {
  struct peer *x = arg;
  x->state = ncfsm_comm_state(x->c);
  return NULL;
}
static ncfsm_state_t peer_state(ncfsm_comm *c) {
  struct peer x = {.c = c, .state = NCFSM_STATE_COUNT};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, state_main, &x), 0);
  pthread_join(th, NULL);
  return x.state;
}

static void run_peer(struct peer *x) {
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, peer_main, x), 0);
  pthread_join(th, NULL);
}

/* IDLE -START-> EMPTY, EMPTY -HOLD-> ONE, ONE -END-> IDLE (enter): a group
 * of one op never opens the loop's group; meanwhile another thread sees its
 * comm GROUP_OPEN, its group calls are refused (group NONE --START/END
 * [HELD_ELSEWHERE]-->), its op of that comm too (GROUP_THREAD), an op of
 * another comm goes. */
static void test_held_one_op(void **state) {
  (void)state;
  reset_cbs();
  const char *rows[][3] = {{"IDLE", "START", "ANY"}, {"EMPTY", "HOLD", "ANY"}, {"ONE", "END", "ANY"}};
  unsigned before[3];
  for (int i = 0; i < 3; i++) before[i] = rows_hits(H, rows[i][0], rows[i][1], rows[i][2]);
  unsigned open0 = rows_hits(M, "NONE", "START", "ANY"), hs0 = rows_hits(M, "NONE", "START", "HELD_ELSEWHERE"),
           he0 = rows_hits(M, "NONE", "END", "HELD_ELSEWHERE");
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  for (int i = 0; i < 8; i++) buf[0][i] = 2.0f, buf[2][i] = 3.0f;
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  ncfsm_work *w = op(c[0], buf[0], buf[0], 0);
  struct peer x = {.loop = loop, .c = c[0], .other = c[1]};
  run_peer(&x);
  assert_int_equal(x.state, NCFSM_STATE_GROUP_OPEN);
  assert_int_equal(x.depth, 0); /* held: not the loop's group */
  assert_int_equal(x.finalize_c, NCFSM_ERR_ILLEGAL_STATE);
  assert_int_equal(x.start, NCFSM_ERR_WRONG_THREAD);
  assert_int_equal(x.end, NCFSM_ERR_WRONG_THREAD);
  assert_non_null(strstr(x.err, "another thread opened a group on this loop and holds it"));
  assert_int_equal(x.op_c, NCFSM_ERR_WRONG_THREAD);
  assert_non_null(strstr(x.op_err, "GROUP_THREAD"));
  assert_int_equal(x.op_other, NCFSM_OK);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  assert_int_equal(rows_hits(M, "NONE", "START", "ANY"), open0); /* the loop's group never opened */
  want_work(w, NCFSM_WORK_COMPLETED, NCFSM_OK, 0);
  want_work(x.w_other, NCFSM_WORK_COMPLETED, NCFSM_OK, 1);
  assert_true(buf[0][0] == 5.0f && buf[2][7] == 5.0f); /* the held op and the peer's, two ranks of one collective */
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_READY);
  for (int i = 0; i < 3; i++) ROW_FIRED(H, rows[i][0], rows[i][1], rows[i][2], before[i]);
  ROW_FIRED(M, "NONE", "START", "HELD_ELSEWHERE", hs0);
  ROW_FIRED(M, "NONE", "END", "HELD_ELSEWHERE", he0);
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(x.w_other), NCFSM_OK);
  teardown_all(loop, c, 2);
}

/* EMPTY -START-> (nest), ONE -START-> (nest), EMPTY/ONE -END [NESTED]->
 * (unnest), EMPTY -END-> IDLE (drop): only the outermost end enters the op;
 * an empty group reaches nothing. */
static void test_held_nested(void **state) {
  (void)state;
  reset_cbs();
  const char *rows[][3] = {{"EMPTY", "START", "ANY"}, {"ONE", "START", "ANY"}, {"EMPTY", "END", "NESTED"},
                           {"ONE", "END", "NESTED"},  {"EMPTY", "END", "ANY"}};
  unsigned before[5];
  for (int i = 0; i < 5; i++) before[i] = rows_hits(H, rows[i][0], rows[i][1], rows[i][2]);
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  uint64_t calls = backend_calls(c[0]);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK); /* an empty group, nested */
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  assert_int_equal(backend_calls(c[0]), calls);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_ERR_INVALID_USAGE); /* it ended: depth 0 */
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  ncfsm_work *w = op(c[0], buf[0], buf[1], 0);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  assert_int_equal(peer_state(c[0]), NCFSM_STATE_GROUP_OPEN); /* still held: nothing queued */
  assert_int_equal(backend_calls(c[0]), calls);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  want_work(w, NCFSM_WORK_COMPLETED, NCFSM_OK, 0);
  for (int i = 0; i < 5; i++) ROW_FIRED(H, rows[i][0], rows[i][1], rows[i][2], before[i]);
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  teardown_all(loop, c, 1);
}
/* ONE -SPILL-> IDLE by a second op, EMPTY -SPILL-> IDLE by another call
 * (ncfsm_group_depth): the loop's group opens with the held depth and the
 * held op joins it; the rest is the loop's group (fsm/group.def). */
static void test_held_spill(void **state) {
  (void)state;
  reset_cbs();
  unsigned one0 = rows_hits(H, "ONE", "SPILL", "ANY"), empty0 = rows_hits(H, "EMPTY", "SPILL", "ANY"),
           open0 = rows_hits(M, "NONE", "START", "ANY"), nest0 = rows_hits(M, "OPEN", "START", "ANY");
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 8; i++) buf[r][i] = (float)(r + 1);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  ncfsm_work *w[2];
  w[0] = op(c[0], buf[0], buf[0], 0);
  w[1] = op(c[1], buf[1], buf[1], 1); /* the second op: the group is the loop's, depth 2 */
  ROW_FIRED(H, "ONE", "SPILL", "ANY", one0);
  ROW_FIRED(M, "NONE", "START", "ANY", open0);
  ROW_FIRED(M, "OPEN", "START", "ANY", nest0);
  assert_int_equal(ncfsm_group_depth(loop), 2);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  run_turns(loop, 3);
  assert_int_equal(ncfsm_work_state(w[0]), NCFSM_WORK_QUEUED); /* the loop's group, still open */
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  for (int r = 0; r < 2; r++) want_work(w[r], NCFSM_WORK_COMPLETED, NCFSM_OK, r);
  assert_true(buf[0][0] == 3.0f && buf[1][7] == 3.0f); /* the two ranks' ops, one collective */
  open0 = rows_hits(M, "NONE", "START", "ANY");
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_depth(loop), 1); /* a call under the lock: the empty group is the loop's */
  ROW_FIRED(H, "EMPTY", "SPILL", "ANY", empty0);
  ROW_FIRED(M, "NONE", "START", "ANY", open0);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_work_release(w[r]), NCFSM_OK);
  teardown_all(loop, c, 2);
}

/* Another thread aborts the held op's comm: the abort fails the op
 * (ABORTED), the holder's end finds nothing left to enter and succeeds. */
static void test_held_abort_meanwhile(void **state) {
  (void)state;
  reset_cbs();
  unsigned e0 = rows_hits(H, "ONE", "END", "ANY");
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  uint64_t calls = backend_calls(c[0]);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  ncfsm_work *w = op(c[0], buf[0], buf[1], 0);
  struct peer x = {.loop = loop, .c = c[0], .abort = true};
  run_peer(&x);
  assert_int_equal(x.state, NCFSM_STATE_GROUP_OPEN);
  assert_int_equal(x.abort_c, NCFSM_OK);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  ROW_FIRED(H, "ONE", "END", "ANY", e0);
  want_work(w, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED, 0);
  assert_int_equal(backend_calls(c[0]) - calls, 1); /* the abort alone: the op never reached the backend */
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  teardown_all(loop, c, 1);
}

/* The race a held group's start leaves open: another thread, which holds a
 * group back from a second loop and so takes the lock for this one, read the
 * loop before this thread marked it held and opened the loop's group.
 * Forced here by hiding the mark while the other thread starts. This
 * thread's next call under the lock spills, the loop refuses its START
 * (OTHER_THREAD), and that call fails with NCFSM_ERR_WRONG_THREAD. */
static void *start_main(void *arg) {
  ncfsm_loop *loop = arg, *second = loop_new();
  ncfsm_result_t r = ncfsm_group_start(second); /* held back from the second loop */
  int held = __atomic_exchange_n(&loop->held_taken, 0, __ATOMIC_ACQ_REL);
  if (r == NCFSM_OK) r = ncfsm_group_start(loop); /* the loop's group */
  __atomic_store_n(&loop->held_taken, held, __ATOMIC_RELEASE);
  if (ncfsm_group_end(second) != NCFSM_OK || ncfsm_loop_close(second) != NCFSM_OK) r = NCFSM_ERR_INVALID_USAGE;
  return (void *)(intptr_t)r;
}
static void *end_main(void *arg) { return (void *)(intptr_t)ncfsm_group_end(arg); }

static void test_held_start_race(void **state) {
  (void)state;
  reset_cbs();
  unsigned sp0 = rows_hits(H, "EMPTY", "SPILL", "ANY"), ref0 = rows_hits(M, "OPEN", "START", "OTHER_THREAD");
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  uint64_t calls = backend_calls(c[0]);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK); /* held */
  pthread_t th;
  void *r;
  assert_int_equal(pthread_create(&th, NULL, start_main, loop), 0);
  pthread_join(th, &r);
  assert_int_equal((intptr_t)r, NCFSM_OK); /* the other thread's group is the loop's */
  assert_int_equal(ncfsm_allreduce(c[0], buf[0], buf[1], 8, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL),
                   NCFSM_ERR_WRONG_THREAD);
  assert_non_null(strstr(ncfsm_loop_last_error(loop), "only the thread that opened it may nest or end it"));
  ROW_FIRED(H, "EMPTY", "SPILL", "ANY", sp0);
  ROW_FIRED(M, "OPEN", "START", "OTHER_THREAD", ref0);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_ERR_WRONG_THREAD); /* this thread's group is gone */
  assert_int_equal(pthread_create(&th, NULL, end_main, loop), 0);
  pthread_join(th, &r);
  assert_int_equal((intptr_t)r, NCFSM_OK);
  assert_int_equal(backend_calls(c[0]), calls);
  teardown_all(loop, c, 1);
}

static void test_every_row_walked(void **state) {
  (void)state;
  rows_check_all(M, NULL, 0);
  rows_check_all(H, NULL, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nested_launch), cmocka_unit_test(test_end_without_start),
      cmocka_unit_test(test_failed_group),  cmocka_unit_test(test_mixed),
      cmocka_unit_test(test_overlap),       cmocka_unit_test(test_held_one_op),
      cmocka_unit_test(test_held_nested),   cmocka_unit_test(test_held_spill),
      cmocka_unit_test(test_held_abort_meanwhile), cmocka_unit_test(test_held_start_race),
      cmocka_unit_test(test_every_row_walked),
  };
  return cmocka_run_group_tests(tests, rows_setup, NULL);
}
