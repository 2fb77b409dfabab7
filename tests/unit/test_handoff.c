/* Submissions handed off while another thread holds the loop's lock (fsm/api_ops.c,
 * docs/design.md "Submissions from other threads"): the call returns without waiting, the
 * next holder of the lock enters the work in the order it was made, checks the call again in
 * the comm's state then, and every case the hand-off does not take (an argument error, an
 * open group) waits for the lock and gets the locked path's result and message. The test
 * holds the lock itself (the loop's thread in a long turn, as far as a submitter can tell).
 * Also built under TSan (label threads). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fsm/engine.h"
#include "helpers.h"
#include "ncfsm/introspect.h"

#define NOPS 6

static ncfsm_comm *comm;
static float bufs[NOPS][4];
static atomic_int ncb, order[NOPS], statuses[NOPS];

static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  int i = (int)(intptr_t)arg;
  atomic_store(&statuses[i], (int)st);
  atomic_store(&order[atomic_fetch_add(&ncb, 1)], i);
}

typedef struct sub {
  int first, n;          /* ops first .. first + n - 1 */
  ncfsm_dtype_t dtype;   /* NCFSM_FLOAT32, or an invalid one */
  ncfsm_work *w[NOPS];   /* handles (released by the test) */
  ncfsm_result_t rc[NOPS];
  atomic_int returned;   /* calls that returned */
  atomic_int go_second;  /* the submitter waits for it before its second half (ordering test) */
  int split;             /* submit ops [first, first + split) at once, the rest after go_second */
} sub;

static void *submitter(void *arg) {
  sub *s = arg;
  for (int k = 0; k < s->n; k++) {
    if (k == s->split)
      while (!atomic_load(&s->go_second)) sched_yield();
    int i = s->first + k;
    s->rc[k] = ncfsm_allreduce(comm, bufs[i], bufs[i], 4, s->dtype, NCFSM_OP_SUM, NULL, on_done, (void *)(intptr_t)i,
                               &s->w[k]);
    atomic_fetch_add(&s->returned, 1);
  }
  return NULL;
}

