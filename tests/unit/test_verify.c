/*
 * Async cross-rank verification (issue 9, item 4; docs/ordering.md): two
 * ranks, each on its own thread with its own loop, joined through the
 * in-process bootstrap; window 4. A consistent run passes; a silent
 * mismatch (AllReduce SUM on rank 0, MAX on rank 1: NCCL and the sim
 * complete it on both ranks with no error, R11) fails both comms with
 * NCFSM_ERR_MISMATCH at the next window; a rank that stops fails the other
 * after verify_stall_ms, long before the watchdog.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "helpers.h"
#include "ncfsm/bootstrap.h"

#define N 2
#define OPS 12

enum scenario { CONSISTENT, SILENT_MISMATCH, STALL, LEAVE, FAIL, P2P_OK, P2P_COUNT, P2P_SKIP, P2P_PARTIAL, P2P_TAIL, TAIL, TAIL_AHEAD, TAIL_AHEAD_OK };
#define P2P(s) ((s) == P2P_OK || (s) == P2P_COUNT || (s) == P2P_SKIP || (s) == P2P_PARTIAL || (s) == P2P_TAIL)
/* the rank that stops early (STALL, LEAVE: rank 1; P2P_SKIP: rank 0, the sender) and the one judged */
#define STOPPER (sc == P2P_SKIP || sc == P2P_PARTIAL ? 0 : 1)

struct rank_result {
  const char *fail_at;
  ncfsm_state_t state;
  ncfsm_result_t cause; /* first non-OK work status */
  int ok, failed;
  double detect_ms; /* submit of the first op -> the comm in ERROR */
  char failure[512];
};

static enum scenario sc;
static const char *group;
/* the judged rank (not STOPPER) has its verdict: until then the stopping
 * rank keeps its bootstrap open (a closed bootstrap is a lost rank: it would
 * fail the other at once instead of at the stall bound, which is what this
 * test measures) */
static atomic_int judge_done;
static atomic_int verdicts; /* TAIL_AHEAD_OK: ranks whose verdict is taken */
static struct rank_result res[N];
static int32_t bufs[N][OPS][4];

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  struct rank_result *r = arg;
  if (st == NCFSM_OK) r->ok++;
  else if (!r->failed++) r->cause = st;
}

#define CHECK(cond)                    \
  do {                                 \
    if (!(cond)) {                     \
      res[rank].fail_at = #cond;       \
      goto out;                        \
    }                                  \
  } while (0)

