/* The verifier's machine (fsm/verify.def) bound to the engine, its
 * attachment to a comm, and the hooks through which the comm's launch path
 * reaches it (struct ncfsm__verify_ops). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm/verify.h"

/* The exchanges in flight (the in-process registration stays: a failure
 * still reaches the other ranks). */
static void drop(struct ncfsm__verifier *v) {
  v->c->verify_waits = false; /* the stall timer fires once more at most (ncfsm__vchan_waits) */
  ncfsm__vasync_free(v);
  ncfsm__vpairs_drop(v);
  ncfsm__vstrict_free(v);
  ncfsm__vcomp_free(v);
}

#define ACT(name) static void vact_##name(void *obj, void *payload)
#define VER struct ncfsm__verifier *v = obj; ncfsm__vev *p = payload; (void)p

ACT(share_id) {
  VER;
  ncfsm__vcomp_share_id(v);
}
ACT(join) {
  VER;
  ncfsm__vcomp_join(v);
}
ACT(post) {
  VER;
  ncfsm__vcomp_post(v);
}
ACT(record) {
  VER;
  ncfsm__vcomp_record(v);
}
ACT(collect) {
  VER;
  ncfsm__vcomp_collect(v);
}
/* The comm fails first, then the exchanges are dropped: its failure notice goes out while
 * the channel is still in step (a freed exchange leaves it failed, and it refuses notices). */
ACT(fail_comm) {
  VER;
  ncfsm__comm_fail(v->c, p->comm_ev, p->cause, NCFSM__NCCL_SUCCESS, p->what);
  drop(v);
}
ACT(fail_no_memory) {
  VER;
  ncfsm__comm_fail(v->c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_NO_MEMORY, NCFSM__NCCL_SUCCESS,
                   "verification: out of memory for a fingerprint exchange (the ranks' exchanges no longer pair)");
  drop(v);
}
ACT(fail_peer) {
  VER;
  drop(v);
  ncfsm__comm_fail(v->c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_PEER, NCFSM__NCCL_SUCCESS, p->what);
}
ACT(post_detail) {
  VER;
  ncfsm__vasync_post_detail(v);
}
ACT(drop) {
  VER;
  drop(v);
}
ACT(ask) {
  VER;
  ncfsm__vchan_ask(v);
}

static void (*const verify_acts[NCFSM__VA_COUNT])(void *, void *) = {
#define NCFSM_ACTION(name, desc) [NCFSM__VA_##name] = vact_##name,
#define vact_none NULL
#include "fsm/verify.def"
#undef vact_none
};

static bool verify_guard(const void *obj, unsigned g, const void *payload) {
  const struct ncfsm__verifier *v = obj;
  (void)payload;
  switch (g) {
    case NCFSM__VG_ANY: return true;
    case NCFSM__VG_COMPANION: return v->comp != NULL;
  }
  return false;
}

static const ncfsm__binding verify_binding = {&ncfsm__m_verify, verify_guard, verify_acts, NULL, NULL};

/* A verifier over a channel: does it need turns (its attention word, read by the engine
 * inline)? Its polled states do, RUNNING only with exchanges out. */
static void mark(struct ncfsm__verifier *v) {
  if (!v->chan) return;
  bool work = (ncfsm__m_verify.states[v->state].flags & NCFSM__VF_POLLED) &&
              (v->state != NCFSM__VS_RUNNING || ncfsm__vstrict_pending(v)); /* async: woken (vchan_wake) */
  ncfsm__vchan_mark(v, work);
  v->c->verify_waits = v->vq_head != NULL || ncfsm__vpairs_out(v);
  ncfsm__vchan_waits(v, v->c->verify_waits);
  if (work || v->c->verify_waits) ncfsm__comm_enlist(v->c); /* its turns poll it (the hooks hold the lock) */
}

