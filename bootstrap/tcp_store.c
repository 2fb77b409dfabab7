/*
 * The tcp bootstrap's key-value store server: an evconnlistener plus one
 * bufferevent per connection, all on the event_base that hosts it (rank 0's
 * loop, or tools/ncfsm-store). Single-threaded: every function runs on that
 * base's thread.
 *
 * Each connection must HELLO with the job token before anything else. A
 * malformed, oversized, truncated or unknown frame closes that connection
 * only (after an ERR frame naming the reason), logged at WARN. Input per
 * connection is bounded by a read high-watermark of one largest frame.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
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
#include <event2/listener.h>
#include <event2/util.h>
#include <xxhash.h>

#include "bootstrap/frame.h"
#include "bootstrap/tcp-internal.h"
#include "core/log.h"

struct sconn;
struct entry;

struct waiter {
  LIST_ENTRY(waiter) by_entry;
  LIST_ENTRY(waiter) by_conn;
  struct sconn *c;
  struct entry *e;
  uint32_t id;
  uint8_t type;
};

/* Shared gather result, referenced by every reply's evbuffer chain. */
struct gbuf {
  int refs;
  size_t len;
  uint8_t data[];
};

struct entry {
  struct entry *hnext;
  uint64_t h;
  uint8_t *key;
  uint32_t klen;
  int has_val;
  uint8_t *val;
  uint32_t vlen;
  int gather;
  uint32_t g_size, g_len, g_count;
  struct gbuf *g_buf;
  uint8_t *g_have;
  LIST_HEAD(, waiter) waiters;
};

struct sconn {
  ncfsm__store *s;
  struct bufferevent *bev;
  char peer[80];
  int authed, closing;
  uint32_t rank;
  LIST_HEAD(, waiter) waiters;
  LIST_ENTRY(sconn) link;
};

struct ncfsm__store {
  struct event_base *base;
  struct evconnlistener *lis;
  struct event *relisten;
  int port;
  uint8_t *token;
  size_t toklen;
  ncfsm__frame_limits lim;
  uint64_t max_bytes, bytes, auth_timeout_ms;
  struct entry **tab;
  size_t nb, count;
  LIST_HEAD(, sconn) conns;
  ncfsm__store_stats st;
};

#define SUB NCFSM__SUB_BOOT

/* ---- helpers shared with the client -------------------------------------- */

int ncfsm__ct_equal(const void *a, size_t alen, const void *b, size_t blen) {
  const volatile uint8_t *x = a, *y = b;
  size_t n = alen > blen ? alen : blen;
  uint8_t d = (uint8_t)(alen != blen);
  for (size_t i = 0; i < n; i++) {
    uint8_t xi = i < alen ? x[i] : 0, yi = i < blen ? y[i] : 0;
    d |= (uint8_t)(xi ^ yi);
  }
  return d == 0;
}

int ncfsm__parse_addr(const char *addr, struct sockaddr *sa, int *salen, char *err, size_t errlen) {
  int len = *salen;
  if (!addr || !*addr) {
    snprintf(err, errlen, "empty store address: set NCFSM_STORE_ADDR=host:port");
    return -1;
  }
  if (evutil_parse_sockaddr_port(addr, sa, &len) == 0) {
    *salen = len;
    return 0;
  }
  char host[256];
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host || !colon[1]) {
    snprintf(err, errlen, "store address '%s' is not host:port", addr);
    return -1;
  }
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = 0;
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host, colon + 1, &hints, &res);
  if (rc != 0 || !res) {
    snprintf(err, errlen, "store address '%s': %s", addr, gai_strerror(rc));
    return -1;
  }
  if ((int)res->ai_addrlen > *salen) {
    freeaddrinfo(res);
    snprintf(err, errlen, "store address '%s': address too long", addr);
    return -1;
  }
  memcpy(sa, res->ai_addr, res->ai_addrlen);
  *salen = (int)res->ai_addrlen;
  freeaddrinfo(res);
  return 0;
}

int ncfsm__addr_is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return 1;
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) return in6->sin6_addr.s6_addr[12] == 127;
  }
  return 0;
}

/* ---- the table -------------------------------------------------------------- */

static struct entry *table_find(ncfsm__store *s, const uint8_t *key, uint32_t klen, uint64_t h) {
  for (struct entry *e = s->tab[h & (s->nb - 1)]; e; e = e->hnext)
    if (e->h == h && e->klen == klen && !memcmp(e->key, key, klen)) return e;
  return NULL;
}

