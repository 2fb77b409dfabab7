/*
 * service_latency (issue 16): examples/06_service measured from inside each
 * rank. The service runs on the main thread's event_base exactly as the
 * example does; a client thread talks HTTP to it over loopback (one
 * keep-alive connection, blocking sockets) and measures:
 *
 *   busy:       /healthz latency (p50, p99, max) while --busy-ops AllReduces
 *               of --busy-bytes run back to back on the service's comm
 *   rounds:     /healthz latency afterwards, while the service only runs its
 *               averaging rounds (every --interval-ms)
 *   throughput: POST /submit of --count float32 vectors as fast as one
 *               client can for --throughput-s: accepted vectors per second,
 *               and vectors averaged (reduced across ranks) per second
 *   scrape:     ncfsm_loop_status_text and ncfsm_loop_metrics called
 *               directly (mean us per call; the loop's lock is held only to
 *               copy) and GET /status, /metrics over HTTP
 *   idle:       the process's CPU time over --idle-s with no clients (the
 *               rounds' timer still runs), in % of one core
 *
 * --mode ncfsm (default): the service's ncfsm loop is embedded in its base
 * and collectives complete through callbacks; --mode naive: each collective
 * is waited for inside the event callback that starts it (blocking
 * collectives in the request handler). One rank per process: under mpirun,
 * with the TCP store's environment, or alone. Prints "KV key value" lines
 * (rank 0) for docs/benchmarks.md; the numbers are not checked here.
 */
#define _GNU_SOURCE /* strcasestr */
#include <arpa/inet.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "avg_service.h"
#include "ncfsm/introspect.h"

typedef struct bench {
  avg_service *svc;
  struct event_base *base;
  struct event *ev_stop;
  int port, rank;
  const char *mode;
  double throughput_s, idle_s, rounds_s;
  unsigned busy_ops;
  size_t count;
  int rc;
  char report[8192];
  size_t rlen;
} bench;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double cpu_s(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 + (double)u.ru_stime.tv_sec +
         (double)u.ru_stime.tv_usec / 1e6;
}

static void kv(bench *b, const char *key, double v) {
  if (b->rlen < sizeof b->report)
    b->rlen += (size_t)snprintf(b->report + b->rlen, sizeof b->report - b->rlen, "KV svc.%s.%s %.3f\n", b->mode,
                                key, v);
}

/* ---- a blocking HTTP/1.1 keep-alive client ------------------------------------ */

static int hc_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

/* Send req (head + body) and read one answer; its status, or -1. */
static int hc_do(int fd, const char *req, size_t len) {
  for (size_t off = 0; off < len;) {
    ssize_t k = send(fd, req + off, len - off, MSG_NOSIGNAL);
    if (k <= 0) return -1;
    off += (size_t)k;
  }
  char buf[65536];
  size_t got = 0;
  char *end = NULL;
  while (!end) {
    ssize_t k = recv(fd, buf + got, sizeof buf - 1 - got, 0);
    if (k <= 0) return -1;
    got += (size_t)k;
    buf[got] = '\0';
    end = strstr(buf, "\r\n\r\n");
    if (!end && got >= sizeof buf - 1) return -1;
  }
  int code = atoi(buf + 9);
  const char *cl = strcasestr(buf, "\r\nContent-Length:");
  size_t body = cl ? strtoul(cl + 17, NULL, 10) : 0, have = got - (size_t)(end + 4 - buf);
  while (have < body) { /* drain the body */
    ssize_t k = recv(fd, buf, sizeof buf, 0);
    if (k <= 0) return -1;
    have += (size_t)k;
  }
  return code;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* /healthz latencies until stop() says so (at least min_s, at most max_s). */
static void probe(bench *b, int fd, const char *phase, int (*stop)(bench *), double min_s, double max_s) {
  static const char req[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  size_t cap = 1u << 20, n = 0, bad = 0;
  double *lat = malloc(cap * sizeof *lat), t0 = now_s();
  while (n < cap) {
    double t = now_s();
    if (t - t0 >= max_s || (t - t0 >= min_s && stop(b))) break;
    int code = hc_do(fd, req, sizeof req - 1);
    double dt = now_s() - t;
    if (code != 200) bad++;
    else lat[n++] = dt * 1e6;
    usleep(200); /* a probe every ~0.2 ms plus its latency */
  }
  qsort(lat, n, sizeof *lat, cmp_d);
  char k[64];
  snprintf(k, sizeof k, "%s.healthz_n", phase);
  kv(b, k, (double)n);
  snprintf(k, sizeof k, "%s.healthz_not_200", phase);
  kv(b, k, (double)bad);
  if (n) {
    snprintf(k, sizeof k, "%s.healthz_p50_us", phase);
    kv(b, k, lat[n / 2]);
    snprintf(k, sizeof k, "%s.healthz_p99_us", phase);
    kv(b, k, lat[(size_t)((double)n * 0.99)]);
    snprintf(k, sizeof k, "%s.healthz_max_us", phase);
    kv(b, k, lat[n - 1]);
  }
  free(lat);
}

static int busy_finished(bench *b) {
  avg_counters *c = avg_get_counters(b->svc);
  return atomic_load(&c->busy_done) >= b->busy_ops || atomic_load(&c->failed);
}
static int never(bench *b) { return 0; }

static void *client(void *arg) {
  bench *b = arg;
  avg_counters *c = avg_get_counters(b->svc);
  double t_end = now_s() + 120;
  while (!atomic_load(&c->ready) && !atomic_load(&c->failed) && now_s() < t_end) usleep(1000);
  int fd = hc_connect(b->port);
  if (fd < 0 || !atomic_load(&c->ready)) {
    fprintf(stderr, "service_latency rank %d: the service never became ready\n", b->rank);
    b->rc = 1;
    goto stop;
  }
  /* busy: while the AllReduces run back to back */
  double t0 = now_s();
  probe(b, fd, "busy", busy_finished, 0, 600);
  double busy_s = now_s() - t0;
  kv(b, "busy.ops", (double)atomic_load(&c->busy_done));
  kv(b, "busy.seconds", busy_s);
  /* rounds only */
  probe(b, fd, "rounds", never, b->rounds_s, b->rounds_s);
  /* throughput of the averaging path */
  size_t body = b->count * sizeof(float);
  char *req = malloc(256 + body);
  int h = snprintf(req, 256, "POST /submit HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
                             "Content-Length: %zu\r\n\r\n", body);
  for (size_t i = 0; i < b->count; i++) ((float *)(req + h))[i] = (float)(i % 7);
  uint64_t v0 = atomic_load(&c->vectors_averaged), r0 = atomic_load(&c->rounds);
  t0 = now_s();
  size_t ok = 0, bad = 0;
  while (now_s() - t0 < b->throughput_s) {
    if (hc_do(fd, req, (size_t)h + body) == 202) ok++;
    else bad++;
  }
  double dt = now_s() - t0;
  free(req);
  kv(b, "throughput.submits_per_s", (double)ok / dt);
  kv(b, "throughput.submits_refused", (double)bad);
  kv(b, "throughput.vectors_averaged_per_s", (double)(atomic_load(&c->vectors_averaged) - v0) / dt);
  kv(b, "throughput.rounds_per_s", (double)(atomic_load(&c->rounds) - r0) / dt);
  /* the cost of a scrape */
  ncfsm_loop *loop = avg_loop(b->svc);
  const int reps = 200;
  t0 = now_s();
  for (int i = 0; i < reps; i++) {
    char *t = NULL;
    ncfsm_loop_metrics(loop, &t, NULL);
    free(t);
  }
  kv(b, "scrape.metrics_call_us", (now_s() - t0) / reps * 1e6);
  t0 = now_s();
  for (int i = 0; i < reps; i++) {
    char *t = NULL;
    ncfsm_loop_status_text(loop, NULL, &t, NULL);
    free(t);
  }
  kv(b, "scrape.status_call_us", (now_s() - t0) / reps * 1e6);
  static const char gm[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  static const char gs[] = "GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  t0 = now_s();
  for (int i = 0; i < reps; i++) hc_do(fd, gm, sizeof gm - 1);
  kv(b, "scrape.metrics_http_us", (now_s() - t0) / reps * 1e6);
  t0 = now_s();
  for (int i = 0; i < reps; i++) hc_do(fd, gs, sizeof gs - 1);
  kv(b, "scrape.status_http_us", (now_s() - t0) / reps * 1e6);
  /* idle: no client; only the rounds' timer */
  double c0 = cpu_s();
  t0 = now_s();
  usleep((useconds_t)(b->idle_s * 1e6));
  kv(b, "idle.cpu_pct", (cpu_s() - c0) / (now_s() - t0) * 100);
  close(fd);
stop:
  event_active(b->ev_stop, EV_TIMEOUT, 0); /* the base is thread-safe (evthread_use_pthreads) */
  return NULL;
}

static void on_stop(evutil_socket_t fd, short what, void *arg) { avg_request_stop(((bench *)arg)->svc); }

int main(int argc, char **argv) {
  avg_opts o;
  avg_opts_init(&o);
  o.busy_bytes = 256u << 20;
  o.busy_ops = 2000;
  o.interval_ms = 10;
  o.stop_grace_ms = 20000;
  o.timeout_ms = 120000;
  bench b = {.mode = "ncfsm", .throughput_s = 2, .idle_s = 2, .rounds_s = 1};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(a, "--mode") && (!strcmp(v, "ncfsm") || !strcmp(v, "naive"))) b.mode = v;
    else if (!strcmp(a, "--busy-bytes")) o.busy_bytes = strtoul(v, NULL, 10);
    else if (!strcmp(a, "--busy-ops")) o.busy_ops = (unsigned)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--count")) o.count = strtoul(v, NULL, 10);
    else if (!strcmp(a, "--batch")) o.batch = (unsigned)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--interval-ms")) o.interval_ms = (unsigned)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--throughput-s")) b.throughput_s = atof(v);
    else if (!strcmp(a, "--rounds-s")) b.rounds_s = atof(v);
    else if (!strcmp(a, "--idle-s")) b.idle_s = atof(v);
    else {
      fprintf(stderr, "usage: service_latency [--mode ncfsm|naive] [--busy-bytes B] [--busy-ops K] [--count N]\n"
                      "       [--batch B] [--interval-ms T] [--throughput-s S] [--rounds-s S] [--idle-s S]\n");
      return 1;
    }
    i++;
  }
  o.naive = !strcmp(b.mode, "naive");
  b.busy_ops = o.busy_ops;
  b.count = o.count;
  if (evthread_use_pthreads() != 0) return 1;
  struct event_config *cfg = event_config_new();
  event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
  b.base = event_base_new_with_config(cfg);
  event_config_free(cfg);
  if (!b.base || avg_start(b.base, &o, &b.svc) != 0) {
    avg_finish(b.svc);
    if (b.base) event_base_free(b.base);
    return 1;
  }
  b.port = avg_port(b.svc);
  b.rank = avg_rank(b.svc);
  b.ev_stop = event_new(b.base, -1, 0, on_stop, &b);
  pthread_t th;
  if (pthread_create(&th, NULL, client, &b) != 0) return 1;
  double c0 = cpu_s(), t0 = now_s();
  event_base_dispatch(b.base);
  double wall = now_s() - t0, cpu = cpu_s() - c0;
  pthread_join(th, NULL);
  int size = avg_size(b.svc);
  int rc = avg_finish(b.svc);
  event_free(b.ev_stop);
  event_base_free(b.base);
  if (b.rank == 0) {
    char be[16] = "?";
    ncfsm_backend_info bi;
    if (ncfsm_backend_query(o.backend, &bi) == NCFSM_OK) snprintf(be, sizeof be, "%s", bi.name);
    printf("service_latency: mode %s, %d rank(s), backend %s, busy %u x %zu-byte AllReduce, vectors of %zu "
           "float32, batch %u, round every %u ms\n",
           b.mode, size, be, o.busy_ops, o.busy_bytes, o.count, o.batch, o.interval_ms);
    fputs(b.report, stdout);
    printf("KV svc.%s.process_cpu_pct %.3f\n", b.mode, cpu / wall * 100);
  }
  return b.rc ? b.rc : rc;
}
