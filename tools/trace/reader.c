/*
 * ncfsm-trace's reader: one JSON flight recorder dump (fsm/dump.h, members
 * in fsm/dump.def) into a `dump`, every member checked against the schema
 * (type, range, names, presence), then the views the checker walks (the
 * collectives by seq, the sends and receives per peer); and the list of
 * files the arguments name.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tools/trace/trace.h"

/* ---- checked members ----------------------------------------------------------------- */
/* Every parse function fills pe (the path is added by the caller) and
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

/* The member key of o, or NULL when it is absent or null and that is
 * allowed; -1 when it is not. what: "an integer", "a string", ... */
static int member(perr *pe, const json_t *o, const char *ctx, const char *key, int required, int nullable,
                  const char *what, const json_t **out) {
  const json_t *v = json_object_get(o, key);
  *out = NULL;
  if (!v || json_is_null(v)) {
    if (!v && required) return fail(pe, "%s%s'%s' is missing", ctx, *ctx ? ": " : "", key);
    if (v && !nullable) return fail(pe, "%s%s'%s' is null, expected %s", ctx, *ctx ? ": " : "", key, what);
    return 0;
  }
  *out = v;
  return 0;
}

/* An integer member in [min, max]; NONE in *out when absent or null and allowed. */
static int get_int(perr *pe, const json_t *o, const char *ctx, const char *key, int required, int nullable,
                   long long min, long long max, long long *out) {
  const json_t *v;
  *out = NONE;
  if (member(pe, o, ctx, key, required, nullable, "an integer", &v) < 0) return -1;
  if (!v) return 0;
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
  const json_t *v;
  *out = NULL;
  if (member(pe, o, ctx, key, required, nullable, "a string", &v) < 0) return -1;
  if (!v) return 0;
  if (!json_is_string(v))
    return fail(pe, "%s%s'%s' is %s, expected a string", ctx, *ctx ? ": " : "", key, json_type_text(v));
  *out = json_string_value(v);
  return 0;
}

static int get_hex16(perr *pe, const json_t *o, const char *ctx, const char *key, int required, int nullable,
                     char out[17]) {
  const char *s;
  out[0] = '\0';
  if (get_str(pe, o, ctx, key, required, nullable, &s) < 0) return -1;
  if (!s) return 0;
  size_t n = strlen(s);
  int ok = n == 16;
  for (size_t i = 0; ok && i < n; i++) ok = isxdigit((unsigned char)s[i]) != 0;
  if (!ok) return fail(pe, "%s%s'%s' is \"%.40s\", expected 16 hex digits", ctx, *ctx ? ": " : "", key, s);
  for (size_t i = 0; i < 16; i++) out[i] = (char)tolower((unsigned char)s[i]);
  out[16] = '\0';
  return 0;
}

/* A string member that must be one of l's names; its value in *out (-1
 * when absent or null and allowed). */
static int get_name(perr *pe, const json_t *o, const char *ctx, const char *key, int required, int nullable,
                    const namelist *l, int *out) {
  const char *s;
  *out = -1;
  if (get_str(pe, o, ctx, key, required, nullable, &s) < 0) return -1;
  if (!s) return 0;
  for (size_t i = 0; i < l->n; i++)
    if (strcmp(s, l->name[i]) == 0) {
      *out = l->value ? l->value[i] : (int)i;
      return 0;
    }
  sbuf b = {0};
  for (size_t i = 0; i < l->n; i++) sb_printf(&b, "%s%s", i ? ", " : "", l->name[i]);
  fail(pe, "%s%s'%s' is \"%.40s\", not one of %s", ctx, *ctx ? ": " : "", key, s, b.p);
  free(b.p);
  return -1;
}

