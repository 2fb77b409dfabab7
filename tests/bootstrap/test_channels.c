/*
 * Bootstrap channels and notices (issue 21) on the local and tcp bootstraps: the suite of
 * chan_suite.h (channels interleaved with the parent's collectives in both orders, two
 * channels at once, a member that opens late, a subset channel, notices to all but the
 * poster, misuse) on 4 ranks in one thread, in 4 threads (local) and against a store thread
 * (tcp); a lost member failing a channel request by name (local: a member that closes, or is
 * lost before it opened the channel; tcp: a rank process SIGKILLed, a member that closes); a
 * notice after a peer died; the store's bounds (a flood of channels refused past
 * --max-channels, a flood of notices past --notices-per-s); version-1 peers refused by name.
 *
 *   test_channels [latency]   latency: only the notice latencies (4 ranks), printed
 */
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "tests/bootstrap/chan_suite.h"
#include "tests/bootstrap/raw_store.h"

#define N 4

static void suite_all(struct event_base *base, ncfsm_boot **bs, int n) {
  cs_interleave(base, bs, n);
  cs_two_channels(base, bs, n);
  cs_late_open(base, bs, n);
  cs_subset(base, bs, n);
  double lat[CS_MAX];
  cs_notice_round(base, bs, n, 1, 0xabcdef, lat);
  /* a notice on a channel reaches its members only, origin in the channel's ranks */
  int size = ncfsm_boot_size(bs[0]), members[2] = {size - 1, 1};
  ncfsm_boot *ch[CS_MAX] = {0};
  for (int i = 0; i < n; i++) {
    int r = ncfsm_boot_rank(bs[i]);
    if (r == size - 1 || r == 1) ch[i] = cs_open(bs[i], "cs.notice", members, 2);
  }
  cs_notice_round(base, ch, n, 1 /* channel rank 1: parent rank 1 */, 0x5151, lat);
  cs_close_all(ch, n);
  for (int i = 0; i < n; i++) cs_misuse(bs[i]);
}

/* ---- local ---------------------------------------------------------------------------- */

static ncfsm_boot *open_local(struct event_base *base, const char *group, int rank, int size) {
  ncfsm_boot_opts o;
  ncfsm_boot_opts_init(&o);
  o.kind = NCFSM_BOOT_LOCAL;
  o.local_group = group;
  o.rank = rank;
  o.size = size;
  o.timeout_ms = 20000;
  ncfsm_boot *b = NULL;
  assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, &o, &b));
  return b;
}

static void test_local_one_thread(void **state) {
  (void)state;
  struct event_base *base = bt_base();
  ncfsm_boot *bs[N];
  for (int r = 0; r < N; r++) bs[r] = open_local(base, "chan1", r, N);
  suite_all(base, bs, N);
  double worst;
  cs_notice_latency(base, bs, N, 8, "local, 4 ranks on one thread", &worst);
  for (int r = 0; r < N; r++) assert_int_equal(NCFSM_OK, ncfsm_boot_close(bs[r]));
  event_base_free(base);
}

typedef struct th_arg {
  int rank, latency_only;
  const char *group;
  char fail[300];
} th_arg;

static void *local_member(void *p) {
  th_arg *a = p;
  struct event_base *base = event_base_new();
  ncfsm_boot *b = open_local(base, a->group, a->rank, N);
  if (!a->latency_only) suite_all(base, &b, 1);
  double worst;
  cs_notice_latency(base, &b, 1, 16, "local, 4 threads", &worst);
  if (ncfsm_boot_close(b) != NCFSM_OK) snprintf(a->fail, sizeof a->fail, "close");
  event_base_free(base);
  return NULL;
}

static void run_local_threads(const char *group, int latency_only) {
  event_base_free(bt_base()); /* evthread_use_pthreads */
  pthread_t th[N];
  th_arg a[N];
  for (int r = 0; r < N; r++) {
    a[r] = (th_arg){r, latency_only, group, ""};
    assert_int_equal(0, pthread_create(&th[r], NULL, local_member, &a[r]));
  }
  for (int r = 0; r < N; r++) {
    pthread_join(th[r], NULL);
    if (a[r].fail[0]) fail_msg("rank %d: %s", r, a[r].fail);
  }
}

