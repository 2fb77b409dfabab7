/*
 * The pmix bootstrap: PMIx_Init, job info for rank/size/local rank/local
 * size, and allgather #n = PMIx_Put(GLOBAL, "ncfsm.ag.<n>") + PMIx_Commit +
 * PMIx_Fence_nb(all, collect data), then PMIx_Get_nb of every rank's value;
 * broadcast #n = root's PMIx_Put(GLOBAL, "ncfsm.bc.<n>") + PMIx_Commit, a fence
 * without data collection, then PMIx_Get_nb of root's value on the others.
 *
 * PMIx runs its callbacks on its own progress thread. They only hand results
 * over: they fill a refcounted cell (not loop state), then, under the cell's
 * mutex, event_active the request's wake event if the request still exists.
 * Everything else (issuing the gets, copying into recv, finishing) runs on
 * the loop thread from that wake event (ncfsm__boot_ops.progress).
 *
 * Channels (no fences: they never meet the program's own) are pmix_channel.c;
 * notices (PMIx_Notify_event) pmix_notice.c.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <pmix.h>

#include "bootstrap/pmix-internal.h"

enum { PH_FENCING = 0, PH_FENCED, PH_GETTING, PH_GOT };

typedef struct pcell {
  pthread_mutex_t mu;
  atomic_int refs;
  ncfsm_boot_req *req; /* under mu; NULL once the request is gone */
  atomic_int phase;
  pmix_status_t fence_status;
  atomic_int gets_left;
  _Atomic pmix_status_t get_status; /* first failure */
  int size;
  unsigned char **vals; /* [size], filled by the get callbacks */
  size_t *vlens;
  pmix_info_t *info;
  char key[PMIX_MAX_KEYLEN + 1];
  pmix_proc_t *procs; /* the job's nspace, for the gets */
  uint8_t *is_root;   /* ROOTS: [size] */
} pcell;

typedef struct pget {
  pcell *cell;
  int rank;
} pget;

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static int init_refs;
static unsigned n_instances;

