/*
 * The nccl backend: real NCCL and the CUDA runtime, both loaded with dlopen
 * at run time (docs/nccl-backend.md; the loading, the tables and the
 * per-thread state: core/nccl_internal.h). This file: communicators, groups,
 * operations, communicators made from communicators, and the ncfsm__backend
 * table.
 *
 * Threads: open() and the loading run once per process (pthread_once). All
 * other calls come from the loop thread (R9).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/nccl_internal.h"

typedef struct nccl_bcomm {
  ncclComm_t comm;
  int device;
  int blocking;
  char name[64]; /* config.commName must outlive the NCCL comm */
  /* A child of a split/shrink/grow on this (parent) comm that NCCL writes
   * asynchronously (R8): handed to *pend_out when the parent polls to
   * ncclSuccess (NCCL wrote pend->comm, or left it NULL: no child). */
  struct nccl_bcomm *pend;
  void **pend_out;
} nccl_bcomm;

static int b_open(char *why, size_t why_len) {
  ncfsm__nccl_load();
  if (why && why_len) snprintf(why, why_len, "%s", ncfsm__nccl_found.open_rc ? ncfsm__nccl_found.open_why : "");
  return ncfsm__nccl_found.open_rc;
}

static int b_version(void) {
  ncfsm__nccl_load();
  return ncfsm__nccl_found.nccl_version;
}

static unsigned b_features(void) {
  ncfsm__nccl_load();
  return ncfsm__nccl_found.features;
}

static int b_get_unique_id(ncfsm_unique_id *id) {
  if (ncfsm__nccl_not_usable()) return ncclSystemError;
  ncclUniqueId uid;
  ncclResult_t r = ncfsm__nc.ncclGetUniqueId(&uid);
  if (r == ncclSuccess) memcpy(id, &uid, sizeof uid);
  return ncfsm__nccl_res(r);
}

/* A communicator's wrapper and its ncclConfig_t (blocking flag, name); the
 * caller set the device. */
static nccl_bcomm *bcomm_new(const ncfsm__comm_config *cfg, int device, ncclConfig_t *config) {
  nccl_bcomm *bc = calloc(1, sizeof *bc);
  if (!bc) {
    ncfsm__nccl_own_error("out of host memory for a communicator");
    return NULL;
  }
  bc->device = device;
  bc->blocking = cfg->blocking ? 1 : 0;
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = bc->blocking;
  if (cfg->name && cfg->name[0]) {
    snprintf(bc->name, sizeof bc->name, "%s", cfg->name);
    c.commName = bc->name;
  }
  *config = c;
  return bc;
}

/* After an init-like call (init, a joining grow) that wrote bc->comm in the
 * call: on an error with a handle, hand it over so that the engine aborts it. */
static int init_after(nccl_bcomm *bc, ncclResult_t r, void **out) {
  if (r != ncclSuccess && r != ncclInProgress && !bc->comm) {
    free(bc);
    return ncfsm__nccl_res(r);
  }
  *out = bc;
  return ncfsm__nccl_res(r);
}

/* The device and the wrapper of a new communicator on cfg->device. */
static int init_begin(const ncfsm__comm_config *cfg, nccl_bcomm **bc, ncclConfig_t *config) {
  if (ncfsm__nccl_not_usable()) return ncclSystemError;
  if (ncfsm__nccl_force_device(cfg->device) != 0) return ncclUnhandledCudaError; /* own_error set */
  return (*bc = bcomm_new(cfg, cfg->device, config)) ? ncclSuccess : ncclSystemError;
}

static int b_comm_init(void **bcomm, int nranks, const ncfsm_unique_id *id, int rank,
                       const ncfsm__comm_config *cfg) {
  *bcomm = NULL;
  nccl_bcomm *bc = NULL;
  ncclConfig_t config;
  int rc = init_begin(cfg, &bc, &config);
  if (rc) return rc;
  ncclUniqueId uid;
  memcpy(&uid, id, sizeof uid);
  return init_after(bc, ncfsm__nc.ncclCommInitRankConfig(&bc->comm, nranks, uid, rank, &config), bcomm);
}

