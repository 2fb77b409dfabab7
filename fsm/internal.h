/*
 * Engine internals: the loop, communicator, batch and work objects, and the
 * functions the engine's files share. Every function declared here runs
 * with loop->mu held unless its comment says otherwise.
 *
 *   table.c     the dense tables of fsm/comm.def; ncfsm__fire dispatches them
 *   guards.c    the table's guards (guard_<name>)
 *   actions.c   the table's actions (act_<name>)
 *   works.c     work and comm references, final states, callbacks' queue
 *   launcher.c  per-comm launch queues, launches, inits, finalizes, aborts
 *   ranges.c    buffer ranges: R12 overlap checks
 *   progress.c  polls of the async state and of completion events
 *   watchdog.c  deadlines, the error policy (ncfsm__comm_fail), recorder dumps
 *   recorder.c  the flight recorder ring and its dump formats (recorder.h)
 *   verify.c    async cross-rank verification (NCFSM_VERIFY=async)
 *   loop.c      the libevent glue; api.c the public calls
 */
#ifndef NCFSM_FSM_INTERNAL_H
#define NCFSM_FSM_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/log.h"
#include "fsm/recorder.h"
#include "ncfsm.h"

#define NCFSM__LOOP_MAGIC 0x4c4f4f50u /* 'LOOP' */
#define NCFSM__COMM_MAGIC 0x434f4d4du /* 'COMM' */
#define NCFSM__WORK_MAGIC 0x574f524bu /* 'WORK' */
#define NCFSM__DEAD_MAGIC 0xdeaddeadu

/* Freed works wait in a FIFO this long before their memory is reused, so a
 * stale handle (a second release) is still recognised as dead. */
#define NCFSM__WORK_QUARANTINE 64

typedef struct ncfsm__mark ncfsm__mark;
typedef struct ncfsm__batch ncfsm__batch;
typedef struct ncfsm__blink ncfsm__blink;
typedef struct ncfsm__spanset ncfsm__spanset;

/* A completion event shared by the works of one launch on one stream. */
struct ncfsm__mark {
  void *event;
  int refs;
  int ready_at_final; /* timing: queried once right after the launch became final */
  ncfsm__mark *next_free;
};

/* A batch's place in one comm's launch queue. */
struct ncfsm__blink {
  ncfsm__batch *b;
  ncfsm_comm *c;
  ncfsm__blink *next;
};

/* A unit of launch: one ungrouped op, or all ops of one user group (which
 * may span communicators). A batch sits in the launch queue of each comm it
 * touches and launches when it heads all of them (per-comm FIFO order). It
 * is never split; batches over the same set of comms may share one backend
 * group (coalescing), batches over different comms never do (R13). */
struct ncfsm__batch {
  ncfsm_work *head, *tail; /* linked through ncfsm_work.bnext */
  int nworks;
  bool explicit_group;     /* allocated by ncfsm_group_end; else embedded in its work */
  uint64_t order;          /* submission order across the loop's comms */
  int nlinks;              /* entries of links */
  int nlive;               /* links still queued (c != NULL) */
  ncfsm__blink *links;     /* one per comm; &single_link for an ungrouped op */
};

/* A buffer range an op touches on its rank (R12 checks). */
typedef struct ncfsm__span {
  uintptr_t lo, hi;
  bool write;
} ncfsm__span;

