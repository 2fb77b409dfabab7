/*
 * ncfsm-trace: the checks of one communicator, in order (check.h): nranks,
 * the seqs every rank holds, the collectives, the rolling hashes, the
 * sends and receives, the missing dumps.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/trace/check.h"

static void check_hashes(comm *c) {
  size_t nd = c->nd;
  int *done = xcalloc(nd, sizeof *done);
  for (size_t i = 0; i < nd; i++) {
    if (done[i]) continue;
    int *r = xcalloc(nd, sizeof *r);
    long long *v = xcalloc(nd, sizeof *v);
    size_t n = 0;
    long long from = NONE; /* seqs every rank of this set holds from here */
    int lost = 0;
    for (size_t j = i; j < nd; j++) {
      if (done[j] || c->d[j]->next_seq != c->d[i]->next_seq) continue;
      done[j] = 1;
      r[n] = c->d[j]->rank;
      v[n++] = (long long)strtoull(c->d[j]->rolling_hash, NULL, 16);
      long long lo = c->d[j]->ncoll ? c->d[j]->lo : c->d[j]->next_seq;
      if (lo > 0) lost = 1;
      if (from == NONE || lo > from) from = lo;
    }
    if (n >= 2) c->hash_checked = 1;
    vgroup *g;
    size_t ng = group_values(r, v, n, &g);
    if (ng > 1) {
      long long ns = c->d[i]->next_seq;
      sbuf t = {0};
      sb_printf(&t, "rolling hash mismatch at next_seq %lld: ", ns);
      for (size_t k = 0; k < ng; k++) {
        if (k) sb_printf(&t, ", ");
        sb_ranks(&t, g[k].r, g[k].n);
        sb_printf(&t, " %016llx", (unsigned long long)g[k].v);
      }
      if (lost && from > 0 && from < ns) {
        sb_printf(&t, "; ");
        sb_seqs(&t, from, ns - 1);
        sb_printf(&t, " match on these ranks, so their histories differ before seq %lld, where records are lost", from);
      } else if (lost && from > 0) {
        sb_printf(&t, "; the rings hold no seq in common: the histories differ where records are lost");
      } else if (ns > 0)
        sb_printf(&t,
                  "; every recorded fingerprint (seq 0..%lld) matches: the hashes cover what the entries do "
                  "not show",
                  ns - 1);
      json_t *jv = json_array();
      check_json(jv);
      for (size_t k = 0; k < ng; k++) {
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)g[k].v);
        json_array_append_new(jv, json_pack("{s:s, s:o}", "value", hex, "ranks", json_ranks(g[k].r, g[k].n)));
      }
      add_finding(c, F_HASH, sb_take(&t), NULL,
                  json_pack("{s:o, s:I, s:o, s:o}", "seq", json_null(), "next_seq", (json_int_t)ns, "values", jv,
                            "matching_from_seq", lost && from > 0 && from < ns ? json_integer(from) : json_null()));
    }
    free_groups(g, ng);
    free(r);
    free(v);
  }
  free(done);
}

void analyse(comm *c) {
  c->cmp_lo = c->cmp_hi = c->checked_lo = c->checked_hi = NONE;
  c->jnotes = json_array();
  check_json(c->jnotes);
  /* nranks */
  int *r = xcalloc(c->nd, sizeof *r);
  long long *v = xcalloc(c->nd, sizeof *v);
  for (size_t i = 0; i < c->nd; i++) r[i] = c->d[i]->rank, v[i] = c->d[i]->nranks;
  vgroup *g;
  size_t ng = group_values(r, v, c->nd, &g);
  c->nranks = ng == 1 ? (int)g[0].v : -1;
  if (ng > 1) {
    sbuf t = {0};
    sb_printf(&t, "nranks mismatch: ");
    json_t *jv = json_array();
    check_json(jv);
    for (size_t i = 0; i < ng; i++) {
      if (i) sb_printf(&t, ", ");
      sb_ranks(&t, g[i].r, g[i].n);
      sb_printf(&t, " say%s %lld", g[i].n == 1 ? "s" : "", g[i].v);
      json_array_append_new(jv,
                            json_pack("{s:I, s:o}", "value", (json_int_t)g[i].v, "ranks", json_ranks(g[i].r, g[i].n)));
    }
    sb_printf(&t, ": these dumps are not of one communicator (or its id collided); nothing else is compared");
    add_finding(c, F_NRANKS, sb_take(&t), NULL, json_pack("{s:o, s:o}", "seq", json_null(), "values", jv));
  }
  free_groups(g, ng);
  free(r);
  free(v);
  if (c->nranks < 0) return;
  /* the seqs every rank holds, and lost history */
  for (size_t i = 0; i < c->nd; i++) {
    const dump *d = c->d[i];
    long long lo = d->ncoll ? d->lo : d->next_seq, hi = d->next_seq - 1;
    if (i == 0 || lo > c->cmp_lo) c->cmp_lo = lo;
    if (i == 0 || hi < c->cmp_hi) c->cmp_hi = hi;
    if (lo > 0)
      add_note(c, json_pack("{s:s, s:i, s:I}", "kind", "history_lost", "rank", d->rank, "before_seq", (json_int_t)lo),
               "rank %d: history before seq %lld is lost (its ring of %lld entries wrapped after %lld records)",
               d->rank, lo, d->capacity, d->total);
  }
  if (c->cmp_lo > c->cmp_hi) c->cmp_lo = c->cmp_hi = NONE;
  walk_collectives(c);
  size_t ncoll_findings = c->nf;
  if (ncoll_findings == 0) check_hashes(c);
  walk_p2p(c);
  /* missing dumps */
  char *present = xcalloc((size_t)c->nranks, 1);
  for (size_t i = 0; i < c->nd; i++) present[c->d[i]->rank] = 1;
  int *miss = xcalloc((size_t)c->nranks, sizeof *miss);
  size_t nm = 0;
  for (int i = 0; i < c->nranks; i++)
    if (!present[i]) miss[nm++] = i;
  if (nm) {
    sbuf t = {0};
    sb_printf(&t, "missing dumps: ");
    sb_ranks(&t, miss, nm);
    sb_printf(&t, " of %d %s no dump among the inputs", c->nranks, nm == 1 ? "has" : "have");
    add_finding(c, F_MISSING_DUMP, sb_take(&t), NULL,
                json_pack("{s:o, s:o}", "seq", json_null(), "ranks", json_ranks(miss, nm)));
  }
  free(present);
  free(miss);
}


void comm_free(comm *c) {
  for (size_t j = 0; j < c->nf; j++) {
    free(c->f[j].text);
    free(c->f[j].detail);
    json_decref(c->f[j].json);
  }
  free(c->f);
  free(c->d);
  free(c->notes.p);
  json_decref(c->jnotes);
}
