/* tcp bootstrap: the store server and its client, on 127.0.0.1 only. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "tests/bootstrap/boot_test.h"
#include "tests/bootstrap/raw_store.h"
#include "bootstrap/frame.h"
#include "bootstrap/secret.h"
#include "bootstrap/tcp-internal.h"

/* ---- many clients --------------------------------------------------------- */

static void test_many_clients_one_thread(void **state) {
  (void)state;
  enum { N = 128 };
  struct event_base *base = bt_base();
  ncfsm_boot *bs[N];
  ncfsm_boot_opts o;
  ncfsm_boot_opts_init(&o);
  o.kind = NCFSM_BOOT_TCP;
  o.store_addr = "127.0.0.1:0"; /* rank 0 hosts on a free port */
  o.token = TOKEN;
  o.rank = 0;
  o.size = N;
  o.host_store = 1;
  assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, &o, &bs[0]));
  int port = ncfsm__boot_tcp_hosted_port(bs[0]);
  assert_true(port > 0);
  for (int r = 1; r < N; r++) bs[r] = open_tcp(base, port, r, N, TOKEN, 20000);
  for (int k = 0; k < 3; k++) round_all(base, bs, N, N, 24 + (size_t)k, k);
  round_all(base, bs, N, N, 0, 3); /* barrier */
  for (int r = N - 1; r >= 0; r--) assert_int_equal(NCFSM_OK, ncfsm_boot_close(bs[r]));
  event_base_free(base);
}

/* ---- broadcast (issue 14) --------------------------------------------------- */

/* The suite among 8 clients of a store thread; every broadcast is dropped by the store once
 * served; one 256 KiB value sent to 63 receivers is held once, not per receiver. */
static void test_bcast(void **state) {
  (void)state;
  enum { N = 8, M = 64 };
  store_thread st;
  store_start(&st, 0);
  struct event_base *base = bt_base();
  ncfsm_boot *bs[M];
  for (int r = 0; r < N; r++) bs[r] = open_tcp(base, st.port, r, N, TOKEN, 20000);
  bt_bcast_suite(base, bs, N, 1);
  for (int r = N - 1; r >= 0; r--) assert_int_equal(NCFSM_OK, ncfsm_boot_close(bs[r]));
  store_stop(&st);
  assert_int_equal(5 + 1 + 3, (int)st.st.bcasts_done); /* 5 rounds, the crossed one, 3 roots */
  assert_int_equal(0, (int)st.st.gathers_failed);

  store_start(&st, 0);
  for (int r = 0; r < M; r++) bs[r] = open_tcp(base, st.port, r, M, TOKEN, 20000);
  size_t len = 256 << 10;
  unsigned char *buf = malloc((size_t)M * len);
  ncfsm_boot_req *q[M];
  for (int r = M - 1; r >= 0; r--) { /* the receivers first: they park */
    if (r == 0) bt_fill(buf, len, 0, 7);
    assert_int_equal(NCFSM_OK, ncfsm_boot_bcast_post(bs[r], buf + (size_t)r * len, len, 0, &q[r]));
  }
  bt_wait_all(base, q, M);
  for (int r = 0; r < M; r++) {
    if (ncfsm_boot_test(q[r]) != NCFSM_OK) fail_msg("rank %d: %s", r, ncfsm_boot_last_error(bs[r]));
    assert_memory_equal(buf + (size_t)r * len, buf, len);
    ncfsm_boot_req_free(q[r]);
  }
  for (int r = M - 1; r >= 0; r--) assert_int_equal(NCFSM_OK, ncfsm_boot_close(bs[r]));
  store_stop(&st);
  free(buf);
  fprintf(stderr, "bcast of %zu bytes to %d receivers: store peak %llu bytes held, %llu queued\n",
          len, M - 1, (unsigned long long)st.st.peak_bytes, (unsigned long long)st.st.peak_out);
  assert_true(st.st.peak_bytes < 2 * len); /* copies would be 63 x 256 KiB */
  assert_int_equal(1, (int)st.st.bcasts_done);
  event_base_free(base);
}

/* A root that leaves before posting fails the receivers by name; a broadcast posted with
 * another length fails for every rank that posted it, naming both. */
