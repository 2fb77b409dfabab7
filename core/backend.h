/*
 * The backend interface: what ncfsm needs from NCCL + CUDA, as one table of
 * function pointers. Two implementations: the nccl backend (real NCCL and the
 * CUDA runtime; core/backend_nccl.c and the files core/nccl_internal.h lists)
 * and core/sim/ (a deterministic model of NCCL 2.28).
 *
 * Result codes are NCCL's ncclResult_t values (NCFSM__NCCL_*), so the sim
 * returns exactly what NCCL returns. Stream and event functions return 0 on
 * success, else a backend code (cudaError_t for nccl).
 *
 * The engine (fsm/) is the only caller, always on the loop thread (R9), and
 * never calls a backend in a way docs/nccl-rules.md forbids; the sim still enforces
 * the rules so that tests can show what happens when a program does.
 */
#ifndef NCFSM_CORE_BACKEND_H
#define NCFSM_CORE_BACKEND_H

#include "ncfsm.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  NCFSM__NCCL_SUCCESS = 0,
  NCFSM__NCCL_UNHANDLED_CUDA_ERROR = 1,
  NCFSM__NCCL_SYSTEM_ERROR = 2,
  NCFSM__NCCL_INTERNAL_ERROR = 3,
  NCFSM__NCCL_INVALID_ARGUMENT = 4,
  NCFSM__NCCL_INVALID_USAGE = 5,
  NCFSM__NCCL_REMOTE_ERROR = 6,
  NCFSM__NCCL_IN_PROGRESS = 7,
  NCFSM__NCCL_TIMEOUT = 8 /* NCCL >= 2.30 */
};

/* "ncclInvalidArgument"; "ncclResult(N)" for codes this build does not know. */
const char *ncfsm__nccl_result_name(int code);
/* The calling thread's ncfsm_last_error (every error setter of every object
 * writes it: fsm/errors.c, core/settings_opts.c, bootstrap/boot.c). */
void ncfsm__last_error_set(const char *msg);

/* One operation as the backend sees it (counts as in the NCCL call). */
typedef struct ncfsm__op {
  ncfsm_opkind_t kind;
  const void *send;
  void *recv;
  size_t count;
  ncfsm_dtype_t dtype;
  ncfsm_redop_t redop; /* collectives that reduce */
  int root;            /* BROADCAST, REDUCE, GATHER, SCATTER */
  int peer;            /* SEND, RECV */
  void *stream;        /* never NULL: the engine resolves NULL to the comm's stream */
} ncfsm__op;

typedef struct ncfsm__comm_config {
  int blocking;
  int device;
  const ncfsm_sim_opts *sim; /* sim only; never NULL when the sim is called */
  const char *name;
} ncfsm__comm_config;

/* Optional entry points (bit set when the runtime has them, R6/R7). */
enum { NCFSM__HAS_REVOKE = 1u << 0, NCFSM__HAS_SHRINK = 1u << 1, NCFSM__HAS_ALLTOALL = 1u << 2,
       NCFSM__HAS_GATHER = 1u << 3, NCFSM__HAS_SCATTER = 1u << 4, NCFSM__HAS_SPLIT = 1u << 5,
       NCFSM__HAS_GROW = 1u << 6, NCFSM__HAS_INIT_SCALABLE = 1u << 7 };

/* ncclCommShrink flags (NCCL_SHRINK_DEFAULT, NCCL_SHRINK_ABORT) and NCCL_SPLIT_NOCOLOR. */
enum { NCFSM__SHRINK_DEFAULT = 0, NCFSM__SHRINK_ABORT = 1 };
#define NCFSM__SPLIT_NOCOLOR (-1)

