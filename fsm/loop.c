/* The loop: a libevent base, the wakeup event, the progress timer, and the
 * delivery of callbacks on the loop thread. The only file that calls libevent. */
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

#include "core/settings.h"
#include "fsm/internal.h"

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static int evthread_rc;
static void evthread_init(void) { evthread_rc = evthread_use_pthreads(); }

/* ncfsm_loop_opts_init: core/settings_opts.c (from the settings table). */

/* Loop-level errors are per thread (ncfsm_loop_last_error). */
static _Thread_local uint64_t tls_err_loop; /* the loop's id: a new loop at a freed one's address is another */
static _Atomic uint64_t loop_ids;
static _Thread_local char tls_err[512];

void ncfsm__loop_error(ncfsm_loop *loop, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_err, sizeof tls_err, fmt, ap);
  va_end(ap);
  tls_err_loop = loop->id;
  NCFSM_INFO(NCFSM__SUB_FSM, "%s", tls_err);
}

/* The loop whose turn (or callback) this thread is inside, if any. */
static _Thread_local ncfsm_loop *tls_in_turn;

bool ncfsm__loop_in_turn(const ncfsm_loop *loop) { return tls_in_turn == loop; }

static void set_runner(ncfsm_loop *loop) {
  loop->runner = pthread_self();
  loop->running++;
}
static void clear_runner(ncfsm_loop *loop) { loop->running--; }

bool ncfsm__loop_can_drive(ncfsm_loop *loop) {
  return loop->running == 0 || pthread_equal(loop->runner, pthread_self());
}

void ncfsm__loop_claim(ncfsm_loop *loop) {
  set_runner(loop);
  loop->claimed++;
}

void ncfsm__loop_unclaim(ncfsm_loop *loop) {
  loop->claimed--;
  clear_runner(loop);
  pthread_cond_broadcast(&loop->cv);
}

/* Wake the thread that runs the loop. A loop with its own base that nobody
 * is running needs no wakeup: ncfsm_loop_run turns it directly when it finds
 * queued work, which saves a libevent round trip per op. Called with mu held. */
void ncfsm__loop_wake(ncfsm_loop *loop) {
  loop->kick = true;
  if (loop->own_base && (loop->running == 0 || pthread_equal(loop->runner, pthread_self())))
    return;
  event_active(loop->ev_wake, EV_READ, 0);
}

void ncfsm__loop_kick_async(ncfsm_loop *loop) {
  atomic_store(&loop->async_kick, 1);
  event_active(loop->ev_wake, EV_READ, 0);
}

/* ---- push completion ------------------------------------------------------------ */

static void notifier_unref(ncfsm__notifier *n) {
  pthread_mutex_lock(&n->mu);
  bool last = --n->refs == 0;
  pthread_mutex_unlock(&n->mu);
  if (last) {
    pthread_mutex_destroy(&n->mu);
    free(n);
  }
}

/* On a runtime thread: the stream reached the point after a launch's
 * completion event. Touches nothing of the loop but its wake event. */
static void push_cb(void *arg) {
  ncfsm__notifier *n = arg;
  pthread_mutex_lock(&n->mu);
  if (n->loop) {
    atomic_fetch_add(&n->wakes, 1);
    ncfsm__loop_kick_async(n->loop);
  }
  pthread_mutex_unlock(&n->mu);
  notifier_unref(n);
}

bool ncfsm__push_notify(ncfsm_loop *loop, const ncfsm__backend *be, void *stream) {
  ncfsm__notifier *n = loop->notifier;
  if (!n || !be->host_notify || loop->opts.completion == NCFSM_COMPLETION_POLL) return false;
  pthread_mutex_lock(&n->mu);
  n->refs++;
  pthread_mutex_unlock(&n->mu);
  int rc = be->host_notify(stream, push_cb, n);
  if (rc != 0) {
    notifier_unref(n);
    NCFSM_WARN(NCFSM__SUB_LOOP, "push completion: the backend could not enqueue a host function (%d); the "
                                "loop polls instead", rc);
    loop->opts.completion = NCFSM_COMPLETION_POLL;
    return false;
  }
  atomic_fetch_add(&n->posted, 1);
  return true;
}

/* Push covers what is pending: only works in flight wait (no NCCL call in
 * progress, no launch, no exchange, no control work): their streams can
 * wake the loop, and a slow timer is the fallback (and the R10 watch). */
