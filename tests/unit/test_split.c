/*
 * Split, shrink and grow through the engine (issue 10; R7, R8), on the sim:
 * one thread drives every rank's comm on one loop. The parent is SPLITTING
 * (or SHRINKING) until the sim writes the child's handle, the child
 * CHILD_QUEUED without a handle until then (R8), then it polls its own
 * init to READY; ops queued on the child meanwhile run after; a parent that
 * fails first fails its child; every misuse is refused with a message.
 */
#include <stdio.h>
#include <string.h>

#include "helpers.h"

#define N 4

static int32_t buf[N][8];

static ncfsm_comm *child_of(ncfsm_loop *loop, ncfsm_sim_opts *so, const char *name) {
  ncfsm_comm_opts o;
  test_comm_opts(&o, so);
  o.name = name;
  o.on_error = NCFSM_ON_ERROR_STAY;
  ncfsm_comm *c;
  assert_int_equal(ncfsm_comm_new(loop, &o, &c), NCFSM_OK);
  return c;
}

static ncfsm_loop *parents(ncfsm_comm **p, int n, ncfsm_sim_opts *so) {
  ncfsm_comm_opts o;
  test_comm_opts(&o, so);
  o.on_error = NCFSM_ON_ERROR_STAY;
  return ready_comms_with(n, p, &o);
}

static void run_until_all(ncfsm_loop *loop, ncfsm_comm **c, int n, ncfsm_state_t s) {
  for (int i = 0; i < 20000; i++) {
    int k = 0;
    for (int r = 0; r < n; r++) k += !c[r] || ncfsm_comm_state(c[r]) == s;
    if (k == n) return;
    run_turns(loop, 1);
  }
  for (int r = 0; r < n; r++)
    if (c[r] && ncfsm_comm_state(c[r]) != s)
      fail_msg("comm %d in %s, want %s (%s)", r, ncfsm_state_name(ncfsm_comm_state(c[r])), ncfsm_state_name(s),
               ncfsm_comm_failure(c[r]));
}

static void close_all(ncfsm_comm **c, int n) {
  for (int r = 0; r < n; r++) {
    if (!c[r]) continue;
    if (ncfsm_comm_state(c[r]) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(c[r]);
    ncfsm_comm_release(c[r]);
    c[r] = NULL;
  }
}

/* AllReduce SUM of (rank + 1) over the given comms: every rank gets the sum. */
static void allreduce_check(ncfsm_loop *loop, ncfsm_comm **c, int n, int32_t want) {
  reset_cbs();
  for (int r = 0; r < n; r++) {
    for (int i = 0; i < 8; i++) buf[r][i] = ncfsm_comm_rank(c[r]) + 1;
    assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb,
                                     (void *)(intptr_t)r, NULL),
                     NCFSM_OK);
  }
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  for (int r = 0; r < n; r++) {
    assert_int_equal(cb_count[r], 1);
    assert_int_equal(cb_status[r], NCFSM_OK);
    assert_int_equal(buf[r][7], want);
  }
}

