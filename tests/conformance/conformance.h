/*
 * The conformance suite (ncfsm-conformance): the rules of docs/nccl-rules.md
 * (R1-R8, R12) run three ways
 * on two ranks driven by one thread (2 GPUs with --backend nccl, 2 sim ranks
 * with --backend sim):
 *
 *   raw    the backend interface called directly, as a program using NCCL
 *          would (on nccl: what NCCL returns; on sim: what the model returns)
 *   ncfsm  the same intent through the public ncfsm API (what the state
 *          table decides: rejected or deferred before the backend, data, health)
 *
 * Every scenario records four short strings per mode (return codes, async
 * states, data check, final health) plus free-form measured info, and the
 * harness compares them with the expectation (evaluate.c).
 *
 * Files (docs/conformance.md, "Layout"):
 *   conformance.h      this: types shared by all files
 *   harness.c          main, options, the runner (a fresh thread per scenario)
 *   evaluate.c         an observation against its expectation: PASS, KNOWN,
 *                      VARIES or FAIL
 *   check.c            consistency of the tables (run before every run)
 *   report.c           JSON and Markdown of one run (jansson)
 *   table.c            --recheck of recorded runs, and --table (the table of
 *                      docs/conformance.md from several recorded runs)
 *   registry.c         the scenarios in run order
 *   util.c             strings, clock, buffers through the backend
 *   raw_util.c         raw-mode building blocks (init, poll, group, health)
 *   ncfsm_util.c       ncfsm-mode building blocks
 *   scen_*.c           one file per rule family: the scenario code, its raw
 *                      expectation (from the rule) and, for a raw row whose
 *                      outcome varies on real NCCL, every observed outcome
 *   expect_ncfsm.c     EVERY ncfsm-mode expectation (engine semantics)
 *   known.c            known differences (NCCL vs the raw expectation, sim vs NCCL),
 *                      each with the results file that shows it
 */
#ifndef NCFSM_CONFORMANCE_H
#define NCFSM_CONFORMANCE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/backend.h"
#include "ncfsm.h"
#include "ncfsm/sim.h"

#define NR 2           /* ranks */
#define NI (1u << 20)  /* int32 elements of the ordinary buffers (4 MiB) */
#define R12N (4u << 20) /* R12: 16 MiB of int32 */
#define BIGN (64u << 20) /* 256 MiB of float: abort and event scenarios */

enum { M_RAW = 0, M_NCFSM = 1, M_COUNT };
extern const char *const mode_name[M_COUNT];

/* ---- one observation ------------------------------------------------------------- */

typedef struct obs {
  char rc[640], async[320], data[160], health[160], info[480];
} obs_t;

typedef struct ctx {
  const ncfsm__backend *be;
  const char *bname; /* "nccl" or "sim" (from the JSON with --recheck) */
  ncfsm_backend_kind_t kind;
  int is_sim;
  int version;
  unsigned features;
  uint64_t timeout_ms; /* bound of every wait inside a scenario */
  ncfsm_sim_opts so;   /* sim: per-scenario copy */
  ncfsm_state_cb on_state; /* ninit: state callback of rank 0 (NULL: none) */
  void *on_state_arg;
} ctx_t;

typedef void (*scen_fn)(ctx_t *, obs_t *);

/* ---- expectations ------------------------------------------------------------------- */

/* The four compared fields; a NULL or empty field is not compared. */
typedef struct exp_s {
  const char *rc, *async, *data, *health;
} exp_t;

/* A raw-NCCL row whose outcome varies run to run on real NCCL (timing inside
 * NCCL): every whole observation seen, each with where it was seen. A run
 * whose observation equals one of them (all four fields) is VARIES, not
 * FAIL. Only raw rows on the nccl backend may vary: check.c refuses to run
 * with an entry for another mode or backend, and evaluate.c consults it only
 * for raw on nccl, so ncfsm rows and sim rows fail on any deviation. */
typedef struct outcome {
  exp_t obs;
  const char *note;        /* what happened, in words */
  const char *evidence[4]; /* files (from the repository root) that show it */
} outcome_t;

