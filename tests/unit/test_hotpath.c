/* The engine's hot-path structures (docs/design.md "The hot path"): the
 * launcher's R12 interval trees decide as the exact pairwise check on random
 * buffer sets; the active list holds the comms with something to do and
 * still lets the watchdog see a stuck comm among hundreds of idle ones; the
 * pools give their memory back once the loop was idle for their bound. */
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "fsm/engine.h"
#include "helpers.h"
#include "ncfsm/introspect.h"

/* ---- R12: the interval trees against the pairwise check ------------------------------ */

typedef struct {
  ncfsm__span s;
  uintptr_t comm;
} taken_span;

/* The exact rule: a span of b overlaps a taken span of its comm where one of the two writes. */
static bool pairwise_hit(const taken_span *t, int nt, const ncfsm__batch *b) {
  for (const ncfsm_work *w = b->head; w; w = w->bnext)
    for (int i = 0; i < w->nspan; i++)
      for (int j = 0; j < nt; j++)
        if (t[j].comm == (uintptr_t)w->comm && (t[j].s.write || w->span[i].write) && t[j].s.lo < w->span[i].hi &&
            w->span[i].lo < t[j].s.hi)
          return true;
  return false;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void random_span(ncfsm__span *s, uintptr_t base, unsigned range) {
  uintptr_t lo = base + next_rand() % range;
  s->lo = lo;
  s->hi = lo + 1 + next_rand() % 24;
  s->write = next_rand() % 3 == 0;
}

static void test_r12_trees_match_pairwise(void **state) {
  (void)state;
  enum { CAP = 64, ROUNDS = 400 };
  ncfsm__spanset *ss = ncfsm__spanset_new(CAP);
  assert_non_null(ss);
  ncfsm_comm *comms = calloc(3, sizeof *comms); /* only their addresses are used */
  ncfsm_work *works = calloc(4 * CAP, sizeof *works);
  taken_span *taken = calloc(16 * CAP, sizeof *taken);
  assert_non_null(comms);
  assert_non_null(works);
  assert_non_null(taken);
  long decisions = 0, hits = 0;
  for (int round = 0; round < ROUNDS; round++) {
    ncfsm__spanset_reset(ss);
    int nt = 0, nw = 0;
    /* 0: scattered, dense to sparse; 1: a descending run; 2: a ring of buffers
     * taken from its middle (ascending, wrapping around to its start) */
    int order = round % 3;
    unsigned range = order == 2 ? 8 : 64 + (unsigned)(next_rand() % 2048);
    uintptr_t ring = 2 * CAP + next_rand() % CAP, rot = next_rand() % ring;
    for (int k = 0; k < 3 * CAP && nw + 4 <= 4 * CAP; k++) {
      /* a batch of 1 op (most) or an explicit group of 2-3 ops */
      int nops = next_rand() % 5 == 0 ? 2 + (int)(next_rand() % 2) : 1;
      ncfsm__batch b = {0};
      for (int o = 0; o < nops; o++) {
        ncfsm_work *w = &works[nw++];
        memset(w, 0, sizeof *w);
        w->comm = &comms[next_rand() % 3];
        uintptr_t base = order == 1 ? 1000000 - (uintptr_t)k * 8 : order == 2 ? ((uintptr_t)k + rot) % ring * 32 : 0;
        w->nspan = 1 + (int)(next_rand() % 2);
        for (int i = 0; i < w->nspan; i++) random_span(&w->span[i], base, range);
        if (b.tail) b.tail->bnext = w;
        else b.head = w;
        b.tail = w;
        b.nworks++;
      }
      bool want = nt > 0 && (pairwise_hit(taken, nt, &b) || nt + 2 * b.nworks > 2 * CAP + 2);
      bool got = ncfsm__spanset_take(ss, &b);
      assert_int_equal(got, want);
      decisions++;
      hits += got;
      if (!got)
        for (const ncfsm_work *w = b.head; w; w = w->bnext)
          for (int i = 0; i < w->nspan; i++) taken[nt++] = (taken_span){w->span[i], (uintptr_t)w->comm};
    }
  }
  /* both answers occur often enough for the comparison to mean something */
  assert_true(hits > decisions / 20);
  assert_true(hits < decisions - decisions / 20);
  ncfsm__spanset_free(ss);
  free(comms);
  free(works);
  free(taken);
}

/* ---- the active list: a stuck comm among 512 ------------------------------------------ */

static void test_watchdog_among_512(void **state) {
  (void)state;
  enum { N = 512, STUCK = 500 };
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_sim_opts so, so1;
  ncfsm_comm_opts o, o1;
  test_stuck_opts(&so, &o, &so1, &o1, 200);
  ncfsm_comm **c = calloc(N, sizeof *c);
  assert_non_null(c);
  ncfsm_unique_id pair;
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &pair), NCFSM_OK);
  /* comms 0..N-1 on the loop; STUCK and STUCK + 1 are the two ranks of one
   * clique whose rank 1 never arrives; the others have one rank each */
  for (int i = 0; i < N; i++) {
    assert_int_equal(ncfsm_comm_new(loop, i == STUCK + 1 ? &o1 : &o, &c[i]), NCFSM_OK);
    if (i == STUCK || i == STUCK + 1) {
      assert_int_equal(ncfsm_comm_init(c[i], 2, i - STUCK, &pair), NCFSM_OK);
    } else {
      ncfsm_unique_id id;
      assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
      assert_int_equal(ncfsm_comm_init(c[i], 1, 0, &id), NCFSM_OK);
    }
  }
  for (int i = 0; i < N; i++) assert_int_equal(ncfsm_comm_wait_state(c[i], NCFSM_STATE_READY, 20000), NCFSM_OK);
  /* every 1-rank comm completes an op (they join and leave the active list) */
  int32_t buf[4] = {0};
  for (int i = 0; i < N; i++) {
    if (i == STUCK || i == STUCK + 1) continue;
    ncfsm_work *w;
    assert_int_equal(ncfsm_allreduce(c[i], buf, buf, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w), NCFSM_OK);
    assert_int_equal(ncfsm_work_wait(w, 10000), NCFSM_OK);
    ncfsm_work_release(w);
  }
  ncfsm_work *w;
  assert_int_equal(ncfsm_allreduce(c[STUCK], buf, buf, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w), NCFSM_OK);
  assert_int_equal(ncfsm_work_wait(w, 20000), NCFSM_ERR_TIMEOUT);
  assert_int_equal(ncfsm_work_state(w), NCFSM_WORK_TIMED_OUT);
  assert_int_equal(ncfsm_comm_state(c[STUCK]), NCFSM_STATE_ERROR);
  assert_non_null(strstr(ncfsm_comm_last_error(c[STUCK]), "watchdog"));
  /* the others are untouched */
  assert_int_equal(ncfsm_comm_state(c[STUCK - 1]), NCFSM_STATE_READY);
  assert_int_equal(ncfsm_comm_state(c[N - 1]), NCFSM_STATE_READY);
  ncfsm_work_release(w);
  teardown_all(loop, c, N);
  free(c);
}

