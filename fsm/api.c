/* Public communicator, group, operation and work calls: legality from the
 * table, argument checks, bookkeeping. Backend calls happen in launcher.c
 * (launches, inits, finalizes, aborts), progress.c (polls, events),
 * watchdog.c (revoke) and here (destroy). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/settings.h"
#include "fsm/internal.h"
#include "ncfsm/bootstrap.h"

#define LOCK(l) pthread_mutex_lock(&(l)->mu)
#define UNLOCK(l) pthread_mutex_unlock(&(l)->mu)

static bool comm_ok(const ncfsm_comm *c) { return c && c->magic == NCFSM__COMM_MAGIC; }
static bool loop_ok(const ncfsm_loop *l) { return l && l->magic == NCFSM__LOOP_MAGIC; }
static bool work_ok(const ncfsm_work *w) { return w && w->magic == NCFSM__WORK_MAGIC; }

static bool in_own_group(const ncfsm_loop *loop) {
  return loop->group_depth > 0 && pthread_equal(loop->group_owner, pthread_self());
}

/* Copies of per-handle strings for the calling thread: the loop thread may
 * rewrite the comm's buffer as soon as the lock is released. */
static _Thread_local char tls_msg[512];

static const char *copy_msg(const ncfsm_comm *c, const char *src) {
  LOCK(c->loop);
  snprintf(tls_msg, sizeof tls_msg, "%s", src);
  UNLOCK(c->loop);
  return tls_msg;
}

/* ---- options ------------------------------------------------------------------- */

/* ncfsm_comm_opts_init: core/settings_opts.c (from the settings table). */

