/*
 * Recovery from dead ranks over the tcp store (issue 10, item 5): peer-loss
 * callbacks, the survivor agreement and the survivors' bootstrap, with four
 * ranks as separate processes (fork) and a standalone ncfsm-store process
 * (argv[1]). A "dead" rank is SIGKILLed.
 *
 *   test_recovery STORE_BINARY [TEST_NAME_FILTER]
 *
 * Each rank runs its part of a scenario in a child process and reports lines
 * on a pipe ("lost <t>", "agree_ms <ms>", "FAIL <why>", "ok"); the parent
 * kills ranks at the scenario's points (it sends a byte on a rank's command
 * pipe to let it go on) and checks the lines. Times are CLOCK_MONOTONIC,
 * which is one clock for every process of the machine.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "tests/bootstrap/boot_test.h"

#define TOKEN "recovery-test-token-0123456789"
#define N 4

static const char *store_bin;
static pid_t live_store = -1, live_rank[N] = {-1, -1, -1, -1};

/* ---- the store process ------------------------------------------------------ */

typedef struct store_proc {
  pid_t pid;
  int port;
  char errpath[96];
} store_proc;

static void store_spawn(store_proc *sp) {
  static int n;
  memset(sp, 0, sizeof *sp);
  snprintf(sp->errpath, sizeof sp->errpath, "/tmp/ncfsm-recovery-%d-%d.err", (int)getpid(), n++);
  int p[2];
  assert_int_equal(0, pipe(p));
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(p[1], 1);
    int fd = open(sp->errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) dup2(fd, 2);
    setenv("NCFSM_STORE_TOKEN", TOKEN, 1);
    setenv("NCFSM_DEBUG", "INFO", 1);
    unsetenv("NCFSM_STORE_ADDR");
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
}

/* SIGTERM; it must exit 0 with no sanitizer report. Its "stopping:" line
 * goes to stats. */
static void store_stop(store_proc *sp, char *stats, size_t n) {
  live_store = -1;
  kill(sp->pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 500 && waitpid(sp->pid, &status, WNOHANG) == 0; i++) usleep(10000);
  if (waitpid(sp->pid, &status, WNOHANG) == 0) {
    kill(sp->pid, SIGKILL);
    waitpid(sp->pid, &status, 0);
  }
  FILE *f = fopen(sp->errpath, "r");
  char line[2048];
  int bad = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  if (stats) stats[0] = 0;
  while (f && fgets(line, sizeof line, f)) {
    if (stats && strstr(line, "stopping:")) snprintf(stats, n, "%s", line);
    if (strstr(line, "runtime error:") || strstr(line, "Sanitizer")) bad = 1;
  }
  if (f) fclose(f);
  if (bad) {
    fprintf(stderr, "---- the store did not stop cleanly (status 0x%x); its log:\n", status);
    f = fopen(sp->errpath, "r");
    while (f && fgets(line, sizeof line, f)) fputs(line, stderr);
    if (f) fclose(f);
  }
  unlink(sp->errpath);
  if (bad) fail_msg("the store exited with status 0x%x or reported a sanitizer error", status);
}

/* ---- a rank process ------------------------------------------------------------ */

typedef struct rctx {
  int rank, port;
  uint64_t timeout_ms;
  int rep, cmd; /* report pipe (write), command pipe (read) */
  struct event_base *base;
  ncfsm_boot *b;
  unsigned lost_mask;
  double lost_at[N];
  char lost_why[N][400];
} rctx;

