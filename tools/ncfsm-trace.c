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
 *   2. the collectives are walked by seq across ranks; the first seq where
 *      the fingerprints differ (op, count, dtype, root, redop), where some
 *      ranks launched it and others never did, where it failed, or where it
 *      completed on some ranks and not on others, is the verdict;
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
 * The names of operations, dtypes, reduction ops and results come from the
 * X-macro lists of include/ncfsm/types.h and result.h, those of work and
 * communicator states from fsm/comm.def and fsm/work.def: the tool does not link libncfsm.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "ncfsm/result.h"
#include "ncfsm/types.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MAX_NRANKS (1 << 24)
#define DUMP_PREFIX "ncfsm_fr_"
#define DUMP_SUFFIX ".json"
#define FORMAT_NAME "ncfsm-flight-recorder"
#define FORMAT_VERSION 1
#define NONE LLONG_MIN /* "no value" for seqs and ranks */

/* ---- names ------------------------------------------------------------------ */
static const char *const op_names[] = {
#define X(name) #name,
    NCFSM_OPKIND_MAP(X)
#undef X
};
typedef struct named_value {
  const char *name;
  int value;
} named_value;
static const named_value dtype_names[] = {
#define X(name, v, size) {#name, v},
    NCFSM_DTYPE_MAP(X)
#undef X
};
static const named_value redop_names[] = {
#define X(name, v) {#name, v},
    NCFSM_REDOP_MAP(X)
#undef X
};
static const named_value result_names[] = {
#define X(name, v, msg) {"NCFSM_" #name, v},
    NCFSM_RESULT_MAP(X)
#undef X
};
static const char *const work_state_names[] = {
#define NCFSM_STATE(name, flags, desc) #name,
#include "fsm/work.def"
};
static const char *const comm_state_names[] = {
#define NCFSM_STATE(name, flags, desc) #name,
#include "fsm/comm.def"
};
static const char *const reason_names[] = {"error", "timeout", "request", "signal", "verify"};
static const char *const backend_names[] = {"nccl", "sim", "null"};
static const char *const field_names[] = {"op", "count", "dtype", "root", "redop"};
enum { FIELD_OP, FIELD_COUNT, FIELD_DTYPE, FIELD_ROOT, FIELD_REDOP, N_FIELDS };
_Static_assert(ARRAY_SIZE(field_names) == N_FIELDS, "field_names matches the FIELD_ enum");
_Static_assert(ARRAY_SIZE(op_names) == NCFSM_OPKIND_COUNT, "op_names matches ncfsm_opkind_t");

static const char *value_name(const named_value *t, size_t n, long long v) {
  for (size_t i = 0; i < n; i++)
    if (t[i].value == v) return t[i].name;
  return "?";
}
static const char *dtype_name(long long v) { return value_name(dtype_names, ARRAY_SIZE(dtype_names), v); }
static const char *redop_name(long long v) {
  return v < 0 ? "none" : value_name(redop_names, ARRAY_SIZE(redop_names), v);
}
static const char *result_name(int v) {
  return v < 0 ? "not final" : value_name(result_names, ARRAY_SIZE(result_names), v);
}

/* ---- small helpers ----------------------------------------------------------- */
static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) {
    fprintf(stderr, "ncfsm-trace: out of memory\n");
    exit(2);
  }
  return q;
}
static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) {
    fprintf(stderr, "ncfsm-trace: out of memory\n");
    exit(2);
  }
  return p;
}
static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = xrealloc(NULL, n);
  memcpy(p, s, n);
  return p;
}
static void check_json(const void *p) {
  if (!p) {
    fprintf(stderr, "ncfsm-trace: out of memory (jansson)\n");
    exit(2);
  }
}

/* A growing string. */
typedef struct sbuf {
  char *p;
  size_t len, cap;
} sbuf;

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...) {
  for (;;) {
    size_t room = b->cap - b->len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
      fprintf(stderr, "ncfsm-trace: formatting failed\n");
      exit(2);
    }
    if ((size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    b->cap = b->cap * 2 + (size_t)n + 64;
    b->p = xrealloc(b->p, b->cap);
  }
}
static char *sb_take(sbuf *b) {
  if (!b->p) return xstrdup("");
  char *p = b->p;
  b->p = NULL;
  b->len = b->cap = 0;
  return p;
}

/* "rank 3", "ranks 0,2", "ranks 0-5,7": ranks sorted ascending. */
static void sb_ranks(sbuf *b, const int *r, size_t n) {
  sb_printf(b, "rank%s ", n == 1 ? "" : "s");
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j + 1 < n && r[j + 1] == r[j] + 1) j++;
    if (j >= i + 2) {
      sb_printf(b, "%s%d-%d", i ? "," : "", r[i], r[j]);
      i = j + 1;
    } else {
      sb_printf(b, "%s%d", i ? "," : "", r[i]);
      i++;
    }
  }
}

static json_t *json_ranks(const int *r, size_t n) {
  json_t *a = json_array();
  check_json(a);
  for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(r[i]));
  return a;
}

static json_t *jseq(long long s) { return s == NONE ? json_null() : json_integer(s); }
/* A JSON string of s; bytes that are not ASCII become '?' when s is not
 * valid UTF-8 (a path given on the command line may not be). */
static json_t *jstr(const char *s) {
  json_t *j = json_string(s);
  if (!j) {
    char *t = xstrdup(s);
    for (char *p = t; *p; p++)
      if ((unsigned char)*p >= 0x80) *p = '?';
    j = json_string(t);
    free(t);
  }
  check_json(j);
  return j;
}
static json_t *jstr_or_null(const char *s) { return s ? jstr(s) : json_null(); }

/* ---- the dump model ---------------------------------------------------------------- */
typedef struct entry {
  long long id;
  long long seq; /* NONE: never launched */
  int op;        /* index into op_names */
  long long count;
  int dtype; /* ncfsm_dtype_t */
  int root;  /* -1: none */
  int redop; /* ncfsm_redop_t, -1: none */
  int peer;  /* -1: none */
  long long group;
  int state;    /* index into work_state_names */
  int result;   /* ncfsm_result_t, -1: not final (null) */
  char *stream; /* NULL when absent */
  long long t_submit, t_launch, t_final, t_complete;
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
  char comm_id[17];
  char *comm_name, *host, *backend, *reason, *wall_time, *state, *failure; /* NULL when absent */
  long long pid, nccl_version, time_ns;                                    /* NONE when absent */
  int rank, nranks;
  long long next_seq;
  char rolling_hash[17];
  long long capacity, total;
  entry *e;
  size_t n;
  /* derived */
  int wrapped;        /* total > number of entries: older records were overwritten */
  const entry **coll; /* launched collectives, sorted by seq (consecutive) */
  size_t ncoll;
  long long lo; /* seq of coll[0], NONE when ncoll == 0 */
  chan *chans;
  size_t nchans;
} dump;

