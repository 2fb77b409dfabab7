/* The loop's group machine (fsm/group.def) bound to the engine: groups are
 * loop-wide, nestable and owned by the thread that opened the outermost one
 * (R3). Its outermost end turns the group's ops into one batch queued in
 * every comm they touch, or fails them all before the backend. */
#include <stdio.h>
#include <stdlib.h>

#include "fsm/engine.h"

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
    case NCFSM__GG_MIXED: return mixed_blocking(loop->group_head);
    case NCFSM__GG_OVERLAP:
      return loop->opts.overlap == NCFSM_OVERLAP_REJECT && ncfsm__find_overlap(loop->group_head, &x, &y);
    case NCFSM__GG_COUNT: break;
  }
  return false;
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
      c->ngroup = 0;
      if (batch) batch->links[batch->nlinks++].c = c;
      ncfsm__cev p = {.cause = err, .from = c->state};
      ncfsm__comm_fire(c, NCFSM_EV_GROUP_CLOSE, &p);
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
  ncfsm__loop_error(loop, "%s: %s", p->fn, ncfsm__m_group.guards[NCFSM__GG_OTHER_THREAD].hint);
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
