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

/* Broadcasts among 4 members on one thread and among 3 threads; a root that closes before
 * posting fails the receivers by name; a group of one. */
typedef struct bc_thr {
  int rank, ok;
} bc_thr;

static void *bc_thread(void *p) {
  bc_thr *t = p;
  struct event_base *base = bt_base();
  ncfsm_boot_opts o;
  ncfsm_boot_opts_init(&o);
  o.kind = NCFSM_BOOT_LOCAL;
  o.local_group = "bcast-threads";
  o.rank = t->rank;
  o.size = 3;
  o.timeout_ms = 20000;
  ncfsm_boot *b;
  if (ncfsm_boot_open(base, &o, &b) != NCFSM_OK) return NULL;
  int v = t->rank == 1 ? 77 : 0;
  for (int k = 0; k < 50; k++) { /* root 1, many rounds: nodes are freed as they are taken */
    v = t->rank == 1 ? 77 + k : 0;
    if (ncfsm_boot_bcast(b, &v, sizeof v, 1) != NCFSM_OK || v != 77 + k) goto out;
  }
  t->ok = 1;
out:
  { /* all done before anyone closes */
    int x = 0, all[3];
    if (ncfsm_boot_allgather(b, &x, all, sizeof x) != NCFSM_OK) t->ok = 0;
  }
  ncfsm_boot_close(b);
  event_base_free(base);
  return NULL;
}

static void test_bcast(void **state) {
  (void)state;
  struct event_base *base = bt_base();
  enum { N = 4 };
  ncfsm_boot *b[N];
  ncfsm_boot_opts o;
  ncfsm_boot_opts_init(&o);
  o.kind = NCFSM_BOOT_LOCAL;
  o.local_group = "bcast";
  o.size = N;
  o.timeout_ms = 20000;
  for (int r = 0; r < N; r++) {
    o.rank = r;
    assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, &o, &b[r]));
  }
  bt_bcast_suite(base, b, N, 1);
  /* root 3 closes before posting: 0, 1, 2 fail naming it */
  int v[N] = {0};
  ncfsm_boot_req *q[N];
  for (int r = 0; r < 3; r++) assert_int_equal(NCFSM_OK, ncfsm_boot_bcast_post(b[r], &v[r], sizeof(int), 3, &q[r]));
  bt_spin(base, 0.05);
  assert_int_equal(NCFSM_ERR_AGAIN, ncfsm_boot_test(q[0]));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b[3]));
  for (int r = 0; r < 3; r++) {
    assert_int_equal(NCFSM_ERR_BOOTSTRAP, bt_wait(base, q[r], 5));
    assert_non_null(strstr(ncfsm_boot_last_error(b[r]), "its root, rank 3, closed its bootstrap"));
    ncfsm_boot_req_free(q[r]);
    assert_int_equal(NCFSM_OK, ncfsm_boot_close(b[r]));
  }
  /* a group of one */
  o.local_group = "bcast-one";
  o.rank = 0;
  o.size = 1;
  assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, &o, &b[0]));
  int one = 5;
  assert_int_equal(NCFSM_OK, ncfsm_boot_bcast(b[0], &one, sizeof one, 0));
  assert_int_equal(5, one);
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b[0]));
  event_base_free(base);
  /* three threads */
  pthread_t th[3];
  bc_thr t[3];
  for (int r = 0; r < 3; r++) {
    t[r] = (bc_thr){.rank = r};
    assert_int_equal(0, pthread_create(&th[r], NULL, bc_thread, &t[r]));
  }
  for (int r = 0; r < 3; r++) {
    pthread_join(th[r], NULL);
    assert_true(t[r].ok);
  }
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

/* ---- recovery: peer loss, agreement, survivors (threads; a member that closes is the "dead") */

typedef struct rec_member {
  int rank, size;
  const char *group;
  struct event_base *base;
  ncfsm_boot *b;
  _Atomic int lost_mask;        /* ranks reported lost */
  double lost_at[8];
  char lost_why[8][300];
  int ok;                       /* the scenario's checks passed */
  char err[600];                /* else what failed */
} rec_member;

typedef struct rec_shared {
  rec_member m[4];
  _Atomic int posted, failed, closed_at_ms;
  double t0;
} rec_shared;

static void rec_lost(ncfsm_boot *b, int rank, const char *why, void *arg) {
  rec_member *m = arg;
  (void)b;
  if (rank < 0 || rank >= 8) return;
  m->lost_at[rank] = bt_now();
  snprintf(m->lost_why[rank], sizeof m->lost_why[rank], "%s", why);
  atomic_fetch_or(&m->lost_mask, 1 << rank);
}

#define REC_CHECK(m, cond, ...)                                   \
  do {                                                            \
    if (!(cond)) {                                                \
      snprintf((m)->err, sizeof (m)->err, __VA_ARGS__);           \
      return;                                                     \
    }                                                             \
  } while (0)

static void rec_open(rec_member *m, uint64_t timeout_ms) {
  m->base = event_base_new();
  ncfsm_boot_opts o;
  ncfsm_boot_opts_init(&o);
  o.kind = NCFSM_BOOT_LOCAL;
  o.local_group = m->group;
  o.rank = m->rank;
  o.size = m->size;
  o.timeout_ms = timeout_ms;
  m->b = NULL;
  if (ncfsm_boot_open(m->base, &o, &m->b) == NCFSM_OK)
    ncfsm_boot_on_peer_lost(m->b, rec_lost, m);
}

/* Run the member's loop until the lost mask has all of want, or secs. */
static int rec_wait_lost(rec_member *m, int want, double secs) {
  double t0 = bt_now();
  while ((atomic_load(&m->lost_mask) & want) != want && bt_now() - t0 < secs) bt_spin(m->base, 0.01);
  return (atomic_load(&m->lost_mask) & want) == want;
}

/* Post an agreement and wait for it; the status, the result in alive/nalive. */
static ncfsm_result_t rec_agree(rec_member *m, ncfsm_boot *b, uint64_t epoch, uint8_t *alive,
                                int *nalive, ncfsm_boot_req **keep, double secs) {
  ncfsm_boot_req *req;
  ncfsm_result_t r = ncfsm_boot_agree_post(b, epoch, &req);
  if (r != NCFSM_OK) return r;
  r = bt_wait(m->base, req, secs);
  if (r == NCFSM_OK) ncfsm_boot_agree_result(req, alive, nalive);
  if (keep) *keep = req;
  else ncfsm_boot_req_free(req);
  return r;
}

/* On the survivors' bootstrap: its rank and size, and an allgather of 24 bytes. */
static void rec_child_round(rec_member *m, ncfsm_boot *c, int want_rank, int want_size, int k) {
  REC_CHECK(m, ncfsm_boot_rank(c) == want_rank && ncfsm_boot_size(c) == want_size,
            "rank %d: survivors' rank/size %d/%d, expected %d/%d", m->rank, ncfsm_boot_rank(c),
            ncfsm_boot_size(c), want_rank, want_size);
  unsigned char send[24], recv[24 * 8];
  bt_fill(send, 24, want_rank, k);
  ncfsm_boot_req *req;
  REC_CHECK(m, ncfsm_boot_allgather_post(c, send, recv, 24, &req) == NCFSM_OK, "rank %d: post: %s",
            m->rank, ncfsm_boot_last_error(c));
  ncfsm_result_t r = bt_wait(m->base, req, 10);
  ncfsm_boot_req_free(req);
  REC_CHECK(m, r == NCFSM_OK, "rank %d: survivors' allgather: %s", m->rank, ncfsm_boot_last_error(c));
  for (int q = 0; q < want_size; q++) {
    unsigned char want[24];
    bt_fill(want, 24, q, k);
    REC_CHECK(m, !memcmp(recv + q * 24, want, 24), "rank %d: survivors' allgather: slot %d wrong",
              m->rank, q);
  }
  m->ok = 1;
}

static void rec_barrier(rec_member *m) {
  ncfsm_boot_req *req;
  if (ncfsm_boot_barrier_post(m->b, &req) != NCFSM_OK) return;
  bt_wait(m->base, req, 10);
  ncfsm_boot_req_free(req);
}

/* Scenario 1: member 2 closes; the others are told, fail the allgather that
 * waited on it (named), agree on {0,1,3}, and run an allgather among them. */
static void rec1_body(rec_shared *sh, rec_member *m) {
  rec_barrier(m);
  if (m->rank == 2) {
    usleep(100000); /* the others' allgather #1 is posted */
    sh->t0 = bt_now();
    ncfsm_boot_close(m->b);
    m->b = NULL;
    m->ok = 1;
    return;
  }
  int x = m->rank, all[4];
  ncfsm_boot_req *ag;
  REC_CHECK(m, ncfsm_boot_allgather_post(m->b, &x, all, sizeof x, &ag) == NCFSM_OK, "post");
  REC_CHECK(m, rec_wait_lost(m, 1 << 2, 5), "rank %d: rank 2 not reported lost in 5 s", m->rank);
  REC_CHECK(m, strstr(m->lost_why[2], "rank 2 closed its bootstrap"), "why: %s", m->lost_why[2]);
  ncfsm_result_t r = bt_wait(m->base, ag, 5);
  ncfsm_boot_req_free(ag);
  REC_CHECK(m, r == NCFSM_ERR_BOOTSTRAP && strstr(ncfsm_boot_last_error(m->b), "rank 2 closed"),
            "rank %d: allgather with rank 2 gone: %s / %s", m->rank, ncfsm_strerror(r),
            ncfsm_boot_last_error(m->b));
  uint8_t alive[4];
  int nalive = 0;
  ncfsm_boot_req *agreed;
  r = rec_agree(m, m->b, 1, alive, &nalive, &agreed, 10);
  REC_CHECK(m, r == NCFSM_OK, "rank %d: agree: %s", m->rank, ncfsm_boot_last_error(m->b));
  REC_CHECK(m, nalive == 3 && alive[0] && alive[1] && !alive[2] && alive[3], "rank %d: agreed %d",
            m->rank, nalive);
  ncfsm_boot *c;
  REC_CHECK(m, ncfsm_boot_survivors(m->b, agreed, &c) == NCFSM_OK, "survivors: %s",
            ncfsm_boot_last_error(m->b));
  ncfsm_boot_req_free(agreed);
  rec_child_round(m, c, m->rank == 3 ? 2 : m->rank, 3, 0);
  ncfsm_boot_close(c);
}

/* Scenario 2: member 2 lives but does not post: the others fail after the
 * timeout naming it; then all four post epoch 2 and agree. */
static void rec2_body(rec_shared *sh, rec_member *m) {
  rec_barrier(m);
  uint8_t alive[4];
  int nalive = 0;
  if (m->rank != 2) {
    double t0 = bt_now();
    ncfsm_result_t r = rec_agree(m, m->b, 1, alive, &nalive, NULL, 10);
    double dt = bt_now() - t0;
    atomic_fetch_add(&sh->failed, 1);
    REC_CHECK(m, r == NCFSM_ERR_BOOTSTRAP, "rank %d: agreement without rank 2: %s", m->rank,
              ncfsm_strerror(r));
    const char *e = ncfsm_boot_last_error(m->b);
    REC_CHECK(m, strstr(e, "rank 2 did not post"), "rank %d: %s", m->rank, e);
    REC_CHECK(m, dt > 0.3 && dt < 5, "rank %d: failed after %.2f s", m->rank, dt);
  } else {
    while (atomic_load(&sh->failed) < 3) bt_spin(m->base, 0.01);
  }
  ncfsm_result_t r = rec_agree(m, m->b, 2, alive, &nalive, NULL, 10);
  REC_CHECK(m, r == NCFSM_OK && nalive == 4, "rank %d: retry with epoch 2: %s (%d)", m->rank,
            ncfsm_boot_last_error(m->b), nalive);
  m->ok = 1;
}

/* Scenario 3: member 3 closes; 0 and 1 agree while member 2 closes during the
 * agreement: the result is {0,1}; a nested agreement on their bootstrap and
 * its survivors' allgather. */
static void rec3_body(rec_shared *sh, rec_member *m) {
  rec_barrier(m);
  if (m->rank == 3) {
    ncfsm_boot_close(m->b);
    m->b = NULL;
    m->ok = 1;
    return;
  }
  REC_CHECK(m, rec_wait_lost(m, 1 << 3, 5), "rank %d: rank 3 not reported lost", m->rank);
  if (m->rank == 2) {
    while (atomic_load(&sh->posted) < 2) bt_spin(m->base, 0.01);
    usleep(50000);
    ncfsm_boot_close(m->b);
    m->b = NULL;
    m->ok = 1;
    return;
  }
  ncfsm_boot_req *req;
  REC_CHECK(m, ncfsm_boot_agree_post(m->b, 7, &req) == NCFSM_OK, "post");
  atomic_fetch_add(&sh->posted, 1);
  ncfsm_result_t r = bt_wait(m->base, req, 10);
  uint8_t alive[4];
  int nalive = 0;
  REC_CHECK(m, r == NCFSM_OK, "rank %d: agree: %s", m->rank, ncfsm_boot_last_error(m->b));
  ncfsm_boot_agree_result(req, alive, &nalive);
  REC_CHECK(m, nalive == 2 && alive[0] && alive[1], "rank %d: agreed %d", m->rank, nalive);
  REC_CHECK(m, m->lost_mask & (1 << 2), "rank %d: rank 2 not reported", m->rank);
  ncfsm_boot *c, *cc;
  REC_CHECK(m, ncfsm_boot_survivors(m->b, req, &c) == NCFSM_OK, "survivors");
  ncfsm_boot_req_free(req);
  REC_CHECK(m, ncfsm_boot_close(m->b) == NCFSM_ERR_BUSY &&
                   strstr(ncfsm_boot_last_error(m->b), "survivors' bootstrap"),
            "parent closed with a child open: %s", ncfsm_boot_last_error(m->b));
  ncfsm_boot_req *nested;
  REC_CHECK(m, rec_agree(m, c, 1, alive, &nalive, &nested, 10) == NCFSM_OK && nalive == 2,
            "rank %d: nested agreement: %s", m->rank, ncfsm_boot_last_error(c));
  REC_CHECK(m, ncfsm_boot_survivors(c, nested, &cc) == NCFSM_OK, "nested survivors");
  rec_child_round(m, cc, m->rank, 2, 5);
  ncfsm_boot_req_free(nested);
  ncfsm_boot_close(cc);
  ncfsm_boot_close(c);
}

/* Scenario 4: epochs differ (0,1: epoch 1; 2: epoch 2; 3: epoch 1 after
 * that): every one fails naming the difference; then all post 3 and agree. */
static void rec4_body(rec_shared *sh, rec_member *m) {
  rec_barrier(m);
  ncfsm_boot_req *req;
  if (m->rank == 2)
    while (atomic_load(&sh->posted) < 2) bt_spin(m->base, 0.005);
  if (m->rank == 3)
    while (atomic_load(&sh->posted) < 3) bt_spin(m->base, 0.005);
  REC_CHECK(m, ncfsm_boot_agree_post(m->b, m->rank == 2 ? 2 : 1, &req) == NCFSM_OK, "post");
  atomic_fetch_add(&sh->posted, 1);
  ncfsm_result_t r = bt_wait(m->base, req, 10);
  ncfsm_boot_req_free(req);
  const char *e = ncfsm_boot_last_error(m->b);
  REC_CHECK(m, r == NCFSM_ERR_BOOTSTRAP && strstr(e, "epochs differ"), "rank %d: %s / %s", m->rank,
            ncfsm_strerror(r), e);
  atomic_fetch_add(&sh->failed, 1);
  while (atomic_load(&sh->failed) < 4) bt_spin(m->base, 0.005);
  uint8_t alive[4];
  int nalive = 0;
  r = rec_agree(m, m->b, 3, alive, &nalive, NULL, 10);
  REC_CHECK(m, r == NCFSM_OK && nalive == 4, "rank %d: epoch 3: %s", m->rank,
            ncfsm_boot_last_error(m->b));
  m->ok = 1;
}

typedef struct rec_thr {
  rec_shared *sh;
  rec_member *m;
  void (*body)(rec_shared *, rec_member *);
  uint64_t timeout_ms;
} rec_thr;

static void *rec_main(void *p) {
  rec_thr *t = p;
  rec_open(t->m, t->timeout_ms);
  if (!t->m->b) {
    snprintf(t->m->err, sizeof t->m->err, "open: %s", ncfsm_boot_open_error());
    return NULL;
  }
  t->body(t->sh, t->m);
  if (t->m->b) {
    /* the others may still need this member: close after everyone is done */
    ncfsm_boot_close(t->m->b);
  }
  event_base_free(t->m->base);
  return NULL;
}

static void rec_run(const char *group, void (*body)(rec_shared *, rec_member *), uint64_t timeout_ms,
                    rec_shared *sh) {
  event_base_free(bt_base()); /* evthread_use_pthreads */
  memset(sh, 0, sizeof *sh);
  pthread_t th[4];
  rec_thr t[4];
  for (int i = 0; i < 4; i++) {
    sh->m[i].rank = i;
    sh->m[i].size = 4;
    sh->m[i].group = group;
    t[i] = (rec_thr){sh, &sh->m[i], body, timeout_ms};
    assert_int_equal(0, pthread_create(&th[i], NULL, rec_main, &t[i]));
  }
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 4; i++)
    if (!sh->m[i].ok) fail_msg("member %d: %s", i, sh->m[i].err[0] ? sh->m[i].err : "no result");
}

static void test_rec_lost_agree_survivors(void **state) {
  (void)state;
  static rec_shared sh;
  rec_run("rec1", rec1_body, 10000, &sh);
  for (int i = 0; i < 4; i++)
    if (i != 2)
      print_message("local: rank %d told of rank 2's close after %.3f ms\n", i,
                    (sh.m[i].lost_at[2] - sh.t0) * 1e3);
}

static void test_rec_not_posting_times_out(void **state) {
  (void)state;
  static rec_shared sh;
  rec_run("rec2", rec2_body, 800, &sh);
}

static void test_rec_death_during_agreement(void **state) {
  (void)state;
  static rec_shared sh;
  rec_run("rec3", rec3_body, 10000, &sh);
}

static void test_rec_epochs_differ(void **state) {
  (void)state;
  static rec_shared sh;
  rec_run("rec4", rec4_body, 10000, &sh);
}

static int cb_calls, close_in_cb_rc;
static void count_cb(ncfsm_boot *b, int rank, const char *why, void *arg) {
  (void)rank;
  (void)why;
  (void)arg;
  cb_calls++;
  close_in_cb_rc = ncfsm_boot_close(b);
}

/* One thread: losses before the callback, replacing it, misuse. */
static void test_rec_api_rules(void **state) {
  (void)state;
  struct event_base *base = bt_base();
  ncfsm_boot *b[3];
  for (int r = 0; r < 3; r++) {
    ncfsm_boot_opts o;
    ncfsm_boot_opts_init(&o);
    o.kind = NCFSM_BOOT_LOCAL;
    o.local_group = "rec5";
    o.rank = r;
    o.size = 3;
    o.timeout_ms = 5000;
    assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, &o, &b[r]));
  }
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b[2]));
  bt_spin(base, 0.05);
  /* registered after the loss: told right after the call, from the dispatch */
  cb_calls = 0;
  assert_int_equal(NCFSM_OK, ncfsm_boot_on_peer_lost(b[0], count_cb, NULL));
  assert_int_equal(0, cb_calls);
  bt_spin(base, 0.05);
  assert_int_equal(1, cb_calls);
  assert_int_equal(NCFSM_ERR_BUSY, close_in_cb_rc);
  assert_non_null(strstr(ncfsm_boot_last_error(b[0]), "peer-lost callback"));
  bt_spin(base, 0.05);
  assert_int_equal(1, cb_calls); /* once per rank */
  assert_int_equal(NCFSM_OK, ncfsm_boot_on_peer_lost(b[0], count_cb, NULL)); /* replaced: told again */
  bt_spin(base, 0.05);
  assert_int_equal(2, cb_calls);
  assert_int_equal(NCFSM_OK, ncfsm_boot_on_peer_lost(b[0], NULL, NULL));
  bt_spin(base, 0.05);
  assert_int_equal(2, cb_calls);
  /* misuse of the agreement */
  ncfsm_boot_req *req, *req2;
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_agree_post(b[0], 0, &req));
  assert_int_equal(NCFSM_OK, ncfsm_boot_agree_post(b[0], 4, &req));
  assert_int_equal(NCFSM_ERR_BUSY, ncfsm_boot_agree_post(b[0], 5, &req2));
  assert_non_null(strstr(ncfsm_boot_last_error(b[0]), "has not finished"));
  assert_int_equal(NCFSM_ERR_AGAIN, ncfsm_boot_agree_result(req, NULL, NULL));
  ncfsm_boot *c;
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_survivors(b[0], req, &c));
  assert_null(c);
  ncfsm_boot_req *ag;
  int x = 1, all[3];
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(b[1], &x, all, sizeof x, &ag));
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_agree_result(ag, NULL, NULL));
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_survivors(b[1], ag, &c));
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, bt_wait(base, ag, 5)); /* rank 2 closed before contributing */
  ncfsm_boot_req_free(ag);
  ncfsm_boot_req *req1;
  assert_int_equal(NCFSM_OK, ncfsm_boot_agree_post(b[1], 4, &req1));
  assert_int_equal(NCFSM_OK, bt_wait(base, req, 5));
  assert_int_equal(NCFSM_OK, bt_wait(base, req1, 5));
  uint8_t alive[3];
  int n = 0;
  assert_int_equal(NCFSM_OK, ncfsm_boot_agree_result(req, alive, &n));
  assert_int_equal(2, n);
  assert_int_equal(1, alive[0]);
  assert_int_equal(1, alive[1]);
  assert_int_equal(0, alive[2]);
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_agree_post(b[0], 4, &req2)); /* not above */
  ncfsm_boot *c0, *c1;
  assert_int_equal(NCFSM_OK, ncfsm_boot_survivors(b[0], req, &c0));
  assert_int_equal(NCFSM_ERR_BUSY, ncfsm_boot_survivors(b[0], req, &c)); /* one per agreement */
  assert_int_equal(NCFSM_OK, ncfsm_boot_survivors(b[1], req1, &c1));
  assert_int_equal(0, ncfsm_boot_rank(c0));
  assert_int_equal(1, ncfsm_boot_rank(c1));
  assert_int_equal(2, ncfsm_boot_size(c1));
  assert_int_equal(NCFSM_BOOT_LOCAL, ncfsm_boot_kind(c1));
  int v0 = 10, v1 = 11, o0[2], o1[2];
  ncfsm_boot_req *q[2];
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(c0, &v0, o0, sizeof v0, &q[0]));
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(c1, &v1, o1, sizeof v1, &q[1]));
  bt_wait_all(base, q, 2);
  assert_int_equal(NCFSM_OK, ncfsm_boot_test(q[0]));
  assert_int_equal(NCFSM_OK, ncfsm_boot_test(q[1]));
  assert_int_equal(10, o1[0]);
  assert_int_equal(11, o0[1]);
  ncfsm_boot_req_free(q[0]);
  ncfsm_boot_req_free(q[1]);
  ncfsm_boot_req_free(req);
  ncfsm_boot_req_free(req1);
  assert_int_equal(NCFSM_ERR_BUSY, ncfsm_boot_close(b[0])); /* its survivors' bootstrap is open */
  assert_non_null(strstr(ncfsm_boot_last_error(b[0]), "survivors' bootstrap"));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(c0));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(c1));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b[0]));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b[1]));
  event_base_free(base);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      BT_TEST(test_four_threads),
      BT_TEST(test_bcast),
      BT_TEST(test_same_thread),
      BT_TEST(test_join_errors_and_timeout),
      BT_TEST(test_auto_picks_local),
      BT_TEST(test_rec_lost_agree_survivors),
      BT_TEST(test_rec_not_posting_times_out),
      BT_TEST(test_rec_death_during_agreement),
      BT_TEST(test_rec_epochs_differ),
      BT_TEST(test_rec_api_rules),
  };
  return cmocka_run_group_tests_name("bootstrap_local", tests, NULL, NULL);
}
