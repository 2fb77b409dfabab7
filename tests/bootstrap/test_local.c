/* local bootstrap: in-process groups, across threads and on one thread. */
#include <pthread.h>
#include <stdatomic.h>

#include "tests/bootstrap/boot_test.h"

#define ROUNDS 20

typedef struct member_arg {
  const char *group;
  int rank, size;
  int ok;
} member_arg;

static size_t round_len(int k) { return (size_t)(k % 5) * 37 + (k == 3 ? 4096 : 0); }

static void *member_main(void *p) {
  member_arg *a = p;
  struct event_base *base = event_base_new();
  ncfsm_boot_opts o;
  ncfsm_boot_opts_init(&o);
  o.kind = NCFSM_BOOT_LOCAL;
  o.local_group = a->group;
  o.rank = a->rank;
  o.size = a->size;
  o.timeout_ms = 20000;
  ncfsm_boot *b;
  if (ncfsm_boot_open(base, &o, &b) != NCFSM_OK) return NULL;
  int good = ncfsm_boot_rank(b) == a->rank && ncfsm_boot_size(b) == a->size &&
             ncfsm_boot_local_rank(b) == a->rank && ncfsm_boot_local_size(b) == a->size &&
             ncfsm_boot_kind(b) == NCFSM_BOOT_LOCAL;
  for (int k = 0; k < ROUNDS && good; k++) {
    size_t len = round_len(k);
    unsigned char *send = malloc(len + 1), *recv = malloc(len * (size_t)a->size + 1);
    bt_fill(send, len, a->rank, k);
    if (ncfsm_boot_allgather(b, send, recv, len) != NCFSM_OK) good = 0;
    for (int r = 0; r < a->size && good; r++) {
      unsigned char *want = malloc(len + 1);
      bt_fill(want, len, r, k);
      if (len && memcmp(recv + (size_t)r * len, want, len)) good = 0;
      free(want);
    }
    free(send);
    free(recv);
    ncfsm_boot_req *bar;
    if (good && ncfsm_boot_barrier_post(b, &bar) == NCFSM_OK) {
      while (ncfsm_boot_test(bar) == NCFSM_ERR_AGAIN) event_base_loop(base, EVLOOP_ONCE);
      if (ncfsm_boot_test(bar) != NCFSM_OK) good = 0;
      ncfsm_boot_req_free(bar);
    }
  }
  a->ok = good;
  if (ncfsm_boot_close(b) != NCFSM_OK) a->ok = 0;
  event_base_free(base);
  return NULL;
}

static void test_four_threads(void **state) {
  (void)state;
  event_base_free(bt_base()); /* evthread_use_pthreads */
  pthread_t th[4];
  member_arg a[4];
  for (int i = 0; i < 4; i++) {
    a[i] = (member_arg){"four", i, 4, 0};
    assert_int_equal(0, pthread_create(&th[i], NULL, member_main, &a[i]));
  }
  for (int i = 0; i < 4; i++) {
    void *ret;
    pthread_join(th[i], &ret);
    assert_true(a[i].ok);
  }
}

static int done_calls;
static void on_done(ncfsm_boot_req *req, ncfsm_result_t st, void *arg) {
  (void)req;
  assert_int_equal(NCFSM_OK, st);
  (*(int *)arg)++;
  done_calls++;
}

