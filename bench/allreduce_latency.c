/*
 * bench/allreduce_latency: AllReduce latency, small-op throughput, bandwidth
 * and waiting-thread CPU of ncfsm against raw NCCL, on real GPUs (issue 3).
 *
 *   mpirun -np 2 $NCFSM_MPI_ENV build-bench/bench/allreduce_latency [options]
 *
 *   --iters N        8-byte round trips per variant and round (default 1000)
 *   --rounds R       interleaved rounds of every variant (default 3)
 *   --sleep-iters N  round trips per round for the 1 ms sleep poll (default 60)
 *   --stream-ops N   ops of the small-op stream (default 10000)
 *   --bw-mib M       bandwidth message size in MiB (default 256)
 *   --bw-iters N     ops per bandwidth round (default 20)
 *   --nocoal-ops N   ops of the stream on the coalesce_max 1 loop (default 1000)
 *   --skip-cpu       skip the 1 s late-peer and idle CPU measurements
 *   --no-sweep       skip the size sweep and the dependent-launch breakdown (issue 11)
 *   --sweep-mib M    largest size of the sweep in MiB (default 256; sizes 8 B x 2^k, then M)
 *   --sweep-rounds R rounds of the sweep and of the breakdown (default 3)
 *   --sweep-csv PATH rank 0 writes the sweep as CSV (scripts/plot_sweep.py plots it)
 *   --gap-ops N      dependent AllReduces per round of the breakdown (default 20)
 *   --out-of-place   the sweep, the breakdown and the large one-at-a-time ops read from a
 *                    second buffer (on one rank NCCL skips an in-place AllReduce; out of
 *                    place it is a device copy)
 *   --quick          tiny counts, for a smoke test (sweep up to 16 MiB)
 *
 * Issue 11's size sweep: back to back (raw blocking, raw blocking grouped by
 * 64, raw nonblocking, ncfsm, ncfsm with push completion; ops/s and busbw)
 * and one at a time (round trips), at every size; then where the time goes
 * between dependent launches (one buffer): the call, its way to final on
 * NCCL's helper thread, the program's (or ncfsm's) share until the next
 * call, and the GPU's busy and idle time between ops (timing events).
 *
 * One process per GPU. The ranks meet through ncfsm's bootstrap (PMIx under
 * mpirun): the main ncfsm comm uses ncfsm_comm_init_boot, the other comms get
 * a unique id made by rank 0 and shared with ncfsm_boot_allgather. Raw NCCL
 * and the CUDA runtime are the very libraries ncfsm's nccl backend loaded
 * (core/nccl_dl.h gives their paths; dlopen RTLD_NOLOAD), so every variant
 * runs on the same NCCL.
 *
 * Variants of the 8-byte round trip (enqueue to completion observed):
 *   raw_block_sync   blocking comm, ncclAllReduce + cudaStreamSynchronize
 *   raw_block_spin   blocking comm, ncclAllReduce + event record + busy cudaEventQuery
 *   raw_nb_yield     nonblocking comm: ncclAllReduce, ncclCommGetAsyncError until not
 *                    InProgress with sched_yield, event record (R2), cudaEventQuery + sched_yield
 *   raw_nb_yield_tev the same with a timing-enabled event (diagnostic: ncfsm's events time)
 *   raw_nb_spin      raw_nb_yield without sched_yield, a busy poll (diagnostic)
 *   raw_nb_sleep     nonblocking comm polled as in the NCCL guide, 1 ms sleep between polls
 *   ncfsm            ncfsm_allreduce + ncfsm_work_wait (the caller's thread drives the loop)
 *   ncfsm_spin       the same on a loop with poll_burst 2^30 (never backs off; diagnostic)
 *   ncfsm_blk        ncfsm driving a BLOCKING NCCL comm (opts.blocking = 1; diagnostic)
 *   ncfsm_push       ncfsm on a loop with push completion (NCFSM_COMPLETION_PUSH: after the
 *                    burst the stream wakes the loop, cudaLaunchHostFunc or with
 *                    NCFSM_PUSH_WAKE=event a blocking-sync event; issue 11)
 *   ncfsm_auto       ncfsm on a loop with auto completion (NCFSM_COMPLETION_AUTO: polls, and
 *                    push after push_after_us, 2 ms, without progress)
 *
 * Rank 0 prints Markdown tables and "KV key value" lines for
 * bench/run_gpu_bench.sh. Every variant of one measurement runs in the same
 * process, interleaved round by round, so ratios share the machine's state.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* nccl.h declares ncclGroupStart() and friends without (void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cuda_runtime_api.h>
#include <nccl.h>
#pragma GCC diagnostic pop

#include "core/nccl_dl.h"
#include "ncfsm.h"
#include "ncfsm/bootstrap.h"
#include "ncfsm/introspect.h"

/* ---- libraries: the ones ncfsm's backend loaded -------------------------------------- */

#define NCCL_FNS(X)          \
  X(ncclGetVersion)          \
  X(ncclGetUniqueId)         \
  X(ncclCommInitRankConfig)  \
  X(ncclCommGetAsyncError)   \
  X(ncclCommAbort)           \
  X(ncclAllReduce)           \
  X(ncclGetErrorString)

#define CUDA_FNS(X)            \
  X(cudaSetDevice)             \
  X(cudaGetDeviceCount)        \
  X(cudaStreamCreateWithFlags) \
  X(cudaStreamDestroy)         \
  X(cudaStreamSynchronize)     \
  X(cudaEventCreateWithFlags)  \
  X(cudaEventRecord)           \
  X(cudaEventQuery)            \
  X(cudaEventDestroy)          \
  X(cudaEventElapsedTime)      \
  X(cudaHostAlloc)             \
  X(cudaHostGetDevicePointer)  \
  X(cudaFreeHost)              \
  X(cudaMalloc)                \
  X(cudaFree)                  \
  X(cudaMemset)                \
  X(cudaDeviceSynchronize)     \
  X(cudaGetErrorString)

#define FIELD(name) __typeof__(&name) name;
static struct {
  NCCL_FNS(FIELD)
  ncclResult_t (*ncclGroupStart)(void);
  ncclResult_t (*ncclGroupEnd)(void);
} nc;
static struct {
  CUDA_FNS(FIELD)
} rt;

static int g_rank = -1;
static int g_oop; /* --out-of-place */

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "allreduce_latency rank %d: ", g_rank);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
  exit(1);
}

#define NCK(call)                                                                              \
  do {                                                                                         \
    ncclResult_t r_ = (call);                                                                  \
    if (r_ != ncclSuccess && r_ != ncclInProgress)                                             \
      die("%s:%d %s: %s", __FILE__, __LINE__, #call, nc.ncclGetErrorString(r_));               \
  } while (0)
#define CCK(call)                                                                              \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) die("%s:%d %s: %s", __FILE__, __LINE__, #call, rt.cudaGetErrorString(e_)); \
  } while (0)
#define FCK(call)                                                                              \
  do {                                                                                         \
    ncfsm_result_t f_ = (call);                                                                \
    if (f_ != NCFSM_OK) die("%s:%d %s: %s", __FILE__, __LINE__, #call, ncfsm_err_name(f_));     \
  } while (0)

static void *reopen(const char *path, const char *fallback) {
  void *h = path && path[0] ? dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD) : NULL;
  if (!h) h = dlopen(fallback, RTLD_NOW | RTLD_LOCAL);
  return h;
}

