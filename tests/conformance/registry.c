/* The scenarios in run order (the order of the report), the lookup of their
 * expectations, and the consistency checks of the tables. */
#include <stdio.h>
#include <string.h>

#include "conformance.h"

extern const scen_t scen_init, scen_groupend_inprogress, scen_call_during_inprogress, scen_event_after_inprogress;
extern const scen_t scen_groupend_without_start, scen_nested_groups, scen_argerr_nonblocking, scen_argerr_blocking,
    scen_two_streams, scen_mixed_blocking_nonblocking, scen_blocking_then_nonblocking_groups;
extern const scen_t scen_r12_same_buffer_group, scen_r12_separate_launches;
extern const scen_t scen_finalize_once, scen_finalize_twice, scen_destroy_after_finalize,
    scen_destroy_poisoned_cascade, scen_destroy_inprogress_cascade;
extern const scen_t scen_abort_in_flight;
extern const scen_t scen_revoke, scen_revoke_absent_sim, scen_revoke_absent_sim_knob;

/* R8: nothing to run through core/backend.h (no split entry point). */
static const scen_t scen_split_child_handle = {
    .id = "split_child_handle", .rule = "R8", .title = "split child handle valid only after the parent polls to success",
    .sim_has_revoke = -1,
    .skip = "the backend interface (core/backend.h) has no split entry point; nothing to call",
};

const scen_t *const scenarios[] = {
    &scen_init,
    &scen_groupend_inprogress,
    &scen_call_during_inprogress,
    &scen_groupend_without_start,
    &scen_nested_groups,
    &scen_argerr_nonblocking,
    &scen_argerr_blocking,
    &scen_r12_same_buffer_group,
    &scen_r12_separate_launches,
    &scen_finalize_once,
    &scen_finalize_twice,
    &scen_destroy_after_finalize,
    &scen_destroy_poisoned_cascade,
    &scen_destroy_inprogress_cascade,
    &scen_two_streams,
    &scen_event_after_inprogress,
    &scen_revoke,
    &scen_revoke_absent_sim,
    &scen_revoke_absent_sim_knob,
    &scen_mixed_blocking_nonblocking,
    &scen_blocking_then_nonblocking_groups,
    &scen_abort_in_flight,
    &scen_split_child_handle,
};
const int nscenarios = (int)(sizeof scenarios / sizeof scenarios[0]);

const ncfsm_expect_t *ncfsm_expectation_of(const char *scenario) {
  for (int i = 0; i < ncfsm_nexpectations; i++)
    if (!strcmp(ncfsm_expectations[i].scenario, scenario)) return &ncfsm_expectations[i];
  return NULL;
}

const exp_t *scen_expectation(const scen_t *s, int m, unsigned features) {
  int norevoke = !(features & NCFSM__HAS_REVOKE);
  if (m == M_RAW) return norevoke && s->raw_norevoke.rc ? &s->raw_norevoke : &s->raw;
  const ncfsm_expect_t *e = ncfsm_expectation_of(s->id);
  if (!e) return NULL;
  return norevoke && e->norevoke.rc ? &e->norevoke : &e->exp;
}

static int find_scen(const scen_t *const *scens, int nscen, const char *id) {
  for (int i = 0; i < nscen; i++)
    if (!strcmp(scens[i]->id, id)) return i;
  return -1;
}

int registry_check(const scen_t *const *scens, int nscen, const ncfsm_expect_t *ne, int nne, const known_t *k,
                   int nk, char *err, size_t errlen) {
  for (int i = 0; i < nscen; i++) {
    const scen_t *s = scens[i];
    if (find_scen(scens, nscen, s->id) != i) {
      snprintf(err, errlen, "scenario '%s' is listed twice", s->id);
      return -1;
    }
    int nexp = 0;
    for (int j = 0; j < nne; j++) nexp += !strcmp(ne[j].scenario, s->id);
    if (s->fn[M_NCFSM] && nexp != 1) {
      snprintf(err, errlen, "scenario '%s' runs in ncfsm mode but has %d entries in expect_ncfsm.c (needs 1)", s->id,
               nexp);
      return -1;
    }
  }
  for (int j = 0; j < nne; j++) {
    int si = find_scen(scens, nscen, ne[j].scenario);
    if (si < 0 || !scens[si]->fn[M_NCFSM]) {
      snprintf(err, errlen, "expect_ncfsm.c: '%s' is not a scenario that runs in ncfsm mode", ne[j].scenario);
      return -1;
    }
  }
  for (int j = 0; j < nk; j++) {
    const known_t *q = &k[j];
    if (find_scen(scens, nscen, q->scenario) < 0) {
      snprintf(err, errlen, "known.c: '%s' is not a scenario", q->scenario);
      return -1;
    }
    if (strcmp(q->mode, "raw") && strcmp(q->mode, "ncfsm")) {
      snprintf(err, errlen, "known.c: %s: mode '%s' is neither raw nor ncfsm", q->scenario, q->mode);
      return -1;
    }
    if (strcmp(q->backend, "nccl") && strcmp(q->backend, "sim") && strcmp(q->backend, "*")) {
      snprintf(err, errlen, "known.c: %s/%s: backend '%s' is not nccl, sim or *", q->scenario, q->mode, q->backend);
      return -1;
    }
    if (strcmp(q->field, "rc") && strcmp(q->field, "async") && strcmp(q->field, "data") && strcmp(q->field, "health")) {
      snprintf(err, errlen, "known.c: %s/%s: field '%s' is not rc, async, data or health", q->scenario, q->mode,
               q->field);
      return -1;
    }
  }
  return 0;
}
