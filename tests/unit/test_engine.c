/* Engine behaviour on the sim: lifecycle traces, groups (R3), errors (R10),
 * overlaps (R12), loop close, callbacks exactly once. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "helpers.h"
#include "ncfsm/bootstrap.h"

#include <event2/event.h>

/* Comm transitions of one comm, as a string "NEW>INIT_IN_PROGRESS>...". */
static void comm_path(const trace_log *t, const void *comm, char *out, size_t len) {
  out[0] = '\0';
  int first = 1;
  for (int i = 0; i < t->n; i++) {
    if (t->rec[i].kind != NCFSM_OBJ_COMM || t->rec[i].obj != comm) continue;
    if (first) {
      strncat(out, ncfsm_state_name(t->rec[i].state), len - strlen(out) - 1);
      first = 0;
    }
    strncat(out, ">", len - strlen(out) - 1);
    strncat(out, ncfsm_state_name(t->rec[i].next), len - strlen(out) - 1);
  }
}

static void test_lifecycle_trace(void **state) {
  (void)state;
  static trace_log t;
  t.n = 0;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_loop_set_trace(loop, trace_record, &t);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  o.timing = 1;
  ncfsm_comm *c[2];
  make_comms(loop, 2, &o, c, 0);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_wait_state(c[r], NCFSM_STATE_READY, 5000), NCFSM_OK);
  int32_t buf[2][8];
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 8; i++) buf[r][i] = r + 1;
  reset_cbs();
  ncfsm_work *w[2];
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb,
                                     (void *)(intptr_t)r, &w[r]),
                     NCFSM_OK);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_GROUP_OPEN);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_work_wait(w[r], 5000), NCFSM_OK);
    assert_int_equal(ncfsm_work_state(w[r]), NCFSM_WORK_COMPLETED);
    ncfsm_work_times tm;
    assert_int_equal(ncfsm_work_get_times(w[r], &tm), NCFSM_OK);
    assert_true(tm.submit_ns > 0 && tm.submit_ns <= tm.launch_ns && tm.launch_ns <= tm.final_ns &&
                tm.final_ns <= tm.complete_ns);
    assert_true(tm.device_ms >= 0);                          /* opts.timing */
    assert_true(tm.ready_at_final == 0 || tm.ready_at_final == 1);
    ncfsm_work_release(w[r]);
  }
  for (int r = 0; r < 2; r++) {
    assert_int_equal(cb_count[r], 1);
    for (int i = 0; i < 8; i++) assert_int_equal(buf[r][i], 3);
  }
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_finalize(c[r]), NCFSM_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_wait_state(c[r], NCFSM_STATE_FINALIZED, 5000), NCFSM_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_destroy(c[r]), NCFSM_OK);
  char path[1024];
  comm_path(&t, c[0], path, sizeof path);
  assert_string_equal(path, "NEW>INIT_QUEUED>INIT_IN_PROGRESS>READY>GROUP_OPEN>READY>LAUNCH_IN_PROGRESS>"
                            "READY>DRAINING>FINALIZING>FINALIZED>CLOSING>CLOSED");
  /* Work lifecycle: QUEUED > LAUNCHING > IN_FLIGHT > COMPLETED. */
  char wp[256] = "";
  for (int i = 0; i < t.n; i++)
    if (t.rec[i].kind == NCFSM_OBJ_WORK && t.rec[i].rank == 0) {
      strcat(wp, ncfsm_work_state_name(t.rec[i].next));
      strcat(wp, ">");
    }
  assert_string_equal(wp, "QUEUED>LAUNCHING>IN_FLIGHT>COMPLETED>");
  teardown_all(loop, c, 2);
}

