/*
 * Layer 5: cross-rank verification of the collective order (R11;
 * docs/ordering.md "Verification"). fsm/verify.def is the verifier's
 * machine; fsm/verify.c binds it and plugs into the comm's launch path
 * (struct ncfsm__verify_ops); fsm/verify_async.c (rolling hashes per
 * window), fsm/verify_strict.c (every collective's fingerprint before it
 * launches) and fsm/verify_companion.c (strict's channel nccl) are its
 * protocols. Nothing below this layer names a function of it.
 */
#ifndef NCFSM_FSM_VERIFY_H
#define NCFSM_FSM_VERIFY_H

#include "fsm/api-int.h"

struct ncfsm__vreq;
struct ncfsm__sreq;
struct ncfsm__comp;
struct ncfsm__lv;
struct ncfsm__vdet;
struct ncfsm__vchan;
struct ncfsm__vpairs;

struct ncfsm__verifier {
  unsigned state; /* fsm/verify.def */
  ncfsm_comm *c;
  struct ncfsm_boot *parent; /* the comm's bootstrap (ncfsm_comm_init_boot); NULL: in-process */
  struct ncfsm_boot *boot;   /* the exchanges' channel on it, once open (fsm/verify_channel.c) */
  struct ncfsm__vchan *chan; /* the channel and its notices */
  struct ncfsm__vpairs *pairs; /* sends and receives over the channel (fsm/verify_pairs.c) */
  bool tell_mismatch; /* the comm's MISMATCH is a send/recv pair's: the ranks outside it are told */
  /* over a channel: the ranks of parent (the program's bootstrap) that are this comm's, in its
   * rank order (NULL: every rank of parent, comm rank = bootstrap rank); a split child's are
   * known once its parent's exchange of colors and keys is done (members_pending until then) */
  int *members, nmembers;
  bool members_pending;
  /* async: exchanges posted, oldest first */
  struct ncfsm__vreq *vq_head, *vq_tail, *vq_pool; /* vq_pool: done ones kept for reuse (npool) */
  unsigned npool;
  /* strict: exchanges to post (queue order), exchanges posted (oldest first) */
  struct ncfsm__sreq *sp_head, *sp_tail, *sf_head, *sf_tail;
  uint64_t sround;           /* strict: exchanges posted so far (the same count on every rank) */
  struct ncfsm__comp *comp;  /* strict over channel nccl: the companion communicator */
  struct ncfsm__lv *local;   /* in-process verification (no bootstrap: boot NULL) */
  /* async: every collective before det_lo matched; the window up to det_hi
   * differed (det_hashes), its fingerprints exchanged in det (DETAILING) */
  uint64_t det_lo, det_hi;
  uint64_t next_window; /* async: the collective seq of the next window's exchange (0: not known yet) */
  uint64_t det_lo_hash; /* the rolling hash after the collectives before det_lo */
  /* async, rank 0: a window that did not fill and had no new collective for the answer bound
   * is checked by a question to the others (wc_*: fsm/verify_async.c, "Windows that do not fill") */
  uint64_t wc_arm;      /* the launch of this seq (the first after a check) starts the stall timer */
  uint64_t wc_checked;  /* checked (or not checkable) up to this seq */
  uint64_t wc_seen, wc_seen_t, wc_hi, wc_t0;
  bool wc_asking;
  char det_hashes[256];
  struct ncfsm__vdet *det;
};

/* The payload of a verifier event: how the comm fails (fail_comm). */
typedef struct ncfsm__vev {
  ncfsm_event_t comm_ev; /* ASYNC_ERROR, or TIMEOUT for a stall */
  ncfsm_result_t cause;
  const char *what;
} ncfsm__vev;

/* ncfsm_comm_init_boot with opts.verify on: c verifies over boot; with
 * boot NULL (ncfsm_comm_init, _init_all, split children), in memory with
 * its ranks in this process (async only). */
ncfsm_result_t ncfsm__verify_attach(ncfsm_comm *c, struct ncfsm_boot *boot);

/* ---- verify_report.c ---- */
/* The fingerprints of one seq on n ranks: false when equal; else true with
 * the first field that differs and each rank's value in out. */
