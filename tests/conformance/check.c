/* Consistency of the scenario tables, checked before every run (and by the
 * conformance_tables test): a broken table must stop the suite, not turn a
 * row green. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "conformance.h"

static int complete(const exp_t *e) {
  return e->rc && *e->rc && e->async && *e->async && e->data && *e->data && e->health && *e->health;
}
static int empty(const exp_t *e) { return !e->rc && !e->async && !e->data && !e->health; }

static int find_scen(const scen_t *const *scens, int nscen, const char *id) {
  for (int i = 0; i < nscen; i++)
    if (!strcmp(scens[i]->id, id)) return i;
  return -1;
}

/* Evidence: at least one file, each under docs/, existing below source_dir when given. */
static int check_evidence(const char *const *ev, const char *what, const char *source_dir, char *err,
                          size_t errlen) {
  if (!ev[0] || !*ev[0]) {
    snprintf(err, errlen, "%s names no evidence file", what);
    return -1;
  }
  for (int i = 0; i < 4 && ev[i]; i++) {
    if (strncmp(ev[i], "docs/", 5)) {
      snprintf(err, errlen, "%s: evidence '%s' is not a file under docs/", what, ev[i]);
      return -1;
    }
    if (source_dir) {
      char path[1024];
      struct stat st;
      snprintf(path, sizeof path, "%s/%s", source_dir, ev[i]);
      if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: evidence file %s does not exist", what, path);
        return -1;
      }
    }
  }
  return 0;
}

static int check_scen(const scen_t *s, int nexp, const known_t *k, int nk, const char *source_dir, char *err,
                      size_t errlen) {
  if (s->skip) return 0;
  if (!s->fn[M_RAW] || !s->fn[M_NCFSM]) {
    snprintf(err, errlen, "scenario '%s' lacks its raw or ncfsm code (or a skip reason)", s->id);
    return -1;
  }
  if (nexp != 1) {
    snprintf(err, errlen, "scenario '%s' has %d entries in expect_ncfsm.c (needs 1)", s->id, nexp);
    return -1;
  }
  /* raw: a complete expectation, or none and a complete one for runtimes without Revoke */
  if (!(complete(&s->raw) || (empty(&s->raw) && complete(&s->raw_norevoke))) ||
      !(complete(&s->raw_norevoke) || empty(&s->raw_norevoke))) {
    snprintf(err, errlen, "scenario '%s': the raw expectation has an empty field", s->id);
    return -1;
  }
  const varies_t *v = s->varies;
  if (!v) return 0;
  if (!v->mode || strcmp(v->mode, "raw") || !v->backend || strcmp(v->backend, "nccl")) {
    snprintf(err, errlen,
             "scenario '%s': a varying outcome set for %s on %s: only raw rows on real NCCL may vary (ncfsm and "
             "sim rows must match exactly)",
             s->id, v->mode ? v->mode : "(null)", v->backend ? v->backend : "(null)");
    return -1;
  }
  if (v->n < 1 || !v->outcomes) {
    snprintf(err, errlen, "scenario '%s': a varying outcome set without outcomes", s->id);
    return -1;
  }
  for (int i = 0; i < v->n; i++) {
    const outcome_t *oc = &v->outcomes[i];
    char what[160];
    snprintf(what, sizeof what, "scenario '%s' outcome %d", s->id, i + 1);
    if (!complete(&oc->obs) || !oc->note || !*oc->note) {
      snprintf(err, errlen, "%s: every field and the note must be set", what);
      return -1;
    }
    if (check_evidence(oc->evidence, what, source_dir, err, errlen)) return -1;
  }
  for (int j = 0; j < nk; j++)
    if (!strcmp(k[j].scenario, s->id) && !strcmp(k[j].mode, "raw") && !strcmp(k[j].backend, "nccl")) {
      snprintf(err, errlen, "known.c: %s/raw on nccl has a varying outcome set: list the outcome there instead",
               s->id);
      return -1;
    }
  return 0;
}

int registry_check(const scen_t *const *scens, int nscen, const ncfsm_expect_t *ne, int nne, const known_t *k,
                   int nk, const char *source_dir, char *err, size_t errlen) {
  for (int i = 0; i < nscen; i++) {
    const scen_t *s = scens[i];
    if (find_scen(scens, nscen, s->id) != i) {
      snprintf(err, errlen, "scenario '%s' is listed twice", s->id);
      return -1;
    }
    int nexp = 0;
    for (int j = 0; j < nne; j++) nexp += !strcmp(ne[j].scenario, s->id);
    if (check_scen(s, nexp, k, nk, source_dir, err, errlen)) return -1;
  }
  for (int j = 0; j < nne; j++) {
    int si = find_scen(scens, nscen, ne[j].scenario);
    if (si < 0 || scens[si]->skip) {
      snprintf(err, errlen, "expect_ncfsm.c: '%s' is not a scenario that runs", ne[j].scenario);
      return -1;
    }
    if (!(complete(&ne[j].exp) || (empty(&ne[j].exp) && complete(&ne[j].norevoke))) ||
        !(complete(&ne[j].norevoke) || empty(&ne[j].norevoke)) || !ne[j].depends || !*ne[j].depends) {
      snprintf(err, errlen, "expect_ncfsm.c: '%s' has an empty field or no 'depends' line", ne[j].scenario);
      return -1;
    }
  }
  for (int j = 0; j < nk; j++) {
    const known_t *q = &k[j];
    char what[160];
    snprintf(what, sizeof what, "known.c: %s/%s on %s (%s)", q->scenario, q->mode, q->backend, q->field);
    int si = find_scen(scens, nscen, q->scenario);
    if (si < 0 || scens[si]->skip) {
      snprintf(err, errlen, "%s: not a scenario that runs", what);
      return -1;
    }
    if (strcmp(q->mode, "raw") && strcmp(q->mode, "ncfsm")) {
      snprintf(err, errlen, "%s: the mode is neither raw nor ncfsm", what);
      return -1;
    }
    if (strcmp(q->backend, "nccl") && strcmp(q->backend, "sim")) {
      snprintf(err, errlen, "%s: the backend must be nccl or sim (one entry per backend it documents)", what);
      return -1;
    }
    if (!strcmp(q->mode, "ncfsm") && strcmp(q->backend, "sim")) {
      snprintf(err, errlen,
               "%s: an ncfsm row on real NCCL cannot be a known difference (ncfsm's own behaviour must match its "
               "expectation; only the sim may differ by design)",
               what);
      return -1;
    }
    if (strcmp(q->field, "rc") && strcmp(q->field, "async") && strcmp(q->field, "data") && strcmp(q->field, "health")) {
      snprintf(err, errlen, "%s: the field is not rc, async, data or health", what);
      return -1;
    }
    if (!q->observed || !*q->observed || !q->reason || !*q->reason) {
      snprintf(err, errlen, "%s: no observation or no reason", what);
      return -1;
    }
    if (check_evidence(q->evidence, what, source_dir, err, errlen)) return -1;
  }
  return 0;
}
