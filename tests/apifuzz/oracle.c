/*
 * The oracle: what must hold after every step.
 *
 *  - every comm trace record (from, event, next) is a transition of the
 *    table (ncfsm_transition) and starts where the previous record of that
 *    comm ended; every work record is a forward step of the work lifecycle;
 *  - a work never reaches COMPLETED (status OK) after its comm's DESTROY,
 *    ABORT or REVOKE transition;
 *  - a work callback fires exactly once, never for a call that failed, with
 *    the state and status the work has;
 *  - a callback with NCFSM_OK carries data: the result buffer equals the
 *    reduction / permutation of the inputs of the instance the sim matched
 *    (the i-th collective each rank launched, the j-th send/recv per pair).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apifuzz.h"

_Thread_local fz_op *fz_submitting;
_Thread_local fz_clique *fz_initall;

/* A table with guarded rows (several next states for one (state, event))
 * offers ncfsm_transition_allowed; an older one only ncfsm_transition, whose
 * single next state is then the only legal one. The weak reference resolves
 * to NULL when the library has no such function. */
#pragma weak ncfsm_transition_allowed
int ncfsm_transition_allowed(ncfsm_state_t s, ncfsm_event_t e, ncfsm_state_t next);

void fz_oracle_init(void) {
  for (int s = 0; s < NCFSM_STATE_COUNT; s++)
    for (int e = 0; e < NCFSM_EVENT_COUNT; e++) {
      g.trans[s][e] = ncfsm_transition((ncfsm_state_t)s, (ncfsm_event_t)e, NULL, NULL);
      for (int n = 0; n < NCFSM_STATE_COUNT; n++)
        g.allowed[s][e][n] = ncfsm_transition_allowed
                                 ? ncfsm_transition_allowed((ncfsm_state_t)s, (ncfsm_event_t)e,
                                                            (ncfsm_state_t)n) != 0
                                 : g.trans[s][e] == (ncfsm_state_t)n;
    }
}

/* ---- maps ------------------------------------------------------------------------- */
void fz_map_comm(const void *p, fz_comm *c) {
  for (int i = 0; i < g.ncmap; i++)
    if (g.cmap[i].p == p) {
      g.cmap[i].c = c;
      return;
    }
  if (g.ncmap < (int)(sizeof g.cmap / sizeof g.cmap[0])) {
    g.cmap[g.ncmap].p = p;
    g.cmap[g.ncmap++].c = c;
  }
}

static fz_comm *comm_of(const void *p) {
  for (int i = 0; i < g.ncmap; i++)
    if (g.cmap[i].p == p) return g.cmap[i].c;
  return NULL;
}

static size_t whash(const void *p, int cap) {
  uintptr_t x = (uintptr_t)p;
  x ^= x >> 17;
  x *= 0xed5ad4bbu;
  x ^= x >> 11;
  return (size_t)x & (size_t)(cap - 1);
}

static void wmap_put(const void *p, fz_op *op) {
  if (2 * (g.nwmap + 1) > g.capwmap) {
    int ncap = g.capwmap ? 2 * g.capwmap : 256;
    __typeof__(g.wmap) nw = calloc((size_t)ncap, sizeof *nw);
    if (!nw) fz_violation("out of memory in the fuzzer");
    for (int i = 0; i < g.capwmap; i++)
      if (g.wmap[i].p) {
        size_t h = whash(g.wmap[i].p, ncap);
        while (nw[h].p) h = (h + 1) & (size_t)(ncap - 1);
        nw[h] = g.wmap[i];
      }
    free(g.wmap);
    g.wmap = nw;
    g.capwmap = ncap;
  }
  size_t h = whash(p, g.capwmap);
  while (g.wmap[h].p && g.wmap[h].p != p) h = (h + 1) & (size_t)(g.capwmap - 1);
  if (!g.wmap[h].p) g.nwmap++;
  g.wmap[h].p = p;
  g.wmap[h].op = op;
}

static fz_op *wmap_get(const void *p) {
  if (!g.capwmap) return NULL;
  size_t h = whash(p, g.capwmap);
  while (g.wmap[h].p) {
    if (g.wmap[h].p == p) return g.wmap[h].op;
    h = (h + 1) & (size_t)(g.capwmap - 1);
  }
  return NULL;
}

