/*
 * bench/engine_overhead: host cost per submitted op of the engine itself
 * (legality, argument checks, fingerprint, batching, launch, completion,
 * callback), measured with the null backend whose calls cost nothing.
 *
 *   engine_overhead [ops-per-run] [runs]       pingpong, burst, coalesce: ns/op, median of runs
 *   valgrind --tool=callgrind --collect-atstart=no engine_overhead --callgrind
 *                                              the same three: instructions for a measured block
 *   engine_overhead [--callgrind] [--ops N] [--runs R] [--idle-ms MS] [--backend null|sim] [--pin] MODE...
 *                                              the modes named (engine_overhead --list); --backend sim:
 *                                              the same on the sim (a model with costs of its own);
 *                                              --pin: threads-T and waiters-T put the loop's thread on
 *                                              CPU 0, the reference (this thread) on 1, submitter k on
 *                                              1 + k (modulo the CPUs online)
 *
 * Issue 2's three patterns (one comm):
 *   pingpong  submit one op, run the loop until it completes (the latency path)
 *   burst     submit N ops on ONE buffer, then run the loop: R12 keeps dependent
 *             ops apart, so each op is its own launch
 *   coalesce  submit N ops over 64 distinct buffers, then run the loop: up to
 *             coalesce_max (64) ops share one backend group
 * Issue 22's modes (engine_modes.c): rr-N and each-N (N comms on one loop),
 * works-W, group-G, r12-asc-C and r12-desc-C, selfdrive, threads-T and
 * waiters-T, memory-P. Every mode sets up its own loop, warms up with as many ops as it
 * measures (memory: 1,000 pingpong ops before its baseline) and measures
 * whole rounds: the op count printed (and in the callgrind block's name,
 * "<mode>_<ops>_ops", which bench/callgrind_overhead.sh divides by) is n
 * rounded up to a multiple of the round (N, W, G or C).
 */
#define _GNU_SOURCE /* cpu_set_t (engine_modes.h) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <valgrind/callgrind.h>

#include "engine_modes.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#define MAX_RUNS 64

typedef struct bench_args {
  long ops;
  int runs;
  int callgrind;
  int legacy;  /* issue 2's command line: its output format */
  long idle_ms;
  const char *backend; /* null (the engine's cost alone), or sim (--backend sim) */
  int pin;             /* --pin */
} bench_args;

typedef struct stats {
  double med, min, max;
} stats;

static stats summarize(double *t, int runs) {
  qsort(t, (size_t)runs, sizeof t[0], cmp_d);
  return (stats){t[runs / 2], t[0], t[runs - 1]};
}

/* One run of fn: ns per op, or a negative value when it failed or not all of its works completed. */
static double timed(long (*fn)(em_bench *, long), em_bench *b, long n, long *ops) {
  long before = em_done();
  double t0 = now_ns();
  *ops = fn(b, n);
  double t = now_ns() - t0;
  if (*ops < 0) return -1;
  if (em_done() - before != *ops) {
    fprintf(stderr, "engine_overhead: only %ld of %ld works completed\n", em_done() - before, *ops);
    return -1;
  }
  return t / (double)*ops;
}

static void row(const bench_args *a, const char *name, stats s, long ops) {
  if (a->legacy)
    printf("%-10s %10.1f %12.1f %12.1f\n", name, s.med, s.min, s.max);
  else
    printf("%-16s %10.1f %12.1f %12.1f %10ld\n", name, s.med, s.min, s.max, ops);
}

static int callgrind_block(const em_mode *m, em_bench *b, const char *name, long n) {
  long before = em_done();
  b->collect = 1;
  CALLGRIND_ZERO_STATS;
  CALLGRIND_TOGGLE_COLLECT;
  long ops = m->run(b, n);
  CALLGRIND_TOGGLE_COLLECT;
  b->collect = 0;
  if (ops < 0) return -1;
  if (em_done() - before != ops) {
    fprintf(stderr, "engine_overhead: %s: only %ld of %ld works completed\n", name, em_done() - before, ops);
    return -1;
  }
  char block[96];
  snprintf(block, sizeof block, "%s_%ld_ops", name, ops);
  CALLGRIND_DUMP_STATS_AT(block);
  return 0;
}

/* Runs of the mode; with a reference (threads-T), reference and mode alternate
 * and the ratio of their medians is printed. */
static int timed_runs(const bench_args *a, const em_mode *m, em_bench *b, const char *name, long n) {
  double t[MAX_RUNS], tr[MAX_RUNS];
  int runs = m->one_run ? 1 : a->runs;
  long ops = 0, rops = 0;
  for (int r = 0; r < runs; r++) {
    if (m->run_ref && (tr[r] = timed(m->run_ref, b, n, &rops)) < 0) return -1;
    if ((t[r] = timed(m->run, b, n, &ops)) < 0) return -1;
  }
  stats s = summarize(t, runs);
  row(a, name, s, ops);
  if (m->run_ref) {
    char rname[80];
    snprintf(rname, sizeof rname, "%s%s", name, m->ref_suffix ? m->ref_suffix : ".self");
    stats sr = summarize(tr, runs);
    row(a, rname, sr, rops);
    printf("  ratio %s %.3f (wall time per op, %s / %s: medians of %d alternating runs)\n", name, s.med / sr.med,
           name, rname, runs);
  }
  return 0;
}

