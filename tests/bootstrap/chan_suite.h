/* The channel and notice suite (issue 21), for the handles bs[0..n) of ranks of one job
 * driven on one base: all ranks of a job in one process (local, tcp), or one rank per process
 * (pmix under mpirun, n = 1). Each part opens its channels, checks and closes them. */
#ifndef NCFSM_TESTS_CHAN_SUITE_H
#define NCFSM_TESTS_CHAN_SUITE_H

#include "tests/bootstrap/boot_test.h"

#define CS_MAX 16

static inline ncfsm_boot *cs_open(ncfsm_boot *b, const char *tag, const int *members, int nm) {
  ncfsm_boot *c = NULL;
  ncfsm_result_t r = ncfsm_boot_channel_open(b, tag, members, nm, &c);
  if (r != NCFSM_OK)
    fail_msg("rank %d: channel_open('%s'): %s: %s", ncfsm_boot_rank(b), tag, ncfsm_err_name(r),
             ncfsm_boot_last_error(b));
  assert_string_equal(tag, ncfsm_boot_channel_tag(c));
  return c;
}

static inline void cs_close_all(ncfsm_boot **cs, int n) {
  for (int i = 0; i < n; i++)
    if (cs[i] && ncfsm_boot_close(cs[i]) != NCFSM_OK)
      fail_msg("close channel: %s", ncfsm_boot_last_error(cs[i]));
}

/* Wait for reqs[0..n) and check each is NCFSM_OK (naming what failed), then free them. */
static inline void cs_wait_ok(struct event_base *base, ncfsm_boot_req **q, ncfsm_boot **owner, int n,
                              const char *what) {
  bt_wait_all(base, q, n);
  for (int i = 0; i < n; i++) {
    if (!q[i]) continue;
    if (ncfsm_boot_test(q[i]) != NCFSM_OK)
      fail_msg("%s %d (rank %d): %s", what, i, ncfsm_boot_rank(owner[i]),
               ncfsm_boot_last_error(owner[i]));
    ncfsm_boot_req_free(q[i]);
    q[i] = NULL;
  }
}

/* Collectives on the parent and on a channel of every rank, posted in both orders (even
 * ranks parent first in even rounds, odd ranks channel first; then the other way round):
 * allgathers, then broadcasts. Neither sees the other's bytes. */
static inline void cs_interleave(struct event_base *base, ncfsm_boot **bs, int n) {
  int size = ncfsm_boot_size(bs[0]);
  ncfsm_boot *ch[CS_MAX], *own[2 * CS_MAX];
  ncfsm_boot_req *q[2 * CS_MAX];
  unsigned char snd[CS_MAX][2][32], rcv[CS_MAX][2][32 * CS_MAX];
  for (int i = 0; i < n; i++) {
    ch[i] = cs_open(bs[i], "cs.interleave", NULL, 0);
    assert_int_equal(ncfsm_boot_rank(bs[i]), ncfsm_boot_rank(ch[i]));
    assert_int_equal(size, ncfsm_boot_size(ch[i]));
    own[2 * i] = bs[i];
    own[2 * i + 1] = ch[i];
  }
  for (int k = 0; k < 6; k++) {
    for (int i = 0; i < n; i++) {
      int r = ncfsm_boot_rank(bs[i]), chan_first = (r + k) % 2;
      bt_fill(snd[i][0], 16, r, 100 + k);
      bt_fill(snd[i][1], 24, r, 200 + k);
      for (int j = 0; j < 2; j++) {
        int which = j ^ chan_first; /* 0: parent, 1: channel */
        ncfsm_boot *b = which ? ch[i] : bs[i];
        ncfsm_result_t rc = ncfsm_boot_allgather_post(b, snd[i][which], rcv[i][which],
                                                      which ? 24 : 16, &q[2 * i + which]);
        if (rc != NCFSM_OK) fail_msg("round %d rank %d post %d: %s", k, r, which, ncfsm_boot_last_error(b));
      }
    }
    cs_wait_ok(base, q, own, 2 * n, "interleaved allgather");
    for (int i = 0; i < n; i++) {
      bt_check(rcv[i][0], 16, size, 100 + k);
      bt_check(rcv[i][1], 24, size, 200 + k);
    }
  }
  int pb[CS_MAX], cb[CS_MAX];
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < n; i++) {
      int r = ncfsm_boot_rank(bs[i]), chan_first = (r + k) % 2;
      pb[i] = r == 0 ? 1000 + k : -1;
      cb[i] = r == size - 1 ? 2000 + k : -1;
      for (int j = 0; j < 2; j++) {
        int which = j ^ chan_first;
        ncfsm_result_t rc = which ? ncfsm_boot_bcast_post(ch[i], &cb[i], sizeof cb[i], size - 1, &q[2 * i + 1])
                                  : ncfsm_boot_bcast_post(bs[i], &pb[i], sizeof pb[i], 0, &q[2 * i]);
        if (rc != NCFSM_OK) fail_msg("bcast round %d rank %d: %s", k, r, ncfsm_boot_last_error(which ? ch[i] : bs[i]));
      }
    }
    cs_wait_ok(base, q, own, 2 * n, "interleaved broadcast");
    for (int i = 0; i < n; i++) {
      assert_int_equal(1000 + k, pb[i]);
      assert_int_equal(2000 + k, cb[i]);
    }
  }
  /* the parent refuses to close while a channel of it has a request out, naming it (the
   * request freed unfinished leaves that channel out of step: it is closed next) */
  ncfsm_boot_req *out = NULL;
  unsigned char one = 1, all[CS_MAX];
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(ch[0], &one, all, 1, &out));
  assert_int_equal(NCFSM_ERR_BUSY, ncfsm_boot_close(bs[0]));
  assert_non_null(strstr(ncfsm_boot_last_error(bs[0]), "'cs.interleave'"));
  ncfsm_boot_req_free(out);
  cs_close_all(ch, n);
}

