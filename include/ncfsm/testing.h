/*
 * ncfsm testing kit: unit tests of a program's state handling on the sim
 * backend, without GPUs (docs/testing.md).
 *
 *   - a fault plan: faults of the sim (async error, a rank that never
 *     arrives or is dead, a slow rank, an init that fails or never ends, a
 *     mismatched collective, a process that dies) scripted per comm (by its
 *     opts.name) and rank, triggered at an op, at a polled state, after a
 *     number of polls or after some milliseconds;
 *   - a recorder of the engine's transitions (comms and works) as canonical
 *     text lines (no pointers, no times) and checks on it;
 *   - a deterministic mode: everything the sim decides (the order in which
 *     the ops of one step run, the poll counts of every phase) follows one
 *     seed, printed with every failed check ("ncfsm testing: seed S
 *     (replay: NCFSM_TEST_SEED=S)"); NCFSM_TEST_SEED=S replays it.
 *
 * Plain C, no test framework: checks return 0 when they hold and -1 when
 * not, count the failure, keep its message (ncfsm_test_last_failure) and
 * print it with the seed on stderr (unless opts.quiet). Use them from
 * cmocka, Unity, Check or plain main() alike.
 *
 * One test (ncfsm_test_begin .. ncfsm_test_end) is active per process at a
 * time: the sim's fault registry is process-wide. Faults and sim options
 * apply to sim communicators created (ncfsm_comm_init*, split, shrink, grow
 * children) while the test is active, after they were added; comms made
 * before keep what they had. After ncfsm_test_end no fault fires any more
 * (the options a comm got stay). Communicators of the nccl backend are not
 * affected. The calls below are thread-safe; the recorder's trace callback
 * runs on each recorded loop's thread.
 */
#ifndef NCFSM_TESTING_H
#define NCFSM_TESTING_H

#include <stddef.h>
#include <stdint.h>

#include "ncfsm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncfsm_test ncfsm_test;

/* ---- a test ----------------------------------------------------------------------- */
typedef struct ncfsm_test_opts {
  const char *name;  /* shown in failure messages (default "test") */
  uint64_t seed;     /* the seed (default 1; 0: a fresh one from the clock). NCFSM_TEST_SEED=S
                        in the environment replaces it (S decimal or 0x hex; "random": fresh) */
  int deterministic; /* 1 (default): the sim's choices follow the seed (below); 0: the sim
                        keeps its options (ncfsm_sim_opts, NCFSM_SIM_*) */
  int poll_jitter;   /* deterministic: every phase of a nonblocking sim comm (init, launch,
                        finalize, revoke, split) takes 0..poll_jitter polls more than its
                        ncfsm_sim_opts count, drawn from the seed (default 3; 0: none) */
  int quiet;         /* 1: failed checks are not printed to stderr (default 0) */
} ncfsm_test_opts;

void ncfsm_test_opts_init(ncfsm_test_opts *o);

/* Start a test: installs the fault registry and the deterministic mode in
 * the sim. NCFSM_ERR_BUSY when another test is active in this process,
 * NCFSM_ERR_INVALID_ARGUMENT for a bad NCFSM_TEST_SEED (named in the message
 * printed on stderr). opts NULL: defaults. */
ncfsm_result_t ncfsm_test_begin(const ncfsm_test_opts *opts, ncfsm_test **out);
/* End it: the sim forgets the plan (comms made under it keep their faults
 * until they are closed), the recorder is freed. Detach recorded loops that
 * outlive the test first (ncfsm_test_unrecord). Returns the number of
 * failed checks (0: the test passed). */
int ncfsm_test_end(ncfsm_test *t);

/* The seed in use (after NCFSM_TEST_SEED). */
uint64_t ncfsm_test_seed(const ncfsm_test *t);
/* Failed checks so far, and the last one's message ("" when none): valid
 * until the next check of this test. */
int ncfsm_test_failures(const ncfsm_test *t);
const char *ncfsm_test_last_failure(const ncfsm_test *t);