static void test_same_thread(void **state) {
  (void)state;
  struct event_base *base = bt_base();
  enum { N = 4 };
  ncfsm_boot *b[N];
  for (int r = 0; r < N; r++) {
    ncfsm_boot_opts o;
    ncfsm_boot_opts_init(&o);
    o.kind = NCFSM_BOOT_LOCAL;
    o.local_group = "one-thread";
    o.rank = r;
    o.size = N;
    assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, &o, &b[r]));
  }
  /* several collectives outstanding at once, posted in the same order */
  enum { K = 3 };
  unsigned char send[N][K][32], recv[N][K][N * 32];
  ncfsm_boot_req *req[N * K];
  int per[N * K];
  memset(per, 0, sizeof per);
  done_calls = 0;
  for (int k = 0; k < K; k++)
    for (int r = N - 1; r >= 0; r--) {
      bt_fill(send[r][k], 32, r, k);
      assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(b[r], send[r][k], recv[r][k], 32,
                                                           &req[r * K + k]));
      ncfsm_boot_req_on_done(req[r * K + k], on_done, &per[r * K + k]);
      assert_int_equal(NCFSM_ERR_AGAIN, ncfsm_boot_test(req[r * K + k])); /* never inside post */
    }
  bt_wait_all(base, req, N * K);
  event_base_loop(base, EVLOOP_NONBLOCK); /* deliver the last callbacks */
  assert_int_equal(N * K, done_calls);
  for (int i = 0; i < N * K; i++) {
    assert_int_equal(1, per[i]);
    assert_int_equal(NCFSM_OK, ncfsm_boot_test(req[i]));
    ncfsm_boot_req_free(req[i]);
  }
  for (int r = 0; r < N; r++)
    for (int k = 0; k < K; k++) bt_check(recv[r][k], 32, N, k);
  /* close is refused while a request is live */
  ncfsm_boot_req *live;
  assert_int_equal(NCFSM_OK, ncfsm_boot_barrier_post(b[0], &live));
  assert_int_equal(NCFSM_ERR_BUSY, ncfsm_boot_close(b[0]));
  ncfsm_boot_req_free(live); /* cancels: b[0] is now out of step */
  ncfsm_boot_req *after;
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_barrier_post(b[0], &after));
  assert_non_null(strstr(ncfsm_boot_last_error(b[0]), "freed before it finished"));
  for (int r = 0; r < N; r++) assert_int_equal(NCFSM_OK, ncfsm_boot_close(b[r]));
  event_base_free(base);
}

static void test_join_errors_and_timeout(void **state) {
  (void)state;
  struct event_base *base = bt_base();
  ncfsm_boot_opts o;
  ncfsm_boot_opts_init(&o);
  o.kind = NCFSM_BOOT_LOCAL;
  o.local_group = "errs";
  o.rank = 0;
  o.size = 2;
  o.timeout_ms = 200;
  ncfsm_boot *b0, *bad;
  assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, &o, &b0));
  assert_int_not_equal(NCFSM_OK, ncfsm_boot_open(base, &o, &bad)); /* rank 0 again */
  assert_null(bad);
  assert_non_null(strstr(ncfsm_boot_open_error(), "already joined"));
  o.size = 3;
  o.rank = 1;
  assert_int_not_equal(NCFSM_OK, ncfsm_boot_open(base, &o, &bad)); /* size mismatch */
  assert_non_null(strstr(ncfsm_boot_open_error(), "has size 2"));
  o.rank = 5;
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_open(base, &o, &bad));
  /* rank 1 never joins: the allgather times out with a message naming why */
  int x = 7, all[2];
  double t0 = bt_now();
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_allgather(b0, &x, all, sizeof x));
  double dt = bt_now() - t0;
  assert_true(dt >= 0.15 && dt < 5.0);
  assert_non_null(strstr(ncfsm_boot_last_error(b0), "1 of 2 ranks joined"));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b0));
  event_base_free(base);
}

static void test_auto_picks_local(void **state) {
  (void)state;
  unsetenv("PMIX_RANK");
  unsetenv("NCFSM_STORE_ADDR");
  unsetenv("NCFSM_BOOTSTRAP");
  struct event_base *base = bt_base();
  ncfsm_boot_opts o;
  ncfsm_boot_opts_init(&o);
  o.local_group = "auto1";
  ncfsm_boot *b;
  assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, &o, &b));
  assert_int_equal(NCFSM_BOOT_LOCAL, ncfsm_boot_kind(b));
  assert_int_equal(1, ncfsm_boot_size(b));
  int x = 42, y = 0;
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather(b, &x, &y, sizeof x));
  assert_int_equal(42, y);
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b));
  event_base_free(base);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      BT_TEST(test_four_threads),
      BT_TEST(test_same_thread),
      BT_TEST(test_join_errors_and_timeout),
      BT_TEST(test_auto_picks_local),
  };
  return cmocka_run_group_tests_name("bootstrap_local", tests, NULL, NULL);
}
