/*
 * Execution of posted ops: matching across ranks and data movement, over the
 * clique's shared segment (sim_shm.c), so ranks may live in other processes.
 *
 * Matching (R11): the i-th collective posted by rank r is instance i on every
 * rank; the j-th send from r to p pairs with the j-th recv on p from r.
 * Each comm keeps its posted ops in launch units, one per group end, in its
 * own process. Progress, run by every process for its own ranks, does three
 * things until nothing moves:
 *   collect  each local op that was executed gets its result copied from the
 *            arena into its receive buffer (in execution order), its stream
 *            ticket completes, and its shared descriptor is freed;
 *   deposit  when all earlier units of a local rank are complete, the ops of
 *            its next (head) unit copy their send data into the arena: like
 *            a stream, an op reads its input after the earlier ops wrote;
 *   execute  every instance whose ops are all deposited (on whatever
 *            process) runs: its result goes to a refcounted arena block.
 * All instances of a step run in an order shuffled by the clique's PRNG
 * (shuffle_seed), which is the order in which owners copy results back. Ops
 * of one group read their inputs at deposit, before any of them wrote, so
 * they are unordered (R12): three in-place AllReduces on one buffer in one
 * group read the same input and the result is wrong, as measured; separate
 * launches are separate units and run one after the other.
 *
 * A collective whose fingerprints differ across ranks runs as NCCL 2.28 was
 * measured to run it (R11, plan_mismatch below): on some ranks it completes,
 * with no error, and on the others it hangs. Ops of a never_arrive rank are
 * invisible to peers; an op hit by an injected async error never executes
 * (R10). A rank whose process died fails its peers' unfinished work with
 * ncclRemoteError. An op that executed (or was dropped) leaves its comm's
 * count of outstanding ops, which the drift limit in sim.c reads (R13). An instance is committed through the
 * segment's commit record (sim_shm.c), so that it executes on all of its ops
 * or on none even when the process dies half-way.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/sim/sim-internal.h"

typedef enum { INST_COLL, INST_P2P, INST_PART } inst_kind;

typedef struct sim_inst {
  inst_kind kind;
  int nops;
  shm_op **ops;         /* COLL: one per rank; P2P: send, recv; PART: the ops that complete */
  shm_op **from;        /* PART: whose send data each op receives (NULL: none) */
  uint64_t *roff, *rlen; /* each op's slice of the result block */
  shm_off res;          /* result block: [refs][pad to 64][data] */
} sim_inst;

#define RES_HDR 64u

static int is_coll_kind(int k) { return k != NCFSM_KIND_SEND && k != NCFSM_KIND_RECV; }
static int is_rooted(int k) {
  return k == NCFSM_KIND_BROADCAST || k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_GATHER ||
         k == NCFSM_KIND_SCATTER;
}
static int is_reducing(int k) {
  return k == NCFSM_KIND_ALLREDUCE || k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_REDUCESCATTER;
}
/* Executable: deposited, not executed, seen by peers, not hit by an error. */
static int matchable(const shm_op *o) {
  return o && (o->flags & SHM_OP_DEPOSITED) &&
         !(o->flags & (SHM_OP_DONE | SHM_OP_INVISIBLE | SHM_OP_DEAD));
}

/* R11 fingerprint equality (the seq is equal by construction). */
static int same_fingerprint(const shm_op *x, const shm_op *y) {
  if (x->kind != y->kind || x->count != y->count || x->dtype != y->dtype) return 0;
  if (is_rooted(x->kind) && x->root != y->root) return 0;
  if (is_reducing(x->kind) && x->redop != y->redop) return 0;
  return 1;
}

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void op_complete(sim_op *o, int executed) {
  if (o->done) return;
  o->done = 1;
  o->unit->ndone++;
  if (o->counted) { /* R13: one fewer launched op waiting for its peers */
    o->counted = 0;
    o->c->outstanding--;
  }
  if (executed) o->c->st.executed++;
  if (o->s) ncfsm__sim_stream_complete(o->s, o->ticket);
}

