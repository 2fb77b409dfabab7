/*
 * The sim's shared cliques: one POSIX shared-memory segment per unique id,
 * so that ranks in separate processes of one host (and ranks of one process
 * alike) form one clique. docs/sim.md, "Processes", describes the model.
 *
 * Segment: a header (shm_hdr: clique membership, a process-shared robust
 * mutex, the allocator), one shm_rank per rank, then the arena
 * (NCFSM_SIM_SHM_BYTES, default 256 MiB) that holds posted op descriptors,
 * deposited send data and results. The file is sparse: arena pages are
 * reserved with posix_fallocate as the allocator's high-water mark grows, so
 * a full /dev/shm is an allocation failure (ncclSystemError), never SIGBUS.
 *
 * Lifetime: created by whichever process arrives first (O_CREAT|O_EXCL; the
 * others open it and wait for `ready`); unlinked by the last live rank.
 * Crashes: a holder of the mutex that dies makes the next lock return
 * EOWNERDEAD: the next holder repairs whatever the dead one left half-done
 * (ncfsm__sim_shm_recover: op lists, references, the commit record of an
 * executing instance, counters, and the allocator rebuilt from the blocks
 * still referenced) and marks the dead process's ranks dead. Dead peer
 * processes are found by pid (kill 0, and /proc/<pid>/stat for zombies); a
 * segment whose processes are all gone is unlinked by the next process that
 * creates any sim clique (ncfsm__sim_shm_sweep) or tries to open the same name.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/sim/sim-internal.h"

#define E_SYSTEM NCFSM__NCCL_SYSTEM_ERROR
#define ALIGN SHM_ALIGN                 /* block and payload alignment */
#define BACK_CHUNK (1u << 20)           /* posix_fallocate granularity */
#define CHECK_NS (20ull * 1000 * 1000)  /* peer liveness check interval */

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

