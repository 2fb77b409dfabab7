/*
 * Regression tests for the defects of the issue "The state machine, explicit
 * all the way": each reproduces one report (review, API-sequence fuzzer, GPU
 * runs) on the sim and checks the fixed behaviour: the engine before the
 * redesign (commit 5143ee6) did what each test's comment describes.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <signal.h>
#include <unistd.h>

#include "fsm/recorder.h"
#include "helpers.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int32_t buf[8][16];

/* The fuzzer's worst find: ncfsm_comm_destroy on a comm whose work was in
 * flight (its peer never joined) returned OK and the work later completed
 * with NCFSM_OK over garbage. Now destroy is refused (guard IDLE); abort
 * fails the work, which stays failed when the peer arrives later. */
static void test_destroy_inflight_never_ok(void **state) {
  (void)state;
  reset_cbs();
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  for (int i = 0; i < 4; i++) buf[0][i] = 7;
  assert_int_equal(ncfsm_allreduce(c[0], buf[0], buf[0], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb, (void *)0, NULL), NCFSM_OK);
  run_turns(loop, 5);
  assert_int_equal(ncfsm_comm_destroy(c[0]), NCFSM_ERR_ILLEGAL_STATE);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_READY);
  assert_int_equal(cb_count[0], 0);
  assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
  run_turns(loop, 2);
  assert_int_equal(cb_count[0], 1);
  assert_int_equal(cb_status[0], NCFSM_ERR_ABORTED);
  /* the peer learnt it (verification, in memory): its comm failed naming
   * rank 0, and its late collective is refused; nothing changes for rank 0's work */
  assert_true(ncfsm_comm_state(c[1]) != NCFSM_STATE_READY); /* failed, then aborted by its policy */
  assert_non_null(strstr(ncfsm_comm_failure(c[1]), "rank 0's comm failed first"));
  assert_int_equal(ncfsm_allreduce(c[1], buf[1], buf[1], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb, (void *)1, NULL),
                   NCFSM_ERR_ILLEGAL_STATE);
  run_turns(loop, 10);
  assert_int_equal(cb_count[0], 1);
  assert_int_equal(cb_status[0], NCFSM_ERR_ABORTED);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_CLOSED);
  teardown_all(loop, c, 2);
}

/* Revoke: the dropped work's callback fired with NCFSM_OK. Every work not
 * seen complete before the revoke fails. */
