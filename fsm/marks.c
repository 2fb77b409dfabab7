/* Completion marks: one CUDA event per (launch, stream), shared by the
 * works of that launch on that stream, recycled per comm. */
#include <stdlib.h>

#include "fsm/objects.h"

ncfsm__mark *ncfsm__mark_get(ncfsm_comm *c) {
  ncfsm__mark *m = c->free_marks;
  if (m) {
    c->free_marks = m->next_free;
    c->nfree_marks--;
    c->loop->pool.marks_free--;
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
  c->nfree_marks++;
  c->loop->pool.marks_free++;
}

int ncfsm__marks_trim(ncfsm_comm *c, int keep) {
  ncfsm__mark **pp = &c->free_marks;
  for (int i = 0; i < keep && *pp; i++) pp = &(*pp)->next_free; /* the most recently used stay */
  int n = 0;
  while (*pp) {
    ncfsm__mark *m = *pp;
    *pp = m->next_free;
    c->be->event_destroy(m->event);
    free(m);
    n++;
  }
  c->nfree_marks -= n;
  c->loop->pool.marks_free -= n;
  return n;
}