void ncfsm__sim_shm_name(const unsigned char *key, char *buf, size_t len) {
  char hex[2 * SIM_ID_KEY_LEN + 1];
  for (int i = 0; i < SIM_ID_KEY_LEN; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
  snprintf(buf, len, "/" SIM_SHM_PREFIX "%s", hex);
}

/* NCFSM_SIM_SHM_BYTES and NCFSM_SIM_MISMATCH, read by the process that
 * creates a clique (the init refused a bad value first: ncfsm__sim_call_opts). */
static uint64_t arena_bytes(void) { return round_up(ncfsm__sim_setting(NCFSM__SET_SIM_SHM_BYTES).u, 4096); }

static uint32_t mismatch_mode(void) {
  return ncfsm__sim_setting(NCFSM__SET_SIM_MISMATCH).u ? SIM_MISMATCH_HANG : SIM_MISMATCH_NCCL; /* nccl|hang */
}

/* A process that is gone (or a zombie: killed but not reaped). */
static int pid_dead(int pid) {
  if (pid <= 0) return 1;
  if (pid == (int)getpid()) return 0;
  if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0; /* no /proc: trust kill() */
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')');
  return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

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

static int ensure_backed(sim_clique *q, uint64_t end) {
  shm_hdr *h = q->h;
  if (end <= h->backed) return 0;
  uint64_t nb = round_up(end, BACK_CHUNK);
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
  uint64_t need = round_up((uint64_t)n, ALIGN) + ALIGN;
  shm_off *pp = &h->free_head;
  while (*pp) {
    shm_blk *b = SHM_PTR(q, *pp);
    if (b->size >= need) {
      shm_off off = *pp;
      uint64_t rest = b->size - need;
      int split = rest >= 2 * ALIGN;
      /* reserve the pages first: nothing changes when /dev/shm is full */
      if (ensure_backed(q, off + (split ? need + ALIGN : b->size))) goto nospc;
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
    if (off + ALIGN > h->backed && ensure_backed(q, off + ALIGN)) break; /* unreachable tail */
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

/* ---- the robust mutex --------------------------------------------------------- */

int ncfsm__sim_shm_lock(sim_clique *q) {
  shm_hdr *h = q->h;
  int rc = pthread_mutex_lock(&h->mu);
  if (rc == EOWNERDEAD) {
    int dead = h->owner_pid;
    pthread_mutex_consistent(&h->mu);
    h->owner_pid = (int)getpid();
    /* the dead holder may have left anything half-updated: repair first */
    int fixes = ncfsm__sim_shm_recover(q);
    if (fixes < 0) {
      ncfsm__sim_shm_unlock(q);
      return -1;
    }
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: process %d died holding the lock of %s; %d repair(s)", dead, q->name,
               fixes);
    if (dead != (int)getpid())
      for (int r = 0; r < h->nranks; r++)
        if (h->rank[r].used && h->rank[r].pid == dead)
          ncfsm__sim_shm_rank_dead(q, r, "its process died holding the clique's lock");
    return 0;
  }
  if (rc) {
    ncfsm__sim_warn("sim: the shared clique's lock is unusable: %s", strerror(rc));
    return -1;
  }
  h->owner_pid = (int)getpid();
  return 0;
}

void ncfsm__sim_shm_unlock(sim_clique *q) {
  q->h->owner_pid = 0;
  pthread_mutex_unlock(&q->h->mu);
}

void ncfsm__sim_shm_check_peers(sim_clique *q) {
  uint64_t now = ncfsm__now_ns();
  if (now < q->next_check_ns) return;
  q->next_check_ns = now + CHECK_NS;
  shm_hdr *h = q->h;
  for (int r = 0; r < h->nranks; r++) {
    shm_rank *rk = &h->rank[r];
    if (rk->used && rk->live && !rk->dead && pid_dead(rk->pid))
      ncfsm__sim_shm_rank_dead(q, r, "its process exited or was killed");
  }
}

/* ---- segments ---------------------------------------------------------------------- */

static uint32_t jrn_cap(int nranks) { return nranks > 2 ? (uint32_t)nranks : 2u; }
static size_t jrn_off(int nranks) {
  return (size_t)round_up(sizeof(shm_hdr) + (size_t)nranks * sizeof(shm_rank), ALIGN);
}
/* Header, ranks and the commit record (3 words per op), in whole pages. */
static size_t hdr_bytes(int nranks) {
  return (size_t)round_up(jrn_off(nranks) + sizeof(shm_journal) + 3 * sizeof(uint64_t) * jrn_cap(nranks),
                          4096);
}

/* Stale: every process that used it is gone (see the file comment). */
static int segment_stale(const shm_hdr *h, size_t mapped, time_t mtime) {
  if (mapped < sizeof *h || h->magic != SIM_SHM_MAGIC || h->version != SIM_SHM_VERSION ||
      !__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE))
    return time(NULL) - mtime > 10; /* a creator that died before it was ready */
  if (mapped < sizeof *h + (size_t)h->nranks * sizeof(shm_rank)) return 0;
  if (h->unlinked) return 1;
  if (!h->joined) return pid_dead(h->creator_pid);
  for (int r = 0; r < h->nranks; r++)
    if (h->rank[r].used && h->rank[r].live && !pid_dead(h->rank[r].pid)) return 0;
  return 1;
}

/* 1 when the named segment was stale and is now unlinked. */
static int unlink_if_stale(const char *name) {
  int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0) return 0;
  struct stat st;
  int stale = 0;
  if (fstat(fd, &st) == 0) {
    size_t len = st.st_size > (off_t)(64 << 10) ? (size_t)(64 << 10) : (size_t)st.st_size;
    if (len < sizeof(shm_hdr)) {
      stale = time(NULL) - st.st_mtime > 10;
    } else {
      /* only the reserved part may be read (the rest can be unbacked) */
      void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        const shm_hdr *h = p;
        size_t ok = len;
        if (h->magic == SIM_SHM_MAGIC && h->backed < ok) ok = (size_t)h->backed;
        stale = segment_stale(h, ok, st.st_mtime);
        munmap(p, len);
      }
    }
  }
  close(fd);
  if (stale && shm_unlink(name) == 0) {
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: removed stale shared clique %s", name);
    return 1;
  }
  return 0;
}

void ncfsm__sim_shm_sweep(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, SIM_SHM_PREFIX, strlen(SIM_SHM_PREFIX))) continue;
    char name[sizeof e->d_name + 2];
    name[0] = '/';
    memcpy(name + 1, e->d_name, strnlen(e->d_name, sizeof e->d_name - 1) + 1);
    unlink_if_stale(name);
  }
  closedir(d);
}

static int init_segment(sim_clique *q, int nranks, uint64_t seed, uint64_t arena) {
  shm_hdr *h = q->h;
  size_t hb = hdr_bytes(nranks);
  memset(h, 0, hb);
  h->magic = SIM_SHM_MAGIC;
  h->version = SIM_SHM_VERSION;
  h->creator_pid = (int)getpid();
  h->nranks = nranks;
  h->rng = seed;
  h->size = q->size;
  h->arena_off = hb;
  h->arena_len = arena;
  h->backed = hb;
  h->jrn_off = jrn_off(nranks);
  h->jcap = jrn_cap(nranks);
  h->mismatch = mismatch_mode();
  pthread_mutexattr_t ma;
  if (pthread_mutexattr_init(&ma) || pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED) ||
      pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST) || pthread_mutex_init(&h->mu, &ma))
    return -1;
  pthread_mutexattr_destroy(&ma);
  if (ensure_backed(q, hb + ALIGN)) return -1;
  shm_blk *b = SHM_PTR(q, hb);
  b->size = arena;
  b->next = 0;
  h->free_head = hb;
  __atomic_store_n(&h->ready, 1, __ATOMIC_RELEASE);
  return 0;
}

