/* Introspection (include/ncfsm/introspect.h): a snapshot of a loop as JSON
 * and its counters as Prometheus text. The loop's lock is held only while
 * plain fields are copied into a snapshot; the JSON and the text are built
 * from the copy after the lock is released, so a scrape delays the loop by
 * the copy alone. Field meanings: docs/service.md. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fsm/api-int.h"
#include "ncfsm/introspect.h"

#define TAIL_MAX 1024u

typedef struct snap_comm {
  char name[64];
  char last_error[512];
  char failure[512];
  int rank, nranks, device, blocking;
  bool released;
  const ncfsm__backend *be;
  ncfsm_state_t state;
  uint64_t state_since_ns, created_ns, timeout_ms;
  uint64_t seq, hash, comm_id;
  ncfsm_verify_mode_t verify;
  const char *verify_state; /* the verifier's state name (static), NULL: none */
  uint64_t verified_seq;
  ncfsm_result_t cause;
  int async_code;
  uint64_t works[NCFSM_WORK_STATE_COUNT]; /* unfinished works by state */
  uint64_t finished[NCFSM_WORK_STATE_COUNT]; /* works that reached each final state */
  bool has_oldest;                        /* the unfinished work submitted first */
  ncfsm_fingerprint_t oldest_fp;
  ncfsm_work_state_t oldest_state;
  uint64_t oldest_submit_ns, oldest_launch_ns;
  unsigned rec_capacity;
  uint64_t rec_total;
  unsigned ntail;
  ncfsm__rec_entry *tail; /* ntail entries, oldest first */
} snap_comm;

typedef struct snap {
  uint64_t now_ns;
  ncfsm__stats stats;
  int group_depth, nqueued, ncomms;
  ncfsm__pool_stats pool;
  int works_free; /* works on the loop's free list */
  uint64_t handoffs; /* submissions handed off while the lock was taken (fsm/submit.h) */
  uint64_t spins[2][2]; /* loop->spins */
  ncfsm__coalesce co; /* the coalescing cap and its fit */
  snap_comm *comms;
  ncfsm__rec_entry *tails; /* storage of every comm's tail */
} snap;

void ncfsm_introspect_opts_init(ncfsm_introspect_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->recorder_tail = 8;
}

static bool loop_ok(const ncfsm_loop *l) { return l && l->magic == NCFSM__LOOP_MAGIC; }

/* The loop's lock; EDEADLK (debug builds' error-checking mutex) when this
 * thread holds it already: a trace callback. */
static ncfsm_result_t lock_loop(ncfsm_loop *loop) {
  int e = pthread_mutex_lock(&loop->mu);
  if (e == EDEADLK) return NCFSM_ERR_INVALID_USAGE;
  if (e) return NCFSM_ERR_SYSTEM;
  ncfsm__handoff_turn(loop); /* a snapshot shows this thread's earlier submissions queued */
  ncfsm__held_spill_mine(loop); /* ... and a group it holds back open on the loop */
  return NCFSM_OK;
}

static void count_work(snap_comm *s, const ncfsm_work *w) {
  if ((unsigned)w->state < NCFSM_WORK_STATE_COUNT) s->works[w->state]++;
  if (!s->has_oldest || w->t_submit < s->oldest_submit_ns) {
    s->has_oldest = true;
    s->oldest_fp = w->fp;
    s->oldest_state = (ncfsm_work_state_t)w->state;
    s->oldest_submit_ns = w->t_submit;
    s->oldest_launch_ns = w->t_launch;
  }
}

/* Under the lock: the unfinished works of c, wherever they wait (the open
 * group, the launch queue, the launching list, the per-stream in-flight
 * FIFOs). A batch spanning comms holds other comms' works too. */
static void copy_works(const ncfsm_loop *loop, const ncfsm_comm *c, snap_comm *s) {
  for (const ncfsm_work *w = loop->group_head; w; w = w->bnext)
    if (w->comm == c) count_work(s, w);
  const ncfsm_work *hw = ncfsm__held_op(loop); /* another thread's group held back (fsm/held.def) */
  if (hw && hw->comm == c) count_work(s, hw);
  for (const ncfsm__blink *l = c->bq_head; l; l = l->next)
    for (const ncfsm_work *w = l->b->head; w; w = w->bnext)
      if (w->comm == c) count_work(s, w);
  for (const ncfsm_work *w = c->launching; w; w = w->next) count_work(s, w);
  for (int i = 0; i < c->nsq; i++)
    for (const ncfsm_work *w = c->sq[i].head; w; w = w->next) count_work(s, w);
}

