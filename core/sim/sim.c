/*
 * ncfsm__backend_sim: a deterministic model of NCCL 2.28 nonblocking
 * behaviour for machines without GPUs. A test double, not NCCL: see
 * docs/sim.md for what it models and what it does not.
 *
 * This file: cliques, communicators, the thread-local group state (R3), the
 * async state machine (R1, R2), the drift limit of launches (R13), argument
 * checks, finalize/destroy/abort/revoke (R4, R5, R6), fork handling and the
 * backend table. Execution and data movement live in
 * sim_exec.c, streams and events in sim_stream.c, types in sim_reduce.c.
 *
 * One process-wide mutex protects all sim state; ranks of a clique may be
 * driven by one thread or several. Progress runs only inside
 * get_async_error and event_query (and blocking waits): no helper threads.
 * Rule ids (R1..R13) refer to shared/design/NCCL-RULES.md.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "core/log.h"
#include "core/sim/sim-faults.h"
#include "core/sim/sim-internal.h"

enum {
  OK = NCFSM__NCCL_SUCCESS,
  E_SYSTEM = NCFSM__NCCL_SYSTEM_ERROR,
  E_ARG = NCFSM__NCCL_INVALID_ARGUMENT,
  E_USAGE = NCFSM__NCCL_INVALID_USAGE,
  E_REMOTE = NCFSM__NCCL_REMOTE_ERROR,
  IN_PROGRESS = NCFSM__NCCL_IN_PROGRESS
};

#define R2_WARN "Attempt to use communicator before the previous operation returned ncclSuccess"
#define MIX_WARN "Blocking and nonblocking communicators are not allowed in the same group."
#define SHRUNK_WARN "communicator was shrunk with NCCL_SHRINK_ABORT; only ncclCommGetAsyncError and ncclCommAbort are allowed on it now (R7)"

pthread_mutex_t ncfsm__sim_mu = PTHREAD_MUTEX_INITIALIZER;
sim_clique *ncfsm__sim_cliques;
sim_clique *ncfsm__sim_inherited;
uint64_t ncfsm__sim_fork_gen;

#define LOCK() pthread_mutex_lock(&ncfsm__sim_mu)
#define UNLOCK() pthread_mutex_unlock(&ncfsm__sim_mu)

static char g_last_error[1024]; /* process-wide, as ncclGetLastError */

/* Thread-local group state, as NCCL's group.cc (R3). */
static __thread int g_depth;         /* ncclGroupDepth */
static __thread int g_err;           /* ncclGroupError: first error of the open group */
static __thread int g_blocking = -1; /* ncclGroupBlocking: -1 unset, 0 nonblocking, 1 blocking */
static __thread int g_dirty;         /* g_blocking was left set by a refused destroy (R4) */
static __thread sim_comm *g_head;    /* comms touched by the open group */
static __thread uint64_t g_nstarts, g_nends; /* explicit calls in the open group (stats) */

/* ---- fork ---------------------------------------------------------------------
 * A child forked from a process with sim comms inherits their memory and the
 * mappings of their cliques, but not their ranks: it must not progress,
 * post to or leave those cliques. At fork the sim's mutex is held (so no
 * other thread of the parent is inside the sim), and in the child the
 * inherited cliques move to ncfsm__sim_inherited and ncfsm__sim_fork_gen
 * changes: every call on an inherited comm but abort returns
 * ncclInvalidUsage with a WARN, and abort frees the child's copy only. */
static void atfork_prepare(void) { LOCK(); }
static void atfork_parent(void) { UNLOCK(); }
static void atfork_child(void) {
  ncfsm__sim_fork_gen++;
  if (ncfsm__sim_cliques) {
    sim_clique **tail = &ncfsm__sim_inherited;
    while (*tail) tail = &(*tail)->next;
    *tail = ncfsm__sim_cliques;
    ncfsm__sim_cliques = NULL;
  }
  for (sim_comm *c = g_head, *nx; c; c = nx) { /* an open group of the forking thread */
    nx = c->grp_next;
    c->grp_next = NULL;
    c->in_group = 0;
  }
  g_head = NULL;
  g_depth = 0;
  g_err = 0;
  g_blocking = -1;
  g_dirty = 0;
  g_nstarts = g_nends = 0;
  UNLOCK();
}
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
static void atfork_register(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

static int comm_foreign(const sim_comm *c) { return c->fork_gen != ncfsm__sim_fork_gen; }

static int foreign_reject(const sim_comm *c, const char *call) {
  ncfsm__sim_warn("%s: this communicator (rank %d) belongs to process %d, and this process (%d) is a "
                  "fork of it: a forked child must not use its parent's communicators (make new ones "
                  "from a unique id; only ncclCommAbort is allowed, and frees this process's copy)",
                  call, c->rank, c->pid, (int)getpid());
  return E_USAGE;
}

static const char *const op_names[NCFSM_OPKIND_COUNT] = {
    "AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter",
    "AlltoAll",  "Gather",    "Scatter", "Send",     "Recv"};

static const char *res_name(int code) {
  static const char *const names[] = {"ncclSuccess",         "ncclUnhandledCudaError",
                                      "ncclSystemError",     "ncclInternalError",
                                      "ncclInvalidArgument", "ncclInvalidUsage",
                                      "ncclRemoteError",     "ncclInProgress",
                                      "ncclTimeout"};
  return (code >= 0 && code < (int)(sizeof names / sizeof names[0])) ? names[code] : "ncclResult(?)";
}

static int warn_to_stderr(void) {
  static int v = -1; /* read under the lock */
  if (v < 0) {
    const char *e = getenv("NCCL_DEBUG");
    v = e && (!strcasecmp(e, "WARN") || !strcasecmp(e, "INFO") || !strcasecmp(e, "TRACE"));
  }
  return v;
}

void ncfsm__sim_warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
  va_end(ap);
  if (warn_to_stderr()) fprintf(stderr, "NCCL WARN %s\n", g_last_error);
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: NCCL WARN %s", g_last_error);
}

static long long wait_limit_ms(void) { return ncfsm__env_ll("NCFSM_SIM_WAIT_MS", 30000); }

static void sleep_1ms(void) {
  struct timespec ts = {0, 1000000};
  nanosleep(&ts, NULL);
}

/* ---- options ---------------------------------------------------------------- */

void ncfsm_sim_opts_init(ncfsm_sim_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->init_polls = (int)ncfsm__env_ll("NCFSM_SIM_INIT_POLLS", 3);
  o->launch_polls = (int)ncfsm__env_ll("NCFSM_SIM_LAUNCH_POLLS", 1);
  o->finalize_polls = (int)ncfsm__env_ll("NCFSM_SIM_FINALIZE_POLLS", 2);
  o->revoke_polls = 1;
  o->group_end_inprogress = (int)ncfsm__env_ll("NCFSM_SIM_GROUP_END_INPROGRESS", 1);
  o->fail_init = 0;
  o->async_error_at_op = -1;
  o->async_error_code = E_REMOTE;
  o->never_arrive = 0;
  o->shuffle_seed = (uint64_t)ncfsm__env_ll("NCFSM_SIM_SEED", 1);
  o->has_revoke = 1;
  o->split_polls = (int)ncfsm__env_ll("NCFSM_SIM_SPLIT_POLLS", 2);
  o->has_grow = ncfsm__env_ll("NCFSM_SIM_NCCL_VERSION", 22809) >= 22900; /* ncclCommGrow: 2.29 */
  o->dead = 0;
}

/* The modelled NCCL version, process-wide (NCFSM_SIM_NCCL_VERSION, default 2.28.9). */
static int sim_version(void) { return (int)ncfsm__env_ll("NCFSM_SIM_NCCL_VERSION", 22809); }

static unsigned sim_features(void) {
  int v = sim_version();
  unsigned f = NCFSM__HAS_ALLTOALL | NCFSM__HAS_GATHER | NCFSM__HAS_SCATTER | NCFSM__HAS_SPLIT;
  if (v >= 22807) f |= NCFSM__HAS_REVOKE; /* R6 */
  if (v >= 22703) f |= NCFSM__HAS_SHRINK; /* R7 */
  if (v >= 22900) f |= NCFSM__HAS_GROW;   /* ncclCommGrow, ncclCommGetUniqueId */
  if (v >= 22304) f |= NCFSM__HAS_INIT_SCALABLE; /* ncclCommInitRankScalable */
  return f;
}

/* ncclCommGrow for a comm with these options: NCCL 2.29, or has_grow. */
static int grow_ok(const ncfsm_sim_opts *o) { return sim_version() >= 22900 || (o && o->has_grow); }

static int sim_open(char *why, size_t why_len) {
  if (why && why_len) why[0] = '\0';
  return 0;
}

/* ---- cliques ---------------------------------------------------------------- */

/* Ranks that ever joined the clique, in any process. */
static int clique_joined(sim_clique *q) {
  if (ncfsm__sim_shm_lock(q)) return 0;
  int n = q->h->joined;
  ncfsm__sim_shm_unlock(q);
  return n;
}

/* Leave the shared clique: the last live rank unlinks the segment; the
 * process's handle goes with its last local comm. */
static void clique_leave(sim_comm *c) {
  sim_clique *q = c->q;
  if (!q) return;
  c->q = NULL;
  q->slot[c->rank] = NULL;
  if (ncfsm__sim_shm_lock(q) == 0) {
    shm_hdr *h = q->h;
    shm_rank *rk = &h->rank[c->rank];
    while (rk->head) ncfsm__sim_shm_op_release(q, rk->head); /* nothing of it stays visible */
    if (rk->live) {
      rk->live = 0;
      h->live--;
    }
    if (h->live <= 0 && !h->unlinked) {
      h->unlinked = 1;
      shm_unlink(q->name);
      NCFSM_INFO(NCFSM__SUB_SIM, "sim: last rank left; unlinked %s", q->name);
    }
    ncfsm__sim_shm_unlock(q);
  }
  if (--q->nlocal <= 0) ncfsm__sim_shm_detach(q);
}

static int sim_get_unique_id(ncfsm_unique_id *id) {
  if (!id) return E_ARG;
  memset(id, 0, sizeof *id);
  size_t got = 0;
  while (got < SIM_ID_KEY_LEN) {
    ssize_t r = getrandom(id->internal + got, SIM_ID_KEY_LEN - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      LOCK();
      ncfsm__sim_warn("ncclGetUniqueId: getrandom failed: %s", strerror(errno));
      UNLOCK();
      return E_SYSTEM;
    }
    got += (size_t)r;
  }
  memcpy(id->internal + SIM_ID_KEY_LEN, SIM_ID_TAG, SIM_ID_TAG_LEN);
  return OK;
}

/* ---- communicators ------------------------------------------------------------ */

static int sim_comm_init(void **bcomm, int nranks, const ncfsm_unique_id *id, int rank,
                         const ncfsm__comm_config *cfg);

/* ncclCommInitRankScalable: the clique is keyed by all nids ids, in order
 * (a rank passing other ids never meets the others, as with NCCL); each id
 * must be the sim's. Otherwise it is comm_init. */
