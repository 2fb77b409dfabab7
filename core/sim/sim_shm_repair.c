/*
 * A sim clique's segment after a process died holding its lock (sim_shm.c;
 * docs/sim.md "A dead rank"): ncfsm__sim_shm_recover rebuilds whatever the
 * dead holder may have left half-done from what is still referenced, and
 * ncfsm__sim_shm_check, which the tests call, verifies every invariant of
 * the segment. Both run with the segment's robust mutex held.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/log.h"
#include "core/sim/sim-internal.h"

#define ALIGN SHM_ALIGN /* block and payload alignment */

/* ---- recovery after a lock holder died ------------------------------------------- */

/* One bit per ALIGN unit of the arena. */
typedef struct bitmap {
  uint64_t *w;
  uint64_t base, units;
} bitmap;

static int bm_get(const bitmap *b, uint64_t off) {
  uint64_t u = (off - b->base) / ALIGN;
  return (int)((b->w[u / 64] >> (u % 64)) & 1);
}
static void bm_set(bitmap *b, uint64_t off) {
  uint64_t u = (off - b->base) / ALIGN;
  b->w[u / 64] |= 1ull << (u % 64);
}
/* Any unit of [off, off + len) set? */
static int bm_any(const bitmap *b, uint64_t off, uint64_t len) {
  for (uint64_t o = off; o < off + len; o += ALIGN)
    if (bm_get(b, o)) return 1;
  return 0;
}
static void bm_set_range(bitmap *b, uint64_t off, uint64_t len) {
  for (uint64_t o = off; o < off + len; o += ALIGN) bm_set(b, o);
}
static int bm_init(bitmap *b, const shm_hdr *h) {
  b->base = h->arena_off;
  b->units = h->arena_len / ALIGN;
  b->w = calloc((size_t)(b->units + 63) / 64, sizeof *b->w);
  return b->w ? 0 : -1;
}

/* p is the payload of an allocated block of at least min bytes, inside the
 * arena's reserved pages. */
static int block_ok(const shm_hdr *h, const sim_clique *q, shm_off p, uint64_t min) {
  uint64_t lo = h->arena_off, hi = h->arena_off + h->arena_len;
  if (p < lo + ALIGN || p >= hi || (p - lo) % ALIGN) return 0;
  if (p > h->backed) return 0; /* its header is in reserved pages */
  const shm_blk *b = SHM_PTR(q, p - ALIGN);
  if (b->next != SHM_BLK_USED || b->size < ALIGN + min || b->size % ALIGN) return 0;
  uint64_t end = p - ALIGN + b->size;
  return end <= hi && end <= h->backed && end > p - ALIGN;
}

static uint64_t blk_size(const sim_clique *q, shm_off p) {
  return ((const shm_blk *)SHM_PTR(q, p - ALIGN))->size;
}

/* Claim the block of payload p in `used`: 0, or -1 when it overlaps a block
 * claimed before. */
static int claim(const sim_clique *q, bitmap *used, shm_off p) {
  uint64_t len = blk_size(q, p);
  if (bm_any(used, p - ALIGN, len)) return -1;
  bm_set_range(used, p - ALIGN, len);
  return 0;
}

/* Rank r's op list, cut at its first invalid link, claimed in `used`, its
 * prev links and tail rewritten. Returns the repairs made. */
static int relink_rank(sim_clique *q, int r, bitmap *used) {
  shm_hdr *h = q->h;
  shm_rank *rk = &h->rank[r];
  int fixes = 0;
  shm_off prev = 0, off = rk->head;
  while (off) {
    shm_op *o = SHM_OP(q, off);
    if (!block_ok(h, q, off, sizeof(shm_op)) || o->rank != r || claim(q, used, off)) {
      if (prev) SHM_OP(q, prev)->next = 0;
      else rk->head = 0;
      fixes++;
      break;
    }
    if (o->prev != prev) {
      o->prev = prev;
      fixes++;
    }
    prev = off;
    off = o->next;
  }
  if (rk->tail != prev) {
    rk->tail = prev;
    fixes++;
  }
  return fixes;
}