static void copy_comm(const ncfsm_loop *loop, const ncfsm_comm *c, snap_comm *s,
                      ncfsm__rec_entry *tail, unsigned tail_max) {
  memcpy(s->name, c->name, sizeof s->name);
  memcpy(s->last_error, c->last_error, sizeof s->last_error);
  memcpy(s->failure, c->failure, sizeof s->failure);
  s->name[sizeof s->name - 1] = s->last_error[sizeof s->last_error - 1] =
      s->failure[sizeof s->failure - 1] = '\0';
  s->rank = c->rank;
  s->nranks = c->nranks;
  s->device = c->opts.device;
  s->blocking = c->opts.blocking;
  s->released = c->state == NCFSM_STATE_RELEASED;
  s->be = c->be;
  s->state = (ncfsm_state_t)c->state;
  s->state_since_ns = c->state_since_ns;
  s->created_ns = c->created_ns;
  s->timeout_ms = c->opts.timeout_ms;
  s->seq = c->coll_seq;
  s->hash = c->hash;
  s->comm_id = c->comm_id;
  s->verify = c->opts.verify;
  s->verify_state = c->vops ? c->vops->state_name(c) : NULL;
  s->verified_seq = c->vops ? c->vops->verified(c) : 0;
  s->cause = c->cause;
  s->async_code = c->async_code;
  copy_works(loop, c, s);
  memcpy(s->finished, c->works_final, sizeof s->finished);
  s->rec_capacity = ncfsm__rec_capacity(c->rec);
  s->tail = tail;
  s->ntail = tail_max ? ncfsm__rec_snapshot(c->rec, tail, tail_max, &s->rec_total) : 0;
  if (!tail_max) s->rec_total = ncfsm__rec_total(c->rec);
}

static void snap_free(snap *s) {
  free(s->comms);
  free(s->tails);
}

/* Copies what the loop holds; the lock is held for this alone. */
static ncfsm_result_t snap_take(ncfsm_loop *loop, unsigned tail_max, snap *s) {
  memset(s, 0, sizeof *s);
  if (tail_max > TAIL_MAX) tail_max = TAIL_MAX;
  ncfsm_result_t r = lock_loop(loop);
  if (r != NCFSM_OK) return r;
  s->now_ns = ncfsm__now_ns();
  s->stats = loop->stats;
  s->group_depth = loop->group_depth;
  s->nqueued = loop->nqueued;
  s->pool = loop->pool;
  s->works_free = loop->nfree;
  s->handoffs = loop->handoffs;
  memcpy(s->spins, loop->spins, sizeof s->spins);
  s->co = loop->co;
  int n = 0;
  for (const ncfsm_comm *c = loop->comms; c; c = c->next) n++;
  s->comms = n ? calloc((size_t)n, sizeof *s->comms) : NULL;
  s->tails = n && tail_max ? malloc((size_t)n * tail_max * sizeof *s->tails) : NULL;
  if (n && (!s->comms || (tail_max && !s->tails))) {
    pthread_mutex_unlock(&loop->mu);
    snap_free(s);
    return NCFSM_ERR_NO_MEMORY;
  }
  /* The loop lists its comms newest first: the snapshot lists them in the
   * order they were created. */
  int i = n;
  for (const ncfsm_comm *c = loop->comms; c; c = c->next) {
    i--;
    copy_comm(loop, c, &s->comms[i], s->tails ? s->tails + (size_t)i * tail_max : NULL, tail_max);
  }
  s->ncomms = n;
  pthread_mutex_unlock(&loop->mu);
  return NCFSM_OK;
}

/* ---- health ------------------------------------------------------------------------ */

/* Failed: a state with flag FAILED, or one out of service (SHRUNK, CLOSING,
 * CLOSED, RELEASED) reached through a failure. */
static bool comm_failed(ncfsm_state_t st, const char *failure) {
  unsigned f = ncfsm_state_flags(st);
  return (f & NCFSM_SF_FAILED) || (failure[0] != '\0' && !(f & (NCFSM_SF_LIVE | NCFSM_SF_WORKS)));
}

int ncfsm_loop_failed_comms(ncfsm_loop *loop, char *why, size_t len) {
  if (!loop_ok(loop)) return -1;
  if (why && len) why[0] = '\0';
  if (lock_loop(loop) != NCFSM_OK) return -1;
  int n = 0;
  size_t used = 0;
  for (const ncfsm_comm *c = loop->comms; c; c = c->next) {
    if (!comm_failed((ncfsm_state_t)c->state, c->failure)) continue;
    n++;
    if (why && len > used + 1) {
      int k = snprintf(why + used, len - used, "%s rank %d: %s: %s\n", c->name, c->rank,
                       ncfsm_state_name((ncfsm_state_t)c->state), c->failure[0] ? c->failure : c->last_error);
      used = k < 0 ? used : (size_t)k >= len - used ? len - 1 : used + (size_t)k;
    }
  }
  pthread_mutex_unlock(&loop->mu);
  return n;
}