static void itab_put(fz_itab *t, uint64_t i, fz_op *op) {
  if (i >= t->cap) {
    size_t ncap = t->cap ? t->cap : 16;
    while (ncap <= i) ncap *= 2;
    fz_op **nv = realloc(t->v, ncap * sizeof *nv);
    if (!nv) fz_violation("out of memory in the fuzzer");
    memset(nv + t->cap, 0, (ncap - t->cap) * sizeof *nv);
    t->v = nv;
    t->cap = ncap;
  }
  t->v[i] = op;
  if (i + 1 > t->n) t->n = i + 1;
}

static fz_op *itab_get(const fz_itab *t, uint64_t i) { return i < t->n ? t->v[i] : NULL; }

/* ---- trace ---------------------------------------------------------------------------- */
static const char *sname(int s) {
  return s >= 0 && s < NCFSM_STATE_COUNT ? ncfsm_state_name((ncfsm_state_t)s) : "?";
}
static const char *ename(int e) {
  return e >= 0 && e < NCFSM_EVENT_COUNT ? ncfsm_event_name((ncfsm_event_t)e) : "?";
}
static const char *wname(int s) {
  return s >= 0 && s < NCFSM_WORK_STATE_COUNT ? ncfsm_work_state_name((ncfsm_work_state_t)s) : "(none)";
}

bool fz_is_final_wstate(int s) {
  return s == NCFSM_WORK_COMPLETED || s == NCFSM_WORK_FAILED || s == NCFSM_WORK_TIMED_OUT ||
         s == NCFSM_WORK_ABORTED;
}

/* The work lifecycle: QUEUED -> LAUNCHING -> IN_FLIGHT -> COMPLETED, strict
 * verification's QUEUED -> VERIFYING -> QUEUED, and from any non-final state
 * to FAILED, TIMED_OUT or ABORTED. */
static int wrank(int s) {
  switch (s) {
    case NCFSM_WORK_QUEUED: return 0;
    case NCFSM_WORK_LAUNCHING: return 1;
    case NCFSM_WORK_IN_FLIGHT: return 2;
    case NCFSM_WORK_COMPLETED: return 3;
    default: return -1;
  }
}
static bool work_step_ok(int from, int to) {
  if (fz_is_final_wstate(from)) return false;
  if (to == NCFSM_WORK_FAILED || to == NCFSM_WORK_TIMED_OUT || to == NCFSM_WORK_ABORTED) return true;
  if ((from == NCFSM_WORK_QUEUED && to == NCFSM_WORK_VERIFYING) || (from == NCFSM_WORK_VERIFYING && to == NCFSM_WORK_QUEUED))
    return true;
  int a = wrank(from), b = wrank(to);
  return a >= 0 && b == a + 1;
}

static bool is_coll(ncfsm_opkind_t k) { return k != NCFSM_KIND_SEND && k != NCFSM_KIND_RECV; }

static void trace_comm(const ncfsm_trace_rec *r) {
  fz_comm *c = comm_of(r->object);
  if (fz_initall && r->state == NCFSM_STATE_NEW && r->rank >= 0 && r->rank < fz_initall->n &&
      fz_initall->c[r->rank] && (!c || c->q != fz_initall)) {
    /* ncfsm_comm_init_all makes and inits the comms in one call (the memory
     * of a freed comm may come back) */
    c = fz_initall->c[r->rank];
    fz_map_comm(r->object, c);
  }
  if (!c) fz_violation("trace: a record for communicator %p, which the fuzzer never created", r->object);
  if (r->state < 0 || r->state >= NCFSM_STATE_COUNT || r->event < 0 || r->event >= NCFSM_EVENT_COUNT ||
      r->next < 0 || r->next >= NCFSM_STATE_COUNT)
    fz_violation("trace: comm q%d/r%d record out of range (state %d, event %d, next %d)", c->q->id,
                 c->rank, r->state, r->event, r->next);
  if (r->state != c->last_state)
    fz_violation("trace: comm q%d/r%d record %s --%s--> %s, but its previous record ended in %s",
                 c->q->id, c->rank, sname(r->state), ename(r->event), sname(r->next),
                 sname(c->last_state));
  ncfsm_state_t want = g.trans[r->state][r->event];
  if (want == NCFSM_STATE_COUNT)
    fz_violation("trace: comm q%d/r%d took %s --%s--> %s, which ncfsm_transition() says is not in "
                 "the table", c->q->id, c->rank, sname(r->state), ename(r->event), sname(r->next));
  if (!g.allowed[r->state][r->event][r->next])
    fz_violation("trace: comm q%d/r%d took %s --%s--> %s; the table says %s", c->q->id, c->rank,
                 sname(r->state), ename(r->event), sname(r->next), sname(want));
  c->last_state = r->next;
  if (!c->killed && (r->event == NCFSM_EV_DESTROY || r->event == NCFSM_EV_ABORT ||
                     r->event == NCFSM_EV_REVOKE)) {
    c->killed = true;
    c->kill_event = ename(r->event);
    c->kill_step = g.step;
  }
}

