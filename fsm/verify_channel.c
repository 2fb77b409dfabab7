/*
 * The verifier's channel for ranks in other processes (docs/ordering.md,
 * "Verification"): once the comm is in service, a bootstrap channel
 * "ncfsm.verify.<comm id>" among every rank of the comm's bootstrap
 * (ncfsm_boot_channel_open), so that the verification's exchanges never
 * interleave with the program's own collectives on that bootstrap; and its
 * notices (ncfsm_boot_notice_post), which carry three kinds of message
 * between the ranks' verifiers:
 *   FAILED  this rank's comm failed (its seq, cause and text): the other
 *           ranks fail theirs with NCFSM_ERR_PEER naming it (PEER_FAILED);
 *   ASK     an exchange of this rank stalled at seq S: how far is yours?
 *   ANSWER  the rank's next collective seq and its comm's state.
 * A stalled exchange asks (ASKING) and names, once every rank answered or
 * the answer bound passed, the ranks that did not reach the seq (with the
 * seq each is at) and the ranks that did not answer.
 *
 * The notice callback runs on the bootstrap's thread outside the loop's
 * turns: it only files the notice in the inbox (its own lock) and kicks the
 * loop; the verifier's poll applies it under the loop's lock. Notices are
 * best effort (a dead rank gets none, a full transport drops them): a
 * failure that does not arrive is still found by the stall bound.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "fsm/verify.h"
#include "ncfsm/bootstrap.h"

/* The kind of a notice: the low two bits of its key (the rest: the comm id). K_PAIR: a question
 * about one direction of a send/recv pair and its answer (fsm/verify_pairs.c): cause is the
 * direction as seen by the poster (0: its sends to the target, 1: its receives from it; +2 in an
 * answer), seq the op's seq (question) or the answerer's next seq that way (answer), what
 * "pair <target rank>"; cause 4 asks the target to check the poster's sends to it of seqs
 * [lo, seq) (what "pair <target> check <lo> <hash>"), cause 5 is its verdict (seq the same,
 * what "pair <target> verdict <c>"). Target -1 (every rank), from rank 0, about collectives
 * (fsm/verify_async.c): cause 6 asks to check those before seq against its rolling hash (what
 * "pair -1 wcheck <hash>"), cause 8 tells that a rank's differ there ("pair -1 wdiffer
 * <rank>"); cause 7 is a rank's verdict to rank 0 ("pair 0 wverdict <c>"). */
enum { K_PAIR = 0, K_FAILED = 1, K_ASK = 2, K_ANSWER = 3 };
#define KEY(c, k) (((c)->comm_id & ~(uint64_t)3) | (k))

/* Bits of the attention word, which the engine reads inline to know whether the verifier
 * needs a turn (c->verify_att): notices filed by the callback, this rank's failure to post,
 * and exchanges or a state to poll (ncfsm__vchan_mark). */
enum { IN_FAILED = 1u, IN_ASK = 2u, IN_ANSWER = 4u, IN_POST = 8u, IN_WORK = 16u, IN_DONE = 32u, IN_PAIR = 64u };

#define PAIR_Q 16 /* questions about pairs kept to answer (more: dropped; the asker names no answer) */

struct ncfsm__vchan {
  ncfsm_boot *ch;    /* the channel; NULL until opened */
  ncfsm_comm *c;     /* given a turn by the callback (ncfsm__comm_attend_async) */
  struct event *stall_tm; /* while exchanges are out: a look at their stall bound every quarter of it */
  uint64_t stall_us;
  int nranks, rank;
  pthread_mutex_t mu; /* the inbox, filed by the callback */
  _Atomic unsigned att;
  ncfsm_boot_notice failed; /* the first failure of another rank */
  uint64_t ask_seq;         /* an ASK to answer (the highest asked) */
  uint64_t *ans_seq;        /* per rank: the answer to this rank's ASK */
  int32_t *ans_state;
  unsigned char *answered;
  /* outgoing */
  bool no_notices; /* the bootstrap refused one as unsupported (pmix under Slurm): none is posted */
  bool fail_due;
  ncfsm_boot_notice fail_out;
  /* this rank's ASK */
  uint64_t ask_mine, ask_t0, ask_bound_ns;
  ncfsm_boot_req *ask_req; /* the stalled exchange (owned by its queue) */
  char ask_text[400];
  /* send/recv pairs: questions of other ranks to answer, and answers to this rank's */
  struct { int from, dir; } pair_q[PAIR_Q];
  int npair_q;
  struct { int from, dir; uint64_t next; } pair_a[PAIR_Q];
  int npair_a;
  struct { int from; uint64_t lo, hi, hash; } pair_c[PAIR_Q]; /* checks to judge */
  int npair_c;
  struct { int from; uint64_t hi; char verdict; } pair_v[PAIR_Q]; /* verdicts on this rank's checks */
  int npair_v;
  /* collectives' windows that did not fill: rank 0's question and news (the latest of each), and
   * (on rank 0) each rank's verdict on its last question */
  bool wq_due, wd_due;
  uint64_t wq_hi, wq_hash, wd_hi;
  int wd_rank;
  uint64_t *wv_hi;
  char *wv;
};