/* R3: nested groups; only the outermost end reaches the backend. */
static void test_nested_groups(void **state) {
  (void)state;
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  int32_t a[2][4], b[2][4], d[2][4];
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 4; i++) a[r][i] = b[r][i] = d[r][i] = 1;
  uint64_t before = backend_calls(c[0]);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncfsm_allreduce(c[r], a[r], a[r], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_depth(loop), 2);
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncfsm_allreduce(c[r], b[r], b[r], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK); /* inner: launches nothing */
  run_turns(loop, 5);
  assert_int_equal(backend_calls(c[0]), before);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_GROUP_OPEN);
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncfsm_allreduce(c[r], d[r], d[r], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK); /* outermost: launches A, B, C */
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  assert_int_equal(backend_calls(c[0]), before + 3);
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 4; i++) {
      assert_int_equal(a[r][i], 2);
      assert_int_equal(b[r][i], 2);
      assert_int_equal(d[r][i], 2);
    }
  teardown_all(loop, c, 2);
}

/* R3: an argument error inside a group fails the call AND the outer end; the
 * end is still required; the group's other works fail with ERR_GROUP; the
 * comm stays usable (unlike a nonblocking NCCL comm, which is poisoned). */
static void test_group_arg_error(void **state) {
  (void)state;
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  int32_t buf[2][4] = {{1, 1, 1, 1}, {2, 2, 2, 2}};
  reset_cbs();
  uint64_t before = backend_calls(c[0]);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  assert_int_equal(ncfsm_allreduce(c[0], buf[0], buf[0], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb, (void *)0, NULL), NCFSM_OK);
  /* Broadcast root == nranks: the seed's invalid-root variant. */
  assert_int_equal(ncfsm_broadcast(c[1], buf[1], buf[1], 4, NCFSM_INT32, 2, NULL, count_cb, (void *)1, NULL),
                   NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_comm_last_error(c[1]), "root"));
  assert_int_equal(ncfsm_group_depth(loop), 1); /* the group stays open */
  assert_int_equal(ncfsm_group_end(loop), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_loop_last_error(loop), "R3"));
  assert_int_equal(ncfsm_group_depth(loop), 0);
  run_turns(loop, 3);
  assert_int_equal(cb_count[0], 1); /* the valid op of the failed group */
  assert_int_equal(cb_status[0], NCFSM_ERR_GROUP);
  assert_int_equal(cb_count[1], 0); /* the rejected call never gets a callback */
  assert_int_equal(backend_calls(c[0]), before);
  /* valid-op-after-group-error: the comms are still usable. */
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_state(c[r]), NCFSM_STATE_READY);
  ncfsm_work *w[2];
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[r]), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_work_wait(w[r], 5000), NCFSM_OK);
    ncfsm_work_release(w[r]);
    for (int i = 0; i < 4; i++) assert_int_equal(buf[r][i], 3);
  }
  ncfsm_sim_stats st;
  assert_int_equal(ncfsm_sim_get_stats(c[0], &st), NCFSM_OK);
  assert_int_equal(st.async_state, 0); /* never poisoned */
  assert_int_equal(st.rejected, 0);
  teardown_all(loop, c, 2);
}

static void test_group_end_without_start(void **state) {
  (void)state;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_ERR_INVALID_USAGE);
  assert_non_null(strstr(ncfsm_loop_last_error(loop), "not in a group"));
  assert_int_equal(ncfsm_group_depth(loop), 0);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

static ncfsm_loop *thread_loop;
static ncfsm_result_t thread_rc[2];
static void *other_thread(void *arg) {
  (void)arg;
  thread_rc[0] = ncfsm_group_end(thread_loop);
  thread_rc[1] = ncfsm_group_start(thread_loop);
  return NULL;
}

/* R3: a group opened on thread A cannot be closed (or nested) on thread B. */
static void test_group_end_other_thread(void **state) {
  (void)state;
  assert_int_equal(ncfsm_loop_new(NULL, &thread_loop), NCFSM_OK);
  assert_int_equal(ncfsm_group_start(thread_loop), NCFSM_OK);
  pthread_t th;
  pthread_create(&th, NULL, other_thread, NULL);
  pthread_join(th, NULL);
  assert_int_equal(thread_rc[0], NCFSM_ERR_WRONG_THREAD);
  assert_int_equal(thread_rc[1], NCFSM_ERR_WRONG_THREAD);
  assert_int_equal(ncfsm_group_depth(thread_loop), 1);
  assert_int_equal(ncfsm_group_end(thread_loop), NCFSM_OK);
  assert_int_equal(ncfsm_loop_close(thread_loop), NCFSM_OK);
}

