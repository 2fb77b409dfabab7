/*
 * The local bootstrap: ranks of one process that join a named group. The
 * exchange is lock-free: each member appends its contribution for round n to
 * its own singly linked list (release store of the tail's next pointer) and
 * wakes the other members' event_bases with event_active; each member reads
 * the others' lists through private cursors (acquire loads) on its own loop
 * thread. A node is freed by its owner once every member's cursor is past it
 * (their completed-round counters say so). Only joining and leaving a group
 * take the registry mutex; members may share one thread or use many.
 *
 * Recovery: a member that closed is lost for the others (each sees its
 * closed flag on its own loop thread, reports it once, and fails the
 * allgathers it had not contributed to). Agreements and survivors' groups:
 * local_agree.c.
 *
 * Channels: the channel "t" of group "g" is the group "g#t" of its members,
 * which records the members (as ranks of "g") its first joiner gave; a member
 * lost in "g" before it joined fails the channel's rounds that wait for it.
 * Notices go straight into each other member's queue (under the same
 * wakers/closed protocol that keeps a member's event alive for a waker).
 */
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/event.h>

#include "bootstrap/local-internal.h"


static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static LIST_HEAD(, lgroup) registry = LIST_HEAD_INITIALIZER(registry);

static void wake_member(lmember *m) {
  atomic_fetch_add(&m->wakers, 1);
  if (!atomic_load(&m->closed)) event_active(m->wake, 0, 0);
  atomic_fetch_sub(&m->wakers, 1);
}

void ncfsm__local_wake_others(lmember *me) {
  for (int r = 0; r < me->g->size; r++) {
    lmember *o = atomic_load_explicit(&me->g->members[r], memory_order_acquire);
    if (o && o != me) wake_member(o);
  }
}

/* 1 (and why) when round cannot complete: a member closed without contributing to it, or (a
 * channel) a member was lost through the parent before it joined. */
static int round_lost(lmember *me, uint64_t round, char *why, size_t n) {
  lgroup *g = me->g;
  for (int r = 0; r < g->size; r++) {
    if (r == me->rank) continue;
    lmember *o = atomic_load_explicit(&g->members[r], memory_order_acquire);
    const char *lost = o ? NULL : ncfsm__boot_lost_why(me->b, r);
    if (lost) {
      snprintf(why, n, "local group '%s' allgather #%" PRIu64 " failed: rank %d was lost before it "
                       "opened the channel (%.300s)",
               g->name, round, r, lost);
      return 1;
    }
    if (!o || !atomic_load(&o->closed)) continue;
    lnode *c = me->cursor[r] ? me->cursor[r] : o->dummy;
    if (atomic_load_explicit(&c->next, memory_order_acquire)) continue; /* published before closed */
    snprintf(why, n, "local group '%s' allgather #%" PRIu64 " failed: rank %d closed its "
                     "bootstrap before contributing",
             g->name, round, r);
    return 1;
  }
  return 0;
}

