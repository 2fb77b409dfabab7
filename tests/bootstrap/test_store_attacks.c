/*
 * The tcp store under hostile and failing clients (issue 12): each test
 * starts a fresh ncfsm-store process (argv[1]), attacks it over loopback
 * with raw sockets while a correct 2-rank job (the real tcp client) runs
 * allgathers beside it, and checks that the attack ends in a bounded, named
 * failure: the store closes or refuses the attacker with an ERR that says
 * why, its memory stays within the configured bounds, and the correct job
 * keeps working. The liveness and identity tests run a 3-rank job.
 *
 *   test_store_attacks STORE_BINARY [TEST_NAME_FILTER]
 *
 * Limits go to the store through NCFSM_STORE_* only (never flags), so the
 * same program runs against an older ncfsm-store, where these tests fail.
 * STORE_ATTACKS_SCALE=issue uses the issue's sizes (200 x 1 MiB frames, 600
 * GETs of 1 MiB, 1,200 connections at ulimit -n 1024, 2,000 bad HELLOs) and
 * the store's default limits; STORE_ATTACKS_OUT=FILE appends one result line
 * per attack (docs/results/store-attacks.txt).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "tests/bootstrap/boot_test.h"
#include "bootstrap/frame.h"

#define TOKEN "attack-test-token-0123456789"

/* ASan's and TSan's shadow memory make the store's RSS meaningless: the RSS
 * bounds are checked only without them (UNDER_ASAN names both). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static const char *store_bin;
static int issue_scale;
/* Processes a failed test leaves behind: its teardown kills them. */
static pid_t live_store = -1, live_child = -1;

/* ---- the store process ------------------------------------------------------ */

typedef struct store_proc {
  pid_t pid;
  int port;
  char errpath[96];
  long base_kb; /* VmRSS once listening */
} store_proc;

static long proc_kb(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  long v = -1;
  size_t fl = strlen(field);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, field, fl) && line[fl] == ':') v = atol(line + fl + 1);
  fclose(f);
  return v;
}

/* Start the store with extra environment (NULL-terminated "K=V" list) and,
 * when nofile > 0, that open-file limit. */
