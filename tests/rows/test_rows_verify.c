/*
 * Every row of fsm/verify.def walked (tests/rows/rows.h): the cross-rank
 * verification of two ranks on one loop over the in-process bootstrap,
 * async (rolling hashes) and strict over the bootstrap or over a companion
 * NCCL communicator (channel nccl: SHARING, JOINING, EXCHANGING,
 * COLLECTING), with each way it ends: a divergence, a stall (a rank that
 * does not verify, or whose companion never gets there), a failed channel
 * (a closed bootstrap, a companion whose init or AllGather fails: the kit's
 * faults on the companion, named "<comm>.verify"), an exchange that cannot
 * be allocated (calloc failures), and a comm that ends. Each scenario
 * checks the verifier's state (c->ver->state), the comm's resulting state
 * and its failure's message.
 */
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fsm/verify.h"
#include "rows_world.h"

#define M "verify"
#define STALL_MS 30
#define SMSG 32  /* sizeof the strict exchange's message (fsm/verify_strict.c ncfsm__smsg) */
#define VMSG 16  /* sizeof the async exchange's message (fsm/verify_async.c ncfsm__vmsg) */

static int32_t buf[2][8];
static ncfsm_sim_opts g_so;

static ncfsm_comm_opts vopts(ncfsm_verify_mode_t mode, ncfsm_verify_channel_t ch, uint64_t stall_ms) {
  ncfsm_comm_opts o;
  opts_init(&o, &g_so, "v");
  o.verify = mode;
  o.verify_channel = ch;
  o.verify_window = 1;
  o.verify_stall_ms = stall_ms;
  return o;
}

/* Two ranks over one bootstrap group, READY. */
static ncfsm_loop *vpair(ncfsm_comm **c, ncfsm_boot **b, const ncfsm_comm_opts *o0, const ncfsm_comm_opts *o1) {
  ncfsm_loop *loop = loop_new();
  comms_boot(loop, 2, (const ncfsm_comm_opts *[]){o0, o1}, c, b, 0);
  for (int r = 0; r < 2; r++) want_state(c[r], NCFSM_STATE_READY);
  return loop;
}

/* Rank 0 verifies async (stall bound stall_ms), rank 1 does not: rank 0's
 * exchanges never complete and nobody answers its questions. */
static ncfsm_loop *half_pair(ncfsm_comm **c, ncfsm_boot **b, uint64_t stall_ms) {
  ncfsm_comm_opts o0 = vopts(NCFSM_VERIFY_ASYNC, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, stall_ms);
  ncfsm_comm_opts o1 = vopts(NCFSM_VERIFY_OFF, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, 0);
  return vpair(c, b, &o0, &o1);
}

static unsigned vstate(void *arg) {
  ncfsm_comm *c = arg;
  pthread_mutex_lock(&c->loop->mu);
  unsigned s = c->ver ? c->ver->state : 0xffu;
  pthread_mutex_unlock(&c->loop->mu);
  return s;
}

static void until_vstate(ncfsm_comm *c, unsigned s) {
  run_until_is(c->loop, vstate, c, s, ncfsm__m_verify.states[s].name);
}

static ncfsm_work *op(ncfsm_comm *c, int r, ncfsm_redop_t redop) {
  ncfsm_work *w = NULL;
  for (int i = 0; i < 8; i++) buf[r][i] = r + 1;
  assert_int_equal(ncfsm_allreduce(c, buf[r], buf[r], 8, NCFSM_INT32, redop, NULL, NULL, NULL, &w), NCFSM_OK);
  return w;
}

/* The verification failed the comm (policy STAY: ERROR) with this message. */
static void failed_with(ncfsm_comm *c, const char *text) {
  want_state(c, NCFSM_STATE_ERROR);
  want_text(c, true, text);
  assert_int_equal(vstate(c), NCFSM__VS_FAILED);
}

static void down(ncfsm_loop *loop, ncfsm_comm **c, ncfsm_boot **b, ncfsm_work **w, int nw) {
  for (int i = 0; i < nw; i++)
    if (w[i]) assert_int_equal(ncfsm_work_release(w[i]), NCFSM_OK);
  world_down(loop, c, 2, b, b ? 2 : 0);
}

/* ---- async ------------------------------------------------------------------------------------ */

/* WAITING -IN_SERVICE-> RUNNING, RUNNING -HASHES_DIFFER-> DETAILING, then
 * DETAILING -DIVERGED-> FAILED: the ranks' rolling hashes differ (SUM
 * against MAX, R11); their fingerprints of the window name seq, field and
 * each rank's value. */
static void test_async_diverged(void **state) {
  (void)state;
  unsigned s0 = rows_hits(M, "WAITING", "IN_SERVICE", "ANY"), h0 = rows_hits(M, "RUNNING", "HASHES_DIFFER", "ANY"),
           d0 = rows_hits(M, "DETAILING", "DIVERGED", "ANY");
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_ASYNC, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, 0);
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = vpair(c, b, &o, &o);
  ncfsm_work *w[4];
  for (int r = 0; r < 2; r++) w[r] = op(c[r], r, NCFSM_OP_SUM);
  for (int r = 0; r < 2; r++) assert_int_equal(work_final(w[r]), NCFSM_OK);
  assert_int_equal(vstate(c[0]), NCFSM__VS_RUNNING);
  for (int r = 0; r < 2; r++) w[2 + r] = op(c[r], r, r ? NCFSM_OP_MAX : NCFSM_OP_SUM);
  for (int r = 0; r < 2; r++) failed_with(c[r], "seq 1: redop mismatch: rank 0 redop SUM, rank 1 redop MAX");
  ROW_FIRED(M, "WAITING", "IN_SERVICE", "ANY", s0);
  ROW_FIRED(M, "RUNNING", "HASHES_DIFFER", "ANY", h0);
  ROW_FIRED(M, "DETAILING", "DIVERGED", "ANY", d0);
  down(loop, c, b, w, 4);
}

