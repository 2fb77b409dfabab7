/* Buffer ranges (R12): the ranges each op touches on its rank, the
 * launcher's check that a launch holds no two ops of one comm that overlap
 * where one writes, and the group-end check of the same. */
#include <stdlib.h>
#include <string.h>

#include "fsm/objects.h"

/*
 * The launcher's R12 check: the buffer ranges already taken in this launch,
 * per comm two interval trees (its writes, its reads): treaps keyed by lo,
 * each node with the largest hi of its subtree, so that "does [lo, hi)
 * overlap a taken range" and an insert are O(log n) whatever the order in
 * which the buffers come (CLRS 14.3: descend left while the left subtree
 * reaches past lo). A write may overlap nothing of its comm; a read no
 * write. Nodes come from one array of 2 * coalesce_max + 2, reset per
 * launch; comms from a short array (a launch holds a few local ranks).
 *
 * The common cases, buffers in ascending or descending order, build no
 * tree: each comm keeps the high- and low-water marks of what it took (the
 * largest hi, the smallest lo), and a range that starts at or above the one
 * or ends at or below the other overlaps nothing (two compares). A ring of
 * buffers taken from the middle (ascending, then wrapping around to the
 * lowest) is the same: each comm also keeps a gap known to hold nothing it
 * took, the one just above its last range (up to the next range taken, or
 * without end), and a range inside the gap overlaps nothing either. Until
 * then no range is stored: the launch keeps the works it took, and the
 * first query outside the marks and the gap (the exact fallback) puts the
 * ranges of that comm's works into its trees; from then on its ranges go
 * into the trees as they are taken, and its queries there descend them.
 */
typedef struct {
  uintptr_t lo, hi, maxhi;
  uint32_t prio;
  int l, r;   /* children: node indexes, -1 when none */
  bool write;
} ncfsm__rnode;

typedef struct {
  uintptr_t comm;
  uintptr_t hw, lw; /* the largest hi and the smallest lo it took: all it took lies in [lw, hw) */
  uintptr_t glo, ghi; /* a gap: nothing it took meets [glo, ghi) (empty when glo >= ghi) */
  bool tree;        /* its ranges are in the trees (else only in the works taken) */
  int w, r;         /* roots of its write and read trees (-1: empty) */
} ncfsm__rcomm;

struct ncfsm__spanset {
  ncfsm__rnode *node;
  int nnode, cap;   /* nodes in the trees; room for cap ranges */
  int nspans;       /* ranges taken (the bound of a launch: cap) */
  const ncfsm_work **works; /* the works taken (with a range), nworks of them */
  int nworks;
  ncfsm__rcomm *comm;
  int ncomm, last; /* last: the comm found by the previous lookup */
  uint32_t seed;
  /* The first batch of a launch is only inserted when a second one is
   * examined: a launch of one batch (the latency path) costs nothing here. */
  const ncfsm_work *lazy_head, *lazy_tail;
};

/* Does [lo, hi) overlap a range of the tree at t? */
static bool tree_hit(const ncfsm__rnode *nd, int t, uintptr_t lo, uintptr_t hi) {
  while (t >= 0) {
    const ncfsm__rnode *x = &nd[t];
    if (x->lo < hi && lo < x->hi) return true;
    t = x->l >= 0 && nd[x->l].maxhi > lo ? x->l : x->r;
  }
  return false;
}

static void fix_max(ncfsm__rnode *nd, int t) {
  ncfsm__rnode *x = &nd[t];
  x->maxhi = x->hi;
  if (x->l >= 0 && nd[x->l].maxhi > x->maxhi) x->maxhi = nd[x->l].maxhi;
  if (x->r >= 0 && nd[x->r].maxhi > x->maxhi) x->maxhi = nd[x->r].maxhi;
}

/* Insert node k into the treap at t; returns the new root. */
static int tree_insert(ncfsm__rnode *nd, int t, int k) {
  if (t < 0) return k;
  ncfsm__rnode *x = &nd[t];
  if (nd[k].lo < x->lo) {
    x->l = tree_insert(nd, x->l, k);
    if (nd[x->l].prio > x->prio) { /* rotate right */
      int y = x->l;
      x->l = nd[y].r;
      nd[y].r = t;
      fix_max(nd, t);
      fix_max(nd, y);
      return y;
    }
  } else {
    x->r = tree_insert(nd, x->r, k);
    if (nd[x->r].prio > x->prio) { /* rotate left */
      int y = x->r;
      x->r = nd[y].l;
      nd[y].l = t;
      fix_max(nd, t);
      fix_max(nd, y);
      return y;
    }
  }
  fix_max(nd, t);
  return t;
}

/* The trees of comm (created when add), NULL when it has none. */
static ncfsm__rcomm *comm_trees(ncfsm__spanset *ss, uintptr_t comm, bool add) {
  if (ss->last < ss->ncomm && ss->comm[ss->last].comm == comm) return &ss->comm[ss->last];
  for (int i = 0; i < ss->ncomm; i++)
    if (ss->comm[i].comm == comm) return &ss->comm[ss->last = i];
  if (!add) return NULL;
  ss->comm[ss->ncomm] = (ncfsm__rcomm){comm, 0, UINTPTR_MAX, 0, 0, false, -1, -1}; /* room: at most one per range */
  return &ss->comm[ss->last = ss->ncomm++];
}

