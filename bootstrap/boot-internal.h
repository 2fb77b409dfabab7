/*
 * Bootstrap internals: the handle, the request and the table of operations
 * each implementation (pmix, tcp, local) fills in. All fields are touched only
 * on the thread that runs the handle's event_base, except where a comment says
 * otherwise.
 */
#ifndef NCFSM_BOOTSTRAP_BOOT_INTERNAL_H
#define NCFSM_BOOTSTRAP_BOOT_INTERNAL_H

#include <stdbool.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/util.h>

#include "core/log.h"
#include "ncfsm/bootstrap.h"

#define NCFSM__BOOT_MAGIC 0x6e62736bu     /* "nbsk" */
#define NCFSM__BOOT_REQ_MAGIC 0x6e627271u /* "nbrq" */
#define NCFSM__BOOT_DEAD_MAGIC 0xdeadb007u
#define NCFSM__BOOT_ERRLEN 512

struct event;

typedef struct ncfsm__boot_ops {
  const char *name;
  /* Fill b->rank/size/local_rank/local_size and b->impl; on failure write
   * the reason with ncfsm__boot_seterr and return an error. */
  ncfsm_result_t (*open)(ncfsm_boot *b, const ncfsm_boot_opts *o);
  void (*close)(ncfsm_boot *b);
  /* Start req (seq, send, recv, len filled in). Completion is reported on
   * the loop thread with ncfsm__boot_req_finish, never from inside post. */
  ncfsm_result_t (*post)(ncfsm_boot *b, ncfsm_boot_req *req);
  /* Called on the loop thread when req's wake event runs and req is not
   * finished (cross-thread implementations hand their results over here).
   * May be NULL. */
  void (*progress)(ncfsm_boot_req *req);
  /* req is being freed or has timed out while not finished: forget it. */
  void (*cancel)(ncfsm_boot_req *req);
  /* Optional: what the request waits on, for the timeout message
   * ("store 127.0.0.1:29500 did not answer"). */
  void (*describe)(ncfsm_boot *b, char *buf, size_t n);
  /* Recovery (docs/bootstrap.md, "Peer loss, agreement and the survivors'
   * bootstrap"). NULL agree_post: not supported (peer loss, agreement and
   * survivors all fail with NCFSM_ERR_UNSUPPORTED and no_recovery). */
  const char *no_recovery;
  /* Start the agreement req (req->epoch, req->alive of b->size entries set
   * up). Completion as for post; on NCFSM_OK req->alive and req->nalive
   * hold the result. */
  ncfsm_result_t (*agree_post)(ncfsm_boot *b, ncfsm_boot_req *req);
  /* The agreement's timer ran out (timeout_ms + agree_grace_ms): forget
   * req and return the error with the message (naming the ranks that did
   * not post, where the implementation knows them), or NCFSM_OK if the
   * result arrived meanwhile (then req->alive/nalive are filled). */
  ncfsm_result_t (*agree_expire)(ncfsm_boot_req *req, char *msg, size_t n);
  uint64_t agree_grace_ms;
  /* Fill child (rank, size, base, ... set by the dispatch) with its impl
   * for the survivors of the agreement agreed of parent. */
  ncfsm_result_t (*survivors)(ncfsm_boot *parent, ncfsm_boot_req *agreed, ncfsm_boot *child);
  /* Start the broadcast req (kind NCFSM__REQ_BCAST: seq = its broadcast number, root, len;
   * send = the bytes on root, recv = where they go on the others). Completion as for post;
   * cancel handles it. */
  ncfsm_result_t (*bcast_post)(ncfsm_boot *b, ncfsm_boot_req *req);
  /* Optional: the broadcasts of ncfsm_boot_bcast_roots_post as one request (kind
   * NCFSM__REQ_ROOTS, seq = the first of its nsubs broadcast numbers, recv = buf, len, subs
   * NULL); NULL: one BCAST request per root. */
  ncfsm_result_t (*roots_post)(ncfsm_boot *b, ncfsm_boot_req *req);
  /* Channels (docs/bootstrap.md, "Channels"). Fill child (rank, size, base, chan_tag and
   * chan_ranks [size] = its members as ranks of parent, set by the dispatch; child->ops is
   * parent's, an implementation may replace it) with its impl. NULL: no channels. Closing a
   * channel is its ops->close. */
  ncfsm_result_t (*channel_open)(ncfsm_boot *parent, ncfsm_boot *child);
  /* Optional: member i of the channel b was reported lost through its parent (loop thread;
   * b's lost record is set): fail or wake what waits for it. */
  void (*member_lost)(ncfsm_boot *b, int i);
  /* Notices: send n (origin set) to the other ranks of b; never blocks. NULL: not supported. */
  ncfsm_result_t (*notice_post)(ncfsm_boot *b, const ncfsm_boot_notice *n);
} ncfsm__boot_ops;