static void store_spawn(store_proc *sp, const char *const *env, long nofile) {
  static int n;
  memset(sp, 0, sizeof *sp);
  snprintf(sp->errpath, sizeof sp->errpath, "/tmp/ncfsm-attacks-%d-%d.err", (int)getpid(), n++);
  int p[2];
  assert_int_equal(0, pipe(p));
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* the test died (its alarm): no orphan store */
    dup2(p[1], 1);
    int fd = open(sp->errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) dup2(fd, 2);
    setenv("NCFSM_STORE_TOKEN", TOKEN, 1);
    setenv("NCFSM_DEBUG", "WARN", 1);
    unsetenv("NCFSM_STORE_ADDR");
    for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
    if (nofile > 0) {
      struct rlimit rl = {(rlim_t)nofile, (rlim_t)nofile};
      setrlimit(RLIMIT_NOFILE, &rl);
    }
    execl(store_bin, store_bin, "--listen", "127.0.0.1:0", "--print-port", (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  char buf[32] = "";
  size_t got = 0;
  struct pollfd pf = {p[0], POLLIN, 0};
  while (got < sizeof buf - 1 && !memchr(buf, '\n', got) && poll(&pf, 1, 10000) == 1) {
    ssize_t r = read(p[0], buf + got, sizeof buf - 1 - got);
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(p[0]);
  buf[got] = 0;
  sp->pid = live_store = pid;
  sp->port = atoi(buf);
  if (sp->port <= 0) fail_msg("%s did not print its port (see %s)", store_bin, sp->errpath);
  sp->base_kb = proc_kb(pid, "VmRSS");
}

/* Stop the store (SIGTERM); copy its last "stopping:" line into stats. */
static void store_stop(store_proc *sp, char *stats, size_t n) {
  live_store = -1;
  kill(sp->pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 500 && waitpid(sp->pid, &status, WNOHANG) == 0; i++) usleep(10000);
  if (waitpid(sp->pid, &status, WNOHANG) == 0) {
    kill(sp->pid, SIGKILL);
    waitpid(sp->pid, &status, 0);
  }
  if (stats) stats[0] = 0;
  /* it must stop cleanly: exit 0 after SIGTERM, no sanitizer report */
  FILE *f = fopen(sp->errpath, "r");
  char line[2048];
  int bad = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  while (f && fgets(line, sizeof line, f)) {
    if (stats && strstr(line, "stopping:")) snprintf(stats, n, "%s", line);
    if (strstr(line, "runtime error:") || strstr(line, "Sanitizer")) bad = 1;
  }
  if (f) fclose(f);
  if (bad) {
    fprintf(stderr, "---- the store (%s) did not stop cleanly (status 0x%x); its log:\n", store_bin,
            status);
    f = fopen(sp->errpath, "r");
    while (f && fgets(line, sizeof line, f)) fputs(line, stderr);
    if (f) fclose(f);
  }
  if (!getenv("STORE_ATTACKS_KEEP_LOGS")) unlink(sp->errpath);
  else fprintf(stderr, "store log kept: %s\n", sp->errpath);
  if (bad) fail_msg("the store exited with status 0x%x or reported a sanitizer error", status);
}

/* Lines of the store's log that contain sub. */
static int store_log_count(const store_proc *sp, const char *sub) {
  FILE *f = fopen(sp->errpath, "r");
  char line[4096];
  int k = 0;
  while (f && fgets(line, sizeof line, f))
    if (strstr(line, sub)) k++;
  if (f) fclose(f);
  return k;
}

/* ---- raw clients ------------------------------------------------------------ */

static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  struct timeval tv = {3, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static int send_all(int fd, const void *p, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = send(fd, (const char *)p + done, n - done, MSG_NOSIGNAL);
    if (r <= 0) return -1;
    done += (size_t)r;
  }
  return 0;
}

static int send_frame(int fd, uint8_t type, uint32_t id, const char *key, const void *val,
                      uint32_t vlen) {
  uint8_t hdr[NCFSM__FRAME_HDR];
  size_t kl = strlen(key);
  ncfsm__frame_header(hdr, type, id, (uint32_t)kl, vlen);
  if (send_all(fd, hdr, sizeof hdr) || send_all(fd, key, kl)) return -1;
  return vlen ? send_all(fd, val, vlen) : 0;
}

static int send_hello(int fd, const char *token, uint32_t rank, uint32_t size) {
  uint8_t v[8];
  ncfsm__wr32(v, rank);
  ncfsm__wr32(v + 4, size);
  return send_frame(fd, NCFSM__F_HELLO, 0, token, v, 8);
}

/* Read exactly n bytes within ms. 0, or -1 (closed, error or time). */
static int read_full(int fd, void *p, size_t n, int ms) {
  size_t got = 0;
  double end = bt_now() + ms / 1000.0;
  while (got < n) {
    struct pollfd pf = {fd, POLLIN, 0};
    int left = (int)((end - bt_now()) * 1000);
    if (left <= 0 || poll(&pf, 1, left) != 1) return -1;
    ssize_t r = recv(fd, (char *)p + got, n - got, 0);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

/* One reply frame within ms: its type (0 when none), its value (up to cap-1
 * bytes kept, NUL-terminated) in msg. */
static int read_reply(int fd, char *msg, size_t cap, int ms) {
  uint8_t hdr[NCFSM__FRAME_HDR];
  msg[0] = 0;
  if (read_full(fd, hdr, sizeof hdr, ms)) return 0;
  uint32_t vlen = ncfsm__rd32(hdr + 16);
  size_t keep = vlen < cap - 1 ? vlen : cap - 1;
  if (read_full(fd, msg, keep, ms)) return 0;
  msg[keep] = 0;
  for (uint32_t skip = vlen - (uint32_t)keep; skip;) {
    char junk[4096];
    uint32_t k = skip < sizeof junk ? skip : (uint32_t)sizeof junk;
    if (read_full(fd, junk, k, ms)) return 0;
    skip -= k;
  }
  return hdr[5];
}

/* Read until the peer closes, within ms: 1 when closed, 0 when not. The last
 * bytes received go to tail (NUL-terminated, NULs as '.'), *total counts all. */
static int wait_closed(int fd, int ms, char *tail, size_t cap, size_t *total) {
  double end = bt_now() + ms / 1000.0;
  size_t tl = 0;
  if (total) *total = 0;
  static char buf[1 << 16];
  for (;;) {
    struct pollfd pf = {fd, POLLIN, 0};
    int left = (int)((end - bt_now()) * 1000);
    if (left <= 0 || poll(&pf, 1, left) != 1) break;
    ssize_t r = recv(fd, buf, sizeof buf, 0);
    if (r == 0 || (r < 0 && errno == ECONNRESET)) {
      if (tail) tail[tl] = 0;
      return 1;
    }
    if (r < 0) break;
    if (total) *total += (size_t)r;
    if (tail) { /* the chunk's last cap - 1 bytes, after what is kept of the tail: one move per chunk
                 * (a move per byte cost seconds for MiBs under TSan, past the caller's bound) */
      size_t keep = cap - 1, n = (size_t)r < keep ? (size_t)r : keep, old = tl + n > keep ? keep - n : tl;
      memmove(tail, tail + tl - old, old);
      for (size_t i = 0; i < n; i++) {
        char ch = buf[(size_t)r - n + i];
        tail[old + i] = ch ? ch : '.';
      }
      tl = old + n;
    }
  }
  if (tail) tail[tl] = 0;
  return 0;
}

/* ---- the correct job ------------------------------------------------------------ */

static ncfsm_boot *open_rank(struct event_base *base, int port, int rank, int size,
                             uint64_t timeout_ms) {
  return bt_open_tcp(base, port, rank, size, TOKEN, NULL, timeout_ms);
}

typedef struct job {
  struct event_base *base;
  ncfsm_boot *b[3];
  int n, round, failed;
  double lat[4096];
  int nlat;
  char err[512];
} job;

static void job_open(job *j, int port, int n) {
  memset(j, 0, sizeof *j);
  j->base = bt_base();
  j->n = n;
  for (int r = 0; r < n; r++) j->b[r] = open_rank(j->base, port, r, n, 20000);
}

/* One allgather of 64 bytes on every rank; its latency is recorded. 0 or -1. */
static int job_round(job *j) {
  enum { L = 64 };
  unsigned char send[3][L], recv[3][3 * L];
  ncfsm_boot_req *req[3] = {0};
  double t0 = bt_now();
  for (int r = 0; r < j->n; r++) {
    bt_fill(send[r], L, r, j->round);
    if (ncfsm_boot_allgather_post(j->b[r], send[r], recv[r], L, &req[r]) != NCFSM_OK) {
      snprintf(j->err, sizeof j->err, "post: %s", ncfsm_boot_last_error(j->b[r]));
      j->failed = 1;
      for (int q = 0; q < r; q++) ncfsm_boot_req_free(req[q]);
      return -1;
    }
  }
  bt_wait_all(j->base, req, j->n);
  int ok = 1;
  for (int r = 0; r < j->n; r++) {
    if (ncfsm_boot_test(req[r]) != NCFSM_OK) {
      ok = 0;
      snprintf(j->err, sizeof j->err, "%s", ncfsm_boot_last_error(j->b[r]));
    } else {
      for (int q = 0; q < j->n; q++) {
        unsigned char want[L];
        bt_fill(want, L, q, j->round);
        if (memcmp(recv[r] + q * L, want, L)) ok = 0;
      }
    }
    ncfsm_boot_req_free(req[r]);
  }
  if (j->nlat < (int)(sizeof j->lat / sizeof j->lat[0])) j->lat[j->nlat++] = bt_now() - t0;
  j->round++;
  if (!ok) j->failed = 1;
  return ok ? 0 : -1;
}

static void job_close(job *j) {
  for (int r = j->n - 1; r >= 0; r--)
    if (j->b[r]) assert_int_equal(NCFSM_OK, ncfsm_boot_close(j->b[r]));
  event_base_free(j->base);
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Run attack(arg) on a thread while the job runs rounds (at most one per ms). */
typedef struct attack_thr {
  void (*fn)(void *);
  void *arg;
  atomic_int done; /* read by the job's thread while the attack runs (a volatile int was a data race: TSan) */
} attack_thr;

static void *attack_main(void *p) {
  attack_thr *a = p;
  a->fn(a->arg);
  atomic_store(&a->done, 1);
  return NULL;
}

static void run_beside(job *j, void (*fn)(void *), void *arg) {
  attack_thr a = {fn, arg, 0};
  pthread_t th;
  assert_int_equal(0, pthread_create(&th, NULL, attack_main, &a));
  while (!atomic_load(&a.done) && !j->failed) {
    job_round(j);
    usleep(1000);
  }
  pthread_join(th, NULL);
}

/* ---- results -------------------------------------------------------------------- */

typedef struct row {
  const char *attack;
  double peak_mb, base_mb;
  double p50_ms, max_ms;
  int rounds;
  char outcome[1200];
} row;

static void row_emit(row *w, job *j, const store_proc *sp) {
  long hwm = proc_kb(sp->pid, "VmHWM");
  w->peak_mb = hwm / 1024.0;
  w->base_mb = sp->base_kb / 1024.0;
  if (j && j->nlat) {
    double *l = malloc(sizeof(double) * (size_t)j->nlat);
    memcpy(l, j->lat, sizeof(double) * (size_t)j->nlat);
    qsort(l, (size_t)j->nlat, sizeof *l, cmp_d);
    w->p50_ms = l[j->nlat / 2] * 1e3;
    w->max_ms = l[j->nlat - 1] * 1e3;
    w->rounds = j->nlat;
    free(l);
  }
  char line[1600];
  snprintf(line, sizeof line,
           "%-18s | idle %6.1f MB | peak %7.1f MB | job rounds %5d p50 %8.2f ms max %8.2f ms | %s\n",
           w->attack, w->base_mb, w->peak_mb, w->rounds, w->p50_ms, w->max_ms, w->outcome);
  fputs(line, stdout);
  fflush(stdout);
  const char *out = getenv("STORE_ATTACKS_OUT");
  FILE *f = out ? fopen(out, "a") : NULL;
  if (f) {
    fputs(line, f);
    fclose(f);
  }
}

/* The store's memory stayed within bound_mb above idle (not under ASan or
 * TSan, whose shadow memory makes RSS meaningless). */
static void check_rss(const row *w, double bound_mb) {
  if (UNDER_ASAN) return;
  if (w->peak_mb - w->base_mb > bound_mb)
    fail_msg("%s: store peak RSS %.1f MB, idle %.1f MB: over the bound of +%.1f MB", w->attack,
             w->peak_mb, w->base_mb, bound_mb);
}

/* ---- 1. unfinished frames (slowloris, after authentication) -------------------------- */

typedef struct slow_arg {
  int port, n;
  uint32_t vlen;     /* declared value length */
  uint32_t send_len; /* bytes of it actually sent */
  int *fds;
} slow_arg;

static void slow_attack(void *p) {
  slow_arg *a = p;
  static char chunk[1 << 16];
  memset(chunk, 'x', sizeof chunk);
  for (int i = 0; i < a->n; i++) {
    int fd = a->fds[i] = raw_connect(a->port);
    if (fd < 0) continue;
    char msg[256];
    if (send_hello(fd, TOKEN, 0, 0) || read_reply(fd, msg, sizeof msg, 3000) != NCFSM__F_OK) continue;
    uint8_t hdr[NCFSM__FRAME_HDR];
    ncfsm__frame_header(hdr, NCFSM__F_SET, 1, 1, a->vlen);
    if (send_all(fd, hdr, sizeof hdr) || send_all(fd, "k", 1)) continue;
    for (uint32_t sent = 0; sent < a->send_len;) {
      uint32_t k = a->send_len - sent < sizeof chunk ? a->send_len - sent : (uint32_t)sizeof chunk;
      if (send_all(fd, chunk, k)) break;
      sent += k;
    }
  }
}

static void test_slow_frames(void **state) {
  (void)state;
  int n = issue_scale ? 200 : 48;
  uint64_t inflight_mb = issue_scale ? 64 : 16, frame_ms = issue_scale ? 10000 : 1000;
  store_proc sp;
  const char *env[] = {"NCFSM_STORE_FRAME_TIMEOUT_MS=1000", "NCFSM_STORE_MAX_INFLIGHT=16777216", NULL};
  store_spawn(&sp, issue_scale ? NULL : env, 0); /* the issue's scale: the default limits */
  job j;
  job_open(&j, sp.port, 2);
  assert_int_equal(0, job_round(&j));
  /* a: a few small unfinished frames (under the budget): the frame deadline */
  int small[4];
  slow_arg sa = {sp.port, 4, 1000, 10, small};
  slow_attack(&sa);
  /* b: n frames of 1 MiB - 1 byte each, the job running beside */
  int *fds = calloc((size_t)n, sizeof *fds);
  slow_arg a = {sp.port, n, 1u << 20, (1u << 20) - 1, fds};
  run_beside(&j, slow_attack, &a);
  double t0 = bt_now(); /* the last frame started before this: closed by frame_ms after it */
  int budget = 0, deadline = 0, open_ = 0, other = 0;
  char tail[512];
  int wait_ms = (int)frame_ms + 3000;
  for (int i = 0; i < n + 4; i++) {
    int fd = i < 4 ? small[i] : fds[i - 4];
    if (fd < 0) {
      other++;
      continue;
    }
    int left = wait_ms - (int)((bt_now() - t0) * 1000);
    if (!wait_closed(fd, left > 0 ? left : 1, tail, sizeof tail, NULL)) open_++;
    else if (strstr(tail, "input budget")) budget++;
    else if (strstr(tail, "frame not complete")) deadline++;
    else other++;
    close(fd);
  }
  double dt = bt_now() - t0;
  int after = job_round(&j);
  row w = {.attack = "slow-frames"};
  snprintf(w.outcome, sizeof w.outcome,
           "%d x 1 MiB-1 + 4 small unfinished frames: %d closed 'input budget', %d 'frame not "
           "complete', %d still open %.1f s after the attack, %d other; job %.160s",
           n, budget, deadline, open_, dt, other, after == 0 ? "ok" : j.err);
  row_emit(&w, &j, &sp);
  assert_int_equal(0, open_);
  assert_true(deadline >= 4);
  assert_true(budget >= 1);
  assert_int_equal(0, after);
  assert_false(j.failed);
  check_rss(&w, (double)inflight_mb + 24);
  job_close(&j);
  free(fds);
  store_stop(&sp, NULL, 0);
}

/* ---- 2. replies not read ------------------------------------------------------------ */

typedef struct unread_arg {
  int port, gets;
  int fd_get, fd_park;
} unread_arg;

static void unread_attack(void *p) {
  unread_arg *a = p;
  uint32_t vlen = 1u << 20;
  char *val = malloc(vlen), msg[256];
  memset(val, 'v', vlen);
  /* a: SET a 1 MiB value, then pipeline GETs of it and never read */
  int fd = a->fd_get = raw_connect(a->port);
  if (fd >= 0 && !send_hello(fd, TOKEN, 0, 0) && read_reply(fd, msg, sizeof msg, 3000) == NCFSM__F_OK &&
      !send_frame(fd, NCFSM__F_SET, 1, "big", val, vlen) &&
      read_reply(fd, msg, sizeof msg, 3000) == NCFSM__F_OK) {
    for (int i = 0; i < a->gets; i++)
      if (send_frame(fd, NCFSM__F_GET, 100 + (uint32_t)i, "big", NULL, 0)) break;
  }
  /* b: park GETs on a key, never read; another connection SETs 1 MiB there */
  int pk = a->fd_park = raw_connect(a->port);
  if (pk >= 0 && !send_hello(pk, TOKEN, 0, 0) && read_reply(pk, msg, sizeof msg, 3000) == NCFSM__F_OK) {
    for (int i = 0; i < a->gets; i++)
      if (send_frame(pk, NCFSM__F_GET, 100 + (uint32_t)i, "later", NULL, 0)) break;
    usleep(100000);
    int s = raw_connect(a->port);
    if (s >= 0 && !send_hello(s, TOKEN, 0, 0) && read_reply(s, msg, sizeof msg, 3000) == NCFSM__F_OK)
      send_frame(s, NCFSM__F_SET, 1, "later", val, vlen), read_reply(s, msg, sizeof msg, 3000);
    if (s >= 0) close(s);
  }
  /* no reading until past the stall limit: 1 s here, the default 60 s at the
   * issue's scale */
  usleep(issue_scale ? 61500000 : 1500000);
  free(val);
}

static void test_unread_replies(void **state) {
  (void)state;
  store_proc sp;
  const char *env[] = {"NCFSM_STORE_OUT_STALL_MS=1000", "NCFSM_STORE_OUT_MAX=67108864", NULL};
  store_spawn(&sp, issue_scale ? NULL : env, 0);
  job j;
  job_open(&j, sp.port, 2);
  assert_int_equal(0, job_round(&j));
  unread_arg a = {sp.port, 600, -1, -1};
  run_beside(&j, unread_attack, &a);
  char tail_get[600], tail_park[600];
  size_t got_get = 0, got_park = 0;
  int wait_ms = 4000;
  int closed_get = a.fd_get >= 0 && wait_closed(a.fd_get, wait_ms, tail_get, sizeof tail_get, &got_get);
  int closed_park = a.fd_park >= 0 && wait_closed(a.fd_park, 4000, tail_park, sizeof tail_park, &got_park);
  int after = job_round(&j);
  row w = {.attack = "unread-replies"};
  snprintf(w.outcome, sizeof w.outcome,
           "600 pipelined GETs of 1 MiB: %s after %.0f MiB sent; 600 parked GETs woken by a 1 MiB "
           "SET: %s after %.0f MiB; job %.160s",
           closed_get ? (strstr(tail_get, "not reading its replies") ? "closed 'not reading its replies'" : "closed (no reason)") : "NOT closed",
           got_get / 1048576.0,
           closed_park ? (strstr(tail_park, "not reading its replies") ? "closed 'not reading its replies'" : "closed (no reason)") : "NOT closed",
           got_park / 1048576.0, after == 0 ? "ok" : j.err);
  row_emit(&w, &j, &sp);
  /* the ERR frame reaches a client that does not read only if it fits in
   * the socket; the store's log names it in any case */
  int logged = store_log_count(&sp, "not reading its replies");
  assert_true(closed_get);
  assert_true(closed_park);
  assert_non_null(strstr(tail_park, "not reading its replies"));
  assert_true(logged >= 1);
  assert_true(got_get < (64u << 20)); /* not all 600 MiB */
  assert_int_equal(0, after);
  check_rss(&w, 48);
  close(a.fd_get);
  close(a.fd_park);
  job_close(&j);
  store_stop(&sp, NULL, 0);
}

/* ---- 3. connections past the limit and out of descriptors ------------------------------ */

typedef struct flood_arg {
  int port, n;
  int ok, busy, none, connect_failed;
  char busy_msg[400];
} flood_arg;

static void flood_attack(void *p) {
  flood_arg *a = p;
  int *fds = calloc((size_t)a->n, sizeof *fds);
  for (int i = 0; i < a->n; i++) {
    fds[i] = raw_connect(a->port);
    if (fds[i] < 0) a->connect_failed++;
    else send_hello(fds[i], TOKEN, 0, 0); /* may fail: a refused connection is closed at once */
  }
  double end = bt_now() + 6.0;
  for (int i = 0; i < a->n; i++) {
    if (fds[i] < 0) continue;
    char msg[400];
    int left = (int)((end - bt_now()) * 1000);
    int t = read_reply(fds[i], msg, sizeof msg, left > 0 ? left : 1);
    if (t == NCFSM__F_OK) a->ok++;
    else if (t == NCFSM__F_ERR && strstr(msg, "store busy")) {
      a->busy++;
      snprintf(a->busy_msg, sizeof a->busy_msg, "%s", msg);
    } else a->none++;
  }
  for (int i = 0; i < a->n; i++)
    if (fds[i] >= 0) close(fds[i]);
  free(fds);
}

static void flood_case(const char *name, long nofile, int n, const char *max_conns_env) {
  store_proc sp;
  const char *env[] = {max_conns_env, NULL};
  store_spawn(&sp, max_conns_env ? env : NULL, nofile);
  job j;
  job_open(&j, sp.port, 2);
  assert_int_equal(0, job_round(&j));
  flood_arg a = {.port = sp.port, .n = n};
  double t0 = bt_now();
  run_beside(&j, flood_attack, &a);
  double dt = bt_now() - t0;
  usleep(200000);
  int after = job_round(&j);
  /* a new connection is served once the flood is gone */
  int nfd = raw_connect(sp.port);
  char nmsg[300];
  int late_t = nfd >= 0 && !send_hello(nfd, TOKEN, 0, 0) ? read_reply(nfd, nmsg, sizeof nmsg, 3000) : 0;
  if (nfd >= 0) close(nfd);
  int warns = store_log_count(&sp, "WARN");
  row w = {.attack = name};
  snprintf(w.outcome, sizeof w.outcome,
           "%d connections at ulimit -n %ld: %d served, %d refused 'store busy', %d no answer "
           "(%d connect failed) in %.1f s, %d WARN lines; job %.160s; then a new connection %s; e.g. "
           "\"%.120s\"",
           n, nofile, a.ok, a.busy, a.none, a.connect_failed, dt, warns, after == 0 ? "ok" : j.err,
           late_t == NCFSM__F_OK ? "served" : "NOT served", a.busy_msg);
  row_emit(&w, &j, &sp);
  assert_int_equal(0, a.none);
  assert_int_equal(0, a.connect_failed);
  assert_true(a.busy > 0);
  assert_int_equal(n, a.ok + a.busy);
  assert_int_equal(0, after);
  assert_true(warns < 40); /* rate-limited, not one per refusal */
  assert_int_equal(NCFSM__F_OK, late_t);
  job_close(&j);
  store_stop(&sp, NULL, 0);
}

static void test_conn_limit(void **state) {
  (void)state;
  if (issue_scale) flood_case("conn-limit", 1024, 1200, NULL);
  else flood_case("conn-limit", 256, 300, NULL);
}

static void test_out_of_fds(void **state) {
  (void)state;
  if (issue_scale) flood_case("out-of-fds", 1024, 1200, "NCFSM_STORE_MAX_CONNS=100000");
  else flood_case("out-of-fds", 256, 300, "NCFSM_STORE_MAX_CONNS=100000");
}

/* ---- 4. a rank disconnects or dies ------------------------------------------------------ */

/* Ranks 0 and 1 post; rank 2 of j goes away by close (how = 0) or is a
 * child process killed with SIGKILL (how = 1). */
static void gone_case(int how) {
  store_proc sp;
  store_spawn(&sp, NULL, 0);
  struct event_base *base = bt_base();
  ncfsm_boot *b[2] = {open_rank(base, sp.port, 0, 3, 15000), open_rank(base, sp.port, 1, 3, 15000)};
  ncfsm_boot *b2 = NULL;
  pid_t child = -1;
  int sync[2];
  assert_int_equal(0, pipe(sync));
  if (how == 0) {
    b2 = open_rank(base, sp.port, 2, 3, 15000);
  } else {
    child = live_child = fork();
    assert_true(child >= 0);
    if (child == 0) {
      struct event_base *cb = event_base_new();
      char addr[64];
      snprintf(addr, sizeof addr, "127.0.0.1:%d", sp.port);
      ncfsm_boot_opts o;
      ncfsm_boot_opts_init(&o);
      o.kind = NCFSM_BOOT_TCP;
      o.store_addr = addr;
      o.token = TOKEN;
      o.rank = 2;
      o.size = 3;
      ncfsm_boot *cbt;
      if (ncfsm_boot_open(cb, &o, &cbt) != NCFSM_OK) _exit(1);
      unsigned char s[16], r[48];
      bt_fill(s, 16, 2, 0);
      if (ncfsm_boot_allgather(cbt, s, r, 16) != NCFSM_OK) _exit(2);
      if (write(sync[1], "k", 1) != 1) _exit(3);
      for (;;) pause();
    }
  }
  /* round 0 with all three */
  unsigned char s[3][16], r[3][48];
  ncfsm_boot_req *req[3] = {0};
  for (int i = 0; i < 2; i++) {
    bt_fill(s[i], 16, i, 0);
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(b[i], s[i], r[i], 16, &req[i]));
  }
  if (b2) {
    bt_fill(s[2], 16, 2, 0);
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(b2, s[2], r[2], 16, &req[2]));
  }
  bt_wait_all(base, req, b2 ? 3 : 2);
  for (int i = 0; i < (b2 ? 3 : 2); i++) {
    assert_int_equal(NCFSM_OK, ncfsm_boot_test(req[i]));
    ncfsm_boot_req_free(req[i]);
  }
  if (child > 0) {
    char k;
    assert_int_equal(1, read(sync[0], &k, 1));
  }
  /* round 1: ranks 0 and 1 post, then rank 2 goes */
  for (int i = 0; i < 2; i++) {
    bt_fill(s[i], 16, i, 1);
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(b[i], s[i], r[i], 16, &req[i]));
  }
  event_base_loop(base, EVLOOP_NONBLOCK);
  usleep(50000);
  event_base_loop(base, EVLOOP_NONBLOCK);
  double t0 = bt_now();
  if (b2) assert_int_equal(NCFSM_OK, ncfsm_boot_close(b2));
  else kill(child, SIGKILL);
  bt_wait_all(base, req, 2);
  double dt = bt_now() - t0;
  ncfsm_result_t st[2] = {ncfsm_boot_test(req[0]), ncfsm_boot_test(req[1])};
  char e0[512];
  snprintf(e0, sizeof e0, "%s", ncfsm_boot_last_error(b[0]));
  for (int i = 0; i < 2; i++) ncfsm_boot_req_free(req[i]);
  /* rank 2 comes back: refused by name (rejoin is off) */
  ncfsm_boot *again = open_rank(base, sp.port, 2, 3, 5000);
  unsigned char s2[16] = {0}, r2[48];
  ncfsm_result_t again_r = ncfsm_boot_allgather(again, s2, r2, 16);
  char e2[512];
  snprintf(e2, sizeof e2, "%s", ncfsm_boot_last_error(again));
  ncfsm_boot_close(again);
  row w = {.attack = how ? "rank-killed" : "rank-closed"};
  snprintf(w.outcome, sizeof w.outcome,
           "ranks 0,1 failed %.1f ms after rank 2 %s: \"%.300s\"; rank 2 again: \"%.200s\"", dt * 1e3,
           how ? "was SIGKILLed" : "closed its bootstrap", e0,
           again_r == NCFSM_OK ? "accepted" : e2);
  row_emit(&w, NULL, &sp);
  if (child > 0) waitpid(child, NULL, 0);
  live_child = -1;
  close(sync[0]);
  close(sync[1]);
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, st[0]);
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, st[1]);
  assert_true(dt < 3.0); /* the store saw it: not the 15 s timeout */
  assert_non_null(strstr(e0, "rank 2"));
  assert_non_null(strstr(e0, "disconnected")); /* "before contributing", or "cannot complete" had
                                                  the GATHERs come after the close */
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, again_r);
  assert_non_null(strstr(e2, "cannot rejoin"));
  ncfsm_boot_close(b[0]);
  ncfsm_boot_close(b[1]);
  event_base_free(base);
  store_stop(&sp, NULL, 0);
}

