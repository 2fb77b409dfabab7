/*
 * The tcp bootstrap: a nonblocking client of the store (bootstrap/tcp_store.c)
 * on the rank's event_base; rank 0 may host the store in the same base.
 * allgather #n is one GATHER frame (key "ag/<n>"): the store answers every
 * rank with the rank-major concatenation once all have contributed, so a
 * collective costs each rank one request and one reply. broadcast #n is one
 * BCAST frame (key "bc/<n>"): root's carries the bytes, the others' are
 * answered with them.
 *
 * Recovery, survivors' bootstraps, channels and notices are other views
 * (tcp_view) of the same connection: tcp_views.c.
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

#include "bootstrap/secret.h"
#include "bootstrap/tcp-client.h"
#include "bootstrap/tcp-internal.h"
#include "core/settings.h"

#define SUB NCFSM__SUB_BOOT

static void tcp_connect(tcp_impl *t);

static void fail_all(tcp_impl *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_all(tcp_impl *t, const char *fmt, ...) {
  ncfsm_boot *b = t->b;
  va_list ap;
  va_start(ap, fmt);
  ncfsm__boot_vseterr(b, fmt, ap);
  va_end(ap);
  t->dead = 1;
  ncfsm__hb_stop(t->hb);
  t->hb = NULL;
  ncfsm__boot_set_failed(b, NCFSM_ERR_BOOTSTRAP);
  tcp_view *v;
  LIST_FOREACH(v, &t->views, link) {
    snprintf(v->b->err, sizeof v->b->err, "%s", b->err);
    ncfsm__boot_set_failed(v->b, NCFSM_ERR_BOOTSTRAP);
  }
  if (t->bev) {
    bufferevent_free(t->bev);
    t->bev = NULL;
  }
  tcp_op *op;
  while ((op = TAILQ_FIRST(&t->ops)) != NULL) {
    TAILQ_REMOVE(&t->ops, op, link);
    if (op->req) {
      op->req->impl = NULL;
      if (op->req->b != b) snprintf(op->req->b->err, sizeof op->req->b->err, "%s", b->err);
      ncfsm__boot_req_finish(op->req, NCFSM_ERR_BOOTSTRAP);
    }
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

/* The heartbeat thread found the connection to the store lost (loop thread). */
static void hb_failed_cb(evutil_socket_t fd, short what, void *arg) {
  tcp_impl *t = arg;
  (void)fd;
  (void)what;
  if (t->dead || !t->hb) return;
  char why[400];
  ncfsm__hb_error(t->hb, why, sizeof why);
  fail_all(t, "%s", why[0] ? why : "heartbeat connection lost");
}

/* The store answered the HELLO with its heartbeat (u32 heartbeat_ms, u32 silence_ms, u32
 * flags): open the heartbeat connection, unless NCFSM_STORE_HEARTBEAT=0. */
static void hb_start(tcp_impl *t, const ncfsm__frame *f) {
  if (f->vlen != 12 || t->hb || t->no_hb) return;
  uint32_t hb_ms = ncfsm__rd32(f->value), silence_ms = ncfsm__rd32(f->value + 4);
  if (!hb_ms || !silence_ms) return;
  if (!ncfsm__hb_can_wake()) {
    NCFSM_WARN(SUB, "tcp bootstrap rank %d: no heartbeats (call evthread_use_pthreads() before "
                    "making the event_base): the store cannot tell this rank hung from busy",
               t->b->rank);
    return;
  }
  ncfsm__hb_opts o = {.addr = (struct sockaddr *)&t->ss, .addrlen = t->salen, .addr_str = t->addr,
                      .token = t->token, .rank = (uint32_t)t->b->rank, .size = (uint32_t)t->b->size,
                      .heartbeat_ms = hb_ms, .silence_ms = silence_ms,
                      .judge_silence = (ncfsm__rd32(f->value + 8) & 1) != 0, .wake = t->hb_ev};
  char err[200];
  if (!(t->hb = ncfsm__hb_start(&o, err, sizeof err)))
    fail_all(t, "store %s: rank %d cannot start its heartbeat: %s", t->addr, t->b->rank, err);
}

