/* The harness of ncfsm-conformance: options, and the runner (each scenario
 * on a fresh pthread, with a hang guard; its observation evaluated by
 * evaluate.c). Recorded runs: table.c.
 *
 * Exit: 0 nothing failed (PASS, KNOWN, VARIES, SKIP), 1 a FAIL (or a hang),
 * 2 usage or inconsistent tables, 77 the nccl backend is unusable or fewer
 * than 2 devices are visible (CTest SKIP). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conformance.h"

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
  fprintf(stderr,
          "usage: ncfsm-conformance [--backend nccl|sim] [--mode raw|ncfsm|all] [--json FILE] [--md FILE]\n"
          "                         [--only ID] [--timeout-s N]\n"
          "       ncfsm-conformance [--md FILE] [--json FILE] --recheck RESULTS.json\n"
          "             re-evaluate a recorded run (its --json) against the current expectations\n"
          "       ncfsm-conformance --table LABEL=RESULTS.json [LABEL=RESULTS.json ...]\n"
          "             one Markdown table over recorded runs (docs/conformance.md)\n"
          "       ncfsm-conformance --check-registry [--source-dir DIR]\n"
          "             check the scenario tables (and that every evidence file exists below DIR)\n"
          "       ncfsm-conformance --list\n"
          "             the scenarios, and the engine behaviour each ncfsm expectation depends on\n");
}

static void list(void) {
  for (int si = 0; si < nscenarios; si++) {
    const scen_t *s = scenarios[si];
    printf("%-34s %-4s %s\n", s->id, s->rule, s->title);
    if (s->skip) {
      printf("    skipped: %s\n", s->skip);
      continue;
    }
    if (s->varies) printf("    raw on nccl varies: %d observed outcomes accepted\n", s->varies->n);
    const ncfsm_expect_t *e = ncfsm_expectation_of(s->id);
    if (e) printf("    ncfsm depends on: %s\n", e->depends);
  }
}

int main(int argc, char **argv) {
  const char *backend = "sim", *mode = "all", *json = NULL, *md = NULL, *only = NULL, *rfile = NULL;
  const char *source_dir = NULL;
  int timeout_s = 45, check_only = 0, do_list = 0, table_at = 0;
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
    else if (!strcmp(a, "--source-dir") && v) source_dir = v, i++;
    else if (!strcmp(a, "--check-registry")) check_only = 1;
    else if (!strcmp(a, "--list")) do_list = 1;
    else if (!strcmp(a, "--table") && v) { table_at = i + 1; break; }
    else { usage(); return 2; }
  }
  char rerr[512];
  if (registry_check(scenarios, nscenarios, ncfsm_expectations, ncfsm_nexpectations, knowns, nknowns, source_dir,
                     rerr, sizeof rerr)) {
    fprintf(stderr, "ncfsm-conformance: the scenario tables are inconsistent: %s\n", rerr);
    return 2;
  }
  if (check_only) {
    printf("scenario tables consistent: %d scenarios, %d ncfsm expectations, %d known differences%s\n", nscenarios,
           ncfsm_nexpectations, nknowns, source_dir ? ", every evidence file present" : "");
    return 0;
  }
  if (do_list) {
    list();
    return 0;
  }
  if (table_at) return table(argc - table_at, argv + table_at, stdout);
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
  if (ncfsm_sim_opts_init(&base_so) != NCFSM_OK) {
    fprintf(stderr, "ncfsm_sim_opts_init: %s\n", ncfsm_opts_error());
    return 2;
  }
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
      r->features = x.features;
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
      r->features = features_now;
      int v = evaluate(x.bname, features_now, s, m, r);
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
