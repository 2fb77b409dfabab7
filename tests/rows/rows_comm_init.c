/* The comm's rows from NEW to READY (tests/rows/rows_comm.h): init by
 * unique id and over a bootstrap, groups during each init state, every way
 * an init fails, split children waiting for their parent (R8) and orphaned
 * by it. */
#include <stdio.h>
#include <string.h>

#include "rows_comm.h"

/* NEW: released, aborted, a defect; INIT_QUEUED and INIT_IN_PROGRESS with a
 * group open around ops (R3: they wait in it), INIT_DONE into GROUP_OPEN and
 * into READY; CLOSED and RELEASED with a defect. */
void test_new_and_init(void **state) {
  (void)state;
  static const char *const R[][3] = {
      {"NEW", "RELEASE", NULL},         {"NEW", "ABORT", NULL},          {"CLOSING", "CLOSE_DONE", NULL},
      {"CLOSED", "RELEASE", NULL},      {"NEW", "INVALID", NULL},        {"CLOSED", "INVALID", NULL},
      {"NEW", "INIT", NULL},            {"INIT_QUEUED", "ENLIST", NULL}, {"INIT_QUEUED", "GROUP_CLOSE", NULL},
      {"INIT_QUEUED", "INIT_ISSUED", NULL}, {"INIT_IN_PROGRESS", "ENLIST", NULL},
      {"INIT_IN_PROGRESS", "GROUP_CLOSE", NULL}, {"INIT_IN_PROGRESS", "INIT_DONE", "GROUP_OPS"},
      {"GROUP_OPEN", "GROUP_CLOSE", NULL}, {"INIT_IN_PROGRESS", "INIT_DONE", NULL},
      {"INIT_QUEUED", "INVALID", NULL}, {"RELEASED", "INVALID", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm_opts o = copts("init");
  ncfsm_comm *a, *b;
  assert_int_equal(ncfsm_comm_new(loop, &o, &a), NCFSM_OK);
  assert_int_equal(ncfsm_comm_release(a), NCFSM_OK);
  assert_int_equal(ncfsm_comm_new(loop, &o, &b), NCFSM_OK);
  defect(b); /* NEW keeps its state: only the message */
  assert_int_equal(ncfsm_comm_abort(b), NCFSM_OK);
  assert_int_equal(ncfsm_comm_state(b), NCFSM_STATE_CLOSED);
  defect(b);
  assert_int_equal(ncfsm_comm_release(b), NCFSM_OK);

  ncfsm_sim_opts so;
  ncfsm_comm_opts slow;
  opts_init(&slow, &so, "init");
  so.init_polls = 4; /* INIT_IN_PROGRESS lasts a few turns */
  ncfsm_comm *c[1];
  clique(loop, 1, &slow, c, false);
  ncfsm_work *w[3];
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  w[0] = op(c[0], 0);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  until_state(c[0], NCFSM_STATE_INIT_IN_PROGRESS);
  assert_int_equal(ncfsm_work_state(w[0]), NCFSM_WORK_QUEUED); /* DEFER */
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  w[1] = op(c[0], 1);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  w[2] = op(c[0], 2);
  until_state(c[0], NCFSM_STATE_GROUP_OPEN); /* its init is done while its op waits in the group */
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  for (int k = 0; k < 3; k++) want_work(w[k], NCFSM_WORK_COMPLETED, NCFSM_OK, -1);
  assert_int_equal(g_buf[2][0], 3); /* a clique of one: its own values */
  ncfsm_comm *d[1];
  clique(loop, 1, &o, d, true);
  ncfsm_work *dw = op(d[0], 3);
  assert_int_equal(work_final(dw), NCFSM_OK);
  ncfsm_comm *q[1];
  clique(loop, 1, &o, q, false);
  defect(q[0]); /* INIT_QUEUED: fails like an init (INIT_FAILED), policy STAY */
  want_text(q[0], true, "engine defect: event REVOKE_DONE is invalid in state INIT_QUEUED");
  assert_int_equal(ncfsm_comm_abort(d[0]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_release(d[0]), NCFSM_OK); /* dw keeps its memory */
  defect(d[0]);
  assert_int_equal(ncfsm_work_release(dw), NCFSM_OK);
  for (int k = 0; k < 3; k++) assert_int_equal(ncfsm_work_release(w[k]), NCFSM_OK);
  ncfsm_comm *all[2] = {c[0], q[0]};
  world_down(loop, all, 2, NULL, 0);
  rows_expect_end(&e);
}

/* NEW -INIT_BOOT-> ID_QUEUED -ID_POSTED-> ID_EXCHANGE -ID_KNOWN-> INIT_QUEUED,
 * with groups in ID_QUEUED and ID_EXCHANGE: rank 1 initialises first and
 * waits for the root's id. */
void test_init_boot(void **state) {
  (void)state;
  static const char *const R[][3] = {{"NEW", "INIT_BOOT", NULL},        {"ID_QUEUED", "ENLIST", NULL},
                                     {"ID_QUEUED", "GROUP_CLOSE", NULL}, {"ID_QUEUED", "ID_POSTED", NULL},
                                     {"ID_EXCHANGE", "ENLIST", NULL},    {"ID_EXCHANGE", "GROUP_CLOSE", NULL},
                                     {"ID_EXCHANGE", "ID_KNOWN", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm_opts o = copts("boot");
  const char *g = boot_group("init");
  char group[96];
  snprintf(group, sizeof group, "%s", g);
  ncfsm_boot *b[2] = {boot_open(loop, group, 0, 2, 0), boot_open(loop, group, 1, 2, 0)};
  ncfsm_comm *c[2];
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_new(loop, &o, &c[r]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_init_boot(c[1], b[1]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_state(c[1]), NCFSM_STATE_ID_QUEUED);
  ncfsm_work *w[4];
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  w[1] = op(c[1], 1);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  until_state(c[1], NCFSM_STATE_ID_EXCHANGE);
  run_turns(loop, 3);
  assert_int_equal(ncfsm_comm_state(c[1]), NCFSM_STATE_ID_EXCHANGE); /* the root has not posted */
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  w[3] = op(c[1], 3);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  assert_int_equal(ncfsm_comm_init_boot(c[0], b[0]), NCFSM_OK);
  w[0] = op(c[0], 0);
  w[2] = op(c[0], 2);
  for (int k = 0; k < 4; k++) want_work(w[k], NCFSM_WORK_COMPLETED, NCFSM_OK, -1);
  for (int k = 0; k < 4; k++) assert_int_equal(g_buf[k][7], k < 2 ? 1 + 2 : 3 + 4); /* instance 0: w0 w1, 1: w2 w3 */
  for (int k = 0; k < 4; k++) assert_int_equal(ncfsm_work_release(w[k]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_size(c[1]), 2);
  world_down(loop, c, 2, b, 2);
  rows_expect_end(&e);
}

/* INIT_IN_PROGRESS: an init that fails (policy STAY, then a defect and an
 * abort in INIT_FAILED), one that never ends (the watchdog, policy ABORT:
 * ABORT_QUEUED, then the loop's abort), an abort, a defect; INIT_QUEUED: its
 * deadline passed before the loop issued the init; an abort before it. */
void test_init_failures(void **state) {
  (void)state;
  static const char *const R[][3] = {
      {"INIT_IN_PROGRESS", "ASYNC_ERROR", NULL}, {"INIT_FAILED", "POLICY", "POLICY_STAY"}, {"INIT_FAILED", "INVALID", NULL},
      {"INIT_FAILED", "ABORT", NULL},           {"INIT_IN_PROGRESS", "TIMEOUT", NULL},     {"INIT_FAILED", "POLICY", NULL},
      {"ABORT_QUEUED", "ABORT_ISSUED", NULL},   {"INIT_IN_PROGRESS", "ABORT", NULL},       {"INIT_IN_PROGRESS", "INVALID", NULL},
      {"INIT_QUEUED", "TIMEOUT", NULL},         {"INIT_QUEUED", "ABORT", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  kit_begin("comm.init_failures");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_INIT_FAIL, "fail", -1);
  kit_fault(&f);
  f = kit_fault_of(NCFSM_FAULT_INIT_HANG, "hang", -1);
  kit_fault(&f);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm *c[6];
  ncfsm_comm_opts o = copts("fail");
  clique(loop, 1, &o, &c[0], false);
  ncfsm_work *w = op(c[0], 0);
  want_work(w, NCFSM_WORK_FAILED, NCFSM_ERR_ASYNC, -1);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_INIT_FAILED);
  want_text(c[0], true, "ncclSystemError");
  defect(c[0]);
  assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
  o = copts("hang");
  o.timeout_ms = FAST_MS;
  o.on_error = NCFSM_ON_ERROR_ABORT;
  clique(loop, 1, &o, &c[1], false);
  want_state(c[1], NCFSM_STATE_CLOSED);
  want_text(c[1], true, "watchdog: state INIT_IN_PROGRESS did not end within 30 ms");
  o = copts("hang");
  for (int k = 2; k < 4; k++) {
    clique(loop, 1, &o, &c[k], false);
    until_state(c[k], NCFSM_STATE_INIT_IN_PROGRESS);
  }
  assert_int_equal(ncfsm_comm_abort(c[2]), NCFSM_OK);
  defect(c[3]);
  o = copts("queued");
  o.timeout_ms = 1;
  clique(loop, 1, &o, &c[4], false);
  pass_ms(5);
  run_turns(loop, 1); /* the watchdog runs before the control step that issues the init */
  assert_int_equal(ncfsm_comm_state(c[4]), NCFSM_STATE_INIT_FAILED);
  want_text(c[4], true, "state INIT_QUEUED did not end");
  o = copts("queued");
  clique(loop, 1, &o, &c[5], false);
  ncfsm_work *q = op(c[5], 1);
  assert_int_equal(ncfsm_comm_abort(c[5]), NCFSM_OK);
  want_work(q, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED, -1);
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(q), NCFSM_OK);
  world_down(loop, c, 6, NULL, 0);
  kit_end();
  rows_expect_end(&e);
}

/* One comm over member `rank` of a new bootstrap group of 2 (the other member
 * opened only when peer). */
static ncfsm_comm *boot_comm(ncfsm_loop *loop, const ncfsm_comm_opts *o, int rank, ncfsm_boot **mine,
                             ncfsm_boot **peer) {
  char group[96];
  snprintf(group, sizeof group, "%s", boot_group("fail"));
  *mine = boot_open(loop, group, rank, 2, 0);
  if (peer) *peer = boot_open(loop, group, !rank, 2, 0);
  ncfsm_comm *c;
  assert_int_equal(ncfsm_comm_new(loop, o, &c), NCFSM_OK);
  return c;
}

/* ID_QUEUED: a bootstrap that refuses the broadcast (out of step: a request
 * of it was freed unfinished), a deadline passed before the loop's turn, an
 * abort, a defect. ID_EXCHANGE (rank 1 waits for the root): the root's
 * bootstrap closes, the deadline, an abort, a defect. */
void test_boot_failures(void **state) {
  (void)state;
  static const char *const R[][3] = {{"ID_QUEUED", "ASYNC_ERROR", NULL}, {"ID_QUEUED", "TIMEOUT", NULL},
                                     {"ID_QUEUED", "ABORT", NULL},       {"ID_QUEUED", "INVALID", NULL},
                                     {"ID_EXCHANGE", "ASYNC_ERROR", NULL}, {"ID_EXCHANGE", "TIMEOUT", NULL},
                                     {"ID_EXCHANGE", "ABORT", NULL},     {"ID_EXCHANGE", "INVALID", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm *c[8];
  ncfsm_boot *b[16] = {0};
  ncfsm_comm_opts o = copts("idq");
  /* a bootstrap out of step */
  c[0] = boot_comm(loop, &o, 0, &b[0], &b[1]);
  int32_t x = 1, all[2];
  ncfsm_boot_req *req = NULL;
  assert_int_equal(ncfsm_boot_allgather_post(b[0], &x, all, sizeof x, &req), NCFSM_OK);
  ncfsm_boot_req_free(req);
  assert_int_equal(ncfsm_comm_init_boot(c[0], b[0]), NCFSM_OK);
  want_state(c[0], NCFSM_STATE_INIT_FAILED);
  want_text(c[0], true, "the bootstrap refused the unique id exchange");
  want_text(c[0], true, "NCFSM_ERR_BOOTSTRAP");
  o.timeout_ms = 1;
  c[1] = boot_comm(loop, &o, 0, &b[2], NULL);
  assert_int_equal(ncfsm_comm_init_boot(c[1], b[2]), NCFSM_OK);
  pass_ms(5);
  run_turns(loop, 1);
  assert_int_equal(ncfsm_comm_state(c[1]), NCFSM_STATE_INIT_FAILED);
  want_text(c[1], true, "state ID_QUEUED did not end");
  o.timeout_ms = 0;
  for (int k = 2; k < 4; k++) {
    c[k] = boot_comm(loop, &o, 0, &b[k + 1], NULL);
    assert_int_equal(ncfsm_comm_init_boot(c[k], b[k + 1]), NCFSM_OK);
  }
  assert_int_equal(ncfsm_comm_abort(c[2]), NCFSM_OK);
  defect(c[3]);
  /* ID_EXCHANGE: rank 1, the root never posts */
  o = copts("idx");
  for (int k = 4; k < 8; k++) {
    if (k == 5) o.timeout_ms = FAST_MS;
    c[k] = boot_comm(loop, &o, 1, &b[2 * k], k == 4 ? &b[2 * k + 1] : NULL);
    o.timeout_ms = 0;
    assert_int_equal(ncfsm_comm_init_boot(c[k], b[2 * k]), NCFSM_OK);
    until_state(c[k], NCFSM_STATE_ID_EXCHANGE);
  }
  assert_int_equal(ncfsm_boot_close(b[9]), NCFSM_OK); /* rank 0 of c[4]'s group goes before posting */
  b[9] = NULL;
  want_state(c[4], NCFSM_STATE_INIT_FAILED);
  want_text(c[4], true, "unique id exchange through the bootstrap (NCFSM_ERR_BOOTSTRAP)");
  want_state(c[5], NCFSM_STATE_INIT_FAILED);
  want_text(c[5], true, "state ID_EXCHANGE did not end");
  assert_int_equal(ncfsm_comm_abort(c[6]), NCFSM_OK);
  defect(c[7]);
  world_down(loop, c, 8, b, 16);
  rows_expect_end(&e);
}

/* INIT_QUEUED -ASYNC_ERROR-> INIT_FAILED: the comm's bootstrap reports a lost
 * rank (ncfsm_comm_set_recovery) before the loop issued the init. */
void test_init_queued_lost(void **state) {
  (void)state;
  static const char *const R[][3] = {{"INIT_QUEUED", "ASYNC_ERROR", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm_opts o = copts("lost");
  ncfsm_comm *c[1];
  clique(loop, 1, &o, c, false);
  ncfsm_boot *b[1] = {arm_lost(loop, c[0])};
  lost_dispatch(loop);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_INIT_FAILED);
  want_text(c[0], true, "rank 1 lost (bootstrap:");
  assert_false(has_backend_comm(c[0])); /* NCCL never saw it */
  world_down(loop, c, 1, b, 1);
  rows_expect_end(&e);
}

/* A pair of READY parents and a NEW child for each (named "child"). */
static ncfsm_loop *parents(ncfsm_comm **p, ncfsm_comm **k, const ncfsm_comm_opts *po, const ncfsm_comm_opts *ko) {
  ncfsm_loop *loop = ready(2, po, p);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_new(loop, ko, &k[r]), NCFSM_OK);
  return loop;
}

/* READY -SPLIT-> SPLITTING, NEW -INIT_CHILD-> CHILD_QUEUED, groups around ops
 * of the parents (SPLITTING) and of the children (CHILD_QUEUED), SPLIT_DONE
 * into READY and, with a group open, into GROUP_OPEN; HANDED (R8). */
void test_split_children(void **state) {
  (void)state;
  static const char *const R[][3] = {
      {"READY", "SPLIT", NULL},          {"NEW", "INIT_CHILD", NULL},       {"SPLITTING", "ENLIST", NULL},
      {"SPLITTING", "GROUP_CLOSE", NULL}, {"CHILD_QUEUED", "ENLIST", NULL},  {"CHILD_QUEUED", "GROUP_CLOSE", NULL},
      {"SPLITTING", "SPLIT_DONE", NULL}, {"SPLITTING", "SPLIT_DONE", "GROUP_OPS"}, {"CHILD_QUEUED", "HANDED", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_sim_opts so;
  ncfsm_comm_opts po;
  opts_init(&po, &so, "parent");
  so.split_polls = 4;
  ncfsm_comm_opts ko = copts("child");
  ncfsm_comm *p[2], *k[2];
  ncfsm_loop *loop = parents(p, k, &po, &ko);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_comm_split(p[r], 0, r, k[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_state(k[r]), NCFSM_STATE_CHILD_QUEUED);
  }
  ncfsm_work *w[4];
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  w[0] = op(p[0], 0);
  w[2] = op(k[0], 2);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  w[1] = op(p[1], 1);
  w[3] = op(k[1], 3);
  until_state(p[1], NCFSM_STATE_GROUP_OPEN); /* its split is final while its op waits in the group */
  until_state(p[0], NCFSM_STATE_READY);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  for (int i = 0; i < 4; i++) want_work(w[i], NCFSM_WORK_COMPLETED, NCFSM_OK, -1);
  assert_int_equal(g_buf[1][0], 3); /* the parents: 1 + 2 */
  assert_int_equal(g_buf[3][0], 7); /* the children: 3 + 4 */
  assert_int_equal(ncfsm_comm_size(k[0]), 2);
  for (int i = 0; i < 4; i++) assert_int_equal(ncfsm_work_release(w[i]), NCFSM_OK);
  ncfsm_comm *all[4] = {k[0], k[1], p[0], p[1]};
  world_down(loop, all, 4, NULL, 0);
  rows_expect_end(&e);
}

/* A split only rank 0 calls: its parent SPLITTING and its child CHILD_QUEUED
 * for good. The child times out (then its parent is aborted: the INIT_FAILED
 * child hears of it), the parent times out (its child fails: the parent
 * "failed before its split/shrink/grow was final"), the child is aborted,
 * or aborted and released, before its parent fails; defects in both states;
 * and a child whose own timeout put it in ABORT_QUEUED in the pass where its
 * parent timed out. */
void test_orphans(void **state) {
  (void)state;
  static const char *const R[][3] = {
      {"CHILD_QUEUED", "TIMEOUT", NULL}, {"SPLITTING", "ABORT", NULL},     {"INIT_FAILED", "ASYNC_ERROR", NULL},
      {"SPLITTING", "TIMEOUT", NULL},    {"CHILD_QUEUED", "ASYNC_ERROR", NULL}, {"CHILD_QUEUED", "ABORT", NULL},
      {"CLOSED", "ASYNC_ERROR", NULL},   {"RELEASED", "ASYNC_ERROR", NULL}, {"CHILD_QUEUED", "INVALID", NULL},
      {"SPLITTING", "INVALID", NULL},    {"ABORT_QUEUED", "ASYNC_ERROR", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  for (int how = 0; how < 6; how++) {
    ncfsm_comm_opts po = copts("parent"), ko = copts("child");
    if (how == 0) ko.timeout_ms = FAST_MS;
    if (how == 1) po.timeout_ms = FAST_MS;
    if (how == 5) po.timeout_ms = ko.timeout_ms = 1, ko.on_error = NCFSM_ON_ERROR_ABORT;
    ncfsm_comm *p[2], *k[2];
    ncfsm_loop *loop = parents(p, k, &po, &ko);
    assert_int_equal(ncfsm_comm_split(p[0], 0, 0, k[0]), NCFSM_OK);
    switch (how) {
      case 0:
        want_state(k[0], NCFSM_STATE_INIT_FAILED);
        want_text(k[0], true, "state CHILD_QUEUED did not end");
        assert_int_equal(ncfsm_comm_abort(p[0]), NCFSM_OK);
        want_text(k[0], false, "(it was aborted)"); /* noted; the state stays */
        break;
      case 1:
        want_state(k[0], NCFSM_STATE_INIT_FAILED);
        want_text(k[0], true, "the parent parent (rank 0) failed before its split/shrink/grow was final (NCFSM_ERR_TIMEOUT)");
        assert_int_equal(ncfsm_comm_state(p[0]), NCFSM_STATE_ERROR);
        break;
      case 2:
      case 3:
        assert_int_equal(ncfsm_comm_abort(k[0]), NCFSM_OK);
        if (how == 3) {
          assert_int_equal(ncfsm_comm_release(k[0]), NCFSM_OK); /* the parent still holds it */
          k[0] = NULL;
        } else {
          assert_int_equal(ncfsm_comm_state(k[0]), NCFSM_STATE_CLOSED);
        }
        assert_int_equal(ncfsm_comm_abort(p[0]), NCFSM_OK);
        if (k[0]) want_text(k[0], false, "the communicator is in state CLOSED already: call ncfsm_comm_release");
        break;
      case 4:
        defect(k[0]);
        defect(p[0]); /* ERROR: its child, INIT_FAILED, hears of it */
        want_text(k[0], false, "(engine defect)");
        break;
      default:
        pass_ms(10);
        run_turns(loop, 1); /* one pass: the child's deadline, then its parent's */
        assert_int_equal(ncfsm_comm_state(k[0]), NCFSM_STATE_CLOSED); /* aborted by the same turn */
        want_text(k[0], true, "state CHILD_QUEUED did not end");
        assert_int_equal(ncfsm_comm_state(p[0]), NCFSM_STATE_ERROR);
        break;
    }
    ncfsm_comm *all[4] = {k[0], k[1], p[0], p[1]};
    world_down(loop, all, 4, NULL, 0);
  }
  rows_expect_end(&e);
}