static uint64_t fnv(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; i++) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 0x100000001b3ull;
  }
  return h;
}

static bool rooted_kind(ncfsm_opkind_t k) {
  return k == NCFSM_KIND_BROADCAST || k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_GATHER ||
         k == NCFSM_KIND_SCATTER;
}
static bool reducing_kind(ncfsm_opkind_t k) {
  return k == NCFSM_KIND_ALLREDUCE || k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_REDUCESCATTER;
}

uint64_t fz_fp_hash(uint64_t h, const fz_op *op) {
  h = fnv(h, (uint64_t)op->kind);
  h = fnv(h, op->count);
  h = fnv(h, (uint64_t)op->dtype);
  h = fnv(h, rooted_kind(op->kind) ? (uint64_t)op->root : 0xffff);
  return fnv(h, reducing_kind(op->kind) ? (uint64_t)op->redop : 0xffff);
}

static void assign_instance(fz_op *op) {
  fz_comm *c = op->c;
  fz_clique *q = c->q;
  int r = c->rank;
  if (is_coll(op->kind)) {
    op->inst = (int64_t)c->coll_launched++;
    itab_put(&q->coll[r], (uint64_t)op->inst, op);
    if (FZ_SEQ_AT_LAUNCH) c->fp_hash = fz_fp_hash(c->fp_hash, op);
  } else if (op->peer >= 0 && op->peer < q->n) {
    if (op->kind == NCFSM_KIND_SEND) {
      op->inst = (int64_t)c->send_launched[op->peer]++;
      itab_put(&q->send[r][op->peer], (uint64_t)op->inst, op);
    } else {
      op->inst = (int64_t)c->recv_launched[op->peer]++;
      itab_put(&q->recv[r][op->peer], (uint64_t)op->inst, op);
    }
  }
}

static void trace_work(const ncfsm_trace_rec *r) {
  if (r->state == -1 && r->next == NCFSM_WORK_QUEUED) { /* a new work, inside its submission */
    fz_op *op = fz_submitting;
    if (!op)
      fz_violation("trace: work %p was queued outside any submission the fuzzer made", r->object);
    fz_op *old = wmap_get(r->object);
    if (old && old != op && !fz_is_final_wstate(old->wstate))
      fz_violation("the memory of op %d's work (%p, q%d/r%d %s, state %s, submitted at step %d) was reused "
                   "for a new work (op %d) while op %d was not final (a released handle freed a live work?)",
                   old->id, r->object, old->c->q->id, old->rank, ncfsm_opkind_name(old->kind),
                   wname(old->wstate), old->step, op->id, old->id);
    if (op->seen)
      fz_violation("trace: submission of op %d queued two works (%p, %p)", op->id, op->seen, r->object);
    op->seen = r->object;
    op->wstate = NCFSM_WORK_QUEUED;
    wmap_put(r->object, op);
    return;
  }
  fz_op *op = wmap_get(r->object);
  if (!op) fz_violation("trace: a record for work %p, which no submission queued", r->object);
  if (r->state != op->wstate)
    fz_violation("trace: op %d (q%d/r%d %s) went %s -> %s, but its previous record ended in %s "
                 "(was its work handle reused while still live?)",
                 op->id, op->c->q->id, op->rank, ncfsm_opkind_name(op->kind), wname(r->state),
                 wname(r->next), wname(op->wstate));
  if (!work_step_ok(r->state, r->next))
    fz_violation("trace: op %d went %s -> %s, not a step of the work lifecycle", op->id,
                 wname(r->state), wname(r->next));
  if (fz_is_final_wstate(r->next) && ((r->next == NCFSM_WORK_COMPLETED) != (r->result == NCFSM_OK)))
    fz_violation("trace: op %d reached %s with result %s", op->id, wname(r->next),
                 ncfsm_err_name(r->result));
  op->wstate = r->next;
  if (r->next == NCFSM_WORK_LAUNCHING) assign_instance(op);
  if (r->next == NCFSM_WORK_COMPLETED && op->c->killed) {
    op->completed_after_kill = true;
    fz_violation("op %d (q%d/r%d %s, submitted at step %d) reached COMPLETED with NCFSM_OK after its "
                 "communicator's %s transition (step %d): a work of a destroyed, revoked or aborted "
                 "comm must end with an error",
                 op->id, op->c->q->id, op->rank, ncfsm_opkind_name(op->kind), op->step,
                 op->c->kill_event, op->c->kill_step);
  }
}

