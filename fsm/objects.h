/*
 * Layer 1 of the engine (docs/design.md "Layers"): the loop, communicator,
 * batch and work objects, and what every layer above does with them without
 * deciding anything: works and their machine (works.c), launch queues and
 * failing a comm's works (queue.c), completion marks (marks.c), errors
 * (errors.c), R12 ranges (ranges.c), recorder dumps (dumps.c), wakeups and
 * loop ownership (sched.c). Every function here runs with loop->mu held
 * unless its comment says otherwise.
 *
 * Layers above plug into these objects through named hooks (struct
 * ncfsm__verify_ops, ncfsm__recovery_ops, ncfsm__loop_ops): a lower layer
 * never calls a function of a higher one by name (tests/layers checks it).
 */
#ifndef NCFSM_FSM_OBJECTS_H
#define NCFSM_FSM_OBJECTS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "core/log.h"
#include "fsm/coalesce.h"
#include "fsm/recorder.h"
#include "fsm/tables.h"
#include "ncfsm.h"

#define NCFSM__LOOP_MAGIC 0x4c4f4f50u /* 'LOOP' */
#define NCFSM__COMM_MAGIC 0x434f4d4du /* 'COMM' */
#define NCFSM__WORK_MAGIC 0x574f524bu /* 'WORK' */
#define NCFSM__DEAD_MAGIC 0xdeaddeadu

/* Freed works wait in a FIFO this long before their memory is reused, so a
 * stale handle (a second release) is still recognised as dead. */
#define NCFSM__WORK_QUARANTINE 64

/* Zeroed memory on a cache line boundary (freed with free): a comm and a loop, whose first
 * lines other threads read while the loop's thread writes the rest (both types are
 * aligned to 64: nothing else may allocate them). */
static inline void *ncfsm__calloc_line(size_t size) {
  size_t n = (size + 63) & ~(size_t)63;
  void *p = aligned_alloc(64, n);
  if (p) memset(p, 0, n);
  return p;
}

/* The pools (fsm/works.c, fsm/marks.c): freed works and completion marks
 * are kept for reuse while the loop is busy; once no work was allocated for
 * NCFSM__POOL_IDLE_MS, the works beyond NCFSM__POOL_KEEP and each comm's
 * marks beyond NCFSM__MARK_KEEP go back to the allocator. */
#define NCFSM__POOL_IDLE_MS 250
#define NCFSM__POOL_KEEP 256
#define NCFSM__MARK_KEEP 8

/* What the pools hold and gave back (under the loop lock; /metrics). */
typedef struct ncfsm__pool_stats {
  uint64_t allocs;         /* works allocated (from the pool or the allocator) */
  uint64_t works_returned; /* works given back to the allocator by a trim */
  uint64_t marks_returned; /* marks (their events destroyed) given back by a trim */
  uint64_t trims;          /* trims that gave something back */
  int marks_free;          /* marks on the comms' free lists */
} ncfsm__pool_stats;

typedef struct ncfsm__mark ncfsm__mark;
typedef struct ncfsm__batch ncfsm__batch;
typedef struct ncfsm__blink ncfsm__blink;
typedef struct ncfsm__spanset ncfsm__spanset;
struct ncfsm__verifier;
struct ncfsm__recovery;
struct ncfsm_boot;
struct ncfsm_boot_req;

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
  bool explicit_group;     /* made by ncfsm_group_end (never coalesced with other batches) */
  bool allocated;          /* ... and allocated (freed when it leaves the queues); else embedded in its
                              first work (an ungrouped op, a group of one op) */
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
  unsigned state;   /* ncfsm_work_state_t: fsm/work.def */
  int refs;         /* the user's (user_refs) + the engine's until the callback ran */
  int user_refs;    /* 1 while the caller holds the handle it asked for, 0 after its release */
  ncfsm_comm *comm;
  ncfsm__op op;
  ncfsm_fingerprint_t fp;
  ncfsm__span span[2]; /* computed at the first R12 check that needs them (fsm/ranges.c) */
  int nspan;           /* -1 until then: a batch launched alone needs none */
  ncfsm_result_t status;
  ncfsm_work_cb cb;
  void *arg;
  ncfsm__batch *batch;      /* while in a launch queue */
  ncfsm__batch single;      /* storage for the batch of an ungrouped op */
  ncfsm__blink single_link;
  ncfsm__mark *mark;        /* completion event, once IN_FLIGHT */
  ncfsm__mark *start_mark;  /* timing: event recorded just before the launch */
  float device_ms;
  uint64_t timeout_ms;      /* ncfsm_work_set_timeout; 0: the comm's */
  ncfsm__rec_ref rec;       /* its flight recorder entry */
  uint64_t group;           /* launch id (0: not launched) */
  uint64_t t_submit, t_launch, t_final, t_complete, deadline_ns;
  void *vreq;               /* the verification's exchange of this work (strict), NULL when none */
  unsigned char call;       /* ncfsm_call_t of its submission (a hand-off's check at its take) */
  ncfsm_work *bnext;        /* batch / group list */
  ncfsm_work *next;         /* launching list, stream queue, notify list, free list */
};

