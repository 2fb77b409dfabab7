/*
 * Directed scenarios: short fixed sequences that reach the engine defects
 * the random search may take long to hit. They use the same actions and the
 * same oracle as the random runs, so a scenario "passes" exactly when the
 * engine keeps every invariant on that sequence.
 *
 *   ncfsm-apifuzz --scenario NAME [--verbose]
 */
#include <stdio.h>
#include <string.h>

#include "apifuzz.h"

static void next_step(void) {
  fz_check_step();
  g.step++;
  g.sh->step = g.step;
}

static fz_clique *ready_clique(fz_loop *l, int n, uint64_t timeout_ms, ncfsm_error_policy_t pol) {
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.timeout_ms = timeout_ms;
  o.on_error = pol;
  o.on_state = fz_state_cb;
  ncfsm_sim_opts so[FZ_MAX_RANKS];
  for (int r = 0; r < n; r++) {
    if (ncfsm_sim_opts_init(&so[r]) != NCFSM_OK) fz_violation("ncfsm_sim_opts_init: %s", ncfsm_opts_error());
    so[r].init_polls = 0;
    so[r].launch_polls = 0;
    so[r].finalize_polls = 0;
    so[r].revoke_polls = 0;
  }
  fz_clique *q = fz_clique_new(l, n, &o, so, 0);
  next_step();
  for (int r = 0; r < n; r++)
    if (fz_wait_state(q->c[r], NCFSM_STATE_READY, 2000) != NCFSM_OK)
      fz_violation("scenario: q%d/r%d did not become READY", q->id, r);
  next_step();
  return q;
}

static fz_args allreduce_args(fz_stream *st) {
  fz_args a;
  memset(&a, 0, sizeof a);
  a.kind = NCFSM_KIND_ALLREDUCE;
  a.count = 4;
  a.dtype = NCFSM_INT32;
  a.redop = NCFSM_OP_SUM;
  a.root = -1;
  a.peer = -1;
  a.st = st;
  a.flags = FZ_HANDLE | FZ_CB;
  return a;
}

/* Turn the loop until op's work reaches state s (or 1000 turns). */
static void run_until(fz_loop *l, fz_op *op, ncfsm_work_state_t s) {
  for (int i = 0; i < 1000; i++) {
    pthread_mutex_lock(&g.mu);
    int ws = op->wstate;
    pthread_mutex_unlock(&g.mu);
    if (ws == (int)s) return;
    fz_run(l, NCFSM_RUN_NOWAIT);
  }
  fz_violation("scenario: op %d never reached %s", op->id, ncfsm_work_state_name(s));
}

/* A rank's allreduce is IN_FLIGHT (its peer has not called yet); destroy
 * (or revoke) its comm; the sim drops the op, its stream drains. */
static void inflight_then(ncfsm_call_t call) {
  fz_loop *l = fz_loop_open(0, 0);
  fz_clique *q = ready_clique(l, 2, 0, NCFSM_ON_ERROR_ABORT);
  fz_args a = allreduce_args(NULL);
  fz_op *op = fz_submit(q->c[0], &a);
  next_step();
  run_until(l, op, NCFSM_WORK_IN_FLIGHT);
  next_step();
  fz_lifecycle(q->c[0], call);
  next_step();
  for (int i = 0; i < 20; i++) fz_run(l, NCFSM_RUN_NOWAIT);
  next_step();
  fz_wait_work(op, 20);
  next_step();
}

static void sc_destroy_inflight(void) { inflight_then(NCFSM_CALL_DESTROY); }
static void sc_revoke_inflight(void) { inflight_then(NCFSM_CALL_REVOKE); }

/* Two comms on one device share a user stream; watchdog 50 ms, policy STAY.
 * qA/r0's allreduce waits for a peer that never calls; qB/r0's allreduce is
 * behind it on the stream (its instance ran: qB/r1 called). Destroy qB/r0,
 * then run the loop until nothing is pending. */
static void sc_shared_stream_stay(void) {
  fz_loop *l = fz_loop_open(0, 0);
  fz_clique *qa = ready_clique(l, 2, 50, NCFSM_ON_ERROR_STAY);
  fz_clique *qb = ready_clique(l, 2, 50, NCFSM_ON_ERROR_STAY);
  fz_stream *s = fz_stream_new(qa->c[0]);
  next_step();
  fz_args a = allreduce_args(s);
  fz_submit(qa->c[0], &a);
  fz_op *b0 = fz_submit(qb->c[0], &a);
  a.st = NULL;
  fz_submit(qb->c[1], &a);
  next_step();
  run_until(l, b0, NCFSM_WORK_IN_FLIGHT);
  next_step();
  fz_lifecycle(qb->c[0], NCFSM_CALL_DESTROY);
  next_step();
  fz_run_default(l);
  next_step();
}

