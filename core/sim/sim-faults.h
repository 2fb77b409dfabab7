/*
 * The sim's fault plan: a process-wide registry that the testing kit
 * (testkit/, include/ncfsm/testing.h) fills, and the hooks through which the
 * sim applies it (core/sim/sim_faults.c; docs/testing.md, docs/sim.md
 * "Fault plans"). Private: the sim and testkit/ only.
 *
 * A sim comm binds to the plan when it is created (comm_make): the plan's
 * sim options for its name and rank replace its own, the deterministic mode
 * seeds its shuffle and poll jitter, and the faults that match it are copied
 * into its sim_fstate. Faults fire only while the plan that made them is
 * active (its generation): ncfsm__sim_plan_end stops them all.
 *
 * Every function expects ncfsm__sim_mu held, except the ncfsm__sim_plan_*
 * calls, which take it.
 */
#ifndef NCFSM_CORE_SIM_FAULTS_H
#define NCFSM_CORE_SIM_FAULTS_H

#include <stddef.h>
#include <stdint.h>

#include "core/sim/sim-internal.h"
#include "ncfsm/testing.h"

/* ---- the registry (testkit/) --------------------------------------------------------- */
/* Install an empty plan. -1 when one is active already. */
int ncfsm__sim_plan_begin(uint64_t seed, int deterministic, int jitter);
/* Remove it: no fault fires any more; options already applied stay. */
void ncfsm__sim_plan_end(void);
/* A fault (validated by the caller; f->comm is copied); ph: for AT_STATE,
 * the phase of f->state (the engine's table knows which call a state
 * polls: the caller translates). Its id, or -1 (no plan, out of memory). */
int ncfsm__sim_plan_add_fault(const ncfsm_fault *f, sim_phase ph);
/* Sim options for comms named comm (NULL/"": all) of rank (-1: all). 0 or -1. */
int ncfsm__sim_plan_set_opts(const char *comm, int rank, const ncfsm_sim_opts *so);
/* How often fault id fired under the active plan (0 without one). */
uint64_t ncfsm__sim_plan_fired(int id);

/* ---- the hooks (sim.c) ----------------------------------------------------------------- */
typedef struct sim_fstate sim_fstate;

/* comm_make: apply the plan to the options of a new comm (before its clique
 * is attached: the shuffle seed); the comm's fault state, or NULL when no
 * plan is active. */
sim_fstate *ncfsm__sim_fault_bind(ncfsm_sim_opts *o, const char *name, int rank);
void ncfsm__sim_fault_free(sim_fstate *fs);
/* A phase starts with `countdown` polls (nops: the ops of a launch, else 0):
 * returns the countdown to use (jitter, slow ranks, an init that hangs) and
 * arms the phase's faults. */
int ncfsm__sim_fault_phase(sim_comm *c, sim_phase ph, int countdown, size_t nops);
/* The phase ends with `final`: returns it, or an injected error. */
int ncfsm__sim_fault_phase_end(sim_comm *c, int final);
/* A launch unit of n ops is about to be posted (ops c->nposted..): a KILL fires here. */
void ncfsm__sim_fault_unit(sim_comm *c, size_t n);
/* Op `seq` is being posted (first: the first op of its unit): may set
 * c->o.never_arrive / c->o.dead; returns an async error code for it, or 0. */
int ncfsm__sim_fault_op(sim_comm *c, uint64_t seq, int first, int collective);
/* Its shared descriptor was filled: an injected mismatch changes it (shm locked). */
void ncfsm__sim_fault_desc(sim_comm *c, uint64_t seq, shm_op *s);
/* 1 while m's launch is slowed by a SLOW fault and its countdown runs: the
 * group end it belongs to stays InProgress for every comm of it (NCCL's one
 * helper thread launches a group end's comms together). */
int ncfsm__sim_fault_holds(const sim_comm *m);
/* A poll of the async state (before the phase's tick). */
void ncfsm__sim_fault_poll(sim_comm *c);

#endif