static void dump_free(dump *d) {
  free(d->path);
  free(d->comm_name);
  free(d->host);
  free(d->backend);
  free(d->reason);
  free(d->wall_time);
  free(d->state);
  free(d->failure);
  for (size_t i = 0; i < d->n; i++) free(d->e[i].stream);
  free(d->e);
  free(d->coll);
  for (size_t i = 0; i < d->nchans; i++) free(d->chans[i].e);
  free(d->chans);
}

static int is_coll(const entry *e) { return e->op != NCFSM_KIND_SEND && e->op != NCFSM_KIND_RECV; }
static int is_completed(const entry *e) { return e->result == NCFSM_OK; }
static int is_failed(const entry *e) { return e->result >= 0 && e->result != NCFSM_OK; }
static int is_pending(const entry *e) { return e->result < 0; }

/* ---- parsing --------------------------------------------------------------------- */
/* Every parse function fills err (the path is added by the caller) and
 * returns -1 on the first problem. */
typedef struct perr {
  char msg[600];
} perr;

__attribute__((format(printf, 2, 3))) static int fail(perr *pe, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pe->msg, sizeof pe->msg, fmt, ap);
  va_end(ap);
  return -1;
}

static const char *json_type_text(const json_t *v) {
  switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
  }
  return "?";
}

/* An integer member in [min, max]; NONE in *out when absent or null and not required. */
static int get_int(perr *pe, const json_t *o, const char *ctx, const char *key, int required, int nullable,
                   long long min, long long max, long long *out) {
  const json_t *v = json_object_get(o, key);
  *out = NONE;
  if (!v || json_is_null(v)) {
    if (!v && required) return fail(pe, "%s%s'%s' is missing", ctx, *ctx ? ": " : "", key);
    if (v && !nullable) return fail(pe, "%s%s'%s' is null, expected an integer", ctx, *ctx ? ": " : "", key);
    return 0;
  }
  if (!json_is_integer(v))
    return fail(pe, "%s%s'%s' is %s, expected an integer", ctx, *ctx ? ": " : "", key, json_type_text(v));
  long long x = json_integer_value(v);
  if (x < min || x > max)
    return fail(pe, "%s%s'%s' is %lld, expected %lld..%lld", ctx, *ctx ? ": " : "", key, x, min, max);
  *out = x;
  return 0;
}

/* A string member; NULL in *out when absent or null and allowed. */
static int get_str(perr *pe, const json_t *o, const char *ctx, const char *key, int required, int nullable,
                   const char **out) {
  const json_t *v = json_object_get(o, key);
  *out = NULL;
  if (!v || json_is_null(v)) {
    if (!v && required) return fail(pe, "%s%s'%s' is missing", ctx, *ctx ? ": " : "", key);
    if (v && !nullable) return fail(pe, "%s%s'%s' is null, expected a string", ctx, *ctx ? ": " : "", key);
    return 0;
  }
  if (!json_is_string(v))
    return fail(pe, "%s%s'%s' is %s, expected a string", ctx, *ctx ? ": " : "", key, json_type_text(v));
  *out = json_string_value(v);
  return 0;
}

static int get_hex16(perr *pe, const json_t *o, const char *ctx, const char *key, char out[17]) {
  const char *s;
  if (get_str(pe, o, ctx, key, 1, 0, &s) < 0) return -1;
  size_t n = strlen(s);
  int ok = n == 16;
  for (size_t i = 0; ok && i < n; i++) ok = isxdigit((unsigned char)s[i]) != 0;
  if (!ok) return fail(pe, "%s%s'%s' is \"%.40s\", expected 16 hex digits", ctx, *ctx ? ": " : "", key, s);
  for (size_t i = 0; i < 16; i++) out[i] = (char)tolower((unsigned char)s[i]);
  out[16] = '\0';
  return 0;
}

static void list_names(sbuf *b, const char *const *names, size_t n) {
  for (size_t i = 0; i < n; i++) sb_printf(b, "%s%s", i ? ", " : "", names[i]);
}

/* A string member that must be one of names; its index in *out (-1 for null when nullable). */
static int get_choice(perr *pe, const json_t *o, const char *ctx, const char *key, int required, int nullable,
                      const char *const *names, size_t n, int *out) {
  const char *s;
  *out = -1;
  if (get_str(pe, o, ctx, key, required, nullable, &s) < 0) return -1;
  if (!s) return 0;
  for (size_t i = 0; i < n; i++)
    if (strcmp(s, names[i]) == 0) {
      *out = (int)i;
      return 0;
    }
  sbuf b = {0};
  list_names(&b, names, n);
  fail(pe, "%s%s'%s' is \"%.40s\", not one of %s", ctx, *ctx ? ": " : "", key, s, b.p);
  free(b.p);
  return -1;
}

static int get_named(perr *pe, const json_t *o, const char *ctx, const char *key, int nullable, const named_value *t,
                     size_t n, int *out) {
  const char *names[64];
  if (n > ARRAY_SIZE(names)) return fail(pe, "internal: name table too long");
  for (size_t i = 0; i < n; i++) names[i] = t[i].name;
  int idx;
  if (get_choice(pe, o, ctx, key, 1, nullable, names, n, &idx) < 0) return -1;
  *out = idx < 0 ? -1 : t[idx].value;
  return 0;
}

static void set_opt_str(char **dst, const char *s) { *dst = s ? xstrdup(s) : NULL; }

