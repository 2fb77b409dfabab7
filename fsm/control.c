/*
 * The calls the loop makes for a comm in a CONTROL state (fsm/comm.def,
 * column control): the unique id broadcast (ID_POST, ID_TEST), inits
 * (INIT), finalizes (FINALIZE) and queued aborts (ABORT); and the steps of
 * closes in progress (ncfsm_comm_close, column close). Inits of one
 * turn go in one backend group, so do aborts (R5); a blocking call never
 * runs under the loop's lock. Every backend call happens on the thread
 * that drives the loop (R9).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm/engine.h"
#include "ncfsm/bootstrap.h"

#define IS_ERR(rc) NCFSM__IS_ERR(rc)

static ncfsm__control_step_t step_of(const ncfsm_comm *c) { return ncfsm__comm_cols[c->state].control; }

/* ---- the unique id (init_boot) -------------------------------------------------------- */

/* Runs in the bootstrap's callback: only flags the loop, without its lock
 * (a turn may hold the lock while freeing this very request). */
static void uid_done(ncfsm_boot_req *req, ncfsm_result_t status, void *arg) {
  (void)req;
  (void)status;
  ncfsm__loop_kick_async(((ncfsm_comm *)arg)->loop);
}

/* ID_POST: the broadcast goes out on the loop thread (the bootstrap is
 * driven by its base's thread). */
static void post_id(ncfsm_comm *c) {
  ncfsm_boot_req *req = NULL;
  ncfsm_result_t br = ncfsm_boot_bcast_roots_post(c->boot, c->uid_buf, NCFSM_UNIQUE_ID_BYTES, c->nroots, &req);
  if (br != NCFSM_OK) {
    char what[320];
    snprintf(what, sizeof what, "the bootstrap refused the unique id exchange: %s", ncfsm_boot_last_error(c->boot));
    c->boot = NULL;
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, NCFSM__NCCL_SUCCESS, what);
    return;
  }
  c->uid_req = req;
  ncfsm_boot_req_on_done(req, uid_done, c);
  ncfsm__comm_fire(c, NCFSM_EV_ID_POSTED, NULL);
}

/* ID_TEST: the broadcast is done (ID_KNOWN) or failed; else look again at
 * the next turn (its callback kicks the loop; the poll schedule covers a
 * bootstrap that needs tests to progress). */
static void test_id(ncfsm_comm *c) {
  ncfsm_result_t r = ncfsm_boot_test(c->uid_req);
  if (r == NCFSM_ERR_AGAIN) {
    c->loop->ctl = true;
    return;
  }
  ncfsm_boot_req_free(c->uid_req);
  c->uid_req = NULL;
  c->boot = NULL;
  if (r != NCFSM_OK) {
    char what[160];
    snprintf(what, sizeof what, "unique id exchange through the bootstrap (%s)", ncfsm_err_name(r));
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BOOTSTRAP, NCFSM__NCCL_SUCCESS, what);
    return;
  }
  ncfsm__comm_fire(c, NCFSM_EV_ID_KNOWN, NULL); /* INIT_QUEUED: its init is issued this turn */
}

/* ---- inits ------------------------------------------------------------------------------- */

static void issue_inits(ncfsm_loop *loop) {
  /* All inits of a turn in one group, however many ranks (a blocking clique
   * driven by one thread needs every rank's init in one group). One group
   * holds one backend and one blocking mode; the others go next turn. */
  int n = 0;
  ncfsm_comm *first = NULL;
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    if (step_of(c) == NCFSM__CS_INIT) {
      if (!first) first = c;
      n += c->be == first->be && c->opts.blocking == first->opts.blocking;
    }
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
  for (ncfsm_comm *c = loop->comms; c; c = c->next) {
    if (step_of(c) != NCFSM__CS_INIT) continue;
    if (c->be == first->be && c->opts.blocking == first->opts.blocking) inits[n++] = c;
    else loop->ctl = true;
  }
  const ncfsm__backend *be = first->be;
  bool grouped = n > 1;
  for (int i = 0; i < n; i++) {
    inits[i]->be_calls++;
    inits[i]->refs++;
    ncfsm__comm_fire(inits[i], NCFSM_EV_INIT_ISSUED, NULL);
  }
  /* A blocking init waits for every rank: never under the loop's lock. The
   * comms are INIT_IN_PROGRESS meanwhile, where only abort is legal, and an
   * abort from another thread runs on this thread, after this. */
  bool unlock = first->opts.blocking, clk = false;
  if (unlock) {
    clk = ncfsm__turn_clock_pause(loop);
    pthread_mutex_unlock(&loop->mu);
  }
  int grc = grouped ? be->group_start() : NCFSM__NCCL_SUCCESS;
  for (int i = 0; i < n; i++) {
    ncfsm_comm *c = inits[i];
    ncfsm__comm_config cfg = {c->opts.blocking, c->opts.device, &c->sim, c->name};
    rcs[i].bcomm = NULL;
    unsigned feat = c->be->features();
    bool scalable = c->nroots > 1 && c->uid_buf && c->be->comm_init_scalable && (feat & NCFSM__HAS_INIT_SCALABLE);
    rcs[i].rc = IS_ERR(grc)  ? grc
                : scalable ? c->be->comm_init_scalable(&rcs[i].bcomm, c->nranks, (const ncfsm_unique_id *)c->uid_buf,
                                                       c->nroots, c->rank, &cfg)
                           : c->be->comm_init(&rcs[i].bcomm, c->nranks, &c->uid, c->rank, &cfg);
  }
  if (grouped && !IS_ERR(grc)) grc = be->group_end();
  if (unlock) {
    pthread_mutex_lock(&loop->mu);
    ncfsm__turn_clock_resume(loop, clk); /* the blocking init waited */
  }
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
    else if (st == NCFSM__NCCL_SUCCESS) ncfsm__comm_fire(c, NCFSM_EV_INIT_DONE, NULL);
  }
  if (inits != stack_inits) free(inits);
  if (rcs != stack_rcs) free(rcs);
}

