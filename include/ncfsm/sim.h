/* The sim backend's introspection, for users' unit tests (no GPU needed).
 * The sim is a model of NCCL 2.28 nonblocking behaviour, not NCCL: see
 * docs/sim.md for what it reproduces and what it does not. */
#ifndef NCFSM_SIM_H
#define NCFSM_SIM_H

#include <stdint.h>

#include "ncfsm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How often the engine reached the sim for one communicator. */
typedef struct ncfsm_sim_stats {
  uint64_t inits, polls, ops, group_starts, group_ends, finalizes, destroys, aborts, revokes;
  uint64_t splits, shrinks, grows; /* calls made on this comm as the parent (grow: also a joiner's) */
  uint64_t rejected; /* calls the sim (as NCCL) rejected */
  uint64_t executed; /* ops whose data movement ran */
  int async_state;   /* current ncclResult_t async state */
} ncfsm_sim_stats;

/* NCFSM_ERR_INVALID_ARGUMENT when comm is not a sim communicator or has no
 * backend communicator yet (NEW). */
ncfsm_result_t ncfsm_sim_get_stats(const ncfsm_comm *comm, ncfsm_sim_stats *out);

#ifdef __cplusplus
}
#endif
#endif
