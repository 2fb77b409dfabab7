/*
 * The averaging service of examples/06_service, one rank of it: clients POST
 * float vectors to /submit, the ranks AllReduce the accumulated sums through
 * ncfsm on a timer (or as soon as a batch is full), clients GET /average;
 * /status, /metrics and /healthz come from ncfsm_http. Shared by the example
 * (main.c) and bench/service_latency.c. docs/service.md walks through it.
 *
 * Every function runs on the thread that runs the application's base.
 */
#ifndef NCFSM_EXAMPLE_AVG_SERVICE_H
#define NCFSM_EXAMPLE_AVG_SERVICE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ncfsm.h"

struct event_base;

typedef struct avg_opts {
  const char *address;      /* HTTP address (default 127.0.0.1) */
  unsigned port;            /* 0: a free port */
  const char *port_file;    /* written (atomically) with the bound port once listening; "%r" in
                               it stands for the rank */
  size_t count;             /* floats per vector (the same on every rank) */
  unsigned batch;           /* a round starts as soon as this many vectors wait here */
  unsigned interval_ms;     /* otherwise a round every interval_ms */
  size_t max_body;          /* 413 beyond (0: 32 bytes per float + 1 KiB) */
  uint64_t timeout_ms;      /* the comm's watchdog */
  ncfsm_error_policy_t on_error;
  int64_t sim_async_error_at; /* >= 0: the sim fails this rank's op of this index (R10) */
  unsigned stop_grace_ms;   /* a stop that has not finished by then aborts the comm */
  int naive;                /* 1: blocking collectives inside the event callbacks */
  ncfsm_backend_kind_t backend;
  size_t busy_bytes;        /* > 0: first busy_ops AllReduces of this size back to back */
  unsigned busy_ops;
} avg_opts;

void avg_opts_init(avg_opts *o);

typedef struct avg_service avg_service;

/* Opens the bootstrap as the settings say (NCFSM_BOOTSTRAP=auto: PMIx under
 * mpirun or srun --mpi=pmix, the TCP store with NCFSM_STORE_ADDR, else a single
 * rank; several tasks that find neither, or NCFSM_WORLD_SIZE above 1 without
 * either, are refused: examples/launch.h), creates the loop (embedded in base,
 * or with its own base when naive), starts the comm's init and the HTTP
 * server. Returns 0, or -1 with a message on stderr. */
int avg_start(struct event_base *base, const avg_opts *o, avg_service **out);
/* Ask for a stop (any thread, e.g. a signal handler's event): the next round
 * tells every rank, all of them finalize after it. */
void avg_request_stop(avg_service *s);
/* After base's loop returned: 0 when the comm closed cleanly, 3 when it had
 * failed or was aborted. Frees everything. */
int avg_finish(avg_service *s);

/* For the benchmark (any thread; relaxed reads). */
typedef struct avg_counters {
  _Atomic uint64_t rounds, vectors_averaged, submits, rejects, busy_done;
  _Atomic int ready, failed, done;
} avg_counters;
avg_counters *avg_get_counters(avg_service *s);
int avg_port(const avg_service *s);
int avg_rank(const avg_service *s);
int avg_size(const avg_service *s);
ncfsm_loop *avg_loop(avg_service *s);

#endif