/* ncclCommInitRankScalable: as b_comm_init, with nids unique ids. */
static int b_comm_init_scalable(void **bcomm, int nranks, const ncfsm_unique_id *ids, int nids, int rank,
                                const ncfsm__comm_config *cfg) {
  *bcomm = NULL;
  if (ncfsm__nccl_not_usable()) return ncclSystemError;
  if (!NCCL_OPT(ncclCommInitRankScalable)) return ncfsm__nccl_missing(NCFSM__NCCL_OPT_ncclCommInitRankScalable);
  ncclUniqueId *u = calloc((size_t)(nids > 0 ? nids : 1), sizeof *u);
  if (!u) {
    ncfsm__nccl_own_error("out of host memory for a communicator");
    return ncclSystemError;
  }
  nccl_bcomm *bc = NULL;
  ncclConfig_t config;
  int rc = init_begin(cfg, &bc, &config);
  if (rc) {
    free(u);
    return rc;
  }
  for (int j = 0; j < nids; j++) memcpy(&u[j], &ids[j], sizeof u[j]);
  ncclResult_t r = NCCL_OPT(ncclCommInitRankScalable)(&bc->comm, nranks, rank, nids, u, &config);
  free(u);
  return init_after(bc, r, bcomm);
}

static int b_host_notify(void *stream, void (*fn)(void *), void *arg) {
  if (ncfsm__nccl_not_usable()) return ncclSystemError;
  return ncfsm__nccl_host_notify(stream, fn, arg);
}

static void pend_resolve(nccl_bcomm *bc);

static int b_get_async_error(void *bcomm, int *state) {
  nccl_bcomm *bc = bcomm;
  ncclResult_t st = ncclSuccess;
  ncclResult_t r = ncfsm__nc.ncclCommGetAsyncError(bc->comm, &st);
  *state = (int)st;
  if (__builtin_expect(bc->pend != NULL, 0) && r == ncclSuccess && st == ncclSuccess) pend_resolve(bc);
  if (__builtin_expect(st != ncclSuccess && st != ncclInProgress, 0)) ncfsm__nccl_err_set = 0;
  return ncfsm__nccl_res(r);
}

static int b_group_start(void) { return ncfsm__nccl_res(ncfsm__nc.ncclGroupStart()); }
static int b_group_end(void) { return ncfsm__nccl_res(ncfsm__nc.ncclGroupEnd()); }

static int b_op(void *bcomm, const ncfsm__op *op) {
  nccl_bcomm *bc = bcomm;
  if (ncfsm__nccl_use_device(bc->device) != 0) return ncclUnhandledCudaError;
  ncclComm_t c = bc->comm;
  cudaStream_t s = (cudaStream_t)op->stream;
  ncclDataType_t dt = (ncclDataType_t)op->dtype;
  ncclRedOp_t ro = (ncclRedOp_t)op->redop;
  ncclResult_t r;
  switch (op->kind) {
    case NCFSM_KIND_ALLREDUCE: r = ncfsm__nc.ncclAllReduce(op->send, op->recv, op->count, dt, ro, c, s); break;
    case NCFSM_KIND_BROADCAST: r = ncfsm__nc.ncclBroadcast(op->send, op->recv, op->count, dt, op->root, c, s); break;
    case NCFSM_KIND_REDUCE: r = ncfsm__nc.ncclReduce(op->send, op->recv, op->count, dt, ro, op->root, c, s); break;
    case NCFSM_KIND_ALLGATHER: r = ncfsm__nc.ncclAllGather(op->send, op->recv, op->count, dt, c, s); break;
    case NCFSM_KIND_REDUCESCATTER: r = ncfsm__nc.ncclReduceScatter(op->send, op->recv, op->count, dt, ro, c, s); break;
    case NCFSM_KIND_ALLTOALL:
      if (!NCCL_OPT(ncclAlltoAll)) return ncfsm__nccl_missing(NCFSM__NCCL_OPT_ncclAlltoAll);
      r = NCCL_OPT(ncclAlltoAll)(op->send, op->recv, op->count, dt, c, s);
      break;
    case NCFSM_KIND_GATHER:
      if (!NCCL_OPT(ncclGather)) return ncfsm__nccl_missing(NCFSM__NCCL_OPT_ncclGather);
      r = NCCL_OPT(ncclGather)(op->send, op->recv, op->count, dt, op->root, c, s);
      break;
    case NCFSM_KIND_SCATTER:
      if (!NCCL_OPT(ncclScatter)) return ncfsm__nccl_missing(NCFSM__NCCL_OPT_ncclScatter);
      r = NCCL_OPT(ncclScatter)(op->send, op->recv, op->count, dt, op->root, c, s);
      break;
    case NCFSM_KIND_SEND: r = ncfsm__nc.ncclSend(op->send, op->count, dt, op->peer, c, s); break;
    case NCFSM_KIND_RECV: r = ncfsm__nc.ncclRecv(op->recv, op->count, dt, op->peer, c, s); break;
    case NCFSM_OPKIND_COUNT:
    default:
      /* Never reaches NCCL: an argument error kills a nonblocking comm (R3). */
      ncfsm__nccl_own_error("operation kind %d is not an ncfsm_opkind_t", (int)op->kind);
      return ncclInvalidArgument;
  }
  return ncfsm__nccl_res(r);
}

