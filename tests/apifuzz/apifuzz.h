/*
 * ncfsm-apifuzz: seeded random sequences of public ncfsm calls on the sim
 * backend, with invariants checked after every step (docs/fuzzing.md).
 *
 * Files: main.c (command line, one child process per seed, report),
 * world.c (the fuzzer's model of loops, cliques, comms, works and the
 * actions), oracle.c (trace and callback checks, reference results),
 * scenarios.c (directed sequences for known engine defects).
 *
 * Locking: g.mu protects the model. It is taken inside ncfsm's trace
 * callback (which runs under a loop's lock), so code holding g.mu must never
 * call into ncfsm (lock order: loop lock, then g.mu).
 */
#ifndef NCFSM_APIFUZZ_H
#define NCFSM_APIFUZZ_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ncfsm.h"
#include "ncfsm/sim.h"

/* ---- compatibility with the engine under repair ------------------------------ */
/* ncfsm_work_release returns void today and may return ncfsm_result_t
 * (NCFSM_ERR_INVALID_USAGE on a second release) after the fix: accept both.
 * FZ_RELEASE_VOID is what the wrapper reports for the void variant. */
#define FZ_RELEASE_VOID ((ncfsm_result_t)-1)
/* group_rc values while a group is open / its outermost end is running */
#define FZ_GROUP_OPEN ((ncfsm_result_t)-2)
#define FZ_GROUP_ENDING ((ncfsm_result_t)-3)
__attribute__((unused)) static ncfsm_result_t fz__release_void(void (*f)(ncfsm_work *), ncfsm_work *w) {
  f(w);
  return FZ_RELEASE_VOID;
}
__attribute__((unused)) static ncfsm_result_t fz__release_res(ncfsm_result_t (*f)(ncfsm_work *),
                                                              ncfsm_work *w) {
  return f(w);
}
#define fz_work_release(w)                                                                        \
  _Generic(&ncfsm_work_release, void (*)(ncfsm_work *): fz__release_void, default: fz__release_res)( \
      ncfsm_work_release, (w))
/* Calls newer than the first engine the fuzzer ran on: weak references,
 * NULL when the library lacks them (an older engine), so one source builds
 * against both. NCFSM_DEFAULT_TIMEOUT_MS came with the same header change as
 * NCFSM_ON_ERROR_REVOKE. */
#pragma weak ncfsm_work_set_timeout
ncfsm_result_t ncfsm_work_set_timeout(ncfsm_work *w, uint64_t timeout_ms);
#pragma weak ncfsm_comm_failure
const char *ncfsm_comm_failure(const ncfsm_comm *comm);
/* Since NCFSM_SEQ_NONE a work takes its fingerprint seq when it is launched
 * (collectives in launch order, send/recv per peer and direction), and
 * ncfsm_comm_position counts launched collectives; before, seq was taken at
 * the call and the hash covered every accepted collective. */
#ifdef NCFSM_SEQ_NONE
#define FZ_SEQ_AT_LAUNCH 1
#else
#define FZ_SEQ_AT_LAUNCH 0
#endif
#ifdef NCFSM_DEFAULT_TIMEOUT_MS
#define FZ_HAVE_POLICY_REVOKE 1
#else
#define FZ_HAVE_POLICY_REVOKE 0
#endif
/* A wait that ran out of its own time limit: NCFSM_ERR_TIMEOUT today,
 * possibly NCFSM_ERR_AGAIN after the fix. */
#define FZ_WAIT_TIMED_OUT(r) ((r) == NCFSM_ERR_TIMEOUT || (r) == NCFSM_ERR_AGAIN)

/* ---- limits ------------------------------------------------------------------ */
#define FZ_MAX_LOOPS 3
#define FZ_MAX_RANKS 4
#define FZ_MAX_CLIQUES 48
#define FZ_MAX_STREAMS 96
#define FZ_MAX_CALLS 512
#define FZ_RING 64     /* steps kept for the report */
#define FZ_LINE 200    /* characters per step line */
#define FZ_COUNT_MAX 12

