/*
 * The end of a sim communicator (docs/sim.md R4, R5, R6): finalize (it
 * flushes the comm's posted work), destroy (only from ncclSuccess; a refused
 * one leaves the thread's group mode dirty), abort (always legal) and
 * revoke (stops in-flight work; InProgress until quiescent).
 */
#include "core/log.h"
#include "core/sim/sim-comm.h"
#include "core/sim/sim-faults.h"

/* NCCL 2.31.2 (pytorch#194679): ncclCommShrink(NCCL_SHRINK_ABORT) resets the
 * parent's abort flag before it returns, and commDestroySync (run by
 * ncclCommFinalize and ncclCommDestroy) waits in an untimed intra-node
 * barrier unless the abort flag is set; the excluded ranks aborted their
 * parent and never arrive, so a survivor's finalize or destroy of that parent
 * never ends. Up to 2.30.7 it ended; the sim refuses it there instead (R7). */
static int barrier_hangs(const sim_comm *c) { return c->shrink_aborted && ncfsm__sim_version() >= 23102; }

static void barrier_warn(sim_comm *c, const char *call) {
  ncfsm__sim_cwarn(c, "%s: rank %d: the parent of an NCCL_SHRINK_ABORT shrink did not return within %lld ms (sim, "
                  "NCFSM_SIM_WAIT_MS): since NCCL 2.31.2 its commDestroySync waits in an untimed intra-node "
                  "barrier for the excluded ranks, which aborted it and never arrive; NCCL blocks for ever "
                  "(pytorch#194679). Abort such a parent, never finalize or destroy it (R7)",
                  call, c->rank, ncfsm__sim_wait_ms());
}

int ncfsm__sim_finalize(void *bcomm) {
  LOCK();
  int implicit = ncfsm__sim_implicit_begin(), rc = OK;
  sim_comm *c = ncfsm__sim_comm_of(bcomm);
  if (!c) {
    ncfsm__sim_warn("ncclCommFinalize : comm argument is NULL or not a sim communicator");
    rc = E_ARG;
  } else {
    c->st.finalizes++;
    if (ncfsm__sim_foreign(c)) {
      rc = ncfsm__sim_foreign_reject(c, "ncclCommFinalize");
    } else if (c->state == IN_PROGRESS) {
      ncfsm__sim_cwarn(c, R2_WARN); /* R2, and R4: a second finalize while the first runs */
      rc = E_ARG;
    } else if (c->shrink_aborted && !barrier_hangs(c)) {
      ncfsm__sim_cwarn(c, "ncclCommFinalize: " SHRUNK_WARN);
      rc = E_USAGE;
    } else if (c->state != OK) {
      rc = c->state;
    } else if (c->revoked) {
      ncfsm__sim_cwarn(c, "ncclCommFinalize: not allowed after ncclCommRevoke (R6)");
      rc = E_USAGE;
    } else if (c->finalized) {
      ncfsm__sim_cwarn(c, "ncclCommFinalize: comm already finalized"); /* R4 */
      rc = E_ARG;
    } else if (!c->blocking) { /* a barrier_hangs parent: InProgress for ever (sim_launch.c) */
      c->state = IN_PROGRESS; /* R1, R4 */
      c->phase = SIM_PH_FINALIZE;
      c->countdown = ncfsm__sim_fault_phase(c, SIM_PH_FINALIZE, c->o.finalize_polls, 0);
      c->armed = 1;
      rc = IN_PROGRESS;
    } else { /* blocking: flush outstanding work before returning */
      uint64_t deadline = ncfsm__sim_deadline();
      for (;;) {
        ncfsm__sim_progress();
        if (!ncfsm__sim_unfinished(c) && !c->shrink_aborted) {
          c->finalized = 1;
          break;
        }
        if (ncfsm__now_ns() >= deadline) {
          if (c->shrink_aborted) barrier_warn(c, "ncclCommFinalize");
          else ncfsm__sim_cwarn(c, "ncclCommFinalize: outstanding operations never completed (sim)");
          c->state = rc = E_SYSTEM;
          break;
        }
        ncfsm__sim_nap();
      }
    }
    if (rc != OK && rc != IN_PROGRESS) ncfsm__sim_group_fail(c, rc);
  }
  if (!c) ncfsm__sim_group_fail(NULL, rc);
  int grc = ncfsm__sim_implicit_end(implicit);
  if (implicit && grc != OK && grc != IN_PROGRESS && rc == OK) rc = grc;
  UNLOCK();
  return rc;
}