static bool push_covers(ncfsm_loop *loop) {
  if (loop->opts.completion == NCFSM_COMPLETION_POLL || !loop->notifier || loop->ctl || loop->nqueued) return false;
  for (ncfsm_comm *c = loop->comms; c; c = c->next) {
    unsigned f = ncfsm__sflags(c->state);
    if ((f & NCFSM_SF_POLL) || c->launching || c->vq_head || c->sf_head || c->sp_head ||
        (c->comp && ncfsm__comp_busy(c)) || c->state == NCFSM_STATE_DRAINING ||
        c->state == NCFSM_STATE_ABORT_QUEUED)
      return false;
  }
  return true;
}

/* Push, at the end of a burst: a host function after the last work of every
 * stream that has works in flight and none since the last host function
 * there (one per stream and wait, not one per launch: a host function holds
 * the stream's later work until it has run). False when one could not be
 * enqueued (the loop then polls). */
static bool push_arm_streams(ncfsm_loop *loop) {
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    for (int i = 0; i < c->nsq; i++) {
      ncfsm__squeue *q = &c->sq[i];
      if (!q->head || q->notified == q->appended) continue;
      if (!ncfsm__push_notify(loop, c->be, q->stream)) return false;
      q->notified = q->appended;
    }
  return true;
}

/* Adaptive progress schedule: immediate re-polls after the last progress
 * (at least poll_burst of them, and for at least poll_burst_us, which covers
 * a small collective's round trip), then intervals doubling from 1 us up to
 * poll_max_us. No timer is armed when nothing is pending. With push
 * completion the burst is the same; after it (auto: after push_after_us
 * without progress), when only works in flight wait, their streams wake the
 * loop and one slow timer replaces the back-off. */
void ncfsm__loop_arm_poll(ncfsm_loop *loop, bool progress) {
  if (progress) {
    loop->poll_iter = 0;
    loop->backoff = 0;
    loop->burst_start_ns = ncfsm__now_ns();
    if (loop->poll_armed && !loop->poll_now) { /* a back-off (or push's slow) timer: poll sooner */
      evtimer_del(loop->ev_poll);
      loop->poll_armed = loop->push_armed = false;
    }
  }
  uint64_t quiet_ns = ncfsm__now_ns() - loop->burst_start_ns; /* since the last progress */
  bool immediate = loop->poll_iter < loop->opts.poll_burst || quiet_ns < (uint64_t)loop->opts.poll_burst_us * 1000;
  bool covered = !immediate && push_covers(loop) &&
                 (loop->opts.completion == NCFSM_COMPLETION_PUSH || quiet_ns >= (uint64_t)loop->opts.push_after_us * 1000);
  if (loop->poll_armed && loop->push_armed && !covered) { /* polls again (progress, or a state that needs them) */
    evtimer_del(loop->ev_poll);
    loop->poll_armed = loop->push_armed = false;
  }
  if (loop->poll_armed) return;
  if (covered && push_arm_streams(loop)) {
    struct timeval ptv = {(time_t)(loop->opts.push_fallback_us / 1000000),
                          (suseconds_t)(loop->opts.push_fallback_us % 1000000)};
    loop->poll_armed = loop->push_armed = true;
    evtimer_add(loop->ev_poll, &ptv);
    return;
  }
  if (immediate) {
    if (loop->poll_iter < UINT_MAX) loop->poll_iter++;
    loop->poll_armed = true;
    if (loop->own_base) {
      /* The thread that drives the loop turns it directly (ncfsm_loop_run,
       * the loop thread), yielding the CPU first, without an epoll_wait. */
      loop->poll_now = true;
      if (loop->running && !pthread_equal(loop->runner, pthread_self()))
        event_active(loop->ev_wake, EV_READ, 0);
    } else {
      struct timeval tv = {0, 0};
      evtimer_add(loop->ev_poll, &tv);
    }
    return;
  }
  unsigned long us = loop->backoff >= 20 ? loop->opts.poll_max_us : (1ul << loop->backoff);
  if (us > loop->opts.poll_max_us) us = loop->opts.poll_max_us;
  loop->backoff++;
  struct timeval tv = {0, (suseconds_t)us};
  loop->poll_armed = true;
  evtimer_add(loop->ev_poll, &tv);
}

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
    while (sn) {
      struct ncfsm__state_note *n = sn->next;
      ncfsm__comm_unref(sn->comm);
      free(sn);
      sn = n;
    }
    while (w) {
      ncfsm_work *n = w->next;
      w->delivered = true;
      ncfsm__work_unref(w);
      w = n;
    }
  }
  pthread_cond_broadcast(&loop->cv);
}