static void on_notice(ncfsm_boot *b, const ncfsm_boot_notice *n, void *arg) {
  (void)b;
  struct ncfsm__vchan *vc = arg;
  pthread_mutex_lock(&vc->mu);
  unsigned k = (unsigned)(n->key & 3);
  if (k == K_FAILED && !(atomic_load(&vc->att) & IN_FAILED) && !vc->failed.key) {
    vc->failed = *n;
    atomic_fetch_or(&vc->att, IN_FAILED);
  } else if (k == K_ASK) {
    if (n->seq > vc->ask_seq || !(atomic_load(&vc->att) & IN_ASK)) vc->ask_seq = n->seq;
    atomic_fetch_or(&vc->att, IN_ASK);
  } else if (k == K_PAIR && n->origin >= 0 && n->origin < vc->nranks) {
    int target = -2, wr;
    if (sscanf(n->what, "pair %d", &target) == 1 && (target == vc->rank || target == -1)) {
      uint64_t lo, hash;
      char verdict;
      if (n->cause == 6 && sscanf(n->what, "pair -1 wcheck %" SCNx64, &hash) == 1) {
        vc->wq_due = true;
        vc->wq_hi = n->seq;
        vc->wq_hash = hash;
      } else if (n->cause == 8 && sscanf(n->what, "pair -1 wdiffer %d", &wr) == 1) {
        vc->wd_due = true;
        vc->wd_hi = n->seq;
        vc->wd_rank = wr;
      } else if (n->cause == 7 && vc->wv && sscanf(n->what, "pair 0 wverdict %c", &verdict) == 1) {
        vc->wv_hi[n->origin] = n->seq;
        vc->wv[n->origin] = verdict;
      } else if (n->cause == 4 && vc->npair_c < PAIR_Q &&
          sscanf(n->what, "pair %*d check %" SCNu64 " %" SCNx64, &lo, &hash) == 2) {
        vc->pair_c[vc->npair_c].from = n->origin;
        vc->pair_c[vc->npair_c].lo = lo;
        vc->pair_c[vc->npair_c].hi = n->seq;
        vc->pair_c[vc->npair_c++].hash = hash;
      } else if (n->cause == 5 && vc->npair_v < PAIR_Q && sscanf(n->what, "pair %*d verdict %c", &verdict) == 1) {
        vc->pair_v[vc->npair_v].from = n->origin;
        vc->pair_v[vc->npair_v].hi = n->seq;
        vc->pair_v[vc->npair_v++].verdict = verdict;
      } else if (n->cause < 2 && vc->npair_q < PAIR_Q) {
        vc->pair_q[vc->npair_q].from = n->origin;
        vc->pair_q[vc->npair_q++].dir = n->cause;
      } else if (n->cause >= 2 && n->cause < 4 && vc->npair_a < PAIR_Q) {
        vc->pair_a[vc->npair_a].from = n->origin;
        vc->pair_a[vc->npair_a].dir = n->cause - 2;
        vc->pair_a[vc->npair_a++].next = n->seq;
      }
      atomic_fetch_or(&vc->att, IN_PAIR);
    }
  } else if (k == K_ANSWER && n->origin >= 0 && n->origin < vc->nranks && n->seq != UINT64_MAX) {
    /* an answer to an earlier ASK says the rank is at least as far: keep the highest */
    if (!vc->answered[n->origin] || n->seq > vc->ans_seq[n->origin]) vc->ans_seq[n->origin] = n->seq;
    vc->ans_state[n->origin] = n->cause;
    vc->answered[n->origin] = 1;
    atomic_fetch_or(&vc->att, IN_ANSWER);
  }
  ncfsm__comm_attend_async(vc->c); /* under mu: vc and its comm are alive */
  pthread_mutex_unlock(&vc->mu);
}

