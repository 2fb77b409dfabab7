/*
 * ncfsm: NCCL communicators as explicit state machines on a libevent loop.
 *
 * Every call below is thread-safe unless its comment says otherwise. NCCL
 * (and the sim's) communicator calls are only made by the thread that
 * drives the loop (R9, docs/nccl-rules.md); calls from other threads take
 * the loop's lock, do the state bookkeeping and wake the loop (an operation
 * that finds the lock taken while its comm is READY may be handed to the
 * loop without waiting for it: docs/reference/ops.md), and the
 * blocking ones (destroy, abort, revoke, split) wait for the loop's thread
 * to make the call. Buffers and streams (ncfsm_mem_*, ncfsm_stream_*) are
 * made on the calling thread. Callbacks always run on the loop thread,
 * exactly once, and never when the call that took them failed.
 *
 * docs/reference/ has an entry for every function and type here: its
 * thread, whether it blocks, the states before and after, its errors and
 * who owns what; docs/tutorial.md shows them at work.
 */
#ifndef NCFSM_H
#define NCFSM_H

#include <stddef.h>
#include <stdint.h>

#include "ncfsm/result.h"
#include "ncfsm/states.h"
#include "ncfsm/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NCFSM_VERSION_MAJOR 0
#define NCFSM_VERSION_MINOR 1
#define NCFSM_VERSION_PATCH 0

struct event_base;
typedef struct ncfsm_loop ncfsm_loop;
typedef struct ncfsm_comm ncfsm_comm;
typedef struct ncfsm_work ncfsm_work;

/* ---- states, events, calls (include/ncfsm/states.h, generated from
 * fsm/comm.def and fsm/work.def; docs/fsm-tables.md) ------------------------ */

/* What the legality table decides for a (state, call) cell. */
typedef enum ncfsm_decision {
  NCFSM_REJECT = 0, /* refused with an error; the backend is not reached */
  NCFSM_ALLOW,      /* accepted; the backend is reached now or at the next launch */
  NCFSM_DEFER       /* accepted and queued; the backend is reached once the comm is READY */
} ncfsm_decision_t;

const char *ncfsm_state_name(ncfsm_state_t s);
const char *ncfsm_event_name(ncfsm_event_t e);
const char *ncfsm_call_name(ncfsm_call_t c);   /* "FINALIZE" */
const char *ncfsm_call_fn(ncfsm_call_t c);     /* "ncfsm_comm_finalize" */
const char *ncfsm_work_state_name(ncfsm_work_state_t s);
const char *ncfsm_decision_name(ncfsm_decision_t d);
/* NCFSM_SF_* attributes of a state (include/ncfsm/states.h): POLL (an NCCL
 * call is in progress and polled), DEADLINE (the watchdog's phase deadline
 * runs), WORKS (works may be in flight), LAUNCH (queued ops may launch),
 * CONTROL (the loop makes a call for the comm at its next turn), LIVE (in
 * service), FAILED (it failed), END (its NCCL communicator is going or gone). */
unsigned ncfsm_state_flags(ncfsm_state_t s);
/* 1 when the event is caused by a user's call (source CALL), 0 when the
 * loop causes it (LOOP). */
int ncfsm_event_is_call(ncfsm_event_t e);
/* The table's cell: decision, the rule id it cites (docs/nccl-rules.md) and
 * the hint shown to the user when the call is rejected. A cell that is not
 * REJECT may still refuse the call when one of its guards (a condition on
 * the comm, e.g. "no op of this comm in an open group") does not hold: the
 * call's error then names the guard and its hint. */
ncfsm_decision_t ncfsm_legality(ncfsm_state_t s, ncfsm_call_t c, const char **rule,
                                const char **hint);
/* The next state of (s, e)'s last row (the one without a guard when there
 * are several) with its action's name and rule, or NCFSM_STATE_COUNT when
 * the event is invalid in s. */
ncfsm_state_t ncfsm_transition(ncfsm_state_t s, ncfsm_event_t e, const char **action,
                               const char **rule);
/* 1 when some row of (s, e) leads to next: a trace step (s, e, next) is legal. */
int ncfsm_transition_allowed(ncfsm_state_t s, ncfsm_event_t e, ncfsm_state_t next);
/* 1 when some row of fsm/work.def leads from s to next: a work's trace step is legal. */
int ncfsm_work_transition_allowed(ncfsm_work_state_t s, ncfsm_work_state_t next);

/* ---- trace -------------------------------------------------------------- */
typedef enum ncfsm_object_kind { NCFSM_OBJ_COMM, NCFSM_OBJ_WORK, NCFSM_OBJ_LOOP } ncfsm_object_kind_t;

typedef struct ncfsm_trace_rec {
  ncfsm_object_kind_t kind;
  const void *object; /* the comm or work handle */
  int rank;           /* comm rank, -1 if not yet known */
  uint64_t seq;       /* work sequence number (works only) */
  int state;          /* ncfsm_state_t for comms, ncfsm_work_state_t for works */
  int event;          /* ncfsm_event_t for comms, -1 for works */
  int next;           /* state after the step */
  ncfsm_result_t result;
  uint64_t time_ns;   /* CLOCK_MONOTONIC */
} ncfsm_trace_rec;

/* Called under the loop's lock for every transition; it must not call ncfsm. */
typedef void (*ncfsm_trace_fn)(const ncfsm_trace_rec *rec, void *arg);

/* ---- loop --------------------------------------------------------------- */
typedef enum ncfsm_overlap_policy {
  NCFSM_OVERLAP_REJECT = 0, /* default: a group with overlapping writes fails at its end */
  NCFSM_OVERLAP_WARN,       /* log and launch anyway */
  NCFSM_OVERLAP_OFF
} ncfsm_overlap_policy_t;

