/*
 * The sim's split, shrink and grow calls (R7, R8; ncclCommGrow: NCCL 2.29;
 * docs/sim.md "Split, shrink, grow and dead ranks"): what each call checks,
 * in NCCL's order, and the one body the three entry points share. The
 * rendezvous that follows (sim_xrdv.c): a call publishes this rank's record
 * (color and key, exclude list, grow size and id) in the parent clique's
 * segment and puts the parent InProgress (nonblocking: for split_polls
 * polls, then until every member published its record; blocking: the call
 * waits); the child is then made as an init of a clique every member finds
 * alike, written to *child (R8: a nonblocking parent's child only once the
 * parent polls to success) and polls its own init.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/sim/sim-comm.h"

const char *const ncfsm__sim_xcall[SIM_X_KINDS] = {"ncclCommSplit", "ncclCommShrink", "ncclCommGrow"};

#define GROW_WARN "ncclCommGrow needs NCCL 2.29 (modelled %d, ncfsm_sim_opts.has_grow = 0)"

/* A grow id: [0,16) the new clique's key, [16,24) SIM_ID_TAG, [24,28) "GROW",
 * [28,44) the parent clique's key, [44,48) the parent's nranks (int32). */
#define GROW_TAG "GROW"
#define GROW_TAG_OFF (SIM_ID_KEY_LEN + SIM_ID_TAG_LEN)
#define GROW_PARENT_OFF (GROW_TAG_OFF + 4)
#define GROW_NRANKS_OFF (GROW_PARENT_OFF + SIM_ID_KEY_LEN)

static int is_grow_id(const ncfsm_unique_id *id) {
  return !memcmp(id->internal + SIM_ID_KEY_LEN, SIM_ID_TAG, SIM_ID_TAG_LEN) &&
         !memcmp(id->internal + GROW_TAG_OFF, GROW_TAG, 4);
}

static int grow_id_nranks(const ncfsm_unique_id *id) {
  int32_t n;
  memcpy(&n, id->internal + GROW_NRANKS_OFF, sizeof n);
  return (int)n;
}

/* The parent may be split, shrunk or grown now (R2, R6, R7, R8); else the
 * WARN and the code NCCL (or the sim, naming the rule) rejects it with. */
static int xcomm_admit(sim_comm *c, int kind, int flags) {
  const char *call = ncfsm__sim_xcall[kind];
  int abort = kind == SIM_X_SHRINK && (flags & NCFSM__SHRINK_ABORT);
  if (ncfsm__sim_foreign(c)) return ncfsm__sim_foreign_reject(c, call);
  if (c->state == IN_PROGRESS) {
    ncfsm__sim_cwarn(c, R2_WARN); /* R2 */
    return E_ARG;
  }
  if (c->shrink_aborted) {
    ncfsm__sim_cwarn(c, "%s: " SHRUNK_WARN, call);
    return E_USAGE;
  }
  if (kind == SIM_X_SHRINK && ncfsm__sim_version() < 22703) {
    ncfsm__sim_cwarn(c, "ncclCommShrink not available (NCCL %d, needs >= 2.27.3) (R7)", ncfsm__sim_version());
    return E_USAGE;
  }
  if (kind == SIM_X_GROW && !ncfsm__sim_grow_ok(&c->o)) {
    ncfsm__sim_cwarn(c, GROW_WARN, ncfsm__sim_version());
    return E_USAGE;
  }
  if (c->xop) {
    ncfsm__sim_cwarn(c, "%s: a split, shrink or grow of this communicator is already pending in this group "
                    "(sim)", call);
    return E_USAGE;
  }
  if (c->finalized) {
    ncfsm__sim_cwarn(c, "%s: communicator was finalized (sim)", call);
    return E_USAGE;
  }
  if (c->revoked) {
    if (kind == SIM_X_SHRINK) return OK; /* R6: its work was stopped; shrink (either mode) is the way on */
    ncfsm__sim_cwarn(c, "%s: communicator was revoked: only ncclCommShrink, ncclCommDestroy and ncclCommAbort "
                    "are allowed on it (sim; R6, R8: %s needs a healthy parent)", call, call);
    return E_USAGE;
  }
  if (c->state != OK) {
    if (abort) return OK; /* R7: the recovery path */
    ncfsm__sim_cwarn(c, "%s: the parent communicator is in error state %s; %s", call,
                    ncfsm__sim_res_name(c->state),
                    kind == SIM_X_SHRINK ? "shrink it with NCCL_SHRINK_ABORT (R7)"
                                         : "it needs a healthy parent: shrink it with NCCL_SHRINK_ABORT, or "
                                           "abort it (R7, R8)");
    return E_USAGE;
  }
  if (abort) return OK; /* its outstanding work is terminated */
  ncfsm__sim_progress(); /* collect what executed */
  uint64_t n = c->outstanding + (c->pending ? c->pending->n : 0) + (c->staged ? c->staged->n : 0);
  if (n || ncfsm__sim_unfinished(c)) {
    ncfsm__sim_cwarn(c, "%s: the parent communicator has %llu operation(s) outstanding; NCCL needs a parent "
                    "with no outstanding work (%s)", call, (unsigned long long)n,
                    kind == SIM_X_SHRINK ? "R7: wait for them, or shrink with NCCL_SHRINK_ABORT"
                    : kind == SIM_X_SPLIT ? "R8: wait for them first"
                                          : "wait for them first");
    return E_USAGE;
  }
  return OK;
}

