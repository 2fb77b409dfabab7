/*
 * The tcp bootstrap's heartbeat connection: one thread per bootstrap, one
 * socket, plain poll(). HELLO (the rank, its size, flag HB), then a PING every
 * heartbeat_ms; the store answers with its own PINGs. The connection is lost
 * (the thread records why, wakes the rank's base and ends) when the store
 * closes it or refuses the HELLO, when TCP gets no acknowledgement for
 * silence_ms (TCP_USER_TIMEOUT: a partition, the store's host down), or, for a
 * standalone store, when nothing arrived for silence_ms (the store hung). A
 * store that closes it closes (or closed) the rank's own connection too: that
 * one reports it, after the replies that came before; the thread just ends.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "bootstrap/frame.h"
#include "bootstrap/tcp-heartbeat.h"
#include "core/log.h"

struct ncfsm__hb {
  ncfsm__hb_opts o;
  char addr_str[160];
  char *token;
  struct sockaddr_storage ss;
  int fd;
  int stop_pipe[2];
  pthread_t th;
  pthread_mutex_t mu;
  char err[400]; /* under mu */
};

static uint64_t now_ms(void) { return ncfsm__now_ns() / 1000000u; }

static void hb_fail(ncfsm__hb *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void hb_fail(ncfsm__hb *h, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&h->mu);
  vsnprintf(h->err, sizeof h->err, fmt, ap);
  pthread_mutex_unlock(&h->mu);
  va_end(ap);
  event_active(h->o.wake, EV_READ, 0);
}

/* Wait until fd is ready for ev or ms passed; 1 ready, 0 time, -1 stopped. */
static int wait_fd(ncfsm__hb *h, short ev, int ms) {
  struct pollfd p[2] = {{h->fd, ev, 0}, {h->stop_pipe[0], POLLIN, 0}};
  int r;
  do r = poll(p, 2, ms);
  while (r < 0 && errno == EINTR);
  if (p[1].revents) return -1;
  return r > 0 ? 1 : 0;
}

static int send_frame(ncfsm__hb *h, uint8_t type, const void *key, uint32_t klen, const void *v,
                      uint32_t vlen) {
  uint8_t buf[NCFSM__FRAME_HDR + NCFSM__FRAME_KEY_MAX + 12];
  ncfsm__frame_header(buf, type, 0, klen, vlen);
  memcpy(buf + NCFSM__FRAME_HDR, key, klen);
  memcpy(buf + NCFSM__FRAME_HDR + klen, v, vlen);
  size_t n = NCFSM__FRAME_HDR + klen + vlen, sent = 0;
  while (sent < n) { /* small frames: only the HELLO can wait here, and not for long */
    ssize_t w = send(h->fd, buf + sent, n - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) sent += (size_t)w;
    else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (sent == 0 && type == NCFSM__F_PING) return 0; /* the socket is full: the next one */
      if (wait_fd(h, POLLOUT, (int)h->o.silence_ms) != 1) return -1;
    } else return -1;
  }
  return 0;
}

static const char *sock_err(ncfsm__hb *h, char *buf, size_t n) {
  int e = 0;
  socklen_t el = sizeof e;
  getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &e, &el);
  if (e == ETIMEDOUT)
    snprintf(buf, n, "no TCP acknowledgement for %u ms (the network to the store is partitioned, "
                     "or its host is down)",
             h->o.silence_ms);
  else snprintf(buf, n, "%s", e ? strerror(e) : "connection closed by the store");
  return buf;
}

