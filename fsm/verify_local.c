/*
 * In-process verification (opts.verify async, the default, for a comm whose
 * ranks are all in this process: ncfsm_comm_init / ncfsm_comm_init_all,
 * and split children of such comms). No channel is needed: the ranks of a
 * clique (one comm id) register in a process-wide registry, and each rank
 * publishes the fingerprint of every collective it launches in a ring of
 * its own (single writer; words written with relaxed atomics, then its
 * next seq, seq_cst). Any rank can then compare every seq that all
 * ranks launched, field by field, and name the first that differs with
 * each rank's value; and when a collective of its own waits longer than
 * verify_stall_ms, name the ranks that never launched it and the last seq
 * each reached. A failure of one rank's comm is recorded in the clique and
 * fails the others at their next turn, naming it (PEER_FAILED).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm/verify.h"

#define LRING 2048 /* fingerprints per rank: more than NCCL lets a rank run ahead (R13) */
#define PRING 256  /* send/recv fingerprints per (rank, peer, direction) */
#define FPW (sizeof(ncfsm_fingerprint_t) / sizeof(uint64_t))
#define SLOTW (FPW + 1) /* a collective's slot: its fingerprint, then the rolling hash with it folded in */
_Static_assert(sizeof(ncfsm_fingerprint_t) % sizeof(uint64_t) == 0, "a fingerprint is whole 64-bit words");

/* A rank's sends to one peer, or its receives from one: per-pair seqs. */
typedef struct pring {
  _Atomic uint64_t next;
  uint64_t ring[PRING][FPW];
} pring;

typedef struct lmember {
  _Atomic uint64_t next_seq; /* the seq its next collective takes: ring[s % LRING] holds s < next_seq */
  uint64_t ring[LRING][SLOTW];
  pring *_Atomic *p2p;       /* [2 * nranks]: sends to peer p at 2p, receives from it at 2p + 1 (made on use) */
  struct ncfsm__verifier *v; /* NULL: not registered (yet, or any more) */
  ncfsm_loop *loop;
  _Atomic int inbox;         /* the clique's failure is for it to apply */
  _Atomic unsigned att;      /* ATT_*: what its verifier must look at (its busy hook reads only this) */
} lmember;

typedef struct lclique {
  uint64_t id;
  int nranks, nreg, refs;
  lmember *m;
  _Atomic uint64_t checked; /* every seq below it was compared equal on every rank (by whichever rank looked) */
  _Atomic int diverged;      /* seq dseq differs (dreport, written under lmu before this is set) */
  uint64_t dseq;
  char dreport[512];
  /* the first failure of one of its ranks' comms */
  bool failed;
  int origin;
  uint64_t fseq; /* the seq its next collective would have taken */
  ncfsm_result_t fcause;
  char fwhat[400];
  struct lclique *next;
} lclique;

struct ncfsm__lv {
  lclique *q;        /* NULL until registered (a split child learns its rank at INIT_DONE) */
  uint64_t *p2p_checked; /* [2 * nranks]: per pair of this rank (its sends to p, its receives from p) */
  bool p2p_dirty;    /* a send or receive of it is not compared yet */
  int rank;
  lmember *me;       /* its member of q */
  int nothers;       /* the clique's other ranks, for the launch hook: */
  lmember **others;  /* [nothers] (NULL: out of memory, or 1 rank) */
  bool full;         /* every rank registered once (nreg never goes down) */
  uint64_t checked;  /* the clique's divergence, once seen: the seq that differs */
  uint64_t t_start;
  bool stall_due;    /* the watchdog saw a launch of it older than the stall bound */
  bool diverged;     /* seq `checked` differs (report): DIVERGED once the collectives before it finished */
  char report[512];
};

static pthread_mutex_t lmu = PTHREAD_MUTEX_INITIALIZER;
static lclique *lhead;

/* Attention bits of a member, set by any rank, cleared by its own poll. */
#define ATT_INBOX 1u    /* a peer's failure */
#define ATT_DIVERGED 2u /* the clique found a seq that differs */
#define ATT_OWN 8u      /* its own: a send/recv to compare, a stall to look at, a divergence to fail on */

