/*
 * Local ranks that drift apart (R13, docs/nccl-rules.md). One process, 2 sim ranks
 * of one clique (ncfsm_comm_init_all), the loop on its own thread, and each
 * rank's in-place AllReduces submitted by a thread of its own, as in the
 * real-GPU program that stopped after ~1,000 ops (watchdog at 15 s).
 *
 * The sim models R13 (docs/sim.md): a comm more than NCFSM_SIM_DRIFT_LIMIT
 * (default 1022) launched-but-unmatched ops ahead of its peer has its next
 * launch held InProgress until the peer catches up, and a group end over
 * several comms is held as one unit. A runtime that launches one rank's ops
 * in the same backend group as the other rank's, while the first is at its
 * limit, deadlocks: the watchdog (timeout_ms) then fails the works, and
 * these tests fail instead of hanging.
 *
 * Each variant submits OPS AllReduces per rank (sum of known values) with a
 * callback that counts completions and checks the data, and requires every
 * op to complete with NCFSM_OK and the right data within a bounded time.
 * Public API only.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "helpers.h"
#include "ncfsm.h"

#define NRANKS 2
#define OPS 3000
#define COUNT 4
#define WATCHDOG_MS 10000   /* a deadlock ends as a failure, not a hang */
#define BOUND_MS 60000      /* every op must be final by then */

typedef struct op_ctx {
  int rank, k;
} op_ctx;

static int32_t bufs[NRANKS][OPS][COUNT];
static op_ctx ctxs[NRANKS][OPS];
static atomic_int ndone, nok, nbad_data, nsubmit_fail;
static atomic_int nok_rank[NRANKS];
static atomic_int first_bad = -1; /* first non-OK status seen by a callback */
static atomic_int first_bad_rank = -1, first_bad_k = -1;
static ncfsm_comm *comms[NRANKS];

static int32_t input(int r, int k, int j) { return (r + 1) * 1000 + k * 7 + j; }
static int32_t expected(int k, int j) {
  int32_t s = 0;
  for (int r = 0; r < NRANKS; r++) s += input(r, k, j);
  return s;
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  const op_ctx *x = arg;
  if (st == NCFSM_OK) {
    int good = 1;
    for (int j = 0; j < COUNT; j++)
      if (bufs[x->rank][x->k][j] != expected(x->k, j)) good = 0;
    if (good) {
      atomic_fetch_add(&nok, 1);
      atomic_fetch_add(&nok_rank[x->rank], 1);
    } else {
      atomic_fetch_add(&nbad_data, 1);
    }
  } else {
    int none = -1;
    if (atomic_compare_exchange_strong(&first_bad, &none, (int)st)) {
      atomic_store(&first_bad_rank, x->rank);
      atomic_store(&first_bad_k, x->k);
    }
  }
  atomic_fetch_add(&ndone, 1);
}

static void submit(int r, int k) {
  ncfsm_result_t rc = ncfsm_allreduce(comms[r], bufs[r][k], bufs[r][k], COUNT, NCFSM_INT32, NCFSM_OP_SUM,
                                      NULL, on_done, &ctxs[r][k], NULL);
  if (rc != NCFSM_OK) {
    if (atomic_fetch_add(&nsubmit_fail, 1) == 0)
      fprintf(stderr, "rank %d op %d: submit failed: %s: %s\n", r, k, ncfsm_err_name(rc),
              ncfsm_comm_last_error(comms[r]));
    atomic_fetch_add(&ndone, 1); /* no callback will come */
  }
}

typedef enum mode { THREAD_PER_RANK, ONE_THREAD, LATE_PEER, HEAD_START } mode;

#define HEAD 1022 /* R13: launches rank 0 got final alone on 2.28.3/2.28.9 */

typedef struct submitter {
  int rank; /* -1: every rank, rank 0's ops first */
  int delay_ms;
  int head_start; /* rank 0: HEAD ops first, then both ranks in lockstep */
} submitter;

