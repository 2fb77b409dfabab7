/*
 * The modes of bench/engine_overhead (engine_modes.h). Every comm is a
 * 1-rank clique with a unique id of its own: the null backend hands out the
 * same id every time, so the id's first 8 bytes are overwritten with the
 * comm's number (as NCCL's ids differ in their leading magic); with equal
 * ids the launcher would take the comms for ranks of one clique.
 */
#define _GNU_SOURCE
#include "engine_modes.h"

#include <jansson.h>
#include <ncfsm/bootstrap.h>
#include <ncfsm/introspect.h>

#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <valgrind/callgrind.h>

static long done_count;
long em_done(void) { return __atomic_load_n(&done_count, __ATOMIC_RELAXED); }

static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  (void)arg;
  if (st == NCFSM_OK) __atomic_fetch_add(&done_count, 1, __ATOMIC_RELAXED);
}

/* arg: a counter of the submitting thread's own completions. */
static void on_done_mine(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  on_done(w, st, NULL);
  if (st == NCFSM_OK) __atomic_fetch_add((long *)arg, 1, __ATOMIC_RELEASE);
}

/* ---- set-up --------------------------------------------------------------------------- */

/* A failed call: its name, the code and this thread's last error (ncfsm_last_error). */
static int fail(const char *what, ncfsm_result_t r) {
  fprintf(stderr, "engine_overhead: %s failed: %s: %s\n", what, ncfsm_err_name(r), ncfsm_last_error());
  return -1;
}

/* coalesce_max: 0 keeps the default (NCFSM_COALESCE_MAX); CAP_AUTO is auto. */
#define CAP_AUTO UINT32_MAX
static int new_loop(unsigned coalesce_max, ncfsm_loop **out) {
  ncfsm_loop_opts lo;
  ncfsm_result_t r = ncfsm_loop_opts_init(&lo);
  if (r != NCFSM_OK) return fail("ncfsm_loop_opts_init", r);
  if (coalesce_max) lo.coalesce_max = coalesce_max == CAP_AUTO ? 0 : coalesce_max;
  r = ncfsm_loop_new(&lo, out);
  return r == NCFSM_OK ? 0 : fail("ncfsm_loop_new", r);
}

static int new_comm(ncfsm_loop *loop, uint64_t tag, ncfsm_comm **out) {
  ncfsm_comm_opts o;
  ncfsm_unique_id id;
  ncfsm_result_t r = ncfsm_comm_opts_init(&o);
  if (r != NCFSM_OK) return fail("ncfsm_comm_opts_init", r);
  o.backend = NCFSM_BACKEND_AUTO;
  if ((r = ncfsm_get_unique_id(o.backend, &id)) != NCFSM_OK) return fail("ncfsm_get_unique_id", r);
  memcpy(id.internal, &tag, sizeof tag);
  if ((r = ncfsm_comm_new(loop, &o, out)) != NCFSM_OK) return fail("ncfsm_comm_new", r);
  if ((r = ncfsm_comm_init(*out, 1, 0, &id)) != NCFSM_OK) {
    fail("ncfsm_comm_init", r);
    ncfsm_comm_release(*out); /* still NEW */
    *out = NULL;
    return -1;
  }
  return 0;
}

/* One loop with ncomms READY comms and nslots buffer slots. */
static int open_bench(em_bench *b, unsigned coalesce_max, int ncomms, long nslots) {
  if (new_loop(coalesce_max, &b->loop)) return -1;
  b->comms = calloc((size_t)ncomms, sizeof *b->comms);
  b->bufs = calloc((size_t)nslots * 16, sizeof *b->bufs);
  if (!b->comms || !b->bufs) {
    fprintf(stderr, "engine_overhead: out of memory for %d comms and %ld buffers\n", ncomms, nslots);
    return -1;
  }
  b->nslots = nslots;
  for (int i = 0; i < ncomms; i++, b->ncomms++)
    if (new_comm(b->loop, (uint64_t)i + 1, &b->comms[i])) return -1;
  for (int i = 0; i < ncomms; i++) {
    ncfsm_result_t r = ncfsm_comm_wait_state(b->comms[i], NCFSM_STATE_READY, 10000);
    if (r != NCFSM_OK) return fail("ncfsm_comm_wait_state(READY)", r);
  }
  return 0;
}

