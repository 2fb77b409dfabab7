/* Known differences: an observation that differs from the expectation and
 * is explained. Each entry matches one exact field observation of one
 * scenario, mode and backend ("*": any). */
#include <stdio.h>

#include "conformance.h"

/* An explained disagreement: matches only this exact observation. */
const known_t knowns[] = {
    {"event_after_inprogress", "raw", "sim", "data", "early-event=complete-before-data final-event=complete data-ok",
     "the sim has no device time: an op executes at the first progress step (here the event query), so an "
     "event recorded after the launch is final is already complete when queried (docs/sim.md, Streams and "
     "events)"},
    {"event_after_inprogress", "ncfsm", "sim", "data", "event-at-final=complete data-ok",
     "as for raw on the sim: the engine's query right after the final poll runs the op (no device time)"},
    {"abort_in_flight", "ncfsm", "sim", "rc", "abort-at-final(work COMPLETED)=OK,OK",
     "the sim has no device time: the engine's event query in the turn that made the work IN_FLIGHT "
     "already ran rank 0's op, so there is nothing in flight to abort"},
    {"abort_in_flight", "ncfsm", "sim", "data", "works=OK,ABORTED",
     "as above: rank 0's work completed before the abort (no device time in the sim); rank 1's was aborted"},
    /* measured on the GPU host where NCCL differs from NCCL-RULES (docs/conformance.md) */
    {"call_during_inprogress", "raw", "nccl", "data", "first=wrong second=wrong",
     "NOT REPRODUCED (R2 'the first operation's data was correct'): here the first launch was the comm's first "
     "collective, still connecting; the rejected second group's cleanup broke that connection setup (NCCL WARN "
     "'Socket recv failed while polling', 'ncclAsyncJobComplete: job ... failed, job error 3'), so the first "
     "AllReduce never produced its result either. The poisoning itself (InvalidArgument for good) reproduces"},
    {"finalize_twice", "raw", "nccl", "health", "healthy",
     "NOT REPRODUCED as lasting: the first poll after the second Finalize returned ncclInvalidArgument, a later "
     "ncclCommGetAsyncError returned ncclSuccess again (the sim keeps the comm poisoned)"},
    {"destroy_poisoned_cascade", "raw", "nccl", "rc",
     "finalize-again=InvalidArgument destroy(r0)=Success next:gs=Success init=Success,Success ge=InProgress",
     "NOT REPRODUCED with a poll first: once Finalize polled to its end (one InvalidArgument, then Success) "
     "Destroy succeeded and the next comm on the thread initialised; R4's cascade needs the Destroy while the "
     "state is InProgress (row destroy_inprogress_cascade)"},
    {"destroy_poisoned_cascade", "raw", "nccl", "async", "r0=InvalidArgument next=Success,Success",
     "as above: the next communicator created on the thread was fine"},
    {"destroy_poisoned_cascade", "raw", "nccl", "health", "healthy", "as above"},
    {"destroy_inprogress_cascade", "raw", "nccl", "rc",
     "finalize-again=InvalidArgument destroy(r0)=InvalidArgument next:gs=Success init=Success,Success ge=Success",
     "PARTLY REPRODUCED (R4): the second Finalize and the Destroy right after it returned ncclInvalidArgument "
     "as measured in NCCL-RULES, but the NEXT communicator created on the thread initialised normally on "
     "2.28.3 and 2.28.9 (one process, one thread, two GPUs): the cross-communicator cascade did not occur"},
    {"destroy_inprogress_cascade", "raw", "nccl", "async", "r0=InvalidArgument next=Success,Success",
     "as above: rank 0 stayed poisoned (ncclInvalidArgument), the next communicator reached ncclSuccess"},
    {"destroy_inprogress_cascade", "raw", "nccl", "health", "healthy",
     "as above: the next communicator was healthy; rank 0 was aborted by the scenario's cleanup"},
    {"mixed_blocking_nonblocking", "raw", "nccl", "rc",
     "ops(blk,blk,nb,nb)=Success,Success,Success,Success ge=InProgress",
     "NOT REPRODUCED (R3 'Blocking and nonblocking communicators in one group: ncclInvalidArgument'): for "
     "collectives NCCL 2.28.3 and 2.28.9 accepted the mixed group, ran it as a nonblocking group and printed no "
     "WARN; the check exists for inits (row destroy_inprogress_cascade shows its WARN)"},
    {"mixed_blocking_nonblocking", "raw", "nccl", "async", "blk=InProgress,InProgress nb=Success,Success",
     "measured: the blocking comms' async state stayed ncclInProgress for the 15 s poll limit: a blocking comm "
     "is never joined by ncclCommGetAsyncError, so every later call on it fails R2's readiness check"},
    {"mixed_blocking_nonblocking", "raw", "nccl", "data", "blk=ok nb=ok", "measured: both AllReduces ran"},
    {"mixed_blocking_nonblocking", "raw", "nccl", "health", "blk:poisoned(r0=InProgress r1=InProgress) nb:healthy",
     "measured: the blocking comms are stuck in InProgress (see async)"},
    {"mixed_blocking_nonblocking", "ncfsm", "nccl", "health",
     "unhealthy(READY/InProgress READY/InProgress READY/Success READY/Success)",
     "OPEN ncfsm gap: ncfsm let the mixed group reach NCCL; the data is right but the blocking comms' NCCL "
     "state is stuck in InProgress while ncfsm says READY: their next op will be refused by NCCL. Fix: reject "
     "mixed groups at ncfsm_group_end"},
    {"blocking_then_nonblocking_groups", "ncfsm", "nccl", "health",
     "unhealthy(READY/InProgress READY/InProgress READY/Success READY/Success)",
     "OPEN ncfsm gap: the launcher coalesced the two legal groups into one NCCL group mixing blocking and "
     "nonblocking comms; the blocking comms are left in InProgress inside NCCL (ncfsm says READY). Fix: "
     "coalesce only batches of the same blocking mode"},
    /* ncfsm gap (docs/conformance.md, Open differences): no blocking-mode check */
    {"mixed_blocking_nonblocking", "ncfsm", "*", "async",
     "works(blk,nb)=BACKEND,BACKEND blk=ERROR,ERROR nb=ERROR,ERROR",
     "OPEN ncfsm gap: ncfsm_group_end does not check that a group mixes blocking and nonblocking comms; the "
     "backend group end fails (R3) and all four comms go to ERROR and are aborted. Fix: reject at "
     "ncfsm_group_end (NCFSM_ERR_INVALID_USAGE, nothing reaches NCCL)"},
    {"mixed_blocking_nonblocking", "ncfsm", "*", "health",
     "unhealthy(ERROR/Success ERROR/Success ERROR/InvalidArgument ERROR/InvalidArgument)",
     "OPEN ncfsm gap: as above; the nonblocking comms were poisoned by NCCL (R3)"},
    {"blocking_then_nonblocking_groups", "ncfsm", "*", "async",
     "works(blk,nb)=BACKEND,BACKEND blk=ERROR,ERROR nb=ERROR,ERROR",
     "OPEN ncfsm gap: the launcher (ncfsm__launch) coalesces the two legal groups into ONE backend group "
     "although one is blocking and one nonblocking; NCCL rejects the mix (R3) and a legal program loses four "
     "comms. Fix: coalesce only batches of the same blocking mode (and issue_inits likewise)"},
    {"blocking_then_nonblocking_groups", "ncfsm", "*", "data", "blk=wrong nb=wrong",
     "OPEN ncfsm gap: as above (the ops never ran)"},
    {"blocking_then_nonblocking_groups", "ncfsm", "*", "health",
     "unhealthy(ERROR/Success ERROR/Success ERROR/InvalidArgument ERROR/InvalidArgument)",
     "OPEN ncfsm gap: as above"},
};
const int nknowns = (int)(sizeof knowns / sizeof knowns[0]);