static int parse_entry(perr *pe, const json_t *je, size_t i, int nranks, entry *e) {
  char ctx[64];
  long long v;
  snprintf(ctx, sizeof ctx, "entries[%zu]", i);
  if (!json_is_object(je)) return fail(pe, "%s is %s, expected an object", ctx, json_type_text(je));
  if (get_int(pe, je, ctx, "id", 1, 0, 0, LLONG_MAX, &e->id) < 0) return -1;
  snprintf(ctx, sizeof ctx, "entries[%zu] (id %lld)", i, e->id);
  if (get_int(pe, je, ctx, "seq", 1, 1, 0, LLONG_MAX - 1, &e->seq) < 0) return -1;
  if (get_choice(pe, je, ctx, "op", 1, 0, op_names, ARRAY_SIZE(op_names), &e->op) < 0) return -1;
  if (get_int(pe, je, ctx, "count", 1, 0, 0, LLONG_MAX, &e->count) < 0) return -1;
  if (get_named(pe, je, ctx, "dtype", 0, dtype_names, ARRAY_SIZE(dtype_names), &e->dtype) < 0) return -1;
  if (get_int(pe, je, ctx, "root", 1, 0, -1, nranks - 1, &v) < 0) return -1;
  e->root = (int)v;
  if (get_named(pe, je, ctx, "redop", 1, redop_names, ARRAY_SIZE(redop_names), &e->redop) < 0) return -1;
  if (get_int(pe, je, ctx, "peer", 1, 0, -1, nranks - 1, &v) < 0) return -1;
  e->peer = (int)v;
  if (get_int(pe, je, ctx, "group", 1, 0, 0, LLONG_MAX, &e->group) < 0) return -1;
  if (get_choice(pe, je, ctx, "state", 1, 0, work_state_names, ARRAY_SIZE(work_state_names), &e->state) < 0) return -1;
  if (get_named(pe, je, ctx, "result", 1, result_names, ARRAY_SIZE(result_names), &e->result) < 0) return -1;
  const char *s;
  if (get_str(pe, je, ctx, "stream", 0, 1, &s) < 0) return -1;
  set_opt_str(&e->stream, s);
  long long *t[] = {&e->t_submit, &e->t_launch, &e->t_final, &e->t_complete};
  const char *tk[] = {"t_submit_ns", "t_launch_ns", "t_final_ns", "t_complete_ns"};
  for (size_t k = 0; k < ARRAY_SIZE(t); k++) {
    if (get_int(pe, je, ctx, tk[k], 0, 0, 0, LLONG_MAX, t[k]) < 0) return -1;
    if (*t[k] == NONE) *t[k] = 0;
  }
  int p2p = !is_coll(e);
  if (p2p && e->peer < 0) return fail(pe, "%s: %s has peer -1, expected the peer's rank", ctx, op_names[e->op]);
  if (!p2p && e->peer >= 0)
    return fail(pe, "%s: %s has peer %d, expected -1 (collectives have no peer)", ctx, op_names[e->op], e->peer);
  return 0;
}

static int cmp_entry_seq(const void *a, const void *b) {
  const entry *x = *(const entry *const *)a, *y = *(const entry *const *)b;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}