/* Waits up to ms for s to have returned from n calls. */
static bool returned_within(sub *s, int n, int ms) {
  for (int i = 0; i < ms; i++) {
    if (atomic_load(&s->returned) >= n) return true;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return atomic_load(&s->returned) >= n;
}

/* The lock taken (as the loop's thread in a turn holds it), s submits on a thread of its own;
 * true when n of its calls returned within ms. The lock stays held. */
static bool submit_while_locked(ncfsm_loop *loop, sub *s, pthread_t *th, int n, int ms) {
  pthread_mutex_lock(&loop->mu);
  assert_int_equal(pthread_create(th, NULL, submitter, s), 0);
  return returned_within(s, n, ms);
}

static ncfsm_loop *setup(void) {
  atomic_store(&ncb, 0);
  for (int i = 0; i < NOPS; i++) atomic_store(&order[i], -1), atomic_store(&statuses[i], -1);
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  comm = c[0];
  return loop;
}

static void run_until_callbacks(ncfsm_loop *loop, int n) {
  for (int i = 0; i < 20000 && atomic_load(&ncb) < n; i++) run_turns(loop, 1);
  assert_int_equal(atomic_load(&ncb), n);
}

static void release_all(sub *s) {
  for (int k = 0; k < s->n; k++)
    if (s->w[k]) assert_int_equal(ncfsm_work_release(s->w[k]), NCFSM_OK);
}

static uint64_t seq_of(const ncfsm_work *w) { return ncfsm_work_fingerprint(w)->seq; }

/* The lock taken: the calls return at once, handed off, and run in the order made. */
static void test_handoff_returns_without_the_lock(void **state) {
  (void)state;
  ncfsm_loop *loop = setup();
  sub s = {.first = 0, .n = 3, .dtype = NCFSM_FLOAT32, .split = 3};
  pthread_t th;
  bool back = submit_while_locked(loop, &s, &th, 3, 5000);
  int pending = atomic_load(&loop->nhandoff);
  pthread_mutex_unlock(&loop->mu);
  pthread_join(th, NULL);
  assert_true(back); /* a call waiting for the lock would not have returned */
  assert_int_equal(pending, 3);
  for (int k = 0; k < 3; k++) assert_int_equal(s.rc[k], NCFSM_OK);
  run_until_callbacks(loop, 3);
  assert_int_equal(loop->handoffs, 3);
  for (int k = 0; k < 3; k++) {
    assert_int_equal(atomic_load(&order[k]), k);
    assert_int_equal(atomic_load(&statuses[k]), NCFSM_OK);
    assert_int_equal(ncfsm_work_state(s.w[k]), NCFSM_WORK_COMPLETED);
  }
  assert_true(seq_of(s.w[0]) < seq_of(s.w[1]) && seq_of(s.w[1]) < seq_of(s.w[2]));
  char *text = NULL;
  assert_int_equal(ncfsm_loop_metrics(loop, &text, NULL), NCFSM_OK);
  assert_non_null(strstr(text, "\nncfsm_submit_handoffs_total 3\n"));
  free(text);
  release_all(&s);
  teardown_all(loop, &comm, 1);
}

/* A later call of the same thread that gets the lock does not overtake its handed-off ones. */
static void test_locked_call_does_not_overtake(void **state) {
  (void)state;
  ncfsm_loop *loop = setup();
  sub s = {.first = 0, .n = 4, .dtype = NCFSM_FLOAT32, .split = 2};
  pthread_t th;
  assert_true(submit_while_locked(loop, &s, &th, 2, 5000));
  pthread_mutex_unlock(&loop->mu);
  atomic_store(&s.go_second, 1); /* ops 2 and 3 find the lock free: the locked path */
  pthread_join(th, NULL);
  for (int k = 0; k < 4; k++) assert_int_equal(s.rc[k], NCFSM_OK);
  run_until_callbacks(loop, 4);
  assert_int_equal(loop->handoffs, 2);
  for (int k = 0; k < 4; k++) assert_int_equal(atomic_load(&order[k]), k);
  for (int k = 0; k < 3; k++) assert_true(seq_of(s.w[k]) < seq_of(s.w[k + 1]));
  release_all(&s);
  teardown_all(loop, &comm, 1);
}

/* The comm fails between the hand-off and its take: the work fails with the check's
 * error and never reaches the backend. */
static void test_recheck_at_take(void **state) {
  (void)state;
  ncfsm_loop *loop = setup();
  sub s = {.first = 0, .n = 1, .dtype = NCFSM_FLOAT32, .split = 1};
  pthread_t th;
  assert_true(submit_while_locked(loop, &s, &th, 1, 5000));
  pthread_join(th, NULL);
  ncfsm__comm_fail(comm, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, NCFSM__NCCL_INTERNAL_ERROR, "test: failed meanwhile");
  pthread_mutex_unlock(&loop->mu);
  assert_int_equal(s.rc[0], NCFSM_OK);
  run_until_callbacks(loop, 1);
  assert_int_not_equal(atomic_load(&statuses[0]), NCFSM_OK);
  assert_int_equal(ncfsm_work_state(s.w[0]), NCFSM_WORK_FAILED);
  assert_int_equal(ncfsm_work_launched(s.w[0]), 0); /* never reached the backend */
  assert_non_null(strstr(ncfsm_comm_last_error(comm), "ncfsm_allreduce: illegal in state"));
  release_all(&s);
  teardown_all(loop, &comm, 1);
}

/* An argument error is not handed off: the call waits for the lock and returns the error
 * with its message, as without a hand-off. */
static void test_argument_error_waits(void **state) {
  (void)state;
  ncfsm_loop *loop = setup();
  sub s = {.first = 0, .n = 1, .dtype = (ncfsm_dtype_t)99, .split = 1};
  pthread_t th;
  bool early = submit_while_locked(loop, &s, &th, 1, 100);
  pthread_mutex_unlock(&loop->mu);
  pthread_join(th, NULL);
  assert_false(early);
  assert_int_equal(s.rc[0], NCFSM_ERR_INVALID_ARGUMENT);
  assert_null(s.w[0]);
  assert_non_null(strstr(ncfsm_comm_last_error(comm), "datatype"));
  assert_int_equal(loop->handoffs, 0);
  teardown_all(loop, &comm, 1);
}

/* A group open on the loop (this thread's): another thread's op waits for the lock. */
static void test_open_group_waits(void **state) {
  (void)state;
  ncfsm_loop *loop = setup();
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  sub s = {.first = 0, .n = 1, .dtype = NCFSM_FLOAT32, .split = 1};
  pthread_t th;
  bool early = submit_while_locked(loop, &s, &th, 1, 100);
  pthread_mutex_unlock(&loop->mu);
  pthread_join(th, NULL);
  assert_false(early);
  assert_int_equal(s.rc[0], NCFSM_OK); /* its own batch: the group holds none of the comm's ops */
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  run_until_callbacks(loop, 1);
  assert_int_equal(atomic_load(&statuses[0]), NCFSM_OK);
  assert_int_equal(loop->handoffs, 0);
  release_all(&s);
  teardown_all(loop, &comm, 1);
}

/* A close that follows a handed-off op takes it first: the op completes before the
 * comm is finalized. */
static void *close_after_submit(void *arg) {
  sub *s = arg;
  submitter(s);
  s->rc[1] = ncfsm_comm_close(comm, NULL, NULL);
  return NULL;
}

static void test_close_takes_handoffs_first(void **state) {
  (void)state;
  ncfsm_loop *loop = setup();
  sub s = {.first = 0, .n = 1, .dtype = NCFSM_FLOAT32, .split = 1};
  pthread_mutex_lock(&loop->mu);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, close_after_submit, &s), 0);
  assert_true(returned_within(&s, 1, 5000));
  pthread_mutex_unlock(&loop->mu);
  pthread_join(th, NULL);
  assert_int_equal(s.rc[0], NCFSM_OK);
  assert_int_equal(s.rc[1], NCFSM_OK);
  run_until_callbacks(loop, 1);
  run_until_state(loop, comm, NCFSM_STATE_RELEASED); /* ncfsm_comm_close releases it when closed */
  assert_int_equal(atomic_load(&statuses[0]), NCFSM_OK);
  assert_int_equal(ncfsm_work_state(s.w[0]), NCFSM_WORK_COMPLETED);
  release_all(&s);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* A stream from another thread while the lock is taken, in rounds: the works come back
 * through the loop's spare stack, and the pool's idle trim gives that back too. */