static void test_revoke_fails_unobserved(void **state) {
  (void)state;
  reset_cbs();
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  assert_int_equal(ncfsm_allreduce(c[0], buf[0], buf[0], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb, (void *)0, NULL), NCFSM_OK);
  run_turns(loop, 5);
  assert_int_equal(ncfsm_comm_revoke(c[0]), NCFSM_OK);
  assert_int_equal(ncfsm_allreduce(c[1], buf[1], buf[1], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb, (void *)1, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_comm_wait_state(c[0], NCFSM_STATE_REVOKED, 5000), NCFSM_OK);
  run_turns(loop, 5);
  assert_int_equal(cb_count[0], 1);
  assert_int_equal(cb_status[0], NCFSM_ERR_ABORTED);
  teardown_all(loop, c, 2);
}

/* Two comms sharing one user stream, watchdog 50 ms, policy STAY: destroy
 * of the one whose work waits behind the other's left a work in flight on a
 * CLOSED comm, and ncfsm_loop_run(DEFAULT) never returned. */
static void test_shared_stream_stay_destroy(void **state) {
  (void)state;
  reset_cbs();
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  o.timeout_ms = 50;
  o.on_error = NCFSM_ON_ERROR_STAY;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_comm *a[2], *b[2];
  make_comms(loop, 2, &o, a, 0);
  make_comms(loop, 2, &o, b, 0);
  for (int r = 0; r < 2; r++) {
    run_until_state(loop, a[r], NCFSM_STATE_READY);
    run_until_state(loop, b[r], NCFSM_STATE_READY);
  }
  void *s;
  assert_int_equal(ncfsm_stream_create(a[0], &s), NCFSM_OK);
  /* a[0]'s op never completes (a[1] never joins); b[0]'s waits behind it on s */
  assert_int_equal(ncfsm_allreduce(a[0], buf[0], buf[0], 4, NCFSM_INT32, NCFSM_OP_SUM, s, count_cb, (void *)0, NULL), NCFSM_OK);
  run_turns(loop, 5); /* a[0]'s op is on s first */
  assert_int_equal(ncfsm_comm_state(a[0]), NCFSM_STATE_READY);
  assert_int_equal(ncfsm_allreduce(b[0], buf[1], buf[1], 4, NCFSM_INT32, NCFSM_OP_SUM, s, count_cb, (void *)1, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_allreduce(b[1], buf[2], buf[2], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb, (void *)2, NULL), NCFSM_OK);
  run_turns(loop, 10);
  assert_int_equal(ncfsm_comm_destroy(b[0]), NCFSM_ERR_ILLEGAL_STATE);
  double t0 = now_s();
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  assert_true(now_s() - t0 < 10.0);
  assert_int_equal(cb_count[0], 1);
  assert_int_equal(cb_status[0], NCFSM_ERR_TIMEOUT);
  assert_int_equal(cb_count[1], 1);
  assert_true(cb_status[1] != NCFSM_OK); /* never OK: its data never arrived */
  assert_int_equal(ncfsm_comm_state(a[0]), NCFSM_STATE_ERROR);
  assert_non_null(strstr(ncfsm_comm_failure(a[0]), "watchdog"));
  assert_int_equal(ncfsm_stream_destroy(a[0], s), NCFSM_OK);
  for (int r = 0; r < 2; r++) {
    if (ncfsm_comm_state(b[r]) != NCFSM_STATE_CLOSED) assert_int_equal(ncfsm_comm_abort(b[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_release(b[r]), NCFSM_OK);
  }
  teardown_all(loop, a, 2);
}

/* A failed revoke left the previous call's message as the last error; after
 * an async error, revoke went REVOKING and back to ERROR and wait_state said
 * "nothing is pending (an open group? a missing init?)". */
static void test_revoke_after_error_messages(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  so.async_error_at_op = 0;
  test_comm_opts(&o, &so);
  o.on_error = NCFSM_ON_ERROR_STAY;
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms_with(1, c, &o);
  assert_int_equal(ncfsm_allreduce(c[0], buf[0], buf[0], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
  run_until_state(loop, c[0], NCFSM_STATE_ERROR);
  char failure[512];
  snprintf(failure, sizeof failure, "%s", ncfsm_comm_failure(c[0]));
  assert_non_null(strstr(failure, "ncclRemoteError"));
  ncfsm_result_t r = ncfsm_comm_revoke(c[0]);
  if (r == NCFSM_OK) {
    ncfsm_result_t w = ncfsm_comm_wait_state(c[0], NCFSM_STATE_REVOKED, 5000);
    if (w != NCFSM_OK) {
      assert_int_equal(w, NCFSM_ERR_ILLEGAL_STATE);
      const char *e = ncfsm_comm_last_error(c[0]);
      assert_null(strstr(e, "missing init"));
      assert_non_null(strstr(e, "ncfsm_comm_abort"));  /* the calls that can move it on */
      assert_non_null(strstr(e, "ncclRemoteError"));   /* the cause of the failure */
    }
  } else {
    assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "ncfsm_comm_revoke"));
  }
  /* the failure that ended the comm's healthy life is kept */
  assert_string_equal(ncfsm_comm_failure(c[0]), failure);
  teardown_all(loop, c, 1);

  /* revoke on a runtime without it: its own message, not the previous one */
  test_sim_opts(&so);
  so.has_revoke = 0;
  test_comm_opts(&o, &so);
  loop = ready_comms_with(1, c, &o);
  assert_int_equal(ncfsm_comm_finalize(c[0]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_finalize(c[0]), NCFSM_ERR_ILLEGAL_STATE); /* leaves a message */
  assert_int_equal(ncfsm_comm_wait_state(c[0], NCFSM_STATE_FINALIZED, 5000), NCFSM_OK);
  assert_int_equal(ncfsm_comm_revoke(c[0]), NCFSM_ERR_ILLEGAL_STATE);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "ncfsm_comm_revoke"));
  teardown_all(loop, c, 1);
}

/* ncfsm_stream_destroy while a QUEUED work names the stream: use after free
 * at launch. Now refused until the work finished. */
static void test_stream_destroy_busy(void **state) {
  (void)state;
  reset_cbs();
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  void *s;
  assert_int_equal(ncfsm_stream_create(c[0], &s), NCFSM_OK);
  assert_int_equal(ncfsm_allreduce(c[0], buf[0], buf[0], 4, NCFSM_INT32, NCFSM_OP_SUM, s, count_cb, (void *)0, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_stream_destroy(c[0], s), NCFSM_ERR_BUSY);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "not finished"));
  assert_int_equal(ncfsm_allreduce(c[1], buf[1], buf[1], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb, (void *)1, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  assert_int_equal(cb_status[0], NCFSM_OK);
  assert_int_equal(ncfsm_stream_destroy(c[0], s), NCFSM_OK);
  teardown_all(loop, c, 2);
}

/* ncfsm_work_wait returned NCFSM_ERR_TIMEOUT for its own timeout and for a
 * work the watchdog timed out. */
static void test_wait_timeout_vs_watchdog(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  o.timeout_ms = 300;
  o.on_error = NCFSM_ON_ERROR_STAY;
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms_with(2, c, &o);
  ncfsm_work *w;
  assert_int_equal(ncfsm_allreduce(c[0], buf[0], buf[0], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w), NCFSM_OK);
  assert_int_equal(ncfsm_work_wait(w, 20), NCFSM_ERR_AGAIN); /* the wait's own limit */
  assert_int_equal(ncfsm_work_wait(w, 5000), NCFSM_ERR_TIMEOUT); /* the watchdog */
  assert_int_equal(ncfsm_work_state(w), NCFSM_WORK_TIMED_OUT);
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  teardown_all(loop, c, 2);
}

/* A second ncfsm_work_release was accepted: the queued work went back to the
 * free list, the next submit reused it and ncfsm_loop_run hung. */
static void test_double_release(void **state) {
  (void)state;
  reset_cbs();
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  ncfsm_work *w;
  assert_int_equal(ncfsm_allreduce(c[0], buf[0], buf[0], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb, (void *)0, &w), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  assert_int_equal(ncfsm_work_release(w), NCFSM_ERR_INVALID_USAGE); /* still queued: detected */
  for (int k = 1; k < 4; k++)
    assert_int_equal(ncfsm_allreduce(c[0], buf[k], buf[k], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb, (void *)(intptr_t)k, NULL), NCFSM_OK);
  for (int k = 0; k < 4; k++)
    assert_int_equal(ncfsm_allreduce(c[1], buf[4 + k], buf[4 + k], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb, (void *)(intptr_t)(4 + k), NULL), NCFSM_OK);
  double t0 = now_s();
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  assert_true(now_s() - t0 < 10.0);
  for (int k = 0; k < 8; k++) {
    assert_int_equal(cb_count[k], 1);
    assert_int_equal(cb_status[k], NCFSM_OK);
  }
  /* after the work is freed, a third release is still recognised */
  assert_int_equal(ncfsm_work_release(w), NCFSM_ERR_INVALID_USAGE);
  teardown_all(loop, c, 2);
}

/* ncfsm_loop_close inside a ncfsm_loop_call callback returned OK, then the
 * loop was used after free. */
static ncfsm_result_t close_rc = NCFSM_OK;
static void close_inside(void *arg) { close_rc = ncfsm_loop_close(arg); }

static void test_loop_close_in_callback(void **state) {
  (void)state;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  assert_int_equal(ncfsm_loop_call(loop, close_inside, loop), NCFSM_OK);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_ONCE), NCFSM_OK);
  assert_int_equal(close_rc, NCFSM_ERR_INVALID_USAGE);
  assert_non_null(strstr(ncfsm_loop_last_error(loop), "inside one of this loop's callbacks"));
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* ncfsm_loop_last_error was documented per thread but was per loop. */
static ncfsm_loop *shared_loop;
static char other_err[512];
static void *other_thread(void *arg) {
  (void)arg;
  ncfsm_group_end(shared_loop); /* not in a group: an error of this thread */
  snprintf(other_err, sizeof other_err, "%s", ncfsm_loop_last_error(shared_loop));
  return NULL;
}

static void test_loop_error_per_thread(void **state) {
  (void)state;
  assert_int_equal(ncfsm_loop_new(NULL, &shared_loop), NCFSM_OK);
  assert_string_equal(ncfsm_loop_last_error(shared_loop), "");
  pthread_t th;
  pthread_create(&th, NULL, other_thread, NULL);
  pthread_join(th, NULL);
  assert_non_null(strstr(other_err, "ncfsm_group_end"));
  assert_string_equal(ncfsm_loop_last_error(shared_loop), ""); /* this thread made no error */
  assert_int_equal(ncfsm_loop_close(shared_loop), NCFSM_OK);
}

/* ncfsm_comm_init_boot: argument errors before anything else. */
static void test_init_boot_arguments(void **state) {
  (void)state;
  ncfsm_comm *c[1];
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  assert_int_equal(ncfsm_comm_new(loop, &o, &c[0]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_init_boot(c[0], NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "boot is NULL"));
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_NEW);
  teardown_all(loop, c, 1);
}

/* The watchdog is on by default (README: it fails stop). */
static void test_watchdog_default_on(void **state) {
  (void)state;
  unsetenv("NCFSM_TIMEOUT_MS");
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  assert_int_equal(o.timeout_ms, NCFSM_DEFAULT_TIMEOUT_MS);
}

/* A dead peer came back as NCFSM_ERR_BACKEND or NCFSM_ERR_ASYNC depending on
 * whether the group end or a later poll saw it first. */
static void test_async_cause_independent_of_timing(void **state) {
  (void)state;
  for (int direct = 0; direct < 2; direct++) {
    reset_cbs();
    ncfsm_sim_opts so;
    ncfsm_comm_opts o;
    test_sim_opts(&so);
    so.async_error_at_op = 0;
    so.group_end_inprogress = direct ? 0 : 1; /* 0: the group end itself sees the error */
    test_comm_opts(&o, &so);
    o.on_error = NCFSM_ON_ERROR_STAY;
    ncfsm_comm *c[1];
    ncfsm_loop *loop = ready_comms_with(1, c, &o);
    assert_int_equal(ncfsm_allreduce(c[0], buf[0], buf[0], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb, (void *)0, NULL), NCFSM_OK);
    assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
    assert_int_equal(cb_count[0], 1);
    assert_int_equal(cb_status[0], NCFSM_ERR_ASYNC);
    teardown_all(loop, c, 1);
  }
}

/* FINALIZING with a launch in flight never fired LAUNCH_PENDING/FINAL (the
 * hidden boolean busy): now DRAIN_LAUNCH_IN_PROGRESS -> DRAINING -> ... */
static void test_finalize_during_launch(void **state) {
  (void)state;
  reset_cbs();
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  so.launch_polls = 3;
  test_comm_opts(&o, &so);
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms_with(2, c, &o);
  trace_log *t = calloc(1, sizeof *t);
  ncfsm_loop_set_trace(loop, trace_record, t);
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < 4; i++) buf[r][i] = r + 1;
    assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb, (void *)(intptr_t)r, NULL), NCFSM_OK);
  }
  run_until_state(loop, c[0], NCFSM_STATE_LAUNCH_IN_PROGRESS);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_finalize(c[r]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_DRAIN_LAUNCH_IN_PROGRESS);
  for (int r = 0; r < 2; r++) {
    ncfsm_result_t wr = ncfsm_comm_wait_state(c[r], NCFSM_STATE_FINALIZED, 5000);
    if (wr != NCFSM_OK)
      fail_msg("rank %d: %s in %s: %s", r, ncfsm_err_name(wr), ncfsm_state_name(ncfsm_comm_state(c[r])),
               ncfsm_comm_last_error(c[r]));
  }
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(cb_status[r], NCFSM_OK);
    assert_int_equal(buf[r][0], 3);
  }
  bool saw_final = false;
  for (int i = 0; i < t->n; i++)
    if (t->rec[i].obj == c[0] && t->rec[i].state == NCFSM_STATE_DRAIN_LAUNCH_IN_PROGRESS &&
        t->rec[i].event == NCFSM_EV_LAUNCH_FINAL && t->rec[i].next == NCFSM_STATE_DRAINING)
      saw_final = true;
  assert_true(saw_final);
  ncfsm_loop_set_trace(loop, NULL, NULL);
  free(t);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_destroy(c[r]), NCFSM_OK);
  teardown_all(loop, c, 2);
}

