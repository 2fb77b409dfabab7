/* The dense tables expanded from fsm/comm.def, and the dispatcher that
 * applies them: ncfsm__fire (transitions, guards, actions) and
 * ncfsm__check_legal (legality cells and their guards). */
#include <assert.h>
#include <stdlib.h>

#include "fsm/internal.h"

static const char *const state_names[] = {
#define NCFSM_STATE(name, flags, desc) #name,
#include "fsm/comm.def"
};

const unsigned ncfsm__state_flag_tab[NCFSM_STATE_COUNT] = {
#define NCFSM_STATE(name, flags, desc) (flags),
#include "fsm/comm.def"
};

static const char *const event_names[] = {
#define NCFSM_EVENT(name, source, desc) #name,
#include "fsm/comm.def"
};

#define CALL 1
#define LOOP 0
static const unsigned char event_is_call[] = {
#define NCFSM_EVENT(name, source, desc) source,
#include "fsm/comm.def"
};
#undef CALL
#undef LOOP

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

static const struct {
  const char *name, *cond, *hint;
  ncfsm_result_t result;
} guards[] = {
#define NCFSM_GUARD(name, res, cond, hint) {#name, cond, hint, NCFSM_##res},
#include "fsm/comm.def"
};

static const char *const action_names[] = {
#define NCFSM_ACTION(name, desc) #name,
#include "fsm/comm.def"
};

_Static_assert(sizeof state_names / sizeof *state_names == NCFSM_STATE_COUNT, "states");
_Static_assert(sizeof guards / sizeof *guards == NCFSM_GUARD_COUNT, "guards");
_Static_assert(sizeof action_names / sizeof *action_names == NCFSM_ACTION_COUNT, "actions");

struct cell {
  unsigned char listed, decision; /* decision: ncfsm_decision_t; unlisted = REJECT */
  unsigned char guard;
  const char *rule, *hint;
};