typedef struct ncfsm_loop_opts {
  ncfsm_overlap_policy_t overlap;  /* R12 check at group end */
  unsigned poll_burst;             /* immediate re-polls before backing off (default 64) */
  unsigned poll_burst_us;          /* ... and at least this long after the last progress (default 200) */
  unsigned poll_max_us;            /* longest poll interval (default 100) */
  int dump_on_signal;              /* 1: SIGUSR1 dumps every comm of this loop with a dump_dir (through
                                      the loop, libevent's signal event; one loop per process may take
                                      it; NCFSM_DUMP_SIGNAL) */
  unsigned coalesce_max;           /* most ops in one backend group when every rank of a clique is on
                                      this loop: consecutive instances of all ranks launch together
                                      (default 64; 1 = off; 0 = auto: the loop chooses it from the
                                      measured cost of its launches, docs/design.md "Adaptive
                                      coalescing"; NCFSM_COALESCE_MAX=auto). Ungrouped ops of a
                                      rank whose peers are elsewhere are never coalesced: NCCL matches
                                      a group's ops across ranks only when every rank groups the same
                                      ones (docs/design.md) */
  int completion;                  /* NCFSM_COMPLETION_AUTO (default): poll, and push once push_after_us
                                      passed without progress; NCFSM_COMPLETION_POLL: completion events are
                                      polled (immediate re-polls, then backing off); NCFSM_COMPLETION_PUSH:
                                      the same immediate re-polls, then, when only works in flight wait, one
                                      host function after the last work of each such stream wakes the loop
                                      (cudaLaunchHostFunc; the sim at its progress) and the loop polls every
                                      push_fallback_us only (NCFSM_COMPLETION=auto|poll|push;
                                      docs/design.md "Completion") */
  unsigned push_fallback_us;       /* with push: that interval (default 10000; NCFSM_PUSH_FALLBACK_US) */
  unsigned push_after_us;          /* auto: push after this long without progress (default 2000;
                                      NCFSM_PUSH_AFTER_US) */
  unsigned spin_us;                /* a thread about to sleep until the loop makes progress (ncfsm_work_wait
                                      and the other blocking waits, on a loop another thread runs) and the
                                      loop's own thread about to wait in libevent with nothing pending spin
                                      this long first (default 20; 0: off; NCFSM_SPIN_US; docs/design.md
                                      "Waiting threads spin first") */
} ncfsm_loop_opts;
enum { NCFSM_COMPLETION_POLL = 0, NCFSM_COMPLETION_PUSH = 1, NCFSM_COMPLETION_AUTO = 2 };

/* Defaults, then the NCFSM_* environment (every variable, its accepted values
 * and the field it fills: docs/settings.md). NCFSM_OK, or
 * NCFSM_ERR_INVALID_ARGUMENT when a variable has a value it does not accept
 * (NCFSM_TIMEOUT_MS=-5, NCFSM_ON_ERROR=explode, ...): that field keeps its
 * default, the message (the variable, the value, what is accepted, what to
 * do) is logged as a WARN and ncfsm_opts_error() returns it. ncfsm_loop_new
 * and ncfsm_comm_new with NULL opts call these and fail the same way; with
 * opts, they check every field and refuse a value out of its range. */
ncfsm_result_t ncfsm_loop_opts_init(ncfsm_loop_opts *o);
/* Why the last options call of this thread (ncfsm_*_opts_init, or
 * ncfsm_loop_new / _new_embedded / ncfsm_comm_new refusing a setting) failed;
 * "" when it did not. Kept per thread, as errno is, because a refused
 * ncfsm_loop_new leaves no handle to ask; ncfsm_comm_new also puts it in
 * ncfsm_loop_last_error(loop). */
const char *ncfsm_opts_error(void);

/* A loop with its own event_base. */
ncfsm_result_t ncfsm_loop_new(const ncfsm_loop_opts *opts, ncfsm_loop **out);
/* A loop inside an application's event_base (which the application runs). */
ncfsm_result_t ncfsm_loop_new_embedded(struct event_base *base, const ncfsm_loop_opts *opts,
                                       ncfsm_loop **out);
struct event_base *ncfsm_loop_base(ncfsm_loop *loop);

typedef enum ncfsm_run_mode {
  NCFSM_RUN_DEFAULT, /* until nothing is pending (no comm in progress, no work in flight) */
  NCFSM_RUN_ONCE,    /* one turn, waiting for something if something is pending */
  NCFSM_RUN_NOWAIT   /* one turn, never waits */
} ncfsm_run_mode_t;
ncfsm_result_t ncfsm_loop_run(ncfsm_loop *loop, ncfsm_run_mode_t mode);
/* Run the loop on a thread of its own until ncfsm_loop_stop_thread. */
ncfsm_result_t ncfsm_loop_start_thread(ncfsm_loop *loop);
ncfsm_result_t ncfsm_loop_stop_thread(ncfsm_loop *loop);
/* Run fn(arg) on the loop thread (thread-safe; wakes the loop). */
ncfsm_result_t ncfsm_loop_call(ncfsm_loop *loop, void (*fn)(void *), void *arg);
/* Called on the loop thread (ncfsm_loop_shutdown). */
typedef void (*ncfsm_loop_cb)(ncfsm_loop *loop, void *arg);
/* Nonblocking, any thread: ncfsm_comm_close on every comm of the loop that
 * is not closing or released yet (their close callbacks are NULL; each comm
 * goes from its state to RELEASED), then cb, on the loop thread, once every
 * comm is released. The loop must run meanwhile; then, after ncfsm_loop_run
 * returns (or ncfsm_loop_stop_thread), ncfsm_loop_close frees the loop.
 * Once per loop: NCFSM_ERR_ILLEGAL_STATE the second time. */
ncfsm_result_t ncfsm_loop_shutdown(ncfsm_loop *loop, ncfsm_loop_cb cb, void *arg);
/* Frees the loop; nonblocking. Any thread but not from a callback of the
 * loop (NCFSM_ERR_INVALID_USAGE). Every comm must be RELEASED; the handle
 * is invalid afterwards. NCFSM_ERR_BUSY (nothing freed) while
 * communicators are not released, work handles are held, the loop thread
 * runs, a group is open or another thread runs the loop. */