static void stall_look(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  ncfsm__vchan_wake(arg);
}

/* Exchanges are out (waits): the stall timer runs. It is not taken off when they are done: it
 * fires once more at most (a poll that finds nothing), where deleting and adding it around every
 * window cost more than that poll (a window every 64 ops). */
void ncfsm__vchan_waits(struct ncfsm__verifier *v, bool waits) {
  struct ncfsm__vchan *vc = v->chan;
  if (!vc || !vc->stall_tm || !waits || evtimer_pending(vc->stall_tm, NULL)) return;
  struct timeval tv = {(time_t)(vc->stall_us / 1000000u), (suseconds_t)(vc->stall_us % 1000000u)};
  evtimer_add(vc->stall_tm, &tv);
}

ncfsm_result_t ncfsm__vchan_new(struct ncfsm__verifier *v) {
  struct ncfsm__vchan *vc = calloc(1, sizeof *vc);
  if (!vc) return NCFSM_ERR_NO_MEMORY;
  vc->c = v->c;
  pthread_mutex_init(&vc->mu, NULL);
  atomic_init(&vc->att, IN_WORK); /* WAITING: polled until in service */
  v->chan = vc;
  v->c->verify_att = &vc->att;
  /* an exchange out is not polled (its callback wakes the verifier): a timer looks at the
   * stall bound while some are out */
  vc->stall_us = v->c->opts.verify_stall_ms * 250ull;
  if (vc->stall_us && !(vc->stall_tm = evtimer_new(ncfsm_loop_base(v->c->loop), stall_look, v))) {
    pthread_mutex_destroy(&vc->mu);
    free(vc);
    v->chan = NULL;
    v->c->verify_att = NULL;
    return NCFSM_ERR_NO_MEMORY;
  }
  return NCFSM_OK;
}

/* An exchange finished (its callback, on the loop's thread), or the watchdog found a launch
 * older than the stall bound: the next turn polls the verifier. */
void ncfsm__vchan_wake(struct ncfsm__verifier *v) {
  if (!v->chan) return;
  atomic_fetch_or_explicit(&v->chan->att, IN_DONE, memory_order_relaxed);
  ncfsm__comm_attend_async(v->c); /* from libevent's callbacks: without the loop's lock */
}

void ncfsm__vchan_polled(struct ncfsm__verifier *v) {
  if (v->chan) atomic_fetch_and_explicit(&v->chan->att, ~IN_DONE, memory_order_relaxed);
}

void ncfsm__vchan_mark(struct ncfsm__verifier *v, bool work) {
  struct ncfsm__vchan *vc = v->chan;
  if (!vc || work == !!(atomic_load_explicit(&vc->att, memory_order_relaxed) & IN_WORK)) return;
  if (work) {
    atomic_fetch_or_explicit(&vc->att, IN_WORK, memory_order_relaxed);
    ncfsm__comm_enlist(v->c); /* the verifier's hooks hold the loop's lock */
  } else {
    atomic_fetch_and_explicit(&vc->att, ~IN_WORK, memory_order_relaxed);
  }
}

/* The comm is in service (its id is the same on every rank now): open the
 * channel on the comm's bootstrap. false: it could not be (the text in
 * why): the comm runs unverified. */