static void table_grow(ncfsm__store *s) {
  size_t nb = s->nb * 2;
  struct entry **t = calloc(nb, sizeof *t);
  if (!t) return; /* keep the longer chains */
  for (size_t i = 0; i < s->nb; i++)
    for (struct entry *e = s->tab[i], *next; e; e = next) {
      next = e->hnext;
      e->hnext = t[e->h & (nb - 1)];
      t[e->h & (nb - 1)] = e;
    }
  free(s->tab);
  s->tab = t;
  s->nb = nb;
}

static struct entry *table_get(ncfsm__store *s, const uint8_t *key, uint32_t klen, int create) {
  uint64_t h = XXH64(key, klen, 0);
  struct entry *e = table_find(s, key, klen, h);
  if (e || !create) return e;
  if (s->bytes + klen + sizeof *e > s->max_bytes) return NULL;
  e = calloc(1, sizeof *e);
  if (!e || !(e->key = malloc(klen ? klen : 1))) {
    free(e);
    return NULL;
  }
  memcpy(e->key, key, klen);
  e->klen = klen;
  e->h = h;
  LIST_INIT(&e->waiters);
  e->hnext = s->tab[h & (s->nb - 1)];
  s->tab[h & (s->nb - 1)] = e;
  s->bytes += klen + sizeof *e;
  if (++s->count > 2 * s->nb) table_grow(s);
  return e;
}

static void gbuf_unref(const void *data, size_t len, void *arg) {
  struct gbuf *g = arg;
  (void)data;
  (void)len;
  if (--g->refs == 0) free(g);
}

static void entry_delete(ncfsm__store *s, struct entry *e) {
  struct entry **pp = &s->tab[e->h & (s->nb - 1)];
  while (*pp != e) pp = &(*pp)->hnext;
  *pp = e->hnext;
  s->count--;
  s->bytes -= e->klen + sizeof *e + e->vlen;
  if (e->gather) s->bytes -= (uint64_t)e->g_size * e->g_len + e->g_size;
  free(e->key);
  free(e->val);
  if (e->g_buf) gbuf_unref(NULL, 0, e->g_buf);
  free(e->g_have);
  free(e);
}

/* An entry made only to park GET/WAITs is dropped once nobody waits on it. */
static void entry_maybe_drop(ncfsm__store *s, struct entry *e) {
  if (!e->has_val && !e->gather && LIST_EMPTY(&e->waiters)) entry_delete(s, e);
}

/* ---- replies ------------------------------------------------------------------ */

static void reply(struct sconn *c, uint8_t type, uint32_t id, const void *val, uint32_t vlen) {
  uint8_t hdr[NCFSM__FRAME_HDR];
  ncfsm__frame_header(hdr, type, id, 0, vlen);
  struct evbuffer *out = bufferevent_get_output(c->bev);
  evbuffer_add(out, hdr, sizeof hdr);
  if (vlen) evbuffer_add(out, val, vlen);
}

static void reply_err(struct sconn *c, uint32_t id, const char *msg) {
  reply(c, NCFSM__F_ERR, id, msg, (uint32_t)strlen(msg));
}

static void waiter_free(struct waiter *w) {
  LIST_REMOVE(w, by_entry);
  LIST_REMOVE(w, by_conn);
  free(w);
}

/* Answer every GET/WAIT parked on e (which now has a value). */
static void wake_waiters(struct entry *e) {
  struct waiter *w;
  while ((w = LIST_FIRST(&e->waiters)) != NULL) {
    if (w->type == NCFSM__F_GET) reply(w->c, NCFSM__F_OK, w->id, e->val, e->vlen);
    else reply(w->c, NCFSM__F_OK, w->id, NULL, 0);
    waiter_free(w);
  }
}

static int park(struct sconn *c, struct entry *e, uint8_t type, uint32_t id) {
  struct waiter *w = calloc(1, sizeof *w);
  if (!w) return -1;
  w->c = c;
  w->e = e;
  w->id = id;
  w->type = type;
  LIST_INSERT_HEAD(&e->waiters, w, by_entry);
  LIST_INSERT_HEAD(&c->waiters, w, by_conn);
  return 0;
}

/* ---- connections ------------------------------------------------------------------ */