struct ncfsm_work {
  uint32_t magic;
  int refs;        /* the user's (while user_held) + the engine's until delivered */
  bool user_held;  /* the caller asked for the handle and has not released it */
  ncfsm_comm *comm;
  ncfsm__op op;
  ncfsm_fingerprint_t fp;
  ncfsm__span span[2]; /* computed at submit */
  int nspan;
  ncfsm_work_state_t state;
  ncfsm_result_t status;
  int backend_code;
  ncfsm_work_cb cb;
  void *arg;
  ncfsm__batch *batch;      /* while QUEUED in a launch queue */
  ncfsm__batch single;      /* storage for the batch of an ungrouped op */
  ncfsm__blink single_link;
  ncfsm__mark *mark;        /* completion event, once IN_FLIGHT */
  ncfsm__mark *start_mark;  /* timing: event recorded just before the launch */
  float device_ms;
  uint64_t timeout_ms;      /* ncfsm_work_set_timeout; 0: the comm's */
  ncfsm__rec_ref rec;       /* its flight recorder entry */
  uint64_t group;           /* launch id (0: not launched) */
  uint64_t t_submit, t_launch, t_final, t_complete, deadline_ns;
  ncfsm_work *bnext;     /* batch / group list */
  ncfsm_work *next;      /* launching list, stream queue, notify list, free list */
  struct ncfsm__sreq *sreq; /* strict verification: its exchange (NULL: none or done) */
  bool verified;  /* strict: every rank's fingerprint matched; it may launch */
  bool notified;  /* final state reached, callback queued */
  bool delivered; /* callback has run */
};

typedef struct ncfsm__squeue {
  void *stream;
  ncfsm_work *head, *tail;
  /* push completion: works appended so far, and that count when the last
   * host function was put on the stream (it follows all of them) */
  uint64_t appended, notified;
} ncfsm__squeue;

struct ncfsm_comm {
  uint32_t magic;
  ncfsm_loop *loop;
  ncfsm_comm *next; /* loop's list */
  int refs;         /* 1 for the user handle + 1 per live work + engine holds */
  bool released;
  ncfsm_state_t state;
  ncfsm_comm_opts opts;
  ncfsm_sim_opts sim;
  char name[64];
  char dump_dir[256];
  ncfsm__recorder *rec;  /* flight recorder (NULL: off) */
  uint64_t comm_id;      /* XXH3_64 of the unique id: the same on every rank */
  const ncfsm__backend *be;
  void *bcomm;
  int rank, nranks;
  ncfsm_unique_id uid;
  struct ncfsm_boot *boot;        /* ncfsm_comm_init_boot: the exchange is posted by the loop */
  struct ncfsm_boot_req *uid_req; /* unique id exchange in flight */
  struct ncfsm_boot *vboot;       /* async verification's channel (NCFSM_VERIFY_ASYNC) */
  struct ncfsm__vreq *vq_head, *vq_tail; /* its exchanges in flight, oldest first */
  struct ncfsm__sreq *sp_head, *sp_tail; /* strict: exchanges to post, in queue order */
  struct ncfsm__sreq *sf_head, *sf_tail; /* strict: exchanges posted, oldest first */
  uint64_t sround;    /* strict: exchanges posted so far (the same count on every rank) */
  bool snomem;        /* strict: an exchange could not be allocated; the comm fails */
  struct ncfsm__comp *comp; /* strict over a companion NCCL comm (opts.verify_channel NCCL) */
  ncfsm_work *mismatched; /* strict: the work whose fingerprints differ (act_fail_mismatched) */
  char *uid_buf;                  /* nroots * NCFSM_UNIQUE_ID_BYTES: the roots' ids, broadcast */
  int nroots;                     /* ncfsm_comm_init_boot: roots of the unique ids (1: rank 0) */
  int async_code;     /* backend code of the failure that moved it to ERROR */
  ncfsm_result_t cause;
  ncfsm_event_t fail_ev; /* ASYNC_ERROR or TIMEOUT while act_fail_pending runs */
  int ngroup;         /* works of this comm in the loop's open group (guards GROUP_OPS...) */
  ncfsm__blink *bq_head, *bq_tail; /* launch queue */
  ncfsm_work *launching, *launching_tail; /* handed to NCCL, launch not final yet */
  ncfsm__squeue *sq;  /* in-flight works per stream */
  int nsq, capsq;
  ncfsm__mark *free_marks;
  void *stream;       /* the comm's own stream (NULL stream argument) */
  uint64_t coll_seq;       /* the next collective's seq (taken at launch, R11) */
  uint64_t *p2p_send_seq;  /* per peer: the next SEND to it */
  uint64_t *p2p_recv_seq;  /* per peer: the next RECV from it */
  uint64_t hash;
  uint64_t phase_deadline;
  uint64_t async_watch_ns; /* last async-state poll while works were in flight */
  bool work_deadlines; /* some work has its own deadline: the watchdog scans every work in flight */
  uint64_t be_calls;   /* backend calls made for this comm (not polls/events): tests */
  char last_error[512];
  char failure[512];   /* the message of the failure that ended its healthy life */
  /* split, shrink, grow (fsm/split.c) */
  ncfsm_comm *split_child;  /* parent: the child its issued call makes (held: refs) */
  ncfsm_comm *split_parent; /* child: the parent whose call writes its handle */
  void *split_bcomm;        /* child: where the backend writes its handle (R8) */
  uint64_t nsplits;         /* parent: calls issued (child comm ids derive from it) */
  bool was_revoked;         /* guard WAS_REVOKED: a shrink of a revoked comm */
  bool ready_once;          /* its init completed (a recovery may shrink it) */
  bool failing;             /* ncfsm__comm_fail is observing completions first (no re-entry) */
  bool grow_id_made;        /* ncfsm_comm_grow_id ran here: this rank passes the id to NCCL */
  struct ncfsm__recovery *recovery; /* fsm/recover.c: armed or running (NULL: none) */
  uint64_t state_since_ns; /* when it entered its current state */
  uint64_t works_final[NCFSM_WORK_STATE_COUNT]; /* its works that reached each final state */
  uint64_t created_ns;
};

