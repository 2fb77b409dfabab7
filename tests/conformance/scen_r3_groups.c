/* R3: groups are thread-local and depth-counted; argument errors inside a
 * group; several streams in one group; blocking and nonblocking comms.
 * The raw expectations are written from R3 (docs/nccl-rules.md); the ncfsm ones are in
 * expect_ncfsm.c. */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "conformance.h"

/* R3: GroupEnd at depth 0. */
static void raw_ge_nostart(ctx_t *x, obs_t *o) {
  int ge = x->be->group_end();
  int warn = strstr(lasterr(x, NULL), "not in a group call") != NULL;
  AP(rc, "ge=%s%s", rn(ge), warn ? " warn=not-in-group" : "");
  AP(async, "n/a");
  AP(data, "n/a");
  AP(health, "n/a");
}
static void nf_ge_nostart(ctx_t *x, obs_t *o) {
  (void)x;
  ncfsm_loop *loop;
  if (ncfsm_loop_new(NULL, &loop) != NCFSM_OK) { AP(rc, "setup failed"); return; }
  ncfsm_result_t r = ncfsm_group_end(loop);
  AP(rc, "group_end=%s%s", fn_(r), strstr(ncfsm_loop_last_error(loop), "R3") ? " msg=R3" : "");
  AP(async, "n/a");
  AP(data, "n/a");
  AP(health, "depth=%d", ncfsm_group_depth(loop));
  ncfsm_loop_close(loop);
}

/* R3: nested groups; only the outermost end launches; 3 AllReduces on distinct buffers. */
static void raw_nested(ctx_t *x, obs_t *o) {
  rset_t rs;
  if (rinit(x, &rs, 0, o, "nest", 0) || ralloc(x, &rs, 3, NI)) { AP(rc, "setup failed"); goto out; }
  for (int r = 0; r < NR; r++)
    for (int b = 0; b < 3; b++) fill_i32(x, r, rs.buf[r][b], NI, r + 1);
  int inner[3], orc = 0, st[NR];
  x->be->group_start();
  for (int b = 0; b < 3; b++) {
    x->be->group_start();
    for (int r = 0; r < NR; r++)
      orc |= rop(x, rs.c[r], NCFSM_KIND_ALLREDUCE, rs.buf[r][b], rs.buf[r][b], NI, NCFSM_INT32, -1, rs.s[r]);
    inner[b] = x->be->group_end();
  }
  int ge = x->be->group_end();
  rpoll_all(x, rs.c, NR, st);
  rwait_all(x, &rs);
  int ok = 1;
  for (int b = 0; b < 3; b++) ok &= rcheck(x, &rs, b, NI, 3);
  AP(rc, "ops=%s inner=%s,%s,%s outer=%s", orc ? "error" : "Success", rn(inner[0]), rn(inner[1]),
     rn(inner[2]), rn(ge));
  AP(async, "->%s,%s", rn(st[0]), rn(st[1]));
  AP(data, "%s", ok ? "ok" : "wrong");
  rhealth(x, &rs, o);
out:
  rfini(x, &rs);
}
static void nf_nested(ctx_t *x, obs_t *o) {
  nset_t ns;
  if (ninit(x, &ns, 0, 0, o, 0) || nalloc(&ns, 3, NI * 4)) { AP(rc, "setup failed"); goto out; }
  for (int b = 0; b < 3; b++) nfill(x, &ns, b, NI, 1);
  ncfsm_work *w[3][NR];
  ncfsm_result_t inner[3], st[3][NR], orc[NR];
  int bad = 0;
  ncfsm_group_start(ns.loop);
  for (int b = 0; b < 3; b++) {
    inner[b] = ngroup_ar(&ns, b, NI, w[b], orc);
    bad += orc[0] || orc[1];
  }
  int depth = ncfsm_group_depth(ns.loop);
  ncfsm_state_t before = ncfsm_comm_state(ns.c[0]);
  ncfsm_result_t ge = ncfsm_group_end(ns.loop);
  for (int b = 0; b < 3; b++) nwait_release(x, w[b], NR, st[b]);
  int ok = 1, wbad = 0;
  for (int b = 0; b < 3; b++) ok &= ncheck(x, &ns, b, NI, 3), wbad += st[b][0] || st[b][1];
  AP(rc, "ops=%s inner=%s,%s,%s (depth %d, %s) outer=%s", bad ? "error" : "OK", fn_(inner[0]),
     fn_(inner[1]), fn_(inner[2]), depth, ncfsm_state_name(before), fn_(ge));
  AP(async, "works=%s ->%s,%s", wbad ? "error" : "OK", stn(ns.c[0]), stn(ns.c[1]));
  AP(data, "%s", ok ? "ok" : "wrong");
  nhealth(ns.c, NR, o);
out:
  nfini(&ns);
}