static bool compare(struct ncfsm__verifier *v, char *what, size_t len);

/* m's verifier must look at bits: its comm is given a turn. held: the loop whose lock the
 * caller holds (every caller is a hook or poll of a verifier). A member on that loop is
 * enlisted at once; one on another loop goes through that loop's attention stack. A member
 * not registered (m->v NULL, read under lmu or for the caller's own member) has no comm. */
static void attend(lmember *m, unsigned bits, const ncfsm_loop *held) {
  atomic_fetch_or_explicit(&m->att, bits, memory_order_release);
  if (!m->v) return;
  if (m->loop == held) ncfsm__comm_enlist(m->v->c);
  else ncfsm__comm_attend_async(m->v->c);
}

/* ---- the registry ----------------------------------------------------------------------- */

static void reg(struct ncfsm__verifier *v) {
  ncfsm_comm *c = v->c;
  struct ncfsm__lv *lv = v->local;
  if (lv->q || c->nranks < 2 || c->rank < 0 || c->rank >= c->nranks) return;
  pthread_mutex_lock(&lmu);
  lclique *q = lhead;
  while (q && !(q->id == c->comm_id && q->nranks == c->nranks && !q->m[c->rank].v)) q = q->next;
  if (!q) { /* the first rank of this clique here (or its comm id was taken by a live rank: a new clique) */
    q = calloc(1, sizeof *q);
    if (q) q->m = calloc((size_t)c->nranks, sizeof *q->m);
    if (!q || !q->m) {
      free(q);
      pthread_mutex_unlock(&lmu);
      NCFSM_WARN(NCFSM__SUB_FSM, "[%s rank %d] verification: out of memory: this comm is not verified", c->name,
                 c->rank);
      return;
    }
    for (int r = 0; r < c->nranks && q; r++)
      if (!(q->m[r].p2p = calloc(2 * (size_t)c->nranks, sizeof *q->m[r].p2p))) {
        for (int k = 0; k < r; k++) free(q->m[k].p2p);
        free(q->m);
        free(q);
        q = NULL;
      }
    if (!q) {
      pthread_mutex_unlock(&lmu);
      NCFSM_WARN(NCFSM__SUB_FSM, "[%s rank %d] verification: out of memory: this comm is not verified", c->name,
                 c->rank);
      return;
    }
    q->id = c->comm_id;
    q->nranks = c->nranks;
    q->next = lhead;
    lhead = q;
  }
  q->m[c->rank].v = v;
  q->m[c->rank].loop = c->loop;
  __atomic_add_fetch(&q->nreg, 1, __ATOMIC_RELEASE); /* read without lmu by the ranks' checks */
  q->refs++;
  lv->q = q;
  lv->rank = c->rank;
  c->verify_att = &q->m[c->rank].att; /* the engine's busy test reads it inline */
  attend(&q->m[c->rank], ATT_OWN, c->loop); /* its first turn in service starts it */
  lv->p2p_checked = calloc(2 * (size_t)c->nranks, sizeof *lv->p2p_checked); /* NULL: sends and receives unchecked */
  lv->me = &q->m[c->rank];
  if ((lv->others = malloc((size_t)(c->nranks - 1) * sizeof *lv->others)))
    for (int r = 0; r < c->nranks; r++)
      if (r != c->rank) lv->others[lv->nothers++] = &q->m[r];
  if (q->failed) { /* a peer failed before this rank registered */
    atomic_store(&q->m[c->rank].inbox, 1);
    attend(&q->m[c->rank], ATT_INBOX, c->loop);
  }
  pthread_mutex_unlock(&lmu);
}

