/* tcp store: who decides the job's size (issue 24, item 4), and heartbeats
 * (item 3): a stopped rank and a stopped store are found within the silence
 * limit, a rank that does not run its loop is not lost. On 127.0.0.1. */
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>

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
  ncfsm__store_opts so;
  store_test_opts(&so);
  so.world_size = 3;
  store_start_opts(&st, &so);
  fd = raw_connect(st.port);
  assert_int_equal(NCFSM__F_ERR, raw_hello_rank(fd, 0, 1000, msg, sizeof msg));
  assert_non_null(strstr(msg, "says the job has 1000 ranks, the store's job has 3 (the store's --world-size"));
  close(fd);
  fd = raw_connect(st.port);
  assert_int_equal(NCFSM__F_OK, raw_hello_rank(fd, 2, 3, msg, sizeof msg)); /* no wait for rank 0 */
  close(fd);
  store_stop(&st);
}

/* ---- heartbeats --------------------------------------------------------------------- */

enum { HB_MS = 100, SILENCE_MS = 400 };

static void hb_store_start(store_thread *t) {
  ncfsm__store_opts o;
  store_test_opts(&o);
  o.heartbeat_ms = HB_MS;
  o.silence_ms = SILENCE_MS;
  store_start_opts(t, &o);
}

static int lost_n;
static double lost_at;
static char lost_why[600];
static void on_lost(ncfsm_boot *b, int rank, const char *why, void *arg) {
  (void)b;
  (void)arg;
  lost_n++;
  lost_at = bt_now();
  snprintf(lost_why, sizeof lost_why, "rank %d: %s", rank, why);
}

static int failed_n;
static double failed_at;
static char failed_why[600];
static void on_failed(ncfsm_boot *b, ncfsm_result_t st, const char *why, void *arg) {
  (void)b;
  (void)arg;
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, st);
  failed_n++;
  failed_at = bt_now();
  snprintf(failed_why, sizeof failed_why, "%s", why);
}

static void run_for(struct event_base *base, double s) {
  struct timeval tv = {(time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6)};
  event_base_loopexit(base, &tv);
  event_base_loop(base, EVLOOP_NO_EXIT_ON_EMPTY);
}

/* A rank stopped with SIGSTOP (its heartbeat thread too) is lost within the silence
 * limit; rank 0 is told by name. */
static void test_stopped_rank_lost(void **state) {
  (void)state;
  /* both children before this process has a thread (TSan: no threads after such a fork) */
  ncfsm__store_opts so;
  store_test_opts(&so);
  so.heartbeat_ms = HB_MS;
  so.silence_ms = SILENCE_MS;
  int port;
  pid_t spid = store_fork(&so, &port);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) { /* rank 1: meets rank 0, then runs its loop until stopped and killed */
    struct event_base *cb = bt_base();
    ncfsm_boot *b = bt_open_tcp(cb, port, 1, 2, TOKEN, NULL, 10000);
    if (ncfsm_boot_allgather(b, NULL, NULL, 0) != NCFSM_OK) _exit(1);
    for (;;) event_base_loop(cb, EVLOOP_NO_EXIT_ON_EMPTY);
  }
  struct event_base *base = bt_base();
  ncfsm_boot *b0 = bt_open_tcp(base, port, 0, 2, TOKEN, NULL, 10000);
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather(b0, NULL, NULL, 0));
  lost_n = 0;
  assert_int_equal(NCFSM_OK, ncfsm_boot_on_peer_lost(b0, on_lost, NULL));
  run_for(base, 0.5); /* heartbeats keep an idle rank alive */
  assert_int_equal(0, lost_n);
  double t0 = bt_now();
  kill(pid, SIGSTOP);
  while (!lost_n && bt_now() - t0 < 5) run_for(base, 0.05);
  assert_int_equal(1, lost_n);
  double dt = lost_at - t0;
  assert_true(dt > 0.2 && dt < 2.0); /* silence 0.4 s; a margin for a loaded machine */
  if (!strstr(lost_why, "rank 1: rank 1 (127.0.0.1:") || !strstr(lost_why, "no heartbeat from rank 1 for 400 ms"))
    fail_msg("lost: %s", lost_why);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  ncfsm_boot_on_peer_lost(b0, NULL, NULL);
  ncfsm_boot_close(b0);
  event_base_free(base);
  kill(spid, SIGKILL);
  waitpid(spid, NULL, 0);
}

/* A rank whose loop does not run for longer than the silence limit (computing) is not lost:
 * its heartbeat thread speaks for it. */
