/* The application under test (trainer.h). Its policy:
 *   - a step is one AllReduce SUM over every rank, in one group; it counts
 *     when every rank's work completed with NCFSM_OK and every element of
 *     every rank's result is the expected sum;
 *   - anything else (an init that fails or times out, a work that fails or
 *     times out, a wrong sum) fails the attempt: every comm is aborted and
 *     released, new comms are made (recovery) and the step is tried again,
 *     at most max_attempts times; then the trainer gives up.
 * TRAINER_BROKEN builds the variant with a bug: it takes a step as done
 * whatever its works' statuses and data, and never recovers. */
#include "trainer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANKS 8

void trainer_opts_init(trainer_opts *o) {
  memset(o, 0, sizeof *o);
  o->nranks = 2;
  o->steps = 8;
  o->count = 64;
  o->max_attempts = 3;
  o->timeout_ms = 500;
  o->name = "train";
}

typedef struct world {
  int up, n;
  ncfsm_comm *c[MAX_RANKS];
  float *dev[MAX_RANKS]; /* the collective's buffers (device memory on nccl) */
  float *host;           /* staging for the data check */
} world;

typedef struct slot {
  trainer_report *r;
  unsigned idx;
  ncfsm_result_t st;
  int done;
} slot;

static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  slot *s = arg;
  s->st = st;
  s->done = 1;
  if (s->idx < TRAINER_MAX_WORKS) s->r->cb_count[s->idx]++;
}

static void failed(trainer_report *r, ncfsm_result_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void failed(trainer_report *r, ncfsm_result_t st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->why, sizeof r->why, fmt, ap);
  va_end(ap);
  r->last_error = st;
}

/* Abort (or, healthy and clean, finalize and destroy) and release every comm. */
static void comms_down(world *w, int clean) {
  if (clean) {
    for (int k = 0; k < w->n; k++) clean &= ncfsm_comm_finalize(w->c[k]) == NCFSM_OK;
    for (int k = 0; k < w->n && clean; k++)
      clean &= ncfsm_comm_wait_state(w->c[k], NCFSM_STATE_FINALIZED, 0) == NCFSM_OK;
  }
  for (int k = 0; k < w->n; k++) {
    if (w->dev[k]) ncfsm_mem_free(w->c[k], w->dev[k]);
    w->dev[k] = NULL;
    ncfsm_state_t s = ncfsm_comm_state(w->c[k]);
    if (clean) ncfsm_comm_destroy(w->c[k]);
    else if (s != NCFSM_STATE_CLOSED && s != NCFSM_STATE_NEW) ncfsm_comm_abort(w->c[k]);
  }
  for (int k = 0; k < w->n; k++) {
    ncfsm_comm_wait_state(w->c[k], NCFSM_STATE_CLOSED, 0);
    ncfsm_comm_release(w->c[k]);
    w->c[k] = NULL;
  }
  w->up = 0;
  w->n = 0;
}

static int comms_up(ncfsm_loop *loop, const trainer_opts *o, world *w, trainer_report *r) {
  ncfsm_comm_opts co;
  ncfsm_result_t rc = ncfsm_comm_opts_init(&co);
  if (rc != NCFSM_OK) {
    failed(r, rc, "options: %s", ncfsm_opts_error()); /* a refused NCFSM_* value */
    return -1;
  }
  co.name = o->name;
  co.timeout_ms = o->timeout_ms;
  int devs[MAX_RANKS];
  for (int k = 0; k < o->nranks; k++) devs[k] = k;
  rc = ncfsm_comm_init_all(loop, o->nranks, &co, devs, w->c);
  if (rc != NCFSM_OK) {
    failed(r, rc, "init: %s: %s", ncfsm_err_name(rc), ncfsm_loop_last_error(loop));
    return -1;
  }
  w->up = 1;
  w->n = o->nranks;
  for (int k = 0; k < o->nranks; k++) { /* the watchdog bounds the init */
    rc = ncfsm_comm_wait_state(w->c[k], NCFSM_STATE_READY, 0);
    if (rc != NCFSM_OK) {
      failed(r, rc, "rank %d init: %s", k, ncfsm_comm_failure(w->c[k]));
      return -1;
    }
    rc = ncfsm_mem_alloc(w->c[k], o->count * sizeof(float), (void **)&w->dev[k]);
    if (rc != NCFSM_OK) {
      failed(r, rc, "rank %d: ncfsm_mem_alloc: %s", k, ncfsm_comm_last_error(w->c[k]));
      return -1;
    }
  }
  return 0;
}

