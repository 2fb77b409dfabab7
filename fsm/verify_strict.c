/*
 * Strict verification (opts.verify STRICT): every collective of the comm
 * gets one exchange of its fingerprint when it is queued (the work is
 * VERIFYING), posted in queue order, so exchange k is the same collective on
 * every rank whatever the timing; it may launch (VERIFIED) once every rank's
 * fingerprint equals its own. A difference fires the comm's MISMATCH: its
 * batch fails on every rank (every rank sees the same difference) and
 * nothing of it reaches NCCL. A collective that fails otherwise keeps its
 * exchange, so the ranks keep posting the same ones. Over the bootstrap the
 * exchanges are pipelined; over the companion (verify_companion.c) they go
 * one at a time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm/verify.h"
#include "ncfsm/bootstrap.h"

/* What one rank sends for one collective: its exchange's number (equal on
 * every rank by construction: a check of the channel itself) and the
 * fingerprint fields that must agree. */
typedef struct ncfsm__smsg {
  uint64_t round;
  uint64_t count;
  int32_t op, dtype, root, redop;
} ncfsm__smsg;

struct ncfsm__sreq {
  ncfsm__smsg mine;
  ncfsm__smsg *all; /* nranks entries */
  ncfsm_work *w;    /* NULL once the work left the engine */
  ncfsm_boot_req *req;
  uint64_t t_post;
  struct ncfsm__sreq *next;
};

void ncfsm__sreq_free(struct ncfsm__sreq *q) {
  if (q->w) q->w->vreq = NULL;
  if (q->req) ncfsm_boot_req_free(q->req);
  free(q->all);
  free(q);
}

size_t ncfsm__vstrict_msg_size(void) { return sizeof(ncfsm__smsg); }

void *ncfsm__vstrict_mine(struct ncfsm__sreq *q, size_t *len) {
  *len = sizeof q->mine;
  return &q->mine;
}
void *ncfsm__vstrict_all(struct ncfsm__sreq *q) { return q->all; }

void ncfsm__vstrict_free(struct ncfsm__verifier *v) {
  for (int k = 0; k < 2; k++) {
    struct ncfsm__sreq **head = k ? &v->sf_head : &v->sp_head;
    while (*head) {
      struct ncfsm__sreq *q = *head;
      *head = q->next;
      ncfsm__sreq_free(q);
    }
  }
  v->sp_tail = v->sf_tail = NULL;
}

bool ncfsm__vstrict_pending(const struct ncfsm__verifier *v) { return v->sp_head || v->sf_head; }

void ncfsm__vstrict_queued(struct ncfsm__verifier *v, ncfsm_work *w) {
  ncfsm_comm *c = v->c;
  struct ncfsm__sreq *q = calloc(1, sizeof *q);
  if (q) q->all = calloc((size_t)c->nranks, sizeof *q->all);
  if (!q || !q->all) {
    free(q);
    /* the ranks' exchanges would no longer pair: the comm fails at the next turn */
    ncfsm__verify_fire(v, NCFSM__VE_NO_MEMORY, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_NO_MEMORY, NULL);
    c->loop->kick = true;
    return;
  }
  q->w = w;
  w->vreq = q;
  q->mine.count = w->fp.count;
  q->mine.op = w->fp.op;
  q->mine.dtype = w->fp.dtype;
  q->mine.root = w->fp.root;
  q->mine.redop = w->fp.redop;
  if (v->sp_tail) v->sp_tail->next = q;
  else v->sp_head = q;
  v->sp_tail = q;
  ncfsm__work_fire(w, NCFSM__WE_VERIFY, NULL); /* VERIFYING: it launches once every rank agrees */
}

/* w leaves the engine (final) unverified: its exchange still runs, so that
 * every rank posts the same ones, but no longer points at it. */
void ncfsm__vstrict_forget(ncfsm_work *w) {
  struct ncfsm__sreq *q = w->vreq;
  if (q) q->w = NULL;
  w->vreq = NULL;
}

struct ncfsm__sreq *ncfsm__vstrict_take(struct ncfsm__verifier *v) {
  struct ncfsm__sreq *q = v->sp_head;
  if (!q) return NULL;
  v->sp_head = q->next;
  if (!v->sp_head) v->sp_tail = NULL;
  q->next = NULL;
  q->mine.round = v->sround++;
  return q;
}

