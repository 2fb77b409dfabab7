/*
 * ncfsm-trace: what is wrong at one seq of the collective walk (check.h):
 * the fingerprints differ, some ranks never launched it, it failed, or it
 * completed on some ranks only. check_coll.c decides which seqs are judged,
 * and in which order.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/trace/check.h"

static const char *const field_names[] = {"op", "count", "dtype", "root", "redop"};
enum { FIELD_OP, FIELD_COUNT, FIELD_DTYPE, FIELD_ROOT, FIELD_REDOP, N_FIELDS };
_Static_assert(ARRAY_SIZE(field_names) == N_FIELDS, "field_names matches the FIELD_ enum");

static long long field_value(const entry *e, int f) {
  switch (f) {
    case FIELD_OP: return e->op;
    case FIELD_COUNT: return e->count;
    case FIELD_DTYPE: return e->dtype;
    case FIELD_ROOT: return e->root;
    default: return e->redop;
  }
}
static void sb_field_value(sbuf *b, int f, long long v) {
  switch (f) {
    case FIELD_OP: sb_printf(b, "%s", op_name(v)); break;
    case FIELD_COUNT: sb_printf(b, "count %lld", v); break;
    case FIELD_DTYPE: sb_printf(b, "%s", dtype_name(v)); break;
    case FIELD_ROOT:
      if (v < 0)
        sb_printf(b, "no root");
      else
        sb_printf(b, "root %lld", v);
      break;
    default:
      if (v < 0)
        sb_printf(b, "no redop");
      else
        sb_printf(b, "%s", redop_name(v));
      break;
  }
}
static json_t *field_json(int f, long long v) {
  switch (f) {
    case FIELD_OP: return json_string(op_name(v));
    case FIELD_DTYPE: return json_string(dtype_name(v));
    case FIELD_REDOP: return v < 0 ? json_null() : json_string(redop_name(v));
    default: return json_integer(v);
  }
}
/* "ranks 0,2 ALLREDUCE, rank 1 BROADCAST" */
static void sb_groups(sbuf *b, int f, const vgroup *g, size_t ng) {
  for (size_t i = 0; i < ng; i++) {
    if (i) sb_printf(b, ", ");
    sb_ranks(b, g[i].r, g[i].n);
    sb_printf(b, " ");
    sb_field_value(b, f, g[i].v);
  }
}

int seq_mismatch(const comm *c, const at_seq *s, sbuf *t, sbuf *det, json_t **x) {
  (void)c;
  if (s->ne < 2) return 0;
  long long *vals = xcalloc(s->ne, sizeof *vals);
  json_t *jfields = NULL;
  int first_field = -1;
  for (int f = 0; f < N_FIELDS; f++) {
    for (size_t i = 0; i < s->ne; i++) vals[i] = field_value(s->ee[i], f);
    vgroup *g;
    size_t ng = group_values(s->er, vals, s->ne, &g);
    if (ng > 1) {
      if (first_field < 0) {
        first_field = f;
        jfields = json_array();
        check_json(jfields);
        sb_printf(t, "seq %lld: %s mismatch: ", s->k, field_names[f]);
        sb_groups(t, f, g, ng);
      } else {
        sb_printf(det, "%s%s (", det->len ? "; " : "    also differ: ", field_names[f]);
        sb_groups(det, f, g, ng);
        sb_printf(det, ")");
      }
      json_t *jv = json_array();
      check_json(jv);
      for (size_t i = 0; i < ng; i++)
        json_array_append_new(
            jv, json_pack("{s:o, s:o}", "value", field_json(f, g[i].v), "ranks", json_ranks(g[i].r, g[i].n)));
      json_array_append_new(jfields, json_pack("{s:s, s:o}", "field", field_names[f], "values", jv));
    }
    free_groups(g, ng);
  }
  free(vals);
  if (first_field < 0) return 0;
  if (det->len) sb_printf(det, "\n");
  *x = json_pack("{s:I, s:s, s:o}", "seq", (json_int_t)s->k, "field", field_names[first_field], "fields", jfields);
  return 1;
}

