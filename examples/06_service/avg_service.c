/* One rank of the averaging service (avg_service.h). Two ways to run the
 * same service:
 *   - ncfsm (default): the ncfsm loop is embedded in the application's
 *     event_base; a round is submitted and its completion arrives as a
 *     callback, so the base keeps answering HTTP while collectives run,
 *     fail or time out;
 *   - naive (--naive): each collective is waited for (ncfsm_work_wait)
 *     inside the event callback that starts it, as a service making blocking
 *     NCCL calls in its handlers does: nothing else is answered meanwhile.
 * A round AllReduces count + 2 floats: the summed vectors, how many vectors
 * they are, and a stop flag (a rank asked to stop sets it; after a round
 * with the flag set every rank finalizes, so all ranks ran the same
 * collectives). */
#include "avg_service.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "launch.h"
#include "ncfsm/bootstrap.h"
#include "ncfsm/http.h"

typedef enum { PH_INIT, PH_RUN, PH_STOPPING, PH_CLOSED } phase_t;

struct avg_service {
  avg_opts o;
  struct event_base *base;
  ncfsm_loop *loop;
  ncfsm_boot *boot;
  ncfsm_comm *comm;
  ncfsm_http *http;
  int rank, size;
  phase_t phase;
  size_t n;                     /* floats per round: count + 2 */
  float *acc;                   /* local sums since the last round, count + 1 (the vectors) */
  float *stage;                 /* what the round in flight carries */
  double *total;                /* every rank's sums over all rounds */
  uint64_t total_vectors, round;
  void *dev, *busy_dev;         /* backend buffers */
  size_t busy_count;
  unsigned busy_left;
  int inflight, stop_requested, stop_sent, failed, aborted;
  char failure[512];
  struct event *ev_round, *ev_busy, *ev_grace, *ev_step;
  avg_counters ctr;
};

void avg_opts_init(avg_opts *o) {
  memset(o, 0, sizeof *o);
  o->address = "127.0.0.1";
  o->count = 1024;
  o->batch = 64;
  o->interval_ms = 100;
  o->timeout_ms = 60000;
  o->on_error = NCFSM_ON_ERROR_STAY;
  o->sim_async_error_at = -1;
  o->stop_grace_ms = 5000;
  o->backend = NCFSM_BACKEND_AUTO;
}

static void fail(avg_service *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(avg_service *s, const char *fmt, ...) {
  if (!s->failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->failure, sizeof s->failure, fmt, ap);
    va_end(ap);
  }
  s->failed = 1;
  atomic_store(&s->ctr.failed, 1);
  fprintf(stderr, "06_service rank %d: %s\n", s->rank, s->failure);
}

static struct timeval ms_tv(unsigned ms) { return (struct timeval){ms / 1000, (ms % 1000) * 1000}; }

/* ---- rounds ------------------------------------------------------------------ */

static void shutdown_step(evutil_socket_t fd, short what, void *arg);

static void begin_stop(avg_service *s) {
  if (s->phase >= PH_STOPPING) return;
  s->phase = PH_STOPPING;
  event_del(s->ev_round);
  event_active(s->ev_step, EV_TIMEOUT, 0);
}

/* The reduced buffer is in stage: fold it into the totals. */
static void apply_round(avg_service *s) {
  for (size_t i = 0; i < s->o.count; i++) s->total[i] += s->stage[i];
  uint64_t k = (uint64_t)s->stage[s->o.count];
  s->total_vectors += k;
  s->round++;
  atomic_fetch_add(&s->ctr.rounds, 1);
  atomic_fetch_add(&s->ctr.vectors_averaged, k);
}

/* Move the local sums into stage (they are zeroed: vectors arriving during
 * the round go to the next one) and the backend buffer. */
static int stage_round(avg_service *s) {
  memcpy(s->stage, s->acc, (s->o.count + 1) * sizeof *s->stage);
  memset(s->acc, 0, (s->o.count + 1) * sizeof *s->acc);
  s->stage[s->o.count + 1] = s->stop_requested ? 1.0f : 0.0f;
  s->stop_sent |= s->stop_requested;
  return ncfsm_memcpy(s->comm, s->dev, s->stage, s->n * sizeof(float), 1) == NCFSM_OK ? 0 : -1;
}

static void after_round(avg_service *s) {
  if (s->stage[s->o.count + 1] > 0.0f) { begin_stop(s); return; }
  if (s->acc[s->o.count] >= (float)s->o.batch) event_active(s->ev_round, EV_TIMEOUT, 0);
  else {
    struct timeval tv = ms_tv(s->o.interval_ms);
    event_add(s->ev_round, &tv);
  }
}

static void on_round_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  avg_service *s = arg;
  s->inflight = 0;
  if (st != NCFSM_OK) { /* outputs untrusted (R10): the round's vectors are lost */
    fail(s, "round failed: %s", ncfsm_err_name(st));
    if (s->phase == PH_STOPPING || s->stop_requested) event_active(s->ev_step, EV_TIMEOUT, 0);
    return;
  }
  if (ncfsm_memcpy(s->comm, s->stage, s->dev, s->n * sizeof(float), 0) != NCFSM_OK) {
    fail(s, "%s", "copying the round's result failed");
    return;
  }
  apply_round(s);
  after_round(s);
}

static void start_round(avg_service *s) {
  if (s->phase != PH_RUN || s->inflight || s->failed || s->busy_left) return;
  event_del(s->ev_round);
  if (stage_round(s) != 0) { fail(s, "%s", "copying the round's input failed"); return; }
  ncfsm_work *w = NULL;
  ncfsm_result_t r = ncfsm_allreduce(s->comm, s->dev, s->dev, s->n, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL,
                                     s->o.naive ? NULL : on_round_done, s, s->o.naive ? &w : NULL);
  if (r != NCFSM_OK) { fail(s, "ncfsm_allreduce: %s", ncfsm_comm_last_error(s->comm)); return; }
  s->inflight = 1;
  if (!s->o.naive) return;
  /* naive: the round blocks this callback (and every client) until done */
  r = ncfsm_work_wait(w, 0);
  ncfsm_work_release(w);
  s->inflight = 0;
  if (r != NCFSM_OK) { fail(s, "round failed: %s", ncfsm_err_name(r)); return; }
  if (ncfsm_memcpy(s->comm, s->stage, s->dev, s->n * sizeof(float), 0) != NCFSM_OK) {
    fail(s, "%s", "copying the round's result failed");
    return;
  }
  apply_round(s);
  after_round(s);
}

static void on_round_timer(evutil_socket_t fd, short what, void *arg) { start_round(arg); }

/* ---- busy traffic (the benchmark): busy_ops AllReduces back to back ---------- */

static void busy_next(avg_service *s);

static void on_busy_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  avg_service *s = arg;
  if (st != NCFSM_OK) { fail(s, "busy AllReduce failed: %s", ncfsm_err_name(st)); return; }
  s->busy_left--;
  atomic_fetch_add(&s->ctr.busy_done, 1);
  busy_next(s);
}

static void busy_next(avg_service *s) {
  if (s->failed || s->phase != PH_RUN) return;
  if (!s->busy_left) { /* then the service's own rounds */
    struct timeval tv = ms_tv(s->o.interval_ms);
    event_add(s->ev_round, &tv);
    return;
  }
  if (s->o.naive) { /* one blocking AllReduce per callback; the next from a fresh one */
    ncfsm_work *w = NULL;
    ncfsm_result_t r = ncfsm_allreduce(s->comm, s->busy_dev, s->busy_dev, s->busy_count, NCFSM_FLOAT32,
                                       NCFSM_OP_SUM, NULL, NULL, NULL, &w);
    if (r == NCFSM_OK) r = ncfsm_work_wait(w, 0);
    if (w) ncfsm_work_release(w);
    if (r != NCFSM_OK) { fail(s, "busy AllReduce failed: %s", ncfsm_err_name(r)); return; }
    s->busy_left--;
    atomic_fetch_add(&s->ctr.busy_done, 1);
    /* a zero timer, not event_active: the base polls its sockets before it
     * runs the next one, so clients are answered between collectives */
    struct timeval zero = {0, 0};
    event_add(s->ev_busy, &zero);
    return;
  }
  if (ncfsm_allreduce(s->comm, s->busy_dev, s->busy_dev, s->busy_count, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL,
                      on_busy_done, s, NULL) != NCFSM_OK)
    fail(s, "ncfsm_allreduce: %s", ncfsm_comm_last_error(s->comm));
}

