/*
 * The sim's communicator side, shared by the files that implement the
 * backend's communicator calls (core/sim/, docs/sim.md):
 *
 *   sim.c         process-wide state, fork, WARNs, options and the modelled
 *                 version, cliques, a comm's teardown helpers, the backend table
 *   sim_init.c    init (R1) and ncclCommInitRankScalable
 *   sim_group.c   thread-local groups (R3) and the blocking waits of a group end
 *   sim_launch.c  posting launch units, the drift limit (R13), phases, the poll (R1, R2)
 *   sim_ops.c     argument checks and operations
 *   sim_close.c   finalize, destroy, abort, revoke (R4, R5, R6)
 *   sim_xcomm.c   split, shrink and grow calls: their checks and their one body (R7, R8)
 *   sim_xrdv.c    the rendezvous of a split, shrink or grow and the child it makes
 *
 * Every function here expects ncfsm__sim_mu held unless its comment says
 * otherwise (the ncfsm__backend entry points take it themselves).
 */
#ifndef NCFSM_CORE_SIM_COMM_H
#define NCFSM_CORE_SIM_COMM_H

#include "core/sim/sim-internal.h"

enum {
  OK = NCFSM__NCCL_SUCCESS,
  E_SYSTEM = NCFSM__NCCL_SYSTEM_ERROR,
  E_ARG = NCFSM__NCCL_INVALID_ARGUMENT,
  E_USAGE = NCFSM__NCCL_INVALID_USAGE,
  E_REMOTE = NCFSM__NCCL_REMOTE_ERROR,
  IN_PROGRESS = NCFSM__NCCL_IN_PROGRESS
};

#define R2_WARN "Attempt to use communicator before the previous operation returned ncclSuccess"
#define MIX_WARN "Blocking and nonblocking communicators are not allowed in the same group."
#define SHRUNK_WARN "communicator was shrunk with NCCL_SHRINK_ABORT; only ncclCommGetAsyncError and ncclCommAbort are allowed on it now (R7)"

#define LOCK() pthread_mutex_lock(&ncfsm__sim_mu)
#define UNLOCK() pthread_mutex_unlock(&ncfsm__sim_mu)

/* ---- sim.c ------------------------------------------------------------------------------ */
/* "ncclInvalidArgument"; "ncclResult(?)" beyond ncclTimeout. */
const char *ncfsm__sim_res_name(int code);
/* "AllReduce", ...; "op" for a kind out of range. */
const char *ncfsm__sim_op_name(int kind);
/* The sim options of an init-like call: *so, or the defaults and the
 * environment (ncfsm_sim_opts_init) when so is NULL; and the process-wide
 * settings, which must parse too. OK, or ncclInvalidArgument with the WARN
 * "<call>: NCFSM_SIM_WAIT_MS=abc: ..." (the settings message). */
int ncfsm__sim_call_opts(const ncfsm_sim_opts *so, ncfsm_sim_opts *o, const char *call);
/* NCFSM_SIM_WAIT_MS (default 30000): what bounds every blocking wait. */
long long ncfsm__sim_wait_ms(void);
/* Now + NCFSM_SIM_WAIT_MS, in ncfsm__now_ns time. */
uint64_t ncfsm__sim_deadline(void);
/* One step of a blocking wait: the lock is released for 1 ms. */
void ncfsm__sim_nap(void);
/* The modelled NCCL version (NCFSM_SIM_NCCL_VERSION, default 22809). */
int ncfsm__sim_version(void);
/* ncclCommGrow for a comm with these options: NCCL 2.29, or has_grow. */
int ncfsm__sim_grow_ok(const ncfsm_sim_opts *o);
/* 16 random bytes; -1 when getrandom failed (errno). No lock needed. */
int ncfsm__sim_random_key(unsigned char *key);
/* Registers the fork handlers (once per process). */
void ncfsm__sim_atfork_once(void);
/* c belongs to the process this one was forked from. */
int ncfsm__sim_foreign(const sim_comm *c);
/* The WARN and ncclInvalidUsage of a call on a foreign comm. */
int ncfsm__sim_foreign_reject(sim_comm *c, const char *call);
/* The live sim comm bcomm is, or NULL. */
sim_comm *ncfsm__sim_comm_of(void *bcomm);
/* Ranks that ever joined the clique, in any process. */
int ncfsm__sim_clique_joined(sim_clique *q);
/* This process's handle on clique `key`, or NULL. */
sim_clique *ncfsm__sim_clique_find(const unsigned char *key);
/* Drop every op of c not executed yet (R5: streams drain without data). */
void ncfsm__sim_drop_ops(sim_comm *c);
void ncfsm__sim_comm_free(sim_comm *c);
/* Remove c for good (destroy, abort); a comm in an open group stays a zombie until its end. */
void ncfsm__sim_comm_close(sim_comm *c);
/* R2/R3 poisoning of a nonblocking comm. */
void ncfsm__sim_poison(sim_comm *c);
/* c has posted ops that did not complete. */
int ncfsm__sim_unfinished(const sim_comm *c);

/* ---- sim_init.c ---------------------------------------------------------------------------- */
/* Make rank `rank` of clique `key` (InProgress in its init phase, not armed). */
int ncfsm__sim_comm_make(sim_comm **out, int nranks, const unsigned char *key, int rank, int blocking,
                         int device, const ncfsm_sim_opts *so, const char *name, const char *call);
/* comm_make after the R2 and R3 checks of an init-like call. */
int ncfsm__sim_comm_create(sim_comm **out, int nranks, const unsigned char *key, int rank,
                           const ncfsm__comm_config *cfg, const char *call);
