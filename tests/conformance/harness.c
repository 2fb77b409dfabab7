/* The harness of ncfsm-conformance: options, the runner (each scenario on a
 * fresh pthread, with a hang guard), the evaluation of an observation
 * against its expectation, and --recheck of a recorded run.
 *
 * Exit: 0 all pass (or known), 1 a difference, 2 usage/hang/bad registry,
 * 77 the nccl backend is unusable or fewer than 2 devices are visible (CTest
 * SKIP). */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conformance.h"

/* Alternatives separated by " OR ". */
static int field_match(const char *exp, const char *got) {
  if (!exp || !*exp) return 1; /* not compared */
  const char *p = exp;
  for (;;) {
    const char *q = strstr(p, " OR ");
    size_t n = q ? (size_t)(q - p) : strlen(p);
    if (strlen(got) == n && !strncmp(p, got, n)) return 1;
    if (!q) return 0;
    p = q + 4;
  }
}

typedef struct job {
  ctx_t *x;
  scen_fn fn;
  obs_t *o;
  volatile int done;
} job_t;

static void *job_main(void *a) {
  job_t *j = a;
  j->fn(j->x, j->o);
  j->done = 1;
  return NULL;
}

static void usage(void) {
  fprintf(stderr, "usage: ncfsm-conformance [--backend nccl|sim] [--mode raw|ncfsm|all] [--json FILE] "
                  "[--md FILE] [--only ID] [--timeout-s N]\n"
                  "       ncfsm-conformance [--md FILE] [--json FILE] --recheck RESULTS.json   (re-evaluate an "
                  "earlier run)\n");
}

/* Compare an observation with the scenario's expectation: 0 pass, 1 known difference, 2 fail. */
static int evaluate(const ctx_t *xp, unsigned features, const scen_t *s, int m, result_t *r) {
  const exp_t *e = scen_expectation(s, m, features);
  static const exp_t none = {0};
  if (!e) e = &none;
  const char *fname[4] = {"rc", "async", "data", "health"};
  const char *got[4] = {r->o.rc, r->o.async, r->o.data, r->o.health};
  const char *want[4] = {e->rc, e->async, e->data, e->health};
  int fail = 0, known = 0;
  r->why[0] = '\0';
  for (int f = 0; f < 4; f++) {
    if (field_match(want[f], got[f])) continue;
    const known_t *k = NULL;
    for (int ki = 0; ki < nknowns && !k; ki++)
      if (!strcmp(knowns[ki].scenario, s->id) && !strcmp(knowns[ki].mode, mode_name[m]) &&
          (!strcmp(knowns[ki].backend, "*") || !strcmp(knowns[ki].backend, xp->bname)) &&
          !strcmp(knowns[ki].field, fname[f]) && !strcmp(knowns[ki].observed, got[f]))
        k = &knowns[ki];
    size_t n = strlen(r->why);
    if (k) {
      known++;
      snprintf(r->why + n, sizeof r->why - n, "%s%s: known difference: %s", n ? "; " : "", fname[f], k->reason);
    } else {
      fail++;
      snprintf(r->why + n, sizeof r->why - n, "%s%s: expected [%s] got [%s]", n ? "; " : "", fname[f], want[f],
               got[f]);
    }
  }
  r->verdict = fail ? "FAIL" : known ? "KNOWN" : "PASS";
  return fail ? 2 : known ? 1 : 0;
}

