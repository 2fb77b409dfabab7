/* fsm-tables.md, the comm's own tables: the calls of the legality table,
 * the poll and control columns of the states, each state's reject hint and
 * the legality of every call in every state (ncfsm_legality). */
#include <stdlib.h>
#include <string.h>

#include "tools/fsm2dot/fsm2dot.h"

#define EMDASH "\xe2\x80\x94"

unsigned fsm2dot_cells_with_guard(unsigned g) {
  unsigned n = 0;
  for (unsigned s = 0; s < fsm2dot_comm.m->nstates; s++)
    for (unsigned c = 0; c < fsm2dot_comm.ncalls; c++) n += fsm2dot_cell(s, c)->guards >> g & 1u;
  return n;
}

static void put_guards(FILE *f, const ncfsm__machine *m, unsigned long long mask, const char *open,
                       const char *close) {
  bool first = true;
  for (unsigned g = 0; g < m->nguards; g++) {
    if (!(mask >> g & 1u)) continue;
    fprintf(f, "%s%s", first ? open : ", ", m->guards[g].name);
    first = false;
  }
  if (!first) fputs(close, f);
}

static void md_calls(FILE *f, const ncfsm__machine *m) {
  fprintf(f, "### Calls of `%s`\n\nThe columns of the legality table.\n\n| Call | Public function |\n|---|---|\n",
          m->name);
  for (unsigned c = 0; c < fsm2dot_comm.ncalls; c++) {
    fprintf(f, "| `%s` | `", fsm2dot_call_name(c));
    put_md(f, fsm2dot_comm.call_fns[c]);
    fputs("` |\n", f);
  }
  fputs("\n", f);
}

static const char *name_or(const char *s) { return s ? s : "?"; }
static const char *or_dash(const char *s) { return s ? s : EMDASH; }

static void md_columns(FILE *f, const ncfsm__machine *m) {
  fprintf(f,
          "### Poll and control columns of `%s`\n\n"
          "A state with flag `POLL` polls the NCCL call in progress; its poll fires one event when the call"
          " returns `ncclSuccess` and another on an error. A state with flag `CONTROL` has a step the loop takes for"
          " the comm at its next turn.\n\n"
          "| State | Flags | Polled call | On success | On error | Control step |\n|---|---|---|---|---|---|\n",
          m->name);
  for (unsigned s = 0; s < m->nstates; s++) {
    const ncfsm__comm_state_cols *col = &fsm2dot_comm.cols[s];
    if (col->poll == NCFSM__PC_NONE && col->control == NCFSM__CS_NONE) continue;
    fprintf(f, "| `%s` | ", m->states[s].name);
    put_flags(f, m, m->states[s].flags, ", ", false);
    if (col->poll != NCFSM__PC_NONE)
      fprintf(f, " | %s | `%s` | `%s` | ", name_or(fsm2dot_poll_name(col->poll)), m->events[col->poll_ok].name,
              m->events[col->poll_err].name);
    else
      fputs(" | " EMDASH " | " EMDASH " | " EMDASH " | ", f);
    fprintf(f, "%s |\n", col->control != NCFSM__CS_NONE ? name_or(fsm2dot_control_name(col->control)) : EMDASH);
  }
  fputs("\n", f);
}

static void md_close_column(FILE *f, const ncfsm__machine *m) {
  fprintf(f,
          "### Close column of `%s`\n\n"
          "Once `ncfsm_comm_close` was accepted, the loop makes this call for the comm in each state it enters"
          " (\"wait\": a transition under way ends the state first), until the handle is released and the close's"
          " callback runs.\n\n"
          "| State | Close step | Why |\n|---|---|---|\n",
          m->name);
  for (unsigned s = 0; s < m->nstates; s++) {
    const ncfsm__comm_state_cols *col = &fsm2dot_comm.cols[s];
    unsigned call = (unsigned)col->close;
    fprintf(f, "| `%s` | %s%s%s | %s |\n", m->states[s].name, call < fsm2dot_comm.ncalls ? "`" : "",
            call < fsm2dot_comm.ncalls ? fsm2dot_comm.call_fns[call] : "wait", call < fsm2dot_comm.ncalls ? "`" : "",
            or_dash(col->close_why));
  }
  fputs("\n", f);
}

/* A matrix cell: ALLOW or DEFER (with [GUARDS]), REJECT (listed with its
 * own hint), or an em dash (not listed: REJECT with the state's hint). */
static void md_cell(FILE *f, const ncfsm__machine *m, const ncfsm__cell *cl) {
  if (!cl->listed) {
    fputs(EMDASH, f);
    return;
  }
  fputs(ncfsm_decision_name((ncfsm_decision_t)cl->decision), f);
  put_guards(f, m, cl->guards, " [", "]");
}

static bool same_cell(const ncfsm__cell *a, const ncfsm__cell *b) {
  return b->listed && a->decision == b->decision && a->guards == b->guards &&
         !strcmp(or_dash(a->rule), or_dash(b->rule)) && !strcmp(or_dash(a->hint), or_dash(b->hint));
}