static int sim_comm_init_scalable(void **bcomm, int nranks, const ncfsm_unique_id *ids, int nids, int rank,
                                  const ncfsm__comm_config *cfg) {
  if (bcomm) *bcomm = NULL;
  if (sim_version() < 22304) {
    LOCK();
    ncfsm__sim_warn("ncclCommInitRankScalable needs NCCL 2.23.4 (modelled %d)", sim_version());
    UNLOCK();
    return E_USAGE;
  }
  if (!ids || nids < 1 || nids > nranks) {
    LOCK();
    ncfsm__sim_warn("ncclCommInitRankScalable: nId %d is not in [1, nranks %d]", nids, nranks);
    UNLOCK();
    return E_ARG;
  }
  for (int j = 0; j < nids; j++)
    if (memcmp(ids[j].internal + SIM_ID_KEY_LEN, SIM_ID_TAG, SIM_ID_TAG_LEN)) {
      LOCK();
      ncfsm__sim_warn("ncclCommInitRankScalable: unique id %d was not made by the sim's get_unique_id", j);
      UNLOCK();
      return E_ARG;
    }
  ncfsm_unique_id key;
  memset(&key, 0, sizeof key);
  XXH128_hash_t h = XXH3_128bits(ids, (size_t)nids * sizeof *ids);
  memcpy(key.internal, &h, SIM_ID_KEY_LEN);
  memcpy(key.internal + SIM_ID_KEY_LEN, SIM_ID_TAG, SIM_ID_TAG_LEN);
  return sim_comm_init(bcomm, nranks, &key, rank, cfg);
}

static sim_comm *comm_of(void *bcomm) {
  sim_comm *c = bcomm;
  return (c && c->magic == SIM_MAGIC_COMM) ? c : NULL;
}

/* Per comm: ncfsm_sim_opts.has_revoke = 0 models a 2.28.3 runtime for this
 * communicator only (R6), so ncfsm reports Revoke as unsupported for it. */
static unsigned sim_comm_features(void *bcomm) {
  LOCK();
  sim_comm *c = comm_of(bcomm);
  unsigned f = sim_features();
  if (c && !c->o.has_revoke) f &= ~(unsigned)NCFSM__HAS_REVOKE;
  if (c && grow_ok(&c->o)) f |= NCFSM__HAS_GROW;
  UNLOCK();
  return f;
}

static void lg_leave(sim_comm *c);
static int xop_ready(sim_comm *c);
static int xop_finish(sim_comm *c);
static void xop_free(sim_xop *x);
static int wait_blocking_xops(sim_comm *list);

/* Drop every op not executed yet: posted ops complete on their streams with
 * no data, so the streams drain (R5); unposted ops are discarded. */
static void comm_drop_ops(sim_comm *c) {
  lg_leave(c);
  c->held = 0;
  for (sim_unit *u = c->units, *nx; u; u = nx) {
    nx = u->next;
    ncfsm__sim_unit_drop(u);
  }
  c->units = c->units_tail = NULL;
  ncfsm__sim_unit_drop(c->staged);
  ncfsm__sim_unit_drop(c->pending);
  c->staged = c->pending = NULL;
}

static void comm_free(sim_comm *c) {
  c->magic = SIM_MAGIC_DEAD;
  xop_free(c->xop);
  ncfsm__sim_fault_free(c->fs);
  free(c->nsend);
  free(c->nrecv);
  free(c);
}

/* A forked child's copy of its parent's comm: forget its shared parts
 * without touching them (they are the parent's), then drop what is local. */
static void comm_forget_shared(sim_comm *c) {
  sim_unit *lists[] = {c->units, c->staged, c->pending};
  for (int i = 0; i < 3; i++)
    for (sim_unit *u = lists[i]; u; u = i ? NULL : u->next)
      for (sim_op *o = u->head; o; o = o->next) o->sh = 0;
  comm_drop_ops(c);
  sim_clique *q = c->q;
  c->q = NULL;
  if (q) {
    q->slot[c->rank] = NULL;
    if (--q->nlocal <= 0) ncfsm__sim_shm_detach(q);
  }
}

/* Remove c for good (destroy, abort). While it sits in an open group its
 * memory is kept (zombie) and freed by that group's end. */
static void comm_close(sim_comm *c) {
  if (comm_foreign(c)) comm_forget_shared(c);
  comm_drop_ops(c);
  clique_leave(c);
  if (c->in_group) {
    c->zombie = 1;
    c->magic = SIM_MAGIC_DEAD;
  } else {
    comm_free(c);
  }
}

/* R2/R3 poisoning of a nonblocking comm: its async state becomes
 * ncclInvalidArgument now, or when the running InProgress phase ends. */
static void comm_poison(sim_comm *c) {
  if (c->blocking) return;
  if (c->state == IN_PROGRESS) c->poisoned = 1;
  else if (c->state == OK) c->state = E_ARG;
}

static int unfinished(const sim_comm *c) {
  for (const sim_unit *u = c->units; u; u = u->next)
    if (u->ndone < u->n) return 1;
  return 0;
}

/* Post a unit: its ops get their match indices, go on their streams, and
 * become visible to peers (sim_exec.c). Fault injection happens here. */
static void comm_post(sim_comm *c, sim_unit *u) {
  if (!u) return;
  if (!u->n) {
    free(u);
    return;
  }
  if (c->fs) ncfsm__sim_fault_unit(c, u->n); /* an injected process death */
  sim_clique *q = c->q;
  int locked = q && ncfsm__sim_shm_lock(q) == 0;
  u->no = c->nunits++;
  for (sim_op *o = u->head; o; o = o->next) {
    o->unit = u;
    o->seq = c->nposted++;
    o->counted = 1; /* R13: launched, not executed yet */
    c->outstanding++;
    if (o->a.stream && ncfsm__sim_stream_enqueue(o->a.stream, &o->ticket) == 0)
      o->s = o->a.stream; /* else (out of memory): not tracked by the stream */
    switch (o->a.kind) {
    case NCFSM_KIND_SEND: o->idx = c->nsend[o->a.peer]++; break;
    case NCFSM_KIND_RECV: o->idx = c->nrecv[o->a.peer]++; break;
    default: o->idx = c->ncoll++; break;
    }
    int ferr = c->fs ? ncfsm__sim_fault_op(c, o->seq, o == u->head, o->a.kind != NCFSM_KIND_SEND &&
                                                                      o->a.kind != NCFSM_KIND_RECV)
                     : 0; /* the testing kit's faults (sim-faults.h) */
    if (c->o.never_arrive || c->o.dead) {
      o->invisible = 1; /* fault injection: peers never see this rank's ops (hang) */
    } else if ((c->o.async_error_at_op >= 0 && o->seq == (uint64_t)c->o.async_error_at_op) || ferr) {
      o->dead = 1; /* R10: the op hit by an async error never completes */
      c->state = ferr ? ferr : c->o.async_error_code ? c->o.async_error_code : E_REMOTE;
      ncfsm__sim_warn("sim: injected async error %s at op %llu (%s, rank %d)", res_name(c->state),
                      (unsigned long long)o->seq, op_names[o->a.kind], c->rank);
    }
    /* its shared descriptor: what peers (in any process) match against */
    shm_off off = locked ? ncfsm__sim_shm_alloc(q, sizeof(shm_op), NULL) : 0;
    if (!off) {
      o->dead = 1; /* never executes */
      if (c->state == OK) {
        c->state = E_SYSTEM;
        ncfsm__sim_warn("sim: rank %d: no room in the clique's shared arena for an op descriptor "
                        "(NCFSM_SIM_SHM_BYTES)", c->rank);
      }
      continue;
    }
    shm_op *s = SHM_OP(q, off);
    memset(s, 0, sizeof *s);
    s->rank = c->rank;
    s->kind = (int32_t)o->a.kind;
    s->dtype = (int32_t)o->a.dtype;
    s->redop = (int32_t)o->a.redop;
    s->root = o->a.root;
    s->peer = o->a.peer;
    s->count = o->a.count;
    s->idx = o->idx;
    s->unit = u->no;
    s->flags = (o->invisible ? SHM_OP_INVISIBLE : 0) | (o->dead ? SHM_OP_DEAD : 0);
    if (c->fs) ncfsm__sim_fault_desc(c, o->seq, s); /* an injected mismatch (R11) */
    shm_rank *rk = &q->h->rank[c->rank];
    s->prev = rk->tail;
    if (rk->tail) SHM_OP(q, rk->tail)->next = off;
    else rk->head = off;
    rk->tail = off;
    o->sh = off;
  }
  if (locked) ncfsm__sim_shm_unlock(q);
  if (c->units_tail) c->units_tail->next = u;
  else c->units = u;
  c->units_tail = u;
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d posted %zu op(s)", c->rank, u->n);
}

/* ---- the drift limit (R13) ---------------------------------------------------------
 * Measured on 2.28.3 and 2.28.9: one thread, 2 nonblocking comms of one
 * clique; rank 0 alone got 1,022 launches final, the 1,023rd stayed
 * InProgress (no error) until the peer launched, then became final. The sim
 * counts each comm's launched ops that have not executed (matched by every
 * peer) yet; a launch that would raise that count above the comm's drift
 * limit (NCFSM_SIM_DRIFT_LIMIT, default 1022) is held: its group end stays
 * InProgress, and so do all the comms of that group end, which post together
 * once none of them is held (NCCL's group helper thread launches them all).
 * A launch onto a comm with nothing outstanding is never held, so a single
 * group larger than the limit still runs. */
static int drift_over(const sim_comm *c, size_t n) {
  if (c->drift_limit <= 0 || !n || !c->outstanding) return 0;
  return c->outstanding + n > (uint64_t)c->drift_limit;
}

static void lg_leave(sim_comm *c) {
  sim_lgroup *lg = c->lg;
  if (!lg) return;
  c->lg = NULL;
  for (int i = 0; i < lg->n; i++)
    if (lg->m[i] == c) lg->m[i] = NULL;
  if (--lg->live == 0) free(lg);
}

/* The comm of c's group end (c itself when it has none) whose staged launch
 * is over its drift limit, or NULL. */
static sim_comm *launch_held_by(sim_comm *c) {
  if (!c->lg) return c->staged && drift_over(c, c->staged->n) ? c : NULL;
  for (int i = 0; i < c->lg->n; i++) {
    sim_comm *m = c->lg->m[i];
    if (m && m->phase == SIM_PH_LAUNCH && m->staged && drift_over(m, m->staged->n)) return m;
  }
  return NULL;
}

static void note_held(sim_comm *c, const sim_comm *by) {
  if (c->held) return;
  c->held = 1;
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d: launch held in progress: rank %d%s has %llu launched op(s) "
             "not matched by its peers, and %zu more would exceed the drift limit %lld (R13)", c->rank,
             by->rank, by == c ? "" : " of the same group end", (unsigned long long)by->outstanding,
             by->staged ? by->staged->n : (size_t)0, by->drift_limit);
}

/* Post c's staged unit; returns the launch's final async state. */
static int launch_post(sim_comm *c) {
  sim_unit *u = c->staged;
  c->staged = NULL;
  c->held = 0;
  lg_leave(c);
  c->state = OK;
  comm_post(c, u); /* may set an injected async error */
  return c->state;
}

/* The InProgress phase ends with `final` (R2 poisoning applied). */
static void phase_end(sim_comm *c, int final) {
  static const char *const phase_names[] = {"none", "init", "launch", "finalize", "revoke", "split/shrink/grow"};
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d %s done%s", c->rank, phase_names[c->phase],
             c->poisoned ? " (poisoned, R2)" : "");
  final = ncfsm__sim_fault_phase_end(c, final); /* an injected error (sim-faults.h) */
  c->phase = SIM_PH_NONE;
  c->armed = 0;
  if (c->poisoned && final == OK) final = E_ARG; /* R2 poisoning */
  c->poisoned = 0;
  c->state = final;
}

/* c's group end may launch: post every staged member, c last. */
static int launch_group(sim_comm *c) {
  if (c->lg)
    for (int i = 0; i < c->lg->n; i++) { /* c stays a member until its own post: lg lives */
      sim_comm *m = c->lg->m[i];
      if (m && m != c && m->phase == SIM_PH_LAUNCH && m->staged) phase_end(m, launch_post(m));
    }
  return launch_post(c);
}