void ncfsm__verify_fire(struct ncfsm__verifier *v, ncfsm__verify_event_t ev, ncfsm_event_t comm_ev,
                        ncfsm_result_t cause, const char *what) {
  ncfsm__vev p = {comm_ev, cause, what};
  if (!ncfsm__m_fire(&verify_binding, v, &v->state, ev, &p))
    NCFSM_INFO(NCFSM__SUB_FSM, "[%s rank %d] verification: %s ignored in state %s", v->c->name, v->c->rank,
               ncfsm__m_verify.events[ev].name, ncfsm__m_verify.states[v->state].name);
  ncfsm__comm_enlist(v->c); /* its next turn looks at the new state (busy or not) */
  mark(v);
}

/* ---- the hooks --------------------------------------------------------------------------- */

static struct ncfsm__verifier *ver(const ncfsm_comm *c) { return c->ver; }
static bool polled(const struct ncfsm__verifier *v) { return ncfsm__m_verify.states[v->state].flags & NCFSM__VF_POLLED; }

static void on_queued(ncfsm_comm *c, ncfsm_work *w) {
  struct ncfsm__verifier *v = ver(c);
  if (c->opts.verify == NCFSM_VERIFY_STRICT && polled(v) && v->state != NCFSM__VS_BROKEN) {
    ncfsm__vstrict_queued(v, w);
    mark(v);
  }
}

/* A launch on a channel that starts a window or is a send/recv (out of line: the common
 * case below stays a leaf). In every state that still verifies (windows and sends are counted
 * from seq 0 and queued until the channel runs: every rank posts every one). */
static __attribute__((noinline)) void launched_window(ncfsm_comm *c, struct ncfsm__verifier *v, ncfsm_work *w,
                                                      bool p2p) {
  if (c->opts.verify != NCFSM_VERIFY_ASYNC || !polled(v) || v->state == NCFSM__VS_BROKEN) return;
  if (p2p) {
    ncfsm__vpairs_launched(v, w);
    if (!c->verify_waits && ncfsm__vpairs_out(v)) mark(v);
  } else {
    ncfsm__vasync_launched(v);
    if (v->vq_head && !c->verify_waits) mark(v); /* an exchange is out */
  }
}

static void on_launched(ncfsm_comm *c, ncfsm_work *w) {
  struct ncfsm__verifier *v = ver(c);
  if (v->local) {
    ncfsm__vlocal_launched(v, w); /* every launch, in every state: its peers compare it */
    return;
  }
  bool p2p = w->fp.op == NCFSM_KIND_SEND || w->fp.op == NCFSM_KIND_RECV;
  if (__builtin_expect(!p2p && c->coll_seq < v->next_window, 1)) { /* the common case: no window due */
    if (c->coll_seq == v->wc_arm) ncfsm__vchan_waits(v, true); /* rank 0's first launch after a check */
    return;
  }
  launched_window(c, v, w, p2p);
}

static void on_forget(ncfsm_comm *c, ncfsm_work *w) {
  (void)c;
  ncfsm__vstrict_forget(w);
}

/* The comm's NCCL communicator is being destroyed or gone: the channel
 * closes (a failed comm keeps it: it still tells and answers the others). */
static bool ended(const ncfsm_comm *c) { return ncfsm__sflags(c->state) & NCFSM_SF_END; }

static bool on_busy(const ncfsm_comm *c) {
  const struct ncfsm__verifier *v = ver(c);
  if (v->local && v->state == NCFSM__VS_UNVERIFIED) return ncfsm__vlocal_told(v); /* only a peer's failure */
  if (v->local && polled(v))
    return ncfsm__vlocal_told(v) || (v->state == NCFSM__VS_WAITING ? ncfsm__has(c, NCFSM_SF_WORKS) : ncfsm__vlocal_busy(v));
  if (ncfsm__vchan_busy(v) || (ended(c) && ncfsm__vchan_open_now(v))) return true; /* notices; a channel to close */
  switch (v->state) {
    case NCFSM__VS_WAITING: /* one poll starts it once the comm is in service */
      return v->comp || ncfsm__vstrict_pending(v) || ncfsm__has(c, NCFSM_SF_WORKS);
    case NCFSM__VS_SHARING:
    case NCFSM__VS_JOINING:
    case NCFSM__VS_EXCHANGING:
    case NCFSM__VS_COLLECTING:
    case NCFSM__VS_DETAILING:
    case NCFSM__VS_ASKING:
    case NCFSM__VS_BROKEN: return true;
    case NCFSM__VS_RUNNING: return v->vq_head || ncfsm__vpairs_out(v) || ncfsm__vstrict_pending(v);
    default: return false;
  }
}