/* R3: an argument error in a group (Broadcast root == nranks), then a valid AllReduce. */
static void raw_argerr(ctx_t *x, obs_t *o, int blocking) {
  rset_t rs;
  if (rinit(x, &rs, blocking, o, "arg", 0) || ralloc(x, &rs, 2, NI)) { AP(rc, "setup failed"); goto out; }
  for (int r = 0; r < NR; r++) fill_i32(x, r, rs.buf[r][0], NI, 7), fill_i32(x, r, rs.buf[r][1], NI, r + 1);
  int brc[NR], orc[NR], st1[NR], st2[NR];
  x->be->group_start();
  for (int r = 0; r < NR; r++)
    brc[r] = rop(x, rs.c[r], NCFSM_KIND_BROADCAST, rs.buf[r][0], rs.buf[r][0], NI, NCFSM_INT32, NR, rs.s[r]);
  int ge1 = x->be->group_end();
  rpoll_all(x, rs.c, NR, st1);
  int ge2 = rgroup_ar(x, &rs, 1, NI, orc);
  rpoll_all(x, rs.c, NR, st2);
  rwait_all(x, &rs);
  AP(rc, "bcast=%s,%s ge=%s then ar:ops=%s,%s ge=%s", rn(brc[0]), rn(brc[1]), rn(ge1), rn(orc[0]),
     rn(orc[1]), rn(ge2));
  AP(async, "after-bcast=%s,%s after-ar=%s,%s", rn(st1[0]), rn(st1[1]), rn(st2[0]), rn(st2[1]));
  AP(data, "ar=%s", rcheck(x, &rs, 1, NI, 3) ? "ok" : "wrong");
  rhealth(x, &rs, o);
out:
  rfini(x, &rs);
}
static void nf_argerr(ctx_t *x, obs_t *o, int blocking) {
  nset_t ns;
  if (ninit(x, &ns, blocking, 0, o, 0) || nalloc(&ns, 2, NI * 4)) { AP(rc, "setup failed"); goto out; }
  nfill(x, &ns, 1, NI, 1);
  uint64_t calls0 = nbackend_calls(ns.c[0]);
  ncfsm_result_t brc[NR], orc[NR], st[NR];
  ncfsm_group_start(ns.loop);
  for (int r = 0; r < NR; r++)
    brc[r] = ncfsm_broadcast(ns.c[r], ns.buf[r][0], ns.buf[r][0], NI, NCFSM_INT32, NR, NULL, NULL, NULL, NULL);
  ncfsm_result_t ge1 = ncfsm_group_end(ns.loop);
  uint64_t calls1 = nbackend_calls(ns.c[0]);
  ncfsm_work *w[NR];
  ncfsm_result_t ge2 = ngroup_ar(&ns, 1, NI, w, orc);
  nwait_release(x, w, NR, st);
  AP(rc, "bcast=%s,%s ge=%s backend-calls=%llu then ar:ops=%s,%s ge=%s", fn_(brc[0]), fn_(brc[1]),
     fn_(ge1), (unsigned long long)(calls1 - calls0), fn_(orc[0]), fn_(orc[1]), fn_(ge2));
  AP(async, "works=%s,%s ->%s,%s", fn_(st[0]), fn_(st[1]), stn(ns.c[0]), stn(ns.c[1]));
  AP(data, "ar=%s", ncheck(x, &ns, 1, NI, 3) ? "ok" : "wrong");
  nhealth(ns.c, NR, o);
out:
  nfini(&ns);
}
static void raw_argerr_nb(ctx_t *x, obs_t *o) { raw_argerr(x, o, 0); }
static void raw_argerr_b(ctx_t *x, obs_t *o) { raw_argerr(x, o, 1); }
static void nf_argerr_nb(ctx_t *x, obs_t *o) { nf_argerr(x, o, 0); }
static void nf_argerr_b(ctx_t *x, obs_t *o) { nf_argerr(x, o, 1); }


