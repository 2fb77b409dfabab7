/*
 * The sim across processes: N forked ranks, each with its own ncfsm loop and
 * communicator, form one clique through the shared-memory segment named from
 * the unique id that the parent made (docs/sim.md, "Processes"). Checks the
 * data of every collective, R12 in one group, R2 poisoning on the raw
 * backend, fault injection (async_error_at_op, never_arrive, fail_init), an
 * R11 mismatch, ranks killed with SIGKILL (holding the clique's lock, and
 * not), the arena bound, stale-segment cleanup, and that no /dev/shm file is
 * left behind.
 *
 * Children never use cmocka asserts (a failing assert would longjmp into the
 * child's copy of the test runner): they print the failed check and exit 1.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/sim/sim-internal.h"
#include "helpers.h"

#define N 4
#define WAIT_MS 10000

static ncfsm_unique_id g_id;
static const ncfsm__backend *be = &ncfsm__backend_sim;

#define CHECK(cond)                                                                          \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed; comm: %s; sim: %s\n", rank,         \
              __FILE__, __LINE__, #cond, x.c ? ncfsm_comm_last_error(x.c) : "-",             \
              be->last_error(NULL));                                                         \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

static void shm_path(const ncfsm_unique_id *id, char *buf, size_t len) {
  char name[SIM_SHM_NAME_MAX];
  ncfsm__sim_shm_name((const unsigned char *)id->internal, name, sizeof name);
  snprintf(buf, len, "/dev/shm%s", name);
}

static int segment_exists(const ncfsm_unique_id *id) {
  char p[128];
  shm_path(id, p, sizeof p);
  return access(p, F_OK) == 0;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- the parent: fork N ranks, reap them, check how they ended ------------------ */

typedef int (*rank_fn)(int rank);

/* expect_kill: bit r set when rank r is meant to die of SIGKILL. */
static void run_ranks(rank_fn fn, unsigned expect_kill) {
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &g_id), NCFSM_OK);
  fflush(NULL);
  pid_t pid[N];
  for (int r = 0; r < N; r++) {
    pid[r] = fork();
    assert_true(pid[r] >= 0);
    if (pid[r] == 0) {
      alarm(30); /* a hang must never outlive the test */
      int rc = fn(r);
      fflush(NULL);
      _exit(rc ? 1 : 0);
    }
  }
  int status[N], left = N;
  for (int r = 0; r < N; r++) status[r] = -1;
  for (int t = 0; left && t < 20000; t++) { /* 20 s */
    for (int r = 0; r < N; r++) {
      if (status[r] != -1) continue;
      if (waitpid(pid[r], &status[r], WNOHANG) == pid[r]) left--;
      else status[r] = -1;
    }
    if (left) sleep_ms(1);
  }
  for (int r = 0; r < N; r++)
    if (status[r] == -1) {
      kill(pid[r], SIGKILL);
      waitpid(pid[r], &status[r], 0);
      fail_msg("rank %d hung (killed after 20 s)", r);
    }
  for (int r = 0; r < N; r++) {
    if (expect_kill & (1u << r)) {
      if (!WIFSIGNALED(status[r]) || WTERMSIG(status[r]) != SIGKILL)
        fail_msg("rank %d: expected to die of SIGKILL, status 0x%x", r, status[r]);
    } else if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0) {
      fail_msg("rank %d failed (status 0x%x)", r, status[r]);
    }
  }
  /* the last live rank unlinked the segment */
  if (segment_exists(&g_id)) fail_msg("a /dev/shm segment was left behind");
}

/* ---- a child's communicator ---------------------------------------------------- */

typedef struct ctx {
  ncfsm_loop *loop;
  ncfsm_comm *c;
} ctx;

