/*
 * Internals of the sim backend, shared by the sim sources (core/sim/) only.
 *
 * One process-wide mutex (ncfsm__sim_mu) protects every process-local object
 * below; every function declared here expects it held unless its comment says
 * otherwise. Shared (cross-process) state has its own robust mutex (shm_hdr.mu).
 * Rule ids (R1..R13) are the sections of docs/nccl-rules.md.
 */
#ifndef NCFSM_CORE_SIM_INTERNAL_H
#define NCFSM_CORE_SIM_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/settings.h"
#include "core/sim/sim.h"

#define SIM_MAGIC_COMM 0x53494d43u   /* "SIMC" */
#define SIM_MAGIC_STREAM 0x53494d53u /* "SIMS" */
#define SIM_MAGIC_EVENT 0x53494d45u  /* "SIME" */
#define SIM_MAGIC_DEAD 0xdeadc0deu

/* Unique id layout: 16 random bytes (the clique key), then this tag. */
#define SIM_ID_KEY_LEN 16
#define SIM_ID_TAG "NCFSMSIM"
#define SIM_ID_TAG_LEN 8

/* cudaError_t values returned by the stream/event model. */
enum {
  SIM_CUDA_INVALID_VALUE = 1,    /* cudaErrorInvalidValue */
  SIM_CUDA_NO_MEMORY = 2,        /* cudaErrorMemoryAllocation */
  SIM_CUDA_INVALID_HANDLE = 400, /* cudaErrorInvalidResourceHandle */
  SIM_CUDA_NOT_READY = 600       /* cudaErrorNotReady */
};

/* A FIFO model of a CUDA stream. Each posted op takes a ticket (1, 2, ...);
 * `done` is the longest prefix of tickets that completed, so the stream
 * completes in order even when ops execute out of order. */
typedef struct sim_stream {
  uint32_t magic;
  int device;     /* a label (ncfsm_comm_opts.device) */
  int destroyed;  /* stream_destroy was called; freed once refs is 0 */
  uint64_t refs;  /* outstanding tickets + events that point here */
  uint64_t enq;   /* tickets issued */
  uint64_t done;  /* tickets 1..done completed */
  uint8_t *fl;    /* ring: completion flags of tickets done+1..enq */
  size_t cap;     /* ring capacity (power of two, or 0) */
  size_t head;    /* ring index of ticket done+1 */
  struct sim_note *notes, *notes_tail; /* host_notify: fn runs once done >= target (FIFO) */
  uint64_t fork_gen; /* ncfsm__sim_fork_gen at creation: its notes count as pending in that process only */
} sim_stream;

typedef struct sim_note {
  uint64_t target;
  void (*fn)(void *);
  void *arg;
  struct sim_note *next;
} sim_note;

/* cudaLaunchHostFunc: fn(arg) once everything posted on stream so far
 * completed. While one is pending, this process's device thread runs the
 * sim's progress (sim_stream.c), as the GPU runs a stream without its host. */
int ncfsm__sim_host_notify(void *stream, void (*fn)(void *), void *arg);
/* In a forked child, under ncfsm__sim_mu: it has no device thread. */
void ncfsm__sim_device_forked(void);

typedef struct sim_event {
  uint32_t magic;
  int device;
  int recorded;
  sim_stream *s;   /* NULL once complete (or recorded on the NULL stream) */
  uint64_t target; /* complete when s->done >= target */
  uint64_t t_ns;   /* host time at which it was first seen complete; 0 = not yet */
} sim_event;

struct sim_comm;
struct sim_unit;

/* ---- the shared clique (sim_shm.c) ------------------------------------------
 * Every clique lives in a POSIX shared-memory segment named from the unique
 * id (/dev/shm/ncfsm-sim-<32 hex>), whether its ranks share a process or not.
 * Offsets (shm_off, from the segment base) replace pointers; 0 is "none".
 * Every field of the segment is protected by its process-shared robust mutex
 * (shm_hdr.mu), taken after ncfsm__sim_mu (lock order: local, then shared). */
typedef uint64_t shm_off;

#define SIM_SHM_MAGIC 0x4d485353u /* "SSHM" */
#define SIM_SHM_VERSION 4u
#define SIM_SHM_PREFIX "ncfsm-sim-"
#define SIM_SHM_NAME_MAX 64