bool ncfsm__verify_describe(const ncfsm_fingerprint_t *fps, int n, char *out, size_t len);
/* A send (seq of the pair's direction, from src) and its receive (on dst): false when count
 * and type agree; else true with the report in out. */
bool ncfsm__verify_describe_pair(uint64_t seq, int src, int dst, uint64_t scount, int32_t sdtype, uint64_t rcount,
                                 int32_t rdtype, char *out, size_t len);
/* A peer's failure as this rank tells it: the origin, how far it had come (next_seq: the
 * seq its next collective would have taken), its cause and its own words. */
void ncfsm__verify_describe_peer(int origin, uint64_t next_seq, ncfsm_result_t cause, const char *what, char *out,
                                 size_t len);

/* ---- verify_local.c ---- */
ncfsm_result_t ncfsm__vlocal_new(struct ncfsm__verifier *v);
void ncfsm__vlocal_free(struct ncfsm__verifier *v);
void ncfsm__vlocal_launched(struct ncfsm__verifier *v, const ncfsm_work *w);
bool ncfsm__vlocal_busy(const struct ncfsm__verifier *v);
uint64_t ncfsm__vlocal_verified(const struct ncfsm__verifier *v); /* every seq below it compared equal */
void ncfsm__vlocal_stall_due(struct ncfsm__verifier *v);
void ncfsm__vlocal_quiet(struct ncfsm__verifier *v); /* out of RUNNING: only a peer's failure keeps it busy */
/* A peer's failure is for this rank to apply: true once (with the text). */
bool ncfsm__vlocal_told(const struct ncfsm__verifier *v);
bool ncfsm__vlocal_take_failure(struct ncfsm__verifier *v, char *what, size_t len);
bool ncfsm__vlocal_poll(struct ncfsm__verifier *v, uint64_t now);
void ncfsm__vlocal_failed(struct ncfsm__verifier *v, ncfsm_result_t cause, const char *what);
/* Fire ev on v (what: the report of DIVERGED, STALLED, CHANNEL_FAILED). */
void ncfsm__verify_fire(struct ncfsm__verifier *v, ncfsm__verify_event_t ev, ncfsm_event_t comm_ev,
                        ncfsm_result_t cause, const char *what);

/* A child made from a comm verified over a channel (fsm/api_split.c through
 * ncfsm__protocols.attach_child): see fsm/verify.c. */
void ncfsm__verify_attach_child(ncfsm_comm *p, ncfsm_comm *child, int color, int key, const int *exclude,
                                int nexclude); /* exclude NULL: a split (color, key); else a shrink */
/* The child's members (bootstrap ranks, in child rank order; NULL: they could not be learnt, the
 * child runs unverified, why in what). */
void ncfsm__verify_members(ncfsm_comm *child, const int *members, int n, const char *what);

/* ---- verify_async.c: a split's exchange of every parent rank's (color, key), in the parent's
 * queue of exchanges (ordered with its windows on every rank) ---- */
void ncfsm__vasync_split(struct ncfsm__verifier *v, int32_t color, int32_t key, ncfsm_comm *child);

/* ---- verify_pairs.c ---- */
void ncfsm__vpairs_launched(struct ncfsm__verifier *v, const ncfsm_work *w);
bool ncfsm__vpairs_out(const struct ncfsm__verifier *v); /* exchanges posted or queued */
void ncfsm__vpairs_post(struct ncfsm__verifier *v);      /* RUNNING: post what queued */
bool ncfsm__vpairs_poll(struct ncfsm__verifier *v, uint64_t now);
void ncfsm__vpairs_drop(struct ncfsm__verifier *v);
void ncfsm__vpairs_close(struct ncfsm__verifier *v); /* before the verifier's channel closes */
void ncfsm__vpairs_free(struct ncfsm__verifier *v);
/* This rank's next seq in its sends to peer (send) or its receives from it: for a peer's question. */
uint64_t ncfsm__vpairs_next(const struct ncfsm__verifier *v, int peer, bool send);
/* Has this rank exchanges with peer posted or queued? */
bool ncfsm__vpairs_with(const struct ncfsm__verifier *v, int peer);
/* The watchdog saw a launch older than the stall bound: an op of a window not exchanged yet asks its peer. */
void ncfsm__vpairs_stall_due(struct ncfsm__verifier *v);
/* A sender's question about its window [lo, hi) that did not fill (hash: of its ops' counts and
 * types): this rank's verdict on its receives from sender: 's' the same, 'd' they differ (the
 * window is exchanged now, cut at hi, so that the exchange names the op), 'p' already in an
 * exchange, 'b' behind (it did not receive as far), 'u' out of step. */