static void test_local_threads(void **state) {
  (void)state;
  run_local_threads("chanth", 0);
}

/* A member that closes its channel fails the others' channel request by name; a member lost
 * through the parent (it closed its bootstrap) before it opened the channel does too, and both
 * are told to the channel's peer-lost callback in the channel's ranks. */
static unsigned lost_mask[N];     /* [handle]: the channel ranks it was told were lost */
static char lost_msg[N][N][700]; /* [handle][rank] */
static void on_lost(ncfsm_boot *b, int rank, const char *why, void *arg) {
  (void)b;
  int i = (int)(intptr_t)arg;
  if (rank < 0 || rank >= N) return;
  lost_mask[i] |= 1u << rank;
  snprintf(lost_msg[i][rank], sizeof lost_msg[i][rank], "%s", why);
}

/* A parent closed with an idle channel open (a process that ends without closing its
 * channels, or a program that closes its bootstrap before the communicators verifying over
 * it): the channel closes with it; its members see it leave; its handle fails every call,
 * naming why, until its owner closes it. */
static void test_local_orphan(void **state) {
  (void)state;
  struct event_base *base = bt_base();
  ncfsm_boot *bs[2], *ch[2];
  for (int r = 0; r < 2; r++) bs[r] = open_local(base, "chanorphan", r, 2);
  for (int r = 0; r < 2; r++) ch[r] = cs_open(bs[r], "cs.orphan", NULL, 0);
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(bs[1]));
  int v = 7, out[2];
  ncfsm_boot_req *q = NULL;
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_allgather_post(ch[1], &v, out, sizeof v, &q));
  if (!strstr(ncfsm_boot_last_error(ch[1]), "its parent bootstrap was closed"))
    fail_msg("%s", ncfsm_boot_last_error(ch[1]));
  ncfsm_boot_notice nt = {.key = 1};
  assert_int_not_equal(NCFSM_OK, ncfsm_boot_notice_post(ch[1], &nt));
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(ch[0], &v, out, sizeof v, &q));
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, bt_wait(base, q, 5)); /* rank 1 left the channel */
  if (!strstr(ncfsm_boot_last_error(ch[0]), "rank 1 closed")) fail_msg("%s", ncfsm_boot_last_error(ch[0]));
  ncfsm_boot_req_free(q);
  for (int r = 0; r < 2; r++) assert_int_equal(NCFSM_OK, ncfsm_boot_close(ch[r]));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(bs[0]));
  event_base_free(base);
}