static void test_bcast_errors(void **state) {
  (void)state;
  store_thread st;
  store_start(&st, 0);
  struct event_base *base = bt_base();
  ncfsm_boot *bs[3];
  for (int r = 0; r < 3; r++) bs[r] = open_tcp(base, st.port, r, 3, TOKEN, 20000);
  int v[3] = {0, 0, 0};
  ncfsm_boot_req *q[3] = {NULL, NULL, NULL};
  assert_int_equal(NCFSM_OK, ncfsm_boot_barrier_post(bs[0], &q[0])); /* everyone connected */
  assert_int_equal(NCFSM_OK, ncfsm_boot_barrier_post(bs[1], &q[1]));
  assert_int_equal(NCFSM_OK, ncfsm_boot_barrier_post(bs[2], &q[2]));
  bt_wait_all(base, q, 3);
  for (int r = 0; r < 3; r++) ncfsm_boot_req_free(q[r]);
  /* length mismatch: rank 1 posts 4 bytes, rank 2 8 bytes, root 0 posts nothing yet */
  double big[1];
  assert_int_equal(NCFSM_OK, ncfsm_boot_bcast_post(bs[1], &v[1], sizeof v[1], 0, &q[1]));
  assert_int_equal(NCFSM_ERR_AGAIN, bt_wait(base, q[1], 0.2)); /* parked */
  assert_int_equal(NCFSM_OK, ncfsm_boot_bcast_post(bs[2], big, sizeof big, 0, &q[2]));
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, bt_wait(base, q[2], 5));
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, bt_wait(base, q[1], 5));
  assert_non_null(strstr(ncfsm_boot_last_error(bs[2]), "posted it with root 0 and 8 bytes"));
  assert_non_null(strstr(ncfsm_boot_last_error(bs[1]), "posted it with root 0 and 8 bytes"));
  ncfsm_boot_req_free(q[1]);
  ncfsm_boot_req_free(q[2]);
  /* root gone: rank 2 closes its bootstrap; ranks 0 and 1 wait on a broadcast from rank 2 */
  ncfsm_boot *c[2];
  store_stop(&st);
  for (int r = 0; r < 3; r++) ncfsm_boot_close(bs[r]);
  store_start(&st, 0);
  for (int r = 0; r < 2; r++) c[r] = open_tcp(base, st.port, r, 3, TOKEN, 20000);
  ncfsm_boot *root = open_tcp(base, st.port, 2, 3, TOKEN, 20000);
  assert_int_equal(NCFSM_OK, ncfsm_boot_bcast_post(c[0], &v[0], sizeof v[0], 2, &q[0]));
  assert_int_equal(NCFSM_OK, ncfsm_boot_bcast_post(c[1], &v[1], sizeof v[1], 2, &q[1]));
  bt_spin(base, 0.2); /* all three connected, the two parked */
  assert_int_equal(NCFSM_ERR_AGAIN, ncfsm_boot_test(q[0]));
  double t0 = bt_now();
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(root));
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, bt_wait(base, q[0], 5));
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, bt_wait(base, q[1], 5));
  assert_true(bt_now() - t0 < 2.0);
  assert_non_null(strstr(ncfsm_boot_last_error(c[0]), "its root, rank 2"));
  assert_non_null(strstr(ncfsm_boot_last_error(c[0]), "disconnected before posting it"));
  for (int r = 0; r < 2; r++) {
    ncfsm_boot_req_free(q[r]);
    ncfsm_boot_close(c[r]);
  }
  /* misuse */
  c[0] = open_tcp(base, st.port, 0, 3, TOKEN, 20000);
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_bcast_post(c[0], v, 4, 3, &q[0]));
  assert_null(q[0]);
  assert_non_null(strstr(ncfsm_boot_last_error(c[0]), "root 3 is not a rank"));
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_bcast_roots_post(c[0], v, 4, 4, &q[0]));
  assert_int_equal(-1, ncfsm_boot_root_of(3, 0, 0));
  assert_int_equal(-1, ncfsm_boot_root_of(3, 2, 2));
  assert_int_equal(1, ncfsm_boot_root_of(3, 2, 1));
  assert_int_equal(6, ncfsm_boot_root_of(8, 4, 3));
  ncfsm_boot_close(c[0]);
  store_stop(&st);
  event_base_free(base);
}

