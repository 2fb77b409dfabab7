/*
 * The sim's inits (R1, docs/sim.md "Cliques"): a rank joins the clique its
 * unique id names (made here, or attached to in shared memory), then polls
 * (nonblocking) or waits at its outermost group end (blocking) until every
 * rank joined. ncclCommInitRankScalable keys the clique by all its ids.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "core/log.h"
#include "core/sim/sim-comm.h"
#include "core/sim/sim-faults.h"

/* Attach to (or create) the clique's segment and join its membership. The
 * caller checked the arguments (rank in range) and the group mode; `call`
 * names the NCCL call in WARNs. */
int ncfsm__sim_comm_make(sim_comm **out, int nranks, const unsigned char *key, int rank, int blocking,
                         int device, const ncfsm_sim_opts *so, const char *name, const char *call) {
  sim_clique *q = ncfsm__sim_clique_find(key);
  if (q && q->nranks != nranks) {
    ncfsm__sim_warn("%s: nranks %d differs from %d of the ranks already joined (sim)", call, nranks,
                    q->nranks);
    return E_ARG;
  }
  if (q && q->slot[rank]) {
    ncfsm__sim_warn("%s: rank %d already joined this clique (sim)", call, rank);
    return E_ARG;
  }
  ncfsm__sim_atfork_once();

  ncfsm_sim_opts o;
  int orc = ncfsm__sim_call_opts(so, &o, call);
  if (orc != OK) return orc;

  sim_comm *c = calloc(1, sizeof *c);
  if (c) {
    c->nsend = calloc((size_t)nranks, sizeof *c->nsend);
    c->nrecv = calloc((size_t)nranks, sizeof *c->nrecv);
  }
  if (!c || !c->nsend || !c->nrecv) {
    if (c) {
      free(c->nsend);
      free(c->nrecv);
      free(c);
    }
    ncfsm__sim_warn("%s: out of memory", call);
    return E_SYSTEM;
  }
  /* the testing kit's plan (sim-faults.h): options, shuffle seed, faults */
  c->fs = ncfsm__sim_fault_bind(&o, name, rank);
  int fresh = 0, rc = OK;
  if (!q) { /* this process's first rank of the clique: attach to (or create) the segment */
    rc = ncfsm__sim_shm_attach(key, nranks, o.shuffle_seed, &q);
    fresh = rc == OK;
  }
  if (rc == OK && ncfsm__sim_shm_lock(q)) rc = E_SYSTEM;
  if (rc == OK) {
    shm_hdr *h = q->h;
    if (h->nranks != nranks) {
      ncfsm__sim_warn("%s: nranks %d differs from %d of the ranks already joined (sim)", call, nranks,
                      h->nranks);
      rc = E_ARG;
    } else if (h->rank[rank].used) {
      ncfsm__sim_warn("%s: rank %d already joined this clique (sim, pid %d)", call, rank,
                      (int)h->rank[rank].pid);
      rc = E_ARG;
    } else {
      h->rank[rank].used = 1;
      h->rank[rank].live = 1;
      h->rank[rank].pid = (int)getpid();
      h->joined++;
      h->live++;
    }
    ncfsm__sim_shm_unlock(q);
  }
  if (rc != OK) {
    if (fresh) ncfsm__sim_shm_detach(q); /* the segment stays for the ranks that own it */
    ncfsm__sim_fault_free(c->fs);
    free(c->nsend);
    free(c->nrecv);
    free(c);
    return rc;
  }
  c->magic = SIM_MAGIC_COMM;
  c->q = q;
  c->rank = rank;
  c->nranks = nranks;
  c->blocking = blocking ? 1 : 0;
  c->device = device;
  c->o = o;
  c->drift_limit = ncfsm__sim_setting(NCFSM__SET_SIM_DRIFT_LIMIT).i; /* R13 */
  c->pid = (int)getpid();
  c->fork_gen = ncfsm__sim_fork_gen;
  snprintf(c->name, sizeof c->name, "%s", name ? name : "");
  c->state = IN_PROGRESS;
  c->phase = SIM_PH_INIT;
  c->countdown = ncfsm__sim_fault_phase(c, SIM_PH_INIT, o.init_polls, 0);
  q->slot[rank] = c;
  q->nlocal++;
  *out = c;
  return OK;
}

