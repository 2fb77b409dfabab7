/*
 * The sim's error texts belong to their comm: a comm's backend last_error
 * (and so its failure text, built from it) is the last WARN about that comm,
 * never another comm's. NCCL's ncclGetLastError is process-wide; the sim
 * keeps that text too (last_error with no sim comm), but a comm's failure
 * text taken from it could name another comm's failure, e.g. an earlier
 * test's, or the other comm of the same group end.
 */
#include <string.h>

#include "core/backend.h"
#include "core/sim/sim.h"
#include "helpers.h"

static const ncfsm__backend *be = &ncfsm__backend_sim;

static void *raw_comm(ncfsm_sim_opts *so) {
  ncfsm_unique_id id;
  assert_int_equal(be->get_unique_id(&id), 0);
  ncfsm__comm_config cfg = {0, 0, so, "raw"};
  void *c = NULL;
  int rc = be->comm_init(&c, 1, &id, 0, &cfg);
  assert_true(rc == NCFSM__NCCL_SUCCESS || rc == NCFSM__NCCL_IN_PROGRESS);
  int st = NCFSM__NCCL_IN_PROGRESS;
  for (int i = 0; i < 100 && st == NCFSM__NCCL_IN_PROGRESS; i++) be->get_async_error(c, &st);
  assert_int_equal(st, NCFSM__NCCL_SUCCESS);
  return c;
}

/* Comm A fails (an injected async error); comm B, healthy, has no error text, and A's text is
 * A's; the process's text (no comm) is A's, as ncclGetLastError. */
static void test_raw_text_is_the_comms(void **state) {
  (void)state;
  ncfsm_sim_opts sa, sb;
  test_sim_opts(&sa);
  test_sim_opts(&sb);
  sa.async_error_at_op = 0;
  sa.group_end_inprogress = 0;
  void *a = raw_comm(&sa), *b = raw_comm(&sb);
  int32_t x[4] = {1, 2, 3, 4};
  void *stream;
  assert_int_equal(be->stream_create(0, &stream), 0);
  ncfsm__op op = {NCFSM_KIND_ALLREDUCE, x, x, 4, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  be->op(a, &op);
  int st = NCFSM__NCCL_SUCCESS;
  be->get_async_error(a, &st);
  assert_int_equal(st, NCFSM__NCCL_REMOTE_ERROR);
  assert_non_null(strstr(be->last_error(a), "injected async error"));
  assert_non_null(strstr(be->last_error(NULL), "injected async error"));
  assert_string_equal(be->last_error(b), "");
  be->abort(a);
  be->abort(b);
  be->stream_destroy(stream);
}

static ncfsm_work *allreduce(ncfsm_comm *c, int32_t *x) {
  ncfsm_work *w;
  assert_int_equal(ncfsm_allreduce(c, x, x, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w), NCFSM_OK);
  return w;
}

/* Through ncfsm, two comms of one process in one group: A fails at its op 0, B at its op 1 (an
 * AllReduce before). Both errors are set by the one group end, before the loop sees either:
 * each comm's failure text names its own op, not the other comm's. */
static void test_failure_text_is_the_comms(void **state) {
  (void)state;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_sim_opts sa, sb;
  test_sim_opts(&sa);
  test_sim_opts(&sb);
  sa.async_error_at_op = 0;
  sb.async_error_at_op = 1;
  ncfsm_comm_opts oa, ob;
  test_comm_opts(&oa, &sa);
  test_comm_opts(&ob, &sb);
  oa.name = "A";
  ob.name = "B";
  oa.on_error = ob.on_error = NCFSM_ON_ERROR_STAY;
  ncfsm_comm *c[2];
  make_comms(loop, 1, &oa, &c[0], 0);
  make_comms(loop, 1, &ob, &c[1], 0);
  run_until_state(loop, c[0], NCFSM_STATE_READY);
  run_until_state(loop, c[1], NCFSM_STATE_READY);
  int32_t x[3][4] = {{1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}};
  ncfsm_work *w0 = allreduce(c[1], x[2]);
  assert_int_equal(ncfsm_work_wait(w0, 5000), NCFSM_OK);
  ncfsm_work_release(w0);

  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  ncfsm_work *w[2] = {allreduce(c[0], x[0]), allreduce(c[1], x[1])};
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  for (int i = 0; i < 2; i++) {
    assert_int_not_equal(ncfsm_work_wait(w[i], 5000), NCFSM_OK);
    ncfsm_work_release(w[i]);
    assert_int_equal(ncfsm_comm_state(c[i]), NCFSM_STATE_ERROR);
  }
  const char *fa = ncfsm_comm_failure(c[0]);
  assert_non_null(strstr(fa, "injected async error ncclRemoteError at op 0"));
  assert_null(strstr(fa, "at op 1"));
  const char *fb = ncfsm_comm_failure(c[1]);
  assert_non_null(strstr(fb, "injected async error ncclRemoteError at op 1"));
  assert_null(strstr(fb, "at op 0"));
  teardown_all(loop, c, 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_raw_text_is_the_comms),
      cmocka_unit_test(test_failure_text_is_the_comms),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