static sim_xop *xop_new(const sim_comm *c, int kind, void **child, const ncfsm__comm_config *cfg,
                        const ncfsm_sim_opts *o) {
  sim_xop *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  x->kind = kind;
  x->child_out = child;
  x->blocking = cfg->blocking ? 1 : 0;
  x->device = cfg->device;
  x->o = *o;
  if (c->o.dead) x->o.dead = 1; /* a dead process's children are dead too */
  snprintf(x->name, sizeof x->name, "%s", cfg->name ? cfg->name : "");
  return x;
}

/* What one call passes: the fields of its kind. */
typedef struct xargs {
  int color, key;               /* split */
  const int *exclude;           /* shrink */
  int nexclude, flags;
  int nranks, rank;             /* grow: the new size; -1 (existing ranks) */
  const ncfsm_unique_id *id;    /* grow: NULL on existing ranks that did not make it */
} xargs;

static const char *const x_not_comm[SIM_X_KINDS] = {
    "ncclCommSplit : comm argument is NULL or not a sim communicator",
    "ncclCommShrink : comm argument is NULL or not a sim communicator",
    "ncclCommGrow : comm argument is not a sim communicator"};

static uint64_t *x_counter(sim_comm *c, int kind) {
  return kind == SIM_X_SPLIT ? &c->st.splits : kind == SIM_X_SHRINK ? &c->st.shrinks : &c->st.grows;
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* Shrink, before the parent's state (ncclCommInitChildComm's order):
 * pointers, a positive count, this rank not excluded. *ex: the sorted copy. */
static int shrink_list(sim_comm *c, const xargs *a, void **child, const ncfsm__comm_config *cfg, int **ex) {
  if (!child || !cfg || !a->exclude || a->nexclude <= 0) {
    ncfsm__sim_cwarn(c, "ncclCommShrink : newcomm, config or excludeRanksList is NULL, or excludeRanksCount %d "
                    "is not positive", a->nexclude);
    return E_ARG;
  }
  if (!(*ex = malloc((size_t)a->nexclude * sizeof **ex))) {
    ncfsm__sim_cwarn(c, "ncclCommShrink: out of memory");
    return E_SYSTEM;
  }
  memcpy(*ex, a->exclude, (size_t)a->nexclude * sizeof **ex);
  qsort(*ex, (size_t)a->nexclude, sizeof **ex, cmp_int);
  for (int i = 0; i < a->nexclude; i++)
    if ((*ex)[i] == c->rank) {
      ncfsm__sim_cwarn(c, "ncclCommShrink : rank %d is in the exclude list; excluded ranks must not call "
                      "ncclCommShrink (R7)", c->rank);
      return E_ARG;
    }
  return OK;
}

/* After the parent's state: the sim's own checks (NCCL would hang or fail
 * later) of a shrink's list, the child's arguments of a split or grow. */
