/* Generated from fsm/comm.def and fsm/work.def by tools/fsm2dot --header;
 * do not edit (make docs regenerates it; tests/golden fails when it drifts).
 * The public vocabulary of the state machines: a communicator's states, its
 * events (state callbacks and traces name them), the calls of the legality
 * table, the state attributes, and a work's states. Guards, actions and
 * transitions are internal (fsm/comm.def). */
#ifndef NCFSM_STATES_H
#define NCFSM_STATES_H

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator's states (fsm/comm.def). */
typedef enum ncfsm_state {
  NCFSM_STATE_NEW, /* created, not initialised */
  NCFSM_STATE_ID_QUEUED, /* ncfsm_comm_init_boot accepted: the loop posts the unique id broadcast on the bootstrap at its next turn */
  NCFSM_STATE_ID_EXCHANGE, /* the unique id broadcast is in flight on the bootstrap; the loop tests it */
  NCFSM_STATE_INIT_QUEUED, /* the unique id is known: the loop issues ncclCommInitRankConfig at its next turn */
  NCFSM_STATE_CHILD_QUEUED, /* the child of a split, shrink or grow: waits for the parent's call to write its handle (R8) */
  NCFSM_STATE_INIT_IN_PROGRESS, /* init issued; async state ncclInProgress until it polls to success (R1) */
  NCFSM_STATE_READY, /* async state ncclSuccess; NCCL accepts calls; no op of this comm in an open group */
  NCFSM_STATE_GROUP_OPEN, /* ops of this comm are collected in an open group (R3); they launch after its outermost end, batches closed before it launch meanwhile */
  NCFSM_STATE_LAUNCH_IN_PROGRESS, /* a launch's group end returned ncclInProgress; only poll/abort/revoke reach NCCL (R2) */
  NCFSM_STATE_DRAINING, /* finalize accepted; the comm's queued ops launch before ncclCommFinalize (R4) */
  NCFSM_STATE_DRAIN_LAUNCH_IN_PROGRESS, /* finalize accepted while a launch is in progress; ncclCommFinalize waits for it (R2, R4) */
  NCFSM_STATE_FINALIZING, /* ncclCommFinalize issued; it polls to success once outstanding work is flushed (R4) */
  NCFSM_STATE_FINALIZED, /* finalize done; only destroy or abort remain (R4) */
  NCFSM_STATE_SPLITTING, /* ncclCommSplit, ncclCommShrink (default mode) or ncclCommGrow returned on this comm; its async state is ncclInProgress until the children's handles are written (R7, R8); ops queue meanwhile */
  NCFSM_STATE_SHRINKING, /* ncclCommShrink with NCCL_SHRINK_ABORT, or of a failed or revoked comm, returned: this comm's work was terminated; it polls until the call is final (R7) */
  NCFSM_STATE_SHRUNK, /* the shrink that terminated this comm's work is done and the child has its handle: only abort remains (R7: abort, never destroy; NCCL 2.31+ hangs survivors that destroy it) */
  NCFSM_STATE_REVOKING, /* ncclCommRevoke issued; in progress until quiescent (R6); works not seen complete have failed */
  NCFSM_STATE_REVOKED, /* revoked and quiescent; destroy, shrink or abort (R6) */
  NCFSM_STATE_INIT_FAILED, /* init failed or timed out before the comm was ever ready: there is no usable NCCL communicator; only abort remains */
  NCFSM_STATE_ERROR, /* async error, timeout or failed call after the comm was ready; every unfinished work failed with the cause; outputs untrusted (R10) */
  NCFSM_STATE_ABORT_QUEUED, /* the error policy queued an abort; the loop issues it at its next turn, with every other queued abort in one group (R5) */
  NCFSM_STATE_CLOSING, /* ncclCommDestroy or ncclCommAbort runs on the loop thread (blocking; the loop's lock is released meanwhile) */
  NCFSM_STATE_CLOSED, /* destroyed or aborted; no work is left; only release remains */
  NCFSM_STATE_RELEASED, /* the handle was released; the memory goes with the last reference (works the user still holds) */
  NCFSM_STATE_COUNT
} ncfsm_state_t;

