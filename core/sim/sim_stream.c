/*
 * Streams and events of the sim backend: a model of CUDA streams on the host.
 *
 * A stream is a FIFO of tickets, one per op posted on it. An op is enqueued
 * when it is POSTED (after launch_polls for an InProgress group end), not
 * when its call returns: an event recorded right after an InProgress group
 * end therefore completes at once, as measured on NCCL 2.28 (R2). An op
 * completes when it executes (or is dropped by destroy/abort/revoke); the
 * stream completes in FIFO order. Return codes are cudaError_t values.
 * Progress (op execution) runs inside event_query, as the GPU would, and,
 * while a host function is pending, on the process's device thread (below).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/sim/sim-internal.h"

#define LOCK() pthread_mutex_lock(&ncfsm__sim_mu)
#define UNLOCK() pthread_mutex_unlock(&ncfsm__sim_mu)

int ncfsm__sim_stream_valid(const void *stream) {
  const sim_stream *s = stream;
  return s && s->magic == SIM_MAGIC_STREAM && !s->destroyed;
}

static sim_event *event_of(void *ev) {
  sim_event *e = ev;
  return (e && e->magic == SIM_MAGIC_EVENT) ? e : NULL;
}

static void stream_maybe_free(sim_stream *s) {
  if (!s->destroyed || s->refs) return;
  s->magic = SIM_MAGIC_DEAD;
  free(s->fl);
  free(s);
}

static int ring_grow(sim_stream *s) {
  size_t ncap = s->cap ? s->cap * 2 : 64;
  uint8_t *nf = calloc(ncap, 1);
  if (!nf) return -1;
  size_t len = (size_t)(s->enq - s->done);
  for (size_t k = 0; k < len; k++) nf[k] = s->fl[(s->head + k) & (s->cap - 1)];
  free(s->fl);
  s->fl = nf;
  s->cap = ncap;
  s->head = 0;
  return 0;
}

int ncfsm__sim_stream_enqueue(sim_stream *s, uint64_t *ticket) {
  size_t len = (size_t)(s->enq - s->done);
  if (len == s->cap && ring_grow(s)) return -1;
  s->fl[(s->head + len) & (s->cap - 1)] = 0;
  *ticket = ++s->enq;
  s->refs++;
  return 0;
}

/* ---- the device thread ------------------------------------------------------
 * A GPU runs what was launched on its streams whether or not its host calls
 * CUDA or NCCL again; the sim runs ops inside its calls (event_query, a
 * launch). A host function is how a host that stops calling waits: ncfsm's
 * push completion sleeps until one runs. Were the sim's progress left to the
 * calls, such a process would neither deposit its posted ops nor collect its
 * results, so a peer in another process would wait for it, fall back to push
 * itself, and each op would take the loops' fallback timer. So while a host
 * function of this process is pending, a thread of its own (started at the
 * first such wait, detached) runs the progress every tick: DEV_TICK_MIN_US,
 * doubling while no host function ran, at most DEV_TICK_MAX_US. It waits on
 * dev.cv, without a tick, while none is pending. */
#define DEV_TICK_MIN_US 10
#define DEV_TICK_MAX_US 250

static struct {
  pthread_cond_t cv; /* with ncfsm__sim_mu: a host function became pending */
  int started;       /* 1: the thread runs; -1: it could not be started (the loops poll) */
  uint64_t pending;  /* host functions of this process not yet run */
} dev = {.cv = PTHREAD_COND_INITIALIZER};

static void *device_main(void *arg) {
  (void)arg;
  unsigned tick = DEV_TICK_MIN_US;
  LOCK();
  for (;;) {
    while (!dev.pending) {
      pthread_cond_wait(&dev.cv, &ncfsm__sim_mu);
      tick = DEV_TICK_MIN_US;
    }
    uint64_t before = dev.pending; /* only host_notify adds, under the lock */
    ncfsm__sim_progress();         /* runs the host functions whose point it reached */
    tick = dev.pending < before ? DEV_TICK_MIN_US : tick * 2 > DEV_TICK_MAX_US ? DEV_TICK_MAX_US : tick * 2;
    UNLOCK();
    struct timespec ts = {0, (long)tick * 1000};
    nanosleep(&ts, NULL);
    LOCK();
  }
  return NULL;
}

