/*
 * The rendezvous of a sim split, shrink or grow (R7, R8; docs/sim.md "Split,
 * shrink, grow and dead ranks", "Across processes"): each member publishes
 * its record in the parent clique's segment; once every member did, each
 * computes its child from the records alone (the same in every process: the
 * child's clique key is derived from the parent's key, the kind, the
 * per-kind call number and the color or the exclude list, or comes from the
 * grow id), makes it as an init of that clique and writes it to *child. A
 * blocking parent's group end waits for all of it here.
 */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/sim/sim-comm.h"
#include "core/sim/sim-faults.h"

/* Grow cliques this process had a rank of (a ring): a joiner that arrives
 * once such a clique is gone here is refused (ids are single-use). */
static unsigned char g_grow_done[64][SIM_ID_KEY_LEN];
static unsigned g_grow_done_n;

int ncfsm__sim_grow_done(const unsigned char *key) {
  unsigned n = g_grow_done_n < 64 ? g_grow_done_n : 64;
  for (unsigned i = 0; i < n; i++)
    if (!memcmp(g_grow_done[i], key, SIM_ID_KEY_LEN)) return 1;
  return 0;
}

void ncfsm__sim_grow_mark(const unsigned char *key) {
  if (ncfsm__sim_grow_done(key)) return;
  memcpy(g_grow_done[g_grow_done_n % 64], key, SIM_ID_KEY_LEN);
  g_grow_done_n++;
}

static uint64_t mix64(uint64_t z) { /* splitmix64's finalizer */
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The child clique's key, from what every member knows alike. */
static void derive_key(const unsigned char *parent, int tag, uint64_t n, uint64_t v, unsigned char *out) {
  uint64_t a, b;
  memcpy(&a, parent, 8);
  memcpy(&b, parent + 8, 8);
  uint64_t s = mix64(mix64((uint64_t)tag) ^ mix64(n) ^ mix64(v ^ 0x5bd1e995ull));
  uint64_t k0 = mix64(a ^ s), k1 = mix64(b ^ mix64(s ^ k0));
  memcpy(out, &k0, 8);
  memcpy(out + 8, &k1, 8);
}

void ncfsm__sim_xop_free(sim_xop *x) {
  if (!x) return;
  free(x->exclude);
  free(x);
}

uint64_t ncfsm__sim_exclude_hash(const int *exclude, int n) {
  uint64_t hh = 0xcbf29ce484222325ull; /* FNV-1a of the sorted list */
  for (int i = 0; i < n; i++) hh = (hh ^ (uint64_t)(uint32_t)exclude[i]) * 0x100000001b3ull;
  return mix64(hh ^ (uint64_t)n);
}

static int excluded(const sim_xop *x, int r) {
  for (int i = 0; i < x->nexclude; i++)
    if (x->exclude[i] == r) return 1;
  return 0;
}

int ncfsm__sim_grow_used(sim_comm *c, const unsigned char *key) {
  if (!c->q || ncfsm__sim_shm_lock(c->q)) return 0;
  shm_hdr *h = c->q->h;
  int used = 0;
  unsigned n = h->grow_used_n < 4 ? h->grow_used_n : 4;
  for (unsigned i = 0; i < n; i++) used |= !memcmp(h->grow_used[i], key, SIM_ID_KEY_LEN);
  ncfsm__sim_shm_unlock(c->q);
  return used;
}

/* Publish this rank's record in the parent's segment (a dead rank's never
 * reaches its peers) and put the parent in the split/shrink/grow phase,
 * armed or waited for at the outermost group end. Takes x. */
int ncfsm__sim_xop_start(sim_comm *c, sim_xop *x) {
  sim_clique *q = c->q;
  if (!q || ncfsm__sim_shm_lock(q)) {
    ncfsm__sim_xop_free(x);
    return E_SYSTEM;
  }
  shm_hdr *h = q->h;
  shm_rank *rk = &h->rank[c->rank];
  x->n = rk->xn[x->kind];
  if (!c->o.dead) {
    shm_xrec *r = &rk->x[x->kind][x->n % 2];
    memset(r, 0, sizeof *r);
    switch (x->kind) {
    case SIM_X_SPLIT:
      r->a = x->color;
      r->b = x->key;
      break;
    case SIM_X_SHRINK: r->hash = x->hash; break;
    default:
      r->a = x->grow_nranks;
      r->b = x->has_id;
      if (x->has_id) {
        memcpy(r->key, x->grow_key, SIM_ID_KEY_LEN);
        memcpy(h->grow_used[h->grow_used_n % 4], x->grow_key, SIM_ID_KEY_LEN); /* single-use */
        h->grow_used_n++;
      }
      break;
    }
    r->seq = x->n + 1;
    rk->xn[x->kind] = x->n + 1;
    x->published = 1;
  }
  ncfsm__sim_shm_unlock(q);
  c->xop = x;
  x->in_group = 1;
  c->phase = SIM_PH_XCOMM;
  c->state = IN_PROGRESS;
  c->countdown = ncfsm__sim_fault_phase(c, SIM_PH_XCOMM, c->o.split_polls, 0);
  c->armed = 0;
  ncfsm__sim_group_join(c);
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d %s (call %llu)%s", c->rank, ncfsm__sim_xcall[x->kind],
             (unsigned long long)x->n, x->published ? "" : ": dead rank, never reaches its peers");
  return OK;
}