/* The window's fingerprints of one rank cannot be allocated: that rank
 * fails at once with the hashes' text; the other's detail exchange waits.
 * DETAILING -STALLED-> FAILED after the stall bound (stall_ms set), or
 * DETAILING -COMM_ENDED-> STOPPED when its comm is aborted (no bound). */
static void detail_one_short(uint64_t stall_ms, bool abort_it) {
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_ASYNC, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, stall_ms);
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = vpair(c, b, &o, &o);
  ncfsm_work *w[2];
  rows_fail_calloc(2 * 256, sizeof(ncfsm_fingerprint_t), 1); /* fsm/verify_async.c: DETAIL_MAX per rank */
  for (int r = 0; r < 2; r++) w[r] = op(c[r], r, r ? NCFSM_OP_MAX : NCFSM_OP_SUM);
  int shorted = -1;
  for (int i = 0; i < 100000 && shorted < 0; i++) {
    ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
    for (int r = 0; r < 2; r++)
      if (vstate(c[r]) == NCFSM__VS_FAILED) shorted = r;
  }
  assert_true(shorted >= 0);
  assert_int_equal(rows_calloc_failed(), 1);
  want_text(c[shorted], true, "differ across ranks (R11)");
  ncfsm_comm *other = c[1 - shorted];
  until_vstate(other, NCFSM__VS_DETAILING);
  if (abort_it) {
    assert_int_equal(ncfsm_comm_abort(other), NCFSM_OK);
    until_vstate(other, NCFSM__VS_STOPPED);
  } else {
    failed_with(other, "the exchange of that window's fingerprints did not complete within");
  }
  down(loop, c, b, w, 2);
}

static void test_detail_stalled(void **state) {
  (void)state;
  unsigned s0 = rows_hits(M, "DETAILING", "STALLED", "ANY");
  detail_one_short(STALL_MS, false);
  ROW_FIRED(M, "DETAILING", "STALLED", "ANY", s0);
}

static void test_detail_comm_ended(void **state) {
  (void)state;
  unsigned e0 = rows_hits(M, "DETAILING", "COMM_ENDED", "ANY");
  detail_one_short(0, true);
  ROW_FIRED(M, "DETAILING", "COMM_ENDED", "ANY", e0);
}

/* ---- in process (no bootstrap: ncfsm_comm_init) --------------------------------------------- */

static ncfsm_loop *lpair(ncfsm_comm **c, const ncfsm_comm_opts *o0, const ncfsm_comm_opts *o1) {
  ncfsm_loop *loop = loop_new();
  comms_init(loop, 2, (const ncfsm_comm_opts *[]){o0, o1}, c);
  return loop;
}

/* RUNNING -DIVERGED-> FAILED: the ranks compare their fingerprints in memory. */
static void test_local_diverged(void **state) {
  (void)state;
  unsigned d0 = rows_hits(M, "RUNNING", "DIVERGED", "ANY");
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_ASYNC, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, 0);
  ncfsm_comm *c[2];
  ncfsm_loop *loop = lpair(c, &o, &o);
  for (int r = 0; r < 2; r++) want_state(c[r], NCFSM_STATE_READY);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = op(c[r], r, r ? NCFSM_OP_MAX : NCFSM_OP_SUM);
  for (int r = 0; r < 2; r++) failed_with(c[r], "seq 0: redop mismatch: rank 0 redop SUM, rank 1 redop MAX");
  ROW_FIRED(M, "RUNNING", "DIVERGED", "ANY", d0);
  down(loop, c, NULL, w, 2);
}

/* RUNNING -PEER_FAILED-> FAILED: rank 1's comm fails (an async error at its
 * op 0); rank 0 fails with NCFSM_ERR_PEER, naming it. */
static void test_local_peer_failed(void **state) {
  (void)state;
  unsigned p0 = rows_hits(M, "RUNNING", "PEER_FAILED", "ANY");
  kit_begin("local-peer");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_ASYNC_ERROR, "v", 1);
  f.when = NCFSM_AT_OP;
  f.at = 0;
  kit_fault(&f);
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_ASYNC, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, 0);
  ncfsm_comm *c[2];
  ncfsm_loop *loop = lpair(c, &o, &o);
  for (int r = 0; r < 2; r++) want_state(c[r], NCFSM_STATE_READY);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = op(c[r], r, NCFSM_OP_SUM);
  want_state(c[1], NCFSM_STATE_ERROR);
  failed_with(c[0], "rank 1's comm failed first");
  want_text(c[0], true, "NCFSM_ERR_PEER");
  ROW_FIRED(M, "RUNNING", "PEER_FAILED", "ANY", p0);
  down(loop, c, NULL, w, 2);
  kit_end();
}

/* WAITING -PEER_FAILED-> FAILED: rank 1's init fails while rank 0's is in
 * progress: rank 0 does not wait for an init that cannot complete. */
static void test_local_peer_failed_at_init(void **state) {
  (void)state;
  unsigned p0 = rows_hits(M, "WAITING", "PEER_FAILED", "ANY");
  kit_begin("local-peer-init");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_INIT_HANG, "v", 0); /* rank 0's init would never end */
  kit_fault(&f);
  ncfsm_fault g = kit_fault_of(NCFSM_FAULT_INIT_FAIL, "v", 1);
  kit_fault(&g);
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_ASYNC, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, 0);
  ncfsm_comm *c[2];
  ncfsm_loop *loop = lpair(c, &o, &o);
  want_state(c[1], NCFSM_STATE_INIT_FAILED);
  want_state(c[0], NCFSM_STATE_INIT_FAILED);
  want_text(c[0], true, "rank 1's comm failed first");
  assert_int_equal(vstate(c[0]), NCFSM__VS_FAILED);
  ROW_FIRED(M, "WAITING", "PEER_FAILED", "ANY", p0);
  down(loop, c, NULL, NULL, 0);
  kit_end();
}