typedef struct ncfsm__backend {
  const char *name;
  ncfsm_backend_kind_t kind;
  /* Load/resolve the library; 0 when usable. Idempotent. */
  int (*open)(char *why, size_t why_len);
  int (*version)(void);          /* runtime NCCL_VERSION_CODE (sim: the modelled version) */
  unsigned (*features)(void);    /* NCFSM__HAS_* */
  int (*get_unique_id)(ncfsm_unique_id *id);
  int (*comm_init)(void **bcomm, int nranks, const ncfsm_unique_id *id, int rank,
                   const ncfsm__comm_config *cfg);
  /* The call's own result; *state is the comm's async state (R1, R2). */
  int (*get_async_error)(void *bcomm, int *state);
  int (*group_start)(void);
  int (*group_end)(void);
  int (*op)(void *bcomm, const ncfsm__op *op);
  int (*finalize)(void *bcomm);
  int (*destroy)(void *bcomm);
  int (*abort)(void *bcomm);
  int (*revoke)(void *bcomm, int flags);
  /*
   * Communicators made from communicators (NULL where the backend has none;
   * features() / comm_features() say whether this runtime has them). Like
   * NCCL, a nonblocking parent's call may return ncclSuccess or
   * ncclInProgress with *child not written yet: the backend writes *child
   * (through the pointer given here, which must stay valid) at the latest
   * when the parent's async state polls back to ncclSuccess (R8); only then
   * may the engine read it, and the child then polls to success on its own.
   * cfg is the child's configuration (blocking, device, sim options, name).
   */
  /* ncclCommSplit: color NCFSM__SPLIT_NOCOLOR leaves *child NULL. */
  int (*comm_split)(void *parent, int color, int key, void **child, const ncfsm__comm_config *cfg);
  /* ncclCommShrink (R7): the excluded ranks (parent ranks) must not call it;
   * flags NCFSM__SHRINK_DEFAULT (no outstanding parent work) or
   * NCFSM__SHRINK_ABORT (the parent's outstanding work is terminated first). */
  int (*comm_shrink)(void *parent, const int *exclude, int nexclude, void **child,
                     const ncfsm__comm_config *cfg, int flags);
  /* ncclCommGetUniqueId (2.29+): the id a grow is made with, from one existing rank. */
  int (*comm_get_unique_id)(void *bcomm, ncfsm_unique_id *id);
  /* ncclCommGrow (2.29+): existing ranks pass their comm and rank -1 (id only
   * on the rank that made it, NULL on the others); joining ranks pass parent
   * NULL, the id and their new rank (numbered from the parent's size up). */
  int (*comm_grow)(void *parent, int nranks, const ncfsm_unique_id *id, int rank, void **child,
                   const ncfsm__comm_config *cfg);

  /* ncclCommInitRankScalable (NCCL 2.23+): several unique ids (nids roots),
   * the same on every rank, in order. NULL or no HAS_INIT_SCALABLE: comm_init. */
  int (*comm_init_scalable)(void **bcomm, int nranks, const ncfsm_unique_id *ids, int nids, int rank,
                            const ncfsm__comm_config *cfg);
  /* cudaLaunchHostFunc: fn(arg) once everything enqueued on stream so far has
   * completed, on a thread of the runtime (fn must not call the backend).
   * Optional (NULL: completion is seen by polling the events only). */
  int (*host_notify)(void *stream, void (*fn)(void *), void *arg);
  /* ncclCommUserRank + ncclCommCount: a split child's rank and size are known
   * only to NCCL (they depend on every rank's color and key). */
  int (*comm_rank_size)(void *bcomm, int *rank, int *size);

  /* Process-wide last error text (ncclGetLastError ignores its comm). */
  const char *(*last_error)(void *bcomm);

  int (*stream_create)(int device, void **stream);
  int (*stream_destroy)(void *stream);
  /* Device of a stream; sets *device to -1 when unknown (legacy default stream). */
  int (*stream_device)(void *stream, int *device);
  int (*event_create)(int device, void **ev);
  int (*event_record)(void *ev, void *stream);
  /* 0 = complete, 1 = not complete yet, other = error. */
  int (*event_query)(void *ev);
  int (*event_elapsed_ms)(void *start, void *stop, float *ms);
  int (*event_destroy)(void *ev);
  /* Number of visible devices (0 for none). */
  int (*device_count)(void);
  /* Device memory (sim/null: NULL here, host memory is used). 0 on success. */
  int (*mem_alloc)(int device, size_t bytes, void **ptr);
  int (*mem_free)(int device, void *ptr);
  int (*memcpy_sync)(int device, void *dst, const void *src, size_t bytes, int to_device);
  /* Optional: an event that can (timing 1) or need not (0) measure time;
   * NULL: event_create, which always can. */
  int (*event_create_flags)(int device, int timing, void **ev);
  /* Optional: NCFSM__HAS_* for one communicator (the sim can model a 2.28.3
   * runtime per comm); NULL: features() holds for every comm. */
  unsigned (*comm_features)(void *bcomm);
} ncfsm__backend;

extern const ncfsm__backend ncfsm__backend_sim;
extern const ncfsm__backend ncfsm__backend_null; /* benchmarks: zero-cost ops */
/* Tests only: every null group end spins this many ns (0, the default: none),
 * a launch made expensive (tests/unit/test_coalesce.c); set it while no loop
 * thread runs. */
extern uint64_t ncfsm__null_group_end_ns;
#ifdef NCFSM_HAVE_NCCL
extern const ncfsm__backend ncfsm__backend_nccl;
#endif

/* Starts fn(arg) on a detached thread of its own (a backend's helper that
 * lives as long as the process: the nccl wake thread, the sim's device
 * thread): 0 when started, else pthread_create's error. */
int ncfsm__thread_detached(void *(*fn)(void *), void *arg);

/* The backend for a kind; AUTO resolves through NCFSM_BACKEND, then to nccl
 * when a GPU is visible, else sim. NULL with a reason when unavailable. */
const ncfsm__backend *ncfsm__backend_get(ncfsm_backend_kind_t kind, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif
