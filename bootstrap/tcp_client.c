/*
 * The tcp bootstrap: a nonblocking client of the store (bootstrap/tcp_store.c)
 * on the rank's event_base; rank 0 may host the store in the same base.
 * allgather #n is one GATHER frame (key "ag/<n>"): the store answers every
 * rank with the rank-major concatenation once all have contributed, so a
 * collective costs each rank one request and one reply.
 */
#include <errno.h>
#include <signal.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>

#include "bootstrap/boot-internal.h"
#include "bootstrap/frame.h"
#include "bootstrap/secret.h"
#include "bootstrap/tcp-internal.h"

#define SUB NCFSM__SUB_BOOT

typedef struct tcp_op {
  TAILQ_ENTRY(tcp_op) link;
  uint32_t id;
  ncfsm_boot_req *req;
} tcp_op;

typedef struct tcp_impl {
  ncfsm_boot *b;
  ncfsm__store *hosted;
  struct sockaddr_storage ss;
  int salen;
  char addr[160];
  struct bufferevent *bev;
  struct evbuffer *queued; /* frames posted before the store accepted the HELLO */
  int connected, hello_ok, dead;
  char *token; /* what the HELLO carries: the job token, or this rank's secret */
  uint64_t deadline_ns;
  struct event *retry_ev;
  int retry_ms, attempts;
  char connect_err[160];
  uint32_t next_id;
  TAILQ_HEAD(, tcp_op) ops;
  ncfsm__frame_limits lim;
} tcp_impl;

static void tcp_connect(tcp_impl *t);