static void test_local_lost_member(void **state) {
  (void)state;
  struct event_base *base = bt_base();
  ncfsm_boot *bs[N], *ch[N];
  for (int r = 0; r < N; r++) bs[r] = open_local(base, "chanlost", r, N);
  int members[3] = {3, 1, 0}; /* rank 2 is not a member */
  ncfsm_boot_req *q[N] = {0};
  int v[N], out[N][3];
  for (int i = 0; i < 3; i++) {
    int r = members[i];
    ch[r] = cs_open(bs[r], "cs.lost", members, 3);
    lost_mask[r] = 0;
    assert_int_equal(NCFSM_OK, ncfsm_boot_on_peer_lost(ch[r], on_lost, (void *)(intptr_t)r));
  }
  for (int r = 0; r < 2; r++) { /* ranks 0 and 1 post; channel rank 0 (parent 3) closes */
    v[r] = r;
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(ch[r], &v[r], out[r], sizeof v[r], &q[r]));
  }
  bt_spin(base, 0.02);
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(ch[3]));
  for (int r = 0; r < 2; r++) {
    assert_int_equal(NCFSM_ERR_BOOTSTRAP, bt_wait(base, q[r], 5));
    const char *e = ncfsm_boot_last_error(ch[r]);
    if (!strstr(e, "rank 0 closed")) fail_msg("rank %d: %s", r, e);
    ncfsm_boot_req_free(q[r]);
    bt_spin(base, 0.01);
    assert_true(lost_mask[r] & 1u);
    assert_non_null(strstr(lost_msg[r][0], "closed channel 'cs.lost'"));
    assert_int_equal(NCFSM_OK, ncfsm_boot_close(ch[r]));
  }
  /* rank 3 closes its bootstrap before it opened "cs.lost2": ranks 0 and 1 fail, naming it */
  int m2[3] = {0, 1, 3};
  for (int r = 0; r < 2; r++) {
    ch[r] = cs_open(bs[r], "cs.lost2", m2, 3);
    lost_mask[r] = 0;
    assert_int_equal(NCFSM_OK, ncfsm_boot_on_peer_lost(ch[r], on_lost, (void *)(intptr_t)r));
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(ch[r], &v[r], out[r], sizeof v[r], &q[r]));
  }
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(bs[3]));
  for (int r = 0; r < 2; r++) {
    assert_int_equal(NCFSM_ERR_BOOTSTRAP, bt_wait(base, q[r], 5));
    const char *e = ncfsm_boot_last_error(ch[r]);
    if (!strstr(e, "rank 2 was lost before it opened the channel") || !strstr(e, "rank 3 closed"))
      fail_msg("rank %d: %s", r, e);
    ncfsm_boot_req_free(q[r]);
    bt_spin(base, 0.01);
    assert_true(lost_mask[r] & 4u);
    assert_non_null(strstr(lost_msg[r][2], "rank 2 of channel 'cs.lost2' is rank 3 of its parent"));
    assert_int_equal(NCFSM_OK, ncfsm_boot_close(ch[r]));
  }
  /* a notice after the peer died: the poster is unharmed, the live ranks hear it */
  cs_heard h[3];
  memset(h, 0, sizeof h);
  for (int r = 0; r < 3; r++) assert_int_equal(NCFSM_OK, ncfsm_boot_on_notice(bs[r], cs_on_notice, &h[r]));
  ncfsm_boot_notice nt = {.key = 0xdead, .what = "after the death"};
  assert_int_equal(NCFSM_OK, ncfsm_boot_notice_post(bs[0], &nt));
  int want[3] = {0, 1, 1};
  cs_wait_heard(base, h, want, 3, 5);
  assert_int_equal(0, h[0].count);
  assert_int_equal(1, h[1].count);
  assert_int_equal(1, h[2].count);
  assert_true(h[2].key == 0xdead && h[2].origin == 0);
  assert_int_equal(NCFSM_OK, ncfsm_boot_notice_post(bs[0], &nt)); /* still works */
  /* a channel opened with other members than the first opener's fails, naming both lists */
  int ma[2] = {0, 1}, mb[2] = {1, 0};
  ncfsm_boot *c0 = cs_open(bs[0], "cs.mismatch", ma, 2), *c1 = NULL;
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_channel_open(bs[1], "cs.mismatch", mb, 2, &c1));
  assert_non_null(strstr(ncfsm_boot_last_error(bs[1]), "is open with the members [0, 1]"));
  assert_non_null(strstr(ncfsm_boot_last_error(bs[1]), "opened it with [1, 0]"));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(c0));
  for (int r = 0; r < 3; r++) assert_int_equal(NCFSM_OK, ncfsm_boot_close(bs[r]));
  event_base_free(base);
}

/* ---- tcp, one process ---------------------------------------------------------------- */

