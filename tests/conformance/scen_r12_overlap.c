/* R12: operations inside one group are unordered: dependent in-place
 * AllReduces on one buffer in one group, and the same as separate launches.
 * The raw expectations are written from R12 (docs/nccl-rules.md); the ncfsm ones are in
 * expect_ncfsm.c. */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "conformance.h"

/* R12: three in-place AllReduces on ONE buffer in one (nested) group. */
static void raw_r12_group(ctx_t *x, obs_t *o) {
  rset_t rs;
  size_t n = x->is_sim ? NI : R12N;
  if (rinit(x, &rs, 0, o, "r12", 0) || ralloc(x, &rs, 1, n)) { AP(rc, "setup failed"); goto out; }
  for (int r = 0; r < NR; r++) fill_i32(x, r, rs.buf[r][0], n, r + 1);
  int orc[NR], st[NR], ges[3];
  x->be->group_start();
  for (int k = 0; k < 3; k++) ges[k] = rgroup_ar(x, &rs, 0, n, orc);
  int ge = x->be->group_end();
  rpoll_all(x, &rs.c[0], NR, st);
  rwait_all(x, &rs);
  int32_t v0 = 0, v1 = 0;
  int ok = check_i32(x, 0, rs.buf[0][0], n, 12, &v0) & check_i32(x, 1, rs.buf[1][0], n, 12, &v1);
  AP(rc, "inner=%s,%s,%s outer=%s", rn(ges[0]), rn(ges[1]), rn(ges[2]), rn(ge));
  AP(async, "->%s,%s", rn(st[0]), rn(st[1]));
  AP(data, "%s", ok ? "ok" : "wrong");
  AP(info, "expected 12 everywhere; element 0: r0=%d r1=%d", v0, v1);
  rhealth(x, &rs, o);
out:
  rfini(x, &rs);
}
static void nf_r12_group(ctx_t *x, obs_t *o) {
  nset_t ns;
  size_t n = x->is_sim ? NI : R12N;
  if (ninit(x, &ns, 0, 0, o, 0) || nalloc(&ns, 1, n * 4)) { AP(rc, "setup failed"); goto out; }
  nfill(x, &ns, 0, n, 1);
  uint64_t calls0 = nbackend_calls(ns.c[0]);
  ncfsm_work *w[3][NR];
  ncfsm_result_t orc[NR], st[3][NR];
  ncfsm_group_start(ns.loop);
  for (int k = 0; k < 3; k++) ngroup_ar(&ns, 0, n, w[k], orc);
  ncfsm_result_t ge = ncfsm_group_end(ns.loop);
  for (int k = 0; k < 3; k++) nwait_release(x, w[k], NR, st[k]);
  AP(rc, "group_end=%s backend-calls=%llu", fn_(ge),
     (unsigned long long)(nbackend_calls(ns.c[0]) - calls0));
  AP(async, "works=%s ->%s,%s", fn_(st[0][0]), stn(ns.c[0]), stn(ns.c[1]));
  AP(data, "%s", check_i32(x, 0, ns.buf[0][0], n, 1, NULL) && check_i32(x, 1, ns.buf[1][0], n, 2, NULL)
                     ? "unchanged"
                     : "changed");
  nhealth(ns.c, NR, o);
out:
  nfini(&ns);
}

/* R12: the same three AllReduces as three separate launches. */
static void raw_r12_sep(ctx_t *x, obs_t *o) {
  rset_t rs;
  size_t n = x->is_sim ? NI : R12N;
  if (rinit(x, &rs, 0, o, "r12s", 0) || ralloc(x, &rs, 1, n)) { AP(rc, "setup failed"); goto out; }
  for (int r = 0; r < NR; r++) fill_i32(x, r, rs.buf[r][0], n, r + 1);
  char g[64] = "";
  int st[NR];
  for (int k = 0; k < 3; k++) {
    int orc[NR];
    ap(g, sizeof g, "%s", rn(rgroup_ar(x, &rs, 0, n, orc)));
    rpoll_all(x, rs.c, NR, st); /* R2: the next launch only after Success */
  }
  rwait_all(x, &rs);
  AP(rc, "ge=%s", g);
  AP(async, "each->%s,%s", rn(st[0]), rn(st[1]));
  AP(data, "%s", rcheck(x, &rs, 0, n, 12) ? "ok" : "wrong");
  rhealth(x, &rs, o);
out:
  rfini(x, &rs);
}
static void nf_r12_sep(ctx_t *x, obs_t *o) {
  nset_t ns;
  size_t n = x->is_sim ? NI : R12N;
  if (ninit(x, &ns, 0, 0, o, 0) || nalloc(&ns, 1, n * 4)) { AP(rc, "setup failed"); goto out; }
  nfill(x, &ns, 0, n, 1);
  ncfsm_work *w[3][NR];
  ncfsm_result_t orc[NR], st[3][NR];
  char g[64] = "";
  /* submitted back to back: the launcher splits them at the dependency */
  for (int k = 0; k < 3; k++) ap(g, sizeof g, "%s", fn_(ngroup_ar(&ns, 0, n, w[k], orc)));
  for (int k = 0; k < 3; k++) nwait_release(x, w[k], NR, st[k]);
  AP(rc, "group_end=%s", g);
  AP(async, "works=%s,%s,%s ->%s,%s", fn_(st[0][0]), fn_(st[1][0]), fn_(st[2][0]), stn(ns.c[0]),
     stn(ns.c[1]));
  AP(data, "%s", ncheck(x, &ns, 0, n, 12) ? "ok" : "wrong");
  nhealth(ns.c, NR, o);
out:
  nfini(&ns);
}


const scen_t scen_r12_same_buffer_group = {
    .id = "r12_same_buffer_group", .rule = "R12", .title = "three in-place AllReduces on one buffer in one nested group",
    .fn = {raw_r12_group, nf_r12_group},
    .raw = {"inner=Success,Success,Success outer=InProgress", "->Success,Success", "wrong", "healthy"},
    .sim_has_revoke = -1,
};

const scen_t scen_r12_separate_launches = {
    .id = "r12_separate_launches", .rule = "R12", .title = "the same three AllReduces as three separate launches",
    .fn = {raw_r12_sep, nf_r12_sep},
    .raw = {"ge=InProgress InProgress InProgress", "each->Success,Success", "ok", "healthy"},
    .sim_has_revoke = -1,
};
