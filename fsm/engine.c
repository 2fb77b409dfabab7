/*
 * The engine: applies fsm/comm.def, launches queued batches, polls the
 * backend and fails works. Every function here runs with loop->mu held, and
 * every backend call happens on the thread that drives the loop (R9).
 * Actions are named after comm.def's action column.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm/internal.h"
#include "ncfsm/bootstrap.h"

#define IS_ERR(rc) NCFSM__IS_ERR(rc)

void ncfsm__set_error(ncfsm_comm *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(c->last_error, sizeof c->last_error, "[%s rank %d] ", c->name, c->rank);
  if (n < 0 || (size_t)n >= sizeof c->last_error) n = 0;
  vsnprintf(c->last_error + n, sizeof c->last_error - (size_t)n, fmt, ap);
  va_end(ap);
  NCFSM_INFO(NCFSM__SUB_FSM, "%s", c->last_error);
}

/* ---- references ------------------------------------------------------------ */

static void comm_free(ncfsm_comm *c) {
  ncfsm_loop *loop = c->loop;
  if (c->uid_req) ncfsm_boot_req_free(c->uid_req);
  free(c->uid_buf);
  for (ncfsm_comm **pp = &loop->comms; *pp; pp = &(*pp)->next)
    if (*pp == c) { *pp = c->next; loop->ncomms--; break; }
  while (c->free_marks) {
    ncfsm__mark *m = c->free_marks;
    c->free_marks = m->next_free;
    c->be->event_destroy(m->event);
    free(m);
  }
  if (c->stream) c->be->stream_destroy(c->stream);
  free(c->sq);
  free(c->p2p_seq);
  c->magic = NCFSM__DEAD_MAGIC;
  free(c);
}

void ncfsm__comm_unref(ncfsm_comm *c) {
  if (--c->refs == 0 && c->released) comm_free(c);
}

static void mark_put(ncfsm_comm *c, ncfsm__mark *m) {
  if (--m->refs > 0) return;
  m->next_free = c->free_marks;
  c->free_marks = m;
}

void ncfsm__work_unref(ncfsm_work *w) {
  if (--w->refs > 0) return;
  ncfsm_comm *c = w->comm;
  ncfsm_loop *loop = c->loop;
  if (w->mark) mark_put(c, w->mark);
  if (w->start_mark) mark_put(c, w->start_mark);
  w->magic = NCFSM__DEAD_MAGIC;
  w->next = loop->free_works;
  loop->free_works = w;
  ncfsm__comm_unref(c);
}

/* ---- transitions and trace ----------------------------------------------------- */

void ncfsm__fire(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_result_t result) {
  const char *action, *rule;
  ncfsm_state_t from = c->state;
  ncfsm_state_t next = ncfsm_transition(from, ev, &action, &rule);
  if (next == NCFSM_STATE_COUNT) {
    /* A bug in the engine, not a user error: the table has no such step. */
    NCFSM_LOG(NCFSM__LOG_ERROR, NCFSM__SUB_FSM, "[%s] invalid event %s in state %s (engine bug)",
              c->name, ncfsm_event_name(ev), ncfsm_state_name(from));
    return;
  }
  c->state = next;
  NCFSM_TRACE(NCFSM__SUB_FSM, "[%s rank %d] %s --%s/%s (%s)--> %s", c->name, c->rank,
              ncfsm_state_name(from), ncfsm_event_name(ev), action, rule, ncfsm_state_name(next));
  ncfsm_loop *loop = c->loop;
  if (loop->trace) {
    ncfsm_trace_rec r = {NCFSM_OBJ_COMM, c, c->rank, 0, (int)from, (int)ev, (int)next, result,
                         ncfsm__now_ns()};
    loop->trace(&r, loop->trace_arg);
  }
  if (c->opts.on_state) {
    struct ncfsm__state_note *n = malloc(sizeof *n);
    if (n) {
      *n = (struct ncfsm__state_note){c, from, next, ev, NULL};
      c->refs++;
      if (loop->snote_tail) loop->snote_tail->next = n;
      else loop->snote_head = n;
      loop->snote_tail = n;
    }
  }
  switch (next) {
    case NCFSM_STATE_INIT_IN_PROGRESS:
    case NCFSM_STATE_LAUNCH_IN_PROGRESS:
    case NCFSM_STATE_FINALIZING:
    case NCFSM_STATE_REVOKING:
      if (from != next)
        c->phase_deadline = ncfsm__deadline(ncfsm__now_ns(), c->opts.timeout_ms);
      break;
    default:
      break;
  }
}

void ncfsm__work_set_state(ncfsm_work *w, ncfsm_work_state_t st) {
  ncfsm_work_state_t from = w->state;
  w->state = st;
  ncfsm_loop *loop = w->comm->loop;
  if (loop->trace) {
    ncfsm_trace_rec r = {NCFSM_OBJ_WORK, w,        w->comm->rank, w->fp.seq, (int)from, -1,
                         (int)st,        w->status, ncfsm__now_ns()};
    loop->trace(&r, loop->trace_arg);
  }
}