static void unit_free(sim_unit *u) {
  for (sim_op *o = u->head, *nx; o; o = nx) {
    nx = o->next;
    free(o);
  }
  free(u);
}

void ncfsm__sim_unit_drop(sim_unit *u) {
  if (!u) return;
  sim_clique *locked = NULL;
  for (sim_op *o = u->head; o; o = o->next) {
    o->unit = u;
    if (o->sh && o->c->q) { /* its shared part: peers no longer see it */
      if (!locked && ncfsm__sim_shm_lock(o->c->q) == 0) locked = o->c->q;
      if (locked == o->c->q) ncfsm__sim_shm_op_release(locked, o->sh);
      o->sh = 0;
    }
    op_complete(o, 0);
  }
  if (locked) ncfsm__sim_shm_unlock(locked);
  unit_free(u);
}

/* The comm's earliest unit not fully executed (fully executed ones are freed). */
static sim_unit *head_unit(sim_comm *c) {
  while (c->units && c->units->ndone == c->units->n) {
    sim_unit *u = c->units;
    c->units = u->next;
    if (!c->units) c->units_tail = NULL;
    unit_free(u);
  }
  return c->units;
}

/* ---- deposit: a local rank's head unit copies its inputs into the arena ----------- */

/* Bytes of send data this rank contributes to op a. */
static size_t send_bytes(const sim_comm *c, const ncfsm__op *a) {
  size_t blk = a->count * ncfsm__sim_dtype_size(a->dtype), n = (size_t)c->nranks;
  switch (a->kind) {
  case NCFSM_KIND_RECV: return 0;
  case NCFSM_KIND_BROADCAST: return a->root == c->rank ? blk : 0;
  case NCFSM_KIND_SCATTER: return a->root == c->rank ? blk * n : 0;
  case NCFSM_KIND_REDUCESCATTER:
  case NCFSM_KIND_ALLTOALL: return blk * n;
  default: return blk;
  }
}

static int deposit(sim_clique *q, sim_comm *c) {
  sim_unit *u = head_unit(c);
  int moved = 0;
  if (!u) return 0;
  for (sim_op *o = u->head; o; o = o->next) {
    if (o->done || o->deposited || o->invisible || o->dead || !o->sh) continue;
    shm_op *s = SHM_OP(q, o->sh);
    size_t len = o->a.send ? send_bytes(c, &o->a) : 0;
    if (len) {
      int nospace = 0;
      shm_off d = ncfsm__sim_shm_alloc(q, len, &nospace);
      if (!d && nospace) { /* /dev/shm is full: an error, as NCCL's shm transport */
        o->dead = 1;
        s->flags |= SHM_OP_DEAD;
        if (c->state == NCFSM__NCCL_SUCCESS || c->state == NCFSM__NCCL_IN_PROGRESS) {
          c->state = NCFSM__NCCL_SYSTEM_ERROR;
          c->phase = SIM_PH_NONE;
          c->armed = 0;
        }
        ncfsm__sim_cwarn(c, "sim: no space left in /dev/shm for %zu bytes of rank %d's data (%s)", len,
                        c->rank, strerror(nospace));
        continue;
      }
      if (!d) { /* the arena is full for now: retry when peers freed space */
        if (!q->full_warned) {
          q->full_warned = 1;
          ncfsm__sim_cwarn(c, "sim: the clique's shared arena is full (NCFSM_SIM_SHM_BYTES=%llu); rank %d "
                          "waits for space (ops of one group that together exceed it never run)",
                          (unsigned long long)q->h->arena_len, c->rank);
        }
        break;
      }
      memcpy(SHM_PTR(q, d), o->a.send, len);
      s->send = d;
      s->send_len = len;
    }
    s->flags |= SHM_OP_DEPOSITED;
    o->deposited = 1;
    moved++;
  }
  return moved;
}

/* ---- execute: instances whose ops are all deposited ---------------------------------- */