static void on_busy_event(evutil_socket_t fd, short what, void *arg) { busy_next(arg); }

/* ---- life of the comm --------------------------------------------------------- */

static int alloc_buffers(avg_service *s) {
  if (ncfsm_mem_alloc(s->comm, s->n * sizeof(float), &s->dev) != NCFSM_OK) return -1;
  if (!s->o.busy_ops || !s->o.busy_bytes) return 0;
  s->busy_count = s->o.busy_bytes / sizeof(float);
  if (ncfsm_mem_alloc(s->comm, s->busy_count * sizeof(float), &s->busy_dev) != NCFSM_OK) return -1;
  void *zero = calloc(s->busy_count, sizeof(float));
  int rc = zero && ncfsm_memcpy(s->comm, s->busy_dev, zero, s->busy_count * sizeof(float), 1) == NCFSM_OK ? 0 : -1;
  free(zero);
  s->busy_left = s->o.busy_ops;
  return rc;
}

static void on_ready(avg_service *s) {
  if (s->phase != PH_INIT) return;
  if (alloc_buffers(s) != 0) { fail(s, "%s", "cannot allocate the round buffers"); return; }
  s->phase = PH_RUN;
  atomic_store(&s->ctr.ready, 1);
  if (s->busy_left) event_active(s->ev_busy, EV_TIMEOUT, 0);
  else busy_next(s); /* arms the round timer */
}

/* ncfsm's state callback (ncfsm mode): on the loop thread, which is base's. */
static void on_state(ncfsm_comm *c, ncfsm_state_t from, ncfsm_state_t to, ncfsm_event_t ev, void *arg) {
  avg_service *s = arg;
  if (to == NCFSM_STATE_READY && s->phase == PH_INIT) on_ready(s);
  else if (to == NCFSM_STATE_ERROR) fail(s, "communicator failed: %s", ncfsm_comm_failure(c));
  if (s->phase == PH_STOPPING && (to == NCFSM_STATE_FINALIZED || to == NCFSM_STATE_CLOSED ||
                                  to == NCFSM_STATE_ERROR))
    event_active(s->ev_step, EV_TIMEOUT, 0); /* destroy/abort from base's own callback */
}

static void close_comm(avg_service *s) {
  if (s->dev) ncfsm_mem_free(s->comm, s->dev);
  if (s->busy_dev) ncfsm_mem_free(s->comm, s->busy_dev);
  s->dev = s->busy_dev = NULL;
  ncfsm_comm_release(s->comm);
  s->comm = NULL;
  s->phase = PH_CLOSED;
  atomic_store(&s->ctr.done, 1);
  event_del(s->ev_grace);
  event_base_loopexit(s->base, NULL);
}

static void abort_comm(avg_service *s, const char *why) {
  fprintf(stderr, "06_service rank %d: aborting the communicator: %s\n", s->rank, why);
  s->aborted = 1;
  if (ncfsm_comm_abort(s->comm) != NCFSM_OK && ncfsm_comm_state(s->comm) != NCFSM_STATE_CLOSED)
    fprintf(stderr, "06_service rank %d: abort: %s\n", s->rank, ncfsm_comm_last_error(s->comm));
}

/* The stop, one step per call: finalize, then destroy once FINALIZED (or
 * abort after a failure or past the grace time), then release. */