/* One poll of a comm's InProgress phase (R1): the first `countdown` polls
 * still return InProgress; a later one ends the phase once its condition holds. */
static void comm_tick(sim_comm *c) {
  if (c->phase == SIM_PH_NONE || !c->armed) return;
  if (c->countdown > 0) {
    c->countdown--;
    return;
  }
  int final = OK;
  switch (c->phase) {
  case SIM_PH_INIT:
    if (c->q && clique_joined(c->q) < c->nranks) return; /* a missing rank keeps everyone waiting */
    if (c->o.fail_init) {
      final = c->o.fail_init;
      ncfsm__sim_warn("sim: injected init failure %s (rank %d)", res_name(final), c->rank);
    }
    break;
  case SIM_PH_FINALIZE:
    if (unfinished(c)) return; /* R4: finalize flushes outstanding work */
    c->finalized = 1;
    break;
  case SIM_PH_LAUNCH: {
    sim_comm *by = launch_held_by(c);
    if (by) { /* R13: InProgress, no error, until the peers caught up */
      note_held(c, by);
      return;
    }
    if (c->lg) /* a slow rank injected by the testing kit holds its whole group end */
      for (int i = 0; i < c->lg->n; i++)
        if (c->lg->m[i] && c->lg->m[i] != c && ncfsm__sim_fault_holds(c->lg->m[i])) return;
    final = launch_group(c);
    break;
  }
  case SIM_PH_REVOKE: final = c->revoke_prev; break;
  case SIM_PH_XCOMM: { /* R7, R8: every member called; the child is made and written now */
    int r = xop_ready(c);
    if (r == 0) return;
    final = r > 0 ? xop_finish(c) : -r;
    xop_free(c->xop);
    c->xop = NULL;
    break;
  }
  default: break;
  }
  phase_end(c, final);
}

/* ---- thread-local groups (R3) ------------------------------------------------------ */

static void group_track(sim_comm *c) {
  if (c->in_group) return;
  c->in_group = 1;
  c->grp_next = g_head;
  g_head = c;
}

/* A call failed: the group remembers the first error (ncclGroupErrCheck); a
 * nonblocking comm rejected with ncclInvalidArgument is poisoned at the
 * outermost group end (R2, R3). */
static void group_fail(sim_comm *c, int rc) {
  if (!g_err) g_err = rc;
  if (!c) return;
  c->st.rejected++;
  if (!c->blocking && rc == E_ARG) {
    c->arg_err = 1;
    group_track(c);
  }
}

/* R3: one group may not mix blocking and nonblocking comms. */
static int group_mode_check(int blocking) {
  if (g_blocking != -1 && g_blocking != blocking) {
    ncfsm__sim_warn(MIX_WARN);
    return E_ARG;
  }
  return OK;
}

/* Outermost group end, blocking comms: their inits complete once every rank
 * of their cliques arrived (the lock is dropped while waiting). */
static int wait_blocking_inits(sim_comm *list) {
  uint64_t deadline = ncfsm__now_ns() + (uint64_t)wait_limit_ms() * 1000000ull;
  for (;;) {
    int ready = 1;
    for (sim_comm *c = list; c; c = c->grp_next)
      if (!c->zombie && c->init_in_group && c->q && clique_joined(c->q) < c->nranks) ready = 0;
    if (ready) break;
    if (ncfsm__now_ns() >= deadline) {
      ncfsm__sim_warn("ncclCommInitRank: peers never arrived within %lld ms (sim, NCFSM_SIM_WAIT_MS)",
                      wait_limit_ms());
      for (sim_comm *c = list; c; c = c->grp_next)
        if (!c->zombie && c->init_in_group) {
          c->init_in_group = 0;
          c->phase = SIM_PH_NONE;
          c->state = E_SYSTEM;
        }
      return E_SYSTEM;
    }
    UNLOCK();
    sleep_1ms();
    LOCK();
  }
  int rc = OK;
  for (sim_comm *c = list; c; c = c->grp_next) {
    if (c->zombie || !c->init_in_group) continue;
    c->init_in_group = 0;
    c->phase = SIM_PH_NONE;
    c->state = c->o.fail_init ? c->o.fail_init : OK;
    if (c->o.fail_init) {
      ncfsm__sim_warn("sim: injected init failure %s (rank %d)", res_name(c->state), c->rank);
      if (!rc) rc = c->state;
    }
  }
  return rc;
}

/* Outermost group end, blocking comms (R13): NCCL's group end does not return
 * while a launch is held; the sim waits (lock released, progress running)
 * until every staged blocking comm of the group is within its drift limit,
 * then posts them; after NCFSM_SIM_WAIT_MS it gives up with ncclSystemError
 * (real NCCL would wait for ever). */
static int wait_blocking_launches(sim_comm *list) {
  uint64_t deadline = 0;
  for (;;) {
    sim_comm *held = NULL;
    for (sim_comm *c = list; c && !held; c = c->grp_next)
      if (!c->zombie && c->blocking && c->staged && c->state == OK && drift_over(c, c->staged->n)) held = c;
    if (!held) break;
    uint64_t now = ncfsm__now_ns();
    if (!deadline) {
      deadline = now + (uint64_t)wait_limit_ms() * 1000000ull;
      NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d: blocking launch waits: %llu launched op(s) not matched "
                 "by its peers, drift limit %lld (R13)", held->rank, (unsigned long long)held->outstanding,
                 held->drift_limit);
    }
    if (now >= deadline) {
      ncfsm__sim_warn("ncclGroupEnd: rank %d has %llu launched operations that its peers have not "
                      "matched; %zu more exceed the sim's drift limit %lld and its launch waited %lld ms "
                      "for the peers (NCFSM_SIM_DRIFT_LIMIT, NCFSM_SIM_WAIT_MS; R13: NCCL would wait for "
                      "ever)", held->rank, (unsigned long long)held->outstanding, held->staged->n,
                      held->drift_limit, wait_limit_ms());
      for (sim_comm *c = list; c; c = c->grp_next)
        if (!c->zombie && c->blocking && c->staged) {
          ncfsm__sim_unit_drop(c->staged);
          c->staged = NULL;
          if (c->state == OK) c->state = E_SYSTEM;
        }
      return E_SYSTEM;
    }
    UNLOCK();
    sleep_1ms();
    LOCK();
    ncfsm__sim_progress();
  }
  int rc = OK;
  for (sim_comm *c = list; c; c = c->grp_next) {
    if (c->zombie || !c->blocking || !c->staged) continue;
    sim_unit *u = c->staged;
    c->staged = NULL;
    if (c->state != OK) { /* e.g. a peer died while it waited */
      ncfsm__sim_unit_drop(u);
      if (!rc) rc = c->state;
      continue;
    }
    comm_post(c, u);
  }
  return rc;
}

/* Outermost group end, nonblocking comms: the nstaged comms of list whose
 * launch was staged form one launch group (R13). With group_end_inprogress
 * = 0 (2.22) a comm posts at once, unless the group is held. Returns 1 when
 * a comm stays InProgress. */
static int launch_stage(sim_comm *list, int nstaged) {
  sim_lgroup *lg = calloc(1, sizeof *lg + (size_t)nstaged * sizeof lg->m[0]);
  sim_comm *any = NULL;
  for (sim_comm *c = list; c; c = c->grp_next) {
    if (c->zombie || c->blocking || c->phase != SIM_PH_LAUNCH || !c->staged || c->lg) continue;
    any = c;
    if (lg && lg->n < nstaged) {
      lg->m[lg->n++] = c;
      c->lg = lg;
    }
  }
  if (lg) {
    lg->live = lg->n;
    if (!lg->n) free(lg);
  } /* out of memory: every comm is a launch of its own */
  if (!any) return 0;
  int ip = 0;
  sim_comm *by = any->lg ? launch_held_by(any) : NULL;
  for (sim_comm *c = list; c; c = c->grp_next) {
    if (c->zombie || c->blocking || c->phase != SIM_PH_LAUNCH || !c->staged) continue;
    sim_comm *cby = c->lg ? by : launch_held_by(c);
    if (!c->o.group_end_inprogress && !cby) {
      phase_end(c, launch_post(c)); /* 2.22: posted at once */
      continue;
    }
    if (cby) note_held(c, cby);
    ip = 1;
  }
  return ip;
}

/* The outermost ncclGroupEnd (explicit, or the implicit group of a single
 * call): launches the group, or on a stored error discards it. */
static int group_finish(void) {
  int rc = g_err, any_ip = 0, any_blocking_init = 0, any_blocking_x = 0, nblocking = 0, nstaged = 0;
  sim_comm *list = g_head;
  uint64_t ns = g_nstarts, ne = g_nends;
  g_head = NULL; /* reset first: blocking waits below drop the lock */
  g_err = 0;
  g_blocking = -1;
  g_dirty = 0;
  g_nstarts = g_nends = 0;

  for (sim_comm *c = list; c; c = c->grp_next) {
    if (c->zombie) continue;
    c->st.group_starts += ns;
    c->st.group_ends += ne;
    if (rc) { /* R3: the group's ops never launch; argument errors poison */
      ncfsm__sim_unit_drop(c->pending);
      c->pending = NULL;
      if (c->init_in_group) {
        c->init_in_group = 0;
        c->phase = SIM_PH_NONE;
        c->state = rc;
      }
      if (c->xop && c->xop->in_group) { /* the split/shrink/grow is not made on this rank */
        xop_free(c->xop);
        c->xop = NULL;
        c->phase = SIM_PH_NONE;
        c->state = OK;
      }
      if (c->arg_err) comm_poison(c);
      c->arg_err = 0;
      continue;
    }
    c->arg_err = 0;
    if (c->init_in_group) {
      if (c->blocking) {
        any_blocking_init = 1;
      } else { /* R1: init runs now, polls count down */
        c->init_in_group = 0;
        c->armed = 1;
        any_ip = 1;
      }
    }
    if (c->xop && c->xop->in_group) {
      c->xop->in_group = 0;
      if (c->blocking) {
        any_blocking_x = 1;
      } else { /* R1, R8: the parent polls split_polls times, then until every member called */
        c->armed = 1;
        any_ip = 1;
      }
    }
    if (c->pending) {
      sim_unit *u = c->pending;
      c->pending = NULL;
      if (c->staged) { /* cannot happen: ops are rejected while InProgress (R2) */
        ncfsm__sim_unit_drop(u);
        continue;
      }
      c->staged = u;
      if (c->blocking) {
        nblocking++; /* posted below, once not held (R13) */
      } else {
        /* R1 (2.28): the group end returns InProgress; ops post after launch_polls. */
        c->state = IN_PROGRESS;
        c->phase = SIM_PH_LAUNCH;
        c->countdown = ncfsm__sim_fault_phase(c, SIM_PH_LAUNCH,
                                              c->o.group_end_inprogress ? c->o.launch_polls : 0, u->n);
        c->armed = 1;
        nstaged++;
      }
    }
  }
  if (!rc && any_blocking_init) rc = wait_blocking_inits(list);
  if (any_blocking_x) {
    int xrc = wait_blocking_xops(list);
    if (!rc) rc = xrc;
  }
  if (nblocking) {
    int brc = wait_blocking_launches(list);
    if (!rc) rc = brc;
  }
  if (nstaged) any_ip |= launch_stage(list, nstaged);
  if (!rc && any_ip) rc = IN_PROGRESS;
  for (sim_comm *c = list, *nx; c; c = nx) {
    nx = c->grp_next;
    c->grp_next = NULL;
    c->in_group = 0;
    if (c->zombie) comm_free(c);
  }
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: group end -> %s", res_name(rc));
  return rc;
}