static void load_libs(ncfsm__nccl_info *in) {
  ncfsm__nccl_get_info(in);
  if (in->open_rc) die("the nccl backend is not usable here: %s", in->open_why);
  void *hn = reopen(in->nccl_path, "libnccl.so.2");
  void *hc = reopen(in->cudart_path, "libcudart.so.13");
  if (!hn || !hc) die("dlopen: %s", dlerror());
#define RES_N(name) \
  if (!(nc.name = (__typeof__(nc.name))dlsym(hn, #name))) die("%s missing in %s", #name, in->nccl_path);
#define RES_C(name) \
  if (!(rt.name = (__typeof__(rt.name))dlsym(hc, #name))) die("%s missing in %s", #name, in->cudart_path);
  NCCL_FNS(RES_N)
  RES_N(ncclGroupStart)
  RES_N(ncclGroupEnd)
  CUDA_FNS(RES_C)
#undef RES_N
#undef RES_C
}

/* ---- clocks and statistics -------------------------------------------------------------- */

static inline double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}
static inline double thread_cpu_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}
static double clock_us(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}
static double process_cpu_us(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
         (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct {
  double *v;
  int n, cap;
  double cpu_us, wall_us; /* waiting thread CPU over the measured spans */
} series;

static void push(series *s, double x) {
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 1024;
    s->v = realloc(s->v, (size_t)s->cap * sizeof *s->v);
    if (!s->v) die("out of memory");
  }
  s->v[s->n++] = x;
}
static void sort_series(series *s) { qsort(s->v, (size_t)s->n, sizeof *s->v, cmp_d); }
static double median(const series *s) {
  if (!s->n) return 0;
  return s->n % 2 ? s->v[s->n / 2] : (s->v[s->n / 2 - 1] + s->v[s->n / 2]) / 2;
}
/* Nearest-rank percentile of a sorted series. */
static double pct(const series *s, double p) {
  if (!s->n) return 0;
  int k = (int)(p / 100.0 * s->n + 0.999999);
  if (k < 1) k = 1;
  if (k > s->n) k = s->n;
  return s->v[k - 1];
}

/* ---- the job ------------------------------------------------------------------------------ */

typedef struct {
  int rank, size, dev;
  ncfsm_boot *boot;
  ncfsm_loop *loop; /* L0: default options, hosts the bootstrap */
} job;

static void barrier(job *j) {
  int x = j->rank, all[64];
  if (j->size > 64) die("more than 64 ranks");
  FCK(ncfsm_boot_allgather(j->boot, &x, all, sizeof x));
}

/* Rank 0 makes a unique id (raw NCCL or ncfsm: the same ncclUniqueId), all get it. */
static void share_id(job *j, void *id, size_t len) {
  char *all = malloc(len * (size_t)j->size);
  if (!all) die("out of memory");
  FCK(ncfsm_boot_allgather(j->boot, id, all, len));
  memcpy(id, all, len); /* rank 0's */
  free(all);
}

static ncclComm_t raw_init(job *j, int blocking) {
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (j->rank == 0) NCK(nc.ncclGetUniqueId(&id));
  share_id(j, &id, sizeof id);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = blocking;
  cfg.commName = blocking ? "raw_blocking" : "raw_nonblocking";
  ncclComm_t c = NULL;
  NCK(nc.ncclCommInitRankConfig(&c, j->size, id, j->rank, &cfg));
  ncclResult_t st = ncclSuccess;
  do {
    NCK(nc.ncclCommGetAsyncError(c, &st));
    if (st == ncclInProgress) usleep(1000);
  } while (st == ncclInProgress);
  if (st != ncclSuccess) die("raw init: %s", nc.ncclGetErrorString(st));
  return c;
}

typedef struct {
  ncfsm_loop *loop;
  ncfsm_comm *comm;
  void *stream;
  long done; /* completion callbacks seen */
} fsm_ctx;

static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  fsm_ctx *f = arg;
  if (st != NCFSM_OK) die("work failed: %s (%s)", ncfsm_err_name(st), ncfsm_comm_last_error(f->comm));
  f->done++;
}

/* An ncfsm comm: on j->loop through the bootstrap when loop is NULL, else on a
 * loop of its own with the given options and an id shared by share_id. */
static void fsm_init(job *j, fsm_ctx *f, const ncfsm_loop_opts *lo, int blocking, const char *name) {
  memset(f, 0, sizeof *f);
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.backend = NCFSM_BACKEND_NCCL;
  o.device = j->dev;
  o.blocking = blocking;
  o.name = name;
  if (!lo) {
    f->loop = j->loop;
    FCK(ncfsm_comm_new(f->loop, &o, &f->comm));
    FCK(ncfsm_comm_init_boot(f->comm, j->boot));
  } else {
    FCK(ncfsm_loop_new(lo, &f->loop));
    ncfsm_unique_id id;
    memset(&id, 0, sizeof id);
    if (j->rank == 0) FCK(ncfsm_get_unique_id(NCFSM_BACKEND_NCCL, &id));
    share_id(j, &id, sizeof id);
    FCK(ncfsm_comm_new(f->loop, &o, &f->comm));
    FCK(ncfsm_comm_init(f->comm, j->size, j->rank, &id));
  }
  if (ncfsm_comm_wait_state(f->comm, NCFSM_STATE_READY, 60000) != NCFSM_OK)
    die("ncfsm comm %s not READY: %s", name, ncfsm_comm_last_error(f->comm));
  FCK(ncfsm_stream_create(f->comm, &f->stream));
}

/* ---- the 8-byte round trip ---------------------------------------------------------------- */

enum {
  V_RAW_BLOCK_SYNC,
  V_RAW_BLOCK_SPIN,
  V_RAW_NB_YIELD,
  V_RAW_NB_YIELD_TEV,
  V_RAW_NB_SPIN,
  V_RAW_NB_SLEEP,
  V_NCFSM,
  V_NCFSM_SPIN,
  V_NCFSM_BLK,
  V_NCFSM_PUSH,
  V_NCFSM_AUTO,
  V_COUNT
};
static const struct {
  const char *key, *desc;
} vinfo[V_COUNT] = {
    [V_RAW_BLOCK_SYNC] = {"raw_block_sync", "raw NCCL, blocking comm, cudaStreamSynchronize"},
    [V_RAW_BLOCK_SPIN] = {"raw_block_spin", "raw NCCL, blocking comm, event record + busy cudaEventQuery"},
    [V_RAW_NB_YIELD] = {"raw_nb_yield", "raw NCCL, nonblocking comm, sched_yield poll loop"},
    [V_RAW_NB_YIELD_TEV] = {"raw_nb_yield_tev", "raw_nb_yield with a timing-enabled event (diagnostic)"},
    [V_RAW_NB_SPIN] = {"raw_nb_spin", "raw_nb_yield without sched_yield: busy poll (diagnostic)"},
    [V_RAW_NB_SLEEP] = {"raw_nb_sleep", "raw NCCL, nonblocking comm, 1 ms sleep poll (NCCL guide)"},
    [V_NCFSM] = {"ncfsm", "ncfsm (poll completion): ncfsm_allreduce + ncfsm_work_wait"},
    [V_NCFSM_SPIN] = {"ncfsm_spin", "ncfsm, poll_burst 2^30: never backs off (diagnostic)"},
    [V_NCFSM_BLK] = {"ncfsm_blk", "ncfsm driving a blocking NCCL comm (diagnostic)"},
    [V_NCFSM_PUSH] = {"ncfsm_push", "ncfsm, push completion: after the burst the stream wakes the loop"},
    [V_NCFSM_AUTO] = {"ncfsm_auto", "ncfsm, auto completion: polls, push after 2 ms without progress"},
};

typedef struct {
  job *j;
  ncclComm_t rb, rn; /* raw blocking, raw nonblocking */
  cudaStream_t s_rb, s_rn;
  cudaEvent_t ev_nt, ev_t; /* timing disabled / enabled */
  fsm_ctx f, fspin, fblk, fpush, fauto;
  float *small[V_COUNT]; /* one 8-byte buffer per variant */
} bench;

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Wait for a raw nonblocking launch to be final (R2).
 * sleep: microseconds between polls; 0: sched_yield; -1: busy poll. */
static void raw_nb_final(ncclComm_t c, ncclResult_t launch_rc, long sleep) {
  if (launch_rc != ncclInProgress) return;
  ncclResult_t st;
  for (;;) {
    NCK(nc.ncclCommGetAsyncError(c, &st));
    if (st != ncclInProgress) break;
    if (sleep > 0) sleep_us(sleep);
    else if (sleep == 0) sched_yield();
  }
  if (st != ncclSuccess) die("async error %s", nc.ncclGetErrorString(st));
}

static void raw_nb_wait(ncclComm_t c, cudaStream_t s, cudaEvent_t ev, ncclResult_t launch_rc, long sleep) {
  raw_nb_final(c, launch_rc, sleep);
  CCK(rt.cudaEventRecord(ev, s)); /* then for its event */
  cudaError_t e;
  while ((e = rt.cudaEventQuery(ev)) == cudaErrorNotReady) {
    if (sleep > 0) sleep_us(sleep);
    else if (sleep == 0) sched_yield();
  }
  CCK(e);
}

static void fsm_roundtrip(fsm_ctx *f, const void *send, void *buf, size_t count) {
  ncfsm_work *w;
  FCK(ncfsm_allreduce(f->comm, send, buf, count, NCFSM_FLOAT32, NCFSM_OP_SUM, f->stream, NULL, NULL, &w));
  ncfsm_result_t r = ncfsm_work_wait(w, 0);
  if (r != NCFSM_OK) die("ncfsm_work_wait: %s (%s)", ncfsm_err_name(r), ncfsm_comm_last_error(f->comm));
  ncfsm_work_release(w);
}

/* One round trip of variant v on count floats from send to buf (in place
 * when they are equal); returns microseconds. */
static double roundtrip2(bench *b, int v, const float *send, float *buf, size_t count) {
  double t0 = now_us();
  switch (v) {
    case V_RAW_BLOCK_SYNC:
      NCK(nc.ncclAllReduce(send, buf, count, ncclFloat32, ncclSum, b->rb, b->s_rb));
      CCK(rt.cudaStreamSynchronize(b->s_rb));
      break;
    case V_RAW_BLOCK_SPIN: {
      NCK(nc.ncclAllReduce(send, buf, count, ncclFloat32, ncclSum, b->rb, b->s_rb));
      CCK(rt.cudaEventRecord(b->ev_nt, b->s_rb));
      cudaError_t e;
      while ((e = rt.cudaEventQuery(b->ev_nt)) == cudaErrorNotReady) {
      }
      CCK(e);
      break;
    }
    case V_RAW_NB_YIELD:
    case V_RAW_NB_YIELD_TEV:
    case V_RAW_NB_SPIN:
    case V_RAW_NB_SLEEP: {
      ncclResult_t r = nc.ncclAllReduce(send, buf, count, ncclFloat32, ncclSum, b->rn, b->s_rn);
      NCK(r);
      raw_nb_wait(b->rn, b->s_rn, v == V_RAW_NB_YIELD_TEV ? b->ev_t : b->ev_nt, r,                   v == V_RAW_NB_SLEEP ? 1000 : v == V_RAW_NB_SPIN ? -1 : 0);
      break;
    }
    case V_NCFSM: fsm_roundtrip(&b->f, send, buf, count); break;
    case V_NCFSM_SPIN: fsm_roundtrip(&b->fspin, send, buf, count); break;
    case V_NCFSM_PUSH: fsm_roundtrip(&b->fpush, send, buf, count); break;
    case V_NCFSM_AUTO: fsm_roundtrip(&b->fauto, send, buf, count); break;
    case V_NCFSM_BLK: fsm_roundtrip(&b->fblk, send, buf, count); break;
    default: die("bad variant %d", v);
  }
  return now_us() - t0;
}
static double roundtrip(bench *b, int v, float *buf, size_t count) { return roundtrip2(b, v, buf, buf, count); }

/* ---- options ------------------------------------------------------------------------------ */

typedef struct {
  int iters, rounds, sleep_iters, stream_ops, stream_rounds, bw_iters, bw_rounds, sync_iters, nocoal_ops, skip_cpu;
  size_t bw_bytes;
  int sweep, sweep_rounds, gap_ops; /* issue 11: size sweep and the gap between dependent launches */
  size_t sweep_bytes;
  const char *sweep_csv;
} opts;

static void parse(int argc, char **argv, opts *o) {
  *o = (opts){1000, 3, 60, 10000, 3, 20, 5, 30, 1000, 0, (size_t)256 << 20, 1, 3, 20, (size_t)256 << 20, NULL};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--quick")) {
      *o = (opts){50, 2, 3, 500, 2, 4, 2, 4, 100, 0, (size_t)16 << 20, o->sweep, 2, 6, (size_t)16 << 20, o->sweep_csv};
    } else if (v && !strcmp(a, "--iters")) o->iters = atoi(v), i++;
    else if (v && !strcmp(a, "--rounds")) o->rounds = atoi(v), i++;
    else if (v && !strcmp(a, "--sleep-iters")) o->sleep_iters = atoi(v), i++;
    else if (v && !strcmp(a, "--stream-ops")) o->stream_ops = atoi(v), i++;
    else if (v && !strcmp(a, "--bw-mib")) o->bw_bytes = (size_t)atol(v) << 20, i++;
    else if (v && !strcmp(a, "--bw-iters")) o->bw_iters = atoi(v), i++;
    else if (v && !strcmp(a, "--nocoal-ops")) o->nocoal_ops = atoi(v), i++;
    else if (!strcmp(a, "--skip-cpu")) o->skip_cpu = 1;
    else if (!strcmp(a, "--no-sweep")) o->sweep = 0;
    else if (!strcmp(a, "--out-of-place")) g_oop = 1;
    else if (v && !strcmp(a, "--sweep-mib")) o->sweep_bytes = (size_t)atol(v) << 20, i++;
    else if (v && !strcmp(a, "--sweep-rounds")) o->sweep_rounds = atoi(v), i++;
    else if (v && !strcmp(a, "--sweep-csv")) o->sweep_csv = v, i++;
    else if (v && !strcmp(a, "--gap-ops")) o->gap_ops = atoi(v), i++;
    else {
      fprintf(stderr, "usage: %s [--iters N] [--rounds R] [--sleep-iters N] [--stream-ops N] [--bw-mib M] "
                      "[--bw-iters N] [--nocoal-ops N] [--skip-cpu] [--no-sweep] [--sweep-mib M] "
                      "[--sweep-rounds R] [--sweep-csv PATH] [--gap-ops N] [--out-of-place] [--quick]\n", argv[0]);
      exit(2);
    }
  }
  if (o->iters < 1 || o->rounds < 1 || o->sleep_iters < 1 || o->stream_ops < 1 || o->bw_iters < 1 || o->nocoal_ops < 1 ||
      o->bw_bytes < 8 || o->sweep_rounds < 1 || o->gap_ops < 2 || o->sweep_bytes < 8)
    die("bad options");
}

#define P0(...)                  \
  do {                           \
    if (g_rank == 0) {           \
      printf(__VA_ARGS__);       \
      fflush(stdout);            \
    }                            \
  } while (0)

/* ---- the small-op stream ------------------------------------------------------------------- */

enum { S_RAW_BLOCK, S_RAW_BLOCK_G64, S_NCFSM, S_NCFSM_THREAD, S_NCFSM_NOCOAL, S_COUNT };
static const struct {
  const char *key, *desc;
} sinfo[S_COUNT] = {
    [S_RAW_BLOCK] = {"raw_block", "raw NCCL, blocking comm: enqueue all, then cudaStreamSynchronize"},
    [S_RAW_BLOCK_G64] = {"raw_block_g64", "raw blocking, ncclGroupStart/End around every 64 (hand coalesced; reference)"},
    [S_NCFSM] = {"ncfsm", "ncfsm: submit all, then ncfsm_loop_run (coalesce_max 64)"},
    [S_NCFSM_THREAD] = {"ncfsm_thread", "ncfsm, the loop on its own thread: submit all from this one, wait for the last "
                                        "(submissions made during a turn are handed off)"},
    [S_NCFSM_NOCOAL] = {"ncfsm_nocoal", "ncfsm, coalesce_max 1 (diagnostic)"},
};

static double stream_run(bench *b, int v, fsm_ctx *nocoal, float *slab, int n) {
  double t0 = now_us();
  switch (v) {
    case S_RAW_BLOCK:
      for (int i = 0; i < n; i++)
        NCK(nc.ncclAllReduce(slab + 2 * i, slab + 2 * i, 2, ncclFloat32, ncclSum, b->rb, b->s_rb));
      CCK(rt.cudaStreamSynchronize(b->s_rb));
      break;
    case S_RAW_BLOCK_G64:
      for (int i = 0; i < n; i += 64) {
        NCK(nc.ncclGroupStart());
        for (int k = i; k < n && k < i + 64; k++)
          NCK(nc.ncclAllReduce(slab + 2 * k, slab + 2 * k, 2, ncclFloat32, ncclSum, b->rb, b->s_rb));
        NCK(nc.ncclGroupEnd());
      }
      CCK(rt.cudaStreamSynchronize(b->s_rb));
      break;
    case S_NCFSM:
    case S_NCFSM_NOCOAL: {
      fsm_ctx *f = v == S_NCFSM ? &b->f : nocoal;
      long before = f->done;
      for (int i = 0; i < n; i++)
        FCK(ncfsm_allreduce(f->comm, slab + 2 * i, slab + 2 * i, 2, NCFSM_FLOAT32, NCFSM_OP_SUM, f->stream, on_done,
                            f, NULL));
      FCK(ncfsm_loop_run(f->loop, NCFSM_RUN_DEFAULT));
      if (f->done - before != n) die("stream: %ld of %d works completed", f->done - before, n);
      break;
    }
    case S_NCFSM_THREAD: { /* the loop's thread launches while this one submits */
      fsm_ctx *f = &b->f;
      long before = f->done;
      FCK(ncfsm_loop_start_thread(f->loop));
      t0 = now_us();
      ncfsm_work *last = NULL;
      for (int i = 0; i < n; i++)
        FCK(ncfsm_allreduce(f->comm, slab + 2 * i, slab + 2 * i, 2, NCFSM_FLOAT32, NCFSM_OP_SUM, f->stream, on_done,
                            f, i == n - 1 ? &last : NULL));
      FCK(ncfsm_work_wait(last, 0));
      double us = now_us() - t0;
      FCK(ncfsm_work_release(last));
      FCK(ncfsm_loop_stop_thread(f->loop)); /* joined: its callbacks' counts are seen here */
      if (f->done - before != n) die("stream (loop thread): %ld of %d works completed", f->done - before, n);
      return us;
    }
    default: die("bad stream variant");
  }
  return now_us() - t0;
}

/* The loop's submissions handed off so far (ncfsm_submit_handoffs_total of /metrics). */
static long loop_handoffs(ncfsm_loop *loop) {
  char *text = NULL;
  long n = -1;
  if (ncfsm_loop_metrics(loop, &text, NULL) == NCFSM_OK && text) {
    const char *p = strstr(text, "\nncfsm_submit_handoffs_total ");
    if (p) n = strtol(p + strlen("\nncfsm_submit_handoffs_total "), NULL, 10);
  }
  free(text);
  return n;
}

/* ---- bandwidth ------------------------------------------------------------------------------ */

enum { B_RAW_BLOCK, B_RAW_NB, B_NCFSM, B_COUNT };
static const struct {
  const char *key, *desc;
} binfo[B_COUNT] = {
    [B_RAW_BLOCK] = {"raw_block", "raw NCCL, blocking comm: enqueue all, cudaStreamSynchronize"},
    [B_RAW_NB] = {"raw_nb", "raw NCCL, nonblocking comm: each launch polled to success (sched_yield), then event"},
    [B_NCFSM] = {"ncfsm", "ncfsm: submit all, ncfsm_loop_run"},
};

static void bw_run(bench *b, int v, float *buf, size_t count, int n) {
  switch (v) {
    case B_RAW_BLOCK:
      for (int i = 0; i < n; i++) NCK(nc.ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, b->rb, b->s_rb));
      CCK(rt.cudaStreamSynchronize(b->s_rb));
      break;
    case B_RAW_NB: {
      for (int i = 0; i < n; i++) {
        ncclResult_t r = nc.ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, b->rn, b->s_rn);
        NCK(r);
        raw_nb_final(b->rn, r, 0);
      }
      raw_nb_wait(b->rn, b->s_rn, b->ev_nt, ncclSuccess, 0);
      break;
    }
    case B_NCFSM: {
      long before = b->f.done;
      for (int i = 0; i < n; i++)
        FCK(ncfsm_allreduce(b->f.comm, buf, buf, count, NCFSM_FLOAT32, NCFSM_OP_SUM, b->f.stream, on_done, &b->f,
                            NULL));
      FCK(ncfsm_loop_run(b->f.loop, NCFSM_RUN_DEFAULT));
      if (b->f.done - before != n) die("bw: %ld of %d works completed", b->f.done - before, n);
      break;
    }
    default: die("bad bw variant");
  }
}