typedef struct thr_arg {
  int port, first, count, size, ok;
} thr_arg;

static void *client_thread(void *p) {
  thr_arg *a = p;
  struct event_base *base = event_base_new();
  ncfsm_boot **bs = calloc((size_t)a->count, sizeof *bs);
  for (int i = 0; i < a->count; i++) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", a->port);
    ncfsm_boot_opts o;
    ncfsm_boot_opts_init(&o);
    o.kind = NCFSM_BOOT_TCP;
    o.store_addr = addr;
    o.token = TOKEN;
    o.rank = a->first + i;
    o.size = a->size;
    o.timeout_ms = 20000;
    if (ncfsm_boot_open(base, &o, &bs[i]) != NCFSM_OK) return NULL;
  }
  int good = 1;
  for (int k = 0; k < 5 && good; k++) {
    size_t len = 40;
    unsigned char send[64][40], *recv = malloc((size_t)a->count * a->size * len);
    ncfsm_boot_req *req[64];
    for (int i = 0; i < a->count; i++) {
      bt_fill(send[i], len, a->first + i, k);
      if (ncfsm_boot_allgather_post(bs[i], send[i], recv + (size_t)i * a->size * len, len, &req[i]))
        good = 0;
    }
    bt_wait_all(base, req, a->count);
    for (int i = 0; i < a->count; i++) {
      if (ncfsm_boot_test(req[i]) != NCFSM_OK) good = 0;
      for (int r = 0; r < a->size && good; r++) {
        unsigned char want[40];
        bt_fill(want, len, r, k);
        if (memcmp(recv + ((size_t)i * a->size + r) * len, want, len)) good = 0;
      }
      ncfsm_boot_req_free(req[i]);
    }
    free(recv);
  }
  for (int i = 0; i < a->count; i++) ncfsm_boot_close(bs[i]);
  free(bs);
  event_base_free(base);
  a->ok = good;
  return NULL;
}

static void test_many_clients_threads(void **state) {
  (void)state;
  store_thread st;
  store_start(&st, 0);
  enum { T = 4, PER = 16 };
  pthread_t th[T];
  thr_arg a[T];
  for (int i = 0; i < T; i++) {
    a[i] = (thr_arg){st.port, i * PER, PER, T * PER, 0};
    assert_int_equal(0, pthread_create(&th[i], NULL, client_thread, &a[i]));
  }
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    assert_true(a[i].ok);
  }
  store_stop(&st);
  assert_int_equal(T * PER, st.st.authenticated);
  assert_int_equal(0, st.st.closed_bad_frame);
}

/* ---- authentication --------------------------------------------------------- */

static void test_wrong_token(void **state) {
  (void)state;
  store_thread st;
  store_start(&st, 0);
  struct event_base *base = bt_base();
  ncfsm_boot *b = open_tcp(base, st.port, 0, 1, "not-the-token", 5000);
  int x = 1, y;
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_allgather(b, &x, &y, sizeof x));
  const char *e = ncfsm_boot_last_error(b);
  assert_non_null(strstr(e, "rejected"));
  assert_non_null(strstr(e, "bad token"));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b));
  /* the right token still works */
  b = open_tcp(base, st.port, 0, 1, TOKEN, 5000);
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather(b, &x, &y, sizeof x));
  assert_int_equal(1, y);
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b));
  event_base_free(base);
  store_stop(&st);
  assert_int_equal(1, st.st.rejected_token);
}

static void test_missing_token_rejected_at_open(void **state) {
  (void)state;
  struct event_base *base = bt_base();
  ncfsm_boot_opts o;
  ncfsm_boot_opts_init(&o);
  o.kind = NCFSM_BOOT_TCP;
  o.store_addr = "127.0.0.1:1";
  o.token = NULL;
  ncfsm_boot *b;
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_open(base, &o, &b));
  assert_non_null(strstr(ncfsm_boot_open_error(), "NCFSM_STORE_TOKEN"));
  /* a store refuses a non-loopback address unless told otherwise */
  ncfsm__store_opts so;
  ncfsm__store_opts_init(&so);
  so.listen = "0.0.0.0:0";
  so.token = TOKEN;
  ncfsm__store *s;
  char err[256];
  assert_int_equal(-1, ncfsm__store_open(base, &so, &s, err, sizeof err));
  assert_non_null(strstr(err, "loopback"));
  event_base_free(base);
}

