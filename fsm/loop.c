/* The loop: a libevent base, the wakeup and poll events, turns, running
 * (ncfsm_loop_run, the loop thread), calls from other threads, closing, and
 * the delivery of callbacks on the loop thread. With fsm/timer.c and
 * fsm/push.c the only code that calls libevent (fsm/recover.c arms no
 * timers of its own). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT, PTHREAD_MUTEX_ADAPTIVE_NP */
#endif
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "core/settings.h"
#include "fsm/loop-int.h"

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static int evthread_rc;
static void evthread_init(void) { evthread_rc = evthread_use_pthreads(); }

/* ncfsm_loop_opts_init: core/settings_opts.c (from the settings table). */

static _Atomic uint64_t loop_ids;

/* Deliver queued callbacks with the lock dropped (callbacks may call ncfsm);
 * the references they held are dropped under one lock afterwards. */
void ncfsm__loop_flush_notes(ncfsm_loop *loop) {
  while (loop->notify_head || loop->snote_head || loop->calls_head) {
    struct ncfsm__state_note *sn = loop->snote_head;
    ncfsm_work *w = loop->notify_head;
    ncfsm__call_req *cr = loop->calls_head;
    loop->snote_head = loop->snote_tail = NULL;
    loop->notify_head = loop->notify_tail = NULL;
    loop->calls_head = loop->calls_tail = NULL;
    bool clk = ncfsm__turn_clock_pause(loop); /* the callbacks take their time */
    pthread_mutex_unlock(&loop->mu);
    for (struct ncfsm__state_note *n = sn; n; n = n->next)
      if (n->comm->opts.on_state)
        n->comm->opts.on_state(n->comm, n->from, n->to, n->ev, n->comm->opts.on_state_arg);
    for (ncfsm_work *x = w; x; x = x->next)
      if (x->cb) x->cb(x, x->status, x->arg);
    while (cr) {
      ncfsm__call_req *n = cr->next;
      cr->fn(cr->arg);
      free(cr);
      cr = n;
    }
    pthread_mutex_lock(&loop->mu);
    ncfsm__turn_clock_resume(loop, clk);
    while (sn) {
      struct ncfsm__state_note *n = sn->next;
      ncfsm__comm_unref(sn->comm);
      free(sn);
      sn = n;
    }
    while (w) {
      ncfsm_work *n = w->next;
      ncfsm__work_unref(w);
      w = n;
    }
  }
  ncfsm__loop_cv_broadcast(loop);
}

/* ---- the pools' idle timer ------------------------------------------------------------ */

static void arm_trim(ncfsm_loop *loop) {
  struct timeval tv = {NCFSM__POOL_IDLE_MS / 1000, (NCFSM__POOL_IDLE_MS % 1000) * 1000};
  loop->trim_allocs = loop->pool.allocs;
  if (event_add(loop->ev_trim, &tv) == 0) loop->trim_armed = true;
}

/* NCFSM__POOL_IDLE_MS after a turn left the pools above their keep: when no
 * work was allocated since, they go back to the allocator (and, past 1 MiB,
 * the C library returns its free pages to the system); else it looks again
 * one bound later. */
static void on_trim(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  ncfsm_loop *loop = arg;
  size_t bytes = 0;
  pthread_mutex_lock(&loop->mu);
  ncfsm__handoff_turn(loop); /* works waiting there were allocated: the pools are not idle */
  loop->trim_armed = false;
  if (loop->pool.allocs != loop->trim_allocs) {
    if (ncfsm__pool_over(loop)) arm_trim(loop); /* in use: not idle yet */
  } else {
    bytes = ncfsm__pool_trim(loop);
  }
  pthread_mutex_unlock(&loop->mu);
#ifdef __GLIBC__
  if (bytes >= (1u << 20)) malloc_trim(0);
#endif
}

