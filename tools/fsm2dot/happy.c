/* fsm-comm-happy.dot: the communicator's life when nothing fails, derived
 * from its table (fsm2dot_happy_rule says how), drawn alone. */
#include <stdlib.h>
#include <string.h>

#include "tools/fsm2dot/fsm2dot.h"

const char fsm2dot_happy_rule[] =
    "one walk from the initial state for each event that leaves it, is failure-free (no row of it enters a state"
    " with flag FAILED) and does not enter a state with flag END; at each state a walk takes the first such event,"
    " in the order the table declares them, that it has not taken yet and whose unguarded row (else its last)"
    " leaves the state, one into an END state only when no other is left (the close)";

/* Some row of e enters a state with flag FAILED. */
static bool failing(const ncfsm__machine *m, unsigned e) {
  for (unsigned i = 0; i < m->nrows; i++)
    if (m->rows[i].e == e && (m->states[m->rows[i].next].flags & fsm2dot_comm.flag_failed)) return true;
  return false;
}

/* The row a walk takes from s with e, or NULL: e failure-free and not
 * taken, its row leaves s, and enters an END state only when `end`. */
static const ncfsm__mrow *step(const ncfsm__machine *m, unsigned s, unsigned e, const bool *taken, bool end) {
  if (taken[e] || failing(m, e)) return NULL;
  const ncfsm__mrow *r = fsm2dot_default_row(m, s, e);
  if (!r || r->next == s) return NULL;
  bool enters_end = (m->states[r->next].flags & fsm2dot_comm.flag_end) != 0;
  return !enters_end || end ? r : NULL;
}

static unsigned walk(const ncfsm__machine *m, unsigned first, bool *rows) {
  bool *taken = calloc(m->nevents, 1);
  if (!taken) fsm2dot_oom();
  unsigned n = 0, s = m->initial;
  const ncfsm__mrow *r = step(m, s, first, taken, false);
  while (r) {
    taken[r->e] = true;
    n += !rows[r - m->rows];
    rows[r - m->rows] = true;
    s = r->next;
    r = NULL;
    for (unsigned pass = 0; pass < 2 && !r; pass++) /* pass 1: the close */
      for (unsigned e = 0; e < m->nevents && !r; e++) r = step(m, s, e, taken, pass == 1);
  }
  free(taken);
  return n;
}

unsigned fsm2dot_happy_rows(bool *rows) {
  const ncfsm__machine *m = fsm2dot_comm.m;
  bool *none = calloc(m->nevents, 1);
  if (!none) fsm2dot_oom();
  unsigned n = 0;
  for (unsigned e = 0; e < m->nevents; e++)
    if (step(m, m->initial, e, none, false)) n += walk(m, e, rows);
  free(none);
  return n;
}

void fsm2dot_happy(FILE *f) {
  const ncfsm__machine *m = fsm2dot_comm.m;
  bool *rows = calloc(m->nrows + 1, 1), *on = calloc(m->nstates, 1);
  if (!rows || !on) fsm2dot_oom();
  fsm2dot_happy_rows(rows);
  on[m->initial] = true;
  for (unsigned i = 0; i < m->nrows; i++)
    if (rows[i]) on[m->rows[i].s] = on[m->rows[i].next] = true;

  struct mstr t;
  fprintf(mstr_open(&t), "the happy path of machine %s (fsm/%s.def): %s, when nothing fails", m->name, m->name, m->desc);
  mstr_close(&t);
  struct mstr l;
  fprintf(mstr_open(&l),
          "edge label: EVENT [GUARD] / action (rule); bold dark edges: a user's call (CALL events); thin teal edges: "
          "the loop (LOOP events)\nthe rows drawn: %s\nevery row of the machine: fsm-%s.svg",
          fsm2dot_happy_rule, m->name);
  mstr_close(&l);
  char graph[64];
  snprintf(graph, sizeof graph, "ncfsm_%s_happy", m->name);
  dot_open(f, graph, m, t.p, l.p);
  free(t.p);
  free(l.p);

  for (unsigned s = 0; s < m->nstates; s++)
    if (on[s]) dot_state(f, m, s);
  dot_start(f, m);
  fputs("\n", f);
  for (unsigned i = 0; i < m->nrows; i++) {
    if (!rows[i]) continue;
    const ncfsm__mrow *r = &m->rows[i];
    const ncfsm__mevent *ev = &m->events[r->e];
    bool call = ev->source == NCFSM__M_CALL;
    fprintf(f, "  %s -> %s [color=\"%s\", penwidth=%s, label=<<FONT COLOR=\"%s\">%s", m->states[r->s].name,
            m->states[r->next].name, call ? DOT_CALL : DOT_LOOP, call ? "2.2" : "1.0", call ? DOT_CALL : DOT_LOOP,
            call ? "<B>" : "");
    struct mstr lab;
    put_row_label(mstr_open(&lab), m, ev->name, r);
    mstr_close(&lab);
    put_html(f, lab.p);
    fprintf(f, "%s</FONT>>, tooltip=\"%s -> %s: %s (%s): ", call ? "</B>" : "", m->states[r->s].name,
            m->states[r->next].name, ev->name, call ? "CALL" : "LOOP");
    put_dot(f, ev->desc);
    fprintf(f, "; action %s: ", m->actions[r->action].name);
    put_dot(f, m->actions[r->action].desc);
    fputs("\"];\n", f);
    free(lab.p);
  }
  fputs("}\n", f);
  free(rows);
  free(on);
}