bool ncfsm__vchan_open(struct ncfsm__verifier *v, char *why, size_t len) {
  struct ncfsm__vchan *vc = v->chan;
  ncfsm_comm *c = v->c;
  char tag[48];
  snprintf(tag, sizeof tag, "ncfsm.verify.%016" PRIx64, c->comm_id);
  int n = c->nranks; /* known now */
  if (!(vc->ans_seq = calloc((size_t)n, sizeof *vc->ans_seq)) ||
      !(vc->ans_state = calloc((size_t)n, sizeof *vc->ans_state)) || !(vc->answered = calloc((size_t)n, 1)) ||
      !(vc->wv_hi = calloc((size_t)n, sizeof *vc->wv_hi)) || !(vc->wv = calloc((size_t)n, 1))) {
    snprintf(why, len, "verification: out of memory for its channel's answers (%d ranks)", n);
    return false;
  }
  vc->nranks = n;
  vc->rank = c->rank;
  ncfsm_result_t r = ncfsm_boot_channel_open(v->parent, tag, v->members, v->members ? n : 0, &vc->ch);
  if (r == NCFSM_OK) r = ncfsm_boot_on_notice(vc->ch, on_notice, vc);
  if (r != NCFSM_OK) {
    snprintf(why, len, "verification: its channel '%s' could not be opened on the comm's bootstrap (%s: %s)", tag,
             ncfsm_err_name(r), ncfsm_boot_last_error(vc->ch ? vc->ch : v->parent));
    if (vc->ch) ncfsm_boot_close(vc->ch);
    vc->ch = NULL;
    return false;
  }
  v->boot = vc->ch;
  return true;
}

static void close_channel(struct ncfsm__verifier *v) {
  struct ncfsm__vchan *vc = v->chan;
  ncfsm__vpairs_close(v); /* channels of this one */
  ncfsm_boot_on_notice(vc->ch, NULL, NULL);
  if (ncfsm_boot_close(vc->ch) != NCFSM_OK)
    NCFSM_WARN(NCFSM__SUB_FSM, "[%s rank %d] verification: its channel did not close: %s", v->c->name, v->c->rank,
               ncfsm_boot_last_error(vc->ch));
  vc->ch = NULL;
  v->boot = NULL;
}

/* The comm is closing or closed: the channel closes once this rank's
 * failure, if any, was posted, so that the program may close the comm's
 * bootstrap as soon as the comm is closed. */
void ncfsm__vchan_retire(struct ncfsm__verifier *v) {
  struct ncfsm__vchan *vc = v->chan;
  if (vc && vc->ch && !vc->fail_due) close_channel(v);
}

bool ncfsm__vchan_open_now(const struct ncfsm__verifier *v) { return v->chan && v->chan->ch; }

void ncfsm__vchan_free(struct ncfsm__verifier *v) {
  struct ncfsm__vchan *vc = v->chan;
  if (!vc) return;
  if (vc->ch) close_channel(v);
  if (vc->stall_tm) event_free(vc->stall_tm);
  if (v->c->verify_att == &vc->att) v->c->verify_att = NULL;
  pthread_mutex_destroy(&vc->mu);
  free(vc->ans_seq);
  free(vc->ans_state);
  free(vc->answered);
  free(vc->wv_hi);
  free(vc->wv);
  free(vc);
  v->chan = NULL;
}

bool ncfsm__vchan_busy(const struct ncfsm__verifier *v) {
  const struct ncfsm__vchan *vc = v->chan;
  return vc && (vc->fail_due || atomic_load_explicit(&vc->att, memory_order_acquire));
}

/* This rank's comm failed: the other ranks are told at the next poll (on
 * the loop's thread). A peer's failure is not passed on; a divergence of
 * the collectives every rank finds itself (a send/recv pair's only its two
 * ranks: it is passed on). */
static void post_failure(struct ncfsm__verifier *v);

void ncfsm__vchan_failed(struct ncfsm__verifier *v, ncfsm_result_t cause, const char *what) {
  struct ncfsm__vchan *vc = v->chan;
  ncfsm_comm *c = v->c;
  if (!vc || cause == NCFSM_ERR_PEER || (cause == NCFSM_ERR_MISMATCH && !v->tell_mismatch) || vc->fail_out.key)
    return;
  vc->fail_out.key = KEY(c, K_FAILED);
  vc->fail_out.seq = c->coll_seq;
  vc->fail_out.cause = cause;
  snprintf(vc->fail_out.what, sizeof vc->fail_out.what, "%s", what ? what : "");
  vc->fail_due = true;
  atomic_fetch_or_explicit(&vc->att, IN_POST, memory_order_relaxed);
  /* in a turn (the thread that runs the bootstrap's base): at once, before the program can
   * close the bootstrap; else at the next poll */
  if (ncfsm__loop_in_turn(c->loop)) post_failure(v);
  else ncfsm__comm_attend_async(c); /* its loop may sleep (a failure from the program's thread) */
}