ncfsm_result_t ncfsm_loop_close(ncfsm_loop *loop);
void ncfsm_loop_set_trace(ncfsm_loop *loop, ncfsm_trace_fn fn, void *arg);
/* Last error of loop-level calls (groups, run, close, call) that the calling
 * thread made on this loop: kept per thread, so another thread's failure
 * never overwrites it; "" when this thread has none for this loop. */
const char *ncfsm_loop_last_error(ncfsm_loop *loop);

/* ---- groups (R3) --------------------------------------------------------- */
/* Groups are loop-wide, like NCCL's thread-local groups, and owned by the
 * thread that opened the outermost one. Nested groups are legal; only the
 * outermost end launches. An argument error inside a group fails that call,
 * leaves the group open, and is returned again by the outermost end, which
 * must still be called; every work of that group then fails with
 * NCFSM_ERR_GROUP and nothing reaches the backend. A group's thread
 * holds it back from the loop until it holds a second op or calls anything
 * else on that loop (docs/design.md "A group held on its thread"), which
 * makes a group of one op cheaper; other threads see it as an open group. */
ncfsm_result_t ncfsm_group_start(ncfsm_loop *loop);
ncfsm_result_t ncfsm_group_end(ncfsm_loop *loop);
/* The open group's depth; 0 when none is open. From a thread other than the
 * group's, 0 also while its thread holds it back. */
int ncfsm_group_depth(ncfsm_loop *loop);

/* ---- communicators -------------------------------------------------------- */
typedef enum ncfsm_backend_kind {
  NCFSM_BACKEND_AUTO = 0, /* nccl when a GPU is visible, else sim (NCFSM_BACKEND) */
  NCFSM_BACKEND_SIM,
  NCFSM_BACKEND_NCCL
} ncfsm_backend_kind_t;

typedef enum ncfsm_error_policy {
  NCFSM_ON_ERROR_ABORT = 0, /* default: fail pending works, abort the comm (R5, R10) */
  NCFSM_ON_ERROR_STAY,      /* fail pending works, stay in ERROR until the user aborts */
  NCFSM_ON_ERROR_EXIT,      /* fail pending works, then exit(3) */
  NCFSM_ON_ERROR_REVOKE,    /* fail pending works, then ncclCommRevoke where the runtime has it
                               (R6: ERROR -> REVOKING -> REVOKED; destroy or shrink follow), else
                               abort as NCFSM_ON_ERROR_ABORT does */
  NCFSM_ON_ERROR_SHRINK     /* fail pending works, then the armed recovery runs (ncfsm_comm_set_recovery:
                               revoke, agree on the survivors, shrink or re-init, report the new comm);
                               without one, abort as NCFSM_ON_ERROR_ABORT does */
} ncfsm_error_policy_t;

/* Behaviour of the sim backend (a model of NCCL 2.28, see docs/sim.md). */
typedef struct ncfsm_sim_opts {
  int init_polls;          /* polls until a nonblocking init succeeds (default 3) */
  int launch_polls;        /* polls until an InProgress group end is final (default 1) */
  int finalize_polls;      /* polls until finalize is done (default 2) */
  int revoke_polls;        /* polls until revoke is quiescent (default 1) */
  int group_end_inprogress;/* 1: every nonblocking group end returns InProgress (2.28, default);
                              0: returns success directly (2.22.3, as in the seed) */
  int fail_init;           /* nonzero: init ends in this ncclResult_t code */
  int64_t async_error_at_op; /* >= 0: the op with this seq sets this async error */
  int async_error_code;    /* code for async_error_at_op (default ncclRemoteError = 6) */
  int never_arrive;        /* 1: this rank never posts its ops (peers hang) */
  uint64_t shuffle_seed;   /* order in which ops of one group run (R12) */
  int has_revoke;          /* 1: model 2.28.9 (Revoke exists, default); 0: 2.28.3 */
  int split_polls;         /* polls of a nonblocking parent until its split or shrink is final
                              and the child's handle is written (R8; default 2) */
  int has_grow;            /* 1: model ncclCommGrow / ncclCommGetUniqueId (NCCL 2.29+; default 0,
                              or 1 when NCFSM_SIM_NCCL_VERSION >= 22900) */
  int dead;                /* 1: this rank's process is dead: it never posts again, and peers'
                              collectives with it never complete (as with never_arrive), also in
                              children made from it */
} ncfsm_sim_opts;

/* Defaults, then the NCFSM_SIM_* environment (docs/settings.md), as
 * ncfsm_loop_opts_init: NCFSM_OK, or NCFSM_ERR_INVALID_ARGUMENT when a
 * variable has a value it does not accept (NCFSM_SIM_INIT_POLLS=abc,
 * NCFSM_SIM_SPLIT_POLLS=-1, ...): that field keeps its default, the message
 * is logged as a WARN and ncfsm_opts_error() returns it. The process-wide
 * variables the sim reads where it uses them (NCFSM_SIM_NCCL_VERSION,
 * _WAIT_MS, _DRIFT_LIMIT, _SHM_BYTES, _MISMATCH) are checked the same way;
 * ncfsm_comm_new refuses a bad one alike, with opts.sim NULL or not. */
ncfsm_result_t ncfsm_sim_opts_init(ncfsm_sim_opts *o);

/* The watchdog's default deadline (10 minutes, PyTorch's default too). */
#define NCFSM_DEFAULT_TIMEOUT_MS 600000u

