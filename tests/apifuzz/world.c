/*
 * The fuzzer's world: loops, cliques of sim communicators, streams, works,
 * and the actions that drive them through the public API. Each action checks
 * what its own call returned; oracle.c checks what the engine did.
 */
#include <event2/event.h>
#include <event2/thread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "apifuzz.h"

/* Slack on top of a blocking call's own bound before it counts as a hang. */
#define HANG_SLACK_MS 5000

static const char *rname(ncfsm_result_t r) {
  if (r == FZ_RELEASE_VOID) return "(void)";
  return ncfsm_err_name(r);
}

static void *xcalloc(size_t n, size_t sz) {
  void *p = calloc(n ? n : 1, sz ? sz : 1);
  if (!p) fz_violation("out of memory in the fuzzer");
  return p;
}

/* ---- helpers ----------------------------------------------------------------------- */
static bool loop_open(const fz_loop *l) { return l->h != NULL; }

static fz_loop *pick_loop(void) {
  fz_loop *c[FZ_MAX_LOOPS];
  int n = 0;
  for (int i = 0; i < FZ_MAX_LOOPS; i++)
    if (loop_open(&g.loops[i])) c[n++] = &g.loops[i];
  return n ? c[fz_below(n)] : NULL;
}

static bool on_loop(const fz_clique *q, const fz_loop *l) { return q->loop == l && q->loop_gen == l->gen; }

static bool clique_live(const fz_clique *q) {
  if (!q->loop || !loop_open(q->loop) || q->loop_gen != q->loop->gen) return false;
  for (int r = 0; r < q->n; r++)
    if (q->c[r]->h) return true;
  return false;
}

/* Live, and some comm is not CLOSED: worth submitting to. */
static bool clique_active(const fz_clique *q) {
  if (!clique_live(q)) return false;
  for (int r = 0; r < q->n; r++)
    if (q->c[r]->h && ncfsm_comm_state(q->c[r]->h) != NCFSM_STATE_CLOSED) return true;
  return false;
}

/* Mostly an active clique; sometimes any live one (ops on closed comms). */
static fz_clique *pick_clique(fz_loop *only) {
  fz_clique *c[FZ_MAX_CLIQUES];
  int n = 0;
  bool active = fz_chance(0.9);
  for (int i = 0; i < g.ncliques; i++)
    if ((active ? clique_active(g.cliques[i]) : clique_live(g.cliques[i])) &&
        (!only || on_loop(g.cliques[i], only)))
      c[n++] = g.cliques[i];
  if (!n && active)
    for (int i = 0; i < g.ncliques; i++)
      if (clique_live(g.cliques[i]) && (!only || on_loop(g.cliques[i], only))) c[n++] = g.cliques[i];
  return n ? c[fz_below(n)] : NULL;
}

static int active_cliques(void) {
  int n = 0;
  for (int i = 0; i < g.ncliques; i++) n += clique_active(g.cliques[i]);
  return n;
}

/* A comm the fuzzer still holds that is CLOSED (release is its only call). */
static fz_comm *closed_comm(void) {
  for (int i = 0; i < g.ncliques; i++) {
    fz_clique *q = g.cliques[i];
    if (!clique_live(q)) continue;
    for (int r = 0; r < q->n; r++)
      if (q->c[r]->h && ncfsm_comm_state(q->c[r]->h) == NCFSM_STATE_CLOSED) return q->c[r];
  }
  return NULL;
}

static fz_comm *pick_comm(void) {
  fz_clique *q = pick_clique(NULL);
  if (!q) return NULL;
  fz_comm *c[FZ_MAX_RANKS];
  int n = 0;
  for (int r = 0; r < q->n; r++)
    if (q->c[r]->h) c[n++] = q->c[r];
  return n ? c[fz_below(n)] : NULL;
}

/* May this thread read a comm's state and expect it to stay put until its
 * next call? Only when nobody else drives the loop. */
static bool quiet(const fz_loop *l) { return !l->thread; }

static ncfsm_call_t call_of(ncfsm_opkind_t k) {
  switch (k) {
    case NCFSM_KIND_ALLREDUCE: return NCFSM_CALL_ALLREDUCE;
    case NCFSM_KIND_BROADCAST: return NCFSM_CALL_BROADCAST;
    case NCFSM_KIND_REDUCE: return NCFSM_CALL_REDUCE;
    case NCFSM_KIND_ALLGATHER: return NCFSM_CALL_ALLGATHER;
    case NCFSM_KIND_REDUCESCATTER: return NCFSM_CALL_REDUCESCATTER;
    case NCFSM_KIND_ALLTOALL: return NCFSM_CALL_ALLTOALL;
    case NCFSM_KIND_GATHER: return NCFSM_CALL_GATHER;
    case NCFSM_KIND_SCATTER: return NCFSM_CALL_SCATTER;
    case NCFSM_KIND_SEND: return NCFSM_CALL_SEND;
    default: return NCFSM_CALL_RECV;
  }
}

static const char *call_fn(ncfsm_call_t c) {
  switch (c) {
    case NCFSM_CALL_FINALIZE: return "ncfsm_comm_finalize";
    case NCFSM_CALL_DESTROY: return "ncfsm_comm_destroy";
    case NCFSM_CALL_ABORT: return "ncfsm_comm_abort";
    case NCFSM_CALL_REVOKE: return "ncfsm_comm_revoke";
    case NCFSM_CALL_RELEASE: return "ncfsm_comm_release";
    case NCFSM_CALL_INIT: return "ncfsm_comm_init";
    default: return ncfsm_call_name(c);
  }
}

static bool rooted(ncfsm_opkind_t k) {
  return k == NCFSM_KIND_BROADCAST || k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_GATHER ||
         k == NCFSM_KIND_SCATTER;
}
static bool reduces(ncfsm_opkind_t k) {
  return k == NCFSM_KIND_ALLREDUCE || k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_REDUCESCATTER;
}
static bool p2p(ncfsm_opkind_t k) { return k == NCFSM_KIND_SEND || k == NCFSM_KIND_RECV; }


/* ---- loops --------------------------------------------------------------------------- */
fz_loop *fz_loop_open(int idx, int embedded) { return fz_loop_open_opts(idx, embedded, NULL); }

fz_loop *fz_loop_open_opts(int idx, int embedded, const ncfsm_loop_opts *given) {
  fz_loop *l = &g.loops[idx];
  int gen = l->gen + 1;
  memset(l, 0, sizeof *l);
  l->id = idx;
  l->gen = gen;
  ncfsm_loop_opts lo;
  ncfsm_loop_opts_init(&lo);
  lo.overlap = NCFSM_OVERLAP_REJECT;
  if (given) {
    lo = *given;
  } else if (!g.o.scenario) {
    lo.coalesce_max = fz_chance(0.2) ? 1 : (unsigned)fz_range(2, 64);
    lo.poll_burst = (unsigned)fz_range(0, 64);
    lo.poll_burst_us = (unsigned)fz_range(0, 200);
    lo.poll_max_us = (unsigned)fz_range(1, 100);
  }
  ncfsm_result_t rc;
  if (embedded) {
    l->base = event_base_new();
    if (!l->base) fz_violation("event_base_new failed");
    rc = ncfsm_loop_new_embedded(l->base, &lo, &l->h);
    l->embedded = true;
  } else {
    rc = ncfsm_loop_new(&lo, &l->h);
  }
  fz_log("loop L%d (gen %d): %s coalesce_max %u poll_burst %u poll_burst_us %u poll_max_us %u -> %s", idx,
         gen, embedded ? "ncfsm_loop_new_embedded" : "ncfsm_loop_new", lo.coalesce_max, lo.poll_burst,
         lo.poll_burst_us, lo.poll_max_us, rname(rc));
  if (rc != NCFSM_OK || !l->h) fz_violation("creating loop L%d returned %s", idx, rname(rc));
  ncfsm_loop_set_trace(l->h, fz_trace, NULL);
  g.n_calls += 2;
  return l;
}

/* ---- cliques ---------------------------------------------------------------------------- */
static void random_sim_opts(ncfsm_sim_opts *so) {
  if (ncfsm_sim_opts_init(so) != NCFSM_OK) fz_violation("ncfsm_sim_opts_init: %s", ncfsm_opts_error());
  so->init_polls = fz_range(0, 3);
  so->launch_polls = fz_range(0, 2);
  so->finalize_polls = fz_range(0, 2);
  so->revoke_polls = fz_range(0, 2);
  so->group_end_inprogress = fz_chance(0.9);
  so->has_revoke = fz_chance(0.8);
  so->shuffle_seed = fz_rand();
  so->fail_init = 0;
  so->async_error_at_op = -1;
  so->never_arrive = 0;
}

static void random_faults(ncfsm_sim_opts *so, char *desc, size_t len, int r) {
  if (fz_chance(0.03)) {
    so->fail_init = fz_range(1, 6);
    snprintf(desc + strlen(desc), len - strlen(desc), " r%d:fail_init=%d", r, so->fail_init);
  }
  if (fz_chance(0.06)) {
    so->async_error_at_op = fz_range(0, 6);
    so->async_error_code = fz_chance(0.7) ? 6 : fz_range(2, 3);
    snprintf(desc + strlen(desc), len - strlen(desc), " r%d:async_error_at_op=%lld", r,
             (long long)so->async_error_at_op);
  }
  if (fz_chance(0.03)) {
    so->never_arrive = 1;
    snprintf(desc + strlen(desc), len - strlen(desc), " r%d:never_arrive", r);
  }
}

static ncfsm_result_t init_comm(fz_comm *c);

