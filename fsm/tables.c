/* The machines' descriptors (fsm/machine-gen.h over each .def), the comm's
 * own tables (legality cells, hints, poll and control columns), the public
 * queries of the tables, and the comm's lint. Layer 0: data and lookups. */
#include <stdio.h>
#include <string.h>

#include "fsm/tables.h"

/* ---- the public enums (include/ncfsm/states.h) agree with the .def files ---- */
enum {
#define NCFSM_STATE(name, flags, desc) NCFSM__CHK_S_##name,
#include "fsm/comm.def"
  NCFSM__CHK_S_COUNT
};
#define NCFSM_STATE(name, flags, desc) \
  _Static_assert((int)NCFSM_STATE_##name == (int)NCFSM__CHK_S_##name, "include/ncfsm/states.h is stale: make docs");
#include "fsm/comm.def"
_Static_assert((int)NCFSM_STATE_COUNT == (int)NCFSM__CHK_S_COUNT, "include/ncfsm/states.h is stale: make docs");
enum {
#define NCFSM_EVENT(name, source, desc) NCFSM__CHK_E_##name,
#include "fsm/comm.def"
  NCFSM__CHK_E_COUNT
};
#define NCFSM_EVENT(name, source, desc) \
  _Static_assert((int)NCFSM_EV_##name == (int)NCFSM__CHK_E_##name, "include/ncfsm/states.h is stale: make docs");
#include "fsm/comm.def"
_Static_assert((int)NCFSM_EVENT_COUNT == (int)NCFSM__CHK_E_COUNT, "include/ncfsm/states.h is stale: make docs");
enum {
#define NCFSM_CALL(name, fn) NCFSM__CHK_C_##name,
#include "fsm/comm.def"
  NCFSM__CHK_C_COUNT
};
#define NCFSM_CALL(name, fn) \
  _Static_assert((int)NCFSM_CALL_##name == (int)NCFSM__CHK_C_##name, "include/ncfsm/states.h is stale: make docs");
#include "fsm/comm.def"
_Static_assert((int)NCFSM_CALL_COUNT == (int)NCFSM__CHK_C_COUNT, "include/ncfsm/states.h is stale: make docs");
enum {
#define NCFSM_FLAG(name, desc) NCFSM__CHK_F_##name,
#include "fsm/comm.def"
  NCFSM__CHK_F_COUNT
};
#define NCFSM_FLAG(name, desc) \
  _Static_assert(NCFSM_SF_##name == 1u << NCFSM__CHK_F_##name, "include/ncfsm/states.h is stale: make docs");
#include "fsm/comm.def"
enum {
#define NCFSM_STATE(name, flags, desc) NCFSM__CHK_W_##name,
#include "fsm/work.def"
  NCFSM__CHK_W_COUNT
};
#define NCFSM_STATE(name, flags, desc) \
  _Static_assert((int)NCFSM_WORK_##name == (int)NCFSM__CHK_W_##name, "include/ncfsm/states.h is stale: make docs");
#include "fsm/work.def"
_Static_assert((int)NCFSM_WORK_STATE_COUNT == (int)NCFSM__CHK_W_COUNT, "include/ncfsm/states.h is stale: make docs");

/* ---- descriptors ------------------------------------------------------------ */
#define NCFSM_M_DEF "fsm/comm.def"
#define NCFSM_M_ID comm
#define NCFSM_M_S(n) NCFSM_STATE_##n
#define NCFSM_M_E(n) NCFSM_EV_##n
#define NCFSM_M_G(n) NCFSM__CG_##n
#define NCFSM_M_A(n) NCFSM__CA_##n
#define NCFSM_M_F(n) NCFSM_SF_##n
#include "fsm/machine-gen.h"

#define NCFSM_M_DEF "fsm/work.def"
#define NCFSM_M_ID work
#define NCFSM_M_S(n) NCFSM_WORK_##n
#define NCFSM_M_E(n) NCFSM__WE_##n
#define NCFSM_M_G(n) NCFSM__WG_##n
#define NCFSM_M_A(n) NCFSM__WA_##n
#define NCFSM_M_F(n) NCFSM__WF_##n
#include "fsm/machine-gen.h"

#define NCFSM_M_DEF "fsm/group.def"
#define NCFSM_M_ID group
#define NCFSM_M_S(n) NCFSM__GS_##n
#define NCFSM_M_E(n) NCFSM__GE_##n
#define NCFSM_M_G(n) NCFSM__GG_##n
#define NCFSM_M_A(n) NCFSM__GA_##n
#define NCFSM_M_F(n) NCFSM__GF_##n
#include "fsm/machine-gen.h"

#define NCFSM_M_DEF "fsm/held.def"
#define NCFSM_M_ID held
#define NCFSM_M_S(n) NCFSM__HS_##n
#define NCFSM_M_E(n) NCFSM__HE_##n
#define NCFSM_M_G(n) NCFSM__HG_##n
#define NCFSM_M_A(n) NCFSM__HA_##n
#define NCFSM_M_F(n) NCFSM__HF_##n
#include "fsm/machine-gen.h"

#define NCFSM_M_DEF "fsm/timer.def"
#define NCFSM_M_ID timer
#define NCFSM_M_S(n) NCFSM__TS_##n
#define NCFSM_M_E(n) NCFSM__TE_##n
#define NCFSM_M_G(n) NCFSM__TG_##n
#define NCFSM_M_A(n) NCFSM__TA_##n
#define NCFSM_M_F(n) NCFSM__TF_##n
#include "fsm/machine-gen.h"

#define NCFSM_M_DEF "fsm/verify.def"
#define NCFSM_M_ID verify
#define NCFSM_M_S(n) NCFSM__VS_##n
#define NCFSM_M_E(n) NCFSM__VE_##n
#define NCFSM_M_G(n) NCFSM__VG_##n
#define NCFSM_M_A(n) NCFSM__VA_##n
#define NCFSM_M_F(n) NCFSM__VF_##n
#include "fsm/machine-gen.h"

#define NCFSM_M_DEF "fsm/recover.def"
#define NCFSM_M_ID recover
#define NCFSM_M_S(n) NCFSM__RS_##n
#define NCFSM_M_E(n) NCFSM__RE_##n
#define NCFSM_M_G(n) NCFSM__RG_##n
#define NCFSM_M_A(n) NCFSM__RA_##n
#define NCFSM_M_F(n) NCFSM__RF_##n
#include "fsm/machine-gen.h"

const ncfsm__machine *const ncfsm__machines[] = {&ncfsm__m_comm,   &ncfsm__m_work,    &ncfsm__m_group, &ncfsm__m_held, &ncfsm__m_timer,
                                                 &ncfsm__m_verify, &ncfsm__m_recover, NULL};

/* ---- the comm's own tables ---------------------------------------------------- */
const unsigned ncfsm__state_flag_tab[NCFSM_STATE_COUNT] = {
#define NCFSM_STATE(name, flags, desc) (flags),
#include "fsm/comm.def"
};

const char *const ncfsm__comm_call_fns[NCFSM_CALL_COUNT] = {
#define NCFSM_CALL(name, fn) fn,
#include "fsm/comm.def"
};

#define NCFSM_G(g) (1ull << NCFSM__CG_##g)
const ncfsm__cell ncfsm__comm_cells[NCFSM_STATE_COUNT][NCFSM_CALL_COUNT] = {
#define NCFSM_RULE(s, c, d, g, r, h) [NCFSM_STATE_##s][NCFSM_CALL_##c] = {1, NCFSM_##d, (g), r, h},
#include "fsm/comm.def"
};
#undef NCFSM_G

const struct ncfsm__state_hint ncfsm__comm_hints[NCFSM_STATE_COUNT] = {
#define NCFSM_STATE_HINT(s, r, h) [NCFSM_STATE_##s] = {r, h},
#include "fsm/comm.def"
};

const ncfsm__comm_state_cols ncfsm__comm_cols[NCFSM_STATE_COUNT] = {
#define NCFSM_POLL(s, call, ok, err) [NCFSM_STATE_##s].poll = NCFSM__PC_##call, \
                                     [NCFSM_STATE_##s].poll_ok = NCFSM_EV_##ok, \
                                     [NCFSM_STATE_##s].poll_err = NCFSM_EV_##err,
#define NCFSM_CONTROL(s, step, desc) [NCFSM_STATE_##s].control = NCFSM__CS_##step,
#define WAIT NCFSM_CALL_COUNT
#define CALL(c) NCFSM_CALL_##c
#define NCFSM_CLOSE(s, step, why) [NCFSM_STATE_##s].close = step, [NCFSM_STATE_##s].close_why = why,
#include "fsm/comm.def"
#undef WAIT
#undef CALL
};

unsigned long long ncfsm__comm_cell_guards(void) {
  unsigned long long m = 0;
  for (unsigned s = 0; s < NCFSM_STATE_COUNT; s++)
    for (unsigned c = 0; c < NCFSM_CALL_COUNT; c++) m |= ncfsm__comm_cells[s][c].guards;
  return m;
}

#define DEFECT(...)                         \
  do {                                      \
    snprintf(msg, sizeof msg, __VA_ARGS__); \
    if (report) report(arg, msg);           \
    defects++;                              \
  } while (0)

int ncfsm__comm_lint(void (*report)(void *arg, const char *defect), void *arg) {
  const ncfsm__machine *m = &ncfsm__m_comm;
  char msg[512];
  int defects = 0;
  for (unsigned s = 0; s < NCFSM_STATE_COUNT; s++) {
    const char *sn = m->states[s].name;
    unsigned f = m->states[s].flags;
    const ncfsm__comm_state_cols *col = &ncfsm__comm_cols[s];
    if (!ncfsm__comm_hints[s].hint) DEFECT("comm: state %s has no NCFSM_STATE_HINT", sn);
    if ((f & NCFSM_SF_POLL) && col->poll == NCFSM__PC_NONE) DEFECT("comm: state %s has flag POLL but no NCFSM_POLL", sn);
    if (!(f & NCFSM_SF_POLL) && col->poll != NCFSM__PC_NONE) DEFECT("comm: state %s has an NCFSM_POLL but no flag POLL", sn);
    if (col->poll != NCFSM__PC_NONE) {
      if (!ncfsm__m_has_row(m, s, col->poll_ok))
        DEFECT("comm: state %s: a poll's success fires %s, which has no row there", sn, m->events[col->poll_ok].name);
      if (!ncfsm__m_has_row(m, s, col->poll_err))
        DEFECT("comm: state %s: a poll's error fires %s, which has no row there", sn, m->events[col->poll_err].name);
    }
    if ((f & NCFSM_SF_CONTROL) && col->control == NCFSM__CS_NONE)
      DEFECT("comm: state %s has flag CONTROL but no NCFSM_CONTROL", sn);
    if (!(f & NCFSM_SF_CONTROL) && col->control != NCFSM__CS_NONE)
      DEFECT("comm: state %s has an NCFSM_CONTROL but no flag CONTROL", sn);
    if (!col->close_why) DEFECT("comm: state %s has no NCFSM_CLOSE", sn);
    if (col->close != NCFSM_CALL_COUNT && ncfsm__comm_cells[s][col->close].decision == NCFSM_REJECT)
      DEFECT("comm: state %s: its close step %s is refused there by its own legality cell", sn,
             ncfsm__comm_call_fns[col->close]);
    if (col->close == NCFSM_CALL_COUNT) {
      /* a close that waits in a state the comm can leave must reach a state
       * whose close step acts */
      bool leaves = false, acts = false;
      for (unsigned t = 0; t < NCFSM_STATE_COUNT; t++) {
        if (t == s || !ncfsm__m_reachable(m, s, t, false)) continue;
        leaves = true;
        acts |= ncfsm__comm_cols[t].close != NCFSM_CALL_COUNT;
      }
      if (leaves && !acts) DEFECT("comm: state %s: its close step waits, but no state it leads to has a close step that acts", sn);
    }
    if ((f & (NCFSM_SF_WORKS | NCFSM_SF_DEADLINE)) && !ncfsm__m_has_row(m, s, NCFSM_EV_TIMEOUT))
      DEFECT("comm: state %s has works or a deadline but no TIMEOUT row (the watchdog could not fail it)", sn);
    if ((f & (NCFSM_SF_WORKS | NCFSM_SF_POLL)) && !ncfsm__m_has_row(m, s, NCFSM_EV_ASYNC_ERROR))
      DEFECT("comm: state %s has works or polls but no ASYNC_ERROR row", sn);
    for (unsigned c = 0; c < NCFSM_CALL_COUNT; c++) {
      const ncfsm__cell *cl = &ncfsm__comm_cells[s][c];
      if (cl->guards >> m->nguards)
        DEFECT("comm: cell (%s, %s) names a guard the machine does not have", sn, ncfsm__comm_call_fns[c]);
      if (cl->listed && !cl->hint) DEFECT("comm: cell (%s, %s) has no hint", sn, ncfsm__comm_call_fns[c]);
    }
  }
  return defects + ncfsm__m_lint(m, ncfsm__comm_cell_guards(), report, arg);
}

/* ---- public queries (include/ncfsm.h) ------------------------------------------ */
#define IN(x, n) ((unsigned)(x) < (unsigned)(n))

const char *ncfsm_state_name(ncfsm_state_t s) {
  return IN(s, NCFSM_STATE_COUNT) ? ncfsm__m_comm.states[s].name : "UNKNOWN_STATE";
}
unsigned ncfsm_state_flags(ncfsm_state_t s) { return IN(s, NCFSM_STATE_COUNT) ? ncfsm__state_flag_tab[s] : 0; }
const char *ncfsm_event_name(ncfsm_event_t e) {
  return IN(e, NCFSM_EVENT_COUNT) ? ncfsm__m_comm.events[e].name : "UNKNOWN_EVENT";
}
int ncfsm_event_is_call(ncfsm_event_t e) {
  return IN(e, NCFSM_EVENT_COUNT) && ncfsm__m_comm.events[e].source == NCFSM__M_CALL;
}
static const char *const call_names[NCFSM_CALL_COUNT] = {
#define NCFSM_CALL(name, fn) #name,
#include "fsm/comm.def"
};
const char *ncfsm_call_name(ncfsm_call_t c) { return IN(c, NCFSM_CALL_COUNT) ? call_names[c] : "UNKNOWN_CALL"; }
const char *ncfsm_call_fn(ncfsm_call_t c) { return IN(c, NCFSM_CALL_COUNT) ? ncfsm__comm_call_fns[c] : "ncfsm_?"; }
const char *ncfsm_work_state_name(ncfsm_work_state_t s) {
  return IN(s, NCFSM_WORK_STATE_COUNT) ? ncfsm__m_work.states[s].name : "UNKNOWN_WORK_STATE";
}
const char *ncfsm_decision_name(ncfsm_decision_t d) {
  switch (d) {
    case NCFSM_REJECT: return "REJECT";
    case NCFSM_ALLOW: return "ALLOW";
    case NCFSM_DEFER: return "DEFER";
  }
  return "UNKNOWN_DECISION";
}

ncfsm_decision_t ncfsm_legality(ncfsm_state_t s, ncfsm_call_t c, const char **rule, const char **hint) {
  if (!IN(s, NCFSM_STATE_COUNT) || !IN(c, NCFSM_CALL_COUNT)) {
    if (rule) *rule = "-";
    if (hint) *hint = "unknown state or call";
    return NCFSM_REJECT;
  }
  const ncfsm__cell *cl = &ncfsm__comm_cells[s][c];
  if (rule) *rule = cl->listed ? cl->rule : ncfsm__comm_hints[s].rule;
  if (hint) *hint = cl->listed ? cl->hint : ncfsm__comm_hints[s].hint;
  return (ncfsm_decision_t)cl->decision;
}

ncfsm_state_t ncfsm_transition(ncfsm_state_t s, ncfsm_event_t e, const char **action, const char **rule) {
  const ncfsm__machine *m = &ncfsm__m_comm;
  if (!ncfsm__m_has_row(m, (unsigned)s, (unsigned)e)) {
    if (action) *action = NULL;
    if (rule) *rule = NULL;
    return NCFSM_STATE_COUNT;
  }
  const ncfsm__mrow *r = ncfsm__m_row(m, s, e, ncfsm__m_nrows(m, s, e) - 1);
  if (action) *action = m->actions[r->action].name;
  if (rule) *rule = r->rule;
  return (ncfsm_state_t)r->next;
}

int ncfsm_transition_allowed(ncfsm_state_t s, ncfsm_event_t e, ncfsm_state_t next) {
  const ncfsm__machine *m = &ncfsm__m_comm;
  if (!ncfsm__m_has_row(m, (unsigned)s, (unsigned)e)) return 0;
  for (unsigned i = 0; i < ncfsm__m_nrows(m, s, e); i++)
    if (ncfsm__m_row(m, s, e, i)->next == (unsigned)next) return 1;
  return 0;
}

int ncfsm_work_transition_allowed(ncfsm_work_state_t s, ncfsm_work_state_t next) {
  const ncfsm__machine *m = &ncfsm__m_work;
  if (!IN(s, m->nstates) || !IN(next, m->nstates)) return 0;
  for (unsigned e = 0; e < m->nevents; e++)
    for (unsigned i = 0; i < ncfsm__m_nrows(m, s, e); i++)
      if (ncfsm__m_row(m, s, e, i)->next == (unsigned)next) return 1;
  return 0;
}
