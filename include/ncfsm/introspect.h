/*
 * Introspection of a loop without a debugger: a snapshot of every
 * communicator as JSON (jansson) and the loop's counters in the Prometheus
 * text exposition format. No HTTP here: http/ serves these (ncfsm_http), and
 * an application may print or log them itself. docs/service.md describes
 * every field and metric.
 *
 * Threads: every call below is thread-safe. It takes the loop's lock for the
 * time it takes to copy the counters and the communicators' fields (the
 * JSON and the text are built after the lock is released), so it may be
 * called from any thread, from the application's own event callbacks and
 * from ncfsm's work and state callbacks, but NOT from a trace callback
 * (ncfsm_loop_set_trace: it runs under the lock; debug builds return
 * NCFSM_ERR_INVALID_USAGE, release builds would deadlock).
 */
#ifndef NCFSM_INTROSPECT_H
#define NCFSM_INTROSPECT_H

#include <stddef.h>

#include "ncfsm.h"

#ifdef __cplusplus
extern "C" {
#endif

struct json_t; /* jansson's json_t: include <jansson.h> to use the snapshot */

typedef struct ncfsm_introspect_opts {
  unsigned recorder_tail; /* newest flight-recorder entries per comm in the snapshot (default 8;
                             0: none; at most 1024) */
} ncfsm_introspect_opts;

void ncfsm_introspect_opts_init(ncfsm_introspect_opts *o);

/* The schema id the snapshot's "schema" member carries; it changes when a
 * member changes meaning or disappears (members may be added). */
#define NCFSM_STATUS_SCHEMA "ncfsm.status/1"

/* A new JSON object (the caller owns the reference: json_decref) describing
 * the loop and each of its communicators: name, rank, size, backend, NCCL
 * version, state and time in it, seq and hash, last error and failure,
 * works per work state, the oldest unfinished work, the recorder's tail.
 * opts NULL: defaults. NCFSM_ERR_INVALID_ARGUMENT (bad loop or out),
 * NCFSM_ERR_NO_MEMORY, NCFSM_ERR_INVALID_USAGE (called under the loop's lock). */
ncfsm_result_t ncfsm_loop_status(ncfsm_loop *loop, const ncfsm_introspect_opts *opts,
                                 struct json_t **out);

/* The same snapshot as compact JSON text, NUL-terminated, in a malloc'ed
 * buffer the caller frees; *len (when not NULL) gets its length. */
ncfsm_result_t ncfsm_loop_status_text(ncfsm_loop *loop, const ncfsm_introspect_opts *opts,
                                      char **out, size_t *len);

/* The loop's metrics in the Prometheus text exposition format 0.0.4, in a
 * malloc'ed NUL-terminated buffer the caller frees: transitions per (from,
 * to), comms per state, rejected calls per (state, call), op latency
 * histograms per op kind (submit to final state), finished works per final
 * state, the coalescing cap and (auto) its fitted launch costs, and per communicator its state, time in state, launched
 * collectives, unfinished works and the oldest one's age. */
ncfsm_result_t ncfsm_loop_metrics(ncfsm_loop *loop, char **out, size_t *len);

/* How many communicators of the loop have failed: in ERROR, ABORT_QUEUED,
 * REVOKING or REVOKED, or CLOSING/CLOSED after a failure or an abort
 * (ncfsm_comm_failure not empty). why (when not NULL and len > 0) gets one
 * line per failed comm ("name rank R: STATE: failure"), truncated to len.
 * -1 for a bad loop or when called under the loop's lock. */
int ncfsm_loop_failed_comms(ncfsm_loop *loop, char *why, size_t len);

#ifdef __cplusplus
}
#endif
#endif
