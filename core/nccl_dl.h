/*
 * What the nccl backend found when it loaded NCCL and the CUDA runtime with
 * dlopen (core/nccl_load.c). For tools (ncfsm-info) and diagnostics; the
 * engine only uses the ncfsm__backend table. Plain C: no CUDA or NCCL types,
 * so a program can include it without the CUDA include directory.
 *
 * Only declared in builds with NCFSM_HAVE_NCCL (the functions live in
 * core/nccl_load.c and core/nccl_device.c).
 */
#ifndef NCFSM_CORE_NCCL_DL_H
#define NCFSM_CORE_NCCL_DL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NCFSM__NCCL_PATH_MAX 1024
#define NCFSM__NCCL_WHY_MAX 512

/*
 * The optional NCCL entry points: the one table the backend resolves
 * (core/nccl_load.c) and ncfsm-info lists, in this order (the first five as
 * ncfsm-info always listed them, then by version). Each row: the name; the first
 * NCCL_VERSION_CODE that has it (read from each release's nccl.h: 2.28.3,
 * 2.28.9, 2.29.2, 2.29.3, 2.29.7, 2.30.3, 2.30.7, 2.31.2, 2.32.3); the
 * NCFSM__HAS_* bit of core/backend.h it gives (a bit needs every row that
 * names it; 0: reported, not used by ncfsm); the rule (docs/nccl-rules.md) or ""; and
 * what ncfsm does with it. An entry point is used only when the runtime
 * exports it and ncclGetVersion is at least its version: an older runtime
 * that exports the name may have another prototype.
 */
#define NCFSM__NCCL_OPTIONAL(X)                                                                      \
  X(ncclCommRevoke, 22807, NCFSM__HAS_REVOKE, "R6", "ncfsm_comm_revoke, on_error revoke")            \
  X(ncclCommShrink, 22703, NCFSM__HAS_SHRINK, "R7", "ncfsm_comm_shrink, recovery")                   \
  X(ncclAlltoAll, 22803, NCFSM__HAS_ALLTOALL, "", "NCFSM_KIND_ALLTOALL")                             \
  X(ncclGather, 22803, NCFSM__HAS_GATHER, "", "NCFSM_KIND_GATHER")                                   \
  X(ncclScatter, 22803, NCFSM__HAS_SCATTER, "", "NCFSM_KIND_SCATTER")                                \
  X(ncclCommSplit, 21801, NCFSM__HAS_SPLIT, "R8", "ncfsm_comm_split")                                \
  X(ncclCommInitRankScalable, 22304, NCFSM__HAS_INIT_SCALABLE, "", "init with NCFSM_INIT_ROOTS > 1") \
  X(ncclCommGetUniqueId, 22902, NCFSM__HAS_GROW, "", "ncfsm_comm_grow_id")                           \
  X(ncclCommGrow, 22902, NCFSM__HAS_GROW, "", "ncfsm_comm_grow")                                     \
  X(ncclPutSignal, 22902, 0, "", "one-sided put with a signal, on a stream: no ncfsm operation")     \
  X(ncclSignal, 22902, 0, "", "a signal to a peer, on a stream: no ncfsm operation")                 \
  X(ncclWaitSignal, 22902, 0, "", "a wait for signals, on a stream: no ncfsm operation")             \
  X(ncclCommSuspend, 22907, 0, "", "a suspended comm cannot be used: no ncfsm state")                \
  X(ncclCommResume, 22907, 0, "", "ends a suspend")                                                  \
  X(ncclCommMemStats, 22907, 0, "", "a comm's GPU memory (suspendable, persistent)")                 \
  X(ncclAllReduceConfig, 23102, 0, "", "per-collective ncclCollConfig_t; its launchCompletionEvent " \
                                       "(2.32.3): docs/nccl-backend.md")                             \
  X(ncclBroadcastConfig, 23102, 0, "", "per-collective ncclCollConfig_t")                            \
  X(ncclReduceConfig, 23102, 0, "", "per-collective ncclCollConfig_t")                               \
  X(ncclAllGatherConfig, 23102, 0, "", "per-collective ncclCollConfig_t")                            \
  X(ncclReduceScatterConfig, 23102, 0, "", "per-collective ncclCollConfig_t")                        \
  X(ncclAlltoAllConfig, 23102, 0, "", "per-collective ncclCollConfig_t")                             \
  X(ncclGatherConfig, 23102, 0, "", "per-collective ncclCollConfig_t")                               \
  X(ncclScatterConfig, 23102, 0, "", "per-collective ncclCollConfig_t")

