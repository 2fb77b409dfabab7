/*
 * Strict verification over a companion NCCL communicator (opts.verify_channel
 * NCCL): the fingerprints go through an AllGather on a communicator of the
 * verifier's own, made once the comm is in service from a unique id that
 * rank 0 broadcasts through the comm's bootstrap (verifier states SHARING,
 * JOINING). One exchange is in flight at a time (EXCHANGING, COLLECTING),
 * and it is posted only when the comm has no launch in progress and nothing
 * verified waiting to launch. So on every rank the GPU sees the comm's
 * collective k-1, then the companion's AllGather for k, then collective k:
 * the same order everywhere (two communicators whose kernels reach the GPUs
 * in different orders may deadlock).
 *
 * The companion is the verifier's, not an ncfsm_comm: the user never sees
 * it and it has no lifecycle of its own beyond the verifier's states. Its
 * calls are nonblocking and made on the loop thread (R9); its abort, the
 * one blocking call, goes with the loop's next aborts, without the lock
 * (fsm/control.c), and its buffers are freed after it.
 */
#include <stdio.h>
#include <stdlib.h>

#include "fsm/verify.h"
#include "ncfsm/bootstrap.h"

struct ncfsm__comp {
  ncfsm_unique_id id;
  ncfsm_boot_req *req;     /* SHARING: the broadcast */
  ncfsm_sim_opts sim;      /* the sim's opts for the companion: defaults, but a dead rank stays dead */
  void *bcomm, *stream, *ev;
  void *dmine, *dall;      /* ncfsm_mem_alloc: device memory (host memory where the backend has none) */
  struct ncfsm__sreq *cur; /* EXCHANGING, COLLECTING: the exchange in flight */
  uint64_t t_phase;        /* when the current phase (a set-up step or an exchange) began */
  uint64_t asked_phase;    /* the phase (its t_phase) whose stall the other ranks were asked about */
};

#define CHANNEL " (channel nccl)"

ncfsm_result_t ncfsm__vcomp_new(struct ncfsm__verifier *v) {
  struct ncfsm__comp *k = calloc(1, sizeof *k);
  if (!k) return NCFSM_ERR_NO_MEMORY;
  (void)ncfsm_sim_opts_init(&k->sim); /* its comm's ncfsm_comm_new refused a bad value (logged: the default) */
  k->sim.dead = v->c->sim.dead;
  k->sim.never_arrive = v->c->sim.never_arrive;
  v->comp = k;
  return NCFSM_OK;
}

/* A channel failure: the report names the backend's code. */
static void channel_failed(struct ncfsm__verifier *v, ncfsm_result_t cause, const char *what_, int code) {
  char what[400];
  snprintf(what, sizeof what, "strict verification" CHANNEL ": %s (%d, %s)", what_, code, ncfsm__nccl_result_name(code));
  ncfsm__verify_fire(v, NCFSM__VE_CHANNEL_FAILED, NCFSM_EV_ASYNC_ERROR, cause, what);
}

/* A phase past half the stall bound asks the other ranks how far they are (seq: what a rank
 * that got there has submitted; their answers come on the channel while the phase is still
 * polled); past the bound, the stall is named with them: who is behind, who did not answer. */
static bool stalled(struct ncfsm__verifier *v, uint64_t now, uint64_t seq, const char *what) {
  ncfsm_comm *c = v->c;
  struct ncfsm__comp *k = v->comp;
  uint64_t t0 = k->t_phase, stall = c->opts.verify_stall_ms * 1000000ull; /* t0 may be later than now: set by this turn */
  if (!stall || now <= t0 || now - t0 <= stall / 2) return false;
  if (k->asked_phase != t0 && ncfsm__vchan_ask_aside(v, seq, what, stall / 2)) k->asked_phase = t0;
  if (now - t0 <= stall) return false;
  char named[900];
  if (k->asked_phase == t0) ncfsm__vchan_culprits(v, named, sizeof named);
  ncfsm__verify_fire(v, NCFSM__VE_STALLED, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, k->asked_phase == t0 ? named : what);
  return true;
}

static void comp_kick(ncfsm_boot_req *req, ncfsm_result_t status, void *arg) {
  (void)req;
  (void)status;
  ncfsm__loop_kick_async(arg);
}

/* ---- set-up: SHARING, JOINING -------------------------------------------------------------- */

