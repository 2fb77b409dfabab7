/* The actions of fsm/comm.def: what the engine does on a transition, one
 * function per distinct job, dispatched by ncfsm__fire through the table.
 * An action never fires an event; the caller of ncfsm__fire decides what
 * comes next (for example the error policy after act_fail_pending). */
#include <assert.h>
#include <stdio.h>

#include "fsm/internal.h"

typedef void (*action_fn)(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from);

/* The loop issues the init (or first posts the unique id exchange) at its
 * next turn. */
static void act_accept_init(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  c->loop->ctl = true;
  c->loop->kick = true;
}

/* An NCCL call is in progress (R1, R2): the state's POLL flag makes the loop
 * poll it; restart the burst of immediate polls. The phase deadline is set
 * by ncfsm__fire on entry into a DEADLINE state. */
static void act_watch_phase(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  c->loop->poll_iter = 0;
}

/* Ops deferred while init was in progress launch at the next turn. */
static void act_launch_deferred(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  c->ready_once = true;
  if (c->bq_head) c->loop->kick = true;
}

/* The op is linked into the loop's open group by the submitting call. */
static void act_collect_in_group(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  assert(c->ngroup > 0);
}

/* ncfsm_group_end queued the batch in every comm's launch queue. */
static void act_queue_group(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  assert(c->ngroup == 0);
  if (c->bq_head) c->loop->kick = true;
}

static void act_record_events(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  ncfsm__launch_final(c);
  if (c->state == NCFSM_STATE_DRAINING) c->loop->ctl = true; /* finalize may be due */
  if (c->bq_head) c->loop->kick = true;
}

static void act_drain_then_finalize(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  c->loop->ctl = true;
  c->loop->kick = true;
}

static void act_finalized(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  /* Works in flight complete on their events (FINALIZED keeps WORKS). */
}

/* R6: the caller observed the comm's streams right before ncclCommRevoke;
 * whatever was not seen complete then is stopped and its outputs are
 * untrusted, even if its event completes later. */
static void act_revoke_works(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  ncfsm__fail_all(c, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED);
}

static void act_fail_unobserved(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  ncfsm__fail_all(c, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED);
}

/* R10: the comm's outputs are untrusted; every unfinished work fails with
 * the cause. */
static void act_fail_pending(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  ncfsm__fail_all(c, ev == NCFSM_EV_TIMEOUT ? NCFSM_WORK_TIMED_OUT : NCFSM_WORK_FAILED, c->cause);
  ncfsm__split_orphan(c, ncfsm_err_name(c->cause));
}

static void act_queue_abort(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  c->loop->ctl = true;
  c->loop->kick = true;
}

static void act_abort_works(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  ncfsm__fail_all(c, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED);
  ncfsm__split_orphan(c, "it was aborted");
}

/* Guard IDLE held: nothing is unfinished; fail defensively all the same, a
 * work must never outlive its communicator. */
static void act_close_idle(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  ncfsm__fail_all(c, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED);
}

static void act_release_backend(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  c->bcomm = NULL;
  ncfsm__fail_all(c, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED);
}

static void act_watch_split(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  c->loop->poll_iter = 0;
}

/* NCCL_SHRINK_ABORT (or a shrink of a failed or revoked comm) terminates the
 * comm's outstanding work: nothing of it will be seen complete (R7). */
static void act_terminate_works(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  ncfsm__fail_all(c, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED);
  c->loop->poll_iter = 0;
}

static void act_hand_children(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  ncfsm__split_hand(c);
  if (c->bq_head) c->loop->kick = true; /* ops queued while splitting */
}

static void act_hand_children_end(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  ncfsm__split_hand(c);
  ncfsm__set_error(c, "ncclCommShrink terminated this communicator's work: use the child; abort this one "
                      "(R7: abort, not destroy)");
  if (!c->failure[0]) snprintf(c->failure, sizeof c->failure, "%s", c->last_error);
}

static void act_watch_child(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  c->loop->poll_iter = 0;
}

static void act_fail_mismatched(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  (void)ev;
  (void)from;
  ncfsm__strict_fail_batch(c);
}

static void act_engine_defect(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_state_t from) {
  ncfsm__fail_all(c, NCFSM_WORK_FAILED, c->cause);
}

static const action_fn actions[] = {
#define NCFSM_ACTION(name, desc) [NCFSM_ACT_##name] = act_##name,
#include "fsm/comm.def"
};
_Static_assert(sizeof actions / sizeof *actions == NCFSM_ACTION_COUNT, "one function per action");

void ncfsm__act(ncfsm_comm *c, ncfsm_action_t a, ncfsm_event_t ev, ncfsm_state_t from) {
  actions[a](c, ev, from);
}