static void test_rank_closed(void **state) {
  (void)state;
  gone_case(0);
}

static void test_rank_killed(void **state) {
  (void)state;
  gone_case(1);
}

/* With NCFSM_STORE_REJOIN=1 a rank whose connection ended may come back: the
 * allgather it left failed for the others; once it rejoins and they reopen
 * their bootstraps, the job runs again from allgather #0 (the failed #1
 * included). A rank reopens once the store has seen its old connection end
 * (rank 2 is told it was lost): else its new HELLO can reach the store first,
 * a second claim of a live rank (seen under ASan on a loaded machine). */
static unsigned rejoin_lost; /* the ranks rank 2's bootstrap was told were lost */
static void on_rejoin_lost(ncfsm_boot *b, int rank, const char *why, void *arg) {
  (void)b;
  (void)why;
  (void)arg;
  if (rank >= 0 && rank < 32) rejoin_lost |= 1u << rank;
}

static void test_rejoin_policy(void **state) {
  (void)state;
  store_proc sp;
  const char *env[] = {"NCFSM_STORE_REJOIN=1", NULL};
  store_spawn(&sp, env, 0);
  job j;
  job_open(&j, sp.port, 3);
  assert_int_equal(0, job_round(&j));
  unsigned char s[2][16], r[2][48];
  ncfsm_boot_req *req[2];
  for (int i = 0; i < 2; i++) {
    bt_fill(s[i], 16, i, 1);
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(j.b[i], s[i], r[i], 16, &req[i]));
  }
  /* their GATHERs must reach the store before rank 2 leaves: with rejoin on,
   * a GATHER posted after a rank left waits for it to come back */
  for (int k = 0; k < 5; k++) {
    event_base_loop(j.base, EVLOOP_NONBLOCK);
    usleep(20000);
  }
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(j.b[2]));
  bt_wait_all(j.base, req, 2);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_test(req[i]));
    ncfsm_boot_req_free(req[i]);
  }
  assert_non_null(strstr(ncfsm_boot_last_error(j.b[0]), "rank 2"));
  j.b[2] = open_rank(j.base, sp.port, 2, 3, 5000);
  rejoin_lost = 0;
  assert_int_equal(NCFSM_OK, ncfsm_boot_on_peer_lost(j.b[2], on_rejoin_lost, NULL));
  for (int q = 0; q < 2; q++) {
    assert_int_equal(NCFSM_OK, ncfsm_boot_close(j.b[q]));
    for (double t0 = bt_now(); !(rejoin_lost & (1u << q)) && bt_now() - t0 < 10;) bt_spin(j.base, 0.001);
    if (!(rejoin_lost & (1u << q))) fail_msg("rank 2 was not told that rank %d left", q);
    j.b[q] = open_rank(j.base, sp.port, q, 3, 5000);
  }
  assert_int_equal(NCFSM_OK, ncfsm_boot_on_peer_lost(j.b[2], NULL, NULL));
  j.round = 0;
  j.failed = 0;
  if (job_round(&j) != 0) fail_msg("allgather #0 after the rejoin: %s", j.err);
  if (job_round(&j) != 0) fail_msg("allgather #1 after the rejoin: %s", j.err);
  job_close(&j);
  store_stop(&sp, NULL, 0);
}