/* One turn; the caller holds loop->mu (turn() takes it). */
static void turn_held(ncfsm_loop *loop, bool poll) {
  ncfsm_loop *outer;
  ncfsm__loop_enter_turn(loop, &outer);
  ncfsm__loop_set_runner(loop);
  ncfsm__turn_clock_resume(loop, true); /* this turn's clock (fsm/objects.h) */
  loop->wake_sent = false; /* this turn looks at whatever the wake was for */
  ncfsm__timer_turn(loop, poll);
  loop->kick = false;
  if (atomic_exchange(&loop->async_kick, 0)) { /* from another thread: which comm, it did not say */
    loop->ctl = true;
    ncfsm__enlist_all(loop);
  }
  ncfsm__attend_turn(loop); /* comms another thread gave something to look at */
  ncfsm__handoff_turn(loop); /* submissions made while the lock was taken (fsm/submit.h) */
  /* Progress (a state change, a completion) and a launch restart the
   * burst; the poll is armed once, at the end of the turn. */
  bool hint = ncfsm__progress(loop);
  if (ncfsm__launch(loop)) {
    hint = true;
    ncfsm__progress(loop); /* fast ops may be done already */
    if (loop->nqueued) loop->kick = true; /* the next batch may go at once */
  }
  ncfsm__loop_flush_notes(loop);
  /* A callback may have submitted work: launch it in this turn. */
  if (loop->nqueued) {
    if (ncfsm__launch(loop)) hint = true;
    ncfsm__loop_flush_notes(loop);
  }
  ncfsm__timer_after_turn(loop, hint);
  if (loop->ev_trim && !loop->trim_armed && ncfsm__pool_over(loop)) arm_trim(loop);
  ncfsm__turn_clock_pause(loop); /* outside a turn every read is fresh */
  ncfsm__loop_clear_runner(loop);
  ncfsm__loop_leave_turn(loop, outer);
}

static void turn(ncfsm_loop *loop, bool poll) {
  pthread_mutex_lock(&loop->mu);
  ncfsm__held_spill_mine(loop); /* this thread drives an embedded base: as ncfsm_loop_run */
  turn_held(loop, poll);
  pthread_mutex_unlock(&loop->mu);
}

/* Something to do without waiting: queued work (kick), an immediate re-poll,
 * callbacks to deliver. Called with mu held. */
static bool direct_work(ncfsm_loop *loop) {
  return loop->kick || ncfsm__timer_now(loop) || loop->notify_head || loop->snote_head || loop->calls_head ||
         atomic_load(&loop->async_kick) || atomic_load_explicit(&loop->att_head, memory_order_relaxed) ||
         atomic_load_explicit(&loop->handoff, memory_order_relaxed);
}

/* One direct turn; an immediate re-poll first yields the CPU, so that NCCL's
 * helper thread finishing a nonblocking launch can run on a shared core. */
static void direct_turn(ncfsm_loop *loop, bool yield) {
  if (yield) sched_yield();
  turn(loop, false);
}

static void on_wake(evutil_socket_t fd, short what, void *arg) { turn(arg, false); }

/* A caller that drives the loop one turn at a time (NOWAIT, ONCE) while there is always direct
 * work (works in flight re-poll at once) would never reach libevent, and with it the sockets of
 * its bootstraps: a channel opened would not be sent, a peer's failure notice not read, for as
 * long as the program polls. So such a call also runs one non-blocking pass of libevent when the
 * last one is older than the longest poll interval. Called without mu. */
static ncfsm_result_t socket_pass(ncfsm_loop *loop) {
  uint64_t now = ncfsm__now_ns();
  if (now - loop->last_pass_ns < loop->opts.poll_max_us * 1000ull) return NCFSM_OK;
  loop->last_pass_ns = now;
  return event_base_loop(loop->base, EVLOOP_NONBLOCK | EVLOOP_ONCE) < 0 ? NCFSM_ERR_SYSTEM : NCFSM_OK;
}

/* SIGUSR1 (opts.dump_on_signal): libevent turns the signal into an event on
 * this loop's thread; every comm with a dump directory is dumped. */
static void on_sigusr1(evutil_socket_t fd, short what, void *arg) {
  ncfsm_loop *loop = arg;
  pthread_mutex_lock(&loop->mu);
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    if (c->dump_dir[0] && c->rank >= 0 && !ncfsm__has(c, NCFSM_SF_END)) ncfsm__comm_dump(c, NULL, "signal");
  pthread_mutex_unlock(&loop->mu);
}
static void on_poll(evutil_socket_t fd, short what, void *arg) {
  ncfsm_loop *loop = arg;
  pthread_mutex_lock(&loop->mu);
  bool immediate = loop->backoff == 0;
  pthread_mutex_unlock(&loop->mu);
  if (immediate) sched_yield(); /* embedded bases poll through libevent */
  turn(loop, true);
}

