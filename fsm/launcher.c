/*
 * The launcher: per-comm launch queues, launches, and the control work the
 * loop issues itself (inits, finalizes, queued aborts). Every backend call
 * happens on the thread that drives the loop (R9).
 *
 * Queues (R13). Each comm has its own FIFO of batches; a batch of a user
 * group that spans comms sits in the queue of each of them and launches
 * when it heads all of them. A comm whose launch is in progress holds back
 * only its own queue: local ranks that drift apart (one thread per rank)
 * never wait on each other's batches. One backend group (a launch) holds
 * batches over one and the same set of comms only; ncclGroupEnd over two
 * comms that the user did not group would tie them together, and NCCL keeps
 * a comm that is ~1,022 launches ahead of its peer in progress until the
 * peer catches up (R13): with the peer's next op in the same stuck group,
 * that is a deadlock.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "fsm/internal.h"
#include "ncfsm/bootstrap.h"

#define IS_ERR(rc) NCFSM__IS_ERR(rc)

void ncfsm__batch_queue(ncfsm_loop *loop, ncfsm__batch *b) {
  for (int i = 0; i < b->nlinks; i++) {
    ncfsm__blink *l = &b->links[i];
    ncfsm_comm *c = l->c;
    l->b = b;
    l->next = NULL;
    if (c->opts.verify == NCFSM_VERIFY_STRICT && c->vboot)
      for (ncfsm_work *w = b->head; w; w = w->bnext)
        if (w->comm == c && w->fp.peer < 0) ncfsm__strict_queued(c, w);
    if (c->bq_tail) c->bq_tail->next = l;
    else c->bq_head = l;
    c->bq_tail = l;
  }
  b->nlive = b->nlinks;
  b->order = ++loop->batch_order;
  loop->nqueued++;
}

static bool launchable(const ncfsm_comm *c) {
  return c->bcomm && ncfsm__has(c, NCFSM_SF_LAUNCH);
}

/* b heads the queue of every comm it touches, and each of them can launch. */
static bool batch_ready(const ncfsm__batch *b) {
  for (int i = 0; i < b->nlinks; i++) {
    const ncfsm__blink *l = &b->links[i];
    if (l->c && (l->c->bq_head != l || !launchable(l->c))) return false;
  }
  for (const ncfsm_work *w = b->head; w; w = w->bnext)
    if (w->sreq) return false; /* strict: its fingerprints are not all in yet */
  return true;
}

/* Pop b (a ready batch) from its comms' queues onto the taken list. */
static void take_batch(ncfsm_loop *loop, ncfsm__batch *b, ncfsm_work **head, ncfsm_work **tail) {
  for (int i = 0; i < b->nlinks; i++) {
    ncfsm__blink *l = &b->links[i];
    ncfsm_comm *c = l->c;
    if (!c) continue;
    c->bq_head = l->next;
    if (!c->bq_head) c->bq_tail = NULL;
    l->next = NULL;
    l->c = NULL;
  }
  loop->nqueued--;
  for (ncfsm_work *w = b->head; w; w = w->bnext) w->batch = NULL;
  if (*tail) (*tail)->bnext = b->head;
  else *head = b->head;
  *tail = b->tail;
  if (b->explicit_group) free(b);
}

/* After a group end that included c's ops: decide the next state. */
static void after_launch(ncfsm_comm *c, int rc, const char *what) {
  int st = NCFSM__NCCL_SUCCESS;
  if (IS_ERR(rc)) {
    if (c->bcomm && c->be->get_async_error(c->bcomm, &st) != NCFSM__NCCL_SUCCESS) st = rc;
    int code = IS_ERR(st) ? st : rc;
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(code), code, what);
    return;
  }
  if (!c->opts.blocking) {
    int qrc = c->be->get_async_error(c->bcomm, &st);
    if (qrc != NCFSM__NCCL_SUCCESS) st = qrc;
  }
  if (IS_ERR(st)) ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(st), st, what);
  else if (st == NCFSM__NCCL_IN_PROGRESS) ncfsm__fire(c, NCFSM_EV_LAUNCH_PENDING, NCFSM_OK);
  else ncfsm__fire(c, NCFSM_EV_LAUNCH_FINAL, NCFSM_OK);
}

