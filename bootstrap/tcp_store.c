/*
 * The tcp bootstrap's key-value store server: an evconnlistener plus one
 * bufferevent per connection, all on the event_base that hosts it (rank 0's
 * loop, or tools/ncfsm-store). Single-threaded: every function runs on that
 * base's thread.
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
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <xxhash.h>

#include "bootstrap/frame.h"
#include "bootstrap/secret.h"
#include "bootstrap/tcp-internal.h"
#include "core/log.h"

struct sconn;
struct entry;
struct group;

/* A value or a gather result: referenced by the table and by queued replies. */
struct blob {
  LIST_ENTRY(blob) link;
  ncfsm__store *s; /* NULL once the store closed (replies may outlive it) */
  int refs;
  size_t len;
  uint8_t data[];
};

struct waiter {
  LIST_ENTRY(waiter) by_entry;
  LIST_ENTRY(waiter) by_conn;
  struct sconn *c;
  struct entry *e;
  uint32_t id;
  uint8_t type;
};

struct entry {
  struct entry *hnext;
  uint64_t h;
  uint8_t *key;
  uint32_t klen;
  struct blob *val; /* SET/ADD value, NULL while only waited on */
  int gather;
  uint32_t g_size, g_len, g_count;
  struct blob *g_buf;
  uint8_t *g_have;
  char *failed;     /* a failed GATHER: every later contribution gets this */
  struct group *grp; /* a survivors' group's GATHER (g_have by index in it); NULL: the job's */
  int bcast;         /* a BCAST (gather is set too): g_buf = root's bytes once posted, g_have[i]
                        1 posted, 2 gone before posting; done when all size are counted */
  uint32_t b_root;
  LIST_ENTRY(entry) g_link; /* in s->gathers while the gather is open */
  LIST_HEAD(, waiter) waiters;
};

enum { T_NONE, T_AUTH, T_FRAME };

struct sconn {
  ncfsm__store *s;
  struct bufferevent *bev;
  struct event *timer;      /* auth deadline, then each frame's deadline; deferred close */
  int timer_kind;
  const char *fail_later;   /* set: the timer closes the connection with this */
  char fail_buf[400];
  char peer[80];
  uint8_t akey[17];         /* peer address (family, bytes) for the throttle */
  int authed, closing, paused, ranked, released, overflow;
  struct evbuffer_cb_entry *out_cb; /* counts the output in s->out_queued */
  uint32_t rank;
  uint32_t parked;
  size_t in_acct;           /* input bytes counted in s->inflight */
  int in_partial;           /* in s->partials */
  uint64_t frame_start_ns;
  TAILQ_ENTRY(sconn) partial;
  LIST_HEAD(, waiter) waiters;
  LIST_HEAD(, agwaiter) agw;  /* parked AGREEs */
  LIST_ENTRY(sconn) link;
};

/* A parked AGREE. */
struct agwaiter {
  LIST_ENTRY(agwaiter) by_grp;
  LIST_ENTRY(agwaiter) by_conn;
  struct sconn *c;
  struct group *g;
  uint32_t id;
};

/* "@" (the job) or the survivors of a completed agreement ("@/3", "@/3/5"). */
struct group {
  ncfsm__store *s;
  struct group *hnext;
  LIST_ENTRY(group) link;
  uint64_t h;
  char *path;
  uint32_t plen;
  uint32_t n;
  uint32_t *ranks;          /* [n] job ranks, ascending; NULL: "@", every rank */
  char *gone;               /* the first member gone: later GATHERs of the group get it */
  uint64_t charged;
  /* the agreement open in this group */
  uint64_t open_epoch;      /* 0: none */
  uint8_t *posted;          /* [n] */
  uint64_t deadline_ns;
  uint64_t timeout_ms;
  struct event *timer;
  LIST_HEAD(, agwaiter) waiters;
  uint64_t last_epoch;      /* the last epoch completed or failed */
  char *last_fail;          /* why the last failed one failed */
};

#define GROUP_BUCKETS 256

enum { RS_NONE = 0, RS_LIVE, RS_GONE };

struct rankslot {
  struct sconn *c;
  char *why;                /* RS_GONE: what happened, for later GATHERs */
  uint8_t state;
};

#define THROTTLE_SLOTS 256

struct throttle {
  uint8_t akey[17];
  int used;
  double tokens;
  uint64_t last_ns, fails;
};

enum { W_ACCEPT, W_BUSY, W_THROTTLE, W_CLOSE, W_KINDS };

struct ncfsm__store {
  struct event_base *base;
  struct evconnlistener *lis;
  struct event *relisten;
  int relisten_ms;
  int port;
  int reserve_fd;
  uint8_t *token;
  size_t toklen;
  ncfsm__frame_limits lim, hello_lim;
  ncfsm__store_opts o; /* the limits in force */
  uint64_t bytes, inflight, out_queued;
  struct entry **tab;
  size_t nb, count;
  LIST_HEAD(, sconn) conns;
  TAILQ_HEAD(, sconn) partials; /* connections holding an unfinished frame, oldest first */
  LIST_HEAD(, entry) gathers;   /* open gathers */
  struct group *gtab[GROUP_BUCKETS];
  LIST_HEAD(, group) groups;
  LIST_HEAD(, blob) blobs;
  struct rankslot *ranks;
  uint32_t job_size;
  char job_from[80];
  uint32_t n_gone, first_gone;
  char *conflict;               /* sticky: a rank was claimed twice */
  struct throttle thr[THROTTLE_SLOTS];
  uint64_t warn_last_ns[W_KINDS], warn_dropped[W_KINDS];
  ncfsm__store_stats st;
};

#define SUB NCFSM__SUB_BOOT

/* At most one WARN line per second per kind; the others are counted and
 * reported with the next line. */
static void warn_limited(ncfsm__store *s, int kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void warn_limited(ncfsm__store *s, int kind, const char *fmt, ...) {
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

static struct timeval ms_tv(uint64_t ms) {
  struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
  return tv;
}

/* ---- helpers shared with the client -------------------------------------- */

int ncfsm__ct_equal(const void *a, size_t alen, const void *b, size_t blen) {
  const volatile uint8_t *x = a, *y = b;
  size_t n = alen > blen ? alen : blen;
  uint8_t d = (uint8_t)(alen != blen);
  for (size_t i = 0; i < n; i++) {
    uint8_t xi = i < alen ? x[i] : 0, yi = i < blen ? y[i] : 0;
    d |= (uint8_t)(xi ^ yi);
  }
  return d == 0;
}

int ncfsm__parse_addr(const char *addr, struct sockaddr *sa, int *salen, char *err, size_t errlen) {
  int len = *salen;
  if (!addr || !*addr) {
    snprintf(err, errlen, "empty store address: set NCFSM_STORE_ADDR=host:port");
    return -1;
  }
  if (evutil_parse_sockaddr_port(addr, sa, &len) == 0) {
    *salen = len;
    return 0;
  }
  char host[256];
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host || !colon[1]) {
    snprintf(err, errlen, "store address '%s' is not host:port", addr);
    return -1;
  }
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = 0;
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host, colon + 1, &hints, &res);
  if (rc != 0 || !res) {
    snprintf(err, errlen, "store address '%s': %s", addr, gai_strerror(rc));
    return -1;
  }
  if ((int)res->ai_addrlen > *salen) {
    freeaddrinfo(res);
    snprintf(err, errlen, "store address '%s': address too long", addr);
    return -1;
  }
  memcpy(sa, res->ai_addr, res->ai_addrlen);
  *salen = (int)res->ai_addrlen;
  freeaddrinfo(res);
  return 0;
}

int ncfsm__addr_is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return 1;
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) return in6->sin6_addr.s6_addr[12] == 127;
  }
  return 0;
}

/* ---- accounting (max_bytes) ------------------------------------------------ */

static int charge(ncfsm__store *s, uint64_t n) {
  if (s->bytes + n > s->o.max_bytes) return -1;
  s->bytes += n;
  if (s->bytes > s->st.peak_bytes) s->st.peak_bytes = s->bytes;
  return 0;
}
static void uncharge(ncfsm__store *s, uint64_t n) { s->bytes -= n; }

static struct blob *blob_new(ncfsm__store *s, size_t len) {
  if (charge(s, sizeof(struct blob) + len) != 0) return NULL;
  struct blob *b = malloc(sizeof *b + (len ? len : 1));
  if (!b) {
    uncharge(s, sizeof(struct blob) + len);
    return NULL;
  }
  b->s = s;
  b->refs = 1;
  b->len = len;
  LIST_INSERT_HEAD(&s->blobs, b, link);
  return b;
}

static void blob_unref(struct blob *b) {
  if (--b->refs) return;
  if (b->s) {
    LIST_REMOVE(b, link);
    uncharge(b->s, sizeof *b + b->len);
  }
  free(b);
}

static void blob_unref_cb(const void *data, size_t len, void *arg) {
  (void)data;
  (void)len;
  blob_unref(arg);
}

/* ---- the table -------------------------------------------------------------- */

static struct entry *table_find(ncfsm__store *s, const uint8_t *key, uint32_t klen, uint64_t h) {
  for (struct entry *e = s->tab[h & (s->nb - 1)]; e; e = e->hnext)
    if (e->h == h && e->klen == klen && !memcmp(e->key, key, klen)) return e;
  return NULL;
}

static void table_grow(ncfsm__store *s) {
  size_t nb = s->nb * 2;
  struct entry **t = calloc(nb, sizeof *t);
  if (!t) return; /* keep the longer chains */
  for (size_t i = 0; i < s->nb; i++)
    for (struct entry *e = s->tab[i], *next; e; e = next) {
      next = e->hnext;
      e->hnext = t[e->h & (nb - 1)];
      t[e->h & (nb - 1)] = e;
    }
  free(s->tab);
  s->tab = t;
  s->nb = nb;
}

