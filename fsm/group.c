/* The loop's group machine (fsm/group.def) bound to the engine: groups are
 * loop-wide, nestable and owned by the thread that opened the outermost one
 * (R3). Its outermost end turns the group's ops into one batch queued in
 * every comm they touch, or fails them all before the backend. And the
 * thread's machine (fsm/held.def): a group its thread holds back from the
 * loop until it holds more than one op or the thread does anything else
 * there, so that a group of one op costs less. */
#include <stdio.h>
#include <stdlib.h>

#include "fsm/engine.h"
#include "fsm/submit.h"

typedef struct gev {
  ncfsm_loop *loop;
  const char *fn;        /* the public call, for messages */
  ncfsm_result_t err;    /* CALL_FAILED: the failed call's result */
  const char *msg;       /* ... and its message */
  ncfsm_result_t result; /* out: what the call returns */
} gev;

static bool mixed_blocking(const ncfsm_work *works) {
  for (const ncfsm_work *w = works ? works->bnext : NULL; w; w = w->bnext)
    if (w->comm->opts.blocking != works->comm->opts.blocking || w->comm->be != works->comm->be) return true;
  return false;
}

static void describe_op(const ncfsm_work *w, char *buf, size_t len) {
  snprintf(buf, len, "%s(rank %d, send %p, recv %p, count %zu)", ncfsm_opkind_name(w->op.kind), w->comm->rank,
           w->op.send, (void *)w->op.recv, w->op.count);
}

static bool group_guard(const void *obj, unsigned g, const void *payload) {
  const ncfsm_loop *loop = obj;
  (void)payload;
  ncfsm_work *x, *y;
  switch (g) {
    case NCFSM__GG_ANY: return true;
    case NCFSM__GG_OTHER_THREAD: return !pthread_equal(loop->group_owner, pthread_self());
    case NCFSM__GG_NESTED: return loop->group_depth > 1;
    case NCFSM__GG_HELD_ELSEWHERE: return ncfsm__held_any(loop) && ncfsm__held_loop != loop;
    case NCFSM__GG_MIXED: return mixed_blocking(loop->group_head);
    case NCFSM__GG_OVERLAP:
      return loop->opts.overlap == NCFSM_OVERLAP_REJECT && ncfsm__find_overlap(loop->group_head, &x, &y);
    case NCFSM__GG_COUNT: break;
  }
  return false;
}

/* c's ops leave the group it is in (GROUP_CLOSE, with cause as its result). */
static void leave_group(ncfsm_comm *c, ncfsm_result_t cause) {
  c->ngroup = 0;
  ncfsm__cev p = {.cause = cause, .from = c->state};
  ncfsm__comm_fire(c, NCFSM_EV_GROUP_CLOSE, &p);
}

/* The outermost end: each comm of the group's ops leaves the group
 * (GROUP_CLOSE, with err as its result); with batch, the works join it, else
 * they fail with fail_status. The group is empty afterwards. */
static void close_group(ncfsm_loop *loop, ncfsm__batch *batch, ncfsm_result_t err, ncfsm_result_t fail_status) {
  ncfsm_work *works = loop->group_head;
  loop->group_head = loop->group_tail = NULL;
  loop->group_depth = 0;
  loop->group_err = NCFSM_OK;
  for (ncfsm_work *w = works, *next; w; w = next) {
    next = w->bnext;
    w->bnext = NULL;
    ncfsm_comm *c = w->comm;
    if (c->ngroup) { /* the first of c's works: c's ops leave the group */
      if (batch) batch->links[batch->nlinks++].c = c;
      leave_group(c, err);
    }
    if (!batch) {
      ncfsm__work_end(w, NCFSM_WORK_FAILED, fail_status);
      continue;
    }
    w->batch = batch;
    if (batch->tail) batch->tail->bnext = w;
    else batch->head = w;
    batch->tail = w;
    batch->nworks++;
  }
  if (batch) ncfsm__batch_queue(loop, batch);
  if (works) ncfsm__loop_wake(loop);
}

#define ACT(name) static void gact_##name(void *obj, void *payload)
#define GROUP ncfsm_loop *loop = obj; gev *p = payload; (void)loop; (void)p

