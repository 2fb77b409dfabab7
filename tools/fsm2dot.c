/*
 * tools/fsm2dot: render fsm/comm.def to docs/fsm.dot and docs/fsm-tables.md.
 *
 *   fsm2dot OUTDIR           write OUTDIR/fsm.dot and OUTDIR/fsm-tables.md
 *   fsm2dot --check OUTDIR   generate into a temporary directory and compare
 *                            byte for byte with OUTDIR; exit 1 on drift
 *
 * The tool #includes fsm/comm.def directly (build with -I<source root>) and
 * does not link libncfsm. Output is deterministic: it follows the order of
 * comm.def and contains no timestamp, path or version. docs/fsm.svg is made
 * from fsm.dot by graphviz (target fsm-docs) and is not checked, since its
 * bytes depend on the graphviz version.
 *
 * Before writing anything it checks that comm.def is consistent (see
 * check_table below); tests/golden/consistency_selftest.cmake compiles this
 * file against small defective tables (tests/golden/bad/fsm/comm.def, found
 * first on the include path) to prove that each check fires.
 *
 * Exit status: 0 ok / up to date, 1 drift (--check), 2 usage, I/O or an
 * inconsistent comm.def.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- comm.def, expanded ------------------------------------------------- */
enum st {
#define NCFSM_STATE(name, flags, desc) ST_##name,
#include "fsm/comm.def"
  ST_COUNT
};

enum ev {
#define NCFSM_EVENT(name, source, desc) EV_##name,
#include "fsm/comm.def"
  EV_COUNT
};

enum call {
#define NCFSM_CALL(name, fn) CALL_##name,
#include "fsm/comm.def"
  CALL_COUNT
};

enum gd {
#define NCFSM_GUARD(name, result, cond, hint) GD_##name,
#include "fsm/comm.def"
  GD_COUNT
};

enum act {
#define NCFSM_ACTION(name, desc) ACT_##name,
#include "fsm/comm.def"
  ACT_COUNT
};

/* Same order and values as ncfsm_decision_t (REJECT = 0). */
enum dec { D_REJECT = 0, D_ALLOW, D_DEFER };

/* An event's source: a user's call or the loop. */
enum src { SRC_LOOP = 0, SRC_CALL };

_Static_assert(ST_COUNT <= 64, "state sets are 64-bit masks");

struct named {
  const char *name, *text;
};

static const struct state {
  const char *name;
  unsigned flags;
  const char *text;
} states[] = {
#define NCFSM_STATE(name, flags, desc) {#name, (flags), desc},
#include "fsm/comm.def"
};

static const struct event {
  const char *name;
  enum src src;
  const char *text;
} events[] = {
#define NCFSM_EVENT(name, source, desc) {#name, SRC_##source, desc},
#include "fsm/comm.def"
};

static const struct named calls[] = {
#define NCFSM_CALL(name, fn) {#name, fn},
#include "fsm/comm.def"
};

static const struct named work_states[] = {
#define NCFSM_WORK_STATE(name, desc) {#name, desc},
#include "fsm/comm.def"
};
#define N_WORK_STATES (sizeof work_states / sizeof work_states[0])

static const struct guard {
  const char *name, *result, *cond, *hint;
} guards[] = {
#define NCFSM_GUARD(name, result, cond, hint) {#name, "NCFSM_" #result, cond, hint},
#include "fsm/comm.def"
};

static const struct named actions[] = {
#define NCFSM_ACTION(name, desc) {#name, desc},
#include "fsm/comm.def"
};

struct trans {
  enum st s;
  enum ev e;
  enum gd g;
  enum st n;
  enum act a;
  const char *rule;
};

static const struct trans transitions[] = {
#define NCFSM_TRANS(s, e, g, n, a, r) {ST_##s, EV_##e, GD_##g, ST_##n, ACT_##a, r},
#include "fsm/comm.def"
};
#define N_TRANS (sizeof transitions / sizeof transitions[0])

struct rule {
  enum st s;
  enum call c;
  enum dec d;
  enum gd g;
  const char *rule, *hint;
};

static const struct rule rules[] = {
#define NCFSM_RULE(s, c, d, g, r, h) {ST_##s, CALL_##c, D_##d, GD_##g, r, h},
#include "fsm/comm.def"
};
#define N_RULES (sizeof rules / sizeof rules[0])

static const struct {
  const char *rule, *hint;
} state_hints[ST_COUNT] = {
#define NCFSM_STATE_HINT(s, r, h) [ST_##s] = {r, h},
#include "fsm/comm.def"
};

/* The state flags (NCFSM_SF_*, bit order), as written in the outputs. */
static const struct {
  unsigned bit;
  const char *word, *macro;
} flag_names[] = {
    {NCFSM_SF_POLL, "poll", "NCFSM_SF_POLL"},
    {NCFSM_SF_DEADLINE, "deadline", "NCFSM_SF_DEADLINE"},
    {NCFSM_SF_WORKS, "works", "NCFSM_SF_WORKS"},
    {NCFSM_SF_LAUNCH, "launch", "NCFSM_SF_LAUNCH"},
};
#define N_FLAGS (sizeof flag_names / sizeof flag_names[0])

/* The dense view of the legality table, filled by check_table(). */
static const struct rule *rule_at[ST_COUNT][CALL_COUNT];

/* The decision of a cell, as ncfsm_legality() returns it. */
static enum dec cell_decision(int s, int c) {
  return rule_at[s][c] ? rule_at[s][c]->d : D_REJECT;
}

