/*
 * Execution of posted ops: matching across ranks and data movement.
 *
 * Matching (R11): the i-th collective posted by rank r is instance i on every
 * rank; the j-th send from r to p pairs with the j-th recv on p from r.
 * Each comm keeps its posted ops in launch units, one per group end. A
 * progress step looks at every rank's earliest unfinished unit; an instance
 * is executable when all of its ops are in those units. All executable
 * instances of a step run together, in an order shuffled by the clique's PRNG
 * (shuffle_seed), in two phases: every instance first computes its outputs
 * into scratch buffers (all reads), then the scratch buffers are copied to
 * the receive buffers (all writes). Ops of one group are thus unordered
 * (R12): three in-place AllReduces on one buffer in one group read the same
 * input and the result is wrong, as measured; separate launches are
 * separate units and run one after the other.
 *
 * A collective whose fingerprints differ across ranks never executes, except
 * that a Broadcast root completes locally (R11: a root may return while its
 * peers hang). Ops of a never_arrive rank are invisible to peers; an op hit
 * by an injected async error never executes (R10).
 */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/sim/sim-internal.h"

typedef enum { INST_COLL, INST_P2P, INST_LOCAL } inst_kind;

typedef struct sim_write {
  void *dst;
  const unsigned char *src; /* into the instance's scratch */
  size_t len;
} sim_write;

typedef struct sim_inst {
  inst_kind kind;
  int nops;
  sim_op **ops;         /* COLL: one per rank; P2P: send, recv; LOCAL: the root's op */
  unsigned char *scratch;
  sim_write *w;
  int nw;
  int ok;               /* outputs computed */
} sim_inst;

static int is_coll(const sim_op *o) {
  return o->a.kind != NCFSM_KIND_SEND && o->a.kind != NCFSM_KIND_RECV;
}
static int is_rooted(ncfsm_opkind_t k) {
  return k == NCFSM_KIND_BROADCAST || k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_GATHER ||
         k == NCFSM_KIND_SCATTER;
}
static int is_reducing(ncfsm_opkind_t k) {
  return k == NCFSM_KIND_ALLREDUCE || k == NCFSM_KIND_REDUCE || k == NCFSM_KIND_REDUCESCATTER;
}
static int matchable(const sim_op *o) { return o && !o->done && !o->invisible && !o->dead; }

