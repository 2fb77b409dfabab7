/*
 * ncfsm-trace: the name lists, memory that is never NULL, a growing string,
 * and the JSON values every part of the report uses (trace.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/trace/trace.h"

/* ---- names ------------------------------------------------------------------------ */
static const char *const op_names[] = {
#define X(name) #name,
    NCFSM_OPKIND_MAP(X)
#undef X
};
_Static_assert(ARRAY_SIZE(op_names) == NCFSM_OPKIND_COUNT, "op_names matches ncfsm_opkind_t");
static const char *const dtype_names[] = {
#define X(name, v, size) #name,
    NCFSM_DTYPE_MAP(X)
#undef X
};
static const int dtype_values[] = {
#define X(name, v, size) v,
    NCFSM_DTYPE_MAP(X)
#undef X
};
static const char *const redop_names[] = {
#define X(name, v) #name,
    NCFSM_REDOP_MAP(X)
#undef X
};
static const int redop_values[] = {
#define X(name, v) v,
    NCFSM_REDOP_MAP(X)
#undef X
};
static const char *const result_names[] = {
#define X(name, v, msg) "NCFSM_" #name,
    NCFSM_RESULT_MAP(X)
#undef X
};
static const int result_values[] = {
#define X(name, v, msg) v,
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
static const char *const backend_names[] = {
#define NCFSM_DUMP_BACKEND(name) #name,
#include "fsm/dump.def"
};
static const char *const reason_names[] = {
#define NCFSM_DUMP_REASON(name) #name,
#include "fsm/dump.def"
};

#define LIST(names) {names, NULL, ARRAY_SIZE(names)}
#define VLIST(names, values) {names, values, ARRAY_SIZE(names)}
const namelist names_opkind = LIST(op_names), names_dtype = VLIST(dtype_names, dtype_values),
               names_redop = VLIST(redop_names, redop_values), names_result = VLIST(result_names, result_values),
               names_work_state = LIST(work_state_names), names_comm_state = LIST(comm_state_names),
               names_backend = LIST(backend_names), names_reason = LIST(reason_names);

const char *name_of(const namelist *l, long long v) {
  for (size_t i = 0; i < l->n; i++)
    if ((l->value ? l->value[i] : (long long)i) == v) return l->name[i];
  return NULL;
}
static const char *or_unknown(const char *s) { return s ? s : "?"; }
const char *op_name(long long v) { return or_unknown(name_of(&names_opkind, v)); }
const char *dtype_name(long long v) { return or_unknown(name_of(&names_dtype, v)); }
const char *redop_name(long long v) { return v < 0 ? "none" : or_unknown(name_of(&names_redop, v)); }
const char *result_name(long long v) { return v < 0 ? "not final" : or_unknown(name_of(&names_result, v)); }
const char *work_state_name(long long v) { return or_unknown(name_of(&names_work_state, v)); }
const char *opt_name(const namelist *l, long long v) { return v < 0 ? NULL : name_of(l, v); }

/* ---- memory --------------------------------------------------------------------------- */
void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) {
    fprintf(stderr, "ncfsm-trace: out of memory\n");
    exit(2);
  }
  return q;
}
void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) {
    fprintf(stderr, "ncfsm-trace: out of memory\n");
    exit(2);
  }
  return p;
}
char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = xrealloc(NULL, n);
  memcpy(p, s, n);
  return p;
}
void check_json(const void *p) {
  if (!p) {
    fprintf(stderr, "ncfsm-trace: out of memory (jansson)\n");
    exit(2);
  }
}

/* ---- strings -------------------------------------------------------------------------- */
void sb_printf(sbuf *b, const char *fmt, ...) {
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
char *sb_take(sbuf *b) {
  if (!b->p) return xstrdup("");
  char *p = b->p;
  b->p = NULL;
  b->len = b->cap = 0;
  return p;
}

void sb_ranks(sbuf *b, const int *r, size_t n) {
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

void sb_seqs(sbuf *b, long long lo, long long hi) {
  if (lo == hi)
    sb_printf(b, "seq %lld", lo);
  else
    sb_printf(b, "seq %lld..%lld", lo, hi);
}

/* ---- JSON values ------------------------------------------------------------------------ */
json_t *json_ranks(const int *r, size_t n) {
  json_t *a = json_array();
  check_json(a);
  for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(r[i]));
  return a;
}

json_t *jseq(long long s) { return s == NONE ? json_null() : json_integer(s); }

/* Bytes that are not ASCII become '?' when s is not valid UTF-8 (a path
 * given on the command line may not be). */
json_t *jstr(const char *s) {
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
json_t *jstr_or_null(const char *s) { return s ? jstr(s) : json_null(); }