/* Cross-rank verification of the collective order (R11; docs/ordering.md). */
typedef enum ncfsm_verify_mode {
  NCFSM_VERIFY_OFF = 0, /* no cross-rank check (NCFSM_VERIFY=off) */
  NCFSM_VERIFY_ASYNC    /* the default: launch at once and compare as the collectives go. Ranks
                           of one process compare every collective in memory (also Send/Recv
                           pairs); ranks in other processes (ncfsm_comm_init_boot) exchange
                           (seq, rolling hash) every verify_window collectives on a channel of
                           the comm's bootstrap of their own, without a barrier, and the
                           count and dtype of each Send/Recv pair's ops on a channel of its two
                           ranks (its first op, then every min(verify_window, 64)). A divergence
                           fails the comm (NCFSM_ERR_MISMATCH) naming the seq, the field and
                           each rank's value; a window not completed within verify_stall_ms
                           fails it (NCFSM_ERR_TIMEOUT) naming the ranks behind; a rank whose
                           comm fails tells the others, whose comms fail with NCFSM_ERR_PEER
                           naming it (docs/ordering.md) */,
  NCFSM_VERIFY_STRICT   /* before a collective launches, every rank's fingerprint of it (op,
                           count, dtype, root, redop) is exchanged through the comm's bootstrap;
                           on a difference no rank hands it to NCCL: its works (its whole group)
                           fail with NCFSM_ERR_MISMATCH on every rank, the comm's last error
                           names the seq, the field and each rank's value, and the comm stays
                           usable. An exchange not done within verify_stall_ms fails the comm
                           (NCFSM_ERR_TIMEOUT). Send/Recv are not checked. Needs
                           ncfsm_comm_init_boot, as async does */
} ncfsm_verify_mode_t;

/* Where strict verification exchanges the fingerprints (docs/ordering.md). */
typedef enum ncfsm_verify_channel {
  NCFSM_VERIFY_CHANNEL_BOOTSTRAP = 0, /* default: an allgather through the comm's bootstrap,
                                         pipelined (every queued collective's exchange is posted) */
  NCFSM_VERIFY_CHANNEL_NCCL          /* an AllGather on a companion NCCL communicator made from a
                                         unique id broadcast through the bootstrap once the comm is
                                         READY; one exchange at a time, posted only when this comm
                                         has nothing verified waiting to launch and no launch in
                                         progress, so that on every rank the companion's kernels
                                         reach the GPU in the same order relative to the comm's */
} ncfsm_verify_channel_t;

typedef void (*ncfsm_state_cb)(ncfsm_comm *comm, ncfsm_state_t from, ncfsm_state_t to,
                               ncfsm_event_t ev, void *arg);

typedef struct ncfsm_comm_opts {
  ncfsm_backend_kind_t backend;
  int blocking;                 /* 0: nonblocking NCCL communicator (default) */
  int device;                   /* CUDA device (sim: a label checked against streams) */
  uint64_t timeout_ms;          /* watchdog per work and per phase (states with NCFSM_SF_DEADLINE);
                                   default NCFSM_DEFAULT_TIMEOUT_MS or NCFSM_TIMEOUT_MS; 0 = off */
  ncfsm_error_policy_t on_error;
  ncfsm_state_cb on_state;      /* called on the loop thread after each transition */
  void *on_state_arg;
  const ncfsm_sim_opts *sim;    /* NULL: defaults */
  int timing;                   /* 1: record a start event per launch and stream, so works
                                   report device time (ncfsm_work_get_times); NCFSM_TIMING */
  const char *name;             /* shown in logs and last-error strings */
  unsigned trace_buffer;        /* flight recorder: records kept per comm (a ring; 0 = off; default 2048
                                   or NCFSM_TRACE_BUFFER); docs/ordering.md */
  ncfsm_verify_mode_t verify;   /* NCFSM_VERIFY (off|async|strict) */
  unsigned verify_window;       /* collectives per exchange (default 64; NCFSM_VERIFY_WINDOW) */
  uint64_t verify_stall_ms;     /* async/strict: an exchange not done by then fails the comm (default 5000;
                                   NCFSM_VERIFY_STALL_MS; 0 = never) */
  ncfsm_verify_channel_t verify_channel; /* strict's exchange: bootstrap (default) or nccl
                                   (NCFSM_VERIFY_CHANNEL) */
  int init_roots;               /* ncfsm_comm_init_boot: unique ids made by this many roots (ranks
                                   floor(j*size/roots)), shared by a broadcast; > 1 initialises with
                                   ncclCommInitRankScalable where the runtime has it (NCCL 2.23+),
                                   else with the first id (default 1 or NCFSM_INIT_ROOTS) */
  const char *dump_dir;         /* where the recorder is dumped on every error and watchdog expiry (and
                                   on SIGUSR1 with ncfsm_loop_opts.dump_on_signal); NULL or "" = no
                                   automatic dumps (default NCFSM_DUMP_DIR) */
} ncfsm_comm_opts;

/* Defaults, then the NCFSM_* environment; as ncfsm_loop_opts_init. */
ncfsm_result_t ncfsm_comm_opts_init(ncfsm_comm_opts *o);

#define NCFSM_UNIQUE_ID_BYTES 128
typedef struct ncfsm_unique_id {
  char internal[NCFSM_UNIQUE_ID_BYTES];
} ncfsm_unique_id;

/* A unique id for a new clique (ncclGetUniqueId, or the sim's registry key). */
ncfsm_result_t ncfsm_get_unique_id(ncfsm_backend_kind_t backend, ncfsm_unique_id *id);

/* A communicator in state NEW. */
ncfsm_result_t ncfsm_comm_new(ncfsm_loop *loop, const ncfsm_comm_opts *opts, ncfsm_comm **out);
/* NEW -> INIT_QUEUED; the backend init runs at the loop's next turn. */
ncfsm_result_t ncfsm_comm_init(ncfsm_comm *comm, int nranks, int rank, const ncfsm_unique_id *id);
/* NEW -> ID_QUEUED as rank ncfsm_boot_rank(boot) of ncfsm_boot_size(boot):
 * rank 0 makes the unique id and the bootstrap shares it (nonblocking, on the
 * loop); the backend init follows. boot must have been opened on this loop's
 * event_base (ncfsm_loop_base) and stay open until the comm is READY. */
