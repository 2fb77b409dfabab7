/* fsm-<machine>.dot: one Graphviz diagram of a machine, every state with
 * its flags and every row as an edge labelled EVENT [GUARD] / action (rule).
 * The events that apply almost everywhere (fsm2dot_bundled) are drawn light
 * and bundled through one point per target, so that the lifecycle stands
 * out. */
#include <stdlib.h>
#include <string.h>

#include "tools/fsm2dot/fsm2dot.h"

#define COL_CALL DOT_CALL
#define COL_LOOP DOT_LOOP
#define COL_LIGHT "#a8a8a8"
#define COL_LIGHT_TXT "#8a8a8a"
#define MIDDOT " \xc2\xb7 "

/* A state is filled with the colour of its last flag (table order). */
static const char *const palette[] = {"#fdf3d3", "#fbe3c4", "#e2ecd9", "#cfe8c9", "#e6def5",
                                      "#d7ebf3", "#fde2de", "#e4e4e4", "#f5e1ef", "#e9e4d4"};
#define NPALETTE (sizeof palette / sizeof palette[0])
#define NO_FLAG_FILL "#f4f6fa"

static const char *flag_fill(unsigned i) { return palette[i % NPALETTE]; }

static const char *state_fill(const ncfsm__machine *m, unsigned s) {
  unsigned f = m->states[s].flags;
  if (!f) return NO_FLAG_FILL;
  return flag_fill(31u - (unsigned)__builtin_clz(f));
}

void dot_open(FILE *f, const char *graph, const ncfsm__machine *m, const char *title, const char *legend) {
  fprintf(f,
          "// Generated from fsm/%s.def by tools/fsm2dot; do not edit by hand.\n"
          "// Regenerate: make docs (cmake --build <builddir> --target fsm-docs).\n"
          "digraph %s {\n"
          "  graph [rankdir=TB, fontname=\"Helvetica\", fontsize=13, nodesep=0.45, ranksep=0.55,"
          " newrank=true, labelloc=t,\n         label=\"",
          m->name, graph);
  put_dot_wrapped(f, title, 110);
  fputs("\\n", f);
  put_dot_wrapped(f, legend, 110);
  fputs("\"];\n"
        "  node [shape=box, style=\"rounded,filled\", color=\"" COL_CALL "\", fontname=\"Helvetica\","
        " fontsize=11, margin=\"0.15,0.05\"];\n"
        "  edge [fontname=\"Helvetica\", fontsize=9, arrowsize=0.7];\n\n",
        f);
  if (!m->nflags) return;
  /* the flags' colours: one row of cells */
  fputs("  __legend [shape=plaintext, style=\"\", margin=0, label=<<TABLE BORDER=\"0\" CELLBORDER=\"1\""
        " CELLSPACING=\"0\" CELLPADDING=\"3\"><TR><TD BORDER=\"0\"><FONT POINT-SIZE=\"9\">fill: the state's last"
        " flag</FONT></TD>",
        f);
  for (unsigned i = 0; i < m->nflags; i++) {
    fprintf(f, "<TD BGCOLOR=\"%s\" TOOLTIP=\"", flag_fill(i));
    put_html(f, m->flags[i].desc);
    fputs("\"><FONT POINT-SIZE=\"9\">", f);
    put_html(f, m->flags[i].name);
    fputs("</FONT></TD>", f);
  }
  fputs("<TD BGCOLOR=\"" NO_FLAG_FILL "\"><FONT POINT-SIZE=\"9\">no flag</FONT></TD></TR></TABLE>>];\n", f);
}

void dot_state(FILE *f, const ncfsm__machine *m, unsigned s) {
  const ncfsm__mstate *st = &m->states[s];
  fprintf(f, "  %s [", st->name);
  if (st->flags) {
    fprintf(f, "label=<%s<BR/><FONT POINT-SIZE=\"8\" COLOR=\"#555555\">", st->name);
    put_flags(f, m, st->flags, MIDDOT, true);
    fputs("</FONT>>, ", f);
  }
  if (fsm2dot_terminal(m, s)) fputs("peripheries=2, ", f);
  fprintf(f, "fillcolor=\"%s\", tooltip=\"%s: ", state_fill(m, s), st->name);
  put_dot(f, st->desc);
  fputs("\"];\n", f);
}

