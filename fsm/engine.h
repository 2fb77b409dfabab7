/*
 * Layer 2 of the engine: the comm machine bound to its guards and actions
 * (comm_fsm.c, comm_actions.c; how a comm fails: ncfsm__comm_fail), the group
 * machine (group.c), launches (launcher.c), the calls the loop makes for a
 * comm in a CONTROL state (control.c), polls (progress.c), the watchdog
 * (watchdog.c) and the hand-off of split/shrink/grow children (children.c).
 * Every function here runs with loop->mu held unless its comment says
 * otherwise; none calls the loop glue, the public API, verification or
 * recovery but through the hooks of fsm/objects.h.
 */
#ifndef NCFSM_FSM_ENGINE_H
#define NCFSM_FSM_ENGINE_H

#include "fsm/objects.h"

/* The payload of a comm event (fsm/comm.def says which event uses what). */
typedef struct ncfsm__cev {
  ncfsm_result_t cause; /* ASYNC_ERROR, TIMEOUT, CLOSE_FAILED: the failure's cause */
  int code;             /* ... the backend's code (NCFSM__NCCL_SUCCESS when none) */
  const char *what;     /* ... what failed */
  unsigned from;        /* ... and POLICY: the state the comm failed from */
  ncfsm_work *work;     /* MISMATCH: the collective whose fingerprints differ */
  /* INIT, INIT_BOOT: the comm's place and its unique id (or where it comes from) */
  int rank, nranks;
  const ncfsm_unique_id *id;
  struct ncfsm_boot *boot;
  char *uid_buf;
  int nroots;
  ncfsm_result_t result; /* out: what the call that fired the event returns (REVOKE) */
} ncfsm__cev;

/* ---- comm_fsm.c ---- */
/* Fire ev on c. A (state, ev) with no row whose guard holds is an engine
 * defect: an assertion in debug builds; in release builds the event
 * INVALID (the comm fails, with a message). */
void ncfsm__comm_fire(ncfsm_comm *c, ncfsm_event_t ev, ncfsm__cev *p);
bool ncfsm__comm_can_fire(const ncfsm_comm *c, ncfsm_event_t ev);
/* Legality of call on c now, guards included; on REJECT sets the comm's
 * last error (state, call, rule, guard, what to do), counts the refusal,
 * notes it in the caller's open group (R3) and sets *why. */
ncfsm_decision_t ncfsm__check_legal(ncfsm_comm *c, ncfsm_call_t call, ncfsm_result_t *why);
/* The same for a call made on another thread (a hand-off taken by this one:
 * fsm/submit.c): a refusal does not touch the group this thread may own. */
ncfsm_decision_t ncfsm__check_legal_for_other(ncfsm_comm *c, ncfsm_call_t call, ncfsm_result_t *why);
bool ncfsm__comm_guard(const ncfsm_comm *c, ncfsm__comm_guard_t g, const ncfsm__cev *p);

/* ---- comm_fsm.c: failing ---- */
/* c failed (ev ASYNC_ERROR or TIMEOUT, with its cause, the backend's code
 * and what failed): the table decides (fail_pending and the error policy,
 * or only the message when c is not in service). */
void ncfsm__comm_fail(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_result_t cause, int code, const char *what);

/* ---- group.c: the loop's group machine (fsm/group.def) ---- */
/* ncfsm_group_start / ncfsm_group_end on loop: the result to return. */
ncfsm_result_t ncfsm__group_start(ncfsm_loop *loop);
ncfsm_result_t ncfsm__group_end(ncfsm_loop *loop);
/* A call of c that failed with r: inside the caller's open group, the
 * group fails and its outermost end returns r (R3). */
void ncfsm__group_note_error(ncfsm_comm *c, ncfsm_result_t r);
/* A group is open (inline: every submit asks); the caller opened it. */
static inline bool ncfsm__group_open(const ncfsm_loop *loop) {
  return ncfsm__m_group.states[loop->group_state].flags & NCFSM__GF_OPEN;
}
static inline bool ncfsm__group_owned(const ncfsm_loop *loop) {
  return ncfsm__group_open(loop) && pthread_equal(loop->group_owner, pthread_self());
}

/* ---- group.c: a group its thread holds back (fsm/held.def) ---- */
typedef struct ncfsm__held ncfsm__held;
/* The loop the calling thread holds a group back from (NULL: none), so that
 * one compare says whether it does for a given loop. initial-exec: one load
 * per test, on every call that takes a loop's lock. */
