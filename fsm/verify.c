/*
 * Cross-rank verification of the collective order (R11; docs/ordering.md
 * "Verification"), over the comm's bootstrap.
 *
 * Async:
 * every verify_window launched collectives, each rank posts (seq, rolling
 * hash) to an allgather on the comm's bootstrap, without waiting for it.
 * The exchanges are posted in seq order on every rank, which is the order
 * the bootstrap needs. When one completes, every rank's hash at that seq
 * must be equal; when one does not complete within verify_stall_ms, some
 * rank stopped before that seq while this one went on. Either fails the
 * comm long before a watchdog would, and dumps its recorder (reason verify).
 *
 * Strict: every collective of the comm gets one exchange of its fingerprint
 * when it is queued, posted in queue order (so exchange k is the same
 * collective on every rank whatever the timing); it may launch once every
 * rank's fingerprint equals its own. A difference fires MISMATCH: its batch
 * fails on every rank (every rank sees the same difference) and nothing of
 * it reaches NCCL. A collective that fails otherwise keeps its exchange, so
 * the ranks keep posting the same ones.
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

static void strict_free(ncfsm_comm *c);

static void comp_free(ncfsm_comm *c);

void ncfsm__verify_free(ncfsm_comm *c) {
  while (c->vq_head) {
    struct ncfsm__vreq *v = c->vq_head;
    c->vq_head = v->next;
    vreq_free(v);
  }
  c->vq_tail = NULL;
  strict_free(c);
  comp_free(c);
}

/* A failed comm stops verifying: its exchanges are dropped (a bootstrap
 * request freed unfinished makes the bootstrap unusable, which is right:
 * the ranks no longer agree on what comes next). */