/* Two channels at once, their allgathers posted in opposite orders on even and odd ranks, a
 * parent barrier between them. */
static inline void cs_two_channels(struct event_base *base, ncfsm_boot **bs, int n) {
  int size = ncfsm_boot_size(bs[0]);
  ncfsm_boot *a[CS_MAX], *b[CS_MAX], *own[3 * CS_MAX];
  ncfsm_boot_req *q[3 * CS_MAX];
  unsigned char sa[CS_MAX][8], sb[CS_MAX][40], ra[CS_MAX][8 * CS_MAX], rb[CS_MAX][40 * CS_MAX];
  for (int i = 0; i < n; i++) {
    int r = ncfsm_boot_rank(bs[i]);
    /* the two opened in opposite orders too */
    if (r % 2) {
      b[i] = cs_open(bs[i], "cs.two-b", NULL, 0);
      a[i] = cs_open(bs[i], "cs.two-a", NULL, 0);
    } else {
      a[i] = cs_open(bs[i], "cs.two-a", NULL, 0);
      b[i] = cs_open(bs[i], "cs.two-b", NULL, 0);
    }
    own[3 * i] = a[i];
    own[3 * i + 1] = bs[i];
    own[3 * i + 2] = b[i];
  }
  for (int k = 0; k < 4; k++) {
    for (int i = 0; i < n; i++) {
      int r = ncfsm_boot_rank(bs[i]);
      bt_fill(sa[i], 8, r, 300 + k);
      bt_fill(sb[i], 40, r, 400 + k);
      ncfsm_result_t r1, r2, r3;
      if ((r + k) % 2) {
        r1 = ncfsm_boot_allgather_post(b[i], sb[i], rb[i], 40, &q[3 * i + 2]);
        r2 = ncfsm_boot_barrier_post(bs[i], &q[3 * i + 1]);
        r3 = ncfsm_boot_allgather_post(a[i], sa[i], ra[i], 8, &q[3 * i]);
      } else {
        r3 = ncfsm_boot_allgather_post(a[i], sa[i], ra[i], 8, &q[3 * i]);
        r2 = ncfsm_boot_barrier_post(bs[i], &q[3 * i + 1]);
        r1 = ncfsm_boot_allgather_post(b[i], sb[i], rb[i], 40, &q[3 * i + 2]);
      }
      assert_int_equal(NCFSM_OK, r1);
      assert_int_equal(NCFSM_OK, r2);
      assert_int_equal(NCFSM_OK, r3);
    }
    cs_wait_ok(base, q, own, 3 * n, "two channels");
    for (int i = 0; i < n; i++) {
      bt_check(ra[i], 8, size, 300 + k);
      bt_check(rb[i], 40, size, 400 + k);
    }
  }
  cs_close_all(a, n);
  cs_close_all(b, n);
}

/* The last rank opens the channel late: the others' channel allgather waits for it while a
 * parent allgather (which the last rank joins before it opens the channel) completes. */
