/* Works: the work machine (fsm/work.def) with its actions, work and comm
 * references, the work free list with its quarantine, and the recorder's
 * view of a work. */
#include <assert.h>
#include <stdlib.h>

/* The rolling hash of the launched collectives, once per launch of each:
 * inlined (the same XXH3 as libxxhash's, specialised for the fingerprint's
 * fixed size). */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "fsm/objects.h"
#include "ncfsm/bootstrap.h"

ncfsm__protocols_t ncfsm__protocols; /* filled by layer 5 (fsm/verify.c) at load time */

/* ---- the work machine ------------------------------------------------------------ */

static void stats_note(ncfsm__stats *s, ncfsm_work *w, unsigned st) {
  s->works_final[st]++;
  w->comm->works_final[st]++;
  unsigned k = (unsigned)w->fp.op;
  if (k >= NCFSM_OPKIND_COUNT || w->t_complete < w->t_submit) return;
  uint64_t ns = w->t_complete - w->t_submit, us = (ns + 999) / 1000;
  /* bucket b: us <= 2^b (the smallest such b), the last one for the rest */
  unsigned b = us <= 1 ? 0 : 64u - (unsigned)__builtin_clzll(us - 1);
  if (b > NCFSM__LAT_BUCKETS - 1) b = NCFSM__LAT_BUCKETS - 1;
  s->lat_bucket[k][b]++;
  s->lat_count[k]++;
  s->lat_sum_ns[k] += ns;
}

/* R11: a work's seq is taken when it is handed to NCCL, in the comm's
 * launch order; the rolling hash follows the collectives launched. */
static void wact_launch(void *obj, void *payload) {
  ncfsm_work *w = obj;
  const ncfsm__wev *p = payload;
  ncfsm_comm *c = w->comm;
  switch (w->op.kind) {
    case NCFSM_KIND_SEND:
    case NCFSM_KIND_RECV:
      w->fp.seq = (w->op.kind == NCFSM_KIND_SEND ? c->p2p_send_seq : c->p2p_recv_seq)[w->op.peer]++;
      if (c->vops) c->vops->launched(c, w); /* its pair's other side is checked against it */
      break;
    default:
      w->fp.seq = c->coll_seq++;
      c->hash = XXH3_64bits_withSeed(&w->fp, sizeof w->fp, c->hash);
      if (c->vops) c->vops->launched(c, w);
      break;
  }
  w->group = p->launch;
  w->t_launch = p->now;
  w->deadline_ns = ncfsm__deadline(p->now, w->timeout_ms ? w->timeout_ms : c->opts.timeout_ms);
}

static void wact_in_flight(void *obj, void *payload) {
  ncfsm_work *w = obj;
  w->t_final = ((const ncfsm__wev *)payload)->now;
}

/* Final: the callback fires once, on the loop thread, at the next flush. */
static void wact_finish(void *obj, void *payload) {
  ncfsm_work *w = obj;
  ncfsm_comm *c = w->comm;
  ncfsm_loop *loop = c->loop;
  w->status = payload ? ((const ncfsm__wev *)payload)->status : NCFSM_OK;
  w->t_complete = ncfsm__turn_now(loop);
  if (w->vreq && c->vops) c->vops->forget(c, w);
  stats_note(&loop->stats, w, w->state);
  w->next = NULL;
  if (loop->notify_tail) loop->notify_tail->next = w;
  else loop->notify_head = w;
  loop->notify_tail = w;
}

static void (*const work_acts[])(void *, void *) = {
    [NCFSM__WA_none] = NULL,
    [NCFSM__WA_launch] = wact_launch,
    [NCFSM__WA_in_flight] = wact_in_flight,
    [NCFSM__WA_finish] = wact_finish,
};
_Static_assert(sizeof work_acts / sizeof *work_acts == NCFSM__WA_COUNT, "one function per action of work.def");

