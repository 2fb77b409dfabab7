/*
 * ncfsm-apifuzz: command line, one child process per seed, reports.
 *
 *   ncfsm-apifuzz --seed S [--verbose]                 replay one seed
 *   ncfsm-apifuzz --start S --seeds N [--time-budget SEC] [--keep-going] [--jobs J]
 *   ncfsm-apifuzz --scenario NAME [--verbose]          a directed sequence (--list-scenarios)
 *
 * Each seed runs in a forked child (unless --no-fork), so a crash, a
 * sanitizer report, a leak or a hang of one seed is reported with its seed
 * and its last steps, which the child writes to a shared page as it goes.
 * The parent also reads the child's stderr: a line where the engine logs an
 * ERROR (it does so only for an event its table does not allow) fails the
 * seed. Exit status: 0 when every seed passed, 1 otherwise, 2 on usage errors.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "apifuzz.h"

fz_global g;

uint64_t fz_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- rng (splitmix64: the whole sequence follows from the seed) ------------------ */
uint64_t fz_rand(void) {
  uint64_t z = (g.rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
int fz_below(int n) { return n <= 1 ? 0 : (int)(fz_rand() % (uint64_t)n); }
bool fz_chance(double p) { return (double)(fz_rand() >> 11) * (1.0 / 9007199254740992.0) < p; }
int fz_range(int lo, int hi) { return lo + fz_below(hi - lo + 1); }

/* ---- step log -------------------------------------------------------------------- */
void fz_log(const char *fmt, ...) {
  char line[FZ_LINE];
  int n = snprintf(line, sizeof line, "#%d ", g.step);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  fz_shared *sh = g.sh;
  int i = sh->nlines;
  memcpy(sh->ring[i % FZ_RING], line, sizeof line);
  sh->nlines = i + 1;
  if (g.o.verbose) {
    printf("%s\n", line);
    fflush(stdout);
  }
}

static void print_ring(int fd, const fz_shared *sh, int last) {
  int n = sh->nlines;
  if (last > FZ_RING) last = FZ_RING;
  int from = n > last ? n - last : 0;
  dprintf(fd, "  last %d step lines:\n", n - from);
  for (int i = from; i < n; i++) dprintf(fd, "    %.*s\n", FZ_LINE, sh->ring[i % FZ_RING]);
}

static void replay_hint(int fd, uint64_t seed) {
  if (g.o.scenario)
    dprintf(fd, "  replay: ncfsm-apifuzz --scenario %s --verbose\n", g.o.scenario);
  else
    dprintf(fd, "  replay: ncfsm-apifuzz --seed %llu%s%s%s --verbose\n", (unsigned long long)seed,
            g.o.bounded ? " --bounded" : "", g.o.avoid ? " --avoid " : "", g.o.avoid ? g.avoid_arg : "");
}

static atomic_int violated;

void fz_violation(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (atomic_exchange(&violated, 1)) { /* another thread is reporting */
    for (;;) pause();
  }
  int fd = g.report_fd;
  dprintf(fd, "apifuzz: VIOLATION seed=%llu step=%d: %s\n", (unsigned long long)g.o.seed, g.step, msg);
  replay_hint(fd, g.o.seed);
  print_ring(fd, g.sh, g.o.last);
  g.sh->reported = 1;
  fflush(stdout);
  _exit(1);
}

void fz_deadline(uint64_t ms, const char *what) {
  if (!ms) {
    g.deadline_ns = 0;
    return;
  }
  snprintf(g.deadline_what, sizeof g.deadline_what, "%s", what);
  g.deadline_ns = fz_now_ns() + ms * 1000000ull;
}

/* A blocking call that passes its bound by far is a hang. */
static void *monitor_main(void *arg) {
  (void)arg;
  while (!g.monitor_stop) {
    struct timespec ts = {0, 10 * 1000000};
    nanosleep(&ts, NULL);
    uint64_t d = g.deadline_ns;
    if (d && fz_now_ns() > d)
      fz_violation("hang: %s did not return within its bound", g.deadline_what);
  }
  return NULL;
}

/* ---- one seed (in the child) -------------------------------------------------------- */
static int run_seed(uint64_t seed) {
  g.o.seed = seed;
  g.rng = seed * 0x2545f4914f6cdd1dull + 0x5851f42d4c957f2dull;
  g.step = 0;
  g.sh->seed = seed;
  g.sh->nlines = 0;
  g.sh->reported = 0;
  g.sh->calls = g.sh->trace = g.sh->cbs = g.sh->ok_checked = g.sh->ops = 0;
  if (!g.o.verbose) ncfsm_set_log_level(1); /* ERROR only: the engine uses it for table violations */
  pthread_t mon;
  g.monitor_stop = 0;
  pthread_create(&mon, NULL, monitor_main, NULL);
  fz_oracle_init();
  fz_world_init();
  if (g.o.scenario) {
    if (!fz_scenario(g.o.scenario)) {
      fprintf(stderr, "apifuzz: unknown scenario %s\n", g.o.scenario);
      fz_list_scenarios();
      return 2;
    }
  } else {
    for (int s = 1; s <= g.o.steps; s++) {
      g.step = s;
      g.sh->step = s;
      fz_random_step();
      fz_check_step();
    }
  }
  g.step++;
  g.sh->step = g.step;
  fz_log("teardown");
  fz_teardown();
  fz_check_final();
  g.sh->calls = g.n_calls;
  g.sh->trace = g.n_trace;
  g.sh->cbs = g.n_cb;
  g.sh->ok_checked = g.n_ok_checked;
  g.sh->ops = (uint64_t)g.nops;
  fz_world_free();
  g.monitor_stop = 1;
  pthread_join(mon, NULL);
  if (g.o.verbose)
    printf("apifuzz: seed %llu passed: %d steps, %llu calls, %llu trace records, %llu callbacks, %llu "
           "OK results verified\n",
           (unsigned long long)seed, g.step - 1, (unsigned long long)g.n_calls,
           (unsigned long long)g.n_trace, (unsigned long long)g.n_cb,
           (unsigned long long)g.n_ok_checked);
  fflush(stdout);
  return 0;
}

/* ---- the parent ---------------------------------------------------------------------- */
typedef struct child {
  pid_t pid;
  uint64_t seed;
  int errfd;
  fz_shared *sh;
  uint64_t start_ns;
  char line[2048];
  size_t nline;
  bool engine_error;
  char engine_line[512];
} child;

static void scan_line(child *ch) {
  ch->line[ch->nline] = '\0';
  /* core/log.c: "ncfsm <pid> ERROR <file>:<line> <msg>" */
  if (!ch->engine_error && !strncmp(ch->line, "ncfsm ", 6) && strstr(ch->line, " ERROR ")) {
    ch->engine_error = true;
    size_t n = strlen(ch->line);
    if (n >= sizeof ch->engine_line) n = sizeof ch->engine_line - 1;
    memcpy(ch->engine_line, ch->line, n);
    ch->engine_line[n] = '\0';
  }
  ch->nline = 0;
}

static void drain_child_err(child *ch) {
  char buf[4096];
  for (;;) {
    ssize_t n = read(ch->errfd, buf, sizeof buf);
    if (n <= 0) return;
    ssize_t off = 0;
    while (off < n) {
      ssize_t w = write(2, buf + off, (size_t)(n - off));
      if (w <= 0) break;
      off += w;
    }
    for (ssize_t i = 0; i < n; i++) {
      if (buf[i] == '\n' || ch->nline == sizeof ch->line - 1) scan_line(ch);
      else ch->line[ch->nline++] = buf[i];
    }
  }
}

static bool start_child(child *ch, uint64_t seed, fz_shared *sh) {
  int p[2];
  if (pipe(p) != 0) return false;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return false;
  }
  if (pid == 0) {
    close(p[0]);
    dup2(p[1], 2);
    close(p[1]);
    g.sh = sh;
    g.report_fd = 2;
    int rc = run_seed(seed);
    exit(rc); /* exit, not _exit: LeakSanitizer runs here */
  }
  close(p[1]);
  fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
  memset(ch, 0, sizeof *ch);
  ch->pid = pid;
  ch->seed = seed;
  ch->errfd = p[0];
  ch->sh = sh;
  ch->start_ns = fz_now_ns();
  return true;
}

/* Returns 0 passed, 1 failed. */
static int finish_child(child *ch, int status, bool killed, double limit_s) {
  drain_child_err(ch);
  if (ch->nline) scan_line(ch);
  close(ch->errfd);
  int failed = 0;
  if (killed) {
    dprintf(2, "apifuzz: VIOLATION seed=%llu step=%d: hang: the seed did not finish within %.0f s "
               "(killed)\n", (unsigned long long)ch->seed, ch->sh->step, limit_s);
    failed = 1;
  } else if (WIFSIGNALED(status)) {
    if (!ch->sh->reported)
      dprintf(2, "apifuzz: VIOLATION seed=%llu step=%d: crash: killed by signal %d (%s)\n",
              (unsigned long long)ch->seed, ch->sh->step, WTERMSIG(status), strsignal(WTERMSIG(status)));
    failed = 1;
  } else if (WEXITSTATUS(status) != 0) {
    if (!ch->sh->reported)
      dprintf(2, "apifuzz: VIOLATION seed=%llu step=%d: the seed exited with status %d (a sanitizer "
                 "or leak report above, or a usage error)\n",
              (unsigned long long)ch->seed, ch->sh->step, WEXITSTATUS(status));
    failed = 1;
  }
  if (!failed && ch->engine_error) {
    dprintf(2, "apifuzz: VIOLATION seed=%llu: the engine logged an ERROR (an event its table does not "
               "allow): %s\n", (unsigned long long)ch->seed, ch->engine_line);
    failed = 1;
  }
  if (failed && !ch->sh->reported) {
    replay_hint(2, ch->seed);
    print_ring(2, ch->sh, g.o.last);
  }
  return failed;
}

static void usage(void) {
  fprintf(stderr,
          "usage: ncfsm-apifuzz [--seed S | --start S --seeds N] [options]\n"
          "  --seed S            run one seed (replay)\n"
          "  --start S --seeds N run seeds S..S+N-1\n"
          "  --time-budget SEC   stop starting seeds after SEC seconds\n"
          "  --steps N           actions per seed (default 150)\n"
          "  --bounded           the CTest profile: shorter watchdogs and waits\n"
          "  --p-diverge F       probability that an op template leaves one rank out of step (0.05)\n"
          "  --p-invalid F       probability that a template has one invalid argument (0.08)\n"
          "  --p-double-release F probability of a second ncfsm_work_release (0.02)\n"
          "  --scenario NAME     run a directed scenario instead (--list-scenarios)\n"
          "  --avoid LIST        steer the random run clear of known defects (comma-separated:\n"
          "                      destroy-inflight, revoke-inflight, stream-destroy-queued,\n"
          "                      double-release, close-in-callback, nowait-spin)\n"
          "  --keep-going        do not stop at the first failing seed\n"
          "  --jobs J            seeds run in parallel (default 1)\n"
          "  --seed-timeout SEC  kill a seed after SEC seconds (default 60)\n"
          "  --no-fork           run in this process (debugging; one seed only)\n"
          "  --last N            step lines shown in a report (default 40)\n"
          "  --verbose           print every step\n");
}

int main(int argc, char **argv) {
  g.o.steps = 150;
  g.o.p_diverge = 0.05;
  g.o.p_invalid = 0.08;
  g.o.p_double_release = 0.02;
  g.o.last = 40;
  uint64_t start = 1, nseeds = 1;
  bool single = false, fork_each = true, keep_going = false;
  double budget = 0, seed_timeout = 60;
  int jobs = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (!strcmp(a, name) && v && (++i, 1))
    if (ARG("--seed")) { start = strtoull(v, NULL, 0); nseeds = 1; single = true; }
    else if (ARG("--start")) start = strtoull(v, NULL, 0);
    else if (ARG("--seeds")) nseeds = strtoull(v, NULL, 0);
    else if (ARG("--time-budget")) budget = atof(v);
    else if (ARG("--steps")) g.o.steps = atoi(v);
    else if (ARG("--p-diverge")) g.o.p_diverge = atof(v);
    else if (ARG("--p-invalid")) g.o.p_invalid = atof(v);
    else if (ARG("--p-double-release")) g.o.p_double_release = atof(v);
    else if (ARG("--scenario")) { g.o.scenario = v; single = true; }
    else if (ARG("--jobs")) jobs = atoi(v);
    else if (ARG("--avoid")) {
      static const struct { const char *n; unsigned bit; } av[] = {
          {"destroy-inflight", FZ_AVOID_DESTROY_INFLIGHT}, {"revoke-inflight", FZ_AVOID_REVOKE_INFLIGHT},
          {"stream-destroy-queued", FZ_AVOID_STREAM_QUEUED}, {"double-release", FZ_AVOID_DOUBLE_RELEASE},
          {"close-in-callback", FZ_AVOID_CLOSE_IN_CALLBACK}, {"nowait-spin", FZ_AVOID_NOWAIT_SPIN}};
      char buf[256];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        size_t k;
        for (k = 0; k < sizeof av / sizeof av[0]; k++)
          if (!strcmp(t, av[k].n)) break;
        if (k == sizeof av / sizeof av[0]) {
          fprintf(stderr, "apifuzz: --avoid: unknown defect %s\n", t);
          return 2;
        }
        g.o.avoid |= av[k].bit;
      }
      snprintf(g.avoid_arg, sizeof g.avoid_arg, "%s", v);
    }
    else if (ARG("--seed-timeout")) seed_timeout = atof(v);
    else if (ARG("--last")) g.o.last = atoi(v);
    else if (!strcmp(a, "--bounded")) g.o.bounded = 1;
    else if (!strcmp(a, "--keep-going")) keep_going = true;
    else if (!strcmp(a, "--no-fork")) fork_each = false;
    else if (!strcmp(a, "--verbose")) g.o.verbose = 1;
    else if (!strcmp(a, "--list-scenarios")) { fz_list_scenarios(); return 0; }
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 0; }
    else { usage(); return 2; }
