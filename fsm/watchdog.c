/* The watchdog: phase deadlines (states with flag DEADLINE) and work
 * deadlines (flag WORKS); an expired one fails the comm with TIMEOUT, and
 * the table says what follows. */
#include <stdio.h>

#include "fsm/engine.h"

static void work_timed_out(ncfsm_comm *c, const ncfsm_work *w) {
  char what[200];
  snprintf(what, sizeof what, "watchdog: %s seq %llu did not complete within %llu ms", ncfsm_opkind_name(w->op.kind),
           (unsigned long long)w->fp.seq, (unsigned long long)(w->timeout_ms ? w->timeout_ms : c->opts.timeout_ms));
  ncfsm__comm_fail(c, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, NCFSM__NCCL_SUCCESS, what);
}

#define VERIFY_STALL_CHECK_NS 1000000ull /* at most once a millisecond: a stall bound is seconds */

/* In-process verification looks for the ranks that keep a launch waiting
 * once the oldest unfinished launch is older than its stall bound. */
static void verify_stall(ncfsm_comm *c, uint64_t now) {
  if (now - c->verify_checked_ns < VERIFY_STALL_CHECK_NS) return;
  c->verify_checked_ns = now;
  const ncfsm_work *old = c->launching;
  for (int i = 0; i < c->nsq; i++)
    if (c->sq[i].head && (!old || c->sq[i].head->t_launch < old->t_launch)) old = c->sq[i].head;
  if (old && now > old->t_launch && now - old->t_launch > c->verify_stall_ns) c->vops->stall_due(c);
}

void ncfsm__watchdog(ncfsm_comm *c, uint64_t now) {
  unsigned f = ncfsm__sflags(c->state);
  if (c->verify_stall_ns) verify_stall(c, now);
  if (c->work_deadlines && (f & NCFSM_SF_WORKS)) /* per-work deadlines: every work */
    for (int i = 0; i < c->nsq; i++)
      for (ncfsm_work *w = c->sq[i].head; w; w = w->next)
        if (w->deadline_ns && now > w->deadline_ns) {
          work_timed_out(c, w);
          return;
        }
  if (!c->opts.timeout_ms) return;
  if ((f & NCFSM_SF_DEADLINE) && c->phase_deadline && now > c->phase_deadline) {
    char what[200];
    snprintf(what, sizeof what, "watchdog: state %s did not end within %llu ms", ncfsm_state_name((ncfsm_state_t)c->state),
             (unsigned long long)c->opts.timeout_ms);
    ncfsm__comm_fail(c, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, NCFSM__NCCL_IN_PROGRESS, what);
    return;
  }
  if (!(f & NCFSM_SF_WORKS)) return;
  for (int i = 0; i < c->nsq; i++) {
    ncfsm_work *w = c->sq[i].head;
    if (w && w->deadline_ns && now > w->deadline_ns) {
      work_timed_out(c, w);
      return;
    }
  }
}
