/* R1 and R2: ncclInProgress everywhere on a nonblocking comm, and what is
 * legal (and what happens) while the async state is InProgress.
 * The raw expectations are written from R1/R2 (docs/nccl-rules.md); the ncfsm ones are
 * in expect_ncfsm.c. */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "conformance.h"

/* R1: nonblocking init of two ranks in one group and its polls. */
static void raw_init(ctx_t *x, obs_t *o) {
  rset_t rs;
  rinit(x, &rs, 0, o, "init", 1);
  AP(data, "n/a");
  rhealth(x, &rs, o);
  rfini(x, &rs);
}
static void nf_init(ctx_t *x, obs_t *o) {
  nset_t ns;
  ninit(x, &ns, 0, 0, o, 1);
  AP(data, "n/a");
  nhealth(ns.c, NR, o);
  nfini(&ns);
}

/* R1: every group end over nonblocking comms returns InProgress on 2.28, also
 * for a plain AllReduce once the comm is connected: 1 first + 5 later ones. */
static void raw_groupend(ctx_t *x, obs_t *o) {
  rset_t rs;
  if (rinit(x, &rs, 0, o, "ge", 0) || ralloc(x, &rs, 1, NI)) { AP(rc, "setup failed"); goto out; }
  int nip = 0, nok = 0, other = 0, okdata = 1;
  char first[80] = "";
  double tge = 0;
  for (int it = 0; it < 6; it++) {
    for (int r = 0; r < NR; r++) fill_i32(x, r, rs.buf[r][0], NI, r + 1);
    int orc[NR], st[NR];
    double t0 = now_ms();
    int ge = rgroup_ar(x, &rs, 0, NI, orc);
    if (it) tge += now_ms() - t0;
    rpoll_all(x, rs.c, NR, st);
    if (it == 0)
      snprintf(first, sizeof first, "ops=%s,%s ge=%s ->%s,%s", rn(orc[0]), rn(orc[1]), rn(ge), rn(st[0]),
               rn(st[1]));
    else if (ge == NCFSM__NCCL_IN_PROGRESS) nip++;
    else if (ge == NCFSM__NCCL_SUCCESS) nok++;
    else other++;
    if (st[0] || st[1]) other++;
    rwait_all(x, &rs);
    okdata &= rcheck(x, &rs, 0, NI, 3);
  }
  AP(rc, "first:%s later5:InProgress=%d Success=%d other=%d", first, nip, nok, other);
  AP(async, "each->Success");
  AP(data, "%s", okdata ? "ok" : "wrong");
  AP(info, "host time of GroupStart+2xAllReduce+GroupEnd, connected: %.1f us mean", tge * 1000 / 5);
  rhealth(x, &rs, o);
out:
  rfini(x, &rs);
}
static void nf_groupend(ctx_t *x, obs_t *o) {
  nset_t ns;
  if (ninit(x, &ns, 0, 0, o, 0) || nalloc(&ns, 1, NI * 4)) { AP(rc, "setup failed"); goto out; }
  int okdata = 1, bad = 0;
  for (int it = 0; it < 6; it++) {
    nfill(x, &ns, 0, NI, 1);
    ncfsm_work *w[NR];
    ncfsm_result_t orc[NR], st[NR];
    ncfsm_result_t ge = ngroup_ar(&ns, 0, NI, w, orc);
    nwait_release(x, w, NR, st);
    bad += orc[0] || orc[1] || ge || st[0] || st[1];
    okdata &= ncheck(x, &ns, 0, NI, 3);
  }
  AP(rc, "6x group_end=OK works=OK bad=%d", bad);
  AP(async, "LAUNCH_PENDING=%d/6 ->READY", ns.launch_pending);
  AP(data, "%s", okdata ? "ok" : "wrong");
  nhealth(ns.c, NR, o);
out:
  nfini(&ns);
}

