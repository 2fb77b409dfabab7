/* fsm2dot's small pieces: strings built with open_memstream, escaping for
 * DOT, Graphviz HTML-like labels and Markdown, and queries over a table
 * that the renderers share. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "tools/fsm2dot/fsm2dot.h"

void fsm2dot_oom(void) {
  fputs("fsm2dot: out of memory\n", stderr);
  exit(2);
}

FILE *mstr_open(struct mstr *s) {
  s->p = NULL;
  s->n = 0;
  s->f = open_memstream(&s->p, &s->n);
  if (!s->f) fsm2dot_oom();
  return s->f;
}

char *mstr_close(struct mstr *s) {
  if (fclose(s->f) != 0 || !s->p) fsm2dot_oom();
  s->f = NULL;
  return s->p;
}

void put_dot(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '\n') {
      fputs("\\n", f);
      continue;
    }
    if (*s == '"' || *s == '\\') fputc('\\', f);
    fputc(*s, f);
  }
}

void put_dot_wrapped(FILE *f, const char *s, unsigned width) {
  unsigned col = 0;
  for (; *s; s++, col++) {
    if (*s == '\n' || (*s == ' ' && col >= width)) {
      fputs("\\n", f);
      col = 0;
      continue;
    }
    char c[2] = {*s, 0};
    put_dot(f, c);
  }
}

void put_html(FILE *f, const char *s) {
  for (; *s; s++) switch (*s) {
      case '&': fputs("&amp;", f); break;
      case '<': fputs("&lt;", f); break;
      case '>': fputs("&gt;", f); break;
      case '"': fputs("&quot;", f); break;
      default: fputc(*s, f);
    }
}

void put_md(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '|') fputc('\\', f);
    fputc(*s == '\n' ? ' ' : *s, f);
  }
}

void put_flags(FILE *f, const ncfsm__machine *m, unsigned flags, const char *sep, bool lower) {
  bool first = true;
  for (unsigned i = 0; i < m->nflags; i++) {
    if (!(flags >> i & 1u)) continue;
    if (!first) fputs(sep, f);
    for (const char *c = m->flags[i].name; *c; c++) fputc(lower ? tolower((unsigned char)*c) : *c, f);
    first = false;
  }
}

static const char *const result_names[] = {
#define FSM2DOT_RESULT(name, value, msg) [value] = "NCFSM_" #name,
    NCFSM_RESULT_MAP(FSM2DOT_RESULT)
#undef FSM2DOT_RESULT
};

const char *fsm2dot_result_name(int r) {
  if (r >= 0 && (size_t)r < sizeof result_names / sizeof result_names[0] && result_names[r]) return result_names[r];
  return "NCFSM_UNKNOWN";
}

bool fsm2dot_terminal(const ncfsm__machine *m, unsigned s) {
  if (s == m->initial) return false;
  for (unsigned i = 0; i < m->nrows; i++)
    if (m->rows[i].s == s && m->rows[i].next != s) return false;
  return true;
}

unsigned fsm2dot_event_states(const ncfsm__machine *m, unsigned e) {
  unsigned n = 0;
  for (unsigned s = 0; s < m->nstates; s++) n += ncfsm__m_has_row(m, s, e);
  return n;
}

bool fsm2dot_bundled(const ncfsm__machine *m, unsigned e) {
  return m->nstates >= BUNDLE_MIN_STATES && 2 * fsm2dot_event_states(m, e) >= m->nstates;
}

const ncfsm__mrow *fsm2dot_default_row(const ncfsm__machine *m, unsigned s, unsigned e) {
  unsigned n = ncfsm__m_has_row(m, s, e) ? ncfsm__m_nrows(m, s, e) : 0;
  for (unsigned i = 0; i < n; i++)
    if (ncfsm__m_row(m, s, e, i)->guard == 0) return ncfsm__m_row(m, s, e, i);
  return n ? ncfsm__m_row(m, s, e, n - 1) : NULL;
}

void put_row_label(FILE *f, const ncfsm__machine *m, const char *events, const ncfsm__mrow *r) {
  fputs(events, f);
  if (r->guard) fprintf(f, " [%s]", m->guards[r->guard].name);
  fprintf(f, " / %s (%s)", m->actions[r->action].name, r->rule);
}
