/* The actions of fsm/comm.def: what the engine does on a transition, one
 * function per distinct job, dispatched through the table (the
 * _Static_assert below binds one function to each action). An action sees
 * the comm in its new state; it may fire one follow-up event as its last
 * step (fail_pending fires POLICY, a refused revoke fires ASYNC_ERROR). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "fsm/engine.h"

#define ACT(name) static void act_##name(void *obj, void *payload)
#define COMM ncfsm_comm *c = obj; ncfsm__cev *p = payload; (void)p

ACT(accept_init) {
  COMM;
  c->rank = p->rank;
  c->nranks = p->nranks;
  c->uid = *p->id;
  c->comm_id = XXH3_64bits(p->id, sizeof *p->id);
  ncfsm__peers_changed(c->loop);
  c->boot = p->boot;
  c->uid_buf = p->uid_buf;
  c->nroots = p->nroots;
}

/* The broadcast is done: root 0's id is the comm's; the comm id follows
 * from every root's id, the same on every rank (one root: the hash of rank
 * 0's id, as ncfsm_comm_init makes it). */
ACT(id_known) {
  COMM;
  memcpy(&c->uid, c->uid_buf, sizeof c->uid);
  c->comm_id = XXH3_64bits(c->uid_buf, (size_t)c->nroots * NCFSM_UNIQUE_ID_BYTES);
  ncfsm__peers_changed(c->loop);
  c->boot = NULL;
  if (c->nroots == 1) { /* several: kept for ncclCommInitRankScalable, freed at the init */
    free(c->uid_buf);
    c->uid_buf = NULL;
  }
}

ACT(become_ready) {
  COMM;
  if (c->nranks <= 0 && !ncfsm__child_geometry(c)) return; /* it failed instead */
  if (c->bq_head) c->loop->kick = true;
}

ACT(queue_group) {
  COMM;
  if (c->bq_head) c->loop->kick = true;
}

ACT(record_events) {
  COMM;
  ncfsm__launch_final(c);
  if (c->bq_head) c->loop->kick = true;
  if (ncfsm__has(c, NCFSM_SF_CONTROL)) c->loop->ctl = true; /* finalize may be due */
}

/* R6: what completed before the revoke keeps its result (the call observed
 * the completions before this step); what did not is stopped by it, and its
 * event completing later proves nothing. */
/* A rank's collectives in flight were ended here: its peers' matching ones
 * can never complete, so the verification tells them (the first failure of
 * the clique names this rank). */
static void tell_peers_if_launched(ncfsm_comm *c, const char *why) {
  if (c->vops && (c->launching || ncfsm__comm_inflight(c))) c->vops->failed(c, NCFSM_ERR_ABORTED, why);
}

ACT(revoke) {
  COMM;
  c->be_calls++;
  int rc = c->be->revoke(c->bcomm, 0);
  if (NCFSM__IS_ERR(rc)) {
    p->result = NCFSM_ERR_BACKEND;
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(rc), rc, "ncclCommRevoke");
    return;
  }
  p->result = NCFSM_OK;
  tell_peers_if_launched(c, "it was revoked with collectives in flight (R6)");
  ncfsm__fail_all(c, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED);
}

ACT(fail_unobserved) {
  COMM;
  ncfsm__fail_all(c, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED);
}

static void failure_text(const ncfsm_comm *c, const ncfsm__cev *p, char *msg, size_t n) {
  const char *txt = c->be->last_error && p->code != NCFSM__NCCL_SUCCESS ? c->be->last_error(c->bcomm) : NULL;
  snprintf(msg, n, "%s in state %s: %s (backend %s%s%s)", p->what ? p->what : "failure",
           ncfsm_state_name((ncfsm_state_t)p->from), ncfsm_err_name(p->cause), ncfsm__nccl_result_name(p->code),
           txt && *txt ? ": " : "", txt && *txt ? txt : "");
}

/* R10: the comm's outputs are untrusted: every unfinished work fails (what
 * completed was observed before this step: ncfsm__comm_fail). Every error
 * dumps the recorder before the policy acts. */
ACT(fail_pending) {
  COMM;
  char msg[512];
  failure_text(c, p, msg, sizeof msg);
  c->async_code = p->code;
  c->cause = p->cause;
  ncfsm__set_error(c, "%s; outputs of unfinished works are untrusted; abort the communicator (R10)", msg);
  if (!c->failure[0]) snprintf(c->failure, sizeof c->failure, "%s", c->last_error);
  NCFSM_WARN(NCFSM__SUB_FSM, "%s", c->last_error);
  if (c->vops) c->vops->failed(c, p->cause, c->failure); /* the other ranks learn it (not back: ERR_PEER) */
  ncfsm__fail_all(c, p->cause == NCFSM_ERR_TIMEOUT ? NCFSM_WORK_TIMED_OUT : NCFSM_WORK_FAILED, p->cause);
  ncfsm__children_orphan(c, ncfsm_err_name(p->cause));
  ncfsm__comm_dump(c, NULL, p->cause == NCFSM_ERR_MISMATCH ? "verify" : p->cause == NCFSM_ERR_TIMEOUT ? "timeout" : "error");
  ncfsm__cev pol = {.cause = p->cause, .code = p->code, .what = p->what, .from = p->from};
  ncfsm__comm_fire(c, NCFSM_EV_POLICY, &pol);
}