static void on_reply(tcp_impl *t, const ncfsm__frame *f) {
  ncfsm_boot *b = t->b;
  if (f->type == NCFSM__F_LOST) return ncfsm__tcp_on_lost(t, f);
  if (f->type == NCFSM__F_NOTICE) return ncfsm__tcp_on_notice(t, f);
  if (f->id == 0) { /* the HELLO's answer, or the store closing this connection */
    if (f->type != NCFSM__F_ERR) {
      if (!t->hello_ok) {
        t->hello_ok = 1;
        t->retry_ms = 10;
        evbuffer_add_buffer(bufferevent_get_output(t->bev), t->queued);
        hb_start(t, f);
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
  tcp_view *chan = op->view;
  TAILQ_REMOVE(&t->ops, op, link);
  free(op);
  if (!req) return ncfsm__tcp_on_chan_reply(t, chan, f); /* a CHAN's answer */
  req->impl = NULL;
  if (req->kind == NCFSM__REQ_AGREE) return ncfsm__tcp_on_agree_reply(t, req, f);
  b = req->b; /* the job's bootstrap or a survivors' one */
  if (req->kind == NCFSM__REQ_BCAST) {
    if (f->type == NCFSM__F_ERR) {
      ncfsm__boot_fail(b, NCFSM_ERR_BOOTSTRAP, "store %s refused broadcast #%" PRIu64 ": %.*s",
                       t->addr, req->seq, (int)f->vlen, (const char *)f->value);
      return ncfsm__boot_req_finish(req, NCFSM_ERR_BOOTSTRAP);
    }
    size_t want = req->root == b->rank ? 0 : req->len;
    if (f->vlen != want) {
      ncfsm__boot_fail(b, NCFSM_ERR_BOOTSTRAP,
                       "store %s answered broadcast #%" PRIu64 " with %u bytes, expected %zu",
                       t->addr, req->seq, f->vlen, want);
      return ncfsm__boot_req_finish(req, NCFSM_ERR_BOOTSTRAP);
    }
    if (want) memcpy(req->recv, f->value, want);
    return ncfsm__boot_req_finish(req, NCFSM_OK);
  }
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

/* The store answered in another wire version (an ncfsm-store or rank 0 of another ncfsm): say
 * so, with the message of its ERR frame if that is what came (headers are alike in every
 * version); an ERR frame whose message has not all arrived yet is waited for. */
static void old_store(tcp_impl *t, struct evbuffer *in, uint8_t version) {
  char said[300] = "";
  size_t n = evbuffer_get_length(in);
  if (n < NCFSM__FRAME_HDR) return;
  uint8_t hdr[NCFSM__FRAME_HDR];
  evbuffer_copyout(in, hdr, sizeof hdr);
  uint32_t vlen = ncfsm__rd32(hdr + 16);
  if (hdr[5] == NCFSM__F_ERR && ncfsm__rd32(hdr + 12) == 0 && vlen <= 4096) {
    if (n < NCFSM__FRAME_HDR + vlen) return; /* the rest of the message comes */
    const uint8_t *p = evbuffer_pullup(in, (ev_ssize_t)(NCFSM__FRAME_HDR + vlen));
    snprintf(said, sizeof said, " (it said: %.*s)", (int)(vlen > 250 ? 250 : vlen), (const char *)p + NCFSM__FRAME_HDR);
  }
  fail_all(t, "store %s speaks the store's wire version %u, this rank version %u%s: run the same "
              "ncfsm on every rank and the store (ncfsm-store, or rank 0 with NCFSM_STORE_HOST=1)",
           t->addr, version, NCFSM__FRAME_VERSION, said);
}

static void read_cb(struct bufferevent *bev, void *arg) {
  tcp_impl *t = arg;
  struct evbuffer *in = bufferevent_get_input(bev);
  while (!t->dead) {
    size_t n = evbuffer_get_length(in);
    if (n == 0) return;
    size_t want = n < NCFSM__FRAME_HDR ? n : NCFSM__FRAME_HDR, used = 0;
    const uint8_t *p = evbuffer_pullup(in, (ev_ssize_t)want);
    if (want > 4 && ncfsm__rd32(p) == NCFSM__FRAME_MAGIC && p[4] != NCFSM__FRAME_VERSION)
      return old_store(t, in, p[4]);
    ncfsm__frame f;
    const char *why;
    ncfsm__parse_t r = ncfsm__frame_parse(p, want, &t->lim, &f, &used, &why);
    if (r == NCFSM__PARSE_MORE) {
      if (used > n) return;
      p = evbuffer_pullup(in, (ev_ssize_t)used);
      r = ncfsm__frame_parse(p, used, &t->lim, &f, &used, &why);
    }
    if (r != NCFSM__PARSE_OK ||
        (f.type != NCFSM__F_OK && f.type != NCFSM__F_ERR && f.type != NCFSM__F_LOST &&
         f.type != NCFSM__F_NOTICE))
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

/* The settings a rank reads at open (core/settings.def), strictly: NCFSM_STORE_HEARTBEAT,
 * NCFSM_LOCAL_RANK, NCFSM_LOCAL_WORLD_SIZE. */
static ncfsm_result_t rank_settings(ncfsm_boot *b, const ncfsm_boot_opts *o, int *no_hb) {
  ncfsm__setting_val hb, lr, ls;
  char err[400];
  if (ncfsm__setting_get(&ncfsm__settings[NCFSM__SET_STORE_HEARTBEAT], &hb, err, sizeof err) ||
      ncfsm__setting_get(&ncfsm__settings[NCFSM__SET_LOCAL_RANK], &lr, err, sizeof err) ||
      ncfsm__setting_get(&ncfsm__settings[NCFSM__SET_LOCAL_WORLD_SIZE], &ls, err, sizeof err)) {
    ncfsm__boot_seterr(b, "tcp bootstrap: %s", err);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  *no_hb = hb.u == 0;
  b->local_rank = lr.s ? (int)lr.i : o->rank;
  b->local_size = ls.s ? (int)ls.i : o->size;
  return NCFSM_OK;
}

static ncfsm_result_t tcp_open(ncfsm_boot *b, const ncfsm_boot_opts *o) {
  int no_hb = 0;
  ncfsm_result_t r = rank_settings(b, o, &no_hb);
  if (r != NCFSM_OK) return r;
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
  t->no_hb = no_hb;
  t->root.t = t;
  t->root.b = b;
  snprintf(t->root.path, sizeof t->root.path, "@");
  LIST_INIT(&t->views);
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
  t->hb_ev = event_new(b->base, -1, 0, hb_failed_cb, t);
  if (!t->token || !t->queued || !t->retry_ev || !t->hb_ev) goto nomem;
  if (o->host_store && o->rank == 0) {
    ncfsm__store_opts so;
    ncfsm__store_opts_init(&so);
    if (ncfsm__store_opts_from_env(&so, err, sizeof err) != 0) { /* the NCFSM_STORE_* limits */
      ncfsm__boot_seterr(b, "rank 0 cannot host the store: %s", err);
      r = NCFSM_ERR_INVALID_ARGUMENT;
      goto fail;
    }
    so.listen = t->addr;
    so.token = o->token;
    so.world_size = (uint32_t)o->size; /* rank 0 knows the job's size: no HELLO can claim another */
    so.world_from = "rank 0, which hosts the store (its NCFSM_WORLD_SIZE)";
    so.hosted = 1;
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
      r = NCFSM_ERR_BOOTSTRAP;
      goto fail;
    }
    int port = ncfsm__store_port(t->hosted);
    if (t->ss.ss_family == AF_INET) ((struct sockaddr_in *)&t->ss)->sin_port = htons((uint16_t)port);
    else ((struct sockaddr_in6 *)&t->ss)->sin6_port = htons((uint16_t)port);
    char *colon = strrchr(t->addr, ':');
    if (colon) snprintf(colon + 1, sizeof t->addr - (size_t)(colon + 1 - t->addr), "%d", port);
  }
  b->impl = &t->root;
  t->deadline_ns = ncfsm__now_ns() + b->timeout_ms * 1000000ull;
  tcp_connect(t);
  return NCFSM_OK;
nomem:
  ncfsm__boot_seterr(b, "tcp bootstrap: out of memory");
  r = NCFSM_ERR_NO_MEMORY;
fail:
  if (t->retry_ev) event_free(t->retry_ev);
  if (t->hb_ev) event_free(t->hb_ev);
  if (t->queued) evbuffer_free(t->queued);
  free(t->token);
  free(t);
  b->impl = NULL;
  return r;
}

static void tcp_close(ncfsm_boot *b) {
  tcp_view *v = b->impl;
  if (!v) return;
  tcp_impl *t = v->t;
  if (v != &t->root) { /* a survivors' or a channel's view */
    ncfsm__tcp_view_close(v);
    b->impl = NULL;
    return;
  }
  tcp_op *op;
  while ((op = TAILQ_FIRST(&t->ops)) != NULL) {
    TAILQ_REMOVE(&t->ops, op, link);
    free(op);
  }
  ncfsm__hb_stop(t->hb);
  if (t->bev) bufferevent_free(t->bev);
  event_free(t->retry_ev);
  event_free(t->hb_ev);
  evbuffer_free(t->queued);
  if (t->hosted) ncfsm__store_close(t->hosted);
  free(t->token);
  free(t);
  b->impl = NULL;
}

/* Queue a frame (before the HELLO's answer: in t->queued). */
int ncfsm__tcp_send(tcp_impl *t, uint8_t type, uint32_t id, const void *key, size_t kl,
                    const void *v1, size_t l1, const void *v2, size_t l2) {
  uint8_t hdr[NCFSM__FRAME_HDR];
  ncfsm__frame_header(hdr, type, id, (uint32_t)kl, (uint32_t)(l1 + l2));
  struct evbuffer *out = t->hello_ok ? bufferevent_get_output(t->bev) : t->queued;
  return evbuffer_add(out, hdr, sizeof hdr) || evbuffer_add(out, key, kl) ||
         (l1 && evbuffer_add(out, v1, l1)) || (l2 && evbuffer_add(out, v2, l2));
}

tcp_op *ncfsm__tcp_op_new(tcp_impl *t, ncfsm_boot_req *req) {
  tcp_op *op = calloc(1, sizeof *op);
  if (!op) return NULL;
  op->id = t->next_id++;
  if (t->next_id == 0) t->next_id = 1;
  op->req = req;
  return op;
}

/* Send req as one frame: key "<tag>/<seq>" ("<group>:<tag>/<seq>" in a survivors' view),
 * value v[0..vl) then data[0..dl). */
static ncfsm_result_t tcp_post_frame(ncfsm_boot *b, ncfsm_boot_req *req, uint8_t type,
                                     const char *tag, const uint8_t *v, size_t vl,
                                     const void *data, size_t dl) {
  tcp_view *view = b->impl;
  tcp_impl *t = view->t;
  tcp_op *op = ncfsm__tcp_op_new(t, req);
  if (!op) return NCFSM_ERR_NO_MEMORY;
  char key[NCFSM__FRAME_KEY_MAX + 32];
  int kl = view->ranks ? snprintf(key, sizeof key, "%s:%s/%" PRIu64, view->path, tag, req->seq)
                       : snprintf(key, sizeof key, "%s/%" PRIu64, tag, req->seq);
  if (ncfsm__tcp_send(t, type, op->id, key, (size_t)kl, v, vl, data, dl)) {
    free(op);
    return ncfsm__boot_fail(b, NCFSM_ERR_NO_MEMORY, "tcp bootstrap: out of memory");
  }
  TAILQ_INSERT_TAIL(&t->ops, op, link);
  req->impl = op;
  return NCFSM_OK;
}

static ncfsm_result_t tcp_post(ncfsm_boot *b, ncfsm_boot_req *req) {
  tcp_impl *t = ((tcp_view *)b->impl)->t;
  if (t->dead) return b->failed ? b->failed : NCFSM_ERR_BOOTSTRAP;
  if (req->len > UINT32_MAX - 8 || (uint64_t)req->len * (uint64_t)b->size > UINT32_MAX) {
    ncfsm__boot_seterr(b, "tcp allgather of %zu bytes x %d ranks is too large for one frame",
                       req->len, b->size);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  uint8_t v[8];
  ncfsm__wr32(v, (uint32_t)b->rank); /* a survivors' view: its index in the group */
  ncfsm__wr32(v + 4, (uint32_t)b->size);
  return tcp_post_frame(b, req, NCFSM__F_GATHER, "ag", v, sizeof v, req->send, req->len);
}

/* broadcast #n is one BCAST frame (key "bc/<n>", in a survivors' view "<group>:bc/<n>"):
 * value u32 rank, u32 size, u32 root, u32 len, and on root the len bytes. The store answers
 * root with an empty OK once it holds the bytes, every other rank with OK + the bytes. */
static ncfsm_result_t tcp_bcast_post(ncfsm_boot *b, ncfsm_boot_req *req) {
  tcp_impl *t = ((tcp_view *)b->impl)->t;
  if (t->dead) return b->failed ? b->failed : NCFSM_ERR_BOOTSTRAP;
  if (req->len > UINT32_MAX - 16) {
    ncfsm__boot_seterr(b, "tcp broadcast of %zu bytes is too large for one frame", req->len);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  uint8_t v[16];
  ncfsm__wr32(v, (uint32_t)b->rank); /* a survivors' view: its index in the group */
  ncfsm__wr32(v + 4, (uint32_t)b->size);
  ncfsm__wr32(v + 8, (uint32_t)req->root);
  ncfsm__wr32(v + 12, (uint32_t)req->len);
  int root = req->root == b->rank;
  return tcp_post_frame(b, req, NCFSM__F_BCAST, "bc", v, sizeof v, root ? req->send : NULL,
                        root ? req->len : 0);
}

void ncfsm__tcp_cancel(ncfsm_boot_req *req) {
  tcp_view *v = req->b->impl;
  tcp_impl *t = v ? v->t : NULL;
  tcp_op *op = req->impl;
  if (!t || !op) return;
  TAILQ_REMOVE(&t->ops, op, link);
  free(op);
  req->impl = NULL;
}

void ncfsm__tcp_describe(ncfsm_boot *b, char *buf, size_t n) {
  tcp_impl *t = ((tcp_view *)b->impl)->t;
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
  const tcp_impl *t = ((const tcp_view *)b->impl)->t;
  return t->hosted ? ncfsm__store_port(t->hosted) : -1;
}

const ncfsm__boot_ops ncfsm__boot_tcp_ops = {
    .name = "tcp",
    .open = tcp_open,
    .close = tcp_close,
    .post = tcp_post,
    .progress = NULL,
    .cancel = ncfsm__tcp_cancel,
    .describe = ncfsm__tcp_describe,
    .agree_post = ncfsm__tcp_agree_post,
    .agree_expire = ncfsm__tcp_agree_expire,
    .agree_grace_ms = 2000,
    .survivors = ncfsm__tcp_survivors,
    .bcast_post = tcp_bcast_post,
    .channel_open = ncfsm__tcp_channel_open,
    .notice_post = ncfsm__tcp_notice_post,
};