/* Final state: the callback fires once, on the loop thread, at the next flush. */
void ncfsm__work_finish(ncfsm_work *w, ncfsm_work_state_t st, ncfsm_result_t status) {
  if (w->notified) return;
  w->notified = true;
  w->status = status;
  w->t_complete = ncfsm__now_ns();
  ncfsm__work_set_state(w, st);
  ncfsm_loop *loop = w->comm->loop;
  w->next = NULL;
  if (loop->notify_tail) loop->notify_tail->next = w;
  else loop->notify_head = w;
  loop->notify_tail = w;
}

/* ---- batches ---------------------------------------------------------------- */

void ncfsm__batch_append(ncfsm_loop *loop, ncfsm__batch *b) {
  b->next = NULL;
  if (loop->bq_tail) loop->bq_tail->next = b;
  else loop->bq_head = b;
  loop->bq_tail = b;
}

static void batch_unlink(ncfsm_loop *loop, ncfsm__batch *prev, ncfsm__batch *b) {
  if (prev) prev->next = b->next;
  else loop->bq_head = b->next;
  if (loop->bq_tail == b) loop->bq_tail = prev;
  b->next = NULL;
}

/* Remove c's works from queued batches (dropping emptied batches) and from
 * the open group, calling fn on each. */
void ncfsm__comm_drop_queued(ncfsm_comm *c, ncfsm_work_state_t st, ncfsm_result_t status) {
  ncfsm_loop *loop = c->loop;
  ncfsm__batch *prev = NULL, *b = loop->bq_head;
  while (b) {
    ncfsm__batch *bn = b->next;
    ncfsm_work **pp = &b->head, *last = NULL;
    while (*pp) {
      ncfsm_work *w = *pp;
      if (w->comm == c) {
        *pp = w->bnext;
        b->nworks--;
        c->npending--;
        w->batch = NULL;
        w->bnext = NULL;
        ncfsm__work_finish(w, st, status);
      } else {
        last = w;
        pp = &w->bnext;
      }
    }
    b->tail = last;
    if (!b->head) {
      batch_unlink(loop, prev, b);
      if (b->explicit_group) free(b);
    } else {
      prev = b;
    }
    b = bn;
  }
  ncfsm_work **pp = &loop->group_head;
  loop->group_tail = NULL;
  while (*pp) {
    ncfsm_work *w = *pp;
    if (w->comm == c) {
      *pp = w->bnext;
      w->bnext = NULL;
      ncfsm__work_finish(w, st, status);
    } else {
      loop->group_tail = w;
      pp = &w->bnext;
    }
  }
  c->enlisted = false;
}

/* Fail every work of c that is not final yet. */
static void fail_all(ncfsm_comm *c, ncfsm_work_state_t st, ncfsm_result_t status) {
  ncfsm__comm_drop_queued(c, st, status);
  while (c->launching) {
    ncfsm_work *w = c->launching;
    c->launching = w->next;
    ncfsm__work_finish(w, st, status);
  }
  for (int i = 0; i < c->nsq; i++) {
    while (c->sq[i].head) {
      ncfsm_work *w = c->sq[i].head;
      c->sq[i].head = w->next;
      ncfsm__work_finish(w, st, status);
    }
    c->sq[i].tail = NULL;
  }
}

/* act_fail_pending (R10): the comm's outputs are untrusted; every pending
 * work fails with the cause; the error policy decides what follows. */
void ncfsm__comm_fail(ncfsm_comm *c, ncfsm_event_t ev, ncfsm_result_t cause, int code,
                      const char *what) {
  ncfsm_state_t from = c->state;
  if (ncfsm_transition(from, ev, NULL, NULL) == NCFSM_STATE_COUNT) return; /* already failed/closed */
  c->async_code = code;
  c->cause = cause;
  const char *txt = c->be->last_error ? c->be->last_error(c->bcomm) : NULL;
  ncfsm__set_error(c, "%s in state %s: %s (backend %s%s%s); outputs of unfinished works are "
                      "untrusted; abort the communicator (R10)",
                   what, ncfsm_state_name(from), ncfsm_err_name(cause),
                   ncfsm__nccl_result_name(code), txt && *txt ? ": " : "", txt ? txt : "");
  NCFSM_WARN(NCFSM__SUB_FSM, "%s", c->last_error);
  ncfsm__fire(c, ev, cause);
  c->busy = false;
  fail_all(c, ev == NCFSM_EV_TIMEOUT ? NCFSM_WORK_TIMED_OUT : NCFSM_WORK_FAILED, cause);
  if (c->opts.on_error == NCFSM_ON_ERROR_ABORT) {
    c->abort_pending = true;
    c->loop->ctl = true;
  }
  else if (c->opts.on_error == NCFSM_ON_ERROR_EXIT) {
    fprintf(stderr, "ncfsm: %s; exiting (on_error=exit)\n", c->last_error);
    exit(3);
  }
}

/* act_abort (R5): works not final are ABORTED; the comm closes. */
void ncfsm__comm_do_abort(ncfsm_comm *c) {
  if (c->bcomm) {
    c->be_calls++;
    int rc = c->be->abort(c->bcomm);
    if (rc != NCFSM__NCCL_SUCCESS)
      NCFSM_WARN(NCFSM__SUB_FSM, "[%s] ncclCommAbort returned %s", c->name, ncfsm__nccl_result_name(rc));
    c->bcomm = NULL;
  }
  c->abort_pending = false;
  c->busy = false;
  fail_all(c, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED);
  ncfsm__fire(c, NCFSM_EV_ABORT, NCFSM_OK);
}