/* ---- 5. two connections claim one rank ---------------------------------------------------- */

static void test_impostor(void **state) {
  (void)state;
  store_proc sp;
  store_spawn(&sp, NULL, 0);
  struct event_base *base = bt_base();
  /* the impostor claims rank 1 first and contributes its bytes */
  ncfsm_boot *imp = open_rank(base, sp.port, 1, 3, 10000);
  ncfsm_boot *b0 = open_rank(base, sp.port, 0, 3, 10000), *b2 = open_rank(base, sp.port, 2, 3, 10000);
  unsigned char evil[16], s0[16], s1[16], s2[16], ri[48], r0[48], r1[48], r2[48];
  memset(evil, 0xEE, sizeof evil);
  bt_fill(s0, 16, 0, 0);
  bt_fill(s1, 16, 1, 0);
  bt_fill(s2, 16, 2, 0);
  ncfsm_boot_req *req[4] = {0};
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(imp, evil, ri, 16, &req[0]));
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(b0, s0, r0, 16, &req[1]));
  for (int i = 0; i < 20; i++) event_base_loop(base, EVLOOP_NONBLOCK), usleep(5000);
  /* the real rank 1 arrives; rank 2 contributes last */
  ncfsm_boot *b1 = open_rank(base, sp.port, 1, 3, 10000);
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(b1, s1, r1, 16, &req[2]));
  for (int i = 0; i < 20; i++) event_base_loop(base, EVLOOP_NONBLOCK), usleep(5000);
  double t0 = bt_now();
  ncfsm_result_t p2 = ncfsm_boot_allgather_post(b2, s2, r2, 16, &req[3]);
  bt_wait_all(base, req, p2 == NCFSM_OK ? 4 : 3);
  double dt = bt_now() - t0;
  ncfsm_result_t st[4];
  for (int i = 0; i < 4; i++) st[i] = req[i] ? ncfsm_boot_test(req[i]) : p2;
  int delivered = (st[1] == NCFSM_OK && !memcmp(r0 + 16, evil, 16)) ||
                  (st[3] == NCFSM_OK && !memcmp(r2 + 16, evil, 16));
  char e0[512], e1[512];
  snprintf(e0, sizeof e0, "%s", ncfsm_boot_last_error(b0));
  snprintf(e1, sizeof e1, "%s", ncfsm_boot_last_error(b1));
  row w = {.attack = "impostor"};
  snprintf(w.outcome, sizeof w.outcome,
           "impostor rank 1 first, real rank 1 second: impostor %s, rank 0 %s, real rank 1 %s, rank 2 "
           "%s; impostor's bytes %s; rank 0: \"%.160s\"",
           ncfsm_strerror(st[0]), ncfsm_strerror(st[1]), ncfsm_strerror(st[2]), ncfsm_strerror(st[3]),
           delivered ? "DELIVERED" : "not delivered", e0);
  row_emit(&w, NULL, &sp);
  for (int i = 0; i < 4; i++)
    if (req[i]) ncfsm_boot_req_free(req[i]);
  assert_false(delivered);
  for (int i = 0; i < 4; i++) assert_int_equal(NCFSM_ERR_BOOTSTRAP, st[i]);
  assert_non_null(strstr(e0, "claimed by two connections"));
  assert_non_null(strstr(e1, "claimed by two connections"));
  assert_true(dt < 3.0);
  ncfsm_boot_close(imp);
  ncfsm_boot_close(b0);
  ncfsm_boot_close(b1);
  ncfsm_boot_close(b2);
  event_base_free(base);
  store_stop(&sp, NULL, 0);
}

