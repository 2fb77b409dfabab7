/*
 * bench/engine_modes: the submission patterns bench/engine_overhead measures
 * (issue 2's three and issue 22's scale modes). Each mode sets up its own
 * loop and 1-rank comms on the null backend, and its run submits about n ops
 * in its pattern and returns how many completed (whole rounds: n rounded up
 * to a multiple of the mode's round).
 */
#ifndef BENCH_ENGINE_MODES_H
#define BENCH_ENGINE_MODES_H

#include <sched.h>
#include <stddef.h>

#include "ncfsm.h"

typedef struct em_bench {
  long param;          /* N comms, W works, G ops per group, the cap, T threads or the peak */
  int callgrind;       /* under --callgrind: the references are modes of their own, not set up here */
  int collect;         /* this run is measured: its threads toggle their own collection (callgrind's
                          state is per thread; a thread starts with it off) */
  long idle_ms;        /* memory: how long the loop idles after the peak */
  int pin;             /* threads-T, waiters-T: each thread on a CPU of its own (--pin) */
  int pinned;          /* ... and cpus is the calling thread's affinity before, restored at teardown */
  cpu_set_t cpus;
  ncfsm_loop *loop;    /* the measured loop */
  int loop_thread;     /* 1: it runs on its own thread (ncfsm_loop_start_thread) */
  ncfsm_comm **comms;
  int ncomms;
  struct ncfsm_boot *boots[2]; /* pair-boot-*: the ranks' in-process bootstraps (closed after the comms) */
  ncfsm_loop *ref_loop; /* threads-T: the self-driven reference of the same run */
  ncfsm_comm *ref_comm;
  float *bufs;         /* 16 floats per slot */
  long nslots;
  char report[768];    /* lines printed after the mode's row (memory) */
} em_bench;

typedef struct em_mode {
  const char *family;  /* the name is "family-param", or "family" when min_param is 0 */
  const char *what;    /* one line */
  long min_param, max_param;
  const long *list;    /* the parameters of --list, 0-terminated (NULL: the family alone) */
  int warm;            /* 1: warm up with as many ops as measured; 0: its setup warms up */
  int one_run;         /* 1: a single run (the state after it is not the state before it) */
  int (*setup)(em_bench *b);
  long (*run)(em_bench *b, long n);
  long (*run_ref)(em_bench *b, long n); /* measured in the same run for a wall-time ratio, or NULL */
  const char *ref_suffix;               /* the reference's row: the mode's name and this (NULL: ".self") */
  void (*after)(em_bench *b);           /* after the measured run, not measured (memory: idle), or NULL */
} em_mode;

extern const em_mode em_modes[];
extern const int em_nmodes;

/* Works completed with NCFSM_OK by every mode so far (their callbacks). */
long em_done(void);
/* The mode named name ("rr-512", "pingpong"), with *param set; NULL (and a
 * message in why) for a name no mode has or a parameter out of range. */
const em_mode *em_find(const char *name, long *param, char *why, size_t len);
void em_teardown(em_bench *b);

#endif
