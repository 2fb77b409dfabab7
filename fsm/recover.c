/*
 * Recovery without restart (docs/recovery.md): the machine of fsm/recover.def
 * bound to the engine. A recovery is stepped (step()) on the loop's thread
 * with the loop's lock held whenever something it waits for may have
 * changed: a bootstrap request it posted completed (its callback asks the
 * loop for a step), or the old or the new comm changed state (the hooks
 * below, through struct ncfsm__recovery_ops). It arms no timers of its
 * own: each comm's deadline bounds each wait. It uses the calls' locked
 * steps (fsm/api-int.h), never the engine's internals; its report, the
 * arming of the new comm and closing a bootstrap run without the lock.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/settings.h"
#include "fsm/init.h"
#include "ncfsm/bootstrap.h"

struct ncfsm__recovery {
  unsigned state;       /* fsm/recover.def */
  ncfsm_loop *loop;
  ncfsm_comm *old;      /* held (refs) from the failure to the report */
  ncfsm_boot *boot;     /* the agreement channel: the bootstrap the comm was made with */
  ncfsm_comm_opts fresh_opts;
  ncfsm_sim_opts fresh_sim;
  char fresh_name[64];
  ncfsm_recover_cb cb;
  void *arg;
  uint64_t epoch;
  ncfsm_boot_req *agree;
  ncfsm_boot_req *vote_req; /* an allgather of one byte per survivor on the survivors' bootstrap */
  uint8_t my_vote, *votes;
  ncfsm_boot *sub;      /* the survivors' bootstrap, handed to the new comm's recovery */
  uint8_t *alive;
  int nalive;
  int *excluded;
  int nexcluded;
  ncfsm_comm *fresh;
  const char *how;
  uint64_t t_fail, t_agreed, t_launch_wait;
  char why[384];
  char fresh_err[320];  /* why the last new comm could not be made */
  struct ncfsm__recovery *next; /* loop->recoveries */
};

#define LOCK NCFSM__LOCK
#define UNLOCK NCFSM__UNLOCK

static void fire(struct ncfsm__recovery *r, ncfsm__recover_event_t ev, const char *what);
static const ncfsm__recovery_ops armed_ops, watch_ops;
static ncfsm_result_t disarm(ncfsm_comm *c);

/* ---- stepping -------------------------------------------------------------------------------- */

static void step(void *arg);

/* With the lock: a step at the loop's next pass. */
static void schedule(struct ncfsm__recovery *r) {
  if (ncfsm__loop_defer(r->loop, step, r) != NCFSM_OK)
    NCFSM_WARN(NCFSM__SUB_FSM, "recovery: out of memory for a step; it goes on at the next state change");
}

/* A bootstrap request of the recovery completed (any thread, no lock). */
static void req_done(ncfsm_boot_req *req, ncfsm_result_t status, void *arg) {
  (void)req;
  (void)status;
  struct ncfsm__recovery *r = arg;
  ncfsm_loop_call(r->loop, step, r);
}

/* Every survivor takes the same path: a decision that depends on a rank's own
 * view is a vote, an allgather of one byte on the survivors' bootstrap. */
static bool vote_post(struct ncfsm__recovery *r, bool yes) {
  int n = ncfsm_boot_size(r->sub);
  if (!r->votes && !(r->votes = calloc((size_t)n, 1))) return false;
  r->my_vote = yes;
  if (ncfsm_boot_allgather_post(r->sub, &r->my_vote, r->votes, 1, &r->vote_req) != NCFSM_OK) return false;
  ncfsm_boot_req_on_done(r->vote_req, req_done, r);
  return true;
}

/* The vote's event: VOTED_YES, VOTED_NO, STEP_FAILED, or none yet (-1). */
static int vote_event(struct ncfsm__recovery *r) {
  ncfsm_result_t t = ncfsm_boot_test(r->vote_req);
  if (t == NCFSM_ERR_AGAIN) return -1;
  ncfsm_boot_req_free(r->vote_req);
  r->vote_req = NULL;
  if (t != NCFSM_OK) return NCFSM__RE_STEP_FAILED;
  int all = 1;
  for (int i = 0; i < ncfsm_boot_size(r->sub); i++) all &= r->votes[i] == 1;
  return all ? NCFSM__RE_VOTED_YES : NCFSM__RE_VOTED_NO;
}

