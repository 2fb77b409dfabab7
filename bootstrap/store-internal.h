/*
 * The tcp store's internals, shared by its files (each one job):
 *   tcp_store.c      the store: options, open, close, counters, rate-limited warnings
 *   store_conn.c     connections: accept, read, the limits on input and output, close
 *   store_ranks.c    HELLO (token, throttle, job size), ranks gone, LOST pushes
 *   store_requests.c SET, GET/WAIT, ADD, GATHER, BCAST and the dispatch of frames
 *   store_groups.c   survivors' groups and agreements (AGREE)
 *   store_channels.c channels (CHAN, CHAN_CLOSE) and notices (NOTICE)
 *   store_heartbeat.c the ranks' heartbeat connections, PINGs, a silent rank lost
 *   store_reply.c    replies, parked requests, failed gathers
 *   store_table.c    the keys (uthash), values as refcounted blobs, max_bytes accounting
 *   tcp_addr.c       addresses and the constant-time compare, shared with the client
 * Single-threaded: every function runs on the thread of the store's event_base.
 */
#ifndef NCFSM_BOOTSTRAP_STORE_INTERNAL_H
#define NCFSM_BOOTSTRAP_STORE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/time.h>

#include <event2/util.h>
#include <xxhash.h>

/* uthash: no exit() when a bucket array cannot be allocated (the element is
 * not added and its hh.tbl is NULL; bucket growth is skipped); xxhash. */
#define HASH_NONFATAL_OOM 1
#define HASH_FUNCTION(keyptr, keylen, hashv) ((hashv) = (unsigned)XXH64((keyptr), (keylen), 0))
#include <uthash.h>

#include "bootstrap/frame.h"
#include "bootstrap/tcp-internal.h"
#include "core/log.h"

struct bufferevent;
struct evbuffer_cb_entry;
struct evconnlistener;
struct event;
struct sockaddr;

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
  UT_hash_handle hh; /* in s->tab, keyed by key[0..klen) */
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
  int hb;                   /* the heartbeat connection of rank `rank` (only PINGs) */
  uint8_t err_version;      /* the version of the closing ERR frame (0: this store's) */
  int held;                 /* its HELLO (a rank other than 0) waits for rank 0's: in s->held */
  uint32_t held_rank, held_size, held_id;
  LIST_ENTRY(sconn) hlink;
  struct evbuffer_cb_entry *out_cb; /* counts the output in s->out_queued */
  double nt_tokens;         /* NOTICEs it may still send now (notices_per_s bucket) */
  uint64_t nt_last_ns;
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

/* A channel member's state (struct group, mstate). */
enum { CM_NONE = 0, CM_OPEN, CM_CLOSED, CM_GONE };

/* "@" (the job), the survivors of a completed agreement ("@/3", "@/3/5"), or a channel
 * ("@#<tag>": its members in the channel's order, which need not be ascending). */