/* Counters for introspection (fsm/introspect.c), kept under the loop lock.
 * Latency: submit to a final state, per op kind, in buckets of powers of two
 * microseconds: bucket i counts latencies <= 2^i us (the last one: the rest). */
#define NCFSM__LAT_BUCKETS 28
typedef struct ncfsm__stats {
  uint64_t trans[NCFSM_STATE_COUNT][NCFSM_STATE_COUNT];   /* transitions per (from, to) */
  uint64_t reject[NCFSM_STATE_COUNT][NCFSM_CALL_COUNT];   /* calls refused per (state, call) */
  uint64_t lat_bucket[NCFSM_OPKIND_COUNT][NCFSM__LAT_BUCKETS];
  uint64_t lat_count[NCFSM_OPKIND_COUNT];
  uint64_t lat_sum_ns[NCFSM_OPKIND_COUNT];
  uint64_t works_final[NCFSM_WORK_STATE_COUNT];           /* works that reached each final state */
} ncfsm__stats;

/* Push completion (ncfsm_loop_opts.completion PUSH): what a stream's host
 * function reaches, on a thread of the runtime. It outlives the loop while
 * host functions are pending (the loop's close detaches it first). */
typedef struct ncfsm__notifier {
  pthread_mutex_t mu;
  int refs;                /* the loop's, and one per pending host function */
  ncfsm_loop *loop;        /* NULL once the loop closed */
  _Atomic uint64_t posted; /* host functions enqueued */
  _Atomic uint64_t wakes;  /* ... that woke the loop */
} ncfsm__notifier;
/* Enqueue a host function on stream that wakes loop (false: not possible; polls cover it). */
bool ncfsm__push_notify(ncfsm_loop *loop, const ncfsm__backend *be, void *stream);

typedef struct ncfsm__call_req {
  void (*fn)(void *);
  void *arg;
  struct ncfsm__call_req *next;
} ncfsm__call_req;