/* ---- launching ---------------------------------------------------------------- */

static ncfsm__mark *mark_get(ncfsm_comm *c) {
  ncfsm__mark *m = c->free_marks;
  if (m) {
    c->free_marks = m->next_free;
  } else {
    m = calloc(1, sizeof *m);
    if (!m) return NULL;
    int rc = c->be->event_create_flags ? c->be->event_create_flags(c->opts.device, c->opts.timing, &m->event)
                                       : c->be->event_create(c->opts.device, &m->event);
    if (rc != 0) {
      free(m);
      return NULL;
    }
  }
  m->refs = 0;
  m->ready_at_final = -1;
  m->next_free = NULL;
  return m;
}

static ncfsm__squeue *squeue_for(ncfsm_comm *c, void *stream) {
  for (int i = 0; i < c->nsq; i++)
    if (c->sq[i].stream == stream) return &c->sq[i];
  if (c->nsq == c->capsq) {
    int cap = c->capsq ? 2 * c->capsq : 4;
    ncfsm__squeue *n = realloc(c->sq, (size_t)cap * sizeof *n);
    if (!n) return NULL;
    c->sq = n;
    c->capsq = cap;
  }
  c->sq[c->nsq] = (ncfsm__squeue){stream, NULL, NULL};
  return &c->sq[c->nsq++];
}

/* act_record_events (R2): the launch is final, so the kernels are on their
 * streams; only now is a completion event recorded after them. One event
 * per (launch, stream) is shared by the works of that launch. */
static void launch_final(ncfsm_comm *c) {
  uint64_t now = ncfsm__now_ns();
  struct { void *stream; ncfsm__mark *mark; } ms[8];
  int nms = 0;
  ncfsm_work *w = c->launching;
  c->launching = NULL;
  c->busy = false;
  while (w) {
    ncfsm_work *next = w->next;
    ncfsm__mark *m = NULL;
    for (int i = 0; i < nms; i++)
      if (ms[i].stream == w->op.stream) m = ms[i].mark;
    if (!m) {
      if (nms == 8) { /* flush: record the marks taken so far */
        for (int i = 0; i < nms; i++) c->be->event_record(ms[i].mark->event, ms[i].stream);
        nms = 0;
      }
      m = mark_get(c);
      if (!m) {
        ncfsm__work_finish(w, NCFSM_WORK_FAILED, NCFSM_ERR_NO_MEMORY);
        w = next;
        continue;
      }
      ms[nms].stream = w->op.stream;
      ms[nms].mark = m;
      nms++;
    }
    m->refs++;
    w->mark = m;
    w->t_final = now;
    w->next = NULL;
    ncfsm__squeue *q = squeue_for(c, w->op.stream);
    if (!q) {
      ncfsm__work_finish(w, NCFSM_WORK_FAILED, NCFSM_ERR_NO_MEMORY);
      w = next;
      continue;
    }
    if (q->tail) q->tail->next = w;
    else q->head = w;
    q->tail = w;
    ncfsm__work_set_state(w, NCFSM_WORK_IN_FLIGHT);
    w = next;
  }
  for (int i = 0; i < nms; i++) {
    int rc = c->be->event_record(ms[i].mark->event, ms[i].stream);
    if (rc != 0)
      NCFSM_WARN(NCFSM__SUB_FSM, "[%s] event record failed (%d)", c->name, rc);
    else if (c->opts.timing) /* the seed's question: is the work done right after the launch? */
      ms[i].mark->ready_at_final = c->be->event_query(ms[i].mark->event) == 0;
  }
  if (c->state == NCFSM_STATE_READY || c->state == NCFSM_STATE_LAUNCH_IN_PROGRESS)
    ncfsm__fire(c, NCFSM_EV_LAUNCH_FINAL, NCFSM_OK);
  if (c->state == NCFSM_STATE_READY && c->enlisted) ncfsm__fire(c, NCFSM_EV_ENLIST, NCFSM_OK);
}

/* After a group end that included c's ops (or init): decide the next state. */
static void after_launch(ncfsm_comm *c, int rc, const char *what) {
  int st = NCFSM__NCCL_SUCCESS;
  if (IS_ERR(rc)) {
    if (c->bcomm) c->be->get_async_error(c->bcomm, &st);
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, IS_ERR(st) ? st : rc, what);
    return;
  }
  if (!c->opts.blocking && c->bcomm) {
    int qrc = c->be->get_async_error(c->bcomm, &st);
    if (qrc != NCFSM__NCCL_SUCCESS) st = qrc;
  }
  if (IS_ERR(st)) {
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, st, what);
  } else if (st == NCFSM__NCCL_IN_PROGRESS) {
    c->busy = true;
    if (c->state == NCFSM_STATE_READY) ncfsm__fire(c, NCFSM_EV_LAUNCH_PENDING, NCFSM_OK);
  } else {
    launch_final(c);
  }
}