static void say(rctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(rctx *c, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
  for (int i = 0; i < n; i++)
    if (line[i] == '\n') line[i] = ' ';
  line[n++] = '\n';
  ssize_t w = write(c->rep, line, (size_t)n);
  (void)w;
}

#define CHILD_CHECK(c, cond, ...)  \
  do {                             \
    if (!(cond)) {                 \
      say((c), "FAIL " __VA_ARGS__); \
      _exit(1);                    \
    }                              \
  } while (0)

static void child_lost(ncfsm_boot *b, int rank, const char *why, void *arg) {
  rctx *c = arg;
  (void)b;
  if (rank < 0 || rank >= N) return;
  c->lost_at[rank] = bt_now();
  snprintf(c->lost_why[rank], sizeof c->lost_why[rank], "%s", why);
  c->lost_mask |= 1u << rank;
}

static int cmd_byte;
static void cmd_cb(evutil_socket_t fd, short what, void *arg) {
  (void)what;
  (void)arg;
  char ch;
  cmd_byte = read(fd, &ch, 1) == 1 ? ch : -1;
}

/* Run the loop until the parent sends a byte. */
static int wait_cmd(rctx *c) {
  cmd_byte = 0;
  struct event *ev = event_new(c->base, c->cmd, EV_READ, cmd_cb, NULL);
  event_add(ev, NULL);
  while (!cmd_byte) event_base_loop(c->base, EVLOOP_ONCE);
  event_free(ev);
  return cmd_byte;
}

static void wait_lost(rctx *c, unsigned want, double secs) {
  double t0 = bt_now();
  while ((c->lost_mask & want) != want && bt_now() - t0 < secs) bt_spin(c->base, 0.005);
  CHILD_CHECK(c, (c->lost_mask & want) == want, "rank %d: lost mask 0x%x, wanted 0x%x after %.1f s",
              c->rank, c->lost_mask, want, secs);
}

static ncfsm_boot_req *agree(rctx *c, ncfsm_boot *b, uint64_t epoch, ncfsm_result_t *st, double *ms) {
  ncfsm_boot_req *req;
  CHILD_CHECK(c, ncfsm_boot_agree_post(b, epoch, &req) == NCFSM_OK, "rank %d: agree_post: %s",
              c->rank, ncfsm_boot_last_error(b));
  double t0 = bt_now();
  *st = bt_wait(c->base, req, 30);
  *ms = (bt_now() - t0) * 1e3;
  return req;
}

static void check_alive(rctx *c, ncfsm_boot_req *req, int size, unsigned want) {
  uint8_t alive[N];
  int n = -1;
  CHILD_CHECK(c, ncfsm_boot_agree_result(req, alive, &n) == NCFSM_OK, "rank %d: agree_result",
              c->rank);
  unsigned got = 0;
  for (int i = 0; i < size; i++) got |= alive[i] ? 1u << i : 0;
  CHILD_CHECK(c, got == want && n == __builtin_popcount(want),
              "rank %d: agreement result 0x%x (%d ranks), expected 0x%x", c->rank, got, n, want);
}

/* An allgather of 32 bytes on the survivors' bootstrap s, checked. */
static void child_round(rctx *c, ncfsm_boot *s, int want_rank, int want_size, int k) {
  CHILD_CHECK(c, ncfsm_boot_rank(s) == want_rank && ncfsm_boot_size(s) == want_size,
              "rank %d: survivors' rank/size %d/%d, expected %d/%d", c->rank, ncfsm_boot_rank(s),
              ncfsm_boot_size(s), want_rank, want_size);
  unsigned char send[32], recv[32 * N];
  bt_fill(send, 32, want_rank, k);
  ncfsm_boot_req *req;
  CHILD_CHECK(c, ncfsm_boot_allgather_post(s, send, recv, 32, &req) == NCFSM_OK, "rank %d: post: %s",
              c->rank, ncfsm_boot_last_error(s));
  ncfsm_result_t r = bt_wait(c->base, req, 20);
  ncfsm_boot_req_free(req);
  CHILD_CHECK(c, r == NCFSM_OK, "rank %d: survivors' allgather: %s", c->rank, ncfsm_boot_last_error(s));
  for (int q = 0; q < want_size; q++) {
    unsigned char want[32];
    bt_fill(want, 32, q, k);
    CHILD_CHECK(c, !memcmp(recv + q * 32, want, 32), "rank %d: survivors' allgather slot %d wrong",
                c->rank, q);
  }
}

static const char *rname(ncfsm_result_t r) {
  return r == NCFSM_OK ? "NCFSM_OK" : r == NCFSM_ERR_BOOTSTRAP ? "NCFSM_ERR_BOOTSTRAP" : ncfsm_strerror(r);
}

typedef void (*scenario_fn)(rctx *c);

/* Fork rank r: open the bootstrap, register the peer-lost callback, a
 * barrier of all N, then the scenario; "ok" and exit 0 at its end. */
static void spawn_ranks(int port, uint64_t timeout_ms, scenario_fn fn, int rep[N], int cmd[N]) {
  for (int r = 0; r < N; r++) {
    int pr[2], pc[2];
    assert_int_equal(0, pipe(pr));
    assert_int_equal(0, pipe(pc));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(pr[0]);
      close(pc[1]);
      for (int q = 0; q < r; q++) {
        close(rep[q]);
        close(cmd[q]);
      }
      rctx c;
      memset(&c, 0, sizeof c);
      c.rank = r;
      c.port = port;
      c.timeout_ms = timeout_ms;
      c.rep = pr[1];
      c.cmd = pc[0];
      c.base = event_base_new();
      char addr[64];
      snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
      ncfsm_boot_opts o;
      ncfsm_boot_opts_init(&o);
      o.kind = NCFSM_BOOT_TCP;
      o.store_addr = addr;
      o.token = TOKEN;
      o.rank = r;
      o.size = N;
      o.timeout_ms = timeout_ms;
      CHILD_CHECK(&c, ncfsm_boot_open(c.base, &o, &c.b) == NCFSM_OK, "rank %d: open: %s", r,
                  ncfsm_boot_open_error());
      CHILD_CHECK(&c, ncfsm_boot_on_peer_lost(c.b, child_lost, &c) == NCFSM_OK, "on_peer_lost");
      ncfsm_boot_req *bar;
      CHILD_CHECK(&c, ncfsm_boot_barrier_post(c.b, &bar) == NCFSM_OK, "barrier");
      CHILD_CHECK(&c, bt_wait(c.base, bar, 20) == NCFSM_OK, "rank %d: barrier: %s", r,
                  ncfsm_boot_last_error(c.b));
      ncfsm_boot_req_free(bar);
      fn(&c);
      say(&c, "ok");
      _exit(0);
    }
    close(pr[1]);
    close(pc[0]);
    rep[r] = pr[0];
    cmd[r] = pc[1];
    live_rank[r] = pid;
  }
}