/* opts.timing: one start event per (comm, stream), recorded before the NCCL
 * calls (always legal: R2 only forbids work after an InProgress end). */
static void record_starts(ncfsm_work *taken) {
  struct { ncfsm_comm *c; void *stream; ncfsm__mark *m; } starts[16];
  int nstarts = 0;
  for (ncfsm_work *w = taken; w; w = w->bnext) {
    if (!w->comm->opts.timing) continue;
    int i;
    for (i = 0; i < nstarts; i++)
      if (starts[i].c == w->comm && starts[i].stream == w->op.stream) break;
    if (i == nstarts) {
      if (nstarts == 16) continue; /* device_ms stays -1 for the rest */
      ncfsm__mark *m = ncfsm__mark_get(w->comm);
      if (!m) continue;
      if (w->comm->be->event_record(m->event, w->op.stream) != 0) {
        m->refs = 1;
        ncfsm__mark_put(w->comm, m);
        continue;
      }
      /* One query now: a model backend (the sim) timestamps events when it
       * first sees them complete; CUDA ignores it. */
      w->comm->be->event_query(m->event);
      starts[nstarts].c = w->comm;
      starts[nstarts].stream = w->op.stream;
      starts[nstarts].m = m;
      nstarts++;
    }
    starts[i].m->refs++;
    w->start_mark = starts[i].m;
  }
}

/* R11: a work's seq is taken when it is handed to NCCL, in the comm's
 * launch order; the rolling hash follows the collectives launched. */
static void take_seq(ncfsm_work *w) {
  ncfsm_comm *c = w->comm;
  switch (w->op.kind) {
    case NCFSM_KIND_SEND: w->fp.seq = c->p2p_send_seq[w->op.peer]++; break;
    case NCFSM_KIND_RECV: w->fp.seq = c->p2p_recv_seq[w->op.peer]++; break;
    default:
      w->fp.seq = c->coll_seq++;
      c->hash = XXH3_64bits_withSeed(&w->fp, sizeof w->fp, c->hash);
      if (c->vboot && c->opts.verify == NCFSM_VERIFY_ASYNC) ncfsm__verify_launched(c);
      break;
  }
}

