/*
 * The JSON dump (format "ncfsm-flight-recorder", fsm/dump.h): one object
 * whose members are the rows of fsm/dump.def, in their order. TOP_<key> and
 * ENT_<key> below are the values of the dump's and an entry's members
 * (HAS_TOP_<key>, HAS_ENT_<key>: whether a member the schema marks OPT is
 * written); a row without its macro here does not compile.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "fsm/dump.h"
#include "fsm/dump_write.h"

/* Each setter keeps a count of failures in *bad (out of memory, or a number
 * jansson cannot hold) instead of checking every call. */
static void jset(json_t *o, const char *k, json_t *v, int *bad) {
  if (!v || json_object_set_new(o, k, v) != 0) (*bad)++;
}
static json_t *j_u64(uint64_t v, int *bad) {
  if (v > (uint64_t)INT64_MAX) {
    (*bad)++;
    return NULL;
  }
  return json_integer((json_int_t)v);
}
static json_t *j_str(const char *s) {
  char *c = ncfsm__rec_utf8_clean(nz(s));
  json_t *v = c ? json_string(c) : NULL;
  free(c);
  return v;
}
/* "%016x" (ids, hashes), or "0x%x" (addresses) */
static json_t *j_hex(uint64_t v, int addr) {
  char b[32];
  if (addr) snprintf(b, sizeof b, "0x%" PRIx64, v);
  else snprintf(b, sizeof b, "%016" PRIx64, v);
  return json_string(b);
}

/* nranks seqs, NCFSM__REC_SEQ_NONE written as null. */
static json_t *j_seqs(const uint64_t *v, int nranks, int *bad) {
  json_t *a = json_array();
  for (int i = 0; a && i < nranks; i++)
    if (json_array_append_new(a, v[i] == NCFSM__REC_SEQ_NONE ? json_null() : j_u64(v[i], bad)) != 0) (*bad)++;
  return a;
}

/* Writes member key of object o, whose value is P##key (TOP_key for the
 * dump, ENT_key for an entry); need (REQ, NULLABLE, OPT) is the row's. */
#define PUT_REQ(o, P, key) jset(o, #key, P##key, &bad);
#define PUT_NULLABLE(o, P, key) jset(o, #key, P##key, &bad);
#define PUT_OPT(o, P, key) \
  if (HAS_##P##key) jset(o, #key, P##key, &bad);

/* ---- one entry: x ---------------------------------------------------------------- */
#define ENT_id j_u64(x->id, &bad)
#define ENT_seq (x->fp.seq == NCFSM__REC_SEQ_NONE ? json_null() : j_u64(x->fp.seq, &bad))
#define ENT_op json_string(ncfsm_opkind_name((ncfsm_opkind_t)x->fp.op))
#define ENT_count j_u64(x->fp.count, &bad)
#define ENT_dtype json_string(ncfsm_dtype_name((ncfsm_dtype_t)x->fp.dtype))
#define ENT_root json_integer(x->fp.root)
#define ENT_redop (x->fp.redop < 0 ? json_null() : json_string(ncfsm_redop_name((ncfsm_redop_t)x->fp.redop)))
#define ENT_peer json_integer(x->fp.peer)
#define ENT_group j_u64(x->group, &bad)
#define ENT_state json_string(ncfsm_work_state_name((ncfsm_work_state_t)x->state))
#define ENT_result \
  (x->result == NCFSM_ERR_AGAIN ? json_null() : json_string(ncfsm_err_name((ncfsm_result_t)x->result)))
#define HAS_ENT_stream 1
#define ENT_stream j_hex(x->stream, 1)
#define HAS_ENT_t_submit_ns 1
#define ENT_t_submit_ns j_u64(x->t_submit_ns, &bad)
#define HAS_ENT_t_launch_ns 1
#define ENT_t_launch_ns j_u64(x->t_launch_ns, &bad)
#define HAS_ENT_t_final_ns 1
#define ENT_t_final_ns j_u64(x->t_final_ns, &bad)
#define HAS_ENT_t_complete_ns 1
#define ENT_t_complete_ns j_u64(x->t_complete_ns, &bad)

/* The entries array; NULL (and bad counted) when something failed. */
static json_t *entries_json(const ncfsm__rec_entry *e, unsigned n, int *badp) {
  int bad = 0;
  json_t *arr = json_array();
  for (unsigned i = 0; arr && i < n && !bad; i++) {
    const ncfsm__rec_entry *x = &e[i];
    json_t *o = json_object();
    if (!o || json_array_append_new(arr, o) != 0) {
      bad++;
      break;
    }
#define NCFSM_DUMP_ENTRY(key, type, names, need, lo, hi) PUT_##need(o, ENT_, key)
#include "fsm/dump.def"
  }
  if (!arr || bad) {
    json_decref(arr);
    (*badp)++;
    return NULL;
  }
  return arr;
}

/* ---- the dump: m, e[0..n), host, wall ---------------------------------------------- */
#define TOP_format json_string(NCFSM_DUMP_FORMAT)
#define TOP_version json_integer(NCFSM_DUMP_VERSION)
#define TOP_comm_id j_hex(m->comm_id, 0)
#define HAS_TOP_comm_name 1
#define TOP_comm_name j_str(m->comm_name)
#define TOP_rank json_integer(m->rank)
#define TOP_nranks json_integer(m->nranks)
#define HAS_TOP_pid 1
#define TOP_pid json_integer((json_int_t)getpid())
#define HAS_TOP_host 1
#define TOP_host j_str(host)
#define HAS_TOP_backend 1
#define TOP_backend j_str(m->backend)
#define HAS_TOP_nccl_version 1
#define TOP_nccl_version json_integer(m->nccl_version)
#define HAS_TOP_reason 1
#define TOP_reason j_str(m->reason)
#define HAS_TOP_time_ns 1
#define TOP_time_ns j_u64(m->time_ns, &bad)
#define HAS_TOP_wall_time 1
#define TOP_wall_time json_string(wall)
#define HAS_TOP_state 1
#define TOP_state j_str(m->state)
#define HAS_TOP_failure 1
#define TOP_failure j_str(m->failure)
#define TOP_next_seq j_u64(m->next_seq, &bad)
#define TOP_rolling_hash j_hex(m->rolling_hash, 0)
#define TOP_capacity json_integer(m->capacity)
#define TOP_total j_u64(m->total, &bad)
#define HAS_TOP_peer_next_seq (m->peer_next_seq != NULL)
#define TOP_peer_next_seq j_seqs(m->peer_next_seq, m->nranks, &bad)
#define TOP_entries entries_json(e, n, &bad)

char *ncfsm__rec_json_text(const ncfsm__rec_meta *m, const ncfsm__rec_entry *e, unsigned n,
                           int64_t rt_off) {
  int bad = 0;
  json_t *root = json_object();
  if (!root) return NULL;
  char host[256] = "";
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  uint64_t now_mono = ncfsm__now_ns();
  int64_t wall_ns = (m->time_ns && m->time_ns <= now_mono) ? (int64_t)m->time_ns + rt_off
                                                           : (int64_t)now_mono + rt_off;
  time_t wall_s = (time_t)(wall_ns / 1000000000);
  struct tm tm;
  char wall[40] = "";
  if (gmtime_r(&wall_s, &tm)) strftime(wall, sizeof wall, "%Y-%m-%dT%H:%M:%SZ", &tm);

#define NCFSM_DUMP_TOP(key, type, names, need, lo, hi) PUT_##need(root, TOP_, key)
#include "fsm/dump.def"
  char *text = bad ? NULL : json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
  json_decref(root);
  return text;
}
