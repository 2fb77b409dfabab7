/* Buffer ranges (R12): the ranges each op touches on its rank, the
 * launcher's check that a launch holds no two ops of one comm that overlap
 * where one writes, and the group-end check of the same. */
#include <stdlib.h>
#include <string.h>

#include "fsm/objects.h"

/*
 * The launcher's R12 check: the buffer ranges already taken in this launch,
 * sorted by (comm, lo). Taken writes never overlap anything else taken for
 * their comm (each work was checked before it went in), so a new range can
 * only hit the write just before it in order; reads may overlap each other,
 * so they carry the running maximum of hi within their comm. A query is a
 * binary search, an insert a memmove of at most 2 * coalesce_max entries.
 */
typedef struct {
  uintptr_t comm, lo, hi, maxhi;
} ncfsm__range;

static void range_insert(ncfsm__range *a, int *n, uintptr_t comm, uintptr_t lo, uintptr_t hi);

struct ncfsm__spanset {
  ncfsm__range *w, *r;
  int nw, nr, cap;
  /* The first batch of a launch is only inserted when a second one is
   * examined: a launch of one batch (the latency path) costs nothing here. */
  const ncfsm_work *lazy_head, *lazy_tail;
};

static void spanset_insert_work(ncfsm__spanset *ss, const ncfsm_work *w) {
  for (int i = 0; i < w->nspan; i++) {
    if (w->span[i].write) range_insert(ss->w, &ss->nw, (uintptr_t)w->comm, w->span[i].lo, w->span[i].hi);
    else range_insert(ss->r, &ss->nr, (uintptr_t)w->comm, w->span[i].lo, w->span[i].hi);
  }
}

static int range_lower_bound(const ncfsm__range *a, int n, uintptr_t comm, uintptr_t lo) {
  int l = 0, h = n;
  while (l < h) {
    int m = (l + h) / 2;
    if (a[m].comm < comm || (a[m].comm == comm && a[m].lo < lo)) l = m + 1;
    else h = m;
  }
  return l;
}

/* Does [lo, hi) of comm overlap a range of a? (a: writes, or reads with maxhi) */
static bool range_hit(const ncfsm__range *a, int n, uintptr_t comm, uintptr_t lo, uintptr_t hi) {
  int i = range_lower_bound(a, n, comm, hi) - 1;
  return i >= 0 && a[i].comm == comm && a[i].maxhi > lo;
}

static void range_insert(ncfsm__range *a, int *n, uintptr_t comm, uintptr_t lo, uintptr_t hi) {
  int i = range_lower_bound(a, *n, comm, lo);
  memmove(a + i + 1, a + i, (size_t)(*n - i) * sizeof *a);
  a[i] = (ncfsm__range){comm, lo, hi, hi};
  (*n)++;
  for (int j = i; j < *n && a[j].comm == comm; j++) {
    uintptr_t prev = j > 0 && a[j - 1].comm == comm ? a[j - 1].maxhi : 0;
    a[j].maxhi = a[j].hi > prev ? a[j].hi : prev;
  }
}

bool ncfsm__spanset_take(ncfsm__spanset *ss, const ncfsm__batch *b) {
  if (!ss->lazy_head && ss->nw + ss->nr == 0) {
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
  for (const ncfsm_work *w = b->head; w; w = w->bnext)
    for (int i = 0; i < w->nspan; i++) {
      uintptr_t cm = (uintptr_t)w->comm;
      if (range_hit(ss->w, ss->nw, cm, w->span[i].lo, w->span[i].hi)) return true;
      if (w->span[i].write && range_hit(ss->r, ss->nr, cm, w->span[i].lo, w->span[i].hi)) return true;
    }
  if (ss->nw + ss->nr + 2 * b->nworks > ss->cap) return true; /* full: next launch */
  for (const ncfsm_work *w = b->head; w; w = w->bnext) spanset_insert_work(ss, w);
  return false;
}

ncfsm__spanset *ncfsm__spanset_new(unsigned max_ops) {
  ncfsm__spanset *ss = calloc(1, sizeof *ss);
  if (!ss) return NULL;
  ss->cap = 2 * (int)max_ops + 2;
  ss->w = calloc((size_t)ss->cap, sizeof *ss->w);
  ss->r = calloc((size_t)ss->cap, sizeof *ss->r);
  if (!ss->w || !ss->r) {
    ncfsm__spanset_free(ss);
    return NULL;
  }
  return ss;
}

void ncfsm__spanset_free(ncfsm__spanset *ss) {
  if (!ss) return;
  free(ss->w);
  free(ss->r);
  free(ss);
}

void ncfsm__spanset_reset(ncfsm__spanset *ss) {
  ss->nw = ss->nr = 0;
  ss->lazy_head = ss->lazy_tail = NULL;
}

/* ---- R12 overlap detection ---------------------------------------------------------- */

/* Bytes each buffer of an op touches on this rank. */
void ncfsm__work_spans(ncfsm_work *w) {
  const ncfsm__op *o = &w->op;
  size_t es = ncfsm_dtype_size(o->dtype), nr = (size_t)w->comm->nranks;
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
  if (in && o->send) w->span[w->nspan++] = (ncfsm__span){(uintptr_t)o->send, (uintptr_t)o->send + in, false};
  if (out && o->recv) w->span[w->nspan++] = (ncfsm__span){(uintptr_t)o->recv, (uintptr_t)o->recv + out, true};
}

typedef struct {
  ncfsm__span s;
  ncfsm_work *w;
} span;

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->s.lo < y->s.lo ? -1 : x->s.lo > y->s.lo;
}

bool ncfsm__find_overlap(ncfsm_work *list, ncfsm_work **x, ncfsm_work **y) {
  int n = 0;
  for (ncfsm_work *w = list; w; w = w->bnext) n += 2;
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

