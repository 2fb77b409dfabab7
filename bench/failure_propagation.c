/*
 * bench/failure_propagation: how long a failure of one rank's comm takes to
 * fail every other rank's (issue 21, item 2; docs/ordering.md "A failure
 * reaches every rank"), with the library's defaults (verification async,
 * the error policy abort: nothing is set but a state callback and the fault).
 *
 *   failure_propagation --mode local [options]               NP ranks in this process (ncfsm_comm_init_all)
 *   mpirun -np NP failure_propagation --mode boot [options]  one rank per process: PMIx, or the TCP store
 *                                                            (NCFSM_STORE_ADDR, NCFSM_RANK, NCFSM_WORLD_SIZE)
 *   failure_propagation --mode tcp [--store PATH] [options]  starts an ncfsm-store (default: ../tools/ncfsm-store
 *                                                            next to this program) and NP processes of this
 *                                                            program in boot mode meeting through it
 *
 *   --np N       ranks (local, tcp; default 4)
 *   --reps R     repetitions, each a new comm (default 20)
 *   --at-op K    the failing rank's op K sets the sim's async error (default 100: every rank's
 *                verification channel is open by then)
 *   --origin O   the failing rank (default -1: rank rep % N, every rank in turn)
 *   --label S    the name the result line carries (default the mode)
 *   --no-warm    no warm-up (below): the failure may come before every rank's verification
 *                channel is known to the bootstrap
 *   --poll-us U  drive the loop with ncfsm_loop_run(NCFSM_RUN_NOWAIT) and a sleep of U us
 *                between calls, as a program that polls does (default: NCFSM_RUN_ONCE, which
 *                waits for the loop's next event)
 *
 * Each repetition makes a comm (sim backend); every rank completes one
 * AllReduce and then meets the others in an allgather on the main
 * bootstrap (the warm-up: on the TCP store each rank's verification channel
 * is then open at the store, since a rank's frames reach it in order), then
 * issues AllReduces, at most 8 in flight, until its comm fails; the testing
 * kit's fault plan makes the origin's op K fail with an async error. On each rank the
 * time its comm entered ERROR is taken on CLOCK_MONOTONIC (one clock for
 * every process of a host), then exchanged after the fact: in-process
 * directly, across processes by an allgather on the main bootstrap. The
 * latency of rank r, when it was told of the origin, is its time minus the
 * origin's. Every other rank must fail with NCFSM_ERR_PEER naming the
 * origin ("rank O's comm failed first"); a repetition where one does not
 * (its comm does not fail within 20 s, or fails otherwise) is counted and
 * printed, and the
 * program exits 1. Timings are printed, never checked: the goal (< 50 ms)
 * is for the reader (docs/results/failure-propagation-*.md).
 *
 * Output (rank 0): one Markdown row, "| label | N | reps | samples | min |
 * median | p90 | max |" in ms, and "KV fp.<label>.<stat>_ms value" lines.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ncfsm.h"
#include "ncfsm/bootstrap.h"
#include "ncfsm/testing.h"

#define MAXR 64
#define INFLIGHT 8

static int nranks = 4, reps = 20, fixed_origin = -1, poll_us = -1;
static bool warm = true;
static uint64_t at_op = 100;
static const char *label;

static void die(const char *what, const char *detail) {
  fprintf(stderr, "failure_propagation: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(2);
}

#define CHECK(call)                                                                           \
  do {                                                                                        \
    ncfsm_result_t r_ = (call);                                                               \
    if (r_ != NCFSM_OK) die(#call, ncfsm_err_name(r_));                                       \
  } while (0)

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One rank's comm in one repetition. */
typedef struct rank_run {
  ncfsm_comm *c;
  int64_t t_error; /* CLOCK_MONOTONIC ns when it entered ERROR; 0: never */
  int inflight;
  uint64_t issued;
  float buf[2];
} rank_run;

static rank_run runs[MAXR];

