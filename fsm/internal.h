/* Engine internals: the loop, communicator and work objects. */
#ifndef NCFSM_FSM_INTERNAL_H
#define NCFSM_FSM_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/log.h"
#include "ncfsm.h"

#define NCFSM__LOOP_MAGIC 0x4c4f4f50u /* 'LOOP' */
#define NCFSM__COMM_MAGIC 0x434f4d4du /* 'COMM' */
#define NCFSM__WORK_MAGIC 0x574f524bu /* 'WORK' */
#define NCFSM__DEAD_MAGIC 0xdeaddeadu

typedef struct ncfsm__mark ncfsm__mark;
typedef struct ncfsm__batch ncfsm__batch;
typedef struct ncfsm__spanset ncfsm__spanset;

/* A completion event shared by the works of one launch on one stream. */
struct ncfsm__mark {
  void *event;
  int refs;
  int ready_at_final; /* timing: queried once right after the launch became final */
  ncfsm__mark *next_free;
};

/* A unit of launch: one ungrouped op, or all ops of one user group (which
 * may span communicators). Batches launch in FIFO order; a batch is never
 * split; consecutive batches may share one backend group (coalescing). */
struct ncfsm__batch {
  ncfsm_work *head, *tail; /* linked through ncfsm_work.bnext */
  int nworks;
  bool explicit_group;
  ncfsm__batch *next;
};

/* A buffer range an op touches on its rank (R12 checks). */
typedef struct ncfsm__span {
  uintptr_t lo, hi;
  bool write;
} ncfsm__span;

struct ncfsm_work {
  uint32_t magic;
  int refs; /* the user's (if it asked for the handle) + the engine's */
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
  ncfsm__batch *batch;   /* while QUEUED for launch */
  ncfsm__batch single;   /* storage for the batch of an ungrouped op */
  ncfsm__mark *mark;     /* completion event, once IN_FLIGHT */
  ncfsm__mark *start_mark; /* timing: event recorded just before the launch */
  float device_ms;
  uint64_t t_submit, t_launch, t_final, t_complete, deadline_ns;
  ncfsm_work *bnext;     /* batch / group list */
  ncfsm_work *next;      /* launching list, stream queue, notify list */
  bool notified;  /* final state reached, callback queued */
  bool delivered; /* callback has run */
};

typedef struct ncfsm__squeue {
  void *stream;
  ncfsm_work *head, *tail;
} ncfsm__squeue;

struct ncfsm_comm {
  uint32_t magic;
  ncfsm_loop *loop;
  ncfsm_comm *next; /* loop's list */
  int refs;         /* 1 for the user handle + 1 per live work */
  bool released;
  ncfsm_state_t state;
  ncfsm_comm_opts opts;
  ncfsm_sim_opts sim;
  char name[64];
  const ncfsm__backend *be;
  void *bcomm;
  int rank, nranks;
  ncfsm_unique_id uid;
  bool init_issued;
  struct ncfsm_boot_req *uid_req; /* unique id exchange in flight (ncfsm_comm_init_boot) */
  char *uid_buf;                  /* size * NCFSM_UNIQUE_ID_BYTES */
  bool busy;          /* a launch (or finalize/revoke) is in progress in NCCL */
  bool fin_issued;
  bool enlisted;      /* has works in the loop's open group */
  bool abort_pending; /* error policy: abort at the next tick */
  int async_code;     /* backend async error when in ERROR */
  ncfsm_result_t cause;
  int npending;       /* works queued in batches, not launched */
  ncfsm_work *launching, *launching_tail; /* handed to NCCL, launch not final yet */
  ncfsm__squeue *sq;  /* in-flight works per stream */
  int nsq, capsq;
  ncfsm__mark *free_marks;
  void *stream;       /* the comm's own stream (NULL stream argument) */
  uint64_t coll_seq;
  uint64_t *p2p_seq;  /* per peer */
  uint64_t hash;
  uint64_t phase_deadline;
  uint64_t async_watch_ns; /* last async-state poll while works were in flight */
  uint64_t be_calls;   /* backend calls made for this comm (not polls/events): tests */
  char last_error[512];
};

typedef struct ncfsm__call_req {
  void (*fn)(void *);
  void *arg;
  struct ncfsm__call_req *next;
} ncfsm__call_req;

