/* The public calls of a communicator's lifecycle: options, making it,
 * its getters, finalize, destroy, abort, revoke, release, its streams; and
 * the INIT step that fsm/api_init.c's calls share. The table decides each
 * call (ncfsm__check_legal); destroy, abort and revoke run on the loop's
 * thread with the lock released around the blocking NCCL call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/settings.h"
#include "fsm/api-int.h"

#define LOCK NCFSM__LOCK
#define UNLOCK NCFSM__UNLOCK
#define comm_ok ncfsm__comm_ok
#define loop_ok ncfsm__loop_ok

/* ---- options ------------------------------------------------------------------- */

/* ncfsm_comm_opts_init: core/settings_opts.c (from the settings table). */

ncfsm_result_t ncfsm_get_unique_id(ncfsm_backend_kind_t backend, ncfsm_unique_id *id) {
  if (!id) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_result_t st = ncfsm__backend_env_check(backend); /* NCFSM_BACKEND=bogus: refused, named */
  if (st != NCFSM_OK) return st;
  char why[256];
  const ncfsm__backend *be = ncfsm__backend_get(backend, why, sizeof why);
  if (!be) {
    NCFSM_WARN(NCFSM__SUB_BACKEND, "ncfsm_get_unique_id: %s", why);
    return NCFSM_ERR_UNSUPPORTED;
  }
  memset(id, 0, sizeof *id);
  return be->get_unique_id(id) == NCFSM__NCCL_SUCCESS ? NCFSM_OK : NCFSM_ERR_BACKEND;
}

/* ---- communicators ---------------------------------------------------------------- */

/* A new comm in state NEW, not yet on the loop's list. */
static ncfsm_result_t comm_make(ncfsm_loop *loop, const ncfsm_comm_opts *opts, ncfsm_comm **out) {
  ncfsm_comm *c = calloc(1, sizeof *c);
  if (!c) return NCFSM_ERR_NO_MEMORY;
  /* Options from the caller checked, or from the environment (core/settings.def). */
  ncfsm_result_t st = opts ? ncfsm__comm_opts_check(opts, "ncfsm_comm_new") : ncfsm_comm_opts_init(&c->opts);
  if (opts) c->opts = *opts;
  if (st == NCFSM_OK)
    st = c->opts.sim ? ncfsm__sim_opts_check(c->opts.sim, "ncfsm_comm_new") : ncfsm_sim_opts_init(&c->sim);
  if (st != NCFSM_OK) {
    ncfsm__loop_error(loop, "%s", ncfsm_opts_error());
    free(c);
    return st;
  }
  if (c->opts.sim) c->sim = *c->opts.sim;
  c->opts.sim = &c->sim;
  snprintf(c->name, sizeof c->name, "%s", c->opts.name ? c->opts.name : "comm");
  c->opts.name = c->name;
  snprintf(c->dump_dir, sizeof c->dump_dir, "%s", c->opts.dump_dir ? c->opts.dump_dir : "");
  c->opts.dump_dir = c->dump_dir;
  if (c->opts.trace_buffer && !(c->rec = ncfsm__rec_new(c->opts.trace_buffer))) {
    free(c);
    return NCFSM_ERR_NO_MEMORY;
  }
  char why[256];
  c->be = ncfsm__backend_get(c->opts.backend, why, sizeof why);
  ncfsm_result_t r = NCFSM_OK;
  if (!c->be) {
    ncfsm__loop_error(loop, "ncfsm_comm_new: backend %s unavailable: %s", ncfsm_backend_name(c->opts.backend), why);
    NCFSM_WARN(NCFSM__SUB_FSM, "ncfsm_comm_new: backend %s unavailable: %s", ncfsm_backend_name(c->opts.backend), why);
    r = NCFSM_ERR_UNSUPPORTED;
  } else if (c->be->stream_create(c->opts.device, &c->stream) != 0) {
    ncfsm__loop_error(loop, "ncfsm_comm_new: cannot create a stream on device %d", c->opts.device);
    r = NCFSM_ERR_BACKEND;
  }
  if (r != NCFSM_OK) {
    ncfsm__rec_free(c->rec);
    free(c);
    return r;
  }
  c->magic = NCFSM__COMM_MAGIC;
  c->created_ns = c->state_since_ns = ncfsm__now_ns();
  c->loop = loop;
  c->state = NCFSM_STATE_NEW; /* fsm/comm.def's initial state */
  c->rank = -1;
  c->refs = 1;
  c->cause = NCFSM_OK;
  c->hash = 0x6e6366736d2d6670ull; /* "ncfsm-fp" */
  *out = c;
  return NCFSM_OK;
}

static void comm_link(ncfsm_loop *loop, ncfsm_comm *c) {
  c->next = loop->comms;
  loop->comms = c;
  loop->ncomms++;
}

ncfsm_result_t ncfsm_comm_new(ncfsm_loop *loop, const ncfsm_comm_opts *opts, ncfsm_comm **out) {
  if (!out) return NCFSM_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!loop_ok(loop)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_comm *c;
  ncfsm_result_t r = comm_make(loop, opts, &c);
  if (r != NCFSM_OK) return r;
  LOCK(loop);
  comm_link(loop, c);
  UNLOCK(loop);
  *out = c;
  return NCFSM_OK;
}