static void test_spare_works_reused_and_trimmed(void **state) {
  (void)state;
  ncfsm_loop *loop = setup();
  int done = 0;
  for (int round = 0; round < 40; round++) {
    sub s = {.first = 0, .n = NOPS, .dtype = NCFSM_FLOAT32, .split = NOPS};
    atomic_store(&ncb, 0);
    pthread_t th;
    assert_true(submit_while_locked(loop, &s, &th, NOPS, 5000));
    pthread_mutex_unlock(&loop->mu);
    pthread_join(th, NULL);
    run_until_callbacks(loop, NOPS);
    release_all(&s);
    done += NOPS;
  }
  assert_int_equal(loop->handoffs, (uint64_t)done);
  pthread_mutex_lock(&loop->mu);
  assert_non_null(atomic_load(&loop->spare)); /* the pool past its quarantine, for the next hand-offs */
  ncfsm__pool_trim(loop);
  assert_null(atomic_load(&loop->spare));
  pthread_mutex_unlock(&loop->mu);
  teardown_all(loop, &comm, 1);
}

/* Threads streaming to a loop on its own thread, each keeping its handles: every work
 * completes, each thread's works took seqs in the order it submitted them (handed off: the
 * loop runs on its own thread; a wait takes the lock and the stack). */
#define STREAM_THREADS 3
#define STREAM_OPS 600
static float sbufs[STREAM_THREADS][64][4];

typedef struct streamer {
  int k;
  ncfsm_work *w[STREAM_OPS];
  int bad;
} streamer;

static void *stream_main(void *arg) {
  streamer *st = arg;
  for (int i = 0; i < STREAM_OPS; i++) {
    float *b = sbufs[st->k][i & 63];
    if (ncfsm_allreduce(comm, b, b, 4, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &st->w[i]) != NCFSM_OK) st->bad++;
    if (i % 97 == 96 && ncfsm_work_wait(st->w[i], 10000) != NCFSM_OK) st->bad++; /* now and then, wait */
  }
  for (int i = 0; i < STREAM_OPS; i++)
    if (ncfsm_work_wait(st->w[i], 10000) != NCFSM_OK) st->bad++;
  return NULL;
}