#undef ARG
  }
  if (jobs < 1) jobs = 1;
  if (g.o.scenario && !fz_scenario_known(g.o.scenario)) {
    fprintf(stderr, "apifuzz: unknown scenario %s; the scenarios are:\n", g.o.scenario);
    fz_list_scenarios();
    return 2;
  }
  if (g.o.avoid & FZ_AVOID_DOUBLE_RELEASE) g.o.p_double_release = 0;
  if (single) nseeds = 1;
  if (!fork_each && nseeds != 1) {
    fprintf(stderr, "apifuzz: --no-fork runs one seed only\n");
    return 2;
  }
  /* Blocking sim inits and finalizes wait for peers at most this long. */
  setenv("NCFSM_SIM_WAIT_MS", "200", 0);
  /* A collective whose fingerprints differ across ranks hangs (except a
   * Broadcast root), so that any NCFSM_OK of one is a violation; the sim's
   * "nccl" model lets some complete silently with wrong data, which ncfsm
   * cannot see without a cross-rank fingerprint check (docs/fuzzing.md). */
  setenv("NCFSM_SIM_MISMATCH", "hang", 0);
  g.report_fd = 2;

  fz_shared *shared = mmap(NULL, sizeof(fz_shared) * (size_t)jobs, PROT_READ | PROT_WRITE,
                           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) {
    perror("mmap");
    return 2;
  }
  if (!fork_each) {
    g.sh = &shared[0];
    return run_seed(start);
  }

  uint64_t t0 = fz_now_ns();
  child *kids = calloc((size_t)jobs, sizeof *kids);
  bool *busy = calloc((size_t)jobs, sizeof *busy);
  uint64_t next = start, end = start + nseeds, done = 0, failed = 0;
  uint64_t first_failed = 0;
  uint64_t t_calls = 0, t_trace = 0, t_cbs = 0, t_ok = 0, t_ops = 0;
  bool stop = false;
  for (;;) {
    /* start seeds into free slots */
    for (int j = 0; j < jobs && !stop && next < end; j++) {
      if (busy[j]) continue;
      if (budget > 0 && (double)(fz_now_ns() - t0) / 1e9 >= budget) {
        stop = true;
        break;
      }
      if (!start_child(&kids[j], next, &shared[j])) {
        perror("fork");
        stop = true;
        break;
      }
      busy[j] = true;
      next++;
    }
    int nbusy = 0;
    struct pollfd pf[64];
    int map[64];
    for (int j = 0; j < jobs && nbusy < 64; j++)
      if (busy[j]) {
        pf[nbusy].fd = kids[j].errfd;
        pf[nbusy].events = POLLIN;
        map[nbusy++] = j;
      }
    if (!nbusy) break;
    poll(pf, (nfds_t)nbusy, 5);
    for (int k = 0; k < nbusy; k++) {
      child *ch = &kids[map[k]];
      drain_child_err(ch);
      int status = 0;
      pid_t r = waitpid(ch->pid, &status, WNOHANG);
      bool killed = false;
      if (r == 0 && (double)(fz_now_ns() - ch->start_ns) / 1e9 > seed_timeout) {
        kill(ch->pid, SIGKILL);
        waitpid(ch->pid, &status, 0);
        killed = true;
        r = ch->pid;
      }
      if (r != ch->pid) continue;
      int f = finish_child(ch, status, killed, seed_timeout);
      busy[map[k]] = false;
      done++;
      if (f) {
        if (!failed) first_failed = ch->seed;
        failed++;
        if (!keep_going) stop = true;
        continue;
      }
      t_calls += ch->sh->calls;
      t_trace += ch->sh->trace;
      t_cbs += ch->sh->cbs;
      t_ok += ch->sh->ok_checked;
      t_ops += ch->sh->ops;
    }
  }
  double secs = (double)(fz_now_ns() - t0) / 1e9;
  if (g.o.scenario)
    printf("apifuzz: scenario %s: %s (%.2f s)\n", g.o.scenario, failed ? "VIOLATION" : "passed", secs);
  else if (failed)
    printf("apifuzz: %llu seed(s) run from %llu, %llu failed (first: seed %llu), %.1f s, %d steps per seed\n",
           (unsigned long long)done, (unsigned long long)start, (unsigned long long)failed,
           (unsigned long long)first_failed, secs, g.o.steps);
  else
    printf("apifuzz: %llu seed(s) run from %llu, all passed, %.1f s, %d steps per seed\n",
           (unsigned long long)done, (unsigned long long)start, secs, g.o.steps);
  if (!g.o.scenario && done > failed)
    printf("apifuzz: in the seeds that passed: %llu API calls, %llu ops submitted, %llu trace records "
           "checked, %llu callbacks, %llu NCFSM_OK results verified against the reference\n",
           (unsigned long long)t_calls, (unsigned long long)t_ops, (unsigned long long)t_trace,
           (unsigned long long)t_cbs, (unsigned long long)t_ok);
  free(kids);
  free(busy);
  return failed ? 1 : 0;
}
