/* R4: Finalize and Destroy, and the cross-communicator cascade first
 * described after a second Finalize (never seen on real NCCL: docs/nccl-rules.md).
 * The raw expectations are written from R4 as first described; the ncfsm ones are in
 * expect_ncfsm.c. */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "conformance.h"

/* R4: finalize once: InProgress, then Success. */
static void raw_fin_once(ctx_t *x, obs_t *o) {
  rset_t rs;
  if (rinit(x, &rs, 0, o, "fin", 0)) { AP(rc, "setup failed"); goto out; }
  int f[NR], st[NR];
  for (int r = 0; r < NR; r++) f[r] = x->be->finalize(rs.c[r]);
  rpoll_all(x, rs.c, NR, st);
  AP(rc, "finalize=%s,%s", rn(f[0]), rn(f[1]));
  AP(async, "->%s,%s", rn(st[0]), rn(st[1]));
  AP(data, "n/a");
  rhealth(x, &rs, o);
out:
  rfini(x, &rs);
}
static void nf_fin_once(ctx_t *x, obs_t *o) {
  nset_t ns;
  if (ninit(x, &ns, 0, 0, o, 0)) { AP(rc, "setup failed"); goto out; }
  ncfsm_result_t f0 = ncfsm_comm_finalize(ns.c[0]), f1 = ncfsm_comm_finalize(ns.c[1]);
  const char *s = stn(ns.c[0]);
  ncfsm_result_t w0 = ncfsm_comm_wait_state(ns.c[0], NCFSM_STATE_FINALIZED, x->timeout_ms);
  ncfsm_result_t w1 = ncfsm_comm_wait_state(ns.c[1], NCFSM_STATE_FINALIZED, x->timeout_ms);
  AP(rc, "finalize=%s,%s wait=%s,%s", fn_(f0), fn_(f1), fn_(w0), fn_(w1));
  AP(async, "%s->%s,%s", s, stn(ns.c[0]), stn(ns.c[1]));
  AP(data, "n/a");
  AP(health, "%s", ncfsm_comm_state(ns.c[0]) == NCFSM_STATE_FINALIZED ? "finalized" : "not-finalized");
out:
  nfini(&ns);
}

/* R4: a second finalize (while the first runs or after it). */
static void raw_fin_twice(ctx_t *x, obs_t *o) {
  rset_t rs;
  if (rinit(x, &rs, 0, o, "fin2", 0)) { AP(rc, "setup failed"); goto out; }
  int f[NR], st[NR];
  for (int r = 0; r < NR; r++) f[r] = x->be->finalize(rs.c[r]);
  int f2 = x->be->finalize(rs.c[0]);
  rpoll_all(x, rs.c, NR, st);
  AP(rc, "finalize=%s,%s again(r0)=%s", rn(f[0]), rn(f[1]), rn(f2));
  AP(async, "->%s,%s", rn(st[0]), rn(st[1]));
  AP(data, "n/a");
  rhealth(x, &rs, o);
out:
  rfini(x, &rs);
}
static void nf_fin_twice(ctx_t *x, obs_t *o) {
  nset_t ns;
  if (ninit(x, &ns, 0, 0, o, 0)) { AP(rc, "setup failed"); goto out; }
  ncfsm_result_t f0 = ncfsm_comm_finalize(ns.c[0]), f1 = ncfsm_comm_finalize(ns.c[1]);
  const char *s = stn(ns.c[0]);
  ncfsm_result_t f2 = ncfsm_comm_finalize(ns.c[0]);
  int r4 = strstr(ncfsm_comm_last_error(ns.c[0]), "(R4)") != NULL;
  ncfsm_comm_wait_state(ns.c[0], NCFSM_STATE_FINALIZED, x->timeout_ms);
  ncfsm_comm_wait_state(ns.c[1], NCFSM_STATE_FINALIZED, x->timeout_ms);
  AP(rc, "finalize=%s,%s again(r0, in %s)=%s%s", fn_(f0), fn_(f1), s, fn_(f2), r4 ? " msg=R4" : "");
  AP(async, "->%s,%s", stn(ns.c[0]), stn(ns.c[1]));
  AP(data, "n/a");
  AP(health, "%s", ncfsm_comm_state(ns.c[0]) == NCFSM_STATE_FINALIZED ? "finalized" : "not-finalized");
out:
  nfini(&ns);
}