/* RUNNING -NO_CHANNEL-> UNVERIFIED, then UNVERIFIED -PEER_FAILED-> FAILED:
 * ranks 0 and 1 here, rank 2 in a child process, no bootstrap: nothing can
 * be compared; a failure of rank 1 (an async error at its op 1) still
 * reaches rank 0. The child submits its op 0 when told ('o'), ends on 'q'. */
static void test_local_no_channel(void **state) {
  (void)state;
  unsigned n0 = rows_hits(M, "RUNNING", "NO_CHANNEL", "ANY"), p0 = rows_hits(M, "UNVERIFIED", "PEER_FAILED", "ANY");
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
  int pp[2];
  assert_int_equal(pipe(pp), 0);
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_ASYNC, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, STALL_MS);
  pid_t pid = rows_fork();
  if (pid == 0) {
    close(pp[1]);
    ncfsm_loop *l = loop_new();
    ncfsm_comm *k;
    if (ncfsm_comm_new(l, &o, &k) != NCFSM_OK || ncfsm_comm_init(k, 3, 2, &id) != NCFSM_OK) rows_child_exit(2);
    for (int i = 0; i < 200000; i++) {
      ncfsm_loop_run(l, NCFSM_RUN_NOWAIT);
      struct pollfd pf = {pp[0], POLLIN, 0};
      char ch = 0;
      if (poll(&pf, 1, 0) > 0 && read(pp[0], &ch, 1) == 1) {
        if (ch == 'q') break;
        if (ch == 'o') op(k, 0, NCFSM_OP_SUM);
      }
      struct timespec ts = {0, 100000};
      nanosleep(&ts, NULL);
    }
    rows_child_exit(0);
  }
  close(pp[0]);
  kit_begin("local-unverified");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_ASYNC_ERROR, "v", 1);
  f.when = NCFSM_AT_OP;
  f.at = 1; /* its second op: the first one runs with rank 2's */
  kit_fault(&f);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm *c[2];
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_comm_new(loop, &o, &c[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_init(c[r], 3, r, &id), NCFSM_OK);
  }
  for (int r = 0; r < 2; r++) want_state(c[r], NCFSM_STATE_READY);
  /* with collectives of its own in flight the verifier looks: after the
   * stall bound, the ranks still missing make it UNVERIFIED */
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = op(c[r], r, NCFSM_OP_SUM);
  for (int r = 0; r < 2; r++) until_vstate(c[r], NCFSM__VS_UNVERIFIED);
  ROW_FIRED(M, "RUNNING", "NO_CHANNEL", "ANY", n0);
  assert_int_equal(write(pp[1], "o", 1), 1); /* rank 2's op: the first collective completes */
  for (int r = 0; r < 2; r++) assert_int_equal(work_final(w[r]), NCFSM_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_work_release(w[r]), NCFSM_OK);
    w[r] = op(c[r], r, NCFSM_OP_SUM); /* rank 1's fails at once (the fault) */
  }
  want_state(c[1], NCFSM_STATE_ERROR);
  failed_with(c[0], "rank 1's comm failed first");
  ROW_FIRED(M, "UNVERIFIED", "PEER_FAILED", "ANY", p0);
  assert_int_equal(write(pp[1], "q", 1), 1);
  close(pp[1]);
  assert_int_equal(rows_wait_child(pid), 0);
  down(loop, c, NULL, w, 2);
  kit_end();
}

/* RUNNING -STALL_SUSPECTED-> ASKING, ASKING -STALLED-> FAILED: rank 1 does
 * not verify, so rank 0's exchange never completes; rank 0 asks the others
 * how far they are, and rank 1 (no channel) never answers: named. */
static void test_async_stalled(void **state) {
  (void)state;
  unsigned s0 = rows_hits(M, "RUNNING", "STALL_SUSPECTED", "ANY"), a0 = rows_hits(M, "ASKING", "STALLED", "ANY");
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = half_pair(c, b, STALL_MS);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = op(c[r], r, NCFSM_OP_SUM);
  for (int r = 0; r < 2; r++) assert_int_equal(work_final(w[r]), NCFSM_OK); /* the collective itself is fine */
  failed_with(c[0], "not every rank reached collective seq 1");
  want_text(c[0], true, "rank 1 did not answer within 100 ms");
  assert_int_equal(ncfsm_comm_state(c[1]), NCFSM_STATE_READY);
  ROW_FIRED(M, "RUNNING", "STALL_SUSPECTED", "ANY", s0);
  ROW_FIRED(M, "ASKING", "STALLED", "ANY", a0);
  down(loop, c, b, w, 2);
}

/* ASKING -COMM_ENDED-> STOPPED: rank 0's comm is aborted while it waits for
 * the answers (rank 1 does not verify; the answer bound is 250 ms). */
static void test_ask_comm_ended(void **state) {
  (void)state;
  unsigned e0 = rows_hits(M, "ASKING", "COMM_ENDED", "ANY");
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = half_pair(c, b, 1000);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = op(c[r], r, NCFSM_OP_SUM);
  until_vstate(c[0], NCFSM__VS_ASKING);
  assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
  until_vstate(c[0], NCFSM__VS_STOPPED);
  ROW_FIRED(M, "ASKING", "COMM_ENDED", "ANY", e0);
  down(loop, c, b, w, 2);
}

