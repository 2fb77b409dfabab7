/* The comm's rows of a working life (tests/rows/rows_comm.h): launches
 * (InProgress, R2, and final at once as on NCCL 2.22), batches that launch
 * while a group holds later ops (GROUP_OPEN), a launch that never becomes
 * final (the kit's SLOW fault), finalize through DRAINING and FINALIZING
 * (R4), and the failures of READY and GROUP_OPEN. */
#include <string.h>

#include "rows_comm.h"

/* Sim options of group ends that are final at once (NCCL 2.22.3: group_end_inprogress 0). */
static ncfsm_comm_opts final_at_once(ncfsm_sim_opts *so, const char *name) {
  ncfsm_comm_opts o;
  opts_init(&o, so, name);
  so->group_end_inprogress = 0;
  return o;
}

/* Rank r of the pair: op A ungrouped, then a group opened with op B, the loop
 * run until A completed (launched while the comm was GROUP_OPEN); then the
 * other rank's B, and the group's end. */
static void a_then_grouped_b(ncfsm_loop *loop, ncfsm_comm **c) {
  ncfsm_work *a[2], *b[2];
  for (int r = 0; r < 2; r++) a[r] = op(c[r], r);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  b[0] = op(c[0], 2);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_GROUP_OPEN);
  for (int r = 0; r < 2; r++) until_work(c[r], a[r], NCFSM_WORK_COMPLETED);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_GROUP_OPEN);
  b[1] = op(c[1], 3);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  for (int r = 0; r < 2; r++) want_work(b[r], NCFSM_WORK_COMPLETED, NCFSM_OK, -1);
  assert_int_equal(g_buf[0][0], 3);
  assert_int_equal(g_buf[3][0], 7);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_work_release(a[r]), NCFSM_OK);
    assert_int_equal(ncfsm_work_release(b[r]), NCFSM_OK);
  }
}

/* READY -ENLIST-> GROUP_OPEN -ENLIST-> -GROUP_CLOSE-> READY -LAUNCH_PENDING->
 * LAUNCH_IN_PROGRESS -LAUNCH_FINAL-> READY; a batch launched while GROUP_OPEN
 * (LAUNCH_PENDING, then LAUNCH_FINAL [GROUP_OPS] back to GROUP_OPEN); the same
 * with launches final at once (LAUNCH_FINAL in READY and in GROUP_OPEN);
 * defects in READY and GROUP_OPEN. */
void test_launches(void **state) {
  (void)state;
  static const char *const R[][3] = {
      {"READY", "ENLIST", NULL},         {"GROUP_OPEN", "ENLIST", NULL},        {"GROUP_OPEN", "GROUP_CLOSE", NULL},
      {"READY", "LAUNCH_PENDING", NULL}, {"LAUNCH_IN_PROGRESS", "LAUNCH_FINAL", NULL},
      {"GROUP_OPEN", "LAUNCH_PENDING", NULL}, {"LAUNCH_IN_PROGRESS", "LAUNCH_FINAL", "GROUP_OPS"},
      {"READY", "LAUNCH_FINAL", NULL},   {"GROUP_OPEN", "LAUNCH_FINAL", NULL},  {"READY", "INVALID", NULL},
      {"GROUP_OPEN", "INVALID", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_comm_opts o = copts("launch");
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready(2, &o, c);
  ncfsm_work *w[4];
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  for (int k = 0; k < 4; k++) w[k] = op(c[k % 2], k); /* two ops per comm: rows 0, 2 on c0 */
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  for (int k = 0; k < 4; k++) want_work(w[k], NCFSM_WORK_COMPLETED, NCFSM_OK, -1);
  assert_int_equal(g_buf[0][0], 3);
  assert_int_equal(g_buf[3][0], 7);
  for (int k = 0; k < 4; k++) assert_int_equal(ncfsm_work_release(w[k]), NCFSM_OK);
  a_then_grouped_b(loop, c);
  ncfsm_sim_opts so;
  ncfsm_comm_opts fo = final_at_once(&so, "final");
  ncfsm_comm *f[2];
  clique(loop, 2, &fo, f, true);
  a_then_grouped_b(loop, f);
  defect(c[0]);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_ERROR);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  ncfsm_work *g = op(c[1], 1);
  defect(c[1]); /* GROUP_OPEN: its op in the group fails with the defect */
  want_work(g, NCFSM_WORK_FAILED, NCFSM_ERR_INVALID_USAGE, -1);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(g), NCFSM_OK);
  ncfsm_comm *all[4] = {c[0], c[1], f[0], f[1]};
  world_down(loop, all, 4, NULL, 0);
  rows_expect_end(&e);
}