/* ---- consistency checks --------------------------------------------------- */
__attribute__((format(printf, 1, 2))) static void defect(const char *fmt, ...) {
  va_list ap;
  fputs("fsm2dot: fsm/comm.def: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static int has_row(int s, int e) {
  for (size_t i = 0; i < N_TRANS; i++)
    if ((int)transitions[i].s == s && (int)transitions[i].e == e) return 1;
  return 0;
}

/* The flags of a state as "works, deadline" (static buffer). */
static const char *flag_list(unsigned f, const char *sep) {
  static char out[128];
  out[0] = '\0';
  for (size_t i = 0; i < N_FLAGS; i++)
    if (f & flag_names[i].bit) {
      if (out[0]) strcat(out, sep);
      strcat(out, flag_names[i].word);
    }
  return out;
}

/* The states reachable from `from` (forward) or that reach `from` (backward)
 * over the transition rows, guards ignored. */
static uint64_t closure(int from, int backward) {
  uint64_t set = UINT64_C(1) << from, prev = 0;
  while (set != prev) {
    prev = set;
    for (size_t i = 0; i < N_TRANS; i++) {
      int a = backward ? (int)transitions[i].n : (int)transitions[i].s;
      int b = backward ? (int)transitions[i].s : (int)transitions[i].n;
      if (set & (UINT64_C(1) << a)) set |= UINT64_C(1) << b;
    }
  }
  return set;
}

/* Every defect is reported (not only the first); -1 when there is one. */
static int check_table(void) {
  int bad = 0;
  unsigned char gd_used[GD_COUNT] = {0}, act_used[ACT_COUNT] = {0};

  /* Transition rows: one (state, event) is a run of adjacent rows, tried in
   * order; a row whose (state, event, guard) repeats, or a guarded row after
   * the ANY row, can never fire. */
  for (size_t i = 0; i < N_TRANS; i++) {
    const struct trans *t = &transitions[i];
    const char *sn = states[t->s].name, *en = events[t->e].name, *gn = guards[t->g].name;
    gd_used[t->g] = 1;
    act_used[t->a] = 1;
    int prev = -1, any_before = 0;
    for (size_t j = 0; j < i; j++) {
      const struct trans *u = &transitions[j];
      if (u->s != t->s || u->e != t->e) continue;
      prev = (int)j;
      if (u->g == GD_ANY) any_before = 1;
    }
    for (size_t j = 0; j < i; j++) {
      const struct trans *u = &transitions[j];
      if (u->s == t->s && u->e == t->e && u->g == t->g) {
        defect("duplicate NCFSM_TRANS(%s, %s, %s, ...) (rows %zu and %zu of the table)", sn, en,
               gn, j + 1, i + 1);
        bad = 1;
        break;
      }
    }
    if (prev >= 0 && (size_t)prev != i - 1) {
      defect("the rows of NCFSM_TRANS(%s, %s, ...) are not adjacent (rows %d and %zu of the table);"
             " rows of one (state, event) are tried in order and must be written together",
             sn, en, prev + 1, i + 1);
      bad = 1;
    }
    if (any_before && t->g != GD_ANY) {
      defect("NCFSM_TRANS(%s, %s, %s, ...) follows NCFSM_TRANS(%s, %s, ANY, ...) and can never"
             " fire; write guarded rows before the ANY row",
             sn, en, gn, sn, en);
      bad = 1;
    }
  }

  /* Legality cells. */
  for (size_t i = 0; i < N_RULES; i++) {
    const struct rule *r = &rules[i];
    const char *sn = states[r->s].name, *cn = calls[r->c].name, *gn = guards[r->g].name;
    gd_used[r->g] = 1;
    if (rule_at[r->s][r->c]) {
      defect("duplicate NCFSM_RULE(%s, %s, ...)", sn, cn);
      bad = 1;
    }
    rule_at[r->s][r->c] = r;
    if (r->d == D_REJECT && r->g != GD_ANY) {
      defect("NCFSM_RULE(%s, %s, REJECT, %s, ...): a REJECT cell has no guard (write ANY)", sn,
             cn, gn);
      bad = 1;
    }
    if (r->d == D_REJECT && !r->hint[0]) {
      defect("NCFSM_RULE(%s, %s, REJECT, ...) has an empty hint", sn, cn);
      bad = 1;
    }
    if (r->d != D_REJECT && r->g != GD_ANY &&
        (!strcmp(guards[r->g].result, "NCFSM_OK") || !guards[r->g].hint[0])) {
      defect("guard %s decides NCFSM_RULE(%s, %s, ...) but has result %s and hint \"%s\": a call"
             " it rejects needs an error result and a hint",
             gn, sn, cn, guards[r->g].result, guards[r->g].hint);
      bad = 1;
    }
  }

  /* States: a hint; flags the tool knows; a state that has works in flight
   * or a phase deadline can time out and fail, a polled one can fail. */
  unsigned known = 0;
  for (size_t i = 0; i < N_FLAGS; i++) known |= flag_names[i].bit;
  for (int s = 0; s < ST_COUNT; s++) {
    const char *sn = states[s].name;
    unsigned f = states[s].flags;
    if (!state_hints[s].hint || !state_hints[s].hint[0]) {
      defect("no NCFSM_STATE_HINT for state %s", sn);
      bad = 1;
    }
    if (f & ~known) {
      defect("state %s has unknown flag bits 0x%x", sn, f & ~known);
      bad = 1;
    }
    if ((f & (NCFSM_SF_WORKS | NCFSM_SF_DEADLINE)) && !has_row(s, EV_TIMEOUT)) {
      defect("state %s (%s) has no NCFSM_TRANS(%s, TIMEOUT, ...) row: a state with works in"
             " flight or a phase deadline must be able to time out",
             sn, flag_list(f, ", "), sn);
      bad = 1;
    }
    if ((f & (NCFSM_SF_WORKS | NCFSM_SF_DEADLINE | NCFSM_SF_POLL)) &&
        !has_row(s, EV_ASYNC_ERROR)) {
      defect("state %s (%s) has no NCFSM_TRANS(%s, ASYNC_ERROR, ...) row: a state with works in"
             " flight, a phase deadline or a polled call must be able to fail",
             sn, flag_list(f, ", "), sn);
      bad = 1;
    }
  }

  for (int g = 0; g < GD_COUNT; g++)
    if (!gd_used[g] && g != GD_ANY) {
      defect("guard %s is declared but no NCFSM_TRANS or NCFSM_RULE uses it", guards[g].name);
      bad = 1;
    }
  for (int a = 0; a < ACT_COUNT; a++)
    if (!act_used[a]) {
      defect("action %s is declared but no NCFSM_TRANS uses it", actions[a].name);
      bad = 1;
    }

  /* Reachability: every state from NEW, and CLOSED from every state. */
  uint64_t from_new = closure(ST_NEW, 0), to_closed = closure(ST_CLOSED, 1);
  for (int s = 0; s < ST_COUNT; s++) {
    if (!(from_new & (UINT64_C(1) << s))) {
      defect("state %s is not reachable from %s", states[s].name, states[ST_NEW].name);
      bad = 1;
    }
    if (!(to_closed & (UINT64_C(1) << s))) {
      defect("state %s has no way to %s (no chain of transitions reaches it)", states[s].name,
             states[ST_CLOSED].name);
      bad = 1;
    }
  }
  return bad ? -1 : 0;
}

/* ---- a growable output buffer ------------------------------------------- */
struct buf {
  char *p;
  size_t len, cap;
};

static void buf_add(struct buf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      fprintf(stderr, "fsm2dot: out of memory\n");
      exit(2);
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void buf_puts(struct buf *b, const char *s) { buf_add(b, s, strlen(s)); }

__attribute__((format(printf, 2, 3))) static void buf_printf(struct buf *b, const char *fmt,
                                                             ...) {
  char tmp[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof tmp) {
    buf_add(b, tmp, (size_t)n);
    return;
  }
  char *big = malloc((size_t)n + 1);
  if (!big) {
    fprintf(stderr, "fsm2dot: out of memory\n");
    exit(2);
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  buf_add(b, big, (size_t)n);
  free(big);
}

/* A DOT double-quoted string body. */
static void buf_dot_str(struct buf *b, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') buf_add(b, "\\", 1);
    buf_add(b, s, 1);
  }
}

/* A Markdown table cell: '|' would end the cell. */
static void buf_md_cell(struct buf *b, const char *s) {
  for (; *s; s++) {
    if (*s == '|') buf_add(b, "\\", 1);
    buf_add(b, s, 1);
  }
}


/* A state by name, -1 when comm.def has none (layout hints and colours name
 * states that a small test table may lack). */
static int st_lookup(const char *name) {
  for (int s = 0; s < ST_COUNT; s++)
    if (!strcmp(states[s].name, name)) return s;
  return -1;
}

static int popcount64(uint64_t v) {
  int n = 0;
  for (; v; v &= v - 1) n++;
  return n;
}

/* ---- fsm.dot ------------------------------------------------------------ */
#define COL_CALL "#1f3a68"
#define COL_LOOP "#2f6f7f"
#define COL_FAIL "#b4b4b4"
#define COL_FAIL_TXT "#8a8a8a"
#define MIDDOT "\xc2\xb7"
#define FAIL_STYLE "style=dashed, color=\"" COL_FAIL "\", fontcolor=\"" COL_FAIL_TXT "\", fontsize=8"

/* Error, invalid-event and abort edges are drawn light so the lifecycle
 * stands out: an edge into ERROR (ASYNC_ERROR, TIMEOUT, INVALID) or an
 * ABORT call. */
static int is_fail_edge(const struct trans *t) { return t->n == ST_ERROR || t->e == EV_ABORT; }

static const char *edge_style(int src, int fail) {
  if (fail) return src == SRC_CALL ? FAIL_STYLE ", penwidth=1.6" : FAIL_STYLE ", penwidth=0.9";
  return src == SRC_CALL ? "color=\"" COL_CALL "\", fontcolor=\"" COL_CALL "\", penwidth=2.2,"
                           " fontname=\"Helvetica-Bold\""
                         : "color=\"" COL_LOOP "\", fontcolor=\"" COL_LOOP "\", penwidth=1.0";
}

static const char *state_fill(int s) {
  if (s == ST_ERROR) return "#fde2de";
  if (s == ST_CLOSED) return "#e4e4e4";
  if (s == st_lookup("READY")) return "#ddf2da";
  if (s == st_lookup("ABORT_QUEUED") || s == st_lookup("CLOSING")) return "#f3ebe9";
  if (states[s].flags & NCFSM_SF_POLL) return "#fdf3d3";
  return "#e9f0fa";
}

/* One label of the diagram: the rows of comm.def with the same source,
 * target, guard, action, rule and event source, their events joined
 * ("ASYNC_ERROR | TIMEOUT [GUARD] / action (rule)"). */
struct item {
  int s, n, src, fail, done;
  uint64_t set; /* fail items: the sources of the same label and target */
  struct buf label, tip; /* label: plain text; tip: DOT-escaped */
};

/* Text for an HTML-like label of graphviz. */
static void buf_html_str(struct buf *b, const char *s) {
  for (; *s; s++) switch (*s) {
      case '&': buf_puts(b, "&amp;"); break;
      case '<': buf_puts(b, "&lt;"); break;
      case '>': buf_puts(b, "&gt;"); break;
      case '"': buf_puts(b, "&quot;"); break;
      default: buf_add(b, s, 1);
    }
}

/* The labels of the items of a group (unique, in order), one line each: as
 * the body of a DOT string ("A\nB"), or (html) as an HTML-like label whose
 * CALL lines are bold and dark, LOOP lines teal. */
static void group_labels(struct buf *out, struct item *it, size_t n, const unsigned char *in,
                         int html) {
  int first = 1;
  for (size_t j = 0; j < n; j++) {
    if (!in[j]) continue;
    int seen = 0;
    for (size_t k = 0; k < j && !seen; k++) seen = in[k] && !strcmp(it[k].label.p, it[j].label.p);
    if (seen) continue;
    if (!first) buf_puts(out, html ? "<BR/>" : "\\n");
    if (html) {
      buf_puts(out, it[j].src == SRC_CALL ? "<FONT COLOR=\"" COL_CALL "\"><B>"
                                          : "<FONT COLOR=\"" COL_LOOP "\">");
      buf_html_str(out, it[j].label.p);
      buf_puts(out, it[j].src == SRC_CALL ? "</B></FONT>" : "</FONT>");
    } else {
      buf_dot_str(out, it[j].label.p);
    }
    first = 0;
  }
}

static void gen_dot(struct buf *b) {
  buf_puts(b,
           "// Generated from fsm/comm.def by tools/fsm2dot; do not edit by hand.\n"
           "// Regenerate: cmake --build <builddir> --target fsm-docs\n"
           "digraph ncfsm_comm {\n"
           "  graph [rankdir=TB, fontname=\"Helvetica\", fontsize=13, nodesep=0.5,"
           " ranksep=0.6, newrank=true, labelloc=t,\n"
           "         label=\"ncfsm communicator state machine (fsm/comm.def)\\n"
           "edge label: EVENT [GUARD] / action (rule); a state's second line: its flags"
           " (poll " MIDDOT " deadline " MIDDOT " works " MIDDOT " launch)\\n"
           "bold dark edges: caused by a user's call (CALL events); thin teal edges: caused by"
           " the loop (LOOP events); a self-loop with both: thin, its CALL lines bold\\n"
           "light dashed edges: errors, timeouts, invalid events and aborts, bundled through a"
           " dot; yellow states: an NCCL call is in progress (poll)\"];\n"
           "  node [shape=box, style=\"rounded,filled\", color=\"" COL_CALL "\","
           " fontname=\"Helvetica\", fontsize=11, margin=\"0.15,0.05\"];\n"
           "  edge [fontname=\"Helvetica\", fontsize=9, arrowsize=0.7];\n\n");

  buf_puts(b, "  // states (second line: flags; tooltip: description)\n");
  buf_puts(b, "  __start [shape=point, width=0.14, style=filled, color=black, label=\"\","
              " tooltip=\"initial state\"];\n");
  for (int s = 0; s < ST_COUNT; s++) {
    buf_printf(b, "  %s [", states[s].name);
    if (s == ST_CLOSED) buf_puts(b, "shape=doublecircle, style=filled, margin=\"0.02\", ");
    if (states[s].flags)
      buf_printf(b, "label=<%s<BR/><FONT POINT-SIZE=\"8\" COLOR=\"#555555\">%s</FONT>>, ",
                 states[s].name, flag_list(states[s].flags, " " MIDDOT " "));
    buf_printf(b, "fillcolor=\"%s\", tooltip=\"%s: ", state_fill(s), states[s].name);
    buf_dot_str(b, states[s].text);
    buf_puts(b, "\"];\n");
  }
  buf_printf(b, "  __start -> %s [tooltip=\"initial state\"];\n", states[ST_NEW].name);

  /* Layout hints, by name (a state comm.def lacks is left out): CLOSED at
   * the bottom; below READY three rows: the states READY's calls and
   * launches lead to, the phases in progress after them, and the three
   * states that lead to CLOSING. */
  static const char *const same_rank[][4] = {
      {"DRAINING", "LAUNCH_IN_PROGRESS", "ERROR"},
      {"DRAIN_LAUNCH_IN_PROGRESS", "FINALIZING", "REVOKING"},
      {"FINALIZED", "REVOKED", "ABORT_QUEUED"},
  };
  buf_printf(b, "  { rank=sink; %s; }\n", states[ST_CLOSED].name);
  for (size_t i = 0; i < sizeof same_rank / sizeof same_rank[0]; i++) {
    int n = 0;
    for (int k = 0; k < 4 && same_rank[i][k]; k++) n += st_lookup(same_rank[i][k]) >= 0;
    if (n < 2) continue;
    buf_puts(b, "  { rank=same;");
    for (int k = 0; k < 4 && same_rank[i][k]; k++)
      if (st_lookup(same_rank[i][k]) >= 0) buf_printf(b, " %s;", same_rank[i][k]);
    buf_puts(b, " }\n");
  }

  struct item *it = calloc(N_TRANS ? N_TRANS : 1, sizeof *it);
  unsigned char *taken = calloc(N_TRANS ? N_TRANS : 1, 1), *in = calloc(N_TRANS ? N_TRANS : 1, 1);
  if (!it || !taken || !in) {
    fprintf(stderr, "fsm2dot: out of memory\n");
    exit(2);
  }
  size_t n_it = 0;
  for (size_t i = 0; i < N_TRANS; i++) {
    const struct trans *t = &transitions[i];
    if (taken[i]) continue;
    struct item *x = &it[n_it++];
    x->s = (int)t->s, x->n = (int)t->n, x->src = (int)events[t->e].src, x->fail = is_fail_edge(t);
    for (size_t j = i; j < N_TRANS; j++) {
      const struct trans *u = &transitions[j];
      if (taken[j] || u->s != t->s || u->n != t->n || u->g != t->g || u->a != t->a ||
          strcmp(u->rule, t->rule) || (int)events[u->e].src != x->src || is_fail_edge(u) != x->fail)
        continue;
      taken[j] = 1;
      if (x->label.len) {
        buf_puts(&x->label, " | ");
        buf_puts(&x->tip, "; ");
      }
      buf_puts(&x->label, events[u->e].name);
      buf_printf(&x->tip, "%s (%s): ", events[u->e].name,
                 events[u->e].src == SRC_CALL ? "CALL" : "LOOP");
      buf_dot_str(&x->tip, events[u->e].text);
    }
    if (t->g != GD_ANY) {
      buf_printf(&x->label, " [%s]", guards[t->g].name);
      buf_printf(&x->tip, "; guard %s: ", guards[t->g].name);
      buf_dot_str(&x->tip, guards[t->g].cond);
    }
    buf_printf(&x->label, " / %s (", actions[t->a].name);
    buf_puts(&x->label, t->rule);
    buf_puts(&x->label, ")");
    buf_printf(&x->tip, "; action %s: ", actions[t->a].name);
    buf_dot_str(&x->tip, actions[t->a].text);
  }

  /* Lifecycle: the labels of one source, target and event source share an
   * edge, one line each; a state's self-loops are one edge whatever their
   * sources, drawn thin when they mix CALL and LOOP events, with the CALL
   * lines of the label in bold. */
  buf_puts(b, "\n  // lifecycle (bold: CALL events; thin: LOOP events)\n");
  for (size_t i = 0; i < n_it; i++) {
    if (it[i].fail || it[i].done) continue;
    struct buf lab = {0}, tip = {0};
    memset(in, 0, n_it);
    for (size_t j = i; j < n_it; j++) {
      if (it[j].fail || it[j].done || it[j].s != it[i].s || it[j].n != it[i].n ||
          (it[j].src != it[i].src && it[i].s != it[i].n))
        continue;
      in[j] = 1;
      it[j].done = 1;
      if (tip.len) buf_puts(&tip, " || ");
      buf_puts(&tip, it[j].tip.p);
    }
    int mixed = 0;
    for (size_t j = i; j < n_it; j++) mixed |= in[j] && it[j].src != it[i].src;
    group_labels(&lab, it, n_it, in, mixed);
    buf_printf(b, "  %s -> %s [%s, label=%s%s%s, tooltip=\"%s -> %s: %s\"];\n",
               states[it[i].s].name, states[it[i].n].name,
               edge_style(mixed ? SRC_LOOP : it[i].src, 0), mixed ? "<" : "\"", lab.p,
               mixed ? ">" : "\"", states[it[i].s].name, states[it[i].n].name, tip.p);
    free(lab.p);
    free(tip.p);
  }

  /* Error, invalid-event and abort paths: the labels that go from the same
   * set of sources to the same target share a junction point; each source
   * joins it, one edge with a line per label goes on to the target. */
  for (size_t i = 0; i < n_it; i++) {
    if (!it[i].fail) continue;
    for (size_t j = 0; j < n_it; j++)
      if (it[j].fail && it[j].n == it[i].n && it[j].src == it[i].src &&
          !strcmp(it[j].label.p, it[i].label.p))
        it[i].set |= UINT64_C(1) << it[j].s;
  }
  buf_puts(b, "\n  // errors, invalid events and aborts (light; bundled per sources and target)\n");
  int junctions = 0;
  for (size_t i = 0; i < n_it; i++) {
    if (!it[i].fail || it[i].done) continue;
    memset(in, 0, n_it);
    for (size_t j = i; j < n_it; j++)
      if (it[j].fail && !it[j].done && it[j].n == it[i].n && it[j].src == it[i].src &&
          it[j].set == it[i].set)
        in[j] = 1, it[j].done = 1;
    struct buf lab = {0};
    group_labels(&lab, it, n_it, in, 0);
    const char *style = edge_style(it[i].src, 1), *tn = states[it[i].n].name;
    if (popcount64(it[i].set) < 2) {
      struct buf tip = {0};
      for (size_t j = i; j < n_it; j++)
        if (in[j]) {
          if (tip.len) buf_puts(&tip, " || ");
          buf_puts(&tip, it[j].tip.p);
        }
      buf_printf(b, "  %s -> %s [%s, constraint=false, label=\"%s\", tooltip=\"%s -> %s: %s\"];\n",
                 states[it[i].s].name, tn, style, lab.p, states[it[i].s].name, tn, tip.p);
      free(tip.p);
    } else {
      int jn = junctions++;
      buf_printf(b, "  __j%d [shape=point, width=0.07, color=\"" COL_FAIL "\", tooltip=\"%s\"];\n",
                 jn, lab.p);
      for (int s = 0; s < ST_COUNT; s++) {
        if (!(it[i].set & (UINT64_C(1) << s))) continue;
        struct buf tip = {0};
        for (size_t j = i; j < n_it; j++)
          if (in[j] && it[j].s == s) {
            if (tip.len) buf_puts(&tip, " || ");
            buf_puts(&tip, it[j].tip.p);
          }
        buf_printf(b,
                   "  %s -> __j%d [%s, arrowhead=none, constraint=false,"
                   " tooltip=\"%s -> %s: %s\"];\n",
                   states[s].name, jn, style, states[s].name, tn, tip.p);
        free(tip.p);
      }
      buf_printf(b, "  __j%d -> %s [%s, label=\"%s\", tooltip=\"%s\"];\n", jn, tn, style, lab.p,
                 lab.p);
    }
    free(lab.p);
  }
  for (size_t i = 0; i < n_it; i++) {
    free(it[i].label.p);
    free(it[i].tip.p);
  }
  free(it);
  free(taken);
  free(in);
  buf_puts(b, "}\n");
}

/* ---- fsm-tables.md ------------------------------------------------------ */
#define EMDASH "\xe2\x80\x94"

static const char *dec_name(enum dec d) {
  switch (d) {
    case D_ALLOW: return "ALLOW";
    case D_DEFER: return "DEFER";
    case D_REJECT: break;
  }
  return "REJECT";
}

/* A matrix cell: ALLOW, DEFER [GUARD], REJECT (listed, own hint), or an em
 * dash (not listed: rejected with the state's hint). */
static void md_cell(struct buf *b, int s, int c) {
  const struct rule *r = rule_at[s][c];
  if (!r) {
    buf_puts(b, EMDASH);
    return;
  }
  buf_puts(b, dec_name(r->d));
  if (r->g != GD_ANY) buf_printf(b, " [%s]", guards[r->g].name);
}

static void md_named_table(struct buf *b, const char *h1, const char *h2,
                           const struct named *v, size_t n, int code_text) {
  buf_printf(b, "| %s | %s |\n|---|---|\n", h1, h2);
  for (size_t i = 0; i < n; i++) {
    buf_printf(b, "| `%s` | %s", v[i].name, code_text ? "`" : "");
    buf_md_cell(b, v[i].text);
    buf_printf(b, "%s |\n", code_text ? "`" : "");
  }
  buf_puts(b, "\n");
}

/* Cells of one state with the same decision, guard, rule and hint, joined:
 * "ALLREDUCE, BROADCAST". Marks them in done[]. */
static void md_same_cells(struct buf *b, int s, int c, unsigned char *done) {
  const struct rule *r = rule_at[s][c];
  int first = 1;
  for (int c2 = c; c2 < CALL_COUNT; c2++) {
    const struct rule *r2 = rule_at[s][c2];
    if (done[c2] || !r2 || r2->d != r->d || r2->g != r->g || strcmp(r2->rule, r->rule) ||
        strcmp(r2->hint, r->hint))
      continue;
    done[c2] = 1;
    buf_printf(b, "%s%s", first ? "" : ", ", calls[c2].name);
    first = 0;
  }
}

static void gen_md(struct buf *b) {
  buf_puts(b, "# ncfsm communicator state tables\n\n");
  buf_puts(b, "> Generated from `fsm/comm.def` by `tools/fsm2dot`; do not edit by hand.\n"
              "> Regenerate with `cmake --build <builddir> --target fsm-docs`; the golden\n"
              "> test (`tests/golden`) fails when this file drifts from `fsm/comm.def`.\n"
              "> Rule ids (R1, R2, ...) refer to `shared/design/NCCL-RULES.md`.\n"
              "> Diagram: [fsm.svg](fsm.svg) (source [fsm.dot](fsm.dot)).\n\n");

  int n_allow = 0, n_defer = 0, n_reject = 0, n_listed_reject = 0, n_guarded = 0;
  for (int s = 0; s < ST_COUNT; s++)
    for (int c = 0; c < CALL_COUNT; c++) {
      switch (cell_decision(s, c)) {
        case D_ALLOW: n_allow++; break;
        case D_DEFER: n_defer++; break;
        case D_REJECT: n_reject++; break;
      }
      if (rule_at[s][c] && rule_at[s][c]->d == D_REJECT) n_listed_reject++;
      if (rule_at[s][c] && rule_at[s][c]->g != GD_ANY) n_guarded++;
    }
  int n_call_ev = 0, n_pairs = 0, n_guarded_rows = 0;
  for (int e = 0; e < EV_COUNT; e++) n_call_ev += events[e].src == SRC_CALL;
  for (int s = 0; s < ST_COUNT; s++)
    for (int e = 0; e < EV_COUNT; e++) n_pairs += has_row(s, e);
  for (size_t i = 0; i < N_TRANS; i++) n_guarded_rows += transitions[i].g != GD_ANY;

  buf_printf(b,
             "%d states, %d events (%d CALL, %d LOOP), %d guards, %d actions, %zu transition"
             " rows (%d with a guard) over %d (state, event) pairs, %d API calls, %zu work"
             " states; legality table: %d cells (%d states x %d calls): %d ALLOW, %d DEFER,"
             " %d REJECT (%d listed with their own hint); %d accepted cells have a guard.\n\n",
             (int)ST_COUNT, (int)EV_COUNT, n_call_ev, (int)EV_COUNT - n_call_ev, (int)GD_COUNT,
             (int)ACT_COUNT, N_TRANS, n_guarded_rows, n_pairs, (int)CALL_COUNT, N_WORK_STATES,
             ST_COUNT * CALL_COUNT, (int)ST_COUNT, (int)CALL_COUNT, n_allow, n_defer, n_reject,
             n_listed_reject, n_guarded);

  /* ---- states */
  buf_puts(b, "## Communicator states\n\n");
  buf_printf(b,
             "`%s` is the initial state, `%s` the final one. A state's flags say what the loop"
             " does while a communicator is in it:\n\n",
             states[ST_NEW].name, states[ST_CLOSED].name);
  buf_puts(b, "| Flag | Macro | States |\n|---|---|---|\n");
  for (size_t i = 0; i < N_FLAGS; i++) {
    buf_printf(b, "| %s | `%s` | ", flag_names[i].word, flag_names[i].macro);
    int first = 1;
    for (int s = 0; s < ST_COUNT; s++)
      if (states[s].flags & flag_names[i].bit) {
        buf_printf(b, "%s`%s`", first ? "" : ", ", states[s].name);
        first = 0;
      }
    buf_puts(b, first ? EMDASH " |\n" : " |\n");
  }
  buf_puts(b, "\n(The meaning of each flag is written next to its `#define` in `fsm/comm.def`.)\n\n");
  buf_puts(b, "| State | Flags | Description |\n|---|---|---|\n");
  for (int s = 0; s < ST_COUNT; s++) {
    buf_printf(b, "| `%s` | %s | ", states[s].name,
               states[s].flags ? flag_list(states[s].flags, ", ") : EMDASH);
    buf_md_cell(b, states[s].text);
    buf_puts(b, " |\n");
  }
  buf_puts(b, "\n");

  /* ---- events */
  buf_puts(b, "## Events\n\n");
  buf_puts(b, "CALL: a user's call causes the event; LOOP: the loop causes it from what the"
              " backend reports.\n\n");
  buf_puts(b, "| Event | Source | Description |\n|---|---|---|\n");
  for (int e = 0; e < EV_COUNT; e++) {
    buf_printf(b, "| `%s` | %s | ", events[e].name, events[e].src == SRC_CALL ? "CALL" : "LOOP");
    buf_md_cell(b, events[e].text);
    buf_puts(b, " |\n");
  }
  buf_puts(b, "\n");

  /* ---- guards */
  buf_puts(b, "## Guards\n\n");
  buf_puts(b, "Predicates over a communicator (`fsm/guards.c`). A transition row fires only when"
              " its guard holds; an ALLOW or DEFER cell of the legality table with a guard rejects"
              " the call when the guard does not hold, with the guard's result and hint.\n\n");
  buf_puts(b, "| Guard | Holds when | Result when it does not hold | Hint | Used by |\n"
              "|---|---|---|---|---|\n");
  for (int g = 0; g < GD_COUNT; g++) {
    int rows = 0, cells = 0;
    for (size_t i = 0; i < N_TRANS; i++) rows += (int)transitions[i].g == g;
    for (size_t i = 0; i < N_RULES; i++) cells += (int)rules[i].g == g;
    buf_printf(b, "| `%s` | ", guards[g].name);
    buf_md_cell(b, guards[g].cond);
    if (cells && g != GD_ANY)
      buf_printf(b, " | `%s` | ", guards[g].result);
    else
      buf_puts(b, " | " EMDASH " | ");
    buf_md_cell(b, guards[g].hint[0] ? guards[g].hint : EMDASH);
    buf_printf(b, " | %d transition row%s, %d legality cell%s |\n", rows, rows == 1 ? "" : "s",
               cells, cells == 1 ? "" : "s");
  }
  buf_puts(b, "\n");

  /* ---- actions */
  buf_puts(b, "## Actions\n\n");
  buf_puts(b, "What the engine does on a transition (`fsm/actions.c`).\n\n");
  buf_puts(b, "| Action | What it does | Transitions (event from states) |\n|---|---|---|\n");
  for (int a = 0; a < ACT_COUNT; a++) {
    buf_printf(b, "| `%s` | ", actions[a].name);
    buf_md_cell(b, actions[a].text);
    buf_puts(b, " | ");
    int first_ev = 1;
    for (int e = 0; e < EV_COUNT; e++) {
      int first = 1;
      for (int s = 0; s < ST_COUNT; s++) {
        int uses = 0;
        for (size_t i = 0; i < N_TRANS && !uses; i++)
          uses = (int)transitions[i].a == a && (int)transitions[i].e == e &&
                 (int)transitions[i].s == s;
        if (!uses) continue;
        if (first) buf_printf(b, "%s`%s` from ", first_ev ? "" : "; ", events[e].name);
        buf_printf(b, "%s`%s`", first ? "" : ", ", states[s].name);
        first = first_ev = 0;
      }
    }
    buf_puts(b, " |\n");
  }
  buf_puts(b, "\n");

  /* ---- transitions */
  buf_puts(b, "## Transitions\n\n");
  buf_printf(b,
             "`(state, event) [guard] -> next`, with the action the engine runs. The rows of one"
             " (state, event) are tried in order; the first whose guard holds fires (" EMDASH
             ": no guard, `ANY`). The %d pairs listed are valid; an event of one of the other %d"
             " of the %d pairs, or of a listed pair when none of its guards holds, is an invalid"
             " event.\n\n",
             n_pairs, ST_COUNT * EV_COUNT - n_pairs, ST_COUNT * EV_COUNT);
  buf_puts(b, "| State | Event | Guard | Next | Action | Rule |\n|---|---|---|---|---|---|\n");
  for (int s = 0; s < ST_COUNT; s++)
    for (int e = 0; e < EV_COUNT; e++)
      for (size_t i = 0; i < N_TRANS; i++) {
        const struct trans *t = &transitions[i];
        if ((int)t->s != s || (int)t->e != e) continue;
        buf_printf(b, "| `%s` | `%s` | ", states[s].name, events[e].name);
        if (t->g == GD_ANY)
          buf_puts(b, EMDASH);
        else
          buf_printf(b, "`%s`", guards[t->g].name);
        buf_printf(b, " | `%s` | `%s` | ", states[t->n].name, actions[t->a].name);
        buf_md_cell(b, t->rule);
        buf_puts(b, " |\n");
      }
  buf_puts(b, "\n");

  /* ---- calls and legality */
  buf_puts(b, "## API calls\n\n");
  md_named_table(b, "Call", "Public function", calls, CALL_COUNT, 1);

  buf_puts(b, "## Legality\n\n");
  buf_printf(b,
             "What `ncfsm_legality(state, call)` decides: %d cells (%d states x %d calls)."
             " ALLOW: accepted, the backend is reached now or at the next launch; DEFER:"
             " accepted and queued until the comm can launch; `[GUARD]`: the guard must hold"
             " too, else the call is rejected with the guard's result and hint (below);"
             " REJECT: rejected with the cell's own hint (below); " EMDASH
             ": rejected with the state's hint (below).\n\n",
             ST_COUNT * CALL_COUNT, (int)ST_COUNT, (int)CALL_COUNT);
  buf_puts(b, "| State |");
  for (int c = 0; c < CALL_COUNT; c++) buf_printf(b, " %s |", calls[c].name);
  buf_puts(b, "\n|---|");
  for (int c = 0; c < CALL_COUNT; c++) buf_puts(b, ":---:|");
  buf_puts(b, "\n");
  for (int s = 0; s < ST_COUNT; s++) {
    buf_printf(b, "| `%s` |", states[s].name);
    for (int c = 0; c < CALL_COUNT; c++) {
      buf_puts(b, " ");
      md_cell(b, s, c);
      buf_puts(b, " |");
    }
    buf_puts(b, "\n");
  }
  buf_puts(b, "\n");

  buf_puts(b, "### Reject hint of each state\n\n");
  buf_puts(b, "What a call reports in a cell that is not listed (" EMDASH
              "; `ncfsm_legality`'s rule and hint).\n\n");
  buf_puts(b, "| State | Rule | Hint |\n|---|---|---|\n");
  for (int s = 0; s < ST_COUNT; s++) {
    buf_printf(b, "| `%s` | ", states[s].name);
    buf_md_cell(b, state_hints[s].rule);
    buf_puts(b, " | ");
    buf_md_cell(b, state_hints[s].hint);
    buf_puts(b, " |\n");
  }
  buf_puts(b, "\n");

  buf_puts(b, "### Listed cells\n\n");
  buf_puts(b, "Rule and text of each listed cell: for ALLOW and DEFER what happens to the call,"
              " for REJECT the hint the call reports.\n\n");
  buf_puts(b, "| State | Calls | Decision | Guard | Rule | Note or hint |\n"
              "|---|---|---|---|---|---|\n");
  for (int s = 0; s < ST_COUNT; s++) {
    unsigned char done[CALL_COUNT];
    memset(done, 0, sizeof done);
    for (int c = 0; c < CALL_COUNT; c++) {
      const struct rule *r = rule_at[s][c];
      if (done[c] || !r) continue;
      buf_printf(b, "| `%s` | ", states[s].name);
      md_same_cells(b, s, c, done);
      buf_printf(b, " | %s | ", dec_name(r->d));
      if (r->g == GD_ANY)
        buf_puts(b, EMDASH);
      else
        buf_printf(b, "`%s`", guards[r->g].name);
      buf_puts(b, " | ");
      buf_md_cell(b, r->rule);
      buf_puts(b, " | ");
      buf_md_cell(b, r->hint);
      buf_puts(b, " |\n");
    }
  }
  buf_puts(b, "\n");

  buf_puts(b, "### When a guard does not hold\n\n");
  buf_puts(b, "A call in an ALLOW or DEFER cell with a guard that does not hold is rejected: it"
              " returns the guard's result and reports the guard's hint.\n\n");
  buf_puts(b, "| Guard | Result | Cells | Hint |\n|---|---|---|---|\n");
  for (int g = 0; g < GD_COUNT; g++) {
    if (g == GD_ANY) continue;
    int any = 0;
    for (size_t i = 0; i < N_RULES && !any; i++) any = (int)rules[i].g == g;
    if (!any) continue;
    buf_printf(b, "| `%s` | `%s` | ", guards[g].name, guards[g].result);
    int first_st = 1;
    for (int s = 0; s < ST_COUNT; s++) {
      int first = 1;
      for (int c = 0; c < CALL_COUNT; c++) {
        if (!rule_at[s][c] || (int)rule_at[s][c]->g != g) continue;
        if (first) buf_printf(b, "%s`%s`: ", first_st ? "" : "; ", states[s].name);
        buf_printf(b, "%s%s", first ? "" : ", ", calls[c].name);
        first = first_st = 0;
      }
    }
    buf_puts(b, " | ");
    buf_md_cell(b, guards[g].hint);
    buf_puts(b, " |\n");
  }
  buf_puts(b, "\n");

  buf_puts(b, "## Work lifecycle\n\n");
  buf_puts(b, "States of an `ncfsm_work` (one submitted op).\n\n");
  md_named_table(b, "Work state", "Description", work_states, N_WORK_STATES, 0);
}

/* ---- files -------------------------------------------------------------- */
struct output {
  const char *name;
  void (*gen)(struct buf *);
};

static const struct output outputs[] = {
    {"fsm.dot", gen_dot},
    {"fsm-tables.md", gen_md},
};
#define N_OUTPUTS (sizeof outputs / sizeof outputs[0])

static char *path_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (!p) {
    fprintf(stderr, "fsm2dot: out of memory\n");
    exit(2);
  }
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static int write_file(const char *path, const struct buf *b) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    fprintf(stderr, "fsm2dot: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  int ok = fwrite(b->p, 1, b->len, f) == b->len;
  if (fclose(f) != 0) ok = 0;
  if (!ok) {
    fprintf(stderr, "fsm2dot: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  return 0;
}

/* Reads a whole file; -1 when it does not exist or cannot be read. */
static int read_file(const char *path, struct buf *b) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  char tmp[8192];
  size_t n;
  while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) buf_add(b, tmp, n);
  int err = ferror(f);
  fclose(f);
  if (!b->p) buf_add(b, "", 0);
  return err ? -1 : 0;
}

/* ---- a small unified diff (LCS over lines) ------------------------------ */
struct lines {
  const char **l;
  size_t *len;
  size_t n;
};

static void split_lines(const struct buf *b, struct lines *ls) {
  size_t cap = 1;
  for (size_t i = 0; i < b->len; i++) cap += b->p[i] == '\n';
  ls->l = malloc(cap * sizeof *ls->l);
  ls->len = malloc(cap * sizeof *ls->len);
  if (!ls->l || !ls->len) {
    fprintf(stderr, "fsm2dot: out of memory\n");
    exit(2);
  }
  ls->n = 0;
  size_t start = 0;
  for (size_t i = 0; i < b->len; i++)
    if (b->p[i] == '\n') {
      ls->l[ls->n] = b->p + start;
      ls->len[ls->n++] = i - start;
      start = i + 1;
    }
  if (start < b->len) { /* last line without '\n' */
    ls->l[ls->n] = b->p + start;
    ls->len[ls->n++] = b->len - start;
  }
}

static int line_eq(const struct lines *a, size_t i, const struct lines *b, size_t j) {
  return a->len[i] == b->len[j] && !memcmp(a->l[i], b->l[j], a->len[i]);
}

#define DIFF_CONTEXT 3
#define DIFF_MAX_LINES 80

/* Prints `diff -u old new`, at most DIFF_MAX_LINES lines of hunks. */
static void print_diff(const char *old_label, const struct buf *old, const char *new_label,
                       const struct buf *new) {
  struct lines a, b;
  split_lines(old, &a);
  split_lines(new, &b);
  size_t w = b.n + 1;
  unsigned *lcs = calloc((a.n + 1) * w, sizeof *lcs); /* lcs of a[i..], b[j..] */
  /* ops: ' ' keep, '-' old only, '+' new only; with the line index in each */
  size_t nops = 0, cap = a.n + b.n + 1;
  char *op = malloc(cap);
  size_t *oi = malloc(cap * sizeof *oi), *oj = malloc(cap * sizeof *oj);
  if (!lcs || !op || !oi || !oj) {
    fprintf(stderr, "fsm2dot: out of memory\n");
    exit(2);
  }
  for (size_t i = a.n; i-- > 0;)
    for (size_t j = b.n; j-- > 0;)
      lcs[i * w + j] = line_eq(&a, i, &b, j) ? lcs[(i + 1) * w + j + 1] + 1
                       : lcs[(i + 1) * w + j] >= lcs[i * w + j + 1] ? lcs[(i + 1) * w + j]
                                                                    : lcs[i * w + j + 1];
  size_t i = 0, j = 0;
  while (i < a.n || j < b.n) {
    if (i < a.n && j < b.n && line_eq(&a, i, &b, j)) {
      op[nops] = ' ', oi[nops] = i++, oj[nops++] = j++;
    } else if (i < a.n && (j == b.n || lcs[(i + 1) * w + j] >= lcs[i * w + j + 1])) {
      op[nops] = '-', oi[nops] = i++, oj[nops++] = j;
    } else {
      op[nops] = '+', oi[nops] = i, oj[nops++] = j++;
    }
  }

  printf("--- %s\n+++ %s\n", old_label, new_label);
  size_t printed = 0, k = 0;
  while (k < nops) {
    while (k < nops && op[k] == ' ') k++;
    if (k == nops) break;
    /* hunk: from DIFF_CONTEXT before the change to DIFF_CONTEXT after the
     * last change that is within 2*DIFF_CONTEXT of the next one */
    size_t start = k > DIFF_CONTEXT ? k - DIFF_CONTEXT : 0, end = k;
    for (;;) {
      while (end < nops && op[end] != ' ') end++;
      size_t run = end;
      while (run < nops && op[run] == ' ') run++;
      if (run < nops && run - end <= 2 * DIFF_CONTEXT) {
        end = run;
        continue;
      }
      end = end + DIFF_CONTEXT < nops ? end + DIFF_CONTEXT : nops;
      break;
    }
    size_t na = 0, nb = 0;
    for (size_t x = start; x < end; x++) {
      na += op[x] != '+';
      nb += op[x] != '-';
    }
    printf("@@ -%zu,%zu +%zu,%zu @@\n", oi[start] + (na ? 1 : 0), na, oj[start] + (nb ? 1 : 0),
           nb);
    for (size_t x = start; x < end; x++) {
      if (printed++ >= DIFF_MAX_LINES) {
        printf("... (diff truncated)\n");
        goto out;
      }
      if (op[x] == '+')
        printf("+%.*s\n", (int)b.len[oj[x]], b.l[oj[x]]);
      else
        printf("%c%.*s\n", op[x], (int)a.len[oi[x]], a.l[oi[x]]);
    }
    k = end;
  }
out:
  free(lcs);
  free(op);
  free(oi);
  free(oj);
  free(a.l);
  free(a.len);
  free(b.l);
  free(b.len);
}

/* ---- main --------------------------------------------------------------- */
static int generate(const char *dir) {
  for (size_t i = 0; i < N_OUTPUTS; i++) {
    struct buf b = {0};
    outputs[i].gen(&b);
    char *p = path_join(dir, outputs[i].name);
    int rc = write_file(p, &b);
    free(p);
    free(b.p);
    if (rc) return -1;
  }
  return 0;
}

static int check(const char *argv0, const char *dir) {
  const char *tmpdir = getenv("TMPDIR");
  char *tmpl = path_join(tmpdir && *tmpdir ? tmpdir : "/tmp", "fsm2dot.XXXXXX");
  if (!mkdtemp(tmpl)) {
    fprintf(stderr, "fsm2dot: mkdtemp %s: %s\n", tmpl, strerror(errno));
    free(tmpl);
    return 2;
  }
  int rc = generate(tmpl) ? 2 : 0;
  int drifted = 0;
  for (size_t i = 0; rc == 0 && i < N_OUTPUTS; i++) {
    char *gp = path_join(tmpl, outputs[i].name), *cp = path_join(dir, outputs[i].name);
    struct buf gen = {0}, com = {0};
    if (read_file(gp, &gen)) {
      fprintf(stderr, "fsm2dot: cannot read back %s\n", gp);
      rc = 2;
    } else if (read_file(cp, &com)) {
      printf("fsm2dot: %s is missing (%s); it is generated from fsm/comm.def\n", cp,
             strerror(errno));
      drifted = 1;
    } else if (com.len != gen.len || memcmp(com.p, gen.p, gen.len)) {
      printf("fsm2dot: %s drifted from fsm/comm.def:\n", cp);
      struct buf nl = {0};
      buf_printf(&nl, "%s (generated from fsm/comm.def)", outputs[i].name);
      print_diff(cp, &com, nl.p, &gen);
      free(nl.p);
      drifted = 1;
    }
    unlink(gp);
    free(gp);
    free(cp);
    free(gen.p);
    free(com.p);
  }
  for (size_t i = 0; i < N_OUTPUTS; i++) { /* files of a failed generate() */
    char *gp = path_join(tmpl, outputs[i].name);
    unlink(gp);
    free(gp);
  }
  rmdir(tmpl);
  free(tmpl);
  if (rc) return rc;
  if (drifted) {
    printf("fsm2dot: the committed docs do not match fsm/comm.def. Regenerate them with\n"
           "    cmake --build <builddir> --target fsm-docs\n"
           "or\n"
           "    %s %s\n"
           "and commit fsm/comm.def together with docs/fsm.dot, docs/fsm-tables.md and"
           " docs/fsm.svg.\n",
           argv0, dir);
    return 1;
  }
  printf("fsm2dot: %s/fsm.dot and %s/fsm-tables.md match fsm/comm.def\n", dir, dir);
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: fsm2dot OUTDIR          write OUTDIR/fsm.dot and OUTDIR/fsm-tables.md\n"
          "       fsm2dot --check OUTDIR  exit 1 when they differ from fsm/comm.def\n");
}

int main(int argc, char **argv) {
  int do_check = 0;
  const char *dir = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--check"))
      do_check = 1;
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else if (argv[i][0] == '-' || dir) {
      usage(stderr);
      return 2;
    } else
      dir = argv[i];
  }
  if (!dir) {
    usage(stderr);
    return 2;
  }
  if (check_table()) return 2;
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "fsm2dot: %s is not a directory\n", dir);
    return 2;
  }
  if (do_check) return check(argv[0], dir);
  return generate(dir) ? 2 : 0;
}
