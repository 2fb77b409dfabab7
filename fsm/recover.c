/*
 * Recovery without restart (issue 10, item 5; docs/recovery.md): when an
 * armed communicator fails (error policy NCFSM_ON_ERROR_SHRINK) or its
 * bootstrap reports a lost rank, the survivors
 *
 *   1. revoke it where the runtime has ncclCommRevoke (R6: stops what is in
 *      flight), while
 *   2. they agree on who is alive through the bootstrap (an epoch of
 *      ncfsm_boot_agree_post: the ranks that posted it),
 *   3. shrink it to the survivors (ncclCommShrink, NCCL_SHRINK_ABORT from a
 *      failed comm; R7), or, where that is not possible or fails (no
 *      excluded rank, no Shrink, NCCL refusing a shrink of a failed comm),
 *      abort it and initialise a new comm over the survivors' bootstrap,
 *   4. abort the old comm (R7: abort, not destroy) and report the new one
 *      through the callback, armed in turn with the survivors' bootstrap.
 *
 * The works of the old comm failed once when it failed; the new comm's
 * seqs start at 0. The steps run on the loop thread, from a timer of the
 * loop's event_base, outside any turn (they use the public calls, which run
 * at once there); a step that waits re-arms the timer (1 ms).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "fsm/internal.h"
#include "ncfsm/bootstrap.h"

#define LOCK(l) pthread_mutex_lock(&(l)->mu)
#define UNLOCK(l) pthread_mutex_unlock(&(l)->mu)

enum phase { P_ARMED, P_START, P_AGREE, P_PLAN, P_SHRINK, P_SHRINK_VOTE, P_REINIT, P_DONE };

struct ncfsm__recovery {
  ncfsm_loop *loop;
  ncfsm_comm *old;      /* held (refs) from the start of a recovery to its report */
  ncfsm_boot *boot;     /* the agreement channel: the bootstrap the comm was made with */
  ncfsm_comm_opts fresh_opts;
  ncfsm_sim_opts fresh_sim;
  char fresh_name[64];
  ncfsm_recover_cb cb;
  void *arg;
  struct event *timer;
  enum phase phase;
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
  uint64_t t_fail, t_agreed;
  char why[384];
  struct ncfsm__recovery *next; /* loop->recoveries */
};

static void schedule(struct ncfsm__recovery *r, int us) {
  struct timeval tv = {0, us};
  evtimer_add(r->timer, &tv);
}

static void rec_free(struct ncfsm__recovery *r) {
  if (r->timer) event_free(r->timer);
  if (r->agree) ncfsm_boot_req_free(r->agree);
  if (r->vote_req) ncfsm_boot_req_free(r->vote_req);
  free(r->alive);
  free(r->excluded);
  free(r->votes);
  free(r);
}

static ncfsm_comm *new_fresh(struct ncfsm__recovery *r) {
  ncfsm_comm *c = NULL;
  ncfsm_comm_opts o = r->fresh_opts;
  o.sim = &r->fresh_sim;
  o.name = r->fresh_name;
  o.verify = NCFSM_VERIFY_OFF;
  if (ncfsm_comm_new(r->loop, &o, &c) != NCFSM_OK) return NULL;
  return c;
}

