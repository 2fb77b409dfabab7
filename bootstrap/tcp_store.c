/*
 * The tcp bootstrap's key-value store server: an evconnlistener plus one
 * bufferevent per connection, all on the event_base that hosts it (rank 0's
 * loop, or tools/ncfsm-store). Single-threaded: every function runs on that
 * base's thread. This file opens and closes it and reads its settings (the
 * environment and ncfsm-store's flags, through the settings table); the other
 * parts (connections, ranks, requests, groups, replies, the table) are listed
 * in store-internal.h.
 *
 * Each connection must HELLO with the job token before anything else. A
 * malformed, oversized, truncated or unknown frame closes that connection
 * only (after an ERR frame naming the reason), logged at WARN.
 *
 * What one client can make the store hold is bounded (docs/bootstrap.md,
 * "Limits"):
 *  - input: a read high-watermark of one largest frame (one HELLO before
 *    authentication); a frame must arrive whole within frame_timeout_ms of
 *    its first byte (a HELLO within auth_timeout_ms of the accept); all
 *    connections' unfinished frames together at most max_inflight (past it
 *    the connection with the oldest unfinished frame is closed);
 *  - output: values and gather results are refcounted blobs that replies
 *    reference (a value sent to 600 unread GETs is held once, and counts in
 *    max_bytes until the last reply referencing it is gone); a connection
 *    whose queued replies pass out_high is not read until they drain below
 *    half of it, one whose replies pass out_max or are not read for
 *    out_stall_ms is closed; at most max_parked parked requests each; while
 *    all connections' queued replies pass max_out, a connection with
 *    replies queued is not read;
 *  - connections: past max_conns, or out of descriptors (EMFILE: a reserve
 *    descriptor is given up to accept the connection), a new connection gets
 *    an ERR "store busy" frame and is closed;
 *  - failed HELLOs: a token bucket per peer address (auth_fail_burst, then
 *    auth_fail_per_s); an empty bucket refuses HELLOs from that address
 *    unchecked with "throttled".
 *
 * Ranks: a HELLO with size > 0 claims rank < size of a job of that size. A
 * ranked connection that ends fails, for every other rank, each open GATHER
 * it had not contributed to, and (unless rejoin) every later one, naming the
 * rank; a second live claim of a rank fails every open and later GATHER.
 *
 * Recovery (docs/bootstrap.md, "Peer loss, agreement and the survivors'
 * bootstrap"): a ranked connection that ends is pushed as a LOST frame to
 * every other ranked connection (and to ranks that connect later). Groups:
 * "@" is the whole job; an AGREE of epoch E in group G completes when every
 * member of G not gone has posted E, answers the posters with the ranks that
 * posted and are alive, and makes the group "G/E" of those ranks, whose
 * GATHERs ("G/E:ag/<n>") are separate from every other group's. One
 * agreement open per group; epochs increase per group; the first poster's
 * timeout fails it naming the ranks that did not post. Groups and their
 * last failure message are charged to max_bytes and kept until the store
 * closes.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>

#include "bootstrap/store-internal.h"
#include "core/settings.h"

/* At most one WARN line per second per kind; the others are counted and
 * reported with the next line. */
