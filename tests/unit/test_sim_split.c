/*
 * The sim's model of communicators made from communicators, on the raw sim
 * backend (core/backend.h): ncclCommSplit (R8), ncclCommShrink (R7, with
 * R6 revoke), ncclCommGetUniqueId + ncclCommGrow (NCCL 2.29), dead ranks
 * (ncfsm_sim_opts.dead), a shrink that excludes a process killed with
 * SIGKILL (forked ranks), and NCCL 2.31.2's hang in a destroy of a parent
 * shrunk with NCCL_SHRINK_ABORT. docs/sim.md, "Split, shrink, grow and dead ranks".
 *
 * What a nonblocking parent goes through (R8): the call returns
 * ncclInProgress (ncclSuccess inside a group, whose end returns
 * ncclInProgress) with the child handle NULL; the parent polls InProgress
 * split_polls times and then until every member called; the poll that
 * returns ncclSuccess has written the child, which then polls its own init
 * (init_polls) to ncclSuccess.
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/log.h"
#include "core/sim/sim-internal.h"
#include "core/sim/sim.h"
#include "helpers.h"

static const ncfsm__backend *be = &ncfsm__backend_sim;

enum { OK = NCFSM__NCCL_SUCCESS, E_ARG = NCFSM__NCCL_INVALID_ARGUMENT, E_USAGE = NCFSM__NCCL_INVALID_USAGE,
       E_REMOTE = NCFSM__NCCL_REMOTE_ERROR, IP = NCFSM__NCCL_IN_PROGRESS };

#define MAXR 8

/* n ranks of one clique, every one polled to success (per-rank options). */
static void raw_init_each(void **c, int n, ncfsm_sim_opts *so, int blocking) {
  ncfsm_unique_id id;
  assert_int_equal(be->get_unique_id(&id), 0);
  be->group_start();
  for (int r = 0; r < n; r++) {
    ncfsm__comm_config cfg = {blocking, 0, &so[r], "parent"};
    assert_int_equal(be->comm_init(&c[r], n, &id, r, &cfg), OK);
  }
  assert_int_equal(be->group_end(), blocking ? OK : IP);
  for (int r = 0; r < n; r++) {
    int st = IP;
    for (int i = 0; i < 100 && st == IP; i++) be->get_async_error(c[r], &st);
    assert_int_equal(st, OK);
  }
}

static void raw_init(void **c, int n, const ncfsm_sim_opts *so, int blocking) {
  ncfsm_sim_opts each[MAXR];
  for (int r = 0; r < n; r++) each[r] = *so;
  raw_init_each(c, n, each, blocking);
}

static int poll1(void *c) {
  int st = -1;
  assert_int_equal(be->get_async_error(c, &st), OK);
  return st;
}

static int poll_final(void *c) {
  int st = IP;
  for (int i = 0; i < 1000 && st == IP; i++) st = poll1(c);
  return st;
}

/* 0 once every op enqueued on stream before now completed (bounded). */
static int drain(void *stream, int max_iter) {
  void *ev;
  assert_int_equal(be->event_create(0, &ev), 0);
  assert_int_equal(be->event_record(ev, stream), 0);
  int q = 1;
  for (int i = 0; i < max_iter && q == 1; i++) q = be->event_query(ev);
  be->event_destroy(ev);
  return q;
}

static ncfsm_sim_stats stats(void *c) {
  ncfsm_sim_stats st;
  assert_int_equal(ncfsm__sim_stats(c, &st), 0);
  return st;
}

static int last_has(const char *s) { return strstr(be->last_error(NULL), s) != NULL; }

/* One nonblocking AllReduce (sum of int32 rank inputs) over n comms of one
 * clique, driven from this thread; out[r] gets comm r's result. */