static void close_comm(ncfsm_comm *c) {
  if (!c) return;
  ncfsm_comm_abort(c);
  ncfsm_comm_release(c);
}

void em_teardown(em_bench *b) {
  if (b->pinned) pthread_setaffinity_np(pthread_self(), sizeof b->cpus, &b->cpus);
  if (b->loop_thread) ncfsm_loop_stop_thread(b->loop);
  for (int i = 0; i < b->ncomms; i++) close_comm(b->comms[i]);
  close_comm(b->ref_comm);
  if (b->loop) ncfsm_loop_run(b->loop, NCFSM_RUN_NOWAIT); /* the aborts: the comms' channels close */
  for (int i = 0; i < 2; i++) ncfsm_boot_close(b->boots[i]);
  if (b->loop) ncfsm_loop_close(b->loop);
  if (b->ref_loop) ncfsm_loop_close(b->ref_loop);
  free(b->comms);
  free(b->bufs);
}

/* ---- submitting ----------------------------------------------------------------------- */

/* Slot k (k < nslots): 16 floats, an op's send at 0 and its out-of-place receive at 8. */
static float *slot(const em_bench *b, long k) { return b->bufs + 16 * k; }

/* An out-of-place AllReduce on slot k (as pingpong and burst) or in place. */
static int submit_to(ncfsm_comm *c, float *s, int in_place, ncfsm_work **out, long *mine) {
  ncfsm_result_t r = ncfsm_allreduce(c, s, in_place ? s : s + 8, 1, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL,
                                     mine ? on_done_mine : on_done, mine, out);
  return r == NCFSM_OK ? 0 : fail("ncfsm_allreduce", r);
}
static int submit(ncfsm_comm *c, float *s, int in_place, ncfsm_work **out) {
  return submit_to(c, s, in_place, out, NULL);
}

static int run_loop(ncfsm_loop *loop) {
  ncfsm_result_t r = ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT);
  return r == NCFSM_OK ? 0 : fail("ncfsm_loop_run", r);
}

static long rounds(long n, long per) { return (n + per - 1) / per; }

/* ---- one clique of 2 ranks on the loop (issue 21: verification's cost) ------------------- */

/* Both ranks of one clique on the loop, verification off or async (its ranks
 * compare in memory: fsm/verify_local.c). */
static int setup_pair(em_bench *b, ncfsm_verify_mode_t mode) {
  if (new_loop(0, &b->loop)) return -1;
  b->comms = calloc(2, sizeof *b->comms);
  b->bufs = calloc(2 * 16, sizeof *b->bufs);
  if (!b->comms || !b->bufs) return -1;
  b->nslots = 2;
  ncfsm_unique_id id;
  ncfsm_result_t r = ncfsm_get_unique_id(NCFSM_BACKEND_AUTO, &id);
  if (r != NCFSM_OK) return fail("ncfsm_get_unique_id", r);
  uint64_t tag = 0x9a1f;
  memcpy(id.internal, &tag, sizeof tag);
  for (int k = 0; k < 2; k++, b->ncomms++) {
    ncfsm_comm_opts o;
    if ((r = ncfsm_comm_opts_init(&o)) != NCFSM_OK) return fail("ncfsm_comm_opts_init", r);
    o.verify = mode;
    if ((r = ncfsm_comm_new(b->loop, &o, &b->comms[k])) != NCFSM_OK) return fail("ncfsm_comm_new", r);
    if ((r = ncfsm_comm_init(b->comms[k], 2, k, &id)) != NCFSM_OK) return fail("ncfsm_comm_init", r);
  }
  for (int k = 0; k < 2; k++)
    if ((r = ncfsm_comm_wait_state(b->comms[k], NCFSM_STATE_READY, 10000)) != NCFSM_OK)
      return fail("ncfsm_comm_wait_state(READY)", r);
  return 0;
}
static int setup_pair_off(em_bench *b) { return setup_pair(b, NCFSM_VERIFY_OFF); }
static int setup_pair_async(em_bench *b) { return setup_pair(b, NCFSM_VERIFY_ASYNC); }

/* The same 2 ranks initialised over an in-process bootstrap (ncfsm_comm_init_boot):
 * verification async exchanges on its channel (fsm/verify_channel.c), as ranks in
 * other processes do. */