static int cmp_entry_chan(const void *a, const void *b) {
  const entry *x = *(const entry *const *)a, *y = *(const entry *const *)b;
  if (x->peer != y->peer) return x->peer < y->peer ? -1 : 1;
  if (x->op != y->op) return x->op < y->op ? -1 : 1;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Checks that sorted seqs are consecutive, and start at 0 when the ring did
 * not wrap. why: what the seqs count, added to the message (p2p: per peer and
 * direction, which the pairing by seq relies on). */
static int check_consecutive(perr *pe, const dump *d, const entry *const *e, size_t n, const char *what,
                             const char *why) {
  for (size_t i = 1; i < n; i++) {
    if (e[i]->seq == e[i - 1]->seq)
      return fail(pe, "%s seq %lld is recorded twice (entries id %lld and %lld)", what, e[i]->seq, e[i - 1]->id,
                  e[i]->id);
    if (e[i]->seq != e[i - 1]->seq + 1)
      return fail(pe, "%s seq jumps from %lld to %lld (entries id %lld and %lld): a launched work is missing%s", what,
                  e[i - 1]->seq, e[i]->seq, e[i - 1]->id, e[i]->id, why);
  }
  if (n && !d->wrapped && e[0]->seq != 0)
    return fail(pe,
                "%s start at seq %lld (entry id %lld) although the ring did not wrap (total = %zu entries): "
                "seq 0..%lld are missing%s",
                what, e[0]->seq, e[0]->id, d->n, e[0]->seq - 1, why);
  return 0;
}

/* The derived views: collectives by seq, per-peer channels. */
static int index_dump(perr *pe, dump *d) {
  d->coll = xcalloc(d->n, sizeof *d->coll);
  const entry **p2p = xcalloc(d->n, sizeof *p2p);
  size_t np2p = 0;
  for (size_t i = 0; i < d->n; i++) {
    if (d->e[i].seq == NONE) continue;
    if (is_coll(&d->e[i]))
      d->coll[d->ncoll++] = &d->e[i];
    else
      p2p[np2p++] = &d->e[i];
  }
  qsort(d->coll, d->ncoll, sizeof *d->coll, cmp_entry_seq);
  int rc = check_consecutive(pe, d, d->coll, d->ncoll, "collectives", "");
  if (rc == 0 && d->ncoll && d->coll[d->ncoll - 1]->seq != d->next_seq - 1)
    rc = fail(pe, "the last launched collective has seq %lld (entry id %lld) but next_seq is %lld: expected seq %lld",
              d->coll[d->ncoll - 1]->seq, d->coll[d->ncoll - 1]->id, d->next_seq, d->next_seq - 1);
  if (rc == 0 && !d->ncoll && !d->wrapped && d->next_seq > 0)
    rc = fail(pe, "next_seq is %lld but the ring, which did not wrap, holds no launched collective", d->next_seq);
  d->lo = d->ncoll ? d->coll[0]->seq : NONE;
  qsort(p2p, np2p, sizeof *p2p, cmp_entry_chan);
  for (size_t i = 0; rc == 0 && i < np2p;) {
    size_t j = i;
    while (j < np2p && p2p[j]->peer == p2p[i]->peer && p2p[j]->op == p2p[i]->op) j++;
    d->chans = xrealloc(d->chans, (d->nchans + 1) * sizeof *d->chans);
    chan *c = &d->chans[d->nchans++];
    c->peer = p2p[i]->peer;
    c->dir = p2p[i]->op;
    c->n = j - i;
    c->e = xcalloc(c->n, sizeof *c->e);
    memcpy(c->e, p2p + i, c->n * sizeof *c->e);
    char what[64];
    snprintf(what, sizeof what, "%s %s rank %d:", op_names[c->dir], c->dir == NCFSM_KIND_SEND ? "to" : "from", c->peer);
    rc = check_consecutive(pe, d, c->e, c->n, what,
                           " (the sends to a peer and the receives from it are numbered separately, each from 0: "
                           "the k-th SEND from r to p pairs with the k-th RECV on p from r)");
    i = j;
  }
  free(p2p);
  return rc;
}

static int parse_dump(perr *pe, const json_t *root, dump *d) {
  long long v;
  const char *s;
  int idx;
  if (!json_is_object(root)) return fail(pe, "the top level is %s, expected an object", json_type_text(root));
  if (get_str(pe, root, "", "format", 1, 0, &s) < 0) {
    char why[sizeof pe->msg];
    memcpy(why, pe->msg, sizeof why);
    return fail(pe, "not an ncfsm flight recorder dump: %s (expected \"format\": \"%s\")", why, FORMAT_NAME);
  }
  if (strcmp(s, FORMAT_NAME) != 0)
    return fail(pe, "not an ncfsm flight recorder dump: 'format' is \"%.60s\", expected \"%s\"", s, FORMAT_NAME);
  if (get_int(pe, root, "", "version", 1, 0, LLONG_MIN + 1, LLONG_MAX, &v) < 0) return -1;
  if (v != FORMAT_VERSION)
    return fail(pe, "dump format version %lld: this ncfsm-trace reads version %d", v, FORMAT_VERSION);
  if (get_hex16(pe, root, "", "comm_id", d->comm_id) < 0) return -1;
  if (get_int(pe, root, "", "nranks", 1, 0, 1, MAX_NRANKS, &v) < 0) return -1;
  d->nranks = (int)v;
  if (get_int(pe, root, "", "rank", 1, 0, 0, LLONG_MAX, &v) < 0) return -1;
  if (v >= d->nranks) return fail(pe, "'rank' is %lld, expected 0..%d ('nranks' is %d)", v, d->nranks - 1, d->nranks);
  d->rank = (int)v;
  struct {
    const char *key;
    char **dst;
    const char *const *choices;
    size_t n;
  } strs[] = {
      {"comm_name", &d->comm_name, NULL, 0},
      {"host", &d->host, NULL, 0},
      {"wall_time", &d->wall_time, NULL, 0},
      {"failure", &d->failure, NULL, 0},
      {"backend", &d->backend, backend_names, ARRAY_SIZE(backend_names)},
      {"reason", &d->reason, reason_names, ARRAY_SIZE(reason_names)},
      {"state", &d->state, comm_state_names, ARRAY_SIZE(comm_state_names)},
  };
  for (size_t i = 0; i < ARRAY_SIZE(strs); i++) {
    if (strs[i].choices) {
      if (get_choice(pe, root, "", strs[i].key, 0, 1, strs[i].choices, strs[i].n, &idx) < 0) return -1;
      set_opt_str(strs[i].dst, idx < 0 ? NULL : strs[i].choices[idx]);
    } else {
      if (get_str(pe, root, "", strs[i].key, 0, 1, &s) < 0) return -1;
      set_opt_str(strs[i].dst, s);
    }
  }
  if (get_int(pe, root, "", "pid", 0, 1, 0, LLONG_MAX, &d->pid) < 0) return -1;
  if (get_int(pe, root, "", "nccl_version", 0, 1, 0, LLONG_MAX, &d->nccl_version) < 0) return -1;
  if (get_int(pe, root, "", "time_ns", 0, 1, 0, LLONG_MAX, &d->time_ns) < 0) return -1;
  if (get_int(pe, root, "", "next_seq", 1, 0, 0, LLONG_MAX, &d->next_seq) < 0) return -1;
  if (get_hex16(pe, root, "", "rolling_hash", d->rolling_hash) < 0) return -1;
  if (get_int(pe, root, "", "capacity", 1, 0, 1, LLONG_MAX, &d->capacity) < 0) return -1;
  if (get_int(pe, root, "", "total", 1, 0, 0, LLONG_MAX, &d->total) < 0) return -1;
  const json_t *ents = json_object_get(root, "entries");
  if (!ents) return fail(pe, "'entries' is missing");
  if (!json_is_array(ents)) return fail(pe, "'entries' is %s, expected an array", json_type_text(ents));
  size_t n = json_array_size(ents);
  if ((long long)n > d->capacity) return fail(pe, "'entries' holds %zu entries but 'capacity' is %lld", n, d->capacity);
  if ((long long)n > d->total) return fail(pe, "'entries' holds %zu entries but 'total' is %lld", n, d->total);
  if ((long long)n < d->total && (long long)n != d->capacity)
    return fail(pe, "'total' is %lld (the ring wrapped) but 'entries' holds %zu of its %lld entries", d->total, n,
                d->capacity);
  d->wrapped = d->total > (long long)n;
  d->e = xcalloc(n, sizeof *d->e);
  for (size_t i = 0; i < n; i++) {
    d->n = i + 1;
    if (parse_entry(pe, json_array_get(ents, i), i, d->nranks, &d->e[i]) < 0) return -1;
    long long want = d->total - (long long)n + (long long)i;
    if (d->e[i].id != want)
      return fail(pe,
                  "entries[%zu] has id %lld, expected %lld (ids are consecutive and the first is total - "
                  "number of entries)",
                  i, d->e[i].id, want);
    if (d->e[i].seq != NONE && is_coll(&d->e[i]) && d->e[i].seq >= d->next_seq)
      return fail(pe, "entries[%zu] (id %lld) has seq %lld but next_seq is %lld", i, d->e[i].id, d->e[i].seq,
                  d->next_seq);
  }
  d->n = n;
  return index_dump(pe, d);
}

/* The comm id and rank that a file name of the form ncfsm_fr_<id>_r<rank>.json
 * states; 0 when the name has another form. */
static int name_says(const char *path, char id[17], long long *rank) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t n = strlen(base), pl = strlen(DUMP_PREFIX), sl = strlen(DUMP_SUFFIX);
  if (n < pl + 16 + 2 + 1 + sl || strncmp(base, DUMP_PREFIX, pl) != 0 || strcmp(base + n - sl, DUMP_SUFFIX) != 0)
    return 0;
  const char *p = base + pl;
  for (int i = 0; i < 16; i++) {
    if (!isxdigit((unsigned char)p[i])) return 0;
    id[i] = (char)tolower((unsigned char)p[i]);
  }
  id[16] = '\0';
  if (p[16] != '_' || p[17] != 'r') return 0;
  long long r = 0;
  const char *q = p + 18;
  if (!isdigit((unsigned char)*q)) return 0;
  while (isdigit((unsigned char)*q)) {
    if (r > MAX_NRANKS) return 0;
    r = r * 10 + (*q++ - '0');
  }
  if (strcmp(q, DUMP_SUFFIX) != 0) return 0;
  *rank = r;
  return 1;
}

