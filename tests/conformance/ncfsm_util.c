/* ncfsm-mode building blocks: the same intent as raw_util.c through the
 * public API (one loop, two comms of one clique), plus the few internal
 * reads a health check needs (fsm/objects.h: the comm's backend handle). */
#include <stdio.h>
#include <string.h>

#include "conformance.h"
#include "fsm/objects.h"

static void ntrace(const ncfsm_trace_rec *r, void *arg) {
  nset_t *ns = arg;
  if (r->kind == NCFSM_OBJ_COMM && r->object == ns->c[0] && r->event == NCFSM_EV_LAUNCH_PENDING)
    ns->launch_pending++;
}

int ninit(ctx_t *x, nset_t *ns, int blocking, int timing, obs_t *o, int record) {
  memset(ns, 0, sizeof *ns);
  if (ncfsm_loop_new(NULL, &ns->loop) != NCFSM_OK) return -1;
  ncfsm_loop_set_trace(ns->loop, ntrace, ns);
  ncfsm_comm_opts opt;
  ncfsm_comm_opts_init(&opt);
  opt.backend = x->kind;
  opt.blocking = blocking;
  opt.timing = timing;
  opt.sim = &x->so;
  opt.name = "conf";
  int devs[NR] = {0, 1};
  double t0 = now_ms();
  ncfsm_result_t r = ncfsm_comm_init_all(ns->loop, NR, &opt, devs, ns->c);
  /* rank 0's state callback, if any: set after init (both ranks share opts in init_all) */
  if (r == NCFSM_OK && x->on_state) {
    ns->c[0]->opts.on_state = x->on_state;
    ns->c[0]->opts.on_state_arg = x->on_state_arg;
  }
  if (r != NCFSM_OK) {
    if (record) AP(rc, "init_all=%s", fn_(r));
    return -1;
  }
  char st0[64];
  snprintf(st0, sizeof st0, "%s", stn(ns->c[0]));
  ncfsm_result_t w0 = ncfsm_comm_wait_state(ns->c[0], NCFSM_STATE_READY, x->timeout_ms);
  ncfsm_result_t w1 = ncfsm_comm_wait_state(ns->c[1], NCFSM_STATE_READY, x->timeout_ms);
  if (record) {
    AP(rc, "init_all=%s", fn_(r));
    AP(async, "%s->%s,%s", st0, stn(ns->c[0]), stn(ns->c[1]));
    AP(info, "init %.1f ms", now_ms() - t0);
  }
  return w0 == NCFSM_OK && w1 == NCFSM_OK ? 0 : -1;
}

int nalloc(nset_t *ns, int nbuf, size_t bytes) {
  for (int r = 0; r < NR; r++)
    for (int b = 0; b < nbuf; b++)
      if (ncfsm_mem_alloc(ns->c[r], bytes, &ns->buf[r][b]) != NCFSM_OK) return -1;
  return 0;
}
int nfill(ctx_t *x, nset_t *ns, int b, size_t n, int32_t v0) {
  int rc = 0;
  for (int r = 0; r < NR; r++) rc |= fill_i32(x, r, ns->buf[r][b], n, v0 + r);
  return rc;
}
int ncheck(ctx_t *x, nset_t *ns, int b, size_t n, int32_t v) {
  int ok = 1;
  for (int r = 0; r < NR; r++) ok &= check_i32(x, r, ns->buf[r][b], n, v, NULL);
  return ok;
}

/* "healthy": every comm READY and its backend async state Success (NCCL never
 * saw a bad call); "closed": every comm closed. */
void nhealth(ncfsm_comm **cs, int n, obs_t *o) {
  char h[128] = "";
  int ok = 1, closed = 0;
  for (int r = 0; r < n; r++) {
    ncfsm_comm *c = cs[r];
    int st = NCFSM__NCCL_SUCCESS;
    if (ncfsm_comm_state(c) == NCFSM_STATE_CLOSED) { closed++; continue; }
    if (c->bcomm) {
      int rc = c->be->get_async_error(c->bcomm, &st);
      if (rc) st = rc;
    }
    if (ncfsm_comm_state(c) != NCFSM_STATE_READY || st != NCFSM__NCCL_SUCCESS) ok = 0;
    ap(h, sizeof h, "%s/%s", stn(c), rn(st));
  }
  if (closed == n) AP(health, "closed");
  else if (ok && !closed) AP(health, "healthy");
  else AP(health, "unhealthy(%s)", h);
}

void nfini(nset_t *ns) {
  for (int r = 0; r < NR; r++) {
    if (!ns->c[r]) continue;
    for (int b = 0; b < 3; b++)
      if (ns->buf[r][b]) ncfsm_mem_free(ns->c[r], ns->buf[r][b]);
    ncfsm_state_t s = ncfsm_comm_state(ns->c[r]);
    if (s != NCFSM_STATE_CLOSED && s != NCFSM_STATE_NEW) ncfsm_comm_abort(ns->c[r]);
    ncfsm_comm_release(ns->c[r]);
  }
  if (ns->loop) {
    for (int i = 0; i < 4; i++) ncfsm_loop_run(ns->loop, NCFSM_RUN_NOWAIT);
    ncfsm_loop_close(ns->loop);
  }
  memset(ns, 0, sizeof *ns);
}

/* Grouped in-place AllReduce on buffer b of both ranks. */
ncfsm_result_t ngroup_ar(nset_t *ns, int b, size_t n, ncfsm_work **w, ncfsm_result_t *orc) {
  ncfsm_group_start(ns->loop);
  for (int r = 0; r < NR; r++)
    orc[r] = ncfsm_allreduce(ns->c[r], ns->buf[r][b], ns->buf[r][b], n, NCFSM_INT32, NCFSM_OP_SUM, NULL,
                             NULL, NULL, &w[r]);
  return ncfsm_group_end(ns->loop);
}

void nwait_release(ctx_t *x, ncfsm_work **w, int n, ncfsm_result_t *st) {
  for (int i = 0; i < n; i++) {
    st[i] = w[i] ? ncfsm_work_wait(w[i], x->timeout_ms) : NCFSM_ERR_INVALID_ARGUMENT;
    if (w[i]) ncfsm_work_release(w[i]);
    w[i] = NULL;
  }
}

/* Run loop turns until pred or the timeout. */
int nturns_until(ctx_t *x, nset_t *ns, int (*pred)(void *), void *arg) {
  double end = now_ms() + (double)x->timeout_ms;
  while (!pred(arg) && now_ms() < end) ncfsm_loop_run(ns->loop, NCFSM_RUN_NOWAIT);
  return pred(arg);
}
int pred_launch_ip(void *a) {
  ncfsm_comm *c = a;
  ncfsm_state_t s = ncfsm_comm_state(c);
  return s == NCFSM_STATE_LAUNCH_IN_PROGRESS || s == NCFSM_STATE_ERROR;
}

/* Backend calls made for comm c so far (0 more after a call means ncfsm
 * decided before the backend). */
uint64_t nbackend_calls(ncfsm_comm *c) { return ncfsm__comm_backend_calls(c); }
