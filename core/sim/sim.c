/*
 * ncfsm__backend_sim: a deterministic model of NCCL 2.28 nonblocking
 * behaviour for machines without GPUs. A test double, not NCCL: see
 * docs/sim.md for what it models and what it does not.
 *
 * This file: the process-wide state, fork handling, WARNs, the settings
 * (core/settings.def) and the modelled version, cliques, a communicator's teardown helpers and the
 * backend table. The communicator calls live in the files core/sim/sim-comm.h
 * lists; execution and data movement in sim_exec.c, the shared-memory
 * cliques in sim_shm.c, streams and events in sim_stream.c, types in
 * sim_reduce.c.
 *
 * One process-wide mutex protects all sim state; ranks of a clique may be
 * driven by one thread or several. Progress runs only inside
 * get_async_error and event_query (and blocking waits): no helper threads.
 * Rule ids (R1..R13) are the sections of docs/nccl-rules.md.
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

#include "core/log.h"
#include "core/sim/sim-comm.h"
#include "core/sim/sim-faults.h"

pthread_mutex_t ncfsm__sim_mu = PTHREAD_MUTEX_INITIALIZER;
sim_clique *ncfsm__sim_cliques;
sim_clique *ncfsm__sim_inherited;
uint64_t ncfsm__sim_fork_gen;
static char g_last_error[1024]; /* process-wide, as ncclGetLastError */

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
  ncfsm__sim_group_forked(); /* an open group of the forking thread */
  ncfsm__sim_device_forked(); /* the parent's device thread is not here */
  UNLOCK();
}
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
static void atfork_register(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }
void ncfsm__sim_atfork_once(void) { pthread_once(&g_atfork_once, atfork_register); }

int ncfsm__sim_foreign(const sim_comm *c) { return c->fork_gen != ncfsm__sim_fork_gen; }

int ncfsm__sim_foreign_reject(sim_comm *c, const char *call) {
  ncfsm__sim_cwarn(c, "%s: this communicator (rank %d) belongs to process %d, and this process (%d) is a "
                  "fork of it: a forked child must not use its parent's communicators (make new ones "
                  "from a unique id; only ncclCommAbort is allowed, and frees this process's copy)",
                  call, c->rank, c->pid, (int)getpid());
  return E_USAGE;
}

static const char *const op_names[NCFSM_OPKIND_COUNT] = {
    "AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter",
    "AlltoAll",  "Gather",    "Scatter", "Send",     "Recv"};

const char *ncfsm__sim_op_name(int kind) {
  return (unsigned)kind < (unsigned)NCFSM_OPKIND_COUNT ? op_names[kind] : "op";
}

const char *ncfsm__sim_res_name(int code) {
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
    const char *e = ncfsm__sim_setting(NCFSM__SET_NCCL_DEBUG).s; /* NCCL's variable: any text */
    v = e && (!strcasecmp(e, "WARN") || !strcasecmp(e, "INFO") || !strcasecmp(e, "TRACE"));
  }
  return v;
}

static void vwarn(sim_comm *c, const char *fmt, va_list ap) {
  vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
  if (warn_to_stderr()) fprintf(stderr, "NCCL WARN %s\n", g_last_error);
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: NCCL WARN %s", g_last_error);
  if (c) ncfsm__sim_warn_also(c);
}

void ncfsm__sim_warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vwarn(NULL, fmt, ap);
  va_end(ap);
}

void ncfsm__sim_cwarn(sim_comm *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vwarn(c, fmt, ap);
  va_end(ap);
}

void ncfsm__sim_warn_also(sim_comm *c) { snprintf(c->err, sizeof c->err, "%s", g_last_error); }

long long ncfsm__sim_wait_ms(void) { return (long long)ncfsm__sim_setting(NCFSM__SET_SIM_WAIT_MS).u; }

uint64_t ncfsm__sim_deadline(void) { return ncfsm__now_ns() + (uint64_t)ncfsm__sim_wait_ms() * 1000000ull; }

void ncfsm__sim_nap(void) {
  struct timespec ts = {0, 1000000};
  UNLOCK();
  nanosleep(&ts, NULL);
  LOCK();
}