static int setup_pair_boot(em_bench *b, ncfsm_verify_mode_t mode) {
  if (new_loop(0, &b->loop)) return -1;
  b->comms = calloc(2, sizeof *b->comms);
  b->bufs = calloc(2 * 16, sizeof *b->bufs);
  if (!b->comms || !b->bufs) return -1;
  b->nslots = 2;
  char group[64];
  snprintf(group, sizeof group, "engine-overhead-%d-%d", (int)getpid(), (int)mode);
  ncfsm_result_t r;
  for (int k = 0; k < 2; k++, b->ncomms++) {
    ncfsm_boot_opts bo;
    ncfsm_boot_opts_init(&bo);
    bo.kind = NCFSM_BOOT_LOCAL;
    bo.local_group = group;
    bo.rank = k;
    bo.size = 2;
    if ((r = ncfsm_boot_open(ncfsm_loop_base(b->loop), &bo, &b->boots[k])) != NCFSM_OK) return fail("ncfsm_boot_open", r);
    ncfsm_comm_opts o;
    if ((r = ncfsm_comm_opts_init(&o)) != NCFSM_OK) return fail("ncfsm_comm_opts_init", r);
    o.verify = mode;
    if ((r = ncfsm_comm_new(b->loop, &o, &b->comms[k])) != NCFSM_OK) return fail("ncfsm_comm_new", r);
    if ((r = ncfsm_comm_init_boot(b->comms[k], b->boots[k])) != NCFSM_OK) return fail("ncfsm_comm_init_boot", r);
  }
  for (int k = 0; k < 2; k++)
    if ((r = ncfsm_comm_wait_state(b->comms[k], NCFSM_STATE_READY, 10000)) != NCFSM_OK)
      return fail("ncfsm_comm_wait_state(READY)", r);
  return 0;
}
static int setup_pair_boot_off(em_bench *b) { return setup_pair_boot(b, NCFSM_VERIFY_OFF); }
static int setup_pair_boot_async(em_bench *b) { return setup_pair_boot(b, NCFSM_VERIFY_ASYNC); }

/* An AllReduce on both ranks, the loop run until both completed: n ops
 * are n works, n / 2 collectives. */
static long pair_pingpong(em_bench *b, long n) {
  for (long i = 0; i < n / 2; i++)
    if (submit(b->comms[0], slot(b, 0), 0, NULL) || submit(b->comms[1], slot(b, 1), 0, NULL) || run_loop(b->loop))
      return -1;
  return n / 2 * 2;
}

/* N 2-rank cliques (verification async, compared in memory), all 2N comms on one
 * loop: an AllReduce on both ranks of one clique, the cliques in turn. A verified
 * comm of several ranks that has nothing to do must cost a turn nothing. */
static int setup_pairs(em_bench *b) {
  int np = (int)b->param;
  if (new_loop(0, &b->loop)) return -1;
  b->comms = calloc((size_t)np * 2, sizeof *b->comms);
  b->bufs = calloc((size_t)np * 2 * 16, sizeof *b->bufs);
  if (!b->comms || !b->bufs) return -1;
  b->nslots = np * 2;
  ncfsm_result_t r;
  for (int p = 0; p < np; p++) {
    ncfsm_unique_id id;
    if ((r = ncfsm_get_unique_id(NCFSM_BACKEND_AUTO, &id)) != NCFSM_OK) return fail("ncfsm_get_unique_id", r);
    uint64_t tag = 0x9a20 + (uint64_t)p;
    memcpy(id.internal, &tag, sizeof tag);
    for (int k = 0; k < 2; k++, b->ncomms++) {
      ncfsm_comm_opts o;
      if ((r = ncfsm_comm_opts_init(&o)) != NCFSM_OK) return fail("ncfsm_comm_opts_init", r);
      o.verify = NCFSM_VERIFY_ASYNC;
      if ((r = ncfsm_comm_new(b->loop, &o, &b->comms[2 * p + k])) != NCFSM_OK) return fail("ncfsm_comm_new", r);
      if ((r = ncfsm_comm_init(b->comms[2 * p + k], 2, k, &id)) != NCFSM_OK) return fail("ncfsm_comm_init", r);
    }
  }
  for (int k = 0; k < 2 * np; k++)
    if ((r = ncfsm_comm_wait_state(b->comms[k], NCFSM_STATE_READY, 10000)) != NCFSM_OK)
      return fail("ncfsm_comm_wait_state(READY)", r);
  return 0;
}

