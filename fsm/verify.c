/*
 * Async cross-rank verification (R11; docs/ordering.md "Verification"):
 * every verify_window launched collectives, each rank posts (seq, rolling
 * hash) to an allgather on the comm's bootstrap, without waiting for it.
 * The exchanges are posted in seq order on every rank, which is the order
 * the bootstrap needs. When one completes, every rank's hash at that seq
 * must be equal; when one does not complete within verify_stall_ms, some
 * rank stopped before that seq while this one went on. Either fails the
 * comm long before a watchdog would, and dumps its recorder (reason verify).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm/internal.h"
#include "ncfsm/bootstrap.h"

typedef struct ncfsm__vmsg {
  uint64_t seq, hash;
} ncfsm__vmsg;

struct ncfsm__vreq {
  ncfsm__vmsg mine;
  ncfsm__vmsg *all; /* nranks entries */
  ncfsm_boot_req *req;
  ncfsm_result_t post_rc; /* a post that failed is reported at the next poll */
  uint64_t t_post;
  struct ncfsm__vreq *next;
};

static void vreq_done(ncfsm_boot_req *req, ncfsm_result_t status, void *arg) {
  (void)req;
  (void)status;
  ncfsm__loop_kick_async(arg); /* the next turn polls it */
}

void ncfsm__verify_launched(ncfsm_comm *c) {
  unsigned w = c->opts.verify_window ? c->opts.verify_window : 1;
  if (c->coll_seq % w) return;
  struct ncfsm__vreq *v = calloc(1, sizeof *v);
  if (!v) return; /* this window goes unchecked; the next one covers it (rolling hash) */
  v->all = calloc((size_t)c->nranks, sizeof *v->all);
  v->mine = (ncfsm__vmsg){c->coll_seq, c->hash};
  v->t_post = ncfsm__now_ns();
  if (!v->all) {
    free(v);
    return;
  }
  v->post_rc = ncfsm_boot_allgather_post(c->vboot, &v->mine, v->all, sizeof v->mine, &v->req);
  if (v->post_rc == NCFSM_OK) ncfsm_boot_req_on_done(v->req, vreq_done, c->loop);
  if (c->vq_tail) c->vq_tail->next = v;
  else c->vq_head = v;
  c->vq_tail = v;
}

static void vreq_free(struct ncfsm__vreq *v) {
  if (v->req) ncfsm_boot_req_free(v->req);
  free(v->all);
  free(v);
}

void ncfsm__verify_free(ncfsm_comm *c) {
  while (c->vq_head) {
    struct ncfsm__vreq *v = c->vq_head;
    c->vq_head = v->next;
    vreq_free(v);
  }
  c->vq_tail = NULL;
}

/* A failed comm stops verifying: its exchanges are dropped (a bootstrap
 * request freed unfinished makes the bootstrap unusable, which is right:
 * the ranks no longer agree on what comes next). */
static void fail(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_result_t cause, const char *what) {
  c->vboot = NULL;
  ncfsm__comm_fail(c, ev, cause, NCFSM__NCCL_SUCCESS, what);
  ncfsm__verify_free(c);
}

bool ncfsm__verify_poll(ncfsm_comm *c, uint64_t now) {
  bool progress = false;
  if (!ncfsm__has(c, NCFSM_SF_WORKS | NCFSM_SF_POLL) && c->state != NCFSM_STATE_FINALIZED) {
    /* failed, revoked or closed: the order no longer matters */
    c->vboot = NULL;
    ncfsm__verify_free(c);
    return false;
  }
  while (c->vq_head) {
    struct ncfsm__vreq *v = c->vq_head;
    char what[400];
    if (v->post_rc != NCFSM_OK) {
      snprintf(what, sizeof what, "verification: the bootstrap refused the exchange at seq %llu (%s): %s",
               (unsigned long long)v->mine.seq, ncfsm_err_name(v->post_rc),
               c->vboot ? ncfsm_boot_last_error(c->vboot) : "");
      fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
      return true;
    }
    ncfsm_result_t r = ncfsm_boot_test(v->req);
    if (r == NCFSM_ERR_AGAIN) {
      if (c->opts.verify_stall_ms && now - v->t_post > c->opts.verify_stall_ms * 1000000ull) {
        snprintf(what, sizeof what,
                 "verification: not every rank reached collective seq %llu within %llu ms of this rank "
                 "(a rank stopped, skipped a collective or is far behind; the dumps show which)",
                 (unsigned long long)v->mine.seq, (unsigned long long)c->opts.verify_stall_ms);
        fail(c, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, what);
        return true;
      }
      return progress;
    }
    if (r != NCFSM_OK) {
      snprintf(what, sizeof what, "verification: the exchange at seq %llu failed (%s)",
               (unsigned long long)v->mine.seq, ncfsm_err_name(r));
      fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
      return true;
    }
    int bad = -1;
    for (int i = 0; i < c->nranks && bad < 0; i++)
      if (v->all[i].seq != v->mine.seq || v->all[i].hash != v->mine.hash) bad = i;
    if (bad >= 0) {
      int n = snprintf(what, sizeof what,
                       "verification: the collectives before seq %llu differ across ranks (R11): rolling "
                       "hash of rank %d %016llx, of rank %d %016llx",
                       (unsigned long long)v->mine.seq, c->rank, (unsigned long long)v->mine.hash, bad,
                       (unsigned long long)v->all[bad].hash);
      if (n > 0 && (size_t)n < sizeof what)
        snprintf(what + n, sizeof what - (size_t)n, "; ncfsm-trace on the ranks' dumps names the seq and field");
      fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_MISMATCH, what);
      return true;
    }
    c->vq_head = v->next;
    if (!c->vq_head) c->vq_tail = NULL;
    vreq_free(v);
    progress = true;
  }
  return progress;
}