static pthread_barrier_t lockstep;
static atomic_int head_launched;

static void *submit_main(void *arg) {
  const submitter *s = arg;
  if (s->delay_ms) test_sleep_ms(s->delay_ms);
  if (s->head_start) {
    int k = 0;
    if (s->rank == 0) { /* rank 0 alone gets HEAD launches ahead ... */
      for (; k < HEAD - 1; k++) submit(0, k);
      ncfsm_work *w = NULL;
      if (ncfsm_allreduce(comms[0], bufs[0][k], bufs[0][k], COUNT, NCFSM_INT32, NCFSM_OP_SUM, NULL, on_done,
                          &ctxs[0][k], &w) != NCFSM_OK) {
        atomic_fetch_add(&nsubmit_fail, 1);
        atomic_fetch_add(&ndone, 1);
      }
      k++;
      uint64_t t0 = now_ms();
      while (w && !ncfsm_work_launched(w) && now_ms() - t0 < 10000) test_sleep_ms(1);
      atomic_store(&head_launched, w && ncfsm_work_launched(w));
      if (w) ncfsm_work_release(w);
    }
    /* ... then both ranks submit one op per step, interleaved */
    pthread_barrier_wait(&lockstep);
    for (int i = 0; k < OPS; k++, i++) {
      if (i < OPS - HEAD) pthread_barrier_wait(&lockstep);
      submit(s->rank, k);
    }
    return NULL;
  }
  if (s->rank >= 0) {
    for (int k = 0; k < OPS; k++) submit(s->rank, k);
  } else {
    for (int r = 0; r < NRANKS; r++) /* the largest drift one thread can make */
      for (int k = 0; k < OPS; k++) submit(r, k);
  }
  return NULL;
}