/* A work names a user stream and is still QUEUED (its group is open); the
 * stream is destroyed; then the group ends and the work launches. */
static void sc_stream_destroy_queued(void) {
  fz_loop *l = fz_loop_open(0, 0);
  fz_clique *q = ready_clique(l, 2, 0, NCFSM_ON_ERROR_ABORT);
  fz_stream *s = fz_stream_new(q->c[0]);
  next_step();
  fz_group_start(l);
  fz_args a = allreduce_args(s);
  fz_submit(q->c[0], &a);
  a.st = NULL;
  fz_submit(q->c[1], &a);
  next_step();
  fz_stream_del(q->c[0], s);
  next_step();
  fz_group_end(l);
  next_step();
  fz_run_default(l);
  next_step();
}

/* The user releases a QUEUED work's handle twice, then submits again. */
static void sc_double_release(void) {
  fz_loop *l = fz_loop_open(0, 0);
  fz_clique *q = ready_clique(l, 2, 0, NCFSM_ON_ERROR_ABORT);
  fz_args a = allreduce_args(NULL);
  fz_op *op = fz_submit(q->c[0], &a);
  next_step();
  fz_release(op);
  fz_release(op);
  next_step();
  fz_op *op2 = fz_submit(q->c[0], &a);
  fz_submit(q->c[1], &a);
  fz_op *op3 = fz_submit(q->c[1], &a);
  next_step();
  fz_wait_work(op2, 200);
  next_step();
  fz_wait_work(op3, 200);
  next_step();
}

/* ncfsm_loop_close from inside one of the loop's own loop_call callbacks,
 * every comm released. */
static void sc_close_in_callback(void) {
  fz_loop *l = fz_loop_open(0, 0);
  fz_clique *q = ready_clique(l, 2, 0, NCFSM_ON_ERROR_ABORT);
  (void)q;
  next_step();
  fz_retire_loop(l, true);
  next_step();
}

/* A work waits for a peer that never calls; the loop polls every 1 us.
 * ncfsm_loop_run(NOWAIT) is "one turn, never waits". */
static void sc_nowait_spin(void) {
  ncfsm_loop_opts lo;
  ncfsm_loop_opts_init(&lo);
  lo.poll_burst = 0;
  lo.poll_burst_us = 0;
  lo.poll_max_us = 1;
  fz_loop *l = fz_loop_open_opts(0, 0, &lo);
  for (int k = 0; k < 6; k++) { /* enough comms that one turn takes longer than the poll interval */
    fz_clique *q = ready_clique(l, 2, 0, NCFSM_ON_ERROR_ABORT);
    fz_args a = allreduce_args(NULL);
    for (int j = 0; j < 4; j++) fz_submit(q->c[0], &a);
  }
  next_step();
  for (int i = 0; i < 50; i++) fz_run(l, NCFSM_RUN_NOWAIT);
  next_step();
}

/* An explicit group holds an allreduce of each of the two ranks and is
 * closed, but not launched yet; rank 0 is finalized (DRAINING: its queued
 * op launches first); the main thread opens a new group with another op of
 * rank 1 (GROUP_OPEN: it cannot launch), then runs ncfsm_loop_run(DEFAULT)
 * on another thread. Every comm has a 35 ms watchdog. */
static void sc_drain_open_group(void) {
  fz_loop *l = fz_loop_open(0, 0);
  fz_clique *q = ready_clique(l, 2, 35, NCFSM_ON_ERROR_ABORT);
  fz_args a = allreduce_args(NULL);
  fz_group_start(l);
  fz_submit(q->c[0], &a);
  fz_submit(q->c[1], &a);
  fz_group_end(l);
  next_step();
  fz_lifecycle(q->c[0], NCFSM_CALL_FINALIZE);
  next_step();
  fz_group_start(l);
  fz_submit(q->c[1], &a);
  next_step();
  fz_run_default(l);
  next_step();
  fz_group_end(l);
  next_step();
}

/* A loop thread aborts comms (error policy abort after an injected async
 * error) while this thread reads their sim statistics; repeated. The loop
 * thread calls the backend's abort with the loop's lock released, so a read
 * of the backend comm in that window is a use after free: only ASan sees it. */