/* One backend group: the taken works, over the comms set[0..n). */
static void launch_taken(ncfsm_loop *loop, ncfsm_work *taken, ncfsm_comm **set, int n) {
  const ncfsm__backend *be = set[0]->be;
  uint64_t now = ncfsm__now_ns();
  uint64_t launch = ++loop->launch_id;
  int stack_rc[16], *op_rc = n <= 16 ? stack_rc : calloc((size_t)n, sizeof *op_rc);
  record_starts(taken);
  /* Every taken work is LAUNCHING from here: a failure below fails it. */
  for (ncfsm_work *w = taken, *next; w; w = next) {
    next = w->bnext;
    ncfsm_comm *c = w->comm;
    take_seq(w);
    w->group = launch;
    w->t_launch = now;
    w->deadline_ns = ncfsm__deadline(now, w->timeout_ms ? w->timeout_ms : c->opts.timeout_ms);
    ncfsm__work_set_state(w, NCFSM_WORK_LAUNCHING);
    w->next = NULL;
    if (!c->launching) c->launching = w;
    else c->launching_tail->next = w;
    c->launching_tail = w;
  }
  if (!op_rc) { /* nothing reached NCCL */
    for (int i = 0; i < n; i++)
      ncfsm__comm_fail(set[i], NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_NO_MEMORY, NCFSM__NCCL_SYSTEM_ERROR,
                       "launch (out of memory)");
    return;
  }
  for (int i = 0; i < n; i++) op_rc[i] = NCFSM__NCCL_SUCCESS;
  /* The ops as the backend sees them, copied under the lock. */
  struct launch_op { void *bcomm; ncfsm__op op; int comm; } stack_ops[64], *ops = stack_ops;
  int nops = 0;
  for (ncfsm_work *w = taken; w; w = w->bnext) nops++;
  if (nops > 64 && !(ops = malloc((size_t)nops * sizeof *ops))) {
    for (int i = 0; i < n; i++)
      ncfsm__comm_fail(set[i], NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_NO_MEMORY, NCFSM__NCCL_SYSTEM_ERROR,
                       "launch (out of memory)");
    if (op_rc != stack_rc) free(op_rc);
    return;
  }
  nops = 0;
  for (ncfsm_work *w = taken, *next; w; w = next) {
    next = w->bnext;
    w->bnext = NULL;
    int i = 0;
    while (i < n - 1 && set[i] != w->comm) i++;
    w->comm->be_calls++;
    ops[nops++] = (struct launch_op){w->comm->bcomm, w->op, i};
  }
  /* A blocking comm's group end waits for its peers (NCCL, and the sim for
   * up to NCFSM_SIM_WAIT_MS): never under the loop's lock. This thread still
   * owns the loop (R9); other threads may queue work meanwhile. */
  bool unlock = set[0]->opts.blocking;
  if (unlock) pthread_mutex_unlock(&loop->mu);
  int grc = be->group_start();
  if (!IS_ERR(grc)) {
    for (int k = 0; k < nops; k++) {
      int rc = be->op(ops[k].bcomm, &ops[k].op);
      if (IS_ERR(rc) && !IS_ERR(op_rc[ops[k].comm])) op_rc[ops[k].comm] = rc;
    }
    grc = be->group_end();
  }
  if (unlock) pthread_mutex_lock(&loop->mu);
  if (ops != stack_ops) free(ops);
  for (int i = 0; i < n; i++)
    after_launch(set[i], IS_ERR(op_rc[i]) ? op_rc[i] : grc, "launch");
  if (op_rc != stack_rc) free(op_rc);
  loop->poll_iter = 0; /* progress: restart the burst of immediate polls */
}

/* Single ops that are the same protocol instance on local ranks of one
 * clique: the comms share the unique id, and the ops the same sequence
 * number and kind. */
static bool same_instance(const ncfsm_work *a, const ncfsm_work *b) {
  /* Heads of their queues: each takes its comm's next seq at this launch (the
   * works taken for this launch get theirs in launch_taken, in step). */
  return a->comm->be == b->comm->be && a->comm->opts.blocking == b->comm->opts.blocking &&
         a->comm->coll_seq == b->comm->coll_seq && a->fp.op == b->fp.op && a->fp.peer < 0 &&
         b->fp.peer < 0 && !memcmp(&a->comm->uid, &b->comm->uid, sizeof a->comm->uid);
}

static bool head_ready(const ncfsm_comm *c) {
  return c->bq_head && launchable(c) && batch_ready(c->bq_head->b);
}

/* The comm whose head batch can launch and was submitted first; *limit is
 * the order of the next such head of another comm (or none: UINT64_MAX). */
static ncfsm_comm *next_launch(ncfsm_loop *loop, uint64_t *limit) {
  ncfsm_comm *best = NULL;
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    if (head_ready(c) && (!best || c->bq_head->b->order < best->bq_head->b->order)) best = c;
  *limit = UINT64_MAX;
  if (!best) return NULL;
  const ncfsm__batch *first = best->bq_head->b;
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    if (c->bq_head && c->bq_head->b != first && c->bq_head->b->order < *limit && head_ready(c))
      *limit = c->bq_head->b->order;
  return best;
}

