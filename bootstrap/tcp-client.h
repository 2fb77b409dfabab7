/* The tcp bootstrap's client internals, shared by its files (each one job):
 *   tcp_client.c  the connection to the store, HELLO, replies, allgathers and broadcasts
 *   tcp_views.c   peer loss, agreements, survivors' and channels' views, notices
 *   tcp_heartbeat.c the heartbeat connection's thread
 * Everything runs on the rank's loop thread. */
#ifndef NCFSM_BOOTSTRAP_TCP_CLIENT_H
#define NCFSM_BOOTSTRAP_TCP_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include "bootstrap/boot-internal.h"
#include "bootstrap/frame.h"
#include "bootstrap/tcp-heartbeat.h"
#include "bootstrap/tcp-internal.h"

struct bufferevent;
struct evbuffer;
struct event;
struct tcp_impl;
struct tcp_view;

typedef struct tcp_op {
  TAILQ_ENTRY(tcp_op) link;
  uint32_t id;
  ncfsm_boot_req *req;   /* NULL: a channel's CHAN, whose answer is for view */
  struct tcp_view *view;
} tcp_op;

struct tcp_impl;

/* What one bootstrap handle sees of the connection: the job (the root view,
 * group "@"), the survivors of an agreement (group "@/<epoch>...") or a channel
 * (group "@#<tag>"). */
typedef struct tcp_view {
  struct tcp_impl *t;
  ncfsm_boot *b;
  char path[NCFSM__FRAME_KEY_MAX];
  uint32_t *ranks; /* [b->size] job ranks (a channel's in its order); NULL: the root view */
  int chan;        /* a channel's view */
  LIST_ENTRY(tcp_view) link;
} tcp_view;

typedef struct tcp_impl {
  tcp_view root;
  LIST_HEAD(, tcp_view) views; /* survivors' views */
  ncfsm_boot *b;
  ncfsm__store *hosted;
  struct sockaddr_storage ss;
  int salen;
  char addr[160];
  struct bufferevent *bev;
  struct evbuffer *queued; /* frames posted before the store accepted the HELLO */
  int connected, hello_ok, dead;
  char *token; /* what the HELLO carries: the job token, or this rank's secret */
  uint64_t deadline_ns;
  struct event *retry_ev;
  int retry_ms, attempts;
  char connect_err[160];
  uint32_t next_id;
  TAILQ_HEAD(, tcp_op) ops;
  ncfsm__frame_limits lim;
  ncfsm__hb *hb;           /* the heartbeat connection (tcp_heartbeat.c), once the HELLO was answered */
  struct event *hb_ev;     /* activated by the heartbeat thread when it failed */
  int no_hb;               /* NCFSM_STORE_HEARTBEAT=0: open no heartbeat connection */
} tcp_impl;

/* tcp_client.c */
/* Queue a frame (before the HELLO's answer: in t->queued). 0, or nonzero when out of memory. */
int ncfsm__tcp_send(tcp_impl *t, uint8_t type, uint32_t id, const void *key, size_t kl,
                    const void *v1, size_t l1, const void *v2, size_t l2);
tcp_op *ncfsm__tcp_op_new(tcp_impl *t, ncfsm_boot_req *req);
void ncfsm__tcp_cancel(ncfsm_boot_req *req);
void ncfsm__tcp_describe(ncfsm_boot *b, char *buf, size_t n);

/* tcp_views.c */
void ncfsm__tcp_on_lost(tcp_impl *t, const ncfsm__frame *f);
void ncfsm__tcp_on_notice(tcp_impl *t, const ncfsm__frame *f);
void ncfsm__tcp_on_agree_reply(tcp_impl *t, ncfsm_boot_req *req, const ncfsm__frame *f);
void ncfsm__tcp_on_chan_reply(tcp_impl *t, tcp_view *v, const ncfsm__frame *f);
/* A survivors' or a channel's view closes (its requests are freed: the dispatch checks). */
void ncfsm__tcp_view_close(tcp_view *v);
ncfsm_result_t ncfsm__tcp_agree_post(ncfsm_boot *b, ncfsm_boot_req *req);
ncfsm_result_t ncfsm__tcp_agree_expire(ncfsm_boot_req *req, char *msg, size_t n);
ncfsm_result_t ncfsm__tcp_survivors(ncfsm_boot *parent, ncfsm_boot_req *agreed, ncfsm_boot *child);
ncfsm_result_t ncfsm__tcp_channel_open(ncfsm_boot *parent, ncfsm_boot *child);
ncfsm_result_t ncfsm__tcp_notice_post(ncfsm_boot *b, const ncfsm_boot_notice *n);

#endif
