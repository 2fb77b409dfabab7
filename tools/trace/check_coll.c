/*
 * ncfsm-trace: the collectives of one communicator walked by seq across its
 * ranks (check.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/trace/check.h"

static const char *const field_names[] = {"op", "count", "dtype", "root", "redop"};
enum { FIELD_OP, FIELD_COUNT, FIELD_DTYPE, FIELD_ROOT, FIELD_REDOP, N_FIELDS };
_Static_assert(ARRAY_SIZE(field_names) == N_FIELDS, "field_names matches the FIELD_ enum");

/* ---- one rank at one seq ----------------------------------------------------------- */
typedef enum at_kind { AT_ENTRY, AT_LOST, AT_NOT_REACHED } at_kind;
static const char *const at_names[] = {"entry", "lost", "not_reached"};

static at_kind rank_at(const dump *d, long long k, const entry **e) {
  *e = NULL;
  if (k >= d->next_seq) return AT_NOT_REACHED;
  if (d->ncoll && k >= d->lo) {
    *e = d->coll[k - d->lo];
    return AT_ENTRY;
  }
  return AT_LOST;
}


/* The works of a rank that were submitted after its last launched collective
 * and never launched (seq null): why a rank did not reach a seq. */
static void unlaunched_after(const dump *d, sbuf *b, json_t *arr) {
  long long after = d->ncoll ? d->coll[d->ncoll - 1]->id : -1;
  size_t shown = 0, n = 0;
  for (size_t i = 0; i < d->n_entries; i++) {
    const entry *e = &d->entries[i];
    if (e->id <= after || e->seq != NONE || !is_coll(e)) continue;
    n++;
    if (arr) json_array_append_new(arr, entry_json(d, e));
    if (b && shown < 3) {
      sb_printf(b, "%s", shown ? "; " : "; submitted later, never launched: ");
      sb_fingerprint(b, e);
      sb_printf(b, " ");
      sb_state(b, d, e);
      shown++;
    }
  }
  if (b && n > shown) sb_printf(b, "; and %zu more", n - shown);
}

/* The per-rank block of a collective finding: text lines and the JSON array. */
static void ranks_at_seq(const comm *c, long long k, sbuf *b, json_t **jout) {
  json_t *arr = json_array();
  check_json(arr);
  sb_printf(b, "    seq %lld on each rank:\n", k);
  for (size_t i = 0; i < c->nd; i++) {
    const dump *d = c->d[i];
    const entry *e;
    at_kind a = rank_at(d, k, &e);
    json_t *o = json_pack("{s:i, s:s}", "rank", d->rank, "status", at_names[a]);
    check_json(o);
    sb_printf(b, "      rank %d: ", d->rank);
    if (a == AT_ENTRY) {
      sb_fingerprint(b, e);
      sb_printf(b, ", ");
      sb_state(b, d, e);
      json_object_set_new(o, "entry", entry_json(d, e));
    } else if (a == AT_LOST) {
      sb_printf(b, "launched, but its record is lost (the ring holds ");
      if (d->ncoll) {
        sb_seqs(b, d->lo, last_seq(d));
        sb_printf(b, ")");
      } else
        sb_printf(b, "no launched collective)");
    } else {
      long long ls = last_seq(d);
      if (ls == NONE)
        sb_printf(b, "not reached (launched no collective)");
      else
        sb_printf(b, "not reached (last launched seq %lld)", ls);
      json_object_set_new(o, "last_seq", jseq(ls));
      json_t *un = json_array();
      check_json(un);
      unlaunched_after(d, b, un);
      json_object_set_new(o, "unlaunched", un);
    }
    if (dump_state(d)) sb_printf(b, "; comm %s", dump_state(d));
    sb_printf(b, "\n");
    json_array_append_new(arr, o);
  }
  *jout = arr;
}

/* Distinct values among some ranks, in the order of their lowest rank. */

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