void fz_trace(const ncfsm_trace_rec *rec, void *arg) {
  (void)arg;
  pthread_mutex_lock(&g.mu);
  g.n_trace++;
  if (rec->kind == NCFSM_OBJ_COMM) trace_comm(rec);
  else if (rec->kind == NCFSM_OBJ_WORK) trace_work(rec);
  pthread_mutex_unlock(&g.mu);
}

void fz_state_cb(ncfsm_comm *comm, ncfsm_state_t from, ncfsm_state_t to, ncfsm_event_t ev, void *arg) {
  (void)arg;
  pthread_mutex_lock(&g.mu);
  fz_comm *c = comm_of(comm);
  if (!c) fz_violation("on_state: called for communicator %p, which the fuzzer never created", (void *)comm);
  c->onstate_count++;
  if ((unsigned)from >= NCFSM_STATE_COUNT || (unsigned)ev >= NCFSM_EVENT_COUNT ||
      (unsigned)to >= NCFSM_STATE_COUNT || !g.allowed[from][ev][to])
    fz_violation("on_state: comm q%d/r%d reported %s --%s--> %s, not a transition of the table",
                 c->q->id, c->rank, sname((int)from), ename((int)ev), sname((int)to));
  pthread_mutex_unlock(&g.mu);
}

/* ---- values ------------------------------------------------------------------------------ */
static bool is_float(int dt) {
  return dt == NCFSM_FLOAT16 || dt == NCFSM_FLOAT32 || dt == NCFSM_FLOAT64 || dt == NCFSM_BFLOAT16;
}
static bool is_unsigned(int dt) { return dt == NCFSM_UINT8 || dt == NCFSM_UINT32 || dt == NCFSM_UINT64; }

static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t e = (int32_t)((x >> 23) & 0xff);
  uint32_t m = x & 0x7fffffu;
  if (e == 0) return (uint16_t)sign;
  int32_t he = e - 127 + 15;
  if (he >= 31) return (uint16_t)(sign | 0x7c00u);
  if (he <= 0) return (uint16_t)sign; /* the fuzzer's values are never this small */
  uint32_t h = sign | ((uint32_t)he << 10) | (m >> 13), rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
  return (uint16_t)h;
}
static float f16_to_f32(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v;
  if (e == 0) v = ldexpf((float)m, -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = ldexpf((float)(m + 1024), e - 25);
  return s ? -v : v;
}
static float bf16_to_f32(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static uint16_t f32_to_bf16(float f) { /* exact for the fuzzer's small integers */
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)(x >> 16);
}

static double get_elem(int dt, const void *buf, size_t i) {
  const unsigned char *b = buf;
  switch (dt) {
    case NCFSM_INT8: return ((const int8_t *)b)[i];
    case NCFSM_UINT8: return ((const uint8_t *)b)[i];
    case NCFSM_INT32: { int32_t v; memcpy(&v, b + 4 * i, 4); return v; }
    case NCFSM_UINT32: { uint32_t v; memcpy(&v, b + 4 * i, 4); return v; }
    case NCFSM_INT64: { int64_t v; memcpy(&v, b + 8 * i, 8); return (double)v; }
    case NCFSM_UINT64: { uint64_t v; memcpy(&v, b + 8 * i, 8); return (double)v; }
    case NCFSM_FLOAT16: { uint16_t v; memcpy(&v, b + 2 * i, 2); return f16_to_f32(v); }
    case NCFSM_BFLOAT16: { uint16_t v; memcpy(&v, b + 2 * i, 2); return bf16_to_f32(v); }
    case NCFSM_FLOAT32: { float v; memcpy(&v, b + 4 * i, 4); return v; }
    case NCFSM_FLOAT64: { double v; memcpy(&v, b + 8 * i, 8); return v; }
    default: return 0;
  }
}

static void set_elem(int dt, void *buf, size_t i, int v) {
  unsigned char *b = buf;
  switch (dt) {
    case NCFSM_INT8: ((int8_t *)b)[i] = (int8_t)v; break;
    case NCFSM_UINT8: ((uint8_t *)b)[i] = (uint8_t)v; break;
    case NCFSM_INT32: { int32_t x = v; memcpy(b + 4 * i, &x, 4); break; }
    case NCFSM_UINT32: { uint32_t x = (uint32_t)v; memcpy(b + 4 * i, &x, 4); break; }
    case NCFSM_INT64: { int64_t x = v; memcpy(b + 8 * i, &x, 8); break; }
    case NCFSM_UINT64: { uint64_t x = (uint64_t)v; memcpy(b + 8 * i, &x, 8); break; }
    case NCFSM_FLOAT16: { uint16_t x = f32_to_f16((float)v); memcpy(b + 2 * i, &x, 2); break; }
    case NCFSM_BFLOAT16: { uint16_t x = f32_to_bf16((float)v); memcpy(b + 2 * i, &x, 2); break; }
    case NCFSM_FLOAT32: { float x = (float)v; memcpy(b + 4 * i, &x, 4); break; }
    case NCFSM_FLOAT64: { double x = v; memcpy(b + 8 * i, &x, 8); break; }
    default: break;
  }
}

/* Inputs are small integers, so that every reduction of up to 4 ranks is
 * exact in every type (PROD of 4 values in -2..2 fits int8). */
void fz_fill_input(fz_op *op) {
  if (!op->send || !op->send_bytes) return;
  size_t es = ncfsm_dtype_size((ncfsm_dtype_t)op->dtype);
  if (!es) { /* an invalid dtype: any bytes */
    memset(op->send, 0x11, op->send_bytes);
  } else {
    bool prod = op->redop == NCFSM_OP_PROD;
    int lo = is_unsigned(op->dtype) ? 0 : (prod ? -2 : -7), hi = prod ? 2 : 7;
    uint64_t s = g.o.seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)op->id << 20);
    for (size_t i = 0; i < op->send_bytes / es; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      set_elem(op->dtype, op->send, i, lo + (int)((s >> 33) % (uint64_t)(hi - lo + 1)));
    }
  }
  op->in = malloc(op->send_bytes);
  if (!op->in) fz_violation("out of memory in the fuzzer");
  memcpy(op->in, op->send, op->send_bytes);
}