static struct entry *table_get(ncfsm__store *s, const uint8_t *key, uint32_t klen, int create) {
  uint64_t h = XXH64(key, klen, 0);
  struct entry *e = table_find(s, key, klen, h);
  if (e || !create) return e;
  if (charge(s, klen + sizeof *e) != 0) return NULL;
  e = calloc(1, sizeof *e);
  if (!e || !(e->key = malloc(klen ? klen : 1))) {
    free(e);
    uncharge(s, klen + sizeof *e);
    return NULL;
  }
  memcpy(e->key, key, klen);
  e->klen = klen;
  e->h = h;
  LIST_INIT(&e->waiters);
  e->hnext = s->tab[h & (s->nb - 1)];
  s->tab[h & (s->nb - 1)] = e;
  if (++s->count > 2 * s->nb) table_grow(s);
  return e;
}

/* Free a gather's buffers (the result may live on in queued replies). */
static void gather_release(ncfsm__store *s, struct entry *e) {
  if (e->g_buf) blob_unref(e->g_buf);
  e->g_buf = NULL;
  if (e->g_have) uncharge(s, e->g_size);
  free(e->g_have);
  e->g_have = NULL;
  if (e->gather && !e->failed) LIST_REMOVE(e, g_link);
}

static char failed_oom[] = "allgather failed (and the store is out of memory)";

static void entry_delete(ncfsm__store *s, struct entry *e) {
  struct entry **pp = &s->tab[e->h & (s->nb - 1)];
  while (*pp != e) pp = &(*pp)->hnext;
  *pp = e->hnext;
  s->count--;
  uncharge(s, e->klen + sizeof *e);
  if (e->val) blob_unref(e->val);
  if (e->gather) gather_release(s, e);
  if (e->failed && e->failed != failed_oom) {
    uncharge(s, strlen(e->failed) + 1);
    free(e->failed);
  }
  free(e->key);
  free(e);
}

/* An entry made only to park GET/WAITs is dropped once nobody waits on it. */
static void entry_maybe_drop(ncfsm__store *s, struct entry *e) {
  if (!e->val && !e->gather && LIST_EMPTY(&e->waiters)) entry_delete(s, e);
}

/* "ag/3" for messages (keys are bytes). */
static const char *key_str(const struct entry *e, char *buf, size_t n) {
  size_t k = 0;
  for (uint32_t i = 0; i < e->klen && k + 1 < n; i++)
    buf[k++] = (e->key[i] >= 0x20 && e->key[i] < 0x7f) ? (char)e->key[i] : '?';
  buf[k] = 0;
  return buf;
}

/* ---- replies ------------------------------------------------------------------ */

#define COPY_MAX 256 /* larger values are referenced, not copied, by replies */

static void fail_later(struct sconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* May n more bytes be queued to c? Past out_max (a reply into an empty queue
 * always may) the connection is closed from its timer, not here: replies are
 * sent while the table is being walked. */
static int out_room(struct sconn *c, size_t n) {
  if (c->closing || c->overflow || c->fail_later) return 0;
  size_t q = evbuffer_get_length(bufferevent_get_output(c->bev));
  if (q > 0 && q + n > c->s->o.out_max) {
    c->overflow = 1;
    c->s->st.closed_unread++;
    fail_later(c, "not reading its replies: %zu bytes queued and %zu more due, over the store's "
                  "out_max of %" PRIu64 " (read replies as they come, or raise --out-max / "
                  "NCFSM_STORE_OUT_MAX)",
               q, n, c->s->o.out_max);
    return 0;
  }
  return 1;
}

static void reply(struct sconn *c, uint8_t type, uint32_t id, const void *val, uint32_t vlen) {
  if (!out_room(c, NCFSM__FRAME_HDR + (size_t)vlen)) return;
  uint8_t hdr[NCFSM__FRAME_HDR];
  ncfsm__frame_header(hdr, type, id, 0, vlen);
  struct evbuffer *out = bufferevent_get_output(c->bev);
  evbuffer_add(out, hdr, sizeof hdr);
  if (vlen) evbuffer_add(out, val, vlen);
}

static void reply_err(struct sconn *c, uint32_t id, const char *msg) {
  reply(c, NCFSM__F_ERR, id, msg, (uint32_t)strlen(msg));
}

/* OK + the blob's bytes: copied when small, else a reference. */
static void reply_blob(struct sconn *c, uint32_t id, struct blob *b) {
  if (b->len <= COPY_MAX) return reply(c, NCFSM__F_OK, id, b->data, (uint32_t)b->len);
  if (!out_room(c, NCFSM__FRAME_HDR + b->len)) return;
  uint8_t hdr[NCFSM__FRAME_HDR];
  ncfsm__frame_header(hdr, NCFSM__F_OK, id, 0, (uint32_t)b->len);
  struct evbuffer *out = bufferevent_get_output(c->bev);
  evbuffer_add(out, hdr, sizeof hdr);
  b->refs++;
  if (evbuffer_add_reference(out, b->data, b->len, blob_unref_cb, b) != 0) {
    b->refs--;
    evbuffer_add(out, b->data, b->len);
  }
}

static void waiter_free(ncfsm__store *s, struct waiter *w) {
  LIST_REMOVE(w, by_entry);
  LIST_REMOVE(w, by_conn);
  w->c->parked--;
  uncharge(s, sizeof *w);
  free(w);
}

/* Answer every GET/WAIT parked on e (which now has a value). */
static void wake_waiters(ncfsm__store *s, struct entry *e) {
  struct waiter *w;
  while ((w = LIST_FIRST(&e->waiters)) != NULL) {
    if (w->type == NCFSM__F_GET) reply_blob(w->c, w->id, e->val);
    else reply(w->c, NCFSM__F_OK, w->id, NULL, 0);
    waiter_free(s, w);
  }
}

/* Park a request of c on e: NULL, or why not (the request is refused). */
static const char *park(struct sconn *c, struct entry *e, uint8_t type, uint32_t id) {
  ncfsm__store *s = c->s;
  if (c->parked >= s->o.max_parked) return "parked";
  if (charge(s, sizeof(struct waiter)) != 0) return "store full (NCFSM store max bytes)";
  struct waiter *w = calloc(1, sizeof *w);
  if (!w) {
    uncharge(s, sizeof *w);
    return "store out of memory";
  }
  w->c = c;
  w->e = e;
  w->id = id;
  w->type = type;
  c->parked++;
  LIST_INSERT_HEAD(&e->waiters, w, by_entry);
  LIST_INSERT_HEAD(&c->waiters, w, by_conn);
  return NULL;
}

/* A gather that cannot complete: every parked rank gets msg, and so does
 * every rank that contributes later (the entry stays as a tombstone). */
static void gather_fail(ncfsm__store *s, struct entry *e, const char *msg) {
  s->st.gathers_failed++;
  struct waiter *w;
  while ((w = LIST_FIRST(&e->waiters)) != NULL) {
    reply_err(w->c, w->id, msg);
    waiter_free(s, w);
  }
  gather_release(s, e);
  e->failed = strdup(msg);
  if (e->failed) s->bytes += strlen(msg) + 1; /* bounded: one per collective that failed */
  else e->failed = failed_oom;
}

/* ---- groups and agreements (recovery) -------------------------------------------- */

static uint32_t group_rank(const struct group *g, uint32_t i) { return g->ranks ? g->ranks[i] : i; }

/* rank's index in g, or -1. */
static int64_t group_index(const struct group *g, uint32_t rank) {
  if (!g->ranks) return rank < g->n ? (int64_t)rank : -1;
  uint32_t lo = 0, hi = g->n;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (g->ranks[mid] == rank) return mid;
    if (g->ranks[mid] < rank) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

static struct group *group_find(ncfsm__store *s, const void *path, uint32_t plen) {
  uint64_t h = XXH64(path, plen, 1);
  for (struct group *g = s->gtab[h % GROUP_BUCKETS]; g; g = g->hnext)
    if (g->h == h && g->plen == plen && !memcmp(g->path, path, plen)) return g;
  return NULL;
}

static void ag_timer_cb(evutil_socket_t fd, short what, void *arg);

/* A new group of n members (ranks: ascending job ranks, taken over; NULL:
 * every rank of the job), or NULL when max_bytes has no room. */
static struct group *group_new(ncfsm__store *s, const char *path, uint32_t plen, uint32_t n,
                               uint32_t *ranks) {
  uint64_t cost = sizeof(struct group) + plen + 1 + (uint64_t)n * (ranks ? 5 : 1) + 128;
  if (charge(s, cost) != 0) return NULL;
  struct group *g = calloc(1, sizeof *g);
  if (g) {
    g->path = malloc(plen + 1);
    g->posted = calloc(n ? n : 1, 1);
    g->timer = evtimer_new(s->base, ag_timer_cb, g);
  }
  if (!g || !g->path || !g->posted || !g->timer) {
    if (g) {
      free(g->path);
      free(g->posted);
      if (g->timer) event_free(g->timer);
      free(g);
    }
    uncharge(s, cost);
    return NULL;
  }
  g->s = s;
  memcpy(g->path, path, plen);
  g->path[plen] = 0;
  g->plen = plen;
  g->n = n;
  g->ranks = ranks;
  g->charged = cost;
  g->h = XXH64(path, plen, 1);
  LIST_INIT(&g->waiters);
  g->hnext = s->gtab[g->h % GROUP_BUCKETS];
  s->gtab[g->h % GROUP_BUCKETS] = g;
  LIST_INSERT_HEAD(&s->groups, g, link);
  s->st.groups++;
  return g;
}

static void agwaiter_free(ncfsm__store *s, struct agwaiter *w) {
  LIST_REMOVE(w, by_grp);
  LIST_REMOVE(w, by_conn);
  w->c->parked--;
  uncharge(s, sizeof *w);
  free(w);
}

static void set_msg(ncfsm__store *s, char **slot, const char *msg) {
  if (*slot) {
    uncharge(s, strlen(*slot) + 1);
    free(*slot);
  }
  *slot = msg ? strdup(msg) : NULL;
  if (*slot) s->bytes += strlen(msg) + 1; /* bounded: one per group */
}

static void group_free(ncfsm__store *s, struct group *g) {
  struct agwaiter *w;
  while ((w = LIST_FIRST(&g->waiters)) != NULL) agwaiter_free(s, w);
  set_msg(s, &g->gone, NULL);
  set_msg(s, &g->last_fail, NULL);
  event_free(g->timer);
  free(g->posted);
  free(g->ranks);
  free(g->path);
  uncharge(s, g->charged);
  s->st.groups--;
  free(g);
}

/* "rank 3, rank 5 (job rank 7)" of the live members of g with posted[i] ==
 * want (at most 16 named). */
static const char *group_list(ncfsm__store *s, const struct group *g, int want, char *buf,
                              size_t n) {
  size_t k = 0;
  int named = 0, more = 0;
  buf[0] = 0;
  for (uint32_t i = 0; i < g->n; i++) {
    uint32_t r = group_rank(g, i);
    if (s->ranks[r].state == RS_GONE || (g->posted[i] != 0) != (want != 0)) continue;
    if (named == 16) {
      more++;
      continue;
    }
    int w = g->ranks ? snprintf(buf + k, n - k, "%srank %u (job rank %u)", named ? ", " : "", i, r)
                     : snprintf(buf + k, n - k, "%srank %u", named ? ", " : "", r);
    if (w < 0 || (size_t)w >= n - k) break;
    k += (size_t)w;
    named++;
  }
  if (more && k < n) snprintf(buf + k, n - k, " and %d more", more);
  if (!named) snprintf(buf, n, "none");
  return buf;
}

/* The open agreement of g fails: every poster gets msg; the epoch is used. */
static void ag_fail(ncfsm__store *s, struct group *g, const char *msg) {
  struct agwaiter *w;
  while ((w = LIST_FIRST(&g->waiters)) != NULL) {
    reply_err(w->c, w->id, msg);
    agwaiter_free(s, w);
  }
  if (g->open_epoch > g->last_epoch) g->last_epoch = g->open_epoch;
  g->open_epoch = 0;
  event_del(g->timer);
  set_msg(s, &g->last_fail, msg);
  s->st.agreements_failed++;
  NCFSM_INFO(SUB, "store: %s", msg);
}

static void ag_timer_cb(evutil_socket_t fd, short what, void *arg) {
  struct group *g = arg;
  (void)fd;
  (void)what;
  if (!g->open_epoch || LIST_EMPTY(&g->waiters)) return;
  ncfsm__store *s = g->s;
  char missing[300], posted[300], msg[800];
  snprintf(msg, sizeof msg, "agreement epoch %" PRIu64 " of group %s not complete after %" PRIu64
                            " ms: %s did not post it (posted: %s); every live rank must post the "
                            "same epoch, or raise NCFSM_BOOTSTRAP_TIMEOUT_MS",
           g->open_epoch, g->path, g->timeout_ms, group_list(s, g, 0, missing, sizeof missing),
           group_list(s, g, 1, posted, sizeof posted));
  ag_fail(s, g, msg);
}

/* Complete g's open agreement if every member not gone has posted. */
static void ag_eval(ncfsm__store *s, struct group *g) {
  if (!g->open_epoch) return;
  uint32_t cnt = 0;
  for (uint32_t i = 0; i < g->n; i++) {
    if (s->ranks[group_rank(g, i)].state == RS_GONE) continue;
    if (!g->posted[i]) return;
    cnt++;
  }
  uint64_t epoch = g->open_epoch;
  if (cnt == 0 || LIST_EMPTY(&g->waiters)) { /* every poster is gone: nobody to answer */
    g->open_epoch = 0;
    g->last_epoch = epoch;
    event_del(g->timer);
    return;
  }
  char path[NCFSM__FRAME_KEY_MAX + 32], msg[300];
  int pl = snprintf(path, sizeof path, "%s/%" PRIu64, g->path, epoch);
  if (pl < 0 || (uint32_t)pl + 24 > s->o.key_max) {
    snprintf(msg, sizeof msg, "agreement epoch %" PRIu64 " of group %.64s: survivors' groups nested "
                              "too deep (the group name would pass the %u-byte key limit)",
             epoch, g->path, s->o.key_max);
    return ag_fail(s, g, msg);
  }
  uint32_t *ranks = malloc((size_t)cnt * sizeof *ranks);
  struct group *child = NULL;
  struct blob *res = NULL;
  if (ranks) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < g->n; i++) {
      uint32_t r = group_rank(g, i);
      if (g->posted[i] && s->ranks[r].state != RS_GONE) ranks[k++] = r;
    }
    child = group_new(s, path, (uint32_t)pl, cnt, ranks);
    if (!child) free(ranks);
  }
  if (child) res = blob_new(s, s->job_size);
  if (!res) {
    snprintf(msg, sizeof msg, "agreement epoch %" PRIu64 " of group %.64s: store full (no room for "
                              "the survivors' group; raise --max-bytes)",
             epoch, g->path);
    return ag_fail(s, g, msg);
  }
  memset(res->data, 0, res->len);
  for (uint32_t k = 0; k < cnt; k++) res->data[child->ranks[k]] = 1;
  struct agwaiter *w;
  while ((w = LIST_FIRST(&g->waiters)) != NULL) {
    reply_blob(w->c, w->id, res);
    agwaiter_free(s, w);
  }
  blob_unref(res);
  g->open_epoch = 0;
  g->last_epoch = epoch;
  event_del(g->timer);
  s->st.agreements_done++;
  NCFSM_INFO(SUB, "store: agreement epoch %" PRIu64 " of group %s complete: %u of %u ranks (group %s)",
             epoch, g->path, cnt, g->n, child->path);
}

