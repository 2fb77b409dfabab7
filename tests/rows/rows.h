/*
 * Row coverage of the engine's machines (fsm/machine.h): every test of
 * tests/rows drives one machine through the public API on the sim, scenario
 * by scenario, and ends by asserting that every row of that machine fired
 * at least once. A row that did not is printed as
 *
 *   work: row 11: LAUNCHING --TIME_OUT [ANY]--> TIMED_OUT / finish (R10)
 *
 * so the failure names what is not walked. Rows that no real path reaches
 * are named in the test's allow-list (rows_allow, with the reason): such a
 * row that fires after all fails the check too (the entry is stale), and an
 * entry that names no row of the machine fails it. Rows a scenario walks
 * whose behaviour differs from their description are listed the same way
 * (walked true), so that the check prints them.
 *
 * Also here: fork() with the child's row counts added to the parent's (a
 * scenario that ends its process: the exit policy, a forked child's use of
 * its parent's comms), and calloc failures on demand (the engine's
 * out-of-memory rows; tests link with -Wl,--wrap=calloc and --wrap=aligned_alloc).
 */
#ifndef NCFSM_TESTS_ROWS_H
#define NCFSM_TESTS_ROWS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "fsm/machine.h"

/* A row of a machine by its state, event and guard names, with the reason
 * it is listed: a dead row (walked false: no real path reaches it, so it
 * must not fire), or a defect (walked true: a scenario walks it, but what
 * it does differs from its description; it must fire). */
typedef struct rows_allow {
  const char *state, *event, *guard;
  const char *why; /* printed when the check runs */
  bool walked;
} rows_allow;

/* cmocka group setup: start counting (every machine's counts zeroed). */
int rows_setup(void **state);
const ncfsm__machine *rows_machine(const char *name);
/* The row's index, or -1 when the machine has no such row. */
int rows_find(const ncfsm__machine *m, const char *state, const char *event, const char *guard);
/* How often the row fired so far; fails the test when there is no such row. */
unsigned rows_hits(const char *machine, const char *state, const char *event, const char *guard);
/* Asserts that the row fired since `before` (a rows_hits value taken earlier). */
#define ROW_FIRED(machine, state, event, guard, before)                                                          \
  do {                                                                                                           \
    unsigned now_ = rows_hits(machine, state, event, guard);                                                     \
    if (now_ <= (before))                                                                                        \
      fail_msg("%s: row %s --%s [%s]--> did not fire in this scenario", machine, state, event, guard);           \
  } while (0)
/* The rows a scenario promises to walk: their counts are taken by
 * rows_expect_begin, and rows_expect_end fails naming each one that did not
 * fire since. Rows are {state, event, guard}; guard NULL: ANY. */
typedef struct rows_expect {
  const ncfsm__machine *m;
  int n;
  int idx[48];
  unsigned before[48];
} rows_expect;
void rows_expect_begin(rows_expect *e, const char *machine, const char *const (*rows)[3], int n);
void rows_expect_end(const rows_expect *e);
#define ROWS_N(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* The check that ends a test: every row of the machine fired, except the
 * dead rows of allow, which must not have. */
void rows_check_all(const char *machine, const rows_allow *allow, size_t nallow);

/* fork() for a scenario that ends its process. In the child (0 returned),
 * the row counts go to the parent when the child exits (exit(), or
 * rows_child_exit); rows_wait_child adds them to the parent's and returns
 * the child's wait status. */
pid_t rows_fork(void);
void rows_child_exit(int code);
int rows_wait_child(pid_t pid);

/* calloc failures: the next `count` calloc(nmemb, size) calls with these
 * arguments, from code linked into the test (the engine and the sim), return
 * NULL (with nmemb 1, so do aligned_alloc calls of size rounded up: a comm and
 * a loop come from ncfsm__calloc_line); rows_calloc_failed says how many did
 * since the last arming. */
void rows_fail_calloc(size_t nmemb, size_t size, unsigned count);
unsigned rows_calloc_failed(void);

#endif