static int b_finalize(void *bcomm) { return ncfsm__nccl_res(ncfsm__nc.ncclCommFinalize(((nccl_bcomm *)bcomm)->comm)); }

static int b_destroy(void *bcomm) {
  nccl_bcomm *bc = bcomm;
  ncclResult_t r = ncfsm__nc.ncclCommDestroy(bc->comm);
  /* R4: a refused Destroy leaves the comm alive; the engine aborts it next. */
  if (r == ncclSuccess) {
    pend_resolve(bc); /* Destroy needed ncclSuccess: a child made meanwhile is the caller's */
    free(bc);
  }
  return ncfsm__nccl_res(r);
}

static int b_abort(void *bcomm) {
  nccl_bcomm *bc = bcomm;
  ncclResult_t r = bc->comm ? ncfsm__nc.ncclCommAbort(bc->comm) : ncclSuccess;
  /* A child NCCL was still making for it: ncclCommAbort ended the parent's
   * job (ncclCommEnsureReady -> ncclGroupJobAbort), so nothing writes it any
   * more; nobody received it, so it goes too. */
  nccl_bcomm *ch = bc->pend;
  if (ch) {
    if (ch->comm) (void)ncfsm__nc.ncclCommAbort(ch->comm);
    free(ch);
  }
  free(bc); /* the engine drops the handle whatever Abort returned */
  return ncfsm__nccl_res(r);
}

static int b_revoke(void *bcomm, int flags) {
  if (!NCCL_OPT(ncclCommRevoke)) return ncfsm__nccl_missing(NCFSM__NCCL_OPT_ncclCommRevoke);
  return ncfsm__nccl_res(NCCL_OPT(ncclCommRevoke)(((nccl_bcomm *)bcomm)->comm, flags));
}

/* ---- communicators made from communicators (R7, R8; grow: NCCL 2.29) ---------------- */

static void pend_resolve(nccl_bcomm *bc) {
  nccl_bcomm *ch = bc->pend;
  if (!ch) return;
  void **out = bc->pend_out;
  bc->pend = NULL;
  bc->pend_out = NULL;
  if (ch->comm) {
    *out = ch;
  } else { /* NCCL_SPLIT_NOCOLOR: no communicator */
    free(ch);
    *out = NULL;
  }
}

/* After NCCL's call on the parent pb wrote (or will write) the child's handle
 * into ch->comm: an error drops the child (aborting what NCCL made); a
 * blocking parent's success hands it over now; a nonblocking parent's call
 * hands it over when the parent polls back to ncclSuccess (R8). */