static void test_bad_frames_close_only_that_connection(void **state) {
  (void)state;
  store_thread st;
  store_start(&st, 300);
  struct event_base *base = bt_base();
  ncfsm_boot *good[2] = {open_tcp(base, st.port, 0, 2, TOKEN, 10000),
                         open_tcp(base, st.port, 1, 2, TOKEN, 10000)};
  round_all(base, good, 2, 2, 16, 0);
  /* rank 0 posts round 1 now and waits through all the abuse below */
  unsigned char s0[16], r0[32], s1[16], r1[32];
  bt_fill(s0, 16, 0, 1);
  bt_fill(s1, 16, 1, 1);
  ncfsm_boot_req *req[2];
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(good[0], s0, r0, 16, &req[0]));
  event_base_loop(base, EVLOOP_NONBLOCK);

  int fd;
  uint8_t hdr[NCFSM__FRAME_HDR];
  int bad = 0;
  /* garbage */
  fd = raw_connect(st.port);
  raw_send(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
  expect_closed(fd, "magic"), bad++;
  /* a request before HELLO */
  fd = raw_connect(st.port);
  raw_frame(fd, NCFSM__F_GET, 1, "ag/0", NULL, 0);
  expect_closed(fd, "not HELLO"), bad++;
  /* oversized value (2 MiB declared), after a valid HELLO */
  fd = raw_connect(st.port);
  raw_hello(fd, TOKEN);
  ncfsm__frame_header(hdr, NCFSM__F_SET, 5, 1, 2u << 20);
  raw_send(fd, hdr, sizeof hdr);
  expect_closed(fd, "value longer"), bad++;
  /* oversized key */
  fd = raw_connect(st.port);
  raw_hello(fd, TOKEN);
  ncfsm__frame_header(hdr, NCFSM__F_GET, 5, 100000, 0);
  raw_send(fd, hdr, sizeof hdr);
  expect_closed(fd, "key longer"), bad++;
  /* unknown type */
  fd = raw_connect(st.port);
  raw_hello(fd, TOKEN);
  ncfsm__frame_header(hdr, 0x7f, 5, 1, 0);
  raw_send(fd, hdr, sizeof hdr);
  expect_closed(fd, "unknown frame type"), bad++;
  /* bad shape: GATHER rank >= size */
  fd = raw_connect(st.port);
  raw_hello(fd, TOKEN);
  {
    uint8_t v[8];
    ncfsm__wr32(v, 9);
    ncfsm__wr32(v + 4, 2);
    raw_frame(fd, NCFSM__F_GATHER, 5, "ag/1", v, 8);
  }
  expect_closed(fd, "rank not below size"), bad++;
  /* truncated, then the peer closes its side */
  fd = raw_connect(st.port);
  raw_hello(fd, TOKEN);
  ncfsm__frame_header(hdr, NCFSM__F_SET, 5, 3, 100);
  raw_send(fd, hdr, sizeof hdr);
  raw_send(fd, "keyvalu", 7);
  shutdown(fd, SHUT_WR);
  expect_closed(fd, NULL), bad++;
  /* silent: no HELLO within the auth timeout (300 ms here) */
  double t0 = bt_now();
  fd = raw_connect(st.port);
  expect_closed(fd, NULL), bad++;
  assert_true(bt_now() - t0 < 3.0);

  /* a well-behaved raw client: GET parks until another connection SETs */
  int a = raw_connect(st.port), b = raw_connect(st.port);
  raw_hello(a, TOKEN);
  raw_hello(b, TOKEN);
  raw_frame(a, NCFSM__F_GET, 41, "cfg/x", NULL, 0);
  raw_frame(a, NCFSM__F_WAIT, 42, "cfg/x", NULL, 0);
  usleep(50000);
  raw_frame(b, NCFSM__F_SET, 7, "cfg/x", "v1", 2);
  uint32_t id, vlen;
  char val[64];
  assert_int_equal(NCFSM__F_OK, raw_reply(b, &id, val, sizeof val, &vlen));
  assert_int_equal(7, id);
  int seen = 0;
  for (int i = 0; i < 2; i++) {
    assert_int_equal(NCFSM__F_OK, raw_reply(a, &id, val, sizeof val, &vlen));
    if (id == 41) {
      assert_string_equal("v1", val);
      seen |= 1;
    } else {
      assert_int_equal(42, id);
      assert_int_equal(0, vlen);
      seen |= 2;
    }
  }
  assert_int_equal(3, seen);
  uint8_t d[8];
  ncfsm__wr64(d, 5);
  raw_frame(b, NCFSM__F_ADD, 8, "ctr", d, 8);
  assert_int_equal(NCFSM__F_OK, raw_reply(b, &id, val, sizeof val, &vlen));
  assert_int_equal(5, (int)ncfsm__rd64((uint8_t *)val));
  raw_frame(a, NCFSM__F_ADD, 9, "ctr", d, 8);
  assert_int_equal(NCFSM__F_OK, raw_reply(a, &id, val, sizeof val, &vlen));
  assert_int_equal(10, (int)ncfsm__rd64((uint8_t *)val));
  /* a GET parked by a connection that then goes away is dropped cleanly */
  raw_frame(a, NCFSM__F_GET, 43, "never", NULL, 0);
  close(a);
  close(b);

  /* the good ranks were never disturbed */
  assert_int_equal(NCFSM_ERR_AGAIN, ncfsm_boot_test(req[0]));
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(good[1], s1, r1, 16, &req[1]));
  bt_wait_all(base, req, 2);
  assert_int_equal(NCFSM_OK, ncfsm_boot_test(req[0]));
  assert_int_equal(NCFSM_OK, ncfsm_boot_test(req[1]));
  bt_check(r0, 16, 2, 1);
  bt_check(r1, 16, 2, 1);
  ncfsm_boot_req_free(req[0]);
  ncfsm_boot_req_free(req[1]);
  ncfsm_boot_close(good[0]);
  ncfsm_boot_close(good[1]);
  event_base_free(base);
  store_stop(&st);
  assert_int_equal(bad, (int)st.st.closed_bad_frame);
}