/* ---- JSON ------------------------------------------------------------------------- */

static void version_str(int code, char *buf, size_t len) {
  /* NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9 */
  if (code >= 20900) snprintf(buf, len, "%d.%d.%d", code / 10000, code / 100 % 100, code % 100);
  else snprintf(buf, len, "%d.%d.%d", code / 1000, code / 100 % 10, code % 100);
}

static json_t *hex64(uint64_t v) {
  char b[24];
  snprintf(b, sizeof b, "%016" PRIx64, v);
  return json_string(b);
}

static double ms_between(uint64_t from_ns, uint64_t to_ns) {
  return to_ns >= from_ns ? (double)(to_ns - from_ns) / 1e6 : 0.0;
}

/* A time relative to the entry's submission in ms, or null when not reached. */
static json_t *since_submit_ms(const ncfsm__rec_entry *e, uint64_t t) {
  return t && e->t_submit_ns ? json_real(ms_between(e->t_submit_ns, t)) : json_null();
}

static json_t *seq_json(uint64_t seq) {
  return seq == NCFSM_SEQ_NONE ? json_null() : json_integer((json_int_t)seq);
}

static json_t *fp_json(const ncfsm_fingerprint_t *fp) {
  json_t *o = json_object();
  json_object_set_new(o, "op", json_string(ncfsm_opkind_name((ncfsm_opkind_t)fp->op)));
  json_object_set_new(o, "seq", seq_json(fp->seq));
  json_object_set_new(o, "count", json_integer((json_int_t)fp->count));
  json_object_set_new(o, "dtype", json_string(ncfsm_dtype_name((ncfsm_dtype_t)fp->dtype)));
  json_object_set_new(o, "root", fp->root >= 0 ? json_integer(fp->root) : json_null());
  json_object_set_new(o, "redop",
                      fp->redop >= 0 ? json_string(ncfsm_redop_name((ncfsm_redop_t)fp->redop)) : json_null());
  json_object_set_new(o, "peer", fp->peer >= 0 ? json_integer(fp->peer) : json_null());
  return o;
}

static json_t *recorder_json(const snap_comm *s, uint64_t now) {
  json_t *r = json_object();
  json_object_set_new(r, "capacity", json_integer(s->rec_capacity));
  json_object_set_new(r, "total", json_integer((json_int_t)s->rec_total));
  json_t *tail = json_array();
  for (unsigned i = 0; i < s->ntail; i++) {
    const ncfsm__rec_entry *e = &s->tail[i];
    json_t *o = fp_json(&e->fp);
    json_object_set_new(o, "id", json_integer((json_int_t)e->id));
    json_object_set_new(o, "group", e->group ? json_integer((json_int_t)e->group) : json_null());
    json_object_set_new(o, "state", json_string(ncfsm_work_state_name((ncfsm_work_state_t)e->state)));
    json_object_set_new(o, "result", json_string(ncfsm_err_name((ncfsm_result_t)e->result)));
    json_object_set_new(o, "age_ms", json_real(ms_between(e->t_submit_ns, now)));
    json_object_set_new(o, "launch_ms", since_submit_ms(e, e->t_launch_ns));
    json_object_set_new(o, "final_ms", since_submit_ms(e, e->t_final_ns));
    json_object_set_new(o, "complete_ms", since_submit_ms(e, e->t_complete_ns));
    json_array_append_new(tail, o);
  }
  json_object_set_new(r, "tail", tail);
  return r;
}