/* Tell every other ranked connection that rank was lost. */
static void push_lost(ncfsm__store *s, uint32_t rank, const char *why) {
  size_t wl = strlen(why);
  if (wl > 1000) wl = 1000;
  uint8_t v[4 + 1000];
  ncfsm__wr32(v, rank);
  memcpy(v + 4, why, wl);
  struct sconn *o;
  LIST_FOREACH(o, &s->conns, link) {
    if (!o->ranked || o->released || o->closing || o->rank == rank) continue;
    reply(o, NCFSM__F_LOST, 0, v, (uint32_t)(4 + wl));
    s->st.lost_pushed++;
  }
}

static const char *handle_agree(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n);

/* A broadcast that root posted and every member posted or is gone: nothing more to send. */
static void bcast_maybe_done(ncfsm__store *s, struct entry *e) {
  if (!e->bcast || e->failed || !e->g_buf || e->g_count < e->g_size || !LIST_EMPTY(&e->waiters))
    return;
  s->st.bcasts_done++;
  entry_delete(s, e);
}

/* A ranked connection ended (closed, died, or closed by the store): every
 * open gather it had not contributed to fails for the others at once. */
static void rank_release(struct sconn *c, const char *reason) {
  ncfsm__store *s = c->s;
  if (!c->ranked || c->released) return;
  c->released = 1;
  struct rankslot *slot = &s->ranks[c->rank];
  if (slot->c != c) return;
  char why[400];
  snprintf(why, sizeof why, "rank %u (%s) disconnected: %s", c->rank, c->peer, reason);
  slot->c = NULL;
  slot->state = RS_GONE;
  free(slot->why);
  slot->why = strdup(why);
  if (s->n_gone++ == 0) s->first_gone = c->rank;
  s->st.ranks_gone++;
  NCFSM_INFO(SUB, "store: %s", why);
  struct agwaiter *aw;
  while ((aw = LIST_FIRST(&c->agw)) != NULL) agwaiter_free(s, aw);
  push_lost(s, c->rank, why);
  for (struct entry *e = LIST_FIRST(&s->gathers), *next; e; e = next) {
    next = LIST_NEXT(e, g_link);
    int64_t i = e->grp ? group_index(e->grp, c->rank) : (int64_t)c->rank;
    if (i < 0 || e->g_have[i]) continue;
    char k[48], msg[600];
    if (e->bcast && (uint32_t)i != e->b_root) { /* a receiver gone: the others still get it */
      e->g_have[i] = 2;
      e->g_count++;
      bcast_maybe_done(s, e);
      continue;
    }
    if (e->bcast) {
      snprintf(msg, sizeof msg,
               "broadcast %s failed: its root, rank %u (%s), disconnected before posting it (%s); "
               "see rank %u's log",
               key_str(e, k, sizeof k), c->rank, c->peer, reason, c->rank);
      gather_fail(s, e, msg);
      continue;
    }
    snprintf(msg, sizeof msg,
             "allgather %s failed: rank %u (%s) disconnected before contributing (%s); see rank "
             "%u's log",
             key_str(e, k, sizeof k), c->rank, c->peer, reason, c->rank);
    gather_fail(s, e, msg);
  }
  /* the survivors' groups it belonged to: later GATHERs fail, open agreements
   * go on without it (its loss may complete one) */
  struct group *g;
  LIST_FOREACH(g, &s->groups, link) {
    int64_t i = group_index(g, c->rank);
    if (i < 0) continue;
    if (g->ranks && !g->gone) set_msg(s, &g->gone, why);
    if (g->open_epoch) {
      g->posted[i] = 0;
      ag_eval(s, g); /* a group it makes is put at the head: not visited again */
    }
  }
}

/* ---- connections ------------------------------------------------------------------ */

/* Count c's input in s->inflight; keep s->partials (connections with an
 * unfinished frame, oldest first) and the frame deadline up to date. */
