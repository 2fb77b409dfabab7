/* R8: Split, R7: Shrink (NCCL >= 2.27.3), on 2 nonblocking ranks driven by
 * one thread. The raw expectations are written from R7 and R8 (docs/nccl-rules.md);
 * the ncfsm ones are in expect_ncfsm.c.
 *
 *   split_child_handle  both ranks split (one color) inside one group: the
 *                       child handles right after the group end, after the
 *                       parents polled to success, then the children's own
 *                       init, and an AllReduce on them
 *   shrink_default      rank 0 shrinks rank 1 away (rank 1 makes no call):
 *                       the 1-rank child works, the parent stays healthy
 *   shrink_abort_stuck  rank 0 has an AllReduce stuck (rank 1 never joins):
 *                       NCCL_SHRINK_ABORT terminates it, the child works, the
 *                       parent must be aborted (R7)
 */
#include <stdio.h>
#include <string.h>

#include "conformance.h"

static const char *hn(void *p) { return p ? "set" : "NULL"; }

/* Poll a child until its init is done; the AllReduce of each child on its own
 * buffer, checked against want. Returns "ok", "wrong" or the failure. */
static const char *child_allreduce(ctx_t *x, void **child, int n, int32_t **buf, void **s, int32_t want) {
  int orc[NR] = {0, 0};
  x->be->group_start();
  for (int r = 0; r < n; r++)
    if (child[r]) orc[r] = rop(x, child[r], NCFSM_KIND_ALLREDUCE, buf[r], buf[r], 1024, NCFSM_INT32, -1, s[r]);
  int ge = x->be->group_end();
  if (ge && ge != NCFSM__NCCL_IN_PROGRESS) return "launch-failed";
  for (int r = 0; r < n; r++)
    if (orc[r] && orc[r] != NCFSM__NCCL_IN_PROGRESS) return "launch-failed";
  int st[NR];
  rpoll_all(x, child, n, st);
  for (int r = 0; r < n; r++)
    if (child[r] && (st[r] != NCFSM__NCCL_SUCCESS || rwait_stream(x, r, s[r]) != 0)) return "not-complete";
  for (int r = 0; r < n; r++)
    if (child[r] && !check_i32(x, r, buf[r], 1024, want, NULL)) return "wrong";
  return "ok";
}

static void raw_split(ctx_t *x, obs_t *o) {
  rset_t rs;
  void *child[NR] = {NULL, NULL};
  if (rinit(x, &rs, 0, o, "splt", 0) || ralloc(x, &rs, 1, 1024)) { AP(rc, "setup failed"); goto out; }
  ncfsm__comm_config cfg = {0, 0, &x->so, "split-child"};
  int src[NR];
  int gs = x->be->group_start();
  for (int r = 0; r < NR; r++) {
    cfg.device = r;
    src[r] = x->be->comm_split(rs.c[r], 0, r, &child[r], &cfg);
  }
  int ge = x->be->group_end();
  const char *h0 = hn(child[0]), *h1 = hn(child[1]);
  int pst[NR], cst[NR];
  rpoll_all(x, rs.c, NR, pst);
  const char *a0 = hn(child[0]), *a1 = hn(child[1]);
  rpoll_all(x, child, NR, cst);
  AP(rc, "gs=%s split=%s,%s ge=%s child_after_ge=%s,%s", rn(gs), rn(src[0]), rn(src[1]), rn(ge), h0, h1);
  AP(async, "parent->%s,%s child=%s,%s child->%s,%s", rn(pst[0]), rn(pst[1]), a0, a1, rn(cst[0]), rn(cst[1]));
  if (child[0] && child[1]) {
    for (int r = 0; r < NR; r++) fill_i32(x, r, rs.buf[r][0], 1024, r + 1);
    AP(data, "%s", child_allreduce(x, child, NR, (int32_t *[]){rs.buf[0][0], rs.buf[1][0]}, rs.s, 3));
  } else {
    AP(data, "n/a");
  }
  rhealth(x, &rs, o);
out:
  x->be->group_start();
  for (int r = 0; r < NR; r++)
    if (child[r]) x->be->abort(child[r]);
  x->be->group_end();
  rfini(x, &rs);
}