/* With per-rank secrets (NCFSM_STORE_RANK_SECRETS=1) an impostor that holds
 * another rank's secret cannot claim rank 1 at all, even first: the job runs
 * with the real rank 1's bytes. */
static void test_impostor_rank_secrets(void **state) {
  (void)state;
  store_proc sp;
  const char *env[] = {"NCFSM_STORE_RANK_SECRETS=1", NULL};
  store_spawn(&sp, env, 0);
  struct event_base *base = bt_base();
  char sec[3][65], addr[64];
  for (int r = 0; r < 3; r++) ncfsm_boot_rank_secret(TOKEN, r, 3, sec[r]);
  snprintf(addr, sizeof addr, "127.0.0.1:%d", sp.port);
  ncfsm_boot *b[4];
  for (int i = 0; i < 4; i++) { /* 0: the impostor, rank 1 with rank 2's secret; then ranks 0..2 */
    ncfsm_boot_opts o;
    ncfsm_boot_opts_init(&o);
    o.kind = NCFSM_BOOT_TCP;
    o.store_addr = addr;
    o.token = NULL;
    o.rank = i == 0 ? 1 : i - 1;
    o.size = 3;
    o.rank_secret = i == 0 ? sec[2] : sec[i - 1];
    o.timeout_ms = 10000;
    assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, &o, &b[i]));
  }
  unsigned char send[4][16], recv[4][48];
  ncfsm_boot_req *req[4];
  memset(send[0], 0xEE, 16);
  for (int i = 1; i < 4; i++) bt_fill(send[i], 16, i - 1, 0);
  for (int i = 0; i < 4; i++)
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(b[i], send[i], recv[i], 16, &req[i]));
  bt_wait_all(base, req, 4);
  ncfsm_result_t st[4];
  for (int i = 0; i < 4; i++) st[i] = ncfsm_boot_test(req[i]);
  char e[512];
  snprintf(e, sizeof e, "%s", ncfsm_boot_last_error(b[0]));
  row w = {.attack = "impostor-secrets"};
  snprintf(w.outcome, sizeof w.outcome,
           "with per-rank secrets, an impostor holding rank 2's secret claims rank 1: impostor %s "
           "(\"%.200s\"); ranks 0, 1, 2: %s, %s, %s",
           ncfsm_strerror(st[0]), e, ncfsm_strerror(st[1]), ncfsm_strerror(st[2]),
           ncfsm_strerror(st[3]));
  row_emit(&w, NULL, &sp);
  for (int i = 0; i < 4; i++) ncfsm_boot_req_free(req[i]);
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, st[0]);
  assert_non_null(strstr(e, "did not carry that rank's"));
  for (int i = 1; i < 4; i++) {
    assert_int_equal(NCFSM_OK, st[i]);
    bt_check(recv[i], 16, 3, 0);
  }
  for (int i = 3; i >= 0; i--) ncfsm_boot_close(b[i]);
  event_base_free(base);
  store_stop(&sp, NULL, 0);
}

