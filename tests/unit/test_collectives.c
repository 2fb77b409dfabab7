/* Every collective and Send/Recv through the engine on 4 sim ranks driven by
 * one thread, with full-buffer checks, for several dtypes and redops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

#define N 4
#define COUNT 6

typedef struct {
  ncfsm_loop *loop;
  ncfsm_comm *c[N];
} world;

static int setup(void **state) {
  world *w = calloc(1, sizeof *w);
  assert_int_equal(ncfsm_loop_new(NULL, &w->loop), NCFSM_OK);
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  make_comms(w->loop, N, &o, w->c, 0);
  for (int r = 0; r < N; r++) assert_int_equal(ncfsm_comm_wait_state(w->c[r], NCFSM_STATE_READY, 5000), NCFSM_OK);
  *state = w;
  return 0;
}

static int teardown(void **state) {
  world *w = *state;
  for (int r = 0; r < N; r++) assert_int_equal(ncfsm_comm_finalize(w->c[r]), NCFSM_OK);
  for (int r = 0; r < N; r++)
    assert_int_equal(ncfsm_comm_wait_state(w->c[r], NCFSM_STATE_FINALIZED, 5000), NCFSM_OK);
  for (int r = 0; r < N; r++) assert_int_equal(ncfsm_comm_destroy(w->c[r]), NCFSM_OK);
  teardown_all(w->loop, w->c, N);
  free(w);
  return 0;
}

static double in_val(int rank, int i) { return (double)(rank + 1) * 10 + i; }

static void run(world *w) { assert_int_equal(ncfsm_loop_run(w->loop, NCFSM_RUN_DEFAULT), NCFSM_OK); }

static void test_allreduce_ops(void **state) {
  world *w = *state;
  ncfsm_redop_t ops[] = {NCFSM_OP_SUM, NCFSM_OP_PROD, NCFSM_OP_MAX, NCFSM_OP_MIN, NCFSM_OP_AVG};
  for (size_t k = 0; k < 5; k++) {
    double send[N][COUNT], recv[N][COUNT];
    for (int r = 0; r < N; r++)
      for (int i = 0; i < COUNT; i++) send[r][i] = in_val(r, i);
    assert_int_equal(ncfsm_group_start(w->loop), NCFSM_OK);
    for (int r = 0; r < N; r++)
      assert_int_equal(ncfsm_allreduce(w->c[r], send[r], recv[r], COUNT, NCFSM_FLOAT64, ops[k], NULL, NULL, NULL, NULL), NCFSM_OK);
    assert_int_equal(ncfsm_group_end(w->loop), NCFSM_OK);
    run(w);
    for (int i = 0; i < COUNT; i++) {
      double e = ops[k] == NCFSM_OP_PROD ? 1 : ops[k] == NCFSM_OP_MAX ? -1e300 : ops[k] == NCFSM_OP_MIN ? 1e300 : 0;
      for (int r = 0; r < N; r++) {
        double v = in_val(r, i);
        if (ops[k] == NCFSM_OP_SUM || ops[k] == NCFSM_OP_AVG) e += v;
        else if (ops[k] == NCFSM_OP_PROD) e *= v;
        else if (ops[k] == NCFSM_OP_MAX) e = v > e ? v : e;
        else e = v < e ? v : e;
      }
      if (ops[k] == NCFSM_OP_AVG) e /= N;
      for (int r = 0; r < N; r++) assert_float_equal(recv[r][i], e, 1e-9);
    }
  }
}

static void test_dtypes_sum(void **state) {
  world *w = *state;
  ncfsm_dtype_t dts[] = {NCFSM_INT8, NCFSM_UINT8, NCFSM_INT32, NCFSM_UINT32, NCFSM_INT64,
                         NCFSM_UINT64, NCFSM_FLOAT16, NCFSM_FLOAT32, NCFSM_FLOAT64, NCFSM_BFLOAT16};
  for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
    size_t es = ncfsm_dtype_size(dts[k]);
    unsigned char send[N][COUNT * 8], recv[N][COUNT * 8];
    memset(send, 0, sizeof send);
    for (int r = 0; r < N; r++)
      for (int i = 0; i < COUNT; i++) {
        int v = r + i; /* small: exact in every type */
        unsigned char *p = send[r] + (size_t)i * es;
        switch (dts[k]) {
          case NCFSM_INT8: case NCFSM_UINT8: *p = (unsigned char)v; break;
          case NCFSM_INT32: case NCFSM_UINT32: { int32_t x = v; memcpy(p, &x, 4); } break;
          case NCFSM_INT64: case NCFSM_UINT64: { int64_t x = v; memcpy(p, &x, 8); } break;
          case NCFSM_FLOAT32: { float x = (float)v; memcpy(p, &x, 4); } break;
          case NCFSM_FLOAT64: { double x = v; memcpy(p, &x, 8); } break;
          case NCFSM_FLOAT16: { /* exact small integers in IEEE half */
            uint16_t h = v == 0 ? 0 : 0;
            float f = (float)v; uint32_t u; memcpy(&u, &f, 4);
            if (v) h = (uint16_t)(((u >> 16) & 0x8000) | ((((u >> 23) & 0xff) - 127 + 15) << 10) | ((u >> 13) & 0x3ff));
            memcpy(p, &h, 2); } break;
          case NCFSM_BFLOAT16: { float f = (float)v; uint32_t u; memcpy(&u, &f, 4); uint16_t h = (uint16_t)(u >> 16); memcpy(p, &h, 2); } break;
          default: break;
        }
      }
    assert_int_equal(ncfsm_group_start(w->loop), NCFSM_OK);
    for (int r = 0; r < N; r++)
      assert_int_equal(ncfsm_allreduce(w->c[r], send[r], recv[r], COUNT, dts[k], NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
    assert_int_equal(ncfsm_group_end(w->loop), NCFSM_OK);
    run(w);
    for (int i = 0; i < COUNT; i++) {
      double e = 0;
      for (int r = 0; r < N; r++) e += r + i;
      for (int r = 0; r < N; r++) {
        unsigned char *p = recv[r] + (size_t)i * es;
        double got = 0;
        switch (dts[k]) {
          case NCFSM_INT8: got = (int8_t)*p; break;
          case NCFSM_UINT8: got = *p; break;
          case NCFSM_INT32: { int32_t x; memcpy(&x, p, 4); got = x; } break;
          case NCFSM_UINT32: { uint32_t x; memcpy(&x, p, 4); got = x; } break;
          case NCFSM_INT64: { int64_t x; memcpy(&x, p, 8); got = (double)x; } break;
          case NCFSM_UINT64: { uint64_t x; memcpy(&x, p, 8); got = (double)x; } break;
          case NCFSM_FLOAT32: { float x; memcpy(&x, p, 4); got = x; } break;
          case NCFSM_FLOAT64: { double x; memcpy(&x, p, 8); got = x; } break;
          case NCFSM_FLOAT16: { uint16_t h; memcpy(&h, p, 2);
            int ex = (h >> 10) & 0x1f, m = h & 0x3ff;
            got = ex ? ldexp(1.0 + m / 1024.0, ex - 15) : ldexp(m / 1024.0, -14); } break;
          case NCFSM_BFLOAT16: { uint16_t h; memcpy(&h, p, 2); uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); got = f; } break;
          default: break;
        }
        if (got != e) fail_msg("%s element %d rank %d: got %g want %g", ncfsm_dtype_name(dts[k]), i, r, got, e);
      }
    }
  }
}