struct ncfsm_loop {
  uint32_t magic;
  uint64_t id;           /* unique in the process: the per-thread last error names it */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct event_base *base;
  bool own_base;
  struct event *ev_wake; /* cross-thread wakeup, launches, notifications */
  struct event *ev_poll; /* progress timer */
  bool poll_armed;
  bool push_armed;       /* the armed poll is push completion's slow fallback timer */
  bool kick;             /* something needs a turn (launch, init, abort, finalize) */
  bool poll_now;         /* an immediate re-poll is due (own base: turned directly) */
  unsigned poll_iter;
  unsigned backoff;        /* timed polls since the burst ended */
  uint64_t burst_start_ns; /* last progress: the immediate-poll burst runs from here */
  ncfsm_loop_opts opts;
  pthread_t runner;      /* thread inside the loop (valid when running) */
  int running;
  int claimed;           /* ncfsm__loop_claim: a blocking backend call outside a turn */
  pthread_t thread;      /* ncfsm_loop_start_thread */
  bool thread_started, thread_stop;
  ncfsm_comm *comms;
  int ncomms;
  ncfsm__stats stats;    /* introspection counters */
  struct ncfsm__recovery *recoveries; /* fsm/recover.c */
  ncfsm__notifier *notifier;          /* push completion (NULL: poll) */
  int nqueued;           /* batches in launch queues (all comms) */
  uint64_t batch_order;  /* the last batch's order */
  uint64_t launch_id;    /* the last launch's id (flight recorder "group") */
  struct event *ev_signal; /* SIGUSR1: dump (opts.dump_on_signal) */
  bool ctl;              /* control work may be due: aborts, inits, finalizes */
  _Atomic int async_kick; /* set without the lock (bootstrap callbacks): the next turn looks at ctl */
  /* group (R3) */
  int group_depth;
  pthread_t group_owner;
  ncfsm_result_t group_err;
  ncfsm_work *group_head, *group_tail;
  /* callbacks to deliver on the loop thread */
  ncfsm_work *notify_head, *notify_tail;
  struct ncfsm__state_note *snote_head, *snote_tail;
  ncfsm__call_req *calls_head, *calls_tail;
  ncfsm_trace_fn trace;
  void *trace_arg;
  ncfsm_work *free_head, *free_tail; /* FIFO; reused once longer than the quarantine */
  int nfree;
  ncfsm__spanset *spans; /* the launcher's R12 check */
};

struct ncfsm__state_note {
  ncfsm_comm *comm;
  ncfsm_state_t from, to;
  ncfsm_event_t ev;
  struct ncfsm__state_note *next;
};

/* now + ms as a deadline in ns; 0 (none) when ms is 0 or would overflow. */
static inline uint64_t ncfsm__deadline(uint64_t now_ns, uint64_t ms) {
  if (!ms || ms > (UINT64_MAX - now_ns) / 1000000ull) return 0;
  return now_ns + ms * 1000000ull;
}

/* The table's state flags (fsm/table.c), read inline on the hot paths; a
 * comm's state is always a valid index. */
extern const unsigned ncfsm__state_flag_tab[NCFSM_STATE_COUNT];
static inline unsigned ncfsm__sflags(ncfsm_state_t s) { return ncfsm__state_flag_tab[s]; }

static inline bool ncfsm__has(const ncfsm_comm *c, unsigned flag) {
  return (ncfsm__sflags(c->state) & flag) != 0;
}

#define NCFSM__IS_ERR(rc) ((rc) != NCFSM__NCCL_SUCCESS && (rc) != NCFSM__NCCL_IN_PROGRESS)

/* For tests: backend calls (init, op, finalize, destroy, abort, revoke) made for c. */
uint64_t ncfsm__comm_backend_calls(ncfsm_comm *c);

/* ---- table.c ---- */
const char *ncfsm__call_fn(ncfsm_call_t c);
/* Fire event ev on c: the first row of (state, ev) whose guard holds gives
 * the next state and the action. No such row: an engine defect (assert in
 * debug builds; INVALID, i.e. ERROR with a message, in release builds). */
void ncfsm__fire(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_result_t result);
/* Would ev have a row whose guard holds? */
bool ncfsm__can_fire(const ncfsm_comm *c, ncfsm_event_t ev);
/* Legality of call on c now, guards included; on REJECT sets the comm's last
 * error (state, call, rule, what to do) and *why to the result to return. */
ncfsm_decision_t ncfsm__check_legal(ncfsm_comm *c, ncfsm_call_t call, ncfsm_result_t *why);
/* R3: a failed call inside the caller's open group is returned again by the
 * outermost group end. */
void ncfsm__group_note_error(ncfsm_comm *c, ncfsm_result_t r);

/* ---- guards.c ---- */
bool ncfsm__guard(const ncfsm_comm *c, ncfsm_guard_t g);

/* ---- actions.c ---- */
void ncfsm__act(ncfsm_comm *c, ncfsm_action_t a, ncfsm_event_t ev, ncfsm_state_t from);