/* Finish the pending rounds whose contributions are all present. */
static void local_progress_member(lmember *me) {
  lgroup *g = me->g;
  lreq *lr;
  while ((lr = TAILQ_FIRST(&me->pending)) != NULL) {
    ncfsm_boot_req *req = lr->req;
    uint64_t round = lr->round;
    char why[500];
    if (round_lost(me, round, why, sizeof why)) {
      TAILQ_REMOVE(&me->pending, lr, link);
      req->impl = NULL;
      free(lr);
      ncfsm__boot_fail(me->b, NCFSM_ERR_BOOTSTRAP, "%s", why);
      ncfsm__boot_req_finish(req, NCFSM_ERR_BOOTSTRAP);
      continue;
    }
    for (int r = 0; r < g->size; r++) {
      if (r == me->rank) continue;
      lmember *o = atomic_load_explicit(&g->members[r], memory_order_acquire);
      if (!o) return; /* not joined yet; its join wakes us */
      if (!me->cursor[r]) me->cursor[r] = o->dummy;
      lnode *n = atomic_load_explicit(&me->cursor[r]->next, memory_order_acquire);
      if (!n) return; /* not posted yet; its post (or its close) wakes us */
      if (n->len != req->len) {
        TAILQ_REMOVE(&me->pending, lr, link);
        req->impl = NULL;
        free(lr);
        ncfsm__boot_fail(me->b, NCFSM_ERR_BOOTSTRAP,
                         "local group '%s' allgather #%" PRIu64 ": rank %d posted %zu bytes, rank "
                         "%d posted %zu; every rank must make the same bootstrap calls",
                         g->name, round, r, n->len, me->rank, req->len);
        ncfsm__boot_req_finish(req, NCFSM_ERR_BOOTSTRAP);
        return;
      }
    }
    unsigned char *out = req->recv;
    for (int r = 0; r < g->size; r++) {
      lnode *n = r == me->rank ? NULL : atomic_load_explicit(&me->cursor[r]->next, memory_order_acquire);
      if (r == me->rank) {
        /* our own node for this round: walk from oldest (still alive, see reclaim) */
        for (n = me->oldest; n->rp1 != round + 1; n = atomic_load_explicit(&n->next, memory_order_relaxed)) {
        }
      } else {
        me->cursor[r] = n;
      }
      if (req->len) memcpy(out + (size_t)r * req->len, n->data, req->len);
    }
    atomic_store_explicit(&me->completed, round + 1, memory_order_release);
    TAILQ_REMOVE(&me->pending, lr, link);
    req->impl = NULL;
    free(lr);
    ncfsm__boot_req_finish(req, NCFSM_OK);
  }
}

int ncfsm__local_member_closed(lgroup *g, int r) {
  lmember *o = atomic_load_explicit(&g->members[r], memory_order_acquire);
  return o && atomic_load(&o->closed);
}

/* Report the members that closed since the last look. */
static void local_lost_scan(lmember *me) {
  lgroup *g = me->g;
  for (int r = 0; r < g->size; r++) {
    if (r == me->rank || me->lost_seen[r] || !ncfsm__local_member_closed(g, r)) continue;
    me->lost_seen[r] = 1;
    char why[400];
    if (me->b->chan_tag)
      snprintf(why, sizeof why, "rank %d closed channel '%s' (local group '%.200s')", r,
               me->b->chan_tag, g->name);
    else
      snprintf(why, sizeof why, "rank %d closed its bootstrap (local group '%.200s')", r, g->name);
    ncfsm__boot_peer_lost(me->b, r, why);
  }
}

static lbcast *bc_find(lgroup *g, uint64_t seq) {
  lbcast *x;
  LIST_FOREACH(x, &g->bcasts, link) if (x->seq == seq) return x;
  return NULL;
}

static void bc_free(lbcast *x) {
  LIST_REMOVE(x, link);
  free(x->data);
  free(x);
}

/* Finish this member's broadcasts whose bytes are there (or that failed). */
static void local_bcast_progress(lmember *me) {
  lgroup *g = me->g;
  lreq *lr, *next;
  for (lr = TAILQ_FIRST(&me->bpending); lr; lr = next) {
    next = TAILQ_NEXT(lr, link);
    ncfsm_boot_req *req = lr->req;
    ncfsm_result_t st = NCFSM_ERR_AGAIN;
    char msg[400];
    pthread_mutex_lock(&g->bc_mu);
    lbcast *x = bc_find(g, lr->round);
    if (req->root == me->rank && (!x || !x->failed[0])) { /* root: done at its post */
      st = NCFSM_OK;
    } else if (!x) {
      snprintf(msg, sizeof msg, "local group '%.100s' broadcast #%" PRIu64 ": lost its state",
               g->name, lr->round);
      st = NCFSM_ERR_BOOTSTRAP;
    } else if (x->failed[0]) {
      snprintf(msg, sizeof msg, "%s", x->failed);
      st = NCFSM_ERR_BOOTSTRAP;
    } else if (x->posted) {
      if (req->len) memcpy(req->recv, x->data, req->len);
      st = NCFSM_OK;
      if (--x->left == 0) bc_free(x);
    } else if (ncfsm__local_member_closed(g, req->root)) {
      snprintf(msg, sizeof msg, "local group '%.100s' broadcast #%" PRIu64 " failed: its root, "
                                "rank %d, closed its bootstrap before posting it",
               g->name, lr->round, req->root);
      st = NCFSM_ERR_BOOTSTRAP;
    } else if (!atomic_load_explicit(&g->members[req->root], memory_order_acquire) &&
               ncfsm__boot_lost_why(me->b, req->root)) {
      snprintf(msg, sizeof msg, "local group '%.100s' broadcast #%" PRIu64 " failed: its root, "
                                "rank %d, was lost before it opened the channel (%.200s)",
               g->name, lr->round, req->root, ncfsm__boot_lost_why(me->b, req->root));
      st = NCFSM_ERR_BOOTSTRAP;
    }
    pthread_mutex_unlock(&g->bc_mu);
    if (st == NCFSM_ERR_AGAIN) continue;
    TAILQ_REMOVE(&me->bpending, lr, link);
    req->impl = NULL;
    free(lr);
    if (st != NCFSM_OK) ncfsm__boot_fail(me->b, st, "%s", msg);
    ncfsm__boot_req_finish(req, st);
  }
}

