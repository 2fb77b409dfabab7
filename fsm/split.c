/*
 * Communicators made from communicators: ncclCommSplit (R8), ncclCommShrink
 * (R7) and ncclCommGrow (NCCL 2.29+), through the table (fsm/comm.def:
 * SPLIT, SHRINK_TERMINATE, SPLIT_DONE on the parent; INIT_CHILD on the
 * child).
 *
 * The call is issued on the loop thread (R9) without the loop's lock (a
 * blocking parent's call waits for its peers). NCCL writes a nonblocking
 * parent's child handle asynchronously, at the latest when the parent's
 * async state is back to ncclSuccess (R8): the backend writes it into
 * child->split_bcomm, and only SPLIT_DONE (the parent's poll) moves it to
 * child->bcomm, after which the child polls its own init. Until then the
 * parent holds a reference on the child, so that storage stays valid.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "fsm/internal.h"

#define LOCK(l) pthread_mutex_lock(&(l)->mu)
#define UNLOCK(l) pthread_mutex_unlock(&(l)->mu)

enum split_kind { K_SPLIT, K_SHRINK, K_GROW };
static const char *const kind_fn[] = {"ncfsm_comm_split", "ncfsm_comm_shrink", "ncfsm_comm_grow"};

typedef struct split_req {
  enum split_kind kind;
  ncfsm_comm *parent, *child;
  int color, key;              /* split */
  const int *exclude;          /* shrink */
  int nexclude, flags;
  int nranks, rank;            /* grow */
  const ncfsm_unique_id *id;
  ncfsm_result_t r;
  bool done;
} split_req;

static bool comm_ok(const ncfsm_comm *c) { return c && c->magic == NCFSM__COMM_MAGIC; }

/* The child's rank and size where they follow from the call (shrink, grow);
 * a split's come from the backend once the handle is written. */
static void child_geometry(split_req *q) {
  ncfsm_comm *p = q->parent, *c = q->child;
  if (q->kind == K_SHRINK) {
    int below = 0;
    for (int i = 0; i < q->nexclude; i++) below += q->exclude[i] < p->rank;
    c->rank = p->rank - below;
    c->nranks = p->nranks - q->nexclude;
  } else if (q->kind == K_GROW) {
    c->rank = p ? p->rank : q->rank;
    c->nranks = q->nranks;
  } else {
    c->rank = -1;
    c->nranks = 0;
  }
}

/* The child's comm id: the same on every rank of the child (dumps of one
 * communicator must agree), derived from the parent's and the call. */
static uint64_t child_id(const split_req *q) {
  struct {
    uint64_t parent, n;
    int32_t kind, color;
  } k = {0, 0, 0, 0};
  if (q->kind == K_GROW) return XXH3_64bits(q->id, sizeof *q->id);
  k.parent = q->parent->comm_id;
  k.n = q->parent->nsplits;
  k.kind = (int32_t)q->kind;
  k.color = q->kind == K_SPLIT ? q->color : 0;
  return XXH3_64bits(&k, sizeof k);
}

/* p2p sequence arrays of a child whose size is known. */
static bool child_arrays(ncfsm_comm *c) {
  if (c->nranks <= 0 || c->p2p_send_seq) return true;
  c->p2p_send_seq = calloc((size_t)c->nranks, sizeof *c->p2p_send_seq);
  c->p2p_recv_seq = calloc((size_t)c->nranks, sizeof *c->p2p_recv_seq);
  return c->p2p_send_seq && c->p2p_recv_seq;
}

