/* 07_testing: the trainer (trainer.h) on its own: runs its steps on the
 * sim (no GPU: NCFSM_BACKEND=auto picks it) or on NCCL, and prints its
 * report. Its tests are in trainer_test.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"

int main(int argc, char **argv) {
  trainer_opts o;
  trainer_opts_init(&o);
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--ranks")) o.nranks = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--steps")) o.steps = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "usage: %s [--ranks N] [--steps N]\n", argv[0]);
      return 2;
    }
  }
  ncfsm_loop *loop;
  if (ncfsm_loop_new(NULL, &loop) != NCFSM_OK) return 1;
  static trainer_report r;
  int rc = trainer_run(loop, &o, &r);
  printf("steps %d/%d, attempts %d, recoveries %d, corrupt %d, gave up %d%s%s\n", r.steps_done, o.steps,
         r.attempts, r.recoveries, r.corrupt, r.gave_up, r.gave_up ? ": " : "", r.gave_up ? r.why : "");
  ncfsm_loop_close(loop);
  return rc ? 1 : 0;
}