int ncfsm__sim_random_key(unsigned char *key) {
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

/* ---- settings (core/settings.def) -------------------------------------------- */

ncfsm__setting_val ncfsm__sim_setting(ncfsm__setting_id id) {
  ncfsm__setting_val v;
  ncfsm__setting_env(id, &v); /* refused: the default, logged */
  return v;
}

int ncfsm__sim_call_opts(const ncfsm_sim_opts *so, ncfsm_sim_opts *o, const char *call) {
  char err[512];
  if (so) {
    *o = *so;
    if (ncfsm__settings_env_check(NCFSM__SS_SIM, err, sizeof err) == 0) return OK;
  } else if (ncfsm_sim_opts_init(o) == NCFSM_OK) {
    return OK;
  } else {
    snprintf(err, sizeof err, "%s", ncfsm_opts_error());
  }
  ncfsm__sim_warn("%s: %s", call, err);
  return E_ARG;
}

/* The modelled NCCL version, process-wide (NCFSM_SIM_NCCL_VERSION, default 2.28.9). */
int ncfsm__sim_version(void) { return (int)ncfsm__sim_setting(NCFSM__SET_SIM_NCCL_VERSION).u; }

static unsigned sim_features(void) {
  int v = ncfsm__sim_version();
  unsigned f = NCFSM__HAS_ALLTOALL | NCFSM__HAS_GATHER | NCFSM__HAS_SCATTER | NCFSM__HAS_SPLIT;
  if (v >= 22807) f |= NCFSM__HAS_REVOKE; /* R6 */
  if (v >= 22703) f |= NCFSM__HAS_SHRINK; /* R7 */
  if (v >= 22900) f |= NCFSM__HAS_GROW;   /* ncclCommGrow, ncclCommGetUniqueId */
  if (v >= 22304) f |= NCFSM__HAS_INIT_SCALABLE; /* ncclCommInitRankScalable */
  return f;
}

int ncfsm__sim_grow_ok(const ncfsm_sim_opts *o) { return ncfsm__sim_version() >= 22900 || (o && o->has_grow); }

static int sim_open(char *why, size_t why_len) {
  if (why && why_len) why[0] = '\0';
  return 0;
}

/* ---- cliques ---------------------------------------------------------------- */

int ncfsm__sim_clique_joined(sim_clique *q) {
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
  if (ncfsm__sim_random_key((unsigned char *)id->internal)) {
    LOCK();
    ncfsm__sim_warn("ncclGetUniqueId: getrandom failed: %s", strerror(errno));
    UNLOCK();
    return E_SYSTEM;
  }
  memcpy(id->internal + SIM_ID_KEY_LEN, SIM_ID_TAG, SIM_ID_TAG_LEN);
  return OK;
}

sim_clique *ncfsm__sim_clique_find(const unsigned char *key) {
  for (sim_clique *q = ncfsm__sim_cliques; q; q = q->next)
    if (!memcmp(q->key, key, SIM_ID_KEY_LEN)) return q;
  return NULL;
}

/* ---- communicators ------------------------------------------------------------ */

sim_comm *ncfsm__sim_comm_of(void *bcomm) {
  sim_comm *c = bcomm;
  return (c && c->magic == SIM_MAGIC_COMM) ? c : NULL;
}

/* Per comm: ncfsm_sim_opts.has_revoke = 0 models a 2.28.3 runtime for this
 * communicator only (R6), so ncfsm reports Revoke as unsupported for it. */
static unsigned sim_comm_features(void *bcomm) {
  LOCK();
  sim_comm *c = ncfsm__sim_comm_of(bcomm);
  unsigned f = sim_features();
  if (c && !c->o.has_revoke) f &= ~(unsigned)NCFSM__HAS_REVOKE;
  if (c && ncfsm__sim_grow_ok(&c->o)) f |= NCFSM__HAS_GROW;
  UNLOCK();
  return f;
}

/* Posted ops complete on their streams with no data, so the streams drain
 * (R5); unposted ops are discarded. */
void ncfsm__sim_drop_ops(sim_comm *c) {
  ncfsm__sim_lg_leave(c);
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

void ncfsm__sim_comm_free(sim_comm *c) {
  c->magic = SIM_MAGIC_DEAD;
  ncfsm__sim_xop_free(c->xop);
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
  ncfsm__sim_drop_ops(c);
  sim_clique *q = c->q;
  c->q = NULL;
  if (q) {
    q->slot[c->rank] = NULL;
    if (--q->nlocal <= 0) ncfsm__sim_shm_detach(q);
  }
}

/* Remove c for good (destroy, abort). While it sits in an open group its
 * memory is kept (zombie) and freed by that group's end. */
void ncfsm__sim_comm_close(sim_comm *c) {
  if (ncfsm__sim_foreign(c)) comm_forget_shared(c);
  ncfsm__sim_drop_ops(c);
  clique_leave(c);
  if (c->in_group) {
    c->zombie = 1;
    c->magic = SIM_MAGIC_DEAD;
  } else {
    ncfsm__sim_comm_free(c);
  }
}

/* Its async state becomes ncclInvalidArgument now, or when the running
 * InProgress phase ends. */
void ncfsm__sim_poison(sim_comm *c) {
  if (c->blocking) return;
  if (c->state == IN_PROGRESS) c->poisoned = 1;
  else if (c->state == OK) c->state = E_ARG;
}

int ncfsm__sim_unfinished(const sim_comm *c) {
  for (const sim_unit *u = c->units; u; u = u->next)
    if (u->ndone < u->n) return 1;
  return 0;
}

/* A sim comm's own last WARN ("" when it had none), else (no sim comm: a
 * failed init's NULL handle) the process's, as ncclGetLastError; NCCL's text
 * is process-wide, so that another comm's failure would show in this one's
 * failure text. Returns a thread-local copy: the texts may change meanwhile. */
static const char *sim_last_error(void *bcomm) {
  static __thread char copy[sizeof g_last_error];
  LOCK();
  const sim_comm *c = ncfsm__sim_comm_of(bcomm);
  snprintf(copy, sizeof copy, "%s", c ? c->err : g_last_error);
  UNLOCK();
  return copy;
}

static int sim_device_count(void) { return 0; }

int ncfsm__sim_stats(void *bcomm, ncfsm_sim_stats *out) {
  LOCK();
  sim_comm *c = ncfsm__sim_comm_of(bcomm);
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
    .version = ncfsm__sim_version,
    .features = sim_features,
    .comm_features = sim_comm_features,
    .get_unique_id = sim_get_unique_id,
    .comm_init = ncfsm__sim_comm_init,
    .comm_init_scalable = ncfsm__sim_comm_init_scalable,
    .get_async_error = ncfsm__sim_get_async_error,
    .group_start = ncfsm__sim_group_start,
    .group_end = ncfsm__sim_group_end,
    .op = ncfsm__sim_op,
    .finalize = ncfsm__sim_finalize,
    .destroy = ncfsm__sim_destroy,
    .abort = ncfsm__sim_abort,
    .revoke = ncfsm__sim_revoke,
    .comm_split = ncfsm__sim_comm_split,
    .comm_shrink = ncfsm__sim_comm_shrink,
    .comm_get_unique_id = ncfsm__sim_comm_get_unique_id,
    .comm_grow = ncfsm__sim_comm_grow,
    .comm_rank_size = ncfsm__sim_comm_rank_size,
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
