/*
 * A parent shrunk with NCFSM_SHRINK_ABORT, through the public API, on every
 * NCCL version the sim emulates (NCFSM_SIM_NCCL_VERSION): 2.28.3, 2.28.9 (the
 * default), 2.30.7 (torch 2.15's), 2.31.2 and 2.32.3. NCCL up to 2.30.7
 * returns from a destroy of such a parent; since 2.31.2 it hangs the
 * survivors in an untimed barrier (pytorch#194679; the sim's model of it is
 * test_shrink_abort_destroy_hang in test_sim_split.c). ncfsm's rule is the
 * same on every version (R7, fsm/comm.def SHRUNK): destroy and finalize are
 * refused before NCCL sees them, naming ncfsm_comm_abort; the sim counts no
 * finalize or destroy on that comm; ncfsm_comm_close ends it with abort, so
 * the survivors' close returns on 2.31+ too (a destroy would have failed the
 * close with the sim's ncclSystemError after NCFSM_SIM_WAIT_MS).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

#define N 4
#define EX 3 /* the excluded rank: it aborts its parent, as in NCCL's NCCL_SHRINK_ABORT flow */

static const char *const versions[] = {"22803", "22809", "23007", "23102", "23203"};

static void run_until_all(ncfsm_loop *loop, ncfsm_comm **c, int n, ncfsm_state_t s) {
  for (int r = 0; r < n; r++) run_until_state(loop, c[r], s);
}

static ncfsm_sim_stats sim_stats(const ncfsm_comm *c) {
  ncfsm_sim_stats st;
  assert_int_equal(ncfsm_sim_get_stats(c, &st), NCFSM_OK);
  return st;
}

static int closed[N], child_closed[N];
static ncfsm_result_t close_status[N];

static void on_closed(ncfsm_comm *c, ncfsm_result_t st, void *arg) {
  (void)c;
  int r = (int)(intptr_t)arg;
  closed[r]++;
  close_status[r] = st;
}

static void on_child_closed(ncfsm_comm *c, ncfsm_result_t st, void *arg) {
  (void)c;
  (void)st;
  child_closed[(int)(intptr_t)arg]++;
}

static int all_closed(void) {
  for (int r = 0; r < N - 1; r++)
    if (!closed[r] || !child_closed[r]) return 0;
  return 1;
}

/* 4 READY parents; rank EX aborts its own, ranks 0-2 shrink theirs with
 * NCFSM_SHRINK_ABORT excluding it, and get READY children. */
static ncfsm_loop *shrunk_parents(ncfsm_comm **p, ncfsm_comm **ch, ncfsm_sim_opts *so) {
  ncfsm_comm_opts o;
  test_comm_opts(&o, so);
  o.on_error = NCFSM_ON_ERROR_STAY;
  ncfsm_loop *loop = ready_comms_with(N, p, &o);
  assert_int_equal(ncfsm_comm_abort(p[EX]), NCFSM_OK);
  const int ex = EX;
  o.name = "survivors";
  for (int r = 0; r < N - 1; r++) {
    assert_int_equal(ncfsm_comm_new(loop, &o, &ch[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_shrink(p[r], &ex, 1, NCFSM_SHRINK_ABORT, ch[r]), NCFSM_OK);
    /* while the shrink runs, destroy is refused too */
    assert_int_equal(ncfsm_comm_state(p[r]), NCFSM_STATE_SHRINKING);
    assert_int_equal(ncfsm_comm_destroy(p[r]), NCFSM_ERR_ILLEGAL_STATE);
  }
  run_until_all(loop, ch, N - 1, NCFSM_STATE_READY);
  run_until_all(loop, p, N - 1, NCFSM_STATE_SHRUNK);
  return loop;
}

static void test_destroy_refused_on_every_version(void **state) {
  (void)state;
  setenv("NCFSM_SIM_WAIT_MS", "200", 1);
  for (size_t v = 0; v < sizeof versions / sizeof versions[0]; v++) {
    setenv("NCFSM_SIM_NCCL_VERSION", versions[v], 1);
    print_message("NCFSM_SIM_NCCL_VERSION=%s\n", versions[v]);
    ncfsm_sim_opts so;
    test_sim_opts(&so);
    ncfsm_comm *p[N], *ch[N] = {NULL};
    ncfsm_loop *loop = shrunk_parents(p, ch, &so);
    for (int r = 0; r < N - 1; r++) {
      uint64_t before = backend_calls(p[r]);
      assert_int_equal(ncfsm_comm_destroy(p[r]), NCFSM_ERR_ILLEGAL_STATE);
      const char *e = ncfsm_comm_last_error(p[r]);
      if (!strstr(e, "ncfsm_comm_abort") || !strstr(e, "R7") || !strstr(e, "SHRUNK"))
        fail_msg("version %s: destroy's refusal does not name the state, R7 and ncfsm_comm_abort: %s", versions[v], e);
      assert_int_equal(ncfsm_comm_finalize(p[r]), NCFSM_ERR_ILLEGAL_STATE); /* finalize hangs on 2.31+ too */
      e = ncfsm_comm_last_error(p[r]);
      if (!strstr(e, "ncfsm_comm_abort") || !strstr(e, "SHRUNK"))
        fail_msg("version %s: finalize's refusal does not name the state and ncfsm_comm_abort: %s", versions[v], e);
      assert_int_equal(ncfsm_comm_release(p[r]), NCFSM_ERR_ILLEGAL_STATE);
      run_turns(loop, 3);
      assert_int_equal(backend_calls(p[r]), before); /* nothing reached the sim */
      assert_int_equal(ncfsm_comm_state(p[r]), NCFSM_STATE_SHRUNK);
      ncfsm_sim_stats st = sim_stats(p[r]);
      assert_int_equal(st.destroys, 0);
      assert_int_equal(st.finalizes, 0);
      assert_int_equal(st.shrinks, 1);
    }
    /* close takes the only exit, abort: every survivor's close returns; the children close too */
    memset(closed, 0, sizeof closed);
    memset(child_closed, 0, sizeof child_closed);
    for (int r = 0; r < N - 1; r++) {
      assert_int_equal(ncfsm_comm_close(p[r], on_closed, (void *)(intptr_t)r), NCFSM_OK);
      assert_int_equal(ncfsm_comm_close(ch[r], on_child_closed, (void *)(intptr_t)r), NCFSM_OK);
    }
    for (int i = 0; i < 10000 && !all_closed(); i++) run_turns(loop, 1);
    for (int r = 0; r < N - 1; r++) {
      assert_int_equal(closed[r], 1);
      assert_int_equal(child_closed[r], 1);
      if (close_status[r] != NCFSM_ERR_ABORTED)
        fail_msg("version %s: rank %d's close ended with %s, want NCFSM_ERR_ABORTED (an abort)", versions[v], r,
                 ncfsm_err_name(close_status[r]));
    }
    teardown_all(loop, p + EX, 1);
  }
}

/* Also when a check above failed: the next tests model the default version. */
static int unset_env(void **state) {
  (void)state;
  unsetenv("NCFSM_SIM_NCCL_VERSION");
  unsetenv("NCFSM_SIM_WAIT_MS");
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_destroy_refused_on_every_version, unset_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