/* R2: a collective issued while the first launch is InProgress. */
static void raw_during_ip(ctx_t *x, obs_t *o) {
  rset_t rs;
  if (rinit(x, &rs, 0, o, "r2", 0) || ralloc(x, &rs, 2, NI)) { AP(rc, "setup failed"); goto out; }
  for (int r = 0; r < NR; r++) fill_i32(x, r, rs.buf[r][0], NI, r + 1), fill_i32(x, r, rs.buf[r][1], NI, r + 1);
  int orc[NR], orc2[NR], st[NR];
  int ge1 = rgroup_ar(x, &rs, 0, NI, orc);
  int ge2 = rgroup_ar(x, &rs, 1, NI, orc2); /* while the first is InProgress (first op: ~connect) */
  int warn = strstr(lasterr(x, rs.c[0]), "before the previous operation returned ncclSuccess") != NULL;
  rpoll_all(x, rs.c, NR, st);
  rwait_all(x, &rs);
  AP(rc, "ge1=%s second:ops=%s,%s ge=%s%s", rn(ge1), rn(orc2[0]), rn(orc2[1]), rn(ge2),
     warn ? " warn=not-ready" : "");
  AP(async, "->%s,%s", rn(st[0]), rn(st[1]));
  AP(data, "first=%s second=%s", rcheck(x, &rs, 0, NI, 3) ? "ok" : "wrong",
     rcheck(x, &rs, 1, NI, 3) ? "ok" : "wrong");
  rhealth(x, &rs, o);
out:
  rfini(x, &rs);
}
static void nf_during_ip(ctx_t *x, obs_t *o) {
  nset_t ns;
  if (ninit(x, &ns, 0, 0, o, 0) || nalloc(&ns, 2, NI * 4)) { AP(rc, "setup failed"); goto out; }
  nfill(x, &ns, 0, NI, 1);
  nfill(x, &ns, 1, NI, 1);
  ncfsm_work *w1[NR], *w2[NR];
  ncfsm_result_t orc[NR], orc2[NR], st1[NR], st2[NR];
  ncfsm_result_t ge1 = ngroup_ar(&ns, 0, NI, w1, orc);
  nturns_until(x, &ns, pred_launch_ip, ns.c[0]);
  const char *at = stn(ns.c[0]);
  ncfsm_decision_t d = ncfsm_legality(ncfsm_comm_state(ns.c[0]), NCFSM_CALL_ALLREDUCE, NULL, NULL);
  ncfsm_result_t ge2 = ngroup_ar(&ns, 1, NI, w2, orc2);
  nwait_release(x, w1, NR, st1);
  nwait_release(x, w2, NR, st2);
  AP(rc, "ge1=%s second(in %s, %s):ops=%s,%s ge=%s", fn_(ge1), at, ncfsm_decision_name(d), fn_(orc2[0]),
     fn_(orc2[1]), fn_(ge2));
  AP(async, "works=%s,%s,%s,%s ->%s,%s", fn_(st1[0]), fn_(st1[1]), fn_(st2[0]), fn_(st2[1]), stn(ns.c[0]),
     stn(ns.c[1]));
  AP(data, "first=%s second=%s", ncheck(x, &ns, 0, NI, 3) ? "ok" : "wrong",
     ncheck(x, &ns, 1, NI, 3) ? "ok" : "wrong");
  nhealth(ns.c, NR, o);
out:
  nfini(&ns);
}