static void post(struct ncfsm__verifier *v, const ncfsm_boot_notice *n) {
  if (v->chan->no_notices) return;
  ncfsm_result_t r = ncfsm_boot_notice_post(v->chan->ch, n);
  if (r == NCFSM_ERR_UNSUPPORTED) {
    v->chan->no_notices = true; /* stalls are named without the others' answers; failures are not passed on */
    NCFSM_WARN(NCFSM__SUB_FSM, "[%s rank %d] verification: this bootstrap sends no notices (%s): failures are not "
               "passed to the other ranks and a stall does not name them", v->c->name, v->c->rank,
               ncfsm_boot_last_error(v->chan->ch));
  } else if (r != NCFSM_OK)
    NCFSM_INFO(NCFSM__SUB_FSM, "[%s rank %d] verification: a notice was not sent (%s: %s)", v->c->name, v->c->rank,
               ncfsm_err_name(r), ncfsm_boot_last_error(v->chan->ch));
}

/* How far this rank is, in the unit its mode exchanges: async, its next
 * collective seq (the collectives it launched); strict, the exchanges it
 * posted (one per collective submitted). */
static uint64_t progress_of(const struct ncfsm__verifier *v) {
  return v->c->opts.verify == NCFSM_VERIFY_STRICT ? v->sround : v->c->coll_seq;
}

/* What the inbox holds, applied on the loop's thread: a failure to pass on,
 * answers to give. true with what: another rank's comm failed. */
/* This rank's failure, if it is to be told: posted now (on the loop's thread). */
static void post_failure(struct ncfsm__verifier *v) {
  struct ncfsm__vchan *vc = v->chan;
  ncfsm_comm *c = v->c;
  if (!vc->fail_due) return;
  /* failed in service before its first poll: the comm id is the same on every rank once it launched */
  if (!vc->ch && v->parent && c->coll_seq > 0) {
    char why[300];
    if (!ncfsm__vchan_open(v, why, sizeof why)) NCFSM_INFO(NCFSM__SUB_FSM, "[%s rank %d] %s", c->name, c->rank, why);
  }
  if (!vc->ch) return;
  vc->fail_due = false;
  atomic_fetch_and_explicit(&vc->att, ~IN_POST, memory_order_relaxed);
  post(v, &vc->fail_out);
}

/* Questions of other ranks about a direction of a pair: this rank's next seq that way (its
 * receives from the asker where the asker sends, its sends where it receives). */
static void answer_pairs(struct ncfsm__verifier *v) {
  struct ncfsm__vchan *vc = v->chan;
  if (!(atomic_load_explicit(&vc->att, memory_order_acquire) & IN_PAIR)) return;
  pthread_mutex_lock(&vc->mu);
  int nq = vc->npair_q, nc = vc->npair_c;
  __typeof__(vc->pair_q[0]) q[PAIR_Q];
  __typeof__(vc->pair_c[0]) chk[PAIR_Q];
  memcpy(q, vc->pair_q, sizeof q);
  memcpy(chk, vc->pair_c, sizeof chk);
  vc->npair_q = vc->npair_c = 0;
  bool wq = vc->wq_due, wd = vc->wd_due;
  uint64_t wq_hi = vc->wq_hi, wq_hash = vc->wq_hash, wd_hi = vc->wd_hi;
  int wd_rank = vc->wd_rank;
  vc->wq_due = vc->wd_due = false;
  if (!vc->npair_a && !vc->npair_v) atomic_fetch_and(&vc->att, ~IN_PAIR);
  pthread_mutex_unlock(&vc->mu);
  for (int i = 0; i < nq; i++) {
    ncfsm_boot_notice a = {.key = KEY(v->c, K_PAIR), .seq = ncfsm__vpairs_next(v, q[i].from, q[i].dir == 1),
                           .cause = 2 + q[i].dir};
    snprintf(a.what, sizeof a.what, "pair %d", q[i].from);
    post(v, &a);
  }
  for (int i = 0; i < nc; i++) {
    ncfsm_boot_notice a = {.key = KEY(v->c, K_PAIR), .seq = chk[i].hi, .cause = 5};
    snprintf(a.what, sizeof a.what, "pair %d verdict %c", chk[i].from,
             ncfsm__vpairs_check(v, chk[i].from, chk[i].lo, chk[i].hi, chk[i].hash));
    post(v, &a);
  }
  if (wq && v->c->rank != 0) {
    ncfsm_boot_notice a = {.key = KEY(v->c, K_PAIR), .seq = wq_hi, .cause = 7};
    snprintf(a.what, sizeof a.what, "pair 0 wverdict %c", ncfsm__vasync_check(v, wq_hi, wq_hash));
    post(v, &a);
  }
  if (wd && v->c->rank != 0) ncfsm__vasync_differ(v, wd_hi, wd_rank);
}