static int x_args_check(sim_comm *c, int kind, void **child, const ncfsm__comm_config *cfg, const xargs *a,
                        const int *ex) {
  const char *call = ncfsm__sim_xcall[kind];
  if (kind == SIM_X_SHRINK) {
    for (int i = 0; i < a->nexclude; i++) {
      if (ex[i] < 0 || ex[i] >= c->nranks) {
        ncfsm__sim_cwarn(c, "ncclCommShrink : excluded rank %d is out of range (0..%d) (sim)", ex[i], c->nranks - 1);
        return E_ARG;
      }
      if (i && ex[i] == ex[i - 1]) {
        ncfsm__sim_cwarn(c, "ncclCommShrink : rank %d is excluded twice (sim)", ex[i]);
        return E_ARG;
      }
    }
    return OK;
  }
  if (!child || !cfg) {
    ncfsm__sim_cwarn(c, "%s : newcomm or config argument is NULL", call);
    return E_ARG;
  }
  if (kind == SIM_X_SPLIT) return OK;
  if (a->rank != -1) {
    ncfsm__sim_cwarn(c, "ncclCommGrow : an existing rank passes rank -1 (got %d); it keeps its rank %d", a->rank,
                    c->rank);
    return E_ARG;
  }
  if (a->nranks <= c->nranks) {
    ncfsm__sim_cwarn(c, "ncclCommGrow : nranks %d must be larger than the parent's %d", a->nranks, c->nranks);
    return E_ARG;
  }
  const ncfsm_unique_id *id = a->id;
  if (id && (!is_grow_id(id) || memcmp(id->internal + GROW_PARENT_OFF, c->q->key, SIM_ID_KEY_LEN) ||
             grow_id_nranks(id) != c->nranks)) {
    ncfsm__sim_cwarn(c, "ncclCommGrow : the unique id was not made by ncclCommGetUniqueId on this communicator (sim)");
    return E_ARG;
  }
  if (id && ncfsm__sim_grow_used(c, (const unsigned char *)id->internal)) {
    ncfsm__sim_cwarn(c, "ncclCommGrow : this unique id was already used by a grow (ids are single-use)");
    return E_ARG;
  }
  return OK;
}

/* The call's fields into its record; takes *ex. */
static void x_fill(sim_comm *c, sim_xop *x, const xargs *a, int **ex) {
  switch (x->kind) {
  case SIM_X_SPLIT:
    x->color = a->color;
    x->key = a->key;
    break;
  case SIM_X_SHRINK:
    x->exclude = *ex;
    *ex = NULL;
    x->nexclude = a->nexclude;
    x->flags = a->flags & NCFSM__SHRINK_ABORT;
    x->hash = ncfsm__sim_exclude_hash(x->exclude, x->nexclude);
    if (a->flags & NCFSM__SHRINK_ABORT) {
      /* R7: the parent's outstanding work is terminated first: unexecuted
       * ops are dropped (their stream work ends without data, as aborted
       * kernels exit), and the parent may only be aborted afterwards */
      ncfsm__sim_drop_ops(c);
      c->poisoned = 0;
      c->shrink_aborted = 1;
    }
    break;
  default:
    x->grow_nranks = a->nranks;
    x->has_id = a->id != NULL;
    if (a->id) memcpy(x->grow_key, a->id->internal, SIM_ID_KEY_LEN);
    break;
  }
}

/* The one body of split, shrink and grow on an existing rank: the checks
 * (ncclCommInitChildComm's order for shrink), the record, the rendezvous's
 * start, and the call's implicit group (R1: nonblocking -> InProgress;
 * blocking: the waits of the group end) or its explicit one. */
