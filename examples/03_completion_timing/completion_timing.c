/*
 * 03_completion_timing: the seed chapter's "GroupEnd is not GPU completion"
 * experiment (the chapter: docs/nccl-rules.md, "The seed chapter"), through
 * ncfsm. In-place AllReduce SUM int32 (256 MiB per rank by default), warm-up
 * cycles, then measured cycles with opts.timing = 1. Per
 * cycle and rank:
 *
 *   host enqueue   ncfsm_group_start .. ncfsm_group_end on the host
 *   launch final   submit_ns .. final_ns: until NCCL's group end polled to
 *                  ncclSuccess and the completion event was recorded (R2)
 *   device         start event before the launch .. completion event (ms)
 *   ready_at_final was the completion event complete right after final?
 *
 * Each cycle takes the max across ranks; the report gives median, P95 and CV.
 *
 *   mpirun -np 2 build/examples/03_completion_timing      one rank per process (PMIx)
 *   build/examples/03_completion_timing [--ranks N]        one thread drives N ranks
 *
 * On the sim every figure is model time on the host, not GPU time.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ncfsm.h"
#include "ncfsm/bootstrap.h"
#include "launch.h"

#define MAXR 64
#define WAIT_MS 120000

#define CHECK(call)                                                                       \
  do {                                                                                    \
    ncfsm_result_t r_ = (call);                                                           \
    if (r_ != NCFSM_OK) {                                                                 \
      fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #call, ncfsm_err_name(r_)); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

/* One rank's measurement of one cycle; exchanged between processes as is. */
typedef struct sample {
  double host_us;    /* group_start .. group_end */
  double final_us;   /* submit .. launch final */
  double launch_us;  /* NCCL group end called .. launch final */
  double complete_us;/* submit .. completion seen by the loop */
  double device_us;  /* start event .. completion event */
  int32_t ready;     /* ready_at_final */
  int32_t status;    /* the work's final status */
} sample;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median, P95 (linear interpolation between order statistics, as numpy's
 * default) and CV (sample standard deviation / mean) of n values. */
static void stats(const double *v, int n, double *med, double *p95, double *cv) {
  double *s = malloc((size_t)n * sizeof *s);
  if (!s) exit(1);
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  double q = 0.5 * (n - 1), h = 0.95 * (n - 1);
  int qi = (int)q, hi = (int)h;
  *med = s[qi] + (q - qi) * (qi + 1 < n ? s[qi + 1] - s[qi] : 0);
  *p95 = s[hi] + (h - hi) * (hi + 1 < n ? s[hi + 1] - s[hi] : 0);
  double mean = 0, var = 0;
  for (int i = 0; i < n; i++) mean += s[i];
  mean /= n;
  for (int i = 0; i < n; i++) var += (s[i] - mean) * (s[i] - mean);
  *cv = n > 1 && mean > 0 ? sqrt(var / (n - 1)) / mean : 0;
  free(s);
}

static void usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [--ranks N] [--bytes B] [--warmup W] [--cycles C] [--csv FILE] [--blocking] [--require-gpu]\n"
          "  defaults: 256 MiB per rank, 3 warm-up and 10 measured cycles\n"
          "  under mpirun, srun --mpi=pmix or with NCFSM_STORE_ADDR (NCFSM_BOOTSTRAP=auto): one rank\n"
          "  per process, device = local rank\n"
          "  alone, or with --ranks: one thread drives N ranks (default 4 on the sim,\n"
          "  one per GPU on nccl) through ncfsm_comm_init_all\n"
          "  --blocking: blocking communicators (the launch is final when NCCL's group end returns)\n"
          "  --require-gpu: use nccl; exit 77 (skip) when no GPU is visible\n",
          argv0);
  exit(2);
}