/* Two streams per rank in one group. */
static void raw_two_streams(ctx_t *x, obs_t *o) {
  rset_t rs;
  void *s2[NR] = {NULL, NULL};
  if (rinit(x, &rs, 0, o, "2s", 0) || ralloc(x, &rs, 2, NI)) { AP(rc, "setup failed"); goto out; }
  for (int r = 0; r < NR; r++) {
    x->be->stream_create(r, &s2[r]);
    fill_i32(x, r, rs.buf[r][0], NI, r + 1);
    fill_i32(x, r, rs.buf[r][1], NI, 10 * (r + 1));
  }
  int orc = 0, st[NR];
  x->be->group_start();
  for (int r = 0; r < NR; r++) {
    orc |= rop(x, rs.c[r], NCFSM_KIND_ALLREDUCE, rs.buf[r][0], rs.buf[r][0], NI, NCFSM_INT32, -1, rs.s[r]);
    orc |= rop(x, rs.c[r], NCFSM_KIND_ALLREDUCE, rs.buf[r][1], rs.buf[r][1], NI, NCFSM_INT32, -1, s2[r]);
  }
  int ge = x->be->group_end();
  rpoll_all(x, rs.c, NR, st);
  int wq = 0;
  for (int r = 0; r < NR; r++) wq |= rwait_stream(x, r, rs.s[r]) | rwait_stream(x, r, s2[r]);
  AP(rc, "ops=%s ge=%s", orc ? "error" : "Success", rn(ge));
  AP(async, "->%s,%s streams=%s", rn(st[0]), rn(st[1]), wq ? "stuck" : "complete");
  AP(data, "%s", rcheck(x, &rs, 0, NI, 3) && rcheck(x, &rs, 1, NI, 30) ? "ok" : "wrong");
  rhealth(x, &rs, o);
out:
  for (int r = 0; r < NR; r++)
    if (s2[r]) x->be->stream_destroy(s2[r]);
  rfini(x, &rs);
}
static void nf_two_streams(ctx_t *x, obs_t *o) {
  nset_t ns;
  void *s2[NR] = {NULL, NULL};
  if (ninit(x, &ns, 0, 0, o, 0) || nalloc(&ns, 2, NI * 4)) { AP(rc, "setup failed"); goto out; }
  for (int r = 0; r < NR; r++) {
    ncfsm_stream_create(ns.c[r], &s2[r]);
    fill_i32(x, r, ns.buf[r][0], NI, r + 1);
    fill_i32(x, r, ns.buf[r][1], NI, 10 * (r + 1));
  }
  ncfsm_work *w[2 * NR];
  int orc = 0;
  ncfsm_group_start(ns.loop);
  for (int r = 0; r < NR; r++) {
    orc |= ncfsm_allreduce(ns.c[r], ns.buf[r][0], ns.buf[r][0], NI, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL,
                           NULL, &w[2 * r]);
    orc |= ncfsm_allreduce(ns.c[r], ns.buf[r][1], ns.buf[r][1], NI, NCFSM_INT32, NCFSM_OP_SUM, s2[r], NULL,
                           NULL, &w[2 * r + 1]);
  }
  ncfsm_result_t ge = ncfsm_group_end(ns.loop);
  ncfsm_result_t st[2 * NR];
  nwait_release(x, w, 2 * NR, st);
  int bad = 0;
  for (int i = 0; i < 2 * NR; i++) bad += st[i] != NCFSM_OK;
  AP(rc, "ops=%s group_end=%s", orc ? "error" : "OK", fn_(ge));
  AP(async, "works=%s ->%s,%s", bad ? "error" : "OK", stn(ns.c[0]), stn(ns.c[1]));
  AP(data, "%s", ncheck(x, &ns, 0, NI, 3) && ncheck(x, &ns, 1, NI, 30) ? "ok" : "wrong");
  nhealth(ns.c, NR, o);
out:
  for (int r = 0; r < NR; r++)
    if (s2[r]) ncfsm_stream_destroy(ns.c[r], s2[r]);
  nfini(&ns);
}

