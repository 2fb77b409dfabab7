/*
 * In-process verification (opts.verify async, the default, for a comm whose
 * ranks are all in this process: ncfsm_comm_init / ncfsm_comm_init_all,
 * and split children of such comms). No channel is needed: the ranks of a
 * clique (one comm id) register in a process-wide registry, and each rank
 * publishes the fingerprint of every collective it launches in a ring of
 * its own (single writer; words written with relaxed atomics, then its
 * next seq with release). Any rank can then compare every seq that all
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
#define FPW (sizeof(ncfsm_fingerprint_t) / sizeof(uint64_t))
_Static_assert(sizeof(ncfsm_fingerprint_t) % sizeof(uint64_t) == 0, "a fingerprint is whole 64-bit words");

typedef struct lmember {
  _Atomic uint64_t next_seq; /* the seq its next collective takes: ring[s % LRING] holds s < next_seq */
  uint64_t ring[LRING][FPW];
  struct ncfsm__verifier *v; /* NULL: not registered (yet, or any more) */
  ncfsm_loop *loop;
  _Atomic int inbox;         /* the clique's failure is for it to apply */
} lmember;

typedef struct lclique {
  uint64_t id;
  int nranks, nreg, refs;
  lmember *m;
  /* the first failure of one of its ranks' comms */
  bool failed;
  int origin;
  uint64_t fseq;
  ncfsm_result_t fcause;
  char fwhat[400];
  struct lclique *next;
} lclique;

struct ncfsm__lv {
  lclique *q;        /* NULL until registered (a split child learns its rank at INIT_DONE) */
  int rank;
  uint64_t checked;  /* every seq below it was compared across all ranks */
  uint64_t t_start;  /* when it started (IN_SERVICE): NO_CHANNEL after verify_stall_ms with ranks missing */
  bool diverged;     /* seq `checked` differs (report): DIVERGED once the collectives before it finished */
  char report[512];
};

static pthread_mutex_t lmu = PTHREAD_MUTEX_INITIALIZER;
static lclique *lhead;

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
  if (q->failed) atomic_store(&q->m[c->rank].inbox, 1); /* a peer failed before this rank registered */
  pthread_mutex_unlock(&lmu);
}

static void unreg(struct ncfsm__lv *lv) {
  lclique *q = lv->q;
  if (!q) return;
  pthread_mutex_lock(&lmu);
  q->m[lv->rank].v = NULL;
  q->m[lv->rank].loop = NULL;
  if (--q->refs == 0) {
    for (lclique **pp = &lhead; *pp; pp = &(*pp)->next)
      if (*pp == q) {
        *pp = q->next;
        break;
      }
    free(q->m);
    free(q);
  }
  pthread_mutex_unlock(&lmu);
  lv->q = NULL;
}

/* ---- publishing and reading fingerprints -------------------------------------------------- */

void ncfsm__vlocal_launched(struct ncfsm__verifier *v, const ncfsm_work *w) {
  struct ncfsm__lv *lv = v->local;
  if (!lv->q) reg(v);
  if (!lv->q) return;
  lmember *me = &lv->q->m[lv->rank];
  uint64_t words[FPW];
  memcpy(words, &w->fp, sizeof words);
  uint64_t *slot = me->ring[w->fp.seq % LRING];
  for (size_t i = 0; i < FPW; i++) __atomic_store_n(&slot[i], words[i], __ATOMIC_RELAXED);
  atomic_store_explicit(&me->next_seq, w->fp.seq + 1, memory_order_release);
}

/* Member m's fingerprint of seq s (s < its next seq): false when its ring
 * no longer holds it (it ran more than LRING collectives past s). */
