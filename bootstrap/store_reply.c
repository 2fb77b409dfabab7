/* The tcp store's replies (small values copied, larger ones referenced), the
 * requests parked on an entry, and gathers that fail for every rank. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>

#include "bootstrap/store-internal.h"

/* ---- replies ------------------------------------------------------------------ */

#define COPY_MAX 256 /* larger values are referenced, not copied, by replies */


/* May n more bytes be queued to c? Past out_max (a reply into an empty queue
 * always may) the connection is closed from its timer, not here: replies are
 * sent while the table is being walked. */
static int out_room(struct sconn *c, size_t n) {
  if (c->closing || c->overflow || c->fail_later) return 0;
  size_t q = evbuffer_get_length(bufferevent_get_output(c->bev));
  if (q > 0 && q + n > c->s->o.out_max) {
    c->overflow = 1;
    c->s->st.closed_unread++;
    ncfsm__st_fail_later(c, "not reading its replies: %zu bytes queued and %zu more due, over the store's "
                  "out_max of %" PRIu64 " (read replies as they come, or raise --out-max / "
                  "NCFSM_STORE_OUT_MAX)",
               q, n, c->s->o.out_max);
    return 0;
  }
  return 1;
}

void ncfsm__st_reply(struct sconn *c, uint8_t type, uint32_t id, const void *val, uint32_t vlen) {
  if (!out_room(c, NCFSM__FRAME_HDR + (size_t)vlen)) return;
  uint8_t hdr[NCFSM__FRAME_HDR];
  ncfsm__frame_header(hdr, type, id, 0, vlen);
  struct evbuffer *out = bufferevent_get_output(c->bev);
  evbuffer_add(out, hdr, sizeof hdr);
  if (vlen) evbuffer_add(out, val, vlen);
}

void ncfsm__st_push_keyed(struct sconn *c, uint8_t type, const void *key, uint32_t klen,
                          const void *val, uint32_t vlen) {
  if (!out_room(c, NCFSM__FRAME_HDR + (size_t)klen + vlen)) return;
  uint8_t hdr[NCFSM__FRAME_HDR];
  ncfsm__frame_header(hdr, type, 0, klen, vlen);
  struct evbuffer *out = bufferevent_get_output(c->bev);
  evbuffer_add(out, hdr, sizeof hdr);
  evbuffer_add(out, key, klen);
  if (vlen) evbuffer_add(out, val, vlen);
}

void ncfsm__st_reply_err(struct sconn *c, uint32_t id, const char *msg) {
  ncfsm__st_reply(c, NCFSM__F_ERR, id, msg, (uint32_t)strlen(msg));
}

/* OK + the blob's bytes: copied when small, else a reference. */
void ncfsm__st_reply_blob(struct sconn *c, uint32_t id, struct blob *b) {
  if (b->len <= COPY_MAX) return ncfsm__st_reply(c, NCFSM__F_OK, id, b->data, (uint32_t)b->len);
  if (!out_room(c, NCFSM__FRAME_HDR + b->len)) return;
  uint8_t hdr[NCFSM__FRAME_HDR];
  ncfsm__frame_header(hdr, NCFSM__F_OK, id, 0, (uint32_t)b->len);
  struct evbuffer *out = bufferevent_get_output(c->bev);
  evbuffer_add(out, hdr, sizeof hdr);
  b->refs++;
  if (evbuffer_add_reference(out, b->data, b->len, ncfsm__st_blob_unref_cb, b) != 0) {
    b->refs--;
    evbuffer_add(out, b->data, b->len);
  }
}

void ncfsm__st_waiter_free(ncfsm__store *s, struct waiter *w) {
  LIST_REMOVE(w, by_entry);
  LIST_REMOVE(w, by_conn);
  w->c->parked--;
  ncfsm__st_uncharge(s, sizeof *w);
  free(w);
}

/* Answer every GET/WAIT parked on e (which now has a value). */
void ncfsm__st_wake_waiters(ncfsm__store *s, struct entry *e) {
  struct waiter *w;
  while ((w = LIST_FIRST(&e->waiters)) != NULL) {
    if (w->type == NCFSM__F_GET) ncfsm__st_reply_blob(w->c, w->id, e->val);
    else ncfsm__st_reply(w->c, NCFSM__F_OK, w->id, NULL, 0);
    ncfsm__st_waiter_free(s, w);
  }
}

/* Park a request of c on e: NULL, or why not (the request is refused). */
const char *ncfsm__st_park(struct sconn *c, struct entry *e, uint8_t type, uint32_t id) {
  ncfsm__store *s = c->s;
  if (c->parked >= s->o.max_parked) return "parked";
  if (ncfsm__st_charge(s, sizeof(struct waiter)) != 0) return "store full (NCFSM store max bytes)";
  struct waiter *w = calloc(1, sizeof *w);
  if (!w) {
    ncfsm__st_uncharge(s, sizeof *w);
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
void ncfsm__st_gather_fail(ncfsm__store *s, struct entry *e, const char *msg) {
  s->st.gathers_failed++;
  struct waiter *w;
  while ((w = LIST_FIRST(&e->waiters)) != NULL) {
    ncfsm__st_reply_err(w->c, w->id, msg);
    ncfsm__st_waiter_free(s, w);
  }
  ncfsm__st_gather_release(s, e);
  e->failed = strdup(msg);
  if (e->failed) s->bytes += strlen(msg) + 1; /* bounded: one per collective that failed */
  else e->failed = ncfsm__st_failed_oom;
}