/* wake_pending first: the loop's own thread, spinning before it waits,
 * sees the wake without libevent (fsm/loop.c, loop_thread_main). */
static void wake_event(ncfsm_loop *loop) {
  atomic_store(&loop->wake_pending, 1);
  event_active(loop->ev_wake, EV_READ, 0);
}
static const ncfsm__loop_ops loop_ops = {wake_event};

static ncfsm_result_t loop_create(struct event_base *base, bool own, const ncfsm_loop_opts *opts,
                                  ncfsm_loop **out) {
  if (!out) return NCFSM_ERR_INVALID_ARGUMENT;
  *out = NULL;
  ncfsm__log_init();
  pthread_once(&evthread_once, evthread_init);
  if (evthread_rc != 0) return NCFSM_ERR_SYSTEM;
  ncfsm_loop *loop = ncfsm__calloc_line(sizeof *loop);
  if (!loop) return NCFSM_ERR_NO_MEMORY;
  /* Options from the caller checked, or from the environment (core/settings.def);
   * the message: ncfsm_opts_error(). */
  ncfsm_result_t st = opts ? ncfsm__loop_opts_check(opts, "ncfsm_loop_new") : ncfsm_loop_opts_init(&loop->opts);
  if (st != NCFSM_OK) {
    free(loop);
    return st;
  }
  if (opts) loop->opts = *opts;
  /* Spinning needs a second CPU: on one, a spinning thread holds the CPU
   * that the thread it waits for needs (docs/design.md "Waiting threads
   * spin first"). */
  cpu_set_t cpus;
  loop->spin_cpus = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 2;
  if (own) {
    /* Precise timers (timerfd): the poll back-off is in microseconds, and
     * epoll_wait's millisecond rounding would turn a 1 us poll into ~4 ms
     * (measured on the GPU machine, docs/benchmarks.md). */
    struct event_config *ecfg = event_config_new();
    if (ecfg) event_config_set_flag(ecfg, EVENT_BASE_FLAG_PRECISE_TIMER);
    base = ecfg ? event_base_new_with_config(ecfg) : NULL;
    if (ecfg) event_config_free(ecfg);
    if (!base) { free(loop); return NCFSM_ERR_SYSTEM; }
  } else if (evthread_make_base_notifiable(base) != 0) {
    free(loop);
    return NCFSM_ERR_SYSTEM;
  }
  loop->base = base;
  loop->own_base = own;
  loop->ops = &loop_ops;
  /* Not recursive: engine functions expect the lock held and never retake
   * it; debug builds catch a violation. */
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
#ifndef NDEBUG
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK);
#elif defined(__GLIBC__)
  /* Taken for a short while by the loop's thread and by waiters and
   * submitters at every op: a thread that finds it taken spins a little
   * before it sleeps in the kernel (docs/design.md "Waiting threads spin
   * first"). */
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
  pthread_mutex_init(&loop->mu, &a);
  pthread_mutexattr_destroy(&a);
  pthread_cond_init(&loop->cv, NULL);
  loop->ev_wake = event_new(base, -1, 0, on_wake, loop);
  loop->ev_poll = evtimer_new(base, on_poll, loop);
  /* The pools' idle timer on an own base only: an armed timer would keep an
   * application's event_base_dispatch from returning (embedded loops give
   * their pools back at ncfsm_loop_close). */
  loop->ev_trim = own ? evtimer_new(base, on_trim, loop) : NULL;
  ncfsm__coalesce_init(&loop->co, loop->opts.coalesce_max);
  loop->spans = ncfsm__spanset_new(loop->co.adaptive ? NCFSM__COALESCE_HI : loop->opts.coalesce_max);
  if (!loop->ev_wake || !loop->ev_poll || (own && !loop->ev_trim) || !loop->spans) {
    ncfsm__spanset_free(loop->spans);
    if (loop->ev_trim) event_free(loop->ev_trim);
    if (loop->ev_wake) event_free(loop->ev_wake);
    if (loop->ev_poll) event_free(loop->ev_poll);
    if (own) event_base_free(base);
    pthread_mutex_destroy(&loop->mu);
    pthread_cond_destroy(&loop->cv);
    free(loop);
    return NCFSM_ERR_NO_MEMORY;
  }
  if (loop->opts.dump_on_signal) {
    loop->ev_signal = evsignal_new(base, SIGUSR1, on_sigusr1, loop);
    if (!loop->ev_signal || event_add(loop->ev_signal, NULL) != 0)
      NCFSM_WARN(NCFSM__SUB_FSM, "ncfsm_loop: cannot take SIGUSR1 for flight recorder dumps (another "
                 "event_base of this process has it?); dumps on request still work");
  }
  if ((loop->opts.completion == NCFSM_COMPLETION_PUSH || loop->opts.completion == NCFSM_COMPLETION_AUTO) &&
      ncfsm__push_new(loop) != NCFSM_OK)
    loop->opts.completion = NCFSM_COMPLETION_POLL; /* polls cover it */
  loop->group_err = NCFSM_OK;
  loop->id = atomic_fetch_add(&loop_ids, 1) + 1;
  loop->magic = NCFSM__LOOP_MAGIC;
  *out = loop;
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_loop_new(const ncfsm_loop_opts *opts, ncfsm_loop **out) {
  return loop_create(NULL, true, opts, out);
}

