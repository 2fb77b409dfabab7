/*
 * The comm machine's row test (test_rows_comm): the scenarios of its
 * files (rows_comm_init.c: from NEW to READY; rows_comm_run.c: launches,
 * groups, finalize; rows_comm_xcomm.c: split, shrink, revoke, the error
 * policies; rows_comm_strict.c: MISMATCH in each state that has it;
 * test_rows_comm.c: the engine-defect path, forks, the allow-list) and what
 * they share.
 */
#ifndef NCFSM_TESTS_ROWS_COMM_H
#define NCFSM_TESTS_ROWS_COMM_H

#include "fsm/engine.h"
#include "rows_world.h"

#define FAST_MS 30 /* a watchdog for a phase that never ends */

/* Rows of the comm machine a scenario walks (rows_expect with machine "comm"). */
#define EXPECT(e, rows) rows_expect_begin((e), "comm", (rows), ROWS_N(rows))

/* Options of a comm named name (error policy STAY, watchdog off, one poll per phase). */
ncfsm_comm_opts copts(const char *name);
/* n READY ranks of one clique on a new loop. */
ncfsm_loop *ready(int n, const ncfsm_comm_opts *o, ncfsm_comm **c);
/* One more clique of n ranks on loop, READY (wait false: only initialised). */
void clique(ncfsm_loop *loop, int n, const ncfsm_comm_opts *o, ncfsm_comm **c, bool wait);
/* An AllReduce of 8 int32 on c from/to buf (rank r's row), with a work. */
ncfsm_work *op(ncfsm_comm *c, int r);
/* Runs until the comm is in state s (any state, transient or not, reached by turns). */
void until_state(ncfsm_comm *c, ncfsm_state_t s);
/* Runs until the work is in state st. */
void until_work(ncfsm_comm *c, ncfsm_work *w, ncfsm_work_state_t st);
/* The calling thread sleeps ms: a watchdog deadline of ms - 1 or less has passed. */
void pass_ms(int ms);
/* Arms c (ncfsm_comm_set_recovery) on a bootstrap of its own: ncfsm_comm_recover then fails it. */
ncfsm_boot *arm(ncfsm_loop *loop, ncfsm_comm *c);
/* Arms c on a bootstrap of 2 members whose other member closed: dispatching the loop's base
 * (lost_dispatch) reports the lost rank, which fails c where it is in service. */
ncfsm_boot *arm_lost(ncfsm_loop *loop, ncfsm_comm *c);
void lost_dispatch(ncfsm_loop *loop);
/* The engine-defect path on c (an event its state has no row for): release builds take the
 * wrapper's path; debug builds, whose wrapper asserts first, fire INVALID as it would. Checks
 * the row's next state (c's policy must be STAY) and the message. */
void defect(ncfsm_comm *c);

extern int32_t g_buf[8][8];

/* ---- the scenarios ---- */
void test_new_and_init(void **state);
void test_init_boot(void **state);
void test_init_failures(void **state);
void test_boot_failures(void **state);
void test_init_queued_lost(void **state);
void test_split_children(void **state);
void test_orphans(void **state);
void test_launches(void **state);
void test_launch_in_progress(void **state);
void test_draining(void **state);
void test_finalizing(void **state);
void test_finalized(void **state);
void test_ready_failures(void **state);
void test_group_open_failures(void **state);
void test_shrink(void **state);
void test_shrinking_stuck(void **state);
void test_revoke(void **state);
void test_revoking_stuck(void **state);
void test_policies(void **state);
void test_recover_policy(void **state);
void test_abort_queued(void **state);
void test_mismatch_ready_and_group(void **state);
void test_mismatch_launching(void **state);
void test_mismatch_draining(void **state);
void test_mismatch_splitting(void **state);
void test_draining_verify_failures(void **state);

#endif
