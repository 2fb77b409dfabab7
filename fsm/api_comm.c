/* The public calls of a communicator's lifecycle: options, making it,
 * its getters, finalize, destroy, abort, revoke, release, its streams; and
 * the INIT step that fsm/api_init.c's calls share. The table decides each
 * call (ncfsm__check_legal); destroy, abort and revoke run on the loop's
 * thread with the lock released around the blocking NCCL call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/nccl_dl.h"
#include "core/settings.h"
#include "fsm/api-int.h"

#define LOCK NCFSM__LOCK
#define UNLOCK NCFSM__UNLOCK
#define comm_ok ncfsm__comm_ok
#define loop_ok ncfsm__loop_ok

/* ---- options ------------------------------------------------------------------- */

/* ncfsm_comm_opts_init: core/settings_opts.c (from the settings table). */

/* The backend of kind, or NULL with the message of the refusal (the cause,
 * and what to do) in msg: the call's error. */
static const ncfsm__backend *backend_for(const char *call, ncfsm_backend_kind_t kind, char *msg, size_t len) {
  char why[NCFSM__NCCL_WHY_MAX];
  const ncfsm__backend *be = ncfsm__backend_get(kind, why, sizeof why);
  if (!be) /* the backend's cause says what to do where it knows; else: */
    snprintf(msg, len, "%s: the %s backend is unavailable: %s%s", call, ncfsm_backend_name(kind), why,
             strstr(why, "NCFSM_BACKEND=sim") ? ""
                                              : "; use the sim (opts.backend NCFSM_BACKEND_SIM, NCFSM_BACKEND=sim: no GPU "
                                                "needed) or auto (nccl when a GPU is usable, else the sim)");
  return be;
}

ncfsm_result_t ncfsm_get_unique_id(ncfsm_backend_kind_t backend, ncfsm_unique_id *id) {
  if (!id) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_result_t st = ncfsm__backend_env_check(backend); /* NCFSM_BACKEND=bogus: refused, named */
  if (st != NCFSM_OK) return st;
  char msg[NCFSM__NCCL_WHY_MAX + 256];
  const ncfsm__backend *be = backend_for("ncfsm_get_unique_id", backend, msg, sizeof msg);
  if (!be) {
    ncfsm__last_error_set(msg);
    NCFSM_WARN(NCFSM__SUB_BACKEND, "%s", msg);
    return NCFSM_ERR_UNSUPPORTED;
  }
  memset(id, 0, sizeof *id);
  int rc = be->get_unique_id(id);
  if (rc == NCFSM__NCCL_SUCCESS) return NCFSM_OK;
  snprintf(msg, sizeof msg, "ncfsm_get_unique_id: ncclGetUniqueId returned %s (%s backend)", ncfsm__nccl_result_name(rc),
           be->name);
  ncfsm__last_error_set(msg);
  return NCFSM_ERR_BACKEND;
}

/* ---- communicators ---------------------------------------------------------------- */