/* ---- size sweep (issue 11): back to back and one at a time ----------------------------------- */

enum { W_RAW_BLOCK, W_RAW_BLOCK_G64, W_RAW_NB, W_NCFSM, W_NCFSM_PUSH, W_NCFSM_AUTO, W_COUNT };
static const struct {
  const char *key, *desc;
} winfo[W_COUNT] = {
    [W_RAW_BLOCK] = {"raw_block", "raw blocking: enqueue all, cudaStreamSynchronize"},
    [W_RAW_BLOCK_G64] = {"raw_block_g64", "raw blocking, ncclGroupStart/End around every 64 (hand grouped)"},
    [W_RAW_NB] = {"raw_nb", "raw nonblocking: each launch polled to final (sched_yield), one event at the end"},
    [W_NCFSM] = {"ncfsm", "ncfsm: submit all, ncfsm_loop_run"},
    [W_NCFSM_PUSH] = {"ncfsm_push", "ncfsm with push completion: submit all, ncfsm_loop_run"},
    [W_NCFSM_AUTO] = {"ncfsm_auto", "ncfsm with auto completion: submit all, ncfsm_loop_run"},
};
/* one at a time: these round-trip variants */
static const int sweep_one_v[] = {V_RAW_BLOCK_SYNC, V_RAW_NB_YIELD, V_NCFSM, V_NCFSM_PUSH, V_NCFSM_AUTO};
enum { NSWEEP_ONE = (int)(sizeof sweep_one_v / sizeof sweep_one_v[0]) };

