/*
 * The flight recorder (issue 9, item 2): a fixed ring of per-operation
 * records per communicator, and dumps of a snapshot of it in two formats:
 *   - JSON (docs/ordering.md "Dump formats"): DIR/ncfsm_fr_<comm_id>_r<rank>.json
 *   - the PyTorch Flight Recorder pickle that
 *     `python3 -m torch.distributed.flight_recorder.fr_trace` reads:
 *     DIR/ncfsm_fr_<comm_id>_nccl_trace_rank_<rank>
 * Self-contained: uses only the public types of include/ncfsm.h and core/log.h,
 * never the engine's structures.
 *
 * Threads: a recorder belongs to one thread (the loop's): ncfsm__rec_add, _get,
 * _snapshot and the fields of the entries _get returns are not locked. The
 * writers and ncfsm__rec_dump_async take copies and may be called from any
 * thread.
 */
#ifndef NCFSM_FSM_RECORDER_H
#define NCFSM_FSM_RECORDER_H

#include <stddef.h>
#include <stdint.h>

#include "ncfsm.h"

typedef struct ncfsm__recorder ncfsm__recorder;

/* An entry's id: per recorder, from 0, never reused. */
typedef uint64_t ncfsm__rec_ref;
#define NCFSM__REC_REF_NONE UINT64_MAX /* what ncfsm__rec_add returns for a NULL recorder */
#define NCFSM__REC_SEQ_NONE UINT64_MAX /* fp.seq of an entry never launched */

/* One operation. Times are CLOCK_MONOTONIC ns (ncfsm__now_ns), 0 = not reached. */
typedef struct ncfsm__rec_entry {
  uint64_t id;                /* set by ncfsm__rec_add */
  ncfsm_fingerprint_t fp;     /* fp.seq = NCFSM__REC_SEQ_NONE while not launched; for
                                 SEND/RECV the per-peer seq */
  uint64_t group;             /* launch id shared by the entries of one backend group; 0 = not launched */
  int32_t state;              /* ncfsm_work_state_t */
  int32_t result;             /* ncfsm_result_t; NCFSM_ERR_AGAIN while not final */
  uint64_t stream;            /* the stream's address, 0 = none */
  uint64_t t_submit_ns;       /* accepted (QUEUED) */
  uint64_t t_launch_ns;       /* handed to the backend (LAUNCHING) */
  uint64_t t_final_ns;        /* the launch became final (IN_FLIGHT) */
  uint64_t t_complete_ns;     /* reached a final state (COMPLETED, FAILED, TIMED_OUT, ABORTED) */
} ncfsm__rec_entry;

/* capacity 0: recording off, returns NULL (every function accepts NULL).
 * Allocates the whole ring now; nothing is allocated per operation later.
 * NULL with capacity > 0 only when out of memory (logged). */
ncfsm__recorder *ncfsm__rec_new(unsigned capacity);
void ncfsm__rec_free(ncfsm__recorder *r);
unsigned ncfsm__rec_capacity(const ncfsm__recorder *r); /* 0 for NULL */
uint64_t ncfsm__rec_total(const ncfsm__recorder *r);    /* entries ever added; 0 for NULL */

/* Copies *e into the ring with the next id (e->id is ignored) and returns that
 * id; when the ring is full the oldest entry is overwritten.
 * NCFSM__REC_REF_NONE when r or e is NULL. */
ncfsm__rec_ref ncfsm__rec_add(ncfsm__recorder *r, const ncfsm__rec_entry *e);

/* The ring (inline below: a work's entry is written at each of its steps). */
struct ncfsm__recorder {
  unsigned capacity;
  uint64_t total; /* entries ever added = the next id */
  ncfsm__rec_entry slots[];
};

/* The next entry, to fill in place (every field but id, which it sets): its
 * id goes to *ref; the oldest entry is overwritten when the ring is full.
 * NULL (and *ref = NCFSM__REC_REF_NONE) when r is NULL. */
static inline ncfsm__rec_entry *ncfsm__rec_push(ncfsm__recorder *r, ncfsm__rec_ref *ref) {
  if (!r) {
    *ref = NCFSM__REC_REF_NONE;
    return 0;
  }
  uint64_t id = r->total++;
  ncfsm__rec_entry *slot = &r->slots[id % r->capacity];
  slot->id = *ref = id;
  return slot;
}

/* The entry of ref, to update in place (state, result, times, seq, group), or
 * NULL when r is NULL, ref was never returned by r, or its slot has been
 * overwritten since (more than capacity entries were added after it). */
static inline ncfsm__rec_entry *ncfsm__rec_get(ncfsm__recorder *r, ncfsm__rec_ref ref) {
  if (!r || ref >= r->total || r->total - ref > r->capacity) return 0;
  return &r->slots[ref % r->capacity];
}

/* Copies the newest min(max, held) entries into out, oldest first (ids
 * consecutive), and returns how many; *total (when not NULL) gets
 * ncfsm__rec_total. 0 for a NULL recorder. */
unsigned ncfsm__rec_snapshot(const ncfsm__recorder *r, ncfsm__rec_entry *out, unsigned max,
                             uint64_t *total);

