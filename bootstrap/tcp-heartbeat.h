/*
 * The tcp bootstrap's heartbeat connection (docs/bootstrap.md, "Heartbeats"):
 * a second connection to the store, owned by a thread of its own, that sends a
 * PING every heartbeat_ms and watches the store's PINGs. It runs whether or
 * not the rank's event_base is dispatched (a rank busy computing is not taken
 * for a hung one), and stops with the process (SIGSTOP, a crash), which is
 * how the store tells a hung or partitioned rank within its silence_ms.
 */
#ifndef NCFSM_BOOTSTRAP_TCP_HEARTBEAT_H
#define NCFSM_BOOTSTRAP_TCP_HEARTBEAT_H

#include <stddef.h>
#include <stdint.h>

struct event;
struct sockaddr;
typedef struct ncfsm__hb ncfsm__hb;

typedef struct ncfsm__hb_opts {
  const struct sockaddr *addr; /* the store */
  int addrlen;
  const char *addr_str;        /* "host:port", for messages */
  const char *token;           /* what the HELLO carries: the job token or this rank's secret */
  uint32_t rank, size;
  uint32_t heartbeat_ms;       /* a PING this often */
  uint32_t silence_ms;         /* the connection is lost when nothing was acknowledged (TCP) or,
                                  with judge_silence, nothing arrived, for this long */
  int judge_silence;           /* the store PINGs on its own (a standalone store): its silence
                                  is a loss; 0 for a store in a rank's loop */
  struct event *wake;          /* event_active'd from the heartbeat thread when it failed */
} ncfsm__hb_opts;

/* Libevent's locks are on (evthread_use_pthreads() before the base was made): the thread
 * may wake the rank's base. */
int ncfsm__hb_can_wake(void);
/* Start the heartbeat thread; NULL (err says why) when it cannot. */
ncfsm__hb *ncfsm__hb_start(const ncfsm__hb_opts *o, char *err, size_t errlen);
/* Why the heartbeat connection failed, or "" while it runs (any thread). */
void ncfsm__hb_error(ncfsm__hb *h, char *buf, size_t n);
/* Stop the thread (joined) and close its connection. */
void ncfsm__hb_stop(ncfsm__hb *h);

#endif