void dot_start(FILE *f, const ncfsm__machine *m) {
  fprintf(f,
          "  __start [shape=point, width=0.14, style=filled, color=black, label=\"\", tooltip=\"initial state\"];\n"
          "  { rank=source; __start;%s }\n"
          "  __start -> %s [tooltip=\"initial state\"];\n",
          m->nflags ? " __legend;" : "", m->states[m->initial].name);
}

/* Rows of one source, target, guard, action, rule and event source, their
 * events joined: one line of an edge's label. */
struct item {
  unsigned s, n;
  bool call, light, done;
  char *label, *tip; /* plain text */
  bool *from;        /* light items: the sources with the same label and target */
};

static void item_tip(FILE *t, const ncfsm__machine *m, const ncfsm__mrow *r, bool first) {
  const ncfsm__mevent *ev = &m->events[r->e];
  fprintf(t, "%s%s (%s): %s", first ? "" : "; ", ev->name, ev->source == NCFSM__M_CALL ? "CALL" : "LOOP", ev->desc);
}

static bool same_item(const ncfsm__machine *m, const ncfsm__mrow *a, const ncfsm__mrow *b) {
  return a->s == b->s && a->next == b->next && a->guard == b->guard && a->action == b->action &&
         !strcmp(a->rule, b->rule) && m->events[a->e].source == m->events[b->e].source &&
         fsm2dot_bundled(m, a->e) == fsm2dot_bundled(m, b->e);
}

static unsigned make_items(const ncfsm__machine *m, struct item *it) {
  bool *taken = calloc(m->nrows + 1, 1);
  if (!taken) fsm2dot_oom();
  unsigned n = 0;
  for (unsigned i = 0; i < m->nrows; i++) {
    if (taken[i]) continue;
    const ncfsm__mrow *r = &m->rows[i];
    struct item *x = &it[n++];
    struct mstr ev, tip;
    FILE *e = mstr_open(&ev), *t = mstr_open(&tip);
    bool first = true;
    for (unsigned j = i; j < m->nrows; j++) {
      if (taken[j] || !same_item(m, r, &m->rows[j])) continue;
      taken[j] = true;
      fprintf(e, "%s%s", first ? "" : " | ", m->events[m->rows[j].e].name);
      item_tip(t, m, &m->rows[j], first);
      first = false;
    }
    if (r->guard) fprintf(t, "; guard %s: %s", m->guards[r->guard].name, m->guards[r->guard].cond);
    fprintf(t, "; action %s: %s", m->actions[r->action].name, m->actions[r->action].desc);
    mstr_close(&ev);
    struct mstr lab;
    put_row_label(mstr_open(&lab), m, ev.p, r);
    free(ev.p);
    *x = (struct item){.s = r->s, .n = r->next, .call = m->events[r->e].source == NCFSM__M_CALL,
                       .light = fsm2dot_bundled(m, r->e), .label = mstr_close(&lab), .tip = mstr_close(&tip)};
  }
  free(taken);
  return n;
}

/* The label of an edge: one line per item of in[] (HTML-like: CALL lines
 * bold, dark lines coloured by their source unless light). */
static void put_lines(FILE *f, const struct item *it, unsigned n, const bool *in, bool light) {
  bool first = true;
  for (unsigned j = 0; j < n; j++) {
    if (!in[j]) continue;
    if (!first) fputs("<BR/>", f);
    if (!light) fprintf(f, "<FONT COLOR=\"%s\">", it[j].call ? COL_CALL : COL_LOOP);
    if (it[j].call) fputs("<B>", f);
    put_html(f, it[j].label);
    if (it[j].call) fputs("</B>", f);
    if (!light) fputs("</FONT>", f);
    first = false;
  }
}

/* Tooltip text of the items of in[] from state s (any source: s < 0). */
static void put_tips(FILE *f, const struct item *it, unsigned n, const bool *in, int s) {
  bool first = true;
  for (unsigned j = 0; j < n; j++) {
    if (!in[j] || (s >= 0 && it[j].s != (unsigned)s)) continue;
    if (!first) fputs(" || ", f);
    put_dot(f, it[j].tip);
    first = false;
  }
}