static void on_state(ncfsm_comm *c, ncfsm_state_t from, ncfsm_state_t to, ncfsm_event_t ev, void *arg) {
  (void)from;
  (void)ev;
  rank_run *rr = arg ? arg : &runs[ncfsm_comm_rank(c)]; /* local: one opts for every rank */
  if (to == NCFSM_STATE_ERROR && !rr->t_error) rr->t_error = now_ns();
}

static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  (void)st;
  ((rank_run *)arg)->inflight--;
}

/* Keep INFLIGHT AllReduces in flight while the comm is READY. */
static void feed_to(rank_run *rr, int cap) {
  while (rr->inflight < cap && ncfsm_comm_state(rr->c) == NCFSM_STATE_READY && rr->issued < at_op + 100000) {
    if (ncfsm_allreduce(rr->c, &rr->buf[0], &rr->buf[1], 1, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_done, rr, NULL) !=
        NCFSM_OK)
      return;
    rr->inflight++;
    rr->issued++;
  }
}

static void feed(rank_run *rr) { feed_to(rr, INFLIGHT); }

/* One turn of the loop: NCFSM_RUN_ONCE (it waits for the next event), or with --poll-us U
 * NCFSM_RUN_NOWAIT and a sleep of U us, as a program that polls the loop does. */
static void turn(ncfsm_loop *loop) {
  if (poll_us < 0) {
    ncfsm_loop_run(loop, NCFSM_RUN_ONCE);
    return;
  }
  ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
  if (poll_us) usleep((useconds_t)poll_us);
}

static bool failed(const rank_run *rr) { return ncfsm_comm_failure(rr->c)[0] != 0; }

static void comm_opts(ncfsm_comm_opts *o, const char *name, rank_run *arg) {
  CHECK(ncfsm_comm_opts_init(o));
  o->backend = NCFSM_BACKEND_SIM;
  o->name = name;
  o->on_state = on_state;
  o->on_state_arg = arg;
}

/* The fault of repetition rep: the origin's op at_op of comm `name`. */
static int plan(ncfsm_test *t, const char *name, int rep) {
  int origin = fixed_origin >= 0 ? fixed_origin : rep % nranks;
  ncfsm_fault f;
  ncfsm_fault_init(&f, NCFSM_FAULT_ASYNC_ERROR);
  f.comm = name;
  f.rank = origin;
  f.when = NCFSM_AT_OP;
  f.at = at_op;
  f.times = 1;
  if (ncfsm_test_add_fault(t, &f) < 0) die("ncfsm_test_add_fault", ncfsm_test_last_failure(t));
  return origin;
}

/* Did rank r fail as it must: the origin by itself, the others naming it? */
static bool judged(int r, int origin, const char *failure, int rep) {
  char want[64];
  snprintf(want, sizeof want, "rank %d's comm failed first", origin);
  bool ok = r == origin ? failure[0] && !strstr(failure, "NCFSM_ERR_PEER")
                        : strstr(failure, want) && strstr(failure, "NCFSM_ERR_PEER");
  if (!ok)
    printf("FAIL rep %d rank %d (origin %d): %s\n", rep, r, origin, failure[0] ? failure : "its comm did not fail");
  return ok;
}

/* ---- statistics -------------------------------------------------------------------- */
static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void print_stats(double *ms, int n, int bad) {
  qsort(ms, (size_t)n, sizeof *ms, cmp_d);
  double med = n ? (n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2) : 0;
  double p90 = n ? ms[(int)((n - 1) * 0.9 + 0.5)] : 0;
  printf("| mode | ranks | reps | samples | min (ms) | median (ms) | p90 (ms) | max (ms) |\n|---|---|---|---|---|---|---|---|\n");
  if (n)
    printf("| %s | %d | %d | %d | %.3f | %.3f | %.3f | %.3f |\n", label, nranks, reps, n, ms[0], med, p90, ms[n - 1]);
  else
    printf("| %s | %d | %d | 0 | - | - | - | - |\n", label, nranks, reps);
  if (n)
    printf("KV fp.%s.min_ms %.3f\nKV fp.%s.median_ms %.3f\nKV fp.%s.p90_ms %.3f\nKV fp.%s.max_ms %.3f\n", label, ms[0],
           label, med, label, p90, label, ms[n - 1]);
  printf("%d repetition(s) with a rank that did not fail naming the origin\n", bad);
}