/* A comm of the clique "slow" (1 rank) whose launch never becomes final (the
 * kit's SLOW fault on LAUNCH_IN_PROGRESS), with its work *w. */
static ncfsm_comm *stuck_launch(ncfsm_loop *loop, uint64_t timeout_ms, ncfsm_work **w) {
  ncfsm_comm_opts o = copts("slow");
  o.timeout_ms = timeout_ms;
  ncfsm_comm *c;
  clique(loop, 1, &o, &c, true);
  *w = op(c, 0);
  until_state(c, NCFSM_STATE_LAUNCH_IN_PROGRESS);
  assert_int_equal(ncfsm_work_state(*w), NCFSM_WORK_LAUNCHING);
  return c;
}

/* LAUNCH_IN_PROGRESS: a group around a new op (it waits, R2), revoke (then
 * REVOKED, and destroy), finalize (DRAIN_LAUNCH_IN_PROGRESS, then abort or a
 * defect or the watchdog), a defect, an abort, the watchdog. */
void test_launch_in_progress(void **state) {
  (void)state;
  static const char *const R[][3] = {
      {"LAUNCH_IN_PROGRESS", "ENLIST", NULL},       {"LAUNCH_IN_PROGRESS", "GROUP_CLOSE", NULL},
      {"LAUNCH_IN_PROGRESS", "REVOKE", NULL},       {"REVOKING", "REVOKE_DONE", NULL},
      {"REVOKED", "DESTROY", NULL},                 {"LAUNCH_IN_PROGRESS", "FINALIZE", NULL},
      {"DRAIN_LAUNCH_IN_PROGRESS", "ABORT", NULL},  {"LAUNCH_IN_PROGRESS", "INVALID", NULL},
      {"DRAIN_LAUNCH_IN_PROGRESS", "INVALID", NULL}, {"LAUNCH_IN_PROGRESS", "ABORT", NULL},
      {"LAUNCH_IN_PROGRESS", "TIMEOUT", NULL},      {"DRAIN_LAUNCH_IN_PROGRESS", "TIMEOUT", NULL},
      {"LAUNCH_IN_PROGRESS", "ASYNC_ERROR", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  kit_begin("comm.launch_in_progress");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_SLOW, "slow", 0);
  f.when = NCFSM_AT_STATE;
  f.state = NCFSM_STATE_LAUNCH_IN_PROGRESS;
  f.polls = -1;
  kit_fault(&f);
  f = kit_fault_of(NCFSM_FAULT_ASYNC_ERROR, "launcherr", 0);
  f.when = NCFSM_AT_STATE;
  f.state = NCFSM_STATE_LAUNCH_IN_PROGRESS;
  kit_fault(&f);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm *c[8];
  ncfsm_work *w[9];
  ncfsm_comm_opts eo = copts("launcherr");
  clique(loop, 1, &eo, &c[7], true);
  w[8] = op(c[7], 2); /* its launch's poll returns the error */
  want_work(w[8], NCFSM_WORK_FAILED, NCFSM_ERR_ASYNC, -1);
  want_text(c[7], true, "ncclCommGetAsyncError in state LAUNCH_IN_PROGRESS");
  c[0] = stuck_launch(loop, 0, &w[0]);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  w[7] = op(c[0], 1);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  assert_int_equal(ncfsm_comm_revoke(c[0]), NCFSM_OK);
  want_state(c[0], NCFSM_STATE_REVOKED);
  want_work(w[0], NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED, -1);
  want_work(w[7], NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED, -1); /* queued behind the launch: nothing reached NCCL */
  assert_int_equal(ncfsm_comm_destroy(c[0]), NCFSM_OK);
  for (int k = 1; k < 7; k++) c[k] = stuck_launch(loop, k >= 5 ? FAST_MS : 0, &w[k]);
  for (int k = 1; k < 7; k++)
    if (k == 1 || k == 2 || k == 6) {
      assert_int_equal(ncfsm_comm_finalize(c[k]), NCFSM_OK); /* DEFER: ncclCommFinalize waits for the launch */
      assert_int_equal(ncfsm_comm_state(c[k]), NCFSM_STATE_DRAIN_LAUNCH_IN_PROGRESS);
    }
  assert_int_equal(ncfsm_comm_abort(c[1]), NCFSM_OK);
  want_work(w[1], NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED, -1);
  defect(c[2]);
  defect(c[3]);
  want_work(w[3], NCFSM_WORK_FAILED, NCFSM_ERR_INVALID_USAGE, -1);
  assert_int_equal(ncfsm_comm_abort(c[4]), NCFSM_OK);
  for (int k = 5; k < 7; k++) {
    want_state(c[k], NCFSM_STATE_ERROR);
    want_work(w[k], NCFSM_WORK_TIMED_OUT, NCFSM_ERR_TIMEOUT, -1);
    want_text(c[k], true, k == 5 ? "state LAUNCH_IN_PROGRESS did not end" : "state DRAIN_LAUNCH_IN_PROGRESS did not end");
  }
  for (int k = 0; k < 9; k++) assert_int_equal(ncfsm_work_release(w[k]), NCFSM_OK);
  world_down(loop, c, 8, NULL, 0);
  kit_end();
  rows_expect_end(&e);
}

/* Both ranks of a pair submit an op and finalize at once (R4: it launches
 * first), then destroy once FINALIZED. */
static void finalize_pair(ncfsm_loop *loop, ncfsm_comm **c) {
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) {
    w[r] = op(c[r], r);
    assert_int_equal(ncfsm_comm_finalize(c[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_state(c[r]), NCFSM_STATE_DRAINING);
  }
  assert_int_equal(ncfsm_allreduce(c[0], g_buf[2], g_buf[2], 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL),
                   NCFSM_ERR_ILLEGAL_STATE); /* R4: no new op */
  for (int r = 0; r < 2; r++) want_state(c[r], NCFSM_STATE_FINALIZED);
  for (int r = 0; r < 2; r++) {
    want_work(w[r], NCFSM_WORK_COMPLETED, NCFSM_OK, -1);
    assert_int_equal(ncfsm_work_release(w[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_destroy(c[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_state(c[r]), NCFSM_STATE_CLOSED);
  }
  assert_int_equal(g_buf[1][0], 3);
}

/* READY -FINALIZE-> DRAINING -LAUNCH_PENDING-> DRAIN_LAUNCH_IN_PROGRESS
 * -LAUNCH_FINAL-> DRAINING -FINALIZE_ISSUED-> FINALIZING -FINALIZE_DONE->
 * FINALIZED -DESTROY-> CLOSING; with launches final at once, DRAINING
 * -LAUNCH_FINAL->; an abort and a defect in DRAINING; a drain's launch whose
 * poll returns an async error (the kit's fault). */
void test_draining(void **state) {
  (void)state;
  static const char *const R[][3] = {
      {"READY", "FINALIZE", NULL},         {"DRAINING", "LAUNCH_PENDING", NULL},
      {"DRAIN_LAUNCH_IN_PROGRESS", "LAUNCH_FINAL", NULL}, {"DRAINING", "FINALIZE_ISSUED", "DRAINED"},
      {"FINALIZING", "FINALIZE_DONE", NULL}, {"FINALIZED", "DESTROY", NULL},
      {"DRAINING", "LAUNCH_FINAL", NULL},  {"DRAINING", "ABORT", NULL},
      {"DRAINING", "INVALID", NULL},       {"DRAIN_LAUNCH_IN_PROGRESS", "ASYNC_ERROR", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  kit_begin("comm.draining");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_ASYNC_ERROR, "drainerr", 0);
  f.when = NCFSM_AT_STATE;
  f.state = NCFSM_STATE_DRAIN_LAUNCH_IN_PROGRESS;
  kit_fault(&f);
  ncfsm_comm_opts o = copts("drain");
  ncfsm_comm *c[2], *fa[2], *d[3];
  ncfsm_loop *loop = ready(2, &o, c);
  finalize_pair(loop, c);
  ncfsm_sim_opts so;
  ncfsm_comm_opts fo = final_at_once(&so, "drainfast");
  clique(loop, 2, &fo, fa, true);
  finalize_pair(loop, fa);
  clique(loop, 1, &o, &d[0], true);
  ncfsm_work *w = op(d[0], 0);
  assert_int_equal(ncfsm_comm_finalize(d[0]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_abort(d[0]), NCFSM_OK);
  want_work(w, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED, -1);
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  clique(loop, 1, &o, &d[1], true);
  assert_int_equal(ncfsm_comm_finalize(d[1]), NCFSM_OK);
  defect(d[1]);
  o = copts("drainerr");
  clique(loop, 1, &o, &d[2], true);
  w = op(d[2], 0);
  assert_int_equal(ncfsm_comm_finalize(d[2]), NCFSM_OK);
  want_work(w, NCFSM_WORK_FAILED, NCFSM_ERR_ASYNC, -1);
  assert_int_equal(ncfsm_comm_state(d[2]), NCFSM_STATE_ERROR);
  want_text(d[2], true, "in state DRAIN_LAUNCH_IN_PROGRESS");
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  ncfsm_comm *all[7] = {c[0], c[1], fa[0], fa[1], d[0], d[1], d[2]};
  world_down(loop, all, 7, NULL, 0);
  kit_end();
  rows_expect_end(&e);
}

/* FINALIZING: a finalize whose last poll returns an async error, one that
 * never ends (the watchdog), an abort, a defect (the kit's faults on FINALIZING). */
void test_finalizing(void **state) {
  (void)state;
  static const char *const R[][3] = {{"FINALIZING", "ASYNC_ERROR", NULL}, {"FINALIZING", "TIMEOUT", NULL},
                                     {"FINALIZING", "ABORT", NULL},       {"FINALIZING", "INVALID", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  kit_begin("comm.finalizing");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_ASYNC_ERROR, "finerr", 0);
  f.when = NCFSM_AT_STATE;
  f.state = NCFSM_STATE_FINALIZING;
  kit_fault(&f);
  f = kit_fault_of(NCFSM_FAULT_SLOW, "finslow", 0);
  f.when = NCFSM_AT_STATE;
  f.state = NCFSM_STATE_FINALIZING;
  f.polls = -1;
  kit_fault(&f);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm *c[4];
  for (int k = 0; k < 4; k++) {
    ncfsm_comm_opts o = copts(k ? "finslow" : "finerr");
    if (k == 1) o.timeout_ms = FAST_MS;
    clique(loop, 1, &o, &c[k], true);
    assert_int_equal(ncfsm_comm_finalize(c[k]), NCFSM_OK);
    if (k >= 2) until_state(c[k], NCFSM_STATE_FINALIZING);
  }
  want_state(c[0], NCFSM_STATE_ERROR);
  want_text(c[0], true, "in state FINALIZING: NCFSM_ERR_ASYNC");
  want_state(c[1], NCFSM_STATE_ERROR);
  want_text(c[1], true, "state FINALIZING did not end");
  assert_int_equal(ncfsm_comm_abort(c[2]), NCFSM_OK);
  defect(c[3]);
  world_down(loop, c, 4, NULL, 0);
  kit_end();
  rows_expect_end(&e);
}

/* FINALIZED: an abort, a defect, a recovery asked for (ncfsm_comm_recover:
 * ASYNC_ERROR), and an async verification window that never completes
 * (its stall fails the comm with TIMEOUT: the peer does not verify). */
void test_finalized(void **state) {
  (void)state;
  static const char *const R[][3] = {{"FINALIZED", "ABORT", NULL}, {"FINALIZED", "INVALID", NULL},
                                     {"FINALIZED", "ASYNC_ERROR", NULL}, {"FINALIZED", "TIMEOUT", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm_opts o = copts("fin");
  ncfsm_comm *c[5];
  ncfsm_boot *b[3];
  for (int k = 0; k < 3; k++) {
    clique(loop, 1, &o, &c[k], true);
    if (k == 2) b[0] = arm(loop, c[k]);
    assert_int_equal(ncfsm_comm_finalize(c[k]), NCFSM_OK);
    want_state(c[k], NCFSM_STATE_FINALIZED);
  }
  assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
  defect(c[1]);
  /* a stall that comes only once the comm is FINALIZED: a generous bound on how long finalize takes */
  ncfsm_comm_opts v0 = copts("fin"), v1 = copts("fin");
  v0.verify = NCFSM_VERIFY_ASYNC;
  v0.verify_window = 1;
  v0.verify_stall_ms = 500;
  comms_boot(loop, 2, (const ncfsm_comm_opts *[]){&v0, &v1}, &c[3], &b[1], 0);
  for (int r = 0; r < 2; r++) want_state(c[3 + r], NCFSM_STATE_READY);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = op(c[3 + r], r);
  for (int r = 0; r < 2; r++) assert_int_equal(work_final(w[r]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_finalize(c[3]), NCFSM_OK);
  want_state(c[3], NCFSM_STATE_FINALIZED);
  assert_string_equal(ncfsm_comm_failure(c[3]), ""); /* reached before the stall: else the bound was too short */
  want_state(c[3], NCFSM_STATE_ERROR);
  want_text(c[3], true, "verification: not every rank reached collective seq 1");
  want_text(c[3], true, "in state FINALIZED: NCFSM_ERR_TIMEOUT");
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_work_release(w[r]), NCFSM_OK);
  /* last: no turn may step the recovery it starts (the loop's close cancels it) */
  assert_int_equal(ncfsm_comm_recover(c[2]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_state(c[2]), NCFSM_STATE_ERROR);
  want_text(c[2], true, "ncfsm_comm_recover: recovery requested in state FINALIZED");
  world_down(loop, c, 5, b, 3);
  rows_expect_end(&e);
}

/* READY: a launch final at once whose op sets an async error (R10), a work's
 * own deadline (its peer never submits), an abort, a destroy. */
void test_ready_failures(void **state) {
  (void)state;
  static const char *const R[][3] = {{"READY", "ASYNC_ERROR", NULL}, {"READY", "TIMEOUT", NULL},
                                     {"READY", "ABORT", NULL},       {"READY", "DESTROY", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  kit_begin("comm.ready_failures");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_ASYNC_ERROR, "readyerr", 0);
  kit_fault(&f);
  ncfsm_sim_opts so;
  ncfsm_comm_opts fo = final_at_once(&so, "readyerr");
  ncfsm_comm *c[5];
  ncfsm_loop *loop = ready(1, &fo, &c[0]);
  ncfsm_work *w[2];
  w[0] = op(c[0], 0);
  want_work(w[0], NCFSM_WORK_FAILED, NCFSM_ERR_ASYNC, -1);
  want_text(c[0], true, "launch in state READY: NCFSM_ERR_ASYNC");
  ncfsm_comm_opts o = copts("ready");
  clique(loop, 2, &o, &c[1], true);
  w[1] = op(c[1], 1);
  assert_int_equal(ncfsm_work_set_timeout(w[1], FAST_MS), NCFSM_OK);
  want_work(w[1], NCFSM_WORK_TIMED_OUT, NCFSM_ERR_TIMEOUT, -1);
  assert_int_equal(ncfsm_comm_state(c[1]), NCFSM_STATE_ERROR);
  clique(loop, 1, &o, &c[3], true);
  assert_int_equal(ncfsm_comm_abort(c[3]), NCFSM_OK);
  clique(loop, 1, &o, &c[4], true);
  assert_int_equal(ncfsm_comm_destroy(c[4]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_state(c[4]), NCFSM_STATE_CLOSED);
  for (int k = 0; k < 2; k++) assert_int_equal(ncfsm_work_release(w[k]), NCFSM_OK);
  world_down(loop, c, 5, NULL, 0);
  kit_end();
  rows_expect_end(&e);
}

/* GROUP_OPEN: a batch launched meanwhile whose op sets an async error, a
 * work in flight that times out, an abort; the group's ops fail with them. */
void test_group_open_failures(void **state) {
  (void)state;
  static const char *const R[][3] = {{"GROUP_OPEN", "ASYNC_ERROR", NULL}, {"GROUP_OPEN", "TIMEOUT", NULL},
                                     {"GROUP_OPEN", "ABORT", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  kit_begin("comm.group_open_failures");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_ASYNC_ERROR, "grouperr", 0);
  kit_fault(&f);
  ncfsm_sim_opts so;
  ncfsm_comm_opts fo = final_at_once(&so, "grouperr");
  ncfsm_comm *c[4];
  ncfsm_loop *loop = ready(1, &fo, &c[0]);
  ncfsm_comm_opts o = copts("group");
  clique(loop, 2, &o, &c[1], true);
  clique(loop, 1, &o, &c[3], true);
  for (int k = 0; k < 3; k++) {
    ncfsm_comm *x = c[k == 2 ? 3 : k];
    ncfsm_work *a = op(x, 0);
    if (k == 1) {
      assert_int_equal(ncfsm_work_set_timeout(a, FAST_MS), NCFSM_OK);
      until_work(x, a, NCFSM_WORK_IN_FLIGHT); /* its peer never submits */
    }
    assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
    ncfsm_work *b = op(x, 2);
    assert_int_equal(ncfsm_comm_state(x), NCFSM_STATE_GROUP_OPEN);
    if (k == 2) assert_int_equal(ncfsm_comm_abort(x), NCFSM_OK);
    else want_state(x, NCFSM_STATE_ERROR); /* the loop runs with the group open */
    ncfsm_result_t st = k == 0 ? NCFSM_ERR_ASYNC : k == 1 ? NCFSM_ERR_TIMEOUT : NCFSM_ERR_ABORTED;
    ncfsm_work_state_t ws = k == 0 ? NCFSM_WORK_FAILED : k == 1 ? NCFSM_WORK_TIMED_OUT : NCFSM_WORK_ABORTED;
    want_work(a, ws, st, -1);
    want_work(b, ws, st, -1); /* the op in the open group too */
    assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
    assert_int_equal(ncfsm_work_release(a), NCFSM_OK);
    assert_int_equal(ncfsm_work_release(b), NCFSM_OK);
  }
  world_down(loop, c, 4, NULL, 0);
  kit_end();
  rows_expect_end(&e);
}