ncfsm_result_t ncfsm_loop_new_embedded(struct event_base *base, const ncfsm_loop_opts *opts,
                                       ncfsm_loop **out) {
  if (!base) return NCFSM_ERR_INVALID_ARGUMENT;
  return loop_create(base, false, opts, out);
}

struct event_base *ncfsm_loop_base(ncfsm_loop *loop) {
  return loop && loop->magic == NCFSM__LOOP_MAGIC ? loop->base : NULL;
}

bool ncfsm__loop_pending(ncfsm_loop *loop) {
  if (loop->kick || ncfsm__timer_now(loop) || (loop->nqueued && !ncfsm__group_open(loop)) || loop->notify_head ||
      loop->snote_head || loop->calls_head || atomic_load_explicit(&loop->handoff, memory_order_relaxed))
    return true;
  for (ncfsm_comm *c = loop->act_head; c; c = c->act_next) /* not polled: their bootstrap callbacks wake the loop */
    if (c->verify_waits) return true;
  return ncfsm__poll_pending(loop);
}

ncfsm_result_t ncfsm_loop_run(ncfsm_loop *loop, ncfsm_run_mode_t mode) {
  if (!loop || loop->magic != NCFSM__LOOP_MAGIC) return NCFSM_ERR_INVALID_ARGUMENT;
  if (ncfsm__loop_in_turn(loop)) {
    ncfsm__loop_error(loop, "ncfsm_loop_run: called from inside one of this loop's callbacks (a work or "
                            "state callback may not run or wait on its own loop; submit and return instead)");
    return NCFSM_ERR_INVALID_USAGE;
  }
  pthread_mutex_lock(&loop->mu);
  /* A destroy or abort outside a turn owns the loop for its blocking call. */
  while (loop->claimed && !pthread_equal(loop->runner, pthread_self()))
    ncfsm__loop_cv_wait(loop, NULL);
  ncfsm__held_spill_mine(loop); /* a group this thread holds back is the loop's while it runs (fsm/held.def) */
  if (loop->running && !pthread_equal(loop->runner, pthread_self())) {
    ncfsm__loop_error(loop, "ncfsm_loop_run: the loop is already run by another thread; wait on works instead");
    pthread_mutex_unlock(&loop->mu);
    return NCFSM_ERR_WRONG_THREAD;
  }
  /* This thread drives the loop for the whole call, also while it waits in
   * epoll: other threads then wake it and hand it backend work (R9). */
  ncfsm__loop_set_runner(loop);
  ncfsm_result_t rr = NCFSM_OK;
  for (;;) {
    bool direct = direct_work(loop);
    bool yield = ncfsm__timer_now(loop) && !loop->kick;
    bool pending = direct || ncfsm__loop_pending(loop);
    if (!direct && mode == NCFSM_RUN_DEFAULT && !pending) break;
    if (direct && !yield) { /* no need to go through libevent, nor to drop the lock */
      turn_held(loop, false);
      if (mode == NCFSM_RUN_DEFAULT) continue;
      pthread_mutex_unlock(&loop->mu);
      rr = socket_pass(loop);
      pthread_mutex_lock(&loop->mu);
      break;
    }
    pthread_mutex_unlock(&loop->mu);
    if (direct) {
      direct_turn(loop, yield); /* yields the CPU first, without the lock */
      if (mode != NCFSM_RUN_DEFAULT) rr = socket_pass(loop);
    } else {
      loop->last_pass_ns = ncfsm__now_ns();
      /* NONBLOCK alone keeps libevent looping while a timer expires again
       * before it checks (a 1 us poll interval): ONCE ends after one pass. */
      int flags = mode == NCFSM_RUN_NOWAIT || !pending ? EVLOOP_NONBLOCK | EVLOOP_ONCE : EVLOOP_ONCE;
      if (event_base_loop(loop->base, flags) < 0) rr = NCFSM_ERR_SYSTEM;
    }
    pthread_mutex_lock(&loop->mu);
    if (rr != NCFSM_OK || mode != NCFSM_RUN_DEFAULT) break;
  }
  ncfsm__loop_clear_runner(loop);
  pthread_mutex_unlock(&loop->mu);
  return rr;
}

