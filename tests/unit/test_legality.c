/*
 * Walks EVERY (state, API call) cell of the legality table in fsm/comm.def on
 * the sim: puts a fresh communicator in the state, makes the call with valid
 * arguments, and checks the decision (return code) and whether the backend
 * was reached (engine-side count of backend calls for that comm).
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "helpers.h"

static int32_t sbuf[16], rbuf[16];
static int32_t setup_s[16], setup_r[16]; /* ops made while entering a state: no R12 overlap */

/* Put c[0] (rank 0 of a clique of 1, or of 2 for INIT_IN_PROGRESS) in state s. */
static void enter_state(ncfsm_loop *loop, ncfsm_state_t s, ncfsm_comm **c, int *n) {
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  o.on_error = NCFSM_ON_ERROR_STAY;
  *n = 1;
  switch (s) {
    case NCFSM_STATE_NEW:
      assert_int_equal(ncfsm_comm_new(loop, &o, &c[0]), NCFSM_OK);
      return;
    case NCFSM_STATE_INIT_IN_PROGRESS: /* rank 1 never arrives (R1) */
      *n = 2;
      make_comms(loop, 2, &o, c, 1);
      run_turns(loop, 3);
      assert_int_equal(ncfsm_comm_state(c[0]), s);
      return;
    case NCFSM_STATE_LAUNCH_IN_PROGRESS: so.launch_polls = NEVER; break;
    case NCFSM_STATE_ERROR: so.async_error_at_op = 0; break;
    case NCFSM_STATE_FINALIZING: so.finalize_polls = NEVER; break;
    case NCFSM_STATE_REVOKING: so.revoke_polls = NEVER; break;
    default: break;
  }
  make_comms(loop, 1, &o, c, 0);
  run_until_state(loop, c[0], NCFSM_STATE_READY);
  switch (s) {
    case NCFSM_STATE_READY: break;
    case NCFSM_STATE_GROUP_OPEN:
      assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
      assert_int_equal(ncfsm_allreduce(c[0], setup_s, setup_r, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
      break;
    case NCFSM_STATE_LAUNCH_IN_PROGRESS:
    case NCFSM_STATE_ERROR:
      assert_int_equal(ncfsm_allreduce(c[0], setup_s, setup_r, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
      run_until_state(loop, c[0], s);
      break;
    case NCFSM_STATE_FINALIZING:
      assert_int_equal(ncfsm_comm_finalize(c[0]), NCFSM_OK);
      run_turns(loop, 3);
      break;
    case NCFSM_STATE_FINALIZED:
      assert_int_equal(ncfsm_comm_finalize(c[0]), NCFSM_OK);
      run_until_state(loop, c[0], s);
      break;
    case NCFSM_STATE_REVOKING:
      assert_int_equal(ncfsm_comm_revoke(c[0]), NCFSM_OK);
      run_turns(loop, 3);
      break;
    case NCFSM_STATE_REVOKED:
      assert_int_equal(ncfsm_comm_revoke(c[0]), NCFSM_OK);
      run_until_state(loop, c[0], s);
      break;
    case NCFSM_STATE_CLOSED:
      assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
      break;
    default:
      fail_msg("no recipe for state %s", ncfsm_state_name(s));
  }
  assert_int_equal(ncfsm_comm_state(c[0]), s);
}

static ncfsm_result_t make_call(ncfsm_loop *loop, ncfsm_comm *c, ncfsm_call_t call) {
  ncfsm_unique_id id;
  switch (call) {
    case NCFSM_CALL_INIT:
      assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
      return ncfsm_comm_init(c, 1, 0, &id);
    case NCFSM_CALL_ALLREDUCE: return ncfsm_allreduce(c, sbuf, rbuf, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL);
    case NCFSM_CALL_BROADCAST: return ncfsm_broadcast(c, sbuf, rbuf, 4, NCFSM_INT32, 0, NULL, NULL, NULL, NULL);
    case NCFSM_CALL_REDUCE: return ncfsm_reduce(c, sbuf, rbuf, 4, NCFSM_INT32, NCFSM_OP_SUM, 0, NULL, NULL, NULL, NULL);
    case NCFSM_CALL_ALLGATHER: return ncfsm_allgather(c, sbuf, rbuf, 4, NCFSM_INT32, NULL, NULL, NULL, NULL);
    case NCFSM_CALL_REDUCESCATTER: return ncfsm_reducescatter(c, sbuf, rbuf, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL);
    case NCFSM_CALL_ALLTOALL: return ncfsm_alltoall(c, sbuf, rbuf, 4, NCFSM_INT32, NULL, NULL, NULL, NULL);
    case NCFSM_CALL_GATHER: return ncfsm_gather(c, sbuf, rbuf, 4, NCFSM_INT32, 0, NULL, NULL, NULL, NULL);
    case NCFSM_CALL_SCATTER: return ncfsm_scatter(c, sbuf, rbuf, 4, NCFSM_INT32, 0, NULL, NULL, NULL, NULL);
    case NCFSM_CALL_SEND: return ncfsm_send(c, sbuf, 4, NCFSM_INT32, 0, NULL, NULL, NULL, NULL);
    case NCFSM_CALL_RECV: return ncfsm_recv(c, rbuf, 4, NCFSM_INT32, 0, NULL, NULL, NULL, NULL);
    case NCFSM_CALL_FINALIZE: return ncfsm_comm_finalize(c);
    case NCFSM_CALL_DESTROY: return ncfsm_comm_destroy(c);
    case NCFSM_CALL_ABORT: return ncfsm_comm_abort(c);
    case NCFSM_CALL_REVOKE: return ncfsm_comm_revoke(c);
    case NCFSM_CALL_RELEASE: return ncfsm_comm_release(c);
    default: break;
  }
  (void)loop;
  fail_msg("no call for %d", (int)call);
  return NCFSM_ERR_INVALID_ARGUMENT;
}

static void test_every_cell(void **state) {
  (void)state;
  int cells = 0, allowed = 0, deferred = 0, rejected = 0;
  for (int s = 0; s < NCFSM_STATE_COUNT; s++) {
    for (int k = 0; k < NCFSM_CALL_COUNT; k++) {
      ncfsm_loop *loop;
      assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
      ncfsm_comm *c[2] = {NULL, NULL};
      int n;
      enter_state(loop, (ncfsm_state_t)s, c, &n);
      const char *rule, *hint;
      ncfsm_decision_t d = ncfsm_legality((ncfsm_state_t)s, (ncfsm_call_t)k, &rule, &hint);
      uint64_t before = backend_calls(c[0]);
      ncfsm_result_t rc = make_call(loop, c[0], (ncfsm_call_t)k);
      bool released = k == NCFSM_CALL_RELEASE && rc == NCFSM_OK;
      char where[160];
      snprintf(where, sizeof where, "cell (%s, %s) decision %s", ncfsm_state_name(s),
               ncfsm_call_name(k), ncfsm_decision_name(d));
      if (d == NCFSM_REJECT) {
        if (rc != NCFSM_ERR_ILLEGAL_STATE)
          fail_msg("%s: got %s, want NCFSM_ERR_ILLEGAL_STATE", where, ncfsm_err_name(rc));
        /* The error names the state and the call. */
        const char *err = ncfsm_comm_last_error(c[0]);
        if (!strstr(err, ncfsm_state_name(s)) || !strstr(err, "ncfsm_"))
          fail_msg("%s: last error does not name state and call: %s", where, err);
        if (ncfsm_comm_state(c[0]) != (ncfsm_state_t)s) fail_msg("%s: state changed", where);
        rejected++;
      } else if (rc != NCFSM_OK) {
        fail_msg("%s: got %s (%s)", where, ncfsm_err_name(rc), ncfsm_comm_last_error(c[0]));
      } else {
        d == NCFSM_ALLOW ? allowed++ : deferred++;
      }
      if (released) {
        c[0] = NULL;
      } else {
        if (ncfsm_group_depth(loop) > 0) ncfsm_group_end(loop);
        run_turns(loop, 5);
        uint64_t after = backend_calls(c[0]);
        /* ALLOW reaches the backend, except where no backend comm exists (abort in NEW). */
        bool expect = d == NCFSM_ALLOW && !(s == NCFSM_STATE_NEW && k == NCFSM_CALL_ABORT);
        if (expect && after == before) fail_msg("%s: backend was not reached", where);
        if (!expect && after != before)
          fail_msg("%s: backend was reached %llu time(s)", where, (unsigned long long)(after - before));
      }
      cells++;
      teardown_all(loop, c, n);
    }
  }
  printf("legality: %d cells covered (%d states x %d calls): %d allow, %d defer, %d reject\n", cells,
         NCFSM_STATE_COUNT, NCFSM_CALL_COUNT, allowed, deferred, rejected);
  assert_int_equal(cells, NCFSM_STATE_COUNT * NCFSM_CALL_COUNT);
}

/* Every transition in the table leads to a state, and every state but NEW
 * is reachable from NEW; CLOSED is reachable from every state (abort). */
static void test_table_shape(void **state) {
  (void)state;
  for (int s = 0; s < NCFSM_STATE_COUNT; s++) {
    if (s == NCFSM_STATE_CLOSED) continue;
    if (ncfsm_transition((ncfsm_state_t)s, NCFSM_EV_ABORT, NULL, NULL) != NCFSM_STATE_CLOSED)
      fail_msg("no ABORT from %s", ncfsm_state_name(s));
    ncfsm_decision_t d = ncfsm_legality((ncfsm_state_t)s, NCFSM_CALL_ABORT, NULL, NULL);
    if (d != NCFSM_ALLOW) fail_msg("abort not allowed in %s (R5)", ncfsm_state_name(s));
  }
  /* R2: in every *_IN_PROGRESS state no call but abort/revoke reaches NCCL now. */
  ncfsm_state_t inprog[] = {NCFSM_STATE_INIT_IN_PROGRESS, NCFSM_STATE_LAUNCH_IN_PROGRESS,
                            NCFSM_STATE_REVOKING};
  for (size_t i = 0; i < sizeof inprog / sizeof inprog[0]; i++)
    for (int k = 0; k < NCFSM_CALL_COUNT; k++)
      if (k != NCFSM_CALL_ABORT && k != NCFSM_CALL_REVOKE &&
          ncfsm_legality(inprog[i], (ncfsm_call_t)k, NULL, NULL) == NCFSM_ALLOW)
        fail_msg("R2 violated: %s allowed in %s", ncfsm_call_name(k), ncfsm_state_name(inprog[i]));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_cell),
      cmocka_unit_test(test_table_shape),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