enum {
  SHM_OP_DEPOSITED = 1u << 0, /* send data copied into the arena; executable */
  SHM_OP_DONE = 1u << 1,      /* executed: the result waits for its owner */
  SHM_OP_INVISIBLE = 1u << 2, /* never_arrive: never matches */
  SHM_OP_DEAD = 1u << 3,      /* injected async error: never executes (R10) */
  SHM_OP_NOTED = 1u << 4      /* its instance's R11 mismatch was logged (informational only) */
};

/* What a collective instance whose fingerprints differ across ranks does
 * (R11, sim_exec.c; docs/sim.md "R11 matching"): chosen by the process that
 * creates the clique (NCFSM_SIM_MISMATCH) and kept in the segment, so that
 * every process executes mismatches alike. */
enum {
  SIM_MISMATCH_NCCL = 0, /* "nccl" (default): what NCCL 2.28 did, measured; model choices beyond */
  SIM_MISMATCH_HANG = 1  /* "hang": never executes, except that a Broadcast root completes locally */
};

/* Header of an arena block (SHM_ALIGN bytes). `next` links free blocks
 * (address order); an allocated block holds SHM_BLK_USED there instead, so
 * that recovery can tell a live reference from a stale one. */
#define SHM_ALIGN 64u
static inline uint64_t shm_round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
#define SHM_BLK_USED 0x5553454455534544ull /* "DESUDESU" */
typedef struct shm_blk {
  uint64_t size; /* whole block, header included */
  shm_off next;
} shm_blk;

/* One posted op of one rank, as every process sees it. */
typedef struct shm_op {
  shm_off prev, next;   /* the rank's posted, not yet collected ops, in posting order */
  int32_t rank, kind, dtype, redop, root, peer;
  uint64_t count, idx, unit; /* match index; the rank's launch unit number */
  uint32_t flags, pad;
  shm_off send;         /* deposited copy of this rank's send data (0: none) */
  uint64_t send_len;
  shm_off res;          /* refcounted result block of the instance (0: none) */
  uint64_t res_off, res_len; /* this op's slice of it, copied to its recv buffer */
  uint64_t done_seq;    /* order of execution: owners copy results back in this order (R12) */
} shm_op;

/* One split, shrink or grow call of one rank on a parent clique, as its
 * peers see it (docs/sim.md "Split, shrink, grow and dead ranks"). A rank's
 * n-th call of a kind sits in slot n % 2: the rendezvous of call n reads
 * every rank's slot, and a rank cannot make call n + 2 before every rank made
 * call n + 1, which each makes only after its call n completed. */
typedef struct shm_xrec {
  uint64_t seq;           /* 1 + n: call n of its kind was made (0: slot unused) */
  int32_t a, b;           /* split: color, key; grow: new nranks, 1 when it passed the id */
  uint64_t hash;          /* shrink: the exclude list's hash (every survivor must agree) */
  unsigned char key[SIM_ID_KEY_LEN]; /* grow: the new clique's key (when it passed the id) */
} shm_xrec;

enum { SIM_X_SPLIT = 0, SIM_X_SHRINK = 1, SIM_X_GROW = 2, SIM_X_KINDS = 3 };

typedef struct shm_rank {
  int32_t used, live, dead, pid;
  shm_off head, tail;   /* posted ops not yet collected */
  uint64_t xn[SIM_X_KINDS];       /* split/shrink/grow calls published by this rank */
  shm_xrec x[SIM_X_KINDS][2];     /* call n of kind k in x[k][n % 2] */
} shm_rank;

/* The commit record of one executing instance (sim_exec.c): written, then
 * made valid, then applied to its ops, then cleared. A process that dies
 * between valid and clear leaves it for the next lock holder, which applies
 * it again (every step is idempotent), so an instance is executed on all of
 * its ops or on none (docs/sim.md, "A dead rank"). */
typedef struct shm_journal {
  uint32_t valid, nops;
  shm_off res;          /* the result block (0: none) */
  uint64_t done_seq0;   /* done_seq of ops[0]; ops[k] gets done_seq0 + k */
  /* then ops[cap], roff[cap], rlen[cap] (uint64_t each), cap = shm_hdr.jcap */
} shm_journal;

