/*
 * Async verification (opts.verify ASYNC): every verify_window launched
 * collectives, each rank posts (seq, rolling hash) to an allgather on the
 * comm's bootstrap, without waiting for it. The exchanges are posted in seq
 * order on every rank, which is the order the bootstrap needs. When one
 * completes, every rank's hash at that seq must be equal (else DIVERGED);
 * when one does not complete within verify_stall_ms, some rank stopped
 * before that seq while this one went on (STALLED). Either fails the comm
 * long before a watchdog would, and dumps its recorder.
 */
#include <stdio.h>
#include <stdlib.h>

#include "fsm/verify.h"
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

void ncfsm__vasync_launched(struct ncfsm__verifier *v) {
  ncfsm_comm *c = v->c;
  unsigned win = c->opts.verify_window ? c->opts.verify_window : 1;
  if (c->coll_seq % win) return;
  struct ncfsm__vreq *q = calloc(1, sizeof *q);
  if (q) q->all = calloc((size_t)c->nranks, sizeof *q->all);
  if (!q || !q->all) {
    free(q);
    ncfsm__verify_fire(v, NCFSM__VE_NO_MEMORY, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_NO_MEMORY, NULL);
    return;
  }
  q->mine = (ncfsm__vmsg){c->coll_seq, c->hash};
  q->t_post = ncfsm__now_ns();
  q->post_rc = ncfsm_boot_allgather_post(v->boot, &q->mine, q->all, sizeof q->mine, &q->req);
  if (q->post_rc == NCFSM_OK) ncfsm_boot_req_on_done(q->req, vreq_done, c->loop);
  if (v->vq_tail) v->vq_tail->next = q;
  else v->vq_head = q;
  v->vq_tail = q;
}

static void vreq_free(struct ncfsm__vreq *q) {
  if (q->req) ncfsm_boot_req_free(q->req);
  free(q->all);
  free(q);
}

/* A failed comm stops verifying: its exchanges are dropped (a bootstrap
 * request freed unfinished makes the bootstrap unusable, which is right:
 * the ranks no longer agree on what comes next). */
void ncfsm__vasync_free(struct ncfsm__verifier *v) {
  while (v->vq_head) {
    struct ncfsm__vreq *q = v->vq_head;
    v->vq_head = q->next;
    vreq_free(q);
  }
  v->vq_tail = NULL;
}

bool ncfsm__vasync_poll(struct ncfsm__verifier *v, uint64_t now) {
  ncfsm_comm *c = v->c;
  bool progress = false;
  char what[400];
  while (v->vq_head) {
    struct ncfsm__vreq *q = v->vq_head;
    if (q->post_rc != NCFSM_OK) {
      snprintf(what, sizeof what, "verification: the bootstrap refused the exchange at seq %llu (%s): %s",
               (unsigned long long)q->mine.seq, ncfsm_err_name(q->post_rc), ncfsm_boot_last_error(v->boot));
      ncfsm__verify_fire(v, NCFSM__VE_CHANNEL_FAILED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
      return true;
    }
    ncfsm_result_t r = ncfsm_boot_test(q->req);
    if (r == NCFSM_ERR_AGAIN) {
      if (c->opts.verify_stall_ms && now > q->t_post && now - q->t_post > c->opts.verify_stall_ms * 1000000ull) {
        snprintf(what, sizeof what,
                 "verification: not every rank reached collective seq %llu within %llu ms of this rank (a rank "
                 "stopped, skipped a collective or is far behind; the dumps show which)",
                 (unsigned long long)q->mine.seq, (unsigned long long)c->opts.verify_stall_ms);
        ncfsm__verify_fire(v, NCFSM__VE_STALLED, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, what);
        return true;
      }
      return progress;
    }
    if (r != NCFSM_OK) {
      snprintf(what, sizeof what, "verification: the exchange at seq %llu failed (%s: %s)",
               (unsigned long long)q->mine.seq, ncfsm_err_name(r), ncfsm_boot_last_error(v->boot));
      ncfsm__verify_fire(v, NCFSM__VE_CHANNEL_FAILED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
      return true;
    }
    int bad = -1;
    for (int i = 0; i < c->nranks && bad < 0; i++)
      if (q->all[i].seq != q->mine.seq || q->all[i].hash != q->mine.hash) bad = i;
    if (bad >= 0) {
      snprintf(what, sizeof what,
               "verification: the collectives before seq %llu differ across ranks (R11): rolling hash of rank %d "
               "%016llx, of rank %d %016llx; ncfsm-trace on the ranks' dumps names the seq and field",
               (unsigned long long)q->mine.seq, c->rank, (unsigned long long)q->mine.hash, bad,
               (unsigned long long)q->all[bad].hash);
      ncfsm__verify_fire(v, NCFSM__VE_DIVERGED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_MISMATCH, what);
      return true;
    }
    v->vq_head = q->next;
    if (!v->vq_head) v->vq_tail = NULL;
    vreq_free(q);
    progress = true;
  }
  return progress;
}