static int sim_group_start(void) {
  LOCK();
  g_depth++;
  g_nstarts++;
  UNLOCK();
  return OK;
}

static int sim_group_end(void) {
  LOCK();
  int rc = OK;
  if (g_depth == 0) {
    ncfsm__sim_warn("ncclGroupEnd: not in a group call."); /* R3 */
    rc = E_USAGE;
  } else {
    g_nends++;
    if (--g_depth == 0) rc = group_finish(); /* only the outermost end launches (R3) */
  }
  UNLOCK();
  return rc;
}

/* Every call outside an explicit group is an implicit group of one
 * (ncclGroupStartInternal ... ncclGroupEndInternal). */
static int implicit_begin(void) {
  if (g_depth) return 0;
  g_depth = 1;
  return 1;
}
static int implicit_end(int implicit) {
  if (!implicit) return OK;
  g_depth = 0;
  return group_finish();
}

/* ---- init ------------------------------------------------------------------------ */

static sim_clique *clique_find_key(const unsigned char *key) {
  for (sim_clique *q = ncfsm__sim_cliques; q; q = q->next)
    if (!memcmp(q->key, key, SIM_ID_KEY_LEN)) return q;
  return NULL;
}

/* Make rank `rank` of the clique `key`: attach to (or create) its segment and
 * join its membership. The new comm is InProgress in its init phase (not
 * armed). The caller checked the arguments (rank in range) and the group
 * mode; `call` names the NCCL call in WARNs. */
static int comm_make(sim_comm **out, int nranks, const unsigned char *key, int rank, int blocking,
                     int device, const ncfsm_sim_opts *so, const char *name, const char *call) {
  sim_clique *q = clique_find_key(key);
  if (q && q->nranks != nranks) {
    ncfsm__sim_warn("%s: nranks %d differs from %d of the ranks already joined (sim)", call, nranks,
                    q->nranks);
    return E_ARG;
  }
  if (q && q->slot[rank]) {
    ncfsm__sim_warn("%s: rank %d already joined this clique (sim)", call, rank);
    return E_ARG;
  }
  pthread_once(&g_atfork_once, atfork_register);

  ncfsm_sim_opts o;
  if (so) o = *so;
  else ncfsm_sim_opts_init(&o);

  sim_comm *c = calloc(1, sizeof *c);
  if (c) {
    c->nsend = calloc((size_t)nranks, sizeof *c->nsend);
    c->nrecv = calloc((size_t)nranks, sizeof *c->nrecv);
  }
  if (!c || !c->nsend || !c->nrecv) {
    if (c) {
      free(c->nsend);
      free(c->nrecv);
      free(c);
    }
    ncfsm__sim_warn("%s: out of memory", call);
    return E_SYSTEM;
  }
  /* the testing kit's plan (sim-faults.h): options, shuffle seed, faults */
  c->fs = ncfsm__sim_fault_bind(&o, name, rank);
  int fresh = 0, rc = OK;
  if (!q) { /* this process's first rank of the clique: attach to (or create) the segment */
    rc = ncfsm__sim_shm_attach(key, nranks, o.shuffle_seed, &q);
    fresh = rc == OK;
  }
  if (rc == OK && ncfsm__sim_shm_lock(q)) rc = E_SYSTEM;
  if (rc == OK) {
    shm_hdr *h = q->h;
    if (h->nranks != nranks) {
      ncfsm__sim_warn("%s: nranks %d differs from %d of the ranks already joined (sim)", call, nranks,
                      h->nranks);
      rc = E_ARG;
    } else if (h->rank[rank].used) {
      ncfsm__sim_warn("%s: rank %d already joined this clique (sim, pid %d)", call, rank,
                      (int)h->rank[rank].pid);
      rc = E_ARG;
    } else {
      h->rank[rank].used = 1;
      h->rank[rank].live = 1;
      h->rank[rank].pid = (int)getpid();
      h->joined++;
      h->live++;
    }
    ncfsm__sim_shm_unlock(q);
  }
  if (rc != OK) {
    if (fresh) ncfsm__sim_shm_detach(q); /* the segment stays for the ranks that own it */
    ncfsm__sim_fault_free(c->fs);
    free(c->nsend);
    free(c->nrecv);
    free(c);
    return rc;
  }
  c->magic = SIM_MAGIC_COMM;
  c->q = q;
  c->rank = rank;
  c->nranks = nranks;
  c->blocking = blocking ? 1 : 0;
  c->device = device;
  c->o = o;
  c->drift_limit = ncfsm__env_ll("NCFSM_SIM_DRIFT_LIMIT", 1022); /* R13 */
  c->pid = (int)getpid();
  c->fork_gen = ncfsm__sim_fork_gen;
  snprintf(c->name, sizeof c->name, "%s", name ? name : "");
  c->state = IN_PROGRESS;
  c->phase = SIM_PH_INIT;
  c->countdown = ncfsm__sim_fault_phase(c, SIM_PH_INIT, o.init_polls, 0);
  q->slot[rank] = c;
  q->nlocal++;
  *out = c;
  return OK;
}

static int comm_create(sim_comm **out, int nranks, const unsigned char *key, int rank,
                       const ncfsm__comm_config *cfg, const char *call) {
  sim_clique *q = clique_find_key(key);
  if (q && q->nranks == nranks && q->slot[rank] && q->slot[rank]->state == IN_PROGRESS) {
    ncfsm__sim_warn(R2_WARN); /* R2: init again while the first is in progress */
    group_fail(q->slot[rank], E_ARG);
    return E_ARG;
  }
  int blocking = cfg->blocking ? 1 : 0;
  if ((!q || (q->nranks == nranks && !q->slot[rank])) && group_mode_check(blocking))
    return E_ARG; /* R3, and the R4 cascade */
  return comm_make(out, nranks, key, rank, blocking, cfg->device, cfg->sim, cfg->name, call);
}

static int sim_comm_init(void **bcomm, int nranks, const ncfsm_unique_id *id, int rank,
                         const ncfsm__comm_config *cfg) {
  LOCK();
  int implicit = implicit_begin(), rc = OK;
  sim_comm *c = NULL;
  if (bcomm) *bcomm = NULL;
  if (!bcomm || !id || !cfg) {
    ncfsm__sim_warn("ncclCommInitRankConfig : invalid argument (NULL pointer)");
    rc = E_ARG;
  } else if (nranks < 1 || rank < 0 || rank >= nranks) {
    ncfsm__sim_warn("Invalid rank requested : %d/%d", rank, nranks);
    rc = E_ARG;
  } else if (memcmp(id->internal + SIM_ID_KEY_LEN, SIM_ID_TAG, SIM_ID_TAG_LEN)) {
    ncfsm__sim_warn("ncclCommInitRank: unique id was not made by the sim's get_unique_id");
    rc = E_ARG;
  } else {
    rc = comm_create(&c, nranks, (const unsigned char *)id->internal, rank, cfg, "ncclCommInitRank");
  }
  if (rc) {
    group_fail(NULL, rc);
  } else {
    c->st.inits++;
    c->init_in_group = 1; /* completes (blocking) or arms (nonblocking) at the outermost end */
    group_track(c);
    g_blocking = c->blocking;
    *bcomm = c;
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d/%d init (%s%s%s)", rank, nranks,
               c->blocking ? "blocking" : "nonblocking", c->name[0] ? ", " : "", c->name);
  }
  int grc = implicit_end(implicit);
  if (!rc) {
    if (implicit) rc = c->blocking ? grc : c->state; /* R1: nonblocking -> InProgress */
    else rc = OK; /* measured on 2.28.3/2.28.9: inside a group the init call returns ncclSuccess;
                     the outermost group end returns InProgress (docs/conformance.md, row init) */
  }
  UNLOCK();
  return rc;
}

/* ---- split, shrink, grow (R7, R8; ncclCommGrow: NCCL 2.29) ----------------------------
 * docs/sim.md "Split, shrink, grow and dead ranks". A call publishes this
 * rank's record (color and key, exclude list, grow size and id) in the
 * parent clique's segment and puts the parent InProgress (nonblocking: for
 * split_polls polls, then until every member published its record; blocking:
 * the call waits). When the rendezvous is complete, each member computes its
 * child from the records alone (same in every process): the child's clique
 * key is derived from the parent's key, the kind, the per-kind call number and
 * the color (split) or the exclude list (shrink), or comes from the grow id.
 * The child is then made as an init of that clique, written to *child (R8: a
 * nonblocking parent's child only once the parent polls to success) and
 * polls its own init. */

static const char *const x_call[SIM_X_KINDS] = {"ncclCommSplit", "ncclCommShrink", "ncclCommGrow"};

/* A grow id: [0,16) the new clique's key, [16,24) SIM_ID_TAG, [24,28) "GROW",
 * [28,44) the parent clique's key, [44,48) the parent's nranks (int32). */
#define GROW_TAG "GROW"
#define GROW_TAG_OFF (SIM_ID_KEY_LEN + SIM_ID_TAG_LEN)
#define GROW_PARENT_OFF (GROW_TAG_OFF + 4)
#define GROW_NRANKS_OFF (GROW_PARENT_OFF + SIM_ID_KEY_LEN)

static int is_grow_id(const ncfsm_unique_id *id) {
  return !memcmp(id->internal + SIM_ID_KEY_LEN, SIM_ID_TAG, SIM_ID_TAG_LEN) &&
         !memcmp(id->internal + GROW_TAG_OFF, GROW_TAG, 4);
}

static int grow_id_nranks(const ncfsm_unique_id *id) {
  int32_t n;
  memcpy(&n, id->internal + GROW_NRANKS_OFF, sizeof n);
  return (int)n;
}

/* Grow cliques this process had a rank of (a ring): a joiner that arrives
 * once such a clique is gone here is refused (ids are single-use). */
static unsigned char g_grow_done[64][SIM_ID_KEY_LEN];
static unsigned g_grow_done_n;

static int grow_done_local(const unsigned char *key) {
  unsigned n = g_grow_done_n < 64 ? g_grow_done_n : 64;
  for (unsigned i = 0; i < n; i++)
    if (!memcmp(g_grow_done[i], key, SIM_ID_KEY_LEN)) return 1;
  return 0;
}

static void grow_done_mark(const unsigned char *key) {
  if (grow_done_local(key)) return;
  memcpy(g_grow_done[g_grow_done_n % 64], key, SIM_ID_KEY_LEN);
  g_grow_done_n++;
}