int ncfsm__sim_shm_recover(sim_clique *q) {
  shm_hdr *h = q->h;
  int fixes = 0;
  bitmap used = {0}, res_seen = {0};
  if (bm_init(&used, h) || bm_init(&res_seen, h)) {
    free(used.w);
    ncfsm__sim_warn("sim: out of memory while repairing the shared clique %s", q->name);
    return -1;
  }
  /* 1. an instance that was being committed: apply it to all of its ops */
  shm_journal *j = SHM_JRN(q);
  if (j->valid) {
    int ok = j->nops <= h->jcap && (!j->res || block_ok(h, q, j->res, sizeof(uint64_t)));
    for (uint32_t k = 0; ok && k < j->nops; k++) ok = block_ok(h, q, SHM_JRN_OPS(q)[k], sizeof(shm_op));
    if (ok) ncfsm__sim_shm_commit(q, 0); /* its inputs are freed by the rebuild below */
    else j->valid = 0;
    fixes++;
  }
  /* 2. the op lists */
  for (int r = 0; r < h->nranks; r++) fixes += relink_rank(q, r, &used);
  /* 3. the blocks the ops refer to; result blocks are shared and refcounted */
  for (int r = 0; r < h->nranks; r++)
    for (shm_off off = h->rank[r].head; off; off = SHM_OP(q, off)->next) {
      shm_op *o = SHM_OP(q, off);
      if (o->send && (!block_ok(h, q, o->send, o->send_len) || claim(q, &used, o->send))) {
        o->send = 0; /* freed or never filled: this op can no longer execute */
        o->send_len = 0;
        if (!(o->flags & SHM_OP_DONE)) o->flags |= SHM_OP_DEAD;
        fixes++;
      }
      if (o->res) {
        if (block_ok(h, q, o->res, sizeof(uint64_t)) && bm_get(&res_seen, o->res)) {
          (*(uint64_t *)SHM_PTR(q, o->res))++;
        } else if (block_ok(h, q, o->res, sizeof(uint64_t)) && claim(q, &used, o->res) == 0) {
          bm_set(&res_seen, o->res);
          *(uint64_t *)SHM_PTR(q, o->res) = 1;
        } else {
          o->res = 0;
          o->res_off = o->res_len = 0;
          fixes++;
        }
      }
    }
  /* 4. the allocator: every unclaimed run of the arena is one free block */
  uint64_t nused = 0, nfree_blocks = 0;
  shm_off first = 0, last = 0;
  for (uint64_t u = 0; u < used.units;) {
    uint64_t off = used.base + u * ALIGN;
    if (bm_get(&used, off)) {
      nused += ALIGN;
      u++;
      continue;
    }
    uint64_t v = u;
    while (v < used.units && !bm_get(&used, used.base + v * ALIGN)) v++;
    if (off + ALIGN > h->backed && ncfsm__sim_shm_back(q, off + ALIGN)) break; /* unreachable tail */
    shm_blk *b = SHM_PTR(q, off);
    b->size = (v - u) * ALIGN;
    b->next = 0;
    if (last) ((shm_blk *)SHM_PTR(q, last))->next = off;
    else first = off;
    last = off;
    nfree_blocks++;
    u = v;
  }
  if (h->free_head != first || h->used != nused) fixes++;
  h->free_head = first;
  h->used = nused;
  free(used.w);
  free(res_seen.w);
  /* 5. membership counters */
  int joined = 0, live = 0, ndead = 0;
  for (int r = 0; r < h->nranks; r++) {
    shm_rank *rk = &h->rank[r];
    joined += rk->used != 0;
    live += rk->used && rk->live && !rk->dead;
    ndead += rk->dead != 0;
  }
  if (h->joined != joined || h->live != live || h->ndead != ndead) fixes++;
  h->joined = joined;
  h->live = live;
  h->ndead = ndead;
  /* 6. ranks that died before: nothing of theirs stays (the holder may have died releasing them) */
  for (int r = 0; r < h->nranks; r++)
    if (h->rank[r].dead && h->rank[r].head) {
      while (h->rank[r].head) ncfsm__sim_shm_op_release(q, h->rank[r].head);
      fixes++;
    }
  h->recoveries++;
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: repaired %s: %d fix(es); %llu bytes in use, %llu free block(s)",
             q->name, fixes, (unsigned long long)h->used, (unsigned long long)nfree_blocks);
  return fixes;
}

#define BAD(...)                                \
  do {                                          \
    snprintf(why, why_len, __VA_ARGS__);        \
    goto out;                                   \
  } while (0)

