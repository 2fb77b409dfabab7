/*
 * service_test: examples/06_service end to end, with real HTTP requests
 * (libevent's client). Ranks are processes on the multi-process sim, launched
 * through the TCP store (ncfsm-store on a free port), or with --mpirun on
 * GPUs. Checks: the averages across ranks, the 4xx answers (and that the
 * service goes on after them), the /status schema, /metrics (promtool check
 * metrics with --promtool), a scrape while a comm is in ERROR, the naive
 * variant, and the exit status of a stop.
 *
 *   service_test --service PATH [--store PATH] [--promtool PATH]
 *                [--mpirun PATH --require-gpu]
 */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ncfsm.h"

static const char *g_service, *g_store, *g_promtool, *g_mpirun;
static char g_dir[256];

#define MAXR 4

typedef struct job {
  int n;           /* ranks */
  pid_t pid[MAXR]; /* one per rank, or [0] = mpirun */
  int nproc;
  pid_t store;
  int port[MAXR];
  char tag[32];
} job;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* ---- processes --------------------------------------------------------------- */

static void redirect(const char *tag, const char *what) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s.%s", g_dir, tag, what);
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    dup2(fd, !strcmp(what, "out") ? 1 : 2);
    close(fd);
  }
}

/* ncfsm-store on a free port; returns its port. */
static int start_store(job *j) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  j->store = fork();
  assert_true(j->store >= 0);
  if (j->store == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    redirect(j->tag, "store.err");
    execl(g_store, g_store, "--listen", "127.0.0.1:0", "--token", "svc-test-6b2e", "--print-port", (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  char buf[64] = "";
  size_t got = 0;
  while (got < sizeof buf - 1) {
    ssize_t k = read(fds[0], buf + got, sizeof buf - 1 - got);
    if (k <= 0) break;
    got += (size_t)k;
    if (memchr(buf, '\n', got)) break;
  }
  close(fds[0]);
  buf[got] = '\0';
  int port = atoi(buf);
  assert_true(port > 0);
  return port;
}

/* rank_args[r]: extra arguments of rank r (NULL-terminated), may be NULL. */
static void start_ranks(job *j, int n, const char *const *common, const char *const *const *rank_args) {
  j->n = n;
  char portfile[300];
  snprintf(portfile, sizeof portfile, "%s/%s.port.%%r", g_dir, j->tag);
  for (int r = 0; r < n; r++) {
    char pf[320];
    snprintf(pf, sizeof pf, "%s/%s.port.%d", g_dir, j->tag, r);
    unlink(pf);
  }
  char store_addr[64] = "";
  if (!g_mpirun && n > 1) snprintf(store_addr, sizeof store_addr, "127.0.0.1:%d", start_store(j));
  int nproc = g_mpirun ? 1 : n;
  for (int p = 0; p < nproc; p++) {
    const char *argv[64];
    int k = 0;
    if (g_mpirun) {
      static char np[16];
      snprintf(np, sizeof np, "%d", n);
      const char *mpi[] = {g_mpirun, "--oversubscribe", "-np", np, "-x", "NCFSM_BACKEND", "-x",
                           "NCCL_NVLS_ENABLE", "-x", "LD_LIBRARY_PATH", NULL};
      for (int i = 0; mpi[i]; i++) argv[k++] = mpi[i];
    }
    argv[k++] = g_service;
    argv[k++] = "--port-file";
    argv[k++] = portfile;
    for (int i = 0; common && common[i]; i++) argv[k++] = common[i];
    for (int i = 0; rank_args && rank_args[p] && rank_args[p][i]; i++) argv[k++] = rank_args[p][i];
    argv[k] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      char t[48], rs[16], ns[16];
      snprintf(t, sizeof t, "%s.%d", j->tag, p);
      redirect(t, "out");
      redirect(t, "err");
      if (!g_mpirun && n > 1) {
        snprintf(rs, sizeof rs, "%d", p);
        snprintf(ns, sizeof ns, "%d", n);
        setenv("NCFSM_STORE_ADDR", store_addr, 1);
        setenv("NCFSM_STORE_TOKEN", "svc-test-6b2e", 1);
        setenv("NCFSM_RANK", rs, 1);
        setenv("NCFSM_WORLD_SIZE", ns, 1);
        setenv("NCFSM_STORE_HOST", "0", 1);
      } else if (!g_mpirun) {
        unsetenv("NCFSM_STORE_ADDR");
      }
      execv(argv[0], (char *const *)argv);
      _exit(127);
    }
    j->pid[p] = pid;
  }
  j->nproc = nproc;
  /* every rank writes its bound port once listening */
  double end = now_s() + 60;
  for (int r = 0; r < n; r++) {
    char pf[320];
    snprintf(pf, sizeof pf, "%s/%s.port.%d", g_dir, j->tag, r);
    FILE *f = NULL;
    while (!(f = fopen(pf, "r")) && now_s() < end) usleep(20000);
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%d", &j->port[r]), 1);
    fclose(f);
    assert_true(j->port[r] > 0);
  }
}

static void dump_logs(const job *j) {
  for (int p = 0; p < j->nproc; p++)
    for (int e = 0; e < 2; e++) {
      char path[512], line[512];
      snprintf(path, sizeof path, "%s/%s.%d.%s", g_dir, j->tag, p, e ? "err" : "out");
      FILE *f = fopen(path, "r");
      if (!f) continue;
      fprintf(stderr, "---- %s\n", path);
      while (fgets(line, sizeof line, f)) fputs(line, stderr);
      fclose(f);
    }
}

/* Exit status of pid within timeout_s (-1: killed after the timeout). */
static int wait_exit(pid_t pid, double timeout_s) {
  double end = now_s() + timeout_s;
  int st;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (now_s() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    usleep(10000);
  }
}

static void stop_store(job *j) {
  if (j->store > 0) {
    kill(j->store, SIGTERM);
    wait_exit(j->store, 10);
    j->store = 0;
  }
}

/* ---- HTTP client ------------------------------------------------------------- */

typedef struct resp {
  int code;
  char *body;
  size_t len;
  struct event_base *base;
} resp;

/* The connection is kept alive after the answer: leave the loop here. */
static void on_resp(struct evhttp_request *req, void *arg) {
  resp *r = arg;
  event_base_loopexit(r->base, NULL);
  if (!req) { r->code = -1; return; }
  r->code = evhttp_request_get_response_code(req);
  struct evbuffer *b = evhttp_request_get_input_buffer(req);
  r->len = evbuffer_get_length(b);
  r->body = malloc(r->len + 1);
  evbuffer_remove(b, r->body, r->len);
  r->body[r->len] = '\0';
}

static resp http(int port, enum evhttp_cmd_type m, const char *path, const char *ctype, const void *body,
                 size_t len) {
  resp r = {0};
  struct event_base *b = event_base_new();
  r.base = b;
  struct evhttp_connection *c = evhttp_connection_base_new(b, NULL, "127.0.0.1", (unsigned short)port);
  evhttp_connection_set_timeout(c, 20);
  struct evhttp_request *req = evhttp_request_new(on_resp, &r);
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Host", "127.0.0.1");
  if (ctype) evhttp_add_header(h, "Content-Type", ctype);
  if (body) evbuffer_add(evhttp_request_get_output_buffer(req), body, len);
  r.code = -2;
  if (evhttp_make_request(c, req, m, path) == 0) event_base_dispatch(b);
  evhttp_connection_free(c);
  event_base_free(b);
  if (!r.body) r.body = calloc(1, 1);
  r.base = NULL;
  return r;
}

static resp get(int port, const char *path) { return http(port, EVHTTP_REQ_GET, path, NULL, NULL, 0); }

static json_t *get_json(int port, const char *path) {
  resp r = get(port, path);
  json_error_t e;
  json_t *j = r.code == 200 ? json_loads(r.body, 0, &e) : NULL;
  if (!j) fprintf(stderr, "GET %s on %d: %d %s\n", path, port, r.code, r.body);
  free(r.body);
  return j;
}

static void wait_health(int port, int want, double timeout_s) {
  double end = now_s() + timeout_s;
  resp r = {0};
  for (;;) {
    r = get(port, "/healthz");
    if (r.code == want || now_s() > end) break;
    free(r.body);
    usleep(20000);
  }
  if (r.code != want) fprintf(stderr, "healthz on %d: %d %s\n", port, r.code, r.body);
  assert_int_equal(r.code, want);
  free(r.body);
}

static int post_json(int port, const char *text) {
  resp r = http(port, EVHTTP_REQ_POST, "/submit", "application/json", text, strlen(text));
  free(r.body);
  return r.code;
}

/* ---- the /status schema (docs/service.md) ---------------------------------------- */

#define REQ(cond, ...)                                  \
  do {                                                  \
    if (!(cond)) {                                      \
      snprintf(why, sizeof why, __VA_ARGS__);           \
      return why;                                       \
    }                                                   \
  } while (0)

static int is_int_or_null(json_t *v) { return json_is_integer(v) || json_is_null(v); }
static int is_str_or_null(json_t *v) { return json_is_string(v) || json_is_null(v); }

static const char *check_fp(json_t *o, char *why, size_t len) {
  (void)len;
  if (!json_is_string(json_object_get(o, "op"))) return "op";
  if (!is_int_or_null(json_object_get(o, "seq"))) return "seq";
  if (!json_is_integer(json_object_get(o, "count"))) return "count";
  if (!json_is_string(json_object_get(o, "dtype"))) return "dtype";
  if (!is_int_or_null(json_object_get(o, "root"))) return "root";
  if (!is_str_or_null(json_object_get(o, "redop"))) return "redop";
  if (!is_int_or_null(json_object_get(o, "peer"))) return "peer";
  (void)why;
  return NULL;
}

static int one_of(const char *s, const char *const *names) {
  for (int i = 0; names[i]; i++)
    if (!strcmp(s, names[i])) return 1;
  return 0;
}

/* NULL when j follows schema ncfsm.status/1, else what does not. */
static const char *check_status_schema(json_t *j) {
  static char why[256];
  static const char *states[NCFSM_STATE_COUNT + 1], *wstates[NCFSM_WORK_STATE_COUNT + 1];
  for (int i = 0; i < NCFSM_STATE_COUNT; i++) states[i] = ncfsm_state_name((ncfsm_state_t)i);
  for (int i = 0; i < NCFSM_WORK_STATE_COUNT; i++) wstates[i] = ncfsm_work_state_name((ncfsm_work_state_t)i);
  REQ(json_is_object(j), "not an object");
  REQ(json_is_string(json_object_get(j, "schema")) &&
          !strcmp(json_string_value(json_object_get(j, "schema")), "ncfsm.status/1"),
      "schema");
  REQ(json_is_string(json_object_get(j, "ncfsm_version")), "ncfsm_version");
  REQ(json_is_integer(json_object_get(j, "pid")), "pid");
  REQ(json_is_real(json_object_get(j, "unix_time")), "unix_time");
  REQ(json_is_integer(json_object_get(j, "monotonic_ns")), "monotonic_ns");
  json_t *l = json_object_get(j, "loop");
  REQ(json_is_object(l), "loop");
  const char *li[] = {"comms", "failed_comms", "group_depth", "queued_batches", "transitions",
                      "rejected_calls", NULL};
  for (int i = 0; li[i]; i++) REQ(json_is_integer(json_object_get(l, li[i])), "loop.%s", li[i]);
  json_t *wf = json_object_get(l, "works_finished");
  REQ(json_is_object(wf) && json_object_size(wf) == 4, "loop.works_finished");
  const char *fin[] = {"COMPLETED", "FAILED", "TIMED_OUT", "ABORTED", NULL};
  for (int i = 0; fin[i]; i++) REQ(json_is_integer(json_object_get(wf, fin[i])), "works_finished.%s", fin[i]);
  json_t *cs = json_object_get(j, "comms");
  REQ(json_is_array(cs) && (json_int_t)json_array_size(cs) == json_integer_value(json_object_get(l, "comms")),
      "comms");
  size_t i;
  json_t *c;
  json_array_foreach(cs, i, c) {
    const char *ss[] = {"name", "backend", "state", "hash", "last_error", "failure", "cause", NULL};
    for (int k = 0; ss[k]; k++) REQ(json_is_string(json_object_get(c, ss[k])), "comms[%zu].%s", i, ss[k]);
    REQ(one_of(json_string_value(json_object_get(c, "state")), states), "comms[%zu].state", i);
    REQ(strlen(json_string_value(json_object_get(c, "hash"))) == 16, "comms[%zu].hash", i);
    const char *in[] = {"rank", "size", "comm_id", NULL};
    for (int k = 0; in[k]; k++)
      REQ(json_is_integer(json_object_get(c, in[k])) || json_is_null(json_object_get(c, in[k])) ||
              (k == 2 && json_is_string(json_object_get(c, in[k]))),
          "comms[%zu].%s", i, in[k]);
    REQ(is_str_or_null(json_object_get(c, "nccl_version")), "comms[%zu].nccl_version", i);
    REQ(is_str_or_null(json_object_get(c, "backend_error")), "comms[%zu].backend_error", i);
    const char *ii[] = {"device", "seq", "timeout_ms", NULL};
    for (int k = 0; ii[k]; k++) REQ(json_is_integer(json_object_get(c, ii[k])), "comms[%zu].%s", i, ii[k]);
    const char *rr[] = {"state_ms", "age_ms", NULL};
    for (int k = 0; rr[k]; k++) REQ(json_is_real(json_object_get(c, rr[k])), "comms[%zu].%s", i, rr[k]);
    const char *bb[] = {"blocking", "released", "failed", NULL};
    for (int k = 0; bb[k]; k++) REQ(json_is_boolean(json_object_get(c, bb[k])), "comms[%zu].%s", i, bb[k]);
    json_t *w = json_object_get(c, "works");
    REQ(json_is_object(w) && json_object_size(w) == 4 && json_is_integer(json_object_get(w, "QUEUED")) &&
            json_is_integer(json_object_get(w, "VERIFYING")) && json_is_integer(json_object_get(w, "LAUNCHING")) &&
            json_is_integer(json_object_get(w, "IN_FLIGHT")),
        "comms[%zu].works", i);
    json_t *cf = json_object_get(c, "finished");
    REQ(json_is_object(cf) && json_object_size(cf) == 4, "comms[%zu].finished", i);
    for (int k = 0; fin[k]; k++) REQ(json_is_integer(json_object_get(cf, fin[k])), "comms[%zu].finished.%s", i, fin[k]);
    json_t *ow = json_object_get(c, "oldest_work");
    if (!json_is_null(ow)) {
      REQ(json_is_object(ow), "comms[%zu].oldest_work", i);
      const char *bad = check_fp(ow, why, sizeof why);
      REQ(!bad, "comms[%zu].oldest_work.%s", i, bad);
      REQ(json_is_string(json_object_get(ow, "state")) &&
              one_of(json_string_value(json_object_get(ow, "state")), wstates),
          "oldest_work.state");
      REQ(json_is_real(json_object_get(ow, "age_ms")), "oldest_work.age_ms");
      REQ(json_is_real(json_object_get(ow, "in_flight_ms")) || json_is_null(json_object_get(ow, "in_flight_ms")),
          "oldest_work.in_flight_ms");
    }
    json_t *rec = json_object_get(c, "recorder");
    REQ(json_is_object(rec) && json_is_integer(json_object_get(rec, "capacity")) &&
            json_is_integer(json_object_get(rec, "total")) && json_is_array(json_object_get(rec, "tail")),
        "comms[%zu].recorder", i);
    size_t k;
    json_t *e;
    json_array_foreach(json_object_get(rec, "tail"), k, e) {
      const char *bad = check_fp(e, why, sizeof why);
      REQ(!bad, "recorder.tail[%zu].%s", k, bad);
      REQ(json_is_integer(json_object_get(e, "id")), "tail.id");
      REQ(is_int_or_null(json_object_get(e, "group")), "tail.group");
      REQ(json_is_string(json_object_get(e, "state")) && one_of(json_string_value(json_object_get(e, "state")), wstates),
          "tail.state");
      REQ(json_is_string(json_object_get(e, "result")), "tail.result");
      REQ(json_is_real(json_object_get(e, "age_ms")), "tail.age_ms");
      const char *tt[] = {"launch_ms", "final_ms", "complete_ms", NULL};
      for (int q = 0; tt[q]; q++)
        REQ(json_is_real(json_object_get(e, tt[q])) || json_is_null(json_object_get(e, tt[q])), "tail.%s", tt[q]);
    }
  }
  return NULL;
}

/* The comm of a service's /status (it has one). */
static json_t *status_comm(json_t *st) { return json_array_get(json_object_get(st, "comms"), 0); }

/* ---- metrics ----------------------------------------------------------------- */

static void check_promtool(const char *text) {
  if (!g_promtool) {
    printf("promtool not given: /metrics not checked by promtool\n");
    return;
  }
  char path[300], cmd[700];
  snprintf(path, sizeof path, "%s/metrics.txt", g_dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "'%s' check metrics < '%s' 2>&1", g_promtool, path);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char out[4096] = "";
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  if (st != 0 || n) fprintf(stderr, "promtool check metrics (exit %d):\n%s\n", st, out);
  assert_int_equal(st, 0);
  assert_int_equal(n, 0); /* no lint warnings either */
}

static char *get_metrics(int port) {
  resp r = get(port, "/metrics");
  assert_int_equal(r.code, 200);
  return r.body;
}

static void assert_has(const char *text, const char *needle) {
  if (!strstr(text, needle)) fprintf(stderr, "missing in output: %s\n", needle);
  assert_non_null(strstr(text, needle));
}

/* ---- scenarios ----------------------------------------------------------------- */

static int g_gpu_only;

/* Poll /average on port until it reports `vectors`; returns its JSON. */
static json_t *wait_vectors(int port, long long vectors, double timeout_s) {
  double end = now_s() + timeout_s;
  for (;;) {
    json_t *a = get_json(port, "/average");
    assert_non_null(a);
    if (json_integer_value(json_object_get(a, "vectors")) >= vectors || now_s() > end) return a;
    json_decref(a);
    usleep(20000);
  }
}

static void assert_average(json_t *a, const double *want, size_t n) {
  json_t *v = json_object_get(a, "average");
  assert_true(json_is_array(v));
  assert_int_equal(json_array_size(v), n);
  for (size_t i = 0; i < n; i++) {
    double got = json_real_value(json_array_get(v, i));
    if (fabs(got - want[i]) > 1e-9) fprintf(stderr, "average[%zu] = %g, expected %g\n", i, got, want[i]);
    assert_true(fabs(got - want[i]) <= 1e-9);
  }
}

static void expect_code(int port, enum evhttp_cmd_type m, const char *path, const char *ct, const char *body,
                        size_t len, int want) {
  resp r = http(port, m, path, ct, body, len);
  if (r.code != want) fprintf(stderr, "%s: got %d (%s), expected %d\n", path, r.code, r.body, want);
  assert_int_equal(r.code, want);
  free(r.body);
}

static void test_two_ranks(void **state) {
  (void)state;
  job j = {.tag = "two"};
  const char *common[] = {"--count", "4", "--batch", "2", "--interval-ms", "50", "--timeout-ms", "60000", NULL};
  start_ranks(&j, 2, common, NULL);
  for (int r = 0; r < 2; r++) wait_health(j.port[r], 200, 60);

  /* rank 0 JSON, rank 1 raw float32: the average of both on both */
  assert_int_equal(post_json(j.port[0], "[1, 2, 3, 4]"), 202);
  float raw[4] = {3, 4, 5, 6};
  expect_code(j.port[1], EVHTTP_REQ_POST, "/submit", "application/octet-stream", (const char *)raw, sizeof raw, 202);
  const double want2[4] = {2, 3, 4, 5};
  for (int r = 0; r < 2; r++) {
    json_t *a = wait_vectors(j.port[r], 2, 30);
    assert_int_equal(json_integer_value(json_object_get(a, "vectors")), 2);
    assert_int_equal(json_integer_value(json_object_get(a, "size")), 2);
    assert_average(a, want2, 4);
    json_decref(a);
  }

  /* 4xx: the client's mistake is answered, the service goes on */
  expect_code(j.port[0], EVHTTP_REQ_POST, "/submit", "application/json", "[1, 2,", 6, 400);
  expect_code(j.port[0], EVHTTP_REQ_POST, "/submit", "application/json", "[1, 2]", 6, 400);
  expect_code(j.port[0], EVHTTP_REQ_POST, "/submit", "application/json", "[1, \"a\", 3, 4]", 15, 400);
  expect_code(j.port[0], EVHTTP_REQ_POST, "/submit", "application/json", "[1, 2, 3, 1e300]", 16, 400);
  expect_code(j.port[0], EVHTTP_REQ_POST, "/submit", "application/json", "{\"x\": 1}", 8, 400);
  expect_code(j.port[1], EVHTTP_REQ_POST, "/submit", "application/octet-stream", "abc", 3, 400);
  expect_code(j.port[0], EVHTTP_REQ_POST, "/submit", "text/plain", "1 2 3 4", 7, 415);
  expect_code(j.port[0], EVHTTP_REQ_POST, "/submit", NULL, "[1, 2, 3, 4]", 12, 415);
  size_t big = 64 * 1024;
  char *huge = malloc(big);
  memset(huge, ' ', big);
  huge[0] = '[';
  huge[big - 1] = ']';
  expect_code(j.port[1], EVHTTP_REQ_POST, "/submit", "application/json", huge, big, 413);
  free(huge);
  expect_code(j.port[0], EVHTTP_REQ_GET, "/submit", NULL, NULL, 0, 405);
  expect_code(j.port[0], EVHTTP_REQ_POST, "/status", "application/json", "{}", 2, 405);
  expect_code(j.port[0], EVHTTP_REQ_DELETE, "/average", NULL, NULL, 0, 405);
  expect_code(j.port[0], EVHTTP_REQ_GET, "/nope", NULL, NULL, 0, 404);
  expect_code(j.port[0], EVHTTP_REQ_GET, "/status?tail=x", NULL, NULL, 0, 400);
  expect_code(j.port[0], EVHTTP_REQ_GET, "/status?tail=5000", NULL, NULL, 0, 400);
  for (int r = 0; r < 2; r++) wait_health(j.port[r], 200, 5);
  assert_int_equal(post_json(j.port[1], "[5, 6, 7, 8]"), 202);
  const double want3[4] = {3, 4, 5, 6};
  for (int r = 0; r < 2; r++) {
    json_t *a = wait_vectors(j.port[r], 3, 30);
    assert_average(a, want3, 4);
    json_decref(a);
  }

  /* /status: the schema, the comm READY, the service's own member */
  for (int r = 0; r < 2; r++) {
    json_t *st = get_json(j.port[r], "/status?tail=4");
    assert_non_null(st);
    const char *bad = check_status_schema(st);
    if (bad) fprintf(stderr, "/status schema: %s\n", bad);
    assert_null(bad);
    json_t *c = status_comm(st);
    assert_string_equal(json_string_value(json_object_get(c, "name")), "avg");
    assert_int_equal(json_integer_value(json_object_get(c, "rank")), r);
    assert_int_equal(json_integer_value(json_object_get(c, "size")), 2);
    assert_false(json_is_true(json_object_get(c, "failed")));
    assert_true(json_integer_value(json_object_get(c, "seq")) >= 2);
    assert_true(json_array_size(json_object_get(json_object_get(c, "recorder"), "tail")) <= 4);
    assert_true(json_array_size(json_object_get(json_object_get(c, "recorder"), "tail")) >= 1);
    assert_true(json_is_object(json_object_get(st, "service")));
    json_decref(st);
  }
  /* the rounds' hashes agree across ranks once both are idle at the same seq */
  json_t *s0 = get_json(j.port[0], "/status"), *s1 = get_json(j.port[1], "/status");
  if (json_integer_value(json_object_get(status_comm(s0), "seq")) ==
      json_integer_value(json_object_get(status_comm(s1), "seq")))
    assert_string_equal(json_string_value(json_object_get(status_comm(s0), "hash")),
                        json_string_value(json_object_get(status_comm(s1), "hash")));
  json_decref(s0);
  json_decref(s1);

  /* /metrics */
  char *m = get_metrics(j.port[0]);
  assert_has(m, "# TYPE ncfsm_transitions_total counter\n");
  assert_has(m, "ncfsm_transitions_total{from=\"INIT_IN_PROGRESS\",to=\"READY\"} 1\n");
  assert_has(m, "ncfsm_comms{state=\"READY\"} 1\n");
  assert_has(m, "# TYPE ncfsm_op_latency_seconds histogram\n");
  assert_has(m, "ncfsm_op_latency_seconds_bucket{op=\"ALLREDUCE\",le=\"+Inf\"}");
  assert_has(m, "ncfsm_comm_state{comm=\"avg\",rank=\"0\",state=\"READY\"} 1\n");
  assert_has(m, "ncfsm_comm_failed{comm=\"avg\",rank=\"0\"} 0\n");
  assert_has(m, "ncfsm_rejected_calls_total{state=\"READY\",call=\"ncfsm_comm_release\"} 0\n");
  check_promtool(m);
  free(m);
  /* HEAD: headers only */
  resp h = http(j.port[0], EVHTTP_REQ_HEAD, "/metrics", NULL, NULL, 0);
  assert_int_equal(h.code, 200);
  assert_int_equal(h.len, 0);
  free(h.body);

  /* a stop asked of rank 0 alone stops both, cleanly */
  kill(j.pid[0], SIGTERM); /* under mpirun: mpirun, which forwards it to every rank */
  int rc0 = wait_exit(j.pid[0], 30), rc1 = j.nproc > 1 ? wait_exit(j.pid[1], 30) : 0;
  if (rc0 || rc1) dump_logs(&j);
  assert_int_equal(rc0, 0);
  assert_int_equal(rc1, 0);
  stop_store(&j);
}

static void test_error_scrape(void **state) {
  (void)state;
  job j = {.tag = "err"};
  /* rank 1's third op (index 2) gets an async error; the comm stays in ERROR */
  const char *common[] = {"--count", "4", "--interval-ms", "20", "--on-error", "stay", "--stop-grace-ms", "1000",
                          "--timeout-ms", "60000", NULL};
  const char *r1[] = {"--sim-async-error-at", "2", NULL};
  const char *const *ra[] = {NULL, r1};
  start_ranks(&j, 2, common, ra);
  /* /healthz is 503 while the init runs too: wait for the comm's ERROR itself */
  json_t *st = NULL;
  for (double end = now_s() + 60;;) {
    st = get_json(j.port[1], "/status");
    json_t *sc = st ? status_comm(st) : NULL;
    const char *s = sc ? json_string_value(json_object_get(sc, "state")) : NULL;
    if ((s && !strcmp(s, "ERROR")) || now_s() > end) break;
    json_decref(st);
    st = NULL;
    usleep(20000);
  }
  assert_non_null(st);
  assert_null(check_status_schema(st));
  json_t *c = status_comm(st);
  assert_string_equal(json_string_value(json_object_get(c, "state")), "ERROR");
  assert_true(json_is_true(json_object_get(c, "failed")));
  assert_true(strlen(json_string_value(json_object_get(c, "failure"))) > 0);
  assert_string_equal(json_string_value(json_object_get(c, "cause")), "NCFSM_ERR_ASYNC");
  assert_true(json_is_string(json_object_get(c, "backend_error")));
  assert_int_equal(json_integer_value(json_object_get(json_object_get(st, "loop"), "failed_comms")), 1);
  json_decref(st);
  char *m = get_metrics(j.port[1]);
  assert_has(m, "ncfsm_comm_state{comm=\"avg\",rank=\"1\",state=\"ERROR\"} 1\n");
  assert_has(m, "ncfsm_comm_state{comm=\"avg\",rank=\"1\",state=\"READY\"} 0\n");
  assert_has(m, "ncfsm_comm_failed{comm=\"avg\",rank=\"1\"} 1\n");
  assert_has(m, "ncfsm_comms{state=\"ERROR\"} 1\n");
  assert_has(m, "ncfsm_works_finished_total{state=\"FAILED\"} 1\n");
  assert_has(m, "ncfsm_comm_works_finished_total{comm=\"avg\",rank=\"1\",state=\"FAILED\"} 1\n");
  check_promtool(m);
  free(m);
  resp h = get(j.port[1], "/healthz");
  assert_int_equal(h.code, 503);
  assert_has(h.body, "ERROR");
  free(h.body);
  /* the service still answers: the last average with the error, submits refused */
  json_t *a = get_json(j.port[1], "/average");
  assert_non_null(a);
  assert_true(json_is_string(json_object_get(a, "error")));
  json_decref(a);
  assert_int_equal(post_json(j.port[1], "[1, 2, 3, 4]"), 503);
  /* rank 0 answers too (its round waits for rank 1 for ever) */
  st = get_json(j.port[0], "/status");
  assert_non_null(st);
  assert_null(check_status_schema(st));
  json_decref(st);
  kill(j.pid[0], SIGTERM);
  kill(j.pid[1], SIGTERM);
  int rc0 = wait_exit(j.pid[0], 30), rc1 = wait_exit(j.pid[1], 30);
  if (rc0 != 3 || rc1 != 3) dump_logs(&j);
  assert_int_equal(rc0, 3); /* aborted: its last round never completed */
  assert_int_equal(rc1, 3); /* failed */
  stop_store(&j);
}

static void test_naive_single(void **state) {
  (void)state;
  job j = {.tag = "naive"};
  const char *common[] = {"--count", "3", "--batch", "1", "--interval-ms", "30", "--naive", NULL};
  start_ranks(&j, 1, common, NULL);
  wait_health(j.port[0], 200, 60);
  assert_int_equal(post_json(j.port[0], "[1, 2, 3]"), 202); /* batch 1: the round runs in the handler */
  assert_int_equal(post_json(j.port[0], "[3, 4, 5]"), 202);
  const double want[3] = {2, 3, 4};
  json_t *a = wait_vectors(j.port[0], 2, 30);
  assert_int_equal(json_integer_value(json_object_get(a, "size")), 1);
  assert_average(a, want, 3);
  json_decref(a);
  json_t *st = get_json(j.port[0], "/status");
  assert_non_null(st);
  assert_null(check_status_schema(st));
  assert_true(json_is_true(json_object_get(json_object_get(st, "service"), "naive")));
  json_decref(st);
  kill(j.pid[0], SIGTERM);
  int rc = wait_exit(j.pid[0], 30);
  if (rc) dump_logs(&j);
  assert_int_equal(rc, 0);
}

int main(int argc, char **argv) {
  int require_gpu = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--service") && i + 1 < argc) g_service = argv[++i];
    else if (!strcmp(argv[i], "--store") && i + 1 < argc) g_store = argv[++i];
    else if (!strcmp(argv[i], "--promtool") && i + 1 < argc) g_promtool = argv[++i];
    else if (!strcmp(argv[i], "--mpirun") && i + 1 < argc) g_mpirun = argv[++i];
    else if (!strcmp(argv[i], "--require-gpu")) require_gpu = 1;
    else if (!strcmp(argv[i], "--filter") && i + 1 < argc) cmocka_set_test_filter(argv[++i]);
    else {
      fprintf(stderr, "usage: service_test --service PATH [--store PATH] [--promtool PATH] [--mpirun PATH --require-gpu]\n");
      return 1;
    }
  }
  if (!g_service || (!g_store && !g_mpirun)) return 1;
  signal(SIGPIPE, SIG_IGN);
  if (require_gpu) {
    ncfsm_backend_info bi;
    if (ncfsm_backend_query(NCFSM_BACKEND_NCCL, &bi) != NCFSM_OK || bi.device_count < 2) {
      printf("SKIP: --require-gpu and fewer than 2 GPUs are visible\n");
      return 77;
    }
    g_gpu_only = 1;
  }
  snprintf(g_dir, sizeof g_dir, "/tmp/ncfsm-svc-XXXXXX");
  if (!mkdtemp(g_dir)) return 1;
  const struct CMUnitTest sim_tests[] = {
      cmocka_unit_test(test_two_ranks),
      cmocka_unit_test(test_error_scrape),
      cmocka_unit_test(test_naive_single),
  };
  const struct CMUnitTest gpu_tests[] = {cmocka_unit_test(test_two_ranks)};
  int rc = g_gpu_only ? cmocka_run_group_tests(gpu_tests, NULL, NULL) : cmocka_run_group_tests(sim_tests, NULL, NULL);
  if (rc == 0) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  } else {
    fprintf(stderr, "logs kept in %s\n", g_dir);
  }
  return rc;
}