fz_clique *fz_clique_new(fz_loop *l, int n, const ncfsm_comm_opts *base, const ncfsm_sim_opts *so,
                         int init_mode) {
  if (g.ncliques >= FZ_MAX_CLIQUES || n < 1 || n > FZ_MAX_RANKS) return NULL;
  fz_clique *q = xcalloc(1, sizeof *q);
  static char descs[FZ_MAX_CLIQUES][160];
  char *desc = descs[g.ncliques];
  desc[0] = '\0';
  pthread_mutex_lock(&g.mu);
  q->id = g.ncliques;
  g.cliques[g.ncliques++] = q;
  pthread_mutex_unlock(&g.mu);
  q->loop = l;
  q->loop_gen = l->gen;
  q->n = n;
  ncfsm_result_t rc = ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &q->uid);
  g.n_calls++;
  if (rc != NCFSM_OK) fz_violation("ncfsm_get_unique_id(SIM) returned %s", rname(rc));

  ncfsm_comm_opts o;
  bool same_device = false;
  if (base) {
    o = *base;
  } else {
    ncfsm_comm_opts_init(&o);
    o.blocking = fz_chance(0.07);
    o.timeout_ms = fz_chance(0.55) ? (uint64_t)(g.o.bounded ? fz_range(5, 40) : fz_range(5, 80)) : 0;
    int pol = fz_below(10);
    o.on_error = pol < 3 ? NCFSM_ON_ERROR_STAY : NCFSM_ON_ERROR_ABORT;
#if FZ_HAVE_POLICY_REVOKE
    if (pol == 9) o.on_error = NCFSM_ON_ERROR_REVOKE;
#endif
    o.timing = fz_chance(0.2);
    o.on_state = fz_chance(0.5) ? fz_state_cb : NULL;
    same_device = fz_chance(0.15);
  }
  o.backend = NCFSM_BACKEND_SIM;
  if (o.on_state) o.on_state = fz_state_cb;
  char name[32];
  snprintf(name, sizeof name, "q%d", q->id);
  o.name = name;
  for (int r = 0; r < n; r++) {
    if (so) q->so[r] = so[r];
    else {
      random_sim_opts(&q->so[r]);
      if (r > 0) { /* one clique models one runtime */
        q->so[r].has_revoke = q->so[0].has_revoke;
        q->so[r].group_end_inprogress = q->so[0].group_end_inprogress;
      }
      if (init_mode != 0) random_faults(&q->so[r], desc, 160, r);
    }
  }
  if (!so && init_mode == 0 && fz_chance(0.1)) { /* init_all: one opts for every rank */
    random_faults(&q->so[0], desc, 160, 0);
    for (int r = 1; r < n; r++) q->so[r] = q->so[0];
  }
  q->faults = desc;
  int devices[FZ_MAX_RANKS];
  for (int r = 0; r < n; r++) {
    devices[r] = same_device ? o.device : r;
    fz_comm *c = xcalloc(1, sizeof *c);
    c->q = q;
    c->rank = r;
    c->device = devices[r];
    c->blocking = o.blocking;
    c->timeout_ms = o.timeout_ms;
    c->policy = o.on_error;
    c->last_state = NCFSM_STATE_NEW;
    c->fp_hash = 0xcbf29ce484222325ull;
    q->c[r] = c;
  }
  static const char *modes[] = {"init_all", "new+init", "new, init later", "new+init in a group",
                                "new, made by a split or shrink"};
  static const char *pols[] = {"abort", "stay", "exit", "revoke"};
  fz_log("clique q%d on L%d: %d rank(s), %s, %s, timeout %llu ms, on_error %s%s, polls i%d/l%d/f%d/r%d%s%s",
         q->id, l->id, n, modes[init_mode], o.blocking ? "blocking" : "nonblocking",
         (unsigned long long)o.timeout_ms, (unsigned)o.on_error < 4 ? pols[o.on_error] : "?",
         same_device ? ", one device" : "", q->so[0].init_polls, q->so[0].launch_polls,
         q->so[0].finalize_polls, q->so[0].revoke_polls, q->so[0].has_revoke ? "" : ", no revoke", desc);

  if (init_mode == 0) {
    ncfsm_comm *hs[FZ_MAX_RANKS] = {0};
    o.sim = &q->so[0];
    fz_initall = q;
    rc = ncfsm_comm_init_all(l->h, n, &o, same_device ? NULL : devices, hs);
    fz_initall = NULL;
    g.n_calls++;
    fz_log("  ncfsm_comm_init_all(L%d, %d) -> %s", l->id, n, rname(rc));
    if (rc != NCFSM_OK) fz_violation("ncfsm_comm_init_all returned %s: %s", rname(rc), ncfsm_loop_last_error(l->h));
    pthread_mutex_lock(&g.mu);
    for (int r = 0; r < n; r++) {
      q->c[r]->h = hs[r];
      q->c[r]->inited = true;
      fz_map_comm(hs[r], q->c[r]);
    }
    pthread_mutex_unlock(&g.mu);
    for (int r = 0; r < n; r++)
      if (!hs[r] || ncfsm_comm_rank(hs[r]) != r || ncfsm_comm_size(hs[r]) != n)
        fz_violation("ncfsm_comm_init_all: comm %d has rank %d and size %d", r,
                     hs[r] ? ncfsm_comm_rank(hs[r]) : -1, hs[r] ? ncfsm_comm_size(hs[r]) : -1);
    return q;
  }
  for (int r = 0; r < n; r++) {
    o.device = devices[r];
    o.sim = &q->so[r];
    ncfsm_comm *h = NULL;
    rc = ncfsm_comm_new(l->h, &o, &h);
    g.n_calls++;
    if (rc != NCFSM_OK || !h) fz_violation("ncfsm_comm_new returned %s", rname(rc));
    pthread_mutex_lock(&g.mu);
    q->c[r]->h = h;
    fz_map_comm(h, q->c[r]);
    pthread_mutex_unlock(&g.mu);
    if (ncfsm_comm_state(h) != NCFSM_STATE_NEW)
      fz_violation("ncfsm_comm_new: the comm is in state %s, not NEW", ncfsm_state_name(ncfsm_comm_state(h)));
  }
  bool grouped = init_mode == 3;
  if (grouped) fz_group_start(l);
  for (int r = 0; r < n; r++)
    if (init_mode != 4 && (init_mode != 2 || fz_chance(0.5))) init_comm(q->c[r]);
  if (grouped) fz_group_end(l);
  return q;
}

static ncfsm_result_t init_comm(fz_comm *c) {
  fz_loop *l = c->q->loop;
  ncfsm_state_t pre = quiet(l) ? ncfsm_comm_state(c->h) : NCFSM_STATE_COUNT;
  ncfsm_result_t rc = ncfsm_comm_init(c->h, c->q->n, c->rank, &c->q->uid);
  g.n_calls++;
  fz_log("  ncfsm_comm_init(q%d/r%d) in %s -> %s", c->q->id, c->rank,
         pre < NCFSM_STATE_COUNT ? ncfsm_state_name(pre) : "?", rname(rc));
  if (rc == NCFSM_OK) c->inited = true;
  if (pre != NCFSM_STATE_COUNT) {
    if (pre == NCFSM_STATE_NEW && rc != NCFSM_OK)
      fz_violation("ncfsm_comm_init on a NEW comm with valid arguments returned %s: %s", rname(rc),
                   ncfsm_comm_last_error(c->h));
    if (pre != NCFSM_STATE_NEW && rc == NCFSM_OK)
      fz_violation("ncfsm_comm_init returned OK in state %s (only NEW may init)", ncfsm_state_name(pre));
  }
  if (rc != NCFSM_OK && l->depth) l->group_call_error = true;
  return rc;
}

static void act_init_later(void) {
  for (int i = 0; i < g.ncliques; i++) {
    fz_clique *q = g.cliques[i];
    if (!clique_live(q)) continue;
    for (int r = 0; r < q->n; r++)
      if (q->c[r]->h && !q->c[r]->inited) {
        init_comm(q->c[r]);
        return;
      }
  }
}

/* ncfsm_comm_init with a bad argument: INVALID_ARGUMENT and the comm stays NEW;
 * on a comm that is not NEW: an error. */
static void act_bad_init(void) {
  fz_comm *c = pick_comm();
  if (!c) return;
  fz_loop *l = c->q->loop;
  ncfsm_state_t pre = quiet(l) ? ncfsm_comm_state(c->h) : NCFSM_STATE_COUNT;
  int how = fz_below(4);
  static const char *what[] = {"nranks 0", "rank == nranks", "rank -1", "NULL id"};
  int n = c->q->n, rank = c->rank;
  const ncfsm_unique_id *id = &c->q->uid;
  if (how == 0) n = 0;
  else if (how == 1) rank = n;
  else if (how == 2) rank = -1;
  else id = NULL;
  ncfsm_result_t rc = ncfsm_comm_init(c->h, n, rank, id);
  g.n_calls++;
  fz_log("ncfsm_comm_init(q%d/r%d, %s) in %s -> %s", c->q->id, c->rank, what[how],
         pre < NCFSM_STATE_COUNT ? ncfsm_state_name(pre) : "?", rname(rc));
  if (rc == NCFSM_OK) fz_violation("ncfsm_comm_init with %s returned OK", what[how]);
  if (l->depth) l->group_call_error = true;
  if (pre == NCFSM_STATE_NEW) {
    if (rc != NCFSM_ERR_INVALID_ARGUMENT)
      fz_violation("ncfsm_comm_init with %s on a NEW comm returned %s, expected NCFSM_ERR_INVALID_ARGUMENT",
                   what[how], rname(rc));
    if (ncfsm_comm_state(c->h) != NCFSM_STATE_NEW)
      fz_violation("a rejected ncfsm_comm_init moved the comm to %s", ncfsm_state_name(ncfsm_comm_state(c->h)));
  }
}

/* ---- ops -------------------------------------------------------------------------------- */
static fz_op *op_new(fz_comm *c) {
  fz_op *op = xcalloc(1, sizeof *op);
  pthread_mutex_lock(&g.mu);
  if (g.nops == g.capops) {
    int cap = g.capops ? 2 * g.capops : 256;
    fz_op **nv = realloc(g.ops, (size_t)cap * sizeof *nv);
    if (!nv) fz_violation("out of memory in the fuzzer");
    g.ops = nv;
    g.capops = cap;
  }
  op->id = g.nops;
  g.ops[g.nops++] = op;
  pthread_mutex_unlock(&g.mu);
  op->c = c;
  op->rank = c->rank;
  op->step = g.step;
  op->wstate = -1;
  op->inst = -1;
  op->stream_id = -1;
  return op;
}

static void mark_group_end(int gid, ncfsm_result_t rc) {
  pthread_mutex_lock(&g.mu);
  if (gid > 0 && gid < g.cap_group_rc) g.group_rc[gid] = rc;
  pthread_mutex_unlock(&g.mu);
}

