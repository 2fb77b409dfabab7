/*
 * Sends and receives checked across processes (async verification over a
 * channel; docs/ordering.md, "Verification"). NCCL pairs the k-th send
 * from rank s to rank d with the k-th receive on d from s, whatever comes
 * between them on either rank; a send's count and type must be its
 * receive's, and NCCL checks neither. So each direction of each pair
 * is its own sequence (the fingerprint's seq of a send or receive is its
 * seq in that direction) with its own exchange: a two-member channel of
 * the verifier's channel, "ncfsm.verify.<comm id>.p<s>.<d>", opened at
 * the direction's first exchange, on which both ranks post the count and
 * type of each op in windows of the same seqs on both sides: seq 0 alone
 * (a mismatch at the first op is named at once), then every
 * min(verify_window, 64) ops. An exchange that does not complete within
 * verify_stall_ms names the peer: it never launched its side of that
 * window (stopped, skipped an op, or far behind).
 *
 * An op of a window not exchanged yet (it never fills: the program stopped
 * sending) that waits past verify_stall_ms asks its peer, by a notice on the
 * verifier's channel, how far it is that way: a peer that never posted the
 * matching op is named with its last seq; one that did has the pair in
 * NCCL (the watchdog's bound applies).
 *
 * A window that does not fill and gets no new op for the answer bound (a
 * quarter of verify_stall_ms, 100 to 1000 ms) is checked by its sender's
 * question: the hash of its ops' counts and types, to which the receiver
 * answers with its verdict. Where they differ, both cut the window there
 * and exchange it (the receiver at once, the sender at the verdict: the
 * only time a window ends off the schedule, and both comms fail at it),
 * and the exchange names the op as any window does.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "fsm/verify.h"
#include "ncfsm/bootstrap.h"

#define PW_MAX 64 /* ops per window at most: the message is a fixed 1 KiB */

typedef struct pent {
  uint64_t count;
  int32_t dtype;
  int32_t kind; /* NCFSM_KIND_SEND or _RECV */
} pent;

typedef struct pmsg {
  uint64_t lo; /* the window's first seq */
  uint32_t n;  /* its ops */
  uint32_t win;
  pent e[PW_MAX];
} pmsg;

typedef struct pex {
  pmsg mine;
  pmsg all[2]; /* the channel's rank 0 is the sender */
  ncfsm_boot_req *req;
  ncfsm_result_t post_rc;
  uint64_t t_post, t_failed;
  struct pex *next;
} pex;

/* One direction of one pair: this rank's sends to peer, or its receives from it. */
typedef struct vdir {
  int peer;
  bool send;
  ncfsm_boot *ch;    /* NULL until its first exchange is posted */
  pmsg cur;          /* the window being filled */
  uint64_t next;     /* the seq expected next */
  pex *head, *tail;  /* exchanges: posted first, then queued */
  struct vdir *act;  /* the list of directions with exchanges */
  bool listed;
  bool asking;       /* its peer was asked how far it is (asked_seq: this rank's op waiting) */
  uint64_t asked_seq, ask_t0;
  uint64_t seen_hi, seen_t; /* a sender's: its poll first saw the window end at seen_hi at seen_t */
  bool checking;       /* a sender's: its window that did not fill, [cur.lo, check_hi), is being checked */
  uint64_t check_hi, check_t0, checked_hi; /* checked_hi: checked (or not checkable) up to it */
} vdir;

struct ncfsm__vpairs {
  vdir **dirs; /* [2 * nranks]: sends to p at 2p, receives from p at 2p + 1 (made on use) */
  int nranks;
  vdir *act;   /* directions with exchanges, posted or queued */
  bool out_of_memory;
  bool stall_due; /* the watchdog saw a launch older than the stall bound */
  int nasking;    /* directions whose peer was asked */
  int nchecking;  /* directions whose window that did not fill is being checked */
};

#define POSTED_MAX 4 /* per direction: later windows wait in its queue */
#define EXPLAIN_NS 20000000ull /* as fsm/verify_async.c: a failure notice may be on its way */

static unsigned win_of(const ncfsm_comm *c) {
  unsigned w = c->opts.verify_window ? c->opts.verify_window : 1;
  return w > PW_MAX ? PW_MAX : w;
}