/*
 * Launch c's head batch b as one backend group, with:
 *  - the head batches of the other local ranks of c's clique that hold the
 *    same protocol instance (same seq): one thread driving several GPUs puts
 *    each instance's ops in one group, as NCCL asks of such programs. A rank
 *    whose op is not submitted yet is not waited for (R13: local ranks may
 *    drift; measured on 2 H200s: separate launches of warm comms are fine);
 *  - with coalesce_max > 1, when every rank of the clique is in this launch,
 *    the next instances of all of them (up to coalesce_max ops, split at an
 *    R12 dependency). Ops of one comm are never grouped otherwise: NCCL
 *    matches the collectives of a group across ranks only when every rank
 *    groups the same ones, and ranks in other processes or threads group by
 *    their own timing (measured on 2.28.9: wrong data).
 */
static void launch_one(ncfsm_loop *loop, ncfsm_comm *c, uint64_t limit) {
  ncfsm__batch *b = c->bq_head->b;
  int cap = b->nlive > loop->ncomms ? b->nlive : loop->ncomms;
  ncfsm_comm *stack_set[16], **set = stack_set;
  if (cap > 16 && !(set = malloc((size_t)cap * sizeof *set))) {
    loop->kick = true; /* try again next turn */
    return;
  }
  int n = 0;
  for (int i = 0; i < b->nlinks; i++)
    if (b->links[i].c) set[n++] = b->links[i].c;
  ncfsm_work *head = NULL, *tail = NULL;
  unsigned ntaken = (unsigned)b->nworks;
  bool single = !b->explicit_group;
  ncfsm_work *w0 = b->head;
  take_batch(loop, b, &head, &tail);
  if (single) {
    for (ncfsm_comm *d = loop->comms; d && n < cap; d = d->next) {
      if (d == c || !head_ready(d) || d->bq_head->b->explicit_group) continue;
      ncfsm__batch *db = d->bq_head->b;
      if (!same_instance(w0, db->head)) continue;
      set[n++] = d;
      ntaken += (unsigned)db->nworks;
      take_batch(loop, db, &head, &tail);
    }
  }
  if (single && n == c->nranks && loop->opts.coalesce_max > 1) {
    /* Every rank of the clique is here: the instances after this one join
     * the group for all ranks at once, so every rank's group holds the same
     * ops (a condition of NCCL's matching), and only while they were
     * submitted before every other comm's launchable head. */
    uint64_t lim = UINT64_MAX;
    for (ncfsm_comm *d = loop->comms; d; d = d->next) {
      bool in = false;
      for (int i = 0; i < n && !in; i++) in = set[i] == d;
      if (!in && head_ready(d) && d->bq_head->b->order < lim) lim = d->bq_head->b->order;
    }
    (void)limit;
    ncfsm__spanset_reset(loop->spans);
    for (ncfsm_work *w = head; w; w = w->bnext) {
      ncfsm__batch one = {.head = w, .tail = w, .nworks = 1};
      ncfsm__spanset_take(loop->spans, &one);
    }
    while (ntaken + (unsigned)n <= loop->opts.coalesce_max) {
      const ncfsm_work *next0 = set[0]->bq_head ? set[0]->bq_head->b->head : NULL;
      bool ok = next0 != NULL;
      for (int i = 0; i < n && ok; i++) {
        ncfsm__blink *l = set[i]->bq_head;
        ok = l && !l->b->explicit_group && l->b->order < lim && batch_ready(l->b) &&
             same_instance(next0, l->b->head) && !ncfsm__spanset_take(loop->spans, l->b); /* R12 */
      }
      if (!ok) break;
      for (int i = 0; i < n; i++) {
        ntaken += (unsigned)set[i]->bq_head->b->nworks;
        take_batch(loop, set[i]->bq_head->b, &head, &tail);
      }
    }
  }
  launch_taken(loop, head, set, n);
  if (set != stack_set) free(set);
}

/* ---- inits ------------------------------------------------------------------------ */

/* Runs in the bootstrap's callback: only flags the loop, without its lock
 * (a turn may hold the lock while freeing this very request). */