/* ---- ranks: HELLO rank and size, GATHER identity --------------------------------- */

static void test_rank_rules(void **state) {
  (void)state;
  store_thread st;
  store_start(&st, 0);
  char msg[512];
  uint32_t id, vlen;
  /* a rank not below its size */
  int fd = raw_connect(st.port);
  assert_int_equal(NCFSM__F_ERR, raw_hello_rank(fd, 3, 2, msg, sizeof msg));
  assert_non_null(strstr(msg, "not below its size"));
  close(fd);
  /* rank 0 of 2 fixes the job's size; rank 1 of 3 is refused naming both */
  int r0 = raw_connect(st.port);
  assert_int_equal(NCFSM__F_OK, raw_hello_rank(r0, 0, 2, msg, sizeof msg));
  fd = raw_connect(st.port);
  assert_int_equal(NCFSM__F_ERR, raw_hello_rank(fd, 1, 3, msg, sizeof msg));
  assert_non_null(strstr(msg, "says the job has 3 ranks, the store's job has 2"));
  close(fd);
  /* a connection without a rank may not GATHER (refused, not closed) */
  int anon = raw_connect(st.port);
  raw_hello(anon, TOKEN);
  raw_gather(anon, 7, "ag/0", 0, 2);
  assert_int_equal(NCFSM__F_ERR, raw_reply(anon, &id, msg, sizeof msg, &vlen));
  assert_int_equal(7, id);
  assert_non_null(strstr(msg, "needs a ranked connection"));
  /* a GATHER for another rank closes the connection of rank 0 ... */
  raw_gather(r0, 8, "ag/0", 1, 2);
  expect_closed(r0, "GATHER as rank 1 on the connection of rank 0");
  /* ... and rank 0 is gone: rank 1's allgathers fail at once, naming it */
  int r1 = raw_connect(st.port);
  assert_int_equal(NCFSM__F_OK, raw_hello_rank(r1, 1, 2, msg, sizeof msg));
  /* told at once that rank 0 was lost before it came (a LOST frame: u32 rank, why) */
  assert_int_equal(NCFSM__F_LOST, raw_reply(r1, &id, msg, sizeof msg, &vlen));
  assert_int_equal(0, id);
  assert_true(vlen > 4);
  assert_int_equal(0, ncfsm__rd32((const uint8_t *)msg));
  assert_non_null(strstr(msg + 4, "rank 0 ("));
  raw_gather(r1, 9, "ag/0", 1, 2);
  assert_int_equal(NCFSM__F_ERR, raw_reply(r1, &id, msg, sizeof msg, &vlen));
  assert_int_equal(9, id);
  assert_non_null(strstr(msg, "rank 0 ("));
  assert_non_null(strstr(msg, "disconnected"));
  /* and cannot come back (rejoin is off) */
  fd = raw_connect(st.port);
  assert_int_equal(NCFSM__F_ERR, raw_hello_rank(fd, 0, 2, msg, sizeof msg));
  assert_non_null(strstr(msg, "cannot rejoin"));
  close(fd);
  close(anon);
  close(r1);
  store_stop(&st);
  assert_true(st.st.ranks_gone >= 1); /* rank 0; rank 1 too if its close was seen before the stop */
  assert_int_equal(1, (int)st.st.rejoin_refused);
  assert_int_equal(0, (int)st.st.rank_conflicts);
}