static void fail(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_result_t cause, const char *what) {
  c->snomem = false;
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
      snprintf(what, sizeof what, "verification: the exchange at seq %llu failed (%s: %s)",
               (unsigned long long)v->mine.seq, ncfsm_err_name(r), c->vboot ? ncfsm_boot_last_error(c->vboot) : "");
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

/* ---- strict ------------------------------------------------------------------ */

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

static void sreq_free(struct ncfsm__sreq *v) {
  if (v->w) v->w->sreq = NULL;
  if (v->req) ncfsm_boot_req_free(v->req);
  free(v->all);
  free(v);
}

static void strict_free(ncfsm_comm *c) {
  for (int k = 0; k < 2; k++) {
    struct ncfsm__sreq **head = k ? &c->sf_head : &c->sp_head;
    while (*head) {
      struct ncfsm__sreq *v = *head;
      *head = v->next;
      sreq_free(v);
    }
  }
  c->sp_tail = c->sf_tail = NULL;
}

void ncfsm__strict_queued(ncfsm_comm *c, ncfsm_work *w) {
  struct ncfsm__sreq *v = calloc(1, sizeof *v);
  if (v) v->all = calloc((size_t)c->nranks, sizeof *v->all);
  if (!v || !v->all) {
    free(v);
    c->snomem = true; /* the next poll fails the comm: the ranks' exchanges would no longer pair */
    c->loop->kick = true;
    return;
  }
  v->w = w;
  w->sreq = v;
  w->verified = false;
  memset(&v->mine, 0, sizeof v->mine);
  v->mine.count = w->fp.count;
  v->mine.op = w->fp.op;
  v->mine.dtype = w->fp.dtype;
  v->mine.root = w->fp.root;
  v->mine.redop = w->fp.redop;
  if (c->sp_tail) c->sp_tail->next = v;
  else c->sp_head = v;
  c->sp_tail = v;
}

void ncfsm__strict_forget(ncfsm_work *w) {
  if (w->sreq) w->sreq->w = NULL;
  w->sreq = NULL;
}

static void sreq_done(ncfsm_boot_req *req, ncfsm_result_t status, void *arg) {
  (void)req;
  (void)status;
  ncfsm__loop_kick_async(arg);
}

/* The seq the collective would take: the comm's next, plus the verified
 * collectives queued before it (they launch first). */
static uint64_t strict_seq(const ncfsm_comm *c, const ncfsm_work *w) {
  uint64_t seq = c->coll_seq;
  for (const ncfsm__blink *l = c->bq_head; l; l = l->next)
    for (const ncfsm_work *x = l->b->head; x; x = x->bnext) {
      if (x == w) return seq;
      if (x->comm == c && x->fp.peer < 0 && x->verified) seq++;
    }
  return seq;
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

/* The report: the first field that differs (op, count, dtype, root, redop,
 * then the channel's own round), and each rank's value of it. */
static int strict_compare(ncfsm_comm *c, const struct ncfsm__sreq *v, char *what, size_t n) {
  static const char *const fields[] = {"op", "count", "dtype", "root", "redop", "exchange round"};
  static const int order[] = {5, 0, 1, 2, 3, 4};
  for (int o = 0; o < 6; o++) {
    int f = order[o];
    bool differs = false;
    for (int i = 0; i < c->nranks && !differs; i++) differs = field_differs(f, &v->all[i], &v->mine);
    if (!differs) continue;
    size_t k = 0;
    int m = snprintf(what, n, "strict verification: collective seq %llu differs across ranks in %s (R11):",
                     (unsigned long long)(v->w ? strict_seq(c, v->w) : c->coll_seq), fields[f]);
    if (m < 0) return f;
    k = (size_t)m;
    for (int i = 0; i < c->nranks && k < n; i++) {
      char buf[32];
      m = snprintf(what + k, n - k, "%s rank %d %s", i ? "," : "", i, field_value(buf, sizeof buf, f, &v->all[i]));
      if (m < 0) break;
      k += (size_t)m;
    }
    if (k < n)
      snprintf(what + k, n - k, "; no rank launched it: its works (its whole group) failed with "
                                "NCFSM_ERR_MISMATCH and the communicator is still usable; fix the "
                                "program so that every rank issues the same collectives in the same order");
    return f;
  }
  return -1;
}

/* Every rank's fingerprint of v's collective is in v->all: let it launch, or
 * fire MISMATCH. Frees v. True when the comm failed (the channel itself is
 * out of step). */
static bool strict_settle(ncfsm_comm *c, struct ncfsm__sreq *v) {
  char what[600];
  int f = strict_compare(c, v, what, sizeof what);
  ncfsm_work *w = v->w;
  if (f == 5) { /* the channel itself is out of step: nothing after this can be trusted */
    sreq_free(v);
    fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_MISMATCH, what);
    return true;
  }
  if (w) {
    w->sreq = NULL;
    v->w = NULL;
    if (f < 0) {
      w->verified = true;
      c->loop->kick = true;
    } else {
      ncfsm__set_error(c, "%s", what);
      NCFSM_LOG(NCFSM__LOG_WARN, NCFSM__SUB_FSM, "%s", c->last_error);
      c->mismatched = w;
      ncfsm__fire(c, NCFSM_EV_MISMATCH, NCFSM_ERR_MISMATCH);
      c->mismatched = NULL;
      ncfsm__comm_dump(c, NULL, "verify");
    }
  }
  sreq_free(v);
  return false;
}

static bool comp_poll(ncfsm_comm *c, uint64_t now);

bool ncfsm__strict_poll(ncfsm_comm *c, uint64_t now) {
  bool progress = false;
  char what[600];
  if (c->snomem) {
    fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_NO_MEMORY,
         "strict verification: out of memory for a fingerprint exchange");
    return true;
  }
  if (c->comp && (c->state == NCFSM_STATE_ERROR || c->state == NCFSM_STATE_ABORT_QUEUED ||
                  c->state == NCFSM_STATE_CLOSING || c->state == NCFSM_STATE_CLOSED ||
                  c->state == NCFSM_STATE_REVOKING || c->state == NCFSM_STATE_REVOKED ||
                  c->state == NCFSM_STATE_SHRINKING)) { /* no collective of this comm will run again */
    comp_free(c);
    return false;
  }
  if (!c->vboot || !c->bcomm || c->boot || !ncfsm__has(c, NCFSM_SF_WORKS)) return false;
  if (c->comp) return comp_poll(c, now);
  /* post in queue order */
  while (c->sp_head) {
    struct ncfsm__sreq *v = c->sp_head;
    v->mine.round = c->sround++;
    v->t_post = now;
    ncfsm_result_t r = ncfsm_boot_allgather_post(c->vboot, &v->mine, v->all, sizeof v->mine, &v->req);
    if (r != NCFSM_OK) {
      snprintf(what, sizeof what, "strict verification: the bootstrap refused the exchange of collective "
                                  "%llu (%s): %s", (unsigned long long)v->mine.round, ncfsm_err_name(r),
               ncfsm_boot_last_error(c->vboot));
      fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
      return true;
    }
    ncfsm_boot_req_on_done(v->req, sreq_done, c->loop);
    c->sp_head = v->next;
    if (!c->sp_head) c->sp_tail = NULL;
    v->next = NULL;
    if (c->sf_tail) c->sf_tail->next = v;
    else c->sf_head = v;
    c->sf_tail = v;
  }
  while (c->sf_head) {
    struct ncfsm__sreq *v = c->sf_head;
    ncfsm_result_t r = ncfsm_boot_test(v->req);
    if (r == NCFSM_ERR_AGAIN) {
      if (c->opts.verify_stall_ms && now - v->t_post > c->opts.verify_stall_ms * 1000000ull) {
        snprintf(what, sizeof what,
                 "strict verification: not every rank submitted collective seq %llu (%s) within %llu ms "
                 "of this rank (a rank stopped, skipped a collective or is far behind); nothing of it "
                 "was launched",
                 (unsigned long long)(v->w ? strict_seq(c, v->w) : c->coll_seq),
                 ncfsm_opkind_name((ncfsm_opkind_t)v->mine.op), (unsigned long long)c->opts.verify_stall_ms);
        fail(c, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, what);
        return true;
      }
      return progress;
    }
    if (r != NCFSM_OK) {
      snprintf(what, sizeof what, "strict verification: the exchange of collective %llu failed (%s: %s)",
               (unsigned long long)v->mine.round, ncfsm_err_name(r), ncfsm_boot_last_error(c->vboot));
      fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
      return true;
    }
    c->sf_head = v->next;
    if (!c->sf_head) c->sf_tail = NULL;
    progress = true;
    if (strict_settle(c, v)) return true;
  }
  return progress;
}