void fz_fill_sentinel(void *buf, size_t bytes) {
  if (buf) memset(buf, 0xa5, bytes);
}

static double reduce(int dt, int redop, const double *v, int n) {
  if (!is_float(dt)) {
    int64_t acc = (int64_t)v[0];
    for (int k = 1; k < n; k++) {
      int64_t x = (int64_t)v[k];
      switch (redop) {
        case NCFSM_OP_SUM: case NCFSM_OP_AVG: acc += x; break;
        case NCFSM_OP_PROD: acc *= x; break;
        case NCFSM_OP_MAX: acc = x > acc ? x : acc; break;
        case NCFSM_OP_MIN: acc = x < acc ? x : acc; break;
        default: break;
      }
    }
    if (redop == NCFSM_OP_AVG) acc /= n; /* truncates toward zero (docs/sim.md) */
    return (double)acc;
  }
  double acc = v[0];
  for (int k = 1; k < n; k++) {
    switch (redop) {
      case NCFSM_OP_SUM: case NCFSM_OP_AVG: acc += v[k]; break;
      case NCFSM_OP_PROD: acc *= v[k]; break;
      case NCFSM_OP_MAX: acc = v[k] > acc ? v[k] : acc; break;
      case NCFSM_OP_MIN: acc = v[k] < acc ? v[k] : acc; break;
      default: break;
    }
  }
  return redop == NCFSM_OP_AVG ? acc / n : acc;
}

static bool close_enough(int dt, double got, double want) {
  double tol;
  switch (dt) {
    case NCFSM_FLOAT16: tol = 2e-3; break;
    case NCFSM_BFLOAT16: tol = 1.6e-2; break;
    case NCFSM_FLOAT32: tol = 1e-5; break;
    case NCFSM_FLOAT64: tol = 1e-12; break;
    default: return got == want;
  }
  return fabs(got - want) <= tol * (fabs(want) > 1 ? fabs(want) : 1);
}

static void data_mismatch(const fz_op *op, size_t i, double got, double want, const char *how) {
  fz_violation("op %d (q%d/r%d %s %s count %zu, instance %lld, submitted at step %d) completed with "
               "NCFSM_OK but recv[%zu] = %g, expected %g (%s)",
               op->id, op->c->q->id, op->rank, ncfsm_opkind_name(op->kind),
               ncfsm_dtype_name((ncfsm_dtype_t)op->dtype), op->count, (long long)op->inst, op->step, i,
               got, want, how);
}