/* ---- options -------------------------------------------------------------------- */
typedef struct fz_opts {
  uint64_t seed;
  int steps;              /* actions per seed */
  double p_diverge;       /* a template gets one rank out of step */
  double p_invalid;       /* a template gets one invalid argument */
  double p_double_release;
  int verbose;
  int last;               /* steps shown in a report */
  const char *scenario;   /* NULL: random */
  int bounded;            /* smaller timeouts for the CTest run */
  unsigned avoid;         /* FZ_AVOID_*: keep the random search away from known defects */
} fz_opts;

/* --avoid NAME[,NAME]: the random actions steer clear of a known defect's
 * trigger (names as the scenarios), to look for other violations meanwhile. */
enum {
  FZ_AVOID_DESTROY_INFLIGHT = 1,  /* no destroy of a comm with unfinished works */
  FZ_AVOID_REVOKE_INFLIGHT = 2,   /* no revoke of a comm with unfinished works */
  FZ_AVOID_STREAM_QUEUED = 4,     /* no stream destroy while an unlaunched work names it */
  FZ_AVOID_DOUBLE_RELEASE = 8,    /* no second work release */
  FZ_AVOID_CLOSE_IN_CALLBACK = 16,/* no loop close from a loop_call callback */
  FZ_AVOID_NOWAIT_SPIN = 32,      /* ncfsm_loop_run(ONCE) where the random run would use NOWAIT */
};

/* ---- the model ------------------------------------------------------------------ */
typedef struct fz_loop fz_loop;
typedef struct fz_clique fz_clique;
typedef struct fz_comm fz_comm;
typedef struct fz_op fz_op;
typedef struct fz_stream fz_stream;

struct fz_loop {
  int id;
  ncfsm_loop *h; /* NULL once closed */
  struct event_base *base; /* embedded loops: the application's base */
  bool thread;   /* ncfsm_loop_start_thread is running it */
  int depth;     /* the fuzzer's count of its open groups (main thread) */
  int group_id;  /* id of the open outermost group, 0 if none */
  bool group_op_error;   /* an op call in the open group returned an error */
  bool group_mixed;      /* at its outermost end: the group's works mix blocking modes */
  int group_ops;         /* ops accepted in the open group */
  bool group_call_error; /* a comm call (init, finalize, ...) in the open group failed */
  bool embedded;         /* ncfsm_loop_new_embedded on base */
  bool closing;          /* ncfsm_loop_close is in progress */
  int gen;               /* how many loops this slot has had */
};

struct fz_stream {
  int id;
  void *h;
  int device;
  fz_loop *loop;
  int loop_gen;
  bool destroyed;
};

struct fz_comm {
  int id;
  fz_clique *q;
  int rank;
  int device;
  ncfsm_comm *h;        /* NULL once released */
  bool inited;          /* ncfsm_comm_init / init_all accepted */
  int blocking;
  uint64_t timeout_ms;
  ncfsm_error_policy_t policy;
  /* trace view */
  int last_state;       /* state after the last trace record */
  bool killed;          /* a DESTROY, ABORT or REVOKE transition was traced */
  const char *kill_event;
  int kill_step;
  int onstate_count;
  /* instances launched (LAUNCHING traced), for the data check */
  uint64_t coll_launched;
  uint64_t send_launched[FZ_MAX_RANKS], recv_launched[FZ_MAX_RANKS];
  /* accepted submissions, for the fingerprint and hash checks */
  uint64_t coll_accepted;
  uint64_t p2p_accepted[FZ_MAX_RANKS];
  uint64_t fp_hash;     /* the fuzzer's own hash of the collective fingerprints that count
                           (accepted, or launched with FZ_SEQ_AT_LAUNCH) */
};

/* A table: instance index -> op, grown on demand. */
typedef struct fz_itab {
  fz_op **v;
  size_t n, cap;
} fz_itab;

struct fz_clique {
  int id;
  bool split_child; /* made by act_split: a split child's rank and size are known once its init is done */
  fz_loop *loop;
  int loop_gen;  /* the loop slot's generation when the clique was made */
  int n;
  fz_comm *c[FZ_MAX_RANKS];
  ncfsm_sim_opts so[FZ_MAX_RANKS];
  ncfsm_unique_id uid;
  fz_itab coll[FZ_MAX_RANKS];                 /* rank -> collective instances */
  fz_itab send[FZ_MAX_RANKS][FZ_MAX_RANKS];   /* [from][to] */
  fz_itab recv[FZ_MAX_RANKS][FZ_MAX_RANKS];   /* [at][from] */
  const char *faults;                          /* description for the log */
};

