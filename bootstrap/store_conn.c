/* The tcp store's connections: accepting (max_conns, out of descriptors), the
 * read loop and its bounds on input (frame deadline, max_inflight) and output
 * (out_high, out_max, out_stall_ms, max_out), and closing with a named ERR. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "bootstrap/store-internal.h"

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
      struct timeval tv = ncfsm__st_ms_tv(s->o.frame_timeout_ms);
      c->timer_kind = T_FRAME;
      evtimer_add(c->timer, &tv);
    }
  }
}

void ncfsm__st_conn_free(struct sconn *c) {
  ncfsm__store *s = c->s;
  ncfsm__st_rank_release(c, "connection closed");
  struct evbuffer *out = bufferevent_get_output(c->bev);
  if (c->out_cb) evbuffer_remove_cb_entry(out, c->out_cb);
  s->out_queued -= evbuffer_get_length(out);
  struct waiter *w;
  while ((w = LIST_FIRST(&c->waiters)) != NULL) {
    struct entry *e = w->e;
    ncfsm__st_waiter_free(s, w);
    ncfsm__st_entry_maybe_drop(s, e);
  }
  struct agwaiter *aw;
  while ((aw = LIST_FIRST(&c->agw)) != NULL) ncfsm__st_agwaiter_free(s, aw);
  if (c->in_partial) TAILQ_REMOVE(&s->partials, c, partial);
  if (c->held) LIST_REMOVE(c, hlink);
  if (c->hb) ncfsm__st_hb_unlink(c);
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
  ncfsm__st_conn_free(arg);
}

static void conn_closing_event_cb(struct bufferevent *bev, short what, void *arg) {
  (void)bev;
  (void)what;
  ncfsm__st_conn_free(arg);
}

/* Close c after its ERR frame (and, unless drop, anything queued before it)
 * is flushed, or after one second if the peer does not read. Its input is
 * dropped at once; a ranked connection's rank is released now. */
void ncfsm__st_conn_fail(struct sconn *c, uint32_t id, const char *why, int drop) {
  ncfsm__store *s = c->s;
  if (c->closing) return;
  if (c->ranked || c->hb) /* at most one (two) per rank: always */
    NCFSM_WARN(SUB, "store: closing %sconnection from %s (rank %u): %s", c->hb ? "heartbeat " : "",
               c->peer, c->rank, why);
  else
    ncfsm__st_warn_limited(s, W_CLOSE, "store: closing connection from %s (rank -1): %s", c->peer, why);
  c->closing = 1;
  char reason[300];
  snprintf(reason, sizeof reason, "closed by the store: %s", why);
  ncfsm__st_rank_release(c, reason);
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
  ncfsm__frame_header_v(hdr, c->err_version ? c->err_version : NCFSM__FRAME_VERSION, NCFSM__F_ERR,
                        id, 0, n);
  evbuffer_add(out, hdr, sizeof hdr);
  evbuffer_add(out, why, n);
  bufferevent_setcb(c->bev, conn_closing_read_cb, conn_closing_write_cb, conn_closing_event_cb, c);
  bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
  bufferevent_setwatermark(c->bev, EV_READ, 0, 0);
  struct timeval one = {1, 0};
  bufferevent_set_timeouts(c->bev, NULL, &one);
  bufferevent_enable(c->bev, EV_READ | EV_WRITE);
}