static long pairs_rr(em_bench *b, long n) {
  long np = b->ncomms / 2;
  for (long i = 0; i < n / 2; i++) {
    long p = i % np;
    if (submit(b->comms[2 * p], slot(b, 2 * p), 0, NULL) || submit(b->comms[2 * p + 1], slot(b, 2 * p + 1), 0, NULL) ||
        run_loop(b->loop))
      return -1;
  }
  return n / 2 * 2;
}

/* ---- issue 2's patterns on one comm --------------------------------------------------- */

static int setup_one(em_bench *b) { return open_bench(b, 0, 1, 64); }
/* coalesce: the cap pinned at 64, whatever the default is (the figures of docs/benchmarks.md) */
static int setup_cap64(em_bench *b) { return open_bench(b, 64, 1, 64); }

static long pingpong(em_bench *b, long n) {
  ncfsm_comm *c = b->comms[0];
  float *s = slot(b, 0);
  for (long i = 0; i < n; i++)
    if (submit(c, s, 0, NULL) || run_loop(b->loop)) return -1;
  return n;
}

static long burst(em_bench *b, long n) {
  ncfsm_comm *c = b->comms[0];
  float *s = slot(b, 0);
  for (long i = 0; i < n; i++)
    if (submit(c, s, 0, NULL)) return -1;
  return run_loop(b->loop) ? -1 : n;
}

/* n ops over 64 buffers in place: up to coalesce_max share one backend group. */
static long coalesce(em_bench *b, long n) {
  ncfsm_comm *c = b->comms[0];
  for (long i = 0; i < n; i++)
    if (submit(c, slot(b, i & 63), 1, NULL)) return -1;
  return run_loop(b->loop) ? -1 : n;
}

/* ---- the coalescing cap chosen (auto) against 64 --------------------------------------- */

/* The measured loop with the cap auto; the reference (not under callgrind:
 * the mode coalesce is that) a loop with the cap pinned at 64. */
static int setup_auto(em_bench *b) {
  if (open_bench(b, CAP_AUTO, 1, 64)) return -1;
  if (b->callgrind) return 0;
  if (new_loop(64, &b->ref_loop) || new_comm(b->ref_loop, 1, &b->ref_comm)) return -1;
  ncfsm_result_t r = ncfsm_comm_wait_state(b->ref_comm, NCFSM_STATE_READY, 10000);
  return r == NCFSM_OK ? 0 : fail("ncfsm_comm_wait_state(READY)", r);
}

static long coalesce_ref(em_bench *b, long n) {
  for (long i = 0; i < n; i++)
    if (submit(b->ref_comm, b->bufs + 16 * (i & 63), 1, NULL)) return -1;
  return run_loop(b->ref_loop) ? -1 : n;
}

/* What auto chose: the loop's /status member loop.coalesce. */
static void auto_after(em_bench *b) {
  json_t *st = NULL;
  if (ncfsm_loop_status(b->loop, NULL, &st) != NCFSM_OK) return;
  json_t *co = json_object_get(json_object_get(st, "loop"), "coalesce");
  json_t *fx = json_object_get(co, "fixed_ns"), *po = json_object_get(co, "per_op_ns");
  snprintf(b->report, sizeof b->report,
           "  coalesce %s: cap %lld, launch cost fixed %.0f ns + %.1f ns per op (%lld launches measured)\n",
           json_string_value(json_object_get(co, "mode")), (long long)json_integer_value(json_object_get(co, "cap")),
           json_is_number(fx) ? json_number_value(fx) : -1.0, json_is_number(po) ? json_number_value(po) : -1.0,
           (long long)json_integer_value(json_object_get(co, "measured")));
  json_decref(st);
}

/* ---- N comms on one loop -------------------------------------------------------------- */

static int setup_comms(em_bench *b) { return open_bench(b, 0, (int)b->param, b->param); }