static void uid_done(ncfsm_boot_req *req, ncfsm_result_t status, void *arg) {
  ncfsm_comm *c = arg;
  (void)req;
  (void)status;
  ncfsm__loop_kick_async(c->loop);
}

/* The unique id of an init_boot comm: post the exchange on the loop thread
 * (the bootstrap is single-threaded on its base), then test it. True when
 * the id is known. */
static bool uid_known(ncfsm_comm *c) {
  if (!c->boot && !c->uid_req) return true;
  ncfsm_loop *loop = c->loop;
  if (!c->uid_req) {
    ncfsm_boot_req *req = NULL;
    ncfsm_result_t br = ncfsm_boot_bcast_roots_post(c->boot, c->uid_buf, NCFSM_UNIQUE_ID_BYTES, c->nroots, &req);
    if (br != NCFSM_OK) {
      char what[320];
      snprintf(what, sizeof what, "the bootstrap refused the unique id exchange: %s",
               ncfsm_boot_last_error(c->boot));
      c->boot = NULL;
      ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, NCFSM__NCCL_SUCCESS, what);
      return false;
    }
    c->uid_req = req;
    ncfsm_boot_req_on_done(req, uid_done, c);
  }
  ncfsm_result_t r = ncfsm_boot_test(c->uid_req);
  if (r == NCFSM_ERR_AGAIN) {
    loop->ctl = true;
    return false;
  }
  ncfsm_boot_req_free(c->uid_req);
  c->uid_req = NULL;
  c->boot = NULL;
  if (r != NCFSM_OK) {
    free(c->uid_buf);
    c->uid_buf = NULL;
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, NCFSM__NCCL_SUCCESS,
                     "unique id exchange through the bootstrap");
    return false;
  }
  memcpy(&c->uid, c->uid_buf, sizeof c->uid); /* root 0's (rank 0's) id */
  /* the same on every rank from here (one root: the hash of rank 0's id, as before) */
  c->comm_id = XXH3_64bits(c->uid_buf, (size_t)c->nroots * NCFSM_UNIQUE_ID_BYTES);
  if (c->nroots == 1) { /* several: kept for ncclCommInitRankScalable, freed at the init */
    free(c->uid_buf);
    c->uid_buf = NULL;
  }
  return true;
}

