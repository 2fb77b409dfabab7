/* The dense tables expanded from fsm/comm.def. */
#include "fsm/internal.h"

static const char *const state_names[] = {
#define NCFSM_STATE(name, desc) #name,
#include "fsm/comm.def"
};

static const char *const event_names[] = {
#define NCFSM_EVENT(name, desc) #name,
#include "fsm/comm.def"
};

static const char *const call_names[] = {
#define NCFSM_CALL(name, fn) #name,
#include "fsm/comm.def"
};

static const char *const call_fns[] = {
#define NCFSM_CALL(name, fn) fn,
#include "fsm/comm.def"
};

static const char *const work_state_names[] = {
#define NCFSM_WORK_STATE(name, desc) #name,
#include "fsm/comm.def"
};

struct cell {
  unsigned char decision; /* ncfsm_decision_t; 0 = REJECT */
  const char *rule, *hint;
};

static const struct cell legality[NCFSM_STATE_COUNT][NCFSM_CALL_COUNT] = {
#define NCFSM_RULE(s, c, d, r, h) [NCFSM_STATE_##s][NCFSM_CALL_##c] = {NCFSM_##d, r, h},
#include "fsm/comm.def"
};

static const struct {
  const char *rule, *hint;
} state_hints[NCFSM_STATE_COUNT] = {
#define NCFSM_STATE_HINT(s, r, h) [NCFSM_STATE_##s] = {r, h},
#include "fsm/comm.def"
};

struct trans {
  unsigned char valid, next;
  const char *action, *rule;
};

static const struct trans transitions[NCFSM_STATE_COUNT][NCFSM_EVENT_COUNT] = {
#define NCFSM_TRANS(s, e, n, a, r) [NCFSM_STATE_##s][NCFSM_EV_##e] = {1, NCFSM_STATE_##n, #a, r},
#include "fsm/comm.def"
};

const char *ncfsm_state_name(ncfsm_state_t s) {
  return (unsigned)s < NCFSM_STATE_COUNT ? state_names[s] : "UNKNOWN_STATE";
}
const char *ncfsm_event_name(ncfsm_event_t e) {
  return (unsigned)e < NCFSM_EVENT_COUNT ? event_names[e] : "UNKNOWN_EVENT";
}
const char *ncfsm_call_name(ncfsm_call_t c) {
  return (unsigned)c < NCFSM_CALL_COUNT ? call_names[c] : "UNKNOWN_CALL";
}
const char *ncfsm__call_fn(ncfsm_call_t c) {
  return (unsigned)c < NCFSM_CALL_COUNT ? call_fns[c] : "ncfsm_?";
}
const char *ncfsm_work_state_name(ncfsm_work_state_t s) {
  return (unsigned)s < NCFSM_WORK_STATE_COUNT ? work_state_names[s] : "UNKNOWN_WORK_STATE";
}
const char *ncfsm_decision_name(ncfsm_decision_t d) {
  switch (d) {
    case NCFSM_REJECT: return "REJECT";
    case NCFSM_ALLOW: return "ALLOW";
    case NCFSM_DEFER: return "DEFER";
  }
  return "UNKNOWN_DECISION";
}

ncfsm_decision_t ncfsm_legality(ncfsm_state_t s, ncfsm_call_t c, const char **rule,
                                const char **hint) {
  if ((unsigned)s >= NCFSM_STATE_COUNT || (unsigned)c >= NCFSM_CALL_COUNT) {
    if (rule) *rule = "-";
    if (hint) *hint = "unknown state or call";
    return NCFSM_REJECT;
  }
  const struct cell *cl = &legality[s][c];
  if (cl->decision == NCFSM_REJECT || !cl->hint) {
    if (rule) *rule = state_hints[s].rule;
    if (hint) *hint = state_hints[s].hint;
  } else {
    if (rule) *rule = cl->rule;
    if (hint) *hint = cl->hint;
  }
  return (ncfsm_decision_t)cl->decision;
}

ncfsm_state_t ncfsm_transition(ncfsm_state_t s, ncfsm_event_t e, const char **action,
                               const char **rule) {
  if ((unsigned)s >= NCFSM_STATE_COUNT || (unsigned)e >= NCFSM_EVENT_COUNT ||
      !transitions[s][e].valid) {
    if (action) *action = NULL;
    if (rule) *rule = NULL;
    return NCFSM_STATE_COUNT;
  }
  if (action) *action = transitions[s][e].action;
  if (rule) *rule = transitions[s][e].rule;
  return (ncfsm_state_t)transitions[s][e].next;
}
