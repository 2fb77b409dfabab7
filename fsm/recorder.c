/*
 * The flight recorder: the ring, the JSON and PyTorch dump writers, and the
 * process-wide dump thread. See fsm/recorder.h for the contract and
 * docs/ordering.md ("Flight recorder", "Dump formats") for the formats.
 */
#include "fsm/recorder.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"

#define REC_PATH_MAX 4096

/* ---- the ring --------------------------------------------------------------- */

struct ncfsm__recorder {
  unsigned capacity;
  uint64_t total; /* entries ever added = the next id */
  ncfsm__rec_entry slots[];
};

ncfsm__recorder *ncfsm__rec_new(unsigned capacity) {
  if (capacity == 0) return NULL;
  ncfsm__recorder *r = calloc(1, sizeof *r + (size_t)capacity * sizeof(ncfsm__rec_entry));
  if (!r) {
    NCFSM_WARN(NCFSM__SUB_FSM,
               "flight recorder: no memory for a ring of %u entries (%zu bytes): recording is off "
               "for this communicator; use a smaller trace buffer size",
               capacity, (size_t)capacity * sizeof(ncfsm__rec_entry));
    return NULL;
  }
  r->capacity = capacity;
  return r;
}

void ncfsm__rec_free(ncfsm__recorder *r) { free(r); }

unsigned ncfsm__rec_capacity(const ncfsm__recorder *r) { return r ? r->capacity : 0; }

uint64_t ncfsm__rec_total(const ncfsm__recorder *r) { return r ? r->total : 0; }

ncfsm__rec_ref ncfsm__rec_add(ncfsm__recorder *r, const ncfsm__rec_entry *e) {
  if (!r || !e) return NCFSM__REC_REF_NONE;
  uint64_t id = r->total++;
  ncfsm__rec_entry *slot = &r->slots[id % r->capacity];
  *slot = *e;
  slot->id = id;
  return id;
}

ncfsm__rec_entry *ncfsm__rec_get(ncfsm__recorder *r, ncfsm__rec_ref ref) {
  if (!r || ref >= r->total || r->total - ref > r->capacity) return NULL;
  return &r->slots[ref % r->capacity];
}

unsigned ncfsm__rec_snapshot(const ncfsm__recorder *r, ncfsm__rec_entry *out, unsigned max,
                             uint64_t *total) {
  if (total) *total = r ? r->total : 0;
  if (!r || !out || max == 0) return 0;
  uint64_t held = r->total < r->capacity ? r->total : r->capacity;
  unsigned n = held < max ? (unsigned)held : max;
  uint64_t first = r->total - n;
  for (unsigned i = 0; i < n; i++) out[i] = r->slots[(first + i) % r->capacity];
  return n;
}

/* ---- helpers ---------------------------------------------------------------- */

static const char *nz(const char *s) { return s ? s : ""; }

/* A copy of s with every byte that does not start a valid UTF-8 sequence
 * (overlong forms, surrogates and code points above U+10FFFF included)
 * replaced by '?': jansson and Python's pickle loader both reject invalid
 * UTF-8. NULL when out of memory. */
static char *utf8_clean(const char *s) {
  size_t len = strlen(s);
  char *out = malloc(len + 1);
  if (!out) return NULL;
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0, o = 0;
  while (i < len) {
    unsigned c = p[i];
    size_t need;
    unsigned cp, min;
    if (c < 0x80) {
      out[o++] = (char)c;
      i++;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      need = 1, cp = c & 0x1f, min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
      need = 2, cp = c & 0x0f, min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
      need = 3, cp = c & 0x07, min = 0x10000;
    } else {
      out[o++] = '?';
      i++;
      continue;
    }
    int ok = 1;
    for (size_t k = 1; ok && k <= need; k++) {
      if (i + k >= len || (p[i + k] & 0xc0) != 0x80) ok = 0;
      else cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if (ok && (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))) ok = 0;
    if (!ok) {
      out[o++] = '?';
      i++;
      continue;
    }
    memcpy(out + o, p + i, need + 1);
    o += need + 1;
    i += need + 1;
  }
  out[o] = '\0';
  return out;
}

