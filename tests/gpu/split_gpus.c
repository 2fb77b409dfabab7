/*
 * split_gpus: split and shrink through ncfsm on every visible GPU of one
 * process (issue 10; R7, R8), one thread driving all ranks. On 1 GPU: a
 * 1-rank parent split into a 1-rank child (R8's order of handles and
 * polls). On 2 or more: a split into one color with keys reversing the
 * ranks, and a default-mode shrink that excludes the last rank; each child
 * runs an AllReduce that is checked. Prints what it saw and exits 0 when
 * every check held (77: no GPU with --require-gpu; the sim otherwise).
 *
 *   split_gpus [--require-gpu] [--timeout-ms MS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ncfsm.h"

#define MAXG 8
#define CNT 4096

static int failures;
#define EXPECT(cond, ...)                      \
  do {                                         \
    if (!(cond)) {                             \
      failures++;                              \
      printf("FAIL %s: ", #cond);              \
      printf(__VA_ARGS__);                     \
      printf("\n");                            \
    }                                          \
  } while (0)

static uint64_t tmo = 60000;

static void allreduce_check(ncfsm_loop *loop, ncfsm_comm **c, int n, const char *what) {
  void *buf[MAXG];
  int32_t host[CNT];
  ncfsm_work *w[MAXG];
  int32_t want = 0;
  for (int r = 0; r < n; r++) want += ncfsm_comm_rank(c[r]) + 1;
  for (int r = 0; r < n; r++) {
    if (ncfsm_mem_alloc(c[r], sizeof host, &buf[r]) != NCFSM_OK) {
      EXPECT(0, "%s: mem_alloc", what);
      return;
    }
    for (int k = 0; k < CNT; k++) host[k] = ncfsm_comm_rank(c[r]) + 1;
    ncfsm_memcpy(c[r], buf[r], host, sizeof host, 1);
  }
  ncfsm_group_start(loop);
  for (int r = 0; r < n; r++)
    EXPECT(ncfsm_allreduce(c[r], buf[r], buf[r], CNT, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[r]) == NCFSM_OK,
           "%s: allreduce", what);
  EXPECT(ncfsm_group_end(loop) == NCFSM_OK, "%s: group_end", what);
  for (int r = 0; r < n; r++) {
    ncfsm_result_t st = ncfsm_work_wait(w[r], tmo);
    ncfsm_work_release(w[r]);
    ncfsm_memcpy(c[r], host, buf[r], sizeof host, 0);
    EXPECT(st == NCFSM_OK && host[0] == want && host[CNT - 1] == want, "%s rank %d: %s, %d (want %d)", what, r,
           ncfsm_err_name(st), host[0], want);
    ncfsm_mem_free(c[r], buf[r]);
  }
  printf("%s: AllReduce over %d rank(s): %s\n", what, n, failures ? "checked (see FAIL lines)" : "correct");
}

static void close_all(ncfsm_comm **c, int n) {
  for (int r = 0; r < n; r++) {
    if (!c[r]) continue;
    if (ncfsm_comm_state(c[r]) != NCFSM_STATE_CLOSED) ncfsm_comm_abort(c[r]);
    ncfsm_comm_release(c[r]);
    c[r] = NULL;
  }
}

int main(int argc, char **argv) {
  int require_gpu = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--require-gpu")) require_gpu = 1;
    else if (!strcmp(argv[i], "--timeout-ms") && i + 1 < argc) tmo = strtoull(argv[++i], NULL, 0);
    else {
      fprintf(stderr, "usage: %s [--require-gpu] [--timeout-ms MS]\n", argv[0]);
      return 2;
    }
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  ncfsm_backend_info bi;
  ncfsm_backend_kind_t bk = require_gpu ? NCFSM_BACKEND_NCCL : NCFSM_BACKEND_AUTO;
  if (ncfsm_backend_query(bk, &bi) != NCFSM_OK || (require_gpu && bi.device_count <= 0)) {
    printf("SKIP: no GPU (%s)\n", bi.why);
    return require_gpu ? 77 : 1;
  }
  int n = bi.kind == NCFSM_BACKEND_NCCL ? (bi.device_count < MAXG ? bi.device_count : MAXG) : 2;
  printf("split_gpus: backend %s, NCCL %d, %d rank(s) in one process\n", bi.name, bi.nccl_version, n);
  ncfsm_loop *loop;
  if (ncfsm_loop_new(NULL, &loop) != NCFSM_OK) return 1;
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.backend = bk;
  o.timeout_ms = tmo;
  o.on_error = NCFSM_ON_ERROR_STAY;
  o.dump_dir = "";
  int devs[MAXG];
  for (int r = 0; r < n; r++) devs[r] = r;
  ncfsm_comm *p[MAXG] = {0}, *ch[MAXG] = {0};
  if (ncfsm_comm_init_all(loop, n, &o, devs, p) != NCFSM_OK) return 1;
  for (int r = 0; r < n; r++) EXPECT(ncfsm_comm_wait_state(p[r], NCFSM_STATE_READY, tmo) == NCFSM_OK, "init %d", r);

  /* split: one color, keys reversing the order */
  for (int r = 0; r < n; r++) {
    o.device = r;
    o.name = "split-child";
    if (ncfsm_comm_new(loop, &o, &ch[r]) != NCFSM_OK) return 1;
    ncfsm_result_t sr = ncfsm_comm_split(p[r], 0, n - r, ch[r]);
    printf("rank %d: ncfsm_comm_split -> %s; parent %s, child %s\n", r, ncfsm_err_name(sr),
           ncfsm_state_name(ncfsm_comm_state(p[r])), ncfsm_state_name(ncfsm_comm_state(ch[r])));
    EXPECT(sr == NCFSM_OK, "split %d: %s", r, ncfsm_comm_last_error(p[r]));
  }
  for (int r = 0; r < n; r++) {
    ncfsm_result_t w = ncfsm_comm_wait_state(ch[r], NCFSM_STATE_READY, tmo);
    EXPECT(w == NCFSM_OK, "split child %d READY: %s %s", r, ncfsm_err_name(w), ncfsm_comm_failure(ch[r]));
    EXPECT(ncfsm_comm_state(p[r]) == NCFSM_STATE_READY, "parent %d back to READY: %s", r,
           ncfsm_state_name(ncfsm_comm_state(p[r])));
    printf("rank %d: split child READY: rank %d of %d (want %d of %d)\n", r, ncfsm_comm_rank(ch[r]),
           ncfsm_comm_size(ch[r]), n - 1 - r, n);
    EXPECT(ncfsm_comm_rank(ch[r]) == n - 1 - r && ncfsm_comm_size(ch[r]) == n, "split child %d geometry", r);
  }
  if (!failures) allreduce_check(loop, ch, n, "split child");
  close_all(ch, n);

  /* shrink (default mode): the last rank is excluded and makes no call */
  if (n >= 2 && (bi.nccl_version >= 22703 || bi.kind == NCFSM_BACKEND_SIM)) {
    int ex = n - 1;
    for (int r = 0; r < n - 1; r++) {
      o.device = r;
      o.name = "shrink-child";
      if (ncfsm_comm_new(loop, &o, &ch[r]) != NCFSM_OK) return 1;
      ncfsm_result_t sr = ncfsm_comm_shrink(p[r], &ex, 1, NCFSM_SHRINK_DEFAULT, ch[r]);
      printf("rank %d: ncfsm_comm_shrink(exclude %d) -> %s; parent %s, child %s\n", r, ex, ncfsm_err_name(sr),
             ncfsm_state_name(ncfsm_comm_state(p[r])), ncfsm_state_name(ncfsm_comm_state(ch[r])));
      EXPECT(sr == NCFSM_OK, "shrink %d: %s", r, ncfsm_comm_last_error(p[r]));
    }
    for (int r = 0; r < n - 1; r++) {
      ncfsm_result_t w = ncfsm_comm_wait_state(ch[r], NCFSM_STATE_READY, tmo);
      EXPECT(w == NCFSM_OK, "shrink child %d READY: %s %s", r, ncfsm_err_name(w), ncfsm_comm_failure(ch[r]));
    }
    if (!failures) allreduce_check(loop, ch, n - 1, "shrink child");
    close_all(ch, n - 1);
  }
  close_all(p, n);
  ncfsm_loop_close(loop);
  printf("split_gpus: %s\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
