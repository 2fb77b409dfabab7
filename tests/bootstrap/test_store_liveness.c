/* tcp store: who decides the job's size (issue 24, item 4), on 127.0.0.1. */
#include <poll.h>
#include <signal.h>

#include "tests/bootstrap/raw_store.h"

/* A HELLO sent and not waited for (the store may hold it). */
static void raw_hello_send(int fd, uint32_t rank, uint32_t size) {
  uint8_t v[8];
  ncfsm__wr32(v, rank);
  ncfsm__wr32(v + 4, size);
  raw_frame(fd, NCFSM__F_HELLO, 0, TOKEN, v, 8);
}

/* A token holder says HELLO first as rank 5 of 1000: the job of 2 ranks that
 * comes after it (rank 1 before rank 0) must run, and the claim is refused
 * once rank 0's HELLO gave the size. Before the fix, the first HELLO fixed
 * the size and every real rank was refused. */
static void test_first_hello_does_not_fix_the_size(void **state) {
  (void)state;
  store_thread st;
  store_start(&st, 0);
  int imp = raw_connect(st.port);
  raw_hello_send(imp, 5, 1000);
  usleep(100000);
  struct event_base *base = bt_base();
  ncfsm_boot *bs[2];
  bs[1] = open_tcp(base, st.port, 1, 2, TOKEN, 10000);
  for (int i = 0; i < 20; i++) event_base_loop(base, EVLOOP_NONBLOCK); /* rank 1's HELLO waits */
  bs[0] = open_tcp(base, st.port, 0, 2, TOKEN, 10000);
  round_all(base, bs, 2, 2, 16, 0);
  expect_closed(imp, "HELLO of rank 5 says the job has 1000 ranks, the store's job has 2 (rank 0's HELLO");
  ncfsm_boot_close(bs[0]);
  ncfsm_boot_close(bs[1]);
  event_base_free(base);
  store_stop(&st);
  assert_true(st.st.hellos_held >= 2);
  assert_int_equal(0, (int)st.st.rank_conflicts);
}

/* The claim's connection went away before the job came: nothing of it is left. */
static void test_claim_gone_leaves_nothing(void **state) {
  (void)state;
  store_thread st;
  store_start(&st, 0);
  int imp = raw_connect(st.port);
  raw_hello_send(imp, 5, 1000);
  usleep(100000);
  close(imp);
  usleep(100000);
  struct event_base *base = bt_base();
  ncfsm_boot *bs[2] = {open_tcp(base, st.port, 0, 2, TOKEN, 10000),
                       open_tcp(base, st.port, 1, 2, TOKEN, 10000)};
  round_all(base, bs, 2, 2, 8, 0);
  ncfsm_boot_close(bs[0]);
  ncfsm_boot_close(bs[1]);
  event_base_free(base);
  store_stop(&st);
  assert_int_equal(0, (int)st.st.rank_conflicts);
}

/* A held connection must wait for the HELLO's answer before it sends requests. */
static void test_request_before_hello_answer(void **state) {
  (void)state;
  store_thread st;
  store_start(&st, 0);
  int fd = raw_connect(st.port);
  raw_hello_send(fd, 1, 2);
  raw_frame(fd, NCFSM__F_GET, 1, "k", NULL, 0);
  expect_closed(fd, "a request before the store answered the HELLO");
  store_stop(&st);
}

/* A store that knows the size from the start (rank 0 hosts it, or --world-size) refuses
 * another size at once, rank 0 included, naming who set it. */
static void test_size_known_at_start(void **state) {
  (void)state;
  struct event_base *base = bt_base();
  ncfsm_boot_opts o;
  ncfsm_boot_opts_init(&o);
  o.kind = NCFSM_BOOT_TCP;
  o.store_addr = "127.0.0.1:0";
  o.token = TOKEN;
  o.rank = 0;
  o.size = 2;
  o.host_store = 1;
  o.timeout_ms = 10000;
  ncfsm_boot *b0;
  assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, &o, &b0));
  int port = ncfsm__boot_tcp_hosted_port(b0);
  char msg[512];
  int fd = raw_connect(port);
  raw_hello_send(fd, 5, 1000);
  for (struct pollfd pf = {fd, POLLIN, 0}; poll(&pf, 1, 0) == 0;) { /* the store runs on base */
    event_base_loop(base, EVLOOP_NONBLOCK);
    usleep(1000);
  }
  uint32_t id, vlen;
  assert_int_equal(NCFSM__F_ERR, raw_reply(fd, &id, msg, sizeof msg, &vlen));
  assert_non_null(strstr(msg, "the store's job has 2 (rank 0, which hosts the store"));
  close(fd);
  ncfsm_boot *b1 = open_tcp(base, port, 1, 2, TOKEN, 10000);
  ncfsm_boot *bs[2] = {b0, b1};
  round_all(base, bs, 2, 2, 4, 0);
  ncfsm_boot_close(b1);
  ncfsm_boot_close(b0);
  event_base_free(base);

  store_thread st;
  memset(&st, 0, sizeof st);
  st.base = bt_base();
  ncfsm__store_opts so;
  ncfsm__store_opts_init(&so);
  so.listen = "127.0.0.1:0";
  so.token = TOKEN;
  so.world_size = 3;
  char err[256];
  assert_int_equal(0, ncfsm__store_open(st.base, &so, &st.s, err, sizeof err));
  st.port = ncfsm__store_port(st.s);
  assert_int_equal(0, pthread_create(&st.th, NULL, store_main, &st));
  fd = raw_connect(st.port);
  assert_int_equal(NCFSM__F_ERR, raw_hello_rank(fd, 0, 1000, msg, sizeof msg));
  assert_non_null(strstr(msg, "says the job has 1000 ranks, the store's job has 3 (the store's --world-size"));
  close(fd);
  fd = raw_connect(st.port);
  assert_int_equal(NCFSM__F_OK, raw_hello_rank(fd, 2, 3, msg, sizeof msg)); /* no wait for rank 0 */
  close(fd);
  store_stop(&st);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      BT_TEST(test_first_hello_does_not_fix_the_size),
      BT_TEST(test_claim_gone_leaves_nothing),
      BT_TEST(test_request_before_hello_answer),
      BT_TEST(test_size_known_at_start),
  };
  return cmocka_run_group_tests_name("bootstrap_store_liveness", tests, NULL, NULL);
}
