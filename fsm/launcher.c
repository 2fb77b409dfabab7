/*
 * The launcher: what launches from the per-comm launch queues, and how; the
 * control steps around it are in fsm/control.c. Every backend call happens
 * on the thread that drives the loop (R9).
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
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm/engine.h"

#define IS_ERR(rc) NCFSM__IS_ERR(rc)

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
    if (w->state == NCFSM_WORK_VERIFYING) return false; /* strict: its fingerprints are not all in yet */
  return true;
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
  else if (st == NCFSM__NCCL_IN_PROGRESS) ncfsm__comm_fire(c, NCFSM_EV_LAUNCH_PENDING, NULL);
  else ncfsm__comm_fire(c, NCFSM_EV_LAUNCH_FINAL, NULL);
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

/* w is LAUNCHING (its seq and deadline: R11) and joins its comm's launching list. */
static void work_launching(ncfsm_work *w, const ncfsm__wev *wl) {
  ncfsm_comm *c = w->comm;
  ncfsm__work_fire(w, NCFSM__WE_LAUNCH, wl);
  w->next = NULL;
  if (!c->launching) c->launching = w;
  else c->launching_tail->next = w;
  c->launching_tail = w;
  c->be_calls++;
}

/* One backend group: the taken works (nops of them), over the comms set[0..n). */
static void launch_taken(ncfsm_loop *loop, ncfsm_work *taken, int nops, ncfsm_comm **set, int n) {
  _Static_assert(NCFSM__NCCL_SUCCESS == 0, "op_rc starts zeroed");
  const ncfsm__backend *be = set[0]->be;
  uint64_t launch = ++loop->launch_id;
  int stack_rc[16] = {0}, *op_rc = n <= 16 ? stack_rc : calloc((size_t)n, sizeof *op_rc);
  /* The ops as the backend sees them, taken under the lock (a work's op does
   * not change after its submission, nor is a LAUNCHING work freed). */
  struct launch_op { void *bcomm; const ncfsm__op *op; int comm; } stack_ops[64], *ops = stack_ops;
  int cap = nops > 64 ? nops : 64;
  if (nops > 64) ops = malloc((size_t)nops * sizeof *ops);
  bool timing = set[0]->opts.timing;
  for (int i = 1; i < n && !timing; i++) timing = set[i]->opts.timing;
  if (timing) record_starts(taken);
  /* Every taken work is LAUNCHING from here: a failure below fails it. */
  ncfsm__wev wl = {NCFSM_OK, launch, ncfsm__turn_now(loop)};
  int k = 0;
  for (ncfsm_work *w = taken, *next; w; w = next) {
    next = w->bnext;
    w->bnext = NULL;
    ncfsm_comm *c = w->comm;
    work_launching(w, &wl);
    int i = 0;
    while (i < n - 1 && set[i] != c) i++;
    if (ops && k < cap) ops[k++] = (struct launch_op){c->bcomm, &w->op, i};
  }
  assert(k == nops || !ops); /* the launcher counted what it took */
  if (!op_rc || !ops) { /* nothing reached NCCL */
    for (int i = 0; i < n; i++)
      ncfsm__comm_fail(set[i], NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_NO_MEMORY, NCFSM__NCCL_SYSTEM_ERROR,
                       "launch (out of memory)");
    if (op_rc != stack_rc) free(op_rc);
    if (ops != stack_ops) free(ops);
    return;
  }
  /* A blocking comm's group end waits for its peers (NCCL, and the sim for
   * up to NCFSM_SIM_WAIT_MS): never under the loop's lock. This thread still
   * owns the loop (R9); other threads may queue work meanwhile. */
  bool unlock = set[0]->opts.blocking, clk = false;
  if (unlock) {
    clk = ncfsm__turn_clock_pause(loop);
    pthread_mutex_unlock(&loop->mu);
  }
  int grc = be->group_start();
  if (!IS_ERR(grc)) {
    for (int j = 0; j < k; j++) {
      int rc = be->op(ops[j].bcomm, ops[j].op);
      if (IS_ERR(rc) && !IS_ERR(op_rc[ops[j].comm])) op_rc[ops[j].comm] = rc;
    }
    grc = be->group_end();
  }
  if (unlock) {
    pthread_mutex_lock(&loop->mu);
    ncfsm__turn_clock_resume(loop, clk); /* the group end waited */
  }
  if (ops != stack_ops) free(ops);
  for (int i = 0; i < n; i++)
    after_launch(set[i], IS_ERR(op_rc[i]) ? op_rc[i] : grc, "launch");
  if (op_rc != stack_rc) free(op_rc);
  loop->poll_iter = 0; /* progress: restart the burst of immediate polls */
}

/* Single ops that are the same protocol instance on local ranks of one
 * clique: the comms share the unique id (the callers take b's comm from the
 * peer ring of a's: fsm/active.c), and the ops the same sequence number and
 * kind. */
