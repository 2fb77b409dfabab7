/*
 * Bootstrap dispatch: reads the environment through the settings table (and
 * refuses what it does not accept), picks the implementation, owns the request
 * lifecycle (wake event, timeout timer, done callback) and the last-error
 * string.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/event.h>

#include "bootstrap/boot-internal.h"
#include "core/backend.h"
#include "core/settings.h"
#include "bootstrap/secret.h"

static _Thread_local char open_err[NCFSM__BOOT_ERRLEN];

const char *ncfsm_boot_open_error(void) { return open_err; }

const char *ncfsm_boot_kind_name(ncfsm_boot_kind_t k) {
  switch (k) {
  case NCFSM_BOOT_AUTO: return "auto";
  case NCFSM_BOOT_PMIX: return "pmix";
  case NCFSM_BOOT_TCP: return "tcp";
  case NCFSM_BOOT_LOCAL: return "local";
  }
  return "unknown";
}

/* ---- the environment, through the settings table (core/settings.def) ---------------------- */

/* Every field from the table: a bad value is logged and its default kept (ncfsm_boot_open then
 * refuses it: ncfsm__boot_env_check). */
void ncfsm_boot_opts_init(ncfsm_boot_opts *o) { (void)ncfsm__boot_opts_fill(o); }

extern char **environ;

/* The bootstrap's and the store's names: a variable with one of these prefixes that is not a
 * row of the table is a misspelling (or a setting that does not exist). */
static const char *const own_prefixes[] = {"NCFSM_STORE_", "NCFSM_BOOTSTRAP_", "NCFSM_LOCAL_"};

/* The edit distance of a and b, up to 3 (3: three or more). */
static int edits(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63 || (la > lb ? la - lb : lb - la) > 2) return 3;
  int d[64][64];
  for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      d[i][j] = best;
    }
  return d[la][lb] < 3 ? d[la][lb] : 3;
}

/* The bootstrap's and the store's variables like name (tail: its part after the prefix): those
 * that contain tail, or are at most 2 letters from name; "A, B or C" into buf. */
static void alike(const char *name, const char *tail, char *buf, size_t n) {
  const char *hit[8];
  int k = 0;
  for (int i = 0; i < NCFSM__SET_COUNT && k < 8; i++) {
    const ncfsm__setting *s = &ncfsm__settings[i];
    if (!s->env || s->src != NCFSM__SRC_ENV || (s->subsys != NCFSM__SS_BOOT && s->subsys != NCFSM__SS_STORE))
      continue;
    if ((strlen(tail) >= 3 && strstr(s->env, tail)) || edits(s->env, name) < 3) hit[k++] = s->env;
  }
  size_t off = 0;
  buf[0] = 0;
  for (int i = 0; i < k && off < n; i++)
    off += (size_t)snprintf(buf + off, n - off, "%s%s", i == 0 ? "" : i == k - 1 ? " or " : ", ", hit[i]);
}

int ncfsm__boot_env_unknown(char *err, size_t n) {
  for (char **e = environ; e && *e; e++) {
    const char *eq = strchr(*e, '=');
    size_t len = eq ? (size_t)(eq - *e) : 0, pl = 0;
    for (size_t p = 0; p < sizeof own_prefixes / sizeof own_prefixes[0] && !pl; p++)
      if (len > strlen(own_prefixes[p]) && !strncmp(*e, own_prefixes[p], strlen(own_prefixes[p])))
        pl = strlen(own_prefixes[p]);
    char name[96];
    if (!pl || len >= sizeof name) continue;
    memcpy(name, *e, len);
    name[len] = 0;
    if (ncfsm__setting_find(name)) continue;
    char like[300];
    alike(name, name + pl, like, sizeof like);
    snprintf(err, n, "%s is set but is not a setting of ncfsm (its value is not shown)%s%s%s it or "
                     "correct its name (every variable: docs/settings.md, or ncfsm-info)",
             name, like[0] ? "; did you mean " : "", like, like[0] ? "? Unset" : "; unset");
    return -1;
  }
  return 0;
}

/* Every variable ncfsm_boot_opts_init reads, and the names of the bootstrap and the store:
 * NCFSM_OK, or NCFSM_ERR_INVALID_ARGUMENT with the table's message. */