/* ranks[0..n) sorted ascending, in place (n is small: insertion sort). */
static void sort_ranks(int *r, size_t n) {
  for (size_t i = 1; i < n; i++)
    for (size_t j = i; j > 0 && r[j - 1] > r[j]; j--) {
      int tmp = r[j];
      r[j] = r[j - 1];
      r[j - 1] = tmp;
    }
}

/* "last seq 4", "no collective launched", "no dump; last seq 4 as rank 0 last learned it" */
static void sb_last(sbuf *b, long long last, int from) {
  if (from >= 0) sb_printf(b, "no dump; ");
  if (last == NONE)
    sb_printf(b, "no collective launched");
  else
    sb_printf(b, "last seq %lld", last);
  if (from >= 0) sb_printf(b, " as rank %d last learned it", from);
}

int seq_not_reached(const comm *c, const at_seq *s, sbuf *t, sbuf *det, json_t **x) {
  (void)c;
  (void)det;
  if (s->nn == 0 || s->ne + s->nl == 0) return 0;
  sb_printf(t, "seq %lld: missing ranks: ", s->k);
  sb_ranks(t, s->nr, s->nn);
  sb_printf(t, " never launched it (");
  /* grouped by (last seq, who says so): the key packs both */
  long long *key = xcalloc(s->nn, sizeof *key);
  for (size_t i = 0; i < s->nn; i++) key[i] = (long long)i;
  for (size_t i = 0; i < s->nn; i++)
    for (size_t j = 0; j < i; j++)
      if (s->last[j] == s->last[i] && s->from[j] == s->from[i]) {
        key[i] = key[j];
        break;
      }
  vgroup *g;
  size_t ng = group_values(s->nr, key, s->nn, &g);
  for (size_t i = 0; i < ng; i++) {
    if (i) sb_printf(t, ", ");
    if (ng > 1) {
      sb_ranks(t, g[i].r, g[i].n);
      sb_printf(t, ": ");
    }
    sb_last(t, s->last[g[i].v], s->from[g[i].v]);
  }
  free_groups(g, ng);
  free(key);
  sb_printf(t, "), ");
  /* the ranks that launched it, then those that submitted it only */
  int *launched = xcalloc(s->ne + s->nl, sizeof *launched), *submitted = xcalloc(s->ne + 1, sizeof *submitted);
  size_t nlaunched = 0, nsub = 0;
  const entry *le = NULL, *se = NULL;
  for (size_t i = 0; i < s->ne; i++) {
    if (s->sub[i]) {
      submitted[nsub++] = s->er[i];
      if (!se) se = s->ee[i];
    } else {
      launched[nlaunched++] = s->er[i];
      if (!le) le = s->ee[i];
    }
  }
  for (size_t i = 0; i < s->nl; i++) launched[nlaunched++] = s->lr[i];
  sort_ranks(launched, nlaunched);
  if (nlaunched) {
    sb_ranks(t, launched, nlaunched);
    if (le)
      sb_printf(t, " launched %s", op_name(le->op));
    else
      sb_printf(t, " launched it (record lost)");
  }
  if (nsub) {
    int same = 1; /* the same outcome on every submitting rank */
    for (size_t i = 0; i < s->ne; i++)
      if (s->sub[i]) same &= s->ee[i]->state == se->state && s->ee[i]->result == se->result;
    sb_printf(t, "%s", nlaunched ? ", " : "");
    sb_ranks(t, submitted, nsub);
    sb_printf(t, " submitted %s, never launched", op_name(se->op));
    if (same) sb_printf(t, " (%s%s%s)", work_state_name(se->state), is_pending(se) ? "" : " ", is_pending(se) ? "" : result_name(se->result));
  }
  int *reached = xcalloc(nlaunched + nsub + 1, sizeof *reached);
  memcpy(reached, launched, nlaunched * sizeof *reached);
  memcpy(reached + nlaunched, submitted, nsub * sizeof *reached);
  sort_ranks(reached, nlaunched + nsub);
  json_t *jn = json_array();
  check_json(jn);
  for (size_t i = 0; i < s->nn; i++) {
    json_t *o = json_pack("{s:i, s:o}", "rank", s->nr[i], "last_seq", jseq(s->last[i]));
    check_json(o);
    if (s->from[i] >= 0) json_object_set_new(o, "seen_by", json_integer(s->from[i]));
    json_array_append_new(jn, o);
  }
  *x = json_pack("{s:I, s:o, s:o}", "seq", (json_int_t)s->k, "ranks_reached", json_ranks(reached, nlaunched + nsub),
                 "ranks_not_reached", jn);
  if (nsub) json_object_set_new(*x, "ranks_submitted", json_ranks(submitted, nsub));
  free(reached);
  free(launched);
  free(submitted);
  return 1;
}

