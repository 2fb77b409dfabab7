/*
 * The conformance suite: NCCL-RULES R1-R12 run three ways on two ranks
 * driven by one thread (2 GPUs with --backend nccl, 2 sim ranks with --backend sim):
 *
 *   raw    the backend interface called directly, as a program using NCCL
 *          would (on nccl: what NCCL returns; on sim: what the model returns)
 *   ncfsm  the same intent through the public ncfsm API (what the state
 *          table decides: rejected or deferred before the backend, data, health)
 *
 * Every scenario records four short strings per mode (return codes, async
 * states, data check, final health) plus free-form measured info, and
 * compares them with the expectation written from NCCL-RULES. A field that
 * differs fails the run unless a known-difference entry names exactly that
 * observation and gives the reason. Each scenario runs on a fresh pthread:
 * NCCL's group state is thread-local and some scenarios dirty it (R4).
 *
 * Exit: 0 all pass (or known), 1 a difference, 2 usage/hang, 77 the nccl
 * backend is unusable or fewer than 2 devices are visible (CTest SKIP).
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/backend.h"
#include "fsm/internal.h"
#include "ncfsm.h"
#include "ncfsm/sim.h"

#define NR 2           /* ranks */
#define NI (1u << 20)  /* int32 elements of the ordinary buffers (4 MiB) */

enum { M_RAW = 0, M_NCFSM = 1, M_COUNT };
static const char *mode_name[M_COUNT] = {"raw", "ncfsm"};

typedef struct obs {
  char rc[640], async[320], data[160], health[160], info[480];
  int skipped;
  char skip_why[200];
} obs_t;

typedef struct ctx {
  const ncfsm__backend *be;
  const char *bname; /* "nccl" or "sim" (from the JSON with --recheck) */
  ncfsm_backend_kind_t kind;
  int is_sim;
  int version;
  unsigned features;
  uint64_t timeout_ms; /* bound of every wait inside a scenario */
  ncfsm_sim_opts so;   /* sim: per-scenario copy */
  ncfsm_state_cb on_state; /* ninit: state callback of rank 0 (NULL: none) */
  void *on_state_arg;
} ctx_t;

/* ---- small helpers ---------------------------------------------------------------- */