static bool work_guard(const void *obj, unsigned g, const void *payload) {
  (void)obj;
  (void)payload;
  return g == NCFSM__WG_ANY;
}

/* The recorder's entry of w follows its state (seq, launch, times, result). */
static inline __attribute__((always_inline)) void rec_work(ncfsm_work *w) {
  ncfsm__rec_entry *e = ncfsm__rec_get(w->comm->rec, w->rec);
  if (!e) return; /* recorder off, or the entry was overwritten */
  e->fp.seq = w->fp.seq;
  e->group = w->group;
  e->state = (int32_t)w->state;
  e->t_launch_ns = w->t_launch;
  e->t_final_ns = w->t_final;
  if (ncfsm__work_state_final((ncfsm_work_state_t)w->state)) {
    e->result = (int32_t)w->status;
    e->t_complete_ns = w->t_complete;
  }
}

/* The after observer (inlined where the dispatcher calls it directly). */
static inline __attribute__((always_inline)) void work_step(void *obj, unsigned from, unsigned ev,
                                                          const ncfsm__mrow *row, void *payload) {
  ncfsm_work *w = obj;
  (void)ev;
  (void)row;
  rec_work(w);
  ncfsm_loop *loop = w->comm->loop;
  if (loop->trace) {
    ncfsm_trace_rec r = {NCFSM_OBJ_WORK, w, w->comm->rank, w->fp.seq, (int)from, -1, (int)w->state, w->status,
                         ncfsm__now_ns()};
    loop->trace(&r, loop->trace_arg);
  }
}

static const ncfsm__binding work_binding = {&ncfsm__m_work, work_guard, work_acts, NULL, work_step};

void ncfsm__work_fire(ncfsm_work *w, ncfsm__work_event_t ev, const ncfsm__wev *p) {
  static const ncfsm__wev none = {NCFSM_OK, 0, 0};
  if (ncfsm__m_fire(&work_binding, w, &w->state, ev, (void *)(p ? p : &none))) return;
  NCFSM_LOG(NCFSM__LOG_ERROR, NCFSM__SUB_FSM, "[%s rank %d] work seq %llu: invalid event %s in state %s (engine defect)",
            w->comm->name, w->comm->rank, (unsigned long long)w->fp.seq, ncfsm__m_work.events[ev].name,
            ncfsm_work_state_name((ncfsm_work_state_t)w->state));
  assert(!"invalid work event: fsm/work.def has no row");
}

void ncfsm__work_end(ncfsm_work *w, ncfsm_work_state_t st, ncfsm_result_t status) {
  if (ncfsm__work_state_final((ncfsm_work_state_t)w->state)) return;
  ncfsm__wev p = {status, 0, 0};
  ncfsm__work_fire(w, st == NCFSM_WORK_TIMED_OUT ? NCFSM__WE_TIME_OUT : st == NCFSM_WORK_ABORTED ? NCFSM__WE_ABORT
                                                                                              : NCFSM__WE_FAIL,
                   &p);
}

/* ---- comms ------------------------------------------------------------------------ */

static void comm_free(ncfsm_comm *c) {
  ncfsm_loop *loop = c->loop;
  if (c->uid_req) ncfsm_boot_req_free(c->uid_req);
  if (c->vops) c->vops->free(c);
  if (c->rops) c->rops->detach(c);
  free(c->uid_buf);
  for (ncfsm_comm **pp = &loop->comms; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      loop->ncomms--;
      break;
    }
  ncfsm__comm_delist(c);
  c->bq_head = c->bq_tail = NULL; /* released: nothing is queued */
  ncfsm__qheap_fix(c);
  ncfsm__peers_changed(loop);
  ncfsm__marks_trim(c, 0);
  if (c->stream) c->be->stream_destroy(c->stream);
  assert(c->ninflight == 0); /* released: nothing in flight, and the count followed the stream queues */
  free(c->sq);
  ncfsm__rec_free(c->rec);
  free(c->p2p_send_seq);
  free(c->p2p_recv_seq);
  c->magic = NCFSM__DEAD_MAGIC;
  free(c);
}