static bool read_fp(lmember *m, uint64_t s, ncfsm_fingerprint_t *out) {
  uint64_t words[FPW];
  const uint64_t *slot = m->ring[s % LRING];
  for (size_t i = 0; i < FPW; i++) words[i] = __atomic_load_n(&slot[i], __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  uint64_t next = atomic_load_explicit(&m->next_seq, memory_order_acquire);
  if (next > s + LRING) return false;
  memcpy(out, words, sizeof words);
  return out->seq == s;
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
  uint64_t hi = all_launched(q);
  ncfsm_fingerprint_t stack[8], *fps = q->nranks <= 8 ? stack : malloc((size_t)q->nranks * sizeof *fps);
  if (!fps) return false; /* next time */
  bool diff = false;
  uint64_t s = lv->checked;
  for (; s < hi && !diff; s++) {
    bool lost = false;
    for (int r = 0; r < q->nranks && !lost; r++) lost = !read_fp(&q->m[r], s, &fps[r]);
    if (lost) continue; /* a rank ran more than LRING past it: not comparable any more */
    diff = ncfsm__verify_describe(fps, q->nranks, what, len);
  }
  lv->checked = diff ? s - 1 : s;
  if (fps != stack) free(fps);
  return diff;
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

/* Is some collective below seq s unfinished and able to complete on its
 * own: not in one launch with a collective from s on (a launch's works
 * complete together behind one event on each stream)? */
static bool completes_before(const ncfsm_comm *c, uint64_t s) {
  const ncfsm_work *lists[1 + 64];
  int nl = 0;
  lists[nl++] = c->launching;
  for (int i = 0; i < c->nsq && nl < 65; i++) lists[nl++] = c->sq[i].head;
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

/* A collective of this rank waiting longer than verify_stall_ms: the ranks
 * that never launched it and where each is. */
static bool stalled(struct ncfsm__verifier *v, uint64_t now, char *what, size_t len) {
  ncfsm_comm *c = v->c;
  lclique *q = v->local->q;
  uint64_t stall_ns = c->opts.verify_stall_ms * 1000000ull;
  const ncfsm_work *old = oldest_launched(c, UINT64_MAX);
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
  if (!lv->q) return ncfsm__has(v->c, NCFSM_SF_WORKS);
  if (lv->diverged) return true;
  if (__atomic_load_n(&lv->q->nreg, __ATOMIC_ACQUIRE) == lv->q->nranks && all_launched(lv->q) > lv->checked)
    return true; /* seqs to compare */
  return ncfsm__comm_inflight(v->c) || v->c->launching; /* something of its own may wait on a peer */
}

bool ncfsm__vlocal_told(const struct ncfsm__verifier *v) {
  const struct ncfsm__lv *lv = v->local;
  return lv->q && atomic_load(&lv->q->m[lv->rank].inbox);
}

bool ncfsm__vlocal_take_failure(struct ncfsm__verifier *v, char *what, size_t len) {
  struct ncfsm__lv *lv = v->local;
  if (!lv->q) reg(v); /* a peer may have failed before this rank registered */
  lclique *q = lv->q;
  if (!q || !atomic_exchange(&q->m[lv->rank].inbox, 0)) return false;
  pthread_mutex_lock(&lmu);
  snprintf(what, len, "rank %d's comm failed first, at its seq %" PRIu64 " (%s): %.380s", q->origin, q->fseq,
           ncfsm_err_name(q->fcause), q->fwhat);
  pthread_mutex_unlock(&lmu);
  return true;
}

bool ncfsm__vlocal_poll(struct ncfsm__verifier *v, uint64_t now) {
  struct ncfsm__lv *lv = v->local;
  char what[512];
  if (!lv->t_start) lv->t_start = now;
  if (!lv->q) reg(v);
  if (!lv->q) return false;
  lclique *q = lv->q;
  int nreg = __atomic_load_n(&q->nreg, __ATOMIC_ACQUIRE);
  if (nreg < q->nranks) { /* not every rank is here (yet) */
    uint64_t stall_ns = v->c->opts.verify_stall_ms * 1000000ull;
    if (stall_ns && now - lv->t_start > stall_ns) {
      NCFSM_INFO(NCFSM__SUB_FSM, "[%s rank %d] verification: %d of %d ranks are in this process and the comm has no "
                 "bootstrap: it runs unverified (initialise it with ncfsm_comm_init_boot to verify it)",
                 v->c->name, v->c->rank, nreg, q->nranks);
      ncfsm__verify_fire(v, NCFSM__VE_NO_CHANNEL, NCFSM_EV_ASYNC_ERROR, NCFSM_OK, NULL);
      return true;
    }
    return false;
  }
  if (!lv->diverged && compare(v, lv->report, sizeof lv->report)) lv->diverged = true;
  /* the collectives before the one that differs matched on every rank:
   * they keep their results (the comm fails once they finished) */
  if (lv->diverged && !completes_before(v->c, lv->checked)) {
    ncfsm__verify_fire(v, NCFSM__VE_DIVERGED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_MISMATCH, lv->report);
    return true;
  }
  if (stalled(v, now, what, sizeof what)) {
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
    /* each other rank applies it at its next turn: a rank on another loop
     * is woken (under lmu: its loop outlives its registration); one on this
     * loop is busy (its inbox) when this turn ends */
    for (int r = 0; r < q->nranks; r++) {
      if (r == lv->rank || !q->m[r].v) continue;
      atomic_store(&q->m[r].inbox, 1);
      if (q->m[r].loop != v->c->loop) ncfsm__loop_kick_async(q->m[r].loop);
    }
  }
  pthread_mutex_unlock(&lmu);
}

uint64_t ncfsm__vlocal_verified(const struct ncfsm__verifier *v) { return v->local->checked; }

ncfsm_result_t ncfsm__vlocal_new(struct ncfsm__verifier *v) {
  v->local = calloc(1, sizeof *v->local);
  if (!v->local) return NCFSM_ERR_NO_MEMORY;
  reg(v); /* now, when the rank is known (a split child's at its first turn in service) */
  return NCFSM_OK;
}

void ncfsm__vlocal_free(struct ncfsm__verifier *v) {
  if (!v->local) return;
  unreg(v->local);
  free(v->local);
  v->local = NULL;
}