static json_t *comm_json(const snap_comm *s, uint64_t now) {
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string(s->name));
  json_object_set_new(o, "rank", s->rank >= 0 ? json_integer(s->rank) : json_null());
  json_object_set_new(o, "size", s->nranks > 0 ? json_integer(s->nranks) : json_null());
  json_object_set_new(o, "device", json_integer(s->device));
  json_object_set_new(o, "blocking", json_boolean(s->blocking));
  json_object_set_new(o, "released", json_boolean(s->released));
  json_object_set_new(o, "comm_id", s->comm_id ? hex64(s->comm_id) : json_null());
  json_object_set_new(o, "backend", json_string(s->be->name));
  int v = s->be->version ? s->be->version() : 0;
  char vs[32];
  version_str(v, vs, sizeof vs);
  json_object_set_new(o, "nccl_version", v > 0 ? json_string(vs) : json_null());
  json_object_set_new(o, "state", json_string(ncfsm_state_name(s->state)));
  json_object_set_new(o, "state_ms", json_real(ms_between(s->state_since_ns, now)));
  json_object_set_new(o, "age_ms", json_real(ms_between(s->created_ns, now)));
  json_object_set_new(o, "failed", json_boolean(comm_failed(s->state, s->failure)));
  json_object_set_new(o, "seq", json_integer((json_int_t)s->seq));
  json_object_set_new(o, "hash", hex64(s->hash));
  static const char *const vmode[] = {"off", "async", "strict"};
  json_t *vo = json_object();
  json_object_set_new(vo, "mode", json_string((unsigned)s->verify < 3 ? vmode[s->verify] : "?"));
  json_object_set_new(vo, "state", s->verify_state ? json_string(s->verify_state) : json_null());
  json_object_set_new(vo, "verified_seq", json_integer((json_int_t)s->verified_seq));
  json_object_set_new(o, "verify", vo);
  json_object_set_new(o, "timeout_ms", json_integer((json_int_t)s->timeout_ms));
  json_object_set_new(o, "last_error", json_string(s->last_error));
  json_object_set_new(o, "failure", json_string(s->failure));
  json_object_set_new(o, "cause", json_string(ncfsm_err_name(s->cause)));
  json_object_set_new(o, "backend_error",
                      s->async_code ? json_string(ncfsm__nccl_result_name(s->async_code)) : json_null());
  json_t *works = json_object();
  for (int st = 0; st < NCFSM_WORK_STATE_COUNT; st++)
    if (!ncfsm__work_state_final((ncfsm_work_state_t)st))
    json_object_set_new(works, ncfsm_work_state_name((ncfsm_work_state_t)st),
                        json_integer((json_int_t)s->works[st]));
  json_object_set_new(o, "works", works);
  json_t *fin = json_object();
  for (int st = 0; st < NCFSM_WORK_STATE_COUNT; st++)
    if (ncfsm__work_state_final((ncfsm_work_state_t)st))
    json_object_set_new(fin, ncfsm_work_state_name((ncfsm_work_state_t)st), json_integer((json_int_t)s->finished[st]));
  json_object_set_new(o, "finished", fin);
  if (s->has_oldest) {
    json_t *w = fp_json(&s->oldest_fp);
    json_object_set_new(w, "state", json_string(ncfsm_work_state_name(s->oldest_state)));
    json_object_set_new(w, "age_ms", json_real(ms_between(s->oldest_submit_ns, now)));
    json_object_set_new(w, "in_flight_ms",
                        s->oldest_launch_ns ? json_real(ms_between(s->oldest_launch_ns, now)) : json_null());
    json_object_set_new(o, "oldest_work", w);
  } else {
    json_object_set_new(o, "oldest_work", json_null());
  }
  json_object_set_new(o, "recorder", recorder_json(s, now));
  return o;
}

/* The cap and, under auto, the fitted launch costs (null before a fit). */
static json_t *coalesce_json(const ncfsm__coalesce *co) {
  json_t *o = json_object();
  bool fit = co->adaptive && co->fitted;
  json_object_set_new(o, "mode", json_string(co->adaptive ? "auto" : "fixed"));
  json_object_set_new(o, "cap", json_integer(co->cap));
  json_object_set_new(o, "fixed_ns", fit ? json_real(co->fixed_ns) : json_null());
  json_object_set_new(o, "per_op_ns", fit ? json_real(co->per_op_ns) : json_null());
  json_object_set_new(o, "measured", json_integer((json_int_t)co->samples));
  return o;
}