/* A host function became pending: the thread (started once) runs the progress. */
static void device_wake(void) {
  if (dev.started == 0) {
    dev.started = ncfsm__thread_detached(device_main, NULL) == 0 ? 1 : -1;
    if (dev.started < 0)
      ncfsm__sim_warn("sim: the device thread could not be started: a host function runs only when this "
                      "process calls the sim (its loop's fallback timer)");
  }
  if (dev.started > 0) pthread_cond_signal(&dev.cv);
}

void ncfsm__sim_device_forked(void) {
  pthread_cond_init(&dev.cv, NULL); /* the parent's thread may have been waiting on it */
  dev.started = 0;
  dev.pending = 0; /* the parent's host functions are its own (sim_stream.fork_gen) */
}

/* Host functions whose point the stream has reached run now (as CUDA runs
 * them on its own thread: they must not call back into the sim). */
static void run_notes(sim_stream *s) {
  while (s->notes && s->notes->target <= s->done) {
    sim_note *n = s->notes;
    s->notes = n->next;
    if (!s->notes) s->notes_tail = NULL;
    if (s->fork_gen == ncfsm__sim_fork_gen) dev.pending--; /* counted pending by this process */
    n->fn(n->arg);
    free(n);
    s->refs--;
  }
}

void ncfsm__sim_stream_complete(sim_stream *s, uint64_t t) {
  size_t k = (size_t)(t - s->done - 1);
  s->fl[(s->head + k) & (s->cap - 1)] = 1;
  while (s->enq > s->done && s->fl[s->head]) { /* FIFO: the prefix completes */
    s->fl[s->head] = 0;
    s->head = (s->head + 1) & (s->cap - 1);
    s->done++;
  }
  s->refs--;
  run_notes(s);
  stream_maybe_free(s);
}

int ncfsm__sim_host_notify(void *stream, void (*fn)(void *), void *arg) {
  if (!fn) return SIM_CUDA_INVALID_VALUE;
  LOCK();
  int rc = 0;
  if (!ncfsm__sim_stream_valid(stream)) {
    rc = SIM_CUDA_INVALID_HANDLE;
  } else {
    sim_stream *s = stream;
    sim_note *n = calloc(1, sizeof *n);
    if (!n) {
      rc = SIM_CUDA_NO_MEMORY;
    } else {
      n->target = s->enq;
      n->fn = fn;
      n->arg = arg;
      if (s->notes_tail) s->notes_tail->next = n;
      else s->notes = n;
      s->notes_tail = n;
      s->refs++;
      if (s->fork_gen == ncfsm__sim_fork_gen) dev.pending++; /* not on a forked child's copy of a stream */
      run_notes(s); /* nothing pending: it runs at once */
      if (dev.pending) device_wake();
    }
  }
  UNLOCK();
  return rc;
}

int ncfsm__sim_stream_create(int device, void **stream) {
  if (!stream) return SIM_CUDA_INVALID_VALUE;
  sim_stream *s = calloc(1, sizeof *s);
  if (!s) return SIM_CUDA_NO_MEMORY;
  s->magic = SIM_MAGIC_STREAM;
  s->device = device;
  s->fork_gen = ncfsm__sim_fork_gen;
  *stream = s;
  return 0;
}

/* Like cudaStreamDestroy: returns at once; the stream is freed once its
 * outstanding ops completed and no event points at it. */
