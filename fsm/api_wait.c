/* What the public calls share: the thread's copy of a comm's message,
 * blocking waits (ncfsm_comm_wait_state and the waits of works), and
 * running a call on the loop's thread (destroy, abort, revoke, split). */
#include <stdio.h>
#include <time.h>

#include "fsm/api-int.h"

static _Thread_local char tls_msg[512];

const char *ncfsm__copy_msg(const ncfsm_comm *c, const char *src) {
  NCFSM__LOCK(c->loop);
  snprintf(tls_msg, sizeof tls_msg, "%s", src);
  NCFSM__UNLOCK(c->loop);
  return tls_msg;
}

/* A flush (or another broadcast) since the spinner read gen. */
static bool flushed(ncfsm_loop *loop, unsigned gen) {
  return atomic_load_explicit(&loop->cv_gen, memory_order_acquire) != gen;
}

ncfsm_result_t ncfsm__wait_until(ncfsm_loop *loop, bool (*pred)(void *), void *arg, uint64_t timeout_ms) {
  uint64_t now = ncfsm__now_ns(), deadline = ncfsm__deadline(now, timeout_ms);
  uint64_t spin_end = 0; /* set at the first spin: one budget of spin_us per wait */
  NCFSM__LOCK(loop);
  if (ncfsm__loop_in_turn(loop) && !pred(arg)) {
    NCFSM__UNLOCK(loop);
    ncfsm__loop_error(loop, "a blocking wait was called from inside one of the loop's callbacks (a work or state "
                            "callback may not wait on its own loop; submit and return instead)");
    return NCFSM_ERR_INVALID_USAGE;
  }
  for (;;) {
    if (pred(arg)) {
      NCFSM__UNLOCK(loop);
      return NCFSM_OK;
    }
    if (deadline && ncfsm__now_ns() > deadline) {
      NCFSM__UNLOCK(loop);
      return NCFSM_ERR_AGAIN;
    }
    if (ncfsm__loop_can_drive(loop)) {
      bool pending = ncfsm__loop_pending(loop);
      NCFSM__UNLOCK(loop);
      if (!pending) return NCFSM_ERR_ILLEGAL_STATE;
      ncfsm_result_t rr = ncfsm_loop_run(loop, NCFSM_RUN_ONCE);
      /* another thread started running the loop meanwhile: wait for it to
       * make the progress (returning would leave a request of the caller's
       * stack queued: ncfsm__on_loop) */
      if (rr != NCFSM_OK && rr != NCFSM_ERR_WRONG_THREAD) return rr;
      NCFSM__LOCK(loop);
    } else if (ncfsm__spin_on(loop) && (!spin_end || (now = ncfsm__now_ns()) < spin_end)) {
      /* Spin before sleeping on cv: until the loop's next broadcast, the
       * wait's deadline or the spin's bound, then look again under the lock;
       * at most 1 ms at a time, as the timed wait below (what no broadcast
       * tells, such as the loop's thread stopping, is seen as soon). */
      if (!spin_end) spin_end = (now = ncfsm__now_ns()) + (uint64_t)loop->opts.spin_us * 1000;
      uint64_t end = spin_end < now + 1000000 ? spin_end : now + 1000000;
      if (deadline && deadline < end) end = deadline;
      unsigned gen = atomic_load_explicit(&loop->cv_gen, memory_order_acquire);
      loop->cv_spinners++;
      NCFSM__UNLOCK(loop);
      bool woken = ncfsm__spin(loop, flushed, gen, end);
      NCFSM__LOCK(loop);
      loop->cv_spinners--;
      loop->spins[NCFSM__SPIN_WAITER][woken ? NCFSM__SPIN_WOKEN : NCFSM__SPIN_BOUND]++;
    } else {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 1000000;
      if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
      }
      ncfsm__loop_cv_wait(loop, &ts);
    }
  }
}

/* ---- a call on the loop's thread ------------------------------------------------------ */

struct on_loop_req {
  ncfsm_loop *loop;
  void (*fn)(void *);
  void *arg;
  bool done;
};

/* q lives on the waiting caller's stack: once done is set (and the lock
 * dropped) the caller may return, so nothing of q is read after that. */
