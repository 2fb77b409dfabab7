/*
 * The tcp store's heartbeats (docs/bootstrap.md, "Heartbeats"). A rank whose
 * HELLO was answered opens a second connection (HELLO flag HEARTBEAT) that
 * only carries PINGs, sent by a thread of the rank's own every heartbeat_ms.
 * The store PINGs back on it at the same pace; when nothing arrives on it for
 * silence_ms (the process is stopped or hung, the network to it partitioned,
 * its host down), the store closes both of the rank's connections: the rank
 * is lost, its gathers fail and LOST goes to every other rank, by name.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "bootstrap/store-internal.h"

/* The value of a ranked HELLO's OK: what the rank's heartbeat connection must do. */
void ncfsm__st_hb_ok_value(const ncfsm__store *s, uint8_t v[12]) {
  ncfsm__wr32(v, (uint32_t)s->o.heartbeat_ms);
  ncfsm__wr32(v + 4, (uint32_t)s->o.silence_ms);
  ncfsm__wr32(v + 8, s->o.hosted ? 0u : 1u); /* a store in a rank's loop PINGs only when it runs */
}

const char *ncfsm__st_hb_hello(struct sconn *c, uint32_t rank, uint32_t size, uint32_t id, char *buf,
                               size_t n) {
  ncfsm__store *s = c->s;
  if (s->o.heartbeat_off) return "heartbeat connection refused: this store runs without heartbeats "
                                 "(--no-heartbeat / NCFSM_STORE_HEARTBEAT=0)";
  struct rankslot *slot = s->job_size == size && rank < size ? &s->ranks[rank] : NULL;
  if (!slot || slot->state != RS_LIVE) {
    snprintf(buf, n, "heartbeat connection of rank %u of %u: no such rank is connected (the "
                     "store's job has %u ranks; a rank opens it once its HELLO was answered)",
             rank, size, s->job_size);
    return buf;
  }
  if (slot->hbc) {
    snprintf(buf, n, "a second heartbeat connection for rank %u (the first from %s)", rank,
             slot->hbc->peer);
    return buf;
  }
  c->authed = 1;
  c->hb = 1;
  c->rank = rank;
  slot->hbc = c;
  s->st.hb_conns++; /* counted here, not in accepted: the counters count ranks' connections */
  s->st.accepted--;
  if (c->timer_kind == T_AUTH) {
    event_del(c->timer);
    c->timer_kind = T_NONE;
  }
  struct timeval silence = ncfsm__st_ms_tv(s->o.silence_ms), stall = ncfsm__st_ms_tv(s->o.out_stall_ms);
  bufferevent_set_timeouts(c->bev, &silence, &stall);
  NCFSM_TRACE(SUB, "store: %s is rank %u's heartbeat connection", c->peer, rank);
  ncfsm__st_reply(c, NCFSM__F_OK, id, NULL, 0);
  return NULL;
}

/* Nothing arrived on heartbeat connection c for silence_ms: rank c->rank is lost. */
void ncfsm__st_hb_silent(struct sconn *c) {
  ncfsm__store *s = c->s;
  s->st.closed_silent++;
  char msg[400];
  snprintf(msg, sizeof msg, "no heartbeat from rank %u for %" PRIu64 " ms (the store's limit, "
                            "--silence-ms; heartbeats every %" PRIu64 " ms): the process is "
                            "stopped or hung, or the network between it and the store is "
                            "partitioned",
           c->rank, s->o.silence_ms, s->o.heartbeat_ms);
  struct sconn *own = s->ranks[c->rank].hbc == c ? s->ranks[c->rank].c : NULL; /* the rank's connection */
  ncfsm__st_conn_fail(c, 0, msg, 1);
  if (own) ncfsm__st_conn_fail(own, 0, msg, 1);
}

/* c (a heartbeat connection, or a rank's) is going: unlink the pair. */
void ncfsm__st_hb_unlink(struct sconn *c) {
  ncfsm__store *s = c->s;
  if (!s->ranks || c->rank >= s->job_size) return;
  struct rankslot *slot = &s->ranks[c->rank];
  if (c->hb) {
    if (slot->hbc == c) slot->hbc = NULL;
    return;
  }
  if (c->ranked && slot->c == c && slot->hbc) { /* the rank's connection ended: so does its watch */
    struct sconn *h = slot->hbc;
    slot->hbc = NULL;
    ncfsm__st_conn_fail(h, 0, "the rank's connection to the store ended", 1);
  }
}

/* Every heartbeat_ms: a PING on each heartbeat connection with nothing queued. */
void ncfsm__st_hb_tick(evutil_socket_t fd, short what, void *arg) {
  ncfsm__store *s = arg;
  (void)fd;
  (void)what;
  struct sconn *c;
  LIST_FOREACH(c, &s->conns, link)
    if (c->hb && !c->closing && evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
      ncfsm__st_reply(c, NCFSM__F_PING, 0, NULL, 0);
}