struct ncfsm_boot;
ncfsm_result_t ncfsm_comm_init_boot(ncfsm_comm *comm, struct ncfsm_boot *boot);
/* n ranks of one clique in this process (one thread drives them all, in one group). */
ncfsm_result_t ncfsm_comm_init_all(ncfsm_loop *loop, int n, const ncfsm_comm_opts *opts,
                                   const int *devices, ncfsm_comm **comms);

ncfsm_state_t ncfsm_comm_state(const ncfsm_comm *comm);
int ncfsm_comm_rank(const ncfsm_comm *comm);
/* opts.name as the comm keeps it (never NULL; "" for an invalid handle); valid while the handle is. */
const char *ncfsm_comm_name(const ncfsm_comm *comm);
int ncfsm_comm_size(const ncfsm_comm *comm);
int ncfsm_comm_device(const ncfsm_comm *comm);
/* The cause of the last failed call on this comm (state, call, what to do),
 * copied under the loop's lock into a buffer of the calling thread: valid
 * until this thread's next ncfsm_comm_last_error or ncfsm_comm_failure. */
const char *ncfsm_comm_last_error(const ncfsm_comm *comm);
/* Why the comm left its healthy life (the message of the error, timeout or
 * abort that moved it to ERROR, REVOKING or CLOSING), kept even when later
 * calls fail; "" when it never failed. Same buffer rules as last_error. */
const char *ncfsm_comm_failure(const ncfsm_comm *comm);
/* The backend's async error code and last error text, when in ERROR. */
int ncfsm_comm_backend_error(const ncfsm_comm *comm);
/* The seq the next launched collective takes (collectives take their seq
 * when they are handed to NCCL, in launch order: refused or failed-before-
 * launch works take none), and the rolling hash of the fingerprints of all
 * collectives launched so far (R11): equal on every rank of a correct
 * program. Send/recv count per (peer, direction) and are not hashed. Both
 * read under one lock (one moment of the comm); either pointer may be
 * NULL. NCFSM_ERR_INVALID_ARGUMENT for an invalid handle (nothing written). */
ncfsm_result_t ncfsm_comm_position(const ncfsm_comm *comm, uint64_t *next_seq, uint64_t *hash);
/* Blocking: run the loop until the comm is in state s (OK), in a state from
 * which s cannot be reached (ERR_ILLEGAL_STATE; the last error names the
 * state, the cause of a failure and the calls that could move it on), or
 * timeout_ms passed (ERR_AGAIN: the wait's own limit, nothing failed;
 * 0 = no limit). A watchdog timeout of the comm is a failure (ERROR). */
ncfsm_result_t ncfsm_comm_wait_state(ncfsm_comm *comm, ncfsm_state_t s, uint64_t timeout_ms);

/* ---- communicators made from communicators (R7, R8; docs/recovery.md) --------
 * The child is a comm made with ncfsm_comm_new on the parent's loop (its
 * options are the child's configuration: blocking, device, timeout, name...;
 * opts.verify not strict: a child has no bootstrap, and async compares its
 * ranks in this process in memory) and still NEW. The
 * call is issued on the loop thread; the parent is then SPLITTING (or
 * SHRINKING) until NCCL wrote the child's handle, which happens when the
 * parent's async state polls back to success (R8); the child is
 * CHILD_QUEUED meanwhile, then INIT_IN_PROGRESS until its own init polls to
 * READY. Ops on the
 * child queue as during init. A parent that fails or is aborted first fails
 * its child. Every rank of the parent must make the same call (except the
 * ranks a shrink excludes). */
#define NCFSM_SPLIT_NOCOLOR (-1) /* this rank takes part but gets no child (child NULL) */
/* ncclCommSplit: ranks with the same color form one child, ordered by key. */
ncfsm_result_t ncfsm_comm_split(ncfsm_comm *parent, int color, int key, ncfsm_comm *child);
/* (For split, shrink and grow: a call refused before NCCL leaves the child NEW;
 * a call NCCL itself refused fails the parent and the child: abort both.) */
#define NCFSM_SHRINK_DEFAULT 0 /* the parent has no unfinished work; it stays usable */
#define NCFSM_SHRINK_ABORT 1   /* the parent's work is terminated first; abort the parent afterwards */
/* ncclCommShrink (NCCL >= 2.27): the survivors (every rank not in exclude,
 * parent ranks) make the child, ranks renumbered in parent order; the excluded
 * ranks must not call it. Legal on a READY comm (DEFAULT: no unfinished work),
 * on a failed comm (ERROR: NCFSM_SHRINK_ABORT) and on a REVOKED one. After an
 * ABORT-mode shrink, or one of a failed or revoked comm, the parent ends in
 * SHRUNK: abort it, never destroy it (R7; destroy is refused there). */
ncfsm_result_t ncfsm_comm_shrink(ncfsm_comm *parent, const int *exclude, int nexclude, int flags,
                                 ncfsm_comm *child);
/* ncclCommGetUniqueId (NCCL >= 2.29): the id of a grow, made on one existing
 * rank and shared with every rank of the grow (existing and joining).
 * NCFSM_ERR_UNSUPPORTED when the runtime has no ncclCommGrow. */
ncfsm_result_t ncfsm_comm_grow_id(ncfsm_comm *parent, ncfsm_unique_id *id);
/* ncclCommGrow (NCCL >= 2.29): existing ranks pass their READY parent (no
 * unfinished work) and rank -1; joining ranks pass parent NULL and their new
 * rank (from the parent's size up). Every rank passes the same id (NCCL gets
 * it only from the rank that made it). */
ncfsm_result_t ncfsm_comm_grow(ncfsm_comm *parent, int nranks, const ncfsm_unique_id *id, int rank,
                               ncfsm_comm *child);

