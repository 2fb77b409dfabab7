/* Output of a run (or of a --recheck): the Markdown report (stdout and
 * --md) and the JSON observations (--json, jansson). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "conformance.h"

void md_escape(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '|') fputs("\\|", f);
    else fputc(*s, f);
  }
}

void write_md(FILE *f, const ctx_t *x, const result_t *res, int nres, const totals_t *t) {
  fprintf(f, "## ncfsm conformance: backend %s, NCCL %d (%s), features 0x%x\n\n", x->bname, x->version,
          x->is_sim ? "modelled" : "runtime", x->features);
  fprintf(f, "| scenario | rule | mode | return codes | async | data | health | verdict |\n");
  fprintf(f, "|---|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < nres; i++) {
    const result_t *r = &res[i];
    fprintf(f, "| %s | %s | %s | ", r->s->id, r->s->rule, r->mode < 0 ? "-" : mode_name[r->mode]);
    md_escape(f, r->o.rc);
    fputs(" | ", f);
    md_escape(f, r->o.async);
    fputs(" | ", f);
    md_escape(f, r->o.data);
    fputs(" | ", f);
    md_escape(f, r->o.health);
    fprintf(f, " | %s |\n", r->verdict);
  }
  fprintf(f, "\n%d pass, %d known differences, %d varies, %d fail, %d skipped\n", t->pass, t->known, t->varies,
          t->fail, t->skip);
  for (int i = 0; i < nres; i++) {
    const result_t *r = &res[i];
    if (r->o.info[0]) fprintf(f, "\n- info %s/%s: %s", r->s->id, r->mode < 0 ? "-" : mode_name[r->mode], r->o.info);
  }
  fputs("\n", f);
  for (int i = 0; i < nres; i++) {
    const result_t *r = &res[i];
    if (!strcmp(r->verdict, "PASS")) continue;
    fprintf(f, "\n- %s %s/%s: %s", r->verdict, r->s->id, r->mode < 0 ? "-" : mode_name[r->mode], r->why);
  }
  fputs("\n", f);
}

void emit(const ctx_t *x, const result_t *res, int nres, const totals_t *t, const char *md, const char *json) {
  printf("\n");
  write_md(stdout, x, res, nres, t);
  if (md) {
    FILE *f = fopen(md, "w");
    if (f) write_md(f, x, res, nres, t), fclose(f);
    else fprintf(stderr, "cannot write %s: %s\n", md, strerror(errno));
  }
  if (json) {
    json_t *root = json_object(), *arr = json_array();
    json_object_set_new(root, "backend", json_string(x->bname));
    json_object_set_new(root, "nccl_version", json_integer(x->version));
    json_object_set_new(root, "features", json_integer(x->features));
    json_object_set_new(root, "pass", json_integer(t->pass));
    json_object_set_new(root, "known", json_integer(t->known));
    json_object_set_new(root, "varies", json_integer(t->varies));
    json_object_set_new(root, "fail", json_integer(t->fail));
    json_object_set_new(root, "skip", json_integer(t->skip));
    for (int i = 0; i < nres; i++) {
      const result_t *r = &res[i];
      json_t *o = json_object();
      json_object_set_new(o, "scenario", json_string(r->s->id));
      json_object_set_new(o, "rule", json_string(r->s->rule));
      json_object_set_new(o, "title", json_string(r->s->title));
      json_object_set_new(o, "mode", json_string(mode_name[r->mode]));
      json_object_set_new(o, "rc", json_string(r->o.rc));
      json_object_set_new(o, "async", json_string(r->o.async));
      json_object_set_new(o, "data", json_string(r->o.data));
      json_object_set_new(o, "health", json_string(r->o.health));
      json_object_set_new(o, "info", json_string(r->o.info));
      json_object_set_new(o, "verdict", json_string(r->verdict));
      json_object_set_new(o, "why", json_string(r->why));
      json_object_set_new(o, "ms", json_real(r->ms));
      json_object_set_new(o, "rev", json_integer(r->rev));
      json_object_set_new(o, "features", json_integer(r->features));
      json_array_append_new(arr, o);
    }
    json_object_set_new(root, "results", arr);
    if (json_dump_file(root, json, JSON_INDENT(1)) != 0) fprintf(stderr, "cannot write %s\n", json);
    json_decref(root);
  }
}
