/*
 * What ncfsm prevents. Each test first drives the raw sim backend the way a
 * program using NCCL directly might (the sim reproduces NCCL 2.28's measured
 * behaviour: NCCL-RULES R2-R4), then makes the same mistake through ncfsm,
 * which rejects it before the backend and keeps the communicator healthy.
 */
#include <pthread.h>
#include <string.h>

#include "core/backend.h"
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
  assert_non_null(strstr(ncfsm_comm_last_error(cc[0]), "FINALIZING"));
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_r2_call_during_inprogress), cmocka_unit_test(test_r3_arg_error_in_group),
      cmocka_unit_test(test_r4_finalize_twice_cascade), cmocka_unit_test(test_r3_group_end_without_start),
      cmocka_unit_test(test_r2_early_event),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
