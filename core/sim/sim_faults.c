/*
 * The sim's fault plan (core/sim/sim-faults.h): the registry the testing kit
 * fills, and the hooks sim.c calls at a comm's creation, at the start and end
 * of each InProgress phase, when it posts ops and when it is polled.
 *
 * What each fault does in the sim (docs/testing.md has the table):
 *   ASYNC_ERROR   AT_OP: the op is marked dead (never executes) and the async
 *                 state becomes the code, as async_error_at_op; AT_STATE
 *                 init: fail_init; launch: the launch's first op, as AT_OP;
 *                 finalize/revoke/split: that phase's last poll returns the
 *                 code; AT_POLL/AT_MS: the async state becomes the code at
 *                 that poll (a launch or finalize in progress ends with it
 *                 at once; an init, revoke or split at its end)
 *   INIT_FAIL     fail_init
 *   INIT_HANG     the init phase's countdown never runs out
 *   SLOW          the countdown of the phases after the trigger grows
 *   NEVER_ARRIVE  never_arrive from the trigger on
 *   DEAD          dead from the trigger on
 *   MISMATCH      the op's shared descriptor (what peers match, R11) differs
 *   KILL          raise(SIGKILL)
 * Deterministic mode: the clique's shuffle seed comes from (seed, name, the
 * how-many-th comm of that name and rank this process made) and each comm's
 * poll jitter from the same plus its rank, so a run depends on the seed only.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/sim/sim-faults.h"

#define NAME_MAX_LEN 64
#define NEVER_POLLS (1 << 30)

typedef struct plan_fault {
  ncfsm_fault f;
  sim_phase ph;
  char name[NAME_MAX_LEN];
  uint64_t fired;
} plan_fault;

typedef struct plan_opts {
  char name[NAME_MAX_LEN];
  int rank;
  ncfsm_sim_opts so;
} plan_opts;

typedef struct plan_seen {
  char name[NAME_MAX_LEN];
  int rank;
  uint64_t n;
} plan_seen;

static struct {
  int active;
  uint64_t gen; /* incremented by every begin: a comm's faults fire only under its own plan */
  uint64_t seed;
  int det, jitter;
  plan_fault *f;
  int nf, fcap;
  plan_opts *ov;
  int nov, ovcap;
  plan_seen *seen;
  int nseen, seencap;
} g;

typedef struct fs_fault {
  ncfsm_fault f; /* f.comm not used */
  sim_phase ph;  /* AT_STATE: the phase of f.state (the caller's translation) */
  int id;
  int done;       /* its trigger fired on this comm */
  int slow_on;    /* SLOW: phases are slowed */
  uint64_t slow_left;
} fs_fault;

struct sim_fstate {
  uint64_t gen;
  int nf;
  fs_fault *v;
  uint64_t nphase[SIM_PH_XCOMM + 1]; /* phases started, per kind */
  uint64_t polls;
  uint64_t t0;
  uint64_t rng;
  int jitter;
  int phase_err;  /* the current phase ends with this error */
  int post_err;   /* the next launch's first op gets this async error */
  int slowed;     /* the current launch was slowed: it holds its group end */
  int mm_next;    /* field + 1: the next collective posted gets this mismatch */
  int mm_field;   /* field + 1 for op mm_seq */
  uint64_t mm_seq;
};

