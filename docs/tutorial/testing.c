/* docs/tutorial/testing.c: testing a program's error handling with the
 * testing kit (docs/tutorial.md, "Testing with the kit"; docs/testing.md).
 * The program under test is run_step(); the test injects an async error
 * into rank 1's first op and checks what the program did. With --wrong the
 * test expects a path the comm does not take, to show a failed check. */
#include <string.h>

#include <ncfsm/testing.h>

#include "tutorial.h"

/* [program] */
/* The program under test: one step of a job, an AllReduce over the ranks
 * of this process, each work given 300 ms. Counts the works that succeeded
 * and failed, then closes every communicator, failed or not. */
struct step {
  int ok, failed;
};

static void step_done(ncfsm_work *w, ncfsm_result_t status, void *arg) {
  (void)w;
  struct step *s = arg;
  if (status == NCFSM_OK)
    s->ok++;
  else
    s->failed++;
}

static void run_step(ncfsm_loop *loop, const char *name, struct step *s) {
  ncfsm_comm_opts opts;
  TRY(ncfsm_comm_opts_init(&opts));
  opts.backend = NCFSM_BACKEND_SIM;
  opts.name = name;
  opts.timeout_ms = 300;   /* a step that takes longer has failed */
  ncfsm_comm *comm[NRANKS];
  TRY(ncfsm_comm_init_all(loop, NRANKS, &opts, (int[]){0, 1}, comm));
  int32_t host[COUNT] = {1, 2, 3, 4};
  void *buf[NRANKS];
  for (int r = 0; r < NRANKS; r++) {
    TRY(ncfsm_mem_alloc(comm[r], sizeof host, &buf[r]));
    TRY(ncfsm_memcpy(comm[r], buf[r], host, sizeof host, 1));
  }
  TRY(ncfsm_group_start(loop));
  for (int r = 0; r < NRANKS; r++)
    TRY(ncfsm_allreduce(comm[r], buf[r], buf[r], COUNT, NCFSM_INT32, NCFSM_OP_SUM, NULL, step_done,
                        s, NULL));
  TRY(ncfsm_group_end(loop));
  TRY(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT));
  for (int r = 0; r < NRANKS; r++) {
    TRY(ncfsm_mem_free(comm[r], buf[r]));
    TRY(ncfsm_comm_close(comm[r], NULL, NULL));
  }
  TRY(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT));
}
/* [/program] */

int main(int argc, char **argv) {
  int wrong = argc > 1 && strcmp(argv[1], "--wrong") == 0;
  /* [test] */
  ncfsm_test_opts to;
  ncfsm_test_opts_init(&to);
  to.name = "tutorial.async_error";
  to.seed = 7;   /* NCFSM_TEST_SEED=S replays another seed */
  ncfsm_test *t;
  TRY(ncfsm_test_begin(&to, &t));

  ncfsm_fault f;
  ncfsm_fault_init(&f, NCFSM_FAULT_ASYNC_ERROR);
  f.comm = "step";   /* the comms whose opts.name is "step" */
  f.rank = 1;
  f.at = 0;          /* its op 0 (when = NCFSM_AT_OP) */
  int fault = ncfsm_test_add_fault(t, &f);

  ncfsm_loop *loop;
  TRY(ncfsm_loop_new(NULL, &loop));
  TRY(ncfsm_test_record(t, loop));   /* every transition becomes a trace line */
  struct step s = {0, 0};
  run_step(loop, "step", &s);        /* the program, unchanged */
  ncfsm_test_unrecord(t, loop);
  TRY(ncfsm_loop_close(loop));

  const char *want[] = {"step r1: LAUNCH_IN_PROGRESS -ASYNC_ERROR-> ERROR NCFSM_ERR_ASYNC",
                        "step r1 w0 seq 0: * -> FAILED NCFSM_ERR_ASYNC"};
  ncfsm_test_expect_lines(t, want, 2);
  ncfsm_test_expect_path(t, "step", 1,
                         wrong ? "NEW * FINALIZED CLOSING CLOSED RELEASED" : "NEW * ERROR * CLOSED RELEASED");
  ncfsm_test_expect_fired(t, fault, 1, 1);
  ncfsm_test_expect_final_once(t);   /* every work ended exactly once */
  ncfsm_test_check(t, s.failed >= 1, "the program saw %d failed works", s.failed);

  char path[512];
  ncfsm_test_comm_path(t, "step", 1, path, sizeof path);
  printf("step rank 1: %s\n", path);
  printf("works: %d ok, %d failed\n", s.ok, s.failed);
  int failed = ncfsm_test_end(t);
  printf("%d failed checks\n", failed);
  return failed ? 1 : 0;
  /* [/test] */
}