/* 4 ranks: colors 0,1,0,1, keys reversing the order; R8's shape. */
static void test_split_colors(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  so.split_polls = 3;
  ncfsm_comm *p[N], *ch[N];
  ncfsm_loop *loop = parents(p, N, &so);
  for (int r = 0; r < N; r++) {
    ch[r] = child_of(loop, &so, "split");
    assert_int_equal(ncfsm_comm_split(p[r], r % 2, N - r, ch[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_state(p[r]), NCFSM_STATE_SPLITTING);
    assert_int_equal(ncfsm_comm_state(ch[r]), NCFSM_STATE_CHILD_QUEUED);
  }
  /* before READY a split child's size is unknown: rooted, p2p and per-rank-sized ops are refused */
  int32_t tmp[8] = {0};
  assert_int_equal(ncfsm_broadcast(ch[1], tmp, tmp, 8, NCFSM_INT32, 0, NULL, NULL, NULL, NULL), NCFSM_ERR_ILLEGAL_STATE);
  assert_non_null(strstr(ncfsm_comm_last_error(ch[1]), "ncfsm_broadcast"));
  assert_non_null(strstr(ncfsm_comm_last_error(ch[1]), "READY"));
  /* an op on a child queues until it is READY */
  reset_cbs();
  int32_t early[8] = {0};
  assert_int_equal(ncfsm_allreduce(ch[0], early, early, 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb,
                                   (void *)(intptr_t)9, NULL),
                   NCFSM_OK);
  run_until_all(loop, p, N, NCFSM_STATE_READY);
  run_until_all(loop, ch, N, NCFSM_STATE_READY);
  for (int r = 0; r < N; r++) {
    assert_int_equal(ncfsm_comm_size(ch[r]), 2);
    /* color 0: parent ranks 0 and 2, keys 4 and 2: parent 2 is child rank 0 */
    assert_int_equal(ncfsm_comm_rank(ch[r]), r < 2 ? 1 : 0);
  }
  /* the early op's peer is child rank 0 of color 0: parent 2's child */
  int32_t peer[8] = {0};
  assert_int_equal(ncfsm_allreduce(ch[2], peer, peer, 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL),
                   NCFSM_OK);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  assert_int_equal(cb_count[9], 1);
  assert_int_equal(cb_status[9], NCFSM_OK);
  /* ranks 1 and 3: color 1 */
  ncfsm_comm *c1[2] = {ch[1], ch[3]}, *c0[2] = {ch[0], ch[2]};
  allreduce_check(loop, c0, 2, 3);
  allreduce_check(loop, c1, 2, 3);
  close_all(ch, N);
  teardown_all(loop, p, N);
}

static void test_split_nocolor(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  ncfsm_comm *p[3], *ch[3] = {NULL, NULL, NULL};
  ncfsm_loop *loop = parents(p, 3, &so);
  for (int r = 0; r < 3; r++) {
    if (r < 2) ch[r] = child_of(loop, &so, "split");
    assert_int_equal(ncfsm_comm_split(p[r], r < 2 ? 7 : NCFSM_SPLIT_NOCOLOR, r, ch[r]), NCFSM_OK);
  }
  run_until_all(loop, p, 3, NCFSM_STATE_READY);
  run_until_all(loop, ch, 2, NCFSM_STATE_READY);
  assert_int_equal(ncfsm_comm_size(ch[0]), 2);
  allreduce_check(loop, ch, 2, 3);
  close_all(ch, 2);
  teardown_all(loop, p, 3);
}

/* Misuse: refused before NCCL sees it, with the state, the call and a hint. */
static void test_split_misuse(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  ncfsm_comm *p[2];
  ncfsm_loop *loop = parents(p, 2, &so);
  ncfsm_comm *ch = child_of(loop, &so, "split");
  /* unfinished work on the parent: guard IDLE */
  assert_int_equal(ncfsm_allreduce(p[0], buf[0], buf[0], 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL),
                   NCFSM_OK);
  run_turns(loop, 3);
  assert_int_equal(ncfsm_comm_split(p[0], 0, 0, ch), NCFSM_ERR_ILLEGAL_STATE);
  assert_non_null(strstr(ncfsm_comm_last_error(p[0]), "ncfsm_comm_split"));
  assert_non_null(strstr(ncfsm_comm_last_error(p[0]), "IDLE"));
  assert_int_equal(ncfsm_comm_state(ch), NCFSM_STATE_NEW);
  assert_int_equal(ncfsm_allreduce(p[1], buf[1], buf[1], 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL),
                   NCFSM_OK);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  /* NOCOLOR with a child, a negative color, the parent as its own child */
  assert_int_equal(ncfsm_comm_split(p[0], NCFSM_SPLIT_NOCOLOR, 0, ch), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_comm_split(p[0], -5, 0, ch), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_comm_split(p[0], 0, 0, p[1]), NCFSM_ERR_ILLEGAL_STATE);
  assert_non_null(strstr(ncfsm_comm_last_error(p[1]), "NEW"));
  /* a child with strict verification (it needs a bootstrap of the child's ranks) */
  ncfsm_comm_opts o;
  test_comm_opts(&o, &so);
  o.verify = NCFSM_VERIFY_STRICT;
  ncfsm_comm *vch;
  assert_int_equal(ncfsm_comm_new(loop, &o, &vch), NCFSM_OK);
  assert_int_equal(ncfsm_comm_split(p[0], 0, 0, vch), NCFSM_ERR_INVALID_USAGE);
  assert_non_null(strstr(ncfsm_comm_last_error(vch), "verify"));
  /* shrink: excluding itself, nothing, everyone, out of range, twice */
  int self = 0, ex2[2] = {1, 1}, bad = 5;
  assert_int_equal(ncfsm_comm_shrink(p[0], &self, 1, 0, ch), NCFSM_ERR_INVALID_USAGE);
  assert_non_null(strstr(ncfsm_comm_last_error(p[0]), "must not call it"));
  assert_int_equal(ncfsm_comm_shrink(p[0], &self, 0, 0, ch), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_comm_shrink(p[0], &bad, 1, 0, ch), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_comm_shrink(p[0], ex2, 2, 0, ch), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_comm_shrink(p[0], &ex2[0], 1, 4, ch), NCFSM_ERR_INVALID_ARGUMENT);
  /* grow without ncclCommGrow in the modelled runtime */
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_comm_grow_id(p[0], &id), NCFSM_ERR_UNSUPPORTED);
  assert_non_null(strstr(ncfsm_comm_last_error(p[0]), "2.29"));
  memset(&id, 0, sizeof id);
  assert_int_equal(ncfsm_comm_grow(p[0], 3, &id, -1, ch), NCFSM_ERR_UNSUPPORTED);
  assert_int_equal(ncfsm_comm_state(ch), NCFSM_STATE_NEW);
  assert_int_equal(ncfsm_comm_state(p[0]), NCFSM_STATE_READY);
  ncfsm_comm_release(vch);
  ncfsm_comm_release(ch);
  teardown_all(loop, p, 2);
}

/* The parent is aborted while its split is in progress: the child fails,
 * naming the parent. */
static void test_split_parent_aborted(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  so.split_polls = NEVER;
  ncfsm_comm *p[2], *ch[2];
  ncfsm_loop *loop = parents(p, 2, &so);
  for (int r = 0; r < 2; r++) {
    ch[r] = child_of(loop, &so, "split");
    assert_int_equal(ncfsm_comm_split(p[r], 0, r, ch[r]), NCFSM_OK);
  }
  run_turns(loop, 5);
  assert_int_equal(ncfsm_comm_state(p[0]), NCFSM_STATE_SPLITTING);
  assert_int_equal(ncfsm_comm_abort(p[0]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_state(ch[0]), NCFSM_STATE_INIT_FAILED);
  assert_non_null(strstr(ncfsm_comm_failure(ch[0]), "parent"));
  assert_int_equal(ncfsm_comm_state(ch[1]), NCFSM_STATE_CHILD_QUEUED);
  close_all(ch, 2);
  teardown_all(loop, p, 2);
}

/* Shrink, default mode: rank 2 leaves; the survivors' child has 3 ranks,
 * renumbered in parent order, and the parents stay READY. */
static void test_shrink_default(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  ncfsm_comm *p[N], *ch[N] = {NULL, NULL, NULL, NULL};
  ncfsm_loop *loop = parents(p, N, &so);
  int ex = 2;
  for (int r = 0; r < N; r++) {
    if (r == ex) continue;
    ch[r] = child_of(loop, &so, "shrunk");
    assert_int_equal(ncfsm_comm_shrink(p[r], &ex, 1, NCFSM_SHRINK_DEFAULT, ch[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_size(ch[r]), 3);
    assert_int_equal(ncfsm_comm_rank(ch[r]), r < ex ? r : r - 1);
  }
  ncfsm_comm *surv[3] = {ch[0], ch[1], ch[3]}, *psurv[3] = {p[0], p[1], p[3]};
  run_until_all(loop, surv, 3, NCFSM_STATE_READY);
  run_until_all(loop, psurv, 3, NCFSM_STATE_READY);
  allreduce_check(loop, surv, 3, 6);
  close_all(ch, N);
  teardown_all(loop, p, N);
}

/* Shrink, abort mode, with a collective stuck on a dead rank: the stuck
 * works fail once (ABORTED), the parents end in ERROR saying to abort them
 * (R7), the survivors' child works. */
static void test_shrink_abort_dead_rank(void **state) {
  (void)state;
  ncfsm_sim_opts so, dead;
  test_sim_opts(&so);
  dead = so;
  dead.dead = 1;
  ncfsm_comm *p[N], *ch[N] = {NULL, NULL, NULL, NULL};
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
  for (int r = 0; r < N; r++) {
    ncfsm_comm_opts o;
    test_comm_opts(&o, r == 1 ? &dead : &so);
    o.on_error = NCFSM_ON_ERROR_STAY;
    assert_int_equal(ncfsm_comm_new(loop, &o, &p[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_init(p[r], N, r, &id), NCFSM_OK);
  }
  run_until_all(loop, p, N, NCFSM_STATE_READY);
  reset_cbs();
  for (int r = 0; r < N; r++)
    if (r != 1)
      assert_int_equal(ncfsm_allreduce(p[r], buf[r], buf[r], 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, count_cb,
                                       (void *)(intptr_t)r, NULL),
                       NCFSM_OK);
  run_turns(loop, 20);
  for (int r = 0; r < N; r++) assert_int_equal(cb_count[r], 0); /* stuck: rank 1 is dead */
  int ex = 1;
  for (int r = 0; r < N; r++) {
    if (r == ex) continue;
    ch[r] = child_of(loop, &so, "survivors");
    assert_int_equal(ncfsm_comm_shrink(p[r], &ex, 1, NCFSM_SHRINK_ABORT, ch[r]), NCFSM_OK);
  }
  ncfsm_comm *surv[3] = {ch[0], ch[2], ch[3]}, *psurv[3] = {p[0], p[2], p[3]};
  run_until_all(loop, surv, 3, NCFSM_STATE_READY);
  run_until_all(loop, psurv, 3, NCFSM_STATE_SHRUNK); /* R7: only abort remains */
  for (int r = 0; r < N; r++) {
    if (r == ex) continue;
    assert_int_equal(cb_count[r], 1);
    assert_int_equal(cb_status[r], NCFSM_ERR_ABORTED);
    assert_non_null(strstr(ncfsm_comm_failure(p[r]), "R7"));
  }
  allreduce_check(loop, surv, 3, 6);
  for (int r = 0; r < N; r++)
    if (r != ex) assert_int_equal(ncfsm_comm_destroy(p[r]), NCFSM_ERR_ILLEGAL_STATE); /* R7: abort, not destroy */
  close_all(ch, N);
  teardown_all(loop, p, N);
}

/* Shrink of a failed comm (abort mode) and of a revoked one. */
static void test_shrink_after_failure(void **state) {
  (void)state;
  for (int revoked = 0; revoked < 2; revoked++) {
    ncfsm_sim_opts so;
    test_sim_opts(&so);
    so.async_error_at_op = revoked ? -1 : 0;
    ncfsm_comm *p[3], *ch[3] = {NULL, NULL, NULL};
    ncfsm_loop *loop = parents(p, 3, &so);
    if (revoked) {
      for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_revoke(p[r]), NCFSM_OK);
      run_until_all(loop, p, 2, NCFSM_STATE_REVOKED);
    } else {
      for (int r = 0; r < 3; r++)
        assert_int_equal(ncfsm_allreduce(p[r], buf[r], buf[r], 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL),
                         NCFSM_OK);
      run_until_all(loop, p, 2, NCFSM_STATE_ERROR);
      /* default mode is refused on a failed comm, with the way out */
      ncfsm_comm *tmp = child_of(loop, &so, "tmp");
      int ex = 2;
      assert_int_equal(ncfsm_comm_shrink(p[0], &ex, 1, NCFSM_SHRINK_DEFAULT, tmp), NCFSM_ERR_ILLEGAL_STATE);
      assert_non_null(strstr(ncfsm_comm_last_error(p[0]), "NCFSM_SHRINK_ABORT"));
      ncfsm_comm_release(tmp);
    }
    int ex = 2;
    for (int r = 0; r < 2; r++) {
      ch[r] = child_of(loop, &so, "survivors");
      assert_int_equal(ncfsm_comm_shrink(p[r], &ex, 1, NCFSM_SHRINK_ABORT, ch[r]), NCFSM_OK);
    }
    run_until_all(loop, ch, 2, NCFSM_STATE_READY);
    /* R7: a parent shrunk with its work terminated, revoked or failed before,
     * lands in SHRUNK, whose only exit is abort (the fuzzer found a revoked
     * parent landing in REVOKED, where destroy reached NCCL, which refuses it;
     * NCCL 2.31+ hangs survivors that destroy it) */
    run_until_all(loop, p, 2, NCFSM_STATE_SHRUNK);
    for (int r = 0; r < 2; r++) {
      uint64_t before = backend_calls(p[r]);
      assert_int_equal(ncfsm_comm_destroy(p[r]), NCFSM_ERR_ILLEGAL_STATE);
      assert_non_null(strstr(ncfsm_comm_last_error(p[r]), "ncfsm_comm_abort"));
      assert_int_equal(backend_calls(p[r]), before);
      assert_int_equal(ncfsm_comm_state(p[r]), NCFSM_STATE_SHRUNK);
    }
    close_all(ch, 2);
    teardown_all(loop, p, 3);
  }
}

/* Grow, where the modelled runtime has it: 2 existing ranks and 1 joiner. */
static void test_grow(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  so.has_grow = 1;
  ncfsm_comm *p[2], *ch[3];
  ncfsm_loop *loop = parents(p, 2, &so);
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_comm_grow_id(p[0], &id), NCFSM_OK);
  for (int r = 0; r < 2; r++) {
    ch[r] = child_of(loop, &so, "grown");
    assert_int_equal(ncfsm_comm_grow(p[r], 3, &id, -1, ch[r]), NCFSM_OK);
  }
  ch[2] = child_of(loop, &so, "joiner");
  assert_int_equal(ncfsm_comm_grow(NULL, 3, &id, 2, ch[2]), NCFSM_OK);
  run_until_all(loop, ch, 3, NCFSM_STATE_READY);
  run_until_all(loop, p, 2, NCFSM_STATE_READY);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(ncfsm_comm_rank(ch[r]), r);
    assert_int_equal(ncfsm_comm_size(ch[r]), 3);
  }
  allreduce_check(loop, ch, 3, 6);
  /* a joiner's rank must be from the old size up; an existing rank passes -1 */
  ncfsm_comm *bad = child_of(loop, &so, "bad");
  assert_int_equal(ncfsm_comm_grow(NULL, 3, &id, 3, bad), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_comm_grow(p[0], 3, &id, 0, bad), NCFSM_ERR_INVALID_ARGUMENT);
  ncfsm_comm_release(bad);
  close_all(ch, 3);
  teardown_all(loop, p, 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split_colors),        cmocka_unit_test(test_split_nocolor),
      cmocka_unit_test(test_split_misuse),        cmocka_unit_test(test_split_parent_aborted),
      cmocka_unit_test(test_shrink_default),      cmocka_unit_test(test_shrink_abort_dead_rank),
      cmocka_unit_test(test_shrink_after_failure), cmocka_unit_test(test_grow),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