static void run(mode m) {
  atomic_store(&ndone, 0);
  atomic_store(&nok, 0);
  atomic_store(&nbad_data, 0);
  atomic_store(&nsubmit_fail, 0);
  atomic_store(&first_bad, -1);
  for (int r = 0; r < NRANKS; r++) {
    atomic_store(&nok_rank[r], 0);
    for (int k = 0; k < OPS; k++) {
      ctxs[r][k] = (op_ctx){r, k};
      for (int j = 0; j < COUNT; j++) bufs[r][k][j] = input(r, k, j);
    }
  }

  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_sim_opts so;
  assert_int_equal(ncfsm_sim_opts_init(&so), NCFSM_OK);
  so.init_polls = 1;
  so.launch_polls = 1;
  so.finalize_polls = 1;
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.backend = NCFSM_BACKEND_SIM;
  o.sim = &so;
  o.timeout_ms = WATCHDOG_MS;
  o.name = "drift";
  assert_int_equal(ncfsm_comm_init_all(loop, NRANKS, &o, NULL, comms), NCFSM_OK);
  assert_int_equal(ncfsm_loop_start_thread(loop), NCFSM_OK);
  for (int r = 0; r < NRANKS; r++) assert_int_equal(ncfsm_comm_wait_state(comms[r], NCFSM_STATE_READY, 10000), NCFSM_OK);

  submitter subs[NRANKS];
  pthread_t th[NRANKS];
  int nth = 0;
  uint64_t t0 = now_ms();
  if (m == ONE_THREAD) {
    subs[0] = (submitter){-1, 0, 0};
    nth = 1;
  } else {
    for (int r = 0; r < NRANKS; r++) subs[r] = (submitter){r, m == LATE_PEER && r == 1 ? 100 : 0, m == HEAD_START};
    nth = NRANKS;
  }
  atomic_store(&head_launched, 0);
  pthread_barrier_init(&lockstep, NULL, NRANKS);
  for (int i = 0; i < nth; i++) assert_int_equal(pthread_create(&th[i], NULL, submit_main, &subs[i]), 0);
  for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&lockstep);
  while (atomic_load(&ndone) < NRANKS * OPS && now_ms() - t0 < BOUND_MS) test_sleep_ms(1);
  uint64_t took = now_ms() - t0;

  /* the verdict, then the teardown, then the asserts (a failed assert must
   * not leave the loop thread running) */
  int done = atomic_load(&ndone), ok = atomic_load(&nok), bad = atomic_load(&nbad_data);
  char why[1024] = "";
  if (done != NRANKS * OPS || ok != NRANKS * OPS || bad || atomic_load(&nsubmit_fail)) {
    int fb = atomic_load(&first_bad);
    int n = snprintf(why, sizeof why,
                     "%d of %d ops final after %llu ms, %d OK with the right data (rank 0: %d, rank 1: %d), "
                     "%d with wrong data, %d submits failed",
                     done, NRANKS * OPS, (unsigned long long)took, ok, atomic_load(&nok_rank[0]),
                     atomic_load(&nok_rank[1]), bad, atomic_load(&nsubmit_fail));
    if (fb != -1 && n > 0 && (size_t)n < sizeof why)
      n += snprintf(why + n, sizeof why - (size_t)n, "; first failure: rank %d op %d: %s",
                    atomic_load(&first_bad_rank), atomic_load(&first_bad_k),
                    ncfsm_err_name((ncfsm_result_t)fb));
    for (int r = 0; r < NRANKS && n > 0 && (size_t)n < sizeof why; r++) {
      uint64_t seq = 0;
      ncfsm_comm_position(comms[r], &seq, NULL);
      n += snprintf(why + n, sizeof why - (size_t)n, "; rank %d: %s, seq %llu, last error: %s", r,
                    ncfsm_state_name(ncfsm_comm_state(comms[r])), (unsigned long long)seq,
                    ncfsm_comm_last_error(comms[r]));
    }
  }

  for (int r = 0; r < NRANKS; r++) {
    ncfsm_state_t s = ncfsm_comm_state(comms[r]);
    if (s != NCFSM_STATE_CLOSED && s != NCFSM_STATE_NEW) ncfsm_comm_abort(comms[r]);
  }
  assert_int_equal(ncfsm_loop_stop_thread(loop), NCFSM_OK);
  for (int r = 0; r < NRANKS; r++) {
    for (int i = 0; i < 1000 && ncfsm_comm_state(comms[r]) != NCFSM_STATE_CLOSED; i++)
      ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
    assert_int_equal(ncfsm_comm_release(comms[r]), NCFSM_OK);
  }
  ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);

  if (why[0]) fail_msg("%s", why);
  if (m == HEAD_START && !atomic_load(&head_launched))
    fail_msg("rank 0's first %d ops were not all launched before rank 1 started", HEAD);
  if (took > BOUND_MS / 2) fail_msg("all ops completed, but only after %llu ms", (unsigned long long)took);
  print_message("%d AllReduces per rank completed in %llu ms\n", OPS, (unsigned long long)took);
}

/* Each rank's ops submitted by a thread of its own (the real-GPU failure). */
static void test_thread_per_rank(void **state) {
  (void)state;
  run(THREAD_PER_RANK);
}

/* One thread submits all of rank 0's ops, then all of rank 1's. */
static void test_one_thread(void **state) {
  (void)state;
  run(ONE_THREAD);
}

/* Rank 1's thread starts 100 ms late, so rank 0 really drifts ahead. */
static void test_late_peer(void **state) {
  (void)state;
  run(LATE_PEER);
}

/* Rank 0 alone gets the 1,022 launches that NCCL lets it go ahead (R13),
 * then both ranks' threads submit one op per step in lockstep, so that the
 * two ranks' ops queue interleaved while rank 0 sits at the limit. */
static void test_head_start_then_lockstep(void **state) {
  (void)state;
  run(HEAD_START);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_thread_per_rank),
      cmocka_unit_test(test_one_thread),
      cmocka_unit_test(test_late_peer),
      cmocka_unit_test(test_head_start_then_lockstep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