/* Pingpong across the comms in turn. */
static long comms_rr(em_bench *b, long n) {
  for (long i = 0; i < n; i++) {
    long k = i % b->ncomms;
    if (submit(b->comms[k], slot(b, k), 0, NULL) || run_loop(b->loop)) return -1;
  }
  return n;
}

/* One op on every comm, then the loop. */
static long comms_each(em_bench *b, long n) {
  long r = rounds(n, b->ncomms);
  for (long j = 0; j < r; j++) {
    for (int k = 0; k < b->ncomms; k++)
      if (submit(b->comms[k], slot(b, k), 0, NULL)) return -1;
    if (run_loop(b->loop)) return -1;
  }
  return r * b->ncomms;
}

/* ---- outstanding works, explicit groups ------------------------------------------------ */

static int setup_ring(em_bench *b) { return open_bench(b, 0, 1, b->param > 64 ? b->param : 64); }

/* W ops over 64 buffers in place (as coalesce), then the loop. */
static long works(em_bench *b, long n) {
  long r = rounds(n, b->param);
  for (long j = 0; j < r; j++) {
    for (long i = 0; i < b->param; i++)
      if (submit(b->comms[0], slot(b, i & 63), 1, NULL)) return -1;
    if (run_loop(b->loop)) return -1;
  }
  return r * b->param;
}

/* G ops on G buffers in place between ncfsm_group_start and _end, then the loop. */
static long group(em_bench *b, long n) {
  long r = rounds(n, b->param);
  for (long j = 0; j < r; j++) {
    ncfsm_result_t rc = ncfsm_group_start(b->loop);
    if (rc != NCFSM_OK) return fail("ncfsm_group_start", rc);
    for (long i = 0; i < b->param; i++)
      if (submit(b->comms[0], slot(b, i), 1, NULL)) {
        ncfsm_group_end(b->loop); /* must still be called; it fails the group */
        return -1;
      }
    if ((rc = ncfsm_group_end(b->loop)) != NCFSM_OK) return fail("ncfsm_group_end", rc);
    if (run_loop(b->loop)) return -1;
  }
  return r * b->param;
}

/* ---- R12: buffer order within a launch ------------------------------------------------- */

static int setup_cap(em_bench *b) { return open_bench(b, (unsigned)b->param, 1, b->param); }

/* order 0: ascending, 1: descending, 2: scattered (slot i * 40503 mod C, the
 * same permutation every round when C is a power of two; else repeats) */
static long r12(em_bench *b, long n, int order) {
  long cap = b->param, r = rounds(n, cap);
  for (long j = 0; j < r; j++) {
    for (long i = 0; i < cap; i++)
      if (submit(b->comms[0], slot(b, order == 1 ? cap - 1 - i : order == 2 ? (i * 40503) % cap : i), 1, NULL))
        return -1;
    if (run_loop(b->loop)) return -1;
  }
  return r * cap;
}
static long r12_asc(em_bench *b, long n) { return r12(b, n, 0); }
static long r12_desc(em_bench *b, long n) { return r12(b, n, 1); }
static long r12_rand(em_bench *b, long n) { return r12(b, n, 2); }

/* ---- submitting threads against driving the loop ---------------------------------------- */

/* Submit, wait for the work, release it: what a waiting thread does per op. */
static long wait_ops(ncfsm_comm *c, float *s, long n) {
  for (long i = 0; i < n; i++) {
    ncfsm_work *w;
    if (submit(c, s, 0, &w)) return -1;
    ncfsm_result_t r = ncfsm_work_wait(w, 0);
    ncfsm_work_release(w);
    if (r != NCFSM_OK) return fail("ncfsm_work_wait", r);
  }
  return n;
}

/* n ops over the 64 buffers from s in place (as coalesce), then wait for the
 * last one and for every callback of them (counted in *mine). */
static long stream_ops(ncfsm_comm *c, float *s, long n, long *mine) {
  ncfsm_work *w = NULL;
  for (long i = 0; i < n; i++)
    if (submit_to(c, s + 16 * (i & 63), 1, i == n - 1 ? &w : NULL, mine)) return -1;
  ncfsm_result_t r = w ? ncfsm_work_wait(w, 0) : NCFSM_OK;
  if (w) ncfsm_work_release(w);
  if (r != NCFSM_OK) return fail("ncfsm_work_wait", r);
  for (long spins = 0; __atomic_load_n(mine, __ATOMIC_ACQUIRE) < n; spins++) {
    if (spins > 10000000) {
      fprintf(stderr, "engine_overhead: %ld of %ld callbacks ran after the last work completed\n",
              __atomic_load_n(mine, __ATOMIC_ACQUIRE), n);
      return -1;
    }
    sched_yield();
  }
  return n;
}