static ncfsm_result_t check_args(split_req *q) {
  ncfsm_comm *p = q->parent, *c = q->child;
  const char *fn = kind_fn[q->kind];
  ncfsm_result_t r;
  if (p) {
    ncfsm_call_t call = q->kind == K_SPLIT    ? NCFSM_CALL_SPLIT
                        : q->kind == K_GROW   ? NCFSM_CALL_GROW
                        : q->flags & NCFSM_SHRINK_ABORT ? NCFSM_CALL_SHRINK_ABORT
                                              : NCFSM_CALL_SHRINK;
    if (ncfsm__check_legal(p, call, &r) == NCFSM_REJECT) return r;
  }
  ncfsm_comm *named = p ? p : c;
  if (!c) {
    if (q->kind == K_SPLIT && q->color == NCFSM_SPLIT_NOCOLOR) return NCFSM_OK;
    ncfsm__set_error(named, "%s: child is NULL; make it with ncfsm_comm_new on the parent's loop "
                            "(NULL only with color NCFSM_SPLIT_NOCOLOR)", fn);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (q->kind == K_SPLIT && q->color == NCFSM_SPLIT_NOCOLOR) {
    ncfsm__set_error(named, "%s: color NCFSM_SPLIT_NOCOLOR makes no child: pass child NULL", fn);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (q->kind == K_SPLIT && q->color < 0) {
    ncfsm__set_error(named, "%s: color %d is negative (NCFSM_SPLIT_NOCOLOR is the only one)", fn, q->color);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (p && (c->loop != p->loop || c->be != p->be || c == p)) {
    ncfsm__set_error(named, "%s: the child must be another comm on the parent's loop with the parent's "
                            "backend (ncfsm_comm_new(parent's loop, opts with the same backend))", fn);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (ncfsm_legality(c->state, NCFSM_CALL_INIT, NULL, NULL) == NCFSM_REJECT || c->state != NCFSM_STATE_NEW) {
    ncfsm__set_error(c, "%s: the child is in state %s; it must be NEW (fresh from ncfsm_comm_new)", fn,
                     ncfsm_state_name(c->state));
    return NCFSM_ERR_ILLEGAL_STATE;
  }
  if (c->opts.verify != NCFSM_VERIFY_OFF) {
    ncfsm__set_error(c, "%s: the child's opts.verify is not off; a child has no bootstrap to verify "
                        "through: make it with verify off", fn);
    return NCFSM_ERR_INVALID_USAGE;
  }
  unsigned feat = c->be->features();
  if (p && p->bcomm && p->be->comm_features) feat = p->be->comm_features(p->bcomm);
  /* A joining rank has no comm to ask: where features vary per comm (the
   * sim's knobs) the backend's call decides, and refuses with its reason. */
  if (!p && q->kind == K_GROW && c->be->comm_features) feat |= NCFSM__HAS_GROW;
  bool have = q->kind == K_SPLIT    ? c->be->comm_split && (feat & NCFSM__HAS_SPLIT)
              : q->kind == K_SHRINK ? c->be->comm_shrink && (feat & NCFSM__HAS_SHRINK)
                                    : c->be->comm_grow && (feat & NCFSM__HAS_GROW);
  if (!have) {
    ncfsm__set_error(named, "%s: the %s backend's runtime (NCCL %d) has no %s (needs NCCL %s)", fn, c->be->name,
                     c->be->version(), q->kind == K_SPLIT ? "ncclCommSplit" : q->kind == K_SHRINK ? "ncclCommShrink" : "ncclCommGrow",
                     q->kind == K_SPLIT ? ">= 2.18" : q->kind == K_SHRINK ? ">= 2.27" : ">= 2.29");
    return NCFSM_ERR_UNSUPPORTED;
  }
  if (q->kind == K_SHRINK) {
    if (q->nexclude < 1 || q->nexclude >= p->nranks || !q->exclude) {
      ncfsm__set_error(p, "%s: exclude %d of %d ranks: exclude at least one and keep at least one", fn,
                       q->nexclude, p->nranks);
      return NCFSM_ERR_INVALID_ARGUMENT;
    }
    for (int i = 0; i < q->nexclude; i++) {
      if (q->exclude[i] < 0 || q->exclude[i] >= p->nranks) {
        ncfsm__set_error(p, "%s: excluded rank %d is not a rank of the parent (0..%d)", fn, q->exclude[i],
                         p->nranks - 1);
        return NCFSM_ERR_INVALID_ARGUMENT;
      }
      if (q->exclude[i] == p->rank) {
        ncfsm__set_error(p, "%s: this rank (%d) is in the exclude list: excluded ranks must not call it (R7)", fn,
                         p->rank);
        return NCFSM_ERR_INVALID_USAGE;
      }
      for (int j = 0; j < i; j++)
        if (q->exclude[j] == q->exclude[i]) {
          ncfsm__set_error(p, "%s: rank %d is excluded twice", fn, q->exclude[i]);
          return NCFSM_ERR_INVALID_ARGUMENT;
        }
    }
    if (q->flags & ~NCFSM_SHRINK_ABORT) {
      ncfsm__set_error(p, "%s: unknown flags 0x%x (NCFSM_SHRINK_DEFAULT or NCFSM_SHRINK_ABORT)", fn, q->flags);
      return NCFSM_ERR_INVALID_ARGUMENT;
    }
  }
  if (q->kind == K_GROW) {
    int old = p ? p->nranks : 0;
    if (!q->id) {
      ncfsm__set_error(named, "%s: id is NULL: every rank passes the id made by ncfsm_comm_grow_id", fn);
      return NCFSM_ERR_INVALID_ARGUMENT;
    }
    if (p ? (q->rank != -1 || q->nranks <= old) : (q->rank < 0 || q->rank >= q->nranks)) {
      ncfsm__set_error(named, "%s: %s (nranks %d, rank %d)", fn,
                       p ? "an existing rank passes rank -1 and a larger nranks than its comm's"
                         : "a joining rank passes its new rank, from the old size up to nranks - 1",
                       q->nranks, q->rank);
      return NCFSM_ERR_INVALID_ARGUMENT;
    }
  }
  return NCFSM_OK;
}

/* On the loop thread, with the lock. */
static void do_split(split_req *q) {
  ncfsm_comm *p = q->parent, *c = q->child;
  ncfsm_loop *loop = p ? p->loop : c->loop;
  q->r = check_args(q);
  if (q->r != NCFSM_OK) return;
  bool terminate = q->kind == K_SHRINK && ((q->flags & NCFSM_SHRINK_ABORT) || p->state != NCFSM_STATE_READY);
  if (c) {
    c->split_parent = p;
    c->split_bcomm = NULL;
    child_geometry(q);
    if (!child_arrays(c)) {
      q->r = NCFSM_ERR_NO_MEMORY;
      return;
    }
    c->comm_id = child_id(q);
    ncfsm__fire(c, NCFSM_EV_INIT_CHILD, NCFSM_OK); /* INIT_IN_PROGRESS, no handle yet */
  }
  ncfsm__comm_config cfg = {c ? c->opts.blocking : 0, c ? c->opts.device : 0, c ? &c->sim : NULL,
                            c ? c->name : NULL};
  if (!c && p) cfg = (ncfsm__comm_config){p->opts.blocking, p->opts.device, &p->sim, p->name};
  const ncfsm__backend *be = (p ? p : c)->be;
  void *pb = p ? p->bcomm : NULL;
  void **out = c ? &c->split_bcomm : &p->split_bcomm; /* NOCOLOR: NCCL writes NULL somewhere valid */
  if (p) {
    p->be_calls++;
    p->refs++;
    p->was_revoked = p->state == NCFSM_STATE_REVOKED;
  }
  if (c) c->refs++;
  /* The parent's state changes before the call: its ops queue meanwhile, and
   * terminate fails its unfinished works (NCCL_SHRINK_ABORT terminates them). */
  if (p) ncfsm__fire(p, terminate ? NCFSM_EV_SHRINK_TERMINATE : NCFSM_EV_SPLIT, NCFSM_OK);
  bool blocking = (p ? p->opts.blocking : cfg.blocking) != 0;
  ncfsm__loop_claim(loop);
  UNLOCK(loop);
  int rc;
  switch (q->kind) {
    case K_SPLIT: rc = be->comm_split(pb, q->color, q->key, out, &cfg); break;
    case K_SHRINK:
      rc = be->comm_shrink(pb, q->exclude, q->nexclude, out, &cfg, terminate ? NCFSM__SHRINK_ABORT : NCFSM__SHRINK_DEFAULT);
      break;
    default:
      rc = be->comm_grow(pb, q->nranks, (!p || p->grow_id_made) ? q->id : NULL, p ? -1 : q->rank, out, &cfg);
      break;
  }
  LOCK(loop);
  ncfsm__loop_unclaim(loop);
  if (p) p->nsplits++;
  char what[160];
  snprintf(what, sizeof what, "%s", q->kind == K_SPLIT ? "ncclCommSplit" : q->kind == K_SHRINK ? "ncclCommShrink" : "ncclCommGrow");
  if (NCFSM__IS_ERR(rc)) {
    q->r = ncfsm__cause_of(rc) == NCFSM_ERR_BACKEND ? NCFSM_ERR_BACKEND : NCFSM_ERR_ASYNC;
    if (c) {
      c->split_parent = NULL;
      if (p) p->split_child = NULL;
      ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, q->r, rc, what);
      ncfsm__comm_unref(c);
    }
    if (p) {
      ncfsm__comm_fail(p, NCFSM_EV_ASYNC_ERROR, q->r, rc, what);
      ncfsm__comm_unref(p);
    }
    return;
  }
  if (p) {
    p->split_child = c; /* holds the ref taken above */
    if (blocking) ncfsm__split_final(p); /* the call returned with the handle written */
    ncfsm__comm_unref(p);
  } else {
    /* a joining rank of a grow: its handle comes back from the call, like an init's */
    c->bcomm = c->split_bcomm;
    c->split_parent = NULL;
    if (!c->bcomm) ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, NCFSM__NCCL_INTERNAL_ERROR,
                                    "ncclCommGrow returned no communicator");
    ncfsm__comm_unref(c);
  }
  q->r = NCFSM_OK;
  loop->poll_iter = 0;
}

void ncfsm__split_final(ncfsm_comm *p) { ncfsm__fire(p, NCFSM_EV_SPLIT_DONE, NCFSM_OK); }

void ncfsm__split_hand(ncfsm_comm *p) {
  ncfsm_comm *c = p->split_child;
  p->split_child = NULL;
  if (!c) return; /* NOCOLOR */
  c->split_parent = NULL;
  c->bcomm = c->split_bcomm;
  if (!c->bcomm) {
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, NCFSM__NCCL_INTERNAL_ERROR,
                     "the parent's call is final but wrote no handle for this child");
  } else if (c->state == NCFSM_STATE_CLOSED) {
    /* aborted meanwhile: NCCL made the communicator all the same */
    c->be->abort(c->bcomm);
    c->bcomm = NULL;
  }
  c->loop->poll_iter = 0;
  ncfsm__comm_unref(c);
}

/* A split child's rank and size: NCCL answers ncclCommUserRank/Count only
 * once the child's init is done (ncclCommEnsureReady), so at INIT_DONE. */
bool ncfsm__split_geometry(ncfsm_comm *c) {
  if (c->nranks > 0) return true;
  int r = -1, n = 0;
  int rc = c->be->comm_rank_size ? c->be->comm_rank_size(c->bcomm, &r, &n) : NCFSM__NCCL_INVALID_USAGE;
  if (rc == NCFSM__NCCL_SUCCESS && n > 0 && r >= 0 && r < n) {
    c->rank = r;
    c->nranks = n;
    if (child_arrays(c)) return true;
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_NO_MEMORY, NCFSM__NCCL_SYSTEM_ERROR, "split child (out of memory)");
    return false;
  }
  ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, NCFSM__IS_ERR(rc) ? rc : NCFSM__NCCL_INTERNAL_ERROR,
                   "ncclCommUserRank/ncclCommCount of the split child");
  return false;
}

