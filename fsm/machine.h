/*
 * The bottom layer of the engine: a state machine as data, and the one
 * dispatcher that runs every machine (comm, work, group, verifier,
 * recovery). Nothing here knows what a communicator is.
 *
 * A machine is written as an X-macro file, fsm/<name>.def, in one format
 * (docs/design.md "Tables"):
 *
 *   NCFSM_MACHINE(name, INITIAL, "what the object is")
 *   NCFSM_FLAG(name, "meaning")                 a state attribute (bit i of the flags)
 *   NCFSM_STATE(name, flags, "description")
 *   NCFSM_EVENT(name, source, "what happened")  source CALL (a user's call) or LOOP
 *   NCFSM_GUARD(name, result, "condition", "hint when it does not hold")
 *   NCFSM_ACTION(name, "what it does")          action 0 is `none`
 *   NCFSM_TRANS(state, event, guard, next, action, "rule")
 *
 * plus tables of one machine only (the comm's legality cells, poll and
 * control columns: fsm/comm.def). fsm/machine-gen.h expands a .def into an
 * ncfsm__machine; fsm/machine.c indexes it, dispatches events and lints it;
 * tools/fsm2dot renders it.
 *
 * Dispatch (ncfsm__m_fire): the rows of (state, event) are tried in table
 * order; the first whose guard holds gives the next state and the action.
 * Guard 0 (ANY) always holds and action 0 (none) does nothing: neither is
 * called. The object's state is written first, then the binding's step
 * observer runs, then the action, then its after observer: an action sees
 * the new state, and may fire one follow-up event as its last step (run to
 * completion: the follow-up's step is observed after this one's). A (state, event)
 * with no row whose guard holds is returned as NULL: each machine's wrapper
 * decides what an invalid event means.
 */
#ifndef NCFSM_FSM_MACHINE_H
#define NCFSM_FSM_MACHINE_H

#include <stdbool.h>
#include <stdint.h>

#define NCFSM__M_CALL 1 /* event sources */
#define NCFSM__M_LOOP 0

typedef struct ncfsm__mstate {
  const char *name;
  unsigned flags;
  const char *desc;
} ncfsm__mstate;

typedef struct ncfsm__mevent {
  const char *name;
  unsigned char source; /* NCFSM__M_CALL or NCFSM__M_LOOP */
  const char *desc;
} ncfsm__mevent;

typedef struct ncfsm__mguard {
  const char *name;
  int result; /* ncfsm_result_t a call gets when this guard of a legality cell does not hold */
  const char *cond, *hint;
} ncfsm__mguard;

typedef struct ncfsm__maction {
  const char *name, *desc;
} ncfsm__maction;

typedef struct ncfsm__mflag {
  const char *name, *desc;
} ncfsm__mflag;

typedef struct ncfsm__mrow {
  unsigned char s, e, guard, next, action;
  const char *rule;
} ncfsm__mrow;

typedef struct ncfsm__machine {
  const char *name, *desc;
  unsigned initial;
  unsigned nstates, nevents, nguards, nactions, nflags, nrows;
  const ncfsm__mstate *states;
  const ncfsm__mevent *events;
  const ncfsm__mguard *guards;
  const ncfsm__maction *actions;
  const ncfsm__mflag *flags;
  const ncfsm__mrow *rows;
  /* The index, built once at load time (ncfsm__m_index): the rows of
   * (s, e) are rows[first[s * nevents + e]] .. + count[...] - 1. */
  unsigned short *first;
  unsigned char *count;
  /* The cell's row when it has exactly one and that row is unguarded (the
   * common case: one load and a test per fire); NULL otherwise. */
  const struct ncfsm__mrow **only;
  /* How often each row fired since ncfsm__m_count_rows(true) (tests that
   * walk a table row by row; nothing is counted otherwise). */
  unsigned *hits;
} ncfsm__machine;

/* Nonzero while rows are counted (ncfsm__m_count_rows): one load and a
 * branch per transition otherwise. */
extern int ncfsm__m_counting;