/* ---- the parent's side ------------------------------------------------------------ */

typedef struct lines {
  char buf[8192];
  size_t n;
} lines;
static lines rl[N];

/* The next line of rank r starting with prefix (other lines are skipped, a
 * FAIL line fails the test), within secs. */
static const char *expect(int rep[N], int r, const char *prefix, double secs) {
  static char line[1024];
  double t0 = bt_now();
  for (;;) {
    char *nl = memchr(rl[r].buf, '\n', rl[r].n);
    if (nl) {
      size_t len = (size_t)(nl - rl[r].buf);
      snprintf(line, sizeof line, "%.*s", (int)len, rl[r].buf);
      memmove(rl[r].buf, nl + 1, rl[r].n - len - 1);
      rl[r].n -= len + 1;
      if (!strncmp(line, "FAIL", 4)) fail_msg("rank %d: %s", r, line);
      if (!strncmp(line, prefix, strlen(prefix))) return line;
      continue;
    }
    double left = secs - (bt_now() - t0);
    struct pollfd pf = {rep[r], POLLIN, 0};
    if (left <= 0 || poll(&pf, 1, (int)(left * 1000) + 1) != 1)
      fail_msg("rank %d: no '%s' line within %.1f s", r, prefix, secs);
    ssize_t got = read(rep[r], rl[r].buf + rl[r].n, sizeof rl[r].buf - rl[r].n - 1);
    if (got <= 0) fail_msg("rank %d: exited before '%s'", r, prefix);
    rl[r].n += (size_t)got;
  }
}

static void send_cmd(int cmd[N], int r, char ch) {
  assert_int_equal(1, write(cmd[r], &ch, 1));
}

static void reap(int rep[N], int cmd[N]) {
  for (int r = 0; r < N; r++) {
    if (live_rank[r] > 0) {
      int st = 0;
      double t0 = bt_now();
      while (waitpid(live_rank[r], &st, WNOHANG) == 0 && bt_now() - t0 < 10) usleep(5000);
      if (waitpid(live_rank[r], &st, WNOHANG) == 0) {
        kill(live_rank[r], SIGKILL);
        waitpid(live_rank[r], &st, 0);
      }
      live_rank[r] = -1;
    }
    close(rep[r]);
    close(cmd[r]);
    rl[r].n = 0;
  }
}

static void kill_rank(int r) {
  kill(live_rank[r], SIGKILL);
  waitpid(live_rank[r], NULL, 0);
  live_rank[r] = -1;
}

/* ---- 1. a rank is killed: told, agree, survivors' allgather ------------------------- */