/* Exit status: 1 when a repetition failed its check or a rank's time is missing. */
static int verdict(int n, int bad, int tf) {
  if (n != reps * (nranks - 1)) printf("FAIL: %d of %d latencies measured\n", n, reps * (nranks - 1));
  return bad || tf || n != reps * (nranks - 1) ? 1 : 0;
}

static ncfsm_test *begin_test(void) {
  ncfsm_test_opts to;
  ncfsm_test_opts_init(&to);
  to.name = "failure_propagation";
  to.deterministic = 0; /* the sim as it is: only the fault is planned */
  to.quiet = 1;
  ncfsm_test *t;
  CHECK(ncfsm_test_begin(&to, &t));
  return t;
}

/* The error policy (abort) closes a failed comm; one that did not fail is aborted here. */
static void release(ncfsm_comm *c) {
  ncfsm_state_t s = ncfsm_comm_state(c);
  if (s != NCFSM_STATE_CLOSED && s != NCFSM_STATE_CLOSING && ncfsm_comm_abort(c) != NCFSM_OK)
    fprintf(stderr, "failure_propagation: abort in state %s: %s\n", ncfsm_state_name(s), ncfsm_comm_last_error(c));
  if (ncfsm_comm_wait_state(c, NCFSM_STATE_CLOSED, 60000) != NCFSM_OK) die("close", ncfsm_comm_last_error(c));
  ncfsm_comm_release(c);
}

/* One AllReduce on every rank of this process, to completion (the warm-up). */
static void warm_up(ncfsm_loop *loop, int n) {
  for (int r = 0; r < n; r++) feed_to(&runs[r], 1);
  for (int64_t until = now_ns() + 60000000000; now_ns() < until;) {
    int busy = 0;
    for (int r = 0; r < n; r++) busy += runs[r].inflight;
    if (!busy) return;
    turn(loop);
  }
  die("the warm-up AllReduces did not complete within 60 s", NULL);
}

/* ---- in process: NP ranks on one loop ---------------------------------------------- */
static int run_local(void) {
  ncfsm_test *t = begin_test();
  ncfsm_loop *loop;
  CHECK(ncfsm_loop_new(NULL, &loop));
  double *ms = calloc((size_t)reps * (size_t)nranks, sizeof *ms);
  int n = 0, bad = 0;
  if (!ms) die("out of memory", NULL);
  for (int rep = 0; rep < reps; rep++) {
    char name[32];
    snprintf(name, sizeof name, "fp%d", rep);
    int origin = plan(t, name, rep);
    ncfsm_comm_opts o;
    comm_opts(&o, name, NULL);
    ncfsm_comm *cs[MAXR];
    int dev[MAXR] = {0};
    memset(runs, 0, sizeof runs);
    CHECK(ncfsm_comm_init_all(loop, nranks, &o, dev, cs));
    for (int r = 0; r < nranks; r++) {
      runs[r].c = cs[r];
      if (ncfsm_comm_wait_state(cs[r], NCFSM_STATE_READY, 60000) != NCFSM_OK) die("init", ncfsm_comm_last_error(cs[r]));
    }
    if (warm) warm_up(loop, nranks);
    for (int64_t until = now_ns() + 20000000000; now_ns() < until;) {
      int done = 0;
      for (int r = 0; r < nranks; r++) {
        feed(&runs[r]);
        done += failed(&runs[r]);
      }
      if (done == nranks) break;
      turn(loop);
    }
    bool ok = true;
    for (int r = 0; r < nranks; r++) {
      bool told = judged(r, origin, ncfsm_comm_failure(cs[r]), rep);
      ok &= told;
      if (r != origin && told && runs[r].t_error && runs[origin].t_error)
        ms[n++] = (double)(runs[r].t_error - runs[origin].t_error) / 1e6;
    }
    bad += !ok;
    for (int r = 0; r < nranks; r++) release(cs[r]);
  }
  print_stats(ms, n, bad);
  free(ms);
  CHECK(ncfsm_loop_close(loop));
  return verdict(n, bad, ncfsm_test_end(t));
}