ACT(open) {
  GROUP;
  loop->group_owner = pthread_self();
  loop->group_depth = 1;
  loop->group_err = NCFSM_OK;
}
ACT(nest) {
  GROUP;
  loop->group_depth++;
}
ACT(unnest) {
  GROUP;
  loop->group_depth--;
}
ACT(refuse_not_open) {
  GROUP;
  p->result = NCFSM_ERR_INVALID_USAGE;
  ncfsm__loop_error(loop, "%s: not in a group (R3: ncclGroupEnd at depth 0 returns ncclInvalidUsage); balance every "
                          "ncfsm_group_start with one ncfsm_group_end", p->fn);
}
ACT(refuse_thread) {
  GROUP;
  p->result = NCFSM_ERR_WRONG_THREAD;
  bool held = loop->group_state == NCFSM__GS_NONE; /* refused in NONE: guard HELD_ELSEWHERE */
  ncfsm__loop_error(loop, "%s: %s", p->fn,
                    ncfsm__m_group.guards[held ? NCFSM__GG_HELD_ELSEWHERE : NCFSM__GG_OTHER_THREAD].hint);
}
ACT(note_error) {
  GROUP;
  loop->group_err = p->err;
  ncfsm__loop_error(loop, "%s", p->msg ? p->msg : ncfsm_strerror(p->err));
}
ACT(launch) {
  GROUP;
  int nw = 0;
  for (ncfsm_work *w = loop->group_head; w; w = w->bnext) nw++;
  if (loop->opts.overlap == NCFSM_OVERLAP_WARN) {
    ncfsm_work *x, *y;
    if (ncfsm__find_overlap(loop->group_head, &x, &y)) {
      char a[160], b[160];
      describe_op(x, a, sizeof a);
      describe_op(y, b, sizeof b);
      NCFSM_WARN(NCFSM__SUB_FSM, "group ops %s and %s overlap where one writes (R12)", a, b);
    }
  }
  ncfsm__batch *batch = NULL;
  if (nw == 1) { /* a group of one op: the batch embedded in its work, as an ungrouped op's */
    ncfsm_work *w = loop->group_head;
    batch = &w->single;
    *batch = (ncfsm__batch){.explicit_group = true, .links = &w->single_link};
  } else if (nw) {
    batch = calloc(1, sizeof *batch + (size_t)nw * sizeof(ncfsm__blink));
    if (!batch) {
      p->result = NCFSM_ERR_NO_MEMORY;
      ncfsm__loop_error(loop, "%s: out of memory for the group's batch; its works fail", p->fn);
      close_group(loop, NULL, NCFSM_ERR_NO_MEMORY, NCFSM_ERR_NO_MEMORY);
      return;
    }
    batch->explicit_group = batch->allocated = true;
    batch->links = (ncfsm__blink *)(batch + 1);
  }
  close_group(loop, batch, NCFSM_OK, NCFSM_OK);
}
ACT(fail_group) {
  GROUP;
  p->result = loop->group_err;
  ncfsm__loop_error(loop, "%s: the group failed: an earlier call in it returned %s (R3); its other works fail with "
                          "NCFSM_ERR_GROUP and nothing reached the backend",
                    p->fn, ncfsm_err_name(loop->group_err));
  close_group(loop, NULL, p->result, NCFSM_ERR_GROUP);
}
ACT(fail_mixed) {
  GROUP;
  p->result = NCFSM_ERR_INVALID_USAGE;
  ncfsm__loop_error(loop, "%s: %s", p->fn, ncfsm__m_group.guards[NCFSM__GG_MIXED].hint);
  close_group(loop, NULL, p->result, NCFSM_ERR_GROUP);
}
ACT(fail_overlap) {
  GROUP;
  ncfsm_work *x, *y;
  char a[160] = "", b[160] = "";
  if (ncfsm__find_overlap(loop->group_head, &x, &y)) {
    describe_op(x, a, sizeof a);
    describe_op(y, b, sizeof b);
  }
  p->result = NCFSM_ERR_OVERLAP;
  ncfsm__loop_error(loop, "%s: %s and %s overlap where one writes; NCCL runs the ops of one group in any order (R12); "
                          "issue them in separate groups",
                    p->fn, a, b);
  close_group(loop, NULL, p->result, NCFSM_ERR_OVERLAP);
}