static bool launchable(const ncfsm_comm *c) {
  return !c->busy && c->bcomm &&
         (c->state == NCFSM_STATE_READY ||
          (c->state == NCFSM_STATE_FINALIZING && !c->fin_issued));
}

/*
 * The launcher's R12 check: the buffer ranges already taken in this launch,
 * sorted by (comm, lo). Taken writes never overlap anything else taken for
 * their comm (each work was checked before it went in), so a new range can
 * only hit the write just before it in order; reads may overlap each other,
 * so they carry the running maximum of hi within their comm. A query is a
 * binary search, an insert a memmove of at most 2 * coalesce_max entries.
 */
typedef struct {
  uintptr_t comm, lo, hi, maxhi;
} ncfsm__range;

static void range_insert(ncfsm__range *a, int *n, uintptr_t comm, uintptr_t lo, uintptr_t hi);

struct ncfsm__spanset {
  ncfsm__range *w, *r;
  int nw, nr, cap;
  /* The first batch of a launch is only inserted when a second one is
   * examined: a launch of one batch (the latency path) costs nothing here. */
  const ncfsm_work *lazy_head, *lazy_tail;
};

static void spanset_insert_work(ncfsm__spanset *ss, const ncfsm_work *w) {
  for (int i = 0; i < w->nspan; i++) {
    if (w->span[i].write) range_insert(ss->w, &ss->nw, (uintptr_t)w->comm, w->span[i].lo, w->span[i].hi);
    else range_insert(ss->r, &ss->nr, (uintptr_t)w->comm, w->span[i].lo, w->span[i].hi);
  }
}

static int range_lower_bound(const ncfsm__range *a, int n, uintptr_t comm, uintptr_t lo) {
  int l = 0, h = n;
  while (l < h) {
    int m = (l + h) / 2;
    if (a[m].comm < comm || (a[m].comm == comm && a[m].lo < lo)) l = m + 1;
    else h = m;
  }
  return l;
}

/* Does [lo, hi) of comm overlap a range of a? (a: writes, or reads with maxhi) */
static bool range_hit(const ncfsm__range *a, int n, uintptr_t comm, uintptr_t lo, uintptr_t hi) {
  int i = range_lower_bound(a, n, comm, hi) - 1;
  return i >= 0 && a[i].comm == comm && a[i].maxhi > lo;
}

static void range_insert(ncfsm__range *a, int *n, uintptr_t comm, uintptr_t lo, uintptr_t hi) {
  int i = range_lower_bound(a, *n, comm, lo);
  memmove(a + i + 1, a + i, (size_t)(*n - i) * sizeof *a);
  a[i] = (ncfsm__range){comm, lo, hi, hi};
  (*n)++;
  for (int j = i; j < *n && a[j].comm == comm; j++) {
    uintptr_t prev = j > 0 && a[j - 1].comm == comm ? a[j - 1].maxhi : 0;
    a[j].maxhi = a[j].hi > prev ? a[j].hi : prev;
  }
}

/* Would batch b overlap (R12) what this launch already took? If not, its
 * ranges are taken. */
static bool spanset_take(ncfsm__spanset *ss, const ncfsm__batch *b) {
  if (!ss->lazy_head && ss->nw + ss->nr == 0) {
    ss->lazy_head = b->head;
    ss->lazy_tail = b->tail;
    return false;
  }
  if (ss->lazy_head && ss->lazy_head == ss->lazy_tail && b->nworks == 1) {
    /* two single ops: compare directly, insert only if they go together */
    const ncfsm_work *x = ss->lazy_head, *y = b->head;
    if (x->comm == y->comm)
      for (int i = 0; i < x->nspan; i++)
        for (int j = 0; j < y->nspan; j++)
          if ((x->span[i].write || y->span[j].write) && x->span[i].lo < y->span[j].hi &&
              y->span[j].lo < x->span[i].hi)
            return true;
  }
  if (ss->lazy_head) {
    for (const ncfsm_work *w = ss->lazy_head;; w = w->bnext) {
      spanset_insert_work(ss, w);
      if (w == ss->lazy_tail) break;
    }
    ss->lazy_head = ss->lazy_tail = NULL;
  }
  for (const ncfsm_work *w = b->head; w; w = w->bnext)
    for (int i = 0; i < w->nspan; i++) {
      uintptr_t cm = (uintptr_t)w->comm;
      if (range_hit(ss->w, ss->nw, cm, w->span[i].lo, w->span[i].hi)) return true;
      if (w->span[i].write && range_hit(ss->r, ss->nr, cm, w->span[i].lo, w->span[i].hi)) return true;
    }
  if (ss->nw + ss->nr + 2 * b->nworks > ss->cap) return true; /* full: next launch */
  for (const ncfsm_work *w = b->head; w; w = w->bnext) spanset_insert_work(ss, w);
  return false;
}

ncfsm__spanset *ncfsm__spanset_new(unsigned max_ops) {
  ncfsm__spanset *ss = calloc(1, sizeof *ss);
  if (!ss) return NULL;
  ss->cap = 2 * (int)max_ops + 2;
  ss->w = calloc((size_t)ss->cap, sizeof *ss->w);
  ss->r = calloc((size_t)ss->cap, sizeof *ss->r);
  if (!ss->w || !ss->r) {
    ncfsm__spanset_free(ss);
    return NULL;
  }
  return ss;
}