static void shutdown_step(evutil_socket_t fd, short what, void *arg) {
  avg_service *s = arg;
  if (s->phase == PH_CLOSED || !s->comm) return;
  ncfsm_state_t st = ncfsm_comm_state(s->comm);
  if (st == NCFSM_STATE_CLOSED) { close_comm(s); return; }
  if (s->phase != PH_STOPPING) { /* a failed round while a stop was asked for */
    if (!s->failed) return;
    s->phase = PH_STOPPING;
  }
  if (s->failed || s->inflight) {
    if (!s->failed && st != NCFSM_STATE_CLOSING) return; /* the grace timer decides */
    if (st != NCFSM_STATE_CLOSING) abort_comm(s, s->failed ? s->failure : "stop timed out");
  } else if (st == NCFSM_STATE_READY) {
    if (ncfsm_comm_finalize(s->comm) != NCFSM_OK) abort_comm(s, ncfsm_comm_last_error(s->comm));
    else if (s->o.naive && ncfsm_comm_wait_state(s->comm, NCFSM_STATE_FINALIZED, s->o.stop_grace_ms) != NCFSM_OK)
      abort_comm(s, ncfsm_comm_last_error(s->comm));
  } else if (st == NCFSM_STATE_FINALIZED) {
    if (ncfsm_comm_destroy(s->comm) != NCFSM_OK) abort_comm(s, ncfsm_comm_last_error(s->comm));
  } else if (st != NCFSM_STATE_FINALIZING && st != NCFSM_STATE_DRAINING && st != NCFSM_STATE_CLOSING &&
             st != NCFSM_STATE_DRAIN_LAUNCH_IN_PROGRESS) {
    abort_comm(s, "stop requested before the communicator was ready");
  }
  st = ncfsm_comm_state(s->comm);
  if (st == NCFSM_STATE_CLOSED) close_comm(s);
  else if (s->o.naive) event_active(s->ev_step, EV_TIMEOUT, 0); /* nothing else drives it */
}

static void on_grace(evutil_socket_t fd, short what, void *arg) {
  avg_service *s = arg;
  if (s->phase == PH_CLOSED || !s->comm) return;
  s->failed = 1;
  if (!s->failure[0]) snprintf(s->failure, sizeof s->failure, "the stop did not finish within %u ms",
                               s->o.stop_grace_ms);
  s->phase = PH_STOPPING;
  shutdown_step(-1, 0, s);
}

void avg_request_stop(avg_service *s) {
  if (s->stop_requested) return;
  s->stop_requested = 1;
  struct timeval tv = ms_tv(s->o.stop_grace_ms);
  event_add(s->ev_grace, &tv);
  /* Nothing can carry the flag: stop here alone. */
  if (s->phase == PH_INIT || s->failed) {
    s->phase = PH_STOPPING;
    event_active(s->ev_step, EV_TIMEOUT, 0);
  }
}

/* ---- HTTP: /submit and /average ------------------------------------------------ */

static void send_json(struct evhttp_request *req, int code, const char *reason, json_t *body) {
  char *text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  struct evbuffer *b = evbuffer_new();
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
  if (text && b) evbuffer_add(b, text, strlen(text));
  free(text);
  evhttp_send_reply(req, code, reason, b);
  if (b) evbuffer_free(b);
}

static void send_error(avg_service *s, struct evhttp_request *req, int code, const char *reason,
                       const char *msg) {
  atomic_fetch_add(&s->ctr.rejects, 1);
  send_json(req, code, reason, json_pack("{s:s}", "error", msg));
}

/* The body as count floats: application/json (an array of numbers) or
 * application/octet-stream (count little-endian float32). 0, or the HTTP
 * code with a message. */
