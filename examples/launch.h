/*
 * launch.h: how an example finds out whether it runs as one rank of several
 * processes or alone, the way the library decides it: ncfsm_boot_open with
 * the environment's settings (NCFSM_BOOTSTRAP=auto|pmix|tcp|local and the
 * others of docs/settings.md, "Bootstrap"). auto picks pmix when PMIX_RANK is
 * set (mpirun, srun --mpi=pmix), else tcp when NCFSM_STORE_ADDR is set, else
 * local; and it refuses to open in one of several tasks (SLURM_NTASKS,
 * OMPI_COMM_WORLD_SIZE or PMI_SIZE above 1) that found neither, so that srun
 * without --mpi=pmix is an error, not N one-process runs.
 */
#ifndef NCFSM_EXAMPLES_LAUNCH_H
#define NCFSM_EXAMPLES_LAUNCH_H

#include <stdio.h>

#include "ncfsm.h"
#include "ncfsm/bootstrap.h"

/* 1: one rank per process, *boot is the open bootstrap (pmix or tcp; close
 * it after the comms). 0: this process is alone (the local bootstrap of one
 * rank, which is closed again: the example drives its ranks itself). -1: the
 * settings leave neither: the reason is on stderr, prefixed by prog. */
static inline int ex_launch(struct event_base *base, const ncfsm_boot_opts *bo, ncfsm_boot **boot,
                            const char *prog) {
  *boot = NULL;
  ncfsm_boot *b;
  if (ncfsm_boot_open(base, bo, &b) != NCFSM_OK) {
    fprintf(stderr, "%s: bootstrap: %s\n", prog, ncfsm_boot_open_error());
    return -1;
  }
  if (ncfsm_boot_kind(b) != NCFSM_BOOT_LOCAL) {
    *boot = b;
    return 1;
  }
  int rank = ncfsm_boot_rank(b), size = ncfsm_boot_size(b);
  ncfsm_boot_close(b);
  if (size == 1) return 0;
  fprintf(stderr,
          "%s: NCFSM_RANK=%d and NCFSM_WORLD_SIZE=%d ask for one rank per process, but the bootstrap is "
          "local (%s), which joins ranks of one process only: nothing would reach the other ranks. For "
          "one rank per process launch with mpirun or srun --mpi=pmix, or set NCFSM_STORE_ADDR (the TCP "
          "store); to run alone unset NCFSM_RANK and NCFSM_WORLD_SIZE\n",
          prog, rank, size,
          bo->kind == NCFSM_BOOT_LOCAL ? "NCFSM_BOOTSTRAP=local"
                                       : "NCFSM_BOOTSTRAP=auto found no PMIX_RANK and no NCFSM_STORE_ADDR");
  return -1;
}

#endif
