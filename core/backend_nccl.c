/*
 * The nccl backend: real NCCL and the CUDA runtime, both loaded with dlopen
 * at run time (docs/nccl-backend.md).
 *
 * The headers (nccl.h, cuda_runtime_api.h, cuda.h) give types, constants and
 * prototypes only; every function is resolved with dlsym into a table of
 * pointers typed from the header's prototypes. Nothing links libnccl or
 * libcudart, so one binary built against the NCCL 2.28.9 headers runs with
 * the GPU host's system NCCL 2.28.3 or the torch wheel's 2.28.9, whichever
 * LD_LIBRARY_PATH finds first. Entry points newer than the oldest supported
 * runtime are optional (R6, R7): features() says which exist, and calling a
 * missing one fails with ncclInvalidUsage and a last-error text naming the
 * version that has it.
 *
 * Threads: open() and the loading run once per process (pthread_once). All
 * other calls come from the loop thread (R9), which may drive several GPUs:
 * the device is set before every call that depends on the current device,
 * with a per-thread cache of the device last set here.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dlinfo, dladdr, RTLD_NOLOAD */
#endif

#include <assert.h>
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* nccl.h declares ncclGroupStart() and friends without (void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#pragma GCC diagnostic pop

#include "core/backend.h"
#include "core/log.h"
#include "core/nccl_dl.h"

/* ---- the ABI contract with the headers -------------------------------------------- */

static_assert(sizeof(ncfsm_unique_id) == sizeof(ncclUniqueId), "ncfsm_unique_id must be an ncclUniqueId");
static_assert(NCFSM_UNIQUE_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "unique id size");
static_assert(NCFSM__NCCL_SUCCESS == (int)ncclSuccess && NCFSM__NCCL_UNHANDLED_CUDA_ERROR == (int)ncclUnhandledCudaError &&
                  NCFSM__NCCL_SYSTEM_ERROR == (int)ncclSystemError &&
                  NCFSM__NCCL_INTERNAL_ERROR == (int)ncclInternalError &&
                  NCFSM__NCCL_INVALID_ARGUMENT == (int)ncclInvalidArgument &&
                  NCFSM__NCCL_INVALID_USAGE == (int)ncclInvalidUsage &&
                  NCFSM__NCCL_REMOTE_ERROR == (int)ncclRemoteError && NCFSM__NCCL_IN_PROGRESS == (int)ncclInProgress,
              "result codes equal ncclResult_t");
static_assert(NCFSM_INT8 == (int)ncclInt8 && NCFSM_UINT8 == (int)ncclUint8 && NCFSM_INT32 == (int)ncclInt32 &&
                  NCFSM_UINT32 == (int)ncclUint32 && NCFSM_INT64 == (int)ncclInt64 &&
                  NCFSM_UINT64 == (int)ncclUint64 && NCFSM_FLOAT16 == (int)ncclFloat16 &&
                  NCFSM_FLOAT32 == (int)ncclFloat32 && NCFSM_FLOAT64 == (int)ncclFloat64 &&
                  NCFSM_BFLOAT16 == (int)ncclBfloat16,
              "ncfsm_dtype_t equals ncclDataType_t");
static_assert(NCFSM_OP_SUM == (int)ncclSum && NCFSM_OP_PROD == (int)ncclProd && NCFSM_OP_MAX == (int)ncclMax &&
                  NCFSM_OP_MIN == (int)ncclMin && NCFSM_OP_AVG == (int)ncclAvg,
              "ncfsm_redop_t equals ncclRedOp_t");
static_assert(NCFSM__SPLIT_NOCOLOR == NCCL_SPLIT_NOCOLOR, "NCFSM__SPLIT_NOCOLOR equals NCCL_SPLIT_NOCOLOR");
static_assert(NCFSM__SHRINK_DEFAULT == NCCL_SHRINK_DEFAULT && NCFSM__SHRINK_ABORT == NCCL_SHRINK_ABORT,
              "shrink flags equal NCCL's");

/* NCCL 2.29 entry points: the 2.28 headers do not declare them, so they get
 * prototypes of their own here (from NCCL 2.29's nccl.h), used only through
 * dlsym'd pointers. */
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

/* Optional entry points: (name, feature bit, first NCCL_VERSION_CODE that has it). */
#define NCCL_OPTIONAL(X)                          \
  X(ncclCommRevoke, NCFSM__HAS_REVOKE, 22807)     \
  X(ncclCommShrink, NCFSM__HAS_SHRINK, 22703)     \
  X(ncclCommSplit, NCFSM__HAS_SPLIT, 21801)       \
  X(ncclCommInitRankScalable, NCFSM__HAS_INIT_SCALABLE, 22304) \
  X(ncclAlltoAll, NCFSM__HAS_ALLTOALL, 22803)     \
  X(ncclGather, NCFSM__HAS_GATHER, 22803)         \
  X(ncclScatter, NCFSM__HAS_SCATTER, 22803)

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

#define FIELD(name) __typeof__(&name) name;
#define FIELD_OPT(name, bit, since) __typeof__(&name) name;

static struct {
  NCCL_REQUIRED(FIELD)
  NCCL_OPTIONAL(FIELD_OPT)
  /* Declared as name() in nccl.h: give them real prototypes. */
  ncclResult_t (*ncclGroupStart)(void);
  ncclResult_t (*ncclGroupEnd)(void);
  /* NCCL >= 2.29 (NCFSM__HAS_GROW when both resolve). */
  ncfsm__nccl_comm_get_unique_id_fn ncclCommGetUniqueId;
  ncfsm__nccl_comm_grow_fn ncclCommGrow;
} nc;

static struct {
  CUDART_REQUIRED(FIELD)
  __typeof__(&cudaStreamGetDevice) cudaStreamGetDevice; /* CUDA >= 12.8; NULL when absent */
} rt;

/* Driver API: only for device names and memory sizes (ncfsm-info). */
static struct {
  __typeof__(&cuInit) cuInit;
  __typeof__(&cuDeviceGet) cuDeviceGet;
  __typeof__(&cuDeviceGetName) cuDeviceGetName;
  __typeof__(&cuDeviceTotalMem) cuDeviceTotalMem; /* cuDeviceTotalMem_v2 */
} drv;

/* ---- load state (written once under pthread_once) ------------------------------------ */

static struct {
  void *hnccl, *hcudart;
  ncfsm__nccl_info info;
} g;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* ---- per-thread state -------------------------------------------------------------------- */

/* The device this thread last set through this backend (-1: unknown). */
static _Thread_local int tls_dev = -1;
/* Errors the backend makes itself (missing entry point, CUDA failure);
 * last_error() shows it until NCCL reports a newer error. */
static _Thread_local char tls_err[512];
static _Thread_local int tls_err_set;

__attribute__((format(printf, 1, 2))) static void own_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_err, sizeof tls_err, fmt, ap);
  va_end(ap);
  tls_err_set = 1;
}