static int parse_vector(avg_service *s, struct evhttp_request *req, float *out, char *msg, size_t len) {
  const char *ct = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type");
  struct evbuffer *in = evhttp_request_get_input_buffer(req);
  size_t bytes = evbuffer_get_length(in);
  const unsigned char *body = evbuffer_pullup(in, -1);
  size_t n = s->o.count;
  if (ct && !strncasecmp(ct, "application/octet-stream", 24)) {
    if (bytes != n * sizeof(float)) {
      snprintf(msg, len, "expected %zu bytes (%zu float32), got %zu", n * sizeof(float), n, bytes);
      return 400;
    }
    memcpy(out, body, bytes);
  } else if (ct && !strncasecmp(ct, "application/json", 16)) {
    json_error_t err;
    json_t *j = json_loadb((const char *)body, bytes, 0, &err);
    if (!j || !json_is_array(j) || json_array_size(j) != n) {
      if (j) snprintf(msg, len, "expected a JSON array of %zu numbers", n);
      else snprintf(msg, len, "invalid JSON: %s (line %d)", err.text, err.line);
      json_decref(j);
      return 400;
    }
    for (size_t i = 0; i < n; i++) {
      json_t *v = json_array_get(j, i);
      if (!json_is_number(v)) {
        snprintf(msg, len, "element %zu is not a number", i);
        json_decref(j);
        return 400;
      }
      out[i] = (float)json_number_value(v);
    }
    json_decref(j);
  } else {
    snprintf(msg, len, "Content-Type %s: send application/json or application/octet-stream",
             ct ? ct : "(none)");
    return 415;
  }
  for (size_t i = 0; i < n; i++)
    if (!isfinite(out[i])) {
      snprintf(msg, len, "element %zu is not finite (as float32)", i);
      return 400;
    }
  return 0;
}

static void on_submit(struct evhttp_request *req, void *arg) {
  avg_service *s = arg;
  if (evhttp_request_get_command(req) != EVHTTP_REQ_POST) {
    evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "POST");
    send_error(s, req, 405, "Method Not Allowed", "POST a vector");
    return;
  }
  if (s->phase != PH_RUN || s->failed) {
    send_error(s, req, 503, "Service Unavailable",
               s->failed ? s->failure : s->phase == PH_INIT ? "starting: the communicator is not ready"
                                                            : "stopping");
    return;
  }
  float *v = malloc(s->o.count * sizeof *v);
  char msg[256];
  int code = v ? parse_vector(s, req, v, msg, sizeof msg) : 500;
  if (code) {
    free(v);
    send_error(s, req, code, code == 415 ? "Unsupported Media Type" : code == 400 ? "Bad Request" : "Error",
               v ? msg : "out of memory");
    return;
  }
  for (size_t i = 0; i < s->o.count; i++) s->acc[i] += v[i];
  s->acc[s->o.count] += 1.0f;
  free(v);
  atomic_fetch_add(&s->ctr.submits, 1);
  uint64_t pending = (uint64_t)s->acc[s->o.count];
  send_json(req, 202, "Accepted", json_pack("{s:I,s:I}", "pending", (json_int_t)pending, "round",
                                            (json_int_t)s->round));
  if (pending >= s->o.batch) start_round(s); /* naive: blocks right here, in the handler */
}

static void on_average(struct evhttp_request *req, void *arg) {
  avg_service *s = arg;
  enum evhttp_cmd_type m = evhttp_request_get_command(req);
  if (m != EVHTTP_REQ_GET && m != EVHTTP_REQ_HEAD) {
    evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
    send_error(s, req, 405, "Method Not Allowed", "GET the average");
    return;
  }
  json_t *avg = json_null();
  if (s->total_vectors) {
    avg = json_array();
    for (size_t i = 0; i < s->o.count; i++)
      json_array_append_new(avg, json_real(s->total[i] / (double)s->total_vectors));
  }
  send_json(req, 200, "OK",
            json_pack("{s:i,s:i,s:I,s:I,s:o,s:s?}", "rank", s->rank, "size", s->size, "round",
                      (json_int_t)s->round, "vectors", (json_int_t)s->total_vectors, "average", avg,
                      "error", s->failed ? s->failure : NULL));
}

static int app_health(void *arg, char *why, size_t len) {
  avg_service *s = arg;
  if (s->failed) { snprintf(why, len, "service: %s", s->failure); return 1; }
  if (s->phase == PH_INIT) { snprintf(why, len, "service: starting (communicator %s)",
                                      ncfsm_state_name(ncfsm_comm_state(s->comm))); return 1; }
  if (s->phase != PH_RUN) { snprintf(why, len, "service: stopping"); return 1; }
  return 0;
}