fz_op *fz_submit(fz_comm *c, const fz_args *a) {
  fz_loop *l = c->q->loop;
  int n = c->q->n;
  fz_op *op = op_new(c);
  op->kind = a->kind;
  op->count = (a->flags & FZ_HUGE) ? (SIZE_MAX / 2 + 1) : a->count; /* bytes > PTRDIFF_MAX for every dtype */
  op->dtype = a->dtype;
  op->redop = a->redop;
  op->root = a->root;
  op->peer = a->peer;
  op->expect_invalid = a->invalid != NULL;
  op->invalid_what = a->invalid;
  op->has_cb = (a->flags & FZ_CB) != 0;
  if (a->st) {
    op->stream = a->st->h;
    op->stream_id = a->st->id;
  } else {
    op->stream = a->raw_stream;
  }
  size_t es = ncfsm_dtype_size((ncfsm_dtype_t)a->dtype);
  if (!es) es = 4;
  size_t cnt = (a->flags & FZ_HUGE) ? 4 : a->count, nn = (size_t)n;
  size_t sn = cnt, rn = cnt; /* elements */
  switch (a->kind) {
    case NCFSM_KIND_ALLGATHER: rn = nn * cnt; break;
    case NCFSM_KIND_REDUCESCATTER: sn = nn * cnt; break;
    case NCFSM_KIND_ALLTOALL: sn = rn = nn * cnt; break;
    case NCFSM_KIND_GATHER: rn = nn * cnt; break;
    case NCFSM_KIND_SCATTER: sn = nn * cnt; break;
    case NCFSM_KIND_SEND: rn = 0; break;
    case NCFSM_KIND_RECV: sn = 0; break;
    default: break;
  }
  bool is_root = a->root == c->rank;
  bool opt_send = (a->kind == NCFSM_KIND_BROADCAST || a->kind == NCFSM_KIND_SCATTER) && !is_root;
  bool opt_recv = (a->kind == NCFSM_KIND_REDUCE || a->kind == NCFSM_KIND_GATHER) && !is_root;
  bool inplace = (a->flags & FZ_INPLACE) &&
                 (a->kind == NCFSM_KIND_ALLREDUCE || a->kind == NCFSM_KIND_BROADCAST);
  op->send_bytes = sn * es;
  op->recv_bytes = rn * es;
  if (inplace) {
    op->recv = xcalloc(1, op->recv_bytes);
    op->send = op->recv;
  } else {
    if (sn && !(a->flags & FZ_NULL_SEND) && !(opt_send && (a->flags & FZ_NULL_OPT)))
      op->send = xcalloc(1, op->send_bytes);
    if (rn && !(a->flags & FZ_NULL_RECV) && !(opt_recv && (a->flags & FZ_NULL_OPT)))
      op->recv = xcalloc(1, op->recv_bytes);
    fz_fill_sentinel(op->recv, op->recv_bytes);
  }
  if (!op->send) op->send_bytes = 0;
  fz_fill_input(op);

  ncfsm_call_t call = call_of(a->kind);
  ncfsm_state_t pre = quiet(l) ? ncfsm_comm_state(c->h) : NCFSM_STATE_COUNT;
  ncfsm_work *w = NULL, **out = (a->flags & FZ_HANDLE) ? &w : NULL;
  ncfsm_work_cb cb = op->has_cb ? fz_work_cb : NULL;
  void *s = op->stream;
  const void *sb = op->send;
  void *rb = op->recv;
  ncfsm_dtype_t dt = (ncfsm_dtype_t)a->dtype;
  ncfsm_redop_t ro = (ncfsm_redop_t)a->redop;
  size_t count = op->count;
  ncfsm_result_t rc;
  fz_submitting = op;
  switch (a->kind) {
    case NCFSM_KIND_ALLREDUCE: rc = ncfsm_allreduce(c->h, sb, rb, count, dt, ro, s, cb, op, out); break;
    case NCFSM_KIND_BROADCAST: rc = ncfsm_broadcast(c->h, sb, rb, count, dt, a->root, s, cb, op, out); break;
    case NCFSM_KIND_REDUCE: rc = ncfsm_reduce(c->h, sb, rb, count, dt, ro, a->root, s, cb, op, out); break;
    case NCFSM_KIND_ALLGATHER: rc = ncfsm_allgather(c->h, sb, rb, count, dt, s, cb, op, out); break;
    case NCFSM_KIND_REDUCESCATTER: rc = ncfsm_reducescatter(c->h, sb, rb, count, dt, ro, s, cb, op, out); break;
    case NCFSM_KIND_ALLTOALL: rc = ncfsm_alltoall(c->h, sb, rb, count, dt, s, cb, op, out); break;
    case NCFSM_KIND_GATHER: rc = ncfsm_gather(c->h, sb, rb, count, dt, a->root, s, cb, op, out); break;
    case NCFSM_KIND_SCATTER: rc = ncfsm_scatter(c->h, sb, rb, count, dt, a->root, s, cb, op, out); break;
    case NCFSM_KIND_SEND: rc = ncfsm_send(c->h, sb, count, dt, a->peer, s, cb, op, out); break;
    default: rc = ncfsm_recv(c->h, rb, count, dt, a->peer, s, cb, op, out); break;
  }
  fz_submitting = NULL;
  g.n_calls++;
  bool in_group = l->depth > 0;

  pthread_mutex_lock(&g.mu);
  op->returned = true;
  op->rc = rc;
  uint64_t want_seq = 0;
  if (rc == NCFSM_OK) {
    op->w = w;
    op->held = w != NULL;
    if (p2p(a->kind)) {
      if (a->peer >= 0 && a->peer < FZ_MAX_RANKS) want_seq = c->p2p_accepted[a->peer]++;
    } else {
      want_seq = c->coll_accepted++;
      if (!FZ_SEQ_AT_LAUNCH) c->fp_hash = fz_fp_hash(c->fp_hash, op);
    }
    if (in_group) {
      op->group_id = l->group_id;
      l->group_ops++;
    }
  } else if (in_group) {
    l->group_op_error = true;
  }
  pthread_mutex_unlock(&g.mu);

  char st[24] = "default";
  if (op->stream_id >= 0) snprintf(st, sizeof st, "S%d", op->stream_id);
  else if (op->stream) snprintf(st, sizeof st, "foreign");
  fz_log("  op %d q%d/r%d %s(count %zu, %s, %s, root %d, peer %d, stream %s%s%s%s%s%s) in %s -> %s", op->id,
         c->q->id, c->rank, ncfsm_opkind_name(a->kind), op->count,
         (unsigned)a->dtype < NCFSM_DTYPE_COUNT ? ncfsm_dtype_name(dt) : "BAD-DTYPE",
         (unsigned)a->redop < NCFSM_REDOP_COUNT ? ncfsm_redop_name(ro) : "BAD-REDOP", a->root, a->peer, st,
         inplace ? ", in place" : "", !op->send && sn ? ", send NULL" : "", !op->recv && rn ? ", recv NULL" : "",
         a->invalid ? ", INVALID: " : "", a->invalid ? a->invalid : "",
         pre < NCFSM_STATE_COUNT ? ncfsm_state_name(pre) : "?", rname(rc));

  if (rc == NCFSM_OK && a->invalid)
    fz_violation("op %d: %s with an invalid argument (%s) returned NCFSM_OK", op->id,
                 ncfsm_opkind_name(a->kind), a->invalid);
  if (rc == NCFSM_OK && pre != NCFSM_STATE_COUNT && ncfsm_legality(pre, call, NULL, NULL) == NCFSM_REJECT)
    fz_violation("op %d: %s returned NCFSM_OK in state %s, where the legality table says REJECT", op->id,
                 ncfsm_opkind_name(a->kind), ncfsm_state_name(pre));
  if (rc != NCFSM_OK && w)
    fz_violation("op %d: the call returned %s but set a work handle", op->id, rname(rc));
  if (rc == NCFSM_OK && out && !w) fz_violation("op %d: the call returned OK without a work handle", op->id);
  if (rc == NCFSM_ERR_INVALID_ARGUMENT && !a->invalid)
    fz_violation("op %d: a valid %s was rejected as an invalid argument: %s", op->id,
                 ncfsm_opkind_name(a->kind), ncfsm_comm_last_error(c->h));
  if (rc != NCFSM_OK && rc != NCFSM_ERR_INVALID_ARGUMENT && rc != NCFSM_ERR_ILLEGAL_STATE &&
      rc != NCFSM_ERR_WRONG_THREAD && rc != NCFSM_ERR_NO_MEMORY)
    fz_violation("op %d: %s returned %s, not a result an op call may return", op->id,
                 ncfsm_opkind_name(a->kind), rname(rc));
  if ((rc == NCFSM_ERR_INVALID_ARGUMENT || rc == NCFSM_ERR_ILLEGAL_STATE) && quiet(l)) {
    const char *e = ncfsm_comm_last_error(c->h);
    char fn[40] = "ncfsm_";
    const char *kn = ncfsm_opkind_name(a->kind);
    for (size_t i = 0; kn && kn[i] && i + 7 < sizeof fn; i++)
      fn[6 + i] = (char)(kn[i] >= 'A' && kn[i] <= 'Z' ? kn[i] - 'A' + 'a' : kn[i]);
    if (!e || !*e || !strstr(e, fn))
      fz_violation("op %d: %s failed with %s but the comm's last error does not name the call: \"%s\"",
                   op->id, fn, rname(rc), e ? e : "(null)");
  }
  if (rc == NCFSM_OK && w) {
    if (!ncfsm_work_fingerprint(w)) fz_violation("op %d: ncfsm_work_fingerprint returned NULL", op->id);
    /* one consistent copy: a loop thread may launch the work (and write its seq) meanwhile */
    ncfsm_fingerprint_t fpc;
    if (ncfsm_work_get_fingerprint(w, &fpc) != NCFSM_OK)
      fz_violation("op %d: ncfsm_work_get_fingerprint failed", op->id);
    const ncfsm_fingerprint_t *fp = &fpc;
    int32_t root = rooted(a->kind) ? a->root : -1, redop = reduces(a->kind) ? a->redop : -1,
            peer = p2p(a->kind) ? a->peer : -1;
#if FZ_SEQ_AT_LAUNCH
    want_seq = NCFSM_SEQ_NONE; /* taken at launch: none yet, unless another thread launched it already */
    if (!quiet(l) && fp->seq != NCFSM_SEQ_NONE) want_seq = fp->seq;
#endif
    if (fp->seq != want_seq || fp->op != (int32_t)a->kind || fp->dtype != a->dtype || fp->count != count ||
        fp->root != root || fp->redop != redop || fp->peer != peer)
      fz_violation("op %d: fingerprint (seq %llu, op %d, dtype %d, count %llu, root %d, redop %d, peer %d) "
                   "does not describe the call (seq %llu, op %d, dtype %d, count %zu, root %d, redop %d, "
                   "peer %d)",
                   op->id, (unsigned long long)fp->seq, fp->op, fp->dtype, (unsigned long long)fp->count,
                   fp->root, fp->redop, fp->peer, (unsigned long long)want_seq, (int)a->kind, a->dtype,
                   count, root, redop, peer);
    if (ncfsm_work_comm(w) != c->h) fz_violation("op %d: ncfsm_work_comm is not the comm", op->id);
  }
  return op;
}

static void random_args(fz_clique *q, fz_args *a) {
  memset(a, 0, sizeof *a);
  a->kind = (ncfsm_opkind_t)fz_below(NCFSM_OPKIND_COUNT);
  a->count = fz_chance(0.05) ? 0 : (size_t)fz_range(1, FZ_COUNT_MAX);
  a->dtype = fz_below(NCFSM_DTYPE_COUNT);
  a->redop = fz_below(NCFSM_REDOP_COUNT);
  a->root = rooted(a->kind) ? fz_below(q->n) : -1;
  a->peer = -1;
  a->flags = 0;
}

static fz_stream *pick_stream(fz_loop *l, int device, bool same_device) {
  fz_stream *c[FZ_MAX_STREAMS];
  int n = 0;
  for (int i = 0; i < g.nstreams; i++) {
    fz_stream *s = &g.streams[i];
    if (!s->destroyed && s->loop == l && s->loop_gen == l->gen && (s->device == device) == same_device)
      c[n++] = s;
  }
  return n ? c[fz_below(n)] : NULL;
}

void fz_template(fz_clique *q, const fz_args *base, bool grouped) {
  fz_loop *l = q->loop;
  int n = q->n;
  /* divergence: one rank out of step */
  int div_rank = -1, div_how = -1;
  static const char *div_names[] = {"skips it", "another count", "another dtype", "another redop/root"};
  if (n > 1 && fz_chance(g.o.p_diverge)) {
    div_rank = fz_below(n);
    div_how = fz_below(4);
  }
  int inv_rank = -1, inv_how = -1;
  if (fz_chance(g.o.p_invalid)) {
    inv_rank = fz_below(n);
    inv_how = fz_below(7);
  }
  int shift = p2p(base->kind) ? fz_below(n) : 0; /* send to r+shift, receive from r-shift */
  fz_log("template on q%d: %s count %zu %s%s%s%s", q->id, p2p(base->kind) ? "sendrecv" : ncfsm_opkind_name(base->kind),
         base->count, ncfsm_dtype_name((ncfsm_dtype_t)base->dtype), grouped ? ", grouped" : "",
         div_rank >= 0 ? ", diverging rank " : "", div_rank >= 0 ? div_names[div_how] : "");
  bool opened = false;
  if (grouped && l->depth == 0) {
    fz_group_start(l);
    opened = true;
  }
  int order[FZ_MAX_RANKS];
  for (int r = 0; r < n; r++) order[r] = r;
  if (fz_chance(0.3))
    for (int r = n - 1; r > 0; r--) {
      int j = fz_below(r + 1), t = order[r];
      order[r] = order[j];
      order[j] = t;
    }
  for (int k = 0; k < n; k++) {
    int r = order[k];
    fz_comm *c = q->c[r];
    if (!c->h) continue;
    if (r == div_rank && div_how == 0) continue;
    fz_args a = *base;
    a.flags = 0;
    if (fz_chance(0.85)) a.flags |= FZ_HANDLE;
    if (fz_chance(0.9)) a.flags |= FZ_CB;
    if (fz_chance(0.2)) a.flags |= FZ_INPLACE;
    if (fz_chance(0.3)) a.flags |= FZ_NULL_OPT;
    if (fz_chance(0.35)) a.st = pick_stream(l, c->device, true);
    if (r == div_rank) {
      if (div_how == 1) a.count++;
      else if (div_how == 2) a.dtype = (a.dtype + 1) % NCFSM_DTYPE_COUNT;
      else if (rooted(a.kind)) a.root = (a.root + 1) % n;
      else a.redop = (a.redop + 1) % NCFSM_REDOP_COUNT;
    }
    int ops = p2p(base->kind) ? 2 : 1;
    int first = fz_below(2);
    for (int j = 0; j < ops; j++) {
      fz_args b = a;
      if (p2p(base->kind)) {
        b.kind = (j ^ first) ? NCFSM_KIND_RECV : NCFSM_KIND_SEND;
        b.peer = b.kind == NCFSM_KIND_SEND ? (r + shift) % n : (r - shift + n) % n;
        b.root = -1;
      }
      if (r == inv_rank && j == 0) {
        switch (inv_how) {
          case 0: b.dtype = fz_chance(0.5) ? -1 : fz_range(NCFSM_DTYPE_COUNT, 200); b.invalid = "bad dtype"; break;
          case 1:
            if (reduces(b.kind)) { b.redop = fz_chance(0.5) ? -1 : fz_range(NCFSM_REDOP_COUNT, 50); b.invalid = "bad redop"; }
            else { b.dtype = 99; b.invalid = "bad dtype"; }
            break;
          case 2:
            if (rooted(b.kind)) { b.root = fz_chance(0.5) ? -1 : n + fz_below(3); b.invalid = "bad root"; }
            else if (p2p(b.kind)) { b.peer = fz_chance(0.5) ? -1 : n + fz_below(3); b.invalid = "bad peer"; }
            else { b.dtype = -7; b.invalid = "bad dtype"; }
            break;
          case 3:
            if (b.count == 0) b.count = 1;
            if (b.kind == NCFSM_KIND_RECV || ((b.kind == NCFSM_KIND_REDUCE || b.kind == NCFSM_KIND_GATHER) && b.root == r)) {
              b.flags |= FZ_NULL_RECV; b.invalid = "NULL recv buffer";
            } else if (b.kind == NCFSM_KIND_SEND || b.kind == NCFSM_KIND_REDUCE || b.kind == NCFSM_KIND_GATHER ||
                       ((b.kind == NCFSM_KIND_BROADCAST || b.kind == NCFSM_KIND_SCATTER) && b.root == r)) {
              b.flags |= FZ_NULL_SEND; b.invalid = "NULL send buffer";
            } else {
              b.flags |= FZ_NULL_RECV; b.invalid = "NULL recv buffer";
            }
            b.flags &= ~(unsigned)FZ_INPLACE;
            break;
          case 4: {
            fz_stream *s = pick_stream(l, c->device, false);
            if (s) { b.st = s; b.invalid = "stream of another device"; }
            else { b.dtype = NCFSM_DTYPE_COUNT; b.invalid = "bad dtype"; }
            break;
          }
          case 5: b.flags |= FZ_HUGE; b.invalid = "count overflows the address space"; break;
          default: b.dtype = NCFSM_DTYPE_COUNT + 1; b.invalid = "bad dtype"; break;
        }
      }
      fz_op *op = fz_submit(c, &b);
      if (op->rc == NCFSM_OK && op->held && fz_chance(0.08)) { /* early release */
        fz_release(op);
        if (fz_chance(g.o.p_double_release)) fz_release(op);
      }
    }
  }
  if (opened) fz_group_end(l);
}

