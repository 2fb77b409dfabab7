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

/* A tcp bootstrap of rank of size against the store on 127.0.0.1:port (token or secret may
 * be NULL); the test fails when it does not open. */
static inline ncfsm_boot *bt_open_tcp(struct event_base *base, int port, int rank, int size,
                                      const char *token, const char *secret, uint64_t timeout_ms) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  ncfsm_boot_opts o;
  ncfsm_boot_opts_init(&o);
  o.kind = NCFSM_BOOT_TCP;
  o.store_addr = addr;
  o.token = token;
  o.rank_secret = secret;
  o.rank = rank;
  o.size = size;
  o.host_store = 0;
  o.timeout_ms = timeout_ms;
  ncfsm_boot *b = NULL;
  assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, &o, &b));
  return b;
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

/* The broadcast suite for bs[0..n), ranks of one job driven on base (all ranks of a job in
 * one process, or one rank per process): broadcasts of several sizes from several roots;
 * a broadcast and an allgather outstanding together, posted in opposite orders on even and odd
 * ranks when crossed (tcp and local match broadcasts apart from allgathers; pmix does not); a
 * broadcast from several roots in one request. */
static inline void bt_bcast_suite(struct event_base *base, ncfsm_boot **bs, int n, int crossed) {
  int size = ncfsm_boot_size(bs[0]);
  ncfsm_boot_req **q = calloc((size_t)n * 2, sizeof *q);
  unsigned char **buf = calloc((size_t)n, sizeof *buf);
  static const size_t lens[] = {64, 300, 5000, 0, 128};
  for (int k = 0; k < 5; k++) {
    size_t len = lens[k];
    int root = (k * 3) % size;
    unsigned char *want = malloc(len + 1);
    bt_fill(want, len, root, k);
    for (int i = 0; i < n; i++) {
      int r = ncfsm_boot_rank(bs[i]);
      buf[i] = calloc(len + 1, 1);
      if (r == root) memcpy(buf[i], want, len);
      ncfsm_result_t rc = ncfsm_boot_bcast_post(bs[i], buf[i], len, root, &q[i]);
      if (rc != NCFSM_OK) fail_msg("bcast %d post rank %d: %s", k, r, ncfsm_boot_last_error(bs[i]));
    }
    bt_wait_all(base, q, n);
    for (int i = 0; i < n; i++) {
      if (ncfsm_boot_test(q[i]) != NCFSM_OK)
        fail_msg("bcast %d rank %d: %s", k, ncfsm_boot_rank(bs[i]), ncfsm_boot_last_error(bs[i]));
      if (len) assert_memory_equal(buf[i], want, len);
      ncfsm_boot_req_free(q[i]);
      free(buf[i]);
    }
    free(want);
  }
  /* opposite orders of a broadcast and an allgather */
  int *ag = calloc((size_t)n * (size_t)size, sizeof *ag), *mine = calloc((size_t)n, sizeof *mine),
      *bc = calloc((size_t)n, sizeof *bc);
  for (int i = 0; i < n; i++) {
    int r = ncfsm_boot_rank(bs[i]);
    mine[i] = r * 7 + 1;
    bc[i] = r == size - 1 ? 4242 : -1;
    ncfsm_result_t r1, r2;
    if (!crossed || r % 2 == 0) {
      r1 = ncfsm_boot_bcast_post(bs[i], &bc[i], sizeof bc[i], size - 1, &q[2 * i]);
      r2 = ncfsm_boot_allgather_post(bs[i], &mine[i], ag + (size_t)i * size, sizeof(int), &q[2 * i + 1]);
    } else {
      r2 = ncfsm_boot_allgather_post(bs[i], &mine[i], ag + (size_t)i * size, sizeof(int), &q[2 * i + 1]);
      r1 = ncfsm_boot_bcast_post(bs[i], &bc[i], sizeof bc[i], size - 1, &q[2 * i]);
    }
    assert_int_equal(NCFSM_OK, r1);
    assert_int_equal(NCFSM_OK, r2);
  }
  bt_wait_all(base, q, 2 * n);
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < 2; j++) {
      if (ncfsm_boot_test(q[2 * i + j]) != NCFSM_OK)
        fail_msg("interleaved %d rank %d: %s", j, ncfsm_boot_rank(bs[i]), ncfsm_boot_last_error(bs[i]));
      ncfsm_boot_req_free(q[2 * i + j]);
    }
    assert_int_equal(4242, bc[i]);
    for (int r = 0; r < size; r++) assert_int_equal(r * 7 + 1, ag[(size_t)i * size + (size_t)r]);
  }
  free(ag);
  free(mine);
  free(bc);
  /* several roots in one request */
  int nroots = size < 3 ? size : 3;
  for (int i = 0; i < n; i++) {
    int r = ncfsm_boot_rank(bs[i]);
    buf[i] = calloc((size_t)nroots, 128);
    for (int j = 0; j < nroots; j++)
      if (ncfsm_boot_root_of(size, nroots, j) == r) bt_fill(buf[i] + (size_t)j * 128, 128, j, 99);
    ncfsm_result_t rc = ncfsm_boot_bcast_roots_post(bs[i], buf[i], 128, nroots, &q[i]);
    if (rc != NCFSM_OK) fail_msg("roots post rank %d: %s", r, ncfsm_boot_last_error(bs[i]));
  }
  bt_wait_all(base, q, n);
  for (int i = 0; i < n; i++) {
    if (ncfsm_boot_test(q[i]) != NCFSM_OK)
      fail_msg("roots rank %d: %s", ncfsm_boot_rank(bs[i]), ncfsm_boot_last_error(bs[i]));
    ncfsm_boot_req_free(q[i]);
    bt_check(buf[i], 128, nroots, 99); /* slot j holds root j's bt_fill(.., j, 99) */
    free(buf[i]);
  }
  free(buf);
  free(q);
}

#endif