static int app_status(void *arg, json_t *status) {
  avg_service *s = arg;
  static const char *ph[] = {"init", "run", "stopping", "closed"};
  return json_object_set_new(status, "service",
                             json_pack("{s:s,s:s,s:i,s:i,s:I,s:I,s:I,s:b,s:I,s:b}", "name", "06_service",
                                       "phase", ph[s->phase], "rank", s->rank, "size", s->size,
                                       "count", (json_int_t)s->o.count, "round", (json_int_t)s->round,
                                       "pending", (json_int_t)s->acc[s->o.count], "round_in_flight",
                                       s->inflight, "vectors", (json_int_t)s->total_vectors, "naive",
                                       s->o.naive));
}

/* ---- start / finish ---------------------------------------------------------------- */

/* "%r" in the path stands for the rank (one file per rank under mpirun). */
static int write_port_file(const char *tmpl, int rank, int port) {
  char path[4096], tmp[4200];
  const char *r = strstr(tmpl, "%r");
  if (r) snprintf(path, sizeof path, "%.*s%d%s", (int)(r - tmpl), tmpl, rank, r + 2);
  else snprintf(path, sizeof path, "%s", tmpl);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return -1;
  fprintf(f, "%d\n", port);
  if (fclose(f) != 0) return -1;
  return rename(tmp, path);
}

int avg_start(struct event_base *base, const avg_opts *o, avg_service **out) {
  avg_service *s = calloc(1, sizeof *s);
  if (!s) return -1;
  *out = s;
  s->o = *o;
  s->base = base;
  s->n = o->count + 2;
  s->acc = calloc(o->count + 1, sizeof *s->acc);
  s->stage = calloc(s->n, sizeof *s->stage);
  s->total = calloc(o->count, sizeof *s->total);
  s->ev_round = evtimer_new(base, on_round_timer, s);
  s->ev_busy = evtimer_new(base, on_busy_event, s);
  s->ev_grace = evtimer_new(base, on_grace, s);
  s->ev_step = event_new(base, -1, 0, shutdown_step, s);
  if (!o->count || !s->acc || !s->stage || !s->total || !s->ev_round || !s->ev_busy || !s->ev_grace ||
      !s->ev_step) {
    fprintf(stderr, "06_service: bad --count or out of memory\n");
    return -1;
  }
  ncfsm_result_t r = o->naive ? ncfsm_loop_new(NULL, &s->loop) : ncfsm_loop_new_embedded(base, NULL, &s->loop);
  if (r != NCFSM_OK) { fprintf(stderr, "06_service: ncfsm loop: %s\n", ncfsm_err_name(r)); return -1; }
  /* One rank per process (PMIx under mpirun or srun --mpi=pmix, the TCP store
   * with NCFSM_STORE_ADDR) or alone: the bootstrap's settings decide
   * (NCFSM_BOOTSTRAP, docs/settings.md; examples/launch.h). The bootstrap lives
   * on the ncfsm loop's base (the application's, unless naive). */
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  int launched = ex_launch(ncfsm_loop_base(s->loop), &bo, &s->boot, "06_service");
  if (launched < 0) return -1;
  ncfsm_comm_opts co;
  if (ncfsm_comm_opts_init(&co) != NCFSM_OK) {
    fprintf(stderr, "06_service: %s\n", ncfsm_opts_error());
    return -1;
  }
  co.backend = o->backend;
  co.name = "avg";
  co.timeout_ms = o->timeout_ms;
  co.on_error = o->on_error;
  if (!o->naive) {
    co.on_state = on_state;
    co.on_state_arg = s;
  }
  ncfsm_sim_opts so;
  if (ncfsm_sim_opts_init(&so) != NCFSM_OK) {
    fprintf(stderr, "06_service: %s\n", ncfsm_opts_error());
    return -1;
  }
  so.async_error_at_op = o->sim_async_error_at;
  co.sim = &so;
  if (launched) {
    s->rank = ncfsm_boot_rank(s->boot);
    s->size = ncfsm_boot_size(s->boot);
    co.device = ncfsm_boot_local_rank(s->boot);
  } else {
    s->size = 1;
  }
  if (ncfsm_comm_new(s->loop, &co, &s->comm) != NCFSM_OK) {
    fprintf(stderr, "06_service: ncfsm_comm_new: %s\n", ncfsm_loop_last_error(s->loop));
    return -1;
  }
  ncfsm_unique_id id;
  r = launched ? ncfsm_comm_init_boot(s->comm, s->boot)
               : (ncfsm_get_unique_id(o->backend, &id) == NCFSM_OK ? ncfsm_comm_init(s->comm, 1, 0, &id)
                                                                    : NCFSM_ERR_BACKEND);
  if (r != NCFSM_OK) {
    fprintf(stderr, "06_service: init: %s\n", ncfsm_comm_last_error(s->comm));
    return -1;
  }
  ncfsm_http_opts ho;
  ncfsm_http_opts_init(&ho);
  ho.address = o->address;
  ho.port = o->port;
  ho.max_body = o->max_body ? o->max_body : 32 * o->count + 1024;
  ho.health = app_health;
  ho.health_arg = s;
  ho.status = app_status;
  ho.status_arg = s;
  if (ncfsm_http_start(base, s->loop, &ho, &s->http) != NCFSM_OK) {
    fprintf(stderr, "06_service: %s\n", ncfsm_http_start_error());
    return -1;
  }
  evhttp_set_cb(ncfsm_http_evhttp(s->http), "/submit", on_submit, s);
  evhttp_set_cb(ncfsm_http_evhttp(s->http), "/average", on_average, s);
  if (o->port_file && write_port_file(o->port_file, s->rank, ncfsm_http_port(s->http)) != 0) {
    fprintf(stderr, "06_service: cannot write %s: %s\n", o->port_file, strerror(errno));
    return -1;
  }
  if (o->naive) { /* blocking init, before the base runs */
    if (ncfsm_comm_wait_state(s->comm, NCFSM_STATE_READY, o->timeout_ms) != NCFSM_OK) {
      fail(s, "init: %s", ncfsm_comm_last_error(s->comm));
      return 0; /* serves /status and /healthz (503) until stopped */
    }
    on_ready(s);
  }
  return 0;
}

