/*
 * Every row of fsm/comm.def walked (tests/rows/rows.h, rows_comm.h): the
 * communicator through the public API on the sim, from NEW to RELEASED, in
 * every state a call, a poll, the watchdog, the verification, a recovery's
 * hooks or a parent can reach it in. The scenarios are in rows_comm_*.c;
 * here are the ones that end a process (the exit policy; a forked child
 * destroying its parent's comm, which the sim refuses: CLOSE_FAILED, the
 * child's row counts added to this process's), and the check.
 *
 * The INVALID rows (an event the table has no row for: an engine defect)
 * are walked through the engine's own defect path (rows_comm.c defect()),
 * in every state but CLOSING.
 */
#include <string.h>
#include <sys/wait.h>

#include "rows_comm.h"

/* In a child process: a comm with policy EXIT fails (k 0: its init, INIT_FAILED;
 * k 1: its first launch, ERROR); the engine exits the process with status 3. */
static void exit_child(int k) {
  ncfsm_test *t = NULL;
  ncfsm_test_opts to;
  ncfsm_test_opts_init(&to);
  to.name = "comm.exit";
  if (ncfsm_test_begin(&to, &t) != NCFSM_OK) rows_child_exit(10);
  ncfsm_fault f;
  ncfsm_fault_init(&f, k ? NCFSM_FAULT_ASYNC_ERROR : NCFSM_FAULT_INIT_FAIL);
  f.comm = "exits";
  if (ncfsm_test_add_fault(t, &f) < 0) rows_child_exit(11);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  opts_init(&o, &so, "exits");
  so.group_end_inprogress = 0;
  o.on_error = NCFSM_ON_ERROR_EXIT;
  ncfsm_loop *loop = NULL;
  ncfsm_comm *c = NULL;
  ncfsm_unique_id id;
  if (ncfsm_loop_new(NULL, &loop) != NCFSM_OK || ncfsm_comm_new(loop, &o, &c) != NCFSM_OK ||
      ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id) != NCFSM_OK || ncfsm_comm_init(c, 1, 0, &id) != NCFSM_OK)
    rows_child_exit(12);
  if (k && ncfsm_comm_wait_state(c, NCFSM_STATE_READY, LIMIT_MS) != NCFSM_OK) rows_child_exit(13);
  if (k) {
    int32_t buf[8] = {0};
    if (ncfsm_allreduce(c, buf, buf, 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL) != NCFSM_OK)
      rows_child_exit(14);
  }
  ncfsm_comm_wait_state(c, NCFSM_STATE_CLOSED, LIMIT_MS); /* the policy exits before */
  rows_child_exit(15);
}

