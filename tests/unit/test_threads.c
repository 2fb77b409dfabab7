/* Threaded paths: the loop on its own thread; producers on other threads
 * submit works; callbacks run on the loop thread exactly once; abort from a
 * foreign thread is carried out on the loop thread. Also built under TSan. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "helpers.h"

#define N 4
#define OPS 200

static ncfsm_loop *loop;
static ncfsm_comm *comms[N];
static int32_t bufs[N][OPS][2];
static atomic_int completed, wrong_thread, bad_status;
static pthread_t loop_tid;
static atomic_int loop_tid_known;

static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  (void)arg;
  if (!atomic_load(&loop_tid_known)) {
    loop_tid = pthread_self();
    atomic_store(&loop_tid_known, 1);
  } else if (!pthread_equal(loop_tid, pthread_self())) {
    atomic_fetch_add(&wrong_thread, 1);
  }
  if (st != NCFSM_OK) atomic_fetch_add(&bad_status, 1);
  atomic_fetch_add(&completed, 1);
}

static void *producer(void *arg) {
  int r = (int)(intptr_t)arg;
  for (int k = 0; k < OPS; k++) {
    bufs[r][k][0] = bufs[r][k][1] = r;
    ncfsm_result_t rc = ncfsm_allreduce(comms[r], bufs[r][k], bufs[r][k], 2, NCFSM_INT32, NCFSM_OP_SUM,
                                        NULL, on_done, NULL, NULL);
    if (rc != NCFSM_OK) {
      fprintf(stderr, "submit failed: %s\n", ncfsm_comm_last_error(comms[r]));
      abort();
    }
  }
  return NULL;
}

static void test_producers_and_loop_thread(void **state) {
  (void)state;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  make_comms(loop, N, &o, comms, 0);
  assert_int_equal(ncfsm_loop_start_thread(loop), NCFSM_OK);
  for (int r = 0; r < N; r++) assert_int_equal(ncfsm_comm_wait_state(comms[r], NCFSM_STATE_READY, 10000), NCFSM_OK);
  pthread_t th[N];
  for (int r = 0; r < N; r++) pthread_create(&th[r], NULL, producer, (void *)(intptr_t)r);
  for (int r = 0; r < N; r++) pthread_join(th[r], NULL);
  for (int i = 0; i < 20000 && atomic_load(&completed) < N * OPS; i++) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(atomic_load(&completed), N * OPS);
  assert_int_equal(atomic_load(&wrong_thread), 0);
  assert_int_equal(atomic_load(&bad_status), 0);
  assert_false(pthread_equal(loop_tid, pthread_self()));
  for (int r = 0; r < N; r++)
    for (int k = 0; k < OPS; k++) assert_int_equal(bufs[r][k][0], 0 + 1 + 2 + 3);
  /* Abort from this (foreign) thread: runs on the loop thread, we wait. */
  for (int r = 0; r < N; r++) assert_int_equal(ncfsm_comm_abort(comms[r]), NCFSM_OK);
  for (int r = 0; r < N; r++) assert_int_equal(ncfsm_comm_state(comms[r]), NCFSM_STATE_CLOSED);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_ERR_BUSY); /* thread still running, comms held */
  assert_int_equal(ncfsm_loop_stop_thread(loop), NCFSM_OK);
  for (int r = 0; r < N; r++) assert_int_equal(ncfsm_comm_release(comms[r]), NCFSM_OK);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_producers_and_loop_thread)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
