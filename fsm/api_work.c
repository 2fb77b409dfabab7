/* The public calls of works (state, status, fingerprint, times, waits,
 * deadlines, release), a comm's recorder dump, buffers, and the sim's
 * statistics of a comm. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/sim/sim.h"
#include "fsm/api-int.h"
#include "ncfsm/sim.h"

/* ---- works --------------------------------------------------------------------------- */

ncfsm_work_state_t ncfsm_work_state(const ncfsm_work *w) {
  if (!ncfsm__work_ok(w)) return NCFSM_WORK_STATE_COUNT;
  NCFSM__LOCK(w->comm->loop);
  ncfsm_work_state_t s = (ncfsm_work_state_t)w->state;
  NCFSM__UNLOCK(w->comm->loop);
  return s;
}

ncfsm_result_t ncfsm_work_status(const ncfsm_work *w) {
  if (!ncfsm__work_ok(w)) return NCFSM_ERR_INVALID_ARGUMENT;
  NCFSM__LOCK(w->comm->loop);
  ncfsm_result_t s = ncfsm__work_state_final((ncfsm_work_state_t)w->state) ? w->status : NCFSM_ERR_AGAIN;
  NCFSM__UNLOCK(w->comm->loop);
  return s;
}

ncfsm_result_t ncfsm_work_get_fingerprint(const ncfsm_work *w, ncfsm_fingerprint_t *out) {
  if (!ncfsm__work_ok(w) || !out) return NCFSM_ERR_INVALID_ARGUMENT;
  NCFSM__LOCK(w->comm->loop);
  *out = w->fp;
  NCFSM__UNLOCK(w->comm->loop);
  return NCFSM_OK;
}

const ncfsm_fingerprint_t *ncfsm_work_fingerprint(const ncfsm_work *w) {
  return ncfsm__work_ok(w) ? &w->fp : NULL;
}
ncfsm_comm *ncfsm_work_comm(const ncfsm_work *w) { return ncfsm__work_ok(w) ? w->comm : NULL; }

int ncfsm_work_launched(const ncfsm_work *w) {
  if (!ncfsm__work_ok(w)) return 0;
  NCFSM__LOCK(w->comm->loop);
  int l = w->t_final != 0; /* action in_flight of fsm/work.def: the launch became final */
  NCFSM__UNLOCK(w->comm->loop);
  return l;
}

unsigned ncfsm_work_evidence(const ncfsm_work *w) {
  if (!ncfsm__work_ok(w)) return 0;
  ncfsm_comm *c = w->comm;
  NCFSM__LOCK(c->loop);
  unsigned e = NCFSM_EVIDENCE_ACCEPTED;
  bool collective = w->fp.op != NCFSM_KIND_SEND && w->fp.op != NCFSM_KIND_RECV;
  if (w->t_launch) e |= NCFSM_EVIDENCE_LAUNCHED;
  if (w->t_final) e |= NCFSM_EVIDENCE_FINAL;
  if (w->state == NCFSM_WORK_COMPLETED) e |= NCFSM_EVIDENCE_COMPLETE;
  if (w->t_launch && collective && c->vops && w->fp.seq < c->vops->verified(c)) e |= NCFSM_EVIDENCE_VERIFIED;
  NCFSM__UNLOCK(c->loop);
  return e;
}

/* Final, and its callback ran: the engine's reference (held from submit to
 * the callback) is gone, only the user's remains. */
static bool work_delivered(void *arg) {
  const ncfsm_work *w = arg;
  return ncfsm__work_state_final((ncfsm_work_state_t)w->state) && w->refs == w->user_refs;
}

ncfsm_result_t ncfsm_work_wait(ncfsm_work *w, uint64_t timeout_ms) {
  if (!ncfsm__work_ok(w)) return NCFSM_ERR_INVALID_ARGUMENT;
  NCFSM__LOCK(w->comm->loop);
  bool held = w->user_refs > 0;
  NCFSM__UNLOCK(w->comm->loop);
  if (!held) return NCFSM_ERR_INVALID_USAGE; /* a released handle */
  ncfsm_result_t r = ncfsm__wait_until(w->comm->loop, work_delivered, w, timeout_ms);
  if (r == NCFSM_ERR_ILLEGAL_STATE) {
    NCFSM__LOCK(w->comm->loop);
    ncfsm__set_error(w->comm, "ncfsm_work_wait: work seq %llu is %s and nothing can progress it (is "
                              "its group still open?)",
                     (unsigned long long)w->fp.seq, ncfsm_work_state_name((ncfsm_work_state_t)w->state));
    NCFSM__UNLOCK(w->comm->loop);
    return r;
  }
  return r == NCFSM_OK ? w->status : r;
}