int main(int argc, char **argv) {
  int ranks_opt = 0, require_gpu = 0, warmup = 3, cycles = 10, blocking = 0;
  size_t bytes = 256u << 20;
  const char *csv = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--ranks") && i + 1 < argc) ranks_opt = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--bytes") && i + 1 < argc) bytes = (size_t)strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--cycles") && i + 1 < argc) cycles = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
    else if (!strcmp(argv[i], "--require-gpu")) require_gpu = 1;
    else if (!strcmp(argv[i], "--blocking")) blocking = 1;
    else usage(argv[0]);
  }
  size_t count = bytes / sizeof(int32_t);
  if (count == 0 || warmup < 0 || cycles < 1 || ranks_opt < 0 || ranks_opt > MAXR) usage(argv[0]);
  ncfsm_comm_opts o;
  CHECK(ncfsm_comm_opts_init(&o));
  o.name = "completion_timing";
  o.timeout_ms = WAIT_MS;
  o.timing = 1; /* a start event per launch and stream: device time and ready_at_final */
  o.blocking = blocking; /* 1: NCCL's group end returns once enqueued, as in the seed (2.22.3) */
  char why[256] = "";
  if (require_gpu) o.backend = NCFSM_BACKEND_NCCL;
  ncfsm_backend_info bi;
  int have_be = ncfsm_backend_query(o.backend, &bi) == NCFSM_OK;
  snprintf(why, sizeof why, "%s", bi.why);
  int ngpu = have_be && bi.kind == NCFSM_BACKEND_NCCL ? bi.device_count : 0;
  if (require_gpu && ngpu <= 0) {
    printf("SKIP: --require-gpu and no GPU is visible (%s)\n", why[0] ? why : "0 CUDA devices");
    return 77;
  }
  if (!have_be) {
    fprintf(stderr, "no backend: %s\n", why);
    return 1;
  }
  int sim = bi.kind == NCFSM_BACKEND_SIM;
  int ver = bi.nccl_version;
  char version[48];
  snprintf(version, sizeof version, "%d.%d.%d%s", ver / 10000, ver / 100 % 100, ver % 100,
           sim ? " (modelled)" : "");

  ncfsm_loop *loop;
  ncfsm_boot *boot = NULL;
  ncfsm_comm *comm[MAXR];
  int nranks, nlocal, rank0 = 0;
  CHECK(ncfsm_loop_new(NULL, &loop));
  /* One rank per process, or one process for every rank (--ranks, or alone): the
   * bootstrap's settings decide (NCFSM_BOOTSTRAP, docs/settings.md; examples/launch.h). */
  int mpi = 0;
  if (!ranks_opt) {
    ncfsm_boot_opts bo;
    ncfsm_boot_opts_init(&bo);
    if ((mpi = ex_launch(ncfsm_loop_base(loop), &bo, &boot, "03_completion_timing")) < 0) {
      ncfsm_loop_close(loop);
      return 1;
    }
  }
  if (mpi) {
    nranks = ncfsm_boot_size(boot);
    rank0 = ncfsm_boot_rank(boot);
    nlocal = 1;
    o.device = ncfsm_boot_local_rank(boot);
    if (ngpu > 0 && o.device >= ngpu) {
      fprintf(stderr, "rank %d: local rank %d but only %d GPU(s) visible\n", rank0, o.device, ngpu);
      return 1;
    }
    CHECK(ncfsm_comm_new(loop, &o, &comm[0]));
    CHECK(ncfsm_comm_init_boot(comm[0], boot));
  } else {
    nranks = nlocal = ranks_opt ? ranks_opt : ngpu > 0 ? (ngpu < MAXR ? ngpu : MAXR) : 4;
    if (ngpu > 0 && nlocal > ngpu) {
      fprintf(stderr, "--ranks %d in one process needs %d GPUs; %d visible\n", nlocal, nlocal, ngpu);
      return 1;
    }
    int devices[MAXR];
    for (int s = 0; s < nlocal; s++) devices[s] = s;
    CHECK(ncfsm_comm_init_all(loop, nlocal, &o, devices, comm));
  }
  for (int s = 0; s < nlocal; s++) {
    ncfsm_result_t r = ncfsm_comm_wait_state(comm[s], NCFSM_STATE_READY, WAIT_MS);
    if (r != NCFSM_OK) {
      fprintf(stderr, "rank %d: init: %s (%s)\n", rank0 + s, ncfsm_err_name(r), ncfsm_comm_last_error(comm[s]));
      return 1;
    }
  }

  /* Element i of rank r starts as (r+1) + i%7; after k in-place SUMs over n
   * ranks it is (n(n+1)/2 + n*(i%7)) * n^(k-1), mod 2^32 (int32 wraps). */
  int32_t *host = malloc(count * sizeof *host);
  void *buf[MAXR];
  if (!host) return 1;
  for (int s = 0; s < nlocal; s++) {
    for (size_t i = 0; i < count; i++) host[i] = (int32_t)(rank0 + s + 1 + (int)(i % 7));
    CHECK(ncfsm_mem_alloc(comm[s], bytes, &buf[s]));
    CHECK(ncfsm_memcpy(comm[s], buf[s], host, count * sizeof *host, 1));
  }

  int total = warmup + cycles;
  sample *mine = calloc((size_t)cycles * (size_t)nlocal, sizeof *mine);
  if (!mine) return 1;
  int failed = 0;
  for (int c = 0; c < total; c++) {
    ncfsm_work *w[MAXR];
    uint64_t t0 = now_ns();
    CHECK(ncfsm_group_start(loop));
    for (int s = 0; s < nlocal; s++)
      CHECK(ncfsm_allreduce(comm[s], buf[s], buf[s], count, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[s]));
    CHECK(ncfsm_group_end(loop));
    uint64_t t1 = now_ns();
    for (int s = 0; s < nlocal; s++) {
      ncfsm_result_t st = ncfsm_work_wait(w[s], WAIT_MS);
      ncfsm_work_times t;
      CHECK(ncfsm_work_get_times(w[s], &t));
      ncfsm_work_release(w[s]);
      if (st != NCFSM_OK) {
        fprintf(stderr, "rank %d cycle %d: AllReduce ended %s (%s)\n", rank0 + s, c, ncfsm_err_name(st),
                ncfsm_comm_last_error(comm[s]));
        failed = 1;
      }
      if (c < warmup) continue;
      sample *x = &mine[(c - warmup) * nlocal + s];
      x->host_us = (double)(t1 - t0) / 1e3;
      x->final_us = t.final_ns ? (double)(t.final_ns - t.submit_ns) / 1e3 : -1;
      x->launch_us = t.final_ns && t.launch_ns ? (double)(t.final_ns - t.launch_ns) / 1e3 : -1;
      x->complete_us = t.complete_ns ? (double)(t.complete_ns - t.submit_ns) / 1e3 : -1;
      x->device_us = t.device_ms >= 0 ? (double)t.device_ms * 1e3 : -1;
      x->ready = t.ready_at_final;
      x->status = (int32_t)st;
      if (st == NCFSM_OK && (t.device_ms < 0 || t.ready_at_final < 0)) {
        fprintf(stderr, "rank %d cycle %d: no device timing (device_ms %.3f, ready_at_final %d)\n", rank0 + s,
                c, (double)t.device_ms, t.ready_at_final);
        failed = 1;
      }
    }
  }

  /* Full-tensor check after all cycles. */
  int data_ok = !failed;
  for (int s = 0; s < nlocal && data_ok; s++) {
    CHECK(ncfsm_memcpy(comm[s], host, buf[s], count * sizeof *host, 0));
    uint32_t n = (uint32_t)nranks, scale = 1;
    for (int k = 1; k < total; k++) scale *= n;
    for (size_t i = 0; i < count; i++) {
      int32_t want = (int32_t)((n * (n + 1) / 2 + n * (uint32_t)(i % 7)) * scale);
      if (host[i] != want) {
        fprintf(stderr, "rank %d: element %zu is %" PRId32 ", expected %" PRId32 "\n", rank0 + s, i, host[i], want);
        data_ok = 0;
        break;
      }
    }
  }
  for (int s = 0; s < nlocal; s++) {
    CHECK(ncfsm_mem_free(comm[s], buf[s]));
    CHECK(ncfsm_comm_finalize(comm[s]));
  }
  for (int s = 0; s < nlocal; s++) CHECK(ncfsm_comm_wait_state(comm[s], NCFSM_STATE_FINALIZED, WAIT_MS));
  for (int s = 0; s < nlocal; s++) {
    CHECK(ncfsm_comm_destroy(comm[s]));
    CHECK(ncfsm_comm_release(comm[s]));
  }

  /* All samples, [rank][cycle]; every rank's data-check verdict. */
  sample *all = calloc((size_t)cycles * (size_t)nranks, sizeof *all);
  int32_t *oks = calloc((size_t)nranks, sizeof *oks);
  if (!all || !oks) return 1;
  for (int s = 0; s < nlocal; s++)
    for (int c = 0; c < cycles; c++) all[(size_t)s * cycles + c] = mine[c * nlocal + s];
  int32_t ok32 = data_ok;
  if (mpi) {
    /* one rank here: mine holds its cycles in order */
    CHECK(ncfsm_boot_allgather(boot, mine, all, (size_t)cycles * sizeof *mine));
    CHECK(ncfsm_boot_allgather(boot, &ok32, oks, sizeof ok32));
    CHECK(ncfsm_boot_close(boot));
  } else {
    for (int s = 0; s < nlocal; s++) oks[s] = ok32;
  }
  CHECK(ncfsm_loop_close(loop));
  int all_ok = 1;
  for (int r = 0; r < nranks; r++) all_ok &= oks[r] == 1;

  if (rank0 == 0) {
    double *host_max = calloc((size_t)cycles, sizeof(double)), *final_max = calloc((size_t)cycles, sizeof(double));
    double *launch_max = calloc((size_t)cycles, sizeof(double)), *dev_max = calloc((size_t)cycles, sizeof(double));
    double *comp_max = calloc((size_t)cycles, sizeof(double));
    if (!host_max || !final_max || !launch_max || !dev_max || !comp_max) return 1;
    int ready = 0;
    for (int c = 0; c < cycles; c++)
      for (int r = 0; r < nranks; r++) {
        const sample *x = &all[(size_t)r * cycles + c];
        if (x->host_us > host_max[c]) host_max[c] = x->host_us;
        if (x->final_us > final_max[c]) final_max[c] = x->final_us;
        if (x->launch_us > launch_max[c]) launch_max[c] = x->launch_us;
        if (x->device_us > dev_max[c]) dev_max[c] = x->device_us;
        if (x->complete_us > comp_max[c]) comp_max[c] = x->complete_us;
        ready += x->ready == 1;
      }
    printf("03_completion_timing: in-place AllReduce SUM int32, %zu bytes per rank, %d ranks (%s)\n", bytes, nranks,
           mpi ? "one rank per process" : "one process, one thread");
    printf("backend %s, NCCL %s, %s comms; %d warm-up + %d measured cycles; each cycle: max across ranks\n",
           bi.name, version, blocking ? "blocking" : "nonblocking", warmup, cycles);
    if (sim)
      printf("SIMULATED: the sim backend is a model of NCCL on host memory. Every figure below is\n"
             "model time measured on the host (device = the sim's stream model), NOT GPU time.\n");
    printf("\n%-52s %12s %12s %8s\n", "interval (us)", "median", "P95", "CV");
    struct {
      const char *name;
      double *v;
    } rowsv[] = {
        {"host enqueue: ncfsm_group_start .. group_end", host_max},
        {"launch final: submit .. final (NCCL success, R2)", final_max},
        {"  of which NCCL group end .. final", launch_max},
        {sim ? "device (sim model): start .. completion event" : "device (CUDA events): start .. completion",
         dev_max},
        {"completion seen by the loop: submit .. complete", comp_max},
    };
    for (size_t i = 0; i < sizeof rowsv / sizeof rowsv[0]; i++) {
      double med, p95, cv;
      stats(rowsv[i].v, cycles, &med, &p95, &cv);
      printf("%-52s %12.3f %12.3f %7.2f%%\n", rowsv[i].name, med, p95, cv * 100);
    }
    double hm, hp, hc, dm, dp, dc;
    stats(host_max, cycles, &hm, &hp, &hc);
    stats(dev_max, cycles, &dm, &dp, &dc);
    printf("\nready right after launch final: %d/%d rank-cycles\n", ready, cycles * nranks);
    printf("device / host-enqueue medians: %.1fx\n", hm > 0 ? dm / hm : 0.0);
    printf("data check (full tensor, every rank): %s\n", all_ok ? "PASS" : "FAIL");
    free(host_max);
    free(final_max);
    free(launch_max);
    free(dev_max);
    free(comp_max);
    if (csv) {
      FILE *f = fopen(csv, "w");
      if (!f) {
        perror(csv);
        all_ok = 0;
      } else {
        fprintf(f, "cycle,rank,nranks,backend,nccl_version,bytes,host_enqueue_us,submit_to_final_us,"
                   "launch_to_final_us,submit_to_complete_us,device_us,ready_at_final,status\n");
        for (int c = 0; c < cycles; c++)
          for (int r = 0; r < nranks; r++) {
            const sample *x = &all[(size_t)r * cycles + c];
            fprintf(f, "%d,%d,%d,%s,%s,%zu,%.3f,%.3f,%.3f,%.3f,%.3f,%d,%s\n", c, r, nranks, bi.name, version,
                    bytes, x->host_us, x->final_us, x->launch_us, x->complete_us, x->device_us, x->ready,
                    ncfsm_err_name((ncfsm_result_t)x->status));
          }
        fclose(f);
      }
    }
  }
  free(all);
  free(oks);
  free(mine);
  free(host);
  return all_ok ? 0 : 1;
}
