/* Verified comms of several ranks on the active list (docs/design.md "The hot path"): with
 * verification on (the default), an idle comm is not visited by the turns, and what its
 * verifier must look at later reaches it: from a rank on the same loop directly, from a rank
 * on another loop through that loop's attention stack. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "fsm/objects.h"
#include "helpers.h"

/* Failed: in ERROR, or past it on the default error policy (abort). */
static bool failed(const ncfsm_comm *c) {
  ncfsm_state_t s = ncfsm_comm_state(c);
  return s == NCFSM_STATE_ERROR || s == NCFSM_STATE_ABORT_QUEUED || s == NCFSM_STATE_CLOSING || s == NCFSM_STATE_CLOSED;
}

static int listed(const ncfsm_loop *loop) {
  int n = 0;
  for (const ncfsm_comm *c = loop->act_head; c; c = c->act_next) n++;
  return n;
}

/* 3 ranks of one clique on one loop, verified in memory: idle before and after a collective. */
static void test_idle_verified_clique_not_visited(void **state) {
  (void)state;
  ncfsm_comm *c[3];
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  o.verify = NCFSM_VERIFY_ASYNC;
  ncfsm_loop *loop = ready_comms_with(3, c, &o);
  run_turns(loop, 4);
  assert_int_equal(listed(loop), 0);
  int32_t buf[3][4] = {{0}};
  ncfsm_work *w[3];
  for (int k = 0; k < 3; k++) {
    for (int r = 0; r < 3; r++)
      assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[r]),
                       NCFSM_OK);
    assert_int_equal(listed(loop), 3);
    for (int r = 0; r < 3; r++) assert_int_equal(ncfsm_work_wait(w[r], 10000), NCFSM_OK);
    run_turns(loop, 4);
    assert_int_equal(listed(loop), 0); /* compared, nothing left: no turn visits them */
    for (int r = 0; r < 3; r++) { /* compared by whichever rank launched last */
      assert_true(ncfsm_work_evidence(w[r]) & NCFSM_EVIDENCE_VERIFIED);
      ncfsm_work_release(w[r]);
    }
  }
  teardown_all(loop, c, 3);
}

/* Rank 1 on loop B fails (an async error at its first op) while rank 0 sits idle on loop A,
 * off A's active list: the failure pushes rank 0's comm on A's attention stack, and A's next
 * turn fails it naming rank 1. */
static void test_peer_failure_across_loops(void **state) {
  (void)state;
  ncfsm_loop *la, *lb;
  assert_int_equal(ncfsm_loop_new(NULL, &la), NCFSM_OK);
  assert_int_equal(ncfsm_loop_new(NULL, &lb), NCFSM_OK);
  ncfsm_sim_opts so0, so1;
  ncfsm_comm_opts o0, o1;
  test_sim_opts(&so0);
  test_sim_opts(&so1);
  so1.async_error_at_op = 0;
  test_comm_opts(&o0, &so0);
  test_comm_opts(&o1, &so1);
  o0.verify = o1.verify = NCFSM_VERIFY_ASYNC;
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
  ncfsm_comm *c0, *c1;
  assert_int_equal(ncfsm_comm_new(la, &o0, &c0), NCFSM_OK);
  assert_int_equal(ncfsm_comm_new(lb, &o1, &c1), NCFSM_OK);
  assert_int_equal(ncfsm_comm_init(c0, 2, 0, &id), NCFSM_OK);
  assert_int_equal(ncfsm_comm_init(c1, 2, 1, &id), NCFSM_OK);
  for (int i = 0; i < 10000 && (ncfsm_comm_state(c0) != NCFSM_STATE_READY || ncfsm_comm_state(c1) != NCFSM_STATE_READY);
       i++) {
    run_turns(la, 1);
    run_turns(lb, 1);
  }
  assert_int_equal(ncfsm_comm_state(c0), NCFSM_STATE_READY);
  assert_int_equal(ncfsm_comm_state(c1), NCFSM_STATE_READY);
  run_turns(la, 4);
  run_turns(lb, 4);
  assert_int_equal(listed(la), 0);
  assert_null(atomic_load(&la->att_head));

  int32_t buf[4] = {0};
  ncfsm_work *w;
  assert_int_equal(ncfsm_allreduce(c1, buf, buf, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w), NCFSM_OK);
  for (int i = 0; i < 10000 && !failed(c1); i++) run_turns(lb, 1);
  assert_true(failed(c1));
  /* loop A has not turned: rank 0's comm waits on its stack, not on its list */
  assert_ptr_equal(atomic_load(&la->att_head), c0);
  assert_int_equal(listed(la), 0);
  assert_int_equal(ncfsm_comm_state(c0), NCFSM_STATE_READY);
  run_turns(la, 2);
  assert_null(atomic_load(&la->att_head));
  assert_true(failed(c0));
  const char *why = ncfsm_comm_failure(c0);
  assert_non_null(why);
  assert_non_null(strstr(why, "rank 1's comm failed first"));
  assert_non_null(strstr(why, "NCFSM_ERR_PEER"));
  run_turns(la, 4);
  assert_int_equal(listed(la), 0); /* failed and told: nothing more to look at */

  ncfsm_work_release(w);
  teardown_all(la, &c0, 1);
  teardown_all(lb, &c1, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_idle_verified_clique_not_visited),
      cmocka_unit_test(test_peer_failure_across_loops),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
