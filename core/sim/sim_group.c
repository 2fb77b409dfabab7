/*
 * The sim's thread-local groups (R3, as NCCL's group.cc): the depth, the
 * first error, the comms touched and the blocking mode of the calling
 * thread's open group, and the outermost group end, which launches the
 * group (or discards it on a stored error) and, for blocking comms, waits
 * for their inits, their splits, shrinks and grows, and their held launches.
 */
#include <stdlib.h>

#include "core/log.h"
#include "core/sim/sim-comm.h"
#include "core/sim/sim-faults.h"

static __thread int g_depth;         /* ncclGroupDepth */
static __thread int g_err;           /* ncclGroupError: first error of the open group */
static __thread int g_blocking = -1; /* ncclGroupBlocking: -1 unset, 0 nonblocking, 1 blocking */
static __thread int g_dirty;         /* g_blocking was left set by a refused destroy (R4) */
static __thread sim_comm *g_head;    /* comms touched by the open group */
static __thread uint64_t g_nstarts, g_nends; /* explicit calls in the open group (stats) */

static void group_track(sim_comm *c) {
  if (c->in_group) return;
  c->in_group = 1;
  c->grp_next = g_head;
  g_head = c;
}

void ncfsm__sim_group_join(sim_comm *c) {
  group_track(c);
  g_blocking = c->blocking;
}

void ncfsm__sim_group_forked(void) {
  for (sim_comm *c = g_head, *nx; c; c = nx) {
    nx = c->grp_next;
    c->grp_next = NULL;
    c->in_group = 0;
  }
  g_head = NULL;
  g_depth = 0;
  g_err = 0;
  g_blocking = -1;
  g_dirty = 0;
  g_nstarts = g_nends = 0;
}

/* A call failed: the group remembers the first error (ncclGroupErrCheck); a
 * nonblocking comm rejected with ncclInvalidArgument is poisoned at the
 * outermost group end (R2, R3). */
void ncfsm__sim_group_fail(sim_comm *c, int rc) {
  if (!g_err) g_err = rc;
  if (!c) return;
  c->st.rejected++;
  if (!c->blocking && rc == E_ARG) {
    c->arg_err = 1;
    group_track(c);
  }
}

/* R3: one group may not mix blocking and nonblocking comms. */
int ncfsm__sim_group_mode_check(int blocking) {
  if (g_blocking != -1 && g_blocking != blocking) {
    ncfsm__sim_warn(MIX_WARN);
    return E_ARG;
  }
  return OK;
}

int ncfsm__sim_group_op_mode_check(int blocking) {
  if (g_dirty) { /* inits check a mode left dirty by destroy; an op overwrites it */
    g_blocking = -1;
    g_dirty = 0;
  }
  return ncfsm__sim_group_mode_check(blocking);
}

void ncfsm__sim_group_leave_dirty(void) {
  g_blocking = 1;
  g_dirty = 1;
}

/* Outermost group end, blocking comms: their inits complete once every rank
 * of their cliques arrived (the lock is dropped while waiting). */
static int wait_blocking_inits(sim_comm *list) {
  uint64_t deadline = ncfsm__sim_deadline();
  for (;;) {
    int ready = 1;
    for (sim_comm *c = list; c; c = c->grp_next)
      if (!c->zombie && c->init_in_group && c->q && ncfsm__sim_clique_joined(c->q) < c->nranks) ready = 0;
    if (ready) break;
    if (ncfsm__now_ns() >= deadline) {
      ncfsm__sim_warn("ncclCommInitRank: peers never arrived within %lld ms (sim, NCFSM_SIM_WAIT_MS)",
                      ncfsm__sim_wait_ms());
      for (sim_comm *c = list; c; c = c->grp_next)
        if (!c->zombie && c->init_in_group) {
          c->init_in_group = 0;
          c->phase = SIM_PH_NONE;
          c->state = E_SYSTEM;
          ncfsm__sim_warn_also(c);
        }
      return E_SYSTEM;
    }
    ncfsm__sim_nap();
  }
  int rc = OK;
  for (sim_comm *c = list; c; c = c->grp_next) {
    if (c->zombie || !c->init_in_group) continue;
    c->init_in_group = 0;
    c->phase = SIM_PH_NONE;
    c->state = c->o.fail_init ? c->o.fail_init : OK;
    if (c->o.fail_init) {
      ncfsm__sim_cwarn(c, "sim: injected init failure %s (rank %d)", ncfsm__sim_res_name(c->state), c->rank);
      if (!rc) rc = c->state;
    }
  }
  return rc;
}

