/*
 * The nccl backend's loading (docs/nccl-backend.md): libnccl.so.2 and the
 * CUDA runtime are opened with dlopen once per process and their entry
 * points resolved with dlsym into the tables of core/nccl_internal.h, typed
 * from the headers' prototypes. Nothing links libnccl or libcudart, so one
 * binary built against the NCCL 2.28.9 headers runs with the GPU host's
 * system NCCL 2.28.3 or the torch wheel's, whichever LD_LIBRARY_PATH finds
 * first. Entry points newer than the oldest supported runtime are optional
 * (R6, R7): features() says which exist, and calling a missing one fails
 * with ncclInvalidUsage and a last-error text naming the version that has it.
 *
 * Also here: the backend's own errors and the current device, per thread.
 * All other calls come from the loop thread (R9), which may drive several
 * GPUs: the device is set before every call that depends on the current
 * device, with a per-thread cache of the device last set here.
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

#include "core/log.h"
#include "core/nccl_internal.h"

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

/* ---- load state (written once under pthread_once) ------------------------------------ */

ncfsm__nccl_syms ncfsm__nc;
ncfsm__cudart_syms ncfsm__rt;
ncfsm__nccl_info ncfsm__nccl_found;
static void *g_hnccl, *g_hcudart;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* ---- per-thread state -------------------------------------------------------------------- */

_Thread_local int ncfsm__nccl_dev = -1;
_Thread_local char ncfsm__nccl_err[512];
_Thread_local int ncfsm__nccl_err_set;

void ncfsm__nccl_own_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ncfsm__nccl_err, sizeof ncfsm__nccl_err, fmt, ap);
  va_end(ap);
  ncfsm__nccl_err_set = 1;
}

const char *ncfsm__nccl_cuda_err(cudaError_t e) {
  return ncfsm__rt.cudaGetErrorString ? ncfsm__rt.cudaGetErrorString(e) : "unknown CUDA error";
}

