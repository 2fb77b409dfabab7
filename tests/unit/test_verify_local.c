/*
 * In-process verification (fsm/verify_local.c): the ranks of a comm all in
 * this process (ncfsm_comm_init, ncfsm_comm_init_all, split children)
 * compare their fingerprints in memory. Every mismatch kind is named on
 * every rank with its seq, field and each rank's value; a rank that skips a
 * collective is named with the last seq it reached; a failure of one rank
 * fails the others at once, naming it; a comm with verification off sees
 * none of it (the sim completes dtype, root and redop mismatches silently,
 * R11).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "helpers.h"
#include "ncfsm/introspect.h"

#define N 2
static int32_t buf[N][64][8];

static ncfsm_loop *verified(ncfsm_comm **c, ncfsm_verify_mode_t mode, uint64_t stall_ms, ncfsm_sim_opts *so) {
  ncfsm_comm_opts o;
  test_comm_opts(&o, so);
  o.verify = mode;
  o.verify_stall_ms = stall_ms;
  o.on_error = NCFSM_ON_ERROR_STAY; /* the failure stays to be read */
  return ready_comms_with(N, c, &o);
}

static ncfsm_loop *two(ncfsm_comm **c, ncfsm_verify_mode_t mode, uint64_t stall_ms) {
  static ncfsm_sim_opts so;
  test_sim_opts(&so);
  return verified(c, mode, stall_ms, &so);
}

/* k collectives on both ranks, the k-th (at) with rank 1's deviation. */
typedef enum { DEV_NONE, DEV_REDOP, DEV_DTYPE, DEV_ROOT, DEV_COUNT, DEV_OP, DEV_SKIP } deviation;

static void submit(ncfsm_comm *c, int r, int k, deviation d) {
  int32_t *b = buf[r][k];
  ncfsm_result_t rc;
  bool mine = r == 1;
  if (mine && d == DEV_SKIP) return;
  if (mine && d == DEV_REDOP) rc = ncfsm_allreduce(c, b, b, 4, NCFSM_INT32, NCFSM_OP_MAX, NULL, count_cb, (void *)(intptr_t)(r * 32 + k % 32), NULL);
  else if (mine && d == DEV_DTYPE) rc = ncfsm_allreduce(c, b, b, 4, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, count_cb, (void *)(intptr_t)(r * 32 + k % 32), NULL);
  else if (mine && d == DEV_COUNT) rc = ncfsm_allreduce(c, b, b, 2, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb, (void *)(intptr_t)(r * 32 + k % 32), NULL);
  else if (d == DEV_ROOT) rc = ncfsm_broadcast(c, b, b, 4, NCFSM_INT32, mine ? 1 : 0, NULL, count_cb, (void *)(intptr_t)(r * 32 + k % 32), NULL);
  else if (mine && d == DEV_OP) rc = ncfsm_broadcast(c, b, b, 4, NCFSM_INT32, 0, NULL, count_cb, (void *)(intptr_t)(r * 32 + k % 32), NULL);
  else rc = ncfsm_allreduce(c, b, b, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb, (void *)(intptr_t)(r * 32 + k % 32), NULL);
  assert_int_equal(rc, NCFSM_OK);
}