/* ---- finalize ------------------------------------------------------------------------------- */

static void issue_finalize(ncfsm_comm *c) {
  if (!ncfsm__comm_can_fire(c, NCFSM_EV_FINALIZE_ISSUED)) { /* guard DRAINED: queued ops launch first */
    c->loop->ctl = true;
    return;
  }
  c->be_calls++;
  int rc = c->be->finalize(c->bcomm);
  if (IS_ERR(rc)) {
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(rc), rc, "ncclCommFinalize");
    return;
  }
  ncfsm__comm_fire(c, NCFSM_EV_FINALIZE_ISSUED, NULL);
  int st = NCFSM__NCCL_SUCCESS;
  if (!c->opts.blocking) c->be->get_async_error(c->bcomm, &st);
  if (IS_ERR(st)) ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, ncfsm__cause_of(st), st, "finalize");
  else if (st == NCFSM__NCCL_SUCCESS) ncfsm__comm_fire(c, NCFSM_EV_FINALIZE_DONE, NULL);
}

/* ---- aborts ---------------------------------------------------------------------------------- */

struct ncfsm__stray {
  const ncfsm__backend *be;
  void *bcomm;
  void (*after)(void *arg);
  void *arg;
  struct ncfsm__stray *next;
};
typedef struct ncfsm__stray ncfsm__stray;

void ncfsm__abort_stray(ncfsm_loop *loop, const ncfsm__backend *be, void *bcomm, void (*after)(void *), void *arg) {
  ncfsm__stray *s = malloc(sizeof *s);
  if (!s) {
    NCFSM_WARN(NCFSM__SUB_FSM, "out of memory: an NCCL handle no comm owns is not aborted");
    if (after) after(arg);
    return;
  }
  s->be = be;
  s->bcomm = bcomm;
  s->after = after;
  s->arg = arg;
  s->next = loop->strays;
  loop->strays = s;
  loop->ctl = loop->kick = true;
}

/* ncclCommAbort of n comms (their ABORT fired: CLOSING) and of the stray
 * handles, inside one group when there are several of one backend (R5),
 * with the loop's lock released: an abort takes hundreds of ms on GPUs, and
 * other threads' calls must not stall. */