/* Issue 9, item 5: a per-op deadline on top of the comm's (here off). */
static void test_work_own_timeout(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  o.timeout_ms = 0; /* the comm's watchdog is off */
  o.on_error = NCFSM_ON_ERROR_STAY;
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms_with(2, c, &o);
  ncfsm_work *w;
  assert_int_equal(ncfsm_allreduce(c[0], buf[0], buf[0], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w), NCFSM_OK);
  assert_int_equal(ncfsm_work_set_timeout(w, 100), NCFSM_OK);
  double t0 = now_s();
  assert_int_equal(ncfsm_work_wait(w, 10000), NCFSM_ERR_TIMEOUT);
  assert_true(now_s() - t0 < 5.0);
  assert_non_null(strstr(ncfsm_comm_failure(c[0]), "within 100 ms"));
  assert_int_equal(ncfsm_work_set_timeout(w, 100), NCFSM_ERR_ILLEGAL_STATE); /* final already */
  assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  teardown_all(loop, c, 2);
}

/* Issue 9, item 5: the error policy revoke (R6), and its fallback to abort. */
static void test_policy_revoke(void **state) {
  (void)state;
  for (int has = 1; has >= 0; has--) {
    ncfsm_sim_opts so;
    ncfsm_comm_opts o;
    test_sim_opts(&so);
    so.has_revoke = has;
    test_comm_opts(&o, &so);
    o.timeout_ms = 100;
    o.on_error = NCFSM_ON_ERROR_REVOKE;
    ncfsm_comm *c[2];
    ncfsm_loop *loop = ready_comms_with(2, c, &o);
    ncfsm_work *w;
    assert_int_equal(ncfsm_allreduce(c[0], buf[0], buf[0], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w), NCFSM_OK);
    assert_int_equal(ncfsm_work_wait(w, 10000), NCFSM_ERR_TIMEOUT);
    if (has) {
      assert_int_equal(ncfsm_comm_wait_state(c[0], NCFSM_STATE_REVOKED, 5000), NCFSM_OK);
      if (!strstr(ncfsm_comm_last_error(c[0]), "revoked it")) fail_msg("last error: %s", ncfsm_comm_last_error(c[0]));
    } else {
      assert_int_equal(ncfsm_comm_wait_state(c[0], NCFSM_STATE_CLOSED, 5000), NCFSM_OK);
      assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "aborts it"));
    }
    assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
    teardown_all(loop, c, 2);
  }
}

