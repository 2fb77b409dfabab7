/* Works and references: final states and the callbacks' queue, work and
 * comm reference counts, the work free list with its quarantine, completion
 * event marks, and failing a comm's unfinished works. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm/internal.h"
#include "ncfsm/bootstrap.h"

void ncfsm__set_error(ncfsm_comm *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(c->last_error, sizeof c->last_error, "[%s rank %d] ", c->name, c->rank);
  if (n < 0 || (size_t)n >= sizeof c->last_error) n = 0;
  vsnprintf(c->last_error + n, sizeof c->last_error - (size_t)n, fmt, ap);
  va_end(ap);
  NCFSM_INFO(NCFSM__SUB_FSM, "%s", c->last_error);
}

/* ---- comms ------------------------------------------------------------------- */

static void comm_free(ncfsm_comm *c) {
  ncfsm_loop *loop = c->loop;
  if (c->uid_req) ncfsm_boot_req_free(c->uid_req);
  ncfsm__verify_free(c);
  ncfsm__recover_detach(c);
  free(c->uid_buf);
  for (ncfsm_comm **pp = &loop->comms; *pp; pp = &(*pp)->next)
    if (*pp == c) { *pp = c->next; loop->ncomms--; break; }
  while (c->free_marks) {
    ncfsm__mark *m = c->free_marks;
    c->free_marks = m->next_free;
    c->be->event_destroy(m->event);
    free(m);
  }
  if (c->stream) c->be->stream_destroy(c->stream);
  free(c->sq);
  ncfsm__rec_free(c->rec);
  free(c->p2p_send_seq);
  free(c->p2p_recv_seq);
  c->magic = NCFSM__DEAD_MAGIC;
  free(c);
}

void ncfsm__comm_unref(ncfsm_comm *c) {
  if (--c->refs == 0 && c->released) comm_free(c);
}

/* ---- marks ------------------------------------------------------------------- */

ncfsm__mark *ncfsm__mark_get(ncfsm_comm *c) {
  ncfsm__mark *m = c->free_marks;
  if (m) {
    c->free_marks = m->next_free;
  } else {
    m = calloc(1, sizeof *m);
    if (!m) return NULL;
    int rc = c->be->event_create_flags ? c->be->event_create_flags(c->opts.device, c->opts.timing, &m->event)
                                       : c->be->event_create(c->opts.device, &m->event);
    if (rc != 0) {
      free(m);
      return NULL;
    }
  }
  m->refs = 0;
  m->ready_at_final = -1;
  m->next_free = NULL;
  return m;
}

void ncfsm__mark_put(ncfsm_comm *c, ncfsm__mark *m) {
  if (--m->refs > 0) return;
  m->next_free = c->free_marks;
  c->free_marks = m;
}

/* ---- works ------------------------------------------------------------------- */

ncfsm_work *ncfsm__work_alloc(ncfsm_loop *loop) {
  ncfsm_work *w = NULL;
  if (loop->nfree > NCFSM__WORK_QUARANTINE) {
    w = loop->free_head;
    loop->free_head = w->next;
    if (!loop->free_head) loop->free_tail = NULL;
    loop->nfree--;
  } else if (!(w = malloc(sizeof *w))) {
    return NULL;
  }
  memset(w, 0, sizeof *w);
  return w;
}

void ncfsm__work_unref(ncfsm_work *w) {
  if (--w->refs > 0) return;
  ncfsm_comm *c = w->comm;
  ncfsm_loop *loop = c->loop;
  if (w->mark) ncfsm__mark_put(c, w->mark);
  if (w->start_mark) ncfsm__mark_put(c, w->start_mark);
  w->mark = w->start_mark = NULL;
  w->magic = NCFSM__DEAD_MAGIC;
  w->user_held = false;
  w->next = NULL;
  if (loop->free_tail) loop->free_tail->next = w;
  else loop->free_head = w;
  loop->free_tail = w;
  loop->nfree++;
  ncfsm__comm_unref(c);
}

void ncfsm__comm_free_all(ncfsm_loop *loop) {
  while (loop->free_head) {
    ncfsm_work *w = loop->free_head;
    loop->free_head = w->next;
    free(w);
  }
  loop->free_tail = NULL;
  loop->nfree = 0;
}

