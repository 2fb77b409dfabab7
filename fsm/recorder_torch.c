/*
 * The PyTorch Flight Recorder dump (format version "2.10") that
 * `python3 -m torch.distributed.flight_recorder.fr_trace` reads, and the
 * minimal pickle writer it is written with.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm/dump.h"
#include "fsm/dump_write.h"

static int is_p2p(int32_t op) { return op == NCFSM_KIND_SEND || op == NCFSM_KIND_RECV; }

static int is_final_state(int32_t s) {
  return s == NCFSM_WORK_COMPLETED || s == NCFSM_WORK_FAILED || s == NCFSM_WORK_TIMED_OUT ||
         s == NCFSM_WORK_ABORTED;
}

/* ---- a minimal pickle writer (protocol 2) ------------------------------------
 * Enough for PyTorch's Flight Recorder dumps: dict, list, tuple, str, int,
 * float, bool, None. No memo: every value is written out in full. Containers
 * are written as MARK ... SETITEMS / APPENDS / TUPLE. */

typedef struct pk {
  unsigned char *b;
  size_t len, cap;
  int oom;
} pk;

enum {
  PK_PROTO = 0x80, PK_STOP = '.', PK_NONE = 'N', PK_TRUE = 0x88, PK_FALSE = 0x89,
  PK_BININT = 'J', PK_BININT1 = 'K', PK_BININT2 = 'M', PK_LONG1 = 0x8a, PK_BINFLOAT = 'G',
  PK_BINUNICODE = 'X', PK_MARK = '(', PK_EMPTY_DICT = '}', PK_SETITEMS = 'u',
  PK_EMPTY_LIST = ']', PK_APPENDS = 'e', PK_TUPLE = 't'
};

