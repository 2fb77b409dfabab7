/*
 * Async verification (opts.verify ASYNC): every verify_window launched
 * collectives, each rank posts (seq, rolling hash) to an allgather on the
 * comm's bootstrap, without waiting for it. The exchanges are posted in seq
 * order on every rank, which is the order the bootstrap needs. When one
 * completes, every rank's hash at that seq must be equal (else DIVERGED);
 * when one does not complete within verify_stall_ms, some rank stopped
 * before that seq while this one went on (STALLED). Either fails the comm
 * long before a watchdog would, and dumps its recorder.
 *
 * Windows that do not fill: a program that stops or pauses within a window
 * (a service waiting for requests) would leave its last collectives
 * unchecked. So rank 0, once its collectives are all complete, its windows
 * exchanged and no new one launched for the answer bound (a quarter of
 * verify_stall_ms, 100 to 1000 ms), asks every other rank on the channel to
 * check the collectives before its count against its rolling hash there; a
 * rank whose differ (or rank 0, told so, which then tells the others)
 * exchanges that window's fingerprints (DETAILING, on the detail's own
 * channel, so the windows' order is untouched), which names the seq, the
 * field and each rank's value. A rank further on refolds its hash from its
 * flight recorder; one that cannot, or is not RUNNING, says it cannot tell.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "fsm/verify.h"
#include "ncfsm/bootstrap.h"

typedef struct ncfsm__vmsg {
  uint64_t seq, hash;
} ncfsm__vmsg;

struct ncfsm__vreq {
  ncfsm__vmsg mine; /* a split's: (color, key) */
  bool split;       /* every rank's (color, key) of a split, for its child's channel */
  ncfsm_comm *child; /* the split's child on this rank (a reference), or NULL */
  ncfsm__vmsg *all; /* nranks entries */
  ncfsm_boot_req *req;
  ncfsm_result_t post_rc; /* a post that failed is reported at the next poll */
  uint64_t t_post, t_failed;
  struct ncfsm__vreq *next;
};

#define DETAIL_MAX 256 /* fingerprints per rank: the window's first ones (its first difference is the one named) */

struct ncfsm__vdet {
  ncfsm_boot *ch; /* a channel of its own: the ranks may have posted different numbers of windows */
  ncfsm_fingerprint_t mine[DETAIL_MAX];
  ncfsm_fingerprint_t *all; /* nranks * DETAIL_MAX */
  ncfsm_boot_req *req;
  ncfsm_result_t post_rc;
  uint64_t t_post;
};

static void vreq_done(ncfsm_boot_req *req, ncfsm_result_t status, void *arg) {
  (void)req;
  (void)status;
  ncfsm__vchan_wake(arg); /* the next turn polls it */
}

/* At most POSTED_MAX exchanges are out on the channel; the later ones wait in the queue, in
 * seq order (the order the bootstrap matches them by), until earlier ones complete: a rank
 * far ahead of another (its bootstrap partitioned while NCCL's network still carries the
 * collectives) does not fill the store with requests it must park (measured: tests/netns,
 * a silent partition of one host, the others' connections closed for "more than 1024
 * parked requests"). Each exchange still covers every collective before its seq. */
#define POSTED_MAX 8

/* An exchange that failed (a rank left the channel) fails the comm only this long after, so
 * that the failure notice of a rank that failed and then left, posted just before it left,
 * names the cause first (PEER_FAILED; the in-process bootstrap tells the loss at once and the
 * notice at the next dispatch). */
#define EXPLAIN_NS 20000000ull

static void post_due(struct ncfsm__verifier *v) {
  unsigned out = 0;
  if (!v->boot || v->state != NCFSM__VS_RUNNING) return; /* queued until the channel runs */
  for (struct ncfsm__vreq *q = v->vq_head; q; q = q->next) {
    if (q->req || q->post_rc != NCFSM_OK) {
      if (++out >= POSTED_MAX) return;
      continue;
    }
    q->post_rc = ncfsm_boot_allgather_post(v->boot, &q->mine, q->all, sizeof q->mine, &q->req);
    if (q->post_rc == NCFSM_OK) ncfsm_boot_req_on_done(q->req, vreq_done, v);
    if (++out >= POSTED_MAX) return;
  }
}