/* ncfsm_comm_dump's refusals say what to do. */
static void test_dump_refusals(void **state) {
  (void)state;
  unsetenv("NCFSM_DUMP_DIR");
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms_with(1, c, &o);
  assert_int_equal(ncfsm_comm_dump(c[0], NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "NCFSM_DUMP_DIR"));
  teardown_all(loop, c, 1);
  o.trace_buffer = 0;
  loop = ready_comms_with(1, c, &o);
  assert_int_equal(ncfsm_comm_dump(c[0], "/tmp"), NCFSM_ERR_UNSUPPORTED);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "NCFSM_TRACE_BUFFER"));
  teardown_all(loop, c, 1);
}

/* SIGUSR1 with dump_on_signal: the loop dumps every comm with a dump dir. */
static void test_dump_on_signal(void **state) {
  (void)state;
  char dir[] = "/tmp/ncfsm_sigdump_XXXXXX";
  assert_non_null(mkdtemp(dir));
  ncfsm_loop_opts lo;
  ncfsm_loop_opts_init(&lo);
  lo.dump_on_signal = 1;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(&lo, &loop), NCFSM_OK);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  o.dump_dir = dir;
  ncfsm_comm *c[2];
  make_comms(loop, 2, &o, c, 0);
  for (int r = 0; r < 2; r++) run_until_state(loop, c[r], NCFSM_STATE_READY);
  assert_int_equal(raise(SIGUSR1), 0);
  for (int i = 0; i < 50; i++) {
    assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT), NCFSM_OK);
  }
  ncfsm__rec_shutdown(); /* the dump thread writes what is queued */
  int json = 0;
  char cmd[256];
  snprintf(cmd, sizeof cmd, "ls %s | grep -c 'ncfsm_fr_.*_r[01]\\.json$'", dir);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  assert_int_equal(fscanf(f, "%d", &json), 1);
  pclose(f);
  assert_int_equal(json, 2);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  teardown_all(loop, c, 2);
}