static void input_account(struct sconn *c, int frame_done) {
  ncfsm__store *s = c->s;
  size_t n = evbuffer_get_length(bufferevent_get_input(c->bev));
  s->inflight = s->inflight - c->in_acct + n;
  c->in_acct = n;
  if (s->inflight > s->st.peak_inflight) s->st.peak_inflight = s->inflight;
  int partial = n > 0 && !c->paused && !c->closing;
  if (c->in_partial && (!partial || frame_done)) {
    TAILQ_REMOVE(&s->partials, c, partial);
    c->in_partial = 0;
    if (c->timer_kind == T_FRAME) {
      event_del(c->timer);
      c->timer_kind = T_NONE;
    }
  }
  if (partial && !c->in_partial) {
    TAILQ_INSERT_TAIL(&s->partials, c, partial);
    c->in_partial = 1;
    c->frame_start_ns = ncfsm__now_ns();
    if (c->authed && !c->fail_later) {
      struct timeval tv = ms_tv(s->o.frame_timeout_ms);
      c->timer_kind = T_FRAME;
      evtimer_add(c->timer, &tv);
    }
  }
}

static void conn_free(struct sconn *c) {
  ncfsm__store *s = c->s;
  rank_release(c, "connection closed");
  struct evbuffer *out = bufferevent_get_output(c->bev);
  if (c->out_cb) evbuffer_remove_cb_entry(out, c->out_cb);
  s->out_queued -= evbuffer_get_length(out);
  struct waiter *w;
  while ((w = LIST_FIRST(&c->waiters)) != NULL) {
    struct entry *e = w->e;
    waiter_free(s, w);
    entry_maybe_drop(s, e);
  }
  struct agwaiter *aw;
  while ((aw = LIST_FIRST(&c->agw)) != NULL) agwaiter_free(s, aw);
  if (c->in_partial) TAILQ_REMOVE(&s->partials, c, partial);
  s->inflight -= c->in_acct;
  event_free(c->timer);
  LIST_REMOVE(c, link);
  s->st.open_conns--;
  bufferevent_free(c->bev);
  free(c);
}

/* While closing, input is read and dropped: a socket closed with unread
 * input sends a reset, which can destroy the ERR frame before the peer
 * reads it. */
static void conn_closing_read_cb(struct bufferevent *bev, void *arg) {
  struct evbuffer *in = bufferevent_get_input(bev);
  (void)arg;
  evbuffer_drain(in, evbuffer_get_length(in));
}

static void conn_closing_write_cb(struct bufferevent *bev, void *arg) {
  (void)bev;
  conn_free(arg);
}

static void conn_closing_event_cb(struct bufferevent *bev, short what, void *arg) {
  (void)bev;
  (void)what;
  conn_free(arg);
}

/* Close c after its ERR frame (and, unless drop, anything queued before it)
 * is flushed, or after one second if the peer does not read. Its input is
 * dropped at once; a ranked connection's rank is released now. */
static void conn_fail(struct sconn *c, uint32_t id, const char *why, int drop) {
  ncfsm__store *s = c->s;
  if (c->closing) return;
  if (c->ranked) /* at most one per rank: always */
    NCFSM_WARN(SUB, "store: closing connection from %s (rank %u): %s", c->peer, c->rank, why);
  else
    warn_limited(s, W_CLOSE, "store: closing connection from %s (rank -1): %s", c->peer, why);
  c->closing = 1;
  char reason[300];
  snprintf(reason, sizeof reason, "closed by the store: %s", why);
  rank_release(c, reason);
  event_del(c->timer);
  c->timer_kind = T_NONE;
  struct evbuffer *in = bufferevent_get_input(c->bev), *out = bufferevent_get_output(c->bev);
  evbuffer_drain(in, evbuffer_get_length(in));
  input_account(c, 0);
  if (drop) { /* a bufferevent's output is frozen at its start for its users */
    evbuffer_unfreeze(out, 1);
    evbuffer_drain(out, evbuffer_get_length(out));
    evbuffer_freeze(out, 1);
  }
  uint8_t hdr[NCFSM__FRAME_HDR];
  uint32_t n = (uint32_t)strlen(why);
  ncfsm__frame_header(hdr, NCFSM__F_ERR, id, 0, n);
  evbuffer_add(out, hdr, sizeof hdr);
  evbuffer_add(out, why, n);
  bufferevent_setcb(c->bev, conn_closing_read_cb, conn_closing_write_cb, conn_closing_event_cb, c);
  bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
  bufferevent_setwatermark(c->bev, EV_READ, 0, 0);
  struct timeval one = {1, 0};
  bufferevent_set_timeouts(c->bev, NULL, &one);
  bufferevent_enable(c->bev, EV_READ | EV_WRITE);
}

static void fail_later(struct sconn *c, const char *fmt, ...) {
  if (c->closing || c->fail_later) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->fail_buf, sizeof c->fail_buf, fmt, ap);
  va_end(ap);
  c->fail_later = c->fail_buf;
  event_del(c->timer);
  event_active(c->timer, EV_TIMEOUT, 1);
}

/* ---- authentication and ranks ---------------------------------------------- */

static struct throttle *throttle_get(ncfsm__store *s, const uint8_t akey[17], uint64_t now) {
  struct throttle *oldest = &s->thr[0];
  for (int i = 0; i < THROTTLE_SLOTS; i++) {
    struct throttle *t = &s->thr[i];
    if (t->used && !memcmp(t->akey, akey, sizeof t->akey)) return t;
    if (!t->used || (oldest->used && t->last_ns < oldest->last_ns)) oldest = t;
  }
  memset(oldest, 0, sizeof *oldest);
  memcpy(oldest->akey, akey, sizeof oldest->akey);
  oldest->used = 1;
  oldest->tokens = s->o.auth_fail_burst;
  oldest->last_ns = now;
  return oldest;
}

static const char *handle_hello(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n) {
  ncfsm__store *s = c->s;
  if (c->authed) return "second HELLO on one connection";
  uint64_t now = ncfsm__now_ns();
  struct throttle *t = throttle_get(s, c->akey, now);
  t->tokens += (double)(now - t->last_ns) * 1e-9 * s->o.auth_fail_per_s;
  if (t->tokens > s->o.auth_fail_burst) t->tokens = s->o.auth_fail_burst;
  t->last_ns = now;
  if (t->tokens < 1.0) {
    s->st.throttled++;
    unsigned wait_ms = (unsigned)((1.0 - t->tokens) * 1000.0 / s->o.auth_fail_per_s) + 1;
    warn_limited(s, W_THROTTLE, "store: throttling HELLOs from %s: %" PRIu64 " failed HELLOs",
                 c->peer, t->fails);
    snprintf(buf, n, "throttled: %" PRIu64 " failed HELLOs from this address; retry in %u ms "
                     "(a wrong NCFSM_STORE_TOKEN on this host?)",
             t->fails, wait_ms);
    return buf;
  }
  uint32_t rank = ncfsm__rd32(f->value), size = ncfsm__rd32(f->value + 4);
  if (s->o.rank_secrets && size > 0 && rank < size) { /* the rank's own secret, not the token */
    char secret[65];
    ncfsm__rank_secret((const char *)s->token, rank, size, secret);
    int ok = ncfsm__ct_equal(f->key, f->klen, secret, 64);
    memset(secret, 0, sizeof secret);
    if (!ok) {
      s->st.rejected_token++;
      t->tokens -= 1.0;
      t->fails++;
      snprintf(buf, n, "bad token: this store takes per-rank secrets and the HELLO of rank %u of "
                       "%u did not carry that rank's (NCFSM_STORE_RANK_SECRET; `ncfsm-store "
                       "--print-rank-secret %u/%u` prints it from the job token)",
               rank, size, rank, size);
      return buf;
    }
  } else if (!ncfsm__ct_equal(f->key, f->klen, s->token, s->toklen)) {
    s->st.rejected_token++;
    t->tokens -= 1.0;
    t->fails++;
    return "bad token: HELLO did not carry this job's NCFSM_STORE_TOKEN";
  }
  if (size > 0) {
    if (rank >= size) {
      snprintf(buf, n, "HELLO rank %u is not below its size %u", rank, size);
      return buf;
    }
    if (size > (1u << 22)) {
      snprintf(buf, n, "HELLO size %u: the store serves jobs of at most %u ranks", size, 1u << 22);
      return buf;
    }
    if (!s->job_size) {
      if (charge(s, (uint64_t)size * sizeof *s->ranks) != 0 ||
          !(s->ranks = calloc(size, sizeof *s->ranks))) {
        snprintf(buf, n, "store full: no room for a job of %u ranks", size);
        return buf;
      }
      s->job_size = size;
      snprintf(s->job_from, sizeof s->job_from, "%s", c->peer);
    } else if (size != s->job_size) {
      snprintf(buf, n, "HELLO of rank %u says the job has %u ranks, the store's job has %u (first "
                       "HELLO from %s): check NCFSM_WORLD_SIZE; one store (one token) per job",
               rank, size, s->job_size, s->job_from);
      return buf;
    }
    struct rankslot *slot = &s->ranks[rank];
    if (slot->state == RS_LIVE) {
      s->st.rank_conflicts++;
      char msg[400];
      snprintf(msg, sizeof msg, "rank %u claimed by two connections, %s (first) and %s: an "
                                "impostor or two processes with the same NCFSM_RANK; every "
                                "allgather of this job fails from now on",
               rank, slot->c->peer, c->peer);
      if (!s->conflict) s->conflict = strdup(msg);
      for (struct entry *e = LIST_FIRST(&s->gathers), *next; e; e = next) {
        next = LIST_NEXT(e, g_link);
        gather_fail(s, e, msg);
      }
      snprintf(buf, n, "%s", msg);
      return buf;
    }
    if (slot->state == RS_GONE) {
      if (!s->o.rejoin) {
        s->st.rejoin_refused++;
        snprintf(buf, n, "rank %u cannot rejoin (%s); rejoining is off: restart the job, or run "
                         "the store with --rejoin (NCFSM_STORE_REJOIN=1)",
                 rank, slot->why ? slot->why : "it disconnected");
        return buf;
      }
      free(slot->why);
      slot->why = NULL;
      /* the rejoined rank restarts at allgather #0: forget the failed ones */
      for (size_t i = 0; i < s->nb; i++)
        for (struct entry *e = s->tab[i], *next; e; e = next) {
          next = e->hnext;
          if (e->failed && LIST_EMPTY(&e->waiters)) entry_delete(s, e);
        }
      if (--s->n_gone && s->first_gone == rank)
        for (uint32_t r = 0; r < s->job_size; r++)
          if (s->ranks[r].state == RS_GONE) {
            s->first_gone = r;
            break;
          }
      NCFSM_INFO(SUB, "store: rank %u rejoined from %s", rank, c->peer);
    }
    slot->state = RS_LIVE;
    slot->c = c;
    c->ranked = 1;
    c->rank = rank;
  }
  c->authed = 1;
  s->st.authenticated++;
  if (c->timer_kind == T_AUTH) {
    event_del(c->timer);
    c->timer_kind = T_NONE;
  }
  bufferevent_setwatermark(c->bev, EV_READ, 0,
                           (size_t)NCFSM__FRAME_HDR + s->lim.key_max + s->lim.value_max);
  NCFSM_TRACE(SUB, "store: %s authenticated as rank %u of %u", c->peer, rank, size);
  reply(c, NCFSM__F_OK, f->id, NULL, 0);
  if (c->ranked && s->n_gone) /* the ranks lost before it came */
    for (uint32_t r = 0; r < s->job_size; r++) {
      const struct rankslot *sl = &s->ranks[r];
      if (sl->state != RS_GONE || !sl->why) continue;
      size_t wl = strlen(sl->why);
      uint8_t v[4 + 400];
      if (wl > 400) wl = 400;
      ncfsm__wr32(v, r);
      memcpy(v + 4, sl->why, wl);
      reply(c, NCFSM__F_LOST, 0, v, (uint32_t)(4 + wl));
      s->st.lost_pushed++;
    }
  return NULL;
}