static void test_busy_rank_not_lost(void **state) {
  (void)state;
  store_thread st;
  hb_store_start(&st);
  struct event_base *b0base = bt_base(), *b1base = bt_base();
  ncfsm_boot *bs[2] = {bt_open_tcp(b0base, st.port, 0, 2, TOKEN, NULL, 10000),
                       bt_open_tcp(b1base, st.port, 1, 2, TOKEN, NULL, 10000)};
  ncfsm_boot_req *r[2];
  assert_int_equal(NCFSM_OK, ncfsm_boot_barrier_post(bs[0], &r[0]));
  assert_int_equal(NCFSM_OK, ncfsm_boot_barrier_post(bs[1], &r[1]));
  while (ncfsm_boot_test(r[0]) == NCFSM_ERR_AGAIN || ncfsm_boot_test(r[1]) == NCFSM_ERR_AGAIN) {
    event_base_loop(b0base, EVLOOP_NONBLOCK);
    event_base_loop(b1base, EVLOOP_NONBLOCK);
  }
  ncfsm_boot_req_free(r[0]);
  ncfsm_boot_req_free(r[1]);
  lost_n = failed_n = 0;
  ncfsm_boot_on_peer_lost(bs[0], on_lost, NULL);
  ncfsm_boot_on_failed(bs[1], on_failed, NULL);
  run_for(b0base, 3 * SILENCE_MS / 1000.0); /* rank 1's base is not run meanwhile */
  event_base_loop(b1base, EVLOOP_NONBLOCK);
  assert_int_equal(0, lost_n);
  assert_int_equal(0, failed_n);
  ncfsm_boot_on_peer_lost(bs[0], NULL, NULL);
  ncfsm_boot_close(bs[0]);
  ncfsm_boot_close(bs[1]);
  event_base_free(b0base);
  event_base_free(b1base);
  store_stop(&st);
  assert_int_equal(0, (int)st.st.closed_silent);
}

/* A standalone store stopped with SIGSTOP: every rank's bootstrap fails within the silence
 * limit, naming the store, and ncfsm_boot_on_failed tells it. */
static void test_stopped_store_lost(void **state) {
  (void)state;
  ncfsm__store_opts so;
  store_test_opts(&so);
  so.heartbeat_ms = HB_MS;
  so.silence_ms = SILENCE_MS;
  int port;
  pid_t pid = store_fork(&so, &port);
  struct event_base *base = bt_base();
  ncfsm_boot *bs[2] = {bt_open_tcp(base, port, 0, 2, TOKEN, NULL, 10000),
                       bt_open_tcp(base, port, 1, 2, TOKEN, NULL, 10000)};
  round_all(base, bs, 2, 2, 8, 0);
  failed_n = 0;
  ncfsm_boot_on_failed(bs[0], on_failed, NULL);
  ncfsm_boot_on_failed(bs[1], on_failed, NULL);
  run_for(base, 0.5);
  assert_int_equal(0, failed_n);
  double t0 = bt_now();
  kill(pid, SIGSTOP);
  while (failed_n < 2 && bt_now() - t0 < 5) run_for(base, 0.05);
  assert_int_equal(2, failed_n);
  double dt = failed_at - t0;
  assert_true(dt > 0.2 && dt < 2.0);
  if (!strstr(failed_why, "silent for") || !strstr(failed_why, "store 127.0.0.1:"))
    fail_msg("failed: %s", failed_why);
  ncfsm_boot_req *r;
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_barrier_post(bs[0], &r)); /* sticky */
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  ncfsm_boot_close(bs[0]);
  ncfsm_boot_close(bs[1]);
  event_base_free(base);
}

/* A store played by hand: it answers rank 0's HELLO with heartbeats on, refuses the first
 * heartbeat connection with "throttled", takes the second and PINGs on it. */
typedef struct fake_store {
  int lfd, port;
  _Atomic int hb_conns; /* read by the test while the store's thread runs */
} fake_store;

static int fake_accept_hello(fake_store *fs, char *key, size_t cap) {
  int fd = accept(fs->lfd, NULL, NULL);
  uint8_t hdr[NCFSM__FRAME_HDR], v[12];
  read_full(fd, hdr, sizeof hdr);
  uint32_t kl = ncfsm__rd32(hdr + 12), vl = ncfsm__rd32(hdr + 16);
  assert_true(kl < cap && vl <= sizeof v);
  read_full(fd, key, kl);
  key[kl] = 0;
  read_full(fd, v, vl);
  return vl == 12 && ncfsm__rd32(v + 8) == NCFSM__HELLO_HEARTBEAT ? -fd - 1 : fd; /* < 0: a heartbeat */
}