static ncfsm_result_t env_check(char *err, size_t n) {
  if (ncfsm__boot_env_unknown(err, n)) return NCFSM_ERR_INVALID_ARGUMENT;
  for (int i = 0; i < NCFSM__SET_COUNT; i++) {
    const ncfsm__setting *s = &ncfsm__settings[i];
    ncfsm__setting_val v;
    if (s->subsys == NCFSM__SS_BOOT && s->src == NCFSM__SRC_ENV && ncfsm__setting_get(s, &v, err, n))
      return NCFSM_ERR_INVALID_ARGUMENT;
  }
  return NCFSM_OK;
}

/* auto with neither PMIx nor a store: an error when the launcher started more than one task
 * (each would run alone as rank 0 of 1). */
static ncfsm_result_t launched_alone(char *err, size_t n) {
  static const ncfsm__setting_id tasks[] = {NCFSM__SET_SLURM_NTASKS, NCFSM__SET_OMPI_COMM_WORLD_SIZE,
                                            NCFSM__SET_PMI_SIZE};
  char set[160] = "";
  size_t off = 0;
  uint64_t most = 0;
  for (size_t i = 0; i < sizeof tasks / sizeof tasks[0]; i++) {
    const ncfsm__setting *s = &ncfsm__settings[tasks[i]];
    ncfsm__setting_val v;
    if (ncfsm__setting_get(s, &v, err, n)) return NCFSM_ERR_INVALID_ARGUMENT;
    if (!v.s || v.u < 2 || off >= sizeof set) continue;
    off += (size_t)snprintf(set + off, sizeof set - off, "%s%s=%s", off ? ", " : "", s->env, v.s);
    if (v.u > most) most = v.u;
  }
  if (!most) return NCFSM_OK;
  snprintf(err, n, "launched as %" PRIu64 " tasks (%s), but NCFSM_BOOTSTRAP=auto finds no PMIx (PMIX_RANK "
                   "is not set) and no store (NCFSM_STORE_ADDR is unset): each task would run alone. "
                   "Launch with srun --mpi=pmix or mpirun; or set NCFSM_BOOTSTRAP=tcp, NCFSM_STORE_ADDR, "
                   "NCFSM_RANK and NCFSM_WORLD_SIZE; or NCFSM_BOOTSTRAP=local to run each task alone",
           most, set);
  return NCFSM_ERR_BOOTSTRAP;
}

/* auto: pmix when PMIX_RANK is set, else tcp when there is a store address, else local (unless
 * launched as several tasks). */
static ncfsm_result_t pick_kind(const ncfsm_boot_opts *o, ncfsm_boot_kind_t *kind, char *err, size_t n) {
  *kind = o->kind;
  if (o->kind != NCFSM_BOOT_AUTO) return NCFSM_OK;
  ncfsm__setting_val pr;
  if (ncfsm__setting_get(&ncfsm__settings[NCFSM__SET_PMIX_RANK], &pr, err, n) == 0 && pr.s) {
    *kind = NCFSM_BOOT_PMIX;
    return NCFSM_OK;
  }
  if (o->store_addr && *o->store_addr) {
    *kind = NCFSM_BOOT_TCP;
    return NCFSM_OK;
  }
  *kind = NCFSM_BOOT_LOCAL;
  return launched_alone(err, n);
}

ncfsm_result_t ncfsm_boot_rank_secret(const char *token, int rank, int size, char out[65]) {
  if (out) out[0] = 0;
  if (!token || !*token || !out || size < 1 || rank < 0 || rank >= size)
    return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm__rank_secret(token, (uint32_t)rank, (uint32_t)size, out);
  return NCFSM_OK;
}

void ncfsm__boot_vseterr(ncfsm_boot *b, const char *fmt, va_list ap) {
  vsnprintf(b->err, sizeof b->err, fmt, ap);
  ncfsm__last_error_set(b->err);
  NCFSM_WARN(NCFSM__SUB_BOOT, "bootstrap %s rank %d: %s", b->ops ? b->ops->name : "?", b->rank,
             b->err);
}

void ncfsm__boot_seterr(ncfsm_boot *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ncfsm__boot_vseterr(b, fmt, ap);
  va_end(ap);
}

ncfsm_result_t ncfsm__boot_fail(ncfsm_boot *b, ncfsm_result_t st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ncfsm__boot_vseterr(b, fmt, ap);
  va_end(ap);
  ncfsm__boot_set_failed(b, st);
  return st;
}