/* R10: async error -> ERROR -> abort -> CLOSED; every pending work's
 * callback fires once with the cause. */
static void test_async_error_abort(void **state) {
  (void)state;
  static trace_log t;
  t.n = 0;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_loop_set_trace(loop, trace_record, &t);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  so.async_error_at_op = 2;
  test_comm_opts(&o, &so);
  o.on_error = NCFSM_ON_ERROR_ABORT;
  ncfsm_comm *c[1];
  make_comms(loop, 1, &o, c, 0);
  run_until_state(loop, c[0], NCFSM_STATE_READY);
  static int32_t bufs[6][4];
  reset_cbs();
  for (int k = 0; k < 6; k++)
    assert_int_equal(ncfsm_allreduce(c[0], bufs[k], bufs[k], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb,
                                     (void *)(intptr_t)k, NULL),
                     NCFSM_OK);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_CLOSED);
  int failed = 0;
  for (int k = 0; k < 6; k++) {
    assert_int_equal(cb_count[k], 1);
    if (cb_status[k] != NCFSM_OK) {
      assert_true(cb_status[k] == NCFSM_ERR_ASYNC || cb_status[k] == NCFSM_ERR_BACKEND);
      failed++;
    }
  }
  assert_true(failed >= 4); /* ops 2..5 never complete */
  char path[512];
  comm_path(&t, c[0], path, sizeof path);
  assert_non_null(strstr(path, ">ERROR>ABORT_QUEUED>CLOSING>CLOSED"));
  assert_int_equal(ncfsm_comm_backend_error(c[0]), 6); /* ncclRemoteError */
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "R10"));
  teardown_all(loop, c, 1);
}

/* Watchdog: a rank that never arrives -> TIMEOUT -> ERROR, works TIMED_OUT. */
static void test_watchdog_timeout(void **state) {
  (void)state;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_sim_opts so, so1;
  ncfsm_comm_opts o, o1;
  test_stuck_opts(&so, &o, &so1, &o1, 50);
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
  ncfsm_comm *c[2];
  assert_int_equal(ncfsm_comm_new(loop, &o, &c[0]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_new(loop, &o1, &c[1]), NCFSM_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_init(c[r], 2, r, &id), NCFSM_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_wait_state(c[r], NCFSM_STATE_READY, 5000), NCFSM_OK);
  int32_t buf[4] = {0};
  ncfsm_work *w;
  assert_int_equal(ncfsm_allreduce(c[0], buf, buf, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w), NCFSM_OK);
  assert_int_equal(ncfsm_work_wait(w, 10000), NCFSM_ERR_TIMEOUT);
  assert_int_equal(ncfsm_work_state(w), NCFSM_WORK_TIMED_OUT);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_ERROR);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "watchdog"));
  ncfsm_work_release(w);
  teardown_all(loop, c, 2);
}

/* R12: overlapping writes in one group are rejected at its end (or warned). */
static void test_overlap(void **state) {
  (void)state;
  for (int policy = 0; policy < 2; policy++) {
    ncfsm_loop_opts lo;
    ncfsm_loop_opts_init(&lo);
    lo.overlap = policy == 0 ? NCFSM_OVERLAP_REJECT : NCFSM_OVERLAP_WARN;
    ncfsm_loop *loop;
    assert_int_equal(ncfsm_loop_new(&lo, &loop), NCFSM_OK);
    ncfsm_sim_opts so;
    ncfsm_comm_opts o;
    test_sim_opts(&so);
    test_comm_opts(&o, &so);
    ncfsm_comm *c[2];
    make_comms(loop, 2, &o, c, 0);
    for (int r = 0; r < 2; r++) run_until_state(loop, c[r], NCFSM_STATE_READY);
    int32_t buf[2][4] = {{1, 1, 1, 1}, {1, 1, 1, 1}};
    assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
    for (int k = 0; k < 3; k++)
      for (int r = 0; r < 2; r++)
        assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
    ncfsm_result_t rc = ncfsm_group_end(loop);
    assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
    if (policy == 0) {
      assert_int_equal(rc, NCFSM_ERR_OVERLAP);
      assert_non_null(strstr(ncfsm_loop_last_error(loop), "R12"));
      for (int r = 0; r < 2; r++) assert_int_equal(buf[r][0], 1); /* nothing ran */
    } else {
      /* Launched as NCCL would: the sim runs the group's ops concurrently
       * (R12) and the result is NOT 8 (three sequential sums). */
      assert_int_equal(rc, NCFSM_OK);
      assert_int_not_equal(buf[0][0], 8);
    }
    /* The same three as separate launches are ordered: 1 -> 2 -> 4 -> 8. */
    for (int r = 0; r < 2; r++)
      for (int i = 0; i < 4; i++) buf[r][i] = 1;
    for (int k = 0; k < 3; k++)
      for (int r = 0; r < 2; r++)
        assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
    assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
    for (int r = 0; r < 2; r++) assert_int_equal(buf[r][0], 8);
    teardown_all(loop, c, 2);
  }
}