int ncfsm__sim_destroy(void *bcomm) {
  LOCK();
  int implicit = ncfsm__sim_implicit_begin(), rc = OK, dirty = 0;
  sim_comm *c = ncfsm__sim_comm_of(bcomm);
  if (!c) {
    ncfsm__sim_warn("ncclCommDestroy : comm argument is NULL or not a sim communicator");
    rc = E_ARG;
    ncfsm__sim_group_fail(NULL, rc);
  } else if (ncfsm__sim_foreign(c)) {
    c->st.destroys++;
    rc = ncfsm__sim_foreign_reject(c, "ncclCommDestroy");
    ncfsm__sim_group_fail(c, rc);
  } else if (c->shrink_aborted && c->state != IN_PROGRESS) {
    c->st.destroys++; /* R7: the parent of a NCCL_SHRINK_ABORT shrink must be aborted */
    if (barrier_hangs(c)) { /* NCCL never returns; the sim, after NCFSM_SIM_WAIT_MS, with the comm alive */
      NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d: ncclCommDestroy of a parent shrunk with NCCL_SHRINK_ABORT blocks "
                 "(NCCL >= 2.31.2)", c->rank);
      uint64_t deadline = ncfsm__sim_deadline();
      while (ncfsm__now_ns() < deadline) ncfsm__sim_nap();
      barrier_warn(c, "ncclCommDestroy");
      c->state = rc = E_SYSTEM;
    } else {
      ncfsm__sim_cwarn(c, "ncclCommDestroy: " SHRUNK_WARN);
      rc = E_USAGE;
    }
    ncfsm__sim_group_fail(c, rc);
  } else if (c->state != OK) {
    /* R4: destroy is only legal in ncclSuccess. Rejected without destroying;
     * the thread's group mode is left dirty (measured cascade). */
    c->st.destroys++;
    if (c->state == IN_PROGRESS) ncfsm__sim_cwarn(c, R2_WARN);
    else
      ncfsm__sim_cwarn(c, "ncclCommDestroy: communicator is in error state %s; use ncclCommAbort (R4)",
                      ncfsm__sim_res_name(c->state));
    rc = E_ARG;
    ncfsm__sim_group_fail(c, rc);
    dirty = 1;
  } else {
    c->st.destroys++;
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d destroyed", c->rank);
    ncfsm__sim_comm_close(c);
  }
  ncfsm__sim_implicit_end(implicit);
  if (dirty) ncfsm__sim_group_leave_dirty(); /* R4 cascade: the next nonblocking init here fails */
  UNLOCK();
  return rc;
}

int ncfsm__sim_abort(void *bcomm) {
  LOCK();
  int rc = OK;
  sim_comm *c = ncfsm__sim_comm_of(bcomm);
  if (!c) {
    ncfsm__sim_warn("ncclCommAbort : comm argument is NULL or not a sim communicator");
    rc = E_ARG;
  } else { /* R5: always legal, never blocks; unexecuted ops drain without data */
    c->st.aborts++;
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d aborted", c->rank);
    ncfsm__sim_comm_close(c);
  }
  UNLOCK();
  return rc;
}

int ncfsm__sim_revoke(void *bcomm, int flags) {
  (void)flags;
  LOCK();
  int rc = OK;
  sim_comm *c = ncfsm__sim_comm_of(bcomm);
  if (!c) {
    ncfsm__sim_warn("ncclCommRevoke : comm argument is NULL or not a sim communicator");
    rc = E_ARG;
  } else if (ncfsm__sim_foreign(c)) {
    c->st.revokes++;
    c->st.rejected++;
    rc = ncfsm__sim_foreign_reject(c, "ncclCommRevoke");
  } else if (c->st.revokes++, ncfsm__sim_version() < 22807 || !c->o.has_revoke) {
    /* R6: the modelled runtime has no ncclCommRevoke (2.28.3) */
    ncfsm__sim_cwarn(c, "ncclCommRevoke not available (NCCL %d, needs >= 2.28.7) (R6)",
                    c->o.has_revoke ? ncfsm__sim_version() : 22803);
    c->st.rejected++;
    rc = E_USAGE;
  } else if (c->shrink_aborted) {
    ncfsm__sim_cwarn(c, "ncclCommRevoke: " SHRUNK_WARN);
    c->st.rejected++;
    rc = E_USAGE;
  } else if (c->phase == SIM_PH_INIT) {
    ncfsm__sim_cwarn(c, "ncclCommRevoke: communicator is still initializing (sim)");
    c->st.rejected++;
    rc = E_USAGE;
  } else {
    /* R6: stop in-flight work; InProgress until quiescent. An async error stays. */
    c->revoke_prev = (c->state == OK || c->state == IN_PROGRESS) ? OK : c->state;
    ncfsm__sim_drop_ops(c);
    if (c->xop) { /* a split/shrink/grow in progress is given up on this rank: no child */
      ncfsm__sim_xop_free(c->xop);
      c->xop = NULL;
    }
    c->poisoned = 0;
    c->revoked = 1;
    if (c->blocking) {
      c->phase = SIM_PH_NONE;
      c->state = c->revoke_prev;
    } else {
      c->state = IN_PROGRESS;
      c->phase = SIM_PH_REVOKE;
      c->countdown = ncfsm__sim_fault_phase(c, SIM_PH_REVOKE, c->o.revoke_polls, 0);
      c->armed = 1;
      rc = IN_PROGRESS;
    }
  }
  UNLOCK();
  return rc;
}