static void sc_killed(rctx *c) {
  if (c->rank == 2) {
    say(c, "ready");
    for (;;) pause();
  }
  int x = c->rank * 10, all[N];
  ncfsm_boot_req *ag;
  CHILD_CHECK(c, ncfsm_boot_allgather_post(c->b, &x, all, sizeof x, &ag) == NCFSM_OK, "post");
  say(c, "ready");
  wait_lost(c, 1u << 2, 8);
  say(c, "lost %.6f %s", c->lost_at[2], c->lost_why[2]);
  ncfsm_result_t r = bt_wait(c->base, ag, 10);
  say(c, "allgather %s %s", rname(r), ncfsm_boot_last_error(c->b));
  ncfsm_boot_req_free(ag);
  double ms;
  ncfsm_boot_req *req = agree(c, c->b, 1, &r, &ms);
  CHILD_CHECK(c, r == NCFSM_OK, "rank %d: agreement: %s", c->rank, ncfsm_boot_last_error(c->b));
  check_alive(c, req, N, 0xB);
  say(c, "agree_ms %.3f", ms);
  ncfsm_boot *s;
  CHILD_CHECK(c, ncfsm_boot_survivors(c->b, req, &s) == NCFSM_OK, "survivors: %s",
              ncfsm_boot_last_error(c->b));
  ncfsm_boot_req_free(req);
  child_round(c, s, c->rank == 3 ? 2 : c->rank, 3, 1);
  child_round(c, s, c->rank == 3 ? 2 : c->rank, 3, 2);
  CHILD_CHECK(c, ncfsm_boot_close(s) == NCFSM_OK, "close survivors");
  /* the parent still fails its allgathers, by name */
  CHILD_CHECK(c, ncfsm_boot_allgather(c->b, &x, all, sizeof x) == NCFSM_ERR_BOOTSTRAP &&
                     strstr(ncfsm_boot_last_error(c->b), "rank 2"),
              "rank %d: parent allgather after the loss: %s", c->rank, ncfsm_boot_last_error(c->b));
  /* everyone done before anyone closes (a close is a loss for the others) */
  say(c, "done");
  wait_cmd(c);
  CHILD_CHECK(c, ncfsm_boot_close(c->b) == NCFSM_OK, "close");
}

static void test_killed_rank(void **state) {
  (void)state;
  store_proc sp;
  store_spawn(&sp);
  int rep[N], cmd[N];
  spawn_ranks(sp.port, 10000, sc_killed, rep, cmd);
  for (int r = 0; r < N; r++) expect(rep, r, "ready", 20);
  usleep(100000); /* the allgathers of 0, 1, 3 reach the store */
  double t_kill = bt_now();
  kill_rank(2);
  const int surv[3] = {0, 1, 3};
  for (int i = 0; i < 3; i++) {
    int r = surv[i];
    const char *l = expect(rep, r, "lost ", 10);
    double t = atof(l + 5);
    print_message("tcp: rank %d told of rank 2's SIGKILL after %.3f ms: %s\n", r, (t - t_kill) * 1e3,
                  strchr(l + 5, ' ') + 1);
    assert_true(t - t_kill < 5.0);
    assert_non_null(strstr(l, "rank 2"));
    l = expect(rep, r, "allgather ", 10);
    assert_non_null(strstr(l, "rank 2"));
    assert_non_null(strstr(l, "NCFSM_ERR_BOOTSTRAP"));
    l = expect(rep, r, "agree_ms ", 10);
    print_message("tcp: rank %d agreement (3 survivors) took %s ms\n", r, l + 9);
  }
  for (int i = 0; i < 3; i++) expect(rep, surv[i], "done", 20);
  for (int i = 0; i < 3; i++) send_cmd(cmd, surv[i], 'c');
  for (int i = 0; i < 3; i++) expect(rep, surv[i], "ok", 20);
  reap(rep, cmd);
  char stats[2048];
  store_stop(&sp, stats, sizeof stats);
}

/* ---- 2. a live rank does not post: named after the timeout; a retry works ----------- */