static void member_wake_cb(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  local_lost_scan(arg);
  local_progress_member(arg);
  local_bcast_progress(arg);
  ncfsm__local_agree_progress(arg);
}

/* Free our nodes that every member's cursor has passed. */
static void reclaim(lmember *me) {
  uint64_t minc = UINT64_MAX;
  for (int r = 0; r < me->g->size; r++) {
    lmember *o = atomic_load_explicit(&me->g->members[r], memory_order_acquire);
    uint64_t c = o ? atomic_load_explicit(&o->completed, memory_order_acquire) : 0;
    if (c < minc) minc = c;
  }
  while (me->oldest->rp1 < minc && me->oldest != me->tail) {
    lnode *n = me->oldest;
    me->oldest = atomic_load_explicit(&n->next, memory_order_relaxed);
    free(n);
  }
}

static void free_list_of(lmember *m);
static void group_free(lgroup *g) {
  for (int r = 0; r < g->size; r++) {
    lmember *m = atomic_load(&g->members[r]);
    if (!m) continue;
    free_list_of(m);
  }
  pthread_mutex_destroy(&g->ag_mu);
  while (!LIST_EMPTY(&g->bcasts)) bc_free(LIST_FIRST(&g->bcasts));
  pthread_mutex_destroy(&g->bc_mu);
  free(g->ag_posted);
  free(g->ag_result);
  free(g->chan_members);
  free(g->members);
  free(g->name);
  free(g);
}

/* "0, 2, 3" */
static const char *rank_list(const int *r, int n, char *buf, size_t len) {
  size_t k = 0;
  buf[0] = 0;
  for (int i = 0; i < n && k + 16 < len; i++)
    k += (size_t)snprintf(buf + k, len - k, "%s%d", i ? ", " : "", r[i]);
  if (k + 16 >= len && n > 0) snprintf(buf + k, len - k, ", ...");
  return buf;
}

static void free_list_of(lmember *m) {
  lnode *n = m->oldest;
  while (n) {
    lnode *next = atomic_load_explicit(&n->next, memory_order_relaxed);
    free(n);
    n = next;
  }
  free(m->cursor);
  free(m->lost_seen);
  free(m);
}

