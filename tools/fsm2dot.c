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
 * Exit status: 0 ok / up to date, 1 drift (--check), 2 usage, I/O or an
 * inconsistent comm.def (duplicate transition or legality cell, missing hint).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- comm.def, expanded ------------------------------------------------- */
enum st {
#define NCFSM_STATE(name, desc) ST_##name,
#include "fsm/comm.def"
  ST_COUNT
};

enum ev {
#define NCFSM_EVENT(name, desc) EV_##name,
#include "fsm/comm.def"
  EV_COUNT
};

enum call {
#define NCFSM_CALL(name, fn) CALL_##name,
#include "fsm/comm.def"
  CALL_COUNT
};

/* Same order and values as ncfsm_decision_t (REJECT = 0). */
enum dec { D_REJECT = 0, D_ALLOW, D_DEFER };

struct named {
  const char *name, *text;
};

static const struct named states[] = {
#define NCFSM_STATE(name, desc) {#name, desc},
#include "fsm/comm.def"
};

static const struct named events[] = {
#define NCFSM_EVENT(name, desc) {#name, desc},
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

struct trans {
  enum st s;
  enum ev e;
  enum st n;
  const char *action, *rule;
};

static const struct trans transitions[] = {
#define NCFSM_TRANS(s, e, n, a, r) {ST_##s, EV_##e, ST_##n, #a, r},
#include "fsm/comm.def"
};
#define N_TRANS (sizeof transitions / sizeof transitions[0])

struct rule {
  enum st s;
  enum call c;
  enum dec d;
  const char *rule, *hint;
};

static const struct rule rules[] = {
#define NCFSM_RULE(s, c, d, r, h) {ST_##s, CALL_##c, D_##d, r, h},
#include "fsm/comm.def"
};
#define N_RULES (sizeof rules / sizeof rules[0])

static const struct {
  const char *rule, *hint;
} state_hints[ST_COUNT] = {
#define NCFSM_STATE_HINT(s, r, h) [ST_##s] = {r, h},
#include "fsm/comm.def"
};

#define N_WORK_STATES (sizeof work_states / sizeof work_states[0])

/* The dense views, filled by build_tables(). */
static const struct trans *trans_at[ST_COUNT][EV_COUNT];
static const struct rule *rule_at[ST_COUNT][CALL_COUNT];

static int build_tables(void) {
  int bad = 0;
  for (size_t i = 0; i < N_TRANS; i++) {
    const struct trans *t = &transitions[i];
    if (trans_at[t->s][t->e]) {
      fprintf(stderr, "fsm2dot: fsm/comm.def: duplicate NCFSM_TRANS(%s, %s, ...)\n",
              states[t->s].name, events[t->e].name);
      bad = 1;
    }
    trans_at[t->s][t->e] = t;
  }
  for (size_t i = 0; i < N_RULES; i++) {
    const struct rule *r = &rules[i];
    if (rule_at[r->s][r->c]) {
      fprintf(stderr, "fsm2dot: fsm/comm.def: duplicate NCFSM_RULE(%s, %s, ...)\n",
              states[r->s].name, calls[r->c].name);
      bad = 1;
    }
    rule_at[r->s][r->c] = r;
  }
  for (int s = 0; s < ST_COUNT; s++) {
    if (!state_hints[s].hint) {
      fprintf(stderr, "fsm2dot: fsm/comm.def: no NCFSM_STATE_HINT for state %s\n",
              states[s].name);
      bad = 1;
    }
  }
  return bad ? -1 : 0;
}

/* The decision of a cell, as ncfsm_legality() returns it. */
static enum dec cell_decision(int s, int c) {
  return rule_at[s][c] ? rule_at[s][c]->d : D_REJECT;
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

/* ---- fsm.dot ------------------------------------------------------------ */
#define COL_MAIN "#2f4f7f"
#define COL_FAIL "#b0b0b0"
#define COL_FAIL_TXT "#8a8a8a"
#define FAIL_STYLE                                                                      \
  "style=dashed, color=\"" COL_FAIL "\", fontcolor=\"" COL_FAIL_TXT "\", fontsize=8, penwidth=1"

/* Error and abort edges are drawn light so the lifecycle stands out: an
 * edge into ERROR (ASYNC_ERROR, TIMEOUT) or an ABORT. */
static int is_fail_edge(const struct trans *t) {
  return t->n == ST_ERROR || t->e == EV_ABORT;
}

static const char *state_fill(int s) {
  if (s == ST_ERROR) return "#fde7e4";
  if (s == ST_CLOSED) return "#e8e8e8";
  if (s == ST_READY) return "#e3f4e1";
  return "#eef3fb";
}

static void gen_dot(struct buf *b) {
  buf_puts(b,
           "// Generated from fsm/comm.def by tools/fsm2dot; do not edit by hand.\n"
           "// Regenerate: cmake --build <builddir> --target fsm-docs\n"
           "digraph ncfsm_comm {\n"
           "  graph [rankdir=TB, fontname=\"Helvetica\", fontsize=13, nodesep=0.45,"
           " ranksep=0.55, newrank=true, labelloc=t,\n"
           "         label=\"ncfsm communicator state machine (fsm/comm.def)\\n"
           "light dashed edges: error and abort paths\"];\n"
           "  node [shape=box, style=\"rounded,filled\", color=\"" COL_MAIN "\","
           " fontname=\"Helvetica\", fontsize=11, margin=\"0.15,0.06\"];\n"
           "  edge [color=\"" COL_MAIN "\", fontname=\"Helvetica\", fontsize=9,"
           " arrowsize=0.7, penwidth=1.4];\n\n");

  buf_puts(b, "  // states (tooltip: description)\n");
  buf_puts(b, "  __start [shape=point, width=0.14, style=filled, color=black, label=\"\","
              " tooltip=\"initial state\"];\n");
  for (int s = 0; s < ST_COUNT; s++) {
    buf_printf(b, "  %s [", states[s].name);
    if (s == ST_CLOSED)
      buf_puts(b, "shape=doublecircle, style=filled, margin=\"0.02\", ");
    buf_printf(b, "fillcolor=\"%s\", tooltip=\"%s: ", state_fill(s), states[s].name);
    buf_dot_str(b, states[s].text);
    buf_puts(b, "\"];\n");
  }
  buf_puts(b, "  __start -> NEW [tooltip=\"initial state\"];\n");
  /* Layout hints: CLOSED at the bottom; the two shutdown paths (finalize,
   * revoke) side by side. */
  buf_printf(b, "  { rank=sink; %s; }\n", states[ST_CLOSED].name);
  buf_printf(b, "  { rank=same; %s; %s; }\n", states[ST_FINALIZING].name, states[ST_REVOKING].name);
  buf_printf(b, "  { rank=same; %s; %s; }\n", states[ST_FINALIZED].name, states[ST_REVOKED].name);

  /* Edges with the same source, target, action and rule are drawn once, the
   * events joined (ASYNC_ERROR | TIMEOUT). */
  struct edge {
    enum st s, n;
    int fail;
    const struct trans *t;
    struct buf ev, tip;
  } edges[N_TRANS > 0 ? N_TRANS : 1];
  size_t n_edges = 0;
  unsigned char done[N_TRANS > 0 ? N_TRANS : 1];
  memset(done, 0, sizeof done);
  for (size_t i = 0; i < N_TRANS; i++) {
    const struct trans *t = &transitions[i];
    if (done[i]) continue;
    struct edge *ed = &edges[n_edges++];
    memset(ed, 0, sizeof *ed);
    ed->s = t->s, ed->n = t->n, ed->fail = is_fail_edge(t), ed->t = t;
    for (size_t j = i; j < N_TRANS; j++) {
      const struct trans *u = &transitions[j];
      if (done[j] || u->s != t->s || u->n != t->n || strcmp(u->action, t->action) ||
          strcmp(u->rule, t->rule) || is_fail_edge(u) != ed->fail)
        continue;
      done[j] = 1;
      if (ed->ev.len) {
        buf_puts(&ed->ev, " | ");
        buf_puts(&ed->tip, "; ");
      }
      buf_dot_str(&ed->ev, events[u->e].name);
      buf_printf(&ed->tip, "%s: ", events[u->e].name);
      buf_dot_str(&ed->tip, events[u->e].text);
    }
    buf_puts(&ed->ev, " / ");
    buf_dot_str(&ed->ev, t->action);
    buf_puts(&ed->ev, " (");
    buf_dot_str(&ed->ev, t->rule);
    buf_puts(&ed->ev, ")");
  }

  buf_puts(b, "\n  // lifecycle\n");
  for (size_t i = 0; i < n_edges; i++) {
    const struct edge *ed = &edges[i];
    if (ed->fail) continue;
    buf_printf(b, "  %s -> %s [label=\"%s\", tooltip=\"%s -> %s: %s\"];\n", states[ed->s].name,
               states[ed->n].name, ed->ev.p, states[ed->s].name, states[ed->n].name, ed->tip.p);
  }

  /* Error and abort edges with the same label and target are bundled: each
   * source joins a small junction point, one labelled edge goes on to the
   * target. */
  buf_puts(b, "\n  // error and abort paths (light; bundled per label and target)\n");
  unsigned char bundled[N_TRANS > 0 ? N_TRANS : 1];
  memset(bundled, 0, sizeof bundled);
  int junctions = 0;
  for (size_t i = 0; i < n_edges; i++) {
    const struct edge *ed = &edges[i];
    if (!ed->fail || bundled[i]) continue;
    size_t n_same = 0;
    for (size_t j = i; j < n_edges; j++)
      n_same += edges[j].fail && !bundled[j] && edges[j].n == ed->n && !strcmp(edges[j].ev.p, ed->ev.p);
    if (n_same < 2) {
      bundled[i] = 1;
      buf_printf(b, "  %s -> %s [" FAIL_STYLE ", label=\"%s\", tooltip=\"%s -> %s: %s\"];\n",
                 states[ed->s].name, states[ed->n].name, ed->ev.p, states[ed->s].name,
                 states[ed->n].name, ed->tip.p);
      continue;
    }
    int jn = junctions++;
    buf_printf(b, "  __j%d [shape=point, width=0.07, color=\"" COL_FAIL "\", tooltip=\"%s\"];\n",
               jn, ed->ev.p);
    for (size_t j = i; j < n_edges; j++) {
      const struct edge *u = &edges[j];
      if (!u->fail || bundled[j] || u->n != ed->n || strcmp(u->ev.p, ed->ev.p)) continue;
      bundled[j] = 1;
      buf_printf(b, "  %s -> __j%d [" FAIL_STYLE ", arrowhead=none, tooltip=\"%s -> %s: %s\"];\n",
                 states[u->s].name, jn, states[u->s].name, states[u->n].name, u->tip.p);
    }
    buf_printf(b, "  __j%d -> %s [" FAIL_STYLE ", label=\"%s\", tooltip=\"%s\"];\n", jn,
               states[ed->n].name, ed->ev.p, ed->tip.p);
  }
  for (size_t i = 0; i < n_edges; i++) {
    free(edges[i].ev.p);
    free(edges[i].tip.p);
  }
  buf_puts(b, "}\n");
}

/* ---- fsm-tables.md ------------------------------------------------------ */
#define EMDASH "\xe2\x80\x94"

static const char *dec_cell(enum dec d) {
  switch (d) {
    case D_ALLOW: return "ALLOW";
    case D_DEFER: return "DEFER";
    case D_REJECT: break;
  }
  return EMDASH;
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

static void gen_md(struct buf *b) {
  buf_puts(b, "# ncfsm communicator state tables\n\n");
  buf_puts(b, "> Generated from `fsm/comm.def` by `tools/fsm2dot`; do not edit by hand.\n"
              "> Regenerate with `cmake --build <builddir> --target fsm-docs`; the golden\n"
              "> test (`tests/golden`) fails when this file drifts from `fsm/comm.def`.\n"
              "> Rule ids (R1..R12) refer to `shared/design/NCCL-RULES.md`.\n"
              "> Diagram: [fsm.svg](fsm.svg) (source [fsm.dot](fsm.dot)).\n\n");

  int n_allow = 0, n_defer = 0, n_reject = 0;
  for (int s = 0; s < ST_COUNT; s++)
    for (int c = 0; c < CALL_COUNT; c++) switch (cell_decision(s, c)) {
        case D_ALLOW: n_allow++; break;
        case D_DEFER: n_defer++; break;
        case D_REJECT: n_reject++; break;
      }

  buf_printf(b,
             "%d states, %d events, %zu transitions, %d API calls, %zu work states;"
             " legality table: %d cells (%d states x %d calls): %d ALLOW, %d DEFER,"
             " %d REJECT.\n\n",
             (int)ST_COUNT, (int)EV_COUNT, N_TRANS, (int)CALL_COUNT, N_WORK_STATES,
             ST_COUNT * CALL_COUNT, (int)ST_COUNT, (int)CALL_COUNT, n_allow, n_defer, n_reject);

  buf_puts(b, "## Communicator states\n\n");
  buf_printf(b, "`%s` is the initial state, `%s` the final one.\n\n", states[ST_NEW].name,
             states[ST_CLOSED].name);
  md_named_table(b, "State", "Description", states, ST_COUNT, 0);

  buf_puts(b, "## Events\n\n");
  md_named_table(b, "Event", "Description", events, EV_COUNT, 0);

  buf_puts(b, "## Transitions\n\n");
  buf_printf(b,
             "`(state, event) -> next`; the action is what the engine does. The %zu pairs"
             " listed are valid; the other %d of the %d pairs are invalid events.\n\n",
             N_TRANS, ST_COUNT * EV_COUNT - (int)N_TRANS, ST_COUNT * EV_COUNT);
  buf_puts(b, "| State | Event | Next | Action | Rule |\n|---|---|---|---|---|\n");
  for (int s = 0; s < ST_COUNT; s++)
    for (int e = 0; e < EV_COUNT; e++) {
      const struct trans *t = trans_at[s][e];
      if (!t) continue;
      buf_printf(b, "| `%s` | `%s` | `%s` | `", states[s].name, events[e].name,
                 states[t->n].name);
      buf_md_cell(b, t->action);
      buf_puts(b, "` | ");
      buf_md_cell(b, t->rule);
      buf_puts(b, " |\n");
    }
  buf_puts(b, "\n");

  buf_puts(b, "## API calls\n\n");
  md_named_table(b, "Call", "Public function", calls, CALL_COUNT, 1);

  buf_puts(b, "## Legality\n\n");
  buf_printf(b,
             "What `ncfsm_legality(state, call)` decides: %d cells (%d states x %d calls)."
             " ALLOW: accepted, the backend is reached now or at the next launch; DEFER:"
             " accepted and queued until the comm is READY; " EMDASH
             ": rejected with the state's hint (below).\n\n",
             ST_COUNT * CALL_COUNT, (int)ST_COUNT, (int)CALL_COUNT);
  buf_puts(b, "| State |");
  for (int c = 0; c < CALL_COUNT; c++) buf_printf(b, " %s |", calls[c].name);
  buf_puts(b, "\n|---|");
  for (int c = 0; c < CALL_COUNT; c++) buf_puts(b, ":---:|");
  buf_puts(b, "\n");
  for (int s = 0; s < ST_COUNT; s++) {
    buf_printf(b, "| `%s` |", states[s].name);
    for (int c = 0; c < CALL_COUNT; c++) buf_printf(b, " %s |", dec_cell(cell_decision(s, c)));
    buf_puts(b, "\n");
  }
  buf_puts(b, "\n");

  buf_puts(b, "### Reject hint of each state\n\n");
  buf_puts(b, "What a rejected call reports (`ncfsm_legality`'s rule and hint).\n\n");
  buf_puts(b, "| State | Rule | Hint |\n|---|---|---|\n");
  for (int s = 0; s < ST_COUNT; s++) {
    buf_printf(b, "| `%s` | ", states[s].name);
    buf_md_cell(b, state_hints[s].rule);
    buf_puts(b, " | ");
    buf_md_cell(b, state_hints[s].hint);
    buf_puts(b, " |\n");
  }
  buf_puts(b, "\n");

  buf_puts(b, "### Accepted cells\n\n");
  buf_puts(b, "Rule and note of each ALLOW or DEFER cell.\n\n");
  buf_puts(b, "| State | Calls | Decision | Rule | Note |\n|---|---|---|---|---|\n");
  /* Cells of one state with the same decision, rule and note share a row. */
  for (int s = 0; s < ST_COUNT; s++) {
    unsigned char done[CALL_COUNT];
    memset(done, 0, sizeof done);
    for (int c = 0; c < CALL_COUNT; c++) {
      const struct rule *r = rule_at[s][c];
      if (done[c] || !r || r->d == D_REJECT) continue;
      buf_printf(b, "| `%s` | ", states[s].name);
      int first = 1;
      for (int c2 = c; c2 < CALL_COUNT; c2++) {
        const struct rule *r2 = rule_at[s][c2];
        if (done[c2] || !r2 || r2->d != r->d || strcmp(r2->rule, r->rule) ||
            strcmp(r2->hint, r->hint))
          continue;
        done[c2] = 1;
        buf_printf(b, "%s%s", first ? "" : ", ", calls[c2].name);
        first = 0;
      }
      buf_printf(b, " | %s | ", dec_cell(r->d));
      buf_md_cell(b, r->rule);
      buf_puts(b, " | ");
      buf_md_cell(b, r->hint);
      buf_puts(b, " |\n");
    }
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
  if (build_tables()) return 2;
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "fsm2dot: %s is not a directory\n", dir);
    return 2;
  }
  if (do_check) return check(argv[0], dir);
  return generate(dir) ? 2 : 0;
}