void ncfsm__vchan_window_check(struct ncfsm__verifier *v, uint64_t hi, uint64_t hash) {
  struct ncfsm__vchan *vc = v->chan;
  if (!vc || !vc->ch || !vc->wv) return;
  pthread_mutex_lock(&vc->mu);
  memset(vc->wv, 0, (size_t)vc->nranks);
  pthread_mutex_unlock(&vc->mu);
  ncfsm_boot_notice q = {.key = KEY(v->c, K_PAIR), .seq = hi, .cause = 6};
  snprintf(q.what, sizeof q.what, "pair -1 wcheck %016" PRIx64, hash);
  post(v, &q);
}

void ncfsm__vchan_window_verdicts(struct ncfsm__verifier *v, uint64_t hi, char *verdicts) {
  struct ncfsm__vchan *vc = v->chan;
  memset(verdicts, 0, (size_t)v->c->nranks);
  if (!vc || !vc->wv) return;
  pthread_mutex_lock(&vc->mu);
  for (int r = 0; r < vc->nranks; r++)
    if (vc->wv_hi[r] == hi) verdicts[r] = vc->wv[r];
  pthread_mutex_unlock(&vc->mu);
}

void ncfsm__vchan_window_differ(struct ncfsm__verifier *v, uint64_t hi, int rank) {
  struct ncfsm__vchan *vc = v->chan;
  if (!vc || !vc->ch) return;
  ncfsm_boot_notice q = {.key = KEY(v->c, K_PAIR), .seq = hi, .cause = 8};
  snprintf(q.what, sizeof q.what, "pair -1 wdiffer %d", rank);
  post(v, &q);
}

void ncfsm__vchan_pair_check(struct ncfsm__verifier *v, int peer, uint64_t lo, uint64_t hi, uint64_t hash) {
  struct ncfsm__vchan *vc = v->chan;
  if (!vc || !vc->ch) return;
  ncfsm_boot_notice q = {.key = KEY(v->c, K_PAIR), .seq = hi, .cause = 4};
  snprintf(q.what, sizeof q.what, "pair %d check %" PRIu64 " %016" PRIx64, peer, lo, hash);
  post(v, &q);
}

bool ncfsm__vchan_pair_verdict(struct ncfsm__verifier *v, int peer, uint64_t hi, char *verdict) {
  struct ncfsm__vchan *vc = v->chan;
  bool got = false;
  if (!vc || !(atomic_load_explicit(&vc->att, memory_order_acquire) & IN_PAIR)) return false;
  pthread_mutex_lock(&vc->mu);
  if (!verdict) vc->npair_v = 0; /* no check is out: what came is late, or not for this rank's */
  for (int i = 0; i < vc->npair_v && !got; i++)
    if (vc->pair_v[i].from == peer && vc->pair_v[i].hi == hi) {
      *verdict = vc->pair_v[i].verdict;
      vc->pair_v[i] = vc->pair_v[--vc->npair_v];
      got = true;
    }
  if (!vc->npair_a && !vc->npair_q && !vc->npair_v && !vc->npair_c) atomic_fetch_and(&vc->att, ~IN_PAIR);
  pthread_mutex_unlock(&vc->mu);
  return got;
}

void ncfsm__vchan_pair_ask(struct ncfsm__verifier *v, int peer, bool send, uint64_t seq) {
  struct ncfsm__vchan *vc = v->chan;
  if (!vc || !vc->ch) return;
  ncfsm_boot_notice q = {.key = KEY(v->c, K_PAIR), .seq = seq, .cause = send ? 0 : 1};
  snprintf(q.what, sizeof q.what, "pair %d", peer);
  post(v, &q);
}