static void conn_free(struct sconn *c) {
  ncfsm__store *s = c->s;
  struct waiter *w;
  while ((w = LIST_FIRST(&c->waiters)) != NULL) {
    struct entry *e = w->e;
    waiter_free(w);
    entry_maybe_drop(s, e);
  }
  LIST_REMOVE(c, link);
  s->st.open_conns--;
  bufferevent_free(c->bev);
  free(c);
}

static void conn_closing_write_cb(struct bufferevent *bev, void *arg) {
  (void)bev;
  conn_free(arg);
}

static void conn_closing_event_cb(struct bufferevent *bev, short what, void *arg) {
  (void)bev;
  (void)what;
  conn_free(arg);
}

/* Close c after its ERR frame (and anything queued before it) is flushed,
 * or after one second if the peer does not read. */
static void conn_fail(struct sconn *c, uint32_t id, const char *why) {
  NCFSM_WARN(SUB, "store: closing connection from %s (rank %d): %s", c->peer,
             c->authed ? (int)c->rank : -1, why);
  c->closing = 1;
  reply_err(c, id, why);
  bufferevent_disable(c->bev, EV_READ);
  bufferevent_setcb(c->bev, NULL, conn_closing_write_cb, conn_closing_event_cb, c);
  struct timeval one = {1, 0};
  bufferevent_set_timeouts(c->bev, NULL, &one);
  bufferevent_enable(c->bev, EV_WRITE);
}

static const char *handle_hello(struct sconn *c, const ncfsm__frame *f) {
  ncfsm__store *s = c->s;
  if (c->authed) return "second HELLO on one connection";
  if (!ncfsm__ct_equal(f->key, f->klen, s->token, s->toklen)) {
    s->st.rejected_token++;
    return "bad token: HELLO did not carry this job's NCFSM_STORE_TOKEN";
  }
  c->authed = 1;
  c->rank = ncfsm__rd32(f->value);
  s->st.authenticated++;
  bufferevent_set_timeouts(c->bev, NULL, NULL);
  NCFSM_TRACE(SUB, "store: %s authenticated as rank %u", c->peer, c->rank);
  reply(c, NCFSM__F_OK, f->id, NULL, 0);
  return NULL;
}

static void handle_set(struct sconn *c, const ncfsm__frame *f) {
  ncfsm__store *s = c->s;
  struct entry *e = table_get(s, f->key, f->klen, 1);
  if (!e) return reply_err(c, f->id, "store full (NCFSM store max bytes)");
  if (e->gather) return reply_err(c, f->id, "key is in use by a GATHER");
  if (s->bytes - e->vlen + f->vlen > s->max_bytes) {
    reply_err(c, f->id, "store full (NCFSM store max bytes)");
    return entry_maybe_drop(s, e);
  }
  uint8_t *v = malloc(f->vlen ? f->vlen : 1);
  if (!v) {
    reply_err(c, f->id, "store out of memory");
    return entry_maybe_drop(s, e);
  }
  memcpy(v, f->value, f->vlen);
  s->bytes = s->bytes - e->vlen + f->vlen;
  free(e->val);
  e->val = v;
  e->vlen = f->vlen;
  e->has_val = 1;
  reply(c, NCFSM__F_OK, f->id, NULL, 0);
  wake_waiters(e);
}

static void handle_get(struct sconn *c, const ncfsm__frame *f) {
  struct entry *e = table_get(c->s, f->key, f->klen, 1);
  if (!e) return reply_err(c, f->id, "store full (NCFSM store max bytes)");
  if (e->gather) return reply_err(c, f->id, "key is in use by a GATHER");
  if (e->has_val) {
    if (f->type == NCFSM__F_GET) reply(c, NCFSM__F_OK, f->id, e->val, e->vlen);
    else reply(c, NCFSM__F_OK, f->id, NULL, 0);
    return;
  }
  if (park(c, e, f->type, f->id) != 0) {
    reply_err(c, f->id, "store out of memory");
    entry_maybe_drop(c->s, e);
  }
}

static void handle_add(struct sconn *c, const ncfsm__frame *f) {
  ncfsm__store *s = c->s;
  struct entry *e = table_get(s, f->key, f->klen, 1);
  if (!e) return reply_err(c, f->id, "store full (NCFSM store max bytes)");
  if (e->gather) return reply_err(c, f->id, "key is in use by a GATHER");
  if (e->has_val && e->vlen != 8) return reply_err(c, f->id, "ADD on a key that is not a counter");
  if (!e->has_val) {
    if (!(e->val = calloc(1, 8))) {
      reply_err(c, f->id, "store out of memory");
      return entry_maybe_drop(s, e);
    }
    e->vlen = 8;
    e->has_val = 1;
    s->bytes += 8;
  }
  uint64_t v = ncfsm__rd64(e->val) + ncfsm__rd64(f->value); /* wraps like int64 two's complement */
  ncfsm__wr64(e->val, v);
  reply(c, NCFSM__F_OK, f->id, e->val, 8);
  wake_waiters(e);
}