static void act_template(void) {
  fz_clique *q = pick_clique(NULL);
  if (!q) return;
  fz_args a;
  random_args(q, &a);
  fz_template(q, &a, fz_chance(0.4));
}

/* ---- groups -------------------------------------------------------------------------------- */
ncfsm_result_t fz_group_start(fz_loop *l) {
  ncfsm_result_t rc = ncfsm_group_start(l->h);
  g.n_calls++;
  fz_log("  ncfsm_group_start(L%d) depth %d -> %s", l->id, l->depth, rname(rc));
  if (rc != NCFSM_OK) fz_violation("ncfsm_group_start on the owning thread returned %s", rname(rc));
  pthread_mutex_lock(&g.mu);
  if (l->depth++ == 0) {
    l->group_id = ++g.next_group_id;
    if (l->group_id >= g.cap_group_rc) {
      int cap = g.cap_group_rc ? 2 * g.cap_group_rc : 64;
      ncfsm_result_t *nv = realloc(g.group_rc, (size_t)cap * sizeof *nv);
      if (!nv) fz_violation("out of memory in the fuzzer");
      g.group_rc = nv;
      g.cap_group_rc = cap;
    }
    g.group_rc[l->group_id] = FZ_GROUP_OPEN;
    l->group_op_error = l->group_mixed = l->group_call_error = false;
    l->group_ops = 0;
  }
  pthread_mutex_unlock(&g.mu);
  if (ncfsm_group_depth(l->h) != l->depth)
    fz_violation("ncfsm_group_depth is %d after %d starts", ncfsm_group_depth(l->h), l->depth);
  return rc;
}

/* Do the group's works that are still waiting in it (not failed or aborted
 * since: an abort drops a comm's works from the open group) mix blocking
 * and nonblocking comms? */
static bool group_mixes(int gid) {
  int mode = -1;
  bool mixed = false;
  pthread_mutex_lock(&g.mu);
  for (int i = 0; i < g.nops && !mixed; i++) {
    fz_op *op = g.ops[i];
    if (op->group_id != gid || op->wstate != NCFSM_WORK_QUEUED) continue;
    if (mode < 0) mode = op->c->blocking;
    else if (mode != op->c->blocking) mixed = true;
  }
  pthread_mutex_unlock(&g.mu);
  return mixed;
}

ncfsm_result_t fz_group_end(fz_loop *l) {
  int d = l->depth;
  if (d == 1) {
    mark_group_end(l->group_id, FZ_GROUP_ENDING);
    l->group_mixed = quiet(l) && group_mixes(l->group_id);
  }
  ncfsm_result_t rc = ncfsm_group_end(l->h);
  g.n_calls++;
  fz_log("  ncfsm_group_end(L%d) depth %d%s%s -> %s", l->id, d,
         d == 1 && l->group_op_error ? " (an op in it failed)" : "",
         d == 1 && l->group_mixed ? " (mixes blocking modes)" : "", rname(rc));
  if (d == 0) {
    if (rc != NCFSM_ERR_INVALID_USAGE)
      fz_violation("ncfsm_group_end outside a group returned %s, expected NCFSM_ERR_INVALID_USAGE (R3)", rname(rc));
    return rc;
  }
  if (d > 1) {
    if (rc != NCFSM_OK) fz_violation("an inner ncfsm_group_end returned %s", rname(rc));
    l->depth--;
    return rc;
  }
  int gid = l->group_id;
  l->depth = 0;
  l->group_id = 0;
  mark_group_end(gid, rc);
  if ((l->group_op_error || l->group_mixed) && rc == NCFSM_OK)
    fz_violation("the outermost ncfsm_group_end of group %d returned OK although %s (R3)", gid,
                 l->group_op_error ? "an op call in the group failed" : "the group mixes blocking and nonblocking comms");
  if (!l->group_op_error && !l->group_mixed && !l->group_call_error && quiet(l) && rc != NCFSM_OK &&
      rc != NCFSM_ERR_NO_MEMORY)
    fz_violation("the outermost ncfsm_group_end of group %d returned %s although no call in it failed: %s", gid,
                 rname(rc), ncfsm_loop_last_error(l->h));
  if (rc != NCFSM_OK) { /* every work of the group fails */
    pthread_mutex_lock(&g.mu);
    for (int i = 0; i < g.nops; i++)
      if (g.ops[i]->group_id == gid && g.ops[i]->cb_count && g.ops[i]->cb_status == NCFSM_OK)
        fz_violation("op %d of failed group %d completed with NCFSM_OK", g.ops[i]->id, gid);
    pthread_mutex_unlock(&g.mu);
  }
  if (ncfsm_group_depth(l->h) != 0) fz_violation("ncfsm_group_depth is %d after the outermost end", ncfsm_group_depth(l->h));
  return rc;
}

static void act_group_start(void) {
  fz_loop *l = pick_loop();
  if (l && l->depth < 3) fz_group_start(l);
}
static void act_group_end(bool unbalanced) {
  fz_loop *l = pick_loop();
  if (!l) return;
  if (l->depth > 0 || unbalanced) fz_group_end(l);
}

/* ---- works ---------------------------------------------------------------------------------- */
static fz_op *pick_held(fz_loop *only) {
  int idx[64], n = 0;
  pthread_mutex_lock(&g.mu);
  for (int i = g.nops - 1; i >= 0 && n < 64; i--)
    if (g.ops[i]->held && (!only || g.ops[i]->c->q->loop == only)) idx[n++] = i;
  fz_op *op = n ? g.ops[idx[fz_below(n)]] : NULL;
  pthread_mutex_unlock(&g.mu);
  return op;
}

ncfsm_result_t fz_release(fz_op *op) {
  bool second = !op->held && op->releases > 0;
  if (!op->held && !second) return NCFSM_OK;
  ncfsm_result_t rc = fz_work_release(op->w);
  g.n_calls++;
  op->releases++;
  op->held = false;
  fz_log("  ncfsm_work_release(op %d)%s -> %s", op->id, second ? " again (a second release of the handle)" : "",
         rname(rc));
  if (!second && rc != NCFSM_OK && rc != FZ_RELEASE_VOID)
    fz_violation("the first ncfsm_work_release of op %d returned %s", op->id, rname(rc));
  if (second && rc == NCFSM_OK)
    fz_violation("a second ncfsm_work_release of op %d's handle returned NCFSM_OK: it must be detected "
                 "(NCFSM_ERR_INVALID_USAGE)", op->id);
  if (second && rc != FZ_RELEASE_VOID && rc != NCFSM_ERR_INVALID_USAGE)
    fz_violation("a second ncfsm_work_release of op %d returned %s, expected NCFSM_ERR_INVALID_USAGE", op->id, rname(rc));
  return rc;
}

ncfsm_result_t fz_wait_work(fz_op *op, uint64_t ms) {
  fz_loop *l = op->c->q->loop;
  char what[96];
  snprintf(what, sizeof what, "ncfsm_work_wait(op %d, %llu ms)", op->id, (unsigned long long)ms);
  fz_deadline(ms + HANG_SLACK_MS, what);
  uint64_t t0 = fz_now_ns();
  ncfsm_result_t r = ncfsm_work_wait(op->w, ms);
  uint64_t el = (fz_now_ns() - t0) / 1000000;
  fz_deadline(0, NULL);
  g.n_calls++;
  ncfsm_result_t st = ncfsm_work_status(op->w);
  ncfsm_work_state_t ws = ncfsm_work_state(op->w);
  fz_log("ncfsm_work_wait(op %d, %llu ms) -> %s after %llu ms (status %s, state %s)", op->id,
         (unsigned long long)ms, rname(r), (unsigned long long)el, rname(st),
         (unsigned)ws < NCFSM_WORK_STATE_COUNT ? ncfsm_work_state_name(ws) : "?");
  bool final = st != NCFSM_ERR_AGAIN;
  if (final && r == st) {
    pthread_mutex_lock(&g.mu);
    int cbn = op->cb_count;
    ncfsm_result_t cbs = op->cb_status;
    pthread_mutex_unlock(&g.mu);
    if (op->has_cb && (cbn != 1 || cbs != r))
      fz_violation("ncfsm_work_wait(op %d) returned the final status %s but its callback fired %d time(s)%s%s",
                   op->id, rname(r), cbn, cbn ? " with " : "", cbn ? rname(cbs) : "");
    if (!fz_is_final_wstate((int)ws) || (ws == NCFSM_WORK_COMPLETED) != (r == NCFSM_OK))
      fz_violation("ncfsm_work_wait(op %d) returned %s while the work is %s", op->id, rname(r),
                   ncfsm_work_state_name(ws));
    if (r == NCFSM_OK) {
      pthread_mutex_lock(&g.mu);
      fz_check_ok_locked(op);
      pthread_mutex_unlock(&g.mu);
    }
  } else if (FZ_WAIT_TIMED_OUT(r) && !final) {
    if (el + 1 < ms) fz_violation("ncfsm_work_wait(op %d, %llu ms) gave up after %llu ms", op->id,
                                  (unsigned long long)ms, (unsigned long long)el);
  } else if (r == NCFSM_ERR_ILLEGAL_STATE && !final) {
    /* nothing pending can move it (an open group): fine */
  } else if (final && quiet(l)) {
    fz_violation("ncfsm_work_wait(op %d) returned %s but the work's status is %s", op->id, rname(r), rname(st));
  } else if (!final && !FZ_WAIT_TIMED_OUT(r) && r != NCFSM_ERR_ILLEGAL_STATE) {
    fz_violation("ncfsm_work_wait(op %d) returned %s although the work is not final", op->id, rname(r));
  }
  if (el > ms + 2000)
    fz_violation("ncfsm_work_wait(op %d, %llu ms) took %llu ms", op->id, (unsigned long long)ms, (unsigned long long)el);
  return r;
}

static void check_times(fz_op *op) {
  ncfsm_work_times t;
  ncfsm_result_t rc = ncfsm_work_get_times(op->w, &t);
  g.n_calls++;
  if (rc != NCFSM_OK) fz_violation("ncfsm_work_get_times(op %d) returned %s", op->id, rname(rc));
  ncfsm_work_state_t ws = ncfsm_work_state(op->w);
  if (!quiet(op->c->q->loop)) return;
  if (!t.submit_ns || (t.launch_ns && t.launch_ns < t.submit_ns) || (t.final_ns && t.final_ns < t.launch_ns) ||
      (t.complete_ns && t.complete_ns < t.final_ns) || (ws == NCFSM_WORK_COMPLETED && !t.complete_ns) ||
      (ws != NCFSM_WORK_COMPLETED && t.complete_ns))
    fz_violation("ncfsm_work_get_times(op %d, %s): submit %llu launch %llu final %llu complete %llu are not in order",
                 op->id, ncfsm_work_state_name(ws), (unsigned long long)t.submit_ns,
                 (unsigned long long)t.launch_ns, (unsigned long long)t.final_ns, (unsigned long long)t.complete_ns);
  if (t.ready_at_final < -1 || t.ready_at_final > 1)
    fz_violation("ncfsm_work_get_times(op %d): ready_at_final %d", op->id, t.ready_at_final);
}

