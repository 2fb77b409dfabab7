/* The loop's hot-path indexes of its comms (docs/design.md "The hot path"),
 * so that a turn or a launch costs the same whatever the number of comms:
 *  - the active list: the comms a turn's progress pass visits (something in
 *    flight, launching or queued, a state that polls, has a deadline or a
 *    control step, verification that needs a turn; a comm whose verifier another thread gave
 *    something to look at comes through the attention stack);
 *  - the launch heap: the comms with a non-empty launch queue, by the order
 *    of their head batch (the launcher's next launch is its minimum);
 *  - the peer rings: the comms of one clique on this loop (the same unique
 *    id), linked once after a comm's id changed, not compared per launch. */
#include <stdlib.h>
#include <string.h>

#include "fsm/objects.h"

/* ---- the active list ----------------------------------------------------------------- */

/* The list is in seqno order, descending. A program that uses its comms oldest first (the
 * ranks of a clique, a round over its groups) enlists each at the head; one that goes the other
 * way, at the tail; else c goes in at its place when that is a few steps from the tail, or at
 * the tail and the next turn sorts. */
#define ENLIST_STEPS 4

void ncfsm__comm_enlist_slow(ncfsm_comm *c) {
  ncfsm_loop *loop = c->loop;
  ncfsm_comm *p = loop->act_tail;
  if (loop->act_head && loop->act_head->seqno < c->seqno) {
    p = NULL;
  } else if (p && p->seqno < c->seqno) {
    for (int k = 0; p && p->seqno < c->seqno && k < ENLIST_STEPS; k++) p = p->act_prev;
    if (!p || p->seqno < c->seqno) { /* too far: at the tail */
      p = loop->act_tail;
      loop->act_unsorted = true;
    }
  }
  c->on_act = true;
  c->act_prev = p; /* c goes after p (NULL: at the head) */
  c->act_next = p ? p->act_next : loop->act_head;
  if (c->act_next) c->act_next->act_prev = c;
  else loop->act_tail = c;
  if (p) p->act_next = c;
  else loop->act_head = c;
}

void ncfsm__comm_delist(ncfsm_comm *c) {
  if (!c->on_act) return;
  ncfsm_loop *loop = c->loop;
  if (c->act_prev) c->act_prev->act_next = c->act_next;
  else loop->act_head = c->act_next;
  if (c->act_next) c->act_next->act_prev = c->act_prev;
  else loop->act_tail = c->act_prev;
  c->act_next = c->act_prev = NULL;
  c->on_act = false;
}

/* A merge sort of the list by seqno, descending (bottom-up: no recursion,
 * no memory), then the back links. */
void ncfsm__active_sort(ncfsm_loop *loop) {
  ncfsm_comm *list = loop->act_head;
  for (size_t k = 1;; k *= 2) {
    ncfsm_comm *p = list, *tail = NULL;
    list = NULL;
    int merges = 0;
    while (p) {
      merges++;
      ncfsm_comm *q = p;
      size_t psize = 0, qsize = k;
      while (psize < k && q) {
        psize++;
        q = q->act_next;
      }
      while (psize > 0 || (qsize > 0 && q)) {
        ncfsm_comm *e;
        if (!psize) e = q, q = q->act_next, qsize--;
        else if (!qsize || !q || p->seqno >= q->seqno) e = p, p = p->act_next, psize--;
        else e = q, q = q->act_next, qsize--;
        if (tail) tail->act_next = e;
        else list = e;
        tail = e;
      }
      p = q;
    }
    if (tail) tail->act_next = NULL;
    if (merges <= 1) break;
  }
  ncfsm_comm *prev = NULL;
  for (ncfsm_comm *c = list; c; prev = c, c = c->act_next) c->act_prev = prev;
  loop->act_head = list;
  loop->act_tail = prev;
  loop->act_unsorted = false;
}

/* ---- the attention stack -------------------------------------------------------------- */

/* A Treiber stack that is only pushed and emptied whole: no ABA (a comm popped and pushed
 * again while another push is under way is a new head with a next of its own). att_queued
 * keeps a comm on it once; its exchanges, acq_rel, order the pusher's attention bits before
 * the turn that takes the comm reads them. */
void ncfsm__comm_attend_async(ncfsm_comm *c) {
  ncfsm_loop *loop = c->loop;
  if (atomic_exchange_explicit(&c->att_queued, true, memory_order_acq_rel)) return; /* the turn will take it */
  ncfsm_comm *h = atomic_load_explicit(&loop->att_head, memory_order_relaxed);
  do c->att_next = h;
  while (!atomic_compare_exchange_weak_explicit(&loop->att_head, &h, c, memory_order_release, memory_order_relaxed));
  loop->ops->wake(loop);
}

void ncfsm__attend_take(ncfsm_loop *loop) {
  ncfsm_comm *c = atomic_exchange_explicit(&loop->att_head, NULL, memory_order_acquire);
  while (c) {
    ncfsm_comm *next = c->att_next;
    c->att_next = NULL;
    atomic_exchange_explicit(&c->att_queued, false, memory_order_acq_rel);
    ncfsm__comm_enlist(c);
    c = next;
  }
}

void ncfsm__comm_attend_forget(ncfsm_comm *c) {
  if (atomic_load_explicit(&c->att_queued, memory_order_acquire)) ncfsm__attend_take(c->loop);
}

void ncfsm__enlist_all(ncfsm_loop *loop) {
  for (ncfsm_comm *c = loop->comms; c; c = c->next) ncfsm__comm_enlist(c);
}