typedef struct varies {
  const char *mode;    /* must be "raw" */
  const char *backend; /* must be "nccl" */
  const outcome_t *outcomes;
  int n;
} varies_t;

typedef struct scen {
  const char *id, *rule, *title;
  scen_fn fn[M_COUNT];
  exp_t raw;           /* raw expectation, written from the rule (docs/nccl-rules.md) */
  exp_t raw_norevoke;  /* raw, when the runtime has no ncclCommRevoke (.rc NULL: none) */
  const varies_t *varies; /* raw on nccl only (see outcome_t); NULL: exact match */
  int sim_only;           /* runs on the sim only */
  int sim_has_revoke;     /* -1: leave the sim default */
  int sim_launch_polls;   /* > 0: sim launch_polls for this scenario (ncfsm mode) */
  int sim_version;        /* > 0: NCFSM_SIM_NCCL_VERSION for this scenario (process-wide) */
  const char *skip;       /* never runs: why */
  int rev[M_COUNT];       /* revision of each mode's code (0 means 1): a recorded result of
                           * another revision is STALE (--recheck) */
} scen_t;

static inline int scen_rev(const scen_t *s, int m) { return s->rev[m] ? s->rev[m] : 1; }

/* expect_ncfsm.c: the ncfsm-mode expectation of every scenario that runs in
 * ncfsm mode, in one place, with the engine behaviour it depends on. */
typedef struct ncfsm_expect {
  const char *scenario;
  exp_t exp;
  exp_t norevoke;      /* when the comm has no Revoke (.rc NULL: none) */
  const char *depends; /* engine semantics this expectation encodes */
} ncfsm_expect_t;
extern const ncfsm_expect_t ncfsm_expectations[];
extern const int ncfsm_nexpectations;

/* known.c: an explained disagreement between NCCL and the raw expectation, or between
 * the sim and NCCL, documented by a results file; matches only this exact
 * field observation of this scenario, mode and backend. An ncfsm-mode entry
 * may only name the sim (a difference of the sim by design): on real NCCL an
 * ncfsm row fails on any deviation. */
typedef struct known {
  const char *scenario, *mode, *backend, *field, *observed, *reason;
  const char *evidence[4]; /* files (from the repository root) that show it */
} known_t;
extern const known_t knowns[];
extern const int nknowns;

/* ---- registry.c, check.c ----------------------------------------------------------------- */

extern const scen_t *const scenarios[];
extern const int nscenarios;
/* Consistency of the tables: 0 when fine, else -1 with a message in err.
 * source_dir (may be NULL): also check that every evidence file exists. */
int registry_check(const scen_t *const *scens, int nscen, const ncfsm_expect_t *ne, int nne, const known_t *k,
                   int nk, const char *source_dir, char *err, size_t errlen);

/* ---- util.c ----------------------------------------------------------------------------- */

