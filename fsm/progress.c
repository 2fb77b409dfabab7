/* Progress: polls of the async state (states with flag POLL, whose column
 * poll names the events a poll fires, and R10's watch while works are in
 * flight), the completion events, the verification's exchanges (its hook)
 * and the watchdog, once per loop turn. */
#include "fsm/engine.h"

/* While a comm only has works in flight (no phase in progress), its async
 * state is watched (R10) at most every ASYNC_WATCH_NS: completion is seen
 * through the events, and a poll of ncclCommGetAsyncError (which joins NCCL's
 * helper thread, R9) on every tick would slow that down. */
#define ASYNC_WATCH_NS 50000ull

static bool needs_poll(ncfsm_comm *c, unsigned f, bool inflight) {
  if (f & NCFSM_SF_POLL) return true;
  if (!(f & NCFSM_SF_WORKS) || !c->bcomm || !inflight) return false;
  uint64_t now = ncfsm__turn_now(c->loop);
  if (now - c->async_watch_ns < ASYNC_WATCH_NS) return false;
  c->async_watch_ns = now;
  return true;
}

static bool poll_comm(ncfsm_comm *c) {
  const ncfsm__comm_state_cols *col = &ncfsm__comm_cols[c->state];
  int st = NCFSM__NCCL_SUCCESS;
  int rc = c->be->get_async_error(c->bcomm, &st);
  if (rc != NCFSM__NCCL_SUCCESS) st = rc;
  if (st == NCFSM__NCCL_IN_PROGRESS) return false;
  if (col->poll == NCFSM__PC_NONE) { /* R10's watch of a settled comm */
    if (!NCFSM__IS_ERR(st)) return false;
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(st), st, "ncclCommGetAsyncError");
    return true;
  }
  ncfsm_event_t ev = NCFSM__IS_ERR(st) ? col->poll_err : col->poll_ok;
  if (ev == NCFSM_EV_ASYNC_ERROR) {
    ncfsm__comm_fail(c, ev, ncfsm__cause_of(st), st,
                     col->poll == NCFSM__PC_REVOKE ? "ncclCommGetAsyncError after ncclCommRevoke (the revoke did not "
                                                     "reach quiescence)"
                                                   : "ncclCommGetAsyncError");
    return true;
  }
  ncfsm__cev p = {.cause = NCFSM__IS_ERR(st) ? ncfsm__cause_of(st) : NCFSM_OK, .code = st, .from = c->state};
  ncfsm__comm_fire(c, ev, &p);
  return true;
}

/* The comms on the active list only (fsm/active.c): a comm with nothing in
 * flight, queued or launching, in a state without polls, deadlines or
 * control steps, and whose verification needs no turn has nothing here for
 * the watchdog, the drain or the polls; it leaves the list at its visit and
 * joins it again at its next state change or queued batch. */
bool ncfsm__progress(ncfsm_loop *loop) {
  bool progress = false;
  if (loop->act_unsorted) ncfsm__active_sort(loop);
  for (ncfsm_comm *c = loop->act_head, *next; c; c = next) {
    unsigned f = ncfsm__sflags(c->state);
    bool inflight = ncfsm__comm_inflight(c);
    /* first: a drained comm needs no async watch */
    if (inflight && (f & NCFSM_SF_WORKS)) {
      int d = ncfsm__drain(c);
      if (d < 0) {
        ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, NCFSM__NCCL_UNHANDLED_CUDA_ERROR,
                         "cudaEventQuery");
        progress = true;
        next = c->act_next;
        continue;
      }
      if (d > 0) {
        progress = true;
        f = ncfsm__sflags(c->state); /* a callback-free step may have moved it (e.g. DRAINING) */
        inflight = ncfsm__comm_inflight(c);
      }
    }
    if (needs_poll(c, f, inflight)) progress |= poll_comm(c);
    if (ncfsm__verify_busy(c)) progress |= c->vops->poll(c, ncfsm__turn_now(loop));
    /* The watchdog has something to look at only with a phase deadline, a
     * launch or works in flight (the times it compares). */
    if ((c->opts.timeout_ms || c->work_deadlines || c->verify_stall_ns) &&
        ((ncfsm__sflags(c->state) & NCFSM_SF_DEADLINE) || c->launching || ncfsm__comm_inflight(c)))
      ncfsm__watchdog(c, ncfsm__turn_now(loop));
    next = c->act_next;
    if (!ncfsm__comm_wants_turn(c)) ncfsm__comm_delist(c);
  }
  return progress;
}

bool ncfsm__poll_pending(ncfsm_loop *loop) {
  for (ncfsm_comm *c = loop->act_head; c; c = c->act_next) {
    if ((ncfsm__sflags(c->state) & (NCFSM_SF_POLL | NCFSM_SF_DEADLINE | NCFSM_SF_CONTROL)) || c->launching ||
        ncfsm__comm_inflight(c) || ncfsm__verify_busy(c))
      return true;
  }
  return false;
}
