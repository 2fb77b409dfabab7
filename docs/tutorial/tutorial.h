/* docs/tutorial/tutorial.h: what the tutorial's programs share
 * (docs/tutorial.md). TRY(call): on a result other than NCFSM_OK, print the
 * call, the code and ncfsm_last_error() (why this thread's last call
 * failed: the state, the call and what to do) and exit 1. */
#ifndef NCFSM_TUTORIAL_H
#define NCFSM_TUTORIAL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <ncfsm.h>

#define TRY(call)                                                                      \
  do {                                                                                 \
    ncfsm_result_t try_r_ = (call);                                                    \
    if (try_r_ != NCFSM_OK) {                                                          \
      fprintf(stderr, "%s:%d: %s: %s\n  %s\n", __FILE__, __LINE__, #call,              \
              ncfsm_err_name(try_r_), ncfsm_last_error());                             \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

#define NRANKS 2 /* the ranks of the one-process programs */
#define COUNT 4  /* int32 elements per buffer */

/* ncfsm_comm_close's callback: on the loop's thread, once the comm is
 * released (first.c, ranks.c). */
/* [closed] */
static inline void on_closed(ncfsm_comm *comm, ncfsm_result_t status, void *arg) {
  (void)arg;
  printf("rank %d: closed: %s\n", ncfsm_comm_rank(comm), ncfsm_err_name(status));
}
/* [/closed] */

/* The NRANKS ranks of one communicator in this process (opts), READY; with
 * buf, a buffer of COUNT int32 per rank holding 1, 2, 3, 4. */
static inline void tutorial_comms(ncfsm_loop *loop, const ncfsm_comm_opts *opts, ncfsm_comm **comm,
                                  void **buf) {
  TRY(ncfsm_comm_init_all(loop, NRANKS, opts, (int[]){0, 1}, comm));
  int32_t host[COUNT] = {1, 2, 3, 4};
  for (int r = 0; r < NRANKS; r++) {
    TRY(ncfsm_comm_wait_state(comm[r], NCFSM_STATE_READY, 0));
    if (!buf) continue;
    TRY(ncfsm_mem_alloc(comm[r], sizeof host, &buf[r]));
    TRY(ncfsm_memcpy(comm[r], buf[r], host, sizeof host, 1));
  }
}

/* A loop and the NRANKS ranks of a sim communicator named name on it, as
 * tutorial_comms makes them (groups.c, steps.c). */
static inline void tutorial_start(const char *name, ncfsm_loop **loop, ncfsm_comm **comm, void **buf) {
  TRY(ncfsm_loop_new(NULL, loop));
  ncfsm_comm_opts opts;
  TRY(ncfsm_comm_opts_init(&opts));
  opts.backend = NCFSM_BACKEND_SIM;
  opts.name = name;
  tutorial_comms(*loop, &opts, comm, buf);
}

#endif