void ncfsm__spanset_free(ncfsm__spanset *ss) {
  if (!ss) return;
  free(ss->w);
  free(ss->r);
  free(ss);
}

static void issue_inits(ncfsm_loop *loop) {
  /* All inits of a turn in one group, however many ranks (a blocking clique
   * driven by one thread needs every rank's init in one group). */
  ncfsm_comm *stack_inits[16], **inits = stack_inits;
  int stack_rcs[16], *rcs = stack_rcs;
  if (loop->ncomms > 16) {
    inits = malloc((size_t)loop->ncomms * sizeof *inits);
    rcs = malloc((size_t)loop->ncomms * sizeof *rcs);
    if (!inits || !rcs) { /* try again next turn */
      free(inits == stack_inits ? NULL : inits);
      free(rcs == stack_rcs ? NULL : rcs);
      loop->ctl = true;
      return;
    }
  }
  int n = 0;
  for (ncfsm_comm *c = loop->comms; c; c = c->next) {
    if (c->state != NCFSM_STATE_INIT_IN_PROGRESS || c->init_issued) continue;
    if (c->uid_req) { /* the unique id comes through the bootstrap */
      ncfsm_result_t r = ncfsm_boot_test(c->uid_req);
      if (r == NCFSM_ERR_AGAIN) {
        loop->ctl = true;
        continue;
      }
      ncfsm_boot_req_free(c->uid_req);
      c->uid_req = NULL;
      if (r != NCFSM_OK) {
        free(c->uid_buf);
        c->uid_buf = NULL;
        ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, NCFSM__NCCL_SUCCESS,
                         "unique id exchange through the bootstrap");
        continue;
      }
      memcpy(&c->uid, c->uid_buf, sizeof c->uid); /* rank 0's id */
      free(c->uid_buf);
      c->uid_buf = NULL;
    }
    inits[n++] = c;
  }
  if (!n) goto out;
  /* One group: one thread may drive several ranks (R3), as ncclCommInitAll
   * does; a group holds one backend and one blocking mode, the others wait
   * for the next turn. */
  const ncfsm__backend *be = inits[0]->be;
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (inits[i]->be == be && inits[i]->opts.blocking == inits[0]->opts.blocking) inits[m++] = inits[i];
    else loop->ctl = true;
  }
  n = m;
  bool grouped = n > 1;
  if (grouped) be->group_start();
  for (int i = 0; i < n; i++) {
    ncfsm_comm *c = inits[i];
    ncfsm__comm_config cfg = {c->opts.blocking, c->opts.device, &c->sim, c->name};
    c->init_issued = true;
    c->be_calls++;
    rcs[i] = c->be->comm_init(&c->bcomm, c->nranks, &c->uid, c->rank, &cfg);
  }
  int grc = grouped ? be->group_end() : NCFSM__NCCL_SUCCESS;
  for (int i = 0; i < n; i++) {
    ncfsm_comm *c = inits[i];
    int rc = IS_ERR(rcs[i]) ? rcs[i] : IS_ERR(grc) ? grc : rcs[i];
    if (IS_ERR(rc) || !c->bcomm) {
      ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, IS_ERR(rc) ? rc : NCFSM__NCCL_INTERNAL_ERROR,
                       "ncclCommInitRankConfig");
      continue;
    }
    int st = NCFSM__NCCL_SUCCESS;
    if (!c->opts.blocking) c->be->get_async_error(c->bcomm, &st);
    if (IS_ERR(st)) {
      ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, st, "init");
    } else if (st == NCFSM__NCCL_SUCCESS) {
      ncfsm__fire(c, NCFSM_EV_INIT_DONE, NCFSM_OK);
      if (c->enlisted) ncfsm__fire(c, NCFSM_EV_ENLIST, NCFSM_OK); /* ops wait in an open group */
    }
  }
out:
  if (inits != stack_inits) free(inits);
  if (rcs != stack_rcs) free(rcs);
}

static void issue_finalize(ncfsm_comm *c) {
  c->be_calls++;
  int rc = c->be->finalize(c->bcomm);
  c->fin_issued = true;
  if (IS_ERR(rc)) {
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, rc, "ncclCommFinalize");
    return;
  }
  int st = NCFSM__NCCL_SUCCESS;
  if (!c->opts.blocking) c->be->get_async_error(c->bcomm, &st);
  if (IS_ERR(st)) ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, st, "finalize");
  else if (st == NCFSM__NCCL_SUCCESS) ncfsm__fire(c, NCFSM_EV_FINALIZE_DONE, NCFSM_OK);
}

static void issue_aborts(ncfsm_loop *loop) {
  int n = 0;
  for (ncfsm_comm *c = loop->comms; c; c = c->next) n += c->abort_pending;
  if (!n) return;
  /* R5: several comms are aborted inside one group, never one by one. */
  const ncfsm__backend *be = NULL;
  bool one_backend = true;
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    if (c->abort_pending) {
      if (be && be != c->be) one_backend = false;
      be = c->be;
    }
  bool grouped = n > 1 && one_backend;
  if (grouped) be->group_start();
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    if (c->abort_pending) ncfsm__comm_do_abort(c);
  if (grouped) be->group_end();
}

