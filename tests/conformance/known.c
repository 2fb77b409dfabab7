/* Known differences: an observation that differs from the expectation and
 * is explained by a DOCUMENTED difference, with the committed results that
 * show it:
 *
 *   - real NCCL differs from the rule as first described, which the raw
 *     expectation encodes (raw rows on nccl; docs/nccl-rules.md says what was
 *     measured);
 *   - the sim differs from NCCL by design (sim rows; docs/sim.md).
 *
 * Nothing here may describe an ncfsm bug: an ncfsm row on real NCCL must
 * match its expectation (check.c refuses an ncfsm entry for nccl), and a bug
 * once fixed must not stay listed, or its regression would pass as KNOWN.
 * A raw row whose outcome varies run to run lists its outcomes in its
 * scenario (varies_t), not here.
 *
 * Each entry matches one exact field observation of one scenario, mode and
 * backend. Evidence paths are from the repository root; the
 * conformance_registry test checks that they exist. */
#include <stdio.h>

#include "conformance.h"

#define GPU_RUNS "docs/results/conformance-2.28.3.json", "docs/results/conformance-2.28.9.json"

const known_t knowns[] = {
    /* ---- the sim, by design: no device time (docs/sim.md, "Streams and events") ---- */
    {"event_after_inprogress", "raw", "sim", "data", "early-event=complete-before-data final-event=complete data-ok",
     "the sim has no device time: an op executes at the first progress step (here the event query), so an "
     "event recorded after the launch is final is already complete when queried (docs/sim.md, Streams and "
     "events); on the GPU it was pending",
     {"docs/results/conformance-sim.json", "docs/sim.md", GPU_RUNS}},
    {"event_after_inprogress", "ncfsm", "sim", "data", "event-at-final=complete data-ok",
     "as for raw on the sim: the engine's query right after the final poll runs the op (no device time); on "
     "the GPU it was pending, as expected",
     {"docs/results/conformance-sim.json", "docs/sim.md", GPU_RUNS}},

    /* ---- real NCCL 2.28.3 and 2.28.9 against the raw expectations (one process, one thread, two GPUs) ---- */
    {"call_during_inprogress", "raw", "nccl", "data", "first=wrong second=wrong",
     "NOT REPRODUCED (R2 'the first operation's data was correct'): here the first launch was the comm's first "
     "collective, still connecting; the rejected second group's cleanup broke that connection setup (NCCL WARN "
     "'Socket recv failed while polling', 'ncclAsyncJobComplete: job ... failed, job error 3' in the first "
     "run's logs), so the first AllReduce never produced its result either. The poisoning itself "
     "(InvalidArgument for good) reproduces",
     {GPU_RUNS, "docs/results/conformance-2.28.3.txt", "docs/results/conformance-2.28.9.txt"}},
    {"finalize_twice", "raw", "nccl", "health", "healthy",
     "NOT REPRODUCED as lasting (R4): the first poll after the second Finalize returned ncclInvalidArgument, a "
     "later ncclCommGetAsyncError returned ncclSuccess again (the sim keeps the comm poisoned)",
     {GPU_RUNS}},
    {"destroy_inprogress_cascade", "raw", "nccl", "rc",
     "finalize-again=InvalidArgument destroy(r0)=InvalidArgument next:gs=Success init=Success,Success ge=Success",
     "PARTLY REPRODUCED (R4): the second Finalize and the Destroy right after it returned ncclInvalidArgument "
     "as the raw expectation says, but the NEXT communicator created on the thread initialised normally, with no "
     "mixing WARN: the cross-communicator cascade did not occur",
     {GPU_RUNS}},
    {"destroy_inprogress_cascade", "raw", "nccl", "async", "r0=InvalidArgument next=Success,Success",
     "as above: rank 0 stayed poisoned (ncclInvalidArgument), the next communicator reached ncclSuccess",
     {GPU_RUNS}},
    {"destroy_inprogress_cascade", "raw", "nccl", "health", "healthy",
     "as above: the next communicator was healthy; rank 0 was aborted by the scenario's cleanup",
     {GPU_RUNS}},
    {"mixed_blocking_nonblocking", "raw", "nccl", "rc",
     "ops(blk,blk,nb,nb)=Success,Success,Success,Success ge=InProgress",
     "NOT REPRODUCED (R3 'Blocking and nonblocking communicators in one group: ncclInvalidArgument'): for "
     "collectives NCCL 2.28.3 and 2.28.9 accepted the mixed group, ran it as a nonblocking group and printed no "
     "WARN (the sim rejects it, as the rules say)",
     {GPU_RUNS, "docs/results/conformance-2.28.3.txt", "docs/results/conformance-2.28.9.txt"}},
    {"mixed_blocking_nonblocking", "raw", "nccl", "async", "blk=InProgress,InProgress nb=Success,Success",
     "measured: the blocking comms' async state stayed ncclInProgress for the 15 s poll limit: a blocking comm "
     "is never joined by ncclCommGetAsyncError, so every later call on it fails R2's readiness check",
     {GPU_RUNS, "docs/results/conformance-2.28.3.txt", "docs/results/conformance-2.28.9.txt"}},
    {"mixed_blocking_nonblocking", "raw", "nccl", "data", "blk=ok nb=ok",
     "measured: both AllReduces of the accepted mixed group ran",
     {GPU_RUNS, "docs/results/conformance-2.28.3.txt", "docs/results/conformance-2.28.9.txt"}},
    {"mixed_blocking_nonblocking", "raw", "nccl", "health", "blk:poisoned(r0=InProgress r1=InProgress) nb:healthy",
     "measured: the blocking comms are stuck in InProgress (see async)",
     {GPU_RUNS, "docs/results/conformance-2.28.3.txt", "docs/results/conformance-2.28.9.txt"}},
};
const int nknowns = (int)(sizeof knowns / sizeof knowns[0]);