/* ---- recovery without restart (docs/recovery.md) --------------------------------
 * An armed comm that fails (error policy NCFSM_ON_ERROR_SHRINK, or
 * ncfsm_comm_recover) or whose bootstrap reports a lost rank is replaced: the
 * survivors revoke it where the runtime can (R6), agree on who is alive
 * through the bootstrap, shrink it to them (R7; or, where a shrink is not
 * possible or fails, abort it and initialise a new comm over the survivors'
 * bootstrap), abort it, and get the new comm in the callback, armed in turn.
 * The old comm's works failed once, with the cause; the new comm's seqs start
 * at 0. Needs a bootstrap with agreement (tcp, local: docs/bootstrap.md). */
typedef struct ncfsm_recovery_report {
  ncfsm_result_t status;     /* NCFSM_OK: fresh is READY */
  ncfsm_comm *old;           /* the failed comm, aborted; the caller still releases it */
  ncfsm_comm *fresh;         /* the new comm (NULL on failure); the caller owns it */
  struct ncfsm_boot *boot;   /* the survivors' bootstrap the fresh comm is armed with (close it after the comm) */
  const int *excluded;       /* ranks of the old comm left out (valid during the callback) */
  int nexcluded;
  const char *how;           /* "shrink" or "reinit" */
  uint64_t epoch;            /* the agreement's epoch */
  uint64_t t_fail_ns;        /* CLOCK_MONOTONIC when the failure was seen */
  double detect_to_agreed_ms, detect_to_ready_ms;
  char why[384];             /* what failed, or why the recovery failed */
} ncfsm_recovery_report;
typedef void (*ncfsm_recover_cb)(const ncfsm_recovery_report *r, void *arg);
typedef struct ncfsm_recovery_opts {
  struct ncfsm_boot *boot;            /* the agreement channel: the bootstrap the comm was made with */
  const ncfsm_comm_opts *fresh_opts;  /* the new comm's options (NULL: the old comm's) */
  ncfsm_recover_cb cb;                /* on the loop thread, once per recovery */
  void *arg;
} ncfsm_recovery_opts;
/* Arm c (once, while it is live); registers for the bootstrap's peer-loss reports
 * (one comm per bootstrap). A lost rank fails c only while c is in service
 * (INIT_QUEUED, INIT_IN_PROGRESS, READY, GROUP_OPEN, LAUNCH_IN_PROGRESS,
 * SPLITTING: an init with a dead rank never completes): ranks ending a job close
 * their bootstraps one after the other. opts NULL disarms c (not while its
 * recovery runs). Close the bootstrap only after releasing (or disarming) c. */
ncfsm_result_t ncfsm_comm_set_recovery(ncfsm_comm *comm, const ncfsm_recovery_opts *opts);
/* Fail c now (its works fail with NCFSM_ERR_ASYNC) and recover it. */
ncfsm_result_t ncfsm_comm_recover(ncfsm_comm *comm);

/* ---- closing ---------------------------------------------------------------
 * The one call most programs need is ncfsm_comm_close: nonblocking, from any
 * state, with a callback once the comm is gone (libuv's uv_close). The four
 * steps it is made of are public too, for programs that drive them. Which
 * state each call is legal in, and what it is told otherwise: the legality
 * table (docs/fsm-tables.md). */

/* Called on the loop thread once the comm closed and its handle was
 * released: status NCFSM_OK when it was finalized and destroyed, otherwise
 * why it was aborted (its failure's cause, or NCFSM_ERR_ABORTED for a comm
 * that was not ready yet). The handle may be read (ncfsm_comm_failure,
 * ncfsm_comm_name) during the callback only. */
typedef void (*ncfsm_close_cb)(ncfsm_comm *comm, ncfsm_result_t status, void *arg);
/* Nonblocking, any thread (callbacks too), once per comm, in every state but
 * RELEASED. The loop takes the comm from its state to RELEASED one legal
 * call at a time (fsm/comm.def, column close), then runs cb: a ready comm is finalized (its queued and
 * in-flight works complete first: every rank must close it, R4) and
 * destroyed; a comm not ready yet, failed, revoked or shrunk is aborted
 * (R1, R5); one in an open group waits for the group's end, one in a
 * split, finalize or revoke for its end. A finalize that other ranks never
 * join ends at the comm's watchdog deadline, and the comm is aborted.
 * Works still held by the caller stay valid until released. The loop must
 * run (ncfsm_loop_run returns once the callback ran). A recovery armed on
 * the comm is disarmed; while one runs the call returns NCFSM_ERR_BUSY. */
ncfsm_result_t ncfsm_comm_close(ncfsm_comm *comm, ncfsm_close_cb cb, void *arg);

/* Nonblocking, any thread. READY (no op of it in an open group) ->
 * DRAINING at once (LAUNCH_IN_PROGRESS -> DRAIN_LAUNCH_IN_PROGRESS); the
 * comm's queued ops launch, then the loop calls ncclCommFinalize and polls
 * it through FINALIZING to FINALIZED (R4); then only destroy or abort.
 * Collective: every rank finalizes. NCFSM_ERR_ILLEGAL_STATE elsewhere (a
 * second finalize poisons a real comm, R4). */
ncfsm_result_t ncfsm_comm_finalize(ncfsm_comm *comm);
/* Blocking, any thread: ncclCommDestroy on the loop thread (on the caller
 * when no other thread runs the loop, else the caller waits; the loop's
 * lock is not held meanwhile). FINALIZED, READY with no unfinished work, or
 * REVOKED -> CLOSING -> CLOSED; then only release. A destroy NCCL refuses
 * leaves the comm in ERROR (NCFSM_ERR_BACKEND): abort it. */
ncfsm_result_t ncfsm_comm_destroy(ncfsm_comm *comm);
/* Blocking, any thread: ncclCommAbort on the loop thread (as destroy).
 * Every state but CLOSING, CLOSED, RELEASED -> CLOSING -> CLOSED; every
 * unfinished work fails as ABORTED (R5); then only release. */
ncfsm_result_t ncfsm_comm_abort(ncfsm_comm *comm);
/* ncclCommRevoke (NCCL >= 2.28.7), any thread, on the loop thread (as
 * destroy): blocks until NCCL took the call. READY, LAUNCH_IN_PROGRESS or
 * ERROR -> REVOKING, polled by the loop to REVOKED (then destroy, shrink or
 * abort); works not seen complete fail (R6). NCFSM_ERR_UNSUPPORTED without
 * ncclCommRevoke. */