typedef struct shm_hdr {
  uint32_t magic, version;
  uint32_t ready;       /* set (release) by the creator once initialised */
  int32_t creator_pid;
  int32_t owner_pid;    /* pid holding mu (EOWNERDEAD: that process died) */
  int32_t nranks, joined, live, ndead, unlinked;
  uint64_t rng;         /* shuffle PRNG (R12), seeded by the creator's shuffle_seed */
  uint64_t done_seq;
  uint64_t size, arena_off, arena_len; /* segment bytes; the arena inside it */
  uint64_t backed;      /* bytes reserved with posix_fallocate (no SIGBUS on a full /dev/shm) */
  shm_off free_head;    /* free blocks, sorted by offset */
  uint64_t used;        /* arena bytes allocated */
  shm_off jrn_off;      /* the commit record (shm_journal) */
  uint32_t jcap;        /* its capacity in ops: max(nranks, 2) */
  uint32_t recoveries;  /* times a lock holder's death was repaired */
  uint32_t mismatch;    /* SIM_MISMATCH_*: how R11 mismatches execute */
  uint32_t grow_used_n; /* grow ids consumed on this clique (single-use), the last ones below */
  unsigned char grow_used[4][SIM_ID_KEY_LEN];
  pthread_mutex_t mu;   /* PTHREAD_PROCESS_SHARED + PTHREAD_MUTEX_ROBUST */
  shm_rank rank[];      /* nranks */
} shm_hdr;

#define SHM_PTR(q, off) ((void *)((char *)(q)->h + (off)))
#define SHM_OP(q, off) ((shm_op *)SHM_PTR(q, off))
#define SHM_JRN(q) ((shm_journal *)SHM_PTR(q, (q)->h->jrn_off))
#define SHM_JRN_OPS(q) ((uint64_t *)(SHM_JRN(q) + 1))
#define SHM_JRN_ROFF(q) (SHM_JRN_OPS(q) + (q)->h->jcap)
#define SHM_JRN_RLEN(q) (SHM_JRN_ROFF(q) + (q)->h->jcap)

/* One operation of one rank (process-local: it holds the user's pointers). */
typedef struct sim_op {
  ncfsm__op a;            /* the call's arguments */
  struct sim_comm *c;
  struct sim_unit *unit;  /* the launch unit it was posted in */
  struct sim_op *next;
  sim_stream *s;          /* stream it is enqueued on; NULL: none */
  uint64_t ticket;        /* its ticket on s */
  uint64_t seq;           /* index among all ops posted by this comm (async_error_at_op) */
  uint64_t idx;           /* match index: k-th collective, or k-th send/recv with peer */
  shm_off sh;             /* its shm_op while posted and not collected; 0: none */
  unsigned done : 1;      /* executed or dropped; its ticket completed */
  unsigned invisible : 1; /* never_arrive: peers never see it */
  unsigned dead : 1;      /* hit by an injected async error: never executes (R10) */
  unsigned deposited : 1; /* its send data is in the arena */
  unsigned counted : 1;   /* posted and counted in its comm's `outstanding` (R13) */
} sim_op;

/* The ops of one group end (or implicit group) of one comm, in call order. */
typedef struct sim_unit {
  sim_op *head, *tail;
  size_t n, ndone;
  uint64_t no;            /* the comm's unit number */
  struct sim_unit *next;
} sim_unit;

/* What an InProgress async state is waiting for. */
typedef enum sim_phase {
  SIM_PH_NONE = 0,
  SIM_PH_INIT,     /* init_polls and all ranks present (R1) */
  SIM_PH_LAUNCH,   /* launch_polls, then the staged unit is posted (R1, R2) */
  SIM_PH_FINALIZE, /* finalize_polls and every posted op done (R4) */
  SIM_PH_REVOKE,   /* revoke_polls (R6) */
  SIM_PH_XCOMM     /* split_polls and every member's call: split, shrink or grow (R7, R8) */
} sim_phase;