static bool poll_states(ncfsm_comm *c, uint64_t now);

static bool on_poll(ncfsm_comm *c, uint64_t now) {
  struct ncfsm__verifier *v = ver(c);
  ncfsm__vchan_polled(v);
  bool progress = poll_states(c, now);
  if (ended(c)) ncfsm__vchan_retire(v);
  mark(v);
  return progress;
}

/* The channel, among v->members where the comm is a child (their number must be its size). */
static bool open_channel(struct ncfsm__verifier *v, char *what, size_t len) {
  if (v->members && v->nmembers != v->c->nranks) {
    snprintf(what, len, "verification: the split's colors give this child %d ranks, NCCL %d", v->nmembers,
             v->c->nranks);
    return false;
  }
  return ncfsm__vchan_open(v, what, len);
}

static bool poll_states(ncfsm_comm *c, uint64_t now) {
  struct ncfsm__verifier *v = ver(c);
  unsigned f = ncfsm__sflags(c->state);
  char what[512];
  if ((v->local && ncfsm__vlocal_take_failure(v, what, sizeof what)) || /* in any state: an init waits on it too */
      ncfsm__vchan_take(v, what, sizeof what)) {
    ncfsm__verify_fire(v, NCFSM__VE_PEER_FAILED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_PEER, what);
    return true;
  }
  /* The channel opens once the id is known (the same comm id on every rank), while NCCL's init is
   * in progress: every rank has opened it before any rank's comm is in service (NCCL's init
   * completes on none before every rank called it), so a failure notice posted at a comm's first
   * op reaches every rank (a rank that has not opened the channel does not get it). */
  if (v->state == NCFSM__VS_WAITING && v->parent && !v->boot && (f & (NCFSM_SF_WORKS | NCFSM_SF_LIVE)) &&
      !v->members_pending && c->nranks > 0 && c->state != NCFSM_STATE_ID_QUEUED && c->state != NCFSM_STATE_ID_EXCHANGE &&
      !open_channel(v, what, sizeof what)) {
    NCFSM_WARN(NCFSM__SUB_FSM, "[%s rank %d] %s: this comm runs unverified", c->name, c->rank, what);
    ncfsm__verify_fire(v, NCFSM__VE_NO_CHANNEL, NCFSM_EV_ASYNC_ERROR, NCFSM_OK, NULL);
    return true;
  }
  if (!(f & NCFSM_SF_WORKS)) {
    /* still initialising, or splitting: exchanges out are still taken as they complete (a
     * split's colors among them) */
    if (f & NCFSM_SF_LIVE)
      return v->state == NCFSM__VS_RUNNING && !v->local && v->vq_head && c->opts.verify == NCFSM_VERIFY_ASYNC &&
             ncfsm__vasync_poll(v, now);
    ncfsm__verify_fire(v, NCFSM__VE_COMM_ENDED, NCFSM_EV_ASYNC_ERROR, NCFSM_OK, NULL);
    if (v->local) ncfsm__vlocal_quiet(v);
    return false;
  }
  unsigned before = v->state;
  /* over a channel: RUNNING only once it is open (a split child's waits for its members) */
  if ((v->state == NCFSM__VS_WAITING && (!v->parent || v->boot)) || v->state == NCFSM__VS_BROKEN)
    ncfsm__verify_fire(v, NCFSM__VE_IN_SERVICE, NCFSM_EV_ASYNC_ERROR, NCFSM_OK, NULL);
  bool progress = v->state != before;
  if (v->comp) return ncfsm__vcomp_poll(v, now) || progress;
  if (v->local) {
    if (v->state == NCFSM__VS_RUNNING) return ncfsm__vlocal_poll(v, now) || progress;
    ncfsm__vlocal_quiet(v);
    return progress;
  }
  if (v->state == NCFSM__VS_DETAILING) return ncfsm__vasync_poll_detail(v, now) || progress;
  if (v->state == NCFSM__VS_ASKING) return ncfsm__vchan_poll_ask(v, now) || progress;
  if (v->state != NCFSM__VS_RUNNING) return progress;
  if (c->opts.verify != NCFSM_VERIFY_ASYNC) return ncfsm__vstrict_poll(v, now) || progress;
  progress |= ncfsm__vasync_poll(v, now);
  if (v->state == NCFSM__VS_RUNNING) progress |= ncfsm__vpairs_poll(v, now);
  return progress;
}