static void pk_raw(pk *p, const void *d, size_t n) {
  if (p->oom) return;
  if (p->len + n > p->cap) {
    size_t cap = p->cap ? p->cap : 4096;
    while (cap < p->len + n) cap *= 2;
    unsigned char *b = realloc(p->b, cap);
    if (!b) {
      p->oom = 1;
      return;
    }
    p->b = b;
    p->cap = cap;
  }
  memcpy(p->b + p->len, d, n);
  p->len += n;
}
static void pk_op(pk *p, unsigned char op) { pk_raw(p, &op, 1); }
static void pk_le(pk *p, uint64_t v, int bytes) {
  unsigned char b[8];
  for (int i = 0; i < bytes; i++) b[i] = (unsigned char)(v >> (8 * i));
  pk_raw(p, b, (size_t)bytes);
}
static void pk_begin(pk *p) {
  pk_op(p, PK_PROTO);
  pk_op(p, 2);
}
static void pk_end(pk *p) { pk_op(p, PK_STOP); }
static void pk_none(pk *p) { pk_op(p, PK_NONE); }
static void pk_bool(pk *p, int v) { pk_op(p, v ? PK_TRUE : PK_FALSE); }
static void pk_int(pk *p, int64_t v) {
  if (v >= 0 && v < 256) {
    pk_op(p, PK_BININT1);
    pk_le(p, (uint64_t)v, 1);
  } else if (v >= 0 && v < 65536) {
    pk_op(p, PK_BININT2);
    pk_le(p, (uint64_t)v, 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    pk_op(p, PK_BININT);
    pk_le(p, (uint64_t)(uint32_t)(int32_t)v, 4);
  } else {
    pk_op(p, PK_LONG1); /* n bytes of little-endian two's complement */
    pk_op(p, 8);
    pk_le(p, (uint64_t)v, 8);
  }
}
static void pk_uint(pk *p, uint64_t v) {
  if (v <= (uint64_t)INT64_MAX) {
    pk_int(p, (int64_t)v);
  } else {
    pk_op(p, PK_LONG1);
    pk_op(p, 9);
    pk_le(p, v, 8);
    pk_op(p, 0); /* sign byte: positive */
  }
}
/* floats: no dump field needs one today; the pickle tests use it */
__attribute__((unused)) static void pk_float(pk *p, double v) {
  uint64_t bits;
  memcpy(&bits, &v, sizeof bits);
  unsigned char b[8];
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(bits >> (8 * (7 - i))); /* big-endian */
  pk_op(p, PK_BINFLOAT);
  pk_raw(p, b, 8);
}
static void pk_str(pk *p, const char *s) {
  char *c = ncfsm__rec_utf8_clean(nz(s));
  if (!c) {
    p->oom = 1;
    return;
  }
  size_t n = strlen(c);
  pk_op(p, PK_BINUNICODE);
  pk_le(p, (uint64_t)n, 4);
  pk_raw(p, c, n);
  free(c);
}
static void pk_dict_begin(pk *p) {
  pk_op(p, PK_EMPTY_DICT);
  pk_op(p, PK_MARK);
}
static void pk_dict_end(pk *p) { pk_op(p, PK_SETITEMS); }
static void pk_list_begin(pk *p) {
  pk_op(p, PK_EMPTY_LIST);
  pk_op(p, PK_MARK);
}
static void pk_list_end(pk *p) { pk_op(p, PK_APPENDS); }
static void pk_tuple_begin(pk *p) { pk_op(p, PK_MARK); }
static void pk_tuple_end(pk *p) { pk_op(p, PK_TUPLE); }
/* key: value helpers for dicts with str keys */
static void pk_kstr(pk *p, const char *k, const char *v) {
  pk_str(p, k);
  pk_str(p, v);
}
static void pk_kint(pk *p, const char *k, int64_t v) {
  pk_str(p, k);
  pk_int(p, v);
}

/* ---- the PyTorch Flight Recorder dump (format version "2.10") ------------------ */

static const char *torch_op_name(int32_t op) {
  switch (op) {
    case NCFSM_KIND_ALLREDUCE: return "nccl:all_reduce";
    case NCFSM_KIND_BROADCAST: return "nccl:broadcast";
    case NCFSM_KIND_REDUCE: return "nccl:reduce";
    case NCFSM_KIND_ALLGATHER: return "nccl:all_gather";
    case NCFSM_KIND_REDUCESCATTER: return "nccl:reduce_scatter";
    case NCFSM_KIND_ALLTOALL: return "nccl:all_to_all";
    case NCFSM_KIND_GATHER: return "nccl:gather";
    case NCFSM_KIND_SCATTER: return "nccl:scatter";
    case NCFSM_KIND_SEND: return "nccl:send";
    case NCFSM_KIND_RECV: return "nccl:recv";
    default: return NULL;
  }
}

/* c10::toString(ScalarType) of the matching torch dtype. */
static const char *torch_dtype_name(int32_t dt) {
  switch (dt) {
    case NCFSM_INT8: return "Char";
    case NCFSM_UINT8: return "Byte";
    case NCFSM_INT32: return "Int";
    case NCFSM_UINT32: return "UInt32";
    case NCFSM_INT64: return "Long";
    case NCFSM_UINT64: return "UInt64";
    case NCFSM_FLOAT16: return "Half";
    case NCFSM_FLOAT32: return "Float";
    case NCFSM_FLOAT64: return "Double";
    case NCFSM_BFLOAT16: return "BFloat16";
    default: return "Undefined";
  }
}

/* Logical element counts of the input and output buffers, the same on every
 * rank (fr_trace compares them across ranks). */
static void torch_sizes(const ncfsm_fingerprint_t *fp, int nranks, uint64_t *in, uint64_t *out) {
  uint64_t c = fp->count, all = fp->count * (uint64_t)nranks;
  switch (fp->op) {
    case NCFSM_KIND_ALLGATHER:
    case NCFSM_KIND_GATHER: *in = c, *out = all; break;
    case NCFSM_KIND_REDUCESCATTER:
    case NCFSM_KIND_SCATTER: *in = all, *out = c; break;
    case NCFSM_KIND_ALLTOALL: *in = all, *out = all; break;
    default: *in = c, *out = c; break;
  }
}

/* "scheduled" until the launch is final, "started" while in flight or when
 * it failed after that, "completed" only for COMPLETED (a failed, timed-out
 * or aborted work is retired without completing, as in PyTorch). */
static const char *torch_state(const ncfsm__rec_entry *x) {
  if (x->state == NCFSM_WORK_COMPLETED) return "completed";
  if (x->state == NCFSM_WORK_IN_FLIGHT) return "started";
  if (is_final_state(x->state) && x->t_final_ns) return "started";
  return "scheduled";
}

static void pk_sizes(pk *p, uint64_t count) {
  pk_list_begin(p);
  pk_list_begin(p);
  pk_uint(p, count);
  pk_list_end(p);
  pk_list_end(p);
}
static void pk_dtypes(pk *p, const char *name) {
  pk_list_begin(p);
  pk_str(p, name);
  pk_list_end(p);
}
static void pk_time(pk *p, uint64_t t, int64_t rt_off) {
  if (t) pk_int(p, (int64_t)t + rt_off);
  else pk_none(p);
}

/* The collective seq each entry is written with (NCFSM__REC_SEQ_NONE: left
 * out). Launched entries keep theirs. A collective never launched that comes
 * after the last launched collective (queued, or refused before launch, e.g.
 * by strict verification) gets the seq it would have had: next_seq, next_seq+1,
 * ... in order; PyTorch numbers a collective when it is enqueued, so this is
 * what fr_trace compares across ranks. One never launched before a launched
 * one consumed no seq and matches nothing on other ranks: left out. A send or
 * recv never launched is written when no launched send/recv of the same kind
 * and peer comes after it. */
static void torch_seqs(const ncfsm__rec_meta *m, const ncfsm__rec_entry *e, unsigned n,
                       uint64_t *seq) {
  int64_t last_coll = -1;
  for (unsigned i = 0; i < n; i++)
    if (!is_p2p(e[i].fp.op) && e[i].fp.seq != NCFSM__REC_SEQ_NONE) last_coll = i;
  uint64_t next = m->next_seq;
  for (unsigned i = 0; i < n; i++) {
    const ncfsm__rec_entry *x = &e[i];
    seq[i] = NCFSM__REC_SEQ_NONE;
    if (!torch_op_name(x->fp.op)) continue;
    if (x->fp.seq != NCFSM__REC_SEQ_NONE) {
      seq[i] = x->fp.seq;
    } else if (!is_p2p(x->fp.op)) {
      if ((int64_t)i > last_coll) seq[i] = next++;
    } else {
      int later = 0;
      for (unsigned j = i + 1; j < n && !later; j++)
        later = e[j].fp.op == x->fp.op && e[j].fp.peer == x->fp.peer &&
                e[j].fp.seq != NCFSM__REC_SEQ_NONE;
      if (!later) seq[i] = 0; /* written; its own seq is not part of PyTorch's format */
    }
  }
}

/* record_id: fr_trace lines up the ranks' dumps by it (it drops every entry
 * whose record_id is below the largest first record_id of any rank), so it
 * must name the same operation on every rank. ncfsm's entry ids do not: they
 * count refused works too. The k-th collective is (k+1) * stride; the j-th
 * send/recv after it (k+1) * stride + j (j capped at stride - 1). The
 * entry's own id is written as op_id. */
#define TORCH_RECORD_STRIDE 1000u

static int torch_pickle(pk *p, const ncfsm__rec_meta *m, const ncfsm__rec_entry *e, unsigned n,
                        int64_t rt_off) {
  uint64_t *seq = malloc((n ? n : 1) * sizeof *seq);
  if (!seq) return -1;
  torch_seqs(m, e, n, seq);
  char pg_name[24];
  snprintf(pg_name, sizeof pg_name, "%016" PRIx64, m->comm_id);
  const char *desc = (m->comm_name && *m->comm_name) ? m->comm_name : "undefined";

  pk_begin(p);
  pk_dict_begin(p);
  pk_kstr(p, "version", "2.10");
  char libv[32] = "";
  if (m->nccl_version > 0)
    snprintf(libv, sizeof libv, "%d.%d.%d", m->nccl_version / 10000, m->nccl_version / 100 % 100,
             m->nccl_version % 100);
  pk_kstr(p, "comm_lib_version", libv);

  /* pg_config: {pg_name: {"name", "desc", "ranks": "[0, 1, ...]"}} */
  pk_str(p, "pg_config");
  pk_dict_begin(p);
  pk_str(p, pg_name);
  pk_dict_begin(p);
  pk_kstr(p, "name", pg_name);
  pk_kstr(p, "desc", desc);
  pk_str(p, "ranks");
  {
    size_t cap = 2 + (size_t)m->nranks * 13, len = 0;
    char *r = malloc(cap);
    if (!r) {
      free(seq);
      return -1;
    }
    r[len++] = '[';
    for (int i = 0; i < m->nranks; i++)
      len += (size_t)snprintf(r + len, cap - len, i ? ", %d" : "%d", i);
    r[len++] = ']';
    r[len] = '\0';
    pk_str(p, r);
    free(r);
  }
  pk_dict_end(p);
  pk_dict_end(p);

  /* pg_status: {"0": {last_enqueued/started/completed_collective}}, -1 = none */
  int64_t enq = -1, started = -1, done = -1;
  for (unsigned i = 0; i < n; i++) {
    if (seq[i] == NCFSM__REC_SEQ_NONE || is_p2p(e[i].fp.op)) continue;
    int64_t s = (int64_t)seq[i];
    if (s > enq) enq = s;
    if (strcmp(torch_state(&e[i]), "scheduled") && s > started) started = s;
    if (e[i].state == NCFSM_WORK_COMPLETED && s > done) done = s;
  }
  pk_str(p, "pg_status");
  pk_dict_begin(p);
  pk_str(p, "0");
  pk_dict_begin(p);
  pk_kint(p, "last_enqueued_collective", enq);
  pk_kint(p, "last_started_collective", started);
  pk_kint(p, "last_completed_collective", done);
  pk_dict_end(p);
  pk_dict_end(p);

  /* what only ncfsm knows; fr_trace ignores keys it does not read */
  pk_str(p, "ncfsm");
  pk_dict_begin(p);
  pk_kstr(p, "format", NCFSM_DUMP_FORMAT);
  pk_kint(p, "version", NCFSM_DUMP_VERSION);
  pk_kstr(p, "comm_id", pg_name);
  pk_kint(p, "rank", m->rank);
  pk_kint(p, "nranks", m->nranks);
  pk_kstr(p, "backend", m->backend);
  pk_kstr(p, "reason", m->reason);
  pk_kstr(p, "state", m->state);
  pk_kstr(p, "failure", m->failure);
  pk_str(p, "next_seq");
  pk_uint(p, m->next_seq);
  {
    char h[24];
    snprintf(h, sizeof h, "%016" PRIx64, m->rolling_hash);
    pk_kstr(p, "rolling_hash", h);
  }
  pk_kint(p, "capacity", m->capacity);
  pk_str(p, "total");
  pk_uint(p, m->total);
  pk_dict_end(p);

  pk_str(p, "entries");
  pk_list_begin(p);
  int64_t coll_seq = -1; /* seq of the last collective written */
  int64_t first_coll = -1;
  for (unsigned i = 0; i < n; i++)
    if (seq[i] != NCFSM__REC_SEQ_NONE && !is_p2p(e[i].fp.op)) {
      first_coll = (int64_t)seq[i];
      break;
    }
  uint64_t p2p_count = 0, since_coll = 0;
  for (unsigned i = 0; i < n; i++) {
    if (seq[i] == NCFSM__REC_SEQ_NONE) continue;
    const ncfsm__rec_entry *x = &e[i];
    int p2p = is_p2p(x->fp.op);
    char name[64];
    if (x->fp.op == NCFSM_KIND_SEND)
      snprintf(name, sizeof name, "nccl:send %d->%d", m->rank, x->fp.peer);
    else if (x->fp.op == NCFSM_KIND_RECV)
      snprintf(name, sizeof name, "nccl:recv %d<-%d", m->rank, x->fp.peer);
    else
      snprintf(name, sizeof name, "%s", torch_op_name(x->fp.op));
    int64_t cseq;
    uint64_t record;
    if (!p2p) {
      cseq = coll_seq = (int64_t)seq[i];
      since_coll = 0;
      record = (uint64_t)(cseq + 1) * TORCH_RECORD_STRIDE;
    } else {
      p2p_count++;
      if (since_coll < TORCH_RECORD_STRIDE - 1) since_coll++;
      /* PyTorch writes the process group's collective counter: the seq of
       * the collective before it */
      cseq = coll_seq >= 0 ? coll_seq
             : first_coll >= 0 ? first_coll - 1
             : (int64_t)m->next_seq - 1;
      record = (uint64_t)(cseq + 1) * TORCH_RECORD_STRIDE + since_coll;
      if (cseq < 0) cseq = 0;
    }
    uint64_t in, out;
    torch_sizes(&x->fp, m->nranks, &in, &out);
    const char *dt = torch_dtype_name(x->fp.dtype);

    pk_dict_begin(p);
    pk_str(p, "frames");
    pk_list_begin(p);
    pk_list_end(p);
    pk_str(p, "record_id");
    pk_uint(p, record);
    pk_kint(p, "pg_id", 0);
    pk_str(p, "process_group");
    pk_tuple_begin(p);
    pk_str(p, pg_name);
    pk_str(p, desc);
    pk_tuple_end(p);
    pk_kstr(p, "thread_name", "");
    pk_kstr(p, "thread_id", "");
    pk_kint(p, "collective_seq_id", cseq);
    pk_str(p, "p2p_seq_id");
    pk_uint(p, p2p_count);
    pk_str(p, "op_id");
    pk_uint(p, x->id);
    pk_kstr(p, "profiling_name", name);
    pk_str(p, "time_created_ns");
    pk_time(p, x->t_submit_ns, rt_off);
    pk_str(p, "input_sizes");
    pk_sizes(p, in);
    pk_str(p, "input_dtypes");
    pk_dtypes(p, dt);
    pk_str(p, "output_sizes");
    pk_sizes(p, out);
    pk_str(p, "output_dtypes");
    pk_dtypes(p, dt);
    pk_kstr(p, "state", torch_state(x));
    pk_str(p, "time_discovered_started_ns");
    pk_time(p, strcmp(torch_state(x), "scheduled") ? x->t_final_ns : 0, rt_off);
    pk_str(p, "time_discovered_completed_ns");
    pk_time(p, x->state == NCFSM_WORK_COMPLETED ? x->t_complete_ns : 0, rt_off);
    pk_str(p, "retired");
    pk_bool(p, is_final_state(x->state));
    pk_str(p, "timeout_ms");
    pk_uint(p, m->timeout_ms);
    pk_str(p, "is_p2p");
    pk_bool(p, p2p);
    pk_dict_end(p);
  }
  pk_list_end(p);
  pk_dict_end(p);
  pk_end(p);
  free(seq);
  return p->oom ? -1 : 0;
}

int ncfsm__rec_torch_pickle(const ncfsm__rec_meta *m, const ncfsm__rec_entry *e, unsigned n,
                            int64_t rt_off, unsigned char **buf, size_t *len) {
  pk p = {0};
  int rc = torch_pickle(&p, m, e, n, rt_off);
  if (rc != 0) {
    free(p.b);
    p.b = NULL;
    p.len = 0;
  }
  *buf = p.b;
  *len = p.len;
  return rc;
}
