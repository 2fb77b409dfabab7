/*
 * store_scale: time a 128-byte allgather over the tcp store among N ranks.
 * One process drives N client connections on one event_base; the store runs
 * in a forked child (its own process and loop, as ncfsm-store would).
 *
 *   store_scale [N ...]          default: 256 1024
 *   STORE_SCALE_RUNS=5 STORE_SCALE_LEN=128
 *
 * Prints, per N: connect+first barrier time and the median/min/max of the
 * timed allgathers (post on every rank -> all complete).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "bootstrap/tcp-internal.h"
#include "ncfsm/bootstrap.h"

#define TOKEN "store-scale-token-5e1f"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static pid_t start_store(int *port) {
  int p[2];
  if (pipe(p)) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    struct event_base *base = event_base_new();
    ncfsm__store_opts o;
    ncfsm__store_opts_init(&o);
    o.listen = "127.0.0.1:0";
    o.token = TOKEN;
    ncfsm__store *s;
    char err[256];
    if (ncfsm__store_open(base, &o, &s, err, sizeof err)) {
      fprintf(stderr, "store: %s\n", err);
      _exit(1);
    }
    int port_ = ncfsm__store_port(s);
    if (write(p[1], &port_, sizeof port_) != sizeof port_) _exit(1);
    close(p[1]);
    event_base_loop(base, EVLOOP_NO_EXIT_ON_EMPTY);
    _exit(0);
  }
  close(p[1]);
  if (pid < 0 || read(p[0], port, sizeof *port) != sizeof *port) pid = -1;
  close(p[0]);
  return pid;
}

/* Post one allgather on every rank and run the base until all finish. */
static int run_round(struct event_base *base, ncfsm_boot **bs, int n, const unsigned char *send,
                     unsigned char *recv, size_t len, ncfsm_boot_req **req) {
  for (int i = 0; i < n; i++)
    if (ncfsm_boot_allgather_post(bs[i], send + (size_t)i * len, recv + (size_t)i * n * len, len,
                                  &req[i]) != NCFSM_OK)
      return -1;
  int bad = 0;
  for (int i = 0; i < n; i++) {
    while (ncfsm_boot_test(req[i]) == NCFSM_ERR_AGAIN) event_base_loop(base, EVLOOP_ONCE);
    if (ncfsm_boot_test(req[i]) != NCFSM_OK) {
      fprintf(stderr, "rank %d: %s\n", i, ncfsm_boot_last_error(bs[i]));
      bad = 1;
    }
    ncfsm_boot_req_free(req[i]);
  }
  return bad ? -1 : 0;
}

static int bench(int n, int runs, size_t len) {
  int port;
  pid_t pid = start_store(&port);
  if (pid < 0) return -1;
  struct event_base *base = event_base_new();
  ncfsm_boot **bs = calloc((size_t)n, sizeof *bs);
  ncfsm_boot_req **req = calloc((size_t)n, sizeof *req);
  unsigned char *send = malloc((size_t)n * len), *recv = malloc((size_t)n * n * len);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  double t0 = now_s();
  for (int r = 0; r < n; r++) {
    ncfsm_boot_opts o;
    ncfsm_boot_opts_init(&o);
    o.kind = NCFSM_BOOT_TCP;
    o.store_addr = addr;
    o.token = TOKEN;
    o.rank = r;
    o.size = n;
    o.timeout_ms = 60000;
    if (ncfsm_boot_open(base, &o, &bs[r]) != NCFSM_OK) {
      fprintf(stderr, "open rank %d: %s\n", r, ncfsm_boot_open_error());
      return -1;
    }
  }
  for (size_t i = 0; i < (size_t)n * len; i++) send[i] = (unsigned char)(i * 7);
  int rc = run_round(base, bs, n, send, recv, 0, req); /* connect + barrier */
  double t_connect = now_s() - t0;
  double *t = calloc((size_t)runs, sizeof *t);
  for (int k = 0; k < runs && rc == 0; k++) {
    double s = now_s();
    rc = run_round(base, bs, n, send, recv, len, req);
    t[k] = now_s() - s;
    /* spot-check rank n-1's view */
    for (int r = 0; r < n && rc == 0; r++)
      if (memcmp(recv + ((size_t)(n - 1) * n + r) * len, send + (size_t)r * len, len)) rc = -1;
  }
  if (rc == 0) {
    qsort(t, (size_t)runs, sizeof *t, cmp_d);
    printf("| %5d | %5zu | %4d | %10.1f | %10.1f | %10.1f | %10.1f | %9.1f |\n", n, len, runs,
           t_connect * 1e3, t[runs / 2] * 1e3, t[0] * 1e3, t[runs - 1] * 1e3,
           (double)n * n * len / t[runs / 2] / 1e6);
    fflush(stdout);
  }
  for (int r = 0; r < n; r++) ncfsm_boot_close(bs[r]);
  event_base_free(base);
  kill(pid, SIGTERM);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  free(t);
  free(bs);
  free(req);
  free(send);
  free(recv);
  return rc;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  evthread_use_pthreads();
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  getrlimit(RLIMIT_NOFILE, &rl);
  int runs = (int)strtol(getenv("STORE_SCALE_RUNS") ? getenv("STORE_SCALE_RUNS") : "5", NULL, 0);
  size_t len = (size_t)strtoul(getenv("STORE_SCALE_LEN") ? getenv("STORE_SCALE_LEN") : "128", NULL, 0);
  if (runs < 1) runs = 1;
  int ns[16], nn = 0;
  for (int i = 1; i < argc && nn < 16; i++) ns[nn++] = atoi(argv[i]);
  if (!nn) {
    ns[nn++] = 256;
    ns[nn++] = 1024;
  }
  printf("store_scale: tcp store allgather, clients on one event_base, store in a child process\n");
  printf("RLIMIT_NOFILE %llu\n", (unsigned long long)rl.rlim_cur);
  printf("| ranks | bytes | runs | connect ms | median ms  | min ms     | max ms     | MB/s out  |\n");
  printf("|-------|-------|------|------------|------------|------------|------------|-----------|\n");
  int rc = 0;
  for (int i = 0; i < nn; i++)
    if (bench(ns[i], runs, len) != 0) {
      fprintf(stderr, "store_scale: N=%d failed\n", ns[i]);
      rc = 1;
    }
  return rc;
}