/* Turns both loops until both comms are in state st. */
static void both_until(ncfsm_loop **l, ncfsm_comm **c, ncfsm_state_t st) {
  for (int i = 0; i < 100000 && (ncfsm_comm_state(c[0]) != st || ncfsm_comm_state(c[1]) != st); i++)
    for (int r = 0; r < 2; r++) ncfsm_loop_run(l[r], NCFSM_RUN_NOWAIT);
  for (int r = 0; r < 2; r++) want_state(c[r], st);
}

/* ASKING -CAUGHT_UP-> RUNNING: the ranks on two loops; rank 1's loop does
 * not turn while rank 0 stalls and asks, then rank 1 launches its
 * collective: rank 0's exchange completes before any answer, and
 * verification goes on. */
static void test_ask_caught_up(void **state) {
  (void)state;
  unsigned u0 = rows_hits(M, "ASKING", "CAUGHT_UP", "ANY");
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_ASYNC, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, 200);
  ncfsm_loop *l[2] = {loop_new(), loop_new()};
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  char group[96];
  snprintf(group, sizeof group, "%s", boot_group("caught-up"));
  for (int r = 0; r < 2; r++) {
    b[r] = boot_open(l[r], group, r, 2, 0);
    assert_int_equal(ncfsm_comm_new(l[r], &o, &c[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_init_boot(c[r], b[r]), NCFSM_OK);
  }
  both_until(l, c, NCFSM_STATE_READY);
  for (int i = 0; i < 1000; i++) /* both verifiers in service (their channels open) */
    for (int r = 0; r < 2; r++) ncfsm_loop_run(l[r], NCFSM_RUN_NOWAIT);
  ncfsm_work *w[2];
  w[0] = op(c[0], 0, NCFSM_OP_SUM);
  until_vstate(c[0], NCFSM__VS_ASKING); /* turns rank 0's loop only */
  w[1] = op(c[1], 1, NCFSM_OP_SUM);
  for (int i = 0; i < 100000 && vstate(c[0]) == NCFSM__VS_ASKING; i++)
    for (int r = 1; r >= 0; r--) ncfsm_loop_run(l[r], NCFSM_RUN_NOWAIT);
  assert_int_equal(vstate(c[0]), NCFSM__VS_RUNNING);
  for (int i = 0; i < 100000 && !(ncfsm_work_evidence(w[0]) & ncfsm_work_evidence(w[1]) & NCFSM_EVIDENCE_FINAL); i++)
    for (int r = 0; r < 2; r++) ncfsm_loop_run(l[r], NCFSM_RUN_NOWAIT);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_work_status(w[r]), NCFSM_OK);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_state(c[r]), NCFSM_STATE_READY);
  ROW_FIRED(M, "ASKING", "CAUGHT_UP", "ANY", u0);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_work_release(w[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_abort(c[r]), NCFSM_OK);
  }
  both_until(l, c, NCFSM_STATE_CLOSED);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_comm_release(c[r]), NCFSM_OK);
    assert_int_equal(ncfsm_boot_close(b[r]), NCFSM_OK);
    assert_int_equal(ncfsm_loop_close(l[r]), NCFSM_OK);
  }
}

/* WAITING -NO_CHANNEL-> UNVERIFIED: the verification's channel cannot be
 * set up on rank 0 (its answers' table cannot be allocated): that comm runs
 * unverified, with a warning; the collectives still run. */
static void test_waiting_no_channel(void **state) {
  (void)state;
  unsigned n0 = rows_hits(M, "WAITING", "NO_CHANNEL", "ANY");
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  rows_fail_calloc(2, sizeof(int32_t), 1); /* fsm/verify_channel.c: one state per rank */
  ncfsm_loop *loop = half_pair(c, b, 0);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = op(c[r], r, NCFSM_OP_SUM);
  for (int r = 0; r < 2; r++) assert_int_equal(work_final(w[r]), NCFSM_OK);
  assert_int_equal(rows_calloc_failed(), 1);
  assert_int_equal(vstate(c[0]), NCFSM__VS_UNVERIFIED);
  ROW_FIRED(M, "WAITING", "NO_CHANNEL", "ANY", n0);
  down(loop, c, b, w, 2);
}

/* RUNNING -STALLED-> FAILED (in process): rank 1 never launches seq 0;
 * rank 0 names it and where it is. */
static void test_local_stalled(void **state) {
  (void)state;
  unsigned s0 = rows_hits(M, "RUNNING", "STALLED", "ANY");
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_ASYNC, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, STALL_MS);
  ncfsm_comm *c[2];
  ncfsm_loop *loop = lpair(c, &o, &o);
  for (int r = 0; r < 2; r++) want_state(c[r], NCFSM_STATE_READY);
  ncfsm_work *w[2] = {op(c[0], 0, NCFSM_OP_SUM), NULL};
  failed_with(c[0], "rank 1 never launched it (it launched no collective)");
  ROW_FIRED(M, "RUNNING", "STALLED", "ANY", s0);
  down(loop, c, NULL, w, 2);
}

/* RUNNING -CHANNEL_FAILED-> FAILED: the peer's bootstrap closed under the exchange. */
static void test_async_channel_failed(void **state) {
  (void)state;
  unsigned f0 = rows_hits(M, "RUNNING", "CHANNEL_FAILED", "ANY");
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = half_pair(c, b, 0);
  assert_int_equal(ncfsm_boot_close(b[1]), NCFSM_OK); /* rank 1 needs it no more: it does not verify */
  b[1] = NULL;
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = op(c[r], r, NCFSM_OP_SUM);
  failed_with(c[0], "NCFSM_ERR_BOOTSTRAP");
  want_text(c[0], true, "verification: the exchange at seq 1 failed");
  ROW_FIRED(M, "RUNNING", "CHANNEL_FAILED", "ANY", f0);
  down(loop, c, b, w, 2);
}