/* Every line of w, fetched for writing (a work handed between the threads of a hand-off;
 * from malloc it need not start on a line). */
static inline void ncfsm__prefetch_work(const ncfsm_work *w) {
  const char *end = (const char *)(w + 1);
  for (const char *p = (const char *)((uintptr_t)w & ~(uintptr_t)63); p < end; p += 64) __builtin_prefetch(p, 1, 3);
}

typedef struct ncfsm__squeue {
  void *stream;
  ncfsm_work *head, *tail;
  /* push completion: works appended so far, and that count when the last
   * host function was put on the stream (it follows all of them) */
  uint64_t appended, notified;
} ncfsm__squeue;

/* Verification (layer 5: fsm/verify*.c) plugs into a comm's launch path. */
typedef struct ncfsm__verify_ops {
  /* w, a collective of c, joined c's launch queue (fires VERIFY on w to hold it) */
  void (*queued)(ncfsm_comm *c, ncfsm_work *w);
  /* w, a collective of c, took its seq at a launch */
  void (*launched)(ncfsm_comm *c, ncfsm_work *w);
  /* w leaves the engine (final) while its exchange runs */
  void (*forget)(ncfsm_comm *c, ncfsm_work *w);
  /* exchanges of c need a turn; poll one turn's worth (true: progress) */
  bool (*busy)(const ncfsm_comm *c);
  bool (*poll)(ncfsm_comm *c, uint64_t now);
  /* c is freed */
  void (*free)(ncfsm_comm *c);
  /* c failed (its cause and message): the verification tells the other ranks */
  void (*failed)(ncfsm_comm *c, ncfsm_result_t cause, const char *what);
  /* every collective of c below this seq is known equal on every rank; the
   * verifier's state name (its status) */
  uint64_t (*verified)(const ncfsm_comm *c);
  const char *(*state_name)(const ncfsm_comm *c);
  /* the watchdog found a launch of c older than c->verify_stall_ns */
  void (*stall_due)(ncfsm_comm *c);
  /* c's NCCL communicator is gone (CLOSED; on the loop thread): the channel closes */
  void (*ended)(ncfsm_comm *c);
} ncfsm__verify_ops;

/* Layer 5 plugs in what the calls of layer 4 attach to a comm (set once, at
 * load time, by fsm/verify.c). */
typedef struct ncfsm__protocols {
  /* verification of c: over boot, or (NULL) in memory with its ranks in this process */
  ncfsm_result_t (*attach_verify)(ncfsm_comm *c, struct ncfsm_boot *boot);
  /* at a split (exclude NULL) or shrink of p (child NULL: a rank of no color): the child's verification */
  void (*attach_child)(ncfsm_comm *p, ncfsm_comm *child, int color, int key, const int *exclude, int nexclude);
} ncfsm__protocols_t;
extern ncfsm__protocols_t ncfsm__protocols;

/* Recovery (layer 5: fsm/recover.c) plugs into a comm's error policy. */
typedef struct ncfsm__recovery_ops {
  bool (*armed)(const ncfsm_comm *c);            /* guard POLICY_RECOVER */
  void (*start)(ncfsm_comm *c, const char *why); /* action start_recovery */
  void (*stepped)(ncfsm_comm *c);                /* c changed state (the recovery may wait for it) */
  void (*detach)(ncfsm_comm *c);                 /* c is freed */
  ncfsm_result_t (*disarm)(ncfsm_comm *c);       /* ncfsm_comm_close, without the lock: refused while one runs */
  bool (*owned)(const ncfsm_comm *c);            /* c is a recovery's new comm in the making: no user holds it */
} ncfsm__recovery_ops;