/* ---- 6. failed authentication, throttled per address ---------------------------------------- */

typedef struct hello_arg {
  int port, n;
  double secs;
  int bad, throttled, other;
} hello_arg;

static void hello_attack(void *p) {
  hello_arg *a = p;
  double t0 = bt_now();
  for (int i = 0; i < a->n && bt_now() - t0 < 5.0; i++) {
    int fd = raw_connect(a->port);
    char msg[400];
    int t = fd >= 0 && !send_hello(fd, "wrong-token", 0, 0) ? read_reply(fd, msg, sizeof msg, 3000) : 0;
    if (t == NCFSM__F_ERR && strstr(msg, "bad token")) a->bad++;
    else if (t == NCFSM__F_ERR && strstr(msg, "throttled")) a->throttled++;
    else a->other++;
    if (fd >= 0) close(fd);
  }
  a->secs = bt_now() - t0;
}

static void test_auth_throttle(void **state) {
  (void)state;
  store_proc sp;
  store_spawn(&sp, NULL, 0);
  job j;
  job_open(&j, sp.port, 2);
  assert_int_equal(0, job_round(&j));
  hello_arg a = {.port = sp.port, .n = 2000};
  run_beside(&j, hello_attack, &a);
  /* a rank joining right after the attack: throttled, retries, gets in */
  double t0 = bt_now();
  ncfsm_boot *late = open_rank(j.base, sp.port, 0, 1, 10000);
  int x = 5, y = 0;
  ncfsm_result_t lr = ncfsm_boot_allgather(late, &x, &y, sizeof x);
  double late_s = bt_now() - t0;
  char le[300];
  snprintf(le, sizeof le, "%s", ncfsm_boot_last_error(late));
  ncfsm_boot_close(late);
  row w = {.attack = "bad-hellos"};
  /* default limits: a burst of 10, then 2 per second */
  int allowed = 10 + (int)(2 * a.secs) + 2;
  snprintf(w.outcome, sizeof w.outcome,
           "%d wrong-token HELLOs in %.2f s: %d checked ('bad token'), %d refused 'throttled', %d "
           "other; a correct rank joining after it: %s in %.2f s",
           a.bad + a.throttled + a.other, a.secs, a.bad, a.throttled, a.other,
           lr == NCFSM_OK ? "in" : le, late_s);
  row_emit(&w, &j, &sp);
  assert_true(a.bad <= allowed);
  assert_true(a.throttled > 0);
  assert_int_equal(0, a.other);
  /* the late rank's size (1) differs from the job's (2): refused by name */
  assert_non_null(strstr(le, "ranks"));
  assert_false(j.failed);
  job_close(&j);
  store_stop(&sp, NULL, 0);
}