/* Reads one file; on failure prints "ncfsm-trace: PATH: what" and returns -1. */
static int load_dump(const char *path, dump *d) {
  memset(d, 0, sizeof *d);
  d->path = xstrdup(path);
  json_error_t je;
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    if (je.line < 0)
      fprintf(stderr, "ncfsm-trace: %s: %s\n", path, je.text);
    else
      fprintf(stderr, "ncfsm-trace: %s: not valid JSON: %s (line %d, column %d)\n", path, je.text, je.line, je.column);
    return -1;
  }
  perr pe = {{0}};
  int rc = parse_dump(&pe, root, d);
  json_decref(root);
  if (rc < 0) {
    fprintf(stderr, "ncfsm-trace: %s: %s\n", path, pe.msg);
    return -1;
  }
  char id[17];
  long long r;
  if (name_says(path, id, &r) && (strcmp(id, d->comm_id) != 0 || r != d->rank)) {
    fprintf(stderr, "ncfsm-trace: %s: the file name says comm %s rank %lld but the dump is comm %s rank %d\n", path, id,
            r, d->comm_id, d->rank);
    return -1;
  }
  return 0;
}

/* ---- inputs ---------------------------------------------------------------------- */
typedef struct strlist {
  char **v;
  size_t n;
} strlist;

static void strlist_add(strlist *l, char *s) {
  l->v = xrealloc(l->v, (l->n + 1) * sizeof *l->v);
  l->v[l->n++] = s;
}
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int is_dump_name(const char *name) {
  size_t n = strlen(name), pl = strlen(DUMP_PREFIX), sl = strlen(DUMP_SUFFIX);
  return n > pl + sl && strncmp(name, DUMP_PREFIX, pl) == 0 && strcmp(name + n - sl, DUMP_SUFFIX) == 0;
}

/* Adds the files an argument names; -1 (message printed) on error. */
static int add_input(strlist *files, const char *arg) {
  struct stat st;
  if (stat(arg, &st) != 0) {
    fprintf(stderr, "ncfsm-trace: %s: %s\n", arg, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    if (!S_ISREG(st.st_mode)) {
      fprintf(stderr, "ncfsm-trace: %s: not a regular file or directory\n", arg);
      return -1;
    }
    strlist_add(files, xstrdup(arg));
    return 0;
  }
  DIR *dir = opendir(arg);
  if (!dir) {
    fprintf(stderr, "ncfsm-trace: %s: cannot open the directory: %s\n", arg, strerror(errno));
    return -1;
  }
  strlist found = {0};
  struct dirent *de;
  while ((de = readdir(dir)) != NULL) {
    if (!is_dump_name(de->d_name)) continue;
    sbuf p = {0};
    size_t al = strlen(arg);
    sb_printf(&p, "%s%s%s", arg, al && arg[al - 1] == '/' ? "" : "/", de->d_name);
    strlist_add(&found, sb_take(&p));
  }
  closedir(dir);
  if (!found.n) {
    fprintf(stderr, "ncfsm-trace: %s: no flight recorder dumps (" DUMP_PREFIX "*" DUMP_SUFFIX ") in this directory\n",
            arg);
    free(found.v);
    return -1;
  }
  qsort(found.v, found.n, sizeof *found.v, cmp_str);
  for (size_t i = 0; i < found.n; i++) strlist_add(files, found.v[i]);
  free(found.v);
  return 0;
}

/* ---- findings ---------------------------------------------------------------------- */
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
} fkind;
static const char *const fkind_names[] = {
    "nranks_mismatch", "mismatch",      "not_reached", "failed",      "partial",      "hash_mismatch",
    "p2p_mismatch",    "p2p_unmatched", "p2p_failed",  "p2p_partial", "missing_dump",
};
_Static_assert(ARRAY_SIZE(fkind_names) == F_MISSING_DUMP + 1, "fkind_names matches fkind");

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

static finding *add_finding(comm *c, fkind k, char *text, char *detail, json_t *extra) {
  c->f = xrealloc(c->f, (c->nf + 1) * sizeof *c->f);
  finding *f = &c->f[c->nf++];
  f->kind = k;
  f->text = text;
  f->detail = detail ? detail : xstrdup("");
  f->json = json_object();
  check_json(f->json);
  json_object_set_new(f->json, "kind", json_string(fkind_names[k]));
  json_object_set_new(f->json, "text", jstr(text));
  if (extra) {
    json_object_update(f->json, extra);
    json_decref(extra);
  }
  return f;
}

static void sb_fingerprint(sbuf *b, const entry *e) {
  sb_printf(b, "%s count %lld %s", op_names[e->op], e->count, dtype_name(e->dtype));
  if (e->root >= 0) sb_printf(b, " root %d", e->root);
  if (e->redop >= 0) sb_printf(b, " redop %s", redop_name(e->redop));
  if (e->peer >= 0) sb_printf(b, " peer %d", e->peer);
}

/* "COMPLETED NCFSM_OK"; "IN_FLIGHT, launched 6.000 s before the dump" for a
 * work that is not final, when the times allow. */
static void sb_state(sbuf *b, const dump *d, const entry *e) {
  sb_printf(b, "%s", work_state_names[e->state]);
  if (!is_pending(e)) sb_printf(b, " %s", result_name(e->result));
  if (is_pending(e) && d->time_ns != NONE) {
    long long since = e->t_launch ? e->t_launch : e->t_submit;
    if (since && d->time_ns >= since)
      sb_printf(b, ", %s %.3f s before the dump", e->t_launch ? "launched" : "submitted",
                (double)(d->time_ns - since) / 1e9);
  }
}

/* "seq 4" or "seq 0..4". */
static void sb_seqs(sbuf *b, long long lo, long long hi) {
  if (lo == hi)
    sb_printf(b, "seq %lld", lo);
  else
    sb_printf(b, "seq %lld..%lld", lo, hi);
}

static json_t *entry_json(const dump *d, const entry *e) {
  json_t *o = json_pack(
      "{s:I, s:o, s:s, s:I, s:s, s:i, s:o, s:i, s:I, s:s, s:o, s:o, s:I, s:I, s:I, s:I}", "id", (json_int_t)e->id,
      "seq", jseq(e->seq), "op", op_names[e->op], "count", (json_int_t)e->count, "dtype", dtype_name(e->dtype), "root",
      e->root, "redop", e->redop < 0 ? json_null() : json_string(redop_name(e->redop)), "peer", e->peer, "group",
      (json_int_t)e->group, "state", work_state_names[e->state], "result",
      e->result < 0 ? json_null() : json_string(result_name(e->result)), "stream", jstr_or_null(e->stream),
      "t_submit_ns", (json_int_t)e->t_submit, "t_launch_ns", (json_int_t)e->t_launch, "t_final_ns",
      (json_int_t)e->t_final, "t_complete_ns", (json_int_t)e->t_complete);
  check_json(o);
  if (is_pending(e) && d->time_ns != NONE) {
    long long since = e->t_launch ? e->t_launch : e->t_submit;
    if (since && d->time_ns >= since) json_object_set_new(o, "pending_ns", json_integer(d->time_ns - since));
  }
  return o;
}

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

