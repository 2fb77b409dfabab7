/*
 * The sim's launches and phases (docs/sim.md, R1, R2, R13): posting a launch
 * unit (its ops reach their streams and become visible to peers; faults are
 * injected here), the drift limit that holds a launch, the end of an
 * InProgress phase, and the poll (ncclCommGetAsyncError) that counts a
 * phase's polls down and ends it once its condition holds.
 */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/sim/sim-comm.h"
#include "core/sim/sim-faults.h"

/* ---- posting --------------------------------------------------------------------------- */

/* Post a unit: its ops get their match indices, go on their streams, and
 * become visible to peers (sim_exec.c). Fault injection happens here. */
void ncfsm__sim_post(sim_comm *c, sim_unit *u) {
  if (!u) return;
  if (!u->n) {
    free(u);
    return;
  }
  if (c->fs) ncfsm__sim_fault_unit(c, u->n); /* an injected process death */
  sim_clique *q = c->q;
  int lr = q ? ncfsm__sim_shm_lock(q) : -1, locked = lr == 0;
  u->no = c->nunits++;
  for (sim_op *o = u->head; o; o = o->next) {
    o->unit = u;
    o->seq = c->nposted++;
    o->counted = 1; /* R13: launched, not executed yet */
    c->outstanding++;
    if (o->a.stream && ncfsm__sim_stream_enqueue(o->a.stream, &o->ticket) == 0)
      o->s = o->a.stream; /* else (out of memory): not tracked by the stream */
    switch (o->a.kind) {
    case NCFSM_KIND_SEND: o->idx = c->nsend[o->a.peer]++; break;
    case NCFSM_KIND_RECV: o->idx = c->nrecv[o->a.peer]++; break;
    default: o->idx = c->ncoll++; break;
    }
    int ferr = c->fs ? ncfsm__sim_fault_op(c, o->seq, o == u->head, o->a.kind != NCFSM_KIND_SEND &&
                                                                      o->a.kind != NCFSM_KIND_RECV)
                     : 0; /* the testing kit's faults (sim-faults.h) */
    if (c->o.never_arrive || c->o.dead) {
      o->invisible = 1; /* fault injection: peers never see this rank's ops (hang) */
    } else if ((c->o.async_error_at_op >= 0 && o->seq == (uint64_t)c->o.async_error_at_op) || ferr) {
      o->dead = 1; /* R10: the op hit by an async error never completes */
      c->state = ferr ? ferr : c->o.async_error_code ? c->o.async_error_code : E_REMOTE;
      ncfsm__sim_cwarn(c, "sim: injected async error %s at op %llu (%s, rank %d)", ncfsm__sim_res_name(c->state),
                      (unsigned long long)o->seq, ncfsm__sim_op_name(o->a.kind), c->rank);
    }
    /* its shared descriptor: what peers (in any process) match against */
    shm_off off = locked ? ncfsm__sim_shm_alloc(q, sizeof(shm_op), NULL) : 0;
    if (lr == SIM_LOCK_STALLED) {
      o->invisible = 1; /* a peer process is stopped holding the lock: peers never see it (hang) */
      continue;
    }
    if (!off) {
      o->dead = 1; /* never executes */
      if (c->state == OK) {
        c->state = E_SYSTEM;
        ncfsm__sim_cwarn(c, "sim: rank %d: no room in the clique's shared arena for an op descriptor "
                        "(NCFSM_SIM_SHM_BYTES)", c->rank);
      }
      continue;
    }
    shm_op *s = SHM_OP(q, off);
    memset(s, 0, sizeof *s);
    s->rank = c->rank;
    s->kind = (int32_t)o->a.kind;
    s->dtype = (int32_t)o->a.dtype;
    s->redop = (int32_t)o->a.redop;
    s->root = o->a.root;
    s->peer = o->a.peer;
    s->count = o->a.count;
    s->idx = o->idx;
    s->unit = u->no;
    s->flags = (o->invisible ? SHM_OP_INVISIBLE : 0) | (o->dead ? SHM_OP_DEAD : 0);
    if (c->fs) ncfsm__sim_fault_desc(c, o->seq, s); /* an injected mismatch (R11) */
    shm_rank *rk = &q->h->rank[c->rank];
    s->prev = rk->tail;
    if (rk->tail) SHM_OP(q, rk->tail)->next = off;
    else rk->head = off;
    rk->tail = off;
    o->sh = off;
  }
  if (locked) ncfsm__sim_shm_unlock(q);
  if (c->units_tail) c->units_tail->next = u;
  else c->units = u;
  c->units_tail = u;
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d posted %zu op(s)", c->rank, u->n);
}

/* ---- the drift limit (R13) ---------------------------------------------------------
 * Measured on 2.28.3 and 2.28.9: one thread, 2 nonblocking comms of one
 * clique; rank 0 alone got 1,022 launches final, the 1,023rd stayed
 * InProgress (no error) until the peer launched, then became final. The sim
 * counts each comm's launched ops that have not executed (matched by every
 * peer) yet; a launch that would raise that count above the comm's drift
 * limit (NCFSM_SIM_DRIFT_LIMIT, default 1022) is held: its group end stays
 * InProgress, and so do all the comms of that group end, which post together
 * once none of them is held (NCCL's group helper thread launches them all).
 * A launch onto a comm with nothing outstanding is never held, so a single
 * group larger than the limit still runs. */
int ncfsm__sim_drift_over(const sim_comm *c, size_t n) {
  if (c->drift_limit <= 0 || !n || !c->outstanding) return 0;
  return c->outstanding + n > (uint64_t)c->drift_limit;
}