void ncfsm__st_warn_limited(ncfsm__store *s, int kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void ncfsm__st_warn_limited(ncfsm__store *s, int kind, const char *fmt, ...) {
  uint64_t now = ncfsm__now_ns();
  if (s->warn_last_ns[kind] && now - s->warn_last_ns[kind] < 1000000000ull) {
    s->warn_dropped[kind]++;
    return;
  }
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (s->warn_dropped[kind])
    NCFSM_WARN(SUB, "%s (and %" PRIu64 " more like it in the last second)", msg, s->warn_dropped[kind]);
  else NCFSM_WARN(SUB, "%s", msg);
  s->warn_last_ns[kind] = now;
  s->warn_dropped[kind] = 0;
}

struct timeval ncfsm__st_ms_tv(uint64_t ms) {
  struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
  return tv;
}

/* ---- the store ------------------------------------------------------------------ */

void ncfsm__store_opts_init(ncfsm__store_opts *o) {
  memset(o, 0, sizeof *o);
  o->listen = "127.0.0.1:29500";
  o->key_max = NCFSM__FRAME_KEY_MAX;
  o->value_max = NCFSM__FRAME_VALUE_MAX;
  o->max_bytes = 1ull << 30;
  o->auth_timeout_ms = 10000;
  o->frame_timeout_ms = 10000;
  o->max_inflight = 64ull << 20;
  o->out_high = 4ull << 20;
  o->out_max = 256ull << 20;
  o->out_stall_ms = 60000;
  o->max_out = 256ull << 20;
  o->max_conns = 0; /* the open-file limit minus 64, at open */
  o->max_parked = 1024;
  o->rejoin = 0;
  o->auth_fail_burst = 10;
  o->auth_fail_per_s = 2;
  o->heartbeat_ms = 1000;
  o->silence_ms = 4000;
  o->max_channels = 1024;
  o->notices_per_s = 1000;
}

/* ---- the store's settings ----------------------------------------------------------
 * Each NCFSM_STORE_* row of the settings table (core/settings.def) that the store reads, the
 * ncfsm__store_opts field it sets and the ncfsm-store flag that sets the same field: the
 * environment is read strictly through the table (a bad value is refused, naming the
 * variable, the value and what is accepted), and ncfsm-store's flags take the table's ranges. */

struct ncfsm__store_flag {
  ncfsm__setting_id id;
  const char *flag; /* a switch for a BOOL row: sets the field to 1 (inverted: 0 is on) */
  size_t off, size;
  int inverted; /* the field is the row's opposite (heartbeat_off of NCFSM_STORE_HEARTBEAT) */
};

#define F(m) offsetof(ncfsm__store_opts, m), sizeof(((ncfsm__store_opts *)0)->m)
static const ncfsm__store_flag flags[] = {
    {NCFSM__SET_STORE_VALUE_MAX, "--value-max", F(value_max), 0},
    {NCFSM__SET_STORE_MAX_BYTES, "--max-bytes", F(max_bytes), 0},
    {NCFSM__SET_STORE_AUTH_TIMEOUT_MS, "--auth-timeout-ms", F(auth_timeout_ms), 0},
    {NCFSM__SET_STORE_FRAME_TIMEOUT_MS, "--frame-timeout-ms", F(frame_timeout_ms), 0},
    {NCFSM__SET_STORE_MAX_INFLIGHT, "--max-inflight", F(max_inflight), 0},
    {NCFSM__SET_STORE_OUT_HIGH, "--out-high", F(out_high), 0},
    {NCFSM__SET_STORE_OUT_MAX, "--out-max", F(out_max), 0},
    {NCFSM__SET_STORE_OUT_STALL_MS, "--out-stall-ms", F(out_stall_ms), 0},
    {NCFSM__SET_STORE_MAX_OUT, "--max-out", F(max_out), 0},
    {NCFSM__SET_STORE_MAX_CONNS, "--max-conns", F(max_conns), 0},
    {NCFSM__SET_STORE_MAX_PARKED, "--max-parked", F(max_parked), 0},
    {NCFSM__SET_STORE_AUTH_FAIL_BURST, "--auth-fail-burst", F(auth_fail_burst), 0},
    {NCFSM__SET_STORE_AUTH_FAIL_PER_S, "--auth-fail-per-s", F(auth_fail_per_s), 0},
    {NCFSM__SET_STORE_WORLD_SIZE, "--world-size", F(world_size), 0},
    {NCFSM__SET_STORE_HEARTBEAT_MS, "--heartbeat-ms", F(heartbeat_ms), 0},
    {NCFSM__SET_STORE_SILENCE_MS, "--silence-ms", F(silence_ms), 0},
    {NCFSM__SET_STORE_MAX_CHANNELS, "--max-channels", F(max_channels), 0},
    {NCFSM__SET_STORE_NOTICES_PER_S, "--notices-per-s", F(notices_per_s), 0},
    {NCFSM__SET_STORE_HEARTBEAT, "--no-heartbeat", F(heartbeat_off), 1},
    {NCFSM__SET_STORE_REJOIN, "--rejoin", F(rejoin), 0},
    {NCFSM__SET_STORE_RANK_SECRETS, "--rank-secrets", F(rank_secrets), 0},
    {NCFSM__SET_STORE_ALLOW_REMOTE, "--allow-remote", F(allow_remote), 0},
};
#undef F
#define NFLAGS (sizeof flags / sizeof flags[0])

/* Every field is a 4-byte (int, uint32_t) or 8-byte (uint64_t) number; the rows' ranges fit. */
static void field_set(ncfsm__store_opts *o, const ncfsm__store_flag *f, uint64_t v) {
  char *p = (char *)o + f->off;
  if (f->inverted) v = !v;
  if (f->size == 4) {
    uint32_t x = (uint32_t)v;
    memcpy(p, &x, sizeof x);
  } else {
    memcpy(p, &v, sizeof v);
  }
}

int ncfsm__store_opts_from_env(ncfsm__store_opts *o, char *err, size_t errlen) {
  for (size_t i = 0; i < NFLAGS; i++) {
    ncfsm__setting_val v;
    if (ncfsm__setting_get(&ncfsm__settings[flags[i].id], &v, err, errlen) != 0) return -1;
    if (v.from_env) field_set(o, &flags[i], v.u);
  }
  return 0;
}

void ncfsm__store_opts_env(ncfsm__store_opts *o) {
  char err[400];
  if (ncfsm__store_opts_from_env(o, err, sizeof err) != 0)
    NCFSM_WARN(NCFSM__SUB_BOOT, "%s (the rest of NCFSM_STORE_* not read)", err);
}

const ncfsm__store_flag *ncfsm__store_flag_find(const char *flag) {
  for (size_t i = 0; i < NFLAGS; i++)
    if (!strcmp(flag, flags[i].flag)) return &flags[i];
  return NULL;
}

int ncfsm__store_flag_takes_value(const ncfsm__store_flag *f) {
  return ncfsm__settings[f->id].type != NCFSM__T_BOOL;
}

int ncfsm__store_flag_set(ncfsm__store_opts *o, const ncfsm__store_flag *f, const char *value, char *err,
                          size_t errlen) {
  const ncfsm__setting *s = &ncfsm__settings[f->id];
  if (!ncfsm__store_flag_takes_value(f)) {
    field_set(o, f, f->inverted ? 0 : 1);
    return 0;
  }
  ncfsm__setting_val v;
  char why[300];
  if (ncfsm__setting_parse(s, value, &v, why, sizeof why) != 0 || v.word >= 0) {
    snprintf(err, errlen, "%s '%s': expected a number%s from %lld to %llu", f->flag, value,
             s->type == NCFSM__T_BYTES ? " of bytes" : "", (long long)s->min, (unsigned long long)s->max);
    return -1;
  }
  field_set(o, f, v.u);
  return 0;
}

void ncfsm__store_limits_get(const ncfsm__store *s, ncfsm__store_opts *o) { *o = s->o; }

int ncfsm__store_open(struct event_base *base, const ncfsm__store_opts *o, ncfsm__store **out,
                      char *err, size_t errlen) {
  *out = NULL;
  if (!o->token || !*o->token) {
    snprintf(err, errlen, "the store needs a job token: set NCFSM_STORE_TOKEN (e.g. to the output "
                          "of `openssl rand -hex 16`) for every rank and the store");
    return -1;
  }
  if (strlen(o->token) > (o->key_max ? o->key_max : NCFSM__FRAME_KEY_MAX)) {
    snprintf(err, errlen, "store token longer than %u bytes", o->key_max);
    return -1;
  }
  struct sockaddr_storage ss;
  int salen = sizeof ss;
  if (ncfsm__parse_addr(o->listen, (struct sockaddr *)&ss, &salen, err, errlen) != 0) return -1;
  if (!o->allow_remote && !ncfsm__addr_is_loopback((struct sockaddr *)&ss)) {
    snprintf(err, errlen, "store address %s is not a loopback address; the store has no TLS: set "
                          "NCFSM_STORE_ALLOW_REMOTE=1 (or --allow-remote) on a trusted network",
             o->listen);
    return -1;
  }
  ncfsm__store *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  ncfsm__store_opts d;
  ncfsm__store_opts_init(&d);
  s->o = *o;
#define DFLT(f) \
  if (!s->o.f) s->o.f = d.f
  DFLT(key_max);
  DFLT(value_max);
  DFLT(max_bytes);
  DFLT(auth_timeout_ms);
  DFLT(frame_timeout_ms);
  DFLT(max_inflight);
  DFLT(out_high);
  DFLT(out_max);
  DFLT(out_stall_ms);
  DFLT(max_out);
  DFLT(max_parked);
  DFLT(auth_fail_burst);
  DFLT(auth_fail_per_s);
  DFLT(heartbeat_ms);
  DFLT(silence_ms);
  DFLT(max_channels);
  DFLT(notices_per_s);
#undef DFLT
  if (s->o.max_conns <= 0) {
    struct rlimit rl;
    rlim_t lim = 1024;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) lim = rl.rlim_cur;
    if (lim == RLIM_INFINITY || lim > (1u << 20)) lim = 1u << 20;
    s->o.max_conns = lim > 64 + 16 ? (int)(lim - 64) : 16;
  }
  s->o.listen = NULL;
  s->o.world_from = NULL;
  s->o.token = NULL;
  s->base = base;
  s->reserve_fd = -1;
  s->toklen = strlen(o->token);
  s->token = (uint8_t *)strdup(o->token);
  s->lim.key_max = s->o.key_max;
  s->lim.value_max = s->o.value_max;
  if (s->lim.value_max < 8 + 1) s->lim.value_max = s->o.value_max = 9;
  s->hello_lim.key_max = s->o.key_max;
  s->hello_lim.value_max = 12;
  LIST_INIT(&s->conns);
  LIST_INIT(&s->held);
  TAILQ_INIT(&s->partials);
  LIST_INIT(&s->gathers);
  LIST_INIT(&s->groups);
  LIST_INIT(&s->blobs);
  s->relisten = evtimer_new(base, ncfsm__st_relisten_cb, s);
  s->hb_timer = event_new(base, -1, EV_PERSIST, ncfsm__st_hb_tick, s);
  if (!s->token || !s->relisten || !s->hb_timer) {
    snprintf(err, errlen, "out of memory");
    goto fail;
  }
  if (!s->o.heartbeat_off && (s->o.silence_ms < 2 * s->o.heartbeat_ms || s->o.silence_ms > UINT32_MAX)) {
    snprintf(err, errlen, "silence %" PRIu64 " ms must be at least twice the heartbeat (%" PRIu64
                          " ms): raise --silence-ms / NCFSM_STORE_SILENCE_MS or lower "
                          "--heartbeat-ms / NCFSM_STORE_HEARTBEAT_MS",
             s->o.silence_ms, s->o.heartbeat_ms);
    goto fail;
  }
  if (!s->o.heartbeat_off) {
    struct timeval hb = ncfsm__st_ms_tv(s->o.heartbeat_ms);
    event_add(s->hb_timer, &hb);
  }
  if (o->world_size > (1u << 22)) {
    snprintf(err, errlen, "world size %u: the store serves jobs of at most %u ranks", o->world_size,
             1u << 22);
    goto fail;
  }
  if (o->world_size &&
      ncfsm__st_job_size_set(s, o->world_size,
                             o->world_from ? o->world_from
                                           : "the store's --world-size / NCFSM_STORE_WORLD_SIZE") != 0) {
    snprintf(err, errlen, "max bytes too small for a job of %u ranks", o->world_size);
    goto fail;
  }
  s->lis = evconnlistener_new_bind(base, ncfsm__st_accept_cb, s,
                                   LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
                                   4096, (struct sockaddr *)&ss, salen);
  if (!s->lis) {
    snprintf(err, errlen, "store cannot listen on %s: %s (another store or job on that port? pick "
                          "another NCFSM_STORE_ADDR port)",
             o->listen, evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    goto fail;
  }
  evconnlistener_set_error_cb(s->lis, ncfsm__st_accept_error_cb);
  s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  struct sockaddr_storage bound;
  socklen_t blen = sizeof bound;
  if (getsockname(evconnlistener_get_fd(s->lis), (struct sockaddr *)&bound, &blen) == 0)
    s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
  NCFSM_INFO(SUB, "store: listening on %s (port %d); max %d connections, frame timeout %" PRIu64
                  " ms, max inflight %" PRIu64 ", out high/max %" PRIu64 "/%" PRIu64
                  ", max bytes %" PRIu64 "; heartbeats %s every %" PRIu64 " ms, silence %" PRIu64
                  " ms",
             o->listen, s->port, s->o.max_conns, s->o.frame_timeout_ms, s->o.max_inflight,
             s->o.out_high, s->o.out_max, s->o.max_bytes, s->o.heartbeat_off ? "off" : "on",
             s->o.heartbeat_ms, s->o.silence_ms);
  *out = s;
  return 0;
fail:
  if (s->relisten) event_free(s->relisten);
  if (s->hb_timer) event_free(s->hb_timer);
  free(s->ranks);
  free(s->token);
  free(s);
  return -1;
}

int ncfsm__store_port(const ncfsm__store *s) { return s ? s->port : -1; }

void ncfsm__store_stats_get(const ncfsm__store *s, ncfsm__store_stats *st) {
  *st = s->st;
  st->bytes = s->bytes;
  st->inflight = s->inflight;
  st->out_queued = s->out_queued;
}

void ncfsm__store_close(ncfsm__store *s) {
  if (!s) return;
  struct sconn *c;
  while ((c = LIST_FIRST(&s->conns)) != NULL) {
    c->released = 1; /* the store is going: no gather failures to send */
    ncfsm__st_conn_free(c);
  }
  evconnlistener_free(s->lis);
  event_free(s->relisten);
  event_free(s->hb_timer);
  if (s->reserve_fd >= 0) close(s->reserve_fd);
  ncfsm__st_table_clear(s);
  struct group *g;
  while ((g = LIST_FIRST(&s->groups)) != NULL) {
    LIST_REMOVE(g, link);
    ncfsm__st_group_free(s, g);
  }
  /* Replies not yet freed by libevent may still reference blobs: detach them. */
  struct blob *b;
  while ((b = LIST_FIRST(&s->blobs)) != NULL) {
    LIST_REMOVE(b, link);
    b->s = NULL;
  }
  if (s->ranks)
    for (uint32_t r = 0; r < s->job_size; r++) free(s->ranks[r].why);
  free(s->ranks);
  free(s->conflict);
  memset(s->token, 0, s->toklen);
  free(s->token);
  free(s);
}