ncfsm_result_t ncfsm_comm_dump(ncfsm_comm *c, const char *dir) {
  if (!ncfsm__comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  NCFSM__LOCK(c->loop);
  ncfsm_result_t r = ncfsm__comm_dump(c, dir, "request");
  NCFSM__UNLOCK(c->loop);
  return r;
}

ncfsm_result_t ncfsm_work_set_timeout(ncfsm_work *w, uint64_t timeout_ms) {
  if (!ncfsm__work_ok(w)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = w->comm->loop;
  NCFSM__LOCK(loop);
  ncfsm_result_t r = NCFSM_OK;
  if (ncfsm__work_state_final((ncfsm_work_state_t)w->state)) {
    ncfsm__set_error(w->comm, "ncfsm_work_set_timeout: work seq %llu is %s already; a deadline applies "
                              "to unfinished works only",
                     (unsigned long long)w->fp.seq, ncfsm_work_state_name((ncfsm_work_state_t)w->state));
    r = NCFSM_ERR_ILLEGAL_STATE;
  } else {
    w->timeout_ms = timeout_ms;
    if (w->t_launch) /* launched: the new deadline counts from the launch too */
      w->deadline_ns = ncfsm__deadline(w->t_launch, timeout_ms ? timeout_ms : w->comm->opts.timeout_ms);
    w->comm->work_deadlines = true;
    if (w->t_launch) ncfsm__loop_wake(loop);
  }
  NCFSM__UNLOCK(loop);
  return r;
}

ncfsm_result_t ncfsm_work_release(ncfsm_work *w) {
  if (!w) return NCFSM_ERR_INVALID_ARGUMENT;
  if (w->magic == NCFSM__DEAD_MAGIC) {
    NCFSM_WARN(NCFSM__SUB_FSM, "ncfsm_work_release: the work handle %p was released already (or "
               "never returned to you); each handle is released once", (void *)w);
    return NCFSM_ERR_INVALID_USAGE;
  }
  if (!ncfsm__work_ok(w)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = w->comm->loop;
  NCFSM__LOCK(loop);
  ncfsm_result_t r = NCFSM_OK;
  if (w->user_refs == 0) {
    ncfsm__set_error(w->comm, "ncfsm_work_release: work seq %llu (%s) was released already; each "
                              "handle is released once, and not used afterwards",
                     (unsigned long long)w->fp.seq, ncfsm_work_state_name((ncfsm_work_state_t)w->state));
    r = NCFSM_ERR_INVALID_USAGE;
  } else {
    w->user_refs = 0;
    ncfsm__work_unref(w);
  }
  NCFSM__UNLOCK(loop);
  return r;
}

/* ---- sim introspection ------------------------------------------------------------------ */

ncfsm_result_t ncfsm_sim_get_stats(const ncfsm_comm *c, ncfsm_sim_stats *out) {
  if (!ncfsm__comm_ok(c) || !out) return NCFSM_ERR_INVALID_ARGUMENT;
  memset(out, 0, sizeof *out);
  NCFSM__LOCK(c->loop);
  ncfsm_result_t r = NCFSM_ERR_INVALID_ARGUMENT;
  if (c->be == &ncfsm__backend_sim && c->bcomm)
    r = ncfsm__sim_stats(c->bcomm, out) == 0 ? NCFSM_OK : NCFSM_ERR_INVALID_ARGUMENT;
  NCFSM__UNLOCK(c->loop);
  return r;
}

/* ---- buffers --------------------------------------------------------------------------- */

ncfsm_result_t ncfsm_mem_alloc(ncfsm_comm *c, size_t bytes, void **ptr) {
  if (!ncfsm__comm_ok(c) || !ptr) return NCFSM_ERR_INVALID_ARGUMENT;
  *ptr = NULL;
  if (c->be->mem_alloc)
    return c->be->mem_alloc(c->opts.device, bytes, ptr) == 0 ? NCFSM_OK : NCFSM_ERR_NO_MEMORY;
  *ptr = calloc(1, bytes ? bytes : 1);
  return *ptr ? NCFSM_OK : NCFSM_ERR_NO_MEMORY;
}

ncfsm_result_t ncfsm_mem_free(ncfsm_comm *c, void *ptr) {
  if (!ncfsm__comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  if (!ptr) return NCFSM_OK;
  if (c->be->mem_free) return c->be->mem_free(c->opts.device, ptr) == 0 ? NCFSM_OK : NCFSM_ERR_BACKEND;
  free(ptr);
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_memcpy(ncfsm_comm *c, void *dst, const void *src, size_t bytes, int to_device) {
  if (!ncfsm__comm_ok(c) || (bytes && (!dst || !src))) return NCFSM_ERR_INVALID_ARGUMENT;
  if (c->be->memcpy_sync)
    return c->be->memcpy_sync(c->opts.device, dst, src, bytes, to_device) == 0 ? NCFSM_OK
                                                                                 : NCFSM_ERR_BACKEND;
  memcpy(dst, src, bytes);
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_work_get_times(const ncfsm_work *w, ncfsm_work_times *t) {
  if (!ncfsm__work_ok(w) || !t) return NCFSM_ERR_INVALID_ARGUMENT;
  NCFSM__LOCK(w->comm->loop);
  t->submit_ns = w->t_submit;
  t->launch_ns = w->t_launch;
  t->final_ns = w->t_final;
  t->complete_ns = w->state == NCFSM_WORK_COMPLETED ? w->t_complete : 0;
  t->device_ms = w->device_ms;
  t->ready_at_final = w->mark && w->comm->opts.timing ? w->mark->ready_at_final : -1;
  NCFSM__UNLOCK(w->comm->loop);
  return NCFSM_OK;
}
