/* EVERY ncfsm-mode expectation of the suite, in one place.
 *
 * The raw expectations (scen_*.c) come from the rules (docs/nccl-rules.md) and change when NCCL
 * does; these come from ncfsm's own semantics (the state table, the launcher,
 * the engine) and change when the engine does. When an engine change alters
 * a state name, a decision or a lifecycle rule, update the entry here (and
 * its `depends` line); nothing else in the suite encodes ncfsm's behaviour.
 * `ncfsm-conformance --list` prints each scenario with its `depends` line.
 *
 * An ncfsm row fails on any deviation from its entry below, except where
 * known.c documents a difference of the sim by design. */
#include <stdio.h>

#include "conformance.h"

const ncfsm_expect_t ncfsm_expectations[] = {
    {"init",
     {"init_all=OK", "INIT_QUEUED->READY,READY", "n/a", "healthy"},
     {0},
     "comm states: ncfsm_comm_init_all returns with both comms in INIT_IN_PROGRESS (the first name in async), "
     "then READY; a state before INIT_IN_PROGRESS (e.g. INIT_QUEUED) changes that name"},
    {"groupend_inprogress",
     {"6x group_end=OK works=OK bad=0", "LAUNCH_PENDING=6/6 ->READY", "ok", "healthy"},
     {0},
     "trace: one NCFSM_EV_LAUNCH_PENDING on rank 0 per outermost group end (6 group ends); works complete OK"},
    {"call_during_inprogress",
     {"ge1=OK second(in LAUNCH_IN_PROGRESS, DEFER):ops=OK,OK ge=OK", "works=OK,OK,OK,OK ->READY,READY",
      "first=ok second=ok", "healthy"},
     {0},
     "legality table: a collective on a comm in LAUNCH_IN_PROGRESS is DEFER (ncfsm_legality); the state is "
     "named LAUNCH_IN_PROGRESS while the backend group end is InProgress"},
    {"groupend_without_start",
     {"group_end=INVALID_USAGE msg=R3", "n/a", "n/a", "depth=0"},
     {0},
     "ncfsm_group_end at depth 0: NCFSM_ERR_INVALID_USAGE, 'R3' in the loop's last error"},
    {"nested_groups",
     {"ops=OK inner=OK,OK,OK (depth 1, GROUP_OPEN) outer=OK", "works=OK ->READY,READY", "ok", "healthy"},
     {0},
     "comm state GROUP_OPEN inside an open group; only the outermost ncfsm_group_end launches"},
    {"argerr_nonblocking",
     {"bcast=INVALID_ARGUMENT,INVALID_ARGUMENT ge=INVALID_ARGUMENT backend-calls=0 then ar:ops=OK,OK ge=OK",
      "works=OK,OK ->READY,READY", "ar=ok", "healthy"},
     {0},
     "argument checks before the backend (0 backend calls); the group end reports the error; the comm stays READY"},
    {"argerr_blocking",
     {"bcast=INVALID_ARGUMENT,INVALID_ARGUMENT ge=INVALID_ARGUMENT backend-calls=0 then ar:ops=OK,OK ge=OK",
      "works=OK,OK ->READY,READY", "ar=ok", "healthy"},
     {0},
     "as argerr_nonblocking, on blocking comms"},
    {"r12_same_buffer_group",
     {"group_end=OVERLAP backend-calls=0", "works=OVERLAP ->READY,READY", "unchanged", "healthy"},
     {0},
     "R12 overlap check at ncfsm_group_end: NCFSM_ERR_OVERLAP before the backend, works fail with OVERLAP"},
    {"r12_separate_launches",
     {"group_end=OK OK OK", "works=OK,OK,OK ->READY,READY", "ok", "healthy"},
     {0},
     "the launcher splits dependent submissions into ordered launches"},
    {"finalize_once",
     {"finalize=OK,OK wait=OK,OK", "DRAINING->FINALIZED,FINALIZED", "n/a", "finalized"},
     {0},
     "comm states: ncfsm_comm_finalize from READY (no works) leaves the comm in DRAINING (the first name in "
     "async), then FINALIZED; a new state in between (e.g. DRAINING) changes that name"},
    {"finalize_twice",
     {"finalize=OK,OK again(r0, in DRAINING)=ILLEGAL_STATE msg=R4", "->FINALIZED,FINALIZED", "n/a", "finalized"},
     {0},
     "legality table: finalize in DRAINING is NCFSM_ERR_ILLEGAL_STATE, '(R4)' in the comm's last error; the "
     "state right after the first finalize is FINALIZING"},
    {"destroy_after_finalize",
     {"finalize->FINALIZED destroy=OK,OK", "n/a", "n/a", "closed"},
     {0},
     "destroy rules: ncfsm_comm_destroy of a FINALIZED comm with no works is OK and closes it"},
    {"destroy_poisoned_cascade",
     {"finalize-again=ILLEGAL_STATE destroy-early=ILLEGAL_STATE destroy=OK,OK next:init+ar",
      "old=CLOSED,CLOSED next=READY,READY", "next-ar=ok", "healthy"},
     {0},
     "legality table and destroy rules: finalize again and destroy in FINALIZING are NCFSM_ERR_ILLEGAL_STATE; "
     "destroy once FINALIZED is OK (CLOSED); the next comm on the loop reaches READY and runs an AllReduce"},
    {"destroy_inprogress_cascade",
     {"finalize-again=ILLEGAL_STATE destroy-early=ILLEGAL_STATE destroy=OK,OK next:init+ar",
      "old=CLOSED,CLOSED next=READY,READY", "next-ar=ok", "healthy"},
     {0},
     "as destroy_poisoned_cascade (the ncfsm side of both rows is the same program)"},
    {"two_streams",
     {"ops=OK group_end=OK", "works=OK ->READY,READY", "ok", "healthy"},
     {0},
     "works on two streams of one comm in one group complete OK"},
    {"event_after_inprogress",
     {"group_end=OK works=OK,OK", "->READY,READY", "event-at-final=pending data-ok", "healthy"},
     {0},
     "completion event recorded only after the launch is final (R2): with timing on, ready_at_final is 0 on a "
     "device (the sim differs: known.c)"},
    {"revoke",
     {"revoke=OK,OK wait=OK,OK then ar=ILLEGAL_STATE destroy=OK,OK", "->REVOKED->CLOSED,CLOSED", "n/a", "closed"},
     {"revoke=UNSUPPORTED,UNSUPPORTED msg=R6", "->READY,READY", "n/a", "healthy"},
     "revoke rules: ncfsm_comm_revoke on an idle READY comm reaches REVOKED; a collective then is "
     "NCFSM_ERR_ILLEGAL_STATE; destroy from REVOKED is OK (CLOSED). No work is pending at the revoke, so the "
     "fate of unfinished works is not exercised. Without Revoke: NCFSM_ERR_UNSUPPORTED, 'R6', comm stays READY"},
    {"revoke_absent_sim",
     {0},
     {"revoke=UNSUPPORTED,UNSUPPORTED msg=R6", "->READY,READY", "n/a", "healthy"},
     "as revoke, on a sim runtime without Revoke (NCFSM_SIM_NCCL_VERSION=22803)"},
    {"revoke_absent_sim_knob",
     {0},
     {"revoke=UNSUPPORTED,UNSUPPORTED msg=R6", "->READY,READY", "n/a", "healthy"},
     "as revoke, on sim comms with has_revoke=0 (per-comm capability)"},
    {"mixed_blocking_nonblocking",
     {"ops=OK ge=INVALID_USAGE", "works(blk,nb)=GROUP,GROUP blk=READY,READY nb=READY,READY", "blk=wrong nb=wrong",
      "healthy"},
     {0},
     "R3 check at ncfsm_group_end: a group mixing blocking and nonblocking comms is NCFSM_ERR_INVALID_USAGE, its "
     "works fail with NCFSM_ERR_GROUP, nothing reaches the backend, every comm stays READY"},
    {"blocking_then_nonblocking_groups",
     {"ops=OK ge=OK,OK", "works(blk,nb)=OK,OK blk=READY,READY nb=READY,READY", "blk=ok nb=ok", "healthy"},
     {0},
     "the launcher puts comms of one blocking mode only into one backend group"},
    {"abort_in_flight",
     {"abort-at-final(work IN_FLIGHT)=OK,OK", "->CLOSED,CLOSED", "works=ABORTED,ABORTED", "closed"},
     {0},
     "comm states and abort: rank 0's state callback sees LAUNCH_IN_PROGRESS -> READY on EV_LAUNCH_FINAL with "
     "the work IN_FLIGHT; ncfsm_comm_abort from there is OK; both comms end CLOSED, both works ABORTED"},
    {"split_child_handle",
     {"split=OK,OK wait=OK,OK", "SPLITTING/CHILD_QUEUED,SPLITTING/CHILD_QUEUED->READY/READY,READY/READY", "ok",
      "healthy"},
     {0},
     "split (fsm/api_split.c, comm.def): after ncfsm_comm_split the parent is SPLITTING and the child CHILD_QUEUED "
     "without a handle; the parent's poll to success (SPLIT_DONE) hands the child its handle (HANDED) and the parent is READY; "
     "the child polls its init to READY and its AllReduce is correct"},
    {"shrink_default",
     {"shrink=OK wait=OK", "SPLITTING/CHILD_QUEUED->READY/READY", "ok", "healthy"},
     {0},
     "shrink (default mode) of an idle READY comm takes the SPLIT path: SPLITTING, then READY once the call is final; "
     "the 1-rank child reaches READY and works"},
    {"shrink_abort_stuck",
     {"stuck ar=OK(IN_FLIGHT) shrink=OK wait=OK stuck_work=ABORTED", "SHRINKING/CHILD_QUEUED->SHRUNK/READY", "ok",
      "unhealthy(SHRUNK/Success)"},
     {0},
     "NCFSM_SHRINK_ABORT fires SHRINK_TERMINATE: the stuck work fails once as ABORTED (action terminate_works), the "
     "parent is SHRINKING, then SHRUNK (only abort remains: R7) once the call is final (the NCCL comm itself reports "
     "Success); the child works"},
};
const int ncfsm_nexpectations = (int)(sizeof ncfsm_expectations / sizeof ncfsm_expectations[0]);
