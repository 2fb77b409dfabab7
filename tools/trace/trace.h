/*
 * ncfsm-trace's model of a dump and the helpers every part uses: the
 * reader (reader.c) fills a `dump` from one JSON file, the checker
 * (check*.c) compares the dumps of one communicator, the reporter
 * (report.c) prints the verdict, ncfsm-trace.c is the main.
 *
 * The members of `dump` and `entry` that a file holds are generated from
 * fsm/dump.def, the schema the recorder writes: one field per member, of
 * the same name. The names of operations, dtypes, reduction ops and
 * results come from the X-macro lists of include/ncfsm/types.h and
 * result.h, those of work and communicator states from fsm/work.def and fsm/comm.def: the
 * tool does not link libncfsm.
 */
#ifndef NCFSM_TOOLS_TRACE_H
#define NCFSM_TOOLS_TRACE_H

#include <limits.h>
#include <stddef.h>

#include <jansson.h>

#include "fsm/dump.h"
#include "ncfsm/result.h"
#include "ncfsm/types.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define NONE LLONG_MIN /* "no value" for seqs, ranks and other integers */

/* ---- names ------------------------------------------------------------------------ */
/* A list of names and their values (value NULL: a name's value is its index). */
typedef struct namelist {
  const char *const *name;
  const int *value;
  size_t n;
} namelist;
extern const namelist names_opkind, names_dtype, names_redop, names_result, names_work_state,
    names_comm_state, names_backend, names_reason;
/* The list a `names` column of fsm/dump.def names (TRACE_NAMES_##names). */
#define TRACE_NAMES_NONE NULL
#define TRACE_NAMES_OPKIND (&names_opkind)
#define TRACE_NAMES_DTYPE (&names_dtype)
#define TRACE_NAMES_REDOP (&names_redop)
#define TRACE_NAMES_RESULT (&names_result)
#define TRACE_NAMES_WORK_STATE (&names_work_state)
#define TRACE_NAMES_COMM_STATE (&names_comm_state)
#define TRACE_NAMES_BACKEND (&names_backend)
#define TRACE_NAMES_REASON (&names_reason)

/* The name of value v in l; NULL when v is not one of its values. */
const char *name_of(const namelist *l, long long v);
const char *op_name(long long v);
const char *dtype_name(long long v);                 /* "?" when unknown */
const char *redop_name(long long v);                 /* "none" below 0 */
const char *result_name(long long v);                /* "not final" below 0 */
const char *work_state_name(long long v);            /* "?" when unknown */
const char *opt_name(const namelist *l, long long v); /* NULL for -1 (absent) */

/* ---- memory, strings, JSON ---------------------------------------------------------- */
/* Out of memory: a message and exit 2. */
void *xrealloc(void *p, size_t n);
void *xcalloc(size_t n, size_t size);
char *xstrdup(const char *s);
void check_json(const void *p); /* jansson returned NULL: out of memory */

/* A growing string. */
typedef struct sbuf {
  char *p;
  size_t len, cap;
} sbuf;
__attribute__((format(printf, 2, 3))) void sb_printf(sbuf *b, const char *fmt, ...);
char *sb_take(sbuf *b); /* the string (malloc'd; "" when empty); b is empty again */
/* "rank 3", "ranks 0,2", "ranks 0-5,7": ranks sorted ascending. */
void sb_ranks(sbuf *b, const int *r, size_t n);
/* "seq 4" or "seq 0..4". */
void sb_seqs(sbuf *b, long long lo, long long hi);

json_t *json_ranks(const int *r, size_t n);
json_t *jseq(long long s);            /* null for NONE */
json_t *jstr(const char *s);          /* non-UTF-8 bytes become '?' */
json_t *jstr_or_null(const char *s);  /* null for NULL */

/* ---- a dump ------------------------------------------------------------------------ */
/* The C type of each type of fsm/dump.def. */
#define TRACE_FIELD_STR(k) char *k;            /* NULL when absent or null */
#define TRACE_FIELD_INT(k) long long k;        /* NONE when absent or null */
#define TRACE_FIELD_RANK(k) int k;             /* always present */
#define TRACE_FIELD_HEX(k) char k[17];         /* lower case */
#define TRACE_FIELD_NAME(k) int k;             /* the name's value, -1 when absent or null */
#define TRACE_FIELD_TIME(k) long long k;       /* 0 when absent */
/* SEQS: n_k values (NONE for null), k NULL when absent; ENTRIES: n_k entries */
#define TRACE_FIELD_SEQS(k) long long *k; size_t n_##k;
#define TRACE_FIELD_ENTRIES(k) struct entry *k; size_t n_##k;

typedef struct entry {
#define NCFSM_DUMP_ENTRY(key, type, names, need, lo, hi) TRACE_FIELD_##type(key)
#include "fsm/dump.def"
} entry;

/* The sends to, or the receives from, one peer: entries sorted by seq. */
typedef struct chan {
  int peer;
  int dir; /* NCFSM_KIND_SEND or NCFSM_KIND_RECV */
  const entry **e;
  size_t n;
} chan;

typedef struct dump {
  char *path;
#define NCFSM_DUMP_TOP(key, type, names, need, lo, hi) TRACE_FIELD_##type(key)
#include "fsm/dump.def"
  /* derived */
  int wrapped;        /* total > number of entries: older records were overwritten */
  const entry **coll; /* launched collectives, sorted by seq (consecutive) */
  size_t ncoll;
  long long lo; /* seq of coll[0], NONE when ncoll == 0 */
  /* The collectives submitted after the last launched one that waited for
   * the other ranks (not final, or ended TIMED_OUT, ABORTED or MISMATCH
   * without a launch), in order: they would have taken next_seq,
   * next_seq + 1, ... (a work refused for itself, or failed in its group,
   * takes none) */
  const entry **queued;
  size_t nqueued;
  chan *chans;
  size_t nchans;
} dump;

static inline int is_coll(const entry *e) { return e->op != NCFSM_KIND_SEND && e->op != NCFSM_KIND_RECV; }
static inline int is_completed(const entry *e) { return e->result == NCFSM_OK; }
static inline int is_failed(const entry *e) { return e->result >= 0 && e->result != NCFSM_OK; }
static inline int is_pending(const entry *e) { return e->result < 0; }
/* A work never launched that waited for the other ranks (see dump.queued). */
static inline int is_waiting(const entry *e) {
  return is_pending(e) || e->result == NCFSM_ERR_TIMEOUT || e->result == NCFSM_ERR_ABORTED ||
         e->result == NCFSM_ERR_MISMATCH;
}
static inline long long last_seq(const dump *d) { return d->next_seq ? d->next_seq - 1 : NONE; }

/* ---- the reader (reader.c) ------------------------------------------------------------ */
/* Reads one file into *d (zeroed first); on failure prints "ncfsm-trace: PATH:
 * what" and returns -1 (*d is then to be freed all the same). */
int load_dump(const char *path, dump *d);
void dump_free(dump *d);

typedef struct strlist {
  char **v;
  size_t n;
} strlist;
void strlist_add(strlist *l, char *s);
/* Adds the files an argument names (a file, or a directory's ncfsm_fr_*.json,
 * sorted); -1 (message printed) on error. */
int add_input(strlist *files, const char *arg);

#endif