static int random_key(unsigned char *key) {
  size_t got = 0;
  while (got < SIM_ID_KEY_LEN) {
    ssize_t r = getrandom(key + got, SIM_ID_KEY_LEN - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    got += (size_t)r;
  }
  return 0;
}

static uint64_t mix64(uint64_t z) { /* splitmix64's finalizer */
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The child clique's key, from what every member knows alike. */
static void derive_key(const unsigned char *parent, int tag, uint64_t n, uint64_t v, unsigned char *out) {
  uint64_t a, b;
  memcpy(&a, parent, 8);
  memcpy(&b, parent + 8, 8);
  uint64_t s = mix64(mix64((uint64_t)tag) ^ mix64(n) ^ mix64(v ^ 0x5bd1e995ull));
  uint64_t k0 = mix64(a ^ s), k1 = mix64(b ^ mix64(s ^ k0));
  memcpy(out, &k0, 8);
  memcpy(out + 8, &k1, 8);
}

static void xop_free(sim_xop *x) {
  if (!x) return;
  free(x->exclude);
  free(x);
}

static int excluded(const sim_xop *x, int r) {
  for (int i = 0; i < x->nexclude; i++)
    if (x->exclude[i] == r) return 1;
  return 0;
}

static int grow_used_shared(sim_comm *c, const unsigned char *key) {
  if (!c->q || ncfsm__sim_shm_lock(c->q)) return 0;
  shm_hdr *h = c->q->h;
  int used = 0;
  unsigned n = h->grow_used_n < 4 ? h->grow_used_n : 4;
  for (unsigned i = 0; i < n; i++) used |= !memcmp(h->grow_used[i], key, SIM_ID_KEY_LEN);
  ncfsm__sim_shm_unlock(c->q);
  return used;
}

/* The parent may be split, shrunk or grown now (R2, R6, R7, R8); else the
 * WARN and the code NCCL (or the sim, naming the rule) rejects it with. */
static int xcomm_admit(sim_comm *c, int kind, int flags) {
  const char *call = x_call[kind];
  int abort = kind == SIM_X_SHRINK && (flags & NCFSM__SHRINK_ABORT);
  if (comm_foreign(c)) return foreign_reject(c, call);
  if (c->state == IN_PROGRESS) {
    ncfsm__sim_warn(R2_WARN); /* R2 */
    return E_ARG;
  }
  if (c->shrink_aborted) {
    ncfsm__sim_warn("%s: " SHRUNK_WARN, call);
    return E_USAGE;
  }
  if (kind == SIM_X_SHRINK && sim_version() < 22703) {
    ncfsm__sim_warn("ncclCommShrink not available (NCCL %d, needs >= 2.27.3) (R7)", sim_version());
    return E_USAGE;
  }
  if (kind == SIM_X_GROW && !grow_ok(&c->o)) {
    ncfsm__sim_warn("ncclCommGrow needs NCCL 2.29 (modelled %d, ncfsm_sim_opts.has_grow = 0)", sim_version());
    return E_USAGE;
  }
  if (c->xop) {
    ncfsm__sim_warn("%s: a split, shrink or grow of this communicator is already pending in this group "
                    "(sim)", call);
    return E_USAGE;
  }
  if (c->finalized) {
    ncfsm__sim_warn("%s: communicator was finalized (sim)", call);
    return E_USAGE;
  }
  if (c->revoked) {
    if (kind == SIM_X_SHRINK) return OK; /* R6: its work was stopped; shrink (either mode) is the way on */
    ncfsm__sim_warn("%s: communicator was revoked: only ncclCommShrink, ncclCommDestroy and ncclCommAbort "
                    "are allowed on it (sim; R6, R8: %s needs a healthy parent)", call, call);
    return E_USAGE;
  }
  if (c->state != OK) {
    if (abort) return OK; /* R7: the recovery path */
    ncfsm__sim_warn("%s: the parent communicator is in error state %s; %s", call, res_name(c->state),
                    kind == SIM_X_SHRINK ? "shrink it with NCCL_SHRINK_ABORT (R7)"
                                         : "it needs a healthy parent: shrink it with NCCL_SHRINK_ABORT, or "
                                           "abort it (R7, R8)");
    return E_USAGE;
  }
  if (abort) return OK; /* its outstanding work is terminated */
  ncfsm__sim_progress(); /* collect what executed */
  uint64_t n = c->outstanding + (c->pending ? c->pending->n : 0) + (c->staged ? c->staged->n : 0);
  if (n || unfinished(c)) {
    ncfsm__sim_warn("%s: the parent communicator has %llu operation(s) outstanding; NCCL needs a parent "
                    "with no outstanding work (%s)", call, (unsigned long long)n,
                    kind == SIM_X_SHRINK ? "R7: wait for them, or shrink with NCCL_SHRINK_ABORT"
                    : kind == SIM_X_SPLIT ? "R8: wait for them first"
                                          : "wait for them first");
    return E_USAGE;
  }
  return OK;
}

static sim_xop *xop_new(const sim_comm *c, int kind, void **child, const ncfsm__comm_config *cfg) {
  sim_xop *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  x->kind = kind;
  x->child_out = child;
  x->blocking = cfg->blocking ? 1 : 0;
  x->device = cfg->device;
  if (cfg->sim) x->o = *cfg->sim;
  else ncfsm_sim_opts_init(&x->o);
  if (c->o.dead) x->o.dead = 1; /* a dead process's children are dead too */
  snprintf(x->name, sizeof x->name, "%s", cfg->name ? cfg->name : "");
  return x;
}

/* Publish this rank's record in the parent's segment (a dead rank's never
 * reaches its peers) and put the parent in the split/shrink/grow phase,
 * armed or waited for at the outermost group end. Takes x. */
static int xop_start(sim_comm *c, sim_xop *x) {
  sim_clique *q = c->q;
  if (!q || ncfsm__sim_shm_lock(q)) {
    xop_free(x);
    return E_SYSTEM;
  }
  shm_hdr *h = q->h;
  shm_rank *rk = &h->rank[c->rank];
  x->n = rk->xn[x->kind];
  if (!c->o.dead) {
    shm_xrec *r = &rk->x[x->kind][x->n % 2];
    memset(r, 0, sizeof *r);
    switch (x->kind) {
    case SIM_X_SPLIT:
      r->a = x->color;
      r->b = x->key;
      break;
    case SIM_X_SHRINK: r->hash = x->hash; break;
    default:
      r->a = x->grow_nranks;
      r->b = x->has_id;
      if (x->has_id) {
        memcpy(r->key, x->grow_key, SIM_ID_KEY_LEN);
        memcpy(h->grow_used[h->grow_used_n % 4], x->grow_key, SIM_ID_KEY_LEN); /* single-use */
        h->grow_used_n++;
      }
      break;
    }
    r->seq = x->n + 1;
    rk->xn[x->kind] = x->n + 1;
    x->published = 1;
  }
  ncfsm__sim_shm_unlock(q);
  c->xop = x;
  x->in_group = 1;
  c->phase = SIM_PH_XCOMM;
  c->state = IN_PROGRESS;
  c->countdown = ncfsm__sim_fault_phase(c, SIM_PH_XCOMM, c->o.split_polls, 0);
  c->armed = 0;
  group_track(c);
  g_blocking = c->blocking;
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d %s (call %llu)%s", c->rank, x_call[x->kind],
             (unsigned long long)x->n, x->published ? "" : ": dead rank, never reaches its peers");
  return OK;
}

/* 1: every member made this call; 0: not yet; -code: it cannot complete. */
static int xop_ready(sim_comm *c) {
  sim_xop *x = c->xop;
  if (!x) return -E_SYSTEM;
  if (!x->published) return 0; /* a dead rank: its call never completes */
  sim_clique *q = c->q;
  if (!q || ncfsm__sim_shm_lock(q)) return -E_SYSTEM;
  ncfsm__sim_shm_check_peers(q);
  shm_hdr *h = q->h;
  const char *call = x_call[x->kind];
  int waiting = 0, err = 0, holders = 0;
  for (int p = 0; p < h->nranks && !err; p++) {
    if (x->kind == SIM_X_SHRINK && excluded(x, p)) continue;
    const shm_rank *rk = &h->rank[p];
    if (rk->xn[x->kind] <= x->n) {
      if (rk->dead) {
        ncfsm__sim_warn("sim: rank %d: parent rank %d (pid %d) died before calling %s; it cannot complete "
                        "(ncclRemoteError; shrink the parent with NCCL_SHRINK_ABORT, excluding it)", c->rank,
                        p, (int)rk->pid, call);
        err = E_REMOTE;
      }
      waiting = 1;
      continue;
    }
    const shm_xrec *r = &rk->x[x->kind][x->n % 2];
    if (r->seq != x->n + 1) {
      ncfsm__sim_warn("%s: rank %d made a different number of %s calls on this communicator than rank %d "
                      "(sim: every member makes the same sequence of them)", call, p, call, c->rank);
      err = E_ARG;
    } else if (x->kind == SIM_X_SHRINK && r->hash != x->hash) {
      ncfsm__sim_warn("ncclCommShrink: ranks %d and %d passed different exclude lists (R7)", c->rank, p);
      err = E_ARG;
    } else if (x->kind == SIM_X_GROW) {
      if (r->a != x->grow_nranks) {
        ncfsm__sim_warn("ncclCommGrow: ranks %d and %d passed different nranks (%d, %d)", c->rank, p,
                        x->grow_nranks, (int)r->a);
        err = E_ARG;
      }
      if (r->b) {
        holders++;
        memcpy(x->grow_key, r->key, SIM_ID_KEY_LEN);
      }
    }
  }
  if (!err && !waiting && x->kind == SIM_X_GROW && holders != 1) {
    ncfsm__sim_warn("ncclCommGrow: %d existing ranks passed the unique id; exactly one must (the rank that "
                    "made it with ncclCommGetUniqueId; the others pass NULL)", holders);
    err = E_ARG;
  }
  ncfsm__sim_shm_unlock(q);
  return err ? -err : !waiting;
}

/* Every member made the call: make this rank's child (or none) and write it. */
static int xop_finish(sim_comm *c) {
  sim_xop *x = c->xop;
  sim_clique *q = c->q;
  unsigned char key[SIM_ID_KEY_LEN];
  int nranks = 0, rank = 0;
  if (ncfsm__sim_shm_lock(q)) return E_SYSTEM;
  shm_hdr *h = q->h;
  switch (x->kind) {
  case SIM_X_SPLIT:
    for (int p = 0; p < h->nranks; p++) {
      const shm_xrec *r = &h->rank[p].x[SIM_X_SPLIT][x->n % 2];
      if (r->a != x->color) continue;
      nranks++;
      if (r->b < x->key || (r->b == x->key && p < c->rank)) rank++; /* by key, then parent rank */
    }
    derive_key(q->key, 'S', x->n, (uint64_t)(uint32_t)x->color, key);
    break;
  case SIM_X_SHRINK:
    nranks = h->nranks - x->nexclude;
    rank = c->rank;
    for (int i = 0; i < x->nexclude; i++) rank -= x->exclude[i] < c->rank;
    derive_key(q->key, 'K', x->n, x->hash, key);
    break;
  default:
    nranks = x->grow_nranks;
    rank = c->rank;
    memcpy(key, x->grow_key, SIM_ID_KEY_LEN);
    break;
  }
  ncfsm__sim_shm_unlock(q);
  if (x->kind == SIM_X_SPLIT && x->color == NCFSM__SPLIT_NOCOLOR) {
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d split with NCCL_SPLIT_NOCOLOR: no child", c->rank);
    return OK; /* *child stays NULL */
  }
  sim_comm *child = NULL;
  int rc = comm_make(&child, nranks, key, rank, x->blocking, x->device, &x->o, x->name, x_call[x->kind]);
  if (rc) return rc;
  if (x->kind == SIM_X_GROW) grow_done_mark(key);
  if (!c->blocking || !child->blocking) child->armed = 1; /* polls its own init (R8) */
  x->child = child;
  *x->child_out = child;
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d %s done: child rank %d/%d", c->rank, x_call[x->kind], rank,
             nranks);
  return OK;
}

/* Outermost group end, blocking parents: wait (lock released) until every
 * member called, make the children, then wait for the blocking children's
 * inits (every child rank made), at most NCFSM_SIM_WAIT_MS each. */
