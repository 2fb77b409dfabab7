/*
 * The nccl backend's internals, shared by its files only (docs/nccl-backend.md):
 *
 *   nccl_load.c     the dlsym tables, loading libnccl and libcudart once per
 *                   process, what was found (ncfsm__nccl_info), the backend's
 *                   own errors and the current device
 *   nccl_device.c   device descriptions through the driver API (ncfsm-info)
 *   nccl_stream.c   streams, events, device memory and push completion's wakeup
 *   backend_nccl.c  communicators, groups, operations, split/shrink/grow and
 *                   the ncfsm__backend table
 *
 * The headers (nccl.h, cuda_runtime_api.h, cuda.h) give types, constants and
 * prototypes only; every function is called through the tables below, which
 * nccl_load.c fills with dlsym.
 */
#ifndef NCFSM_CORE_NCCL_INTERNAL_H
#define NCFSM_CORE_NCCL_INTERNAL_H

/* nccl.h declares ncclGroupStart() and friends without (void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#pragma GCC diagnostic pop

#include "core/backend.h"
#include "core/nccl_dl.h"

/* NCCL 2.29 entry points ncfsm calls: the 2.28 headers do not declare them,
 * so they get prototypes of their own here (from NCCL 2.29.2's nccl.h). */
typedef ncclResult_t (*ncfsm__nccl_comm_get_unique_id_fn)(ncclComm_t comm, ncclUniqueId *uniqueId);
typedef ncclResult_t (*ncfsm__nccl_comm_grow_fn)(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId,
                                                 int rank, ncclComm_t *newcomm, ncclConfig_t *config);

/* ---- function tables ------------------------------------------------------------------ */

/* NCCL entry points every supported runtime has. */
#define NCCL_REQUIRED(X) \
  X(ncclGetVersion)      \
  X(ncclGetUniqueId)     \
  X(ncclCommInitRankConfig) \
  X(ncclCommGetAsyncError) \
  X(ncclCommFinalize)    \
  X(ncclCommDestroy)     \
  X(ncclCommAbort)       \
  X(ncclGetLastError)    \
  X(ncclGetErrorString)  \
  X(ncclCommUserRank)    \
  X(ncclCommCount)       \
  X(ncclAllReduce)       \
  X(ncclBroadcast)       \
  X(ncclReduce)          \
  X(ncclAllGather)       \
  X(ncclReduceScatter)   \
  X(ncclSend)            \
  X(ncclRecv)

/* The optional ones: NCFSM__NCCL_OPTIONAL (core/nccl_dl.h). */

/* CUDA runtime entry points (stable names in CUDA 12 and 13; none is a
 * versioned macro in cuda_runtime_api.h without per-thread default streams). */
#define CUDART_REQUIRED(X)    \
  X(cudaGetDeviceCount)       \
  X(cudaSetDevice)            \
  X(cudaGetLastError)         \
  X(cudaGetErrorString)       \
  X(cudaGetErrorName)         \
  X(cudaRuntimeGetVersion)    \
  X(cudaDriverGetVersion)     \
  X(cudaStreamCreateWithFlags) \
  X(cudaStreamDestroy)        \
  X(cudaLaunchHostFunc)       \
  X(cudaEventCreateWithFlags) \
  X(cudaEventRecord)          \
  X(cudaEventQuery)           \
  X(cudaEventElapsedTime)     \
  X(cudaEventDestroy)         \
  X(cudaEventSynchronize)     \
  X(cudaMalloc)               \
  X(cudaFree)                 \
  X(cudaMemcpy)               \
  X(cudaDeviceGetPCIBusId)    \
  X(cudaDeviceGetAttribute)

#define NCFSM__NCCL_FIELD(name) __typeof__(&name) name;

typedef struct ncfsm__nccl_syms {
  NCCL_REQUIRED(NCFSM__NCCL_FIELD)
  /* Declared as name() in nccl.h: give them real prototypes. */
  ncclResult_t (*ncclGroupStart)(void);
  ncclResult_t (*ncclGroupEnd)(void);
  /* The optional ones, by NCFSM__NCCL_OPT_<name>: NULL when the runtime lacks
   * one or is older than its version. Called through NCCL_OPT / NCCL_OPT_AS. */
  void *opt[NCFSM__NCCL_OPT_COUNT];
} ncfsm__nccl_syms;