ncfsm_result_t ncfsm_comm_revoke(ncfsm_comm *comm);
/* Free the handle; nonblocking, any thread: NEW or CLOSED -> RELEASED
 * (NCFSM_ERR_ILLEGAL_STATE elsewhere). The handle must not be used
 * afterwards (like a closed libuv handle); its memory goes with the last
 * reference, so works the caller still holds stay valid until released. */
ncfsm_result_t ncfsm_comm_release(ncfsm_comm *comm);

/* A stream for this comm's backend and device (sim: a FIFO model of a CUDA stream). */
ncfsm_result_t ncfsm_stream_create(ncfsm_comm *comm, void **stream);
/* NCFSM_ERR_BUSY (nothing destroyed) while a work of this loop that is not
 * finished names the stream: a submitted op is on its stream only once it
 * launched, so the stream must outlive it. */
ncfsm_result_t ncfsm_stream_destroy(ncfsm_comm *comm, void *stream);

/* Buffers for this comm's backend and device: device memory for nccl, host
 * memory for the sim. ncfsm_memcpy copies synchronously between host memory
 * and such a buffer (to_device: 1 host->buffer, 0 buffer->host). */
ncfsm_result_t ncfsm_mem_alloc(ncfsm_comm *comm, size_t bytes, void **ptr);
ncfsm_result_t ncfsm_mem_free(ncfsm_comm *comm, void *ptr);
ncfsm_result_t ncfsm_memcpy(ncfsm_comm *comm, void *dst, const void *src, size_t bytes, int to_device);

/* ---- operations --------------------------------------------------------- */
/* Completion callback: once, on the loop thread, with the final status
 * (NCFSM_OK, or the cause: ERR_ASYNC, ERR_TIMEOUT, ERR_ABORTED, ERR_GROUP...). */
typedef void (*ncfsm_work_cb)(ncfsm_work *w, ncfsm_result_t status, void *arg);

/* Every operation returns a work through *out when out is non-NULL; the
 * caller then owns a reference and must ncfsm_work_release it. stream NULL
 * means the comm's default stream. */
ncfsm_result_t ncfsm_allreduce(ncfsm_comm *c, const void *send, void *recv, size_t count,
                               ncfsm_dtype_t dt, ncfsm_redop_t op, void *stream, ncfsm_work_cb cb,
                               void *arg, ncfsm_work **out);
ncfsm_result_t ncfsm_broadcast(ncfsm_comm *c, const void *send, void *recv, size_t count,
                               ncfsm_dtype_t dt, int root, void *stream, ncfsm_work_cb cb, void *arg,
                               ncfsm_work **out);
ncfsm_result_t ncfsm_reduce(ncfsm_comm *c, const void *send, void *recv, size_t count,
                            ncfsm_dtype_t dt, ncfsm_redop_t op, int root, void *stream,
                            ncfsm_work_cb cb, void *arg, ncfsm_work **out);
/* sendcount elements per rank; recv holds nranks * sendcount. */
ncfsm_result_t ncfsm_allgather(ncfsm_comm *c, const void *send, void *recv, size_t sendcount,
                               ncfsm_dtype_t dt, void *stream, ncfsm_work_cb cb, void *arg,
                               ncfsm_work **out);
/* recvcount elements per rank; send holds nranks * recvcount. */
ncfsm_result_t ncfsm_reducescatter(ncfsm_comm *c, const void *send, void *recv, size_t recvcount,
                                   ncfsm_dtype_t dt, ncfsm_redop_t op, void *stream,
                                   ncfsm_work_cb cb, void *arg, ncfsm_work **out);
/* count elements to each rank; send and recv hold nranks * count. */
ncfsm_result_t ncfsm_alltoall(ncfsm_comm *c, const void *send, void *recv, size_t count,
                              ncfsm_dtype_t dt, void *stream, ncfsm_work_cb cb, void *arg,
                              ncfsm_work **out);
/* count elements per rank; recv (root only) holds nranks * count. */
ncfsm_result_t ncfsm_gather(ncfsm_comm *c, const void *send, void *recv, size_t count,
                            ncfsm_dtype_t dt, int root, void *stream, ncfsm_work_cb cb, void *arg,
                            ncfsm_work **out);
/* count elements per rank; send (root only) holds nranks * count. */
ncfsm_result_t ncfsm_scatter(ncfsm_comm *c, const void *send, void *recv, size_t count,
                             ncfsm_dtype_t dt, int root, void *stream, ncfsm_work_cb cb, void *arg,
                             ncfsm_work **out);
ncfsm_result_t ncfsm_send(ncfsm_comm *c, const void *send, size_t count, ncfsm_dtype_t dt, int peer,
                          void *stream, ncfsm_work_cb cb, void *arg, ncfsm_work **out);
ncfsm_result_t ncfsm_recv(ncfsm_comm *c, void *recv, size_t count, ncfsm_dtype_t dt, int peer,
                          void *stream, ncfsm_work_cb cb, void *arg, ncfsm_work **out);

/* ---- works ---------------------------------------------------------------- */
/* A work's fingerprint seq until it is launched (and for ever when it never
 * is: refused, failed with its group, failed before launch). */
#define NCFSM_SEQ_NONE UINT64_MAX
ncfsm_work_state_t ncfsm_work_state(const ncfsm_work *w);
/* NCFSM_ERR_AGAIN while not final, else the final status. */
ncfsm_result_t ncfsm_work_status(const ncfsm_work *w);
/* The work's fingerprint. Its seq is written when the work launches (on the
 * loop's thread): read through this pointer on the loop's thread (callbacks)
 * or once the work launched; from any thread, ncfsm_work_get_fingerprint
 * copies it under the loop's lock. */