/* R11 fingerprint equality (the seq is equal by construction). */
static int same_fingerprint(const sim_op *x, const sim_op *y) {
  if (x->a.kind != y->a.kind || x->a.count != y->a.count || x->a.dtype != y->a.dtype) return 0;
  if (is_rooted(x->a.kind) && x->a.root != y->a.root) return 0;
  if (is_reducing(x->a.kind) && x->a.redop != y->a.redop) return 0;
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
  for (sim_op *o = u->head; o; o = o->next) {
    o->unit = u;
    op_complete(o, 0);
  }
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

static sim_op *find_coll(sim_unit *u, uint64_t idx) {
  for (sim_op *o = u->head; o; o = o->next)
    if (is_coll(o) && o->idx == idx) return o;
  return NULL;
}

static sim_op *find_recv(sim_unit *u, int from, uint64_t idx) {
  for (sim_op *o = u->head; o; o = o->next)
    if (o->a.kind == NCFSM_KIND_RECV && o->a.peer == from && o->idx == idx) return o;
  return NULL;
}

/* ---- phase 1: compute outputs into scratch ---------------------------------- */

static int mul_ok(size_t a, size_t b, size_t *out) {
  if (a && b > SIZE_MAX / a) return 0;
  *out = a * b;
  return 1;
}

static void add_write(sim_inst *in, void *dst, const unsigned char *src, size_t len) {
  if (!len || !dst) return;
  in->w[in->nw++] = (sim_write){dst, src, len};
}

/* Returns 0 when the outputs are ready in in->scratch / in->w. */
static int compute(sim_inst *in) {
  sim_op **o = in->ops;
  int n = in->nops;
  const ncfsm__op *a0 = &o[0]->a;
  size_t es = ncfsm__sim_dtype_size(a0->dtype), cnt = a0->count, blk, all, sq;
  if (!mul_ok(cnt, es, &blk) || !mul_ok(blk, (size_t)n, &all) || !mul_ok(all, (size_t)n, &sq))
    return -1;
  in->w = calloc((size_t)n, sizeof *in->w);
  if (!in->w) return -1;
  if (!blk) return 0; /* zero-count op: nothing to move */

  if (in->kind == INST_P2P || in->kind == INST_LOCAL) { /* send -> recv */
    sim_op *dst = in->kind == INST_P2P ? o[1] : o[0];
    if (!(in->scratch = malloc(blk))) return -1;
    memcpy(in->scratch, o[0]->a.send, blk);
    add_write(in, dst->a.recv, in->scratch, blk);
    return 0;
  }

  int root = a0->root;
  const void **ins = NULL;
  size_t scratch_len = a0->kind == NCFSM_KIND_ALLTOALL ? sq
                       : (a0->kind == NCFSM_KIND_ALLGATHER || a0->kind == NCFSM_KIND_REDUCESCATTER ||
                          a0->kind == NCFSM_KIND_GATHER || a0->kind == NCFSM_KIND_SCATTER)
                           ? all
                           : blk;
  if (!(in->scratch = malloc(scratch_len))) return -1;
  if (is_reducing(a0->kind) && !(ins = malloc((size_t)n * sizeof *ins))) return -1;
  unsigned char *sc = in->scratch;

  switch (a0->kind) {
  case NCFSM_KIND_ALLREDUCE:
    for (int r = 0; r < n; r++) ins[r] = o[r]->a.send;
    ncfsm__sim_reduce(sc, ins, n, cnt, a0->dtype, a0->redop);
    for (int r = 0; r < n; r++) add_write(in, o[r]->a.recv, sc, blk);
    break;
  case NCFSM_KIND_REDUCE:
    for (int r = 0; r < n; r++) ins[r] = o[r]->a.send;
    ncfsm__sim_reduce(sc, ins, n, cnt, a0->dtype, a0->redop);
    add_write(in, o[root]->a.recv, sc, blk);
    break;
  case NCFSM_KIND_REDUCESCATTER: /* rank r gets the reduction of block r */
    for (int r = 0; r < n; r++) {
      for (int p = 0; p < n; p++) ins[p] = (const char *)o[p]->a.send + (size_t)r * blk;
      ncfsm__sim_reduce(sc + (size_t)r * blk, ins, n, cnt, a0->dtype, a0->redop);
      add_write(in, o[r]->a.recv, sc + (size_t)r * blk, blk);
    }
    break;
  case NCFSM_KIND_BROADCAST:
    memcpy(sc, o[root]->a.send, blk);
    for (int r = 0; r < n; r++) add_write(in, o[r]->a.recv, sc, blk);
    break;
  case NCFSM_KIND_ALLGATHER: /* rank-major */
    for (int r = 0; r < n; r++) memcpy(sc + (size_t)r * blk, o[r]->a.send, blk);
    for (int r = 0; r < n; r++) add_write(in, o[r]->a.recv, sc, all);
    break;
  case NCFSM_KIND_ALLTOALL: /* recv[r] block p = send[p] block r */
    for (int r = 0; r < n; r++)
      for (int p = 0; p < n; p++)
        memcpy(sc + (size_t)r * all + (size_t)p * blk, (const char *)o[p]->a.send + (size_t)r * blk,
               blk);
    for (int r = 0; r < n; r++) add_write(in, o[r]->a.recv, sc + (size_t)r * all, all);
    break;
  case NCFSM_KIND_GATHER:
    for (int r = 0; r < n; r++) memcpy(sc + (size_t)r * blk, o[r]->a.send, blk);
    add_write(in, o[root]->a.recv, sc, all);
    break;
  case NCFSM_KIND_SCATTER:
    memcpy(sc, o[root]->a.send, all);
    for (int r = 0; r < n; r++) add_write(in, o[r]->a.recv, sc + (size_t)r * blk, blk);
    break;
  default:
    free(ins);
    return -1;
  }
  free(ins);
  return 0;
}

/* ---- one progress step of one clique ------------------------------------------ */

static int push_inst(sim_inst **v, int *nv, int *cap, inst_kind kind, sim_op **ops, int nops) {
  if (*nv == *cap) {
    int ncap = *cap ? *cap * 2 : 8;
    sim_inst *nvv = realloc(*v, (size_t)ncap * sizeof *nvv);
    if (!nvv) return -1;
    *v = nvv;
    *cap = ncap;
  }
  sim_op **cp = malloc((size_t)nops * sizeof *cp);
  if (!cp) return -1;
  memcpy(cp, ops, (size_t)nops * sizeof *cp);
  (*v)[(*nv)++] = (sim_inst){.kind = kind, .nops = nops, .ops = cp};
  return 0;
}

/* Returns the number of instances executed. */
static int clique_step(sim_clique *q) {
  int n = q->nranks, nv = 0, cap = 0, executed = 0;
  sim_inst *v = NULL;
  sim_unit **cur = calloc((size_t)n, sizeof *cur);
  sim_op **ops = calloc((size_t)n, sizeof *ops);
  if (!cur || !ops) goto out;

  int all = 1;
  for (int r = 0; r < n; r++) {
    cur[r] = q->slot[r] ? head_unit(q->slot[r]) : NULL;
    if (!cur[r]) all = 0;
  }

  /* Collectives: every rank's op of instance idx must be in its current unit. */
  if (all) {
    for (sim_op *o = cur[0]->head; o; o = o->next) {
      if (!is_coll(o) || !matchable(o)) continue;
      int ready = 1, same = 1;
      for (int r = 0; r < n && ready; r++) {
        ops[r] = r == 0 ? o : find_coll(cur[r], o->idx);
        if (!matchable(ops[r])) ready = 0;
        else if (!same_fingerprint(ops[0], ops[r])) same = 0;
      }
      if (!ready) continue;
      if (same) {
        if (push_inst(&v, &nv, &cap, INST_COLL, ops, n)) goto out;
        continue;
      }
      /* R11 mismatch: never executes; a Broadcast root returns locally. */
      for (int r = 0; r < n; r++) {
        if (ops[r]->a.kind == NCFSM_KIND_BROADCAST && ops[r]->a.root == r) {
          NCFSM_INFO(NCFSM__SUB_SIM, "sim: collective %llu mismatches across ranks; broadcast root %d "
                     "completes locally, peers hang (R11)", (unsigned long long)o->idx, r);
          if (push_inst(&v, &nv, &cap, INST_LOCAL, &ops[r], 1)) goto out;
        }
      }
    }
  }

  /* Point-to-point: the j-th send r->p with the j-th recv on p from r. */
  for (int r = 0; r < n; r++) {
    if (!cur[r]) continue;
    for (sim_op *o = cur[r]->head; o; o = o->next) {
      if (o->a.kind != NCFSM_KIND_SEND || !matchable(o)) continue;
      int p = o->a.peer;
      if (p < 0 || p >= n || !cur[p]) continue;
      sim_op *rv = find_recv(cur[p], r, o->idx);
      if (!matchable(rv) || rv->a.count != o->a.count || rv->a.dtype != o->a.dtype) continue;
      sim_op *pair[2] = {o, rv};
      if (push_inst(&v, &nv, &cap, INST_P2P, pair, 2)) goto out;
    }
  }
  if (!nv) goto out;

  /* R12: the instances of one step run in a seeded random order. */
  for (int i = nv - 1; i > 0; i--) {
    int j = (int)(rng_next(&q->rng) % (uint64_t)(i + 1));
    sim_inst t = v[i];
    v[i] = v[j];
    v[j] = t;
  }
  for (int i = 0; i < nv; i++) v[i].ok = compute(&v[i]) == 0; /* phase 1: all reads */
  for (int i = 0; i < nv; i++)                                 /* phase 2: all writes */
    if (v[i].ok)
      for (int k = 0; k < v[i].nw; k++) memmove(v[i].w[k].dst, v[i].w[k].src, v[i].w[k].len);
  for (int i = 0; i < nv; i++) {
    if (!v[i].ok) continue;
    for (int k = 0; k < v[i].nops; k++) op_complete(v[i].ops[k], 1);
    executed++;
  }

out:
  for (int i = 0; i < nv; i++) {
    free(v[i].ops);
    free(v[i].scratch);
    free(v[i].w);
  }
  free(v);
  free(cur);
  free(ops);
  return executed;
}

void ncfsm__sim_progress(void) {
  for (sim_clique *q = ncfsm__sim_cliques; q; q = q->next)
    while (clique_step(q) > 0) {
    }
}