struct ncfsm_loop {
  uint32_t magic;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct event_base *base;
  bool own_base;
  struct event *ev_wake; /* cross-thread wakeup, launches, notifications */
  struct event *ev_poll; /* progress timer */
  bool poll_armed;
  bool kick;             /* something needs a turn (launch, init, abort, finalize) */
  bool poll_now;         /* an immediate re-poll is due (own base: turned directly) */
  unsigned poll_iter;
  unsigned backoff;        /* timed polls since the burst ended */
  uint64_t burst_start_ns; /* last progress: the immediate-poll burst runs from here */
  ncfsm_loop_opts opts;
  pthread_t runner;      /* thread inside the loop (valid when running) */
  int running;
  pthread_t thread;      /* ncfsm_loop_start_thread */
  bool thread_started, thread_stop;
  ncfsm_comm *comms;
  int ncomms;
  bool ctl;              /* control work may be due: aborts, inits, finalizes */
  _Atomic int async_kick; /* set without the lock (bootstrap callbacks): the next turn looks at ctl */
  /* group (R3) */
  int group_depth;
  pthread_t group_owner;
  ncfsm_result_t group_err;
  ncfsm_work *group_head, *group_tail;
  /* launch queue */
  ncfsm__batch *bq_head, *bq_tail;
  /* callbacks to deliver on the loop thread */
  ncfsm_work *notify_head, *notify_tail;
  struct ncfsm__state_note *snote_head, *snote_tail;
  ncfsm__call_req *calls_head, *calls_tail;
  ncfsm_trace_fn trace;
  void *trace_arg;
  ncfsm_work *free_works;
  ncfsm__spanset *spans; /* the launcher's R12 check */
  char last_error[512];
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

/* For tests: backend calls (init, op, finalize, destroy, abort, revoke) made for c. */
uint64_t ncfsm__comm_backend_calls(ncfsm_comm *c);

/* table.c */
const char *ncfsm__call_fn(ncfsm_call_t c);

/* loop.c */
bool ncfsm__loop_can_drive(ncfsm_loop *loop); /* caller may make backend calls now */
bool ncfsm__loop_in_turn(const ncfsm_loop *loop); /* this thread is inside a turn or callback of loop */
void ncfsm__loop_wake(ncfsm_loop *loop);
/* Without the lock, from any thread: the next turn looks for control work. */
void ncfsm__loop_kick_async(ncfsm_loop *loop);
void ncfsm__loop_arm_poll(ncfsm_loop *loop, bool progress);
bool ncfsm__loop_pending(ncfsm_loop *loop);      /* anything at all to do */
bool ncfsm__loop_poll_pending(ncfsm_loop *loop); /* something the poll timer watches */
void ncfsm__loop_flush_notes(ncfsm_loop *loop); /* called with mu held; drops and retakes it */

#define NCFSM__IS_ERR(rc) ((rc) != NCFSM__NCCL_SUCCESS && (rc) != NCFSM__NCCL_IN_PROGRESS)

/* engine.c (all with loop->mu held) */
void ncfsm__comm_drop_queued(ncfsm_comm *c, ncfsm_work_state_t st, ncfsm_result_t status);
void ncfsm__fire(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_result_t result);
bool ncfsm__launch(ncfsm_loop *loop); /* true when something was launched */
void ncfsm__progress(ncfsm_loop *loop);
void ncfsm__work_finish(ncfsm_work *w, ncfsm_work_state_t st, ncfsm_result_t status);
void ncfsm__work_set_state(ncfsm_work *w, ncfsm_work_state_t st);
void ncfsm__comm_fail(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_result_t cause, int code,
                      const char *what);
void ncfsm__comm_do_abort(ncfsm_comm *c);
void ncfsm__batch_append(ncfsm_loop *loop, ncfsm__batch *b);
void ncfsm__work_unref(ncfsm_work *w);
void ncfsm__comm_unref(ncfsm_comm *c);
void ncfsm__set_error(ncfsm_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* R12: the first pair of works in [a] (linked through bnext) on one comm
 * whose buffers overlap where one writes; false when none. */
ncfsm__spanset *ncfsm__spanset_new(unsigned max_ops);
void ncfsm__spanset_free(ncfsm__spanset *ss);
void ncfsm__work_spans(ncfsm_work *w); /* fills w->span from w->op */
bool ncfsm__find_overlap(ncfsm_work *list, ncfsm_work **x, ncfsm_work **y);

#endif
