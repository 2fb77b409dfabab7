/* The comm machine (fsm/comm.def) bound to the engine: its guards, the
 * dispatcher's observer (statistics, phase deadline, trace, state
 * callbacks), the fire wrapper with its reaction to invalid events, and the
 * legality check of calls. The actions are in fsm/comm_actions.c. */
#include <assert.h>
#include <stdlib.h>

#include "fsm/engine.h"

/* ---- guards ------------------------------------------------------------------------ */

static unsigned comm_features(const ncfsm_comm *c) {
  return c->bcomm && c->be->comm_features ? c->be->comm_features(c->bcomm) : c->be->features();
}

bool ncfsm__comm_guard(const ncfsm_comm *c, ncfsm__comm_guard_t g, const ncfsm__cev *p) {
  switch (g) {
    case NCFSM__CG_ANY: return true;
    case NCFSM__CG_GROUP_OPS: return c->ngroup > 0;
    case NCFSM__CG_NO_GROUP_OPS: return c->ngroup == 0;
    case NCFSM__CG_GROUP_THREAD: return c->ngroup == 0 || ncfsm__group_owned(c->loop);
    case NCFSM__CG_SIZED: return c->nranks > 0;
    case NCFSM__CG_DRAINED: return c->ngroup == 0 && !c->bq_head && !c->launching;
    case NCFSM__CG_IDLE: return ncfsm__comm_idle(c);
    case NCFSM__CG_HAS_REVOKE: return c->be->revoke && (comm_features(c) & NCFSM__HAS_REVOKE);
    case NCFSM__CG_HAS_SPLIT: return c->be->comm_split && (comm_features(c) & NCFSM__HAS_SPLIT);
    case NCFSM__CG_HAS_SHRINK: return c->be->comm_shrink && (comm_features(c) & NCFSM__HAS_SHRINK);
    case NCFSM__CG_HAS_GROW:
      return c->be->comm_grow && c->be->comm_get_unique_id && (comm_features(c) & NCFSM__HAS_GROW);
    case NCFSM__CG_NOT_CLOSING: return c->close == NULL;
    case NCFSM__CG_POLICY_STAY: return c->opts.on_error == NCFSM_ON_ERROR_STAY;
    case NCFSM__CG_POLICY_EXIT: return c->opts.on_error == NCFSM_ON_ERROR_EXIT;
    case NCFSM__CG_POLICY_RECOVER: return c->opts.on_error == NCFSM_ON_ERROR_SHRINK && c->rops && c->rops->armed(c);
    case NCFSM__CG_POLICY_REVOKE:
      return c->opts.on_error == NCFSM_ON_ERROR_REVOKE && (!p || p->from != NCFSM_STATE_REVOKING) && c->bcomm &&
             ncfsm__comm_guard(c, NCFSM__CG_HAS_REVOKE, p);
    case NCFSM__CG_COUNT: break;
  }
  return false;
}

static bool guard_fn(const void *obj, unsigned g, const void *payload) {
  return ncfsm__comm_guard(obj, (ncfsm__comm_guard_t)g, payload);
}

/* ---- the observer ------------------------------------------------------------------ */

static void note_state(ncfsm_comm *c, int rank, unsigned from, unsigned next, unsigned ev, ncfsm_result_t result) {
  ncfsm_loop *loop = c->loop;
  if (loop->trace) {
    ncfsm_trace_rec r = {NCFSM_OBJ_COMM, c, rank, 0, (int)from, (int)ev, (int)next, result, ncfsm__now_ns()};
    loop->trace(&r, loop->trace_arg);
  }
  if (c->opts.on_state) {
    struct ncfsm__state_note *n = malloc(sizeof *n);
    if (n) {
      *n = (struct ncfsm__state_note){c, (ncfsm_state_t)from, (ncfsm_state_t)next, (ncfsm_event_t)ev, NULL};
      c->refs++;
      if (loop->snote_tail) loop->snote_tail->next = n;
      else loop->snote_head = n;
      loop->snote_tail = n;
    } else {
      NCFSM_WARN(NCFSM__SUB_FSM, "[%s rank %d] out of memory: the state callback for %s -> %s is not delivered",
                 c->name, c->rank, ncfsm_state_name((ncfsm_state_t)from), ncfsm_state_name((ncfsm_state_t)next));
    }
  }
}

