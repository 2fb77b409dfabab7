/* fsm-tables.md: every machine's flags, states, events, guards, actions and
 * transition rows, in the order of its .def file; the comm's own tables
 * follow its section (render_md_comm.c). */
#include <stdlib.h>

#include "tools/fsm2dot/fsm2dot.h"

#define EMDASH "\xe2\x80\x94"
#define PL(n) ((n) == 1 ? "" : "s")

static unsigned guarded_rows(const ncfsm__machine *m) {
  unsigned n = 0;
  for (unsigned i = 0; i < m->nrows; i++) n += m->rows[i].guard != 0;
  return n;
}

static unsigned pairs(const ncfsm__machine *m) {
  unsigned n = 0;
  for (unsigned s = 0; s < m->nstates; s++)
    for (unsigned e = 0; e < m->nevents; e++) n += ncfsm__m_has_row(m, s, e);
  return n;
}

static unsigned call_events(const ncfsm__machine *m) {
  unsigned n = 0;
  for (unsigned e = 0; e < m->nevents; e++) n += m->events[e].source == NCFSM__M_CALL;
  return n;
}

static void md_header(FILE *f) {
  fputs("# ncfsm state tables\n\n"
        "> Generated from `fsm/*.def` by `tools/fsm2dot`; do not edit by hand.\n"
        "> Regenerate with `make docs` (`cmake --build <builddir> --target fsm-docs`); the\n"
        "> golden test (`tests/golden`) fails when this file, the diagrams' sources\n"
        "> (`docs/fsm-*.dot`) or `include/ncfsm/states.h` drift from the tables.\n"
        "> Rule ids (R1, R2, ...) name NCCL's usage rules, as `docs/design.md` cites them.\n\n"
        "Every lifecycle of ncfsm is a table in one format (`fsm/machine.h`), run by one\n"
        "dispatcher. A row `(state, event) [guard] -> next / action` fires when the event\n"
        "happens in the state and its guard holds; the rows of one (state, event) are tried\n"
        "in table order, and an event with no row whose guard holds is invalid in that state.\n\n",
        f);
  fputs("| Machine | What it is | States | Events | Guards | Actions | Rows | Diagram |\n"
        "|---|---|---|---|---|---|---|---|\n",
        f);
  for (const ncfsm__machine *const *mp = ncfsm__machines; *mp; mp++) {
    const ncfsm__machine *m = *mp;
    fprintf(f, "| [`%s`](#machine-%s) | ", m->name, m->name);
    put_md(f, m->desc);
    unsigned calls = call_events(m);
    fprintf(f, " | %u | %u (%u CALL, %u LOOP) | %u | %u | %u | [fsm-%s.svg](fsm-%s.svg) |\n", m->nstates, m->nevents,
            calls, m->nevents - calls, m->nguards, m->nactions, m->nrows, m->name, m->name);
  }
  const ncfsm__machine *c = fsm2dot_comm.m;
  bool *rows = calloc(c->nrows + 1, 1);
  if (!rows) fsm2dot_oom();
  unsigned n = fsm2dot_happy_rows(rows);
  free(rows);
  fprintf(f,
          "\nThe happy path of `%s` alone, %u rows: [fsm-%s-happy.svg](fsm-%s-happy.svg) (source\n"
          "[fsm-%s-happy.dot](fsm-%s-happy.dot)). The rows drawn: %s.\n\n",
          c->name, n, c->name, c->name, c->name, c->name, fsm2dot_happy_rule);
}

static void md_flags(FILE *f, const ncfsm__machine *m) {
  if (!m->nflags) return;
  fprintf(f, "### Flags of `%s`\n\nState attributes: bit i of a state's flags is the i-th flag.\n\n", m->name);
  fputs("| Flag | Meaning | States |\n|---|---|---|\n", f);
  for (unsigned i = 0; i < m->nflags; i++) {
    fprintf(f, "| `%s` | ", m->flags[i].name);
    put_md(f, m->flags[i].desc);
    fputs(" | ", f);
    bool first = true;
    for (unsigned s = 0; s < m->nstates; s++)
      if (m->states[s].flags >> i & 1u) {
        fprintf(f, "%s`%s`", first ? "" : ", ", m->states[s].name);
        first = false;
      }
    fputs(first ? EMDASH " |\n" : " |\n", f);
  }
  fputs("\n", f);
}

static void md_states(FILE *f, const ncfsm__machine *m) {
  fprintf(f, "### States of `%s`\n\n`%s` is the initial state; a state from which no row leads elsewhere is marked"
             " final.\n\n", m->name, m->states[m->initial].name);
  fputs("| State | Flags | Description |\n|---|---|---|\n", f);
  for (unsigned s = 0; s < m->nstates; s++) {
    fprintf(f, "| `%s`%s%s | ", m->states[s].name, s == m->initial ? " (initial)" : "",
            fsm2dot_terminal(m, s) ? " (final)" : "");
    if (m->states[s].flags)
      put_flags(f, m, m->states[s].flags, ", ", false);
    else
      fputs(EMDASH, f);
    fputs(" | ", f);
    put_md(f, m->states[s].desc);
    fputs(" |\n", f);
  }
  fputs("\n", f);
}

static void md_events(FILE *f, const ncfsm__machine *m) {
  fprintf(f, "### Events of `%s`\n\nCALL: a user's call causes the event; LOOP: the engine does, from what it"
             " observes.\n\n", m->name);
  fputs("| Event | Source | Description | States with a row |\n|---|---|---|---|\n", f);
  for (unsigned e = 0; e < m->nevents; e++) {
    fprintf(f, "| `%s` | %s | ", m->events[e].name, m->events[e].source == NCFSM__M_CALL ? "CALL" : "LOOP");
    put_md(f, m->events[e].desc);
    fprintf(f, " | %u |\n", fsm2dot_event_states(m, e));
  }
  fputs("\n", f);
}