/* What the engine binds to a machine's guards and actions. */
typedef struct ncfsm__binding {
  const ncfsm__machine *m;
  bool (*guard)(const void *obj, unsigned g, const void *payload);
  void (*const *acts)(void *obj, void *payload); /* [m->nactions]; [0] unused */
  /* Called after the state is written, before the action (statistics,
   * traces of objects whose actions fire follow-up events); and once the
   * action ran (traces that show what the action wrote). Either may be NULL. */
  void (*step)(void *obj, unsigned from, unsigned ev, const ncfsm__mrow *row, void *payload);
  void (*after)(void *obj, unsigned from, unsigned ev, const ncfsm__mrow *row, void *payload);
} ncfsm__binding;

/* Builds m's index; true when the rows of each (state, event) are adjacent
 * (a table defect otherwise: ncfsm__m_lint says where). Idempotent. */
bool ncfsm__m_index(const ncfsm__machine *m);

static inline unsigned ncfsm__m_nrows(const ncfsm__machine *m, unsigned s, unsigned e) {
  return m->count[s * m->nevents + e];
}
static inline const ncfsm__mrow *ncfsm__m_row(const ncfsm__machine *m, unsigned s, unsigned e, unsigned i) {
  return &m->rows[m->first[s * m->nevents + e] + i];
}

/* The row of (s, e) whose guard holds, or NULL. */
static inline const ncfsm__mrow *ncfsm__m_find(const ncfsm__binding *b, const void *obj, unsigned s, unsigned e,
                                               const void *payload) {
  const ncfsm__machine *m = b->m;
  const ncfsm__mrow *only = m->only[s * m->nevents + e];
  if (only) return only;
  unsigned n = ncfsm__m_nrows(m, s, e);
  for (unsigned i = 0; i < n; i++) {
    const ncfsm__mrow *r = ncfsm__m_row(m, s, e, i);
    if (r->guard == 0 || b->guard(obj, r->guard, payload)) return r;
  }
  return 0;
}

/* Fire event e on obj whose state is *state: NULL (nothing changed) when no
 * row applies. */
static inline const ncfsm__mrow *ncfsm__m_fire(const ncfsm__binding *b, void *obj, unsigned *state, unsigned e,
                                               void *payload) {
  const ncfsm__mrow *r = ncfsm__m_find(b, obj, *state, e, payload);
  if (!r) return 0;
  unsigned from = *state;
  if (__builtin_expect(ncfsm__m_counting, 0)) __atomic_fetch_add(&b->m->hits[r - b->m->rows], 1u, __ATOMIC_RELAXED);
  /* Atomic (a plain store on x86): a thread without the object's lock may
   * read the state as a hint it checks again under the lock (a submission's
   * hand-off reads its loop's group state: fsm/api_ops.c). It orders
   * nothing: what must be seen with a state is published after the action. */
  __atomic_store_n(state, (unsigned)r->next, __ATOMIC_RELAXED);
  if (b->step) b->step(obj, from, e, r, payload);
  if (r->action) b->acts[r->action](obj, payload);
  if (b->after) b->after(obj, from, e, r, payload);
  return r;
}

/* Starts (true: every machine's counts zeroed) or stops counting the rows
 * that fire. For tests, on a process with no engine thread running: the
 * switch itself is not synchronised with other threads. */
void ncfsm__m_count_rows(bool on);

/* Can (s, e) ever fire (some row, whatever its guard)? */
static inline bool ncfsm__m_has_row(const ncfsm__machine *m, unsigned s, unsigned e) {
  return s < m->nstates && e < m->nevents && ncfsm__m_nrows(m, s, e) > 0;
}

/* Is `to` reachable from `from` (through any events, or only LOOP events)? */
bool ncfsm__m_reachable(const ncfsm__machine *m, unsigned from, unsigned to, bool loop_only);

/* The defects of a table: rows of one (state, event) that are not adjacent,
 * a row after an unguarded row of the same (state, event) (never tried), a
 * state no event reaches from the initial state, an event, guard or action
 * no row uses (guards_used: a mask of guards used elsewhere, e.g. by
 * legality cells). Each defect is passed to report (a sentence); returns
 * their number. */
int ncfsm__m_lint(const ncfsm__machine *m, unsigned long long guards_used,
                  void (*report)(void *arg, const char *defect), void *arg);

/* Every machine of the engine, for tools and tests (NULL-terminated). */
extern const ncfsm__machine *const ncfsm__machines[];

#endif