static long long last_seq(const dump *d) { return d->next_seq ? d->next_seq - 1 : NONE; }

/* The works of a rank that were submitted after its last launched collective
 * and never launched (seq null): why a rank did not reach a seq. */
static void unlaunched_after(const dump *d, sbuf *b, json_t *arr) {
  long long after = d->ncoll ? d->coll[d->ncoll - 1]->id : -1;
  size_t shown = 0, n = 0;
  for (size_t i = 0; i < d->n; i++) {
    const entry *e = &d->e[i];
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
    if (d->state) sb_printf(b, "; comm %s", d->state);
    sb_printf(b, "\n");
    json_array_append_new(arr, o);
  }
  *jout = arr;
}

/* Distinct values among some ranks, in the order of their lowest rank. */
typedef struct vgroup {
  long long v;
  int *r;
  size_t n;
} vgroup;

static size_t group_values(const int *ranks, const long long *vals, size_t n, vgroup **out) {
  vgroup *g = xcalloc(n, sizeof *g);
  size_t ng = 0;
  for (size_t i = 0; i < n; i++) {
    size_t j = 0;
    while (j < ng && g[j].v != vals[i]) j++;
    if (j == ng) {
      g[ng].v = vals[i];
      g[ng].r = xcalloc(n, sizeof *g[ng].r);
      ng++;
    }
    g[j].r[g[j].n++] = ranks[i];
  }
  *out = g;
  return ng;
}
static void free_groups(vgroup *g, size_t n) {
  for (size_t i = 0; i < n; i++) free(g[i].r);
  free(g);
}

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
    case FIELD_OP: sb_printf(b, "%s", op_names[v]); break;
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
    case FIELD_OP: return json_string(op_names[v]);
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
      sb_printf(&t, " launched %s", op_names[ee[0]->op]);
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
      sb_printf(&t, ": %s", op_names[ee[0]->op]);
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
            jf, json_pack("{s:i, s:s, s:s, s:o}", "rank", er[i], "state", work_state_names[ee[i]->state], "result",
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
      sb_printf(&t, "seq %lld: partial progress: %s completed on ", k, op_names[ee[0]->op]);
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
        sb_printf(&t, "%s", work_state_names[g[i].v]);
      }
      free_groups(g, ng);
      sb_printf(&t, ")");
      json_t *jp = json_array();
      check_json(jp);
      for (size_t i = 0; i < ne; i++)
        if (is_pending(ee[i]))
          json_array_append_new(jp, json_pack("{s:i, s:s}", "rank", er[i], "state", work_state_names[ee[i]->state]));
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

static void walk_collectives(comm *c) {
  for (size_t i = 0; i < c->nd; i++)
    if (c->d[i]->next_seq > c->max_next) c->max_next = c->d[i]->next_seq;
  for (long long k = next_candidate(c, -1); k != NONE && k < c->max_next; k = next_candidate(c, k))
    if (check_seq(c, k)) return;
}

/* Ranks with the same next_seq must have the same rolling hash. */
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

/* ---- send/recv ------------------------------------------------------------------------ */
static const dump *rank_dump(const comm *c, int rank) {
  for (size_t i = 0; i < c->nd; i++)
    if (c->d[i]->rank == rank) return c->d[i];
  return NULL;
}
static const chan *find_chan(const dump *d, int peer, int dir) {
  for (size_t i = 0; d && i < d->nchans; i++)
    if (d->chans[i].peer == peer && d->chans[i].dir == dir) return &d->chans[i];
  return NULL;
}

typedef enum side_kind { SIDE_ENTRY, SIDE_LOST, SIDE_ABSENT } side_kind;
static side_kind side_at(const dump *d, const chan *ch, long long s, const entry **e) {
  *e = NULL;
  if (ch && ch->n && s >= ch->e[0]->seq && s <= ch->e[ch->n - 1]->seq) {
    *e = ch->e[s - ch->e[0]->seq];
    return SIDE_ENTRY;
  }
  if (d->wrapped && (!ch || !ch->n || s < ch->e[0]->seq)) return SIDE_LOST;
  return SIDE_ABSENT;
}

static json_t *side_json(const dump *d, const entry *e) {
  json_t *o = json_pack("{s:i}", "rank", d->rank);
  check_json(o);
  json_object_set_new(o, "entry", e ? entry_json(d, e) : json_null());
  return o;
}

static void sb_side(sbuf *b, const dump *d, const entry *e) {
  sb_printf(b, "%s on rank %d ", op_names[e->op], d->rank);
  sb_state(b, d, e);
}

/* Pairs the sends src->dst with the receives on dst from src; adds a finding
 * at the first problem. */