ACT(note_failure) {
  COMM;
  char msg[512];
  failure_text(c, p, msg, sizeof msg);
  bool ended = ncfsm__has(c, NCFSM_SF_END) || c->state == NCFSM_STATE_NEW;
  ncfsm__set_error(c, "%s; the communicator is in state %s already: call %s", msg, ncfsm_state_name((ncfsm_state_t)c->state),
                   ended ? "ncfsm_comm_release" : "ncfsm_comm_abort");
}

ACT(abort_works) {
  COMM;
  tell_peers_if_launched(c, "it was aborted with collectives in flight (R5)");
  ncfsm__fail_all(c, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED);
  ncfsm__children_orphan(c, "it was aborted");
}

/* Guard IDLE held: nothing is unfinished; fail defensively all the same, a
 * work must never outlive its communicator. */
ACT(close_idle) {
  COMM;
  ncfsm__fail_all(c, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED);
}

ACT(release_backend) {
  COMM;
  c->bcomm = NULL;
  ncfsm__fail_all(c, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED);
  if (c->vops) c->vops->ended(c); /* the program may close the comm's bootstrap now */
}

/* NCCL_SHRINK_ABORT (or a shrink of a failed or revoked comm) terminates the
 * comm's outstanding work: nothing of it will be seen complete (R7). */
ACT(terminate_works) {
  COMM;
  ncfsm__fail_all(c, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED);
}

ACT(hand_children) {
  COMM;
  ncfsm__children_hand(c);
  if (c->bq_head) c->loop->kick = true; /* ops queued while splitting */
}

ACT(hand_children_end) {
  COMM;
  ncfsm__children_hand(c);
  ncfsm__set_error(c, "ncclCommShrink terminated this communicator's work: use the child; abort this one "
                      "(R7: abort, never destroy)");
  if (!c->failure[0]) snprintf(c->failure, sizeof c->failure, "%s", c->last_error);
}

ACT(take_handle) {
  COMM;
  c->bcomm = c->split_bcomm;
  c->split_bcomm = NULL;
  c->split_parent = NULL;
  if (!c->bcomm)
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, NCFSM__NCCL_INTERNAL_ERROR,
                     "the parent's call is final but wrote no handle for this child");
}

ACT(fail_mismatched) {
  COMM;
  if (p->work && p->work->batch) ncfsm__batch_fail(c->loop, p->work->batch, NCFSM_WORK_FAILED, NCFSM_ERR_MISMATCH);
}

/* The policy's part of the comm's message (the failure stays as it was). */
static void policy_note(ncfsm_comm *c, const char *what) {
  char keep[440];
  snprintf(keep, sizeof keep, "%.439s", c->last_error);
  snprintf(c->last_error, sizeof c->last_error, "%s; %s", keep, what);
}

ACT(policy_revoke) {
  COMM;
  act_revoke(obj, payload);
  if (c->state == NCFSM_STATE_REVOKING) policy_note(c, "the error policy revoked it (R6)");
}

ACT(policy_abort) {
  COMM;
  if (c->opts.on_error == NCFSM_ON_ERROR_REVOKE)
    policy_note(c, p->from == NCFSM_STATE_REVOKING ? "the error policy aborts it (revoke did not reach quiescence)"
                                                   : "the error policy aborts it (revoke is not possible here)");
  else if (c->opts.on_error == NCFSM_ON_ERROR_SHRINK)
    policy_note(c, "the error policy is shrink but no recovery is armed (ncfsm_comm_set_recovery): it aborts the comm");
  else
    policy_note(c, "the error policy aborts it at the loop's next turn (R5)");
}

ACT(policy_exit) {
  COMM;
  fprintf(stderr, "ncfsm: %s; exiting (on_error=exit)\n", c->last_error);
  exit(3);
}

ACT(start_recovery) {
  COMM;
  c->rops->start(c, c->failure);
}

/* The user's reference goes: c may be freed here (nothing may touch it after). */
ACT(release_handle) {
  COMM;
  ncfsm_loop *loop = c->loop;
  if (c->close) ncfsm__close_deliver(c); /* the callback, on the loop thread; the close's reference keeps c */
  ncfsm__comm_unref(c);
  ncfsm__shutdown_check(loop);
}

ACT(engine_defect) {
  COMM;
  c->cause = p->cause;
  if (!c->failure[0]) snprintf(c->failure, sizeof c->failure, "%s", c->last_error);
  if (c->vops) c->vops->failed(c, c->cause, c->failure);
  ncfsm__fail_all(c, NCFSM_WORK_FAILED, c->cause);
  ncfsm__children_orphan(c, "engine defect");
  ncfsm__cev pol = {.cause = p->cause, .code = p->code, .what = p->what, .from = p->from};
  ncfsm__comm_fire(c, NCFSM_EV_POLICY, &pol);
}

void (*const ncfsm__comm_acts[NCFSM__CA_COUNT])(void *, void *) = {
#define NCFSM_ACTION(name, desc) [NCFSM__CA_##name] = act_##name,
#define act_none NULL
#include "fsm/comm.def"
#undef act_none
};