static void ap(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void ap(char *buf, size_t len, const char *fmt, ...) {
  size_t n = strlen(buf);
  if (n + 2 >= len) return;
  if (n) buf[n++] = ' ', buf[n] = '\0';
  va_list a;
  va_start(a, fmt);
  vsnprintf(buf + n, len - n, fmt, a);
  va_end(a);
}
#define AP(field, ...) ap(o->field, sizeof o->field, __VA_ARGS__)

static double now_ms(void) { return (double)ncfsm__now_ns() / 1e6; }

/* "ncclInvalidArgument" -> "InvalidArgument" */
static const char *rn(int code) {
  const char *s = ncfsm__nccl_result_name(code);
  return strncmp(s, "nccl", 4) ? s : s + 4;
}
/* "NCFSM_ERR_ILLEGAL_STATE" -> "ILLEGAL_STATE", "NCFSM_OK" -> "OK" */
static const char *fn_(ncfsm_result_t r) {
  const char *s = ncfsm_err_name(r);
  if (!strncmp(s, "NCFSM_ERR_", 10)) return s + 10;
  if (!strncmp(s, "NCFSM_", 6)) return s + 6;
  return s;
}
static const char *stn(ncfsm_comm *c) { return ncfsm_state_name(ncfsm_comm_state(c)); }

/* ---- raw helpers -------------------------------------------------------------------- */

/* Poll until the async state leaves InProgress (or the timeout). */
static int rpoll(ctx_t *x, void *comm, int *npolls) {
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

static void rpoll_all(ctx_t *x, void **c, int n, int *st) {
  for (int r = 0; r < n; r++) st[r] = c[r] ? rpoll(x, c[r], NULL) : -1;
}

static void *rmalloc(ctx_t *x, int dev, size_t bytes) {
  void *p = NULL;
  if (x->be->mem_alloc) {
    if (x->be->mem_alloc(dev, bytes, &p) != 0) return NULL;
  } else {
    p = calloc(1, bytes);
  }
  return p;
}
static void rfree(ctx_t *x, int dev, void *p) {
  if (!p) return;
  if (x->be->mem_free) x->be->mem_free(dev, p);
  else free(p);
}
static int rcopy(ctx_t *x, int dev, void *dst, const void *src, size_t bytes, int to_dev) {
  if (x->be->memcpy_sync) return x->be->memcpy_sync(dev, dst, src, bytes, to_dev);
  memcpy(dst, src, bytes);
  return 0;
}

/* Fill n int32 with v; check n int32 equal v (1 = all equal). */
static int fill_i32(ctx_t *x, int dev, void *p, size_t n, int32_t v) {
  int32_t *h = malloc(n * sizeof *h);
  if (!h) return -1;
  for (size_t i = 0; i < n; i++) h[i] = v;
  int rc = rcopy(x, dev, p, h, n * sizeof *h, 1);
  free(h);
  return rc;
}
static int check_i32(ctx_t *x, int dev, const void *p, size_t n, int32_t v, int32_t *first) {
  int32_t *h = malloc(n * sizeof *h);
  if (!h) return 0;
  int ok = rcopy(x, dev, h, p, n * sizeof *h, 0) == 0;
  if (first) *first = h[0];
  for (size_t i = 0; ok && i < n; i++) ok = h[i] == v;
  free(h);
  return ok;
}
static int fill_f32(ctx_t *x, int dev, void *p, size_t n, float v) {
  float *h = malloc(n * sizeof *h);
  if (!h) return -1;
  for (size_t i = 0; i < n; i++) h[i] = v;
  int rc = rcopy(x, dev, p, h, n * sizeof *h, 1);
  free(h);
  return rc;
}
static int check_f32(ctx_t *x, int dev, const void *p, size_t n, float v) {
  float *h = malloc(n * sizeof *h);
  if (!h) return 0;
  int ok = rcopy(x, dev, h, p, n * sizeof *h, 0) == 0;
  for (size_t i = 0; ok && i < n; i++) ok = h[i] == v;
  free(h);
  return ok;
}

/* Record an event on stream and wait for it: 0 complete, 1 timed out, <0 error. */
static int rwait_stream(ctx_t *x, int dev, void *stream) {
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

static int rop(ctx_t *x, void *comm, ncfsm_opkind_t k, const void *s, void *r, size_t count,
               ncfsm_dtype_t dt, int root, void *stream) {
  ncfsm__op op = {k, s, r, count, dt, NCFSM_OP_SUM, root, -1, stream};
  return x->be->op(comm, &op);
}

typedef struct rset {
  void *c[NR];
  void *s[NR];
  int32_t *buf[NR][3];
  int blocking;
} rset_t;

/* Two ranks of one clique, initialised in one group (R3) and polled to success. */
static int rinit(ctx_t *x, rset_t *rs, int blocking, obs_t *o, const char *tag, int record) {
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

static int ralloc(ctx_t *x, rset_t *rs, int nbuf, size_t n) {
  for (int r = 0; r < NR; r++)
    for (int b = 0; b < nbuf; b++)
      if (!(rs->buf[r][b] = rmalloc(x, r, n * sizeof(int32_t)))) return -1;
  return 0;
}

/* Health of live comms: "healthy" when every async state is Success. */
static void rhealth(ctx_t *x, rset_t *rs, obs_t *o) {
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
static void rfini(ctx_t *x, rset_t *rs) {
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
static int rgroup_ar(ctx_t *x, rset_t *rs, int b, size_t n, int *oprc) {
  x->be->group_start();
  for (int r = 0; r < NR; r++)
    oprc[r] = rop(x, rs->c[r], NCFSM_KIND_ALLREDUCE, rs->buf[r][b], rs->buf[r][b], n, NCFSM_INT32, -1,
                  rs->s[r]);
  return x->be->group_end();
}

static int rwait_all(ctx_t *x, rset_t *rs) {
  int rc = 0;
  for (int r = 0; r < NR; r++) rc |= rwait_stream(x, r, rs->s[r]) != 0;
  return rc;
}

static int rcheck(ctx_t *x, rset_t *rs, int b, size_t n, int32_t v) {
  int ok = 1;
  for (int r = 0; r < NR; r++) ok &= check_i32(x, r, rs->buf[r][b], n, v, NULL);
  return ok;
}

static const char *lasterr(ctx_t *x, void *c) {
  const char *s = x->be->last_error ? x->be->last_error(c) : NULL;
  return s ? s : "";
}

/* ---- ncfsm helpers ------------------------------------------------------------------- */

typedef struct nset {
  ncfsm_loop *loop;
  ncfsm_comm *c[NR];
  void *buf[NR][3];
  int launch_pending; /* LAUNCH_PENDING transitions seen on rank 0 */
} nset_t;

static void ntrace(const ncfsm_trace_rec *r, void *arg) {
  nset_t *ns = arg;
  if (r->kind == NCFSM_OBJ_COMM && r->object == ns->c[0] && r->event == NCFSM_EV_LAUNCH_PENDING)
    ns->launch_pending++;
}

static int ninit(ctx_t *x, nset_t *ns, int blocking, int timing, obs_t *o, int record) {
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

static int nalloc(nset_t *ns, int nbuf, size_t bytes) {
  for (int r = 0; r < NR; r++)
    for (int b = 0; b < nbuf; b++)
      if (ncfsm_mem_alloc(ns->c[r], bytes, &ns->buf[r][b]) != NCFSM_OK) return -1;
  return 0;
}
static int nfill(ctx_t *x, nset_t *ns, int b, size_t n, int32_t v0) {
  int rc = 0;
  for (int r = 0; r < NR; r++) rc |= fill_i32(x, r, ns->buf[r][b], n, v0 + r);
  return rc;
}
static int ncheck(ctx_t *x, nset_t *ns, int b, size_t n, int32_t v) {
  int ok = 1;
  for (int r = 0; r < NR; r++) ok &= check_i32(x, r, ns->buf[r][b], n, v, NULL);
  return ok;
}

/* "healthy": every comm READY and its backend async state Success (NCCL never
 * saw a bad call); "closed": every comm closed. */
static void nhealth(nset_t *ns, ncfsm_comm **cs, int n, obs_t *o) {
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
  (void)ns;
  if (closed == n) AP(health, "closed");
  else if (ok && !closed) AP(health, "healthy");
  else AP(health, "unhealthy(%s)", h);
}

static void nfini(nset_t *ns) {
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
static ncfsm_result_t ngroup_ar(nset_t *ns, int b, size_t n, ncfsm_work **w, ncfsm_result_t *orc) {
  ncfsm_group_start(ns->loop);
  for (int r = 0; r < NR; r++)
    orc[r] = ncfsm_allreduce(ns->c[r], ns->buf[r][b], ns->buf[r][b], n, NCFSM_INT32, NCFSM_OP_SUM, NULL,
                             NULL, NULL, &w[r]);
  return ncfsm_group_end(ns->loop);
}

static void nwait_release(ctx_t *x, ncfsm_work **w, int n, ncfsm_result_t *st) {
  for (int i = 0; i < n; i++) {
    st[i] = w[i] ? ncfsm_work_wait(w[i], x->timeout_ms) : NCFSM_ERR_INVALID_ARGUMENT;
    if (w[i]) ncfsm_work_release(w[i]);
    w[i] = NULL;
  }
}

/* Run loop turns until pred or the timeout. */
static int nturns_until(ctx_t *x, nset_t *ns, int (*pred)(void *), void *arg) {
  double end = now_ms() + (double)x->timeout_ms;
  while (!pred(arg) && now_ms() < end) ncfsm_loop_run(ns->loop, NCFSM_RUN_NOWAIT);
  return pred(arg);
}
static int pred_launch_ip(void *a) {
  ncfsm_comm *c = a;
  ncfsm_state_t s = ncfsm_comm_state(c);
  return s == NCFSM_STATE_LAUNCH_IN_PROGRESS || s == NCFSM_STATE_ERROR;
}

/* ======================================================================================
 * Scenarios. raw_* drive the backend table; nf_* the ncfsm API. Each fills an obs.
 * ==================================================================================== */

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
  nhealth(&ns, ns.c, NR, o);
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
  nhealth(&ns, ns.c, NR, o);
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
  nhealth(&ns, ns.c, NR, o);
out:
  nfini(&ns);
}

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
  nhealth(&ns, ns.c, NR, o);
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
  uint64_t calls0 = ncfsm__comm_backend_calls(ns.c[0]);
  ncfsm_result_t brc[NR], orc[NR], st[NR];
  ncfsm_group_start(ns.loop);
  for (int r = 0; r < NR; r++)
    brc[r] = ncfsm_broadcast(ns.c[r], ns.buf[r][0], ns.buf[r][0], NI, NCFSM_INT32, NR, NULL, NULL, NULL, NULL);
  ncfsm_result_t ge1 = ncfsm_group_end(ns.loop);
  uint64_t calls1 = ncfsm__comm_backend_calls(ns.c[0]);
  ncfsm_work *w[NR];
  ncfsm_result_t ge2 = ngroup_ar(&ns, 1, NI, w, orc);
  nwait_release(x, w, NR, st);
  AP(rc, "bcast=%s,%s ge=%s backend-calls=%llu then ar:ops=%s,%s ge=%s", fn_(brc[0]), fn_(brc[1]),
     fn_(ge1), (unsigned long long)(calls1 - calls0), fn_(orc[0]), fn_(orc[1]), fn_(ge2));
  AP(async, "works=%s,%s ->%s,%s", fn_(st[0]), fn_(st[1]), stn(ns.c[0]), stn(ns.c[1]));
  AP(data, "ar=%s", ncheck(x, &ns, 1, NI, 3) ? "ok" : "wrong");
  nhealth(&ns, ns.c, NR, o);
out:
  nfini(&ns);
}
static void raw_argerr_nb(ctx_t *x, obs_t *o) { raw_argerr(x, o, 0); }
static void raw_argerr_b(ctx_t *x, obs_t *o) { raw_argerr(x, o, 1); }
static void nf_argerr_nb(ctx_t *x, obs_t *o) { nf_argerr(x, o, 0); }
static void nf_argerr_b(ctx_t *x, obs_t *o) { nf_argerr(x, o, 1); }

/* R12: three in-place AllReduces on ONE buffer in one (nested) group. */
#define R12N (4u << 20) /* 16 MiB of int32 */
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
  uint64_t calls0 = ncfsm__comm_backend_calls(ns.c[0]);
  ncfsm_work *w[3][NR];
  ncfsm_result_t orc[NR], st[3][NR];
  ncfsm_group_start(ns.loop);
  for (int k = 0; k < 3; k++) ngroup_ar(&ns, 0, n, w[k], orc);
  ncfsm_result_t ge = ncfsm_group_end(ns.loop);
  for (int k = 0; k < 3; k++) nwait_release(x, w[k], NR, st[k]);
  AP(rc, "group_end=%s backend-calls=%llu", fn_(ge),
     (unsigned long long)(ncfsm__comm_backend_calls(ns.c[0]) - calls0));
  AP(async, "works=%s ->%s,%s", fn_(st[0][0]), stn(ns.c[0]), stn(ns.c[1]));
  AP(data, "%s", check_i32(x, 0, ns.buf[0][0], n, 1, NULL) && check_i32(x, 1, ns.buf[1][0], n, 2, NULL)
                     ? "unchanged"
                     : "changed");
  nhealth(&ns, ns.c, NR, o);
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
  nhealth(&ns, ns.c, NR, o);
out:
  nfini(&ns);
}

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
  nhealth(&ns, ns.c, NR, o);
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
  if (nx.c[0]) nhealth(&nx, nx.c, NR, o);
  else AP(health, "next-missing");
out:
  nfini(&ns);
  nfini(&nx);
}

/* R5: abort while a large AllReduce runs. */
#define BIGN (64u << 20) /* 256 MiB of float */
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
  nhealth(&ns, ns.c, NR, o);
out:
  nfini(&ns);
}

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
  nhealth(&ns, ns.c, NR, o);
out:
  for (int r = 0; r < NR; r++)
    if (s2[r]) ncfsm_stream_destroy(ns.c[r], s2[r]);
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
  nhealth(&ns, ns.c, NR, o);
out:
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
  nhealth(&b, all, 2 * NR, o);
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
    nhealth(&ns, ns.c, NR, o);
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
  nhealth(&ns, ns.c, NR, o);
out:
  nfini(&ns);
}

/* ======================================================================================
 * The scenario table and the expectations (from NCCL-RULES).
 * ==================================================================================== */

typedef struct exp_s {
  const char *rc, *async, *data, *health;
} exp_t;

typedef struct scen {
  const char *id, *rule, *title;
  void (*fn[M_COUNT])(ctx_t *, obs_t *);
  exp_t exp[M_COUNT];
  /* Revoke: expectations when the runtime has no ncclCommRevoke */
  exp_t exp_norevoke[M_COUNT];
  int sim_only;          /* runs on the sim only */
  int sim_has_revoke;    /* -1: leave the sim default */
  int sim_launch_polls;  /* > 0: sim launch_polls for this scenario (ncfsm mode) */
  int sim_version;       /* > 0: NCFSM_SIM_NCCL_VERSION for this scenario (process-wide) */
  const char *skip;      /* never runs: why */
  int rev[M_COUNT];      /* revision of each mode's code: results of another revision are STALE (--recheck) */
} scen_t;

#define IP "InProgress"
static const scen_t scenarios[] = {
    {"init", "R1", "nonblocking init of 2 ranks in one group, then polls",
     {raw_init, nf_init},
     {{"init:gs=Success init=Success,Success ge=InProgress", "init->Success,Success", "n/a", "healthy"},
      {"init_all=OK", "INIT_IN_PROGRESS->READY,READY", "n/a", "healthy"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"groupend_inprogress", "R1", "every group end of a plain AllReduce returns InProgress (1 first + 5 connected)",
     {raw_groupend, nf_groupend},
     {{"first:ops=Success,Success ge=InProgress ->Success,Success later5:InProgress=5 Success=0 other=0",
       "each->Success", "ok", "healthy"},
      {"6x group_end=OK works=OK bad=0", "LAUNCH_PENDING=6/6 ->READY", "ok", "healthy"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"call_during_inprogress", "R2", "a grouped AllReduce issued while the first launch is InProgress",
     {raw_during_ip, nf_during_ip},
     {{"ge1=InProgress second:ops=InvalidArgument,InvalidArgument ge=InvalidArgument warn=not-ready",
       "->InvalidArgument,InvalidArgument", "first=ok second=wrong",
       "poisoned(r0=InvalidArgument r1=InvalidArgument)"},
      {"ge1=OK second(in LAUNCH_IN_PROGRESS, DEFER):ops=OK,OK ge=OK", "works=OK,OK,OK,OK ->READY,READY",
       "first=ok second=ok", "healthy"}},
     {{0}}, 0, -1, 200, 0, NULL, {1, 1}},
    {"groupend_without_start", "R3", "GroupEnd at depth 0",
     {raw_ge_nostart, nf_ge_nostart},
     {{"ge=InvalidUsage warn=not-in-group", "n/a", "n/a", "n/a"},
      {"group_end=INVALID_USAGE msg=R3", "n/a", "n/a", "depth=0"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"nested_groups", "R3", "nested groups: only the outermost end launches; 3 AllReduces on distinct buffers",
     {raw_nested, nf_nested},
     {{"ops=Success inner=Success,Success,Success outer=InProgress", "->Success,Success", "ok", "healthy"},
      {"ops=OK inner=OK,OK,OK (depth 1, GROUP_OPEN) outer=OK", "works=OK ->READY,READY", "ok", "healthy"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"argerr_nonblocking", "R3", "Broadcast root==nranks in a group, then a valid AllReduce (nonblocking comms)",
     {raw_argerr_nb, nf_argerr_nb},
     {{"bcast=InvalidArgument,InvalidArgument ge=InvalidArgument then ar:ops=InvalidArgument,InvalidArgument "
       "ge=InvalidArgument",
       "after-bcast=InvalidArgument,InvalidArgument after-ar=InvalidArgument,InvalidArgument", "ar=wrong",
       "poisoned(r0=InvalidArgument r1=InvalidArgument)"},
      {"bcast=INVALID_ARGUMENT,INVALID_ARGUMENT ge=INVALID_ARGUMENT backend-calls=0 then ar:ops=OK,OK ge=OK",
       "works=OK,OK ->READY,READY", "ar=ok", "healthy"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"argerr_blocking", "R3", "Broadcast root==nranks in a group, then a valid AllReduce (blocking comms)",
     {raw_argerr_b, nf_argerr_b},
     {{"bcast=InvalidArgument,InvalidArgument ge=InvalidArgument then ar:ops=Success,Success ge=Success",
       "after-bcast=Success,Success after-ar=Success,Success", "ar=ok", "healthy"},
      {"bcast=INVALID_ARGUMENT,INVALID_ARGUMENT ge=INVALID_ARGUMENT backend-calls=0 then ar:ops=OK,OK ge=OK",
       "works=OK,OK ->READY,READY", "ar=ok", "healthy"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"r12_same_buffer_group", "R12", "three in-place AllReduces on one buffer in one nested group",
     {raw_r12_group, nf_r12_group},
     {{"inner=Success,Success,Success outer=InProgress", "->Success,Success", "wrong", "healthy"},
      {"group_end=OVERLAP backend-calls=0", "works=OVERLAP ->READY,READY", "unchanged", "healthy"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"r12_separate_launches", "R12", "the same three AllReduces as three separate launches",
     {raw_r12_sep, nf_r12_sep},
     {{"ge=InProgress InProgress InProgress", "each->Success,Success", "ok", "healthy"},
      {"group_end=OK OK OK", "works=OK,OK,OK ->READY,READY", "ok", "healthy"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"finalize_once", "R4", "finalize from READY: InProgress, then Success",
     {raw_fin_once, nf_fin_once},
     {{"finalize=InProgress,InProgress", "->Success,Success", "n/a", "healthy"},
      {"finalize=OK,OK wait=OK,OK", "FINALIZING->FINALIZED,FINALIZED", "n/a", "finalized"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"finalize_twice", "R4", "a second finalize on rank 0",
     {raw_fin_twice, nf_fin_twice},
     {{"finalize=InProgress,InProgress again(r0)=InvalidArgument", "->InvalidArgument,Success", "n/a",
       "poisoned(r0=InvalidArgument r1=Success)"},
      {"finalize=OK,OK again(r0, in FINALIZING)=ILLEGAL_STATE msg=R4", "->FINALIZED,FINALIZED", "n/a",
       "finalized"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"destroy_after_finalize", "R4", "destroy after finalize polled to success",
     {raw_destroy, nf_destroy},
     {{"finalize->Success,Success destroy=Success,Success", "n/a", "n/a", "closed"},
      {"finalize->FINALIZED destroy=OK,OK", "n/a", "n/a", "closed"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"destroy_poisoned_cascade", "R4",
     "second finalize, destroy of the poisoned comm, then the NEXT comm created on the thread",
     {raw_cascade, nf_cascade},
     {{"finalize-again=InvalidArgument destroy(r0)=InvalidArgument next:gs=Success init=InvalidArgument,"
       "InvalidArgument ge=InvalidArgument warn=blocking-nonblocking-mix",
       "r0=InvalidArgument next=none,none", "n/a", "closed"},
      {"finalize-again=ILLEGAL_STATE destroy-early=ILLEGAL_STATE destroy=OK,OK next:init+ar",
       "old=CLOSED,CLOSED next=READY,READY", "next-ar=ok", "healthy"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"destroy_inprogress_cascade", "R4",
     "second finalize, destroy of rank 0 at once (no poll), then the NEXT comm created on the thread",
     {raw_cascade_np, nf_cascade},
     {{"finalize-again=InvalidArgument destroy(r0)=InvalidArgument next:gs=Success init=InvalidArgument,"
       "InvalidArgument ge=InvalidArgument warn=blocking-nonblocking-mix",
       "r0=InProgress next=none,none", "n/a", "closed"},
      {"finalize-again=ILLEGAL_STATE destroy-early=ILLEGAL_STATE destroy=OK,OK next:init+ar",
       "old=CLOSED,CLOSED next=READY,READY", "next-ar=ok", "healthy"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"two_streams", "R3", "two streams per rank in one group",
     {raw_two_streams, nf_two_streams},
     {{"ops=Success ge=InProgress", "->Success,Success streams=complete", "ok", "healthy"},
      {"ops=OK group_end=OK", "works=OK ->READY,READY", "ok", "healthy"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"event_after_inprogress", "R2",
     "event recorded right after an InProgress group end vs after the launch is final (256 MiB AllReduce)",
     {raw_early_event, nf_early_event},
     {{"ge=InProgress", "->Success,Success", "early-event=complete-before-data final-event=pending->complete data-ok",
       "healthy"},
      {"group_end=OK works=OK,OK", "->READY,READY", "event-at-final=pending data-ok", "healthy"}},
     {{0}}, 0, -1, 0, 0, NULL, {2, 1}},
    {"revoke", "R6", "Revoke (>= 2.28.7): revoke, an AllReduce after it, destroy; else unsupported",
     {raw_revoke, nf_revoke},
     {{"revoke=InProgress,InProgress then ar:ops=InvalidUsage,InvalidUsage ge=InvalidUsage destroy=Success,Success",
       "revoke->Success,Success", "n/a", "closed"},
      {"revoke=OK,OK wait=OK,OK then ar=ILLEGAL_STATE destroy=OK,OK", "->REVOKED->CLOSED,CLOSED", "n/a",
       "closed"}},
     {{"revoke=InvalidUsage,InvalidUsage msg=unsupported", "n/a", "n/a", "healthy"},
      {"revoke=UNSUPPORTED,UNSUPPORTED msg=R6", "->READY,READY", "n/a", "healthy"}},
     0, -1, 0, 0, NULL, {1, 1}},
    {"revoke_absent_sim", "R6", "the sim modelling 2.28.3 (NCFSM_SIM_NCCL_VERSION=22803): unsupported",
     {raw_revoke, nf_revoke},
     {{0}},
     {{"revoke=InvalidUsage,InvalidUsage msg=unsupported", "n/a", "n/a", "healthy"},
      {"revoke=UNSUPPORTED,UNSUPPORTED msg=R6", "->READY,READY", "n/a", "healthy"}},
     1, -1, 0, 22803, NULL, {1, 1}},
    {"revoke_absent_sim_knob", "R6", "the sim's per-comm has_revoke=0 knob (2.28.3 per comm): unsupported",
     {raw_revoke, nf_revoke},
     {{0}},
     {{"revoke=InvalidUsage,InvalidUsage msg=unsupported", "n/a", "n/a", "healthy"},
      {"revoke=UNSUPPORTED,UNSUPPORTED msg=R6", "->READY,READY", "n/a", "healthy"}},
     1, 0, 0, 0, NULL, {1, 1}},
    {"mixed_blocking_nonblocking", "R3", "blocking and nonblocking comms in one group",
     {raw_mixed, nf_mixed},
     {{"ops(blk,blk,nb,nb)=Success,Success,InvalidArgument,InvalidArgument ge=InvalidArgument "
       "warn=blocking-nonblocking-mix",
       "blk=Success,Success nb=InvalidArgument,InvalidArgument", "blk=wrong nb=wrong",
       "blk:healthy nb:poisoned(r0=InvalidArgument r1=InvalidArgument)"},
      /* ncfsm: refused before NCCL (nothing launched, comms healthy), or split
       * into one backend group per blocking mode (both right). */
      {"ops=OK ge=INVALID_USAGE OR ops=OK ge=OK",
       "works(blk,nb)=GROUP,GROUP blk=READY,READY nb=READY,READY OR works(blk,nb)=OK,OK blk=READY,READY nb=READY,READY",
       "blk=wrong nb=wrong OR blk=ok nb=ok", "healthy"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"blocking_then_nonblocking_groups", "R3",
     "two legal groups back to back: one over blocking comms, one over nonblocking comms",
     {raw_two_groups, nf_two_groups},
     {{"ge(blk)=Success ge(nb)=InProgress", "blk=Success,Success nb=Success,Success", "blk=ok nb=ok",
       "blk:healthy nb:healthy"},
      {"ops=OK ge=OK,OK", "works(blk,nb)=OK,OK blk=READY,READY nb=READY,READY", "blk=ok nb=ok", "healthy"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 1}},
    {"abort_in_flight", "R5", "abort both ranks while a 256 MiB AllReduce runs (raw: in one group, R5; ncfsm: ncfsm_comm_abort on each)",
     {raw_abort, nf_abort},
     {{"ge=InProgress ->Success,Success running-at-abort=yes abort=Success,Success ge=Success", "n/a",
       "stream=drained", "closed"},
      {"abort-at-final(work IN_FLIGHT)=OK,OK", "->CLOSED,CLOSED", "works=ABORTED,ABORTED", "closed"}},
     {{0}}, 0, -1, 0, 0, NULL, {1, 2}},
    {"split_child_handle", "R8", "split child handle valid only after the parent polls to success",
     {NULL, NULL}, {{0}}, {{0}}, 0, -1, 0, 0,
     "the backend interface (core/backend.h) has no split entry point; nothing to call", {1, 1}},
};
#define NSCEN ((int)(sizeof scenarios / sizeof scenarios[0]))

/* ---- known differences ------------------------------------------------------------------ */

typedef struct known {
  const char *scenario, *mode, *backend, *field, *observed, *reason;
} known_t;

/* An explained disagreement: matches only this exact observation. */
static const known_t knowns[] = {
    {"event_after_inprogress", "raw", "sim", "data", "early-event=complete-before-data final-event=complete data-ok",
     "the sim has no device time: an op executes at the first progress step (here the event query), so an "
     "event recorded after the launch is final is already complete when queried (docs/sim.md, Streams and "
     "events)"},
    {"event_after_inprogress", "ncfsm", "sim", "data", "event-at-final=complete data-ok",
     "as for raw on the sim: the engine's query right after the final poll runs the op (no device time)"},
    {"abort_in_flight", "ncfsm", "sim", "rc", "abort-at-final(work COMPLETED)=OK,OK",
     "the sim has no device time: the engine's event query in the turn that made the work IN_FLIGHT "
     "already ran rank 0's op, so there is nothing in flight to abort"},
    {"abort_in_flight", "ncfsm", "sim", "data", "works=OK,ABORTED",
     "as above: rank 0's work completed before the abort (no device time in the sim); rank 1's was aborted"},
    /* measured on the GPU host where NCCL differs from NCCL-RULES (docs/conformance.md) */
    {"call_during_inprogress", "raw", "nccl", "data", "first=wrong second=wrong",
     "NOT REPRODUCED (R2 'the first operation's data was correct'): here the first launch was the comm's first "
     "collective, still connecting; the rejected second group's cleanup broke that connection setup (NCCL WARN "
     "'Socket recv failed while polling', 'ncclAsyncJobComplete: job ... failed, job error 3'), so the first "
     "AllReduce never produced its result either. The poisoning itself (InvalidArgument for good) reproduces"},
    {"finalize_twice", "raw", "nccl", "health", "healthy",
     "NOT REPRODUCED as lasting: the first poll after the second Finalize returned ncclInvalidArgument, a later "
     "ncclCommGetAsyncError returned ncclSuccess again (the sim keeps the comm poisoned)"},
    {"destroy_poisoned_cascade", "raw", "nccl", "rc",
     "finalize-again=InvalidArgument destroy(r0)=Success next:gs=Success init=Success,Success ge=InProgress",
     "NOT REPRODUCED with a poll first: once Finalize polled to its end (one InvalidArgument, then Success) "
     "Destroy succeeded and the next comm on the thread initialised; R4's cascade needs the Destroy while the "
     "state is InProgress (row destroy_inprogress_cascade)"},
    {"destroy_poisoned_cascade", "raw", "nccl", "async", "r0=InvalidArgument next=Success,Success",
     "as above: the next communicator created on the thread was fine"},
    {"destroy_poisoned_cascade", "raw", "nccl", "health", "healthy", "as above"},
    {"destroy_inprogress_cascade", "raw", "nccl", "rc",
     "finalize-again=InvalidArgument destroy(r0)=InvalidArgument next:gs=Success init=Success,Success ge=Success",
     "PARTLY REPRODUCED (R4): the second Finalize and the Destroy right after it returned ncclInvalidArgument "
     "as measured in NCCL-RULES, but the NEXT communicator created on the thread initialised normally on "
     "2.28.3 and 2.28.9 (one process, one thread, two GPUs): the cross-communicator cascade did not occur"},
    {"destroy_inprogress_cascade", "raw", "nccl", "async", "r0=InvalidArgument next=Success,Success",
     "as above: rank 0 stayed poisoned (ncclInvalidArgument), the next communicator reached ncclSuccess"},
    {"destroy_inprogress_cascade", "raw", "nccl", "health", "healthy",
     "as above: the next communicator was healthy; rank 0 was aborted by the scenario's cleanup"},
    {"mixed_blocking_nonblocking", "raw", "nccl", "rc",
     "ops(blk,blk,nb,nb)=Success,Success,Success,Success ge=InProgress",
     "NOT REPRODUCED (R3 'Blocking and nonblocking communicators in one group: ncclInvalidArgument'): for "
     "collectives NCCL 2.28.3 and 2.28.9 accepted the mixed group, ran it as a nonblocking group and printed no "
     "WARN; the check exists for inits (row destroy_inprogress_cascade shows its WARN)"},
    {"mixed_blocking_nonblocking", "raw", "nccl", "async", "blk=InProgress,InProgress nb=Success,Success",
     "measured: the blocking comms' async state stayed ncclInProgress for the 15 s poll limit: a blocking comm "
     "is never joined by ncclCommGetAsyncError, so every later call on it fails R2's readiness check"},
    {"mixed_blocking_nonblocking", "raw", "nccl", "data", "blk=ok nb=ok", "measured: both AllReduces ran"},
    {"mixed_blocking_nonblocking", "raw", "nccl", "health", "blk:poisoned(r0=InProgress r1=InProgress) nb:healthy",
     "measured: the blocking comms are stuck in InProgress (see async)"},
    {"mixed_blocking_nonblocking", "ncfsm", "nccl", "health",
     "unhealthy(READY/InProgress READY/InProgress READY/Success READY/Success)",
     "OPEN ncfsm gap: ncfsm let the mixed group reach NCCL; the data is right but the blocking comms' NCCL "
     "state is stuck in InProgress while ncfsm says READY: their next op will be refused by NCCL. Fix: reject "
     "mixed groups at ncfsm_group_end"},
    {"blocking_then_nonblocking_groups", "ncfsm", "nccl", "health",
     "unhealthy(READY/InProgress READY/InProgress READY/Success READY/Success)",
     "OPEN ncfsm gap: the launcher coalesced the two legal groups into one NCCL group mixing blocking and "
     "nonblocking comms; the blocking comms are left in InProgress inside NCCL (ncfsm says READY). Fix: "
     "coalesce only batches of the same blocking mode"},
    /* ncfsm gap (docs/conformance.md, Open differences): no blocking-mode check */
    {"mixed_blocking_nonblocking", "ncfsm", "*", "async",
     "works(blk,nb)=BACKEND,BACKEND blk=ERROR,ERROR nb=ERROR,ERROR",
     "OPEN ncfsm gap: ncfsm_group_end does not check that a group mixes blocking and nonblocking comms; the "
     "backend group end fails (R3) and all four comms go to ERROR and are aborted. Fix: reject at "
     "ncfsm_group_end (NCFSM_ERR_INVALID_USAGE, nothing reaches NCCL)"},
    {"mixed_blocking_nonblocking", "ncfsm", "*", "health",
     "unhealthy(ERROR/Success ERROR/Success ERROR/InvalidArgument ERROR/InvalidArgument)",
     "OPEN ncfsm gap: as above; the nonblocking comms were poisoned by NCCL (R3)"},
    {"blocking_then_nonblocking_groups", "ncfsm", "*", "async",
     "works(blk,nb)=BACKEND,BACKEND blk=ERROR,ERROR nb=ERROR,ERROR",
     "OPEN ncfsm gap: the launcher (ncfsm__launch) coalesces the two legal groups into ONE backend group "
     "although one is blocking and one nonblocking; NCCL rejects the mix (R3) and a legal program loses four "
     "comms. Fix: coalesce only batches of the same blocking mode (and issue_inits likewise)"},
    {"blocking_then_nonblocking_groups", "ncfsm", "*", "data", "blk=wrong nb=wrong",
     "OPEN ncfsm gap: as above (the ops never ran)"},
    {"blocking_then_nonblocking_groups", "ncfsm", "*", "health",
     "unhealthy(ERROR/Success ERROR/Success ERROR/InvalidArgument ERROR/InvalidArgument)",
     "OPEN ncfsm gap: as above"},
};
#define NKNOWN ((int)(sizeof knowns / sizeof knowns[0]))

/* Alternatives separated by " OR ". */
static int field_match(const char *exp, const char *got) {
  if (!exp || !*exp) return 1; /* not compared */
  const char *p = exp;
  for (;;) {
    const char *q = strstr(p, " OR ");
    size_t n = q ? (size_t)(q - p) : strlen(p);
    if (strlen(got) == n && !strncmp(p, got, n)) return 1;
    if (!q) return 0;
    p = q + 4;
  }
}

/* ---- running ------------------------------------------------------------------------------ */

typedef struct job {
  ctx_t *x;
  void (*fn)(ctx_t *, obs_t *);
  obs_t *o;
  volatile int done;
} job_t;

static void *job_main(void *a) {
  job_t *j = a;
  j->fn(j->x, j->o);
  j->done = 1;
  return NULL;
}

typedef struct result {
  const scen_t *s;
  int mode;
  obs_t o;
  const char *verdict; /* PASS, KNOWN, FAIL, SKIP */
  char why[2400];
  const known_t *known;
  double ms;
  int rev; /* revision of the scenario code that produced the observation */
} result_t;

static void usage(void) {
  fprintf(stderr, "usage: ncfsm-conformance [--backend nccl|sim] [--mode raw|ncfsm|all] [--json FILE] "
                  "[--md FILE] [--only ID] [--timeout-s N]\n"
                  "       ncfsm-conformance [--md FILE] [--json FILE] --recheck RESULTS.json   (re-evaluate an "
                  "earlier run)\n");
}

static void md_escape(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '|') fputs("\\|", f);
    else fputc(*s, f);
  }
}

static void write_md(FILE *f, ctx_t *x, result_t *res, int nres, int npass, int nknown, int nfail, int nskip) {
  fprintf(f, "## ncfsm conformance: backend %s, NCCL %d (%s), features 0x%x\n\n", x->bname, x->version,
          x->is_sim ? "modelled" : "runtime", x->features);
  fprintf(f, "| scenario | rule | mode | return codes | async | data | health | verdict |\n");
  fprintf(f, "|---|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < nres; i++) {
    result_t *r = &res[i];
    fprintf(f, "| %s | %s | %s | ", r->s->id, r->s->rule, r->mode < 0 ? "-" : mode_name[r->mode]);
    md_escape(f, r->o.rc);
    fputs(" | ", f);
    md_escape(f, r->o.async);
    fputs(" | ", f);
    md_escape(f, r->o.data);
    fputs(" | ", f);
    md_escape(f, r->o.health);
    fprintf(f, " | %s |\n", r->verdict);
  }
  fprintf(f, "\n%d pass, %d known differences, %d fail, %d skipped\n", npass, nknown, nfail, nskip);
  for (int i = 0; i < nres; i++) {
    result_t *r = &res[i];
    if (r->o.info[0]) fprintf(f, "\n- info %s/%s: %s", r->s->id, r->mode < 0 ? "-" : mode_name[r->mode], r->o.info);
  }
  fputs("\n", f);
  for (int i = 0; i < nres; i++) {
    result_t *r = &res[i];
    if (!strcmp(r->verdict, "PASS")) continue;
    fprintf(f, "\n- %s %s/%s: %s", r->verdict, r->s->id, r->mode < 0 ? "-" : mode_name[r->mode], r->why);
  }
  fputs("\n", f);
}

static void emit(ctx_t *xp, result_t *res, int nres, int npass, int nknown, int nfail, int nskip, const char *md,
                 const char *json) {
  ctx_t x = *xp;
  printf("\n");
  write_md(stdout, &x, res, nres, npass, nknown, nfail, nskip);
  if (md) {
    FILE *f = fopen(md, "w");
    if (f) write_md(f, &x, res, nres, npass, nknown, nfail, nskip), fclose(f);
    else fprintf(stderr, "cannot write %s: %s\n", md, strerror(errno));
  }
  if (json) {
    json_t *root = json_object(), *arr = json_array();
    json_object_set_new(root, "backend", json_string(x.bname));
    json_object_set_new(root, "nccl_version", json_integer(x.version));
    json_object_set_new(root, "features", json_integer(x.features));
    json_object_set_new(root, "pass", json_integer(npass));
    json_object_set_new(root, "known", json_integer(nknown));
    json_object_set_new(root, "fail", json_integer(nfail));
    json_object_set_new(root, "skip", json_integer(nskip));
    for (int i = 0; i < nres; i++) {
      result_t *r = &res[i];
      json_t *o = json_object();
      json_object_set_new(o, "scenario", json_string(r->s->id));
      json_object_set_new(o, "rule", json_string(r->s->rule));
      json_object_set_new(o, "title", json_string(r->s->title));
      json_object_set_new(o, "mode", json_string(mode_name[r->mode]));
      json_object_set_new(o, "rc", json_string(r->o.rc));
      json_object_set_new(o, "async", json_string(r->o.async));
      json_object_set_new(o, "data", json_string(r->o.data));
      json_object_set_new(o, "health", json_string(r->o.health));
      json_object_set_new(o, "info", json_string(r->o.info));
      json_object_set_new(o, "verdict", json_string(r->verdict));
      json_object_set_new(o, "why", json_string(r->why));
      json_object_set_new(o, "ms", json_real(r->ms));
      json_object_set_new(o, "rev", json_integer(r->rev));
      json_array_append_new(arr, o);
    }
    json_object_set_new(root, "results", arr);
    if (json_dump_file(root, json, JSON_INDENT(1)) != 0) fprintf(stderr, "cannot write %s\n", json);
    json_decref(root);
  }
}

/* Compare an observation with the scenario's expectation: 0 pass, 1 known difference, 2 fail. */
static int evaluate(const ctx_t *xp, unsigned features, const scen_t *s, int m, result_t *r) {
  const exp_t *e = (!(features & NCFSM__HAS_REVOKE) && s->exp_norevoke[m].rc) ? &s->exp_norevoke[m] : &s->exp[m];
  const char *fname[4] = {"rc", "async", "data", "health"};
  const char *got[4] = {r->o.rc, r->o.async, r->o.data, r->o.health};
  const char *want[4] = {e->rc, e->async, e->data, e->health};
  int fail = 0, known = 0;
  r->why[0] = '\0';
  for (int f = 0; f < 4; f++) {
    if (field_match(want[f], got[f])) continue;
    const known_t *k = NULL;
    for (int ki = 0; ki < NKNOWN && !k; ki++)
      if (!strcmp(knowns[ki].scenario, s->id) && !strcmp(knowns[ki].mode, mode_name[m]) &&
          (!strcmp(knowns[ki].backend, "*") || !strcmp(knowns[ki].backend, xp->bname)) &&
          !strcmp(knowns[ki].field, fname[f]) && !strcmp(knowns[ki].observed, got[f]))
        k = &knowns[ki];
    size_t n = strlen(r->why);
    if (k) {
      known++;
      r->known = k;
      snprintf(r->why + n, sizeof r->why - n, "%s%s: known difference: %s", n ? "; " : "", fname[f], k->reason);
    } else {
      fail++;
      snprintf(r->why + n, sizeof r->why - n, "%s%s: expected [%s] got [%s]", n ? "; " : "", fname[f], want[f],
               got[f]);
    }
  }
  r->verdict = fail ? "FAIL" : known ? "KNOWN" : "PASS";
  return fail ? 2 : known ? 1 : 0;
}

/* --recheck: the observations of an earlier run (its --json) against the current expectations. */
static int recheck(const char *file, const char *md, const char *json_out) {
  json_error_t err;
  json_t *root = json_load_file(file, 0, &err);
  if (!root) {
    fprintf(stderr, "%s: %s (line %d)\n", file, err.text, err.line);
    return 2;
  }
  ctx_t x;
  memset(&x, 0, sizeof x);
  static char bname[16];
  snprintf(bname, sizeof bname, "%s", json_string_value(json_object_get(root, "backend")) ?: "?");
  x.bname = bname;
  x.is_sim = !strcmp(bname, "sim");
  x.version = (int)json_integer_value(json_object_get(root, "nccl_version"));
  x.features = (unsigned)json_integer_value(json_object_get(root, "features"));
  json_t *arr = json_object_get(root, "results");
  result_t *res = calloc((size_t)NSCEN * M_COUNT, sizeof *res);
  int nres = 0, npass = 0, nknown = 0, nfail = 0, nskip = 0;
  printf("# recheck of %s: backend %s, NCCL %d, features 0x%x\n", file, bname, x.version, x.features);
  for (int si = 0; si < NSCEN; si++) {
    const scen_t *s = &scenarios[si];
    for (int m = 0; m < M_COUNT; m++) {
      json_t *hit = NULL, *it;
      size_t i;
      json_array_foreach(arr, i, it) {
        const char *sc = json_string_value(json_object_get(it, "scenario"));
        const char *mo = json_string_value(json_object_get(it, "mode"));
        if (sc && mo && !strcmp(sc, s->id) && !strcmp(mo, mode_name[m])) hit = it;
      }
      result_t *r = &res[nres++];
      r->s = s;
      r->mode = m;
#define JS(field, key) \
  snprintf(r->o.field, sizeof r->o.field, "%s", hit ? json_string_value(json_object_get(hit, key)) ?: "" : "")
      JS(rc, "rc");
      JS(async, "async");
      JS(data, "data");
      JS(health, "health");
      JS(info, "info");
#undef JS
      json_t *jr = hit ? json_object_get(hit, "rev") : NULL;
      r->rev = jr ? (int)json_integer_value(jr) : 1;
      const char *jv = hit ? json_string_value(json_object_get(hit, "verdict")) : NULL;
      if (!hit) {
        r->verdict = "NOT-RUN";
        snprintf(r->why, sizeof r->why, "not in this run (added later): run it on a GPU");
        nskip++;
      } else if (jv && !strcmp(jv, "SKIP")) {
        r->verdict = "SKIP";
        snprintf(r->why, sizeof r->why, "%s", json_string_value(json_object_get(hit, "why")) ?: "");
        nskip++;
      } else if (r->rev != s->rev[m]) {
        r->verdict = "STALE";
        snprintf(r->why, sizeof r->why, "this run measured revision %d of the scenario, the code is revision %d: "
                 "re-run on a GPU (observed then: %s | %s | %s | %s)", r->rev, s->rev[m], r->o.rc, r->o.async,
                 r->o.data, r->o.health);
        nskip++;
      } else {
        int v = evaluate(&x, x.features, s, m, r);
        if (v == 2) nfail++;
        else if (v == 1) nknown++;
        else npass++;
      }
      printf("%-7s %-32s %-5s | %s | %s | %s | %s\n", r->verdict, s->id, mode_name[m], r->o.rc, r->o.async,
             r->o.data, r->o.health);
      if (strcmp(r->verdict, "PASS")) printf("        %s\n", r->why);
    }
  }
  emit(&x, res, nres, npass, nknown, nfail, nskip, md, json_out);
  free(res);
  json_decref(root);
  return nfail ? 1 : 0;
}

int main(int argc, char **argv) {
  const char *backend = "sim", *mode = "all", *json = NULL, *md = NULL, *only = NULL, *rfile = NULL;
  int timeout_s = 45;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--backend") && v) backend = v, i++;
    else if (!strcmp(a, "--mode") && v) mode = v, i++;
    else if (!strcmp(a, "--json") && v) json = v, i++;
    else if (!strcmp(a, "--md") && v) md = v, i++;
    else if (!strcmp(a, "--only") && v) only = v, i++;
    else if (!strcmp(a, "--timeout-s") && v) timeout_s = atoi(v), i++;
    else if (!strcmp(a, "--recheck") && v) rfile = v, i++;
    else { usage(); return 2; }
  }
  if (rfile) return recheck(rfile, md, json);
  ctx_t x;
  memset(&x, 0, sizeof x);
  if (!strcmp(backend, "sim")) x.kind = NCFSM_BACKEND_SIM;
  else if (!strcmp(backend, "nccl")) x.kind = NCFSM_BACKEND_NCCL;
  else { usage(); return 2; }
  int mlo, mhi;
  if (!strcmp(mode, "raw")) mlo = mhi = M_RAW;
  else if (!strcmp(mode, "ncfsm")) mlo = mhi = M_NCFSM;
  else if (!strcmp(mode, "all")) mlo = M_RAW, mhi = M_NCFSM;
  else { usage(); return 2; }

  char why[512];
  x.be = ncfsm__backend_get(x.kind, why, sizeof why);
  if (!x.be) {
    printf("SKIP: the %s backend is not usable here: %s\n", backend, why);
    return 77;
  }
  x.is_sim = x.kind == NCFSM_BACKEND_SIM;
  x.bname = x.be->name;
  if (!x.is_sim && x.be->device_count() < NR) {
    printf("SKIP: %d CUDA device(s) visible; the suite drives %d ranks on %d GPUs\n", x.be->device_count(), NR, NR);
    return 77;
  }
  x.version = x.be->version();
  x.features = x.be->features();
  x.timeout_ms = x.is_sim ? 5000 : 15000;
  ncfsm_sim_opts base_so;
  ncfsm_sim_opts_init(&base_so);
  const char *env_v = getenv("NCFSM_SIM_NCCL_VERSION");
  char *saved_env = env_v ? strdup(env_v) : NULL;

  result_t *res = calloc((size_t)NSCEN * M_COUNT, sizeof *res);
  int nres = 0, npass = 0, nknown = 0, nfail = 0, nskip = 0;
  printf("# ncfsm conformance: backend %s, NCCL %d.%d.%d, features 0x%x\n", x.be->name, x.version / 10000,
         (x.version / 100) % 100, x.version % 100, x.features);
  for (int si = 0; si < NSCEN; si++) {
    const scen_t *s = &scenarios[si];
    if (only && strcmp(only, s->id)) continue;
    for (int m = mlo; m <= mhi; m++) {
      result_t *r = &res[nres++];
      r->s = s;
      r->mode = m;
      r->rev = s->rev[m];
      if (s->skip || (s->sim_only && !x.is_sim)) {
        r->verdict = "SKIP";
        snprintf(r->why, sizeof r->why, "%s", s->skip ? s->skip : "sim only (the nccl runtime decides: see 'revoke')");
        snprintf(r->o.rc, sizeof r->o.rc, "skipped");
        nskip++;
        printf("SKIP %-28s %-5s %s\n", s->id, mode_name[m], r->why);
        continue;
      }
      x.so = base_so;
      if (s->sim_has_revoke >= 0) x.so.has_revoke = s->sim_has_revoke;
      if (s->sim_launch_polls > 0 && m == M_NCFSM) x.so.launch_polls = s->sim_launch_polls;
      if (x.is_sim && s->sim_version > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", s->sim_version);
        setenv("NCFSM_SIM_NCCL_VERSION", v, 1); /* process-wide; read at each call (docs/sim.md) */
      }
      unsigned saved_features = x.features;
      x.features = x.be->features();
      if (x.is_sim && !x.so.has_revoke) x.features &= ~(unsigned)NCFSM__HAS_REVOKE;
      unsigned features_now = x.features;
      job_t j = {&x, s->fn[m], &r->o, 0};
      pthread_t th;
      double t0 = now_ms();
      pthread_create(&th, NULL, job_main, &j); /* fresh thread: NCCL group state is thread-local (R4) */
      while (!j.done && now_ms() - t0 < timeout_s * 1000.0) usleep(1000);
      r->ms = now_ms() - t0;
      if (!j.done) { /* the scenario thread is stuck inside a backend call: report what we have */
        printf("HANG  %-28s %-5s no result after %d s; stopping the run\n", s->id, mode_name[m], timeout_s);
        r->verdict = "FAIL";
        snprintf(r->why, sizeof r->why, "hang: no result after %d s (partial observation: %s | %s)", timeout_s,
                 r->o.rc, r->o.info);
        nfail++;
        emit(&x, res, nres, npass, nknown, nfail, nskip, md, json);
        fflush(stdout);
        _exit(1);
      }
      pthread_join(th, NULL);
      if (x.is_sim && s->sim_version > 0) {
        if (saved_env) setenv("NCFSM_SIM_NCCL_VERSION", saved_env, 1);
        else unsetenv("NCFSM_SIM_NCCL_VERSION");
      }
      x.features = saved_features;
      r->rev = s->rev[m];
      int v = evaluate(&x, features_now, s, m, r);
      if (v == 2) nfail++;
      else if (v == 1) nknown++;
      else npass++;
      int fail = v == 2, known = v == 1;
      printf("%-5s %-28s %-5s %7.1f ms | %s | %s | %s | %s\n", r->verdict, s->id, mode_name[m], r->ms, r->o.rc,
             r->o.async, r->o.data, r->o.health);
      if (fail || known) printf("      %s\n", r->why);
      fflush(stdout);
    }
  }
  emit(&x, res, nres, npass, nknown, nfail, nskip, md, json);
  free(res);
  free(saved_env);
  return nfail ? 1 : 0;
}