static void act_work(void) {
  fz_op *op = pick_held(NULL);
  if (!op) return;
  fz_loop *l = op->c->q->loop;
  switch (fz_below(7)) {
    case 0:
    case 1:
      fz_wait_work(op, (uint64_t)fz_range(1, g.o.bounded ? 20 : 50));
      break;
    case 2: {
      ncfsm_result_t st = ncfsm_work_status(op->w);
      ncfsm_work_state_t ws = ncfsm_work_state(op->w);
      int launched = ncfsm_work_launched(op->w);
      g.n_calls += 3;
      fz_log("ncfsm_work_status/state/launched(op %d) -> %s, %s, %d", op->id, rname(st),
             (unsigned)ws < NCFSM_WORK_STATE_COUNT ? ncfsm_work_state_name(ws) : "?", launched);
      if (!quiet(l)) break;
      pthread_mutex_lock(&g.mu);
      int traced = op->wstate, cbn = op->cb_count;
      ncfsm_result_t cbs = op->cb_status;
      pthread_mutex_unlock(&g.mu);
      if ((int)ws != traced)
        fz_violation("ncfsm_work_state(op %d) is %s but the trace last said %s", op->id,
                     (unsigned)ws < NCFSM_WORK_STATE_COUNT ? ncfsm_work_state_name(ws) : "?",
                     traced >= 0 ? ncfsm_work_state_name((ncfsm_work_state_t)traced) : "(none)");
      /* launched: reached IN_FLIGHT at some point (a failed work may or may not have) */
      bool must = ws == NCFSM_WORK_IN_FLIGHT || ws == NCFSM_WORK_COMPLETED;
      bool never = ws == NCFSM_WORK_QUEUED || ws == NCFSM_WORK_LAUNCHING || ws == NCFSM_WORK_VERIFYING;
      if ((must && !launched) || (never && launched))
        fz_violation("ncfsm_work_launched(op %d) is %d in state %s", op->id, launched, ncfsm_work_state_name(ws));
      /* the status follows the state: final before its callback is delivered (at
       * the next flush), never different from what the callback got */
      if (st != NCFSM_ERR_AGAIN && op->has_cb && (cbn > 1 || (cbn == 1 && cbs != st)))
        fz_violation("ncfsm_work_status(op %d) is %s but its callback fired %d time(s)%s%s", op->id, rname(st), cbn,
                     cbn == 1 ? " with " : "", cbn == 1 ? rname(cbs) : "");
      if ((st != NCFSM_ERR_AGAIN) != fz_is_final_wstate((int)ws))
        fz_violation("ncfsm_work_status(op %d) is %s in state %s", op->id, rname(st), ncfsm_work_state_name(ws));
      if (st == NCFSM_ERR_AGAIN && op->has_cb && cbn)
        fz_violation("ncfsm_work_status(op %d) is NCFSM_ERR_AGAIN after its callback fired with %s", op->id, rname(cbs));
      break;
    }
    case 3:
      check_times(op);
      fz_log("ncfsm_work_get_times(op %d)", op->id);
      break;
    case 4:
      if (ncfsm_work_set_timeout) { /* a per-work deadline */
        uint64_t ms = fz_chance(0.2) ? 0 : (uint64_t)fz_range(1, g.o.bounded ? 30 : 60);
        ncfsm_work_state_t ws = ncfsm_work_state(op->w);
        ncfsm_result_t rc = ncfsm_work_set_timeout(op->w, ms);
        g.n_calls += 2;
        fz_log("ncfsm_work_set_timeout(op %d, %llu ms) in %s -> %s", op->id, (unsigned long long)ms,
               (unsigned)ws < NCFSM_WORK_STATE_COUNT ? ncfsm_work_state_name(ws) : "?", rname(rc));
        if (quiet(l) && fz_is_final_wstate((int)ws) && rc == NCFSM_OK)
          fz_violation("ncfsm_work_set_timeout(op %d) returned OK on a final work (%s)", op->id,
                       ncfsm_work_state_name(ws));
        if (quiet(l) && !fz_is_final_wstate((int)ws) && rc != NCFSM_OK)
          fz_violation("ncfsm_work_set_timeout(op %d) on a work in %s returned %s", op->id,
                       ncfsm_work_state_name(ws), rname(rc));
        break;
      }
      /* fall through */
    default:
      fz_release(op);
      if (fz_chance(g.o.p_double_release * 5)) fz_release(op); /* right away: the memory is not reused yet */
      break;
  }
}

/* ---- communicator lifecycle ------------------------------------------------------------------ */
static void destroy_streams_of(fz_loop *l, fz_comm *via);

ncfsm_result_t fz_lifecycle(fz_comm *c, ncfsm_call_t call) {
  fz_loop *l = c->q->loop;
  if (!c->h) return NCFSM_ERR_INVALID_ARGUMENT;
  if (call == NCFSM_CALL_RELEASE) { /* streams need a live comm handle of their loop to be destroyed */
    int live = 0;
    for (int i = 0; i < g.ncliques; i++)
      if (on_loop(g.cliques[i], l))
        for (int r = 0; r < g.cliques[i]->n; r++) live += g.cliques[i]->c[r]->h != NULL;
    ncfsm_state_t s = ncfsm_comm_state(c->h);
    if (live == 1 && (s == NCFSM_STATE_NEW || s == NCFSM_STATE_CLOSED)) {
      destroy_streams_of(l, c);
      for (int i = 0; i < g.nstreams; i++)
        if (g.streams[i].loop == l && g.streams[i].loop_gen == l->gen && !g.streams[i].destroyed)
          fz_violation("stream S%d cannot be destroyed (NCFSM_ERR_BUSY) although every comm of its loop is "
                       "closed or new", g.streams[i].id);
    }
  }
  ncfsm_state_t pre = quiet(l) ? ncfsm_comm_state(c->h) : NCFSM_STATE_COUNT;
  char what[96];
  snprintf(what, sizeof what, "%s(q%d/r%d)", call_fn(call), c->q->id, c->rank);
  fz_deadline(HANG_SLACK_MS, what);
  ncfsm_result_t rc;
  switch (call) {
    case NCFSM_CALL_FINALIZE: rc = ncfsm_comm_finalize(c->h); break;
    case NCFSM_CALL_DESTROY: rc = ncfsm_comm_destroy(c->h); break;
    case NCFSM_CALL_ABORT: rc = ncfsm_comm_abort(c->h); break;
    case NCFSM_CALL_REVOKE: rc = ncfsm_comm_revoke(c->h); break;
    default: rc = ncfsm_comm_release(c->h); break;
  }
  fz_deadline(0, NULL);
  g.n_calls++;
  ncfsm_state_t post = rc == NCFSM_OK && call == NCFSM_CALL_RELEASE ? NCFSM_STATE_COUNT
                       : quiet(l)                                    ? ncfsm_comm_state(c->h)
                                                                     : NCFSM_STATE_COUNT;
  fz_log("%s in %s -> %s (now %s)", what, pre < NCFSM_STATE_COUNT ? ncfsm_state_name(pre) : "?", rname(rc),
         post < NCFSM_STATE_COUNT ? ncfsm_state_name(post) : "-");
  if (rc == NCFSM_OK && pre != NCFSM_STATE_COUNT && ncfsm_legality(pre, call, NULL, NULL) == NCFSM_REJECT)
    fz_violation("%s returned OK in state %s, where the legality table says REJECT", what, ncfsm_state_name(pre));
  if (rc == NCFSM_OK && (call == NCFSM_CALL_DESTROY || call == NCFSM_CALL_ABORT) && post != NCFSM_STATE_COUNT &&
      post != NCFSM_STATE_CLOSED)
    fz_violation("%s returned OK but the comm is in %s, not CLOSED", what, ncfsm_state_name(post));
  if (rc == NCFSM_ERR_ILLEGAL_STATE && quiet(l)) {
    const char *e = ncfsm_comm_last_error(c->h);
    if (!e || !*e) fz_violation("%s failed with %s and an empty last error", what, rname(rc));
  }
  if (rc != NCFSM_OK && l->depth) l->group_call_error = true;
  if (call == NCFSM_CALL_RELEASE && rc == NCFSM_OK) c->h = NULL;
  return rc;
}

/* Has c a work that is not final? */
static bool comm_busy(const fz_comm *c) {
  bool busy = false;
  pthread_mutex_lock(&g.mu);
  for (int i = 0; i < g.nops && !busy; i++)
    busy = g.ops[i]->c == c && g.ops[i]->returned && g.ops[i]->rc == NCFSM_OK && !fz_is_final_wstate(g.ops[i]->wstate);
  pthread_mutex_unlock(&g.mu);
  return busy;
}

static bool avoided(fz_comm *c, ncfsm_call_t call) {
  unsigned bit = call == NCFSM_CALL_DESTROY ? FZ_AVOID_DESTROY_INFLIGHT
                 : call == NCFSM_CALL_REVOKE ? FZ_AVOID_REVOKE_INFLIGHT
                                              : 0;
  if (!(g.o.avoid & bit) || !comm_busy(c)) return false;
  fz_log("(%s(q%d/r%d) skipped: --avoid, the comm has unfinished works)", call_fn(call), c->q->id, c->rank);
  return true;
}

static void act_reap(void) {
  fz_comm *c = closed_comm();
  if (c) fz_lifecycle(c, NCFSM_CALL_RELEASE);
}

static void act_lifecycle(void) {
  fz_comm *c = pick_comm();
  if (!c) return;
  static const ncfsm_call_t calls[] = {NCFSM_CALL_FINALIZE, NCFSM_CALL_FINALIZE, NCFSM_CALL_DESTROY,
                                       NCFSM_CALL_DESTROY,  NCFSM_CALL_ABORT,    NCFSM_CALL_REVOKE,
                                       NCFSM_CALL_REVOKE,   NCFSM_CALL_RELEASE};
  ncfsm_call_t call = calls[fz_below((int)(sizeof calls / sizeof calls[0]))];
  if (!avoided(c, call)) fz_lifecycle(c, call);
}

/* The whole clique goes the orderly way: finalize, wait, destroy. */
static void act_orderly_close(void) {
  fz_clique *q = pick_clique(NULL);
  if (!q) return;
  fz_log("orderly close of q%d", q->id);
  for (int r = 0; r < q->n; r++)
    if (q->c[r]->h) fz_lifecycle(q->c[r], NCFSM_CALL_FINALIZE);
  for (int r = 0; r < q->n; r++)
    if (q->c[r]->h) fz_wait_state(q->c[r], NCFSM_STATE_FINALIZED, (uint64_t)fz_range(5, 30));
  for (int r = 0; r < q->n; r++) {
    ncfsm_call_t call = fz_chance(0.8) ? NCFSM_CALL_DESTROY : NCFSM_CALL_ABORT;
    if (q->c[r]->h && !avoided(q->c[r], call)) fz_lifecycle(q->c[r], call);
  }
}

ncfsm_result_t fz_wait_state(fz_comm *c, ncfsm_state_t s, uint64_t ms) {
  fz_loop *l = c->q->loop;
  char what[96];
  snprintf(what, sizeof what, "ncfsm_comm_wait_state(q%d/r%d, %s, %llu ms)", c->q->id, c->rank,
           ncfsm_state_name(s), (unsigned long long)ms);
  fz_deadline(ms + HANG_SLACK_MS, what);
  uint64_t t0 = fz_now_ns();
  ncfsm_result_t r = ncfsm_comm_wait_state(c->h, s, ms);
  uint64_t el = (fz_now_ns() - t0) / 1000000;
  fz_deadline(0, NULL);
  g.n_calls++;
  ncfsm_state_t now = ncfsm_comm_state(c->h);
  fz_log("%s -> %s after %llu ms (now %s)", what, rname(r), (unsigned long long)el, ncfsm_state_name(now));
  if (r == NCFSM_OK && quiet(l) && now != s)
    fz_violation("%s returned OK but the comm is in %s", what, ncfsm_state_name(now));
  if (r != NCFSM_OK && r != NCFSM_ERR_ILLEGAL_STATE && !FZ_WAIT_TIMED_OUT(r))
    fz_violation("%s returned %s", what, rname(r));
  if (FZ_WAIT_TIMED_OUT(r) && el + 1 < ms) fz_violation("%s gave up after %llu ms", what, (unsigned long long)el);
  if (el > ms + 2000) fz_violation("%s took %llu ms", what, (unsigned long long)el);
  return r;
}

