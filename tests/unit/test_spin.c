/* Waiting threads spin first (ncfsm_loop_opts.spin_us, docs/design.md "Waiting threads spin
 * first"): a thread waiting for a loop that another thread runs spins until the loop's next
 * broadcast before it sleeps on the loop's condition variable, and the loop's own thread, with
 * nothing pending, spins on what reaches it without the lock (a hand-off, a wake) before it
 * waits in libevent. The counts of how each spin ended (loop->spins, /metrics
 * ncfsm_spins_total) say which path ran; spin_us 0 runs none. Also built under TSan (label
 * threads). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fsm/api-int.h"
#include "helpers.h"
#include "ncfsm/introspect.h"

static atomic_int ncb;
static float buf[4];

static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  (void)arg;
  assert_int_equal(st, NCFSM_OK);
  atomic_fetch_add(&ncb, 1);
}

static uint64_t spins(ncfsm_loop *loop, int who, int end) {
  pthread_mutex_lock(&loop->mu);
  uint64_t n = loop->spins[who][end];
  pthread_mutex_unlock(&loop->mu);
  return n;
}

/* A loop on its own thread whose waits spin for spin_us. */
static ncfsm_loop *threaded(unsigned spin_us, ncfsm_comm **c) {
  atomic_store(&ncb, 0);
  ncfsm_loop *loop = ready_comms(1, c);
  if (spin_us && loop->spin_cpus < 2) { /* spins are off on one CPU */
    teardown_all(loop, c, 1);
    skip();
  }
  loop->opts.spin_us = spin_us; /* no other thread runs it yet */
  assert_int_equal(ncfsm_loop_start_thread(loop), NCFSM_OK);
  return loop;
}

/* Submits one op from this thread (handed off: the loop runs on its own thread) and waits
 * for its callback without the loop's lock. */
static void op_and_callback(ncfsm_comm *c, int n) {
  assert_int_equal(ncfsm_allreduce(c, buf, buf, 4, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_done, NULL, NULL), NCFSM_OK);
  for (int ms = 0; ms < 10000 && atomic_load(&ncb) < n; ms++) test_sleep_ms(1);
  assert_int_equal(atomic_load(&ncb), n);
}

static atomic_int flag;
static bool flag_set(void *arg) {
  (void)arg;
  return atomic_load(&flag);
}

/* On the loop's thread without the lock (an ncfsm_loop_call): waits until the waiter spins
 * (end < 0) or until one of its spins ran out (end NCFSM__SPIN_BOUND), then sets the flag and
 * broadcasts under the lock, while the waiter is spinning in the first case, asleep in the
 * second. */
typedef struct gate {
  ncfsm_loop *loop;
  int end;
} gate;

static void open_gate(void *arg) {
  gate *g = arg;
  ncfsm_loop *loop = g->loop;
  pthread_mutex_lock(&loop->mu);
  for (int ms = 0; ms < 10000; ms++) {
    if (g->end < 0 ? loop->cv_spinners > 0 : loop->spins[NCFSM__SPIN_WAITER][g->end] > 0) break;
    pthread_mutex_unlock(&loop->mu);
    test_sleep_ms(1);
    pthread_mutex_lock(&loop->mu);
  }
  atomic_store(&flag, 1);
  ncfsm__loop_cv_broadcast(loop);
  pthread_mutex_unlock(&loop->mu);
}

/* Waits (ncfsm__wait_until, what ncfsm_work_wait uses) for the flag that open_gate sets. */
static void wait_for_gate(ncfsm_loop *loop, int end) {
  atomic_store(&flag, 0);
  static gate g; /* open_gate reads it until it sets the flag */
  g = (gate){loop, end};
  assert_int_equal(ncfsm_loop_call(loop, open_gate, &g), NCFSM_OK);
  assert_int_equal(ncfsm__wait_until(loop, flag_set, NULL, 0), NCFSM_OK);
}

/* The waiter spins (a bound of 1 s) and the loop's broadcast ends its spin. */
static void test_waiter_spins_until_broadcast(void **state) {
  (void)state;
  ncfsm_comm *c[1];
  ncfsm_loop *loop = threaded(1000000, c);
  wait_for_gate(loop, -1);
  assert_true(spins(loop, NCFSM__SPIN_WAITER, NCFSM__SPIN_WOKEN) >= 1);
  assert_int_equal(ncfsm_loop_stop_thread(loop), NCFSM_OK);
  teardown_all(loop, c, 1);
}