/* libuv rule: the loop refuses to close while handles are open. */
static void test_loop_close_busy(void **state) {
  (void)state;
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_ERR_BUSY);
  assert_non_null(strstr(ncfsm_loop_last_error(loop), "not released"));
  assert_int_equal(ncfsm_comm_release(c[0]), NCFSM_ERR_ILLEGAL_STATE); /* READY: destroy first */
  teardown_all(loop, c, 1);
}

/* Bad arguments are rejected before the backend, naming the argument. */
static void test_bad_arguments(void **state) {
  (void)state;
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o2;
  test_sim_opts(&so);
  test_comm_opts(&o2, &so);
  o2.device = 7;
  ncfsm_comm *other;
  assert_int_equal(ncfsm_comm_new(loop, &o2, &other), NCFSM_OK);
  void *foreign_stream;
  assert_int_equal(ncfsm_stream_create(other, &foreign_stream), NCFSM_OK);
  int32_t b[4];
  uint64_t before = backend_calls(c[0]);
  struct { ncfsm_result_t rc; const char *word; } cases[] = {
      {ncfsm_allreduce(c[0], NULL, b, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), "sendbuff"},
      {ncfsm_allreduce(c[0], b, NULL, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), "recvbuff"},
      {ncfsm_allreduce(c[0], b, b, 4, (ncfsm_dtype_t)42, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), "datatype"},
      {ncfsm_allreduce(c[0], b, b, 4, NCFSM_INT32, (ncfsm_redop_t)9, NULL, NULL, NULL, NULL), "op"},
      {ncfsm_broadcast(c[0], b, b, 4, NCFSM_INT32, -1, NULL, NULL, NULL, NULL), "root"},
      {ncfsm_send(c[0], b, 4, NCFSM_INT32, 2, NULL, NULL, NULL, NULL), "peer"},
      {ncfsm_allgather(c[0], b, b, SIZE_MAX / 4, NCFSM_INT32, NULL, NULL, NULL, NULL), "count"},
      {ncfsm_allreduce(c[0], b, b, 4, NCFSM_INT32, NCFSM_OP_SUM, foreign_stream, NULL, NULL, NULL), "stream"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_int_equal(cases[i].rc, NCFSM_ERR_INVALID_ARGUMENT);
  }
  /* The last error names the last argument checked. */
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "stream"));
  run_turns(loop, 3);
  assert_int_equal(backend_calls(c[0]), before);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_READY);
  /* Each message names its argument. */
  ncfsm_allreduce(c[0], b, b, 4, (ncfsm_dtype_t)42, NCFSM_OP_SUM, NULL, NULL, NULL, NULL);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "datatype"));
  ncfsm_send(c[0], b, 4, NCFSM_INT32, 2, NULL, NULL, NULL, NULL);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "peer"));
  assert_int_equal(ncfsm_stream_destroy(other, foreign_stream), NCFSM_OK);
  assert_int_equal(ncfsm_comm_release(other), NCFSM_OK);
  teardown_all(loop, c, 2);
}

/* The launcher coalesces ops submitted in one turn but keeps dependent ops
 * (R12: overlapping ranges, one writes) in separate launches. Random in-place
 * AllReduces over overlapping ranges must give the sequential result: the sim
 * runs the ops of one launch concurrently (reads before writes), so a wrong
 * merge would show up in the data. Also counts that independent ops merged. */