static int open_comm(ctx *x, int rank, const ncfsm_sim_opts *so, uint64_t timeout_ms) {
  ncfsm_loop_opts lo;
  ncfsm_loop_opts_init(&lo);
  lo.overlap = NCFSM_OVERLAP_WARN; /* R12 test: launch overlapping ops as NCCL would */
  if (ncfsm_loop_new(&lo, &x->loop) != NCFSM_OK) return -1;
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.backend = NCFSM_BACKEND_SIM;
  o.sim = so;
  o.timeout_ms = timeout_ms;
  o.name = "mp";
  if (ncfsm_comm_new(x->loop, &o, &x->c) != NCFSM_OK) return -1;
  return ncfsm_comm_init(x->c, N, rank, &g_id) == NCFSM_OK ? 0 : -1;
}

static int close_comm(ctx *x) {
  int ok = 1;
  if (x->c) {
    ncfsm_state_t s = ncfsm_comm_state(x->c);
    if (s != NCFSM_STATE_CLOSED && s != NCFSM_STATE_NEW) ok &= ncfsm_comm_abort(x->c) == NCFSM_OK;
    ok &= ncfsm_comm_release(x->c) == NCFSM_OK;
  }
  if (x->loop) {
    ncfsm_loop_run(x->loop, NCFSM_RUN_NOWAIT);
    ok &= ncfsm_loop_close(x->loop) == NCFSM_OK;
  }
  return ok ? 0 : 1;
}

static void quiet_opts(ncfsm_sim_opts *so) {
  ncfsm_sim_opts_init(so);
  so->init_polls = 1;
  so->launch_polls = 1;
  so->finalize_polls = 1;
}

/* ---- every collective's data ------------------------------------------------------ */