/* ---- works.c ---- */
void ncfsm__set_error(ncfsm_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ncfsm__work_finish(ncfsm_work *w, ncfsm_work_state_t st, ncfsm_result_t status);
void ncfsm__work_set_state(ncfsm_work *w, ncfsm_work_state_t st);
void ncfsm__work_unref(ncfsm_work *w);
ncfsm_work *ncfsm__work_alloc(ncfsm_loop *loop);
void ncfsm__comm_unref(ncfsm_comm *c);
void ncfsm__comm_free_all(ncfsm_loop *loop); /* loop close: the quarantine */
/* Fail every unfinished work of c with (st, status): open group, queued,
 * launching and in flight. */
void ncfsm__fail_all(ncfsm_comm *c, ncfsm_work_state_t st, ncfsm_result_t status);
/* Fail c's works in the open group and its launch queue. */
void ncfsm__drop_queued(ncfsm_comm *c, ncfsm_work_state_t st, ncfsm_result_t status);
/* Does an unfinished work of this loop name stream? */
bool ncfsm__stream_in_use(ncfsm_loop *loop, void *stream);
ncfsm__mark *ncfsm__mark_get(ncfsm_comm *c);
void ncfsm__mark_put(ncfsm_comm *c, ncfsm__mark *m);

/* ---- launcher.c ---- */
/* Queue batch b (its works and links filled) in each of its comms' queues. */
void ncfsm__batch_queue(ncfsm_loop *loop, ncfsm__batch *b);
/* Launch what can go now, issue inits, finalizes and queued aborts; true
 * when something was launched. May drop and retake the lock (aborts). */
bool ncfsm__launch(ncfsm_loop *loop);
/* The launch of c became final: completion events (act_record_events). */
void ncfsm__launch_final(ncfsm_comm *c);
/* Abort c now (its state allows ABORT): drops and retakes the lock around
 * ncclCommAbort. The caller owns the loop (runner). */
void ncfsm__comm_abort_now(ncfsm_comm *c);

/* ---- ranges.c ---- */
ncfsm__spanset *ncfsm__spanset_new(unsigned max_ops);
void ncfsm__spanset_free(ncfsm__spanset *ss);
void ncfsm__spanset_reset(ncfsm__spanset *ss);
/* Would batch b overlap (R12) what this launch already took? If not, its
 * ranges are taken. */
bool ncfsm__spanset_take(ncfsm__spanset *ss, const ncfsm__batch *b);
void ncfsm__work_spans(ncfsm_work *w); /* fills w->span from w->op */
/* R12: the first pair of works in list (linked through bnext) on one comm
 * whose buffers overlap where one writes; false when none. */
bool ncfsm__find_overlap(ncfsm_work *list, ncfsm_work **x, ncfsm_work **y);

/* ---- dumps (watchdog.c) ---- */
/* Snapshot c's recorder and queue a dump into dir (NULL: c's dump_dir;
 * nothing without one) for reason. */
ncfsm_result_t ncfsm__comm_dump(ncfsm_comm *c, const char *dir, const char *reason);
/* The recorder entry of w after a change of w. */
void ncfsm__rec_work(ncfsm_work *w);

/* ---- verify.c ---- */
/* c launched collective seq c->coll_seq - 1: post the window's exchange when
 * it ends one (never fails the comm here: a failed post is reported by
 * ncfsm__verify_poll). */
void ncfsm__verify_launched(ncfsm_comm *c);
/* Test c's exchanges in order; a divergence, a stall or a bootstrap error
 * fails c. True when something finished. */
bool ncfsm__verify_poll(ncfsm_comm *c, uint64_t now);
void ncfsm__verify_free(ncfsm_comm *c);
/* Strict verification (opts.verify STRICT). w, a collective of c, was
 * queued: its exchange is posted in queue order at the next turn. */
void ncfsm__strict_queued(ncfsm_comm *c, ncfsm_work *w);
/* Post what is due, test what is posted (in order); a match lets the work
 * launch, a difference fires MISMATCH. True when something finished. */
bool ncfsm__strict_poll(ncfsm_comm *c, uint64_t now);
/* w leaves the engine unverified (failed, aborted): its exchange still runs,
 * so that every rank posts the same ones, but no longer points at it. */
void ncfsm__strict_forget(ncfsm_work *w);
/* act_fail_mismatched: fail c->mismatched's whole batch with MISMATCH. */
void ncfsm__strict_fail_batch(ncfsm_comm *c);
/* Strict over a companion NCCL comm: c->comp, set up by strict polls once c
 * is READY (its unique id broadcast through c's bootstrap). */
ncfsm_result_t ncfsm__comp_new(ncfsm_comm *c);
/* The companion needs polls (setting up, or an exchange in flight). */
bool ncfsm__comp_busy(const ncfsm_comm *c);

/* ---- split.c ---- */
/* The parent's call is final (its async state is back): fire SPLIT_DONE. */
void ncfsm__split_final(ncfsm_comm *parent);
/* act_hand_children: give the child its handle. */
void ncfsm__split_hand(ncfsm_comm *parent);
/* INIT_DONE of a split child: ask the backend for its rank and size (false:
 * the child failed). */
bool ncfsm__split_geometry(ncfsm_comm *c);
/* The parent failed or was aborted before its call was final: the child
 * fails with the reason. */
void ncfsm__split_orphan(ncfsm_comm *parent, const char *why);

/* ---- recover.c ---- */
/* With the lock: an armed comm failed; its recovery starts (once). */
void ncfsm__recover_start(ncfsm_comm *c, const char *why);
void ncfsm__recover_free_all(ncfsm_loop *loop);
void ncfsm__recover_cancel_all(ncfsm_loop *loop);
void ncfsm__recover_detach(ncfsm_comm *c);

/* ---- progress.c ---- */
/* Polls, events, exchanges and the watchdog of every comm; true on progress
 * (a state change, a completion). The caller arms the next poll. */
bool ncfsm__progress(ncfsm_loop *loop);
/* Observe c's completion events now; true when some work completed. */
bool ncfsm__drain(ncfsm_comm *c);

/* ---- watchdog.c ---- */
void ncfsm__watchdog(ncfsm_comm *c, uint64_t now);
/* The comm failed (ev: ASYNC_ERROR or TIMEOUT): ERROR, every unfinished work
 * fails with cause, the error policy runs. Where the state has no such row
 * (already failed or closing) only the message is kept. */
void ncfsm__comm_fail(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_result_t cause, int code,
                      const char *what);
/* ncclCommRevoke now (ERROR or a live state): observe completions first,
 * revoke, fire REVOKE. NCFSM_ERR_UNSUPPORTED without Revoke in the runtime;
 * the comm's last error says why when it fails. */
ncfsm_result_t ncfsm__comm_revoke_now(ncfsm_comm *c);
/* The cause for a backend code, the same whichever call saw it. */
ncfsm_result_t ncfsm__cause_of(int code);

/* ---- loop.c ---- */
bool ncfsm__loop_can_drive(ncfsm_loop *loop); /* caller may make backend calls now */
bool ncfsm__loop_in_turn(const ncfsm_loop *loop); /* this thread is inside a turn or callback of loop */
/* Own the loop for a blocking backend call made outside a turn (destroy,
 * abort); another thread's ncfsm_loop_run waits meanwhile. */
void ncfsm__loop_claim(ncfsm_loop *loop);
void ncfsm__loop_unclaim(ncfsm_loop *loop);
void ncfsm__loop_wake(ncfsm_loop *loop);
/* Without the lock, from any thread: the next turn looks for control work. */
void ncfsm__loop_kick_async(ncfsm_loop *loop);
void ncfsm__loop_arm_poll(ncfsm_loop *loop, bool progress);
bool ncfsm__loop_pending(ncfsm_loop *loop);      /* anything at all to do */
bool ncfsm__loop_poll_pending(ncfsm_loop *loop); /* something the poll timer watches */
void ncfsm__loop_flush_notes(ncfsm_loop *loop); /* drops and retakes the lock */
/* The calling thread's last error for loop-level calls on loop. */
void ncfsm__loop_error(ncfsm_loop *loop, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
