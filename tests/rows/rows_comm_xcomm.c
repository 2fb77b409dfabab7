/* The comm's rows of shrink (R7), revoke (R6) and the error policies (R5,
 * R10; tests/rows/rows_comm.h): a shrink that terminates the parent's work
 * from READY, REVOKED and ERROR, one that a survivor never joins, revoke and
 * a revoke that never becomes quiescent or fails, each policy (STAY, ABORT,
 * REVOKE with and without the runtime's Revoke, SHRINK with and without a
 * recovery armed), and ABORT_QUEUED. */
#include <string.h>

#include "rows_comm.h"

static const int EXCL2[] = {2};

/* Ranks 0 and 1 of the 3 ranks p shrink to themselves (rank 2 excluded) into
 * new children k (named "shrunk"), with flags; both children become READY. */
static void shrink_pair(ncfsm_loop *loop, ncfsm_comm **p, ncfsm_comm **k, int flags) {
  ncfsm_comm_opts ko = copts("shrunk");
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_comm_new(loop, &ko, &k[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_shrink(p[r], EXCL2, 1, flags, k[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_state(p[r]), NCFSM_STATE_SHRINKING);
  }
  for (int r = 0; r < 2; r++) want_state(k[r], NCFSM_STATE_READY);
  for (int r = 0; r < 2; r++) want_state(p[r], NCFSM_STATE_SHRUNK);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = op(k[r], r);
  for (int r = 0; r < 2; r++) {
    want_work(w[r], NCFSM_WORK_COMPLETED, NCFSM_OK, -1);
    assert_int_equal(ncfsm_work_release(w[r]), NCFSM_OK);
  }
  assert_int_equal(g_buf[0][0], 3);
  assert_int_equal(ncfsm_comm_size(k[0]), 2);
  assert_int_equal(ncfsm_comm_destroy(p[0]), NCFSM_ERR_ILLEGAL_STATE); /* R7: abort, never destroy */
  want_text(p[0], false, "call ncfsm_comm_abort");
}

/* READY -SHRINK_TERMINATE-> SHRINKING -SPLIT_DONE-> SHRUNK (abort mode: the
 * parent's work is terminated), a defect and the abort in SHRUNK. */
void test_shrink(void **state) {
  (void)state;
  static const char *const R[][3] = {{"READY", "SHRINK_TERMINATE", NULL}, {"SHRINKING", "SPLIT_DONE", NULL},
                                     {"SHRUNK", "INVALID", NULL},         {"SHRUNK", "ABORT", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_comm_opts o = copts("shrink");
  ncfsm_comm *c[5];
  ncfsm_loop *loop = ready(3, &o, c);
  ncfsm_work *w = op(c[0], 0); /* never joined by the others: terminated by the shrink */
  until_work(c[0], w, NCFSM_WORK_IN_FLIGHT);
  shrink_pair(loop, c, &c[3], NCFSM_SHRINK_ABORT);
  want_work(w, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED, -1);
  want_text(c[0], true, "ncclCommShrink terminated this communicator's work");
  defect(c[0]);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_abort(c[r]), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  world_down(loop, c, 5, NULL, 0);
  rows_expect_end(&e);
}

/* SHRINKING that the other survivor never joins: the watchdog (its child is
 * orphaned), an abort, a defect, a recovery asked for (ASYNC_ERROR). */
void test_shrinking_stuck(void **state) {
  (void)state;
  static const char *const R[][3] = {{"SHRINKING", "TIMEOUT", NULL}, {"SHRINKING", "ABORT", NULL},
                                     {"SHRINKING", "INVALID", NULL}, {"SHRINKING", "ASYNC_ERROR", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm *c[16];
  ncfsm_boot *b[1] = {NULL};
  ncfsm_comm_opts ko = copts("orphan");
  for (int k = 0; k < 4; k++) {
    ncfsm_comm_opts o = copts("stuckshrink");
    if (k == 0) o.timeout_ms = FAST_MS;
    clique(loop, 3, &o, &c[4 * k], true);
    if (k == 3) b[0] = arm(loop, c[4 * k]);
    assert_int_equal(ncfsm_comm_new(loop, &ko, &c[4 * k + 3]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_shrink(c[4 * k], EXCL2, 1, NCFSM_SHRINK_ABORT, c[4 * k + 3]), NCFSM_OK);
    run_turns(loop, 3);
  }
  want_state(c[0], NCFSM_STATE_ERROR);
  want_text(c[0], true, "state SHRINKING did not end");
  want_state(c[3], NCFSM_STATE_INIT_FAILED); /* its child: the parent failed first */
  assert_int_equal(ncfsm_comm_abort(c[4]), NCFSM_OK);
  defect(c[8]);
  assert_int_equal(ncfsm_comm_recover(c[12]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_state(c[12]), NCFSM_STATE_ERROR);
  world_down(loop, c, 16, b, 1);
  rows_expect_end(&e);
}

/* READY -REVOKE-> REVOKING -REVOKE_DONE-> REVOKED: a work in flight fails as
 * ABORTED (R6); REVOKED: a defect, an abort, a shrink (REVOKED
 * -SHRINK_TERMINATE-> SHRINKING -> SHRUNK). */
void test_revoke(void **state) {
  (void)state;
  static const char *const R[][3] = {{"READY", "REVOKE", NULL},          {"REVOKING", "REVOKE_DONE", NULL},
                                     {"REVOKED", "INVALID", NULL},       {"REVOKED", "ABORT", NULL},
                                     {"REVOKED", "SHRINK_TERMINATE", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_comm_opts o = copts("revoke");
  ncfsm_comm *c[7];
  ncfsm_loop *loop = ready(3, &o, c);
  ncfsm_work *w = op(c[0], 0);
  until_work(c[0], w, NCFSM_WORK_IN_FLIGHT);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_comm_revoke(c[r]), NCFSM_OK);
    want_state(c[r], NCFSM_STATE_REVOKED);
  }
  want_work(w, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED, -1);
  shrink_pair(loop, c, &c[3], NCFSM_SHRINK_DEFAULT); /* from REVOKED: terminating whatever the flags */
  clique(loop, 2, &o, &c[5], true);
  for (int r = 5; r < 7; r++) {
    assert_int_equal(ncfsm_comm_revoke(c[r]), NCFSM_OK);
    want_state(c[r], NCFSM_STATE_REVOKED);
  }
  defect(c[5]);
  assert_int_equal(ncfsm_comm_abort(c[6]), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  world_down(loop, c, 7, NULL, 0);
  rows_expect_end(&e);
}

/* REVOKING: a revoke that never becomes quiescent (the kit's SLOW fault on
 * REVOKING): the watchdog, an abort, a defect; one whose last poll returns an
 * error (ASYNC_ERROR; with policy REVOKE the comm is aborted: "revoke did not
 * reach quiescence"). */
void test_revoking_stuck(void **state) {
  (void)state;
  static const char *const R[][3] = {{"REVOKING", "TIMEOUT", NULL}, {"REVOKING", "ABORT", NULL},
                                     {"REVOKING", "INVALID", NULL}, {"REVOKING", "ASYNC_ERROR", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  kit_begin("comm.revoking");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_SLOW, "revslow", 0);
  f.when = NCFSM_AT_STATE;
  f.state = NCFSM_STATE_REVOKING;
  f.polls = -1;
  kit_fault(&f);
  f = kit_fault_of(NCFSM_FAULT_ASYNC_ERROR, "reverr", 0);
  f.when = NCFSM_AT_STATE;
  f.state = NCFSM_STATE_REVOKING;
  kit_fault(&f);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm *c[4];
  for (int k = 0; k < 4; k++) {
    ncfsm_comm_opts o = copts(k == 3 ? "reverr" : "revslow");
    if (k == 0) o.timeout_ms = FAST_MS;
    if (k == 3) o.on_error = NCFSM_ON_ERROR_REVOKE;
    clique(loop, 1, &o, &c[k], true);
    assert_int_equal(ncfsm_comm_revoke(c[k]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_state(c[k]), NCFSM_STATE_REVOKING);
  }
  want_state(c[0], NCFSM_STATE_ERROR);
  want_text(c[0], true, "state REVOKING did not end");
  assert_int_equal(ncfsm_comm_abort(c[1]), NCFSM_OK);
  defect(c[2]);
  want_state(c[3], NCFSM_STATE_CLOSED);
  want_text(c[3], true, "after ncclCommRevoke (the revoke did not reach quiescence)");
  want_text(c[3], false, "the error policy aborts it (revoke did not reach quiescence)");
  world_down(loop, c, 4, NULL, 0);
  kit_end();
  rows_expect_end(&e);
}

/* A comm of policy pol (sim options so) whose work times out: the policy runs. */
static ncfsm_comm *failing(ncfsm_loop *loop, ncfsm_error_policy_t pol, const ncfsm_sim_opts *so, const char *name,
                           ncfsm_comm **peer) {
  ncfsm_comm_opts o = copts(name);
  o.on_error = pol;
  if (so) o.sim = so;
  ncfsm_comm *c[2];
  clique(loop, 2, &o, c, true);
  ncfsm_work *w = op(c[0], 0); /* rank 1 never submits */
  assert_int_equal(ncfsm_work_set_timeout(w, FAST_MS), NCFSM_OK);
  want_work(w, NCFSM_WORK_TIMED_OUT, NCFSM_ERR_TIMEOUT, -1);
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  *peer = c[1];
  return c[0];
}

/* ERROR and its policies: STAY (then a defect, a revoke by the program, an
 * abort), ABORT (ABORT_QUEUED: the loop's abort), REVOKE (REVOKING) and
 * REVOKE without the runtime's Revoke (aborted, saying so), SHRINK with no
 * recovery armed (aborted, saying so); a shrink of failed comms (ERROR
 * -SHRINK_TERMINATE->). */
void test_policies(void **state) {
  (void)state;
  static const char *const R[][3] = {
      {"ERROR", "POLICY", "POLICY_STAY"}, {"ERROR", "INVALID", NULL}, {"ERROR", "REVOKE", NULL},
      {"ERROR", "ABORT", NULL},           {"ERROR", "POLICY", NULL},  {"ABORT_QUEUED", "ABORT_ISSUED", NULL},
      {"ERROR", "POLICY", "POLICY_REVOKE"}, {"ERROR", "SHRINK_TERMINATE", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm *c[18];
  int n = 0;
  c[n] = failing(loop, NCFSM_ON_ERROR_STAY, NULL, "stay", &c[n + 1]);
  assert_int_equal(ncfsm_comm_state(c[n]), NCFSM_STATE_ERROR);
  defect(c[n]);
  want_text(c[n], true, "watchdog: ALLREDUCE seq 0 did not complete"); /* the failure stays the first one */
  assert_int_equal(ncfsm_comm_revoke(c[n]), NCFSM_OK);
  want_state(c[n], NCFSM_STATE_REVOKED);
  n += 2;
  c[n] = failing(loop, NCFSM_ON_ERROR_STAY, NULL, "stay", &c[n + 1]);
  assert_int_equal(ncfsm_comm_abort(c[n]), NCFSM_OK);
  n += 2;
  c[n] = failing(loop, NCFSM_ON_ERROR_ABORT, NULL, "abort", &c[n + 1]);
  want_state(c[n], NCFSM_STATE_CLOSED);
  want_text(c[n], false, "the error policy aborts it at the loop's next turn (R5)");
  n += 2;
  c[n] = failing(loop, NCFSM_ON_ERROR_REVOKE, NULL, "revokes", &c[n + 1]);
  want_state(c[n], NCFSM_STATE_REVOKED);
  want_text(c[n], false, "the error policy revoked it (R6)");
  n += 2;
  static ncfsm_sim_opts old;
  test_sim_opts(&old);
  old.has_revoke = 0; /* NCCL 2.28.3: no ncclCommRevoke */
  c[n] = failing(loop, NCFSM_ON_ERROR_REVOKE, &old, "norevoke", &c[n + 1]);
  want_state(c[n], NCFSM_STATE_CLOSED);
  want_text(c[n], false, "the error policy aborts it (revoke is not possible here)");
  n += 2;
  c[n] = failing(loop, NCFSM_ON_ERROR_SHRINK, NULL, "noshrink", &c[n + 1]);
  want_state(c[n], NCFSM_STATE_CLOSED);
  want_text(c[n], false, "the error policy is shrink but no recovery is armed");
  n += 2;
  /* ranks 0 and 1 of 3 fail (their work waits for rank 2), then shrink to themselves */
  ncfsm_comm_opts o = copts("failed3");
  clique(loop, 3, &o, &c[n], true);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) {
    w[r] = op(c[n + r], r);
    assert_int_equal(ncfsm_work_set_timeout(w[r], FAST_MS), NCFSM_OK);
  }
  for (int r = 0; r < 2; r++) want_work(w[r], NCFSM_WORK_TIMED_OUT, NCFSM_ERR_TIMEOUT, -1);
  ncfsm_comm_opts ko = copts("refused");
  ncfsm_comm *k;
  assert_int_equal(ncfsm_comm_new(loop, &ko, &k), NCFSM_OK);
  assert_int_equal(ncfsm_comm_shrink(c[n], EXCL2, 1, NCFSM_SHRINK_DEFAULT, k), NCFSM_ERR_ILLEGAL_STATE);
  want_text(c[n], false, "shrink it with NCFSM_SHRINK_ABORT");
  assert_int_equal(ncfsm_comm_state(k), NCFSM_STATE_NEW); /* refused before NCCL: the child stays NEW */
  assert_int_equal(ncfsm_comm_release(k), NCFSM_OK);
  shrink_pair(loop, &c[n], &c[n + 3], NCFSM_SHRINK_ABORT);
  n += 5;
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_work_release(w[r]), NCFSM_OK);
  world_down(loop, c, n, NULL, 0);
  rows_expect_end(&e);
}

/* POLICY_RECOVER (policy SHRINK, recovery armed): ncfsm_comm_recover fails a
 * READY comm (READY -ASYNC_ERROR-> ERROR -POLICY-> start_recovery), an
 * INIT_IN_PROGRESS one (INIT_FAILED -POLICY [POLICY_RECOVER]->), and a
 * parent SPLITTING (policy STAY: its child fails). The recoveries start and
 * are cancelled by the loop's close (their steps never run here). */
void test_recover_policy(void **state) {
  (void)state;
  static const char *const R[][3] = {{"READY", "ASYNC_ERROR", NULL},       {"ERROR", "POLICY", "POLICY_RECOVER"},
                                     {"INIT_IN_PROGRESS", "ASYNC_ERROR", NULL}, {"INIT_FAILED", "POLICY", "POLICY_RECOVER"},
                                     {"SPLITTING", "ASYNC_ERROR", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  unsigned started = rows_hits("recover", "ARMED", "COMM_FAILED", "ANY");
  kit_begin("comm.recover_policy");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_INIT_HANG, "rechang", -1);
  kit_fault(&f);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm *c[5];
  ncfsm_boot *b[3];
  ncfsm_comm_opts o = copts("recready");
  o.on_error = NCFSM_ON_ERROR_SHRINK;
  clique(loop, 1, &o, &c[0], true);
  b[0] = arm(loop, c[0]);
  o.name = "rechang";
  clique(loop, 1, &o, &c[1], false);
  until_state(c[1], NCFSM_STATE_INIT_IN_PROGRESS);
  b[1] = arm(loop, c[1]);
  o = copts("recsplit");
  clique(loop, 2, &o, &c[2], true);
  b[2] = arm(loop, c[2]);
  ncfsm_comm_opts ko = copts("recchild");
  assert_int_equal(ncfsm_comm_new(loop, &ko, &c[4]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_split(c[2], 0, 0, c[4]), NCFSM_OK); /* rank 1 never splits */
  for (int k = 0; k < 3; k++) {
    assert_int_equal(ncfsm_comm_recover(c[k]), NCFSM_OK);
    want_text(c[k], true, "ncfsm_comm_recover: recovery requested");
  }
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_ERROR);
  assert_int_equal(ncfsm_comm_state(c[1]), NCFSM_STATE_INIT_FAILED);
  assert_int_equal(ncfsm_comm_state(c[2]), NCFSM_STATE_ERROR);
  assert_int_equal(ncfsm_comm_state(c[4]), NCFSM_STATE_INIT_FAILED);
  assert_int_equal(rows_hits("recover", "ARMED", "COMM_FAILED", "ANY"), started + 3);
  world_down(loop, c, 5, b, 3);
  kit_end();
  rows_expect_end(&e);
}

/* ABORT_QUEUED outside a turn: the comm's bootstrap reports a lost rank
 * (READY -ASYNC_ERROR-> ERROR, policy ABORT): a defect (only the message),
 * then the program's abort before the loop's. */
void test_abort_queued(void **state) {
  (void)state;
  static const char *const R[][3] = {{"ABORT_QUEUED", "INVALID", NULL}, {"ABORT_QUEUED", "ABORT", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm_opts o = copts("queuedabort");
  o.on_error = NCFSM_ON_ERROR_ABORT;
  ncfsm_comm *c[1];
  clique(loop, 1, &o, c, true);
  ncfsm_boot *b[1] = {arm_lost(loop, c[0])};
  lost_dispatch(loop);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_ABORT_QUEUED);
  want_text(c[0], true, "rank 1 lost (bootstrap:");
  defect(c[0]);
  assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_CLOSED);
  world_down(loop, c, 1, b, 1);
  rows_expect_end(&e);
}
