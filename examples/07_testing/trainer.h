/* A small training loop on ncfsm, the application that 07_testing tests:
 * `steps` AllReduces over the ranks of one process, each checked, with a
 * retry and recovery policy. Built twice: trainer.c as written, and with
 * TRAINER_BROKEN (the "broken" variant: it ignores the status of its
 * collectives and never recovers), to show what a failing test prints. */
#ifndef TRAINER_H
#define TRAINER_H

#include <stddef.h>

#include "ncfsm.h"

#define TRAINER_MAX_WORKS 1024

typedef struct trainer_opts {
  int nranks;          /* ranks in this process, driven by one loop (default 2) */
  int steps;           /* AllReduces that must complete (default 8) */
  size_t count;        /* floats per rank (default 64) */
  int max_attempts;    /* tries of one step, each on new communicators after the first (default 3) */
  uint64_t timeout_ms; /* ncfsm's watchdog per collective and per init (default 500) */
  const char *name;    /* the communicators' name (default "train") */
} trainer_opts;

typedef struct trainer_report {
  int steps_done;      /* steps whose AllReduce completed on every rank with the right sum */
  int attempts;        /* step attempts in all */
  int recoveries;      /* times every comm was aborted and made again */
  int corrupt;         /* attempts whose collectives all completed but whose data was wrong */
  int gave_up;         /* 1: a step failed max_attempts times */
  ncfsm_result_t last_error; /* status of the last failed attempt (NCFSM_OK: none failed) */
  char why[256];       /* what the last failure was */
  unsigned nworks;     /* works submitted */
  unsigned cb_count[TRAINER_MAX_WORKS]; /* completion callbacks run, per work */
} trainer_report;

void trainer_opts_init(trainer_opts *o);
/* Run the steps on `loop` (which the caller owns and may record). Returns 0
 * when every step completed, -1 when it gave up (r->why says why). The
 * comms are closed and released on return. */
int trainer_run(ncfsm_loop *loop, const trainer_opts *o, trainer_report *r);

#endif