static void *rank_main(void *arg) {
  int rank = (int)(intptr_t)arg;
  struct rank_result *r = &res[rank];
  ncfsm_loop *loop = NULL;
  ncfsm_boot *boot = NULL;
  ncfsm_comm *c = NULL;
  CHECK(ncfsm_loop_new(NULL, &loop) == NCFSM_OK);
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  bo.kind = NCFSM_BOOT_LOCAL;
  bo.local_group = group;
  bo.rank = rank;
  bo.size = N;
  CHECK(ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &boot) == NCFSM_OK);
  ncfsm_sim_opts so;
  CHECK(ncfsm_sim_opts_init(&so) == NCFSM_OK);
  if (sc == FAIL && rank == 1) so.async_error_at_op = 6; /* rank 1's comm fails at its op 5 (after the warm-up) */
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.backend = NCFSM_BACKEND_SIM;
  o.sim = &so;
  o.on_error = NCFSM_ON_ERROR_STAY;
  o.timeout_ms = 20000; /* the watchdog: far later than verification must act */
  o.verify = NCFSM_VERIFY_ASYNC;
  o.verify_window = 4;
  /* 300 ms where a stall is what is measured; the tail checks' 1,200 (their answer bound a
   * quarter of it, 300 ms, and their exchange of fingerprints bounded by it) leaves a loaded
   * machine room, as 5,000 does for the others: a slow exchange must not make a stall */
  o.verify_stall_ms = sc == STALL || sc == LEAVE || sc == P2P_SKIP || sc == P2P_PARTIAL || sc == P2P_TAIL ? 300
                      : sc == TAIL || sc == TAIL_AHEAD || sc == TAIL_AHEAD_OK                      ? 1200
                      : sc == FAIL                                                                 ? 0
                                                                                                   : 5000;
  o.name = "verify";
  CHECK(ncfsm_comm_new(loop, &o, &c) == NCFSM_OK);
  CHECK(ncfsm_comm_init_boot(c, boot) == NCFSM_OK);
  CHECK(ncfsm_comm_wait_state(c, NCFSM_STATE_READY, 10000) == NCFSM_OK);
  int nops = (sc == STALL || sc == LEAVE || sc == P2P_SKIP) && rank == STOPPER ? 2 : OPS;
  if (sc == P2P_PARTIAL) nops = rank == STOPPER ? 5 : 6; /* the window of seqs 4-7 never fills */
  if (sc == P2P_TAIL || sc == TAIL) nops = 6;              /* on both: the window of seqs 4-7 never fills */
  if (sc == TAIL_AHEAD || sc == TAIL_AHEAD_OK) nops = rank == 1 ? 7 : 6; /* rank 1's seq 6 waits for rank 0 */
  if (sc == FAIL) { /* a warm-up both ranks complete: both verifiers are in service, their channels open (a
                     * notice reaches only the ranks that opened the channel: docs/ordering.md) */
    ncfsm_work *w = NULL;
    int32_t x = 1;
    CHECK(ncfsm_allreduce(c, &x, &x, 1, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w) == NCFSM_OK);
    CHECK(ncfsm_work_wait(w, 10000) == NCFSM_OK);
    ncfsm_work_release(w);
    for (int i = 0; i < 20; i++) ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
  }
  double t0 = now_ms();
  for (int k = 0; k < nops; k++) {
    ncfsm_redop_t op = (sc == SILENT_MISMATCH || sc == TAIL || sc == TAIL_AHEAD) && rank == 1 && k == 5 ? NCFSM_OP_MAX : NCFSM_OP_SUM;
    for (int i = 0; i < 4; i++) bufs[rank][k][i] = rank + 1;
    ncfsm_result_t sr;
    if (!P2P(sc)) sr = ncfsm_allreduce(c, bufs[rank][k], bufs[rank][k], 4, NCFSM_INT32, op, NULL, on_done, r, NULL);
    else if (rank == 0) sr = ncfsm_send(c, bufs[rank][k], 4, NCFSM_INT32, 1, NULL, on_done, r, NULL);
    else /* P2P_COUNT: the receive of seq 5 is for 2 elements where 4 are sent; P2P_TAIL: as floats */
      sr = ncfsm_recv(c, bufs[rank][k], sc == P2P_COUNT && k == 5 ? 2 : 4,
                      sc == P2P_TAIL && k == 5 ? NCFSM_FLOAT32 : NCFSM_INT32, 0, NULL, on_done, r, NULL);
    if (sr != NCFSM_OK && sc == FAIL && ncfsm_comm_state(c) != NCFSM_STATE_READY) { /* failed meanwhile */
      nops = k;
      break;
    }
    CHECK(sr == NCFSM_OK);
  }
  /* Run until every callback came or the comm failed, bounded. */
  double limit = t0 + 10000;
  while (now_ms() < limit) {
    /* TAIL_AHEAD_OK: rank 0 has nothing left to wait for once its check is done */
    CHECK(ncfsm_loop_run(loop, sc == TAIL_AHEAD_OK ? NCFSM_RUN_NOWAIT : NCFSM_RUN_ONCE) == NCFSM_OK);
    if (sc == TAIL_AHEAD_OK) nanosleep(&(struct timespec){0, 1000000}, NULL);
    ncfsm_state_t s = ncfsm_comm_state(c);
    if (s == NCFSM_STATE_ERROR && r->detect_ms == 0) r->detect_ms = now_ms() - t0;
    if (sc == TAIL_AHEAD_OK) { /* 2 s: rank 0's check comes after 300 ms idle, and must find nothing */
      if (now_ms() > t0 + 2000) break;
      continue;
    }
    if (r->ok + r->failed == nops && (s == NCFSM_STATE_ERROR || sc == CONSISTENT || sc == P2P_OK ||
                                      ((sc == STALL || sc == LEAVE || sc == P2P_SKIP || sc == P2P_PARTIAL) && rank == STOPPER)))
      break;
  }
  /* a consistent run: let the last windows' exchanges finish on both ranks */
  if (sc == CONSISTENT || sc == P2P_OK) CHECK(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT) == NCFSM_OK);
  r->state = ncfsm_comm_state(c);
  snprintf(r->failure, sizeof r->failure, "%s", ncfsm_comm_failure(c));
  /* TAIL_AHEAD_OK: rank 1's abort below (its seventh in flight) tells rank 0 that rank 1's comm
   * failed; neither aborts before both have their verdict (the ranks' 2 s start apart) */
  if (sc == TAIL_AHEAD_OK) {
    atomic_fetch_add(&verdicts, 1);
    for (double until = now_ms() + 15000; atomic_load(&verdicts) < N && now_ms() < until;) {
      ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
      nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
  }
  /* STALL: rank 1 stops after 2 ops but its comm stays (and answers rank
   * 0's question: where are you?) until rank 0 is done; LEAVE: its comm goes */
  if ((sc == STALL || sc == P2P_SKIP || sc == P2P_PARTIAL) && rank == STOPPER)
    for (double until = now_ms() + 15000; !atomic_load(&judge_done) && now_ms() < until;) {
      ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  if ((sc == P2P_SKIP || sc == P2P_PARTIAL) && rank == STOPPER) { /* the judged rank's failure has reached it meanwhile */
    for (double until = now_ms() + 2000; ncfsm_comm_state(c) == NCFSM_STATE_READY && now_ms() < until;)
      ncfsm_loop_run(loop, NCFSM_RUN_ONCE);
    r->state = ncfsm_comm_state(c);
    snprintf(r->failure, sizeof r->failure, "%s", ncfsm_comm_failure(c));
  }
out:
  if (c) {
    if (ncfsm_comm_state(c) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(c);
    ncfsm_comm_release(c);
  }
  if (loop) ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
  if (rank != STOPPER) atomic_store(&judge_done, 1);
  if (sc == LEAVE && rank == 1)
    for (double until = now_ms() + 15000; !atomic_load(&judge_done) && now_ms() < until;) {
      if (loop) ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  if (boot) ncfsm_boot_close(boot);
  if (loop && ncfsm_loop_close(loop) != NCFSM_OK && !r->fail_at) r->fail_at = "loop close";
  return NULL;
}

static void run(enum scenario s, const char *g) {
  sc = s;
  group = g;
  memset(res, 0, sizeof res);
  atomic_store(&judge_done, 0);
  atomic_store(&verdicts, 0);
  pthread_t th[N];
  for (int r = 0; r < N; r++) pthread_create(&th[r], NULL, rank_main, (void *)(intptr_t)r);
  for (int r = 0; r < N; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < N; r++) {
    if (res[r].fail_at) fail_msg("rank %d: %s", r, res[r].fail_at);
    printf("rank %d: state %s, %d ok, %d failed (%s), in ERROR after %.1f ms; %s\n", r,
           ncfsm_state_name(res[r].state), res[r].ok, res[r].failed,
           res[r].failed ? ncfsm_err_name(res[r].cause) : "-", res[r].detect_ms, res[r].failure);
  }
}

static void test_consistent(void **state) {
  (void)state;
  run(CONSISTENT, "verify-consistent");
  for (int r = 0; r < N; r++) {
    assert_int_equal(res[r].state, NCFSM_STATE_READY);
    assert_int_equal(res[r].ok, OPS);
    assert_int_equal(res[r].failed, 0);
  }
}

static void test_silent_mismatch(void **state) {
  (void)state;
  run(SILENT_MISMATCH, "verify-mismatch");
  for (int r = 0; r < N; r++) {
    assert_int_equal(res[r].state, NCFSM_STATE_ERROR);
    /* the window's hashes differed; its fingerprints name the seq, the field, each rank's value */
    assert_non_null(strstr(res[r].failure, "redop mismatch: rank 0 redop SUM, rank 1 redop MAX"));
    assert_non_null(strstr(res[r].failure, "NCFSM_ERR_MISMATCH"));
    assert_true(res[r].detect_ms > 0 && res[r].detect_ms < 5000); /* the watchdog is at 20 s */
  }
}

static void test_stall(void **state) {
  (void)state;
  run(STALL, "verify-stall");
  assert_int_equal(res[0].state, NCFSM_STATE_ERROR);
  /* the stall names the rank behind and where it is (it answered the question) */
  assert_non_null(strstr(res[0].failure, "not every rank reached collective seq 4 within 300 ms of this rank; behind: "
                                         "rank 1 at seq 2 (READY)"));
  assert_true(res[0].detect_ms >= 300 && res[0].detect_ms < 5000);
}

/* Rank 1's comm fails (an async error at its op 5; no stall bound, the
 * watchdog at 20 s): rank 0's fails at once with NCFSM_ERR_PEER, naming
 * rank 1, its seq and its cause (the notice on the verification channel). */
static void test_peer_failed(void **state) {
  (void)state;
  run(FAIL, "verify-fail");
  for (int r = 0; r < N; r++) assert_int_equal(res[r].state, NCFSM_STATE_ERROR);
  assert_non_null(strstr(res[1].failure, "injected async error"));
  assert_non_null(strstr(res[0].failure, "rank 1's comm failed first, with its collectives up to seq "));
  assert_non_null(strstr(res[0].failure, "NCFSM_ERR_PEER"));
  assert_true(res[0].detect_ms < 5000);
  printf("rank 0 failed %.1f ms after its first op (rank 1 %.1f ms)\n", res[0].detect_ms, res[1].detect_ms);
}

/* Rank 1 stops after 2 ops and aborts its comm: its verification channel
 * closes, and rank 0's exchange at seq 4 fails at once naming rank 1 (no
 * stall bound to wait for). */
static void test_peer_left(void **state) {
  (void)state;
  run(LEAVE, "verify-leave");
  assert_int_equal(res[0].state, NCFSM_STATE_ERROR);
  assert_non_null(strstr(res[0].failure, "verification: the exchange at seq 4 failed"));
  assert_non_null(strstr(res[0].failure, "rank 1 closed"));
  assert_true(res[0].detect_ms < 300);
}

/* Sends and receives across ranks of other processes (here: the channel
 * path, as for processes): 12 sends from rank 0 to rank 1, window 4, so
 * windows of seqs 0, 1-3, 4-7 and 8-11 are exchanged and compared. */
static void test_p2p_consistent(void **state) {
  (void)state;
  run(P2P_OK, "verify-p2p-ok");
  for (int r = 0; r < N; r++) {
    assert_int_equal(res[r].state, NCFSM_STATE_READY);
    assert_int_equal(res[r].ok, OPS);
  }
}

/* Rank 1 receives 2 elements at seq 5 where rank 0 sends 4: both comms
 * fail naming the pair's seq, the field and both values (the window 4-7). */
static void test_p2p_count(void **state) {
  (void)state;
  run(P2P_COUNT, "verify-p2p-count");
  for (int r = 0; r < N; r++) {
    assert_int_equal(res[r].state, NCFSM_STATE_ERROR);
    assert_non_null(strstr(res[r].failure, "send/recv seq 5 from rank 0 to rank 1: count mismatch: rank 0 sends 4, "
                                           "rank 1 receives 2"));
  }
}

/* Rank 0 sends 2 where rank 1 receives 12: rank 1's exchange of seqs 1-3
 * stalls and names rank 0; rank 0 learns it from rank 1's notice. */
static void test_p2p_skip(void **state) {
  (void)state;
  run(P2P_SKIP, "verify-p2p-skip");
  assert_int_equal(res[1].state, NCFSM_STATE_ERROR);
  assert_non_null(strstr(res[1].failure, "receive seq 3 from rank 0 was launched here"));
  assert_non_null(strstr(res[1].failure, "rank 0 never posted the matching send"));
  assert_true(res[1].detect_ms >= 300 && res[1].detect_ms < 5000);
  assert_int_equal(res[0].state, NCFSM_STATE_ERROR);
  assert_non_null(strstr(res[0].failure, "rank 1's comm failed first"));
}

/* Rank 0 sends 5 where rank 1 receives 6: the window of seqs 4-7 never
 * fills, so no exchange covers seq 5; rank 1's receive waits past the stall
 * bound, asks rank 0 how far its sends are, and names it with its last seq. */
static void test_p2p_partial_window(void **state) {
  (void)state;
  run(P2P_PARTIAL, "verify-p2p-partial");
  assert_int_equal(res[1].state, NCFSM_STATE_ERROR);
  assert_non_null(strstr(res[1].failure, "receive seq 5 from rank 0 waited more than 300 ms; rank 0 never posted the "
                                         "matching send (its last send to rank 1 is seq 4)"));
  assert_int_equal(res[0].state, NCFSM_STATE_ERROR);
  assert_non_null(strstr(res[0].failure, "rank 1's comm failed first"));
}

/* Without a bootstrap there is no channel: refused at init, with a hint. */
/* Strict verification exchanges every fingerprint before its launch: it
 * needs a bootstrap (async compares in memory without one). */
/* Both ranks stop after 6 ops, rank 1's receive of seq 5 as floats where int32 are sent (the
 * same bytes; the sim holds the pair, as it pairs a send only with a receive of its count and
 * type, and the stall path finds both sides posted: NCCL's to judge, the watchdog's bound at
 * 20 s). The window of seqs 4-7 never fills, so after the answer bound (100 ms) with no new op
 * rank 0 asks rank 1 to check seqs 4-5; they differ, both cut the window there and exchange
 * it, and both comms fail naming the op. */
static void test_p2p_tail(void **state) {
  (void)state;
  run(P2P_TAIL, "verify-p2p-tail");
  for (int r = 0; r < N; r++) {
    assert_int_equal(res[r].state, NCFSM_STATE_ERROR);
    char want[200];
    snprintf(want, sizeof want, "send/recv seq 5 from rank 0 to rank 1: dtype mismatch: rank 0 sends %s, rank 1 receives %s",
             ncfsm_dtype_name(NCFSM_INT32), ncfsm_dtype_name(NCFSM_FLOAT32));
    if (!strstr(res[r].failure, want)) fail_msg("rank %d: %s", r, res[r].failure);
    assert_int_equal(res[r].ok, 5); /* seqs 0-4 */
  }
}

/* Both ranks stop after 6 AllReduces, rank 1's seq 5 with MAX where rank 0 uses SUM (both
 * complete: R11). The window of seqs 4-7 never fills; after the answer bound (300 ms) with
 * nothing new in flight, rank 0 asks rank 1 to check the collectives before seq 6 against its
 * rolling hash; they differ, both exchange the window's fingerprints and fail naming the field. */
static void tail_named(enum scenario s, const char *g) {
  run(s, g);
  for (int r = 0; r < N; r++) {
    assert_int_equal(res[r].state, NCFSM_STATE_ERROR);
    if (!strstr(res[r].failure, "seq 5: redop mismatch: rank 0 redop SUM, rank 1 redop MAX"))
      fail_msg("rank %d: %s", r, res[r].failure);
    assert_int_equal(res[r].ok, 6); /* seqs 0-5 completed: only the check could see it */
  }
}

static void test_tail(void **state) {
  (void)state;
  tail_named(TAIL, "verify-tail");
}

/* As test_tail, but rank 1 also submits a seventh, which waits for rank 0: asked about the
 * collectives before seq 6, rank 1 refolds its rolling hash there from its flight recorder. */
static void test_tail_ahead(void **state) {
  (void)state;
  tail_named(TAIL_AHEAD, "verify-tail-ahead");
}

/* As test_tail_ahead with no mismatch: rank 1's refolded hash is rank 0's, so the check finds
 * nothing; after 2 s both comms are READY, rank 1's seventh still waiting. */
static void test_tail_ahead_ok(void **state) {
  (void)state;
  run(TAIL_AHEAD_OK, "verify-tail-ahead-ok");
  for (int r = 0; r < N; r++) {
    if (res[r].state != NCFSM_STATE_READY) fail_msg("rank %d: %s", r, res[r].failure);
    assert_int_equal(res[r].ok, 6);
  }
}

static void test_needs_bootstrap(void **state) {
  (void)state;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  o.verify = NCFSM_VERIFY_STRICT;
  ncfsm_comm *c[1];
  assert_int_equal(ncfsm_comm_new(loop, &o, &c[0]), NCFSM_OK);
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
  assert_int_equal(ncfsm_comm_init(c[0], 2, 0, &id), NCFSM_ERR_INVALID_USAGE);
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "ncfsm_comm_init_boot"));
  teardown_all(loop, c, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_consistent),
      cmocka_unit_test(test_silent_mismatch),
      cmocka_unit_test(test_stall),
      cmocka_unit_test(test_peer_left),
      cmocka_unit_test(test_peer_failed),
      cmocka_unit_test(test_p2p_consistent),
      cmocka_unit_test(test_p2p_count),
      cmocka_unit_test(test_p2p_skip),
      cmocka_unit_test(test_p2p_partial_window),
      cmocka_unit_test(test_p2p_tail),
      cmocka_unit_test(test_tail),
      cmocka_unit_test(test_tail_ahead),
      cmocka_unit_test(test_tail_ahead_ok),
      cmocka_unit_test(test_needs_bootstrap),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