static void md_matrix(FILE *f, const ncfsm__machine *m) {
  unsigned nc = fsm2dot_comm.ncalls, count[3] = {0}, listed_reject = 0, guarded = 0;
  for (unsigned s = 0; s < m->nstates; s++)
    for (unsigned c = 0; c < nc; c++) {
      const ncfsm__cell *cl = fsm2dot_cell(s, c);
      count[cl->decision < 3 ? cl->decision : 0]++;
      listed_reject += cl->listed && cl->decision == NCFSM_REJECT;
      guarded += cl->decision != NCFSM_REJECT && cl->guards != 0;
    }
  fprintf(f,
          "### Legality of `%s`\n\nWhat `ncfsm_legality(state, call)` decides: %u cells (%u states x %u calls): %u"
          " ALLOW, %u DEFER, %u REJECT (%u listed with their own hint); %u accepted cells have guards. ALLOW: accepted,"
          " the backend is reached now or at the next launch; DEFER: accepted and queued until the comm can launch;"
          " `[GUARDS]`: each must hold too (tried in guard order), else the call gets the first failing guard's"
          " result and hint (below); REJECT: refused with the cell's own hint; " EMDASH
          ": refused with the state's hint.\n\n",
          m->name, m->nstates * nc, m->nstates, nc, count[NCFSM_ALLOW], count[NCFSM_DEFER], count[NCFSM_REJECT],
          listed_reject, guarded);
  fputs("| State |", f);
  for (unsigned c = 0; c < nc; c++) fprintf(f, " %s |", fsm2dot_call_name(c));
  fputs("\n|---|", f);
  for (unsigned c = 0; c < nc; c++) fputs(":---:|", f);
  fputs("\n", f);
  for (unsigned s = 0; s < m->nstates; s++) {
    fprintf(f, "| `%s` |", m->states[s].name);
    for (unsigned c = 0; c < nc; c++) {
      fputc(' ', f);
      md_cell(f, m, fsm2dot_cell(s, c));
      fputs(" |", f);
    }
    fputs("\n", f);
  }
  fputs("\n", f);
}

static void md_hints(FILE *f, const ncfsm__machine *m) {
  fputs("#### Reject hint of each state\n\nWhat a call is told in a cell that is not listed (" EMDASH
        "): `ncfsm_legality`'s rule and hint.\n\n| State | Rule | Hint |\n|---|---|---|\n",
        f);
  for (unsigned s = 0; s < m->nstates; s++) {
    const struct ncfsm__state_hint *h = &fsm2dot_comm.hints[s];
    fprintf(f, "| `%s` | ", m->states[s].name);
    put_md(f, or_dash(h->rule));
    fputs(" | ", f);
    put_md(f, or_dash(h->hint));
    fputs(" |\n", f);
  }
  fputs("\n", f);
}

/* Cells of one state with the same decision, guards, rule and hint are one
 * line: "ALLREDUCE, BROADCAST". */
static void md_listed(FILE *f, const ncfsm__machine *m) {
  unsigned nc = fsm2dot_comm.ncalls;
  bool *done = calloc(nc + 1, 1);
  if (!done) fsm2dot_oom();
  fputs("#### Listed cells\n\nEach listed cell's decision, guards, rule and text: for ALLOW and DEFER what happens to"
        " the call, for REJECT the hint the call reports.\n\n"
        "| State | Calls | Decision | Guards | Rule | Note or hint |\n|---|---|---|---|---|---|\n",
        f);
  for (unsigned s = 0; s < m->nstates; s++) {
    memset(done, 0, nc);
    for (unsigned c = 0; c < nc; c++) {
      const ncfsm__cell *cl = fsm2dot_cell(s, c);
      if (done[c] || !cl->listed) continue;
      fprintf(f, "| `%s` | ", m->states[s].name);
      bool first = true;
      for (unsigned c2 = c; c2 < nc; c2++) {
        if (done[c2] || !same_cell(cl, fsm2dot_cell(s, c2))) continue;
        done[c2] = true;
        fprintf(f, "%s%s", first ? "" : ", ", fsm2dot_call_name(c2));
        first = false;
      }
      fprintf(f, " | %s | ", ncfsm_decision_name((ncfsm_decision_t)cl->decision));
      if (cl->guards)
        put_guards(f, m, cl->guards, "`", "`");
      else
        fputs(EMDASH, f);
      fputs(" | ", f);
      put_md(f, or_dash(cl->rule));
      fputs(" | ", f);
      put_md(f, or_dash(cl->hint));
      fputs(" |\n", f);
    }
  }
  free(done);
  fputs("\n", f);
}

static void md_guard_results(FILE *f, const ncfsm__machine *m) {
  fputs("#### When a guard does not hold\n\nA call in an ALLOW or DEFER cell whose guard does not hold is refused with"
        " the guard's result and hint.\n\n| Guard | Result | Cells | Hint |\n|---|---|---|---|\n",
        f);
  for (unsigned g = 1; g < m->nguards; g++) {
    if (!fsm2dot_cells_with_guard(g)) continue;
    fprintf(f, "| `%s` | `%s` | ", m->guards[g].name, fsm2dot_result_name(m->guards[g].result));
    bool first_state = true;
    for (unsigned s = 0; s < m->nstates; s++) {
      bool first = true;
      for (unsigned c = 0; c < fsm2dot_comm.ncalls; c++) {
        if (!(fsm2dot_cell(s, c)->guards >> g & 1u)) continue;
        if (first) fprintf(f, "%s`%s`: ", first_state ? "" : "; ", m->states[s].name);
        fprintf(f, "%s%s", first ? "" : ", ", fsm2dot_call_name(c));
        first = first_state = false;
      }
    }
    fputs(" | ", f);
    put_md(f, m->guards[g].hint[0] ? m->guards[g].hint : EMDASH);
    fputs(" |\n", f);
  }
  fputs("\n", f);
}

void fsm2dot_md_comm(FILE *f) {
  const ncfsm__machine *m = fsm2dot_comm.m;
  md_calls(f, m);
  md_columns(f, m);
  md_close_column(f, m);
  md_matrix(f, m);
  md_hints(f, m);
  md_listed(f, m);
  md_guard_results(f, m);
}