static void handle_gather(struct sconn *c, const ncfsm__frame *f) {
  ncfsm__store *s = c->s;
  uint32_t rank = ncfsm__rd32(f->value), size = ncfsm__rd32(f->value + 4), len = f->vlen - 8;
  struct entry *e = table_get(s, f->key, f->klen, 1);
  if (!e) return reply_err(c, f->id, "store full (NCFSM store max bytes)");
  if (!e->gather) {
    if (e->has_val || !LIST_EMPTY(&e->waiters))
      return reply_err(c, f->id, "key is in use by SET/GET");
    uint64_t need = (uint64_t)size * len + size;
    if (s->bytes + need > s->max_bytes || (uint64_t)size * len > SIZE_MAX / 2) {
      reply_err(c, f->id, "GATHER larger than the store's max bytes");
      return entry_maybe_drop(s, e);
    }
    e->g_buf = malloc(sizeof *e->g_buf + (size_t)size * len);
    e->g_have = calloc(size, 1);
    if (!e->g_buf || !e->g_have) {
      free(e->g_buf);
      free(e->g_have);
      e->g_buf = NULL;
      e->g_have = NULL;
      reply_err(c, f->id, "store out of memory");
      return entry_maybe_drop(s, e);
    }
    e->g_buf->refs = 1;
    e->g_buf->len = (size_t)size * len;
    e->gather = 1;
    e->g_size = size;
    e->g_len = len;
    s->bytes += need;
  }
  if (e->g_size != size || e->g_len != len) {
    char msg[160];
    snprintf(msg, sizeof msg, "GATHER mismatch: rank %u posted size %u len %u, others size %u len %u",
             rank, size, len, e->g_size, e->g_len);
    return reply_err(c, f->id, msg);
  }
  if (e->g_have[rank]) return reply_err(c, f->id, "GATHER: this rank already contributed");
  if (park(c, e, NCFSM__F_GATHER, f->id) != 0) return reply_err(c, f->id, "store out of memory");
  e->g_have[rank] = 1;
  memcpy(e->g_buf->data + (size_t)rank * len, f->value + 8, len);
  if (++e->g_count < e->g_size) return;
  struct gbuf *g = e->g_buf;
  struct waiter *w;
  while ((w = LIST_FIRST(&e->waiters)) != NULL) {
    uint8_t hdr[NCFSM__FRAME_HDR];
    ncfsm__frame_header(hdr, NCFSM__F_OK, w->id, 0, (uint32_t)g->len);
    struct evbuffer *out = bufferevent_get_output(w->c->bev);
    evbuffer_add(out, hdr, sizeof hdr);
    if (g->len) {
      g->refs++;
      if (evbuffer_add_reference(out, g->data, g->len, gbuf_unref, g) != 0) {
        g->refs--;
        evbuffer_add(out, g->data, g->len);
      }
    }
    waiter_free(w);
  }
  entry_delete(s, e);
}

static const char *handle(struct sconn *c, const ncfsm__frame *f) {
  c->s->st.frames++;
  if (f->type == NCFSM__F_HELLO) return handle_hello(c, f);
  if (!c->authed) return "first frame is not HELLO";
  switch (f->type) {
  case NCFSM__F_SET: handle_set(c, f); return NULL;
  case NCFSM__F_GET:
  case NCFSM__F_WAIT: handle_get(c, f); return NULL;
  case NCFSM__F_ADD: handle_add(c, f); return NULL;
  case NCFSM__F_GATHER: handle_gather(c, f); return NULL;
  default: return "reply frame (OK/ERR) sent to the server";
  }
}