static void unreg(struct ncfsm__lv *lv) {
  lclique *q = lv->q;
  if (!q) return;
  pthread_mutex_lock(&lmu);
  q->m[lv->rank].v->c->verify_att = NULL;
  q->m[lv->rank].v = NULL;
  q->m[lv->rank].loop = NULL;
  if (--q->refs == 0) {
    for (lclique **pp = &lhead; *pp; pp = &(*pp)->next)
      if (*pp == q) {
        *pp = q->next;
        break;
      }
    for (int r = 0; r < q->nranks; r++) {
      for (int k = 0; k < 2 * q->nranks; k++) free(atomic_load(&q->m[r].p2p[k]));
      free(q->m[r].p2p);
    }
    free(q->m);
    free(q);
  }
  pthread_mutex_unlock(&lmu);
  lv->q = NULL;
  free(lv->p2p_checked);
  lv->p2p_checked = NULL;
  free(lv->others);
  lv->others = NULL;
  lv->nothers = 0;
  lv->full = false;
}

/* ---- publishing and reading fingerprints -------------------------------------------------- */

static bool is_p2p(const ncfsm_fingerprint_t *f) { return f->op == NCFSM_KIND_SEND || f->op == NCFSM_KIND_RECV; }

/* Five relaxed stores, written out: a loop of atomic stores is not unrolled,
 * and this is on every launch. */
_Static_assert(FPW == 5, "put_words writes a fingerprint of five words");
static inline __attribute__((always_inline)) uint64_t word(const ncfsm_fingerprint_t *f, int i) {
  uint64_t x;
  memcpy(&x, (const unsigned char *)f + 8 * i, sizeof x); /* one load each: no copy of the whole */
  return x;
}
static inline __attribute__((always_inline)) void put_words(uint64_t *slot, const ncfsm_fingerprint_t *f) {
  __atomic_store_n(&slot[0], word(f, 0), __ATOMIC_RELAXED);
  __atomic_store_n(&slot[1], word(f, 1), __ATOMIC_RELAXED);
  __atomic_store_n(&slot[2], word(f, 2), __ATOMIC_RELAXED);
  __atomic_store_n(&slot[3], word(f, 3), __ATOMIC_RELAXED);
  __atomic_store_n(&slot[4], word(f, 4), __ATOMIC_RELAXED);
}

/* A send or receive: published in its pair's ring, compared at a poll (out of line: it keeps
 * the collectives' path below a leaf that saves no registers). */
static __attribute__((noinline)) void launched_p2p(struct ncfsm__verifier *v, struct ncfsm__lv *lv, lmember *me,
                                                   const ncfsm_work *w) {
  int k = 2 * w->fp.peer + (w->fp.op == NCFSM_KIND_RECV);
  pring *pr = atomic_load_explicit(&me->p2p[k], memory_order_acquire);
  if (!pr) { /* its first with this peer (this rank is the ring's only writer) */
    if (!(pr = calloc(1, sizeof *pr))) return; /* unverified: its peer's side finds nothing to compare */
    atomic_store_explicit(&me->p2p[k], pr, memory_order_release);
  }
  put_words(pr->ring[w->fp.seq % PRING], &w->fp);
  atomic_store_explicit(&pr->next, w->fp.seq + 1, memory_order_release);
  lv->p2p_dirty = true;
  attend(me, ATT_OWN, v->c->loop);
}

/* Its first launch registers it (out of line, as above). */
static __attribute__((noinline)) bool launched_reg(struct ncfsm__verifier *v) {
  reg(v);
  return v->local->q != NULL;
}