static void allreduce_all(void **c, int n, const int32_t *in, int32_t *out, void *stream) {
  int32_t send[MAXR];
  be->group_start();
  for (int r = 0; r < n; r++) {
    send[r] = in[r];
    out[r] = -1;
    ncfsm__op op = {NCFSM_KIND_ALLREDUCE, &send[r], &out[r], 1, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
    assert_int_equal(be->op(c[r], &op), OK);
  }
  assert_int_equal(be->group_end(), IP);
  for (int r = 0; r < n; r++) assert_int_equal(poll_final(c[r]), OK);
  assert_int_equal(drain(stream, 10000), 0);
}

static void abort_all(void **c, int n) {
  for (int r = 0; r < n; r++)
    if (c[r]) assert_int_equal(be->abort(c[r]), OK);
}

/* ---- split ------------------------------------------------------------------------ */

/* 5 ranks: colors 0,1,0,1 and NOCOLOR; keys reorder color 0 (R8 shape). */
static void test_split_colors_keys(void **state) {
  (void)state;
  enum { N = 5 };
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  so.split_polls = 2;
  void *p[N], *ch[N];
  raw_init(p, N, &so, 0);
  ncfsm_sim_opts cso;
  test_sim_opts(&cso);
  cso.init_polls = 2;
  ncfsm__comm_config ccfg = {0, 0, &cso, "child"};
  const int color[N] = {0, 1, 0, 1, NCFSM__SPLIT_NOCOLOR}, key[N] = {5, 0, 1, 0, 0};
  for (int r = 0; r < N; r++) ch[r] = (void *)&ch; /* the call writes NULL at once */
  be->group_start();
  for (int r = 0; r < N; r++) assert_int_equal(be->comm_split(p[r], color[r], key[r], &ch[r], &ccfg), OK);
  assert_int_equal(be->group_end(), IP); /* R1 */
  for (int r = 0; r < N; r++) assert_null(ch[r]); /* R8: measured NULL right after the grouped split */
  for (int i = 0; i < so.split_polls; i++)
    for (int r = 0; r < N; r++) {
      assert_int_equal(poll1(p[r]), IP);
      assert_null(ch[r]);
    }
  for (int r = 0; r < N; r++) {
    assert_int_equal(poll1(p[r]), OK); /* the poll that returns success wrote the child */
    if (color[r] == NCFSM__SPLIT_NOCOLOR) assert_null(ch[r]);
    else assert_non_null(ch[r]);
  }
  /* each child polls its own init (R8): init_polls, then success */
  for (int i = 0; i < cso.init_polls; i++)
    for (int r = 0; r < N - 1; r++) assert_int_equal(poll1(ch[r]), IP);
  for (int r = 0; r < N - 1; r++) assert_int_equal(poll1(ch[r]), OK);
  /* ranks: by key, then parent rank */
  const int want_rank[N - 1] = {1, 0, 0, 1};
  for (int r = 0; r < N - 1; r++) {
    int rk = -1, sz = -1;
    assert_int_equal(be->comm_rank_size(ch[r], &rk, &sz), OK);
    assert_int_equal(rk, want_rank[r]);
    assert_int_equal(sz, 2);
  }
  /* an AllReduce per color gives that color's sum */
  void *stream;
  assert_int_equal(be->stream_create(0, &stream), 0);
  void *c0[2] = {ch[0], ch[2]}, *c1[2] = {ch[1], ch[3]};
  int32_t in0[2] = {1, 3}, in1[2] = {2, 4}, out[2];
  allreduce_all(c0, 2, in0, out, stream);
  assert_int_equal(out[0], 4);
  assert_int_equal(out[1], 4);
  allreduce_all(c1, 2, in1, out, stream);
  assert_int_equal(out[0], 6);
  assert_int_equal(out[1], 6);
  for (int r = 0; r < N; r++) {
    ncfsm_sim_stats st = stats(p[r]);
    assert_int_equal(st.splits, 1);
    assert_int_equal(st.rejected, 0);
    assert_int_equal(st.async_state, OK);
  }
  assert_int_equal(stats(ch[0]).executed, 1);
  assert_int_equal(stats(ch[0]).splits, 0);
  /* the parent stays usable */
  int32_t pin[N] = {1, 1, 1, 1, 1}, pout[N];
  allreduce_all(p, N, pin, pout, stream);
  assert_int_equal(pout[4], N);
  abort_all(ch, N);
  abort_all(p, N);
  be->stream_destroy(stream);
}

/* Outside a group the nonblocking call itself returns InProgress (R1), and a
 * split_polls of 0 ends at the first poll that finds every member. */
static void test_split_implicit_group(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  so.split_polls = 0;
  void *p[2], *ch[2];
  raw_init(p, 2, &so, 0);
  ncfsm__comm_config ccfg = {0, 0, &so, "child"};
  assert_int_equal(be->comm_split(p[0], 7, 0, &ch[0], &ccfg), IP);
  assert_null(ch[0]);
  for (int i = 0; i < 5; i++) assert_int_equal(poll1(p[0]), IP); /* rank 1 has not called: a collective */
  assert_null(ch[0]);
  assert_int_equal(be->comm_split(p[1], 7, 0, &ch[1], &ccfg), IP);
  assert_int_equal(poll1(p[0]), OK);
  assert_int_equal(poll1(p[1]), OK);
  assert_non_null(ch[0]);
  assert_non_null(ch[1]);
  /* ncclCommCount/UserRank on a child still in its init: ncclCommEnsureReady refuses (R2) */
  int rk, sz;
  assert_int_equal(be->comm_rank_size(ch[0], &rk, &sz), E_ARG);
  assert_true(last_has("before the previous operation returned ncclSuccess"));
  assert_int_equal(poll_final(ch[0]), OK);
  assert_int_equal(poll_final(ch[1]), OK);
  assert_int_equal(be->comm_rank_size(ch[0], &rk, &sz), OK);
  assert_int_equal(sz, 2);
  abort_all(ch, 2);
  abort_all(p, 2);
}

/* Blocking parent: the group end waits for every member and returns with the
 * children written and ready. Also a 1-rank blocking parent outside a group. */
static void test_split_blocking(void **state) {
  (void)state;
  enum { N = 4 };
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  void *p[N], *ch[N];
  raw_init(p, N, &so, 1);
  ncfsm__comm_config ccfg = {1, 0, &so, "child"};
  be->group_start();
  for (int r = 0; r < N; r++) assert_int_equal(be->comm_split(p[r], r % 2, -r, &ch[r], &ccfg), OK);
  assert_int_equal(be->group_end(), OK);
  for (int r = 0; r < N; r++) {
    assert_non_null(ch[r]);
    assert_int_equal(stats(ch[r]).async_state, OK); /* ready: no poll needed */
    assert_int_equal(poll1(p[r]), OK);
    int rk, sz;
    assert_int_equal(be->comm_rank_size(ch[r], &rk, &sz), OK);
    assert_int_equal(sz, 2);
    assert_int_equal(rk, r < 2 ? 1 : 0); /* key -r: the higher parent rank first */
  }
  /* blocking AllReduce on color 1 (parent ranks 1, 3) */
  void *stream;
  assert_int_equal(be->stream_create(0, &stream), 0);
  int32_t a = 10, b = 20, ra = 0, rb = 0;
  be->group_start();
  ncfsm__op o1 = {NCFSM_KIND_ALLREDUCE, &a, &ra, 1, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  ncfsm__op o3 = {NCFSM_KIND_ALLREDUCE, &b, &rb, 1, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  assert_int_equal(be->op(ch[1], &o1), OK);
  assert_int_equal(be->op(ch[3], &o3), OK);
  assert_int_equal(be->group_end(), OK);
  assert_int_equal(drain(stream, 10000), 0);
  assert_int_equal(ra, 30);
  assert_int_equal(rb, 30);
  abort_all(ch, N);
  abort_all(p, N);
  be->stream_destroy(stream);

  void *one, *child = NULL;
  raw_init(&one, 1, &so, 1);
  assert_int_equal(be->comm_split(one, 0, 0, &child, &ccfg), OK);
  assert_non_null(child);
  assert_int_equal(poll1(child), OK);
  void *none = &none;
  assert_int_equal(be->comm_split(one, NCFSM__SPLIT_NOCOLOR, 0, &none, &ccfg), OK);
  assert_null(none);
  assert_int_equal(stats(one).splits, 2);
  assert_int_equal(be->abort(child), OK);
  assert_int_equal(be->abort(one), OK);
}

/* A parent with outstanding work, or InProgress, or revoked: refused. */
static void test_split_refused(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  void *p[2], *ch[2] = {NULL, NULL};
  raw_init(p, 2, &so, 0);
  ncfsm__comm_config ccfg = {0, 0, &so, "child"};
  void *stream;
  assert_int_equal(be->stream_create(0, &stream), 0);
  int32_t a = 1, ra = 0;
  ncfsm__op op = {NCFSM_KIND_ALLREDUCE, &a, &ra, 1, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  assert_int_equal(be->op(p[0], &op), IP);
  assert_int_equal(poll_final(p[0]), OK); /* posted; rank 1 has not launched: outstanding */
  assert_int_equal(be->comm_split(p[0], 0, 0, &ch[0], &ccfg), E_USAGE);
  assert_true(last_has("outstanding"));
  assert_true(last_has("R8"));
  assert_null(ch[0]);
  assert_int_equal(poll1(p[0]), OK); /* not poisoned: an InvalidUsage */
  assert_int_equal(stats(p[0]).rejected, 1);
  /* R2 on rank 1: a split while its launch is InProgress */
  int32_t b = 2, rb = 0;
  ncfsm__op op1 = {NCFSM_KIND_ALLREDUCE, &b, &rb, 1, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  assert_int_equal(be->op(p[1], &op1), IP);
  assert_int_equal(be->comm_split(p[1], 0, 0, &ch[1], &ccfg), E_ARG);
  assert_true(last_has("before the previous operation returned ncclSuccess"));
  assert_int_equal(poll_final(p[1]), E_ARG); /* poisoned, as any call refused during InProgress (R2) */
  assert_int_equal(drain(stream, 10000), 0); /* the AllReduce itself ran */
  assert_int_equal(ra, 3);
  /* rank 0 is healthy and idle now: a split is admitted (it waits for rank 1 for ever) */
  assert_int_equal(be->comm_split(p[0], 0, 0, &ch[0], &ccfg), IP);
  /* a revoked parent: split refused (R6/R8), shrink allowed (below) */
  abort_all(p, 2);
  raw_init(p, 2, &so, 0);
  assert_int_equal(be->revoke(p[0], 0), IP);
  assert_int_equal(poll_final(p[0]), OK);
  assert_int_equal(be->comm_split(p[0], 0, 0, &ch[0], &ccfg), E_USAGE);
  assert_true(last_has("revoked"));
  abort_all(p, 2);
  be->stream_destroy(stream);
}

/* ---- shrink ------------------------------------------------------------------------- */

/* DEFAULT, excluding rank 1 (which never calls): the survivors 0, 2, 3 are
 * re-numbered 0, 1, 2 in parent-rank order; the AllReduce over them is right. */
static void test_shrink_default(void **state) {
  (void)state;
  enum { N = 4 };
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  so.split_polls = 1;
  void *p[N], *ch[N] = {NULL};
  raw_init(p, N, &so, 0);
  ncfsm__comm_config ccfg = {0, 0, &so, "shrunk"};
  const int ex[1] = {1};
  int live[3] = {0, 2, 3};
  for (int i = 0; i < 3; i++)
    assert_int_equal(be->comm_shrink(p[live[i]], ex, 1, &ch[i], &ccfg, NCFSM__SHRINK_DEFAULT), IP);
  for (int i = 0; i < 3; i++) {
    assert_null(ch[i]);
    assert_int_equal(poll1(p[live[i]]), IP); /* split_polls = 1 */
  }
  for (int i = 0; i < 3; i++) {
    assert_int_equal(poll1(p[live[i]]), OK);
    assert_non_null(ch[i]);
  }
  for (int i = 0; i < 3; i++) assert_int_equal(poll_final(ch[i]), OK);
  for (int i = 0; i < 3; i++) {
    int rk, sz;
    assert_int_equal(be->comm_rank_size(ch[i], &rk, &sz), OK);
    assert_int_equal(rk, i);
    assert_int_equal(sz, 3);
    assert_int_equal(stats(p[live[i]]).shrinks, 1);
  }
  void *stream;
  assert_int_equal(be->stream_create(0, &stream), 0);
  int32_t in[3] = {1, 10, 100}, out[3];
  allreduce_all(ch, 3, in, out, stream);
  for (int i = 0; i < 3; i++) assert_int_equal(out[i], 111);
  /* after a DEFAULT shrink the parent is still a working comm (here with all 4) */
  int32_t pin[N] = {1, 2, 3, 4}, pout[N];
  allreduce_all(p, N, pin, pout, stream);
  assert_int_equal(pout[1], 10);
  abort_all(ch, 3);
  abort_all(p, N);
  be->stream_destroy(stream);
}

static void test_shrink_default_refused(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  void *p[3], *ch = NULL;
  raw_init(p, 3, &so, 0);
  ncfsm__comm_config ccfg = {0, 0, &so, "shrunk"};
  void *stream;
  assert_int_equal(be->stream_create(0, &stream), 0);
  int32_t a = 1, ra = 0;
  ncfsm__op op = {NCFSM_KIND_ALLREDUCE, &a, &ra, 1, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  assert_int_equal(be->op(p[0], &op), IP);
  assert_int_equal(poll_final(p[0]), OK);
  const int ex[1] = {2};
  assert_int_equal(be->comm_shrink(p[0], ex, 1, &ch, &ccfg, NCFSM__SHRINK_DEFAULT), E_USAGE);
  assert_true(last_has("outstanding"));
  assert_true(last_has("NCCL_SHRINK_ABORT"));
  assert_null(ch);
  assert_int_equal(poll1(p[0]), OK);
  /* bad arguments (on blocking parents, which an argument error does not poison, R3) */
  void *b[3];
  raw_init(b, 3, &so, 1);
  ncfsm__comm_config bcfg = {1, 0, &so, "shrunk"};
  const int bad[2] = {2, 2}, out_of_range[1] = {3}, all[3] = {0, 1, 2};
  assert_int_equal(be->comm_shrink(b[1], bad, 2, &ch, &bcfg, NCFSM__SHRINK_DEFAULT), E_ARG);
  assert_true(last_has("excluded twice"));
  assert_int_equal(be->comm_shrink(b[1], out_of_range, 1, &ch, &bcfg, NCFSM__SHRINK_DEFAULT), E_ARG);
  assert_true(last_has("out of range"));
  assert_int_equal(be->comm_shrink(b[1], all, 3, &ch, &bcfg, NCFSM__SHRINK_DEFAULT), E_ARG);
  assert_true(last_has("excluded ranks must not call"));
  assert_int_equal(be->comm_shrink(b[1], ex, 0, &ch, &bcfg, NCFSM__SHRINK_DEFAULT), E_ARG);
  assert_true(last_has("not positive"));
  assert_int_equal(poll1(b[1]), OK);
  assert_int_equal(stats(b[1]).rejected, 4);
  abort_all(b, 3);
  /* an error state: DEFAULT refused, naming the way out */
  abort_all(p, 3);
  ncfsm_sim_opts each[3] = {so, so, so};
  each[0].async_error_at_op = 0;
  raw_init_each(p, 3, each, 0);
  assert_int_equal(be->op(p[0], &op), IP);
  assert_int_equal(poll_final(p[0]), NCFSM__NCCL_REMOTE_ERROR);
  assert_int_equal(be->comm_shrink(p[0], ex, 1, &ch, &ccfg, NCFSM__SHRINK_DEFAULT), E_USAGE);
  assert_true(last_has("error state"));
  /* ...and ABORT, the recovery path, works from it */
  assert_int_equal(be->comm_shrink(p[0], ex, 1, &ch, &ccfg, NCFSM__SHRINK_ABORT), IP);
  void *ch1 = NULL;
  assert_int_equal(be->comm_shrink(p[1], ex, 1, &ch1, &ccfg, NCFSM__SHRINK_ABORT), IP);
  assert_int_equal(poll_final(p[0]), OK);
  assert_int_equal(poll_final(p[1]), OK);
  assert_int_equal(poll_final(ch), OK);
  assert_int_equal(poll_final(ch1), OK);
  assert_int_equal(be->abort(ch), OK);
  assert_int_equal(be->abort(ch1), OK);
  abort_all(p, 3);
  be->stream_destroy(stream);
}

/* ABORT with an op stuck on a dead rank (dead = 1): the op never executes,
 * no async error appears, the shrink succeeds without the dead rank, and the
 * parent may then only be aborted (R7). */
static void test_shrink_abort_dead_rank(void **state) {
  (void)state;
  enum { N = 4 };
  ncfsm_sim_opts each[N];
  for (int r = 0; r < N; r++) test_sim_opts(&each[r]);
  each[3].dead = 1;
  void *p[N], *ch[3] = {NULL};
  raw_init_each(p, N, each, 0);
  void *stream;
  assert_int_equal(be->stream_create(0, &stream), 0);
  int32_t in[N] = {1, 2, 3, 4}, out[N] = {-7, -7, -7, -7};
  be->group_start();
  for (int r = 0; r < N; r++) {
    ncfsm__op op = {NCFSM_KIND_ALLREDUCE, &in[r], &out[r], 1, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
    assert_int_equal(be->op(p[r], &op), OK);
  }
  assert_int_equal(be->group_end(), IP);
  for (int r = 0; r < N; r++) assert_int_equal(poll_final(p[r]), OK); /* launched */
  assert_int_equal(drain(stream, 200), 1);                             /* never completes */
  for (int i = 0; i < 50; i++)
    for (int r = 0; r < 3; r++) assert_int_equal(poll1(p[r]), OK); /* no async error on the survivors */
  ncfsm__comm_config ccfg = {0, 0, &each[0], "shrunk"};
  const int ex[1] = {3};
  for (int r = 0; r < 3; r++)
    assert_int_equal(be->comm_shrink(p[r], ex, 1, &ch[r], &ccfg, NCFSM__SHRINK_ABORT), IP);
  for (int r = 0; r < 3; r++) assert_int_equal(poll_final(p[r]), OK);
  for (int r = 0; r < 3; r++) assert_int_equal(poll_final(ch[r]), OK);
  /* the terminated op: never executed, its receive buffer untouched */
  for (int r = 0; r < N; r++) assert_int_equal(out[r], -7);
  for (int r = 0; r < N; r++) assert_int_equal(stats(p[r]).executed, 0);
  /* R7: the shrunk parent only polls and aborts */
  ncfsm__op op = {NCFSM_KIND_ALLREDUCE, &in[0], &out[0], 1, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  assert_int_equal(be->op(p[0], &op), E_USAGE);
  assert_true(last_has("NCCL_SHRINK_ABORT"));
  assert_int_equal(be->destroy(p[0]), E_USAGE);
  assert_int_equal(be->finalize(p[1]), E_USAGE);
  void *again = NULL;
  assert_int_equal(be->comm_shrink(p[2], ex, 1, &again, &ccfg, NCFSM__SHRINK_ABORT), E_USAGE);
  /* the child works without the dead rank */
  void *s2;
  assert_int_equal(be->stream_create(0, &s2), 0);
  int32_t cin[3] = {5, 6, 7}, cout[3];
  allreduce_all(ch, 3, cin, cout, s2);
  for (int r = 0; r < 3; r++) assert_int_equal(cout[r], 18);
  abort_all(ch, 3);
  abort_all(p, N);
  be->stream_destroy(stream);
  be->stream_destroy(s2);
}

/* R6 then R7: a revoked parent shrinks in either mode. */
static void test_shrink_after_revoke(void **state) {
  (void)state;
  for (int mode = 0; mode < 2; mode++) {
    ncfsm_sim_opts so;
    test_sim_opts(&so);
    void *p[3], *ch[2] = {NULL, NULL};
    raw_init(p, 3, &so, 0);
    for (int r = 0; r < 3; r++) {
      assert_int_equal(be->revoke(p[r], 0), IP);
      assert_int_equal(poll_final(p[r]), OK);
    }
    ncfsm__comm_config ccfg = {0, 0, &so, "shrunk"};
    const int ex[1] = {0};
    int flags = mode ? NCFSM__SHRINK_ABORT : NCFSM__SHRINK_DEFAULT;
    for (int i = 0; i < 2; i++) assert_int_equal(be->comm_shrink(p[i + 1], ex, 1, &ch[i], &ccfg, flags), IP);
    for (int i = 0; i < 2; i++) assert_int_equal(poll_final(p[i + 1]), OK);
    for (int i = 0; i < 2; i++) assert_int_equal(poll_final(ch[i]), OK);
    void *stream;
    assert_int_equal(be->stream_create(0, &stream), 0);
    int32_t in[2] = {3, 4}, out[2];
    allreduce_all(ch, 2, in, out, stream);
    assert_int_equal(out[0], 7);
    assert_int_equal(out[1], 7);
    abort_all(ch, 2);
    abort_all(p, 3);
    be->stream_destroy(stream);
  }
}

/* NCCL 2.31.2 (pytorch#194679): after an NCCL_SHRINK_ABORT shrink, a
 * survivor that finalizes or destroys the parent hangs: commDestroySync's
 * untimed intra-node barrier waits for the excluded rank, which aborted its
 * parent. The sim modelling 2.31.2 blocks such a destroy for
 * NCFSM_SIM_WAIT_MS, then returns ncclSystemError with the comm alive (abort
 * still ends it); a nonblocking finalize stays InProgress; a blocking one
 * waits and fails alike; 2.32.3 too. Modelling 2.28.3, 2.28.9 (the default)
 * or 2.30.7, the sim refuses both at once (ncclInvalidUsage, R7). The engine
 * refuses them before the backend on every version (test_sim_shrunk_parent.c).
 * After a DEFAULT shrink the parent is destroyed at once on every version. */
static void test_shrink_abort_destroy_hang(void **state) {
  (void)state;
  setenv("NCFSM_SIM_WAIT_MS", "200", 1);
  static const struct { const char *code; int hangs; } vs[] = {
      {"22803", 0}, {"22809", 0}, {"23007", 0}, {"23102", 1}, {"23203", 1}};
  for (size_t k = 0; k < sizeof vs / sizeof vs[0]; k++) {
    const int v = vs[k].hangs;
    setenv("NCFSM_SIM_NCCL_VERSION", vs[k].code, 1);
    print_message("NCFSM_SIM_NCCL_VERSION=%s\n", vs[k].code);
    enum { N = 4 };
    ncfsm_sim_opts so;
    test_sim_opts(&so);
    void *p[N], *ch[3] = {NULL}, *b[3], *bch[2] = {NULL};
    raw_init(p, N, &so, 0);
    raw_init(b, 3, &so, 1);
    const int ex[1] = {3}, bex[1] = {2};
    ncfsm__comm_config ccfg = {0, 0, &so, "shrunk"}, bcfg = {1, 0, &so, "bshrunk"};
    assert_int_equal(be->abort(p[3]), OK); /* the excluded ranks release their parents with abort */
    assert_int_equal(be->abort(b[2]), OK);
    for (int r = 0; r < 3; r++) assert_int_equal(be->comm_shrink(p[r], ex, 1, &ch[r], &ccfg, NCFSM__SHRINK_ABORT), IP);
    for (int r = 0; r < 3; r++) assert_int_equal(poll_final(p[r]), OK);
    for (int r = 0; r < 3; r++) assert_int_equal(poll_final(ch[r]), OK);
    be->group_start(); /* blocking ranks driven by one thread: one group */
    for (int r = 0; r < 2; r++)
      assert_int_equal(be->comm_shrink(b[r], bex, 1, &bch[r], &bcfg, NCFSM__SHRINK_ABORT), OK);
    assert_int_equal(be->group_end(), OK);
    for (int r = 0; r < 2; r++) assert_non_null(bch[r]);
    uint64_t t0 = ncfsm__now_ns();
    int rc = be->destroy(p[0]);
    uint64_t waited_ms = (ncfsm__now_ns() - t0) / 1000000u;
    if (!v) {
      assert_int_equal(rc, E_USAGE);
      assert_true(last_has("only ncclCommGetAsyncError and ncclCommAbort are allowed"));
      assert_int_equal(be->finalize(p[1]), E_USAGE);
      assert_int_equal(be->finalize(b[0]), E_USAGE);
    } else {
      assert_int_equal(rc, NCFSM__NCCL_SYSTEM_ERROR);
      assert_true(waited_ms >= 200); /* it blocked for the whole wait */
      assert_true(last_has("ncclCommDestroy: rank 0: the parent of an NCCL_SHRINK_ABORT shrink did not return"));
      assert_true(last_has("since NCCL 2.31.2"));
      assert_int_equal(stats(p[0]).destroys, 1); /* still a live comm */
      assert_int_equal(poll1(p[0]), NCFSM__NCCL_SYSTEM_ERROR);
      assert_int_equal(be->finalize(p[1]), IP); /* nonblocking: InProgress for ever */
      for (int i = 0; i < 200; i++) assert_int_equal(poll1(p[1]), IP);
      t0 = ncfsm__now_ns();
      assert_int_equal(be->finalize(b[0]), NCFSM__NCCL_SYSTEM_ERROR); /* blocking: waits, then fails */
      assert_true((ncfsm__now_ns() - t0) / 1000000u >= 200);
      assert_true(last_has("ncclCommFinalize: rank 0: the parent of an NCCL_SHRINK_ABORT shrink"));
    }
    /* the children are healthy; abort ends every parent */
    void *stream;
    assert_int_equal(be->stream_create(0, &stream), 0);
    int32_t in[3] = {1, 2, 3}, out[3];
    allreduce_all(ch, 3, in, out, stream);
    for (int r = 0; r < 3; r++) assert_int_equal(out[r], 6);
    abort_all(ch, 3);
    abort_all(bch, 2);
    abort_all(p, 3);
    abort_all(b, 2);
    /* a DEFAULT shrink's parent is no NCCL_SHRINK_ABORT parent: its destroy returns */
    void *q[3], *qch[2] = {NULL};
    raw_init(q, 3, &so, 0);
    const int qex[1] = {2};
    for (int r = 0; r < 2; r++) assert_int_equal(be->comm_shrink(q[r], qex, 1, &qch[r], &ccfg, NCFSM__SHRINK_DEFAULT), IP);
    for (int r = 0; r < 2; r++) assert_int_equal(poll_final(q[r]), OK);
    for (int r = 0; r < 2; r++) assert_int_equal(poll_final(qch[r]), OK);
    for (int r = 0; r < 3; r++) assert_int_equal(be->destroy(q[r]), OK);
    abort_all(qch, 2);
    be->stream_destroy(stream);
  }
}

/* Also when a check above failed: the next tests model the default version. */
static int unset_version_env(void **state) {
  (void)state;
  unsetenv("NCFSM_SIM_NCCL_VERSION");
  unsetenv("NCFSM_SIM_WAIT_MS");
  return 0;
}

/* An excluded rank must not call it (R7): ncclInvalidArgument, and like any
 * argument error on a nonblocking comm it poisons it. */
static void test_shrink_excluded_caller(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  void *p[4], *ch = NULL;
  raw_init(p, 4, &so, 0);
  ncfsm__comm_config ccfg = {0, 0, &so, "shrunk"};
  const int ex[2] = {3, 1};
  assert_int_equal(be->comm_shrink(p[3], ex, 2, &ch, &ccfg, NCFSM__SHRINK_ABORT), E_ARG);
  assert_true(last_has("excluded ranks must not call"));
  assert_null(ch);
  assert_int_equal(poll1(p[3]), E_ARG);
  assert_int_equal(stats(p[3]).rejected, 1);
  assert_int_equal(stats(p[3]).shrinks, 1);
  /* survivors passing different exclude lists: the shrink fails on them */
  void *c0 = NULL, *c2 = NULL;
  const int ex0[2] = {1, 3}, ex2[1] = {3};
  assert_int_equal(be->comm_shrink(p[0], ex0, 2, &c0, &ccfg, NCFSM__SHRINK_DEFAULT), IP);
  assert_int_equal(be->comm_shrink(p[2], ex2, 1, &c2, &ccfg, NCFSM__SHRINK_DEFAULT), IP);
  assert_int_equal(be->comm_shrink(p[1], ex2, 1, &ch, &ccfg, NCFSM__SHRINK_DEFAULT), IP);
  assert_int_equal(poll_final(p[0]), E_ARG);
  assert_true(last_has("different exclude lists"));
  assert_null(c0);
  abort_all(p, 4);
}

/* ---- grow ---------------------------------------------------------------------------- */

static void test_grow_refused_without_has_grow(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  assert_int_equal(so.has_grow, 0); /* the default models 2.28.9 */
  assert_false(be->features() & NCFSM__HAS_GROW);
  assert_true(be->features() & NCFSM__HAS_SHRINK);
  assert_true(be->features() & NCFSM__HAS_SPLIT);
  void *p[2], *ch = NULL;
  raw_init(p, 2, &so, 0);
  assert_false(be->comm_features(p[0]) & NCFSM__HAS_GROW);
  ncfsm_unique_id id;
  memset(&id, 0, sizeof id);
  assert_int_equal(be->comm_get_unique_id(p[0], &id), E_USAGE);
  assert_true(last_has("ncclCommGrow needs NCCL 2.29"));
  ncfsm__comm_config ccfg = {0, 0, &so, "grown"};
  assert_int_equal(be->comm_grow(p[1], 3, NULL, -1, &ch, &ccfg), E_USAGE);
  assert_true(last_has("ncclCommGrow needs NCCL 2.29"));
  assert_int_equal(poll1(p[1]), OK); /* not poisoned */
  assert_int_equal(be->comm_grow(NULL, 3, &id, 2, &ch, &ccfg), E_USAGE); /* a joiner alike */
  assert_null(ch);
  abort_all(p, 2);
}

/* 2 existing ranks + 1 joiner; an AllReduce on the grown comm; the id is single-use. */
static void test_grow(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  so.has_grow = 1;
  so.split_polls = 2;
  void *p[2], *g[3] = {NULL, NULL, NULL};
  raw_init(p, 2, &so, 0);
  assert_true(be->comm_features(p[0]) & NCFSM__HAS_GROW);
  ncfsm_unique_id id;
  assert_int_equal(be->comm_get_unique_id(p[0], &id), OK);
  ncfsm__comm_config ccfg = {0, 0, &so, "grown"};
  /* argument checks */
  assert_int_equal(be->comm_grow(p[1], 2, NULL, -1, &g[1], &ccfg), E_ARG); /* not larger */
  abort_all(p, 2);
  raw_init(p, 2, &so, 0);
  assert_int_equal(be->comm_get_unique_id(p[0], &id), OK);
  assert_int_equal(be->comm_grow(p[0], 3, &id, -1, &g[0], &ccfg), IP);
  assert_int_equal(be->comm_grow(p[1], 3, NULL, -1, &g[1], &ccfg), IP);
  assert_null(g[0]);
  assert_null(g[1]);
  assert_int_equal(be->comm_grow(NULL, 3, &id, 1, &g[2], &ccfg), E_ARG); /* joiners are 2..2 */
  assert_int_equal(be->comm_grow(NULL, 3, &id, 2, &g[2], &ccfg), IP);    /* like an init: handle now */
  assert_non_null(g[2]);
  for (int i = 0; i < so.split_polls; i++)
    for (int r = 0; r < 2; r++) assert_int_equal(poll1(p[r]), IP);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(poll1(p[r]), OK);
    assert_non_null(g[r]);
  }
  for (int r = 0; r < 3; r++) assert_int_equal(poll_final(g[r]), OK);
  for (int r = 0; r < 3; r++) {
    int rk, sz;
    assert_int_equal(be->comm_rank_size(g[r], &rk, &sz), OK);
    assert_int_equal(rk, r); /* existing ranks keep theirs */
    assert_int_equal(sz, 3);
    assert_int_equal(stats(g[r]).grows, r == 2 ? 1 : 0);
  }
  assert_int_equal(stats(p[0]).grows, 1);
  void *stream;
  assert_int_equal(be->stream_create(0, &stream), 0);
  int32_t in[3] = {1, 20, 300}, out[3];
  allreduce_all(g, 3, in, out, stream);
  for (int r = 0; r < 3; r++) assert_int_equal(out[r], 321);
  /* single-use: the same id again, from the existing side and from a joiner */
  void *again = NULL;
  assert_int_equal(be->comm_grow(p[0], 3, &id, -1, &again, &ccfg), E_ARG);
  assert_true(last_has("single-use"));
  assert_int_equal(be->comm_grow(NULL, 3, &id, 2, &again, &ccfg), E_ARG);
  assert_true(last_has("single-use"));
  assert_null(again);
  abort_all(g, 3);
  /* ...also once the grown clique is gone from this process */
  assert_int_equal(be->comm_grow(NULL, 3, &id, 2, &again, &ccfg), E_ARG);
  assert_true(last_has("single-use"));
  /* an id from another clique */
  void *q[2];
  raw_init(q, 2, &so, 0);
  ncfsm_unique_id other;
  assert_int_equal(be->comm_get_unique_id(q[0], &other), OK);
  assert_int_equal(be->comm_grow(p[1], 3, &other, -1, &again, &ccfg), E_ARG);
  abort_all(q, 2);
  abort_all(p, 2);
  be->stream_destroy(stream);
}

/* ---- dead ranks ------------------------------------------------------------------------ */

/* dead = 1: its ops never reach its peers, no error anywhere, and a split
 * that needs it never completes (no child is written). */
static void test_dead_rank_split_hangs(void **state) {
  (void)state;
  ncfsm_sim_opts each[2];
  test_sim_opts(&each[0]);
  test_sim_opts(&each[1]);
  each[1].dead = 1;
  void *p[2], *ch[2] = {NULL, NULL};
  raw_init_each(p, 2, each, 0);
  ncfsm__comm_config ccfg = {0, 0, &each[0], "child"};
  assert_int_equal(be->comm_split(p[0], 0, 0, &ch[0], &ccfg), IP);
  assert_int_equal(be->comm_split(p[1], 0, 0, &ch[1], &ccfg), IP);
  for (int i = 0; i < 200; i++) {
    assert_int_equal(poll1(p[0]), IP);
    assert_int_equal(poll1(p[1]), IP);
  }
  assert_null(ch[0]);
  assert_null(ch[1]);
  abort_all(p, 2);
}

/* ---- a process killed with SIGKILL; the survivors shrink ----------------------------------- */

#define CHECK(cond)                                                                                  \
  do {                                                                                               \
    if (!(cond)) {                                                                                   \
      fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed; sim: %s\n", rank, __FILE__, __LINE__, #cond, \
              be->last_error(NULL));                                                                 \
      return 1;                                                                                      \
    }                                                                                                \
  } while (0)

static ncfsm_unique_id g_id;

static int wait_poll(void *c, int want, int ms) {
  int st = IP;
  for (int i = 0; i < ms; i++) {
    be->get_async_error(c, &st);
    if (st != IP && (want < 0 || st == want)) return st;
    if (st != IP && st != OK) return st;
    test_sleep_ms(1);
  }
  return st;
}

static int mp_rank(int rank) {
  enum { N = 4 };
  ncfsm_sim_opts so;
  test_sim_opts(&so);
  ncfsm__comm_config cfg = {0, 0, &so, "mp"};
  void *c = NULL, *stream = NULL;
  CHECK(be->comm_init(&c, N, &g_id, rank, &cfg) == IP);
  CHECK(wait_poll(c, OK, 10000) == OK);
  CHECK(be->stream_create(0, &stream) == 0);
  int32_t a = rank + 1, ra = 0;
  ncfsm__op op = {NCFSM_KIND_ALLREDUCE, &a, &ra, 1, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  CHECK(be->op(c, &op) == IP);
  CHECK(wait_poll(c, OK, 10000) == OK);
  void *ev;
  CHECK(be->event_create(0, &ev) == 0 && be->event_record(ev, stream) == 0);
  int q = 1;
  for (int i = 0; i < 10000 && q == 1; i++) {
    q = be->event_query(ev);
    if (q == 1) test_sleep_ms(1);
  }
  be->event_destroy(ev);
  CHECK(q == 0 && ra == 10);
  if (rank == 3) raise(SIGKILL);
  /* the survivors' next AllReduce needs the dead rank: the sim reports the
   * dead peer process (ncclRemoteError; docs/sim.md "Processes") */
  CHECK(be->op(c, &op) == IP);
  CHECK(wait_poll(c, E_REMOTE, 10000) == E_REMOTE);
  /* recovery: shrink with NCCL_SHRINK_ABORT, excluding the dead rank */
  void *child = NULL;
  const int ex[1] = {3};
  CHECK(be->comm_shrink(c, ex, 1, &child, &cfg, NCFSM__SHRINK_ABORT) == IP);
  CHECK(child == NULL);
  CHECK(wait_poll(c, OK, 10000) == OK);
  CHECK(child != NULL);
  CHECK(wait_poll(child, OK, 10000) == OK);
  int rk = -1, sz = -1;
  CHECK(be->comm_rank_size(child, &rk, &sz) == OK && rk == rank && sz == 3);
  int32_t b = (rank + 1) * 100, rb = 0;
  ncfsm__op op2 = {NCFSM_KIND_ALLREDUCE, &b, &rb, 1, NCFSM_INT32, NCFSM_OP_SUM, -1, -1, stream};
  CHECK(be->op(child, &op2) == IP);
  CHECK(wait_poll(child, OK, 10000) == OK);
  CHECK(be->event_create(0, &ev) == 0 && be->event_record(ev, stream) == 0);
  q = 1;
  for (int i = 0; i < 10000 && q == 1; i++) {
    q = be->event_query(ev);
    if (q == 1) test_sleep_ms(1);
  }
  be->event_destroy(ev);
  CHECK(q == 0 && rb == 600);
  CHECK(be->abort(child) == OK);
  CHECK(be->abort(c) == OK); /* R7: the shrunk parent is aborted */
  be->stream_destroy(stream);
  return 0;
}

/* Creator pid of a sim segment (0 when unreadable). */
static int segment_creator(const char *name) {
  char path[300];
  snprintf(path, sizeof path, "/%s", name);
  int fd = shm_open(path, O_RDONLY, 0);
  if (fd < 0) return 0;
  int pid = 0;
  /* another process's segment may be just created, not sized yet: reading
   * past its end would be a SIGBUS (seen with tests running side by side) */
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(shm_hdr)) {
    close(fd);
    return 0;
  }
  shm_hdr *h = mmap(NULL, sizeof *h, PROT_READ, MAP_SHARED, fd, 0);
  if (h != MAP_FAILED) {
    pid = h->creator_pid;
    munmap(h, sizeof *h);
  }
  close(fd);
  return pid;
}

static void test_mp_sigkill_shrink(void **state) {
  (void)state;
  enum { N = 4 };
  assert_int_equal(be->get_unique_id(&g_id), 0);
  fflush(NULL);
  pid_t pid[N];
  for (int r = 0; r < N; r++) {
    pid[r] = fork();
    assert_true(pid[r] >= 0);
    if (pid[r] == 0) {
      alarm(30);
      int rc = mp_rank(r);
      fflush(NULL);
      _exit(rc ? 1 : 0);
    }
  }
  int status[N], left = N;
  for (int r = 0; r < N; r++) status[r] = -1;
  for (int t = 0; left && t < 20000; t++) {
    for (int r = 0; r < N; r++)
      if (status[r] == -1) {
        if (waitpid(pid[r], &status[r], WNOHANG) == pid[r]) left--;
        else status[r] = -1;
      }
    if (left) test_sleep_ms(1);
  }
  for (int r = 0; r < N; r++)
    if (status[r] == -1) {
      kill(pid[r], SIGKILL);
      waitpid(pid[r], &status[r], 0);
      fail_msg("rank %d hung", r);
    }
  assert_true(WIFSIGNALED(status[3]) && WTERMSIG(status[3]) == SIGKILL);
  for (int r = 0; r < 3; r++)
    if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0) fail_msg("rank %d failed (0x%x)", r, status[r]);
  /* nothing of the ranks' cliques (the parent's, the shrunk child's) is left in /dev/shm */
  DIR *d = opendir("/dev/shm");
  assert_non_null(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, SIM_SHM_PREFIX, strlen(SIM_SHM_PREFIX))) continue;
    int creator = segment_creator(e->d_name);
    for (int r = 0; r < N; r++)
      if (creator == pid[r]) fail_msg("segment %s of rank %d's process was left behind", e->d_name, r);
  }
  closedir(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split_colors_keys),
      cmocka_unit_test(test_split_implicit_group),
      cmocka_unit_test(test_split_blocking),
      cmocka_unit_test(test_split_refused),
      cmocka_unit_test(test_shrink_default),
      cmocka_unit_test(test_shrink_default_refused),
      cmocka_unit_test(test_shrink_abort_dead_rank),
      cmocka_unit_test(test_shrink_after_revoke),
      cmocka_unit_test(test_shrink_excluded_caller),
      cmocka_unit_test_teardown(test_shrink_abort_destroy_hang, unset_version_env),
      cmocka_unit_test(test_grow_refused_without_has_grow),
      cmocka_unit_test(test_grow),
      cmocka_unit_test(test_dead_rank_split_hangs),
      cmocka_unit_test(test_mp_sigkill_shrink),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