static inline void cs_late_open(struct event_base *base, ncfsm_boot **bs, int n) {
  int size = ncfsm_boot_size(bs[0]);
  ncfsm_boot *ch[CS_MAX] = {0}, *own[CS_MAX];
  ncfsm_boot_req *cq[CS_MAX] = {0}, *pq[CS_MAX];
  unsigned char cs[CS_MAX][12], cr[CS_MAX][12 * CS_MAX], ps[CS_MAX][4], pr[CS_MAX][4 * CS_MAX];
  for (int i = 0; i < n; i++) {
    int r = ncfsm_boot_rank(bs[i]);
    bt_fill(cs[i], 12, r, 500);
    if (r == size - 1) continue;
    ch[i] = cs_open(bs[i], "cs.late", NULL, 0);
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(ch[i], cs[i], cr[i], 12, &cq[i]));
  }
  for (int i = 0; i < n; i++) {
    bt_fill(ps[i], 4, ncfsm_boot_rank(bs[i]), 501);
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(bs[i], ps[i], pr[i], 4, &pq[i]));
  }
  cs_wait_ok(base, pq, bs, n, "parent allgather while the channel waits");
  for (int i = 0; i < n; i++) {
    bt_check(pr[i], 4, size, 501);
    if (cq[i]) assert_int_equal(NCFSM_ERR_AGAIN, ncfsm_boot_test(cq[i])); /* still waiting */
  }
  bt_spin(base, 0.05);
  for (int i = 0; i < n; i++)
    if (cq[i]) assert_int_equal(NCFSM_ERR_AGAIN, ncfsm_boot_test(cq[i]));
  for (int i = 0; i < n; i++) /* every rank has looked before the last one opens */
    assert_int_equal(NCFSM_OK, ncfsm_boot_barrier_post(bs[i], &pq[i]));
  cs_wait_ok(base, pq, bs, n, "parent barrier");
  for (int i = 0; i < n; i++) {
    if (ncfsm_boot_rank(bs[i]) != size - 1) continue;
    ch[i] = cs_open(bs[i], "cs.late", NULL, 0);
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(ch[i], cs[i], cr[i], 12, &cq[i]));
  }
  for (int i = 0; i < n; i++) own[i] = ch[i];
  cs_wait_ok(base, cq, own, n, "late-opened channel");
  for (int i = 0; i < n; i++) bt_check(cr[i], 12, size, 500);
  cs_close_all(ch, n);
}

/* A channel of two members, the last rank and rank 0 in that order (so renumbered 0 and 1),
 * next to a parent allgather of every rank. */
static inline void cs_subset(struct event_base *base, ncfsm_boot **bs, int n) {
  int size = ncfsm_boot_size(bs[0]);
  if (size < 2) return;
  int members[2] = {size - 1, 0};
  ncfsm_boot *ch[CS_MAX] = {0}, *own[2 * CS_MAX];
  ncfsm_boot_req *q[2 * CS_MAX] = {0};
  unsigned char cs[CS_MAX][8], cr[CS_MAX][16], ps[CS_MAX][4], pr[CS_MAX][4 * CS_MAX];
  for (int i = 0; i < n; i++) {
    int r = ncfsm_boot_rank(bs[i]);
    own[2 * i] = bs[i];
    own[2 * i + 1] = NULL;
    bt_fill(ps[i], 4, r, 601);
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(bs[i], ps[i], pr[i], 4, &q[2 * i]));
    if (r != 0 && r != size - 1) continue;
    ch[i] = cs_open(bs[i], "cs.subset", members, 2);
    assert_int_equal(r == size - 1 ? 0 : 1, ncfsm_boot_rank(ch[i]));
    assert_int_equal(2, ncfsm_boot_size(ch[i]));
    own[2 * i + 1] = ch[i];
    bt_fill(cs[i], 8, ncfsm_boot_rank(ch[i]), 600);
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(ch[i], cs[i], cr[i], 8, &q[2 * i + 1]));
  }
  cs_wait_ok(base, q, own, 2 * n, "subset channel");
  for (int i = 0; i < n; i++) {
    bt_check(pr[i], 4, size, 601);
    if (ch[i]) bt_check(cr[i], 8, 2, 600); /* channel rank order: the last rank's first */
  }
  cs_close_all(ch, n);
}

/* ---- notices ---------------------------------------------------------------------- */

typedef struct cs_heard {
  int count, origin;
  uint64_t key, seq;
  int32_t cause;
  char what[NCFSM_BOOT_NOTICE_WHAT];
  double at; /* bt_now() when the first one came */
} cs_heard;