void ncfsm__vlocal_launched(struct ncfsm__verifier *v, const ncfsm_work *w) {
  struct ncfsm__lv *lv = v->local;
  if (__builtin_expect(!lv->q, 0) && !launched_reg(v)) return;
  lmember *me = lv->me;
  if (is_p2p(&w->fp)) {
    launched_p2p(v, lv, me, w);
    return;
  }
  uint64_t sq = w->fp.seq, h = v->c->hash, *slot = me->ring[sq % LRING];
  put_words(slot, &w->fp);
  __atomic_store_n(&slot[FPW], h, __ATOMIC_RELAXED); /* the comm's rolling hash, this one folded in */
  /* seq_cst, as the loads of the others' below: of ranks that launch seq sq
   * at once on several threads, the last in that order sees every other's,
   * so that some rank always completes it (and compares it, here: no loop
   * turn is needed for a clique that agrees) */
  atomic_store_explicit(&me->next_seq, sq + 1, memory_order_seq_cst);
  if (!lv->full) { /* a rank not registered yet has launched nothing: its launch compares */
    if (__atomic_load_n(&lv->q->nreg, __ATOMIC_ACQUIRE) < lv->q->nranks || !lv->others) return;
    lv->full = true;
  }
  if (lv->diverged) return;
  /* the common case: each rank's rolling hash at sq is this one's (equal
   * at sq, equal at every seq before it: R11's hash is XXH3) */
  bool same = true;
  for (int i = 0; i < lv->nothers; i++) {
    lmember *o = lv->others[i];
    if (atomic_load_explicit(&o->next_seq, memory_order_seq_cst) <= sq) return; /* not launched there: its launch compares */
    /* acquire: the check that its ring still holds sq comes after the read */
    same = same && __atomic_load_n(&o->ring[sq % LRING][FPW], __ATOMIC_ACQUIRE) == h &&
           atomic_load_explicit(&o->next_seq, memory_order_relaxed) <= sq + LRING;
  }
  lclique *q = lv->q;
  if (same) { /* the clique's mark moves on (whoever compared furthest) */
    uint64_t cur = atomic_load_explicit(&q->checked, memory_order_relaxed);
    while (cur <= sq && !atomic_compare_exchange_weak(&q->checked, &cur, sq + 1)) {
    }
    return;
  }
  if (compare(v, lv->report, sizeof lv->report)) { /* the first seq that differs, field by field */
    lv->diverged = true; /* its next turn fails the comm (never inside a launch) */
    attend(me, ATT_OWN, v->c->loop);
  }
}

/* The fingerprint of seq s in a ring of n slots whose next seq is *next:
 * false when the ring no longer holds it (its writer went n past s). */
static bool read_slot(const uint64_t *slot, unsigned n, _Atomic uint64_t *next, uint64_t s, ncfsm_fingerprint_t *out) {
  uint64_t words[FPW];
  /* acquire: the check of the writer's next seq below is not done before them */
  for (size_t i = 0; i < FPW; i++) words[i] = __atomic_load_n(&slot[i], __ATOMIC_ACQUIRE);
  if (atomic_load_explicit(next, memory_order_acquire) > s + n) return false;
  memcpy(out, words, sizeof words);
  return out->seq == s;
}

static bool read_fp(lmember *m, uint64_t s, ncfsm_fingerprint_t *out) {
  return read_slot(m->ring[s % LRING], LRING, &m->next_seq, s, out);
}

/* ---- the checks ------------------------------------------------------------------------------ */

/* The lowest next seq of the clique's ranks: every seq below it was launched everywhere. */
static uint64_t all_launched(const lclique *q) {
  uint64_t lo = UINT64_MAX;
  for (int r = 0; r < q->nranks; r++) {
    uint64_t n = atomic_load_explicit(&q->m[r].next_seq, memory_order_acquire);
    if (n < lo) lo = n;
  }
  return lo;
}


/* Compare every seq all ranks launched since the last check; true (and the
 * report in what) at the first that differs. */