const ncfsm_fingerprint_t *ncfsm_work_fingerprint(const ncfsm_work *w);
ncfsm_result_t ncfsm_work_get_fingerprint(const ncfsm_work *w, ncfsm_fingerprint_t *out);
ncfsm_comm *ncfsm_work_comm(const ncfsm_work *w);
/* Nonzero once the work reached IN_FLIGHT (whatever came after: it may have
 * completed or failed since): its NCCL kernels were put on the stream, and
 * dependent stream work may be queued behind them (R2). */
int ncfsm_work_launched(const ncfsm_work *w);
/* What is known about a work, as bits: each layer of evidence says more
 * than the one before it, and only VERIFIED speaks for the other ranks. */
typedef enum ncfsm_evidence {
  NCFSM_EVIDENCE_ACCEPTED = 1u << 0, /* ncfsm accepted it (the state and arguments were legal) */
  NCFSM_EVIDENCE_LAUNCHED = 1u << 1, /* handed to NCCL: it has its seq */
  NCFSM_EVIDENCE_FINAL = 1u << 2,    /* its launch polled to ncclSuccess here: its kernels are on the stream (R2) */
  NCFSM_EVIDENCE_COMPLETE = 1u << 3, /* its completion event completed: done on this rank's stream */
  NCFSM_EVIDENCE_VERIFIED = 1u << 4  /* a collective every rank launched with the same fingerprint at its seq
                                        (R11; needs verification, on by default where ranks can compare) */
} ncfsm_evidence_t;
/* The bits of ncfsm_evidence_t that hold for w now (0 for an invalid handle). */
unsigned ncfsm_work_evidence(const ncfsm_work *w);
/* Blocking: run the loop until the work is final and returns its final
 * status (NCFSM_ERR_TIMEOUT only when the watchdog timed the work out), or
 * NCFSM_ERR_AGAIN when timeout_ms (0 = no limit) passed first: the work
 * goes on. */
ncfsm_result_t ncfsm_work_wait(ncfsm_work *w, uint64_t timeout_ms);
/* This work's watchdog deadline: timeout_ms after its launch (0: the comm's
 * opts.timeout_ms), overriding the comm's for this work only. Legal until the
 * work is final (NCFSM_ERR_ILLEGAL_STATE after); on a work already in flight
 * the new deadline counts from its launch too. */
ncfsm_result_t ncfsm_work_set_timeout(ncfsm_work *w, uint64_t timeout_ms);
/* Dump this comm's flight recorder now (reason "request"), into dir (NULL:
 * opts.dump_dir). The snapshot is taken now; the files are written by a
 * dump thread, so the call never waits for I/O. NCFSM_ERR_INVALID_ARGUMENT
 * without a directory, NCFSM_ERR_UNSUPPORTED when the recorder is off,
 * NCFSM_ERR_BUSY when too many dumps are pending. docs/ordering.md gives the
 * file names and formats. */
ncfsm_result_t ncfsm_comm_dump(ncfsm_comm *comm, const char *dir);
/* Drop the caller's reference. A second release of the same handle is
 * detected (NCFSM_ERR_INVALID_USAGE) and changes nothing, as long as the
 * loop has not reused the memory: freed works wait in a FIFO of at least 64
 * before reuse. */
ncfsm_result_t ncfsm_work_release(ncfsm_work *w);

/* Where a work's time went. Host times are CLOCK_MONOTONIC ns, 0 when not
 * reached: submit (the ncfsm call), launch (the NCCL group end was called),
 * final (the launch became final: ncclSuccess, R2; the completion event is
 * recorded then), complete (the completion event was seen complete). */
typedef struct ncfsm_work_times {
  uint64_t submit_ns, launch_ns, final_ns, complete_ns;
  /* With opts.timing: device time from an event recorded on the stream just
   * before the launch to the completion event; else -1. */
  float device_ms;
  /* With opts.timing: 1 if the completion event was already complete when
   * queried right after the launch became final, 0 if not; else -1. */
  int ready_at_final;
} ncfsm_work_times;

ncfsm_result_t ncfsm_work_get_times(const ncfsm_work *w, ncfsm_work_times *t);

/* ---- misc ------------------------------------------------------------------ */
const char *ncfsm_backend_name(ncfsm_backend_kind_t b);

/* What a backend kind resolves to here (AUTO: through NCFSM_BACKEND and the
 * visible GPUs), and what its runtime offers. */
typedef struct ncfsm_backend_info {
  ncfsm_backend_kind_t kind; /* resolved: SIM or NCCL */
  const char *name;          /* "nccl", "sim" ("null" for the benchmark backend) */
  int nccl_version;          /* NCCL_VERSION_CODE of the runtime (sim: the modelled version) */
  int device_count;          /* visible GPUs (0 for the sim) */
  int has_revoke;            /* ncclCommRevoke exists (R6) */
  char why[256];             /* on NCFSM_ERR_UNSUPPORTED: why the backend is unavailable */
} ncfsm_backend_info;

/* NCFSM_OK with *out filled, or NCFSM_ERR_UNSUPPORTED with out->why. */
ncfsm_result_t ncfsm_backend_query(ncfsm_backend_kind_t kind, ncfsm_backend_info *out);
/* The log levels: a message is printed (stderr, "ncfsm PID LEVEL file.c:LINE
 * message") when its level is at or below the level set. */
typedef enum ncfsm_log_level {
  NCFSM_LOG_NONE = 0, /* nothing */
  NCFSM_LOG_ERROR,    /* errors only */
  NCFSM_LOG_WARN,     /* and warnings: the default */
  NCFSM_LOG_INFO,     /* and what the engine does (transitions, launches, the backend's WARNs) */
  NCFSM_LOG_TRACE     /* and every step */
} ncfsm_log_level_t;
/* Sets the process's log level (an ncfsm_log_level_t); replaces what
 * NCFSM_DEBUG (ERROR, WARN, INFO, TRACE) set at start; default WARN. */
void ncfsm_set_log_level(int level);

#ifdef __cplusplus
}
#endif
#endif