bool ncfsm__vchan_pair_answer(struct ncfsm__verifier *v, int peer, bool send, uint64_t *next) {
  struct ncfsm__vchan *vc = v->chan;
  bool got = false;
  if (!vc) return false;
  pthread_mutex_lock(&vc->mu);
  for (int i = 0; i < vc->npair_a && !got; i++)
    if (vc->pair_a[i].from == peer && vc->pair_a[i].dir == (send ? 0 : 1)) {
      *next = vc->pair_a[i].next;
      vc->pair_a[i] = vc->pair_a[--vc->npair_a];
      got = true;
    }
  if (!vc->npair_a && !vc->npair_q && !vc->npair_v && !vc->npair_c) atomic_fetch_and(&vc->att, ~IN_PAIR);
  pthread_mutex_unlock(&vc->mu);
  return got;
}

bool ncfsm__vchan_take(struct ncfsm__verifier *v, char *what, size_t len) {
  struct ncfsm__vchan *vc = v->chan;
  ncfsm_comm *c = v->c;
  if (!vc) return false;
  post_failure(v);
  if (!vc->ch) return false;
  if (v->state != NCFSM__VS_ASKING) atomic_fetch_and_explicit(&vc->att, ~IN_ANSWER, memory_order_relaxed); /* late */
  unsigned att = atomic_load_explicit(&vc->att, memory_order_acquire);
  if (att & IN_PAIR) answer_pairs(v);
  if (!(att & (IN_FAILED | IN_ASK))) return false;
  pthread_mutex_lock(&vc->mu);
  bool failed = att & IN_FAILED;
  ncfsm_boot_notice f = vc->failed;
  /* a send/recv mismatch of a pair this rank is in: the exchange that showed it to the origin
   * shows it to this rank too; its own report comes first (the notice waits while this rank's
   * exchanges with the origin are out) */
  bool defer = failed && f.cause == NCFSM_ERR_MISMATCH && ncfsm__vpairs_with(v, f.origin);
  atomic_fetch_and(&vc->att, defer ? ~(unsigned)IN_ASK : ~(unsigned)(IN_FAILED | IN_ASK));
  failed &= !defer;
  pthread_mutex_unlock(&vc->mu);
  if (att & IN_ASK) {
    ncfsm_boot_notice a = {.key = KEY(c, K_ANSWER), .seq = progress_of(v), .cause = (int32_t)c->state};
    post(v, &a);
  }
  if (!failed) return false;
  ncfsm__verify_describe_peer(f.origin, f.seq, (ncfsm_result_t)f.cause, f.what, what, len);
  return true;
}

/* An exchange (req; seq: what progress_of says a rank that posted it
 * reached) stalled past the bound: ask the
 * others how far they are (action ask), or, without a channel's notices,
 * name the stall at once. */
void ncfsm__vchan_stalled(struct ncfsm__verifier *v, ncfsm_boot_req *req, uint64_t seq, const char *what) {
  struct ncfsm__vchan *vc = v->chan;
  if (!vc || !vc->ch || vc->no_notices) {
    ncfsm__verify_fire(v, NCFSM__VE_STALLED, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, what);
    return;
  }
  vc->ask_req = req;
  vc->ask_mine = seq;
  snprintf(vc->ask_text, sizeof vc->ask_text, "%s", what);
  ncfsm__verify_fire(v, NCFSM__VE_STALL_SUSPECTED, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, NULL);
}

uint64_t ncfsm__vchan_answer_bound_ns(const ncfsm_comm *c) {
  uint64_t b = c->opts.verify_stall_ms / 4;
  return (b < 100 ? 100 : b > 1000 ? 1000 : b) * 1000000ull;
}

/* Action ask: the others' answers are collected for at most a quarter of the
 * stall bound (100 to 1000 ms: a loaded machine's loop may take tens of ms to
 * turn, and a rank named silent must really be). */
void ncfsm__vchan_ask(struct ncfsm__verifier *v) {
  struct ncfsm__vchan *vc = v->chan;
  ncfsm_comm *c = v->c;
  pthread_mutex_lock(&vc->mu);
  memset(vc->answered, 0, (size_t)vc->nranks);
  atomic_fetch_and(&vc->att, ~IN_ANSWER);
  pthread_mutex_unlock(&vc->mu);
  vc->ask_bound_ns = ncfsm__vchan_answer_bound_ns(c);
  vc->ask_t0 = ncfsm__now_ns();
  ncfsm_boot_notice a = {.key = KEY(c, K_ASK), .seq = vc->ask_mine};
  post(v, &a);
}