static int is_p2p(int32_t op) { return op == NCFSM_KIND_SEND || op == NCFSM_KIND_RECV; }

static int is_final_state(int32_t s) {
  return s == NCFSM_WORK_COMPLETED || s == NCFSM_WORK_FAILED || s == NCFSM_WORK_TIMED_OUT ||
         s == NCFSM_WORK_ABORTED;
}

static ncfsm_result_t validate(const char *dir, const ncfsm__rec_meta *m,
                               const ncfsm__rec_entry *e, unsigned n) {
  static const char *const reasons[] = {"error", "timeout", "request", "signal", "verify"};
  if (!dir || !*dir || !m) {
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: dump without %s: nothing written",
               !m ? "metadata" : "a directory");
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (n > 0 && !e) {
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: dump of %u entries without the entries", n);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  int known = 0;
  for (size_t i = 0; i < sizeof reasons / sizeof reasons[0]; i++)
    if (m->reason && !strcmp(m->reason, reasons[i])) known = 1;
  if (!known) {
    NCFSM_WARN(NCFSM__SUB_FSM,
               "flight recorder: dump reason \"%s\" is not one of error, timeout, request, signal, "
               "verify: nothing written",
               nz(m->reason));
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (m->nranks <= 0 || m->rank < 0 || m->rank >= m->nranks) {
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: rank %d of %d is not a rank: nothing written",
               m->rank, m->nranks);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (m->formats & ~(unsigned)(NCFSM__REC_FMT_JSON | NCFSM__REC_FMT_TORCH)) {
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: unknown dump formats 0x%x: nothing written",
               m->formats);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  return NCFSM_OK;
}

ncfsm_result_t ncfsm__rec_paths(const char *dir, const ncfsm__rec_meta *m, char *json_path,
                                size_t json_len, char *torch_path, size_t torch_len) {
  if (!dir || !*dir || !m) return NCFSM_ERR_INVALID_ARGUMENT;
  size_t dl = strlen(dir);
  const char *sep = dir[dl - 1] == '/' ? "" : "/";
  if (json_path) {
    int k = snprintf(json_path, json_len, "%s%sncfsm_fr_%016" PRIx64 "_r%d.json", dir, sep,
                     m->comm_id, m->rank);
    if (k < 0 || (size_t)k >= json_len) return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (torch_path) {
    int k = snprintf(torch_path, torch_len, "%s%sncfsm_fr_%016" PRIx64 "_nccl_trace_rank_%d", dir,
                     sep, m->comm_id, m->rank);
    if (k < 0 || (size_t)k >= torch_len) return NCFSM_ERR_INVALID_ARGUMENT;
  }
  return NCFSM_OK;
}

/* Writes data to a temp file in dir, then renames it to path. */
static ncfsm_result_t write_atomic(const char *dir, const char *path, const void *data,
                                   size_t len) {
  char tmp[REC_PATH_MAX];
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t dl = strlen(dir);
  /* Hidden, and ending in ".tmp", so that fr_trace's file-name matching
   * (a rank number at the end) never takes a leftover temp file. */
  int k = snprintf(tmp, sizeof tmp, "%s%s.%s.XXXXXX.tmp", dir, dir[dl - 1] == '/' ? "" : "/", base);
  if (k < 0 || (size_t)k >= sizeof tmp) return NCFSM_ERR_INVALID_ARGUMENT;
  int fd = mkstemps(tmp, 4);
  if (fd < 0) {
    int err = errno;
    NCFSM_WARN(NCFSM__SUB_FSM,
               "flight recorder: cannot create a file in \"%s\": %s; the dump directory must "
               "exist and be writable: %s not written",
               dir, strerror(err), path);
    return NCFSM_ERR_SYSTEM;
  }
  const char *p = data;
  size_t left = len;
  int err = 0;
  while (left > 0) {
    ssize_t w = write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    p += w;
    left -= (size_t)w;
  }
  if (!err && fchmod(fd, 0644) != 0) err = errno;
  if (close(fd) != 0 && !err) err = errno;
  if (!err && rename(tmp, path) != 0) err = errno;
  if (err) {
    unlink(tmp);
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: writing %s failed: %s (disk full or read-only?)",
               path, strerror(err));
    return NCFSM_ERR_SYSTEM;
  }
  return NCFSM_OK;
}

/* CLOCK_REALTIME minus CLOCK_MONOTONIC, now: turns the recorder's monotonic
 * times into wall-clock times. */
static int64_t realtime_offset_ns(void) {
  struct timespec rt, mo;
  clock_gettime(CLOCK_REALTIME, &rt);
  clock_gettime(CLOCK_MONOTONIC, &mo);
  int64_t r = (int64_t)rt.tv_sec * 1000000000 + rt.tv_nsec;
  int64_t m = (int64_t)mo.tv_sec * 1000000000 + mo.tv_nsec;
  return r - m;
}

/* ---- JSON (format "ncfsm-flight-recorder", version 1) -------------------------- */

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
  char *c = utf8_clean(nz(s));
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

static char *json_text(const ncfsm__rec_meta *m, const ncfsm__rec_entry *e, unsigned n,
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

  jset(root, "format", json_string("ncfsm-flight-recorder"), &bad);
  jset(root, "version", json_integer(1), &bad);
  jset(root, "comm_id", j_hex(m->comm_id, 0), &bad);
  jset(root, "comm_name", j_str(m->comm_name), &bad);
  jset(root, "rank", json_integer(m->rank), &bad);
  jset(root, "nranks", json_integer(m->nranks), &bad);
  jset(root, "pid", json_integer((json_int_t)getpid()), &bad);
  jset(root, "host", j_str(host), &bad);
  jset(root, "backend", j_str(m->backend), &bad);
  jset(root, "nccl_version", json_integer(m->nccl_version), &bad);
  jset(root, "reason", j_str(m->reason), &bad);
  jset(root, "time_ns", j_u64(m->time_ns, &bad), &bad);
  jset(root, "wall_time", json_string(wall), &bad);
  jset(root, "state", j_str(m->state), &bad);
  jset(root, "failure", j_str(m->failure), &bad);
  jset(root, "next_seq", j_u64(m->next_seq, &bad), &bad);
  jset(root, "rolling_hash", j_hex(m->rolling_hash, 0), &bad);
  jset(root, "capacity", json_integer(m->capacity), &bad);
  jset(root, "total", j_u64(m->total, &bad), &bad);
  json_t *arr = json_array();
  jset(root, "entries", arr, &bad);
  for (unsigned i = 0; arr && i < n && !bad; i++) {
    const ncfsm__rec_entry *x = &e[i];
    json_t *o = json_object();
    if (!o || json_array_append_new(arr, o) != 0) {
      bad++;
      break;
    }
    jset(o, "id", j_u64(x->id, &bad), &bad);
    jset(o, "seq", x->fp.seq == NCFSM__REC_SEQ_NONE ? json_null() : j_u64(x->fp.seq, &bad), &bad);
    jset(o, "op", json_string(ncfsm_opkind_name((ncfsm_opkind_t)x->fp.op)), &bad);
    jset(o, "count", j_u64(x->fp.count, &bad), &bad);
    jset(o, "dtype", json_string(ncfsm_dtype_name((ncfsm_dtype_t)x->fp.dtype)), &bad);
    jset(o, "root", json_integer(x->fp.root), &bad);
    jset(o, "redop",
         x->fp.redop < 0 ? json_null() : json_string(ncfsm_redop_name((ncfsm_redop_t)x->fp.redop)),
         &bad);
    jset(o, "peer", json_integer(x->fp.peer), &bad);
    jset(o, "group", j_u64(x->group, &bad), &bad);
    jset(o, "state", json_string(ncfsm_work_state_name((ncfsm_work_state_t)x->state)), &bad);
    jset(o, "result",
         x->result == NCFSM_ERR_AGAIN ? json_null()
                                      : json_string(ncfsm_err_name((ncfsm_result_t)x->result)),
         &bad);
    jset(o, "stream", j_hex(x->stream, 1), &bad);
    jset(o, "t_submit_ns", j_u64(x->t_submit_ns, &bad), &bad);
    jset(o, "t_launch_ns", j_u64(x->t_launch_ns, &bad), &bad);
    jset(o, "t_final_ns", j_u64(x->t_final_ns, &bad), &bad);
    jset(o, "t_complete_ns", j_u64(x->t_complete_ns, &bad), &bad);
  }
  char *text = bad ? NULL : json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
  json_decref(root);
  return text;
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
  char *c = utf8_clean(nz(s));
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
  pk_kstr(p, "format", "ncfsm-flight-recorder");
  pk_kint(p, "version", 1);
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

ncfsm_result_t ncfsm__rec_write(const char *dir, const ncfsm__rec_meta *m,
                                const ncfsm__rec_entry *e, unsigned n) {
  ncfsm_result_t rc = validate(dir, m, e, n);
  if (rc != NCFSM_OK) return rc;
  unsigned fmt = m->formats ? m->formats : (NCFSM__REC_FMT_JSON | NCFSM__REC_FMT_TORCH);
  char jpath[REC_PATH_MAX], tpath[REC_PATH_MAX];
  if (ncfsm__rec_paths(dir, m, jpath, sizeof jpath, tpath, sizeof tpath) != NCFSM_OK) {
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: dump directory path too long (%zu bytes): \"%.64s...\"", strlen(dir), dir);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  int64_t rt_off = realtime_offset_ns();
  if (fmt & NCFSM__REC_FMT_JSON) {
    char *text = json_text(m, e, n, rt_off);
    if (!text) {
      NCFSM_WARN(NCFSM__SUB_FSM,
                 "flight recorder: building the JSON dump %s failed (out of memory, or a "
                 "number above 2^63): not written",
                 jpath);
      rc = NCFSM_ERR_NO_MEMORY;
    } else {
      rc = write_atomic(dir, jpath, text, strlen(text));
      free(text);
    }
  }
  /* a directory that refused the JSON file refuses the other too: one message */
  if ((fmt & NCFSM__REC_FMT_TORCH) && rc != NCFSM_ERR_SYSTEM) {
    pk p = {0};
    ncfsm_result_t trc;
    if (torch_pickle(&p, m, e, n, rt_off) != 0) {
      NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: out of memory building %s: not written", tpath);
      trc = NCFSM_ERR_NO_MEMORY;
    } else {
      trc = write_atomic(dir, tpath, p.b, p.len);
    }
    free(p.b);
    if (rc == NCFSM_OK) rc = trc;
  }
  return rc;
}

/* ---- the dump thread ---------------------------------------------------------- */

typedef struct rec_job {
  struct rec_job *next;
  char *dir;
  ncfsm__rec_meta m; /* strings point into the job's own allocation */
  ncfsm__rec_entry *e;
  unsigned n;
  ncfsm__rec_done_fn done;
  void *arg;
} rec_job;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;         /* the queue has a job, or stopping */
  pthread_cond_t stopped_cv; /* stopping went back to 0 */
  pthread_t th;
  int running;  /* the thread exists */
  int stopping; /* ncfsm__rec_shutdown asked it to drain and exit */
  int exiting;  /* the process is exiting: no new dumps */
  rec_job *head, *tail;
  unsigned queued;
  uint64_t dropped;
} g_dump = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
            .stopped_cv = PTHREAD_COND_INITIALIZER};

static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

static void atfork_prepare(void) { pthread_mutex_lock(&g_dump.mu); }
static void atfork_parent(void) { pthread_mutex_unlock(&g_dump.mu); }
/* The child has no dump thread: the parent writes the dumps it queued. */
static void atfork_child(void) {
  rec_job *j = g_dump.head;
  while (j) {
    rec_job *nx = j->next;
    free(j);
    j = nx;
  }
  g_dump.head = g_dump.tail = NULL;
  g_dump.queued = 0;
  g_dump.running = g_dump.stopping = 0;
  pthread_mutex_unlock(&g_dump.mu);
}
static void atfork_register(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

/* Writes each job's dump, calls its done and frees it. */
static void run_jobs(rec_job *j) {
  while (j) {
    rec_job *nx = j->next;
    ncfsm_result_t rc = ncfsm__rec_write(j->dir, &j->m, j->e, j->n);
    if (j->done) {
      unsigned fmt = j->m.formats ? j->m.formats : NCFSM__REC_FMT_JSON | NCFSM__REC_FMT_TORCH;
      char jpath[REC_PATH_MAX];
      int have = (fmt & NCFSM__REC_FMT_JSON) &&
                 ncfsm__rec_paths(j->dir, &j->m, jpath, sizeof jpath, NULL, 0) == NCFSM_OK;
      j->done(j->arg, rc, have ? jpath : NULL);
    }
    free(j);
    j = nx;
  }
}

static void *dump_main(void *unused) {
  (void)unused;
  pthread_mutex_lock(&g_dump.mu);
  for (;;) {
    while (!g_dump.head && !g_dump.stopping) pthread_cond_wait(&g_dump.cv, &g_dump.mu);
    rec_job *j = g_dump.head;
    if (!j) break; /* stopping and drained */
    g_dump.head = j->next;
    if (!g_dump.head) g_dump.tail = NULL;
    g_dump.queued--;
    pthread_mutex_unlock(&g_dump.mu);

    j->next = NULL;
    run_jobs(j);
    pthread_mutex_lock(&g_dump.mu);
  }
  pthread_mutex_unlock(&g_dump.mu);
  return NULL;
}

/* One allocation: the job, the entries, dir and the meta strings. */
static rec_job *job_new(const char *dir, const ncfsm__rec_meta *m, const ncfsm__rec_entry *e,
                        unsigned n) {
  const char *strs[] = {dir, nz(m->comm_name), nz(m->backend), nz(m->reason), nz(m->state),
                        nz(m->failure)};
  size_t slen = 0;
  for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) slen += strlen(strs[i]) + 1;
  size_t esz = (size_t)n * sizeof(ncfsm__rec_entry);
  rec_job *j = malloc(sizeof *j + esz + slen);
  if (!j) return NULL;
  memset(j, 0, sizeof *j);
  j->e = (ncfsm__rec_entry *)(void *)(j + 1);
  if (n) memcpy(j->e, e, esz);
  j->n = n;
  char *s = (char *)(j + 1) + esz;
  char *copies[sizeof strs / sizeof strs[0]];
  for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
    size_t l = strlen(strs[i]) + 1;
    memcpy(s, strs[i], l);
    copies[i] = s;
    s += l;
  }
  j->m = *m;
  j->dir = copies[0];
  j->m.comm_name = copies[1];
  j->m.backend = copies[2];
  j->m.reason = copies[3];
  j->m.state = copies[4];
  j->m.failure = copies[5];
  return j;
}

