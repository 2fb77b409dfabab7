/* docs/tutorial/steps.c: closing a communicator step by step
 * (docs/tutorial.md, "Closing step by step"): ncfsm_comm_finalize on every
 * rank, wait for FINALIZED, ncfsm_comm_destroy, ncfsm_comm_release, then
 * ncfsm_loop_close; what ncfsm_comm_close does in one call. */
#include "tutorial.h"

static void show(ncfsm_comm *const *comm, const char *after) {
  printf("%-24s rank 0 %-10s rank 1 %s\n", after, ncfsm_state_name(ncfsm_comm_state(comm[0])),
         ncfsm_state_name(ncfsm_comm_state(comm[1])));
}

int main(void) {
  ncfsm_loop *loop;
  ncfsm_comm *comm[NRANKS];
  tutorial_start("steps", &loop, comm, NULL);
  show(comm, "init:");

  /* [steps] */
  for (int r = 0; r < NRANKS; r++) TRY(ncfsm_comm_finalize(comm[r]));   /* nonblocking */
  show(comm, "finalize:");
  ncfsm_result_t st = ncfsm_comm_finalize(comm[0]);
  printf("finalize again: %s\n  %s\n", ncfsm_err_name(st), ncfsm_last_error());
  for (int r = 0; r < NRANKS; r++)
    TRY(ncfsm_comm_wait_state(comm[r], NCFSM_STATE_FINALIZED, 0));   /* runs the loop */
  show(comm, "wait_state(FINALIZED):");
  for (int r = 0; r < NRANKS; r++) TRY(ncfsm_comm_destroy(comm[r]));   /* blocking */
  show(comm, "destroy:");
  for (int r = 0; r < NRANKS; r++) TRY(ncfsm_comm_release(comm[r]));   /* the handles are gone */
  TRY(ncfsm_loop_close(loop));
  printf("loop closed\n");
  /* [/steps] */
  return 0;
}