static void issue_inits(ncfsm_loop *loop) {
  /* All inits of a turn in one group, however many ranks (a blocking clique
   * driven by one thread needs every rank's init in one group). */
  int n = 0;
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    n += c->state == NCFSM_STATE_INIT_QUEUED;
  if (!n) return;
  ncfsm_comm *stack_inits[16], **inits = n <= 16 ? stack_inits : malloc((size_t)n * sizeof *inits);
  struct init_res { int rc; void *bcomm; } stack_rcs[16], *rcs = n <= 16 ? stack_rcs : malloc((size_t)n * sizeof *rcs);
  if (!inits || !rcs) { /* try again next turn */
    if (inits != stack_inits) free(inits);
    if (rcs != stack_rcs) free(rcs);
    loop->ctl = true;
    return;
  }
  n = 0;
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    if (c->state == NCFSM_STATE_INIT_QUEUED && uid_known(c) && c->state == NCFSM_STATE_INIT_QUEUED)
      inits[n++] = c;
  /* One group holds one backend and one blocking mode; the others wait for
   * the next turn. */
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (inits[i]->be == inits[0]->be && inits[i]->opts.blocking == inits[0]->opts.blocking) inits[m++] = inits[i];
    else loop->ctl = true;
  }
  n = m;
  const ncfsm__backend *be = n ? inits[0]->be : NULL;
  bool grouped = n > 1;
  for (int i = 0; i < n; i++) {
    inits[i]->be_calls++;
    inits[i]->refs++;
    ncfsm__fire(inits[i], NCFSM_EV_INIT_ISSUED, NCFSM_OK);
  }
  /* A blocking init waits for every rank: never under the loop's lock. The
   * comms are INIT_IN_PROGRESS meanwhile, where only abort is legal, and an
   * abort from another thread runs on this thread, after this. */
  bool unlock = n && inits[0]->opts.blocking;
  if (unlock) pthread_mutex_unlock(&loop->mu);
  int grc = grouped ? be->group_start() : NCFSM__NCCL_SUCCESS;
  for (int i = 0; i < n; i++) {
    ncfsm_comm *c = inits[i];
    ncfsm__comm_config cfg = {c->opts.blocking, c->opts.device, &c->sim, c->name};
    rcs[i].bcomm = NULL;
    unsigned feat = c->be->features();
    bool scalable = c->nroots > 1 && c->uid_buf && c->be->comm_init_scalable && (feat & NCFSM__HAS_INIT_SCALABLE);
    rcs[i].rc = IS_ERR(grc) ? grc
                : scalable  ? c->be->comm_init_scalable(&rcs[i].bcomm, c->nranks, (const ncfsm_unique_id *)c->uid_buf,
                                                        c->nroots, c->rank, &cfg)
                            : c->be->comm_init(&rcs[i].bcomm, c->nranks, &c->uid, c->rank, &cfg);
  }
  if (grouped && !IS_ERR(grc)) grc = be->group_end();
  if (unlock) pthread_mutex_lock(&loop->mu);
  for (int i = 0; i < n; i++) {
    inits[i]->refs--; /* the user still holds each: never the last */
    inits[i]->bcomm = rcs[i].bcomm;
    free(inits[i]->uid_buf); /* the roots' ids (several roots): used by the init just made */
    inits[i]->uid_buf = NULL;
  }
  for (int i = 0; i < n; i++) {
    ncfsm_comm *c = inits[i];
    int rc = IS_ERR(rcs[i].rc) ? rcs[i].rc : IS_ERR(grc) ? grc : rcs[i].rc;
    if (IS_ERR(rc) || !c->bcomm) {
      int code = IS_ERR(rc) ? rc : NCFSM__NCCL_INTERNAL_ERROR;
      ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(code), code, "ncclCommInitRankConfig");
      continue;
    }
    int st = NCFSM__NCCL_SUCCESS;
    if (!c->opts.blocking) c->be->get_async_error(c->bcomm, &st);
    if (IS_ERR(st)) ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(st), st, "init");
    else if (st == NCFSM__NCCL_SUCCESS) ncfsm__fire(c, NCFSM_EV_INIT_DONE, NCFSM_OK);
  }
  if (inits != stack_inits) free(inits);
  if (rcs != stack_rcs) free(rcs);
}

/* ---- finalize ---------------------------------------------------------------------- */

static void issue_finalize(ncfsm_comm *c) {
  c->be_calls++;
  int rc = c->be->finalize(c->bcomm);
  if (IS_ERR(rc)) {
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(rc), rc, "ncclCommFinalize");
    return;
  }
  ncfsm__fire(c, NCFSM_EV_FINALIZE_ISSUED, NCFSM_OK);
  int st = NCFSM__NCCL_SUCCESS;
  if (!c->opts.blocking) c->be->get_async_error(c->bcomm, &st);
  if (IS_ERR(st)) ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(st), st, "finalize");
  else if (st == NCFSM__NCCL_SUCCESS) ncfsm__fire(c, NCFSM_EV_FINALIZE_DONE, NCFSM_OK);
}

static void issue_finalizes(ncfsm_loop *loop) {
  for (ncfsm_comm *c = loop->comms; c; c = c->next) {
    if (c->state != NCFSM_STATE_DRAINING) continue;
    if (c->bcomm && ncfsm__can_fire(c, NCFSM_EV_FINALIZE_ISSUED)) issue_finalize(c);
    else loop->ctl = true; /* queued ops launch first; look again next turn */
  }
}

/* ---- aborts ------------------------------------------------------------------------- */

/* ncclCommAbort of n comms (their ABORT fired: CLOSING), inside one group
 * when there are several (R5), with the loop's lock released: an abort
 * takes hundreds of ms on GPUs, and other threads' calls must not stall. */
