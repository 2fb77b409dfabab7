/*
 * The local bootstrap: ranks of one process that join a named group. The
 * exchange is lock-free: each member appends its contribution for round n to
 * its own singly linked list (release store of the tail's next pointer) and
 * wakes the other members' event_bases with event_active; each member reads
 * the others' lists through private cursors (acquire loads) on its own loop
 * thread. A node is freed by its owner once every member's cursor is past it
 * (their completed-round counters say so). Only joining and leaving a group
 * take the registry mutex; members may share one thread or use many.
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

#include "bootstrap/boot-internal.h"

typedef struct lnode {
  _Atomic(struct lnode *) next;
  uint64_t rp1; /* round + 1; the list's dummy head has 0 */
  size_t len;
  unsigned char data[];
} lnode;

struct lgroup;

typedef struct lreq {
  TAILQ_ENTRY(lreq) link;
  ncfsm_boot_req *req;
  uint64_t round;
} lreq;

typedef struct lmember {
  struct lgroup *g;
  ncfsm_boot *b;
  int rank;
  struct event *wake;
  atomic_int closed, wakers;
  _Atomic uint64_t completed; /* rounds this member has finished */
  lnode *dummy;               /* set before the member is published */
  /* owner-thread only: */
  lnode *tail, *oldest;
  lnode **cursor; /* [size]: last node consumed from each member's list */
  uint64_t posted;
  TAILQ_HEAD(, lreq) pending;
} lmember;

typedef struct lgroup {
  LIST_ENTRY(lgroup) link;
  char *name;
  int size, refs;
  _Atomic(lmember *) *members; /* [size] */
} lgroup;

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static LIST_HEAD(, lgroup) registry = LIST_HEAD_INITIALIZER(registry);

static void wake_member(lmember *m) {
  atomic_fetch_add(&m->wakers, 1);
  if (!atomic_load(&m->closed)) event_active(m->wake, 0, 0);
  atomic_fetch_sub(&m->wakers, 1);
}

static void wake_others(lmember *me) {
  for (int r = 0; r < me->g->size; r++) {
    lmember *o = atomic_load_explicit(&me->g->members[r], memory_order_acquire);
    if (o && o != me) wake_member(o);
  }
}

/* Finish the pending rounds whose contributions are all present. */
static void local_progress_member(lmember *me) {
  lgroup *g = me->g;
  lreq *lr;
  while ((lr = TAILQ_FIRST(&me->pending)) != NULL) {
    ncfsm_boot_req *req = lr->req;
    uint64_t round = lr->round;
    for (int r = 0; r < g->size; r++) {
      if (r == me->rank) continue;
      lmember *o = atomic_load_explicit(&g->members[r], memory_order_acquire);
      if (!o) return; /* not joined yet; its join wakes us */
      if (!me->cursor[r]) me->cursor[r] = o->dummy;
      lnode *n = atomic_load_explicit(&me->cursor[r]->next, memory_order_acquire);
      if (!n) return; /* not posted yet; its post wakes us */
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

static void member_wake_cb(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  local_progress_member(arg);
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

static ncfsm_result_t local_open(ncfsm_boot *b, const ncfsm_boot_opts *o) {
  const char *name = o->local_group ? o->local_group : "default";
  if (o->size < 1 || o->rank < 0 || o->rank >= o->size) {
    ncfsm__boot_seterr(b, "local bootstrap: rank %d / size %d invalid (0 <= rank < size)", o->rank,
                       o->size);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  lmember *me = calloc(1, sizeof *me);
  if (!me) return NCFSM_ERR_NO_MEMORY;
  me->b = b;
  me->rank = o->rank;
  TAILQ_INIT(&me->pending);
  me->dummy = calloc(1, sizeof *me->dummy);
  me->cursor = calloc((size_t)o->size, sizeof *me->cursor);
  me->wake = event_new(b->base, -1, 0, member_wake_cb, me);
  if (!me->dummy || !me->cursor || !me->wake) goto nomem;
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
  if (g && atomic_load(&g->members[o->rank])) {
    pthread_mutex_unlock(&registry_mu);
    ncfsm__boot_seterr(b, "local group '%s': rank %d already joined (give each member its own rank, "
                          "or close the old one first)",
                       name, o->rank);
    goto fail;
  }
  if (!g) {
    g = calloc(1, sizeof *g);
    if (g) {
      g->name = strdup(name);
      g->size = o->size;
      g->members = calloc((size_t)o->size, sizeof *g->members);
    }
    if (!g || !g->name || !g->members) {
      if (g) {
        free(g->name);
        free(g->members);
        free(g);
      }
      pthread_mutex_unlock(&registry_mu);
      goto nomem;
    }
    LIST_INSERT_HEAD(&registry, g, link);
  }
  g->refs++;
  me->g = g;
  atomic_store_explicit(&g->members[o->rank], me, memory_order_release);
  pthread_mutex_unlock(&registry_mu);

  b->impl = me;
  b->local_rank = o->rank;
  b->local_size = o->size;
  wake_others(me); /* members waiting for this one to join */
  return NCFSM_OK;
nomem:
  ncfsm__boot_seterr(b, "local bootstrap: out of memory");
fail:
  if (me->wake) event_free(me->wake);
  free(me->cursor);
  free(me->dummy);
  free(me);
  return NCFSM_ERR_BOOTSTRAP;
}

static void free_list(lnode *n) {
  while (n) {
    lnode *next = atomic_load_explicit(&n->next, memory_order_relaxed);
    free(n);
    n = next;
  }
}

static void local_close(ncfsm_boot *b) {
  lmember *me = b->impl;
  atomic_store(&me->closed, 1);
  while (atomic_load(&me->wakers) != 0) sched_yield();
  event_free(me->wake);
  me->wake = NULL;
  lreq *lr;
  while ((lr = TAILQ_FIRST(&me->pending)) != NULL) {
    TAILQ_REMOVE(&me->pending, lr, link);
    free(lr);
  }
  /* The member and its nodes stay until the whole group is gone: others may
   * still read this member's contributions. */
  pthread_mutex_lock(&registry_mu);
  lgroup *g = me->g;
  if (--g->refs == 0) {
    LIST_REMOVE(g, link);
    for (int r = 0; r < g->size; r++) {
      lmember *m = atomic_load(&g->members[r]);
      if (!m) continue;
      free_list(m->oldest);
      free(m->cursor);
      free(m);
    }
    free(g->members);
    free(g->name);
    free(g);
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
  wake_others(me);
  event_active(me->wake, 0, 0); /* the others may have posted already */
  return NCFSM_OK;
}

static void local_cancel(ncfsm_boot_req *req) {
  lmember *me = req->b->impl;
  lreq *lr = req->impl;
  if (!me || !lr) return;
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

const ncfsm__boot_ops ncfsm__boot_local_ops = {
    .name = "local",
    .open = local_open,
    .close = local_close,
    .post = local_post,
    .progress = NULL,
    .cancel = local_cancel,
    .describe = local_describe,
};