/* OLD_CLOSED's payload: the old comm ended under the recovery. */
static const char *old_closed(struct ncfsm__recovery *r, const ncfsm_comm *old) {
  snprintf(r->fresh_err, sizeof r->fresh_err,
           "the comm was aborted (by the program or its error policy) before the recovery could replace it; it had "
           "failed: %.200s",
           old && old->failure[0] ? old->failure : "-");
  return r->fresh_err;
}

/* The old comm's NCCL async state is still ncclInProgress (it failed while a launch of it was
 * not final, e.g. told of a peer's failure first): NCCL refuses a shrink of it then, with
 * NCCL_SHRINK_ABORT too (R2), and the survivors would vote for a shrink that fails on this rank.
 * Polled for at most LAUNCH_WAIT_NS after the agreement; past that the shrink is tried anyway
 * (refused, the survivors re-initialise). */
#define LAUNCH_WAIT_NS 2000000000ull
static bool launch_pending(struct ncfsm__recovery *r) {
  ncfsm_comm *old = r->old;
  if (!old || !old->bcomm || !old->be->get_async_error) return false;
  if (!r->t_launch_wait) r->t_launch_wait = ncfsm__now_ns();
  else if (ncfsm__now_ns() - r->t_launch_wait > LAUNCH_WAIT_NS) return false;
  int st = NCFSM__NCCL_SUCCESS;
  int rc = old->be->get_async_error(old->bcomm, &st);
  return !NCFSM__IS_ERR(rc) && st == NCFSM__NCCL_IN_PROGRESS;
}

static void step(void *arg) {
  struct ncfsm__recovery *r = arg;
  ncfsm_loop *loop = r->loop;
  LOCK(loop);
  for (;;) {
    unsigned before = r->state;
    ncfsm_comm *old = r->old;
    ncfsm_state_t os = old ? (ncfsm_state_t)old->state : NCFSM_STATE_CLOSED;
    bool old_gone = os == NCFSM_STATE_CLOSING || os == NCFSM_STATE_CLOSED || os == NCFSM_STATE_RELEASED;
    ncfsm_state_t fs = r->fresh ? (ncfsm_state_t)r->fresh->state : NCFSM_STATE_COUNT;
    bool fresh_failed = fs != NCFSM_STATE_COUNT && (ncfsm__sflags(fs) & (NCFSM_SF_FAILED | NCFSM_SF_END));
    switch (r->state) {
      case NCFSM__RS_STARTING:
        if (old_gone) fire(r, NCFSM__RE_OLD_CLOSED, old_closed(r, old));
        else fire(r, NCFSM__RE_STEP, NULL);
        break;
      case NCFSM__RS_AGREEING: {
        if (old_gone) {
          fire(r, NCFSM__RE_OLD_CLOSED, old_closed(r, old));
          break;
        }
        ncfsm_result_t t = ncfsm_boot_test(r->agree);
        if (t == NCFSM_ERR_AGAIN || os == NCFSM_STATE_REVOKING) break;
        if (t == NCFSM_OK && launch_pending(r)) { /* the shrink waits for it (R2), a turn at a time */
          schedule(r);
          break;
        }
        if (t != NCFSM_OK) fire(r, NCFSM__RE_STEP_FAILED, "the survivors' agreement failed");
        else fire(r, NCFSM__RE_AGREED, NULL);
        break;
      }
      case NCFSM__RS_PLANNING: {
        if (old_gone) {
          fire(r, NCFSM__RE_OLD_CLOSED, old_closed(r, old));
          break;
        }
        int ev = vote_event(r);
        if (ev >= 0) fire(r, (ncfsm__recover_event_t)ev, "the survivors' vote failed");
        break;
      }
      case NCFSM__RS_SHRINKING:
      case NCFSM__RS_REINIT:
        if (fs == NCFSM_STATE_READY) fire(r, NCFSM__RE_FRESH_READY, NULL);
        else if (fresh_failed)
          fire(r, NCFSM__RE_FRESH_FAILED, "the new communicator over the survivors failed");
        break;
      case NCFSM__RS_CONFIRMING: {
        int ev = vote_event(r);
        if (ev >= 0) fire(r, (ncfsm__recover_event_t)ev, "the survivors' vote failed");
        break;
      }
      default: break;
    }
    if (r->state == before) break;
  }
  UNLOCK(loop);
}