static bool same_instance(const ncfsm_work *a, const ncfsm_work *b) {
  /* Heads of their queues: each takes its comm's next seq at this launch (the
   * works taken for this launch get theirs in launch_taken, in step). */
  return a->comm->be == b->comm->be && a->comm->opts.blocking == b->comm->opts.blocking &&
         a->comm->coll_seq == b->comm->coll_seq && a->fp.op == b->fp.op && a->fp.peer < 0 && b->fp.peer < 0;
}

static bool head_ready(const ncfsm_comm *c) {
  return c->bq_head && launchable(c) && batch_ready(c->bq_head->b);
}

/* The launch heap's skip tests (fsm/active.c): a head that cannot launch;
 * ... or whose comm is one of set[0..n) (struct in_set). */
static bool not_ready(const ncfsm_comm *c, void *arg) {
  (void)arg;
  return !head_ready(c);
}
struct in_set {
  ncfsm_comm **set;
  int n;
};
static bool in_set_or_not_ready(const ncfsm_comm *c, void *arg) {
  const struct in_set *s = arg;
  for (int i = 0; i < s->n; i++)
    if (s->set[i] == c) return true;
  return !head_ready(c);
}

/* The comm whose head batch can launch and was submitted first: the launch
 * heap's minimum, unless heads that cannot launch come before it. */
static ncfsm_comm *next_launch(ncfsm_loop *loop) { return ncfsm__qheap_min(loop, not_ready, NULL); }

/*
 * Launch c's head batch b as one backend group, with:
 *  - the head batches of the other local ranks of c's clique that hold the
 *    same protocol instance (same seq): one thread driving several GPUs puts
 *    each instance's ops in one group, as NCCL asks of such programs. A rank
 *    whose op is not submitted yet is not waited for (R13: local ranks may
 *    drift; measured on 2 H200s: separate launches of warm comms are fine);
 *  - with a cap above 1 (coalesce_max, or chosen by fsm/coalesce.c), when
 *    every rank of the clique is in this launch, the next instances of all
 *    of them (up to the cap in ops, split at an R12 dependency). Ops of one comm are never grouped otherwise: NCCL
 *    matches the collectives of a group across ranks only when every rank
 *    groups the same ones, and ranks in other processes or threads group by
 *    their own timing (measured on 2.28.9: wrong data).
 */
/* The latency path (launch_one's first case): c's head batch is one op of c
 * alone, launched alone; the steps of launch_one and launch_taken without
 * their set-up (the set of comms, the coalescing bound, the copies of the ops). */
static void launch_lone(ncfsm_loop *loop, ncfsm_comm *c, ncfsm__batch *b) {
  ncfsm_work *w = NULL, *tail = NULL;
  ncfsm__batch_take(loop, b, &w, &tail);
  w->bnext = NULL;
  ncfsm__wev wl = {NCFSM_OK, ++loop->launch_id, ncfsm__turn_now(loop)};
  work_launching(w, &wl);
  const ncfsm__backend *be = c->be;
  int rc = be->group_start();
  if (!IS_ERR(rc)) {
    int orc = be->op(c->bcomm, &w->op);
    rc = be->group_end();
    if (IS_ERR(orc)) rc = orc;
  }
  after_launch(c, rc, "launch");
  loop->poll_iter = 0; /* progress: restart the burst of immediate polls */
}