/* ---- requests ---------------------------------------------------------------- */

static const char *parked_why(struct sconn *c, char *buf, size_t n) {
  c->s->st.closed_parked++;
  snprintf(buf, n, "more than %u parked requests on one connection (raise --max-parked / "
                   "NCFSM_STORE_MAX_PARKED)",
           c->s->o.max_parked);
  return buf;
}

static void handle_set(struct sconn *c, const ncfsm__frame *f) {
  ncfsm__store *s = c->s;
  struct entry *e = table_get(s, f->key, f->klen, 1);
  if (!e) return reply_err(c, f->id, "store full (NCFSM store max bytes)");
  if (e->gather) return reply_err(c, f->id, "key is in use by a GATHER");
  struct blob *v = blob_new(s, f->vlen);
  if (!v) {
    reply_err(c, f->id, "store full (NCFSM store max bytes)");
    return entry_maybe_drop(s, e);
  }
  memcpy(v->data, f->value, f->vlen);
  if (e->val) blob_unref(e->val);
  e->val = v;
  reply(c, NCFSM__F_OK, f->id, NULL, 0);
  wake_waiters(s, e);
}

static const char *handle_get(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n) {
  struct entry *e = table_get(c->s, f->key, f->klen, 1);
  if (!e) return reply_err(c, f->id, "store full (NCFSM store max bytes)"), NULL;
  if (e->gather) return reply_err(c, f->id, "key is in use by a GATHER"), NULL;
  if (e->val) {
    if (f->type == NCFSM__F_GET) reply_blob(c, f->id, e->val);
    else reply(c, NCFSM__F_OK, f->id, NULL, 0);
    return NULL;
  }
  const char *why = park(c, e, f->type, f->id);
  if (!why) return NULL;
  entry_maybe_drop(c->s, e);
  if (!strcmp(why, "parked")) return parked_why(c, buf, n);
  reply_err(c, f->id, why);
  return NULL;
}

static void handle_add(struct sconn *c, const ncfsm__frame *f) {
  ncfsm__store *s = c->s;
  struct entry *e = table_get(s, f->key, f->klen, 1);
  if (!e) return reply_err(c, f->id, "store full (NCFSM store max bytes)");
  if (e->gather) return reply_err(c, f->id, "key is in use by a GATHER");
  if (e->val && e->val->len != 8) return reply_err(c, f->id, "ADD on a key that is not a counter");
  if (!e->val || e->val->refs > 1) { /* new, or copy on write: queued replies keep the old value */
    struct blob *v = blob_new(s, 8);
    if (!v) {
      reply_err(c, f->id, "store full (NCFSM store max bytes)");
      return entry_maybe_drop(s, e);
    }
    if (e->val) {
      memcpy(v->data, e->val->data, 8);
      blob_unref(e->val);
    } else memset(v->data, 0, 8);
    e->val = v;
  }
  uint64_t v = ncfsm__rd64(e->val->data) + ncfsm__rd64(f->value); /* wraps like int64 */
  ncfsm__wr64(e->val->data, v);
  reply(c, NCFSM__F_OK, f->id, e->val->data, 8);
  wake_waiters(s, e);
}

/* The group of a GATHER/BCAST frame by rank (key "<group>:..." for a survivors' group, else
 * the job's, *grp NULL): 0; -1 when the request was refused with an ERR; 1 when the
 * connection must be closed with buf (a rank claiming another's place). */
static int frame_group(struct sconn *c, const ncfsm__frame *f, uint32_t rank, const char *what,
                       struct group **grp, char *buf, size_t n) {
  ncfsm__store *s = c->s;
  if (f->key[0] != '@') {
    if (rank == c->rank) return 0;
    snprintf(buf, n, "%s as rank %u on the connection of rank %u", what, rank, c->rank);
    return 1;
  }
  const uint8_t *colon = memchr(f->key, ':', f->klen);
  struct group *g = colon ? group_find(s, f->key, (uint32_t)(colon - f->key)) : NULL;
  if (!g || !g->ranks) {
    snprintf(buf, n, "%s %.*s: no survivors' group %.*s (no agreement made it)", what,
             (int)(f->klen < 80 ? f->klen : 80), (const char *)f->key,
             (int)(colon ? colon - f->key : 0), (const char *)f->key);
    reply_err(c, f->id, buf);
    return -1;
  }
  int64_t idx = group_index(g, c->rank);
  if (idx < 0 || (uint32_t)idx != rank) {
    snprintf(buf, n, "%s in group %s as index %u by job rank %u, whose index there is %lld", what,
             g->path, rank, c->rank, (long long)idx);
    return 1;
  }
  *grp = g;
  return 0;
}

static const char *handle_gather(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n) {
  ncfsm__store *s = c->s;
  uint32_t rank = ncfsm__rd32(f->value), size = ncfsm__rd32(f->value + 4), len = f->vlen - 8;
  if (!c->ranked)
    return reply_err(c, f->id, "GATHER needs a ranked connection: HELLO with this rank and the "
                               "job size (size > 0)"),
           NULL;
  struct group *grp = NULL;
  int how = frame_group(c, f, rank, "GATHER", &grp, buf, n);
  if (how) return how < 0 ? NULL : buf;
  char k[48];
  struct entry *e = table_get(s, f->key, f->klen, 0);
  if (e && e->failed) return reply_err(c, f->id, e->failed), NULL;
  if (e && e->bcast) return reply_err(c, f->id, "key is in use by a BCAST"), NULL;
  if ((!e || !e->gather) && grp) {
    if (s->conflict) return reply_err(c, f->id, s->conflict), NULL;
    if (grp->gone) {
      char msg[600];
      snprintf(msg, sizeof msg, "allgather %.*s cannot complete: %s", (int)(f->klen < 80 ? f->klen : 80),
               (const char *)f->key, grp->gone);
      return reply_err(c, f->id, msg), NULL;
    }
    if (size != grp->n) {
      snprintf(buf, n, "GATHER of size %u in group %s of %u ranks", size, grp->path, grp->n);
      return reply_err(c, f->id, buf), NULL;
    }
  } else if (!e || !e->gather) {
    if (s->conflict) return reply_err(c, f->id, s->conflict), NULL;
    if (s->n_gone && !s->o.rejoin) {
      char msg[600];
      const struct rankslot *g = &s->ranks[s->first_gone];
      snprintf(msg, sizeof msg, "allgather %.*s cannot complete: %s; see rank %u's log",
               (int)(f->klen < 40 ? f->klen : 40), (const char *)f->key,
               g->why ? g->why : "a rank disconnected", s->first_gone);
      return reply_err(c, f->id, msg), NULL;
    }
    if (size != s->job_size) {
      snprintf(buf, n, "GATHER of size %u in a job of %u ranks", size, s->job_size);
      return reply_err(c, f->id, buf), NULL;
    }
  }
  if (!e) e = table_get(s, f->key, f->klen, 1);
  if (!e) return reply_err(c, f->id, "store full (NCFSM store max bytes)"), NULL;
  if (!e->gather) {
    if (e->val || !LIST_EMPTY(&e->waiters))
      return reply_err(c, f->id, "key is in use by SET/GET"), NULL;
    uint64_t total = (uint64_t)size * len;
    if (total > SIZE_MAX / 2 || charge(s, size) != 0) {
      reply_err(c, f->id, "GATHER larger than the store's max bytes");
      entry_maybe_drop(s, e);
      return NULL;
    }
    e->g_buf = blob_new(s, (size_t)total);
    e->g_have = calloc(size, 1);
    if (!e->g_buf || !e->g_have) {
      if (e->g_buf) blob_unref(e->g_buf);
      free(e->g_have);
      e->g_buf = NULL;
      e->g_have = NULL;
      uncharge(s, size);
      reply_err(c, f->id, "GATHER larger than the store's max bytes");
      entry_maybe_drop(s, e);
      return NULL;
    }
    e->gather = 1;
    e->grp = grp;
    e->g_size = size;
    e->g_len = len;
    LIST_INSERT_HEAD(&s->gathers, e, g_link);
  }
  if (e->g_size != size || e->g_len != len) {
    char msg[160];
    snprintf(msg, sizeof msg, "GATHER mismatch: rank %u posted size %u len %u, others size %u len %u",
             rank, size, len, e->g_size, e->g_len);
    return reply_err(c, f->id, msg), NULL;
  }
  if (e->g_have[rank]) return reply_err(c, f->id, "GATHER: this rank already contributed"), NULL;
  const char *why = park(c, e, NCFSM__F_GATHER, f->id);
  if (why) {
    if (!strcmp(why, "parked")) return parked_why(c, buf, n);
    return reply_err(c, f->id, why), NULL;
  }
  e->g_have[rank] = 1;
  memcpy(e->g_buf->data + (size_t)rank * len, f->value + 8, len);
  if (++e->g_count < e->g_size) return NULL;
  NCFSM_TRACE(SUB, "store: allgather %s complete (%u ranks x %u bytes)", key_str(e, k, sizeof k),
              size, len);
  struct waiter *w;
  while ((w = LIST_FIRST(&e->waiters)) != NULL) {
    reply_blob(w->c, w->id, e->g_buf);
    waiter_free(s, w);
  }
  entry_delete(s, e);
  return NULL;
}