static int wait_blocking_xops(sim_comm *list) {
  uint64_t deadline = ncfsm__now_ns() + (uint64_t)wait_limit_ms() * 1000000ull;
  for (;;) {
    int waiting = 0;
    for (sim_comm *c = list; c; c = c->grp_next) {
      sim_xop *x = c->xop;
      if (c->zombie || !c->blocking || !x || x->done || c->phase != SIM_PH_XCOMM) continue;
      int r = xop_ready(c);
      if (!r) {
        waiting = 1;
        continue;
      }
      x->final = r > 0 ? xop_finish(c) : -r;
      x->done = 1;
    }
    if (!waiting) break;
    if (ncfsm__now_ns() >= deadline) {
      ncfsm__sim_warn("ncclCommSplit/Shrink/Grow: peers never called within %lld ms (sim, NCFSM_SIM_WAIT_MS)",
                      wait_limit_ms());
      for (sim_comm *c = list; c; c = c->grp_next)
        if (!c->zombie && c->blocking && c->xop && !c->xop->done && c->phase == SIM_PH_XCOMM) {
          c->xop->done = 1;
          c->xop->final = E_SYSTEM;
        }
      break;
    }
    UNLOCK();
    sleep_1ms();
    LOCK();
  }
  deadline = ncfsm__now_ns() + (uint64_t)wait_limit_ms() * 1000000ull;
  for (;;) { /* blocking children: ready once every child rank exists (blocking init) */
    int waiting = 0, late = ncfsm__now_ns() >= deadline;
    for (sim_comm *c = list; c; c = c->grp_next) {
      sim_xop *x = c->xop;
      sim_comm *ch = x ? x->child : NULL;
      if (c->zombie || !c->blocking || !ch || ch->armed || ch->phase != SIM_PH_INIT) continue;
      if (ch->q && clique_joined(ch->q) < ch->nranks && !late) {
        waiting = 1;
        continue;
      }
      ch->phase = SIM_PH_NONE;
      if (ch->q && clique_joined(ch->q) < ch->nranks) {
        ncfsm__sim_warn("%s: the child's peers never arrived within %lld ms (sim, NCFSM_SIM_WAIT_MS)",
                        x_call[x->kind], wait_limit_ms());
        ch->state = E_SYSTEM;
      } else if (ch->o.fail_init) {
        ch->state = ch->o.fail_init;
        ncfsm__sim_warn("sim: injected init failure %s (rank %d)", res_name(ch->state), ch->rank);
      } else {
        ch->state = OK;
      }
      if (ch->state != OK && !x->final) x->final = ch->state;
    }
    if (!waiting) break;
    UNLOCK();
    sleep_1ms();
    LOCK();
  }
  int rc = OK;
  for (sim_comm *c = list; c; c = c->grp_next) {
    sim_xop *x = c->xop;
    if (c->zombie || !c->blocking || !x || !x->done) continue;
    c->phase = SIM_PH_NONE;
    c->armed = 0;
    c->state = x->final == E_REMOTE ? E_REMOTE : OK; /* a dead peer; other failures are the call's */
    if (!rc) rc = x->final;
    xop_free(x);
    c->xop = NULL;
  }
  return rc;
}

/* The end of a split/shrink/grow call: its implicit group (R1: nonblocking
 * -> InProgress; blocking: the waits above) or its explicit one. */
static int xcomm_end(int implicit, sim_comm *c, int blocking, int rc) {
  if (rc) group_fail(c, rc);
  int grc = implicit_end(implicit);
  if (!rc) rc = implicit ? (blocking ? grc : c->state) : OK;
  return rc;
}