static void nf_split(ctx_t *x, obs_t *o) {
  nset_t ns;
  ncfsm_comm *ch[NR] = {NULL, NULL};
  if (ninit(x, &ns, 0, 0, o, 0)) { AP(rc, "setup failed"); goto out; }
  ncfsm_comm_opts opt;
  ncfsm_comm_opts_init(&opt);
  opt.backend = x->kind;
  opt.sim = &x->so;
  opt.name = "conf-child";
  ncfsm_result_t sr[NR], w[NR];
  char st[NR][32];
  for (int r = 0; r < NR; r++) {
    opt.device = r;
    if (ncfsm_comm_new(ns.loop, &opt, &ch[r]) != NCFSM_OK) { AP(rc, "setup failed"); goto out; }
    sr[r] = ncfsm_comm_split(ns.c[r], 0, r, ch[r]);
    snprintf(st[r], sizeof st[r], "%s/%s", stn(ns.c[r]), stn(ch[r]));
  }
  for (int r = 0; r < NR; r++) w[r] = ncfsm_comm_wait_state(ch[r], NCFSM_STATE_READY, x->timeout_ms);
  AP(rc, "split=%s,%s wait=%s,%s", fn_(sr[0]), fn_(sr[1]), fn_(w[0]), fn_(w[1]));
  AP(async, "%s,%s->%s/%s,%s/%s", st[0], st[1], stn(ns.c[0]), stn(ch[0]), stn(ns.c[1]), stn(ch[1]));
  void *b[NR] = {NULL, NULL};
  ncfsm_work *wk[NR] = {NULL, NULL};
  ncfsm_result_t orc[NR], ws[NR];
  for (int r = 0; r < NR; r++) {
    if (ncfsm_mem_alloc(ch[r], 1024 * sizeof(int32_t), &b[r]) != NCFSM_OK) { AP(data, "alloc failed"); goto health; }
    fill_i32(x, r, b[r], 1024, r + 1);
  }
  for (int r = 0; r < NR; r++)
    orc[r] = ncfsm_allreduce(ch[r], b[r], b[r], 1024, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &wk[r]);
  nwait_release(x, wk, NR, ws);
  AP(data, "%s", orc[0] == NCFSM_OK && orc[1] == NCFSM_OK && ws[0] == NCFSM_OK && ws[1] == NCFSM_OK &&
                          check_i32(x, 0, b[0], 1024, 3, NULL) && check_i32(x, 1, b[1], 1024, 3, NULL)
                      ? "ok"
                      : "wrong");
health:
  for (int r = 0; r < NR; r++)
    if (b[r]) ncfsm_mem_free(ch[r], b[r]);
  nhealth(ns.c, NR, o);
out:
  for (int r = 0; r < NR; r++)
    if (ch[r]) {
      if (ncfsm_comm_state(ch[r]) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(ch[r]);
      ncfsm_comm_release(ch[r]);
    }
  nfini(&ns);
}

/* stuck: rank 0 posts an AllReduce that rank 1 never joins, then shrinks
 * with NCCL_SHRINK_ABORT; else a DEFAULT shrink of an idle parent. */
static void raw_shrink(ctx_t *x, obs_t *o, int stuck) {
  rset_t rs;
  void *child = NULL;
  if (rinit(x, &rs, 0, o, "shr", 0) || ralloc(x, &rs, 2, 1024)) { AP(rc, "setup failed"); goto out; }
  if (!(x->features & NCFSM__HAS_SHRINK)) {
    AP(rc, "unsupported");
    AP(async, "n/a");
    AP(data, "n/a");
    rhealth(x, &rs, o);
    goto out;
  }
  char pre[64] = "";
  if (stuck) {
    fill_i32(x, 0, rs.buf[0][1], 1024, 7);
    int orc = rop(x, rs.c[0], NCFSM_KIND_ALLREDUCE, rs.buf[0][1], rs.buf[0][1], 1024, NCFSM_INT32, -1, rs.s[0]);
    int pst = rpoll(x, rs.c[0], NULL);
    snprintf(pre, sizeof pre, "stuck ar=%s->%s ", rn(orc), rn(pst));
  }
  ncfsm__comm_config cfg = {0, 0, &x->so, "shrink-child"};
  int ex = 1;
  int src = x->be->comm_shrink(rs.c[0], &ex, 1, &child, &cfg, stuck ? NCFSM__SHRINK_ABORT : NCFSM__SHRINK_DEFAULT);
  const char *h = hn(child);
  int pst = rpoll(x, rs.c[0], NULL);
  const char *a = hn(child);
  int cst = child ? rpoll(x, child, NULL) : -1;
  AP(rc, "%sshrink=%s child_after_call=%s", pre, rn(src), h);
  AP(async, "parent->%s child=%s child->%s", rn(pst), a, child ? rn(cst) : "-");
  if (child) {
    fill_i32(x, 0, rs.buf[0][0], 1024, 5);
    void *c2[NR] = {child, NULL};
    AP(data, "%s", child_allreduce(x, c2, 1, (int32_t *[]){rs.buf[0][0], NULL}, rs.s, 5));
  } else {
    AP(data, "n/a");
  }
  /* R7: after NCCL_SHRINK_ABORT the parent is aborted; after a DEFAULT shrink it is still usable */
  rhealth(x, &rs, o);
out:
  if (child) x->be->abort(child);
  rfini(x, &rs);
}
static void raw_shrink_default(ctx_t *x, obs_t *o) { raw_shrink(x, o, 0); }
static void raw_shrink_abort(ctx_t *x, obs_t *o) { raw_shrink(x, o, 1); }

static void nf_shrink(ctx_t *x, obs_t *o, int stuck) {
  nset_t ns;
  ncfsm_comm *ch = NULL;
  if (ninit(x, &ns, 0, 0, o, 0) || nalloc(&ns, 2, 1024 * sizeof(int32_t))) { AP(rc, "setup failed"); goto out; }
  ncfsm_comm_opts opt;
  ncfsm_comm_opts_init(&opt);
  opt.backend = x->kind;
  opt.sim = &x->so;
  opt.name = "conf-child";
  if (ncfsm_comm_new(ns.loop, &opt, &ch) != NCFSM_OK) { AP(rc, "setup failed"); goto out; }
  char pre[96] = "";
  ncfsm_work *stuck_w = NULL;
  if (stuck) {
    ncfsm_result_t orc = ncfsm_allreduce(ns.c[0], ns.buf[0][1], ns.buf[0][1], 1024, NCFSM_INT32, NCFSM_OP_SUM,
                                         NULL, NULL, NULL, &stuck_w);
    for (int i = 0; i < 20; i++) ncfsm_loop_run(ns.loop, NCFSM_RUN_NOWAIT);
    snprintf(pre, sizeof pre, "stuck ar=%s(%s) ", fn_(orc), stuck_w ? ncfsm_work_state_name(ncfsm_work_state(stuck_w)) : "-");
  }
  int ex = 1;
  ncfsm_result_t sr = ncfsm_comm_shrink(ns.c[0], &ex, 1, stuck ? NCFSM_SHRINK_ABORT : NCFSM_SHRINK_DEFAULT, ch);
  char st[64];
  snprintf(st, sizeof st, "%s/%s", stn(ns.c[0]), stn(ch));
  ncfsm_result_t w = ncfsm_comm_wait_state(ch, NCFSM_STATE_READY, x->timeout_ms);
  ncfsm_result_t ws = NCFSM_OK;
  if (stuck_w) {
    ws = ncfsm_work_wait(stuck_w, x->timeout_ms);
    ncfsm_work_release(stuck_w);
  }
  AP(rc, "%sshrink=%s wait=%s%s%s", pre, fn_(sr), fn_(w), stuck ? " stuck_work=" : "", stuck ? fn_(ws) : "");
  for (int i = 0; i < 5; i++) ncfsm_loop_run(ns.loop, NCFSM_RUN_NOWAIT);
  AP(async, "%s->%s/%s", st, stn(ns.c[0]), stn(ch));
  void *b = NULL;
  ncfsm_work *wk[1] = {NULL};
  ncfsm_result_t orc = NCFSM_ERR_AGAIN, rs[1] = {NCFSM_ERR_AGAIN};
  if (ncfsm_comm_state(ch) == NCFSM_STATE_READY && ncfsm_mem_alloc(ch, 1024 * sizeof(int32_t), &b) == NCFSM_OK) {
    fill_i32(x, 0, b, 1024, 5);
    orc = ncfsm_allreduce(ch, b, b, 1024, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &wk[0]);
    nwait_release(x, wk, 1, rs);
  }
  AP(data, "%s", b && orc == NCFSM_OK && rs[0] == NCFSM_OK && check_i32(x, 0, b, 1024, 5, NULL) ? "ok" : "wrong");
  if (b) ncfsm_mem_free(ch, b);
  ncfsm_comm *hc[1] = {ns.c[0]};
  nhealth(hc, 1, o);
out:
  if (ch) {
    if (ncfsm_comm_state(ch) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(ch);
    ncfsm_comm_release(ch);
  }
  nfini(&ns);
}
static void nf_shrink_default(ctx_t *x, obs_t *o) { nf_shrink(x, o, 0); }
static void nf_shrink_abort(ctx_t *x, obs_t *o) { nf_shrink(x, o, 1); }

const scen_t scen_split_child_handle = {
    .id = "split_child_handle", .rule = "R8",
    .title = "split in one group: the child handle is NULL until the parent polls to success, then the child polls its init",
    .fn = {raw_split, nf_split},
    .raw = {"gs=Success split=Success,Success ge=InProgress child_after_ge=NULL,NULL",
            "parent->Success,Success child=set,set child->Success,Success", "ok", "healthy"},
    .sim_has_revoke = -1,
};

const scen_t scen_shrink_default = {
    .id = "shrink_default", .rule = "R7",
    .title = "shrink (default mode) of an idle parent: rank 1 excluded and silent; the child works, the parent stays healthy",
    .fn = {raw_shrink_default, nf_shrink_default},
    .raw = {"shrink=InProgress child_after_call=NULL", "parent->Success child=set child->Success", "ok", "healthy"},
    .sim_has_revoke = -1,
};

const scen_t scen_shrink_abort_stuck = {
    .id = "shrink_abort_stuck", .rule = "R7",
    .title = "NCCL_SHRINK_ABORT with an AllReduce stuck on the excluded rank: terminated; the child works",
    .fn = {raw_shrink_abort, nf_shrink_abort},
    .raw = {"stuck ar=InProgress->Success shrink=InProgress child_after_call=NULL", "parent->Success child=set child->Success",
            "ok", "healthy"},
    .sim_has_revoke = -1,
};
