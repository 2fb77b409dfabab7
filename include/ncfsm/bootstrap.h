/*
 * Bootstrap: a nonblocking out-of-band channel between the ranks of a job,
 * in the style of UCC's OOB collectives (post / test / free). Used for the
 * ncclUniqueId exchange and for cross-rank fingerprint verification.
 *
 * Implementations: pmix (PMIx_Fence_nb with data collection), tcp (a
 * key-value store on libevent, hosted by rank 0 or standalone), local (ranks
 * in one process). Completion is observed on the loop's thread: test() never
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
  NCFSM_BOOT_AUTO = 0, /* pmix when PMIX_RANK is set, else tcp when NCFSM_STORE_ADDR is set, else local */
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

void ncfsm_boot_opts_init(ncfsm_boot_opts *o); /* defaults, then environment */

/* Open a bootstrap whose completions wake base. pmix and local complete
 * requests from other threads: call evthread_use_pthreads() before creating
 * base (the ncfsm loop does). On failure *out is NULL and the reason is
 * logged; ncfsm_boot_open_error() returns it. */
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

#ifdef __cplusplus
}
#endif
#endif