/* INIT_FAILED -POLICY [POLICY_EXIT]-> and ERROR -POLICY [POLICY_EXIT]->: exit(3) after the dump. */
static void test_policy_exit(void **state) {
  (void)state;
  static const char *const R[][3] = {{"INIT_FAILED", "POLICY", "POLICY_EXIT"}, {"ERROR", "POLICY", "POLICY_EXIT"},
                                     {"READY", "ASYNC_ERROR", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  for (int k = 0; k < 2; k++) {
    pid_t pid = rows_fork();
    if (pid == 0) exit_child(k);
    int st = rows_wait_child(pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 3);
  }
  rows_expect_end(&e);
}

/* CLOSING -CLOSE_FAILED-> ERROR: a forked child destroys its parent's comm;
 * the sim (as NCCL would) refuses a communicator of another process, so
 * ncclCommDestroy fails and the comm is still there: ERROR, then abort (the
 * one call allowed, freeing the child's copy). The parent's comm goes on. */
static void test_close_failed(void **state) {
  (void)state;
  static const char *const R[][3] = {{"CLOSING", "CLOSE_FAILED", NULL}};
  rows_expect e;
  EXPECT(&e, R);
  ncfsm_comm_opts o = copts("forked");
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready(1, &o, c);
  pid_t pid = rows_fork();
  if (pid == 0) {
    int ok = ncfsm_comm_destroy(c[0]) == NCFSM_ERR_BACKEND && ncfsm_comm_state(c[0]) == NCFSM_STATE_ERROR &&
             strstr(ncfsm_comm_failure(c[0]), "ncclCommDestroy in state CLOSING") != NULL;
    ok = ok && ncfsm_comm_abort(c[0]) == NCFSM_OK && ncfsm_comm_state(c[0]) == NCFSM_STATE_CLOSED;
    rows_child_exit(ok ? 0 : 1); /* the loop's base is shared with the parent: not touched here */
  }
  int st = rows_wait_child(pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_READY);
  ncfsm_work *w = op(c[0], 0);
  want_work(w, NCFSM_WORK_COMPLETED, NCFSM_OK, -1);
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  world_down(loop, c, 1, NULL, 0);
  rows_expect_end(&e);
}

static void test_every_row_walked(void **state) {
  (void)state;
#define LATE_ASYNC                                                                                                     \
  "no path fails a comm in this state: polls, launches and the verification need POLL or WORKS, a lost rank LIVE, "     \
  "ncfsm_comm_recover WORKS or POLL, and a parent's failure reaches only a child waiting for its handle"
  static const rows_allow dead[] = {
      /* dead rows: the late rows (NCFSM__LATE_ROWS) of states no failure reaches */
      {"NEW", "ASYNC_ERROR", "ANY", LATE_ASYNC, false},
      {"SHRUNK", "ASYNC_ERROR", "ANY", LATE_ASYNC, false},
      {"REVOKED", "ASYNC_ERROR", "ANY", LATE_ASYNC, false},
      {"ERROR", "ASYNC_ERROR", "ANY", LATE_ASYNC, false},
      /* dead rows for a test: CLOSING lasts only inside a blocking ncclCommDestroy / ncclCommAbort
       * with the loop's lock released (the sim's return at once); only another thread's
       * ncfsm_comm_recover of the parent of a child being aborted, in that window, fails it (a race) */
      {"CLOSING", "ASYNC_ERROR", "ANY",
       "only inside the unlocked ncclCommAbort of an orphaned child, by another thread failing its parent: a race",
       false},
      {"CLOSING", "INVALID", "ANY", "CLOSING lasts only inside a blocking close with the lock released", false},
  };
#undef LATE_ASYNC
  rows_check_all("comm", dead, sizeof dead / sizeof dead[0]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_new_and_init, kit_teardown),
      cmocka_unit_test_teardown(test_init_boot, kit_teardown),
      cmocka_unit_test_teardown(test_init_failures, kit_teardown),
      cmocka_unit_test_teardown(test_boot_failures, kit_teardown),
      cmocka_unit_test_teardown(test_init_queued_lost, kit_teardown),
      cmocka_unit_test_teardown(test_split_children, kit_teardown),
      cmocka_unit_test_teardown(test_orphans, kit_teardown),
      cmocka_unit_test_teardown(test_launches, kit_teardown),
      cmocka_unit_test_teardown(test_launch_in_progress, kit_teardown),
      cmocka_unit_test_teardown(test_draining, kit_teardown),
      cmocka_unit_test_teardown(test_finalizing, kit_teardown),
      cmocka_unit_test_teardown(test_finalized, kit_teardown),
      cmocka_unit_test_teardown(test_ready_failures, kit_teardown),
      cmocka_unit_test_teardown(test_group_open_failures, kit_teardown),
      cmocka_unit_test_teardown(test_shrink, kit_teardown),
      cmocka_unit_test_teardown(test_shrinking_stuck, kit_teardown),
      cmocka_unit_test_teardown(test_revoke, kit_teardown),
      cmocka_unit_test_teardown(test_revoking_stuck, kit_teardown),
      cmocka_unit_test_teardown(test_policies, kit_teardown),
      cmocka_unit_test_teardown(test_recover_policy, kit_teardown),
      cmocka_unit_test_teardown(test_abort_queued, kit_teardown),
      cmocka_unit_test_teardown(test_mismatch_ready_and_group, kit_teardown),
      cmocka_unit_test_teardown(test_mismatch_launching, kit_teardown),
      cmocka_unit_test_teardown(test_mismatch_draining, kit_teardown),
      cmocka_unit_test_teardown(test_mismatch_splitting, kit_teardown),
      cmocka_unit_test_teardown(test_draining_verify_failures, kit_teardown),
      cmocka_unit_test_teardown(test_policy_exit, kit_teardown),
      cmocka_unit_test_teardown(test_close_failed, kit_teardown),
      cmocka_unit_test(test_every_row_walked),
  };
  return cmocka_run_group_tests(tests, rows_setup, NULL);
}