/* ---- the report --------------------------------------------------------------------------- */

struct report {
  struct ncfsm__recovery *r;
  ncfsm_recovery_report rep;
  int excluded[];
};

/* Without the lock: arm the new comm (OK) or close the survivors' bootstrap
 * (failure), tell the program, let go of the old comm. */
static void deliver(void *arg) {
  struct report *q = arg;
  struct ncfsm__recovery *r = q->r;
  q->rep.excluded = q->excluded;
  if (q->rep.status == NCFSM_OK) {
    ncfsm_recovery_opts ro = {q->rep.boot, &r->fresh_opts, r->cb, r->arg};
    if (ncfsm_comm_set_recovery(q->rep.fresh, &ro) != NCFSM_OK)
      NCFSM_WARN(NCFSM__SUB_FSM, "[%s] recovery: the new comm could not be armed in turn: %s", r->fresh_name,
                 ncfsm_comm_last_error(q->rep.fresh));
  } else if (r->sub) {
    ncfsm_boot_close(r->sub);
  }
  if (q->rep.status != NCFSM_OK) r->sub = NULL;
  if (r->cb) r->cb(&q->rep, r->arg);
  LOCK(r->loop);
  ncfsm__comm_unref(q->rep.old);
  UNLOCK(r->loop);
  free(q);
}

static void report(struct ncfsm__recovery *r, ncfsm_result_t status) {
  struct report *q = calloc(1, sizeof *q + (size_t)r->nexcluded * sizeof(int));
  if (!q) {
    NCFSM_WARN(NCFSM__SUB_FSM, "[%s] recovery: out of memory for its report (%s)", r->fresh_name, ncfsm_err_name(status));
    return;
  }
  q->r = r;
  if (r->nexcluded) memcpy(q->excluded, r->excluded, (size_t)r->nexcluded * sizeof(int)); /* none: excluded may be NULL */
  ncfsm_recovery_report *rep = &q->rep;
  rep->status = status;
  rep->old = r->old;
  rep->fresh = status == NCFSM_OK ? r->fresh : NULL;
  rep->boot = status == NCFSM_OK ? r->sub : NULL;
  rep->nexcluded = r->nexcluded;
  rep->how = r->how ? r->how : "-";
  rep->epoch = r->epoch;
  uint64_t now = ncfsm__now_ns();
  rep->detect_to_agreed_ms = r->t_agreed ? (double)(r->t_agreed - r->t_fail) / 1e6 : -1;
  rep->detect_to_ready_ms = status == NCFSM_OK ? (double)(now - r->t_fail) / 1e6 : -1;
  rep->t_fail_ns = r->t_fail;
  snprintf(rep->why, sizeof rep->why, "%s", r->why);
  if (status == NCFSM_OK) r->fresh = NULL; /* the program's now */
  if (ncfsm__loop_defer(r->loop, deliver, q) != NCFSM_OK) {
    free(q);
    NCFSM_WARN(NCFSM__SUB_FSM, "[%s] recovery: out of memory for its report", r->fresh_name);
  }
}

/* ---- actions ----------------------------------------------------------------------------------- */

static void free_requests(struct ncfsm__recovery *r) {
  if (r->agree) ncfsm_boot_req_free(r->agree);
  if (r->vote_req) ncfsm_boot_req_free(r->vote_req);
  r->agree = r->vote_req = NULL;
}

static void abort_comm(ncfsm_comm *c) {
  if (c && !(ncfsm__sflags(c->state) & NCFSM_SF_END)) ncfsm__comm_abort_locked(c);
}

/* The new comm in the making goes: aborted, released. */
static void drop_fresh(struct ncfsm__recovery *r) {
  ncfsm_comm *f = r->fresh;
  if (!f) return;
  r->fresh = NULL;
  abort_comm(f);
  f->rops = NULL;
  f->recovery = NULL;
  ncfsm__comm_release_locked(f);
}