static void check_channel(comm *c, const dump *src, const dump *dst) {
  const chan *S = find_chan(src, dst->rank, NCFSM_KIND_SEND), *R = find_chan(dst, src->rank, NCFSM_KIND_RECV);
  long long from = NONE, to = NONE;
  const chan *both[2] = {S, R};
  for (int i = 0; i < 2; i++) {
    if (!both[i] || !both[i]->n) continue;
    long long lo = both[i]->e[0]->seq, hi = both[i]->e[both[i]->n - 1]->seq;
    if (from == NONE || lo < from) from = lo;
    if (to == NONE || hi > to) to = hi;
  }
  if (from == NONE) return;
  for (long long s = from; s <= to; s++) {
    const entry *se, *re;
    side_kind sk = side_at(src, S, s, &se), rk = side_at(dst, R, s, &re);
    sbuf t = {0}, det = {0};
    fkind k;
    const char *field = NULL;
    if (sk == SIDE_ENTRY && rk == SIDE_ENTRY) {
      c->p2p_pairs++;
      if (se->count != re->count || se->dtype != re->dtype) {
        k = F_P2P_MISMATCH;
        field = se->count != re->count ? "count" : "dtype";
        sb_printf(&t, "send %d->%d seq %lld: %s mismatch: SEND on rank %d ", src->rank, dst->rank, s, field, src->rank);
        if (se->count != re->count)
          sb_printf(&t, "count %lld", se->count);
        else
          sb_printf(&t, "%s", dtype_name(se->dtype));
        sb_printf(&t, ", RECV on rank %d ", dst->rank);
        if (se->count != re->count)
          sb_printf(&t, "count %lld", re->count);
        else
          sb_printf(&t, "%s", dtype_name(re->dtype));
        if (se->count != re->count && se->dtype != re->dtype)
          sb_printf(&det, "    also differ: dtype (SEND %s, RECV %s)\n", dtype_name(se->dtype), dtype_name(re->dtype));
      } else if (is_failed(se) || is_failed(re)) {
        k = F_P2P_FAILED;
        sb_printf(&t, "send %d->%d seq %lld: failed: ", src->rank, dst->rank, s);
        if (is_failed(se)) sb_side(&t, src, se);
        if (is_failed(se) && is_failed(re)) sb_printf(&t, ", ");
        if (is_failed(re)) sb_side(&t, dst, re);
        if (!is_failed(se)) sb_printf(&t, " (SEND on rank %d %s)", src->rank, work_state_names[se->state]);
        if (!is_failed(re)) sb_printf(&t, " (RECV on rank %d %s)", dst->rank, work_state_names[re->state]);
        const dump *dd[2] = {src, dst};
        const entry *ee[2] = {se, re};
        for (int i = 0; i < 2; i++)
          if (is_failed(ee[i]) && dd[i]->failure && *dd[i]->failure)
            sb_printf(&det, "    cause on rank %d: \"%s\"\n", dd[i]->rank, dd[i]->failure);
      } else if (is_completed(se) != is_completed(re)) {
        k = F_P2P_PARTIAL;
        sb_printf(&t, "send %d->%d seq %lld: partial progress: ", src->rank, dst->rank, s);
        sb_side(&t, src, se);
        sb_printf(&t, ", ");
        sb_side(&t, dst, re);
      } else {
        continue;
      }
    } else if ((sk == SIDE_ENTRY && rk == SIDE_ABSENT) || (sk == SIDE_ABSENT && rk == SIDE_ENTRY)) {
      k = F_P2P_UNMATCHED;
      int send_side = sk == SIDE_ENTRY;
      const dump *have = send_side ? src : dst, *lack = send_side ? dst : src;
      const chan *lc = send_side ? R : S;
      const entry *e = send_side ? se : re;
      sb_printf(&t, "send %d->%d seq %lld: %s on rank %d (", src->rank, dst->rank, s, op_names[e->op], have->rank);
      sb_fingerprint(&t, e);
      sb_printf(&t, ", ");
      sb_state(&t, have, e);
      sb_printf(&t, ") has no matching %s on rank %d (", send_side ? "RECV" : "SEND", lack->rank);
      if (lc && lc->n)
        sb_printf(&t, "its last %s %s rank %d: seq %lld)", send_side ? "RECV" : "SEND", send_side ? "from" : "to",
                  have->rank, lc->e[lc->n - 1]->seq);
      else
        sb_printf(&t, "it posted no %s %s rank %d)", send_side ? "RECV" : "SEND", send_side ? "from" : "to",
                  have->rank);
    } else {
      continue;
    }
    json_t *x = json_pack("{s:I, s:i, s:i, s:o, s:o}", "seq", (json_int_t)s, "src", src->rank, "dst", dst->rank, "send",
                          side_json(src, se), "recv", side_json(dst, re));
    check_json(x);
    if (field) json_object_set_new(x, "field", json_string(field));
    add_finding(c, k, sb_take(&t), sb_take(&det), x);
    free(t.p);
    free(det.p);
    return;
  }
}

static void walk_p2p(comm *c) {
  for (size_t i = 0; i < c->nd; i++) {
    const dump *a = c->d[i];
    for (size_t j = 0; j < a->nchans; j++) {
      const chan *ch = &a->chans[j];
      const dump *b = rank_dump(c, ch->peer);
      if (!b) continue; /* the peer's dump is missing: reported as missing_dump */
      if (ch->dir == NCFSM_KIND_SEND)
        check_channel(c, a, b);
      else if (!find_chan(b, a->rank, NCFSM_KIND_SEND))
        check_channel(c, b, a); /* receives with no send at all */
    }
  }
}