static void test_coalescing_respects_r12(void **state) {
  (void)state;
  static trace_log t;
  t.n = 0;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_loop_set_trace(loop, trace_record, &t);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  ncfsm_comm *c[2];
  make_comms(loop, 2, &o, c, 0);
  for (int r = 0; r < 2; r++) run_until_state(loop, c[r], NCFSM_STATE_READY);
  enum { LEN = 256, OPS = 300 };
  static uint32_t buf[2][LEN], expect[LEN];
  for (int i = 0; i < LEN; i++) buf[0][i] = buf[1][i] = expect[i] = (uint32_t)i + 1;
  unsigned seed = 12345;
  t.n = 0;
  for (int k = 0; k < OPS; k++) {
    seed = seed * 1103515245u + 12345u;
    int a = (int)((seed >> 8) % LEN);
    seed = seed * 1103515245u + 12345u;
    int len = 1 + (int)((seed >> 8) % 8);
    if (a + len > LEN) len = LEN - a;
    for (int i = a; i < a + len; i++) expect[i] *= 2; /* sequential semantics */
    for (int r = 0; r < 2; r++)
      assert_int_equal(ncfsm_allreduce(c[r], buf[r] + a, buf[r] + a, (size_t)len, NCFSM_UINT32, NCFSM_OP_SUM,
                                       NULL, NULL, NULL, NULL),
                       NCFSM_OK);
  }
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < LEN; i++)
      if (buf[r][i] != expect[i]) fail_msg("rank %d element %d: %u, sequential result %u", r, i, buf[r][i], expect[i]);
  int launches = 0;
  for (int i = 0; i < t.n; i++)
    if (t.rec[i].kind == NCFSM_OBJ_COMM && t.rec[i].obj == c[0] && t.rec[i].event == NCFSM_EV_LAUNCH_PENDING)
      launches++;
  /* merged: fewer launches than ops; split: more than OPS / coalesce_max */
  assert_true(launches < OPS);
  assert_true(launches > OPS / 64);
  teardown_all(loop, c, 2);
}

/* A loop embedded in the application's own event_base: the application runs
 * the base; ncfsm's wakeups and polls are ordinary events in it. */
static int app_timer_fired;
static void app_timer(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  (void)arg;
  app_timer_fired++;
}

static void test_embedded_loop(void **state) {
  (void)state;
  struct event_base *base = event_base_new();
  assert_non_null(base);
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new_embedded(base, NULL, &loop), NCFSM_OK);
  assert_ptr_equal(ncfsm_loop_base(loop), base);
  struct event *t = evtimer_new(base, app_timer, NULL);
  struct timeval tv = {0, 1000};
  evtimer_add(t, &tv);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  ncfsm_comm *c[2];
  make_comms(loop, 2, &o, c, 0);
  int32_t buf[2][4] = {{1, 1, 1, 1}, {2, 2, 2, 2}};
  reset_cbs();
  for (int r = 0; r < 2; r++) /* queued (DEFER) while init is in progress */
    assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb,
                                     (void *)(intptr_t)r, NULL),
                     NCFSM_OK);
  for (int i = 0; i < 1000 && (cb_count[0] + cb_count[1] < 2 || !app_timer_fired); i++)
    event_base_loop(base, EVLOOP_ONCE); /* the application's loop, not ncfsm_loop_run */
  assert_int_equal(cb_count[0], 1);
  assert_int_equal(cb_count[1], 1);
  assert_int_equal(app_timer_fired, 1);
  for (int r = 0; r < 2; r++) assert_int_equal(buf[r][0], 3);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_comm_abort(c[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_release(c[r]), NCFSM_OK);
  }
  event_base_loop(base, EVLOOP_NONBLOCK);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
  event_free(t);
  event_base_free(base);
}

/* Review findings, kept as regressions. */

/* A comm with ops in an open group may not finalize or be destroyed: those
 * ops must launch first (they would otherwise never run). */