static int rank_collectives(int rank) {
  ctx x = {0};
  ncfsm_sim_opts so;
  quiet_opts(&so);
  CHECK(open_comm(&x, rank, &so, 0) == 0);
  CHECK(ncfsm_comm_wait_state(x.c, NCFSM_STATE_READY, WAIT_MS) == NCFSM_OK);
  CHECK(ncfsm_comm_rank(x.c) == rank && ncfsm_comm_size(x.c) == N);

  int32_t ar_s[8], ar_r[8], bc[8], rd_r[8], ag_s[3], ag_r[3 * N], rs_s[2 * N], rs_r[2];
  int32_t aa_s[2 * N], aa_r[2 * N], ga_s[2], ga_r[2 * N], sc_s[2 * N], sc_r[2], p2p_s, p2p_r = -1;
  float fm_s[4], fm_r[4];
  int64_t rd_s[8];
  for (int i = 0; i < 8; i++) {
    ar_s[i] = rank + 1 + i;
    bc[i] = rank == 1 ? 100 + i : -1;
    rd_s[i] = (int64_t)(rank + 1) << 33;
    rd_r[i] = -1;
  }
  for (int i = 0; i < 4; i++) fm_s[i] = (float)(rank * 10 + i) * (i % 2 ? -1.0f : 1.0f);
  for (int i = 0; i < 3; i++) ag_s[i] = rank * 10 + i;
  for (int j = 0; j < 2 * N; j++) {
    rs_s[j] = rank * 100 + j;
    aa_s[j] = rank * 100 + j;
    sc_s[j] = rank == 0 ? 1000 + j : -1;
  }
  for (int i = 0; i < 2; i++) ga_s[i] = rank * 10 + i;
  p2p_s = rank * 7;
  int64_t rd_out[8];
  ncfsm_work *w[12];
  int nw = 0;
  /* all issued in one turn: they coalesce into shared launches */
  CHECK(ncfsm_allreduce(x.c, ar_s, ar_r, 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[nw++]) == NCFSM_OK);
  CHECK(ncfsm_allreduce(x.c, fm_s, fm_r, 4, NCFSM_FLOAT32, NCFSM_OP_MAX, NULL, NULL, NULL, &w[nw++]) == NCFSM_OK);
  CHECK(ncfsm_broadcast(x.c, bc, bc, 8, NCFSM_INT32, 1, NULL, NULL, NULL, &w[nw++]) == NCFSM_OK);
  CHECK(ncfsm_reduce(x.c, rd_s, rd_out, 8, NCFSM_INT64, NCFSM_OP_SUM, 2, NULL, NULL, NULL, &w[nw++]) == NCFSM_OK);
  CHECK(ncfsm_allgather(x.c, ag_s, ag_r, 3, NCFSM_INT32, NULL, NULL, NULL, &w[nw++]) == NCFSM_OK);
  CHECK(ncfsm_reducescatter(x.c, rs_s, rs_r, 2, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[nw++]) == NCFSM_OK);
  CHECK(ncfsm_alltoall(x.c, aa_s, aa_r, 2, NCFSM_INT32, NULL, NULL, NULL, &w[nw++]) == NCFSM_OK);
  CHECK(ncfsm_gather(x.c, ga_s, ga_r, 2, NCFSM_INT32, 3, NULL, NULL, NULL, &w[nw++]) == NCFSM_OK);
  CHECK(ncfsm_scatter(x.c, sc_s, sc_r, 2, NCFSM_INT32, 0, NULL, NULL, NULL, &w[nw++]) == NCFSM_OK);
  CHECK(ncfsm_group_start(x.loop) == NCFSM_OK); /* ring exchange */
  CHECK(ncfsm_send(x.c, &p2p_s, 1, NCFSM_INT32, (rank + 1) % N, NULL, NULL, NULL, &w[nw++]) == NCFSM_OK);
  CHECK(ncfsm_recv(x.c, &p2p_r, 1, NCFSM_INT32, (rank + N - 1) % N, NULL, NULL, NULL, &w[nw++]) == NCFSM_OK);
  CHECK(ncfsm_group_end(x.loop) == NCFSM_OK);
  for (int i = 0; i < nw; i++) {
    CHECK(ncfsm_work_wait(w[i], WAIT_MS) == NCFSM_OK);
    ncfsm_work_release(w[i]);
  }
  (void)rd_r;
  for (int i = 0; i < 8; i++) {
    CHECK(ar_r[i] == 10 + 4 * i); /* sum over ranks of rank + 1 + i */
    CHECK(bc[i] == 100 + i);
    if (rank == 2) CHECK(rd_out[i] == (int64_t)10 << 33);
  }
  for (int i = 0; i < 4; i++) CHECK(fm_r[i] == (i % 2 ? -(float)i : (float)(30 + i)));
  for (int r = 0; r < N; r++)
    for (int i = 0; i < 3; i++) CHECK(ag_r[r * 3 + i] == r * 10 + i);
  for (int i = 0; i < 2; i++) CHECK(rs_r[i] == 600 + N * (rank * 2 + i));
  for (int p = 0; p < N; p++)
    for (int i = 0; i < 2; i++) CHECK(aa_r[p * 2 + i] == p * 100 + rank * 2 + i);
  if (rank == 3)
    for (int r = 0; r < N; r++)
      for (int i = 0; i < 2; i++) CHECK(ga_r[r * 2 + i] == r * 10 + i);
  for (int i = 0; i < 2; i++) CHECK(sc_r[i] == 1000 + rank * 2 + i);
  CHECK(p2p_r == ((rank + N - 1) % N) * 7);

  /* R12: three in-place AllReduces on one buffer in ONE group run concurrently:
   * all read the original input (4, not the sequential 64). */
  int32_t b[4] = {1, 1, 1, 1};
  CHECK(ncfsm_group_start(x.loop) == NCFSM_OK);
  for (int k = 0; k < 3; k++)
    CHECK(ncfsm_allreduce(x.c, b, b, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL) == NCFSM_OK);
  CHECK(ncfsm_group_end(x.loop) == NCFSM_OK);
  CHECK(ncfsm_loop_run(x.loop, NCFSM_RUN_DEFAULT) == NCFSM_OK);
  for (int i = 0; i < 4; i++) CHECK(b[i] == N);
  /* the same three as separate launches are ordered: 1 -> 4 -> 16 -> 64 */
  for (int i = 0; i < 4; i++) b[i] = 1;
  for (int k = 0; k < 3; k++)
    CHECK(ncfsm_allreduce(x.c, b, b, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL) == NCFSM_OK);
  CHECK(ncfsm_loop_run(x.loop, NCFSM_RUN_DEFAULT) == NCFSM_OK);
  for (int i = 0; i < 4; i++) CHECK(b[i] == N * N * N);

  CHECK(ncfsm_comm_finalize(x.c) == NCFSM_OK);
  CHECK(ncfsm_comm_wait_state(x.c, NCFSM_STATE_FINALIZED, WAIT_MS) == NCFSM_OK);
  CHECK(ncfsm_comm_destroy(x.c) == NCFSM_OK);
  return close_comm(&x);
}

