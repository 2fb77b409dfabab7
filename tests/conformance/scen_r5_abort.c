/* R5: Abort while work runs (raw: both ranks in one group; ncfsm: from the
 * state callback at the moment the launch is final).
 * The raw expectation is written from R5 (docs/nccl-rules.md); the ncfsm one is in
 * expect_ncfsm.c. */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "conformance.h"

/* R5: abort while a large AllReduce runs. */
static void raw_abort(ctx_t *x, obs_t *o) {
  rset_t rs;
  size_t n = x->is_sim ? (256u << 10) : BIGN;
  void *ev = NULL;
  if (rinit(x, &rs, 0, o, "abrt", 0) || ralloc(x, &rs, 1, n)) { AP(rc, "setup failed"); goto out; }
  for (int r = 0; r < NR; r++) fill_f32(x, r, rs.buf[r][0], n, 1.0f);
  int orc[NR], st[NR];
  x->be->group_start();
  for (int r = 0; r < NR; r++)
    orc[r] = rop(x, rs.c[r], NCFSM_KIND_ALLREDUCE, rs.buf[r][0], rs.buf[r][0], n, NCFSM_FLOAT32, -1, rs.s[r]);
  int ge = x->be->group_end();
  rpoll_all(x, rs.c, NR, st);
  x->be->event_create(0, &ev);
  x->be->event_record(ev, rs.s[0]);
  int running = x->is_sim ? 1 : x->be->event_query(ev) == 1; /* sim: a query would execute it */
  double t0 = now_ms();
  x->be->group_start();
  int a[NR];
  for (int r = 0; r < NR; r++) a[r] = x->be->abort(rs.c[r]), rs.c[r] = NULL;
  int age = x->be->group_end();
  double ta = now_ms() - t0;
  double end = now_ms() + (double)x->timeout_ms;
  int q;
  while ((q = x->be->event_query(ev)) == 1 && now_ms() < end) sched_yield();
  AP(rc, "ge=%s ->%s,%s running-at-abort=%s abort=%s,%s ge=%s", rn(ge), rn(st[0]), rn(st[1]),
     running ? "yes" : "no", rn(a[0]), rn(a[1]), rn(age));
  AP(async, "n/a");
  AP(data, "stream=%s", q == 0 ? "drained" : q == 1 ? "hung" : "error");
  AP(info, "abort of 2 comms in one group: %.1f ms; ops %s,%s", ta, rn(orc[0]), rn(orc[1]));
  AP(health, "closed");
out:
  if (ev) x->be->event_destroy(ev);
  rfini(x, &rs);
}
/* ncfsm: abort from rank 0's state callback at LAUNCH_IN_PROGRESS -> READY, the
 * moment the launch is final and the works are IN_FLIGHT (kernels running). */
typedef struct abort_at_final {
  nset_t *ns;
  ncfsm_work *w0;
  int fired;
  char ws[32];
  ncfsm_result_t a0, a1;
  double ms;
} abort_at_final_t;

static void abort_cb(ncfsm_comm *c, ncfsm_state_t from, ncfsm_state_t to, ncfsm_event_t ev, void *arg) {
  abort_at_final_t *a = arg;
  (void)c;
  if (a->fired || !a->w0 || from != NCFSM_STATE_LAUNCH_IN_PROGRESS || to != NCFSM_STATE_READY ||
      ev != NCFSM_EV_LAUNCH_FINAL)
    return;
  a->fired = 1;
  snprintf(a->ws, sizeof a->ws, "%s", ncfsm_work_state_name(ncfsm_work_state(a->w0)));
  double t0 = now_ms();
  a->a0 = ncfsm_comm_abort(a->ns->c[0]);
  a->a1 = ncfsm_comm_abort(a->ns->c[1]);
  a->ms = now_ms() - t0;
}

static void nf_abort(ctx_t *x, obs_t *o) {
  nset_t ns;
  size_t n = x->is_sim ? (256u << 10) : BIGN;
  abort_at_final_t a;
  memset(&a, 0, sizeof a);
  a.ns = &ns;
  x->on_state = abort_cb;
  x->on_state_arg = &a;
  int bad = ninit(x, &ns, 0, 0, o, 0) || nalloc(&ns, 1, n * 4);
  x->on_state = NULL;
  x->on_state_arg = NULL;
  if (bad) { AP(rc, "setup failed"); goto out; }
  for (int r = 0; r < NR; r++) fill_f32(x, r, ns.buf[r][0], n, 1.0f);
  ncfsm_work *w[NR];
  ncfsm_group_start(ns.loop);
  for (int r = 0; r < NR; r++)
    ncfsm_allreduce(ns.c[r], ns.buf[r][0], ns.buf[r][0], n, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[r]);
  a.w0 = w[0];
  ncfsm_group_end(ns.loop);
  ncfsm_result_t st[NR];
  nwait_release(x, w, NR, st);
  AP(rc, "abort-at-final(work %s)=%s,%s", a.fired ? a.ws : "never", fn_(a.a0), fn_(a.a1));
  AP(async, "->%s,%s", stn(ns.c[0]), stn(ns.c[1]));
  AP(data, "works=%s,%s", fn_(st[0]), fn_(st[1]));
  AP(info, "abort x2 from the state callback %.1f ms", a.ms);
  nhealth(ns.c, NR, o);
out:
  nfini(&ns);
}


const scen_t scen_abort_in_flight = {
    .id = "abort_in_flight", .rule = "R5",
    .title = "abort both ranks while a 256 MiB AllReduce runs (raw: in one group, R5; ncfsm: ncfsm_comm_abort on each)",
    .fn = {raw_abort, nf_abort},
    .raw = {"ge=InProgress ->Success,Success running-at-abort=yes abort=Success,Success ge=Success", "n/a",
            "stream=drained", "closed"},
    .sim_has_revoke = -1,
    .rev = {1, 2},
};