/* ---- the collective walk --------------------------------------------------------------- */
/* Evaluates seq k; adds a finding and returns 1 at a divergence. */
static int check_seq(comm *c, long long k) {
  size_t nd = c->nd;
  int *er = xcalloc(nd, sizeof *er), *nr = xcalloc(nd, sizeof *nr), *lr = xcalloc(nd, sizeof *lr);
  const entry **ee = xcalloc(nd, sizeof *ee);
  const dump **ed = xcalloc(nd, sizeof *ed);
  size_t ne = 0, nn = 0, nl = 0;
  for (size_t i = 0; i < nd; i++) {
    const entry *e;
    switch (rank_at(c->d[i], k, &e)) {
      case AT_ENTRY: er[ne] = c->d[i]->rank, ed[ne] = c->d[i], ee[ne++] = e; break;
      case AT_LOST: lr[nl++] = c->d[i]->rank; break;
      case AT_NOT_REACHED: nr[nn++] = c->d[i]->rank; break;
    }
  }
  int found = 0;
  int compared = ne >= 2 || (nn > 0 && ne + nl > 0);
  if (compared) {
    if (c->checked_lo == NONE) c->checked_lo = k;
    c->checked_hi = k;
  }
  sbuf t = {0}, det = {0};
  json_t *x = NULL;
  /* a) fingerprints */
  long long *vals = xcalloc(nd, sizeof *vals);
  int first_field = -1;
  if (ne >= 2) {
    json_t *jfields = NULL;
    for (int f = 0; f < N_FIELDS; f++) {
      for (size_t i = 0; i < ne; i++) vals[i] = field_value(ee[i], f);
      vgroup *g;
      size_t ng = group_values(er, vals, ne, &g);
      if (ng > 1) {
        if (first_field < 0) {
          first_field = f;
          jfields = json_array();
          check_json(jfields);
          sb_printf(&t, "seq %lld: %s mismatch: ", k, field_names[f]);
          sb_groups(&t, f, g, ng);
        } else {
          sb_printf(&det, "%s%s (", det.len ? "; " : "    also differ: ", field_names[f]);
          sb_groups(&det, f, g, ng);
          sb_printf(&det, ")");
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
    if (first_field >= 0) {
      if (det.len) sb_printf(&det, "\n");
      x = json_pack("{s:I, s:s, s:o}", "seq", (json_int_t)k, "field", field_names[first_field], "fields", jfields);
      found = F_MISMATCH + 1;
    }
  }
  /* b) ranks that never reached k while others did */
  if (!found && nn > 0 && ne + nl > 0) {
    sb_printf(&t, "seq %lld: missing ranks: ", k);
    sb_ranks(&t, nr, nn);
    sb_printf(&t, " never launched it (");
    long long *ls = vals;
    for (size_t i = 0, j = 0; i < nd; i++)
      if (c->d[i]->next_seq <= k) ls[j++] = last_seq(c->d[i]);
    vgroup *g;
    size_t ng = group_values(nr, ls, nn, &g);
    for (size_t i = 0; i < ng; i++) {
      if (i) sb_printf(&t, ", ");
      if (ng > 1) {
        sb_ranks(&t, g[i].r, g[i].n);
        sb_printf(&t, ": ");
      }
      if (g[i].v == NONE)
        sb_printf(&t, "no collective launched");
      else
        sb_printf(&t, "last seq %lld", g[i].v);
    }
    free_groups(g, ng);
    sb_printf(&t, "), ");
    int *reached = xcalloc(ne + nl, sizeof *reached);
    memcpy(reached, er, ne * sizeof *er);
    memcpy(reached + ne, lr, nl * sizeof *lr);
    for (size_t i = 1; i < ne + nl; i++) /* insertion sort: both parts are sorted */
      for (size_t j = i; j > 0 && reached[j - 1] > reached[j]; j--) {
        int tmp = reached[j];
        reached[j] = reached[j - 1];
        reached[j - 1] = tmp;
      }
    sb_ranks(&t, reached, ne + nl);
    if (ne)
      sb_printf(&t, " launched %s", op_name(ee[0]->op));
    else
      sb_printf(&t, " launched it (record lost)");
    json_t *jn = json_array();
    check_json(jn);
    for (size_t i = 0; i < nd; i++)
      if (c->d[i]->next_seq <= k)
        json_array_append_new(jn, json_pack("{s:i, s:o}", "rank", c->d[i]->rank, "last_seq", jseq(last_seq(c->d[i]))));
    x = json_pack("{s:I, s:o, s:o}", "seq", (json_int_t)k, "ranks_reached", json_ranks(reached, ne + nl),
                  "ranks_not_reached", jn);
    free(reached);
    found = F_NOT_REACHED + 1;
  }
  /* c) failed works */
  if (!found) {
    size_t nf = 0;
    int *fr = xcalloc(nd, sizeof *fr);
    for (size_t i = 0; i < ne; i++)
      if (is_failed(ee[i])) fr[nf++] = er[i];
    if (nf) {
      sb_printf(&t, "seq %lld: failed on ", k);
      sb_ranks(&t, fr, nf);
      sb_printf(&t, ": %s", op_name(ee[0]->op));
      long long *res = vals;
      int *rr = xcalloc(ne, sizeof *rr);
      size_t m = 0;
      for (size_t i = 0; i < ne; i++)
        if (is_failed(ee[i])) rr[m] = er[i], res[m++] = ee[i]->result;
      vgroup *g;
      size_t ng = group_values(rr, res, m, &g);
      for (size_t i = 0; i < ng; i++) {
        sb_printf(&t, "%s", i ? ", " : " ");
        if (ng > 1) {
          sb_ranks(&t, g[i].r, g[i].n);
          sb_printf(&t, " ");
        }
        sb_printf(&t, "%s", result_name((int)g[i].v));
      }
      free_groups(g, ng);
      free(rr);
      json_t *jf = json_array();
      check_json(jf);
      for (size_t i = 0; i < ne; i++) {
        if (!is_failed(ee[i])) continue;
        const dump *d = ed[i];
        json_array_append_new(
            jf, json_pack("{s:i, s:s, s:s, s:o}", "rank", er[i], "state", work_state_name(ee[i]->state), "result",
                          result_name(ee[i]->result), "failure", jstr_or_null(d->failure)));
        if (d->failure && *d->failure) sb_printf(&det, "    cause on rank %d: \"%s\"\n", er[i], d->failure);
      }
      x = json_pack("{s:I, s:o}", "seq", (json_int_t)k, "ranks_failed", jf);
      found = F_FAILED + 1;
    }
    free(fr);
  }
  /* d) partial progress */
  if (!found) {
    size_t nc = 0, np = 0;
    int *cr = xcalloc(nd, sizeof *cr), *pr = xcalloc(nd, sizeof *pr);
    for (size_t i = 0; i < ne; i++) {
      if (is_completed(ee[i]))
        cr[nc++] = er[i];
      else if (is_pending(ee[i]))
        pr[np++] = er[i];
    }
    if (nc && np) {
      sb_printf(&t, "seq %lld: partial progress: %s completed on ", k, op_name(ee[0]->op));
      sb_ranks(&t, cr, nc);
      sb_printf(&t, ", not on ");
      sb_ranks(&t, pr, np);
      sb_printf(&t, " (");
      long long *st = vals;
      size_t m = 0;
      for (size_t i = 0; i < ne; i++)
        if (is_pending(ee[i])) st[m++] = ee[i]->state;
      vgroup *g;
      size_t ng = group_values(pr, st, np, &g);
      for (size_t i = 0; i < ng; i++) {
        if (i) sb_printf(&t, ", ");
        if (ng > 1) {
          sb_ranks(&t, g[i].r, g[i].n);
          sb_printf(&t, " ");
        }
        sb_printf(&t, "%s", work_state_name(g[i].v));
      }
      free_groups(g, ng);
      sb_printf(&t, ")");
      json_t *jp = json_array();
      check_json(jp);
      for (size_t i = 0; i < ne; i++)
        if (is_pending(ee[i]))
          json_array_append_new(jp, json_pack("{s:i, s:s}", "rank", er[i], "state", work_state_name(ee[i]->state)));
      x = json_pack("{s:I, s:o, s:o}", "seq", (json_int_t)k, "ranks_completed", json_ranks(cr, nc), "ranks_pending",
                    jp);
      found = F_PARTIAL + 1;
    }
    free(cr);
    free(pr);
  }
  if (found) {
    check_json(x);
    json_t *jr;
    ranks_at_seq(c, k, &det, &jr);
    if (nl) {
      sb_printf(&det, "    not comparable at seq %lld: ", k);
      sb_ranks(&det, lr, nl);
      sb_printf(&det, " (history lost)\n");
    }
    json_object_set_new(x, "ranks_at_seq", jr);
    add_finding(c, (fkind)(found - 1), sb_take(&t), sb_take(&det), x);
  }
  free(t.p);
  free(det.p);
  free(vals);
  free(er);
  free(nr);
  free(lr);
  free(ee);
  free(ed);
  return found != 0;
}

/* The next seq after k worth evaluating: inside some rank's recorded range, or
 * some rank's next_seq (where it stops). NONE when there is none. */
static long long next_candidate(const comm *c, long long k) {
  long long best = NONE;
  for (size_t i = 0; i < c->nd; i++) {
    const dump *d = c->d[i];
    long long cand[3] = {NONE, NONE, NONE};
    if (d->ncoll && k + 1 >= d->lo && k + 1 < d->next_seq) cand[0] = k + 1;
    if (d->ncoll && d->lo > k) cand[1] = d->lo;
    if (d->next_seq > k) cand[2] = d->next_seq;
    for (int j = 0; j < 3; j++)
      if (cand[j] != NONE && (best == NONE || cand[j] < best)) best = cand[j];
  }
  return best;
}

void walk_collectives(comm *c) {
  for (size_t i = 0; i < c->nd; i++)
    if (c->d[i]->next_seq > c->max_next) c->max_next = c->d[i]->next_seq;
  for (long long k = next_candidate(c, -1); k != NONE && k < c->max_next; k = next_candidate(c, k))
    if (check_seq(c, k)) return;
}

/* Ranks with the same next_seq must have the same rolling hash. */