/* The labels of the items of in[], joined (a DOT string's body). */
static void put_labels(FILE *f, const struct item *it, unsigned n, const bool *in) {
  bool first = true;
  for (unsigned j = 0; j < n; j++) {
    if (!in[j]) continue;
    if (!first) fputs("; ", f);
    put_dot(f, it[j].label);
    first = false;
  }
}

static void edge_style(FILE *f, bool light, bool call, bool mixed) {
  if (light)
    fprintf(f, "style=dashed, color=\"" COL_LIGHT "\", fontcolor=\"" COL_LIGHT_TXT "\", fontsize=8, penwidth=%s",
            call ? "1.4" : "0.9");
  else if (call && !mixed)
    fputs("color=\"" COL_CALL "\", penwidth=2.2", f);
  else
    fputs("color=\"" COL_LOOP "\", penwidth=1.0", f);
}

/* One edge from -> to (or to a junction: to_name) with the items of in[]. */
static void put_edge(FILE *f, const ncfsm__machine *m, const struct item *it, unsigned n, const bool *in, unsigned from,
                     unsigned to, const char *extra, bool with_label) {
  bool call = false, loop = false, light = false;
  for (unsigned j = 0; j < n; j++)
    if (in[j]) {
      call |= it[j].call;
      loop |= !it[j].call;
      light |= it[j].light;
    }
  fprintf(f, "  %s -> %s [", m->states[from].name, m->states[to].name);
  edge_style(f, light, call, call && loop);
  if (extra) fprintf(f, ", %s", extra);
  if (with_label) {
    fputs(", label=<", f);
    put_lines(f, it, n, in, light);
    fputc('>', f);
  }
  fprintf(f, ", tooltip=\"%s -> %s: ", m->states[from].name, m->states[to].name);
  put_tips(f, it, n, in, (int)from);
  fputs("\"];\n", f);
}

static void dot_lifecycle(FILE *f, const ncfsm__machine *m, struct item *it, unsigned n, bool *in) {
  fputs("\n  // lifecycle (bold: CALL events; thin: LOOP events)\n", f);
  for (unsigned i = 0; i < n; i++) {
    if (it[i].light || it[i].done) continue;
    memset(in, 0, n);
    for (unsigned j = i; j < n; j++)
      if (!it[j].light && !it[j].done && it[j].s == it[i].s && it[j].n == it[i].n) in[j] = it[j].done = true;
    put_edge(f, m, it, n, in, it[i].s, it[i].n, NULL, true);
  }
}

/* Light items: those with the same target and the same set of sources (for
 * each of them, the states from which the same label leads there) meet in
 * a point; an item from one source only is an edge of its own. */