static void test_tcp_suite(void **state) {
  (void)state;
  store_thread st;
  store_start(&st, 0);
  struct event_base *base = bt_base();
  ncfsm_boot *bs[N];
  for (int r = 0; r < N; r++) bs[r] = open_tcp(base, st.port, r, N, TOKEN, 20000);
  suite_all(base, bs, N);
  /* a member that closes its channel: the others' request fails by name, they are told */
  ncfsm_boot *ch[N];
  ncfsm_boot_req *q[N] = {0};
  int v[N], out[N][N];
  for (int r = 0; r < N; r++) {
    ch[r] = cs_open(bs[r], "cs.close", NULL, 0);
    lost_mask[r] = 0;
    assert_int_equal(NCFSM_OK, ncfsm_boot_on_peer_lost(ch[r], on_lost, (void *)(intptr_t)r));
  }
  for (int r = 0; r < N - 1; r++) {
    v[r] = r;
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(ch[r], &v[r], out[r], sizeof v[r], &q[r]));
  }
  bt_spin(base, 0.02);
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(ch[N - 1]));
  for (int r = 0; r < N - 1; r++) {
    assert_int_equal(NCFSM_ERR_BOOTSTRAP, bt_wait(base, q[r], 5));
    const char *e = ncfsm_boot_last_error(ch[r]);
    if (!strstr(e, "job rank 3") || !strstr(e, "rank 3 of channel 'cs.close'") ||
        !strstr(e, "closed the channel before contributing"))
      fail_msg("rank %d: %s", r, e);
    ncfsm_boot_req_free(q[r]);
    bt_spin(base, 0.01);
    assert_true(lost_mask[r] & 8u);
    assert_non_null(strstr(lost_msg[r][3], "closed the channel"));
    /* later collectives fail at once, by name */
    assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_allgather(ch[r], &v[r], out[r], sizeof v[r]));
  }
  for (int r = 0; r < N - 1; r++) assert_int_equal(NCFSM_OK, ncfsm_boot_close(ch[r]));
  /* members that differ from the first opener's: the channel fails naming both lists */
  int ma[2] = {0, 1}, mb[2] = {1, 0};
  ncfsm_boot *c0 = cs_open(bs[0], "cs.mismatch", ma, 2), *c1;
  ncfsm_boot_req *bq[N]; /* rank 0's CHAN is at the store before rank 1's */
  for (int r = 0; r < N; r++) assert_int_equal(NCFSM_OK, ncfsm_boot_barrier_post(bs[r], &bq[r]));
  cs_wait_ok(base, bq, bs, N, "barrier");
  c1 = cs_open(bs[1], "cs.mismatch", mb, 2);
  int x = 1, y[2];
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_allgather(c1, &x, y, sizeof x));
  assert_non_null(strstr(ncfsm_boot_last_error(c1), "is open with the members (job ranks) [0, 1]"));
  assert_non_null(strstr(ncfsm_boot_last_error(c1), "opened it with [1, 0]"));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(c1));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(c0));
  for (int r = N - 1; r >= 0; r--) assert_int_equal(NCFSM_OK, ncfsm_boot_close(bs[r]));
  bt_spin(base, 0.2); /* the closes go out; the store sees the connections end */
  store_stop(&st);
  assert_int_equal(0, st.st.chans_held); /* every channel freed once its members left it */
  assert_true(st.st.chans_opened >= 4 * N);
  assert_int_equal(0, (int)st.st.notices_dropped);
  event_base_free(base);
}

/* The store's bounds: a rank may hold max_channels channels (a channel counts until every
 * member closed it); past it CHAN is refused by name; a connection's notices past
 * notices_per_s are dropped and counted. */
static void test_tcp_limits(void **state) {
  (void)state;
  ncfsm__store_opts so;
  store_test_opts(&so);
  so.max_channels = 8;
  so.notices_per_s = 50;
  store_thread st;
  store_start_opts(&st, &so);
  struct event_base *base = bt_base();
  ncfsm_boot *bs[2];
  for (int r = 0; r < 2; r++) bs[r] = open_tcp(base, st.port, r, 2, TOKEN, 20000);
  ncfsm_boot *ch[9];
  int me = 0, other = 1, x = 0, y[2];
  char tag[32];
  for (int k = 0; k < 9; k++) { /* channels of {0, 1} that rank 1 never opens */
    snprintf(tag, sizeof tag, "flood.%d", k);
    int m[2] = {me, other};
    ch[k] = cs_open(bs[0], tag, m, 2);
  }
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_allgather(ch[8], &x, y, sizeof x));
  const char *e = ncfsm_boot_last_error(ch[8]);
  if (!strstr(e, "holds 8 channels, the store's limit") || !strstr(e, "--max-channels"))
    fail_msg("the 9th channel: %s", e);
  /* closed by rank 0 only, they still count (rank 1 may open them): still refused */
  for (int k = 0; k < 9; k++) assert_int_equal(NCFSM_OK, ncfsm_boot_close(ch[k]));
  ncfsm_boot *c = cs_open(bs[0], "flood.again", NULL, 0);
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_allgather(c, &x, y, sizeof x));
  assert_non_null(strstr(ncfsm_boot_last_error(c), "holds 8 channels"));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(c));
  /* rank 1 opens and closes them: freed, and rank 0 may open channels again */
  for (int k = 0; k < 8; k++) {
    snprintf(tag, sizeof tag, "flood.%d", k);
    int m[2] = {me, other};
    assert_int_equal(NCFSM_OK, ncfsm_boot_close(cs_open(bs[1], tag, m, 2)));
  }
  ncfsm_boot *cc[2];
  ncfsm_boot_req *q[2];
  for (int r = 0; r < 2; r++) /* the store has seen rank 1's closes before rank 0 opens again */
    assert_int_equal(NCFSM_OK, ncfsm_boot_barrier_post(bs[r], &q[r]));
  cs_wait_ok(base, q, bs, 2, "barrier");
  int v[2] = {0, 1}, o[2][2];
  for (int r = 0; r < 2; r++) {
    cc[r] = cs_open(bs[r], "flood.ok", NULL, 0);
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(cc[r], &v[r], o[r], sizeof v[r], &q[r]));
  }
  cs_wait_ok(base, q, cc, 2, "a channel after the flood was closed");
  cs_close_all(cc, 2);
  /* 500 notices at once: about the burst of 50 get through, the rest are dropped */
  cs_heard h;
  memset(&h, 0, sizeof h);
  assert_int_equal(NCFSM_OK, ncfsm_boot_on_notice(bs[1], cs_on_notice, &h));
  ncfsm_boot_notice nt;
  memset(&nt, 0, sizeof nt);
  for (int k = 0; k < 500; k++) assert_int_equal(NCFSM_OK, ncfsm_boot_notice_post(bs[0], &nt));
  bt_spin(base, 0.3);
  fprintf(stderr, "500 notices with notices_per_s 50: %d delivered\n", h.count);
  assert_true(h.count >= 50 && h.count < 100);
  for (int r = 1; r >= 0; r--) assert_int_equal(NCFSM_OK, ncfsm_boot_close(bs[r]));
  bt_spin(base, 0.2);
  store_stop(&st);
  assert_true(st.st.notices_dropped >= 400);
  assert_true(st.st.chans_refused >= 2);
  assert_int_equal(0, st.st.chans_held);
  event_base_free(base);
}

/* A version-1 client is refused in a version-1 ERR frame naming both versions; a rank whose
 * store answers in version 1 fails naming it. */
static void *old_store_main(void *p) {
  int lfd = *(int *)p, fd = accept(lfd, NULL, NULL);
  uint8_t buf[600];
  if (fd < 0 || recv(fd, buf, sizeof buf, 0) <= 0) return NULL;
  const char *msg = "unsupported protocol version";
  uint8_t hdr[NCFSM__FRAME_HDR];
  ncfsm__frame_header_v(hdr, 1, NCFSM__F_ERR, 0, 0, (uint32_t)strlen(msg));
  send(fd, hdr, sizeof hdr, MSG_NOSIGNAL);
  send(fd, msg, strlen(msg), MSG_NOSIGNAL);
  usleep(200000);
  close(fd);
  return NULL;
}

static void test_wire_versions(void **state) {
  (void)state;
  store_thread st;
  store_start(&st, 0);
  int fd = raw_connect(st.port);
  /* One send: the store refuses on the header alone and closes, so a frame sent in pieces
   * could meet the closed socket (EPIPE) before its last piece. */
  uint8_t hello[NCFSM__FRAME_HDR + 64 + 8] = {0};
  size_t tl = strlen(TOKEN);
  assert_true(tl <= 64);
  ncfsm__frame_header_v(hello, 1, NCFSM__F_HELLO, 0, (uint32_t)tl, 8);
  memcpy(hello + NCFSM__FRAME_HDR, TOKEN, tl);
  raw_send(fd, hello, NCFSM__FRAME_HDR + tl + 8);
  uint8_t got[NCFSM__FRAME_HDR + 400];
  read_full(fd, got, NCFSM__FRAME_HDR);
  assert_int_equal(1, got[4]); /* a frame the old client can read */
  assert_int_equal(NCFSM__F_ERR, got[5]);
  uint32_t vl = ncfsm__rd32(got + 16);
  assert_true(vl < 400);
  read_full(fd, got + NCFSM__FRAME_HDR, vl);
  got[NCFSM__FRAME_HDR + vl] = 0;
  assert_non_null(strstr((char *)got + NCFSM__FRAME_HDR, "wire version 1: this store speaks"));
  close(fd);
  store_stop(&st);
  assert_int_equal(1, (int)st.st.old_clients);
  /* an old store */
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(0, bind(lfd, (struct sockaddr *)&sa, sizeof sa));
  socklen_t sl = sizeof sa;
  getsockname(lfd, (struct sockaddr *)&sa, &sl);
  listen(lfd, 4);
  pthread_t th;
  assert_int_equal(0, pthread_create(&th, NULL, old_store_main, &lfd));
  struct event_base *base = bt_base();
  setenv("NCFSM_STORE_HEARTBEAT", "0", 1);
  ncfsm_boot *b = open_tcp(base, ntohs(sa.sin_port), 0, 1, TOKEN, 5000);
  unsetenv("NCFSM_STORE_HEARTBEAT");
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_allgather(b, NULL, NULL, 0));
  const char *e = ncfsm_boot_last_error(b);
  if (!strstr(e, "speaks the store's wire version 1, this rank version 2") ||
      !strstr(e, "it said: unsupported protocol version"))
    fail_msg("%s", e);
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b));
  pthread_join(th, NULL);
  close(lfd);
  event_base_free(base);
}

/* ---- tcp, one process per rank --------------------------------------------------------- */

/* Rank processes against a store process: the suite with one rank per process, the notice
 * latencies, and rank 3 SIGKILLed while the others wait on a channel allgather (they fail
 * naming it and their channel's peer-lost callback is told), after which a notice of rank 0
 * reaches ranks 1 and 2. Each child reports "ok" or "FAIL ..." on its pipe. */
static int port_g;
static void rank_proc(int r, int wfd, int latency_only) {
  struct event_base *base = bt_base();
  ncfsm_boot *b = open_tcp(base, port_g, r, N, TOKEN, 20000);
  char line[900] = "ok\n";
  if (!latency_only) suite_all(base, &b, 1);
  double worst;
  cs_notice_latency(base, &b, 1, 16, "tcp, 4 rank processes and a store process (forked, as ncfsm-store runs it)", &worst);
  if (!latency_only) {
    ncfsm_boot *ch = cs_open(b, "cs.kill", NULL, 0);
    lost_mask[0] = 0;
    assert_int_equal(NCFSM_OK, ncfsm_boot_on_peer_lost(ch, on_lost, (void *)(intptr_t)0));
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather(b, NULL, NULL, 0));
    if (r == N - 1) {
      ssize_t w = write(wfd, "ready\n", 6);
      (void)w;
      for (;;) pause(); /* SIGKILLed by the parent */
    }
    int v = r, out[N];
    ncfsm_boot_req *q;
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(ch, &v, out, sizeof v, &q));
    ncfsm_result_t st = bt_wait(base, q, 10);
    const char *e = ncfsm_boot_last_error(ch);
    bt_spin(base, 0.02);
    if (st != NCFSM_ERR_BOOTSTRAP || !strstr(e, "rank 3") || !strstr(e, "disconnected") ||
        !strstr(e, "rank 3 of channel 'cs.kill'"))
      snprintf(line, sizeof line, "FAIL rank %d: channel allgather %s: %s\n", r, ncfsm_err_name(st), e);
    else if (!(lost_mask[0] & 8u) ||
             !strstr(lost_msg[0][3], "rank 3 of channel 'cs.kill' is rank 3 of its parent"))
      snprintf(line, sizeof line, "FAIL rank %d: lost 0x%x: %s\n", r, lost_mask[0], lost_msg[0][3]);
    ncfsm_boot_req_free(q);
    ncfsm_boot_close(ch);
    /* the poster is unharmed by the dead peer; the live ranks hear it */
    ncfsm_boot_on_peer_lost(b, NULL, NULL);
    cs_heard h;
    memset(&h, 0, sizeof h);
    ncfsm_boot_on_notice(b, cs_on_notice, &h);
    if (r == 0) {
      ncfsm_boot_notice nt = {.key = 77, .what = "after the death"};
      if (ncfsm_boot_notice_post(b, &nt) != NCFSM_OK)
        snprintf(line, sizeof line, "FAIL rank 0: notice_post: %s\n", ncfsm_boot_last_error(b));
      bt_spin(base, 0.3);
      if (ncfsm_boot_notice_post(b, &nt) != NCFSM_OK) /* and again: it still works */
        snprintf(line, sizeof line, "FAIL rank 0: second notice_post: %s\n", ncfsm_boot_last_error(b));
    } else {
      int want = 1;
      cs_wait_heard(base, &h, &want, 1, 5);
      if (h.count < 1 || h.key != 77 || h.origin != 0)
        snprintf(line, sizeof line, "FAIL rank %d: heard %d notices after the death\n", r, h.count);
    }
  }
  ssize_t w = write(wfd, line, strlen(line));
  (void)w;
  _exit(0); /* no close: rank 0's leaving would be a loss for the others still reading */
}

static void run_procs(int latency_only) {
  ncfsm__store_opts so;
  store_test_opts(&so);
  pid_t store = store_fork(&so, &port_g);
  int p[N][2];
  pid_t pid[N];
  for (int r = 0; r < N; r++) {
    assert_int_equal(0, pipe(p[r]));
    if ((pid[r] = fork()) == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(p[r][0]);
      alarm(60);
      rank_proc(r, p[r][1], latency_only);
    }
    close(p[r][1]);
  }
  if (!latency_only) { /* kill rank 3 once it is past the barrier (the others then wait) */
    char ready[16] = "";
    ssize_t got = read(p[N - 1][0], ready, sizeof ready - 1);
    if (got <= 0 || strncmp(ready, "ready", 5)) fprintf(stderr, "rank 3 did not get ready\n");
    usleep(50000);
    kill(pid[N - 1], SIGKILL);
  }
  char msgs[N][900];
  int bad = 0;
  for (int r = 0; r < N; r++) {
    ssize_t got = read(p[r][0], msgs[r], sizeof msgs[r] - 1);
    msgs[r][got > 0 ? got : 0] = 0;
    close(p[r][0]);
    waitpid(pid[r], NULL, 0);
    if (r == N - 1 && !latency_only) continue;
    if (strncmp(msgs[r], "ok", 2)) bad = 1;
  }
  kill(store, SIGKILL);
  waitpid(store, NULL, 0);
  for (int r = 0; bad && r < N; r++) fprintf(stderr, "rank %d: %s", r, msgs[r]);
  assert_false(bad);
}

static void test_tcp_processes(void **state) {
  (void)state;
  run_procs(0);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "latency")) {
    run_procs(1);
    run_local_threads("chanlat", 1);
    return 0;
  }
  const struct CMUnitTest tests[] = {
      BT_TEST(test_tcp_processes), /* first: it forks, before this process has threads */
      BT_TEST(test_local_one_thread),
      BT_TEST(test_local_threads),
      BT_TEST(test_local_orphan),
      BT_TEST(test_local_lost_member),
      BT_TEST(test_tcp_suite),
      BT_TEST(test_tcp_limits),
      BT_TEST(test_wire_versions),
  };
  return cmocka_run_group_tests_name("bootstrap_channels", tests, NULL, NULL);
}
