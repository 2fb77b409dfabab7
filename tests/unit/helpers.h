/* Shared fixtures for the sim-backed unit tests. */
#ifndef NCFSM_TEST_HELPERS_H
#define NCFSM_TEST_HELPERS_H

#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ncfsm.h"
#include "ncfsm/sim.h"

#define NEVER (1 << 30) /* sim polls that never finish */

/* A recorded trace of comm transitions. */
typedef struct trace_log {
  int n;
  struct { const void *obj; int rank; int kind; int state, event, next; ncfsm_result_t result; } rec[4096];
} trace_log;
void trace_record(const ncfsm_trace_rec *r, void *arg);

void test_sim_opts(ncfsm_sim_opts *so);
void test_comm_opts(ncfsm_comm_opts *o, ncfsm_sim_opts *so);
/* A watchdog case: o (error policy STAY, watchdog timeout_ms) over so, and o1 the same over so1,
 * whose rank never arrives at its collectives (sim never_arrive). */
void test_stuck_opts(ncfsm_sim_opts *so, ncfsm_comm_opts *o, ncfsm_sim_opts *so1, ncfsm_comm_opts *o1,
                     uint64_t timeout_ms);
/* nranks comms of one clique on loop; every rank is initialised unless only_rank0. */
void make_comms(ncfsm_loop *loop, int n, ncfsm_comm_opts *o, ncfsm_comm **c, int only_rank0);
void run_turns(ncfsm_loop *loop, int n);
/* A new loop and n READY sim comms of one clique with the test defaults. */
ncfsm_loop *ready_comms(int n, ncfsm_comm **c);
/* The same with the caller's options. */
ncfsm_loop *ready_comms_with(int n, ncfsm_comm **c, ncfsm_comm_opts *o);
/* A work callback that counts per index (arg = (void *)(intptr_t)index). */
extern int cb_count[64];
extern ncfsm_result_t cb_status[64];
void count_cb(ncfsm_work *w, ncfsm_result_t st, void *arg);
void reset_cbs(void);
/* Run until comm is in state s (fails the test after many turns). */
void run_until_state(ncfsm_loop *loop, ncfsm_comm *c, ncfsm_state_t s);
/* Abort (when not closed) and release every comm, then close the loop. */
void teardown_all(ncfsm_loop *loop, ncfsm_comm **c, int n);
/* Count of backend calls for a comm (engine-side counter). */
uint64_t backend_calls(ncfsm_comm *c);
/* The comm has an NCCL (sim) communicator now. */
bool has_backend_comm(ncfsm_comm *c);

/* Sleeps ms milliseconds (nanosleep). */
void test_sleep_ms(long ms);
/* A free TCP port on the loopback (-1: none). */
int test_free_port(void);
/* n processes meeting through a TCP store at addr (rank 0 hosts it), as a launcher without
 * PMIx starts them: each gets NCFSM_STORE_ADDR, _TOKEN, NCFSM_RANK, NCFSM_WORLD_SIZE (and
 * NCFSM_STORE_HOST=1 on rank 0) and runs rank_main(rank, arg), its return value the exit code;
 * the parent waits for all and returns how many failed (each named on stderr). */
int test_run_tcp_ranks(int n, const char *token, int (*rank_main)(int rank, void *arg), void *arg);

#endif