static const struct cell legality[NCFSM_STATE_COUNT][NCFSM_CALL_COUNT] = {
#define NCFSM_RULE(s, c, d, g, r, h) \
  [NCFSM_STATE_##s][NCFSM_CALL_##c] = {1, NCFSM_##d, NCFSM_GUARD_##g, r, h},
#include "fsm/comm.def"
};

static const struct {
  const char *rule, *hint;
} state_hints[NCFSM_STATE_COUNT] = {
#define NCFSM_STATE_HINT(s, r, h) [NCFSM_STATE_##s] = {r, h},
#include "fsm/comm.def"
};

/* The rows in comm.def order; trans_first/trans_n index them per (s, e). */
static const struct row {
  unsigned char s, e, guard, next, action;
  const char *rule;
} rows[] = {
#define NCFSM_TRANS(s, e, g, n, a, r) \
  {NCFSM_STATE_##s, NCFSM_EV_##e, NCFSM_GUARD_##g, NCFSM_STATE_##n, NCFSM_ACT_##a, r},
#include "fsm/comm.def"
};
#define NROWS (sizeof rows / sizeof rows[0])

static unsigned short trans_first[NCFSM_STATE_COUNT][NCFSM_EVENT_COUNT];
static unsigned char trans_n[NCFSM_STATE_COUNT][NCFSM_EVENT_COUNT];
static pthread_once_t index_once = PTHREAD_ONCE_INIT;

/* Rows of one (s, e) are adjacent in comm.def; a later, separate row for
 * the same pair would be a table defect (fsm2dot refuses it too). */
static void build_index(void) {
  for (unsigned i = 0; i < NROWS; i++) {
    unsigned s = rows[i].s, e = rows[i].e;
    if (!trans_n[s][e]) trans_first[s][e] = (unsigned short)i;
    assert(trans_first[s][e] + trans_n[s][e] == i);
    trans_n[s][e]++;
  }
}

static inline void index_ready(void) { pthread_once(&index_once, build_index); }

const char *ncfsm_state_name(ncfsm_state_t s) {
  return (unsigned)s < NCFSM_STATE_COUNT ? state_names[s] : "UNKNOWN_STATE";
}
unsigned ncfsm_state_flags(ncfsm_state_t s) {
  return (unsigned)s < NCFSM_STATE_COUNT ? ncfsm__state_flag_tab[s] : 0;
}
const char *ncfsm_event_name(ncfsm_event_t e) {
  return (unsigned)e < NCFSM_EVENT_COUNT ? event_names[e] : "UNKNOWN_EVENT";
}
int ncfsm_event_is_call(ncfsm_event_t e) {
  return (unsigned)e < NCFSM_EVENT_COUNT ? event_is_call[e] : 0;
}
const char *ncfsm_call_name(ncfsm_call_t c) {
  return (unsigned)c < NCFSM_CALL_COUNT ? call_names[c] : "UNKNOWN_CALL";
}
const char *ncfsm__call_fn(ncfsm_call_t c) {
  return (unsigned)c < NCFSM_CALL_COUNT ? call_fns[c] : "ncfsm_?";
}
const char *ncfsm_guard_name(ncfsm_guard_t g) {
  return (unsigned)g < NCFSM_GUARD_COUNT ? guards[g].name : "UNKNOWN_GUARD";
}
const char *ncfsm_guard_hint(ncfsm_guard_t g) {
  return (unsigned)g < NCFSM_GUARD_COUNT ? guards[g].hint : "";
}
const char *ncfsm_action_name(ncfsm_action_t a) {
  return (unsigned)a < NCFSM_ACTION_COUNT ? action_names[a] : "UNKNOWN_ACTION";
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
  if (!cl->listed) {
    if (rule) *rule = state_hints[s].rule;
    if (hint) *hint = state_hints[s].hint;
  } else {
    if (rule) *rule = cl->rule;
    if (hint) *hint = cl->hint;
  }
  return (ncfsm_decision_t)cl->decision;
}

ncfsm_decision_t ncfsm_legality_guard(ncfsm_state_t s, ncfsm_call_t c, ncfsm_guard_t *guard) {
  if ((unsigned)s >= NCFSM_STATE_COUNT || (unsigned)c >= NCFSM_CALL_COUNT) {
    if (guard) *guard = NCFSM_GUARD_ANY;
    return NCFSM_REJECT;
  }
  if (guard) *guard = (ncfsm_guard_t)legality[s][c].guard;
  return (ncfsm_decision_t)legality[s][c].decision;
}

int ncfsm_transition_rows(ncfsm_state_t s, ncfsm_event_t e, ncfsm_transition_row *out, int max) {
  if ((unsigned)s >= NCFSM_STATE_COUNT || (unsigned)e >= NCFSM_EVENT_COUNT) return 0;
  index_ready();
  int n = trans_n[s][e];
  for (int i = 0; i < n && i < max && out; i++) {
    const struct row *r = &rows[trans_first[s][e] + i];
    out[i] = (ncfsm_transition_row){(ncfsm_guard_t)r->guard, (ncfsm_state_t)r->next,
                                    (ncfsm_action_t)r->action, r->rule};
  }
  return n;
}

ncfsm_state_t ncfsm_transition(ncfsm_state_t s, ncfsm_event_t e, const char **action,
                               const char **rule) {
  if ((unsigned)s >= NCFSM_STATE_COUNT || (unsigned)e >= NCFSM_EVENT_COUNT) goto none;
  index_ready();
  if (!trans_n[s][e]) goto none;
  const struct row *r = &rows[trans_first[s][e] + trans_n[s][e] - 1];
  if (action) *action = action_names[r->action];
  if (rule) *rule = r->rule;
  return (ncfsm_state_t)r->next;
none:
  if (action) *action = NULL;
  if (rule) *rule = NULL;
  return NCFSM_STATE_COUNT;
}

int ncfsm_transition_allowed(ncfsm_state_t s, ncfsm_event_t e, ncfsm_state_t next) {
  if ((unsigned)s >= NCFSM_STATE_COUNT || (unsigned)e >= NCFSM_EVENT_COUNT) return 0;
  index_ready();
  for (int i = 0; i < trans_n[s][e]; i++)
    if (rows[trans_first[s][e] + i].next == next) return 1;
  return 0;
}

/* ---- the dispatcher ----------------------------------------------------------- */

static const struct row *find_row(const ncfsm_comm *c, ncfsm_event_t ev) {
  index_ready();
  for (int i = 0; i < trans_n[c->state][ev]; i++) {
    const struct row *r = &rows[trans_first[c->state][ev] + i];
    if (ncfsm__guard(c, (ncfsm_guard_t)r->guard)) return r;
  }
  return NULL;
}

bool ncfsm__can_fire(const ncfsm_comm *c, ncfsm_event_t ev) { return find_row(c, ev) != NULL; }

static void note_state(ncfsm_comm *c, ncfsm_state_t from, ncfsm_state_t next, ncfsm_event_t ev,
                       ncfsm_result_t result) {
  ncfsm_loop *loop = c->loop;
  if (loop->trace) {
    ncfsm_trace_rec r = {NCFSM_OBJ_COMM, c, c->rank, 0, (int)from, (int)ev, (int)next, result,
                         ncfsm__now_ns()};
    loop->trace(&r, loop->trace_arg);
  }
  if (c->opts.on_state) {
    struct ncfsm__state_note *n = malloc(sizeof *n);
    if (n) {
      *n = (struct ncfsm__state_note){c, from, next, ev, NULL};
      c->refs++;
      if (loop->snote_tail) loop->snote_tail->next = n;
      else loop->snote_head = n;
      loop->snote_tail = n;
    }
  }
}

void ncfsm__fire(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_result_t result) {
  ncfsm_state_t from = c->state;
  const struct row *r = find_row(c, ev);
  if (!r) {
    /* An engine defect, not a user error: the table has no such step. */
    NCFSM_LOG(NCFSM__LOG_ERROR, NCFSM__SUB_FSM,
              "[%s rank %d] invalid event %s in state %s (engine defect)", c->name, c->rank,
              ncfsm_event_name(ev), ncfsm_state_name(from));
    assert(!"invalid event: fsm/comm.def has no row whose guard holds");
    if (ev == NCFSM_EV_INVALID || !(r = find_row(c, NCFSM_EV_INVALID))) return;
    ncfsm__set_error(c, "engine defect: event %s is invalid in state %s; every unfinished work "
                        "failed; abort the communicator and report this",
                     ncfsm_event_name(ev), ncfsm_state_name(from));
    ev = NCFSM_EV_INVALID;
    result = NCFSM_ERR_INVALID_USAGE;
    c->cause = result;
  }
  ncfsm_state_t next = (ncfsm_state_t)r->next;
  c->state = next;
  c->loop->stats.trans[from][next]++;
  if (next != from) c->state_since_ns = ncfsm__now_ns();
  NCFSM_TRACE(NCFSM__SUB_FSM, "[%s rank %d] %s --%s[%s]/%s (%s)--> %s", c->name, c->rank,
              ncfsm_state_name(from), ncfsm_event_name(ev), guards[r->guard].name,
              action_names[r->action], r->rule, ncfsm_state_name(next));
  if ((ncfsm__state_flag_tab[next] & NCFSM_SF_DEADLINE) && !(ncfsm__state_flag_tab[from] & NCFSM_SF_DEADLINE))
    c->phase_deadline = ncfsm__deadline(ncfsm__now_ns(), c->opts.timeout_ms);
  note_state(c, from, next, ev, result);
  ncfsm__act(c, (ncfsm_action_t)r->action, ev, from);
}

/* ---- legality --------------------------------------------------------------------- */

/* R3: inside a group, a failed call is returned again by the outermost end
 * (the first such error), as NCCL's ncclGroupErrCheck does. */
static void group_note_error(ncfsm_comm *c, ncfsm_result_t r) {
  ncfsm_loop *loop = c->loop;
  if (loop->group_depth > 0 && pthread_equal(loop->group_owner, pthread_self()) &&
      loop->group_err == NCFSM_OK) {
    loop->group_err = r;
    ncfsm__loop_error(loop, "%s", c->last_error);
  }
}

ncfsm_decision_t ncfsm__check_legal(ncfsm_comm *c, ncfsm_call_t call, ncfsm_result_t *why) {
  const char *rule, *hint;
  ncfsm_decision_t d = ncfsm_legality(c->state, call, &rule, &hint);
  ncfsm_result_t r = NCFSM_ERR_ILLEGAL_STATE;
  if (d != NCFSM_REJECT) {
    ncfsm_guard_t g = (ncfsm_guard_t)legality[c->state][call].guard;
    if (ncfsm__guard(c, g)) return d;
    d = NCFSM_REJECT;
    hint = guards[g].hint;
    r = guards[g].result;
    ncfsm__set_error(c, "%s: illegal in state %s (%s; guard %s does not hold): %s",
                     ncfsm__call_fn(call), ncfsm_state_name(c->state), rule, guards[g].name, hint);
  } else {
    ncfsm__set_error(c, "%s: illegal in state %s (%s): %s", ncfsm__call_fn(call),
                     ncfsm_state_name(c->state), rule, hint);
  }
  c->loop->stats.reject[c->state][call]++;
  group_note_error(c, r);
  if (why) *why = r;
  return d;
}

void ncfsm__group_note_error(ncfsm_comm *c, ncfsm_result_t r) { group_note_error(c, r); }