bool ncfsm__spin(ncfsm_loop *loop, bool (*done)(ncfsm_loop *, unsigned), unsigned arg, uint64_t end_ns) {
  for (unsigned i = 1;; i++) {
    if (done(loop, arg)) return true;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
    if (!(i & 63) && ncfsm__now_ns() >= end_ns) return done(loop, arg); /* what came as the time ran out counts */
  }
}

/* What the loop's own thread waits for in libevent that reaches it
 * without the lock: a hand-off, a wake, a bootstrap callback's kick, an
 * attention request. */
static bool thread_called(ncfsm_loop *loop, unsigned arg) {
  (void)arg;
  return atomic_load_explicit(&loop->handoff, memory_order_relaxed) || atomic_load(&loop->wake_pending) ||
         atomic_load(&loop->async_kick) || atomic_load_explicit(&loop->att_head, memory_order_relaxed);
}

static void *loop_thread_main(void *arg) {
  ncfsm_loop *loop = arg;
  atomic_store(&loop->awake, 1);
  bool may_spin = true; /* once after each turn or wait: a spin that was woken or ran out is not repeated */
  bool woken = false;   /* the last spin was: counted under the next lock */
  for (;;) {
    /* before what it reads: a wake after this ends the spin (stored only when
     * set: the line is the hand-off's, which submitters write) */
    if (atomic_load_explicit(&loop->wake_pending, memory_order_relaxed)) atomic_store(&loop->wake_pending, 0);
    pthread_mutex_lock(&loop->mu);
    if (woken) loop->spins[NCFSM__SPIN_LOOP][NCFSM__SPIN_WOKEN]++;
    woken = false;
    bool stop = loop->thread_stop;
    bool direct = direct_work(loop);
    bool yield = ncfsm__timer_now(loop) && !loop->kick;
    /* Only with nothing pending: a poll schedule or a push wait is the
     * timer's, and a spin would delay it. */
    uint64_t spin_ns = may_spin && !stop && !direct && ncfsm__spin_on(loop) && !ncfsm__loop_pending(loop)
                           ? (uint64_t)loop->opts.spin_us * 1000
                           : 0;
    pthread_mutex_unlock(&loop->mu);
    if (stop) break;
    if (direct) {
      direct_turn(loop, yield);
      may_spin = true;
      continue;
    }
    if (spin_ns) {
      may_spin = false;
      if ((woken = ncfsm__spin(loop, thread_called, 0, ncfsm__now_ns() + spin_ns))) continue;
      pthread_mutex_lock(&loop->mu);
      loop->spins[NCFSM__SPIN_LOOP][NCFSM__SPIN_BOUND]++;
      pthread_mutex_unlock(&loop->mu);
    }
    /* About to wait: a hand-off pushed from here on wakes the thread; one
     * pushed before that saw it awake is on the stack now (both sequentially
     * consistent: the push and its read of awake, this store and this read). */
    atomic_store(&loop->awake, 0);
    if (!atomic_load(&loop->handoff)) event_base_loop(loop->base, EVLOOP_ONCE | EVLOOP_NO_EXIT_ON_EMPTY);
    atomic_store(&loop->awake, 1);
    may_spin = true;
  }
  atomic_store(&loop->awake, 0);
  return NULL;
}