/* ---- the launch heap ----------------------------------------------------------------- */

static uint64_t key(const ncfsm_comm *c) { return c->bq_head->b->order; }

static void heap_set(ncfsm_loop *loop, int i, ncfsm_comm *c) {
  loop->qh[i] = c;
  c->qh_pos = i + 1;
}

static void sift_up(ncfsm_loop *loop, int i) {
  ncfsm_comm *c = loop->qh[i];
  uint64_t k = key(c);
  while (i > 0) {
    int p = (i - 1) / 2;
    if (key(loop->qh[p]) <= k) break;
    heap_set(loop, i, loop->qh[p]);
    i = p;
  }
  heap_set(loop, i, c);
}

static void sift_down(ncfsm_loop *loop, int i) {
  ncfsm_comm *c = loop->qh[i];
  uint64_t k = key(c);
  for (;;) {
    int l = 2 * i + 1, m = l;
    if (l >= loop->nqh) break;
    if (l + 1 < loop->nqh && key(loop->qh[l + 1]) < key(loop->qh[l])) m = l + 1;
    if (key(loop->qh[m]) >= k) break;
    heap_set(loop, i, loop->qh[m]);
    i = m;
  }
  heap_set(loop, i, c);
}

bool ncfsm__qheap_reserve(ncfsm_loop *loop, int n) {
  if (n <= loop->capqh) return true;
  int cap = loop->capqh ? loop->capqh : 16;
  while (cap < n) cap *= 2;
  ncfsm_comm **q = realloc(loop->qh, (size_t)cap * sizeof *q);
  if (!q) return false;
  loop->qh = q;
  loop->capqh = cap;
  return true;
}

void ncfsm__qheap_fix_slow(ncfsm_comm *c) {
  ncfsm_loop *loop = c->loop;
  if (!c->bq_head) {
    if (!c->qh_pos) return;
    int i = c->qh_pos - 1;
    c->qh_pos = 0;
    ncfsm_comm *last = loop->qh[--loop->nqh];
    if (i == loop->nqh) return;
    heap_set(loop, i, last);
    sift_up(loop, i);
    sift_down(loop, last->qh_pos - 1);
    return;
  }
  if (!c->qh_pos) { /* room: reserved for every comm of the loop (ncfsm__qheap_reserve) */
    heap_set(loop, loop->nqh++, c);
    sift_up(loop, c->qh_pos - 1);
    return;
  }
  sift_up(loop, c->qh_pos - 1);
  sift_down(loop, c->qh_pos - 1);
}

/* The heap is ordered by key: a subtree whose root is not skipped holds no
 * smaller key that is not skipped, so only skipped nodes are descended. */
static ncfsm_comm *min_from(ncfsm_loop *loop, int i, bool (*skip)(const ncfsm_comm *, void *), void *arg) {
  if (i >= loop->nqh) return NULL;
  ncfsm_comm *c = loop->qh[i];
  if (!skip(c, arg)) return c;
  ncfsm_comm *l = min_from(loop, 2 * i + 1, skip, arg), *r = min_from(loop, 2 * i + 2, skip, arg);
  if (!l) return r;
  if (!r) return l;
  return key(l) <= key(r) ? l : r;
}

ncfsm_comm *ncfsm__qheap_min_slow(ncfsm_loop *loop, bool (*skip)(const ncfsm_comm *, void *), void *arg) {
  return min_from(loop, 0, skip, arg);
}

/* ---- peer rings ---------------------------------------------------------------------- */

typedef struct {
  ncfsm_comm *c;
  uint64_t h;
  int pos;
} peer_key;

static int peer_cmp(const void *a, const void *b) {
  const peer_key *x = a, *y = b;
  if (x->h != y->h) return x->h < y->h ? -1 : 1;
  int d = memcmp(&x->c->uid, &y->c->uid, sizeof x->c->uid);
  if (d) return d;
  return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static uint64_t uid_hash(const ncfsm_unique_id *id) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a: only groups equal ids, which memcmp confirms */
  const unsigned char *p = (const unsigned char *)id;
  for (size_t i = 0; i < sizeof *id; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* Every comm of the loop in the ring of the comms with its unique id, each
 * ring in the order of loop->comms. */
static bool build_rings(ncfsm_loop *loop) {
  int n = loop->ncomms;
  peer_key *k = malloc((size_t)(n ? n : 1) * sizeof *k);
  if (!k) return false;
  int i = 0;
  for (ncfsm_comm *c = loop->comms; c && i < n; c = c->next, i++) k[i] = (peer_key){c, uid_hash(&c->uid), i};
  n = i;
  qsort(k, (size_t)n, sizeof *k, peer_cmp);
  for (int s = 0; s < n;) {
    int e = s + 1;
    while (e < n && k[e].h == k[s].h && !memcmp(&k[e].c->uid, &k[s].c->uid, sizeof k[s].c->uid)) e++;
    for (int j = s; j < e; j++) {
      k[j].c->peer_next = k[j + 1 < e ? j + 1 : s].c;
      k[j].c->npeers = e - s;
    }
    s = e;
  }
  free(k);
  loop->peers_built = loop->peers_gen;
  return true;
}

int ncfsm__comm_peers(ncfsm_comm *c) {
  ncfsm_loop *loop = c->loop;
  if (loop->peers_built != loop->peers_gen && !build_rings(loop)) return -1;
  return c->npeers;
}