/* The d-th dropped dump: logged when d is a power of two (1, 2, 4, ...), so
 * that a flood of dumps does not flood the log too. */
static void warn_dropped(const ncfsm__rec_meta *m, uint64_t d) {
  if (d & (d - 1)) return;
  NCFSM_WARN(NCFSM__SUB_FSM,
             "flight recorder: %u dumps already pending: dump of comm %016" PRIx64
             " rank %d (%s) dropped, %" PRIu64 " dropped so far (logged at 1, 2, 4, ...); the "
             "dump directory may be slow, or dumps are requested too often",
             NCFSM__REC_QUEUE_MAX, m->comm_id, m->rank, m->reason, d);
}

ncfsm_result_t ncfsm__rec_dump_async(const char *dir, const ncfsm__rec_meta *m,
                                     const ncfsm__rec_entry *e, unsigned n,
                                     ncfsm__rec_done_fn done, void *arg) {
  ncfsm_result_t rc = validate(dir, m, e, n);
  if (rc != NCFSM_OK) return rc;
  pthread_once(&g_atfork_once, atfork_register);
  pthread_mutex_lock(&g_dump.mu);
  if (g_dump.exiting) {
    pthread_mutex_unlock(&g_dump.mu);
    NCFSM_WARN(NCFSM__SUB_FSM,
               "flight recorder: dump of comm %016" PRIx64 " rank %d (%s) requested while the "
               "process exits: not written",
               m->comm_id, m->rank, m->reason);
    return NCFSM_ERR_ILLEGAL_STATE;
  }
  if (g_dump.queued >= NCFSM__REC_QUEUE_MAX) {
    uint64_t d = ++g_dump.dropped;
    pthread_mutex_unlock(&g_dump.mu);
    warn_dropped(m, d);
    return NCFSM_ERR_BUSY;
  }
  pthread_mutex_unlock(&g_dump.mu);

  /* copy outside the lock: the dump thread is never held up by it */
  rec_job *j = job_new(dir, m, e, n);
  if (!j) {
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: no memory to copy a dump of %u entries", n);
    return NCFSM_ERR_NO_MEMORY;
  }
  j->done = done;
  j->arg = arg;

  pthread_mutex_lock(&g_dump.mu);
  if (g_dump.exiting || g_dump.queued >= NCFSM__REC_QUEUE_MAX) {
    /* lost a race with exit or with other producers filling the queue */
    int ex = g_dump.exiting;
    uint64_t d = ex ? g_dump.dropped : ++g_dump.dropped;
    pthread_mutex_unlock(&g_dump.mu);
    free(j);
    if (!ex) warn_dropped(m, d);
    return ex ? NCFSM_ERR_ILLEGAL_STATE : NCFSM_ERR_BUSY;
  }
  if (!g_dump.running) {
    /* a previous thread that was told to stop has been joined by
     * ncfsm__rec_shutdown before running went to 0 */
    g_dump.stopping = 0;
    int err = pthread_create(&g_dump.th, NULL, dump_main, NULL);
    if (err) {
      pthread_mutex_unlock(&g_dump.mu);
      free(j);
      NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: cannot start the dump thread: %s",
                 strerror(err));
      return NCFSM_ERR_SYSTEM;
    }
    g_dump.running = 1;
  }
  if (g_dump.tail) g_dump.tail->next = j;
  else g_dump.head = j;
  g_dump.tail = j;
  g_dump.queued++;
  pthread_cond_signal(&g_dump.cv);
  pthread_mutex_unlock(&g_dump.mu);
  return NCFSM_OK;
}