/* The same calls on a loop no thread runs: ncfsm_work_wait drives it. */
static long selfdrive(em_bench *b, long n) { return wait_ops(b->comms[0], slot(b, 0), n); }

typedef struct sync1 {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  void (*fn)(int);
  int arg;
} sync1;

static void sync_on_loop(void *arg) {
  sync1 *s = arg;
  s->fn(s->arg);
  pthread_mutex_lock(&s->mu);
  s->done = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* fn(arg) on the loop's thread; returns once it ran. */
static int on_loop_thread(ncfsm_loop *loop, void (*fn)(int), int arg) {
  sync1 s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, fn, arg};
  ncfsm_result_t r = ncfsm_loop_call(loop, sync_on_loop, &s);
  if (r != NCFSM_OK) return fail("ncfsm_loop_call", r);
  pthread_mutex_lock(&s.mu);
  while (!s.done) pthread_cond_wait(&s.cv, &s.mu);
  pthread_mutex_unlock(&s.mu);
  return 0;
}

static void toggle(int unused) {
  (void)unused;
  CALLGRIND_TOGGLE_COLLECT;
}

/* Toggle callgrind's collection on the loop's thread, and wait until it did. */
static int toggle_loop_thread(ncfsm_loop *loop) { return on_loop_thread(loop, toggle, 0); }

/* --pin: the calling thread on CPU cpu (modulo the CPUs online). */
static void pin_self(int cpu) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET((int)(cpu % (n > 0 ? n : 1)), &set);
  int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  if (rc != 0) fprintf(stderr, "engine_overhead: --pin: CPU %d: %s\n", cpu, strerror(rc));
}

typedef struct submitter {
  em_bench *b;
  int stream;  /* 1: stream_ops on 64 buffers of its own; 0: wait_ops on one */
  long k, n, got, mine;
  pthread_t th;
} submitter;

static void *submitter_main(void *arg) {
  submitter *s = arg;
  if (s->b->pin) pin_self(1 + (int)s->k);
  if (s->b->collect) CALLGRIND_TOGGLE_COLLECT;
  ncfsm_comm *c = s->b->comms[0];
  s->got = s->stream ? stream_ops(c, slot(s->b, 64 * s->k), s->n, &s->mine) : wait_ops(c, slot(s->b, s->k), s->n);
  if (s->b->collect) CALLGRIND_TOGGLE_COLLECT;
  return NULL;
}

static int setup_threads(em_bench *b) {
  if (open_bench(b, 0, 1, 64 * b->param)) return -1;
  ncfsm_result_t r = ncfsm_loop_start_thread(b->loop);
  if (r != NCFSM_OK) return fail("ncfsm_loop_start_thread", r);
  b->loop_thread = 1;
  if (b->pin) { /* the loop's thread on CPU 0, this one (the reference) on 1, submitter k on 1 + k */
    if (pthread_getaffinity_np(pthread_self(), sizeof b->cpus, &b->cpus) == 0) b->pinned = 1;
    if (on_loop_thread(b->loop, pin_self, 0)) return -1;
    pin_self(1);
  }
  if (b->callgrind) return 0; /* the references are modes of their own: coalesce, selfdrive */
  if (new_loop(0, &b->ref_loop) || new_comm(b->ref_loop, 1, &b->ref_comm)) return -1;
  r = ncfsm_comm_wait_state(b->ref_comm, NCFSM_STATE_READY, 10000);
  return r == NCFSM_OK ? 0 : fail("ncfsm_comm_wait_state(READY)", r);
}

/* T threads, n ops in all, each on buffers of its own; the loop runs on its
 * own thread (ncfsm_loop_start_thread). */