/* The new comm, or NULL with why in r->fresh_err. */
static ncfsm_comm *new_fresh(struct ncfsm__recovery *r) {
  ncfsm_comm *c = NULL;
  ncfsm_comm_opts o = r->fresh_opts;
  o.sim = &r->fresh_sim;
  o.name = r->fresh_name; /* it verifies as the old one did, from its seq 0, on the survivors' bootstrap */
  ncfsm_result_t rc = ncfsm__comm_new_locked(r->loop, &o, &c);
  if (rc != NCFSM_OK) {
    snprintf(r->fresh_err, sizeof r->fresh_err, "%s",
             rc == NCFSM_ERR_NO_MEMORY ? "out of memory" : ncfsm_last_error()); /* the refusal's message */
    return NULL;
  }
  c->rops = &watch_ops; /* its state changes step the recovery */
  c->recovery = r;
  return c;
}

#define ACT(name) static void ract_##name(void *obj, void *payload)
#define REC struct ncfsm__recovery *r = obj; const char *what = payload; (void)what

ACT(hold) {
  REC;
  r->t_fail = ncfsm__now_ns();
  snprintf(r->why, sizeof r->why, "%s", what ? what : "");
  r->old->refs++; /* released at the report */
  schedule(r);
}

ACT(agree) {
  REC;
  r->epoch++;
  /* R6 where the runtime has it: stop what is in flight (ERROR -> REVOKING -> REVOKED) */
  if (r->old->state == NCFSM_STATE_ERROR && ncfsm__comm_guard(r->old, NCFSM__CG_HAS_REVOKE, NULL))
    ncfsm__comm_revoke_locked(r->old);
  if (ncfsm_boot_agree_post(r->boot, r->epoch, &r->agree) != NCFSM_OK) {
    fire(r, NCFSM__RE_STEP_FAILED, "the bootstrap refused the survivors' agreement");
    return;
  }
  ncfsm_boot_req_on_done(r->agree, req_done, r);
  schedule(r); /* the agreement may be done already (one rank) */
}

ACT(plan) {
  REC;
  int size = ncfsm_boot_size(r->boot);
  r->alive = calloc((size_t)size, 1);
  r->excluded = calloc((size_t)size, sizeof *r->excluded);
  if (!r->alive || !r->excluded || ncfsm_boot_agree_result(r->agree, r->alive, &r->nalive) != NCFSM_OK) {
    fire(r, NCFSM__RE_STEP_FAILED, "the survivors' agreement has no result");
    return;
  }
  for (int i = 0; i < size; i++)
    if (!r->alive[i]) r->excluded[r->nexcluded++] = i;
  r->t_agreed = ncfsm__now_ns();
  if (ncfsm_boot_survivors(r->boot, r->agree, &r->sub) != NCFSM_OK) {
    fire(r, NCFSM__RE_STEP_FAILED, "the survivors' bootstrap could not be opened");
    return;
  }
  ncfsm_boot_req_free(r->agree); /* a bootstrap with a request out cannot be closed */
  r->agree = NULL;
  /* May this rank shrink? Some rank left, the comm was ready once (ERROR or
   * REVOKED, not INIT_FAILED) and the runtime has Shrink. Every survivor votes. */
  ncfsm_state_t s = (ncfsm_state_t)r->old->state;
  bool can = r->nexcluded > 0 && (s == NCFSM_STATE_ERROR || s == NCFSM_STATE_REVOKED) &&
             ncfsm__comm_guard(r->old, NCFSM__CG_HAS_SHRINK, NULL);
  if (!vote_post(r, can)) fire(r, NCFSM__RE_STEP_FAILED, "the survivors' vote could not be posted");
}

ACT(shrink) {
  REC;
  r->fresh = new_fresh(r);
  r->how = "shrink";
  if (r->fresh && ncfsm__comm_shrink_locked(r->old, r->excluded, r->nexcluded, NCFSM_SHRINK_ABORT, r->fresh) == NCFSM_OK) {
    schedule(r);
    return;
  }
  /* refused here: vote no, with the others */
  NCFSM_INFO(NCFSM__SUB_FSM, "[%s] recovery: the shrink was refused (%s)", r->old->name, r->old->last_error);
  fire(r, NCFSM__RE_FRESH_FAILED, NULL);
}

ACT(vote_fresh) {
  REC;
  bool ok = r->fresh && r->fresh->state == NCFSM_STATE_READY;
  if (!ok && r->fresh)
    NCFSM_INFO(NCFSM__SUB_FSM, "[%s] recovery: the shrunk communicator failed (%s)", r->old->name, r->fresh->failure);
  if (!vote_post(r, ok)) fire(r, NCFSM__RE_STEP_FAILED, "the survivors' vote could not be posted");
}

