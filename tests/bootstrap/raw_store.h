/* Bootstrap tests of the tcp store: a store on a thread of its own, clients
 * through the API, and raw connections that speak the wire format by hand. */
#ifndef NCFSM_TESTS_RAW_STORE_H
#define NCFSM_TESTS_RAW_STORE_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#include "tests/bootstrap/boot_test.h"
#include "bootstrap/frame.h"
#include "bootstrap/tcp-internal.h"

#define TOKEN "test-token-0123456789abcdef"

/* ---- a store on its own thread ------------------------------------------- */

typedef struct store_thread {
  struct event_base *base;
  ncfsm__store *s;
  pthread_t th;
  int port;
  ncfsm__store_stats st; /* after stop */
} store_thread;

static inline void *store_main(void *p) {
  store_thread *t = p;
  event_base_loop(t->base, EVLOOP_NO_EXIT_ON_EMPTY);
  return NULL;
}

/* The store's options for the tests: 127.0.0.1, a free port, TOKEN. */
static inline void store_test_opts(ncfsm__store_opts *o) {
  ncfsm__store_opts_init(o);
  o->listen = "127.0.0.1:0";
  o->token = TOKEN;
}

/* A store with options o on a thread of its own. */
static inline void store_start_opts(store_thread *t, const ncfsm__store_opts *o) {
  memset(t, 0, sizeof *t);
  t->base = bt_base();
  char err[256];
  assert_int_equal(0, ncfsm__store_open(t->base, o, &t->s, err, sizeof err));
  t->port = ncfsm__store_port(t->s);
  assert_true(t->port > 0);
  assert_int_equal(0, pthread_create(&t->th, NULL, store_main, t));
}

static inline void store_start_secrets(store_thread *t, uint64_t auth_timeout_ms, int rank_secrets) {
  ncfsm__store_opts o;
  store_test_opts(&o);
  if (auth_timeout_ms) o.auth_timeout_ms = auth_timeout_ms;
  o.rank_secrets = rank_secrets;
  store_start_opts(t, &o);
}

/* A store with options o in a child process (forked: call it before threads of the test
 * hold locks); its pid, and its port in *port. */
static inline pid_t store_fork(const ncfsm__store_opts *o, int *port) {
  int pfd[2];
  assert_int_equal(0, pipe(pfd));
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(pfd[0]);
    struct event_base *cb = event_base_new();
    ncfsm__store *s;
    char err[256];
    if (ncfsm__store_open(cb, o, &s, err, sizeof err) != 0) _exit(1);
    int p = ncfsm__store_port(s);
    if (write(pfd[1], &p, sizeof p) != sizeof p) _exit(1);
    event_base_loop(cb, EVLOOP_NO_EXIT_ON_EMPTY);
    _exit(0);
  }
  close(pfd[1]);
  *port = 0;
  assert_int_equal(sizeof *port, read(pfd[0], port, sizeof *port));
  close(pfd[0]);
  return pid;
}

static inline void store_start(store_thread *t, uint64_t auth_timeout_ms) {
  store_start_secrets(t, auth_timeout_ms, 0);
}

static inline void store_stop(store_thread *t) {
  event_base_loopexit(t->base, NULL);
  pthread_join(t->th, NULL);
  ncfsm__store_stats_get(t->s, &t->st);
  ncfsm__store_close(t->s);
  event_base_free(t->base);
}

static inline ncfsm_boot *open_tcp(struct event_base *base, int port, int rank, int size,
                                   const char *token, uint64_t timeout_ms) {
  return bt_open_tcp(base, port, rank, size, token, NULL, timeout_ms);
}

/* Post round k on every boot in bs, wait, check. */
static inline void round_all(struct event_base *base, ncfsm_boot **bs, int n, int size, size_t len, int k) {
  unsigned char *send = malloc((size_t)n * len + 1), *recv = malloc((size_t)n * size * len + 1);
  ncfsm_boot_req **req = calloc((size_t)n, sizeof *req);
  for (int i = 0; i < n; i++) {
    int r = ncfsm_boot_rank(bs[i]);
    bt_fill(send + (size_t)i * len, len, r, k);
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(bs[i], send + (size_t)i * len,
                                                         recv + (size_t)i * size * len, len, &req[i]));
  }
  bt_wait_all(base, req, n);
  for (int i = 0; i < n; i++) {
    if (ncfsm_boot_test(req[i]) != NCFSM_OK) fail_msg("rank %d: %s", i, ncfsm_boot_last_error(bs[i]));
    bt_check(recv + (size_t)i * size * len, len, size, k);
    ncfsm_boot_req_free(req[i]);
  }
  free(req);
  free(send);
  free(recv);
}