int ncfsm__sim_comm_create(sim_comm **out, int nranks, const unsigned char *key, int rank,
                           const ncfsm__comm_config *cfg, const char *call) {
  sim_clique *q = ncfsm__sim_clique_find(key);
  if (q && q->nranks == nranks && q->slot[rank] && q->slot[rank]->state == IN_PROGRESS) {
    ncfsm__sim_cwarn(q->slot[rank], R2_WARN); /* R2: init again while the first is in progress */
    ncfsm__sim_group_fail(q->slot[rank], E_ARG);
    return E_ARG;
  }
  int blocking = cfg->blocking ? 1 : 0;
  if ((!q || (q->nranks == nranks && !q->slot[rank])) && ncfsm__sim_group_mode_check(blocking))
    return E_ARG; /* R3, and the R4 cascade */
  return ncfsm__sim_comm_make(out, nranks, key, rank, blocking, cfg->device, cfg->sim, cfg->name, call);
}

int ncfsm__sim_comm_init(void **bcomm, int nranks, const ncfsm_unique_id *id, int rank,
                         const ncfsm__comm_config *cfg) {
  LOCK();
  int implicit = ncfsm__sim_implicit_begin(), rc = OK;
  sim_comm *c = NULL;
  if (bcomm) *bcomm = NULL;
  if (!bcomm || !id || !cfg) {
    ncfsm__sim_warn("ncclCommInitRankConfig : invalid argument (NULL pointer)");
    rc = E_ARG;
  } else if (nranks < 1 || rank < 0 || rank >= nranks) {
    ncfsm__sim_warn("Invalid rank requested : %d/%d", rank, nranks);
    rc = E_ARG;
  } else if (memcmp(id->internal + SIM_ID_KEY_LEN, SIM_ID_TAG, SIM_ID_TAG_LEN)) {
    ncfsm__sim_warn("ncclCommInitRank: unique id was not made by the sim's get_unique_id");
    rc = E_ARG;
  } else {
    rc = ncfsm__sim_comm_create(&c, nranks, (const unsigned char *)id->internal, rank, cfg,
                                "ncclCommInitRank");
  }
  if (!rc) {
    c->st.inits++;
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: rank %d/%d init (%s%s%s)", rank, nranks,
               c->blocking ? "blocking" : "nonblocking", c->name[0] ? ", " : "", c->name);
  }
  rc = ncfsm__sim_init_end(implicit, c, rc, bcomm);
  UNLOCK();
  return rc;
}

/* Measured on 2.28.3/2.28.9: inside a group the init call returns
 * ncclSuccess; the outermost group end returns InProgress
 * (docs/conformance.md, row init). */
int ncfsm__sim_init_end(int implicit, sim_comm *c, int rc, void **out) {
  if (!rc) {
    c->init_in_group = 1; /* completes (blocking) or arms (nonblocking) at the outermost end */
    ncfsm__sim_group_join(c);
    *out = c;
  }
  return ncfsm__sim_call_end(implicit, rc ? NULL : c, rc);
}

/* ncclCommInitRankScalable: the clique is keyed by all nids ids, in order
 * (a rank passing other ids never meets the others, as with NCCL); each id
 * must be the sim's. Otherwise it is comm_init. */
int ncfsm__sim_comm_init_scalable(void **bcomm, int nranks, const ncfsm_unique_id *ids, int nids, int rank,
                                  const ncfsm__comm_config *cfg) {
  if (bcomm) *bcomm = NULL;
  int rc = OK;
  LOCK();
  if (ncfsm__sim_version() < 22304) {
    ncfsm__sim_warn("ncclCommInitRankScalable needs NCCL 2.23.4 (modelled %d)", ncfsm__sim_version());
    rc = E_USAGE;
  } else if (!ids || nids < 1 || nids > nranks) {
    ncfsm__sim_warn("ncclCommInitRankScalable: nId %d is not in [1, nranks %d]", nids, nranks);
    rc = E_ARG;
  } else {
    for (int j = 0; j < nids && !rc; j++)
      if (memcmp(ids[j].internal + SIM_ID_KEY_LEN, SIM_ID_TAG, SIM_ID_TAG_LEN)) {
        ncfsm__sim_warn("ncclCommInitRankScalable: unique id %d was not made by the sim's get_unique_id", j);
        rc = E_ARG;
      }
  }
  UNLOCK();
  if (rc) return rc;
  ncfsm_unique_id key;
  memset(&key, 0, sizeof key);
  XXH128_hash_t h = XXH3_128bits(ids, (size_t)nids * sizeof *ids);
  memcpy(key.internal, &h, SIM_ID_KEY_LEN);
  memcpy(key.internal + SIM_ID_KEY_LEN, SIM_ID_TAG, SIM_ID_TAG_LEN);
  return ncfsm__sim_comm_init(bcomm, nranks, &key, rank, cfg);
}