/* An array of n integers in [min, max] or null (NONE); *out NULL when absent or null and allowed. */
static int get_seqs(perr *pe, const json_t *o, const char *ctx, const char *key, int required, int nullable,
                    long long min, long long max, size_t n, long long **out, size_t *nout) {
  const json_t *v;
  *out = NULL;
  *nout = 0;
  if (member(pe, o, ctx, key, required, nullable, "an array", &v) < 0) return -1;
  if (!v) return 0;
  if (!json_is_array(v))
    return fail(pe, "%s%s'%s' is %s, expected an array", ctx, *ctx ? ": " : "", key, json_type_text(v));
  if (json_array_size(v) != n)
    return fail(pe, "%s%s'%s' holds %zu values, expected %zu (one per rank)", ctx, *ctx ? ": " : "", key,
                json_array_size(v), n);
  long long *a = xcalloc(n, sizeof *a);
  for (size_t i = 0; i < n; i++) {
    const json_t *x = json_array_get(v, i);
    if (json_is_null(x)) {
      a[i] = NONE;
    } else if (!json_is_integer(x) || json_integer_value(x) < min || json_integer_value(x) > max) {
      free(a);
      if (!json_is_integer(x))
        return fail(pe, "%s%s'%s'[%zu] is %s, expected an integer or null", ctx, *ctx ? ": " : "", key, i,
                    json_type_text(x));
      return fail(pe, "%s%s'%s'[%zu] is %lld, expected %lld..%lld", ctx, *ctx ? ": " : "", key, i,
                  (long long)json_integer_value(x), min, max);
    } else {
      a[i] = json_integer_value(x);
    }
  }
  *out = a;
  *nout = n;
  return 0;
}

