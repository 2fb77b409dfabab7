/* docs/tutorial/errors.c: errors and the watchdog (docs/tutorial.md,
 * "Errors and the watchdog"). A rank that skips a collective leaves its
 * peer's work hanging until the watchdog's deadline: the work fails with
 * NCFSM_ERR_TIMEOUT, the other rank's comm fails with it (NCFSM_ERR_PEER)
 * and the error policy (default: abort) closes both. Then an asynchronous error of the backend with the policy
 * NCFSM_ON_ERROR_STAY: the communicator waits in ERROR for the program. */
#include "tutorial.h"

/* [on_state] */
/* opts.on_state: on the loop's thread after every transition of the comm;
 * this one prints rank 0's from READY on (not the init's). */
static void on_state(ncfsm_comm *comm, ncfsm_state_t from, ncfsm_state_t to, ncfsm_event_t ev,
                     void *arg) {
  (void)arg;
  if (ncfsm_comm_rank(comm) == 0 && from >= NCFSM_STATE_READY)
    printf("  rank 0: %s -%s-> %s\n", ncfsm_state_name(from), ncfsm_event_name(ev),
           ncfsm_state_name(to));
}
/* [/on_state] */

static void on_done(ncfsm_work *w, ncfsm_result_t status, void *arg) {
  (void)arg;
  printf("  rank %d: work done: %s\n", ncfsm_comm_rank(ncfsm_work_comm(w)), ncfsm_err_name(status));
}

int main(void) {
  ncfsm_loop *loop;
  TRY(ncfsm_loop_new(NULL, &loop));
  ncfsm_comm *comm[NRANKS];
  void *buf[NRANKS];

  /* [watchdog] */
  ncfsm_comm_opts opts;
  TRY(ncfsm_comm_opts_init(&opts));
  opts.backend = NCFSM_BACKEND_SIM;
  opts.name = "skip";
  opts.timeout_ms = 200;   /* the watchdog's deadline (default 10 minutes) */
  opts.on_state = on_state;
  tutorial_comms(loop, &opts, comm, buf);

  printf("rank 0 calls an allreduce, rank 1 does not:\n");
  TRY(ncfsm_allreduce(comm[0], buf[0], buf[0], COUNT, NCFSM_INT32, NCFSM_OP_SUM, NULL, on_done,
                      NULL, NULL));
  TRY(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT));   /* until the watchdog ends it */
  printf("rank 0 failed: %s\n", ncfsm_comm_failure(comm[0]));
  /* rank 1 was told (verification, on by default): its comm failed too, naming rank 0 */
  printf("rank 1 is %s: %s\n", ncfsm_state_name(ncfsm_comm_state(comm[1])), ncfsm_comm_failure(comm[1]));
  for (int r = 0; r < NRANKS; r++) {
    TRY(ncfsm_mem_free(comm[r], buf[r]));
    TRY(ncfsm_comm_release(comm[r]));   /* both are CLOSED: the default policy aborted them */
  }
  /* [/watchdog] */

  /* [stay] */
  ncfsm_sim_opts so;
  TRY(ncfsm_sim_opts_init(&so));
  so.async_error_at_op = 0;        /* the sim: op 0 ends in an async error (ncclRemoteError) */
  opts.sim = &so;
  opts.name = "stay";
  opts.on_error = NCFSM_ON_ERROR_STAY;
  tutorial_comms(loop, &opts, comm, buf);

  printf("an allreduce that the backend fails:\n");
  TRY(ncfsm_group_start(loop));
  for (int r = 0; r < NRANKS; r++)
    TRY(ncfsm_allreduce(comm[r], buf[r], buf[r], COUNT, NCFSM_INT32, NCFSM_OP_SUM, NULL, on_done,
                        NULL, NULL));
  TRY(ncfsm_group_end(loop));
  TRY(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT));
  printf("rank 0 is %s, backend error %d\n", ncfsm_state_name(ncfsm_comm_state(comm[0])),
         ncfsm_comm_backend_error(comm[0]));
  ncfsm_result_t st = ncfsm_allreduce(comm[0], buf[0], buf[0], COUNT, NCFSM_INT32, NCFSM_OP_SUM,
                                      NULL, on_done, NULL, NULL);
  printf("another allreduce: %s\n  %s\n", ncfsm_err_name(st), ncfsm_last_error());
  for (int r = 0; r < NRANKS; r++) {
    TRY(ncfsm_mem_free(comm[r], buf[r]));
    TRY(ncfsm_comm_abort(comm[r]));
    TRY(ncfsm_comm_release(comm[r]));
  }
  /* [/stay] */
  TRY(ncfsm_loop_close(loop));
  return 0;
}
