/* Recorded runs (the --json of earlier runs, e.g. docs/results/conformance-*.json)
 * against the current expectations:
 *
 *   --recheck FILE            one run, as a report (Markdown/JSON like a run)
 *   --table LABEL=FILE ...    one Markdown table over several runs, one column
 *                             per run: the table of docs/conformance.md
 *
 * A recorded row of another scenario revision is STALE, a scenario missing
 * from the file NOT-RUN, both counted with the skipped rows. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

typedef struct run {
  char label[64];
  char file[512];
  char bname[16];
  int version;
  unsigned features;
  totals_t recorded; /* the totals the run itself wrote */
  int recorded_varies; /* the file has a "varies" count */
  totals_t now;      /* re-evaluated with the current expectations */
  result_t *res;     /* nscenarios * M_COUNT, in registry order */
} run_t;

static int load_run(const char *file, run_t *run) {
  json_error_t err;
  json_t *root = json_load_file(file, 0, &err);
  if (!root) {
    fprintf(stderr, "%s: %s (line %d)\n", file, err.text, err.line);
    return -1;
  }
  snprintf(run->file, sizeof run->file, "%s", file);
  snprintf(run->bname, sizeof run->bname, "%s", json_string_value(json_object_get(root, "backend")) ?: "?");
  run->version = (int)json_integer_value(json_object_get(root, "nccl_version"));
  run->features = (unsigned)json_integer_value(json_object_get(root, "features"));
  run->recorded.pass = (int)json_integer_value(json_object_get(root, "pass"));
  run->recorded.known = (int)json_integer_value(json_object_get(root, "known"));
  run->recorded.varies = (int)json_integer_value(json_object_get(root, "varies"));
  run->recorded_varies = json_object_get(root, "varies") != NULL;
  run->recorded.fail = (int)json_integer_value(json_object_get(root, "fail"));
  run->recorded.skip = (int)json_integer_value(json_object_get(root, "skip"));
  memset(&run->now, 0, sizeof run->now);
  run->res = calloc((size_t)nscenarios * M_COUNT, sizeof *run->res);
  json_t *arr = json_object_get(root, "results");
  int nres = 0;
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
      result_t *r = &run->res[nres++];
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
      r->ms = hit ? json_real_value(json_object_get(hit, "ms")) : 0;
      json_t *jf = hit ? json_object_get(hit, "features") : NULL;
      r->features = jf ? (unsigned)json_integer_value(jf)
                       : scen_features_fallback(s, !strcmp(run->bname, "sim"), run->features);
      const char *jv = hit ? json_string_value(json_object_get(hit, "verdict")) : NULL;
      if (!hit) {
        r->verdict = "NOT-RUN";
        snprintf(r->why, sizeof r->why, "not in this run (added later): run it on a GPU");
      } else if (jv && !strcmp(jv, "SKIP")) {
        r->verdict = "SKIP";
        snprintf(r->why, sizeof r->why, "%s", json_string_value(json_object_get(hit, "why")) ?: "");
      } else if (r->rev != scen_rev(s, m)) {
        r->verdict = "STALE";
        snprintf(r->why, sizeof r->why,
                 "this run measured revision %d of the scenario, the code is revision %d: "
                 "re-run on a GPU (observed then: %s | %s | %s | %s)",
                 r->rev, scen_rev(s, m), r->o.rc, r->o.async, r->o.data, r->o.health);
      } else {
        evaluate(run->bname, r->features, s, m, r);
      }
      totals_add(&run->now, r->verdict);
    }
  }
  json_decref(root);
  return 0;
}

int recheck(const char *file, const char *md, const char *json_out) {
  run_t run;
  memset(&run, 0, sizeof run);
  if (load_run(file, &run)) return 2;
  ctx_t x;
  memset(&x, 0, sizeof x);
  x.bname = run.bname;
  x.is_sim = !strcmp(run.bname, "sim");
  x.version = run.version;
  x.features = run.features;
  printf("# recheck of %s: backend %s, NCCL %d, features 0x%x\n", file, run.bname, run.version, run.features);
  int nres = nscenarios * M_COUNT;
  for (int i = 0; i < nres; i++) {
    const result_t *r = &run.res[i];
    printf("%-7s %-32s %-5s | %s | %s | %s | %s\n", r->verdict, r->s->id, mode_name[r->mode], r->o.rc, r->o.async,
           r->o.data, r->o.health);
    if (strcmp(r->verdict, "PASS")) printf("        %s\n", r->why);
  }
  emit(&x, run.res, nres, &run.now, md, json_out);
  free(run.res);
  return run.now.fail ? 1 : 0;
}

static void totals_md(FILE *f, const totals_t *t, int with_varies) {
  fprintf(f, "%d pass, %d known", t->pass, t->known);
  if (with_varies) fprintf(f, ", %d varies", t->varies);
  fprintf(f, ", %d fail, %d skipped", t->fail, t->skip);
}

/* The labels of the runs whose sel[i] is set: "a, b" */
static void labels(const run_t *runs, const int *sel, int n, char *buf, size_t len) {
  buf[0] = '\0';
  for (int i = 0; i < n; i++) {
    if (!sel[i]) continue;
    size_t k = strlen(buf);
    snprintf(buf + k, len - k, "%s%s", k ? ", " : "", runs[i].label);
  }
}

static int same_obs(const result_t *a, const result_t *b) {
  return !strcmp(a->o.rc, b->o.rc) && !strcmp(a->o.async, b->o.async) && !strcmp(a->o.data, b->o.data) &&
         !strcmp(a->o.health, b->o.health);
}