/* --recheck: the observations of an earlier run (its --json) against the current expectations. */
static int recheck(const char *file, const char *md, const char *json_out) {
  json_error_t err;
  json_t *root = json_load_file(file, 0, &err);
  if (!root) {
    fprintf(stderr, "%s: %s (line %d)\n", file, err.text, err.line);
    return 2;
  }
  ctx_t x;
  memset(&x, 0, sizeof x);
  static char bname[16];
  snprintf(bname, sizeof bname, "%s", json_string_value(json_object_get(root, "backend")) ?: "?");
  x.bname = bname;
  x.is_sim = !strcmp(bname, "sim");
  x.version = (int)json_integer_value(json_object_get(root, "nccl_version"));
  x.features = (unsigned)json_integer_value(json_object_get(root, "features"));
  json_t *arr = json_object_get(root, "results");
  result_t *res = calloc((size_t)nscenarios * M_COUNT, sizeof *res);
  int nres = 0;
  totals_t t = {0};
  printf("# recheck of %s: backend %s, NCCL %d, features 0x%x\n", file, bname, x.version, x.features);
  for (int si = 0; si < nscenarios; si++) {
    const scen_t *s = scenarios[si];
    for (int m = 0; m < M_COUNT; m++) {
      json_t *hit = NULL, *it;
      size_t i;
      json_array_foreach(arr, i, it) {
        const char *sc = json_string_value(json_object_get(it, "scenario"));
        const char *mo = json_string_value(json_object_get(it, "mode"));
        if (sc && mo && !strcmp(sc, s->id) && !strcmp(mo, mode_name[m])) hit = it;
      }
      result_t *r = &res[nres++];
      r->s = s;
      r->mode = m;
#define JS(field, key) \
  snprintf(r->o.field, sizeof r->o.field, "%s", hit ? json_string_value(json_object_get(hit, key)) ?: "" : "")
      JS(rc, "rc");
      JS(async, "async");
      JS(data, "data");
      JS(health, "health");
      JS(info, "info");
#undef JS
      json_t *jr = hit ? json_object_get(hit, "rev") : NULL;
      r->rev = jr ? (int)json_integer_value(jr) : 1;
      const char *jv = hit ? json_string_value(json_object_get(hit, "verdict")) : NULL;
      if (!hit) {
        r->verdict = "NOT-RUN";
        snprintf(r->why, sizeof r->why, "not in this run (added later): run it on a GPU");
      } else if (jv && !strcmp(jv, "SKIP")) {
        r->verdict = "SKIP";
        snprintf(r->why, sizeof r->why, "%s", json_string_value(json_object_get(hit, "why")) ?: "");
      } else if (r->rev != scen_rev(s, m)) {
        r->verdict = "STALE";
        snprintf(r->why, sizeof r->why, "this run measured revision %d of the scenario, the code is revision %d: "
                 "re-run on a GPU (observed then: %s | %s | %s | %s)", r->rev, scen_rev(s, m), r->o.rc, r->o.async,
                 r->o.data, r->o.health);
      } else {
        evaluate(&x, x.features, s, m, r);
      }
      totals_add(&t, r->verdict);
      printf("%-7s %-32s %-5s | %s | %s | %s | %s\n", r->verdict, s->id, mode_name[m], r->o.rc, r->o.async,
             r->o.data, r->o.health);
      if (strcmp(r->verdict, "PASS")) printf("        %s\n", r->why);
    }
  }
  emit(&x, res, nres, &t, md, json_out);
  free(res);
  json_decref(root);
  return t.fail ? 1 : 0;
}