static int measure(const bench_args *a, const em_mode *m, long param, const char *name) {
  em_bench b = {.param = param, .callgrind = a->callgrind, .idle_ms = a->idle_ms, .pin = a->pin};
  int rc = m->setup(&b);
  if (!rc && m->warm) { /* as many ops as measured: the free lists and the engine's arrays at their size */
    rc = m->run(&b, a->ops) < 0;
    if (!rc && m->run_ref && !a->callgrind) rc = m->run_ref(&b, a->ops) < 0;
  }
  if (!rc) rc = a->callgrind ? callgrind_block(m, &b, name, a->ops) : timed_runs(a, m, &b, name, a->ops);
  if (!rc && m->after) m->after(&b);
  if (!rc && b.report[0]) fputs(b.report, stdout);
  em_teardown(&b);
  if (rc) fprintf(stderr, "engine_overhead: mode %s failed\n", name);
  return rc;
}

static void list_modes(void) {
  for (int i = 0; i < em_nmodes; i++) {
    const em_mode *m = &em_modes[i];
    if (!m->list) printf("%s\t%s\n", m->family, m->what);
    for (const long *p = m->list; p && *p; p++) printf("%s-%ld\t%s\n", m->family, *p, m->what);
  }
}

static int usage(const char *why) {
  fprintf(stderr,
          "engine_overhead: %s\n"
          "usage: engine_overhead [ops-per-run] [runs]                      pingpong, burst, coalesce (ns/op)\n"
          "       engine_overhead --callgrind                               the same, 10,000 ops each, under callgrind\n"
          "       engine_overhead [--callgrind] [--ops N] [--runs R] [--idle-ms MS] [--backend null|sim] [--pin] MODE...\n"
          "       engine_overhead --list                                    the modes, one a line\n",
          why);
  return 2;
}

static int number(const char *s, long lo, long hi, long *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  bench_args a = {.ops = 0, .runs = 9, .idle_ms = 1000, .backend = "null"};
  const char *names[256];
  int nnames = 0, legacy_pos = 0;
  char why[160];
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    long v;
    if (!strcmp(s, "--list")) {
      list_modes();
      return 0;
    } else if (!strcmp(s, "--callgrind")) {
      a.callgrind = 1;
    } else if (!strcmp(s, "--pin")) {
      a.pin = 1;
    } else if (!strcmp(s, "--backend")) {
      if (i + 1 >= argc || (strcmp(argv[i + 1], "null") && strcmp(argv[i + 1], "sim")))
        return usage("--backend needs null or sim");
      a.backend = argv[++i];
    } else if (!strcmp(s, "--ops") || !strcmp(s, "--runs") || !strcmp(s, "--idle-ms")) {
      long hi = !strcmp(s, "--runs") ? MAX_RUNS : 1L << 30;
      if (i + 1 >= argc || number(argv[i + 1], !strcmp(s, "--idle-ms") ? 0 : 1, hi, &v)) {
        snprintf(why, sizeof why, "%s needs a number from %d to %ld", s, !strcmp(s, "--idle-ms") ? 0 : 1, hi);
        return usage(why);
      }
      i++;
      if (!strcmp(s, "--ops")) a.ops = v;
      else if (!strcmp(s, "--runs")) a.runs = (int)v;
      else a.idle_ms = v;
    } else if (s[0] >= '0' && s[0] <= '9' && nnames == 0 && legacy_pos < 2) {
      /* issue 2's positional [ops-per-run] [runs] */
      if (number(s, 1, legacy_pos ? MAX_RUNS : 1L << 30, &v)) {
        snprintf(why, sizeof why, "'%s': %s must be a number from 1 to %ld", s,
                 legacy_pos ? "runs" : "ops-per-run", legacy_pos ? (long)MAX_RUNS : 1L << 30);
        return usage(why);
      }
      if (legacy_pos++) a.runs = (int)v;
      else a.ops = v;
    } else if (s[0] == '-') {
      snprintf(why, sizeof why, "unknown option '%s'", s);
      return usage(why);
    } else if (nnames < (int)(sizeof names / sizeof names[0])) {
      names[nnames++] = s;
    } else {
      return usage("too many modes on one command line");
    }
  }
  static const char *legacy_names[] = {"pingpong", "burst", "coalesce"};
  a.legacy = nnames == 0;
  if (a.legacy)
    for (int i = 0; i < 3; i++) names[nnames++] = legacy_names[i];
  if (!a.ops) a.ops = a.legacy && !a.callgrind ? 100000 : 10000; /* issue 2's: 100,000 timed, 10,000 in callgrind */
  setenv("NCFSM_BACKEND", a.backend, 1);

  const em_mode *modes[256];
  long params[256];
  for (int i = 0; i < nnames; i++)
    if (!(modes[i] = em_find(names[i], &params[i], why, sizeof why))) return usage(why);

  if (!a.callgrind) {
    if (a.legacy)
      printf("%-10s %10s %12s %12s   (%d runs of %ld ops, null backend)\n", "pattern", "ns/op", "min", "max",
             a.runs, a.ops);
    else
      printf("%-16s %10s %12s %12s %10s   (%d runs of about %ld ops, memory-P one of P; %s backend)\n", "mode",
             "ns/op", "min", "max", "ops", a.runs, a.ops, a.backend);
    fflush(stdout);
  }
  int failed = 0;
  for (int i = 0; i < nnames; i++) {
    failed += measure(&a, modes[i], params[i], names[i]) != 0;
    fflush(stdout);
  }
  if (a.callgrind) printf("callgrind: dumped %d blocks of about %ld ops each\n", nnames - failed, a.ops);
  return failed ? 1 : 0;
}