/* ---- one rank per process ---------------------------------------------------------- */
typedef struct stamp {
  int64_t t_error;
  int32_t ok, pad;
} stamp;

static int run_boot(void) {
  ncfsm_test *t = begin_test();
  ncfsm_loop *loop;
  CHECK(ncfsm_loop_new(NULL, &loop));
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  ncfsm_boot *boot;
  if (ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &boot) != NCFSM_OK) die("bootstrap", ncfsm_boot_open_error());
  int rank = ncfsm_boot_rank(boot);
  nranks = ncfsm_boot_size(boot);
  if (nranks < 2 || nranks > MAXR) die("boot mode needs 2 to 64 ranks", NULL);
  double *ms = calloc((size_t)reps * (size_t)nranks, sizeof *ms);
  stamp *all = calloc((size_t)nranks, sizeof *all);
  int n = 0, bad = 0;
  if (!ms || !all) die("out of memory", NULL);
  for (int rep = 0; rep < reps; rep++) {
    char name[32];
    snprintf(name, sizeof name, "fp%d", rep);
    int origin = plan(t, name, rep);
    rank_run *rr = &runs[0];
    memset(rr, 0, sizeof *rr);
    ncfsm_comm_opts o;
    comm_opts(&o, name, rr);
    CHECK(ncfsm_comm_new(loop, &o, &rr->c));
    CHECK(ncfsm_comm_init_boot(rr->c, boot));
    if (ncfsm_comm_wait_state(rr->c, NCFSM_STATE_READY, 60000) != NCFSM_OK) die("init", ncfsm_comm_last_error(rr->c));
    if (warm) { /* then every rank's channel is open at the store: each rank's frames reach it in order */
      warm_up(loop, 1);
      int32_t me = rank, *ranks = all ? (int32_t *)all : NULL;
      if (ncfsm_boot_allgather(boot, &me, ranks, sizeof me) != NCFSM_OK)
        die("the warm-up's allgather", ncfsm_boot_last_error(boot));
    }
    for (int64_t until = now_ns() + 20000000000; now_ns() < until && !failed(rr);) {
      feed(rr);
      turn(loop);
    }
    stamp mine = {rr->t_error, judged(rank, origin, ncfsm_comm_failure(rr->c), rep), 0};
    release(rr->c);
    if (ncfsm_boot_allgather(boot, &mine, all, sizeof mine) != NCFSM_OK)
      die("the stamps' allgather", ncfsm_boot_last_error(boot));
    bool ok = true;
    for (int r = 0; r < nranks; r++) {
      ok &= all[r].ok != 0;
      if (r != origin && all[r].ok && all[r].t_error && all[origin].t_error) /* a rank told of the origin */
        ms[n++] = (double)(all[r].t_error - all[origin].t_error) / 1e6;
    }
    bad += !ok;
  }
  if (rank == 0) print_stats(ms, n, bad);
  free(ms);
  free(all);
  ncfsm_boot_close(boot);
  CHECK(ncfsm_loop_close(loop));
  return verdict(n, bad, ncfsm_test_end(t));
}