/* Outermost group end, blocking comms (R13): NCCL's group end does not return
 * while a launch is held; the sim waits (lock released, progress running)
 * until every staged blocking comm of the group is within its drift limit,
 * then posts them; after NCFSM_SIM_WAIT_MS it gives up with ncclSystemError
 * (real NCCL would wait for ever). */
static int wait_blocking_launches(sim_comm *list) {
  uint64_t deadline = 0;
  for (;;) {
    sim_comm *held = NULL;
    for (sim_comm *c = list; c && !held; c = c->grp_next)
      if (!c->zombie && c->blocking && c->staged && c->state == OK && ncfsm__sim_drift_over(c, c->staged->n))
        held = c;
    if (!held) break;
    uint64_t now = ncfsm__now_ns();
    if (!deadline) {
      deadline = ncfsm__sim_deadline();
      NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d: blocking launch waits: %llu launched op(s) not matched "
                 "by its peers, drift limit %lld (R13)", held->rank, (unsigned long long)held->outstanding,
                 held->drift_limit);
    }
    if (now >= deadline) {
      ncfsm__sim_warn("ncclGroupEnd: rank %d has %llu launched operations that its peers have not "
                      "matched; %zu more exceed the sim's drift limit %lld and its launch waited %lld ms "
                      "for the peers (NCFSM_SIM_DRIFT_LIMIT, NCFSM_SIM_WAIT_MS; R13: NCCL would wait for "
                      "ever)", held->rank, (unsigned long long)held->outstanding, held->staged->n,
                      held->drift_limit, ncfsm__sim_wait_ms());
      for (sim_comm *c = list; c; c = c->grp_next)
        if (!c->zombie && c->blocking && c->staged) {
          ncfsm__sim_unit_drop(c->staged);
          c->staged = NULL;
          if (c->state == OK) c->state = E_SYSTEM;
          ncfsm__sim_warn_also(c);
        }
      return E_SYSTEM;
    }
    ncfsm__sim_nap();
    ncfsm__sim_progress();
  }
  int rc = OK;
  for (sim_comm *c = list; c; c = c->grp_next) {
    if (c->zombie || !c->blocking || !c->staged) continue;
    sim_unit *u = c->staged;
    c->staged = NULL;
    if (c->state != OK) { /* e.g. a peer died while it waited */
      ncfsm__sim_unit_drop(u);
      if (!rc) rc = c->state;
      continue;
    }
    ncfsm__sim_post(c, u);
  }
  return rc;
}

/* Outermost group end, nonblocking comms: the nstaged comms of list whose
 * launch was staged form one launch group (R13). With group_end_inprogress
 * = 0 (2.22) a comm posts at once, unless the group is held. Returns 1 when
 * a comm stays InProgress. */
static int launch_stage(sim_comm *list, int nstaged) {
  sim_lgroup *lg = calloc(1, sizeof *lg + (size_t)nstaged * sizeof lg->m[0]);
  sim_comm *any = NULL;
  for (sim_comm *c = list; c; c = c->grp_next) {
    if (c->zombie || c->blocking || c->phase != SIM_PH_LAUNCH || !c->staged || c->lg) continue;
    any = c;
    if (lg && lg->n < nstaged) {
      lg->m[lg->n++] = c;
      c->lg = lg;
    }
  }
  if (lg) {
    lg->live = lg->n;
    if (!lg->n) free(lg);
  } /* out of memory: every comm is a launch of its own */
  if (!any) return 0;
  int ip = 0;
  sim_comm *by = any->lg ? ncfsm__sim_launch_held_by(any) : NULL;
  for (sim_comm *c = list; c; c = c->grp_next) {
    if (c->zombie || c->blocking || c->phase != SIM_PH_LAUNCH || !c->staged) continue;
    sim_comm *cby = c->lg ? by : ncfsm__sim_launch_held_by(c);
    if (!c->o.group_end_inprogress && !cby) {
      ncfsm__sim_phase_end(c, ncfsm__sim_launch_post(c)); /* 2.22: posted at once */
      continue;
    }
    if (cby) ncfsm__sim_note_held(c, cby);
    ip = 1;
  }
  return ip;
}

/* The outermost ncclGroupEnd (explicit, or the implicit group of a single
 * call): launches the group, or on a stored error discards it. */