/* RUNNING -COMM_ENDED-> STOPPED: the comm is aborted while an exchange is out. */
static void test_async_comm_ended(void **state) {
  (void)state;
  unsigned e0 = rows_hits(M, "RUNNING", "COMM_ENDED", "ANY");
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = half_pair(c, b, 0);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = op(c[r], r, NCFSM_OP_SUM);
  for (int r = 0; r < 2; r++) assert_int_equal(work_final(w[r]), NCFSM_OK);
  assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
  until_vstate(c[0], NCFSM__VS_STOPPED);
  assert_string_equal(ncfsm_comm_failure(c[0]), ""); /* stopping fails nothing */
  ROW_FIRED(M, "RUNNING", "COMM_ENDED", "ANY", e0);
  down(loop, c, b, w, 2);
}

/* RUNNING -NO_MEMORY-> BROKEN, BROKEN -IN_SERVICE-> FAILED: an exchange that
 * cannot be allocated fails the comm at the next turn (the ranks' exchanges
 * would no longer pair). */
static void test_async_no_memory(void **state) {
  (void)state;
  unsigned n0 = rows_hits(M, "RUNNING", "NO_MEMORY", "ANY"), i0 = rows_hits(M, "BROKEN", "IN_SERVICE", "ANY");
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_ASYNC, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, 0);
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = vpair(c, b, &o, &o);
  ncfsm_work *w[2];
  rows_fail_calloc(2, VMSG, 1);
  w[0] = op(c[0], 0, NCFSM_OP_SUM);
  failed_with(c[0], "verification: out of memory for a fingerprint exchange");
  assert_int_equal(rows_calloc_failed(), 1);
  want_text(c[0], true, "NCFSM_ERR_NO_MEMORY");
  ROW_FIRED(M, "RUNNING", "NO_MEMORY", "ANY", n0);
  ROW_FIRED(M, "BROKEN", "IN_SERVICE", "ANY", i0);
  w[1] = NULL;
  down(loop, c, b, w, 2);
}

/* ---- strict, before the comm is in service ------------------------------------------------------ */

/* WAITING -NO_MEMORY-> BROKEN, BROKEN -COMM_ENDED-> STOPPED: a collective
 * queued during init gets no exchange; the comm is aborted before it is in
 * service. */
static void test_waiting_no_memory(void **state) {
  (void)state;
  unsigned n0 = rows_hits(M, "WAITING", "NO_MEMORY", "ANY"), e0 = rows_hits(M, "BROKEN", "COMM_ENDED", "ANY");
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_STRICT, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, 0);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  comms_boot(loop, 2, (const ncfsm_comm_opts *[]){&o, NULL}, c, b, 0);
  rows_fail_calloc(2, SMSG, 1);
  ncfsm_work *w[2] = {op(c[0], 0, NCFSM_OP_SUM), NULL}; /* DEFER: the comm is ID_QUEUED */
  assert_int_equal(rows_calloc_failed(), 1);
  assert_int_equal(vstate(c[0]), NCFSM__VS_BROKEN);
  assert_int_equal(ncfsm_comm_abort(c[0]), NCFSM_OK);
  until_vstate(c[0], NCFSM__VS_STOPPED);
  want_work(w[0], NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED, -1);
  ROW_FIRED(M, "WAITING", "NO_MEMORY", "ANY", n0);
  ROW_FIRED(M, "BROKEN", "COMM_ENDED", "ANY", e0);
  down(loop, c, b, w, 2);
}

/* WAITING -COMM_ENDED-> STOPPED: the init fails with an exchange queued. */
static void test_waiting_comm_ended(void **state) {
  (void)state;
  unsigned e0 = rows_hits(M, "WAITING", "COMM_ENDED", "ANY");
  kit_begin("verify.waiting_init_fail");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_INIT_FAIL, "v", 0);
  kit_fault(&f);
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_STRICT, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, 0);
  ncfsm_loop *loop = loop_new();
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  comms_boot(loop, 2, (const ncfsm_comm_opts *[]){&o, NULL}, c, b, 0);
  ncfsm_work *w[2] = {op(c[0], 0, NCFSM_OP_SUM), NULL};
  assert_int_equal(vstate(c[0]), NCFSM__VS_WAITING);
  want_state(c[0], NCFSM_STATE_INIT_FAILED);
  until_vstate(c[0], NCFSM__VS_STOPPED);
  want_work(w[0], NCFSM_WORK_FAILED, NCFSM_ERR_ASYNC, -1);
  want_text(c[0], true, "ncclSystemError");
  ROW_FIRED(M, "WAITING", "COMM_ENDED", "ANY", e0);
  down(loop, c, b, w, 2);
  kit_end();
}

/* ---- strict over a companion communicator (channel nccl) ------------------------------------------ */

/* WAITING -IN_SERVICE [COMPANION]-> SHARING -ID_SHARED-> JOINING -JOINED->
 * RUNNING -POST-> EXCHANGING -FINAL-> COLLECTING -COLLECTED-> RUNNING: the
 * collective launches once both ranks' fingerprints came back equal. */