static void (*const group_acts[NCFSM__GA_COUNT])(void *, void *) = {
#define NCFSM_ACTION(name, desc) [NCFSM__GA_##name] = gact_##name,
#define gact_none NULL
#include "fsm/group.def"
#undef gact_none
};

static const ncfsm__binding group_binding = {&ncfsm__m_group, group_guard, group_acts, NULL, NULL};

static ncfsm_result_t group_fire(ncfsm_loop *loop, ncfsm__group_event_t ev, gev *p) {
  p->loop = loop;
  p->result = NCFSM_OK;
  if (!ncfsm__m_fire(&group_binding, loop, &loop->group_state, ev, p)) {
    NCFSM_LOG(NCFSM__LOG_ERROR, NCFSM__SUB_FSM, "group: invalid event %s in state %s (engine defect)",
              ncfsm__m_group.events[ev].name, ncfsm__m_group.states[loop->group_state].name);
    return NCFSM_ERR_INVALID_USAGE;
  }
  return p->result;
}

ncfsm_result_t ncfsm__group_start(ncfsm_loop *loop) {
  gev p = {.fn = "ncfsm_group_start"};
  return group_fire(loop, NCFSM__GE_START, &p);
}

ncfsm_result_t ncfsm__group_end(ncfsm_loop *loop) {
  gev p = {.fn = "ncfsm_group_end"};
  return group_fire(loop, NCFSM__GE_END, &p);
}

void ncfsm__group_note_error(ncfsm_comm *c, ncfsm_result_t r) {
  if (!ncfsm__group_owned(c->loop)) return;
  gev p = {.fn = "", .err = r, .msg = c->last_error};
  group_fire(c->loop, NCFSM__GE_CALL_FAILED, &p);
}

/* ---- a group its thread holds back from its loop (fsm/held.def) ---------------------- */

__thread ncfsm_loop *ncfsm__held_loop __attribute__((tls_model("initial-exec")));

typedef struct hev {
  ncfsm_loop *loop;
  ncfsm_work *w;         /* HOLD: the op */
  ncfsm_result_t result; /* out: what the call returns */
} hev;

static bool held_guard(const void *obj, unsigned g, const void *payload) {
  const ncfsm__held *h = obj;
  (void)payload;
  switch (g) {
    case NCFSM__HG_ANY: return true;
    case NCFSM__HG_NESTED: return h->depth > 1;
    case NCFSM__HG_COUNT: break;
  }
  return false;
}

/* The group is no longer held: the thread and the loop let it go (after
 * the loop's group took it over, when it spills). */
static inline void held_release(ncfsm_loop *loop) {
  loop->held.depth = 0;
  loop->held.w = NULL;
  ncfsm__held_loop = NULL;
  __atomic_store_n(&loop->held_taken, 0, __ATOMIC_RELEASE);
}

#define HACT(name) static inline __attribute__((always_inline)) void hact_##name(ncfsm_loop *loop, ncfsm__held *h, hev *p)
HACT(nest) {
  (void)loop, (void)p;
  h->depth++;
}
HACT(unnest) {
  (void)loop, (void)p;
  h->depth--;
}
HACT(hold) {
  (void)loop, (void)p;
  h->depth = 1;
  h->w = NULL;
}
HACT(take) {
  (void)loop;
  h->w = p->w;
}
/* As the loop group's end for a group of one op (close_group): the comm
 * leaves the group, the op queues as a batch of its own, explicit. Its
 * comm's abort may have failed it meanwhile (fsm/queue.c): nothing left. */
HACT(enter) {
  (void)p;
  ncfsm_work *w = h->w;
  held_release(loop);
  if (!w) return;
  ncfsm_comm *c = w->comm;
  if (c->ngroup) leave_group(c, NCFSM_OK);
  ncfsm__work_queue_own(loop, c, w, true);
}
HACT(drop) {
  (void)p, (void)h;
  held_release(loop);
}
/* The loop's group opens with the held depth (still held: its guard
 * HELD_ELSEWHERE does not refuse this thread), then the group is let go and
 * the held op, already in its comm's group, joins the loop's list. */
