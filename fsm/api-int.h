/*
 * Layer 4 of the engine: the public calls (fsm/api_*.c, fsm/api_split.c),
 * and what they share: handle checks, the thread's copy of a comm's
 * message, blocking waits, and running a blocking backend call on the
 * loop's thread.
 */
#ifndef NCFSM_FSM_API_INT_H
#define NCFSM_FSM_API_INT_H

#include "fsm/loop-int.h"

/* Every public call that takes the lock first takes the submissions other
 * threads handed off meanwhile (fsm/submit.h): a call never overtakes a
 * submission made before it (a close, a group start, a wait); and a group
 * the caller holds back from the loop becomes the loop's (fsm/held.def). */
#define NCFSM__LOCK(l)              \
  do {                              \
    pthread_mutex_lock(&(l)->mu);   \
    ncfsm__handoff_turn(l);         \
    ncfsm__held_spill_mine(l);      \
  } while (0)
#define NCFSM__UNLOCK(l) pthread_mutex_unlock(&(l)->mu)

static inline bool ncfsm__comm_ok(const ncfsm_comm *c) { return c && c->magic == NCFSM__COMM_MAGIC; }
static inline bool ncfsm__loop_ok(const ncfsm_loop *l) { return l && l->magic == NCFSM__LOOP_MAGIC; }
static inline bool ncfsm__work_ok(const ncfsm_work *w) { return w && w->magic == NCFSM__WORK_MAGIC; }

/* A copy of one of c's messages in a buffer of the calling thread, taken
 * under the loop's lock (the loop thread rewrites the comm's buffer once
 * the lock is released). */
const char *ncfsm__copy_msg(const ncfsm_comm *c, const char *src);

/* Block the caller until pred(arg) holds (under the lock), running the loop
 * if no other thread does. NCFSM_OK, NCFSM_ERR_AGAIN (the wait's own
 * timeout), NCFSM_ERR_ILLEGAL_STATE (nothing pending can make progress: a
 * deadlock the caller made) or NCFSM_ERR_INVALID_USAGE (called from inside
 * one of the loop's callbacks). Without the lock. */
ncfsm_result_t ncfsm__wait_until(ncfsm_loop *loop, bool (*pred)(void *), void *arg, uint64_t timeout_ms);

/* Run fn(arg) with the lock held on the thread that drives the loop: inline
 * when the caller may drive it, else on the loop thread while the caller
 * waits; the callbacks fn produced are delivered. fn may drop and retake
 * the lock around a blocking backend call. hold, when not NULL, is kept
 * alive meanwhile. Without the lock. */
void ncfsm__on_loop(ncfsm_loop *loop, ncfsm_comm *hold, void (*fn)(void *), void *arg);

/* The INIT step of ncfsm_comm_init / ncfsm_comm_init_boot (fsm/api_init.c),
 * with the lock: legality, arguments, the p2p counters, ev (INIT or
 * INIT_BOOT) with p's rank, size and unique id, a wakeup. */
ncfsm_result_t ncfsm__comm_init_step(ncfsm_comm *c, ncfsm_event_t ev, ncfsm__cev *p);

/* The calls' steps with the loop's lock held, for the protocols above
 * (fsm/recover.c): the caller drives the loop (abort, shrink and init_boot
 * drop and retake the lock around their blocking NCCL calls). */
ncfsm_result_t ncfsm__comm_new_locked(ncfsm_loop *loop, const ncfsm_comm_opts *opts, ncfsm_comm **out);
ncfsm_result_t ncfsm__comm_abort_locked(ncfsm_comm *c);
ncfsm_result_t ncfsm__comm_revoke_locked(ncfsm_comm *c);
ncfsm_result_t ncfsm__comm_release_locked(ncfsm_comm *c);
ncfsm_result_t ncfsm__comm_shrink_locked(ncfsm_comm *parent, const int *exclude, int nexclude, int flags,
                                         ncfsm_comm *child);

#endif