static bool launch_one(ncfsm_loop *loop, ncfsm_comm *c) {
  ncfsm__batch *b = c->bq_head->b;
  bool single = !b->explicit_group;
  /* the comms of c's clique on this loop (a 1-rank clique has none but c) */
  int npeers = single && c->nranks > 1 ? ncfsm__comm_peers(c) : 0;
  /* One op of c alone, launched alone (a group of one op, or an ungrouped op
   * with nothing queued behind it and no other rank of its clique here), on
   * a nonblocking comm that does not time its works: the latency path. */
  if (b->nworks == 1 && b->nlinks == 1 && !c->opts.blocking && !c->opts.timing &&
      (!single || (!c->bq_head->next && (npeers == 0 || npeers == 1)))) {
    launch_lone(loop, c, b);
    return true;
  }
  int cap = b->nlive > npeers ? b->nlive : npeers;
  ncfsm_comm *stack_set[16], **set = stack_set;
  if (npeers < 0 || (cap > 16 && !(set = malloc((size_t)cap * sizeof *set)))) {
    loop->kick = true; /* out of memory: try again next turn */
    return false;
  }
  int n = 0;
  for (int i = 0; i < b->nlinks; i++)
    if (b->links[i].c) set[n++] = b->links[i].c;
  ncfsm_work *head = NULL, *tail = NULL;
  unsigned ntaken = (unsigned)b->nworks;
  ncfsm_work *w0 = b->head;
  ncfsm__batch_take(loop, b, &head, &tail);
  if (single && npeers) {
    for (ncfsm_comm *d = c->peer_next; d != c && n < cap; d = d->peer_next) {
      if (!head_ready(d) || d->bq_head->b->explicit_group) continue;
      ncfsm__batch *db = d->bq_head->b;
      if (!same_instance(w0, db->head)) continue;
      set[n++] = d;
      ntaken += (unsigned)db->nworks;
      ncfsm__batch_take(loop, db, &head, &tail);
    }
  }
  /* A lone batch (nothing queued behind it on c) skips the coalescing set-up. */
  uint64_t t0 = 0; /* auto, a timed launch: when its coalescing began (fsm/coalesce.h) */
  if (single && n == c->nranks && loop->co.cap > 1 && c->bq_head) {
    bool timed;
    unsigned max_ops = ncfsm__coalesce_begin(&loop->co, (unsigned)n, &timed);
    if (timed) t0 = ncfsm__now_ns();
    /* Every rank of the clique is here: the instances after this one join
     * the group for all ranks at once, so every rank's group holds the same
     * ops (a condition of NCCL's matching), and only while they were
     * submitted before every other comm's launchable head. */
    int queued = 0; /* the launch's comms with a queue left: when they are all the heap holds, no bound */
    for (int i = 0; i < n; i++) queued += set[i]->qh_pos != 0;
    uint64_t lim = UINT64_MAX;
    if (loop->nqh > queued) {
      struct in_set others = {set, n};
      const ncfsm_comm *first = ncfsm__qheap_min(loop, in_set_or_not_ready, &others);
      if (first) lim = first->bq_head->b->order;
    }
    ncfsm__spanset_reset(loop->spans);
    for (ncfsm_work *w = head; w; w = w->bnext) {
      ncfsm__batch one = {.head = w, .tail = w, .nworks = 1};
      ncfsm__spanset_take(loop->spans, &one);
    }
    while (ntaken + (unsigned)n <= max_ops) {
      const ncfsm_work *next0 = set[0]->bq_head ? set[0]->bq_head->b->head : NULL;
      bool ok = next0 != NULL;
      for (int i = 0; i < n && ok; i++) {
        ncfsm__blink *l = set[i]->bq_head;
        ok = l && !l->b->explicit_group && l->b->order < lim && batch_ready(l->b) &&
             (l->b->head == next0 ? next0->fp.peer < 0 : same_instance(next0, l->b->head)) && /* (itself: not p2p) */
             !ncfsm__spanset_take(loop->spans, l->b); /* R12 */
      }
      if (!ok) break;
      for (int i = 0; i < n; i++) {
        ntaken += (unsigned)set[i]->bq_head->b->nworks;
        ncfsm__batch_take(loop, set[i]->bq_head->b, &head, &tail);
      }
    }
  }
  launch_taken(loop, head, (int)ntaken, set, n);
  if (t0) ncfsm__coalesce_sample(&loop->co, ntaken, ncfsm__now_ns() - t0);
  if (set != stack_set) free(set);
  return true;
}

/* ---- the turn's launch step ------------------------------------------------------------ */

bool ncfsm__launch(ncfsm_loop *loop) {
  /* Control steps (aborts, unique ids, inits, finalizes) are rare: they run
   * only when a comm entered a CONTROL state (loop->ctl), and ask again while
   * one waits. */
  bool ctl = loop->ctl;
  loop->ctl = false;
  if (ctl) ncfsm__control(loop, false);
  bool any = false;
  for (ncfsm_comm *c; loop->nqueued && (c = next_launch(loop));) {
    if (!launch_one(loop, c)) break;
    any = true;
  }
  /* Finalizes after the launches: a DRAINING comm keeps loop->ctl set
   * until its finalize is issued (fsm/control.c), so a turn with no
   * control work left skips the pass. */
  if (ctl || loop->ctl) ncfsm__control(loop, true);
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
        c->ninflight--;
        ncfsm__work_end(w, NCFSM_WORK_FAILED, NCFSM_ERR_BACKEND);
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
  uint64_t now = ncfsm__turn_now(c->loop);
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
        ncfsm__work_end(w, NCFSM_WORK_FAILED, NCFSM_ERR_NO_MEMORY);
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
      ncfsm__work_end(w, NCFSM_WORK_FAILED, NCFSM_ERR_NO_MEMORY);
      w = next;
      continue;
    }
    m->refs++;
    w->mark = m;
    w->next = NULL;
    if (q->tail) q->tail->next = w;
    else q->head = w;
    q->tail = w;
    q->appended++;
    c->ninflight++;
    ncfsm__wev wf = {NCFSM_OK, 0, now};
    ncfsm__work_fire(w, NCFSM__WE_LAUNCH_FINAL, &wf);
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