static void test_threads_stream_in_order(void **state) {
  (void)state;
  ncfsm_loop *loop = setup();
  assert_int_equal(ncfsm_loop_start_thread(loop), NCFSM_OK);
  streamer st[STREAM_THREADS];
  pthread_t th[STREAM_THREADS];
  for (int k = 0; k < STREAM_THREADS; k++) {
    st[k] = (streamer){.k = k};
    assert_int_equal(pthread_create(&th[k], NULL, stream_main, &st[k]), 0);
  }
  for (int k = 0; k < STREAM_THREADS; k++) pthread_join(th[k], NULL);
  for (int k = 0; k < STREAM_THREADS; k++) {
    assert_int_equal(st[k].bad, 0);
    for (int i = 0; i + 1 < STREAM_OPS; i++) assert_true(seq_of(st[k].w[i]) < seq_of(st[k].w[i + 1]));
    for (int i = 0; i < STREAM_OPS; i++) assert_int_equal(ncfsm_work_release(st[k].w[i]), NCFSM_OK);
  }
  assert_int_equal(ncfsm_loop_stop_thread(loop), NCFSM_OK);
  printf("streams: %llu of %d submissions handed off\n", (unsigned long long)loop->handoffs,
         STREAM_THREADS * STREAM_OPS);
  teardown_all(loop, &comm, 1);
}

/* Threads streaming while the comm fails under them (the loop on its own thread): every
 * call either returned an error or gave a work that reaches a final state with exactly one
 * callback; the works submitted after the failure never reached the backend as OK. */
static atomic_int fcb_count, fcb_ok, fsubmitted;
static void on_fail_stream(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  (void)arg;
  atomic_fetch_add(&fcb_count, 1);
  if (st == NCFSM_OK) atomic_fetch_add(&fcb_ok, 1);
}

typedef struct fstreamer {
  int k, accepted, refused;
} fstreamer;

#define FAIL_OPS 4000
static void *fail_stream_main(void *arg) {
  fstreamer *st = arg;
  for (int i = 0; i < FAIL_OPS; i++) {
    if (i % 64 == 63) sched_yield(); /* paced: the failure lands while they submit */
    float *b = sbufs[st->k][i & 63];
    if (ncfsm_allreduce(comm, b, b, 4, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_fail_stream, NULL, NULL) == NCFSM_OK)
      st->accepted++;
    else
      st->refused++;
    atomic_fetch_add(&fsubmitted, 1);
  }
  return NULL;
}

static void test_comm_fails_under_streams(void **state) {
  (void)state;
  ncfsm_loop *loop = setup();
  atomic_store(&fcb_count, 0);
  atomic_store(&fcb_ok, 0);
  atomic_store(&fsubmitted, 0);
  assert_int_equal(ncfsm_loop_start_thread(loop), NCFSM_OK);
  fstreamer st[STREAM_THREADS];
  pthread_t th[STREAM_THREADS];
  for (int k = 0; k < STREAM_THREADS; k++) {
    st[k] = (fstreamer){.k = k};
    assert_int_equal(pthread_create(&th[k], NULL, fail_stream_main, &st[k]), 0);
  }
  while (atomic_load(&fsubmitted) < FAIL_OPS / 2) sched_yield(); /* a sixth of them made */
  pthread_mutex_lock(&loop->mu);
  ncfsm__comm_fail(comm, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, NCFSM__NCCL_INTERNAL_ERROR,
                   "test: failed mid-stream");
  pthread_mutex_unlock(&loop->mu);
  for (int k = 0; k < STREAM_THREADS; k++) pthread_join(th[k], NULL);
  int accepted = 0;
  for (int k = 0; k < STREAM_THREADS; k++) {
    accepted += st[k].accepted;
    assert_int_equal(st[k].accepted + st[k].refused, FAIL_OPS);
  }
  for (int i = 0; i < 20000 && atomic_load(&fcb_count) < accepted; i++) {
    struct timespec t1 = {0, 1000000};
    nanosleep(&t1, NULL);
  }
  assert_int_equal(atomic_load(&fcb_count), accepted); /* one callback per accepted call, none lost */
  assert_int_equal(ncfsm_loop_stop_thread(loop), NCFSM_OK);
  assert_int_equal(atomic_load(&fcb_count), accepted); /* and none twice */
  printf("failed mid-stream: %d accepted (%d completed), %d refused, %llu handed off\n", accepted,
         atomic_load(&fcb_ok), STREAM_THREADS * FAIL_OPS - accepted, (unsigned long long)loop->handoffs);
  teardown_all(loop, &comm, 1);
}

