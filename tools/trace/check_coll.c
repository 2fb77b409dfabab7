/*
 * ncfsm-trace: the collectives of one communicator walked by seq across its
 * ranks (check.h): what each rank shows at a seq (an entry, a record lost,
 * a work submitted and never launched, not reached), which seqs are
 * judged, and in which order; check_seq.c judges one seq.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/trace/check.h"

/* ---- one rank at one seq ----------------------------------------------------------- */
typedef enum at_kind { AT_ENTRY, AT_LOST, AT_NOT_REACHED, AT_SUBMITTED, AT_NO_DUMP } at_kind;
static const char *const at_names[] = {"entry", "lost", "not_reached", "submitted", "no_dump"};

/* What rank r shows at seq k; *e: its entry (AT_ENTRY, AT_SUBMITTED). */
static at_kind rank_at(const comm *c, int r, long long k, const entry **e) {
  const dump *d = c->by_rank[r];
  *e = NULL;
  if (!d) return c->view[r] != NONE && c->view[r] <= k ? AT_NOT_REACHED : AT_NO_DUMP;
  if (k >= d->next_seq) {
    if (k - d->next_seq < (long long)d->nqueued) {
      *e = d->queued[k - d->next_seq];
      return AT_SUBMITTED;
    }
    return AT_NOT_REACHED;
  }
  if (d->ncoll && k >= d->lo) {
    *e = d->coll[k - d->lo];
    return AT_ENTRY;
  }
  return AT_LOST;
}

static void at_seq_build(const comm *c, long long k, at_seq *s) {
  size_t n = (size_t)c->nranks;
  memset(s, 0, sizeof *s);
  s->k = k;
  s->er = xcalloc(n, sizeof *s->er);
  s->ee = xcalloc(n, sizeof *s->ee);
  s->ed = xcalloc(n, sizeof *s->ed);
  s->sub = xcalloc(n, sizeof *s->sub);
  s->lr = xcalloc(n, sizeof *s->lr);
  s->nr = xcalloc(n, sizeof *s->nr);
  s->last = xcalloc(n, sizeof *s->last);
  s->from = xcalloc(n, sizeof *s->from);
  for (int r = 0; r < c->nranks; r++) {
    const entry *e;
    const dump *d = c->by_rank[r];
    switch (rank_at(c, r, k, &e)) {
      case AT_SUBMITTED:
        s->sub[s->ne] = 1;
        /* fall through */
      case AT_ENTRY: s->er[s->ne] = r, s->ed[s->ne] = d, s->ee[s->ne++] = e; break;
      case AT_LOST: s->lr[s->nl++] = r; break;
      case AT_NOT_REACHED:
        s->nr[s->nn] = r;
        s->last[s->nn] = d ? last_seq(d) : c->view[r] ? c->view[r] - 1 : NONE;
        s->from[s->nn++] = d ? -1 : c->view_from[r];
        break;
      case AT_NO_DUMP: break;
    }
  }
}