/* A split, shrink or grow made on a parent comm, until its child is written. */
typedef struct sim_xop {
  int kind;             /* SIM_X_* */
  uint64_t n;           /* this rank's call number of its kind (shm_rank.xn before the call) */
  int published;        /* its record is in the parent's segment (a dead rank's never is) */
  int color, key;       /* split */
  int *exclude, nexclude, flags; /* shrink (exclude sorted) */
  uint64_t hash;        /* shrink: of the exclude list */
  int grow_nranks;      /* grow: the new size */
  int has_id;           /* grow: this rank passed the unique id */
  unsigned char grow_key[SIM_ID_KEY_LEN]; /* grow: the new clique (from the id, or its holder's record) */
  int done, final;      /* blocking parent: the rendezvous ended, with this result */
  struct sim_comm *child; /* made (blocking parent: its init is waited for) */
  void **child_out;     /* where the child is written (R8: when the parent polls to success) */
  int blocking, device; /* the child's configuration */
  ncfsm_sim_opts o;
  char name[64];
  int in_group;         /* armed (nonblocking) or waited for (blocking) at the outermost group end */
} sim_xop;

typedef struct sim_clique sim_clique;
struct sim_comm;

/* The comms of one outermost group end whose launches are staged (R13): NCCL
 * launches them on one helper thread, so the group end stays InProgress for
 * all of them while any of them is held by the drift limit, and they are
 * posted together. Members leave it when posted, dropped or closed. */
typedef struct sim_lgroup {
  int n, live;
  struct sim_comm *m[];
} sim_lgroup;

typedef struct sim_comm {
  uint32_t magic;
  sim_clique *q;
  int rank, nranks, blocking, device;
  ncfsm_sim_opts o;
  char name[64];

  int state;        /* async state, an ncclResult_t */
  sim_phase phase;  /* while state is InProgress */
  int armed;        /* the phase counts polls (set by the outermost group end) */
  int countdown;    /* polls left in the phase */
  int poisoned;     /* R2: a call was rejected while InProgress */
  int revoke_prev;  /* state to restore when a revoke phase ends (R6) */
  int finalized;    /* finalize completed (R4) */
  int revoked;      /* revoke issued (R6) */
  int zombie;       /* destroyed/aborted while in an open group; freed at its end */
  int peer_dead_seen; /* the dead-peer error was set (once) */
  int shrink_aborted; /* shrunk with NCFSM__SHRINK_ABORT: only poll and abort are allowed (R7) */
  sim_xop *xop;      /* a split/shrink/grow in progress on it as the parent */

  /* Membership in the calling thread's open group (R3). */
  int in_group;
  int arg_err;       /* a call on it was rejected with ncclInvalidArgument in this group */
  int init_in_group; /* its init completes (or arms) at the outermost group end */
  struct sim_comm *grp_next;

  sim_unit *pending; /* ops of the open group, not posted */
  sim_unit *staged;  /* ops of an InProgress group end, posted when launch_polls ran out */
  sim_unit *units, *units_tail; /* posted launch units, oldest first */
  sim_lgroup *lg;    /* the group end its staged unit belongs to (R13) */
  uint64_t outstanding; /* posted ops not executed or dropped yet (R13) */
  long long drift_limit; /* NCFSM_SIM_DRIFT_LIMIT at init; <= 0: off */
  int held;          /* its launch is held by the drift limit (logged once) */
  int pid;           /* the process that created it */
  uint64_t fork_gen; /* ncfsm__sim_fork_gen at creation: differs in a forked child */
  uint64_t nposted, ncoll, nunits;
  uint64_t *nsend, *nrecv; /* per peer: sends/recvs posted */

  ncfsm_sim_stats st;
  struct sim_fstate *fs; /* the testing kit's fault plan for it (sim-faults.h); NULL: none */
  char err[1024];        /* its last WARN (ncfsm__sim_cwarn): its backend last_error */
} sim_comm;

/* This process's handle on one shared clique. */
struct sim_clique {
  unsigned char key[SIM_ID_KEY_LEN];
  int nranks;
  sim_comm **slot;     /* this process's live comm of each rank, or NULL */
  int nlocal;          /* live comms of this process */
  int fd;
  shm_hdr *h;
  size_t size;
  char name[SIM_SHM_NAME_MAX];
  int full_warned;     /* arena-full WARN given */
  uint64_t next_check_ns; /* next liveness check of peer processes */
  int stalled_pid;     /* the lock's holder, a stopped process (0: none seen): ncfsm__sim_shm_lock */
  uint64_t stall_check_ns; /* until then a busy lock with that holder is still stalled */
  sim_clique *next;
};