void ncfsm__strict_fail_batch(ncfsm_comm *c) {
  ncfsm_work *w = c->mismatched;
  ncfsm__batch *b = w ? w->batch : NULL;
  if (!b) return;
  ncfsm_loop *loop = c->loop;
  for (int i = 0; i < b->nlinks; i++) {
    ncfsm__blink *l = &b->links[i];
    ncfsm_comm *d = l->c;
    if (!d) continue;
    ncfsm__blink **pp = &d->bq_head, *prev = NULL;
    while (*pp && *pp != l) { prev = *pp; pp = &(*pp)->next; }
    if (*pp) {
      *pp = l->next;
      if (d->bq_tail == l) d->bq_tail = prev;
    }
    l->next = NULL;
    l->c = NULL;
  }
  loop->nqueued--;
  for (ncfsm_work *x = b->head, *next; x; x = next) {
    next = x->bnext;
    x->batch = NULL;
    x->bnext = NULL;
    ncfsm__work_finish(x, NCFSM_WORK_FAILED, NCFSM_ERR_MISMATCH);
  }
  b->head = b->tail = NULL;
  b->nworks = 0;
  if (b->explicit_group) free(b);
}

/* ---- strict over a companion NCCL communicator ----------------------------------- */

/*
 * opts.verify_channel NCCL: the fingerprints go through an AllGather on a
 * communicator of their own, made once the comm is READY from a unique id
 * that rank 0 broadcasts through the comm's bootstrap. One exchange is in
 * flight at a time, and it is posted only when the comm has no launch in
 * progress and nothing verified waiting to launch. So on every rank the
 * GPU sees the comm's collective k-1, then the companion's AllGather for k,
 * then collective k: the same order everywhere (two communicators whose
 * kernels reach the GPUs in different orders may deadlock). Each exchange:
 * copy this rank's fingerprint to the device, AllGather, poll the
 * companion's async state to success (R2), record an event, poll it, copy
 * every rank's fingerprints back, compare (strict_settle).
 */
enum { COMP_ID, COMP_BCAST, COMP_INIT, COMP_READY };
struct ncfsm__comp {
  int phase;
  ncfsm_unique_id id;
  ncfsm_boot_req *req;
  ncfsm_sim_opts sim; /* the sim's opts for the companion: defaults, but a dead rank stays dead */
  void *bcomm, *stream, *ev;
  void *dmine, *dall; /* ncfsm_mem_alloc: device memory (host memory where the backend has none) */
  struct ncfsm__sreq *cur; /* the exchange in flight */
  bool recorded;           /* its event is recorded (the AllGather is final) */
  uint64_t t_phase;        /* when the current phase (setup or exchange) began */
};

ncfsm_result_t ncfsm__comp_new(ncfsm_comm *c) {
  struct ncfsm__comp *k = calloc(1, sizeof *k);
  if (!k) return NCFSM_ERR_NO_MEMORY;
  k->phase = COMP_ID;
  ncfsm_sim_opts_init(&k->sim);
  k->sim.dead = c->sim.dead;
  k->sim.never_arrive = c->sim.never_arrive;
  c->comp = k;
  return NCFSM_OK;
}

bool ncfsm__comp_busy(const ncfsm_comm *c) { return c->comp->phase != COMP_READY || c->comp->cur; }

