/*
 * End to end through the environment, as a launcher without PMIx would do it:
 * N processes get NCFSM_STORE_ADDR / NCFSM_STORE_TOKEN / NCFSM_RANK /
 * NCFSM_WORLD_SIZE (rank 0 also NCFSM_STORE_HOST=1), open the bootstrap with
 * kind AUTO (which must pick tcp), share the unique id through it
 * (ncfsm_comm_init_boot) and run collectives on the multi-process sim.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "ncfsm/bootstrap.h"

#define N 3

/* One rank; returns 0 on success, else the step that failed. */
static int rank_main(int rank) {
  ncfsm_loop *loop = NULL;
  ncfsm_boot *boot = NULL;
  ncfsm_comm *c = NULL;
  ncfsm_work *w = NULL;
  int step = 1;
  if (ncfsm_loop_new(NULL, &loop) != NCFSM_OK) return step;
  step++;
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo); /* everything from the environment */
  if (ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &boot) != NCFSM_OK) return step;
  step++;
  if (ncfsm_boot_kind(boot) != NCFSM_BOOT_TCP || ncfsm_boot_rank(boot) != rank || ncfsm_boot_size(boot) != N)
    return step;
  step++;
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.backend = NCFSM_BACKEND_SIM;
  o.timeout_ms = 20000;
  if (ncfsm_comm_new(loop, &o, &c) != NCFSM_OK || ncfsm_comm_init_boot(c, boot) != NCFSM_OK) return step;
  step++;
  if (ncfsm_comm_wait_state(c, NCFSM_STATE_READY, 20000) != NCFSM_OK) return step;
  step++;
  int32_t buf[8], gathered[8 * N];
  for (int i = 0; i < 8; i++) buf[i] = rank + 1;
  if (ncfsm_allreduce(c, buf, buf, 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w) != NCFSM_OK ||
      ncfsm_work_wait(w, 20000) != NCFSM_OK)
    return step;
  ncfsm_work_release(w);
  step++;
  for (int i = 0; i < 8; i++)
    if (buf[i] != N * (N + 1) / 2) return step;
  step++;
  for (int i = 0; i < 8; i++) buf[i] = rank * 100 + i;
  if (ncfsm_allgather(c, buf, gathered, 8, NCFSM_INT32, NULL, NULL, NULL, &w) != NCFSM_OK ||
      ncfsm_work_wait(w, 20000) != NCFSM_OK)
    return step;
  ncfsm_work_release(w);
  step++;
  for (int r = 0; r < N; r++)
    for (int i = 0; i < 8; i++)
      if (gathered[r * 8 + i] != r * 100 + i) return step;
  step++;
  /* the ranks' fingerprint hashes agree (R11) */
  uint64_t h = 0, all[N];
  if (ncfsm_comm_position(c, NULL, &h) != NCFSM_OK) return step;
  if (ncfsm_boot_allgather(boot, &h, all, sizeof h) != NCFSM_OK) return step;
  for (int r = 0; r < N; r++)
    if (all[r] != h) return step;
  step++;
  if (ncfsm_comm_finalize(c) != NCFSM_OK || ncfsm_comm_wait_state(c, NCFSM_STATE_FINALIZED, 20000) != NCFSM_OK ||
      ncfsm_comm_destroy(c) != NCFSM_OK || ncfsm_comm_release(c) != NCFSM_OK)
    return step;
  step++;
  /* rank 0 hosts the store: everyone passes a barrier before it closes */
  if (ncfsm_boot_allgather(boot, NULL, NULL, 0) != NCFSM_OK) return step;
  ncfsm_boot_close(boot);
  if (ncfsm_loop_close(loop) != NCFSM_OK) return step;
  return 0;
}

static int rank_of(int rank, void *arg) {
  (void)arg;
  return rank_main(rank);
}

static void test_tcp_store_env_bootstrap(void **state) {
  (void)state;
  assert_int_equal(test_run_tcp_ranks(N, "test-token-7c1e", rank_of, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_tcp_store_env_bootstrap)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
