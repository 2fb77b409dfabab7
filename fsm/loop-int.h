/*
 * Layer 3 of the engine: the loop glue, the only code that calls libevent
 * (fsm/loop.c: the base, the wake and poll events, turns, running; fsm/push.c:
 * push completion's host functions; fsm/timer.c: the progress timer,
 * fsm/timer.def). Functions here run with loop->mu held unless their
 * comment says otherwise.
 */
#ifndef NCFSM_FSM_LOOP_INT_H
#define NCFSM_FSM_LOOP_INT_H

#include "fsm/engine.h"
#include "fsm/submit.h"

/* Deliver queued callbacks (state notes, work callbacks, ncfsm_loop_call)
 * with the lock dropped; drops and retakes the lock. */
void ncfsm__loop_flush_notes(ncfsm_loop *loop);
/* Anything at all to do: queued launches, callbacks, polls. */
bool ncfsm__loop_pending(ncfsm_loop *loop);
/* Without the lock: checks done(loop, arg), a pause between checks, until it
 * holds (true) or the clock passes end_ns (then: done, checked once more).
 * docs/design.md "Waiting threads spin first". */
bool ncfsm__spin(ncfsm_loop *loop, bool (*done)(ncfsm_loop *, unsigned), unsigned arg, uint64_t end_ns);

/* ---- timer.c ---- */
/* After a turn: restart the burst on progress, arm the schedule when
 * something is pending. */
void ncfsm__timer_after_turn(ncfsm_loop *loop, bool progress);
/* At the start of a turn: the timer fired (from_timer), or a direct turn
 * consumed an immediate re-poll. */
void ncfsm__timer_turn(ncfsm_loop *loop, bool from_timer);
/* An immediate re-poll is due (state NOW); inline: asked several times per run. */
static inline bool ncfsm__timer_now(const ncfsm_loop *loop) { return loop->timer_state == NCFSM__TS_NOW; }

/* ---- push.c ---- */
ncfsm_result_t ncfsm__push_new(ncfsm_loop *loop);   /* opts.completion PUSH or AUTO */
void ncfsm__push_detach(ncfsm_loop *loop);          /* loop close, without the lock */
/* Only works in flight wait: their streams can wake the loop. */
bool ncfsm__push_covers(ncfsm_loop *loop);
/* A host function after the last work of every stream with works in
 * flight and none since the last host function there; false when one
 * could not be enqueued (push completion is then off for this loop). */
bool ncfsm__push_arm_streams(ncfsm_loop *loop);

#endif