static void noop_cb(void *arg) { (void)arg; }

ncfsm_result_t ncfsm_loop_start_thread(ncfsm_loop *loop) {
  if (!loop || loop->magic != NCFSM__LOOP_MAGIC) return NCFSM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&loop->mu);
  ncfsm__held_spill_mine(loop);
  if (loop->thread_started || !loop->own_base) {
    ncfsm__loop_error(loop, "ncfsm_loop_start_thread: %s",
                      loop->thread_started ? "a loop thread is already running"
                                           : "an embedded loop is run by its application");
    pthread_mutex_unlock(&loop->mu);
    return NCFSM_ERR_INVALID_USAGE;
  }
  loop->thread_stop = false;
  if (pthread_create(&loop->thread, NULL, loop_thread_main, loop) != 0) {
    pthread_mutex_unlock(&loop->mu);
    return NCFSM_ERR_SYSTEM;
  }
  loop->thread_started = true;
  loop->runner = loop->thread;
  loop->running++;
  atomic_store_explicit(&loop->threaded, 1, memory_order_relaxed);
  pthread_mutex_unlock(&loop->mu);
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_loop_stop_thread(ncfsm_loop *loop) {
  if (!loop || loop->magic != NCFSM__LOOP_MAGIC) return NCFSM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&loop->mu);
  if (!loop->thread_started) {
    pthread_mutex_unlock(&loop->mu);
    return NCFSM_ERR_INVALID_USAGE;
  }
  loop->thread_stop = true;
  atomic_store_explicit(&loop->threaded, 0, memory_order_relaxed);
  pthread_mutex_unlock(&loop->mu);
  ncfsm_loop_call(loop, noop_cb, NULL); /* wake it */
  pthread_join(loop->thread, NULL);
  pthread_mutex_lock(&loop->mu);
  loop->thread_started = false;
  loop->running--;
  pthread_mutex_unlock(&loop->mu);
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_loop_call(ncfsm_loop *loop, void (*fn)(void *), void *arg) {
  if (!loop || loop->magic != NCFSM__LOOP_MAGIC || !fn) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm__call_req *r = malloc(sizeof *r);
  if (!r) return NCFSM_ERR_NO_MEMORY;
  r->fn = fn;
  r->arg = arg;
  r->next = NULL;
  pthread_mutex_lock(&loop->mu);
  ncfsm__handoff_turn(loop); /* fn runs after this thread's earlier submissions are queued */
  ncfsm__held_spill_mine(loop);
  if (loop->calls_tail) loop->calls_tail->next = r;
  else loop->calls_head = r;
  loop->calls_tail = r;
  /* Always a wake (through libevent, or seen by the loop's thread as it
   * spins): the caller may be waiting for another thread. */
  wake_event(loop);
  pthread_mutex_unlock(&loop->mu);
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_loop_close(ncfsm_loop *loop) {
  if (!loop || loop->magic != NCFSM__LOOP_MAGIC) return NCFSM_ERR_INVALID_ARGUMENT;
  if (ncfsm__loop_in_turn(loop)) { /* the loop is in use below this callback */
    ncfsm__loop_error(loop, "ncfsm_loop_close: called from inside one of this loop's callbacks "
                            "(ncfsm_loop_call, a work or state callback); close it after ncfsm_loop_run "
                            "returns, from outside the loop");
    return NCFSM_ERR_INVALID_USAGE;
  }
  pthread_mutex_lock(&loop->mu);
  /* A thread still inside a hand-off may touch the loop after its work was
   * pushed (and even completed): wait for it, then take what it pushed. */
  while (atomic_load_explicit(&loop->handing, memory_order_acquire)) {
    pthread_mutex_unlock(&loop->mu);
    sched_yield();
    pthread_mutex_lock(&loop->mu);
  }
  ncfsm__handoff_turn(loop); /* submissions made before this call join their comms first */
  ncfsm__held_spill_mine(loop); /* a group this thread holds back: "a group is open" */
  int open = 0; /* comms the program holds (a recovery's new comm in the making is the recovery's) */
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    if (c->state != NCFSM_STATE_RELEASED && !(c->rops && c->rops->owned(c))) open++;
  bool group = ncfsm__group_open(loop) || ncfsm__held_any(loop); /* ... or another thread's, held back */
  if (open || loop->thread_started || group || loop->running) {
    ncfsm__loop_error(loop, "ncfsm_loop_close: %d communicator(s) not released%s%s%s; close them first "
                            "(ncfsm_comm_close each, or ncfsm_loop_shutdown for all; or destroy/abort and "
                            "ncfsm_comm_release), run the loop until they are released, then close it",
                      open, loop->thread_started ? ", loop thread still running" : "", group ? ", a group is open" : "",
                      loop->running ? ", another thread is running the loop" : "");
    pthread_mutex_unlock(&loop->mu);
    return NCFSM_ERR_BUSY; /* nothing changed: armed recoveries stay armed */
  }
  if (loop->hooks.cancel) { /* recoveries whose steps will not run again let go of what they hold */
    pthread_mutex_unlock(&loop->mu);
    loop->hooks.cancel(loop);
    pthread_mutex_lock(&loop->mu);
  }
  /* Deliver what is left (callbacks of released comms' works). */
  ncfsm__loop_set_runner(loop);
  ncfsm_loop *outer;
  ncfsm__loop_enter_turn(loop, &outer);
  ncfsm__enlist_all(loop);
  bool progressed = ncfsm__progress(loop);
  ncfsm__loop_flush_notes(loop);
  ncfsm__loop_leave_turn(loop, outer);
  ncfsm__loop_clear_runner(loop);
  if (loop->comms || loop->calls_head) { /* released but still referenced by user-held works */
    ncfsm__timer_after_turn(loop, progressed);
    ncfsm__loop_error(loop, "ncfsm_loop_close: work handles are still held; ncfsm_work_release them first");
    pthread_mutex_unlock(&loop->mu);
    return NCFSM_ERR_BUSY;
  }
  ncfsm__abort_strays_now(loop); /* e.g. a verifier's companion: its comm was freed just now */
  loop->magic = NCFSM__DEAD_MAGIC;
  if (loop->hooks.free_all) loop->hooks.free_all(loop);
  ncfsm__comm_free_all(loop);
  pthread_mutex_unlock(&loop->mu);
  ncfsm__push_detach(loop);
  event_free(loop->ev_wake);
  event_free(loop->ev_poll);
  if (loop->ev_trim) event_free(loop->ev_trim);
  if (loop->ev_signal) event_free(loop->ev_signal);
  ncfsm__spanset_free(loop->spans);
  free(loop->qh);
  free(loop->shutdown_req); /* never queued: the loop had a comm that was never released (not possible here) */
  if (loop->own_base) event_base_free(loop->base);
  pthread_mutex_destroy(&loop->mu);
  pthread_cond_destroy(&loop->cv);
  free(loop);
  return NCFSM_OK;
}

void ncfsm_loop_set_trace(ncfsm_loop *loop, ncfsm_trace_fn fn, void *arg) {
  if (!loop || loop->magic != NCFSM__LOOP_MAGIC) return;
  pthread_mutex_lock(&loop->mu);
  ncfsm__handoff_turn(loop); /* the submissions before this call are not the new trace's */
  ncfsm__held_spill_mine(loop); /* nor a group this thread holds back: the trace sees it open */
  loop->trace_arg = arg;
  __atomic_store_n(&loop->trace, fn, __ATOMIC_RELAXED); /* a submitter's hand-off reads it without the lock */
  pthread_mutex_unlock(&loop->mu);
}

const char *ncfsm_loop_last_error(ncfsm_loop *loop) {
  if (!loop || loop->magic != NCFSM__LOOP_MAGIC) return "invalid loop handle";
  return ncfsm__loop_error_of(loop);
}
