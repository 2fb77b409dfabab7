/*
 * The sim's operations (docs/sim.md "Argument checks", R2, R3, R10): what
 * ncclEnqueueCheck checks before an op joins the thread's group (the comm's
 * state, ArgsCheck's order, room in the clique's shared arena, the group's
 * blocking mode), and the op's place in the group's pending launch unit.
 */
#include <stdlib.h>

#include "core/sim/sim-comm.h"

/* ArgsCheck (misc/argcheck.cc): root (peer for send/recv), type, reduction
 * operator, then the buffers a rank needs. */
static int args_check(sim_comm *c, const ncfsm__op *op) {
  if ((unsigned)op->kind >= (unsigned)NCFSM_OPKIND_COUNT) {
    ncfsm__sim_cwarn(c, "sim: invalid operation kind %d", (int)op->kind);
    return E_ARG;
  }
  ncfsm_opkind_t k = op->kind;
  const char *nm = ncfsm__sim_op_name(k);
  int p2p = k == NCFSM_KIND_SEND || k == NCFSM_KIND_RECV;
  int rooted = k == NCFSM_KIND_BROADCAST || k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_GATHER ||
               k == NCFSM_KIND_SCATTER;
  if (rooted || p2p) { /* NCCL passes the peer of send/recv as the root */
    int root = p2p ? op->peer : op->root;
    if (root < 0 || root >= c->nranks) {
      ncfsm__sim_cwarn(c, "%s : invalid root %d (root should be in the 0..%d range)", nm, root,
                      c->nranks - 1);
      return E_ARG;
    }
  }
  if ((unsigned)op->dtype >= (unsigned)NCFSM_DTYPE_COUNT) {
    ncfsm__sim_cwarn(c, "%s : invalid type %d", nm, (int)op->dtype);
    return E_ARG;
  }
  int reduces = k == NCFSM_KIND_ALLREDUCE || k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_REDUCESCATTER;
  if (reduces && (unsigned)op->redop >= (unsigned)NCFSM_REDOP_COUNT) {
    ncfsm__sim_cwarn(c, "%s : invalid reduction operation %d", nm, (int)op->redop);
    return E_ARG;
  }
  size_t es = ncfsm__sim_dtype_size(op->dtype);
  size_t mult = (k == NCFSM_KIND_ALLGATHER || k == NCFSM_KIND_REDUCESCATTER ||
                 k == NCFSM_KIND_ALLTOALL || k == NCFSM_KIND_GATHER || k == NCFSM_KIND_SCATTER)
                    ? (size_t)c->nranks * (size_t)c->nranks /* alltoall's scratch: n*n blocks */
                    : 1;
  size_t unit, total;
  if (__builtin_mul_overflow(es, mult, &unit) || __builtin_mul_overflow(op->count, unit, &total)) {
    ncfsm__sim_cwarn(c, "%s : count %zu is too large", nm, op->count);
    return E_ARG;
  }
  if (op->count > 0) {
    int is_root = rooted && op->root == c->rank;
    int need_send = 1, need_recv = 1;
    if (k == NCFSM_KIND_BROADCAST || k == NCFSM_KIND_SCATTER) need_send = is_root;
    if (k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_GATHER) need_recv = is_root;
    if (k == NCFSM_KIND_SEND) need_recv = 0;
    if (k == NCFSM_KIND_RECV) need_send = 0;
    if (need_send && !op->send) {
      ncfsm__sim_cwarn(c, "%s : %s %p is not a valid pointer", nm, p2p ? "buff" : "sendbuff", op->send);
      return E_ARG;
    }
    if (need_recv && !op->recv) {
      ncfsm__sim_cwarn(c, "%s : %s %p is not a valid pointer", nm, p2p ? "buff" : "recvbuff",
                      (void *)op->recv);
      return E_ARG;
    }
  }
  if (op->stream && !ncfsm__sim_stream_valid(op->stream)) {
    ncfsm__sim_cwarn(c, "%s : invalid stream %p", nm, op->stream);
    return E_ARG;
  }
  return OK;
}

/* The clique's shared arena must hold one instance of the op alone: every
 * rank's send data, the result block and the descriptors. Otherwise the op
 * could never run: refuse it (ncclSystemError, as NCCL on a failed shm
 * allocation) instead of hanging. args_check ruled out overflows. */