#define POOL_MAX POSTED_MAX /* exchanges kept for reuse (no malloc per window) */

static struct ncfsm__vreq *vreq_new(struct ncfsm__verifier *v) {
  ncfsm_comm *c = v->c;
  struct ncfsm__vreq *q = v->vq_pool;
  if (q) {
    v->vq_pool = q->next;
    v->npool--;
    ncfsm__vmsg *all = q->all;
    memset(q, 0, sizeof *q);
    q->all = all;
    return q;
  }
  q = calloc(1, sizeof *q);
  if (q) q->all = calloc((size_t)c->nranks, sizeof *q->all);
  if (!q || !q->all) {
    free(q);
    ncfsm__verify_fire(v, NCFSM__VE_NO_MEMORY, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_NO_MEMORY, NULL);
    return NULL;
  }
  return q;
}

static void vreq_queue(struct ncfsm__verifier *v, struct ncfsm__vreq *q) {
  q->t_post = ncfsm__now_ns();
  if (v->vq_tail) v->vq_tail->next = q;
  else v->vq_head = q;
  v->vq_tail = q;
  post_due(v);
}

void ncfsm__vasync_launched(struct ncfsm__verifier *v) {
  ncfsm_comm *c = v->c;
  unsigned win = c->opts.verify_window ? c->opts.verify_window : 1;
  v->next_window = (c->coll_seq / win + 1) * win;
  if (c->coll_seq % win) {
    if (c->rank == 0) ncfsm__vchan_waits(v, true); /* its first launch: a window that does not fill is checked */
    return;
  }
  struct ncfsm__vreq *q = vreq_new(v);
  if (!q) return;
  q->mine = (ncfsm__vmsg){c->coll_seq, c->hash};
  vreq_queue(v, q);
}

/* The parent is idle at a split (R8): every rank queued the same windows before it. */
void ncfsm__vasync_split(struct ncfsm__verifier *v, int32_t color, int32_t key, ncfsm_comm *child) {
  struct ncfsm__vreq *q = vreq_new(v);
  if (!q) {
    if (child) ncfsm__verify_members(child, NULL, 0, "out of memory for the split's exchange");
    return;
  }
  q->mine = (ncfsm__vmsg){(uint64_t)(uint32_t)color, (uint64_t)(uint32_t)key};
  q->split = true;
  q->child = child;
  if (child) child->refs++;
  vreq_queue(v, q);
}

/* Every parent rank's (color, key) are in: the child's ranks are those of its color, in (key,
 * parent rank) order (ncclCommSplit's), as ranks of the parent's bootstrap. */
static void split_done(struct ncfsm__verifier *v, struct ncfsm__vreq *q) {
  ncfsm_comm *c = v->c, *child = q->child;
  q->child = NULL;
  if (!child) return;
  int n = 0, *m = malloc((size_t)c->nranks * sizeof *m);
  for (int r = 0; m && r < c->nranks; r++)
    if (q->all[r].seq == q->mine.seq) { /* insertion by (key, rank) */
      int k = n++;
      while (k > 0 && (int32_t)(uint32_t)q->all[m[k - 1]].hash > (int32_t)(uint32_t)q->all[r].hash) {
        m[k] = m[k - 1];
        k--;
      }
      m[k] = r;
    }
  for (int i = 0; m && i < n; i++) m[i] = v->members ? v->members[m[i]] : m[i];
  ncfsm__verify_members(child, m, m ? n : 0, "out of memory for the child's member list");
  free(m);
  ncfsm__comm_unref(child);
}