static void finish(struct ncfsm__recovery *r, ncfsm_result_t status) {
  if (r->agree) {
    ncfsm_boot_req_free(r->agree);
    r->agree = NULL;
  }
  if (r->vote_req) {
    ncfsm_boot_req_free(r->vote_req);
    r->vote_req = NULL;
  }
  ncfsm_recovery_report rep;
  memset(&rep, 0, sizeof rep);
  rep.status = status;
  rep.old = r->old;
  rep.fresh = status == NCFSM_OK ? r->fresh : NULL;
  rep.boot = status == NCFSM_OK ? r->sub : NULL;
  rep.excluded = r->excluded;
  rep.nexcluded = r->nexcluded;
  rep.how = r->how ? r->how : "-";
  rep.epoch = r->epoch;
  uint64_t now = ncfsm__now_ns();
  rep.detect_to_agreed_ms = r->t_agreed ? (double)(r->t_agreed - r->t_fail) / 1e6 : -1;
  rep.detect_to_ready_ms = status == NCFSM_OK ? (double)(now - r->t_fail) / 1e6 : -1;
  rep.t_fail_ns = r->t_fail;
  snprintf(rep.why, sizeof rep.why, "%s", r->why);
  /* R7: the old comm is aborted, never destroyed */
  if (ncfsm_comm_state(r->old) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(r->old);
  if (status != NCFSM_OK && r->fresh) {
    if (ncfsm_comm_state(r->fresh) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(r->fresh);
    ncfsm_comm_release(r->fresh);
    r->fresh = NULL;
  }
  if (status != NCFSM_OK && r->sub) {
    ncfsm_boot_close(r->sub);
    r->sub = NULL;
  }
  /* the new comm is armed in turn, on the survivors' bootstrap */
  if (status == NCFSM_OK) {
    ncfsm_recovery_opts ro = {r->sub, &r->fresh_opts, r->cb, r->arg};
    ncfsm_comm_set_recovery(r->fresh, &ro);
  }
  r->phase = P_DONE;
  ncfsm_comm *old = r->old;
  if (r->cb) r->cb(&rep, r->arg);
  LOCK(r->loop);
  ncfsm__comm_unref(old);
  UNLOCK(r->loop);
}

static void fail_recovery(struct ncfsm__recovery *r, const char *what, const char *detail) {
  char msg[384];
  snprintf(msg, sizeof msg, "%s: %s", what, detail);
  snprintf(r->why, sizeof r->why, "%.383s", msg);
  NCFSM_WARN(NCFSM__SUB_FSM, "[%s] recovery failed: %s", r->old->name, msg);
  finish(r, NCFSM_ERR_BOOTSTRAP);
}

static void start_reinit(struct ncfsm__recovery *r) {
  if (ncfsm_comm_state(r->old) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(r->old);
  if (r->fresh) {
    if (ncfsm_comm_state(r->fresh) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(r->fresh);
    ncfsm_comm_release(r->fresh);
  }
  r->fresh = new_fresh(r);
  r->how = "reinit";
  if (!r->fresh || ncfsm_comm_init_boot(r->fresh, r->sub) != NCFSM_OK) {
    fail_recovery(r, "a new communicator over the survivors' bootstrap could not be initialised",
                  r->fresh ? ncfsm_comm_last_error(r->fresh) : "out of memory");
    return;
  }
  r->phase = P_REINIT;
  schedule(r, 1000);
}

/* Every survivor takes the same path: a decision that depends on a rank's own
 * view (may it shrink? did its shrink work?) is a vote, an allgather of one
 * byte on the survivors' bootstrap, and the path is taken only if every
 * survivor voted yes. */
static bool vote_post(struct ncfsm__recovery *r, bool yes) {
  int n = ncfsm_boot_size(r->sub);
  if (!r->votes && !(r->votes = calloc((size_t)n, 1))) return false;
  r->my_vote = yes;
  return ncfsm_boot_allgather_post(r->sub, &r->my_vote, r->votes, 1, &r->vote_req) == NCFSM_OK;
}

/* 1: every survivor said yes, 0: someone said no, -1: not done, -2: failed. */
static int vote_result(struct ncfsm__recovery *r) {
  ncfsm_result_t t = ncfsm_boot_test(r->vote_req);
  if (t == NCFSM_ERR_AGAIN) return -1;
  ncfsm_boot_req_free(r->vote_req);
  r->vote_req = NULL;
  if (t != NCFSM_OK) return -2;
  int all = 1;
  for (int i = 0; i < ncfsm_boot_size(r->sub); i++) all &= r->votes[i] == 1;
  return all;
}

static void step(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  struct ncfsm__recovery *r = arg;
  ncfsm_comm *old = r->old;
  if (r->phase != P_ARMED && r->phase != P_DONE) {
    ncfsm_state_t os = ncfsm_comm_state(old);
    if (r->phase < P_PLAN && (os == NCFSM_STATE_CLOSED || os == NCFSM_STATE_CLOSING)) {
      /* the program aborted the comm meanwhile (e.g. at its end): nothing to replace */
      fail_recovery(r, "the communicator was aborted before its recovery could replace it", ncfsm_comm_failure(old));
      return;
    }
  }
  switch (r->phase) {
    case P_ARMED:
    case P_DONE: return;
    case P_START: {
      r->epoch++;
      /* R6 where the runtime has it: stop what is in flight (ERROR -> REVOKING -> REVOKED) */
      if (ncfsm_comm_state(old) == NCFSM_STATE_ERROR) ncfsm_comm_revoke(old);
      ncfsm_result_t pr = ncfsm_boot_agree_post(r->boot, r->epoch, &r->agree);
      if (pr != NCFSM_OK) {
        fail_recovery(r, "the bootstrap refused the survivors' agreement", ncfsm_boot_last_error(r->boot));
        return;
      }
      r->phase = P_AGREE;
      schedule(r, 1000);
      return;
    }
    case P_AGREE: {
      ncfsm_result_t t = ncfsm_boot_test(r->agree);
      ncfsm_state_t s = ncfsm_comm_state(old);
      if (t == NCFSM_ERR_AGAIN || s == NCFSM_STATE_REVOKING) {
        schedule(r, 1000);
        return;
      }
      if (t != NCFSM_OK) {
        fail_recovery(r, "the survivors' agreement failed", ncfsm_boot_last_error(r->boot));
        return;
      }
      int size = ncfsm_boot_size(r->boot);
      r->alive = calloc((size_t)size, 1);
      r->excluded = calloc((size_t)size, sizeof *r->excluded);
      if (!r->alive || !r->excluded ||
          ncfsm_boot_agree_result(r->agree, r->alive, &r->nalive) != NCFSM_OK) {
        fail_recovery(r, "the survivors' agreement has no result", ncfsm_boot_last_error(r->boot));
        return;
      }
      for (int i = 0; i < size; i++)
        if (!r->alive[i]) r->excluded[r->nexcluded++] = i;
      r->t_agreed = ncfsm__now_ns();
      if (ncfsm_boot_survivors(r->boot, r->agree, &r->sub) != NCFSM_OK) {
        fail_recovery(r, "the survivors' bootstrap could not be opened", ncfsm_boot_last_error(r->boot));
        return;
      }
      ncfsm_boot_req_free(r->agree); /* a bootstrap with a request out cannot be closed */
      r->agree = NULL;
      /* May this rank shrink? Some rank left, the comm has an NCCL communicator
       * that was ready once, and the runtime has Shrink. Every survivor votes. */
      s = ncfsm_comm_state(old);
      unsigned feat = old->be->features();
      bool can = r->nexcluded > 0 && (s == NCFSM_STATE_ERROR || s == NCFSM_STATE_REVOKED) && old->ready_once &&
                 old->be->comm_shrink && (feat & NCFSM__HAS_SHRINK);
      if (!vote_post(r, can)) {
        fail_recovery(r, "the survivors' vote could not be posted", ncfsm_boot_last_error(r->sub));
        return;
      }
      r->phase = P_PLAN;
      schedule(r, 1000);
      return;
    }
    case P_PLAN: {
      int v = vote_result(r);
      if (v == -1) {
        schedule(r, 1000);
        return;
      }
      if (v == -2) {
        fail_recovery(r, "the survivors' vote failed", ncfsm_boot_last_error(r->sub));
        return;
      }
      if (v == 1) {
        r->fresh = new_fresh(r);
        r->how = "shrink";
        if (r->fresh && ncfsm_comm_shrink(old, r->excluded, r->nexcluded, NCFSM_SHRINK_ABORT, r->fresh) == NCFSM_OK) {
          r->phase = P_SHRINK;
          schedule(r, 1000);
          return;
        }
        /* refused here: vote no, with the others */
        NCFSM_INFO(NCFSM__SUB_FSM, "[%s] recovery: the shrink was refused (%s)", old->name, ncfsm_comm_last_error(old));
        if (!vote_post(r, false)) {
          fail_recovery(r, "the survivors' vote could not be posted", ncfsm_boot_last_error(r->sub));
          return;
        }
        r->phase = P_SHRINK_VOTE;
        schedule(r, 1000);
        return;
      }
      start_reinit(r);
      return;
    }
    case P_SHRINK: {
      ncfsm_state_t fs = ncfsm_comm_state(r->fresh);
      bool ok = fs == NCFSM_STATE_READY;
      if (!ok && fs != NCFSM_STATE_ERROR && fs != NCFSM_STATE_CLOSED) {
        schedule(r, 1000); /* the child's own deadline bounds this */
        return;
      }
      if (!ok)
        NCFSM_INFO(NCFSM__SUB_FSM, "[%s] recovery: the shrunk communicator failed (%s)", old->name,
                   ncfsm_comm_failure(r->fresh));
      if (!vote_post(r, ok)) {
        fail_recovery(r, "the survivors' vote could not be posted", ncfsm_boot_last_error(r->sub));
        return;
      }
      r->phase = P_SHRINK_VOTE;
      schedule(r, 1000);
      return;
    }
    case P_SHRINK_VOTE: {
      int v = vote_result(r);
      if (v == -1) {
        schedule(r, 1000);
        return;
      }
      if (v == -2) {
        fail_recovery(r, "the survivors' vote failed", ncfsm_boot_last_error(r->sub));
        return;
      }
      if (v == 1) {
        finish(r, NCFSM_OK);
        return;
      }
      NCFSM_INFO(NCFSM__SUB_FSM, "[%s] recovery: a survivor's shrink failed; a new communicator instead", old->name);
      start_reinit(r);
      return;
    }
    case P_REINIT: {
      ncfsm_state_t fs = ncfsm_comm_state(r->fresh);
      if (fs == NCFSM_STATE_READY) {
        finish(r, NCFSM_OK);
        return;
      }
      if (fs == NCFSM_STATE_ERROR || fs == NCFSM_STATE_CLOSED) {
        fail_recovery(r, "the new communicator over the survivors failed", ncfsm_comm_failure(r->fresh));
        return;
      }
      schedule(r, 1000);
      return;
    }
  }
}

/* With the loop's lock: the comm failed (or lost a rank); start once. */
void ncfsm__recover_start(ncfsm_comm *c, const char *why) {
  struct ncfsm__recovery *r = c->recovery;
  if (!r || r->phase != P_ARMED) return;
  r->phase = P_START;
  r->t_fail = ncfsm__now_ns();
  snprintf(r->why, sizeof r->why, "%s", why);
  c->refs++; /* released at the report */
  schedule(r, 0);
}

/* The bootstrap lost a rank: fail the comm (its works fail once, with the
 * cause); an armed recovery starts through the error policy. */
static void peer_lost(ncfsm_boot *b, int rank, const char *why, void *arg) {
  (void)b;
  struct ncfsm__recovery *r = arg;
  LOCK(r->loop);
  ncfsm_comm *c = r->old;
  char what[400];
  snprintf(what, sizeof what, "rank %d lost (bootstrap: %s)", rank, why);
  /* Only a comm in service fails: ranks that end a job close their bootstraps
   * one after the other, and a comm that is finalizing (or done) ends anyway. */
  ncfsm_state_t s = c ? c->state : NCFSM_STATE_CLOSED;
  bool in_service = s == NCFSM_STATE_READY || s == NCFSM_STATE_GROUP_OPEN || s == NCFSM_STATE_LAUNCH_IN_PROGRESS ||
                    s == NCFSM_STATE_SPLITTING || s == NCFSM_STATE_INIT_QUEUED || s == NCFSM_STATE_INIT_IN_PROGRESS;
  if (r->phase == P_ARMED && in_service)
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_ASYNC, NCFSM__NCCL_SUCCESS, what);
  else if (c)
    NCFSM_INFO(NCFSM__SUB_FSM, "[%s rank %d] %s: ignored in state %s", c->name, c->rank, what, ncfsm_state_name(s));
  ncfsm__loop_wake(r->loop);
  UNLOCK(r->loop);
}

static ncfsm_result_t disarm(ncfsm_comm *c) {
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  struct ncfsm__recovery *r = c->recovery;
  if (r && r->phase != P_ARMED && r->phase != P_DONE) {
    ncfsm__set_error(c, "ncfsm_comm_set_recovery(NULL): a recovery of this comm is running; wait for its report");
    UNLOCK(loop);
    return NCFSM_ERR_ILLEGAL_STATE;
  }
  UNLOCK(loop);
  if (r) ncfsm_boot_on_peer_lost(r->boot, NULL, NULL);
  LOCK(loop);
  ncfsm__recover_detach(c);
  UNLOCK(loop);
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_comm_set_recovery(ncfsm_comm *c, const ncfsm_recovery_opts *o) {
  if (!c || c->magic != NCFSM__COMM_MAGIC || (o && !o->boot)) return NCFSM_ERR_INVALID_ARGUMENT;
  if (!o) return disarm(c);
  ncfsm_loop *loop = c->loop;
  struct ncfsm__recovery *r = calloc(1, sizeof *r);
  if (!r) return NCFSM_ERR_NO_MEMORY;
  r->loop = loop;
  r->old = c;
  r->boot = o->boot;
  if (o->fresh_opts) r->fresh_opts = *o->fresh_opts;
  else r->fresh_opts = c->opts;
  r->fresh_sim = r->fresh_opts.sim ? *r->fresh_opts.sim : c->sim;
  snprintf(r->fresh_name, sizeof r->fresh_name, "%s", r->fresh_opts.name ? r->fresh_opts.name : c->name);
  r->cb = o->cb;
  r->arg = o->arg;
  r->timer = evtimer_new(ncfsm_loop_base(loop), step, r);
  if (!r->timer) {
    free(r);
    return NCFSM_ERR_NO_MEMORY;
  }
  LOCK(loop);
  if (c->recovery || !ncfsm__has(c, NCFSM_SF_WORKS | NCFSM_SF_POLL | NCFSM_SF_DEADLINE)) {
    ncfsm__set_error(c, "ncfsm_comm_set_recovery: %s (state %s); arm a comm once, between its init and its "
                        "failure", c->recovery ? "recovery is armed already" : "the comm is not live",
                     ncfsm_state_name(c->state));
    UNLOCK(loop);
    rec_free(r);
    return c->recovery ? NCFSM_ERR_INVALID_USAGE : NCFSM_ERR_ILLEGAL_STATE;
  }
  c->recovery = r;
  r->next = loop->recoveries;
  loop->recoveries = r;
  UNLOCK(loop);
  ncfsm_result_t pr = ncfsm_boot_on_peer_lost(o->boot, peer_lost, r);
  if (pr != NCFSM_OK && pr != NCFSM_ERR_UNSUPPORTED) return pr;
  return NCFSM_OK; /* without peer-loss reports (pmix), failures still start it */
}

ncfsm_result_t ncfsm_comm_recover(ncfsm_comm *c) {
  if (!c || c->magic != NCFSM__COMM_MAGIC) return NCFSM_ERR_INVALID_ARGUMENT;
  LOCK(c->loop);
  ncfsm_result_t r = NCFSM_OK;
  if (!c->recovery) {
    ncfsm__set_error(c, "ncfsm_comm_recover: no recovery is armed on this comm: call ncfsm_comm_set_recovery "
                        "first");
    r = NCFSM_ERR_INVALID_USAGE;
  } else if (c->recovery->phase != P_ARMED) {
    ncfsm__set_error(c, "ncfsm_comm_recover: a recovery of this comm has started already");
    r = NCFSM_ERR_ILLEGAL_STATE;
  } else {
    if (ncfsm__has(c, NCFSM_SF_WORKS | NCFSM_SF_POLL))
      ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_ASYNC, NCFSM__NCCL_SUCCESS,
                       "ncfsm_comm_recover: recovery requested");
    ncfsm__recover_start(c, "recovery requested (ncfsm_comm_recover)");
  }
  UNLOCK(c->loop);
  return r;
}

/* ncfsm_loop_close, before anything else: a recovery still running (its
 * steps will never run again) lets go of what it holds (its new comm, the
 * survivors' bootstrap, its requests, its reference on the old comm),
 * without a report. Without the lock. */
void ncfsm__recover_cancel_all(ncfsm_loop *loop) {
  for (;;) {
    LOCK(loop);
    struct ncfsm__recovery *r = loop->recoveries;
    while (r && (r->phase == P_ARMED || r->phase == P_DONE)) r = r->next;
    if (r) r->phase = P_DONE;
    UNLOCK(loop);
    if (!r) return;
    NCFSM_INFO(NCFSM__SUB_FSM, "[%s] recovery cancelled: the loop closes", r->old ? r->old->name : "?");
    evtimer_del(r->timer);
    if (r->agree) ncfsm_boot_req_free(r->agree);
    if (r->vote_req) ncfsm_boot_req_free(r->vote_req);
    r->agree = r->vote_req = NULL;
    if (r->fresh) {
      if (ncfsm_comm_state(r->fresh) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(r->fresh);
      ncfsm_comm_release(r->fresh);
      r->fresh = NULL;
    }
    if (r->sub) ncfsm_boot_close(r->sub);
    r->sub = NULL;
    LOCK(loop);
    if (r->old) ncfsm__comm_unref(r->old); /* the reference taken at its start */
    UNLOCK(loop);
  }
}

/* Loop close: pending recoveries end without a report. */
void ncfsm__recover_free_all(ncfsm_loop *loop) {
  while (loop->recoveries) {
    struct ncfsm__recovery *r = loop->recoveries;
    loop->recoveries = r->next;
    if (r->old && r->old->recovery == r) r->old->recovery = NULL;
    rec_free(r);
  }
}

/* A comm being freed (or disarmed): it leaves its recovery, which stays in
 * the loop's list until the loop closes (its bootstrap may still report to
 * it: peer_lost ignores a recovery without a comm). A started recovery holds
 * its comm, so this runs only before or after one. */
void ncfsm__recover_detach(ncfsm_comm *c) {
  struct ncfsm__recovery *r = c->recovery;
  if (!r) return;
  c->recovery = NULL;
  r->old = NULL;
  r->phase = P_DONE;
}
