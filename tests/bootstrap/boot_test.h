/* Shared helpers for the bootstrap tests. */
#ifndef NCFSM_TESTS_BOOT_TEST_H
#define NCFSM_TESTS_BOOT_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>
#include <event2/thread.h>

#include "ncfsm/bootstrap.h"

/* Each test runs under an alarm: a hang kills the test binary (and CTest's
 * TIMEOUT backs it up). */
static inline int bt_setup(void **state) {
  (void)state;
  alarm(60);
  return 0;
}
static inline int bt_teardown(void **state) {
  (void)state;
  alarm(0);
  return 0;
}
#define BT_TEST(f) cmocka_unit_test_setup_teardown(f, bt_setup, bt_teardown)

static inline struct event_base *bt_base(void) {
  static int threads_on;
  if (!threads_on) {
    evthread_use_pthreads();
    threads_on = 1;
  }
  struct event_base *b = event_base_new();
  assert_non_null(b);
  return b;
}

static inline double bt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Run base until every request in reqs[0..n) is finished. */
static inline void bt_wait_all(struct event_base *base, ncfsm_boot_req **reqs, int n) {
  for (;;) {
    int pending = 0;
    for (int i = 0; i < n; i++)
      if (reqs[i] && ncfsm_boot_test(reqs[i]) == NCFSM_ERR_AGAIN) pending++;
    if (!pending) return;
    event_base_loop(base, EVLOOP_ONCE);
  }
}

/* Rank r's contribution to round k: len bytes. */
static inline void bt_fill(unsigned char *p, size_t len, int r, int k) {
  for (size_t i = 0; i < len; i++) p[i] = (unsigned char)(r * 131 + k * 17 + (int)i);
}
static inline void bt_check(const unsigned char *recv, size_t len, int size, int k) {
  unsigned char *want = malloc(len ? len : 1);
  for (int r = 0; r < size; r++) {
    bt_fill(want, len, r, k);
    if (len) assert_memory_equal(recv + (size_t)r * len, want, len);
  }
  free(want);
}

/* Run base until req is finished or secs passed; its status. */
static inline ncfsm_result_t bt_wait(struct event_base *base, ncfsm_boot_req *req, double secs) {
  double t0 = bt_now();
  while (ncfsm_boot_test(req) == NCFSM_ERR_AGAIN && bt_now() - t0 < secs) {
    struct timeval tv = {0, 20000};
    event_base_loopexit(base, &tv);
    event_base_loop(base, EVLOOP_ONCE);
  }
  return ncfsm_boot_test(req);
}

/* Run base for about secs (callbacks, wakes). */
static inline void bt_spin(struct event_base *base, double secs) {
  double t0 = bt_now();
  while (bt_now() - t0 < secs) {
    struct timeval tv = {0, 10000};
    event_base_loopexit(base, &tv);
    event_base_loop(base, EVLOOP_ONCE);
  }
}

#endif