/* The range s of t's comm goes into t's trees. */
static void tree_add(ncfsm__spanset *ss, ncfsm__rcomm *t, const ncfsm__span *s) {
  int k = ss->nnode++;
  ss->seed = ss->seed * 1664525u + 1013904223u; /* the treap's priorities: an LCG is enough */
  ss->node[k] = (ncfsm__rnode){s->lo, s->hi, s->hi, ss->seed, -1, -1, s->write};
  int *root = s->write ? &t->w : &t->r;
  *root = tree_insert(ss->node, *root, k);
}

/* The fallback: the ranges of the works t's comm took go into its trees. */
static void build_trees(ncfsm__spanset *ss, ncfsm__rcomm *t) {
  for (int j = 0; j < ss->nworks; j++)
    if ((uintptr_t)ss->works[j]->comm == t->comm)
      for (int i = 0; i < ss->works[j]->nspan; i++) tree_add(ss, t, &ss->works[j]->span[i]);
  t->tree = true;
}

/* [lo, hi) overlaps nothing t took: above or below all of it, or in its gap. */
static bool clear_of(const ncfsm__rcomm *t, uintptr_t lo, uintptr_t hi) {
  return lo >= t->hw || hi <= t->lw || (lo >= t->glo && hi <= t->ghi);
}

/* w's ranges into t, its comm's trees (comm_trees(..., true)). */
static void spanset_insert_in(ncfsm__spanset *ss, ncfsm__rcomm *t, const ncfsm_work *w) {
  for (int i = 0; i < w->nspan; i++) {
    uintptr_t lo = w->span[i].lo, hi = w->span[i].hi;
    /* the gap above this range: without end above the high mark, up to the
     * low mark below it, the rest of the gap inside it; none otherwise */
    if (lo >= t->hw) t->glo = hi, t->ghi = UINTPTR_MAX;
    else if (hi <= t->lw) t->glo = hi, t->ghi = t->lw;
    else if (lo >= t->glo && hi <= t->ghi) t->glo = hi;
    else if (hi > t->glo && lo < t->ghi) t->glo = t->ghi = 0; /* it meets the gap: forget it */
    if (hi > t->hw) t->hw = hi;
    if (lo < t->lw) t->lw = lo;
    if (t->tree) tree_add(ss, t, &w->span[i]);
  }
  ss->nspans += w->nspan;
  ss->works[ss->nworks++] = w;
}

static void spanset_insert_work(ncfsm__spanset *ss, const ncfsm_work *w) {
  if (w->nspan) spanset_insert_in(ss, comm_trees(ss, (uintptr_t)w->comm, true), w);
}

/* Does w overlap what t (its comm's trees, NULL: none yet) took? */
static bool spanset_hit(ncfsm__spanset *ss, ncfsm__rcomm *t, const ncfsm_work *w) {
  if (!t) return false;
  for (int i = 0; i < w->nspan; i++) {
    if (clear_of(t, w->span[i].lo, w->span[i].hi)) continue; /* the marks or the gap: nothing there */
    if (!t->tree) build_trees(ss, t); /* the exact fallback: the trees answer from now on */
    if (tree_hit(ss->node, t->w, w->span[i].lo, w->span[i].hi)) return true;
    if (w->span[i].write && tree_hit(ss->node, t->r, w->span[i].lo, w->span[i].hi)) return true;
  }
  return false;
}

/* Bytes each buffer of an op touches on this rank. */
static void work_spans(ncfsm_work *w) {
  const ncfsm__op *o = &w->op;
  size_t es = ncfsm__dtype_bytes(o->dtype), nr = (size_t)w->comm->nranks;
  size_t in = o->count * es, out = o->count * es;
  bool is_root = w->comm->rank == o->root;
  switch (o->kind) {
    case NCFSM_KIND_ALLGATHER: out *= nr; break;
    case NCFSM_KIND_REDUCESCATTER: in *= nr; break;
    case NCFSM_KIND_ALLTOALL: in *= nr; out *= nr; break;
    case NCFSM_KIND_GATHER: out = is_root ? out * nr : 0; break;
    case NCFSM_KIND_SCATTER: in = is_root ? in * nr : 0; break;
    case NCFSM_KIND_REDUCE: out = is_root ? out : 0; break;
    case NCFSM_KIND_BROADCAST: in = is_root ? in : 0; break;
    case NCFSM_KIND_SEND: out = 0; break;
    case NCFSM_KIND_RECV: in = 0; break;
    default: break;
  }
  w->nspan = 0;
  /* In place (the same bytes read and written): one written range, which
   * overlaps exactly what the pair would (a write conflicts with any access). */
  if (in && o->send && !(out && o->recv == o->send && out == in))
    w->span[w->nspan++] = (ncfsm__span){(uintptr_t)o->send, (uintptr_t)o->send + in, false};
  if (out && o->recv) w->span[w->nspan++] = (ncfsm__span){(uintptr_t)o->recv, (uintptr_t)o->recv + out, true};
}