int ncfsm__nccl_set_device(int dev) {
  cudaError_t e = ncfsm__rt.cudaSetDevice(dev);
  if (e != cudaSuccess) {
    ncfsm__nccl_dev = -1;
    (void)ncfsm__rt.cudaGetLastError();
    ncfsm__nccl_own_error("cudaSetDevice(%d) failed: %s", dev, ncfsm__nccl_cuda_err(e));
    return (int)e;
  }
  ncfsm__nccl_dev = dev;
  return 0;
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

const char *ncfsm__nccl_dl_error(void) {
  const char *e = dlerror();
  return e ? e : "unknown dlerror";
}

/* Where dlopen looks for a bare name (ld.so(8)), as the user can change it. */
static void search_path(char *buf, size_t len) {
  const char *lp = getenv("LD_LIBRARY_PATH");
  int cut = lp && strlen(lp) > 120;
  snprintf(buf, len, "LD_LIBRARY_PATH=%.120s%s, the program's RUNPATH, the ld.so cache, /lib, /usr/lib",
           lp && *lp ? lp : "(unset)", cut ? "..." : "");
}

/* The rows of NCFSM__NCCL_OPTIONAL, by index. */
static const struct {
  const char *name;
  int since;
  unsigned bit;
} opt_rows[NCFSM__NCCL_OPT_COUNT] = {
#define OPT_ROW(name, since, bit, rule, use) {#name, since, bit},
    NCFSM__NCCL_OPTIONAL(OPT_ROW)
#undef OPT_ROW
};
static_assert(NCFSM__NCCL_OPT_COUNT <= 64, "opt_exported and opt_used hold one bit per row");

/* Every optional entry point the runtime exports, used from the version that
 * brought it; a feature bit when every row that names it is used. */
static void resolve_optional(void *h, int version, ncfsm__nccl_info *in) {
  unsigned have = 0, lack = 0;
  for (int i = 0; i < NCFSM__NCCL_OPT_COUNT; i++) {
    void *p = dlsym(h, opt_rows[i].name);
    int used = p && version >= opt_rows[i].since;
    if (p) in->opt_exported |= 1ull << i;
    if (used) in->opt_used |= 1ull << i;
    ncfsm__nc.opt[i] = used ? p : NULL;
    if (opt_rows[i].bit) *(used ? &have : &lack) |= opt_rows[i].bit;
  }
  in->features = have & ~lack;
}

static void load_nccl(ncfsm__nccl_info *in) {
  (void)dlerror();
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    char where[256];
    search_path(where, sizeof where);
    in->nccl_not_found = 1;
    snprintf(in->nccl_why, sizeof in->nccl_why,
             "libnccl.so.2 not found (searched %s; %s): put the directory of libnccl.so.2 on LD_LIBRARY_PATH: "
             "the system NCCL or the nvidia-nccl wheel's nvidia/nccl/lib",
             where, ncfsm__nccl_dl_error());
    return;
  }
  const char *missing = NULL;
#define RESOLVE(name) \
  if (!missing && !(ncfsm__nc.name = (__typeof__(ncfsm__nc.name))dlsym(h, #name))) missing = #name;
  NCCL_REQUIRED(RESOLVE)
  RESOLVE(ncclGroupStart)
  RESOLVE(ncclGroupEnd)
#undef RESOLVE
  lib_path(h, (void *)ncfsm__nc.ncclGetVersion, in->nccl_path, sizeof in->nccl_path);
  if (missing) {
    snprintf(in->nccl_why, sizeof in->nccl_why,
             "libnccl.so.2 (%.300s) has no %s: not a supported NCCL (ncfsm needs NCCL >= 2.14 with "
             "nonblocking communicators; tested on 2.28.x)",
             in->nccl_path, missing);
    memset(&ncfsm__nc, 0, sizeof ncfsm__nc);
    dlclose(h);
    in->nccl_path[0] = '\0';
    return;
  }
  int v = 0;
  if (ncfsm__nc.ncclGetVersion(&v) != ncclSuccess) v = 0;
  resolve_optional(h, v, in);
  g_hnccl = h;
  in->nccl_loaded = 1;
  in->nccl_version = v;
  if (v < 22800) {
    char vs[32];
    ncfsm__nccl_version_str(v, vs, sizeof vs);
    NCFSM_WARN(NCFSM__SUB_BACKEND,
               "NCCL %s (%s) is older than 2.28: the rules ncfsm follows (docs/nccl-rules.md) were measured "
               "on 2.28.3/2.28.9; behaviour may differ",
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
        int n = snprintf(errs + off, sizeof errs - off, "%s%s", off ? "; " : "", ncfsm__nccl_dl_error());
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
  if (!missing && !(ncfsm__rt.name = (__typeof__(ncfsm__rt.name))dlsym(h, #name))) missing = #name;
  CUDART_REQUIRED(RESOLVE)
#undef RESOLVE
  lib_path(h, (void *)ncfsm__rt.cudaGetDeviceCount, in->cudart_path, sizeof in->cudart_path);
  if (missing) {
    snprintf(in->cudart_why, sizeof in->cudart_why, "CUDA runtime %.300s has no %s", in->cudart_path, missing);
    memset(&ncfsm__rt, 0, sizeof ncfsm__rt);
    dlclose(h);
    in->cudart_path[0] = '\0';
    return;
  }
  ncfsm__rt.cudaStreamGetDevice = (__typeof__(ncfsm__rt.cudaStreamGetDevice))dlsym(h, "cudaStreamGetDevice");
  g_hcudart = h;
  in->cudart_loaded = 1;
  in->has_stream_get_device = ncfsm__rt.cudaStreamGetDevice != NULL;
  int v = 0;
  if (ncfsm__rt.cudaRuntimeGetVersion(&v) == cudaSuccess) in->cudart_version = v;
  v = 0;
  if (ncfsm__rt.cudaDriverGetVersion(&v) == cudaSuccess) in->driver_version = v;
  if (in->driver_version <= 0) { /* why: the driver library is not there, or does not load */
    (void)dlerror();
    void *d = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    snprintf(in->driver_why, sizeof in->driver_why, "%s",
             d ? "libcuda.so.1 loads, but reports no driver" : ncfsm__nccl_dl_error());
    if (d) dlclose(d);
  }
  (void)ncfsm__rt.cudaGetLastError();

  int n = 0;
  cudaError_t e = ncfsm__rt.cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    in->device_count = 0;
    in->device_count_rc = (int)e;
    snprintf(in->device_why, sizeof in->device_why, "cudaGetDeviceCount failed: %s (%s)",
             ncfsm__rt.cudaGetErrorString(e), ncfsm__rt.cudaGetErrorName(e));
    (void)ncfsm__rt.cudaGetLastError();
  } else {
    in->device_count = n;
    if (n == 0)
      snprintf(in->device_why, sizeof in->device_why, "no CUDA device visible (cudaGetDeviceCount returned 0)");
  }
}

/* What to do instead, in every refusal: the engine passes the text on. */
#define SIM_HINT "use NCFSM_BACKEND=sim, or NCFSM_BACKEND=auto (it picks sim when no GPU is usable)"

/* open()'s refusal: the cause first, then what to do (the engine's copy of
 * it may be cut at 256 bytes), then the details. 0 (nothing written): usable. */
static int refusal(const ncfsm__nccl_info *in, char *buf, size_t len) {
  char where[256];
  search_path(where, sizeof where);
  if (!in->nccl_loaded && in->nccl_not_found)
    return snprintf(buf, len, "libnccl.so.2 not found (searched %s): " SIM_HINT "; for NCCL, put the directory "
                    "of libnccl.so.2 (the system NCCL, or the nvidia-nccl wheel's nvidia/nccl/lib) on "
                    "LD_LIBRARY_PATH", where);
  if (!in->nccl_loaded) return snprintf(buf, len, "%.300s: " SIM_HINT, in->nccl_why);
  if (!in->cudart_loaded)
    return snprintf(buf, len, "the CUDA runtime (libcudart.so.13, .12) did not load (searched %s): " SIM_HINT
                    "; %.200s", where, in->cudart_why);
  if (in->device_count > 0) return 0;
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  char cv[96] = "";
  if (vis) snprintf(cv, sizeof cv, "; CUDA_VISIBLE_DEVICES=\"%.64s\"", vis);
  if (in->driver_version <= 0)
    return snprintf(buf, len, "no NVIDIA driver on this machine (%.120s), so no GPU: " SIM_HINT "; %.200s",
                    in->driver_why, in->device_why);
  if (in->device_count_rc == (int)cudaErrorInsufficientDriver)
    return snprintf(buf, len, "the NVIDIA driver (CUDA %d.%d) is older than the CUDA runtime %d.%d (%.200s): "
                    SIM_HINT ", or a CUDA runtime that driver supports", in->driver_version / 1000,
                    in->driver_version % 1000 / 10, in->cudart_version / 1000, in->cudart_version % 1000 / 10,
                    in->cudart_path);
  if (in->device_count_rc == (int)cudaErrorNoDevice || in->device_count_rc == 0)
    return snprintf(buf, len, "no CUDA device visible (driver CUDA %d.%d%s): " SIM_HINT,
                    in->driver_version / 1000, in->driver_version % 1000 / 10, cv);
  return snprintf(buf, len, "%.200s%s: " SIM_HINT, in->device_why, cv);
}

static void load_once(void) {
  ncfsm__nccl_info *in = &ncfsm__nccl_found;
  in->header_nccl_version = NCCL_VERSION_CODE;
  in->header_cudart_version = CUDART_VERSION;
  load_nccl(in);
  load_cudart(in);
  if (refusal(in, in->open_why, sizeof in->open_why) > 0) {
    in->open_rc = 1;
    NCFSM_INFO(NCFSM__SUB_BACKEND, "nccl backend unavailable: %s", in->open_why);
    return;
  }
  char nv[32], opts[1024] = "";
  ncfsm__nccl_version_str(in->nccl_version, nv, sizeof nv);
  size_t off = 0;
  for (int i = 0; i < NCFSM__NCCL_OPT_COUNT && off < sizeof opts; i++)
    if (in->opt_used & (1ull << i)) {
      int n = snprintf(opts + off, sizeof opts - off, " %s", opt_rows[i].name);
      if (n > 0) off += (size_t)n;
    }
  NCFSM_INFO(NCFSM__SUB_BACKEND,
             "nccl backend: NCCL %s (%s), CUDA runtime %d.%d (%s), driver %d.%d, %d device(s); optional:%s", nv,
             in->nccl_path, in->cudart_version / 1000, in->cudart_version % 1000 / 10, in->cudart_path,
             in->driver_version / 1000, in->driver_version % 1000 / 10, in->device_count, opts);
}

void ncfsm__nccl_load(void) { pthread_once(&g_once, load_once); }

void ncfsm__nccl_get_info(ncfsm__nccl_info *out) {
  ncfsm__nccl_load();
  *out = ncfsm__nccl_found;
}

/* ---- refusals ------------------------------------------------------------------------------ */

int ncfsm__nccl_not_usable(void) {
  ncfsm__nccl_load();
  if (!ncfsm__nccl_found.open_rc) return 0;
  ncfsm__nccl_own_error("nccl backend unavailable: %s", ncfsm__nccl_found.open_why);
  return 1;
}

int ncfsm__nccl_missing(int opt) {
  const char *name = opt_rows[opt].name;
  char have[32], need[32];
  ncfsm__nccl_version_str(ncfsm__nccl_found.nccl_version, have, sizeof have);
  ncfsm__nccl_version_str(opt_rows[opt].since, need, sizeof need);
  if (ncfsm__nccl_found.opt_exported & (1ull << opt))
    ncfsm__nccl_own_error("%s is exported by this NCCL runtime (%s) but arrived in %s: not used (an older "
                          "runtime's prototype may differ)", name, have, need);
  else if (ncfsm__nccl_found.nccl_version >= opt_rows[opt].since)
    ncfsm__nccl_own_error("%s not exported by this NCCL runtime (%s, %s)", name, have,
                          ncfsm__nccl_found.nccl_path);
  else
    ncfsm__nccl_own_error("%s not in this NCCL runtime (%s); needs >= %s", name, have, need);
  return ncclInvalidUsage;
}
