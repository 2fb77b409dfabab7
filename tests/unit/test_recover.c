/*
 * Recovery without restart (issue 10, item 5; docs/recovery.md), in one
 * process on the sim: N ranks, each a thread with its own loop, joined by the
 * in-process bootstrap. Every rank runs AllReduces and checks the sums over
 * the current members; rank N-1 "dies" at iteration K (it stops and closes
 * its bootstrap: the others' AllReduce K never completes, and the bootstrap
 * reports the lost rank). The survivors' comms are armed
 * (ncfsm_comm_set_recovery, NCFSM_ON_ERROR_SHRINK): they must be replaced by
 * a comm of the survivors, the iteration redone, and every later sum right.
 * Variants: the 2.28.9 path (revoke, then shrink), a runtime without Revoke
 * (2.28.3: shrink from ERROR), a runtime without Shrink (2.26: a new comm
 * over the survivors' bootstrap), and ncfsm_comm_recover with every rank
 * alive (nobody to exclude: a new comm).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "helpers.h"
#include "ncfsm/bootstrap.h"
#include "ncfsm/testing.h"

#define N 4
#define ITERS 12
#define K 5

enum variant { V_REVOKE_SHRINK, V_NO_REVOKE, V_NO_SHRINK, V_MANUAL, V_REVOKE_FAILS };

struct rank_res {
  const char *fail_at;
  int recoveries, wrong, done_iters, final_size, nexcluded;
  char how[16], why[400];
  ncfsm_result_t status;
};

static enum variant var;
static const char *group;
static struct rank_res res[N];

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

struct ctx {
  int rank;
  ncfsm_comm *comm, *old;
  ncfsm_boot *boot;
  bool member[N];
  struct rank_res *r;
};

static void on_recovered(const ncfsm_recovery_report *rep, void *arg) {
  struct ctx *x = arg;
  x->r->status = rep->status;
  snprintf(x->r->how, sizeof x->r->how, "%s", rep->how);
  snprintf(x->r->why, sizeof x->r->why, "%s", rep->why);
  int map[N], m = 0;
  for (int o = 0; o < N; o++)
    if (x->member[o]) map[m++] = o;
  for (int k = 0; k < rep->nexcluded; k++) x->member[map[rep->excluded[k]]] = false;
  x->r->nexcluded = rep->nexcluded;
  x->old = rep->old;
  if (rep->status == NCFSM_OK) {
    x->comm = rep->fresh;
    x->boot = rep->boot;
  }
  x->r->recoveries++;
}

#define CHECK(cond)          \
  do {                       \
    if (!(cond)) {           \
      x->r->fail_at = #cond; \
      goto out;              \
    }                        \
  } while (0)

static void *rank_main(void *arg) {
  struct ctx *x = arg;
  ncfsm_loop *loop = NULL;
  ncfsm_boot *first_boot = NULL;
  int32_t buf[64];
  CHECK(ncfsm_loop_new(NULL, &loop) == NCFSM_OK);
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  bo.kind = NCFSM_BOOT_LOCAL;
  bo.local_group = group;
  bo.rank = x->rank;
  bo.size = N;
  bo.timeout_ms = 10000;
  CHECK(ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &x->boot) == NCFSM_OK);
  first_boot = x->boot;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  so.has_revoke = var != V_NO_REVOKE;
  ncfsm_comm_opts o;
  test_comm_opts(&o, &so);
  o.on_error = NCFSM_ON_ERROR_SHRINK;
  o.timeout_ms = 20000;
  o.name = "train";
  CHECK(ncfsm_comm_new(loop, &o, &x->comm) == NCFSM_OK);
  CHECK(ncfsm_comm_init_boot(x->comm, x->boot) == NCFSM_OK);
  CHECK(ncfsm_comm_wait_state(x->comm, NCFSM_STATE_READY, 10000) == NCFSM_OK);
  ncfsm_recovery_opts ro = {x->boot, &o, on_recovered, x};
  CHECK(ncfsm_comm_set_recovery(x->comm, &ro) == NCFSM_OK);
  for (int o2 = 0; o2 < N; o2++) x->member[o2] = true;
  int retries = 0;
  for (int i = 0; i < ITERS; i++) {
    if (var != V_MANUAL && x->rank == N - 1 && i == K) {
      /* dies: stops and closes its bootstrap; its comm is left as it is */
      x->r->done_iters = i;
      ncfsm_boot_close(x->boot);
      x->boot = NULL;
      goto out_dead;
    }
    if (var == V_MANUAL && i == K) { /* every rank asks for a recovery at the same point */
      int seen = x->r->recoveries;
      CHECK(ncfsm_comm_recover(x->comm) == NCFSM_OK);
      double until = now_ms() + 20000;
      while (x->r->recoveries == seen && now_ms() < until) ncfsm_loop_run(loop, NCFSM_RUN_ONCE);
      CHECK(x->r->recoveries > seen && x->r->status == NCFSM_OK);
      ncfsm_comm_release(x->old);
    }
    int32_t want = 0;
    for (int m = 0; m < N; m++)
      if (x->member[m]) want += (m + 1) * 100 + i;
    for (int k = 0; k < 64; k++) buf[k] = (x->rank + 1) * 100 + i;
    int seen = x->r->recoveries;
    ncfsm_work *w = NULL;
    ncfsm_result_t sr = ncfsm_allreduce(x->comm, buf, buf, 64, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w);
    ncfsm_result_t st = sr == NCFSM_OK ? ncfsm_work_wait(w, 30000) : sr;
    if (w) ncfsm_work_release(w);
    if (st == NCFSM_OK) {
      if (buf[0] != want || buf[63] != want) x->r->wrong++;
      continue;
    }
    CHECK(++retries <= 2);
    double until = now_ms() + 20000;
    while (x->r->recoveries == seen && now_ms() < until) ncfsm_loop_run(loop, NCFSM_RUN_ONCE);
    CHECK(x->r->recoveries > seen);
    CHECK(x->r->status == NCFSM_OK);
    ncfsm_comm_release(x->old);
    i--; /* redo it on the new comm */
  }
  x->r->done_iters = ITERS;
  x->r->final_size = ncfsm_comm_size(x->comm);
  /* the job ends: the others close their bootstraps one by one; every rank
   * disarms first, then a barrier, then the closes */
  CHECK(ncfsm_comm_set_recovery(x->comm, NULL) == NCFSM_OK);
  CHECK(ncfsm_boot_allgather(x->boot, NULL, NULL, 0) == NCFSM_OK);