/* ---- the fault plan --------------------------------------------------------------- */
typedef enum ncfsm_fault_kind {
  NCFSM_FAULT_ASYNC_ERROR = 0, /* the comm's async state becomes `code` (an ncclResult_t; 0: 6,
                                  ncclRemoteError). AT_OP: op `at` never completes (the sim's
                                  async_error_at_op). AT_STATE: the at-th phase of that state ends
                                  with the error (INIT_IN_PROGRESS: the init fails, as fail_init;
                                  LAUNCH_IN_PROGRESS: the first op of that launch is hit as with
                                  AT_OP). AT_POLL / AT_MS: set at that poll (a launch or finalize
                                  in progress ends with it at once; an init, revoke or split
                                  at its end) */
  NCFSM_FAULT_INIT_FAIL,       /* the init ends with `code` (0: 2, ncclSystemError); trigger ignored */
  NCFSM_FAULT_INIT_HANG,       /* the init never ends (InProgress for ever: the watchdog's init
                                  timeout); trigger ignored; nonblocking comms only */
  NCFSM_FAULT_SLOW,            /* a slow rank: `polls` more polls per phase, for `phases` phases
                                  from the trigger on (0: every one). AT_STATE: phases of that
                                  state; other triggers: launches. Nonblocking comms only */
  NCFSM_FAULT_NEVER_ARRIVE,    /* from the trigger on, peers never see this rank's ops (they hang,
                                  and so does its own stream): the sim's never_arrive */
  NCFSM_FAULT_DEAD,            /* from the trigger on, the rank is dead (the sim's `dead`): its ops
                                  and split/shrink/grow calls never reach its peers, no error
                                  anywhere */
  NCFSM_FAULT_MISMATCH,        /* the op NCCL sees differs from the one called (R11): `field`
                                  below; AT_OP: op `at`, other triggers: the first op posted after
                                  them. The engine's fingerprint (and NCFSM_VERIFY) is unchanged */
  NCFSM_FAULT_KILL,            /* the process kills itself (SIGKILL) when the trigger is reached
                                  (AT_OP: when it launches the group holding op `at`, before any op
                                  of it is visible): peers in other processes get ncclRemoteError.
                                  Only in a process of its own (fork): it ends the whole process */
  NCFSM_FAULT_KIND_COUNT
} ncfsm_fault_kind_t;

typedef enum ncfsm_fault_when {
  NCFSM_AT_OP = 0, /* the comm's op with index `at` (0-based, every op it launched, collectives
                      and send/recv alike: equal to the works' seq when there is no send/recv) */
  NCFSM_AT_STATE,  /* the at-th time (1-based; 0 = 1) the comm enters the polled state `state`:
                      INIT_IN_PROGRESS, LAUNCH_IN_PROGRESS (or DRAIN_LAUNCH_IN_PROGRESS),
                      FINALIZING, REVOKING, SPLITTING or SHRINKING (the parent's call) */
  NCFSM_AT_POLL,   /* the at-th poll (1-based) of the comm's async state. Replay-exact while
                      the comm is in a polled state; the engine watches a comm that only has
                      works in flight at most every 50 us, so those polls depend on time */
  NCFSM_AT_MS      /* the first poll at least `at` ms after the comm's creation (wall clock:
                      not replay-exact) */
} ncfsm_fault_when_t;

typedef enum ncfsm_mismatch_field {
  NCFSM_MISMATCH_COUNT = 0, /* count halved (a size mismatch: this rank completes without data
                               when it is the smallest, the others hang; send/recv: both hang) */
  NCFSM_MISMATCH_DTYPE,     /* a type of the same size (float32 <-> int32, float16 <-> bfloat16,
                               float64 <-> int64, int8 <-> uint8...): silent, every rank gets
                               rank 0's interpretation */
  NCFSM_MISMATCH_REDOP,     /* SUM <-> MAX, others -> SUM (reducing kinds): silent, rank 0's wins */
  NCFSM_MISMATCH_ROOT,      /* root + 1 (mod size) for rooted kinds */
  NCFSM_MISMATCH_OP         /* another kind: Broadcast from root 0 (a Broadcast becomes an
                               AllReduce SUM): only Broadcast roots complete */
} ncfsm_mismatch_field_t;

typedef struct ncfsm_fault {
  ncfsm_fault_kind_t kind;
  const char *comm;          /* the comm's opts.name (copied); NULL or "": every sim comm */
  int rank;                  /* -1: every rank of those comms (a whole clique) */
  ncfsm_fault_when_t when;
  uint64_t at;               /* op index, state occurrence, poll number or ms (see `when`) */
  ncfsm_state_t state;       /* AT_STATE */
  int code;                  /* ASYNC_ERROR, INIT_FAIL: the ncclResult_t */
  int polls;                 /* SLOW: polls added per phase (<0 or >= 1<<30: the phase never ends) */
  uint64_t phases;           /* SLOW: phases slowed after the trigger (0: all) */
  ncfsm_mismatch_field_t field; /* MISMATCH */
  uint64_t times;            /* most triggers in all, across the matching comms and the comms made
                                later (0: no limit): 1 fails only the first comm that reaches it,
                                so a program that recovers with a new comm sees it once */
} ncfsm_fault;

/* Defaults: every comm, every rank, AT_OP 0, code 0, polls 10, phases 0, times 0. */
void ncfsm_fault_init(ncfsm_fault *f, ncfsm_fault_kind_t kind);
/* Add a fault for comms created from now on. Returns its id (>= 0), or -1
 * for an invalid fault (the message names the field; counted as a failed
 * check). */