/* The loop's thread: after a turn, with nothing pending, it spins for up to 1 s; an op handed
 * off 5 ms later ends that spin (the push does not wake it: the thread is awake), and the
 * callback comes. A stop ends the spin that follows; no spin ran out. /metrics shows the
 * counts. */
static void test_loop_thread_spins_for_handoffs(void **state) {
  (void)state;
  ncfsm_comm *c[1];
  ncfsm_loop *loop = threaded(1000000, c);
  op_and_callback(c[0], 1);
  uint64_t before = spins(loop, NCFSM__SPIN_LOOP, NCFSM__SPIN_WOKEN);
  test_sleep_ms(5); /* the thread spins now */
  op_and_callback(c[0], 2);
  assert_true(spins(loop, NCFSM__SPIN_LOOP, NCFSM__SPIN_WOKEN) > before);
  test_sleep_ms(5);
  assert_int_equal(ncfsm_loop_stop_thread(loop), NCFSM_OK); /* its ncfsm_loop_call's wake ends the spin */
  assert_int_equal(spins(loop, NCFSM__SPIN_LOOP, NCFSM__SPIN_BOUND), 0);
  char *m = NULL;
  size_t len = 0;
  assert_int_equal(ncfsm_loop_metrics(loop, &m, &len), NCFSM_OK);
  assert_non_null(strstr(m, "ncfsm_spins_total{thread=\"loop\",end=\"woken\"} "));
  assert_non_null(strstr(m, "ncfsm_spins_total{thread=\"loop\",end=\"bound\"} 0\n"));
  assert_null(strstr(m, "ncfsm_spins_total{thread=\"loop\",end=\"woken\"} 0\n"));
  free(m);
  teardown_all(loop, c, 1);
}

/* A bound that passes: the loop's thread spins once per idle and then waits in libevent (a
 * push then wakes it), and a waiter whose loop is slower than its bound sleeps. */
static void test_bound_then_sleep(void **state) {
  (void)state;
  ncfsm_comm *c[1];
  ncfsm_loop *loop = threaded(1000, c); /* 1 ms */
  op_and_callback(c[0], 1);
  test_sleep_ms(20); /* the spin ran out: the thread waits in libevent */
  assert_true(spins(loop, NCFSM__SPIN_LOOP, NCFSM__SPIN_BOUND) >= 1);
  op_and_callback(c[0], 2); /* the hand-off's push wakes it */
  wait_for_gate(loop, NCFSM__SPIN_BOUND); /* opened once the waiter's spin ran out: it sleeps */
  assert_int_equal(ncfsm_loop_stop_thread(loop), NCFSM_OK);
  teardown_all(loop, c, 1);
}

static void open_gate_now(void *arg) {
  (void)arg;
  test_sleep_ms(5); /* the waiter waits meanwhile */
  atomic_store(&flag, 1);
}

/* spin_us 0: nobody spins, and everything still arrives. */
static void test_spin_off(void **state) {
  (void)state;
  ncfsm_comm *c[1];
  ncfsm_loop *loop = threaded(0, c);
  op_and_callback(c[0], 1);
  test_sleep_ms(5);
  op_and_callback(c[0], 2);
  atomic_store(&flag, 0);
  assert_int_equal(ncfsm_loop_call(loop, open_gate_now, NULL), NCFSM_OK);
  assert_int_equal(ncfsm__wait_until(loop, flag_set, NULL, 0), NCFSM_OK);
  assert_int_equal(ncfsm_loop_stop_thread(loop), NCFSM_OK);
  for (int who = 0; who < 2; who++)
    for (int end = 0; end < 2; end++) assert_int_equal(spins(loop, who, end), 0);
  teardown_all(loop, c, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_waiter_spins_until_broadcast),
      cmocka_unit_test(test_loop_thread_spins_for_handoffs),
      cmocka_unit_test(test_bound_then_sleep),
      cmocka_unit_test(test_spin_off),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
