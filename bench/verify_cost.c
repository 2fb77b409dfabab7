/*
 * bench/verify_cost: what cross-rank verification costs (issue 9, item 7;
 * docs/ordering.md "Verification", docs/benchmarks.md).
 *
 *   mpirun -np 2 $NCFSM_MPI_ENV build/bench/verify_cost [options]
 *
 *   --iters N        8-byte round trips per variant and round (default 500)
 *   --rounds R       interleaved rounds (default 3)
 *   --stream-ops N   ops of the small-op stream per round (default 5000)
 *   --port P         the three TCP stores hosted by rank 0 listen on 127.0.0.1:P, P+1 and P+2
 *                    (default 29650)
 *   --stores A1,A2,A3 use three running stores (ncfsm-store, token NCFSM_STORE_TOKEN) instead
 *   --quick          tiny counts, for a smoke test
 *
 * One process per rank (mpirun: the main bootstrap is PMIx; or the TCP store
 * from the environment). Every variant is its own communicator, alive for
 * the whole run, measured in interleaved rounds so that ratios share the
 * machine's state:
 *   off          verification off
 *   strict_boot  strict, exchanging through the main bootstrap (PMIx under mpirun)
 *   strict_tcp   strict, exchanging through a TCP store (rank 0 hosts it on port P)
 *   async_tcp    async, window 64, through a TCP store on port P+1
 *   strict_nccl  strict, exchanging through an AllGather on a companion NCCL communicator
 *                (opts.verify_channel NCCL; its unique id goes through a TCP store on port P+2)
 * Round trip: ncfsm_allreduce of 8 bytes + ncfsm_work_wait (this thread
 * drives the loop). Stream: N 8-byte AllReduces submitted back to back, then
 * the loop runs until every callback came; ops/s. Rank 0 prints Markdown and
 * "KV key value" lines (bench/run_gpu_bench.sh adds torch with and without
 * TORCH_DISTRIBUTED_DEBUG=DETAIL and the goals).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ncfsm.h"
#include "ncfsm/bootstrap.h"

#define CHECK(call)                                                                          \
  do {                                                                                       \
    ncfsm_result_t r_ = (call);                                                              \
    if (r_ != NCFSM_OK) {                                                                    \
      fprintf(stderr, "verify_cost: %s:%d %s -> %s\n", __FILE__, __LINE__, #call,            \
              ncfsm_err_name(r_));                                                           \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

enum { V_OFF, V_STRICT_BOOT, V_STRICT_TCP, V_ASYNC_TCP, V_STRICT_NCCL, NV };
static const char *const vname[NV] = {"off", "strict_boot", "strict_tcp", "async_tcp", "strict_nccl"};

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p) {
  int k = (int)(p / 100.0 * n + 0.999999);
  if (k < 1) k = 1;
  if (k > n) k = n;
  return v[k - 1];
}

static int ndone;
static ncfsm_result_t first_bad;
static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  (void)arg;
  ndone++;
  if (st != NCFSM_OK && first_bad == NCFSM_OK) first_bad = st;
}

static ncfsm_boot *open_tcp(ncfsm_loop *loop, int rank, int size, int port, const char *given) {
  char addr[128];
  if (given) snprintf(addr, sizeof addr, "%s", given);
  else snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  bo.kind = NCFSM_BOOT_TCP;
  bo.store_addr = addr;
  bo.rank = rank;
  bo.size = size;
  bo.host_store = !given && rank == 0;
  if (!given) bo.token = "verify-cost";
  ncfsm_boot *b = NULL;
  if (ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &b) != NCFSM_OK) {
    fprintf(stderr, "verify_cost: rank %d: TCP store on %s: %s\n", rank, addr, ncfsm_boot_open_error());
    exit(1);
  }
  return b;
}

int main(int argc, char **argv) {
  int iters = 500, rounds = 3, stream_ops = 5000, port = 29650;
  char *stores[3] = {NULL, NULL, NULL};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--stream-ops") && i + 1 < argc) stream_ops = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--port") && i + 1 < argc) port = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--stores") && i + 1 < argc && strchr(argv[i + 1], ',') &&
             strchr(strchr(argv[i + 1], ',') + 1, ',')) {
      stores[0] = argv[++i];
      stores[1] = strchr(stores[0], ',') + 1;
      stores[1][-1] = 0;
      stores[2] = strchr(stores[1], ',') + 1;
      stores[2][-1] = 0;
    }
    else if (!strcmp(argv[i], "--quick")) iters = 20, rounds = 2, stream_ops = 200;
    else {
      fprintf(stderr, "usage: %s [--iters N] [--rounds R] [--stream-ops N] [--port P | --stores A1,A2,A3] "
                      "[--quick]\n", argv[0]);
      return 2;
    }
  }
  if (iters < 1 || rounds < 1 || stream_ops < 1 || port < 1 || port > 65533) {
    fprintf(stderr, "verify_cost: counts must be positive and the port in 1..65533\n");
    return 2;
  }
  ncfsm_loop *loop;
  CHECK(ncfsm_loop_new(NULL, &loop));
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  ncfsm_boot *boot;
  if (ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &boot) != NCFSM_OK) {
    fprintf(stderr, "verify_cost: bootstrap: %s (run under mpirun or with NCFSM_STORE_ADDR)\n",
            ncfsm_boot_open_error());
    return 1;
  }
  int rank = ncfsm_boot_rank(boot), size = ncfsm_boot_size(boot);
  if (size < 2) {
    fprintf(stderr, "verify_cost: needs 2 or more ranks\n");
    return 1;
  }
  ncfsm_boot *tcp1 = open_tcp(loop, rank, size, port, stores[0]);
  ncfsm_boot *tcp2 = open_tcp(loop, rank, size, port + 1, stores[1]);
  ncfsm_boot *tcp3 = open_tcp(loop, rank, size, port + 2, stores[2]);
  ncfsm_backend_info bi;
  CHECK(ncfsm_backend_query(NCFSM_BACKEND_AUTO, &bi));

  ncfsm_comm *c[NV];
  ncfsm_boot *boots[NV] = {boot, boot, tcp1, tcp2, tcp3};
  ncfsm_verify_mode_t modes[NV] = {NCFSM_VERIFY_OFF, NCFSM_VERIFY_STRICT, NCFSM_VERIFY_STRICT, NCFSM_VERIFY_ASYNC,
                                   NCFSM_VERIFY_STRICT};
  void *buf[NV];
  /* One after the other: the main bootstrap carries off's and strict_boot's
   * unique id exchanges, in this order on every rank, then strict_boot's
   * verification only. */
  for (int v = 0; v < NV; v++) {
    ncfsm_comm_opts o;
    ncfsm_comm_opts_init(&o);
    o.name = vname[v];
    o.device = bi.kind == NCFSM_BACKEND_NCCL ? ncfsm_boot_local_rank(boot) : 0;
    o.verify = modes[v];
    o.verify_window = 64;
    o.verify_channel = v == V_STRICT_NCCL ? NCFSM_VERIFY_CHANNEL_NCCL : NCFSM_VERIFY_CHANNEL_BOOTSTRAP;
    o.verify_stall_ms = 30000;
    o.dump_dir = "";
    CHECK(ncfsm_comm_new(loop, &o, &c[v]));
    CHECK(ncfsm_comm_init_boot(c[v], boots[v]));
    if (ncfsm_comm_wait_state(c[v], NCFSM_STATE_READY, 120000) != NCFSM_OK) {
      fprintf(stderr, "verify_cost: rank %d: %s did not reach READY: %s\n", rank, vname[v], ncfsm_comm_failure(c[v]));
      return 1;
    }
    CHECK(ncfsm_mem_alloc(c[v], 8, &buf[v]));
  }
  /* warm-up */
  for (int v = 0; v < NV; v++)
    for (int k = 0; k < 100; k++) {
      ncfsm_work *w;
      CHECK(ncfsm_allreduce(c[v], buf[v], buf[v], 2, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w));
      CHECK(ncfsm_work_wait(w, 0));
      CHECK(ncfsm_work_release(w));
    }

  /* round trip */
  double *rt[NV];
  for (int v = 0; v < NV; v++)
    if (!(rt[v] = malloc(sizeof(double) * (size_t)iters * (size_t)rounds))) return 1;
  for (int r = 0; r < rounds; r++)
    for (int v = 0; v < NV; v++)
      for (int k = 0; k < iters; k++) {
        ncfsm_work *w;
        double t = now_us();
        CHECK(ncfsm_allreduce(c[v], buf[v], buf[v], 2, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w));
        CHECK(ncfsm_work_wait(w, 0));
        rt[v][r * iters + k] = now_us() - t;
        CHECK(ncfsm_work_release(w));
      }

  /* small-op stream: off and async */
  int sv[2] = {V_OFF, V_ASYNC_TCP};
  double sops[2][16];
  int srounds = rounds < 16 ? rounds : 16;
  for (int r = 0; r < srounds; r++)
    for (int i = 0; i < 2; i++) {
      int v = sv[i];
      ndone = 0;
      double t = now_us();
      for (int k = 0; k < stream_ops; k++)
        CHECK(ncfsm_allreduce(c[v], buf[v], buf[v], 2, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_done, NULL, NULL));
      while (ndone < stream_ops) CHECK(ncfsm_loop_run(loop, NCFSM_RUN_ONCE));
      sops[i][r] = stream_ops / ((now_us() - t) / 1e6);
    }
  if (first_bad != NCFSM_OK) {
    fprintf(stderr, "verify_cost: rank %d: a stream op failed: %s\n", rank, ncfsm_err_name(first_bad));
    return 1;
  }
  /* let async's last windows finish on every rank */
  CHECK(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT));

  if (rank == 0) {
    int ver = bi.nccl_version;
    printf("# verify_cost: %d ranks, backend %s, NCCL %d.%d.%d%s, main bootstrap %s\n\n", size, bi.name,
           ver / 10000, ver / 100 % 100, ver % 100, bi.kind == NCFSM_BACKEND_SIM ? " (modelled)" : "",
           ncfsm_boot_kind_name(ncfsm_boot_kind(boot)));
    printf("## 8-byte AllReduce round trip (submit .. ncfsm_work_wait), rank 0, %d x %d samples\n\n", rounds, iters);
    printf("| variant | median us | p99 us | min us |\n|---|---:|---:|---:|\n");
    for (int v = 0; v < NV; v++) {
      int n = iters * rounds;
      qsort(rt[v], (size_t)n, sizeof(double), cmp_d);
      double med = pct(rt[v], n, 50), p99 = pct(rt[v], n, 99);
      printf("| %s | %.1f | %.1f | %.1f |\n", vname[v], med, p99, rt[v][0]);
      printf("KV vrt.%s.median_us %.2f\nKV vrt.%s.p99_us %.2f\n", vname[v], med, vname[v], p99);
    }
    printf("\n## small-op stream, %d 8-byte AllReduces back to back, rank 0, median of %d rounds\n\n", stream_ops,
           srounds);
    printf("| variant | ops/s |\n|---|---:|\n");
    for (int i = 0; i < 2; i++) {
      qsort(sops[i], (size_t)srounds, sizeof(double), cmp_d);
      double med = sops[i][srounds / 2];
      printf("| %s | %.0f |\n", vname[sv[i]], med);
      printf("KV vstream.%s.ops_per_s %.0f\n", vname[sv[i]], med);
    }
    printf("\n");
  }
  for (int v = 0; v < NV; v++) {
    CHECK(ncfsm_mem_free(c[v], buf[v]));
    CHECK(ncfsm_comm_finalize(c[v]));
  }
  for (int v = 0; v < NV; v++) {
    if (ncfsm_comm_wait_state(c[v], NCFSM_STATE_FINALIZED, 60000) == NCFSM_OK) CHECK(ncfsm_comm_destroy(c[v]));
    else CHECK(ncfsm_comm_abort(c[v]));
    ncfsm_comm_wait_state(c[v], NCFSM_STATE_CLOSED, 60000);
    ncfsm_comm_release(c[v]);
    free(rt[v]);
  }
  ncfsm_boot_close(tcp3);
  ncfsm_boot_close(tcp2);
  ncfsm_boot_close(tcp1);
  ncfsm_boot_close(boot);
  CHECK(ncfsm_loop_close(loop));
  return 0;
}
