/*
 * Walks EVERY (state, API call) cell of the legality table in fsm/comm.def on
 * the sim: puts a fresh communicator in the state, makes the call with valid
 * arguments, and checks the decision (return code) and whether the backend
 * was reached (engine-side count of backend calls for that comm). CLOSING
 * lasts only while ncclCommDestroy/Abort runs on the loop thread; its cells
 * are reached from a second thread while the sim's destroy is held
 * (NCFSM_SIM_HOLD hook below) where the sim offers that, else checked on the
 * table. A second test makes every guard fail once.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fsm/tables.h"
#include "helpers.h"
#include "ncfsm/bootstrap.h"

static int32_t sbuf[16], rbuf[16];
static ncfsm_comm *kids[2]; /* children made by a recipe and by the call: torn down after each cell */
static int nkids;

static bool is_shrink(ncfsm_call_t k) { return k == NCFSM_CALL_SHRINK || k == NCFSM_CALL_SHRINK_ABORT; }

static ncfsm_comm *new_child(ncfsm_loop *loop) {
  static ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  o.name = "child";
  ncfsm_comm *ch;
  assert_int_equal(ncfsm_comm_new(loop, &o, &ch), NCFSM_OK);
  kids[nkids++] = ch;
  return ch;
}
static int32_t setup_s[16], setup_r[16]; /* ops made while entering a state: no R12 overlap */
static ncfsm_boot *cell_boot;  /* ID_QUEUED, ID_EXCHANGE: the comm's bootstrap, closed after the cell */
static ncfsm_work *cell_work;  /* RELEASED: the work that keeps the released comm's memory */
static ncfsm_comm *cell_parent; /* CHILD_QUEUED: the parent whose split never polls back; CHILD: a READY parent */
static int cell_no;

/* A local bootstrap of size members of which this is the last rank (the others never join: the
 * unique id's root, rank 0, never sends it). */
static ncfsm_boot *open_boot(ncfsm_loop *loop, int size) {
  char group[64];
  snprintf(group, sizeof group, "legality-%d-%d", (int)getpid(), cell_no++);
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  bo.kind = NCFSM_BOOT_LOCAL;
  bo.local_group = group;
  bo.rank = size - 1;
  bo.size = size;
  ncfsm_boot *b = NULL;
  assert_int_equal(ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &b), NCFSM_OK);
  return b;
}

/* Put c[0] (rank 0 of a clique of 1, or of 2 for INIT_IN_PROGRESS and, with
 * two, for the states where a shrink is legal: a shrink needs a rank to
 * exclude) in state s. Returns false for a state the sim cannot hold still
 * from outside (CLOSING). */
