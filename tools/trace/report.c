/*
 * ncfsm-trace's reporter: the verdict line, then per communicator its
 * findings, notes and ranks (text), or one JSON object (the schema of
 * docs/troubleshooting.md, "ncfsm-trace --json").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/trace/report.h"

/* What a consistent comm's dumps show, for its summary. */
static void sb_consistent(sbuf *b, const comm *c) {
  sbuf t = {0};
  long long ns = c->nd ? c->d[0]->next_seq : 0;
  if (ns == 0)
    sb_printf(&t, "no collective launched");
  else if (c->cmp_lo != NONE) {
    sb_seqs(&t, c->cmp_lo, c->cmp_hi);
    sb_printf(&t, " match%s on every rank", c->cmp_lo == c->cmp_hi ? "es" : "");
  } else
    sb_printf(&t, "the rings do not overlap, no fingerprint could be compared");
  if (c->hash_checked && ns > 0) sb_printf(&t, "; rolling hashes agree at next_seq %lld", ns);
  if (c->p2p_pairs) sb_printf(&t, "; %zu send/recv pair%s match", c->p2p_pairs, c->p2p_pairs == 1 ? "" : "s");
  sb_printf(b, "%s", t.p);
  free(t.p);
}

static void sb_comm_name(sbuf *b, const comm *c) {
  sb_printf(b, "comm %s", c->id);
  if (c->nd && c->d[0]->comm_name && *c->d[0]->comm_name) sb_printf(b, " \"%s\"", c->d[0]->comm_name);
}

static void sb_rank_line(sbuf *b, const dump *d) {
  const char *reason = opt_name(&names_reason, d->reason);
  sb_printf(b, "  rank %d: dump", d->rank);
  if (reason) sb_printf(b, " (%s)", reason);
  if (dump_state(d)) sb_printf(b, ", comm %s", dump_state(d));
  sb_printf(b, ", next_seq %lld", d->next_seq);
  if (d->ncoll) {
    sb_printf(b, ", ");
    sb_seqs(b, d->lo, d->next_seq - 1);
    sb_printf(b, " recorded");
  }
  sb_printf(b, ", %zu of %lld entries%s, hash %s", d->n_entries, d->capacity, d->wrapped ? " (wrapped)" : "",
            d->rolling_hash);
  if (d->host || d->pid != NONE) {
    sb_printf(b, ", ");
    if (d->host) sb_printf(b, "%s", d->host);
    if (d->pid != NONE) sb_printf(b, "%spid %lld", d->host ? " " : "", d->pid);
  }
  sb_printf(b, ": %s\n", d->path);
  if (d->failure && *d->failure) sb_printf(b, "    failure: \"%s\"\n", d->failure);
}

static json_t *rank_json(const dump *d) {
  json_t *o = json_pack(
      "{s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:I, s:s, s:I, s:I, s:I, s:b, "
      "s:o, s:o}",
      "rank", d->rank, "file", jstr(d->path), "reason", jstr_or_null(opt_name(&names_reason, d->reason)), "state",
      jstr_or_null(dump_state(d)), "failure", jstr_or_null(d->failure), "host", jstr_or_null(d->host), "pid",
      jseq(d->pid), "backend", jstr_or_null(opt_name(&names_backend, d->backend)), "nccl_version",
      jseq(d->nccl_version), "wall_time", jstr_or_null(d->wall_time), "time_ns", jseq(d->time_ns), "comm_name",
      jstr_or_null(d->comm_name), "next_seq", (json_int_t)d->next_seq, "rolling_hash", d->rolling_hash, "capacity",
      (json_int_t)d->capacity, "total", (json_int_t)d->total, "entries", (json_int_t)d->n_entries, "wrapped",
      d->wrapped, "first_seq", jseq(d->lo), "last_seq", jseq(d->ncoll ? d->next_seq - 1 : NONE));
  check_json(o);
  json_t *peers = d->peer_next_seq ? json_array() : json_null();
  check_json(peers);
  for (size_t i = 0; d->peer_next_seq && i < d->n_peer_next_seq; i++)
    json_array_append_new(peers, jseq(d->peer_next_seq[i]));
  json_object_set_new(o, "peer_next_seq", peers);
  return o;
}