static int mul_ok(size_t a, size_t b, size_t *out) {
  if (a && b > SIZE_MAX / a) return 0;
  *out = a * b;
  return 1;
}

static const void *sendp(sim_clique *q, const shm_op *o) {
  return o->send ? SHM_PTR(q, o->send) : NULL;
}

/* A mismatched instance's ops that complete (R11): each gets a copy of the
 * send data of its `from` op (its own, for a Broadcast root), capped at its
 * own size, or nothing (NULL: its receive buffer stays as it was). One slice
 * per source. 0 when done, 1 when the arena has no room yet, -1 on an
 * impossible size. */
static int compute_part(sim_clique *q, sim_inst *in) {
  size_t len = 0;
  for (int k = 0; k < in->nops; k++) {
    const shm_op *o = in->ops[k], *f = in->from[k];
    size_t own;
    int j = 0;
    if (!mul_ok((size_t)o->count, ncfsm__sim_dtype_size(o->dtype), &own)) return -1;
    in->roff[k] = in->rlen[k] = 0;
    if (!f || !f->send) continue;
    size_t sl = (size_t)f->send_len;
    in->rlen[k] = sl < own ? sl : own;
    while (j < k && in->from[j] != f) j++;
    if (j < k) { /* the slice of this source is there already */
      in->roff[k] = in->roff[j];
      continue;
    }
    in->roff[k] = len;
    if (len + sl < len) return -1;
    len += sl;
  }
  if (!len) return 0; /* nothing to copy: the ops complete without data */
  shm_off res = ncfsm__sim_shm_alloc(q, len + RES_HDR, NULL);
  if (!res) return 1;
  *(uint64_t *)SHM_PTR(q, res) = (uint64_t)in->nops; /* one reference per op */
  unsigned char *sc = (unsigned char *)SHM_PTR(q, res) + RES_HDR;
  in->res = res;
  for (int k = 0; k < in->nops; k++) {
    const shm_op *f = in->from[k];
    int j = 0;
    while (j < k && in->from[j] != f) j++;
    if (f && f->send && j == k) memcpy(sc + in->roff[k], sendp(q, f), (size_t)f->send_len);
    in->roff[k] += RES_HDR;
  }
  return 0;
}

/* Computes the instance's result block. 0 when done, 1 when the arena has
 * no room yet, -1 on an impossible size. */
