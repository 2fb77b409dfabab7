/* Layer 2: the submissions handed off while another thread held the loop's
 * lock, taken by the next holder (fsm/submit.h; docs/design.md "Submissions
 * from other threads"). */
#include <stdio.h>

#include "fsm/submit.h"

/* Works put on the spare stack per take: what one thread's cache can hold (it takes the stack whole). */
#define NCFSM__SPARE_MAX 64

/* One handed-off work joins its comm (the lock held); false: it failed its check. */
static bool handoff_enter(ncfsm_loop *loop, ncfsm_work *w) {
  ncfsm_comm *c = w->comm;
  ncfsm_call_t call = (ncfsm_call_t)w->call;
  ncfsm_result_t r = NCFSM_OK;
  /* Never into a group: its submitter owned none, whichever thread takes it. */
  if (c->ngroup > 0) {
    r = NCFSM_ERR_WRONG_THREAD;
    ncfsm__set_error(c, "%s: illegal in state %s: %s", ncfsm_call_fn(call), ncfsm_state_name((ncfsm_state_t)c->state),
                     ncfsm__m_comm.guards[NCFSM__CG_GROUP_THREAD].hint);
  } else if (!ncfsm__legal_fast(c->state, call, c->ngroup, c->nranks)) {
    (void)ncfsm__check_legal_for_other(c, call, &r); /* the taker's group is not the submitter's */
  }
  if (r == NCFSM_OK) {
    ncfsm__work_enter(loop, c, w, false);
  } else {
    /* Recorded, never queued: it fails with the check's result, its callback
     * queued (fsm/work.def: QUEUED --FAIL--> FAILED). */
    ncfsm__work_record(loop, c, w);
    ncfsm__work_end(w, NCFSM_WORK_FAILED, r);
    ncfsm__loop_wake(loop); /* its callback: at the next turn, which a loop asleep needs woken for */
  }
  return r == NCFSM_OK;
}

void ncfsm__handoff_take(ncfsm_loop *loop) {
  ncfsm_work *w = atomic_exchange_explicit(&loop->handoff, NULL, memory_order_acquire), *fifo = NULL;
  int n = 0;
  for (ncfsm_work *next; w; w = next, n++) { /* newest first: reversed, oldest first */
    ncfsm__prefetch_work(w); /* written by its submitter on another core: its lines come meanwhile */
    next = w->next;
    w->next = fifo;
    fifo = w;
  }
  if (!n) return;
  atomic_fetch_sub_explicit(&loop->nhandoff, n, memory_order_relaxed);
  loop->handoffs += (uint64_t)n;
  loop->pool.allocs += (uint64_t)n;
  int failed = 0;
  ncfsm_comm *first = NULL; /* the comm of the first that failed: its last error says why */
  for (ncfsm_work *next; fifo; fifo = next) {
    next = fifo->next;
    fifo->next = NULL;
    ncfsm_comm *c = fifo->comm;
    if (!handoff_enter(loop, fifo) && !failed++) first = c;
  }
  if (failed) /* one warning per take: a comm failing under a stream fails many */
    NCFSM_WARN(NCFSM__SUB_FSM, "[%s rank %d] %d of %d submissions handed off while the loop was busy failed their "
                               "check; the first: %s",
               first->name, first->rank, failed, n, first->last_error);
  /* As many works for the next hand-offs, from the pool past its quarantine
   * (the oldest), when the spare stack is empty: one chain, taken whole. */
  if (atomic_load_explicit(&loop->spare, memory_order_relaxed)) return;
  ncfsm_work *head = NULL, *tail = NULL;
  for (int k = 0; k < n && k < NCFSM__SPARE_MAX && loop->nfree > NCFSM__WORK_QUARANTINE; k++) {
    ncfsm_work *x = loop->free_head;
    loop->free_head = x->next;
    if (!loop->free_head) loop->free_tail = NULL;
    loop->nfree--;
    x->next = NULL;
    if (tail) tail->next = x;
    else head = x;
    tail = x;
  }
  if (!head) return;
  ncfsm_work *h = atomic_load_explicit(&loop->spare, memory_order_relaxed);
  do tail->next = h;
  while (!atomic_compare_exchange_weak_explicit(&loop->spare, &h, head, memory_order_release, memory_order_relaxed));
}