bool ncfsm__launch(ncfsm_loop *loop) {
  /* Control work (aborts, inits, finalizes) is rare: scan for it only when
   * something asked for it (loop->ctl), and keep asking while a comm waits. */
  bool ctl = loop->ctl;
  loop->ctl = false;
  if (ctl) {
    issue_aborts(loop);
    issue_inits(loop);
  }

  /* Take launchable batches in FIFO order; a comm whose batch cannot go
   * blocks its later batches (per-comm order is kept). */
  ncfsm_comm *blocked[64];
  int nblocked = 0;
  ncfsm_work *taken = NULL, *taken_tail = NULL;
  unsigned ntaken = 0;
  int ncomms = loop->ncomms;
  loop->spans->nw = loop->spans->nr = 0;
  loop->spans->lazy_head = loop->spans->lazy_tail = NULL;
  ncfsm__batch *prev = NULL, *b = loop->bq_head;
  while (b && ntaken < loop->opts.coalesce_max) {
    ncfsm__batch *bn = b->next;
    bool ok = true;
    for (ncfsm_work *w = b->head; w && ok; w = w->bnext) {
      /* One NCCL group holds comms of one backend and one blocking mode
       * (NCCL would run a mixed group as nonblocking and leave the blocking
       * comms in progress). */
      if (!launchable(w->comm) ||
          (taken && (w->comm->be != taken->comm->be || w->comm->opts.blocking != taken->comm->opts.blocking)))
        ok = false;
      for (int i = 0; i < nblocked && ok; i++)
        if (blocked[i] == w->comm) ok = false;
    }
    if (ok && ntaken && ntaken + (unsigned)b->nworks > loop->opts.coalesce_max) ok = false;
    if (ok && spanset_take(loop->spans, b)) ok = false; /* R12: split at a dependency */
    if (!ok) {
      for (ncfsm_work *w = b->head; w; w = w->bnext) {
        int i;
        for (i = 0; i < nblocked; i++)
          if (blocked[i] == w->comm) break;
        if (i == nblocked && nblocked < 64) blocked[nblocked++] = w->comm;
      }
      if (nblocked == 64 || nblocked >= ncomms) break; /* nothing more can go this turn */
      prev = b;
      b = bn;
      continue;
    }
    batch_unlink(loop, prev, b);
    if (taken_tail) taken_tail->bnext = b->head;
    else taken = b->head;
    taken_tail = b->tail;
    ntaken += (unsigned)b->nworks;
    for (ncfsm_work *w = b->head; w; w = w->bnext) w->batch = NULL;
    if (b->explicit_group) free(b);
    b = bn;
  }

  if (taken) {
    const ncfsm__backend *be = taken->comm->be;
    uint64_t now = ncfsm__now_ns();
    /* The comms of this launch: at most one per taken work, and at most all
     * comms of the loop (one explicit group may span more than 64). */
    ncfsm_comm *stack_touched[64], **touched = stack_touched;
    int stack_rc[64], *op_rc = stack_rc;
    int ntouched = 0;
    if (loop->ncomms > 64) {
      touched = malloc((size_t)loop->ncomms * sizeof *touched);
      op_rc = malloc((size_t)loop->ncomms * sizeof *op_rc);
      if (!touched || !op_rc) {
        if (touched != stack_touched) free(touched);
        if (op_rc != stack_rc) free(op_rc);
        for (ncfsm_work *w = taken, *next; w; w = next) { /* nothing reached NCCL */
          next = w->bnext;
          w->bnext = NULL;
          w->comm->npending--;
          ncfsm__work_finish(w, NCFSM_WORK_FAILED, NCFSM_ERR_NO_MEMORY);
        }
        return false;
      }
    }
    /* opts.timing: one start event per (comm, stream), recorded before the
     * NCCL calls (always legal, R2 only forbids work after an InProgress end). */
    struct { ncfsm_comm *c; void *stream; ncfsm__mark *m; } starts[16];
    int nstarts = 0;
    for (ncfsm_work *w = taken; w; w = w->bnext) {
      if (!w->comm->opts.timing) continue;
      int i;
      for (i = 0; i < nstarts; i++)
        if (starts[i].c == w->comm && starts[i].stream == w->op.stream) break;
      if (i == nstarts) {
        if (nstarts == 16) continue;
        ncfsm__mark *m = mark_get(w->comm);
        if (!m) continue;
        if (w->comm->be->event_record(m->event, w->op.stream) != 0) {
          mark_put(w->comm, m);
          continue;
        }
        /* One query now: a model backend (the sim) timestamps events when it
         * first sees them complete; CUDA ignores it. */
        w->comm->be->event_query(m->event);
        starts[nstarts++] = (typeof(starts[0])){w->comm, w->op.stream, m};
      }
      starts[i].m->refs++;
      w->start_mark = starts[i].m;
    }
    be->group_start();
    for (ncfsm_work *w = taken, *next; w; w = next) {
      next = w->bnext;
      w->bnext = NULL;
      ncfsm_comm *c = w->comm;
      int i;
      for (i = 0; i < ntouched; i++)
        if (touched[i] == c) break;
      if (i == ntouched) {
        touched[ntouched] = c;
        op_rc[ntouched++] = NCFSM__NCCL_SUCCESS;
      }
      c->npending--;
      w->t_launch = now;
      w->deadline_ns = ncfsm__deadline(now, c->opts.timeout_ms);
      c->be_calls++;
      int rc = be->op(c->bcomm, &w->op);
      if (IS_ERR(rc) && !IS_ERR(op_rc[i])) op_rc[i] = rc;
      ncfsm__work_set_state(w, NCFSM_WORK_LAUNCHING);
      /* launching list keeps submission order */
      w->next = NULL;
      if (!c->launching) c->launching = w;
      else c->launching_tail->next = w;
      c->launching_tail = w;
    }
    int grc = be->group_end();
    for (int i = 0; i < ntouched; i++)
      after_launch(touched[i], IS_ERR(op_rc[i]) ? op_rc[i] : grc, "launch");
    if (touched != stack_touched) free(touched);
    if (op_rc != stack_rc) free(op_rc);
    loop->poll_iter = 0; /* progress: restart the burst of immediate polls */
  }

  if (ctl)
    for (ncfsm_comm *c = loop->comms; c; c = c->next) {
      if (c->state != NCFSM_STATE_FINALIZING || c->fin_issued || !c->bcomm) continue;
      if (!c->busy && c->npending == 0 && !c->enlisted) issue_finalize(c);
      else loop->ctl = true; /* queued ops launch first; look again next turn */
    }
  return taken != NULL;
}