static void act_wait_state(void) {
  fz_comm *c = pick_comm();
  if (!c) return;
  static const ncfsm_state_t targets[] = {NCFSM_STATE_READY, NCFSM_STATE_READY, NCFSM_STATE_READY,
                                          NCFSM_STATE_FINALIZED, NCFSM_STATE_REVOKED, NCFSM_STATE_CLOSED,
                                          NCFSM_STATE_ERROR};
  fz_wait_state(c, targets[fz_below((int)(sizeof targets / sizeof targets[0]))],
                (uint64_t)fz_range(1, g.o.bounded ? 25 : 60));
}

/* ---- running loops ------------------------------------------------------------------------------ */
ncfsm_result_t fz_run(fz_loop *l, ncfsm_run_mode_t mode) {
  static const char *mn[] = {"DEFAULT", "ONCE", "NOWAIT"};
  char what[64];
  snprintf(what, sizeof what, "ncfsm_loop_run(L%d, %s)", l->id, mn[mode]);
  fz_deadline(HANG_SLACK_MS, what);
  ncfsm_result_t rc = ncfsm_loop_run(l->h, mode);
  fz_deadline(0, NULL);
  g.n_calls++;
  fz_log("%s -> %s", what, rname(rc));
  if (l->thread && rc != NCFSM_ERR_WRONG_THREAD)
    fz_violation("%s while a loop thread runs it returned %s, expected NCFSM_ERR_WRONG_THREAD", what, rname(rc));
  if (!l->thread && rc != NCFSM_OK) fz_violation("%s returned %s: %s", what, rname(rc), ncfsm_loop_last_error(l->h));
  return rc;
}

struct runner {
  fz_loop *l;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  ncfsm_result_t rc;
};