static json_t *status_json(const snap *s) {
  json_t *root = json_object();
  if (!root) return NULL;
  json_object_set_new(root, "schema", json_string(NCFSM_STATUS_SCHEMA));
  char ver[32];
  snprintf(ver, sizeof ver, "%d.%d.%d", NCFSM_VERSION_MAJOR, NCFSM_VERSION_MINOR, NCFSM_VERSION_PATCH);
  json_object_set_new(root, "ncfsm_version", json_string(ver));
  json_object_set_new(root, "pid", json_integer(getpid()));
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  json_object_set_new(root, "unix_time", json_real((double)ts.tv_sec + (double)ts.tv_nsec / 1e9));
  json_object_set_new(root, "monotonic_ns", json_integer((json_int_t)s->now_ns));
  json_t *loop = json_object();
  json_object_set_new(loop, "comms", json_integer(s->ncomms));
  int failed = 0;
  for (int i = 0; i < s->ncomms; i++) failed += comm_failed(s->comms[i].state, s->comms[i].failure);
  json_object_set_new(loop, "failed_comms", json_integer(failed));
  json_object_set_new(loop, "group_depth", json_integer(s->group_depth));
  json_object_set_new(loop, "queued_batches", json_integer(s->nqueued));
  json_t *fin = json_object();
  for (int st = 0; st < NCFSM_WORK_STATE_COUNT; st++)
    if (ncfsm__work_state_final((ncfsm_work_state_t)st))
    json_object_set_new(fin, ncfsm_work_state_name((ncfsm_work_state_t)st),
                        json_integer((json_int_t)s->stats.works_final[st]));
  json_object_set_new(loop, "works_finished", fin);
  uint64_t rej = 0, tr = 0;
  for (int a = 0; a < NCFSM_STATE_COUNT; a++) {
    for (int b = 0; b < NCFSM_CALL_COUNT; b++) rej += s->stats.reject[a][b];
    for (int b = 0; b < NCFSM_STATE_COUNT; b++) tr += s->stats.trans[a][b];
  }
  json_object_set_new(loop, "transitions", json_integer((json_int_t)tr));
  json_object_set_new(loop, "rejected_calls", json_integer((json_int_t)rej));
  json_object_set_new(loop, "coalesce", coalesce_json(&s->co));
  json_object_set_new(root, "loop", loop);
  json_t *comms = json_array();
  for (int i = 0; i < s->ncomms; i++) json_array_append_new(comms, comm_json(&s->comms[i], s->now_ns));
  json_object_set_new(root, "comms", comms);
  return root;
}

ncfsm_result_t ncfsm_loop_status(ncfsm_loop *loop, const ncfsm_introspect_opts *opts, json_t **out) {
  if (!out) return NCFSM_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!loop_ok(loop)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_introspect_opts o;
  if (opts) o = *opts;
  else ncfsm_introspect_opts_init(&o);
  snap s;
  ncfsm_result_t r = snap_take(loop, o.recorder_tail, &s);
  if (r != NCFSM_OK) return r;
  *out = status_json(&s);
  snap_free(&s);
  return *out ? NCFSM_OK : NCFSM_ERR_NO_MEMORY;
}

ncfsm_result_t ncfsm_loop_status_text(ncfsm_loop *loop, const ncfsm_introspect_opts *opts,
                                      char **out, size_t *len) {
  if (!out) return NCFSM_ERR_INVALID_ARGUMENT;
  *out = NULL;
  json_t *j;
  ncfsm_result_t r = ncfsm_loop_status(loop, opts, &j);
  if (r != NCFSM_OK) return r;
  *out = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!*out) return NCFSM_ERR_NO_MEMORY;
  if (len) *len = strlen(*out);
  return NCFSM_OK;
}

/* ---- Prometheus text ------------------------------------------------------------- */

typedef struct tbuf {
  char *p;
  size_t len, cap;
  bool oom;
} tbuf;

static void tb_printf(tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(tbuf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) { b->oom = true; return; }
    if (b->p && b->len + (size_t)n < b->cap) { b->len += (size_t)n; return; }
    size_t cap = b->cap ? b->cap : 16384;
    while (cap <= b->len + (size_t)n) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) { b->oom = true; return; }
    b->p = q;
    b->cap = cap;
  }
}