static void abort_backend(ncfsm_loop *loop, ncfsm_comm **cs, int n) {
  void *stack_b[16], **bc = n <= 16 ? stack_b : malloc((size_t)n * sizeof *bc);
  const ncfsm__backend *be = NULL;
  bool one_backend = true;
  for (int i = 0; i < n; i++) {
    if (be && be != cs[i]->be) one_backend = false;
    be = cs[i]->be;
    cs[i]->refs++;
    if (cs[i]->bcomm) cs[i]->be_calls++;
  }
  bool grouped = n > 1 && one_backend && bc;
  /* Other threads see no backend comm while it is being aborted (e.g.
   * ncfsm_sim_get_stats must not read what the backend frees). */
  if (bc)
    for (int i = 0; i < n; i++) {
      bc[i] = cs[i]->bcomm;
      cs[i]->bcomm = NULL;
    }
  ncfsm__loop_claim(loop);
  pthread_mutex_unlock(&loop->mu);
  if (grouped && NCFSM__IS_ERR(be->group_start())) {
    NCFSM_WARN(NCFSM__SUB_FSM, "ncclGroupStart failed; aborting %d communicators one by one", n);
    grouped = false;
  }
  for (int i = 0; i < n; i++) {
    void *b = bc ? bc[i] : cs[i]->bcomm;
    if (!b) continue;
    int rc = cs[i]->be->abort(b);
    if (rc != NCFSM__NCCL_SUCCESS)
      NCFSM_WARN(NCFSM__SUB_FSM, "[%s] ncclCommAbort returned %s", cs[i]->name,
                 ncfsm__nccl_result_name(rc));
  }
  if (grouped) {
    int grc = be->group_end();
    if (grc != NCFSM__NCCL_SUCCESS)
      NCFSM_WARN(NCFSM__SUB_FSM, "ncclGroupEnd after %d aborts returned %s", n, ncfsm__nccl_result_name(grc));
  }
  pthread_mutex_lock(&loop->mu);
  ncfsm__loop_unclaim(loop);
  if (bc != stack_b) free(bc);
  for (int i = 0; i < n; i++) {
    ncfsm__fire(cs[i], NCFSM_EV_CLOSE_DONE, NCFSM_OK);
    ncfsm__comm_unref(cs[i]);
  }
}

void ncfsm__comm_abort_now(ncfsm_comm *c) {
  ncfsm__fire(c, NCFSM_EV_ABORT, NCFSM_OK);
  abort_backend(c->loop, &c, 1);
}

static void issue_aborts(ncfsm_loop *loop) {
  int n = 0;
  for (ncfsm_comm *c = loop->comms; c; c = c->next) n += c->state == NCFSM_STATE_ABORT_QUEUED;
  if (!n) return;
  ncfsm_comm *stack_cs[16], **cs = n <= 16 ? stack_cs : malloc((size_t)n * sizeof *cs);
  if (!cs) {
    loop->ctl = true;
    return;
  }
  n = 0;
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    if (c->state == NCFSM_STATE_ABORT_QUEUED) {
      ncfsm__fire(c, NCFSM_EV_ABORT_ISSUED, NCFSM_OK);
      cs[n++] = c;
    }
  abort_backend(loop, cs, n);
  if (cs != stack_cs) free(cs);
}

/* ---- the turn's launch step ------------------------------------------------------------ */

bool ncfsm__launch(ncfsm_loop *loop) {
  /* Control work (aborts, inits, finalizes) is rare: scan for it only when
   * something asked for it (loop->ctl), and keep asking while a comm waits. */
  bool ctl = loop->ctl;
  loop->ctl = false;
  if (ctl) {
    issue_aborts(loop);
    issue_inits(loop);
  }
  bool any = false;
  uint64_t limit;
  for (ncfsm_comm *c; loop->nqueued && (c = next_launch(loop, &limit));) {
    launch_one(loop, c, limit);
    any = true;
  }
  if (ctl || any) issue_finalizes(loop);
  return any;
}