/* An NCCL result: a real error makes NCCL's own text the latest. */
static inline int nres(ncclResult_t r) {
  if (__builtin_expect(r != ncclSuccess && r != ncclInProgress, 0)) tls_err_set = 0;
  return (int)r;
}

static const char *cuda_err(cudaError_t e) {
  return rt.cudaGetErrorString ? rt.cudaGetErrorString(e) : "unknown CUDA error";
}

/* Clear the runtime's (non-sticky) last error so it does not surface in the
 * application's next cudaGetLastError/cudaPeekAtLastError. */
static inline int cuda_fail(cudaError_t e) {
  (void)rt.cudaGetLastError();
  return (int)e;
}

static int set_device(int dev) {
  cudaError_t e = rt.cudaSetDevice(dev);
  if (e != cudaSuccess) {
    tls_dev = -1;
    (void)rt.cudaGetLastError();
    own_error("cudaSetDevice(%d) failed: %s", dev, cuda_err(e));
    return (int)e;
  }
  tls_dev = dev;
  return 0;
}
/* Cold paths (init, creation, memory): always set, and refresh the cache. */
static int force_device(int dev) { return dev < 0 ? 0 : set_device(dev); }
/* Hot paths (ops, event record): skip the call when this thread is already there. */
static inline int use_device(int dev) {
  if (__builtin_expect(dev == tls_dev || dev < 0, 1)) return 0;
  return set_device(dev);
}

/* ---- versions --------------------------------------------------------------------------- */

void ncfsm__nccl_version_str(int code, char *buf, size_t len) {
  if (code <= 0) snprintf(buf, len, "unknown");
  else if (code >= 10000) snprintf(buf, len, "%d.%d.%d", code / 10000, code % 10000 / 100, code % 100);
  else snprintf(buf, len, "%d.%d.%d", code / 1000, code % 1000 / 100, code % 100);
}

/* ---- loading ------------------------------------------------------------------------------ */

static void lib_path(void *h, void *sym, char *buf, size_t len) {
  struct link_map *lm = NULL;
  buf[0] = '\0';
  if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0]) {
    snprintf(buf, len, "%s", lm->l_name);
    return;
  }
  Dl_info di;
  if (sym && dladdr(sym, &di) && di.dli_fname) snprintf(buf, len, "%s", di.dli_fname);
}

static const char *dl_error(void) {
  const char *e = dlerror();
  return e ? e : "unknown dlerror";
}

static void load_nccl(ncfsm__nccl_info *in) {
  (void)dlerror();
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(in->nccl_why, sizeof in->nccl_why,
             "libnccl.so.2 not found: %s (put the directory of libnccl.so.2 on LD_LIBRARY_PATH: the system "
             "NCCL or the nvidia-nccl wheel's nvidia/nccl/lib)",
             dl_error());
    return;
  }
  const char *missing = NULL;