static void on_failed(ncfsm_comm *c, ncfsm_result_t cause, const char *what) {
  struct ncfsm__verifier *v = ver(c);
  if (c->fail_own) return; /* a manual recovery: every rank requests its own */
  if (v->local) ncfsm__vlocal_failed(v, cause, what);
  else ncfsm__vchan_failed(v, cause, what);
}

static uint64_t on_verified(const ncfsm_comm *c) {
  const struct ncfsm__verifier *v = ver(c);
  if (v->local) return ncfsm__vlocal_verified(v);
  /* strict: a collective launches only once every rank's fingerprint equals its own */
  if (c->opts.verify == NCFSM_VERIFY_STRICT) return v->state == NCFSM__VS_FAILED ? 0 : c->coll_seq;
  return v->det_lo; /* async: every window up to it matched */
}

static const char *on_state_name(const ncfsm_comm *c) { return ncfsm__m_verify.states[ver(c)->state].name; }

static void on_stall_due(ncfsm_comm *c) {
  struct ncfsm__verifier *v = ver(c);
  if (v->local) ncfsm__vlocal_stall_due(v);
  else { /* its exchanges look at their own bound; a send or receive of a window not exchanged asks */
    ncfsm__vpairs_stall_due(v);
    ncfsm__vchan_wake(v);
  }
}

static void on_ended(ncfsm_comm *c) {
  struct ncfsm__verifier *v = ver(c);
  char what[8];
  ncfsm__verify_fire(v, NCFSM__VE_COMM_ENDED, NCFSM_EV_ASYNC_ERROR, NCFSM_OK, NULL);
  drop(v); /* in any state: no request may be out when the channel closes */
  ncfsm__vchan_take(v, what, sizeof what); /* this rank's failure, if not posted yet */
  ncfsm__vchan_retire(v);
}

static void on_free(ncfsm_comm *c) {
  struct ncfsm__verifier *v = ver(c);
  if (!v) return;
  drop(v);
  ncfsm__vlocal_free(v);
  ncfsm__vpairs_free(v); /* its channels are channels of the verifier's */
  ncfsm__vchan_free(v); /* after the exchanges: the channel closes with no request out */
  free(v->members);
  free(v);
  c->ver = NULL;
  c->vops = NULL;
  ncfsm__comm_attend_forget(c); /* no peer nor callback can push it now */
}

static const ncfsm__verify_ops verify_ops = {on_queued, on_launched, on_forget, on_busy,     on_poll,
                                             on_free,   on_failed,   on_verified, on_state_name, on_stall_due,
                                             on_ended};