struct fz_op {
  int id;
  int step;
  fz_comm *c;
  int rank;
  ncfsm_opkind_t kind;
  size_t count;
  int dtype, redop, root, peer;
  void *stream;
  int stream_id;         /* -1: default stream */
  void *send, *recv;     /* fuzzer-owned (send may equal recv: in place) */
  size_t send_bytes, recv_bytes;
  unsigned char *in;     /* copy of the send data at submission */
  bool expect_invalid;   /* the fuzzer passed a bad argument */
  const char *invalid_what;
  bool has_cb;
  int group_id;
  /* the call */
  bool returned;
  ncfsm_result_t rc;
  ncfsm_work *w;         /* the handle, while the fuzzer holds it */
  const void *seen;      /* the work pointer seen in the trace */
  int releases;          /* ncfsm_work_release calls made */
  bool held;             /* the fuzzer holds a reference */
  /* trace view */
  int wstate;            /* -1 before QUEUED */
  int64_t inst;          /* instance index once LAUNCHING, else -1 */
  bool completed_after_kill;
  /* callback */
  int cb_count;
  ncfsm_result_t cb_status;
  bool data_checked;
};

typedef struct fz_call {
  int id;
  fz_loop *loop;
  int kind;              /* what the callback does (world.c) */
  int ran;
  bool accepted;
  int clique;            /* for kinds that act on a clique */
} fz_call;

/* ---- shared report state (in a MAP_SHARED page, read by the parent) ----------- */
typedef struct fz_shared {
  volatile uint64_t seed;
  volatile int step;
  volatile int nlines;    /* lines written so far */
  volatile int reported;  /* the child printed a violation report itself */
  volatile uint64_t calls, trace, cbs, ok_checked, ops; /* counters of a finished seed */
  char ring[FZ_RING][FZ_LINE];
} fz_shared;

/* ---- globals -------------------------------------------------------------------- */
typedef struct fz_global {
  fz_opts o;
  pthread_mutex_t mu;
  uint64_t rng;
  int step;
  fz_shared *sh;
  int report_fd;          /* the real stderr */
  fz_loop loops[FZ_MAX_LOOPS];
  fz_clique *cliques[FZ_MAX_CLIQUES];
  int ncliques;
  fz_stream streams[FZ_MAX_STREAMS];
  int nstreams;
  fz_op **ops;
  int nops, capops;
  fz_call calls[FZ_MAX_CALLS];
  int ncalls;
  int next_group_id;
  ncfsm_result_t *group_rc; /* by group id: the outermost end's result; FZ_GROUP_OPEN while open */
  int cap_group_rc;
  /* trace maps: object pointer -> model object (linear tables, small) */
  struct { const void *p; fz_comm *c; } cmap[FZ_MAX_CLIQUES * FZ_MAX_RANKS];
  int ncmap;
  struct { const void *p; fz_op *op; } *wmap;
  int nwmap, capwmap;
  ncfsm_state_t trans[NCFSM_STATE_COUNT][NCFSM_EVENT_COUNT];
  bool allowed[NCFSM_STATE_COUNT][NCFSM_EVENT_COUNT][NCFSM_STATE_COUNT];
  /* counters for the summary */
  uint64_t n_calls, n_ok_checked, n_cb, n_trace;
  volatile int monitor_stop;
  char avoid_arg[256];
  volatile uint64_t deadline_ns; /* a blocking call in progress must return by then (0: none) */
  char deadline_what[160];
} fz_global;

extern fz_global g;
extern _Thread_local fz_op *fz_submitting; /* set around a submission (trace: QUEUED) */
extern _Thread_local fz_clique *fz_initall; /* set around ncfsm_comm_init_all (trace: new comms) */