struct ncfsm__notice_node;

struct ncfsm_boot {
  uint32_t magic;
  const ncfsm__boot_ops *ops;
  ncfsm_boot_kind_t kind;
  struct event_base *base;
  int rank, size, local_rank, local_size;
  uint64_t timeout_ms;
  uint64_t seq;      /* collectives posted so far */
  int live_reqs;     /* requests not yet freed */
  struct ncfsm_boot_req *req_pool; /* freed requests kept with their events (boot.c req_new) */
  int npool;
  ncfsm_result_t failed; /* sticky: once the channel failed, every later post fails */
  char err[NCFSM__BOOT_ERRLEN];
  void *impl;
  /* recovery */
  ncfsm_boot *parent;     /* a survivors' bootstrap: the one it came from */
  int children;           /* survivors' bootstraps of this one not closed */
  uint8_t *lost;          /* [size], allocated at the first loss: LOST_* bits */
  char **lost_why;        /* [size] */
  ncfsm_boot_lost_cb lost_cb;
  void *lost_arg;
  struct event *lost_ev;  /* delivers the lost callbacks from the dispatch */
  int in_lost_cb;
  ncfsm_boot_req *agree_req; /* the agreement not yet finished, if any */
  uint64_t agree_last;    /* the last epoch posted */
  uint64_t bseq;          /* broadcasts posted so far (their own sequence) */
  ncfsm_boot_failed_cb failed_cb; /* ncfsm_boot_on_failed */
  void *failed_arg;
  struct event *failed_ev;  /* delivers it from the dispatch */
  int failed_told;
  /* channels: this one's tag and members (ranks of parent), and the channels of this one */
  char *chan_tag;           /* NULL: not a channel */
  int *chan_ranks;          /* [size] */
  ncfsm_boot *chans, *chan_next; /* the open channels of this bootstrap; next sibling */
  int nchans;
  /* notices received, waiting for the dispatch (boot_notify.c); the queue is under notice_mu
   * (implementations push from other threads: ncfsm__boot_notice_push) */
  pthread_mutex_t notice_mu;
  struct ncfsm__notice_node *nq_head, *nq_tail;
  int nq_len;
  uint64_t nq_dropped;
  struct event *notice_ev;
  ncfsm_boot_notice_cb notice_cb;
  void *notice_arg;
};

#define NCFSM__LOST 1u
#define NCFSM__LOST_TOLD 2u /* told to the current callback */

/* GATHER: an allgather (or barrier); AGREE: an agreement; BCAST: a broadcast; ROOTS: the
 * broadcasts of ncfsm_boot_bcast_roots_post (its subs, each a BCAST owned by it). */
enum { NCFSM__REQ_GATHER = 0, NCFSM__REQ_AGREE = 1, NCFSM__REQ_BCAST = 2, NCFSM__REQ_ROOTS = 3 };

struct ncfsm_boot_req {
  uint32_t magic;
  ncfsm_boot *b;
  uint64_t seq;
  const void *send;
  void *recv;
  size_t len;
  ncfsm_result_t status;  /* NCFSM_ERR_AGAIN until finished */
  struct event *wake;     /* event_active'd (possibly from another thread) */
  struct event *timer;    /* request timeout */
  ncfsm_boot_done_cb cb;
  void *cb_arg;
  int cb_called;
  void *impl;             /* the implementation's per-request state */
  int kind;               /* NCFSM__REQ_GATHER or NCFSM__REQ_AGREE */
  uint64_t epoch;         /* agreement */
  uint8_t *alive;         /* agreement: [b->size] result */
  int nalive;
  int child_made;         /* ncfsm_boot_survivors was called with it */
  int root;               /* broadcast */
  struct ncfsm_boot_req **subs; /* ROOTS: [nsubs] broadcasts */
  int nsubs, subs_done;
  struct ncfsm_boot_req *owner; /* a ROOTS' sub: the ROOTS request */
  struct ncfsm_boot_req *pool_next; /* in b->req_pool */
};

extern const ncfsm__boot_ops ncfsm__boot_local_ops;
extern const ncfsm__boot_ops ncfsm__boot_tcp_ops;
#ifdef NCFSM_HAVE_PMIX
extern const ncfsm__boot_ops ncfsm__boot_pmix_ops;
#endif