void ncfsm__st_fail_later(struct sconn *c, const char *fmt, ...) {
  if (c->closing || c->fail_later) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->fail_buf, sizeof c->fail_buf, fmt, ap);
  va_end(ap);
  c->fail_later = c->fail_buf;
  event_del(c->timer);
  event_active(c->timer, EV_TIMEOUT, 1);
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
    ncfsm__st_conn_fail(v, 0, msg, 1);
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
    if (want > 4 && ncfsm__rd32(p) == NCFSM__FRAME_MAGIC && p[4] >= 1 && p[4] < NCFSM__FRAME_VERSION) {
      /* an older client: refuse it in a frame of its own version, which it can read */
      char msg[300];
      snprintf(msg, sizeof msg, "wire version %u: this store speaks the ncfsm store's wire version "
                                "%u (bootstrap channels and notices); run the same ncfsm on every "
                                "rank and the store",
               p[4], NCFSM__FRAME_VERSION);
      s->st.old_clients++;
      c->err_version = p[4];
      return ncfsm__st_conn_fail(c, 0, msg, 0);
    }
    if (!c->authed && !c->held && want > 5 && p[5] != NCFSM__F_HELLO && p[0] == 'N' &&
        p[1] == 'C') {
      s->st.closed_bad_frame++;
      return ncfsm__st_conn_fail(c, 0, "first frame is not HELLO", 0);
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
      return ncfsm__st_conn_fail(c, 0, why ? why : "unparsable frame", 0);
    }
    int was_authed = c->authed;
    char buf[512];
    why = ncfsm__st_handle(c, &f, buf, sizeof buf);
    if (why) {
      if (was_authed || f.type != NCFSM__F_HELLO) s->st.closed_bad_frame++;
      return ncfsm__st_conn_fail(c, f.id, why, 0);
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
  if ((what & BEV_EVENT_TIMEOUT) && (what & BEV_EVENT_READING)) /* a heartbeat connection */
    return ncfsm__st_hb_silent(c);
  if (what & BEV_EVENT_TIMEOUT) { /* writing: no reply read for out_stall_ms */
    s->st.closed_unread++;
    char msg[300];
    snprintf(msg, sizeof msg, "not reading its replies: %zu bytes queued, none read for %" PRIu64
                              " ms (raise --out-stall-ms / NCFSM_STORE_OUT_STALL_MS)",
             evbuffer_get_length(bufferevent_get_output(bev)), s->o.out_stall_ms);
    return ncfsm__st_conn_fail(c, 0, msg, 1);
  }
  size_t left = evbuffer_get_length(bufferevent_get_input(bev));
  char reason[200];
  if (left) {
    snprintf(reason, sizeof reason, "connection closed in the middle of a frame (%zu bytes left)",
             left);
    ncfsm__st_warn_limited(s, W_CLOSE, "store: connection from %s (rank %d) closed in the middle of a "
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
  ncfsm__st_rank_release(c, reason);
  ncfsm__st_conn_free(c);
}

/* The auth or frame deadline passed, or a deferred close (fail_later). */
static void conn_timer_cb(evutil_socket_t fd, short what, void *arg) {
  struct sconn *c = arg;
  ncfsm__store *s = c->s;
  (void)fd;
  (void)what;
  if (c->closing) return;
  if (c->fail_later) return ncfsm__st_conn_fail(c, 0, c->fail_later, 1);
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
  ncfsm__st_conn_fail(c, 0, msg, 1);
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
  ncfsm__st_warn_limited(s, W_BUSY, "store: refused a connection from %s: %s", peer, why);
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

void ncfsm__st_accept_cb(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa, int salen,
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
    ncfsm__st_warn_limited(s, W_ACCEPT, "store: out of memory accepting a connection from %s", peer);
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
  struct timeval stall = ncfsm__st_ms_tv(s->o.out_stall_ms), auth = ncfsm__st_ms_tv(s->o.auth_timeout_ms);
  bufferevent_set_timeouts(bev, NULL, &stall);
  c->timer_kind = T_AUTH;
  evtimer_add(c->timer, &auth);
  bufferevent_enable(bev, EV_READ | EV_WRITE);
}

void ncfsm__st_relisten_cb(evutil_socket_t fd, short what, void *arg) {
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
void ncfsm__st_accept_error_cb(struct evconnlistener *lis, void *arg) {
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
  ncfsm__st_warn_limited(s, W_ACCEPT, "store: accept failed: %s; pausing the listener for %d ms (raise the "
                            "open-file limit, ulimit -n, for many ranks)",
               evutil_socket_error_to_string(err), s->relisten_ms);
  evconnlistener_disable(lis);
  struct timeval tv = ncfsm__st_ms_tv((uint64_t)s->relisten_ms);
  evtimer_add(s->relisten, &tv);
}
