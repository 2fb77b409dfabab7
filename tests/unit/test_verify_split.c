/*
 * Split children of a comm verified over a bootstrap (docs/ordering.md,
 * "Split and shrink children"): 4 processes over the TCP store on the
 * multi-process sim (ranks of other processes: nothing is compared in
 * memory). The parent splits by rank % 2 with keys in reverse order, so
 * child rank 0 of color 1 is parent rank 3. The children verify from their
 * seq 0 on a channel of their own ranks: color 1's AllReduce MAX on child
 * rank 0 where child rank 1 uses SUM, at child seq 2, fails both of its
 * ranks naming it; color 0 runs clean. With rank 3 of no color, color 1 is
 * rank 1 alone (not compared) and color 0 still verifies. A shrink child
 * (rank 3 excluded) verifies among the three others: MAX on its rank 2
 * fails all three. Each process checks its own verdict (its exit code).
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "helpers.h"
#include "ncfsm/bootstrap.h"

#define N 4
#define OPS 8

enum scenario { SPLIT, NOCOLOR, SHRINK };

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int ok_ops, failed_ops;
static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  (void)arg;
  if (st == NCFSM_OK) ok_ops++;
  else failed_ops++;
}

/* A failed check: its line is the exit code (and what it saw on stderr). */
#define CHECK(cond)                                                                       \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      fprintf(stderr, "rank %d: line %d: %s; child: %s\n", rank, __LINE__, #cond,         \
              c ? ncfsm_comm_failure(c) : "-");                                           \
      return __LINE__ % 250 + 1;                                                          \
    }                                                                                     \
  } while (0)

#define RUN_UNTIL(pred)                                                    \
  for (double until_ = now_ms() + 15000; !(pred) && now_ms() < until_;) \
  ncfsm_loop_run(loop, NCFSM_RUN_ONCE)

static int rank_main(enum scenario sc, int rank) {
  ncfsm_loop *loop = NULL;
  ncfsm_boot *boot = NULL;
  ncfsm_comm *p = NULL, *c = NULL;
  CHECK(ncfsm_loop_new(NULL, &loop) == NCFSM_OK);
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo); /* the TCP store, from the environment */
  CHECK(ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &boot) == NCFSM_OK);
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.backend = NCFSM_BACKEND_SIM;
  o.on_error = NCFSM_ON_ERROR_STAY;
  o.timeout_ms = 30000;
  o.verify = NCFSM_VERIFY_ASYNC;
  o.verify_window = 4;
  o.name = "parent";
  CHECK(ncfsm_comm_new(loop, &o, &p) == NCFSM_OK);
  CHECK(ncfsm_comm_init_boot(p, boot) == NCFSM_OK);
  CHECK(ncfsm_comm_wait_state(p, NCFSM_STATE_READY, 20000) == NCFSM_OK);
  bool member = rank != 3 || sc == SPLIT;
  o.name = "child";
  if (member) CHECK(ncfsm_comm_new(loop, &o, &c) == NCFSM_OK);
  if (sc == SHRINK) {
    int ex = 3;
    if (member) CHECK(ncfsm_comm_shrink(p, &ex, 1, NCFSM_SHRINK_DEFAULT, c) == NCFSM_OK);
  } else {
    CHECK(ncfsm_comm_split(p, member ? rank % 2 : NCFSM_SPLIT_NOCOLOR, N - rank, c) == NCFSM_OK);
  }
  bool bad = false;
  RUN_UNTIL(ncfsm_comm_state(p) == NCFSM_STATE_READY); /* the split polled back to success */
  if (member) {
    RUN_UNTIL(ncfsm_comm_state(c) == NCFSM_STATE_READY || ncfsm_comm_state(c) == NCFSM_STATE_ERROR);
    CHECK(ncfsm_comm_state(c) == NCFSM_STATE_READY);
    int crank = ncfsm_comm_rank(c);
    bool wrong = (sc == SPLIT && rank % 2 == 1 && crank == 0) || (sc == SHRINK && crank == 2);
    bad = (sc == SPLIT && rank % 2 == 1) || sc == SHRINK;
    CHECK(crank == (sc == SHRINK ? rank : sc == SPLIT ? (N - 1 - rank) / 2 : rank == 1 ? 0 : (2 - rank) / 2));
    int32_t buf[OPS][4];
    for (int k = 0; k < OPS; k++) {
      for (int i = 0; i < 4; i++) buf[k][i] = rank + 1;
      ncfsm_redop_t op = wrong && k == 2 ? NCFSM_OP_MAX : NCFSM_OP_SUM;
      if (ncfsm_allreduce(c, buf[k], buf[k], 4, NCFSM_INT32, op, NULL, on_done, NULL, NULL) != NCFSM_OK) break;
    }
    RUN_UNTIL(bad ? ncfsm_comm_state(c) == NCFSM_STATE_ERROR : ok_ops + failed_ops == OPS);
    if (!bad) CHECK(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT) == NCFSM_OK); /* the last window's exchange */
    if (bad) {
      char want[128];
      if (sc == SHRINK) snprintf(want, sizeof want, "seq 2: redop mismatch: ranks 0,1 redop SUM, rank 2 redop MAX");
      else snprintf(want, sizeof want, "seq 2: redop mismatch: rank 0 redop MAX, rank 1 redop SUM");
      CHECK(ncfsm_comm_state(c) == NCFSM_STATE_ERROR);
      CHECK(strstr(ncfsm_comm_failure(c), want) != NULL);
    } else {
      CHECK(ncfsm_comm_state(c) == NCFSM_STATE_READY);
      CHECK(ok_ops == OPS);
    }
    printf("rank %d: child rank %d of %d, %s: %s\n", rank, crank, ncfsm_comm_size(c),
           ncfsm_state_name(ncfsm_comm_state(c)), bad ? ncfsm_comm_failure(c) : "every window matched");
  }
  /* every rank has its verdict before any comm closes (a closed channel fails the others' exchanges) */
  int32_t one = 1, all[N];
  CHECK(ncfsm_boot_allgather(boot, &one, all, sizeof one) == NCFSM_OK);
  if (c) {
    if (ncfsm_comm_state(c) == NCFSM_STATE_READY) CHECK(ncfsm_comm_destroy(c) == NCFSM_OK);
    else CHECK(ncfsm_comm_abort(c) == NCFSM_OK);
    CHECK(ncfsm_comm_wait_state(c, NCFSM_STATE_CLOSED, 20000) == NCFSM_OK);
    ncfsm_comm_release(c);
  }
  CHECK(ncfsm_comm_destroy(p) == NCFSM_OK);
  CHECK(ncfsm_comm_wait_state(p, NCFSM_STATE_CLOSED, 20000) == NCFSM_OK);
  ncfsm_comm_release(p);
  c = NULL;
  CHECK(ncfsm_boot_close(boot) == NCFSM_OK);
  CHECK(ncfsm_loop_close(loop) == NCFSM_OK);
  return 0;
}

static int rank_of(int rank, void *arg) { return rank_main(*(enum scenario *)arg, rank); }

static void run(enum scenario sc) { assert_int_equal(test_run_tcp_ranks(N, "test-token-split", rank_of, &sc), 0); }

static void test_split_children_verify(void **state) {
  (void)state;
  run(SPLIT);
}

static void test_split_nocolor_rank(void **state) {
  (void)state;
  run(NOCOLOR);
}

static void test_shrink_child_verifies(void **state) {
  (void)state;
  run(SHRINK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split_children_verify),
      cmocka_unit_test(test_split_nocolor_rank),
      cmocka_unit_test(test_shrink_child_verifies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
