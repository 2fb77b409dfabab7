/*
 * The nccl backend's streams, events and device memory (the CUDA runtime,
 * loaded by nccl_load.c), and push completion's wakeup (host_notify).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/nccl_internal.h"
#include "core/settings.h"

typedef struct nccl_event {
  cudaEvent_t ev;
  int device;
} nccl_event;

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
    cudaError_t ce = ncfsm__rt.cudaEventSynchronize(it->ev);
    if (ce != cudaSuccess)
      NCFSM_WARN(NCFSM__SUB_BACKEND, "push wake: cudaEventSynchronize failed: %s (the loop's fallback timer "
                                     "still sees the completion)", ncfsm__nccl_cuda_err(ce));
    it->fn(it->arg);
    ncfsm__rt.cudaEventDestroy(it->ev);
    free(it);
  }
  return NULL;
}

static int push_wake_event(void) {
  static int mode = -1;
  if (mode < 0) {
    /* hostfn|event; refused: hostfn, logged (ncfsm_comm_new refused it first) */
    ncfsm__setting_val v;
    ncfsm__setting_env(NCFSM__SET_PUSH_WAKE, &v);
    mode = v.u == 1;
  }
  return mode;
}

static int host_notify_event(void *stream, void (*fn)(void *), void *arg) {
  int d = -1;
  if (ncfsm__rt.cudaStreamGetDevice && stream && ncfsm__rt.cudaStreamGetDevice((cudaStream_t)stream, &d) == cudaSuccess) {
    int rc = ncfsm__nccl_force_device(d);
    if (rc) return rc;
  }
  wake_item *it = calloc(1, sizeof *it);
  if (!it) return (int)cudaErrorMemoryAllocation;
  cudaError_t ce = ncfsm__rt.cudaEventCreateWithFlags(&it->ev, cudaEventBlockingSync | cudaEventDisableTiming);
  if (ce == cudaSuccess) {
    ce = ncfsm__rt.cudaEventRecord(it->ev, (cudaStream_t)stream);
    if (ce != cudaSuccess) ncfsm__rt.cudaEventDestroy(it->ev);
  }
  if (ce != cudaSuccess) {
    free(it);
    return ncfsm__nccl_cuda_fail(ce);
  }
  it->fn = fn;
  it->arg = arg;
  pthread_mutex_lock(&wq.mu);
  if (wq.started == 0) wq.started = ncfsm__thread_detached(wake_main, NULL) == 0 ? 1 : -1;
  if (wq.started < 0) {
    pthread_mutex_unlock(&wq.mu);
    ncfsm__rt.cudaEventDestroy(it->ev);
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

int ncfsm__nccl_host_notify(void *stream, void (*fn)(void *), void *arg) {
  if (ncfsm__nccl_not_usable()) return ncclSystemError;
  if (push_wake_event()) return host_notify_event(stream, fn, arg);
  return (int)ncfsm__rt.cudaLaunchHostFunc((cudaStream_t)stream, (cudaHostFn_t)fn, arg);
}

int ncfsm__nccl_stream_create(int device, void **stream) {
  *stream = NULL;
  int e = ncfsm__nccl_force_device(device);
  if (e) return e;
  cudaStream_t s = NULL;
  cudaError_t ce = ncfsm__rt.cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (ce != cudaSuccess) {
    NCFSM_WARN(NCFSM__SUB_BACKEND, "cudaStreamCreateWithFlags on device %d failed: %s", device, ncfsm__nccl_cuda_err(ce));
    return ncfsm__nccl_cuda_fail(ce);
  }
  *stream = s;
  return 0;
}

int ncfsm__nccl_stream_destroy(void *stream) {
  cudaError_t ce = ncfsm__rt.cudaStreamDestroy((cudaStream_t)stream);
  return ce == cudaSuccess ? 0 : ncfsm__nccl_cuda_fail(ce);
}

int ncfsm__nccl_stream_device(void *stream, int *device) {
  *device = -1;
  /* The legacy and per-thread default streams have no fixed device. */
  if (stream == NULL || stream == (void *)cudaStreamLegacy || stream == (void *)cudaStreamPerThread) return 0;
  if (!ncfsm__rt.cudaStreamGetDevice) return 0; /* runtime older than 12.8: unknown */
  int d = -1;
  cudaError_t ce = ncfsm__rt.cudaStreamGetDevice((cudaStream_t)stream, &d);
  if (ce != cudaSuccess) return ncfsm__nccl_cuda_fail(ce);
  *device = d;
  return 0;
}

static int event_new(int device, int timing, void **ev) {
  *ev = NULL;
  nccl_event *e = malloc(sizeof *e);
  if (!e) return (int)cudaErrorMemoryAllocation;
  int rc = ncfsm__nccl_force_device(device);
  if (rc) {
    free(e);
    return rc;
  }
  /* Timing only when asked (event_elapsed_ms needs it): a timing event costs
   * several microseconds per round trip (measured, docs/benchmarks.md). */
  cudaError_t ce = ncfsm__rt.cudaEventCreateWithFlags(&e->ev, timing ? cudaEventDefault : cudaEventDisableTiming);
  if (ce != cudaSuccess) {
    free(e);
    NCFSM_WARN(NCFSM__SUB_BACKEND, "cudaEventCreateWithFlags on device %d failed: %s", device, ncfsm__nccl_cuda_err(ce));
    return ncfsm__nccl_cuda_fail(ce);
  }
  e->device = device;
  *ev = e;
  return 0;
}

int ncfsm__nccl_event_create(int device, void **ev) { return event_new(device, 1, ev); }
int ncfsm__nccl_event_create_flags(int device, int timing, void **ev) {
  return event_new(device, timing, ev);
}

/* The engine records only after a launch is final (R2): an event recorded
 * while the group end is InProgress completes before the kernels exist. */
int ncfsm__nccl_event_record(void *ev, void *stream) {
  nccl_event *e = ev;
  int rc = ncfsm__nccl_use_device(e->device);
  if (rc) return rc;
  cudaError_t ce = ncfsm__rt.cudaEventRecord(e->ev, (cudaStream_t)stream);
  return ce == cudaSuccess ? 0 : ncfsm__nccl_cuda_fail(ce);
}

int ncfsm__nccl_event_query(void *ev) {
  cudaError_t ce = ncfsm__rt.cudaEventQuery(((nccl_event *)ev)->ev);
  if (__builtin_expect(ce == cudaSuccess, 1)) return 0;
  (void)ncfsm__rt.cudaGetLastError(); /* NotReady included, as PyTorch does */
  if (ce == cudaErrorNotReady) return 1;
  /* cudaErrorInvalidValue (1) would read as "not complete": report it as -1. */
  return ce == cudaErrorInvalidValue ? -1 : (int)ce;
}

int ncfsm__nccl_event_elapsed_ms(void *start, void *stop, float *ms) {
  cudaError_t ce = ncfsm__rt.cudaEventElapsedTime(ms, ((nccl_event *)start)->ev, ((nccl_event *)stop)->ev);
  return ce == cudaSuccess ? 0 : ncfsm__nccl_cuda_fail(ce);
}

int ncfsm__nccl_event_destroy(void *ev) {
  nccl_event *e = ev;
  if (!e) return 0;
  cudaError_t ce = ncfsm__rt.cudaEventDestroy(e->ev);
  free(e);
  return ce == cudaSuccess ? 0 : ncfsm__nccl_cuda_fail(ce);
}

int ncfsm__nccl_mem_alloc(int device, size_t bytes, void **ptr) {
  *ptr = NULL;
  int rc = ncfsm__nccl_force_device(device);
  if (rc) return rc;
  cudaError_t ce = ncfsm__rt.cudaMalloc(ptr, bytes ? bytes : 1);
  if (ce != cudaSuccess) {
    *ptr = NULL;
    NCFSM_WARN(NCFSM__SUB_BACKEND, "cudaMalloc(%zu) on device %d failed: %s", bytes, device, ncfsm__nccl_cuda_err(ce));
    return ncfsm__nccl_cuda_fail(ce);
  }
  return 0;
}

int ncfsm__nccl_mem_free(int device, void *ptr) {
  int rc = ncfsm__nccl_force_device(device);
  if (rc) return rc;
  cudaError_t ce = ncfsm__rt.cudaFree(ptr);
  return ce == cudaSuccess ? 0 : ncfsm__nccl_cuda_fail(ce);
}

/* Synchronous copy (legacy default stream semantics of cudaMemcpy): it does
 * not wait for work on the comm's non-blocking streams; wait for the works. */
int ncfsm__nccl_memcpy_sync(int device, void *dst, const void *src, size_t bytes, int to_device) {
  if (!bytes) return 0;
  int rc = ncfsm__nccl_force_device(device);
  if (rc) return rc;
  cudaError_t ce = ncfsm__rt.cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
  if (ce != cudaSuccess) {
    NCFSM_WARN(NCFSM__SUB_BACKEND, "cudaMemcpy(%zu bytes, %s) on device %d failed: %s", bytes,
               to_device ? "to device" : "to host", device, ncfsm__nccl_cuda_err(ce));
    return ncfsm__nccl_cuda_fail(ce);
  }
  return 0;
}

