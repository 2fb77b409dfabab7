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
  /* by rank (nranks of each, set once nranks is known): the rank's dump or
   * NULL; for a rank without a dump, its next_seq as the other ranks last
   * learned it (the largest of their peer_next_seq, NONE when none says),
   * and the rank that said so */
  const dump **by_rank;
  long long *view;
  int *view_from;
} comm;

/* Runs every check on c (its dumps sorted by rank): c->f gets the findings,
 * the first of which is the verdict. */
void analyse(comm *c);
void comm_free(comm *c);

/* ---- the checks (check_coll.c, check_p2p.c) ------------------------------------------- */
void walk_collectives(comm *c);
void walk_p2p(comm *c);
const dump *rank_dump(const comm *c, int rank); /* NULL when rank has no dump */

/* What each rank shows at one seq k of the collective walk (check_coll.c
 * builds it, check_seq.c judges it). Ranks ascending in each list. */
typedef struct at_seq {
  long long k;
  /* the ranks that hold an entry for k: launched, or (sub[i]) submitted and
   * never launched (dump.queued) */
  int *er;
  const entry **ee;
  const dump **ed;
  int *sub;
  size_t ne;
  int *lr; /* launched it, but the record is lost */
  size_t nl;
  /* never launched it: last[i] is the rank's last seq (NONE: none); from[i]
   * is -1 when its own dump says so, else the rank whose peer_next_seq does
   * (the rank has no dump) */
  int *nr;
  long long *last;
  int *from;
  size_t nn;
} at_seq;

/* Each returns 1 and fills t (the finding's line), det (further lines) and
 * *x (its JSON members) when seq s->k shows that divergence. */
int seq_mismatch(const comm *c, const at_seq *s, sbuf *t, sbuf *det, json_t **x);
int seq_not_reached(const comm *c, const at_seq *s, sbuf *t, sbuf *det, json_t **x);
int seq_failed(const comm *c, const at_seq *s, sbuf *t, sbuf *det, json_t **x);
int seq_partial(const comm *c, const at_seq *s, sbuf *t, sbuf *det, json_t **x);

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