ncfsm_result_t ncfsm__comm_new_locked(ncfsm_loop *loop, const ncfsm_comm_opts *opts, ncfsm_comm **out) {
  ncfsm_result_t r = comm_make(loop, opts, out);
  if (r == NCFSM_OK) comm_link(loop, *out);
  return r;
}

ncfsm_result_t ncfsm__comm_init_step(ncfsm_comm *c, ncfsm_event_t ev, ncfsm__cev *p) {
  ncfsm_result_t why;
  if (ncfsm__check_legal(c, NCFSM_CALL_INIT, &why) == NCFSM_REJECT) return why;
  if (p->nranks < 1 || p->rank < 0 || p->rank >= p->nranks || !p->id) {
    ncfsm__set_error(c, "ncfsm_comm_init: %s (nranks=%d rank=%d); pass 0 <= rank < nranks and a unique id from "
                        "ncfsm_get_unique_id",
                     !p->id ? "id is NULL" : p->nranks < 1 ? "nranks < 1" : "rank out of range", p->nranks, p->rank);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  c->p2p_send_seq = calloc((size_t)p->nranks, sizeof *c->p2p_send_seq);
  c->p2p_recv_seq = calloc((size_t)p->nranks, sizeof *c->p2p_recv_seq);
  if (!c->p2p_send_seq || !c->p2p_recv_seq) {
    free(c->p2p_send_seq);
    free(c->p2p_recv_seq);
    c->p2p_send_seq = c->p2p_recv_seq = NULL;
    return NCFSM_ERR_NO_MEMORY;
  }
  ncfsm__comm_fire(c, ev, p); /* accept_init: the loop posts the exchange or issues the init at its next turn */
  ncfsm__loop_wake(c->loop);
  return NCFSM_OK;
}

/* ---- getters -------------------------------------------------------------------------- */

ncfsm_state_t ncfsm_comm_state(const ncfsm_comm *c) {
  if (!comm_ok(c)) return NCFSM_STATE_COUNT;
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  ncfsm_state_t s = (ncfsm_state_t)c->state;
  UNLOCK(loop);
  return s;
}
#define LOCKED_GET(type, expr, bad) \
  if (!comm_ok(c)) return (bad);    \
  ncfsm_loop *loop_ = c->loop;      \
  LOCK(loop_);                      \
  type v_ = (expr);                 \
  UNLOCK(loop_);                    \
  return v_

int ncfsm_comm_rank(const ncfsm_comm *c) { LOCKED_GET(int, c->rank, -1); }
const char *ncfsm_comm_name(const ncfsm_comm *c) { return comm_ok(c) ? c->name : ""; }
int ncfsm_comm_size(const ncfsm_comm *c) { LOCKED_GET(int, c->nranks, -1); }
int ncfsm_comm_device(const ncfsm_comm *c) { return comm_ok(c) ? c->opts.device : -1; }
const char *ncfsm_comm_last_error(const ncfsm_comm *c) {
  return comm_ok(c) ? ncfsm__copy_msg(c, c->last_error) : "invalid communicator handle";
}
const char *ncfsm_comm_failure(const ncfsm_comm *c) {
  return comm_ok(c) ? ncfsm__copy_msg(c, c->failure) : "invalid communicator handle";
}
int ncfsm_comm_backend_error(const ncfsm_comm *c) { LOCKED_GET(int, c->async_code, -1); }
uint64_t ncfsm_comm_seq(const ncfsm_comm *c) { LOCKED_GET(uint64_t, c->coll_seq, 0); }
uint64_t ncfsm_comm_hash(const ncfsm_comm *c) { LOCKED_GET(uint64_t, c->hash, 0); }

/* ---- finalize, destroy, abort, revoke, release ------------------------------------------- */

ncfsm_result_t ncfsm_comm_finalize(ncfsm_comm *c) {
  if (!comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  ncfsm_result_t r = NCFSM_OK;
  if (ncfsm__check_legal(c, NCFSM_CALL_FINALIZE, &r) != NCFSM_REJECT) {
    r = NCFSM_OK;
    ncfsm__comm_fire(c, NCFSM_EV_FINALIZE, NULL); /* DRAINING: ncclCommFinalize once drained (R4) */
    ncfsm__loop_wake(loop);
  }
  UNLOCK(loop);
  return r;
}

struct comm_call {
  ncfsm_comm *c;
  ncfsm_result_t r;
};

static void do_destroy(void *arg) {
  struct comm_call *q = arg;
  ncfsm_comm *c = q->c;
  if (ncfsm__check_legal(c, NCFSM_CALL_DESTROY, &q->r) == NCFSM_REJECT) return;
  ncfsm_loop *loop = c->loop;
  ncfsm__comm_fire(c, NCFSM_EV_DESTROY, NULL); /* close_idle: CLOSING */
  void *bcomm = c->bcomm;
  c->bcomm = NULL; /* other threads see none while it is destroyed */
  c->be_calls++;
  c->refs++;
  ncfsm__loop_claim(loop);
  UNLOCK(loop);
  int rc = c->be->destroy(bcomm); /* ~500 ms on GPUs: never under the lock */
  LOCK(loop);
  ncfsm__loop_unclaim(loop);
  if (rc != NCFSM__NCCL_SUCCESS) {
    c->bcomm = bcomm; /* still there: the abort that follows needs it */
    ncfsm__cev p = {.cause = NCFSM_ERR_BACKEND, .code = rc, .what = "ncclCommDestroy", .from = c->state};
    ncfsm__comm_fire(c, NCFSM_EV_CLOSE_FAILED, &p);
    q->r = NCFSM_ERR_BACKEND;
  } else {
    ncfsm__comm_fire(c, NCFSM_EV_CLOSE_DONE, NULL); /* release_backend */
    q->r = NCFSM_OK;
  }
  ncfsm__comm_unref(c);
}

static void do_abort(void *arg) {
  struct comm_call *q = arg;
  if (ncfsm__check_legal(q->c, NCFSM_CALL_ABORT, &q->r) == NCFSM_REJECT) return;
  ncfsm__comm_abort_now(q->c); /* CLOSING, ncclCommAbort without the lock, CLOSED */
  q->r = NCFSM_OK;
}

static void do_revoke(void *arg) {
  struct comm_call *q = arg;
  ncfsm_comm *c = q->c;
  if (ncfsm__check_legal(c, NCFSM_CALL_REVOKE, &q->r) == NCFSM_REJECT) return;
  ncfsm__drain(c); /* R6: what completed before the revoke keeps its result */
  ncfsm__cev p = {.from = c->state, .result = NCFSM_OK};
  ncfsm__comm_fire(c, NCFSM_EV_REVOKE, &p); /* action revoke: ncclCommRevoke (R6) */
  q->r = p.result;
  if (q->r != NCFSM_OK)
    ncfsm__set_error(c, "ncfsm_comm_revoke: ncclCommRevoke failed (%s); the communicator is %s now: call "
                        "ncfsm_comm_abort",
                     ncfsm__nccl_result_name(c->async_code), ncfsm_state_name((ncfsm_state_t)c->state));
}

ncfsm_result_t ncfsm__comm_abort_locked(ncfsm_comm *c) {
  struct comm_call q = {c, NCFSM_OK};
  do_abort(&q);
  return q.r;
}

ncfsm_result_t ncfsm__comm_revoke_locked(ncfsm_comm *c) {
  struct comm_call q = {c, NCFSM_OK};
  do_revoke(&q);
  return q.r;
}

static ncfsm_result_t comm_call(ncfsm_comm *c, void (*fn)(void *)) {
  if (!comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  struct comm_call q = {c, NCFSM_OK};
  ncfsm__on_loop(c->loop, c, fn, &q);
  return q.r;
}

ncfsm_result_t ncfsm_comm_destroy(ncfsm_comm *c) { return comm_call(c, do_destroy); }
ncfsm_result_t ncfsm_comm_abort(ncfsm_comm *c) { return comm_call(c, do_abort); }
ncfsm_result_t ncfsm_comm_revoke(ncfsm_comm *c) { return comm_call(c, do_revoke); }

ncfsm_result_t ncfsm__comm_release_locked(ncfsm_comm *c) {
  ncfsm_result_t r = NCFSM_OK;
  if (ncfsm__check_legal(c, NCFSM_CALL_RELEASE, &r) == NCFSM_REJECT) return r;
  ncfsm__comm_fire(c, NCFSM_EV_RELEASE, NULL); /* release_handle: c may be gone now */
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_comm_release(ncfsm_comm *c) {
  if (!comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  ncfsm_result_t r = ncfsm__comm_release_locked(c);
  UNLOCK(loop);
  return r;
}

/* ---- streams -------------------------------------------------------------------------------- */

ncfsm_result_t ncfsm_stream_create(ncfsm_comm *c, void **stream) {
  if (!comm_ok(c) || !stream) return NCFSM_ERR_INVALID_ARGUMENT;
  return c->be->stream_create(c->opts.device, stream) == 0 ? NCFSM_OK : NCFSM_ERR_BACKEND;
}
ncfsm_result_t ncfsm_stream_destroy(ncfsm_comm *c, void *stream) {
  if (!comm_ok(c) || !stream) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  if (stream == c->stream) {
    ncfsm__set_error(c, "ncfsm_stream_destroy: this is the communicator's own stream (the NULL "
                        "stream argument); it goes with the communicator");
    UNLOCK(loop);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (ncfsm__stream_in_use(loop, stream)) {
    ncfsm__set_error(c, "ncfsm_stream_destroy: works that are not finished name this stream (a "
                        "submitted op is on its stream only once launched); wait for them, then "
                        "destroy it");
    UNLOCK(loop);
    return NCFSM_ERR_BUSY;
  }
  int rc = c->be->stream_destroy(stream);
  UNLOCK(loop);
  return rc == 0 ? NCFSM_OK : NCFSM_ERR_BACKEND;
}

