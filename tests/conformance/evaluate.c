/* One observation against its expectation.
 *
 *   PASS    the four fields equal the expectation
 *   VARIES  raw on nccl only: the whole observation equals one of the
 *           outcomes the scenario lists as observed on real NCCL
 *   KNOWN   every differing field is a known difference (known.c) for this
 *           scenario, mode and backend, with exactly this value
 *   FAIL    anything else, including a scenario without an expectation for
 *           this runtime */
#include <stdio.h>
#include <string.h>

#include "conformance.h"

const char *const mode_name[M_COUNT] = {"raw", "ncfsm"};

const ncfsm_expect_t *ncfsm_expectation_of(const char *scenario) {
  for (int i = 0; i < ncfsm_nexpectations; i++)
    if (!strcmp(ncfsm_expectations[i].scenario, scenario)) return &ncfsm_expectations[i];
  return NULL;
}

const exp_t *scen_expectation(const scen_t *s, int m, unsigned features) {
  int norevoke = !(features & NCFSM__HAS_REVOKE);
  const exp_t *e, *nr;
  if (m == M_RAW) {
    e = &s->raw, nr = &s->raw_norevoke;
  } else {
    const ncfsm_expect_t *ne = ncfsm_expectation_of(s->id);
    if (!ne) return NULL;
    e = &ne->exp, nr = &ne->norevoke;
  }
  if (norevoke && nr->rc) return nr;
  return e->rc ? e : NULL;
}

unsigned scen_features_fallback(const scen_t *s, int is_sim, unsigned run_features) {
  if (is_sim && (s->sim_has_revoke == 0 || (s->sim_version > 0 && s->sim_version < 22807)))
    return run_features & ~(unsigned)NCFSM__HAS_REVOKE; /* core/sim/sim.c: Revoke from 2.28.7, per-comm knob */
  return run_features;
}

static const char *const fname[4] = {"rc", "async", "data", "health"};

static int same(const char *want, const char *got) { return want && !strcmp(want, got); }

/* "a, b" from a NULL-padded list of files */
static const char *files(const char *const *ev, char *buf, size_t len) {
  buf[0] = '\0';
  for (int i = 0; i < 4 && ev[i]; i++) {
    size_t n = strlen(buf);
    snprintf(buf + n, len - n, "%s%s", i ? ", " : "", ev[i]);
  }
  return buf;
}

int evaluate(const char *backend, unsigned features, const scen_t *s, int m, result_t *r) {
  const char *got[4] = {r->o.rc, r->o.async, r->o.data, r->o.health};
  char ev[400];
  size_t n;
  r->why[0] = '\0';
  const exp_t *e = scen_expectation(s, m, features);
  if (!e) {
    r->verdict = "FAIL";
    snprintf(r->why, sizeof r->why, "no %s expectation for a runtime %s Revoke (features 0x%x): got [%s | %s | %s | %s]",
             mode_name[m], features & NCFSM__HAS_REVOKE ? "with" : "without", features, got[0], got[1], got[2],
             got[3]);
    return 3;
  }
  const char *want[4] = {e->rc, e->async, e->data, e->health};
  int differ[4], ndiff = 0;
  for (int f = 0; f < 4; f++) ndiff += differ[f] = !same(want[f], got[f]);
  if (!ndiff) {
    r->verdict = "PASS";
    return 0;
  }

  /* A raw row on real NCCL whose outcome varies: the whole observation must be one seen before. */
  const varies_t *v = s->varies;
  if (v && m == M_RAW && !strcmp(v->mode, "raw") && !strcmp(v->backend, "nccl") && !strcmp(backend, "nccl")) {
    for (int k = 0; k < v->n; k++) {
      const exp_t *ob = &v->outcomes[k].obs;
      if (same(ob->rc, got[0]) && same(ob->async, got[1]) && same(ob->data, got[2]) && same(ob->health, got[3])) {
        r->verdict = "VARIES";
        snprintf(r->why, sizeof r->why, "observed outcome %d of %d on real NCCL: %s (%s)", k + 1, v->n,
                 v->outcomes[k].note, files(v->outcomes[k].evidence, ev, sizeof ev));
        return 2;
      }
    }
    for (int f = 0; f < 4; f++) {
      if (!differ[f]) continue;
      n = strlen(r->why);
      snprintf(r->why + n, sizeof r->why - n, "%s%s: expected [%s] got [%s]", n ? "; " : "", fname[f], want[f],
               got[f]);
    }
    n = strlen(r->why);
    snprintf(r->why + n, sizeof r->why - n, "; and none of the %d outcomes observed on real NCCL", v->n);
    r->verdict = "FAIL";
    return 3;
  }

  int fail = 0;
  for (int f = 0; f < 4; f++) {
    if (!differ[f]) continue;
    const known_t *k = NULL;
    for (int ki = 0; ki < nknowns && !k; ki++)
      if (!strcmp(knowns[ki].scenario, s->id) && !strcmp(knowns[ki].mode, mode_name[m]) &&
          !strcmp(knowns[ki].backend, backend) && !strcmp(knowns[ki].field, fname[f]) &&
          !strcmp(knowns[ki].observed, got[f]))
        k = &knowns[ki];
    n = strlen(r->why);
    if (k) {
      snprintf(r->why + n, sizeof r->why - n, "%s%s: known difference: %s (%s)", n ? "; " : "", fname[f], k->reason,
               files(k->evidence, ev, sizeof ev));
    } else {
      fail++;
      snprintf(r->why + n, sizeof r->why - n, "%s%s: expected [%s] got [%s]", n ? "; " : "", fname[f], want[f],
               got[f]);
    }
  }
  r->verdict = fail ? "FAIL" : "KNOWN";
  return fail ? 3 : 1;
}

void totals_add(totals_t *t, const char *verdict) {
  if (!strcmp(verdict, "PASS")) t->pass++;
  else if (!strcmp(verdict, "KNOWN")) t->known++;
  else if (!strcmp(verdict, "VARIES")) t->varies++;
  else if (!strcmp(verdict, "FAIL")) t->fail++;
  else t->skip++; /* SKIP, STALE, NOT-RUN */
}