/* ---- interleavings found in review: a gate in a backend or loop hook holds the submitter
 * at one point of its hand-off (a preemption there) ---- */

static atomic_int gate_entered, gate_go, gate_returned;
static __thread bool gated;
static void gate_wait(atomic_int *f) {
  while (!atomic_load(f)) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
}
static void gate_reset(void) {
  atomic_store(&gate_entered, 0);
  atomic_store(&gate_go, 0);
  atomic_store(&gate_returned, 0);
}

static ncfsm__backend gate_be;
static const ncfsm__backend *orig_be;
static int gated_stream_device(void *stream, int *dev) {
  if (gated) { /* the submitter in its argument check: past its READY and group tests */
    atomic_store(&gate_entered, 1);
    gate_wait(&gate_go);
  }
  return orig_be->stream_device(stream, dev);
}

typedef struct gsub {
  ncfsm_comm *c;
  void *stream;
  ncfsm_result_t rc;
  ncfsm_work *w;
} gsub;
static void *gsub_main(void *arg) {
  gsub *g = arg;
  gated = true;
  g->rc = ncfsm_allreduce(g->c, bufs[0], bufs[0], 4, NCFSM_FLOAT32, NCFSM_OP_SUM, g->stream, on_done,
                          (void *)(intptr_t)0, &g->w);
  atomic_store(&gate_returned, 1);
  return NULL;
}

/* Another thread's hand-off refused at its take (its comm failed meanwhile) is checked on the
 * submitter's behalf: the group the taking thread has open is not touched. */
static void test_refused_handoff_leaves_takers_group(void **state) {
  (void)state;
  ncfsm_loop *loop = setup();
  gate_reset();
  ncfsm_comm *other;
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  make_comms(loop, 1, &o, &other, 0);
  run_until_state(loop, other, NCFSM_STATE_READY);
  gsub g = {.c = comm};
  assert_int_equal(ncfsm_stream_create(comm, &g.stream), NCFSM_OK);
  pthread_mutex_lock(&loop->mu);
  orig_be = comm->be;
  gate_be = *orig_be;
  gate_be.stream_device = gated_stream_device;
  comm->be = &gate_be;
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, gsub_main, &g), 0);
  gate_wait(&gate_entered); /* it saw READY and no group: it hands off */
  pthread_mutex_unlock(&loop->mu);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK); /* this thread's group (nothing on the stack yet) */
  pthread_mutex_lock(&loop->mu);
  ncfsm__comm_fail(comm, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, NCFSM__NCCL_INTERNAL_ERROR, "test: failed meanwhile");
  pthread_mutex_unlock(&loop->mu);
  atomic_store(&gate_go, 1);
  pthread_join(th, NULL);
  assert_int_equal(g.rc, NCFSM_OK);
  ncfsm_work *mine = NULL; /* its lock takes the other thread's work */
  assert_int_equal(ncfsm_allreduce(other, bufs[1], bufs[1], 4, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_done,
                                   (void *)(intptr_t)1, &mine), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  run_until_callbacks(loop, 2);
  assert_int_equal(ncfsm_work_status(mine), NCFSM_OK);
  assert_int_equal(ncfsm_work_state(g.w), NCFSM_WORK_FAILED);
  assert_int_equal(ncfsm_work_release(mine), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(g.w), NCFSM_OK);
  pthread_mutex_lock(&loop->mu);
  comm->be = orig_be;
  pthread_mutex_unlock(&loop->mu);
  assert_int_equal(ncfsm_stream_destroy(comm, g.stream), NCFSM_OK);
  ncfsm_comm *both[2] = {comm, other};
  teardown_all(loop, both, 2);
}

static ncfsm__loop_ops gate_ops;
static const ncfsm__loop_ops *orig_ops;
static void gated_wake(ncfsm_loop *l) {
  if (gated) { /* the submitter after its push, before its wake */
    atomic_store(&gate_entered, 1);
    gate_wait(&gate_go);
  }
  orig_ops->wake(l);
}