/* State attributes (ncfsm_state_flags). */
#define NCFSM_SF_POLL 0x1u /* an NCCL call is in progress: the loop polls ncclCommGetAsyncError (R1, R2); column poll */
#define NCFSM_SF_DEADLINE 0x2u /* the watchdog's phase deadline runs (timeout_ms from entry) */
#define NCFSM_SF_WORKS 0x4u /* works may be in flight: streams drained, per-work deadlines, async state watched (R10) */
#define NCFSM_SF_LAUNCH 0x8u /* queued batches of this comm may be launched */
#define NCFSM_SF_CONTROL 0x10u /* the loop makes a call for this comm at its next turn; column control */
#define NCFSM_SF_LIVE 0x20u /* in service: a lost peer fails it, /healthz counts it */
#define NCFSM_SF_FAILED 0x40u /* it failed: outputs of its unfinished works are untrusted (R10) */
#define NCFSM_SF_END 0x80u /* its NCCL communicator is being destroyed or gone */

/* What moves a communicator from state to state (fsm/comm.def). */
typedef enum ncfsm_event {
  NCFSM_EV_INIT, /* call: ncfsm_comm_init accepted (the unique id is given) */
  NCFSM_EV_INIT_BOOT, /* call: ncfsm_comm_init_boot accepted (the unique id comes through the bootstrap) */
  NCFSM_EV_ID_POSTED, /* loop: the loop posted the unique id broadcast */
  NCFSM_EV_ID_KNOWN, /* loop: the unique id broadcast is done */
  NCFSM_EV_INIT_ISSUED, /* loop: the loop called ncclCommInitRankConfig */
  NCFSM_EV_INIT_DONE, /* loop: init returned or polled to ncclSuccess */
  NCFSM_EV_INIT_CHILD, /* call: this comm is the child of a split, shrink or grow that was issued (or a joining rank's grow) */
  NCFSM_EV_HANDED, /* loop: the parent's call is final and wrote this child's handle (R8); a joining rank's grow returned it */
  NCFSM_EV_ENLIST, /* call: an op of this comm joined the open group */
  NCFSM_EV_GROUP_CLOSE, /* call: outermost group end; the group's ops of this comm queue for launch */
  NCFSM_EV_LAUNCH_PENDING, /* loop: a launch's group end left the comm ncclInProgress */
  NCFSM_EV_LAUNCH_FINAL, /* loop: a launch returned or polled to ncclSuccess */
  NCFSM_EV_FINALIZE, /* call: ncfsm_comm_finalize accepted */
  NCFSM_EV_FINALIZE_ISSUED, /* loop: queue drained; the loop called ncclCommFinalize */
  NCFSM_EV_FINALIZE_DONE, /* loop: finalize returned or polled to ncclSuccess */
  NCFSM_EV_SPLIT, /* call: ncfsm_comm_split, ncfsm_comm_grow or a default-mode ncfsm_comm_shrink of a ready comm is issued on this (parent) comm */
  NCFSM_EV_SHRINK_TERMINATE, /* call: an ncfsm_comm_shrink that ends this comm's life is issued: abort mode, or of a failed or revoked comm (R7) */
  NCFSM_EV_SPLIT_DONE, /* loop: the parent's call is final: the children's handles are written (R8) */
  NCFSM_EV_REVOKE, /* call: ncfsm_comm_revoke accepted, or the error policy revokes: ncclCommRevoke runs */
  NCFSM_EV_REVOKE_DONE, /* loop: revoke polled to quiescence */
  NCFSM_EV_ASYNC_ERROR, /* loop: a backend call or poll returned an error, or the comm failed otherwise (payload: cause, code, what) */
  NCFSM_EV_TIMEOUT, /* loop: a watchdog deadline passed (phase, work or verification) */
  NCFSM_EV_POLICY, /* loop: right after a failure: the error policy (opts.on_error) decides what follows */
  NCFSM_EV_MISMATCH, /* loop: strict verification: a queued collective's fingerprints differ across ranks; no rank launches it (payload: the work) */
  NCFSM_EV_DESTROY, /* call: ncfsm_comm_destroy accepted; ncclCommDestroy runs */
  NCFSM_EV_ABORT, /* call: ncfsm_comm_abort accepted; ncclCommAbort runs */
  NCFSM_EV_ABORT_ISSUED, /* loop: the loop issues a queued abort; ncclCommAbort runs */
  NCFSM_EV_CLOSE_DONE, /* loop: ncclCommDestroy or ncclCommAbort returned */
  NCFSM_EV_CLOSE_FAILED, /* loop: ncclCommDestroy returned an error: the NCCL communicator is still there */
  NCFSM_EV_RELEASE, /* call: ncfsm_comm_release accepted */
  NCFSM_EV_INVALID, /* loop: an event the table does not allow in the state happened (an engine defect) */
  NCFSM_EVENT_COUNT
} ncfsm_event_t;

