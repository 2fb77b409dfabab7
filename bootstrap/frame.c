/* Store frame parser: pure (buffer in; frame, need-more or error out). */
#include "bootstrap/frame.h"

#include <string.h>

const char *ncfsm__frame_type_name(uint8_t type) {
  switch (type) {
  case NCFSM__F_HELLO: return "HELLO";
  case NCFSM__F_SET: return "SET";
  case NCFSM__F_GET: return "GET";
  case NCFSM__F_ADD: return "ADD";
  case NCFSM__F_WAIT: return "WAIT";
  case NCFSM__F_GATHER: return "GATHER";
  case NCFSM__F_AGREE: return "AGREE";
  case NCFSM__F_LOST: return "LOST";
  case NCFSM__F_BCAST: return "BCAST";
  case NCFSM__F_PING: return "PING";
  case NCFSM__F_CHAN: return "CHAN";
  case NCFSM__F_CHAN_CLOSE: return "CHAN_CLOSE";
  case NCFSM__F_NOTICE: return "NOTICE";
  case NCFSM__F_OK: return "OK";
  case NCFSM__F_ERR: return "ERR";
  }
  return "unknown";
}

void ncfsm__frame_header(uint8_t out[NCFSM__FRAME_HDR], uint8_t type, uint32_t id, uint32_t klen,
                         uint32_t vlen) {
  ncfsm__frame_header_v(out, NCFSM__FRAME_VERSION, type, id, klen, vlen);
}

void ncfsm__frame_header_v(uint8_t out[NCFSM__FRAME_HDR], uint8_t version, uint8_t type, uint32_t id,
                           uint32_t klen, uint32_t vlen) {
  ncfsm__wr32(out, NCFSM__FRAME_MAGIC);
  out[4] = version;
  out[5] = type;
  out[6] = out[7] = 0;
  ncfsm__wr32(out + 8, id);
  ncfsm__wr32(out + 12, klen);
  ncfsm__wr32(out + 16, vlen);
}

/* Type-specific shape of a complete frame. */
static const char *check_shape(const ncfsm__frame *f) {
  switch (f->type) {
  case NCFSM__F_HELLO:
    if (f->klen == 0) return "HELLO without a token";
    if (f->vlen != 8 && f->vlen != 12) return "HELLO value is not u32 rank + u32 size [+ u32 flags]";
    if (f->vlen == 12 && (ncfsm__rd32(f->value + 8) & ~NCFSM__HELLO_HEARTBEAT))
      return "HELLO with unknown flags";
    return NULL;
  case NCFSM__F_SET:
  case NCFSM__F_GET:
  case NCFSM__F_WAIT:
    if (f->klen == 0) return "empty key";
    if (f->type != NCFSM__F_SET && f->vlen != 0) return "GET/WAIT with a value";
    return NULL;
  case NCFSM__F_ADD:
    if (f->klen == 0) return "empty key";
    if (f->vlen != 8) return "ADD value is not an i64";
    return NULL;
  case NCFSM__F_GATHER: {
    if (f->klen == 0) return "empty key";
    if (f->vlen < 8) return "GATHER value shorter than u32 rank + u32 size";
    uint32_t rank = ncfsm__rd32(f->value), size = ncfsm__rd32(f->value + 4);
    if (size == 0 || rank >= size) return "GATHER rank not below size";
    return NULL;
  }
  case NCFSM__F_AGREE:
    if (f->klen == 0) return "AGREE without a group";
    if (f->vlen != 12) return "AGREE value is not u64 epoch + u32 timeout";
    return NULL;
  case NCFSM__F_LOST:
    if (f->vlen < 4) return "LOST value shorter than u32 rank";
    return NULL;
  case NCFSM__F_BCAST: {
    if (f->klen == 0) return "empty key";
    if (f->vlen < 16) return "BCAST value shorter than u32 rank, size, root, len";
    uint32_t rank = ncfsm__rd32(f->value), size = ncfsm__rd32(f->value + 4);
    uint32_t root = ncfsm__rd32(f->value + 8), len = ncfsm__rd32(f->value + 12);
    if (size == 0 || rank >= size || root >= size) return "BCAST rank or root not below size";
    if (f->vlen != 16 + (rank == root ? (uint64_t)len : 0))
      return "BCAST value length does not match (root: 16 + len bytes, others: 16)";
    return NULL;
  }
  case NCFSM__F_PING:
    if (f->klen || f->vlen) return "PING with a key or a value";
    return NULL;
  case NCFSM__F_CHAN: {
    if (f->klen < 3 || f->key[0] != '@' || f->key[1] != '#') return "CHAN key is not @#<tag>";
    if (f->vlen < 8) return "CHAN value shorter than u32 n + one member";
    uint32_t n = ncfsm__rd32(f->value);
    if (n == 0 || f->vlen != 4 + 4 * (uint64_t)n) return "CHAN value is not u32 n + n x u32 ranks";
    return NULL;
  }
  case NCFSM__F_CHAN_CLOSE:
    if (f->klen < 3 || f->key[0] != '@' || f->key[1] != '#') return "CHAN_CLOSE key is not @#<tag>";
    if (f->vlen) return "CHAN_CLOSE with a value";
    return NULL;
  case NCFSM__F_NOTICE:
    if (f->klen == 0 || f->key[0] != '@') return "NOTICE key is not a group";
    if (f->vlen < NCFSM__FRAME_NOTICE_MIN || f->vlen > NCFSM__FRAME_NOTICE_MAX)
      return "NOTICE value is not a notice (24 to 279 bytes)";
    return NULL;
  case NCFSM__F_OK:
  case NCFSM__F_ERR: return NULL;
  }
  return "unknown frame type";
}