HACT(spill) {
  ncfsm_work *w = h->w;
  int depth = h->depth;
  ncfsm_result_t r = NCFSM_OK;
  for (int i = 0; i < depth && r == NCFSM_OK; i++) r = ncfsm__group_start(loop);
  held_release(loop);
  p->result = r;
  if (!w) return;
  ncfsm_comm *c = w->comm;
  if (r == NCFSM_OK) {
    ncfsm__group_append(loop, w);
    return;
  }
  /* another thread's group opened on the loop between this group's start and its first call under the lock */
  if (c->ngroup == 1) leave_group(c, r); /* its ops in the other thread's group stay there */
  else c->ngroup--;
  ncfsm__set_error(c, "%s: its group, opened on this thread, could not become the loop's: %s",
                   ncfsm_call_fn((ncfsm_call_t)w->call), ncfsm__m_group.guards[NCFSM__GG_OTHER_THREAD].hint);
  ncfsm__work_end(w, NCFSM_WORK_FAILED, r);
  ncfsm__loop_wake(loop);
}

/* The machine's fire, with its actions called by name (a group of one op
 * fires three events: the table's lookup stays, the indirect calls go). */
static inline __attribute__((always_inline)) ncfsm_result_t held_fire(ncfsm_loop *loop, ncfsm__held_event_t ev,
                                                                      ncfsm_work *w) {
  ncfsm__held *h = &loop->held;
  hev p = {.loop = loop, .w = w, .result = NCFSM_OK};
  static const ncfsm__binding b = {&ncfsm__m_held, held_guard, NULL, NULL, NULL};
  const ncfsm__mrow *r = ncfsm__m_find(&b, h, h->state, ev, &p);
  if (!r) {
    NCFSM_LOG(NCFSM__LOG_ERROR, NCFSM__SUB_FSM, "held group: invalid event %s in state %s (engine defect)",
              ncfsm__m_held.events[ev].name, ncfsm__m_held.states[h->state].name);
    return NCFSM_ERR_INVALID_USAGE;
  }
  if (__builtin_expect(ncfsm__m_counting, 0)) __atomic_fetch_add(&ncfsm__m_held.hits[r - ncfsm__m_held.rows], 1u, __ATOMIC_RELAXED);
  h->state = r->next; /* the holder's alone: no other thread reads it */
  switch (r->action) {
#define NCFSM_ACTION(name, desc) \
  case NCFSM__HA_##name:         \
    hact_##name(loop, h, &p);    \
    break;
#define hact_none(loop, h, p) ((void)0)
#include "fsm/held.def"
#undef hact_none
    case NCFSM__HA_COUNT: break;
  }
  return p.result;
}

bool ncfsm__held_start(ncfsm_loop *loop) {
  if (ncfsm__held_loop != loop) {
    /* The loop's state read without its lock: a group another thread opens
     * there meanwhile refuses this one's START when it spills, at its first
     * call under the lock (fsm/held.def). A trace sees a group's events
     * inside its calls (ncfsm-apifuzz): no hold. */
    if (ncfsm__held_loop || __atomic_load_n(&loop->group_state, __ATOMIC_RELAXED) != NCFSM__GS_NONE ||
        __atomic_load_n(&loop->trace, __ATOMIC_RELAXED))
      return false;
    int free_ = 0; /* one thread holds a group back from a loop at a time */
    if (!__atomic_compare_exchange_n(&loop->held_taken, &free_, 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
      return false;
    ncfsm__held_loop = loop;
  }
  (void)held_fire(loop, NCFSM__HE_START, NULL);
  return true;
}

ncfsm_result_t ncfsm__held_end(ncfsm_loop *loop) {
  ncfsm__held *h = &loop->held;
  if (h->depth > 1 || h->state == NCFSM__HS_EMPTY) return held_fire(loop, NCFSM__HE_END, NULL); /* the thread's alone */
  pthread_mutex_lock(&loop->mu);
  ncfsm__handoff_turn(loop);
  ncfsm_result_t r = held_fire(loop, NCFSM__HE_END, NULL);
  pthread_mutex_unlock(&loop->mu);
  return r;
}

void ncfsm__held_take(ncfsm_loop *loop, ncfsm_work *w) { (void)held_fire(loop, NCFSM__HE_HOLD, w); }

ncfsm_result_t ncfsm__held_spill(ncfsm_loop *loop) { return held_fire(loop, NCFSM__HE_SPILL, NULL); }