static int child_after(nccl_bcomm *pb, nccl_bcomm *ch, void **child, ncclResult_t r) {
  if (r != ncclSuccess && r != ncclInProgress) {
    if (ch->comm) (void)ncfsm__nc.ncclCommAbort(ch->comm);
    free(ch);
    return ncfsm__nccl_res(r);
  }
  pb->pend = ch;
  pb->pend_out = child;
  if (pb->blocking && r == ncclSuccess) pend_resolve(pb);
  return ncfsm__nccl_res(r);
}

static int child_begin(nccl_bcomm *pb, void **child, const char *call) {
  *child = NULL;
  if (pb->pend) { /* the engine polls a parent to success before its next call (R2) */
    ncfsm__nccl_own_error("%s: the previous split/shrink/grow of this communicator has not polled to "
                          "ncclSuccess yet", call);
    return ncclInvalidUsage;
  }
  return ncfsm__nccl_force_device(pb->device) ? ncclUnhandledCudaError : ncclSuccess;
}

static int b_comm_split(void *parent, int color, int key, void **child, const ncfsm__comm_config *cfg) {
  nccl_bcomm *pb = parent;
  if (!NCCL_OPT(ncclCommSplit)) return ncfsm__nccl_missing(NCFSM__NCCL_OPT_ncclCommSplit);
  int rc = child_begin(pb, child, "ncclCommSplit");
  if (rc) return rc;
  ncclConfig_t config;
  nccl_bcomm *ch = bcomm_new(cfg, pb->device, &config); /* NCCL keeps the parent's device */
  if (!ch) return ncclSystemError;
  return child_after(pb, ch, child, NCCL_OPT(ncclCommSplit)(pb->comm, color, key, &ch->comm, &config));
}

static int b_comm_shrink(void *parent, const int *exclude, int nexclude, void **child,
                         const ncfsm__comm_config *cfg, int flags) {
  nccl_bcomm *pb = parent;
  if (!NCCL_OPT(ncclCommShrink)) return ncfsm__nccl_missing(NCFSM__NCCL_OPT_ncclCommShrink);
  int rc = child_begin(pb, child, "ncclCommShrink");
  if (rc) return rc;
  /* NCCL sorts the list in place: give it a copy */
  int *ex = nexclude > 0 ? malloc((size_t)nexclude * sizeof *ex) : NULL;
  if (nexclude > 0 && !ex) {
    ncfsm__nccl_own_error("out of host memory for an exclude list");
    return ncclSystemError;
  }
  if (ex) memcpy(ex, exclude, (size_t)nexclude * sizeof *ex);
  ncclConfig_t config;
  nccl_bcomm *ch = bcomm_new(cfg, pb->device, &config);
  if (!ch) {
    free(ex);
    return ncclSystemError;
  }
  ncclResult_t r = NCCL_OPT(ncclCommShrink)(pb->comm, ex, nexclude, &ch->comm, &config, flags);
  free(ex); /* NCCL's job keeps its own copy */
  return child_after(pb, ch, child, r);
}

/* A grow needs both ncclCommGetUniqueId and ncclCommGrow: name the one missing. */
static int grow_missing(void) {
  return ncfsm__nccl_missing(NCCL_OPT_AS(ncclCommGetUniqueId, void *) ? NCFSM__NCCL_OPT_ncclCommGrow
                                                                      : NCFSM__NCCL_OPT_ncclCommGetUniqueId);
}

static int b_comm_get_unique_id(void *bcomm, ncfsm_unique_id *id) {
  nccl_bcomm *bc = bcomm;
  if (!(ncfsm__nccl_found.features & NCFSM__HAS_GROW)) return grow_missing();
  ncclUniqueId uid;
  ncfsm__nccl_comm_get_unique_id_fn get = NCCL_OPT_AS(ncclCommGetUniqueId, ncfsm__nccl_comm_get_unique_id_fn);
  ncclResult_t r = get(bc->comm, &uid);
  if (r == ncclSuccess) memcpy(id, &uid, sizeof uid);
  return ncfsm__nccl_res(r);
}