static void *runner_main(void *arg) {
  struct runner *r = arg;
  ncfsm_result_t rc = ncfsm_loop_run(r->l->h, NCFSM_RUN_DEFAULT);
  pthread_mutex_lock(&r->mu);
  r->rc = rc;
  r->done = true;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

static bool runner_wait(struct runner *r, uint64_t ms) {
  uint64_t end = fz_now_ns() + ms * 1000000ull;
  pthread_mutex_lock(&r->mu);
  while (!r->done) {
    uint64_t now = fz_now_ns();
    if (now >= end) break;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t add = end - now;
    if (add > 10000000) add = 10000000;
    ts.tv_nsec += (long)add;
    while (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
  }
  bool d = r->done;
  pthread_mutex_unlock(&r->mu);
  return d;
}

/* For a hang report: the states of the loop's comms (released ones from the
 * trace) and their works that are not final, by state. */
static void describe_loop(fz_loop *l, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "group depth %d; comms:", l->depth);
  for (int i = 0; i < g.ncliques && n < len; i++) {
    fz_clique *q = g.cliques[i];
    if (!on_loop(q, l)) continue;
    for (int r = 0; r < q->n && n < len; r++) {
      fz_comm *c = q->c[r];
      int st = c->h ? (int)ncfsm_comm_state(c->h) : c->last_state;
      int cnt[NCFSM_WORK_STATE_COUNT] = {0}, first = -1;
      pthread_mutex_lock(&g.mu);
      for (int k = 0; k < g.nops; k++)
        if (g.ops[k]->c == c && g.ops[k]->wstate >= 0 && g.ops[k]->wstate < NCFSM_WORK_STATE_COUNT &&
            !fz_is_final_wstate(g.ops[k]->wstate)) {
          cnt[g.ops[k]->wstate]++;
          if (first < 0) first = g.ops[k]->id;
        }
      pthread_mutex_unlock(&g.mu);
      if (!c->h && st == NCFSM_STATE_CLOSED && !cnt[0] && !cnt[1] && !cnt[2]) continue;
      n += (size_t)snprintf(buf + n, len - n, " q%d/r%d%s %s (%llu collectives launched)", q->id, r,
                            c->h ? "" : " (released)",
                            st >= 0 && st < NCFSM_STATE_COUNT ? ncfsm_state_name((ncfsm_state_t)st) : "?",
                            (unsigned long long)c->coll_launched);
      for (int w = 0; w < NCFSM_WORK_STATE_COUNT && n < len; w++)
        if (cnt[w]) n += (size_t)snprintf(buf + n, len - n, " %d %s", cnt[w], ncfsm_work_state_name((ncfsm_work_state_t)w));
      if (first >= 0 && n < len) n += (size_t)snprintf(buf + n, len - n, " (first: op %d)", first);
      if (n < len) n += (size_t)snprintf(buf + n, len - n, ";");
    }
  }
}

/* ncfsm_loop_run(DEFAULT) runs until nothing is pending: on a helper thread,
 * with a deadline. When every pending thing has a watchdog, it must end by
 * itself; otherwise the comms of the loop are aborted from this thread after
 * a while (which the engine hands to the running thread), and then it must end. */
ncfsm_result_t fz_run_default(fz_loop *l) {
  if (l->thread) return fz_run(l, NCFSM_RUN_DEFAULT);
  uint64_t max_to = 0;
  bool all_watched = true;
  for (int i = 0; i < g.ncliques; i++) {
    fz_clique *q = g.cliques[i];
    if (!on_loop(q, l)) continue;
    for (int r = 0; r < q->n; r++) {
      fz_comm *c = q->c[r];
      if (!c->h || ncfsm_comm_state(c->h) == NCFSM_STATE_NEW) continue;
      if (!c->timeout_ms) all_watched = false;
      if (c->timeout_ms > max_to) max_to = c->timeout_ms;
    }
  }
  /* With a watchdog on every live comm, everything pending ends within a few
   * deadlines (a phase, then the works launched after it). */
  uint64_t bound = all_watched ? 4 * max_to + 1000 : (g.o.bounded ? 60 : 200);
  struct runner r = {.l = l, .done = false};
  pthread_mutex_init(&r.mu, NULL);
  pthread_cond_init(&r.cv, NULL);
  pthread_t th;
  uint64_t t0 = fz_now_ns();
  pthread_create(&th, NULL, runner_main, &r);
  bool done = runner_wait(&r, bound);
  if (!done && all_watched) {
    char what[800] = "";
    describe_loop(l, what, sizeof what);
    fz_violation("hang: ncfsm_loop_run(L%d, DEFAULT) still runs after %llu ms although every live comm of the "
                 "loop has a watchdog of at most %llu ms; %s", l->id, (unsigned long long)bound,
                 (unsigned long long)max_to, what);
  }
  if (!done) {
    fz_log("ncfsm_loop_run(L%d, DEFAULT) on a helper thread: running after %llu ms; aborting the loop's "
           "comms from this thread", l->id, (unsigned long long)bound);
    for (int i = 0; i < g.ncliques; i++) {
      fz_clique *q = g.cliques[i];
      if (!on_loop(q, l)) continue;
      for (int k = 0; k < q->n; k++) {
        fz_comm *c = q->c[k];
        if (!c->h) continue;
        ncfsm_state_t s = ncfsm_comm_state(c->h);
        if (s == NCFSM_STATE_CLOSED || s == NCFSM_STATE_NEW) continue;
        char what[80];
        snprintf(what, sizeof what, "ncfsm_comm_abort(q%d/r%d) from another thread", q->id, k);
        fz_deadline(HANG_SLACK_MS, what);
        ncfsm_result_t rc = ncfsm_comm_abort(c->h);
        fz_deadline(0, NULL);
        g.n_calls++;
        ncfsm_state_t after = ncfsm_comm_state(c->h);
        fz_log("  %s in %s -> %s (now %s)", what, ncfsm_state_name(s), rname(rc), ncfsm_state_name(after));
        /* the running loop may move the comm meanwhile (its error policy aborts it) */
        if (rc != NCFSM_OK && ncfsm_legality(s, NCFSM_CALL_ABORT, NULL, NULL) != NCFSM_REJECT &&
            ncfsm_legality(after, NCFSM_CALL_ABORT, NULL, NULL) != NCFSM_REJECT)
          fz_violation("%s in state %s returned %s, although the table allows abort there (and in %s, "
                       "its state now)", what, ncfsm_state_name(s), rname(rc), ncfsm_state_name(after));
      }
    }
    done = runner_wait(&r, 3000);
    if (!done) {
      char what[800] = "";
      describe_loop(l, what, sizeof what);
      fz_violation("hang: ncfsm_loop_run(L%d, DEFAULT) did not return after every communicator of the loop was "
                   "aborted (ran %llu ms); %s", l->id, (unsigned long long)((fz_now_ns() - t0) / 1000000), what);
    }
  }
  pthread_join(th, NULL);
  pthread_mutex_destroy(&r.mu);
  pthread_cond_destroy(&r.cv);
  g.n_calls++;
  fz_log("ncfsm_loop_run(L%d, DEFAULT) on a helper thread -> %s after %llu ms", l->id, rname(r.rc),
         (unsigned long long)((fz_now_ns() - t0) / 1000000));
  if (r.rc != NCFSM_OK) fz_violation("ncfsm_loop_run(L%d, DEFAULT) returned %s", l->id, rname(r.rc));
  return r.rc;
}

static void act_run(void) {
  fz_loop *l = pick_loop();
  if (!l) return;
  int m = fz_below(10);
  if (m < 6) {
    for (int i = fz_range(1, 8); i > 0; i--)
      fz_run(l, (g.o.avoid & FZ_AVOID_NOWAIT_SPIN) ? NCFSM_RUN_ONCE : NCFSM_RUN_NOWAIT);
  } else if (m < 8) {
    fz_run(l, NCFSM_RUN_ONCE);
  } else {
    fz_run_default(l);
  }
}

static void act_thread(void) {
  fz_loop *l = pick_loop();
  if (!l) return;
  if (!l->thread) {
    ncfsm_result_t rc = ncfsm_loop_start_thread(l->h);
    g.n_calls++;
    fz_log("ncfsm_loop_start_thread(L%d%s) -> %s", l->id, l->embedded ? ", embedded" : "", rname(rc));
    if (l->embedded && rc != NCFSM_ERR_INVALID_USAGE)
      fz_violation("ncfsm_loop_start_thread on an embedded loop returned %s", rname(rc));
    if (!l->embedded && rc != NCFSM_OK) fz_violation("ncfsm_loop_start_thread returned %s", rname(rc));
    if (rc == NCFSM_OK) l->thread = true;
  } else {
    fz_deadline(HANG_SLACK_MS, "ncfsm_loop_stop_thread");
    ncfsm_result_t rc = ncfsm_loop_stop_thread(l->h);
    fz_deadline(0, NULL);
    g.n_calls++;
    fz_log("ncfsm_loop_stop_thread(L%d) -> %s", l->id, rname(rc));
    if (rc != NCFSM_OK) fz_violation("ncfsm_loop_stop_thread returned %s", rname(rc));
    l->thread = false;
    rc = ncfsm_loop_stop_thread(l->h);
    g.n_calls++;
    if (rc != NCFSM_ERR_INVALID_USAGE)
      fz_violation("a second ncfsm_loop_stop_thread returned %s, expected NCFSM_ERR_INVALID_USAGE", rname(rc));
  }
}

/* ---- loop_call ------------------------------------------------------------------------------------ */
enum { CALL_COUNT, CALL_REFUSED_WAITS, CALL_TEMPLATE, CALL_CLOSE };
static pthread_t main_thread;

static void call_fn_impl(void *arg) {
  fz_call *k = arg;
  pthread_mutex_lock(&g.mu);
  k->ran++;
  int ran = k->ran;
  pthread_mutex_unlock(&g.mu);
  if (ran > 1) fz_violation("loop_call request %d ran %d times", k->id, ran);
  fz_loop *l = k->loop;
  bool on_main = pthread_equal(pthread_self(), main_thread);
  switch (k->kind) {
    case CALL_REFUSED_WAITS: {
      if (l->closing) break; /* delivered by ncfsm_loop_close itself */
      fz_op *op = pick_held(l);
      if (op) {
        ncfsm_result_t r = ncfsm_work_wait(op->w, 5);
        ncfsm_result_t st = ncfsm_work_status(op->w);
        if (r != NCFSM_ERR_INVALID_USAGE && !(st != NCFSM_ERR_AGAIN && r == st))
          fz_violation("ncfsm_work_wait inside a loop_call callback returned %s (status %s); a callback "
                       "may not wait on its own loop (NCFSM_ERR_INVALID_USAGE)", rname(r), rname(st));
      }
      ncfsm_result_t r = ncfsm_loop_run(l->h, NCFSM_RUN_NOWAIT);
      if (r != NCFSM_ERR_INVALID_USAGE)
        fz_violation("ncfsm_loop_run inside a loop_call callback returned %s, expected "
                     "NCFSM_ERR_INVALID_USAGE", rname(r));
      break;
    }
    case CALL_TEMPLATE: {
      fz_clique *q = k->clique >= 0 && k->clique < g.ncliques ? g.cliques[k->clique] : NULL;
      if (!on_main || l->depth || l->closing || !q || !clique_live(q)) break;
      fz_log("loop_call request %d: a template from inside the loop", k->id);
      fz_args a;
      random_args(q, &a);
      fz_template(q, &a, fz_chance(0.5));
      break;
    }
    case CALL_CLOSE: {
      ncfsm_result_t r = ncfsm_loop_close(l->h);
      g.n_calls++;
      fz_log("loop_call request %d: ncfsm_loop_close(L%d) inside the loop's own callback -> %s", k->id, l->id,
             rname(r));
      if (r == NCFSM_OK) {
        l->h = NULL;
        fz_violation("ncfsm_loop_close(L%d) returned NCFSM_OK inside one of the loop's own callbacks: the "
                     "loop is freed while its turn is still running", l->id);
      }
      break;
    }
    default:
      break;
  }
}

void fz_loop_call(fz_loop *l, int kind, fz_clique *q) {
  if (g.ncalls >= FZ_MAX_CALLS) return;
  pthread_mutex_lock(&g.mu);
  fz_call *k = &g.calls[g.ncalls];
  k->id = g.ncalls++;
  k->loop = l;
  k->kind = kind;
  k->clique = q ? q->id : -1;
  pthread_mutex_unlock(&g.mu);
  ncfsm_result_t rc = ncfsm_loop_call(l->h, call_fn_impl, k);
  g.n_calls++;
  static const char *kn[] = {"count", "refused waits", "template", "close the loop"};
  fz_log("ncfsm_loop_call(L%d, request %d: %s) -> %s", l->id, k->id, kn[kind], rname(rc));
  if (rc != NCFSM_OK) fz_violation("ncfsm_loop_call returned %s", rname(rc));
  pthread_mutex_lock(&g.mu);
  k->accepted = true;
  pthread_mutex_unlock(&g.mu);
}

static void act_loop_call(void) {
  fz_loop *l = pick_loop();
  if (!l) return;
  int kind = fz_below(3);
  fz_loop_call(l, kind, kind == CALL_TEMPLATE ? pick_clique(l) : NULL);
}

/* ---- streams, buffers, getters ----------------------------------------------------------------------- */
fz_stream *fz_stream_new(fz_comm *c) {
  if (g.nstreams >= FZ_MAX_STREAMS || !c->h) return NULL;
  void *s = NULL;
  ncfsm_result_t rc = ncfsm_stream_create(c->h, &s);
  g.n_calls++;
  fz_stream *st = &g.streams[g.nstreams];
  st->id = g.nstreams;
  fz_log("ncfsm_stream_create(q%d/r%d, device %d) -> %s: S%d", c->q->id, c->rank, c->device, rname(rc), st->id);
  if (rc != NCFSM_OK || !s) fz_violation("ncfsm_stream_create returned %s", rname(rc));
  st->h = s;
  st->device = c->device;
  st->loop = c->q->loop;
  st->loop_gen = c->q->loop->gen;
  st->destroyed = false;
  g.nstreams++;
  return st;
}

/* Does an op that is not final name the stream? *unlaunched: one that is
 * not on the stream yet (QUEUED or LAUNCHING). */
static bool stream_in_use(const fz_stream *s, fz_op **unlaunched) {
  bool busy = false;
  *unlaunched = NULL;
  pthread_mutex_lock(&g.mu);
  for (int i = 0; i < g.nops; i++) {
    fz_op *op = g.ops[i];
    if (op->stream_id != s->id || !op->returned || op->rc != NCFSM_OK || fz_is_final_wstate(op->wstate)) continue;
    busy = true;
    if (op->wstate == NCFSM_WORK_QUEUED || op->wstate == NCFSM_WORK_LAUNCHING) {
      *unlaunched = op;
      break;
    }
  }
  pthread_mutex_unlock(&g.mu);
  return busy;
}

void fz_stream_del(fz_comm *c, fz_stream *s) {
  if (!c->h || s->destroyed) return;
  fz_op *unl;
  bool busy = stream_in_use(s, &unl);
  ncfsm_result_t rc = ncfsm_stream_destroy(c->h, s->h);
  g.n_calls++;
  fz_log("ncfsm_stream_destroy(S%d)%s -> %s", s->id,
         unl ? " while a work that is not launched yet names it" : busy ? " while a work in flight names it" : "",
         rname(rc));
  if (rc == NCFSM_OK && unl && quiet(s->loop))
    fz_violation("ncfsm_stream_destroy(S%d) returned NCFSM_OK while op %d (q%d/r%d %s, state %s) names the "
                 "stream and is not on it yet: the engine will later launch it on a destroyed stream",
                 s->id, unl->id, unl->c->q->id, unl->rank, ncfsm_opkind_name(unl->kind),
                 ncfsm_work_state_name((ncfsm_work_state_t)unl->wstate));
  if (rc == NCFSM_ERR_BUSY && !busy && quiet(s->loop))
    fz_violation("ncfsm_stream_destroy(S%d) returned NCFSM_ERR_BUSY but no unfinished work names it", s->id);
  if (rc != NCFSM_OK && rc != NCFSM_ERR_BUSY) fz_violation("ncfsm_stream_destroy returned %s", rname(rc));
  if (rc == NCFSM_OK) s->destroyed = true;
}

static void destroy_streams_of(fz_loop *l, fz_comm *via) {
  for (int i = 0; i < g.nstreams; i++)
    if (g.streams[i].loop == l && g.streams[i].loop_gen == l->gen && !g.streams[i].destroyed)
      fz_stream_del(via, &g.streams[i]);
}

static void act_stream(void) {
  fz_comm *c = pick_comm();
  if (!c) return;
  if (fz_chance(0.55)) {
    fz_stream_new(c);
  } else {
    fz_stream *s = pick_stream(c->q->loop, c->device, fz_chance(0.7));
    fz_op *unl = NULL;
    if (s && (g.o.avoid & FZ_AVOID_STREAM_QUEUED) && (stream_in_use(s, &unl), unl))
      fz_log("(ncfsm_stream_destroy(S%d) skipped: --avoid, op %d names it and is not launched)", s->id, unl->id);
    else if (s)
      fz_stream_del(c, s);
  }
}

static void act_mem(void) {
  fz_comm *c = pick_comm();
  if (!c) return;
  size_t bytes = (size_t)fz_range(1, 256);
  void *p = NULL;
  ncfsm_result_t rc = ncfsm_mem_alloc(c->h, bytes, &p);
  if (rc != NCFSM_OK || !p) fz_violation("ncfsm_mem_alloc(%zu) returned %s", bytes, rname(rc));
  unsigned char in[256], back[256];
  for (size_t i = 0; i < bytes; i++) in[i] = (unsigned char)fz_rand();
  rc = ncfsm_memcpy(c->h, p, in, bytes, 1);
  if (rc != NCFSM_OK) fz_violation("ncfsm_memcpy to the buffer returned %s", rname(rc));
  memset(back, 0, sizeof back);
  rc = ncfsm_memcpy(c->h, back, p, bytes, 0);
  if (rc != NCFSM_OK || memcmp(in, back, bytes))
    fz_violation("ncfsm_memcpy round trip of %zu bytes: %s, data %s", bytes, rname(rc),
                 memcmp(in, back, bytes) ? "differs" : "equal");
  rc = ncfsm_mem_free(c->h, p);
  if (rc != NCFSM_OK) fz_violation("ncfsm_mem_free returned %s", rname(rc));
  g.n_calls += 4;
  fz_log("ncfsm_mem_alloc/memcpy/memcpy/mem_free(q%d/r%d, %zu bytes)", c->q->id, c->rank, bytes);
}

static void act_getters(void) {
  fz_clique *q = pick_clique(NULL);
  if (!q) return;
  fz_loop *l = q->loop;
  for (int r = 0; r < q->n; r++) {
    fz_comm *c = q->c[r];
    if (!c->h) continue;
    int rank = ncfsm_comm_rank(c->h), size = ncfsm_comm_size(c->h), dev = ncfsm_comm_device(c->h);
    uint64_t seq = 0;
    if (ncfsm_comm_position(c->h, &seq, NULL) != NCFSM_OK) fz_violation("q%d/r%d: ncfsm_comm_position refused a live handle", q->id, r);
    const char *le = ncfsm_comm_last_error(c->h);
    (void)ncfsm_comm_backend_error(c->h);
    g.n_calls += 6;
    bool unknown_yet = q->split_child && rank == -1 && size == 0; /* until its INIT_DONE (or for good if it failed) */
    if (c->inited && !unknown_yet && (rank != r || size != q->n))
      fz_violation("q%d/r%d: ncfsm_comm_rank/size are %d/%d", q->id, r, rank, size);
    if (dev != c->device) fz_violation("q%d/r%d: ncfsm_comm_device is %d, not %d", q->id, r, dev, c->device);
    if (!le) fz_violation("q%d/r%d: ncfsm_comm_last_error returned NULL", q->id, r);
    if (ncfsm_comm_failure) {
      ncfsm_state_t s = ncfsm_comm_state(c->h);
      const char *fl = ncfsm_comm_failure(c->h);
      g.n_calls += 2;
      if (!fl || (quiet(l) && s == NCFSM_STATE_ERROR && !*fl))
        fz_violation("q%d/r%d: ncfsm_comm_failure is %s in state %s", q->id, r, fl ? "empty" : "NULL",
                     ncfsm_state_name(s));
    }
    uint64_t want = FZ_SEQ_AT_LAUNCH ? c->coll_launched : c->coll_accepted;
    if (quiet(l) && seq != want)
      fz_violation("q%d/r%d: ncfsm_comm_position's seq is %llu but %llu collectives were %s", q->id, r,
                   (unsigned long long)seq, (unsigned long long)want, FZ_SEQ_AT_LAUNCH ? "launched" : "accepted");
    ncfsm_sim_stats st;
    ncfsm_result_t rc = ncfsm_sim_get_stats(c->h, &st);
    g.n_calls++;
    if (rc == NCFSM_OK && st.executed > st.ops)
      fz_violation("q%d/r%d: sim stats say %llu executed of %llu ops", q->id, r, (unsigned long long)st.executed,
                   (unsigned long long)st.ops);
  }
  /* R11: ranks that accepted (launched) the same collective sequence have the same hash. */
  for (int a = 0; a < q->n; a++)
    for (int b = a + 1; b < q->n; b++) {
      fz_comm *x = q->c[a], *y = q->c[b];
      /* only while no other thread drives the loop: the two reads must see one moment */
      if (!quiet(l) || !x->h || !y->h || !x->inited || !y->inited || x->fp_hash != y->fp_hash) continue;
      uint64_t hx = 0, hy = 0;
      ncfsm_comm_position(x->h, NULL, &hx);
      ncfsm_comm_position(y->h, NULL, &hy);
      if (hx != hy)
        fz_violation("q%d: ranks %d and %d %s the same collective sequence but ncfsm_comm_position's hash differs "
                     "(%016llx, %016llx)", q->id, a, b, FZ_SEQ_AT_LAUNCH ? "launched" : "accepted",
                     (unsigned long long)hx, (unsigned long long)hy);
    }
  fz_log("getters of q%d (rank, size, device, seq, hash, last_error, backend_error, sim stats)", q->id);
}

/* ---- retiring a loop ------------------------------------------------------------------------------ */
static void release_held_of(fz_loop *l) {
  for (;;) {
    fz_op *op = pick_held(l);
    if (!op) break;
    fz_release(op);
  }
}

void fz_retire_loop(fz_loop *l, bool close_in_call) {
  if (!loop_open(l)) return;
  fz_log("retire loop L%d%s", l->id, close_in_call ? " (closed from inside a loop_call callback)" : "");
  while (l->depth > 0) fz_group_end(l);
  if (l->thread) {
    ncfsm_result_t rc = ncfsm_loop_stop_thread(l->h);
    if (rc != NCFSM_OK) fz_violation("ncfsm_loop_stop_thread returned %s", rname(rc));
    l->thread = false;
  }
  fz_comm *via = NULL;
  for (int i = 0; i < g.ncliques; i++) {
    fz_clique *q = g.cliques[i];
    if (!on_loop(q, l)) continue;
    for (int r = 0; r < q->n; r++) {
      fz_comm *c = q->c[r];
      if (!c->h) continue;
      ncfsm_state_t s = ncfsm_comm_state(c->h);
      if (s != NCFSM_STATE_CLOSED && s != NCFSM_STATE_NEW) fz_lifecycle(c, NCFSM_CALL_ABORT);
      if (!via) via = c;
    }
  }
  if (via) destroy_streams_of(l, via);
  for (int i = 0; i < g.nstreams; i++)
    if (g.streams[i].loop == l && g.streams[i].loop_gen == l->gen && !g.streams[i].destroyed)
      fz_violation("stream S%d of L%d cannot be destroyed: ncfsm_stream_destroy still says busy after every "
                   "comm of the loop was aborted", g.streams[i].id, l->id);
  for (int i = 0; i < g.ncliques; i++) {
    fz_clique *q = g.cliques[i];
    if (!on_loop(q, l)) continue;
    for (int r = 0; r < q->n; r++)
      if (q->c[r]->h) {
        ncfsm_result_t rc = fz_lifecycle(q->c[r], NCFSM_CALL_RELEASE);
        if (rc != NCFSM_OK)
          fz_violation("ncfsm_comm_release of an aborted (or NEW) comm returned %s", rname(rc));
      }
  }
  fz_run(l, NCFSM_RUN_NOWAIT);
  release_held_of(l);
  fz_run(l, NCFSM_RUN_NOWAIT);
  if (close_in_call) {
    fz_loop_call(l, CALL_CLOSE, NULL);
    fz_run(l, NCFSM_RUN_NOWAIT);
    if (!l->h) return; /* (reported by the callback) */
  }
  l->closing = true;
  fz_deadline(HANG_SLACK_MS, "ncfsm_loop_close");
  ncfsm_result_t rc = ncfsm_loop_close(l->h);
  fz_deadline(0, NULL);
  g.n_calls++;
  fz_log("ncfsm_loop_close(L%d) -> %s", l->id, rname(rc));
  if (rc != NCFSM_OK)
    fz_violation("ncfsm_loop_close(L%d) returned %s after every comm, stream and work handle of the loop was "
                 "released: %s", l->id, rname(rc), ncfsm_loop_last_error(l->h));
  l->h = NULL;
  l->closing = false;
  if (l->base) {
    event_base_free(l->base);
    l->base = NULL;
  }
}

static void act_retire(void) {
  fz_loop *l = pick_loop();
  if (!l) return;
  int idx = l->id;
  bool in_call = fz_chance(0.3);
  fz_retire_loop(l, in_call && !(g.o.avoid & FZ_AVOID_CLOSE_IN_CALLBACK));
  fz_loop_open(idx, fz_chance(0.2));
}

/* ---- the world -------------------------------------------------------------------------------------- */
void fz_world_init(void) {
  main_thread = pthread_self();
  evthread_use_pthreads();
  pthread_mutex_init(&g.mu, NULL);
  memset(g.loops, 0, sizeof g.loops);
  g.ncliques = g.nstreams = g.nops = g.ncalls = 0;
  g.next_group_id = 0;
  g.ncmap = 0;
  g.n_calls = g.n_ok_checked = g.n_cb = g.n_trace = 0;
  if (g.o.scenario) return;
  int nloops = fz_range(1, FZ_MAX_LOOPS);
  for (int i = 0; i < nloops; i++) fz_loop_open(i, fz_chance(0.15));
}

/* Split (one color, keys keeping the order) or a default-mode shrink that
 * excludes the last rank: the children are a new clique of the world (mode 4:
 * made with ncfsm_comm_new, not initialised), ranked as their parents. Every
 * call is checked against the legality table; a rank whose call fails leaves
 * its child NEW (the others' children then never get their handles and end at
 * their deadline, or stay in INIT_IN_PROGRESS until aborted). */
static void act_split(void) {
  fz_clique *q = pick_clique(NULL);
  if (!q || g.ncliques >= FZ_MAX_CLIQUES - 1 || !quiet(q->loop) || !q->loop->h) return;
  bool shrink = q->n >= 2 && fz_chance(0.5);
  int ex = q->n - 1, nch = shrink ? q->n - 1 : q->n;
  for (int r = 0; r < nch; r++)
    if (!q->c[r]->h) return;
  fz_clique *k = fz_clique_new(q->loop, nch, NULL, NULL, 4);
  if (!k) return;
  k->split_child = !shrink;
  fz_log("%s of q%d into q%d", shrink ? "shrink (default mode, excluding the last rank)" : "split", q->id, k->id);
  for (int r = 0; r < nch; r++) {
    fz_comm *p = q->c[r], *c = k->c[r];
    ncfsm_state_t pre = ncfsm_comm_state(p->h);
    ncfsm_call_t call = shrink ? NCFSM_CALL_SHRINK : NCFSM_CALL_SPLIT;
    char what[96];
    snprintf(what, sizeof what, "%s(q%d/r%d -> q%d/r%d)", call_fn(call), q->id, r, k->id, r);
    fz_deadline(HANG_SLACK_MS, what);
    ncfsm_result_t rc = shrink ? ncfsm_comm_shrink(p->h, &ex, 1, NCFSM_SHRINK_DEFAULT, c->h)
                               : ncfsm_comm_split(p->h, 0, r, c->h);
    fz_deadline(0, NULL);
    g.n_calls++;
    fz_log("%s in %s -> %s (parent now %s, child %s)", what, ncfsm_state_name(pre), rname(rc),
           ncfsm_state_name(ncfsm_comm_state(p->h)), ncfsm_state_name(ncfsm_comm_state(c->h)));
    if (rc == NCFSM_OK) c->inited = true;
    if (rc == NCFSM_OK && ncfsm_legality(pre, call, NULL, NULL) == NCFSM_REJECT)
      fz_violation("%s returned OK in state %s, where the legality table says REJECT", what, ncfsm_state_name(pre));
    if (rc == NCFSM_ERR_ILLEGAL_STATE) {
      const char *e = ncfsm_comm_last_error(p->h);
      if (!e || !*e) fz_violation("%s failed with %s and an empty last error", what, rname(rc));
    }
    /* refused before NCCL: the child stays NEW; NCCL refused the call: the parent and the child fail */
    bool refused = rc == NCFSM_ERR_ILLEGAL_STATE || rc == NCFSM_ERR_INVALID_ARGUMENT || rc == NCFSM_ERR_INVALID_USAGE ||
                   rc == NCFSM_ERR_UNSUPPORTED || rc == NCFSM_ERR_WRONG_THREAD;
    ncfsm_state_t cs = ncfsm_comm_state(c->h);
    if (refused && cs != NCFSM_STATE_NEW)
      fz_violation("%s was refused with %s but the child left NEW (%s)", what, rname(rc), ncfsm_state_name(cs));
    if (rc != NCFSM_OK && !refused && (cs == NCFSM_STATE_NEW || cs == NCFSM_STATE_INIT_IN_PROGRESS))
      fz_violation("%s failed with %s (NCCL refused it) but the child is %s, not failed", what, rname(rc),
                   ncfsm_state_name(cs));
    if (rc != NCFSM_OK && q->loop->depth) q->loop->group_call_error = true;
  }
}

static void act_new_clique(void) {
  fz_loop *l = pick_loop();
  if (!l) return;
  int n = fz_chance(0.1) ? 1 : fz_chance(0.6) ? 2 : fz_range(3, FZ_MAX_RANKS);
  int mode = fz_below(10);
  mode = mode < 4 ? 0 : mode < 7 ? 1 : mode < 9 ? 3 : 2;
  fz_clique *q = fz_clique_new(l, n, NULL, NULL, mode);
  if (q && fz_chance(0.5)) /* the usual first thing: wait for READY */
    for (int r = 0; r < n; r++)
      if (q->c[r]->h && q->c[r]->inited) fz_wait_state(q->c[r], NCFSM_STATE_READY, (uint64_t)fz_range(5, 30));
}

typedef struct { void (*fn)(void); int w; const char *name; } action;

static void act_group_end_b(void) { act_group_end(false); }
static void act_group_end_u(void) { act_group_end(true); }
static void act_thread_r(void) { act_thread(); }

void fz_random_step(void) {
  int live = active_cliques();
  bool closed = closed_comm() != NULL;
  bool deferred = false;
  for (int i = 0; i < g.ncliques && !deferred; i++)
    for (int r = 0; r < g.cliques[i]->n; r++)
      if (clique_live(g.cliques[i]) && g.cliques[i]->c[r]->h && !g.cliques[i]->c[r]->inited) deferred = true;
  int depth = 0;
  for (int i = 0; i < FZ_MAX_LOOPS; i++) depth += g.loops[i].depth;
  action acts[] = {
      {act_new_clique, live == 0 ? 100 : live < 4 && g.ncliques < FZ_MAX_CLIQUES - 1 ? 6 : 0, "new clique"},
      {act_init_later, deferred ? 6 : 0, "init"},
      {act_bad_init, 1, "bad init"},
      {act_template, 34, "template"},
      {act_split, 2, "split or shrink"},
      {act_group_start, depth < 3 ? 3 : 0, "group start"},
      {act_group_end_b, depth ? 6 : 0, "group end"},
      {act_group_end_u, 1, "group end (maybe unbalanced)"},
      {act_work, 16, "work"},
      {act_lifecycle, 10, "lifecycle"},
      {act_reap, closed ? 6 : 0, "release a closed comm"},
      {act_orderly_close, 2, "orderly close"},
      {act_wait_state, 4, "wait state"},
      {act_run, 10, "run"},
      {act_loop_call, 2, "loop_call"},
      {act_thread_r, 1, "loop thread"},
      {act_stream, 4, "stream"},
      {act_mem, 1, "mem"},
      {act_getters, 2, "getters"},
      {act_retire, 1, "retire loop"},
  };
  int total = 0, na = (int)(sizeof acts / sizeof acts[0]);
  for (int i = 0; i < na; i++) total += acts[i].w;
  int x = fz_below(total);
  for (int i = 0; i < na; i++) {
    if (x < acts[i].w) {
      int before = g.sh->nlines;
      acts[i].fn();
      if (g.sh->nlines == before) fz_log("(%s: nothing to act on)", acts[i].name);
      return;
    }
    x -= acts[i].w;
  }
}

void fz_teardown(void) {
  for (int i = 0; i < FZ_MAX_LOOPS; i++)
    if (loop_open(&g.loops[i])) fz_retire_loop(&g.loops[i], false);
}

void fz_world_free(void) {
  for (int i = 0; i < g.nops; i++) {
    fz_op *op = g.ops[i];
    if (op->send != op->recv) free(op->send);
    free(op->recv);
    free(op->in);
    free(op);
  }
  free(g.ops);
  g.ops = NULL;
  g.nops = g.capops = 0;
  for (int i = 0; i < g.ncliques; i++) {
    fz_clique *q = g.cliques[i];
    for (int a = 0; a < FZ_MAX_RANKS; a++) {
      free(q->coll[a].v);
      for (int b = 0; b < FZ_MAX_RANKS; b++) {
        free(q->send[a][b].v);
        free(q->recv[a][b].v);
      }
    }
    for (int r = 0; r < q->n; r++) free(q->c[r]);
    free(q);
  }
  g.ncliques = 0;
  free(g.wmap);
  g.wmap = NULL;
  g.nwmap = g.capwmap = 0;
  free(g.group_rc);
  g.group_rc = NULL;
  g.cap_group_rc = 0;
  pthread_mutex_destroy(&g.mu);
}
