/* Push completion (ncfsm_loop_opts.completion PUSH, and AUTO after
 * push_after_us without progress): a host function put on a stream after
 * its last work in flight wakes the loop when the stream gets there
 * (cudaLaunchHostFunc; the sim at its progress), so that a thread waiting
 * for a late peer uses almost no CPU. One host function per stream and
 * wait, not per launch: a host function holds the stream's later work
 * until it has run (measured on one H200: 15-17 us per op otherwise). */
#include <stdlib.h>

#include "fsm/loop-int.h"

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

ncfsm_result_t ncfsm__push_new(ncfsm_loop *loop) {
  ncfsm__notifier *n = calloc(1, sizeof *n);
  if (!n) return NCFSM_ERR_NO_MEMORY;
  pthread_mutex_init(&n->mu, NULL);
  n->refs = 1;
  n->loop = loop;
  loop->notifier = n;
  return NCFSM_OK;
}

/* Before the wake event goes: a host function may be running. */
void ncfsm__push_detach(ncfsm_loop *loop) {
  ncfsm__notifier *n = loop->notifier;
  if (!n) return;
  pthread_mutex_lock(&n->mu);
  n->loop = NULL;
  pthread_mutex_unlock(&n->mu);
  notifier_unref(n);
  loop->notifier = NULL;
}

static bool push_notify(ncfsm_loop *loop, const ncfsm__backend *be, void *stream) {
  ncfsm__notifier *n = loop->notifier;
  if (!n || !be->host_notify || loop->opts.completion == NCFSM_COMPLETION_POLL) return false;
  pthread_mutex_lock(&n->mu);
  n->refs++;
  pthread_mutex_unlock(&n->mu);
  int rc = be->host_notify(stream, push_cb, n);
  if (rc != 0) {
    notifier_unref(n);
    NCFSM_WARN(NCFSM__SUB_LOOP, "push completion: the backend could not enqueue a host function (%d); the loop polls "
                                "instead", rc);
    loop->opts.completion = NCFSM_COMPLETION_POLL;
    return false;
  }
  atomic_fetch_add(&n->posted, 1);
  return true;
}

bool ncfsm__push_covers(ncfsm_loop *loop) {
  if (loop->opts.completion == NCFSM_COMPLETION_POLL || !loop->notifier || loop->ctl || loop->nqueued) return false;
  for (ncfsm_comm *c = loop->act_head; c; c = c->act_next) /* the others have none of these */
    if ((ncfsm__sflags(c->state) & (NCFSM_SF_POLL | NCFSM_SF_CONTROL)) || c->launching || (c->vops && c->vops->busy(c)))
      return false;
  return true;
}

bool ncfsm__push_arm_streams(ncfsm_loop *loop) {
  for (ncfsm_comm *c = loop->act_head; c; c = c->act_next) /* the others have no works in flight */
    for (int i = 0; i < c->nsq; i++) {
      ncfsm__squeue *q = &c->sq[i];
      if (!q->head || q->notified == q->appended) continue;
      if (!push_notify(loop, c->be, q->stream)) return false;
      q->notified = q->appended;
    }
  return true;
}
