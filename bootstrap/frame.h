/*
 * Store wire format. Every frame is a 20-byte header in network byte order,
 * then the key, then the value:
 *
 *   u32 magic "NCFS" | u8 version | u8 type | u16 flags (0) | u32 id
 *   | u32 key length | u32 value length | key | value
 *
 * id is chosen by the client and echoed in the reply (replies to parked GETs
 * come out of order). Requests: HELLO (key = job token, or the rank's secret
 * under --rank-secrets; value = u32 rank, u32 size; size 0: a client without a
 * rank), SET, GET (parks until the key exists), ADD (value = i64 delta;
 * reply = i64 new value), WAIT (parks until the key exists; empty reply),
 * GATHER (key = collective name, value = u32 rank, u32 size, data; the reply,
 * once all size ranks contributed, is the rank-major concatenation).
 * AGREE (key = group: "@" for the whole job, "@/<epoch>[/<epoch>...]" for the
 * survivors of a completed agreement; value = u64 epoch, u32 timeout ms;
 * parks until every live member posted that epoch; reply = one byte per job
 * rank, 1 for the ranks of the agreement), and GATHER in a survivors' group
 * (key "<group>:ag/<n>", value rank = index in the group, size = its size).
 * Replies: OK (value = result), ERR (value = message; with id 0, the store
 * refusing the HELLO or closing the connection, the message starting with the
 * reason: "bad token", "throttled", "store busy", ...). Pushed by the store:
 * LOST (id 0, value = u32 job rank, then a message: that rank's connection
 * ended), to every ranked connection when it happens and to a rank that
 * connects after it. BCAST (key = "bc/<n>", or "<group>:bc/<n>" in a survivors'
 * group; value = u32 rank, u32 size, u32 root, u32 len, then on root the len
 * bytes): root is answered with an empty OK once the store holds the bytes,
 * every other rank with OK + the bytes (parked until root's arrived).
 * Channels (version 2): CHAN (key "@#<tag>", value u32 n then the n members' job ranks in
 * the channel's order) opens the channel for the sender, answered OK or ERR; its GATHERs and
 * BCASTs are keyed "@#<tag>:ag/<n>", "@#<tag>:bc/<n>" with the sender's index in it; CHAN_CLOSE
 * (no reply) closes it; the store pushes LOST with key "@#<tag>" (value u32 index, message)
 * when a member closed it. NOTICE (key "@", a survivors' group or a channel; value a notice,
 * origin = the sender's index in it; no reply) is pushed by the store, same key and value, to
 * every other connected member.
 * Heartbeats (docs/bootstrap.md, "Heartbeats"): a ranked HELLO's OK carries
 * u32 heartbeat_ms, u32 silence_ms, u32 flags (1: the store's own silence is
 * a loss) when the store watches its ranks; the rank then opens a second
 * connection whose HELLO has a third u32, NCFSM__HELLO_HEARTBEAT, and on which
 * both sides send PING (no key, no value) every heartbeat_ms; a side that hears
 * nothing for silence_ms takes the other for lost.
 *
 * The parser is a pure function so it can be fuzzed (tests/bootstrap/fuzz_frame.c).
 */
#ifndef NCFSM_BOOTSTRAP_FRAME_H
#define NCFSM_BOOTSTRAP_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define NCFSM__FRAME_MAGIC 0x4e434653u /* "NCFS" */
/* 2 (issue 21): CHAN, CHAN_CLOSE, NOTICE, keyed LOST; a version-1 peer is refused with a
 * version-1 ERR frame that says so (docs/bootstrap.md, "Wire format"). */
#define NCFSM__FRAME_VERSION 2
#define NCFSM__FRAME_HDR 20
#define NCFSM__FRAME_KEY_MAX 512u
#define NCFSM__FRAME_VALUE_MAX (1u << 20)
/* HELLO's optional third u32: flags. HEARTBEAT: this connection is rank's heartbeat connection
 * (only PINGs follow), not its requests'. */
#define NCFSM__HELLO_HEARTBEAT 1u
/* A NOTICE's value: the notice's wire form (bootstrap/boot-internal.h, ncfsm__notice_encode). */
#define NCFSM__FRAME_NOTICE_MIN 24u
#define NCFSM__FRAME_NOTICE_MAX (24u + 255u)

typedef enum ncfsm__frame_type {
  NCFSM__F_HELLO = 1,
  NCFSM__F_SET = 2,
  NCFSM__F_GET = 3,
  NCFSM__F_ADD = 4,
  NCFSM__F_WAIT = 5,
  NCFSM__F_GATHER = 6,
  NCFSM__F_AGREE = 7,
  NCFSM__F_LOST = 8,
  NCFSM__F_BCAST = 9,
  NCFSM__F_PING = 10,
  NCFSM__F_CHAN = 11,       /* key "@#<tag>", value u32 n + n x u32 job ranks: open a channel */
  NCFSM__F_CHAN_CLOSE = 12, /* key "@#<tag>", no value, no reply: close it */
  NCFSM__F_NOTICE = 13,     /* key = group, value = a notice (boot-internal.h); no reply */
  NCFSM__F_OK = 0x40,
  NCFSM__F_ERR = 0x41,
} ncfsm__frame_type_t;

typedef struct ncfsm__frame {
  uint8_t type;
  uint16_t flags;
  uint32_t id;
  uint32_t klen, vlen;
  const uint8_t *key;   /* points into the parsed buffer */
  const uint8_t *value; /* points into the parsed buffer */
} ncfsm__frame;

typedef struct ncfsm__frame_limits {
  uint32_t key_max;
  uint32_t value_max;
} ncfsm__frame_limits;

typedef enum ncfsm__parse {
  NCFSM__PARSE_OK = 0,   /* *f filled, *used = bytes the frame took */
  NCFSM__PARSE_MORE = 1, /* need *used bytes in all (NCFSM__FRAME_HDR while the header is short) */
  NCFSM__PARSE_ERR = 2,  /* *why says what is wrong; close the connection */
} ncfsm__parse_t;

/* Parse one frame from buf[0..n). Never reads past n, never allocates. A
 * wrong magic, version, type or a length over the limits is reported as soon
 * as the bytes that show it are present. */
ncfsm__parse_t ncfsm__frame_parse(const uint8_t *buf, size_t n, const ncfsm__frame_limits *lim,
                                  ncfsm__frame *f, size_t *used, const char **why);

/* Write a header into out (ncfsm__frame_header_v: of another version, for refusing a
 * version-1 peer in a frame it can read). */
void ncfsm__frame_header(uint8_t out[NCFSM__FRAME_HDR], uint8_t type, uint32_t id, uint32_t klen,
                         uint32_t vlen);
void ncfsm__frame_header_v(uint8_t out[NCFSM__FRAME_HDR], uint8_t version, uint8_t type, uint32_t id,
                           uint32_t klen, uint32_t vlen);

const char *ncfsm__frame_type_name(uint8_t type);

static inline uint32_t ncfsm__rd32(const uint8_t *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline void ncfsm__wr32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}
static inline uint64_t ncfsm__rd64(const uint8_t *p) {
  return ((uint64_t)ncfsm__rd32(p) << 32) | ncfsm__rd32(p + 4);
}
static inline void ncfsm__wr64(uint8_t *p, uint64_t v) {
  ncfsm__wr32(p, (uint32_t)(v >> 32));
  ncfsm__wr32(p + 4, (uint32_t)v);
}

#endif