static bool compare(struct ncfsm__verifier *v, char *what, size_t len) {
  struct ncfsm__lv *lv = v->local;
  lclique *q = lv->q;
  if (atomic_load_explicit(&q->diverged, memory_order_acquire)) goto seen; /* another rank found it */
  uint64_t lo = atomic_load_explicit(&q->checked, memory_order_acquire), hi = all_launched(q);
  if (lo >= hi) return false;
  /* the common case: the rolling hashes at the last seq every rank
   * launched are equal, so is every seq before it (R11's hash: XXH3) */
  bool same = true;
  uint64_t h = __atomic_load_n(&q->m[0].ring[(hi - 1) % LRING][FPW], __ATOMIC_RELAXED);
  for (int r = 1; r < q->nranks && same; r++) same = __atomic_load_n(&q->m[r].ring[(hi - 1) % LRING][FPW], __ATOMIC_RELAXED) == h;
  bool diff = false;
  uint64_t s = same ? hi : lo;
  for (; s < hi && !diff; s++) { /* they differ: the first seq that does, field by field */
    ncfsm_fingerprint_t stack[8], *fps = q->nranks <= 8 ? stack : malloc((size_t)q->nranks * sizeof *fps);
    bool lost = !fps;
    for (int r = 0; r < q->nranks && !lost; r++) lost = !read_fp(&q->m[r], s, &fps[r]);
    /* lost: a rank ran more than LRING past it, not comparable any more */
    diff = !lost && ncfsm__verify_describe(fps, q->nranks, what, len);
    if (fps != stack) free(fps);
  }
  if (!same && !diff) { /* it differs, but in a collective older than some rank's ring: named by its hashes */
    snprintf(what, len,
             "verification: the collectives before seq %" PRIu64 " differ across ranks (R11): rolling hash of rank 0 "
             "%016" PRIx64 " and of another rank differ, and the differing collective is older than some rank's "
             "ring of %d (ncfsm-trace on the dumps may name it)",
             hi, h, LRING);
    diff = true;
    s = lo + 1;
  }
  if (!diff) { /* the clique's mark moves on (whoever compared furthest) */
    uint64_t cur = lo;
    while (cur < s && !atomic_compare_exchange_weak(&q->checked, &cur, s)) {
    }
    return false;
  }
  pthread_mutex_lock(&lmu);
  if (!atomic_load(&q->diverged)) {
    q->dseq = s - 1;
    snprintf(q->dreport, sizeof q->dreport, "%s", what);
    atomic_store_explicit(&q->diverged, 1, memory_order_release);
    for (int r = 0; r < q->nranks; r++) attend(&q->m[r], ATT_DIVERGED, v->c->loop);
  }
  pthread_mutex_unlock(&lmu);
seen:
  lv->checked = q->dseq;
  snprintf(what, len, "%s", q->dreport);
  return true;
}

static bool collective(const ncfsm_work *w) { return w->fp.op != NCFSM_KIND_SEND && w->fp.op != NCFSM_KIND_RECV; }

/* The oldest collective of c handed to NCCL and not finished (launching or
 * on a stream) whose seq is below `below`, or NULL. */
static const ncfsm_work *oldest_launched(const ncfsm_comm *c, uint64_t below) {
  const ncfsm_work *old = NULL;
  for (const ncfsm_work *w = c->launching; w; w = w->next)
    if (collective(w) && w->fp.seq < below && (!old || w->fp.seq < old->fp.seq)) old = w;
  for (int i = 0; i < c->nsq; i++)
    for (const ncfsm_work *w = c->sq[i].head; w; w = w->next)
      if (collective(w) && w->fp.seq < below && (!old || w->fp.seq < old->fp.seq)) {
        old = w;
        break; /* a stream's works are in seq order */
      }
  return old;
}

/* The sends and receives between this rank and each peer: a send's count
 * and type must be its receive's. True (and the report) at the first pair
 * seq that differs; clears p2p_dirty once every pair is compared up to
 * what both sides launched. */
static bool compare_p2p(struct ncfsm__verifier *v, char *what, size_t len) {
  struct ncfsm__lv *lv = v->local;
  lclique *q = lv->q;
  if (!lv->p2p_checked) return false;
  bool behind = false;
  for (int p = 0; p < q->nranks; p++) {
    if (p == lv->rank) continue;
    for (int dir = 0; dir < 2; dir++) { /* 0: my sends to p, 1: my receives from p */
      pring *mine = atomic_load_explicit(&q->m[lv->rank].p2p[2 * p + dir], memory_order_acquire);
      pring *theirs = atomic_load_explicit(&q->m[p].p2p[2 * lv->rank + (1 - dir)], memory_order_acquire);
      if (!mine) continue;
      uint64_t my_next = atomic_load_explicit(&mine->next, memory_order_acquire);
      uint64_t their_next = theirs ? atomic_load_explicit(&theirs->next, memory_order_acquire) : 0;
      uint64_t hi = my_next < their_next ? my_next : their_next, *at = &lv->p2p_checked[2 * p + dir];
      for (; *at < hi; (*at)++) {
        ncfsm_fingerprint_t a, b;
        if (!read_slot(mine->ring[*at % PRING], PRING, &mine->next, *at, &a) ||
            !read_slot(theirs->ring[*at % PRING], PRING, &theirs->next, *at, &b))
          continue;
        int sender = dir ? p : lv->rank, receiver = dir ? lv->rank : p;
        const ncfsm_fingerprint_t *s = dir ? &b : &a, *r = dir ? &a : &b;
        if (ncfsm__verify_describe_pair(*at, sender, receiver, s->count, s->dtype, r->count, r->dtype, what, len))
          return true;
      }
      behind |= *at < my_next;
    }
  }
  lv->p2p_dirty = behind;
  return false;
}