static inline __attribute__((always_inline)) void step_fn(void *obj, unsigned from, unsigned ev,
                                                        const ncfsm__mrow *r, void *payload) {
  ncfsm_comm *c = obj;
  ncfsm_loop *loop = c->loop;
  const ncfsm__cev *p = payload;
  unsigned next = r->next, fn = ncfsm__sflags(next);
  loop->stats.trans[from][next]++;
  NCFSM_TRACE(NCFSM__SUB_FSM, "[%s rank %d] %s --%s[%s]/%s (%s)--> %s", c->name, c->rank,
              ncfsm_state_name((ncfsm_state_t)from), ncfsm_event_name((ncfsm_event_t)ev),
              ncfsm__m_comm.guards[r->guard].name, ncfsm__m_comm.actions[r->action].name, r->rule,
              ncfsm_state_name((ncfsm_state_t)next));
  if (next != from) { /* a self-loop (a launch final in READY, the hot path) changes none of these */
    if (from == NCFSM_STATE_READY) /* no hand-off from here on (fsm/submit.h); READY is published after its action */
      atomic_store_explicit(&c->ready_pub, false, memory_order_relaxed);
    ncfsm__comm_enlist(c); /* the turns look at it until it has nothing to do */
    uint64_t now = ncfsm__now_ns();
    c->state_since_ns = now;
    if ((fn & NCFSM_SF_DEADLINE) && !(ncfsm__sflags(from) & NCFSM_SF_DEADLINE))
      c->phase_deadline = ncfsm__deadline(now, c->opts.timeout_ms);
    if (fn & NCFSM_SF_POLL) loop->poll_iter = 0; /* restart the poll burst */
    if (c->close) loop->ctl = loop->kick = true; /* its close column's step is due */
    if (c->rops) c->rops->stepped(c);
  }
  if (fn & NCFSM_SF_CONTROL) loop->ctl = loop->kick = true; /* its control step is due */
  if (loop->trace || c->opts.on_state) /* INIT, INIT_BOOT: the step gives the comm its place */
    note_state(c, p->nranks > 0 ? p->rank : c->rank, from, next, ev, p->cause);
}

/* After the action of a step into READY (a split child's size and rank are set by then):
 * READY is published for a submission's hand-off (fsm/submit.h), unless a follow-up event of
 * the action left it already. Only then is the comm read: a step elsewhere may have freed it
 * (RELEASE). */
static inline __attribute__((always_inline)) void after_fn(void *obj, unsigned from, unsigned ev,
                                                         const ncfsm__mrow *r, void *payload) {
  (void)ev;
  (void)payload;
  if (r->next != NCFSM_STATE_READY || from == NCFSM_STATE_READY) return;
  ncfsm_comm *c = obj;
  atomic_store_explicit(&c->ready_pub, c->state == NCFSM_STATE_READY, memory_order_release);
}

extern void (*const ncfsm__comm_acts[NCFSM__CA_COUNT])(void *, void *);
static const ncfsm__binding comm_binding = {&ncfsm__m_comm, guard_fn, ncfsm__comm_acts, step_fn, after_fn};

/* ---- fire --------------------------------------------------------------------------- */

void ncfsm__comm_fire(ncfsm_comm *c, ncfsm_event_t ev, ncfsm__cev *p) {
  ncfsm__cev none = {0};
  if (!p) {
    none.from = c->state;
    p = &none;
  }
  unsigned from = c->state;
  if (ncfsm__m_fire(&comm_binding, c, &c->state, ev, p)) return;
  /* An engine defect, not a user error: the table has no such step. */
  NCFSM_LOG(NCFSM__LOG_ERROR, NCFSM__SUB_FSM, "[%s rank %d] invalid event %s in state %s (engine defect)", c->name,
            c->rank, ncfsm_event_name(ev), ncfsm_state_name((ncfsm_state_t)from));
  assert(!"invalid event: fsm/comm.def has no row whose guard holds");
  if (ev == NCFSM_EV_INVALID) return;
  ncfsm__set_error(c, "engine defect: event %s is invalid in state %s; every unfinished work failed; abort the "
                      "communicator and report this",
                   ncfsm_event_name(ev), ncfsm_state_name((ncfsm_state_t)from));
  ncfsm__cev inv = {.cause = NCFSM_ERR_INVALID_USAGE, .code = NCFSM__NCCL_SUCCESS, .what = c->last_error, .from = from};
  ncfsm__m_fire(&comm_binding, c, &c->state, NCFSM_EV_INVALID, &inv);
}

