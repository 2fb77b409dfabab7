/* docs/tutorial/first.c: the tutorial's first program (docs/tutorial.md,
 * "The first program"). Two ranks in one process on the sim backend: an
 * AllReduce with a completion callback, an illegal call and the message it
 * gets, and the teardown. The lines between the [name] and [/name] markers
 * are the tutorial's code blocks (tests/docs/check_runs.py compares them). */
#include "tutorial.h"

/* [callback] */
struct rank_data {
  int rank;
  int32_t host[COUNT];
  void *buf;
};

/* Runs on the loop's thread, once, with the work's final status. */
static void on_done(ncfsm_work *w, ncfsm_result_t status, void *arg) {
  struct rank_data *d = arg;
  printf("rank %d: allreduce done: %s, seq %llu\n", d->rank, ncfsm_err_name(status),
         (unsigned long long)ncfsm_work_fingerprint(w)->seq);
}
/* [/callback] */

int main(void) {
  /* [init] */
  ncfsm_loop *loop;
  TRY(ncfsm_loop_new(NULL, &loop));

  ncfsm_comm_opts opts;
  TRY(ncfsm_comm_opts_init(&opts));   /* defaults, then the NCFSM_* environment */
  opts.backend = NCFSM_BACKEND_SIM;   /* AUTO: NCCL when a GPU is visible */
  opts.name = "first";

  ncfsm_comm *comm[NRANKS];
  int devices[NRANKS] = {0, 1};
  TRY(ncfsm_comm_init_all(loop, NRANKS, &opts, devices, comm));
  printf("after init_all: rank 0 is %s\n", ncfsm_state_name(ncfsm_comm_state(comm[0])));
  /* [/init] */

  /* [allreduce] */
  struct rank_data d[NRANKS];
  for (int r = 0; r < NRANKS; r++) {
    d[r].rank = r;
    for (int i = 0; i < COUNT; i++) d[r].host[i] = (r + 1) * (i + 1);
    TRY(ncfsm_mem_alloc(comm[r], sizeof d[r].host, &d[r].buf));   /* device memory on NCCL */
    TRY(ncfsm_memcpy(comm[r], d[r].buf, d[r].host, sizeof d[r].host, 1));
  }

  TRY(ncfsm_group_start(loop));   /* one thread drives both ranks: one group */
  for (int r = 0; r < NRANKS; r++)
    TRY(ncfsm_allreduce(comm[r], d[r].buf, d[r].buf, COUNT, NCFSM_INT32, NCFSM_OP_SUM,
                        NULL, on_done, &d[r], NULL));
  TRY(ncfsm_group_end(loop));
  printf("after group_end: rank 0 is %s\n", ncfsm_state_name(ncfsm_comm_state(comm[0])));

  TRY(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT));   /* until nothing is pending */
  for (int r = 0; r < NRANKS; r++) {
    TRY(ncfsm_memcpy(comm[r], d[r].host, d[r].buf, sizeof d[r].host, 0));
    printf("rank %d: %d %d %d %d\n", r, d[r].host[0], d[r].host[1], d[r].host[2], d[r].host[3]);
  }
  /* [/allreduce] */

  /* [illegal] */
  ncfsm_result_t st = ncfsm_comm_release(comm[0]);   /* the comm is live: refused */
  printf("release: %s\n  %s\n", ncfsm_err_name(st), ncfsm_last_error());
  printf("rank 0 is still %s\n", ncfsm_state_name(ncfsm_comm_state(comm[0])));
  /* [/illegal] */

  /* [teardown] */
  for (int r = 0; r < NRANKS; r++) {
    TRY(ncfsm_mem_free(comm[r], d[r].buf));
    TRY(ncfsm_comm_close(comm[r], on_closed, NULL));   /* finalize, destroy, release */
  }
  TRY(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT));   /* returns once both callbacks ran */
  TRY(ncfsm_loop_close(loop));
  printf("loop closed\n");
  /* [/teardown] */
  return 0;
}