/* Op i of a back-to-back round of n ops of `bytes`: buffer i of the slab, so
 * that consecutive ops are independent where the slab holds them (it holds
 * two of the largest size). */
static float *sweep_buf(float *slab, size_t slab_bytes, size_t bytes, int i) {
  size_t stride = (bytes + 255) & ~(size_t)255;
  size_t per = slab_bytes / stride;
  return (float *)((char *)slab + (size_t)i % per * stride);
}

/* g_oop (--out-of-place, declared with g_rank): the sweep and the
 * breakdown read from a second slab (on one rank NCCL skips an in-place
 * AllReduce: a copy gives the stream real work of the op's size). */
static float *g_src; /* the second slab, NULL in place */
static float *src_of(float *slab, const float *p) { return g_src ? g_src + (p - slab) : (float *)p; }

static void sweep_b2b(bench *b, int v, float *slab, size_t slab_bytes, size_t bytes, int n) {
  size_t count = bytes / sizeof(float);
  switch (v) {
    case W_RAW_BLOCK:
      for (int i = 0; i < n; i++) {
        float *p = sweep_buf(slab, slab_bytes, bytes, i);
        NCK(nc.ncclAllReduce(src_of(slab, p), p, count, ncclFloat32, ncclSum, b->rb, b->s_rb));
      }
      CCK(rt.cudaStreamSynchronize(b->s_rb));
      break;
    case W_RAW_BLOCK_G64:
      for (int i = 0; i < n; i += 64) {
        NCK(nc.ncclGroupStart());
        for (int k = i; k < n && k < i + 64; k++) {
          float *p = sweep_buf(slab, slab_bytes, bytes, k);
          NCK(nc.ncclAllReduce(src_of(slab, p), p, count, ncclFloat32, ncclSum, b->rb, b->s_rb));
        }
        NCK(nc.ncclGroupEnd());
      }
      CCK(rt.cudaStreamSynchronize(b->s_rb));
      break;
    case W_RAW_NB:
      for (int i = 0; i < n; i++) {
        float *p = sweep_buf(slab, slab_bytes, bytes, i);
        ncclResult_t r = nc.ncclAllReduce(src_of(slab, p), p, count, ncclFloat32, ncclSum, b->rn, b->s_rn);
        NCK(r);
        raw_nb_final(b->rn, r, 0);
      }
      raw_nb_wait(b->rn, b->s_rn, b->ev_nt, ncclSuccess, 0);
      break;
    case W_NCFSM:
    case W_NCFSM_PUSH:
    case W_NCFSM_AUTO: {
      fsm_ctx *f = v == W_NCFSM ? &b->f : v == W_NCFSM_PUSH ? &b->fpush : &b->fauto;
      long before = f->done;
      for (int i = 0; i < n; i++) {
        float *p = sweep_buf(slab, slab_bytes, bytes, i);
        FCK(ncfsm_allreduce(f->comm, src_of(slab, p), p, count, NCFSM_FLOAT32, NCFSM_OP_SUM, f->stream, on_done, f, NULL));
      }
      FCK(ncfsm_loop_run(f->loop, NCFSM_RUN_DEFAULT));
      if (f->done - before != n) die("sweep: %ld of %d works completed", f->done - before, n);
      break;
    }
    default: die("bad sweep variant");
  }
}

typedef struct {
  size_t bytes;
  double b2b_ops[W_COUNT]; /* median ops/s, back to back */
  double one_us[NSWEEP_ONE]; /* median us, one at a time */
} sweep_row;

/* Every size from 8 B, doubling, up to max_bytes (and max_bytes itself). */
static int sweep_sizes(size_t max_bytes, size_t *out, int cap) {
  int n = 0;
  for (size_t s = 8; s < max_bytes && n < cap - 1; s *= 2) out[n++] = s;
  out[n++] = max_bytes;
  return n;
}

