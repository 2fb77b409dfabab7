/*
 * mismatch_dump: the seed's first failure, recorded. One process drives 2
 * ranks of one clique (one GPU each on the nccl backend): a correct warm-up
 * AllReduce, then rank 0 calls Broadcast (root 0) while rank 1 calls
 * AllReduce (R11: rank 0 returns with its own data, rank 1 hangs). The
 * watchdog ends rank 1's work and dumps its flight recorder; rank 0's is
 * dumped on request. The dumps go to DIR, where `ncfsm-trace DIR` and
 * PyTorch's `fr_trace` read them.
 *
 *   mismatch_dump DIR [--timeout-ms MS] [--require-gpu]
 *                 [--kind op|count|count_r1small|dtype|root|redop|skip]
 *
 * After the comms are aborted it prints the first elements of every rank's
 * receive buffer of the mismatched call (rank r's input is 10 * (r + 1) in
 * every element; the warm-up's result was 30), which is what R11's table
 * says about the data.
 *
 * Exit 0 when the run went as R11 says (dumps queued for both ranks), 1
 * otherwise, 77 when --require-gpu finds fewer than 2 GPUs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ncfsm.h>

enum { N = 8 };

int main(int argc, char **argv) {
  const char *dir = NULL, *kind = "op";
  uint64_t timeout_ms = 1000;
  int require_gpu = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--timeout-ms") && i + 1 < argc) timeout_ms = (uint64_t)atoll(argv[++i]);
    else if (!strcmp(argv[i], "--kind") && i + 1 < argc) kind = argv[++i];
    else if (!strcmp(argv[i], "--require-gpu")) require_gpu = 1;
    else if (argv[i][0] != '-' && !dir) dir = argv[i];
    else {
      fprintf(stderr, "usage: %s DIR [--timeout-ms MS] [--require-gpu] [--kind op|count|dtype|root|redop|skip]\n",
              argv[0]);
      return 2;
    }
  }
  if (!dir) {
    fprintf(stderr, "mismatch_dump: DIR is required\n");
    return 2;
  }
  ncfsm_backend_info bi;
  ncfsm_result_t qr = ncfsm_backend_query(NCFSM_BACKEND_AUTO, &bi);
  if (require_gpu && (qr != NCFSM_OK || bi.kind != NCFSM_BACKEND_NCCL || bi.device_count < 2)) {
    printf("mismatch_dump: SKIP: needs the nccl backend and 2 GPUs\n");
    return 77;
  }
  if (qr != NCFSM_OK) {
    fprintf(stderr, "mismatch_dump: no backend: %s\n", bi.why);
    return 1;
  }
  ncfsm_loop *loop;
  if (ncfsm_loop_new(NULL, &loop) != NCFSM_OK) return 1;
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.timeout_ms = timeout_ms;
  o.verify = NCFSM_VERIFY_OFF; /* R11 as NCCL shows it (the default verification names it first: test_verify_local) */
  o.on_error = NCFSM_ON_ERROR_STAY;
  o.dump_dir = dir;
  o.name = "mismatch";
  int devices[2] = {0, bi.kind == NCFSM_BACKEND_NCCL ? 1 : 0};
  ncfsm_comm *c[2];
  if (ncfsm_comm_init_all(loop, 2, &o, devices, c) != NCFSM_OK) return 1;
  for (int r = 0; r < 2; r++)
    if (ncfsm_comm_wait_state(c[r], NCFSM_STATE_READY, 120000) != NCFSM_OK) {
      fprintf(stderr, "rank %d: %s\n", r, ncfsm_comm_last_error(c[r]));
      return 1;
    }
  float *buf[2][2], host[N];
  for (int r = 0; r < 2; r++)
    for (int k = 0; k < 2; k++) {
      if (ncfsm_mem_alloc(c[r], N * sizeof(float), (void **)&buf[r][k]) != NCFSM_OK) return 1;
      for (int i = 0; i < N; i++) host[i] = (float)(10 * (r + 1));
      ncfsm_memcpy(c[r], buf[r][k], host, sizeof host, 1);
    }
  /* warm-up: correct on both ranks */
  ncfsm_work *w[2];
  for (int r = 0; r < 2; r++)
    if (ncfsm_allreduce(c[r], buf[r][0], buf[r][0], N, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[r]) != NCFSM_OK)
      return 1;
  for (int r = 0; r < 2; r++) {
    ncfsm_result_t st = ncfsm_work_wait(w[r], 60000);
    ncfsm_work_release(w[r]);
    if (st != NCFSM_OK) {
      fprintf(stderr, "warm-up on rank %d: %s\n", r, ncfsm_err_name(st));
      return 1;
    }
  }
  /* the mismatch (rank 0 / rank 1), as in R11's measured rows (docs/nccl-rules.md) */
  ncfsm_result_t sr[2] = {NCFSM_OK, NCFSM_OK};
  w[0] = w[1] = NULL;
  if (!strcmp(kind, "op")) {
    sr[0] = ncfsm_broadcast(c[0], buf[0][1], buf[0][1], N, NCFSM_FLOAT32, 0, NULL, NULL, NULL, &w[0]);
    sr[1] = ncfsm_allreduce(c[1], buf[1][1], buf[1][1], N, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[1]);
  } else if (!strcmp(kind, "count")) {
    sr[0] = ncfsm_allreduce(c[0], buf[0][1], buf[0][1], 4, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[0]);
    sr[1] = ncfsm_allreduce(c[1], buf[1][1], buf[1][1], 8, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[1]);
  } else if (!strcmp(kind, "count_r1small")) {
    sr[0] = ncfsm_allreduce(c[0], buf[0][1], buf[0][1], 8, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[0]);
    sr[1] = ncfsm_allreduce(c[1], buf[1][1], buf[1][1], 4, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[1]);
  } else if (!strcmp(kind, "dtype")) {
    sr[0] = ncfsm_allreduce(c[0], buf[0][1], buf[0][1], N, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[0]);
    sr[1] = ncfsm_allreduce(c[1], buf[1][1], buf[1][1], N, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[1]);
  } else if (!strcmp(kind, "root")) {
    sr[0] = ncfsm_broadcast(c[0], buf[0][1], buf[0][1], N, NCFSM_FLOAT32, 0, NULL, NULL, NULL, &w[0]);
    sr[1] = ncfsm_broadcast(c[1], buf[1][1], buf[1][1], N, NCFSM_FLOAT32, 1, NULL, NULL, NULL, &w[1]);
  } else if (!strcmp(kind, "redop")) {
    sr[0] = ncfsm_allreduce(c[0], buf[0][1], buf[0][1], N, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[0]);
    sr[1] = ncfsm_allreduce(c[1], buf[1][1], buf[1][1], N, NCFSM_FLOAT32, NCFSM_OP_MAX, NULL, NULL, NULL, &w[1]);
  } else if (!strcmp(kind, "skip")) {
    sr[1] = ncfsm_allreduce(c[1], buf[1][1], buf[1][1], N, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[1]);
  } else {
    fprintf(stderr, "mismatch_dump: unknown --kind %s\n", kind);
    return 2;
  }
  if (sr[0] != NCFSM_OK || sr[1] != NCFSM_OK) return 1;
  ncfsm_result_t st[2] = {NCFSM_ERR_AGAIN, NCFSM_ERR_AGAIN};
  for (int r = 0; r < 2; r++)
    if (w[r]) {
      st[r] = ncfsm_work_wait(w[r], timeout_ms + 60000);
      ncfsm_work_release(w[r]);
    }
  printf("mismatch_dump: backend %s (NCCL %d), kind %s: rank 0 %s, rank 1 %s\n", bi.name, bi.nccl_version, kind,
         w[0] ? ncfsm_err_name(st[0]) : "(skipped)", ncfsm_err_name(st[1]));
  /* A rank that did not fail has not dumped: ask for its dump. */
  int rc = 0;
  for (int r = 0; r < 2; r++) {
    ncfsm_state_t s = ncfsm_comm_state(c[r]);
    printf("rank %d: state %s%s%s\n", r, ncfsm_state_name(s), s == NCFSM_STATE_ERROR ? ", failure: " : "",
           s == NCFSM_STATE_ERROR ? ncfsm_comm_failure(c[r]) : "");
    if (s != NCFSM_STATE_ERROR && ncfsm_comm_dump(c[r], NULL) != NCFSM_OK) {
      fprintf(stderr, "rank %d: dump: %s\n", r, ncfsm_comm_last_error(c[r]));
      rc = 1;
    }
  }
  /* R11: the op and count mismatches and the skip leave rank 1 hanging. */
  int hang = !strcmp(kind, "op") || !strcmp(kind, "count") || !strcmp(kind, "skip");
  if (hang && st[1] != NCFSM_ERR_TIMEOUT) rc = 1;
  /* Abort first: a kernel that hangs would hold a synchronous copy. */
  for (int r = 0; r < 2; r++)
    if (ncfsm_comm_state(c[r]) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(c[r]);
  for (int r = 0; r < 2; r++) {
    float out[N];
    if (ncfsm_memcpy(c[r], out, buf[r][1], sizeof out, 0) != NCFSM_OK) {
      printf("rank %d: receive buffer unreadable after abort\n", r);
      continue;
    }
    printf("rank %d: receive buffer after the call:", r);
    for (int i = 0; i < N; i++) printf(" %g", (double)out[i]);
    printf("  (its input: %d each)\n", 10 * (r + 1));
  }
  for (int r = 0; r < 2; r++) {
    for (int k = 0; k < 2; k++) ncfsm_mem_free(c[r], buf[r][k]);
    ncfsm_comm_release(c[r]);
  }
  if (ncfsm_loop_close(loop) != NCFSM_OK) rc = 1;
  /* The dump thread writes the files before the process exits. */
  return rc;
}