static void md_guards(FILE *f, const ncfsm__machine *m) {
  bool comm = m == fsm2dot_comm.m;
  fprintf(f, "### Guards of `%s`\n\nConditions a row (or a legality cell) depends on; `ANY` always holds and is never"
             " evaluated. The result is what a call gets when the guard of its legality cell does not hold.\n\n",
          m->name);
  fprintf(f, "| Guard | Holds when | Result | Hint | Rows |%s\n|---|---|---|---|---|%s\n", comm ? " Legality cells |" : "",
          comm ? "---|" : "");
  for (unsigned g = 0; g < m->nguards; g++) {
    unsigned rows = 0;
    for (unsigned i = 0; i < m->nrows; i++) rows += m->rows[i].guard == g;
    fprintf(f, "| `%s` | ", m->guards[g].name);
    put_md(f, m->guards[g].cond);
    if (g)
      fprintf(f, " | `%s` | ", fsm2dot_result_name(m->guards[g].result));
    else
      fputs(" | " EMDASH " | ", f);
    put_md(f, m->guards[g].hint[0] ? m->guards[g].hint : EMDASH);
    fprintf(f, " | %u |", rows);
    if (comm) fprintf(f, " %u |", fsm2dot_cells_with_guard(g));
    fputs("\n", f);
  }
  fputs("\n", f);
}

static void md_actions(FILE *f, const ncfsm__machine *m) {
  fprintf(f, "### Actions of `%s`\n\nWhat the engine does after a row changed the state; `none` does nothing and is"
             " never called.\n\n", m->name);
  fputs("| Action | What it does | Rows (event from states) |\n|---|---|---|\n", f);
  for (unsigned a = 0; a < m->nactions; a++) {
    fprintf(f, "| `%s` | ", m->actions[a].name);
    put_md(f, m->actions[a].desc);
    fputs(" | ", f);
    bool first_ev = true;
    for (unsigned e = 0; e < m->nevents; e++) {
      bool first = true;
      for (unsigned s = 0; s < m->nstates; s++) {
        bool uses = false;
        for (unsigned i = 0; i < ncfsm__m_nrows(m, s, e) && !uses; i++) uses = ncfsm__m_row(m, s, e, i)->action == a;
        if (!uses) continue;
        if (first) fprintf(f, "%s`%s` from ", first_ev ? "" : "; ", m->events[e].name);
        fprintf(f, "%s`%s`", first ? "" : ", ", m->states[s].name);
        first = first_ev = false;
      }
    }
    fputs(first_ev ? EMDASH " |\n" : " |\n", f);
  }
  fputs("\n", f);
}

static void md_rows(FILE *f, const ncfsm__machine *m) {
  unsigned p = pairs(m);
  fprintf(f,
          "### Transitions of `%s`\n\nThe rows in table order (" EMDASH ": guard `ANY`). %u of the %u (state, event)"
          " pairs have rows; an event in one of the other %u is invalid.\n\n",
          m->name, p, m->nstates * m->nevents, m->nstates * m->nevents - p);
  fputs("| # | State | Event | Guard | Next | Action | Rule |\n|---|---|---|---|---|---|---|\n", f);
  for (unsigned i = 0; i < m->nrows; i++) {
    const ncfsm__mrow *r = &m->rows[i];
    fprintf(f, "| %u | `%s` | `%s` | ", i + 1, m->states[r->s].name, m->events[r->e].name);
    if (r->guard)
      fprintf(f, "`%s`", m->guards[r->guard].name);
    else
      fputs(EMDASH, f);
    fprintf(f, " | `%s` | `%s` | ", m->states[r->next].name, m->actions[r->action].name);
    put_md(f, r->rule);
    fputs(" |\n", f);
  }
  fputs("\n", f);
}

static void md_machine(FILE *f, const ncfsm__machine *m) {
  fprintf(f, "## Machine %s\n\n`%s`: ", m->name, m->name);
  put_md(f, m->desc);
  unsigned calls = call_events(m), rows = guarded_rows(m), p = pairs(m);
  fprintf(f, " (`fsm/%s.def`; diagram [fsm-%s.svg](fsm-%s.svg), source [fsm-%s.dot](fsm-%s.dot)).\n\n", m->name,
          m->name, m->name, m->name, m->name);
  fprintf(f, "%u state%s, %u flag%s, %u event%s (%u CALL, %u LOOP), %u guard%s, %u action%s, %u transition row%s (%u with a"
             " guard) over %u (state, event) pair%s.\n\n",
          m->nstates, PL(m->nstates), m->nflags, PL(m->nflags), m->nevents, PL(m->nevents), calls, m->nevents - calls,
          m->nguards, PL(m->nguards), m->nactions, PL(m->nactions), m->nrows, PL(m->nrows), rows, p, PL(p));
  md_flags(f, m);
  md_states(f, m);
  md_events(f, m);
  md_guards(f, m);
  md_actions(f, m);
  md_rows(f, m);
}

void fsm2dot_md(FILE *f) {
  md_header(f);
  for (const ncfsm__machine *const *mp = ncfsm__machines; *mp; mp++) {
    md_machine(f, *mp);
    if (*mp == fsm2dot_comm.m) fsm2dot_md_comm(f);
  }
}