/* ---- per-rank secrets ------------------------------------------------------------- */

static void hex32(const uint8_t *p, char *out) {
  for (int i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", p[i]);
}

static void test_sha256_vectors(void **state) {
  (void)state;
  uint8_t o[32];
  char h[65];
  uint8_t key[131];
  memset(key, 0x0b, 20); /* RFC 4231 test case 1 */
  assert_int_equal(0, ncfsm__hmac_sha256(key, 20, "Hi There", 8, o));
  hex32(o, h);
  assert_string_equal("b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", h);
  memset(key, 0xaa, sizeof key); /* test case 6: a key longer than a block */
  const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
  assert_int_equal(0, ncfsm__hmac_sha256(key, sizeof key, m6, strlen(m6), o));
  hex32(o, h);
  assert_string_equal("60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", h);
  /* the public helper (python: hmac.new(b"tok", b"ncfsm-rank-secret/v1 1/4", sha256)) */
  char s[65];
  assert_int_equal(NCFSM_OK, ncfsm_boot_rank_secret("tok", 1, 4, s));
  assert_string_equal("d3500bfc068aff31da829eacd6847900ae9a71ec8e73dfcf8ae7f22a18e0121a", s);
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_rank_secret("tok", 4, 4, s));
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_rank_secret("", 0, 4, s));
}

static ncfsm_boot *open_secret(struct event_base *base, int port, int rank, int size,
                               const char *token, const char *secret) {
  return bt_open_tcp(base, port, rank, size, token, secret, 5000);
}

static void test_rank_secrets(void **state) {
  (void)state;
  store_thread st;
  store_start_secrets(&st, 0, 1);
  struct event_base *base = bt_base();
  char s0[65], s1[65];
  ncfsm_boot_rank_secret(TOKEN, 0, 2, s0);
  ncfsm_boot_rank_secret(TOKEN, 1, 2, s1);
  int x = 1, y[2];
  /* rank 1 with rank 0's secret, and rank 1 with the job token: both refused */
  ncfsm_boot *bad = open_secret(base, st.port, 1, 2, NULL, s0);
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_allgather(bad, &x, y, sizeof x));
  assert_non_null(strstr(ncfsm_boot_last_error(bad), "did not carry that rank's"));
  ncfsm_boot_close(bad);
  bad = open_secret(base, st.port, 1, 2, TOKEN, NULL);
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_allgather(bad, &x, y, sizeof x));
  assert_non_null(strstr(ncfsm_boot_last_error(bad), "--print-rank-secret 1/2"));
  ncfsm_boot_close(bad);
  /* each rank with its own secret (and no token) */
  ncfsm_boot *bs[2] = {open_secret(base, st.port, 0, 2, NULL, s0),
                       open_secret(base, st.port, 1, 2, NULL, s1)};
  round_all(base, bs, 2, 2, 8, 0);
  /* a tool without a rank still uses the token */
  int fd = raw_connect(st.port);
  raw_hello(fd, TOKEN);
  close(fd);
  ncfsm_boot_close(bs[0]);
  ncfsm_boot_close(bs[1]);
  event_base_free(base);
  store_stop(&st);
  assert_int_equal(2, (int)st.st.rejected_token);
}

