/* The generic machine: its index, reachability and the table linter
 * (fsm/machine.h). Dispatch itself is inline in the header. */
#include "fsm/machine.h"

#include <stdio.h>
#include <string.h>

int ncfsm__m_counting;

void ncfsm__m_count_rows(bool on) {
  if (on)
    for (unsigned i = 0; ncfsm__machines[i]; i++)
      memset(ncfsm__machines[i]->hits, 0, ncfsm__machines[i]->nrows * sizeof *ncfsm__machines[i]->hits);
  __atomic_store_n(&ncfsm__m_counting, on ? 1 : 0, __ATOMIC_RELEASE);
}

bool ncfsm__m_index(const ncfsm__machine *m) {
  unsigned cells = m->nstates * m->nevents;
  bool adjacent = true;
  memset(m->count, 0, cells * sizeof *m->count);
  for (unsigned i = 0; i < m->nrows; i++) {
    const ncfsm__mrow *r = &m->rows[i];
    unsigned k = r->s * m->nevents + r->e;
    if (!m->count[k]) m->first[k] = (unsigned short)i;
    else if (m->first[k] + m->count[k] != i) adjacent = false;
    m->count[k]++;
  }
  for (unsigned k = 0; k < cells; k++) {
    const ncfsm__mrow *r = m->count[k] == 1 ? &m->rows[m->first[k]] : NULL;
    m->only[k] = r && r->guard == 0 ? r : NULL;
  }
  return adjacent;
}

bool ncfsm__m_reachable(const ncfsm__machine *m, unsigned from, unsigned to, bool loop_only) {
  unsigned char seen[256] = {0};
  unsigned char stack[256];
  unsigned n = 0;
  if (from >= m->nstates || to >= m->nstates) return false;
  stack[n++] = (unsigned char)from;
  seen[from] = 1;
  while (n) {
    unsigned s = stack[--n];
    if (s == to) return true;
    /* the rows themselves, not the index: the lint calls this on tables
     * whose rows may not be adjacent */
    for (unsigned i = 0; i < m->nrows; i++) {
      const ncfsm__mrow *r = &m->rows[i];
      if (r->s != s || (loop_only && m->events[r->e].source == NCFSM__M_CALL)) continue;
      if (!seen[r->next]) {
        seen[r->next] = 1;
        stack[n++] = r->next;
      }
    }
  }
  return false;
}

#define DEFECT(...)                              \
  do {                                           \
    snprintf(msg, sizeof msg, __VA_ARGS__);      \
    if (report) report(arg, msg);                \
    defects++;                                   \
  } while (0)

int ncfsm__m_lint(const ncfsm__machine *m, unsigned long long guards_used,
                  void (*report)(void *arg, const char *defect), void *arg) {
  char msg[512];
  int defects = 0;
  if (m->nstates > 255 || m->nevents > 255 || m->nguards > 64 || m->nactions > 255) {
    DEFECT("machine %s: more than 255 states, events or actions, or 64 guards", m->name);
    return defects;
  }
  if (m->nguards == 0 || strcmp(m->guards[0].name, "ANY") != 0)
    DEFECT("machine %s: guard 0 must be ANY (the dispatcher never calls it)", m->name);
  if (m->nactions == 0 || strcmp(m->actions[0].name, "none") != 0)
    DEFECT("machine %s: action 0 must be none (the dispatcher never calls it)", m->name);
  /* rows of one (state, event) adjacent, and no row after an unguarded one */
  for (unsigned i = 0; i < m->nrows; i++) {
    const ncfsm__mrow *r = &m->rows[i];
    int prev = -1;
    bool unguarded = false;
    for (unsigned j = 0; j < i; j++)
      if (m->rows[j].s == r->s && m->rows[j].e == r->e) {
        prev = (int)j;
        unguarded |= m->rows[j].guard == 0;
      }
    if (prev < 0) continue;
    if ((unsigned)prev != i - 1)
      DEFECT("machine %s: the rows of (%s, %s) are not adjacent (rows %d and %u)", m->name, m->states[r->s].name,
             m->events[r->e].name, prev + 1, i + 1);
    if (unguarded)
      DEFECT("machine %s: row %u (%s, %s, guard %s) follows an unguarded row of the same state and event: it is "
             "never tried",
             m->name, i + 1, m->states[r->s].name, m->events[r->e].name, m->guards[r->guard].name);
  }
  /* states reachable from the initial state */
  for (unsigned s = 0; s < m->nstates; s++)
    if (s != m->initial && !ncfsm__m_reachable(m, m->initial, s, false))
      DEFECT("machine %s: state %s is unreachable from %s", m->name, m->states[s].name,
             m->states[m->initial].name);
  /* events, guards, actions used */
  unsigned long long gused = guards_used | 1ull;
  unsigned char eused[256] = {0}, aused[256] = {0};
  aused[0] = 1;
  for (unsigned i = 0; i < m->nrows; i++) {
    eused[m->rows[i].e] = 1;
    aused[m->rows[i].action] = 1;
    gused |= 1ull << m->rows[i].guard;
  }
  for (unsigned e = 0; e < m->nevents; e++)
    if (!eused[e]) DEFECT("machine %s: event %s has no row", m->name, m->events[e].name);
  for (unsigned a = 0; a < m->nactions; a++)
    if (!aused[a]) DEFECT("machine %s: action %s is used by no row", m->name, m->actions[a].name);
  for (unsigned g = 0; g < m->nguards; g++)
    if (!(gused >> g & 1)) DEFECT("machine %s: guard %s is used by no row or cell", m->name, m->guards[g].name);
  return defects;
}
