/* docs/tutorial/groups.c: groups (docs/tutorial.md, "Groups"). Nested
 * groups launch at the outermost end; an argument error inside a group
 * fails the whole group before NCCL sees any of it, and the communicators
 * stay usable; ncfsm_loop_shutdown closes every communicator at the end. */
#include "tutorial.h"

static void show(const char *when, ncfsm_work *const *w) {
  printf("%s: work 0 %s (%s), work 1 %s (%s)\n", when, ncfsm_work_state_name(ncfsm_work_state(w[0])),
         ncfsm_err_name(ncfsm_work_status(w[0])), ncfsm_work_state_name(ncfsm_work_state(w[1])),
         ncfsm_err_name(ncfsm_work_status(w[1])));
}

static void on_shutdown(ncfsm_loop *loop, void *arg) {
  (void)loop;
  (void)arg;
  printf("shutdown: every communicator is released\n");
}

int main(void) {
  ncfsm_loop *loop;
  ncfsm_comm *comm[NRANKS];
  void *buf[NRANKS];
  tutorial_start("groups", &loop, comm, buf);
  ncfsm_work *w[NRANKS];

  /* [nested] */
  TRY(ncfsm_group_start(loop));
  TRY(ncfsm_group_start(loop));   /* nested: only the outermost end launches */
  printf("depth %d\n", ncfsm_group_depth(loop));
  for (int r = 0; r < NRANKS; r++)
    TRY(ncfsm_allreduce(comm[r], buf[r], buf[r], COUNT, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL,
                        &w[r]));
  TRY(ncfsm_group_end(loop));
  TRY(ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT));   /* one turn of the loop */
  show("inner end", w);
  printf("rank 0 is %s\n", ncfsm_state_name(ncfsm_comm_state(comm[0])));
  TRY(ncfsm_group_end(loop));
  TRY(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT));
  show("outer end", w);
  for (int r = 0; r < NRANKS; r++) TRY(ncfsm_work_release(w[r]));   /* we asked for them */
  /* [/nested] */

  /* [error] */
  TRY(ncfsm_group_start(loop));
  TRY(ncfsm_allreduce(comm[0], buf[0], buf[0], COUNT, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL,
                      &w[0]));
  ncfsm_result_t st = ncfsm_broadcast(comm[1], buf[1], buf[1], COUNT, NCFSM_INT32, 2 /* root */,
                                      NULL, NULL, NULL, &w[1]);
  printf("broadcast: %s\n  %s\n", ncfsm_err_name(st), ncfsm_last_error());
  st = ncfsm_group_end(loop);   /* must still be called: it ends the group */
  printf("group end: %s\n  %s\n", ncfsm_err_name(st), ncfsm_loop_last_error(loop));
  TRY(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT));
  printf("the allreduce: %s (%s)\n", ncfsm_work_state_name(ncfsm_work_state(w[0])),
         ncfsm_err_name(ncfsm_work_status(w[0])));
  printf("rank 0 is %s, rank 1 is %s\n", ncfsm_state_name(ncfsm_comm_state(comm[0])),
         ncfsm_state_name(ncfsm_comm_state(comm[1])));
  TRY(ncfsm_work_release(w[0]));   /* the refused broadcast gave no work */
  /* [/error] */

  /* [again] */
  TRY(ncfsm_group_start(loop));
  for (int r = 0; r < NRANKS; r++)
    TRY(ncfsm_allreduce(comm[r], buf[r], buf[r], COUNT, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL,
                        &w[r]));
  TRY(ncfsm_group_end(loop));
  TRY(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT));
  show("next group", w);
  for (int r = 0; r < NRANKS; r++) TRY(ncfsm_work_release(w[r]));

  st = ncfsm_group_end(loop);
  printf("group end without start: %s\n  %s\n", ncfsm_err_name(st), ncfsm_loop_last_error(loop));
  /* [/again] */

  /* [shutdown] */
  for (int r = 0; r < NRANKS; r++) TRY(ncfsm_mem_free(comm[r], buf[r]));
  st = ncfsm_loop_close(loop);   /* too early: the comms are live */
  printf("loop close: %s\n  %s\n", ncfsm_err_name(st), ncfsm_loop_last_error(loop));
  TRY(ncfsm_loop_shutdown(loop, on_shutdown, NULL));   /* ncfsm_comm_close on every comm */
  TRY(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT));
  TRY(ncfsm_loop_close(loop));
  /* [/shutdown] */
  return 0;
}