/* ---- main.c ------------------------------------------------------------------------ */
uint64_t fz_now_ns(void);
void fz_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Report a violation (any thread): seed, step, message, last steps; exit 1. */
void fz_violation(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Bound the blocking call about to be made (0: clear). */
void fz_deadline(uint64_t ms, const char *what);

/* ---- rng ------------------------------------------------------------------------------ */
uint64_t fz_rand(void);
int fz_below(int n); /* [0, n) */
bool fz_chance(double p);
int fz_range(int lo, int hi); /* [lo, hi] */

/* ---- oracle.c ------------------------------------------------------------------------- */
void fz_oracle_init(void);
void fz_trace(const ncfsm_trace_rec *rec, void *arg);
void fz_work_cb(ncfsm_work *w, ncfsm_result_t status, void *arg);
void fz_state_cb(ncfsm_comm *comm, ncfsm_state_t from, ncfsm_state_t to, ncfsm_event_t ev, void *arg);
void fz_map_comm(const void *p, fz_comm *c); /* with g.mu */
/* Input values and buffers. */
void fz_fill_input(fz_op *op);
void fz_fill_sentinel(void *buf, size_t bytes);
/* With g.mu held: the checks of an op that completed with NCFSM_OK. */
void fz_check_ok_locked(fz_op *op);
/* After every step (takes g.mu). */
void fz_check_step(void);
/* End of a seed: everything torn down. */
void fz_check_final(void);
bool fz_is_final_wstate(int s);
/* The fuzzer's rolling hash of a collective's fingerprint (the hash check). */
uint64_t fz_fp_hash(uint64_t h, const fz_op *op);

/* ---- world.c -------------------------------------------------------------------------- */
void fz_world_init(void);
void fz_random_step(void);
void fz_teardown(void);
void fz_world_free(void);
/* Building blocks used by the scenarios. */
fz_loop *fz_loop_open(int idx, int embedded);
fz_loop *fz_loop_open_opts(int idx, int embedded, const ncfsm_loop_opts *lo); /* lo NULL: random */
fz_clique *fz_clique_new(fz_loop *l, int n, const ncfsm_comm_opts *base, const ncfsm_sim_opts *so,
                         int init_mode);
/* One op call. flags: FZ_* below. */
enum {
  FZ_HANDLE = 1,      /* ask for the work handle */
  FZ_CB = 2,          /* pass a callback */
  FZ_INPLACE = 4,     /* send == recv (allreduce, broadcast) */
  FZ_NULL_OPT = 8,    /* NULL for the buffer this rank does not need (non-root) */
  FZ_NULL_SEND = 16,  /* invalid: NULL send buffer */
  FZ_NULL_RECV = 32,  /* invalid: NULL recv buffer */
  FZ_HUGE = 64,       /* invalid: a count whose byte size overflows */
};
typedef struct fz_args {
  ncfsm_opkind_t kind;
  size_t count;
  int dtype, redop, root, peer;
  fz_stream *st;        /* NULL: the comm's default stream */
  void *raw_stream;     /* used when st is NULL and this is set (wrong-device tests) */
  unsigned flags;
  const char *invalid;  /* non-NULL: the call must fail (what is wrong) */
} fz_args;
fz_op *fz_submit(fz_comm *c, const fz_args *a);
/* The same op on every rank of q (a template), grouped or not, with the
 * configured chances of divergence and of one invalid argument. */
void fz_template(fz_clique *q, const fz_args *a, bool grouped);
fz_stream *fz_stream_new(fz_comm *c);
void fz_stream_del(fz_comm *c, fz_stream *s);
ncfsm_result_t fz_run(fz_loop *l, ncfsm_run_mode_t mode);
ncfsm_result_t fz_run_default(fz_loop *l);
ncfsm_result_t fz_wait_work(fz_op *op, uint64_t ms);
ncfsm_result_t fz_wait_state(fz_comm *c, ncfsm_state_t s, uint64_t ms);
ncfsm_result_t fz_lifecycle(fz_comm *c, ncfsm_call_t call);
ncfsm_result_t fz_release(fz_op *op);
ncfsm_result_t fz_group_start(fz_loop *l);
ncfsm_result_t fz_group_end(fz_loop *l);
void fz_loop_call(fz_loop *l, int kind, fz_clique *q);
void fz_retire_loop(fz_loop *l, bool close_in_call);

/* ---- scenarios.c ------------------------------------------------------------------------- */
/* Runs the named scenario (returns false if unknown). */
bool fz_scenario(const char *name);
bool fz_scenario_known(const char *name);
void fz_list_scenarios(void);

#endif