/* R3: blocking and nonblocking comms in one group. */
static void raw_mixed(ctx_t *x, obs_t *o) {
  rset_t b, nb;
  memset(&nb, 0, sizeof nb);
  if (rinit(x, &b, 1, o, "blk", 0) || rinit(x, &nb, 0, o, "nblk", 0) || ralloc(x, &b, 1, NI) ||
      ralloc(x, &nb, 1, NI)) {
    AP(rc, "setup failed");
    goto out;
  }
  for (int r = 0; r < NR; r++) fill_i32(x, r, b.buf[r][0], NI, r + 1), fill_i32(x, r, nb.buf[r][0], NI, r + 1);
  int orc[2 * NR];
  x->be->group_start();
  for (int r = 0; r < NR; r++)
    orc[r] = rop(x, b.c[r], NCFSM_KIND_ALLREDUCE, b.buf[r][0], b.buf[r][0], NI, NCFSM_INT32, -1, b.s[r]);
  for (int r = 0; r < NR; r++)
    orc[NR + r] = rop(x, nb.c[r], NCFSM_KIND_ALLREDUCE, nb.buf[r][0], nb.buf[r][0], NI, NCFSM_INT32, -1, nb.s[r]);
  int mix = strstr(lasterr(x, NULL), "Blocking and nonblocking") != NULL;
  int ge = x->be->group_end();
  int sb[NR], snb[NR];
  rpoll_all(x, b.c, NR, sb);
  rpoll_all(x, nb.c, NR, snb);
  rwait_all(x, &b);
  rwait_all(x, &nb);
  AP(rc, "ops(blk,blk,nb,nb)=%s,%s,%s,%s ge=%s%s", rn(orc[0]), rn(orc[1]), rn(orc[2]), rn(orc[3]), rn(ge),
     mix ? " warn=blocking-nonblocking-mix" : "");
  AP(async, "blk=%s,%s nb=%s,%s", rn(sb[0]), rn(sb[1]), rn(snb[0]), rn(snb[1]));
  AP(data, "blk=%s nb=%s", rcheck(x, &b, 0, NI, 3) ? "ok" : "wrong", rcheck(x, &nb, 0, NI, 3) ? "ok" : "wrong");
  char h1[160] = "", h2[160] = "";
  obs_t tmp;
  memset(&tmp, 0, sizeof tmp);
  rhealth(x, &b, &tmp);
  snprintf(h1, sizeof h1, "%s", tmp.health);
  tmp.health[0] = '\0';
  rhealth(x, &nb, &tmp);
  snprintf(h2, sizeof h2, "%s", tmp.health);
  AP(health, "blk:%s nb:%s", h1, h2);
out:
  rfini(x, &b);
  rfini(x, &nb);
}
/* ncfsm: a blocking and a nonblocking clique on one loop. */
static int nmixed_setup(ctx_t *x, nset_t *b, nset_t *nb, obs_t *o) {
  memset(nb, 0, sizeof *nb);
  if (ninit(x, b, 1, 0, o, 0) || nalloc(b, 1, NI * 4)) return -1;
  ncfsm_comm_opts opt;
  ncfsm_comm_opts_init(&opt);
  opt.backend = x->kind;
  opt.blocking = 0;
  opt.sim = &x->so;
  opt.name = "conf-nb";
  int devs[NR] = {0, 1};
  nb->loop = b->loop;
  if (ncfsm_comm_init_all(b->loop, NR, &opt, devs, nb->c) != NCFSM_OK ||
      ncfsm_comm_wait_state(nb->c[0], NCFSM_STATE_READY, x->timeout_ms) ||
      ncfsm_comm_wait_state(nb->c[1], NCFSM_STATE_READY, x->timeout_ms) || nalloc(nb, 1, NI * 4))
    return -1;
  nfill(x, b, 0, NI, 1);
  nfill(x, nb, 0, NI, 1);
  return 0;
}
static void nmixed_fini(nset_t *b, nset_t *nb) {
  nb->loop = NULL;
  for (int r = 0; r < NR; r++) {
    if (!nb->c[r]) continue;
    if (nb->buf[r][0]) ncfsm_mem_free(nb->c[r], nb->buf[r][0]);
    ncfsm_state_t s = ncfsm_comm_state(nb->c[r]);
    if (s != NCFSM_STATE_CLOSED && s != NCFSM_STATE_NEW) ncfsm_comm_abort(nb->c[r]);
    ncfsm_comm_release(nb->c[r]);
  }
  nfini(b);
}
/* split: 0 = one group with both cliques; 1 = one group per clique, back to back. */
static void nf_mixed_run(ctx_t *x, obs_t *o, int split) {
  nset_t b, nb;
  if (nmixed_setup(x, &b, &nb, o)) { AP(rc, "setup failed"); goto out; }
  ncfsm_work *w[2 * NR];
  ncfsm_result_t orc[2 * NR], st[2 * NR], ge, ge1 = NCFSM_OK;
  ncfsm_group_start(b.loop);
  for (int r = 0; r < NR; r++)
    orc[r] = ncfsm_allreduce(b.c[r], b.buf[r][0], b.buf[r][0], NI, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[r]);
  if (split) ge1 = ncfsm_group_end(b.loop), ncfsm_group_start(b.loop);
  for (int r = 0; r < NR; r++)
    orc[NR + r] = ncfsm_allreduce(nb.c[r], nb.buf[r][0], nb.buf[r][0], NI, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL,
                                  NULL, &w[NR + r]);
  ge = ncfsm_group_end(b.loop);
  nwait_release(x, w, 2 * NR, st);
  int bad = 0;
  for (int i = 0; i < 2 * NR; i++) bad += orc[i] != NCFSM_OK;
  if (split) AP(rc, "ops=%s ge=%s,%s", bad ? "error" : "OK", fn_(ge1), fn_(ge));
  else AP(rc, "ops=%s ge=%s", bad ? "error" : "OK", fn_(ge));
  AP(async, "works(blk,nb)=%s,%s blk=%s,%s nb=%s,%s", fn_(st[0]), fn_(st[NR]), stn(b.c[0]), stn(b.c[1]),
     stn(nb.c[0]), stn(nb.c[1]));
  AP(data, "blk=%s nb=%s", ncheck(x, &b, 0, NI, 3) ? "ok" : "wrong", ncheck(x, &nb, 0, NI, 3) ? "ok" : "wrong");
  ncfsm_comm *all[2 * NR] = {b.c[0], b.c[1], nb.c[0], nb.c[1]};
  nhealth(all, 2 * NR, o);
out:
  nmixed_fini(&b, &nb);
}
static void nf_mixed(ctx_t *x, obs_t *o) { nf_mixed_run(x, o, 0); }
static void nf_two_groups(ctx_t *x, obs_t *o) { nf_mixed_run(x, o, 1); }