static void conn_read_cb(struct bufferevent *bev, void *arg) {
  struct sconn *c = arg;
  ncfsm__store *s = c->s;
  struct evbuffer *in = bufferevent_get_input(bev);
  while (!c->closing) {
    size_t n = evbuffer_get_length(in);
    if (n == 0) return;
    size_t want = n < NCFSM__FRAME_HDR ? n : NCFSM__FRAME_HDR, used = 0;
    const uint8_t *p = evbuffer_pullup(in, (ev_ssize_t)want);
    ncfsm__frame f;
    const char *why;
    ncfsm__parse_t r = ncfsm__frame_parse(p, want, &s->lim, &f, &used, &why);
    if (r == NCFSM__PARSE_MORE) {
      if (used > n) return; /* the rest has not arrived */
      p = evbuffer_pullup(in, (ev_ssize_t)used);
      r = ncfsm__frame_parse(p, used, &s->lim, &f, &used, &why);
    }
    if (r != NCFSM__PARSE_OK) {
      s->st.closed_bad_frame++;
      return conn_fail(c, 0, why ? why : "unparsable frame");
    }
    int was_authed = c->authed;
    why = handle(c, &f);
    evbuffer_drain(in, used);
    if (why) {
      if (was_authed || f.type != NCFSM__F_HELLO) s->st.closed_bad_frame++; /* else: bad token */
      return conn_fail(c, f.id, why);
    }
  }
}