/* The seq the collective would take: the comm's next, plus the verified
 * collectives queued before it (they launch first). */
static uint64_t strict_seq(const ncfsm_comm *c, const ncfsm_work *w) {
  uint64_t seq = c->coll_seq;
  for (const ncfsm__blink *l = c->bq_head; l; l = l->next)
    for (const ncfsm_work *x = l->b->head; x; x = x->bnext) {
      if (x == w) return seq;
      if (x->comm == c && x->fp.peer < 0 && x->state == NCFSM_WORK_QUEUED) seq++;
    }
  return seq;
}

bool ncfsm__vstrict_may_post(const ncfsm_comm *c) {
  if (c->launching) return false;
  for (const ncfsm__blink *l = c->bq_head; l; l = l->next) {
    bool any = false, all = true;
    for (const ncfsm_work *x = l->b->head; x; x = x->bnext)
      if (x->comm == c && x->fp.peer < 0) {
        any = true;
        all = all && x->state == NCFSM_WORK_QUEUED;
      }
    if (any && all) return false;
  }
  return true;
}

static const char *field_value(char *buf, size_t n, int field, const ncfsm__smsg *m) {
  switch (field) {
    case 0: return ncfsm_opkind_name((ncfsm_opkind_t)m->op);
    case 1: snprintf(buf, n, "%llu", (unsigned long long)m->count); return buf;
    case 2: return ncfsm_dtype_name((ncfsm_dtype_t)m->dtype);
    case 3: snprintf(buf, n, "%d", m->root); return buf;
    case 4: return m->redop < 0 ? "-" : ncfsm_redop_name((ncfsm_redop_t)m->redop);
    default: snprintf(buf, n, "%llu", (unsigned long long)m->round); return buf;
  }
}

static bool field_differs(int field, const ncfsm__smsg *a, const ncfsm__smsg *b) {
  switch (field) {
    case 0: return a->op != b->op;
    case 1: return a->count != b->count;
    case 2: return a->dtype != b->dtype;
    case 3: return a->root != b->root;
    case 4: return a->redop != b->redop;
    default: return a->round != b->round;
  }
}

/* The report: the first field that differs (the channel's own round, then
 * op, count, dtype, root, redop), and each rank's value of it. */
static int strict_compare(const ncfsm_comm *c, const struct ncfsm__sreq *q, char *what, size_t n) {
  static const char *const fields[] = {"op", "count", "dtype", "root", "redop", "exchange round"};
  static const int order[] = {5, 0, 1, 2, 3, 4};
  for (int o = 0; o < 6; o++) {
    int f = order[o];
    bool differs = false;
    for (int i = 0; i < c->nranks && !differs; i++) differs = field_differs(f, &q->all[i], &q->mine);
    if (!differs) continue;
    int m = snprintf(what, n, "strict verification: collective seq %llu differs across ranks in %s (R11):",
                     (unsigned long long)(q->w ? strict_seq(c, q->w) : c->coll_seq), fields[f]);
    if (m < 0) return f;
    size_t k = (size_t)m;
    for (int i = 0; i < c->nranks && k < n; i++) {
      char buf[32];
      m = snprintf(what + k, n - k, "%s rank %d %s", i ? "," : "", i, field_value(buf, sizeof buf, f, &q->all[i]));
      if (m < 0) break;
      k += (size_t)m;
    }
    if (k < n)
      snprintf(what + k, n - k, "; no rank launched it: its works (its whole group) failed with NCFSM_ERR_MISMATCH and "
                                "the communicator is still usable; fix the program so that every rank issues the same "
                                "collectives in the same order");
    return f;
  }
  return -1;
}