/* An event that was not recorded would read as complete: its works fail
 * instead (their completion can never be observed). */
static void fail_marked(ncfsm_comm *c, ncfsm__mark *m) {
  for (int i = 0; i < c->nsq; i++) {
    ncfsm__squeue *q = &c->sq[i];
    ncfsm_work **pp = &q->head, *last = NULL;
    while (*pp) {
      ncfsm_work *w = *pp;
      if (w->mark == m) {
        *pp = w->next;
        ncfsm__work_finish(w, NCFSM_WORK_FAILED, NCFSM_ERR_BACKEND);
      } else {
        last = w;
        pp = &w->next;
      }
    }
    q->tail = last;
  }
}

/* act_record_events (R2): the launch is final, so the kernels are on their
 * streams; only now is a completion event recorded after them. One event
 * per (launch, stream) is shared by the works of that launch. */
void ncfsm__launch_final(ncfsm_comm *c) {
  uint64_t now = ncfsm__now_ns();
  struct { void *stream; ncfsm__mark *mark; } ms[8];
  int nms = 0;
  ncfsm_work *w = c->launching;
  c->launching = c->launching_tail = NULL;
  while (w) {
    ncfsm_work *next = w->next;
    ncfsm__mark *m = NULL;
    for (int i = 0; i < nms; i++)
      if (ms[i].stream == w->op.stream) m = ms[i].mark;
    if (!m) {
      if (nms == 8) { /* flush: record the marks taken so far */
        for (int i = 0; i < nms; i++)
          if (c->be->event_record(ms[i].mark->event, ms[i].stream) != 0) {
            NCFSM_WARN(NCFSM__SUB_FSM, "[%s] event record failed", c->name);
            fail_marked(c, ms[i].mark);
          }
        nms = 0;
      }
      m = ncfsm__mark_get(c);
      if (!m) {
        ncfsm__work_finish(w, NCFSM_WORK_FAILED, NCFSM_ERR_NO_MEMORY);
        w = next;
        continue;
      }
      ms[nms].stream = w->op.stream;
      ms[nms].mark = m;
      nms++;
    }
    ncfsm__squeue *q = NULL;
    for (int i = 0; i < c->nsq && !q; i++)
      if (c->sq[i].stream == w->op.stream) q = &c->sq[i];
    if (!q && c->nsq == c->capsq) {
      int cap = c->capsq ? 2 * c->capsq : 4;
      ncfsm__squeue *nq = realloc(c->sq, (size_t)cap * sizeof *nq);
      if (nq) {
        c->sq = nq;
        c->capsq = cap;
      }
    }
    if (!q && c->nsq < c->capsq) {
      c->sq[c->nsq] = (ncfsm__squeue){w->op.stream, NULL, NULL, 0, 0};
      q = &c->sq[c->nsq++];
    }
    if (!q) {
      ncfsm__work_finish(w, NCFSM_WORK_FAILED, NCFSM_ERR_NO_MEMORY);
      w = next;
      continue;
    }
    m->refs++;
    w->mark = m;
    w->t_final = now;
    w->next = NULL;
    if (q->tail) q->tail->next = w;
    else q->head = w;
    q->tail = w;
    q->appended++;
    ncfsm__work_set_state(w, NCFSM_WORK_IN_FLIGHT);
    w = next;
  }
  for (int i = 0; i < nms; i++) {
    int rc = c->be->event_record(ms[i].mark->event, ms[i].stream);
    if (rc != 0) {
      NCFSM_WARN(NCFSM__SUB_FSM, "[%s] event record failed (%d)", c->name, rc);
      fail_marked(c, ms[i].mark);
      continue;
    }
    if (c->opts.timing) /* the seed's question: is the work done right after the launch? */
      ms[i].mark->ready_at_final = c->be->event_query(ms[i].mark->event) == 0;
  }
}