static void conn_event_cb(struct bufferevent *bev, short what, void *arg) {
  struct sconn *c = arg;
  size_t left = evbuffer_get_length(bufferevent_get_input(bev));
  if (what & BEV_EVENT_TIMEOUT) {
    NCFSM_WARN(SUB, "store: closing connection from %s: no HELLO within %" PRIu64 " ms", c->peer,
               c->s->auth_timeout_ms);
    c->s->st.closed_bad_frame++;
  } else if (left) {
    NCFSM_WARN(SUB, "store: connection from %s (rank %d) closed in the middle of a frame (%zu "
                    "bytes left)",
               c->peer, c->authed ? (int)c->rank : -1, left);
    c->s->st.closed_bad_frame++;
  } else {
    NCFSM_TRACE(SUB, "store: connection from %s closed (%s)", c->peer,
                (what & BEV_EVENT_EOF) ? "eof" : evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    c->s->st.closed_eof++;
  }
  conn_free(c);
}

static void accept_cb(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg) {
  ncfsm__store *s = arg;
  (void)lis;
  (void)salen;
  struct sconn *c = calloc(1, sizeof *c);
  struct bufferevent *bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE);
  if (!c || !bev) {
    NCFSM_WARN(SUB, "store: out of memory accepting a connection");
    free(c);
    if (bev) bufferevent_free(bev);
    else evutil_closesocket(fd);
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  c->s = s;
  c->bev = bev;
  LIST_INIT(&c->waiters);
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    evutil_inet_ntop(AF_INET, &((struct sockaddr_in *)sa)->sin_addr, host, sizeof host);
    port = ntohs(((struct sockaddr_in *)sa)->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    evutil_inet_ntop(AF_INET6, &((struct sockaddr_in6 *)sa)->sin6_addr, host, sizeof host);
    port = ntohs(((struct sockaddr_in6 *)sa)->sin6_port);
  }
  snprintf(c->peer, sizeof c->peer, "%s:%d", host, port);
  LIST_INSERT_HEAD(&s->conns, c, link);
  s->st.accepted++;
  s->st.open_conns++;
  bufferevent_setwatermark(bev, EV_READ, 0,
                           (size_t)NCFSM__FRAME_HDR + s->lim.key_max + s->lim.value_max);
  bufferevent_setcb(bev, conn_read_cb, NULL, conn_event_cb, c);
  struct timeval tv = {(time_t)(s->auth_timeout_ms / 1000),
                       (suseconds_t)(s->auth_timeout_ms % 1000) * 1000};
  bufferevent_set_timeouts(bev, &tv, NULL);
  bufferevent_enable(bev, EV_READ | EV_WRITE);
}

static void relisten_cb(evutil_socket_t fd, short what, void *arg) {
  ncfsm__store *s = arg;
  (void)fd;
  (void)what;
  evconnlistener_enable(s->lis);
}

/* accept() failed (EMFILE, ENFILE, ENOBUFS): pause for 100 ms instead of spinning. */
static void accept_error_cb(struct evconnlistener *lis, void *arg) {
  ncfsm__store *s = arg;
  int err = EVUTIL_SOCKET_ERROR();
  NCFSM_WARN(SUB, "store: accept failed: %s; pausing the listener for 100 ms (raise the open-file "
                  "limit, ulimit -n, for many ranks)",
             evutil_socket_error_to_string(err));
  evconnlistener_disable(lis);
  struct timeval tv = {0, 100000};
  evtimer_add(s->relisten, &tv);
}

void ncfsm__store_opts_init(ncfsm__store_opts *o) {
  memset(o, 0, sizeof *o);
  o->listen = "127.0.0.1:29500";
  o->key_max = NCFSM__FRAME_KEY_MAX;
  o->value_max = NCFSM__FRAME_VALUE_MAX;
  o->max_bytes = 1ull << 30;
  o->auth_timeout_ms = 10000;
}

int ncfsm__store_open(struct event_base *base, const ncfsm__store_opts *o, ncfsm__store **out,
                      char *err, size_t errlen) {
  *out = NULL;
  if (!o->token || !*o->token) {
    snprintf(err, errlen, "the store needs a job token: set NCFSM_STORE_TOKEN (e.g. to the output "
                          "of `openssl rand -hex 16`) for every rank and the store");
    return -1;
  }
  if (strlen(o->token) > (o->key_max ? o->key_max : NCFSM__FRAME_KEY_MAX)) {
    snprintf(err, errlen, "store token longer than %u bytes", o->key_max);
    return -1;
  }
  struct sockaddr_storage ss;
  int salen = sizeof ss;
  if (ncfsm__parse_addr(o->listen, (struct sockaddr *)&ss, &salen, err, errlen) != 0) return -1;
  if (!o->allow_remote && !ncfsm__addr_is_loopback((struct sockaddr *)&ss)) {
    snprintf(err, errlen, "store address %s is not a loopback address; the store has no TLS: set "
                          "NCFSM_STORE_ALLOW_REMOTE=1 (or --allow-remote) on a trusted network",
             o->listen);
    return -1;
  }
  ncfsm__store *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  s->base = base;
  s->toklen = strlen(o->token);
  s->token = (uint8_t *)strdup(o->token);
  s->lim.key_max = o->key_max ? o->key_max : NCFSM__FRAME_KEY_MAX;
  s->lim.value_max = o->value_max ? o->value_max : NCFSM__FRAME_VALUE_MAX;
  if (s->lim.value_max < 8 + 1) s->lim.value_max = 9;
  s->max_bytes = o->max_bytes ? o->max_bytes : (1ull << 30);
  s->auth_timeout_ms = o->auth_timeout_ms ? o->auth_timeout_ms : 10000;
  s->nb = 1024;
  s->tab = calloc(s->nb, sizeof *s->tab);
  LIST_INIT(&s->conns);
  s->relisten = evtimer_new(base, relisten_cb, s);
  if (!s->token || !s->tab || !s->relisten) {
    snprintf(err, errlen, "out of memory");
    goto fail;
  }
  s->lis = evconnlistener_new_bind(base, accept_cb, s,
                                   LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
                                   4096, (struct sockaddr *)&ss, salen);
  if (!s->lis) {
    snprintf(err, errlen, "store cannot listen on %s: %s (another store or job on that port? pick "
                          "another NCFSM_STORE_ADDR port)",
             o->listen, evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    goto fail;
  }
  evconnlistener_set_error_cb(s->lis, accept_error_cb);
  struct sockaddr_storage bound;
  socklen_t blen = sizeof bound;
  if (getsockname(evconnlistener_get_fd(s->lis), (struct sockaddr *)&bound, &blen) == 0)
    s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
  NCFSM_INFO(SUB, "store: listening on %s (port %d)", o->listen, s->port);
  *out = s;
  return 0;
fail:
  if (s->relisten) event_free(s->relisten);
  free(s->tab);
  free(s->token);
  free(s);
  return -1;
}

int ncfsm__store_port(const ncfsm__store *s) { return s ? s->port : -1; }

void ncfsm__store_stats_get(const ncfsm__store *s, ncfsm__store_stats *st) { *st = s->st; }

void ncfsm__store_close(ncfsm__store *s) {
  if (!s) return;
  struct sconn *c;
  while ((c = LIST_FIRST(&s->conns)) != NULL) conn_free(c);
  evconnlistener_free(s->lis);
  event_free(s->relisten);
  for (size_t i = 0; i < s->nb; i++)
    for (struct entry *e = s->tab[i], *next; e; e = next) {
      next = e->hnext;
      free(e->key);
      free(e->val);
      if (e->g_buf) gbuf_unref(NULL, 0, e->g_buf);
      free(e->g_have);
      free(e);
    }
  memset(s->token, 0, s->toklen);
  free(s->token);
  free(s->tab);
  free(s);
}