/* R2: an event recorded right after an InProgress group end vs after the launch is final. */
static void raw_early_event(ctx_t *x, obs_t *o) {
  rset_t rs;
  size_t n = x->is_sim ? (256u << 10) : BIGN;
  void *e1 = NULL, *e2 = NULL;
  if (rinit(x, &rs, 0, o, "ev", 0) || ralloc(x, &rs, 1, n)) { AP(rc, "setup failed"); goto out; }
  for (int r = 0; r < NR; r++) fill_f32(x, r, rs.buf[r][0], n, 1.0f);
  x->be->event_create(0, &e1);
  x->be->event_create(0, &e2);
  int orc[NR], st[NR];
  x->be->group_start();
  for (int r = 0; r < NR; r++)
    orc[r] = rop(x, rs.c[r], NCFSM_KIND_ALLREDUCE, rs.buf[r][0], rs.buf[r][0], n, NCFSM_FLOAT32, -1, rs.s[r]);
  int ge = x->be->group_end();
  double t0 = now_ms();
  x->be->event_record(e1, rs.s[0]);
  /* wait for the early event only (no poll of the comm meanwhile), then look at the first
   * 1024 outputs: still the inputs (1.0) means the event completed before the AllReduce ran */
  double end1 = t0 + (double)x->timeout_ms;
  int q1;
  while ((q1 = x->be->event_query(e1)) == 1 && now_ms() < end1) sched_yield();
  double t1 = now_ms() - t0;
  float head[1024];
  const char *early = "error";
  if (q1 == 0 && rcopy(x, 0, head, rs.buf[0][0], sizeof head, 0) == 0) {
    int n1 = 0, n2 = 0;
    for (int i = 0; i < 1024; i++) n1 += head[i] == 1.0f, n2 += head[i] == 2.0f;
    early = n1 == 1024 ? "complete-before-data" : n2 == 1024 ? "complete-after-data" : "complete-partial-data";
  } else if (q1 == 1) {
    early = "never-complete";
  }
  rpoll_all(x, rs.c, NR, st);
  double tf = now_ms() - t0;
  x->be->event_record(e2, rs.s[0]);
  int q2 = x->be->event_query(e2);
  double t2s = now_ms();
  double end = t2s + (double)x->timeout_ms;
  int q;
  while ((q = x->be->event_query(e2)) == 1 && now_ms() < end) sched_yield();
  double t2 = now_ms() - t2s;
  rwait_stream(x, 1, rs.s[1]);
  AP(rc, "ge=%s", rn(ge));
  AP(async, "->%s,%s", rn(st[0]), rn(st[1]));
  AP(data, "early-event=%s final-event=%s%s %s", early,
     q2 == 0 ? "complete" : q2 == 1 ? "pending" : "error", q2 == 1 ? (q == 0 ? "->complete" : "->hung") : "",
     check_f32(x, 0, rs.buf[0][0], n, 2.0f) && check_f32(x, 1, rs.buf[1][0], n, 2.0f) ? "data-ok" : "data-wrong");
  AP(info, "early event seen complete %.3f ms after the group end; launch final after %.1f ms; final event "
           "complete %.3f ms later (256 MiB AllReduce); ops %s,%s",
     t1, tf, t2, rn(orc[0]), rn(orc[1]));
  rhealth(x, &rs, o);
out:
  if (e1) x->be->event_destroy(e1);
  if (e2) x->be->event_destroy(e2);
  rfini(x, &rs);
}
static void nf_early_event(ctx_t *x, obs_t *o) {
  nset_t ns;
  size_t n = x->is_sim ? (256u << 10) : BIGN;
  if (ninit(x, &ns, 0, 1, o, 0) || nalloc(&ns, 1, n * 4)) { AP(rc, "setup failed"); goto out; }
  for (int r = 0; r < NR; r++) fill_f32(x, r, ns.buf[r][0], n, 1.0f);
  ncfsm_work *w[NR];
  ncfsm_group_start(ns.loop);
  for (int r = 0; r < NR; r++)
    ncfsm_allreduce(ns.c[r], ns.buf[r][0], ns.buf[r][0], n, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[r]);
  ncfsm_result_t ge = ncfsm_group_end(ns.loop);
  ncfsm_result_t st[NR];
  for (int r = 0; r < NR; r++) st[r] = ncfsm_work_wait(w[r], x->timeout_ms);
  ncfsm_work_times t;
  ncfsm_work_get_times(w[0], &t);
  for (int r = 0; r < NR; r++) ncfsm_work_release(w[r]);
  AP(rc, "group_end=%s works=%s,%s", fn_(ge), fn_(st[0]), fn_(st[1]));
  AP(async, "->%s,%s", stn(ns.c[0]), stn(ns.c[1]));
  AP(data, "event-at-final=%s %s", t.ready_at_final == 1 ? "complete" : t.ready_at_final == 0 ? "pending" : "unknown",
     check_f32(x, 0, ns.buf[0][0], n, 2.0f) && check_f32(x, 1, ns.buf[1][0], n, 2.0f) ? "data-ok" : "data-wrong");
  AP(info, "submit->final %.1f ms, final->complete %.3f ms, device %.3f ms",
     (double)(t.final_ns - t.submit_ns) / 1e6, (double)(t.complete_ns - t.final_ns) / 1e6, (double)t.device_ms);
  nhealth(ns.c, NR, o);
out:
  nfini(&ns);
}



const scen_t scen_init = {
    .id = "init", .rule = "R1", .title = "nonblocking init of 2 ranks in one group, then polls",
    .fn = {raw_init, nf_init},
    .raw = {"init:gs=Success init=Success,Success ge=InProgress", "init->Success,Success", "n/a", "healthy"},
    .sim_has_revoke = -1,
};

const scen_t scen_groupend_inprogress = {
    .id = "groupend_inprogress", .rule = "R1",
    .title = "every group end of a plain AllReduce returns InProgress (1 first + 5 connected)",
    .fn = {raw_groupend, nf_groupend},
    .raw = {"first:ops=Success,Success ge=InProgress ->Success,Success later5:InProgress=5 Success=0 other=0",
            "each->Success", "ok", "healthy"},
    .sim_has_revoke = -1,
};

const scen_t scen_call_during_inprogress = {
    .id = "call_during_inprogress", .rule = "R2", .title = "a grouped AllReduce issued while the first launch is InProgress",
    .fn = {raw_during_ip, nf_during_ip},
    .raw = {"ge1=InProgress second:ops=InvalidArgument,InvalidArgument ge=InvalidArgument warn=not-ready",
            "->InvalidArgument,InvalidArgument", "first=ok second=wrong", "poisoned(r0=InvalidArgument r1=InvalidArgument)"},
    .sim_has_revoke = -1, .sim_launch_polls = 200,
};

const scen_t scen_event_after_inprogress = {
    .id = "event_after_inprogress", .rule = "R2",
    .title = "event recorded right after an InProgress group end vs after the launch is final (256 MiB AllReduce)",
    .fn = {raw_early_event, nf_early_event},
    .raw = {"ge=InProgress", "->Success,Success", "early-event=complete-before-data final-event=pending->complete data-ok",
            "healthy"},
    .sim_has_revoke = -1,
    .rev = {2, 1},
};