static const char *fp_diff(const fz_op *a, const fz_op *b) {
  if (a->kind != b->kind) return "another kind";
  if (a->count != b->count) return "another count";
  if (a->dtype != b->dtype) return "another dtype";
  bool rooted = a->kind == NCFSM_KIND_BROADCAST || a->kind == NCFSM_KIND_REDUCE ||
                a->kind == NCFSM_KIND_GATHER || a->kind == NCFSM_KIND_SCATTER;
  bool reduces = a->kind == NCFSM_KIND_ALLREDUCE || a->kind == NCFSM_KIND_REDUCE ||
                 a->kind == NCFSM_KIND_REDUCESCATTER;
  if (rooted && a->root != b->root) return "another root";
  if (reduces && a->redop != b->redop) return "another reduction";
  return NULL;
}

/* rank r of op's clique, element i of its send input (original bytes) */
static double in_at(const fz_op *p, size_t i) { return get_elem(p->dtype, p->in, i); }

static void check_coll(fz_op *op) {
  fz_clique *q = op->c->q;
  int n = q->n, r = op->rank;
  size_t c = op->count;
  bool root_local = op->kind == NCFSM_KIND_BROADCAST && op->root == r;
  fz_op *P[FZ_MAX_RANKS];
  const char *why = NULL;
  int bad = -1;
  for (int k = 0; k < n; k++) {
    P[k] = itab_get(&q->coll[k], (uint64_t)op->inst);
    if (!P[k] && !why) { why = "never launched that instance"; bad = k; }
    else if (P[k] && !why && fp_diff(op, P[k])) { why = fp_diff(op, P[k]); bad = k; }
  }
  if (why) {
    /* R11: a Broadcast root may complete locally while its peers hang; its data is its own. */
    if (root_local) {
      for (size_t i = 0; i < c; i++)
        if (!close_enough(op->dtype, get_elem(op->dtype, op->recv, i), in_at(op, i)))
          data_mismatch(op, i, get_elem(op->dtype, op->recv, i), in_at(op, i), "broadcast root's own data");
      return;
    }
    fz_violation("op %d (q%d/r%d %s, instance %lld, submitted at step %d) completed with NCFSM_OK, but "
                 "rank %d %s: the collective cannot have run",
                 op->id, q->id, r, ncfsm_opkind_name(op->kind), (long long)op->inst, op->step, bad, why);
  }
  if (!c) return;
  int dt = op->dtype, ro = op->redop, root = op->root;
  double v[FZ_MAX_RANKS];
  switch (op->kind) {
    case NCFSM_KIND_ALLREDUCE:
      for (size_t i = 0; i < c; i++) {
        for (int k = 0; k < n; k++) v[k] = in_at(P[k], i);
        double want = reduce(dt, ro, v, n), got = get_elem(dt, op->recv, i);
        if (!close_enough(dt, got, want)) data_mismatch(op, i, got, want, "allreduce of the ranks' inputs");
      }
      break;
    case NCFSM_KIND_REDUCE:
      if (r != root || !op->recv) break;
      for (size_t i = 0; i < c; i++) {
        for (int k = 0; k < n; k++) v[k] = in_at(P[k], i);
        double want = reduce(dt, ro, v, n), got = get_elem(dt, op->recv, i);
        if (!close_enough(dt, got, want)) data_mismatch(op, i, got, want, "reduce at the root");
      }
      break;
    case NCFSM_KIND_BROADCAST:
      for (size_t i = 0; i < c; i++) {
        double want = in_at(P[root], i), got = get_elem(dt, op->recv, i);
        if (!close_enough(dt, got, want)) data_mismatch(op, i, got, want, "the root's input");
      }
      break;
    case NCFSM_KIND_ALLGATHER:
      for (int k = 0; k < n; k++)
        for (size_t i = 0; i < c; i++) {
          double want = in_at(P[k], i), got = get_elem(dt, op->recv, (size_t)k * c + i);
          if (!close_enough(dt, got, want)) data_mismatch(op, (size_t)k * c + i, got, want, "rank-major gather");
        }
      break;
    case NCFSM_KIND_REDUCESCATTER:
      for (size_t i = 0; i < c; i++) {
        for (int k = 0; k < n; k++) v[k] = in_at(P[k], (size_t)r * c + i);
        double want = reduce(dt, ro, v, n), got = get_elem(dt, op->recv, i);
        if (!close_enough(dt, got, want)) data_mismatch(op, i, got, want, "reduction of this rank's block");
      }
      break;
    case NCFSM_KIND_ALLTOALL:
      for (int k = 0; k < n; k++)
        for (size_t i = 0; i < c; i++) {
          double want = in_at(P[k], (size_t)r * c + i), got = get_elem(dt, op->recv, (size_t)k * c + i);
          if (!close_enough(dt, got, want)) data_mismatch(op, (size_t)k * c + i, got, want, "block of rank k");
        }
      break;
    case NCFSM_KIND_GATHER:
      if (r != root || !op->recv) break;
      for (int k = 0; k < n; k++)
        for (size_t i = 0; i < c; i++) {
          double want = in_at(P[k], i), got = get_elem(dt, op->recv, (size_t)k * c + i);
          if (!close_enough(dt, got, want)) data_mismatch(op, (size_t)k * c + i, got, want, "gather at the root");
        }
      break;
    case NCFSM_KIND_SCATTER:
      for (size_t i = 0; i < c; i++) {
        double want = in_at(P[root], (size_t)r * c + i), got = get_elem(dt, op->recv, i);
        if (!close_enough(dt, got, want)) data_mismatch(op, i, got, want, "the root's block for this rank");
      }
      break;
    default:
      break;
  }
}