static long submitters(em_bench *b, long n, int stream) {
  submitter s[64];
  long t = b->param, got = 0;
  int err = b->collect && toggle_loop_thread(b->loop);
  for (long i = 0; i < t && !err; i++) {
    s[i] = (submitter){.b = b, .stream = stream, .k = i, .n = n / t + (i < n % t), .got = -1};
    if (pthread_create(&s[i].th, NULL, submitter_main, &s[i]) != 0) t = i, err = 1;
  }
  for (long i = 0; i < t; i++) {
    pthread_join(s[i].th, NULL);
    if (s[i].got < 0) err = 1;
    got += s[i].got;
  }
  if (b->collect && toggle_loop_thread(b->loop)) err = 1;
  return err ? -1 : got;
}
static long threads_stream(em_bench *b, long n) { return submitters(b, n, 1); }
static long threads_wait(em_bench *b, long n) { return submitters(b, n, 0); }

/* The references, on a loop the calling thread drives: coalesce's pattern, and selfdrive's. */
static long stream_ref(em_bench *b, long n) {
  for (long i = 0; i < n; i++)
    if (submit(b->ref_comm, b->bufs + 16 * (i & 63), 1, NULL)) return -1;
  return run_loop(b->ref_loop) ? -1 : n;
}
static long wait_ref(em_bench *b, long n) { return wait_ops(b->ref_comm, b->bufs, n); }

/* ---- memory around a peak of outstanding works ----------------------------------------- */

typedef struct mem_sample {
  long rss_kb, heap_kb;
} mem_sample;

static mem_sample sample(void) {
  mem_sample m = {-1, -1};
  long size, resident;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld %ld", &size, &resident) == 2) m.rss_kb = resident * (sysconf(_SC_PAGESIZE) / 1024);
    fclose(f);
  }
  struct mallinfo2 mi = mallinfo2();
  m.heap_kb = (long)((mi.uordblks + mi.hblkhd) / 1024);
  return m;
}

static mem_sample mem_base;

static int setup_memory(em_bench *b) {
  if (open_bench(b, 0, 1, 64) || pingpong(b, 1000) < 0) return -1; /* the steady state before the peak */
  mem_base = sample();
  return 0;
}