static void sc_stats_during_abort(void) {
  fz_loop *l = fz_loop_open(0, 0);
  ncfsm_result_t rc = ncfsm_loop_start_thread(l->h);
  if (rc != NCFSM_OK) fz_violation("ncfsm_loop_start_thread returned %s", ncfsm_err_name(rc));
  l->thread = true;
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.timeout_ms = 0;
  o.on_error = NCFSM_ON_ERROR_ABORT;
  ncfsm_sim_opts so;
  if (ncfsm_sim_opts_init(&so) != NCFSM_OK) fz_violation("ncfsm_sim_opts_init: %s", ncfsm_opts_error());
  so.init_polls = so.launch_polls = 0;
  so.async_error_at_op = 0;
  uint64_t reads = 0;
  for (int k = 0; k < 40 && g.ncliques < FZ_MAX_CLIQUES; k++) {
    fz_clique *q = fz_clique_new(l, 1, &o, &so, 1);
    fz_wait_state(q->c[0], NCFSM_STATE_READY, 2000);
    fz_args a = allreduce_args(NULL);
    fz_submit(q->c[0], &a);
    for (int i = 0; i < 2000000 && ncfsm_comm_state(q->c[0]->h) != NCFSM_STATE_CLOSED; i++) {
      ncfsm_sim_stats st;
      (void)ncfsm_sim_get_stats(q->c[0]->h, &st);
      reads++;
    }
    fz_wait_state(q->c[0], NCFSM_STATE_CLOSED, 2000);
    fz_lifecycle(q->c[0], NCFSM_CALL_RELEASE);
    next_step();
  }
  fz_log("%llu ncfsm_sim_get_stats calls while the loop thread aborted", (unsigned long long)reads);
}

/* Oracle self-test: rank 1 changes its send buffer after the call and before
 * the loop turns, so the data the sim reduces is not the data the fuzzer
 * recorded; the data check must report the allreduce's result. */
static void sc_selftest_data(void) {
  fz_loop *l = fz_loop_open(0, 0);
  fz_clique *q = ready_clique(l, 2, 0, NCFSM_ON_ERROR_ABORT);
  fz_args a = allreduce_args(NULL);
  fz_op *o0 = fz_submit(q->c[0], &a);
  fz_op *o1 = fz_submit(q->c[1], &a);
  ((int32_t *)o1->send)[2] += 1000;
  fz_log("the fuzzer changed rank 1's send buffer after the call: the oracle must report the result");
  next_step();
  fz_wait_work(o0, 2000);
  fz_wait_work(o1, 2000);
  next_step();
}

static const struct {
  const char *name;
  void (*fn)(void);
  const char *what;
} scenarios[] = {
    {"destroy-inflight", sc_destroy_inflight,
     "destroy a comm whose allreduce is IN_FLIGHT (peer not arrived); the work must not complete OK"},
    {"revoke-inflight", sc_revoke_inflight,
     "revoke a comm whose allreduce is IN_FLIGHT; the dropped work must not complete OK"},
    {"shared-stream-stay", sc_shared_stream_stay,
     "two comms share a user stream, watchdog 50 ms, policy stay; destroy the one whose work waits "
     "behind the other's; ncfsm_loop_run(DEFAULT) must return"},
    {"stream-destroy-queued", sc_stream_destroy_queued,
     "destroy a user stream while a QUEUED work names it; must be refused (or made safe)"},
    {"double-release", sc_double_release,
     "release a QUEUED work's handle twice, then submit again; the second release must be detected"},
    {"close-in-callback", sc_close_in_callback,
     "ncfsm_loop_close from inside the loop's own loop_call callback must not free the running loop"},
    {"nowait-spin", sc_nowait_spin,
     "poll_max_us 1 and a work that cannot complete: ncfsm_loop_run(NOWAIT) must return after one turn"},
    {"drain-open-group", sc_drain_open_group,
     "a closed group's ops wait while rank 1 has ops in a newly opened group and rank 0 is finalized; "
     "ncfsm_loop_run(DEFAULT) from another thread must return (every comm has a watchdog)"},
    {"stats-during-abort", sc_stats_during_abort,
     "ncfsm_sim_get_stats while the loop thread aborts the comm (its error policy); needs ASan to see a "
     "use after free"},
    {"selftest-data", sc_selftest_data,
     "oracle self-test: data changed behind the fuzzer's back must be reported (this one MUST fail)"},
};

bool fz_scenario(const char *name) {
  for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
    if (!strcmp(name, scenarios[i].name)) {
      g.step = 1;
      g.sh->step = 1;
      fz_log("scenario %s: %s", scenarios[i].name, scenarios[i].what);
      scenarios[i].fn();
      return true;
    }
  return false;
}

bool fz_scenario_known(const char *name) {
  for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
    if (!strcmp(name, scenarios[i].name)) return true;
  return false;
}

void fz_list_scenarios(void) {
  for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
    printf("%-22s %s\n", scenarios[i].name, scenarios[i].what);
}
