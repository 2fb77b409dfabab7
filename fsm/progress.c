/* Progress: polls of the async state (states with NCFSM_SF_POLL, and R10's
 * watch while works are in flight) and of the completion events, then the
 * watchdog, once per loop turn. */
#include "fsm/internal.h"

/* While a comm only has works in flight (no phase in progress), its async
 * state is watched (R10) at most every ASYNC_WATCH_NS: completion is seen
 * through the events, and a poll of ncclCommGetAsyncError (which joins NCCL's
 * helper thread, R9) on every tick would slow that down. */
#define ASYNC_WATCH_NS 50000ull

static bool has_inflight(const ncfsm_comm *c) {
  for (int i = 0; i < c->nsq; i++)
    if (c->sq[i].head) return true;
  return false;
}

static bool needs_poll(ncfsm_comm *c, uint64_t *now) {
  if (!c->bcomm) return false;
  unsigned f = ncfsm__sflags(c->state);
  if (f & NCFSM_SF_POLL) return true;
  if (!(f & NCFSM_SF_WORKS) || !has_inflight(c)) return false;
  if (!*now) *now = ncfsm__now_ns();
  if (*now - c->async_watch_ns < ASYNC_WATCH_NS) return false;
  c->async_watch_ns = *now;
  return true;
}

/* The event a poll that returns ncclSuccess fires in each polled state. */
static ncfsm_event_t success_event(ncfsm_state_t s) {
  switch (s) {
    case NCFSM_STATE_INIT_IN_PROGRESS: return NCFSM_EV_INIT_DONE;
    case NCFSM_STATE_LAUNCH_IN_PROGRESS:
    case NCFSM_STATE_DRAIN_LAUNCH_IN_PROGRESS: return NCFSM_EV_LAUNCH_FINAL;
    case NCFSM_STATE_FINALIZING: return NCFSM_EV_FINALIZE_DONE;
    case NCFSM_STATE_REVOKING: return NCFSM_EV_REVOKE_DONE;
    case NCFSM_STATE_SPLITTING:
    case NCFSM_STATE_SHRINKING: return NCFSM_EV_SPLIT_DONE;
    default: return NCFSM_EVENT_COUNT; /* a watch of a settled comm */
  }
}

static bool poll_comm(ncfsm_comm *c) {
  int st = NCFSM__NCCL_SUCCESS;
  int rc = c->be->get_async_error(c->bcomm, &st);
  if (rc != NCFSM__NCCL_SUCCESS) st = rc;
  if (NCFSM__IS_ERR(st) && c->state == NCFSM_STATE_SHRINKING) {
    /* A failed parent keeps its error: its shrink is final once the state
     * is not InProgress any more (R7). */
    ncfsm__fire(c, NCFSM_EV_SPLIT_DONE, NCFSM_OK);
    return true;
  }
  if (NCFSM__IS_ERR(st)) {
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(st), st,
                     c->state == NCFSM_STATE_REVOKING ? "ncclCommGetAsyncError after ncclCommRevoke (the "
                                                        "revoke did not reach quiescence)"
                                                      : "ncclCommGetAsyncError");
    return true;
  }
  if (st == NCFSM__NCCL_IN_PROGRESS) return false;
  ncfsm_event_t ev = success_event(c->state);
  if (ev == NCFSM_EVENT_COUNT) return false;
  /* A split child learns its rank and size from NCCL only now (R2: NCCL
   * answers them once the init is done); a failure fails it instead. */
  if (ev == NCFSM_EV_INIT_DONE && c->nranks <= 0 && !ncfsm__split_geometry(c)) return true;
  ncfsm__fire(c, ev, NCFSM_OK);
  return true;
}

/* Observe completion events in stream order; works before the first
 * incomplete event complete. */
static bool drain_streams(ncfsm_comm *c) {
  bool progress = false;
  for (int i = 0; i < c->nsq; i++) {
    ncfsm__squeue *q = &c->sq[i];
    while (q->head) {
      ncfsm__mark *m = q->head->mark;
      int rc = c->be->event_query(m->event);
      if (rc == 1) break;
      if (rc != 0) {
        ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, NCFSM__NCCL_UNHANDLED_CUDA_ERROR,
                         "cudaEventQuery");
        return true;
      }
      while (q->head && q->head->mark == m) {
        ncfsm_work *w = q->head;
        q->head = w->next;
        if (w->start_mark && c->be->event_elapsed_ms(w->start_mark->event, m->event, &w->device_ms) != 0)
          w->device_ms = -1;
        ncfsm__work_finish(w, NCFSM_WORK_COMPLETED, NCFSM_OK);
      }
      if (!q->head) q->tail = NULL;
      progress = true;
    }
  }
  return progress;
}

/* Observe what already completed (revoke looks right before it stops the
 * comm's work: later completions are not trusted). */
bool ncfsm__drain(ncfsm_comm *c) { return c->nsq && drain_streams(c); }

bool ncfsm__progress(ncfsm_loop *loop) {
  bool progress = false;
  uint64_t now = 0;
  for (ncfsm_comm *c = loop->comms; c; c = c->next) {
    /* first: a drained comm needs no async watch */
    if (c->nsq && ncfsm__has(c, NCFSM_SF_WORKS)) progress |= drain_streams(c);
    if (needs_poll(c, &now)) progress |= poll_comm(c);
    if (c->sp_head || c->sf_head || c->snomem || (c->comp && ncfsm__comp_busy(c))) {
      if (!now) now = ncfsm__now_ns();
      progress |= ncfsm__strict_poll(c, now);
    }
    if (c->vq_head) {
      if (!now) now = ncfsm__now_ns();
      progress |= ncfsm__verify_poll(c, now);
    }
    if (c->opts.timeout_ms || c->work_deadlines) {
      if (!now) now = ncfsm__now_ns();
      ncfsm__watchdog(c, now);
    }
  }
  return progress;
}
