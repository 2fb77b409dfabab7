/* R6: Revoke (NCCL >= 2.28.7): revoke, an AllReduce after it, destroy; on a
 * runtime without Revoke (2.28.3, or the sim told so) it is unsupported.
 * The raw expectations are written from R6 (docs/nccl-rules.md); the ncfsm ones are in
 * expect_ncfsm.c. */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "conformance.h"

/* R6: Revoke (absent on 2.28.3: unsupported; on >= 2.28.7: revoke, then destroy). */
static void raw_revoke(ctx_t *x, obs_t *o) {
  rset_t rs;
  if (rinit(x, &rs, 0, o, "rvk", 0) || ralloc(x, &rs, 1, NI)) { AP(rc, "setup failed"); goto out; }
  for (int r = 0; r < NR; r++) fill_i32(x, r, rs.buf[r][0], NI, r + 1);
  int orc[NR], st[NR];
  rgroup_ar(x, &rs, 0, NI, orc);
  rpoll_all(x, rs.c, NR, st);
  rwait_all(x, &rs);
  int v[NR];
  for (int r = 0; r < NR; r++) v[r] = x->be->revoke(rs.c[r], 0);
  if (!(x->features & NCFSM__HAS_REVOKE)) {
    int msg = strstr(lasterr(x, rs.c[0]), "needs >= 2.28.7") || strstr(lasterr(x, rs.c[0]), "not available");
    AP(rc, "revoke=%s,%s%s", rn(v[0]), rn(v[1]), msg ? " msg=unsupported" : "");
    AP(async, "n/a");
    AP(data, "n/a");
    rhealth(x, &rs, o);
    goto out;
  }
  int sr[NR], d[NR];
  rpoll_all(x, rs.c, NR, sr);
  int ge = rgroup_ar(x, &rs, 0, NI, orc);
  for (int r = 0; r < NR; r++) {
    d[r] = x->be->destroy(rs.c[r]);
    if (d[r] == NCFSM__NCCL_SUCCESS) rs.c[r] = NULL;
  }
  AP(rc, "revoke=%s,%s then ar:ops=%s,%s ge=%s destroy=%s,%s", rn(v[0]), rn(v[1]), rn(orc[0]), rn(orc[1]),
     rn(ge), rn(d[0]), rn(d[1]));
  AP(async, "revoke->%s,%s", rn(sr[0]), rn(sr[1]));
  AP(data, "n/a");
  rhealth(x, &rs, o);
out:
  rfini(x, &rs);
}
static void nf_revoke(ctx_t *x, obs_t *o) {
  nset_t ns;
  if (ninit(x, &ns, 0, 0, o, 0)) { AP(rc, "setup failed"); goto out; }
  ncfsm_result_t v0 = ncfsm_comm_revoke(ns.c[0]), v1 = ncfsm_comm_revoke(ns.c[1]);
  if (v0 == NCFSM_ERR_UNSUPPORTED) {
    AP(rc, "revoke=%s,%s%s", fn_(v0), fn_(v1), strstr(ncfsm_comm_last_error(ns.c[0]), "R6") ? " msg=R6" : "");
    AP(async, "->%s,%s", stn(ns.c[0]), stn(ns.c[1]));
    AP(data, "n/a");
    nhealth(ns.c, NR, o);
    goto out;
  }
  ncfsm_result_t w0 = ncfsm_comm_wait_state(ns.c[0], NCFSM_STATE_REVOKED, x->timeout_ms);
  ncfsm_result_t w1 = ncfsm_comm_wait_state(ns.c[1], NCFSM_STATE_REVOKED, x->timeout_ms);
  int32_t dummy[4];
  ncfsm_result_t ar = ncfsm_allreduce(ns.c[0], dummy, dummy, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL);
  ncfsm_result_t d0 = ncfsm_comm_destroy(ns.c[0]), d1 = ncfsm_comm_destroy(ns.c[1]);
  AP(rc, "revoke=%s,%s wait=%s,%s then ar=%s destroy=%s,%s", fn_(v0), fn_(v1), fn_(w0), fn_(w1), fn_(ar), fn_(d0),
     fn_(d1));
  AP(async, "->REVOKED->%s,%s", stn(ns.c[0]), stn(ns.c[1]));
  AP(data, "n/a");
  nhealth(ns.c, NR, o);
out:
  nfini(&ns);
}


#define RAW_REVOKE_UNSUPPORTED {"revoke=InvalidUsage,InvalidUsage msg=unsupported", "n/a", "n/a", "healthy"}

const scen_t scen_revoke = {
    .id = "revoke", .rule = "R6", .title = "Revoke (>= 2.28.7): revoke, an AllReduce after it, destroy; else unsupported",
    .fn = {raw_revoke, nf_revoke},
    .raw = {"revoke=InProgress,InProgress then ar:ops=InvalidUsage,InvalidUsage ge=InvalidUsage destroy=Success,Success",
            "revoke->Success,Success", "n/a", "closed"},
    .raw_norevoke = RAW_REVOKE_UNSUPPORTED,
    .sim_has_revoke = -1,
};

const scen_t scen_revoke_absent_sim = {
    .id = "revoke_absent_sim", .rule = "R6", .title = "the sim modelling 2.28.3 (NCFSM_SIM_NCCL_VERSION=22803): unsupported",
    .fn = {raw_revoke, nf_revoke},
    .raw_norevoke = RAW_REVOKE_UNSUPPORTED,
    .sim_only = 1, .sim_has_revoke = -1, .sim_version = 22803,
};

const scen_t scen_revoke_absent_sim_knob = {
    .id = "revoke_absent_sim_knob", .rule = "R6",
    .title = "the sim's per-comm has_revoke=0 knob (2.28.3 per comm): unsupported",
    .fn = {raw_revoke, nf_revoke},
    .raw_norevoke = RAW_REVOKE_UNSUPPORTED,
    .sim_only = 1, .sim_has_revoke = 0,
};