static void test_companion(void **state) {
  (void)state;
  const char *rows[][3] = {{"WAITING", "IN_SERVICE", "COMPANION"}, {"SHARING", "ID_SHARED", "ANY"},
                           {"JOINING", "JOINED", "ANY"},           {"RUNNING", "POST", "ANY"},
                           {"EXCHANGING", "FINAL", "ANY"},         {"COLLECTING", "COLLECTED", "ANY"}};
  unsigned before[6];
  for (int i = 0; i < 6; i++) before[i] = rows_hits(M, rows[i][0], rows[i][1], rows[i][2]);
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_STRICT, NCFSM_VERIFY_CHANNEL_NCCL, 0);
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = vpair(c, b, &o, &o);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = op(c[r], r, NCFSM_OP_SUM);
  for (int r = 0; r < 2; r++) assert_int_equal(work_final(w[r]), NCFSM_OK);
  assert_int_equal(buf[0][0], 3);
  for (int r = 0; r < 2; r++) assert_int_equal(vstate(c[r]), NCFSM__VS_RUNNING);
  for (int i = 0; i < 6; i++) ROW_FIRED(M, rows[i][0], rows[i][1], rows[i][2], before[i]);
  down(loop, c, b, w, 2);
}

enum { END_STALL, END_ABORT, END_NO_MEMORY };

/* A rank whose verifier waits in state s for good (its peer never gets
 * there), ended by a stall, an abort, or a collective that gets no exchange. */
static void stuck_end(ncfsm_comm *c, int r, unsigned s, int how) {
  until_vstate(c, s);
  if (how == END_ABORT) {
    assert_int_equal(ncfsm_comm_abort(c), NCFSM_OK);
    until_vstate(c, NCFSM__VS_STOPPED);
  } else if (how == END_NO_MEMORY) {
    rows_fail_calloc(2, SMSG, 1);
    ncfsm_work *w = op(c, r, NCFSM_OP_SUM);
    assert_int_equal(rows_calloc_failed(), 1);
    assert_int_equal(vstate(c), NCFSM__VS_BROKEN);
    failed_with(c, "verification: out of memory for a fingerprint exchange");
    want_work(w, NCFSM_WORK_FAILED, NCFSM_ERR_NO_MEMORY, -1);
    assert_int_equal(ncfsm_work_release(w), NCFSM_OK);
  }
}

static const char *const end_ev[] = {"STALLED", "COMM_ENDED", "NO_MEMORY"};

/* The companion's set-up stuck in state s on rank `stuck` (channel nccl), whose
 * peer does not verify, ended by a stall (message msg), an abort, or a
 * collective that gets no exchange. */
static void setup_stuck(unsigned s, int stuck, const char *msg) {
  for (int how = 0; how < 3; how++) {
    unsigned h0 = rows_hits(M, ncfsm__m_verify.states[s].name, end_ev[how], "ANY");
    ncfsm_comm_opts o[2];
    o[stuck] = vopts(NCFSM_VERIFY_STRICT, NCFSM_VERIFY_CHANNEL_NCCL, how == END_STALL ? STALL_MS : 0);
    o[!stuck] = vopts(NCFSM_VERIFY_OFF, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, 0);
    ncfsm_comm *c[2];
    ncfsm_boot *b[2];
    ncfsm_loop *loop = vpair(c, b, &o[0], &o[1]);
    stuck_end(c[stuck], stuck, s, how);
    if (how == END_STALL) { /* asked at half the bound: the peer, which does not verify, is silent */
      failed_with(c[stuck], msg);
      want_text(c[stuck], true, stuck ? "rank 0 did not answer within 15 ms" : "rank 1 did not answer within 15 ms");
    }
    ROW_FIRED(M, ncfsm__m_verify.states[s].name, end_ev[how], "ANY", h0);
    down(loop, c, b, NULL, 0);
  }
}

/* SHARING: rank 1 waits for the companion's id from rank 0, which does not verify. */
static void test_sharing_stuck(void **state) {
  (void)state;
  setup_stuck(NCFSM__VS_SHARING, 1, "not every rank reached the companion communicator's set-up");
}

/* SHARING -CHANNEL_FAILED-> FAILED: the root of the id's broadcast closed its bootstrap. */
static void test_sharing_channel_failed(void **state) {
  (void)state;
  unsigned f0 = rows_hits(M, "SHARING", "CHANNEL_FAILED", "ANY");
  ncfsm_comm_opts o0 = vopts(NCFSM_VERIFY_OFF, NCFSM_VERIFY_CHANNEL_BOOTSTRAP, 0);
  ncfsm_comm_opts o1 = vopts(NCFSM_VERIFY_STRICT, NCFSM_VERIFY_CHANNEL_NCCL, 0);
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = vpair(c, b, &o0, &o1);
  until_vstate(c[1], NCFSM__VS_SHARING);
  assert_int_equal(ncfsm_boot_close(b[0]), NCFSM_OK);
  b[0] = NULL;
  failed_with(c[1], "the companion's unique id broadcast failed");
  ROW_FIRED(M, "SHARING", "CHANNEL_FAILED", "ANY", f0);
  down(loop, c, b, NULL, 0);
}

/* JOINING: rank 0 (the root) has the id, but rank 1 does not verify: the
 * companion's init never completes. */
static void test_joining_stuck(void **state) {
  (void)state;
  setup_stuck(NCFSM__VS_JOINING, 0, "the companion communicator was not ready within");
}

/* JOINING -CHANNEL_FAILED-> FAILED: the companion's init fails (the kit's fault on "v.verify"). */
static void test_joining_channel_failed(void **state) {
  (void)state;
  unsigned f0 = rows_hits(M, "JOINING", "CHANNEL_FAILED", "ANY");
  ncfsm_test *t = kit_begin("verify.companion_init_fail");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_INIT_FAIL, "v.verify", 0);
  int id = kit_fault(&f);
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_STRICT, NCFSM_VERIFY_CHANNEL_NCCL, 0);
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = vpair(c, b, &o, &o);
  failed_with(c[0], "the companion communicator's init failed");
  assert_true(ncfsm_test_fault_fired(t, id) >= 1);
  ROW_FIRED(M, "JOINING", "CHANNEL_FAILED", "ANY", f0);
  down(loop, c, b, NULL, 0);
  kit_end();
}