/* Runs until both comms failed or about ms passed. */
static void run_for(ncfsm_loop *loop, ncfsm_comm **c, int ms) {
  for (int i = 0; i < ms * 10; i++) {
    ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
    if (ncfsm_comm_state(c[0]) == NCFSM_STATE_ERROR && ncfsm_comm_state(c[1]) == NCFSM_STATE_ERROR) return;
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
}

static void expect_named(ncfsm_comm **c, const char *a, const char *b, const char *d) {
  for (int r = 0; r < N; r++) {
    const char *f = ncfsm_comm_failure(c[r]);
    if (!strstr(f, a) || !strstr(f, b) || (d && !strstr(f, d)))
      fail_msg("rank %d: its failure does not name '%s', '%s'%s%s: %s", r, a, b, d ? ", " : "", d ? d : "", f);
  }
}

/* silent: the sim completes the mismatched collective on every rank (R11):
 * the collectives before it keep their results. Otherwise a rank's launch
 * that holds it never completes, nor do the collectives launched with it. */
static void mismatch_case(deviation d, const char *field, const char *v0, const char *v1, bool silent) {
  ncfsm_comm *c[N];
  ncfsm_loop *loop = two(c, NCFSM_VERIFY_ASYNC, 500);
  reset_cbs();
  for (int k = 0; k < 10; k++)
    for (int r = 0; r < N; r++) submit(c[r], r, k, k == 7 ? d : DEV_NONE);
  run_for(loop, c, 3000);
  char seq_field[64];
  snprintf(seq_field, sizeof seq_field, "seq 7: %s mismatch", field);
  expect_named(c, seq_field, v0, v1);
  for (int r = 0; r < N; r++) {
    assert_int_equal(ncfsm_comm_state(c[r]), NCFSM_STATE_ERROR);
    if (silent) assert_int_equal(cb_status[r * 32 + 0], NCFSM_OK); /* what came before is fine */
    else assert_true(cb_status[r * 32 + 0] == NCFSM_OK || cb_status[r * 32 + 0] == NCFSM_ERR_MISMATCH);
  }
  teardown_all(loop, c, N);
}

static void test_redop(void **state) { (void)state; mismatch_case(DEV_REDOP, "redop", "rank 0 redop SUM", "rank 1 redop MAX", true); }
static void test_dtype(void **state) { (void)state; mismatch_case(DEV_DTYPE, "dtype", "rank 0 dtype", "rank 1 dtype", true); }
static void test_root(void **state) { (void)state; mismatch_case(DEV_ROOT, "root", "rank 0 root 0", "rank 1 root 1", true); }
static void test_count(void **state) { (void)state; mismatch_case(DEV_COUNT, "count", "rank 0 count 4", "rank 1 count 2", false); }
static void test_op(void **state) { (void)state; mismatch_case(DEV_OP, "op", "rank 0 op ALLREDUCE", "rank 1 op BROADCAST", false); }

/* Off: the sim completes a redop mismatch on both ranks with NCFSM_OK. */
static void test_off_is_silent(void **state) {
  (void)state;
  ncfsm_comm *c[N];
  ncfsm_loop *loop = two(c, NCFSM_VERIFY_OFF, 500);
  reset_cbs();
  for (int k = 0; k < 10; k++)
    for (int r = 0; r < N; r++) submit(c[r], r, k, k == 7 ? DEV_REDOP : DEV_NONE);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  for (int r = 0; r < N; r++) {
    assert_int_equal(ncfsm_comm_state(c[r]), NCFSM_STATE_READY);
    assert_int_equal(cb_status[r * 32 + 7], NCFSM_OK);
  }
  teardown_all(loop, c, N);
}

/* Rank 1 skips collective 5: rank 0's seq 5 waits; after the stall bound
 * rank 0 names rank 1 and where it is. */
static void test_skip_names_the_rank(void **state) {
  (void)state;
  ncfsm_comm *c[N];
  ncfsm_loop *loop = two(c, NCFSM_VERIFY_ASYNC, 200);
  reset_cbs();
  for (int k = 0; k < 6; k++)
    for (int r = 0; r < N; r++) submit(c[r], r, k, k == 5 ? DEV_SKIP : DEV_NONE);
  for (int i = 0; i < 30000 && ncfsm_comm_state(c[0]) != NCFSM_STATE_ERROR; i++) {
    ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_ERROR);
  const char *f = ncfsm_comm_failure(c[0]);
  if (!strstr(f, "seq 5") || !strstr(f, "rank 1 never launched it") || !strstr(f, "its last collective is seq 4"))
    fail_msg("rank 0's failure does not name rank 1 and its last seq: %s", f);
  assert_int_equal(cb_status[0 * 32 + 5], NCFSM_ERR_TIMEOUT);
  teardown_all(loop, c, N);
}

/* Rank 1's comm fails (an async error at its op 3): rank 0 fails with
 * NCFSM_ERR_PEER at once, naming rank 1, its seq and its cause. */
static void test_peer_failure_reaches_the_others(void **state) {
  (void)state;
  ncfsm_comm *c[N];
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
  static ncfsm_sim_opts so[N];
  for (int r = 0; r < N; r++) {
    test_sim_opts(&so[r]);
    if (r == 1) so[r].async_error_at_op = 3;
    ncfsm_comm_opts o;
    test_comm_opts(&o, &so[r]);
    o.verify = NCFSM_VERIFY_ASYNC;
    o.on_error = NCFSM_ON_ERROR_STAY;
    assert_int_equal(ncfsm_comm_new(loop, &o, &c[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_init(c[r], N, r, &id), NCFSM_OK);
  }
  for (int r = 0; r < N; r++) run_until_state(loop, c[r], NCFSM_STATE_READY);
  reset_cbs();
  for (int k = 0; k < 5; k++)
    for (int r = 0; r < N; r++) submit(c[r], r, k, DEV_NONE);
  run_for(loop, c, 3000);
  assert_int_equal(ncfsm_comm_state(c[1]), NCFSM_STATE_ERROR);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_ERROR);
  const char *f = ncfsm_comm_failure(c[0]);
  if (!strstr(f, "rank 1's comm failed first") || !strstr(f, "NCFSM_ERR_ASYNC") || !strstr(f, "NCFSM_ERR_PEER"))
    fail_msg("rank 0's failure does not name rank 1's: %s", f);
  assert_null(strstr(ncfsm_comm_failure(c[1]), "failed first")); /* the origin names its own cause */
  teardown_all(loop, c, N);
}

/* A split child verifies from its seq 0. */
static void test_split_child_verifies(void **state) {
  (void)state;
  ncfsm_comm *p[N], *k[N];
  ncfsm_loop *loop = two(p, NCFSM_VERIFY_ASYNC, 500);
  static ncfsm_sim_opts so;
  test_sim_opts(&so);
  for (int r = 0; r < N; r++) {
    ncfsm_comm_opts o;
    test_comm_opts(&o, &so);
    o.verify = NCFSM_VERIFY_ASYNC;
    o.on_error = NCFSM_ON_ERROR_STAY;
    o.name = "child";
    assert_int_equal(ncfsm_comm_new(loop, &o, &k[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_split(p[r], 0, r, k[r]), NCFSM_OK);
  }
  for (int r = 0; r < N; r++) run_until_state(loop, k[r], NCFSM_STATE_READY);
  reset_cbs();
  for (int r = 0; r < N; r++) submit(k[r], r, 0, DEV_REDOP);
  run_for(loop, k, 3000);
  expect_named(k, "seq 0: redop mismatch", "rank 1 redop MAX", NULL);
  for (int r = 0; r < N; r++) {
    assert_int_equal(ncfsm_comm_abort(k[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_release(k[r]), NCFSM_OK);
  }
  teardown_all(loop, p, N);
}

/* Send/recv: rank 0 sends 4 int32 to rank 1, which receives 2 (the pair
 * hangs on the sim), or receives floats (silent): both name the pair, seq,
 * field and both sides. A receive whose send never comes names the peer. */
static void p2p_case(int recv_count, ncfsm_dtype_t recv_dt, const char *want) {
  ncfsm_comm *c[N];
  ncfsm_loop *loop = two(c, NCFSM_VERIFY_ASYNC, 500);
  for (int k = 0; k < 3; k++) {
    bool bad = k == 2;
    assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
    assert_int_equal(ncfsm_send(c[0], buf[0][k], 4, NCFSM_INT32, 1, NULL, NULL, NULL, NULL), NCFSM_OK);
    assert_int_equal(ncfsm_recv(c[1], buf[1][k], bad ? (size_t)recv_count : 4, bad ? recv_dt : NCFSM_INT32, 0, NULL,
                                NULL, NULL, NULL),
                     NCFSM_OK);
    assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  }
  run_for(loop, c, 3000);
  expect_named(c, "send/recv seq 2 from rank 0 to rank 1", want, NULL);
  teardown_all(loop, c, N);
}

static void test_p2p_count(void **state) { (void)state; p2p_case(2, NCFSM_INT32, "count mismatch: rank 0 sends 4, rank 1 receives 2"); }
static void test_p2p_dtype(void **state) { (void)state; p2p_case(4, NCFSM_FLOAT32, "dtype mismatch: rank 0 sends INT32, rank 1 receives FLOAT32"); }

static void test_p2p_missing_send(void **state) {
  (void)state;
  ncfsm_comm *c[N];
  ncfsm_loop *loop = two(c, NCFSM_VERIFY_ASYNC, 200);
  assert_int_equal(ncfsm_recv(c[1], buf[1][0], 4, NCFSM_INT32, 0, NULL, NULL, NULL, NULL), NCFSM_OK);
  for (int i = 0; i < 30000 && ncfsm_comm_state(c[1]) != NCFSM_STATE_ERROR; i++) {
    ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  const char *f = ncfsm_comm_failure(c[1]);
  if (!strstr(f, "receive seq 0 from rank 0") || !strstr(f, "rank 0 never posted the matching send") ||
      !strstr(f, "it posted no send to it"))
    fail_msg("rank 1's failure does not name rank 0's missing send: %s", f);
  teardown_all(loop, c, N);
}

/* The layers of evidence: a collective every rank launched alike is
 * VERIFIED once compared; with verification off it never is. /status says
 * how far the comm is verified. */
static void test_evidence(void **state) {
  (void)state;
  for (int mode = 0; mode < 2; mode++) {
    ncfsm_comm *c[N];
    ncfsm_loop *loop = two(c, mode ? NCFSM_VERIFY_ASYNC : NCFSM_VERIFY_OFF, 500);
    ncfsm_work *w[N];
    for (int r = 0; r < N; r++)
      assert_int_equal(ncfsm_allreduce(c[r], buf[r][0], buf[r][0], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[r]),
                       NCFSM_OK);
    assert_int_equal(ncfsm_work_evidence(w[0]), NCFSM_EVIDENCE_ACCEPTED); /* queued */
    for (int r = 0; r < N; r++) assert_int_equal(ncfsm_work_wait(w[r], 5000), NCFSM_OK);
    run_turns(loop, 5); /* the comparison runs at the loop's turns */
    unsigned want = NCFSM_EVIDENCE_ACCEPTED | NCFSM_EVIDENCE_LAUNCHED | NCFSM_EVIDENCE_FINAL | NCFSM_EVIDENCE_COMPLETE |
                    (mode ? NCFSM_EVIDENCE_VERIFIED : 0u);
    for (int r = 0; r < N; r++) assert_int_equal(ncfsm_work_evidence(w[r]), want);
    char *js = NULL;
    assert_int_equal(ncfsm_loop_status_text(loop, NULL, &js, NULL), NCFSM_OK);
    if (mode) assert_non_null(strstr(js, "\"verify\":{\"mode\":\"async\",\"state\":\"RUNNING\",\"verified_seq\":1}"));
    else assert_non_null(strstr(js, "\"verify\":{\"mode\":\"off\",\"state\":null,\"verified_seq\":0}"));
    free(js);
    for (int r = 0; r < N; r++) ncfsm_work_release(w[r]);
    assert_int_equal(ncfsm_work_evidence(NULL), 0u);
    teardown_all(loop, c, N);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_redop),       cmocka_unit_test(test_dtype),
      cmocka_unit_test(test_root),        cmocka_unit_test(test_count),
      cmocka_unit_test(test_op),          cmocka_unit_test(test_off_is_silent),
      cmocka_unit_test(test_skip_names_the_rank), cmocka_unit_test(test_peer_failure_reaches_the_others),
      cmocka_unit_test(test_split_child_verifies), cmocka_unit_test(test_evidence),
      cmocka_unit_test(test_p2p_count),           cmocka_unit_test(test_p2p_dtype),
      cmocka_unit_test(test_p2p_missing_send),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
