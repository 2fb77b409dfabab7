/*
 * The verification's report of a seq whose fingerprints differ across
 * ranks: the first field that differs (op, count, dtype, root, redop, in
 * that order: an op that differs makes the others meaningless) and each
 * rank's value, ranks of one value together, in the words ncfsm-trace uses
 * ("seq 1001: count mismatch: ranks 0,2 count 32, rank 1 count 16").
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "fsm/verify.h"

enum { F_OP, F_COUNT, F_DTYPE, F_ROOT, F_REDOP, F_NFIELDS };
static const char *const field_name[F_NFIELDS] = {"op", "count", "dtype", "root", "redop"};

static int64_t field(const ncfsm_fingerprint_t *f, int k) {
  switch (k) {
    case F_OP: return f->op;
    case F_COUNT: return (int64_t)f->count;
    case F_DTYPE: return f->dtype;
    case F_ROOT: return f->root;
    default: return f->redop;
  }
}

static void value_text(int k, int64_t v, char *buf, size_t len) {
  switch (k) {
    case F_OP: snprintf(buf, len, "%s", ncfsm_opkind_name((ncfsm_opkind_t)v)); break;
    case F_DTYPE: snprintf(buf, len, "%s", ncfsm_dtype_name((ncfsm_dtype_t)v)); break;
    case F_REDOP: snprintf(buf, len, "%s", ncfsm_redop_name((ncfsm_redop_t)v)); break;
    default: snprintf(buf, len, "%" PRId64, v); break;
  }
}

bool ncfsm__verify_describe(const ncfsm_fingerprint_t *fps, int n, char *out, size_t len) {
  int k;
  for (k = 0; k < F_NFIELDS; k++) {
    bool same = true;
    for (int r = 1; r < n && same; r++) same = field(&fps[r], k) == field(&fps[0], k);
    if (!same) break;
  }
  if (k == F_NFIELDS) return false;
  int w = snprintf(out, len, "verification: seq %" PRIu64 ": %s mismatch: ", fps[0].seq, field_name[k]);
  bool done[256] = {false};
  bool first_group = true;
  for (int r = 0; r < n && r < 256 && w > 0 && (size_t)w < len; r++) {
    if (done[r]) continue;
    int64_t v = field(&fps[r], k);
    int members = 0;
    for (int o = r; o < n && o < 256; o++) members += field(&fps[o], k) == v;
    w += snprintf(out + w, len - (size_t)w, "%s%s ", first_group ? "" : ", ", members > 1 ? "ranks" : "rank");
    bool first = true;
    for (int o = r; o < n && o < 256 && w > 0 && (size_t)w < len; o++)
      if (!done[o] && field(&fps[o], k) == v) {
        done[o] = true;
        w += snprintf(out + w, len - (size_t)w, "%s%d", first ? "" : ",", o);
        first = false;
      }
    char val[32];
    value_text(k, v, val, sizeof val);
    if (w > 0 && (size_t)w < len) w += snprintf(out + w, len - (size_t)w, " %s %s", field_name[k], val);
    first_group = false;
  }
  if (w > 0 && (size_t)w < len)
    snprintf(out + w, len - (size_t)w, " (R11: the outputs of seq %" PRIu64 " and later are untrusted)", fps[0].seq);
  return true;
}

bool ncfsm__verify_describe_pair(uint64_t seq, int src, int dst, uint64_t scount, int32_t sdtype, uint64_t rcount,
                                 int32_t rdtype, char *out, size_t len) {
  if (scount != rcount)
    snprintf(out, len,
             "verification: send/recv seq %" PRIu64 " from rank %d to rank %d: count mismatch: rank %d sends %" PRIu64
             ", rank %d receives %" PRIu64 " (the pair's outputs are untrusted)",
             seq, src, dst, src, scount, dst, rcount);
  else if (sdtype != rdtype)
    snprintf(out, len,
             "verification: send/recv seq %" PRIu64 " from rank %d to rank %d: dtype mismatch: rank %d sends %s, rank "
             "%d receives %s (the pair's outputs are untrusted)",
             seq, src, dst, src, ncfsm_dtype_name((ncfsm_dtype_t)sdtype), dst, ncfsm_dtype_name((ncfsm_dtype_t)rdtype));
  else
    return false;
  return true;
}

void ncfsm__verify_describe_peer(int origin, uint64_t next_seq, ncfsm_result_t cause, const char *what, char *out,
                                 size_t len) {
  char where[64];
  if (next_seq) snprintf(where, sizeof where, "with its collectives up to seq %" PRIu64 " launched", next_seq - 1);
  else snprintf(where, sizeof where, "before its first collective");
  snprintf(out, len, "rank %d's comm failed first, %s (%s): %.380s", origin, where, ncfsm_err_name(cause),
           what ? what : "");
}