static void abort_backend(ncfsm_loop *loop, ncfsm_comm **cs, int n) {
  ncfsm__stray *stray = loop->strays;
  loop->strays = NULL;
  void *stack_b[16], **bc = n <= 16 ? stack_b : malloc((size_t)n * sizeof *bc);
  const ncfsm__backend *be = NULL;
  bool one_backend = true;
  for (int i = 0; i < n; i++) {
    if (be && be != cs[i]->be) one_backend = false;
    be = cs[i]->be;
    cs[i]->refs++;
    if (cs[i]->bcomm) cs[i]->be_calls++;
  }
  for (ncfsm__stray *s = stray; s; s = s->next) {
    if (be && be != s->be) one_backend = false;
    be = s->be;
  }
  int total = n;
  for (ncfsm__stray *s = stray; s; s = s->next) total++;
  bool grouped = total > 1 && one_backend && bc;
  /* Other threads see no backend comm while it is being aborted (e.g.
   * ncfsm_sim_get_stats must not read what the backend frees). */
  if (bc)
    for (int i = 0; i < n; i++) {
      bc[i] = cs[i]->bcomm;
      cs[i]->bcomm = NULL;
    }
  ncfsm__loop_claim(loop);
  bool clk = ncfsm__turn_clock_pause(loop);
  pthread_mutex_unlock(&loop->mu);
  if (grouped && IS_ERR(be->group_start())) {
    NCFSM_WARN(NCFSM__SUB_FSM, "ncclGroupStart failed; aborting %d communicators one by one", total);
    grouped = false;
  }
  for (int i = 0; i < n; i++) {
    void *b = bc ? bc[i] : cs[i]->bcomm;
    if (!b) continue;
    int rc = cs[i]->be->abort(b);
    if (rc != NCFSM__NCCL_SUCCESS)
      NCFSM_WARN(NCFSM__SUB_FSM, "[%s] ncclCommAbort returned %s", cs[i]->name, ncfsm__nccl_result_name(rc));
  }
  while (stray) {
    ncfsm__stray *s = stray;
    stray = s->next;
    int rc = s->bcomm ? s->be->abort(s->bcomm) : NCFSM__NCCL_SUCCESS;
    if (rc != NCFSM__NCCL_SUCCESS)
      NCFSM_WARN(NCFSM__SUB_FSM, "ncclCommAbort of a handle no comm owns returned %s", ncfsm__nccl_result_name(rc));
    if (s->after) s->after(s->arg); /* what the handle used, freed once NCCL let go of it */
    free(s);
  }
  if (grouped) {
    int grc = be->group_end();
    if (grc != NCFSM__NCCL_SUCCESS)
      NCFSM_WARN(NCFSM__SUB_FSM, "ncclGroupEnd after %d aborts returned %s", total, ncfsm__nccl_result_name(grc));
  }
  pthread_mutex_lock(&loop->mu);
  ncfsm__turn_clock_resume(loop, clk); /* the blocking call took its time */
  ncfsm__loop_unclaim(loop);
  if (bc != stack_b) free(bc);
  for (int i = 0; i < n; i++) {
    ncfsm__comm_fire(cs[i], NCFSM_EV_CLOSE_DONE, NULL);
    ncfsm__comm_unref(cs[i]);
  }
}

void ncfsm__abort_strays_now(ncfsm_loop *loop) {
  if (loop->strays) abort_backend(loop, NULL, 0);
}

void ncfsm__comm_abort_now(ncfsm_comm *c) {
  ncfsm__comm_fire(c, NCFSM_EV_ABORT, NULL);
  abort_backend(c->loop, &c, 1);
}

static void issue_aborts(ncfsm_loop *loop) {
  int n = 0;
  for (ncfsm_comm *c = loop->comms; c; c = c->next) n += step_of(c) == NCFSM__CS_ABORT;
  if (!n && !loop->strays) return;
  ncfsm_comm *stack_cs[16], **cs = n <= 16 ? stack_cs : malloc((size_t)n * sizeof *cs);
  if (!cs) {
    loop->ctl = true;
    return;
  }
  n = 0;
  for (ncfsm_comm *c = loop->comms; c; c = c->next)
    if (step_of(c) == NCFSM__CS_ABORT) {
      ncfsm__comm_fire(c, NCFSM_EV_ABORT_ISSUED, NULL);
      cs[n++] = c;
    }
  abort_backend(loop, cs, n);
  if (cs != stack_cs) free(cs);
}

/* ---- destroy ------------------------------------------------------------------------------------ */

ncfsm_result_t ncfsm__comm_destroy_now(ncfsm_comm *c) {
  ncfsm_loop *loop = c->loop;
  ncfsm__comm_fire(c, NCFSM_EV_DESTROY, NULL); /* close_idle: CLOSING */
  void *bcomm = c->bcomm;
  c->bcomm = NULL; /* other threads see none while it is destroyed */
  c->be_calls++;
  c->refs++;
  ncfsm__loop_claim(loop);
  bool clk = ncfsm__turn_clock_pause(loop);
  pthread_mutex_unlock(&loop->mu);
  int rc = c->be->destroy(bcomm); /* ~500 ms on GPUs: never under the lock */
  pthread_mutex_lock(&loop->mu);
  ncfsm__turn_clock_resume(loop, clk); /* the blocking call took its time */
  ncfsm__loop_unclaim(loop);
  ncfsm_result_t r = NCFSM_OK;
  if (rc != NCFSM__NCCL_SUCCESS) {
    c->bcomm = bcomm; /* still there: the abort that follows needs it */
    ncfsm__cev p = {.cause = NCFSM_ERR_BACKEND, .code = rc, .what = "ncclCommDestroy", .from = c->state};
    ncfsm__comm_fire(c, NCFSM_EV_CLOSE_FAILED, &p);
    r = NCFSM_ERR_BACKEND;
  } else {
    ncfsm__comm_fire(c, NCFSM_EV_CLOSE_DONE, NULL); /* release_backend */
  }
  ncfsm__comm_unref(c);
  return r;
}