ncfsm_result_t ncfsm__local_join(ncfsm_boot *b, const join_opts *o) {
  const char *name = o->name;
  lmember *me = calloc(1, sizeof *me);
  if (!me) return NCFSM_ERR_NO_MEMORY;
  me->b = b;
  me->rank = o->rank;
  TAILQ_INIT(&me->pending);
  TAILQ_INIT(&me->bpending);
  me->dummy = calloc(1, sizeof *me->dummy);
  me->cursor = calloc((size_t)o->size, sizeof *me->cursor);
  me->lost_seen = calloc((size_t)o->size, 1);
  me->wake = event_new(b->base, -1, 0, member_wake_cb, me);
  if (!me->dummy || !me->cursor || !me->lost_seen || !me->wake) goto nomem;
  me->tail = me->oldest = me->dummy;

  pthread_mutex_lock(&registry_mu);
  lgroup *g;
  LIST_FOREACH(g, &registry, link) if (!strcmp(g->name, name)) break;
  if (g && g->size != o->size) {
    pthread_mutex_unlock(&registry_mu);
    ncfsm__boot_seterr(b, "local group '%s' has size %d; rank %d asked for size %d", name, g->size,
                       o->rank, o->size);
    goto fail;
  }
  if (g && o->chan_members &&
      (!g->chan_members || memcmp(g->chan_members, o->chan_members, (size_t)o->size * sizeof(int)))) {
    char mine[200], theirs[200];
    pthread_mutex_unlock(&registry_mu);
    ncfsm__boot_seterr(b, "local channel '%s' (group '%s') is open with the members [%s] of its "
                          "parent; rank %d opened it with [%s]: every member opens a channel with "
                          "the same tag and members",
                       b->chan_tag, name, rank_list(g->chan_members, g->size, theirs, sizeof theirs),
                       o->rank, rank_list(o->chan_members, o->size, mine, sizeof mine));
    goto fail;
  }
  if (g && atomic_load(&g->members[o->rank])) {
    pthread_mutex_unlock(&registry_mu);
    if (o->chan_members)
      ncfsm__boot_seterr(b, "local channel '%s' (group '%s'): rank %d opened it already and closed "
                            "it while other members still hold it; a member opens a channel once "
                            "until every member closed it",
                         b->chan_tag, name, o->rank);
    else
      ncfsm__boot_seterr(b, "local group '%s': rank %d already joined (give each member its own "
                            "rank, or close the old one first)",
                         name, o->rank);
    goto fail;
  }
  if (!g) {
    g = calloc(1, sizeof *g);
    if (g) {
      g->name = strdup(name);
      g->size = o->size;
      g->members = calloc((size_t)o->size, sizeof *g->members);
      g->ag_posted = calloc((size_t)o->size, 1);
      g->ag_result = calloc((size_t)o->size, 1);
      if (o->chan_members && (g->chan_members = malloc((size_t)o->size * sizeof(int))))
        memcpy(g->chan_members, o->chan_members, (size_t)o->size * sizeof(int));
    }
    if (!g || !g->name || !g->members || !g->ag_posted || !g->ag_result ||
        (o->chan_members && !g->chan_members)) {
      if (g) {
        free(g->chan_members);
        free(g->name);
        free(g->members);
        free(g->ag_posted);
        free(g->ag_result);
        free(g);
      }
      pthread_mutex_unlock(&registry_mu);
      goto nomem;
    }
    pthread_mutex_init(&g->ag_mu, NULL);
    pthread_mutex_init(&g->bc_mu, NULL);
    LIST_INIT(&g->bcasts);
    LIST_INSERT_HEAD(&registry, g, link);
  }
  g->refs++;
  me->g = g;
  atomic_store_explicit(&g->members[o->rank], me, memory_order_release);
  pthread_mutex_unlock(&registry_mu);

  b->impl = me;
  if (!o->chan_members) { /* a channel keeps its parent's */
    b->local_rank = o->rank;
    b->local_size = o->size;
  }
  ncfsm__local_wake_others(me); /* members waiting for this one to join */
  return NCFSM_OK;
nomem:
  ncfsm__boot_seterr(b, "local bootstrap: out of memory");
fail:
  if (me->wake) event_free(me->wake);
  free(me->cursor);
  free(me->lost_seen);
  free(me->dummy);
  free(me);
  return NCFSM_ERR_BOOTSTRAP;
}

