/*
 * store_scale: the tcp store with N ranks (issue 14). One process drives N
 * client connections on one event_base; the store runs in a forked child (its
 * own process and loop, as ncfsm-store would). Per N it times
 *   - connect: every rank opens its bootstrap and passes a first barrier;
 *   - bcast:   the unique id exchange, a broadcast of LEN bytes from rank 0
 *              (one BCAST per rank: root's carries the bytes, the others get them);
 *   - allgather: LEN bytes from every rank to every rank (the exchange before
 *              issue 14: n x n x LEN bytes out of the store);
 * and the bytes the store process read and wrote meanwhile (/proc/<pid>/io,
 * rchar + wchar: every socket read and write it made).
 *
 *   store_scale [N ...]          default: 256 1024
 *   STORE_SCALE_RUNS=5           timed broadcasts per N (median, min, max)
 *   STORE_SCALE_AG_RUNS=3        timed allgathers per N (1 from 4,096 ranks up)
 *   STORE_SCALE_LEN=128          bytes (an ncclUniqueId)
 *   STORE_SCALE_NO_AG=1          skip the allgather
 *
 * The open-file limit is raised to the hard limit (as root, first to the
 * kernel's nr_open); the store's max_conns is set to N + 64. An N the limit
 * cannot hold is reported and skipped. The ranks run without heartbeat
 * connections (NCFSM_STORE_HEARTBEAT=0: one thread and one more connection
 * per rank, which measure nothing of the exchange; docs/bootstrap.md
 * "Heartbeats" has their cost).
 */
#include <errno.h>
#include <inttypes.h>
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

/* rchar + wchar of pid (bytes its read/write-like calls moved), or 0. */
static uint64_t io_bytes(pid_t pid) {
  char path[64], line[128];
  snprintf(path, sizeof path, "/proc/%d/io", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  uint64_t r = 0, w = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long long v;
    if (sscanf(line, "rchar: %llu", &v) == 1) r = v;
    if (sscanf(line, "wchar: %llu", &v) == 1) w = v;
  }
  fclose(f);
  return r + w;
}

