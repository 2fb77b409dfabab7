/*
 * Bootstrap: a nonblocking out-of-band channel between the ranks of a job,
 * in the style of UCC's OOB collectives (post / test / free). Used for the
 * ncclUniqueId exchange and for cross-rank fingerprint verification.
 *
 * Implementations: pmix (PMIx_Fence_nb with data collection), tcp (a
 * key-value store on libevent, hosted by rank 0 or standalone), local (ranks
 * in one process). Channels (ncfsm_boot_channel_open) are bootstraps of their
 * own among some of its ranks; notices (ncfsm_boot_notice_post) reach every
 * rank without a matching call. Completion is observed on the loop's thread: test() never
 * blocks, and a request's completion wakes the loop's event_base.
 */
#ifndef NCFSM_BOOTSTRAP_H
#define NCFSM_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "ncfsm/result.h"

#ifdef __cplusplus
extern "C" {
#endif

struct event_base;
typedef struct ncfsm_boot ncfsm_boot;
typedef struct ncfsm_boot_req ncfsm_boot_req;

typedef enum ncfsm_boot_kind {
  NCFSM_BOOT_AUTO = 0, /* pmix when PMIX_RANK is set, else tcp when NCFSM_STORE_ADDR is set, else
                          local; neither, in one of several tasks (SLURM_NTASKS, OMPI_COMM_WORLD_SIZE
                          or PMI_SIZE above 1): ncfsm_boot_open fails (NCFSM_ERR_BOOTSTRAP) */
  NCFSM_BOOT_PMIX,
  NCFSM_BOOT_TCP,
  NCFSM_BOOT_LOCAL
} ncfsm_boot_kind_t;

typedef struct ncfsm_boot_opts {
  ncfsm_boot_kind_t kind;
  /* tcp: "host:port" of the store (NCFSM_STORE_ADDR), the job token
   * (NCFSM_STORE_TOKEN), rank and size (NCFSM_RANK / NCFSM_WORLD_SIZE),
   * whether this rank hosts the store (default: rank 0 when NCFSM_STORE_HOST=1). */
  const char *store_addr;
  const char *token;
  int rank, size;
  int host_store;
  uint64_t timeout_ms; /* a request not done by then fails with NCFSM_ERR_BOOTSTRAP */
  /* local: the group of in-process ranks this member belongs to, and its rank. */
  const char *local_group;
  /* tcp: largest value the store accepts (NCFSM_STORE_VALUE_MAX, default 1 MiB);
   * keys are at most 512 bytes. */
  size_t store_value_max;
  /* tcp: this rank's secret (NCFSM_STORE_RANK_SECRET), sent instead of the
   * job token; required by a store started with --rank-secrets
   * (NCFSM_STORE_RANK_SECRETS=1). A launcher derives it from the token with
   * ncfsm_boot_rank_secret and gives each rank only its own. */
  const char *rank_secret;
} ncfsm_boot_opts;

/* Defaults, then the environment through the settings table (docs/settings.md, "Bootstrap"): a
 * value the table does not accept is logged (WARN) and its field keeps the default;
 * ncfsm_boot_open then refuses it. */
void ncfsm_boot_opts_init(ncfsm_boot_opts *o);

/* Open a bootstrap whose completions wake base. pmix and local complete
 * requests from other threads: call evthread_use_pthreads() before creating
 * base (the ncfsm loop does). On failure *out is NULL and the reason is
 * logged; ncfsm_boot_open_error() and ncfsm_last_error() return it. A value
 * of a bootstrap variable that the settings table does not accept (with opts
 * or NULL, whatever the kind; a tcp rank's NCFSM_STORE_HEARTBEAT, and the
 * store's variables on a rank that hosts it), an NCFSM_STORE_*,
 * NCFSM_BOOTSTRAP_* or NCFSM_LOCAL_* variable that is not a setting, and a
 * store address without a port or with a port past 65535:
 * NCFSM_ERR_INVALID_ARGUMENT naming it (docs/bootstrap.md, "Choosing an
 * implementation"). */
ncfsm_result_t ncfsm_boot_open(struct event_base *base, const ncfsm_boot_opts *opts,
                               ncfsm_boot **out);
ncfsm_result_t ncfsm_boot_close(ncfsm_boot *b);
ncfsm_boot_kind_t ncfsm_boot_kind(const ncfsm_boot *b);
int ncfsm_boot_rank(const ncfsm_boot *b);
int ncfsm_boot_size(const ncfsm_boot *b);
int ncfsm_boot_local_rank(const ncfsm_boot *b);
int ncfsm_boot_local_size(const ncfsm_boot *b);
const char *ncfsm_boot_last_error(const ncfsm_boot *b);
/* Why the last ncfsm_boot_open on this thread failed ("" if it did not). */
const char *ncfsm_boot_open_error(void);
/* "pmix", "tcp", "local". */
const char *ncfsm_boot_kind_name(ncfsm_boot_kind_t k);
/* The tcp store's secret of rank of a job of size ranks, derived from the job
 * token (64 hex characters of HMAC-SHA256, and a NUL, into out). A rank that
 * has it can claim only that rank of a store started with --rank-secrets.
 * NCFSM_ERR_INVALID_ARGUMENT for an empty token or rank not in [0, size). */
ncfsm_result_t ncfsm_boot_rank_secret(const char *token, int rank, int size, char out[65]);

/* Allgather of len bytes per rank: recv holds size * len bytes, rank-major.
 * Calls must be made in the same order on every rank. */
ncfsm_result_t ncfsm_boot_allgather_post(ncfsm_boot *b, const void *send, void *recv, size_t len,
                                         ncfsm_boot_req **req);
/* NCFSM_OK when done, NCFSM_ERR_AGAIN while not, else the error. Never blocks. */
ncfsm_result_t ncfsm_boot_test(ncfsm_boot_req *req);
/* Free a request, finished or not (an unfinished one is cancelled, and the
 * bootstrap is then unusable: later posts fail, since ranks no longer agree
 * on the order of collectives). */
void ncfsm_boot_req_free(ncfsm_boot_req *req);
/* Optional: cb runs once, on the loop thread, from the base's dispatch,
 * after req finishes (also when it had finished before this call). It never
 * runs after ncfsm_boot_req_free. */
typedef void (*ncfsm_boot_done_cb)(ncfsm_boot_req *req, ncfsm_result_t status, void *arg);
void ncfsm_boot_req_on_done(ncfsm_boot_req *req, ncfsm_boot_done_cb cb, void *arg);
/* Barrier = allgather of zero bytes. */
ncfsm_result_t ncfsm_boot_barrier_post(ncfsm_boot *b, ncfsm_boot_req **req);
/* Convenience: post, then run base until done or the timeout. */
ncfsm_result_t ncfsm_boot_allgather(ncfsm_boot *b, const void *send, void *recv, size_t len);

/* ---- Recovery from dead ranks: peer loss, agreement, the survivors' bootstrap ----
 * (docs/bootstrap.md, "Peer loss, agreement and the survivors' bootstrap"). tcp and local;
 * pmix returns NCFSM_ERR_UNSUPPORTED with the reason in ncfsm_boot_last_error (Open MPI's
 * mpirun ends the whole job when a process dies; use the TCP store, NCFSM_BOOTSTRAP=tcp, for
 * recovery). Call these on the thread that runs the bootstrap's event_base. */

/* Peer loss: cb runs on the base's thread, from its dispatch, once per lost rank, with a
 * message saying why ("rank 2 (127.0.0.1:41522): connection closed by the peer (process
 * exited or was killed?)").
 * tcp: the store pushes it to every connected rank as soon as it sees a rank's connection
 * close or closes a rank for misbehaviour (also when no allgather is open); a rank that
 * connects later is told of the ranks lost before it. A rank that closes its bootstrap at the
 * end of a job is lost too, for the ranks still open.
 * local: another member closed its bootstrap (a thread that ends without closing is not seen).
 * A rank lost before the call is reported too (right after the call, from the dispatch): each
 * registration is told every lost rank once. One callback per bootstrap: a second call
 * replaces it (and is told every lost rank again); cb NULL removes it. rank is in this
 * bootstrap's ranks (on a survivors' bootstrap, its index among the survivors).
 * The callback may call ncfsm_boot_on_peer_lost and post requests; ncfsm_boot_close of this
 * bootstrap from inside it returns NCFSM_ERR_BUSY.
 * NCFSM_ERR_INVALID_ARGUMENT for a bad handle; pmix: NCFSM_ERR_UNSUPPORTED. */
typedef void (*ncfsm_boot_lost_cb)(ncfsm_boot *b, int rank, const char *why, void *arg);
ncfsm_result_t ncfsm_boot_on_peer_lost(ncfsm_boot *b, ncfsm_boot_lost_cb cb, void *arg);

/* The bootstrap failed for good (every later post returns st): cb runs once, on the base's
 * thread from its dispatch, with st and the message of ncfsm_boot_last_error. tcp: the store
 * closed the connection or refused this rank, its heartbeat connection was lost (the store
 * silent or unreachable past its silence limit: docs/bootstrap.md, "Heartbeats"); any
 * bootstrap: a request timed out, or was freed unfinished. A failure before the call is
 * reported right after it; a second call replaces cb (and is told again); cb NULL removes it.
 * Closing the bootstrap from inside cb returns NCFSM_ERR_BUSY. All bootstraps (pmix, local
 * included); NCFSM_ERR_INVALID_ARGUMENT for a bad handle. */
typedef void (*ncfsm_boot_failed_cb)(ncfsm_boot *b, ncfsm_result_t st, const char *why, void *arg);
ncfsm_result_t ncfsm_boot_on_failed(ncfsm_boot *b, ncfsm_boot_failed_cb cb, void *arg);

/* Survivor agreement: every live rank posts the same epoch (> 0, increasing on this
 * bootstrap); the request completes when every rank the store (local: the group) still counts
 * as alive has posted that epoch; its result is the set of ranks that posted (and are still
 * alive). A rank lost before or during it is left out. A live rank that never posts makes it
 * fail, for every rank that posted, timeout_ms after the first post (the bootstrap's
 * timeout_ms; the store times it with the first poster's) with NCFSM_ERR_BOOTSTRAP naming the
 * ranks that did not post. Ranks that post different epochs make it fail at once, naming
 * them; a later post of an epoch not above the last one agreed or failed is refused.
 * It is not ordered with allgathers (its own key space), so survivors may post it whatever
 * allgathers were open when a rank died, and on a bootstrap whose allgathers have failed.
 * A failed agreement does not make the bootstrap fail: post a higher epoch to retry.
 * Misuse: epoch 0 or not above the last epoch posted on this bootstrap:
 * NCFSM_ERR_INVALID_ARGUMENT; an agreement of this bootstrap not finished yet:
 * NCFSM_ERR_BUSY; the store connection lost: NCFSM_ERR_BOOTSTRAP; pmix: NCFSM_ERR_UNSUPPORTED.
 * Freeing an unfinished agreement does not withdraw the post (this rank still counts as
 * having posted it). ncfsm_boot_test, ncfsm_boot_req_on_done and ncfsm_boot_req_free work on
 * it as on an allgather. */
ncfsm_result_t ncfsm_boot_agree_post(ncfsm_boot *b, uint64_t epoch, ncfsm_boot_req **req);
/* After the request completed with NCFSM_OK: alive[i] is 1 for each rank of the agreement, 0
 * for the others (size entries, the bootstrap's size), *nalive their number (either may be
 * NULL). NCFSM_ERR_AGAIN while it runs, its error if it failed, NCFSM_ERR_INVALID_ARGUMENT
 * for a request that is not an agreement. */
ncfsm_result_t ncfsm_boot_agree_result(ncfsm_boot_req *req, uint8_t *alive, int *nalive);

/* The survivors' bootstrap: after a completed agreement, a bootstrap over the agreed ranks
 * only (rank = this rank's index among them in rank order, size = nalive; local rank and
 * local size are the parent's: the process keeps its node and device), whose allgathers (and
 * barriers, and nested agreements) are separate from the parent's and from other epochs'.
 * It shares the parent's connection (tcp) or joins the group "<parent group>/<epoch>"
 * (local); close it before the parent (closing the parent first: NCFSM_ERR_BUSY).
 * ncfsm_boot_rank/size/last_error and ncfsm_boot_on_peer_lost work on it; closing it releases
 * only it. At most one per agreement request (a second: NCFSM_ERR_BUSY). Used to exchange a
 * new ncclUniqueId among the survivors. Misuse (agreed not an agreement of b, not completed
 * with NCFSM_OK, or this rank not in it): NCFSM_ERR_INVALID_ARGUMENT; pmix:
 * NCFSM_ERR_UNSUPPORTED. tcp: a rank-0-hosted store dies with rank 0; recovery needs a
 * standalone ncfsm-store or rank 0 surviving. */
ncfsm_result_t ncfsm_boot_survivors(ncfsm_boot *b, ncfsm_boot_req *agreed, ncfsm_boot **out);

/* ---- Broadcast ---------------------------------------------------------------------------
 * Broadcast len bytes from root to every rank: on root, buf holds the bytes (read during the
 * post: root may reuse buf once the post returned); on the other ranks, buf receives them when
 * the request completes with NCFSM_OK. Every rank posts it with the same len and root.
 * Ordering: broadcasts are ordered with allgathers and barriers: every rank posts a
 * bootstrap's collectives, broadcasts included, in the same order. (Broadcast #n is the n-th
 * broadcast on the bootstrap; tcp and local number and match them apart from allgathers and so
 * tolerate a different interleaving of the two, pmix does not: both are fences of the
 * launcher.) Cost per rank: one request and one reply of len bytes, so the bytes moved grow as
 * n x len, not n x n x len as with an allgather.
 * Completion: on root as soon as the bytes are handed over (tcp: the store holds them; local:
 * the group holds them; pmix: committed and fenced), on the others when the bytes arrived; tcp
 * and local do not wait for the other receivers (pmix: its fence waits for every rank). A root
 * lost before it posted fails the broadcast by name on tcp and local (pmix: the launcher ends
 * the job).
 * Errors and timeouts as for allgathers (and sticky in the same way: a timed-out or freed
 * unfinished broadcast makes the bootstrap fail for good). root not in [0, size), or len too
 * large for the implementation: NCFSM_ERR_INVALID_ARGUMENT. */
ncfsm_result_t ncfsm_boot_bcast_post(ncfsm_boot *b, void *buf, size_t len, int root,
                                     ncfsm_boot_req **req);
/* Convenience: post, then run base until done or the timeout. */
ncfsm_result_t ncfsm_boot_bcast(ncfsm_boot *b, void *buf, size_t len, int root);

/* Several roots (the ids of a scalable NCCL init): root j of nroots is rank
 * ncfsm_boot_root_of(size, nroots, j) = floor(j * size / nroots), spread evenly over the ranks
 * with root 0 = rank 0. -1 when nroots is not in [1, size] or j not in [0, nroots). */
int ncfsm_boot_root_of(int size, int nroots, int j);
/* nroots broadcasts in one request: buf holds nroots * len bytes; root j contributes
 * buf[j*len, (j+1)*len) and every rank receives all of them. Broadcasts #k..#k+nroots-1 of this
 * bootstrap (one per root, in root order). Completes when all of them did; the first error
 * fails it. nroots 1 is ncfsm_boot_bcast_post(b, buf, len, 0, req). nroots not in [1, size]:
 * NCFSM_ERR_INVALID_ARGUMENT. */
ncfsm_result_t ncfsm_boot_bcast_roots_post(ncfsm_boot *b, void *buf, size_t len, int nroots,
                                           ncfsm_boot_req **req);

/* ---- Channels ----------------------------------------------------------------------------
 * An independent ordered stream of collectives among some ranks of a bootstrap
 * (docs/bootstrap.md, "Channels"). Every collective of b ("in the same order on every rank")
 * is ordered with b's other collectives; a channel's are ordered only with that channel's: a
 * library (ncfsm's cross-rank verification) can exchange on its own channel while the program
 * exchanges on b, in any interleaving, and the two never see each other's bytes.
 *
 * ncfsm_boot_channel_open(b, tag, members, n, &ch): members[0..n) are distinct ranks of b,
 * this rank among them (members NULL or n 0: every rank of b, in rank order); the channel's
 * rank i is members[i] (ncfsm_boot_rank(ch) = this rank's index, ncfsm_boot_size(ch) = n; local
 * rank and size are b's). tag names it: 1 to NCFSM_BOOT_TAG_MAX bytes of [A-Za-z0-9._-] (e.g.
 * "ncfsm.verify.1f2e3d4c5b6a7988"). Every member opens the same (tag, members), at any time
 * before or after the others and in any order across tags: a collective posted on a channel
 * that a member has not opened yet waits for it (up to the request's timeout), it does not
 * fail. ch is an ncfsm_boot: allgather, barrier, broadcast, roots, test, on_done, req_free,
 * last_error, on_failed and (tcp, local) on_peer_lost work on it; its collectives, errors and
 * sticky failure are its own (b's are not touched). Agreements and survivors' bootstraps are
 * b's business: on a channel they return NCFSM_ERR_UNSUPPORTED. Channels of channels work
 * (members are ranks of the channel they are opened on).
 * Peer loss: a rank of b reported lost (tcp, local) is reported on every channel of b it is a
 * member of, in the channel's ranks ("rank 1 of channel 'x' is rank 3 of its parent: ..."), and
 * a channel collective that waits for it fails naming it; a member that closes the channel is
 * lost for the channel's other members.
 * Close it with ncfsm_boot_close before b: closing b while a channel of it is open returns
 * NCFSM_ERR_BUSY naming the channels (as for survivors' bootstraps). After every member
 * closed it, the same (tag, members) may be opened again (a new channel, seq 0).
 * Errors: a bad tag or member list: NCFSM_ERR_INVALID_ARGUMENT; a channel of that tag already
 * open on b: NCFSM_ERR_BUSY; b failed for good: its error; a member list that differs from
 * the one another member opened the tag with (tcp, local: found at the store / group, the
 * channel then fails for good naming both; pmix: the two never meet, the first collective
 * times out). tcp: the store bounds the channels a rank holds (NCFSM_STORE_MAX_CHANNELS). */
#define NCFSM_BOOT_TAG_MAX 64
ncfsm_result_t ncfsm_boot_channel_open(ncfsm_boot *b, const char *tag, const int *members, int n,
                                       ncfsm_boot **out);
/* The channel's tag; NULL for a bootstrap that is not a channel (or a bad handle). */
const char *ncfsm_boot_channel_tag(const ncfsm_boot *b);

/* ---- Notices -----------------------------------------------------------------------------
 * A best-effort, asynchronous broadcast of a small notice to every other rank of a bootstrap
 * or channel (docs/bootstrap.md, "Notices"): e.g. "comm 0x1f2e... failed at seq 200 on rank 1,
 * cause NCFSM_ERR_MISMATCH". Notices are not ordered with collectives, need no matching call
 * on the receivers, and never block the poster: ncfsm_boot_notice_post hands the notice to the
 * transport and returns; a rank that is dead, not yet connected, or (a channel) has not opened
 * the channel does not get it. Each receiving rank's callback (ncfsm_boot_on_notice) runs on
 * its bootstrap's loop thread, from the base's dispatch, once per notice; the poster does not
 * get its own. Delivery: tcp, the store fans the frame out to every connected rank of the job
 * (a channel: every member that opened it); local, directly into the other members; pmix,
 * PMIx_Notify_event (on Open MPI 4.1's mpirun only the ranks of the poster's node get it:
 * docs/bootstrap.md says what was measured). */
#define NCFSM_BOOT_NOTICE_WHAT 256
typedef struct ncfsm_boot_notice {
  uint64_t key;   /* what the notice is about (the engine: a comm id); not interpreted */
  int origin;     /* the poster's rank in the bootstrap (set by ncfsm_boot_notice_post) */
  uint64_t seq;   /* e.g. the seq at which the comm failed; not interpreted */
  int32_t cause;  /* e.g. an ncfsm_result_t; not interpreted */
  char what[NCFSM_BOOT_NOTICE_WHAT]; /* text, NUL-terminated (cut at 255 bytes) */
} ncfsm_boot_notice;
/* Post n to every other rank of b (origin is set to ncfsm_boot_rank(b); the caller's is
 * ignored). NCFSM_OK once handed to the transport (delivery is not confirmed); the
 * bootstrap's own failure (tcp: the store connection is lost) when nothing can be sent;
 * NCFSM_ERR_INVALID_ARGUMENT for a bad handle or NULL n. Any thread that runs b's base. */
ncfsm_result_t ncfsm_boot_notice_post(ncfsm_boot *b, const ncfsm_boot_notice *n);
/* cb(b, n, arg) runs on b's loop thread, from the base's dispatch, for each notice another
 * rank posted on b (n valid during the call). Notices that arrive while no callback is set
 * are kept (at most 1024; more are dropped and counted in a WARN) and told to the next one.
 * A second call replaces cb; cb NULL removes it. Closing b from inside cb returns
 * NCFSM_ERR_BUSY. NCFSM_ERR_INVALID_ARGUMENT for a bad handle. */
typedef void (*ncfsm_boot_notice_cb)(ncfsm_boot *b, const ncfsm_boot_notice *n, void *arg);
ncfsm_result_t ncfsm_boot_on_notice(ncfsm_boot *b, ncfsm_boot_notice_cb cb, void *arg);

#ifdef __cplusplus
}
#endif
#endif