/* Aborts the companion (whatever it is doing) and frees everything. */
static void comp_free(ncfsm_comm *c) {
  struct ncfsm__comp *k = c->comp;
  if (!k) return;
  if (k->req) ncfsm_boot_req_free(k->req);
  if (k->bcomm) c->be->abort(k->bcomm);
  if (k->ev) c->be->event_destroy(k->ev);
  if (k->stream) c->be->stream_destroy(k->stream);
  if (k->dmine) ncfsm_mem_free(c, k->dmine);
  if (k->dall) ncfsm_mem_free(c, k->dall);
  if (k->cur) sreq_free(k->cur);
  free(k);
  c->comp = NULL;
}

/* Fails c with "<what> (<code>, <its name>)". */
static bool comp_fail(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_result_t cause, const char *what_, int code) {
  char what[400];
  snprintf(what, sizeof what, "%s (%d, %s)", what_, code, ncfsm__nccl_result_name(code));
  fail(c, ev, cause, what);
  return true;
}

static bool comp_stalled(ncfsm_comm *c, uint64_t now) {
  return c->opts.verify_stall_ms && now - c->comp->t_phase > c->opts.verify_stall_ms * 1000000ull;
}

/* Set-up: id, broadcast, init, polled to success. True on progress. */
static bool comp_setup(ncfsm_comm *c, uint64_t now) {
  struct ncfsm__comp *k = c->comp;
  char what[400];
  switch (k->phase) {
    case COMP_ID: {
      if (c->rank == 0 && c->be->get_unique_id(&k->id) != NCFSM__NCCL_SUCCESS)
        return comp_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND,
                         "strict verification (channel nccl): no unique id for the companion communicator",
                         NCFSM__NCCL_INTERNAL_ERROR);
      ncfsm_result_t r = ncfsm_boot_bcast_post(c->vboot, &k->id, sizeof k->id, 0, &k->req);
      if (r != NCFSM_OK) {
        snprintf(what, sizeof what, "strict verification (channel nccl): the bootstrap refused the companion's "
                                    "unique id broadcast (%s): %s", ncfsm_err_name(r), ncfsm_boot_last_error(c->vboot));
        fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
        return true;
      }
      ncfsm_boot_req_on_done(k->req, sreq_done, c->loop);
      k->phase = COMP_BCAST;
      k->t_phase = now;
      return true;
    }
    case COMP_BCAST: {
      ncfsm_result_t r = ncfsm_boot_test(k->req);
      if (r == NCFSM_ERR_AGAIN) {
        if (!comp_stalled(c, now)) return false;
        snprintf(what, sizeof what, "strict verification (channel nccl): not every rank reached the companion "
                                    "communicator's set-up within %llu ms", (unsigned long long)c->opts.verify_stall_ms);
        fail(c, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, what);
        return true;
      }
      ncfsm_boot_req_free(k->req);
      k->req = NULL;
      if (r != NCFSM_OK) {
        snprintf(what, sizeof what, "strict verification (channel nccl): the companion's unique id broadcast "
                                    "failed (%s)", ncfsm_err_name(r));
        fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, what);
        return true;
      }
      char name[96];
      snprintf(name, sizeof name, "%s.verify", c->name);
      ncfsm__comm_config cfg = {0, c->opts.device, &k->sim, name};
      size_t one = sizeof(ncfsm__smsg);
      if (c->be->stream_create(c->opts.device, &k->stream) != 0 ||
          (c->be->event_create_flags ? c->be->event_create_flags(c->opts.device, 0, &k->ev)
                                     : c->be->event_create(c->opts.device, &k->ev)) != 0 ||
          ncfsm_mem_alloc(c, one, &k->dmine) != NCFSM_OK ||
          ncfsm_mem_alloc(c, one * (size_t)c->nranks, &k->dall) != NCFSM_OK)
        return comp_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND,
                         "strict verification (channel nccl): no stream, event or device memory for the "
                         "companion communicator", NCFSM__NCCL_UNHANDLED_CUDA_ERROR);
      int rc = c->be->comm_init(&k->bcomm, c->nranks, &k->id, c->rank, &cfg);
      if (NCFSM__IS_ERR(rc)) {
        k->bcomm = NULL;
        return comp_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(rc),
                         "strict verification (channel nccl): the companion communicator's init failed",
                         rc);
      }
      k->phase = COMP_INIT;
      k->t_phase = now;
      return true;
    }
    case COMP_INIT: {
      int st = NCFSM__NCCL_SUCCESS;
      int rc = c->be->get_async_error(k->bcomm, &st);
      if (NCFSM__IS_ERR(rc) || NCFSM__IS_ERR(st))
        return comp_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(NCFSM__IS_ERR(rc) ? rc : st),
                         "strict verification (channel nccl): the companion communicator's init failed",
                         NCFSM__IS_ERR(rc) ? rc : st);
      if (st == NCFSM__NCCL_IN_PROGRESS) {
        if (!comp_stalled(c, now)) return false;
        snprintf(what, sizeof what, "strict verification (channel nccl): the companion communicator was not "
                                    "ready within %llu ms", (unsigned long long)c->opts.verify_stall_ms);
        fail(c, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, what);
        return true;
      }
      k->phase = COMP_READY;
      return true;
    }
    default: return false;
  }
}