/* ---- raw connections ------------------------------------------------------ */

static inline int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(0, connect(fd, (struct sockaddr *)&sa, sizeof sa));
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static inline void raw_send(int fd, const void *p, size_t n) {
  assert_int_equal((ssize_t)n, send(fd, p, n, MSG_NOSIGNAL));
}

static inline void raw_frame(int fd, uint8_t type, uint32_t id, const char *key, const void *val, uint32_t vlen) {
  uint8_t hdr[NCFSM__FRAME_HDR];
  ncfsm__frame_header(hdr, type, id, (uint32_t)strlen(key), vlen);
  raw_send(fd, hdr, sizeof hdr);
  if (*key) raw_send(fd, key, strlen(key));
  if (vlen) raw_send(fd, val, vlen);
}

static inline void read_full(int fd, void *p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, (char *)p + got, n - got, 0);
    if (r <= 0) fail_msg("short read: %zd (%s)", r, strerror(errno));
    got += (size_t)r;
  }
}

/* Read one reply; returns its type, copies up to cap bytes of value. */
static inline uint8_t raw_reply(int fd, uint32_t *id, char *val, size_t cap, uint32_t *vlen) {
  uint8_t hdr[NCFSM__FRAME_HDR];
  read_full(fd, hdr, sizeof hdr);
  assert_int_equal(NCFSM__FRAME_MAGIC, ncfsm__rd32(hdr));
  *id = ncfsm__rd32(hdr + 8);
  assert_int_equal(0, ncfsm__rd32(hdr + 12));
  *vlen = ncfsm__rd32(hdr + 16);
  assert_true(*vlen < cap);
  read_full(fd, val, *vlen);
  val[*vlen] = 0;
  return hdr[5];
}

static inline void raw_hello(int fd, const char *token) {
  uint8_t v[8] = {0};
  raw_frame(fd, NCFSM__F_HELLO, 0, token, v, 8);
  uint32_t id, vlen;
  char buf[256];
  assert_int_equal(NCFSM__F_OK, raw_reply(fd, &id, buf, sizeof buf, &vlen));
}

/* The server must close fd (after at most an ERR frame) within 5 s. */
static inline void expect_closed(int fd, const char *why_sub) {
  char buf[4096];
  size_t got = 0;
  for (;;) {
    ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
    if (r == 0) break;
    if (r < 0) {
      if (errno == ECONNRESET) break;
      fail_msg("server did not close the connection: %s", strerror(errno));
    }
    got += (size_t)r;
    assert_true(got < sizeof buf - 1);
  }
  buf[got] = 0;
  if (why_sub) {
    assert_true(got >= NCFSM__FRAME_HDR);
    assert_int_equal(NCFSM__F_ERR, (uint8_t)buf[5]);
    if (!strstr(buf + NCFSM__FRAME_HDR, why_sub))
      fail_msg("ERR '%s' does not mention '%s'", buf + NCFSM__FRAME_HDR, why_sub);
  }
  close(fd);
}

static inline uint8_t raw_hello_rank(int fd, uint32_t rank, uint32_t size, char *msg, size_t cap) {
  uint8_t v[8];
  ncfsm__wr32(v, rank);
  ncfsm__wr32(v + 4, size);
  raw_frame(fd, NCFSM__F_HELLO, 0, TOKEN, v, 8);
  uint32_t id, vlen;
  return raw_reply(fd, &id, msg, cap, &vlen);
}

static inline void raw_gather(int fd, uint32_t id, const char *key, uint32_t rank, uint32_t size) {
  uint8_t v[12];
  ncfsm__wr32(v, rank);
  ncfsm__wr32(v + 4, size);
  memcpy(v + 8, "abcd", 4);
  raw_frame(fd, NCFSM__F_GATHER, id, key, v, sizeof v);
}

#endif