static void sc_silent(rctx *c) {
  double ms;
  ncfsm_result_t r;
  if (c->rank != 2) {
    ncfsm_boot_req *req = agree(c, c->b, 1, &r, &ms);
    ncfsm_boot_req_free(req);
    say(c, "failed %.3f %s %s", ms, rname(r), ncfsm_boot_last_error(c->b));
  }
  wait_cmd(c);
  ncfsm_boot_req *req = agree(c, c->b, 2, &r, &ms);
  CHILD_CHECK(c, r == NCFSM_OK, "rank %d: epoch 2: %s", c->rank, ncfsm_boot_last_error(c->b));
  check_alive(c, req, N, 0xF);
  ncfsm_boot_req_free(req);
  say(c, "done");
  wait_cmd(c);
  ncfsm_boot_close(c->b);
}

static void test_silent_rank_times_out(void **state) {
  (void)state;
  store_proc sp;
  store_spawn(&sp);
  int rep[N], cmd[N];
  spawn_ranks(sp.port, 1500, sc_silent, rep, cmd);
  const int posters[3] = {0, 1, 3};
  for (int i = 0; i < 3; i++) {
    const char *l = expect(rep, posters[i], "failed ", 20);
    double ms = atof(l + 7);
    print_message("tcp: rank %d: agreement without rank 2 failed after %.0f ms: %s\n", posters[i], ms,
                  strchr(l + 7, ' ') + 1);
    assert_non_null(strstr(l, "NCFSM_ERR_BOOTSTRAP"));
    assert_non_null(strstr(l, "rank 2 did not post"));
    assert_true(ms > 1000 && ms < 5000);
  }
  for (int r = 0; r < N; r++) send_cmd(cmd, r, 'g');
  for (int r = 0; r < N; r++) expect(rep, r, "done", 20);
  for (int r = 0; r < N; r++) send_cmd(cmd, r, 'c');
  for (int r = 0; r < N; r++) expect(rep, r, "ok", 20);
  reap(rep, cmd);
  store_stop(&sp, NULL, 0);
}

/* ---- 3. a second death during the agreement; nested agreement ----------------------- */

static void sc_second(rctx *c) {
  if (c->rank == 3) {
    say(c, "ready");
    for (;;) pause();
  }
  wait_lost(c, 1u << 3, 8);
  if (c->rank == 2) {
    say(c, "posted"); /* lives, does not post, and is killed during the agreement */
    for (;;) pause();
  }
  ncfsm_boot_req *req;
  CHILD_CHECK(c, ncfsm_boot_agree_post(c->b, 5, &req) == NCFSM_OK, "agree_post");
  say(c, "posted");
  double t0 = bt_now();
  ncfsm_result_t r = bt_wait(c->base, req, 20);
  CHILD_CHECK(c, r == NCFSM_OK, "rank %d: agreement: %s", c->rank, ncfsm_boot_last_error(c->b));
  say(c, "agreed %.6f", bt_now());
  (void)t0;
  check_alive(c, req, N, 0x3);
  wait_lost(c, 1u << 2, 5);
  ncfsm_boot *s, *s2;
  CHILD_CHECK(c, ncfsm_boot_survivors(c->b, req, &s) == NCFSM_OK, "survivors");
  ncfsm_boot_req_free(req);
  CHILD_CHECK(c, ncfsm_boot_close(c->b) == NCFSM_ERR_BUSY, "parent closed before its survivors'");
  child_round(c, s, c->rank, 2, 3);
  double ms;
  ncfsm_boot_req *nested = agree(c, s, 1, &r, &ms); /* its own epochs */
  CHILD_CHECK(c, r == NCFSM_OK, "rank %d: nested agreement: %s", c->rank, ncfsm_boot_last_error(s));
  check_alive(c, nested, 2, 0x3);
  CHILD_CHECK(c, ncfsm_boot_survivors(s, nested, &s2) == NCFSM_OK, "nested survivors: %s",
              ncfsm_boot_last_error(s));
  ncfsm_boot_req_free(nested);
  child_round(c, s2, c->rank, 2, 4);
  say(c, "done");
  wait_cmd(c);
  CHILD_CHECK(c, ncfsm_boot_close(s2) == NCFSM_OK && ncfsm_boot_close(s) == NCFSM_OK &&
                     ncfsm_boot_close(c->b) == NCFSM_OK,
              "closes");
}

