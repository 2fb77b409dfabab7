/* The public calls that submit operations: argument checks before the
 * backend (R3: an argument error reaching a nonblocking NCCL communicator
 * poisons it for good), the work's creation, and its place in the open
 * group or its own batch. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fsm/api-int.h"
#include "fsm/submit.h"

/* Argument checks before the backend (R3: an argument error reaching a
 * nonblocking NCCL communicator poisons it for good). */
/* quiet: no message (a hand-off's check: the locked path that follows a
 * refusal says why). */
#define ARG_ERROR(...) (quiet ? (void)0 : ncfsm__set_error(c, __VA_ARGS__))
static inline __attribute__((always_inline)) ncfsm_result_t validate(ncfsm_comm *c, ncfsm_call_t call,
                                                                   const ncfsm__op *o, bool quiet) {
  if ((unsigned)o->dtype >= NCFSM_DTYPE_COUNT) {
    ARG_ERROR("%s: argument datatype: unknown dtype %d (valid: 0..%d, ncfsm_dtype_t)", ncfsm_call_fn(call),
                     (int)o->dtype, NCFSM_DTYPE_COUNT - 1);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (ncfsm__op_reduces(o->kind) && (unsigned)o->redop >= NCFSM_REDOP_COUNT) {
    ARG_ERROR("%s: argument op: unknown reduction operator %d (valid: 0..%d, ncfsm_redop_t)",
                     ncfsm_call_fn(call), (int)o->redop, NCFSM_REDOP_COUNT - 1);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (ncfsm__op_rooted(o->kind) && (o->root < 0 || o->root >= c->nranks)) {
    ARG_ERROR("%s: argument root: %d is out of range (the communicator has %d ranks: 0..%d)",
                     ncfsm_call_fn(call), o->root, c->nranks, c->nranks - 1);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if ((o->kind == NCFSM_KIND_SEND || o->kind == NCFSM_KIND_RECV) &&
      (o->peer < 0 || o->peer >= c->nranks)) {
    ARG_ERROR("%s: argument peer: %d is out of range (the communicator has %d ranks: 0..%d)",
                     ncfsm_call_fn(call), o->peer, c->nranks, c->nranks - 1);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  size_t bytes, total;
  size_t mult = ncfsm__kind_in(o->kind, NCFSM__KIND(ALLGATHER) | NCFSM__KIND(REDUCESCATTER) | NCFSM__KIND(ALLTOALL) |
                                            NCFSM__KIND(GATHER) | NCFSM__KIND(SCATTER))
                    ? (size_t)c->nranks
                    : 1;
  if (__builtin_mul_overflow(o->count, ncfsm__dtype_bytes(o->dtype), &bytes) ||
      __builtin_mul_overflow(bytes, mult, &total) || total > (size_t)PTRDIFF_MAX) {
    ARG_ERROR("%s: argument count: %zu elements of %s%s overflow the address space", ncfsm_call_fn(call),
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
      ARG_ERROR("%s: argument %s: NULL buffer with count %zu", ncfsm_call_fn(call),
                       need_send && !o->send ? "sendbuff" : "recvbuff", o->count);
      return NCFSM_ERR_INVALID_ARGUMENT;
    }
  }
  int dev = -1;
  if (o->stream && c->be->stream_device(o->stream, &dev) == 0 && dev >= 0 && dev != c->opts.device) {
    ARG_ERROR("%s: argument stream: the stream belongs to device %d, the communicator to "
                        "device %d",
                     ncfsm_call_fn(call), dev, c->opts.device);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  return NCFSM_OK;
}
#undef ARG_ERROR

/* ---- the hand-off: a submission while another thread holds the lock ----
 *
 * A thread that finds the loop's lock taken (the loop's thread in a turn,
 * another submitter) does not wait for it when the call is one the comm
 * takes in READY and no group is open on the loop: it checks the arguments,
 * fills a work from a cache of its own, pushes it on the loop's lock-free
 * stack, wakes the loop and returns. The next holder of the lock (a turn, a
 * submission, every public call that takes it: fsm/submit.h) takes the stack
 * in the order it was pushed and enters each work as the locked path would,
 * after checking the call again in the comm's state then: a comm that left
 * READY in between fails the work with that check's error (its status and
 * callback, and the comm's last error), as it fails a work queued just
 * before such a change. Everything else (a group open, another state, an
 * argument error, a full stack, a trace callback set) takes the lock and
 * the locked path, whose result and message are the call's. */

/* Works this thread took for hand-offs: from a loop's spare stack (the pool
 * past its quarantine) or the allocator; freed when the thread exits. */
static __thread ncfsm_work *tls_works;
static __thread bool tls_registered;
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;
static void tls_free(void *unused) { /* the thread exits (its __thread variables are still there) */
  (void)unused;
  for (ncfsm_work *w = tls_works, *n; w; w = n) {
    n = w->next;
    free(w);
  }
  tls_works = NULL;
}
static void tls_init(void) { (void)pthread_key_create(&tls_key, tls_free); }

static ncfsm_work *handoff_alloc(ncfsm_loop *loop) {
  if (!tls_registered) { /* once per thread: its cache is freed when it exits */
    pthread_once(&tls_once, tls_init);
    if (pthread_setspecific(tls_key, &tls_works) != 0) return NULL;
    tls_registered = true;
  }
  ncfsm_work *w = tls_works;
  if (!w) w = atomic_exchange_explicit(&loop->spare, NULL, memory_order_acquire);
  if (w) {
    tls_works = w->next;
    /* The next submission's work, last written by the loop's thread on its core: its lines
     * are on their way while this one is filled (a miss per line otherwise, in a stream) */
    if (tls_works) ncfsm__prefetch_work(tls_works);
    return w;
  }
  return malloc(sizeof *w);
}

static bool handoff(ncfsm_comm *c, ncfsm_call_t call, ncfsm__op *o, ncfsm_work_cb cb, void *arg, ncfsm_work **out) {
  ncfsm_loop *loop = c->loop;
  /* Published after the step into READY and its action (fsm/comm_fsm.c):
   * the comm's size, rank and stream are set. In READY no op of the comm is
   * in a group and it is sized: the cell's guards hold. */
  if (!atomic_load_explicit(&c->ready_pub, memory_order_acquire) || !ncfsm__comm_fast[NCFSM_STATE_READY][call])
    return false;
  if (__atomic_load_n(&loop->group_state, __ATOMIC_RELAXED) != NCFSM__GS_NONE) return false;
  if (ncfsm__held_any(loop)) return false; /* a group held back from the loop: its comm's order is the lock's */
  /* A trace sees every submission inside its call (ncfsm-apifuzz checks it): no hand-off. */
  if (__atomic_load_n(&loop->trace, __ATOMIC_RELAXED)) return false;
  if (atomic_load_explicit(&loop->nhandoff, memory_order_relaxed) >= NCFSM__HANDOFF_MAX) return false;
  if (validate(c, call, o, true) != NCFSM_OK) return false;
  ncfsm_work *w = handoff_alloc(loop);
  if (!w) return false;
  if (!o->stream) o->stream = c->stream;
  ncfsm__work_init(w, c, call, o, cb, arg, out != NULL);
  if (out) *out = w; /* before the push: the work may be taken, and even final, at once */
  atomic_fetch_add_explicit(&loop->nhandoff, 1, memory_order_relaxed);
  /* From the push on, the work may complete and its callback let the program
   * close the loop. Only the first on the stack uses the loop after its push
   * (to wake it): it counts itself in before, and ncfsm_loop_close waits
   * until no thread is counted. */
  bool counted = false;
  ncfsm_work *h = atomic_load_explicit(&loop->handoff, memory_order_relaxed);
  for (;;) {
    if (!h && !counted) {
      atomic_fetch_add_explicit(&loop->handing, 1, memory_order_acq_rel);
      counted = true;
    }
    w->next = h;
    if (atomic_compare_exchange_weak_explicit(&loop->handoff, &h, w, memory_order_seq_cst, memory_order_relaxed))
      break;
  }
  /* The first on the stack wakes the loop (the turn takes the rest too),
   * unless its thread is awake: it looks at the stack before it waits
   * (fsm/loop.c). Waking it anyway costs libevent's lock, which that
   * thread holds in its dispatch: a futex wait and wake per turn. */
  if (!h && !atomic_load(&loop->awake)) loop->ops->wake(loop);
  if (counted) atomic_fetch_sub_explicit(&loop->handing, 1, memory_order_release);
  return true;
}

/* The lock held, the calling thread holding a group back from the loop
 * (fsm/held.def): the group's first op is held when its comm takes it in
 * READY and the loop has no group open; false: the group must become the
 * loop's first (a second op, another state, an argument error, a trace),
 * and the op takes the locked path's checks, with their messages. */
static bool held_op(ncfsm_comm *c, ncfsm_call_t call, ncfsm__op *o, ncfsm_work_cb cb, void *arg, ncfsm_work **out) {
  ncfsm_loop *loop = c->loop;
  if (loop->held.state != NCFSM__HS_EMPTY || c->state != NCFSM_STATE_READY || loop->group_state != NCFSM__GS_NONE ||
      loop->trace || !ncfsm__legal_fast(c->state, call, c->ngroup, c->nranks) || validate(c, call, o, true) != NCFSM_OK)
    return false;
  ncfsm_work *w = ncfsm__work_alloc(loop);
  if (!w) return false;
  if (!o->stream) o->stream = c->stream;
  ncfsm__work_init(w, c, call, o, cb, arg, out != NULL);
  ncfsm__work_record(loop, c, w);
  ncfsm__work_enlist(c); /* in its comm's group, as in the loop's (GROUP_THREAD refuses other threads' ops of c) */
  ncfsm__held_take(loop, w);
  if (out) *out = w;
  return true;
}

static ncfsm_result_t submit(ncfsm_comm *c, ncfsm_call_t call, ncfsm__op *o, ncfsm_work_cb cb, void *arg,
                             ncfsm_work **out) {
  if (out) *out = NULL;
  if (!ncfsm__comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = c->loop;
  /* A loop on its own thread: another thread hands off first. Taking the
   * lock between two of that thread's turns would make it wait for the
   * lock, asleep, once every few ops (a futex wait and wake each). */
  bool first = atomic_load_explicit(&loop->threaded, memory_order_relaxed) && !ncfsm__loop_in_turn(loop);
  if (first && handoff(c, call, o, cb, arg, out)) return NCFSM_OK;
  if (pthread_mutex_trylock(&loop->mu) != 0) {
    if (!first && handoff(c, call, o, cb, arg, out)) return NCFSM_OK;
    pthread_mutex_lock(&loop->mu);
  }
  ncfsm__handoff_turn(loop); /* the submissions handed off before this one first */
  ncfsm_result_t r = NCFSM_OK;
  if (__builtin_expect(ncfsm__held_loop == loop, 0)) { /* the op of a group this thread holds back */
    if (held_op(c, call, o, cb, arg, out)) {
      NCFSM__UNLOCK(loop);
      return NCFSM_OK;
    }
    if ((r = ncfsm__held_spill(loop)) != NCFSM_OK) { /* another thread's group opened on the loop meanwhile */
      NCFSM__UNLOCK(loop);
      return r;
    }
  }
  /* the cell's guards too: GROUP_THREAD (R3, R9), SIZED (a split child);
   * the table only when the fast path cannot say (fsm/tables.h) */
  if (!ncfsm__legal_fast(c->state, call, c->ngroup, c->nranks) && ncfsm__check_legal(c, call, &r) == NCFSM_REJECT) {
    NCFSM__UNLOCK(loop);
    return r;
  }
  r = validate(c, call, o, false);
  ncfsm_work *w = NULL;
  if (r == NCFSM_OK && !(w = ncfsm__work_alloc(loop))) r = NCFSM_ERR_NO_MEMORY;
  if (r != NCFSM_OK) {
    ncfsm__group_note_error(c, r);
    NCFSM__UNLOCK(loop);
    return r;
  }
  if (!o->stream) o->stream = c->stream;
  ncfsm__work_init(w, c, call, o, cb, arg, out != NULL);
  ncfsm__work_enter(loop, c, w, ncfsm__group_owned(loop));
  if (out) *out = w;
  NCFSM__UNLOCK(loop);
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

