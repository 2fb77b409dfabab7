/*
 * ncfsm-trace: findings and notes, and how an entry is described in them
 * (text and JSON).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/trace/check.h"

const char *const fkind_names[F_COUNT] = {
    "nranks_mismatch", "mismatch",      "not_reached", "failed",      "partial",      "hash_mismatch",
    "p2p_mismatch",    "p2p_unmatched", "p2p_failed",  "p2p_partial", "missing_dump",
};

finding *add_finding(comm *c, fkind k, char *text, char *detail, json_t *extra) {
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

void add_note(comm *c, json_t *j, const char *fmt, ...) {
  char line[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  sb_printf(&c->notes, "  note: %s\n", line);
  json_object_set_new(j, "text", jstr(line));
  json_array_append_new(c->jnotes, j);
}

void sb_fingerprint(sbuf *b, const entry *e) {
  sb_printf(b, "%s count %lld %s", op_name(e->op), e->count, dtype_name(e->dtype));
  if (e->root >= 0) sb_printf(b, " root %d", e->root);
  if (e->redop >= 0) sb_printf(b, " redop %s", redop_name(e->redop));
  if (e->peer >= 0) sb_printf(b, " peer %d", e->peer);
}

/* The time a work not final has waited at the dump, or NONE. */
static long long pending_ns(const dump *d, const entry *e) {
  if (!is_pending(e) || d->time_ns == NONE) return NONE;
  long long since = e->t_launch_ns ? e->t_launch_ns : e->t_submit_ns;
  return since && d->time_ns >= since ? d->time_ns - since : NONE;
}

void sb_state(sbuf *b, const dump *d, const entry *e) {
  sb_printf(b, "%s", work_state_name(e->state));
  if (!is_pending(e)) sb_printf(b, " %s", result_name(e->result));
  long long p = pending_ns(d, e);
  if (p != NONE) sb_printf(b, ", %s %.3f s before the dump", e->t_launch_ns ? "launched" : "submitted", (double)p / 1e9);
}

const char *dump_state(const dump *d) { return opt_name(&names_comm_state, d->state); }

/* The JSON value of each type of fsm/dump.def (names: the row's list). */
#define JV_STR(v, names) jstr_or_null(v)
#define JV_INT(v, names) jseq(v)
#define JV_RANK(v, names) json_integer(v)
#define JV_HEX(v, names) json_string(v)
#define JV_NAME(v, names) jstr_or_null(opt_name(TRACE_NAMES_##names, v))
#define JV_TIME(v, names) json_integer(v)

json_t *entry_json(const dump *d, const entry *e) {
  json_t *o = json_object();
  check_json(o);
#define NCFSM_DUMP_ENTRY(key, type, names, need, lo, hi) json_object_set_new(o, #key, JV_##type(e->key, names));
#include "fsm/dump.def"
  long long p = pending_ns(d, e);
  if (p != NONE) json_object_set_new(o, "pending_ns", json_integer(p));
  return o;
}

size_t group_values(const int *ranks, const long long *vals, size_t n, vgroup **out) {
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

void free_groups(vgroup *g, size_t n) {
  for (size_t i = 0; i < n; i++) free(g[i].r);
  free(g);
}