ACT(reinit) {
  REC;
  abort_comm(r->old);
  drop_fresh(r);
  r->fresh = new_fresh(r);
  r->how = "reinit";
  if (!r->fresh || ncfsm__comm_init_boot_locked(r->fresh, r->sub) != NCFSM_OK) {
    snprintf(r->why, sizeof r->why, "a new communicator over the survivors' bootstrap could not be initialised: %.300s",
             r->fresh ? r->fresh->last_error : r->fresh_err);
    fire(r, NCFSM__RE_STEP_FAILED, r->why);
    return;
  }
  ncfsm__loop_wake(r->loop);
}

ACT(succeed) {
  REC;
  free_requests(r);
  abort_comm(r->old); /* R7: the old comm is aborted, never destroyed */
  r->fresh->rops = NULL; /* armed in turn by the report, on the survivors' bootstrap */
  r->fresh->recovery = NULL;
  report(r, NCFSM_OK);
}

ACT(fail) {
  REC;
  char msg[384];
  snprintf(msg, sizeof msg, "%.380s", what ? what : "recovery failed");
  if (strcmp(msg, r->why)) snprintf(r->why, sizeof r->why, "%.383s", msg);
  NCFSM_WARN(NCFSM__SUB_FSM, "[%s] recovery failed: %s", r->old->name, r->why);
  free_requests(r);
  abort_comm(r->old);
  drop_fresh(r);
  report(r, NCFSM_ERR_BOOTSTRAP);
}

ACT(cancel) {
  REC;
  NCFSM_INFO(NCFSM__SUB_FSM, "[%s] recovery cancelled: the loop closes", r->fresh_name);
  free_requests(r);
  drop_fresh(r);
  if (r->old) ncfsm__comm_unref(r->old); /* the reference taken at its start */
}

static void (*const recover_acts[NCFSM__RA_COUNT])(void *, void *) = {
#define NCFSM_ACTION(name, desc) [NCFSM__RA_##name] = ract_##name,
#define ract_none NULL
#include "fsm/recover.def"
#undef ract_none
};

static bool recover_guard(const void *obj, unsigned g, const void *payload) {
  (void)obj;
  (void)payload;
  return g == NCFSM__RG_ANY;
}

static const ncfsm__binding recover_binding = {&ncfsm__m_recover, recover_guard, recover_acts, NULL, NULL};

static void fire(struct ncfsm__recovery *r, ncfsm__recover_event_t ev, const char *what) {
  if (!ncfsm__m_fire(&recover_binding, r, &r->state, ev, (void *)what))
    NCFSM_INFO(NCFSM__SUB_FSM, "[%s] recovery: %s ignored in state %s", r->fresh_name, ncfsm__m_recover.events[ev].name,
               ncfsm__m_recover.states[r->state].name);
}

/* ---- the hooks ------------------------------------------------------------------------------------ */

static bool running(const struct ncfsm__recovery *r) {
  return ncfsm__m_recover.states[r->state].flags & NCFSM__RF_RUNNING;
}
/* Guard POLICY_RECOVER: armed, or running already (a failure of the old
 * comm under its recovery, e.g. a revoke that did not reach quiescence, is
 * the recovery's to handle: no abort under it). */
static bool on_armed(const ncfsm_comm *c) {
  return c->recovery && (c->recovery->state == NCFSM__RS_ARMED || running(c->recovery));
}
static void on_start(ncfsm_comm *c, const char *why) {
  struct ncfsm__recovery *r = c->recovery;
  if (running(r)) schedule(r); /* its next step sees the comm in ERROR */
  else fire(r, NCFSM__RE_COMM_FAILED, why);
}
static void on_stepped(ncfsm_comm *c) {
  struct ncfsm__recovery *r = c->recovery;
  if (r && running(r)) schedule(r);
}
/* The armed comm is freed: it leaves its recovery, which stays in the
 * loop's list until the loop closes (its bootstrap may still report to it:
 * peer_lost ignores a recovery without a comm). */