ncfsm_result_t ncfsm_get_unique_id(ncfsm_backend_kind_t backend, ncfsm_unique_id *id) {
  if (!id) return NCFSM_ERR_INVALID_ARGUMENT;
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

ncfsm_result_t ncfsm_comm_new(ncfsm_loop *loop, const ncfsm_comm_opts *opts, ncfsm_comm **out) {
  if (!out) return NCFSM_ERR_INVALID_ARGUMENT;
  *out = NULL;
  if (!loop_ok(loop)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_comm *c = calloc(1, sizeof *c);
  if (!c) return NCFSM_ERR_NO_MEMORY;
  /* Options from the caller checked, or from the environment (core/settings.def). */
  ncfsm_result_t st = opts ? ncfsm__comm_opts_check(opts, "ncfsm_comm_new") : ncfsm_comm_opts_init(&c->opts);
  if (opts) c->opts = *opts;
  if (st == NCFSM_OK)
    st = c->opts.sim ? ncfsm__sim_opts_check(c->opts.sim, "ncfsm_comm_new") : ncfsm__sim_opts_fill(&c->sim);
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
  if (!c->be) {
    ncfsm__loop_error(loop, "ncfsm_comm_new: backend %s unavailable: %s",
                      ncfsm_backend_name(c->opts.backend), why);
    NCFSM_WARN(NCFSM__SUB_FSM, "ncfsm_comm_new: backend %s unavailable: %s",
               ncfsm_backend_name(c->opts.backend), why);
    free(c);
    return NCFSM_ERR_UNSUPPORTED;
  }
  if (c->be->stream_create(c->opts.device, &c->stream) != 0) {
    ncfsm__loop_error(loop, "ncfsm_comm_new: cannot create a stream on device %d", c->opts.device);
    free(c);
    return NCFSM_ERR_BACKEND;
  }
  c->magic = NCFSM__COMM_MAGIC;
  c->created_ns = c->state_since_ns = ncfsm__now_ns();
  c->loop = loop;
  c->state = NCFSM_STATE_NEW;
  c->rank = -1;
  c->refs = 1;
  c->cause = NCFSM_OK;
  c->hash = 0x6e6366736d2d6670ull; /* "ncfsm-fp" */
  LOCK(loop);
  c->next = loop->comms;
  loop->comms = c;
  loop->ncomms++;
  UNLOCK(loop);
  *out = c;
  return NCFSM_OK;
}

/* The INIT step, with loop->mu held: legality, arguments, transition. */
static ncfsm_result_t comm_init_locked(ncfsm_comm *c, int nranks, int rank, const ncfsm_unique_id *id) {
  ncfsm_result_t why;
  if (ncfsm__check_legal(c, NCFSM_CALL_INIT, &why) == NCFSM_REJECT) return why;
  if (nranks < 1 || rank < 0 || rank >= nranks || !id) {
    ncfsm__set_error(c, "ncfsm_comm_init: %s (nranks=%d rank=%d); pass 0 <= rank < nranks and a "
                        "unique id from ncfsm_get_unique_id",
                     !id ? "id is NULL" : nranks < 1 ? "nranks < 1" : "rank out of range", nranks,
                     rank);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  c->p2p_send_seq = calloc((size_t)nranks, sizeof *c->p2p_send_seq);
  c->p2p_recv_seq = calloc((size_t)nranks, sizeof *c->p2p_recv_seq);
  if (!c->p2p_send_seq || !c->p2p_recv_seq) {
    free(c->p2p_send_seq);
    free(c->p2p_recv_seq);
    c->p2p_send_seq = c->p2p_recv_seq = NULL;
    return NCFSM_ERR_NO_MEMORY;
  }
  c->nranks = nranks;
  c->rank = rank;
  c->uid = *id;
  c->comm_id = XXH3_64bits(id, sizeof *id);
  ncfsm__fire(c, NCFSM_EV_INIT, NCFSM_OK); /* act_accept_init: issued at the next turn */
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_comm_init(ncfsm_comm *c, int nranks, int rank, const ncfsm_unique_id *id) {
  if (!comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  ncfsm_result_t r;
  if (c->opts.verify != NCFSM_VERIFY_OFF && nranks > 1) {
    ncfsm__set_error(c, "ncfsm_comm_init: opts.verify is %s (NCFSM_VERIFY), which exchanges through a "
                        "bootstrap: initialise with ncfsm_comm_init_boot, or set verify off",
                     c->opts.verify == NCFSM_VERIFY_STRICT ? "strict" : "async");
    UNLOCK(loop);
    return NCFSM_ERR_INVALID_USAGE;
  }
  r = comm_init_locked(c, nranks, rank, id);
  if (r == NCFSM_OK) ncfsm__loop_wake(loop);
  UNLOCK(loop);
  return r;
}

ncfsm_result_t ncfsm_comm_init_boot(ncfsm_comm *c, struct ncfsm_boot *boot) {
  if (!comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = c->loop;
  int rank = boot ? ncfsm_boot_rank(boot) : -1, size = boot ? ncfsm_boot_size(boot) : -1;
  LOCK(loop);
  ncfsm_result_t r;
  if (ncfsm__check_legal(c, NCFSM_CALL_INIT, &r) == NCFSM_REJECT) goto out;
  r = NCFSM_ERR_INVALID_ARGUMENT;
  if (!boot || size < 1 || rank < 0 || rank >= size) {
    ncfsm__set_error(c, "ncfsm_comm_init_boot: %s (rank %d of %d); open the bootstrap with "
                        "ncfsm_boot_open on this loop's event_base first",
                     !boot ? "boot is NULL" : "the bootstrap reports an invalid rank or size", rank,
                     size);
    goto out;
  }
  /* Only after the legality check: the roots (rank 0, or opts.init_roots
   * ranks spread over the job) make the ids the others receive by broadcast
   * (O(n) bytes through the bootstrap; docs/bootstrap.md). */
  int nroots = c->opts.init_roots < 1 ? 1 : c->opts.init_roots > size ? size : c->opts.init_roots;
  char *buf = calloc((size_t)nroots, NCFSM_UNIQUE_ID_BYTES);
  if (!buf) {
    r = NCFSM_ERR_NO_MEMORY;
    goto out;
  }
  for (int j = 0; j < nroots; j++)
    if (ncfsm_boot_root_of(size, nroots, j) == rank &&
        ncfsm_get_unique_id(c->opts.backend, (ncfsm_unique_id *)(buf + (size_t)j * NCFSM_UNIQUE_ID_BYTES)) != NCFSM_OK) {
      ncfsm__set_error(c, "ncfsm_comm_init_boot: the %s backend could not make a unique id", c->be->name);
      free(buf);
      r = NCFSM_ERR_BACKEND;
      goto out;
    }
  ncfsm_unique_id id;
  memcpy(&id, buf, sizeof id); /* rank 0's (root 0's) once the broadcast is done */
  /* INIT and the pending exchange under one lock: the loop thread posts the
   * exchange at its next turn (the bootstrap is driven by its base's thread). */
  r = comm_init_locked(c, size, rank, &id);
  if (r == NCFSM_OK) {
    c->boot = boot;
    if (c->opts.verify != NCFSM_VERIFY_OFF && size > 1) c->vboot = boot;
    if (c->opts.verify == NCFSM_VERIFY_STRICT && c->opts.verify_channel == NCFSM_VERIFY_CHANNEL_NCCL && size > 1 &&
        ncfsm__comp_new(c) != NCFSM_OK) {
      /* nothing is posted yet: the comm fails at its first poll (snomem) */
      c->snomem = true;
    }
    c->uid_buf = buf;
    c->nroots = nroots;
    ncfsm__loop_wake(loop);
  } else {
    free(buf);
  }
out:
  UNLOCK(loop);
  return r;
}

ncfsm_result_t ncfsm_comm_init_all(ncfsm_loop *loop, int n, const ncfsm_comm_opts *opts,
                                   const int *devices, ncfsm_comm **comms) {
  if (!loop_ok(loop) || n < 1 || !comms) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_comm_opts o;
  ncfsm_result_t r;
  if (opts) o = *opts;
  else if ((r = ncfsm_comm_opts_init(&o)) != NCFSM_OK) {
    ncfsm__loop_error(loop, "%s", ncfsm_opts_error());
    return r;
  }
  ncfsm_unique_id id;
  r = ncfsm_get_unique_id(o.backend, &id);
  if (r != NCFSM_OK) return r;
  int i;
  for (i = 0; i < n; i++) {
    comms[i] = NULL;
    o.device = devices ? devices[i] : (opts ? opts->device : 0);
    if ((r = ncfsm_comm_new(loop, &o, &comms[i])) != NCFSM_OK) break;
    if ((r = ncfsm_comm_init(comms[i], n, i, &id)) != NCFSM_OK) break;
  }
  if (r != NCFSM_OK) {
    for (int j = 0; j <= i && j < n; j++)
      if (comms[j]) {
        ncfsm_comm_abort(comms[j]);
        ncfsm_comm_release(comms[j]);
        comms[j] = NULL;
      }
  }
  return r;
}

ncfsm_state_t ncfsm_comm_state(const ncfsm_comm *c) {
  if (!comm_ok(c)) return NCFSM_STATE_COUNT;
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  ncfsm_state_t s = c->state;
  UNLOCK(loop);
  return s;
}
#define LOCKED_GET(type, expr, bad)           \
  if (!comm_ok(c)) return (bad);              \
  ncfsm_loop *loop_ = c->loop;                \
  LOCK(loop_);                                \
  type v_ = (expr);                           \
  UNLOCK(loop_);                              \
  return v_

int ncfsm_comm_rank(const ncfsm_comm *c) { LOCKED_GET(int, c->rank, -1); }
const char *ncfsm_comm_name(const ncfsm_comm *c) { return comm_ok(c) ? c->name : ""; }
int ncfsm_comm_size(const ncfsm_comm *c) { LOCKED_GET(int, c->nranks, -1); }
int ncfsm_comm_device(const ncfsm_comm *c) { return comm_ok(c) ? c->opts.device : -1; }
const char *ncfsm_comm_last_error(const ncfsm_comm *c) {
  return comm_ok(c) ? copy_msg(c, c->last_error) : "invalid communicator handle";
}
const char *ncfsm_comm_failure(const ncfsm_comm *c) {
  return comm_ok(c) ? copy_msg(c, c->failure) : "invalid communicator handle";
}
int ncfsm_comm_backend_error(const ncfsm_comm *c) { LOCKED_GET(int, c->async_code, -1); }
uint64_t ncfsm_comm_seq(const ncfsm_comm *c) { LOCKED_GET(uint64_t, c->coll_seq, 0); }
uint64_t ncfsm_comm_hash(const ncfsm_comm *c) { LOCKED_GET(uint64_t, c->hash, 0); }

/* Can the comm get from state from to state to: through any events, or
 * (loop_only) through the loop's own events, with no further call? */
static bool reachable(ncfsm_state_t from, ncfsm_state_t to, bool loop_only) {
  bool seen[NCFSM_STATE_COUNT] = {false};
  ncfsm_state_t stack[NCFSM_STATE_COUNT];
  int n = 0;
  stack[n++] = from;
  seen[from] = true;
  while (n) {
    ncfsm_state_t s = stack[--n];
    if (s == to) return true;
    for (int e = 0; e < NCFSM_EVENT_COUNT; e++) {
      if (loop_only && ncfsm_event_is_call((ncfsm_event_t)e)) continue;
      ncfsm_transition_row rows[4];
      int k = ncfsm_transition_rows(s, (ncfsm_event_t)e, rows, 4);
      for (int i = 0; i < k && i < 4; i++)
        if (!seen[rows[i].next]) {
          seen[rows[i].next] = true;
          stack[n++] = rows[i].next;
        }
    }
  }
  return false;
}

/* The calls legal in state s, for messages: "ncfsm_comm_abort, ncfsm_comm_revoke". */
static void legal_calls(ncfsm_state_t s, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int k = 0; k < NCFSM_CALL_COUNT && o < len; k++) {
    if (ncfsm_legality(s, (ncfsm_call_t)k, NULL, NULL) == NCFSM_REJECT) continue;
    int w = snprintf(buf + o, len - o, "%s%s", o ? ", " : "", ncfsm__call_fn((ncfsm_call_t)k));
    if (w < 0) break;
    o += (size_t)w;
  }
  if (!buf[0]) snprintf(buf, len, "none");
}

/* Block the caller until pred(arg) holds (under the lock), running the loop
 * if no other thread does. Returns OK, ERR_AGAIN (the wait's own timeout)
 * or ERR_ILLEGAL_STATE (nothing pending can make progress: a deadlock the
 * caller made). */
static ncfsm_result_t wait_until(ncfsm_loop *loop, bool (*pred)(void *), void *arg,
                                 uint64_t timeout_ms) {
  uint64_t deadline = ncfsm__deadline(ncfsm__now_ns(), timeout_ms);
  LOCK(loop);
  if (ncfsm__loop_in_turn(loop) && !pred(arg)) {
    UNLOCK(loop);
    ncfsm__loop_error(loop, "a blocking wait was called from inside one of the loop's callbacks (a "
                            "work or state callback may not wait on its own loop; submit and return "
                            "instead)");
    return NCFSM_ERR_INVALID_USAGE;
  }
  for (;;) {
    if (pred(arg)) { UNLOCK(loop); return NCFSM_OK; }
    if (deadline && ncfsm__now_ns() > deadline) { UNLOCK(loop); return NCFSM_ERR_AGAIN; }
    if (ncfsm__loop_can_drive(loop)) {
      bool pending = ncfsm__loop_pending(loop);
      UNLOCK(loop);
      if (!pending) return NCFSM_ERR_ILLEGAL_STATE;
      ncfsm_result_t rr = ncfsm_loop_run(loop, NCFSM_RUN_ONCE);
      if (rr != NCFSM_OK) return rr; /* e.g. waiting inside one of the loop's callbacks */
      LOCK(loop);
    } else {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 1000000;
      if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
      pthread_cond_timedwait(&loop->cv, &loop->mu, &ts);
    }
  }
}

struct state_wait { ncfsm_comm *c; ncfsm_state_t s; bool unreachable; };
static bool state_reached(void *arg) {
  struct state_wait *sw = arg;
  if (sw->c->state == sw->s) return true;
  /* A state the comm cannot reach even with calls ends the wait at once;
   * one that needs a call (ncfsm_group_end, ncfsm_comm_revoke...) is waited
   * for while something is pending: another thread may make that call. */
  if (!reachable(sw->c->state, sw->s, false)) {
    sw->unreachable = true;
    return true;
  }
  return false;
}

ncfsm_result_t ncfsm_comm_wait_state(ncfsm_comm *c, ncfsm_state_t s, uint64_t timeout_ms) {
  if (!comm_ok(c) || (unsigned)s >= NCFSM_STATE_COUNT) return NCFSM_ERR_INVALID_ARGUMENT;
  struct state_wait sw = {c, s, false};
  ncfsm_result_t r = wait_until(c->loop, state_reached, &sw, timeout_ms);
  if (r != NCFSM_OK && r != NCFSM_ERR_ILLEGAL_STATE) return r;
  if (r == NCFSM_OK && !sw.unreachable) return NCFSM_OK;
  LOCK(c->loop);
  char calls[256];
  legal_calls(c->state, calls, sizeof calls);
  /* The comm's failure stays readable through ncfsm_comm_failure; it is
   * repeated here so that this message alone says what happened. */
  ncfsm__set_error(c, "ncfsm_comm_wait_state: waiting for %s in state %s: %s; calls legal now: %s%s%s",
                   ncfsm_state_name(s), ncfsm_state_name(c->state),
                   sw.unreachable ? "it cannot be reached from here"
                   : reachable(c->state, s, true) ? "nothing is pending that could move the communicator on"
                                                  : "only a call can move the communicator on",
                   calls, c->failure[0] ? "; failure: " : "", c->failure);
  UNLOCK(c->loop);
  return NCFSM_ERR_ILLEGAL_STATE;
}

ncfsm_result_t ncfsm_comm_finalize(ncfsm_comm *c) {
  if (!comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  ncfsm_result_t r = NCFSM_OK;
  if (ncfsm__check_legal(c, NCFSM_CALL_FINALIZE, &r) != NCFSM_REJECT) {
    r = NCFSM_OK;
    ncfsm__fire(c, NCFSM_EV_FINALIZE, NCFSM_OK); /* act_drain_then_finalize (R4) */
    ncfsm__loop_wake(loop);
  }
  UNLOCK(loop);
  return r;
}

/* Destroy and abort make blocking backend calls; they run inline when the
 * caller may drive the loop, else on the loop thread while the caller waits.
 * Either way the loop's lock is released during the backend call. */
struct sync_call {
  ncfsm_comm *c;
  ncfsm_result_t (*fn)(ncfsm_comm *);
  ncfsm_result_t r;
  bool done;
};

static void sync_tramp(void *arg) {
  struct sync_call *s = arg;
  ncfsm_loop *loop = s->c->loop;
  LOCK(loop);
  s->r = s->fn(s->c);
  s->done = true;
  ncfsm__loop_flush_notes(loop);
  pthread_cond_broadcast(&loop->cv);
  UNLOCK(loop);
}

static bool sync_done(void *arg) { return ((struct sync_call *)arg)->done; }

static ncfsm_result_t on_loop(ncfsm_comm *c, ncfsm_result_t (*fn)(ncfsm_comm *)) {
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  if (ncfsm__loop_can_drive(loop)) {
    ncfsm_result_t r = fn(c);
    ncfsm__loop_wake(loop); /* deliver the callbacks this produced */
    UNLOCK(loop);
    return r;
  }
  UNLOCK(loop);
  struct sync_call s = {c, fn, NCFSM_OK, false};
  c->refs++; /* the handle stays valid until the loop ran fn */
  ncfsm_result_t r = ncfsm_loop_call(loop, sync_tramp, &s);
  if (r == NCFSM_OK) wait_until(loop, sync_done, &s, 0);
  LOCK(loop);
  ncfsm__comm_unref(c);
  UNLOCK(loop);
  return r == NCFSM_OK ? s.r : r;
}

static ncfsm_result_t do_destroy(ncfsm_comm *c) {
  ncfsm_result_t r;
  if (ncfsm__check_legal(c, NCFSM_CALL_DESTROY, &r) == NCFSM_REJECT) return r;
  ncfsm_loop *loop = c->loop;
  ncfsm__fire(c, NCFSM_EV_DESTROY, NCFSM_OK); /* act_close_idle: CLOSING */
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
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, rc, "ncclCommDestroy");
    ncfsm__comm_unref(c);
    return NCFSM_ERR_BACKEND;
  }
  ncfsm__fire(c, NCFSM_EV_CLOSE_DONE, NCFSM_OK); /* act_release_backend */
  ncfsm__comm_unref(c);
  return NCFSM_OK;
}

static ncfsm_result_t do_abort(ncfsm_comm *c) {
  ncfsm_result_t r;
  if (ncfsm__check_legal(c, NCFSM_CALL_ABORT, &r) == NCFSM_REJECT) return r;
  ncfsm__comm_abort_now(c); /* CLOSING, ncclCommAbort without the lock, CLOSED */
  return NCFSM_OK;
}

static ncfsm_result_t do_revoke(ncfsm_comm *c) {
  ncfsm_result_t r;
  if (ncfsm__check_legal(c, NCFSM_CALL_REVOKE, &r) == NCFSM_REJECT) return r;
  return ncfsm__comm_revoke_now(c);
}

ncfsm_result_t ncfsm_comm_destroy(ncfsm_comm *c) {
  return comm_ok(c) ? on_loop(c, do_destroy) : NCFSM_ERR_INVALID_ARGUMENT;
}
ncfsm_result_t ncfsm_comm_abort(ncfsm_comm *c) {
  return comm_ok(c) ? on_loop(c, do_abort) : NCFSM_ERR_INVALID_ARGUMENT;
}
ncfsm_result_t ncfsm_comm_revoke(ncfsm_comm *c) {
  return comm_ok(c) ? on_loop(c, do_revoke) : NCFSM_ERR_INVALID_ARGUMENT;
}

ncfsm_result_t ncfsm_comm_release(ncfsm_comm *c) {
  if (!comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  ncfsm_result_t r = NCFSM_OK;
  if (c->released) {
    ncfsm__set_error(c, "ncfsm_comm_release: the handle was released already");
    r = NCFSM_ERR_INVALID_USAGE;
  } else if (ncfsm__check_legal(c, NCFSM_CALL_RELEASE, &r) != NCFSM_REJECT) {
    /* The handle is dead for the user; memory goes with the last reference. */
    r = NCFSM_OK;
    c->released = true;
    ncfsm__comm_unref(c);
  }
  UNLOCK(loop);
  return r;
}

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

/* ---- groups (R3) ---------------------------------------------------------------- */

ncfsm_result_t ncfsm_group_start(ncfsm_loop *loop) {
  if (!loop_ok(loop)) return NCFSM_ERR_INVALID_ARGUMENT;
  LOCK(loop);
  if (loop->group_depth > 0 && !pthread_equal(loop->group_owner, pthread_self())) {
    ncfsm__loop_error(loop, "ncfsm_group_start: a group is open on another thread (R3: groups are "
                     "thread-local); only the thread that opened it may nest or end it");
    UNLOCK(loop);
    return NCFSM_ERR_WRONG_THREAD;
  }
  if (loop->group_depth++ == 0) {
    loop->group_owner = pthread_self();
    loop->group_err = NCFSM_OK;
  }
  UNLOCK(loop);
  return NCFSM_OK;
}

int ncfsm_group_depth(ncfsm_loop *loop) {
  if (!loop_ok(loop)) return -1;
  LOCK(loop);
  int d = loop->group_depth;
  UNLOCK(loop);
  return d;
}

static void describe_op(const ncfsm_work *w, char *buf, size_t len) {
  snprintf(buf, len, "%s(rank %d, send %p, recv %p, count %zu)", ncfsm_opkind_name(w->op.kind),
           w->comm->rank, w->op.send, (void *)w->op.recv, w->op.count);
}

static bool mixed_blocking(const ncfsm_work *works) {
  for (const ncfsm_work *w = works->bnext; w; w = w->bnext)
    if (w->comm->opts.blocking != works->comm->opts.blocking || w->comm->be != works->comm->be)
      return true;
  return false;
}

ncfsm_result_t ncfsm_group_end(ncfsm_loop *loop) {
  if (!loop_ok(loop)) return NCFSM_ERR_INVALID_ARGUMENT;
  LOCK(loop);
  if (loop->group_depth == 0) {
    ncfsm__loop_error(loop, "ncfsm_group_end: not in a group (R3: ncclGroupEnd at depth 0 returns "
                     "ncclInvalidUsage); balance every ncfsm_group_start with one ncfsm_group_end");
    UNLOCK(loop);
    return NCFSM_ERR_INVALID_USAGE;
  }
  if (!pthread_equal(loop->group_owner, pthread_self())) {
    ncfsm__loop_error(loop, "ncfsm_group_end: the group was opened by another thread (R3: a group opened on "
                     "thread A cannot be closed on thread B); end it on the thread that started it");
    UNLOCK(loop);
    return NCFSM_ERR_WRONG_THREAD;
  }
  if (--loop->group_depth > 0) { /* R3: only the outermost end launches */
    UNLOCK(loop);
    return NCFSM_OK;
  }
  ncfsm_work *works = loop->group_head;
  loop->group_head = loop->group_tail = NULL;
  ncfsm_result_t err = loop->group_err;
  loop->group_err = NCFSM_OK;
  if (err != NCFSM_OK) {
    ncfsm__loop_error(loop, "ncfsm_group_end: the group failed: an earlier call in it returned %s (R3); its "
                     "other works fail with NCFSM_ERR_GROUP and nothing reached the backend",
               ncfsm_err_name(err));
  } else if (works && mixed_blocking(works)) {
    err = NCFSM_ERR_INVALID_USAGE;
    ncfsm__loop_error(loop, "ncfsm_group_end: the group mixes blocking and nonblocking communicators (R3: "
                     "NCCL refuses or mis-runs such a group); put them in separate groups");
  } else if (works && loop->opts.overlap != NCFSM_OVERLAP_OFF) {
    ncfsm_work *x, *y;
    if (ncfsm__find_overlap(works, &x, &y)) {
      char a[160], b[160];
      describe_op(x, a, sizeof a);
      describe_op(y, b, sizeof b);
      if (loop->opts.overlap == NCFSM_OVERLAP_REJECT) {
        err = NCFSM_ERR_OVERLAP;
        ncfsm__loop_error(loop, "ncfsm_group_end: %s and %s overlap where one writes; NCCL runs the ops of "
                         "one group in any order (R12); issue them in separate groups",
                   a, b);
      } else {
        NCFSM_WARN(NCFSM__SUB_FSM, "group ops %s and %s overlap where one writes (R12)", a, b);
      }
    }
  }
  int nw = 0;
  for (ncfsm_work *w = works; w; w = w->bnext) nw++;
  ncfsm__batch *batch = NULL;
  if (err == NCFSM_OK && works) {
    batch = calloc(1, sizeof *batch + (size_t)nw * sizeof(ncfsm__blink));
    if (!batch) {
      err = NCFSM_ERR_NO_MEMORY;
      ncfsm__loop_error(loop, "ncfsm_group_end: out of memory for the group's batch; its works fail");
    } else {
      batch->explicit_group = true;
      batch->links = (ncfsm__blink *)(batch + 1);
    }
  }
  for (ncfsm_work *w = works, *next; w; w = next) {
    next = w->bnext;
    w->bnext = NULL;
    ncfsm_comm *c = w->comm;
    if (c->ngroup) { /* the first of c's works: c's ops leave the group */
      c->ngroup = 0;
      if (batch) batch->links[batch->nlinks++].c = c;
      ncfsm__fire(c, NCFSM_EV_GROUP_CLOSE, err); /* act_queue_group */
    }
    if (err != NCFSM_OK) {
      ncfsm__work_finish(w, NCFSM_WORK_FAILED, err == NCFSM_ERR_OVERLAP ? err : NCFSM_ERR_GROUP);
      continue;
    }
    w->batch = batch;
    if (batch->tail) batch->tail->bnext = w;
    else batch->head = w;
    batch->tail = w;
    batch->nworks++;
  }
  if (batch) ncfsm__batch_queue(loop, batch);
  if (works) ncfsm__loop_wake(loop);
  UNLOCK(loop);
  return err;
}

/* ---- operations -------------------------------------------------------------------- */

static bool op_reduces(ncfsm_opkind_t k) {
  return k == NCFSM_KIND_ALLREDUCE || k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_REDUCESCATTER;
}
static bool op_rooted(ncfsm_opkind_t k) {
  return k == NCFSM_KIND_BROADCAST || k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_GATHER ||
         k == NCFSM_KIND_SCATTER;
}

/* Argument checks before the backend (R3: an argument error reaching a
 * nonblocking NCCL communicator poisons it for good). */
static ncfsm_result_t validate(ncfsm_comm *c, ncfsm_call_t call, const ncfsm__op *o) {
  const char *fn = ncfsm__call_fn(call);
  if ((unsigned)o->dtype >= NCFSM_DTYPE_COUNT) {
    ncfsm__set_error(c, "%s: argument datatype: unknown dtype %d (valid: 0..%d, ncfsm_dtype_t)", fn,
                     (int)o->dtype, NCFSM_DTYPE_COUNT - 1);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (op_reduces(o->kind) && (unsigned)o->redop >= NCFSM_REDOP_COUNT) {
    ncfsm__set_error(c, "%s: argument op: unknown reduction operator %d (valid: 0..%d, ncfsm_redop_t)",
                     fn, (int)o->redop, NCFSM_REDOP_COUNT - 1);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  size_t multk = (o->kind == NCFSM_KIND_ALLGATHER || o->kind == NCFSM_KIND_REDUCESCATTER ||
                  o->kind == NCFSM_KIND_ALLTOALL || o->kind == NCFSM_KIND_GATHER ||
                  o->kind == NCFSM_KIND_SCATTER);
  if (c->nranks <= 0 && (op_rooted(o->kind) || multk || o->kind == NCFSM_KIND_SEND || o->kind == NCFSM_KIND_RECV)) {
    ncfsm__set_error(c, "%s: this comm is the child of a split whose rank and size NCCL tells only once its "
                        "init is done (state %s): submit rooted, point-to-point and per-rank-sized ops once it "
                        "is READY (ncfsm_comm_wait_state)",
                     fn, ncfsm_state_name(c->state));
    return NCFSM_ERR_ILLEGAL_STATE;
  }
  if (op_rooted(o->kind) && (o->root < 0 || o->root >= c->nranks)) {
    ncfsm__set_error(c, "%s: argument root: %d is out of range (the communicator has %d ranks: 0..%d)",
                     fn, o->root, c->nranks, c->nranks - 1);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if ((o->kind == NCFSM_KIND_SEND || o->kind == NCFSM_KIND_RECV) &&
      (o->peer < 0 || o->peer >= c->nranks)) {
    ncfsm__set_error(c, "%s: argument peer: %d is out of range (the communicator has %d ranks: 0..%d)",
                     fn, o->peer, c->nranks, c->nranks - 1);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  size_t bytes, total;
  size_t mult = (o->kind == NCFSM_KIND_ALLGATHER || o->kind == NCFSM_KIND_REDUCESCATTER ||
                 o->kind == NCFSM_KIND_ALLTOALL || o->kind == NCFSM_KIND_GATHER ||
                 o->kind == NCFSM_KIND_SCATTER)
                    ? (size_t)c->nranks
                    : 1;
  if (__builtin_mul_overflow(o->count, ncfsm_dtype_size(o->dtype), &bytes) ||
      __builtin_mul_overflow(bytes, mult, &total) || total > (size_t)PTRDIFF_MAX) {
    ncfsm__set_error(c, "%s: argument count: %zu elements of %s%s overflow the address space", fn,
                     o->count, ncfsm_dtype_name(o->dtype), mult > 1 ? " times nranks" : "");
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (o->count > 0) {
    bool root = c->rank == o->root;
    bool need_send, need_recv;
    switch (o->kind) {
      case NCFSM_KIND_BROADCAST: need_send = root; need_recv = true; break;
      case NCFSM_KIND_REDUCE: need_send = true; need_recv = root; break;
      case NCFSM_KIND_GATHER: need_send = true; need_recv = root; break;
      case NCFSM_KIND_SCATTER: need_send = root; need_recv = true; break;
      case NCFSM_KIND_SEND: need_send = true; need_recv = false; break;
      case NCFSM_KIND_RECV: need_send = false; need_recv = true; break;
      default: need_send = need_recv = true; break;
    }
    if ((need_send && !o->send) || (need_recv && !o->recv)) {
      ncfsm__set_error(c, "%s: argument %s: NULL buffer with count %zu", fn,
                       need_send && !o->send ? "sendbuff" : "recvbuff", o->count);
      return NCFSM_ERR_INVALID_ARGUMENT;
    }
  }
  int dev = -1;
  if (o->stream && c->be->stream_device(o->stream, &dev) == 0 && dev >= 0 && dev != c->opts.device) {
    ncfsm__set_error(c, "%s: argument stream: the stream belongs to device %d, the communicator to "
                        "device %d",
                     fn, dev, c->opts.device);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  return NCFSM_OK;
}

static ncfsm_result_t submit(ncfsm_comm *c, ncfsm_call_t call, ncfsm__op *o, ncfsm_work_cb cb,
                             void *arg, ncfsm_work **out) {
  if (out) *out = NULL;
  if (!comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = c->loop;
  LOCK(loop);
  bool in_group = in_own_group(loop);
  ncfsm_result_t r = NCFSM_OK;
  if (ncfsm__check_legal(c, call, &r) == NCFSM_REJECT) { /* guard GROUP_THREAD too (R3, R9) */
    UNLOCK(loop);
    return r;
  }
  r = validate(c, call, o);
  ncfsm_work *w = NULL;
  if (r == NCFSM_OK && !(w = ncfsm__work_alloc(loop))) r = NCFSM_ERR_NO_MEMORY;
  if (r != NCFSM_OK) {
    ncfsm__group_note_error(c, r);
    UNLOCK(loop);
    return r;
  }
  if (!o->stream) o->stream = c->stream;
  w->magic = NCFSM__WORK_MAGIC;
  w->comm = c;
  w->op = *o;
  ncfsm__work_spans(w);
  w->cb = cb;
  w->arg = arg;
  w->status = NCFSM_ERR_AGAIN;
  w->state = NCFSM_WORK_QUEUED;
  w->t_submit = ncfsm__now_ns();
  w->refs = out ? 2 : 1;
  w->user_held = out != NULL;
  w->device_ms = -1;
  c->refs++;
  bool p2p = o->kind == NCFSM_KIND_SEND || o->kind == NCFSM_KIND_RECV;
  /* The seq is taken at launch (launcher.c): a work refused, dropped with a
   * failed group or failed before launch takes none, so the ranks' numbers
   * stay equal when a group fails on one rank only (R11). */
  w->fp = (ncfsm_fingerprint_t){
      .seq = NCFSM_SEQ_NONE,
      .op = (int32_t)o->kind,
      .dtype = (int32_t)o->dtype,
      .count = o->count,
      .root = op_rooted(o->kind) ? o->root : -1,
      .redop = op_reduces(o->kind) ? (int32_t)o->redop : -1,
      .peer = p2p ? o->peer : -1,
  };
  ncfsm__rec_entry re = {.fp = w->fp, .state = NCFSM_WORK_QUEUED, .result = NCFSM_ERR_AGAIN,
                        .stream = (uint64_t)(uintptr_t)o->stream, .t_submit_ns = w->t_submit};
  w->rec = ncfsm__rec_add(c->rec, &re);
  if (loop->trace) {
    ncfsm_trace_rec rec = {NCFSM_OBJ_WORK, w, c->rank, w->fp.seq, -1, -1, NCFSM_WORK_QUEUED, NCFSM_OK,
                           w->t_submit};
    loop->trace(&rec, loop->trace_arg);
  }
  if (in_group) {
    w->bnext = NULL;
    if (loop->group_tail) loop->group_tail->bnext = w;
    else loop->group_head = w;
    loop->group_tail = w;
    c->ngroup++;
    ncfsm__fire(c, NCFSM_EV_ENLIST, NCFSM_OK); /* act_collect_in_group (R3) */
  } else {
    ncfsm__batch *b = &w->single;
    b->head = b->tail = w;
    b->nworks = 1;
    b->explicit_group = false;
    b->nlinks = 1;
    b->links = &w->single_link;
    w->single_link.c = c;
    w->batch = b;
    ncfsm__batch_queue(loop, b);
    ncfsm__loop_wake(loop);
  }
  if (out) *out = w;
  UNLOCK(loop);
  return NCFSM_OK;
}

#define OP(kind_, send_, recv_, count_, dt_, redop_, root_, peer_, stream_)                         \
  ncfsm__op o = {.kind = NCFSM_KIND_##kind_, .send = (send_), .recv = (recv_), .count = (count_),   \
                 .dtype = (dt_), .redop = (redop_), .root = (root_), .peer = (peer_),              \
                 .stream = (stream_)};                                                              \
  return submit(c, NCFSM_CALL_##kind_, &o, cb, arg, out)

ncfsm_result_t ncfsm_allreduce(ncfsm_comm *c, const void *send, void *recv, size_t count,
                               ncfsm_dtype_t dt, ncfsm_redop_t op, void *stream, ncfsm_work_cb cb,
                               void *arg, ncfsm_work **out) {
  OP(ALLREDUCE, send, recv, count, dt, op, -1, -1, stream);
}
ncfsm_result_t ncfsm_broadcast(ncfsm_comm *c, const void *send, void *recv, size_t count,
                               ncfsm_dtype_t dt, int root, void *stream, ncfsm_work_cb cb, void *arg,
                               ncfsm_work **out) {
  OP(BROADCAST, send, recv, count, dt, NCFSM_OP_SUM, root, -1, stream);
}
ncfsm_result_t ncfsm_reduce(ncfsm_comm *c, const void *send, void *recv, size_t count,
                            ncfsm_dtype_t dt, ncfsm_redop_t op, int root, void *stream,
                            ncfsm_work_cb cb, void *arg, ncfsm_work **out) {
  OP(REDUCE, send, recv, count, dt, op, root, -1, stream);
}
ncfsm_result_t ncfsm_allgather(ncfsm_comm *c, const void *send, void *recv, size_t sendcount,
                               ncfsm_dtype_t dt, void *stream, ncfsm_work_cb cb, void *arg,
                               ncfsm_work **out) {
  OP(ALLGATHER, send, recv, sendcount, dt, NCFSM_OP_SUM, -1, -1, stream);
}
ncfsm_result_t ncfsm_reducescatter(ncfsm_comm *c, const void *send, void *recv, size_t recvcount,
                                   ncfsm_dtype_t dt, ncfsm_redop_t op, void *stream,
                                   ncfsm_work_cb cb, void *arg, ncfsm_work **out) {
  OP(REDUCESCATTER, send, recv, recvcount, dt, op, -1, -1, stream);
}
ncfsm_result_t ncfsm_alltoall(ncfsm_comm *c, const void *send, void *recv, size_t count,
                              ncfsm_dtype_t dt, void *stream, ncfsm_work_cb cb, void *arg,
                              ncfsm_work **out) {
  OP(ALLTOALL, send, recv, count, dt, NCFSM_OP_SUM, -1, -1, stream);
}
ncfsm_result_t ncfsm_gather(ncfsm_comm *c, const void *send, void *recv, size_t count,
                            ncfsm_dtype_t dt, int root, void *stream, ncfsm_work_cb cb, void *arg,
                            ncfsm_work **out) {
  OP(GATHER, send, recv, count, dt, NCFSM_OP_SUM, root, -1, stream);
}
ncfsm_result_t ncfsm_scatter(ncfsm_comm *c, const void *send, void *recv, size_t count,
                             ncfsm_dtype_t dt, int root, void *stream, ncfsm_work_cb cb, void *arg,
                             ncfsm_work **out) {
  OP(SCATTER, send, recv, count, dt, NCFSM_OP_SUM, root, -1, stream);
}
ncfsm_result_t ncfsm_send(ncfsm_comm *c, const void *send, size_t count, ncfsm_dtype_t dt, int peer,
                          void *stream, ncfsm_work_cb cb, void *arg, ncfsm_work **out) {
  OP(SEND, send, NULL, count, dt, NCFSM_OP_SUM, -1, peer, stream);
}
ncfsm_result_t ncfsm_recv(ncfsm_comm *c, void *recv, size_t count, ncfsm_dtype_t dt, int peer,
                          void *stream, ncfsm_work_cb cb, void *arg, ncfsm_work **out) {
  OP(RECV, NULL, recv, count, dt, NCFSM_OP_SUM, -1, peer, stream);
}

/* ---- works --------------------------------------------------------------------------- */

ncfsm_work_state_t ncfsm_work_state(const ncfsm_work *w) {
  if (!work_ok(w)) return NCFSM_WORK_STATE_COUNT;
  LOCK(w->comm->loop);
  ncfsm_work_state_t s = w->state;
  UNLOCK(w->comm->loop);
  return s;
}

ncfsm_result_t ncfsm_work_status(const ncfsm_work *w) {
  if (!work_ok(w)) return NCFSM_ERR_INVALID_ARGUMENT;
  LOCK(w->comm->loop);
  ncfsm_result_t s = w->delivered ? w->status : NCFSM_ERR_AGAIN;
  UNLOCK(w->comm->loop);
  return s;
}

ncfsm_result_t ncfsm_work_get_fingerprint(const ncfsm_work *w, ncfsm_fingerprint_t *out) {
  if (!work_ok(w) || !out) return NCFSM_ERR_INVALID_ARGUMENT;
  LOCK(w->comm->loop);
  *out = w->fp;
  UNLOCK(w->comm->loop);
  return NCFSM_OK;
}

const ncfsm_fingerprint_t *ncfsm_work_fingerprint(const ncfsm_work *w) {
  return work_ok(w) ? &w->fp : NULL;
}
ncfsm_comm *ncfsm_work_comm(const ncfsm_work *w) { return work_ok(w) ? w->comm : NULL; }

int ncfsm_work_launched(const ncfsm_work *w) {
  if (!work_ok(w)) return 0;
  LOCK(w->comm->loop);
  int l = w->state == NCFSM_WORK_IN_FLIGHT || w->state == NCFSM_WORK_COMPLETED;
  UNLOCK(w->comm->loop);
  return l;
}

static bool work_delivered(void *arg) { return ((ncfsm_work *)arg)->delivered; }

ncfsm_result_t ncfsm_work_wait(ncfsm_work *w, uint64_t timeout_ms) {
  if (!work_ok(w)) return NCFSM_ERR_INVALID_ARGUMENT;
  LOCK(w->comm->loop);
  bool held = w->user_held;
  UNLOCK(w->comm->loop);
  if (!held) return NCFSM_ERR_INVALID_USAGE; /* a released handle */
  ncfsm_result_t r = wait_until(w->comm->loop, work_delivered, w, timeout_ms);
  if (r == NCFSM_ERR_ILLEGAL_STATE) {
    LOCK(w->comm->loop);
    ncfsm__set_error(w->comm, "ncfsm_work_wait: work seq %llu is %s and nothing can progress it (is "
                              "its group still open?)",
                     (unsigned long long)w->fp.seq, ncfsm_work_state_name(w->state));
    UNLOCK(w->comm->loop);
    return r;
  }
  return r == NCFSM_OK ? w->status : r;
}

ncfsm_result_t ncfsm_comm_dump(ncfsm_comm *c, const char *dir) {
  if (!comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  LOCK(c->loop);
  ncfsm_result_t r = ncfsm__comm_dump(c, dir, "request");
  UNLOCK(c->loop);
  return r;
}

ncfsm_result_t ncfsm_work_set_timeout(ncfsm_work *w, uint64_t timeout_ms) {
  if (!work_ok(w)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = w->comm->loop;
  LOCK(loop);
  ncfsm_result_t r = NCFSM_OK;
  if (w->notified) {
    ncfsm__set_error(w->comm, "ncfsm_work_set_timeout: work seq %llu is %s already; a deadline applies "
                              "to unfinished works only",
                     (unsigned long long)w->fp.seq, ncfsm_work_state_name(w->state));
    r = NCFSM_ERR_ILLEGAL_STATE;
  } else {
    w->timeout_ms = timeout_ms;
    if (w->t_launch) /* launched: the new deadline counts from the launch too */
      w->deadline_ns = ncfsm__deadline(w->t_launch, timeout_ms ? timeout_ms : w->comm->opts.timeout_ms);
    w->comm->work_deadlines = true;
    if (w->t_launch) ncfsm__loop_wake(loop);
  }
  UNLOCK(loop);
  return r;
}

ncfsm_result_t ncfsm_work_release(ncfsm_work *w) {
  if (!w) return NCFSM_ERR_INVALID_ARGUMENT;
  if (w->magic == NCFSM__DEAD_MAGIC) {
    NCFSM_WARN(NCFSM__SUB_FSM, "ncfsm_work_release: the work handle %p was released already (or "
               "never returned to you); each handle is released once", (void *)w);
    return NCFSM_ERR_INVALID_USAGE;
  }
  if (!work_ok(w)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = w->comm->loop;
  LOCK(loop);
  ncfsm_result_t r = NCFSM_OK;
  if (!w->user_held) {
    ncfsm__set_error(w->comm, "ncfsm_work_release: work seq %llu (%s) was released already; each "
                              "handle is released once, and not used afterwards",
                     (unsigned long long)w->fp.seq, ncfsm_work_state_name(w->state));
    r = NCFSM_ERR_INVALID_USAGE;
  } else {
    w->user_held = false;
    ncfsm__work_unref(w);
  }
  UNLOCK(loop);
  return r;
}

/* ---- sim introspection ------------------------------------------------------------------ */
#include "core/sim/sim.h"
#include "ncfsm/sim.h"

ncfsm_result_t ncfsm_sim_get_stats(const ncfsm_comm *c, ncfsm_sim_stats *out) {
  if (!comm_ok(c) || !out) return NCFSM_ERR_INVALID_ARGUMENT;
  memset(out, 0, sizeof *out);
  LOCK(c->loop);
  ncfsm_result_t r = NCFSM_ERR_INVALID_ARGUMENT;
  if (c->be == &ncfsm__backend_sim && c->bcomm)
    r = ncfsm__sim_stats(c->bcomm, out) == 0 ? NCFSM_OK : NCFSM_ERR_INVALID_ARGUMENT;
  UNLOCK(c->loop);
  return r;
}

/* ---- buffers --------------------------------------------------------------------------- */

ncfsm_result_t ncfsm_mem_alloc(ncfsm_comm *c, size_t bytes, void **ptr) {
  if (!comm_ok(c) || !ptr) return NCFSM_ERR_INVALID_ARGUMENT;
  *ptr = NULL;
  if (c->be->mem_alloc)
    return c->be->mem_alloc(c->opts.device, bytes, ptr) == 0 ? NCFSM_OK : NCFSM_ERR_NO_MEMORY;
  *ptr = calloc(1, bytes ? bytes : 1);
  return *ptr ? NCFSM_OK : NCFSM_ERR_NO_MEMORY;
}

ncfsm_result_t ncfsm_mem_free(ncfsm_comm *c, void *ptr) {
  if (!comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  if (!ptr) return NCFSM_OK;
  if (c->be->mem_free) return c->be->mem_free(c->opts.device, ptr) == 0 ? NCFSM_OK : NCFSM_ERR_BACKEND;
  free(ptr);
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_memcpy(ncfsm_comm *c, void *dst, const void *src, size_t bytes, int to_device) {
  if (!comm_ok(c) || (bytes && (!dst || !src))) return NCFSM_ERR_INVALID_ARGUMENT;
  if (c->be->memcpy_sync)
    return c->be->memcpy_sync(c->opts.device, dst, src, bytes, to_device) == 0 ? NCFSM_OK
                                                                                 : NCFSM_ERR_BACKEND;
  memcpy(dst, src, bytes);
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_work_get_times(const ncfsm_work *w, ncfsm_work_times *t) {
  if (!work_ok(w) || !t) return NCFSM_ERR_INVALID_ARGUMENT;
  LOCK(w->comm->loop);
  t->submit_ns = w->t_submit;
  t->launch_ns = w->t_launch;
  t->final_ns = w->t_final;
  t->complete_ns = w->state == NCFSM_WORK_COMPLETED ? w->t_complete : 0;
  t->device_ms = w->device_ms;
  t->ready_at_final = w->mark && w->comm->opts.timing ? w->mark->ready_at_final : -1;
  UNLOCK(w->comm->loop);
  return NCFSM_OK;
}