extern pthread_mutex_t ncfsm__sim_mu;
extern sim_clique *ncfsm__sim_cliques;
/* Cliques this process inherited through fork(): never progressed, never
 * touched in shared memory; unmapped with the child's last copy of a comm. */
extern sim_clique *ncfsm__sim_inherited;
/* Incremented in a forked child (pthread_atfork): a comm whose fork_gen
 * differs belongs to the parent process. */
extern uint64_t ncfsm__sim_fork_gen;

/* sim.c */
/* Record a WARN as NCCL does: last-error text, stderr when NCCL_DEBUG is
 * WARN/INFO/TRACE, and an ncfsm INFO line. The text is the process's last
 * error (the backend's last_error with a handle that is no sim comm, as
 * ncclGetLastError); ncfsm__sim_cwarn also makes it c's own (last_error of c),
 * so that a comm's failure text is never another comm's (c NULL: the
 * process's only). */
void ncfsm__sim_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ncfsm__sim_cwarn(sim_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The process's last error becomes c's too: a WARN about a whole group. */
void ncfsm__sim_warn_also(sim_comm *c);
/* A process-wide setting of the sim (core/settings.def) where the sim uses
 * it: the environment's value, or the default when unset; a refused value
 * gives the default with a WARN (ncfsm_comm_new, and ncfsm__sim_call_opts at
 * every init, split, shrink and grow, refused it first). No lock needed. */
ncfsm__setting_val ncfsm__sim_setting(ncfsm__setting_id id);

/* sim_shm.c (segments, their mutex, peer liveness), sim_shm_arena.c (the
 * allocator, posted ops, the commit record, the crash hook) and
 * sim_shm_repair.c (recovery after a dead lock holder, the invariant check) */
/* "/ncfsm-sim-<hex key>" */
void ncfsm__sim_shm_name(const unsigned char *key, char *buf, size_t len);
/* Attach to (or create) the clique's segment; adds it to ncfsm__sim_cliques.
 * On failure returns ncclSystemError after a WARN. */
int ncfsm__sim_shm_attach(const unsigned char *key, int nranks, uint64_t seed, sim_clique **out);
/* Unmap, close, drop from ncfsm__sim_cliques (or ncfsm__sim_inherited) and
 * free (the segment stays). */
void ncfsm__sim_shm_detach(sim_clique *q);
/* Take / release the segment's robust mutex. A dead holder (EOWNERDEAD):
 * the shared state is repaired (ncfsm__sim_shm_recover) and its process's
 * ranks are marked dead. -1 (after a WARN) when unrecoverable;
 * SIM_LOCK_STALLED (after a WARN, once per stall) when the holder is a
 * process stopped for SIM_STALL_MS (SIGSTOP, a debugger): the caller goes on
 * without the shared state, as a host call of NCCL goes on while a peer is
 * stopped (docs/sim.md "A stopped rank holding the mutex"). */
#define SIM_LOCK_STALLED (-2)
#define SIM_STALL_MS 100
int ncfsm__sim_shm_lock(sim_clique *q);
void ncfsm__sim_shm_unlock(sim_clique *q);
/* Reserve the segment's pages up to byte `end` (posix_fallocate, whole
 * MiBs, at most the segment): 0, or -1 with errno (/dev/shm is full). */
int ncfsm__sim_shm_back(sim_clique *q, uint64_t end);
/* Arena allocation (shm locked). 0 on failure; *nospace is set when
 * /dev/shm itself is full (posix_fallocate failed), else the arena is. */
shm_off ncfsm__sim_shm_alloc(sim_clique *q, size_t n, int *nospace);
void ncfsm__sim_shm_free(sim_clique *q, shm_off off);
/* Rank r is gone for good: its posted ops are freed (shm locked). */
void ncfsm__sim_shm_rank_dead(sim_clique *q, int r, const char *why);
/* Mark ranks of dead peer processes dead (rate-limited; shm locked). */
void ncfsm__sim_shm_check_peers(sim_clique *q);
/* Unlink segments whose processes are all gone (crashed ranks). */
void ncfsm__sim_shm_sweep(void);
/* Release a posted op's shared state (send copy, result ref, descriptor). */
void ncfsm__sim_shm_op_release(sim_clique *q, shm_off off);
/* Repair the segment after a lock holder died mid-update (shm locked):
 * applies a valid commit record, cuts each rank's op list at its first
 * invalid link and relinks it, drops references to blocks that are not
 * allocated, recounts result references and clique counters, and rebuilds
 * the free list and `used` from the blocks still referenced (everything else
 * is free). Returns the number of repairs made (0: it was consistent). */
int ncfsm__sim_shm_recover(sim_clique *q);
/* Apply the valid commit record to its ops (shm locked): executed, results
 * attached, inputs freed (free_inputs) or only forgotten (recovery), then
 * the record is cleared. Nothing when it is not valid. */
void ncfsm__sim_shm_commit(sim_clique *q, int free_inputs);
/* Check the segment's invariants (shm locked): 0 when consistent, else -1
 * with the first violation in why. Tests use it. */
int ncfsm__sim_shm_check(sim_clique *q, char *why, size_t why_len);

/* Test hook: the calling process _exit()s with SIM_CRASH_EXIT inside the
 * clique's critical section, in the middle of an update, the nth time
 * (1-based) it reaches `point`; SIM_CRASH_NONE disarms. Process-local. */
enum {
  SIM_CRASH_NONE = 0,
  SIM_CRASH_ALLOC_SPLIT, /* allocator: a block was split, the free list not yet updated */
  SIM_CRASH_FREE_MERGE,  /* allocator: merged into the previous free block, its link not yet fixed */
  SIM_CRASH_UNLINK,      /* a rank's op list: half of an unlink done */
  SIM_CRASH_EXEC         /* an instance: some of its ops marked executed, not all */
};
#define SIM_CRASH_EXIT 77
void ncfsm__sim_shm_crash_at(int point, uint64_t nth);
/* Reached at the points above (cheap when disarmed). */
extern int ncfsm__sim_crash_point;
void ncfsm__sim_crash_hit(int point);
#define SIM_CRASH_POINT(p)                                                    do {                                                                          if (__builtin_expect(ncfsm__sim_crash_point == (p), 0)) ncfsm__sim_crash_hit(p);   } while (0)

/* sim_exec.c */
/* Run every executable instance of every clique until nothing executes (R11, R12). */
void ncfsm__sim_progress(void);
/* Mark every op of u done (dropped, no data), complete its tickets, free u. */
void ncfsm__sim_unit_drop(sim_unit *u);

/* sim_stream.c */
int ncfsm__sim_stream_valid(const void *stream);
/* Take the next ticket on s (0, or -1 when out of memory). */
int ncfsm__sim_stream_enqueue(sim_stream *s, uint64_t *ticket);
/* Ticket t of s completed; may free s. */
void ncfsm__sim_stream_complete(sim_stream *s, uint64_t t);
int ncfsm__sim_stream_create(int device, void **stream);
int ncfsm__sim_stream_destroy(void *stream);
int ncfsm__sim_stream_device(void *stream, int *device);
int ncfsm__sim_event_create(int device, void **ev);
int ncfsm__sim_event_record(void *ev, void *stream);
int ncfsm__sim_event_query(void *ev);
int ncfsm__sim_event_elapsed_ms(void *start, void *stop, float *ms);
int ncfsm__sim_event_destroy(void *ev);

/* sim_reduce.c (no lock needed) */
size_t ncfsm__sim_dtype_size(int dtype);
/* out[i] = in[0][i] op in[1][i] op ... for n elements of dtype; AVG divides
 * by nin (integers truncate). out may alias none of in. */
void ncfsm__sim_reduce(void *out, const void *const *in, int nin, size_t n, int dtype, int redop);
float ncfsm__sim_half_to_float(uint16_t h);
uint16_t ncfsm__sim_float_to_half(float f);
float ncfsm__sim_bf16_to_float(uint16_t h);
uint16_t ncfsm__sim_float_to_bf16(float f);

#endif
