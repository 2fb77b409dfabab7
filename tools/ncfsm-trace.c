/*
 * ncfsm-trace: reads the flight recorder dumps of all ranks (JSON, version 1;
 * docs/troubleshooting.md, "The dumps it reads") and names the first place
 * where the ranks diverge.
 *
 *   ncfsm-trace [--json] [--comm ID] DIR|FILE...
 *
 * A DIR contributes its files named ncfsm_fr_*.json; a FILE is read whatever
 * its name. The dumps are grouped by comm_id; for each communicator:
 *   1. the ranks agree on nranks, and every rank has a dump;
 *   2. the collectives are walked by seq across ranks, those launched and
 *      those submitted that waited for the others: the first seq where the
 *      fingerprints differ (op, count, dtype, root, redop) is the verdict;
 *      then, before it (or anywhere without one), the first seq where some
 *      ranks launched it and others never did (each with its last seq; a
 *      rank without a dump as the others' peer_next_seq saw it), where it
 *      failed, or where it completed on some ranks and not on others;
 *   3. ranks with the same next_seq must have the same rolling_hash: this
 *      covers the history that rings which wrapped no longer hold;
 *   4. every SEND r->p with per-peer seq s pairs with the RECV on p from r
 *      with seq s (count, dtype, progress).
 * Output: the verdict line, then details per communicator and rank (text);
 * --json prints one object instead (schema in docs/troubleshooting.md).
 * Exit status: 0 consistent, 1 a problem found, 2 usage, I/O or format
 * errors (every unreadable file is named with what is wrong; nothing is
 * analysed then).
 *
 * The parts: tools/trace/reader.c (the dumps), check*.c (the analysis),
 * report.c (the output); this file is the command line.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/trace/report.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: ncfsm-trace [--json] [--comm ID] DIR|FILE...\n"
          "  Reads ncfsm flight recorder dumps (DIR: its " NCFSM_DUMP_PREFIX "*" NCFSM_DUMP_SUFFIX
          " files) of all ranks and names\n"
          "  the first divergence per communicator: a fingerprint mismatch (op, count, dtype,\n"
          "  root, redop: every seq is compared first), ranks that never reached a seq (with\n"
          "  the last seq each reached), failed works, partial progress, rolling-hash\n"
          "  mismatches, unmatched or mismatched send/recv, missing dumps; and which seqs\n"
          "  each rank's ring holds when they differ.\n"
          "  --json     one JSON object instead of text (schema: docs/troubleshooting.md)\n"
          "  --comm ID  only the communicator with this comm_id (16 hex digits)\n"
          "  exit status: 0 consistent, 1 a problem found, 2 usage, I/O or format error\n");
}

typedef struct options {
  int as_json;
  int want_comm;     /* --comm given */
  char want_id[17];  /* its id, lower case */
  strlist args;      /* DIR|FILE arguments (argv's strings) */
} options;

