/*
 * Bootstrap notifications: a lost peer (ncfsm_boot_on_peer_lost and its callback; passed on
 * to the channels it is a member of), the bootstrap's failure for good (ncfsm_boot_on_failed's),
 * recorded on the loop thread, and the notices of other ranks (ncfsm_boot_on_notice's, queued
 * from any thread): all delivered from the base's dispatch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/frame.h"

#include <event2/event.h>

#include "bootstrap/boot-internal.h"

/* Tell the callback every lost rank it has not been told (loop thread). */
void ncfsm__boot_lost_ev_cb(evutil_socket_t fd, short what, void *arg) {
  ncfsm_boot *b = arg;
  (void)fd;
  (void)what;
  if (!b->lost) return;
  b->in_lost_cb++;
  for (int r = 0; r < b->size && b->lost_cb; r++) {
    if (!(b->lost[r] & NCFSM__LOST) || (b->lost[r] & NCFSM__LOST_TOLD)) continue;
    b->lost[r] |= NCFSM__LOST_TOLD;
    b->lost_cb(b, r, b->lost_why[r] ? b->lost_why[r] : "lost", b->lost_arg);
  }
  b->in_lost_cb--;
}

void ncfsm__boot_peer_lost(ncfsm_boot *b, int rank, const char *why) {
  if (rank < 0 || rank >= b->size || rank == b->rank) return;
  if (!b->lost) {
    b->lost = calloc((size_t)b->size, 1);
    b->lost_why = calloc((size_t)b->size, sizeof *b->lost_why);
    if (!b->lost || !b->lost_why) {
      free(b->lost);
      free(b->lost_why);
      b->lost = NULL;
      b->lost_why = NULL;
      NCFSM_WARN(NCFSM__SUB_BOOT, "bootstrap %s rank %d: out of memory recording that rank %d was "
                                  "lost (%s)",
                 b->ops->name, b->rank, rank, why);
      return;
    }
  }
  if (b->lost[rank] & NCFSM__LOST) return;
  b->lost[rank] = NCFSM__LOST;
  b->lost_why[rank] = strdup(why ? why : "lost");
  NCFSM_INFO(NCFSM__SUB_BOOT, "bootstrap %s rank %d of %d: rank %d lost: %s", b->ops->name, b->rank,
             b->size, rank, why ? why : "");
  if (b->lost_cb) event_active(b->lost_ev, 0, 0);
  for (ncfsm_boot *c = b->chans; c; c = c->chan_next) { /* the channels it is a member of */
    int i = ncfsm__boot_chan_index(c, rank);
    if (i < 0) continue;
    char w2[700];
    snprintf(w2, sizeof w2, "rank %d of channel '%s' is rank %d of its parent: %.600s", i,
             c->chan_tag, rank, why ? why : "lost");
    ncfsm__boot_peer_lost(c, i, w2);
    if (c->ops->member_lost) c->ops->member_lost(c, i);
  }
}

const char *ncfsm__boot_lost_why(const ncfsm_boot *b, int rank) {
  if (!b->lost || rank < 0 || rank >= b->size || !(b->lost[rank] & NCFSM__LOST)) return NULL;
  return b->lost_why[rank] ? b->lost_why[rank] : "lost";
}


ncfsm_result_t ncfsm_boot_on_peer_lost(ncfsm_boot *b, ncfsm_boot_lost_cb cb, void *arg) {
  if (!b || b->magic != NCFSM__BOOT_MAGIC) return NCFSM_ERR_INVALID_ARGUMENT;
  if (!b->ops->agree_post) return ncfsm__boot_unsupported(b, "ncfsm_boot_on_peer_lost");
  b->lost_cb = cb;
  b->lost_arg = arg;
  if (b->lost)
    for (int r = 0; r < b->size; r++) b->lost[r] &= (uint8_t)~NCFSM__LOST_TOLD;
  if (cb && b->lost) event_active(b->lost_ev, 0, 0);
  return NCFSM_OK;
}

void ncfsm__boot_set_failed(ncfsm_boot *b, ncfsm_result_t st) {
  if (b->failed != NCFSM_OK || st == NCFSM_OK) return;
  b->failed = st;
  if (b->failed_cb) event_active(b->failed_ev, 0, 0);
}

/* The bootstrap failed: tell the callback once (loop thread). */
void ncfsm__boot_failed_ev_cb(evutil_socket_t fd, short what, void *arg) {
  ncfsm_boot *b = arg;
  (void)fd;
  (void)what;
  if (!b->failed_cb || b->failed_told || b->failed == NCFSM_OK) return;
  b->failed_told = 1;
  b->in_lost_cb++;
  b->failed_cb(b, b->failed, b->err, b->failed_arg);
  b->in_lost_cb--;
}

ncfsm_result_t ncfsm_boot_on_failed(ncfsm_boot *b, ncfsm_boot_failed_cb cb, void *arg) {
  if (!b || b->magic != NCFSM__BOOT_MAGIC) return NCFSM_ERR_INVALID_ARGUMENT;
  b->failed_cb = cb;
  b->failed_arg = arg;
  b->failed_told = 0;
  if (cb && b->failed != NCFSM_OK) event_active(b->failed_ev, 0, 0);
  return NCFSM_OK;
}


/* ---- notices ---------------------------------------------------------------------- */