static void run_sweep(bench *b, size_t max_bytes, int rounds, const char *csv_path) {
  job *j = b->j;
  size_t sizes[48];
  int nsz = sweep_sizes(max_bytes, sizes, 48);
  size_t slab_bytes = 2 * ((max_bytes + 255) & ~(size_t)255);
  if (slab_bytes < ((size_t)1 << 20)) slab_bytes = (size_t)1 << 20;
  float *slab;
  CCK(rt.cudaMalloc((void **)&slab, slab_bytes));
  CCK(rt.cudaMemset(slab, 0, slab_bytes));
  g_src = NULL;
  if (g_oop) {
    CCK(rt.cudaMalloc((void **)&g_src, slab_bytes));
    CCK(rt.cudaMemset(g_src, 0, slab_bytes));
  }
  CCK(rt.cudaDeviceSynchronize());
  double factor = j->size > 1 ? 2.0 * (j->size - 1) / j->size : 1.0;
  sweep_row *rows = calloc((size_t)nsz, sizeof *rows);
  if (!rows) die("out of memory");
  for (int z = 0; z < nsz; z++) {
    size_t bytes = sizes[z];
    rows[z].bytes = bytes;
    /* back to back: about 512 MiB per round, 8 to 1000 ops */
    size_t nn = ((size_t)512 << 20) / bytes;
    int n = nn < 8 ? 8 : nn > 1000 ? 1000 : (int)nn;
    series s[W_COUNT];
    memset(s, 0, sizeof s);
    barrier(j);
    for (int v = 0; v < W_COUNT; v++) sweep_b2b(b, v, slab, slab_bytes, bytes, n < 16 ? n : 16); /* warm-up */
    for (int r = 0; r < rounds; r++)
      for (int v = 0; v < W_COUNT; v++) {
        barrier(j);
        double t0 = now_us();
        sweep_b2b(b, v, slab, slab_bytes, bytes, n);
        push(&s[v], n / ((now_us() - t0) / 1e6));
      }
    for (int v = 0; v < W_COUNT; v++) {
      sort_series(&s[v]);
      rows[z].b2b_ops[v] = median(&s[v]);
      free(s[v].v);
    }
    /* one at a time: 10 to 200 round trips */
    size_t mm = ((size_t)64 << 20) / bytes;
    int m = mm < 10 ? 10 : mm > 200 ? 200 : (int)mm;
    series o1[NSWEEP_ONE];
    memset(o1, 0, sizeof o1);
    float *p = sweep_buf(slab, slab_bytes, bytes, 0);
    for (int k = 0; k < NSWEEP_ONE; k++) roundtrip2(b, sweep_one_v[k], src_of(slab, p), p, bytes / sizeof(float));
    for (int r = 0; r < rounds; r++)
      for (int k = 0; k < NSWEEP_ONE; k++) {
        barrier(j);
        for (int i = 0; i < m; i++)
          push(&o1[k], roundtrip2(b, sweep_one_v[k], src_of(slab, p), p, bytes / sizeof(float)));
      }
    for (int k = 0; k < NSWEEP_ONE; k++) {
      sort_series(&o1[k]);
      rows[z].one_us[k] = median(&o1[k]);
      free(o1[k].v);
    }
  }
  CCK(rt.cudaFree(slab));
  if (g_src) CCK(rt.cudaFree(g_src));
  g_src = NULL;

  P0("## Size sweep: AllReduce (float32, %s), back to back, rank 0 medians of %d rounds\n\n",
     g_oop ? "out of place" : "in place", rounds);
  P0("Ops per round: 512 MiB worth, at least 8 and at most 1000, each on its own buffer where two of the largest "
     "fit (so consecutive ops are independent). busbw = bytes x ops/s x %s; GB = 1e9 bytes.\n\n",
     j->size > 1 ? "2(n-1)/n" : "1 (one rank: algbw)");
  P0("| bytes |");
  for (int v = 0; v < W_COUNT; v++) P0(" %s ops/s |", winfo[v].key);
  for (int v = 0; v < W_COUNT; v++) P0(" %s busbw |", winfo[v].key);
  P0(" ncfsm/raw_block | ncfsm/raw_block_g64 | ncfsm/raw_nb | ncfsm_push/ncfsm | ncfsm_auto/ncfsm |\n|---:|");
  for (int v = 0; v < 2 * W_COUNT + 5; v++) P0("---:|");
  P0("\n");
  for (int z = 0; z < nsz; z++) {
    const sweep_row *w = &rows[z];
    P0("| %zu |", w->bytes);
    for (int v = 0; v < W_COUNT; v++) P0(" %.0f |", w->b2b_ops[v]);
    for (int v = 0; v < W_COUNT; v++) P0(" %.2f |", w->b2b_ops[v] * (double)w->bytes * factor / 1e9);
    P0(" %.3f | %.3f | %.3f | %.3f | %.3f |\n", w->b2b_ops[W_NCFSM] / w->b2b_ops[W_RAW_BLOCK],
       w->b2b_ops[W_NCFSM] / w->b2b_ops[W_RAW_BLOCK_G64], w->b2b_ops[W_NCFSM] / w->b2b_ops[W_RAW_NB],
       w->b2b_ops[W_NCFSM_PUSH] / w->b2b_ops[W_NCFSM], w->b2b_ops[W_NCFSM_AUTO] / w->b2b_ops[W_NCFSM]);
  }
  P0("\n## Size sweep: one at a time (submit, wait for completion, repeat), rank 0 median us\n\n| bytes |");
  for (int k = 0; k < NSWEEP_ONE; k++) P0(" %s |", vinfo[sweep_one_v[k]].key);
  P0(" ncfsm/raw_nb_yield | ncfsm_push/raw_nb_yield | ncfsm_auto/raw_nb_yield |\n|---:|");
  for (int k = 0; k < NSWEEP_ONE + 3; k++) P0("---:|");
  P0("\n");
  for (int z = 0; z < nsz; z++) {
    const sweep_row *w = &rows[z];
    P0("| %zu |", w->bytes);
    for (int k = 0; k < NSWEEP_ONE; k++) P0(" %.1f |", w->one_us[k]);
    P0(" %.3f | %.3f | %.3f |\n", w->one_us[2] / w->one_us[1], w->one_us[3] / w->one_us[1],
       w->one_us[4] / w->one_us[1]);
  }
  P0("\n");
  for (int z = 0; z < nsz; z++) {
    for (int v = 0; v < W_COUNT; v++)
      P0("KV sweep.b2b.%s.%zu.ops_per_s %.1f\n", winfo[v].key, rows[z].bytes, rows[z].b2b_ops[v]);
    for (int k = 0; k < NSWEEP_ONE; k++)
      P0("KV sweep.one.%s.%zu.median_us %.2f\n", vinfo[sweep_one_v[k]].key, rows[z].bytes, rows[z].one_us[k]);
  }
  if (csv_path && g_rank == 0) {
    FILE *f = fopen(csv_path, "w");
    if (!f) die("--sweep-csv %s: cannot write", csv_path);
    fprintf(f, "mode,variant,bytes,ops_per_s,busbw_GBps,median_us,nranks\n");
    for (int z = 0; z < nsz; z++) {
      const sweep_row *w = &rows[z];
      for (int v = 0; v < W_COUNT; v++)
        fprintf(f, "b2b,%s,%zu,%.3f,%.4f,,%d\n", winfo[v].key, w->bytes, w->b2b_ops[v],
                w->b2b_ops[v] * (double)w->bytes * factor / 1e9, j->size);
      for (int k = 0; k < NSWEEP_ONE; k++)
        fprintf(f, "one,%s,%zu,%.3f,%.4f,%.3f,%d\n", vinfo[sweep_one_v[k]].key, w->bytes, 1e6 / w->one_us[k],
                (double)w->bytes / w->one_us[k] / 1e3 * factor, w->one_us[k], j->size);
    }
    if (fclose(f) != 0) die("--sweep-csv %s: write failed", csv_path);
  }
  free(rows);
}

/* ---- where the time goes between dependent launches (issue 11, item 3) --------------------- */

/* n dependent AllReduces (one buffer) back to back. Raw: host stamps around
 * each call and at final, and timing events before and after each op on the
 * stream (GPU busy = pre..post, GPU idle = post(i-1)..pre(i)). ncfsm: its
 * own per-work times (launch = group end called, final = ncclSuccess). */
enum { G_RAW_BLOCK, G_RAW_NB, G_NCFSM, G_COUNT };
static const char *const gkey[G_COUNT] = {"raw_block", "raw_nb", "ncfsm"};
enum { GP_CALL, GP_FINAL, GP_NEXT, GP_BUSY, GP_IDLE, GP_WALL, GP_COUNT };
static const char *const gpkey[GP_COUNT] = {"call_us", "to_final_us", "final_to_next_us", "gpu_busy_us",
                                            "gpu_idle_us", "per_op_us"};

static void gap_run(bench *b, int v, const float *send, float *buf, size_t count, int n, series *ph /* GP_COUNT */) {
  cudaEvent_t *pre = calloc((size_t)n, sizeof *pre), *post = calloc((size_t)n, sizeof *post);
  double *t0 = calloc((size_t)n, sizeof *t0), *t1 = calloc((size_t)n, sizeof *t1), *t2 = calloc((size_t)n, sizeof *t2);
  ncfsm_work **ws = calloc((size_t)n, sizeof *ws);
  if (!pre || !post || !t0 || !t1 || !t2 || !ws) die("out of memory");
  double w0 = now_us();
  if (v == G_NCFSM) {
    for (int i = 0; i < n; i++)
      FCK(ncfsm_allreduce(b->f.comm, send, buf, count, NCFSM_FLOAT32, NCFSM_OP_SUM, b->f.stream, NULL, NULL, &ws[i]));
    FCK(ncfsm_loop_run(b->f.loop, NCFSM_RUN_DEFAULT));
  } else {
    ncclComm_t c = v == G_RAW_BLOCK ? b->rb : b->rn;
    cudaStream_t s = v == G_RAW_BLOCK ? b->s_rb : b->s_rn;
    for (int i = 0; i < n; i++) {
      CCK(rt.cudaEventCreateWithFlags(&pre[i], cudaEventDefault));
      CCK(rt.cudaEventCreateWithFlags(&post[i], cudaEventDefault));
    }
    for (int i = 0; i < n; i++) {
      CCK(rt.cudaEventRecord(pre[i], s));
      t0[i] = now_us();
      ncclResult_t r = nc.ncclAllReduce(send, buf, count, ncclFloat32, ncclSum, c, s);
      NCK(r);
      t1[i] = now_us();
      raw_nb_final(c, r, 0);
      t2[i] = now_us();
      CCK(rt.cudaEventRecord(post[i], s));
    }
    CCK(rt.cudaStreamSynchronize(s));
  }
  double wall = now_us() - w0;
  push(&ph[GP_WALL], wall / n);
  for (int i = 0; i < n; i++) {
    if (v == G_NCFSM) {
      ncfsm_work_times t;
      FCK(ncfsm_work_get_times(ws[i], &t));
      push(&ph[GP_FINAL], (double)(t.final_ns - t.launch_ns) / 1e3);
      if (i > 0) {
        ncfsm_work_times p;
        FCK(ncfsm_work_get_times(ws[i - 1], &p));
        push(&ph[GP_NEXT], ((double)t.launch_ns - (double)p.final_ns) / 1e3);
      }
      continue;
    }
    float ms;
    push(&ph[GP_CALL], t1[i] - t0[i]);
    push(&ph[GP_FINAL], t2[i] - t1[i]);
    if (i > 0) push(&ph[GP_NEXT], t0[i] - t2[i - 1]);
    CCK(rt.cudaEventElapsedTime(&ms, pre[i], post[i]));
    push(&ph[GP_BUSY], ms * 1e3);
    if (i > 0) {
      CCK(rt.cudaEventElapsedTime(&ms, post[i - 1], pre[i]));
      push(&ph[GP_IDLE], ms * 1e3);
    }
  }
  for (int i = 0; i < n; i++) {
    if (v == G_NCFSM) {
      FCK(ncfsm_work_release(ws[i]));
    } else {
      rt.cudaEventDestroy(pre[i]);
      rt.cudaEventDestroy(post[i]);
    }
  }
  free(pre);
  free(post);
  free(t0);
  free(t1);
  free(t2);
  free(ws);
}

