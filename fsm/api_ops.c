/* The public calls that submit operations: argument checks before the
 * backend (R3: an argument error reaching a nonblocking NCCL communicator
 * poisons it for good), the work's creation, and its place in the open
 * group or its own batch. */
#include <stdint.h>
#include <stdio.h>

#include "fsm/api-int.h"

/* Kinds as bit sets (one test each on the submit path). */
#define KIND(k) (1u << NCFSM_KIND_##k)
_Static_assert(NCFSM_OPKIND_COUNT <= 32, "the kinds fit a bit set");
static bool kind_in(ncfsm_opkind_t k, unsigned set) { return (unsigned)k < 32 && ((1u << k) & set); }
static bool op_reduces(ncfsm_opkind_t k) { return kind_in(k, KIND(ALLREDUCE) | KIND(REDUCE) | KIND(REDUCESCATTER)); }
static bool op_rooted(ncfsm_opkind_t k) {
  return kind_in(k, KIND(BROADCAST) | KIND(REDUCE) | KIND(GATHER) | KIND(SCATTER));
}

/* Argument checks before the backend (R3: an argument error reaching a
 * nonblocking NCCL communicator poisons it for good). */
static ncfsm_result_t validate(ncfsm_comm *c, ncfsm_call_t call, const ncfsm__op *o) {
  if ((unsigned)o->dtype >= NCFSM_DTYPE_COUNT) {
    ncfsm__set_error(c, "%s: argument datatype: unknown dtype %d (valid: 0..%d, ncfsm_dtype_t)", ncfsm_call_fn(call),
                     (int)o->dtype, NCFSM_DTYPE_COUNT - 1);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (op_reduces(o->kind) && (unsigned)o->redop >= NCFSM_REDOP_COUNT) {
    ncfsm__set_error(c, "%s: argument op: unknown reduction operator %d (valid: 0..%d, ncfsm_redop_t)",
                     ncfsm_call_fn(call), (int)o->redop, NCFSM_REDOP_COUNT - 1);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (op_rooted(o->kind) && (o->root < 0 || o->root >= c->nranks)) {
    ncfsm__set_error(c, "%s: argument root: %d is out of range (the communicator has %d ranks: 0..%d)",
                     ncfsm_call_fn(call), o->root, c->nranks, c->nranks - 1);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if ((o->kind == NCFSM_KIND_SEND || o->kind == NCFSM_KIND_RECV) &&
      (o->peer < 0 || o->peer >= c->nranks)) {
    ncfsm__set_error(c, "%s: argument peer: %d is out of range (the communicator has %d ranks: 0..%d)",
                     ncfsm_call_fn(call), o->peer, c->nranks, c->nranks - 1);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  size_t bytes, total;
  size_t mult = kind_in(o->kind, KIND(ALLGATHER) | KIND(REDUCESCATTER) | KIND(ALLTOALL) | KIND(GATHER) | KIND(SCATTER))
                    ? (size_t)c->nranks
                    : 1;
  if (__builtin_mul_overflow(o->count, ncfsm_dtype_size(o->dtype), &bytes) ||
      __builtin_mul_overflow(bytes, mult, &total) || total > (size_t)PTRDIFF_MAX) {
    ncfsm__set_error(c, "%s: argument count: %zu elements of %s%s overflow the address space", ncfsm_call_fn(call),
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
      ncfsm__set_error(c, "%s: argument %s: NULL buffer with count %zu", ncfsm_call_fn(call),
                       need_send && !o->send ? "sendbuff" : "recvbuff", o->count);
      return NCFSM_ERR_INVALID_ARGUMENT;
    }
  }
  int dev = -1;
  if (o->stream && c->be->stream_device(o->stream, &dev) == 0 && dev >= 0 && dev != c->opts.device) {
    ncfsm__set_error(c, "%s: argument stream: the stream belongs to device %d, the communicator to "
                        "device %d",
                     ncfsm_call_fn(call), dev, c->opts.device);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  return NCFSM_OK;
}

static ncfsm_result_t submit(ncfsm_comm *c, ncfsm_call_t call, ncfsm__op *o, ncfsm_work_cb cb, void *arg,
                             ncfsm_work **out) {
  if (out) *out = NULL;
  if (!ncfsm__comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = c->loop;
  NCFSM__LOCK(loop);
  ncfsm_result_t r = NCFSM_OK;
  /* the cell's guards too: GROUP_THREAD (R3, R9), SIZED (a split child);
   * the table only when the fast path cannot say (fsm/tables.h) */
  if (!ncfsm__legal_fast(c->state, call, c->ngroup, c->nranks) && ncfsm__check_legal(c, call, &r) == NCFSM_REJECT) {
    NCFSM__UNLOCK(loop);
    return r;
  }
  r = validate(c, call, o);
  ncfsm_work *w = NULL;
  if (r == NCFSM_OK && !(w = ncfsm__work_alloc(loop))) r = NCFSM_ERR_NO_MEMORY;
  if (r != NCFSM_OK) {
    ncfsm__group_note_error(c, r);
    NCFSM__UNLOCK(loop);
    return r;
  }
  if (!o->stream) o->stream = c->stream;
  /* Every field, once (the work's memory comes uninitialised from the pool). */
  w->magic = NCFSM__WORK_MAGIC;
  w->state = NCFSM_WORK_QUEUED; /* fsm/work.def's initial state */
  w->user_refs = out != NULL;
  w->refs = w->user_refs + 1; /* the engine's: until the callback ran */
  w->comm = c;
  w->op = *o;
  w->nspan = -1; /* its R12 ranges: at their first use (fsm/ranges.c) */
  w->status = NCFSM_ERR_AGAIN;
  w->cb = cb;
  w->arg = arg;
  w->batch = NULL;
  w->mark = w->start_mark = NULL;
  w->device_ms = -1;
  w->timeout_ms = 0;
  w->group = 0;
  w->t_submit = ncfsm__now_ns();
  w->t_launch = w->t_final = w->t_complete = w->deadline_ns = 0;
  w->vreq = NULL;
  w->bnext = w->next = NULL;
  c->refs++;
  bool p2p = kind_in(o->kind, KIND(SEND) | KIND(RECV));
  /* The seq is taken at launch (the work's action launch): a work refused,
   * dropped with a failed group or failed before launch takes none, so the
   * ranks' numbers stay equal when a group fails on one rank only (R11). */
  w->fp = (ncfsm_fingerprint_t){
      .seq = NCFSM_SEQ_NONE,
      .op = (int32_t)o->kind,
      .dtype = (int32_t)o->dtype,
      .count = o->count,
      .root = op_rooted(o->kind) ? o->root : -1,
      .redop = op_reduces(o->kind) ? (int32_t)o->redop : -1,
      .peer = p2p ? o->peer : -1,
  };
  ncfsm__rec_entry *re = ncfsm__rec_push(c->rec, &w->rec); /* written in place */
  if (re) {
    re->fp = w->fp;
    re->group = 0;
    re->state = NCFSM_WORK_QUEUED;
    re->result = NCFSM_ERR_AGAIN;
    re->stream = (uint64_t)(uintptr_t)o->stream;
    re->t_submit_ns = w->t_submit;
    re->t_launch_ns = re->t_final_ns = re->t_complete_ns = 0;
  }
  if (loop->trace) {
    ncfsm_trace_rec rec = {NCFSM_OBJ_WORK, w, c->rank, w->fp.seq, -1, -1, NCFSM_WORK_QUEUED, NCFSM_OK, w->t_submit};
    loop->trace(&rec, loop->trace_arg);
  }
  if (ncfsm__group_owned(loop)) {
    w->bnext = NULL;
    if (loop->group_tail) loop->group_tail->bnext = w;
    else loop->group_head = w;
    loop->group_tail = w;
    c->ngroup++;
    ncfsm__comm_fire(c, NCFSM_EV_ENLIST, NULL); /* R3 */
  } else {
    ncfsm__batch *b = &w->single;
    b->head = b->tail = w;
    b->nworks = 1;
    b->explicit_group = b->allocated = false;
    b->nlinks = 1;
    b->links = &w->single_link;
    w->single_link.c = c; /* .b, .next: ncfsm__batch_queue; .order, .nlive too */
    w->batch = b;
    ncfsm__batch_queue(loop, b);
    ncfsm__loop_wake(loop);
  }
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