/* -1: run; otherwise the exit status (help printed, or a usage error). */
static int parse_args(int argc, char **argv, options *o) {
  int only_files = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (only_files || a[0] != '-' || strcmp(a, "-") == 0) {
      strlist_add(&o->args, (char *)a);
    } else if (strcmp(a, "--") == 0) {
      only_files = 1;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--json") == 0) {
      o->as_json = 1;
    } else if (strcmp(a, "--comm") == 0) {
      if (i + 1 >= argc) {
        fprintf(stderr, "ncfsm-trace: --comm needs a value\n");
        usage(stderr);
        return 2;
      }
      const char *id = argv[++i];
      size_t n = strlen(id);
      int ok = n == 16;
      for (size_t k = 0; ok && k < n; k++) ok = isxdigit((unsigned char)id[k]) != 0;
      if (!ok) {
        fprintf(stderr, "ncfsm-trace: --comm '%s': expected a comm_id of 16 hex digits\n", id);
        return 2;
      }
      for (size_t k = 0; k < 16; k++) o->want_id[k] = (char)tolower((unsigned char)id[k]);
      o->want_id[16] = '\0';
      o->want_comm = 1;
    } else {
      fprintf(stderr, "ncfsm-trace: unknown argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (!o->args.n) {
    fprintf(stderr, "ncfsm-trace: no dump files or directories given\n");
    usage(stderr);
    return 2;
  }
  return -1;
}

static int cmp_dump_rank(const void *a, const void *b) {
  const dump *x = *(const dump *const *)a, *y = *(const dump *const *)b;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}
static int cmp_comm(const void *a, const void *b) { return strcmp(((const comm *)a)->id, ((const comm *)b)->id); }

/* Groups the dumps by comm (only the wanted one with --comm), each comm's
 * dumps sorted by rank and the comms by id; 0, or 2 (message printed) when
 * two dumps are the same rank or --comm matches none. */
static int group_comms(dump *dumps, size_t n, const options *o, comm **out, size_t *nout) {
  comm *comms = NULL;
  size_t ncomms = 0;
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    dump *d = &dumps[i];
    if (o->want_comm && strcmp(d->comm_id, o->want_id) != 0) continue;
    size_t k = 0;
    while (k < ncomms && strcmp(comms[k].id, d->comm_id) != 0) k++;
    if (k == ncomms) {
      comms = xrealloc(comms, (ncomms + 1) * sizeof *comms);
      memset(&comms[ncomms], 0, sizeof *comms);
      memcpy(comms[ncomms].id, d->comm_id, sizeof comms[ncomms].id);
      ncomms++;
    }
    comm *c = &comms[k];
    for (size_t j = 0; j < c->nd; j++)
      if (c->d[j]->rank == d->rank) {
        fprintf(stderr, "ncfsm-trace: %s and %s are both rank %d of comm %s: pass one dump per rank\n", c->d[j]->path,
                d->path, d->rank, d->comm_id);
        rc = 2;
      }
    c->d = xrealloc(c->d, (c->nd + 1) * sizeof *c->d);
    c->d[c->nd++] = d;
  }
  if (o->want_comm && ncomms == 0 && rc == 0) {
    fprintf(stderr, "ncfsm-trace: no dump of comm %s among the %zu file%s; comms present:", o->want_id, n,
            n == 1 ? "" : "s");
    for (size_t i = 0; i < n; i++) {
      int seen = 0;
      for (size_t j = 0; j < i; j++) seen |= strcmp(dumps[j].comm_id, dumps[i].comm_id) == 0;
      if (!seen) fprintf(stderr, " %s", dumps[i].comm_id);
    }
    fprintf(stderr, "\n");
    rc = 2;
  }
  if (ncomms) qsort(comms, ncomms, sizeof *comms, cmp_comm);
  for (size_t i = 0; i < ncomms; i++) qsort(comms[i].d, comms[i].nd, sizeof *comms[i].d, cmp_dump_rank);
  *out = comms;
  *nout = ncomms;
  return rc;
}

int main(int argc, char **argv) {
  options o = {0};
  int rc = parse_args(argc, argv, &o);
  if (rc >= 0) {
    free(o.args.v);
    return rc;
  }
  rc = 0;
  strlist files = {0};
  for (size_t i = 0; i < o.args.n; i++)
    if (add_input(&files, o.args.v[i]) < 0) rc = 2;
  free(o.args.v);
  dump *dumps = xcalloc(files.n, sizeof *dumps);
  size_t bad = 0;
  for (size_t i = 0; i < files.n; i++)
    if (load_dump(files.v[i], &dumps[i]) < 0) bad++;
  if (bad) {
    fprintf(stderr, "ncfsm-trace: %zu of %zu file%s %s not a valid flight recorder dump: nothing analysed\n", bad,
            files.n, files.n == 1 ? "" : "s", bad == 1 ? "is" : "are");
    rc = 2;
  }
  comm *comms = NULL;
  size_t ncomms = 0;
  if (rc == 0) rc = group_comms(dumps, files.n, &o, &comms, &ncomms);
  if (rc == 0) {
    for (size_t i = 0; i < ncomms; i++) analyse(&comms[i]);
    rc = report(comms, ncomms, &files, o.as_json);
  }
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "ncfsm-trace: writing the report failed: %s\n", strerror(errno));
    rc = 2;
  }
  for (size_t i = 0; i < ncomms; i++) comm_free(&comms[i]);
  free(comms);
  for (size_t i = 0; i < files.n; i++) {
    dump_free(&dumps[i]);
    free(files.v[i]);
  }
  free(dumps);
  free(files.v);
  return rc;
}