static void test_open_group_blocks_finalize_and_destroy(void **state) {
  (void)state;
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  static float buf[4];
  ncfsm_work *w;
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  assert_int_equal(ncfsm_allreduce(c[0], buf, buf, 4, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w), NCFSM_OK);
  assert_int_equal(ncfsm_comm_finalize(c[0]), NCFSM_ERR_ILLEGAL_STATE);
  assert_int_equal(ncfsm_comm_destroy(c[0]), NCFSM_ERR_ILLEGAL_STATE);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_ERR_ILLEGAL_STATE); /* R3: the group reports it */
  assert_int_equal(ncfsm_work_wait(w, 5000), NCFSM_ERR_GROUP);       /* final, never stuck */
  ncfsm_work_release(w);
  assert_int_equal(ncfsm_comm_finalize(c[0]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_wait_state(c[0], NCFSM_STATE_FINALIZED, 5000), NCFSM_OK);
  teardown_all(loop, c, 1);
}

/* An init that completes at once (blocking comm) while the comm has ops in
 * an open group: the comm is GROUP_OPEN, not READY. */
static void test_sync_init_while_enlisted(void **state) {
  (void)state;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  o.blocking = 1;
  ncfsm_comm *c[1];
  make_comms(loop, 1, &o, c, 0);
  static float buf[4] = {1, 1, 1, 1};
  ncfsm_work *w;
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  assert_int_equal(ncfsm_allreduce(c[0], buf, buf, 4, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w), NCFSM_OK);
  run_turns(loop, 3);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_GROUP_OPEN);
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  assert_int_equal(ncfsm_work_wait(w, 5000), NCFSM_OK);
  ncfsm_work_release(w);
  teardown_all(loop, c, 1);
}

/* One group spanning more comms than the launcher's stack arrays. */
static void test_group_over_64_comms(void **state) {
  (void)state;
  enum { N = 70 };
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  static ncfsm_comm *c[N];
  static int32_t buf[N][2];
  static ncfsm_work *w[N];
  assert_int_equal(ncfsm_comm_init_all(loop, N, &o, NULL, c), NCFSM_OK);
  for (int r = 0; r < N; r++) assert_int_equal(ncfsm_comm_wait_state(c[r], NCFSM_STATE_READY, 10000), NCFSM_OK);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  for (int r = 0; r < N; r++) {
    buf[r][0] = buf[r][1] = 1;
    assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], 2, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[r]), NCFSM_OK);
  }
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  for (int r = 0; r < N; r++) {
    assert_int_equal(ncfsm_work_wait(w[r], 10000), NCFSM_OK);
    ncfsm_work_release(w[r]);
    assert_int_equal(buf[r][0], N);
  }
  teardown_all(loop, c, N);
}

/* Waiting on a loop from inside one of its callbacks is refused at once. */
static ncfsm_work *inner_work;
static ncfsm_result_t inner_rc = NCFSM_OK;
static void waiting_cb(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  (void)st;
  (void)arg;
  inner_rc = ncfsm_work_wait(inner_work, 1000);
}