static void test_mp_collectives(void **state) {
  (void)state;
  run_ranks(rank_collectives, 0);
}

/* ---- R2 on the raw backend: a call during InProgress poisons the comm ---------------- */

static int raw_poll(void *c) {
  int st = NCFSM__NCCL_IN_PROGRESS;
  for (int i = 0; i < WAIT_MS && st == NCFSM__NCCL_IN_PROGRESS; i++) {
    be->get_async_error(c, &st);
    if (st == NCFSM__NCCL_IN_PROGRESS && i > 16) sleep_ms(1);
  }
  return st;
}

static int rank_raw_r2(int rank) {
  ctx x = {0};
  ncfsm_sim_opts so;
  quiet_opts(&so);
  so.launch_polls = 3;
  ncfsm__comm_config cfg = {0, 0, &so, "raw"};
  void *c = NULL, *stream = NULL, *ev = NULL;
  CHECK(be->comm_init(&c, N, &g_id, rank, &cfg) == NCFSM__NCCL_IN_PROGRESS); /* R1 */
  CHECK(raw_poll(c) == NCFSM__NCCL_SUCCESS); /* every rank arrived (other processes) */
  CHECK(be->stream_create(0, &stream) == 0 && be->event_create(0, &ev) == 0);
  int32_t a[4] = {rank, rank, rank, rank}, b[4] = {0};
  ncfsm__op op = {NCFSM_KIND_ALLREDUCE, a, a, 4, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  CHECK(be->op(c, &op) == NCFSM__NCCL_IN_PROGRESS);
  ncfsm__op op2 = {NCFSM_KIND_ALLREDUCE, b, b, 4, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  CHECK(be->op(c, &op2) == NCFSM__NCCL_INVALID_ARGUMENT);
  CHECK(strstr(be->last_error(c), "before the previous operation returned ncclSuccess") != NULL);
  CHECK(raw_poll(c) == NCFSM__NCCL_INVALID_ARGUMENT); /* poisoned (R2) */
  /* the first operation's data is still right */
  CHECK(be->event_record(ev, stream) == 0);
  int q = 1;
  for (int i = 0; i < WAIT_MS && q == 1; i++) {
    q = be->event_query(ev);
    if (q == 1) sleep_ms(1);
  }
  CHECK(q == 0);
  for (int i = 0; i < 4; i++) CHECK(a[i] == 0 + 1 + 2 + 3);
  CHECK(b[0] == 0);
  CHECK(be->abort(c) == 0);
  be->event_destroy(ev);
  be->stream_destroy(stream);
  return 0;
}

static void test_mp_raw_r2_poisoning(void **state) {
  (void)state;
  run_ranks(rank_raw_r2, 0);
}

/* ---- fault injection ---------------------------------------------------------------- */

/* R10: rank 2's op 1 gets an async error; its peers' op 1 never completes and
 * the watchdog times them out. */
static int rank_async_error(int rank) {
  ctx x = {0};
  ncfsm_sim_opts so;
  quiet_opts(&so);
  if (rank == 2) {
    so.async_error_at_op = 1;
    so.async_error_code = NCFSM__NCCL_REMOTE_ERROR;
  }
  CHECK(open_comm(&x, rank, &so, 800) == 0);
  CHECK(ncfsm_comm_wait_state(x.c, NCFSM_STATE_READY, WAIT_MS) == NCFSM_OK);
  int32_t a[4] = {1, 1, 1, 1};
  ncfsm_work *w;
  CHECK(ncfsm_allreduce(x.c, a, a, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w) == NCFSM_OK);
  CHECK(ncfsm_work_wait(w, WAIT_MS) == NCFSM_OK);
  ncfsm_work_release(w);
  CHECK(a[0] == N);
  CHECK(ncfsm_allreduce(x.c, a, a, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w) == NCFSM_OK);
  ncfsm_result_t st = ncfsm_work_wait(w, WAIT_MS);
  ncfsm_work_release(w);
  if (rank == 2) {
    CHECK(st == NCFSM_ERR_BACKEND || st == NCFSM_ERR_ASYNC);
    CHECK(ncfsm_comm_backend_error(x.c) == NCFSM__NCCL_REMOTE_ERROR);
    CHECK(strstr(ncfsm_comm_last_error(x.c), "injected async error") != NULL);
  } else {
    CHECK(st == NCFSM_ERR_TIMEOUT);
  }
  return close_comm(&x);
}

static void test_mp_async_error_at_op(void **state) {
  (void)state;
  run_ranks(rank_async_error, 0);
}

/* never_arrive: rank 1's ops are invisible; everyone's AllReduce times out. */
static int rank_never_arrive(int rank) {
  ctx x = {0};
  ncfsm_sim_opts so;
  quiet_opts(&so);
  so.never_arrive = rank == 1;
  CHECK(open_comm(&x, rank, &so, 600) == 0);
  CHECK(ncfsm_comm_wait_state(x.c, NCFSM_STATE_READY, WAIT_MS) == NCFSM_OK);
  int32_t a[4] = {1, 1, 1, 1};
  ncfsm_work *w;
  CHECK(ncfsm_allreduce(x.c, a, a, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w) == NCFSM_OK);
  CHECK(ncfsm_work_wait(w, WAIT_MS) == NCFSM_ERR_TIMEOUT);
  ncfsm_work_release(w);
  CHECK(a[0] == 1); /* outputs untouched */
  CHECK(strstr(ncfsm_comm_last_error(x.c), "watchdog") != NULL);
  return close_comm(&x);
}

static void test_mp_never_arrive(void **state) {
  (void)state;
  run_ranks(rank_never_arrive, 0);
}

/* fail_init: rank 3's init ends in ncclSystemError; the others become READY. */
static int rank_fail_init(int rank) {
  ctx x = {0};
  ncfsm_sim_opts so;
  quiet_opts(&so);
  so.fail_init = rank == 3 ? NCFSM__NCCL_SYSTEM_ERROR : 0;
  CHECK(open_comm(&x, rank, &so, 0) == 0);
  ncfsm_result_t r = ncfsm_comm_wait_state(x.c, NCFSM_STATE_READY, WAIT_MS);
  if (rank == 3) {
    CHECK(r == NCFSM_ERR_ILLEGAL_STATE);
    CHECK(ncfsm_comm_backend_error(x.c) == NCFSM__NCCL_SYSTEM_ERROR);
    CHECK(strstr(be->last_error(NULL), "injected init failure") != NULL);
  } else {
    CHECK(r == NCFSM_OK);
  }
  return close_comm(&x);
}

static void test_mp_fail_init(void **state) {
  (void)state;
  run_ranks(rank_fail_init, 0);
}

/* R11 mismatch: rank 3 calls AllReduce where the others Broadcast from 0:
 * the root returns with its own data, its peers hang (watchdog). */
static int rank_mismatch(int rank) {
  ctx x = {0};
  ncfsm_sim_opts so;
  quiet_opts(&so);
  CHECK(open_comm(&x, rank, &so, 600) == 0);
  CHECK(ncfsm_comm_wait_state(x.c, NCFSM_STATE_READY, WAIT_MS) == NCFSM_OK);
  int32_t s[4] = {rank + 5, rank + 5, rank + 5, rank + 5}, r[4] = {0};
  ncfsm_work *w;
  if (rank == 3)
    CHECK(ncfsm_allreduce(x.c, s, r, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w) == NCFSM_OK);
  else
    CHECK(ncfsm_broadcast(x.c, s, r, 4, NCFSM_INT32, 0, NULL, NULL, NULL, &w) == NCFSM_OK);
  ncfsm_result_t st = ncfsm_work_wait(w, WAIT_MS);
  ncfsm_work_release(w);
  if (rank == 0) {
    CHECK(st == NCFSM_OK);
    CHECK(r[0] == 5);
  } else {
    CHECK(st == NCFSM_ERR_TIMEOUT);
  }
  return close_comm(&x);
}

static void test_mp_mismatch(void **state) {
  (void)state;
  run_ranks(rank_mismatch, 0);
}

/* ---- a rank killed with SIGKILL --------------------------------------------------------- */

static int g_kill_locked; /* 1: the victim dies holding the clique's robust mutex */

/* Rank 3 issues its second AllReduce and is killed before it completes
 * (holding the clique's lock, or not); the others' second AllReduce fails
 * with a remote error (dead peer) or the watchdog, never hangs. */
static int rank_killed(int rank) {
  ctx x = {0};
  ncfsm_sim_opts so;
  quiet_opts(&so);
  CHECK(open_comm(&x, rank, &so, 5000) == 0);
  CHECK(ncfsm_comm_wait_state(x.c, NCFSM_STATE_READY, WAIT_MS) == NCFSM_OK);
  int32_t a[4] = {1, 1, 1, 1};
  ncfsm_work *w;
  CHECK(ncfsm_allreduce(x.c, a, a, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w) == NCFSM_OK);
  CHECK(ncfsm_work_wait(w, WAIT_MS) == NCFSM_OK);
  ncfsm_work_release(w);
  CHECK(a[0] == N);
  CHECK(ncfsm_allreduce(x.c, a, a, 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w) == NCFSM_OK);
  if (rank == 3) {
    if (g_kill_locked) { /* die inside the clique's critical section */
      char name[SIM_SHM_NAME_MAX];
      ncfsm__sim_shm_name((const unsigned char *)g_id.internal, name, sizeof name);
      int fd = shm_open(name, O_RDWR, 0);
      CHECK(fd >= 0);
      shm_hdr *h = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      CHECK(h != MAP_FAILED);
      CHECK(pthread_mutex_lock(&h->mu) == 0);
      h->owner_pid = (int)getpid();
    }
    raise(SIGKILL);
  }
  ncfsm_result_t st = ncfsm_work_wait(w, WAIT_MS);
  ncfsm_work_release(w);
  /* the death is detected (pid check, or EOWNERDEAD on the lock) long before
   * the 5 s watchdog: a remote error, as NCCL reports a lost peer */
  CHECK(st == NCFSM_ERR_BACKEND || st == NCFSM_ERR_ASYNC);
  CHECK(ncfsm_comm_backend_error(x.c) == NCFSM__NCCL_REMOTE_ERROR);
  CHECK(strstr(ncfsm_comm_last_error(x.c), "died") != NULL);
  return close_comm(&x);
}

static void test_mp_sigkill(void **state) {
  (void)state;
  g_kill_locked = 0;
  run_ranks(rank_killed, 1u << 3);
}

static void test_mp_sigkill_holding_lock(void **state) {
  (void)state;
  g_kill_locked = 1;
  run_ranks(rank_killed, 1u << 3);
}

/* ---- one process: the arena bound and stale segments ------------------------------------- */

/* An op that cannot fit the clique's arena is refused with ncclSystemError
 * and a WARN naming NCFSM_SIM_SHM_BYTES (raw backend and through ncfsm). */
static void test_arena_bound(void **state) {
  (void)state;
  setenv("NCFSM_SIM_SHM_BYTES", "1048576", 1);
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  ncfsm_comm *c[2];
  make_comms(loop, 2, &o, c, 0);
  for (int r = 0; r < 2; r++) run_until_state(loop, c[r], NCFSM_STATE_READY);
  unsetenv("NCFSM_SIM_SHM_BYTES"); /* read when the backend init created the clique */
  enum { SMALL = 1024, BIG = 160 * 1024 }; /* int32: 640 KiB per rank */
  static int32_t buf[2][BIG];
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < SMALL; i++) buf[r][i] = r + 1;
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], SMALL, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL,
                                     NULL, &w[r]), NCFSM_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_work_wait(w[r], WAIT_MS), NCFSM_OK);
    ncfsm_work_release(w[r]);
    assert_int_equal(buf[r][SMALL - 1], 3);
  }
  for (int r = 0; r < 2; r++)
    assert_int_equal(ncfsm_allreduce(c[r], buf[r], buf[r], BIG, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL,
                                     NULL, &w[r]), NCFSM_OK);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(ncfsm_work_wait(w[r], WAIT_MS), NCFSM_ERR_BACKEND);
    ncfsm_work_release(w[r]);
    assert_int_equal(ncfsm_comm_backend_error(c[r]), NCFSM__NCCL_SYSTEM_ERROR);
  }
  assert_non_null(strstr(ncfsm_comm_last_error(c[0]), "NCFSM_SIM_SHM_BYTES"));
  teardown_all(loop, c, 2);

  /* raw: the op call itself returns ncclSystemError */
  setenv("NCFSM_SIM_SHM_BYTES", "1048576", 1);
  ncfsm_unique_id id;
  assert_int_equal(be->get_unique_id(&id), 0);
  ncfsm__comm_config cfg = {1, 0, &so, "raw"};
  void *rc = NULL;
  assert_int_equal(be->comm_init(&rc, 1, &id, 0, &cfg), NCFSM__NCCL_SUCCESS);
  unsetenv("NCFSM_SIM_SHM_BYTES");
  void *stream;
  assert_int_equal(be->stream_create(0, &stream), 0);
  ncfsm__op op = {NCFSM_KIND_ALLGATHER, buf[0], buf[1], BIG, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  assert_int_equal(be->op(rc, &op), NCFSM__NCCL_SYSTEM_ERROR);
  assert_non_null(strstr(be->last_error(rc), "NCFSM_SIM_SHM_BYTES"));
  assert_int_equal(be->abort(rc), 0);
  be->stream_destroy(stream);
  assert_false(segment_exists(&id));
}