/* Fuzzer defect (issue 20): ncfsm_comm_shrink(NCFSM_SHRINK_ABORT) on a comm
 * whose init timed out went to NCCL ("used before the previous operation
 * returned ncclSuccess"), failing parent and child. Such a comm is
 * INIT_FAILED now, where shrink and revoke are refused before NCCL, with
 * the way out; only abort is legal. */
static void test_shrink_after_init_timeout(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  o.timeout_ms = 100;
  o.on_error = NCFSM_ON_ERROR_STAY;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_comm *c[2];
  make_comms(loop, 2, &o, c, 1); /* rank 1 never inits: rank 0's init times out */
  assert_int_equal(ncfsm_comm_wait_state(c[0], NCFSM_STATE_INIT_FAILED, 5000), NCFSM_OK);
  assert_non_null(strstr(ncfsm_comm_failure(c[0]), "INIT_IN_PROGRESS"));
  ncfsm_comm *child;
  ncfsm_comm_opts co;
  test_comm_opts(&co, &so);
  assert_int_equal(ncfsm_comm_new(loop, &co, &child), NCFSM_OK);
  uint64_t before = backend_calls(c[0]);
  int ex = 1;
  assert_int_equal(ncfsm_comm_shrink(c[0], &ex, 1, NCFSM_SHRINK_ABORT, child), NCFSM_ERR_ILLEGAL_STATE);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "INIT_FAILED"));
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "initialise a new one"));
  assert_int_equal(ncfsm_comm_revoke(c[0]), NCFSM_ERR_ILLEGAL_STATE);
  assert_int_equal(ncfsm_comm_destroy(c[0]), NCFSM_ERR_ILLEGAL_STATE);
  assert_int_equal(backend_calls(c[0]), before); /* nothing reached NCCL */
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_INIT_FAILED);
  assert_int_equal(ncfsm_comm_state(child), NCFSM_STATE_NEW); /* the child is untouched */
  assert_int_equal(ncfsm_comm_release(child), NCFSM_OK);
  assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_CLOSED);
  teardown_all(loop, c, 2);
}