ncfsm__parse_t ncfsm__frame_parse(const uint8_t *buf, size_t n, const ncfsm__frame_limits *lim,
                                  ncfsm__frame *f, size_t *used, const char **why) {
  static const uint8_t magic[4] = {'N', 'C', 'F', 'S'};
  *why = NULL;
  size_t m = n < 4 ? n : 4;
  if (memcmp(buf, magic, m) != 0) {
    *why = "bad magic (not an ncfsm store frame)";
    return NCFSM__PARSE_ERR;
  }
  if (n > 4 && buf[4] != NCFSM__FRAME_VERSION) {
    *why = "unsupported protocol version";
    return NCFSM__PARSE_ERR;
  }
  if (n > 5) {
    uint8_t t = buf[5];
    if (!((t >= NCFSM__F_HELLO && t <= NCFSM__F_NOTICE) || t == NCFSM__F_OK || t == NCFSM__F_ERR)) {
      *why = "unknown frame type";
      return NCFSM__PARSE_ERR;
    }
  }
  if (n > 7 && (buf[6] | buf[7]) != 0) {
    *why = "nonzero reserved flags";
    return NCFSM__PARSE_ERR;
  }
  if (n < NCFSM__FRAME_HDR) {
    *used = NCFSM__FRAME_HDR;
    return NCFSM__PARSE_MORE;
  }
  uint32_t klen = ncfsm__rd32(buf + 12), vlen = ncfsm__rd32(buf + 16);
  if (klen > lim->key_max) {
    *why = "key longer than the limit";
    return NCFSM__PARSE_ERR;
  }
  if (vlen > lim->value_max) {
    *why = "value longer than the limit";
    return NCFSM__PARSE_ERR;
  }
  size_t total = (size_t)NCFSM__FRAME_HDR + klen + vlen; /* no overflow: both bounded by u32 */
  if (n < total) {
    *used = total;
    return NCFSM__PARSE_MORE;
  }
  f->type = buf[5];
  f->flags = 0;
  f->id = ncfsm__rd32(buf + 8);
  f->klen = klen;
  f->vlen = vlen;
  f->key = buf + NCFSM__FRAME_HDR;
  f->value = buf + NCFSM__FRAME_HDR + klen;
  if ((*why = check_shape(f)) != NULL) return NCFSM__PARSE_ERR;
  *used = total;
  return NCFSM__PARSE_OK;
}