static void fake_send(int fd, uint8_t type, const void *v, uint32_t vl) {
  uint8_t hdr[NCFSM__FRAME_HDR];
  ncfsm__frame_header(hdr, type, 0, 0, vl);
  raw_send(fd, hdr, sizeof hdr);
  if (vl) raw_send(fd, v, vl);
}

static void *fake_main(void *p) {
  fake_store *fs = p;
  char key[600];
  int main_fd = fake_accept_hello(fs, key, sizeof key);
  uint8_t ok[12];
  ncfsm__wr32(ok, HB_MS);
  ncfsm__wr32(ok + 4, SILENCE_MS);
  ncfsm__wr32(ok + 8, 1);
  fake_send(main_fd, NCFSM__F_OK, ok, sizeof ok);
  int hb = fake_accept_hello(fs, key, sizeof key);
  const char *thr = "throttled: 10 failed HELLOs from this address; retry in 150 ms (a wrong NCFSM_STORE_TOKEN on this host?)";
  fake_send(-hb - 1, NCFSM__F_ERR, thr, (uint32_t)strlen(thr));
  close(-hb - 1);
  fs->hb_conns = 1;
  hb = fake_accept_hello(fs, key, sizeof key);
  fs->hb_conns = 2;
  fake_send(-hb - 1, NCFSM__F_OK, NULL, 0);
  double t0 = bt_now();
  while (bt_now() - t0 < 1.5) { /* PINGs, as a live store */
    fake_send(-hb - 1, NCFSM__F_PING, NULL, 0);
    usleep(HB_MS * 1000);
  }
  close(-hb - 1);
  close(main_fd);
  return NULL;
}

/* A throttled heartbeat HELLO (failed HELLOs from this address) waits the pause the store
 * names and connects again; the rank is not failed meanwhile. */
static void test_heartbeat_throttled(void **state) {
  (void)state;
  fake_store fs = {0};
  fs.lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  assert_int_equal(0, bind(fs.lfd, (struct sockaddr *)&sa, sizeof sa));
  assert_int_equal(0, listen(fs.lfd, 4));
  getsockname(fs.lfd, (struct sockaddr *)&sa, &sl);
  fs.port = ntohs(sa.sin_port);
  pthread_t th;
  assert_int_equal(0, pthread_create(&th, NULL, fake_main, &fs));
  struct event_base *base = bt_base();
  ncfsm_boot *b = bt_open_tcp(base, fs.port, 0, 1, TOKEN, NULL, 10000);
  failed_n = 0;
  ncfsm_boot_on_failed(b, on_failed, NULL);
  run_for(base, 1.2); /* the refusal, the pause, the second heartbeat connection, PINGs */
  assert_int_equal(2, fs.hb_conns);
  assert_int_equal(0, failed_n);
  pthread_join(th, NULL);
  ncfsm_boot_close(b);
  event_base_free(base);
  close(fs.lfd);
}

/* The store's heartbeat settings are checked at open. */
static void test_heartbeat_settings(void **state) {
  (void)state;
  struct event_base *base = bt_base();
  ncfsm__store_opts o;
  ncfsm__store_opts_init(&o);
  o.listen = "127.0.0.1:0";
  o.token = TOKEN;
  o.heartbeat_ms = 1000;
  o.silence_ms = 1500;
  ncfsm__store *s;
  char err[256];
  assert_int_equal(-1, ncfsm__store_open(base, &o, &s, err, sizeof err));
  assert_non_null(strstr(err, "silence 1500 ms must be at least twice the heartbeat (1000 ms)"));
  event_base_free(base);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      BT_TEST(test_stopped_rank_lost), /* first: they fork, before this process has threads */
      BT_TEST(test_stopped_store_lost),
      BT_TEST(test_first_hello_does_not_fix_the_size),
      BT_TEST(test_claim_gone_leaves_nothing),
      BT_TEST(test_request_before_hello_answer),
      BT_TEST(test_size_known_at_start),
      BT_TEST(test_busy_rank_not_lost),
      BT_TEST(test_heartbeat_throttled),
      BT_TEST(test_heartbeat_settings),
  };
  return cmocka_run_group_tests_name("bootstrap_store_liveness", tests, NULL, NULL);
}