void ncfsm__vstrict_settle(struct ncfsm__verifier *v, struct ncfsm__sreq *q) {
  ncfsm_comm *c = v->c;
  char what[600];
  int f = strict_compare(c, q, what, sizeof what);
  ncfsm_work *w = q->w;
  if (f == 5) { /* the channel itself is out of step: nothing after this can be trusted */
    ncfsm__sreq_free(q);
    ncfsm__verify_fire(v, NCFSM__VE_DIVERGED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_MISMATCH, what);
    return;
  }
  if (w) {
    w->vreq = NULL;
    q->w = NULL;
    if (f < 0) {
      ncfsm__work_fire(w, NCFSM__WE_VERIFIED, NULL); /* QUEUED again: it may launch */
      c->loop->kick = true;
    } else {
      ncfsm__set_error(c, "%s", what);
      NCFSM_LOG(NCFSM__LOG_WARN, NCFSM__SUB_FSM, "%s", c->last_error);
      ncfsm__cev p = {.cause = NCFSM_ERR_MISMATCH, .work = w, .from = c->state};
      ncfsm__comm_fire(c, NCFSM_EV_MISMATCH, &p); /* fail_mismatched: its batch fails before NCCL */
      ncfsm__comm_dump(c, NULL, "verify");
    }
  }
  ncfsm__sreq_free(q);
}

uint64_t ncfsm__vstrict_round(const struct ncfsm__sreq *q) { return q->mine.round; }

void ncfsm__vstrict_stall_text(struct ncfsm__verifier *v, const struct ncfsm__sreq *q, const char *channel, char *buf,
                               size_t len) {
  ncfsm_comm *c = v->c;
  snprintf(buf, len,
           "strict verification%s: not every rank submitted collective seq %llu (%s) within %llu ms of this rank (a rank "
           "stopped, skipped a collective or is far behind); nothing of it was launched",
           channel, (unsigned long long)(q->w ? strict_seq(c, q->w) : c->coll_seq),
           ncfsm_opkind_name((ncfsm_opkind_t)q->mine.op), (unsigned long long)c->opts.verify_stall_ms);
}

static void sreq_done(ncfsm_boot_req *req, ncfsm_result_t status, void *arg) {
  (void)req;
  (void)status;
  ncfsm__loop_kick_async(arg);
}

bool ncfsm__vstrict_poll(struct ncfsm__verifier *v, uint64_t now) {
  ncfsm_comm *c = v->c;
  bool progress = false;
  char what[600];
  struct ncfsm__sreq *q;
  while ((q = ncfsm__vstrict_take(v))) { /* post in queue order */
    q->t_post = now;
    ncfsm_result_t r = ncfsm_boot_allgather_post(v->boot, &q->mine, q->all, sizeof q->mine, &q->req);
    if (r != NCFSM_OK) {
      snprintf(what, sizeof what, "strict verification: the bootstrap refused the exchange of collective %llu (%s): %s",
               (unsigned long long)q->mine.round, ncfsm_err_name(r), ncfsm_boot_last_error(v->boot));
      ncfsm__sreq_free(q);
      ncfsm__verify_fire(v, NCFSM__VE_CHANNEL_FAILED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
      return true;
    }
    ncfsm_boot_req_on_done(q->req, sreq_done, c->loop);
    if (v->sf_tail) v->sf_tail->next = q;
    else v->sf_head = q;
    v->sf_tail = q;
  }
  while ((q = v->sf_head)) {
    ncfsm_result_t r = ncfsm_boot_test(q->req);
    if (r == NCFSM_ERR_AGAIN) {
      if (c->opts.verify_stall_ms && now > q->t_post && now - q->t_post > c->opts.verify_stall_ms * 1000000ull) {
        ncfsm__vstrict_stall_text(v, q, "", what, sizeof what);
        ncfsm__vchan_stalled(v, q->req, q->mine.round + 1, what); /* the others are asked how far they are */
        return true;
      }
      return progress;
    }
    if (r != NCFSM_OK) {
      snprintf(what, sizeof what, "strict verification: the exchange of collective %llu failed (%s: %s)",
               (unsigned long long)q->mine.round, ncfsm_err_name(r), ncfsm_boot_last_error(v->boot));
      ncfsm__verify_fire(v, NCFSM__VE_CHANNEL_FAILED, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
      return true;
    }
    v->sf_head = q->next;
    if (!v->sf_head) v->sf_tail = NULL;
    progress = true;
    ncfsm__vstrict_settle(v, q);
    if (v->state != NCFSM__VS_RUNNING) return true;
  }
  return progress;
}