/* One turn; the caller holds loop->mu (turn() takes it). */
static void turn_held(ncfsm_loop *loop, bool poll) {
  ncfsm_loop *outer = tls_in_turn;
  tls_in_turn = loop;
  set_runner(loop);
  if (poll || loop->poll_now) loop->poll_armed = loop->push_armed = false;
  loop->poll_now = false;
  loop->kick = false;
  if (atomic_exchange(&loop->async_kick, 0)) loop->ctl = true;
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
  if ((hint || !loop->poll_armed) && ncfsm__loop_poll_pending(loop)) ncfsm__loop_arm_poll(loop, hint);
  clear_runner(loop);
  tls_in_turn = outer;
}

static void turn(ncfsm_loop *loop, bool poll) {
  pthread_mutex_lock(&loop->mu);
  turn_held(loop, poll);
  pthread_mutex_unlock(&loop->mu);
}

/* Something to do without waiting: queued work (kick), an immediate re-poll,
 * callbacks to deliver. Called with mu held. */
static bool direct_work(ncfsm_loop *loop) {
  return loop->kick || loop->poll_now || loop->notify_head || loop->snote_head || loop->calls_head ||
         atomic_load(&loop->async_kick);
}

/* One direct turn; an immediate re-poll first yields the CPU, so that NCCL's
 * helper thread finishing a nonblocking launch can run on a shared core. */
static void direct_turn(ncfsm_loop *loop, bool yield) {
  if (yield) sched_yield();
  turn(loop, false);
}

static void on_wake(evutil_socket_t fd, short what, void *arg) { turn(arg, false); }

/* SIGUSR1 (opts.dump_on_signal): libevent turns the signal into an event on
 * this loop's thread; every comm with a dump directory is dumped. */