int ncfsm_test_add_fault(ncfsm_test *t, const ncfsm_fault *f);
/* How often fault `id` fired so far (in this process). */
uint64_t ncfsm_test_fault_fired(const ncfsm_test *t, int id);
/* Every sim option (ncfsm_sim_opts: poll counts, has_revoke, has_grow,
 * group_end_inprogress, ...) for the comms named `comm` (NULL: all) of rank
 * `rank` (-1: all) created from now on, in place of the options they pass;
 * the last matching call wins; faults still apply on top. NCFSM_OK, or
 * NCFSM_ERR_INVALID_ARGUMENT. */
ncfsm_result_t ncfsm_test_set_sim_opts(ncfsm_test *t, const char *comm, int rank,
                                       const ncfsm_sim_opts *so);

/* ---- the recorder ------------------------------------------------------------------
 * Every transition of the loop's comms and works becomes one line:
 *   comm: "<name> r<rank>: <FROM> -<EVENT>-> <TO> <RESULT>"
 *   work: "<name> r<rank> w<n> seq <seq|->: <FROM|-> -> <TO> <RESULT>"
 * <name> is the comm's opts.name ("comm" when empty), with ".<k>" added for
 * the k-th later comm of the same name and rank (a comm made again after a
 * recovery is "train.1"); w<n> numbers that comm's works from 0 in the order
 * they were submitted; states, events and results by their names
 * (ncfsm_state_name, ncfsm_event_name, ncfsm_work_state_name, ncfsm_err_name).
 * Two runs that make the same transitions give the same text, byte for
 * byte. */
/* Record the loop's transitions (ncfsm_loop_set_trace: it replaces the
 * loop's trace callback). Several loops may be recorded into one test. */
ncfsm_result_t ncfsm_test_record(ncfsm_test *t, ncfsm_loop *loop);
/* Stop recording the loop (call before ncfsm_test_end when the loop lives on). */
void ncfsm_test_unrecord(ncfsm_test *t, ncfsm_loop *loop);
size_t ncfsm_test_trace_len(const ncfsm_test *t);
/* Line i (no newline), NULL past the end; valid until the next clear or end. */
const char *ncfsm_test_trace_line(const ncfsm_test *t, size_t i);
/* Every line, each ended by '\n', in a malloc'ed string the caller frees (NULL: no memory). */
char *ncfsm_test_trace_text(const ncfsm_test *t);
/* Write the text to path. NCFSM_OK or NCFSM_ERR_SYSTEM. */
ncfsm_result_t ncfsm_test_trace_save(const ncfsm_test *t, const char *path);
void ncfsm_test_trace_clear(ncfsm_test *t);
/* The states one comm went through, space-separated: the state of its first
 * record, then each next state ("NEW INIT_IN_PROGRESS READY ..."), into buf
 * (truncated to len). Returns the number of states, -1 when no line names it. */
int ncfsm_test_comm_path(const ncfsm_test *t, const char *name, int rank, char *buf, size_t len);

/* ---- checks: 0 when it holds, -1 when not (counted, message kept and printed) ----- */
/* The patterns (fnmatch(3) globs on whole lines: '*' any text, '?' one
 * character, [...]) match lines of the trace in this order, other lines
 * allowed in between. */
int ncfsm_test_expect_lines(ncfsm_test *t, const char *const *patterns, size_t n);
/* Between min and max lines match pattern (max SIZE_MAX: no upper bound). */
int ncfsm_test_expect_count(ncfsm_test *t, const char *pattern, size_t min, size_t max);
/* The comm's path (ncfsm_test_comm_path) matches the glob pattern, e.g.
 * "NEW * READY * ERROR ABORT_QUEUED CLOSING CLOSED". */
int ncfsm_test_expect_path(ncfsm_test *t, const char *name, int rank, const char *pattern);
/* The work is in state st with final status `status` (ncfsm_work_status). */
int ncfsm_test_expect_work(ncfsm_test *t, const ncfsm_work *w, ncfsm_work_state_t st,
                           ncfsm_result_t status);
/* Every work in the trace reached exactly one final state (COMPLETED,
 * FAILED, TIMED_OUT, ABORTED) and had no transition after it: the engine
 * runs a work's callback exactly once, when it becomes final. */
int ncfsm_test_expect_final_once(ncfsm_test *t);
/* Each of n counters (e.g. how often a program's callbacks ran) is exactly 1. */
int ncfsm_test_expect_once(ncfsm_test *t, const char *what, const unsigned *counts, size_t n);
/* Fault `id` fired between min and max times. */
int ncfsm_test_expect_fired(ncfsm_test *t, int id, uint64_t min, uint64_t max);
/* A check of the program's own: cond nonzero holds; else the printf-style
 * message is the failure. */
#if defined(__GNUC__) || defined(__clang__)
#define NCFSM__TEST_PRINTF __attribute__((format(printf, 3, 4)))
#else
#define NCFSM__TEST_PRINTF
#endif
int ncfsm_test_check(ncfsm_test *t, int cond, const char *fmt, ...) NCFSM__TEST_PRINTF;

#ifdef __cplusplus
}
#endif
#endif