/* A comm is on the active list while it has works; an idle one is not. */
static void test_active_list(void **state) {
  (void)state;
  ncfsm_comm *c[3];
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  o.verify = NCFSM_VERIFY_OFF; /* a verifier of more than one rank is looked at every turn */
  ncfsm_loop *loop = ready_comms_with(3, c, &o); /* one clique of 3 ranks on the sim */
  run_turns(loop, 4);
  assert_null(loop->act_head); /* READY, nothing in flight: no turn visits them */
  int32_t buf[3][4] = {{0}};
  ncfsm_work *w[3];
  for (int r = 0; r < 3; r++)
    assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[r]),
                     NCFSM_OK);
  int on = 0;
  for (ncfsm_comm *x = loop->act_head; x; x = x->act_next) on++;
  assert_int_equal(on, 3);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(ncfsm_work_wait(w[r], 10000), NCFSM_OK);
    ncfsm_work_release(w[r]);
  }
  run_turns(loop, 4);
  assert_null(loop->act_head);
  teardown_all(loop, c, 3);
}

/* A turn keeps the clock it read only while it holds the lock: a work that
 * ends outside any turn (a failed group fails its works inside
 * ncfsm_group_end) reads the clock afresh, so its times are in order whatever
 * ended before it. */
static void test_turn_clock_outside_turns(void **state) {
  (void)state;
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  int32_t buf[4] = {0};
  for (int k = 0; k < 2; k++) {
    ncfsm_work *w;
    assert_int_equal(ncfsm_group_start(loop), NCFSM_OK);
    assert_int_equal(ncfsm_allreduce(c[0], buf, buf, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w), NCFSM_OK);
    assert_int_equal(ncfsm_allreduce(c[0], buf, buf, 4, (ncfsm_dtype_t)999, NCFSM_OP_SUM, NULL, NULL, NULL, NULL),
                     NCFSM_ERR_INVALID_ARGUMENT);
    assert_int_equal(ncfsm_group_end(loop), NCFSM_ERR_INVALID_ARGUMENT); /* no turn: w fails inside this call */
    assert_int_equal(ncfsm_work_state(w), NCFSM_WORK_FAILED);
    assert_true(w->t_complete >= w->t_submit);
    ncfsm_work_release(w);
    test_sleep_ms(2); /* the next work is submitted later than this one ended */
  }
  teardown_all(loop, c, 1);
}