static int compute(sim_clique *q, sim_inst *in) {
  if (in->kind == INST_PART) return compute_part(q, in);
  shm_op **o = in->ops;
  int n = in->nops;
  const shm_op *a0 = o[0];
  size_t es = ncfsm__sim_dtype_size(a0->dtype), cnt = (size_t)a0->count, blk, all, sq;
  if (!mul_ok(cnt, es, &blk) || !mul_ok(blk, (size_t)n, &all) || !mul_ok(all, (size_t)n, &sq))
    return -1;
  if (!blk) return 0; /* zero-count op: nothing to move */
  size_t len = blk;
  if (in->kind == INST_COLL) {
    switch (a0->kind) {
    case NCFSM_KIND_ALLTOALL: len = sq; break;
    case NCFSM_KIND_ALLGATHER:
    case NCFSM_KIND_REDUCESCATTER:
    case NCFSM_KIND_GATHER:
    case NCFSM_KIND_SCATTER: len = all; break;
    default: break;
    }
  }
  shm_off res = ncfsm__sim_shm_alloc(q, len + RES_HDR, NULL);
  if (!res) return 1;
  *(uint64_t *)SHM_PTR(q, res) = (uint64_t)n; /* one reference per op */
  unsigned char *sc = (unsigned char *)SHM_PTR(q, res) + RES_HDR;
  in->res = res;
#define OUT(r, off, l) (in->roff[r] = RES_HDR + (off), in->rlen[r] = (l))

  if (in->kind == INST_P2P) { /* send -> recv */
    memcpy(sc, sendp(q, o[0]), blk);
    OUT(1, 0, blk);
    return 0;
  }
  int root = a0->root;
  const void *ins[n > 0 ? n : 1];
  switch (a0->kind) {
  case NCFSM_KIND_ALLREDUCE:
    for (int r = 0; r < n; r++) ins[r] = sendp(q, o[r]);
    ncfsm__sim_reduce(sc, ins, n, cnt, a0->dtype, a0->redop);
    for (int r = 0; r < n; r++) OUT(r, 0, blk);
    break;
  case NCFSM_KIND_REDUCE:
    for (int r = 0; r < n; r++) ins[r] = sendp(q, o[r]);
    ncfsm__sim_reduce(sc, ins, n, cnt, a0->dtype, a0->redop);
    OUT(root, 0, blk);
    break;
  case NCFSM_KIND_REDUCESCATTER: /* rank r gets the reduction of block r */
    for (int r = 0; r < n; r++) {
      for (int p = 0; p < n; p++) ins[p] = (const char *)sendp(q, o[p]) + (size_t)r * blk;
      ncfsm__sim_reduce(sc + (size_t)r * blk, ins, n, cnt, a0->dtype, a0->redop);
      OUT(r, (size_t)r * blk, blk);
    }
    break;
  case NCFSM_KIND_BROADCAST:
    memcpy(sc, sendp(q, o[root]), blk);
    for (int r = 0; r < n; r++) OUT(r, 0, blk);
    break;
  case NCFSM_KIND_ALLGATHER: /* rank-major */
    for (int r = 0; r < n; r++) memcpy(sc + (size_t)r * blk, sendp(q, o[r]), blk);
    for (int r = 0; r < n; r++) OUT(r, 0, all);
    break;
  case NCFSM_KIND_ALLTOALL: /* recv[r] block p = send[p] block r */
    for (int r = 0; r < n; r++)
      for (int p = 0; p < n; p++)
        memcpy(sc + (size_t)r * all + (size_t)p * blk, (const char *)sendp(q, o[p]) + (size_t)r * blk,
               blk);
    for (int r = 0; r < n; r++) OUT(r, (size_t)r * all, all);
    break;
  case NCFSM_KIND_GATHER:
    for (int r = 0; r < n; r++) memcpy(sc + (size_t)r * blk, sendp(q, o[r]), blk);
    OUT(root, 0, all);
    break;
  case NCFSM_KIND_SCATTER:
    memcpy(sc, sendp(q, o[root]), all);
    for (int r = 0; r < n; r++) OUT(r, (size_t)r * blk, blk);
    break;
  default:
    return -1;
  }
#undef OUT
  return 0;
}

static void inst_free(sim_inst *in) {
  free(in->ops);
  free(in->from);
  free(in->roff);
  free(in->rlen);
}

/* from: PART only (one per op), else NULL. */
static int push_inst(sim_inst **v, int *nv, int *cap, inst_kind kind, shm_op **ops, shm_op **from,
                     int nops) {
  if (*nv == *cap) {
    int ncap = *cap ? *cap * 2 : 8;
    sim_inst *nvv = realloc(*v, (size_t)ncap * sizeof *nvv);
    if (!nvv) return -1;
    *v = nvv;
    *cap = ncap;
  }
  sim_inst in = {.kind = kind, .nops = nops};
  in.ops = malloc((size_t)nops * sizeof *in.ops);
  in.roff = calloc((size_t)nops, sizeof *in.roff);
  in.rlen = calloc((size_t)nops, sizeof *in.rlen);
  if (from) in.from = malloc((size_t)nops * sizeof *in.from);
  if (!in.ops || !in.roff || !in.rlen || (from && !in.from)) {
    inst_free(&in);
    return -1;
  }
  memcpy(in.ops, ops, (size_t)nops * sizeof *ops);
  if (from) memcpy(in.from, from, (size_t)nops * sizeof *from);
  (*v)[(*nv)++] = in;
  return 0;
}