/* A new socket, connected and its HELLO sent: 0, -1 (failed: hb_fail called) or -2 (stopped). */
static int hb_connect(ncfsm__hb *h) {
  const ncfsm__hb_opts *o = &h->o;
  char why[200];
  if (h->fd >= 0) close(h->fd);
  h->fd = socket(h->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (h->fd < 0) {
    hb_fail(h, "heartbeat connection to store %s: socket: %s", h->addr_str, strerror(errno));
    return -1;
  }
  int one = 1;
  unsigned ut = o->silence_ms;
  setsockopt(h->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(h->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut);
  /* connect, nonblocking, within silence_ms */
  int r = connect(h->fd, (struct sockaddr *)&h->ss, (socklen_t)o->addrlen);
  if (r != 0 && errno != EINPROGRESS) {
    hb_fail(h, "heartbeat connection to store %s: connect: %s", h->addr_str, strerror(errno));
    return -1;
  }
  if (r != 0) {
    int w = wait_fd(h, POLLOUT, (int)o->silence_ms), e = 0;
    socklen_t el = sizeof e;
    if (w < 0) return -2;
    if (w == 1) getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &e, &el);
    if (w == 0 || e) {
      if (w == 0) snprintf(why, sizeof why, "not connected within %u ms", o->silence_ms);
      hb_fail(h, "heartbeat connection to store %s: %s", h->addr_str, w == 0 ? why : strerror(e));
      return -1;
    }
  }
  uint8_t v[12];
  ncfsm__wr32(v, o->rank);
  ncfsm__wr32(v + 4, o->size);
  ncfsm__wr32(v + 8, NCFSM__HELLO_HEARTBEAT);
  if (send_frame(h, NCFSM__F_HELLO, h->token, (uint32_t)strlen(h->token), v, 12) != 0) {
    hb_fail(h, "heartbeat connection to store %s: HELLO not sent: %s", h->addr_str,
            sock_err(h, why, sizeof why));
    return -1;
  }
  return 0;
}

static void *hb_main(void *arg) {
  ncfsm__hb *h = arg;
  const ncfsm__hb_opts *o = &h->o;
  char why[200];
  if (hb_connect(h) != 0) return NULL;
  uint8_t in[NCFSM__FRAME_HDR + NCFSM__FRAME_KEY_MAX + 2048]; /* the largest frame lim admits */
  size_t have = 0;
  int hello_ok = 0, throttled = 0;
  uint64_t last_rx = now_ms(), next_ping = last_rx + o->heartbeat_ms;
  ncfsm__frame_limits lim = {NCFSM__FRAME_KEY_MAX, 2048};
  for (;;) {
    uint64_t t = now_ms();
    int ms = next_ping > t ? (int)(next_ping - t) : 0;
    int w = wait_fd(h, POLLIN, ms);
    if (w < 0) return NULL;
    t = now_ms();
    if (w > 0) {
      ssize_t got = recv(h->fd, in + have, sizeof in - have, MSG_DONTWAIT);
      if (got == 0 || (got < 0 && (errno == ECONNRESET || errno == EPIPE) && hello_ok)) {
        /* the store closed it (stopped, killed, or closing this rank): so it does, or did, the
         * rank's own connection, which reports it after the replies before it */
        NCFSM_INFO(NCFSM__SUB_BOOT, "tcp bootstrap rank %u: the store %s closed the heartbeat "
                                    "connection", o->rank, h->addr_str);
        return NULL;
      }
      if (got < 0 && errno != EAGAIN && errno != EINTR) {
        hb_fail(h, "heartbeat connection to store %s lost: %s", h->addr_str,
                sock_err(h, why, sizeof why));
        return NULL;
      }
      if (got > 0) {
        have += (size_t)got;
        last_rx = t;
      }
      for (;;) { /* the frames in: PINGs, the HELLO's OK, or an ERR (the store closing it) */
        ncfsm__frame f;
        size_t used = 0;
        const char *bad;
        ncfsm__parse_t p = ncfsm__frame_parse(in, have, &lim, &f, &used, &bad);
        if (p == NCFSM__PARSE_MORE) break;
        if (p == NCFSM__PARSE_ERR) {
          hb_fail(h, "store %s sent a bad frame on the heartbeat connection: %s", h->addr_str, bad);
          return NULL;
        }
        if (f.type == NCFSM__F_ERR && hello_ok) { /* closing it: the rank's connection says why */
          NCFSM_INFO(NCFSM__SUB_BOOT, "tcp bootstrap rank %u: the store %s closed the heartbeat "
                                      "connection: %.*s", o->rank, h->addr_str, (int)f.vlen,
                     (const char *)f.value);
          return NULL;
        }
        if (f.type == NCFSM__F_ERR && !hello_ok && f.vlen >= 9 && !memcmp(f.value, "throttled", 9)) {
          /* failed HELLOs from this address (an attack, another rank's wrong token): as the
           * rank's own connection does, wait the pause the store names, and again */
          char msg[300];
          snprintf(msg, sizeof msg, "%.*s", (int)f.vlen, (const char *)f.value);
          const char *in_ms = strstr(msg, "retry in ");
          int pause = in_ms ? atoi(in_ms + 9) : 0;
          if (pause < 100) pause = 100;
          if (pause > 2000) pause = 2000;
          if (!throttled++)
            NCFSM_WARN(NCFSM__SUB_BOOT, "tcp bootstrap rank %u: store %s throttled the heartbeat "
                                        "connection (%s); retrying", o->rank, h->addr_str, msg);
          struct pollfd sp = {h->stop_pipe[0], POLLIN, 0};
          if (poll(&sp, 1, pause) != 0) return NULL; /* stopped */
          int c = hb_connect(h);
          if (c != 0) return NULL;
          have = 0;
          last_rx = now_ms();
          next_ping = last_rx + o->heartbeat_ms;
          break;
        }
        if (f.type == NCFSM__F_ERR && f.vlen >= 10 && !memcmp(f.value, "store busy", 10)) {
          NCFSM_WARN(NCFSM__SUB_BOOT, "tcp bootstrap rank %u: store %s refused the heartbeat "
                                      "connection: %.*s; this rank runs without heartbeats (the "
                                      "store cannot tell it hung): give the store 2 connections "
                                      "per rank (--max-conns, ulimit -n)",
                     o->rank, h->addr_str, (int)f.vlen, (const char *)f.value);
          return NULL;
        }
        if (f.type == NCFSM__F_ERR) {
          hb_fail(h, "store %s refused rank %u's heartbeat connection: %.*s", h->addr_str, o->rank,
                  (int)f.vlen, (const char *)f.value);
          return NULL;
        }
        if (f.type == NCFSM__F_OK) hello_ok = 1;
        memmove(in, in + used, have - used);
        have -= used;
      }
    }
    if (o->judge_silence && t > last_rx && t - last_rx > o->silence_ms) {
      hb_fail(h, "store %s silent for %llu ms on the heartbeat connection (its limit %u ms): the "
                 "store is stopped or hung, or the network to it is partitioned",
              h->addr_str, (unsigned long long)(t - last_rx), o->silence_ms);
      return NULL;
    }
    if (t >= next_ping) {
      if (send_frame(h, NCFSM__F_PING, "", 0, "", 0) != 0) {
        hb_fail(h, "heartbeat connection to store %s lost: %s", h->addr_str,
                sock_err(h, why, sizeof why));
        return NULL;
      }
      next_ping = t + o->heartbeat_ms;
    }
  }
}

int ncfsm__hb_can_wake(void) {
  struct evbuffer *e = evbuffer_new();
  int on = e && evbuffer_enable_locking(e, NULL) == 0;
  if (e) evbuffer_free(e);
  return on;
}

ncfsm__hb *ncfsm__hb_start(const ncfsm__hb_opts *o, char *err, size_t errlen) {
  ncfsm__hb *h = calloc(1, sizeof *h);
  if (!h || o->addrlen > (int)sizeof h->ss || !(h->token = strdup(o->token))) {
    free(h);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  h->o = *o;
  snprintf(h->addr_str, sizeof h->addr_str, "%s", o->addr_str);
  h->o.addr_str = h->addr_str;
  memcpy(&h->ss, o->addr, (size_t)o->addrlen);
  h->o.addr = (struct sockaddr *)&h->ss;
  h->stop_pipe[0] = h->stop_pipe[1] = -1;
  pthread_mutex_init(&h->mu, NULL);
  h->fd = -1; /* the thread makes it */
  if (pipe(h->stop_pipe) != 0) {
    snprintf(err, errlen, "heartbeat connection: %s", strerror(errno));
    goto fail;
  }
  for (int i = 0; i < 2; i++) fcntl(h->stop_pipe[i], F_SETFD, FD_CLOEXEC);
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, 256 * 1024);
  int e = pthread_create(&h->th, &at, hb_main, h);
  pthread_attr_destroy(&at);
  if (e != 0) {
    snprintf(err, errlen, "heartbeat thread: %s", strerror(e));
    goto fail;
  }
  return h;
fail:
  if (h->fd >= 0) close(h->fd);
  if (h->stop_pipe[0] >= 0) close(h->stop_pipe[0]);
  if (h->stop_pipe[1] >= 0) close(h->stop_pipe[1]);
  pthread_mutex_destroy(&h->mu);
  free(h->token);
  free(h);
  return NULL;
}

void ncfsm__hb_error(ncfsm__hb *h, char *buf, size_t n) {
  pthread_mutex_lock(&h->mu);
  snprintf(buf, n, "%s", h->err);
  pthread_mutex_unlock(&h->mu);
}

void ncfsm__hb_stop(ncfsm__hb *h) {
  if (!h) return;
  ssize_t w = write(h->stop_pipe[1], "x", 1);
  (void)w;
  pthread_join(h->th, NULL);
  if (h->fd >= 0) close(h->fd);
  close(h->stop_pipe[0]);
  close(h->stop_pipe[1]);
  pthread_mutex_destroy(&h->mu);
  memset(h->token, 0, strlen(h->token));
  free(h->token);
  free(h);
}