static void test_rooted_and_gathers(void **state) {
  world *w = *state;
  int32_t send[N][N * COUNT], recv[N][N * COUNT];
  const int root = 2;
  /* Broadcast */
  for (int r = 0; r < N; r++)
    for (int i = 0; i < COUNT; i++) { send[r][i] = (int32_t)in_val(r, i); recv[r][i] = -1; }
  assert_int_equal(ncfsm_group_start(w->loop), NCFSM_OK);
  for (int r = 0; r < N; r++)
    assert_int_equal(ncfsm_broadcast(w->c[r], send[r], recv[r], COUNT, NCFSM_INT32, root, NULL, NULL, NULL, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(w->loop), NCFSM_OK);
  run(w);
  for (int r = 0; r < N; r++)
    for (int i = 0; i < COUNT; i++) assert_int_equal(recv[r][i], (int32_t)in_val(root, i));
  /* Reduce (SUM to root) */
  for (int r = 0; r < N; r++)
    for (int i = 0; i < COUNT; i++) recv[r][i] = -1;
  assert_int_equal(ncfsm_group_start(w->loop), NCFSM_OK);
  for (int r = 0; r < N; r++)
    assert_int_equal(ncfsm_reduce(w->c[r], send[r], recv[r], COUNT, NCFSM_INT32, NCFSM_OP_SUM, root, NULL, NULL, NULL, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(w->loop), NCFSM_OK);
  run(w);
  for (int i = 0; i < COUNT; i++) {
    int32_t e = 0;
    for (int r = 0; r < N; r++) e += (int32_t)in_val(r, i);
    assert_int_equal(recv[root][i], e);
  }
  /* AllGather */
  assert_int_equal(ncfsm_group_start(w->loop), NCFSM_OK);
  for (int r = 0; r < N; r++)
    assert_int_equal(ncfsm_allgather(w->c[r], send[r], recv[r], COUNT, NCFSM_INT32, NULL, NULL, NULL, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(w->loop), NCFSM_OK);
  run(w);
  for (int r = 0; r < N; r++)
    for (int q = 0; q < N; q++)
      for (int i = 0; i < COUNT; i++) assert_int_equal(recv[r][q * COUNT + i], (int32_t)in_val(q, i));
  /* ReduceScatter: send holds N*COUNT, recv COUNT */
  for (int r = 0; r < N; r++)
    for (int i = 0; i < N * COUNT; i++) send[r][i] = r * 1000 + i;
  assert_int_equal(ncfsm_group_start(w->loop), NCFSM_OK);
  for (int r = 0; r < N; r++)
    assert_int_equal(ncfsm_reducescatter(w->c[r], send[r], recv[r], COUNT, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(w->loop), NCFSM_OK);
  run(w);
  for (int r = 0; r < N; r++)
    for (int i = 0; i < COUNT; i++) {
      int32_t e = 0;
      for (int q = 0; q < N; q++) e += q * 1000 + r * COUNT + i;
      assert_int_equal(recv[r][i], e);
    }
  /* AlltoAll: block q of rank r goes to rank q's block r */
  assert_int_equal(ncfsm_group_start(w->loop), NCFSM_OK);
  for (int r = 0; r < N; r++)
    assert_int_equal(ncfsm_alltoall(w->c[r], send[r], recv[r], COUNT, NCFSM_INT32, NULL, NULL, NULL, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(w->loop), NCFSM_OK);
  run(w);
  for (int r = 0; r < N; r++)
    for (int q = 0; q < N; q++)
      for (int i = 0; i < COUNT; i++) assert_int_equal(recv[r][q * COUNT + i], q * 1000 + r * COUNT + i);
  /* Gather to root */
  memset(recv, 0, sizeof recv);
  assert_int_equal(ncfsm_group_start(w->loop), NCFSM_OK);
  for (int r = 0; r < N; r++)
    assert_int_equal(ncfsm_gather(w->c[r], send[r], recv[r], COUNT, NCFSM_INT32, root, NULL, NULL, NULL, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(w->loop), NCFSM_OK);
  run(w);
  for (int q = 0; q < N; q++)
    for (int i = 0; i < COUNT; i++) assert_int_equal(recv[root][q * COUNT + i], q * 1000 + i);
  /* Scatter from root */
  assert_int_equal(ncfsm_group_start(w->loop), NCFSM_OK);
  for (int r = 0; r < N; r++)
    assert_int_equal(ncfsm_scatter(w->c[r], send[r], recv[r], COUNT, NCFSM_INT32, root, NULL, NULL, NULL, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_group_end(w->loop), NCFSM_OK);
  run(w);
  for (int r = 0; r < N; r++)
    for (int i = 0; i < COUNT; i++) assert_int_equal(recv[r][i], root * 1000 + r * COUNT + i);
}

/* Ring exchange with Send/Recv in one group (the seed's P2P pattern). */
static void test_send_recv_ring(void **state) {
  world *w = *state;
  int32_t send[N][COUNT], recv[N][COUNT];
  for (int r = 0; r < N; r++)
    for (int i = 0; i < COUNT; i++) { send[r][i] = r * 100 + i; recv[r][i] = -1; }
  assert_int_equal(ncfsm_group_start(w->loop), NCFSM_OK);
  for (int r = 0; r < N; r++) {
    assert_int_equal(ncfsm_send(w->c[r], send[r], COUNT, NCFSM_INT32, (r + 1) % N, NULL, NULL, NULL, NULL), NCFSM_OK);
    assert_int_equal(ncfsm_recv(w->c[r], recv[r], COUNT, NCFSM_INT32, (r + N - 1) % N, NULL, NULL, NULL, NULL), NCFSM_OK);
  }
  assert_int_equal(ncfsm_group_end(w->loop), NCFSM_OK);
  run(w);
  for (int r = 0; r < N; r++)
    for (int i = 0; i < COUNT; i++) assert_int_equal(recv[r][i], ((r + N - 1) % N) * 100 + i);
  /* Fingerprints agree across ranks for the same sequence of collectives. */
  /* The rolling hash covers collectives only (R11); P2P fingerprints are pairwise. */
  uint64_t h0, h;
  assert_int_equal(ncfsm_comm_position(w->c[0], NULL, &h0), NCFSM_OK);
  for (int r = 1; r < N; r++) {
    assert_int_equal(ncfsm_comm_position(w->c[r], NULL, &h), NCFSM_OK);
    assert_true(h == h0);
  }
  /* an invalid handle writes nothing and says so */
  h = 7;
  assert_int_equal(ncfsm_comm_position(NULL, &h, &h), NCFSM_ERR_INVALID_ARGUMENT);
  assert_true(h == 7);
}

/* Ungrouped ops from one thread across ranks: the loop coalesces what was
 * submitted in one turn into one backend group, so one thread can drive
 * several ranks without explicit groups; order per comm is kept. */
static void test_coalesced_stream(void **state) {
  world *w = *state;
  static int32_t bufs[N][64][4];
  for (int r = 0; r < N; r++)
    for (int k = 0; k < 64; k++)
      for (int i = 0; i < 4; i++) bufs[r][k][i] = 1;
  for (int k = 0; k < 64; k++)
    for (int r = 0; r < N; r++)
      assert_int_equal(ncfsm_allreduce(w->c[r], bufs[r][k], bufs[r][k], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL), NCFSM_OK);
  run(w);
  for (int r = 0; r < N; r++)
    for (int k = 0; k < 64; k++) assert_int_equal(bufs[r][k][0], N);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_allreduce_ops, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dtypes_sum, setup, teardown),
      cmocka_unit_test_setup_teardown(test_rooted_and_gathers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_send_recv_ring, setup, teardown),
      cmocka_unit_test_setup_teardown(test_coalesced_stream, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
