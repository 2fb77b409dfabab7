/*
 * Bootstrap dispatch: picks the implementation, owns the request lifecycle
 * (wake event, timeout timer, done callback) and the last-error string.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/event.h>

#include "bootstrap/boot-internal.h"
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

void ncfsm_boot_opts_init(ncfsm_boot_opts *o) {
  ncfsm__log_init();
  memset(o, 0, sizeof *o);
  o->kind = NCFSM_BOOT_AUTO;
  const char *k = ncfsm__env_str("NCFSM_BOOTSTRAP", "auto");
  if (!strcasecmp(k, "pmix")) o->kind = NCFSM_BOOT_PMIX;
  else if (!strcasecmp(k, "tcp")) o->kind = NCFSM_BOOT_TCP;
  else if (!strcasecmp(k, "local")) o->kind = NCFSM_BOOT_LOCAL;
  else if (strcasecmp(k, "auto"))
    NCFSM_WARN(NCFSM__SUB_BOOT, "NCFSM_BOOTSTRAP=%s is not one of auto|pmix|tcp|local; using auto", k);
  o->store_addr = ncfsm__env_str("NCFSM_STORE_ADDR", NULL);
  o->token = ncfsm__env_str("NCFSM_STORE_TOKEN", NULL);
  o->rank = (int)ncfsm__env_ll("NCFSM_RANK", 0);
  o->size = (int)ncfsm__env_ll("NCFSM_WORLD_SIZE", 1);
  o->host_store = ncfsm__env_ll("NCFSM_STORE_HOST", 0) != 0;
  o->timeout_ms = (uint64_t)ncfsm__env_ll("NCFSM_BOOTSTRAP_TIMEOUT_MS", 60000);
  o->local_group = ncfsm__env_str("NCFSM_LOCAL_GROUP", "default");
  o->store_value_max = (size_t)ncfsm__env_ll("NCFSM_STORE_VALUE_MAX", 1 << 20);
  o->rank_secret = ncfsm__env_str("NCFSM_STORE_RANK_SECRET", NULL);
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
  if (b->failed == NCFSM_OK) b->failed = st;
  return st;
}

static ncfsm_boot_kind_t pick_kind(const ncfsm_boot_opts *o) {
  if (o->kind != NCFSM_BOOT_AUTO) return o->kind;
  const char *pr = getenv("PMIX_RANK");
  if (pr && *pr) return NCFSM_BOOT_PMIX;
  if (o->store_addr && *o->store_addr) return NCFSM_BOOT_TCP;
  return NCFSM_BOOT_LOCAL;
}

ncfsm_result_t ncfsm_boot_open(struct event_base *base, const ncfsm_boot_opts *opts,
                               ncfsm_boot **out) {
  ncfsm__log_init();
  open_err[0] = 0;
  if (out) *out = NULL;
  if (!base || !out) {
    snprintf(open_err, sizeof open_err, "ncfsm_boot_open: base and out must not be NULL");
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  ncfsm_boot_opts dflt;
  if (!opts) {
    ncfsm_boot_opts_init(&dflt);
    opts = &dflt;
  }
  ncfsm_boot_kind_t kind = pick_kind(opts);
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
  if (!ops) {
    snprintf(open_err, sizeof open_err,
             "bootstrap %s is not built in (PMIx was not found at configure time): set "
             "NCFSM_BOOTSTRAP=tcp with NCFSM_STORE_ADDR, or rebuild with libpmix-dev",
             ncfsm_boot_kind_name(kind));
    NCFSM_WARN(NCFSM__SUB_BOOT, "%s", open_err);
    return NCFSM_ERR_UNSUPPORTED;
  }
  ncfsm_boot *b = calloc(1, sizeof *b);
  if (!b) return NCFSM_ERR_NO_MEMORY;
  b->magic = NCFSM__BOOT_MAGIC;
  b->ops = ops;
  b->kind = kind;
  b->base = base;
  b->rank = opts->rank;
  b->size = opts->size;
  b->local_rank = opts->rank;
  b->local_size = opts->size;
  b->timeout_ms = opts->timeout_ms ? opts->timeout_ms : 60000;
  ncfsm_result_t r = ops->open(b, opts);
  if (r != NCFSM_OK) {
    snprintf(open_err, sizeof open_err, "%s", b->err[0] ? b->err : ncfsm_strerror(r));
    b->magic = NCFSM__BOOT_DEAD_MAGIC;
    free(b);
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
  b->ops->close(b);
  b->magic = NCFSM__BOOT_DEAD_MAGIC;
  free(b);
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
  char what_[256] = "";
  if (b->ops->describe) b->ops->describe(b, what_, sizeof what_);
  if (b->ops->cancel) b->ops->cancel(req);
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

ncfsm_result_t ncfsm_boot_allgather_post(ncfsm_boot *b, const void *send, void *recv, size_t len,
                                         ncfsm_boot_req **out) {
  if (out) *out = NULL;
  if (!BOOT_OK(b) || !out || (len && (!send || !recv))) return NCFSM_ERR_INVALID_ARGUMENT;
  if (b->failed != NCFSM_OK) return b->failed;
  ncfsm_boot_req *req = calloc(1, sizeof *req);
  if (!req) return NCFSM_ERR_NO_MEMORY;
  req->magic = NCFSM__BOOT_REQ_MAGIC;
  req->b = b;
  req->seq = b->seq;
  req->send = send;
  req->recv = recv;
  req->len = len;
  req->status = NCFSM_ERR_AGAIN;
  req->wake = event_new(b->base, -1, 0, req_wake_cb, req);
  req->timer = evtimer_new(b->base, req_timeout_cb, req);
  if (!req->wake || !req->timer) {
    if (req->wake) event_free(req->wake);
    if (req->timer) event_free(req->timer);
    free(req);
    return NCFSM_ERR_NO_MEMORY;
  }
  struct timeval tv = {(time_t)(b->timeout_ms / 1000), (suseconds_t)((b->timeout_ms % 1000) * 1000)};
  evtimer_add(req->timer, &tv);
  ncfsm_result_t r = b->ops->post(b, req);
  if (r != NCFSM_OK) {
    event_free(req->wake);
    event_free(req->timer);
    free(req);
    return r;
  }
  b->seq++;
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

void ncfsm_boot_req_free(ncfsm_boot_req *req) {
  if (!req || req->magic != NCFSM__BOOT_REQ_MAGIC) return;
  ncfsm_boot *b = req->b;
  if (req->status == NCFSM_ERR_AGAIN) {
    if (b->ops->cancel) b->ops->cancel(req);
    ncfsm__boot_fail(b, NCFSM_ERR_BOOTSTRAP,
                     "%s allgather #%" PRIu64 " was freed before it finished; this bootstrap is "
                     "now out of step with the other ranks: close it",
                     b->ops->name, req->seq);
  }
  event_free(req->timer);
  event_free(req->wake); /* also removes it from the active queue */
  req->magic = NCFSM__BOOT_DEAD_MAGIC;
  b->live_reqs--;
  free(req);
}

ncfsm_result_t ncfsm_boot_allgather(ncfsm_boot *b, const void *send, void *recv, size_t len) {
  ncfsm_boot_req *req;
  ncfsm_result_t r = ncfsm_boot_allgather_post(b, send, recv, len, &req);
  if (r != NCFSM_OK) return r;
  while ((r = ncfsm_boot_test(req)) == NCFSM_ERR_AGAIN)
    if (event_base_loop(b->base, EVLOOP_ONCE) < 0) {
      r = ncfsm__boot_fail(b, NCFSM_ERR_SYSTEM, "event_base_loop failed: %s", strerror(errno));
      break;
    }
  ncfsm_boot_req_free(req);
  return r;
}