void ncfsm__work_set_state(ncfsm_work *w, ncfsm_work_state_t st) {
  ncfsm_work_state_t from = w->state;
  w->state = st;
  ncfsm__rec_work(w);
  ncfsm_loop *loop = w->comm->loop;
  if (loop->trace) {
    ncfsm_trace_rec r = {NCFSM_OBJ_WORK, w,        w->comm->rank, w->fp.seq, (int)from, -1,
                         (int)st,        w->status, ncfsm__now_ns()};
    loop->trace(&r, loop->trace_arg);
  }
}

static void stats_note(ncfsm__stats *s, ncfsm_work *w, ncfsm_work_state_t st) {
  if ((unsigned)st < NCFSM_WORK_STATE_COUNT) {
    s->works_final[st]++;
    w->comm->works_final[st]++;
  }
  unsigned k = (unsigned)w->fp.op;
  if (k >= NCFSM_OPKIND_COUNT || w->t_complete < w->t_submit) return;
  uint64_t ns = w->t_complete - w->t_submit, us = (ns + 999) / 1000;
  unsigned b = 0;
  while (b < NCFSM__LAT_BUCKETS - 1 && us > (1ull << b)) b++;
  s->lat_bucket[k][b]++;
  s->lat_count[k]++;
  s->lat_sum_ns[k] += ns;
}

/* Final state: the callback fires once, on the loop thread, at the next flush. */
void ncfsm__work_finish(ncfsm_work *w, ncfsm_work_state_t st, ncfsm_result_t status) {
  if (w->notified) return;
  w->notified = true;
  if (w->sreq) ncfsm__strict_forget(w);
  w->status = status;
  w->t_complete = ncfsm__now_ns();
  ncfsm__work_set_state(w, st);
  ncfsm_loop *loop = w->comm->loop;
  stats_note(&loop->stats, w, st);
  w->next = NULL;
  if (loop->notify_tail) loop->notify_tail->next = w;
  else loop->notify_head = w;
  loop->notify_tail = w;
}

/* ---- failing a comm's works ------------------------------------------------------ */

static void unlink_queue(ncfsm_comm *c, ncfsm__blink *l) {
  ncfsm__blink **pp = &c->bq_head, *prev = NULL;
  while (*pp && *pp != l) { prev = *pp; pp = &(*pp)->next; }
  if (!*pp) return;
  *pp = l->next;
  if (c->bq_tail == l) c->bq_tail = prev;
  l->next = NULL;
  l->c = NULL;
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
        ncfsm__work_finish(w, st, status);
      } else {
        last = w;
        pp = &w->bnext;
      }
    }
    b->tail = last;
    unlink_queue(c, l);
    if (--b->nlive == 0) {
      loop->nqueued--;
      if (b->explicit_group) free(b);
    }
  }
  ncfsm_work **pp = &loop->group_head;
  loop->group_tail = NULL;
  while (*pp) {
    ncfsm_work *w = *pp;
    if (w->comm == c) {
      *pp = w->bnext;
      w->bnext = NULL;
      ncfsm__work_finish(w, st, status);
    } else {
      loop->group_tail = w;
      pp = &w->bnext;
    }
  }
  c->ngroup = 0;
}

void ncfsm__fail_all(ncfsm_comm *c, ncfsm_work_state_t st, ncfsm_result_t status) {
  ncfsm__drop_queued(c, st, status);
  while (c->launching) {
    ncfsm_work *w = c->launching;
    c->launching = w->next;
    ncfsm__work_finish(w, st, status);
  }
  c->launching_tail = NULL;
  for (int i = 0; i < c->nsq; i++) {
    while (c->sq[i].head) {
      ncfsm_work *w = c->sq[i].head;
      c->sq[i].head = w->next;
      ncfsm__work_finish(w, st, status);
    }
    c->sq[i].tail = NULL;
  }
}

bool ncfsm__stream_in_use(ncfsm_loop *loop, void *stream) {
  for (ncfsm_work *w = loop->group_head; w; w = w->bnext)
    if (w->op.stream == stream) return true;
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

uint64_t ncfsm__comm_backend_calls(ncfsm_comm *c) {
  pthread_mutex_lock(&c->loop->mu);
  uint64_t n = c->be_calls;
  pthread_mutex_unlock(&c->loop->mu);
  return n;
}