/* Like BT_TEST, with room for the issue's scale (default limits: a 60 s stall). */
static int at_setup(void **state) {
  (void)state;
  alarm(issue_scale ? 300 : 60);
  return 0;
}
static int at_teardown(void **state) {
  (void)state;
  pid_t left[2] = {live_store, live_child};
  for (int i = 0; i < 2; i++)
    if (left[i] > 0) {
      kill(left[i], SIGKILL);
      waitpid(left[i], NULL, 0);
    }
  live_store = live_child = -1;
  alarm(0);
  return 0;
}
#define AT_TEST(f) cmocka_unit_test_setup_teardown(f, at_setup, at_teardown)

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    fprintf(stderr, "usage: test_store_attacks STORE_BINARY [TEST_NAME_FILTER]\n");
    return 2;
  }
  store_bin = argv[1];
  const char *sc = getenv("STORE_ATTACKS_SCALE");
  issue_scale = sc && !strcmp(sc, "issue");
  if (argc > 2) cmocka_set_test_filter(argv[2]);
  const struct CMUnitTest tests[] = {
      AT_TEST(test_rank_killed), /* first: it forks */
      AT_TEST(test_rank_closed),
      AT_TEST(test_rejoin_policy),
      AT_TEST(test_impostor),
      AT_TEST(test_impostor_rank_secrets),
      AT_TEST(test_slow_frames),
      AT_TEST(test_unread_replies),
      AT_TEST(test_conn_limit),
      AT_TEST(test_out_of_fds),
      AT_TEST(test_auth_throttle),
  };
  return cmocka_run_group_tests_name("bootstrap_store_attacks", tests, NULL, NULL);
}