/* ---- legality's fast path against the table ------------------------------------------- */

/* ncfsm__comm_fast (fsm/comm_fsm.c) is expanded from comm.def apart from the
 * cells (fsm/tables.c): each of its cells is set exactly where the table's
 * cell accepts with guards among GROUP_THREAD and SIZED; and wherever
 * ncfsm__legal_fast says yes, ncfsm__check_legal accepts, in every state, for
 * a comm with or without ops in a group (owned by this thread or not) and
 * with or without its size. */
static void test_legal_fast_matches_table(void **state) {
  (void)state;
  const unsigned long long fast_guards = (1ull << NCFSM__CG_GROUP_THREAD) | (1ull << NCFSM__CG_SIZED);
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  pthread_mutex_lock(&loop->mu);
  unsigned state0 = c[0]->state;
  int ngroup0 = c[0]->ngroup, nranks0 = c[0]->nranks, depth0 = loop->group_depth;
  pthread_t owner0 = loop->group_owner;
  long fast = 0, checked = 0;
  for (unsigned s = 0; s < NCFSM_STATE_COUNT; s++)
    for (unsigned k = 0; k < NCFSM_CALL_COUNT; k++) {
      const ncfsm__cell *cl = &ncfsm__comm_cells[s][k];
      bool want = cl->listed && cl->decision != NCFSM_REJECT && !(cl->guards & ~fast_guards);
      if (ncfsm__comm_fast[s][k] != want)
        fail_msg("fast cell %s/%s is %d, the table's cell says %d", ncfsm_state_name((ncfsm_state_t)s),
                 ncfsm_call_fn((ncfsm_call_t)k), ncfsm__comm_fast[s][k], want);
      fast += want;
      for (int v = 0; v < 8; v++) {
        int ngroup = v & 1, nranks = v & 2 ? 2 : 0;
        bool owned = v & 4;
        if (!ncfsm__legal_fast(s, (ncfsm_call_t)k, ngroup, nranks)) continue;
        c[0]->state = s;
        c[0]->ngroup = ngroup;
        c[0]->nranks = nranks;
        loop->group_depth = owned ? 1 : 0;
        loop->group_owner = pthread_self();
        ncfsm_result_t r = NCFSM_OK;
        if (ncfsm__check_legal(c[0], (ncfsm_call_t)k, &r) == NCFSM_REJECT)
          fail_msg("the fast path accepts %s in %s (ngroup %d, nranks %d), the table refuses: %s",
                   ncfsm_call_fn((ncfsm_call_t)k), ncfsm_state_name((ncfsm_state_t)s), ngroup, nranks,
                   ncfsm_err_name(r));
        checked++;
      }
    }
  c[0]->state = state0;
  c[0]->ngroup = ngroup0;
  c[0]->nranks = nranks0;
  loop->group_depth = depth0;
  loop->group_owner = owner0;
  pthread_mutex_unlock(&loop->mu);
  assert_true(ncfsm__legal_fast(NCFSM_STATE_READY, NCFSM_CALL_ALLREDUCE, 0, 1)); /* the common case is fast */
  assert_true(ncfsm__legal_fast(NCFSM_STATE_READY, NCFSM_CALL_SEND, 0, 1));
  assert_false(ncfsm__legal_fast(NCFSM_STATE_READY, NCFSM_CALL_ALLREDUCE, 1, 1)); /* GROUP_THREAD: the table asks */
  assert_false(ncfsm__legal_fast(NCFSM_STATE_READY, NCFSM_CALL_BROADCAST, 0, 0)); /* SIZED */
  assert_false(ncfsm__legal_fast(NCFSM_STATE_READY, NCFSM_CALL_FINALIZE, 0, 1)); /* NO_GROUP_OPS: not fast */
  assert_true(fast > 0 && checked >= fast);
  teardown_all(loop, c, 1);
}