static void test_wait_inside_callback_refused(void **state) {
  (void)state;
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  static float a[2], b[2];
  assert_int_equal(ncfsm_allreduce(c[0], a, a, 2, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, waiting_cb, NULL, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_allreduce(c[0], b, b, 2, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &inner_work), NCFSM_OK);
  assert_int_equal(ncfsm_work_wait(inner_work, 5000), NCFSM_OK);
  assert_int_equal(inner_rc, NCFSM_ERR_INVALID_USAGE);
  assert_non_null(strstr(ncfsm_loop_last_error(loop), "callbacks"));
  ncfsm_work_release(inner_work);
  teardown_all(loop, c, 1);
}

/* Every entry point takes NULL handles and arguments without crashing. */
static void test_null_handles(void **state) {
  (void)state;
  ncfsm_comm *c = NULL;
  float b[1];
  assert_int_equal(ncfsm_loop_new(NULL, NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_loop_new_embedded(NULL, NULL, NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_null(ncfsm_loop_base(NULL));
  assert_int_equal(ncfsm_loop_run(NULL, NCFSM_RUN_NOWAIT), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_loop_close(NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_loop_call(NULL, NULL, NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_group_start(NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_group_end(NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_group_depth(NULL), -1);
  assert_int_equal(ncfsm_comm_new(NULL, NULL, &c), NCFSM_ERR_INVALID_ARGUMENT);
  assert_null(c);
  assert_int_equal(ncfsm_comm_init(NULL, 1, 0, NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_comm_init_boot(NULL, NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_comm_state(NULL), NCFSM_STATE_COUNT);
  assert_int_equal(ncfsm_comm_rank(NULL), -1);
  assert_non_null(ncfsm_comm_last_error(NULL));
  assert_int_equal(ncfsm_comm_wait_state(NULL, NCFSM_STATE_READY, 1), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_comm_finalize(NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_comm_destroy(NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_comm_abort(NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_comm_revoke(NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_comm_release(NULL), NCFSM_ERR_INVALID_ARGUMENT);
  ncfsm_work *w = (ncfsm_work *)1;
  assert_int_equal(ncfsm_allreduce(NULL, b, b, 1, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w),
                   NCFSM_ERR_INVALID_ARGUMENT);
  assert_null(w); /* a failed call never hands out a work */
  assert_int_equal(ncfsm_send(NULL, b, 1, NCFSM_FLOAT32, 0, NULL, NULL, NULL, NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_work_state(NULL), NCFSM_WORK_STATE_COUNT);
  assert_int_equal(ncfsm_work_status(NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_work_wait(NULL, 1), NCFSM_ERR_INVALID_ARGUMENT);
  assert_null(ncfsm_work_fingerprint(NULL));
  ncfsm_work_release(NULL);
  ncfsm_work_times t;
  assert_int_equal(ncfsm_work_get_times(NULL, &t), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_string_equal(ncfsm_err_name((ncfsm_result_t)999), "NCFSM_UNKNOWN");
  assert_string_equal(ncfsm_state_name((ncfsm_state_t)999), "UNKNOWN_STATE");
}

/* ncfsm_last_error: one place for every object's refusal, per thread. */
static void *other_thread_error(void *arg) {
  *(const char **)arg = ncfsm_last_error();
  return NULL;
}

static void test_last_error(void **state) {
  (void)state;
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  /* a comm's refused call */
  assert_int_equal(ncfsm_comm_release(c[0]), NCFSM_ERR_ILLEGAL_STATE);
  assert_string_equal(ncfsm_last_error(), ncfsm_comm_last_error(c[0]));
  assert_non_null(strstr(ncfsm_last_error(), "ncfsm_comm_release"));
  assert_non_null(strstr(ncfsm_last_error(), "READY"));
  /* a loop's */
  assert_int_equal(ncfsm_group_end(loop), NCFSM_ERR_INVALID_USAGE);
  assert_non_null(strstr(ncfsm_last_error(), "R3"));
  /* a bootstrap's (no handle to ask) */
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  ncfsm_boot *b = NULL;
  assert_int_equal(ncfsm_boot_open(NULL, &bo, &b), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_last_error(), "ncfsm_boot_open"));
  /* another thread has its own */
  const char *theirs = NULL;
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, other_thread_error, &theirs), 0);
  pthread_join(t, NULL);
  assert_string_equal(theirs, "");
  teardown_all(loop, c, 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lifecycle_trace),     cmocka_unit_test(test_nested_groups),
      cmocka_unit_test(test_last_error),
      cmocka_unit_test(test_group_arg_error),     cmocka_unit_test(test_group_end_without_start),
      cmocka_unit_test(test_group_end_other_thread), cmocka_unit_test(test_async_error_abort),
      cmocka_unit_test(test_watchdog_timeout),    cmocka_unit_test(test_overlap),
      cmocka_unit_test(test_loop_close_busy),     cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_coalescing_respects_r12), cmocka_unit_test(test_embedded_loop),
      cmocka_unit_test(test_open_group_blocks_finalize_and_destroy),
      cmocka_unit_test(test_sync_init_while_enlisted), cmocka_unit_test(test_group_over_64_comms),
      cmocka_unit_test(test_wait_inside_callback_refused), cmocka_unit_test(test_null_handles),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
