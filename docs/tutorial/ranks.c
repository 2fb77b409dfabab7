/* docs/tutorial/ranks.c: one rank per process (docs/tutorial.md, "One rank
 * per process"). The bootstrap (kind AUTO: PMIx under mpirun or srun
 * --mpi=pmix, the TCP store when NCFSM_STORE_ADDR is set) gives the rank,
 * the size and the channel through which rank 0's unique id reaches the
 * others; then an AllReduce and the teardown, as in first.c. */
#include <ncfsm/bootstrap.h>

#include "tutorial.h"

static void on_done(ncfsm_work *w, ncfsm_result_t status, void *arg) {
  (void)arg;
  ncfsm_comm *comm = ncfsm_work_comm(w);
  printf("rank %d: allreduce done: %s\n", ncfsm_comm_rank(comm), ncfsm_err_name(status));
}

int main(void) {
  ncfsm_loop *loop;
  TRY(ncfsm_loop_new(NULL, &loop));

  /* [boot] */
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);   /* kind AUTO, then the environment */
  ncfsm_boot *boot;
  if (ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &boot) != NCFSM_OK) {
    fprintf(stderr, "bootstrap: %s\n", ncfsm_boot_open_error());
    return 1;
  }
  int rank = ncfsm_boot_rank(boot), size = ncfsm_boot_size(boot);
  printf("rank %d: bootstrap %s, %d ranks\n", rank, ncfsm_boot_kind_name(ncfsm_boot_kind(boot)), size);

  ncfsm_comm_opts opts;
  TRY(ncfsm_comm_opts_init(&opts));
  opts.backend = NCFSM_BACKEND_SIM;            /* the sim across processes, over shared memory */
  opts.device = ncfsm_boot_local_rank(boot);   /* one GPU per rank of a node */
  opts.name = "ranks";
  ncfsm_comm *comm;
  TRY(ncfsm_comm_new(loop, &opts, &comm));
  TRY(ncfsm_comm_init_boot(comm, boot));       /* rank 0 makes the id, the bootstrap shares it */
  /* [/boot] */

  /* [work] */
  int32_t host[COUNT];
  for (int i = 0; i < COUNT; i++) host[i] = (rank + 1) * (i + 1);
  void *buf;
  TRY(ncfsm_mem_alloc(comm, sizeof host, &buf));
  TRY(ncfsm_memcpy(comm, buf, host, sizeof host, 1));
  TRY(ncfsm_allreduce(comm, buf, buf, COUNT, NCFSM_INT32, NCFSM_OP_SUM, NULL, on_done, NULL, NULL));
  TRY(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT));
  TRY(ncfsm_memcpy(comm, host, buf, sizeof host, 0));
  printf("rank %d: %d %d %d %d\n", rank, host[0], host[1], host[2], host[3]);

  TRY(ncfsm_mem_free(comm, buf));
  TRY(ncfsm_comm_close(comm, on_closed, NULL));
  TRY(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT));
  TRY(ncfsm_boot_close(boot));   /* after the comm: it used the bootstrap */
  TRY(ncfsm_loop_close(loop));
  /* [/work] */
  return 0;
}