static void vreq_free(struct ncfsm__verifier *v, struct ncfsm__vreq *q) {
  if (q->req) ncfsm_boot_req_free(q->req);
  q->req = NULL; /* a pooled one holds no request */
  if (q->child) { /* dropped before it completed */
    ncfsm__verify_members(q->child, NULL, 0, "its parent's verification stopped before the split's colors were exchanged");
    ncfsm__comm_unref(q->child);
    q->child = NULL;
  }
  if (v && v->npool < POOL_MAX) {
    q->next = v->vq_pool;
    v->vq_pool = q;
    v->npool++;
    return;
  }
  free(q->all);
  free(q);
}

/* A failed comm stops verifying: its exchanges are dropped (a bootstrap
 * request freed unfinished makes the bootstrap unusable, which is right:
 * the ranks no longer agree on what comes next). */
void ncfsm__vasync_free(struct ncfsm__verifier *v) {
  if (v->det) {
    if (v->det->req) ncfsm_boot_req_free(v->det->req);
    if (v->det->ch) ncfsm_boot_close(v->det->ch);
    free(v->det->all);
    free(v->det);
    v->det = NULL;
  }
  while (v->vq_head) {
    struct ncfsm__vreq *q = v->vq_head;
    v->vq_head = q->next;
    vreq_free(NULL, q);
  }
  v->vq_tail = NULL;
  while (v->vq_pool) {
    struct ncfsm__vreq *q = v->vq_pool;
    v->vq_pool = q->next;
    vreq_free(NULL, q);
  }
  v->npool = 0;
}

static bool check_idle(struct ncfsm__verifier *v, uint64_t now);