void ncfsm__split_orphan(ncfsm_comm *p, const char *why) {
  ncfsm_comm *c = p->split_child;
  if (!c) return;
  p->split_child = NULL;
  c->split_parent = NULL;
  char what[600];
  snprintf(what, sizeof what, "the parent %s (rank %d) failed before its split/shrink/grow was final (%s)", p->name,
           p->rank, why);
  ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_ABORTED, NCFSM__NCCL_SUCCESS, what);
  ncfsm__comm_unref(c);
}

/* ---- the API ------------------------------------------------------------------ */

static void tramp(void *arg) {
  split_req *q = arg;
  ncfsm_loop *loop = (q->parent ? q->parent : q->child)->loop;
  LOCK(loop);
  do_split(q);
  q->done = true;
  ncfsm__loop_flush_notes(loop);
  pthread_cond_broadcast(&loop->cv);
  UNLOCK(loop);
}

static ncfsm_result_t run(split_req *q) {
  ncfsm_comm *any = q->parent ? q->parent : q->child;
  ncfsm_loop *loop = any->loop;
  LOCK(loop);
  if (ncfsm__loop_can_drive(loop)) {
    do_split(q);
    ncfsm__loop_wake(loop);
    UNLOCK(loop);
    return q->r;
  }
  if (q->parent) q->parent->refs++;
  if (q->child) q->child->refs++;
  UNLOCK(loop);
  ncfsm_result_t r = ncfsm_loop_call(loop, tramp, q);
  LOCK(loop);
  while (r == NCFSM_OK && !q->done) pthread_cond_wait(&loop->cv, &loop->mu);
  if (q->parent) ncfsm__comm_unref(q->parent);
  if (q->child) ncfsm__comm_unref(q->child);
  UNLOCK(loop);
  return r == NCFSM_OK ? q->r : r;
}