static int arena_check(sim_comm *c, const ncfsm__op *op) {
  if (!c->q) return OK;
  ncfsm_opkind_t k = op->kind;
  size_t n = (size_t)c->nranks, blk = op->count * ncfsm__sim_dtype_size(op->dtype), all = blk * n;
  size_t send = blk, res = blk, senders = n;
  switch (k) {
  case NCFSM_KIND_ALLGATHER: res = all; break;
  case NCFSM_KIND_GATHER: res = all; break;
  case NCFSM_KIND_REDUCESCATTER: send = all; res = all; break;
  case NCFSM_KIND_SCATTER: send = all; res = all; senders = 1; break;
  case NCFSM_KIND_BROADCAST: senders = 1; break;
  case NCFSM_KIND_ALLTOALL: send = all; res = all * n; break;
  case NCFSM_KIND_SEND:
  case NCFSM_KIND_RECV: senders = 1; n = 2; break;
  default: break;
  }
  double need = (double)senders * (double)(send + 128) + (double)res + 128.0 +
                (double)n * (double)(sizeof(shm_op) + 128);
  if (need <= (double)c->q->h->arena_len) return OK;
  ncfsm__sim_cwarn(c, "%s : %zu elements need %.0f bytes of the clique's shared memory, more than its "
                  "arena of %llu bytes (raise NCFSM_SIM_SHM_BYTES before the clique is created)",
                  ncfsm__sim_op_name(k), op->count, need, (unsigned long long)c->q->h->arena_len);
  return E_SYSTEM;
}

/* ncclEnqueueCheck: CommCheck, ncclCommEnsureReady (R2), ArgsCheck, taskAppend. */
static int op_admit(sim_comm *c, const ncfsm__op *op) {
  if (ncfsm__sim_foreign(c)) return ncfsm__sim_foreign_reject(c, ncfsm__sim_op_name(op->kind));
  if (c->state == IN_PROGRESS) {
    ncfsm__sim_cwarn(c, R2_WARN); /* R2 */
    return E_ARG;
  }
  if (c->shrink_aborted) {
    ncfsm__sim_cwarn(c, "%s : " SHRUNK_WARN, ncfsm__sim_op_name(op->kind));
    return E_USAGE;
  }
  if (c->state != OK) return c->state; /* R10: the async error, again */
  if (c->revoked) {
    ncfsm__sim_cwarn(c, "%s : communicator was revoked; new operations are not allowed (R6)",
                    ncfsm__sim_op_name(op->kind));
    return E_USAGE;
  }
  if (c->finalized) {
    ncfsm__sim_cwarn(c, "%s : communicator was finalized (sim)", ncfsm__sim_op_name(op->kind));
    return E_USAGE;
  }
  int rc = args_check(c, op);
  if (rc) return rc;
  if ((rc = arena_check(c, op))) return rc;
  return ncfsm__sim_group_op_mode_check(c->blocking);
}

int ncfsm__sim_op(void *bcomm, const ncfsm__op *op) {
  LOCK();
  int implicit = ncfsm__sim_implicit_begin(), rc = OK;
  sim_comm *c = ncfsm__sim_comm_of(bcomm);
  if (!c) {
    ncfsm__sim_warn("%s : comm argument is NULL or not a sim communicator",
                    op ? ncfsm__sim_op_name(op->kind) : "op");
    rc = E_ARG;
  } else {
    c->st.ops++;
    if (!op) {
      ncfsm__sim_cwarn(c, "sim: op is NULL");
      rc = E_ARG;
    } else {
      rc = op_admit(c, op);
    }
    if (!rc) {
      sim_op *o = calloc(1, sizeof *o);
      if (!c->pending && o) c->pending = calloc(1, sizeof *c->pending);
      if (!o || !c->pending) {
        free(o);
        ncfsm__sim_cwarn(c, "sim: out of memory");
        rc = E_SYSTEM;
      } else {
        o->a = *op;
        o->c = c;
        if (c->pending->tail) c->pending->tail->next = o;
        else c->pending->head = o;
        c->pending->tail = o;
        c->pending->n++;
        ncfsm__sim_group_join(c);
      }
    }
  }
  if (rc) ncfsm__sim_group_fail(c, rc);
  int grc = ncfsm__sim_implicit_end(implicit);
  if (!rc) rc = c->blocking ? grc : c->state; /* nonblocking: the async state (R1) */
  UNLOCK();
  return rc;
}