/* The schema's columns as the calls above take them. */
#define NEED_REQ 1, 0
#define NEED_NULLABLE 1, 1
#define NEED_OPT 0, 1
/* One member of object o into s->key; ctx names the object in messages. */
#define READ_STR(o, ctx, s, key, names, need, lo, hi)                              \
  {                                                                                \
    const char *v_;                                                                \
    if (get_str(pe, o, ctx, #key, NEED_##need, &v_) < 0) return -1;                \
    (s)->key = v_ ? xstrdup(v_) : NULL;                                            \
  }
#define READ_INT(o, ctx, s, key, names, need, lo, hi) \
  if (get_int(pe, o, ctx, #key, NEED_##need, lo, hi, &(s)->key) < 0) return -1;
#define READ_RANK(o, ctx, s, key, names, need, lo, hi)                             \
  {                                                                                \
    long long v_;                                                                  \
    if (get_int(pe, o, ctx, #key, NEED_##need, lo, hi, &v_) < 0) return -1;        \
    (s)->key = v_ == NONE ? INT_MIN : (int)v_;                                     \
  }
#define READ_HEX(o, ctx, s, key, names, need, lo, hi) \
  if (get_hex16(pe, o, ctx, #key, NEED_##need, (s)->key) < 0) return -1;
#define READ_NAME(o, ctx, s, key, names, need, lo, hi) \
  if (get_name(pe, o, ctx, #key, NEED_##need, TRACE_NAMES_##names, &(s)->key) < 0) return -1;
/* a time may be absent (0), never null */
#define READ_TIME(o, ctx, s, key, names, need, lo, hi)                           \
  if (get_int(pe, o, ctx, #key, 0, 0, 0, LLONG_MAX, &(s)->key) < 0) return -1; \
  if ((s)->key == NONE) (s)->key = 0;
#define READ_SEQS(o, ctx, s, key, names, need, lo, hi) \
  if (get_seqs(pe, o, ctx, #key, NEED_##need, lo, hi, (size_t)NRANKS, &(s)->key, &(s)->n_##key) < 0) return -1;
#define READ_ENTRIES(o, ctx, s, key, names, need, lo, hi) /* parse_entries, after the other members */

/* ---- one entry ---------------------------------------------------------------------------- */
static int parse_entry(perr *pe, const json_t *je, size_t i, int nranks, entry *e) {
#define NRANKS nranks
  char ctx[64];
  snprintf(ctx, sizeof ctx, "entries[%zu]", i);
  if (!json_is_object(je)) return fail(pe, "%s is %s, expected an object", ctx, json_type_text(je));
  /* id comes first: the messages of the other members name it */
#define NCFSM_DUMP_ENTRY(key, type, names, need, lo, hi) \
  READ_##type(je, ctx, e, key, names, need, lo, hi);     \
  snprintf(ctx, sizeof ctx, "entries[%zu] (id %lld)", i, e->id);
#include "fsm/dump.def"
#undef NRANKS
  int p2p = !is_coll(e);
  if (p2p && e->peer < 0) return fail(pe, "%s: %s has peer -1, expected the peer's rank", ctx, op_name(e->op));
  if (!p2p && e->peer >= 0)
    return fail(pe, "%s: %s has peer %d, expected -1 (collectives have no peer)", ctx, op_name(e->op), e->peer);
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
                what, e[0]->seq, e[0]->id, d->n_entries, e[0]->seq - 1, why);
  return 0;
}

/* The derived views: collectives by seq, per-peer channels. */
static int index_dump(perr *pe, dump *d) {
  d->coll = xcalloc(d->n_entries, sizeof *d->coll);
  const entry **p2p = xcalloc(d->n_entries, sizeof *p2p);
  size_t np2p = 0;
  for (size_t i = 0; i < d->n_entries; i++) {
    if (d->entries[i].seq == NONE) continue;
    if (is_coll(&d->entries[i]))
      d->coll[d->ncoll++] = &d->entries[i];
    else
      p2p[np2p++] = &d->entries[i];
  }
  qsort(d->coll, d->ncoll, sizeof *d->coll, cmp_entry_seq);
  int rc = check_consecutive(pe, d, d->coll, d->ncoll, "collectives", "");
  if (rc == 0 && d->ncoll && d->coll[d->ncoll - 1]->seq != d->next_seq - 1)
    rc = fail(pe, "the last launched collective has seq %lld (entry id %lld) but next_seq is %lld: expected seq %lld",
              d->coll[d->ncoll - 1]->seq, d->coll[d->ncoll - 1]->id, d->next_seq, d->next_seq - 1);
  if (rc == 0 && !d->ncoll && !d->wrapped && d->next_seq > 0)
    rc = fail(pe, "next_seq is %lld but the ring, which did not wrap, holds no launched collective", d->next_seq);
  d->lo = d->ncoll ? d->coll[0]->seq : NONE;
  long long after = d->ncoll ? d->coll[d->ncoll - 1]->id : -1;
  d->queued = xcalloc(d->n_entries, sizeof *d->queued);
  for (size_t i = 0; i < d->n_entries; i++) {
    const entry *e = &d->entries[i];
    if (e->id > after && e->seq == NONE && is_coll(e) && is_waiting(e)) d->queued[d->nqueued++] = e;
  }
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
    snprintf(what, sizeof what, "%s %s rank %d:", op_name(c->dir), c->dir == NCFSM_KIND_SEND ? "to" : "from", c->peer);
    rc = check_consecutive(pe, d, c->e, c->n, what,
                           " (the sends to a peer and the receives from it are numbered separately, each from 0: "
                           "the k-th SEND from r to p pairs with the k-th RECV on p from r)");
    i = j;
  }
  free(p2p);
  return rc;
}

/* The entries, once the other members are read. */
static int parse_entries(perr *pe, const json_t *root, dump *d) {
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
  d->entries = xcalloc(n, sizeof *d->entries);
  for (size_t i = 0; i < n; i++) {
    d->n_entries = i + 1;
    if (parse_entry(pe, json_array_get(ents, i), i, d->nranks, &d->entries[i]) < 0) return -1;
    long long want = d->total - (long long)n + (long long)i;
    if (d->entries[i].id != want)
      return fail(pe,
                  "entries[%zu] has id %lld, expected %lld (ids are consecutive and the first is total - "
                  "number of entries)",
                  i, d->entries[i].id, want);
    if (d->entries[i].seq != NONE && is_coll(&d->entries[i]) && d->entries[i].seq >= d->next_seq)
      return fail(pe, "entries[%zu] (id %lld) has seq %lld but next_seq is %lld", i, d->entries[i].id,
                  d->entries[i].seq, d->next_seq);
  }
  d->n_entries = n;
  return index_dump(pe, d);
}

/* ---- the dump ----------------------------------------------------------------------------- */
static int parse_dump(perr *pe, const json_t *root, dump *d) {
  long long v;
  const char *s;
  if (!json_is_object(root)) return fail(pe, "the top level is %s, expected an object", json_type_text(root));
  if (get_str(pe, root, "", "format", 1, 0, &s) < 0) {
    char why[sizeof pe->msg];
    memcpy(why, pe->msg, sizeof why);
    return fail(pe, "not an ncfsm flight recorder dump: %s (expected \"format\": \"%s\")", why, NCFSM_DUMP_FORMAT);
  }
  if (strcmp(s, NCFSM_DUMP_FORMAT) != 0)
    return fail(pe, "not an ncfsm flight recorder dump: 'format' is \"%.60s\", expected \"%s\"", s,
                NCFSM_DUMP_FORMAT);
  if (get_int(pe, root, "", "version", 1, 0, LLONG_MIN + 1, LLONG_MAX, &v) < 0) return -1;
  if (v != NCFSM_DUMP_VERSION)
    return fail(pe, "dump format version %lld: this ncfsm-trace reads version %d", v, NCFSM_DUMP_VERSION);
  /* nranks first: the bounds of rank and of SEQS members depend on it */
  if (get_int(pe, root, "", "nranks", 1, 0, 1, NCFSM_DUMP_MAX_NRANKS, &v) < 0) return -1;
  d->nranks = (int)v;
#define NRANKS d->nranks
#define NCFSM_DUMP_TOP(key, type, names, need, lo, hi) READ_##type(root, "", d, key, names, need, lo, hi)
#include "fsm/dump.def"
#undef NRANKS
  if (d->rank >= d->nranks)
    return fail(pe, "'rank' is %d, expected 0..%d ('nranks' is %d)", d->rank, d->nranks - 1, d->nranks);
  return parse_entries(pe, root, d);
}

void dump_free(dump *d) {
#define FREE_STR(k) free(d->k);
#define FREE_INT(k)
#define FREE_RANK(k)
#define FREE_HEX(k)
#define FREE_NAME(k)
#define FREE_TIME(k)
#define FREE_SEQS(k) free(d->k);
#define FREE_ENTRIES(k)
#define NCFSM_DUMP_TOP(key, type, names, need, lo, hi) FREE_##type(key)
#include "fsm/dump.def"
#undef FREE_STR
#define FREE_STR(k) free(e->k);
  for (size_t i = 0; i < d->n_entries; i++) {
    entry *e = &d->entries[i];
#define NCFSM_DUMP_ENTRY(key, type, names, need, lo, hi) FREE_##type(key)
#include "fsm/dump.def"
  }
  free(d->path);
  free(d->entries);
  free(d->coll);
  free(d->queued);
  for (size_t i = 0; i < d->nchans; i++) free(d->chans[i].e);
  free(d->chans);
}

/* The comm id and rank that a file name of the form ncfsm_fr_<id>_r<rank>.json
 * states; 0 when the name has another form. */
static int name_says(const char *path, char id[17], long long *rank) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t n = strlen(base), pl = strlen(NCFSM_DUMP_PREFIX), sl = strlen(NCFSM_DUMP_SUFFIX);
  if (n < pl + 16 + 2 + 1 + sl || strncmp(base, NCFSM_DUMP_PREFIX, pl) != 0 ||
      strcmp(base + n - sl, NCFSM_DUMP_SUFFIX) != 0)
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
    if (r > NCFSM_DUMP_MAX_NRANKS) return 0;
    r = r * 10 + (*q++ - '0');
  }
  if (strcmp(q, NCFSM_DUMP_SUFFIX) != 0) return 0;
  *rank = r;
  return 1;
}

int load_dump(const char *path, dump *d) {
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

/* ---- inputs ------------------------------------------------------------------------------- */
void strlist_add(strlist *l, char *s) {
  l->v = xrealloc(l->v, (l->n + 1) * sizeof *l->v);
  l->v[l->n++] = s;
}
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int is_dump_name(const char *name) {
  size_t n = strlen(name), pl = strlen(NCFSM_DUMP_PREFIX), sl = strlen(NCFSM_DUMP_SUFFIX);
  return n > pl + sl && strncmp(name, NCFSM_DUMP_PREFIX, pl) == 0 && strcmp(name + n - sl, NCFSM_DUMP_SUFFIX) == 0;
}

int add_input(strlist *files, const char *arg) {
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
    fprintf(stderr,
            "ncfsm-trace: %s: no flight recorder dumps (" NCFSM_DUMP_PREFIX "*" NCFSM_DUMP_SUFFIX
            ") in this directory\n",
            arg);
    free(found.v);
    return -1;
  }
  qsort(found.v, found.n, sizeof *found.v, cmp_str);
  for (size_t i = 0; i < found.n; i++) strlist_add(files, found.v[i]);
  free(found.v);
  return 0;
}