static int b_comm_grow(void *parent, int nranks, const ncfsm_unique_id *id, int rank, void **child,
                       const ncfsm__comm_config *cfg) {
  if (!(ncfsm__nccl_found.features & NCFSM__HAS_GROW)) return grow_missing();
  ncclUniqueId uid;
  if (id) memcpy(&uid, id, sizeof uid);
  ncclConfig_t config;
  if (parent) { /* an existing rank: its child comes like a split's */
    nccl_bcomm *pb = parent;
    int rc = child_begin(pb, child, "ncclCommGrow");
    if (rc) return rc;
    nccl_bcomm *ch = bcomm_new(cfg, pb->device, &config);
    if (!ch) return ncclSystemError;
    ncfsm__nccl_comm_grow_fn grow = NCCL_OPT_AS(ncclCommGrow, ncfsm__nccl_comm_grow_fn);
    return child_after(pb, ch, child, grow(pb->comm, nranks, id ? &uid : NULL, -1, &ch->comm, &config));
  }
  /* a joining rank: like an init, on the device it names (NCCL reads the current device) */
  *child = NULL;
  nccl_bcomm *ch = NULL;
  int rc = init_begin(cfg, &ch, &config);
  if (rc) return rc;
  /* NCCL writes the handle in the call */
  ncfsm__nccl_comm_grow_fn grow = NCCL_OPT_AS(ncclCommGrow, ncfsm__nccl_comm_grow_fn);
  return init_after(ch, grow(NULL, nranks, id ? &uid : NULL, rank, &ch->comm, &config), child);
}

/* ncclCommUserRank + ncclCommCount: both need the comm ready (ncclCommEnsureReady:
 * ncclInvalidArgument while its async state is ncclInProgress, R2). */
static int b_comm_rank_size(void *bcomm, int *rank, int *size) {
  nccl_bcomm *bc = bcomm;
  ncclResult_t r = ncfsm__nc.ncclCommUserRank(bc->comm, rank);
  if (r == ncclSuccess) r = ncfsm__nc.ncclCommCount(bc->comm, size);
  return ncfsm__nccl_res(r);
}

static const char *b_last_error(void *bcomm) {
  (void)bcomm;
  if (ncfsm__nccl_err_set) return ncfsm__nccl_err;
  const char *s = ncfsm__nc.ncclGetLastError ? ncfsm__nc.ncclGetLastError(NULL) : NULL;
  return s ? s : "";
}

static int b_device_count(void) {
  ncfsm__nccl_load();
  return ncfsm__nccl_found.device_count;
}

const ncfsm__backend ncfsm__backend_nccl = {
    .name = "nccl",
    .kind = NCFSM_BACKEND_NCCL,
    .open = b_open,
    .version = b_version,
    .features = b_features,
    .get_unique_id = b_get_unique_id,
    .comm_init = b_comm_init,
    .comm_init_scalable = b_comm_init_scalable,
    .host_notify = b_host_notify,
    .get_async_error = b_get_async_error,
    .group_start = b_group_start,
    .group_end = b_group_end,
    .op = b_op,
    .finalize = b_finalize,
    .destroy = b_destroy,
    .abort = b_abort,
    .revoke = b_revoke,
    .comm_split = b_comm_split,
    .comm_shrink = b_comm_shrink,
    .comm_get_unique_id = b_comm_get_unique_id,
    .comm_grow = b_comm_grow,
    .comm_rank_size = b_comm_rank_size,
    .last_error = b_last_error,
    .stream_create = ncfsm__nccl_stream_create,
    .stream_destroy = ncfsm__nccl_stream_destroy,
    .stream_device = ncfsm__nccl_stream_device,
    .event_create = ncfsm__nccl_event_create,
    .event_create_flags = ncfsm__nccl_event_create_flags,
    .event_record = ncfsm__nccl_event_record,
    .event_query = ncfsm__nccl_event_query,
    .event_elapsed_ms = ncfsm__nccl_event_elapsed_ms,
    .event_destroy = ncfsm__nccl_event_destroy,
    .device_count = b_device_count,
    .mem_alloc = ncfsm__nccl_mem_alloc,
    .mem_free = ncfsm__nccl_mem_free,
    .memcpy_sync = ncfsm__nccl_memcpy_sync,
};