#define NOTICE_QMAX 1024
_Static_assert(NCFSM__NOTICE_WIRE_MIN == NCFSM__FRAME_NOTICE_MIN &&
                   NCFSM__NOTICE_WIRE_MAX == NCFSM__FRAME_NOTICE_MAX,
               "the NOTICE frame carries the notice's wire form");

struct ncfsm__notice_node {
  struct ncfsm__notice_node *next;
  ncfsm_boot_notice n;
};

void ncfsm__boot_notice_push(ncfsm_boot *b, const ncfsm_boot_notice *n) {
  struct ncfsm__notice_node *q = malloc(sizeof *q);
  pthread_mutex_lock(&b->notice_mu);
  if (!q || b->nq_len >= NOTICE_QMAX) {
    if (b->nq_dropped++ == 0)
      NCFSM_WARN(NCFSM__SUB_BOOT, "bootstrap %s rank %d: %d notices wait for the notice callback "
                                  "(or memory ran out): dropping the notice of rank %d (key 0x%llx) "
                                  "and later ones until there is room",
                 b->ops->name, b->rank, b->nq_len, n->origin, (unsigned long long)n->key);
    pthread_mutex_unlock(&b->notice_mu);
    free(q);
    return;
  }
  q->n = *n;
  q->n.what[NCFSM_BOOT_NOTICE_WHAT - 1] = 0;
  q->next = NULL;
  if (b->nq_tail) b->nq_tail->next = q;
  else b->nq_head = q;
  b->nq_tail = q;
  b->nq_len++;
  int wake = b->notice_cb != NULL;
  pthread_mutex_unlock(&b->notice_mu);
  if (wake) event_active(b->notice_ev, 0, 0);
}

void ncfsm__boot_notice_clear(ncfsm_boot *b) {
  struct ncfsm__notice_node *q;
  while ((q = b->nq_head) != NULL) {
    b->nq_head = q->next;
    free(q);
  }
  b->nq_tail = NULL;
  b->nq_len = 0;
}

/* Tell the callback the queued notices, one at a time (loop thread). */
void ncfsm__boot_notice_ev_cb(evutil_socket_t fd, short what, void *arg) {
  ncfsm_boot *b = arg;
  (void)fd;
  (void)what;
  b->in_lost_cb++;
  while (b->notice_cb) {
    pthread_mutex_lock(&b->notice_mu);
    struct ncfsm__notice_node *q = b->nq_head;
    if (q) {
      b->nq_head = q->next;
      if (!b->nq_head) b->nq_tail = NULL;
      b->nq_len--;
    }
    pthread_mutex_unlock(&b->notice_mu);
    if (!q) break;
    b->notice_cb(b, &q->n, b->notice_arg);
    free(q);
  }
  b->in_lost_cb--;
}

ncfsm_result_t ncfsm_boot_on_notice(ncfsm_boot *b, ncfsm_boot_notice_cb cb, void *arg) {
  if (!b || b->magic != NCFSM__BOOT_MAGIC) return NCFSM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&b->notice_mu);
  b->notice_cb = cb;
  b->notice_arg = arg;
  int queued = b->nq_len > 0;
  pthread_mutex_unlock(&b->notice_mu);
  if (cb && queued) event_active(b->notice_ev, 0, 0);
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_boot_notice_post(ncfsm_boot *b, const ncfsm_boot_notice *n) {
  if (!b || b->magic != NCFSM__BOOT_MAGIC || !n) return NCFSM_ERR_INVALID_ARGUMENT;
  if (!b->ops->notice_post) {
    ncfsm__boot_seterr(b, "ncfsm_boot_notice_post: the %s bootstrap has no notices", b->ops->name);
    return NCFSM_ERR_UNSUPPORTED;
  }
  ncfsm_boot_notice m = *n;
  m.origin = b->rank;
  m.what[NCFSM_BOOT_NOTICE_WHAT - 1] = 0;
  return b->ops->notice_post(b, &m);
}

size_t ncfsm__notice_encode(const ncfsm_boot_notice *n, uint8_t *out) {
  size_t wl = strnlen(n->what, NCFSM_BOOT_NOTICE_WHAT - 1);
  ncfsm__wr64(out, n->key);
  ncfsm__wr32(out + 8, (uint32_t)n->origin);
  ncfsm__wr64(out + 12, n->seq);
  ncfsm__wr32(out + 20, (uint32_t)n->cause);
  memcpy(out + NCFSM__NOTICE_WIRE_MIN, n->what, wl);
  return NCFSM__NOTICE_WIRE_MIN + wl;
}

int ncfsm__notice_decode(const uint8_t *buf, size_t len, ncfsm_boot_notice *n) {
  if (len < NCFSM__NOTICE_WIRE_MIN || len > NCFSM__NOTICE_WIRE_MAX) return -1;
  memset(n, 0, sizeof *n);
  n->key = ncfsm__rd64(buf);
  n->origin = (int)ncfsm__rd32(buf + 8);
  n->seq = ncfsm__rd64(buf + 12);
  n->cause = (int32_t)ncfsm__rd32(buf + 20);
  memcpy(n->what, buf + NCFSM__NOTICE_WIRE_MIN, len - NCFSM__NOTICE_WIRE_MIN);
  return 0;
}