/* EXCHANGING on rank 0 (its companion's AllGather never becomes final: the kit's SLOW
 * fault for ever) and COLLECTING on rank 1 (its AllGather is final, but rank 0's part never
 * arrives), one of them ended by an abort or a collective that gets no exchange (one at a
 * time: the other is then told of its failure, PEER_FAILED); and EXCHANGING ended by a
 * stall, with rank 1 submitting nothing (asked at half the bound, it answers that it
 * submitted none; COLLECTING's stall: test_exchange_culprit). One stall bound for both ranks
 * would race: the first to stall tells the other, which may fail told before its own. */
static void test_exchange_stuck(void **state) {
  (void)state;
  for (int k = 0; k < 5; k++) {
    int how = k == 0 ? END_STALL : k <= 2 ? END_ABORT : END_NO_MEMORY, r = k == 0 ? 0 : (k + 1) % 2;
    unsigned st = r ? NCFSM__VS_COLLECTING : NCFSM__VS_EXCHANGING;
    unsigned h0 = rows_hits(M, ncfsm__m_verify.states[st].name, end_ev[how], "ANY");
    kit_begin("verify.exchange_stuck");
    ncfsm_fault f = kit_fault_of(NCFSM_FAULT_SLOW, "v.verify", 0);
    f.polls = -1;
    kit_fault(&f);
    ncfsm_comm_opts o = vopts(NCFSM_VERIFY_STRICT, NCFSM_VERIFY_CHANNEL_NCCL, how == END_STALL ? STALL_MS : 0);
    ncfsm_comm *c[2];
    ncfsm_boot *b[2];
    ncfsm_loop *loop = vpair(c, b, &o, &o);
    ncfsm_work *w[2] = {op(c[0], 0, NCFSM_OP_SUM), how == END_STALL ? NULL : op(c[1], 1, NCFSM_OP_SUM)};
    until_vstate(c[0], NCFSM__VS_EXCHANGING);
    if (how == END_STALL) {
      failed_with(c[0], "strict verification (channel nccl): not every rank submitted collective seq 0");
      want_text(c[0], true, "behind: rank 1 submitted only 0 (READY)");
      want_work(w[0], NCFSM_WORK_TIMED_OUT, NCFSM_ERR_TIMEOUT, -1);
    } else {
      until_vstate(c[1], NCFSM__VS_COLLECTING);
      stuck_end(c[r], r, st, how);
    }
    ROW_FIRED(M, ncfsm__m_verify.states[st].name, end_ev[how], "ANY", h0);
    down(loop, c, b, w, 2);
    kit_end();
  }
}

/* COLLECTING -STALLED-> FAILED naming the culprit: rank 1 submits nothing, so rank 0's
 * companion AllGather (final at once on the sim) never completes; asked at half the bound,
 * rank 1 answers that it submitted none.
 * Rank 0's failure then reaches rank 1 (RUNNING -PEER_FAILED->). */
static void test_exchange_culprit(void **state) {
  (void)state;
  unsigned x0 = rows_hits(M, "COLLECTING", "STALLED", "ANY");
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_STRICT, NCFSM_VERIFY_CHANNEL_NCCL, STALL_MS);
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = vpair(c, b, &o, &o);
  ncfsm_work *w[1] = {op(c[0], 0, NCFSM_OP_SUM)};
  until_vstate(c[0], NCFSM__VS_COLLECTING);
  failed_with(c[0], "not every rank submitted collective seq 0 (ALLREDUCE) within 30 ms of this rank");
  want_text(c[0], true, "behind: rank 1 submitted only 0 (READY)");
  want_work(w[0], NCFSM_WORK_TIMED_OUT, NCFSM_ERR_TIMEOUT, -1);
  want_state(c[1], NCFSM_STATE_ERROR); /* told by rank 0's failure notice */
  want_text(c[1], true, "rank 0's comm failed first");
  ROW_FIRED(M, "COLLECTING", "STALLED", "ANY", x0);
  down(loop, c, b, w, 1);
}

/* Strict exchanges posted so far (sround: the second collective's is posted once it is 2). */
static unsigned vround(void *arg) {
  ncfsm_comm *c = arg;
  pthread_mutex_lock(&c->loop->mu);
  unsigned n = c->ver ? (unsigned)c->ver->sround : 0;
  pthread_mutex_unlock(&c->loop->mu);
  return n;
}

/* EXCHANGING and COLLECTING -PEER_FAILED-> FAILED: both ranks' first collective is
 * exchanged and launched, and never completes (the kit's NEVER_ARRIVE on rank 1). Rank 0's
 * launch is final, so it posts the exchange of its second collective: COLLECTING (its
 * companion AllGather final at once), or EXCHANGING (the kit keeps rank 0's second AllGather
 * from becoming final). Then rank 1's comm is aborted with its collective in flight: rank 0 fails
 * at once naming rank 1, with no stall bound. */