/* The next exchange may go: no launch of c in progress, nothing of c
 * verified waiting to launch (its kernels go first on every rank). */
static bool comp_may_post(const ncfsm_comm *c) {
  if (c->launching) return false;
  for (const ncfsm__blink *l = c->bq_head; l; l = l->next) {
    bool any = false, all = true;
    for (const ncfsm_work *x = l->b->head; x; x = x->bnext)
      if (x->comm == c && x->fp.peer < 0) {
        any = true;
        all = all && x->verified;
      }
    if (any && all) return false;
  }
  return true;
}

static bool comp_poll(ncfsm_comm *c, uint64_t now) {
  struct ncfsm__comp *k = c->comp;
  if (k->phase != COMP_READY) {
    bool p = comp_setup(c, now);
    if (!c->comp || c->comp->phase != COMP_READY) return p;
  }
  bool progress = false;
  for (;;) {
    struct ncfsm__sreq *v = k->cur;
    if (!v) {
      if (!c->sp_head || !comp_may_post(c)) return progress;
      v = c->sp_head;
      c->sp_head = v->next;
      if (!c->sp_head) c->sp_tail = NULL;
      v->next = NULL;
      v->mine.round = c->sround++;
      k->cur = v;
      k->recorded = false;
      k->t_phase = now;
      size_t one = sizeof(ncfsm__smsg);
      if (ncfsm_memcpy(c, k->dmine, &v->mine, one, 1) != NCFSM_OK)
        return comp_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND,
                         "strict verification (channel nccl): copying the fingerprint to the device failed",
                         NCFSM__NCCL_UNHANDLED_CUDA_ERROR);
      ncfsm__op op = {NCFSM_KIND_ALLGATHER, k->dmine, k->dall, one, NCFSM_UINT8, NCFSM_OP_SUM, -1, -1, k->stream};
      int rc = c->be->op(k->bcomm, &op);
      if (NCFSM__IS_ERR(rc))
        return comp_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(rc),
                         "strict verification (channel nccl): the companion's AllGather failed", rc);
      progress = true;
    }
    if (!k->recorded) {
      int st = NCFSM__NCCL_SUCCESS;
      int rc = c->be->get_async_error(k->bcomm, &st);
      if (NCFSM__IS_ERR(rc) || NCFSM__IS_ERR(st))
        return comp_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(NCFSM__IS_ERR(rc) ? rc : st),
                         "strict verification (channel nccl): the companion communicator failed",
                         NCFSM__IS_ERR(rc) ? rc : st);
      if (st == NCFSM__NCCL_IN_PROGRESS) break; /* R2: no event before the launch is final */
      if ((rc = c->be->event_record(k->ev, k->stream)) != 0)
        return comp_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND,
                         "strict verification (channel nccl): recording the companion's event failed",
                         rc);
      k->recorded = true;
    }
    int q = c->be->event_query(k->ev);
    if (q == 1) break;
    if (q != 0)
      return comp_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND,
                       "strict verification (channel nccl): the companion's event failed", q);
    size_t all = sizeof(ncfsm__smsg) * (size_t)c->nranks;
    if (ncfsm_memcpy(c, v->all, k->dall, all, 0) != NCFSM_OK)
      return comp_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND,
                       "strict verification (channel nccl): copying the fingerprints from the device failed",
                       NCFSM__NCCL_UNHANDLED_CUDA_ERROR);
    k->cur = NULL;
    progress = true;
    if (strict_settle(c, v)) return true;
  }
  if (!comp_stalled(c, now)) return progress;
  char what[400];
  struct ncfsm__sreq *v = k->cur;
  snprintf(what, sizeof what,
           "strict verification (channel nccl): not every rank submitted collective seq %llu (%s) within %llu ms "
           "of this rank (a rank stopped, skipped a collective or is far behind); nothing of it was launched",
           (unsigned long long)(v->w ? strict_seq(c, v->w) : c->coll_seq),
           ncfsm_opkind_name((ncfsm_opkind_t)v->mine.op), (unsigned long long)c->opts.verify_stall_ms);
  fail(c, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, what);
  return true;
}