static void dot_bundles(FILE *f, const ncfsm__machine *m, struct item *it, unsigned n, bool *in) {
  for (unsigned i = 0; i < n; i++) {
    if (!it[i].light) continue;
    it[i].from = calloc(m->nstates, 1);
    if (!it[i].from) fsm2dot_oom();
    for (unsigned j = 0; j < n; j++)
      if (it[j].light && it[j].n == it[i].n && it[j].s != it[j].n && !strcmp(it[j].label, it[i].label))
        it[i].from[it[j].s] = true;
  }
  fputs("\n  // events of most states (light; bundled per target and sources)\n", f);
  unsigned junctions = 0;
  for (unsigned i = 0; i < n; i++) {
    if (!it[i].light || it[i].done) continue;
    memset(in, 0, n);
    unsigned sources = 0;
    for (unsigned s = 0; s < m->nstates; s++) sources += it[i].from[s];
    if (it[i].s == it[i].n || sources < 2) {
      for (unsigned j = i; j < n; j++)
        if (it[j].light && !it[j].done && it[j].s == it[i].s && it[j].n == it[i].n &&
            (it[i].s == it[i].n || !memcmp(it[j].from, it[i].from, m->nstates)))
          in[j] = it[j].done = true;
      put_edge(f, m, it, n, in, it[i].s, it[i].n, it[i].s == it[i].n ? NULL : "constraint=false", true);
      continue;
    }
    for (unsigned j = i; j < n; j++)
      if (it[j].light && !it[j].done && it[j].n == it[i].n && it[j].s != it[j].n &&
          !memcmp(it[j].from, it[i].from, m->nstates))
        in[j] = it[j].done = true;
    /* one line per distinct label */
    bool *uniq = calloc(n, 1);
    if (!uniq) fsm2dot_oom();
    for (unsigned j = 0; j < n; j++) {
      uniq[j] = in[j];
      for (unsigned x = 0; x < j && uniq[j]; x++)
        if (uniq[x] && !strcmp(it[x].label, it[j].label)) uniq[j] = false;
    }
    unsigned k = junctions++;
    fprintf(f, "  __j%u [shape=point, width=0.07, color=\"" COL_LIGHT "\", label=\"\", tooltip=\"", k);
    put_labels(f, it, n, uniq);
    fputs("\"];\n", f);
    for (unsigned s = 0; s < m->nstates; s++) {
      if (!it[i].from[s]) continue;
      fprintf(f, "  %s -> __j%u [", m->states[s].name, k);
      edge_style(f, true, false, false);
      fprintf(f, ", arrowhead=none, constraint=false, tooltip=\"%s -> %s: ", m->states[s].name, m->states[it[i].n].name);
      put_tips(f, it, n, in, (int)s);
      fputs("\"];\n", f);
    }
    fprintf(f, "  __j%u -> %s [", k, m->states[it[i].n].name);
    edge_style(f, true, false, false);
    fputs(", label=<", f);
    put_lines(f, it, n, uniq, true);
    fputs(">, tooltip=\"", f);
    put_labels(f, it, n, uniq);
    fputs("\"];\n", f);
    free(uniq);
  }
}

/* The legend's text: what the edges mean, and which events are bundled. */
static char *legend(const ncfsm__machine *m) {
  struct mstr s;
  FILE *f = mstr_open(&s);
  fputs("edge label: EVENT [GUARD] / action (rule); EVENT | EVENT: rows with the same guard, action and rule\n"
        "bold dark edges: a user's call (CALL events); thin teal edges: the loop (LOOP events)",
        f);
  bool terminal = false;
  for (unsigned st = 0; st < m->nstates; st++) terminal |= fsm2dot_terminal(m, st);
  if (terminal) fputs("; double border: no row leaves the state", f);
  bool first = true;
  for (unsigned e = 0; e < m->nevents; e++) {
    if (!fsm2dot_bundled(m, e)) continue;
    fprintf(f, "%s%s", first ? "\nlight dashed edges, bundled through a point per target: " : ", ", m->events[e].name);
    first = false;
  }
  if (!first) fputs(" (rows in at least half of the states)", f);
  return mstr_close(&s);
}

void fsm2dot_dot(FILE *f, const ncfsm__machine *m) {
  struct mstr t;
  fprintf(mstr_open(&t), "machine %s (fsm/%s.def): %s", m->name, m->name, m->desc);
  mstr_close(&t);
  char *leg = legend(m), graph[64];
  snprintf(graph, sizeof graph, "ncfsm_%s", m->name);
  dot_open(f, graph, m, t.p, leg);
  free(t.p);
  free(leg);

  fputs("  // states (second line: flags; tooltip: description)\n", f);
  for (unsigned s = 0; s < m->nstates; s++) dot_state(f, m, s);
  dot_start(f, m);
  bool sink = false;
  for (unsigned s = 0; s < m->nstates; s++)
    if (fsm2dot_terminal(m, s)) {
      fprintf(f, "%s %s;", sink ? "" : "  { rank=sink;", m->states[s].name);
      sink = true;
    }
  if (sink) fputs(" }\n", f);

  struct item *it = calloc(m->nrows + 1, sizeof *it);
  bool *in = calloc(m->nrows + 1, 1);
  if (!it || !in) fsm2dot_oom();
  unsigned n = make_items(m, it);
  dot_lifecycle(f, m, it, n, in);
  bool any_light = false;
  for (unsigned i = 0; i < n; i++) any_light |= it[i].light;
  if (any_light) dot_bundles(f, m, it, n, in);
  fputs("}\n", f);
  for (unsigned i = 0; i < n; i++) {
    free(it[i].label);
    free(it[i].tip);
    free(it[i].from);
  }
  free(it);
  free(in);
}