static ncfsm_result_t local_open(ncfsm_boot *b, const ncfsm_boot_opts *o) {
  if (o->size < 1 || o->rank < 0 || o->rank >= o->size) {
    ncfsm__boot_seterr(b, "local bootstrap: rank %d / size %d invalid (0 <= rank < size)", o->rank,
                       o->size);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  join_opts j = {o->local_group ? o->local_group : "default", o->rank, o->size, NULL};
  return ncfsm__local_join(b, &j);
}


static void local_close(ncfsm_boot *b) {
  lmember *me = b->impl;
  lgroup *g = me->g;
  atomic_store(&me->closed, 1);
  while (atomic_load(&me->wakers) != 0) sched_yield();
  event_free(me->wake);
  me->wake = NULL;
  lreq *lr;
  while ((lr = TAILQ_FIRST(&me->pending)) != NULL) {
    TAILQ_REMOVE(&me->pending, lr, link);
    free(lr);
  }
  while ((lr = TAILQ_FIRST(&me->bpending)) != NULL) {
    TAILQ_REMOVE(&me->bpending, lr, link);
    free(lr);
  }
  me->agreq = NULL;
  /* it is lost for the others: an open agreement may now be complete */
  pthread_mutex_lock(&g->ag_mu);
  ncfsm__local_ag_eval_locked(g);
  pthread_mutex_unlock(&g->ag_mu);
  ncfsm__local_wake_others(me);
  /* The member and its nodes stay until the whole group is gone: others may
   * still read this member's contributions. */
  pthread_mutex_lock(&registry_mu);
  if (--g->refs == 0) {
    LIST_REMOVE(g, link);
    group_free(g);
  }
  pthread_mutex_unlock(&registry_mu);
  b->impl = NULL;
}

static ncfsm_result_t local_post(ncfsm_boot *b, ncfsm_boot_req *req) {
  lmember *me = b->impl;
  lreq *lr = calloc(1, sizeof *lr);
  lnode *n = malloc(sizeof *n + (req->len ? req->len : 1));
  if (!lr || !n) {
    free(lr);
    free(n);
    return ncfsm__boot_fail(b, NCFSM_ERR_NO_MEMORY, "local allgather: out of memory");
  }
  atomic_init(&n->next, NULL);
  n->rp1 = me->posted + 1;
  n->len = req->len;
  if (req->len) memcpy(n->data, req->send, req->len);
  lr->req = req;
  lr->round = me->posted;
  req->impl = lr;
  TAILQ_INSERT_TAIL(&me->pending, lr, link);
  atomic_store_explicit(&me->tail->next, n, memory_order_release);
  me->tail = n;
  me->posted++;
  reclaim(me);
  ncfsm__local_wake_others(me);
  event_active(me->wake, 0, 0); /* the others may have posted already */
  return NCFSM_OK;
}

/* A broadcast: the first poster makes the group's record; root copies its bytes in and wakes
 * the others; every member finishes from its own wake (local_bcast_progress). */
static ncfsm_result_t local_bcast_post(ncfsm_boot *b, ncfsm_boot_req *req) {
  lmember *me = b->impl;
  lgroup *g = me->g;
  lreq *lr = calloc(1, sizeof *lr);
  if (!lr) return ncfsm__boot_fail(b, NCFSM_ERR_NO_MEMORY, "local broadcast: out of memory");
  pthread_mutex_lock(&g->bc_mu);
  lbcast *x = bc_find(g, req->seq);
  if (!x) {
    x = calloc(1, sizeof *x);
    if (x && req->len && !(x->data = malloc(req->len))) {
      free(x);
      x = NULL;
    }
    if (!x) {
      pthread_mutex_unlock(&g->bc_mu);
      free(lr);
      return ncfsm__boot_fail(b, NCFSM_ERR_NO_MEMORY, "local broadcast: out of memory");
    }
    x->seq = req->seq;
    x->root = req->root;
    x->len = req->len;
    x->left = g->size - 1;
    LIST_INSERT_HEAD(&g->bcasts, x, link);
  }
  if (!x->failed[0] && (x->root != req->root || x->len != req->len))
    snprintf(x->failed, sizeof x->failed,
             "local group '%.100s' broadcast #%" PRIu64 " failed: rank %d posted it with root %d "
             "and %zu bytes, the ranks before it with root %d and %zu bytes; every rank must make "
             "the same broadcasts in the same order",
             g->name, req->seq, me->rank, req->root, req->len, x->root, x->len);
  else if (!x->failed[0] && req->root == me->rank) {
    if (req->len) memcpy(x->data, req->send, req->len);
    x->posted = 1;
    if (x->left == 0) bc_free(x); /* a group of one */
  }
  pthread_mutex_unlock(&g->bc_mu);
  lr->req = req;
  lr->round = req->seq;
  req->impl = lr;
  TAILQ_INSERT_TAIL(&me->bpending, lr, link);
  if (req->root == me->rank) ncfsm__local_wake_others(me);
  event_active(me->wake, 0, 0); /* finished from the wake, never inside post */
  return NCFSM_OK;
}

static void local_cancel(ncfsm_boot_req *req) {
  lmember *me = req->b->impl;
  if (req->kind == NCFSM__REQ_AGREE) { /* the post stays: this rank counts as having posted */
    if (me && me->agreq == req) me->agreq = NULL;
    return;
  }
  lreq *lr = req->impl;
  if (!me || !lr) return;
  if (req->kind == NCFSM__REQ_BCAST) {
    TAILQ_REMOVE(&me->bpending, lr, link);
    free(lr);
    req->impl = NULL;
    return;
  }
  TAILQ_REMOVE(&me->pending, lr, link);
  free(lr);
  req->impl = NULL;
}

static void local_describe(ncfsm_boot *b, char *buf, size_t n) {
  lmember *me = b->impl;
  int missing = 0;
  for (int r = 0; r < me->g->size; r++)
    if (!atomic_load(&me->g->members[r])) missing++;
  snprintf(buf, n, "local group '%s' (%d of %d ranks joined)", me->g->name, me->g->size - missing,
           me->g->size);
}

/* ---- channels and notices ------------------------------------------------------------- */

/* A channel of the member of group "g" is the group "g#<tag>" of its members. */
static ncfsm_result_t local_channel_open(ncfsm_boot *parent, ncfsm_boot *child) {
  lmember *pm = parent->impl;
  char name[512];
  int n = snprintf(name, sizeof name, "%s#%s", pm->g->name, child->chan_tag);
  if (n < 0 || (size_t)n >= sizeof name) {
    ncfsm__boot_seterr(child, "ncfsm_boot_channel_open('%s'): local group name '%.100s...' too "
                              "long (channels nested too deep)",
                       child->chan_tag, pm->g->name);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  join_opts j = {name, child->rank, child->size, child->chan_ranks};
  return ncfsm__local_join(child, &j);
}

/* A member was lost through the parent: the wake looks at it (same thread as the parent's). */
static void local_member_lost(ncfsm_boot *b, int i) {
  (void)i;
  lmember *me = b->impl;
  if (me && me->wake) event_active(me->wake, 0, 0);
}

/* Straight into every other member's queue (its loop thread delivers it). */
static ncfsm_result_t local_notice_post(ncfsm_boot *b, const ncfsm_boot_notice *nt) {
  lmember *me = b->impl;
  for (int r = 0; r < me->g->size; r++) {
    lmember *o = atomic_load_explicit(&me->g->members[r], memory_order_acquire);
    if (!o || o == me) continue;
    atomic_fetch_add(&o->wakers, 1); /* o->b stays open while wakers > 0 (local_close) */
    if (!atomic_load(&o->closed)) ncfsm__boot_notice_push(o->b, nt);
    atomic_fetch_sub(&o->wakers, 1);
  }
  return NCFSM_OK;
}

const ncfsm__boot_ops ncfsm__boot_local_ops = {
    .name = "local",
    .open = local_open,
    .close = local_close,
    .post = local_post,
    .progress = NULL,
    .cancel = local_cancel,
    .describe = local_describe,
    .agree_post = ncfsm__local_agree_post,
    .agree_expire = ncfsm__local_agree_expire,
    .agree_grace_ms = 0,
    .survivors = ncfsm__local_survivors,
    .bcast_post = local_bcast_post,
    .channel_open = local_channel_open,
    .member_lost = local_member_lost,
    .notice_post = local_notice_post,
};
