/* The progress timer (fsm/timer.def) bound to libevent: the adaptive poll
 * schedule of a loop. */
#include <limits.h>
#include <event2/event.h>

#include "fsm/loop-int.h"

static uint64_t quiet_ns(const ncfsm_loop *loop) { return ncfsm__now_ns() - loop->burst_start_ns; }

static bool immediate(const ncfsm_loop *loop) {
  return loop->poll_iter < loop->opts.poll_burst || quiet_ns(loop) < (uint64_t)loop->opts.poll_burst_us * 1000;
}

static bool timer_guard(const void *obj, unsigned g, const void *payload) {
  ncfsm_loop *loop = (ncfsm_loop *)obj;
  (void)payload;
  switch (g) {
    case NCFSM__TG_ANY: return true;
    case NCFSM__TG_IMMEDIATE_OWN: return loop->own_base && immediate(loop);
    case NCFSM__TG_IMMEDIATE: return immediate(loop);
    case NCFSM__TG_COVERED:
      return !immediate(loop) && ncfsm__push_covers(loop) &&
             (loop->opts.completion == NCFSM_COMPLETION_PUSH || quiet_ns(loop) >= (uint64_t)loop->opts.push_after_us * 1000);
    case NCFSM__TG_COUNT: break;
  }
  return false;
}

static void timer_fire(ncfsm_loop *loop, ncfsm__timer_event_t ev);

#define ACT(name) static void tact_##name(void *obj, void *payload)
#define LOOP ncfsm_loop *loop = obj; (void)payload

ACT(arm_now) {
  LOOP;
  if (loop->poll_iter < UINT_MAX) loop->poll_iter++;
  /* The thread that drives the loop turns it directly (ncfsm_loop_run, the
   * loop thread), yielding the CPU first, without an epoll_wait. */
  if (loop->running && !pthread_equal(loop->runner, pthread_self())) loop->ops->wake(loop);
}
ACT(arm_soon) {
  LOOP;
  if (loop->poll_iter < UINT_MAX) loop->poll_iter++;
  struct timeval tv = {0, 0};
  evtimer_add(loop->ev_poll, &tv);
}
ACT(arm_backoff) {
  LOOP;
  unsigned long us = loop->backoff >= 20 ? loop->opts.poll_max_us : (1ul << loop->backoff);
  if (us > loop->opts.poll_max_us) us = loop->opts.poll_max_us;
  loop->backoff++;
  struct timeval tv = {0, (suseconds_t)us};
  evtimer_add(loop->ev_poll, &tv);
}
ACT(arm_push) {
  LOOP;
  if (!ncfsm__push_arm_streams(loop)) {
    timer_fire(loop, NCFSM__TE_PUSH_FAILED);
    return;
  }
  struct timeval tv = {(time_t)(loop->opts.push_fallback_us / 1000000),
                       (suseconds_t)(loop->opts.push_fallback_us % 1000000)};
  evtimer_add(loop->ev_poll, &tv);
}
ACT(restart_burst) {
  LOOP;
  loop->poll_iter = 0;
  loop->backoff = 0;
  loop->burst_start_ns = ncfsm__now_ns();
}
ACT(restart_disarm) {
  LOOP;
  tact_restart_burst(obj, payload);
  evtimer_del(loop->ev_poll);
}

static void (*const timer_acts[NCFSM__TA_COUNT])(void *, void *) = {
#define NCFSM_ACTION(name, desc) [NCFSM__TA_##name] = tact_##name,
#define tact_none NULL
#include "fsm/timer.def"
#undef tact_none
};

static const ncfsm__binding timer_binding = {&ncfsm__m_timer, timer_guard, timer_acts, NULL, NULL};

static void timer_fire(ncfsm_loop *loop, ncfsm__timer_event_t ev) {
  if (!ncfsm__m_fire(&timer_binding, loop, &loop->timer_state, ev, NULL))
    NCFSM_LOG(NCFSM__LOG_ERROR, NCFSM__SUB_LOOP, "progress timer: invalid event %s in state %s (engine defect)",
              ncfsm__m_timer.events[ev].name, ncfsm__m_timer.states[loop->timer_state].name);
}

void ncfsm__timer_after_turn(ncfsm_loop *loop, bool progress) {
  if (!(progress || loop->timer_state == NCFSM__TS_IDLE) || !ncfsm__poll_pending(loop)) return;
  if (progress) timer_fire(loop, NCFSM__TE_PROGRESS);
  timer_fire(loop, NCFSM__TE_ARM);
}

void ncfsm__timer_turn(ncfsm_loop *loop, bool from_timer) {
  if (from_timer) timer_fire(loop, NCFSM__TE_FIRED);
  else if (loop->timer_state == NCFSM__TS_NOW) timer_fire(loop, NCFSM__TE_DIRECT);
}

