/*
 * Bootstrap notifications: a lost peer (ncfsm_boot_on_peer_lost's callback)
 * and the bootstrap's failure for good (ncfsm_boot_on_failed's), recorded on
 * the loop thread and delivered from the base's dispatch.
 */
#include <stdlib.h>
#include <string.h>

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
}

const char *ncfsm__boot_lost_why(const ncfsm_boot *b, int rank) {
  if (!b->lost || rank < 0 || rank >= b->size || !(b->lost[rank] & NCFSM__LOST)) return NULL;
  return b->lost_why[rank] ? b->lost_why[rank] : "lost";
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