extern __thread ncfsm_loop *ncfsm__held_loop __attribute__((tls_model("initial-exec")));
/* ncfsm_group_start: true when the calling thread now holds the group
 * (its depth counted in loop->held); false: the loop's group machine decides. */
bool ncfsm__held_start(ncfsm_loop *loop);
/* ncfsm_group_end on the held group's loop: its result. */
ncfsm_result_t ncfsm__held_end(ncfsm_loop *loop);
/* The lock held, the caller's group held back from loop (EMPTY): w, recorded
 * and in its comm's group (ENLIST), is its op. */
void ncfsm__held_take(ncfsm_loop *loop, ncfsm_work *w);
/* The lock held: the caller's group held back from loop becomes the loop's
 * (SPILL). NCFSM_OK, or the loop's refusal of its START (another thread's
 * group opened there meanwhile: NCFSM_ERR_WRONG_THREAD; the held op failed). */
ncfsm_result_t ncfsm__held_spill(ncfsm_loop *loop);
static inline void ncfsm__held_spill_mine(ncfsm_loop *loop) {
  if (__builtin_expect(ncfsm__held_loop == loop, 0)) (void)ncfsm__held_spill(loop);
}

/* ---- launcher.c ---- */
/* Launch what can go now, with the control steps of fsm/comm.def before
 * and after (aborts, unique ids, inits; finalizes); true when something
 * was launched. May drop and retake the lock (aborts). */
bool ncfsm__launch(ncfsm_loop *loop);
/* action record_events: c's launch is final: completion events (R2). */
void ncfsm__launch_final(ncfsm_comm *c);

/* ---- control.c ---- */
/* The control steps of comms in CONTROL states: before launches (aborts,
 * unique ids, inits) or after (finalizes). */
void ncfsm__control(ncfsm_loop *loop, bool after_launch);
/* Abort c now (its state allows ABORT): drops and retakes the lock around
 * ncclCommAbort. The caller owns the loop (runner). */
void ncfsm__comm_abort_now(ncfsm_comm *c);
/* An NCCL handle no comm owns (a child aborted before its parent's call
 * wrote it, a verifier's companion): aborted with the next control step's
 * aborts, without the lock; after(arg), when not NULL, runs once the abort
 * returned (it frees what the handle used). */
void ncfsm__abort_stray(ncfsm_loop *loop, const ncfsm__backend *be, void *bcomm, void (*after)(void *), void *arg);
/* ncfsm_loop_close: the strays left are aborted now (drops the lock). */
void ncfsm__abort_strays_now(ncfsm_loop *loop);
/* Destroy c now (its state allows DESTROY): CLOSING, ncclCommDestroy
 * without the lock, CLOSED (or ERROR when NCCL refuses: ERR_BACKEND). */
ncfsm_result_t ncfsm__comm_destroy_now(ncfsm_comm *c);
/* action release_handle of a comm whose close was accepted: its callback is
 * queued for the loop thread (c->close is the queue entry). */
void ncfsm__close_deliver(ncfsm_comm *c);
/* A comm was released: once every comm of the loop is, the callback of
 * ncfsm_loop_shutdown is queued (loop->shutdown_req). */
void ncfsm__shutdown_check(ncfsm_loop *loop);

/* ---- progress.c ---- */
/* Polls, events, verification and the watchdog of every comm; true on
 * progress (a state change, a completion). The caller arms the next poll. */
bool ncfsm__progress(ncfsm_loop *loop);
/* Something the progress timer must watch: a comm in progress, a control
 * step, a launch not final, works in flight, exchanges. */
bool ncfsm__poll_pending(ncfsm_loop *loop);

/* ---- watchdog.c ---- */
void ncfsm__watchdog(ncfsm_comm *c, uint64_t now);

/* ---- children.c ---- */
/* actions hand_children, hand_children_end: the child gets its handle. */
void ncfsm__children_hand(ncfsm_comm *parent);
/* The parent failed or was aborted before its call was final: the child
 * fails with the reason. */
void ncfsm__children_orphan(ncfsm_comm *parent, const char *why);
/* action become_ready of a split child: its rank and size from NCCL (false:
 * the child failed). */
bool ncfsm__child_geometry(ncfsm_comm *c);

#endif