char ncfsm__vpairs_check(struct ncfsm__verifier *v, int sender, uint64_t lo, uint64_t hi, uint64_t hash);

/* The lists of c's works in flight (at most 65): the launch in progress, then each stream's queue. */
int ncfsm__verify_inflight(const ncfsm_comm *c, const ncfsm_work **lists);

/* ---- verify_channel.c ---- */
/* How long a question to the other ranks waits for answers: a quarter of the stall bound,
 * 100 to 1000 ms (a loaded machine's loop may take tens of ms to turn; a rank named silent
 * must really be). */
uint64_t ncfsm__vchan_answer_bound_ns(const ncfsm_comm *c);
ncfsm_result_t ncfsm__vchan_new(struct ncfsm__verifier *v);
bool ncfsm__vchan_open(struct ncfsm__verifier *v, char *why, size_t len); /* false: why */
void ncfsm__vchan_free(struct ncfsm__verifier *v);
/* Send/recv pairs (fsm/verify_pairs.c): ask peer how far it is in the direction opposite to this
 * rank's sends to it (send) or receives from it; its answer, once there (true, its next seq). */
void ncfsm__vchan_pair_ask(struct ncfsm__verifier *v, int peer, bool send, uint64_t seq);
bool ncfsm__vchan_pair_answer(struct ncfsm__verifier *v, int peer, bool send, uint64_t *next);
/* Ask peer to check this rank's sends to it of seqs [lo, hi) (ncfsm__vpairs_check); its
 * verdict, once there (true). */
void ncfsm__vchan_pair_check(struct ncfsm__verifier *v, int peer, uint64_t lo, uint64_t hi, uint64_t hash);
bool ncfsm__vchan_pair_verdict(struct ncfsm__verifier *v, int peer, uint64_t hi, char *verdict); /* NULL: drop all */
/* Rank 0: ask every other rank to check the collectives up to seq hi against its rolling hash;
 * their verdicts on it as they came (verdicts[r]: 0 none yet; the string has nranks bytes);
 * tell them that some rank's differ there. */
void ncfsm__vchan_window_check(struct ncfsm__verifier *v, uint64_t hi, uint64_t hash);
void ncfsm__vchan_window_verdicts(struct ncfsm__verifier *v, uint64_t hi, char *verdicts);
void ncfsm__vchan_window_differ(struct ncfsm__verifier *v, uint64_t hi, int rank);
void ncfsm__vchan_retire(struct ncfsm__verifier *v); /* stopped: close the channel once nothing is left to post */
bool ncfsm__vchan_open_now(const struct ncfsm__verifier *v);
bool ncfsm__vchan_busy(const struct ncfsm__verifier *v);
void ncfsm__vchan_mark(struct ncfsm__verifier *v, bool work); /* exchanges or a state to poll, or none */
void ncfsm__vchan_wake(struct ncfsm__verifier *v);   /* an exchange finished, or a stall may be due */
void ncfsm__vchan_polled(struct ncfsm__verifier *v); /* the poll that wake asked for runs */
void ncfsm__vchan_waits(struct ncfsm__verifier *v, bool waits); /* exchanges out: the stall timer runs */
void ncfsm__vchan_failed(struct ncfsm__verifier *v, ncfsm_result_t cause, const char *what);
bool ncfsm__vchan_take(struct ncfsm__verifier *v, char *what, size_t len); /* true: a peer failed (what) */
/* Ask the other ranks how far they are without a state of its own (a companion's phase: its
 * AllGather or set-up is still polled meanwhile): seq as ncfsm__vchan_stalled's, what the
 * stall's text, bound_ns how long answers count as in time. False without notices. Once the
 * stall is named, ncfsm__vchan_culprits says who is behind and who did not answer. */