/* ---- one communicator ------------------------------------------------------------------- */
static void add_note(comm *c, json_t *j, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add_note(comm *c, json_t *j, const char *fmt, ...) {
  char line[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  sb_printf(&c->notes, "  note: %s\n", line);
  json_object_set_new(j, "text", jstr(line));
  json_array_append_new(c->jnotes, j);
}

static void analyse(comm *c) {
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
    sb_printf(&t, "the rings hold no seq in common");
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
  sb_printf(b, "  rank %d: dump", d->rank);
  if (d->reason) sb_printf(b, " (%s)", d->reason);
  if (d->state) sb_printf(b, ", comm %s", d->state);
  sb_printf(b, ", next_seq %lld", d->next_seq);
  if (d->ncoll) {
    sb_printf(b, ", ");
    sb_seqs(b, d->lo, d->next_seq - 1);
    sb_printf(b, " recorded");
  }
  sb_printf(b, ", %zu of %lld entries%s, hash %s", d->n, d->capacity, d->wrapped ? " (wrapped)" : "", d->rolling_hash);
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
      "rank", d->rank, "file", jstr(d->path), "reason", jstr_or_null(d->reason), "state", jstr_or_null(d->state),
      "failure", jstr_or_null(d->failure), "host", jstr_or_null(d->host), "pid", jseq(d->pid), "backend",
      jstr_or_null(d->backend), "nccl_version", jseq(d->nccl_version), "wall_time", jstr_or_null(d->wall_time),
      "time_ns", jseq(d->time_ns), "comm_name", jstr_or_null(d->comm_name), "next_seq", (json_int_t)d->next_seq,
      "rolling_hash", d->rolling_hash, "capacity", (json_int_t)d->capacity, "total", (json_int_t)d->total, "entries",
      (json_int_t)d->n, "wrapped", d->wrapped, "first_seq", jseq(d->lo), "last_seq",
      jseq(d->ncoll ? d->next_seq - 1 : NONE));
  check_json(o);
  return o;
}

/* ---- main -------------------------------------------------------------------------------- */
static void usage(FILE *f) {
  fprintf(f,
          "usage: ncfsm-trace [--json] [--comm ID] DIR|FILE...\n"
          "  Reads ncfsm flight recorder dumps (DIR: its " DUMP_PREFIX "*" DUMP_SUFFIX
          " files) of all ranks and names\n"
          "  the first divergence per communicator: a fingerprint mismatch (op, count, dtype,\n"
          "  root, redop), ranks that never reached a seq, failed works, partial progress,\n"
          "  rolling-hash mismatches, unmatched or mismatched send/recv, missing dumps.\n"
          "  --json     one JSON object instead of text (schema: docs/troubleshooting.md)\n"
          "  --comm ID  only the communicator with this comm_id (16 hex digits)\n"
          "  exit status: 0 consistent, 1 a problem found, 2 usage, I/O or format error\n");
}

static int cmp_dump_rank(const void *a, const void *b) {
  const dump *x = *(const dump *const *)a, *y = *(const dump *const *)b;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static int cmp_comm(const void *a, const void *b) { return strcmp(((const comm *)a)->id, ((const comm *)b)->id); }

int main(int argc, char **argv) {
  int as_json = 0;
  const char *want_comm = NULL;
  char want_id[17] = "";
  strlist args = {0};
  int only_files = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (only_files || a[0] != '-' || strcmp(a, "-") == 0) {
      strlist_add(&args, (char *)a);
    } else if (strcmp(a, "--") == 0) {
      only_files = 1;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      free(args.v);
      return 0;
    } else if (strcmp(a, "--json") == 0) {
      as_json = 1;
    } else if (strcmp(a, "--comm") == 0) {
      if (i + 1 >= argc) {
        fprintf(stderr, "ncfsm-trace: --comm needs a value\n");
        usage(stderr);
        free(args.v);
        return 2;
      }
      want_comm = argv[++i];
      size_t n = strlen(want_comm);
      int ok = n == 16;
      for (size_t k = 0; ok && k < n; k++) ok = isxdigit((unsigned char)want_comm[k]) != 0;
      if (!ok) {
        fprintf(stderr, "ncfsm-trace: --comm '%s': expected a comm_id of 16 hex digits\n", want_comm);
        free(args.v);
        return 2;
      }
      for (size_t k = 0; k < 16; k++) want_id[k] = (char)tolower((unsigned char)want_comm[k]);
      want_id[16] = '\0';
    } else {
      fprintf(stderr, "ncfsm-trace: unknown argument '%s'\n", a);
      usage(stderr);
      free(args.v);
      return 2;
    }
  }
  if (!args.n) {
    fprintf(stderr, "ncfsm-trace: no dump files or directories given\n");
    usage(stderr);
    free(args.v);
    return 2;
  }

  int rc = 0;
  strlist files = {0};
  for (size_t i = 0; i < args.n; i++)
    if (add_input(&files, args.v[i]) < 0) rc = 2;
  free(args.v);
  dump *dumps = xcalloc(files.n, sizeof *dumps);
  size_t bad = 0;
  for (size_t i = 0; i < files.n; i++)
    if (load_dump(files.v[i], &dumps[i]) < 0) bad++;
  if (bad) {
    fprintf(stderr, "ncfsm-trace: %zu of %zu file%s %s not a valid flight recorder dump: nothing analysed\n", bad,
            files.n, files.n == 1 ? "" : "s", bad == 1 ? "is" : "are");
    rc = 2;
  }

  /* group by comm */
  comm *comms = NULL;
  size_t ncomms = 0;
  if (rc == 0) {
    for (size_t i = 0; i < files.n; i++) {
      dump *d = &dumps[i];
      if (want_comm && strcmp(d->comm_id, want_id) != 0) continue;
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
    if (want_comm && ncomms == 0 && rc == 0) {
      fprintf(stderr, "ncfsm-trace: no dump of comm %s among the %zu file%s; comms present:", want_id, files.n,
              files.n == 1 ? "" : "s");
      for (size_t i = 0; i < files.n; i++) {
        int seen = 0;
        for (size_t j = 0; j < i; j++) seen |= strcmp(dumps[j].comm_id, dumps[i].comm_id) == 0;
        if (!seen) fprintf(stderr, " %s", dumps[i].comm_id);
      }
      fprintf(stderr, "\n");
      rc = 2;
    }
  }

  if (rc == 0) {
    qsort(comms, ncomms, sizeof *comms, cmp_comm);
    size_t ndiverged = 0, first = 0;
    for (size_t i = 0; i < ncomms; i++) {
      qsort(comms[i].d, comms[i].nd, sizeof *comms[i].d, cmp_dump_rank);
      analyse(&comms[i]);
      if (comms[i].nf && ndiverged++ == 0) first = i;
    }
    /* the verdict line */
    sbuf v = {0};
    char **summaries = xcalloc(ncomms, sizeof *summaries);
    for (size_t i = 0; i < ncomms; i++) {
      if (comms[i].nf) {
        summaries[i] = xstrdup(comms[i].f[0].text);
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
    rc = ndiverged ? 1 : 0;

    if (as_json) {
      json_t *out = json_pack("{s:s, s:i, s:s, s:o}", "format", "ncfsm-trace", "version", 1, "verdict",
                              ndiverged ? "diverged" : "consistent", "summary", jstr(v.p));
      check_json(out);
      json_t *jf = json_array();
      check_json(jf);
      for (size_t i = 0; i < files.n; i++) json_array_append_new(jf, jstr(files.v[i]));
      json_object_set_new(out, "files", jf);
      json_t *jc = json_array();
      check_json(jc);
      for (size_t i = 0; i < ncomms; i++) {
        comm *c = &comms[i];
        int *pr = xcalloc(c->nd, sizeof *pr);
        for (size_t j = 0; j < c->nd; j++) pr[j] = c->d[j]->rank;
        json_t *jm = json_array();
        check_json(jm);
        for (int k = 0; c->nranks > 0 && k < c->nranks; k++) {
          int seen = 0;
          for (size_t j = 0; j < c->nd; j++) seen |= pr[j] == k;
          if (!seen) json_array_append_new(jm, json_integer(k));
        }
        json_t *o =
            json_pack("{s:s, s:o, s:o, s:o, s:o, s:s, s:o}", "comm_id", c->id, "comm_name",
                      jstr_or_null(c->nd ? c->d[0]->comm_name : NULL), "nranks",
                      c->nranks < 0 ? json_null() : json_integer(c->nranks), "ranks_present", json_ranks(pr, c->nd),
                      "ranks_missing", jm, "verdict", c->nf ? "diverged" : "consistent", "summary", jstr(summaries[i]));
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
    } else {
      sbuf o = {0};
      sb_printf(&o, "%s\n", v.p);
      for (size_t i = 0; i < ncomms; i++) {
        comm *c = &comms[i];
        sb_printf(&o, "\n");
        sb_comm_name(&o, c);
        int *pr = xcalloc(c->nd, sizeof *pr);
        for (size_t j = 0; j < c->nd; j++) pr[j] = c->d[j]->rank;
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
    free(v.p);
    for (size_t i = 0; i < ncomms; i++) free(summaries[i]);
    free(summaries);
  }
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "ncfsm-trace: writing the report failed: %s\n", strerror(errno));
    rc = 2;
  }

  for (size_t i = 0; i < ncomms; i++) {
    comm *c = &comms[i];
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
  free(comms);
  for (size_t i = 0; i < files.n; i++) {
    dump_free(&dumps[i]);
    free(files.v[i]);
  }
  free(dumps);
  free(files.v);
  return rc;
}