/* Without a usable GPU, a call that needs the nccl backend is refused with
 * the cause (no driver, no device, no library) and says to use the sim or
 * auto, readable through the API (ncfsm_last_error, ncfsm_loop_last_error),
 * not only a WARN of a function the user did not call (issue: the first hour). */
static void test_no_gpu_names_the_cause(void **state) {
  (void)state;
  ncfsm_backend_info bi;
  if (ncfsm_backend_query(NCFSM_BACKEND_NCCL, &bi) == NCFSM_OK && bi.device_count > 0) skip();
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_comm_opts o;
  assert_int_equal(ncfsm_comm_opts_init(&o), NCFSM_OK);
  o.backend = NCFSM_BACKEND_NCCL;
  ncfsm_comm *c[2];
  assert_int_equal(ncfsm_comm_init_all(loop, 2, &o, NULL, c), NCFSM_ERR_UNSUPPORTED);
  const char *e = ncfsm_last_error();
  assert_non_null(strstr(e, "ncfsm_comm_init_all"));
  assert_non_null(strstr(e, "nccl backend is unavailable"));
  assert_non_null(strstr(e, "sim"));
  assert_string_equal(ncfsm_loop_last_error(loop), e);
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_NCCL, &id), NCFSM_ERR_UNSUPPORTED);
  assert_non_null(strstr(ncfsm_last_error(), "ncfsm_get_unique_id"));
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_destroy_inflight_never_ok),
      cmocka_unit_test(test_no_gpu_names_the_cause),
      cmocka_unit_test(test_revoke_fails_unobserved),
      cmocka_unit_test(test_shared_stream_stay_destroy),
      cmocka_unit_test(test_revoke_after_error_messages),
      cmocka_unit_test(test_stream_destroy_busy),
      cmocka_unit_test(test_wait_timeout_vs_watchdog),
      cmocka_unit_test(test_double_release),
      cmocka_unit_test(test_loop_close_in_callback),
      cmocka_unit_test(test_loop_error_per_thread),
      cmocka_unit_test(test_init_boot_arguments),
      cmocka_unit_test(test_watchdog_default_on),
      cmocka_unit_test(test_async_cause_independent_of_timing),
      cmocka_unit_test(test_finalize_during_launch),
      cmocka_unit_test(test_work_own_timeout),
      cmocka_unit_test(test_policy_revoke),
      cmocka_unit_test(test_dump_refusals),
      cmocka_unit_test(test_dump_on_signal),
      cmocka_unit_test(test_shrink_after_init_timeout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
