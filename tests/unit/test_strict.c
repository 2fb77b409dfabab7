/*
 * Strict cross-rank verification (issue 9, item 4; docs/ordering.md): two
 * ranks, each on its own thread with its own loop, joined through the
 * in-process bootstrap. Each rank submits OPS collectives; op K differs
 * between the ranks in one field (or is skipped by rank 1, or is part of a
 * group). Strict verification must fail exactly the mismatched collective
 * (its whole group) on both ranks with NCFSM_ERR_MISMATCH, before NCCL sees
 * it, name the seq, the field and each rank's value, keep the comm READY,
 * and let the collectives after it run with the seqs they would have had
 * without it. A skip ends in TIMEOUT after verify_stall_ms, long before the
 * watchdog.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "helpers.h"
#include "ncfsm/bootstrap.h"

#define N 2
#define OPS 8
#define K 3 /* the op that differs */

enum scenario { CONSISTENT, OP, COUNT, DTYPE, ROOT, REDOP, GROUP, SKIP };

struct rank_result {
  const char *fail_at;
  ncfsm_state_t state;
  ncfsm_result_t status[OPS + 1];
  uint64_t seq[OPS + 1];
  int launched[OPS + 1];
  int done;
  char last_error[600];
  char failure[512];
};

static enum scenario sc;
static const char *group;
/* rank 0 has its verdict: until then the stopping rank keeps its bootstrap
 * open (a closed bootstrap is a lost rank: it would fail rank 0 at once
 * instead of at the stall bound, which is what this test measures) */
static atomic_int rank0_done;
static struct rank_result res[N];
static float bufs[N][OPS + 1][8];

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

struct slot {
  struct rank_result *r;
  int k;
};
static struct slot slots[N][OPS + 1];

static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  struct slot *s = arg;
  ncfsm_fingerprint_t fp;
  s->r->status[s->k] = st;
  s->r->seq[s->k] = ncfsm_work_get_fingerprint(w, &fp) == NCFSM_OK ? fp.seq : 0;
  s->r->launched[s->k] = ncfsm_work_launched(w);
  s->r->done++;
}

#define CHECK(cond)              \
  do {                           \
    if (!(cond)) {               \
      res[rank].fail_at = #cond; \
      goto out;                  \
    }                            \
  } while (0)

static ncfsm_result_t submit(ncfsm_comm *c, int rank, int k) {
  float *b = bufs[rank][k];
  void *arg = &slots[rank][k];
  bool odd = rank == 1 && k == K;
  size_t count = sc == COUNT && odd ? 8 : 4;
  ncfsm_dtype_t dt = sc == DTYPE && odd ? NCFSM_INT32 : NCFSM_FLOAT32;
  if (sc == OP && odd) return ncfsm_broadcast(c, b, b, count, dt, 0, NULL, on_done, arg, NULL);
  if (sc == ROOT && k == K) return ncfsm_broadcast(c, b, b, count, dt, odd ? 1 : 0, NULL, on_done, arg, NULL);
  ncfsm_redop_t op = sc == REDOP && odd ? NCFSM_OP_MAX : NCFSM_OP_SUM;
  return ncfsm_allreduce(c, b, b, count, dt, op, NULL, on_done, arg, NULL);
}