static void run_gap(bench *b, size_t max_bytes, int n, int rounds) {
  job *j = b->j;
  static const size_t gsz[] = {8, (size_t)1 << 20, (size_t)16 << 20, (size_t)256 << 20};
  float *buf, *src = NULL;
  CCK(rt.cudaMalloc((void **)&buf, max_bytes));
  CCK(rt.cudaMemset(buf, 0, max_bytes));
  if (g_oop) {
    CCK(rt.cudaMalloc((void **)&src, max_bytes));
    CCK(rt.cudaMemset(src, 0, max_bytes));
  }
  CCK(rt.cudaDeviceSynchronize());
  P0("## Between dependent launches (one %s buffer, %d AllReduces back to back), rank 0 medians over %d rounds\n\n",
     g_oop ? "destination" : "in-place", n, rounds);
  if (j->size == 1)
    P0("One rank: NCCL runs a one-rank AllReduce at enqueue as a cudaMemcpyAsync (out of place) or nothing (in "
       "place), with no group end on a helper thread and no kernel: these rows show the host paths and the "
       "copies, not NCCL's multi-rank gap.\n\n");
  P0("call: the ncclAllReduce call; to final: from its return to ncclSuccess (NCCL's helper thread; ncfsm: "
     "group end called .. final); final to next: from one op's final to the next op's call (the program's "
     "share; ncfsm: the engine's); GPU busy / idle: timing events before and after each op (raw only).\n\n");
  P0("| bytes | variant | call us | to final us | final to next us | GPU busy us | GPU idle between ops us | "
     "wall per op us |\n|---:|---|---:|---:|---:|---:|---:|---:|\n");
  for (size_t z = 0; z < sizeof gsz / sizeof gsz[0] && gsz[z] <= max_bytes; z++) {
    series ph[G_COUNT][GP_COUNT];
    memset(ph, 0, sizeof ph);
    size_t count = gsz[z] / sizeof(float);
    for (int v = 0; v < G_COUNT; v++) {
      series warm[GP_COUNT];
      memset(warm, 0, sizeof warm);
      barrier(j);
      gap_run(b, v, src ? src : buf, buf, count, 4, warm);
      for (int p = 0; p < GP_COUNT; p++) free(warm[p].v);
    }
    for (int r = 0; r < rounds; r++)
      for (int v = 0; v < G_COUNT; v++) {
        barrier(j);
        gap_run(b, v, src ? src : buf, buf, count, n, ph[v]);
      }
    for (int v = 0; v < G_COUNT; v++) {
      P0("| %zu | %s |", gsz[z], gkey[v]);
      for (int p = 0; p < GP_COUNT; p++) {
        sort_series(&ph[v][p]);
        if (ph[v][p].n) P0(" %.1f |", median(&ph[v][p]));
        else P0(" - |");
      }
      P0("\n");
    }
    for (int v = 0; v < G_COUNT; v++)
      for (int p = 0; p < GP_COUNT; p++) {
        if (ph[v][p].n) P0("KV gap.%zu.%s.%s %.2f\n", gsz[z], gkey[v], gpkey[p], median(&ph[v][p]));
        free(ph[v][p].v);
      }
  }
  P0("\n");
  CCK(rt.cudaFree(buf));
  if (src) CCK(rt.cudaFree(src));
}

/* ---- a stream gate: a late peer on one rank ------------------------------------------------ */

typedef int (*wait_value_fn)(void *stream, unsigned long long addr, unsigned value, unsigned flags);
typedef struct {
  wait_value_fn wait;
  volatile unsigned *flag; /* mapped host memory */
  unsigned long long dflag;
  pthread_t opener;
  long delay_us;
  int armed;
} gate;

static void gate_init(gate *g) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) die("dlopen libcuda.so.1: %s", dlerror());
  g->wait = (wait_value_fn)dlsym(h, "cuStreamWaitValue32_v2");
  if (!g->wait) g->wait = (wait_value_fn)dlsym(h, "cuStreamWaitValue32");
  if (!g->wait) die("cuStreamWaitValue32 missing in libcuda.so.1");
  void *p, *d;
  CCK(rt.cudaHostAlloc(&p, sizeof(unsigned), cudaHostAllocMapped));
  CCK(rt.cudaHostGetDevicePointer(&d, p, 0));
  g->flag = p;
  g->dflag = (unsigned long long)(uintptr_t)d;
}

static void *gate_opener(void *arg) {
  gate *g = arg;
  sleep_us(g->delay_us);
  __atomic_store_n(g->flag, 1u, __ATOMIC_SEQ_CST);
  return NULL;
}

/* The stream waits until the flag is 1; a thread sets it delay_us from now. */
static void gate_close(gate *g, void *stream, long delay_us) {
  __atomic_store_n(g->flag, 0u, __ATOMIC_SEQ_CST);
  int rc = g->wait(stream, g->dflag, 1, 0 /* CU_STREAM_WAIT_VALUE_GEQ */);
  if (rc != 0) die("cuStreamWaitValue32: CUresult %d", rc);
  g->delay_us = delay_us;
  if (pthread_create(&g->opener, NULL, gate_opener, g) != 0) die("pthread_create");
  g->armed = 1;
}

static void gate_join(gate *g) {
  if (g->armed) pthread_join(g->opener, NULL);
  g->armed = 0;
}

static void gate_free(gate *g) { CCK(rt.cudaFreeHost((void *)g->flag)); }

/* The stream a round-trip variant runs on. */
static void *variant_stream(bench *b, int v) {
  switch (v) {
    case V_RAW_BLOCK_SYNC:
    case V_RAW_BLOCK_SPIN: return b->s_rb;
    case V_NCFSM: return b->f.stream;
    case V_NCFSM_SPIN: return b->fspin.stream;
    case V_NCFSM_BLK: return b->fblk.stream;
    case V_NCFSM_PUSH: return b->fpush.stream;
    case V_NCFSM_AUTO: return b->fauto.stream;
    default: return b->s_rn;
  }
}

/* ---- CPU of a thread that waits ------------------------------------------------------------- */