ncfsm_result_t ncfsm_comm_split(ncfsm_comm *parent, int color, int key, ncfsm_comm *child) {
  if (!comm_ok(parent) || (child && !comm_ok(child))) return NCFSM_ERR_INVALID_ARGUMENT;
  split_req q = {.kind = K_SPLIT, .parent = parent, .child = child, .color = color, .key = key};
  return run(&q);
}

ncfsm_result_t ncfsm_comm_shrink(ncfsm_comm *parent, const int *exclude, int nexclude, int flags,
                                 ncfsm_comm *child) {
  if (!comm_ok(parent) || !comm_ok(child)) return NCFSM_ERR_INVALID_ARGUMENT;
  split_req q = {.kind = K_SHRINK, .parent = parent, .child = child, .exclude = exclude,
                 .nexclude = nexclude, .flags = flags};
  return run(&q);
}

ncfsm_result_t ncfsm_comm_grow(ncfsm_comm *parent, int nranks, const ncfsm_unique_id *id, int rank,
                               ncfsm_comm *child) {
  if ((parent && !comm_ok(parent)) || !comm_ok(child)) return NCFSM_ERR_INVALID_ARGUMENT;
  split_req q = {.kind = K_GROW, .parent = parent, .child = child, .nranks = nranks, .rank = rank, .id = id};
  return run(&q);
}