static void *rank_main(void *arg) {
  int rank = (int)(intptr_t)arg;
  struct rank_result *r = &res[rank];
  ncfsm_loop *loop = NULL;
  ncfsm_boot *boot = NULL;
  ncfsm_comm *c = NULL;
  CHECK(ncfsm_loop_new(NULL, &loop) == NCFSM_OK);
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  bo.kind = NCFSM_BOOT_LOCAL;
  bo.local_group = group;
  bo.rank = rank;
  bo.size = N;
  CHECK(ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &boot) == NCFSM_OK);
  ncfsm_sim_opts so;
  CHECK(ncfsm_sim_opts_init(&so) == NCFSM_OK);
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.backend = NCFSM_BACKEND_SIM;
  o.sim = &so;
  o.on_error = NCFSM_ON_ERROR_STAY;
  o.timeout_ms = 20000;
  o.verify = NCFSM_VERIFY_STRICT;
  o.verify_stall_ms = sc == SKIP ? 300 : 5000; /* a loaded machine must not make a stall of the others */
  o.dump_dir = "";
  o.name = "strict";
  CHECK(ncfsm_comm_new(loop, &o, &c) == NCFSM_OK);
  CHECK(ncfsm_comm_init_boot(c, boot) == NCFSM_OK);
  CHECK(ncfsm_comm_wait_state(c, NCFSM_STATE_READY, 10000) == NCFSM_OK);
  int expect = 0;
  for (int k = 0; k <= OPS; k++) {
    slots[rank][k] = (struct slot){r, k};
    r->status[k] = -1;
    for (int i = 0; i < 8; i++) bufs[rank][k][i] = (float)(rank + 1);
  }
  for (int k = 0; k < OPS; k++) {
    if (sc == SKIP && rank == 1 && k == K) continue;
    if (sc == GROUP && k == K) { /* K and OPS in one group; rank 1's second op has another count */
      CHECK(ncfsm_group_start(loop) == NCFSM_OK);
      CHECK(submit(c, rank, k) == NCFSM_OK);
      CHECK(ncfsm_allreduce(c, bufs[rank][OPS], bufs[rank][OPS], rank ? 2 : 4, NCFSM_FLOAT32, NCFSM_OP_SUM,
                            NULL, on_done, &slots[rank][OPS], NULL) == NCFSM_OK);
      CHECK(ncfsm_group_end(loop) == NCFSM_OK);
      expect += 2;
      continue;
    }
    CHECK(submit(c, rank, k) == NCFSM_OK);
    expect++;
  }
  double limit = now_ms() + 10000;
  /* until every callback came (a skip: until rank 0's comm failed), bounded */
  while (now_ms() < limit && r->done < expect && ncfsm_comm_state(c) != NCFSM_STATE_ERROR)
    CHECK(ncfsm_loop_run(loop, NCFSM_RUN_ONCE) == NCFSM_OK);
  while (now_ms() < limit && ncfsm_comm_state(c) != NCFSM_STATE_READY && ncfsm_comm_state(c) != NCFSM_STATE_ERROR)
    CHECK(ncfsm_loop_run(loop, NCFSM_RUN_ONCE) == NCFSM_OK);
  r->state = ncfsm_comm_state(c);
  snprintf(r->last_error, sizeof r->last_error, "%s", ncfsm_comm_last_error(c));
  snprintf(r->failure, sizeof r->failure, "%s", ncfsm_comm_failure(c));
  /* rank 1's comm stays (and answers rank 0's question: how far are you?) until rank 0 is done */
  if (sc == SKIP && rank == 1)
    for (double until = now_ms() + 15000; !atomic_load(&rank0_done) && now_ms() < until;) {
      ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
out:
  if (c) {
    if (ncfsm_comm_state(c) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(c);
    ncfsm_comm_release(c);
  }
  if (loop) ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
  if (rank == 0) atomic_store(&rank0_done, 1);
  if (boot) ncfsm_boot_close(boot);
  if (loop && ncfsm_loop_close(loop) != NCFSM_OK && !r->fail_at) r->fail_at = "loop close";
  return NULL;
}

static void run(enum scenario s, const char *g) {
  sc = s;
  group = g;
  memset(res, 0, sizeof res);
  atomic_store(&rank0_done, 0);
  pthread_t th[N];
  for (int r = 0; r < N; r++) pthread_create(&th[r], NULL, rank_main, (void *)(intptr_t)r);
  for (int r = 0; r < N; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < N; r++) {
    if (res[r].fail_at) fail_msg("rank %d: %s", r, res[r].fail_at);
    printf("rank %d: state %s; last error: %s\n", r, ncfsm_state_name(res[r].state), res[r].last_error);
  }
}

/* Op K (and, for a group, its group mate) failed with MISMATCH unlaunched on
 * both ranks; every other op completed, with consecutive seqs. */
static void expect_mismatch(const char *field, const char *values) {
  for (int r = 0; r < N; r++) {
    assert_int_equal(res[r].state, NCFSM_STATE_READY);
    uint64_t seq = 0;
    for (int k = 0; k < OPS; k++) {
      if (k == K) {
        assert_int_equal(res[r].status[k], NCFSM_ERR_MISMATCH);
        assert_int_equal(res[r].launched[k], 0);
        assert_true(res[r].seq[k] == NCFSM_SEQ_NONE);
        continue;
      }
      assert_int_equal(res[r].status[k], NCFSM_OK);
      assert_true(res[r].seq[k] == seq);
      seq++;
    }
    char want[128];
    snprintf(want, sizeof want, "collective seq %d differs across ranks in %s", K, field);
    assert_non_null(strstr(res[r].last_error, want));
    assert_non_null(strstr(res[r].last_error, values));
    assert_non_null(strstr(res[r].last_error, "communicator is still usable"));
  }
}

static void test_consistent(void **state) {
  (void)state;
  run(CONSISTENT, "strict-consistent");
  for (int r = 0; r < N; r++) {
    assert_int_equal(res[r].state, NCFSM_STATE_READY);
    for (int k = 0; k < OPS; k++) {
      assert_int_equal(res[r].status[k], NCFSM_OK);
      assert_true(res[r].seq[k] == (uint64_t)k);
    }
  }
}

static void test_op(void **state) {
  (void)state;
  run(OP, "strict-op");
  expect_mismatch("op", "rank 0 ALLREDUCE, rank 1 BROADCAST");
}

static void test_count(void **state) {
  (void)state;
  run(COUNT, "strict-count");
  expect_mismatch("count", "rank 0 4, rank 1 8");
}

static void test_dtype(void **state) {
  (void)state;
  run(DTYPE, "strict-dtype");
  expect_mismatch("dtype", "rank 0 FLOAT32, rank 1 INT32");
}

static void test_root(void **state) {
  (void)state;
  run(ROOT, "strict-root");
  expect_mismatch("root", "rank 0 0, rank 1 1");
}

static void test_redop(void **state) {
  (void)state;
  run(REDOP, "strict-redop");
  expect_mismatch("redop", "rank 0 SUM, rank 1 MAX");
}

/* The group's first op matches, its second does not: the whole group fails
 * on both ranks, and neither op was launched. */
static void test_group(void **state) {
  (void)state;
  run(GROUP, "strict-group");
  for (int r = 0; r < N; r++) {
    assert_int_equal(res[r].state, NCFSM_STATE_READY);
    assert_int_equal(res[r].status[K], NCFSM_ERR_MISMATCH);
    assert_int_equal(res[r].status[OPS], NCFSM_ERR_MISMATCH);
    assert_int_equal(res[r].launched[K], 0);
    assert_int_equal(res[r].launched[OPS], 0);
    assert_int_equal(res[r].status[K + 1], NCFSM_OK);
    assert_true(res[r].seq[K + 1] == K);
    assert_non_null(strstr(res[r].last_error, "differs across ranks in count"));
  }
}

/* Rank 1 skips op K: rank 0's op K waits for rank 1's fingerprint (rank 1's
 * op K+1 pairs with it: a mismatch, unless it is the same collective), ...
 * Here every op is the same AllReduce, so the exchanges pair op K of rank 0
 * with op K+1 of rank 1 and so on: rank 0's last exchange never completes,
 * and the stall bound fails rank 0's comm with TIMEOUT. */
static void test_skip(void **state) {
  (void)state;
  run(SKIP, "strict-skip");
  assert_int_equal(res[0].state, NCFSM_STATE_ERROR);
  assert_non_null(strstr(res[0].failure, "not every rank submitted collective seq"));
  assert_non_null(strstr(res[0].failure, "within 300 ms"));
  /* CTest also runs this file with NCFSM_VERIFY_CHANNEL=nccl (a companion communicator) */
  const char *ch = getenv("NCFSM_VERIFY_CHANNEL");
  if (ch && !strcmp(ch, "nccl")) {
    assert_non_null(strstr(res[0].failure, "(channel nccl)"));
  } else { /* the others were asked how far they are: rank 1 submitted one less */
    assert_null(strstr(res[0].failure, "(channel nccl)"));
    assert_non_null(strstr(res[0].failure, "behind: rank 1 submitted only"));
  }
}

static void test_needs_bootstrap(void **state) {
  (void)state;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  o.verify = NCFSM_VERIFY_STRICT;
  ncfsm_comm *c[1];
  assert_int_equal(ncfsm_comm_new(loop, &o, &c[0]), NCFSM_OK);
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
  assert_int_equal(ncfsm_comm_init(c[0], 2, 0, &id), NCFSM_ERR_INVALID_USAGE);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "strict"));
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "ncfsm_comm_init_boot"));
  teardown_all(loop, c, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_consistent), cmocka_unit_test(test_op),    cmocka_unit_test(test_count),
      cmocka_unit_test(test_dtype),      cmocka_unit_test(test_root),  cmocka_unit_test(test_redop),
      cmocka_unit_test(test_group),      cmocka_unit_test(test_skip),  cmocka_unit_test(test_needs_bootstrap),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