/* An NCFSM_STORE_*, NCFSM_BOOTSTRAP_* or NCFSM_LOCAL_* variable in the environment that is not a
 * row of the settings table (a misspelling): 0 when there is none, else -1 with a message that
 * names it (not its value: it may be a secret) and the rows like it. boot.c. */
int ncfsm__boot_env_unknown(char *err, size_t n);

/* Write the handle's last error (and log it at WARN). */
void ncfsm__boot_seterr(ncfsm_boot *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ncfsm__boot_vseterr(ncfsm_boot *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* Finish req with status st (loop thread). An error also records msg (if
 * not NULL) as the handle's last error. Wakes the base; the request's done
 * callback runs from the wake event. Idempotent: a finished request stays
 * finished. */
void ncfsm__boot_req_finish(ncfsm_boot_req *req, ncfsm_result_t st);
/* Rank rank of b is lost (loop thread): recorded once; the callback, if
 * any, is told from the dispatch. */
void ncfsm__boot_peer_lost(ncfsm_boot *b, int rank, const char *why);
/* boot_notify.c: the events that deliver the peer-lost and the failed callbacks. */
void ncfsm__boot_lost_ev_cb(evutil_socket_t fd, short what, void *arg);
void ncfsm__boot_failed_ev_cb(evutil_socket_t fd, short what, void *arg);
/* Why rank of b was lost, or NULL. */
const char *ncfsm__boot_lost_why(const ncfsm_boot *b, int rank);
/* A handle of base with ops, its events and its notice queue made (boot.c); NULL when out of
 * memory. ncfsm__boot_shell_free undoes it (and the lost records). */
ncfsm_boot *ncfsm__boot_shell_new(struct event_base *base, const ncfsm__boot_ops *ops,
                                  ncfsm_boot_kind_t kind);
void ncfsm__boot_shell_free(ncfsm_boot *b);
/* boot_notify.c: deliver the notices queued on b (its notice_ev). */
void ncfsm__boot_notice_ev_cb(evutil_socket_t fd, short what, void *arg);
/* Queue n for b's notice callback and wake b's base: any thread, as long as b stays open
 * during the call (the implementation guarantees it). Past 1024 queued, n is dropped. */
void ncfsm__boot_notice_push(ncfsm_boot *b, const ncfsm_boot_notice *n);
void ncfsm__boot_notice_clear(ncfsm_boot *b);
/* The wire form of a notice (tcp, pmix): u64 key, u32 origin, u64 seq, i32 cause, then the
 * text without its NUL (at most 255 bytes). encode returns the length (<= NCFSM__NOTICE_WIRE_MAX);
 * decode 0, or -1 when buf is not one. */
#define NCFSM__NOTICE_WIRE_MIN 24
#define NCFSM__NOTICE_WIRE_MAX (NCFSM__NOTICE_WIRE_MIN + NCFSM_BOOT_NOTICE_WHAT - 1)
size_t ncfsm__notice_encode(const ncfsm_boot_notice *n, uint8_t *out);
int ncfsm__notice_decode(const uint8_t *buf, size_t len, ncfsm_boot_notice *n);
/* The channel b's index of rank r of its parent, or -1. */
int ncfsm__boot_chan_index(const ncfsm_boot *b, int r);
/* boot_channel.c: NCFSM_ERR_UNSUPPORTED with call's reason in b's last error: recovery on a
 * bootstrap without it (pmix), or agreements and survivors on a channel. */
ncfsm_result_t ncfsm__boot_unsupported(ncfsm_boot *b, const char *call);
ncfsm_result_t ncfsm__boot_on_channel(ncfsm_boot *b, const char *call);
/* boot_channel.c: take the channel b out of its parent's list (at its close). */
void ncfsm__boot_chan_unlink(ncfsm_boot *b);
/* b or a channel of it has a request out (its parent cannot close it). */
bool ncfsm__boot_chan_busy(const ncfsm_boot *b);
/* The parent of c closes: so does c (and its channels); its handle fails every call until closed. */
void ncfsm__boot_chan_orphan(ncfsm_boot *c);
/* Mark the channel failed (sticky: the first status stays) and tell ncfsm_boot_on_failed's
 * callback from the dispatch. */
void ncfsm__boot_set_failed(ncfsm_boot *b, ncfsm_result_t st);
/* Mark the channel failed (sticky) with st and the message, and return st. */
ncfsm_result_t ncfsm__boot_fail(ncfsm_boot *b, ncfsm_result_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