int ncfsm__sim_shm_check(sim_clique *q, char *why, size_t why_len) {
  shm_hdr *h = q->h;
  int rc = -1;
  bitmap used = {0}, res_seen = {0};
  if (why && why_len) why[0] = '\0';
  if (bm_init(&used, h) || bm_init(&res_seen, h)) BAD("out of memory");
  if (SHM_JRN(q)->valid) BAD("a commit record is left valid");
  uint64_t claimed = 0;
  for (int r = 0; r < h->nranks; r++) {
    shm_rank *rk = &h->rank[r];
    shm_off prev = 0;
    for (shm_off off = rk->head; off; off = SHM_OP(q, off)->next) {
      shm_op *o = SHM_OP(q, off);
      if (!block_ok(h, q, off, sizeof(shm_op))) BAD("rank %d: op %llu is not an allocated block", r, (unsigned long long)off);
      if (o->rank != r) BAD("rank %d: op %llu says rank %d", r, (unsigned long long)off, (int)o->rank);
      if (o->prev != prev) BAD("rank %d: op %llu: prev link %llu, expected %llu", r, (unsigned long long)off,
                               (unsigned long long)o->prev, (unsigned long long)prev);
      if (claim(q, &used, off)) BAD("rank %d: op %llu overlaps another block (or a cycle)", r, (unsigned long long)off);
      claimed += blk_size(q, off);
      prev = off;
    }
    if (rk->tail != prev) BAD("rank %d: tail %llu, expected %llu", r, (unsigned long long)rk->tail,
                              (unsigned long long)prev);
    if (rk->dead && rk->head) BAD("rank %d is dead but still has posted ops", r);
  }
  for (int r = 0; r < h->nranks; r++)
    for (shm_off off = h->rank[r].head; off; off = SHM_OP(q, off)->next) {
      shm_op *o = SHM_OP(q, off);
      if (o->send) {
        if (!block_ok(h, q, o->send, o->send_len) || claim(q, &used, o->send))
          BAD("op %llu: send block %llu is not allocated or overlaps", (unsigned long long)off,
              (unsigned long long)o->send);
        claimed += blk_size(q, o->send);
      }
      if (o->res && !bm_get(&res_seen, o->res)) {
        if (!block_ok(h, q, o->res, sizeof(uint64_t)) || claim(q, &used, o->res))
          BAD("op %llu: result block %llu is not allocated or overlaps", (unsigned long long)off,
              (unsigned long long)o->res);
        bm_set(&res_seen, o->res);
        claimed += blk_size(q, o->res);
        uint64_t n = 0;
        for (int p = 0; p < h->nranks; p++)
          for (shm_off x = h->rank[p].head; x; x = SHM_OP(q, x)->next) n += SHM_OP(q, x)->res == o->res;
        if (*(uint64_t *)SHM_PTR(q, o->res) != n)
          BAD("result block %llu: %llu reference(s) counted, %llu found", (unsigned long long)o->res,
              (unsigned long long)*(uint64_t *)SHM_PTR(q, o->res), (unsigned long long)n);
      }
    }
  if (claimed != h->used) BAD("used is %llu, the referenced blocks hold %llu", (unsigned long long)h->used,
                              (unsigned long long)claimed);
  uint64_t freed = 0, prev_end = 0;
  for (shm_off off = h->free_head; off; off = ((shm_blk *)SHM_PTR(q, off))->next) {
    const shm_blk *b = SHM_PTR(q, off);
    if (off < h->arena_off || off + ALIGN > h->arena_off + h->arena_len || off + ALIGN > h->backed ||
        (off - h->arena_off) % ALIGN)
      BAD("free block %llu is outside the arena", (unsigned long long)off);
    if (b->next == SHM_BLK_USED) BAD("free block %llu is marked allocated", (unsigned long long)off);
    if (b->size < ALIGN || b->size % ALIGN || off + b->size > h->arena_off + h->arena_len)
      BAD("free block %llu has size %llu", (unsigned long long)off, (unsigned long long)b->size);
    if (prev_end && off <= prev_end)
      BAD("free block %llu is out of order or not merged with its predecessor", (unsigned long long)off);
    if (bm_any(&used, off, b->size)) BAD("free block %llu overlaps an allocated one", (unsigned long long)off);
    bm_set_range(&used, off, b->size);
    freed += b->size;
    prev_end = off + b->size;
    if (freed > h->arena_len) BAD("the free list is longer than the arena (a cycle)");
  }
  if (freed + h->used != h->arena_len)
    BAD("%llu bytes free + %llu used != arena of %llu (leaked blocks)", (unsigned long long)freed,
        (unsigned long long)h->used, (unsigned long long)h->arena_len);
  int joined = 0, live = 0, ndead = 0;
  for (int r = 0; r < h->nranks; r++) {
    joined += h->rank[r].used != 0;
    live += h->rank[r].used && h->rank[r].live && !h->rank[r].dead;
    ndead += h->rank[r].dead != 0;
  }
  if (h->joined != joined || h->live != live || h->ndead != ndead)
    BAD("counters joined/live/dead %d/%d/%d, ranks say %d/%d/%d", (int)h->joined, (int)h->live,
        (int)h->ndead, joined, live, ndead);
  rc = 0;
out:
  free(used.w);
  free(res_seen.w);
  return rc;
}
#undef BAD