static inline void cs_on_notice(ncfsm_boot *b, const ncfsm_boot_notice *nt, void *arg) {
  cs_heard *h = arg;
  (void)b;
  if (!h->count++) h->at = bt_now();
  h->origin = nt->origin;
  h->key = nt->key;
  h->seq = nt->seq;
  h->cause = nt->cause;
  snprintf(h->what, sizeof h->what, "%s", nt->what);
}

/* Run base until every heard[i] with want[i] has count >= 1, or secs passed. */
static inline void cs_wait_heard(struct event_base *base, cs_heard *h, const int *want, int n,
                                 double secs) {
  double t0 = bt_now();
  for (;;) {
    int missing = 0;
    for (int i = 0; i < n; i++) missing += want[i] && h[i].count == 0;
    if (!missing || bt_now() - t0 > secs) return;
    bt_spin(base, 0.001);
  }
}

/* poster_rank posts one notice on its handle of b[]: every other rank's handle gets it once,
 * with its fields; the poster does not. *lat_ms gets, per handle, the post-to-callback time
 * (bt_now() of this process: one clock for the processes of a machine; -1 for the poster and
 * for handles of other processes that did not hear). b[] may be channels (NULL: not a member). */
static inline void cs_notice_round(struct event_base *base, ncfsm_boot **b, int n, int poster_rank,
                                   uint64_t key, double *lat_ms) {
  cs_heard h[CS_MAX];
  int want[CS_MAX];
  memset(h, 0, sizeof h);
  for (int i = 0; i < n; i++) {
    want[i] = b[i] && ncfsm_boot_rank(b[i]) != poster_rank;
    if (b[i]) assert_int_equal(NCFSM_OK, ncfsm_boot_on_notice(b[i], cs_on_notice, &h[i]));
  }
  ncfsm_boot_req *bar[CS_MAX] = {0}; /* every rank listens before the post */
  for (int i = 0; i < n; i++)
    if (b[i]) assert_int_equal(NCFSM_OK, ncfsm_boot_barrier_post(b[i], &bar[i]));
  cs_wait_ok(base, bar, b, n, "barrier before the notice");
  double t0 = bt_now();
  for (int i = 0; i < n; i++) {
    if (!b[i] || ncfsm_boot_rank(b[i]) != poster_rank) continue;
    ncfsm_boot_notice nt;
    memset(&nt, 0, sizeof nt);
    nt.key = key;
    nt.origin = 12345; /* ignored: the post sets it */
    nt.seq = (uint64_t)(t0 * 1e9);
    nt.cause = -7;
    snprintf(nt.what, sizeof nt.what, "rank %d failed: a notice of the suite", poster_rank);
    assert_int_equal(NCFSM_OK, ncfsm_boot_notice_post(b[i], &nt));
  }
  cs_wait_heard(base, h, want, n, 10);
  bt_spin(base, 0.05); /* time for a wrong second delivery, or one to the poster */
  for (int i = 0; i < n; i++) {
    lat_ms[i] = -1;
    if (!b[i]) continue;
    if (!want[i]) {
      assert_int_equal(0, h[i].count);
    } else {
      if (h[i].count != 1)
        fail_msg("rank %d heard %d notices of rank %d, expected 1", ncfsm_boot_rank(b[i]), h[i].count,
                 poster_rank);
      assert_int_equal(poster_rank, h[i].origin);
      assert_true(h[i].key == key);
      assert_int_equal(-7, h[i].cause);
      assert_non_null(strstr(h[i].what, "a notice of the suite"));
      lat_ms[i] = (h[i].at - (double)h[i].seq * 1e-9) * 1e3;
    }
    assert_int_equal(NCFSM_OK, ncfsm_boot_on_notice(b[i], NULL, NULL));
  }
}

static inline int cs_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* rounds notices, rank k % size posting round k, on bs[] (a job's handles, or channels of
 * all its ranks); the post-to-callback times of every receiver are gathered on bs and rank 0
 * prints "notice latency <label>: N deliveries, min/median/p90/max ms" on stderr; *worst_ms
 * gets the largest (every handle). */