static int group_finish(void) {
  int rc = g_err, any_ip = 0, any_blocking_init = 0, any_blocking_x = 0, nblocking = 0, nstaged = 0;
  sim_comm *list = g_head;
  uint64_t ns = g_nstarts, ne = g_nends;
  g_head = NULL; /* reset first: blocking waits below drop the lock */
  g_err = 0;
  g_blocking = -1;
  g_dirty = 0;
  g_nstarts = g_nends = 0;

  for (sim_comm *c = list; c; c = c->grp_next) {
    if (c->zombie) continue;
    c->st.group_starts += ns;
    c->st.group_ends += ne;
    if (rc) { /* R3: the group's ops never launch; argument errors poison */
      ncfsm__sim_unit_drop(c->pending);
      c->pending = NULL;
      if (c->init_in_group) {
        c->init_in_group = 0;
        c->phase = SIM_PH_NONE;
        c->state = rc;
      }
      if (c->xop && c->xop->in_group) { /* the split/shrink/grow is not made on this rank */
        ncfsm__sim_xop_free(c->xop);
        c->xop = NULL;
        c->phase = SIM_PH_NONE;
        c->state = OK;
      }
      if (c->arg_err) ncfsm__sim_poison(c);
      c->arg_err = 0;
      continue;
    }
    c->arg_err = 0;
    if (c->init_in_group) {
      if (c->blocking) {
        any_blocking_init = 1;
      } else { /* R1: init runs now, polls count down */
        c->init_in_group = 0;
        c->armed = 1;
        any_ip = 1;
      }
    }
    if (c->xop && c->xop->in_group) {
      c->xop->in_group = 0;
      if (c->blocking) {
        any_blocking_x = 1;
      } else { /* R1, R8: the parent polls split_polls times, then until every member called */
        c->armed = 1;
        any_ip = 1;
      }
    }
    if (c->pending) {
      sim_unit *u = c->pending;
      c->pending = NULL;
      if (c->staged) { /* cannot happen: ops are rejected while InProgress (R2) */
        ncfsm__sim_unit_drop(u);
        continue;
      }
      c->staged = u;
      if (c->blocking) {
        nblocking++; /* posted below, once not held (R13) */
      } else {
        /* R1 (2.28): the group end returns InProgress; ops post after launch_polls. */
        c->state = IN_PROGRESS;
        c->phase = SIM_PH_LAUNCH;
        c->countdown = ncfsm__sim_fault_phase(c, SIM_PH_LAUNCH,
                                              c->o.group_end_inprogress ? c->o.launch_polls : 0, u->n);
        c->armed = 1;
        nstaged++;
      }
    }
  }
  if (!rc && any_blocking_init) rc = wait_blocking_inits(list);
  if (any_blocking_x) {
    int xrc = ncfsm__sim_wait_xops(list);
    if (!rc) rc = xrc;
  }
  if (nblocking) {
    int brc = wait_blocking_launches(list);
    if (!rc) rc = brc;
  }
  if (nstaged) any_ip |= launch_stage(list, nstaged);
  if (!rc && any_ip) rc = IN_PROGRESS;
  for (sim_comm *c = list, *nx; c; c = nx) {
    nx = c->grp_next;
    c->grp_next = NULL;
    c->in_group = 0;
    if (c->zombie) ncfsm__sim_comm_free(c);
  }
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: group end -> %s", ncfsm__sim_res_name(rc));
  return rc;
}

int ncfsm__sim_group_start(void) {
  LOCK();
  g_depth++;
  g_nstarts++;
  UNLOCK();
  return OK;
}

int ncfsm__sim_group_end(void) {
  LOCK();
  int rc = OK;
  if (g_depth == 0) {
    ncfsm__sim_warn("ncclGroupEnd: not in a group call."); /* R3 */
    rc = E_USAGE;
  } else {
    g_nends++;
    if (--g_depth == 0) rc = group_finish(); /* only the outermost end launches (R3) */
  }
  UNLOCK();
  return rc;
}

/* Every call outside an explicit group is an implicit group of one
 * (ncclGroupStartInternal ... ncclGroupEndInternal). */
int ncfsm__sim_implicit_begin(void) {
  if (g_depth) return 0;
  g_depth = 1;
  return 1;
}
int ncfsm__sim_implicit_end(int implicit) {
  if (!implicit) return OK;
  g_depth = 0;
  return group_finish();
}


int ncfsm__sim_call_end(int implicit, sim_comm *c, int rc) {
  if (rc) ncfsm__sim_group_fail(c, rc);
  int blocking = c ? c->blocking : 0;
  int grc = ncfsm__sim_implicit_end(implicit);
  if (!rc) rc = implicit ? (blocking ? grc : c->state) : OK;
  return rc;
}
