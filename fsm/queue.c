/* Where a comm's works wait: the loop's open group, the per-comm launch
 * queues of batches, the launching list and the per-stream in-flight
 * queues; taking a batch off the queues, failing works wherever they wait,
 * and observing completion events. Nothing here decides what launches
 * (fsm/launcher.c) or how a comm fails (fsm/fail.c). */
#include <stdlib.h>

#include "fsm/objects.h"

void ncfsm__batch_queue(ncfsm_loop *loop, ncfsm__batch *b) {
  b->nlive = b->nlinks;
  b->order = ++loop->batch_order; /* before the heap sees it: its key */
  loop->nqueued++;
  for (int i = 0; i < b->nlinks; i++) {
    ncfsm__blink *l = &b->links[i];
    ncfsm_comm *c = l->c;
    l->b = b;
    l->next = NULL;
    if (c->vops && c->opts.verify == NCFSM_VERIFY_STRICT) /* only strict looks at works as they queue */
      for (ncfsm_work *w = b->head; w; w = w->bnext)
        if (w->comm == c && w->fp.peer < 0) c->vops->queued(c, w);
    if (c->bq_tail) c->bq_tail->next = l;
    else c->bq_head = l;
    c->bq_tail = l;
    ncfsm__comm_enlist(c);
    if (!c->qh_pos) ncfsm__qheap_fix(c); /* its queue was empty: b heads it */
  }
}

/* Unlink l from its comm's queue, wherever it is in it. */
static void unlink_queue(ncfsm_comm *c, ncfsm__blink *l) {
  ncfsm__blink **pp = &c->bq_head, *prev = NULL;
  while (*pp && *pp != l) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  if (!*pp) return;
  *pp = l->next;
  if (c->bq_tail == l) c->bq_tail = prev;
  l->next = NULL;
  l->c = NULL;
  if (!prev) ncfsm__qheap_fix(c); /* its head changed */
}

void ncfsm__batch_take(ncfsm_loop *loop, ncfsm__batch *b, ncfsm_work **head, ncfsm_work **tail) {
  for (int i = 0; i < b->nlinks; i++) {
    ncfsm__blink *l = &b->links[i];
    ncfsm_comm *c = l->c;
    if (!c) continue;
    c->bq_head = l->next;
    if (!c->bq_head) c->bq_tail = NULL;
    l->next = NULL;
    l->c = NULL;
    ncfsm__qheap_fix(c);
  }
  loop->nqueued--;
  for (ncfsm_work *w = b->head; w; w = w->bnext) w->batch = NULL;
  if (*tail) (*tail)->bnext = b->head;
  else *head = b->head;
  *tail = b->tail;
  if (b->allocated) free(b);
}

void ncfsm__batch_fail(ncfsm_loop *loop, ncfsm__batch *b, ncfsm_work_state_t st, ncfsm_result_t status) {
  for (int i = 0; i < b->nlinks; i++)
    if (b->links[i].c) unlink_queue(b->links[i].c, &b->links[i]);
  loop->nqueued--;
  for (ncfsm_work *x = b->head, *next; x; x = next) {
    next = x->bnext;
    x->batch = NULL;
    x->bnext = NULL;
    ncfsm__work_end(x, st, status);
  }
  b->head = b->tail = NULL;
  b->nworks = 0;
  if (b->allocated) free(b);
}

void ncfsm__drop_queued(ncfsm_comm *c, ncfsm_work_state_t st, ncfsm_result_t status) {
  ncfsm_loop *loop = c->loop;
  while (c->bq_head) {
    ncfsm__blink *l = c->bq_head;
    ncfsm__batch *b = l->b;
    ncfsm_work **pp = &b->head, *last = NULL;
    while (*pp) {
      ncfsm_work *w = *pp;
      if (w->comm == c) {
        *pp = w->bnext;
        b->nworks--;
        w->batch = NULL;
        w->bnext = NULL;
        ncfsm__work_end(w, st, status);
      } else {
        last = w;
        pp = &w->bnext;
      }
    }
    b->tail = last;
    unlink_queue(c, l);
    if (--b->nlive == 0) {
      loop->nqueued--;
      if (b->allocated) free(b);
    }
  }
  ncfsm_work **pp = &loop->group_head;
  loop->group_tail = NULL;
  while (*pp) {
    ncfsm_work *w = *pp;
    if (w->comm == c) {
      *pp = w->bnext;
      w->bnext = NULL;
      ncfsm__work_end(w, st, status);
    } else {
      loop->group_tail = w;
      pp = &w->bnext;
    }
  }
  ncfsm_work *hw = ncfsm__held_op(loop); /* a group held back on its thread (fsm/held.def) holds it */
  if (hw && hw->comm == c) {
    loop->held.w = NULL;
    ncfsm__work_end(hw, st, status);
  }
  c->ngroup = 0;
}

void ncfsm__fail_all(ncfsm_comm *c, ncfsm_work_state_t st, ncfsm_result_t status) {
  ncfsm__drop_queued(c, st, status);
  while (c->launching) {
    ncfsm_work *w = c->launching;
    c->launching = w->next;
    ncfsm__work_end(w, st, status);
  }
  c->launching_tail = NULL;
  for (int i = 0; i < c->nsq; i++) {
    while (c->sq[i].head) {
      ncfsm_work *w = c->sq[i].head;
      c->sq[i].head = w->next;
      c->ninflight--;
      ncfsm__work_end(w, st, status);
    }
    c->sq[i].tail = NULL;
  }
}

bool ncfsm__comm_idle(const ncfsm_comm *c) {
  return c->ngroup == 0 && !c->bq_head && !c->launching && !ncfsm__comm_inflight(c);
}

bool ncfsm__stream_in_use(ncfsm_loop *loop, void *stream) {
  for (ncfsm_work *w = loop->group_head; w; w = w->bnext)
    if (w->op.stream == stream) return true;
  const ncfsm_work *hw = ncfsm__held_op(loop); /* a group held back on its thread (fsm/held.def) */
  if (hw && hw->op.stream == stream) return true;
  for (ncfsm_comm *c = loop->comms; c; c = c->next) {
    for (ncfsm__blink *l = c->bq_head; l; l = l->next)
      for (ncfsm_work *w = l->b->head; w; w = w->bnext)
        if (w->op.stream == stream) return true;
    for (ncfsm_work *w = c->launching; w; w = w->next)
      if (w->op.stream == stream) return true;
    for (int i = 0; i < c->nsq; i++)
      if (c->sq[i].stream == stream && c->sq[i].head) return true;
  }
  return false;
}

int ncfsm__drain(ncfsm_comm *c) {
  int progress = 0;
  for (int i = 0; i < c->nsq; i++) {
    ncfsm__squeue *q = &c->sq[i];
    while (q->head) {
      ncfsm__mark *m = q->head->mark;
      int rc = c->be->event_query(m->event);
      if (rc == 1) break;
      if (rc != 0) return -1;
      while (q->head && q->head->mark == m) {
        ncfsm_work *w = q->head;
        q->head = w->next;
        c->ninflight--;
        if (w->start_mark && c->be->event_elapsed_ms(w->start_mark->event, m->event, &w->device_ms) != 0)
          w->device_ms = -1;
        ncfsm__work_fire(w, NCFSM__WE_COMPLETE, NULL);
      }
      if (!q->head) q->tail = NULL;
      progress = 1;
    }
  }
  return progress;
}