int main(int argc, char **argv) {
  const char *backend = "sim", *mode = "all", *json = NULL, *md = NULL, *only = NULL, *rfile = NULL;
  int timeout_s = 45;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--backend") && v) backend = v, i++;
    else if (!strcmp(a, "--mode") && v) mode = v, i++;
    else if (!strcmp(a, "--json") && v) json = v, i++;
    else if (!strcmp(a, "--md") && v) md = v, i++;
    else if (!strcmp(a, "--only") && v) only = v, i++;
    else if (!strcmp(a, "--timeout-s") && v) timeout_s = atoi(v), i++;
    else if (!strcmp(a, "--recheck") && v) rfile = v, i++;
    else { usage(); return 2; }
  }
  char rerr[512];
  if (registry_check(scenarios, nscenarios, ncfsm_expectations, ncfsm_nexpectations, knowns, nknowns, rerr,
                     sizeof rerr)) {
    fprintf(stderr, "ncfsm-conformance: the scenario tables are inconsistent: %s\n", rerr);
    return 2;
  }
  if (rfile) return recheck(rfile, md, json);
  ctx_t x;
  memset(&x, 0, sizeof x);
  if (!strcmp(backend, "sim")) x.kind = NCFSM_BACKEND_SIM;
  else if (!strcmp(backend, "nccl")) x.kind = NCFSM_BACKEND_NCCL;
  else { usage(); return 2; }
  int mlo, mhi;
  if (!strcmp(mode, "raw")) mlo = mhi = M_RAW;
  else if (!strcmp(mode, "ncfsm")) mlo = mhi = M_NCFSM;
  else if (!strcmp(mode, "all")) mlo = M_RAW, mhi = M_NCFSM;
  else { usage(); return 2; }

  char why[512];
  x.be = ncfsm__backend_get(x.kind, why, sizeof why);
  if (!x.be) {
    printf("SKIP: the %s backend is not usable here: %s\n", backend, why);
    return 77;
  }
  x.is_sim = x.kind == NCFSM_BACKEND_SIM;
  x.bname = x.be->name;
  if (!x.is_sim && x.be->device_count() < NR) {
    printf("SKIP: %d CUDA device(s) visible; the suite drives %d ranks on %d GPUs\n", x.be->device_count(), NR, NR);
    return 77;
  }
  x.version = x.be->version();
  x.features = x.be->features();
  x.timeout_ms = x.is_sim ? 5000 : 15000;
  ncfsm_sim_opts base_so;
  ncfsm_sim_opts_init(&base_so);
  const char *env_v = getenv("NCFSM_SIM_NCCL_VERSION");
  char *saved_env = env_v ? strdup(env_v) : NULL;

  result_t *res = calloc((size_t)nscenarios * M_COUNT, sizeof *res);
  int nres = 0;
  totals_t t = {0};
  printf("# ncfsm conformance: backend %s, NCCL %d.%d.%d, features 0x%x\n", x.be->name, x.version / 10000,
         (x.version / 100) % 100, x.version % 100, x.features);
  for (int si = 0; si < nscenarios; si++) {
    const scen_t *s = scenarios[si];
    if (only && strcmp(only, s->id)) continue;
    for (int m = mlo; m <= mhi; m++) {
      result_t *r = &res[nres++];
      r->s = s;
      r->mode = m;
      r->rev = scen_rev(s, m);
      if (s->skip || (s->sim_only && !x.is_sim)) {
        r->verdict = "SKIP";
        snprintf(r->why, sizeof r->why, "%s", s->skip ? s->skip : "sim only (the nccl runtime decides: see 'revoke')");
        snprintf(r->o.rc, sizeof r->o.rc, "skipped");
        totals_add(&t, r->verdict);
        printf("SKIP %-28s %-5s %s\n", s->id, mode_name[m], r->why);
        continue;
      }
      x.so = base_so;
      if (s->sim_has_revoke >= 0) x.so.has_revoke = s->sim_has_revoke;
      if (s->sim_launch_polls > 0 && m == M_NCFSM) x.so.launch_polls = s->sim_launch_polls;
      if (x.is_sim && s->sim_version > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", s->sim_version);
        setenv("NCFSM_SIM_NCCL_VERSION", v, 1); /* process-wide; read at each call (docs/sim.md) */
      }
      unsigned saved_features = x.features;
      x.features = x.be->features();
      if (x.is_sim && !x.so.has_revoke) x.features &= ~(unsigned)NCFSM__HAS_REVOKE;
      unsigned features_now = x.features;
      job_t j = {&x, s->fn[m], &r->o, 0};
      pthread_t th;
      double t0 = now_ms();
      pthread_create(&th, NULL, job_main, &j); /* fresh thread: NCCL group state is thread-local (R4) */
      while (!j.done && now_ms() - t0 < timeout_s * 1000.0) usleep(1000);
      r->ms = now_ms() - t0;
      if (!j.done) { /* the scenario thread is stuck inside a backend call: report what we have */
        printf("HANG  %-28s %-5s no result after %d s; stopping the run\n", s->id, mode_name[m], timeout_s);
        r->verdict = "FAIL";
        snprintf(r->why, sizeof r->why, "hang: no result after %d s (partial observation: %s | %s)", timeout_s,
                 r->o.rc, r->o.info);
        totals_add(&t, r->verdict);
        emit(&x, res, nres, &t, md, json);
        fflush(stdout);
        _exit(1);
      }
      pthread_join(th, NULL);
      if (x.is_sim && s->sim_version > 0) {
        if (saved_env) setenv("NCFSM_SIM_NCCL_VERSION", saved_env, 1);
        else unsetenv("NCFSM_SIM_NCCL_VERSION");
      }
      x.features = saved_features;
      int v = evaluate(&x, features_now, s, m, r);
      totals_add(&t, r->verdict);
      printf("%-5s %-28s %-5s %7.1f ms | %s | %s | %s | %s\n", r->verdict, s->id, mode_name[m], r->ms, r->o.rc,
             r->o.async, r->o.data, r->o.health);
      if (v) printf("      %s\n", r->why);
      fflush(stdout);
    }
  }
  emit(&x, res, nres, &t, md, json);
  free(res);
  free(saved_env);
  return t.fail ? 1 : 0;
}