/* The stall's report: who is behind (and where), who did not answer. */
static void culprits(struct ncfsm__verifier *v, char *out, size_t len) {
  struct ncfsm__vchan *vc = v->chan;
  ncfsm_comm *c = v->c;
  char behind[300] = "", silent[200] = "";
  bool strict = c->opts.verify == NCFSM_VERIFY_STRICT;
  size_t kb = 0, ks = 0;
  int nb = 0, ns = 0;
  pthread_mutex_lock(&vc->mu);
  for (int r = 0; r < vc->nranks; r++) {
    if (r == c->rank) continue;
    if (!vc->answered[r]) {
      if (ks + 12 < sizeof silent) ks += (size_t)snprintf(silent + ks, sizeof silent - ks, "%s%d", ns ? "," : "", r);
      ns++;
    } else if (vc->ans_seq[r] < vc->ask_mine) {
      if (kb + 60 < sizeof behind)
        kb += (size_t)snprintf(behind + kb, sizeof behind - kb, "%srank %d %s %" PRIu64 " (%s)", nb ? ", " : "", r,
                               strict ? "submitted only" : "at seq", vc->ans_seq[r],
                               ncfsm_state_name((ncfsm_state_t)vc->ans_state[r]));
      nb++;
    }
  }
  pthread_mutex_unlock(&vc->mu);
  unsigned ms = (unsigned)(vc->ask_bound_ns / 1000000ull);
  if (!nb && !ns) {
    snprintf(out, len, "%s; every rank answered that it got there (%s %" PRIu64 "): the channel stalled", vc->ask_text,
             strict ? "submitted" : "seq", vc->ask_mine);
    return;
  }
  char tail[300] = "";
  if (ns)
    snprintf(tail, sizeof tail, "%s%s %s did not answer within %u ms (dead, hung, not running its loop, or verifying "
             "off)", nb ? "; " : "", ns > 1 ? "ranks" : "rank", silent, ms);
  snprintf(out, len, "%s; %s%s%s", vc->ask_text, nb ? "behind: " : "", behind, tail);
}

bool ncfsm__vchan_ask_aside(struct ncfsm__verifier *v, uint64_t seq, const char *what, uint64_t bound_ns) {
  struct ncfsm__vchan *vc = v->chan;
  if (!vc || !vc->ch || vc->no_notices) return false;
  vc->ask_req = NULL;
  vc->ask_mine = seq;
  snprintf(vc->ask_text, sizeof vc->ask_text, "%s", what);
  ncfsm__vchan_ask(v);
  vc->ask_bound_ns = bound_ns;
  return true;
}

void ncfsm__vchan_culprits(struct ncfsm__verifier *v, char *out, size_t len) { culprits(v, out, len); }

/* ASKING: the stalled exchange completed after all (CAUGHT_UP), or every
 * rank answered with one behind, or the answer bound passed (STALLED). */
bool ncfsm__vchan_poll_ask(struct ncfsm__verifier *v, uint64_t now) {
  struct ncfsm__vchan *vc = v->chan;
  if (vc->ask_req && ncfsm_boot_test(vc->ask_req) != NCFSM_ERR_AGAIN) {
    vc->ask_req = NULL;
    ncfsm__verify_fire(v, NCFSM__VE_CAUGHT_UP, NCFSM_EV_TIMEOUT, NCFSM_OK, NULL);
    return true;
  }
  bool all = true, behind = false;
  pthread_mutex_lock(&vc->mu);
  atomic_fetch_and(&vc->att, ~IN_ANSWER); /* read here, as they come */
  for (int r = 0; r < vc->nranks; r++) {
    if (r == v->c->rank) continue;
    all &= vc->answered[r] != 0;
    behind |= vc->answered[r] && vc->ans_seq[r] < vc->ask_mine;
  }
  pthread_mutex_unlock(&vc->mu);
  if (!(all && behind) && now - vc->ask_t0 < vc->ask_bound_ns) return false;
  char what[900];
  culprits(v, what, sizeof what);
  vc->ask_req = NULL;
  ncfsm__verify_fire(v, NCFSM__VE_STALLED, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, what);
  return true;
}
