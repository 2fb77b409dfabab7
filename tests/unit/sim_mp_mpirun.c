/*
 * The sim across processes under mpirun: each process is one rank; the
 * unique id travels through PMIx (ncfsm_comm_init_boot), the ranks meet in
 * the clique's shared-memory segment (docs/sim.md, "Processes").
 *
 *   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
 *     mpirun --oversubscribe -np 4 ./sim_mp_mpirun
 *
 * Exit status 0 on every rank when the AllReduce and the AllGather are right.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ncfsm.h"
#include "ncfsm/bootstrap.h"

#define FAIL(...)                                  \
  do {                                             \
    fprintf(stderr, "sim_mp_mpirun: " __VA_ARGS__); \
    fputc('\n', stderr);                           \
    return 1;                                      \
  } while (0)

int main(void) {
  ncfsm_loop *loop;
  if (ncfsm_loop_new(NULL, &loop) != NCFSM_OK) FAIL("loop");
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  bo.kind = NCFSM_BOOT_PMIX;
  ncfsm_boot *boot;
  if (ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &boot) != NCFSM_OK)
    FAIL("PMIx bootstrap: %s (run under mpirun)", ncfsm_boot_open_error());
  int rank = ncfsm_boot_rank(boot), n = ncfsm_boot_size(boot);
  ncfsm_sim_opts so;
  if (ncfsm_sim_opts_init(&so) != NCFSM_OK) FAIL("ncfsm_sim_opts_init: %s", ncfsm_opts_error());
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.backend = NCFSM_BACKEND_SIM;
  o.sim = &so;
  o.timeout_ms = 20000;
  o.name = "mpirun";
  ncfsm_comm *c;
  if (ncfsm_comm_new(loop, &o, &c) != NCFSM_OK) FAIL("comm_new");
  if (ncfsm_comm_init_boot(c, boot) != NCFSM_OK) FAIL("rank %d: init_boot: %s", rank, ncfsm_comm_last_error(c));
  if (ncfsm_comm_wait_state(c, NCFSM_STATE_READY, 30000) != NCFSM_OK)
    FAIL("rank %d: init: %s", rank, ncfsm_comm_last_error(c));
  if (ncfsm_comm_rank(c) != rank || ncfsm_comm_size(c) != n) FAIL("rank %d: wrong rank/size", rank);

  enum { CNT = 1024 };
  int32_t *ar = malloc(CNT * sizeof *ar), *ag_s = malloc(CNT * sizeof *ag_s);
  int32_t *ag_r = malloc((size_t)n * CNT * sizeof *ag_r);
  if (!ar || !ag_s || !ag_r) FAIL("out of memory");
  for (int i = 0; i < CNT; i++) {
    ar[i] = rank + i;
    ag_s[i] = rank * 100000 + i;
  }
  ncfsm_work *w[2];
  if (ncfsm_allreduce(c, ar, ar, CNT, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[0]) != NCFSM_OK ||
      ncfsm_allgather(c, ag_s, ag_r, CNT, NCFSM_INT32, NULL, NULL, NULL, &w[1]) != NCFSM_OK)
    FAIL("rank %d: submit: %s", rank, ncfsm_comm_last_error(c));
  for (int k = 0; k < 2; k++) {
    if (ncfsm_work_wait(w[k], 30000) != NCFSM_OK) FAIL("rank %d: work %d: %s", rank, k, ncfsm_comm_last_error(c));
    ncfsm_work_release(w[k]);
  }
  int bad = 0;
  for (int i = 0; i < CNT; i++)
    if (ar[i] != n * (n - 1) / 2 + n * i) bad++;
  for (int r = 0; r < n; r++)
    for (int i = 0; i < CNT; i++)
      if (ag_r[(size_t)r * CNT + i] != r * 100000 + i) bad++;
  if (bad) FAIL("rank %d: %d wrong elements", rank, bad);

  if (ncfsm_comm_finalize(c) != NCFSM_OK || ncfsm_comm_wait_state(c, NCFSM_STATE_FINALIZED, 30000) != NCFSM_OK ||
      ncfsm_comm_destroy(c) != NCFSM_OK || ncfsm_comm_release(c) != NCFSM_OK)
    FAIL("rank %d: finalize/destroy: %s", rank, ncfsm_comm_last_error(c));
  ncfsm_boot_close(boot);
  if (ncfsm_loop_close(loop) != NCFSM_OK) FAIL("loop close");
  free(ar);
  free(ag_s);
  free(ag_r);
  printf("sim_mp_mpirun: rank %d/%d OK (AllReduce, AllGather across processes)\n", rank, n);
  return 0;
}