/* An init-like call (init, a joining grow) made c, or failed with rc: c joins
 * the thread's group, its init completes (blocking) or arms (nonblocking) at
 * the outermost group end; *out = c. Returns the call's result. */
int ncfsm__sim_init_end(int implicit, sim_comm *c, int rc, void **out);
int ncfsm__sim_comm_init(void **bcomm, int nranks, const ncfsm_unique_id *id, int rank,
                         const ncfsm__comm_config *cfg);
int ncfsm__sim_comm_init_scalable(void **bcomm, int nranks, const ncfsm_unique_id *ids, int nids, int rank,
                                  const ncfsm__comm_config *cfg);

/* ---- sim_group.c --------------------------------------------------------------------------- */
/* c takes part in the thread's open group, which takes c's blocking mode. */
void ncfsm__sim_group_join(sim_comm *c);
/* A call failed with rc (c: its comm, or NULL): the group remembers it (R3). */
void ncfsm__sim_group_fail(sim_comm *c, int rc);
/* R3: ncclInvalidArgument (with the WARN) when blocking differs from the group's mode. */
int ncfsm__sim_group_mode_check(int blocking);
/* The mode check of an op: an op overwrites a mode a refused destroy left dirty (taskAppend). */
int ncfsm__sim_group_op_mode_check(int blocking);
/* R4 cascade: a refused destroy leaves the thread's mode blocking (dirty). */
void ncfsm__sim_group_leave_dirty(void);
/* In a forked child: forget the forking thread's open group. */
void ncfsm__sim_group_forked(void);
/* A call outside an explicit group is an implicit group of one. */
int ncfsm__sim_implicit_begin(void);
int ncfsm__sim_implicit_end(int implicit);
/* The end of a call that starts a phase on c (init, split, shrink, grow) or
 * failed with rc (c may be NULL then): its implicit group; returns the
 * call's result (R1: nonblocking -> c's async state; blocking -> the group
 * end's; inside an explicit group ncclSuccess). */
int ncfsm__sim_call_end(int implicit, sim_comm *c, int rc);
int ncfsm__sim_group_start(void);
int ncfsm__sim_group_end(void);

/* ---- sim_launch.c -------------------------------------------------------------------------- */
/* Post a unit: match indices, streams, visible to peers; faults are injected here. */
void ncfsm__sim_post(sim_comm *c, sim_unit *u);
/* R13: n more ops would raise c's unexecuted ops above its drift limit. */
int ncfsm__sim_drift_over(const sim_comm *c, size_t n);
/* c leaves its launch group (R13). */
void ncfsm__sim_lg_leave(sim_comm *c);
/* The comm of c's group end whose staged launch is over its drift limit, or NULL. */
sim_comm *ncfsm__sim_launch_held_by(sim_comm *c);
void ncfsm__sim_note_held(sim_comm *c, const sim_comm *by);
/* Post c's staged unit; the launch's final async state. */
int ncfsm__sim_launch_post(sim_comm *c);
/* The InProgress phase ends with `final` (R2 poisoning applied). */
void ncfsm__sim_phase_end(sim_comm *c, int final);
int ncfsm__sim_get_async_error(void *bcomm, int *state);

/* ---- sim_ops.c, sim_close.c ------------------------------------------------------------------ */
int ncfsm__sim_op(void *bcomm, const ncfsm__op *op);
int ncfsm__sim_finalize(void *bcomm);
int ncfsm__sim_destroy(void *bcomm);
int ncfsm__sim_abort(void *bcomm);
int ncfsm__sim_revoke(void *bcomm, int flags);

/* ---- sim_xcomm.c ---------------------------------------------------------------------------- */
extern const char *const ncfsm__sim_xcall[SIM_X_KINDS]; /* "ncclCommSplit", ... */
int ncfsm__sim_comm_split(void *parent, int color, int key, void **child, const ncfsm__comm_config *cfg);
int ncfsm__sim_comm_shrink(void *parent, const int *exclude, int nexclude, void **child,
                           const ncfsm__comm_config *cfg, int flags);
int ncfsm__sim_comm_get_unique_id(void *bcomm, ncfsm_unique_id *id);
int ncfsm__sim_comm_grow(void *parent, int nranks, const ncfsm_unique_id *id, int rank, void **child,
                         const ncfsm__comm_config *cfg);
int ncfsm__sim_comm_rank_size(void *bcomm, int *rank, int *size);

/* ---- sim_xrdv.c ----------------------------------------------------------------------------- */
void ncfsm__sim_xop_free(sim_xop *x);
/* The hash every survivor of a shrink must agree on (exclude sorted). */
uint64_t ncfsm__sim_exclude_hash(const int *exclude, int n);
/* Grow cliques this process had a rank of: 1 when key is one (ids are single-use). */
int ncfsm__sim_grow_done(const unsigned char *key);
void ncfsm__sim_grow_mark(const unsigned char *key);
/* 1 when a rank of c's clique already passed grow id `key`. */
int ncfsm__sim_grow_used(sim_comm *c, const unsigned char *key);
/* Publish this rank's record and put c in the split/shrink/grow phase. Takes x. */
int ncfsm__sim_xop_start(sim_comm *c, sim_xop *x);
/* 1: every member made this call; 0: not yet; -code: it cannot complete. */
int ncfsm__sim_xop_ready(sim_comm *c);
/* Every member made the call: make this rank's child (or none) and write it. */
int ncfsm__sim_xop_finish(sim_comm *c);
/* Outermost group end, blocking parents: the rendezvous and the blocking children's inits. */
int ncfsm__sim_wait_xops(sim_comm *list);

#endif
