/* ncfsm_http: /status, /metrics and /healthz on libevent's evhttp
 * (ncfsm/http.h). Uses ncfsm's public API only (ncfsm/introspect.h). */
#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "ncfsm/http.h"

struct ncfsm_http {
  struct evhttp *http;
  struct evhttp_bound_socket *sock;
  ncfsm_loop *loop;
  ncfsm_http_opts opts;
  char address[64];
  int port;
  ncfsm_http_counts counts;
};

static _Thread_local char start_error[256];

const char *ncfsm_http_start_error(void) { return start_error; }

void ncfsm_http_opts_init(ncfsm_http_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->address = "127.0.0.1";
  o->max_body = 1u << 20;
  ncfsm_introspect_opts_init(&o->introspect);
}

static void free_text(const void *data, size_t len, void *arg) {
  (void)len;
  (void)arg;
  free((void *)data);
}

/* Reply with text (taken: freed by the buffer) or a copy of a literal. */
/* Answers go out at once: without TCP_NODELAY the tail of an answer longer
 * than one segment waits for the client's delayed ACK (measured: a /metrics
 * round trip of 44 ms instead of ~0.1 ms over loopback). */
static void no_delay(struct evhttp_request *req) {
  struct evhttp_connection *c = evhttp_request_get_connection(req);
  struct bufferevent *bev = c ? evhttp_connection_get_bufferevent(c) : NULL;
  evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
  int one = 1;
  if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void reply(struct evhttp_request *req, int code, const char *reason, const char *type,
                  char *owned, const char *literal) {
  no_delay(req);
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Content-Type", type);
  evhttp_add_header(h, "Cache-Control", "no-store");
  struct evbuffer *b = evbuffer_new();
  if (!b) {
    free(owned);
    evhttp_send_error(req, 500, "out of memory");
    return;
  }
  if (owned) {
    if (evbuffer_add_reference(b, owned, strlen(owned), free_text, NULL) != 0) free(owned);
  } else if (literal) {
    evbuffer_add(b, literal, strlen(literal));
  }
  evhttp_send_reply(req, code, reason, b);
  evbuffer_free(b);
}

/* GET and HEAD only; anything else is answered 405 here. */
static int read_only(ncfsm_http *s, struct evhttp_request *req) {
  enum evhttp_cmd_type m = evhttp_request_get_command(req);
  if (m == EVHTTP_REQ_GET || m == EVHTTP_REQ_HEAD) return 1;
  s->counts.errors++;
  evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
  reply(req, 405, "Method Not Allowed", "text/plain; charset=utf-8", NULL,
        "method not allowed: use GET or HEAD\n");
  return 0;
}

static void on_status(struct evhttp_request *req, void *arg) {
  ncfsm_http *s = arg;
  if (!read_only(s, req)) return;
  ncfsm_introspect_opts o = s->opts.introspect;
  const char *q = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
  if (q) {
    struct evkeyvalq kv;
    if (evhttp_parse_query_str(q, &kv) != 0) {
      s->counts.errors++;
      reply(req, 400, "Bad Request", "text/plain; charset=utf-8", NULL, "malformed query string\n");
      return;
    }
    const char *t = evhttp_find_header(&kv, "tail");
    char *end = NULL;
    long v = t ? strtol(t, &end, 10) : 0;
    int bad = t && (!*t || *end || v < 0 || v > 1024);
    if (t && !bad) o.recorder_tail = (unsigned)v;
    evhttp_clear_headers(&kv);
    if (bad) {
      s->counts.errors++;
      reply(req, 400, "Bad Request", "text/plain; charset=utf-8", NULL,
            "tail must be an integer in 0..1024 (recorder entries per communicator)\n");
      return;
    }
  }
  json_t *j = NULL;
  ncfsm_result_t r = ncfsm_loop_status(s->loop, &o, &j);
  if (r == NCFSM_OK && s->opts.status && s->opts.status(s->opts.status_arg, j) != 0) r = NCFSM_ERR_INVALID_USAGE;
  char *text = r == NCFSM_OK ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (!text) {
    s->counts.errors++;
    reply(req, 500, "Internal Server Error", "text/plain; charset=utf-8", NULL, "snapshot failed\n");
    return;
  }
  s->counts.status++;
  reply(req, 200, "OK", "application/json", text, NULL);
}

static void on_metrics(struct evhttp_request *req, void *arg) {
  ncfsm_http *s = arg;
  if (!read_only(s, req)) return;
  char *text = NULL;
  if (ncfsm_loop_metrics(s->loop, &text, NULL) != NCFSM_OK) {
    s->counts.errors++;
    reply(req, 500, "Internal Server Error", "text/plain; charset=utf-8", NULL, "metrics failed\n");
    return;
  }
  s->counts.metrics++;
  reply(req, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", text, NULL);
}

static void on_healthz(struct evhttp_request *req, void *arg) {
  ncfsm_http *s = arg;
  if (!read_only(s, req)) return;
  s->counts.healthz++;
  char why[2048];
  int failed = ncfsm_loop_failed_comms(s->loop, why, sizeof why);
  size_t used = failed > 0 ? strlen(why) : 0;
  if (failed < 0) used = (size_t)snprintf(why, sizeof why, "ncfsm loop: snapshot failed\n");
  int app = 0;
  if (s->opts.health && used + 2 < sizeof why) {
    app = s->opts.health(s->opts.health_arg, why + used, sizeof why - used - 1) != 0;
    if (app) {
      used += strlen(why + used);
      if (used == 0 || why[used - 1] != '\n') { why[used++] = '\n'; why[used] = '\0'; }
    }
  }
  if (failed == 0 && !app) {
    reply(req, 200, "OK", "text/plain; charset=utf-8", NULL, "ok\n");
    return;
  }
  reply(req, 503, "Service Unavailable", "text/plain; charset=utf-8", strdup(why), NULL);
}

static void on_other(struct evhttp_request *req, void *arg) {
  ncfsm_http *s = arg;
  s->counts.errors++;
  reply(req, 404, "Not Found", "text/plain; charset=utf-8", NULL,
        "not found: the endpoints are /status, /metrics, /healthz\n");
}

ncfsm_result_t ncfsm_http_start(struct event_base *base, ncfsm_loop *loop, const ncfsm_http_opts *opts,
                                ncfsm_http **out) {
  start_error[0] = '\0';
  if (out) *out = NULL;
  if (!base || !loop || !out) {
    snprintf(start_error, sizeof start_error, "ncfsm_http_start: base, loop and out must not be NULL");
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  ncfsm_http *s = calloc(1, sizeof *s);
  if (!s) return NCFSM_ERR_NO_MEMORY;
  if (opts) s->opts = *opts;
  else ncfsm_http_opts_init(&s->opts);
  snprintf(s->address, sizeof s->address, "%s", s->opts.address ? s->opts.address : "127.0.0.1");
  s->opts.address = s->address;
  s->loop = loop;
  struct in6_addr a6;
  struct in_addr a4;
  if (s->opts.port > 65535 ||
      (inet_pton(AF_INET, s->address, &a4) != 1 && inet_pton(AF_INET6, s->address, &a6) != 1)) {
    snprintf(start_error, sizeof start_error,
             "ncfsm_http_start: address \"%s\" port %u: give a numeric IPv4 or IPv6 address and a "
             "port in 0..65535", s->address, s->opts.port);
    free(s);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  s->http = evhttp_new(base);
  if (!s->http) {
    free(s);
    return NCFSM_ERR_NO_MEMORY;
  }
  /* Read (and drop) the rest of an oversized body before answering 413, so
   * that the client sees the answer instead of a reset connection. */
  evhttp_set_flags(s->http, EVHTTP_SERVER_LINGERING_CLOSE);
  evhttp_set_max_body_size(s->http, (ev_ssize_t)(s->opts.max_body ? s->opts.max_body : 1u << 20));
  evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
                                          EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS |
                                          EVHTTP_REQ_PATCH);
  evhttp_set_cb(s->http, "/status", on_status, s);
  evhttp_set_cb(s->http, "/metrics", on_metrics, s);
  evhttp_set_cb(s->http, "/healthz", on_healthz, s);
  evhttp_set_gencb(s->http, on_other, s);
  s->sock = evhttp_bind_socket_with_handle(s->http, s->address, (ev_uint16_t)s->opts.port);
  if (!s->sock) {
    snprintf(start_error, sizeof start_error,
             "ncfsm_http_start: cannot bind %s port %u (in use? port 0 picks a free one)", s->address,
             s->opts.port);
    evhttp_free(s->http);
    free(s);
    return NCFSM_ERR_SYSTEM;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(evhttp_bound_socket_get_fd(s->sock), (struct sockaddr *)&ss, &sl) == 0)
    s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
  *out = s;
  return NCFSM_OK;
}

int ncfsm_http_port(const ncfsm_http *h) { return h ? h->port : -1; }

struct evhttp *ncfsm_http_evhttp(ncfsm_http *h) { return h ? h->http : NULL; }

void ncfsm_http_get_counts(const ncfsm_http *h, ncfsm_http_counts *out) {
  if (!out) return;
  if (h) *out = h->counts;
  else memset(out, 0, sizeof *out);
}

void ncfsm_http_stop(ncfsm_http *h) {
  if (!h) return;
  evhttp_free(h->http);
  free(h);
}
