/*
 * Communicators made from communicators: ncclCommSplit (R8), ncclCommShrink
 * (R7) and ncclCommGrow (NCCL 2.29+), through the table (fsm/comm.def:
 * SPLIT, SHRINK_TERMINATE and SPLIT_DONE on the parent; INIT_CHILD and
 * HANDED on the child; the runtime's features are the guards HAS_SPLIT,
 * HAS_SHRINK, HAS_GROW of the parent's cells, the child's NEW state is its
 * CHILD cell).
 *
 * The call is issued on the loop thread (R9) without the loop's lock (a
 * blocking parent's call waits for its peers). NCCL writes a nonblocking
 * parent's child handle asynchronously, at the latest when the parent's
 * async state is back to ncclSuccess (R8): the backend writes it into
 * child->split_bcomm, and only SPLIT_DONE (the parent's poll) hands it to
 * the child (fsm/children.c), after which the child polls its own init.
 * Until then the parent holds a reference on the child.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "fsm/api-int.h"

enum split_kind { K_SPLIT, K_SHRINK, K_GROW };
static const char *const kind_fn[] = {"ncfsm_comm_split", "ncfsm_comm_shrink", "ncfsm_comm_grow"};
static const char *const kind_nccl[] = {"ncclCommSplit", "ncclCommShrink", "ncclCommGrow"};

typedef struct split_req {
  enum split_kind kind;
  ncfsm_comm *parent, *child;
  int color, key;     /* split */
  const int *exclude; /* shrink */
  int nexclude, flags;
  int nranks, rank;   /* grow */
  const ncfsm_unique_id *id;
  ncfsm_result_t r;
} split_req;

/* The child's rank and size where they follow from the call (shrink, grow);
 * a split's come from the backend once its init is done (become_ready). */
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