/* The deposited part of rank r's list: the ops of its head unit, which come first. */
static shm_op *find_coll(sim_clique *q, int r, uint64_t idx) {
  shm_rank *rk = &q->h->rank[r];
  if (!rk->head) return NULL;
  uint64_t unit = SHM_OP(q, rk->head)->unit;
  for (shm_off off = rk->head; off; off = SHM_OP(q, off)->next) {
    shm_op *o = SHM_OP(q, off);
    if (o->unit != unit) break;
    if (is_coll_kind(o->kind) && o->idx == idx) return o;
  }
  return NULL;
}

static shm_op *find_recv(sim_clique *q, int r, int from, uint64_t idx) {
  shm_rank *rk = &q->h->rank[r];
  if (!rk->head) return NULL;
  uint64_t unit = SHM_OP(q, rk->head)->unit;
  for (shm_off off = rk->head; off; off = SHM_OP(q, off)->next) {
    shm_op *o = SHM_OP(q, off);
    if (o->unit != unit) break;
    if (o->kind == NCFSM_KIND_RECV && o->peer == from && o->idx == idx) return o;
  }
  return NULL;
}

/* ---- R11: an instance whose fingerprints differ across ranks -------------------------
 * Measured on NCCL 2.28.3 and 2.28.9 (docs/nccl-rules.md R11; 2 ranks, nonblocking,
 * after a correct AllReduce, 1-8 floats), with no async error on any rank:
 *   Broadcast root 0 / AllReduce      the root completes with its own data; the other hangs
 *   AllReduce count 4 / count 8       the smaller count completes; the larger hangs
 *   AllReduce float32 / int32         both complete
 *   Broadcast root 0 / root 1         both complete, each with its own data
 *   AllReduce sum / max               both complete, both with the sum (rank 0's operator)
 * The sim's model, for any number of ranks (beyond 2 ranks and these kinds
 * a model choice, docs/sim.md "R11 matching"). Classified in this order:
 *   op     the kinds differ: only the Broadcast roots complete (below);
 *   count  the sizes in bytes (count x type size) differ: the ops of the
 *          smallest size complete without data (their receive buffers stay
 *          as they were: what NCCL leaves there was not measured);
 *   root   a rooted kind, roots differ: for Broadcast, a rank that names a
 *          root which names itself gets that root's data, others hang; for
 *          Reduce, Gather and Scatter every rank hangs;
 *   silent only the type and/or the reduction operator differ: every rank
 *          completes with the result of rank 0's op (its type and operator).
 * In every case a Broadcast rank that is its own root only sends: it
 * completes with its own data. NCFSM_SIM_MISMATCH=hang (SIM_MISMATCH_HANG)
 * keeps only that rule: everything else hangs. The plan depends only on the
 * fingerprints, so whichever process runs it decides the same, and after a
 * crash the same plan is made again; the ops that complete are committed
 * through one commit record (all of them or none). */
typedef struct mm_plan {
  const char *what; /* the mismatch, for the log */
  int silent;       /* every rank completes with rank 0's op's result (INST_COLL) */
  int ndone;        /* the ops that complete (INST_PART) */
} mm_plan;

static size_t op_bytes(const shm_op *o) {
  size_t b;
  return mul_ok((size_t)o->count, ncfsm__sim_dtype_size(o->dtype), &b) ? b : SIZE_MAX;
}

/* ops[r]: rank r's op of the instance. done[0..ndone) and from[]: the ops
 * that complete and whose send data each receives (NULL: none). */