/* R4: destroy after finalize. */
static void raw_destroy(ctx_t *x, obs_t *o) {
  rset_t rs;
  if (rinit(x, &rs, 0, o, "dst", 0)) { AP(rc, "setup failed"); goto out; }
  int st[NR], d[NR];
  for (int r = 0; r < NR; r++) x->be->finalize(rs.c[r]);
  rpoll_all(x, rs.c, NR, st);
  double t0 = now_ms();
  for (int r = 0; r < NR; r++) {
    d[r] = x->be->destroy(rs.c[r]);
    if (d[r] == NCFSM__NCCL_SUCCESS) rs.c[r] = NULL;
  }
  AP(rc, "finalize->%s,%s destroy=%s,%s", rn(st[0]), rn(st[1]), rn(d[0]), rn(d[1]));
  AP(async, "n/a");
  AP(data, "n/a");
  AP(info, "destroy x2 %.2f ms", now_ms() - t0);
  rhealth(x, &rs, o);
out:
  rfini(x, &rs);
}
static void nf_destroy(ctx_t *x, obs_t *o) {
  nset_t ns;
  if (ninit(x, &ns, 0, 0, o, 0)) { AP(rc, "setup failed"); goto out; }
  for (int r = 0; r < NR; r++) ncfsm_comm_finalize(ns.c[r]);
  for (int r = 0; r < NR; r++) ncfsm_comm_wait_state(ns.c[r], NCFSM_STATE_FINALIZED, x->timeout_ms);
  ncfsm_result_t d0 = ncfsm_comm_destroy(ns.c[0]), d1 = ncfsm_comm_destroy(ns.c[1]);
  AP(rc, "finalize->%s destroy=%s,%s", "FINALIZED", fn_(d0), fn_(d1));
  AP(async, "n/a");
  AP(data, "n/a");
  nhealth(ns.c, NR, o);
out:
  nfini(&ns);
}

/* R4 cascade: a second finalize poisons, destroy is refused, and the NEXT comm
 * created on this thread fails with the blocking/nonblocking mixing WARN. */
static void raw_cascade_run(ctx_t *x, obs_t *o, int poll_first) {
  rset_t rs, nx;
  memset(&nx, 0, sizeof nx);
  if (rinit(x, &rs, 0, o, "casc", 0)) { AP(rc, "setup failed"); goto out; }
  int st[NR] = {NCFSM__NCCL_IN_PROGRESS, NCFSM__NCCL_IN_PROGRESS};
  for (int r = 0; r < NR; r++) x->be->finalize(rs.c[r]);
  int f2 = x->be->finalize(rs.c[0]);
  if (poll_first) rpoll_all(x, rs.c, NR, st);
  else x->be->get_async_error(rs.c[0], &st[0]); /* one poll: the state the destroy meets */
  double t0 = now_ms();
  int d = x->be->destroy(rs.c[0]);
  double td = now_ms() - t0;
  if (d == NCFSM__NCCL_SUCCESS) rs.c[0] = NULL;
  /* the next clique on this thread */
  ncfsm_unique_id id;
  x->be->get_unique_id(&id);
  ncfsm__comm_config cfg = {0, 0, &x->so, "next"};
  int irc[NR], nst[NR];
  int gs = x->be->group_start();
  for (int r = 0; r < NR; r++) {
    cfg.device = r;
    irc[r] = x->be->comm_init(&nx.c[r], NR, &id, r, &cfg);
  }
  int mix = strstr(lasterr(x, NULL), "Blocking and nonblocking") != NULL;
  int ge = x->be->group_end();
  mix |= strstr(lasterr(x, NULL), "Blocking and nonblocking") != NULL;
  rpoll_all(x, nx.c, NR, nst);
  AP(rc, "finalize-again=%s destroy(r0)=%s next:gs=%s init=%s,%s ge=%s%s", rn(f2), rn(d), rn(gs),
     rn(irc[0]), rn(irc[1]), rn(ge), mix ? " warn=blocking-nonblocking-mix" : "");
  AP(async, "r0=%s next=%s,%s", rn(st[0]), nx.c[0] ? rn(nst[0]) : "none", nx.c[1] ? rn(nst[1]) : "none");
  AP(data, "n/a");
  AP(info, "destroy(r0) returned after %.3f ms", td);
  rhealth(x, &nx, o);
out:
  rfini(x, &rs);
  rfini(x, &nx);
}
static void raw_cascade(ctx_t *x, obs_t *o) { raw_cascade_run(x, o, 1); }
static void raw_cascade_np(ctx_t *x, obs_t *o) { raw_cascade_run(x, o, 0); }
static void nf_cascade(ctx_t *x, obs_t *o) {
  nset_t ns, nx;
  memset(&nx, 0, sizeof nx);
  if (ninit(x, &ns, 0, 0, o, 0)) { AP(rc, "setup failed"); goto out; }
  for (int r = 0; r < NR; r++) ncfsm_comm_finalize(ns.c[r]);
  ncfsm_result_t f2 = ncfsm_comm_finalize(ns.c[0]);
  ncfsm_result_t dd = ncfsm_comm_destroy(ns.c[0]); /* while FINALIZING: refused before NCCL */
  for (int r = 0; r < NR; r++) ncfsm_comm_wait_state(ns.c[r], NCFSM_STATE_FINALIZED, x->timeout_ms);
  ncfsm_result_t d0 = ncfsm_comm_destroy(ns.c[0]), d1 = ncfsm_comm_destroy(ns.c[1]);
  int ok = 0;
  if (ninit(x, &nx, 0, 0, o, 0) == 0 && nalloc(&nx, 1, NI * 4) == 0) {
    nfill(x, &nx, 0, NI, 1);
    ncfsm_work *w[NR];
    ncfsm_result_t orc[NR], wst[NR];
    ngroup_ar(&nx, 0, NI, w, orc);
    nwait_release(x, w, NR, wst);
    ok = ncheck(x, &nx, 0, NI, 3) && !wst[0] && !wst[1];
  }
  AP(rc, "finalize-again=%s destroy-early=%s destroy=%s,%s next:init+ar", fn_(f2), fn_(dd), fn_(d0), fn_(d1));
  AP(async, "old=%s,%s next=%s,%s", stn(ns.c[0]), stn(ns.c[1]), nx.c[0] ? stn(nx.c[0]) : "none",
     nx.c[1] ? stn(nx.c[1]) : "none");
  AP(data, "next-ar=%s", ok ? "ok" : "wrong");
  if (nx.c[0]) nhealth(nx.c, NR, o);
  else AP(health, "next-missing");
out:
  nfini(&ns);
  nfini(&nx);
}