static void tb_family(tbuf *b, const char *name, const char *type, const char *help) {
  tb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value: backslash, double quote and newline escaped. */
static void label_escape(const char *in, char *out, size_t len) {
  size_t j = 0;
  for (; *in && j + 2 < len; in++) {
    if (*in == '\\' || *in == '"') { out[j++] = '\\'; out[j++] = *in; }
    else if (*in == '\n') { out[j++] = '\\'; out[j++] = 'n'; }
    else out[j++] = *in;
  }
  out[j] = '\0';
}

/* (from, to) pairs some row of the table leads through, and (state, call)
 * cells that can refuse (REJECT, or a guard): the series that always appear,
 * at 0 until they happen, so that rate() sees their first increment. */
static bool pair_possible_[NCFSM_STATE_COUNT][NCFSM_STATE_COUNT];
static bool cell_can_reject_[NCFSM_STATE_COUNT][NCFSM_CALL_COUNT];
static pthread_once_t series_once = PTHREAD_ONCE_INIT;

static void series_init(void) {
  for (int f = 0; f < NCFSM_STATE_COUNT; f++) {
    for (int t = 0; t < NCFSM_STATE_COUNT; t++)
      for (int e = 0; e < NCFSM_EVENT_COUNT && !pair_possible_[f][t]; e++)
        pair_possible_[f][t] = ncfsm_transition_allowed((ncfsm_state_t)f, (ncfsm_event_t)e, (ncfsm_state_t)t);
    for (int c = 0; c < NCFSM_CALL_COUNT; c++) {
      unsigned long long g = ncfsm__comm_cells[f][c].guards;
      cell_can_reject_[f][c] =
          ncfsm_legality((ncfsm_state_t)f, (ncfsm_call_t)c, NULL, NULL) == NCFSM_REJECT || g != 0;
    }
  }
}

static bool pair_possible(ncfsm_state_t from, ncfsm_state_t to) { return pair_possible_[from][to]; }
static bool cell_can_reject(ncfsm_state_t st, ncfsm_call_t c) { return cell_can_reject_[st][c]; }

/* The coalescing cap (fsm/coalesce.h): NaN costs while there is no fit. */
static void metrics_coalesce(tbuf *b, const ncfsm__coalesce *co) {
  const char *mode = co->adaptive ? "auto" : "fixed";
  bool fit = co->adaptive && co->fitted;
  tb_family(b, "ncfsm_coalesce_cap", "gauge",
            "Most ops the loop's next coalesced launch may hold: NCFSM_COALESCE_MAX, or chosen from the fitted costs (auto).");
  tb_printf(b, "ncfsm_coalesce_cap{mode=\"%s\"} %u\n", mode, co->cap);
  tb_family(b, "ncfsm_coalesce_launch_cost_seconds", "gauge",
            "Auto: the fitted cost of a coalesced launch, fixed per launch and per op (NaN before a fit or when pinned).");
  const char *part[2] = {"fixed", "per_op"};
  double ns[2] = {co->fixed_ns, co->per_op_ns};
  for (int i = 0; i < 2; i++) {
    if (fit) tb_printf(b, "ncfsm_coalesce_launch_cost_seconds{part=\"%s\"} %.9g\n", part[i], ns[i] / 1e9);
    else tb_printf(b, "ncfsm_coalesce_launch_cost_seconds{part=\"%s\"} NaN\n", part[i]);
  }
  tb_family(b, "ncfsm_coalesce_launches_measured_total", "counter", "Auto: coalesced launches timed for the fit.");
  tb_printf(b, "ncfsm_coalesce_launches_measured_total %" PRIu64 "\n", co->samples);
}

static void metrics_loop(tbuf *b, const snap *s) {
  pthread_once(&series_once, series_init);
  tb_family(b, "ncfsm_transitions_total", "counter",
            "Communicator state transitions of this loop, per (from, to) state (fsm/comm.def).");
  for (int f = 0; f < NCFSM_STATE_COUNT; f++)
    for (int t = 0; t < NCFSM_STATE_COUNT; t++)
      if (s->stats.trans[f][t] || pair_possible((ncfsm_state_t)f, (ncfsm_state_t)t))
        tb_printf(b, "ncfsm_transitions_total{from=\"%s\",to=\"%s\"} %" PRIu64 "\n",
                  ncfsm_state_name((ncfsm_state_t)f), ncfsm_state_name((ncfsm_state_t)t),
                  s->stats.trans[f][t]);
  tb_family(b, "ncfsm_comms", "gauge", "Communicators of this loop per state.");
  int per[NCFSM_STATE_COUNT] = {0};
  for (int i = 0; i < s->ncomms; i++) per[s->comms[i].state]++;
  for (int st = 0; st < NCFSM_STATE_COUNT; st++)
    tb_printf(b, "ncfsm_comms{state=\"%s\"} %d\n", ncfsm_state_name((ncfsm_state_t)st), per[st]);
  tb_family(b, "ncfsm_rejected_calls_total", "counter",
            "Calls the legality table refused before the backend saw them, per (state, call).");
  for (int st = 0; st < NCFSM_STATE_COUNT; st++)
    for (int c = 0; c < NCFSM_CALL_COUNT; c++)
      if (s->stats.reject[st][c] || cell_can_reject((ncfsm_state_t)st, (ncfsm_call_t)c))
        tb_printf(b, "ncfsm_rejected_calls_total{state=\"%s\",call=\"%s\"} %" PRIu64 "\n",
                  ncfsm_state_name((ncfsm_state_t)st), ncfsm_call_fn((ncfsm_call_t)c),
                  s->stats.reject[st][c]);
  tb_family(b, "ncfsm_op_latency_seconds", "histogram",
            "Time from submission to a final state (completed, failed, timed out or aborted), per op kind.");
  for (int k = 0; k < NCFSM_OPKIND_COUNT; k++) {
    const char *op = ncfsm_opkind_name((ncfsm_opkind_t)k);
    uint64_t cum = 0;
    /* bucket i counts latencies <= 2^i us; the last one holds the rest (+Inf) */
    for (int i = 0; i < NCFSM__LAT_BUCKETS - 1; i++) {
      cum += s->stats.lat_bucket[k][i];
      tb_printf(b, "ncfsm_op_latency_seconds_bucket{op=\"%s\",le=\"%.9g\"} %" PRIu64 "\n", op,
                (double)(1ull << i) * 1e-6, cum);
    }
    tb_printf(b, "ncfsm_op_latency_seconds_bucket{op=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", op,
              s->stats.lat_count[k]);
    tb_printf(b, "ncfsm_op_latency_seconds_sum{op=\"%s\"} %.9f\n", op, (double)s->stats.lat_sum_ns[k] / 1e9);
    tb_printf(b, "ncfsm_op_latency_seconds_count{op=\"%s\"} %" PRIu64 "\n", op, s->stats.lat_count[k]);
  }
  tb_family(b, "ncfsm_works_finished_total", "counter", "Works of this loop that reached each final state.");
  for (int st = 0; st < NCFSM_WORK_STATE_COUNT; st++)
    if (ncfsm__work_state_final((ncfsm_work_state_t)st))
    tb_printf(b, "ncfsm_works_finished_total{state=\"%s\"} %" PRIu64 "\n",
              ncfsm_work_state_name((ncfsm_work_state_t)st), s->stats.works_final[st]);
  /* the pools (fsm/objects.h): kept while busy, given back after an idle bound */
  tb_family(b, "ncfsm_pool_free", "gauge",
            "Freed objects kept for reuse: works (the loop's) and completion events (all its comms').");
  tb_printf(b, "ncfsm_pool_free{pool=\"works\"} %d\nncfsm_pool_free{pool=\"events\"} %d\n", s->works_free,
            s->pool.marks_free);
  tb_family(b, "ncfsm_pool_returned_total", "counter",
            "Objects the pools gave back to the allocator after the loop was idle for the pools' bound.");
  tb_printf(b, "ncfsm_pool_returned_total{pool=\"works\"} %" PRIu64 "\nncfsm_pool_returned_total{pool=\"events\"} %" PRIu64
            "\n", s->pool.works_returned, s->pool.marks_returned);
  tb_family(b, "ncfsm_works_allocated_total", "counter", "Works this loop allocated (from its pool or the allocator).");
  tb_printf(b, "ncfsm_works_allocated_total %" PRIu64 "\n", s->pool.allocs);
  tb_family(b, "ncfsm_submit_handoffs_total", "counter",
            "Submissions made while another thread held the loop's lock, handed off without waiting for it.");
  tb_printf(b, "ncfsm_submit_handoffs_total %" PRIu64 "\n", s->handoffs);
  tb_family(b, "ncfsm_spins_total", "counter",
            "Spins before sleeping (spin_us): of threads waiting for the loop and of the loop's own thread with "
            "nothing pending; end: woken (a waiter: the loop broadcast, it looked again; the loop's thread: a "
            "hand-off or a wake came) or bound (its time passed: it looked again, or slept).");
  static const char *const who[2] = {"waiter", "loop"}, *const end[2] = {"woken", "bound"};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++)
      tb_printf(b, "ncfsm_spins_total{thread=\"%s\",end=\"%s\"} %" PRIu64 "\n", who[i], end[j], s->spins[i][j]);
  metrics_coalesce(b, &s->co);
}