static void plan_mismatch(uint32_t mode, shm_op *const *ops, int n, mm_plan *pl, shm_op **done,
                          shm_op **from) {
  int kind = 0, bytes = 0, count = 0, dtype = 0, root = 0, redop = 0;
  size_t b0 = op_bytes(ops[0]), minb = b0;
  for (int r = 1; r < n; r++) {
    const shm_op *o = ops[r];
    size_t b = op_bytes(o);
    kind |= o->kind != ops[0]->kind;
    bytes |= b != b0;
    count |= o->count != ops[0]->count;
    dtype |= o->dtype != ops[0]->dtype;
    root |= o->root != ops[0]->root;
    redop |= o->redop != ops[0]->redop;
    if (b < minb) minb = b;
  }
  root &= !kind && is_rooted(ops[0]->kind);
  redop &= !kind && is_reducing(ops[0]->kind);
  pl->what = kind     ? "op"
             : bytes  ? (count ? (dtype ? "count and dtype" : "count") : "dtype size")
             : root   ? "root"
             : dtype  ? (redop ? "dtype and redop" : "dtype")
                      : "redop";
  pl->silent = mode == SIM_MISMATCH_NCCL && !kind && !bytes && !root;
  pl->ndone = 0;
  if (pl->silent) return;
  for (int r = 0; r < n; r++) {
    shm_op *o = ops[r], *f = NULL;
    int completes = 0;
    if (o->kind == NCFSM_KIND_BROADCAST && o->root == r) { /* a root only sends */
      completes = 1;
      f = o;
    } else if (mode == SIM_MISMATCH_NCCL && !kind) {
      if (bytes) {
        completes = op_bytes(o) == minb; /* without data */
      } else if (root && o->kind == NCFSM_KIND_BROADCAST && o->root >= 0 && o->root < n &&
                 ops[o->root]->root == o->root) {
        completes = 1; /* its root sends */
        f = ops[o->root];
      }
    }
    if (completes) {
      done[pl->ndone] = o;
      from[pl->ndone++] = f;
    }
  }
}

/* Log the instance's mismatch once (INFO, subsystem SIM): NCCL reports nothing. */
static void note_mismatch(uint32_t mode, uint64_t idx, shm_op *const *ops, int n, const mm_plan *pl,
                          shm_op *const *done, shm_op *const *from) {
  int noted = 1;
  for (int r = 0; r < n; r++) {
    noted &= (ops[r]->flags & SHM_OP_NOTED) != 0;
    ops[r]->flags |= SHM_OP_NOTED;
  }
  if (noted) return;
  char buf[1024];
  size_t len = 0;
  for (int r = 0; r < n && len < sizeof buf; r++) {
    const shm_op *o = ops[r];
    char fate[64] = "hangs";
    if (pl->silent) snprintf(fate, sizeof fate, "completes with rank 0's result");
    for (int k = 0; k < pl->ndone; k++)
      if (done[k] == o) {
        if (from[k] == o) snprintf(fate, sizeof fate, "completes with its own data");
        else if (from[k]) snprintf(fate, sizeof fate, "completes with rank %d's data", (int)from[k]->rank);
        else snprintf(fate, sizeof fate, "completes, receive buffer untouched");
      }
    char extra[32] = "";
    if (is_rooted(o->kind)) snprintf(extra, sizeof extra, " root %d", (int)o->root);
    else if (is_reducing(o->kind))
      snprintf(extra, sizeof extra, " %s", ncfsm_redop_name((ncfsm_redop_t)o->redop));
    int w = snprintf(buf + len, sizeof buf - len, "%srank %d %s count %llu %s%s: %s", r ? "; " : "", r,
                     ncfsm_opkind_name((ncfsm_opkind_t)o->kind), (unsigned long long)o->count,
                     ncfsm_dtype_name((ncfsm_dtype_t)o->dtype), extra, fate);
    if (w < 0) break;
    len += (size_t)w;
  }
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: collective %llu: %s mismatch across ranks, no error reported (R11%s): %s",
             (unsigned long long)idx, pl->what, mode == SIM_MISMATCH_HANG ? ", NCFSM_SIM_MISMATCH=hang" : "",
             buf);
}

