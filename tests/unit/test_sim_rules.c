/*
 * What ncfsm prevents. Each test first drives the raw sim backend the way a
 * program using NCCL directly might (the sim reproduces NCCL 2.28's measured
 * behaviour: R2-R4 of docs/nccl-rules.md), then makes the same mistake through ncfsm,
 * which rejects it before the backend and keeps the communicator healthy.
 * R13: the drift limit of local ranks. R11: mismatched collectives, which
 * NCCL does not detect: the sim reproduces the measured table (some ranks
 * complete silently, the others hang), on the raw backend and through ncfsm,
 * where the watchdog ends the hanging side.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "core/sim/sim.h"
#include "helpers.h"

static const ncfsm__backend *be = &ncfsm__backend_sim;

static void raw_init(void **comms, int n, ncfsm_sim_opts *so, int blocking) {
  ncfsm_unique_id id;
  assert_int_equal(be->get_unique_id(&id), 0);
  ncfsm__comm_config cfg = {blocking, 0, so, "raw"};
  be->group_start();
  for (int r = 0; r < n; r++) be->comm_init(&comms[r], n, &id, r, &cfg);
  be->group_end();
  for (int r = 0; r < n; r++) {
    int st = NCFSM__NCCL_IN_PROGRESS;
    for (int i = 0; i < 100 && st == NCFSM__NCCL_IN_PROGRESS; i++) be->get_async_error(comms[r], &st);
    assert_int_equal(st, NCFSM__NCCL_SUCCESS);
  }
}

static int poll_final(void *comm) {
  int st = NCFSM__NCCL_IN_PROGRESS;
  for (int i = 0; i < 100 && st == NCFSM__NCCL_IN_PROGRESS; i++) be->get_async_error(comm, &st);
  return st;
}

/* R2: a call during InProgress is rejected AND poisons the communicator. */
static void test_r2_call_during_inprogress(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  so.launch_polls = 3;
  void *c[1];
  raw_init(c, 1, &so, 0);
  int32_t a[4] = {1, 2, 3, 4}, b[4] = {0};
  void *stream;
  assert_int_equal(be->stream_create(0, &stream), 0);
  ncfsm__op op = {NCFSM_KIND_ALLREDUCE, a, a, 4, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  assert_int_equal(be->op(c[0], &op), NCFSM__NCCL_IN_PROGRESS); /* R1 */
  ncfsm__op op2 = {NCFSM_KIND_ALLREDUCE, b, b, 4, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  assert_int_equal(be->op(c[0], &op2), NCFSM__NCCL_INVALID_ARGUMENT);
  assert_non_null(strstr(be->last_error(c[0]), "before the previous operation returned ncclSuccess"));
  assert_int_equal(poll_final(c[0]), NCFSM__NCCL_INVALID_ARGUMENT); /* poisoned */
  be->abort(c[0]);
  be->stream_destroy(stream);

  /* Through ncfsm: the second op is queued (DEFER), the comm stays healthy. */
  so.launch_polls = 200; /* longer than one turn's poll burst */
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_comm_opts o;
  test_comm_opts(&o, &so);
  ncfsm_comm *cc[1];
  make_comms(loop, 1, &o, cc, 0);
  run_until_state(loop, cc[0], NCFSM_STATE_READY);
  assert_int_equal(ncfsm_allreduce(cc[0], a, a, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
  run_until_state(loop, cc[0], NCFSM_STATE_LAUNCH_IN_PROGRESS);
  ncfsm_work *w;
  assert_int_equal(ncfsm_allreduce(cc[0], b, b, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w), NCFSM_OK);
  assert_int_equal(ncfsm_work_wait(w, 5000), NCFSM_OK);
  ncfsm_work_release(w);
  ncfsm_sim_stats st;
  assert_int_equal(ncfsm_sim_get_stats(cc[0], &st), NCFSM_OK);
  assert_int_equal(st.rejected, 0);
  assert_int_equal(st.async_state, NCFSM__NCCL_SUCCESS);
  teardown_all(loop, cc, 1);
}

/* R3: an argument error inside a group poisons a nonblocking comm for good;
 * a blocking comm survives (the seed's observation). */
static void test_r3_arg_error_in_group(void **state) {
  (void)state;
  for (int blocking = 0; blocking < 2; blocking++) {
    ncfsm_sim_opts so;
    test_sim_opts(&so);
    void *c[2];
    raw_init(c, 2, &so, blocking);
    void *stream;
    assert_int_equal(be->stream_create(0, &stream), 0);
    int32_t a[2][4] = {{1, 1, 1, 1}, {2, 2, 2, 2}};
    be->group_start();
    for (int r = 0; r < 2; r++) {
      ncfsm__op bad = {NCFSM_KIND_BROADCAST, a[r], a[r], 4, NCFSM_INT32, NCFSM_OP_SUM, 2, -1, stream};
      assert_int_equal(be->op(c[r], &bad), NCFSM__NCCL_INVALID_ARGUMENT);
    }
    assert_int_equal(be->group_end(), NCFSM__NCCL_INVALID_ARGUMENT);
    for (int r = 0; r < 2; r++) {
      int st;
      be->get_async_error(c[r], &st);
      assert_int_equal(st, blocking ? NCFSM__NCCL_SUCCESS : NCFSM__NCCL_INVALID_ARGUMENT);
      be->abort(c[r]);
    }
    be->stream_destroy(stream);
  }
}

/* R4: a second Finalize poisons; Destroy then fails and dirties the thread's
 * group state so that the NEXT communicator created on this thread fails. */
/* The raw part runs on a thread of its own: the group state it dirties is
 * thread-local, as in NCCL, and must not leak into the rest of the suite. */
static const char *r4_fail;
#define R4_CHECK(cond)                          \
  do {                                          \
    if (!(cond)) { r4_fail = #cond; goto out; } \
  } while (0)

static void *r4_raw(void *arg) {
  (void)arg;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  so.finalize_polls = 3;
  void *c = NULL, *next = NULL;
  ncfsm_unique_id id;
  ncfsm__comm_config cfg = {0, 0, &so, "raw"};
  be->get_unique_id(&id);
  R4_CHECK(be->comm_init(&c, 1, &id, 0, &cfg) == NCFSM__NCCL_IN_PROGRESS);
  R4_CHECK(poll_final(c) == NCFSM__NCCL_SUCCESS);
  R4_CHECK(be->finalize(c) == NCFSM__NCCL_IN_PROGRESS);
  R4_CHECK(be->finalize(c) == NCFSM__NCCL_INVALID_ARGUMENT);
  R4_CHECK(poll_final(c) == NCFSM__NCCL_INVALID_ARGUMENT);
  R4_CHECK(be->destroy(c) == NCFSM__NCCL_INVALID_ARGUMENT);
  be->get_unique_id(&id);
  cfg.name = "next";
  R4_CHECK(be->comm_init(&next, 1, &id, 0, &cfg) == NCFSM__NCCL_INVALID_ARGUMENT);
  R4_CHECK(strstr(be->last_error(NULL), "Blocking and nonblocking") != NULL);
out:
  if (c) be->abort(c);
  if (next) be->abort(next);
  return NULL;
}

static void test_r4_finalize_twice_cascade(void **state) {
  (void)state;
  pthread_t th;
  pthread_create(&th, NULL, r4_raw, NULL);
  pthread_join(th, NULL);
  if (r4_fail) fail_msg("raw R4 cascade: %s", r4_fail);
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  so.finalize_polls = 3;

  /* Through ncfsm: the second finalize is rejected (R4) and the comm finalizes. */
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_comm_opts o;
  test_comm_opts(&o, &so);
  ncfsm_comm *cc[1];
  make_comms(loop, 1, &o, cc, 0);
  run_until_state(loop, cc[0], NCFSM_STATE_READY);
  assert_int_equal(ncfsm_comm_finalize(cc[0]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_finalize(cc[0]), NCFSM_ERR_ILLEGAL_STATE);
  /* the message names the state the finalize is in (whatever the engine calls it) and R4 */
  assert_non_null(strstr(ncfsm_comm_last_error(cc[0]), ncfsm_state_name(ncfsm_comm_state(cc[0]))));
  assert_non_null(strstr(ncfsm_comm_last_error(cc[0]), "R4"));
  assert_int_equal(ncfsm_comm_wait_state(cc[0], NCFSM_STATE_FINALIZED, 5000), NCFSM_OK);
  assert_int_equal(ncfsm_comm_destroy(cc[0]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_release(cc[0]), NCFSM_OK);
  /* and the next communicator on this thread is fine */
  ncfsm_comm *nc[1];
  make_comms(loop, 1, &o, nc, 0);
  run_until_state(loop, nc[0], NCFSM_STATE_READY);
  teardown_all(loop, nc, 1);
}

/* R3: GroupEnd without GroupStart. */
static void test_r3_group_end_without_start(void **state) {
  (void)state;
  assert_int_equal(be->group_end(), NCFSM__NCCL_INVALID_USAGE);
  assert_non_null(strstr(be->last_error(NULL), "not in a group call"));
}

/* R2 measured consequence: an event recorded right after an InProgress group
 * end completes at once (the kernels were not launched yet). */
static void test_r2_early_event(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  so.launch_polls = 3;
  void *c[1];
  raw_init(c, 1, &so, 0);
  void *stream, *ev;
  assert_int_equal(be->stream_create(0, &stream), 0);
  assert_int_equal(be->event_create(0, &ev), 0);
  int32_t a[4] = {1, 1, 1, 1};
  ncfsm__op op = {NCFSM_KIND_ALLREDUCE, a, a, 4, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  be->group_start();
  be->op(c[0], &op);
  assert_int_equal(be->group_end(), NCFSM__NCCL_IN_PROGRESS);
  be->event_record(ev, stream);
  assert_int_equal(be->event_query(ev), 0); /* "complete": misleading, as on real NCCL */
  assert_int_equal(poll_final(c[0]), NCFSM__NCCL_SUCCESS);
  be->event_destroy(ev);
  be->stream_destroy(stream);
  be->abort(c[0]);
}

/* Poll until every op enqueued so far on stream completed. */
static void drain(void *stream) {
  void *ev;
  assert_int_equal(be->event_create(0, &ev), 0);
  assert_int_equal(be->event_record(ev, stream), 0);
  int q = 1;
  for (int i = 0; i < 100000 && q == 1; i++) q = be->event_query(ev);
  assert_int_equal(q, 0);
  be->event_destroy(ev);
}

static int raw_allreduce(void *comm, int32_t *buf, void *stream) {
  ncfsm__op op = {NCFSM_KIND_ALLREDUCE, buf, buf, 1, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  return be->op(comm, &op);
}

/* R13, as measured on 2.28.3 and 2.28.9: one thread, 2 nonblocking comms of
 * one clique, each AllReduce in its own group and polled to final. Rank 0
 * alone gets 1,022 launches final; the 1,023rd stays InProgress with no
 * error until rank 1 launches; then it becomes final (the default limit). */
static void test_r13_drift_limit(void **state) {
  (void)state;
  unsetenv("NCFSM_SIM_DRIFT_LIMIT");
  enum { LIMIT = 1022, TOTAL = LIMIT + 1 };
  static int32_t a[2][TOTAL];
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  void *c[2], *stream[2];
  raw_init(c, 2, &so, 0);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(be->stream_create(0, &stream[r]), 0);
    for (int k = 0; k < TOTAL; k++) a[r][k] = r * 100000 + k;
  }
  for (int k = 0; k < LIMIT; k++) {
    assert_int_equal(raw_allreduce(c[0], &a[0][k], stream[0]), NCFSM__NCCL_IN_PROGRESS); /* R1 */
    if (poll_final(c[0]) != NCFSM__NCCL_SUCCESS) fail_msg("rank 0's launch %d is not final", k + 1);
  }
  /* the 1,023rd: InProgress, no error, for as long as rank 1 launches nothing */
  assert_int_equal(raw_allreduce(c[0], &a[0][LIMIT], stream[0]), NCFSM__NCCL_IN_PROGRESS);
  for (int i = 0; i < 2000; i++) {
    int st = -1;
    assert_int_equal(be->get_async_error(c[0], &st), NCFSM__NCCL_SUCCESS);
    if (st != NCFSM__NCCL_IN_PROGRESS) fail_msg("launch 1023 became %d after %d polls with no peer", st, i);
  }
  ncfsm_sim_stats st;
  assert_int_equal(ncfsm__sim_stats(c[0], &st), 0);
  assert_int_equal(st.executed, 0);
  assert_int_equal(st.rejected, 0);
  /* rank 1's launches go on meanwhile (no head-of-line blocking across comms) */
  assert_int_equal(raw_allreduce(c[1], &a[1][0], stream[1]), NCFSM__NCCL_IN_PROGRESS);
  assert_int_equal(poll_final(c[1]), NCFSM__NCCL_SUCCESS);
  assert_int_equal(poll_final(c[0]), NCFSM__NCCL_SUCCESS); /* rank 0's stuck launch is final now */
  for (int k = 1; k < TOTAL; k++) {
    assert_int_equal(raw_allreduce(c[1], &a[1][k], stream[1]), NCFSM__NCCL_IN_PROGRESS);
    if (poll_final(c[1]) != NCFSM__NCCL_SUCCESS) fail_msg("rank 1's launch %d is not final", k + 1);
  }
  for (int r = 0; r < 2; r++) drain(stream[r]);
  for (int r = 0; r < 2; r++)
    for (int k = 0; k < TOTAL; k++)
      if (a[r][k] != 100000 + 2 * k) fail_msg("rank %d op %d: %d, expected %d", r, k, a[r][k], 100000 + 2 * k);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(be->abort(c[r]), 0);
    be->stream_destroy(stream[r]);
  }
}

/* R13: a group end over several comms is one unit. With rank 0 at its limit,
 * a group holding rank 0's next op AND rank 1's op stays InProgress for both
 * comms, so rank 1's op, which rank 0 waits for, is never launched: the
 * deadlock seen on real NCCL when ranks drift and launches are coalesced. */
static void test_r13_group_end_held_as_one(void **state) {
  (void)state;
  setenv("NCFSM_SIM_DRIFT_LIMIT", "4", 1); /* read at init */
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  void *c[2], *stream;
  raw_init(c, 2, &so, 0);
  unsetenv("NCFSM_SIM_DRIFT_LIMIT");
  assert_int_equal(be->stream_create(0, &stream), 0);
  int32_t a[2][6] = {{0}};
  for (int k = 0; k < 4; k++) {
    assert_int_equal(raw_allreduce(c[0], &a[0][k], stream), NCFSM__NCCL_IN_PROGRESS);
    assert_int_equal(poll_final(c[0]), NCFSM__NCCL_SUCCESS);
  }
  be->group_start();
  assert_int_equal(raw_allreduce(c[0], &a[0][4], stream), NCFSM__NCCL_SUCCESS); /* inside a group */
  assert_int_equal(raw_allreduce(c[1], &a[1][0], stream), NCFSM__NCCL_SUCCESS);
  assert_int_equal(be->group_end(), NCFSM__NCCL_IN_PROGRESS);
  for (int i = 0; i < 1000; i++)
    for (int r = 0; r < 2; r++) {
      int st = -1;
      assert_int_equal(be->get_async_error(c[r], &st), NCFSM__NCCL_SUCCESS);
      if (st != NCFSM__NCCL_IN_PROGRESS) fail_msg("rank %d left the held group end (%d) at poll %d", r, st, i);
    }
  ncfsm_sim_stats st;
  assert_int_equal(ncfsm__sim_stats(c[1], &st), 0);
  assert_int_equal(st.executed, 0); /* rank 1's op was never launched */
  /* only removing the held part frees the rest: abort rank 0 (R5) */
  assert_int_equal(be->abort(c[0]), 0);
  assert_int_equal(poll_final(c[1]), NCFSM__NCCL_SUCCESS);
  assert_int_equal(be->abort(c[1]), 0);
  be->stream_destroy(stream);

  /* NCFSM_SIM_DRIFT_LIMIT=0: no limit; and a single group larger than the
   * limit on a comm with nothing outstanding is never held */
  setenv("NCFSM_SIM_DRIFT_LIMIT", "0", 1);
  void *d[2];
  raw_init(d, 2, &so, 0);
  setenv("NCFSM_SIM_DRIFT_LIMIT", "3", 1);
  void *e[2];
  raw_init(e, 2, &so, 0);
  unsetenv("NCFSM_SIM_DRIFT_LIMIT");
  assert_int_equal(be->stream_create(0, &stream), 0);
  static int32_t b[2000];
  for (int k = 0; k < 2000; k++) {
    assert_int_equal(raw_allreduce(d[0], &b[k], stream), NCFSM__NCCL_IN_PROGRESS);
    if (poll_final(d[0]) != NCFSM__NCCL_SUCCESS) fail_msg("unlimited: launch %d held", k + 1);
  }
  be->group_start();
  for (int k = 0; k < 10; k++) assert_int_equal(raw_allreduce(e[0], &b[k], stream), NCFSM__NCCL_SUCCESS);
  assert_int_equal(be->group_end(), NCFSM__NCCL_IN_PROGRESS);
  assert_int_equal(poll_final(e[0]), NCFSM__NCCL_SUCCESS); /* 10 > 3, but nothing was outstanding */
  assert_int_equal(raw_allreduce(e[0], &b[10], stream), NCFSM__NCCL_IN_PROGRESS);
  int s3 = -1;
  for (int i = 0; i < 100; i++) be->get_async_error(e[0], &s3);
  assert_int_equal(s3, NCFSM__NCCL_IN_PROGRESS); /* 10 outstanding: the next one is held */
  for (int r = 0; r < 2; r++) {
    assert_int_equal(be->abort(d[r]), 0);
    assert_int_equal(be->abort(e[r]), 0);
  }
  be->stream_destroy(stream);
}

/* R13 on blocking comms: the group end does not return while the launch is
 * held (NCCL blocks in the launch); it returns once the peer, driven by
 * another thread, launched. With no peer the sim gives up after
 * NCFSM_SIM_WAIT_MS with ncclSystemError (NCCL would block for ever). */
static void *blocking_peer(void *arg) {
  void **c = arg;
  struct timespec ts = {0, 100 * 1000000L};
  nanosleep(&ts, NULL); /* rank 0's 5th launch is waiting by now */
  static int32_t x;
  x = 7;
  ncfsm__op op = {NCFSM_KIND_ALLREDUCE, &x, &x, 1, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, c[2]};
  intptr_t rc = be->op(c[1], &op);
  return (void *)rc;
}

static void test_r13_blocking_launch_waits(void **state) {
  (void)state;
  setenv("NCFSM_SIM_DRIFT_LIMIT", "4", 1);
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  void *c[3];
  raw_init(c, 2, &so, 1);
  unsetenv("NCFSM_SIM_DRIFT_LIMIT");
  assert_int_equal(be->stream_create(0, &c[2]), 0);
  void *s0;
  assert_int_equal(be->stream_create(0, &s0), 0);
  int32_t a[5] = {1, 2, 3, 4, 5};
  for (int k = 0; k < 4; k++) assert_int_equal(raw_allreduce(c[0], &a[k], s0), NCFSM__NCCL_SUCCESS);
  pthread_t th;
  pthread_create(&th, NULL, blocking_peer, c);
  uint64_t t0 = (uint64_t)time(NULL);
  assert_int_equal(raw_allreduce(c[0], &a[4], s0), NCFSM__NCCL_SUCCESS); /* returns after the peer launched */
  void *prc;
  pthread_join(th, &prc);
  assert_int_equal((intptr_t)prc, NCFSM__NCCL_SUCCESS);
  assert_true((uint64_t)time(NULL) - t0 < 10);
  assert_int_equal(a[0], 1 + 7); /* rank 0's first op met rank 1's first op */
  /* no peer at all: ncclSystemError after NCFSM_SIM_WAIT_MS */
  setenv("NCFSM_SIM_WAIT_MS", "200", 1);
  int32_t more[4] = {0};
  int rc = NCFSM__NCCL_SUCCESS;
  for (int k = 0; k < 4 && rc == NCFSM__NCCL_SUCCESS; k++) rc = raw_allreduce(c[0], &more[k], s0);
  unsetenv("NCFSM_SIM_WAIT_MS");
  assert_int_equal(rc, NCFSM__NCCL_SYSTEM_ERROR);
  assert_non_null(strstr(be->last_error(NULL), "drift limit"));
  for (int r = 0; r < 2; r++) assert_int_equal(be->abort(c[r]), 0);
  be->stream_destroy(c[2]);
  be->stream_destroy(s0);
}

/* ---- R11: mismatched collectives ------------------------------------------------------
 * R11 (docs/nccl-rules.md), measured on 2.28.3 and 2.28.9 (2 processes, one H200 each,
 * nonblocking, a correct warm-up AllReduce, then one mismatched collective of
 * 1-8 floats; no async error on any rank in any row):
 *   Broadcast root 0 / AllReduce sum   rank 0 completes with its own data, rank 1 hangs
 *   AllReduce count 4 / count 8        rank 0 completes, rank 1 hangs
 *   rank 0 skips / AllReduce           rank 1 hangs
 *   AllReduce float / int32            both complete
 *   Broadcast root 0 / root 1          both complete, each with its own data
 *   AllReduce sum / max                both complete with the sum
 * Each row runs on the raw backend and through ncfsm (watchdog: the hanging
 * side ends in NCFSM_ERR_TIMEOUT); more rows check the sim's model for more
 * ranks (docs/sim.md, "R11 matching": model choices, not measurements). */

enum { MM_MAX = 4, MM_ELEMS = 8 };
#define MM_SENTINEL 0xdeadbeefu

/* What a rank's op does: hang (receive buffer untouched), complete with
 * unspecified data, with the float sum of every rank's input (as rank 0's
 * float32 SUM), or with rank p's input (MM_FROM + p); or it posts nothing. */
enum { MM_HANG = 0, MM_ANY, MM_SUM, MM_SKIP, MM_FROM };

typedef struct mm_row {
  const char *name;
  int n;
  ncfsm__op op[MM_MAX]; /* buffers and stream are filled in */
  int expect[MM_MAX];
} mm_row;

#define AR(c, dt, ro) {NCFSM_KIND_ALLREDUCE, NULL, NULL, c, dt, ro, -1, -1, NULL}
#define BC(c, root) {NCFSM_KIND_BROADCAST, NULL, NULL, c, NCFSM_FLOAT32, NCFSM_OP_SUM, root, -1, NULL}
#define RD(c, root) {NCFSM_KIND_REDUCE, NULL, NULL, c, NCFSM_FLOAT32, NCFSM_OP_SUM, root, -1, NULL}
#define AG(c) {NCFSM_KIND_ALLGATHER, NULL, NULL, c, NCFSM_FLOAT32, NCFSM_OP_SUM, -1, -1, NULL}
#define F32 NCFSM_FLOAT32

/* The measured table, row for row (2 ranks). */
static const mm_row mm_table[] = {
    {"Broadcast root 0 / AllReduce sum", 2, {BC(4, 0), AR(4, F32, NCFSM_OP_SUM)}, {MM_FROM + 0, MM_HANG}},
    {"AllReduce count 4 / count 8", 2, {AR(4, F32, NCFSM_OP_SUM), AR(8, F32, NCFSM_OP_SUM)}, {MM_ANY, MM_HANG}},
    {"rank 0 skips / AllReduce", 2, {AR(4, F32, NCFSM_OP_SUM), AR(4, F32, NCFSM_OP_SUM)}, {MM_SKIP, MM_HANG}},
    {"AllReduce float / int32", 2, {AR(4, F32, NCFSM_OP_SUM), AR(4, NCFSM_INT32, NCFSM_OP_SUM)}, {MM_SUM, MM_SUM}},
    {"Broadcast root 0 / root 1", 2, {BC(4, 0), BC(4, 1)}, {MM_FROM + 0, MM_FROM + 1}},
    {"AllReduce sum / max", 2, {AR(4, F32, NCFSM_OP_SUM), AR(4, F32, NCFSM_OP_MAX)}, {MM_SUM, MM_SUM}},
};

/* The sim's model beyond the measurement (more ranks, other kinds). */
static const mm_row mm_model[] = {
    {"AllReduce count 8 / 4 / 4", 3, {AR(8, F32, NCFSM_OP_SUM), AR(4, F32, NCFSM_OP_SUM), AR(4, F32, NCFSM_OP_SUM)},
     {MM_HANG, MM_ANY, MM_ANY}},
    {"AllReduce float32 / float64 / float32 (sizes differ)", 3,
     {AR(4, F32, NCFSM_OP_SUM), AR(4, NCFSM_FLOAT64, NCFSM_OP_SUM), AR(4, F32, NCFSM_OP_SUM)},
     {MM_ANY, MM_HANG, MM_ANY}},
    {"Broadcast roots 0 / 0 / 0 / 3", 4, {BC(4, 0), BC(4, 0), BC(4, 0), BC(4, 3)},
     {MM_FROM + 0, MM_FROM + 0, MM_FROM + 0, MM_FROM + 3}},
    {"Broadcast roots 1 / 1 / 0 / 0", 4, {BC(4, 1), BC(4, 1), BC(4, 0), BC(4, 0)},
     {MM_FROM + 1, MM_FROM + 1, MM_HANG, MM_HANG}},
    {"Broadcast root 0 / Broadcast root 0 / AllReduce", 3, {BC(4, 0), BC(4, 0), AR(4, F32, NCFSM_OP_SUM)},
     {MM_FROM + 0, MM_HANG, MM_HANG}},
    {"AllReduce sum / max / min", 3, {AR(4, F32, NCFSM_OP_SUM), AR(4, F32, NCFSM_OP_MAX), AR(4, F32, NCFSM_OP_MIN)},
     {MM_SUM, MM_SUM, MM_SUM}},
    {"AllReduce float sum / int32 max / float prod", 3,
     {AR(4, F32, NCFSM_OP_SUM), AR(4, NCFSM_INT32, NCFSM_OP_MAX), AR(4, F32, NCFSM_OP_PROD)},
     {MM_SUM, MM_SUM, MM_SUM}},
    {"Reduce root 0 / root 1", 2, {RD(4, 0), RD(4, 1)}, {MM_HANG, MM_HANG}},
    {"Broadcast root 0 count 8 / count 4", 2, {BC(8, 0), BC(4, 0)}, {MM_FROM + 0, MM_ANY}},
    {"Broadcast root 0 count 4 / count 8", 2, {BC(4, 0), BC(8, 0)}, {MM_FROM + 0, MM_HANG}},
    {"AllReduce / AllGather", 2, {AR(4, F32, NCFSM_OP_SUM), AG(4)}, {MM_HANG, MM_HANG}},
};

/* NCFSM_SIM_MISMATCH=hang: the sim's old model (only a Broadcast root completes). */
static const mm_row mm_hang[] = {
    {"Broadcast root 0 / AllReduce sum", 2, {BC(4, 0), AR(4, F32, NCFSM_OP_SUM)}, {MM_FROM + 0, MM_HANG}},
    {"AllReduce count 4 / count 8", 2, {AR(4, F32, NCFSM_OP_SUM), AR(8, F32, NCFSM_OP_SUM)}, {MM_HANG, MM_HANG}},
    {"AllReduce float / int32", 2, {AR(4, F32, NCFSM_OP_SUM), AR(4, NCFSM_INT32, NCFSM_OP_SUM)}, {MM_HANG, MM_HANG}},
    {"Broadcast root 0 / root 1", 2, {BC(4, 0), BC(4, 1)}, {MM_FROM + 0, MM_FROM + 1}},
    {"Broadcast roots 1 / 1 / 0 / 0", 4, {BC(4, 1), BC(4, 1), BC(4, 0), BC(4, 0)},
     {MM_HANG, MM_FROM + 1, MM_HANG, MM_HANG}},
    {"AllReduce sum / max", 2, {AR(4, F32, NCFSM_OP_SUM), AR(4, F32, NCFSM_OP_MAX)}, {MM_HANG, MM_HANG}},
};

typedef struct mm_bufs {
  uint32_t in[MM_MAX][MM_ELEMS], out[MM_MAX][MM_ELEMS];
} mm_bufs;

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Inputs: the bits of the float (r + 1) * 10 + i, whatever the rank's type
 * (so an int32 rank's input read as rank 0's float32 is that float); outputs
 * preset to a sentinel. Each op gets its rank's buffers. */
static void mm_fill(const mm_row *row, mm_bufs *b, ncfsm__op *ops) {
  for (int r = 0; r < row->n; r++) {
    for (int i = 0; i < MM_ELEMS; i++) {
      b->in[r][i] = f2u((float)((r + 1) * 10 + i));
      b->out[r][i] = MM_SENTINEL;
    }
    ops[r] = row->op[r];
    ops[r].send = b->in[r];
    ops[r].recv = b->out[r];
  }
}

/* Checks rank r's output against the row's expectation (done: it completed). */
static void mm_check(const mm_row *row, const mm_bufs *b, const ncfsm__op *ops, int r, int done) {
  int e = row->expect[r];
  size_t c = ops[r].count, extent = ops[r].kind == NCFSM_KIND_ALLGATHER ? c * (size_t)row->n : c;
  int want_done = e != MM_HANG;
  if (e != MM_SKIP && done != want_done) /* a rank that skips launched nothing */
    fail_msg("%s: rank %d %s, expected it to %s", row->name, r, done ? "completed" : "did not complete",
             want_done ? "complete" : "hang");
  for (size_t i = 0; i < MM_ELEMS; i++) {
    uint32_t got = b->out[r][i];
    if (i >= extent || e == MM_HANG || e == MM_SKIP) {
      if (got != MM_SENTINEL) fail_msg("%s: rank %d: out[%zu] = 0x%x, expected untouched", row->name, r, i, got);
    } else if (e == MM_SUM) {
      float want = 0;
      for (int p = 0; p < row->n; p++) want += u2f(b->in[p][i]);
      if (got != f2u(want)) fail_msg("%s: rank %d: out[%zu] = %g, expected the float sum %g", row->name, r, i,
                                     (double)u2f(got), (double)want);
    } else if (e >= MM_FROM) {
      if (got != b->in[e - MM_FROM][i])
        fail_msg("%s: rank %d: out[%zu] = %g, expected rank %d's %g", row->name, r, i, (double)u2f(got),
                 e - MM_FROM, (double)u2f(b->in[e - MM_FROM][i]));
    }
  }
}

/* ---- on the raw backend ---- */

typedef struct mm_world {
  int n;
  void *c[MM_MAX], *s[MM_MAX];
} mm_world;

/* n nonblocking ranks of one clique, connected by a correct AllReduce. */
static void mm_open(mm_world *w, int n) {
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  w->n = n;
  raw_init(w->c, n, &so, 0);
  int32_t x[MM_MAX];
  for (int r = 0; r < n; r++) {
    assert_int_equal(be->stream_create(0, &w->s[r]), 0);
    x[r] = r + 1;
    assert_int_equal(raw_allreduce(w->c[r], &x[r], w->s[r]), NCFSM__NCCL_IN_PROGRESS);
    assert_int_equal(poll_final(w->c[r]), NCFSM__NCCL_SUCCESS);
  }
  for (int r = 0; r < n; r++) {
    drain(w->s[r]);
    assert_int_equal(x[r], n * (n + 1) / 2);
  }
}

static void mm_launch(mm_world *w, int r, ncfsm__op op) {
  op.stream = w->s[r];
  assert_int_equal(be->op(w->c[r], &op), NCFSM__NCCL_IN_PROGRESS);
  assert_int_equal(poll_final(w->c[r]), NCFSM__NCCL_SUCCESS); /* the launch is final (R1) */
}

/* Bit r: everything rank r launched completed. No rank ever reports an async error. */
static unsigned mm_settle(mm_world *w) {
  void *ev[MM_MAX];
  for (int r = 0; r < w->n; r++) {
    assert_int_equal(be->event_create(0, &ev[r]), 0);
    assert_int_equal(be->event_record(ev[r], w->s[r]), 0);
  }
  for (int i = 0; i < 100; i++)
    for (int r = 0; r < w->n; r++) {
      int st = -1;
      assert_int_equal(be->get_async_error(w->c[r], &st), NCFSM__NCCL_SUCCESS);
      if (st != NCFSM__NCCL_SUCCESS) fail_msg("rank %d: async state %d, expected ncclSuccess (R11: silent)", r, st);
    }
  unsigned done = 0;
  for (int r = 0; r < w->n; r++) {
    int q = be->event_query(ev[r]);
    assert_true(q == 0 || q == 1);
    if (q == 0) done |= 1u << r;
    be->event_destroy(ev[r]);
  }
  return done;
}

static void mm_close(mm_world *w) {
  for (int r = 0; r < w->n; r++) {
    assert_int_equal(be->abort(w->c[r]), 0);
    be->stream_destroy(w->s[r]);
  }
}

static void mm_raw_rows(const mm_row *rows, size_t nrows) {
  for (size_t k = 0; k < nrows; k++) {
    const mm_row *row = &rows[k];
    mm_world w;
    mm_bufs b;
    ncfsm__op ops[MM_MAX];
    mm_open(&w, row->n);
    mm_fill(row, &b, ops);
    for (int r = 0; r < row->n; r++)
      if (row->expect[r] != MM_SKIP) mm_launch(&w, r, ops[r]);
    unsigned done = mm_settle(&w);
    for (int r = 0; r < row->n; r++) mm_check(row, &b, ops, r, (int)(done >> r) & 1);
    mm_close(&w);
  }
}

static void test_r11_table_raw(void **state) {
  (void)state;
  mm_raw_rows(mm_table, sizeof mm_table / sizeof mm_table[0]);
}

static void test_r11_model_raw(void **state) {
  (void)state;
  mm_raw_rows(mm_model, sizeof mm_model / sizeof mm_model[0]);
}

/* NCFSM_SIM_MISMATCH=hang, read when the clique is created: the old model. */
static void test_r11_knob_hang(void **state) {
  (void)state;
  setenv("NCFSM_SIM_MISMATCH", "hang", 1);
  mm_raw_rows(mm_hang, sizeof mm_hang / sizeof mm_hang[0]);
  unsetenv("NCFSM_SIM_MISMATCH");
}

/* A rank that skips a collective: the ranks' later instances shift, so its
 * next collective meets the others' skipped one (matched by index), as in
 * NCCL; the outcome follows the mismatch rules, or, when the two happen to
 * have the same fingerprint, they run together with the wrong data. */
static void test_r11_skip_shifts(void **state) {
  (void)state;
  mm_world w;
  float a0[4], a1[4], b1[4], r0[4], ra1[4], rb1[4];
  for (int i = 0; i < 4; i++) {
    a0[i] = (float)(1 + i);
    a1[i] = (float)(10 + i);
    b1[i] = (float)(100 + i);
    r0[i] = ra1[i] = rb1[i] = -1;
  }
  /* rank 0 skips the AllReduce and broadcasts; rank 1 does both: op mismatch */
  mm_open(&w, 2);
  mm_launch(&w, 0, (ncfsm__op){NCFSM_KIND_BROADCAST, a0, r0, 4, F32, NCFSM_OP_SUM, 0, -1, NULL});
  mm_launch(&w, 1, (ncfsm__op){NCFSM_KIND_ALLREDUCE, a1, ra1, 4, F32, NCFSM_OP_SUM, -1, -1, NULL});
  mm_launch(&w, 1, (ncfsm__op){NCFSM_KIND_BROADCAST, b1, rb1, 4, F32, NCFSM_OP_SUM, 0, -1, NULL});
  assert_int_equal(mm_settle(&w), 1u); /* only rank 0 */
  for (int i = 0; i < 4; i++) {
    assert_true(r0[i] == a0[i]); /* its own data */
    assert_true(ra1[i] == -1 && rb1[i] == -1);
  }
  mm_close(&w);
  /* the same fingerprint: rank 0's only AllReduce runs with rank 1's first */
  mm_open(&w, 2);
  for (int i = 0; i < 4; i++) r0[i] = ra1[i] = rb1[i] = -1;
  mm_launch(&w, 0, (ncfsm__op){NCFSM_KIND_ALLREDUCE, a0, r0, 4, F32, NCFSM_OP_SUM, -1, -1, NULL});
  mm_launch(&w, 1, (ncfsm__op){NCFSM_KIND_ALLREDUCE, a1, ra1, 4, F32, NCFSM_OP_SUM, -1, -1, NULL});
  mm_launch(&w, 1, (ncfsm__op){NCFSM_KIND_ALLREDUCE, b1, rb1, 4, F32, NCFSM_OP_SUM, -1, -1, NULL});
  assert_int_equal(mm_settle(&w), 1u); /* rank 1's second one waits for a peer that never comes */
  for (int i = 0; i < 4; i++) {
    assert_true(r0[i] == a0[i] + a1[i] && ra1[i] == a0[i] + a1[i]);
    assert_true(rb1[i] == -1);
  }
  ncfsm_sim_stats st;
  assert_int_equal(ncfsm__sim_stats(w.c[1], &st), 0);
  assert_int_equal(st.executed, 2); /* the warm-up and the first AllReduce */
  mm_close(&w);
}

/* Send/Recv pairs run only when count and type agree; otherwise both hang. */
static void test_r11_p2p_mismatch(void **state) {
  (void)state;
  struct { size_t scount, rcount; ncfsm_dtype_t sdt, rdt; unsigned done; } cases[] = {
      {4, 4, NCFSM_INT32, NCFSM_INT32, 3u},
      {4, 8, NCFSM_INT32, NCFSM_INT32, 0u},
      {8, 4, NCFSM_INT32, NCFSM_INT32, 0u},
      {4, 4, NCFSM_INT32, NCFSM_FLOAT32, 0u},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    mm_world w;
    int32_t snd[8] = {1, 2, 3, 4, 5, 6, 7, 8}, rcv[8];
    for (int i = 0; i < 8; i++) rcv[i] = -1;
    mm_open(&w, 2);
    mm_launch(&w, 0,
              (ncfsm__op){NCFSM_KIND_SEND, snd, NULL, cases[k].scount, cases[k].sdt, NCFSM_OP_SUM, -1, 1, NULL});
    mm_launch(&w, 1,
              (ncfsm__op){NCFSM_KIND_RECV, NULL, rcv, cases[k].rcount, cases[k].rdt, NCFSM_OP_SUM, -1, 0, NULL});
    unsigned done = mm_settle(&w);
    if (done != cases[k].done) fail_msg("p2p case %zu: completion mask %u, expected %u", k, done, cases[k].done);
    for (int i = 0; i < 8; i++)
      assert_int_equal(rcv[i], done ? (i < 4 ? snd[i] : -1) : -1);
    mm_close(&w);
  }
}

/* ---- through ncfsm ---- */

static ncfsm_result_t mm_issue(ncfsm_comm *c, const ncfsm__op *a, ncfsm_work **w) {
  switch (a->kind) {
  case NCFSM_KIND_ALLREDUCE:
    return ncfsm_allreduce(c, a->send, a->recv, a->count, a->dtype, a->redop, NULL, NULL, NULL, w);
  case NCFSM_KIND_BROADCAST:
    return ncfsm_broadcast(c, a->send, a->recv, a->count, a->dtype, a->root, NULL, NULL, NULL, w);
  default:
    fail_msg("mm_issue: kind %d not used here", (int)a->kind);
  }
  return NCFSM_ERR_INVALID_ARGUMENT;
}

/* Each row of the table through the public API, with a 300 ms watchdog and
 * verification off (this is the model of NCCL's own behaviour: with the
 * default verification every row is named instead, tests/unit/test_verify*.c):
 * the ranks that complete get NCFSM_OK with the data above and stay READY,
 * the hanging ones end in NCFSM_ERR_TIMEOUT (the watchdog, not an async error). */
static void test_r11_table_api(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof mm_table / sizeof mm_table[0]; k++) {
    const mm_row *row = &mm_table[k];
    ncfsm_loop *loop;
    assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
    ncfsm_sim_opts so;
    ncfsm_comm_opts o;
    test_sim_opts(&so);
    test_comm_opts(&o, &so);
    o.timeout_ms = 300;
    o.verify = NCFSM_VERIFY_OFF;
    ncfsm_comm *cc[MM_MAX];
    make_comms(loop, row->n, &o, cc, 0);
    for (int r = 0; r < row->n; r++) run_until_state(loop, cc[r], NCFSM_STATE_READY);
    int32_t x[MM_MAX];
    ncfsm_work *w[MM_MAX] = {NULL};
    for (int r = 0; r < row->n; r++) { /* the warm-up */
      x[r] = r + 1;
      assert_int_equal(ncfsm_allreduce(cc[r], &x[r], &x[r], 1, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[r]),
                       NCFSM_OK);
    }
    for (int r = 0; r < row->n; r++) {
      assert_int_equal(ncfsm_work_wait(w[r], 5000), NCFSM_OK);
      ncfsm_work_release(w[r]);
      w[r] = NULL;
      assert_int_equal(x[r], row->n * (row->n + 1) / 2);
    }
    mm_bufs b;
    ncfsm__op ops[MM_MAX];
    mm_fill(row, &b, ops);
    for (int r = 0; r < row->n; r++)
      if (row->expect[r] != MM_SKIP) assert_int_equal(mm_issue(cc[r], &ops[r], &w[r]), NCFSM_OK);
    /* the ranks that complete first: then no rank has an async error */
    for (int r = 0; r < row->n; r++) {
      int e = row->expect[r];
      if (e == MM_HANG || e == MM_SKIP) continue;
      ncfsm_result_t rc = ncfsm_work_wait(w[r], 5000);
      if (rc != NCFSM_OK)
        fail_msg("%s: rank %d: %s, expected NCFSM_OK: %s", row->name, r, ncfsm_err_name(rc),
                 ncfsm_comm_failure(cc[r]));
    }
    for (int r = 0; r < row->n; r++) {
      ncfsm_sim_stats st;
      assert_int_equal(ncfsm_sim_get_stats(cc[r], &st), NCFSM_OK);
      assert_int_equal(st.async_state, NCFSM__NCCL_SUCCESS);
    }
    for (int r = 0; r < row->n; r++) {
      int e = row->expect[r];
      if (e != MM_HANG) continue;
      ncfsm_result_t rc = ncfsm_work_wait(w[r], 5000);
      if (rc != NCFSM_ERR_TIMEOUT)
        fail_msg("%s: rank %d: %s, expected NCFSM_ERR_TIMEOUT", row->name, r, ncfsm_err_name(rc));
      assert_non_null(strstr(ncfsm_comm_failure(cc[r]), "watchdog"));
      assert_int_equal(ncfsm_comm_backend_error(cc[r]), NCFSM__NCCL_SUCCESS);
    }
    for (int r = 0; r < row->n; r++) {
      int e = row->expect[r];
      mm_check(row, &b, ops, r, e != MM_HANG && e != MM_SKIP);
      if (e != MM_HANG && e != MM_SKIP) {
        assert_int_equal(ncfsm_comm_state(cc[r]), NCFSM_STATE_READY);
        assert_int_equal(ncfsm_comm_backend_error(cc[r]), NCFSM__NCCL_SUCCESS);
      }
      if (w[r]) ncfsm_work_release(w[r]);
    }
    teardown_all(loop, cc, row->n);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_r2_call_during_inprogress), cmocka_unit_test(test_r3_arg_error_in_group),
      cmocka_unit_test(test_r4_finalize_twice_cascade), cmocka_unit_test(test_r3_group_end_without_start),
      cmocka_unit_test(test_r2_early_event),
      cmocka_unit_test(test_r13_drift_limit), cmocka_unit_test(test_r13_group_end_held_as_one),
      cmocka_unit_test(test_r13_blocking_launch_waits),
      cmocka_unit_test(test_r11_table_raw),    cmocka_unit_test(test_r11_table_api),
      cmocka_unit_test(test_r11_model_raw),    cmocka_unit_test(test_r11_skip_shifts),
      cmocka_unit_test(test_r11_p2p_mismatch), cmocka_unit_test(test_r11_knob_hang),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