static struct ncfsm__vpairs *pairs_of(struct ncfsm__verifier *v) {
  if (v->pairs || v->c->nranks < 2) return v->pairs;
  struct ncfsm__vpairs *ps = calloc(1, sizeof *ps);
  if (ps && !(ps->dirs = calloc(2 * (size_t)v->c->nranks, sizeof *ps->dirs))) {
    free(ps);
    ps = NULL;
  }
  if (ps) ps->nranks = v->c->nranks;
  return v->pairs = ps;
}

static bool open_dir(struct ncfsm__verifier *v, vdir *d) {
  ncfsm_comm *c = v->c;
  int src = d->send ? c->rank : d->peer, dst = d->send ? d->peer : c->rank, members[2] = {src, dst};
  char tag[NCFSM_BOOT_TAG_MAX + 1];
  snprintf(tag, sizeof tag, "ncfsm.verify.%016" PRIx64 ".p%d.%d", c->comm_id, src, dst);
  ncfsm_result_t r = ncfsm_boot_channel_open(v->boot, tag, members, 2, &d->ch);
  if (r == NCFSM_OK) return true;
  d->ch = NULL;
  char what[400];
  snprintf(what, sizeof what, "verification: the channel '%s' of the %s %s rank %d could not be opened (%s: %s)", tag,
           d->send ? "sends" : "receives", d->send ? "to" : "from", d->peer, ncfsm_err_name(r),
           ncfsm_boot_last_error(v->boot));
  ncfsm__verify_fire(v, NCFSM__VE_CHANNEL_FAILED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
  return false;
}

static void pex_done(ncfsm_boot_req *req, ncfsm_result_t status, void *arg) {
  (void)req;
  (void)status;
  ncfsm__vchan_wake(arg);
}

/* Post the direction's queued windows (at most POSTED_MAX out), in seq order. */
static void post_dir(struct ncfsm__verifier *v, vdir *d) {
  if (!v->boot || v->state != NCFSM__VS_RUNNING) return; /* queued until the channel runs */
  unsigned out = 0;
  for (pex *x = d->head; x && out < POSTED_MAX; x = x->next, out++) {
    if (x->req || x->post_rc != NCFSM_OK) continue;
    if (!d->ch && !open_dir(v, d)) return;
    x->t_post = ncfsm__now_ns();
    x->post_rc = ncfsm_boot_allgather_post(d->ch, &x->mine, x->all, sizeof x->mine, &x->req);
    if (x->post_rc == NCFSM_OK) ncfsm_boot_req_on_done(x->req, pex_done, v);
  }
}

static void queue_window(struct ncfsm__verifier *v, struct ncfsm__vpairs *ps, vdir *d) {
  pex *x = calloc(1, sizeof *x);
  if (!x) {
    ps->out_of_memory = true; /* the two sides' exchanges no longer pair */
    return;
  }
  x->mine = d->cur;
  d->cur.lo += d->cur.n;
  d->cur.n = 0;
  if (d->tail) d->tail->next = x;
  else d->head = x;
  d->tail = x;
  if (!d->listed) {
    d->act = ps->act;
    ps->act = d;
    d->listed = true;
  }
  post_dir(v, d);
}

/* Exchange d's window up to seq hi now (its ops from hi on stay in it). */
static void queue_cut(struct ncfsm__verifier *v, struct ncfsm__vpairs *ps, vdir *d, uint64_t hi) {
  uint32_t k = (uint32_t)(hi - d->cur.lo), rest = d->cur.n - k;
  pent tail[PW_MAX];
  memcpy(tail, d->cur.e + k, rest * sizeof *tail);
  d->cur.n = k;
  queue_window(v, ps, d);
  memcpy(d->cur.e, tail, rest * sizeof *tail);
  d->cur.n = rest;
}

/* The counts and types of d's ops [lo, hi), which its window holds. */
static uint64_t ops_hash(const vdir *d, uint64_t lo, uint64_t hi) {
  uint64_t h = 0;
  for (uint64_t s = lo; s < hi; s++) {
    const pent *e = &d->cur.e[s - d->cur.lo];
    uint64_t x[2] = {e->count, (uint64_t)(uint32_t)e->dtype};
    h = XXH3_64bits_withSeed(x, sizeof x, h);
  }
  return h;
}

char ncfsm__vpairs_check(struct ncfsm__verifier *v, int sender, uint64_t lo, uint64_t hi, uint64_t hash) {
  struct ncfsm__vpairs *ps = v->pairs;
  vdir *d = ps && sender >= 0 && sender < ps->nranks && sender != v->c->rank ? ps->dirs[2 * sender + 1] : NULL;
  if (!d || d->cur.lo + d->cur.n < hi) return d && d->cur.lo > lo ? 'p' : 'b';
  if (d->cur.lo > lo) return 'p';
  if (d->cur.lo < lo || hi <= lo) return 'u';
  if (ops_hash(d, lo, hi) == hash) return 's';
  queue_cut(v, ps, d, hi);
  return 'd';
}

/* A sender's window that did not fill and had no new op for the answer bound: its check is
 * asked; the verdict, once there, cuts and exchanges it where they differ. */
static void check_windows(struct ncfsm__verifier *v, uint64_t now) {
  struct ncfsm__vpairs *ps = v->pairs;
  uint64_t bound = ncfsm__vchan_answer_bound_ns(v->c);
  bool idle_left = false;
  for (int p = 0; p < ps->nranks; p++) {
    vdir *d = ps->dirs[2 * p];
    if (!d) continue;
    uint64_t hi = d->cur.lo + d->cur.n;
    if (d->checking) {
      char verdict = 0;
      bool got = ncfsm__vchan_pair_verdict(v, p, d->check_hi, &verdict);
      if (!got && now - d->check_t0 < bound) continue;
      d->checking = false;
      ps->nchecking--;
      d->checked_hi = d->check_hi; /* no answer: unchecked until its next ops (as the stall path says) */
      if (verdict == 'd' && d->cur.lo + d->cur.n >= d->check_hi && d->cur.lo < d->check_hi)
        queue_cut(v, ps, d, d->check_hi);
      else if (got && verdict != 's')
        NCFSM_INFO(NCFSM__SUB_FSM, "[%s rank %d] verification: the sends to rank %d up to seq %" PRIu64
                   " were not checked by its question (verdict %c): the window's exchange checks them",
                   v->c->name, v->c->rank, p, d->check_hi - 1, verdict);
      continue;
    }
    if (!d->cur.n || d->checked_hi >= hi) continue;
    if (d->seen_hi != hi) { /* new ops since the last look: idle from now */
      d->seen_hi = hi;
      d->seen_t = now;
    }
    if (now - d->seen_t < bound) {
      idle_left = true;
      continue;
    }
    d->checking = true;
    d->check_hi = hi;
    d->check_t0 = now;
    ps->nchecking++;
    ncfsm__vchan_pair_check(v, p, d->cur.lo, hi, ops_hash(d, d->cur.lo, hi));
  }
  if (!ps->nchecking) ncfsm__vchan_pair_verdict(v, -1, 0, NULL); /* late ones */
  if (idle_left || ps->nchecking) ncfsm__vchan_waits(v, true); /* a look again at the timer */
}

void ncfsm__vpairs_launched(struct ncfsm__verifier *v, const ncfsm_work *w) {
  ncfsm_comm *c = v->c;
  struct ncfsm__vpairs *ps = pairs_of(v);
  int p = w->fp.peer;
  if (!ps || p < 0 || p >= ps->nranks || p == c->rank) {
    if (!ps && c->nranks > 1) ncfsm__verify_fire(v, NCFSM__VE_NO_MEMORY, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_NO_MEMORY, NULL);
    return;
  }
  bool send = w->fp.op == NCFSM_KIND_SEND;
  vdir **slot = &ps->dirs[2 * p + !send], *d = *slot;
  if (!d) {
    if (!(d = *slot = calloc(1, sizeof *d))) {
      ncfsm__verify_fire(v, NCFSM__VE_NO_MEMORY, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_NO_MEMORY, NULL);
      return;
    }
    d->peer = p;
    d->send = send;
    d->cur.win = win_of(c);
    c->verify_stall_ns = c->opts.verify_stall_ms * 1000000ull; /* the watchdog says when an op waits that long */
  }
  if (w->fp.seq != d->next) /* not in order: the engine numbers a direction's ops as it launches them */
    NCFSM_WARN(NCFSM__SUB_FSM, "[%s rank %d] verification: %s seq %" PRIu64 " %s rank %d launched where seq %" PRIu64
               " was due", c->name, c->rank, send ? "send" : "receive", w->fp.seq, send ? "to" : "from", p, d->next);
  d->next = w->fp.seq + 1;
  d->cur.e[d->cur.n++] = (pent){w->fp.count, w->fp.dtype, w->fp.op};
  uint64_t k = w->fp.seq;
  if (k == 0 || (k + 1) % d->cur.win == 0 || d->cur.n == PW_MAX) queue_window(v, ps, d);
  else if (send) ncfsm__vchan_waits(v, true); /* the stall timer: a window that does not fill is checked */
  if (ps->out_of_memory) ncfsm__verify_fire(v, NCFSM__VE_NO_MEMORY, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_NO_MEMORY, NULL);
}

/* Exchanges posted or queued: the comm's waits go on while there are. */
bool ncfsm__vpairs_out(const struct ncfsm__verifier *v) { return v->pairs && (v->pairs->act || v->pairs->nasking); }

uint64_t ncfsm__vpairs_next(const struct ncfsm__verifier *v, int peer, bool send) {
  const struct ncfsm__vpairs *ps = v->pairs;
  if (!ps || peer < 0 || peer >= ps->nranks) return 0;
  const vdir *d = ps->dirs[2 * peer + !send];
  return d ? d->next : 0;
}

bool ncfsm__vpairs_with(const struct ncfsm__verifier *v, int peer) {
  const struct ncfsm__vpairs *ps = v->pairs;
  if (!ps || peer < 0 || peer >= ps->nranks) return false;
  for (int k = 0; k < 2; k++)
    if (ps->dirs[2 * peer + k] && ps->dirs[2 * peer + k]->head) return true;
  return false;
}

void ncfsm__vpairs_stall_due(struct ncfsm__verifier *v) {
  if (v->pairs) v->pairs->stall_due = true;
}

/* The watchdog said a launch is older than the stall bound: each send or receive waiting that
 * long whose window was not exchanged yet asks its peer (once per op). */
static void ask_waiting(struct ncfsm__verifier *v, uint64_t now) {
  ncfsm_comm *c = v->c;
  struct ncfsm__vpairs *ps = v->pairs;
  uint64_t stall = c->opts.verify_stall_ms * 1000000ull;
  const ncfsm_work *lists[65];
  int nl = ncfsm__verify_inflight(c, lists);
  for (int a = 0; a < nl; a++)
    for (const ncfsm_work *w = lists[a]; w; w = w->next) {
      bool send = w->fp.op == NCFSM_KIND_SEND;
      if ((!send && w->fp.op != NCFSM_KIND_RECV) || !w->t_launch || now < w->t_launch || now - w->t_launch <= stall)
        continue;
      int p = w->fp.peer;
      vdir *d = p >= 0 && p < ps->nranks ? ps->dirs[2 * p + !send] : NULL;
      if (!d || d->asking || w->fp.seq < d->cur.lo || (d->asked_seq == w->fp.seq && d->ask_t0)) continue;
      d->asking = true;
      d->asked_seq = w->fp.seq;
      d->ask_t0 = now;
      ps->nasking++;
      ncfsm__vchan_pair_ask(v, p, send, w->fp.seq);
    }
}

/* A direction whose peer was asked: its answer names the peer, or clears it (the peer posted
 * the op: NCCL has the pair); no answer within the bound names it silent. */
static bool judge_asked(struct ncfsm__verifier *v, vdir *d, uint64_t now) {
  ncfsm_comm *c = v->c;
  uint64_t next = 0, bound = ncfsm__vchan_answer_bound_ns(c);
  const char *mine = d->send ? "send" : "receive", *theirs = d->send ? "receive" : "send";
  char what[520], where[80];
  bool answered = ncfsm__vchan_pair_answer(v, d->peer, d->send, &next);
  if (answered && next > d->asked_seq) { /* posted: not a stall of the verifier's to name */
    d->asking = false;
    v->pairs->nasking--;
    return false;
  }
  if (!answered && now - d->ask_t0 < bound) return false;
  if (answered && next)
    snprintf(where, sizeof where, "its last %s %s rank %d is seq %" PRIu64, theirs, d->send ? "from" : "to", c->rank,
             next - 1);
  else if (answered)
    snprintf(where, sizeof where, "it posted no %s %s rank %d", theirs, d->send ? "from" : "to", c->rank);
  else
    snprintf(where, sizeof where, "it did not answer within %" PRIu64 " ms", bound / 1000000u);
  snprintf(what, sizeof what,
           "verification: %s seq %" PRIu64 " %s rank %d waited more than %llu ms; rank %d never posted the matching "
           "%s (%s): it stopped, skipped it or is far behind",
           mine, d->asked_seq, d->send ? "to" : "from", d->peer, (unsigned long long)c->opts.verify_stall_ms, d->peer,
           theirs, where);
  d->asking = false;
  v->pairs->nasking--;
  ncfsm__verify_fire(v, NCFSM__VE_STALLED, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, what);
  return true;
}

/* The channel runs (RUNNING): what queued meanwhile is posted. */
void ncfsm__vpairs_post(struct ncfsm__verifier *v) {
  if (!v->pairs) return;
  for (vdir *d = v->pairs->act; d; d = d->act) post_dir(v, d);
}

/* A completed window: true with the report when the two sides differ. */
static bool compare(const struct ncfsm__verifier *v, const vdir *d, const pex *x, char *what, size_t len) {
  int src = d->send ? v->c->rank : d->peer, dst = d->send ? d->peer : v->c->rank;
  const pmsg *s = &x->all[0], *r = &x->all[1];
  /* a window one side cut off the schedule (its check found a difference): the ops both hold first */
  for (uint32_t i = 0; s->lo == r->lo && i < s->n && i < r->n && i < PW_MAX; i++)
    if (ncfsm__verify_describe_pair(s->lo + i, src, dst, s->e[i].count, s->e[i].dtype, r->e[i].count, r->e[i].dtype,
                                    what, len))
      return true;
  if (s->lo != r->lo || s->n != r->n || s->win != r->win) {
    snprintf(what, len,
             "verification: the sends from rank %d to rank %d are out of step with their receives: the sender "
             "exchanged seqs %" PRIu64 "..%" PRIu64 " (window %u), the receiver seqs %" PRIu64 "..%" PRIu64
             " (window %u): are verify_window and the ops the same on both ranks?",
             src, dst, s->lo, s->lo + s->n - 1, s->win, r->lo, r->lo + r->n - 1, r->win);
    return true;
  }
  return false;
}

static void pex_free(pex *x) {
  if (x->req) ncfsm_boot_req_free(x->req);
  free(x);
}

/* The head of d: done (freed; true), waiting (false), or failing the comm
 * (*fired). */
static bool poll_head(struct ncfsm__verifier *v, vdir *d, uint64_t now, bool *fired) {
  ncfsm_comm *c = v->c;
  pex *x = d->head;
  char what[520];
  const char *mine = d->send ? "send" : "receive", *theirs = d->send ? "receive" : "send";
  uint64_t last = x->mine.lo + x->mine.n - 1;
  if (!x->req && x->post_rc == NCFSM_OK) return false; /* not posted yet */
  ncfsm_result_t r = x->post_rc != NCFSM_OK ? x->post_rc : ncfsm_boot_test(x->req);
  if (r == NCFSM_ERR_AGAIN) {
    uint64_t stall = c->opts.verify_stall_ms * 1000000ull;
    if (!stall || now < x->t_post || now - x->t_post <= stall) return false;
    snprintf(what, sizeof what,
             "verification: %s seq %" PRIu64 " %s rank %d was launched here %" PRIu64 " ms ago; rank %d never posted "
             "the matching %s (it did not reach %s seq %" PRIu64 " %s rank %d within verify_stall_ms): it stopped, "
             "skipped it or is far behind",
             mine, last, d->send ? "to" : "from", d->peer, (now - x->t_post) / 1000000u, d->peer, theirs, theirs, last,
             d->send ? "from" : "to", c->rank);
    *fired = true;
    ncfsm__verify_fire(v, NCFSM__VE_STALLED, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, what);
    return false;
  }
  if (r != NCFSM_OK && x->post_rc == NCFSM_OK && now - (x->t_failed ? x->t_failed : (x->t_failed = now)) < EXPLAIN_NS) {
    ncfsm__vchan_wake(v); /* the peer left after its comm failed: its notice may be on its way */
    return false;
  }
  if (r != NCFSM_OK) {
    snprintf(what, sizeof what, "verification: the exchange of the %ss %s rank %d at seq %" PRIu64 " failed (%s: %s)",
             mine, d->send ? "to" : "from", d->peer, last, ncfsm_err_name(r), ncfsm_boot_last_error(d->ch));
    *fired = true;
    ncfsm__verify_fire(v, NCFSM__VE_CHANNEL_FAILED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
    return false;
  }
  if (compare(v, d, x, what, sizeof what)) {
    *fired = true;
    v->tell_mismatch = true; /* the ranks outside the pair find nothing themselves */
    ncfsm__verify_fire(v, NCFSM__VE_DIVERGED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_MISMATCH, what);
    return false;
  }
  d->head = x->next;
  if (!d->head) d->tail = NULL;
  pex_free(x);
  return true;
}

bool ncfsm__vpairs_poll(struct ncfsm__verifier *v, uint64_t now) {
  struct ncfsm__vpairs *ps = v->pairs;
  bool progress = false, fired = false;
  if (!ps) return false;
  if (ps->stall_due && v->c->opts.verify_stall_ms) ask_waiting(v, now);
  ps->stall_due = false; /* the watchdog says again while it holds */
  for (int i = 0; ps->nasking && i < 2 * ps->nranks; i++)
    if (ps->dirs[i] && ps->dirs[i]->asking && judge_asked(v, ps->dirs[i], now)) return true;
  if (v->c->opts.verify_stall_ms) check_windows(v, now);
  for (vdir **at = &ps->act; *at && !fired;) {
    vdir *d = *at;
    while (d->head && poll_head(v, d, now, &fired)) progress = true;
    if (fired) return true;
    if (!d->head) { /* off the list */
      *at = d->act;
      d->listed = false;
      d->act = NULL;
      continue;
    }
    post_dir(v, d);
    at = &d->act;
  }
  return progress;
}

/* The exchanges are dropped (a failed or ended comm); the channels stay until close. */
void ncfsm__vpairs_drop(struct ncfsm__verifier *v) {
  struct ncfsm__vpairs *ps = v->pairs;
  if (!ps) return;
  for (vdir *d = ps->act, *n; d; d = n) {
    n = d->act;
    while (d->head) {
      pex *x = d->head;
      d->head = x->next;
      pex_free(x);
    }
    d->tail = NULL;
    d->act = NULL;
    d->listed = false;
  }
  ps->act = NULL;
  for (int i = 0; i < 2 * ps->nranks; i++)
    if (ps->dirs[i]) ps->dirs[i]->asking = ps->dirs[i]->checking = false;
  ps->nasking = ps->nchecking = 0;
}

/* Before the verifier's channel closes: its pairs' channels (nothing is out any more). */
void ncfsm__vpairs_close(struct ncfsm__verifier *v) {
  struct ncfsm__vpairs *ps = v->pairs;
  if (!ps) return;
  ncfsm__vpairs_drop(v);
  for (int i = 0; i < 2 * ps->nranks; i++)
    if (ps->dirs[i] && ps->dirs[i]->ch) {
      if (ncfsm_boot_close(ps->dirs[i]->ch) != NCFSM_OK)
        NCFSM_WARN(NCFSM__SUB_FSM, "[%s rank %d] verification: a send/recv channel did not close: %s", v->c->name,
                   v->c->rank, ncfsm_boot_last_error(ps->dirs[i]->ch));
      ps->dirs[i]->ch = NULL;
    }
}

void ncfsm__vpairs_free(struct ncfsm__verifier *v) {
  struct ncfsm__vpairs *ps = v->pairs;
  if (!ps) return;
  ncfsm__vpairs_close(v);
  for (int i = 0; i < 2 * ps->nranks; i++) free(ps->dirs[i]);
  free(ps->dirs);
  free(ps);
  v->pairs = NULL;
}