bool ncfsm__vchan_ask_aside(struct ncfsm__verifier *v, uint64_t seq, const char *what, uint64_t bound_ns);
void ncfsm__vchan_culprits(struct ncfsm__verifier *v, char *out, size_t len);
/* An exchange stalled: ask the other ranks (STALL_SUSPECTED), or STALLED at once without notices. */
void ncfsm__vchan_stalled(struct ncfsm__verifier *v, struct ncfsm_boot_req *req, uint64_t seq, const char *what);
void ncfsm__vchan_ask(struct ncfsm__verifier *v); /* action ask */
bool ncfsm__vchan_poll_ask(struct ncfsm__verifier *v, uint64_t now);

/* ---- verify_async.c ---- */
void ncfsm__vasync_launched(struct ncfsm__verifier *v);
bool ncfsm__vasync_poll(struct ncfsm__verifier *v, uint64_t now);
void ncfsm__vasync_free(struct ncfsm__verifier *v);
void ncfsm__vasync_post_detail(struct ncfsm__verifier *v);          /* action post_detail */
bool ncfsm__vasync_poll_detail(struct ncfsm__verifier *v, uint64_t now);
/* Rank 0's question about the collectives up to seq hi (its rolling hash there): this rank's
 * verdict, 's' the same, 'd' they differ (it then exchanges the window's fingerprints:
 * DETAILING), 'u' it cannot tell; rank 0 told that a rank's differ (the others detail too). */
char ncfsm__vasync_check(struct ncfsm__verifier *v, uint64_t hi, uint64_t hash);
void ncfsm__vasync_differ(struct ncfsm__verifier *v, uint64_t hi, int rank);

/* ---- verify_strict.c ---- */
void ncfsm__vstrict_queued(struct ncfsm__verifier *v, ncfsm_work *w);
void ncfsm__vstrict_forget(ncfsm_work *w);
bool ncfsm__vstrict_poll(struct ncfsm__verifier *v, uint64_t now); /* over the bootstrap */
void ncfsm__vstrict_free(struct ncfsm__verifier *v);
/* The exchange at the head of the queue to post (NULL: none), popped with
 * its round number taken; and the end of an exchange: every rank's
 * fingerprints are in: the work may launch, or MISMATCH fires. */
struct ncfsm__sreq *ncfsm__vstrict_take(struct ncfsm__verifier *v);
void ncfsm__vstrict_settle(struct ncfsm__verifier *v, struct ncfsm__sreq *q);
/* The buffers of an exchange: this rank's fingerprint, every rank's. */
size_t ncfsm__vstrict_msg_size(void);
void *ncfsm__vstrict_mine(struct ncfsm__sreq *q, size_t *len);
uint64_t ncfsm__vstrict_round(const struct ncfsm__sreq *q); /* its exchange number (the same on every rank) */
void *ncfsm__vstrict_all(struct ncfsm__sreq *q);
void ncfsm__vstrict_stall_text(struct ncfsm__verifier *v, const struct ncfsm__sreq *q, const char *channel, char *buf,
                               size_t len);
void ncfsm__sreq_free(struct ncfsm__sreq *q);
bool ncfsm__vstrict_pending(const struct ncfsm__verifier *v); /* exchanges to post or posted */
bool ncfsm__vstrict_may_post(const ncfsm_comm *c);           /* companion: nothing verified waits to launch */

/* ---- verify_companion.c ---- */
ncfsm_result_t ncfsm__vcomp_new(struct ncfsm__verifier *v);
void ncfsm__vcomp_share_id(struct ncfsm__verifier *v); /* action share_id */
void ncfsm__vcomp_join(struct ncfsm__verifier *v);     /* action join */
void ncfsm__vcomp_post(struct ncfsm__verifier *v);    /* action post */
void ncfsm__vcomp_record(struct ncfsm__verifier *v);  /* action record */
void ncfsm__vcomp_collect(struct ncfsm__verifier *v); /* action collect */
bool ncfsm__vcomp_poll(struct ncfsm__verifier *v, uint64_t now);
void ncfsm__vcomp_free(struct ncfsm__verifier *v);     /* the companion is aborted with the loop's next aborts */

#endif