void ncfsm__sim_lg_leave(sim_comm *c) {
  sim_lgroup *lg = c->lg;
  if (!lg) return;
  c->lg = NULL;
  for (int i = 0; i < lg->n; i++)
    if (lg->m[i] == c) lg->m[i] = NULL;
  if (--lg->live == 0) free(lg);
}

/* c itself when it has no group end. */
sim_comm *ncfsm__sim_launch_held_by(sim_comm *c) {
  if (!c->lg) return c->staged && ncfsm__sim_drift_over(c, c->staged->n) ? c : NULL;
  for (int i = 0; i < c->lg->n; i++) {
    sim_comm *m = c->lg->m[i];
    if (m && m->phase == SIM_PH_LAUNCH && m->staged && ncfsm__sim_drift_over(m, m->staged->n)) return m;
  }
  return NULL;
}

void ncfsm__sim_note_held(sim_comm *c, const sim_comm *by) {
  if (c->held) return;
  c->held = 1;
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d: launch held in progress: rank %d%s has %llu launched op(s) "
             "not matched by its peers, and %zu more would exceed the drift limit %lld (R13)", c->rank,
             by->rank, by == c ? "" : " of the same group end", (unsigned long long)by->outstanding,
             by->staged ? by->staged->n : (size_t)0, by->drift_limit);
}

int ncfsm__sim_launch_post(sim_comm *c) {
  sim_unit *u = c->staged;
  c->staged = NULL;
  c->held = 0;
  ncfsm__sim_lg_leave(c);
  c->state = OK;
  ncfsm__sim_post(c, u); /* may set an injected async error */
  return c->state;
}

void ncfsm__sim_phase_end(sim_comm *c, int final) {
  static const char *const phase_names[] = {"none", "init", "launch", "finalize", "revoke", "split/shrink/grow"};
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d %s done%s", c->rank, phase_names[c->phase],
             c->poisoned ? " (poisoned, R2)" : "");
  final = ncfsm__sim_fault_phase_end(c, final); /* an injected error (sim-faults.h) */
  c->phase = SIM_PH_NONE;
  c->armed = 0;
  if (c->poisoned && final == OK) final = E_ARG; /* R2 poisoning */
  c->poisoned = 0;
  c->state = final;
}

/* c's group end may launch: post every staged member, c last. */
static int launch_group(sim_comm *c) {
  if (c->lg)
    for (int i = 0; i < c->lg->n; i++) { /* c stays a member until its own post: lg lives */
      sim_comm *m = c->lg->m[i];
      if (m && m != c && m->phase == SIM_PH_LAUNCH && m->staged)
        ncfsm__sim_phase_end(m, ncfsm__sim_launch_post(m));
    }
  return ncfsm__sim_launch_post(c);
}

/* One poll of a comm's InProgress phase (R1): the first `countdown` polls
 * still return InProgress; a later one ends the phase once its condition holds. */
static void comm_tick(sim_comm *c) {
  if (c->phase == SIM_PH_NONE || !c->armed) return;
  if (c->countdown > 0) {
    c->countdown--;
    return;
  }
  int final = OK;
  switch (c->phase) {
  case SIM_PH_INIT:
    if (c->q && ncfsm__sim_clique_joined(c->q) < c->nranks) return; /* a missing rank keeps all waiting */
    if (c->o.fail_init) {
      final = c->o.fail_init;
      ncfsm__sim_cwarn(c, "sim: injected init failure %s (rank %d)", ncfsm__sim_res_name(final), c->rank);
    }
    break;
  case SIM_PH_FINALIZE:
    if (ncfsm__sim_unfinished(c)) return; /* R4: finalize flushes outstanding work */
    if (c->shrink_aborted) return;        /* NCCL >= 2.31.2: its barrier never completes (sim_close.c) */
    c->finalized = 1;
    break;
  case SIM_PH_LAUNCH: {
    sim_comm *by = ncfsm__sim_launch_held_by(c);
    if (by) { /* R13: InProgress, no error, until the peers caught up */
      ncfsm__sim_note_held(c, by);
      return;
    }
    if (c->lg) /* a slow rank injected by the testing kit holds its whole group end */
      for (int i = 0; i < c->lg->n; i++)
        if (c->lg->m[i] && c->lg->m[i] != c && ncfsm__sim_fault_holds(c->lg->m[i])) return;
    final = launch_group(c);
    break;
  }
  case SIM_PH_REVOKE: final = c->revoke_prev; break;
  case SIM_PH_XCOMM: { /* R7, R8: every member called; the child is made and written now */
    int r = ncfsm__sim_xop_ready(c);
    if (r == 0) return;
    final = r > 0 ? ncfsm__sim_xop_finish(c) : -r;
    ncfsm__sim_xop_free(c->xop);
    c->xop = NULL;
    break;
  }
  default: break;
  }
  ncfsm__sim_phase_end(c, final);
}

/* ---- poll ------------------------------------------------------------------------- */

int ncfsm__sim_get_async_error(void *bcomm, int *state) {
  LOCK();
  sim_comm *c = ncfsm__sim_comm_of(bcomm);
  int rc = OK;
  if (!c || !state) {
    ncfsm__sim_cwarn(c, "ncclCommGetAsyncError : comm argument is NULL or not a sim communicator");
    rc = E_ARG;
  } else if (ncfsm__sim_foreign(c)) {
    rc = ncfsm__sim_foreign_reject(c, "ncclCommGetAsyncError");
    *state = rc;
  } else {
    c->st.polls++;
    if (c->fs) ncfsm__sim_fault_poll(c); /* the testing kit's poll and time triggers */
    ncfsm__sim_progress();
    sim_phase before = c->phase;
    comm_tick(c);
    if (before != SIM_PH_NONE && c->phase == SIM_PH_NONE) ncfsm__sim_progress();
    *state = c->state;
  }
  UNLOCK();
  return rc;
}