/* A new comm in state NEW, not yet on the loop's list. */
static ncfsm_result_t comm_make(ncfsm_loop *loop, const ncfsm_comm_opts *opts, ncfsm_comm **out) {
  ncfsm_comm *c = ncfsm__calloc_line(sizeof *c);
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
  char msg[NCFSM__NCCL_WHY_MAX + 256];
  c->be = backend_for("ncfsm_comm_new", c->opts.backend, msg, sizeof msg);
  ncfsm_result_t r = NCFSM_OK;
  if (!c->be) {
    ncfsm__loop_error(loop, "%s", msg);
    NCFSM_WARN(NCFSM__SUB_FSM, "%s", msg);
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

/* c joins loop's list; false (nothing changed, c freed) when the launch
 * heap has no room for it. */
static bool comm_link(ncfsm_loop *loop, ncfsm_comm *c) {
  if (!ncfsm__qheap_reserve(loop, loop->ncomms + 1)) {
    ncfsm__loop_error(loop, "ncfsm_comm_new: out of memory for the loop's launch index of %d comms", loop->ncomms + 1);
    c->be->stream_destroy(c->stream);
    ncfsm__rec_free(c->rec);
    free(c);
    return false;
  }
  c->next = loop->comms;
  c->seqno = ++loop->comm_seqno;
  loop->comms = c;
  loop->ncomms++;
  ncfsm__peers_changed(loop);
  return true;
}

ncfsm_result_t ncfsm_comm_new(ncfsm_loop *loop, const ncfsm_comm_opts *opts, ncfsm_comm **out) {
  if (!out) return NCFSM_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!loop_ok(loop)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_comm *c;
  ncfsm_result_t r = comm_make(loop, opts, &c);
  if (r != NCFSM_OK) return r;
  LOCK(loop);
  bool linked = comm_link(loop, c);
  UNLOCK(loop);
  if (!linked) return NCFSM_ERR_NO_MEMORY;
  *out = c;
  return NCFSM_OK;
}

ncfsm_result_t ncfsm__comm_new_locked(ncfsm_loop *loop, const ncfsm_comm_opts *opts, ncfsm_comm **out) {
  ncfsm_result_t r = comm_make(loop, opts, out);
  if (r == NCFSM_OK && !comm_link(loop, *out)) {
    *out = NULL;
    r = NCFSM_ERR_NO_MEMORY;
  }
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
ncfsm_result_t ncfsm_comm_position(const ncfsm_comm *c, uint64_t *next_seq, uint64_t *hash) {
  if (!comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  if (next_seq) *next_seq = c->coll_seq;
  if (hash) *hash = c->hash;
  UNLOCK(loop);
  return NCFSM_OK;
}

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
  if (ncfsm__check_legal(q->c, NCFSM_CALL_DESTROY, &q->r) == NCFSM_REJECT) return;
  q->r = ncfsm__comm_destroy_now(q->c); /* CLOSING, ncclCommDestroy without the lock, CLOSED */
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

static ncfsm_result_t comm_close_locked(ncfsm_comm *c, ncfsm_close_cb cb, void *arg) {
  ncfsm_result_t r = NCFSM_OK;
  if (ncfsm__check_legal(c, NCFSM_CALL_CLOSE, &r) == NCFSM_REJECT) return r;
  ncfsm__close *x = calloc(1, sizeof *x);
  if (!x) {
    ncfsm__set_error(c, "ncfsm_comm_close: out of memory; nothing changed");
    return NCFSM_ERR_NO_MEMORY;
  }
  x->comm = c;
  x->cb = cb;
  x->arg = arg;
  c->close = x;
  c->refs++; /* until the callback ran */
  c->loop->nclosing++;
  c->loop->ctl = c->loop->kick = true; /* the first step at the next turn (never inside this call) */
  ncfsm__loop_wake(c->loop);
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_comm_close(ncfsm_comm *c, ncfsm_close_cb cb, void *arg) {
  if (!comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  const ncfsm__recovery_ops *rops = c->close ? NULL : c->rops;
  UNLOCK(loop);
  if (rops) { /* a failure while closing must not start a recovery */
    ncfsm_result_t dr = rops->disarm(c);
    if (dr != NCFSM_OK) return dr;
  }
  LOCK(loop);
  ncfsm_result_t r = comm_close_locked(c, cb, arg);
  UNLOCK(loop);
  return r;
}

static void shutdown_done(void *arg) {
  ncfsm_loop *loop = arg;
  if (loop->shutdown_cb) loop->shutdown_cb(loop, loop->shutdown_arg);
}

ncfsm_result_t ncfsm_loop_shutdown(ncfsm_loop *loop, ncfsm_loop_cb cb, void *arg) {
  if (!ncfsm__loop_ok(loop)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm__call_req *req = calloc(1, sizeof *req);
  if (!req) return NCFSM_ERR_NO_MEMORY;
  LOCK(loop);
  if (loop->shutting) {
    ncfsm__loop_error(loop, "ncfsm_loop_shutdown: called already on this loop; its callback reports the end");
    UNLOCK(loop);
    free(req);
    return NCFSM_ERR_ILLEGAL_STATE;
  }
  *req = (ncfsm__call_req){shutdown_done, loop, NULL};
  loop->shutting = true;
  loop->shutdown_cb = cb;
  loop->shutdown_arg = arg;
  loop->shutdown_req = req;
  int n = 0;
  for (ncfsm_comm *c = loop->comms; c; c = c->next) n += !c->close && c->state != NCFSM_STATE_RELEASED;
  ncfsm_comm **cs = n ? calloc((size_t)n, sizeof *cs) : NULL;
  if (n && !cs) {
    loop->shutting = false;
    loop->shutdown_req = NULL;
    UNLOCK(loop);
    free(req);
    return NCFSM_ERR_NO_MEMORY;
  }
  n = 0;
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    if (!c->close && c->state != NCFSM_STATE_RELEASED) {
      c->refs++;
      cs[n++] = c;
    }
  UNLOCK(loop);
  ncfsm_result_t r = NCFSM_OK;
  for (int i = 0; i < n; i++) {
    ncfsm_result_t ci = ncfsm_comm_close(cs[i], NULL, NULL);
    if (ci != NCFSM_OK && r == NCFSM_OK) {
      r = ci;
      ncfsm__loop_error(loop, "ncfsm_loop_shutdown: communicator '%s' refused its close (%s): %s; the others close",
                        cs[i]->name, ncfsm_err_name(ci), ncfsm_comm_last_error(cs[i]));
    }
  }
  LOCK(loop);
  for (int i = 0; i < n; i++) ncfsm__comm_unref(cs[i]);
  ncfsm__shutdown_check(loop); /* none, or all released already */
  UNLOCK(loop);
  free(cs);
  return r;
}

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