typedef struct closer {
  ncfsm_loop *loop;
  ncfsm_result_t rc[3];
  atomic_int done;
} closer;
static void *closer_main(void *arg) {
  closer *k = arg;
  k->rc[0] = ncfsm_comm_abort(comm);
  k->rc[1] = ncfsm_comm_release(comm);
  k->rc[2] = ncfsm_loop_close(k->loop);
  atomic_store(&k->done, 1);
  return NULL;
}

/* The work of a hand-off can complete before its submitter has returned (it still wakes the
 * loop): a close of the loop then waits for the submitter to leave it. */
static void test_close_waits_for_submitter(void **state) {
  (void)state;
  ncfsm_loop *loop = setup();
  gate_reset();
  gsub g = {.c = comm};
  pthread_mutex_lock(&loop->mu);
  orig_ops = loop->ops;
  gate_ops = *orig_ops;
  gate_ops.wake = gated_wake;
  loop->ops = &gate_ops;
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, gsub_main, &g), 0);
  gate_wait(&gate_entered); /* pushed, not yet returned */
  pthread_mutex_unlock(&loop->mu);
  run_until_callbacks(loop, 1);
  assert_int_equal(atomic_load(&gate_returned), 0); /* done, and its call still inside the loop */
  assert_int_equal(ncfsm_work_release(g.w), NCFSM_OK);
  closer k = {.loop = loop};
  pthread_t tc;
  assert_int_equal(pthread_create(&tc, NULL, closer_main, &k), 0);
  struct timespec ts = {0, 100 * 1000000};
  nanosleep(&ts, NULL);
  assert_int_equal(atomic_load(&k.done), 0); /* the close waits for the submitter */
  atomic_store(&gate_go, 1);
  pthread_join(th, NULL);
  pthread_join(tc, NULL);
  assert_int_equal(g.rc, NCFSM_OK);
  for (int i = 0; i < 3; i++) assert_int_equal(k.rc[i], NCFSM_OK);
}

/* A loop on its own thread: another thread's submission hands off even when the lock is free
 * (taking it between two of that thread's turns made the thread sleep on it), and one pushed
 * while that thread waits in libevent wakes it (the push wakes only a thread that waits: a
 * push that woke none here never gets its callback). */
static void test_threaded_loop_hands_off_first(void **state) {
  (void)state;
  ncfsm_loop *loop = setup();
  assert_int_equal(ncfsm_loop_start_thread(loop), NCFSM_OK);
  for (int i = 0; i < NOPS; i++) {
    struct timespec ts = {0, 5 * 1000000}; /* by now the loop's thread waits in libevent */
    nanosleep(&ts, NULL);
    assert_int_equal(ncfsm_allreduce(comm, bufs[i], bufs[i], 4, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_done,
                                     (void *)(intptr_t)i, NULL),
                     NCFSM_OK);
    /* the callback, without taking the loop's lock (a locked call would take the stack and
     * wake the loop itself) */
    for (int ms = 0; ms < 5000 && atomic_load(&ncb) < i + 1; ms++) {
      struct timespec one = {0, 1000000};
      nanosleep(&one, NULL);
    }
    assert_int_equal(atomic_load(&ncb), i + 1);
    assert_int_equal(atomic_load(&order[i]), i);
    assert_int_equal(atomic_load(&statuses[i]), NCFSM_OK);
  }
  assert_int_equal(ncfsm_loop_stop_thread(loop), NCFSM_OK);
  assert_int_equal(loop->handoffs, NOPS); /* every one handed off, none through the lock */
  teardown_all(loop, &comm, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_handoff_returns_without_the_lock),
      cmocka_unit_test(test_locked_call_does_not_overtake),
      cmocka_unit_test(test_recheck_at_take),
      cmocka_unit_test(test_argument_error_waits),
      cmocka_unit_test(test_open_group_waits),
      cmocka_unit_test(test_close_takes_handoffs_first),
      cmocka_unit_test(test_spare_works_reused_and_trimmed),
      cmocka_unit_test(test_threads_stream_in_order),
      cmocka_unit_test(test_comm_fails_under_streams),
      cmocka_unit_test(test_refused_handoff_leaves_takers_group),
      cmocka_unit_test(test_close_waits_for_submitter),
      cmocka_unit_test(test_threaded_loop_hands_off_first),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
