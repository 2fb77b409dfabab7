/*
 * Layer 2: a submission's work, as both of its paths make it (fsm/api_ops.c):
 * the fields its calling thread sets, and what needs the loop's lock (the
 * comm's reference, the recorder, the trace, the group or the queue); and the
 * stack of submissions handed off while another thread held the lock
 * (fsm/submit.c takes it; docs/design.md "Submissions from other threads").
 * Inline: every submission runs them.
 */
#ifndef NCFSM_FSM_SUBMIT_H
#define NCFSM_FSM_SUBMIT_H

#include <stdatomic.h>

#include "fsm/engine.h"

/* Kinds as bit sets (one test each on the submit path). */
#define NCFSM__KIND(k) (1u << NCFSM_KIND_##k)
_Static_assert(NCFSM_OPKIND_COUNT <= 32, "the kinds fit a bit set");
static inline bool ncfsm__kind_in(ncfsm_opkind_t k, unsigned set) { return (unsigned)k < 32 && ((1u << k) & set); }
static inline bool ncfsm__op_reduces(ncfsm_opkind_t k) {
  return ncfsm__kind_in(k, NCFSM__KIND(ALLREDUCE) | NCFSM__KIND(REDUCE) | NCFSM__KIND(REDUCESCATTER));
}
static inline bool ncfsm__op_rooted(ncfsm_opkind_t k) {
  return ncfsm__kind_in(k, NCFSM__KIND(BROADCAST) | NCFSM__KIND(REDUCE) | NCFSM__KIND(GATHER) | NCFSM__KIND(SCATTER));
}

/* Every field of a new work that its submission sets (the work's memory
 * comes uninitialised: from the pool, or a hand-off's cache); what needs the
 * loop's lock (the comm's reference, the recorder, the queue) is ncfsm__work_enter's. */
static inline __attribute__((always_inline)) void ncfsm__work_init(ncfsm_work *w, ncfsm_comm *c, ncfsm_call_t call,
                                                                  const ncfsm__op *o, ncfsm_work_cb cb, void *arg,
                                                                  bool out) {
  w->magic = NCFSM__WORK_MAGIC;
  w->state = NCFSM_WORK_QUEUED; /* fsm/work.def's initial state */
  w->user_refs = out;
  w->refs = w->user_refs + 1; /* the engine's: until the callback ran */
  w->comm = c;
  w->op = *o;
  w->nspan = -1; /* its R12 ranges: at their first use (fsm/ranges.c) */
  w->status = NCFSM_ERR_AGAIN;
  w->cb = cb;
  w->arg = arg;
  w->batch = NULL;
  w->mark = w->start_mark = NULL;
  w->device_ms = -1;
  w->timeout_ms = 0;
  w->group = 0;
  w->t_submit = ncfsm__now_ns();
  w->t_launch = w->t_final = w->t_complete = w->deadline_ns = 0;
  w->vreq = NULL;
  w->call = (unsigned char)call;
  w->bnext = w->next = NULL;
  bool p2p = ncfsm__kind_in(o->kind, NCFSM__KIND(SEND) | NCFSM__KIND(RECV));
  /* The seq is taken at launch (the work's action launch): a work refused,
   * dropped with a failed group or failed before launch takes none, so the
   * ranks' numbers stay equal when a group fails on one rank only (R11). */
  w->fp = (ncfsm_fingerprint_t){
      .seq = NCFSM_SEQ_NONE,
      .op = (int32_t)o->kind,
      .dtype = (int32_t)o->dtype,
      .count = o->count,
      .root = ncfsm__op_rooted(o->kind) ? o->root : -1,
      .redop = ncfsm__op_reduces(o->kind) ? (int32_t)o->redop : -1,
      .peer = p2p ? o->peer : -1,
  };
}

/* Under the lock: w holds its comm and gets its recorder entry. */
static inline __attribute__((always_inline)) void ncfsm__work_record(ncfsm_loop *loop, ncfsm_comm *c, ncfsm_work *w) {
  c->refs++;
  ncfsm__rec_entry *re = ncfsm__rec_push(c->rec, &w->rec); /* written in place */
  if (re) {
    re->fp = w->fp;
    re->group = 0;
    re->state = NCFSM_WORK_QUEUED;
    re->result = NCFSM_ERR_AGAIN;
    re->stream = (uint64_t)(uintptr_t)w->op.stream;
    re->t_submit_ns = w->t_submit;
    re->t_launch_ns = re->t_final_ns = re->t_complete_ns = 0;
  }
  if (loop->trace) {
    ncfsm_trace_rec rec = {NCFSM_OBJ_WORK, w, c->rank, w->fp.seq, -1, -1, NCFSM_WORK_QUEUED, NCFSM_OK, w->t_submit};
    loop->trace(&rec, loop->trace_arg);
  }
}

/* ... its batch of its own (explicit: a group of one op, never coalesced), queued. */
static inline __attribute__((always_inline)) void ncfsm__work_queue_own(ncfsm_loop *loop, ncfsm_comm *c,
                                                                       ncfsm_work *w, bool explicit_group) {
  ncfsm__batch *b = &w->single;
  b->head = b->tail = w;
  b->nworks = 1;
  b->explicit_group = explicit_group;
  b->allocated = false;
  b->nlinks = 1;
  b->links = &w->single_link;
  w->single_link.c = c; /* .b, .next: ncfsm__batch_queue; .order, .nlive too */
  w->batch = b;
  ncfsm__batch_queue(loop, b);
  ncfsm__loop_wake(loop);
}

/* The op enters its comm's group (R3): the comm is GROUP_OPEN. */
static inline __attribute__((always_inline)) void ncfsm__work_enlist(ncfsm_comm *c) {
  c->ngroup++;
  ncfsm__comm_fire(c, NCFSM_EV_ENLIST, NULL);
}
/* The op is the last of the loop's open group's list. */
static inline void ncfsm__group_append(ncfsm_loop *loop, ncfsm_work *w) {
  w->bnext = NULL;
  if (loop->group_tail) loop->group_tail->bnext = w;
  else loop->group_head = w;
  loop->group_tail = w;
}

/* Recorded, then into the open group (group: the caller owns it) or queued
 * as a batch of its own. */
static inline __attribute__((always_inline)) void ncfsm__work_enter(ncfsm_loop *loop, ncfsm_comm *c, ncfsm_work *w,
                                                                   bool group) {
  ncfsm__work_record(loop, c, w);
  if (group) { /* it joins the loop's open group (the caller owns it) */
    ncfsm__group_append(loop, w);
    ncfsm__work_enlist(c);
  }
  else ncfsm__work_queue_own(loop, c, w, false);
}

/* The lock held: the handed-off submissions join their comms, oldest first,
 * each checked again in its comm's state now (a comm that left READY fails
 * the work with that check's error); then the spare stack gets as many works
 * from the pool past its quarantine, when it is empty. */
void ncfsm__handoff_take(ncfsm_loop *loop);
static inline void ncfsm__handoff_turn(ncfsm_loop *loop) {
  if (atomic_load_explicit(&loop->handoff, memory_order_relaxed)) ncfsm__handoff_take(loop);
}

#endif