/* One attempt of step `step`: 0 when it counts. */
static int step_once(ncfsm_loop *loop, const trainer_opts *o, world *w, int step, trainer_report *r) {
  slot s[MAX_RANKS];
  int n = o->nranks;
  for (int k = 0; k < n; k++) {
    for (size_t i = 0; i < o->count; i++) w->host[i] = (float)(k + 1 + step) + (float)(i % 4);
    ncfsm_memcpy(w->c[k], w->dev[k], w->host, o->count * sizeof(float), 1);
  }
  ncfsm_group_start(loop);
  for (int k = 0; k < n; k++) {
    s[k] = (slot){r, r->nworks, NCFSM_ERR_AGAIN, 0};
    ncfsm_result_t rc = ncfsm_allreduce(w->c[k], w->dev[k], w->dev[k], o->count, NCFSM_FLOAT32, NCFSM_OP_SUM,
                                        NULL, on_done, &s[k], NULL);
    if (rc == NCFSM_OK) r->nworks++;
    else s[k] = (slot){r, TRAINER_MAX_WORKS, rc, 1}; /* refused: no callback comes */
  }
  ncfsm_group_end(loop);
  for (;;) { /* the watchdog (timeout_ms) ends every work */
    int all = 1;
    for (int k = 0; k < n; k++) all &= s[k].done;
    if (all) break;
    ncfsm_loop_run(loop, NCFSM_RUN_ONCE);
  }
#ifdef TRAINER_BROKEN
  /* BUG: the statuses and the data are not looked at; only a call that was
   * refused stops the trainer. */
  for (int k = 0; k < n; k++)
    if (s[k].idx == TRAINER_MAX_WORKS) {
      failed(r, s[k].st, "step %d rank %d: ncfsm_allreduce refused: %s", step, k, ncfsm_err_name(s[k].st));
      return -1;
    }
  return 0;
#else
  for (int k = 0; k < n; k++)
    if (s[k].st != NCFSM_OK) {
      failed(r, s[k].st, "step %d rank %d: %s (%s)", step, k, ncfsm_err_name(s[k].st),
             ncfsm_comm_failure(w->c[k]));
      return -1;
    }
  for (int k = 0; k < n; k++) {
    ncfsm_memcpy(w->c[k], w->host, w->dev[k], o->count * sizeof(float), 0);
    for (size_t i = 0; i < o->count; i++) {
      float want = (float)(n * (n + 1) / 2 + n * step) + (float)n * (float)(i % 4);
      if (fabsf(w->host[i] - want) > 1e-3f) {
        r->corrupt++;
        failed(r, NCFSM_ERR_MISMATCH, "step %d rank %d: element %zu is %g, expected %g (every work completed)",
               step, k, i, (double)w->host[i], (double)want);
        return -1;
      }
    }
  }
  return 0;
#endif
}

int trainer_run(ncfsm_loop *loop, const trainer_opts *o, trainer_report *r) {
  memset(r, 0, sizeof *r);
  r->last_error = NCFSM_OK;
  if (!loop || !o || o->nranks < 1 || o->nranks > MAX_RANKS || o->steps < 0 || !o->count || o->max_attempts < 1) {
    failed(r, NCFSM_ERR_INVALID_ARGUMENT, "invalid options");
    r->gave_up = 1;
    return -1;
  }
  world w;
  memset(&w, 0, sizeof w);
  w.host = malloc(o->count * sizeof(float));
  if (!w.host) {
    failed(r, NCFSM_ERR_NO_MEMORY, "out of memory");
    r->gave_up = 1;
    return -1;
  }
  int tries = 0;
  for (int step = 0; step < o->steps;) {
    int ok = w.up || comms_up(loop, o, &w, r) == 0;
    if (ok) {
      r->attempts++;
      ok = step_once(loop, o, &w, step, r) == 0;
    }
    if (ok) {
      step++;
      r->steps_done++;
      tries = 0;
      continue;
    }
#ifdef TRAINER_BROKEN
    (void)tries;
    r->gave_up = 1; /* BUG: no recovery */
    break;
#else
    comms_down(&w, 0); /* recovery: abort everything, make new comms */
    r->recoveries++;
    if (++tries >= o->max_attempts) {
      r->gave_up = 1;
      break;
    }
#endif
  }
  if (w.up) comms_down(&w, !r->gave_up);
  free(w.host);
  return r->gave_up ? -1 : 0;
}