/* A rank that crashed leaves its segment; the next process that creates a
 * sim clique removes it (all of its processes are gone). */
static void test_stale_segment_cleanup(void **state) {
  (void)state;
  ncfsm_unique_id id;
  assert_int_equal(be->get_unique_id(&id), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    ncfsm_sim_opts so;
    quiet_opts(&so);
    ncfsm__comm_config cfg = {0, 0, &so, "crash"};
    void *c = NULL;
    be->comm_init(&c, 2, &id, 0, &cfg); /* nonblocking: returns InProgress at once */
    raise(SIGKILL);
    _exit(1);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFSIGNALED(st));
  assert_true(segment_exists(&id)); /* left behind by the crash */
  ncfsm_unique_id id2;
  assert_int_equal(be->get_unique_id(&id2), 0);
  ncfsm_sim_opts so;
  quiet_opts(&so);
  ncfsm__comm_config cfg = {1, 0, &so, "next"};
  void *c = NULL;
  assert_int_equal(be->comm_init(&c, 1, &id2, 0, &cfg), NCFSM__NCCL_SUCCESS);
  assert_false(segment_exists(&id)); /* swept by the creator of id2's segment */
  assert_true(segment_exists(&id2));
  assert_int_equal(be->abort(c), 0);
  assert_false(segment_exists(&id2));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mp_collectives),      cmocka_unit_test(test_mp_raw_r2_poisoning),
      cmocka_unit_test(test_mp_async_error_at_op), cmocka_unit_test(test_mp_never_arrive),
      cmocka_unit_test(test_mp_fail_init),        cmocka_unit_test(test_mp_mismatch),
      cmocka_unit_test(test_mp_sigkill),          cmocka_unit_test(test_mp_sigkill_holding_lock),
      cmocka_unit_test(test_arena_bound),         cmocka_unit_test(test_stale_segment_cleanup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