static int sim_comm_split(void *parent, int color, int key, void **child, const ncfsm__comm_config *cfg) {
  LOCK();
  int implicit = implicit_begin(), rc = OK, blocking = 0;
  sim_comm *c = comm_of(parent);
  if (child) *child = NULL; /* R8: written when the split is done */
  if (!c) {
    ncfsm__sim_warn("ncclCommSplit : comm argument is NULL or not a sim communicator");
    rc = E_ARG;
  } else {
    c->st.splits++;
    blocking = c->blocking;
    rc = xcomm_admit(c, SIM_X_SPLIT, 0);
    if (!rc && (!child || !cfg)) {
      ncfsm__sim_warn("ncclCommSplit : newcomm or config argument is NULL");
      rc = E_ARG;
    }
    if (!rc) rc = group_mode_check(c->blocking); /* R3 */
    if (!rc) {
      sim_xop *x = xop_new(c, SIM_X_SPLIT, child, cfg);
      if (!x) {
        ncfsm__sim_warn("ncclCommSplit: out of memory");
        rc = E_SYSTEM;
      } else {
        x->color = color;
        x->key = key;
        rc = xop_start(c, x);
      }
    }
  }
  rc = xcomm_end(implicit, c, blocking, rc);
  UNLOCK();
  return rc;
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

static int sim_comm_shrink(void *parent, const int *exclude, int nexclude, void **child,
                           const ncfsm__comm_config *cfg, int flags) {
  LOCK();
  int implicit = implicit_begin(), rc = OK, blocking = 0;
  sim_comm *c = comm_of(parent);
  int *ex = NULL;
  if (child) *child = NULL;
  if (!c) {
    ncfsm__sim_warn("ncclCommShrink : comm argument is NULL or not a sim communicator");
    rc = E_ARG;
  } else {
    c->st.shrinks++;
    blocking = c->blocking;
    /* ncclCommInitChildComm's order: pointers, a positive count, this rank
     * not excluded, then ncclCommEnsureReady (R2); only the NCCL_SHRINK_ABORT
     * bit of the flags matters (NCCL checks no others) */
    if (!child || !cfg || !exclude || nexclude <= 0) {
      ncfsm__sim_warn("ncclCommShrink : newcomm, config or excludeRanksList is NULL, or excludeRanksCount %d "
                      "is not positive", nexclude);
      rc = E_ARG;
    }
    if (!rc && !(ex = malloc((size_t)nexclude * sizeof *ex))) {
      ncfsm__sim_warn("ncclCommShrink: out of memory");
      rc = E_SYSTEM;
    }
    if (!rc) {
      memcpy(ex, exclude, (size_t)nexclude * sizeof *ex);
      qsort(ex, (size_t)nexclude, sizeof *ex, cmp_int);
      for (int i = 0; i < nexclude && !rc; i++)
        if (ex[i] == c->rank) {
          ncfsm__sim_warn("ncclCommShrink : rank %d is in the exclude list; excluded ranks must not call "
                          "ncclCommShrink (R7)", c->rank);
          rc = E_ARG;
        }
    }
    if (!rc) rc = xcomm_admit(c, SIM_X_SHRINK, flags);
    for (int i = 0; i < nexclude && !rc; i++) { /* sim checks: NCCL would hang or fail later */
      if (ex[i] < 0 || ex[i] >= c->nranks) {
        ncfsm__sim_warn("ncclCommShrink : excluded rank %d is out of range (0..%d) (sim)", ex[i], c->nranks - 1);
        rc = E_ARG;
      } else if (i && ex[i] == ex[i - 1]) {
        ncfsm__sim_warn("ncclCommShrink : rank %d is excluded twice (sim)", ex[i]);
        rc = E_ARG;
      }
    }
    if (!rc) rc = group_mode_check(c->blocking); /* R3 */
    if (!rc) {
      sim_xop *x = xop_new(c, SIM_X_SHRINK, child, cfg);
      if (!x) {
        ncfsm__sim_warn("ncclCommShrink: out of memory");
        rc = E_SYSTEM;
      } else {
        x->exclude = ex;
        ex = NULL;
        x->nexclude = nexclude;
        x->flags = flags & NCFSM__SHRINK_ABORT;
        uint64_t hh = 0xcbf29ce484222325ull; /* FNV-1a of the sorted list */
        for (int i = 0; i < nexclude; i++) hh = (hh ^ (uint64_t)(uint32_t)x->exclude[i]) * 0x100000001b3ull;
        x->hash = mix64(hh ^ (uint64_t)nexclude);
        if (flags & NCFSM__SHRINK_ABORT) {
          /* R7: the parent's outstanding work is terminated first: unexecuted
           * ops are dropped (their stream work ends without data, as aborted
           * kernels exit), and the parent may only be aborted afterwards */
          comm_drop_ops(c);
          c->poisoned = 0;
          c->shrink_aborted = 1;
        }
        rc = xop_start(c, x);
      }
    }
  }
  free(ex);
  rc = xcomm_end(implicit, c, blocking, rc);
  UNLOCK();
  return rc;
}

static int sim_comm_get_unique_id(void *bcomm, ncfsm_unique_id *id) {
  LOCK();
  int rc = OK;
  sim_comm *c = comm_of(bcomm);
  if (!c || !id) {
    ncfsm__sim_warn("ncclCommGetUniqueId : comm argument is NULL or not a sim communicator, or uniqueId "
                    "is NULL");
    rc = E_ARG;
  } else if (comm_foreign(c)) {
    rc = foreign_reject(c, "ncclCommGetUniqueId");
  } else if (!grow_ok(&c->o)) {
    ncfsm__sim_warn("ncclCommGetUniqueId: ncclCommGrow needs NCCL 2.29 (modelled %d, "
                    "ncfsm_sim_opts.has_grow = 0)", sim_version());
    rc = E_USAGE;
  } else if (c->state == IN_PROGRESS) {
    ncfsm__sim_warn(R2_WARN); /* R2: ncclCommEnsureReady (no group: not poisoned) */
    rc = E_ARG;
  } else if (c->state != OK) {
    rc = c->state; /* ncclCommEnsureReady keeps an error state */
  } else if (c->shrink_aborted || c->revoked || c->finalized) {
    ncfsm__sim_warn("ncclCommGetUniqueId: the communicator is %s; a grow needs a healthy parent (sim)",
                    c->shrink_aborted ? "shrunk with NCCL_SHRINK_ABORT"
                    : c->revoked      ? "revoked"
                                      : "finalized");
    rc = E_USAGE;
  } else {
    memset(id, 0, sizeof *id);
    if (random_key((unsigned char *)id->internal)) {
      ncfsm__sim_warn("ncclCommGetUniqueId: getrandom failed: %s", strerror(errno));
      rc = E_SYSTEM;
    } else {
      int32_t n = c->nranks;
      memcpy(id->internal + SIM_ID_KEY_LEN, SIM_ID_TAG, SIM_ID_TAG_LEN);
      memcpy(id->internal + GROW_TAG_OFF, GROW_TAG, 4);
      memcpy(id->internal + GROW_PARENT_OFF, c->q->key, SIM_ID_KEY_LEN);
      memcpy(id->internal + GROW_NRANKS_OFF, &n, sizeof n);
    }
  }
  if (c && rc) c->st.rejected++;
  UNLOCK();
  return rc;
}

/* A joining rank (no parent): an init of the new clique named by the id. */
static int grow_join(int nranks, const ncfsm_unique_id *id, int rank, void **child,
                     const ncfsm__comm_config *cfg, sim_comm **out) {
  if (!id || !child || !cfg) {
    ncfsm__sim_warn("ncclCommGrow : a joining rank (comm NULL) needs uniqueId, newcomm and config");
    return E_ARG;
  }
  ncfsm_sim_opts o;
  if (cfg->sim) o = *cfg->sim;
  else ncfsm_sim_opts_init(&o);
  if (!grow_ok(&o)) {
    ncfsm__sim_warn("ncclCommGrow needs NCCL 2.29 (modelled %d, ncfsm_sim_opts.has_grow = 0)", sim_version());
    return E_USAGE;
  }
  if (!is_grow_id(id)) {
    ncfsm__sim_warn("ncclCommGrow : the unique id was not made by ncclCommGetUniqueId (sim)");
    return E_ARG;
  }
  int pn = grow_id_nranks(id);
  if (nranks <= pn || rank < pn || rank >= nranks) {
    ncfsm__sim_warn("ncclCommGrow : invalid rank %d for a joining rank: the parent has %d ranks and the grown "
                    "communicator %d, so joining ranks are %d..%d", rank, pn, nranks, pn, nranks - 1);
    return E_ARG;
  }
  const unsigned char *key = (const unsigned char *)id->internal;
  sim_clique *q = clique_find_key(key);
  int full = 0;
  if (q && ncfsm__sim_shm_lock(q) == 0) {
    full = q->h->joined >= q->h->nranks;
    ncfsm__sim_shm_unlock(q);
  }
  if (full || (!q && grow_done_local(key))) {
    ncfsm__sim_warn("ncclCommGrow : this unique id was already used by a completed grow (ids are single-use)");
    return E_ARG;
  }
  int rc = comm_create(out, nranks, key, rank, cfg, "ncclCommGrow");
  if (rc) return rc;
  grow_done_mark(key);
  return OK;
}

static int sim_comm_grow(void *parent, int nranks, const ncfsm_unique_id *id, int rank, void **child,
                         const ncfsm__comm_config *cfg) {
  LOCK();
  int implicit = implicit_begin(), rc = OK, blocking = 0;
  sim_comm *c = NULL;
  if (child) *child = NULL;
  if (!parent) { /* a joining rank */
    rc = grow_join(nranks, id, rank, child, cfg, &c);
    if (rc) {
      group_fail(NULL, rc);
    } else {
      c->st.grows++;
      c->init_in_group = 1; /* completes (blocking) or arms (nonblocking) at the outermost end */
      group_track(c);
      g_blocking = c->blocking;
      *child = c;
      blocking = c->blocking;
      NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d/%d joins by ncclCommGrow", rank, nranks);
    }
    int grc = implicit_end(implicit);
    if (!rc) rc = implicit ? (blocking ? grc : c->state) : OK;
    UNLOCK();
    return rc;
  }
  c = comm_of(parent);
  if (!c) {
    ncfsm__sim_warn("ncclCommGrow : comm argument is not a sim communicator");
    rc = E_ARG;
  } else {
    c->st.grows++;
    blocking = c->blocking;
    rc = xcomm_admit(c, SIM_X_GROW, 0);
    if (!rc && (!child || !cfg)) {
      ncfsm__sim_warn("ncclCommGrow : newcomm or config argument is NULL");
      rc = E_ARG;
    }
    if (!rc && rank != -1) {
      ncfsm__sim_warn("ncclCommGrow : an existing rank passes rank -1 (got %d); it keeps its rank %d",
                      rank, c->rank);
      rc = E_ARG;
    }
    if (!rc && nranks <= c->nranks) {
      ncfsm__sim_warn("ncclCommGrow : nranks %d must be larger than the parent's %d", nranks, c->nranks);
      rc = E_ARG;
    }
    if (!rc && id) {
      if (!is_grow_id(id) || memcmp(id->internal + GROW_PARENT_OFF, c->q->key, SIM_ID_KEY_LEN) ||
          grow_id_nranks(id) != c->nranks) {
        ncfsm__sim_warn("ncclCommGrow : the unique id was not made by ncclCommGetUniqueId on this "
                        "communicator (sim)");
        rc = E_ARG;
      } else if (grow_used_shared(c, (const unsigned char *)id->internal)) {
        ncfsm__sim_warn("ncclCommGrow : this unique id was already used by a grow (ids are single-use)");
        rc = E_ARG;
      }
    }
    if (!rc) rc = group_mode_check(c->blocking); /* R3 */
    if (!rc) {
      sim_xop *x = xop_new(c, SIM_X_GROW, child, cfg);
      if (!x) {
        ncfsm__sim_warn("ncclCommGrow: out of memory");
        rc = E_SYSTEM;
      } else {
        x->grow_nranks = nranks;
        x->has_id = id != NULL;
        if (id) memcpy(x->grow_key, id->internal, SIM_ID_KEY_LEN);
        rc = xop_start(c, x);
      }
    }
  }
  rc = xcomm_end(implicit, c, blocking, rc);
  UNLOCK();
  return rc;
}

/* ncclCommUserRank + ncclCommCount: both call ncclCommEnsureReady (NCCL
 * 2.28 init.cc), so on a comm whose async state is InProgress (e.g. a split
 * child still in its init) they return ncclInvalidArgument with the R2 WARN,
 * and an error state is returned as it is. No group is involved there, so the
 * sim does not poison the comm for it (not measured). */
static int sim_comm_rank_size(void *bcomm, int *rank, int *size) {
  LOCK();
  int rc = OK;
  sim_comm *c = comm_of(bcomm);
  if (!c || !rank || !size) {
    ncfsm__sim_warn("ncclCommCount : comm argument is NULL or not a sim communicator, or count is NULL");
    rc = E_ARG;
  } else if (comm_foreign(c)) {
    rc = foreign_reject(c, "ncclCommCount");
  } else if (c->state == IN_PROGRESS) {
    ncfsm__sim_warn(R2_WARN); /* R2: ncclCommEnsureReady */
    rc = E_ARG;
  } else if (c->state != OK) {
    rc = c->state;
  } else {
    *rank = c->rank;
    *size = c->nranks;
  }
  if (c && rc) c->st.rejected++;
  UNLOCK();
  return rc;
}

/* ---- poll ------------------------------------------------------------------------- */

static int sim_get_async_error(void *bcomm, int *state) {
  LOCK();
  sim_comm *c = comm_of(bcomm);
  int rc = OK;
  if (!c || !state) {
    ncfsm__sim_warn("ncclCommGetAsyncError : comm argument is NULL or not a sim communicator");
    rc = E_ARG;
  } else if (comm_foreign(c)) {
    rc = foreign_reject(c, "ncclCommGetAsyncError");
    *state = rc;
  } else {
    c->st.polls++;
    if (c->fs) ncfsm__sim_fault_poll(c); /* the testing kit's poll and time triggers */
    ncfsm__sim_progress();
    sim_phase before = c->phase;
    comm_tick(c);
    if (before != SIM_PH_NONE && c->phase == SIM_PH_NONE) ncfsm__sim_progress();
    *state = c->state;
  }
  UNLOCK();
  return rc;
}

/* ---- operations --------------------------------------------------------------------- */

/* ArgsCheck (misc/argcheck.cc): root (peer for send/recv), type, reduction
 * operator, then the buffers a rank needs. */
static int args_check(const sim_comm *c, const ncfsm__op *op) {
  if ((unsigned)op->kind >= (unsigned)NCFSM_OPKIND_COUNT) {
    ncfsm__sim_warn("sim: invalid operation kind %d", (int)op->kind);
    return E_ARG;
  }
  ncfsm_opkind_t k = op->kind;
  const char *nm = op_names[k];
  int p2p = k == NCFSM_KIND_SEND || k == NCFSM_KIND_RECV;
  int rooted = k == NCFSM_KIND_BROADCAST || k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_GATHER ||
               k == NCFSM_KIND_SCATTER;
  if (rooted || p2p) { /* NCCL passes the peer of send/recv as the root */
    int root = p2p ? op->peer : op->root;
    if (root < 0 || root >= c->nranks) {
      ncfsm__sim_warn("%s : invalid root %d (root should be in the 0..%d range)", nm, root,
                      c->nranks - 1);
      return E_ARG;
    }
  }
  if ((unsigned)op->dtype >= (unsigned)NCFSM_DTYPE_COUNT) {
    ncfsm__sim_warn("%s : invalid type %d", nm, (int)op->dtype);
    return E_ARG;
  }
  int reduces = k == NCFSM_KIND_ALLREDUCE || k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_REDUCESCATTER;
  if (reduces && (unsigned)op->redop >= (unsigned)NCFSM_REDOP_COUNT) {
    ncfsm__sim_warn("%s : invalid reduction operation %d", nm, (int)op->redop);
    return E_ARG;
  }
  size_t es = ncfsm__sim_dtype_size(op->dtype);
  size_t mult = (k == NCFSM_KIND_ALLGATHER || k == NCFSM_KIND_REDUCESCATTER ||
                 k == NCFSM_KIND_ALLTOALL || k == NCFSM_KIND_GATHER || k == NCFSM_KIND_SCATTER)
                    ? (size_t)c->nranks * (size_t)c->nranks /* alltoall's scratch: n*n blocks */
                    : 1;
  size_t unit, total;
  if (__builtin_mul_overflow(es, mult, &unit) || __builtin_mul_overflow(op->count, unit, &total)) {
    ncfsm__sim_warn("%s : count %zu is too large", nm, op->count);
    return E_ARG;
  }
  if (op->count > 0) {
    int is_root = rooted && op->root == c->rank;
    int need_send = 1, need_recv = 1;
    if (k == NCFSM_KIND_BROADCAST || k == NCFSM_KIND_SCATTER) need_send = is_root;
    if (k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_GATHER) need_recv = is_root;
    if (k == NCFSM_KIND_SEND) need_recv = 0;
    if (k == NCFSM_KIND_RECV) need_send = 0;
    if (need_send && !op->send) {
      ncfsm__sim_warn("%s : %s %p is not a valid pointer", nm, p2p ? "buff" : "sendbuff", op->send);
      return E_ARG;
    }
    if (need_recv && !op->recv) {
      ncfsm__sim_warn("%s : %s %p is not a valid pointer", nm, p2p ? "buff" : "recvbuff",
                      (void *)op->recv);
      return E_ARG;
    }
  }
  if (op->stream && !ncfsm__sim_stream_valid(op->stream)) {
    ncfsm__sim_warn("%s : invalid stream %p", nm, op->stream);
    return E_ARG;
  }
  return OK;
}

/* The clique's shared arena must hold one instance of the op alone: every
 * rank's send data, the result block and the descriptors. Otherwise the op
 * could never run: refuse it (ncclSystemError, as NCCL on a failed shm
 * allocation) instead of hanging. args_check ruled out overflows. */
static int arena_check(const sim_comm *c, const ncfsm__op *op) {
  if (!c->q) return OK;
  ncfsm_opkind_t k = op->kind;
  size_t n = (size_t)c->nranks, blk = op->count * ncfsm__sim_dtype_size(op->dtype), all = blk * n;
  size_t send = blk, res = blk, senders = n;
  switch (k) {
  case NCFSM_KIND_ALLGATHER: res = all; break;
  case NCFSM_KIND_GATHER: res = all; break;
  case NCFSM_KIND_REDUCESCATTER: send = all; res = all; break;
  case NCFSM_KIND_SCATTER: send = all; res = all; senders = 1; break;
  case NCFSM_KIND_BROADCAST: senders = 1; break;
  case NCFSM_KIND_ALLTOALL: send = all; res = all * n; break;
  case NCFSM_KIND_SEND:
  case NCFSM_KIND_RECV: senders = 1; n = 2; break;
  default: break;
  }
  double need = (double)senders * (double)(send + 128) + (double)res + 128.0 +
                (double)n * (double)(sizeof(shm_op) + 128);
  if (need <= (double)c->q->h->arena_len) return OK;
  ncfsm__sim_warn("%s : %zu elements need %.0f bytes of the clique's shared memory, more than its "
                  "arena of %llu bytes (raise NCFSM_SIM_SHM_BYTES before the clique is created)",
                  op_names[k], op->count, need, (unsigned long long)c->q->h->arena_len);
  return E_SYSTEM;
}

/* ncclEnqueueCheck: CommCheck, ncclCommEnsureReady (R2), ArgsCheck, taskAppend. */
static int op_admit(sim_comm *c, const ncfsm__op *op) {
  if (comm_foreign(c))
    return foreign_reject(c, (unsigned)op->kind < (unsigned)NCFSM_OPKIND_COUNT ? op_names[op->kind] : "op");
  if (c->state == IN_PROGRESS) {
    ncfsm__sim_warn(R2_WARN); /* R2 */
    return E_ARG;
  }
  if (c->shrink_aborted) {
    ncfsm__sim_warn("%s : " SHRUNK_WARN,
                    (unsigned)op->kind < (unsigned)NCFSM_OPKIND_COUNT ? op_names[op->kind] : "op");
    return E_USAGE;
  }
  if (c->state != OK) return c->state; /* R10: the async error, again */
  if (c->revoked) {
    ncfsm__sim_warn("%s : communicator was revoked; new operations are not allowed (R6)",
                    (unsigned)op->kind < (unsigned)NCFSM_OPKIND_COUNT ? op_names[op->kind] : "op");
    return E_USAGE;
  }
  if (c->finalized) {
    ncfsm__sim_warn("%s : communicator was finalized (sim)",
                    (unsigned)op->kind < (unsigned)NCFSM_OPKIND_COUNT ? op_names[op->kind] : "op");
    return E_USAGE;
  }
  int rc = args_check(c, op);
  if (rc) return rc;
  if ((rc = arena_check(c, op))) return rc;
  if (g_dirty) { /* an op overwrites a mode left dirty by destroy (taskAppend), inits check it */
    g_blocking = -1;
    g_dirty = 0;
  }
  return group_mode_check(c->blocking);
}

static int sim_do_op(void *bcomm, const ncfsm__op *op) {
  LOCK();
  int implicit = implicit_begin(), rc = OK;
  sim_comm *c = comm_of(bcomm);
  if (!c) {
    ncfsm__sim_warn("%s : comm argument is NULL or not a sim communicator",
                    op && (unsigned)op->kind < (unsigned)NCFSM_OPKIND_COUNT ? op_names[op->kind] : "op");
    rc = E_ARG;
  } else {
    c->st.ops++;
    if (!op) {
      ncfsm__sim_warn("sim: op is NULL");
      rc = E_ARG;
    } else {
      rc = op_admit(c, op);
    }
    if (!rc) {
      sim_op *o = calloc(1, sizeof *o);
      if (!c->pending && o) c->pending = calloc(1, sizeof *c->pending);
      if (!o || !c->pending) {
        free(o);
        ncfsm__sim_warn("sim: out of memory");
        rc = E_SYSTEM;
      } else {
        o->a = *op;
        o->c = c;
        if (c->pending->tail) c->pending->tail->next = o;
        else c->pending->head = o;
        c->pending->tail = o;
        c->pending->n++;
        group_track(c);
        g_blocking = c->blocking;
      }
    }
  }
  if (rc) group_fail(c, rc);
  int grc = implicit_end(implicit);
  if (!rc) rc = c->blocking ? grc : c->state; /* nonblocking: the async state (R1) */
  UNLOCK();
  return rc;
}

/* ---- finalize, destroy, abort, revoke (R4, R5, R6) -------------------------------------- */

static int sim_finalize(void *bcomm) {
  LOCK();
  int implicit = implicit_begin(), rc = OK;
  sim_comm *c = comm_of(bcomm);
  if (!c) {
    ncfsm__sim_warn("ncclCommFinalize : comm argument is NULL or not a sim communicator");
    rc = E_ARG;
  } else {
    c->st.finalizes++;
    if (comm_foreign(c)) {
      rc = foreign_reject(c, "ncclCommFinalize");
    } else if (c->state == IN_PROGRESS) {
      ncfsm__sim_warn(R2_WARN); /* R2, and R4: a second finalize while the first runs */
      rc = E_ARG;
    } else if (c->shrink_aborted) {
      ncfsm__sim_warn("ncclCommFinalize: " SHRUNK_WARN);
      rc = E_USAGE;
    } else if (c->state != OK) {
      rc = c->state;
    } else if (c->revoked) {
      ncfsm__sim_warn("ncclCommFinalize: not allowed after ncclCommRevoke (R6)");
      rc = E_USAGE;
    } else if (c->finalized) {
      ncfsm__sim_warn("ncclCommFinalize: comm already finalized"); /* R4 */
      rc = E_ARG;
    } else if (!c->blocking) {
      c->state = IN_PROGRESS; /* R1, R4 */
      c->phase = SIM_PH_FINALIZE;
      c->countdown = ncfsm__sim_fault_phase(c, SIM_PH_FINALIZE, c->o.finalize_polls, 0);
      c->armed = 1;
      rc = IN_PROGRESS;
    } else { /* blocking: flush outstanding work before returning */
      uint64_t deadline = ncfsm__now_ns() + (uint64_t)wait_limit_ms() * 1000000ull;
      for (;;) {
        ncfsm__sim_progress();
        if (!unfinished(c)) {
          c->finalized = 1;
          break;
        }
        if (ncfsm__now_ns() >= deadline) {
          ncfsm__sim_warn("ncclCommFinalize: outstanding operations never completed (sim)");
          c->state = rc = E_SYSTEM;
          break;
        }
        UNLOCK();
        sleep_1ms();
        LOCK();
      }
    }
    if (rc != OK && rc != IN_PROGRESS) group_fail(c, rc);
  }
  if (!c) group_fail(NULL, rc);
  int grc = implicit_end(implicit);
  if (implicit && grc != OK && grc != IN_PROGRESS && rc == OK) rc = grc;
  UNLOCK();
  return rc;
}

static int sim_destroy(void *bcomm) {
  LOCK();
  int implicit = implicit_begin(), rc = OK, dirty = 0;
  sim_comm *c = comm_of(bcomm);
  if (!c) {
    ncfsm__sim_warn("ncclCommDestroy : comm argument is NULL or not a sim communicator");
    rc = E_ARG;
    group_fail(NULL, rc);
  } else if (comm_foreign(c)) {
    c->st.destroys++;
    rc = foreign_reject(c, "ncclCommDestroy");
    group_fail(c, rc);
  } else if (c->shrink_aborted && c->state != IN_PROGRESS) {
    c->st.destroys++; /* R7: the parent of a NCCL_SHRINK_ABORT shrink must be aborted */
    ncfsm__sim_warn("ncclCommDestroy: " SHRUNK_WARN);
    rc = E_USAGE;
    group_fail(c, rc);
  } else if (c->state != OK) {
    /* R4: destroy is only legal in ncclSuccess. Rejected without destroying;
     * the thread's group mode is left dirty (measured cascade). */
    c->st.destroys++;
    if (c->state == IN_PROGRESS) ncfsm__sim_warn(R2_WARN);
    else
      ncfsm__sim_warn("ncclCommDestroy: communicator is in error state %s; use ncclCommAbort (R4)",
                      res_name(c->state));
    rc = E_ARG;
    group_fail(c, rc);
    dirty = 1;
  } else {
    c->st.destroys++;
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d destroyed", c->rank);
    comm_close(c);
  }
  implicit_end(implicit);
  if (dirty) { /* R4 cascade: the next nonblocking comm init on this thread fails */
    g_blocking = 1;
    g_dirty = 1;
  }
  UNLOCK();
  return rc;
}

static int sim_abort(void *bcomm) {
  LOCK();
  int rc = OK;
  sim_comm *c = comm_of(bcomm);
  if (!c) {
    ncfsm__sim_warn("ncclCommAbort : comm argument is NULL or not a sim communicator");
    rc = E_ARG;
  } else { /* R5: always legal, never blocks; unexecuted ops drain without data */
    c->st.aborts++;
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d aborted", c->rank);
    comm_close(c);
  }
  UNLOCK();
  return rc;
}

static int sim_revoke(void *bcomm, int flags) {
  (void)flags;
  LOCK();
  int rc = OK;
  sim_comm *c = comm_of(bcomm);
  if (!c) {
    ncfsm__sim_warn("ncclCommRevoke : comm argument is NULL or not a sim communicator");
    rc = E_ARG;
  } else if (comm_foreign(c)) {
    c->st.revokes++;
    c->st.rejected++;
    rc = foreign_reject(c, "ncclCommRevoke");
  } else if (c->st.revokes++, sim_version() < 22807 || !c->o.has_revoke) {
    /* R6: the modelled runtime has no ncclCommRevoke (2.28.3) */
    ncfsm__sim_warn("ncclCommRevoke not available (NCCL %d, needs >= 2.28.7) (R6)",
                    c->o.has_revoke ? sim_version() : 22803);
    c->st.rejected++;
    rc = E_USAGE;
  } else if (c->shrink_aborted) {
    ncfsm__sim_warn("ncclCommRevoke: " SHRUNK_WARN);
    c->st.rejected++;
    rc = E_USAGE;
  } else if (c->phase == SIM_PH_INIT) {
    ncfsm__sim_warn("ncclCommRevoke: communicator is still initializing (sim)");
    c->st.rejected++;
    rc = E_USAGE;
  } else {
    /* R6: stop in-flight work; InProgress until quiescent. An async error stays. */
    c->revoke_prev = (c->state == OK || c->state == IN_PROGRESS) ? OK : c->state;
    comm_drop_ops(c);
    if (c->xop) { /* a split/shrink/grow in progress is given up on this rank: no child */
      xop_free(c->xop);
      c->xop = NULL;
    }
    c->poisoned = 0;
    c->revoked = 1;
    if (c->blocking) {
      c->phase = SIM_PH_NONE;
      c->state = c->revoke_prev;
    } else {
      c->state = IN_PROGRESS;
      c->phase = SIM_PH_REVOKE;
      c->countdown = ncfsm__sim_fault_phase(c, SIM_PH_REVOKE, c->o.revoke_polls, 0);
      c->armed = 1;
      rc = IN_PROGRESS;
    }
  }
  UNLOCK();
  return rc;
}

/* Returns a thread-local copy: the process-wide text may change meanwhile. */
static const char *sim_last_error(void *bcomm) {
  static __thread char copy[sizeof g_last_error];
  (void)bcomm; /* ncclGetLastError ignores its comm */
  LOCK();
  memcpy(copy, g_last_error, sizeof copy);
  UNLOCK();
  return copy;
}

static int sim_device_count(void) { return 0; }

int ncfsm__sim_stats(void *bcomm, ncfsm_sim_stats *out) {
  LOCK();
  sim_comm *c = comm_of(bcomm);
  int rc = OK;
  if (!c || !out) {
    rc = E_ARG;
  } else {
    *out = c->st;
    out->async_state = c->state;
  }
  UNLOCK();
  return rc;
}

const ncfsm__backend ncfsm__backend_sim = {
    .name = "sim",
    .kind = NCFSM_BACKEND_SIM,
    .open = sim_open,
    .version = sim_version,
    .features = sim_features,
    .comm_features = sim_comm_features,
    .get_unique_id = sim_get_unique_id,
    .comm_init = sim_comm_init,
    .comm_init_scalable = sim_comm_init_scalable,
    .get_async_error = sim_get_async_error,
    .group_start = sim_group_start,
    .group_end = sim_group_end,
    .op = sim_do_op,
    .finalize = sim_finalize,
    .destroy = sim_destroy,
    .abort = sim_abort,
    .revoke = sim_revoke,
    .comm_split = sim_comm_split,
    .comm_shrink = sim_comm_shrink,
    .comm_get_unique_id = sim_comm_get_unique_id,
    .comm_grow = sim_comm_grow,
    .comm_rank_size = sim_comm_rank_size,
    .last_error = sim_last_error,
    .stream_create = ncfsm__sim_stream_create,
    .host_notify = ncfsm__sim_host_notify,
    .stream_destroy = ncfsm__sim_stream_destroy,
    .stream_device = ncfsm__sim_stream_device,
    .event_create = ncfsm__sim_event_create,
    .event_record = ncfsm__sim_event_record,
    .event_query = ncfsm__sim_event_query,
    .event_elapsed_ms = ncfsm__sim_event_elapsed_ms,
    .event_destroy = ncfsm__sim_event_destroy,
    .device_count = sim_device_count,
};