/* ---- tcp: a store and NP processes of this program ---------------------------------- */
static int run_tcp(const char *store, char **argv) {
  char self[4096], port[32] = "", token[64], addr[64], sz[16], rk[16];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  if (k <= 0) die("readlink /proc/self/exe", strerror(errno));
  self[k] = 0;
  char dflt[4200];
  if (!store) {
    snprintf(dflt, sizeof dflt, "%s", self);
    char *slash = strrchr(dflt, '/');
    if (slash) *slash = 0;
    slash = strrchr(dflt, '/');
    if (slash) *slash = 0;
    strncat(dflt, "/tools/ncfsm-store", sizeof dflt - strlen(dflt) - 1);
    store = dflt;
  }
  snprintf(token, sizeof token, "fp-%d", (int)getpid());
  setenv("NCFSM_STORE_TOKEN", token, 1);
  unsetenv("PMIX_RANK");
  int pfd[2];
  if (pipe(pfd)) die("pipe", strerror(errno));
  pid_t sp = fork();
  if (sp == 0) {
    dup2(pfd[1], 1);
    close(pfd[0]);
    execl(store, store, "--listen", "127.0.0.1:0", "--print-port", (char *)NULL);
    fprintf(stderr, "failure_propagation: cannot run %s: %s\n", store, strerror(errno));
    _exit(127);
  }
  close(pfd[1]);
  FILE *pf = fdopen(pfd[0], "r");
  if (!pf || !fgets(port, sizeof port, pf) || atoi(port) <= 0) {
    kill(sp, SIGTERM);
    die("ncfsm-store printed no port", store);
  }
  snprintf(addr, sizeof addr, "127.0.0.1:%d", atoi(port));
  snprintf(sz, sizeof sz, "%d", nranks);
  setenv("NCFSM_STORE_ADDR", addr, 1);
  setenv("NCFSM_WORLD_SIZE", sz, 1);
  pid_t kids[MAXR];
  for (int r = 0; r < nranks; r++) {
    snprintf(rk, sizeof rk, "%d", r);
    setenv("NCFSM_RANK", rk, 1);
    if ((kids[r] = fork()) == 0) {
      argv[0] = self;
      execv(self, argv); /* the same options; --mode boot comes last and wins */
      _exit(127);
    }
  }
  int rc = 0;
  for (int r = 0; r < nranks; r++) {
    int st = 0;
    if (waitpid(kids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
      fprintf(stderr, "failure_propagation: rank %d ended with status %#x\n", r, st);
      rc = 1;
    }
  }
  kill(sp, SIGTERM);
  waitpid(sp, NULL, 0);
  fclose(pf);
  return rc;
}

int main(int argc, char **argv) {
  const char *mode = NULL, *store = NULL;
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--mode") && v) mode = argv[++i];
    else if (!strcmp(a, "--np") && v) nranks = atoi(argv[++i]);
    else if (!strcmp(a, "--reps") && v) reps = atoi(argv[++i]);
    else if (!strcmp(a, "--at-op") && v) at_op = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(a, "--origin") && v) fixed_origin = atoi(argv[++i]);
    else if (!strcmp(a, "--store") && v) store = argv[++i];
    else if (!strcmp(a, "--label") && v) label = argv[++i];
    else if (!strcmp(a, "--no-warm")) warm = false;
    else if (!strcmp(a, "--poll-us") && v) poll_us = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s --mode local|boot|tcp [--np N] [--reps R] [--at-op K] [--origin O] [--store PATH] "
              "[--label S] [--no-warm] [--poll-us U]\n", argv[0]);
      return 2;
    }
  }
  if (!mode || nranks < 2 || nranks > MAXR || reps < 1 || fixed_origin >= nranks) {
    fprintf(stderr, "failure_propagation: --mode is required; --np 2..64, --reps >= 1, --origin below --np\n");
    return 2;
  }
  if (!label) label = mode;
  if (!strcmp(mode, "local")) return run_local();
  if (!strcmp(mode, "boot")) return run_boot();
  if (!strcmp(mode, "tcp")) {
    /* the ranks run this program again with --mode boot (appended: the last --mode wins) */
    char **av = calloc((size_t)argc + 5, sizeof *av);
    if (!av) die("out of memory", NULL);
    for (int i = 0; i < argc; i++) av[i] = argv[i];
    av[argc] = "--mode";
    av[argc + 1] = "boot";
    av[argc + 2] = "--label";
    av[argc + 3] = (char *)label;
    int rc = run_tcp(store, av);
    free(av);
    return rc;
  }
  fprintf(stderr, "failure_propagation: no mode '%s' (local, boot or tcp)\n", mode);
  return 2;
}