static bool enter_state(ncfsm_loop *loop, ncfsm_state_t s, ncfsm_comm **c, int *n, bool two) {
  static ncfsm_sim_opts so; /* outlives the comms: ncfsm_comm_new copies it, a grow child keeps none */
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  so.has_grow = 1;
  o.on_error = NCFSM_ON_ERROR_STAY;
  *n = 1;
  if (s == NCFSM_STATE_SHRINKING) two = true;
  ncfsm_unique_id id;
  switch (s) {
    case NCFSM_STATE_CLOSING:
      return false;
    case NCFSM_STATE_NEW:
      assert_int_equal(ncfsm_comm_new(loop, &o, &c[0]), NCFSM_OK);
      return true;
    case NCFSM_STATE_ID_QUEUED: /* init_boot accepted; the loop has not turned yet */
    case NCFSM_STATE_ID_EXCHANGE: /* rank 1's broadcast waits for rank 0, which never joins */
      assert_int_equal(ncfsm_comm_new(loop, &o, &c[0]), NCFSM_OK);
      cell_boot = open_boot(loop, s == NCFSM_STATE_ID_QUEUED ? 1 : 2);
      assert_int_equal(ncfsm_comm_init_boot(c[0], cell_boot), NCFSM_OK);
      if (s == NCFSM_STATE_ID_EXCHANGE) run_turns(loop, 3);
      assert_int_equal(ncfsm_comm_state(c[0]), s);
      return true;
    case NCFSM_STATE_CHILD_QUEUED: { /* the parent's shrink never polls back to success (R8); a
                                        shrink's child knows its rank and size (guard SIZED) */
      so.split_polls = NEVER;
      ncfsm_comm *p[2];
      make_comms(loop, 2, &o, p, 0);
      run_until_state(loop, p[0], NCFSM_STATE_READY);
      run_until_state(loop, p[1], NCFSM_STATE_READY);
      cell_parent = p[0];
      kids[nkids++] = p[1];
      int ex = 1;
      assert_int_equal(ncfsm_comm_new(loop, &o, &c[0]), NCFSM_OK);
      assert_int_equal(ncfsm_comm_shrink(cell_parent, &ex, 1, NCFSM_SHRINK_DEFAULT, c[0]), NCFSM_OK);
      assert_int_equal(ncfsm_comm_state(c[0]), s);
      return true;
    }
    case NCFSM_STATE_INIT_FAILED: /* the sim's init fails (a remote error) */
      so.fail_init = 6;
      make_comms(loop, 1, &o, c, 0);
      run_until_state(loop, c[0], s);
      return true;
    case NCFSM_STATE_RELEASED: /* a work the caller still holds keeps its memory */
      make_comms(loop, 1, &o, c, 0);
      run_until_state(loop, c[0], NCFSM_STATE_READY);
      assert_int_equal(ncfsm_allreduce(c[0], setup_s, setup_r, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &cell_work), NCFSM_OK);
      assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
      assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
      assert_int_equal(ncfsm_comm_release(c[0]), NCFSM_OK);
      assert_int_equal(ncfsm_comm_state(c[0]), s);
      return true;
    case NCFSM_STATE_INIT_QUEUED: /* accepted; the loop has not turned yet */
      assert_int_equal(ncfsm_comm_new(loop, &o, &c[0]), NCFSM_OK);
      assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
      assert_int_equal(ncfsm_comm_init(c[0], 1, 0, &id), NCFSM_OK);
      assert_int_equal(ncfsm_comm_state(c[0]), s);
      return true;
    case NCFSM_STATE_INIT_IN_PROGRESS: /* rank 1 never arrives (R1) */
      *n = 2;
      make_comms(loop, 2, &o, c, 1);
      run_turns(loop, 3);
      assert_int_equal(ncfsm_comm_state(c[0]), s);
      return true;
    case NCFSM_STATE_LAUNCH_IN_PROGRESS:
    case NCFSM_STATE_DRAIN_LAUNCH_IN_PROGRESS: so.launch_polls = NEVER; break;
    case NCFSM_STATE_ERROR: so.async_error_at_op = 0; break;
    case NCFSM_STATE_ABORT_QUEUED: /* the group end itself reports the error */
      so.async_error_at_op = 0;
      so.group_end_inprogress = 0;
      o.on_error = NCFSM_ON_ERROR_ABORT;
      break;
    case NCFSM_STATE_FINALIZING: so.finalize_polls = NEVER; break;
    case NCFSM_STATE_REVOKING: so.revoke_polls = NEVER; break;
    case NCFSM_STATE_SPLITTING:
    case NCFSM_STATE_SHRINKING: so.split_polls = NEVER; break;
    case NCFSM_STATE_SHRUNK: two = true; break;
    default: break;
  }
  *n = two ? 2 : 1;
  make_comms(loop, *n, &o, c, 0);
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
    case NCFSM_STATE_DRAIN_LAUNCH_IN_PROGRESS:
      assert_int_equal(ncfsm_allreduce(c[0], setup_s, setup_r, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
      run_until_state(loop, c[0], NCFSM_STATE_LAUNCH_IN_PROGRESS);
      assert_int_equal(ncfsm_comm_finalize(c[0]), NCFSM_OK);
      break;
    case NCFSM_STATE_DRAINING: /* finalize accepted; the loop has not turned yet */
      assert_int_equal(ncfsm_comm_finalize(c[0]), NCFSM_OK);
      break;
    case NCFSM_STATE_ABORT_QUEUED: /* one turn: the launch fails after this turn's aborts */
      assert_int_equal(ncfsm_allreduce(c[0], setup_s, setup_r, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
      assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT), NCFSM_OK);
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
    case NCFSM_STATE_SPLITTING: /* the parent never polls back to success */
      assert_int_equal(ncfsm_comm_split(c[0], 0, 0, new_child(loop)), NCFSM_OK);
      break;
    case NCFSM_STATE_SHRINKING: /* rank 1 is excluded; the parent never polls back */
    case NCFSM_STATE_SHRUNK: {   /* ... or it does: only abort remains (R7) */
      int ex = 1;
      assert_int_equal(ncfsm_comm_shrink(c[0], &ex, 1, NCFSM_SHRINK_ABORT, new_child(loop)), NCFSM_OK);
      if (s == NCFSM_STATE_SHRUNK) run_until_state(loop, c[0], s);
      break;
    }
    default:
      fail_msg("no recipe for state %s", ncfsm_state_name(s));
  }
  if (ncfsm_comm_state(c[0]) != s)
    fail_msg("recipe for %s ended in %s", ncfsm_state_name(s), ncfsm_state_name(ncfsm_comm_state(c[0])));
  return true;
}

/* The close callback of the CLOSE cells: once, with the handle RELEASED. */
static int nclosed;
static ncfsm_state_t closed_state;
static uint64_t closed_calls; /* the comm's backend calls, read in the callback (its last moment) */
static void on_closed(ncfsm_comm *c, ncfsm_result_t status, void *arg) {
  (void)status;
  (void)arg;
  nclosed++;
  closed_state = ncfsm_comm_state(c);
  closed_calls = backend_calls(c);
}

static ncfsm_result_t make_call(ncfsm_loop *loop, ncfsm_comm *c, ncfsm_call_t call) {
  ncfsm_unique_id id;
  int ex = 1;
  switch (call) {
    case NCFSM_CALL_SPLIT: return ncfsm_comm_split(c, 0, 0, new_child(loop));
    case NCFSM_CALL_SHRINK: return ncfsm_comm_shrink(c, &ex, 1, NCFSM_SHRINK_DEFAULT, new_child(loop));
    case NCFSM_CALL_SHRINK_ABORT: return ncfsm_comm_shrink(c, &ex, 1, NCFSM_SHRINK_ABORT, new_child(loop));
    case NCFSM_CALL_GROW: /* the id comes from a READY comm; elsewhere the call is refused first */
      memset(&id, 0, sizeof id);
      if (ncfsm_comm_state(c) == NCFSM_STATE_READY) assert_int_equal(ncfsm_comm_grow_id(c, &id), NCFSM_OK);
      return ncfsm_comm_grow(c, 3, &id, -1, new_child(loop));
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
    case NCFSM_CALL_CLOSE: return ncfsm_comm_close(c, on_closed, NULL);
    case NCFSM_CALL_GROW_ID: return ncfsm_comm_grow_id(c, &id);
    case NCFSM_CALL_CHILD: /* c is the child of a READY parent's split (made before the cell's state) */
      return ncfsm_comm_split(kids[0], 0, 0, c);
    default: break;
  }
  (void)loop;
  fail_msg("no call for %d", (int)call);
  return NCFSM_ERR_INVALID_ARGUMENT;
}

/* States whose own pending work makes the loop call the backend on the next
 * turns (the init, the finalize, the queued abort): there a cell's effect on
 * the backend is judged right after the call, before any turn. */
static bool turns_call_backend(ncfsm_state_t s) {
  return (ncfsm_state_flags(s) & NCFSM_SF_CONTROL) != 0;
}

static void test_every_cell(void **state) {
  (void)state;
  int cells = 0, allowed = 0, deferred = 0, rejected = 0, table_only = 0;
  for (int s = 0; s < NCFSM_STATE_COUNT; s++) {
    for (int k = 0; k < NCFSM_CALL_COUNT; k++) {
      const char *rule, *hint;
      ncfsm_decision_t d = ncfsm_legality((ncfsm_state_t)s, (ncfsm_call_t)k, &rule, &hint);
      char where[160];
      snprintf(where, sizeof where, "cell (%s, %s) decision %s", ncfsm_state_name(s),
               ncfsm_call_name(k), ncfsm_decision_name(d));
      if (!hint || !*hint || !rule) fail_msg("%s: no hint", where);
      ncfsm_loop *loop;
      assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
      ncfsm_comm *c[2] = {NULL, NULL};
      int n;
      nkids = 0;
      if (k == NCFSM_CALL_CHILD) { /* the parent first: it must not move the cell's comm on */
        static ncfsm_sim_opts pso;
        ncfsm_comm_opts po;
        test_sim_opts(&pso);
        test_comm_opts(&po, &pso);
        make_comms(loop, 1, &po, &kids[0], 0);
        run_until_state(loop, kids[0], NCFSM_STATE_READY);
        nkids = 1;
      }
      if (!enter_state(loop, (ncfsm_state_t)s, c, &n, is_shrink((ncfsm_call_t)k) || k == NCFSM_CALL_GROW)) {
        /* CLOSING: every call is refused (the hint says to wait for CLOSED)
         * but a close, which waits for CLOSED itself. */
        if (d != (k == NCFSM_CALL_CLOSE ? NCFSM_DEFER : NCFSM_REJECT)) fail_msg("%s: a call is accepted while closing", where);
        table_only++;
        d == NCFSM_REJECT ? rejected++ : deferred++;
        cells++;
        for (int i = 0; i < nkids; i++) {
          ncfsm_comm_abort(kids[i]);
          ncfsm_comm_release(kids[i]);
        }
        nkids = 0;
        assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
        continue;
      }
      nclosed = 0;
      uint64_t before = backend_calls(c[0]);
      bool had_bcomm = has_backend_comm(c[0]);
      ncfsm_result_t rc = make_call(loop, c[0], (ncfsm_call_t)k);
      bool released = k == NCFSM_CALL_RELEASE && rc == NCFSM_OK;
      if (d == NCFSM_REJECT) {
        if (rc != NCFSM_ERR_ILLEGAL_STATE)
          fail_msg("%s: got %s, want NCFSM_ERR_ILLEGAL_STATE", where, ncfsm_err_name(rc));
        /* The error names the state and the call, and says what to do (a
         * child is told it must be NEW). */
        const char *err = ncfsm_comm_last_error(c[0]);
        if (!strstr(err, ncfsm_state_name(s)) || !strstr(err, "ncfsm_") ||
            !strstr(err, k == NCFSM_CALL_CHILD ? "it must be NEW" : hint))
          fail_msg("%s: last error does not name state, call and hint: %s", where, err);
        if (ncfsm_comm_state(c[0]) != (ncfsm_state_t)s) fail_msg("%s: state changed", where);
        if (backend_calls(c[0]) != before) fail_msg("%s: a rejected call reached the backend", where);
        rejected++;
      } else if (rc != NCFSM_OK) {
        fail_msg("%s: got %s (%s)", where, ncfsm_err_name(rc), ncfsm_comm_last_error(c[0]));
      } else {
        d == NCFSM_ALLOW ? allowed++ : deferred++;
      }
      if (released || s == NCFSM_STATE_RELEASED) {
        c[0] = NULL;
      } else if (d != NCFSM_REJECT) {
        uint64_t now = backend_calls(c[0]);
        if (d == NCFSM_DEFER && now != before) fail_msg("%s: a deferred call reached the backend", where);
        if (ncfsm_group_depth(loop) > 0) ncfsm_group_end(loop);
        run_turns(loop, 5);
        /* a close may have freed the comm: its callback kept the count */
        uint64_t after = k == NCFSM_CALL_CLOSE && nclosed ? closed_calls : backend_calls(c[0]);
        /* ALLOW reaches the backend, except where no backend comm exists (abort
         * before init was issued). */
        bool no_bcomm = !had_bcomm;
        /* the child of a split reaches NCCL through its parent's call */
        bool expect = d == NCFSM_ALLOW && !(no_bcomm && k == NCFSM_CALL_ABORT) && k != NCFSM_CALL_CHILD;
        ncfsm_call_t xs = ncfsm__comm_cols[s].close; /* NCFSM_CALL_COUNT: the close waits */
        if (k == NCFSM_CALL_CLOSE) /* the close column's step makes the call: NCCL sees it only for those */
          expect = d == NCFSM_ALLOW && (xs == NCFSM_CALL_FINALIZE || xs == NCFSM_CALL_DESTROY ||
                                        (xs == NCFSM_CALL_ABORT && had_bcomm));
        if (expect && after == before) fail_msg("%s: backend was not reached", where);
        if (!expect && !turns_call_backend((ncfsm_state_t)s) && after != before && !(k == NCFSM_CALL_CLOSE && xs == NCFSM_CALL_COUNT))
          fail_msg("%s: backend was reached %llu time(s)", where, (unsigned long long)(after - before));
        if (k == NCFSM_CALL_CLOSE && (xs == NCFSM_CALL_ABORT || xs == NCFSM_CALL_RELEASE)) {
          /* abort, then release (or release at once): the callback ran, the handle is gone */
          if (nclosed != 1 || closed_state != NCFSM_STATE_RELEASED)
            fail_msg("%s: %d close callback(s), the comm %s in the callback; want one, RELEASED", where, nclosed,
                     ncfsm_state_name(closed_state));
        }
        if (k == NCFSM_CALL_CLOSE && nclosed) c[0] = NULL; /* released by the close, freed after its callback */
      }
      cells++;
      if (ncfsm_group_depth(loop) > 0) ncfsm_group_end(loop);
      for (int i = 0; i < nkids; i++) {
        if (ncfsm_comm_state(kids[i]) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(kids[i]);
        ncfsm_comm_release(kids[i]);
      }
      nkids = 0;
      if (cell_parent) {
        ncfsm_comm_abort(cell_parent);
        ncfsm_comm_release(cell_parent);
        cell_parent = NULL;
      }
      if (cell_work) {
        ncfsm_work_release(cell_work);
        cell_work = NULL;
      }
      if (c[0] && ncfsm_comm_state(c[0]) == NCFSM_STATE_RELEASED) c[0] = NULL;
      if (cell_boot) { /* its events are on the loop's base: closed after the comms, before the loop */
        for (int r = 0; r < n; r++) {
          if (!c[r]) continue;
          if (ncfsm_comm_state(c[r]) != NCFSM_STATE_CLOSED && ncfsm_comm_state(c[r]) != NCFSM_STATE_NEW)
            assert_int_equal(ncfsm_comm_abort(c[r]), NCFSM_OK);
          assert_int_equal(ncfsm_comm_release(c[r]), NCFSM_OK);
          c[r] = NULL;
        }
        run_turns(loop, 2);
        ncfsm_boot_close(cell_boot);
        cell_boot = NULL;
      }
      teardown_all(loop, c, n);
    }
  }
  printf("legality: %d cells covered (%d states x %d calls): %d allow, %d defer, %d reject; %d on "
         "the table only (CLOSING)\n",
         cells, NCFSM_STATE_COUNT, NCFSM_CALL_COUNT, allowed, deferred, rejected, table_only);
  assert_int_equal(cells, NCFSM_STATE_COUNT * NCFSM_CALL_COUNT);
}

static int32_t gbuf[4][16];

/* Every guard of a legality cell, made to fail once: the call is rejected
 * with the guard's result and hint, and nothing changes. */
static void test_guards_fail(void **state) {
  (void)state;
  ncfsm_comm *c[2];
  ncfsm_loop *loop = ready_comms(2, c);
  /* NO_GROUP_OPS: finalize while ops of the comm wait in an open group (R3). */
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncfsm_allreduce(c[r], gbuf[r], gbuf[r], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_GROUP_OPEN);
  assert_int_equal(ncfsm_comm_finalize(c[0]), NCFSM_ERR_ILLEGAL_STATE);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "ncfsm_group_end"));
  assert_int_equal(ncfsm_group_end(loop), NCFSM_ERR_ILLEGAL_STATE); /* R3: the group failed */
  run_turns(loop, 5);
  /* IDLE: destroy while a work is in flight (its peer never joins). */
  assert_int_equal(ncfsm_allreduce(c[0], gbuf[2], gbuf[2], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
  run_turns(loop, 5);
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_READY);
  assert_int_equal(ncfsm_comm_destroy(c[0]), NCFSM_ERR_ILLEGAL_STATE);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "IDLE"));
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "ncfsm_comm_abort"));
  assert_int_equal(ncfsm_comm_state(c[0]), NCFSM_STATE_READY);
  /* the peer joins: the work completes, and destroy is legal again */
  assert_int_equal(ncfsm_allreduce(c[1], gbuf[3], gbuf[3], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_destroy(c[r]), NCFSM_OK);
  teardown_all(loop, c, 2);
  /* SIZED: a split child learns its rank and size only when its init is
   * done: a rooted op before is refused, an AllReduce is queued. */
  static ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  so.split_polls = NEVER;
  ncfsm_comm *p[1], *ch;
  loop = ready_comms_with(1, p, &o);
  assert_int_equal(ncfsm_comm_new(loop, &o, &ch), NCFSM_OK);
  assert_int_equal(ncfsm_comm_split(p[0], 0, 0, ch), NCFSM_OK);
  assert_int_equal(ncfsm_comm_state(ch), NCFSM_STATE_CHILD_QUEUED);
  assert_int_equal(ncfsm_broadcast(ch, gbuf[0], gbuf[0], 4, NCFSM_INT32, 0, NULL, NULL, NULL, NULL), NCFSM_ERR_ILLEGAL_STATE);
  assert_non_null(strstr(ncfsm_comm_last_error(ch), "guard SIZED"));
  assert_int_equal(ncfsm_allreduce(ch, gbuf[0], gbuf[0], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_comm_abort(ch), NCFSM_OK);
  assert_int_equal(ncfsm_comm_release(ch), NCFSM_OK);
  teardown_all(loop, p, 1);
}

/* GROUP_THREAD: an op from a thread that did not open the group its comm's
 * ops wait in (R3, R9) gets NCFSM_ERR_WRONG_THREAD. */
struct other { ncfsm_comm *c; ncfsm_result_t r; };
static void *other_thread(void *arg) {
  struct other *o = arg;
  o->r = ncfsm_allreduce(o->c, gbuf[1], gbuf[1], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL);
  return NULL;
}

static void test_guard_group_thread(void **state) {
  (void)state;
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
  assert_int_equal(ncfsm_allreduce(c[0], gbuf[0], gbuf[0], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
  struct other o = {c[0], NCFSM_OK};
  pthread_t th;
  pthread_create(&th, NULL, other_thread, &o);
  pthread_join(th, NULL);
  assert_int_equal(o.r, NCFSM_ERR_WRONG_THREAD);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "GROUP_THREAD"));
  assert_int_equal(ncfsm_group_end(loop), NCFSM_OK);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  teardown_all(loop, c, 1);
}

/* The machine's shape: abort from every live state, R2 in polled states,
 * every state that can have works in flight or a phase deadline can fail
 * and time out, guarded rows come before the unguarded one. */
static void test_table_shape(void **state) {
  (void)state;
  for (int s = 0; s < NCFSM_STATE_COUNT; s++) {
    if (ncfsm_state_flags((ncfsm_state_t)s) & NCFSM_SF_END) continue;
    if (!ncfsm_transition_allowed((ncfsm_state_t)s, NCFSM_EV_ABORT, NCFSM_STATE_CLOSING))
      fail_msg("no ABORT from %s", ncfsm_state_name(s));
    ncfsm_decision_t d = ncfsm_legality((ncfsm_state_t)s, NCFSM_CALL_ABORT, NULL, NULL);
    if (d != NCFSM_ALLOW) fail_msg("abort not allowed in %s (R5)", ncfsm_state_name(s));
  }
  for (int s = 0; s < NCFSM_STATE_COUNT; s++) {
    unsigned f = ncfsm_state_flags((ncfsm_state_t)s);
    if (f & (NCFSM_SF_WORKS | NCFSM_SF_DEADLINE)) {
      /* before it was ever ready a comm fails to INIT_FAILED, after to ERROR */
      ncfsm_state_t failed = (f & NCFSM_SF_LIVE) && !(f & NCFSM_SF_WORKS) ? NCFSM_STATE_INIT_FAILED : NCFSM_STATE_ERROR;
      if (!ncfsm_transition_allowed((ncfsm_state_t)s, NCFSM_EV_TIMEOUT, failed))
        fail_msg("%s can have works or a phase but cannot time out", ncfsm_state_name(s));
      if (!ncfsm_transition_allowed((ncfsm_state_t)s, NCFSM_EV_ASYNC_ERROR, failed))
        fail_msg("%s can have works or a phase but cannot fail", ncfsm_state_name(s));
    }
    /* R2: while an NCCL call is in progress no call but abort/revoke reaches NCCL now. */
    if (f & NCFSM_SF_POLL)
      for (int k = 0; k < NCFSM_CALL_COUNT; k++)
        if (k != NCFSM_CALL_ABORT && k != NCFSM_CALL_REVOKE &&
            !(k == NCFSM_CALL_CLOSE && ncfsm__comm_cols[s].close == NCFSM_CALL_ABORT) && /* its step is an abort */
            ncfsm_legality((ncfsm_state_t)s, (ncfsm_call_t)k, NULL, NULL) == NCFSM_ALLOW)
          fail_msg("R2 violated: %s allowed in %s", ncfsm_call_name(k), ncfsm_state_name(s));
  }
  /* the machine's own lint (fsm/machine.c, fsm/tables.c): no defect */
  assert_int_equal(ncfsm__comm_lint(NULL, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_cell),
      cmocka_unit_test(test_guards_fail),
      cmocka_unit_test(test_guard_group_thread),
      cmocka_unit_test(test_table_shape),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