/* Raw: the same two cliques, one legal group each, back to back. */
static void raw_two_groups(ctx_t *x, obs_t *o) {
  rset_t b, nb;
  memset(&nb, 0, sizeof nb);
  if (rinit(x, &b, 1, o, "blk", 0) || rinit(x, &nb, 0, o, "nblk", 0) || ralloc(x, &b, 1, NI) ||
      ralloc(x, &nb, 1, NI)) {
    AP(rc, "setup failed");
    goto out;
  }
  for (int r = 0; r < NR; r++) fill_i32(x, r, b.buf[r][0], NI, r + 1), fill_i32(x, r, nb.buf[r][0], NI, r + 1);
  int orc[NR], sb[NR], snb[NR];
  int ge1 = rgroup_ar(x, &b, 0, NI, orc);
  int ge2 = rgroup_ar(x, &nb, 0, NI, orc);
  rpoll_all(x, b.c, NR, sb);
  rpoll_all(x, nb.c, NR, snb);
  rwait_all(x, &b);
  rwait_all(x, &nb);
  AP(rc, "ge(blk)=%s ge(nb)=%s", rn(ge1), rn(ge2));
  AP(async, "blk=%s,%s nb=%s,%s", rn(sb[0]), rn(sb[1]), rn(snb[0]), rn(snb[1]));
  AP(data, "blk=%s nb=%s", rcheck(x, &b, 0, NI, 3) ? "ok" : "wrong", rcheck(x, &nb, 0, NI, 3) ? "ok" : "wrong");
  obs_t t1, t2;
  memset(&t1, 0, sizeof t1);
  memset(&t2, 0, sizeof t2);
  rhealth(x, &b, &t1);
  rhealth(x, &nb, &t2);
  AP(health, "blk:%s nb:%s", t1.health, t2.health);
out:
  rfini(x, &b);
  rfini(x, &nb);
}