bool ncfsm__comm_can_fire(const ncfsm_comm *c, ncfsm_event_t ev) {
  ncfsm__cev p = {.from = c->state};
  return ncfsm__m_find(&comm_binding, c, c->state, ev, &p) != NULL;
}

/* ---- legality ------------------------------------------------------------------------ */

#define NCFSM_G(g) (1ull << NCFSM__CG_##g)
#define FAST_GUARDS (NCFSM_G(GROUP_THREAD) | NCFSM_G(SIZED))
const unsigned char ncfsm__comm_fast[NCFSM_STATE_COUNT][NCFSM_CALL_COUNT] = {
#define NCFSM_RULE(s, c, d, g, r, h) \
  [NCFSM_STATE_##s][NCFSM_CALL_##c] = NCFSM_##d != NCFSM_REJECT && ((g) & ~FAST_GUARDS) == 0,
#include "fsm/comm.def"
};
#undef FAST_GUARDS
#undef NCFSM_G

/* note_group: a refusal fails the caller's open group (R3); false for a
 * call checked on another thread's behalf (a hand-off's take). */
static ncfsm_decision_t check_legal(ncfsm_comm *c, ncfsm_call_t call, ncfsm_result_t *why, bool note_group) {
  const char *rule, *hint;
  ncfsm_state_t s = (ncfsm_state_t)c->state;
  const ncfsm__cell *cl = &ncfsm__comm_cells[s][call];
  ncfsm_decision_t d = cl->listed ? (ncfsm_decision_t)cl->decision : NCFSM_REJECT;
  ncfsm_result_t r = NCFSM_ERR_ILLEGAL_STATE;
  if (d != NCFSM_REJECT) {
    unsigned long long gs = cl->guards; /* tried in guard order: the lowest set bit first */
    unsigned g = 0;
    for (; gs; gs &= gs - 1) {
      g = (unsigned)__builtin_ctzll(gs);
      if (!ncfsm__comm_guard(c, (ncfsm__comm_guard_t)g, NULL)) break;
    }
    if (!gs) return d; /* the hot path: every guard held (no name, no hint looked up) */
    ncfsm_legality(s, call, &rule, &hint);
    const ncfsm__mguard *gd = &ncfsm__m_comm.guards[g];
    d = NCFSM_REJECT;
    r = (ncfsm_result_t)gd->result;
    ncfsm__set_error(c, "%s: illegal in state %s (%s; guard %s does not hold): %s", ncfsm_call_fn(call),
                     ncfsm_state_name(s), rule, gd->name, gd->hint);
  } else {
    ncfsm_legality(s, call, &rule, &hint);
    ncfsm__set_error(c, "%s: illegal in state %s (%s): %s", ncfsm_call_fn(call), ncfsm_state_name(s), rule, hint);
  }
  c->loop->stats.reject[s][call]++;
  if (note_group) ncfsm__group_note_error(c, r);
  if (why) *why = r;
  return d;
}

ncfsm_decision_t ncfsm__check_legal(ncfsm_comm *c, ncfsm_call_t call, ncfsm_result_t *why) {
  return check_legal(c, call, why, true);
}

ncfsm_decision_t ncfsm__check_legal_for_other(ncfsm_comm *c, ncfsm_call_t call, ncfsm_result_t *why) {
  return check_legal(c, call, why, false);
}

/* ---- failing ---------------------------------------------------------------------------- */

void ncfsm__comm_fail(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_result_t cause, int code, const char *what) {
  /* What completed before the failure keeps its result: the completion
   * events are observed once more before the comm fails, so that every work
   * that completes does so before the failure's step (found with push
   * completion: a rank lost right after a collective completed everywhere
   * failed it on a survivor whose event had not been polled yet, and that
   * survivor redid the step). An event that fails to answer is not
   * complete: its work fails with the others. */
  if (ncfsm__has(c, NCFSM_SF_WORKS)) ncfsm__drain(c);
  ncfsm__cev p = {.cause = cause, .code = code, .what = what, .from = c->state};
  ncfsm__comm_fire(c, ev, &p);
}