ncfsm_result_t ncfsm__verify_attach(ncfsm_comm *c, struct ncfsm_boot *boot) {
  struct ncfsm__verifier *v = calloc(1, sizeof *v);
  if (!v) return NCFSM_ERR_NO_MEMORY;
  v->state = NCFSM__VS_WAITING; /* fsm/verify.def's initial state */
  v->c = c;
  v->parent = boot; /* the channel opens on it once the comm is in service (its id known) */
  v->wc_arm = UINT64_MAX;
  v->det_lo_hash = c->hash; /* before any collective (api_comm.c's seed) */
  c->ver = v;
  c->vops = &verify_ops;
  if ((!boot && ncfsm__vlocal_new(v) != NCFSM_OK) || (boot && ncfsm__vchan_new(v) != NCFSM_OK) ||
      (boot && c->opts.verify == NCFSM_VERIFY_STRICT && c->opts.verify_channel == NCFSM_VERIFY_CHANNEL_NCCL &&
       ncfsm__vcomp_new(v) != NCFSM_OK)) {
    on_free(c);
    return NCFSM_ERR_NO_MEMORY;
  }
  return NCFSM_OK;
}

/* ---- children ------------------------------------------------------------------------------ */

void ncfsm__verify_members(ncfsm_comm *child, const int *members, int n, const char *what) {
  struct ncfsm__verifier *v = child->ver;
  if (!v || !v->members_pending) return;
  v->members_pending = false;
  if (members && n > 0 && (v->members = malloc((size_t)n * sizeof *members))) {
    memcpy(v->members, members, (size_t)n * sizeof *members);
    v->nmembers = n;
    return; /* a poll once its size is known opens the channel */
  }
  NCFSM_WARN(NCFSM__SUB_FSM, "[%s rank %d] verification: %s: this child runs unverified", child->name, child->rank,
             what);
  ncfsm__verify_fire(v, NCFSM__VE_NO_CHANNEL, NCFSM_EV_ASYNC_ERROR, NCFSM_OK, NULL);
}

void ncfsm__verify_attach_child(ncfsm_comm *p, ncfsm_comm *child, int color, int key, const int *exclude,
                                int nexclude) {
  struct ncfsm__verifier *pv = p->ver;
  bool async = child && child->opts.verify == NCFSM_VERIFY_ASYNC && !child->vops;
  /* the parent's windows are still queued in these states (on_launched), so is its split's entry */
  bool channel = pv && pv->parent && !pv->local && p->opts.verify == NCFSM_VERIFY_ASYNC && polled(pv) &&
                 pv->state != NCFSM__VS_BROKEN;
  if (!channel) { /* its ranks in this process compare in memory */
    if (async && ncfsm__verify_attach(child, NULL) != NCFSM_OK)
      NCFSM_WARN(NCFSM__SUB_FSM, "[%s] out of memory: this child runs unverified", child->name);
    return;
  }
  if (async && ncfsm__verify_attach(child, pv->parent) != NCFSM_OK) {
    NCFSM_WARN(NCFSM__SUB_FSM, "[%s] out of memory: this child runs unverified", child->name);
    async = false;
  }
  struct ncfsm__verifier *cv = async ? child->ver : NULL;
  if (exclude) { /* a shrink: the ranks that stay, in order, known here */
    if (!cv) return;
    cv->members_pending = true;
    int n = 0, *m = malloc((size_t)p->nranks * sizeof *m);
    for (int r = 0; m && r < p->nranks; r++) {
      bool out = false;
      for (int i = 0; i < nexclude && !out; i++) out = exclude[i] == r;
      if (!out) m[n++] = pv->members ? pv->members[r] : r;
    }
    ncfsm__verify_members(child, m, m ? n : 0, "out of memory for the child's member list");
    free(m);
    return;
  }
  /* a split: every rank's (color, key), in the parent's queue of exchanges */
  if (cv) cv->members_pending = true;
  ncfsm__vasync_split(pv, color, key, cv ? child : NULL);
  mark(pv);
}

__attribute__((constructor)) static void plug_in(void) {
  ncfsm__protocols.attach_verify = ncfsm__verify_attach;
  ncfsm__protocols.attach_child = ncfsm__verify_attach_child;
}