int ncfsm__verify_inflight(const ncfsm_comm *c, const ncfsm_work **lists) {
  int nl = 0;
  lists[nl++] = c->launching;
  for (int i = 0; i < c->nsq && nl < 65; i++) lists[nl++] = c->sq[i].head;
  return nl;
}

/* Is some collective below seq s unfinished and able to complete on its
 * own: not in one launch with a collective from s on (a launch's works
 * complete together behind one event on each stream)? */
static bool completes_before(const ncfsm_comm *c, uint64_t s) {
  const ncfsm_work *lists[1 + 64];
  int nl = ncfsm__verify_inflight(c, lists);
  for (int a = 0; a < nl; a++)
    for (const ncfsm_work *w = lists[a]; w; w = w->next) {
      if (!collective(w) || w->fp.seq >= s) continue;
      bool tied = false; /* its launch holds a collective from s on */
      for (int b = 0; b < nl && !tied; b++)
        for (const ncfsm_work *x = lists[b]; x && !tied; x = x->next)
          tied = x->group == w->group && collective(x) && x->fp.seq >= s;
      if (!tied) return true;
    }
  return false;
}

/* A send or receive of this rank waiting longer than the stall bound whose
 * peer never posted its side: the peer named, with its last seq of the pair. */
static bool p2p_stalled(struct ncfsm__verifier *v, uint64_t now, uint64_t stall_ns, char *what, size_t len) {
  ncfsm_comm *c = v->c;
  struct ncfsm__lv *lv = v->local;
  const ncfsm_work *lists[1 + 64];
  int nl = ncfsm__verify_inflight(c, lists);
  for (int a = 0; a < nl; a++)
    for (const ncfsm_work *w = lists[a]; w; w = w->next) {
      if (!is_p2p(&w->fp) || now < w->t_launch || now - w->t_launch < stall_ns) continue;
      bool send = w->fp.op == NCFSM_KIND_SEND;
      int p = w->fp.peer;
      if (p < 0 || p >= lv->q->nranks) continue;
      pring *theirs = atomic_load_explicit(&lv->q->m[p].p2p[2 * lv->rank + (send ? 1 : 0)], memory_order_acquire);
      uint64_t next = theirs ? atomic_load_explicit(&theirs->next, memory_order_acquire) : 0;
      if (next > w->fp.seq) continue; /* its side is posted: NCCL has the pair */
      char where[64];
      if (next) snprintf(where, sizeof where, "its last %s is seq %" PRIu64, send ? "receive from it" : "send to it", next - 1);
      else snprintf(where, sizeof where, "it posted no %s", send ? "receive from it" : "send to it");
      snprintf(what, len,
               "verification: %s seq %" PRIu64 " %s rank %d was launched here %" PRIu64 " ms ago; rank %d never posted "
               "the matching %s (%s): it stopped, skipped it or is far behind",
               send ? "send" : "receive", w->fp.seq, send ? "to" : "from", p, (uint64_t)((now - w->t_launch) / 1000000u),
               p, send ? "receive" : "send", where);
      return true;
    }
  return false;
}

/* A collective of this rank waiting longer than verify_stall_ms: the ranks
 * that never launched it and where each is. */