int table(int nfiles, char **args, FILE *out) {
  run_t *runs = calloc((size_t)nfiles, sizeof *runs);
  int rc = 0;
  for (int i = 0; i < nfiles; i++) {
    const char *eq = strchr(args[i], '=');
    if (!eq || eq == args[i] || (size_t)(eq - args[i]) >= sizeof runs[i].label) {
      fprintf(stderr, "--table: '%s' is not LABEL=FILE.json\n", args[i]);
      rc = 2;
      goto out;
    }
    snprintf(runs[i].label, sizeof runs[i].label, "%.*s", (int)(eq - args[i]), args[i]);
    if (load_run(eq + 1, &runs[i])) {
      rc = 2;
      goto out;
    }
  }
  int nres = nscenarios * M_COUNT;
  char buf[512];
  int *sel = calloc((size_t)nfiles, sizeof *sel);

  fprintf(out, "Columns (each a recorded run, re-evaluated with the expectations as committed):\n\n");
  fprintf(out, "| column | results file | backend | NCCL | totals written by the run | totals now |\n");
  fprintf(out, "|---|---|---|---|---|---|\n");
  for (int i = 0; i < nfiles; i++) {
    run_t *r = &runs[i];
    fprintf(out, "| %s | `%s` | %s | %d (%s, features 0x%x) | ", r->label, r->file, r->bname, r->version,
            strcmp(r->bname, "sim") ? "runtime" : "modelled", r->features);
    totals_md(out, &r->recorded, r->recorded_varies);
    fputs(" | ", out);
    totals_md(out, &r->now, 1);
    fputs(" |\n", out);
  }

  fprintf(out, "\n| scenario | rule | mode |");
  for (int i = 0; i < nfiles; i++) fprintf(out, " %s |", runs[i].label);
  fprintf(out, "\n|---|---|---|");
  for (int i = 0; i < nfiles; i++) fputs("---|", out);
  fputs("\n", out);
  for (int k = 0; k < nres; k++) {
    const result_t *r0 = &runs[0].res[k];
    fprintf(out, "| %s | %s | %s |", r0->s->id, r0->s->rule, mode_name[r0->mode]);
    for (int i = 0; i < nfiles; i++) fprintf(out, " %s |", runs[i].res[k].verdict);
    fputs("\n", out);
  }
  fputs("| **total** | | |", out);
  for (int i = 0; i < nfiles; i++) {
    fputs(" ", out);
    totals_md(out, &runs[i].now, 1);
    fputs(" |", out);
  }
  fputs("\n", out);

  /* What was observed: each distinct observation once, with the columns that saw it. */
  fprintf(out, "\nObserved (return codes / async / data / health), skipped rows left out:\n\n");
  for (int k = 0; k < nres; k++) {
    for (int i = 0; i < nfiles; i++) {
      const result_t *r = &runs[i].res[k];
      if (!strcmp(r->verdict, "SKIP") || !strcmp(r->verdict, "NOT-RUN")) continue;
      int first = 1;
      for (int j = 0; j < i && first; j++)
        if (strcmp(runs[j].res[k].verdict, "SKIP") && strcmp(runs[j].res[k].verdict, "NOT-RUN") &&
            same_obs(&runs[j].res[k], r))
          first = 0;
      if (!first) continue;
      for (int j = 0; j < nfiles; j++)
        sel[j] = strcmp(runs[j].res[k].verdict, "SKIP") && strcmp(runs[j].res[k].verdict, "NOT-RUN") &&
                 same_obs(&runs[j].res[k], r);
      labels(runs, sel, nfiles, buf, sizeof buf);
      fprintf(out, "- `%s/%s` (%s): %s / %s / %s / %s\n", r->s->id, mode_name[r->mode], buf, r->o.rc, r->o.async,
              r->o.data, r->o.health);
    }
  }

  /* Why a row is not PASS: each distinct reason once, with its columns. */
  fprintf(out, "\nWhy a row is not PASS:\n\n");
  for (int k = 0; k < nres; k++) {
    for (int i = 0; i < nfiles; i++) {
      const result_t *r = &runs[i].res[k];
      if (!strcmp(r->verdict, "PASS")) continue;
      int first = 1;
      for (int j = 0; j < i && first; j++)
        if (!strcmp(runs[j].res[k].verdict, r->verdict) && !strcmp(runs[j].res[k].why, r->why)) first = 0;
      if (!first) continue;
      for (int j = 0; j < nfiles; j++)
        sel[j] = !strcmp(runs[j].res[k].verdict, r->verdict) && !strcmp(runs[j].res[k].why, r->why);
      labels(runs, sel, nfiles, buf, sizeof buf);
      fprintf(out, "- `%s/%s` %s (%s): %s\n", r->s->id, mode_name[r->mode], r->verdict, buf, r->why);
    }
  }

  /* Measured: the free-form info of each row, per column. */
  fprintf(out, "\nMeasured (each run's own words; the sim has no device time):\n\n");
  for (int k = 0; k < nres; k++) {
    int any = 0;
    for (int i = 0; i < nfiles; i++) any |= runs[i].res[k].o.info[0] != '\0';
    if (!any) continue;
    const result_t *r0 = &runs[0].res[k];
    fprintf(out, "- `%s/%s`:", r0->s->id, mode_name[r0->mode]);
    for (int i = 0, n = 0; i < nfiles; i++) {
      if (!runs[i].res[k].o.info[0]) continue;
      fprintf(out, "%s %s: %s", n++ ? ";" : "", runs[i].label, runs[i].res[k].o.info);
    }
    fputs("\n", out);
  }
  free(sel);
  for (int i = 0; i < nfiles; i++) rc |= runs[i].now.fail ? 1 : 0;
out:
  for (int i = 0; i < nfiles; i++) free(runs[i].res);
  free(runs);
  return rc;
}
