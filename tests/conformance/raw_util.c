/* Raw-mode building blocks: the backend interface (core/backend.h) called
 * as a program using NCCL would, on two ranks of one clique driven by one
 * thread. */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "conformance.h"

/* Poll until the async state leaves InProgress (or the timeout). */
int rpoll(ctx_t *x, void *comm, int *npolls) {
  int st = NCFSM__NCCL_IN_PROGRESS, n = 0;
  double end = now_ms() + (double)x->timeout_ms;
  while (st == NCFSM__NCCL_IN_PROGRESS) {
    int rc = x->be->get_async_error(comm, &st);
    n++;
    if (rc != NCFSM__NCCL_SUCCESS) { st = rc; break; }
    if (st != NCFSM__NCCL_IN_PROGRESS || now_ms() > end) break;
    if (!x->is_sim) sched_yield();
  }
  if (npolls) *npolls = n;
  return st;
}

void rpoll_all(ctx_t *x, void **c, int n, int *st) {
  for (int r = 0; r < n; r++) st[r] = c[r] ? rpoll(x, c[r], NULL) : -1;
}

/* Record an event on stream and wait for it: 0 complete, 1 timed out, <0 error. */
int rwait_stream(ctx_t *x, int dev, void *stream) {
  void *ev;
  if (x->be->event_create(dev, &ev) != 0) return -1;
  if (x->be->event_record(ev, stream) != 0) {
    x->be->event_destroy(ev);
    return -2;
  }
  double end = now_ms() + (double)x->timeout_ms;
  int q;
  while ((q = x->be->event_query(ev)) == 1 && now_ms() < end)
    if (!x->is_sim) sched_yield();
  x->be->event_destroy(ev);
  return q == 0 ? 0 : q == 1 ? 1 : -3;
}

int rop(ctx_t *x, void *comm, ncfsm_opkind_t k, const void *s, void *r, size_t count,
               ncfsm_dtype_t dt, int root, void *stream) {
  ncfsm__op op = {k, s, r, count, dt, NCFSM_OP_SUM, root, -1, stream};
  return x->be->op(comm, &op);
}

/* Two ranks of one clique, initialised in one group (R3) and polled to success. */
int rinit(ctx_t *x, rset_t *rs, int blocking, obs_t *o, const char *tag, int record) {
  memset(rs, 0, sizeof *rs);
  rs->blocking = blocking;
  ncfsm_unique_id id;
  if (x->be->get_unique_id(&id) != 0) return -1;
  ncfsm__comm_config cfg = {blocking, 0, &x->so, tag};
  int irc[NR], st[NR], np = 0;
  double t0 = now_ms();
  int gs = x->be->group_start();
  for (int r = 0; r < NR; r++) {
    cfg.device = r;
    irc[r] = x->be->comm_init(&rs->c[r], NR, &id, r, &cfg);
  }
  int ge = x->be->group_end();
  double tge = now_ms();
  for (int r = 0; r < NR; r++) {
    int n = 0;
    st[r] = rs->c[r] ? rpoll(x, rs->c[r], &n) : -1;
    np += n;
  }
  double t1 = now_ms();
  if (record) {
    AP(rc, "init:gs=%s init=%s,%s ge=%s", rn(gs), rn(irc[0]), rn(irc[1]), rn(ge));
    AP(async, "init->%s,%s", rn(st[0]), rn(st[1]));
    AP(info, "init %.1f ms (group end %.2f ms, %d polls)", t1 - t0, tge - t0, np);
  }
  for (int r = 0; r < NR; r++) {
    if (x->be->stream_create(r, &rs->s[r]) != 0) return -1;
  }
  return st[0] == NCFSM__NCCL_SUCCESS && st[1] == NCFSM__NCCL_SUCCESS ? 0 : -1;
}

int ralloc(ctx_t *x, rset_t *rs, int nbuf, size_t n) {
  for (int r = 0; r < NR; r++)
    for (int b = 0; b < nbuf; b++)
      if (!(rs->buf[r][b] = rmalloc(x, r, n * sizeof(int32_t)))) return -1;
  return 0;
}

/* Health of live comms: "healthy" when every async state is Success. */
void rhealth(ctx_t *x, rset_t *rs, obs_t *o) {
  char h[128] = "";
  int all_ok = 1, live = 0;
  for (int r = 0; r < NR; r++) {
    if (!rs->c[r]) continue;
    live++;
    int st;
    int rc = x->be->get_async_error(rs->c[r], &st);
    if (rc != NCFSM__NCCL_SUCCESS) st = rc;
    if (st != NCFSM__NCCL_SUCCESS) all_ok = 0;
    ap(h, sizeof h, "r%d=%s", r, rn(st));
  }
  if (!live) AP(health, "closed");
  else if (all_ok) AP(health, "healthy");
  else AP(health, "poisoned(%s)", h);
}

/* Abort what is left, in one group (R5), then free buffers and streams. */
void rfini(ctx_t *x, rset_t *rs) {
  int n = 0;
  for (int r = 0; r < NR; r++) n += rs->c[r] != NULL;
  if (n) {
    x->be->group_start();
    for (int r = 0; r < NR; r++)
      if (rs->c[r]) x->be->abort(rs->c[r]), rs->c[r] = NULL;
    x->be->group_end();
  }
  for (int r = 0; r < NR; r++) {
    for (int b = 0; b < 3; b++) rfree(x, r, rs->buf[r][b]);
    if (rs->s[r]) x->be->stream_destroy(rs->s[r]);
  }
  memset(rs, 0, sizeof *rs);
}

/* One grouped AllReduce over both ranks on buffer b (in place); returns the group end. */
int rgroup_ar(ctx_t *x, rset_t *rs, int b, size_t n, int *oprc) {
  x->be->group_start();
  for (int r = 0; r < NR; r++)
    oprc[r] = rop(x, rs->c[r], NCFSM_KIND_ALLREDUCE, rs->buf[r][b], rs->buf[r][b], n, NCFSM_INT32, -1,
                  rs->s[r]);
  return x->be->group_end();
}

int rwait_all(ctx_t *x, rset_t *rs) {
  int rc = 0;
  for (int r = 0; r < NR; r++) rc |= rwait_stream(x, r, rs->s[r]) != 0;
  return rc;
}

int rcheck(ctx_t *x, rset_t *rs, int b, size_t n, int32_t v) {
  int ok = 1;
  for (int r = 0; r < NR; r++) ok &= check_i32(x, r, rs->buf[r][b], n, v, NULL);
  return ok;
}

const char *lasterr(ctx_t *x, void *c) {
  const char *s = x->be->last_error ? x->be->last_error(c) : NULL;
  return s ? s : "";
}