static void on_detach(ncfsm_comm *c) {
  struct ncfsm__recovery *r = c->recovery;
  c->recovery = NULL;
  c->rops = NULL;
  if (r && r->old == c) r->old = NULL;
}
static void on_detach_fresh(ncfsm_comm *c) {
  struct ncfsm__recovery *r = c->recovery;
  c->recovery = NULL;
  c->rops = NULL;
  if (r && r->fresh == c) r->fresh = NULL;
}
static bool never(const ncfsm_comm *c) {
  (void)c;
  return false;
}
static void ignore(ncfsm_comm *c, const char *why) {
  (void)c;
  (void)why;
}

static ncfsm_result_t watched(ncfsm_comm *c) { /* a fresh comm: its recovery lets go of it when it is freed */
  (void)c;
  return NCFSM_OK;
}
static bool user_held(const ncfsm_comm *c) {
  (void)c;
  return false;
}
static bool made_here(const ncfsm_comm *c) {
  (void)c;
  return true;
}
static const ncfsm__recovery_ops armed_ops = {on_armed, on_start, on_stepped, on_detach, disarm, user_held};
static const ncfsm__recovery_ops watch_ops = {never, ignore, on_stepped, on_detach_fresh, watched, made_here};

/* ---- the loop's hooks ------------------------------------------------------------------------------ */

/* ncfsm_loop_close, without the lock: a recovery still running (its steps
 * will never run again) lets go of what it holds, without a report; a
 * survivors' bootstrap is closed here, outside the lock. */
static void cancel_all(ncfsm_loop *loop) {
  LOCK(loop);
  for (struct ncfsm__recovery *r = loop->recoveries; r; r = r->next) fire(r, NCFSM__RE_CANCEL, NULL);
  struct ncfsm__recovery *r = loop->recoveries;
  UNLOCK(loop);
  for (; r; r = r->next)
    if (r->state == NCFSM__RS_CANCELLED && r->sub) {
      ncfsm_boot_close(r->sub);
      r->sub = NULL;
    }
}

static void free_all(ncfsm_loop *loop) {
  while (loop->recoveries) {
    struct ncfsm__recovery *r = loop->recoveries;
    loop->recoveries = r->next;
    if (r->old && r->old->recovery == r) on_detach(r->old);
    free_requests(r);
    free(r->alive);
    free(r->excluded);
    free(r->votes);
    free(r);
  }
}

/* ---- the API ---------------------------------------------------------------------------------------- */

/* The bootstrap lost a rank: fail the comm (its works fail once, with the
 * cause); the error policy starts the armed recovery. Only a comm in service
 * (flag LIVE) fails: ranks that end a job close their bootstraps one after
 * the other, and a comm that is finalizing (or done) ends anyway. */
static void peer_lost(ncfsm_boot *b, int rank, const char *why, void *arg) {
  (void)b;
  struct ncfsm__recovery *r = arg;
  LOCK(r->loop);
  ncfsm_comm *c = r->old;
  char what[400];
  snprintf(what, sizeof what, "rank %d lost (bootstrap: %s)", rank, why);
  if (c && r->state == NCFSM__RS_ARMED && ncfsm__has(c, NCFSM_SF_LIVE))
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_ASYNC, NCFSM__NCCL_SUCCESS, what);
  else if (c)
    NCFSM_INFO(NCFSM__SUB_FSM, "[%s rank %d] %s: ignored in state %s", c->name, c->rank, what,
               ncfsm_state_name((ncfsm_state_t)c->state));
  ncfsm__loop_wake(r->loop);
  UNLOCK(r->loop);
}