static void at_seq_free(at_seq *s) {
  free(s->er);
  free(s->ee);
  free(s->ed);
  free(s->sub);
  free(s->lr);
  free(s->nr);
  free(s->last);
  free(s->from);
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

/* The per-rank block of a collective finding: text lines and the JSON array.
 * Ranks without a dump are listed when the others' peer_next_seq names them. */
static void ranks_at_seq(const comm *c, long long k, sbuf *b, json_t **jout) {
  json_t *arr = json_array();
  check_json(arr);
  sb_printf(b, "    seq %lld on each rank:\n", k);
  for (int r = 0; r < c->nranks; r++) {
    const dump *d = c->by_rank[r];
    if (!d && c->view[r] == NONE) continue;
    const entry *e;
    at_kind a = rank_at(c, r, k, &e);
    json_t *o = json_pack("{s:i, s:s}", "rank", r, "status", d ? at_names[a] : at_names[AT_NO_DUMP]);
    check_json(o);
    sb_printf(b, "      rank %d: ", r);
    if (!d) {
      sb_printf(b, "no dump; rank %d last learned its next_seq %lld, so it %s seq %lld", c->view_from[r], c->view[r],
                a == AT_NOT_REACHED ? "never launched" : "launched", k);
      json_object_set_new(o, "next_seq_seen", json_integer(c->view[r]));
      json_object_set_new(o, "seen_by", json_integer(c->view_from[r]));
    } else if (a == AT_ENTRY || a == AT_SUBMITTED) {
      sb_fingerprint(b, e);
      sb_printf(b, ", %s", a == AT_SUBMITTED ? "never launched: " : "");
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
    if (d && dump_state(d)) sb_printf(b, "; comm %s", dump_state(d));
    sb_printf(b, "\n");
    json_array_append_new(arr, o);
  }
  *jout = arr;
}

/* ---- the collective walk --------------------------------------------------------------- */
/* Adds the finding that judge (check_seq.c) makes of seq s->k, with the
 * block of every rank at that seq; 1 when there is one. */
static int judge(comm *c, const at_seq *s, fkind kind,
                 int (*fn)(const comm *, const at_seq *, sbuf *, sbuf *, json_t **)) {
  sbuf t = {0}, det = {0};
  json_t *x = NULL;
  if (!fn(c, s, &t, &det, &x)) {
    free(t.p);
    free(det.p);
    return 0;
  }
  check_json(x);
  json_t *jr;
  ranks_at_seq(c, s->k, &det, &jr);
  if (s->nl) {
    sb_printf(&det, "    not comparable at seq %lld: ", s->k);
    sb_ranks(&det, s->lr, s->nl);
    sb_printf(&det, " (history lost)\n");
  }
  json_object_set_new(x, "ranks_at_seq", jr);
  add_finding(c, kind, sb_take(&t), sb_take(&det), x);
  return 1;
}

/* The next seq after k worth evaluating: inside some rank's recorded or
 * submitted range, where a rank stops, or where the others last saw a rank
 * without a dump. NONE when there is none. */
static long long next_candidate(const comm *c, long long k) {
  long long best = NONE;
  for (int r = 0; r < c->nranks; r++) {
    const dump *d = c->by_rank[r];
    long long cand[4] = {NONE, NONE, NONE, NONE};
    if (d) {
      long long end = d->next_seq + (long long)d->nqueued; /* one past its last submitted seq */
      if (d->ncoll && k + 1 >= d->lo && k + 1 < d->next_seq) cand[0] = k + 1;
      if (d->ncoll && d->lo > k) cand[1] = d->lo;
      if (k + 1 >= d->next_seq && k + 1 < end) cand[2] = k + 1;
      if (end > k) cand[3] = d->next_seq > k ? d->next_seq : end;
    } else if (c->view[r] != NONE && c->view[r] > k) {
      cand[0] = c->view[r];
    }
    for (int j = 0; j < 4; j++)
      if (cand[j] != NONE && (best == NONE || cand[j] < best)) best = cand[j];
  }
  return best;
}

/* First the fingerprints of every seq: the first mismatch is the verdict
 * (a failure or a stall after it is its consequence). Then, in seq order
 * and only before that mismatch, the first seq that some ranks never
 * launched, that failed, or that completed on some ranks only. */
void walk_collectives(comm *c) {
  long long end = 0;
  for (int r = 0; r < c->nranks; r++) {
    const dump *d = c->by_rank[r];
    long long e = d ? d->next_seq + (long long)d->nqueued : c->view[r] != NONE ? c->view[r] + 1 : 0;
    if (e > end) end = e;
  }
  long long mismatch = NONE;
  for (long long k = next_candidate(c, -1); k != NONE && k < end; k = next_candidate(c, k)) {
    at_seq s;
    at_seq_build(c, k, &s);
    if (s.ne >= 2 || (s.nn > 0 && s.ne + s.nl > 0)) {
      if (c->checked_lo == NONE) c->checked_lo = k;
      c->checked_hi = k;
    }
    if (mismatch == NONE && judge(c, &s, F_MISMATCH, seq_mismatch)) mismatch = k;
    at_seq_free(&s);
  }
  for (long long k = next_candidate(c, -1); k != NONE && k < end && (mismatch == NONE || k < mismatch);
       k = next_candidate(c, k)) {
    at_seq s;
    at_seq_build(c, k, &s);
    int found = judge(c, &s, F_NOT_REACHED, seq_not_reached) || judge(c, &s, F_FAILED, seq_failed) ||
                judge(c, &s, F_PARTIAL, seq_partial);
    at_seq_free(&s);
    if (found) break;
  }
}