static int x_call(int kind, void *parent, void **child, const ncfsm__comm_config *cfg, const xargs *a) {
  LOCK();
  int implicit = ncfsm__sim_implicit_begin(), rc = OK;
  sim_comm *c = ncfsm__sim_comm_of(parent);
  int *ex = NULL;
  if (child) *child = NULL; /* R8: written when the call is done */
  if (!c) {
    ncfsm__sim_warn("%s", x_not_comm[kind]);
    rc = E_ARG;
  } else {
    (*x_counter(c, kind))++;
    if (kind == SIM_X_SHRINK) rc = shrink_list(c, a, child, cfg, &ex);
    if (!rc) rc = xcomm_admit(c, kind, a->flags);
    if (!rc) rc = x_args_check(c, kind, child, cfg, a, ex);
    if (!rc) rc = ncfsm__sim_group_mode_check(c->blocking); /* R3 */
    ncfsm_sim_opts o;
    if (!rc) rc = ncfsm__sim_call_opts(cfg->sim, &o, ncfsm__sim_xcall[kind]);
    if (!rc) {
      sim_xop *x = xop_new(c, kind, child, cfg, &o);
      if (!x) {
        ncfsm__sim_cwarn(c, "%s: out of memory", ncfsm__sim_xcall[kind]);
        rc = E_SYSTEM;
      } else {
        x_fill(c, x, a, &ex);
        rc = ncfsm__sim_xop_start(c, x);
      }
    }
  }
  free(ex);
  rc = ncfsm__sim_call_end(implicit, c, rc);
  UNLOCK();
  return rc;
}

int ncfsm__sim_comm_split(void *parent, int color, int key, void **child, const ncfsm__comm_config *cfg) {
  xargs a = {.color = color, .key = key};
  return x_call(SIM_X_SPLIT, parent, child, cfg, &a);
}

int ncfsm__sim_comm_shrink(void *parent, const int *exclude, int nexclude, void **child,
                           const ncfsm__comm_config *cfg, int flags) {
  xargs a = {.exclude = exclude, .nexclude = nexclude, .flags = flags};
  return x_call(SIM_X_SHRINK, parent, child, cfg, &a);
}

int ncfsm__sim_comm_get_unique_id(void *bcomm, ncfsm_unique_id *id) {
  LOCK();
  int rc = OK;
  sim_comm *c = ncfsm__sim_comm_of(bcomm);
  if (!c || !id) {
    ncfsm__sim_cwarn(c, "ncclCommGetUniqueId : comm argument is NULL or not a sim communicator, or uniqueId "
                    "is NULL");
    rc = E_ARG;
  } else if (ncfsm__sim_foreign(c)) {
    rc = ncfsm__sim_foreign_reject(c, "ncclCommGetUniqueId");
  } else if (!ncfsm__sim_grow_ok(&c->o)) {
    ncfsm__sim_cwarn(c, "ncclCommGetUniqueId: ncclCommGrow needs NCCL 2.29 (modelled %d, "
                    "ncfsm_sim_opts.has_grow = 0)", ncfsm__sim_version());
    rc = E_USAGE;
  } else if (c->state == IN_PROGRESS) {
    ncfsm__sim_cwarn(c, R2_WARN); /* R2: ncclCommEnsureReady (no group: not poisoned) */
    rc = E_ARG;
  } else if (c->state != OK) {
    rc = c->state; /* ncclCommEnsureReady keeps an error state */
  } else if (c->shrink_aborted || c->revoked || c->finalized) {
    ncfsm__sim_cwarn(c, "ncclCommGetUniqueId: the communicator is %s; a grow needs a healthy parent (sim)",
                    c->shrink_aborted ? "shrunk with NCCL_SHRINK_ABORT"
                    : c->revoked      ? "revoked"
                                      : "finalized");
    rc = E_USAGE;
  } else {
    memset(id, 0, sizeof *id);
    if (ncfsm__sim_random_key((unsigned char *)id->internal)) {
      ncfsm__sim_cwarn(c, "ncclCommGetUniqueId: getrandom failed: %s", strerror(errno));
      rc = E_SYSTEM;
    } else {
      int32_t n = c->nranks;
      memcpy(id->internal + SIM_ID_KEY_LEN, SIM_ID_TAG, SIM_ID_TAG_LEN);
      memcpy(id->internal + GROW_TAG_OFF, GROW_TAG, 4);
      memcpy(id->internal + GROW_PARENT_OFF, c->q->key, SIM_ID_KEY_LEN);
      memcpy(id->internal + GROW_NRANKS_OFF, &n, sizeof n);
    }
  }
  if (c && rc) c->st.rejected++;
  UNLOCK();
  return rc;
}