out:
  if (x->comm) {
    if (ncfsm_comm_state(x->comm) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(x->comm);
    ncfsm_comm_release(x->comm);
  }
  if (x->boot && x->boot != first_boot) ncfsm_boot_close(x->boot);
  if (first_boot) ncfsm_boot_close(first_boot);
  if (loop) {
    ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
    if (ncfsm_loop_close(loop) != NCFSM_OK && !x->r->fail_at) {
      x->r->fail_at = "loop close";
      fprintf(stderr, "rank %d: loop close: %s\n", x->rank, ncfsm_loop_last_error(loop));
    }
  }
  return NULL;
out_dead:
  /* the dead rank's comm and loop are torn down after the others finished (run()) */
  x->old = x->comm;
  (void)loop;
  return loop;
}

static void run(enum variant v, const char *g) {
  var = v;
  group = g;
  memset(res, 0, sizeof res);
  struct ctx x[N];
  pthread_t th[N];
  for (int r = 0; r < N; r++) {
    memset(&x[r], 0, sizeof x[r]);
    x[r].rank = r;
    x[r].r = &res[r];
    pthread_create(&th[r], NULL, rank_main, &x[r]);
  }
  void *dead_loop = NULL;
  for (int r = 0; r < N; r++) {
    void *ret = NULL;
    pthread_join(th[r], &ret);
    if (r == N - 1 && v != V_MANUAL) dead_loop = ret;
  }
  if (dead_loop) { /* the dead rank's leftovers */
    ncfsm_comm *c = x[N - 1].comm;
    if (ncfsm_comm_state(c) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(c);
    ncfsm_comm_release(c);
    ncfsm_loop_run(dead_loop, NCFSM_RUN_NOWAIT);
    ncfsm_loop_close(dead_loop);
  }
  for (int r = 0; r < N; r++) {
    if (res[r].fail_at) fail_msg("rank %d: %s (%s)", r, res[r].fail_at, res[r].why);
    printf("rank %d: %d iterations, %d wrong, %d recoveries by %s, final size %d; %s\n", r, res[r].done_iters,
           res[r].wrong, res[r].recoveries, res[r].how, res[r].final_size, res[r].why);
  }
}

static void expect_survivors(const char *how) {
  for (int r = 0; r < N - 1; r++) {
    assert_int_equal(res[r].done_iters, ITERS);
    assert_int_equal(res[r].wrong, 0);
    assert_int_equal(res[r].recoveries, 1);
    assert_int_equal(res[r].final_size, N - 1);
    assert_int_equal(res[r].nexcluded, 1);
    assert_string_equal(res[r].how, how);
  }
}

static void test_revoke_then_shrink(void **state) {
  (void)state;
  run(V_REVOKE_SHRINK, "recover-a");
  expect_survivors("shrink");
}

/* Rank 0's revoke fails (its async state turns to an error in REVOKING, as
 * when a dead peer keeps it from quiescence): its comm fails again while
 * its recovery runs; the error policy leaves it to the recovery (no abort
 * under it), which shrinks it from ERROR like the others. */
static void test_revoke_fails(void **state) {
  (void)state;
  ncfsm_test *t;
  ncfsm_test_opts to;
  ncfsm_test_opts_init(&to);
  to.deterministic = 0;
  assert_int_equal(ncfsm_test_begin(&to, &t), NCFSM_OK);
  ncfsm_fault f = {.kind = NCFSM_FAULT_ASYNC_ERROR, .comm = "train", .rank = 0, .when = NCFSM_AT_STATE,
                   .at = 1, .state = NCFSM_STATE_REVOKING};
  assert_true(ncfsm_test_add_fault(t, &f) >= 0);
  run(V_REVOKE_FAILS, "recover-f");
  expect_survivors("shrink");
  assert_true(ncfsm_test_fault_fired(t, 0) == 1);
  assert_int_equal(ncfsm_test_end(t), 0);
}

static void test_without_revoke(void **state) {
  (void)state;
  run(V_NO_REVOKE, "recover-b");
  expect_survivors("shrink");
}

static void test_without_shrink(void **state) {
  (void)state;
  setenv("NCFSM_SIM_NCCL_VERSION", "22600", 1); /* before Shrink (2.27.3) */
  run(V_NO_SHRINK, "recover-c");
  unsetenv("NCFSM_SIM_NCCL_VERSION");
  expect_survivors("reinit");
}

static void test_manual_all_alive(void **state) {
  (void)state;
  run(V_MANUAL, "recover-d");
  for (int r = 0; r < N; r++) {
    assert_int_equal(res[r].done_iters, ITERS);
    assert_int_equal(res[r].wrong, 0);
    assert_int_equal(res[r].recoveries, 1);
    assert_int_equal(res[r].final_size, N);
    assert_int_equal(res[r].nexcluded, 0);
    assert_string_equal(res[r].how, "reinit");
  }
}

/* Misuse: recover without arming; arming twice. */
static void test_misuse(void **state) {
  (void)state;
  ncfsm_comm *c[1];
  ncfsm_sim_opts mso;
  ncfsm_comm_opts mo;
  test_sim_opts(&mso);
  test_comm_opts(&mo, &mso);
  mo.on_error = NCFSM_ON_ERROR_SHRINK;
  ncfsm_loop *loop = ready_comms_with(1, c, &mo);
  assert_int_equal(ncfsm_comm_recover(c[0]), NCFSM_ERR_INVALID_USAGE);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "ncfsm_comm_set_recovery"));
  ncfsm_recovery_opts ro = {NULL, NULL, NULL, NULL};
  assert_int_equal(ncfsm_comm_set_recovery(c[0], &ro), NCFSM_ERR_INVALID_ARGUMENT);
  /* the new comm's options are checked when the recovery is armed */
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  bo.kind = NCFSM_BOOT_LOCAL;
  bo.local_group = "recover-misuse";
  bo.rank = 0;
  bo.size = 1;
  ncfsm_boot *b;
  assert_int_equal(ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &b), NCFSM_OK);
  ncfsm_comm_opts bad;
  assert_int_equal(ncfsm_comm_opts_init(&bad), NCFSM_OK);
  bad.on_error = (ncfsm_error_policy_t)99;
  ncfsm_recovery_opts rb = {b, &bad, NULL, NULL};
  assert_int_equal(ncfsm_comm_set_recovery(c[0], &rb), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_last_error(), "on_error"));
  /* a refused ncfsm_loop_close leaves an armed recovery armed: it still
   * recovers (it was cancelled before the close's busy check) */
  struct ctx x = {.rank = 0, .r = &res[0]};
  memset(&res[0], 0, sizeof res[0]);
  x.member[0] = true;
  ncfsm_recovery_opts ok = {b, NULL, on_recovered, &x};
  assert_int_equal(ncfsm_comm_set_recovery(c[0], &ok), NCFSM_OK);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_ERR_BUSY);
  assert_int_equal(ncfsm_comm_recover(c[0]), NCFSM_OK);
  double until = now_ms() + 10000;
  while (res[0].recoveries == 0 && now_ms() < until) ncfsm_loop_run(loop, NCFSM_RUN_ONCE);
  assert_int_equal(res[0].recoveries, 1);
  if (res[0].status != NCFSM_OK) fail_msg("recovery: %s: %s", ncfsm_err_name(res[0].status), res[0].why);
  ncfsm_comm_set_recovery(x.comm, NULL);
  assert_int_equal(ncfsm_comm_release(x.old), NCFSM_OK);
  assert_int_equal(ncfsm_comm_abort(x.comm), NCFSM_OK);
  assert_int_equal(ncfsm_comm_release(x.comm), NCFSM_OK);
  if (x.boot && x.boot != b) ncfsm_boot_close(x.boot);
  ncfsm_boot_close(b); /* before the loop: it runs on the loop's base */
  run_turns(loop, 2);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_revoke_then_shrink), cmocka_unit_test(test_revoke_fails), cmocka_unit_test(test_without_revoke),
      cmocka_unit_test(test_without_shrink),     cmocka_unit_test(test_manual_all_alive),
      cmocka_unit_test(test_misuse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