int avg_finish(avg_service *s) {
  if (!s) return 1;
  int rc = s->failed || s->aborted ? 3 : 0;
  if (s->http) ncfsm_http_stop(s->http);
  if (s->comm) { /* the base stopped before the comm closed */
    if (ncfsm_comm_state(s->comm) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(s->comm);
    if (s->dev) ncfsm_mem_free(s->comm, s->dev);
    if (s->busy_dev) ncfsm_mem_free(s->comm, s->busy_dev);
    ncfsm_comm_release(s->comm);
    rc = 3;
  }
  if (s->boot) ncfsm_boot_close(s->boot);
  if (s->loop && ncfsm_loop_close(s->loop) != NCFSM_OK) {
    fprintf(stderr, "06_service: ncfsm_loop_close: %s\n", ncfsm_loop_last_error(s->loop));
    rc = rc ? rc : 1;
  }
  if (s->ev_round) event_free(s->ev_round);
  if (s->ev_busy) event_free(s->ev_busy);
  if (s->ev_grace) event_free(s->ev_grace);
  if (s->ev_step) event_free(s->ev_step);
  free(s->acc);
  free(s->stage);
  free(s->total);
  free(s);
  return rc;
}

avg_counters *avg_get_counters(avg_service *s) { return &s->ctr; }
int avg_port(const avg_service *s) { return s->http ? ncfsm_http_port(s->http) : -1; }
int avg_rank(const avg_service *s) { return s->rank; }
int avg_size(const avg_service *s) { return s->size; }
ncfsm_loop *avg_loop(avg_service *s) { return s->loop; }