const scen_t scen_groupend_without_start = {
    .id = "groupend_without_start", .rule = "R3", .title = "GroupEnd at depth 0",
    .fn = {raw_ge_nostart, nf_ge_nostart},
    .raw = {"ge=InvalidUsage warn=not-in-group", "n/a", "n/a", "n/a"},
    .sim_has_revoke = -1,
};

const scen_t scen_nested_groups = {
    .id = "nested_groups", .rule = "R3",
    .title = "nested groups: only the outermost end launches; 3 AllReduces on distinct buffers",
    .fn = {raw_nested, nf_nested},
    .raw = {"ops=Success inner=Success,Success,Success outer=InProgress", "->Success,Success", "ok", "healthy"},
    .sim_has_revoke = -1,
};

const scen_t scen_argerr_nonblocking = {
    .id = "argerr_nonblocking", .rule = "R3",
    .title = "Broadcast root==nranks in a group, then a valid AllReduce (nonblocking comms)",
    .fn = {raw_argerr_nb, nf_argerr_nb},
    .raw = {"bcast=InvalidArgument,InvalidArgument ge=InvalidArgument then ar:ops=InvalidArgument,InvalidArgument "
            "ge=InvalidArgument",
            "after-bcast=InvalidArgument,InvalidArgument after-ar=InvalidArgument,InvalidArgument", "ar=wrong",
            "poisoned(r0=InvalidArgument r1=InvalidArgument)"},
    .sim_has_revoke = -1,
};

const scen_t scen_argerr_blocking = {
    .id = "argerr_blocking", .rule = "R3",
    .title = "Broadcast root==nranks in a group, then a valid AllReduce (blocking comms)",
    .fn = {raw_argerr_b, nf_argerr_b},
    .raw = {"bcast=InvalidArgument,InvalidArgument ge=InvalidArgument then ar:ops=Success,Success ge=Success",
            "after-bcast=Success,Success after-ar=Success,Success", "ar=ok", "healthy"},
    .sim_has_revoke = -1,
};

const scen_t scen_two_streams = {
    .id = "two_streams", .rule = "R3", .title = "two streams per rank in one group",
    .fn = {raw_two_streams, nf_two_streams},
    .raw = {"ops=Success ge=InProgress", "->Success,Success streams=complete", "ok", "healthy"},
    .sim_has_revoke = -1,
};

const scen_t scen_mixed_blocking_nonblocking = {
    .id = "mixed_blocking_nonblocking", .rule = "R3", .title = "blocking and nonblocking comms in one group",
    .fn = {raw_mixed, nf_mixed},
    .raw = {"ops(blk,blk,nb,nb)=Success,Success,InvalidArgument,InvalidArgument ge=InvalidArgument "
            "warn=blocking-nonblocking-mix",
            "blk=Success,Success nb=InvalidArgument,InvalidArgument", "blk=wrong nb=wrong",
            "blk:healthy nb:poisoned(r0=InvalidArgument r1=InvalidArgument)"},
    .sim_has_revoke = -1,
};

const scen_t scen_blocking_then_nonblocking_groups = {
    .id = "blocking_then_nonblocking_groups", .rule = "R3",
    .title = "two legal groups back to back: one over blocking comms, one over nonblocking comms",
    .fn = {raw_two_groups, nf_two_groups},
    .raw = {"ge(blk)=Success ge(nb)=InProgress", "blk=Success,Success nb=Success,Success", "blk=ok nb=ok",
            "blk:healthy nb:healthy"},
    .sim_has_revoke = -1,
};