#define RESOLVE(name) \
  if (!missing && !(nc.name = (__typeof__(nc.name))dlsym(h, #name))) missing = #name;
  NCCL_REQUIRED(RESOLVE)
  RESOLVE(ncclGroupStart)
  RESOLVE(ncclGroupEnd)
#undef RESOLVE
  lib_path(h, (void *)nc.ncclGetVersion, in->nccl_path, sizeof in->nccl_path);
  if (missing) {
    snprintf(in->nccl_why, sizeof in->nccl_why,
             "libnccl.so.2 (%.300s) has no %s: not a supported NCCL (ncfsm needs NCCL >= 2.14 with "
             "nonblocking communicators; tested on 2.28.x)",
             in->nccl_path, missing);
    memset(&nc, 0, sizeof nc);
    dlclose(h);
    in->nccl_path[0] = '\0';
    return;
  }
  unsigned feats = 0;
#define RESOLVE_OPT(name, bit, since) \
  if ((nc.name = (__typeof__(nc.name))dlsym(h, #name)) != NULL) feats |= (bit);
  NCCL_OPTIONAL(RESOLVE_OPT)
#undef RESOLVE_OPT
  nc.ncclCommGetUniqueId = (ncfsm__nccl_comm_get_unique_id_fn)dlsym(h, "ncclCommGetUniqueId");
  nc.ncclCommGrow = (ncfsm__nccl_comm_grow_fn)dlsym(h, "ncclCommGrow");
  if (nc.ncclCommGetUniqueId && nc.ncclCommGrow) feats |= NCFSM__HAS_GROW;
  int v = 0;
  if (nc.ncclGetVersion(&v) != ncclSuccess) v = 0;
  g.hnccl = h;
  in->nccl_loaded = 1;
  in->nccl_version = v;
  in->features = feats;
  if (v < 22800) {
    char vs[32];
    ncfsm__nccl_version_str(v, vs, sizeof vs);
    NCFSM_WARN(NCFSM__SUB_BACKEND,
               "NCCL %s (%s) is older than 2.28: NCCL-RULES were measured on 2.28.3/2.28.9; behaviour may "
               "differ",
               vs, in->nccl_path);
  }
}

static void load_cudart(ncfsm__nccl_info *in) {
  /* Prefer a runtime the process already has (torch loads its own), then
   * search: the CUDA 13 runtime, then 12, then whatever libcudart.so is. */
  static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  const size_t nn = sizeof names / sizeof names[0];
  char errs[NCFSM__NCCL_WHY_MAX] = "";
  size_t off = 0;
  void *h = NULL;
  for (int pass = 0; pass < 2 && !h; pass++) {
    for (size_t i = 0; i < nn && !h; i++) {
      (void)dlerror();
      h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | (pass == 0 ? RTLD_NOLOAD : 0));
      if (!h && pass == 1 && off < sizeof errs) {
        int n = snprintf(errs + off, sizeof errs - off, "%s%s", off ? "; " : "", dl_error());
        if (n > 0) off += (size_t)n;
      }
    }
  }
  if (!h) {
    snprintf(in->cudart_why, sizeof in->cudart_why, "CUDA runtime (libcudart.so.13/.12) not found: %.400s", errs);
    return;
  }
  const char *missing = NULL;
#define RESOLVE(name) \
  if (!missing && !(rt.name = (__typeof__(rt.name))dlsym(h, #name))) missing = #name;
  CUDART_REQUIRED(RESOLVE)
#undef RESOLVE
  lib_path(h, (void *)rt.cudaGetDeviceCount, in->cudart_path, sizeof in->cudart_path);
  if (missing) {
    snprintf(in->cudart_why, sizeof in->cudart_why, "CUDA runtime %.300s has no %s", in->cudart_path, missing);
    memset(&rt, 0, sizeof rt);
    dlclose(h);
    in->cudart_path[0] = '\0';
    return;
  }
  rt.cudaStreamGetDevice = (__typeof__(rt.cudaStreamGetDevice))dlsym(h, "cudaStreamGetDevice");
  g.hcudart = h;
  in->cudart_loaded = 1;
  in->has_stream_get_device = rt.cudaStreamGetDevice != NULL;
  int v = 0;
  if (rt.cudaRuntimeGetVersion(&v) == cudaSuccess) in->cudart_version = v;
  v = 0;
  if (rt.cudaDriverGetVersion(&v) == cudaSuccess) in->driver_version = v;
  (void)rt.cudaGetLastError();

  int n = 0;
  cudaError_t e = rt.cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    in->device_count = 0;
    in->device_count_rc = (int)e;
    snprintf(in->device_why, sizeof in->device_why, "cudaGetDeviceCount failed: %s (%s)", rt.cudaGetErrorString(e),
             rt.cudaGetErrorName(e));
    (void)rt.cudaGetLastError();
  } else {
    in->device_count = n;
    if (n == 0) snprintf(in->device_why, sizeof in->device_why, "no CUDA device visible (cudaGetDeviceCount returned 0)");
  }
}

static void load_once(void) {
  ncfsm__nccl_info *in = &g.info;
  in->header_nccl_version = NCCL_VERSION_CODE;
  in->header_cudart_version = CUDART_VERSION;
  load_nccl(in);
  load_cudart(in);
  const char *why = !in->nccl_loaded ? in->nccl_why
                    : !in->cudart_loaded ? in->cudart_why
                    : in->device_count <= 0 ? in->device_why
                                            : NULL;
  if (why) {
    in->open_rc = 1;
    snprintf(in->open_why, sizeof in->open_why, "%s", why);
    NCFSM_INFO(NCFSM__SUB_BACKEND, "nccl backend unavailable: %s", why);
    return;
  }
  char nv[32];
  ncfsm__nccl_version_str(in->nccl_version, nv, sizeof nv);
  NCFSM_INFO(NCFSM__SUB_BACKEND,
             "nccl backend: NCCL %s (%s), CUDA runtime %d.%d (%s), driver %d.%d, %d device(s); optional:%s%s%s%s%s%s%s",
             nv, in->nccl_path, in->cudart_version / 1000, in->cudart_version % 1000 / 10, in->cudart_path,
             in->driver_version / 1000, in->driver_version % 1000 / 10, in->device_count,
             in->features & NCFSM__HAS_REVOKE ? " Revoke" : "", in->features & NCFSM__HAS_SHRINK ? " Shrink" : "",
             in->features & NCFSM__HAS_ALLTOALL ? " AlltoAll" : "", in->features & NCFSM__HAS_GATHER ? " Gather" : "",
             in->features & NCFSM__HAS_SCATTER ? " Scatter" : "", in->features & NCFSM__HAS_SPLIT ? " Split" : "",
             in->features & NCFSM__HAS_GROW ? " Grow" : "");
}

static inline void ensure_loaded(void) { pthread_once(&g_once, load_once); }

void ncfsm__nccl_get_info(ncfsm__nccl_info *out) {
  ensure_loaded();
  *out = g.info;
}

/* ---- device description (ncfsm-info) -------------------------------------------------- */

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static int drv_ok;
static char drv_why[256];

static void load_driver(void) {
  (void)dlerror();
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(drv_why, sizeof drv_why, "libcuda.so.1 not found: %s", dl_error());
    return;
  }
  drv.cuInit = (__typeof__(drv.cuInit))dlsym(h, "cuInit");
  drv.cuDeviceGet = (__typeof__(drv.cuDeviceGet))dlsym(h, "cuDeviceGet");
  drv.cuDeviceGetName = (__typeof__(drv.cuDeviceGetName))dlsym(h, "cuDeviceGetName");
  drv.cuDeviceTotalMem = (__typeof__(drv.cuDeviceTotalMem))dlsym(h, "cuDeviceTotalMem_v2");
  if (!drv.cuInit || !drv.cuDeviceGet || !drv.cuDeviceGetName || !drv.cuDeviceTotalMem) {
    snprintf(drv_why, sizeof drv_why, "libcuda.so.1 lacks cuInit/cuDeviceGet/cuDeviceGetName/cuDeviceTotalMem_v2");
    return;
  }
  CUresult r = drv.cuInit(0);
  if (r != CUDA_SUCCESS) {
    snprintf(drv_why, sizeof drv_why, "cuInit failed (CUresult %d)", (int)r);
    return;
  }
  drv_ok = 1;
}

int ncfsm__nccl_device_info_get(int ordinal, ncfsm__nccl_device_info *out, char *why, size_t why_len) {
  ensure_loaded();
  memset(out, 0, sizeof *out);
  out->ordinal = ordinal;
  if (!g.info.cudart_loaded) {
    snprintf(why, why_len, "%s", g.info.cudart_why);
    return 1;
  }
  if (ordinal < 0 || ordinal >= g.info.device_count) {
    snprintf(why, why_len, "device %d is not visible (%d device(s))", ordinal, g.info.device_count);
    return 1;
  }
  why[0] = '\0';
  cudaError_t e = rt.cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, ordinal);
  if (e != cudaSuccess) {
    snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "?");
    (void)rt.cudaGetLastError();
  }
  if (rt.cudaDeviceGetAttribute(&out->cc_major, cudaDevAttrComputeCapabilityMajor, ordinal) != cudaSuccess ||
      rt.cudaDeviceGetAttribute(&out->cc_minor, cudaDevAttrComputeCapabilityMinor, ordinal) != cudaSuccess) {
    out->cc_major = out->cc_minor = 0;
    (void)rt.cudaGetLastError();
  }
  pthread_once(&drv_once, load_driver);
  if (!drv_ok) {
    snprintf(why, why_len, "%s", drv_why);
    return 0; /* partial: bus id and compute capability only */
  }
  CUdevice d;
  if (drv.cuDeviceGet(&d, ordinal) == CUDA_SUCCESS) {
    if (drv.cuDeviceGetName(out->name, (int)sizeof out->name, d) != CUDA_SUCCESS) out->name[0] = '\0';
    size_t bytes = 0;
    if (drv.cuDeviceTotalMem(&bytes, d) == CUDA_SUCCESS) out->total_mem = bytes;
  }
  return 0;
}

/* ---- the backend ------------------------------------------------------------------------- */

typedef struct nccl_bcomm {
  ncclComm_t comm;
  int device;
  int blocking;
  char name[64]; /* config.commName must outlive the NCCL comm */
  /* A child of a split/shrink/grow on this (parent) comm that NCCL writes
   * asynchronously (R8): handed to *pend_out when the parent polls to
   * ncclSuccess (NCCL wrote pend->comm, or left it NULL: no child). */
  struct nccl_bcomm *pend;
  void **pend_out;
} nccl_bcomm;

typedef struct nccl_event {
  cudaEvent_t ev;
  int device;
} nccl_event;

static int b_open(char *why, size_t why_len) {
  ensure_loaded();
  if (why && why_len) snprintf(why, why_len, "%s", g.info.open_rc ? g.info.open_why : "");
  return g.info.open_rc;
}

static int b_version(void) {
  ensure_loaded();
  return g.info.nccl_version;
}

static unsigned b_features(void) {
  ensure_loaded();
  return g.info.features;
}

static int not_usable(void) {
  ensure_loaded();
  if (!g.info.open_rc) return 0;
  own_error("nccl backend unavailable: %s", g.info.open_why);
  return 1;
}

/* A missing optional entry point (R6): refuse before NCCL is reached. */
static int missing(const char *name, int since) {
  char have[32], need[32];
  ncfsm__nccl_version_str(g.info.nccl_version, have, sizeof have);
  ncfsm__nccl_version_str(since, need, sizeof need);
  if (g.info.nccl_version >= since)
    own_error("%s not exported by this NCCL runtime (%s, %s)", name, have, g.info.nccl_path);
  else
    own_error("%s not in this NCCL runtime (%s); needs >= %s", name, have, need);
  return ncclInvalidUsage;
}

static int b_get_unique_id(ncfsm_unique_id *id) {
  if (not_usable()) return ncclSystemError;
  ncclUniqueId uid;
  ncclResult_t r = nc.ncclGetUniqueId(&uid);
  if (r == ncclSuccess) memcpy(id, &uid, sizeof uid);
  return nres(r);
}

static int b_comm_init(void **bcomm, int nranks, const ncfsm_unique_id *id, int rank,
                       const ncfsm__comm_config *cfg) {
  *bcomm = NULL;
  if (not_usable()) return ncclSystemError;
  nccl_bcomm *bc = calloc(1, sizeof *bc);
  if (!bc) {
    own_error("out of host memory for a communicator");
    return ncclSystemError;
  }
  bc->device = cfg->device;
  if (force_device(cfg->device) != 0) { /* own_error set */
    free(bc);
    return ncclUnhandledCudaError;
  }
  bc->blocking = cfg->blocking ? 1 : 0;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = cfg->blocking ? 1 : 0;
  if (cfg->name && cfg->name[0]) {
    snprintf(bc->name, sizeof bc->name, "%s", cfg->name);
    config.commName = bc->name;
  }
  ncclUniqueId uid;
  memcpy(&uid, id, sizeof uid);
  ncclResult_t r = nc.ncclCommInitRankConfig(&bc->comm, nranks, uid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress && !bc->comm) {
    free(bc);
    return nres(r);
  }
  /* On an error with a handle, hand it over so that the engine aborts it. */
  *bcomm = bc;
  return nres(r);
}

/* ncclCommInitRankScalable: as b_comm_init, with nids unique ids. */
static int b_comm_init_scalable(void **bcomm, int nranks, const ncfsm_unique_id *ids, int nids, int rank,
                                const ncfsm__comm_config *cfg) {
  *bcomm = NULL;
  if (not_usable()) return ncclSystemError;
  if (!nc.ncclCommInitRankScalable) return missing("ncclCommInitRankScalable", 22304);
  nccl_bcomm *bc = calloc(1, sizeof *bc);
  ncclUniqueId *u = calloc((size_t)(nids > 0 ? nids : 1), sizeof *u);
  if (!bc || !u) {
    free(bc);
    free(u);
    own_error("out of host memory for a communicator");
    return ncclSystemError;
  }
  bc->device = cfg->device;
  if (force_device(cfg->device) != 0) {
    free(bc);
    free(u);
    return ncclUnhandledCudaError;
  }
  bc->blocking = cfg->blocking ? 1 : 0;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = cfg->blocking ? 1 : 0;
  if (cfg->name && cfg->name[0]) {
    snprintf(bc->name, sizeof bc->name, "%s", cfg->name);
    config.commName = bc->name;
  }
  for (int j = 0; j < nids; j++) memcpy(&u[j], &ids[j], sizeof u[j]);
  ncclResult_t r = nc.ncclCommInitRankScalable(&bc->comm, nranks, rank, nids, u, &config);
  free(u);
  if (r != ncclSuccess && r != ncclInProgress && !bc->comm) {
    free(bc);
    return nres(r);
  }
  *bcomm = bc;
  return nres(r);
}

/*
 * Push completion's wakeup (issue 11, item 2), two ways (NCFSM_PUSH_WAKE):
 *  - hostfn (default): cudaLaunchHostFunc; fn runs on a CUDA thread once the
 *    stream reaches this point (the stream's later work waits for it);
 *  - event: a blocking-sync event recorded here, and one waiter thread of
 *    this backend that cudaEventSynchronize()s the events in the order they
 *    were given, then runs fn (the stream does not wait for anything).
 * Measured against each other in docs/results/push-1gpu.md.
 */
typedef struct wake_item {
  cudaEvent_t ev;
  void (*fn)(void *);
  void *arg;
  struct wake_item *next;
} wake_item;
static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  wake_item *head, *tail;
  int started; /* 1: the waiter runs; -1: it could not be started */
} wq = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, 0};

static void *wake_main(void *unused) {
  (void)unused;
  for (;;) {
    pthread_mutex_lock(&wq.mu);
    while (!wq.head) pthread_cond_wait(&wq.cv, &wq.mu);
    wake_item *it = wq.head;
    wq.head = it->next;
    if (!wq.head) wq.tail = NULL;
    pthread_mutex_unlock(&wq.mu);
    cudaError_t ce = rt.cudaEventSynchronize(it->ev);
    if (ce != cudaSuccess)
      NCFSM_WARN(NCFSM__SUB_BACKEND, "push wake: cudaEventSynchronize failed: %s (the loop's fallback timer "
                                     "still sees the completion)", cuda_err(ce));
    it->fn(it->arg);
    rt.cudaEventDestroy(it->ev);
    free(it);
  }
  return NULL;
}

static int push_wake_event(void) {
  static int mode = -1;
  if (mode < 0) {
    const char *e = getenv("NCFSM_PUSH_WAKE");
    mode = e && !strcmp(e, "event");
    if (e && strcmp(e, "event") && strcmp(e, "hostfn"))
      NCFSM_WARN(NCFSM__SUB_BACKEND, "NCFSM_PUSH_WAKE=%s is not hostfn or event: hostfn", e);
  }
  return mode;
}

static int host_notify_event(void *stream, void (*fn)(void *), void *arg) {
  int d = -1;
  if (rt.cudaStreamGetDevice && stream && rt.cudaStreamGetDevice((cudaStream_t)stream, &d) == cudaSuccess) {
    int rc = force_device(d);
    if (rc) return rc;
  }
  wake_item *it = calloc(1, sizeof *it);
  if (!it) return (int)cudaErrorMemoryAllocation;
  cudaError_t ce = rt.cudaEventCreateWithFlags(&it->ev, cudaEventBlockingSync | cudaEventDisableTiming);
  if (ce == cudaSuccess) {
    ce = rt.cudaEventRecord(it->ev, (cudaStream_t)stream);
    if (ce != cudaSuccess) rt.cudaEventDestroy(it->ev);
  }
  if (ce != cudaSuccess) {
    free(it);
    return cuda_fail(ce);
  }
  it->fn = fn;
  it->arg = arg;
  pthread_mutex_lock(&wq.mu);
  if (wq.started == 0) {
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    wq.started = pthread_create(&t, &at, wake_main, NULL) == 0 ? 1 : -1;
    pthread_attr_destroy(&at);
  }
  if (wq.started < 0) {
    pthread_mutex_unlock(&wq.mu);
    rt.cudaEventDestroy(it->ev);
    free(it);
    return (int)cudaErrorLaunchFailure; /* the loop warns and polls */
  }
  if (wq.tail) wq.tail->next = it;
  else wq.head = it;
  wq.tail = it;
  pthread_cond_signal(&wq.cv);
  pthread_mutex_unlock(&wq.mu);
  return 0;
}

static int b_host_notify(void *stream, void (*fn)(void *), void *arg) {
  if (not_usable()) return ncclSystemError;
  if (push_wake_event()) return host_notify_event(stream, fn, arg);
  return (int)rt.cudaLaunchHostFunc((cudaStream_t)stream, (cudaHostFn_t)fn, arg);
}

static void pend_resolve(nccl_bcomm *bc);

static int b_get_async_error(void *bcomm, int *state) {
  nccl_bcomm *bc = bcomm;
  ncclResult_t st = ncclSuccess;
  ncclResult_t r = nc.ncclCommGetAsyncError(bc->comm, &st);
  *state = (int)st;
  if (__builtin_expect(bc->pend != NULL, 0) && r == ncclSuccess && st == ncclSuccess) pend_resolve(bc);
  if (__builtin_expect(st != ncclSuccess && st != ncclInProgress, 0)) tls_err_set = 0;
  return nres(r);
}

static int b_group_start(void) { return nres(nc.ncclGroupStart()); }
static int b_group_end(void) { return nres(nc.ncclGroupEnd()); }

static int b_op(void *bcomm, const ncfsm__op *op) {
  nccl_bcomm *bc = bcomm;
  if (use_device(bc->device) != 0) return ncclUnhandledCudaError;
  ncclComm_t c = bc->comm;
  cudaStream_t s = (cudaStream_t)op->stream;
  ncclDataType_t dt = (ncclDataType_t)op->dtype;
  ncclRedOp_t ro = (ncclRedOp_t)op->redop;
  ncclResult_t r;
  switch (op->kind) {
    case NCFSM_KIND_ALLREDUCE: r = nc.ncclAllReduce(op->send, op->recv, op->count, dt, ro, c, s); break;
    case NCFSM_KIND_BROADCAST: r = nc.ncclBroadcast(op->send, op->recv, op->count, dt, op->root, c, s); break;
    case NCFSM_KIND_REDUCE: r = nc.ncclReduce(op->send, op->recv, op->count, dt, ro, op->root, c, s); break;
    case NCFSM_KIND_ALLGATHER: r = nc.ncclAllGather(op->send, op->recv, op->count, dt, c, s); break;
    case NCFSM_KIND_REDUCESCATTER: r = nc.ncclReduceScatter(op->send, op->recv, op->count, dt, ro, c, s); break;
    case NCFSM_KIND_ALLTOALL:
      if (!nc.ncclAlltoAll) return missing("ncclAlltoAll", 22803);
      r = nc.ncclAlltoAll(op->send, op->recv, op->count, dt, c, s);
      break;
    case NCFSM_KIND_GATHER:
      if (!nc.ncclGather) return missing("ncclGather", 22803);
      r = nc.ncclGather(op->send, op->recv, op->count, dt, op->root, c, s);
      break;
    case NCFSM_KIND_SCATTER:
      if (!nc.ncclScatter) return missing("ncclScatter", 22803);
      r = nc.ncclScatter(op->send, op->recv, op->count, dt, op->root, c, s);
      break;
    case NCFSM_KIND_SEND: r = nc.ncclSend(op->send, op->count, dt, op->peer, c, s); break;
    case NCFSM_KIND_RECV: r = nc.ncclRecv(op->recv, op->count, dt, op->peer, c, s); break;
    case NCFSM_OPKIND_COUNT:
    default:
      /* Never reaches NCCL: an argument error kills a nonblocking comm (R3). */
      own_error("operation kind %d is not an ncfsm_opkind_t", (int)op->kind);
      return ncclInvalidArgument;
  }
  return nres(r);
}

static int b_finalize(void *bcomm) { return nres(nc.ncclCommFinalize(((nccl_bcomm *)bcomm)->comm)); }

static int b_destroy(void *bcomm) {
  nccl_bcomm *bc = bcomm;
  ncclResult_t r = nc.ncclCommDestroy(bc->comm);
  /* R4: a refused Destroy leaves the comm alive; the engine aborts it next. */
  if (r == ncclSuccess) {
    pend_resolve(bc); /* Destroy needed ncclSuccess: a child made meanwhile is the caller's */
    free(bc);
  }
  return nres(r);
}

static int b_abort(void *bcomm) {
  nccl_bcomm *bc = bcomm;
  ncclResult_t r = bc->comm ? nc.ncclCommAbort(bc->comm) : ncclSuccess;
  /* A child NCCL was still making for it: ncclCommAbort ended the parent's
   * job (ncclCommEnsureReady -> ncclGroupJobAbort), so nothing writes it any
   * more; nobody received it, so it goes too. */
  nccl_bcomm *ch = bc->pend;
  if (ch) {
    if (ch->comm) (void)nc.ncclCommAbort(ch->comm);
    free(ch);
  }
  free(bc); /* the engine drops the handle whatever Abort returned */
  return nres(r);
}

static int b_revoke(void *bcomm, int flags) {
  if (!nc.ncclCommRevoke) return missing("ncclCommRevoke", 22807);
  return nres(nc.ncclCommRevoke(((nccl_bcomm *)bcomm)->comm, flags));
}

/* ---- communicators made from communicators (R7, R8; grow: NCCL 2.29) ---------------- */

static void pend_resolve(nccl_bcomm *bc) {
  nccl_bcomm *ch = bc->pend;
  if (!ch) return;
  void **out = bc->pend_out;
  bc->pend = NULL;
  bc->pend_out = NULL;
  if (ch->comm) {
    *out = ch;
  } else { /* NCCL_SPLIT_NOCOLOR: no communicator */
    free(ch);
    *out = NULL;
  }
}

/* The wrapper of a child and its ncclConfig_t, made as b_comm_init makes a
 * comm's (blocking flag, name); the device is set by the caller. */
static nccl_bcomm *child_new(const ncfsm__comm_config *cfg, int device, ncclConfig_t *config) {
  nccl_bcomm *ch = calloc(1, sizeof *ch);
  if (!ch) {
    own_error("out of host memory for a communicator");
    return NULL;
  }
  ch->device = device;
  ch->blocking = cfg->blocking ? 1 : 0;
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = ch->blocking;
  if (cfg->name && cfg->name[0]) {
    snprintf(ch->name, sizeof ch->name, "%s", cfg->name);
    c.commName = ch->name;
  }
  *config = c;
  return ch;
}

/* After NCCL's call on the parent pb wrote (or will write) the child's handle
 * into ch->comm: an error drops the child (aborting what NCCL made); a
 * blocking parent's success hands it over now; a nonblocking parent's call
 * hands it over when the parent polls back to ncclSuccess (R8). */
static int child_after(nccl_bcomm *pb, nccl_bcomm *ch, void **child, ncclResult_t r) {
  if (r != ncclSuccess && r != ncclInProgress) {
    if (ch->comm) (void)nc.ncclCommAbort(ch->comm);
    free(ch);
    return nres(r);
  }
  pb->pend = ch;
  pb->pend_out = child;
  if (pb->blocking && r == ncclSuccess) pend_resolve(pb);
  return nres(r);
}

static int child_begin(nccl_bcomm *pb, void **child, const char *call) {
  *child = NULL;
  if (pb->pend) { /* the engine polls a parent to success before its next call (R2) */
    own_error("%s: the previous split/shrink/grow of this communicator has not polled to ncclSuccess yet", call);
    return ncclInvalidUsage;
  }
  return force_device(pb->device) ? ncclUnhandledCudaError : ncclSuccess;
}

static int b_comm_split(void *parent, int color, int key, void **child, const ncfsm__comm_config *cfg) {
  nccl_bcomm *pb = parent;
  if (!nc.ncclCommSplit) return missing("ncclCommSplit", 21801);
  int rc = child_begin(pb, child, "ncclCommSplit");
  if (rc) return rc;
  ncclConfig_t config;
  nccl_bcomm *ch = child_new(cfg, pb->device, &config); /* NCCL keeps the parent's device */
  if (!ch) return ncclSystemError;
  return child_after(pb, ch, child, nc.ncclCommSplit(pb->comm, color, key, &ch->comm, &config));
}

static int b_comm_shrink(void *parent, const int *exclude, int nexclude, void **child,
                         const ncfsm__comm_config *cfg, int flags) {
  nccl_bcomm *pb = parent;
  if (!nc.ncclCommShrink) return missing("ncclCommShrink", 22703);
  int rc = child_begin(pb, child, "ncclCommShrink");
  if (rc) return rc;
  /* NCCL sorts the list in place: give it a copy */
  int *ex = nexclude > 0 ? malloc((size_t)nexclude * sizeof *ex) : NULL;
  if (nexclude > 0 && !ex) {
    own_error("out of host memory for an exclude list");
    return ncclSystemError;
  }
  if (ex) memcpy(ex, exclude, (size_t)nexclude * sizeof *ex);
  ncclConfig_t config;
  nccl_bcomm *ch = child_new(cfg, pb->device, &config);
  if (!ch) {
    free(ex);
    return ncclSystemError;
  }
  ncclResult_t r = nc.ncclCommShrink(pb->comm, ex, nexclude, &ch->comm, &config, flags);
  free(ex); /* NCCL's job keeps its own copy */
  return child_after(pb, ch, child, r);
}

static int b_comm_get_unique_id(void *bcomm, ncfsm_unique_id *id) {
  nccl_bcomm *bc = bcomm;
  if (!nc.ncclCommGetUniqueId || !nc.ncclCommGrow) return missing("ncclCommGetUniqueId", 22900);
  ncclUniqueId uid;
  ncclResult_t r = nc.ncclCommGetUniqueId(bc->comm, &uid);
  if (r == ncclSuccess) memcpy(id, &uid, sizeof uid);
  return nres(r);
}

static int b_comm_grow(void *parent, int nranks, const ncfsm_unique_id *id, int rank, void **child,
                       const ncfsm__comm_config *cfg) {
  if (!nc.ncclCommGetUniqueId || !nc.ncclCommGrow) return missing("ncclCommGrow", 22900);
  ncclUniqueId uid;
  if (id) memcpy(&uid, id, sizeof uid);
  ncclConfig_t config;
  if (parent) { /* an existing rank: its child comes like a split's */
    nccl_bcomm *pb = parent;
    int rc = child_begin(pb, child, "ncclCommGrow");
    if (rc) return rc;
    nccl_bcomm *ch = child_new(cfg, pb->device, &config);
    if (!ch) return ncclSystemError;
    return child_after(pb, ch, child, nc.ncclCommGrow(pb->comm, nranks, id ? &uid : NULL, -1, &ch->comm, &config));
  }
  /* a joining rank: like an init, on the device it names (NCCL reads the current device) */
  *child = NULL;
  if (not_usable()) return ncclSystemError;
  if (force_device(cfg->device) != 0) return ncclUnhandledCudaError;
  nccl_bcomm *ch = child_new(cfg, cfg->device, &config);
  if (!ch) return ncclSystemError;
  ncclResult_t r = nc.ncclCommGrow(NULL, nranks, id ? &uid : NULL, rank, &ch->comm, &config);
  if (r != ncclSuccess && r != ncclInProgress && !ch->comm) {
    free(ch);
    return nres(r);
  }
  *child = ch; /* NCCL wrote the handle in the call; on an error the engine aborts it */
  return nres(r);
}

/* ncclCommUserRank + ncclCommCount: both need the comm ready (ncclCommEnsureReady:
 * ncclInvalidArgument while its async state is ncclInProgress, R2). */
static int b_comm_rank_size(void *bcomm, int *rank, int *size) {
  nccl_bcomm *bc = bcomm;
  ncclResult_t r = nc.ncclCommUserRank(bc->comm, rank);
  if (r == ncclSuccess) r = nc.ncclCommCount(bc->comm, size);
  return nres(r);
}

static const char *b_last_error(void *bcomm) {
  (void)bcomm;
  if (tls_err_set) return tls_err;
  const char *s = nc.ncclGetLastError ? nc.ncclGetLastError(NULL) : NULL;
  return s ? s : "";
}

static int b_stream_create(int device, void **stream) {
  *stream = NULL;
  int e = force_device(device);
  if (e) return e;
  cudaStream_t s = NULL;
  cudaError_t ce = rt.cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (ce != cudaSuccess) {
    NCFSM_WARN(NCFSM__SUB_BACKEND, "cudaStreamCreateWithFlags on device %d failed: %s", device, cuda_err(ce));
    return cuda_fail(ce);
  }
  *stream = s;
  return 0;
}

static int b_stream_destroy(void *stream) {
  cudaError_t ce = rt.cudaStreamDestroy((cudaStream_t)stream);
  return ce == cudaSuccess ? 0 : cuda_fail(ce);
}

static int b_stream_device(void *stream, int *device) {
  *device = -1;
  /* The legacy and per-thread default streams have no fixed device. */
  if (stream == NULL || stream == (void *)cudaStreamLegacy || stream == (void *)cudaStreamPerThread) return 0;
  if (!rt.cudaStreamGetDevice) return 0; /* runtime older than 12.8: unknown */
  int d = -1;
  cudaError_t ce = rt.cudaStreamGetDevice((cudaStream_t)stream, &d);
  if (ce != cudaSuccess) return cuda_fail(ce);
  *device = d;
  return 0;
}

static int event_create(int device, int timing, void **ev) {
  *ev = NULL;
  nccl_event *e = malloc(sizeof *e);
  if (!e) return (int)cudaErrorMemoryAllocation;
  int rc = force_device(device);
  if (rc) {
    free(e);
    return rc;
  }
  /* Timing only when asked (event_elapsed_ms needs it): a timing event costs
   * several microseconds per round trip (measured, docs/benchmarks.md). */
  cudaError_t ce = rt.cudaEventCreateWithFlags(&e->ev, timing ? cudaEventDefault : cudaEventDisableTiming);
  if (ce != cudaSuccess) {
    free(e);
    NCFSM_WARN(NCFSM__SUB_BACKEND, "cudaEventCreateWithFlags on device %d failed: %s", device, cuda_err(ce));
    return cuda_fail(ce);
  }
  e->device = device;
  *ev = e;
  return 0;
}

static int b_event_create(int device, void **ev) { return event_create(device, 1, ev); }
static int b_event_create_flags(int device, int timing, void **ev) { return event_create(device, timing, ev); }

/* The engine records only after a launch is final (R2): an event recorded
 * while the group end is InProgress completes before the kernels exist. */
static int b_event_record(void *ev, void *stream) {
  nccl_event *e = ev;
  int rc = use_device(e->device);
  if (rc) return rc;
  cudaError_t ce = rt.cudaEventRecord(e->ev, (cudaStream_t)stream);
  return ce == cudaSuccess ? 0 : cuda_fail(ce);
}

static int b_event_query(void *ev) {
  cudaError_t ce = rt.cudaEventQuery(((nccl_event *)ev)->ev);
  if (__builtin_expect(ce == cudaSuccess, 1)) return 0;
  (void)rt.cudaGetLastError(); /* NotReady included, as PyTorch does */
  if (ce == cudaErrorNotReady) return 1;
  /* cudaErrorInvalidValue (1) would read as "not complete": report it as -1. */
  return ce == cudaErrorInvalidValue ? -1 : (int)ce;
}

static int b_event_elapsed_ms(void *start, void *stop, float *ms) {
  cudaError_t ce = rt.cudaEventElapsedTime(ms, ((nccl_event *)start)->ev, ((nccl_event *)stop)->ev);
  return ce == cudaSuccess ? 0 : cuda_fail(ce);
}

static int b_event_destroy(void *ev) {
  nccl_event *e = ev;
  if (!e) return 0;
  cudaError_t ce = rt.cudaEventDestroy(e->ev);
  free(e);
  return ce == cudaSuccess ? 0 : cuda_fail(ce);
}

static int b_device_count(void) {
  ensure_loaded();
  return g.info.device_count;
}

static int b_mem_alloc(int device, size_t bytes, void **ptr) {
  *ptr = NULL;
  int rc = force_device(device);
  if (rc) return rc;
  cudaError_t ce = rt.cudaMalloc(ptr, bytes ? bytes : 1);
  if (ce != cudaSuccess) {
    *ptr = NULL;
    NCFSM_WARN(NCFSM__SUB_BACKEND, "cudaMalloc(%zu) on device %d failed: %s", bytes, device, cuda_err(ce));
    return cuda_fail(ce);
  }
  return 0;
}

static int b_mem_free(int device, void *ptr) {
  int rc = force_device(device);
  if (rc) return rc;
  cudaError_t ce = rt.cudaFree(ptr);
  return ce == cudaSuccess ? 0 : cuda_fail(ce);
}

/* Synchronous copy (legacy default stream semantics of cudaMemcpy): it does
 * not wait for work on the comm's non-blocking streams; wait for the works. */
static int b_memcpy_sync(int device, void *dst, const void *src, size_t bytes, int to_device) {
  if (!bytes) return 0;
  int rc = force_device(device);
  if (rc) return rc;
  cudaError_t ce = rt.cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
  if (ce != cudaSuccess) {
    NCFSM_WARN(NCFSM__SUB_BACKEND, "cudaMemcpy(%zu bytes, %s) on device %d failed: %s", bytes,
               to_device ? "to device" : "to host", device, cuda_err(ce));
    return cuda_fail(ce);
  }
  return 0;
}

const ncfsm__backend ncfsm__backend_nccl = {
    .name = "nccl",
    .kind = NCFSM_BACKEND_NCCL,
    .open = b_open,
    .version = b_version,
    .features = b_features,
    .get_unique_id = b_get_unique_id,
    .comm_init = b_comm_init,
    .comm_init_scalable = b_comm_init_scalable,
    .host_notify = b_host_notify,
    .get_async_error = b_get_async_error,
    .group_start = b_group_start,
    .group_end = b_group_end,
    .op = b_op,
    .finalize = b_finalize,
    .destroy = b_destroy,
    .abort = b_abort,
    .revoke = b_revoke,
    .comm_split = b_comm_split,
    .comm_shrink = b_comm_shrink,
    .comm_get_unique_id = b_comm_get_unique_id,
    .comm_grow = b_comm_grow,
    .comm_rank_size = b_comm_rank_size,
    .last_error = b_last_error,
    .stream_create = b_stream_create,
    .stream_destroy = b_stream_destroy,
    .stream_device = b_stream_device,
    .event_create = b_event_create,
    .event_create_flags = b_event_create_flags,
    .event_record = b_event_record,
    .event_query = b_event_query,
    .event_elapsed_ms = b_event_elapsed_ms,
    .event_destroy = b_event_destroy,
    .device_count = b_device_count,
    .mem_alloc = b_mem_alloc,
    .mem_free = b_mem_free,
    .memcpy_sync = b_memcpy_sync,
};