static pid_t start_store(int n, int *port) {
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
    o.max_conns = n + 64;
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

static int wait_all(struct event_base *base, ncfsm_boot **bs, ncfsm_boot_req **req, int n) {
  int bad = 0;
  for (int i = 0; i < n; i++) {
    while (ncfsm_boot_test(req[i]) == NCFSM_ERR_AGAIN) event_base_loop(base, EVLOOP_ONCE);
    if (ncfsm_boot_test(req[i]) != NCFSM_OK) {
      if (!bad) fprintf(stderr, "rank %d: %s\n", i, ncfsm_boot_last_error(bs[i]));
      bad = 1;
    }
    ncfsm_boot_req_free(req[i]);
  }
  return bad ? -1 : 0;
}

/* One allgather (len 0: a barrier) on every rank; recv is shared (every rank
 * gets the same bytes). */
static int run_allgather(struct event_base *base, ncfsm_boot **bs, int n, const unsigned char *send,
                         unsigned char *recv, size_t len, ncfsm_boot_req **req) {
  for (int i = 0; i < n; i++)
    if (ncfsm_boot_allgather_post(bs[i], send + (size_t)i * len, recv, len, &req[i]) != NCFSM_OK)
      return -1;
  return wait_all(base, bs, req, n);
}

/* One broadcast from rank 0: root's buffer is bufs[0], the others' bufs[i]. */
static int run_bcast(struct event_base *base, ncfsm_boot **bs, int n, unsigned char *bufs,
                     size_t len, ncfsm_boot_req **req) {
  for (int i = 0; i < n; i++)
    if (ncfsm_boot_bcast_post(bs[i], bufs + (size_t)i * len, len, 0, &req[i]) != NCFSM_OK) return -1;
  return wait_all(base, bs, req, n);
}

typedef struct stat3 {
  double med, min, max;
} stat3;

static stat3 stats(double *t, int k) {
  qsort(t, (size_t)k, sizeof *t, cmp_d);
  stat3 s = {t[k / 2], t[0], t[k - 1]};
  return s;
}

static int bench(int n, int runs, int ag_runs, size_t len) {
  int port;
  pid_t pid = start_store(n, &port);
  if (pid < 0) return -1;
  struct event_base *base = event_base_new();
  ncfsm_boot **bs = calloc((size_t)n, sizeof *bs);
  ncfsm_boot_req **req = calloc((size_t)n, sizeof *req);
  unsigned char *send = malloc((size_t)n * len), *bufs = calloc((size_t)n, len);
  unsigned char *recv = ag_runs ? malloc((size_t)n * len) : NULL;
  double *t = calloc((size_t)(runs > ag_runs ? runs : ag_runs) + 1, sizeof *t);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  int rc = 0;
  double t0 = now_s();
  for (int r = 0; r < n && rc == 0; r++) {
    ncfsm_boot_opts o;
    ncfsm_boot_opts_init(&o);
    o.kind = NCFSM_BOOT_TCP;
    o.store_addr = addr;
    o.token = TOKEN;
    o.rank = r;
    o.size = n;
    o.timeout_ms = 120000;
    if (ncfsm_boot_open(base, &o, &bs[r]) != NCFSM_OK) {
      fprintf(stderr, "open rank %d: %s\n", r, ncfsm_boot_open_error());
      rc = -1;
    }
  }
  for (size_t i = 0; i < (size_t)n * len; i++) send[i] = (unsigned char)(i * 7 + 3);
  if (rc == 0) rc = run_allgather(base, bs, n, send, recv, 0, req); /* connect + barrier */
  double t_connect = now_s() - t0;
  /* the id exchange: a broadcast from rank 0 */
  uint64_t io0 = io_bytes(pid);
  for (int k = 0; k < runs && rc == 0; k++) {
    memset(bufs + len, 0, (size_t)(n - 1) * len);
    for (size_t i = 0; i < len; i++) bufs[i] = (unsigned char)(k * 31 + (int)i);
    double s = now_s();
    rc = run_bcast(base, bs, n, bufs, len, req);
    t[k] = now_s() - s;
    for (int r = 1; r < n && rc == 0; r++)
      if (memcmp(bufs + (size_t)r * len, bufs, len)) {
        fprintf(stderr, "broadcast: rank %d got other bytes\n", r);
        rc = -1;
      }
  }
  uint64_t bc_bytes = runs ? (io_bytes(pid) - io0) / (uint64_t)runs : 0;
  stat3 bc = rc == 0 ? stats(t, runs) : (stat3){0, 0, 0};
  stat3 ag = {0, 0, 0};
  uint64_t ag_bytes = 0;
  io0 = io_bytes(pid);
  for (int k = 0; k < ag_runs && rc == 0; k++) {
    double s = now_s();
    rc = run_allgather(base, bs, n, send, recv, len, req);
    t[k] = now_s() - s;
    if (rc == 0 && memcmp(recv, send, (size_t)n * len)) {
      fprintf(stderr, "allgather: wrong bytes\n");
      rc = -1;
    }
  }
  if (ag_runs && rc == 0) {
    ag_bytes = (io_bytes(pid) - io0) / (uint64_t)ag_runs;
    ag = stats(t, ag_runs);
  }
  if (rc == 0) {
    printf("| %5d | %4zu | %8.1f | %2d | %8.2f | %8.2f | %8.2f | %10.2f | %5.1f |", n, len,
           t_connect * 1e3, runs, bc.med * 1e3, bc.min * 1e3, bc.max * 1e3, (double)bc_bytes / 1e6,
           (double)bc_bytes / n);
    if (ag_runs)
      printf(" %2d | %9.1f | %9.1f | %10.1f | %6.0fx |\n", ag_runs, ag.med * 1e3, ag.max * 1e3,
             (double)ag_bytes / 1e6, bc_bytes ? (double)ag_bytes / (double)bc_bytes : 0.0);
    else
      printf(" -  | -         | -         | -          | -       |\n");
    fflush(stdout);
  }
  for (int r = 0; r < n; r++)
    if (bs[r]) ncfsm_boot_close(bs[r]);
  event_base_free(base);
  kill(pid, SIGTERM);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  free(t);
  free(bs);
  free(req);
  free(send);
  free(bufs);
  free(recv);
  return rc;
}

static int env_int(const char *name, int dflt) {
  const char *v = getenv(name);
  return v && *v ? (int)strtol(v, NULL, 0) : dflt;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  evthread_use_pthreads();
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rlim_t hard0 = rl.rlim_max;
  struct rlimit want = {1u << 20, 1u << 20}; /* root: up to the kernel's nr_open */
  if (setrlimit(RLIMIT_NOFILE, &want) != 0) {
    want.rlim_cur = want.rlim_max = hard0;
    setrlimit(RLIMIT_NOFILE, &want);
  }
  getrlimit(RLIMIT_NOFILE, &rl);
  setenv("NCFSM_STORE_HEARTBEAT", "0", 1);
  int runs = env_int("STORE_SCALE_RUNS", 5), ag_runs0 = env_int("STORE_SCALE_AG_RUNS", 3);
  size_t len = (size_t)env_int("STORE_SCALE_LEN", 128);
  int no_ag = env_int("STORE_SCALE_NO_AG", 0);
  if (runs < 1) runs = 1;
  int ns[32], nn = 0;
  for (int i = 1; i < argc && nn < 32; i++) ns[nn++] = atoi(argv[i]);
  if (!nn) {
    ns[nn++] = 256;
    ns[nn++] = 1024;
  }
  printf("store_scale: tcp store, N clients on one event_base, the store in a child process\n");
  printf("RLIMIT_NOFILE %llu (hard limit was %llu)\n", (unsigned long long)rl.rlim_cur,
         (unsigned long long)hard0);
  printf("| ranks | len  | connect ms | bc runs | bc median ms | bc min ms | bc max ms | bc MB moved | "
         "bc B/rank | ag runs | ag median ms | ag max ms | ag MB moved | ag/bc bytes |\n");
  printf("|-------|------|------------|----|----------|----------|----------|------------|-------|"
         "----|-----------|-----------|------------|---------|\n");
  int rc = 0;
  for (int i = 0; i < nn; i++) {
    int n = ns[i];
    if (n < 1) continue;
    if ((rlim_t)n + 64 > rl.rlim_cur) {
      printf("| %5d | skipped: needs %d descriptors per process, the limit is %llu |\n", n, n + 64,
             (unsigned long long)rl.rlim_cur);
      continue;
    }
    int ag_runs = no_ag ? 0 : (n >= 4096 ? 1 : ag_runs0);
    if (bench(n, runs, ag_runs, len) != 0) {
      fprintf(stderr, "store_scale: N=%d failed\n", n);
      rc = 1;
    }
  }
  return rc;
}