/* ---- dumps --------------------------------------------------------------- */

/* Formats of a dump (ncfsm__rec_meta.formats; 0 = both). */
enum { NCFSM__REC_FMT_JSON = 1u << 0, NCFSM__REC_FMT_TORCH = 1u << 1 };

/* What a dump says about its communicator. Strings are copied by
 * ncfsm__rec_dump_async; NULL reads as "". */
typedef struct ncfsm__rec_meta {
  int rank, nranks;
  const char *comm_name;   /* ncfsm_comm_opts.name */
  uint64_t comm_id;        /* XXH3_64 of the NCCL unique id: equal on every rank */
  const char *backend;     /* "nccl", "sim", "null" */
  int nccl_version;        /* e.g. 22809; 0 when there is none */
  const char *reason;      /* "error", "timeout", "request", "signal" or "verify" (checked) */
  const char *state;       /* ncfsm_state_name of the comm at the snapshot */
  const char *failure;     /* ncfsm_comm_failure text, "" or NULL when none */
  uint64_t next_seq;       /* the next collective seq this rank would assign */
  uint64_t rolling_hash;   /* after seq next_seq-1 */
  unsigned capacity;       /* ring size */
  uint64_t total;          /* entries ever recorded */
  uint64_t time_ns;        /* CLOCK_MONOTONIC when the snapshot was taken */
  uint64_t timeout_ms;     /* the comm's default deadline, PyTorch's timeout_ms; 0 = none */
  unsigned formats;        /* NCFSM__REC_FMT_* bits; 0 = JSON and PyTorch */
  /* Optional (NULL = not known, left out of the dump): nranks values, by
   * rank, the next_seq of each rank as this rank last learned it (its
   * verification exchanges, a peer's failure notice): what names the ranks
   * that did not arrive when their own dumps are missing. Its own entry is
   * its next_seq; NCFSM__REC_SEQ_NONE for a rank it has heard nothing from.
   * Copied by ncfsm__rec_dump_async. */
  const uint64_t *peer_next_seq;
} ncfsm__rec_meta;

/* The paths a dump of m into dir writes (no I/O). NCFSM_ERR_INVALID_ARGUMENT
 * when dir or m is NULL or a path does not fit; either output may be NULL. */
ncfsm_result_t ncfsm__rec_paths(const char *dir, const ncfsm__rec_meta *m, char *json_path,
                                size_t json_len, char *torch_path, size_t torch_len);

/* Writes the dump synchronously: each file to a temp file in dir, then
 * rename() over the final name (a reader never sees a partial file; a later
 * dump of the same comm and rank replaces the earlier). Never aborts:
 *   NCFSM_OK;
 *   NCFSM_ERR_INVALID_ARGUMENT  dir/m NULL, entries NULL with n > 0, bad reason
 *                               or formats, rank outside [0, nranks);
 *   NCFSM_ERR_SYSTEM            dir missing or not writable, disk full, ... (logged with errno);
 *   NCFSM_ERR_NO_MEMORY.
 * Each failure is logged with the path and what to do. */
ncfsm_result_t ncfsm__rec_write(const char *dir, const ncfsm__rec_meta *m,
                                const ncfsm__rec_entry *e, unsigned n);

/* Called once per accepted dump, on the dump thread, after its files are
 * written (rc = ncfsm__rec_write's result). json_path is the JSON file's path
 * (NULL when the dump wrote no JSON), valid during the call only. It must not
 * block for long (it delays the dumps queued behind it) and must not call
 * ncfsm__rec_shutdown. */
typedef void (*ncfsm__rec_done_fn)(void *arg, ncfsm_result_t rc, const char *json_path);

/* Copies dir, *m (with its strings) and e[0..n) and queues them for the one
 * process-wide dump thread (started on first use); returns at once, never
 * blocks on I/O or on a full queue.
 *   NCFSM_OK                    queued: done (if not NULL) will be called once;
 *   NCFSM_ERR_BUSY              NCFSM__REC_QUEUE_MAX dumps already pending: this one is
 *                               dropped, counted (ncfsm__rec_dumps_dropped) and logged;
 *   NCFSM_ERR_INVALID_ARGUMENT, NCFSM_ERR_NO_MEMORY, NCFSM_ERR_SYSTEM (thread not started),
 *   NCFSM_ERR_ILLEGAL_STATE     after the process began exiting.
 * done is not called when the result is not NCFSM_OK. */
#define NCFSM__REC_QUEUE_MAX 64u
ncfsm_result_t ncfsm__rec_dump_async(const char *dir, const ncfsm__rec_meta *m,
                                     const ncfsm__rec_entry *e, unsigned n,
                                     ncfsm__rec_done_fn done, void *arg);

/* Writes every queued dump (calling its done), then stops and joins the dump
 * thread; a later ncfsm__rec_dump_async starts a new one. Runs at exit too (a
 * destructor). Must not be called from a done callback. */
void ncfsm__rec_shutdown(void);

/* Dumps dropped because the queue was full, since the process started. */
uint64_t ncfsm__rec_dumps_dropped(void);

#endif