static bool stalled(struct ncfsm__verifier *v, uint64_t now, char *what, size_t len) {
  ncfsm_comm *c = v->c;
  lclique *q = v->local->q;
  uint64_t stall_ns = c->opts.verify_stall_ms * 1000000ull;
  const ncfsm_work *old = oldest_launched(c, UINT64_MAX);
  if (stall_ns && p2p_stalled(v, now, stall_ns, what, len)) return true;
  if (!old || !stall_ns || now < old->t_launch || now - old->t_launch < stall_ns) return false;
  int n = snprintf(what, len, "verification: collective seq %" PRIu64 " (%s) was launched here %" PRIu64 " ms ago; ",
                   old->fp.seq, ncfsm_opkind_name((ncfsm_opkind_t)old->fp.op), (uint64_t)((now - old->t_launch) / 1000000u));
  int missing = 0;
  for (int r = 0; r < q->nranks && n > 0 && (size_t)n < len; r++) {
    uint64_t next = atomic_load_explicit(&q->m[r].next_seq, memory_order_acquire);
    if (next > old->fp.seq) continue;
    char where[64];
    if (next) snprintf(where, sizeof where, "its last collective is seq %" PRIu64, next - 1);
    else snprintf(where, sizeof where, "it launched no collective");
    n += snprintf(what + n, len - (size_t)n, "%srank %d never launched it (%s)", missing ? ", " : "", r, where);
    missing++;
  }
  if (!missing) return false; /* every rank launched it: NCCL has it (the watchdog's, not verification's) */
  if (n > 0 && (size_t)n < len)
    snprintf(what + n, len - (size_t)n, ": %s stopped, skipped a collective or is far behind",
             missing > 1 ? "they" : "it");
  return true;
}

bool ncfsm__vlocal_busy(const struct ncfsm__verifier *v) {
  const struct ncfsm__lv *lv = v->local;
  if (!lv->q) return v->c->nranks > 1 && ncfsm__has(v->c, NCFSM_SF_WORKS); /* to register (1 rank: nothing to compare) */
  return atomic_load_explicit(&lv->q->m[lv->rank].att, memory_order_relaxed) != 0;
}

void ncfsm__vlocal_stall_due(struct ncfsm__verifier *v) {
  struct ncfsm__lv *lv = v->local;
  lv->stall_due = true;
  if (lv->q) attend(&lv->q->m[lv->rank], ATT_OWN, v->c->loop);
}

void ncfsm__vlocal_quiet(struct ncfsm__verifier *v) {
  const struct ncfsm__lv *lv = v->local;
  if (lv->q) atomic_fetch_and(&lv->q->m[lv->rank].att, ATT_INBOX); /* nothing else matters out of RUNNING */
}

bool ncfsm__vlocal_told(const struct ncfsm__verifier *v) {
  const struct ncfsm__lv *lv = v->local;
  return lv->q && (atomic_load_explicit(&lv->q->m[lv->rank].att, memory_order_relaxed) & ATT_INBOX);
}

bool ncfsm__vlocal_take_failure(struct ncfsm__verifier *v, char *what, size_t len) {
  struct ncfsm__lv *lv = v->local;
  if (!lv->q) reg(v); /* a peer may have failed before this rank registered */
  lclique *q = lv->q;
  if (!q || !(atomic_load_explicit(&q->m[lv->rank].att, memory_order_relaxed) & ATT_INBOX) ||
      !atomic_exchange(&q->m[lv->rank].inbox, 0))
    return false;
  atomic_fetch_and(&q->m[lv->rank].att, ~ATT_INBOX);
  pthread_mutex_lock(&lmu);
  ncfsm__verify_describe_peer(q->origin, q->fseq, q->fcause, q->fwhat, what, len);
  pthread_mutex_unlock(&lmu);
  return true;
}