void ap(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define AP(field, ...) ap(o->field, sizeof o->field, __VA_ARGS__)
double now_ms(void);
const char *rn(int code);            /* "ncclInvalidArgument" -> "InvalidArgument" */
const char *fn_(ncfsm_result_t r);   /* "NCFSM_ERR_ILLEGAL_STATE" -> "ILLEGAL_STATE" */
const char *stn(ncfsm_comm *c);      /* state name */
void *rmalloc(ctx_t *x, int dev, size_t bytes);
void rfree(ctx_t *x, int dev, void *p);
int rcopy(ctx_t *x, int dev, void *dst, const void *src, size_t bytes, int to_dev);
int fill_i32(ctx_t *x, int dev, void *p, size_t n, int32_t v);
int check_i32(ctx_t *x, int dev, const void *p, size_t n, int32_t v, int32_t *first);
int fill_f32(ctx_t *x, int dev, void *p, size_t n, float v);
int check_f32(ctx_t *x, int dev, const void *p, size_t n, float v);

/* ---- raw_util.c ------------------------------------------------------------------------- */

typedef struct rset {
  void *c[NR];
  void *s[NR];
  int32_t *buf[NR][3];
  int blocking;
} rset_t;

int rpoll(ctx_t *x, void *comm, int *npolls);
void rpoll_all(ctx_t *x, void **c, int n, int *st);
int rwait_stream(ctx_t *x, int dev, void *stream);
int rop(ctx_t *x, void *comm, ncfsm_opkind_t k, const void *s, void *r, size_t count, ncfsm_dtype_t dt, int root,
        void *stream);
int rinit(ctx_t *x, rset_t *rs, int blocking, obs_t *o, const char *tag, int record);
int ralloc(ctx_t *x, rset_t *rs, int nbuf, size_t n);
void rhealth(ctx_t *x, rset_t *rs, obs_t *o);
void rfini(ctx_t *x, rset_t *rs);
int rgroup_ar(ctx_t *x, rset_t *rs, int b, size_t n, int *oprc);
int rwait_all(ctx_t *x, rset_t *rs);
int rcheck(ctx_t *x, rset_t *rs, int b, size_t n, int32_t v);
const char *lasterr(ctx_t *x, void *c);

/* ---- ncfsm_util.c ----------------------------------------------------------------------- */

typedef struct nset {
  ncfsm_loop *loop;
  ncfsm_comm *c[NR];
  void *buf[NR][3];
  int launch_pending; /* LAUNCH_PENDING transitions seen on rank 0 */
} nset_t;

int ninit(ctx_t *x, nset_t *ns, int blocking, int timing, obs_t *o, int record);
int nalloc(nset_t *ns, int nbuf, size_t bytes);
int nfill(ctx_t *x, nset_t *ns, int b, size_t n, int32_t v0);
int ncheck(ctx_t *x, nset_t *ns, int b, size_t n, int32_t v);
void nhealth(ncfsm_comm **cs, int n, obs_t *o);
void nfini(nset_t *ns);
ncfsm_result_t ngroup_ar(nset_t *ns, int b, size_t n, ncfsm_work **w, ncfsm_result_t *orc);
void nwait_release(ctx_t *x, ncfsm_work **w, int n, ncfsm_result_t *st);
int nturns_until(ctx_t *x, nset_t *ns, int (*pred)(void *), void *arg);
int pred_launch_ip(void *a);
uint64_t nbackend_calls(ncfsm_comm *c);

/* ---- evaluate.c, report.c, table.c ----------------------------------------------------------- */

typedef struct result {
  const scen_t *s;
  int mode;
  obs_t o;
  const char *verdict; /* PASS, KNOWN, VARIES, FAIL, SKIP (--recheck: also STALE, NOT-RUN) */
  char why[2400];
  double ms;
  int rev;           /* revision of the scenario code that produced the observation */
  unsigned features; /* backend features the scenario ran with (a sim scenario may drop Revoke) */
} result_t;

typedef struct totals {
  int pass, known, varies, fail, skip; /* skip: SKIP, STALE, NOT-RUN */
} totals_t;

/* The expectation of scenario s in mode m for a runtime with these features
 * (NULL: the scenario has none for it). */
const exp_t *scen_expectation(const scen_t *s, int m, unsigned features);
const ncfsm_expect_t *ncfsm_expectation_of(const char *scenario);
/* The features scenario s ran with in a recorded run that did not write them
 * per row (files before the per-row "features"): a sim scenario may drop
 * Revoke (sim_has_revoke = 0, or a modelled NCCL before 2.28.7). */
unsigned scen_features_fallback(const scen_t *s, int is_sim, unsigned run_features);
/* Compare r->o with the expectation; sets r->verdict and r->why. backend:
 * "nccl" or "sim". Returns 0 PASS, 1 KNOWN, 2 VARIES, 3 FAIL. */
int evaluate(const char *backend, unsigned features, const scen_t *s, int m, result_t *r);
void totals_add(totals_t *t, const char *verdict);
void md_escape(FILE *f, const char *s); /* | -> \\| */
void write_md(FILE *f, const ctx_t *x, const result_t *res, int nres, const totals_t *t);
void emit(const ctx_t *x, const result_t *res, int nres, const totals_t *t, const char *md, const char *json);
/* --recheck FILE: a recorded run against the current expectations. */
int recheck(const char *file, const char *md, const char *json_out);
/* --table LABEL=FILE ...: one Markdown table over several recorded runs. */
int table(int nfiles, char **files, FILE *out);

#endif
