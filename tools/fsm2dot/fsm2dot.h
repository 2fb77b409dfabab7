/*
 * tools/fsm2dot: renders and lints every machine of the engine (the
 * descriptors of fsm/tables.c, fsm/machine.h's format). One job per file:
 *
 *   main.c          the command line, the lint, writing and --check (diff -u)
 *   view.c          the comm's own tables (legality cells, columns, hints):
 *                   the only file of the tool compiled against their sizes
 *   text.c          escaping, string building (open_memstream), table queries
 *   render_dot.c    one Graphviz diagram per machine (fsm-<name>.dot)
 *   happy.c         the comm's happy path, derived from its table (fsm-comm-happy.dot)
 *   render_md.c     fsm-tables.md: every machine's states, events, guards, actions, rows
 *   render_md_comm.c  fsm-tables.md: the comm's calls, columns, hints and legality
 *   header.c        include/ncfsm/states.h (--header)
 *
 * Output is deterministic: it follows the order of the .def files and holds
 * no timestamp, path or version.
 */
#ifndef NCFSM_TOOLS_FSM2DOT_H
#define NCFSM_TOOLS_FSM2DOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "fsm/tables.h"

/* ---- the comm's own tables (view.c) ---------------------------------------- */
struct fsm2dot_comm {
  const ncfsm__machine *m;    /* the comm machine */
  const ncfsm__machine *work; /* the work machine: its states are public too */
  unsigned ncalls;            /* the legality table's columns */
  const char *const *call_fns;
  const ncfsm__cell *cells; /* [state * ncalls + call] */
  const ncfsm__comm_state_cols *cols;
  const struct ncfsm__state_hint *hints;
  unsigned flag_failed, flag_end; /* NCFSM_SF_FAILED, NCFSM_SF_END */
};
extern const struct fsm2dot_comm fsm2dot_comm;

static inline const ncfsm__cell *fsm2dot_cell(unsigned s, unsigned c) {
  return &fsm2dot_comm.cells[s * fsm2dot_comm.ncalls + c];
}
/* "ALLREDUCE" (the enum's suffix), "ncfsm_allreduce" (the public function). */
const char *fsm2dot_call_name(unsigned c);
/* "INIT", "ID_POST": the names of the poll and control columns' values
 * (fsm/tables.h's enums); NULL for a value the tool does not know. */
const char *fsm2dot_poll_name(unsigned pc);
const char *fsm2dot_control_name(unsigned cs);
/* The legality cells whose guards include g (render_md_comm.c). */
unsigned fsm2dot_cells_with_guard(unsigned g);

/* ---- text (text.c) --------------------------------------------------------- */
/* A string built with open_memstream. */
struct mstr {
  FILE *f;
  char *p;
  size_t n;
};
FILE *mstr_open(struct mstr *s);
/* Closes the stream; s->p is the string (free it). */
char *mstr_close(struct mstr *s);
void fsm2dot_oom(void) __attribute__((noreturn));

void put_dot(FILE *f, const char *s);  /* the body of a DOT "string" */
/* The same, a line break at the first space after `width` characters of a
 * line (a graph's label). */
void put_dot_wrapped(FILE *f, const char *s, unsigned width);
void put_html(FILE *f, const char *s); /* text of a Graphviz HTML-like label */
void put_md(FILE *f, const char *s);   /* a Markdown table cell */
/* The names of the flags set in `flags`, joined by sep; lower case when
 * lower; "" when none. */
void put_flags(FILE *f, const ncfsm__machine *m, unsigned flags, const char *sep, bool lower);
/* "NCFSM_ERR_ILLEGAL_STATE" */
const char *fsm2dot_result_name(int r);

/* ---- table queries (text.c) ------------------------------------------------ */
/* A final state: not the initial one, and no row leads from it elsewhere. */
bool fsm2dot_terminal(const ncfsm__machine *m, unsigned s);
/* The number of states in which e has a row. */
unsigned fsm2dot_event_states(const ncfsm__machine *m, unsigned e);
/* Events drawn light and bundled: rows in at least half of the states of a
 * machine of BUNDLE_MIN_STATES states or more (failures, timeouts, aborts,
 * cancels: what can happen almost anywhere). */
#define BUNDLE_MIN_STATES 8
bool fsm2dot_bundled(const ncfsm__machine *m, unsigned e);
/* The row (s, e) takes when none of its guards is known: its unguarded row,
 * else its last. NULL when (s, e) has no row. */
const ncfsm__mrow *fsm2dot_default_row(const ncfsm__machine *m, unsigned s, unsigned e);
/* "EVENT [GUARD] / action (rule)", the label of a row; events: the names of
 * the rows' events joined (several rows with the same guard, action, rule). */
void put_row_label(FILE *f, const ncfsm__machine *m, const char *events, const ncfsm__mrow *r);

/* ---- outputs --------------------------------------------------------------- */
void fsm2dot_dot(FILE *f, const ncfsm__machine *m); /* render_dot.c */
void fsm2dot_happy(FILE *f);                         /* happy.c */
void fsm2dot_md(FILE *f);                            /* render_md.c */
void fsm2dot_md_comm(FILE *f);                       /* render_md_comm.c */
void fsm2dot_header(FILE *f);                        /* header.c */

/* Shared by the diagrams (render_dot.c): edges of CALL events are dark
 * blue, those of LOOP events teal. */
#define DOT_CALL "#1f3a68"
#define DOT_LOOP "#2f6f7f"
void dot_open(FILE *f, const char *graph, const ncfsm__machine *m, const char *title, const char *legend);
void dot_state(FILE *f, const ncfsm__machine *m, unsigned s);
void dot_start(FILE *f, const ncfsm__machine *m);

/* The comm's happy path (happy.c): rows[i] is set for the rows on it
 * ([m->nrows]); returns how many. */
unsigned fsm2dot_happy_rows(bool *rows);
/* The sentence that says how the happy path is derived. */
extern const char fsm2dot_happy_rule[];

#endif