static inline void cs_notice_latency(struct event_base *base, ncfsm_boot **bs, int n, int rounds,
                                     const char *label, double *worst_ms) {
  enum { R_MAX = 64 };
  int size = ncfsm_boot_size(bs[0]);
  assert_true(rounds <= R_MAX);
  double mine[CS_MAX][R_MAX], lat[CS_MAX];
  for (int k = 0; k < rounds; k++) {
    cs_notice_round(base, bs, n, k % size, 0xfeed0000u + (uint64_t)k, lat);
    for (int i = 0; i < n; i++) mine[i][k] = lat[i];
  }
  double *all = calloc((size_t)n * (size_t)size * R_MAX, sizeof *all);
  ncfsm_boot_req *q[CS_MAX];
  for (int i = 0; i < n; i++)
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(bs[i], mine[i], all + (size_t)i * size * R_MAX,
                                                         R_MAX * sizeof(double), &q[i]));
  cs_wait_ok(base, q, bs, n, "gathering the latencies");
  for (int i = 0; i < n; i++) {
    double *v = all + (size_t)i * size * R_MAX, *got = calloc((size_t)size * R_MAX, sizeof *got);
    int m = 0;
    for (int r = 0; r < size; r++)
      for (int k = 0; k < rounds; k++)
        if (v[r * R_MAX + k] >= 0) got[m++] = v[r * R_MAX + k];
    qsort(got, (size_t)m, sizeof *got, cs_cmp_double);
    assert_int_equal(rounds * (size - 1), m); /* every other rank heard every notice */
    if (worst_ms) *worst_ms = m ? got[m - 1] : 0;
    if (ncfsm_boot_rank(bs[i]) == 0)
      fprintf(stderr, "notice latency %s: %d ranks, %d deliveries, min %.3f / median %.3f / p90 "
                      "%.3f / max %.3f ms\n",
              label, size, m, got[0], got[m / 2], got[(m * 9) / 10], got[m - 1]);
    free(got);
  }
  free(all);
}

/* Misuse of ncfsm_boot_channel_open, the same on every kind (nothing reaches the peers). */
static inline void cs_misuse(ncfsm_boot *b) {
  ncfsm_boot *c = (ncfsm_boot *)1;
  int size = ncfsm_boot_size(b), rank = ncfsm_boot_rank(b);
  char longtag[NCFSM_BOOT_TAG_MAX + 2];
  memset(longtag, 'x', sizeof longtag - 1);
  longtag[sizeof longtag - 1] = 0;
  static const struct {
    const char *tag, *says;
  } bad[] = {{"", "empty"}, {"has space", "0x20"}, {"colon:x", "0x3a"}, {NULL, "empty"}};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_channel_open(b, bad[k].tag, NULL, 0, &c));
    assert_null(c);
    assert_non_null(strstr(ncfsm_boot_last_error(b), bad[k].says));
  }
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_channel_open(b, longtag, NULL, 0, &c));
  assert_non_null(strstr(ncfsm_boot_last_error(b), "longer than 64"));
  int twice[2] = {rank, rank};
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_channel_open(b, "t", twice, 2, &c));
  assert_non_null(strstr(ncfsm_boot_last_error(b), "listed twice"));
  int outside[1] = {size};
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_channel_open(b, "t", outside, 1, &c));
  assert_non_null(strstr(ncfsm_boot_last_error(b), "not a rank of the bootstrap"));
  if (size > 1) {
    int other[1] = {(rank + 1) % size};
    assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_channel_open(b, "t", other, 1, &c));
    assert_non_null(strstr(ncfsm_boot_last_error(b), "not among the 1 members"));
  }
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_channel_open(NULL, "t", NULL, 0, &c));
  assert_null(ncfsm_boot_channel_tag(b)); /* not a channel */
  /* one channel per tag on a bootstrap; agreements belong to the parent */
  int me[1] = {rank};
  char tag[32];
  snprintf(tag, sizeof tag, "cs.misuse.%d", rank); /* its own: one member */
  ncfsm_boot *ok = cs_open(b, tag, me, 1);
  assert_int_equal(NCFSM_ERR_BUSY, ncfsm_boot_channel_open(b, tag, me, 1, &c));
  assert_non_null(strstr(ncfsm_boot_last_error(b), "already open"));
  ncfsm_boot_req *ar = (ncfsm_boot_req *)1;
  if (ncfsm_boot_kind(b) != NCFSM_BOOT_PMIX) {
    assert_int_equal(NCFSM_ERR_UNSUPPORTED, ncfsm_boot_agree_post(ok, 1, &ar));
    assert_non_null(strstr(ncfsm_boot_last_error(ok), "opened from"));
  }
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_notice_post(ok, NULL));
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_on_notice(NULL, NULL, NULL));
  /* a channel of one member is a channel: its collectives complete at once */
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather(ok, &rank, &rank, sizeof rank));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(ok));
}

#endif