struct grow_id_req {
  ncfsm_comm *c;
  ncfsm_unique_id *id;
  ncfsm_result_t r;
  bool done;
};

static void do_grow_id(struct grow_id_req *g) {
  ncfsm_comm *c = g->c;
  ncfsm_result_t r;
  if (ncfsm__check_legal(c, NCFSM_CALL_GROW, &r) == NCFSM_REJECT) {
    g->r = r;
    return;
  }
  unsigned feat = c->be->comm_features && c->bcomm ? c->be->comm_features(c->bcomm) : c->be->features();
  if (!c->be->comm_get_unique_id || !(feat & NCFSM__HAS_GROW)) {
    ncfsm__set_error(c, "ncfsm_comm_grow_id: the %s backend's runtime (NCCL %d) has no ncclCommGetUniqueId / "
                        "ncclCommGrow (needs NCCL >= 2.29)", c->be->name, c->be->version());
    g->r = NCFSM_ERR_UNSUPPORTED;
    return;
  }
  c->be_calls++;
  int rc = c->be->comm_get_unique_id(c->bcomm, g->id);
  if (NCFSM__IS_ERR(rc)) {
    ncfsm__set_error(c, "ncfsm_comm_grow_id: ncclCommGetUniqueId returned %s", ncfsm__nccl_result_name(rc));
    g->r = NCFSM_ERR_BACKEND;
    return;
  }
  c->grow_id_made = true;
  g->r = NCFSM_OK;
}

static void grow_id_tramp(void *arg) {
  struct grow_id_req *g = arg;
  ncfsm_loop *loop = g->c->loop;
  LOCK(loop);
  do_grow_id(g);
  g->done = true;
  pthread_cond_broadcast(&loop->cv);
  UNLOCK(loop);
}

ncfsm_result_t ncfsm_comm_grow_id(ncfsm_comm *c, ncfsm_unique_id *id) {
  if (!comm_ok(c) || !id) return NCFSM_ERR_INVALID_ARGUMENT;
  struct grow_id_req g = {c, id, NCFSM_OK, false};
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  if (ncfsm__loop_can_drive(loop)) {
    do_grow_id(&g);
    UNLOCK(loop);
    return g.r;
  }
  c->refs++;
  UNLOCK(loop);
  ncfsm_result_t r = ncfsm_loop_call(loop, grow_id_tramp, &g);
  LOCK(loop);
  while (r == NCFSM_OK && !g.done) pthread_cond_wait(&loop->cv, &loop->mu);
  ncfsm__comm_unref(c);
  UNLOCK(loop);
  return r == NCFSM_OK ? g.r : r;
}
