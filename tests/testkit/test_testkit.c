/*
 * The testing kit (include/ncfsm/testing.h): every fault kind through the
 * engine on the sim, the recorder's canonical text, the checks (they must
 * fail when they should, with the seed line), and the replay of a seed: the
 * same seed gives the same trace byte for byte, in this process and in a
 * new process started with the seed a failed check printed.
 *
 *   test_testkit               the cmocka suite
 *   test_testkit --child PATH  one run of the replay scenario (seed from
 *                              NCFSM_TEST_SEED): saves its trace to PATH and
 *                              fails a check on purpose (exit 1)
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "ncfsm.h"
#include "ncfsm/sim.h"
#include "ncfsm/testing.h"

#define N 8
#define SHORT_MS 300 /* watchdog of the tests whose collectives hang */

/* A check of the kit that must hold (the kit printed its message and the seed). */
#define HOLDS(t, expr)                                                                     \
  do {                                                                                    \
    if ((expr) != 0) fail_msg("the check above failed: %s", #expr);                       \
  } while (0)

/* The test in progress, ended by the teardown when a test stops half-way. */
static ncfsm_test *g_cur;

static int teardown(void **state) {
  (void)state;
  if (g_cur) ncfsm_test_end(g_cur);
  g_cur = NULL;
  return 0;
}

static int finish(ncfsm_test *t) {
  g_cur = NULL;
  return ncfsm_test_end(t);
}

static ncfsm_test *begin_opts(const ncfsm_test_opts *to) {
  ncfsm_test *t = NULL;
  assert_int_equal(ncfsm_test_begin(to, &t), NCFSM_OK);
  g_cur = t;
  return t;
}

static ncfsm_test *begin(const char *name, uint64_t seed) {
  ncfsm_test_opts to;
  ncfsm_test_opts_init(&to);
  to.name = name;
  to.seed = seed;
  return begin_opts(&to);
}

typedef struct world {
  ncfsm_loop *loop;
  ncfsm_comm *c[4];
  int n;
  float buf[4][N];
} world;

/* n ranks of comm `name` on one loop, recorded; READY unless the init is faulted. */
static void world_up(world *w, ncfsm_test *t, const char *name, int n, uint64_t timeout_ms, int wait_ready) {
  memset(w, 0, sizeof *w);
  w->n = n;
  assert_int_equal(ncfsm_loop_new(NULL, &w->loop), NCFSM_OK);
  assert_int_equal(ncfsm_test_record(t, w->loop), NCFSM_OK);
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.backend = NCFSM_BACKEND_SIM;
  o.name = name;
  o.timeout_ms = timeout_ms;
  int dev[4] = {0, 1, 2, 3};
  assert_int_equal(ncfsm_comm_init_all(w->loop, n, &o, dev, w->c), NCFSM_OK);
  if (wait_ready)
    for (int r = 0; r < n; r++) {
      ncfsm_result_t rc = ncfsm_comm_wait_state(w->c[r], NCFSM_STATE_READY, 10000);
      if (rc != NCFSM_OK) fail_msg("rank %d not READY: %s", r, ncfsm_comm_last_error(w->c[r]));
    }
}

/* One AllReduce SUM per rank (rank r contributes r + 1 + step), in one group. */
static void world_step(world *w, int step, ncfsm_work **out) {
  assert_int_equal(ncfsm_group_start(w->loop), NCFSM_OK);
  for (int r = 0; r < w->n; r++) {
    for (int i = 0; i < N; i++) w->buf[r][i] = (float)(r + 1 + step);
    assert_int_equal(ncfsm_allreduce(w->c[r], w->buf[r], w->buf[r], N, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL,
                                     NULL, &out[r]),
                     NCFSM_OK);
  }
  assert_int_equal(ncfsm_group_end(w->loop), NCFSM_OK);
}

static void world_wait(world *w, ncfsm_work **works) {
  for (int r = 0; r < w->n; r++) ncfsm_work_wait(works[r], 10000);
}

static void world_release_works(world *w, ncfsm_work **works) {
  for (int r = 0; r < w->n; r++) assert_int_equal(ncfsm_work_release(works[r]), NCFSM_OK);
}

static void world_down(world *w, ncfsm_test *t) {
  for (int r = 0; r < w->n; r++) {
    ncfsm_state_t s = ncfsm_comm_state(w->c[r]);
    if (s != NCFSM_STATE_CLOSED && s != NCFSM_STATE_NEW) assert_int_equal(ncfsm_comm_abort(w->c[r]), NCFSM_OK);
  }
  for (int r = 0; r < w->n; r++) {
    assert_int_equal(ncfsm_comm_wait_state(w->c[r], NCFSM_STATE_CLOSED, 10000), NCFSM_OK);
    assert_int_equal(ncfsm_comm_release(w->c[r]), NCFSM_OK);
  }
  ncfsm_test_unrecord(t, w->loop);
  assert_int_equal(ncfsm_loop_close(w->loop), NCFSM_OK);
}

static ncfsm_fault fault_for(ncfsm_fault_kind_t kind, const char *comm, int rank) {
  ncfsm_fault f;
  ncfsm_fault_init(&f, kind);
  f.comm = comm;
  f.rank = rank;
  return f;
}

static int add(ncfsm_test *t, ncfsm_fault *f) {
  int id = ncfsm_test_add_fault(t, f);
  if (id < 0) fail_msg("%s", ncfsm_test_last_failure(t));
  return id;
}

/* ---- the replay scenario ------------------------------------------------------------------ */

/* 4 ranks, 3 rounds of a group of two AllReduces per rank plus one
 * ungrouped AllReduce per rank, a slow rank 2, then finalize and destroy.
 * Returns the trace text (malloc'ed); *t_out: the test, still active. */
static char *scenario(ncfsm_test *t) {
  ncfsm_fault f;
  f = fault_for(NCFSM_FAULT_SLOW, "replay", 2);
  f.polls = 2;
  f.phases = 2;
  f.at = 3;
  add(t, &f);
  world w;
  world_up(&w, t, "replay", 4, 0, 1);
  float b[4][3][N];
  for (int round = 0; round < 3; round++) {
    ncfsm_work *ws[4][3];
    assert_int_equal(ncfsm_group_start(w.loop), NCFSM_OK);
    for (int r = 0; r < 4; r++)
      for (int k = 0; k < 2; k++) {
        for (int i = 0; i < N; i++) b[r][k][i] = (float)(r * 10 + k + round);
        assert_int_equal(ncfsm_allreduce(w.c[r], b[r][k], b[r][k], N, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL,
                                         NULL, &ws[r][k]),
                         NCFSM_OK);
      }
    assert_int_equal(ncfsm_group_end(w.loop), NCFSM_OK);
    for (int r = 0; r < 4; r++) {
      for (int i = 0; i < N; i++) b[r][2][i] = (float)(r + round);
      assert_int_equal(ncfsm_allreduce(w.c[r], b[r][2], b[r][2], N, NCFSM_FLOAT32, NCFSM_OP_MAX, NULL, NULL,
                                       NULL, &ws[r][2]),
                       NCFSM_OK);
    }
    assert_int_equal(ncfsm_loop_run(w.loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
    for (int r = 0; r < 4; r++)
      for (int k = 0; k < 3; k++) {
        HOLDS(t, ncfsm_test_expect_work(t, ws[r][k], NCFSM_WORK_COMPLETED, NCFSM_OK));
        assert_int_equal(ncfsm_work_release(ws[r][k]), NCFSM_OK);
      }
    assert_true(b[0][2][0] == (float)(3 + round));
  }
  for (int r = 0; r < 4; r++) assert_int_equal(ncfsm_comm_finalize(w.c[r]), NCFSM_OK);
  for (int r = 0; r < 4; r++) assert_int_equal(ncfsm_comm_wait_state(w.c[r], NCFSM_STATE_FINALIZED, 10000), NCFSM_OK);
  for (int r = 0; r < 4; r++) assert_int_equal(ncfsm_comm_destroy(w.c[r]), NCFSM_OK);
  world_down(&w, t);
  char *text = ncfsm_test_trace_text(t);
  assert_non_null(text);
  return text;
}

static char *scenario_seed(uint64_t seed) {
  ncfsm_test *t = begin("replay", seed);
  char *text = scenario(t);
  HOLDS(t, ncfsm_test_expect_final_once(t));
  assert_int_equal(finish(t), 0);
  return text;
}

static void test_same_seed_same_trace(void **state) {
  (void)state;
  char *a = scenario_seed(42), *b = scenario_seed(42);
  if (strcmp(a, b)) fail_msg("seed 42 gave two different traces:\n--- first\n%s--- second\n%s", a, b);
  assert_true(strlen(a) > 1000); /* the scenario's ~200 lines */
  free(a);
  free(b);
}

static void test_other_seeds_other_orders(void **state) {
  (void)state;
  char *first = scenario_seed(1);
  int differ = 0;
  for (uint64_t s = 2; s <= 12 && !differ; s++) {
    char *x = scenario_seed(s);
    differ = strcmp(first, x) != 0;
    free(x);
  }
  free(first);
  if (!differ) fail_msg("seeds 1..12 all gave the same trace: the seed does not reach the sim's choices");
}

/* Run this binary with --child PATH; NCFSM_TEST_SEED=seed_env (NULL: unset).
 * Returns the exit status; the child's stderr goes to err. */
static int run_child(const char *path, const char *seed_env, char *err, size_t errlen) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(p[1], 2);
    close(p[0]);
    close(p[1]);
    if (seed_env) setenv("NCFSM_TEST_SEED", seed_env, 1);
    else unsetenv("NCFSM_TEST_SEED");
    execl("/proc/self/exe", "test_testkit", "--child", path, (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  size_t len = 0;
  for (;;) {
    ssize_t k = read(p[0], err + len, errlen - 1 - len);
    if (k <= 0) break;
    len += (size_t)k;
    if (len == errlen - 1) break;
  }
  err[len] = '\0';
  close(p[0]);
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  assert_non_null(s);
  assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
  s[n] = '\0';
  fclose(f);
  return s;
}

/* A failed check in a run with a random seed prints the seed; a new process
 * with NCFSM_TEST_SEED set to it records the same trace, byte for byte. */
static void test_replay_printed_seed(void **state) {
  (void)state;
  char dir[] = "/tmp/ncfsm-testkit-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char p1[64], p2[64];
  snprintf(p1, sizeof p1, "%s/first.txt", dir);
  snprintf(p2, sizeof p2, "%s/replay.txt", dir);
  static char err[65536];
  assert_int_equal(run_child(p1, "random", err, sizeof err), 1);
  const char *line = strstr(err, "ncfsm testing: seed ");
  if (!line) fail_msg("no seed line in the failed run's stderr:\n%s", err);
  unsigned long long seed = 0, again = 0;
  if (sscanf(line, "ncfsm testing: seed %llu (replay: NCFSM_TEST_SEED=%llu)", &seed, &again) != 2 || seed != again)
    fail_msg("seed line not in the documented form: %.200s", line);
  assert_non_null(strstr(err, "FAILED: expected a trace line matching \"*-NO_SUCH_EVENT->*\""));
  char seed_s[32];
  snprintf(seed_s, sizeof seed_s, "%llu", seed);
  assert_int_equal(run_child(p2, seed_s, err, sizeof err), 1);
  char *a = slurp(p1), *b = slurp(p2);
  if (strcmp(a, b)) fail_msg("NCFSM_TEST_SEED=%s did not replay the trace:\n--- first\n%s--- replay\n%s", seed_s, a, b);
  /* and the same seed in this process */
  char *c = scenario_seed(seed);
  if (strcmp(a, c)) fail_msg("seed %s in this process gave another trace than in the child", seed_s);
  free(a);
  free(b);
  free(c);
  unlink(p1);
  unlink(p2);
  rmdir(dir);
}

static int child_main(const char *path) {
  ncfsm_test_opts to;
  ncfsm_test_opts_init(&to);
  to.name = "replay";
  ncfsm_test *t = NULL;
  if (ncfsm_test_begin(&to, &t) != NCFSM_OK) return 3;
  char *text = scenario(t);
  free(text);
  if (ncfsm_test_trace_save(t, path) != NCFSM_OK) return 4;
  const char *pat[] = {"*-NO_SUCH_EVENT->*"}; /* fails on purpose: prints the seed */
  ncfsm_test_expect_lines(t, pat, 1);
  return ncfsm_test_end(t) ? 1 : 0;
}

/* ---- every fault kind, through the engine --------------------------------------------------- */

static void test_async_error_at_op(void **state) {
  (void)state;
  ncfsm_test *t = begin("async_error_at_op", 7);
  ncfsm_fault f;
  f = fault_for(NCFSM_FAULT_ASYNC_ERROR, "ae", 1);
  f.at = 2;
  int id = add(t, &f);
  world w;
  world_up(&w, t, "ae", 2, SHORT_MS, 1);
  for (int step = 0; step < 3; step++) {
    ncfsm_work *ws[2];
    world_step(&w, step, ws);
    world_wait(&w, ws);
    if (step < 2) {
      HOLDS(t, ncfsm_test_expect_work(t, ws[1], NCFSM_WORK_COMPLETED, NCFSM_OK));
      assert_true(w.buf[0][0] == (float)(3 + 2 * step));
    } else {
      HOLDS(t, ncfsm_test_expect_work(t, ws[1], NCFSM_WORK_FAILED, NCFSM_ERR_ASYNC));
    }
    world_release_works(&w, ws);
  }
  HOLDS(t, ncfsm_test_expect_fired(t, id, 1, 1));
  const char *seq[] = {"ae r1: LAUNCH_IN_PROGRESS -ASYNC_ERROR-> ERROR NCFSM_ERR_ASYNC",
                       "ae r1 w2 seq 2: LAUNCHING -> FAILED NCFSM_ERR_ASYNC", "ae r1: ERROR -POLICY-> ABORT_QUEUED *"};
  HOLDS(t, ncfsm_test_expect_lines(t, seq, 3));
  HOLDS(t, ncfsm_test_expect_path(t, "ae", 1, "NEW * READY * ERROR ABORT_QUEUED CLOSING CLOSED*"));
  world_down(&w, t);
  HOLDS(t, ncfsm_test_expect_final_once(t));
  assert_int_equal(finish(t), 0);
}

/* AT_STATE: the second launch of rank 0; FINALIZING: the finalize fails. */
static void test_async_error_at_state(void **state) {
  (void)state;
  ncfsm_test *t = begin("async_error_at_state", 8);
  ncfsm_fault f;
  f = fault_for(NCFSM_FAULT_ASYNC_ERROR, "st", 0);
  f.when = NCFSM_AT_STATE;
  f.state = NCFSM_STATE_LAUNCH_IN_PROGRESS;
  f.at = 2;
  f.code = 3; /* ncclInternalError */
  int id_launch = add(t, &f);
  f = fault_for(NCFSM_FAULT_ASYNC_ERROR, "fin", 1);
  f.when = NCFSM_AT_STATE;
  f.state = NCFSM_STATE_FINALIZING;
  int id_fin = add(t, &f);

  world w;
  world_up(&w, t, "st", 2, SHORT_MS, 1);
  for (int step = 0; step < 2; step++) {
    ncfsm_work *ws[2];
    world_step(&w, step, ws);
    world_wait(&w, ws);
    HOLDS(t, ncfsm_test_expect_work(t, ws[0], step ? NCFSM_WORK_FAILED : NCFSM_WORK_COMPLETED,
                                    step ? NCFSM_ERR_ASYNC : NCFSM_OK));
    world_release_works(&w, ws);
  }
  assert_int_equal(ncfsm_comm_backend_error(w.c[0]), 3);
  world_down(&w, t);
  HOLDS(t, ncfsm_test_expect_fired(t, id_launch, 1, 1));

  world_up(&w, t, "fin", 2, 0, 1);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_finalize(w.c[r]), NCFSM_OK);
  assert_int_not_equal(ncfsm_comm_wait_state(w.c[1], NCFSM_STATE_FINALIZED, 10000), NCFSM_OK);
  /* rank 0 finalized before rank 1's failure reached it, or failed with it (NCFSM_ERR_PEER) */
  if (ncfsm_comm_wait_state(w.c[0], NCFSM_STATE_FINALIZED, 100) != NCFSM_OK)
    HOLDS(t, ncfsm_test_check(t, strstr(ncfsm_comm_failure(w.c[0]), "rank 1's comm failed first") != NULL,
                              "rank 0 in %s: %s", ncfsm_state_name(ncfsm_comm_state(w.c[0])),
                              ncfsm_comm_failure(w.c[0])));
  HOLDS(t, ncfsm_test_expect_path(t, "fin", 1, "* FINALIZING ERROR *"));
  world_down(&w, t);
  HOLDS(t, ncfsm_test_expect_fired(t, id_fin, 1, 1));
  assert_int_equal(finish(t), 0);
}

/* AT_POLL: the 40th poll of rank 1, while works flow. */
static void test_async_error_at_poll(void **state) {
  (void)state;
  ncfsm_test *t = begin("async_error_at_poll", 9);
  ncfsm_fault f;
  f = fault_for(NCFSM_FAULT_ASYNC_ERROR, "poll", 1);
  f.when = NCFSM_AT_POLL;
  f.at = 40;
  int id = add(t, &f);
  world w;
  world_up(&w, t, "poll", 2, SHORT_MS, 1);
  int failed = 0;
  for (int step = 0; step < 200 && !failed; step++) {
    ncfsm_work *ws[2];
    world_step(&w, step, ws);
    world_wait(&w, ws);
    failed = ncfsm_work_status(ws[1]) != NCFSM_OK;
    world_release_works(&w, ws);
  }
  assert_true(failed);
  HOLDS(t, ncfsm_test_expect_fired(t, id, 1, 1));
  HOLDS(t, ncfsm_test_expect_count(t, "poll r1: * -ASYNC_ERROR-> ERROR *", 1, 1));
  world_down(&w, t);
  assert_int_equal(finish(t), 0);
}

/* AT_MS: an error 30 ms after creation on a rank whose launch never ends. */
static void test_async_error_at_ms(void **state) {
  (void)state;
  ncfsm_test *t = begin("async_error_at_ms", 10);
  ncfsm_fault f;
  f = fault_for(NCFSM_FAULT_SLOW, "ms", 0);
  f.polls = -1; /* the launch never ends */
  add(t, &f);
  f = fault_for(NCFSM_FAULT_ASYNC_ERROR, "ms", 0);
  f.when = NCFSM_AT_MS;
  f.at = 30;
  int id = add(t, &f);
  world w;
  world_up(&w, t, "ms", 2, 5000, 1);
  ncfsm_work *ws[2];
  world_step(&w, 0, ws);
  ncfsm_work_wait(ws[0], 10000);
  HOLDS(t, ncfsm_test_expect_work(t, ws[0], NCFSM_WORK_FAILED, NCFSM_ERR_ASYNC));
  HOLDS(t, ncfsm_test_expect_fired(t, id, 1, 1));
  HOLDS(t, ncfsm_test_expect_path(t, "ms", 0, "* READY LAUNCH_IN_PROGRESS ERROR*"));
  world_release_works(&w, ws);
  world_down(&w, t);
  assert_int_equal(finish(t), 0);
}

static void test_init_fail_and_hang(void **state) {
  (void)state;
  ncfsm_test *t = begin("init", 11);
  ncfsm_fault f;
  f = fault_for(NCFSM_FAULT_INIT_FAIL, "ifail", 1);
  int id_fail = add(t, &f);
  f = fault_for(NCFSM_FAULT_INIT_HANG, "ihang", 0);
  f.times = 1;
  int id_hang = add(t, &f);

  world w;
  world_up(&w, t, "ifail", 2, 0, 0);
  assert_int_equal(ncfsm_comm_wait_state(w.c[0], NCFSM_STATE_READY, 10000), NCFSM_OK);
  assert_int_not_equal(ncfsm_comm_wait_state(w.c[1], NCFSM_STATE_READY, 10000), NCFSM_OK);
  assert_int_equal(ncfsm_comm_backend_error(w.c[1]), 2);
  HOLDS(t, ncfsm_test_expect_path(t, "ifail", 1, "NEW INIT_QUEUED INIT_IN_PROGRESS INIT_FAILED *"));
  world_down(&w, t);

  world_up(&w, t, "ihang", 2, SHORT_MS, 0);
  assert_int_equal(ncfsm_comm_wait_state(w.c[1], NCFSM_STATE_READY, 10000), NCFSM_OK);
  assert_int_not_equal(ncfsm_comm_wait_state(w.c[0], NCFSM_STATE_READY, 10000), NCFSM_OK);
  assert_non_null(strstr(ncfsm_comm_failure(w.c[0]), "INIT_IN_PROGRESS"));
  HOLDS(t, ncfsm_test_expect_lines(t, (const char *const[]){"ihang r0: INIT_IN_PROGRESS -TIMEOUT-> INIT_FAILED *"}, 1));
  world_down(&w, t);
  /* times = 1: the next comm of that name initialises */
  world_up(&w, t, "ihang", 2, SHORT_MS, 1);
  world_down(&w, t);
  HOLDS(t, ncfsm_test_expect_fired(t, id_fail, 1, 1));
  HOLDS(t, ncfsm_test_expect_fired(t, id_hang, 1, 1));
  HOLDS(t, ncfsm_test_expect_path(t, "ihang.1", 0, "NEW INIT_QUEUED INIT_IN_PROGRESS READY * CLOSED*"));
  assert_int_equal(finish(t), 0);
}

static void test_slow_rank(void **state) {
  (void)state;
  ncfsm_test_opts to;
  ncfsm_test_opts_init(&to);
  to.name = "slow";
  to.poll_jitter = 0;
  ncfsm_test *t = begin_opts(&to);
  ncfsm_fault f;
  f = fault_for(NCFSM_FAULT_SLOW, "slow", 1);
  f.polls = 50;
  int id = add(t, &f);
  world w;
  world_up(&w, t, "slow", 2, 0, 1);
  ncfsm_sim_stats s0[2], s1[2];
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_sim_get_stats(w.c[r], &s0[r]), NCFSM_OK);
  for (int step = 0; step < 4; step++) {
    ncfsm_work *ws[2];
    world_step(&w, step, ws);
    world_wait(&w, ws);
    for (int r = 0; r < 2; r++) HOLDS(t, ncfsm_test_expect_work(t, ws[r], NCFSM_WORK_COMPLETED, NCFSM_OK));
    world_release_works(&w, ws);
  }
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_sim_get_stats(w.c[r], &s1[r]), NCFSM_OK);
  /* rank 1's launches took 50 polls more each; both ranks launch in one
   * backend group (the engine coalesces the ranks of one loop), which
   * stays in progress while any of its comms does (as NCCL's group) */
  for (int r = 0; r < 2; r++)
    if (s1[r].polls - s0[r].polls < 4 * 50)
      fail_msg("rank %d polled %llu times in 4 launches, expected >= 200", r,
               (unsigned long long)(s1[r].polls - s0[r].polls));
  HOLDS(t, ncfsm_test_expect_count(t, "slow r? w? seq ?: IN_FLIGHT -> COMPLETED NCFSM_OK", 8, 8));
  HOLDS(t, ncfsm_test_expect_fired(t, id, 1, 1));
  world_down(&w, t);
  assert_int_equal(finish(t), 0);
}

/* NEVER_ARRIVE and DEAD from op 1 on: the peer's collective hangs until the watchdog. */
static void hang_case(ncfsm_fault_kind_t kind, const char *name) {
  ncfsm_test *t = begin(name, 12);
  ncfsm_fault f = fault_for(kind, name, 1);
  f.at = 1;
  int id = add(t, &f);
  world w;
  world_up(&w, t, name, 2, SHORT_MS, 1);
  for (int step = 0; step < 2; step++) {
    ncfsm_work *ws[2];
    world_step(&w, step, ws);
    world_wait(&w, ws);
    if (!step) HOLDS(t, ncfsm_test_expect_work(t, ws[0], NCFSM_WORK_COMPLETED, NCFSM_OK));
    /* rank 0's work times out, or fails with rank 1's timeout first (NCFSM_ERR_PEER: the
     * verification passes a failure on to the other ranks) */
    ncfsm_work_state_t st = ncfsm_work_state(ws[0]);
    ncfsm_result_t rc = ncfsm_work_status(ws[0]);
    if (step)
      HOLDS(t, ncfsm_test_check(t, (st == NCFSM_WORK_TIMED_OUT && rc == NCFSM_ERR_TIMEOUT) ||
                                       (st == NCFSM_WORK_FAILED && rc == NCFSM_ERR_PEER),
                                "rank 0's work ended %s with %s", ncfsm_work_state_name(st), ncfsm_err_name(rc)));
    world_release_works(&w, ws);
  }
  HOLDS(t, ncfsm_test_expect_fired(t, id, 1, 1));
  char pat[96];
  snprintf(pat, sizeof pat, "%s r? w1 seq 1: IN_FLIGHT -> TIMED_OUT NCFSM_ERR_TIMEOUT", name);
  HOLDS(t, ncfsm_test_expect_count(t, pat, 1, 2)); /* the first watchdog at least */
  world_down(&w, t);
  assert_int_equal(finish(t), 0);
}

static void test_never_arrive(void **state) {
  (void)state;
  hang_case(NCFSM_FAULT_NEVER_ARRIVE, "never");
}

static void test_dead(void **state) {
  (void)state;
  hang_case(NCFSM_FAULT_DEAD, "dead");
}

/* MISMATCH count: rank 0 (the smaller count) completes, rank 1 hangs;
 * redop: silent, both ranks get rank 0's (injected) MAX. */
static void test_mismatch(void **state) {
  (void)state;
  ncfsm_test *t = begin("mismatch", 13);
  ncfsm_fault f;
  f = fault_for(NCFSM_FAULT_MISMATCH, "mmc", 0);
  f.at = 1;
  f.field = NCFSM_MISMATCH_COUNT;
  int id_c = add(t, &f);
  f = fault_for(NCFSM_FAULT_MISMATCH, "mmr", 0);
  f.at = 0;
  f.field = NCFSM_MISMATCH_REDOP;
  int id_r = add(t, &f);

  world w;
  world_up(&w, t, "mmc", 2, SHORT_MS, 1);
  for (int step = 0; step < 2; step++) {
    ncfsm_work *ws[2];
    world_step(&w, step, ws);
    world_wait(&w, ws);
    HOLDS(t, ncfsm_test_expect_work(t, ws[0], NCFSM_WORK_COMPLETED, NCFSM_OK));
    HOLDS(t, ncfsm_test_expect_work(t, ws[1], step ? NCFSM_WORK_TIMED_OUT : NCFSM_WORK_COMPLETED,
                                    step ? NCFSM_ERR_TIMEOUT : NCFSM_OK));
    if (step) assert_true(w.buf[0][0] == 2.0f); /* completed without data: its input is still there */
    world_release_works(&w, ws);
  }
  world_down(&w, t);

  world_up(&w, t, "mmr", 2, 0, 1);
  ncfsm_work *ws[2];
  world_step(&w, 0, ws); /* rank 0: 1, rank 1: 2 */
  world_wait(&w, ws);
  for (int r = 0; r < 2; r++) {
    HOLDS(t, ncfsm_test_expect_work(t, ws[r], NCFSM_WORK_COMPLETED, NCFSM_OK));
    assert_true(w.buf[r][0] == 2.0f); /* MAX, not the SUM (3) every rank asked for */
  }
  world_release_works(&w, ws);
  world_down(&w, t);
  HOLDS(t, ncfsm_test_expect_fired(t, id_c, 1, 1));
  HOLDS(t, ncfsm_test_expect_fired(t, id_r, 1, 1));
  assert_int_equal(finish(t), 0);
}

/* KILL: rank 1's process dies when it launches op 2; rank 0, in another
 * process, sees ncclRemoteError. */
static int mp_rank(const ncfsm_unique_id *id, int rank) {
  ncfsm_loop *loop;
  ncfsm_comm *c;
  if (ncfsm_loop_new(NULL, &loop) != NCFSM_OK) return 10;
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.backend = NCFSM_BACKEND_SIM;
  o.name = "mp";
  o.timeout_ms = 20000;
  if (ncfsm_comm_new(loop, &o, &c) != NCFSM_OK || ncfsm_comm_init(c, 2, rank, id) != NCFSM_OK) return 11;
  if (ncfsm_comm_wait_state(c, NCFSM_STATE_READY, 20000) != NCFSM_OK) return 12;
  float b[N];
  int rc = 0;
  for (int step = 0; step < 4 && !rc; step++) {
    ncfsm_work *w;
    for (int i = 0; i < N; i++) b[i] = 1.0f;
    if (ncfsm_allreduce(c, b, b, N, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w) != NCFSM_OK) return 13;
    ncfsm_result_t st = ncfsm_work_wait(w, 20000);
    ncfsm_work_release(w);
    if (step < 2 && (st != NCFSM_OK || b[0] != 2.0f)) rc = 14;
    if (step == 2) {
      if (st != NCFSM_ERR_ASYNC || ncfsm_comm_backend_error(c) != 6) rc = 15;
      break;
    }
  }
  if (ncfsm_comm_state(c) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(c);
  ncfsm_comm_wait_state(c, NCFSM_STATE_CLOSED, 20000);
  ncfsm_comm_release(c);
  ncfsm_loop_close(loop);
  return rc;
}

static void test_kill_process(void **state) {
  (void)state;
  ncfsm_test *t = begin("kill", 14);
  ncfsm_fault f;
  f = fault_for(NCFSM_FAULT_KILL, "mp", 1);
  f.at = 2;
  add(t, &f);
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
  pid_t pid[2];
  for (int r = 0; r < 2; r++) {
    pid[r] = fork();
    assert_true(pid[r] >= 0);
    if (pid[r] == 0) _exit(mp_rank(&id, r));
  }
  int st[2];
  for (int r = 0; r < 2; r++) assert_int_equal(waitpid(pid[r], &st[r], 0), pid[r]);
  if (!WIFEXITED(st[0]) || WEXITSTATUS(st[0]) != 0)
    fail_msg("rank 0 (the survivor) ended with status %#x (exit %d)", st[0], WIFEXITED(st[0]) ? WEXITSTATUS(st[0]) : -1);
  assert_true(WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL);
  assert_int_equal(finish(t), 0);
}

/* set_sim_opts: a 2.28.3 model for one comm (no ncclCommRevoke). */
static void test_sim_opts(void **state) {
  (void)state;
  ncfsm_test *t = begin("opts", 15);
  ncfsm_sim_opts so;
  assert_int_equal(ncfsm_sim_opts_init(&so), NCFSM_OK);
  so.has_revoke = 0;
  assert_int_equal(ncfsm_test_set_sim_opts(t, "old", -1, &so), NCFSM_OK);
  world w;
  world_up(&w, t, "old", 2, 0, 1);
  assert_int_equal(ncfsm_comm_revoke(w.c[0]), NCFSM_ERR_UNSUPPORTED);
  world_down(&w, t);
  world_up(&w, t, "new", 2, 0, 1);
  assert_int_equal(ncfsm_comm_revoke(w.c[0]), NCFSM_OK);
  world_down(&w, t);
  assert_int_equal(finish(t), 0);
}

/* The checks fail when they should, with the seed, and count. */
static void test_checks_fail(void **state) {
  (void)state;
  ncfsm_test_opts to;
  ncfsm_test_opts_init(&to);
  to.name = "checks";
  to.seed = 99;
  to.quiet = 1;
  ncfsm_test *t = begin_opts(&to);
  ncfsm_test *t2 = NULL;
  assert_int_equal(ncfsm_test_begin(&to, &t2), NCFSM_ERR_BUSY);
  world w;
  world_up(&w, t, "chk", 2, 0, 1);
  ncfsm_work *ws[2];
  world_step(&w, 0, ws);
  world_wait(&w, ws);
  assert_int_equal(ncfsm_test_expect_work(t, ws[0], NCFSM_WORK_COMPLETED, NCFSM_OK), 0);
  assert_int_equal(ncfsm_test_expect_work(t, ws[0], NCFSM_WORK_FAILED, NCFSM_ERR_ASYNC), -1);
  assert_non_null(strstr(ncfsm_test_last_failure(t), "is COMPLETED with status NCFSM_OK, expected FAILED"));
  world_release_works(&w, ws);
  const char *good[] = {"chk r0: NEW -*", "chk r0 w0 seq -: - -> QUEUED", "chk r0 w0 seq 0: * -> COMPLETED NCFSM_OK"};
  assert_int_equal(ncfsm_test_expect_lines(t, good, 3), 0);
  const char *bad[] = {"chk r0 w0 seq 0: * -> COMPLETED NCFSM_OK", "chk r0 w0 seq -: - -> QUEUED"};
  assert_int_equal(ncfsm_test_expect_lines(t, bad, 2), -1);
  assert_non_null(strstr(ncfsm_test_last_failure(t), "(pattern 2 of 2) after line"));
  assert_non_null(strstr(ncfsm_test_last_failure(t), "\nncfsm testing: seed 99 (replay: NCFSM_TEST_SEED=99)"));
  assert_int_equal(ncfsm_test_expect_count(t, "chk r? w0 *COMPLETED NCFSM_OK", 2, 2), 0);
  assert_int_equal(ncfsm_test_expect_count(t, "chk r? w0 *COMPLETED NCFSM_OK", 3, SIZE_MAX), -1);
  assert_int_equal(ncfsm_test_expect_path(t, "chk", 0, "NEW INIT_QUEUED INIT_IN_PROGRESS READY *"), 0);
  assert_int_equal(ncfsm_test_expect_path(t, "chk", 0, "* ERROR *"), -1);
  assert_int_equal(ncfsm_test_expect_path(t, "nope", 0, "*"), -1);
  assert_int_equal(ncfsm_test_expect_final_once(t), 0);
  unsigned once[3] = {1, 1, 1}, twice[3] = {1, 2, 1};
  assert_int_equal(ncfsm_test_expect_once(t, "callback", once, 3), 0);
  assert_int_equal(ncfsm_test_expect_once(t, "callback", twice, 3), -1);
  assert_non_null(strstr(ncfsm_test_last_failure(t), "callback 1 ran 2 time(s), expected exactly once"));
  assert_int_equal(ncfsm_test_check(t, 1, "never"), 0);
  assert_int_equal(ncfsm_test_check(t, 0, "my check %d", 5), -1);
  assert_non_null(strstr(ncfsm_test_last_failure(t), "FAILED: my check 5"));
  ncfsm_fault f;
  ncfsm_fault_init(&f, NCFSM_FAULT_ASYNC_ERROR);
  f.when = NCFSM_AT_STATE;
  f.state = NCFSM_STATE_READY;
  assert_int_equal(ncfsm_test_add_fault(t, &f), -1);
  assert_non_null(strstr(ncfsm_test_last_failure(t), "AT_STATE needs a polled state"));
  ncfsm_fault_init(&f, NCFSM_FAULT_ASYNC_ERROR);
  f.code = 7;
  assert_int_equal(ncfsm_test_add_fault(t, &f), -1);
  char path[256];
  assert_true(ncfsm_test_comm_path(t, "chk", 1, path, sizeof path) >= 3);
  assert_int_equal(strncmp(path, "NEW INIT_QUEUED INIT_IN_PROGRESS READY", 38), 0);
  world_down(&w, t);
  assert_int_equal(ncfsm_test_failures(t), 9);
  assert_int_equal(finish(t), 9);
}

static void test_bad_seed_env(void **state) {
  (void)state;
  setenv("NCFSM_TEST_SEED", "12x", 1);
  ncfsm_test *t = NULL;
  assert_int_equal(ncfsm_test_begin(NULL, &t), NCFSM_ERR_INVALID_ARGUMENT);
  setenv("NCFSM_TEST_SEED", "0x10", 1);
  assert_int_equal(ncfsm_test_begin(NULL, &t), NCFSM_OK);
  assert_int_equal(ncfsm_test_seed(t), 16);
  assert_int_equal(finish(t), 0);
  unsetenv("NCFSM_TEST_SEED");
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--child")) return child_main(argv[2]);
  unsetenv("NCFSM_TEST_SEED");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_same_seed_same_trace, teardown),
      cmocka_unit_test_teardown(test_other_seeds_other_orders, teardown),
      cmocka_unit_test_teardown(test_replay_printed_seed, teardown),
      cmocka_unit_test_teardown(test_async_error_at_op, teardown),
      cmocka_unit_test_teardown(test_async_error_at_state, teardown),
      cmocka_unit_test_teardown(test_async_error_at_poll, teardown),
      cmocka_unit_test_teardown(test_async_error_at_ms, teardown),
      cmocka_unit_test_teardown(test_init_fail_and_hang, teardown),
      cmocka_unit_test_teardown(test_slow_rank, teardown),
      cmocka_unit_test_teardown(test_never_arrive, teardown),
      cmocka_unit_test_teardown(test_dead, teardown),
      cmocka_unit_test_teardown(test_mismatch, teardown),
      cmocka_unit_test_teardown(test_kill_process, teardown),
      cmocka_unit_test_teardown(test_sim_opts, teardown),
      cmocka_unit_test_teardown(test_checks_fail, teardown),
      cmocka_unit_test_teardown(test_bad_seed_env, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
