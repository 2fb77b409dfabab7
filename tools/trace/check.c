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

/* When the ranks' rings start at different seqs (some lost history that
 * others hold) or do not overlap: which seqs each holds, and that before
 * the seqs every ring holds the ranks cannot all be compared. */
static void note_rings(comm *c) {
  size_t nd = c->nd;
  long long *lo = xcalloc(nd, sizeof *lo), *hi = xcalloc(nd, sizeof *hi), *key = xcalloc(nd, sizeof *key);
  int *r = xcalloc(nd, sizeof *r), differ = 0;
  for (size_t i = 0; i < nd; i++) {
    const dump *d = c->d[i];
    r[i] = d->rank;
    lo[i] = d->ncoll ? d->lo : NONE;
    hi[i] = d->ncoll ? d->next_seq - 1 : NONE;
    key[i] = (long long)i;
    for (size_t j = 0; j < i; j++)
      if (lo[j] == lo[i] && hi[j] == hi[i]) {
        key[i] = key[j];
        break;
      }
    differ |= lo[i] != lo[0];
  }
  if (differ || (c->cmp_lo == NONE && nd > 1 && c->max_next > 0)) {
    vgroup *g;
    size_t ng = group_values(r, key, nd, &g);
    sbuf t = {0};
    json_t *jr = json_array();
    check_json(jr);
    sb_printf(&t, "%s: ", c->cmp_lo == NONE ? "the rings do not overlap" : "the rings start at different seqs");
    for (size_t i = 0; i < ng; i++) {
      size_t at = (size_t)g[i].v;
      if (i) sb_printf(&t, ", ");
      sb_ranks(&t, g[i].r, g[i].n);
      sb_printf(&t, " ");
      if (lo[at] == NONE)
        sb_printf(&t, "no collective");
      else
        sb_seqs(&t, lo[at], hi[at]);
      json_array_append_new(jr, json_pack("{s:o, s:o, s:o}", "ranks", json_ranks(g[i].r, g[i].n), "first_seq",
                                          jseq(lo[at]), "last_seq", jseq(hi[at])));
    }
    if (c->cmp_lo == NONE) {
      sb_printf(&t, "; no seq is on every ring: %s", nd == 2 ? "no fingerprint can be compared across the ranks"
                                                            : "no seq can be compared on every rank");
    } else {
      sb_printf(&t, "; every ring holds ");
      sb_seqs(&t, c->cmp_lo, c->cmp_hi);
      sb_printf(&t, ": before seq %lld %s", c->cmp_lo,
                nd == 2 ? "nothing is compared" : "only the ranks that still hold a seq are compared");
    }
    json_t *jc = c->cmp_lo == NONE ? json_null()
                                   : json_pack("{s:I, s:I}", "first_seq", (json_int_t)c->cmp_lo, "last_seq",
                                               (json_int_t)c->cmp_hi);
    add_note(c, json_pack("{s:s, s:o, s:o}", "kind", "rings", "rings", jr, "common", jc), "%s", t.p);
    free(t.p);
    free_groups(g, ng);
  }
  free(lo);
  free(hi);
  free(key);
  free(r);
}

/* The comm's view of every rank: its dump, or what the others' dumps last
 * learned of it (peer_next_seq). */
static void index_ranks(comm *c) {
  size_t n = (size_t)c->nranks;
  c->by_rank = xcalloc(n, sizeof *c->by_rank);
  c->view = xcalloc(n, sizeof *c->view);
  c->view_from = xcalloc(n, sizeof *c->view_from);
  for (size_t i = 0; i < c->nd; i++) c->by_rank[c->d[i]->rank] = c->d[i];
  for (size_t r = 0; r < n; r++) {
    c->view[r] = NONE;
    c->view_from[r] = -1;
    if (c->by_rank[r]) continue;
    for (size_t i = 0; i < c->nd; i++) {
      const dump *d = c->d[i];
      long long v = d->peer_next_seq ? d->peer_next_seq[r] : NONE;
      if (v != NONE && (c->view[r] == NONE || v > c->view[r])) c->view[r] = v, c->view_from[r] = d->rank;
    }
  }
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
  index_ranks(c);
  /* the seqs every rank holds, and lost history */
  for (size_t i = 0; i < c->nd; i++) {
    const dump *d = c->d[i];
    long long lo = d->ncoll ? d->lo : d->next_seq, hi = d->next_seq - 1;
    if (i == 0 || lo > c->cmp_lo) c->cmp_lo = lo;
    if (i == 0 || hi < c->cmp_hi) c->cmp_hi = hi;
    if (d->next_seq > c->max_next) c->max_next = d->next_seq;
    if (lo > 0)
      add_note(c, json_pack("{s:s, s:i, s:I}", "kind", "history_lost", "rank", d->rank, "before_seq", (json_int_t)lo),
               "rank %d: history before seq %lld is lost (its ring of %lld entries wrapped after %lld records)",
               d->rank, lo, d->capacity, d->total);
  }
  if (c->cmp_lo > c->cmp_hi) c->cmp_lo = c->cmp_hi = NONE;
  note_rings(c);
  walk_collectives(c);
  size_t ncoll_findings = c->nf;
  if (ncoll_findings == 0) check_hashes(c);
  walk_p2p(c);
  /* missing dumps */
  int *miss = xcalloc((size_t)c->nranks, sizeof *miss);
  size_t nm = 0;
  for (int i = 0; i < c->nranks; i++)
    if (!c->by_rank[i]) miss[nm++] = i;
  if (nm) {
    sbuf t = {0};
    sb_printf(&t, "missing dumps: ");
    sb_ranks(&t, miss, nm);
    sb_printf(&t, " of %d %s no dump among the inputs", c->nranks, nm == 1 ? "has" : "have");
    add_finding(c, F_MISSING_DUMP, sb_take(&t), NULL,
                json_pack("{s:o, s:o}", "seq", json_null(), "ranks", json_ranks(miss, nm)));
  }
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
  free(c->by_rank);
  free(c->view);
  free(c->view_from);
}