/* After a peak of works, the pool keeps them while the loop is busy and gives
 * all but its keep back once no work was allocated for its idle bound. */
static void test_pool_returns_after_idle(void **state) {
  (void)state;
  enum { PEAK = 4096 };
  ncfsm_comm *c[1];
  ncfsm_loop *loop = ready_comms(1, c);
  static int32_t buf[64][4];
  for (int i = 0; i < PEAK; i++)
    assert_int_equal(ncfsm_allreduce(c[0], buf[i % 64], buf[i % 64], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL,
                                     NULL),
                     NCFSM_OK);
  assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  assert_true(loop->nfree >= PEAK - NCFSM__POOL_KEEP); /* kept at the peak: the loop may be busy again */
  uint64_t allocs = loop->pool.allocs;
  assert_int_equal(ncfsm_loop_start_thread(loop), NCFSM_OK);
  test_sleep_ms(NCFSM__POOL_IDLE_MS * 3);
  assert_int_equal(ncfsm_loop_stop_thread(loop), NCFSM_OK);
  assert_true(loop->nfree <= NCFSM__POOL_KEEP);
  assert_true(loop->pool.works_returned >= PEAK - 2 * NCFSM__POOL_KEEP);
  assert_true(loop->pool.allocs == allocs);
  char *text = NULL;
  assert_int_equal(ncfsm_loop_metrics(loop, &text, NULL), NCFSM_OK);
  char want[96];
  snprintf(want, sizeof want, "ncfsm_pool_returned_total{pool=\"works\"} %llu\n",
           (unsigned long long)loop->pool.works_returned);
  assert_non_null(strstr(text, want));
  assert_non_null(strstr(text, "ncfsm_pool_free{pool=\"works\"}"));
  free(text);
  /* the pool still serves: a new op runs */
  ncfsm_work *w;
  assert_int_equal(ncfsm_allreduce(c[0], buf[0], buf[0], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w), NCFSM_OK);
  assert_int_equal(ncfsm_work_wait(w, 10000), NCFSM_OK);
  ncfsm_work_release(w);
  teardown_all(loop, c, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_r12_trees_match_pairwise),
      cmocka_unit_test(test_watchdog_among_512),
      cmocka_unit_test(test_active_list),
      cmocka_unit_test(test_pool_returns_after_idle),
      cmocka_unit_test(test_turn_clock_outside_turns),
      cmocka_unit_test(test_legal_fast_matches_table),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