ncfsm_boot *ncfsm__boot_shell_new(struct event_base *base, const ncfsm__boot_ops *ops,
                                  ncfsm_boot_kind_t kind) {
  ncfsm_boot *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->magic = NCFSM__BOOT_MAGIC;
  b->ops = ops;
  b->kind = kind;
  b->base = base;
  b->lost_ev = event_new(base, -1, 0, ncfsm__boot_lost_ev_cb, b);
  b->failed_ev = event_new(base, -1, 0, ncfsm__boot_failed_ev_cb, b);
  b->notice_ev = event_new(base, -1, 0, ncfsm__boot_notice_ev_cb, b);
  if (!b->lost_ev || !b->failed_ev || !b->notice_ev) {
    if (b->lost_ev) event_free(b->lost_ev);
    if (b->failed_ev) event_free(b->failed_ev);
    if (b->notice_ev) event_free(b->notice_ev);
    free(b);
    return NULL;
  }
  pthread_mutex_init(&b->notice_mu, NULL);
  return b;
}

static void req_pool_free(ncfsm_boot *b); /* the requests kept (below, with req_new) */

void ncfsm__boot_shell_free(ncfsm_boot *b) {
  req_pool_free(b);
  event_free(b->lost_ev);
  event_free(b->failed_ev);
  event_free(b->notice_ev);
  ncfsm__boot_notice_clear(b);
  pthread_mutex_destroy(&b->notice_mu);
  if (b->lost)
    for (int r = 0; r < b->size; r++) free(b->lost_why[r]);
  free(b->lost);
  free(b->lost_why);
  free(b->chan_tag);
  free(b->chan_ranks);
  b->magic = NCFSM__BOOT_DEAD_MAGIC;
  free(b);
}

/* ncfsm_boot_open fails with r: the reason is this thread's open error and last error (and,
 * with warn, a WARN: an implementation's own error was logged by ncfsm__boot_seterr). */