/* One step over the whole clique; returns the number of instances executed. */
static int execute(sim_clique *q) {
  shm_hdr *h = q->h;
  int n = h->nranks, nv = 0, cap = 0, executed = 0;
  sim_inst *v = NULL;
  shm_op *ops[n > 0 ? n : 1];

  /* Collectives: every rank's op of instance idx must be deposited. */
  int all = 1;
  for (int r = 0; r < n; r++)
    if (!h->rank[r].head || h->rank[r].dead) all = 0;
  if (all) {
    uint64_t unit0 = SHM_OP(q, h->rank[0].head)->unit;
    for (shm_off off = h->rank[0].head; off; off = SHM_OP(q, off)->next) {
      shm_op *o = SHM_OP(q, off);
      if (o->unit != unit0) break;
      if (!is_coll_kind(o->kind) || !matchable(o)) continue;
      int ready = 1, same = 1;
      for (int r = 0; r < n && ready; r++) {
        ops[r] = r == 0 ? o : find_coll(q, r, o->idx);
        if (!matchable(ops[r])) ready = 0;
        else if (!same_fingerprint(ops[0], ops[r])) same = 0;
      }
      if (!ready) continue;
      if (same) {
        if (push_inst(&v, &nv, &cap, INST_COLL, ops, NULL, n)) goto out;
        continue;
      }
      /* R11 mismatch: some ranks complete (silently), the others hang */
      mm_plan pl;
      shm_op *done[n > 0 ? n : 1], *from[n > 0 ? n : 1];
      plan_mismatch(h->mismatch, ops, n, &pl, done, from);
      note_mismatch(h->mismatch, o->idx, ops, n, &pl, done, from);
      if (pl.silent) {
        if (push_inst(&v, &nv, &cap, INST_COLL, ops, NULL, n)) goto out;
      } else if (pl.ndone) {
        if (push_inst(&v, &nv, &cap, INST_PART, done, from, pl.ndone)) goto out;
      }
    }
  }

  /* Point-to-point: the j-th send r->p with the j-th recv on p from r. */
  for (int r = 0; r < n; r++) {
    shm_rank *rk = &h->rank[r];
    if (!rk->head || rk->dead) continue;
    uint64_t unit = SHM_OP(q, rk->head)->unit;
    for (shm_off off = rk->head; off; off = SHM_OP(q, off)->next) {
      shm_op *o = SHM_OP(q, off);
      if (o->unit != unit) break;
      if (o->kind != NCFSM_KIND_SEND || !matchable(o)) continue;
      int p = o->peer;
      if (p < 0 || p >= n || h->rank[p].dead) continue;
      shm_op *rv = find_recv(q, p, r, o->idx);
      if (!matchable(rv) || rv->count != o->count || rv->dtype != o->dtype) continue;
      shm_op *pair[2] = {o, rv};
      if (push_inst(&v, &nv, &cap, INST_P2P, pair, NULL, 2)) goto out;
    }
  }
  if (!nv) goto out;

  /* R12: the instances of one step run (and are copied back) in a seeded random order. */
  for (int i = nv - 1; i > 0; i--) {
    int j = (int)(rng_next(&h->rng) % (uint64_t)(i + 1));
    sim_inst t = v[i];
    v[i] = v[j];
    v[j] = t;
  }
  for (int i = 0; i < nv; i++) {
    int rc = compute(q, &v[i]);
    if (rc) continue; /* no room for the result yet: retried at the next step */
    /* Commit through the record, so that a process dying half-way leaves an
     * instance that the next lock holder completes (ncfsm__sim_shm_recover). */
    shm_journal *j = SHM_JRN(q);
    uint64_t *jo = SHM_JRN_OPS(q), *jr = SHM_JRN_ROFF(q), *jl = SHM_JRN_RLEN(q);
    j->nops = (uint32_t)v[i].nops;
    j->res = v[i].res;
    j->done_seq0 = h->done_seq + 1;
    for (int k = 0; k < v[i].nops; k++) {
      jo[k] = (shm_off)((char *)v[i].ops[k] - (char *)h);
      jr[k] = v[i].roff[k];
      jl[k] = v[i].rlen[k];
    }
    __atomic_store_n(&j->valid, 1, __ATOMIC_RELEASE);
    ncfsm__sim_shm_commit(q, 1);
    executed++;
  }

out:
  for (int i = 0; i < nv; i++) inst_free(&v[i]);
  free(v);
  return executed;
}

/* ---- collect: executed local ops get their results ------------------------------------- */