bool ncfsm__vasync_poll(struct ncfsm__verifier *v, uint64_t now) {
  ncfsm_comm *c = v->c;
  bool progress = false;
  char what[400];
  post_due(v); /* what queued before the channel ran */
  while (v->vq_head) {
    struct ncfsm__vreq *q = v->vq_head;
    if (!q->req && q->post_rc == NCFSM_OK) return progress; /* not posted yet */
    if (q->post_rc != NCFSM_OK) {
      snprintf(what, sizeof what, "verification: the bootstrap refused the exchange at seq %llu (%s): %s",
               (unsigned long long)q->mine.seq, ncfsm_err_name(q->post_rc), ncfsm_boot_last_error(v->boot));
      ncfsm__verify_fire(v, NCFSM__VE_CHANNEL_FAILED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
      return true;
    }
    ncfsm_result_t r = ncfsm_boot_test(q->req);
    if (r == NCFSM_ERR_AGAIN) {
      if (c->opts.verify_stall_ms && now > q->t_post && now - q->t_post > c->opts.verify_stall_ms * 1000000ull) {
        if (q->split)
          snprintf(what, sizeof what, "verification: not every rank reached the split after collective seq %llu "
                   "within %llu ms of this rank", (unsigned long long)c->coll_seq,
                   (unsigned long long)c->opts.verify_stall_ms);
        else
          snprintf(what, sizeof what,
                   "verification: not every rank reached collective seq %llu within %llu ms of this rank",
                   (unsigned long long)q->mine.seq, (unsigned long long)c->opts.verify_stall_ms);
        ncfsm__vchan_stalled(v, q->req, q->split ? c->coll_seq : q->mine.seq, what); /* the others are asked how far they are */
        return true;
      }
      return progress;
    }
    if (r != NCFSM_OK && now - (q->t_failed ? q->t_failed : (q->t_failed = now)) < EXPLAIN_NS) {
      ncfsm__vchan_wake(v); /* a rank that left after its comm failed: its notice may be on the way */
      return progress;
    }
    if (r != NCFSM_OK) {
      snprintf(what, sizeof what, "verification: the exchange at seq %llu failed (%s: %s)",
               (unsigned long long)q->mine.seq, ncfsm_err_name(r), ncfsm_boot_last_error(v->boot));
      ncfsm__verify_fire(v, NCFSM__VE_CHANNEL_FAILED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
      return true;
    }
    if (q->split) {
      split_done(v, q);
      v->vq_head = q->next;
      if (!v->vq_head) v->vq_tail = NULL;
      vreq_free(v, q);
      post_due(v);
      progress = true;
      continue;
    }
    int bad = -1;
    for (int i = 0; i < c->nranks && bad < 0; i++)
      if (q->all[i].seq != q->mine.seq || q->all[i].hash != q->mine.hash) bad = i;
    if (bad >= 0) { /* the window differs: its fingerprints are exchanged next (DETAILING) */
      snprintf(v->det_hashes, sizeof v->det_hashes,
               "the collectives before seq %llu differ across ranks (R11): rolling hash of rank %d %016llx, of rank "
               "%d %016llx",
               (unsigned long long)q->mine.seq, c->rank, (unsigned long long)q->mine.hash, bad,
               (unsigned long long)q->all[bad].hash);
      v->det_hi = q->mine.seq;
      v->vq_head = q->next;
      if (!v->vq_head) v->vq_tail = NULL;
      vreq_free(v, q);
      ncfsm__verify_fire(v, NCFSM__VE_HASHES_DIFFER, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_MISMATCH, NULL);
      return true;
    }
    v->det_lo = q->mine.seq; /* every collective before it matched */
    v->det_lo_hash = q->mine.hash;
    v->vq_head = q->next;
    if (!v->vq_head) v->vq_tail = NULL;
    vreq_free(v, q);
    post_due(v);
    progress = true;
  }
  return check_idle(v, now) || progress;
}

/* ---- windows that do not fill ----------------------------------------------------------------- */

/* This rank's rolling hash after its collectives before seq hi (*out), or false: c->hash where
 * it launched exactly those, else refolded from the hash at det_lo over its flight recorder's
 * fingerprints (works.c's fold: XXH3 of each fingerprint, seeded with the hash before it). */
static bool hash_at(struct ncfsm__verifier *v, uint64_t hi, uint64_t *out) {
  ncfsm_comm *c = v->c;
  if (c->coll_seq == hi) {
    *out = c->hash;
    return true;
  }
  if (c->coll_seq < hi || hi < v->det_lo || hi - v->det_lo > DETAIL_MAX || !c->opts.trace_buffer) return false;
  ncfsm_fingerprint_t *fps = calloc(DETAIL_MAX, sizeof *fps);
  bool seen[DETAIL_MAX] = {false};
  unsigned cap = c->opts.trace_buffer, n = 0, have = 0;
  ncfsm__rec_entry *snap = fps ? malloc((size_t)cap * sizeof *snap) : NULL;
  if (snap) n = ncfsm__rec_snapshot(c->rec, snap, cap, NULL);
  for (unsigned i = 0; i < n; i++) {
    const ncfsm_fingerprint_t *f = &snap[i].fp;
    if (f->op == NCFSM_KIND_SEND || f->op == NCFSM_KIND_RECV || f->seq == NCFSM__REC_SEQ_NONE) continue;
    if (f->seq >= v->det_lo && f->seq < hi && !seen[f->seq - v->det_lo]) {
      fps[f->seq - v->det_lo] = *f;
      seen[f->seq - v->det_lo] = true;
      have++;
    }
  }
  bool ok = snap && have == hi - v->det_lo;
  uint64_t h = v->det_lo_hash;
  for (uint64_t s = v->det_lo; ok && s < hi; s++) h = XXH3_64bits_withSeed(&fps[s - v->det_lo], sizeof *fps, h);
  free(snap);
  free(fps);
  if (ok) *out = h;
  return ok;
}

/* The window up to hi differs: its fingerprints are exchanged (DETAILING), unless this rank is
 * already past RUNNING (a detail or a failure of its own). */
static void detail_window(struct ncfsm__verifier *v, uint64_t hi, int other) {
  if (v->state != NCFSM__VS_RUNNING || v->vq_head) return;
  snprintf(v->det_hashes, sizeof v->det_hashes,
           "the collectives before seq %llu differ across ranks (R11): rank %d's rolling hash there is not rank 0's "
           "(a window that did not fill, checked by rank 0's question)",
           (unsigned long long)hi, other);
  v->det_hi = hi;
  ncfsm__verify_fire(v, NCFSM__VE_HASHES_DIFFER, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_MISMATCH, NULL);
}

char ncfsm__vasync_check(struct ncfsm__verifier *v, uint64_t hi, uint64_t hash) {
  uint64_t h;
  if (v->state != NCFSM__VS_RUNNING || hi <= v->det_lo || !hash_at(v, hi, &h)) return 'u';
  if (h == hash) return 's';
  detail_window(v, hi, v->c->rank);
  return 'd';
}

void ncfsm__vasync_differ(struct ncfsm__verifier *v, uint64_t hi, int rank) {
  if (hi > v->det_lo) detail_window(v, hi, rank);
}

/* Rank 0, RUNNING with no window out: the question's turn (see the top of this file). */
static bool check_idle(struct ncfsm__verifier *v, uint64_t now) {
  ncfsm_comm *c = v->c;
  uint64_t hi = c->coll_seq, bound = ncfsm__vchan_answer_bound_ns(c);
  if (c->rank != 0 || !c->opts.verify_stall_ms || c->nranks < 2 || hi <= v->det_lo || hi <= v->wc_checked) return false;
  if (v->wc_asking && v->wc_hi == hi) {
    char *verdicts = calloc((size_t)c->nranks, 1);
    int answered = 0, differs = -1;
    if (verdicts) ncfsm__vchan_window_verdicts(v, hi, verdicts);
    for (int r = 1; verdicts && r < c->nranks; r++) {
      answered += verdicts[r] != 0;
      if (verdicts[r] == 'd' && differs < 0) differs = r;
    }
    free(verdicts);
    if (differs < 0 && answered < c->nranks - 1 && now - v->wc_t0 < bound) {
      ncfsm__vchan_waits(v, true);
      return false;
    }
    v->wc_asking = false;
    v->wc_checked = hi;
    v->wc_arm = hi + 1;
    if (differs < 0) return false;
    ncfsm__vchan_window_differ(v, hi, differs);
    detail_window(v, hi, differs);
    return true;
  }
  v->wc_asking = false;
  if (c->launching || ncfsm__comm_inflight(c) || hi != v->wc_seen) { /* not idle (yet): from its last launch */
    v->wc_seen = hi;
    v->wc_seen_t = now;
    ncfsm__vchan_waits(v, true);
    return false;
  }
  if (now - v->wc_seen_t < bound) {
    ncfsm__vchan_waits(v, true);
    return false;
  }
  v->wc_asking = true;
  v->wc_hi = hi;
  v->wc_t0 = now;
  ncfsm__vchan_window_check(v, hi, c->hash);
  ncfsm__vchan_waits(v, true); /* a look at the verdicts within the bound */
  return false;
}

/* ---- the detail of a window whose hashes differ (DETAILING) --------------------------------- */


/* This rank's fingerprints of seqs [det_lo, det_lo + DETAIL_MAX) from its
 * flight recorder; seq NCFSM_SEQ_NONE where it holds none any more. */
static void mine_from_recorder(struct ncfsm__verifier *v, ncfsm_fingerprint_t *out) {
  ncfsm_comm *c = v->c;
  for (unsigned i = 0; i < DETAIL_MAX; i++) {
    memset(&out[i], 0, sizeof out[i]);
    out[i].seq = NCFSM_SEQ_NONE;
  }
  unsigned cap = c->opts.trace_buffer;
  ncfsm__rec_entry *snap = cap ? malloc((size_t)cap * sizeof *snap) : NULL;
  unsigned n = snap ? ncfsm__rec_snapshot(c->rec, snap, cap, NULL) : 0;
  for (unsigned i = 0; i < n; i++) {
    const ncfsm_fingerprint_t *f = &snap[i].fp;
    if (f->op == NCFSM_KIND_SEND || f->op == NCFSM_KIND_RECV || f->seq == NCFSM__REC_SEQ_NONE) continue;
    if (f->seq >= v->det_lo && f->seq < v->det_lo + DETAIL_MAX && f->seq < v->det_hi) out[f->seq - v->det_lo] = *f;
  }
  free(snap);
}

void ncfsm__vasync_post_detail(struct ncfsm__verifier *v) {
  ncfsm_comm *c = v->c;
  struct ncfsm__vdet *d = calloc(1, sizeof *d);
  if (d) d->all = calloc((size_t)c->nranks * DETAIL_MAX, sizeof *d->all);
  if (!d || !d->all) {
    free(d);
    ncfsm__verify_fire(v, NCFSM__VE_DIVERGED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_MISMATCH, v->det_hashes);
    return;
  }
  mine_from_recorder(v, d->mine);
  d->t_post = ncfsm__now_ns();
  /* Not on the verifier's channel: when a window differs, each rank may have posted a different
   * number of later windows there already (at most POSTED_MAX), so a detail posted after them
   * would pair with another rank's window. Every rank finds the same first window that differs,
   * so each opens this channel once and posts one exchange on it. */
  char tag[NCFSM_BOOT_TAG_MAX + 1];
  snprintf(tag, sizeof tag, "ncfsm.verify.%016" PRIx64 ".detail", c->comm_id);
  d->post_rc = ncfsm_boot_channel_open(v->boot, tag, NULL, 0, &d->ch);
  if (d->post_rc != NCFSM_OK) d->ch = NULL;
  else d->post_rc = ncfsm_boot_allgather_post(d->ch, d->mine, d->all, sizeof d->mine, &d->req);
  if (d->post_rc == NCFSM_OK) ncfsm_boot_req_on_done(d->req, vreq_done, v);
  v->det = d;
}

bool ncfsm__vasync_poll_detail(struct ncfsm__verifier *v, uint64_t now) {
  ncfsm_comm *c = v->c;
  struct ncfsm__vdet *d = v->det;
  char what[512];
  if (!d) return false;
  ncfsm_result_t r = d->post_rc != NCFSM_OK ? d->post_rc : ncfsm_boot_test(d->req);
  if (r == NCFSM_ERR_AGAIN) {
    if (c->opts.verify_stall_ms && now > d->t_post && now - d->t_post > c->opts.verify_stall_ms * 1000000ull) {
      snprintf(what, sizeof what,
               "verification: %s; the exchange of that window's fingerprints did not complete within %llu ms",
               v->det_hashes, (unsigned long long)c->opts.verify_stall_ms);
      ncfsm__verify_fire(v, NCFSM__VE_STALLED, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, what);
      return true;
    }
    return false;
  }
  if (r != NCFSM_OK) {
    snprintf(what, sizeof what, "verification: %s; the exchange of that window's fingerprints failed (%s: %s)",
             v->det_hashes, ncfsm_err_name(r), ncfsm_boot_last_error(d->ch ? d->ch : v->boot));
    ncfsm__verify_fire(v, NCFSM__VE_DIVERGED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_MISMATCH, what);
    return true;
  }
  ncfsm_fingerprint_t stack[8], *one = c->nranks <= 8 ? stack : malloc((size_t)c->nranks * sizeof *one);
  bool named = false;
  for (unsigned i = 0; one && i < DETAIL_MAX && !named; i++) {
    bool whole = true;
    for (int k = 0; k < c->nranks && whole; k++) {
      one[k] = d->all[(size_t)k * DETAIL_MAX + i];
      whole = one[k].seq != NCFSM_SEQ_NONE;
    }
    if (whole) named = ncfsm__verify_describe(one, c->nranks, what, sizeof what);
  }
  if (one != stack) free(one);
  if (!named)
    snprintf(what, sizeof what,
             "verification: %s; no rank's flight recorder holds the differing collective any more (opts.trace_buffer "
             "is smaller than the window): ncfsm-trace on the dumps may still name it",
             v->det_hashes);
  ncfsm__verify_fire(v, NCFSM__VE_DIVERGED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_MISMATCH, what);
  return true;
}
