/*
 * The arena of a sim clique's segment (sim_shm.c; docs/sim.md "Processes"):
 * its allocator (first fit, an address-ordered free list, coalescing, pages
 * reserved as the high-water mark grows), the posted ops of each rank and
 * their release, a rank's death, the commit record of an executing instance,
 * and the crash hook the tests place inside these updates. Every function
 * here runs with the segment's robust mutex held.
 */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "core/sim/sim-internal.h"

#define ALIGN SHM_ALIGN       /* block and payload alignment */
#define BACK_CHUNK (1u << 20) /* posix_fallocate granularity */

/* ---- the crash hook (tests) ------------------------------------------------ */

int ncfsm__sim_crash_point;
static uint64_t g_crash_nth;

void ncfsm__sim_shm_crash_at(int point, uint64_t nth) {
  g_crash_nth = nth ? nth : 1;
  ncfsm__sim_crash_point = point;
}

void ncfsm__sim_crash_hit(int point) {
  if (point == ncfsm__sim_crash_point && --g_crash_nth == 0) _exit(SIM_CRASH_EXIT);
}

/* ---- allocator (first fit, address-ordered free list, coalescing) ---------- */

int ncfsm__sim_shm_back(sim_clique *q, uint64_t end) {
  shm_hdr *h = q->h;
  if (end <= h->backed) return 0;
  uint64_t nb = shm_round_up(end, BACK_CHUNK);
  if (nb > h->size) nb = h->size;
  int rc = posix_fallocate(q->fd, (off_t)h->backed, (off_t)(nb - h->backed));
  if (rc) {
    errno = rc;
    return -1;
  }
  h->backed = nb;
  return 0;
}

shm_off ncfsm__sim_shm_alloc(sim_clique *q, size_t n, int *nospace) {
  shm_hdr *h = q->h;
  if (nospace) *nospace = 0;
  if (n > h->arena_len) return 0;
  uint64_t need = shm_round_up((uint64_t)n, ALIGN) + ALIGN;
  shm_off *pp = &h->free_head;
  while (*pp) {
    shm_blk *b = SHM_PTR(q, *pp);
    if (b->size >= need) {
      shm_off off = *pp;
      uint64_t rest = b->size - need;
      int split = rest >= 2 * ALIGN;
      /* reserve the pages first: nothing changes when /dev/shm is full */
      if (ncfsm__sim_shm_back(q, off + (split ? need + ALIGN : b->size))) goto nospc;
      if (split) { /* the rest stays free */
        shm_blk *r = SHM_PTR(q, off + need);
        r->size = rest;
        r->next = b->next;
        b->size = need;
        SIM_CRASH_POINT(SIM_CRASH_ALLOC_SPLIT);
        *pp = off + need;
      } else {
        *pp = b->next;
      }
      b->next = SHM_BLK_USED;
      h->used += b->size;
      return off + ALIGN;
    }
    pp = &b->next;
  }
  return 0; /* the arena is full (for now) */
nospc:
  if (nospace) *nospace = errno ? errno : ENOSPC;
  return 0;
}

void ncfsm__sim_shm_free(sim_clique *q, shm_off p) {
  if (!p) return;
  shm_hdr *h = q->h;
  shm_off off = p - ALIGN;
  shm_blk *b = SHM_PTR(q, off);
  if (p < h->arena_off + ALIGN || p >= h->arena_off + h->arena_len || b->next != SHM_BLK_USED) {
    /* never give a block back twice: that would corrupt the free list */
    ncfsm__sim_warn("sim: internal error: freeing %llu, which is not an allocated block of %s "
                    "(ignored)", (unsigned long long)p, q->name);
    return;
  }
  h->used -= b->size;
  shm_off prev = 0, cur = h->free_head;
  while (cur && cur < off) {
    prev = cur;
    cur = ((shm_blk *)SHM_PTR(q, cur))->next;
  }
  b->next = cur;
  if (cur && off + b->size == cur) { /* merge with the next free block */
    shm_blk *nb = SHM_PTR(q, cur);
    b->size += nb->size;
    b->next = nb->next;
  }
  if (prev) {
    shm_blk *pb = SHM_PTR(q, prev);
    if (prev + pb->size == off) { /* merge into the previous one */
      pb->size += b->size;
      SIM_CRASH_POINT(SIM_CRASH_FREE_MERGE);
      pb->next = b->next;
    } else {
      pb->next = off;
    }
  } else {
    h->free_head = off;
  }
}

/* ---- posted ops ------------------------------------------------------------- */

static void result_unref(sim_clique *q, shm_off res) {
  if (!res) return;
  uint64_t *refs = SHM_PTR(q, res);
  if (--*refs == 0) ncfsm__sim_shm_free(q, res);
}

void ncfsm__sim_shm_op_release(sim_clique *q, shm_off off) {
  if (!off) return;
  shm_op *s = SHM_OP(q, off);
  shm_rank *rk = &q->h->rank[s->rank];
  if (s->prev) SHM_OP(q, s->prev)->next = s->next;
  else rk->head = s->next;
  SIM_CRASH_POINT(SIM_CRASH_UNLINK);
  if (s->next) SHM_OP(q, s->next)->prev = s->prev;
  else rk->tail = s->prev;
  ncfsm__sim_shm_free(q, s->send);
  result_unref(q, s->res);
  ncfsm__sim_shm_free(q, off);
}

void ncfsm__sim_shm_rank_dead(sim_clique *q, int r, const char *why) {
  shm_hdr *h = q->h;
  shm_rank *rk = &h->rank[r];
  if (!rk->used || rk->dead || !rk->live) return;
  rk->dead = 1;
  rk->live = 0;
  h->live--;
  h->ndead++;
  while (rk->head) ncfsm__sim_shm_op_release(q, rk->head);
  ncfsm__sim_warn("sim: rank %d of the clique (pid %d) is gone: %s", r, (int)rk->pid, why);
}

/* ---- the commit record of an executing instance ------------------------------------ */

void ncfsm__sim_shm_commit(sim_clique *q, int free_inputs) {
  shm_hdr *h = q->h;
  shm_journal *j = SHM_JRN(q);
  if (!__atomic_load_n(&j->valid, __ATOMIC_ACQUIRE)) return;
  const uint64_t *ops = SHM_JRN_OPS(q), *roff = SHM_JRN_ROFF(q), *rlen = SHM_JRN_RLEN(q);
  uint32_t n = j->nops <= h->jcap ? j->nops : 0;
  for (uint32_t k = 0; k < n; k++) {
    shm_op *o = SHM_OP(q, ops[k]);
    o->flags |= SHM_OP_DONE;
    o->done_seq = j->done_seq0 + k;
    if (free_inputs) ncfsm__sim_shm_free(q, o->send); /* inputs are consumed */
    o->send = 0;
    o->send_len = 0;
    o->res = j->res;
    o->res_off = j->res ? roff[k] : 0;
    o->res_len = j->res ? rlen[k] : 0;
    if (k == 0 && free_inputs) SIM_CRASH_POINT(SIM_CRASH_EXEC);
  }
  if (n && h->done_seq < j->done_seq0 + n - 1) h->done_seq = j->done_seq0 + n - 1;
  __atomic_store_n(&j->valid, 0, __ATOMIC_RELEASE);
}