static void sleep_ms(int ms) {
  struct timespec ts = {0, (long)ms * 1000000L};
  nanosleep(&ts, NULL);
}

/* Open an existing segment and wait until its creator finished. 1: retry
 * (it vanished or was stale), 0: attached, -1: error (errno / WARN). */
static int open_existing(sim_clique *q) {
  int fd = shm_open(q->name, O_RDWR, 0);
  if (fd < 0) return errno == ENOENT ? 1 : -1;
  struct stat st;
  for (int i = 0;; i++) {
    if (fstat(fd, &st)) {
      close(fd);
      return -1;
    }
    if (st.st_size >= (off_t)sizeof(shm_hdr)) break;
    if (i >= 2000) { /* a creator that died between create and resize */
      close(fd);
      return unlink_if_stale(q->name) ? 1 : -1;
    }
    sleep_ms(1);
  }
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return -1;
  }
  shm_hdr *h = p;
  for (int i = 0; !__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE); i++) {
    if (i >= 2000) {
      munmap(p, (size_t)st.st_size);
      close(fd);
      return unlink_if_stale(q->name) ? 1 : -1;
    }
    sleep_ms(1);
  }
  if (h->magic != SIM_SHM_MAGIC || h->version != SIM_SHM_VERSION || h->size != (uint64_t)st.st_size) {
    munmap(p, (size_t)st.st_size);
    close(fd);
    errno = EPROTO;
    return -1;
  }
  q->fd = fd;
  q->h = h;
  q->size = (size_t)st.st_size;
  return 0;
}

int ncfsm__sim_shm_attach(const unsigned char *key, int nranks, uint64_t seed, sim_clique **out) {
  *out = NULL;
  sim_clique *q = calloc(1, sizeof *q);
  if (q) q->slot = calloc((size_t)nranks, sizeof *q->slot);
  if (!q || !q->slot) {
    if (q) free(q->slot);
    free(q);
    ncfsm__sim_warn("ncclCommInitRank: out of memory");
    return E_SYSTEM;
  }
  memcpy(q->key, key, SIM_ID_KEY_LEN);
  q->nranks = nranks;
  q->fd = -1;
  ncfsm__sim_shm_name(key, q->name, sizeof q->name);
  const char *what = "shm_open";
  for (int attempt = 0; attempt < 8; attempt++) {
    int fd = shm_open(q->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) { /* we create it */
      ncfsm__sim_shm_sweep(); /* and clean up after crashed cliques */
      uint64_t arena = arena_bytes();
      q->size = hdr_bytes(nranks) + (size_t)arena;
      q->fd = fd;
      what = "ftruncate";
      if (ftruncate(fd, (off_t)q->size) == 0) {
        what = "mmap";
        void *p = mmap(NULL, q->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) {
          q->h = p;
          what = "initialisation (posix_fallocate or mutex)";
          if (init_segment(q, nranks, seed, arena) == 0) goto attached;
          munmap(p, q->size);
          q->h = NULL;
        }
      }
      int err = errno;
      close(fd);
      shm_unlink(q->name);
      errno = err;
      break;
    }
    if (errno != EEXIST) break;
    int rc = open_existing(q);
    if (rc == 0) goto attached;
    what = "open of the existing segment";
    if (rc < 0) break;
    /* rc == 1: it vanished (its last rank left) or was stale: create it */
  }
  ncfsm__sim_warn("ncclCommInitRank: sim shared clique %s: %s failed: %s (NCFSM_SIM_SHM_BYTES, "
                  "/dev/shm space)", q->name, what, strerror(errno));
  free(q->slot);
  free(q);
  return E_SYSTEM;
attached:
  q->next = ncfsm__sim_cliques;
  ncfsm__sim_cliques = q;
  *out = q;
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: attached shared clique %s (%d ranks, %zu bytes)", q->name,
             q->h->nranks, q->size);
  return NCFSM__NCCL_SUCCESS;
}

void ncfsm__sim_shm_detach(sim_clique *q) {
  sim_clique **lists[] = {&ncfsm__sim_cliques, &ncfsm__sim_inherited};
  for (int i = 0; i < 2; i++)
    for (sim_clique **pp = lists[i]; *pp; pp = &(*pp)->next)
      if (*pp == q) {
        *pp = q->next;
        i = 2;
        break;
      }
  if (q->h) munmap(q->h, q->size);
  if (q->fd >= 0) close(q->fd);
  free(q->slot);
  free(q);
}