/* NCFSM__NCCL_OPT_<name>: a row's index. */
enum {
#define NCFSM__NCCL_OPT_INDEX(name, since, bit, rule, use) NCFSM__NCCL_OPT_##name,
  NCFSM__NCCL_OPTIONAL(NCFSM__NCCL_OPT_INDEX)
#undef NCFSM__NCCL_OPT_INDEX
  NCFSM__NCCL_OPT_COUNT
};

typedef struct ncfsm__nccl_info {
  /* Build time: the headers the backend was compiled with. */
  int header_nccl_version;   /* NCCL_VERSION_CODE */
  int header_cudart_version; /* CUDART_VERSION */

  /* libnccl.so.2 */
  int nccl_loaded;                     /* dlopen and the required symbols succeeded */
  int nccl_version;                    /* ncclGetVersion; 0 when not loaded */
  char nccl_path[NCFSM__NCCL_PATH_MAX]; /* the file dlopen found ("" when not loaded) */
  char nccl_why[NCFSM__NCCL_WHY_MAX];   /* why not loaded ("" when loaded) */
  int nccl_not_found;                  /* dlopen found no libnccl.so.2 (else: it is not a usable NCCL) */
  unsigned features;                   /* NCFSM__HAS_* (core/backend.h) */
  uint64_t opt_exported;               /* bit NCFSM__NCCL_OPT_x: dlsym found it */
  uint64_t opt_used;                   /* ... and the runtime is at least its version: resolved */

  /* libcudart */
  int cudart_loaded;
  int cudart_version;                    /* cudaRuntimeGetVersion; 0 when unknown */
  int driver_version;                    /* cudaDriverGetVersion; 0 when no driver */
  char driver_why[NCFSM__NCCL_WHY_MAX];  /* with no driver: why libcuda.so.1 did not load */
  char cudart_path[NCFSM__NCCL_PATH_MAX];
  char cudart_why[NCFSM__NCCL_WHY_MAX];
  int has_stream_get_device;             /* cudaStreamGetDevice (CUDA >= 12.8) resolved */

  /* cudaGetDeviceCount */
  int device_count;                      /* 0 on error */
  int device_count_rc;                   /* its cudaError_t (0 = success) */
  char device_why[NCFSM__NCCL_WHY_MAX];  /* cudaGetErrorString text when it failed */

  /* The backend's open(): 0 when usable, else why: the first failure above
   * (no NCCL, no CUDA runtime, no driver, no device), what to do instead
   * (NCFSM_BACKEND=sim or auto), then details. */
  int open_rc;
  char open_why[NCFSM__NCCL_WHY_MAX];
} ncfsm__nccl_info;

/* Loads the libraries (as open() does, once per process) and fills *out. */
void ncfsm__nccl_get_info(ncfsm__nccl_info *out);

typedef struct ncfsm__nccl_device_info {
  int ordinal;
  char name[256];        /* cuDeviceGetName ("" when the driver API is unavailable) */
  char pci_bus_id[32];   /* cudaDeviceGetPCIBusId, "domain:bus:device.function" */
  uint64_t total_mem;    /* bytes, cuDeviceTotalMem (0 when unavailable) */
  int cc_major, cc_minor;/* compute capability */
} ncfsm__nccl_device_info;

/* Describes visible device `ordinal` without creating a CUDA context. 0 on
 * success; else nonzero with the reason in why. */
int ncfsm__nccl_device_info_get(int ordinal, ncfsm__nccl_device_info *out, char *why, size_t why_len);

/* "2.28.9" for 22809 (also the pre-2.9 encoding X*1000+Y*100+Z). */
void ncfsm__nccl_version_str(int code, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