static void on_sigusr1(evutil_socket_t fd, short what, void *arg) {
  ncfsm_loop *loop = arg;
  pthread_mutex_lock(&loop->mu);
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    if (c->dump_dir[0] && c->rank >= 0) ncfsm__comm_dump(c, NULL, "signal");
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

static ncfsm_result_t loop_create(struct event_base *base, bool own, const ncfsm_loop_opts *opts,
                                  ncfsm_loop **out) {
  if (!out) return NCFSM_ERR_INVALID_ARGUMENT;
  *out = NULL;
  ncfsm__log_init();
  pthread_once(&evthread_once, evthread_init);
  if (evthread_rc != 0) return NCFSM_ERR_SYSTEM;
  ncfsm_loop *loop = calloc(1, sizeof *loop);
  if (!loop) return NCFSM_ERR_NO_MEMORY;
  /* Options from the caller checked, or from the environment (core/settings.def);
   * the message: ncfsm_opts_error(). */
  ncfsm_result_t st = opts ? ncfsm__loop_opts_check(opts, "ncfsm_loop_new") : ncfsm_loop_opts_init(&loop->opts);
  if (st != NCFSM_OK) {
    free(loop);
    return st;
  }
  if (opts) loop->opts = *opts;
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
  /* Not recursive: engine functions expect the lock held and never retake
   * it; debug builds catch a violation. */
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
#ifndef NDEBUG
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK);
#endif
  pthread_mutex_init(&loop->mu, &a);
  pthread_mutexattr_destroy(&a);
  pthread_cond_init(&loop->cv, NULL);
  loop->ev_wake = event_new(base, -1, 0, on_wake, loop);
  loop->ev_poll = evtimer_new(base, on_poll, loop);
  loop->spans = ncfsm__spanset_new(loop->opts.coalesce_max);
  if (!loop->ev_wake || !loop->ev_poll || !loop->spans) {
    ncfsm__spanset_free(loop->spans);
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
  if (loop->opts.completion == NCFSM_COMPLETION_PUSH || loop->opts.completion == NCFSM_COMPLETION_AUTO) {
    ncfsm__notifier *n = calloc(1, sizeof *n);
    if (n) {
      pthread_mutex_init(&n->mu, NULL);
      n->refs = 1;
      n->loop = loop;
      loop->notifier = n;
    } else {
      loop->opts.completion = NCFSM_COMPLETION_POLL; /* polls cover it */
    }
  }
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

/* Something the progress timer must watch: a comm in progress, a launch not
 * final, works in flight, an abort to issue. */
bool ncfsm__loop_poll_pending(ncfsm_loop *loop) {
  for (ncfsm_comm *c = loop->comms; c; c = c->next) {
    unsigned f = ncfsm__sflags(c->state);
    if ((f & (NCFSM_SF_POLL | NCFSM_SF_DEADLINE)) || c->state == NCFSM_STATE_DRAINING ||
        c->state == NCFSM_STATE_ABORT_QUEUED || c->launching || c->vq_head || c->sf_head || c->sp_head ||
        (c->comp && ncfsm__comp_busy(c)))
      return true;
    for (int i = 0; i < c->nsq; i++)
      if (c->sq[i].head) return true;
  }
  return false;
}

bool ncfsm__loop_pending(ncfsm_loop *loop) {
  if (loop->kick || loop->poll_now || (loop->nqueued && loop->group_depth == 0) || loop->notify_head ||
      loop->snote_head || loop->calls_head)
    return true;
  return ncfsm__loop_poll_pending(loop);
}

ncfsm_result_t ncfsm_loop_run(ncfsm_loop *loop, ncfsm_run_mode_t mode) {
  if (!loop || loop->magic != NCFSM__LOOP_MAGIC) return NCFSM_ERR_INVALID_ARGUMENT;
  if (tls_in_turn == loop) {
    ncfsm__loop_error(loop, "ncfsm_loop_run: called from inside one of this loop's callbacks (a work or "
                            "state callback may not run or wait on its own loop; submit and return instead)");
    return NCFSM_ERR_INVALID_USAGE;
  }
  pthread_mutex_lock(&loop->mu);
  /* A destroy or abort outside a turn owns the loop for its blocking call. */
  while (loop->claimed && !pthread_equal(loop->runner, pthread_self()))
    pthread_cond_wait(&loop->cv, &loop->mu);
  if (loop->running && !pthread_equal(loop->runner, pthread_self())) {
    ncfsm__loop_error(loop, "ncfsm_loop_run: the loop is already run by another thread; wait on works instead");
    pthread_mutex_unlock(&loop->mu);
    return NCFSM_ERR_WRONG_THREAD;
  }
  /* This thread drives the loop for the whole call, also while it waits in
   * epoll: other threads then wake it and hand it backend work (R9). */
  set_runner(loop);
  ncfsm_result_t rr = NCFSM_OK;
  for (;;) {
    bool direct = direct_work(loop);
    bool yield = loop->poll_now && !loop->kick;
    bool pending = direct || ncfsm__loop_pending(loop);
    if (!direct && mode == NCFSM_RUN_DEFAULT && !pending) break;
    if (direct && !yield) { /* no need to go through libevent, nor to drop the lock */
      turn_held(loop, false);
      if (mode != NCFSM_RUN_DEFAULT) break;
      continue;
    }
    pthread_mutex_unlock(&loop->mu);
    if (direct) {
      direct_turn(loop, yield); /* yields the CPU first, without the lock */
    } else {
      /* NONBLOCK alone keeps libevent looping while a timer expires again
       * before it checks (a 1 us poll interval): ONCE ends after one pass. */
      int flags = mode == NCFSM_RUN_NOWAIT || !pending ? EVLOOP_NONBLOCK | EVLOOP_ONCE : EVLOOP_ONCE;
      if (event_base_loop(loop->base, flags) < 0) rr = NCFSM_ERR_SYSTEM;
    }
    pthread_mutex_lock(&loop->mu);
    if (rr != NCFSM_OK || mode != NCFSM_RUN_DEFAULT) break;
  }
  clear_runner(loop);
  pthread_mutex_unlock(&loop->mu);
  return rr;
}

static void *loop_thread_main(void *arg) {
  ncfsm_loop *loop = arg;
  for (;;) {
    pthread_mutex_lock(&loop->mu);
    bool stop = loop->thread_stop;
    bool direct = direct_work(loop);
    bool yield = loop->poll_now && !loop->kick;
    pthread_mutex_unlock(&loop->mu);
    if (stop) break;
    if (direct) direct_turn(loop, yield);
    else event_base_loop(loop->base, EVLOOP_ONCE | EVLOOP_NO_EXIT_ON_EMPTY);
  }
  return NULL;
}

static void noop_cb(void *arg) { (void)arg; }

ncfsm_result_t ncfsm_loop_start_thread(ncfsm_loop *loop) {
  if (!loop || loop->magic != NCFSM__LOOP_MAGIC) return NCFSM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&loop->mu);
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
  if (loop->calls_tail) loop->calls_tail->next = r;
  else loop->calls_head = r;
  loop->calls_tail = r;
  /* Always through libevent: the caller may be waiting for another thread. */
  event_active(loop->ev_wake, EV_READ, 0);
  pthread_mutex_unlock(&loop->mu);
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_loop_close(ncfsm_loop *loop) {
  if (!loop || loop->magic != NCFSM__LOOP_MAGIC) return NCFSM_ERR_INVALID_ARGUMENT;
  if (tls_in_turn == loop) { /* the loop is in use below this callback */
    ncfsm__loop_error(loop, "ncfsm_loop_close: called from inside one of this loop's callbacks "
                            "(ncfsm_loop_call, a work or state callback); close it after ncfsm_loop_run "
                            "returns, from outside the loop");
    return NCFSM_ERR_INVALID_USAGE;
  }
  ncfsm__recover_cancel_all(loop); /* their steps will not run again */
  pthread_mutex_lock(&loop->mu);
  int open = 0;
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    if (!c->released) open++;
  if (open || loop->thread_started || loop->group_depth || loop->running) {
    ncfsm__loop_error(loop, "ncfsm_loop_close: %d communicator(s) not released%s%s%s; abort/destroy and "
                            "ncfsm_comm_release them first",
                      open, loop->thread_started ? ", loop thread still running" : "",
                      loop->group_depth ? ", a group is open" : "",
                      loop->running ? ", another thread is running the loop" : "");
    pthread_mutex_unlock(&loop->mu);
    return NCFSM_ERR_BUSY;
  }
  /* Deliver what is left (callbacks of released comms' works). */
  set_runner(loop);
  ncfsm_loop *outer = tls_in_turn;
  tls_in_turn = loop;
  bool progressed = ncfsm__progress(loop);
  ncfsm__loop_flush_notes(loop);
  tls_in_turn = outer;
  clear_runner(loop);
  if (loop->comms || loop->calls_head) { /* released but still referenced by user-held works */
    if ((progressed || !loop->poll_armed) && ncfsm__loop_poll_pending(loop)) ncfsm__loop_arm_poll(loop, progressed);
    ncfsm__loop_error(loop, "ncfsm_loop_close: work handles are still held; ncfsm_work_release them first");
    pthread_mutex_unlock(&loop->mu);
    return NCFSM_ERR_BUSY;
  }
  loop->magic = NCFSM__DEAD_MAGIC;
  ncfsm__recover_free_all(loop);
  ncfsm__comm_free_all(loop);
  pthread_mutex_unlock(&loop->mu);
  if (loop->notifier) { /* before the wake event goes: a host function may be running */
    pthread_mutex_lock(&loop->notifier->mu);
    loop->notifier->loop = NULL;
    pthread_mutex_unlock(&loop->notifier->mu);
    notifier_unref(loop->notifier);
    loop->notifier = NULL;
  }
  event_free(loop->ev_wake);
  event_free(loop->ev_poll);
  if (loop->ev_signal) event_free(loop->ev_signal);
  ncfsm__spanset_free(loop->spans);
  if (loop->own_base) event_base_free(loop->base);
  pthread_mutex_destroy(&loop->mu);
  pthread_cond_destroy(&loop->cv);
  free(loop);
  return NCFSM_OK;
}

void ncfsm_loop_set_trace(ncfsm_loop *loop, ncfsm_trace_fn fn, void *arg) {
  if (!loop || loop->magic != NCFSM__LOOP_MAGIC) return;
  pthread_mutex_lock(&loop->mu);
  loop->trace = fn;
  loop->trace_arg = arg;
  pthread_mutex_unlock(&loop->mu);
}

const char *ncfsm_loop_last_error(ncfsm_loop *loop) {
  if (!loop || loop->magic != NCFSM__LOOP_MAGIC) return "invalid loop handle";
  return tls_err_loop == loop->id ? tls_err : "";
}
