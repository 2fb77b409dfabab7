/* include/ncfsm/states.h (fsm2dot --header): the public vocabulary of the
 * comm and work machines, in the order of their .def files. fsm/tables.c
 * checks at compile time that the committed file agrees with the tables;
 * tests/golden that it is what this writes. */
#include "tools/fsm2dot/fsm2dot.h"

/* A description in a C comment ("*" "/" would end it). */
static void put_comment(FILE *f, const char *s) {
  for (; *s; s++) {
    fputc(*s, f);
    if (s[0] == '*' && s[1] == '/') fputc(' ', f);
  }
}

static void item(FILE *f, const char *prefix, const char *name, const char *source, const char *desc) {
  fprintf(f, "  %s%s, /* %s", prefix, name, source ? source : "");
  put_comment(f, desc);
  fputs(" */\n", f);
}

void fsm2dot_header(FILE *f) {
  const ncfsm__machine *c = fsm2dot_comm.m, *w = fsm2dot_comm.work;
  fprintf(f,
          "/* Generated from fsm/%s.def and fsm/%s.def by tools/fsm2dot --header;\n"
          " * do not edit (make docs regenerates it; tests/golden fails when it drifts).\n"
          " * The public vocabulary of the state machines: a communicator's states, its\n"
          " * events (state callbacks and traces name them), the calls of the legality\n"
          " * table, the state attributes, and a work's states. Guards, actions and\n"
          " * transitions are internal (fsm/%s.def). */\n"
          "#ifndef NCFSM_STATES_H\n#define NCFSM_STATES_H\n\n"
          "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n",
          c->name, w->name, c->name);

  fprintf(f, "/* A communicator's states (fsm/%s.def). */\ntypedef enum ncfsm_state {\n", c->name);
  for (unsigned s = 0; s < c->nstates; s++) item(f, "NCFSM_STATE_", c->states[s].name, NULL, c->states[s].desc);
  fputs("  NCFSM_STATE_COUNT\n} ncfsm_state_t;\n\n", f);

  fputs("/* State attributes (ncfsm_state_flags). */\n", f);
  for (unsigned i = 0; i < c->nflags; i++) {
    fprintf(f, "#define NCFSM_SF_%s 0x%xu /* ", c->flags[i].name, 1u << i);
    put_comment(f, c->flags[i].desc);
    fputs(" */\n", f);
  }

  fprintf(f, "\n/* What moves a communicator from state to state (fsm/%s.def). */\ntypedef enum ncfsm_event {\n", c->name);
  for (unsigned e = 0; e < c->nevents; e++)
    item(f, "NCFSM_EV_", c->events[e].name, c->events[e].source == NCFSM__M_CALL ? "call: " : "loop: ",
         c->events[e].desc);
  fputs("  NCFSM_EVENT_COUNT\n} ncfsm_event_t;\n\n", f);

  fputs("/* The calls of the legality table (ncfsm_legality). */\ntypedef enum ncfsm_call {\n", f);
  for (unsigned k = 0; k < fsm2dot_comm.ncalls; k++)
    item(f, "NCFSM_CALL_", fsm2dot_call_name(k), NULL, fsm2dot_comm.call_fns[k]);
  fputs("  NCFSM_CALL_COUNT\n} ncfsm_call_t;\n\n", f);

  fprintf(f, "/* A work's states (fsm/%s.def). */\ntypedef enum ncfsm_work_state {\n", w->name);
  for (unsigned s = 0; s < w->nstates; s++) item(f, "NCFSM_WORK_", w->states[s].name, NULL, w->states[s].desc);
  fputs("  NCFSM_WORK_STATE_COUNT\n} ncfsm_work_state_t;\n\n", f);

  fputs("#ifdef __cplusplus\n}\n#endif\n#endif\n", f);
}