static void shutdown_thread(int exiting) {
  pthread_mutex_lock(&g_dump.mu);
  if (exiting) g_dump.exiting = 1;
  if (g_dump.running && pthread_equal(pthread_self(), g_dump.th)) {
    /* called from a done callback: the thread cannot join itself */
    pthread_mutex_unlock(&g_dump.mu);
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: shutdown called from the dump thread: ignored");
    return;
  }
  /* another caller is stopping the thread: wait until it is done */
  while (g_dump.stopping) pthread_cond_wait(&g_dump.stopped_cv, &g_dump.mu);
  if (!g_dump.running) {
    pthread_mutex_unlock(&g_dump.mu);
    return;
  }
  g_dump.stopping = 1;
  pthread_t th = g_dump.th;
  pthread_cond_signal(&g_dump.cv);
  pthread_mutex_unlock(&g_dump.mu);
  pthread_join(th, NULL);
  pthread_mutex_lock(&g_dump.mu);
  /* Dumps queued after the thread saw an empty queue are written here; so are
   * those queued meanwhile (running is still 1: no new thread starts) */
  for (;;) {
    rec_job *late = g_dump.head;
    if (!late) break;
    g_dump.head = g_dump.tail = NULL;
    g_dump.queued = 0;
    pthread_mutex_unlock(&g_dump.mu);
    run_jobs(late);
    pthread_mutex_lock(&g_dump.mu);
  }
  g_dump.running = 0;
  g_dump.stopping = 0;
  pthread_cond_broadcast(&g_dump.stopped_cv);
  pthread_mutex_unlock(&g_dump.mu);
}

void ncfsm__rec_shutdown(void) { shutdown_thread(0); }

/* At exit: write what is queued, then stop. */
__attribute__((destructor)) static void rec_at_exit(void) { shutdown_thread(1); }

uint64_t ncfsm__rec_dumps_dropped(void) {
  pthread_mutex_lock(&g_dump.mu);
  uint64_t d = g_dump.dropped;
  pthread_mutex_unlock(&g_dump.mu);
  return d;
}
