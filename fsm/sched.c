/* Who drives a loop and how it is woken: the runner thread, blocking calls
 * that own the loop outside a turn, the turn this thread is inside, and the
 * wakeups (the loop glue's wake hook does the libevent part). */
#include <stdatomic.h>
#include <stdlib.h>

#include "fsm/objects.h"

/* The loop whose turn (or callback) this thread is inside, if any (its
 * accessors are inline in fsm/objects.h). */
_Thread_local ncfsm_loop *ncfsm__tls_in_turn;

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
  ncfsm__loop_cv_broadcast(loop);
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