/* w's ranges, computed at their first use: a work's op does not change
 * after its submission, so this is what the submission would have computed. */
static inline void need_spans(ncfsm_work *w) {
  if (w->nspan < 0) work_spans(w);
}

bool ncfsm__spanset_take(ncfsm__spanset *ss, const ncfsm__batch *b) {
  for (ncfsm_work *w = b->head; w; w = w->bnext) need_spans(w); /* the lazy batch's too: they came this way */
  if (!ss->lazy_head && ss->nworks == 0) {
    ss->lazy_head = b->head;
    ss->lazy_tail = b->tail;
    return false;
  }
  if (ss->lazy_head && ss->lazy_head == ss->lazy_tail && b->nworks == 1) {
    /* two single ops: compare directly, insert only if they go together */
    const ncfsm_work *x = ss->lazy_head, *y = b->head;
    if (x->comm == y->comm)
      for (int i = 0; i < x->nspan; i++)
        for (int j = 0; j < y->nspan; j++)
          if ((x->span[i].write || y->span[j].write) && x->span[i].lo < y->span[j].hi &&
              y->span[j].lo < x->span[i].hi)
            return true;
  }
  if (ss->lazy_head) {
    for (const ncfsm_work *w = ss->lazy_head;; w = w->bnext) {
      spanset_insert_work(ss, w);
      if (w == ss->lazy_tail) break;
    }
    ss->lazy_head = ss->lazy_tail = NULL;
  }
  if (b->nworks == 1) { /* the coalesced stream's case: one lookup of its comm for the check and the insert */
    const ncfsm_work *w = b->head;
    if (ss->nspans + 2 > ss->cap) return true; /* full: next launch */
    if (!w->nspan) return false;
    ncfsm__rcomm *t = comm_trees(ss, (uintptr_t)w->comm, true); /* a new comm's trees are empty */
    if (spanset_hit(ss, t, w)) return true;
    spanset_insert_in(ss, t, w);
    return false;
  }
  for (const ncfsm_work *w = b->head; w; w = w->bnext)
    if (spanset_hit(ss, comm_trees(ss, (uintptr_t)w->comm, false), w)) return true;
  if (ss->nspans + 2 * b->nworks > ss->cap) return true; /* full: next launch */
  for (const ncfsm_work *w = b->head; w; w = w->bnext) spanset_insert_work(ss, w);
  return false;
}

ncfsm__spanset *ncfsm__spanset_new(unsigned max_ops) {
  ncfsm__spanset *ss = calloc(1, sizeof *ss);
  if (!ss) return NULL;
  ss->cap = 2 * (int)max_ops + 2;
  ss->node = calloc((size_t)ss->cap, sizeof *ss->node);
  ss->comm = calloc((size_t)ss->cap, sizeof *ss->comm);
  ss->works = calloc((size_t)ss->cap, sizeof *ss->works);
  ss->seed = 0x9e3779b9u;
  if (!ss->node || !ss->comm || !ss->works) {
    ncfsm__spanset_free(ss);
    return NULL;
  }
  return ss;
}

void ncfsm__spanset_free(ncfsm__spanset *ss) {
  if (!ss) return;
  free(ss->node);
  free(ss->comm);
  free(ss->works);
  free(ss);
}

void ncfsm__spanset_reset(ncfsm__spanset *ss) {
  ss->nnode = ss->nspans = ss->nworks = ss->ncomm = ss->last = 0;
  ss->lazy_head = ss->lazy_tail = NULL;
}

/* ---- R12 overlap detection ---------------------------------------------------------- */

typedef struct {
  ncfsm__span s;
  ncfsm_work *w;
} span;

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->s.lo < y->s.lo ? -1 : x->s.lo > y->s.lo;
}

bool ncfsm__find_overlap(ncfsm_work *list, ncfsm_work **x, ncfsm_work **y) {
  if (!list || !list->bnext) return false; /* one op overlaps nothing (a group of one, every ungrouped op) */
  int n = 0;
  for (ncfsm_work *w = list; w; w = w->bnext) {
    need_spans(w);
    n += 2;
  }
  if (n <= 2) return false;
  span stack[64], *s = n <= 64 ? stack : malloc((size_t)n * sizeof *s);
  if (!s) return false;
  int k = 0;
  for (ncfsm_work *w = list; w; w = w->bnext)
    for (int i = 0; i < w->nspan; i++) s[k++] = (span){w->span[i], w};
  qsort(s, (size_t)k, sizeof *s, span_cmp);
  bool hit = false;
  /* Sweep: compare each span with the later ones that start before it ends. */
  for (int i = 0; i < k && !hit; i++)
    for (int j = i + 1; j < k && s[j].s.lo < s[i].s.hi; j++)
      if (s[i].w != s[j].w && s[i].w->comm == s[j].w->comm && (s[i].s.write || s[j].s.write)) {
        *x = s[i].w;
        *y = s[j].w;
        hit = true;
        break;
      }
  if (s != stack) free(s);
  return hit;
}