static void idle(em_bench *b) {
  if (ncfsm_loop_start_thread(b->loop) != NCFSM_OK) return;
  struct timespec ts = {b->idle_ms / 1000, (b->idle_ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  ncfsm_loop_stop_thread(b->loop);
}

static mem_sample mem_peak, mem_after;

/* Submit the peak (as coalesce), sample, run them, sample. */
static long memory(em_bench *b, long n) {
  (void)n;
  for (long i = 0; i < b->param; i++)
    if (submit(b->comms[0], slot(b, i & 63), 1, NULL)) return -1;
  mem_peak = sample();
  if (run_loop(b->loop)) return -1;
  mem_after = sample();
  return b->param;
}

/* After the measured run: idle, sample, report. */
static void memory_after(em_bench *b) {
  idle(b);
  mem_sample peak = mem_peak, after = mem_after, idled = sample();
  snprintf(b->report, sizeof b->report,
           "  memory rss_kb base=%ld peak=%ld done=%ld idle=%ld heap_kb base=%ld peak=%ld done=%ld idle=%ld "
           "(peak of %ld outstanding works, idle %ld ms)\n",
           mem_base.rss_kb, peak.rss_kb, after.rss_kb, idled.rss_kb, mem_base.heap_kb, peak.heap_kb,
           after.heap_kb, idled.heap_kb, b->param, b->idle_ms);
}

/* ---- the table ------------------------------------------------------------------------- */

static const long n_comms[] = {1, 8, 64, 512, 0}, n_works[] = {1, 8, 64, 4096, 0}, n_group[] = {1, 8, 64, 0},
                  n_cap[] = {64, 1024, 4096, 0}, n_threads[] = {1, 2, 4, 0}, n_peak[] = {131072, 0};

#define ONE .warm = 1, .setup = setup_one
const em_mode em_modes[] = {
    {"pingpong", "submit one op, run the loop until it completes", ONE, .run = pingpong},
    {"burst", "submit n ops on one buffer, then run (one launch each)", ONE, .run = burst},
    {"coalesce", "submit n ops over 64 buffers, then run (64 per launch)", .warm = 1, .setup = setup_cap64,
     .run = coalesce},
    {"coalesce-auto", "coalesce with the cap auto; .64: coalesce (cap 64), same run", .warm = 1,
     .setup = setup_auto, .run = coalesce, .run_ref = coalesce_ref, .ref_suffix = ".64", .after = auto_after},
    {"rr", "N comms: pingpong across them in turn", 1, 4096, n_comms, .warm = 1, .setup = setup_comms,
     .run = comms_rr},
    {"each", "N comms: one op on every comm, then run", 1, 4096, n_comms, .warm = 1, .setup = setup_comms,
     .run = comms_each},
    {"works", "W outstanding works over 64 buffers, then run", 1, 1 << 20, n_works, .warm = 1,
     .setup = setup_ring, .run = works},
    {"group", "G ops on G buffers in one explicit group, then run", 1, 4096, n_group, .warm = 1,
     .setup = setup_ring, .run = group},
    {"r12-asc", "coalesce_max C, C buffers in ascending order, then run", 1, 65536, n_cap, .warm = 1,
     .setup = setup_cap, .run = r12_asc},
    {"r12-desc", "coalesce_max C, C buffers in descending order, then run", 1, 65536, n_cap, .warm = 1,
     .setup = setup_cap, .run = r12_desc},
    {"r12-rand", "coalesce_max C, C buffers in a scattered order (slot i * 40503 mod C), then run", 1, 65536, n_cap,
     .warm = 1, .setup = setup_cap, .run = r12_rand},
    {"pair-off", "2 ranks of one clique, verification off: an AllReduce on both, run (per work)", .warm = 1,
     .setup = setup_pair_off, .run = pair_pingpong},
    {"pair-async", "the same with verification async (the ranks compare in memory)", .warm = 1,
     .setup = setup_pair_async, .run = pair_pingpong},
    {"pair-boot-off", "2 ranks over an in-process bootstrap, verification off (per work)", .warm = 1,
     .setup = setup_pair_boot_off, .run = pair_pingpong},
    {"pair-boot-async", "the same with verification async (exchanges on the bootstrap's channel)", .warm = 1,
     .setup = setup_pair_boot_async, .run = pair_pingpong},
    {"pairs", "N 2-rank cliques verified async: pair-async across them in turn (per work)", 1, 2048, n_comms,
     .warm = 1, .setup = setup_pairs, .run = pairs_rr},
    {"selfdrive", "submit, ncfsm_work_wait, release; the waiting thread drives the loop", ONE, .run = selfdrive},
    {"threads", "T threads stream ops (as coalesce) to the loop's own thread; .self: coalesce, same run", 1, 64,
     n_threads, .warm = 1, .setup = setup_threads, .run = threads_stream, .run_ref = stream_ref},
    {"waiters", "T threads submit, wait, release to the loop's own thread; .self: selfdrive, same run", 1, 64,
     n_threads, .warm = 1, .setup = setup_threads, .run = threads_wait, .run_ref = wait_ref},
    {"memory", "RSS and heap around a peak of P outstanding works (as coalesce), then idle", 1, 1 << 24, n_peak,
     .one_run = 1, .setup = setup_memory, .run = memory, .after = memory_after},
};
#undef ONE
const int em_nmodes = (int)(sizeof em_modes / sizeof em_modes[0]);

const em_mode *em_find(const char *name, long *param, char *why, size_t len) {
  for (int i = 0; i < em_nmodes; i++) {
    const em_mode *m = &em_modes[i];
    size_t fl = strlen(m->family);
    if (strncmp(name, m->family, fl) != 0) continue;
    if (!m->min_param) {
      if (name[fl]) continue;
      *param = 0;
      return m;
    }
    if (name[fl] != '-') continue;
    char *end;
    long p = strtol(name + fl + 1, &end, 10);
    if (end == name + fl + 1 || *end) continue; /* "r12-asc" is not "r12-asc-..." of family "r12" */
    if (p < m->min_param || p > m->max_param) {
      snprintf(why, len, "mode %s: the parameter of %s-N must be %ld..%ld, not %ld", name, m->family,
               m->min_param, m->max_param, p);
      return NULL;
    }
    *param = p;
    return m;
  }
  snprintf(why, len, "no mode is named '%s' (engine_overhead --list names them)", name);
  return NULL;
}