/* A joining rank (no parent): an init of the new clique named by the id. */
static int grow_join(int nranks, const ncfsm_unique_id *id, int rank, void **child,
                     const ncfsm__comm_config *cfg, sim_comm **out) {
  if (!id || !child || !cfg) {
    ncfsm__sim_warn("ncclCommGrow : a joining rank (comm NULL) needs uniqueId, newcomm and config");
    return E_ARG;
  }
  ncfsm_sim_opts o;
  int rc = ncfsm__sim_call_opts(cfg->sim, &o, "ncclCommGrow");
  if (rc != OK) return rc;
  if (!ncfsm__sim_grow_ok(&o)) {
    ncfsm__sim_warn(GROW_WARN, ncfsm__sim_version());
    return E_USAGE;
  }
  if (!is_grow_id(id)) {
    ncfsm__sim_warn("ncclCommGrow : the unique id was not made by ncclCommGetUniqueId (sim)");
    return E_ARG;
  }
  int pn = grow_id_nranks(id);
  if (nranks <= pn || rank < pn || rank >= nranks) {
    ncfsm__sim_warn("ncclCommGrow : invalid rank %d for a joining rank: the parent has %d ranks and the grown "
                    "communicator %d, so joining ranks are %d..%d", rank, pn, nranks, pn, nranks - 1);
    return E_ARG;
  }
  const unsigned char *key = (const unsigned char *)id->internal;
  sim_clique *q = ncfsm__sim_clique_find(key);
  int full = 0;
  if (q && ncfsm__sim_shm_lock(q) == 0) {
    full = q->h->joined >= q->h->nranks;
    ncfsm__sim_shm_unlock(q);
  }
  if (full || (!q && ncfsm__sim_grow_done(key))) {
    ncfsm__sim_warn("ncclCommGrow : this unique id was already used by a completed grow (ids are single-use)");
    return E_ARG;
  }
  rc = ncfsm__sim_comm_create(out, nranks, key, rank, cfg, "ncclCommGrow");
  if (rc) return rc;
  ncfsm__sim_grow_mark(key);
  return OK;
}

int ncfsm__sim_comm_grow(void *parent, int nranks, const ncfsm_unique_id *id, int rank, void **child,
                         const ncfsm__comm_config *cfg) {
  if (parent) {
    xargs a = {.nranks = nranks, .rank = rank, .id = id};
    return x_call(SIM_X_GROW, parent, child, cfg, &a);
  }
  LOCK(); /* a joining rank */
  int implicit = ncfsm__sim_implicit_begin();
  sim_comm *c = NULL;
  if (child) *child = NULL;
  int rc = grow_join(nranks, id, rank, child, cfg, &c);
  if (!rc) {
    c->st.grows++;
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d/%d joins by ncclCommGrow", rank, nranks);
  }
  rc = ncfsm__sim_init_end(implicit, c, rc, child);
  UNLOCK();
  return rc;
}

/* ncclCommUserRank + ncclCommCount: both call ncclCommEnsureReady (NCCL
 * 2.28 init.cc), so on a comm whose async state is InProgress (e.g. a split
 * child still in its init) they return ncclInvalidArgument with the R2 WARN,
 * and an error state is returned as it is. No group is involved there, so the
 * sim does not poison the comm for it (not measured). */
int ncfsm__sim_comm_rank_size(void *bcomm, int *rank, int *size) {
  LOCK();
  int rc = OK;
  sim_comm *c = ncfsm__sim_comm_of(bcomm);
  if (!c || !rank || !size) {
    ncfsm__sim_cwarn(c, "ncclCommCount : comm argument is NULL or not a sim communicator, or count is NULL");
    rc = E_ARG;
  } else if (ncfsm__sim_foreign(c)) {
    rc = ncfsm__sim_foreign_reject(c, "ncclCommCount");
  } else if (c->state == IN_PROGRESS) {
    ncfsm__sim_cwarn(c, R2_WARN); /* R2: ncclCommEnsureReady */
    rc = E_ARG;
  } else if (c->state != OK) {
    rc = c->state;
  } else {
    *rank = c->rank;
    *size = c->nranks;
  }
  if (c && rc) c->st.rejected++;
  UNLOCK();
  return rc;
}