static int by_done_seq(const void *a, const void *b) {
  const sim_op *oa = *(sim_op *const *)a, *ob = *(sim_op *const *)b;
  uint64_t sa = SHM_OP(oa->c->q, oa->sh)->done_seq, sb = SHM_OP(ob->c->q, ob->sh)->done_seq;
  return sa < sb ? -1 : sa > sb;
}

static int collect(sim_clique *q) {
  size_t n = 0, cap = 0;
  sim_op **got = NULL;
  for (int r = 0; r < q->nranks; r++) {
    sim_comm *c = q->slot[r];
    sim_unit *u = c ? head_unit(c) : NULL;
    if (!u) continue;
    for (sim_op *o = u->head; o; o = o->next) {
      if (o->done || !o->sh || !(SHM_OP(q, o->sh)->flags & SHM_OP_DONE)) continue;
      if (n == cap) {
        size_t ncap = cap ? cap * 2 : 16;
        sim_op **ng = realloc(got, ncap * sizeof *ng);
        if (!ng) goto done; /* out of memory: collected at a later progress */
        got = ng;
        cap = ncap;
      }
      got[n++] = o;
    }
  }
  if (n > 1) qsort(got, n, sizeof *got, by_done_seq);
  for (size_t i = 0; i < n; i++) {
    sim_op *o = got[i];
    shm_op *s = SHM_OP(q, o->sh);
    if (s->res && s->res_len && o->a.recv)
      memmove(o->a.recv, (const char *)SHM_PTR(q, s->res) + s->res_off, (size_t)s->res_len);
    ncfsm__sim_shm_op_release(q, o->sh);
    o->sh = 0;
    op_complete(o, 1);
  }
done:
  free(got);
  return (int)n;
}

/* A dead peer process: unfinished work of live local ranks fails with
 * ncclRemoteError (NCCL reports a lost peer as a remote error). */
static void fail_on_dead_peers(sim_clique *q) {
  if (!q->h->ndead) return;
  for (int r = 0; r < q->nranks; r++) {
    sim_comm *c = q->slot[r];
    if (!c || c->peer_dead_seen) continue;
    int busy = c->staged != NULL || c->phase == SIM_PH_FINALIZE;
    for (sim_unit *u = c->units; u && !busy; u = u->next)
      if (u->ndone < u->n) busy = 1;
    if (!busy) continue;
    if (c->state != NCFSM__NCCL_SUCCESS && c->state != NCFSM__NCCL_IN_PROGRESS) continue;
    if (c->phase == SIM_PH_INIT || c->phase == SIM_PH_REVOKE || c->phase == SIM_PH_XCOMM)
      continue; /* a split/shrink/grow sees a dead member itself (sim.c, xop_ready) */
    c->peer_dead_seen = 1;
    c->state = NCFSM__NCCL_REMOTE_ERROR;
    c->phase = SIM_PH_NONE;
    c->armed = 0;
    c->poisoned = 0;
    int dead = -1;
    for (int p = 0; p < q->h->nranks && dead < 0; p++)
      if (q->h->rank[p].dead) dead = p;
    ncfsm__sim_cwarn(c, "sim: rank %d: peer rank %d (pid %d) died; unfinished operations cannot complete "
                    "(ncclRemoteError)", c->rank, dead, dead >= 0 ? (int)q->h->rank[dead].pid : -1);
  }
}

static void clique_progress(sim_clique *q) {
  if (ncfsm__sim_shm_lock(q)) return;
  ncfsm__sim_shm_check_peers(q);
  for (int guard = 0; guard < 1000000; guard++) {
    int moved = collect(q);
    for (int r = 0; r < q->nranks; r++)
      if (q->slot[r]) moved += deposit(q, q->slot[r]);
    moved += execute(q);
    if (!moved) break;
  }
  fail_on_dead_peers(q);
  ncfsm__sim_shm_unlock(q);
}

void ncfsm__sim_progress(void) {
  for (sim_clique *q = ncfsm__sim_cliques; q; q = q->next) clique_progress(q);
}