/* BCAST: key = "bc/<n>" or "<group>:bc/<n>"; value = u32 rank, u32 size, u32 root, u32 len,
 * then on root the len bytes. Root's bytes are one blob that every reply references (values
 * of COPY_MAX bytes or less are copied: a reference costs a chain of its own); a receiver that
 * posts before root is parked. The entry goes once root posted and every member posted or is
 * gone; root gone before posting fails it for every member, by name. */
static const char *handle_bcast(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n) {
  ncfsm__store *s = c->s;
  uint32_t rank = ncfsm__rd32(f->value), size = ncfsm__rd32(f->value + 4);
  uint32_t root = ncfsm__rd32(f->value + 8), len = ncfsm__rd32(f->value + 12);
  char k[48], msg[600];
  if (!c->ranked)
    return reply_err(c, f->id, "BCAST needs a ranked connection: HELLO with this rank and the "
                               "job size (size > 0)"),
           NULL;
  struct group *grp = NULL;
  int how = frame_group(c, f, rank, "BCAST", &grp, buf, n);
  if (how) return how < 0 ? NULL : buf;
  struct entry *e = table_get(s, f->key, f->klen, 0);
  if (e && e->failed) return reply_err(c, f->id, e->failed), NULL;
  if (e && e->gather && !e->bcast) return reply_err(c, f->id, "key is in use by a GATHER"), NULL;
  if (!e || !e->gather) {
    if (s->conflict) return reply_err(c, f->id, s->conflict), NULL;
    uint32_t members = grp ? grp->n : s->job_size;
    if (size != members) {
      snprintf(buf, n, "BCAST of size %u in %s of %u ranks", size, grp ? grp->path : "a job",
               members);
      return reply_err(c, f->id, buf), NULL;
    }
    const struct rankslot *rs = &s->ranks[grp ? grp->ranks[root] : root];
    if (rs->state == RS_GONE) {
      snprintf(msg, sizeof msg, "broadcast %.*s cannot complete: its root is gone: %s",
               (int)(f->klen < 80 ? f->klen : 80), (const char *)f->key,
               rs->why ? rs->why : "it disconnected");
      return reply_err(c, f->id, msg), NULL;
    }
    if (!e) e = table_get(s, f->key, f->klen, 1);
    if (!e) return reply_err(c, f->id, "store full (NCFSM store max bytes)"), NULL;
    if (e->val || !LIST_EMPTY(&e->waiters))
      return reply_err(c, f->id, "key is in use by SET/GET"), NULL;
    int charged = charge(s, size) == 0;
    if (!charged || !(e->g_have = calloc(size, 1))) {
      if (charged) uncharge(s, size);
      reply_err(c, f->id, "store full (NCFSM store max bytes)");
      entry_maybe_drop(s, e);
      return NULL;
    }
    e->gather = 1;
    e->bcast = 1;
    e->grp = grp;
    e->g_size = size;
    e->g_len = len;
    e->b_root = root;
    LIST_INSERT_HEAD(&s->gathers, e, g_link);
    for (uint32_t i = 0; i < size; i++) /* members gone already count as served */
      if (s->ranks[grp ? grp->ranks[i] : i].state == RS_GONE) {
        e->g_have[i] = 2;
        e->g_count++;
      }
  }
  if (e->g_size != size || e->g_len != len || e->b_root != root) {
    snprintf(msg, sizeof msg, "broadcast %s failed: rank %u posted it with root %u and %u bytes, "
                              "the ranks before it with root %u and %u bytes; every rank must make "
                              "the same broadcasts in the same order",
             key_str(e, k, sizeof k), rank, root, len, e->b_root, e->g_len);
    gather_fail(s, e, msg);
    return reply_err(c, f->id, msg), NULL;
  }
  if (e->g_have[rank]) return reply_err(c, f->id, "BCAST: this rank already posted it"), NULL;
  if (rank == root) {
    struct blob *v = blob_new(s, len);
    if (!v) {
      snprintf(msg, sizeof msg, "broadcast %s failed: store full (%u bytes from root %u; raise "
                                "--max-bytes)",
               key_str(e, k, sizeof k), len, root);
      gather_fail(s, e, msg);
      return reply_err(c, f->id, msg), NULL;
    }
    memcpy(v->data, f->value + 16, len);
    e->g_buf = v;
    e->g_have[rank] = 1;
    e->g_count++;
    reply(c, NCFSM__F_OK, f->id, NULL, 0);
    struct waiter *w;
    while ((w = LIST_FIRST(&e->waiters)) != NULL) {
      reply_blob(w->c, w->id, v);
      waiter_free(s, w);
    }
  } else if (e->g_buf) {
    reply_blob(c, f->id, e->g_buf);
    e->g_have[rank] = 1;
    e->g_count++;
  } else {
    const char *why = park(c, e, NCFSM__F_BCAST, f->id);
    if (why) {
      if (!strcmp(why, "parked")) return parked_why(c, buf, n);
      return reply_err(c, f->id, why), NULL;
    }
    e->g_have[rank] = 1;
    e->g_count++;
  }
  bcast_maybe_done(s, e);
  return NULL;
}

/* AGREE: key = group, value = u64 epoch, u32 timeout ms. */
static const char *handle_agree(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n) {
  ncfsm__store *s = c->s;
  if (!c->ranked)
    return reply_err(c, f->id, "AGREE needs a ranked connection: HELLO with this rank and the job "
                               "size (size > 0)"),
           NULL;
  if (s->conflict) return reply_err(c, f->id, s->conflict), NULL;
  uint64_t epoch = ncfsm__rd64(f->value);
  uint32_t tmo = ncfsm__rd32(f->value + 8);
  struct group *g = group_find(s, f->key, f->klen);
  if (!g && f->klen == 1 && f->key[0] == '@') {
    g = group_new(s, "@", 1, s->job_size, NULL);
    if (!g) return reply_err(c, f->id, "store full (NCFSM store max bytes)"), NULL;
  }
  char msg[800];
  if (!g) {
    snprintf(msg, sizeof msg, "AGREE in group %.*s: no such group (no agreement made it)",
             (int)(f->klen < 80 ? f->klen : 80), (const char *)f->key);
    return reply_err(c, f->id, msg), NULL;
  }
  int64_t idx = group_index(g, c->rank);
  if (idx < 0) {
    snprintf(msg, sizeof msg, "AGREE in group %s by job rank %u, which is not in it", g->path, c->rank);
    return reply_err(c, f->id, msg), NULL;
  }
  char who[60];
  if (g->ranks) snprintf(who, sizeof who, "rank %lld (job rank %u)", (long long)idx, c->rank);
  else snprintf(who, sizeof who, "rank %u", c->rank);
  if (epoch == 0 || epoch <= g->last_epoch) {
    snprintf(msg, sizeof msg, "agreement epoch %" PRIu64 " of group %s posted by %s: not above the "
                              "group's last agreement epoch %" PRIu64 "%s%s%s; every live rank posts "
                              "the same increasing epoch",
             epoch, g->path, who, g->last_epoch, g->last_fail ? " (which failed: " : "",
             g->last_fail ? g->last_fail : "", g->last_fail ? ")" : "");
    return reply_err(c, f->id, msg), NULL;
  }
  if (g->open_epoch && g->open_epoch != epoch) {
    char posted[300];
    snprintf(msg, sizeof msg, "agreement epochs differ in group %s: %s posted epoch %" PRIu64
                              " while %s posted epoch %" PRIu64 "; every live rank must post the "
                              "same epoch (both fail; post a higher one on every rank)",
             g->path, who, epoch, group_list(s, g, 1, posted, sizeof posted), g->open_epoch);
    uint64_t hi = epoch > g->open_epoch ? epoch : g->open_epoch;
    ag_fail(s, g, msg);
    g->last_epoch = hi;
    return reply_err(c, f->id, msg), NULL;
  }
  if (g->open_epoch && g->posted[idx]) {
    snprintf(msg, sizeof msg, "agreement epoch %" PRIu64 " of group %s: %s posted it twice", epoch,
             g->path, who);
    return reply_err(c, f->id, msg), NULL;
  }
  if (c->parked >= s->o.max_parked) return parked_why(c, buf, n);
  struct agwaiter *w = NULL;
  if (charge(s, sizeof *w) != 0) return reply_err(c, f->id, "store full (NCFSM store max bytes)"), NULL;
  if (!(w = calloc(1, sizeof *w))) {
    uncharge(s, sizeof *w);
    return reply_err(c, f->id, "store out of memory"), NULL;
  }
  uint64_t dl = ncfsm__now_ns() + (uint64_t)tmo * 1000000ull;
  if (!g->open_epoch) {
    g->open_epoch = epoch;
    memset(g->posted, 0, g->n);
    g->deadline_ns = 0;
  }
  if (!g->deadline_ns || dl < g->deadline_ns) { /* the first poster's timeout (or a shorter one) */
    g->deadline_ns = dl;
    g->timeout_ms = tmo;
    struct timeval tv = ms_tv(tmo);
    evtimer_add(g->timer, &tv);
  }
  w->c = c;
  w->g = g;
  w->id = f->id;
  c->parked++;
  LIST_INSERT_HEAD(&g->waiters, w, by_grp);
  LIST_INSERT_HEAD(&c->agw, w, by_conn);
  g->posted[idx] = 1;
  ag_eval(s, g);
  return NULL;
}

