#include "rows_comm.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

int32_t g_buf[8][8];
static ncfsm_sim_opts g_so;

ncfsm_comm_opts copts(const char *name) {
  ncfsm_comm_opts o;
  opts_init(&o, &g_so, name);
  return o;
}

void clique(ncfsm_loop *loop, int n, const ncfsm_comm_opts *o, ncfsm_comm **c, bool wait) {
  const ncfsm_comm_opts *per[8] = {o};
  comms_init(loop, n, per, c);
  if (wait)
    for (int r = 0; r < n; r++) want_state(c[r], NCFSM_STATE_READY);
}

ncfsm_loop *ready(int n, const ncfsm_comm_opts *o, ncfsm_comm **c) {
  ncfsm_loop *loop = loop_new();
  clique(loop, n, o, c, true);
  return loop;
}

ncfsm_work *op(ncfsm_comm *c, int r) {
  ncfsm_work *w = NULL;
  for (int i = 0; i < 8; i++) g_buf[r][i] = r + 1;
  ncfsm_result_t rc = ncfsm_allreduce(c, g_buf[r], g_buf[r], 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w);
  if (rc != NCFSM_OK) fail_msg("ncfsm_allreduce on %s rank %d: %s: %s", ncfsm_comm_name(c), r, ncfsm_err_name(rc),
                               ncfsm_comm_last_error(c));
  return w;
}

static unsigned comm_state_of(void *c) { return ncfsm_comm_state(c); }
void until_state(ncfsm_comm *c, ncfsm_state_t s) { run_until_is(c->loop, comm_state_of, c, s, ncfsm_state_name(s)); }

static unsigned work_state_of(void *w) { return ncfsm_work_state(w); }
void until_work(ncfsm_comm *c, ncfsm_work *w, ncfsm_work_state_t st) {
  run_until_is(c->loop, work_state_of, w, st, ncfsm_work_state_name(st));
}

void pass_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

ncfsm_boot *arm(ncfsm_loop *loop, ncfsm_comm *c) {
  ncfsm_boot *b = boot_open(loop, boot_group("arm"), 0, 1, 0);
  ncfsm_recovery_opts ro = {b, NULL, NULL, NULL};
  assert_int_equal(ncfsm_comm_set_recovery(c, &ro), NCFSM_OK);
  return b;
}

ncfsm_boot *arm_lost(ncfsm_loop *loop, ncfsm_comm *c) {
  char group[96];
  snprintf(group, sizeof group, "%s", boot_group("lost"));
  ncfsm_boot *b = boot_open(loop, group, 0, 2, 0);
  assert_int_equal(ncfsm_boot_close(boot_open(loop, group, 1, 2, 0)), NCFSM_OK);
  ncfsm_recovery_opts ro = {b, NULL, NULL, NULL};
  assert_int_equal(ncfsm_comm_set_recovery(c, &ro), NCFSM_OK);
  return b;
}

void lost_dispatch(ncfsm_loop *loop) { event_base_loop(ncfsm_loop_base(loop), EVLOOP_NONBLOCK); }

void defect(ncfsm_comm *c) {
  ncfsm_loop *loop = c->loop;
  pthread_mutex_lock(&loop->mu);
  unsigned from = c->state;
  /* an event the state has no row for: REVOKE_DONE has rows in REVOKING only, ID_KNOWN in ID_EXCHANGE only */
  ncfsm_event_t ev = from == NCFSM_STATE_REVOKING ? NCFSM_EV_ID_KNOWN : NCFSM_EV_REVOKE_DONE;
  assert_false(ncfsm__comm_can_fire(c, ev));
#ifdef NDEBUG
  ncfsm__comm_fire(c, ev, NULL); /* the wrapper: INVALID */
#else
  /* what ncfsm__comm_fire does after its assert (fsm/comm_fsm.c) */
  ncfsm__set_error(c, "engine defect: event %s is invalid in state %s; every unfinished work failed; abort the "
                      "communicator and report this",
                   ncfsm_event_name(ev), ncfsm_state_name((ncfsm_state_t)from));
  ncfsm__cev inv = {.cause = NCFSM_ERR_INVALID_USAGE, .code = NCFSM__NCCL_SUCCESS, .what = c->last_error, .from = from};
  ncfsm__comm_fire(c, NCFSM_EV_INVALID, &inv);
#endif
  unsigned to = c->state;
  pthread_mutex_unlock(&loop->mu);
  const ncfsm__machine *m = rows_machine("comm");
  int i = rows_find(m, m->states[from].name, "INVALID", "ANY");
  assert_true(i >= 0);
  if (to != m->rows[i].next)
    fail_msg("engine defect in %s: now %s, the row says %s", m->states[from].name, m->states[to].name,
             m->states[m->rows[i].next].name);
  if (to != NCFSM_STATE_RELEASED) want_text(c, false, "engine defect: event");
}