void ncfsm__comm_unref(ncfsm_comm *c) {
  if (--c->refs == 0 && c->state == NCFSM_STATE_RELEASED) comm_free(c);
}

uint64_t ncfsm__comm_backend_calls(ncfsm_comm *c) {
  pthread_mutex_lock(&c->loop->mu);
  uint64_t n = c->be_calls;
  pthread_mutex_unlock(&c->loop->mu);
  return n;
}

/* ---- works' memory --------------------------------------------------------------------- */

ncfsm_work *ncfsm__work_alloc(ncfsm_loop *loop) {
  ncfsm_work *w = NULL;
  loop->pool.allocs++;
  if (loop->nfree > NCFSM__WORK_QUARANTINE) {
    w = loop->free_head;
    loop->free_head = w->next;
    if (!loop->free_head) loop->free_tail = NULL;
    loop->nfree--;
  } else if (!(w = malloc(sizeof *w))) {
    return NULL;
  }
  return w; /* its fields are the caller's to set, every one (fsm/api_ops.c) */
}

void ncfsm__work_unref(ncfsm_work *w) {
  if (--w->refs > 0) return;
  ncfsm_comm *c = w->comm;
  ncfsm_loop *loop = c->loop;
  if (w->mark) ncfsm__mark_put(c, w->mark);
  if (w->start_mark) ncfsm__mark_put(c, w->start_mark);
  w->mark = w->start_mark = NULL;
  w->magic = NCFSM__DEAD_MAGIC;
  w->user_refs = 0;
  w->next = NULL;
  if (loop->free_tail) loop->free_tail->next = w;
  else loop->free_head = w;
  loop->free_tail = w;
  loop->nfree++;
  ncfsm__comm_unref(c);
}

/* The hand-offs' spare works (fsm/submit.c fills the stack) back to the allocator. */
size_t ncfsm__handoff_free_spare(ncfsm_loop *loop) {
  size_t bytes = 0;
  for (ncfsm_work *w = atomic_exchange_explicit(&loop->spare, NULL, memory_order_acquire), *n; w; w = n) {
    n = w->next;
    free(w);
    bytes += sizeof *w;
  }
  return bytes;
}


size_t ncfsm__pool_trim(ncfsm_loop *loop) {
  size_t bytes = 0;
  int keep = NCFSM__POOL_KEEP > NCFSM__WORK_QUARANTINE ? NCFSM__POOL_KEEP : NCFSM__WORK_QUARANTINE;
  while (loop->nfree > keep) { /* the oldest first: the quarantine is the newest */
    ncfsm_work *w = loop->free_head;
    loop->free_head = w->next;
    loop->nfree--;
    free(w);
    bytes += sizeof *w;
    loop->pool.works_returned++;
  }
  if (!loop->free_head) loop->free_tail = NULL;
  for (ncfsm_comm *c = loop->comms; c; c = c->next) {
    int n = ncfsm__marks_trim(c, NCFSM__MARK_KEEP);
    loop->pool.marks_returned += (uint64_t)n;
    bytes += (size_t)n * sizeof(ncfsm__mark);
  }
  size_t spare = ncfsm__handoff_free_spare(loop); /* the hand-offs' share of the pool */
  loop->pool.works_returned += spare / sizeof(ncfsm_work);
  bytes += spare;
  if (bytes) loop->pool.trims++;
  return bytes;
}

void ncfsm__comm_free_all(ncfsm_loop *loop) {
  while (loop->free_head) {
    ncfsm_work *w = loop->free_head;
    loop->free_head = w->next;
    free(w);
  }
  loop->free_tail = NULL;
  loop->nfree = 0;
  ncfsm__handoff_free_spare(loop);
}