static void on_loop_tramp(void *arg) {
  struct on_loop_req *q = arg;
  ncfsm_loop *loop = q->loop;
  NCFSM__LOCK(loop);
  q->fn(q->arg);
  q->done = true;
  ncfsm__loop_flush_notes(loop);
  ncfsm__loop_cv_broadcast(loop);
  NCFSM__UNLOCK(loop);
}

static bool on_loop_done(void *arg) { return ((struct on_loop_req *)arg)->done; }

void ncfsm__on_loop(ncfsm_loop *loop, ncfsm_comm *hold, void (*fn)(void *), void *arg) {
  NCFSM__LOCK(loop);
  if (ncfsm__loop_can_drive(loop)) {
    fn(arg);
    ncfsm__loop_wake(loop); /* deliver the callbacks this produced */
    NCFSM__UNLOCK(loop);
    return;
  }
  if (hold) hold->refs++; /* the handle stays valid until the loop ran fn */
  NCFSM__UNLOCK(loop);
  struct on_loop_req q = {loop, fn, arg, false};
  if (ncfsm_loop_call(loop, on_loop_tramp, &q) == NCFSM_OK) ncfsm__wait_until(loop, on_loop_done, &q, 0);
  NCFSM__LOCK(loop);
  if (hold) ncfsm__comm_unref(hold);
  NCFSM__UNLOCK(loop);
}

/* ---- waiting for a comm's state ------------------------------------------------------------ */

/* The calls legal in state s, for messages: "ncfsm_comm_abort, ncfsm_comm_revoke". */
static void legal_calls(ncfsm_state_t s, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int k = 0; k < NCFSM_CALL_COUNT && o < len; k++) {
    if (ncfsm_legality(s, (ncfsm_call_t)k, NULL, NULL) == NCFSM_REJECT) continue;
    int w = snprintf(buf + o, len - o, "%s%s", o ? ", " : "", ncfsm_call_fn((ncfsm_call_t)k));
    if (w < 0) break;
    o += (size_t)w;
  }
  if (!buf[0]) snprintf(buf, len, "none");
}

struct state_wait {
  ncfsm_comm *c;
  ncfsm_state_t s;
  bool unreachable;
};

static bool state_reached(void *arg) {
  struct state_wait *sw = arg;
  if (sw->c->state == (unsigned)sw->s) return true;
  /* A state the comm cannot reach even with calls ends the wait at once;
   * one that needs a call (ncfsm_group_end, ncfsm_comm_revoke...) is waited
   * for while something is pending: another thread may make that call. */
  if (!ncfsm__m_reachable(&ncfsm__m_comm, sw->c->state, sw->s, false)) {
    sw->unreachable = true;
    return true;
  }
  return false;
}

ncfsm_result_t ncfsm_comm_wait_state(ncfsm_comm *c, ncfsm_state_t s, uint64_t timeout_ms) {
  if (!ncfsm__comm_ok(c) || (unsigned)s >= NCFSM_STATE_COUNT) return NCFSM_ERR_INVALID_ARGUMENT;
  struct state_wait sw = {c, s, false};
  ncfsm_result_t r = ncfsm__wait_until(c->loop, state_reached, &sw, timeout_ms);
  if (r != NCFSM_OK && r != NCFSM_ERR_ILLEGAL_STATE) return r;
  if (r == NCFSM_OK && !sw.unreachable) return NCFSM_OK;
  NCFSM__LOCK(c->loop);
  char calls[256];
  ncfsm_state_t now = (ncfsm_state_t)c->state;
  legal_calls(now, calls, sizeof calls);
  /* The comm's failure stays readable through ncfsm_comm_failure; it is
   * repeated here so that this message alone says what happened. */
  ncfsm__set_error(c, "ncfsm_comm_wait_state: waiting for %s in state %s: %s; calls legal now: %s%s%s",
                   ncfsm_state_name(s), ncfsm_state_name(now),
                   sw.unreachable                                       ? "it cannot be reached from here"
                   : ncfsm__m_reachable(&ncfsm__m_comm, now, s, true) ? "nothing is pending that could move the communicator on"
                                                                        : "only a call can move the communicator on",
                   calls, c->failure[0] ? "; failure: " : "", c->failure);
  NCFSM__UNLOCK(c->loop);
  return NCFSM_ERR_ILLEGAL_STATE;
}
