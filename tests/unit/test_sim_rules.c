/*
 * What ncfsm prevents. Each test first drives the raw sim backend the way a
 * program using NCCL directly might (the sim reproduces NCCL 2.28's measured
 * behaviour: NCCL-RULES R2-R4), then makes the same mistake through ncfsm,
 * which rejects it before the backend and keeps the communicator healthy.
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_r2_call_during_inprogress), cmocka_unit_test(test_r3_arg_error_in_group),
      cmocka_unit_test(test_r4_finalize_twice_cascade), cmocka_unit_test(test_r3_group_end_without_start),
      cmocka_unit_test(test_r2_early_event),
      cmocka_unit_test(test_r13_drift_limit), cmocka_unit_test(test_r13_group_end_held_as_one),
      cmocka_unit_test(test_r13_blocking_launch_waits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