static ncfsm_result_t disarm(ncfsm_comm *c) {
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  struct ncfsm__recovery *r = c->recovery;
  if (r && c->rops == &armed_ops && r->state != NCFSM__RS_ARMED && r->state != NCFSM__RS_DONE &&
      r->state != NCFSM__RS_FAILED) {
    ncfsm__set_error(c, "ncfsm_comm_set_recovery(NULL): a recovery of this comm is running (%s); wait for its report",
                     ncfsm__m_recover.states[r->state].name);
    UNLOCK(loop);
    return NCFSM_ERR_ILLEGAL_STATE;
  }
  UNLOCK(loop);
  if (r) ncfsm_boot_on_peer_lost(r->boot, NULL, NULL);
  LOCK(loop);
  if (c->rops == &armed_ops) on_detach(c);
  UNLOCK(loop);
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_comm_set_recovery(ncfsm_comm *c, const ncfsm_recovery_opts *o) {
  if (!ncfsm__comm_ok(c) || (o && !o->boot)) return NCFSM_ERR_INVALID_ARGUMENT;
  if (!o) return disarm(c);
  ncfsm_loop *loop = c->loop;
  /* the new comm's options are checked now, not when a recovery needs them */
  ncfsm_result_t fr = o->fresh_opts ? ncfsm__comm_opts_check(o->fresh_opts, "ncfsm_comm_set_recovery") : NCFSM_OK;
  if (fr == NCFSM_OK && o->fresh_opts && o->fresh_opts->sim)
    fr = ncfsm__sim_opts_check(o->fresh_opts->sim, "ncfsm_comm_set_recovery");
  if (fr != NCFSM_OK) {
    LOCK(loop);
    ncfsm__set_error(c, "%s", ncfsm_opts_error());
    UNLOCK(loop);
    return fr;
  }
  struct ncfsm__recovery *r = calloc(1, sizeof *r);
  if (!r) return NCFSM_ERR_NO_MEMORY;
  r->state = NCFSM__RS_ARMED; /* fsm/recover.def's initial state */
  r->loop = loop;
  r->old = c;
  r->boot = o->boot;
  if (o->fresh_opts) r->fresh_opts = *o->fresh_opts;
  else r->fresh_opts = c->opts;
  r->fresh_sim = r->fresh_opts.sim ? *r->fresh_opts.sim : c->sim;
  snprintf(r->fresh_name, sizeof r->fresh_name, "%s", r->fresh_opts.name ? r->fresh_opts.name : c->name);
  r->cb = o->cb;
  r->arg = o->arg;
  LOCK(loop);
  if (c->rops == &armed_ops || !ncfsm__has(c, NCFSM_SF_WORKS | NCFSM_SF_POLL | NCFSM_SF_DEADLINE)) {
    bool armed = c->rops == &armed_ops;
    ncfsm__set_error(c, "ncfsm_comm_set_recovery: %s (state %s); arm a comm once, between its init and its failure",
                     armed ? "recovery is armed already" : "the comm is not live", ncfsm_state_name((ncfsm_state_t)c->state));
    UNLOCK(loop);
    free(r);
    return armed ? NCFSM_ERR_INVALID_USAGE : NCFSM_ERR_ILLEGAL_STATE;
  }
  c->recovery = r;
  c->rops = &armed_ops;
  r->next = loop->recoveries;
  loop->recoveries = r;
  loop->hooks.cancel = cancel_all;
  loop->hooks.free_all = free_all;
  UNLOCK(loop);
  ncfsm_result_t pr = ncfsm_boot_on_peer_lost(o->boot, peer_lost, r);
  if (pr != NCFSM_OK && pr != NCFSM_ERR_UNSUPPORTED) return pr;
  return NCFSM_OK; /* without peer-loss reports (pmix), failures still start it */
}

ncfsm_result_t ncfsm_comm_recover(ncfsm_comm *c) {
  if (!ncfsm__comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  LOCK(c->loop);
  ncfsm_result_t res = NCFSM_OK;
  struct ncfsm__recovery *r = c->rops == &armed_ops ? c->recovery : NULL;
  if (!r) {
    ncfsm__set_error(c, "ncfsm_comm_recover: no recovery is armed on this comm: call ncfsm_comm_set_recovery first");
    res = NCFSM_ERR_INVALID_USAGE;
  } else if (r->state != NCFSM__RS_ARMED) {
    ncfsm__set_error(c, "ncfsm_comm_recover: a recovery of this comm has started already (%s)",
                     ncfsm__m_recover.states[r->state].name);
    res = NCFSM_ERR_ILLEGAL_STATE;
  } else {
    if (ncfsm__has(c, NCFSM_SF_WORKS | NCFSM_SF_POLL)) {
      c->fail_own = true; /* every rank asks for it: not a failure to pass on (verification) */
      ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_ASYNC, NCFSM__NCCL_SUCCESS, "ncfsm_comm_recover: recovery requested");
      c->fail_own = false;
    }
    if (r->state == NCFSM__RS_ARMED) fire(r, NCFSM__RE_COMM_FAILED, "recovery requested (ncfsm_comm_recover)");
  }
  UNLOCK(c->loop);
  return res;
}