/* ---- progress --------------------------------------------------------------------- */

/* While a comm only has works in flight (no phase in progress), its async
 * state is watched (R10) at most every ASYNC_WATCH_NS: completion is seen
 * through the events, and a poll of ncclCommGetAsyncError (which joins NCCL's
 * helper thread, R9) on every tick would slow that down. */
#define ASYNC_WATCH_NS 50000ull

static bool needs_poll(ncfsm_comm *c, uint64_t *now) {
  if (!c->bcomm) return false;
  switch (c->state) {
    case NCFSM_STATE_INIT_IN_PROGRESS: return c->init_issued;
    case NCFSM_STATE_LAUNCH_IN_PROGRESS:
    case NCFSM_STATE_REVOKING: return true;
    case NCFSM_STATE_FINALIZING: return true;
    case NCFSM_STATE_READY:
    case NCFSM_STATE_GROUP_OPEN:
    case NCFSM_STATE_FINALIZED:
      for (int i = 0; i < c->nsq; i++)
        if (c->sq[i].head) { /* R10: watch the async state too */
          if (!*now) *now = ncfsm__now_ns();
          if (*now - c->async_watch_ns < ASYNC_WATCH_NS) return false;
          c->async_watch_ns = *now;
          return true;
        }
      return false;
    default: return false;
  }
}

static bool poll_comm(ncfsm_comm *c) {
  int st = NCFSM__NCCL_SUCCESS;
  int rc = c->be->get_async_error(c->bcomm, &st);
  if (rc != NCFSM__NCCL_SUCCESS) st = rc;
  if (IS_ERR(st)) {
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_ASYNC, st, "ncclCommGetAsyncError");
    return true;
  }
  if (st == NCFSM__NCCL_IN_PROGRESS) return false;
  switch (c->state) {
    case NCFSM_STATE_INIT_IN_PROGRESS:
      ncfsm__fire(c, NCFSM_EV_INIT_DONE, NCFSM_OK);
      if (c->enlisted) ncfsm__fire(c, NCFSM_EV_ENLIST, NCFSM_OK);
      return true;
    case NCFSM_STATE_LAUNCH_IN_PROGRESS:
      launch_final(c);
      return true;
    case NCFSM_STATE_FINALIZING:
      if (c->busy) { launch_final(c); return true; }
      if (c->fin_issued) { ncfsm__fire(c, NCFSM_EV_FINALIZE_DONE, NCFSM_OK); return true; }
      return false;
    case NCFSM_STATE_REVOKING:
      fail_all(c, NCFSM_WORK_ABORTED, NCFSM_ERR_ABORTED); /* R6: in-flight work was stopped */
      ncfsm__fire(c, NCFSM_EV_REVOKE_DONE, NCFSM_OK);
      return true;
    default:
      return false;
  }
}

static bool drain_streams(ncfsm_comm *c) {
  bool progress = false;
  for (int i = 0; i < c->nsq; i++) {
    ncfsm__squeue *q = &c->sq[i];
    while (q->head) {
      ncfsm__mark *m = q->head->mark;
      int rc = c->be->event_query(m->event);
      if (rc == 1) break;
      if (rc != 0) {
        ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, NCFSM__NCCL_UNHANDLED_CUDA_ERROR,
                         "cudaEventQuery");
        return true;
      }
      while (q->head && q->head->mark == m) {
        ncfsm_work *w = q->head;
        q->head = w->next;
        if (w->start_mark && c->be->event_elapsed_ms(w->start_mark->event, m->event, &w->device_ms) != 0)
          w->device_ms = -1;
        ncfsm__work_finish(w, NCFSM_WORK_COMPLETED, NCFSM_OK);
      }
      if (!q->head) q->tail = NULL;
      progress = true;
    }
  }
  return progress;
}