struct group {
  ncfsm__store *s;
  UT_hash_handle hh; /* in s->gtab, keyed by path[0..plen) */
  LIST_ENTRY(group) link;
  char *path;
  uint32_t plen;
  uint32_t n;
  uint32_t *ranks;          /* [n] job ranks (survivors: ascending); NULL: "@", every rank */
  uint32_t *order;          /* [n] indices sorted by ranks[] (NULL when ranks is ascending) */
  int chan;                 /* a channel: mstate and opened below */
  uint8_t *mstate;          /* [n] CM_* */
  uint8_t *opened;          /* [n] the member opened it once (its rank's channel count holds it) */
  uint32_t ndone;           /* members CM_CLOSED or CM_GONE: at n the channel is freed */
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

enum { RS_NONE = 0, RS_LIVE, RS_GONE };

struct rankslot {
  uint32_t chans;           /* channels this rank opened that the store still holds */
  struct sconn *c;
  struct sconn *hbc;        /* its heartbeat connection, if it opened one */
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

enum { W_ACCEPT, W_BUSY, W_THROTTLE, W_CLOSE, W_NOTICE, W_KINDS };

struct ncfsm__store {
  struct event_base *base;
  struct evconnlistener *lis;
  struct event *relisten;
  struct event *hb_timer;       /* PINGs every heartbeat_ms */
  int relisten_ms;
  int port;
  int reserve_fd;
  uint8_t *token;
  size_t toklen;
  ncfsm__frame_limits lim, hello_lim;
  ncfsm__store_opts o; /* the limits in force */
  uint64_t bytes, inflight, out_queued;
  struct entry *tab;            /* the keys (uthash) */
  LIST_HEAD(, sconn) conns;
  LIST_HEAD(, sconn) held;      /* HELLOs waiting for rank 0's (the job's size) */
  TAILQ_HEAD(, sconn) partials; /* connections holding an unfinished frame, oldest first */
  LIST_HEAD(, entry) gathers;   /* open gathers */
  struct group *gtab;           /* every group, by path (uthash) */
  LIST_HEAD(, group) groups;
  LIST_HEAD(, blob) blobs;
  struct rankslot *ranks;
  uint32_t job_size;
  char job_from[120];
  uint32_t n_gone, first_gone;
  char *conflict;               /* sticky: a rank was claimed twice */
  struct throttle thr[THROTTLE_SLOTS];
  uint64_t warn_last_ns[W_KINDS], warn_dropped[W_KINDS];
  ncfsm__store_stats st;
};

#define SUB NCFSM__SUB_BOOT

/* tcp_store.c */
/* At most one WARN line per second per kind; the others are counted and
 * reported with the next line. */
void ncfsm__st_warn_limited(ncfsm__store *s, int kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
struct timeval ncfsm__st_ms_tv(uint64_t ms);

/* store_table.c: max_bytes accounting (0, or -1 when n more do not fit) */
int ncfsm__st_charge(ncfsm__store *s, uint64_t n);
void ncfsm__st_uncharge(ncfsm__store *s, uint64_t n);
struct blob *ncfsm__st_blob_new(ncfsm__store *s, size_t len);
void ncfsm__st_blob_unref(struct blob *b);
void ncfsm__st_blob_unref_cb(const void *data, size_t len, void *arg); /* evbuffer's cleanup */
/* The entry of key (made when create; NULL when max_bytes has no room). */
struct entry *ncfsm__st_table_get(ncfsm__store *s, const uint8_t *key, uint32_t klen, int create);
void ncfsm__st_gather_release(ncfsm__store *s, struct entry *e);
void ncfsm__st_entry_delete(ncfsm__store *s, struct entry *e);
void ncfsm__st_entry_maybe_drop(ncfsm__store *s, struct entry *e);
void ncfsm__st_table_drop_failed(ncfsm__store *s);
void ncfsm__st_table_clear(ncfsm__store *s);
const char *ncfsm__st_key_str(const struct entry *e, char *buf, size_t n);
extern char ncfsm__st_failed_oom[];

/* store_reply.c */
void ncfsm__st_reply(struct sconn *c, uint8_t type, uint32_t id, const void *val, uint32_t vlen);
void ncfsm__st_reply_err(struct sconn *c, uint32_t id, const char *msg);
void ncfsm__st_reply_blob(struct sconn *c, uint32_t id, struct blob *b);
/* A frame pushed by the store with a key (id 0: LOST of a channel, NOTICE). */
void ncfsm__st_push_keyed(struct sconn *c, uint8_t type, const void *key, uint32_t klen,
                          const void *val, uint32_t vlen);
void ncfsm__st_waiter_free(ncfsm__store *s, struct waiter *w);
void ncfsm__st_wake_waiters(ncfsm__store *s, struct entry *e);
/* NULL, or why not ("parked": past max_parked; else the reason to reply). */
const char *ncfsm__st_park(struct sconn *c, struct entry *e, uint8_t type, uint32_t id);
void ncfsm__st_gather_fail(ncfsm__store *s, struct entry *e, const char *msg);

/* store_groups.c */
uint32_t ncfsm__st_group_rank(const struct group *g, uint32_t i);
int64_t ncfsm__st_group_index(const struct group *g, uint32_t rank);
struct group *ncfsm__st_group_find(ncfsm__store *s, const void *path, uint32_t plen);
struct group *ncfsm__st_group_new(ncfsm__store *s, const char *path, uint32_t plen, uint32_t n,
                                  uint32_t *ranks);
void ncfsm__st_group_free(ncfsm__store *s, struct group *g);
void ncfsm__st_agwaiter_free(ncfsm__store *s, struct agwaiter *w);
void ncfsm__st_set_msg(ncfsm__store *s, char **slot, const char *msg);
void ncfsm__st_ag_eval(ncfsm__store *s, struct group *g);
const char *ncfsm__st_handle_agree(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n);

/* store_channels.c */
const char *ncfsm__st_handle_chan(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n);
void ncfsm__st_handle_chan_close(struct sconn *c, const ncfsm__frame *f);
void ncfsm__st_handle_notice(struct sconn *c, const ncfsm__frame *f);
/* Job rank `rank` is gone (its connection ended): its channels lose it, and those that every
 * member has now left are freed. */
void ncfsm__st_chan_rank_gone(ncfsm__store *s, uint32_t rank);
/* Member `job_rank` left: every open gather (of group only, or of every group when NULL) that
 * needs it fails with "<what> <who> <event> (<reason>)<tail>", except broadcasts it only
 * receives (they count it as served). */
void ncfsm__st_member_left(ncfsm__store *s, struct group *only, uint32_t job_rank, const char *who,
                           const char *event, const char *reason, const char *tail);

/* store_ranks.c */
void ncfsm__st_push_lost(ncfsm__store *s, uint32_t rank, const char *why);
void ncfsm__st_bcast_maybe_done(ncfsm__store *s, struct entry *e);
void ncfsm__st_rank_release(struct sconn *c, const char *reason);
/* A HELLO: NULL when admitted or held (a rank other than 0 before the job's size is known:
 * answered once rank 0's HELLO fixes it), else why c is refused. */
const char *ncfsm__st_handle_hello(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n);
/* Fix the job's size; from says by whom, for the refusals of other sizes. 0, or -1 (max_bytes). */
int ncfsm__st_job_size_set(ncfsm__store *s, uint32_t size, const char *from);

/* store_heartbeat.c */
void ncfsm__st_hb_ok_value(const ncfsm__store *s, uint8_t v[12]);
/* A HELLO with flag HEARTBEAT: NULL when c became rank's heartbeat connection, else why not. */
const char *ncfsm__st_hb_hello(struct sconn *c, uint32_t rank, uint32_t size, uint32_t id, char *buf,
                               size_t n);
void ncfsm__st_hb_silent(struct sconn *c);
void ncfsm__st_hb_unlink(struct sconn *c);
void ncfsm__st_hb_tick(evutil_socket_t fd, short what, void *arg);

/* store_requests.c: a frame of c; NULL, or why c must be closed (buf may hold it) */
const char *ncfsm__st_handle(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n);
const char *ncfsm__st_parked_why(struct sconn *c, char *buf, size_t n);

/* store_conn.c */
void ncfsm__st_conn_free(struct sconn *c);
void ncfsm__st_conn_fail(struct sconn *c, uint32_t id, const char *why, int drop);
void ncfsm__st_fail_later(struct sconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ncfsm__st_accept_cb(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa, int salen,
                         void *arg);
void ncfsm__st_relisten_cb(evutil_socket_t fd, short what, void *arg);
void ncfsm__st_accept_error_cb(struct evconnlistener *lis, void *arg);

#endif