int ncfsm__sim_stream_destroy(void *stream) {
  LOCK();
  int rc = 0;
  if (!ncfsm__sim_stream_valid(stream)) {
    rc = SIM_CUDA_INVALID_HANDLE;
  } else {
    sim_stream *s = stream;
    s->destroyed = 1;
    stream_maybe_free(s);
  }
  UNLOCK();
  return rc;
}

int ncfsm__sim_stream_device(void *stream, int *device) {
  if (!device) return SIM_CUDA_INVALID_VALUE;
  if (!stream) { /* the legacy default stream: device unknown */
    *device = -1;
    return 0;
  }
  LOCK();
  int rc = 0;
  if (!ncfsm__sim_stream_valid(stream)) rc = SIM_CUDA_INVALID_HANDLE;
  else *device = ((sim_stream *)stream)->device;
  UNLOCK();
  return rc;
}

int ncfsm__sim_event_create(int device, void **ev) {
  if (!ev) return SIM_CUDA_INVALID_VALUE;
  sim_event *e = calloc(1, sizeof *e);
  if (!e) return SIM_CUDA_NO_MEMORY;
  e->magic = SIM_MAGIC_EVENT;
  e->device = device;
  *ev = e;
  return 0;
}

static void event_release_stream(sim_event *e) {
  if (!e->s) return;
  sim_stream *s = e->s;
  e->s = NULL;
  s->refs--;
  stream_maybe_free(s);
}

/* Marks the stream's current tail. The NULL stream is not modelled as the
 * legacy default stream: an event recorded there is complete at once. */
int ncfsm__sim_event_record(void *ev, void *stream) {
  LOCK();
  int rc = 0;
  sim_event *e = event_of(ev);
  if (!e || (stream && !ncfsm__sim_stream_valid(stream))) {
    rc = SIM_CUDA_INVALID_HANDLE;
  } else {
    event_release_stream(e);
    e->recorded = 1;
    e->t_ns = 0;
    e->target = 0;
    if (stream) {
      sim_stream *s = stream;
      e->s = s;
      e->target = s->enq;
      s->refs++;
    }
  }
  UNLOCK();
  return rc;
}

/* 1 when complete (stamping the host time of the first sighting), else 0. */
static int event_check(sim_event *e) {
  if (e->s && e->s->done < e->target) return 0;
  event_release_stream(e);
  if (!e->t_ns) e->t_ns = ncfsm__now_ns();
  return 1;
}

int ncfsm__sim_event_query(void *ev) {
  LOCK();
  int rc;
  sim_event *e = event_of(ev);
  if (!e) {
    rc = SIM_CUDA_INVALID_HANDLE;
  } else {
    ncfsm__sim_progress();
    rc = (!e->recorded || event_check(e)) ? 0 : 1; /* never recorded: complete, as CUDA */
  }
  UNLOCK();
  return rc;
}

/* HOST time between the first sightings of the two events as complete (by
 * event_query or here), not GPU time: the sim has no device clock. */
int ncfsm__sim_event_elapsed_ms(void *start, void *stop, float *ms) {
  if (!ms) return SIM_CUDA_INVALID_VALUE;
  LOCK();
  int rc = 0;
  sim_event *a = event_of(start), *b = event_of(stop);
  if (!a || !b || !a->recorded || !b->recorded) {
    rc = SIM_CUDA_INVALID_HANDLE;
  } else {
    ncfsm__sim_progress();
    int ca = event_check(a), cb = event_check(b);
    if (!ca || !cb) rc = SIM_CUDA_NOT_READY;
    else *ms = (float)((double)((int64_t)(b->t_ns - a->t_ns)) / 1e6);
  }
  UNLOCK();
  return rc;
}

int ncfsm__sim_event_destroy(void *ev) {
  LOCK();
  int rc = 0;
  sim_event *e = event_of(ev);
  if (!e) {
    rc = SIM_CUDA_INVALID_HANDLE;
  } else {
    event_release_stream(e);
    e->magic = SIM_MAGIC_DEAD;
    free(e);
  }
  UNLOCK();
  return rc;
}