struct tclock {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  clockid_t id;
};
static void get_thread_clock(void *arg) {
  struct tclock *t = arg;
  if (pthread_getcpuclockid(pthread_self(), &t->id) != 0) die("pthread_getcpuclockid");
  pthread_mutex_lock(&t->mu);
  t->done = 1;
  pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

/* ---- main ------------------------------------------------------------------------------------ */

int main(int argc, char **argv) {
  opts o;
  parse(argc, argv, &o);
  setvbuf(stdout, NULL, _IOLBF, 0);

  job J = {0};
  job *j = &J;
  ncfsm_loop_opts lo_main; /* L0 hosts "ncfsm": poll completion (see lo_def below) */
  ncfsm_loop_opts_init(&lo_main);
  lo_main.completion = NCFSM_COMPLETION_POLL;
  FCK(ncfsm_loop_new(&lo_main, &j->loop));
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  if (ncfsm_boot_open(ncfsm_loop_base(j->loop), &bo, &j->boot) != NCFSM_OK)
    die("bootstrap: %s (run under mpirun)", ncfsm_boot_open_error());
  j->rank = g_rank = ncfsm_boot_rank(j->boot);
  j->size = ncfsm_boot_size(j->boot);

  ncfsm__nccl_info info;
  load_libs(&info);
  int ndev = 0;
  CCK(rt.cudaGetDeviceCount(&ndev));
  j->dev = ncfsm_boot_local_rank(j->boot) % ndev;
  CCK(rt.cudaSetDevice(j->dev));

  char nv[32];
  ncfsm__nccl_version_str(info.nccl_version, nv, sizeof nv);
  ncfsm__nccl_device_info di;
  char why[256];
  if (ncfsm__nccl_device_info_get(j->dev, &di, why, sizeof why) != 0) snprintf(di.name, sizeof di.name, "?");
  ncfsm_loop_opts lo_def;
  ncfsm_loop_opts_init(&lo_def);
  /* "ncfsm" is the poll engine, as in every earlier run (auto, the default
   * since issue 11, is the ncfsm_auto variant; push is ncfsm_push). */
  lo_def.completion = NCFSM_COMPLETION_POLL;
  P0("# allreduce_latency: %d ranks (bootstrap %s), rank 0 on device %d (%s)\n", j->size,
     ncfsm_boot_kind_name(ncfsm_boot_kind(j->boot)), j->dev, di.name);
  P0("NCCL %s (%s); CUDA runtime %d (%s); driver %d; ncfsm %d.%d.%d\n", nv, info.nccl_path, info.cudart_version,
     info.cudart_path, info.driver_version, NCFSM_VERSION_MAJOR, NCFSM_VERSION_MINOR, NCFSM_VERSION_PATCH);
  cpu_set_t aff;
  int ncpu = sched_getaffinity(0, sizeof aff, &aff) == 0 ? CPU_COUNT(&aff) : -1, ncpus[64];
  FCK(ncfsm_boot_allgather(j->boot, &ncpu, ncpus, sizeof ncpu));
  P0("CPU affinity: rank 0 may run on %d CPU(s), rank 1 on %d (of %ld online)\n", ncpus[0], j->size > 1 ? ncpus[1] : -1,
     sysconf(_SC_NPROCESSORS_ONLN));
  P0("KV affinity.rank0_cpus %d\n", ncpus[0]);
  P0("ncfsm loop options: poll_burst %u, poll_max_us %u, coalesce_max %u\n", lo_def.poll_burst, lo_def.poll_max_us,
     lo_def.coalesce_max);
  P0("options: iters %d x rounds %d (sleep poll: %d x %d), stream %d ops x %d rounds, bw %zu MiB x %d ops x %d "
     "rounds, per-op sync %d\n\n",
     o.iters, o.rounds, o.sleep_iters, o.rounds, o.stream_ops, o.stream_rounds, o.bw_bytes >> 20, o.bw_iters,
     o.bw_rounds, o.sync_iters);
  P0("KV nccl_version %s\n", nv);

  /* ---- communicators ---- */
  bench B;
  memset(&B, 0, sizeof B);
  bench *b = &B;
  b->j = j;
  double t0 = now_us();
  b->rb = raw_init(j, 1);
  b->rn = raw_init(j, 0);
  CCK(rt.cudaStreamCreateWithFlags(&b->s_rb, cudaStreamNonBlocking));
  CCK(rt.cudaStreamCreateWithFlags(&b->s_rn, cudaStreamNonBlocking));
  CCK(rt.cudaEventCreateWithFlags(&b->ev_nt, cudaEventDisableTiming));
  CCK(rt.cudaEventCreateWithFlags(&b->ev_t, cudaEventDefault));
  fsm_init(j, &b->f, NULL, 0, "ncfsm");
  ncfsm_loop_opts lo_spin = lo_def;
  lo_spin.poll_burst = 1u << 30;
  fsm_init(j, &b->fspin, &lo_spin, 0, "ncfsm_spin");
  fsm_init(j, &b->fblk, &lo_def, 1, "ncfsm_blk");
  ncfsm_loop_opts lo_push = lo_def;
  lo_push.completion = NCFSM_COMPLETION_PUSH;
  fsm_init(j, &b->fpush, &lo_push, 0, "ncfsm_push");
  ncfsm_loop_opts lo_auto = lo_def;
  lo_auto.completion = NCFSM_COMPLETION_AUTO;
  fsm_init(j, &b->fauto, &lo_auto, 0, "ncfsm_auto");
  fsm_ctx nocoal;
  ncfsm_loop_opts lo_nocoal = lo_def;
  lo_nocoal.coalesce_max = 1;
  fsm_init(j, &nocoal, &lo_nocoal, 0, "ncfsm_nocoal");
  P0("setup: 8 communicators ready in %.0f ms\n\n", (now_us() - t0) / 1e3);

  for (int v = 0; v < V_COUNT; v++) {
    CCK(rt.cudaMalloc((void **)&b->small[v], 256));
    CCK(rt.cudaMemset(b->small[v], 0, 256));
  }
  CCK(rt.cudaDeviceSynchronize());

  /* ---- 8-byte round trip ---- */
  series rts[V_COUNT];
  memset(rts, 0, sizeof rts);
  barrier(j);
  for (int v = 0; v < V_COUNT; v++) /* warm-up: connections, free lists, caches */
    for (int i = 0; i < (v == V_RAW_NB_SLEEP ? 5 : 200); i++) roundtrip(b, v, b->small[v], 2);
  for (int r = 0; r < o.rounds; r++) {
    for (int v = 0; v < V_COUNT; v++) {
      barrier(j);
      int n = v == V_RAW_NB_SLEEP ? o.sleep_iters : o.iters;
      double c0 = thread_cpu_us(), w0 = now_us();
      for (int i = 0; i < n; i++) push(&rts[v], roundtrip(b, v, b->small[v], 2));
      rts[v].cpu_us += thread_cpu_us() - c0;
      rts[v].wall_us += now_us() - w0;
    }
  }
  for (int v = 0; v < V_COUNT; v++) sort_series(&rts[v]);
  const series *ref = &rts[V_NCFSM];
  P0("## 8-byte AllReduce round trip (float32 x 2, in place), rank 0\n\n");
  P0("| variant | what | samples | median us | p99 us | min us | CPU of waiting thread | ncfsm/this median | "
     "ncfsm/this p99 |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int v = 0; v < V_COUNT; v++) {
    const series *s = &rts[v];
    P0("| %s | %s | %d | %.1f | %.1f | %.1f | %.0f%% | %.3f | %.3f |\n", vinfo[v].key, vinfo[v].desc, s->n, median(s),
       pct(s, 99), s->v[0], 100.0 * s->cpu_us / s->wall_us, median(ref) / median(s), pct(ref, 99) / pct(s, 99));
  }
  P0("\n");
  for (int v = 0; v < V_COUNT; v++)
    P0("KV rt.%s.median_us %.2f\nKV rt.%s.p99_us %.2f\n", vinfo[v].key, median(&rts[v]), vinfo[v].key,
       pct(&rts[v], 99));

  /* ---- small-op stream ---- */
  float *slab;
  CCK(rt.cudaMalloc((void **)&slab, (size_t)o.stream_ops * 8));
  CCK(rt.cudaMemset(slab, 0, (size_t)o.stream_ops * 8));
  CCK(rt.cudaDeviceSynchronize());
  series ss[S_COUNT];
  memset(ss, 0, sizeof ss);
  barrier(j);
  int sops[S_COUNT];
  for (int v = 0; v < S_COUNT; v++) {
    sops[v] = v == S_NCFSM_NOCOAL && o.nocoal_ops < o.stream_ops ? o.nocoal_ops : o.stream_ops;
    stream_run(b, v, &nocoal, slab, sops[v] < 500 ? sops[v] : 500); /* warm-up */
  }
  long handoffs0 = loop_handoffs(b->f.loop); /* the warm-up's are not the rounds' */
  for (int r = 0; r < o.stream_rounds; r++)
    for (int v = 0; v < S_COUNT; v++) {
      barrier(j);
      double c0 = thread_cpu_us();
      double us = stream_run(b, v, &nocoal, slab, sops[v]);
      ss[v].cpu_us += thread_cpu_us() - c0;
      ss[v].wall_us += us;
      push(&ss[v], sops[v] / (us / 1e6));
    }
  for (int v = 0; v < S_COUNT; v++) sort_series(&ss[v]);
  P0("## Stream of %d independent 8-byte AllReduces (distinct buffers), rank 0, %d rounds\n\n", o.stream_ops,
     o.stream_rounds);
  P0("| variant | what | ops per round | median ops/s | min ops/s | max ops/s | CPU of calling thread | ncfsm/this |\n"
     "|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (int v = 0; v < S_COUNT; v++)
    P0("| %s | %s | %d | %.0f | %.0f | %.0f | %.0f%% | %.3f |\n", sinfo[v].key, sinfo[v].desc, sops[v], median(&ss[v]), ss[v].v[0],
       ss[v].v[ss[v].n - 1], 100.0 * ss[v].cpu_us / ss[v].wall_us, median(&ss[S_NCFSM]) / median(&ss[v]));
  P0("\n");
  for (int v = 0; v < S_COUNT; v++) P0("KV stream.%s.ops_per_s %.0f\n", sinfo[v].key, median(&ss[v]));
  long handoffs1 = loop_handoffs(b->f.loop);
  if (handoffs0 < 0 || handoffs1 < 0) die("ncfsm_loop_metrics: no ncfsm_submit_handoffs_total");
  P0("KV stream.ncfsm_thread.handoffs %ld\nKV stream.ncfsm_thread.handoff_share %.3f\n\n", handoffs1 - handoffs0,
     (double)(handoffs1 - handoffs0) / ((double)sops[S_NCFSM_THREAD] * o.stream_rounds));

  /* ---- bandwidth ---- */
  size_t count = o.bw_bytes / sizeof(float);
  float *big, *bigsrc = NULL; /* bigsrc: the one-at-a-time section's source with --out-of-place */
  CCK(rt.cudaMalloc((void **)&big, o.bw_bytes));
  CCK(rt.cudaMemset(big, 0, o.bw_bytes));
  if (g_oop) {
    CCK(rt.cudaMalloc((void **)&bigsrc, o.bw_bytes));
    CCK(rt.cudaMemset(bigsrc, 0, o.bw_bytes));
  }
  CCK(rt.cudaDeviceSynchronize());
  double factor = j->size > 1 ? 2.0 * (j->size - 1) / j->size : 1.0; /* one rank: algbw */
  series bs[B_COUNT];
  memset(bs, 0, sizeof bs);
  barrier(j);
  for (int v = 0; v < B_COUNT; v++) bw_run(b, v, big, count, 3);
  for (int r = 0; r < o.bw_rounds; r++)
    for (int v = 0; v < B_COUNT; v++) {
      barrier(j);
      double c0 = thread_cpu_us(), w0 = now_us();
      bw_run(b, v, big, count, o.bw_iters);
      double us = now_us() - w0;
      bs[v].cpu_us += thread_cpu_us() - c0;
      bs[v].wall_us += us;
      push(&bs[v], (double)o.bw_bytes / (us / o.bw_iters) / 1e3 * factor); /* busbw GB/s */
    }
  for (int v = 0; v < B_COUNT; v++) sort_series(&bs[v]);
  P0("## %zu MiB AllReduce bus bandwidth, %d ops per round (submitted back to back), %d rounds, rank 0\n\n",
     o.bw_bytes >> 20, o.bw_iters, o.bw_rounds);
  P0("busbw = algbw * 2(n-1)/n, algbw = bytes / (round time / ops); GB = 1e9 bytes.\n\n");
  P0("| variant | what | median busbw GB/s | min | max | CPU of waiting thread | ncfsm/this |\n"
     "|---|---|---:|---:|---:|---:|---:|\n");
  for (int v = 0; v < B_COUNT; v++)
    P0("| %s | %s | %.1f | %.1f | %.1f | %.0f%% | %.4f |\n", binfo[v].key, binfo[v].desc, median(&bs[v]), bs[v].v[0],
       bs[v].v[bs[v].n - 1], 100.0 * bs[v].cpu_us / bs[v].wall_us, median(&bs[B_NCFSM]) / median(&bs[v]));
  P0("\n");
  for (int v = 0; v < B_COUNT; v++) {
    P0("KV bw.%s.busbw_GBps %.2f\n", binfo[v].key, median(&bs[v]));
    P0("KV bw.%s.cpu_pct %.1f\n", binfo[v].key, 100.0 * bs[v].cpu_us / bs[v].wall_us);
  }

  /* ---- one large op at a time: the poll schedule on a ~1 ms wait ---- */
  static const int sync_v[] = {V_RAW_BLOCK_SYNC, V_RAW_NB_YIELD, V_NCFSM, V_NCFSM_SPIN, V_NCFSM_PUSH, V_NCFSM_AUTO};
  enum { NSYNC = (int)(sizeof sync_v / sizeof sync_v[0]) };
  series ps[NSYNC];
  memset(ps, 0, sizeof ps);
  barrier(j);
  const float *sync_src = bigsrc ? bigsrc : big;
  for (int k = 0; k < NSYNC; k++) roundtrip2(b, sync_v[k], sync_src, big, count);
  for (int r = 0; r < 2; r++)
    for (int k = 0; k < NSYNC; k++) {
      barrier(j);
      double c0 = thread_cpu_us(), w0 = now_us();
      for (int i = 0; i < (o.sync_iters + 1) / 2; i++) push(&ps[k], roundtrip2(b, sync_v[k], sync_src, big, count));
      ps[k].cpu_us += thread_cpu_us() - c0;
      ps[k].wall_us += now_us() - w0;
    }
  for (int k = 0; k < NSYNC; k++) sort_series(&ps[k]);
  P0("## %zu MiB AllReduce%s, one at a time (submit, wait for completion, repeat), rank 0\n\n", o.bw_bytes >> 20,
     bigsrc ? " (out of place)" : "");
  P0("| variant | samples | median us | p99 us | busbw at median GB/s | CPU of waiting thread | ncfsm/this median |\n"
     "|---|---:|---:|---:|---:|---:|---:|\n");
  for (int k = 0; k < NSYNC; k++)
    P0("| %s | %d | %.1f | %.1f | %.1f | %.0f%% | %.4f |\n", vinfo[sync_v[k]].key, ps[k].n, median(&ps[k]),
       pct(&ps[k], 99), (double)o.bw_bytes / median(&ps[k]) / 1e3 * factor, 100.0 * ps[k].cpu_us / ps[k].wall_us,
       median(&ps[2]) / median(&ps[k]));
  P0("\n");
  for (int k = 0; k < NSYNC; k++) {
    P0("KV sync.%s.median_us %.1f\n", vinfo[sync_v[k]].key, median(&ps[k]));
    P0("KV sync.%s.cpu_pct %.1f\n", vinfo[sync_v[k]].key, 100.0 * ps[k].cpu_us / ps[k].wall_us);
  }

  if (o.sweep) {
    run_sweep(b, o.sweep_bytes, o.sweep_rounds, o.sweep_csv);
    run_gap(b, o.sweep_bytes, o.gap_ops, o.sweep_rounds);
  }

  if (o.skip_cpu) goto teardown;

  /* ---- waiting 1 s for a late peer: rank 1 joins 1 s late ---- */
  /* On one rank there is no peer: the variant's stream is held by a gate
   * (cuStreamWaitValue32 on a mapped host word) that a thread opens 1 s
   * later, so the op completes 1 s after it was submitted, as with a late peer. */
  static const int wait_v[] = {V_RAW_BLOCK_SYNC, V_RAW_NB_YIELD, V_NCFSM, V_NCFSM_PUSH, V_NCFSM_AUTO};
  enum { NWAIT = (int)(sizeof wait_v / sizeof wait_v[0]) };
  double wcpu[NWAIT], wwall[NWAIT];
  gate g = {0};
  if (j->size == 1) gate_init(&g);
  for (int k = 0; k < NWAIT; k++) {
    barrier(j);
    if (j->rank != 0) sleep_us(1000000);
    if (j->size == 1) gate_close(&g, variant_stream(b, wait_v[k]), 1000000);
    double c0 = thread_cpu_us(), w0 = now_us();
    roundtrip(b, wait_v[k], b->small[wait_v[k]], 2);
    wcpu[k] = thread_cpu_us() - c0;
    wwall[k] = now_us() - w0;
    if (j->size == 1) gate_join(&g);
  }
  if (j->size == 1) gate_free(&g);
  P0("## CPU of the waiting thread while a peer is 1 s late (8-byte AllReduce; %s), rank 0\n\n"
     "| variant | wait ms | thread CPU ms | CPU |\n|---|---:|---:|---:|\n",
     j->size == 1 ? "one rank: the stream is held by a gate (cuStreamWaitValue32) opened 1 s after the submit"
                  : "rank 1 submits 1 s after rank 0");
  for (int k = 0; k < NWAIT; k++) {
    P0("| %s | %.1f | %.2f | %.2f%% |\n", vinfo[wait_v[k]].key, wwall[k] / 1e3, wcpu[k] / 1e3,
       100.0 * wcpu[k] / wwall[k]);
  }
  P0("\n");
  for (int k = 0; k < NWAIT; k++) P0("KV wait1s.%s.cpu_pct %.3f\n", vinfo[wait_v[k]].key, 100.0 * wcpu[k] / wwall[k]);

  /* ---- idle: comms READY, nothing pending ---- */
  barrier(j);
  double p0 = process_cpu_us(), pw0 = now_us();
  sleep_us(1000000);
  double base_pct = 100.0 * (process_cpu_us() - p0) / (now_us() - pw0);
  /* ncfsm_loop_run(RUN_ONCE) with nothing pending returns at once (it never blocks there) */
  double r0 = now_us(), rc0 = thread_cpu_us();
  for (int i = 0; i < 1000; i++) FCK(ncfsm_loop_run(b->f.loop, NCFSM_RUN_ONCE));
  double once_us = (now_us() - r0) / 1000, once_cpu = (thread_cpu_us() - rc0) / 1000;
  /* a loop thread with a READY comm and nothing pending, for 1 s */
  FCK(ncfsm_loop_start_thread(b->f.loop));
  struct tclock tc = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  FCK(ncfsm_loop_call(b->f.loop, get_thread_clock, &tc));
  pthread_mutex_lock(&tc.mu);
  while (!tc.done) pthread_cond_wait(&tc.cv, &tc.mu);
  pthread_mutex_unlock(&tc.mu);
  double lc0 = clock_us(tc.id), lw0 = now_us(), lp0 = process_cpu_us();
  sleep_us(1000000);
  double lt_cpu = clock_us(tc.id) - lc0, lt_wall = now_us() - lw0, lp = process_cpu_us() - lp0;
  FCK(ncfsm_loop_stop_thread(b->f.loop));
  P0("## Idle: every comm READY, nothing pending, rank 0\n\n| what | wall ms | CPU ms | CPU |\n|---|---:|---:|---:|\n");
  P0("| whole process, main thread asleep, no loop thread (NCCL's own threads) | 1000 | %.2f | %.2f%% |\n",
     base_pct * 10, base_pct);
  P0("| ncfsm loop thread (ncfsm_loop_start_thread), idle | %.1f | %.3f | %.3f%% |\n", lt_wall / 1e3, lt_cpu / 1e3,
     100.0 * lt_cpu / lt_wall);
  P0("| whole process over that second | %.1f | %.2f | %.2f%% |\n", lt_wall / 1e3, lp / 1e3, 100.0 * lp / lt_wall);
  P0("\nncfsm_loop_run(RUN_ONCE) with nothing pending: returns at once, %.2f us wall, %.2f us CPU per call (it does "
     "not wait, so it cannot spin on its own).\n\n",
     once_us, once_cpu);
  P0("KV idle.loop_thread.cpu_pct %.4f\nKV idle.process_base.cpu_pct %.3f\nKV idle.process_loop.cpu_pct %.3f\n",
     100.0 * lt_cpu / lt_wall, base_pct, 100.0 * lp / lt_wall);

  /* ---- teardown ---- */
teardown:
  barrier(j);
  fsm_ctx *fs[] = {&b->f, &b->fspin, &b->fblk, &nocoal, &b->fpush, &b->fauto};
  for (int i = 0; i < 6; i++) {
    FCK(ncfsm_stream_destroy(fs[i]->comm, fs[i]->stream));
    FCK(ncfsm_comm_abort(fs[i]->comm));
    FCK(ncfsm_comm_release(fs[i]->comm));
  }
  NCK(nc.ncclCommAbort(b->rb));
  NCK(nc.ncclCommAbort(b->rn));
  for (int v = 0; v < V_COUNT; v++) CCK(rt.cudaFree(b->small[v]));
  CCK(rt.cudaFree(slab));
  CCK(rt.cudaFree(big));
  if (bigsrc) CCK(rt.cudaFree(bigsrc));
  rt.cudaEventDestroy(b->ev_nt);
  rt.cudaEventDestroy(b->ev_t);
  rt.cudaStreamDestroy(b->s_rb);
  rt.cudaStreamDestroy(b->s_rn);
  ncfsm_boot_close(j->boot);
  for (int i = 1; i < 6; i++) FCK(ncfsm_loop_close(fs[i]->loop));
  FCK(ncfsm_loop_close(j->loop));
  for (int v = 0; v < V_COUNT; v++) free(rts[v].v);
  for (int v = 0; v < S_COUNT; v++) free(ss[v].v);
  for (int v = 0; v < B_COUNT; v++) free(bs[v].v);
  for (int k = 0; k < NSYNC; k++) free(ps[k].v);
  P0("done\n");
  return 0;
}
