/* The trainer's test suite (trainer.h) on the ncfsm testing kit
 * (include/ncfsm/testing.h), run by cmocka: one test per fault, each
 * asserting how the trainer reacts (did it recover, retry, give up, keep
 * the data right) and what its communicators went through.
 *
 *   trainer_test                   every test
 *   trainer_test --filter PATTERN  the tests whose names match (cmocka)
 *
 * Linked with trainer.c it passes; linked with the broken variant
 * (TRAINER_BROKEN) the recovery tests fail, and the kit prints what it
 * expected, the trace's tail and the seed to replay. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "ncfsm/testing.h"
#include "trainer.h"

/* cmocka integration: a kit check that fails fails the cmocka test. The kit
 * printed its message, the trace's last lines and the seed on stderr. */
#define assert_kit(expr)                                                                   \
  do {                                                                                    \
    if ((expr) != 0) fail_msg("ncfsm testing check failed: %s", #expr);                    \
  } while (0)

static ncfsm_test *T;
static trainer_opts O;
static trainer_report R;

/* A test with its seed (NCFSM_TEST_SEED replaces it) and the trainer's options. */
static void start(const char *name, uint64_t seed) {
  ncfsm_test_opts to;
  ncfsm_test_opts_init(&to);
  to.name = name;
  to.seed = seed;
  assert_int_equal(ncfsm_test_begin(&to, &T), NCFSM_OK);
  trainer_opts_init(&O);
  O.nranks = 2;
  O.steps = 6;
  O.count = 16;
  O.timeout_ms = 300; /* a hung collective fails after 300 ms */
}

static int teardown(void **state) {
  (void)state;
  if (T) ncfsm_test_end(T);
  T = NULL;
  return 0;
}

static ncfsm_fault fault(ncfsm_fault_kind_t kind, int rank) {
  ncfsm_fault f;
  ncfsm_fault_init(&f, kind);
  f.comm = "train";
  f.rank = rank;
  return f;
}

static int add(ncfsm_fault f) {
  int id = ncfsm_test_add_fault(T, &f);
  assert_true(id >= 0);
  return id;
}

/* Run the trainer on a recorded loop; then the checks every run must pass:
 * every work ended exactly once, every callback ran exactly once. */
static int run(void) {
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  assert_int_equal(ncfsm_test_record(T, loop), NCFSM_OK);
  int rc = trainer_run(loop, &O, &R);
  ncfsm_test_unrecord(T, loop);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
  assert_kit(ncfsm_test_expect_final_once(T));
  assert_kit(ncfsm_test_expect_once(T, "trainer callback", R.cb_count, R.nworks));
  return rc;
}

static void finish(void) {
  assert_int_equal(ncfsm_test_end(T), 0);
  T = NULL;
}

/* Recovered once, then every step done: the failed comms were aborted and
 * new ones ("train.1") made. */
static void assert_recovered_once(void) {
  assert_kit(ncfsm_test_check(T, R.steps_done == O.steps && R.recoveries == 1 && !R.gave_up,
                              "trainer: %d/%d steps, %d recoveries, gave up %d (%s); expected every step after "
                              "one recovery", R.steps_done, O.steps, R.recoveries, R.gave_up, R.why));
  const char *recovery[] = {"train r?: CLOSING -CLOSE_DONE-> CLOSED *", "train.1 r0: NEW -INIT-> INIT_QUEUED NCFSM_OK",
                            "train.1 r1: NEW -INIT-> INIT_QUEUED NCFSM_OK",
                            "train.1 r0: FINALIZED -DESTROY-> CLOSING NCFSM_OK"};
  assert_kit(ncfsm_test_expect_lines(T, recovery, 4));
}

static void test_clean_run(void **state) {
  (void)state;
  start("trainer.clean_run", 1);
  assert_int_equal(run(), 0);
  assert_int_equal(R.steps_done, O.steps);
  assert_int_equal(R.recoveries, 0);
  for (int r = 0; r < 2; r++)
    assert_kit(ncfsm_test_expect_path(T, "train", r,
                                      "NEW INIT_QUEUED INIT_IN_PROGRESS READY * FINALIZING FINALIZED CLOSING CLOSED RELEASED"));
  assert_kit(ncfsm_test_expect_count(T, "train r? w? seq ?: IN_FLIGHT -> COMPLETED NCFSM_OK", 12, 12));
  finish();
}

static void test_init_failure(void **state) {
  (void)state;
  start("trainer.init_failure", 2);
  ncfsm_fault f = fault(NCFSM_FAULT_INIT_FAIL, 1);
  f.times = 1; /* the first comm only: the recovery's init succeeds */
  int id = add(f);
  run(); /* its result: in assert_recovered_once */
  assert_recovered_once();
  assert_kit(ncfsm_test_expect_fired(T, id, 1, 1));
  assert_kit(ncfsm_test_expect_path(T, "train", 1, "NEW INIT_QUEUED INIT_IN_PROGRESS INIT_FAILED *"));
  assert_int_equal(R.attempts, O.steps); /* the init failed before any step was tried */
  finish();
}

static void test_init_timeout(void **state) {
  (void)state;
  start("trainer.init_timeout", 3);
  ncfsm_fault f = fault(NCFSM_FAULT_INIT_HANG, 0);
  f.times = 1;
  add(f);
  run(); /* its result: in assert_recovered_once */
  assert_recovered_once();
  const char *seq[] = {"train r0: INIT_IN_PROGRESS -TIMEOUT-> INIT_FAILED NCFSM_ERR_TIMEOUT"};
  assert_kit(ncfsm_test_expect_lines(T, seq, 1));
  finish();
}

/* Rank 1's op 3 hits an async error: its work fails, and rank 0's fails at
 * once naming rank 1 (NCFSM_ERR_PEER: the verification tells it, no
 * watchdog needed); the step is retried on new comms. */
static void test_async_error(void **state) {
  (void)state;
  start("trainer.async_error", 4);
  ncfsm_fault f = fault(NCFSM_FAULT_ASYNC_ERROR, 1);
  f.at = 3;
  f.times = 1;
  add(f);
  run(); /* its result: in assert_recovered_once */
  assert_recovered_once();
  assert_int_equal(R.attempts, O.steps + 1);
  const char *seq[] = {"train r1: LAUNCH_IN_PROGRESS -ASYNC_ERROR-> ERROR NCFSM_ERR_ASYNC",
                       "train r1 w3 seq 3: * -> FAILED NCFSM_ERR_ASYNC",
                       "train r0 w3 seq 3: IN_FLIGHT -> FAILED NCFSM_ERR_PEER"};
  assert_kit(ncfsm_test_expect_lines(T, seq, 3));
  finish();
}

static void test_peer_never_arrives(void **state) {
  (void)state;
  start("trainer.never_arrives", 5);
  ncfsm_fault f = fault(NCFSM_FAULT_NEVER_ARRIVE, 1);
  f.at = 2;
  f.times = 1;
  add(f);
  run(); /* its result: in assert_recovered_once */
  assert_recovered_once();
  /* the first watchdog to fire ends its rank's work; the other rank's fails with it (NCFSM_ERR_PEER),
   * unless its own watchdog fired in the same turn */
  assert_kit(ncfsm_test_expect_count(T, "train r? w2 seq 2: IN_FLIGHT -> TIMED_OUT NCFSM_ERR_TIMEOUT", 1, 2));
  assert_kit(ncfsm_test_expect_count(T, "train r? w2 seq 2: IN_FLIGHT -> * NCFSM_ERR_*", 2, 2));
  finish();
}

/* Three ranks; rank 2 is dead from its op 4 on (no error anywhere: the
 * first watchdog to fire ends the step, and the others' works fail with it). */
static void test_dead_peer(void **state) {
  (void)state;
  start("trainer.dead_peer", 6);
  O.nranks = 3;
  ncfsm_fault f = fault(NCFSM_FAULT_DEAD, 2);
  f.at = 4;
  f.times = 1;
  add(f);
  assert_int_equal(run(), 0);
  assert_kit(ncfsm_test_check(T, R.steps_done == O.steps && R.recoveries == 1, "%d steps, %d recoveries",
                              R.steps_done, R.recoveries));
  assert_kit(ncfsm_test_expect_count(T, "train r? w4 seq 4: IN_FLIGHT -> TIMED_OUT NCFSM_ERR_TIMEOUT", 1, 3));
  assert_kit(ncfsm_test_expect_count(T, "train r? w4 seq 4: IN_FLIGHT -> * NCFSM_ERR_*", 3, 3));
  finish();
}

/* A slow rank is not a failure: no retry. */
static void test_slow_rank(void **state) {
  (void)state;
  start("trainer.slow_rank", 7);
  ncfsm_fault f = fault(NCFSM_FAULT_SLOW, 1);
  f.polls = 40;
  int id = add(f);
  assert_int_equal(run(), 0);
  assert_int_equal(R.recoveries, 0);
  assert_int_equal(R.attempts, O.steps);
  assert_kit(ncfsm_test_expect_fired(T, id, 1, 1));
  assert_kit(ncfsm_test_expect_count(T, "*TIMED_OUT*", 0, 0));
  finish();
}

/* Rank 0's op 1 has half the count NCCL expects (R11): rank 0 completes
 * without data, rank 1 hangs until the watchdog. */
static void test_mismatch_hang(void **state) {
  (void)state;
  start("trainer.mismatch_hang", 8);
  ncfsm_fault f = fault(NCFSM_FAULT_MISMATCH, 0);
  f.at = 1;
  f.field = NCFSM_MISMATCH_COUNT;
  f.times = 1;
  add(f);
  run(); /* its result: in assert_recovered_once */
  assert_recovered_once();
  const char *seq[] = {"train r0 w1 seq 1: IN_FLIGHT -> COMPLETED NCFSM_OK",
                       "train r1 w1 seq 1: IN_FLIGHT -> TIMED_OUT NCFSM_ERR_TIMEOUT"};
  assert_kit(ncfsm_test_expect_lines(T, seq, 2));
  finish();
}

/* A silent mismatch: rank 0's op 2 reduces with MAX; every work completes,
 * only the trainer's data check sees it. */
static void test_silent_corruption(void **state) {
  (void)state;
  start("trainer.silent_corruption", 9);
  ncfsm_fault f = fault(NCFSM_FAULT_MISMATCH, 0);
  f.at = 2;
  f.field = NCFSM_MISMATCH_REDOP;
  f.times = 1;
  add(f);
  run(); /* its result: in assert_recovered_once */
  assert_recovered_once();
  assert_int_equal(R.corrupt, 1);
  assert_int_equal(R.last_error, NCFSM_ERR_MISMATCH);
  assert_kit(ncfsm_test_expect_count(T, "*FAILED*", 0, 0));
  finish();
}

/* An error on every comm's first op: the trainer gives up after
 * max_attempts, naming the error. */
static void test_gives_up(void **state) {
  (void)state;
  start("trainer.gives_up", 10);
  ncfsm_fault f = fault(NCFSM_FAULT_ASYNC_ERROR, 0);
  f.at = 0; /* times 0: every comm, so every attempt */
  int id = add(f);
  assert_int_equal(run(), -1);
  assert_int_equal(R.gave_up, 1);
  assert_int_equal(R.steps_done, 0);
  assert_int_equal(R.attempts, O.max_attempts);
  assert_int_equal(R.recoveries, O.max_attempts);
  assert_kit(ncfsm_test_expect_fired(T, id, 3, 3));
  assert_non_null(strstr(R.why, "NCFSM_ERR_"));
  assert_kit(ncfsm_test_expect_path(T, "train.2", 0, "* READY * ERROR ABORT_QUEUED CLOSING CLOSED RELEASED"));
  finish();
}

/* Replay: two runs with one seed make the same transitions, byte for byte
 * (a slow rank and the seed's poll counts and shuffles included). */
static char *slow_run_text(uint64_t seed) {
  start("trainer.replay", seed);
  ncfsm_fault f = fault(NCFSM_FAULT_SLOW, 1);
  f.polls = 3;
  f.phases = 2;
  add(f);
  assert_int_equal(run(), 0);
  char *text = ncfsm_test_trace_text(T);
  assert_non_null(text);
  finish();
  return text;
}

static void test_replay(void **state) {
  (void)state;
  char *a = slow_run_text(11), *b = slow_run_text(11);
  assert_string_equal(a, b);
  free(a);
  free(b);
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--filter")) cmocka_set_test_filter(argv[2]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_clean_run, teardown),
      cmocka_unit_test_teardown(test_init_failure, teardown),
      cmocka_unit_test_teardown(test_init_timeout, teardown),
      cmocka_unit_test_teardown(test_async_error, teardown),
      cmocka_unit_test_teardown(test_peer_never_arrives, teardown),
      cmocka_unit_test_teardown(test_dead_peer, teardown),
      cmocka_unit_test_teardown(test_slow_rank, teardown),
      cmocka_unit_test_teardown(test_mismatch_hang, teardown),
      cmocka_unit_test_teardown(test_silent_corruption, teardown),
      cmocka_unit_test_teardown(test_gives_up, teardown),
      cmocka_unit_test_teardown(test_replay, teardown),
  };
  return cmocka_run_group_tests_name("07_testing", tests, NULL, NULL);
}
