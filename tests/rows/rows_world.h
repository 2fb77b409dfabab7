/*
 * What the scenarios of tests/rows share: a testing-kit test per scenario
 * (faults, sim options), communicators on one loop (by unique id or over
 * in-process bootstraps), waits bounded by generous limits, and the
 * teardown. Every wait here ends on a state, never on a time: the limits
 * only stop a broken scenario.
 */
#ifndef NCFSM_TESTS_ROWS_WORLD_H
#define NCFSM_TESTS_ROWS_WORLD_H

#include "helpers.h"
#include "ncfsm/bootstrap.h"
#include "ncfsm/testing.h"
#include "rows.h"

#define LIMIT_MS 10000 /* the bound of every wait: a scenario that needs it is broken */

/* ---- the kit test of the scenario ----------------------------------------------------- */
ncfsm_test *kit_begin(const char *name);
/* Ends it: no check of the kit may have failed. */
void kit_end(void);
/* cmocka teardown: ends a kit test left active by a failed scenario. */
int kit_teardown(void **state);
/* A fault of `kind` for comm `name` (NULL: all), rank (-1: all); added by kit_fault. */
ncfsm_fault kit_fault_of(ncfsm_fault_kind_t kind, const char *name, int rank);
int kit_fault(ncfsm_fault *f);

/* ---- options and communicators --------------------------------------------------------- */
/* The sim with one poll per phase, comm `name`, watchdog off, error policy STAY, verification off.
 * so must outlive the comms made with o (ncfsm_comm_new copies it). */
void opts_init(ncfsm_comm_opts *o, ncfsm_sim_opts *so, const char *name);
ncfsm_loop *loop_new(void);
/* n ranks of one clique on loop, initialised with ncfsm_comm_init (rank r from o[r], or o[0] when
 * o[r] is NULL). */
void comms_init(ncfsm_loop *loop, int n, const ncfsm_comm_opts *const *o, ncfsm_comm **c);
/* A member of the in-process bootstrap group `group` (made unique per call of boot_group). */
ncfsm_boot *boot_open(ncfsm_loop *loop, const char *group, int rank, int size, uint64_t timeout_ms);
const char *boot_group(const char *what);
/* n ranks over n members of a new bootstrap group on loop (ncfsm_comm_init_boot). */
void comms_boot(ncfsm_loop *loop, int n, const ncfsm_comm_opts *const *o, ncfsm_comm **c, ncfsm_boot **b,
                uint64_t boot_timeout_ms);

/* ---- waits ------------------------------------------------------------------------------ */
/* The comm reaches state s (fails with the comm's message otherwise). */
void want_state(ncfsm_comm *c, ncfsm_state_t s);
/* The loop runs until the work is final; returns its status. */
ncfsm_result_t work_final(ncfsm_work *w);
/* The work is final in state st with status, its callback ran once with that status
 * (cb_count/cb_status of helpers.h at index i, -1: no callback to check). */
void want_work(ncfsm_work *w, ncfsm_work_state_t st, ncfsm_result_t status, int i);
/* The comm's last error (or failure, when failure is set) contains text. */
void want_text(ncfsm_comm *c, bool failure, const char *text);
/* Turns the loop until pred(arg) holds. */
void run_until(ncfsm_loop *loop, bool (*pred)(void *), void *arg, const char *what);
/* Turns the loop until get(arg) returns want (a state read under the loop's lock, say). */
void run_until_is(ncfsm_loop *loop, unsigned (*get)(void *), void *arg, unsigned want, const char *what);

/* ---- teardown ---------------------------------------------------------------------------- */
/* Abort what is not closed, release every comm (NULL entries skipped), close the boots, close the loop
 * (without a turn in between). */
void world_down(ncfsm_loop *loop, ncfsm_comm **c, int n, ncfsm_boot **b, int nb);

#endif