static const char *handle(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n) {
  c->s->st.frames++;
  if (f->type == NCFSM__F_HELLO) return handle_hello(c, f, buf, n);
  if (!c->authed) return "first frame is not HELLO";
  switch (f->type) {
  case NCFSM__F_SET: handle_set(c, f); return NULL;
  case NCFSM__F_GET:
  case NCFSM__F_WAIT: return handle_get(c, f, buf, n);
  case NCFSM__F_ADD: handle_add(c, f); return NULL;
  case NCFSM__F_GATHER: return handle_gather(c, f, buf, n);
  case NCFSM__F_AGREE: return handle_agree(c, f, buf, n);
  case NCFSM__F_BCAST: return handle_bcast(c, f, buf, n);
  default: return "reply frame (OK/ERR) sent to the server";
  }
}

/* ---- the connection's callbacks ------------------------------------------------ */

/* Past max_inflight, close the connections with the oldest unfinished frames. */
static void enforce_inflight(ncfsm__store *s) {
  while (s->inflight > s->o.max_inflight) {
    struct sconn *v = TAILQ_FIRST(&s->partials);
    if (!v) return;
    s->st.closed_budget++;
    char msg[400];
    snprintf(msg, sizeof msg, "store input budget full: unfinished frames hold %" PRIu64
                              " bytes (max_inflight %" PRIu64 "); closing the oldest, this "
                              "connection's (%zu bytes, started %" PRIu64 " ms ago): send frames "
                              "whole, or raise --max-inflight / NCFSM_STORE_MAX_INFLIGHT",
             s->inflight, s->o.max_inflight, v->in_acct,
             (ncfsm__now_ns() - v->frame_start_ns) / 1000000);
    conn_fail(v, 0, msg, 1);
  }
}

static void conn_read_cb(struct bufferevent *bev, void *arg) {
  struct sconn *c = arg;
  ncfsm__store *s = c->s;
  struct evbuffer *in = bufferevent_get_input(bev);
  int done = 0;
  while (!c->closing && !c->paused && !c->fail_later) {
    size_t n = evbuffer_get_length(in);
    if (n == 0) break;
    size_t want = n < NCFSM__FRAME_HDR ? n : NCFSM__FRAME_HDR, used = 0;
    const uint8_t *p = evbuffer_pullup(in, (ev_ssize_t)want);
    if (!c->authed && want > 5 && p[5] != NCFSM__F_HELLO && p[0] == 'N' && p[1] == 'C') {
      s->st.closed_bad_frame++;
      return conn_fail(c, 0, "first frame is not HELLO", 0);
    }
    const ncfsm__frame_limits *lim = c->authed ? &s->lim : &s->hello_lim;
    ncfsm__frame f;
    const char *why;
    ncfsm__parse_t r = ncfsm__frame_parse(p, want, lim, &f, &used, &why);
    if (r == NCFSM__PARSE_MORE) {
      if (used > n) break; /* the rest has not arrived */
      p = evbuffer_pullup(in, (ev_ssize_t)used);
      r = ncfsm__frame_parse(p, used, lim, &f, &used, &why);
    }
    if (r != NCFSM__PARSE_OK) {
      s->st.closed_bad_frame++;
      return conn_fail(c, 0, why ? why : "unparsable frame", 0);
    }
    int was_authed = c->authed;
    char buf[512];
    why = handle(c, &f, buf, sizeof buf);
    if (why) {
      if (was_authed || f.type != NCFSM__F_HELLO) s->st.closed_bad_frame++;
      return conn_fail(c, f.id, why, 0);
    }
    evbuffer_drain(in, used);
    done = 1;
    size_t q = evbuffer_get_length(bufferevent_get_output(bev));
    if (q > s->o.out_high || (q > 0 && s->out_queued > s->o.max_out)) {
      c->paused = 1; /* resumed by conn_write_cb */
      bufferevent_disable(bev, EV_READ);
    }
  }
  if (c->closing) return;
  input_account(c, done);
  enforce_inflight(s);
}

/* The output drained below out_high / 2 (the write low-watermark). */
static void conn_write_cb(struct bufferevent *bev, void *arg) {
  struct sconn *c = arg;
  if (!c->paused || c->closing) return;
  c->paused = 0;
  bufferevent_enable(bev, EV_READ);
  conn_read_cb(bev, c);
}

static void conn_event_cb(struct bufferevent *bev, short what, void *arg) {
  struct sconn *c = arg;
  ncfsm__store *s = c->s;
  if (what & BEV_EVENT_TIMEOUT) { /* writing: no reply read for out_stall_ms */
    s->st.closed_unread++;
    char msg[300];
    snprintf(msg, sizeof msg, "not reading its replies: %zu bytes queued, none read for %" PRIu64
                              " ms (raise --out-stall-ms / NCFSM_STORE_OUT_STALL_MS)",
             evbuffer_get_length(bufferevent_get_output(bev)), s->o.out_stall_ms);
    return conn_fail(c, 0, msg, 1);
  }
  size_t left = evbuffer_get_length(bufferevent_get_input(bev));
  char reason[200];
  if (left) {
    snprintf(reason, sizeof reason, "connection closed in the middle of a frame (%zu bytes left)",
             left);
    warn_limited(s, W_CLOSE, "store: connection from %s (rank %d) closed in the middle of a "
                             "frame (%zu bytes left)",
                 c->peer, c->ranked ? (int)c->rank : -1, left);
    s->st.closed_bad_frame++;
  } else if (what & BEV_EVENT_EOF) {
    snprintf(reason, sizeof reason, "connection closed by the peer (process exited or was killed?)");
    NCFSM_TRACE(SUB, "store: connection from %s closed (eof)", c->peer);
    s->st.closed_eof++;
  } else {
    snprintf(reason, sizeof reason, "connection error: %s",
             evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    NCFSM_TRACE(SUB, "store: connection from %s: %s", c->peer, reason);
    s->st.closed_eof++;
  }
  rank_release(c, reason);
  conn_free(c);
}

/* The auth or frame deadline passed, or a deferred close (fail_later). */
static void conn_timer_cb(evutil_socket_t fd, short what, void *arg) {
  struct sconn *c = arg;
  ncfsm__store *s = c->s;
  (void)fd;
  (void)what;
  if (c->closing) return;
  if (c->fail_later) return conn_fail(c, 0, c->fail_later, 1);
  char msg[300];
  size_t have = evbuffer_get_length(bufferevent_get_input(c->bev));
  if (c->timer_kind == T_AUTH) {
    s->st.closed_bad_frame++;
    snprintf(msg, sizeof msg, "no HELLO within %" PRIu64 " ms (%zu bytes received)",
             s->o.auth_timeout_ms, have);
  } else if (c->timer_kind == T_FRAME) {
    s->st.closed_slow++;
    size_t total = 0;
    if (have >= NCFSM__FRAME_HDR) {
      const uint8_t *p = evbuffer_pullup(bufferevent_get_input(c->bev), NCFSM__FRAME_HDR);
      total = (size_t)NCFSM__FRAME_HDR + ncfsm__rd32(p + 12) + ncfsm__rd32(p + 16);
    }
    snprintf(msg, sizeof msg, "frame not complete within %" PRIu64 " ms: %zu of %zu bytes arrived "
                              "(raise --frame-timeout-ms / NCFSM_STORE_FRAME_TIMEOUT_MS on a slow "
                              "network)",
             s->o.frame_timeout_ms, have, total ? total : (size_t)NCFSM__FRAME_HDR);
  } else {
    return;
  }
  c->timer_kind = T_NONE;
  conn_fail(c, 0, msg, 1);
}

/* Every change of a connection's output, for the store-wide max_out. */
static void conn_out_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg) {
  ncfsm__store *s = arg;
  (void)buf;
  s->out_queued = s->out_queued + info->n_added - info->n_deleted;
  if (s->out_queued > s->st.peak_out) s->st.peak_out = s->out_queued;
}

/* ---- accepting ------------------------------------------------------------------- */

static void addr_str(const struct sockaddr *sa, char *buf, size_t n, uint8_t akey[17]) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  memset(akey, 0, 17);
  if (sa && sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    evutil_inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    akey[0] = 4;
    memcpy(akey + 1, &in->sin_addr, 4);
  } else if (sa && sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    evutil_inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
    akey[0] = 6;
    memcpy(akey + 1, &in6->sin6_addr, 16);
  }
  snprintf(buf, n, "%s:%d", host, port);
}

/* Refuse a just-accepted connection: an ERR "store busy" frame, then close. */
static void refuse(ncfsm__store *s, evutil_socket_t fd, const char *peer, const char *why) {
  s->st.refused_busy++;
  warn_limited(s, W_BUSY, "store: refused a connection from %s: %s", peer, why);
  evutil_make_socket_nonblocking(fd);
  char junk[1024];
  for (int i = 0; i < 4 && recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0; i++) {
  }
  uint8_t frame[NCFSM__FRAME_HDR + 400];
  size_t n = strlen(why);
  if (n > 400) n = 400;
  ncfsm__frame_header(frame, NCFSM__F_ERR, 0, 0, (uint32_t)n);
  memcpy(frame + NCFSM__FRAME_HDR, why, n);
  ssize_t w = send(fd, frame, NCFSM__FRAME_HDR + n, MSG_DONTWAIT | MSG_NOSIGNAL);
  (void)w;
  shutdown(fd, SHUT_WR);
  evutil_closesocket(fd);
}