static void check_p2p(fz_op *op) {
  fz_clique *q = op->c->q;
  int r = op->rank, p = op->peer;
  if (p < 0 || p >= q->n)
    fz_violation("op %d (%s to/from peer %d, out of range) completed with NCFSM_OK", op->id,
                 ncfsm_opkind_name(op->kind), p);
  fz_op *other = op->kind == NCFSM_KIND_SEND ? itab_get(&q->recv[p][r], (uint64_t)op->inst)
                                             : itab_get(&q->send[p][r], (uint64_t)op->inst);
  if (!other || other->count != op->count || other->dtype != op->dtype)
    fz_violation("op %d (q%d/r%d %s peer %d, pair %lld, submitted at step %d) completed with NCFSM_OK, "
                 "but rank %d %s", op->id, q->id, r, ncfsm_opkind_name(op->kind), p, (long long)op->inst,
                 op->step, p, !other ? "never launched the matching op" : "launched it with another count or dtype");
  if (op->kind == NCFSM_KIND_RECV)
    for (size_t i = 0; i < op->count; i++) {
      double want = in_at(other, i), got = get_elem(op->dtype, op->recv, i);
      if (!close_enough(op->dtype, got, want)) data_mismatch(op, i, got, want, "the sender's data");
    }
}

void fz_check_ok_locked(fz_op *op) {
  if (op->data_checked) return;
  op->data_checked = true;
  g.n_ok_checked++;
  if (op->inst < 0)
    fz_violation("op %d (q%d/r%d %s, submitted at step %d) completed with NCFSM_OK but never reached "
                 "the backend (no LAUNCHING record)",
                 op->id, op->c->q->id, op->rank, ncfsm_opkind_name(op->kind), op->step);
  if (is_coll(op->kind)) check_coll(op);
  else check_p2p(op);
}