int ncfsm__sim_xop_ready(sim_comm *c) {
  sim_xop *x = c->xop;
  if (!x) return -E_SYSTEM;
  if (!x->published) return 0; /* a dead rank: its call never completes */
  sim_clique *q = c->q;
  if (!q || ncfsm__sim_shm_lock(q)) return -E_SYSTEM;
  ncfsm__sim_shm_check_peers(q);
  shm_hdr *h = q->h;
  const char *call = ncfsm__sim_xcall[x->kind];
  int waiting = 0, err = 0, holders = 0;
  for (int p = 0; p < h->nranks && !err; p++) {
    if (x->kind == SIM_X_SHRINK && excluded(x, p)) continue;
    const shm_rank *rk = &h->rank[p];
    if (rk->xn[x->kind] <= x->n) {
      if (rk->dead) {
        ncfsm__sim_cwarn(c, "sim: rank %d: parent rank %d (pid %d) died before calling %s; it cannot complete "
                        "(ncclRemoteError; shrink the parent with NCCL_SHRINK_ABORT, excluding it)", c->rank,
                        p, (int)rk->pid, call);
        err = E_REMOTE;
      }
      waiting = 1;
      continue;
    }
    const shm_xrec *r = &rk->x[x->kind][x->n % 2];
    if (r->seq != x->n + 1) {
      ncfsm__sim_cwarn(c, "%s: rank %d made a different number of %s calls on this communicator than rank %d "
                      "(sim: every member makes the same sequence of them)", call, p, call, c->rank);
      err = E_ARG;
    } else if (x->kind == SIM_X_SHRINK && r->hash != x->hash) {
      ncfsm__sim_cwarn(c, "ncclCommShrink: ranks %d and %d passed different exclude lists (R7)", c->rank, p);
      err = E_ARG;
    } else if (x->kind == SIM_X_GROW) {
      if (r->a != x->grow_nranks) {
        ncfsm__sim_cwarn(c, "ncclCommGrow: ranks %d and %d passed different nranks (%d, %d)", c->rank, p,
                        x->grow_nranks, (int)r->a);
        err = E_ARG;
      }
      if (r->b) {
        holders++;
        memcpy(x->grow_key, r->key, SIM_ID_KEY_LEN);
      }
    }
  }
  if (!err && !waiting && x->kind == SIM_X_GROW && holders != 1) {
    ncfsm__sim_cwarn(c, "ncclCommGrow: %d existing ranks passed the unique id; exactly one must (the rank that "
                    "made it with ncclCommGetUniqueId; the others pass NULL)", holders);
    err = E_ARG;
  }
  ncfsm__sim_shm_unlock(q);
  return err ? -err : !waiting;
}