static void accept_cb(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg) {
  ncfsm__store *s = arg;
  (void)lis;
  (void)salen;
  s->relisten_ms = 0;
  char peer[80];
  uint8_t akey[17];
  addr_str(sa, peer, sizeof peer, akey);
  if (s->st.open_conns >= s->o.max_conns) {
    char why[300];
    snprintf(why, sizeof why, "store busy: %d connections open, its limit (more ranks than the "
                              "store admits? raise --max-conns / NCFSM_STORE_MAX_CONNS and the "
                              "open-file limit, ulimit -n)",
             s->st.open_conns);
    return refuse(s, fd, peer, why);
  }
  struct sconn *c = calloc(1, sizeof *c);
  struct bufferevent *bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE);
  struct event *timer = c ? evtimer_new(s->base, conn_timer_cb, c) : NULL;
  if (!c || !bev || !timer) {
    free(c);
    if (timer) event_free(timer);
    if (bev) bufferevent_free(bev);
    else evutil_closesocket(fd);
    warn_limited(s, W_ACCEPT, "store: out of memory accepting a connection from %s", peer);
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  c->s = s;
  c->bev = bev;
  c->timer = timer;
  LIST_INIT(&c->waiters);
  LIST_INIT(&c->agw);
  snprintf(c->peer, sizeof c->peer, "%s", peer);
  memcpy(c->akey, akey, sizeof c->akey);
  c->out_cb = evbuffer_add_cb(bufferevent_get_output(bev), conn_out_cb, s);
  LIST_INSERT_HEAD(&s->conns, c, link);
  s->st.accepted++;
  s->st.open_conns++;
  bufferevent_setwatermark(bev, EV_READ, 0, (size_t)NCFSM__FRAME_HDR + s->lim.key_max + 8);
  bufferevent_setwatermark(bev, EV_WRITE, (size_t)(s->o.out_high / 2), 0);
  bufferevent_setcb(bev, conn_read_cb, conn_write_cb, conn_event_cb, c);
  struct timeval stall = ms_tv(s->o.out_stall_ms), auth = ms_tv(s->o.auth_timeout_ms);
  bufferevent_set_timeouts(bev, NULL, &stall);
  c->timer_kind = T_AUTH;
  evtimer_add(c->timer, &auth);
  bufferevent_enable(bev, EV_READ | EV_WRITE);
}

static void relisten_cb(evutil_socket_t fd, short what, void *arg) {
  ncfsm__store *s = arg;
  (void)fd;
  (void)what;
  evconnlistener_enable(s->lis);
}

/* accept() failed. Out of descriptors (EMFILE, ENFILE): give up the reserve
 * descriptor, accept the waiting connections one at a time and refuse each
 * with "store busy", then take the reserve back; clients get a named error
 * instead of hanging, and the listener does not spin. Otherwise (ENOBUFS,
 * ENOMEM, or no reserve): pause the listener, 100 ms doubling to 1 s. */
static void accept_error_cb(struct evconnlistener *lis, void *arg) {
  ncfsm__store *s = arg;
  int err = EVUTIL_SOCKET_ERROR();
  if ((err == EMFILE || err == ENFILE) && s->reserve_fd >= 0) {
    close(s->reserve_fd);
    s->reserve_fd = -1;
    char why[300];
    snprintf(why, sizeof why, "store busy: out of file descriptors (accept: %s) with %d "
                              "connections open: raise the store's open-file limit (ulimit -n) "
                              "or lower --max-conns",
             strerror(err), s->st.open_conns);
    for (int i = 0; i < 64; i++) {
      struct sockaddr_storage ss;
      socklen_t sl = sizeof ss;
      evutil_socket_t fd = accept(evconnlistener_get_fd(lis), (struct sockaddr *)&ss, &sl);
      if (fd < 0) break;
      char peer[80];
      uint8_t akey[17];
      addr_str((struct sockaddr *)&ss, peer, sizeof peer, akey);
      refuse(s, fd, peer, why);
    }
    s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (s->reserve_fd >= 0) return;
  }
  s->relisten_ms = s->relisten_ms ? (s->relisten_ms * 2 > 1000 ? 1000 : s->relisten_ms * 2) : 100;
  warn_limited(s, W_ACCEPT, "store: accept failed: %s; pausing the listener for %d ms (raise the "
                            "open-file limit, ulimit -n, for many ranks)",
               evutil_socket_error_to_string(err), s->relisten_ms);
  evconnlistener_disable(lis);
  struct timeval tv = ms_tv((uint64_t)s->relisten_ms);
  evtimer_add(s->relisten, &tv);
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
}

static void env_u64(const char *name, uint64_t *v) {
  long long x = ncfsm__env_ll(name, -1);
  if (x > 0) *v = (uint64_t)x;
  else if (x == 0 || (getenv(name) && *getenv(name)))
    NCFSM_WARN(SUB, "%s=%s is not a positive number; using %" PRIu64, name, getenv(name), *v);
}

void ncfsm__store_opts_env(ncfsm__store_opts *o) {
  uint64_t v;
  v = o->value_max;
  env_u64("NCFSM_STORE_VALUE_MAX", &v);
  o->value_max = v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
  env_u64("NCFSM_STORE_MAX_BYTES", &o->max_bytes);
  env_u64("NCFSM_STORE_AUTH_TIMEOUT_MS", &o->auth_timeout_ms);
  env_u64("NCFSM_STORE_FRAME_TIMEOUT_MS", &o->frame_timeout_ms);
  env_u64("NCFSM_STORE_MAX_INFLIGHT", &o->max_inflight);
  env_u64("NCFSM_STORE_OUT_HIGH", &o->out_high);
  env_u64("NCFSM_STORE_OUT_MAX", &o->out_max);
  env_u64("NCFSM_STORE_OUT_STALL_MS", &o->out_stall_ms);
  env_u64("NCFSM_STORE_MAX_OUT", &o->max_out);
  v = o->max_conns > 0 ? (uint64_t)o->max_conns : 0;
  if (getenv("NCFSM_STORE_MAX_CONNS")) {
    env_u64("NCFSM_STORE_MAX_CONNS", &v);
    o->max_conns = v > (1u << 30) ? (1 << 30) : (int)v;
  }
  v = o->max_parked;
  env_u64("NCFSM_STORE_MAX_PARKED", &v);
  o->max_parked = v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
  v = o->auth_fail_burst;
  env_u64("NCFSM_STORE_AUTH_FAIL_BURST", &v);
  o->auth_fail_burst = v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
  v = o->auth_fail_per_s;
  env_u64("NCFSM_STORE_AUTH_FAIL_PER_S", &v);
  o->auth_fail_per_s = v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
  if (getenv("NCFSM_STORE_REJOIN")) o->rejoin = ncfsm__env_ll("NCFSM_STORE_REJOIN", 0) != 0;
  if (getenv("NCFSM_STORE_RANK_SECRETS"))
    o->rank_secrets = ncfsm__env_ll("NCFSM_STORE_RANK_SECRETS", 0) != 0;
  if (getenv("NCFSM_STORE_ALLOW_REMOTE"))
    o->allow_remote = ncfsm__env_ll("NCFSM_STORE_ALLOW_REMOTE", 0) != 0;
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
#undef DFLT
  if (s->o.max_conns <= 0) {
    struct rlimit rl;
    rlim_t lim = 1024;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) lim = rl.rlim_cur;
    if (lim == RLIM_INFINITY || lim > (1u << 20)) lim = 1u << 20;
    s->o.max_conns = lim > 64 + 16 ? (int)(lim - 64) : 16;
  }
  s->o.listen = NULL;
  s->o.token = NULL;
  s->base = base;
  s->reserve_fd = -1;
  s->toklen = strlen(o->token);
  s->token = (uint8_t *)strdup(o->token);
  s->lim.key_max = s->o.key_max;
  s->lim.value_max = s->o.value_max;
  if (s->lim.value_max < 8 + 1) s->lim.value_max = s->o.value_max = 9;
  s->hello_lim.key_max = s->o.key_max;
  s->hello_lim.value_max = 8;
  s->nb = 1024;
  s->tab = calloc(s->nb, sizeof *s->tab);
  LIST_INIT(&s->conns);
  TAILQ_INIT(&s->partials);
  LIST_INIT(&s->gathers);
  LIST_INIT(&s->groups);
  LIST_INIT(&s->blobs);
  s->relisten = evtimer_new(base, relisten_cb, s);
  if (!s->token || !s->tab || !s->relisten) {
    snprintf(err, errlen, "out of memory");
    goto fail;
  }
  s->lis = evconnlistener_new_bind(base, accept_cb, s,
                                   LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
                                   4096, (struct sockaddr *)&ss, salen);
  if (!s->lis) {
    snprintf(err, errlen, "store cannot listen on %s: %s (another store or job on that port? pick "
                          "another NCFSM_STORE_ADDR port)",
             o->listen, evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    goto fail;
  }
  evconnlistener_set_error_cb(s->lis, accept_error_cb);
  s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  struct sockaddr_storage bound;
  socklen_t blen = sizeof bound;
  if (getsockname(evconnlistener_get_fd(s->lis), (struct sockaddr *)&bound, &blen) == 0)
    s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
  NCFSM_INFO(SUB, "store: listening on %s (port %d); max %d connections, frame timeout %" PRIu64
                  " ms, max inflight %" PRIu64 ", out high/max %" PRIu64 "/%" PRIu64
                  ", max bytes %" PRIu64,
             o->listen, s->port, s->o.max_conns, s->o.frame_timeout_ms, s->o.max_inflight,
             s->o.out_high, s->o.out_max, s->o.max_bytes);
  *out = s;
  return 0;
fail:
  if (s->relisten) event_free(s->relisten);
  free(s->tab);
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
    conn_free(c);
  }
  evconnlistener_free(s->lis);
  event_free(s->relisten);
  if (s->reserve_fd >= 0) close(s->reserve_fd);
  for (size_t i = 0; i < s->nb; i++)
    for (struct entry *e = s->tab[i], *next; e; e = next) {
      next = e->hnext;
      entry_delete(s, e);
    }
  struct group *g;
  while ((g = LIST_FIRST(&s->groups)) != NULL) {
    LIST_REMOVE(g, link);
    group_free(s, g);
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
  free(s->tab);
  free(s);
}