/* ---- callbacks ------------------------------------------------------------------------------ */
void fz_work_cb(ncfsm_work *w, ncfsm_result_t status, void *arg) {
  fz_op *op = arg;
  /* ncfsm first, without g.mu (lock order) */
  ncfsm_work_state_t ws = ncfsm_work_state(w);
  const ncfsm_fingerprint_t *fpp = ncfsm_work_fingerprint(w);
  ncfsm_fingerprint_t fp;
  memset(&fp, 0, sizeof fp);
  if (fpp) fp = *fpp;
  ncfsm_comm *wc = ncfsm_work_comm(w);
  pthread_mutex_lock(&g.mu);
  g.n_cb++;
  op->cb_count++;
  if (op->cb_count > 1)
    fz_violation("the callback of op %d (q%d/r%d %s, step %d) fired %d times", op->id, op->c->q->id,
                 op->rank, ncfsm_opkind_name(op->kind), op->step, op->cb_count);
  if (op->returned && op->rc != NCFSM_OK)
    fz_violation("the callback of op %d fired although its call returned %s", op->id,
                 ncfsm_err_name(op->rc));
  op->cb_status = status;
  if (op->seen && (const void *)w != op->seen)
    fz_violation("the callback of op %d got work %p; its submission queued %p", op->id, (void *)w, op->seen);
  if (!fz_is_final_wstate((int)ws) || (ws == NCFSM_WORK_COMPLETED) != (status == NCFSM_OK))
    fz_violation("the callback of op %d has status %s while its work is in state %s", op->id,
                 ncfsm_err_name(status), wname((int)ws));
  if (!fpp || fp.op != (int32_t)op->kind || fp.dtype != op->dtype || fp.count != op->count)
    fz_violation("the callback of op %d: the work's fingerprint does not describe the call", op->id);
#if FZ_SEQ_AT_LAUNCH
  /* the seq is the instance: the launch order of the comm's collectives (send/recv: per peer and
   * direction), or none for a work never handed to the backend */
  uint64_t want_seq = op->inst >= 0 ? (uint64_t)op->inst : NCFSM_SEQ_NONE;
  if (fp.seq != want_seq && (is_coll(op->kind) || op->inst >= 0 || fp.seq != NCFSM_SEQ_NONE))
    fz_violation("the callback of op %d (q%d/r%d %s, %s): fingerprint seq %llu, but the trace says %s %lld", op->id,
                 op->c->q->id, op->rank, ncfsm_opkind_name(op->kind), wname((int)ws), (unsigned long long)fp.seq,
                 op->inst >= 0 ? "it was launched as number" : "it was never launched",
                 (long long)op->inst);
#endif
  if (!wc) fz_violation("the callback of op %d: ncfsm_work_comm returned NULL", op->id);
  if (status == NCFSM_OK && op->group_id > 0 && op->group_id < g.cap_group_rc) {
    ncfsm_result_t grc = g.group_rc[op->group_id];
    if (grc == FZ_GROUP_OPEN)
      fz_violation("op %d completed with NCFSM_OK while its group %d was still open", op->id, op->group_id);
    if (grc != FZ_GROUP_ENDING && grc != NCFSM_OK)
      fz_violation("op %d completed with NCFSM_OK although its group %d ended with %s", op->id, op->group_id,
                   ncfsm_err_name(grc));
  }
  if (status == NCFSM_OK) fz_check_ok_locked(op);
  pthread_mutex_unlock(&g.mu);
  if (g.o.verbose) fz_log("  (callback of op %d: %s, %s)", op->id, ncfsm_err_name(status), wname((int)ws));
}

/* ---- per step and final checks ---------------------------------------------------------------- */
void fz_check_step(void) {
  pthread_mutex_lock(&g.mu);
  for (int i = 0; i < g.nops; i++) {
    fz_op *op = g.ops[i];
    if (op->returned && op->rc != NCFSM_OK && op->cb_count)
      fz_violation("the callback of op %d fired although its call returned %s", op->id,
                   ncfsm_err_name(op->rc));
    if (op->returned && op->rc != NCFSM_OK && op->seen)
      fz_violation("op %d: its call returned %s but a work was queued for it", op->id,
                   ncfsm_err_name(op->rc));
    if (op->returned && op->rc == NCFSM_OK && !op->seen)
      fz_violation("op %d: its call returned NCFSM_OK but no work was queued (no QUEUED trace record)", op->id);
  }
  for (int i = 0; i < g.ncalls; i++)
    if (g.calls[i].ran > 1)
      fz_violation("loop_call request %d ran %d times", g.calls[i].id, g.calls[i].ran);
  pthread_mutex_unlock(&g.mu);
}

void fz_check_final(void) {
  pthread_mutex_lock(&g.mu);
  for (int i = 0; i < g.nops; i++) {
    fz_op *op = g.ops[i];
    if (op->returned && op->rc == NCFSM_OK && op->has_cb && op->cb_count != 1)
      fz_violation("the callback of op %d (q%d/r%d %s, submitted at step %d, last work state %s) "
                   "fired %d times by the end (every communicator aborted, every loop closed); it "
                   "must fire exactly once",
                   op->id, op->c->q->id, op->rank, ncfsm_opkind_name(op->kind), op->step,
                   wname(op->wstate), op->cb_count);
    if (op->returned && op->rc == NCFSM_OK && !fz_is_final_wstate(op->wstate))
      fz_violation("op %d (q%d/r%d %s, step %d) is still %s after every loop was closed", op->id,
                   op->c->q->id, op->rank, ncfsm_opkind_name(op->kind), op->step, wname(op->wstate));
  }
  for (int i = 0; i < g.ncalls; i++)
    if (g.calls[i].accepted && g.calls[i].ran != 1)
      fz_violation("loop_call request %d (accepted at its call) ran %d times by the end (loops "
                   "closed); it must run exactly once", g.calls[i].id, g.calls[i].ran);
  pthread_mutex_unlock(&g.mu);
}
