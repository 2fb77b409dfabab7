/*
 * ncfsm_http: /status, /metrics and /healthz of an ncfsm loop over HTTP, on
 * libevent's evhttp, served from the application's own event_base. An
 * optional library: link ncfsm_http (CMake: find_package(ncfsm), target
 * ncfsm::http; pkg-config ncfsm_http).
 *
 *   GET /status   the loop's snapshot as JSON (ncfsm_loop_status; ?tail=N sets
 *                 the recorder entries per comm, 0..1024), application/json
 *   GET /metrics  Prometheus text format 0.0.4 (ncfsm_loop_metrics)
 *   GET /healthz  200 "ok" when no communicator has failed and the
 *                 application's own check passes, else 503 with one line
 *                 per reason (text/plain)
 * HEAD works like GET without the body; other methods get 405, other paths
 * 404, bodies longer than max_body 413. The application adds its own routes
 * on the same server (ncfsm_http_evhttp, evhttp_set_cb).
 *
 * Threads: every function here, and every request, runs on the thread that
 * runs base. The snapshot takes the ncfsm loop's lock briefly (see
 * ncfsm/introspect.h), so the ncfsm loop may be embedded in base
 * (ncfsm_loop_new_embedded) or run on a thread of its own.
 */
#ifndef NCFSM_HTTP_H
#define NCFSM_HTTP_H

#include <stddef.h>

#include "ncfsm.h"
#include "ncfsm/introspect.h"

#ifdef __cplusplus
extern "C" {
#endif

struct event_base;
struct evhttp;
struct json_t;

typedef struct ncfsm_http ncfsm_http;

typedef struct ncfsm_http_opts {
  const char *address;   /* address to bind (default "127.0.0.1": loopback only) */
  unsigned port;         /* 0 (default): a free port, see ncfsm_http_port */
  size_t max_body;       /* longest request body accepted, 413 beyond (default 1 MiB) */
  ncfsm_introspect_opts introspect; /* defaults of /status */
  /* Optional, on base's thread: the application's own health check for
   * /healthz; return 0 when healthy, else nonzero with a reason in why. */
  int (*health)(void *arg, char *why, size_t len);
  void *health_arg;
  /* Optional, on base's thread: add members to the /status object (e.g. an
   * "app" object); return 0, or nonzero to answer 500. */
  int (*status)(void *arg, struct json_t *status);
  void *status_arg;
} ncfsm_http_opts;

void ncfsm_http_opts_init(ncfsm_http_opts *o);

/* Bind and serve on base. NCFSM_ERR_INVALID_ARGUMENT (NULL base, loop or
 * out; a bad address), NCFSM_ERR_SYSTEM (the address cannot be bound, e.g.
 * in use), NCFSM_ERR_NO_MEMORY; ncfsm_http_start_error() says why. */
ncfsm_result_t ncfsm_http_start(struct event_base *base, ncfsm_loop *loop,
                                const ncfsm_http_opts *opts, ncfsm_http **out);
/* Why the last ncfsm_http_start on this thread failed ("" if it did not). */
const char *ncfsm_http_start_error(void);
/* The port bound (the one picked when opts.port was 0). */
int ncfsm_http_port(const ncfsm_http *h);
/* The server, to add the application's own routes. */
struct evhttp *ncfsm_http_evhttp(ncfsm_http *h);
/* Requests served so far per endpoint (status, metrics, healthz). */
typedef struct ncfsm_http_counts {
  unsigned long long status, metrics, healthz, errors;
} ncfsm_http_counts;
void ncfsm_http_get_counts(const ncfsm_http *h, ncfsm_http_counts *out);
/* Close the listener and every connection; h is freed. Call it before the
 * ncfsm loop is closed and before base is freed. */
void ncfsm_http_stop(ncfsm_http *h);

#ifdef __cplusplus
}
#endif
#endif