/* ---- failures --------------------------------------------------------------- */

static void kill_cb(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  kill(*(pid_t *)arg, SIGKILL);
}

static void test_server_killed_mid_wait(void **state) {
  (void)state;
  ncfsm__store_opts so;
  store_test_opts(&so);
  int port;
  pid_t pid = store_fork(&so, &port);
  struct event_base *base = bt_base();
  /* rank 0 of 2: rank 1 never comes, so the allgather waits on the store */
  ncfsm_boot *b = open_tcp(base, port, 0, 2, TOKEN, 5000);
  struct event *k = evtimer_new(base, kill_cb, &pid);
  struct timeval tv = {0, 300000};
  evtimer_add(k, &tv);
  int x = 3, y[2];
  double t0 = bt_now();
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_allgather(b, &x, y, sizeof x));
  double dt = bt_now() - t0;
  assert_true(dt < 5.0); /* the EOF, not the timeout */
  assert_non_null(strstr(ncfsm_boot_last_error(b), "closed the connection"));
  /* later posts fail at once with the same error */
  ncfsm_boot_req *r;
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_barrier_post(b, &r));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b));
  event_free(k);
  event_base_free(base);
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFSIGNALED(status));
}

static void test_unreachable_store_times_out(void **state) {
  (void)state;
  /* a port nobody listens on: bind one and close it */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(0, bind(fd, (struct sockaddr *)&sa, sizeof sa));
  socklen_t sl = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &sl);
  int port = ntohs(sa.sin_port);
  close(fd);
  struct event_base *base = bt_base();
  ncfsm_boot *b = open_tcp(base, port, 0, 2, TOKEN, 400);
  int x = 1, y[2];
  double t0 = bt_now();
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_allgather(b, &x, y, sizeof x));
  double dt = bt_now() - t0;
  assert_true(dt >= 0.3 && dt < 3.0);
  const char *e = ncfsm_boot_last_error(b);
  assert_non_null(strstr(e, "unreachable"));
  assert_non_null(strstr(e, "127.0.0.1:"));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b));
  event_base_free(base);
}

static void test_env_selects_tcp(void **state) {
  (void)state;
  unsetenv("PMIX_RANK");
  unsetenv("NCFSM_BOOTSTRAP");
  setenv("NCFSM_STORE_ADDR", "127.0.0.1:0", 1);
  setenv("NCFSM_STORE_TOKEN", TOKEN, 1);
  setenv("NCFSM_RANK", "0", 1);
  setenv("NCFSM_WORLD_SIZE", "1", 1);
  setenv("NCFSM_STORE_HOST", "1", 1);
  struct event_base *base = bt_base();
  ncfsm_boot *b;
  assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, NULL, &b));
  assert_int_equal(NCFSM_BOOT_TCP, ncfsm_boot_kind(b));
  assert_true(ncfsm__boot_tcp_hosted_port(b) > 0);
  char s[8] = "abcdefg", r[8];
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather(b, s, r, sizeof s));
  assert_string_equal("abcdefg", r);
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b));
  event_base_free(base);
  unsetenv("NCFSM_STORE_ADDR");
  unsetenv("NCFSM_STORE_HOST");
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      BT_TEST(test_server_killed_mid_wait), /* first: fork before any thread exists */
      BT_TEST(test_many_clients_one_thread),
      BT_TEST(test_many_clients_threads),
      BT_TEST(test_bcast),
      BT_TEST(test_bcast_errors),
      BT_TEST(test_wrong_token),
      BT_TEST(test_missing_token_rejected_at_open),
      BT_TEST(test_bad_frames_close_only_that_connection),
      BT_TEST(test_rank_rules),
      BT_TEST(test_sha256_vectors),
      BT_TEST(test_rank_secrets),
      BT_TEST(test_unreachable_store_times_out),
      BT_TEST(test_env_selects_tcp),
  };
  return cmocka_run_group_tests_name("bootstrap_tcp_store", tests, NULL, NULL);
}
