/*
 * ncfsm-trace's checker: the dumps of one communicator compared (check.c
 * runs the checks in order: check_coll.c the collectives by seq, check_p2p.c
 * each send with its receive), and the findings they make (findings.c),
 * which report.c prints.
 */
#ifndef NCFSM_TOOLS_TRACE_CHECK_H
#define NCFSM_TOOLS_TRACE_CHECK_H

#include "tools/trace/trace.h"

typedef enum fkind {
  F_NRANKS,
  F_MISMATCH,
  F_NOT_REACHED,
  F_FAILED,
  F_PARTIAL,
  F_HASH,
  F_P2P_MISMATCH,
  F_P2P_UNMATCHED,
  F_P2P_FAILED,
  F_P2P_PARTIAL,
  F_MISSING_DUMP,
  F_COUNT
} fkind;
extern const char *const fkind_names[F_COUNT];

typedef struct finding {
  fkind kind;
  char *text;   /* one line */
  char *detail; /* further lines for the text report ("" when none), each ending in \n */
  json_t *json; /* kind, text, and the finding's own members */
} finding;

typedef struct comm {
  char id[17];
  dump **d; /* dumps of this comm, sorted by rank */
  size_t nd;
  int nranks; /* -1 when the dumps disagree */
  finding *f;
  size_t nf;
  sbuf notes; /* text lines */
  json_t *jnotes;
  long long cmp_lo, cmp_hi;         /* seqs held by every present rank, NONE when none */
  long long checked_lo, checked_hi; /* seqs at which ranks were compared */
  size_t p2p_pairs;                 /* send/recv pairs compared */
  int hash_checked;                 /* ranks sharing next_seq had their hashes compared */
  long long max_next;               /* the highest next_seq among the dumps */
} comm;

/* Runs every check on c (its dumps sorted by rank): c->f gets the findings,
 * the first of which is the verdict. */
void analyse(comm *c);
void comm_free(comm *c);

/* ---- the checks (check_coll.c, check_p2p.c) ------------------------------------------- */
void walk_collectives(comm *c);
void walk_p2p(comm *c);
const dump *rank_dump(const comm *c, int rank); /* NULL when rank has no dump */

/* ---- findings (findings.c) ------------------------------------------------------------ */
/* Appends a finding (takes text, detail and extra: its members are added to
 * the finding's JSON object). */
finding *add_finding(comm *c, fkind k, char *text, char *detail, json_t *extra);
__attribute__((format(printf, 3, 4))) void add_note(comm *c, json_t *j, const char *fmt, ...);

/* "ALLREDUCE count 8 FLOAT32 redop SUM" (root and peer when there are). */
void sb_fingerprint(sbuf *b, const entry *e);
/* "COMPLETED NCFSM_OK"; "IN_FLIGHT, launched 6.000 s before the dump" for a
 * work that is not final, when the times allow. */
void sb_state(sbuf *b, const dump *d, const entry *e);
/* Every member of e (fsm/dump.def), and pending_ns for a work not final. */
json_t *entry_json(const dump *d, const entry *e);
const char *dump_state(const dump *d); /* the comm's state at the dump, NULL when absent */

/* Distinct values among some ranks, in the order of their lowest rank. */
typedef struct vgroup {
  long long v;
  int *r;
  size_t n;
} vgroup;
size_t group_values(const int *ranks, const long long *vals, size_t n, vgroup **out);
void free_groups(vgroup *g, size_t n);

#endif