/* An optional entry point, typed from the headers' prototype (a prototype
 * change is a compile error), or NULL. */
#define NCCL_OPT(name) ((__typeof__(&name))ncfsm__nc.opt[NCFSM__NCCL_OPT_##name])
/* The same for one the build's headers do not declare, with its own type. */
#define NCCL_OPT_AS(name, type) ((type)ncfsm__nc.opt[NCFSM__NCCL_OPT_##name])

typedef struct ncfsm__cudart_syms {
  CUDART_REQUIRED(NCFSM__NCCL_FIELD)
  __typeof__(&cudaStreamGetDevice) cudaStreamGetDevice; /* CUDA >= 12.8; NULL when absent */
} ncfsm__cudart_syms;

/* Filled once per process (ncfsm__nccl_load); read-only afterwards. */
extern ncfsm__nccl_syms ncfsm__nc;
extern ncfsm__cudart_syms ncfsm__rt;
extern ncfsm__nccl_info ncfsm__nccl_found;

/* Loads the libraries once per process (pthread_once) and fills the above. */
void ncfsm__nccl_load(void);

/* ---- errors and the current device (per thread) --------------------------------------- */

/* Errors the backend makes itself (missing entry point, CUDA failure);
 * last_error() shows it until NCCL reports a newer error. */
extern _Thread_local char ncfsm__nccl_err[512];
extern _Thread_local int ncfsm__nccl_err_set;
/* The device this thread last set through this backend (-1: unknown). */
extern _Thread_local int ncfsm__nccl_dev;

void ncfsm__nccl_own_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* An NCCL result: a real error makes NCCL's own text the latest. */
static inline int ncfsm__nccl_res(ncclResult_t r) {
  if (__builtin_expect(r != ncclSuccess && r != ncclInProgress, 0)) ncfsm__nccl_err_set = 0;
  return (int)r;
}

/* dlerror(), or a fixed text when it has none. */
const char *ncfsm__nccl_dl_error(void);
/* cudaGetErrorString, or a fixed text when the runtime is not loaded. */
const char *ncfsm__nccl_cuda_err(cudaError_t e);

/* Clear the runtime's (non-sticky) last error so it does not surface in the
 * application's next cudaGetLastError/cudaPeekAtLastError. */
static inline int ncfsm__nccl_cuda_fail(cudaError_t e) {
  (void)ncfsm__rt.cudaGetLastError();
  return (int)e;
}

/* cudaSetDevice(dev); 0, or its cudaError_t after own_error. */
int ncfsm__nccl_set_device(int dev);
/* Cold paths (init, creation, memory): always set, and refresh the cache. */
static inline int ncfsm__nccl_force_device(int dev) { return dev < 0 ? 0 : ncfsm__nccl_set_device(dev); }
/* Hot paths (ops, event record): skip the call when this thread is already there. */
static inline int ncfsm__nccl_use_device(int dev) {
  if (__builtin_expect(dev == ncfsm__nccl_dev || dev < 0, 1)) return 0;
  return ncfsm__nccl_set_device(dev);
}

/* 1 (after own_error) when the backend cannot be used on this machine. */
int ncfsm__nccl_not_usable(void);
/* A missing optional entry point NCFSM__NCCL_OPT_x (R6): the error naming it
 * and the version that has it, and ncclInvalidUsage, before NCCL is reached. */
int ncfsm__nccl_missing(int opt);

/* ---- streams, events, memory (nccl_stream.c) -------------------------------------------- */
int ncfsm__nccl_stream_create(int device, void **stream);
int ncfsm__nccl_stream_destroy(void *stream);
int ncfsm__nccl_stream_device(void *stream, int *device);
int ncfsm__nccl_event_create(int device, void **ev);
int ncfsm__nccl_event_create_flags(int device, int timing, void **ev);
int ncfsm__nccl_event_record(void *ev, void *stream);
int ncfsm__nccl_event_query(void *ev);
int ncfsm__nccl_event_elapsed_ms(void *start, void *stop, float *ms);
int ncfsm__nccl_event_destroy(void *ev);
int ncfsm__nccl_host_notify(void *stream, void (*fn)(void *), void *arg);
int ncfsm__nccl_mem_alloc(int device, size_t bytes, void **ptr);
int ncfsm__nccl_mem_free(int device, void *ptr);
int ncfsm__nccl_memcpy_sync(int device, void *dst, const void *src, size_t bytes, int to_device);

#endif