void ncfsm__vcomp_share_id(struct ncfsm__verifier *v) {
  ncfsm_comm *c = v->c;
  struct ncfsm__comp *k = v->comp;
  k->t_phase = ncfsm__now_ns();
  if (c->rank == 0 && c->be->get_unique_id(&k->id) != NCFSM__NCCL_SUCCESS) {
    channel_failed(v, NCFSM_ERR_BACKEND, "no unique id for the companion communicator", NCFSM__NCCL_INTERNAL_ERROR);
    return;
  }
  ncfsm_result_t r = ncfsm_boot_bcast_post(v->boot, &k->id, sizeof k->id, 0, &k->req);
  if (r != NCFSM_OK) {
    char what[400];
    snprintf(what, sizeof what, "strict verification" CHANNEL ": the bootstrap refused the companion's unique id "
                                "broadcast (%s): %s", ncfsm_err_name(r), ncfsm_boot_last_error(v->boot));
    ncfsm__verify_fire(v, NCFSM__VE_CHANNEL_FAILED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
    return;
  }
  ncfsm_boot_req_on_done(k->req, comp_kick, c->loop);
}

void ncfsm__vcomp_join(struct ncfsm__verifier *v) {
  ncfsm_comm *c = v->c;
  struct ncfsm__comp *k = v->comp;
  char name[96];
  snprintf(name, sizeof name, "%s.verify", c->name);
  ncfsm__comm_config cfg = {0, c->opts.device, &k->sim, name};
  size_t one = ncfsm__vstrict_msg_size();
  k->t_phase = ncfsm__now_ns();
  if (c->be->stream_create(c->opts.device, &k->stream) != 0 ||
      (c->be->event_create_flags ? c->be->event_create_flags(c->opts.device, 0, &k->ev)
                                 : c->be->event_create(c->opts.device, &k->ev)) != 0 ||
      ncfsm_mem_alloc(c, one, &k->dmine) != NCFSM_OK || ncfsm_mem_alloc(c, one * (size_t)c->nranks, &k->dall) != NCFSM_OK) {
    channel_failed(v, NCFSM_ERR_BACKEND, "no stream, event or device memory for the companion communicator",
                   NCFSM__NCCL_UNHANDLED_CUDA_ERROR);
    return;
  }
  int rc = c->be->comm_init(&k->bcomm, c->nranks, &k->id, c->rank, &cfg);
  if (NCFSM__IS_ERR(rc)) {
    k->bcomm = NULL;
    channel_failed(v, ncfsm__cause_of(rc), "the companion communicator's init failed", rc);
  }
}

static void setup_poll(struct ncfsm__verifier *v, uint64_t now) {
  ncfsm_comm *c = v->c;
  struct ncfsm__comp *k = v->comp;
  char what[400];
  if (v->state == NCFSM__VS_SHARING) {
    ncfsm_result_t r = ncfsm_boot_test(k->req);
    if (r == NCFSM_ERR_AGAIN) {
      snprintf(what, sizeof what, "strict verification" CHANNEL ": not every rank reached the companion "
                                  "communicator's set-up within %llu ms", (unsigned long long)c->opts.verify_stall_ms);
      stalled(v, now, 0, what);
      return;
    }
    ncfsm_boot_req_free(k->req);
    k->req = NULL;
    if (r != NCFSM_OK) {
      snprintf(what, sizeof what, "strict verification" CHANNEL ": the companion's unique id broadcast failed (%s)",
               ncfsm_err_name(r));
      ncfsm__verify_fire(v, NCFSM__VE_CHANNEL_FAILED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
      return;
    }
    ncfsm__verify_fire(v, NCFSM__VE_ID_SHARED, NCFSM_EV_ASYNC_ERROR, NCFSM_OK, NULL); /* join */
    return;
  }
  int st = NCFSM__NCCL_SUCCESS; /* JOINING */
  int rc = c->be->get_async_error(k->bcomm, &st);
  if (NCFSM__IS_ERR(rc) || NCFSM__IS_ERR(st)) {
    int code = NCFSM__IS_ERR(rc) ? rc : st;
    channel_failed(v, ncfsm__cause_of(code), "the companion communicator's init failed", code);
    return;
  }
  if (st == NCFSM__NCCL_IN_PROGRESS) {
    snprintf(what, sizeof what, "strict verification" CHANNEL ": the companion communicator was not ready within %llu ms",
             (unsigned long long)c->opts.verify_stall_ms);
    stalled(v, now, 0, what);
    return;
  }
  ncfsm__verify_fire(v, NCFSM__VE_JOINED, NCFSM_EV_ASYNC_ERROR, NCFSM_OK, NULL);
}

/* ---- an exchange: EXCHANGING, COLLECTING ------------------------------------------------------ */

void ncfsm__vcomp_post(struct ncfsm__verifier *v) {
  ncfsm_comm *c = v->c;
  struct ncfsm__comp *k = v->comp;
  struct ncfsm__sreq *q = ncfsm__vstrict_take(v);
  k->cur = q;
  k->t_phase = ncfsm__now_ns();
  size_t one;
  void *mine = ncfsm__vstrict_mine(q, &one);
  if (ncfsm_memcpy(c, k->dmine, mine, one, 1) != NCFSM_OK) {
    channel_failed(v, NCFSM_ERR_BACKEND, "copying the fingerprint to the device failed", NCFSM__NCCL_UNHANDLED_CUDA_ERROR);
    return;
  }
  ncfsm__op op = {NCFSM_KIND_ALLGATHER, k->dmine, k->dall, one, NCFSM_UINT8, NCFSM_OP_SUM, -1, -1, k->stream};
  int rc = c->be->op(k->bcomm, &op);
  if (NCFSM__IS_ERR(rc)) channel_failed(v, ncfsm__cause_of(rc), "the companion's AllGather failed", rc);
}

void ncfsm__vcomp_record(struct ncfsm__verifier *v) {
  struct ncfsm__comp *k = v->comp;
  int rc = v->c->be->event_record(k->ev, k->stream);
  if (rc != 0) channel_failed(v, NCFSM_ERR_BACKEND, "recording the companion's event failed", rc);
}

void ncfsm__vcomp_collect(struct ncfsm__verifier *v) {
  ncfsm_comm *c = v->c;
  struct ncfsm__comp *k = v->comp;
  struct ncfsm__sreq *q = k->cur;
  size_t one;
  ncfsm__vstrict_mine(q, &one);
  k->cur = NULL;
  if (ncfsm_memcpy(c, ncfsm__vstrict_all(q), k->dall, one * (size_t)c->nranks, 0) != NCFSM_OK) {
    ncfsm__sreq_free(q);
    channel_failed(v, NCFSM_ERR_BACKEND, "copying the fingerprints from the device failed",
                   NCFSM__NCCL_UNHANDLED_CUDA_ERROR);
    return;
  }
  ncfsm__vstrict_settle(v, q);
}

bool ncfsm__vcomp_poll(struct ncfsm__verifier *v, uint64_t now) {
  ncfsm_comm *c = v->c;
  struct ncfsm__comp *k = v->comp;
  unsigned before = v->state;
  char what[600];
  if (v->state == NCFSM__VS_SHARING || v->state == NCFSM__VS_JOINING) {
    setup_poll(v, now);
    if (v->state != NCFSM__VS_RUNNING) return v->state != before;
  }
  for (;;) {
    switch (v->state) {
      case NCFSM__VS_RUNNING:
        if (!v->sp_head || !ncfsm__vstrict_may_post(c)) return v->state != before;
        ncfsm__verify_fire(v, NCFSM__VE_POST, NCFSM_EV_ASYNC_ERROR, NCFSM_OK, NULL);
        continue;
      case NCFSM__VS_EXCHANGING: {
        int st = NCFSM__NCCL_SUCCESS;
        int rc = c->be->get_async_error(k->bcomm, &st);
        if (NCFSM__IS_ERR(rc) || NCFSM__IS_ERR(st)) {
          int code = NCFSM__IS_ERR(rc) ? rc : st;
          channel_failed(v, ncfsm__cause_of(code), "the companion communicator failed", code);
          return true;
        }
        if (st == NCFSM__NCCL_IN_PROGRESS) break; /* R2: no event before the launch is final */
        ncfsm__verify_fire(v, NCFSM__VE_FINAL, NCFSM_EV_ASYNC_ERROR, NCFSM_OK, NULL);
        continue;
      }
      case NCFSM__VS_COLLECTING: {
        int q = c->be->event_query(k->ev);
        if (q == 1) break;
        if (q != 0) {
          channel_failed(v, NCFSM_ERR_BACKEND, "the companion's event failed", q);
          return true;
        }
        ncfsm__verify_fire(v, NCFSM__VE_COLLECTED, NCFSM_EV_ASYNC_ERROR, NCFSM_OK, NULL);
        continue;
      }
      default: return true; /* failed, broken or stopped meanwhile */
    }
    break; /* an exchange waits: stalled? */
  }
  ncfsm__vstrict_stall_text(v, k->cur, CHANNEL, what, sizeof what);
  return stalled(v, now, ncfsm__vstrict_round(k->cur) + 1, what) || v->state != before;
}

/* ---- the end ------------------------------------------------------------------------------------ */

struct comp_rest {
  const ncfsm__backend *be;
  int device;
  void *stream, *ev, *dmine, *dall;
};

static void free_rest(void *arg) {
  struct comp_rest *r = arg;
  if (r->ev) r->be->event_destroy(r->ev);
  if (r->stream) r->be->stream_destroy(r->stream);
  if (r->be->mem_free) {
    if (r->dmine) r->be->mem_free(r->device, r->dmine);
    if (r->dall) r->be->mem_free(r->device, r->dall);
  } else {
    free(r->dmine);
    free(r->dall);
  }
  free(r);
}

void ncfsm__vcomp_free(struct ncfsm__verifier *v) {
  struct ncfsm__comp *k = v->comp;
  if (!k) return;
  ncfsm_comm *c = v->c;
  if (k->req) ncfsm_boot_req_free(k->req);
  if (k->cur) ncfsm__sreq_free(k->cur);
  struct comp_rest *rest = malloc(sizeof *rest);
  if (rest) {
    *rest = (struct comp_rest){c->be, c->opts.device, k->stream, k->ev, k->dmine, k->dall};
    ncfsm__abort_stray(c->loop, c->be, k->bcomm, free_rest, rest);
  } else if (k->bcomm) {
    ncfsm__abort_stray(c->loop, c->be, k->bcomm, NULL, NULL); /* its buffers leak rather than be freed in use */
  }
  free(k);
  v->comp = NULL;
}
