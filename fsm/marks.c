/* Completion marks: one CUDA event per (launch, stream), shared by the
 * works of that launch on that stream, recycled per comm. */
#include <stdlib.h>

#include "fsm/objects.h"

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