static void watchdog(ncfsm_comm *c, uint64_t now) {
  if (!c->opts.timeout_ms) return;
  bool phase = c->state == NCFSM_STATE_INIT_IN_PROGRESS || c->state == NCFSM_STATE_LAUNCH_IN_PROGRESS ||
               c->state == NCFSM_STATE_FINALIZING || c->state == NCFSM_STATE_REVOKING;
  if (phase && c->phase_deadline && now > c->phase_deadline) {
    ncfsm__comm_fail(c, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, NCFSM__NCCL_IN_PROGRESS,
                     "watchdog: phase did not end within timeout");
    return;
  }
  for (int i = 0; i < c->nsq; i++) {
    ncfsm_work *w = c->sq[i].head;
    if (w && w->deadline_ns && now > w->deadline_ns) {
      char what[160];
      snprintf(what, sizeof what, "watchdog: %s seq %llu did not complete within %llu ms",
               ncfsm_opkind_name(w->op.kind), (unsigned long long)w->fp.seq,
               (unsigned long long)c->opts.timeout_ms);
      ncfsm__comm_fail(c, NCFSM_EV_TIMEOUT, NCFSM_ERR_TIMEOUT, NCFSM__NCCL_SUCCESS, what);
      return;
    }
  }
}

void ncfsm__progress(ncfsm_loop *loop) {
  bool progress = false;
  uint64_t now = 0;
  for (ncfsm_comm *c = loop->comms; c; c = c->next) {
    if (c->nsq) progress |= drain_streams(c); /* first: a drained comm needs no async watch */
    if (needs_poll(c, &now)) progress |= poll_comm(c);
    if (c->opts.timeout_ms) {
      if (!now) now = ncfsm__now_ns();
      watchdog(c, now);
    }
  }
  if (ncfsm__loop_poll_pending(loop)) ncfsm__loop_arm_poll(loop, progress);
}

/* ---- R12 overlap detection ---------------------------------------------------------- */

/* Bytes each buffer of an op touches on this rank. */
void ncfsm__work_spans(ncfsm_work *w) {
  const ncfsm__op *o = &w->op;
  size_t es = ncfsm_dtype_size(o->dtype), nr = (size_t)w->comm->nranks;
  size_t in = o->count * es, out = o->count * es;
  bool is_root = w->comm->rank == o->root;
  switch (o->kind) {
    case NCFSM_KIND_ALLGATHER: out *= nr; break;
    case NCFSM_KIND_REDUCESCATTER: in *= nr; break;
    case NCFSM_KIND_ALLTOALL: in *= nr; out *= nr; break;
    case NCFSM_KIND_GATHER: out = is_root ? out * nr : 0; break;
    case NCFSM_KIND_SCATTER: in = is_root ? in * nr : 0; break;
    case NCFSM_KIND_REDUCE: out = is_root ? out : 0; break;
    case NCFSM_KIND_BROADCAST: in = is_root ? in : 0; break;
    case NCFSM_KIND_SEND: out = 0; break;
    case NCFSM_KIND_RECV: in = 0; break;
    default: break;
  }
  w->nspan = 0;
  if (in && o->send) w->span[w->nspan++] = (ncfsm__span){(uintptr_t)o->send, (uintptr_t)o->send + in, false};
  if (out && o->recv) w->span[w->nspan++] = (ncfsm__span){(uintptr_t)o->recv, (uintptr_t)o->recv + out, true};
}

typedef struct {
  ncfsm__span s;
  ncfsm_work *w;
} span;

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->s.lo < y->s.lo ? -1 : x->s.lo > y->s.lo;
}

bool ncfsm__find_overlap(ncfsm_work *list, ncfsm_work **x, ncfsm_work **y) {
  int n = 0;
  for (ncfsm_work *w = list; w; w = w->bnext) n += 2;
  if (n <= 2) return false;
  span stack[64], *s = n <= 64 ? stack : malloc((size_t)n * sizeof *s);
  if (!s) return false;
  int k = 0;
  for (ncfsm_work *w = list; w; w = w->bnext)
    for (int i = 0; i < w->nspan; i++) s[k++] = (span){w->span[i], w};
  qsort(s, (size_t)k, sizeof *s, span_cmp);
  bool hit = false;
  /* Sweep: compare each span with the later ones that start before it ends. */
  for (int i = 0; i < k && !hit; i++)
    for (int j = i + 1; j < k && s[j].s.lo < s[i].s.hi; j++)
      if (s[i].w != s[j].w && s[i].w->comm == s[j].w->comm && (s[i].s.write || s[j].s.write)) {
        *x = s[i].w;
        *y = s[j].w;
        hit = true;
        break;
      }
  if (s != stack) free(s);
  return hit;
}

uint64_t ncfsm__comm_backend_calls(ncfsm_comm *c) {
  pthread_mutex_lock(&c->loop->mu);
  uint64_t n = c->be_calls;
  pthread_mutex_unlock(&c->loop->mu);
  return n;
}
