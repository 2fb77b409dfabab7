/*
 * The flight recorder's ring: a fixed array of entries per communicator,
 * written by the loop's thread (fsm/recorder.h). The dumps of a snapshot are
 * written by fsm/recorder_write.c (JSON: recorder_json.c, PyTorch:
 * recorder_torch.c) and queued for the dump thread by recorder_thread.c.
 */
#include "fsm/recorder.h"

#include <stdlib.h>

#include "core/log.h"

/* ---- the ring --------------------------------------------------------------- */

ncfsm__recorder *ncfsm__rec_new(unsigned capacity) {
  if (capacity == 0) return NULL;
  ncfsm__recorder *r = calloc(1, sizeof *r + (size_t)capacity * sizeof(ncfsm__rec_entry));
  if (!r) {
    NCFSM_WARN(NCFSM__SUB_FSM,
               "flight recorder: no memory for a ring of %u entries (%zu bytes): recording is off "
               "for this communicator; use a smaller trace buffer size",
               capacity, (size_t)capacity * sizeof(ncfsm__rec_entry));
    return NULL;
  }
  r->capacity = capacity;
  return r;
}

void ncfsm__rec_free(ncfsm__recorder *r) { free(r); }

unsigned ncfsm__rec_capacity(const ncfsm__recorder *r) { return r ? r->capacity : 0; }

uint64_t ncfsm__rec_total(const ncfsm__recorder *r) { return r ? r->total : 0; }

ncfsm__rec_ref ncfsm__rec_add(ncfsm__recorder *r, const ncfsm__rec_entry *e) {
  ncfsm__rec_ref ref = NCFSM__REC_REF_NONE;
  ncfsm__rec_entry *slot = e ? ncfsm__rec_push(r, &ref) : NULL;
  if (slot) {
    *slot = *e;
    slot->id = ref;
  }
  return ref;
}

unsigned ncfsm__rec_snapshot(const ncfsm__recorder *r, ncfsm__rec_entry *out, unsigned max,
                             uint64_t *total) {
  if (total) *total = r ? r->total : 0;
  if (!r || !out || max == 0) return 0;
  uint64_t held = r->total < r->capacity ? r->total : r->capacity;
  unsigned n = held < max ? (unsigned)held : max;
  uint64_t first = r->total - n;
  for (unsigned i = 0; i < n; i++) out[i] = r->slots[(first + i) % r->capacity];
  return n;
}