static void test_second_death_during_agreement(void **state) {
  (void)state;
  store_proc sp;
  store_spawn(&sp);
  int rep[N], cmd[N];
  spawn_ranks(sp.port, 10000, sc_second, rep, cmd);
  expect(rep, 3, "ready", 20);
  kill_rank(3);
  for (int r = 0; r < 3; r++) expect(rep, r, "posted", 20);
  usleep(100000); /* the AGREEs of 0 and 1 reach the store */
  double t_kill = bt_now();
  kill_rank(2);
  for (int r = 0; r < 2; r++) {
    const char *l = expect(rep, r, "agreed ", 10);
    print_message("tcp: rank %d: agreement done %.3f ms after rank 2 was killed during it\n", r,
                  (atof(l + 7) - t_kill) * 1e3);
    assert_true(atof(l + 7) - t_kill < 5.0);
  }
  for (int r = 0; r < 2; r++) expect(rep, r, "done", 20);
  for (int r = 0; r < 2; r++) send_cmd(cmd, r, 'c');
  for (int r = 0; r < 2; r++) expect(rep, r, "ok", 20);
  reap(rep, cmd);
  store_stop(&sp, NULL, 0);
}

/* ---- 4. epochs that differ ---------------------------------------------------------- */

static void sc_epochs(rctx *c) {
  if (c->rank >= 2) wait_cmd(c);
  ncfsm_boot_req *req;
  CHILD_CHECK(c, ncfsm_boot_agree_post(c->b, c->rank == 2 ? 2 : 1, &req) == NCFSM_OK, "agree_post");
  say(c, "posted");
  ncfsm_result_t r = bt_wait(c->base, req, 20);
  ncfsm_boot_req_free(req);
  say(c, "failed %s %s", rname(r), ncfsm_boot_last_error(c->b));
  wait_cmd(c);
  double ms;
  req = agree(c, c->b, 3, &r, &ms);
  CHILD_CHECK(c, r == NCFSM_OK, "rank %d: epoch 3: %s", c->rank, ncfsm_boot_last_error(c->b));
  check_alive(c, req, N, 0xF);
  ncfsm_boot_req_free(req);
  say(c, "done");
  wait_cmd(c);
  ncfsm_boot_close(c->b);
}

static void test_epochs_differ(void **state) {
  (void)state;
  store_proc sp;
  store_spawn(&sp);
  int rep[N], cmd[N];
  spawn_ranks(sp.port, 10000, sc_epochs, rep, cmd);
  expect(rep, 0, "posted", 20);
  expect(rep, 1, "posted", 20);
  usleep(100000);
  send_cmd(cmd, 2, 'g'); /* epoch 2 while 0 and 1 wait in epoch 1 */
  expect(rep, 2, "posted", 20);
  usleep(100000);
  send_cmd(cmd, 3, 'g'); /* epoch 1 after that */
  for (int r = 0; r < N; r++) {
    const char *l = expect(rep, r, "failed ", 20);
    print_message("tcp: rank %d: %s\n", r, l + 7);
    assert_non_null(strstr(l, "NCFSM_ERR_BOOTSTRAP"));
    assert_non_null(strstr(l, "epochs differ"));
  }
  for (int r = 0; r < N; r++) send_cmd(cmd, r, 'g');
  for (int r = 0; r < N; r++) expect(rep, r, "done", 20);
  for (int r = 0; r < N; r++) send_cmd(cmd, r, 'c');
  for (int r = 0; r < N; r++) expect(rep, r, "ok", 20);
  reap(rep, cmd);
  store_stop(&sp, NULL, 0);
}

/* ---- 5. in one process: registration after the loss, a late rank, misuse ------------ */

static int cb_n, cb_rank;
static char cb_why[400];
static void count_cb(ncfsm_boot *b, int rank, const char *why, void *arg) {
  (void)b;
  (void)arg;
  cb_n++;
  cb_rank = rank;
  snprintf(cb_why, sizeof cb_why, "%s", why);
}

static ncfsm_boot *open_rank(struct event_base *base, int port, int rank, int size) {
  return bt_open_tcp(base, port, rank, size, TOKEN, NULL, 5000);
}