/* The calls of the legality table (ncfsm_legality). */
typedef enum ncfsm_call {
  NCFSM_CALL_INIT, /* ncfsm_comm_init */
  NCFSM_CALL_ALLREDUCE, /* ncfsm_allreduce */
  NCFSM_CALL_BROADCAST, /* ncfsm_broadcast */
  NCFSM_CALL_REDUCE, /* ncfsm_reduce */
  NCFSM_CALL_ALLGATHER, /* ncfsm_allgather */
  NCFSM_CALL_REDUCESCATTER, /* ncfsm_reducescatter */
  NCFSM_CALL_ALLTOALL, /* ncfsm_alltoall */
  NCFSM_CALL_GATHER, /* ncfsm_gather */
  NCFSM_CALL_SCATTER, /* ncfsm_scatter */
  NCFSM_CALL_SEND, /* ncfsm_send */
  NCFSM_CALL_RECV, /* ncfsm_recv */
  NCFSM_CALL_FINALIZE, /* ncfsm_comm_finalize */
  NCFSM_CALL_DESTROY, /* ncfsm_comm_destroy */
  NCFSM_CALL_ABORT, /* ncfsm_comm_abort */
  NCFSM_CALL_REVOKE, /* ncfsm_comm_revoke */
  NCFSM_CALL_SPLIT, /* ncfsm_comm_split */
  NCFSM_CALL_SHRINK, /* ncfsm_comm_shrink */
  NCFSM_CALL_SHRINK_ABORT, /* ncfsm_comm_shrink(NCFSM_SHRINK_ABORT) */
  NCFSM_CALL_GROW, /* ncfsm_comm_grow */
  NCFSM_CALL_GROW_ID, /* ncfsm_comm_grow_id */
  NCFSM_CALL_CHILD, /* the child argument of ncfsm_comm_split/shrink/grow */
  NCFSM_CALL_RELEASE, /* ncfsm_comm_release */
  NCFSM_CALL_CLOSE, /* ncfsm_comm_close */
  NCFSM_CALL_COUNT
} ncfsm_call_t;

/* A work's states (fsm/work.def). */
typedef enum ncfsm_work_state {
  NCFSM_WORK_QUEUED, /* accepted; waiting in a group or in its comm's launch queue for the comm to be READY */
  NCFSM_WORK_LAUNCHING, /* handed to NCCL; the group end is in progress (R2) */
  NCFSM_WORK_IN_FLIGHT, /* launch final; its completion event is recorded on its stream (R2) */
  NCFSM_WORK_COMPLETED, /* its completion event was seen complete */
  NCFSM_WORK_FAILED, /* failed: group error, async error, mismatch or backend error; outputs untrusted */
  NCFSM_WORK_TIMED_OUT, /* watchdog deadline passed; outputs untrusted */
  NCFSM_WORK_ABORTED, /* comm aborted or revoked before its completion was seen; outputs untrusted */
  NCFSM_WORK_VERIFYING, /* strict verification: queued, and every rank's fingerprint of it is being exchanged; it launches only once they all equal its own (R11) */
  NCFSM_WORK_STATE_COUNT
} ncfsm_work_state_t;

#ifdef __cplusplus
}
#endif
#endif