int ncfsm__sim_xop_finish(sim_comm *c) {
  sim_xop *x = c->xop;
  sim_clique *q = c->q;
  unsigned char key[SIM_ID_KEY_LEN];
  int nranks = 0, rank = 0;
  if (ncfsm__sim_shm_lock(q)) return E_SYSTEM;
  shm_hdr *h = q->h;
  switch (x->kind) {
  case SIM_X_SPLIT:
    for (int p = 0; p < h->nranks; p++) {
      const shm_xrec *r = &h->rank[p].x[SIM_X_SPLIT][x->n % 2];
      if (r->a != x->color) continue;
      nranks++;
      if (r->b < x->key || (r->b == x->key && p < c->rank)) rank++; /* by key, then parent rank */
    }
    derive_key(q->key, 'S', x->n, (uint64_t)(uint32_t)x->color, key);
    break;
  case SIM_X_SHRINK:
    nranks = h->nranks - x->nexclude;
    rank = c->rank;
    for (int i = 0; i < x->nexclude; i++) rank -= x->exclude[i] < c->rank;
    derive_key(q->key, 'K', x->n, x->hash, key);
    break;
  default:
    nranks = x->grow_nranks;
    rank = c->rank;
    memcpy(key, x->grow_key, SIM_ID_KEY_LEN);
    break;
  }
  ncfsm__sim_shm_unlock(q);
  if (x->kind == SIM_X_SPLIT && x->color == NCFSM__SPLIT_NOCOLOR) {
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d split with NCCL_SPLIT_NOCOLOR: no child", c->rank);
    return OK; /* *child stays NULL */
  }
  sim_comm *child = NULL;
  int rc = ncfsm__sim_comm_make(&child, nranks, key, rank, x->blocking, x->device, &x->o, x->name,
                                ncfsm__sim_xcall[x->kind]);
  if (rc) return rc;
  if (x->kind == SIM_X_GROW) ncfsm__sim_grow_mark(key);
  if (!c->blocking || !child->blocking) child->armed = 1; /* polls its own init (R8) */
  x->child = child;
  *x->child_out = child;
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d %s done: child rank %d/%d", c->rank, ncfsm__sim_xcall[x->kind],
             rank, nranks);
  return OK;
}

/* Outermost group end, blocking parents: wait (lock released) until every
 * member called, make the children, then wait for the blocking children's
 * inits (every child rank made), at most NCFSM_SIM_WAIT_MS each. */
int ncfsm__sim_wait_xops(sim_comm *list) {
  uint64_t deadline = ncfsm__sim_deadline();
  for (;;) {
    int waiting = 0;
    for (sim_comm *c = list; c; c = c->grp_next) {
      sim_xop *x = c->xop;
      if (c->zombie || !c->blocking || !x || x->done || c->phase != SIM_PH_XCOMM) continue;
      int r = ncfsm__sim_xop_ready(c);
      if (!r) {
        waiting = 1;
        continue;
      }
      x->final = r > 0 ? ncfsm__sim_xop_finish(c) : -r;
      x->done = 1;
    }
    if (!waiting) break;
    if (ncfsm__now_ns() >= deadline) {
      ncfsm__sim_warn("ncclCommSplit/Shrink/Grow: peers never called within %lld ms (sim, NCFSM_SIM_WAIT_MS)",
                      ncfsm__sim_wait_ms());
      for (sim_comm *c = list; c; c = c->grp_next)
        if (!c->zombie && c->blocking && c->xop && !c->xop->done && c->phase == SIM_PH_XCOMM) {
          c->xop->done = 1;
          c->xop->final = E_SYSTEM;
          ncfsm__sim_warn_also(c);
        }
      break;
    }
    ncfsm__sim_nap();
  }
  deadline = ncfsm__sim_deadline();
  for (;;) { /* blocking children: ready once every child rank exists (blocking init) */
    int waiting = 0, late = ncfsm__now_ns() >= deadline;
    for (sim_comm *c = list; c; c = c->grp_next) {
      sim_xop *x = c->xop;
      sim_comm *ch = x ? x->child : NULL;
      if (c->zombie || !c->blocking || !ch || ch->armed || ch->phase != SIM_PH_INIT) continue;
      if (ch->q && ncfsm__sim_clique_joined(ch->q) < ch->nranks && !late) {
        waiting = 1;
        continue;
      }
      ch->phase = SIM_PH_NONE;
      if (ch->q && ncfsm__sim_clique_joined(ch->q) < ch->nranks) {
        ncfsm__sim_cwarn(c, "%s: the child's peers never arrived within %lld ms (sim, NCFSM_SIM_WAIT_MS)",
                        ncfsm__sim_xcall[x->kind], ncfsm__sim_wait_ms());
        ch->state = E_SYSTEM;
      } else if (ch->o.fail_init) {
        ch->state = ch->o.fail_init;
        ncfsm__sim_cwarn(c, "sim: injected init failure %s (rank %d)", ncfsm__sim_res_name(ch->state), ch->rank);
      } else {
        ch->state = OK;
      }
      if (ch->state != OK && !x->final) x->final = ch->state;
    }
    if (!waiting) break;
    ncfsm__sim_nap();
  }
  int rc = OK;
  for (sim_comm *c = list; c; c = c->grp_next) {
    sim_xop *x = c->xop;
    if (c->zombie || !c->blocking || !x || !x->done) continue;
    c->phase = SIM_PH_NONE;
    c->armed = 0;
    c->state = x->final == E_REMOTE ? E_REMOTE : OK; /* a dead peer; other failures are the call's */
    if (!rc) rc = x->final;
    ncfsm__sim_xop_free(x);
    c->xop = NULL;
  }
  return rc;
}