static void test_one_process_rules(void **state) {
  (void)state;
  store_proc sp;
  store_spawn(&sp);
  struct event_base *base = bt_base();
  ncfsm_boot *b[3];
  for (int r = 0; r < 3; r++) b[r] = open_rank(base, sp.port, r, 3);
  ncfsm_boot_req *q[3];
  for (int r = 0; r < 3; r++) assert_int_equal(NCFSM_OK, ncfsm_boot_barrier_post(b[r], &q[r]));
  bt_wait_all(base, q, 3);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(NCFSM_OK, ncfsm_boot_test(q[r]));
    ncfsm_boot_req_free(q[r]);
  }
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b[1])); /* rank 1 closes: lost for the others */
  bt_spin(base, 0.2);
  cb_n = 0;
  assert_int_equal(NCFSM_OK, ncfsm_boot_on_peer_lost(b[0], count_cb, NULL)); /* after the loss */
  bt_spin(base, 0.05);
  assert_int_equal(1, cb_n);
  assert_int_equal(1, cb_rank);
  assert_non_null(strstr(cb_why, "rank 1"));
  /* rank 2's agreement and rank 0's: {0, 2} */
  ncfsm_boot_req *a0, *a2, *bad;
  assert_int_equal(NCFSM_ERR_INVALID_ARGUMENT, ncfsm_boot_agree_post(b[0], 0, &bad));
  assert_int_equal(NCFSM_OK, ncfsm_boot_agree_post(b[0], 9, &a0));
  assert_int_equal(NCFSM_ERR_BUSY, ncfsm_boot_agree_post(b[0], 10, &bad));
  assert_int_equal(NCFSM_OK, ncfsm_boot_agree_post(b[2], 9, &a2));
  assert_int_equal(NCFSM_OK, bt_wait(base, a0, 5));
  assert_int_equal(NCFSM_OK, bt_wait(base, a2, 5));
  ncfsm_boot *s0, *s2, *x;
  assert_int_equal(NCFSM_OK, ncfsm_boot_survivors(b[0], a0, &s0));
  assert_int_equal(NCFSM_ERR_BUSY, ncfsm_boot_survivors(b[0], a0, &x));
  assert_int_equal(NCFSM_OK, ncfsm_boot_survivors(b[2], a2, &s2));
  assert_int_equal(1, ncfsm_boot_rank(s2));
  assert_int_equal(2, ncfsm_boot_size(s2));
  assert_int_equal(NCFSM_BOOT_TCP, ncfsm_boot_kind(s2));
  /* a survivors' peer-lost callback speaks in its ranks: rank 2 (index 1) closes */
  cb_n = 0;
  assert_int_equal(NCFSM_OK, ncfsm_boot_on_peer_lost(s0, count_cb, NULL));
  assert_int_equal(NCFSM_OK, ncfsm_boot_on_peer_lost(b[0], NULL, NULL));
  ncfsm_boot_req_free(a2);
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(s2));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b[2]));
  bt_spin(base, 0.2);
  assert_int_equal(1, cb_n);
  assert_int_equal(1, cb_rank);
  assert_non_null(strstr(cb_why, "survivors' rank 1"));
  /* its allgathers fail naming the lost member */
  int v = 1, out[2];
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_allgather(s0, &v, out, sizeof v));
  assert_non_null(strstr(ncfsm_boot_last_error(s0), "rank 2"));
  ncfsm_boot_req_free(a0);
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(s0));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b[0]));
  event_base_free(base);
  char stats[2048];
  store_stop(&sp, stats, sizeof stats);
  assert_non_null(strstr(stats, "agreements"));
}

static int rt_setup(void **state) {
  (void)state;
  alarm(90);
  return 0;
}
static int rt_teardown(void **state) {
  (void)state;
  for (int r = 0; r < N; r++)
    if (live_rank[r] > 0) {
      kill(live_rank[r], SIGKILL);
      waitpid(live_rank[r], NULL, 0);
      live_rank[r] = -1;
    }
  if (live_store > 0) {
    kill(live_store, SIGKILL);
    waitpid(live_store, NULL, 0);
    live_store = -1;
  }
  alarm(0);
  return 0;
}
#define RT_TEST(f) cmocka_unit_test_setup_teardown(f, rt_setup, rt_teardown)

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    fprintf(stderr, "usage: test_recovery STORE_BINARY [TEST_NAME_FILTER]\n");
    return 2;
  }
  store_bin = argv[1];
  if (argc > 2) cmocka_set_test_filter(argv[2]);
  const struct CMUnitTest tests[] = {
      RT_TEST(test_killed_rank),
      RT_TEST(test_silent_rank_times_out),
      RT_TEST(test_second_death_during_agreement),
      RT_TEST(test_epochs_differ),
      RT_TEST(test_one_process_rules),
  };
  return cmocka_run_group_tests_name("bootstrap_recovery", tests, NULL, NULL);
}