/* ---- closes (ncfsm_comm_close: column close) --------------------------------------------------- */

/* One step of c's close, from its state; false when it must be looked at
 * again at a later turn without a transition (a guard that may hold then). */
static bool close_step(ncfsm_comm *c) {
  ncfsm_result_t why = NCFSM_OK;
  ncfsm_call_t call = ncfsm__comm_cols[c->state].close;
  if (call == NCFSM_CALL_COUNT) return true; /* WAIT: the transition under way calls again */
  if (ncfsm__check_legal(c, call, &why) == NCFSM_REJECT) return false; /* a guard (IDLE: works finish first) */
  switch (call) {
    case NCFSM_CALL_FINALIZE: ncfsm__comm_fire(c, NCFSM_EV_FINALIZE, NULL); break;
    case NCFSM_CALL_DESTROY: ncfsm__comm_destroy_now(c); break;
    case NCFSM_CALL_ABORT:
      if (c->close->status == NCFSM_OK) c->close->status = c->cause != NCFSM_OK ? c->cause : NCFSM_ERR_ABORTED;
      ncfsm__comm_abort_now(c);
      break;
    case NCFSM_CALL_RELEASE: ncfsm__comm_fire(c, NCFSM_EV_RELEASE, NULL); break; /* release_handle: the callback */
    default:
      NCFSM_LOG(NCFSM__LOG_ERROR, NCFSM__SUB_FSM, "[%s] close step %s has no engine call (fsm/comm.def, column close)",
                c->name, ncfsm_call_fn(call));
      return true;
  }
  return true;
}

static void close_steps(ncfsm_loop *loop) {
  if (!loop->nclosing) return;
  /* A step may free comms released earlier (not this one: the close holds
   * a reference until its callback ran): walk from a held comm. */
  for (ncfsm_comm *c = loop->comms; c; c = c->next) {
    if (!c->close || c->state == NCFSM_STATE_RELEASED) continue;
    unsigned before;
    do { /* steps that end at once (NEW: release; CLOSED: release) follow each other */
      before = c->state;
      if (!close_step(c)) {
        loop->ctl = true;
        break;
      }
    } while (c->state != before && c->state != NCFSM_STATE_RELEASED && c->close);
  }
}

/* The close's callback, from the loop's call queue (lock not held); the
 * queue frees x (its first member) afterwards. */
static void close_cb(void *arg) {
  ncfsm__close *x = arg;
  ncfsm_comm *c = x->comm;
  ncfsm_loop *loop = c->loop;
  if (x->cb) x->cb(c, x->status, x->arg);
  pthread_mutex_lock(&loop->mu);
  c->close = NULL;
  loop->nclosing--;
  ncfsm__comm_unref(c); /* the close's reference */
  pthread_mutex_unlock(&loop->mu);
}

void ncfsm__shutdown_check(ncfsm_loop *loop) {
  if (!loop->shutdown_req) return;
  for (ncfsm_comm *o = loop->comms; o; o = o->next)
    if (o->state != NCFSM_STATE_RELEASED) return;
  ncfsm__call_req *r = loop->shutdown_req; /* after the close callbacks queued before it */
  loop->shutdown_req = NULL;
  if (loop->calls_tail) loop->calls_tail->next = r;
  else loop->calls_head = r;
  loop->calls_tail = r;
  ncfsm__loop_wake(loop);
}

void ncfsm__close_deliver(ncfsm_comm *c) {
  ncfsm_loop *loop = c->loop;
  ncfsm__close *x = c->close;
  if (c->cause != NCFSM_OK) x->status = c->cause; /* it failed on the way (the policy may have aborted it) */
  x->req = (ncfsm__call_req){close_cb, x, NULL};
  if (loop->calls_tail) loop->calls_tail->next = &x->req;
  else loop->calls_head = &x->req;
  loop->calls_tail = &x->req;
  ncfsm__loop_wake(loop); /* a release from another thread */
}

/* ---- the steps --------------------------------------------------------------------------------- */

void ncfsm__control(ncfsm_loop *loop, bool after_launch) {
  if (after_launch) {
    for (ncfsm_comm *c = loop->comms; c; c = c->next)
      if (step_of(c) == NCFSM__CS_FINALIZE) issue_finalize(c);
    return;
  }
  close_steps(loop);
  issue_aborts(loop);
  for (ncfsm_comm *c = loop->comms; c; c = c->next) {
    if (step_of(c) == NCFSM__CS_ID_POST) post_id(c);
    if (step_of(c) == NCFSM__CS_ID_TEST) test_id(c);
  }
  issue_inits(loop);
}