bool ncfsm__vlocal_poll(struct ncfsm__verifier *v, uint64_t now) {
  struct ncfsm__lv *lv = v->local;
  char what[512];
  if (!lv->q) reg(v);
  if (!lv->q) return false;
  lclique *q = lv->q;
  int nreg = __atomic_load_n(&q->nreg, __ATOMIC_ACQUIRE);
  bool stall = lv->stall_due;
  lv->stall_due = false; /* the watchdog says again while it holds */
  lmember *me = &q->m[lv->rank];
  atomic_fetch_and(&me->att, ~(ATT_DIVERGED | ATT_OWN)); /* looked at now; set again below while they hold */
  if (nreg < q->nranks) { /* not every rank is here (yet): once a launch waited past the bound, they are not */
    if (!stall) return false;
    NCFSM_INFO(NCFSM__SUB_FSM, "[%s rank %d] verification: %d of %d ranks are in this process and the comm has no "
               "bootstrap: it runs unverified (initialise it with ncfsm_comm_init_boot to verify it)",
               v->c->name, v->c->rank, nreg, q->nranks);
    ncfsm__verify_fire(v, NCFSM__VE_NO_CHANNEL, NCFSM_EV_ASYNC_ERROR, NCFSM_OK, NULL);
    return true;
  }
  if (!lv->diverged && compare(v, lv->report, sizeof lv->report)) lv->diverged = true;
  /* the collectives before the one that differs matched on every rank:
   * they keep their results (the comm fails once they finished) */
  if (lv->diverged) {
    if (!completes_before(v->c, lv->checked)) {
      ncfsm__verify_fire(v, NCFSM__VE_DIVERGED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_MISMATCH, lv->report);
      return true;
    }
    attend(me, ATT_OWN, v->c->loop); /* again at the next turn */
    return false;
  }
  /* a rank still behind compares at its own launch (this one's seqs were
   * published before this poll): no turn of this loop waits for it, so that
   * a rank ahead lets its loop sleep (push completion) */
  if (lv->p2p_dirty && compare_p2p(v, what, sizeof what)) {
    ncfsm__verify_fire(v, NCFSM__VE_DIVERGED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_MISMATCH, what);
    return true;
  }
  if (lv->p2p_dirty) attend(me, ATT_OWN, v->c->loop);
  if (stall && stalled(v, now, what, sizeof what)) {
    ncfsm__verify_fire(v, NCFSM__VE_STALLED, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, what);
    return true;
  }
  return false;
}

/* The comm of this rank failed (not because of a peer): the first failure
 * of the clique is recorded and every other registered rank told. */
void ncfsm__vlocal_failed(struct ncfsm__verifier *v, ncfsm_result_t cause, const char *what) {
  struct ncfsm__lv *lv = v->local;
  if (!lv->q) reg(v);
  lclique *q = lv->q;
  /* a peer's failure is not passed on; a divergence every rank finds itself */
  if (!q || cause == NCFSM_ERR_PEER || cause == NCFSM_ERR_MISMATCH) return;
  pthread_mutex_lock(&lmu);
  if (!q->failed) {
    q->failed = true;
    q->origin = lv->rank;
    q->fseq = v->c->coll_seq;
    q->fcause = cause;
    snprintf(q->fwhat, sizeof q->fwhat, "%s", what ? what : "");
    /* each other rank applies it at its next turn: its comm is enlisted, or
     * pushed on its loop's attention stack and the loop woken (under lmu: a
     * registered rank's comm and loop are alive) */
    for (int r = 0; r < q->nranks; r++) {
      if (r == lv->rank || !q->m[r].v) continue;
      atomic_store(&q->m[r].inbox, 1);
      attend(&q->m[r], ATT_INBOX, v->c->loop);
    }
  }
  pthread_mutex_unlock(&lmu);
}

uint64_t ncfsm__vlocal_verified(const struct ncfsm__verifier *v) {
  const lclique *q = v->local->q;
  if (!q) return 0;
  return atomic_load_explicit(&q->diverged, memory_order_acquire) ? q->dseq : atomic_load(&q->checked);
}

ncfsm_result_t ncfsm__vlocal_new(struct ncfsm__verifier *v) {
  v->local = calloc(1, sizeof *v->local);
  if (!v->local) return NCFSM_ERR_NO_MEMORY;
  v->c->verify_stall_ns = v->c->opts.verify_stall_ms * 1000000ull; /* the watchdog's part (0: no bound) */
  reg(v); /* now, when the rank is known (a split child's at its first turn in service) */
  return NCFSM_OK;
}

void ncfsm__vlocal_free(struct ncfsm__verifier *v) {
  if (!v->local) return;
  unreg(v->local);
  free(v->local);
  v->local = NULL;
}
