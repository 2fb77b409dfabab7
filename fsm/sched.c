/* Who drives a loop and how it is woken: the runner thread, blocking calls
 * that own the loop outside a turn, the turn this thread is inside, and the
 * wakeups (the loop glue's wake hook does the libevent part). */
#include <stdatomic.h>
#include <stdlib.h>

#include "fsm/objects.h"

/* The loop whose turn (or callback) this thread is inside, if any. */
static _Thread_local ncfsm_loop *tls_in_turn;

bool ncfsm__loop_in_turn(const ncfsm_loop *loop) { return tls_in_turn == loop; }

void ncfsm__loop_enter_turn(ncfsm_loop *loop, ncfsm_loop **outer) {
  *outer = tls_in_turn;
  tls_in_turn = loop;
}

void ncfsm__loop_leave_turn(ncfsm_loop *loop, ncfsm_loop *outer) {
  (void)loop;
  tls_in_turn = outer;
}

void ncfsm__loop_set_runner(ncfsm_loop *loop) {
  loop->runner = pthread_self();
  loop->running++;
}

void ncfsm__loop_clear_runner(ncfsm_loop *loop) { loop->running--; }

bool ncfsm__loop_can_drive(ncfsm_loop *loop) {
  return loop->running == 0 || pthread_equal(loop->runner, pthread_self());
}

void ncfsm__loop_claim(ncfsm_loop *loop) {
  ncfsm__loop_set_runner(loop);
  loop->claimed++;
}

void ncfsm__loop_unclaim(ncfsm_loop *loop) {
  loop->claimed--;
  ncfsm__loop_clear_runner(loop);
  pthread_cond_broadcast(&loop->cv);
}

/* A loop with its own base that nobody is running (or that this thread
 * runs) needs no wakeup: ncfsm_loop_run turns it directly when it finds
 * queued work, which saves a libevent round trip per op. */
void ncfsm__loop_wake(ncfsm_loop *loop) {
  loop->kick = true;
  if (loop->own_base && (loop->running == 0 || pthread_equal(loop->runner, pthread_self()))) return;
  loop->ops->wake(loop);
}

void ncfsm__loop_kick_async(ncfsm_loop *loop) {
  atomic_store(&loop->async_kick, 1);
  loop->ops->wake(loop);
}

ncfsm_result_t ncfsm__loop_defer(ncfsm_loop *loop, void (*fn)(void *), void *arg) {
  ncfsm__call_req *r = malloc(sizeof *r);
  if (!r) return NCFSM_ERR_NO_MEMORY;
  *r = (ncfsm__call_req){fn, arg, NULL};
  if (loop->calls_tail) loop->calls_tail->next = r;
  else loop->calls_head = r;
  loop->calls_tail = r;
  loop->kick = true;
  if (!(loop->own_base && (loop->running == 0 || pthread_equal(loop->runner, pthread_self())))) loop->ops->wake(loop);
  return NCFSM_OK;
}