int seq_failed(const comm *c, const at_seq *s, sbuf *t, sbuf *det, json_t **x) {
  (void)c;
  size_t m = 0;
  int *rr = xcalloc(s->ne, sizeof *rr);
  long long *res = xcalloc(s->ne, sizeof *res);
  for (size_t i = 0; i < s->ne; i++)
    if (is_failed(s->ee[i])) rr[m] = s->er[i], res[m++] = s->ee[i]->result;
  if (m) {
    sb_printf(t, "seq %lld: failed on ", s->k);
    sb_ranks(t, rr, m);
    sb_printf(t, ": %s", op_name(s->ee[0]->op));
    vgroup *g;
    size_t ng = group_values(rr, res, m, &g);
    for (size_t i = 0; i < ng; i++) {
      sb_printf(t, "%s", i ? ", " : " ");
      if (ng > 1) {
        sb_ranks(t, g[i].r, g[i].n);
        sb_printf(t, " ");
      }
      sb_printf(t, "%s", result_name(g[i].v));
    }
    free_groups(g, ng);
    json_t *jf = json_array();
    check_json(jf);
    for (size_t i = 0; i < s->ne; i++) {
      if (!is_failed(s->ee[i])) continue;
      const dump *d = s->ed[i];
      json_array_append_new(jf, json_pack("{s:i, s:s, s:s, s:o}", "rank", s->er[i], "state",
                                          work_state_name(s->ee[i]->state), "result", result_name(s->ee[i]->result),
                                          "failure", jstr_or_null(d->failure)));
      if (d->failure && *d->failure) sb_printf(det, "    cause on rank %d: \"%s\"\n", s->er[i], d->failure);
    }
    *x = json_pack("{s:I, s:o}", "seq", (json_int_t)s->k, "ranks_failed", jf);
  }
  free(rr);
  free(res);
  return m > 0;
}

int seq_partial(const comm *c, const at_seq *s, sbuf *t, sbuf *det, json_t **x) {
  (void)c;
  (void)det;
  size_t nc = 0, np = 0;
  int *cr = xcalloc(s->ne, sizeof *cr), *pr = xcalloc(s->ne, sizeof *pr);
  long long *st = xcalloc(s->ne, sizeof *st);
  for (size_t i = 0; i < s->ne; i++) {
    if (is_completed(s->ee[i]))
      cr[nc++] = s->er[i];
    else if (is_pending(s->ee[i]))
      st[np] = s->ee[i]->state, pr[np++] = s->er[i];
  }
  int found = nc && np;
  if (found) {
    sb_printf(t, "seq %lld: partial progress: %s completed on ", s->k, op_name(s->ee[0]->op));
    sb_ranks(t, cr, nc);
    sb_printf(t, ", not on ");
    sb_ranks(t, pr, np);
    sb_printf(t, " (");
    vgroup *g;
    size_t ng = group_values(pr, st, np, &g);
    for (size_t i = 0; i < ng; i++) {
      if (i) sb_printf(t, ", ");
      if (ng > 1) {
        sb_ranks(t, g[i].r, g[i].n);
        sb_printf(t, " ");
      }
      sb_printf(t, "%s", work_state_name(g[i].v));
    }
    free_groups(g, ng);
    sb_printf(t, ")");
    json_t *jp = json_array();
    check_json(jp);
    for (size_t i = 0; i < s->ne; i++)
      if (is_pending(s->ee[i]))
        json_array_append_new(jp,
                              json_pack("{s:i, s:s}", "rank", s->er[i], "state", work_state_name(s->ee[i]->state)));
    *x = json_pack("{s:I, s:o, s:o}", "seq", (json_int_t)s->k, "ranks_completed", json_ranks(cr, nc), "ranks_pending",
                   jp);
  }
  free(cr);
  free(pr);
  free(st);
  return found;
}
