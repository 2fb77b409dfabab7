/* ncfsm_comm_init_boot: the unique id travels through a bootstrap (here the
 * in-process one) by broadcast, each rank on its own thread with its own
 * loop; with opts.init_roots 3 every rank is a root, and the sim's
 * ncclCommInitRankScalable (keyed by all three ids) initialises the comm;
 * on a runtime without it (2.23.0) the first id is used. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "ncfsm/bootstrap.h"

#define N 3

static const char *fail_at[N];
static int roots;
static const char *group;
static int32_t result[N][4];

#define CHECK(cond)                   \
  do {                                \
    if (!(cond)) {                    \
      fail_at[rank] = #cond;          \
      goto out;                       \
    }                                 \
  } while (0)

static void *rank_main(void *arg) {
  int rank = (int)(intptr_t)arg;
  ncfsm_loop *loop = NULL;
  ncfsm_boot *boot = NULL;
  ncfsm_comm *c = NULL;
  ncfsm_work *w = NULL;
  CHECK(ncfsm_loop_new(NULL, &loop) == NCFSM_OK);
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  bo.kind = NCFSM_BOOT_LOCAL;
  bo.local_group = group;
  bo.rank = rank;
  bo.size = N;
  CHECK(ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &boot) == NCFSM_OK);
  ncfsm_sim_opts so;
  CHECK(ncfsm_sim_opts_init(&so) == NCFSM_OK);
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.backend = NCFSM_BACKEND_SIM;
  o.sim = &so;
  o.init_roots = roots;
  CHECK(ncfsm_comm_new(loop, &o, &c) == NCFSM_OK);
  CHECK(ncfsm_comm_init_boot(c, boot) == NCFSM_OK);
  CHECK(ncfsm_comm_state(c) == NCFSM_STATE_ID_QUEUED);
  CHECK(ncfsm_comm_wait_state(c, NCFSM_STATE_READY, 10000) == NCFSM_OK);
  CHECK(ncfsm_comm_rank(c) == rank && ncfsm_comm_size(c) == N);
  for (int i = 0; i < 4; i++) result[rank][i] = rank + 1;
  CHECK(ncfsm_allreduce(c, result[rank], result[rank], 4, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w) == NCFSM_OK);
  CHECK(ncfsm_work_wait(w, 10000) == NCFSM_OK);
  /* a second init is illegal (READY) and does not touch the bootstrap */
  CHECK(ncfsm_comm_init_boot(c, boot) == NCFSM_ERR_ILLEGAL_STATE);
out:
  if (w) ncfsm_work_release(w);
  if (c) {
    ncfsm_comm_abort(c);
    ncfsm_comm_release(c);
  }
  if (boot) ncfsm_boot_close(boot);
  if (loop && ncfsm_loop_close(loop) != NCFSM_OK && !fail_at[rank]) fail_at[rank] = "loop close";
  return NULL;
}

static void run(int nroots, const char *g) {
  roots = nroots;
  group = g;
  memset(fail_at, 0, sizeof fail_at);
  memset(result, 0, sizeof result);
  pthread_t th[N];
  for (int r = 0; r < N; r++) pthread_create(&th[r], NULL, rank_main, (void *)(intptr_t)r);
  for (int r = 0; r < N; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < N; r++)
    if (fail_at[r]) fail_msg("rank %d: %s", r, fail_at[r]);
  for (int r = 0; r < N; r++)
    for (int i = 0; i < 4; i++) assert_int_equal(result[r][i], 1 + 2 + 3);
}

static void test_init_through_local_bootstrap(void **state) {
  (void)state;
  run(1, "boot-init-1");
}

static void test_scalable_init(void **state) {
  (void)state;
  run(3, "boot-init-3");
}

static void test_scalable_fallback(void **state) {
  (void)state;
  setenv("NCFSM_SIM_NCCL_VERSION", "22300", 1); /* before ncclCommInitRankScalable */
  run(3, "boot-init-3-old");
  unsetenv("NCFSM_SIM_NCCL_VERSION");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_init_through_local_bootstrap),
                                     cmocka_unit_test(test_scalable_init), cmocka_unit_test(test_scalable_fallback)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