static ncfsm_result_t open_failed(ncfsm_result_t r, int warn, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ncfsm_result_t open_failed(ncfsm_result_t r, int warn, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(open_err, sizeof open_err, fmt, ap);
  va_end(ap);
  ncfsm__last_error_set(open_err);
  if (warn) NCFSM_WARN(NCFSM__SUB_BOOT, "ncfsm_boot_open: %s", open_err);
  return r;
}

ncfsm_result_t ncfsm_boot_open(struct event_base *base, const ncfsm_boot_opts *opts,
                               ncfsm_boot **out) {
  ncfsm__log_init();
  open_err[0] = 0;
  if (out) *out = NULL;
  if (!base || !out)
    return open_failed(NCFSM_ERR_INVALID_ARGUMENT, 0, "ncfsm_boot_open: base and out must not be NULL");
  ncfsm_boot_opts dflt;
  if (!opts) {
    ncfsm_boot_opts_init(&dflt);
    opts = &dflt;
  }
  char err[NCFSM__BOOT_ERRLEN];
  ncfsm_boot_kind_t kind = NCFSM_BOOT_AUTO;
  ncfsm_result_t r = env_check(err, sizeof err);
  if (r == NCFSM_OK) r = pick_kind(opts, &kind, err, sizeof err);
  if (r != NCFSM_OK) return open_failed(r, 1, "%s", err);
  const ncfsm__boot_ops *ops = NULL;
  switch (kind) {
  case NCFSM_BOOT_LOCAL: ops = &ncfsm__boot_local_ops; break;
  case NCFSM_BOOT_TCP: ops = &ncfsm__boot_tcp_ops; break;
  case NCFSM_BOOT_PMIX:
#ifdef NCFSM_HAVE_PMIX
    ops = &ncfsm__boot_pmix_ops;
#endif
    break;
  default: break;
  }
  if (!ops)
    return open_failed(NCFSM_ERR_UNSUPPORTED, 1,
                       "bootstrap %s is not built in (PMIx was not found at configure time): set "
                       "NCFSM_BOOTSTRAP=tcp with NCFSM_STORE_ADDR, or rebuild with libpmix-dev",
                       ncfsm_boot_kind_name(kind));
  ncfsm_boot *b = ncfsm__boot_shell_new(base, ops, kind);
  if (!b) return open_failed(NCFSM_ERR_NO_MEMORY, 0, "ncfsm_boot_open: out of memory");
  b->rank = opts->rank;
  b->size = opts->size;
  b->local_rank = opts->rank;
  b->local_size = opts->size;
  b->timeout_ms = opts->timeout_ms ? opts->timeout_ms : 60000;
  if ((r = ops->open(b, opts)) != NCFSM_OK) {
    open_failed(r, 0, "%s", b->err[0] ? b->err : ncfsm_strerror(r));
    ncfsm__boot_shell_free(b);
    return r;
  }
  NCFSM_INFO(NCFSM__SUB_BOOT, "bootstrap %s open: rank %d of %d (local %d of %d)", ops->name,
             b->rank, b->size, b->local_rank, b->local_size);
  *out = b;
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_boot_close(ncfsm_boot *b) {
  if (!b) return NCFSM_OK;
  if (b->magic != NCFSM__BOOT_MAGIC) return NCFSM_ERR_INVALID_ARGUMENT;
  if (b->live_reqs > 0) {
    ncfsm__boot_seterr(b, "ncfsm_boot_close: %d request(s) not freed; free them with "
                          "ncfsm_boot_req_free first",
                       b->live_reqs);
    return NCFSM_ERR_BUSY;
  }
  if (b->children > 0) {
    ncfsm__boot_seterr(b, "ncfsm_boot_close: %d survivors' bootstrap(s) of this one still open; "
                          "close them first (they share its channel)",
                       b->children);
    return NCFSM_ERR_BUSY;
  }
  if (b->in_lost_cb) {
    ncfsm__boot_seterr(b, "ncfsm_boot_close called from this bootstrap's peer-lost callback (or its "
                          "failed or notice callback); close it after the callback returned (e.g. "
                          "from a zero timer)");
    return NCFSM_ERR_BUSY;
  }
  bool busy = false;
  for (ncfsm_boot *c = b->chans; c && !busy; c = c->chan_next) busy = ncfsm__boot_chan_busy(c);
  if (busy) {
    char names[300] = "";
    size_t k = 0;
    for (ncfsm_boot *c = b->chans; c && k + 80 < sizeof names; c = c->chan_next)
      if (ncfsm__boot_chan_busy(c)) k += (size_t)snprintf(names + k, sizeof names - k, "%s'%s'", k ? ", " : "", c->chan_tag);
    ncfsm__boot_seterr(b, "ncfsm_boot_close: channel(s) of this bootstrap have requests out (%s); free them "
                          "first (a channel 'ncfsm.verify.*' is a communicator's verification: destroy or abort "
                          "that communicator first)",
                       names);
    return NCFSM_ERR_BUSY;
  }
  while (b->chans) ncfsm__boot_chan_orphan(b->chans); /* idle channels close with it */
  b->ops->close(b);
  if (b->chan_tag) ncfsm__boot_chan_unlink(b);
  else if (b->parent) b->parent->children--;
  ncfsm__boot_shell_free(b);
  return NCFSM_OK;
}

#define BOOT_OK(b) ((b) && (b)->magic == NCFSM__BOOT_MAGIC)

ncfsm_boot_kind_t ncfsm_boot_kind(const ncfsm_boot *b) { return BOOT_OK(b) ? b->kind : NCFSM_BOOT_AUTO; }
int ncfsm_boot_rank(const ncfsm_boot *b) { return BOOT_OK(b) ? b->rank : -1; }
int ncfsm_boot_size(const ncfsm_boot *b) { return BOOT_OK(b) ? b->size : -1; }
int ncfsm_boot_local_rank(const ncfsm_boot *b) { return BOOT_OK(b) ? b->local_rank : -1; }
int ncfsm_boot_local_size(const ncfsm_boot *b) { return BOOT_OK(b) ? b->local_size : -1; }
const char *ncfsm_boot_last_error(const ncfsm_boot *b) {
  return BOOT_OK(b) ? b->err : "invalid bootstrap handle";
}

/* The wake event runs on the loop thread: let the implementation take over
 * results handed in from other threads, then deliver the done callback. */
static void req_wake_cb(evutil_socket_t fd, short what, void *arg) {
  ncfsm_boot_req *req = arg;
  (void)fd;
  (void)what;
  if (req->status == NCFSM_ERR_AGAIN && req->b->ops->progress) req->b->ops->progress(req);
  if (req->status != NCFSM_ERR_AGAIN && req->cb && !req->cb_called) {
    req->cb_called = 1;
    req->cb(req, req->status, req->cb_arg);
  }
}

static void req_timeout_cb(evutil_socket_t fd, short what, void *arg) {
  ncfsm_boot_req *req = arg;
  ncfsm_boot *b = req->b;
  (void)fd;
  (void)what;
  if (req->status != NCFSM_ERR_AGAIN) return;
  if (req->kind == NCFSM__REQ_AGREE) { /* not sticky: agreements are not ordered with allgathers */
    char msg[NCFSM__BOOT_ERRLEN - 64];
    msg[0] = 0;
    ncfsm_result_t r = b->ops->agree_expire(req, msg, sizeof msg);
    if (r != NCFSM_OK) ncfsm__boot_seterr(b, "%s", msg);
    ncfsm__boot_req_finish(req, r);
    return;
  }
  char what_[256] = "";
  if (b->ops->describe) b->ops->describe(b, what_, sizeof what_);
  if (b->ops->cancel) b->ops->cancel(req);
  if (req->kind == NCFSM__REQ_ROOTS) {
    ncfsm__boot_fail(b, NCFSM_ERR_BOOTSTRAP,
                     "%s broadcasts #%" PRIu64 "-#%" PRIu64 " (%zu bytes from each of %d roots) not "
                     "complete after %" PRIu64 " ms%s%s: a rank did not post them or the channel "
                     "stalled; check that all %d ranks run and make the same bootstrap calls, or "
                     "raise NCFSM_BOOTSTRAP_TIMEOUT_MS",
                     b->ops->name, req->seq, req->seq + (uint64_t)req->nsubs - 1, req->len,
                     req->nsubs, b->timeout_ms, what_[0] ? ", " : "", what_, b->size);
    return ncfsm__boot_req_finish(req, NCFSM_ERR_BOOTSTRAP);
  }
  if (req->kind == NCFSM__REQ_BCAST) {
    ncfsm__boot_fail(b, NCFSM_ERR_BOOTSTRAP,
                     "%s broadcast #%" PRIu64 " (%zu bytes from rank %d) not complete after %" PRIu64
                     " ms%s%s: %s; check that all %d ranks run and make the same bootstrap calls, "
                     "or raise NCFSM_BOOTSTRAP_TIMEOUT_MS",
                     b->ops->name, req->seq, req->len, req->root, b->timeout_ms,
                     what_[0] ? ", " : "", what_,
                     req->root == b->rank ? "the channel stalled"
                                          : "the root did not post it or the channel stalled",
                     b->size);
    return ncfsm__boot_req_finish(req, NCFSM_ERR_BOOTSTRAP);
  }
  ncfsm__boot_fail(b, NCFSM_ERR_BOOTSTRAP,
                   "%s allgather #%" PRIu64 " (%zu bytes) not complete after %" PRIu64
                   " ms%s%s: a rank did not post it or the channel stalled; check that all %d ranks "
                   "run and make the same bootstrap calls, or raise NCFSM_BOOTSTRAP_TIMEOUT_MS",
                   b->ops->name, req->seq, req->len, b->timeout_ms, what_[0] ? ", " : "",
                   what_, b->size);
  ncfsm__boot_req_finish(req, NCFSM_ERR_BOOTSTRAP);
}

void ncfsm__boot_req_finish(ncfsm_boot_req *req, ncfsm_result_t st) {
  if (req->status != NCFSM_ERR_AGAIN) return;
  req->status = st;
  if (req->timer) event_del(req->timer);
  event_active(req->wake, 0, 0);
}

/* Freed requests are kept on their bootstrap, up to REQ_POOL, with their two events (not
 * pending, their argument the request itself): a verifier posts an allgather every window, and
 * making and freeing a request's events cost more than the rest of its post. A kept request has
 * the dead magic, as a freed one, until it is handed out again. */
#define REQ_POOL 8

static void req_free_mem(ncfsm_boot_req *req) {
  if (req->wake) event_free(req->wake);
  if (req->timer) event_free(req->timer);
  free(req);
}

static ncfsm_boot_req *req_new(ncfsm_boot *b, int kind) {
  ncfsm_boot_req *req = b->req_pool;
  if (req) {
    b->req_pool = req->pool_next;
    b->npool--;
    struct event *wake = req->wake, *timer = req->timer;
    *req = (ncfsm_boot_req){.wake = wake, .timer = timer};
  } else if ((req = calloc(1, sizeof *req))) {
    req->wake = event_new(b->base, -1, 0, req_wake_cb, req);
    req->timer = evtimer_new(b->base, req_timeout_cb, req);
  } else {
    return NULL;
  }
  req->magic = NCFSM__BOOT_REQ_MAGIC;
  req->b = b;
  req->kind = kind;
  req->status = NCFSM_ERR_AGAIN;
  if (kind == NCFSM__REQ_AGREE) req->alive = calloc((size_t)b->size, 1);
  if (!req->wake || !req->timer || (kind == NCFSM__REQ_AGREE && !req->alive)) {
    free(req->alive);
    req_free_mem(req);
    return NULL;
  }
  uint64_t ms = b->timeout_ms + (kind == NCFSM__REQ_AGREE ? b->ops->agree_grace_ms : 0);
  struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
  if (kind != NCFSM__REQ_ROOTS) evtimer_add(req->timer, &tv); /* ROOTS: its broadcasts' timers */
  return req;
}

static void req_destroy(ncfsm_boot_req *req) {
  ncfsm_boot *b = req->b;
  free(req->subs);
  free(req->alive);
  req->magic = NCFSM__BOOT_DEAD_MAGIC;
  if (b->npool < REQ_POOL) {
    if (req->status == NCFSM_ERR_AGAIN) event_del(req->timer); /* a finished one's went at its finish */
    event_del(req->wake); /* also off the active queue */
    req->pool_next = b->req_pool;
    b->req_pool = req;
    b->npool++;
    return;
  }
  req_free_mem(req); /* event_free also takes it off the active queue */
}

static void req_pool_free(ncfsm_boot *b) {
  while (b->req_pool) {
    ncfsm_boot_req *req = b->req_pool;
    b->req_pool = req->pool_next;
    req_free_mem(req);
  }
  b->npool = 0;
}

ncfsm_result_t ncfsm_boot_allgather_post(ncfsm_boot *b, const void *send, void *recv, size_t len,
                                         ncfsm_boot_req **out) {
  if (out) *out = NULL;
  if (!BOOT_OK(b) || !out || (len && (!send || !recv))) return NCFSM_ERR_INVALID_ARGUMENT;
  if (b->failed != NCFSM_OK) return b->failed;
  ncfsm_boot_req *req = req_new(b, NCFSM__REQ_GATHER);
  if (!req) return NCFSM_ERR_NO_MEMORY;
  req->seq = b->seq;
  req->send = send;
  req->recv = recv;
  req->len = len;
  ncfsm_result_t r = b->ops->post(b, req);
  if (r != NCFSM_OK) {
    req_destroy(req);
    return r;
  }
  b->seq++;
  b->live_reqs++;
  *out = req;
  return NCFSM_OK;
}

/* ---- broadcast ---------------------------------------------------------------- */

static void req_release(ncfsm_boot_req *req, int counted);

/* Run b's base until req finished; free it; its status. */
static ncfsm_result_t run_until_done(ncfsm_boot *b, ncfsm_boot_req *req) {
  ncfsm_result_t r;
  while ((r = ncfsm_boot_test(req)) == NCFSM_ERR_AGAIN)
    if (event_base_loop(b->base, EVLOOP_ONCE) < 0) {
      r = ncfsm__boot_fail(b, NCFSM_ERR_SYSTEM, "event_base_loop failed: %s", strerror(errno));
      break;
    }
  ncfsm_boot_req_free(req);
  return r;
}

static ncfsm_result_t bcast_check(ncfsm_boot *b, void *buf, size_t len, int root,
                                  ncfsm_boot_req **out) {
  if (out) *out = NULL;
  if (!BOOT_OK(b) || !out || (len && !buf)) return NCFSM_ERR_INVALID_ARGUMENT;
  if (!b->ops->bcast_post) {
    ncfsm__boot_seterr(b, "ncfsm_boot_bcast_post: the %s bootstrap has no broadcast", b->ops->name);
    return NCFSM_ERR_UNSUPPORTED;
  }
  if (root < 0 || root >= b->size) {
    ncfsm__boot_seterr(b, "ncfsm_boot_bcast_post: root %d is not a rank of this bootstrap (0 to %d)",
                       root, b->size - 1);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  return b->failed;
}

/* Post one broadcast (not counted in live_reqs). */
static ncfsm_result_t bcast_post(ncfsm_boot *b, void *buf, size_t len, int root,
                                 ncfsm_boot_req **out) {
  ncfsm_boot_req *req = req_new(b, NCFSM__REQ_BCAST);
  if (!req) return NCFSM_ERR_NO_MEMORY;
  req->seq = b->bseq;
  req->root = root;
  req->send = root == b->rank ? buf : NULL;
  req->recv = root == b->rank ? NULL : buf;
  req->len = len;
  ncfsm_result_t r = b->ops->bcast_post(b, req);
  if (r != NCFSM_OK) {
    req_destroy(req);
    return r;
  }
  b->bseq++;
  *out = req;
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_boot_bcast_post(ncfsm_boot *b, void *buf, size_t len, int root,
                                     ncfsm_boot_req **out) {
  ncfsm_result_t r = bcast_check(b, buf, len, root, out);
  if (r != NCFSM_OK) return r;
  if ((r = bcast_post(b, buf, len, root, out)) == NCFSM_OK) b->live_reqs++;
  return r;
}

int ncfsm_boot_root_of(int size, int nroots, int j) {
  if (size < 1 || nroots < 1 || nroots > size || j < 0 || j >= nroots) return -1;
  return (int)((int64_t)j * size / nroots);
}

/* A broadcast of a ROOTS request finished (from its wake event). */
static void roots_sub_done(ncfsm_boot_req *sub, ncfsm_result_t st, void *arg) {
  ncfsm_boot_req *req = arg;
  (void)sub;
  if (req->status != NCFSM_ERR_AGAIN) return;
  if (st != NCFSM_OK) return ncfsm__boot_req_finish(req, st);
  if (++req->subs_done == req->nsubs) ncfsm__boot_req_finish(req, NCFSM_OK);
}

ncfsm_result_t ncfsm_boot_bcast_roots_post(ncfsm_boot *b, void *buf, size_t len, int nroots,
                                           ncfsm_boot_req **out) {
  ncfsm_result_t r = bcast_check(b, buf, len, 0, out);
  if (r != NCFSM_OK) return r;
  if (nroots < 1 || nroots > b->size) {
    ncfsm__boot_seterr(b, "ncfsm_boot_bcast_roots_post: %d roots in a bootstrap of %d ranks (1 to "
                          "the size)",
                       nroots, b->size);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (len && (size_t)nroots > SIZE_MAX / len) return NCFSM_ERR_INVALID_ARGUMENT;
  if (nroots == 1) return ncfsm_boot_bcast_post(b, buf, len, 0, out);
  ncfsm_boot_req *req = req_new(b, NCFSM__REQ_ROOTS);
  if (!req) return NCFSM_ERR_NO_MEMORY;
  if (b->ops->roots_post) { /* the implementation does them as one */
    req->seq = b->bseq;
    req->recv = buf;
    req->len = len;
    req->nsubs = nroots;
    if ((r = b->ops->roots_post(b, req)) != NCFSM_OK) {
      req_destroy(req);
      return r;
    }
    struct timeval tv = {(time_t)(b->timeout_ms / 1000), (suseconds_t)((b->timeout_ms % 1000) * 1000)};
    evtimer_add(req->timer, &tv);
    b->bseq += (uint64_t)nroots;
    b->live_reqs++;
    *out = req;
    return NCFSM_OK;
  }
  if (!(req->subs = calloc((size_t)nroots, sizeof *req->subs))) {
    req_destroy(req);
    return NCFSM_ERR_NO_MEMORY;
  }
  req->len = len;
  req->seq = b->bseq;
  for (int j = 0; j < nroots; j++) {
    unsigned char *p = len ? (unsigned char *)buf + (size_t)j * len : NULL;
    ncfsm_boot_req *sub = NULL;
    r = bcast_post(b, p, len, ncfsm_boot_root_of(b->size, nroots, j), &sub);
    if (r != NCFSM_OK) { /* the ones posted are out: the sequence is broken */
      req->nsubs = j;
      req_release(req, 0);
      ncfsm__boot_fail(b, r, "ncfsm_boot_bcast_roots_post: broadcast %d of %d could not be posted "
                             "(%s); this bootstrap is out of step with the other ranks: close it",
                       j, nroots, ncfsm_strerror(r));
      return r;
    }
    sub->owner = req;
    req->subs[j] = sub;
    req->nsubs = j + 1;
    ncfsm_boot_req_on_done(sub, roots_sub_done, req);
  }
  b->live_reqs++;
  *out = req;
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_boot_bcast(ncfsm_boot *b, void *buf, size_t len, int root) {
  ncfsm_boot_req *req;
  ncfsm_result_t r = ncfsm_boot_bcast_post(b, buf, len, root, &req);
  if (r != NCFSM_OK) return r;
  return run_until_done(b, req);
}

/* ---- recovery (peer loss: boot_notify.c; agreement results, survivors: boot_channel.c) ---- */

ncfsm_result_t ncfsm_boot_agree_post(ncfsm_boot *b, uint64_t epoch, ncfsm_boot_req **out) {
  if (out) *out = NULL;
  if (!BOOT_OK(b) || !out) return NCFSM_ERR_INVALID_ARGUMENT;
  if (!b->ops->agree_post) return ncfsm__boot_unsupported(b, "ncfsm_boot_agree_post");
  if (b->chan_tag) return ncfsm__boot_on_channel(b, "ncfsm_boot_agree_post");
  if (epoch == 0 || epoch <= b->agree_last) {
    ncfsm__boot_seterr(b, "ncfsm_boot_agree_post: epoch %" PRIu64 " must be above 0 and above the "
                          "last epoch posted on this bootstrap (%" PRIu64 "); every live rank posts "
                          "the same increasing epoch",
                       epoch, b->agree_last);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (b->agree_req && b->agree_req->status == NCFSM_ERR_AGAIN) {
    ncfsm__boot_seterr(b, "ncfsm_boot_agree_post(epoch %" PRIu64 "): the agreement of epoch %" PRIu64
                          " on this bootstrap has not finished; wait for it (ncfsm_boot_test) or "
                          "free it first",
                       epoch, b->agree_req->epoch);
    return NCFSM_ERR_BUSY;
  }
  ncfsm_boot_req *req = req_new(b, NCFSM__REQ_AGREE);
  if (!req) return NCFSM_ERR_NO_MEMORY;
  req->epoch = epoch;
  ncfsm_result_t r = b->ops->agree_post(b, req);
  if (r != NCFSM_OK) {
    req_destroy(req);
    return r;
  }
  b->agree_last = epoch;
  b->agree_req = req;
  b->live_reqs++;
  *out = req;
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_boot_barrier_post(ncfsm_boot *b, ncfsm_boot_req **req) {
  return ncfsm_boot_allgather_post(b, NULL, NULL, 0, req);
}

ncfsm_result_t ncfsm_boot_test(ncfsm_boot_req *req) {
  if (!req || req->magic != NCFSM__BOOT_REQ_MAGIC) return NCFSM_ERR_INVALID_ARGUMENT;
  return req->status;
}

void ncfsm_boot_req_on_done(ncfsm_boot_req *req, ncfsm_boot_done_cb cb, void *arg) {
  if (!req || req->magic != NCFSM__BOOT_REQ_MAGIC) return;
  req->cb = cb;
  req->cb_arg = arg;
  req->cb_called = 0;
  if (req->status != NCFSM_ERR_AGAIN) event_active(req->wake, 0, 0);
}

/* Free req (and a ROOTS' broadcasts); counted: it is one of b->live_reqs. */
static void req_release(ncfsm_boot_req *req, int counted) {
  ncfsm_boot *b = req->b;
  if (req->kind == NCFSM__REQ_ROOTS && req->subs)
    for (int i = 0; i < req->nsubs; i++)
      if (req->subs[i]) req_release(req->subs[i], 0);
  if (req->status == NCFSM_ERR_AGAIN) {
    if (b->ops->cancel && (req->kind != NCFSM__REQ_ROOTS || !req->subs)) b->ops->cancel(req);
    if (req->kind == NCFSM__REQ_GATHER)
      ncfsm__boot_fail(b, NCFSM_ERR_BOOTSTRAP,
                       "%s allgather #%" PRIu64 " was freed before it finished; this bootstrap is "
                       "now out of step with the other ranks: close it",
                       b->ops->name, req->seq);
    else if (req->kind == NCFSM__REQ_BCAST || (req->kind == NCFSM__REQ_ROOTS && !req->subs))
      ncfsm__boot_fail(b, NCFSM_ERR_BOOTSTRAP,
                       "%s broadcast #%" PRIu64 " was freed before it finished; this bootstrap is "
                       "now out of step with the other ranks: close it",
                       b->ops->name, req->seq);
  }
  if (b->agree_req == req) b->agree_req = NULL;
  if (counted) b->live_reqs--;
  req_destroy(req);
}

void ncfsm_boot_req_free(ncfsm_boot_req *req) {
  if (!req || req->magic != NCFSM__BOOT_REQ_MAGIC || req->owner) return;
  req_release(req, 1);
}

ncfsm_result_t ncfsm_boot_allgather(ncfsm_boot *b, const void *send, void *recv, size_t len) {
  ncfsm_boot_req *req;
  ncfsm_result_t r = ncfsm_boot_allgather_post(b, send, recv, len, &req);
  if (r != NCFSM_OK) return r;
  return run_until_done(b, req);
}