static void cell_unref(pcell *c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  for (int r = 0; r < c->size; r++) free(c->vals[r]);
  free(c->vals);
  free(c->vlens);
  if (c->info) PMIX_INFO_FREE(c->info, 1);
  free(c->procs);
  free(c->is_root);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

/* PMIx thread: hand the cell to the loop. */
static void cell_hand_over(pcell *c) {
  pthread_mutex_lock(&c->mu);
  if (c->req) event_active(c->req->wake, 0, 0);
  pthread_mutex_unlock(&c->mu);
}

static void fence_cb(pmix_status_t status, void *cbdata) {
  pcell *c = cbdata;
  ncfsm__pmix_quickack();
  c->fence_status = status;
  atomic_store(&c->phase, PH_FENCED);
  cell_hand_over(c);
  cell_unref(c);
}

static void get_cb(pmix_status_t status, pmix_value_t *kv, void *cbdata) {
  pget *g = cbdata;
  pcell *c = g->cell;
  ncfsm__pmix_quickack();
  int ours = status == PMIX_SUCCESS && kv; /* an error's kv stays libpmix's (a double free) */
  if (status == PMIX_SUCCESS && kv && kv->type == PMIX_BYTE_OBJECT) {
    c->vlens[g->rank] = kv->data.bo.size;
    c->vals[g->rank] = malloc(kv->data.bo.size ? kv->data.bo.size : 1);
    if (c->vals[g->rank]) memcpy(c->vals[g->rank], kv->data.bo.bytes, kv->data.bo.size);
    else status = PMIX_ERR_NOMEM;
  } else if (status == PMIX_SUCCESS) {
    status = PMIX_ERR_TYPE_MISMATCH;
  }
  if (status != PMIX_SUCCESS) {
    pmix_status_t expect = PMIX_SUCCESS;
    atomic_compare_exchange_strong(&c->get_status, &expect, status);
  }
  if (ours) PMIX_VALUE_RELEASE(kv); /* PMIx hands a found value over to the callback */
  free(g);
  if (atomic_fetch_sub(&c->gets_left, 1) == 1) {
    atomic_store(&c->phase, PH_GOT);
    cell_hand_over(c);
  }
  cell_unref(c);
}

static int get_u32(const pmix_proc_t *p, const char *key, uint32_t *out) {
  pmix_value_t *v = NULL;
  if (PMIx_Get(p, key, NULL, 0, &v) != PMIX_SUCCESS || !v) return -1;
  int ok = 0;
  switch (v->type) {
  case PMIX_UINT32: *out = v->data.uint32; break;
  case PMIX_UINT16: *out = v->data.uint16; break;
  case PMIX_INT: *out = (uint32_t)v->data.integer; break;
  case PMIX_UINT: *out = v->data.uint; break;
  case PMIX_PROC_RANK: *out = v->data.rank; break;
  default: ok = -1;
  }
  PMIX_VALUE_RELEASE(v);
  return ok;
}

static ncfsm_result_t pmix_open(ncfsm_boot *b, const ncfsm_boot_opts *o) {
  (void)o;
  pmix_impl *p = calloc(1, sizeof *p);
  if (!p) return NCFSM_ERR_NO_MEMORY;
  pthread_mutex_lock(&init_mu);
  pmix_status_t rc = PMIx_Init(&p->me, NULL, 0);
  if (rc != PMIX_SUCCESS) {
    pthread_mutex_unlock(&init_mu);
    ncfsm__boot_seterr(b, "no PMIx server reachable: launch with mpirun/prterun/srun --mpi=pmix, or "
                          "set NCFSM_BOOTSTRAP=tcp (PMIx_Init: %s)",
                       PMIx_Error_string(rc));
    free(p);
    return NCFSM_ERR_BOOTSTRAP;
  }
  if (init_refs++ == 0) ncfsm__pmix_notices_start();
  p->inst = n_instances++;
  pthread_mutex_unlock(&init_mu);

  pmix_proc_t wild;
  PMIX_LOAD_PROCID(&wild, p->me.nspace, PMIX_RANK_WILDCARD);
  uint32_t size = 0, lrank = 0, lsize = 0;
  if (get_u32(&wild, PMIX_JOB_SIZE, &size) != 0 || size == 0) {
    ncfsm__boot_seterr(b, "PMIx: no %s for job %s; the launcher did not publish the job size",
                       PMIX_JOB_SIZE, p->me.nspace);
    goto fail;
  }
  if (get_u32(&p->me, PMIX_LOCAL_RANK, &lrank) != 0) lrank = 0;
  if (get_u32(&wild, PMIX_LOCAL_SIZE, &lsize) != 0 || lsize == 0) lsize = 1;
  b->rank = (int)p->me.rank;
  b->size = (int)size;
  b->local_rank = (int)lrank;
  b->local_size = (int)lsize;
  b->impl = p;
  ncfsm__pmix_reg_add(b, p->inst, 0, NULL);
  return NCFSM_OK;
fail:
  pthread_mutex_lock(&init_mu);
  if (--init_refs == 0) {
    ncfsm__pmix_notices_stop();
    PMIx_Finalize(NULL, 0);
  }
  pthread_mutex_unlock(&init_mu);
  free(p);
  return NCFSM_ERR_BOOTSTRAP;
}

static void pmix_close(ncfsm_boot *b) {
  ncfsm__pmix_reg_del(b);
  free(b->impl);
  b->impl = NULL;
  pthread_mutex_lock(&init_mu);
  if (--init_refs == 0) {
    ncfsm__pmix_notices_stop();
    pmix_status_t rc = PMIx_Finalize(NULL, 0);
    if (rc != PMIX_SUCCESS)
      NCFSM_WARN(NCFSM__SUB_BOOT, "PMIx_Finalize: %s", PMIx_Error_string(rc));
  }
  pthread_mutex_unlock(&init_mu);
}

static ncfsm_result_t pmix_fail_req(ncfsm_boot *b, const ncfsm_boot_req *req, const char *what,
                                    pmix_status_t rc) {
  return ncfsm__boot_fail(b, NCFSM_ERR_BOOTSTRAP, "PMIx %s #%" PRIu64 ": %s: %s",
                          req->kind == NCFSM__REQ_GATHER ? "allgather" : "broadcast", req->seq, what,
                          PMIx_Error_string(rc));
}

/* broadcast #n: root PMIx_Put(GLOBAL, "ncfsm.bc.<n>") + PMIx_Commit; every rank
 * PMIx_Fence_nb WITHOUT data collection; then the others PMIx_Get_nb root's key alone: one
 * value to each rank, where the allgather's fence with data collection ships every rank's to
 * every node. Measured with Open MPI 4.1.4 / PMIx 4.2: without the fence, a Get of a key not
 * yet committed is held by the server until it is, but only until the first fence with data
 * collection; after one it answers NOT-FOUND at once (PMIX_GET_REFRESH_CACHE too). So a
 * broadcast is one fence in the launcher's sequence: on pmix, broadcasts and allgathers must
 * be posted in the same order on every rank (crossed, the fences fail with INVALID-ARG). */
static ncfsm_result_t pmix_post(ncfsm_boot *b, ncfsm_boot_req *req) {
  pmix_impl *p = b->impl;
  pcell *c = calloc(1, sizeof *c);
  if (!c) return NCFSM_ERR_NO_MEMORY;
  pthread_mutex_init(&c->mu, NULL);
  atomic_init(&c->refs, 1); /* the request's */
  c->size = b->size;
  c->vals = calloc((size_t)b->size, sizeof *c->vals);
  c->vlens = calloc((size_t)b->size, sizeof *c->vlens);
  if (!c->vals || !c->vlens) {
    cell_unref(c);
    return NCFSM_ERR_NO_MEMORY;
  }
  if (req->kind == NCFSM__REQ_ROOTS) { /* root j puts its slot of buf */
    if (!(c->is_root = calloc((size_t)b->size, 1))) {
      cell_unref(c);
      return NCFSM_ERR_NO_MEMORY;
    }
    req->send = NULL;
    for (int j = 0; j < req->nsubs; j++) {
      int r = ncfsm_boot_root_of(b->size, req->nsubs, j);
      c->is_root[r] = 1;
      if (r == b->rank) req->send = (unsigned char *)req->recv + (size_t)j * req->len;
    }
  }
  if (req->len && req->send) {
    if (!(c->vals[b->rank] = malloc(req->len))) {
      cell_unref(c);
      return NCFSM_ERR_NO_MEMORY;
    }
    memcpy(c->vals[b->rank], req->send, req->len);
  }
  c->vlens[b->rank] = req->len;
  const char *kind = req->kind == NCFSM__REQ_GATHER ? "ag" : "bc";
  if (p->inst == 0) snprintf(c->key, sizeof c->key, "ncfsm.%s.%" PRIu64, kind, req->seq);
  else snprintf(c->key, sizeof c->key, "ncfsm.%s.%u.%" PRIu64, kind, p->inst, req->seq);
  int put = req->len && req->send; /* a broadcast's root(s), every rank of an allgather */
  pmix_status_t rc;
  if (put) {
    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_BYTE_OBJECT;
    v.data.bo.bytes = (char *)req->send;
    v.data.bo.size = req->len;
    rc = PMIx_Put(PMIX_GLOBAL, c->key, &v); /* copies */
    if (rc != PMIX_SUCCESS) {
      cell_unref(c);
      return pmix_fail_req(b, req, "PMIx_Put", rc);
    }
    if ((rc = PMIx_Commit()) != PMIX_SUCCESS) {
      cell_unref(c);
      return pmix_fail_req(b, req, "PMIx_Commit", rc);
    }
  }
  pmix_proc_t wild;
  PMIX_LOAD_PROCID(&wild, p->me.nspace, PMIX_RANK_WILDCARD);
  bool collect = req->len > 0 && req->kind == NCFSM__REQ_GATHER;
  PMIX_INFO_CREATE(c->info, 1);
  PMIX_INFO_LOAD(&c->info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
  c->req = req;
  req->impl = c;
  atomic_fetch_add(&c->refs, 1); /* the fence callback's */
  rc = PMIx_Fence_nb(&wild, 1, c->info, 1, fence_cb, c);
  if (rc == PMIX_OPERATION_SUCCEEDED) {
    atomic_fetch_sub(&c->refs, 1);
    c->fence_status = PMIX_SUCCESS;
    atomic_store(&c->phase, PH_FENCED);
    event_active(req->wake, 0, 0);
  } else if (rc != PMIX_SUCCESS) {
    atomic_fetch_sub(&c->refs, 1);
    req->impl = NULL;
    cell_unref(c);
    return pmix_fail_req(b, req, "PMIx_Fence_nb", rc);
  }
  return NCFSM_OK;
}

static void pmix_cancel(ncfsm_boot_req *req);

/* Finish req and drop its reference to the cell. */
static void pmix_finish(ncfsm_boot_req *req, ncfsm_result_t st) {
  pmix_cancel(req);
  ncfsm__boot_req_finish(req, st);
}

/* Loop thread, from the request's wake event. */
static void pmix_progress(ncfsm_boot_req *req) {
  ncfsm_boot *b = req->b;
  pmix_impl *p = b->impl;
  pcell *c = req->impl;
  if (!c) return;
  int phase = atomic_load(&c->phase);
  if (phase == PH_FENCED) {
    if (c->fence_status != PMIX_SUCCESS) {
      pmix_fail_req(b, req, "PMIx_Fence_nb completed with", c->fence_status);
      return pmix_finish(req, NCFSM_ERR_BOOTSTRAP);
    }
    int bc = req->kind == NCFSM__REQ_BCAST, rt = req->kind == NCFSM__REQ_ROOTS;
    if (req->len == 0 || b->size == 1 || (bc && req->root == b->rank)) {
      if (req->len && !bc && !rt) memcpy(req->recv, c->vals[b->rank], req->len);
      return pmix_finish(req, NCFSM_OK);
    }
    /* the ranks to get from: every other rank, root, or the other roots */
    int ngets = 0;
    for (int r = 0; r < b->size; r++)
      ngets += r != b->rank && (bc ? r == req->root : rt ? c->is_root[r] : 1);
    atomic_store(&c->phase, PH_GETTING);
    atomic_store(&c->gets_left, ngets);
    for (int r = 0; r < b->size; r++) {
      if (r == b->rank || (bc && r != req->root) || (rt && !c->is_root[r])) continue;
      pget *g = malloc(sizeof *g);
      pmix_status_t rc = PMIX_ERR_NOMEM;
      if (g) {
        g->cell = c;
        g->rank = r;
        pmix_proc_t proc;
        PMIX_LOAD_PROCID(&proc, p->me.nspace, (pmix_rank_t)r);
        atomic_fetch_add(&c->refs, 1);
        rc = PMIx_Get_nb(&proc, c->key, NULL, 0, get_cb, g);
        if (rc == PMIX_SUCCESS) continue;
        atomic_fetch_sub(&c->refs, 1);
        free(g);
      }
      /* no callback will come for this rank: count it as failed here */
      pmix_status_t expect = PMIX_SUCCESS;
      atomic_compare_exchange_strong(&c->get_status, &expect, rc);
      if (atomic_fetch_sub(&c->gets_left, 1) == 1) {
        atomic_store(&c->phase, PH_GOT);
        event_active(req->wake, 0, 0);
      }
    }
    return;
  }
  if (phase != PH_GOT) return;
  pmix_status_t gs = atomic_load(&c->get_status);
  if (gs != PMIX_SUCCESS) {
    pmix_fail_req(b, req, "PMIx_Get_nb of another rank's contribution", gs);
    return pmix_finish(req, NCFSM_ERR_BOOTSTRAP);
  }
  unsigned char *out = req->recv;
  if (req->kind == NCFSM__REQ_ROOTS) {
    for (int j = 0; j < req->nsubs; j++) {
      int r = ncfsm_boot_root_of(b->size, req->nsubs, j);
      if (r == b->rank) continue;
      if (c->vlens[r] != req->len) {
        ncfsm__boot_fail(b, NCFSM_ERR_BOOTSTRAP,
                         "PMIx broadcast #%" PRIu64 ": root %d posted %zu bytes, this rank expects "
                         "%zu; every rank must make the same bootstrap calls",
                         req->seq + (uint64_t)j, r, c->vlens[r], req->len);
        return pmix_finish(req, NCFSM_ERR_BOOTSTRAP);
      }
      memcpy(out + (size_t)j * req->len, c->vals[r], req->len);
    }
    return pmix_finish(req, NCFSM_OK);
  }
  if (req->kind == NCFSM__REQ_BCAST) {
    if (c->vlens[req->root] != req->len) {
      ncfsm__boot_fail(b, NCFSM_ERR_BOOTSTRAP,
                       "PMIx broadcast #%" PRIu64 ": root %d posted %zu bytes, this rank expects "
                       "%zu; every rank must make the same bootstrap calls",
                       req->seq, req->root, c->vlens[req->root], req->len);
      return pmix_finish(req, NCFSM_ERR_BOOTSTRAP);
    }
    memcpy(out, c->vals[req->root], req->len);
    return pmix_finish(req, NCFSM_OK);
  }
  for (int r = 0; r < b->size; r++) {
    if (c->vlens[r] != req->len) {
      ncfsm__boot_fail(b, NCFSM_ERR_BOOTSTRAP,
                       "PMIx allgather #%" PRIu64 ": rank %d contributed %zu bytes, this rank %zu; "
                       "every rank must make the same bootstrap calls",
                       req->seq, r, c->vlens[r], req->len);
      return pmix_finish(req, NCFSM_ERR_BOOTSTRAP);
    }
    memcpy(out + (size_t)r * req->len, c->vals[r], req->len);
  }
  pmix_finish(req, NCFSM_OK);
}

/* The request is going away (freed or timed out): detach it from the cell so
 * a late PMIx callback does not wake a freed event. */
static void pmix_cancel(ncfsm_boot_req *req) {
  pcell *c = req->impl;
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->req = NULL;
  pthread_mutex_unlock(&c->mu);
  req->impl = NULL;
  cell_unref(c);
}

static void pmix_describe(ncfsm_boot *b, char *buf, size_t n) {
  pmix_impl *p = b->impl;
  snprintf(buf, n, "PMIx fence over job %s never completed", p->me.nspace);
}

const ncfsm__boot_ops ncfsm__boot_pmix_ops = {
    .name = "pmix",
    .open = pmix_open,
    .close = pmix_close,
    .post = pmix_post,
    .progress = pmix_progress,
    .cancel = pmix_cancel,
    .describe = pmix_describe,
    .bcast_post = pmix_post,
    .roots_post = pmix_post, /* one fence for every root (concurrent ones fail: PARTIAL SUCCESS) */
    .channel_open = ncfsm__pmix_channel_open,
    .notice_post = ncfsm__pmix_notice_post,
    /* no agree_post: peer loss, agreement and survivors are unsupported */
    .no_recovery = NCFSM__PMIX_NO_RECOVERY,
};