struct ncfsm_comm {
  /* What other threads' submissions read without the lock (fsm/api_ops.c: the hand-off),
   * written at its creation or when it enters or leaves READY: lines of their own (the comm
   * is allocated on a line boundary: ncfsm__calloc_line), so that the loop's thread, which
   * writes the comm's other fields at every op, does not take them from the submitter's
   * core each time. */
  uint32_t magic;
  /* READY, published once the step into it (and its action: a split child's size and rank)
   * is done: what a submission's hand-off reads without the lock (fsm/submit.h) */
  _Atomic bool ready_pub;
  int rank, nranks;      /* nranks 0: a split child's, until its INIT_DONE */
  ncfsm_loop *loop;
  const ncfsm__backend *be;
  void *stream;       /* the comm's own stream (NULL stream argument) */
  ncfsm_comm_opts opts;
  _Alignas(64) unsigned state; /* ncfsm_state_t: fsm/comm.def; the loop's from here on */
  ncfsm_comm *next; /* loop's list */
  int refs;         /* 1 for the user handle (until RELEASED) + 1 per live work + engine holds */
  ncfsm_sim_opts sim;
  char name[64];
  char dump_dir[256];
  ncfsm__recorder *rec;  /* flight recorder (NULL: off) */
  uint64_t comm_id;      /* XXH3_64 of the unique id: the same on every rank */
  void *bcomm;
  ncfsm_unique_id uid;
  struct ncfsm_boot *boot;          /* ncfsm_comm_init_boot: the unique id comes through it */
  struct ncfsm_boot_req *uid_req;   /* ID_EXCHANGE: the broadcast in flight */
  char *uid_buf;                    /* nroots * NCFSM_UNIQUE_ID_BYTES: the roots' ids, broadcast */
  int nroots;                       /* ncfsm_comm_init_boot: roots of the unique ids (1: rank 0) */
  const ncfsm__verify_ops *vops;    /* verification of this comm (NULL: off) */
  struct ncfsm__verifier *ver;
  const ncfsm__recovery_ops *rops;  /* recovery of this comm (NULL: not armed) */
  struct ncfsm__recovery *recovery;
  int async_code;     /* backend code of the failure that ended its healthy life */
  ncfsm_result_t cause;
  int ngroup;         /* works of this comm in the loop's open group (guards GROUP_OPS...) */
  ncfsm__blink *bq_head, *bq_tail; /* launch queue */
  ncfsm_work *launching, *launching_tail; /* handed to NCCL, launch not final yet */
  ncfsm__squeue *sq;  /* in-flight works per stream */
  int nsq, capsq;
  int ninflight;             /* works in the stream queues sq (IN_FLIGHT): ncfsm__comm_inflight */
  ncfsm__mark *free_marks;
  int nfree_marks;
  uint64_t coll_seq;       /* the next collective's seq (taken at launch, R11) */
  uint64_t *p2p_send_seq;  /* per peer: the next SEND to it */
  uint64_t *p2p_recv_seq;  /* per peer: the next RECV from it */
  uint64_t hash;
  uint64_t phase_deadline;
  uint64_t async_watch_ns; /* last async-state poll while works were in flight */
  bool work_deadlines;     /* some work has its own deadline: the watchdog scans every work in flight */
  uint64_t be_calls;       /* backend calls made for this comm (not polls/events): tests */
  char last_error[512];
  char failure[512];       /* the message of the failure that ended its healthy life */
  /* split, shrink, grow (fsm/children.c) */
  ncfsm_comm *split_child;  /* parent: the child its issued call makes (held: refs) */
  ncfsm_comm *split_parent; /* child: the parent whose call writes its handle */
  void *split_bcomm;        /* child: where the backend writes its handle (R8) */
  uint64_t nsplits;         /* parent: calls issued (child comm ids derive from it) */
  ncfsm_unique_id grow_id;  /* ncfsm_comm_grow_id made this id here (all zero: none) */
  uint64_t state_since_ns;  /* when it entered its current state */
  uint64_t works_final[NCFSM_WORK_STATE_COUNT]; /* its works that reached each final state */
  uint64_t created_ns;
  struct ncfsm__close *close; /* ncfsm_comm_close accepted (guard NOT_CLOSING); freed after its callback */
  uint64_t verify_stall_ns;   /* in-process verification: the watchdog tells it of launches older than this */
  const _Atomic unsigned *verify_att; /* verification: nonzero when it must be polled (NULL: vops->busy) */
  bool verify_waits;                  /* verification has exchanges out: their callbacks will come (a wait waits) */
  bool fail_own;                      /* the failure being made is this rank's own choice that every rank makes
                                         (ncfsm_comm_recover): verification does not pass it to the others */
  uint64_t verify_checked_ns;         /* ... the watchdog's last look for a launch past verify_stall_ns */
  /* the loop's hot-path indexes (fsm/active.c) */
  ncfsm_comm *act_next, *act_prev; /* the active list */
  bool on_act;
  ncfsm_comm *att_next;    /* the loop's attention stack (pushed from other threads) */
  _Atomic bool att_queued; /* ... c is on it */
  uint64_t seqno;                  /* its place in loop->comms: the newer, the larger (the list's order) */
  int qh_pos;                      /* 1 + its place in the launch heap; 0: its launch queue is empty */
  ncfsm_comm *peer_next;           /* the ring of the comms of this loop with its unique id */
  int npeers;                      /* ... their number (itself included) */
};
/* Other threads' reads stay on their lines (docs/design.md "Submissions from other threads"). */
#define NCFSM__XT_BEFORE(type, field, first) \
  _Static_assert(offsetof(type, field) < offsetof(type, first), #field " is read by other threads: keep it before " #first)
NCFSM__XT_BEFORE(struct ncfsm_comm, ready_pub, state);
NCFSM__XT_BEFORE(struct ncfsm_comm, nranks, state);
NCFSM__XT_BEFORE(struct ncfsm_comm, loop, state);
NCFSM__XT_BEFORE(struct ncfsm_comm, stream, state);
NCFSM__XT_BEFORE(struct ncfsm_comm, opts, state);


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

typedef struct ncfsm__call_req {
  void (*fn)(void *);
  void *arg;
  struct ncfsm__call_req *next;
} ncfsm__call_req;

/* A close in progress (ncfsm_comm_close): the loop runs the close column's
 * step of each state the comm enters; the callback runs once it is released. */
typedef struct ncfsm__close {
  ncfsm__call_req req; /* first: the loop's call queue frees it after the callback */
  ncfsm_comm *comm;
  ncfsm_close_cb cb;
  void *arg;
  ncfsm_result_t status; /* NCFSM_OK, or why it was aborted (the comm's failure, ERR_ABORTED) */
} ncfsm__close;

/* The loop glue (layer 3: fsm/loop.c) plugs its libevent calls in here. */
typedef struct ncfsm__loop_ops {
  void (*wake)(ncfsm_loop *loop); /* event_active on the wake event: any thread */
} ncfsm__loop_ops;

/* Recovery's loop-wide hooks (layer 5), set when the first comm is armed. */
typedef struct ncfsm__loop_hooks {
  void (*cancel)(ncfsm_loop *loop);   /* ncfsm_loop_close, before anything else; without the lock */
  void (*free_all)(ncfsm_loop *loop); /* ncfsm_loop_close, at the end; with the lock */
} ncfsm__loop_hooks;

struct ncfsm_loop {
  uint32_t magic;
  /* What other threads' submissions read without the lock, which no turn writes (a
   * group's start and end do, a trace's setting); then the hand-off's stack, which they
   * and the loop's thread write: each on a line of its own (the loop is allocated on a
   * line boundary: ncfsm__calloc_line), apart from what a turn writes. */
  _Atomic int threaded;  /* a loop on its own thread: other threads' submissions hand off first */
  unsigned group_state;  /* ncfsm__group_state_t (fsm/group.def) */
  int held_taken;        /* a thread holds a group back from the loop (fsm/held.def, below) */
  bool own_base;
  const ncfsm__loop_ops *ops;
  ncfsm_trace_fn trace;
  /* Submissions handed off by threads that found the lock taken or the loop on its own
   * thread (fsm/submit.h): a lock-free stack, newest first, that the next holder of the
   * lock takes in order; and works for such threads, from the pool past its quarantine
   * (taken whole). awake: the loop's own thread is not waiting in libevent: it looks at
   * the stack before it waits again, so a push need not wake it. wake_pending, cv_gen:
   * what spinning threads watch besides the stack (fsm/loop.c, fsm/api_wait.c; docs/design.md
   * "Waiting threads spin first"): a wake for the loop's own thread while it spins, and the
   * broadcasts while a waiter spins. */
  _Alignas(64) ncfsm_work *_Atomic handoff;
  _Atomic int nhandoff;            /* on the stack (its bound: NCFSM__HANDOFF_MAX) */
  _Atomic int handing;             /* threads inside a hand-off (ncfsm_loop_close waits for none) */
  ncfsm_work *_Atomic spare;
  _Atomic int awake;
  _Atomic int wake_pending;  /* set by every wake (loop_ops.wake), cleared by the loop's thread before it spins */
  _Alignas(64) _Atomic unsigned cv_gen; /* + 1 at each broadcast while cv_spinners > 0; a line of its own:
                                           waiters spin on it, submitters write the hand-off's line */
  _Alignas(64) uint64_t last_pass_ns; /* the loop's from here on */  /* the last libevent pass of ncfsm_loop_run (fsm/loop.c, socket_pass) */
  uint64_t id;           /* unique in the process: the per-thread last error names it */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int cv_waiters;        /* threads in a wait on cv (ncfsm__loop_cv_wait): none, no broadcast */
  int cv_spinners;       /* threads spinning on cv_gen instead (fsm/api_wait.c): none, no increment */
  int spin_cpus;         /* CPUs the process may run on, at the loop's creation: spins need 2 */
  struct event_base *base;
  struct event *ev_wake; /* cross-thread wakeup, launches, notifications */
  struct event *ev_poll; /* progress timer */
  unsigned timer_state;   /* ncfsm__timer_state_t: fsm/timer.def */
  bool kick;             /* something needs a turn (launch, init, abort, finalize) */
  bool wake_sent;        /* ncfsm__loop_wake woke the loop's thread: the turn that follows clears it */
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
  ncfsm__loop_hooks hooks;
  ncfsm__notifier *notifier;          /* push completion (NULL: poll) */
  int nqueued;           /* batches in launch queues (all comms) */
  uint64_t batch_order;  /* the last batch's order */
  uint64_t launch_id;    /* the last launch's id (flight recorder "group") */
  struct event *ev_signal; /* SIGUSR1: dump (opts.dump_on_signal) */
  bool ctl;              /* control work may be due: a comm entered a CONTROL state */
  _Atomic int async_kick; /* set without the lock (bootstrap callbacks): the next turn looks at ctl */
  /* group (R3; fsm/group.def; its state: above) */
  int group_depth;
  pthread_t group_owner;
  ncfsm_result_t group_err;
  ncfsm_work *group_head, *group_tail;
  /* a group one thread holds back from the loop (fsm/held.def): held_taken
   * (above, with what other threads read) is set by that thread's ncfsm_group_start (a compare-and-swap, no lock)
   * and cleared when the group ends or becomes the loop's; held.state and
   * held.depth are the holder's alone, held.w is read and written under the
   * lock (an abort of its comm fails it there) */
  struct ncfsm__held {
    unsigned state; /* ncfsm__held_state_t */
    int depth;
    ncfsm_work *w; /* ONE: the held op (recorded, in its comm's group), or NULL once its comm dropped it */
  } held;
  /* callbacks to deliver on the loop thread */
  ncfsm_work *notify_head, *notify_tail;
  struct ncfsm__state_note *snote_head, *snote_tail;
  ncfsm__call_req *calls_head, *calls_tail;
  void *trace_arg;
  ncfsm_work *free_head, *free_tail; /* FIFO; reused once longer than the quarantine */
  int nfree;
  ncfsm__pool_stats pool;
  struct event *ev_trim;  /* the pools' idle timer (own bases only: fsm/loop.c) */
  bool trim_armed;
  uint64_t trim_allocs;   /* pool.allocs when it was armed: none since, the pools are trimmed */
  ncfsm__spanset *spans; /* the launcher's R12 check */
  ncfsm__coalesce co;    /* the launcher's coalescing cap (fsm/coalesce.h) */
  struct ncfsm__stray *strays; /* NCCL handles no comm owns, aborted at the next control step (fsm/control.c) */
  int nclosing;          /* comms with a close in progress: the control step runs their close column */
  ncfsm__call_req *shutdown_req; /* ncfsm_loop_shutdown's callback: queued once every comm is released */
  ncfsm_loop_cb shutdown_cb;
  void *shutdown_arg;
  bool shutting;                 /* ncfsm_loop_shutdown was accepted (once per loop) */
  /* hot-path indexes of its comms (fsm/active.c) */
  ncfsm_comm *act_head, *act_tail; /* the active list: the comms a turn visits */
  bool act_unsorted;               /* ... not in the order of loop->comms (seqno descending) */
  /* comms whose verifiers were given something to look at by another thread (a peer rank's
   * loop, a bootstrap's callback): the next turn moves them to the active list */
  ncfsm_comm *_Atomic att_head;
  uint64_t comm_seqno;             /* the last comm's seqno */
  ncfsm_comm **qh;                 /* the launch heap: comms with queued batches, by their head's order */
  int nqh, capqh;
  uint64_t peers_gen, peers_built; /* peer rings: a comm's id changed (gen), the rings match (built == gen) */
  uint64_t turn_ns;                /* the turn's clock (ncfsm__turn_now); 0: not read yet */
  bool turn_clock;                 /* a turn holds the lock: ncfsm__turn_now may keep what it read */
  uint64_t handoffs;               /* submissions taken from the stack (/metrics) */
  uint64_t spins[2][2];            /* [NCFSM__SPIN_WAITER, _LOOP][NCFSM__SPIN_WOKEN, _BOUND] (/metrics) */
};
enum { NCFSM__SPIN_WAITER = 0, NCFSM__SPIN_LOOP = 1, NCFSM__SPIN_WOKEN = 0, NCFSM__SPIN_BOUND = 1 };
NCFSM__XT_BEFORE(struct ncfsm_loop, threaded, handoff);
NCFSM__XT_BEFORE(struct ncfsm_loop, group_state, handoff);
NCFSM__XT_BEFORE(struct ncfsm_loop, held_taken, handoff);
NCFSM__XT_BEFORE(struct ncfsm_loop, trace, handoff);
_Static_assert(offsetof(struct ncfsm_loop, wake_pending) + sizeof(int) <= offsetof(struct ncfsm_loop, handoff) + 64,
               "the hand-off's stack, its spare stack, awake and wake_pending share one line");

struct ncfsm__state_note {
  ncfsm_comm *comm;
  ncfsm_state_t from, to;
  ncfsm_event_t ev;
  struct ncfsm__state_note *next;
};

/* Whether some thread holds a group back from the loop (no lock needed). */
static inline bool ncfsm__held_any(const ncfsm_loop *loop) {
  return __atomic_load_n(&loop->held_taken, __ATOMIC_ACQUIRE) != 0;
}
/* The lock held: the op a group held back from the loop holds, or NULL. */
static inline ncfsm_work *ncfsm__held_op(const ncfsm_loop *loop) {
  return ncfsm__held_any(loop) ? loop->held.w : NULL;
}

/* now + ms as a deadline in ns; 0 (none) when ms is 0 or would overflow. */
static inline uint64_t ncfsm__deadline(uint64_t now_ns, uint64_t ms) {
  if (!ms || ms > (UINT64_MAX - now_ns) / 1000000ull) return 0;
  return now_ns + ms * 1000000ull;
}

/* The clock of a turn: read once, at its first use, and shared by what the
 * turn does while it holds the lock (launch and completion times, the
 * watchdog, the async watch). Only a turn keeps it (turn_clock: fsm/loop.c),
 * and only while it holds the lock: it pauses the clock before it drops the
 * lock (callbacks, a blocking backend call), so a work submitted meanwhile
 * never reads a later time than its launch or completion; everywhere else
 * every call reads the clock. */
static inline uint64_t ncfsm__turn_now(ncfsm_loop *loop) {
  if (!loop->turn_clock) return ncfsm__now_ns();
  if (!loop->turn_ns) loop->turn_ns = ncfsm__now_ns();
  return loop->turn_ns;
}
/* Before the lock is dropped inside a turn (returns what to resume), and
 * once it is held again. */
static inline bool ncfsm__turn_clock_pause(ncfsm_loop *loop) {
  bool was = loop->turn_clock;
  loop->turn_clock = false;
  loop->turn_ns = 0;
  return was;
}
static inline void ncfsm__turn_clock_resume(ncfsm_loop *loop, bool was) {
  loop->turn_clock = was;
  loop->turn_ns = 0;
}

/* Waits on loop->cv count themselves, so that the hot path's broadcasts
 * (every flush of callbacks) cost nothing while nobody waits. */
static inline int ncfsm__loop_cv_wait(ncfsm_loop *loop, const struct timespec *until) {
  loop->cv_waiters++;
  int rc = until ? pthread_cond_timedwait(&loop->cv, &loop->mu, until) : pthread_cond_wait(&loop->cv, &loop->mu);
  loop->cv_waiters--;
  return rc;
}
/* Spinning before sleeping (opts.spin_us) is on, and a second CPU allows it. */
static inline bool ncfsm__spin_on(const ncfsm_loop *loop) { return loop->opts.spin_us && loop->spin_cpus > 1; }
static inline void ncfsm__loop_cv_broadcast(ncfsm_loop *loop) {
  if (loop->cv_waiters) pthread_cond_broadcast(&loop->cv);
  if (loop->cv_spinners) atomic_fetch_add_explicit(&loop->cv_gen, 1, memory_order_release);
}

/* The table's state flags, read inline on the hot paths. */
static inline unsigned ncfsm__sflags(unsigned s) { return ncfsm__state_flag_tab[s]; }
static inline bool ncfsm__has(const ncfsm_comm *c, unsigned flag) { return (ncfsm__sflags(c->state) & flag) != 0; }

#define NCFSM__IS_ERR(rc) ((rc) != NCFSM__NCCL_SUCCESS && (rc) != NCFSM__NCCL_IN_PROGRESS)

/* For tests: backend calls (init, op, finalize, destroy, abort, revoke) made for c. */
uint64_t ncfsm__comm_backend_calls(ncfsm_comm *c);

/* ---- errors.c ---- */
void ncfsm__set_error(ncfsm_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The calling thread's last error for loop-level calls on loop. */
void ncfsm__loop_error(ncfsm_loop *loop, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *ncfsm__loop_error_of(const ncfsm_loop *loop); /* "" when this thread has none for loop */
/* The cause for a backend code, the same whichever call saw it. */
ncfsm_result_t ncfsm__cause_of(int code);

/* ---- works.c: the work machine (fsm/work.def) and references ---- */
typedef struct ncfsm__wev {
  ncfsm_result_t status; /* FAIL, TIME_OUT, ABORT: the work's final status */
  uint64_t launch;       /* LAUNCH: the launch's id */
  uint64_t now;          /* LAUNCH, LAUNCH_FINAL: the time */
} ncfsm__wev;
/* Fire ev on w; an event with no row is an engine defect (assert; in
 * release builds the work keeps its state and the defect is logged). */
void ncfsm__work_fire(ncfsm_work *w, ncfsm__work_event_t ev, const ncfsm__wev *p);
/* w ends with status: as FAILED, TIMED_OUT or ABORTED (st), through FAIL,
 * TIME_OUT or ABORT. Nothing for a final work. */
void ncfsm__work_end(ncfsm_work *w, ncfsm_work_state_t st, ncfsm_result_t status);
/* A work's memory, from the pool (beyond the quarantine) or the allocator;
 * NOT initialised: the caller sets every field. */
ncfsm_work *ncfsm__work_alloc(ncfsm_loop *loop);
/* Give the pools back down to their keep (works beyond NCFSM__POOL_KEEP, each
 * comm's marks beyond NCFSM__MARK_KEEP); returns the bytes freed. */
size_t ncfsm__pool_trim(ncfsm_loop *loop);
/* Something in the pools beyond their keep. */
static inline bool ncfsm__pool_over(const ncfsm_loop *loop) {
  return loop->nfree > NCFSM__POOL_KEEP || loop->pool.marks_free > NCFSM__MARK_KEEP * loop->ncomms ||
         atomic_load_explicit(&loop->spare, memory_order_relaxed); /* the hand-offs' spare works (fsm/submit.c) */
}
void ncfsm__work_unref(ncfsm_work *w);
void ncfsm__comm_unref(ncfsm_comm *c);
void ncfsm__comm_free_all(ncfsm_loop *loop); /* loop close: the quarantine */
/* The recorder entry of w after a change of w. */

/* ---- marks.c ---- */
ncfsm__mark *ncfsm__mark_get(ncfsm_comm *c);
void ncfsm__mark_put(ncfsm_comm *c, ncfsm__mark *m);
/* Destroy c's free marks beyond keep; returns how many. */
int ncfsm__marks_trim(ncfsm_comm *c, int keep);

/* ---- queue.c: launch queues, and failing a comm's works ---- */
/* Queue batch b (its works and links filled) in each of its comms' queues. */
void ncfsm__batch_queue(ncfsm_loop *loop, ncfsm__batch *b);
/* Pop b, the head of each of its comms' queues, onto the list head..tail. */
void ncfsm__batch_take(ncfsm_loop *loop, ncfsm__batch *b, ncfsm_work **head, ncfsm_work **tail);
/* Fail every work of batch b (all its comms) with (st, status) and drop it. */
void ncfsm__batch_fail(ncfsm_loop *loop, ncfsm__batch *b, ncfsm_work_state_t st, ncfsm_result_t status);
/* Fail every unfinished work of c with (st, status): open group, queued,
 * launching and in flight. */
void ncfsm__fail_all(ncfsm_comm *c, ncfsm_work_state_t st, ncfsm_result_t status);
/* Fail c's works in the open group and its launch queue. */
void ncfsm__drop_queued(ncfsm_comm *c, ncfsm_work_state_t st, ncfsm_result_t status);
/* Does an unfinished work of this loop name stream? */
bool ncfsm__stream_in_use(ncfsm_loop *loop, void *stream);
/* Does c's verification need this turn? (inline: asked for every listed comm at every turn) */
static inline bool ncfsm__verify_busy(const ncfsm_comm *c) {
  if (!c->vops) return false;
  if (c->verify_att) return __atomic_load_n(c->verify_att, __ATOMIC_RELAXED) != 0;
  return c->vops->busy(c);
}

/* Works on c's streams (inline: the progress pass asks at every turn). */
static inline bool ncfsm__comm_inflight(const ncfsm_comm *c) { return c->ninflight > 0; }
bool ncfsm__comm_idle(const ncfsm_comm *c);     /* nothing unfinished, nothing grouped */

static inline bool ncfsm__comm_wants_turn(const ncfsm_comm *c) {
  if (c->bq_head || c->launching || c->verify_waits || ncfsm__comm_inflight(c) || ncfsm__verify_busy(c)) return true;
  /* A verifier given something to look at later (by a peer, a callback, a timer) has its comm
   * enlisted then (ncfsm__comm_attend*): an idle verified comm costs a turn nothing. */
  return ncfsm__sflags(c->state) & (NCFSM_SF_POLL | NCFSM_SF_DEADLINE | NCFSM_SF_CONTROL);
}
/* Observe c's completion events in stream order: works before the first
 * incomplete event complete. Returns 1 on progress, 0 on none, -1 when an
 * event query failed (the caller fails the comm). */
int ncfsm__drain(ncfsm_comm *c);

/* ---- ranges.c ---- */
ncfsm__spanset *ncfsm__spanset_new(unsigned max_ops);
void ncfsm__spanset_free(ncfsm__spanset *ss);
void ncfsm__spanset_reset(ncfsm__spanset *ss);
/* Would batch b overlap (R12) what this launch already took? If not, its
 * ranges are taken. */
bool ncfsm__spanset_take(ncfsm__spanset *ss, const ncfsm__batch *b);
/* R12: the first pair of works in list (linked through bnext) on one comm
 * whose buffers overlap where one writes; false when none. */
bool ncfsm__find_overlap(ncfsm_work *list, ncfsm_work **x, ncfsm_work **y);

/* ---- active.c: the hot-path indexes of a loop's comms ---- */
void ncfsm__comm_enlist_slow(ncfsm_comm *c);
/* c needs the turns' progress pass (idempotent, O(1)). */
static inline void ncfsm__comm_enlist(ncfsm_comm *c) {
  if (!c->on_act) ncfsm__comm_enlist_slow(c);
}
void ncfsm__comm_delist(ncfsm_comm *c);
/* c's verifier has something to look at, set by a thread that does not hold c's loop's lock
 * (another loop's turn, a bootstrap's or libevent's callback): c goes on the loop's attention
 * stack, and the loop is woken; its next turn enlists c. Lock-free, from any thread, while c
 * is alive (its verifier keeps it so: ncfsm__comm_attend_forget before c is freed). */
void ncfsm__comm_attend_async(ncfsm_comm *c);
/* The turn's side: the stack onto the active list (the caller holds the loop's lock). */
void ncfsm__attend_take(ncfsm_loop *loop);
static inline void ncfsm__attend_turn(ncfsm_loop *loop) {
  if (atomic_load_explicit(&loop->att_head, memory_order_relaxed)) ncfsm__attend_take(loop);
}
/* c is about to be freed, and no thread can push it any more: it is off the stack. */
void ncfsm__comm_attend_forget(ncfsm_comm *c);
void ncfsm__enlist_all(ncfsm_loop *loop); /* a wake from outside: every comm is looked at once */

/* ---- submissions handed off while another thread held the lock (fsm/submit.h) ---- */
/* Past this many on the stack, a submitting thread waits for the lock instead. */
#define NCFSM__HANDOFF_MAX 4096
/* The spare works of the hand-offs go back to the allocator (the lock held); bytes freed. */
size_t ncfsm__handoff_free_spare(ncfsm_loop *loop);
/* The active list in the order of loop->comms (a turn visits the comms in
 * that order, as it visited every comm before the list existed). */
void ncfsm__active_sort(ncfsm_loop *loop);
/* c has something a turn must look at (else the progress pass delists it);
 * defined after ncfsm__verify_busy below. */
static inline bool ncfsm__comm_wants_turn(const ncfsm_comm *c);
/* The launch heap: room for n comms (false: out of memory); c's launch
 * queue changed (its head, or empty/non-empty); the comm of smallest head
 * order that skip(c, arg) does not skip (NULL: none). */
bool ncfsm__qheap_reserve(ncfsm_loop *loop, int n);
void ncfsm__qheap_fix_slow(ncfsm_comm *c);
static inline void ncfsm__qheap_fix(ncfsm_comm *c) {
  ncfsm_loop *loop = c->loop;
  if (!c->bq_head) {
    if (!c->qh_pos) return;
    if (c->qh_pos == loop->nqh) { /* the last place: nothing moves */
      loop->nqh--;
      c->qh_pos = 0;
      return;
    }
  } else if (!c->qh_pos && !loop->nqh) { /* the only one (room: reserved for every comm) */
    loop->qh[0] = c;
    c->qh_pos = loop->nqh = 1;
    return;
  } else if (c->qh_pos && loop->nqh == 1) {
    return; /* the only one: its key changed, its place did not */
  }
  ncfsm__qheap_fix_slow(c);
}
ncfsm_comm *ncfsm__qheap_min_slow(ncfsm_loop *loop, bool (*skips)(const ncfsm_comm *, void *), void *arg);
static inline ncfsm_comm *ncfsm__qheap_min(ncfsm_loop *loop, bool (*skips)(const ncfsm_comm *, void *), void *arg) {
  if (!loop->nqh) return NULL;
  if (!skips(loop->qh[0], arg)) return loop->qh[0]; /* the common case: the oldest head */
  return ncfsm__qheap_min_slow(loop, skips, arg);
}
/* A comm's unique id changed, or a comm joined or left the loop: the peer
 * rings are rebuilt when next asked. */
static inline void ncfsm__peers_changed(ncfsm_loop *loop) { loop->peers_gen++; }
/* The comms of c's ring (c->peer_next ...), c included; -1: out of memory. */
int ncfsm__comm_peers(ncfsm_comm *c);

/* ---- dumps.c ---- */
/* Snapshot c's recorder and queue a dump into dir (NULL: c's dump_dir;
 * nothing without one) for reason. */
ncfsm_result_t ncfsm__comm_dump(ncfsm_comm *c, const char *dir, const char *reason);

/* ---- sched.c: wakeups and who drives the loop ---- */
bool ncfsm__loop_can_drive(ncfsm_loop *loop); /* caller may make backend calls now */
extern _Thread_local ncfsm_loop *ncfsm__tls_in_turn; /* (sched.c) the loop whose turn this thread is inside */
/* this thread is inside a turn or callback of loop */
static inline bool ncfsm__loop_in_turn(const ncfsm_loop *loop) { return ncfsm__tls_in_turn == loop; }
/* marks this thread inside a turn (outer: the turn it was inside, restored by leave) */
static inline void ncfsm__loop_enter_turn(ncfsm_loop *loop, ncfsm_loop **outer) {
  *outer = ncfsm__tls_in_turn;
  ncfsm__tls_in_turn = loop;
}
static inline void ncfsm__loop_leave_turn(ncfsm_loop *loop, ncfsm_loop *outer) {
  (void)loop;
  ncfsm__tls_in_turn = outer;
}
static inline void ncfsm__loop_set_runner(ncfsm_loop *loop) {
  loop->runner = pthread_self();
  loop->running++;
}
static inline void ncfsm__loop_clear_runner(ncfsm_loop *loop) { loop->running--; }
/* Own the loop for a blocking backend call made outside a turn (destroy,
 * abort); another thread's ncfsm_loop_run waits meanwhile. */
void ncfsm__loop_claim(ncfsm_loop *loop);
void ncfsm__loop_unclaim(ncfsm_loop *loop);
/* Something needs a turn: wake the thread that runs the loop. */
/* A loop with its own base that nobody is running (or that this thread
 * runs) needs no wakeup: ncfsm_loop_run turns it directly when it finds
 * queued work, which saves a libevent round trip per op. Nor does a loop
 * already woken whose turn has not started yet: that turn sees what was
 * queued since (a stream from another thread wakes the loop once per turn,
 * not once per op). Inline: every submit calls it. */
static inline void ncfsm__loop_wake(ncfsm_loop *loop) {
  loop->kick = true;
  if (loop->own_base && (loop->running == 0 || pthread_equal(loop->runner, pthread_self()))) return;
  if (loop->wake_sent) return;
  loop->wake_sent = true;
  loop->ops->wake(loop);
}
/* Without the lock, from any thread: the next turn looks for control work. */
void ncfsm__loop_kick_async(ncfsm_loop *loop);
/* fn(arg) runs on the loop's thread, without the lock, at the end of the
 * current or next turn (with the callbacks). */
ncfsm_result_t ncfsm__loop_defer(ncfsm_loop *loop, void (*fn)(void *), void *arg);

#endif
