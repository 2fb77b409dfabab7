/* The watchdog (phase and work deadlines) and the error policy: how a comm
 * fails, whatever found the failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm/internal.h"

ncfsm_result_t ncfsm__cause_of(int code) {
  switch (code) {
    case NCFSM__NCCL_INVALID_ARGUMENT:
    case NCFSM__NCCL_INVALID_USAGE:
      return NCFSM_ERR_BACKEND; /* NCCL refused a call */
    default:
      /* remote, system, internal, CUDA, timeout: the comm failed, whether a
       * group end or a later poll saw it first (a dead peer is one cause) */
      return NCFSM_ERR_ASYNC;
  }
}

static void work_timed_out(ncfsm_comm *c, const ncfsm_work *w) {
  char what[200];
  snprintf(what, sizeof what, "watchdog: %s seq %llu did not complete within %llu ms",
           ncfsm_opkind_name(w->op.kind), (unsigned long long)w->fp.seq,
           (unsigned long long)(w->timeout_ms ? w->timeout_ms : c->opts.timeout_ms));
  ncfsm__comm_fail(c, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, NCFSM__NCCL_SUCCESS, what);
}

void ncfsm__watchdog(ncfsm_comm *c, uint64_t now) {
  if (c->work_deadlines && ncfsm__has(c, NCFSM_SF_WORKS)) /* per-work deadlines: every work */
    for (int i = 0; i < c->nsq; i++)
      for (ncfsm_work *w = c->sq[i].head; w; w = w->next)
        if (w->deadline_ns && now > w->deadline_ns) {
          work_timed_out(c, w);
          return;
        }
  if (!c->opts.timeout_ms) return;
  unsigned f = ncfsm__sflags(c->state);
  if ((f & NCFSM_SF_DEADLINE) && c->phase_deadline && now > c->phase_deadline) {
    char what[200];
    snprintf(what, sizeof what, "watchdog: state %s did not end within %llu ms",
             ncfsm_state_name(c->state), (unsigned long long)c->opts.timeout_ms);
    ncfsm__comm_fail(c, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, NCFSM__NCCL_IN_PROGRESS, what);
    return;
  }
  if (!(f & NCFSM_SF_WORKS)) return;
  for (int i = 0; i < c->nsq; i++) {
    ncfsm_work *w = c->sq[i].head;
    if (w && w->deadline_ns && now > w->deadline_ns) {
      work_timed_out(c, w);
      return;
    }
  }
}

void ncfsm__comm_fail(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_result_t cause, int code,
                      const char *what) {
  ncfsm_state_t from = c->state;
  const char *txt = c->be->last_error && code != NCFSM__NCCL_SUCCESS ? c->be->last_error(c->bcomm) : NULL;
  char msg[512];
  snprintf(msg, sizeof msg, "%s in state %s: %s (backend %s%s%s)", what, ncfsm_state_name(from),
           ncfsm_err_name(cause), ncfsm__nccl_result_name(code), txt && *txt ? ": " : "",
           txt && *txt ? txt : "");
  if (!ncfsm__can_fire(c, ev)) {
    /* Already failed or closing: keep what happened, change nothing. */
    bool closed = from == NCFSM_STATE_CLOSED || from == NCFSM_STATE_CLOSING;
    ncfsm__set_error(c, "%s; the communicator is in state %s already: call %s", msg,
                     ncfsm_state_name(from), closed ? "ncfsm_comm_release" : "ncfsm_comm_abort");
    return;
  }
  /* What completed before the failure keeps its result: observe the
   * completion events once more before every unfinished work fails (as revoke
   * does). Found with push completion: a rank lost right after a collective
   * completed everywhere failed it on a survivor whose event had not been
   * polled yet, and that survivor then redid a step the others had done. */
  if (!c->failing && c->nsq && ncfsm__has(c, NCFSM_SF_WORKS)) {
    c->failing = true;
    ncfsm__drain(c);
    c->failing = false;
    if (!ncfsm__can_fire(c, ev)) return; /* the drain found a failure of its own */
  }
  c->async_code = code;
  c->cause = cause;
  ncfsm__set_error(c, "%s; outputs of unfinished works are untrusted; abort the communicator (R10)", msg);
  if (!c->failure[0]) snprintf(c->failure, sizeof c->failure, "%s", c->last_error);
  NCFSM_WARN(NCFSM__SUB_FSM, "%s", c->last_error);
  ncfsm__fire(c, ev, cause);
  if (c->state != NCFSM_STATE_ERROR) return;
  /* Every error dumps the recorder first, before the policy acts (issue 9). */
  ncfsm__comm_dump(c, NULL, cause == NCFSM_ERR_MISMATCH ? "verify" : ev == NCFSM_EV_TIMEOUT ? "timeout" : "error");
  switch (c->opts.on_error) {
    case NCFSM_ON_ERROR_STAY: break;
    case NCFSM_ON_ERROR_EXIT:
      fprintf(stderr, "ncfsm: %s; exiting (on_error=exit)\n", c->last_error);
      exit(3);
    case NCFSM_ON_ERROR_SHRINK:
      if (c->recovery) {
        ncfsm__recover_start(c, c->failure);
        break;
      }
      ncfsm__set_error(c, "%.400s; the error policy is shrink but no recovery is armed "
                          "(ncfsm_comm_set_recovery): it aborts the comm", c->failure);
      ncfsm__fire(c, NCFSM_EV_POLICY_ABORT, cause);
      break;
    case NCFSM_ON_ERROR_REVOKE: {
      /* Once: a revoke that itself failed (REVOKING -> ERROR) is aborted. */
      char keep[440];
      snprintf(keep, sizeof keep, "%.439s", c->last_error);
      if (from != NCFSM_STATE_REVOKING && ncfsm__comm_revoke_now(c) == NCFSM_OK) {
        snprintf(c->last_error, sizeof c->last_error, "%s; the error policy revoked it (R6)", keep);
        break;
      }
      snprintf(c->last_error, sizeof c->last_error, "%s; the error policy aborts it (revoke %s)", keep,
               from == NCFSM_STATE_REVOKING ? "did not reach quiescence" : "is not possible here");
    }
    /* fall through */
    case NCFSM_ON_ERROR_ABORT:
    default:
      ncfsm__fire(c, NCFSM_EV_POLICY_ABORT, cause);
      break;
  }
}