static uint64_t mix(uint64_t z) { /* splitmix64's finaliser */
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t hash_str(const char *s) { /* FNV-1a */
  uint64_t h = 0xcbf29ce484222325ull;
  for (; s && *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

static int name_match(const char *pat, const char *name) {
  return !pat[0] || !strcmp(pat, name ? name : "");
}

static const char *const phase_names[] = {"none", "init", "launch", "finalize", "revoke", "split/shrink/grow"};

/* ---- the registry ---------------------------------------------------------------------- */

int ncfsm__sim_plan_begin(uint64_t seed, int deterministic, int jitter) {
  pthread_mutex_lock(&ncfsm__sim_mu);
  int rc = -1;
  if (!g.active) {
    g.active = 1;
    g.gen++;
    g.seed = seed;
    g.det = deterministic;
    g.jitter = jitter < 0 ? 0 : jitter;
    g.nf = g.nov = g.nseen = 0;
    rc = 0;
  }
  pthread_mutex_unlock(&ncfsm__sim_mu);
  return rc;
}

void ncfsm__sim_plan_end(void) {
  pthread_mutex_lock(&ncfsm__sim_mu);
  g.active = 0;
  g.gen++;
  free(g.f);
  free(g.ov);
  free(g.seen);
  g.f = NULL;
  g.ov = NULL;
  g.seen = NULL;
  g.nf = g.fcap = g.nov = g.ovcap = g.nseen = g.seencap = 0;
  pthread_mutex_unlock(&ncfsm__sim_mu);
}

static int grow(void **v, int *cap, int n, size_t sz) {
  if (n < *cap) return 0;
  int ncap = *cap ? *cap * 2 : 8;
  void *nv = realloc(*v, (size_t)ncap * sz);
  if (!nv) return -1;
  *v = nv;
  *cap = ncap;
  return 0;
}

int ncfsm__sim_plan_add_fault(const ncfsm_fault *f, sim_phase ph) {
  pthread_mutex_lock(&ncfsm__sim_mu);
  int id = -1;
  if (g.active && !grow((void **)&g.f, &g.fcap, g.nf, sizeof *g.f)) {
    plan_fault *p = &g.f[g.nf];
    memset(p, 0, sizeof *p);
    p->f = *f;
    p->f.comm = NULL;
    p->ph = f->when == NCFSM_AT_STATE ? ph : SIM_PH_NONE;
    snprintf(p->name, sizeof p->name, "%s", f->comm ? f->comm : "");
    id = g.nf++;
  }
  pthread_mutex_unlock(&ncfsm__sim_mu);
  return id;
}

int ncfsm__sim_plan_set_opts(const char *comm, int rank, const ncfsm_sim_opts *so) {
  pthread_mutex_lock(&ncfsm__sim_mu);
  int rc = -1;
  if (g.active && so && !grow((void **)&g.ov, &g.ovcap, g.nov, sizeof *g.ov)) {
    plan_opts *p = &g.ov[g.nov++];
    snprintf(p->name, sizeof p->name, "%s", comm ? comm : "");
    p->rank = rank;
    p->so = *so;
    rc = 0;
  }
  pthread_mutex_unlock(&ncfsm__sim_mu);
  return rc;
}

uint64_t ncfsm__sim_plan_fired(int id) {
  pthread_mutex_lock(&ncfsm__sim_mu);
  uint64_t n = g.active && id >= 0 && id < g.nf ? g.f[id].fired : 0;
  pthread_mutex_unlock(&ncfsm__sim_mu);
  return n;
}

/* ---- the hooks ------------------------------------------------------------------------- */

/* The fault's trigger fires on this comm now: once per comm, at most `times` in all. */
static int fire(sim_fstate *fs, fs_fault *x) {
  if (fs->gen != g.gen || !g.active || x->done || x->id >= g.nf) return 0;
  plan_fault *p = &g.f[x->id];
  if (x->f.times && p->fired >= x->f.times) return 0;
  p->fired++;
  x->done = 1;
  return 1;
}

static uint64_t seen_count(const char *name, int rank) {
  for (int i = 0; i < g.nseen; i++)
    if (g.seen[i].rank == rank && !strcmp(g.seen[i].name, name)) return g.seen[i].n++;
  if (grow((void **)&g.seen, &g.seencap, g.nseen, sizeof *g.seen)) return 0;
  plan_seen *s = &g.seen[g.nseen++];
  snprintf(s->name, sizeof s->name, "%s", name);
  s->rank = rank;
  s->n = 1;
  return 0;
}

static void kill_self(sim_comm *c, const char *where) {
  ncfsm__sim_cwarn(c, "sim: injected process death (SIGKILL) of rank %d %s", c->rank, where);
  raise(SIGKILL);
}

sim_fstate *ncfsm__sim_fault_bind(ncfsm_sim_opts *o, const char *name, int rank) {
  if (!g.active) return NULL;
  if (!name) name = "";
  for (int i = g.nov - 1; i >= 0; i--) /* the last matching set_opts wins */
    if (name_match(g.ov[i].name, name) && (g.ov[i].rank < 0 || g.ov[i].rank == rank)) {
      *o = g.ov[i].so;
      break;
    }
  sim_fstate *fs = calloc(1, sizeof *fs);
  if (!fs) return NULL;
  fs->gen = g.gen;
  fs->t0 = ncfsm__now_ns();
  uint64_t k = seen_count(name, rank);
  if (g.det) {
    /* the clique's shuffle: equal on every rank (whoever creates the clique) */
    o->shuffle_seed = mix(g.seed ^ mix(hash_str(name) ^ mix(k)));
    fs->rng = mix(o->shuffle_seed ^ mix(0x5eed0000ull + (uint64_t)rank));
    fs->jitter = g.jitter;
  }
  int n = 0;
  for (int i = 0; i < g.nf; i++)
    if (name_match(g.f[i].name, name) && (g.f[i].f.rank < 0 || g.f[i].f.rank == rank)) n++;
  if (n) {
    fs->v = calloc((size_t)n, sizeof *fs->v);
    if (!fs->v) {
      free(fs);
      return NULL;
    }
  }
  for (int i = 0; i < g.nf; i++)
    if (name_match(g.f[i].name, name) && (g.f[i].f.rank < 0 || g.f[i].f.rank == rank)) {
      fs_fault *x = &fs->v[fs->nf++];
      x->f = g.f[i].f;
      x->ph = g.f[i].ph;
      x->id = i;
    }
  /* init failures: through fail_init, so that blocking inits fail too */
  for (int i = 0; i < fs->nf; i++) {
    fs_fault *x = &fs->v[i];
    int init_err = x->f.kind == NCFSM_FAULT_INIT_FAIL ||
                   (x->f.kind == NCFSM_FAULT_ASYNC_ERROR && x->ph == SIM_PH_INIT && x->f.at <= 1);
    if (init_err && fire(fs, x)) {
      int dflt = x->f.kind == NCFSM_FAULT_INIT_FAIL ? NCFSM__NCCL_SYSTEM_ERROR : NCFSM__NCCL_REMOTE_ERROR;
      o->fail_init = x->f.code ? x->f.code : dflt;
    }
  }
  return fs;
}

void ncfsm__sim_fault_free(sim_fstate *fs) {
  if (!fs) return;
  free(fs->v);
  free(fs);
}

static int add_polls(int cd, int polls) {
  if (cd >= NEVER_POLLS || polls < 0 || polls >= NEVER_POLLS || cd + polls >= NEVER_POLLS) return NEVER_POLLS;
  return cd + polls;
}

/* A trigger fired: the effects that last (flags, slow phases, a mismatch to come). */
static void arm(sim_comm *c, fs_fault *x, const char *where) {
  sim_fstate *fs = c->fs;
  switch (x->f.kind) {
  case NCFSM_FAULT_NEVER_ARRIVE:
    c->o.never_arrive = 1;
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: injected never_arrive on rank %d %s", c->rank, where);
    break;
  case NCFSM_FAULT_DEAD:
    c->o.dead = 1;
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: injected dead rank %d %s", c->rank, where);
    break;
  case NCFSM_FAULT_SLOW:
    x->slow_on = 1;
    x->slow_left = x->f.phases;
    break;
  case NCFSM_FAULT_MISMATCH: fs->mm_next = (int)x->f.field + 1; break;
  case NCFSM_FAULT_KILL: kill_self(c, where); break;
  default: break;
  }
}

int ncfsm__sim_fault_phase(sim_comm *c, sim_phase ph, int countdown, size_t nops) {
  sim_fstate *fs = c->fs;
  if (!fs || ph <= SIM_PH_NONE || ph > SIM_PH_XCOMM) return countdown;
  uint64_t nth = ++fs->nphase[ph];
  fs->phase_err = 0; /* one left by a phase that ended without a poll (abort, a dead peer) */
  if (ph == SIM_PH_LAUNCH) fs->slowed = 0;
  int cd = countdown < 0 ? 0 : countdown;
  if (fs->jitter > 0 && (ph != SIM_PH_LAUNCH || c->o.group_end_inprogress)) {
    fs->rng = mix(fs->rng);
    cd = add_polls(cd, (int)(fs->rng % (uint64_t)(fs->jitter + 1)));
  }
  if (fs->gen != g.gen || !g.active) return cd;
  char where[96];
  snprintf(where, sizeof where, "at the start of %s phase %llu", phase_names[ph], (unsigned long long)nth);
  for (int i = 0; i < fs->nf; i++) {
    fs_fault *x = &fs->v[i];
    ncfsm_fault *f = &x->f;
    if (f->kind == NCFSM_FAULT_INIT_HANG) {
      if (ph == SIM_PH_INIT && nth == 1 && fire(fs, x)) {
        cd = NEVER_POLLS;
        NCFSM_INFO(NCFSM__SUB_SIM, "sim: injected init hang on rank %d", c->rank);
      }
      continue;
    }
    if (f->kind == NCFSM_FAULT_INIT_FAIL) continue;
    sim_phase fph = x->ph;
    uint64_t at = f->at ? f->at : 1;
    /* (an init error went through fail_init at bind) */
    int hit = f->when == NCFSM_AT_STATE && fph == ph && nth == at &&
              !(ph == SIM_PH_INIT && f->kind == NCFSM_FAULT_ASYNC_ERROR);
    if (f->when == NCFSM_AT_OP && f->kind == NCFSM_FAULT_SLOW && ph == SIM_PH_LAUNCH &&
        f->at >= c->nposted && f->at < c->nposted + nops)
      hit = 1; /* the launch that holds op `at` is the first one slowed */
    if (hit && fire(fs, x)) {
      if (f->kind == NCFSM_FAULT_ASYNC_ERROR) {
        int code = f->code ? f->code : NCFSM__NCCL_REMOTE_ERROR;
        if (ph == SIM_PH_LAUNCH) fs->post_err = code;
        else fs->phase_err = code;
      } else {
        arm(c, x, where);
      }
    }
    if (f->kind == NCFSM_FAULT_SLOW && x->slow_on) {
      sim_phase want = f->when == NCFSM_AT_STATE ? fph : SIM_PH_LAUNCH;
      if (want == ph) {
        cd = add_polls(cd, f->polls);
        if (ph == SIM_PH_LAUNCH) fs->slowed = 1;
        if (x->slow_left && --x->slow_left == 0) x->slow_on = 0;
      }
    }
  }
  return cd;
}

int ncfsm__sim_fault_holds(const sim_comm *m) {
  return m->fs && m->fs->slowed && m->phase == SIM_PH_LAUNCH && m->armed && m->countdown > 0;
}

int ncfsm__sim_fault_phase_end(sim_comm *c, int final) {
  sim_fstate *fs = c->fs;
  if (!fs || !fs->phase_err) return final;
  int code = fs->phase_err;
  fs->phase_err = 0;
  if (final != NCFSM__NCCL_SUCCESS) return final;
  ncfsm__sim_cwarn(c, "sim: injected async error %d at the end of the %s phase (rank %d)", code,
                  phase_names[c->phase <= SIM_PH_XCOMM ? c->phase : 0], c->rank);
  return code;
}

void ncfsm__sim_fault_unit(sim_comm *c, size_t n) {
  sim_fstate *fs = c->fs;
  if (!fs || fs->gen != g.gen || !g.active) return;
  for (int i = 0; i < fs->nf; i++) {
    fs_fault *x = &fs->v[i];
    if (x->f.kind == NCFSM_FAULT_KILL && x->f.when == NCFSM_AT_OP && x->f.at >= c->nposted &&
        x->f.at < c->nposted + n && fire(fs, x)) {
      char where[64];
      snprintf(where, sizeof where, "at op %llu", (unsigned long long)x->f.at);
      kill_self(c, where);
    }
  }
}

int ncfsm__sim_fault_op(sim_comm *c, uint64_t seq, int first, int collective) {
  sim_fstate *fs = c->fs;
  if (!fs) return 0;
  int err = 0;
  if (first && fs->post_err) {
    err = fs->post_err;
    fs->post_err = 0;
  }
  if (fs->mm_next && collective) { /* a mismatch armed by a state, poll or time trigger */
    fs->mm_field = fs->mm_next;
    fs->mm_seq = seq;
    fs->mm_next = 0;
  }
  if (fs->gen != g.gen || !g.active) return err;
  char where[64];
  snprintf(where, sizeof where, "at op %llu", (unsigned long long)seq);
  for (int i = 0; i < fs->nf; i++) {
    fs_fault *x = &fs->v[i];
    if (x->f.when != NCFSM_AT_OP || x->f.at != seq) continue;
    switch (x->f.kind) {
    case NCFSM_FAULT_ASYNC_ERROR:
      if (fire(fs, x)) err = x->f.code ? x->f.code : NCFSM__NCCL_REMOTE_ERROR;
      break;
    case NCFSM_FAULT_NEVER_ARRIVE:
    case NCFSM_FAULT_DEAD:
      if (fire(fs, x)) arm(c, x, where);
      break;
    case NCFSM_FAULT_MISMATCH:
      if (fire(fs, x)) {
        fs->mm_field = (int)x->f.field + 1;
        fs->mm_seq = seq;
      }
      break;
    default: break; /* SLOW: at the launch's start; KILL: before the unit */
    }
  }
  return err;
}

/* Another type of the same size. */
static int same_size_type(int dt) {
  switch (dt) {
  case NCFSM_INT8: return NCFSM_UINT8;
  case NCFSM_UINT8: return NCFSM_INT8;
  case NCFSM_INT32: return NCFSM_FLOAT32;
  case NCFSM_UINT32: return NCFSM_INT32;
  case NCFSM_FLOAT32: return NCFSM_INT32;
  case NCFSM_INT64: return NCFSM_FLOAT64;
  case NCFSM_UINT64: return NCFSM_INT64;
  case NCFSM_FLOAT64: return NCFSM_INT64;
  case NCFSM_FLOAT16: return NCFSM_BFLOAT16;
  case NCFSM_BFLOAT16: return NCFSM_FLOAT16;
  default: return dt;
  }
}

void ncfsm__sim_fault_desc(sim_comm *c, uint64_t seq, shm_op *s) {
  sim_fstate *fs = c->fs;
  if (!fs || !fs->mm_field || fs->mm_seq != seq) return;
  int field = fs->mm_field - 1;
  fs->mm_field = 0;
  const char *what = "nothing (not applicable to this op)";
  char buf[96];
  int rooted = s->kind == NCFSM_KIND_BROADCAST || s->kind == NCFSM_KIND_REDUCE ||
               s->kind == NCFSM_KIND_GATHER || s->kind == NCFSM_KIND_SCATTER;
  int reducing = s->kind == NCFSM_KIND_ALLREDUCE || s->kind == NCFSM_KIND_REDUCE ||
                 s->kind == NCFSM_KIND_REDUCESCATTER;
  int p2p = s->kind == NCFSM_KIND_SEND || s->kind == NCFSM_KIND_RECV;
  switch (field) {
  case NCFSM_MISMATCH_COUNT: /* never larger: results are copied by the descriptor's size */
    if (s->count) {
      snprintf(buf, sizeof buf, "count %llu -> %llu", (unsigned long long)s->count,
               (unsigned long long)(s->count / 2));
      s->count /= 2;
      what = buf;
    }
    break;
  case NCFSM_MISMATCH_DTYPE: {
    int dt = same_size_type(s->dtype);
    snprintf(buf, sizeof buf, "dtype %s -> %s", ncfsm_dtype_name((ncfsm_dtype_t)s->dtype),
             ncfsm_dtype_name((ncfsm_dtype_t)dt));
    s->dtype = dt;
    what = buf;
    break;
  }
  case NCFSM_MISMATCH_REDOP:
    if (reducing) {
      int op = s->redop == NCFSM_OP_SUM ? NCFSM_OP_MAX : NCFSM_OP_SUM;
      snprintf(buf, sizeof buf, "redop %s -> %s", ncfsm_redop_name((ncfsm_redop_t)s->redop),
               ncfsm_redop_name((ncfsm_redop_t)op));
      s->redop = op;
      what = buf;
    }
    break;
  case NCFSM_MISMATCH_ROOT:
    if (rooted && c->nranks > 1) {
      int r = (s->root + 1) % c->nranks;
      snprintf(buf, sizeof buf, "root %d -> %d", (int)s->root, r);
      s->root = r;
      what = buf;
    }
    break;
  case NCFSM_MISMATCH_OP:
    if (!p2p) {
      int k = s->kind == NCFSM_KIND_BROADCAST ? NCFSM_KIND_ALLREDUCE : NCFSM_KIND_BROADCAST;
      snprintf(buf, sizeof buf, "%s -> %s", ncfsm_opkind_name((ncfsm_opkind_t)s->kind),
               ncfsm_opkind_name((ncfsm_opkind_t)k));
      s->kind = k;
      s->root = k == NCFSM_KIND_BROADCAST ? 0 : -1;
      s->redop = k == NCFSM_KIND_ALLREDUCE ? NCFSM_OP_SUM : -1;
      what = buf;
    }
    break;
  default: break;
  }
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: injected mismatch at op %llu of rank %d: %s (R11)",
             (unsigned long long)seq, c->rank, what);
}

void ncfsm__sim_fault_poll(sim_comm *c) {
  sim_fstate *fs = c->fs;
  if (!fs) return;
  fs->polls++;
  if (fs->gen != g.gen || !g.active) return;
  uint64_t now = 0;
  for (int i = 0; i < fs->nf; i++) {
    fs_fault *x = &fs->v[i];
    ncfsm_fault *f = &x->f;
    if (f->kind == NCFSM_FAULT_INIT_FAIL || f->kind == NCFSM_FAULT_INIT_HANG || x->done) continue;
    int hit = 0;
    if (f->when == NCFSM_AT_POLL) {
      hit = fs->polls == (f->at ? f->at : 1);
    } else if (f->when == NCFSM_AT_MS) {
      if (!now) now = ncfsm__now_ns();
      hit = now - fs->t0 >= f->at * 1000000ull;
    }
    if (!hit || !fire(fs, x)) continue;
    char where[64];
    snprintf(where, sizeof where, "at poll %llu", (unsigned long long)fs->polls);
    if (f->kind == NCFSM_FAULT_ASYNC_ERROR) {
      int code = f->code ? f->code : NCFSM__NCCL_REMOTE_ERROR;
      if (c->phase == SIM_PH_INIT || c->phase == SIM_PH_REVOKE || c->phase == SIM_PH_XCOMM) {
        fs->phase_err = code; /* these phases end with it (their own bookkeeping runs) */
      } else if (c->state == NCFSM__NCCL_SUCCESS || c->state == NCFSM__NCCL_IN_PROGRESS) {
        /* now, also inside a launch or finalize phase: as a dead peer (sim_exec.c) */
        c->state = code;
        c->phase = SIM_PH_NONE;
        c->armed = 0;
        c->poisoned = 0;
        ncfsm__sim_cwarn(c, "sim: injected async error %d %s (rank %d)", code, where, c->rank);
      }
    } else {
      arm(c, x, where);
    }
  }
}
