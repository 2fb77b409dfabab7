/*
 * The sim backend's entry points beyond the backend table (core/backend.h).
 * The sim is a deterministic model of NCCL 2.28 nonblocking behaviour, a
 * test double and not NCCL: see docs/sim.md.
 */
#ifndef NCFSM_CORE_SIM_SIM_H
#define NCFSM_CORE_SIM_SIM_H

#include "ncfsm/sim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fill *out with the counters of one sim communicator (a bcomm returned by
 * ncfsm__backend_sim.comm_init). Returns 0, or ncclInvalidArgument (4) when
 * bcomm is not a live sim communicator or out is NULL. Thread-safe. */
int ncfsm__sim_stats(void *bcomm, ncfsm_sim_stats *out);

#ifdef __cplusplus
}
#endif
#endif