ncfsm_result_t ncfsm__comm_revoke_now(ncfsm_comm *c) {
  unsigned feat = c->bcomm && c->be->comm_features ? c->be->comm_features(c->bcomm) : c->be->features();
  if (!(feat & NCFSM__HAS_REVOKE)) {
    ncfsm__set_error(c, "ncfsm_comm_revoke: the %s runtime (NCCL %d) has no ncclCommRevoke; it needs "
                        "NCCL >= 2.28.7 (R6); use ncfsm_comm_abort",
                     c->be->name, c->be->version());
    return NCFSM_ERR_UNSUPPORTED;
  }
  if (!c->bcomm) {
    ncfsm__set_error(c, "ncfsm_comm_revoke: no NCCL communicator exists in state %s (init failed); "
                        "use ncfsm_comm_abort", ncfsm_state_name(c->state));
    return NCFSM_ERR_ILLEGAL_STATE;
  }
  /* R6: what completed before the revoke keeps its result; what did not is
   * stopped by it, and its event completing later proves nothing. */
  ncfsm__drain(c);
  c->be_calls++;
  int rc = c->be->revoke(c->bcomm, 0);
  if (NCFSM__IS_ERR(rc)) {
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(rc), rc, "ncclCommRevoke");
    ncfsm__set_error(c, "ncfsm_comm_revoke: ncclCommRevoke returned %s; the communicator is %s now: "
                        "call ncfsm_comm_abort",
                     ncfsm__nccl_result_name(rc), ncfsm_state_name(c->state));
    return NCFSM_ERR_BACKEND;
  }
  ncfsm__fire(c, NCFSM_EV_REVOKE, NCFSM_OK); /* act_revoke_works (R6) */
  return NCFSM_OK;
}

/* ---- the flight recorder's view of works, and dumps ------------------------- */

void ncfsm__rec_work(ncfsm_work *w) {
  ncfsm__rec_entry *e = ncfsm__rec_get(w->comm->rec, w->rec);
  if (!e) return; /* recorder off, or the entry was overwritten */
  e->fp.seq = w->fp.seq;
  e->group = w->group;
  e->state = (int32_t)w->state;
  e->t_launch_ns = w->t_launch;
  e->t_final_ns = w->t_final;
  if (w->notified) {
    e->result = (int32_t)w->status;
    e->t_complete_ns = w->t_complete;
  }
}

ncfsm_result_t ncfsm__comm_dump(ncfsm_comm *c, const char *dir, const char *reason) {
  bool automatic = strcmp(reason, "request") != 0; /* error, timeout, signal: no complaint without a dir */
  if (!dir || !*dir) dir = c->dump_dir;
  if (!c->rec) {
    if (!automatic)
      ncfsm__set_error(c, "ncfsm_comm_dump: the flight recorder is off (opts.trace_buffer 0, "
                          "NCFSM_TRACE_BUFFER=0)");
    return NCFSM_ERR_UNSUPPORTED;
  }
  if (!*dir) {
    if (!automatic)
      ncfsm__set_error(c, "ncfsm_comm_dump: no directory: pass one, or set opts.dump_dir / NCFSM_DUMP_DIR");
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  unsigned cap = ncfsm__rec_capacity(c->rec);
  ncfsm__rec_entry *e = malloc((size_t)cap * sizeof *e);
  if (!e) return NCFSM_ERR_NO_MEMORY;
  uint64_t total = 0;
  unsigned n = ncfsm__rec_snapshot(c->rec, e, cap, &total);
  ncfsm__rec_meta m = {
      .rank = c->rank,
      .nranks = c->nranks,
      .comm_name = c->name,
      .comm_id = c->comm_id,
      .backend = c->be->name,
      .nccl_version = c->be->version(),
      .reason = reason,
      .state = ncfsm_state_name(c->state),
      .failure = c->failure,
      .next_seq = c->coll_seq,
      .rolling_hash = c->hash,
      .capacity = cap,
      .total = total,
      .time_ns = ncfsm__now_ns(),
      .timeout_ms = c->opts.timeout_ms,
  };
  ncfsm_result_t r = c->rank < 0 ? NCFSM_ERR_ILLEGAL_STATE : ncfsm__rec_dump_async(dir, &m, e, n, NULL, NULL);
  free(e);
  if (r != NCFSM_OK)
    NCFSM_WARN(NCFSM__SUB_FSM, "[%s rank %d] flight recorder dump (%s) into %s not queued: %s", c->name,
               c->rank, reason, dir, ncfsm_err_name(r));
  else
    NCFSM_INFO(NCFSM__SUB_FSM, "[%s rank %d] flight recorder dump (%s, %u entries) queued into %s", c->name,
               c->rank, reason, n, dir);
  return r;
}