static void test_exchange_peer_failed(void **state) {
  (void)state;
  for (int slow = 0; slow < 2; slow++) {
    unsigned st = slow ? NCFSM__VS_EXCHANGING : NCFSM__VS_COLLECTING;
    unsigned p0 = rows_hits(M, ncfsm__m_verify.states[st].name, "PEER_FAILED", "ANY");
    kit_begin("verify.exchange_peer_failed");
    ncfsm_fault f = kit_fault_of(NCFSM_FAULT_NEVER_ARRIVE, "v", 1);
    f.when = NCFSM_AT_OP;
    f.at = 0;
    kit_fault(&f);
    if (slow) {
      ncfsm_fault g = kit_fault_of(NCFSM_FAULT_SLOW, "v.verify", 0);
      g.when = NCFSM_AT_OP;
      g.at = 1;
      g.polls = -1;
      kit_fault(&g);
    }
    ncfsm_comm_opts o = vopts(NCFSM_VERIFY_STRICT, NCFSM_VERIFY_CHANNEL_NCCL, 0);
    ncfsm_comm *c[2];
    ncfsm_boot *b[2];
    ncfsm_loop *loop = vpair(c, b, &o, &o);
    ncfsm_work *w[3] = {op(c[0], 0, NCFSM_OP_SUM), op(c[1], 1, NCFSM_OP_SUM), NULL};
    w[2] = op(c[0], 0, NCFSM_OP_SUM);
    run_until_is(loop, vround, c[0], 2, "rank 0's second exchange posted");
    until_vstate(c[0], st);
    assert_int_equal(ncfsm_comm_abort(c[1]), NCFSM_OK);
    failed_with(c[0], "rank 1's comm failed first");
    want_text(c[0], true, "NCFSM_ERR_ABORTED");
    ROW_FIRED(M, ncfsm__m_verify.states[st].name, "PEER_FAILED", "ANY", p0);
    down(loop, c, b, w, 3);
    kit_end();
  }
}

/* EXCHANGING -CHANNEL_FAILED-> FAILED: the companion's AllGather sets an async error. */
static void test_exchanging_channel_failed(void **state) {
  (void)state;
  unsigned f0 = rows_hits(M, "EXCHANGING", "CHANNEL_FAILED", "ANY");
  kit_begin("verify.companion_async_error");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_ASYNC_ERROR, "v.verify", 0);
  kit_fault(&f);
  ncfsm_comm_opts o = vopts(NCFSM_VERIFY_STRICT, NCFSM_VERIFY_CHANNEL_NCCL, 0);
  ncfsm_comm *c[2];
  ncfsm_boot *b[2];
  ncfsm_loop *loop = vpair(c, b, &o, &o);
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++) w[r] = op(c[r], r, NCFSM_OP_SUM);
  failed_with(c[0], "the companion communicator failed");
  want_work(w[0], NCFSM_WORK_FAILED, NCFSM_ERR_ASYNC, -1); /* nothing of it reached NCCL */
  ROW_FIRED(M, "EXCHANGING", "CHANNEL_FAILED", "ANY", f0);
  down(loop, c, b, w, 2);
  kit_end();
}

static void test_every_row_walked(void **state) {
  (void)state;
  static const rows_allow dead[] = {
      /* dead row on the sim: only a failing cudaEventRecord / cudaEventQuery of
       * the companion's own event fails COLLECTING, and the sim fails those
       * only for handles that are not its own */
      {"COLLECTING", "CHANNEL_FAILED", "ANY",
       "needs a CUDA error of the companion's event (record or query); the sim returns none for a valid event", false},
      /* a failure notice that arrives in the answer window, or while a
       * window's fingerprints are exchanged: on one loop the peer's answer
       * (or its detail) always comes first; test_verify's peer_failed walks
       * the notice itself from RUNNING */
      {"ASKING", "PEER_FAILED", "ANY", "needs a peer's failure notice to arrive between its answer and the asker's next poll", false},
      {"DETAILING", "PEER_FAILED", "ANY", "needs a peer's failure notice to arrive while the window's fingerprints are exchanged", false},
  };
  rows_check_all(M, dead, sizeof dead / sizeof dead[0]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_async_diverged, kit_teardown),
      cmocka_unit_test_teardown(test_detail_stalled, kit_teardown),
      cmocka_unit_test_teardown(test_detail_comm_ended, kit_teardown),
      cmocka_unit_test_teardown(test_local_diverged, kit_teardown),
      cmocka_unit_test_teardown(test_local_peer_failed, kit_teardown),
      cmocka_unit_test_teardown(test_local_peer_failed_at_init, kit_teardown),
      cmocka_unit_test_teardown(test_local_no_channel, kit_teardown),
      cmocka_unit_test_teardown(test_async_stalled, kit_teardown),
      cmocka_unit_test_teardown(test_ask_comm_ended, kit_teardown),
      cmocka_unit_test_teardown(test_ask_caught_up, kit_teardown),
      cmocka_unit_test_teardown(test_waiting_no_channel, kit_teardown),
      cmocka_unit_test_teardown(test_local_stalled, kit_teardown),
      cmocka_unit_test_teardown(test_async_channel_failed, kit_teardown),
      cmocka_unit_test_teardown(test_async_comm_ended, kit_teardown),
      cmocka_unit_test_teardown(test_async_no_memory, kit_teardown),
      cmocka_unit_test_teardown(test_waiting_no_memory, kit_teardown),
      cmocka_unit_test_teardown(test_waiting_comm_ended, kit_teardown),
      cmocka_unit_test_teardown(test_companion, kit_teardown),
      cmocka_unit_test_teardown(test_sharing_stuck, kit_teardown),
      cmocka_unit_test_teardown(test_sharing_channel_failed, kit_teardown),
      cmocka_unit_test_teardown(test_joining_stuck, kit_teardown),
      cmocka_unit_test_teardown(test_joining_channel_failed, kit_teardown),
      cmocka_unit_test_teardown(test_exchange_stuck, kit_teardown),
      cmocka_unit_test_teardown(test_exchange_culprit, kit_teardown),
      cmocka_unit_test_teardown(test_exchange_peer_failed, kit_teardown),
      cmocka_unit_test_teardown(test_exchanging_channel_failed, kit_teardown),
      cmocka_unit_test(test_every_row_walked),
  };
  return cmocka_run_group_tests(tests, rows_setup, NULL);
}