const scen_t scen_finalize_once = {
    .id = "finalize_once", .rule = "R4", .title = "finalize from READY: InProgress, then Success",
    .fn = {raw_fin_once, nf_fin_once},
    .raw = {"finalize=InProgress,InProgress", "->Success,Success", "n/a", "healthy"},
    .sim_has_revoke = -1,
};

const scen_t scen_finalize_twice = {
    .id = "finalize_twice", .rule = "R4", .title = "a second finalize on rank 0",
    .fn = {raw_fin_twice, nf_fin_twice},
    .raw = {"finalize=InProgress,InProgress again(r0)=InvalidArgument", "->InvalidArgument,Success", "n/a",
            "poisoned(r0=InvalidArgument r1=Success)"},
    .sim_has_revoke = -1,
};

const scen_t scen_destroy_after_finalize = {
    .id = "destroy_after_finalize", .rule = "R4", .title = "destroy after finalize polled to success",
    .fn = {raw_destroy, nf_destroy},
    .raw = {"finalize->Success,Success destroy=Success,Success", "n/a", "n/a", "closed"},
    .sim_has_revoke = -1,
};

/* destroy_poisoned_cascade, raw on real NCCL: R4's cascade as first described (the
 * next comm on the thread failing with the mixing WARN) was never seen; what
 * the Destroy after the poll returns depends on timing inside NCCL (counts in
 * docs/conformance.md, "Rows that vary"). Every outcome observed so far: */
static const outcome_t cascade_poisoned_outcomes[] = {
    {{"finalize-again=InvalidArgument destroy(r0)=Success next:gs=Success init=Success,Success ge=InProgress",
      "r0=InvalidArgument next=Success,Success", "n/a", "healthy"},
     "the poll after the second Finalize returned InvalidArgument, then Destroy succeeded and the next comm on "
     "the thread initialised (no cascade); the common outcome on 2.28.3 and 2.28.9",
     {"docs/results/conformance-2.28.3.json", "docs/results/conformance-2.28.9.json",
      "docs/results/conformance-2.28.3.txt", "docs/results/conformance-2.28.9.txt"}},
    {{"finalize-again=InvalidArgument destroy(r0)=InvalidArgument next:gs=Success init=Success,Success ge=Success",
      "r0=InvalidArgument next=Success,Success", "n/a", "healthy"},
     "the poll after the second Finalize returned InvalidArgument, then Destroy was refused with InvalidArgument "
     "(as in destroy_inprogress_cascade) and the next comm on the thread still initialised (no cascade); seen "
     "on 2.28.3 and 2.28.9 in a few runs out of sixteen",
     {"docs/conformance.md"}},
};
static const varies_t cascade_poisoned_varies = {
    "raw", "nccl", cascade_poisoned_outcomes,
    (int)(sizeof cascade_poisoned_outcomes / sizeof cascade_poisoned_outcomes[0]),
};

const scen_t scen_destroy_poisoned_cascade = {
    .id = "destroy_poisoned_cascade", .rule = "R4",
    .title = "second finalize, destroy of the poisoned comm, then the NEXT comm created on the thread",
    .fn = {raw_cascade, nf_cascade},
    .raw = {"finalize-again=InvalidArgument destroy(r0)=InvalidArgument next:gs=Success init=InvalidArgument,"
            "InvalidArgument ge=InvalidArgument warn=blocking-nonblocking-mix",
            "r0=InvalidArgument next=none,none", "n/a", "closed"},
    .varies = &cascade_poisoned_varies,
    .sim_has_revoke = -1,
};

const scen_t scen_destroy_inprogress_cascade = {
    .id = "destroy_inprogress_cascade", .rule = "R4",
    .title = "second finalize, destroy of rank 0 at once (no poll), then the NEXT comm created on the thread",
    .fn = {raw_cascade_np, nf_cascade},
    .raw = {"finalize-again=InvalidArgument destroy(r0)=InvalidArgument next:gs=Success init=InvalidArgument,"
            "InvalidArgument ge=InvalidArgument warn=blocking-nonblocking-mix",
            "r0=InProgress next=none,none", "n/a", "closed"},
    .sim_has_revoke = -1,
};