/* Per-comm labels: comm (its name; "#2", "#3"... appended when another comm
 * of the loop has the same name and rank, so that no two series collide). */
static void comm_labels(const snap *s, int i, char *out, size_t len) {
  int dup = 1;
  for (int j = 0; j < i; j++)
    if (s->comms[j].rank == s->comms[i].rank && !strcmp(s->comms[j].name, s->comms[i].name)) dup++;
  char esc[160], name[80];
  if (dup > 1) snprintf(name, sizeof name, "%s#%d", s->comms[i].name, dup);
  else snprintf(name, sizeof name, "%s", s->comms[i].name);
  label_escape(name, esc, sizeof esc);
  snprintf(out, len, "comm=\"%s\",rank=\"%d\"", esc, s->comms[i].rank);
}

static void metrics_comms(tbuf *b, const snap *s) {
  char (*lab)[200] = s->ncomms ? calloc((size_t)s->ncomms, sizeof *lab) : NULL;
  if (s->ncomms && !lab) { b->oom = true; return; }
  for (int i = 0; i < s->ncomms; i++) comm_labels(s, i, lab[i], sizeof lab[i]);
  tb_family(b, "ncfsm_comm_info", "gauge", "One per communicator: its size, backend and NCCL version (value 1).");
  for (int i = 0; i < s->ncomms; i++) {
    const snap_comm *c = &s->comms[i];
    int v = c->be->version ? c->be->version() : 0;
    char vs[32] = "";
    if (v > 0) version_str(v, vs, sizeof vs);
    tb_printf(b, "ncfsm_comm_info{%s,size=\"%d\",backend=\"%s\",nccl_version=\"%s\",comm_id=\"%016" PRIx64 "\"} 1\n",
              lab[i], c->nranks, c->be->name, vs, c->comm_id);
  }
  tb_family(b, "ncfsm_comm_state", "gauge", "1 for the state each communicator is in, 0 for the others.");
  for (int i = 0; i < s->ncomms; i++)
    for (int st = 0; st < NCFSM_STATE_COUNT; st++)
      tb_printf(b, "ncfsm_comm_state{%s,state=\"%s\"} %d\n", lab[i], ncfsm_state_name((ncfsm_state_t)st),
                (int)s->comms[i].state == st);
  tb_family(b, "ncfsm_comm_state_seconds", "gauge", "Time each communicator has been in its current state.");
  for (int i = 0; i < s->ncomms; i++)
    tb_printf(b, "ncfsm_comm_state_seconds{%s} %.6f\n", lab[i],
              ms_between(s->comms[i].state_since_ns, s->now_ns) / 1e3);
  tb_family(b, "ncfsm_comm_failed", "gauge",
            "1 when the communicator failed (ERROR, ABORT_QUEUED, REVOKING, REVOKED, or closed after a failure).");
  for (int i = 0; i < s->ncomms; i++)
    tb_printf(b, "ncfsm_comm_failed{%s} %d\n", lab[i], comm_failed(s->comms[i].state, s->comms[i].failure));
  tb_family(b, "ncfsm_comm_collectives_total", "counter",
            "Collectives each communicator handed to the backend (its next seq).");
  for (int i = 0; i < s->ncomms; i++)
    tb_printf(b, "ncfsm_comm_collectives_total{%s} %" PRIu64 "\n", lab[i], s->comms[i].seq);
  tb_family(b, "ncfsm_comm_works", "gauge", "Unfinished works of each communicator per work state.");
  for (int i = 0; i < s->ncomms; i++)
    for (int st = 0; st < NCFSM_WORK_STATE_COUNT; st++)
    if (!ncfsm__work_state_final((ncfsm_work_state_t)st))
      tb_printf(b, "ncfsm_comm_works{%s,state=\"%s\"} %" PRIu64 "\n", lab[i],
                ncfsm_work_state_name((ncfsm_work_state_t)st), s->comms[i].works[st]);
  tb_family(b, "ncfsm_comm_works_finished_total", "counter",
            "Works of each communicator that reached each final state.");
  for (int i = 0; i < s->ncomms; i++)
    for (int st = 0; st < NCFSM_WORK_STATE_COUNT; st++)
    if (ncfsm__work_state_final((ncfsm_work_state_t)st))
      tb_printf(b, "ncfsm_comm_works_finished_total{%s,state=\"%s\"} %" PRIu64 "\n", lab[i],
                ncfsm_work_state_name((ncfsm_work_state_t)st), s->comms[i].finished[st]);
  tb_family(b, "ncfsm_comm_oldest_work_seconds", "gauge",
            "Age (since submission) of each communicator's oldest unfinished work; 0 when none.");
  for (int i = 0; i < s->ncomms; i++)
    tb_printf(b, "ncfsm_comm_oldest_work_seconds{%s} %.6f\n", lab[i],
              s->comms[i].has_oldest ? ms_between(s->comms[i].oldest_submit_ns, s->now_ns) / 1e3 : 0.0);
  free(lab);
}

ncfsm_result_t ncfsm_loop_metrics(ncfsm_loop *loop, char **out, size_t *len) {
  if (!out) return NCFSM_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!loop_ok(loop)) return NCFSM_ERR_INVALID_ARGUMENT;
  snap s;
  ncfsm_result_t r = snap_take(loop, 0, &s);
  if (r != NCFSM_OK) return r;
  tbuf b = {0};
  metrics_loop(&b, &s);
  metrics_comms(&b, &s);
  snap_free(&s);
  if (b.oom || !b.p) {
    free(b.p);
    return NCFSM_ERR_NO_MEMORY;
  }
  *out = b.p;
  if (len) *len = b.len;
  return NCFSM_OK;
}