/* The ranks that have a dump, ascending (malloc'd, c->nd of them). */
static int *present_ranks(const comm *c) {
  int *pr = xcalloc(c->nd, sizeof *pr);
  for (size_t j = 0; j < c->nd; j++) pr[j] = c->d[j]->rank;
  return pr;
}

static void print_json(const comm *comms, size_t ncomms, const strlist *files, const char *verdict,
                       char *const *summaries, int diverged) {
  json_t *out = json_pack("{s:s, s:i, s:s, s:o}", "format", "ncfsm-trace", "version", 1, "verdict",
                          diverged ? "diverged" : "consistent", "summary", jstr(verdict));
  check_json(out);
  json_t *jf = json_array();
  check_json(jf);
  for (size_t i = 0; i < files->n; i++) json_array_append_new(jf, jstr(files->v[i]));
  json_object_set_new(out, "files", jf);
  json_t *jc = json_array();
  check_json(jc);
  for (size_t i = 0; i < ncomms; i++) {
    const comm *c = &comms[i];
    int *pr = present_ranks(c);
    json_t *jm = json_array();
    check_json(jm);
    for (int k = 0; c->nranks > 0 && k < c->nranks; k++) {
      int seen = 0;
      for (size_t j = 0; j < c->nd; j++) seen |= pr[j] == k;
      if (!seen) json_array_append_new(jm, json_integer(k));
    }
    json_t *o = json_pack("{s:s, s:o, s:o, s:o, s:o, s:s, s:o}", "comm_id", c->id, "comm_name",
                          jstr_or_null(c->nd ? c->d[0]->comm_name : NULL), "nranks",
                          c->nranks < 0 ? json_null() : json_integer(c->nranks), "ranks_present",
                          json_ranks(pr, c->nd), "ranks_missing", jm, "verdict", c->nf ? "diverged" : "consistent",
                          "summary", jstr(summaries[i]));
    check_json(o);
    free(pr);
    json_object_set_new(o, "comparable",
                        c->cmp_lo == NONE ? json_null()
                                          : json_pack("{s:I, s:I}", "first_seq", (json_int_t)c->cmp_lo, "last_seq",
                                                      (json_int_t)c->cmp_hi));
    json_object_set_new(o, "checked",
                        c->checked_lo == NONE ? json_null()
                                              : json_pack("{s:I, s:I}", "first_seq", (json_int_t)c->checked_lo,
                                                          "last_seq", (json_int_t)c->checked_hi));
    json_t *jfs = json_array();
    check_json(jfs);
    for (size_t j = 0; j < c->nf; j++) json_array_append(jfs, c->f[j].json);
    json_object_set_new(o, "findings", jfs);
    json_object_set(o, "notes", c->jnotes);
    json_t *jr = json_array();
    check_json(jr);
    for (size_t j = 0; j < c->nd; j++) json_array_append_new(jr, rank_json(c->d[j]));
    json_object_set_new(o, "ranks", jr);
    json_array_append_new(jc, o);
  }
  json_object_set_new(out, "comms", jc);
  char *s = json_dumps(out, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  check_json(s);
  printf("%s\n", s);
  free(s);
  json_decref(out);
}

static void print_text(const comm *comms, size_t ncomms, const char *verdict, char *const *summaries) {
  sbuf o = {0};
  sb_printf(&o, "%s\n", verdict);
  for (size_t i = 0; i < ncomms; i++) {
    const comm *c = &comms[i];
    sb_printf(&o, "\n");
    sb_comm_name(&o, c);
    int *pr = present_ranks(c);
    if (c->nranks > 0)
      sb_printf(&o, ": nranks %d, dumps of ", c->nranks);
    else
      sb_printf(&o, ": dumps of ");
    sb_ranks(&o, pr, c->nd);
    free(pr);
    sb_printf(&o, "\n");
    if (!c->nf) sb_printf(&o, "  %s\n", summaries[i]);
    for (size_t j = 0; j < c->nf; j++) sb_printf(&o, "  %s\n%s", c->f[j].text, c->f[j].detail);
    if (c->cmp_lo != NONE) {
      int lost = 0;
      for (size_t j = 0; j < c->nd; j++) lost |= (c->d[j]->ncoll ? c->d[j]->lo : c->d[j]->next_seq) > 0;
      sb_printf(&o, "  ");
      sb_seqs(&o, c->cmp_lo, c->cmp_hi);
      sb_printf(&o, " %s on every rank%s\n", lost ? "comparable" : "recorded",
                (int)c->nd < c->nranks ? " with a dump" : "");
    } else if (c->nranks > 0 && c->nd > 1 && c->max_next > 0) {
      sb_printf(&o, "  no seq is recorded on every rank\n");
    }
    if (c->notes.len) sb_printf(&o, "%s", c->notes.p);
    for (size_t j = 0; j < c->nd; j++) sb_rank_line(&o, c->d[j]);
  }
  fputs(o.p, stdout);
  free(o.p);
}

/* The finding a comm's summary names: what differs across ranks (fingerprints of a collective
 * or of a send/recv pair, ranks that never launched an op) comes before what only happened on
 * some (failures, partial progress): a failure is often the consequence (the verification's
 * MISMATCH, a peer's NCFSM_ERR_PEER) of the difference that caused it. */
static size_t lead_finding(const comm *c) {
  static const int rank[F_COUNT] = {[F_NRANKS] = 0,        [F_MISMATCH] = 1,  [F_HASH] = 2,
                                    [F_P2P_MISMATCH] = 3,  [F_NOT_REACHED] = 4, [F_P2P_UNMATCHED] = 5,
                                    [F_FAILED] = 6,        [F_P2P_FAILED] = 7,  [F_PARTIAL] = 8,
                                    [F_P2P_PARTIAL] = 9,   [F_MISSING_DUMP] = 10};
  size_t best = 0;
  for (size_t j = 1; j < c->nf; j++)
    if (rank[c->f[j].kind] < rank[c->f[best].kind]) best = j;
  return best;
}

int report(const comm *comms, size_t ncomms, const strlist *files, int as_json) {
  size_t ndiverged = 0, first = 0;
  for (size_t i = 0; i < ncomms; i++)
    if (comms[i].nf && ndiverged++ == 0) first = i;
  /* the verdict line */
  sbuf v = {0};
  char **summaries = xcalloc(ncomms, sizeof *summaries);
  for (size_t i = 0; i < ncomms; i++) {
    if (comms[i].nf) {
      summaries[i] = xstrdup(comms[i].f[lead_finding(&comms[i])].text);
    } else {
      sbuf t = {0};
      sb_printf(&t, "consistent: ");
      sb_consistent(&t, &comms[i]);
      summaries[i] = sb_take(&t);
    }
  }
  if (ndiverged) {
    sb_printf(&v, "DIVERGED: ");
    sb_comm_name(&v, &comms[first]);
    sb_printf(&v, ": %s", summaries[first]);
    if (ndiverged > 1)
      sb_printf(&v, " (and %zu more communicator%s diverged)", ndiverged - 1, ndiverged == 2 ? "" : "s");
  } else if (ncomms == 1) {
    sb_printf(&v, "consistent: ");
    sb_comm_name(&v, &comms[0]);
    sb_printf(&v, ", %d rank%s: ", comms[0].nranks, comms[0].nranks == 1 ? "" : "s");
    sb_consistent(&v, &comms[0]);
  } else {
    sb_printf(&v, "consistent: %zu communicators, no divergence", ncomms);
  }
  if (as_json)
    print_json(comms, ncomms, files, v.p, summaries, ndiverged > 0);
  else
    print_text(comms, ncomms, v.p, summaries);
  free(v.p);
  for (size_t i = 0; i < ncomms; i++) free(summaries[i]);
  free(summaries);
  return ndiverged ? 1 : 0;
}