static ncfsm_result_t check_shrink_args(const split_req *q) {
  ncfsm_comm *p = q->parent;
  const char *fn = kind_fn[q->kind];
  if (q->nexclude < 1 || q->nexclude >= p->nranks || !q->exclude) {
    ncfsm__set_error(p, "%s: exclude %d of %d ranks: exclude at least one and keep at least one", fn, q->nexclude,
                     p->nranks);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  for (int i = 0; i < q->nexclude; i++) {
    if (q->exclude[i] < 0 || q->exclude[i] >= p->nranks) {
      ncfsm__set_error(p, "%s: excluded rank %d is not a rank of the parent (0..%d)", fn, q->exclude[i], p->nranks - 1);
      return NCFSM_ERR_INVALID_ARGUMENT;
    }
    if (q->exclude[i] == p->rank) {
      ncfsm__set_error(p, "%s: this rank (%d) is in the exclude list: excluded ranks must not call it (R7)", fn, p->rank);
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
  return NCFSM_OK;
}

static ncfsm_result_t check_args(split_req *q) {
  ncfsm_comm *p = q->parent, *c = q->child;
  const char *fn = kind_fn[q->kind];
  ncfsm_result_t r;
  if (p) {
    ncfsm_call_t call = q->kind == K_SPLIT                   ? NCFSM_CALL_SPLIT
                        : q->kind == K_GROW                  ? NCFSM_CALL_GROW
                        : (q->flags & NCFSM_SHRINK_ABORT) ? NCFSM_CALL_SHRINK_ABORT
                                                             : NCFSM_CALL_SHRINK;
    if (ncfsm__check_legal(p, call, &r) == NCFSM_REJECT) return r; /* state, IDLE, HAS_* */
  }
  ncfsm_comm *named = p ? p : c;
  if (!c) {
    if (q->kind == K_SPLIT && q->color == NCFSM_SPLIT_NOCOLOR) return NCFSM_OK;
    ncfsm__set_error(named, "%s: child is NULL; make it with ncfsm_comm_new on the parent's loop (NULL only with "
                            "color NCFSM_SPLIT_NOCOLOR)", fn);
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
    ncfsm__set_error(named, "%s: the child must be another comm on the parent's loop with the parent's backend "
                            "(ncfsm_comm_new(parent's loop, opts with the same backend))", fn);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (ncfsm__check_legal(c, NCFSM_CALL_CHILD, &r) == NCFSM_REJECT) { /* the child is NEW */
    ncfsm__set_error(c, "%s: the child is in state %s; it must be NEW (fresh from ncfsm_comm_new)", fn,
                     ncfsm_state_name((ncfsm_state_t)c->state));
    return r;
  }
  if (c->opts.verify == NCFSM_VERIFY_STRICT) {
    ncfsm__set_error(c, "%s: the child's opts.verify is strict, which needs a bootstrap of the child's ranks: make it "
                        "with verify async (its ranks in this process compare in memory) or off", fn);
    return NCFSM_ERR_INVALID_USAGE;
  }
  /* A joining rank has no comm to ask: where features vary per comm (the
   * sim's knobs) the backend's call decides, and refuses with its reason. */
  if (!p && q->kind == K_GROW && !(c->be->comm_grow && (c->be->comm_features || (c->be->features() & NCFSM__HAS_GROW)))) {
    ncfsm__set_error(c, "%s: the %s backend's runtime (NCCL %d) has no ncclCommGrow (needs NCCL >= 2.29)", fn,
                     c->be->name, c->be->version());
    return NCFSM_ERR_UNSUPPORTED;
  }
  if (q->kind == K_SHRINK && (r = check_shrink_args(q)) != NCFSM_OK) return r;
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

static int backend_call(const split_req *q, void *pb, void **out, ncfsm__comm_config *cfg, bool terminate) {
  const ncfsm__backend *be = (q->parent ? q->parent : q->child)->be;
  const ncfsm_comm *p = q->parent;
  switch (q->kind) {
    case K_SPLIT: return be->comm_split(pb, q->color, q->key, out, cfg);
    case K_SHRINK:
      return be->comm_shrink(pb, q->exclude, q->nexclude, out, cfg, terminate ? NCFSM__SHRINK_ABORT : NCFSM__SHRINK_DEFAULT);
    default: {
      /* NCCL gets the id only from the rank that made it (ncfsm_comm_grow_id) */
      bool mine = !p || !memcmp(&p->grow_id, q->id, sizeof *q->id);
      return be->comm_grow(pb, q->nranks, mine ? q->id : NULL, p ? -1 : q->rank, out, cfg);
    }
  }
}

/* On the loop thread, with the lock. */
static void do_split(void *arg) {
  split_req *q = arg;
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
    ncfsm__comm_fire(c, NCFSM_EV_INIT_CHILD, NULL); /* CHILD_QUEUED: no handle yet */
  }
  /* async: the child verifies from its seq 0, on a channel of its ranks where the parent verifies
   * over a bootstrap, else in memory with its ranks in this process (every rank of a split takes
   * part, a rank of no color too: the colors are exchanged) */
  if (q->kind != K_GROW && p && ncfsm__protocols.attach_child)
    ncfsm__protocols.attach_child(p, c, q->color, q->key, q->kind == K_SHRINK ? q->exclude : NULL, q->nexclude);
  else if (c && c->opts.verify == NCFSM_VERIFY_ASYNC && !c->vops && ncfsm__protocols.attach_verify &&
           ncfsm__protocols.attach_verify(c, NULL) != NCFSM_OK)
    NCFSM_WARN(NCFSM__SUB_FSM, "[%s] out of memory: this child runs unverified", c->name);
  ncfsm__comm_config cfg = {c ? c->opts.blocking : 0, c ? c->opts.device : 0, c ? &c->sim : NULL, c ? c->name : NULL};
  if (!c && p) cfg = (ncfsm__comm_config){p->opts.blocking, p->opts.device, &p->sim, p->name};
  void *pb = p ? p->bcomm : NULL;
  void **out = c ? &c->split_bcomm : &p->split_bcomm; /* NOCOLOR: NCCL writes NULL somewhere valid */
  if (p) {
    p->be_calls++;
    p->refs++;
  }
  if (c) c->refs++;
  /* The parent's state changes before the call: its ops queue meanwhile, and
   * terminate fails its unfinished works (NCCL_SHRINK_ABORT terminates them). */
  if (p) ncfsm__comm_fire(p, terminate ? NCFSM_EV_SHRINK_TERMINATE : NCFSM_EV_SPLIT, NULL);
  bool blocking = (p ? p->opts.blocking : cfg.blocking) != 0;
  ncfsm__loop_claim(loop);
  NCFSM__UNLOCK(loop);
  int rc = backend_call(q, pb, out, &cfg, terminate);
  NCFSM__LOCK(loop);
  ncfsm__loop_unclaim(loop);
  if (p) p->nsplits++;
  if (NCFSM__IS_ERR(rc)) {
    q->r = ncfsm__cause_of(rc) == NCFSM_ERR_BACKEND ? NCFSM_ERR_BACKEND : NCFSM_ERR_ASYNC;
    if (c) {
      c->split_parent = NULL;
      ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, q->r, rc, kind_nccl[q->kind]);
      ncfsm__comm_unref(c);
    }
    if (p) {
      p->split_child = NULL;
      ncfsm__comm_fail(p, NCFSM_EV_ASYNC_ERROR, q->r, rc, kind_nccl[q->kind]);
      ncfsm__comm_unref(p);
    }
    return;
  }
  if (p) {
    p->split_child = c; /* holds the ref taken above */
    if (blocking) ncfsm__comm_fire(p, NCFSM_EV_SPLIT_DONE, NULL); /* the call returned with the handle written */
    ncfsm__comm_unref(p);
  } else {
    /* a joining rank of a grow: its handle comes back from the call, like an init's */
    ncfsm__comm_fire(c, NCFSM_EV_HANDED, NULL);
    ncfsm__comm_unref(c);
  }
  q->r = NCFSM_OK;
  loop->poll_iter = 0;
}

static ncfsm_result_t run(split_req *q) {
  ncfsm_comm *any = q->parent ? q->parent : q->child;
  if (q->parent && q->child) q->child->refs++; /* the child stays valid too (under the parent's loop lock) */
  ncfsm__on_loop(any->loop, any, do_split, q);
  if (q->parent && q->child) {
    NCFSM__LOCK(any->loop);
    ncfsm__comm_unref(q->child);
    NCFSM__UNLOCK(any->loop);
  }
  return q->r;
}

ncfsm_result_t ncfsm_comm_split(ncfsm_comm *parent, int color, int key, ncfsm_comm *child) {
  if (!ncfsm__comm_ok(parent) || (child && !ncfsm__comm_ok(child))) return NCFSM_ERR_INVALID_ARGUMENT;
  split_req q = {.kind = K_SPLIT, .parent = parent, .child = child, .color = color, .key = key};
  return run(&q);
}

ncfsm_result_t ncfsm__comm_shrink_locked(ncfsm_comm *parent, const int *exclude, int nexclude, int flags,
                                         ncfsm_comm *child) {
  split_req q = {.kind = K_SHRINK, .parent = parent, .child = child, .exclude = exclude, .nexclude = nexclude,
                 .flags = flags};
  do_split(&q);
  return q.r;
}

ncfsm_result_t ncfsm_comm_shrink(ncfsm_comm *parent, const int *exclude, int nexclude, int flags, ncfsm_comm *child) {
  if (!ncfsm__comm_ok(parent) || !ncfsm__comm_ok(child)) return NCFSM_ERR_INVALID_ARGUMENT;
  split_req q = {.kind = K_SHRINK, .parent = parent, .child = child, .exclude = exclude, .nexclude = nexclude,
                 .flags = flags};
  return run(&q);
}

ncfsm_result_t ncfsm_comm_grow(ncfsm_comm *parent, int nranks, const ncfsm_unique_id *id, int rank,
                               ncfsm_comm *child) {
  if ((parent && !ncfsm__comm_ok(parent)) || !ncfsm__comm_ok(child)) return NCFSM_ERR_INVALID_ARGUMENT;
  split_req q = {.kind = K_GROW, .parent = parent, .child = child, .nranks = nranks, .rank = rank, .id = id};
  return run(&q);
}

struct grow_id_req {
  ncfsm_comm *c;
  ncfsm_unique_id *id;
  ncfsm_result_t r;
};

static void do_grow_id(void *arg) {
  struct grow_id_req *g = arg;
  ncfsm_comm *c = g->c;
  if (ncfsm__check_legal(c, NCFSM_CALL_GROW_ID, &g->r) == NCFSM_REJECT) return; /* READY, HAS_GROW */
  c->be_calls++;
  int rc = c->be->comm_get_unique_id(c->bcomm, g->id);
  if (NCFSM__IS_ERR(rc)) {
    ncfsm__set_error(c, "ncfsm_comm_grow_id: ncclCommGetUniqueId returned %s", ncfsm__nccl_result_name(rc));
    g->r = NCFSM_ERR_BACKEND;
    return;
  }
  c->grow_id = *g->id;
  g->r = NCFSM_OK;
}

ncfsm_result_t ncfsm_comm_grow_id(ncfsm_comm *c, ncfsm_unique_id *id) {
  if (!ncfsm__comm_ok(c) || !id) return NCFSM_ERR_INVALID_ARGUMENT;
  struct grow_id_req g = {c, id, NCFSM_OK};
  ncfsm__on_loop(c->loop, c, do_grow_id, &g);
  return g.r;
}
