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

void ncfsm__watchdog(ncfsm_comm *c, uint64_t now) {
  if (!c->opts.timeout_ms) return;
  unsigned f = ncfsm_state_flags(c->state);
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
      char what[200];
      snprintf(what, sizeof what, "watchdog: %s seq %llu did not complete within %llu ms",
               ncfsm_opkind_name(w->op.kind), (unsigned long long)w->fp.seq,
               (unsigned long long)c->opts.timeout_ms);
      ncfsm__comm_fail(c, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, NCFSM__NCCL_SUCCESS, what);
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
  c->async_code = code;
  c->cause = cause;
  ncfsm__set_error(c, "%s; outputs of unfinished works are untrusted; abort the communicator (R10)", msg);
  if (!c->failure[0]) snprintf(c->failure, sizeof c->failure, "%s", c->last_error);
  NCFSM_WARN(NCFSM__SUB_FSM, "%s", c->last_error);
  ncfsm__fire(c, ev, cause);
  if (c->state != NCFSM_STATE_ERROR) return;
  if (c->opts.on_error == NCFSM_ON_ERROR_ABORT) {
    ncfsm__fire(c, NCFSM_EV_POLICY_ABORT, cause);
  } else if (c->opts.on_error == NCFSM_ON_ERROR_EXIT) {
    fprintf(stderr, "ncfsm: %s; exiting (on_error=exit)\n", c->last_error);
    exit(3);
  }
}