static void fail_all(tcp_impl *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_all(tcp_impl *t, const char *fmt, ...) {
  ncfsm_boot *b = t->b;
  va_list ap;
  va_start(ap, fmt);
  ncfsm__boot_vseterr(b, fmt, ap);
  va_end(ap);
  if (b->failed == NCFSM_OK) b->failed = NCFSM_ERR_BOOTSTRAP;
  t->dead = 1;
  if (t->bev) {
    bufferevent_free(t->bev);
    t->bev = NULL;
  }
  tcp_op *op;
  while ((op = TAILQ_FIRST(&t->ops)) != NULL) {
    TAILQ_REMOVE(&t->ops, op, link);
    op->req->impl = NULL;
    ncfsm__boot_req_finish(op->req, NCFSM_ERR_BOOTSTRAP);
    free(op);
  }
}

static tcp_op *find_op(tcp_impl *t, uint32_t id) {
  tcp_op *op;
  TAILQ_FOREACH(op, &t->ops, link) if (op->id == id) return op;
  return NULL;
}

static int starts_with(const ncfsm__frame *f, const char *p) {
  size_t n = strlen(p);
  return f->vlen >= n && !memcmp(f->value, p, n);
}

/* The store refused the HELLO with "throttled": reconnect after a pause
 * (the frames posted so far are still in t->queued), until the deadline. */
static void retry_throttled(tcp_impl *t, const ncfsm__frame *f) {
  snprintf(t->connect_err, sizeof t->connect_err, "%.*s", (int)f->vlen, (const char *)f->value);
  bufferevent_free(t->bev);
  t->bev = NULL;
  t->connected = 0;
  if (ncfsm__now_ns() >= t->deadline_ns)
    return fail_all(t, "store %s refused rank %d: %s (tried %d times for %" PRIu64 " ms; check "
                       "that NCFSM_STORE_TOKEN is the same for every rank and the store)",
                    t->addr, t->b->rank, t->connect_err, t->attempts, t->b->timeout_ms);
  const char *in = strstr(t->connect_err, "retry in ");
  int ms = in ? atoi(in + 9) : 0;
  if (ms < t->retry_ms) ms = t->retry_ms;
  if (ms > 2000) ms = 2000;
  struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
  evtimer_add(t->retry_ev, &tv);
  if (t->retry_ms < 500) t->retry_ms *= 2;
}

static void on_reply(tcp_impl *t, const ncfsm__frame *f) {
  ncfsm_boot *b = t->b;
  if (f->id == 0) { /* the HELLO's answer, or the store closing this connection */
    if (f->type != NCFSM__F_ERR) {
      if (!t->hello_ok) {
        t->hello_ok = 1;
        t->retry_ms = 10;
        evbuffer_add_buffer(bufferevent_get_output(t->bev), t->queued);
      }
      return;
    }
    if (t->hello_ok)
      return fail_all(t, "store %s closed rank %d's connection: %.*s", t->addr, b->rank,
                      (int)f->vlen, (const char *)f->value);
    if (starts_with(f, "throttled")) return retry_throttled(t, f);
    if (starts_with(f, "bad token"))
      return fail_all(t, "store %s rejected rank %d: %.*s (check that NCFSM_STORE_TOKEN is the "
                         "same for every rank and the store)",
                      t->addr, b->rank, (int)f->vlen, (const char *)f->value);
    return fail_all(t, "store %s rejected rank %d: %.*s", t->addr, b->rank, (int)f->vlen,
                    (const char *)f->value);
  }
  tcp_op *op = find_op(t, f->id);
  if (!op) return; /* cancelled */
  ncfsm_boot_req *req = op->req;
  TAILQ_REMOVE(&t->ops, op, link);
  free(op);
  req->impl = NULL;
  if (f->type == NCFSM__F_ERR) {
    ncfsm__boot_fail(b, NCFSM_ERR_BOOTSTRAP, "store %s refused allgather #%" PRIu64 ": %.*s",
                     t->addr, req->seq, (int)f->vlen, (const char *)f->value);
    return ncfsm__boot_req_finish(req, NCFSM_ERR_BOOTSTRAP);
  }
  if (f->vlen != (uint64_t)b->size * req->len) {
    ncfsm__boot_fail(b, NCFSM_ERR_BOOTSTRAP,
                     "store %s answered allgather #%" PRIu64 " with %u bytes, expected %d x %zu",
                     t->addr, req->seq, f->vlen, b->size, req->len);
    return ncfsm__boot_req_finish(req, NCFSM_ERR_BOOTSTRAP);
  }
  if (f->vlen) memcpy(req->recv, f->value, f->vlen);
  ncfsm__boot_req_finish(req, NCFSM_OK);
}

static void read_cb(struct bufferevent *bev, void *arg) {
  tcp_impl *t = arg;
  struct evbuffer *in = bufferevent_get_input(bev);
  while (!t->dead) {
    size_t n = evbuffer_get_length(in);
    if (n == 0) return;
    size_t want = n < NCFSM__FRAME_HDR ? n : NCFSM__FRAME_HDR, used = 0;
    const uint8_t *p = evbuffer_pullup(in, (ev_ssize_t)want);
    ncfsm__frame f;
    const char *why;
    ncfsm__parse_t r = ncfsm__frame_parse(p, want, &t->lim, &f, &used, &why);
    if (r == NCFSM__PARSE_MORE) {
      if (used > n) return;
      p = evbuffer_pullup(in, (ev_ssize_t)used);
      r = ncfsm__frame_parse(p, used, &t->lim, &f, &used, &why);
    }
    if (r != NCFSM__PARSE_OK || (f.type != NCFSM__F_OK && f.type != NCFSM__F_ERR))
      return fail_all(t, "store %s sent a bad frame: %s (is %s an ncfsm store?)", t->addr,
                      why ? why : "not a reply", t->addr);
    on_reply(t, &f);
    if (t->dead || t->bev != bev) return; /* fail_all or a retry freed bev (and its input) */
    evbuffer_drain(in, used);
  }
}

static void retry_cb(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  tcp_connect(arg);
}

static void write_hello(tcp_impl *t) {
  uint8_t hdr[NCFSM__FRAME_HDR], v[8];
  size_t tl = strlen(t->token);
  ncfsm__frame_header(hdr, NCFSM__F_HELLO, 0, (uint32_t)tl, 8);
  ncfsm__wr32(v, (uint32_t)t->b->rank);
  ncfsm__wr32(v + 4, (uint32_t)t->b->size);
  struct evbuffer *out = bufferevent_get_output(t->bev);
  evbuffer_add(out, hdr, sizeof hdr);
  evbuffer_add(out, t->token, tl);
  evbuffer_add(out, v, sizeof v);
}

static void event_cb(struct bufferevent *bev, short what, void *arg) {
  tcp_impl *t = arg;
  if (what & BEV_EVENT_CONNECTED) {
    int one = 1;
    setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    t->connected = 1;
    NCFSM_TRACE(SUB, "rank %d connected to store %s", t->b->rank, t->addr);
    write_hello(t); /* the queued frames follow once the store accepts it */
    return;
  }
  int err = EVUTIL_SOCKET_ERROR();
  if (!t->connected) {
    snprintf(t->connect_err, sizeof t->connect_err, "%s", evutil_socket_error_to_string(err));
    bufferevent_free(bev);
    t->bev = NULL;
    if (ncfsm__now_ns() >= t->deadline_ns)
      return fail_all(t, "store %s unreachable: connect: %s (tried %d times for %" PRIu64
                         " ms): start the store (rank 0 with NCFSM_STORE_HOST=1, or ncfsm-store) "
                         "or fix NCFSM_STORE_ADDR",
                      t->addr, t->connect_err, t->attempts, t->b->timeout_ms);
    struct timeval tv = {0, t->retry_ms * 1000};
    evtimer_add(t->retry_ev, &tv);
    if (t->retry_ms < 500) t->retry_ms *= 2;
    return;
  }
  if (what & BEV_EVENT_EOF)
    fail_all(t, "store %s closed the connection (store stopped, or it rejected this rank; see the "
                "store's log)",
             t->addr);
  else
    fail_all(t, "store %s closed the connection: %s", t->addr, evutil_socket_error_to_string(err));
}

static void tcp_connect(tcp_impl *t) {
  t->attempts++;
  t->bev = bufferevent_socket_new(t->b->base, -1, BEV_OPT_CLOSE_ON_FREE);
  if (!t->bev) return fail_all(t, "store %s: cannot create a socket: out of memory", t->addr);
  bufferevent_setcb(t->bev, read_cb, NULL, event_cb, t);
  bufferevent_enable(t->bev, EV_READ | EV_WRITE);
  if (bufferevent_socket_connect(t->bev, (struct sockaddr *)&t->ss, t->salen) != 0) {
    /* libevent reports most failures through event_cb; this one is immediate. */
    event_cb(t->bev, BEV_EVENT_ERROR, t);
  }
}

static ncfsm_result_t tcp_open(ncfsm_boot *b, const ncfsm_boot_opts *o) {
  if (o->size < 1 || o->rank < 0 || o->rank >= o->size) {
    ncfsm__boot_seterr(b, "tcp bootstrap: rank %d / size %d invalid: set NCFSM_RANK and "
                          "NCFSM_WORLD_SIZE (0 <= rank < size)",
                       o->rank, o->size);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  int has_secret = o->rank_secret && *o->rank_secret;
  if ((!o->token || !*o->token) && !has_secret) {
    ncfsm__boot_seterr(b, "tcp bootstrap needs a job token: set NCFSM_STORE_TOKEN to the same "
                          "secret for every rank (e.g. `openssl rand -hex 16`), or this rank's "
                          "NCFSM_STORE_RANK_SECRET");
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (o->host_store && o->rank == 0 && (!o->token || !*o->token)) {
    ncfsm__boot_seterr(b, "rank 0 hosts the store (NCFSM_STORE_HOST=1) and needs the job token: "
                          "set NCFSM_STORE_TOKEN");
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (has_secret && strlen(o->rank_secret) > NCFSM__FRAME_KEY_MAX) {
    ncfsm__boot_seterr(b, "NCFSM_STORE_RANK_SECRET longer than %u bytes", NCFSM__FRAME_KEY_MAX);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (!has_secret && strlen(o->token) > NCFSM__FRAME_KEY_MAX) {
    ncfsm__boot_seterr(b, "NCFSM_STORE_TOKEN longer than %u bytes", NCFSM__FRAME_KEY_MAX);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  /* A write to a store that went away must be an error, not a SIGPIPE that
   * kills the rank (libevent writes with writev). */
  struct sigaction sa;
  if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
    NCFSM_INFO(SUB, "tcp bootstrap: SIGPIPE set to SIG_IGN");
  }
  tcp_impl *t = calloc(1, sizeof *t);
  if (!t) return NCFSM_ERR_NO_MEMORY;
  t->b = b;
  TAILQ_INIT(&t->ops);
  t->next_id = 1;
  t->retry_ms = 10;
  t->lim.key_max = NCFSM__FRAME_KEY_MAX;
  t->lim.value_max = UINT32_MAX; /* gather replies are size x len; the store is trusted for sizes */
  snprintf(t->addr, sizeof t->addr, "%s", o->store_addr ? o->store_addr : "127.0.0.1:29500");
  char err[256];
  t->salen = sizeof t->ss;
  if (ncfsm__parse_addr(t->addr, (struct sockaddr *)&t->ss, &t->salen, err, sizeof err) != 0) {
    ncfsm__boot_seterr(b, "tcp bootstrap: %s", err);
    free(t);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  t->token = strdup(has_secret ? o->rank_secret : o->token);
  t->queued = evbuffer_new();
  t->retry_ev = evtimer_new(b->base, retry_cb, t);
  if (!t->token || !t->queued || !t->retry_ev) goto nomem;
  if (o->host_store && o->rank == 0) {
    ncfsm__store_opts so;
    ncfsm__store_opts_init(&so);
    ncfsm__store_opts_env(&so); /* the NCFSM_STORE_* limits */
    so.listen = t->addr;
    so.token = o->token;
    if (o->store_value_max) so.value_max = (uint32_t)o->store_value_max;
    if (so.rank_secrets && !has_secret) { /* rank 0 has the token: its own secret from it */
      char sec[65];
      ncfsm__rank_secret(o->token, 0, (uint32_t)o->size, sec);
      free(t->token);
      t->token = strdup(sec);
      memset(sec, 0, sizeof sec);
      if (!t->token) goto nomem;
    }
    if (ncfsm__store_open(b->base, &so, &t->hosted, err, sizeof err) != 0) {
      ncfsm__boot_seterr(b, "rank 0 cannot host the store: %s", err);
      goto fail;
    }
    int port = ncfsm__store_port(t->hosted);
    if (t->ss.ss_family == AF_INET) ((struct sockaddr_in *)&t->ss)->sin_port = htons((uint16_t)port);
    else ((struct sockaddr_in6 *)&t->ss)->sin6_port = htons((uint16_t)port);
    char *colon = strrchr(t->addr, ':');
    if (colon) snprintf(colon + 1, sizeof t->addr - (size_t)(colon + 1 - t->addr), "%d", port);
  }
  b->local_rank = (int)ncfsm__env_ll("NCFSM_LOCAL_RANK", o->rank);
  b->local_size = (int)ncfsm__env_ll("NCFSM_LOCAL_WORLD_SIZE", o->size);
  b->impl = t;
  t->deadline_ns = ncfsm__now_ns() + b->timeout_ms * 1000000ull;
  tcp_connect(t);
  return NCFSM_OK;
nomem:
  ncfsm__boot_seterr(b, "tcp bootstrap: out of memory");
fail:
  if (t->retry_ev) event_free(t->retry_ev);
  if (t->queued) evbuffer_free(t->queued);
  free(t->token);
  free(t);
  b->impl = NULL;
  return NCFSM_ERR_BOOTSTRAP;
}

static void tcp_close(ncfsm_boot *b) {
  tcp_impl *t = b->impl;
  if (!t) return;
  tcp_op *op;
  while ((op = TAILQ_FIRST(&t->ops)) != NULL) {
    TAILQ_REMOVE(&t->ops, op, link);
    free(op);
  }
  if (t->bev) bufferevent_free(t->bev);
  event_free(t->retry_ev);
  evbuffer_free(t->queued);
  if (t->hosted) ncfsm__store_close(t->hosted);
  free(t->token);
  free(t);
  b->impl = NULL;
}

static ncfsm_result_t tcp_post(ncfsm_boot *b, ncfsm_boot_req *req) {
  tcp_impl *t = b->impl;
  if (t->dead) return b->failed ? b->failed : NCFSM_ERR_BOOTSTRAP;
  if (req->len > UINT32_MAX - 8 || (uint64_t)req->len * (uint64_t)b->size > UINT32_MAX) {
    ncfsm__boot_seterr(b, "tcp allgather of %zu bytes x %d ranks is too large for one frame",
                       req->len, b->size);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  tcp_op *op = calloc(1, sizeof *op);
  if (!op) return NCFSM_ERR_NO_MEMORY;
  op->id = t->next_id++;
  if (t->next_id == 0) t->next_id = 1;
  op->req = req;
  char key[40];
  int kl = snprintf(key, sizeof key, "ag/%" PRIu64, req->seq);
  uint8_t hdr[NCFSM__FRAME_HDR], v[8];
  ncfsm__frame_header(hdr, NCFSM__F_GATHER, op->id, (uint32_t)kl, (uint32_t)(8 + req->len));
  ncfsm__wr32(v, (uint32_t)b->rank);
  ncfsm__wr32(v + 4, (uint32_t)b->size);
  struct evbuffer *out = t->hello_ok ? bufferevent_get_output(t->bev) : t->queued;
  if (evbuffer_add(out, hdr, sizeof hdr) || evbuffer_add(out, key, (size_t)kl) ||
      evbuffer_add(out, v, sizeof v) || (req->len && evbuffer_add(out, req->send, req->len))) {
    free(op);
    return ncfsm__boot_fail(b, NCFSM_ERR_NO_MEMORY, "tcp allgather: out of memory");
  }
  TAILQ_INSERT_TAIL(&t->ops, op, link);
  req->impl = op;
  return NCFSM_OK;
}

static void tcp_cancel(ncfsm_boot_req *req) {
  tcp_impl *t = req->b->impl;
  tcp_op *op = req->impl;
  if (!t || !op) return;
  TAILQ_REMOVE(&t->ops, op, link);
  free(op);
  req->impl = NULL;
}

static void tcp_describe(ncfsm_boot *b, char *buf, size_t n) {
  tcp_impl *t = b->impl;
  if (!t->connected)
    snprintf(buf, n, "store %s unreachable (%d connect attempts; last: %s)", t->addr, t->attempts,
             t->connect_err[0] ? t->connect_err : "pending");
  else if (!t->hello_ok)
    snprintf(buf, n, "store %s did not answer rank %d's HELLO", t->addr, t->b->rank);
  else
    snprintf(buf, n, "store %s never answered", t->addr);
}

int ncfsm__boot_tcp_hosted_port(const ncfsm_boot *b) {
  if (!b || b->kind != NCFSM_BOOT_TCP || !b->impl) return -1;
  const tcp_impl *t = b->impl;
  return t->hosted ? ncfsm__store_port(t->hosted) : -1;
}

const ncfsm__boot_ops ncfsm__boot_tcp_ops = {
    .name = "tcp",
    .open = tcp_open,
    .close = tcp_close,
    .post = tcp_post,
    .progress = NULL,
    .cancel = tcp_cancel,
    .describe = tcp_describe,
};
