/*
 * The testing kit (include/ncfsm/testing.h, docs/testing.md): a test's seed,
 * its fault plan (kept by the sim: core/sim/sim-faults.h), the recorder of
 * the engine's transitions as canonical text, and the checks.
 *
 * The recorder runs as the loop's trace callback, under the loop's lock: it
 * reads the comm's name and a work's comm from the engine's structures
 * (fsm/objects.h, read only) and calls nothing of ncfsm.
 */
#include <errno.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/settings.h"
#include "core/sim/sim-faults.h"
#include "fsm/objects.h"
#include "ncfsm/testing.h"

#define LABEL_LEN 80
#define MSG_LEN 8192
#define TAIL_LINES 25

typedef struct t_comm {
  const void *obj;
  int live;
  char label[LABEL_LEN];
  char name[64];
  int rank0;       /* rank of its first record: with the name, its generation key */
  uint64_t nworks; /* works submitted so far */
} t_comm;

typedef struct t_work {
  const void *obj;
  int live;
  int comm;        /* index in comms */
  uint64_t no;     /* w<no> */
  int finals;      /* final states reached */
  int after_final; /* transitions after the first final one */
} t_work;

typedef struct t_line {
  char *text;
  int kind;  /* NCFSM_OBJ_* */
  int comm;  /* index in comms */
  int rank;
  int state, next;
} t_line;

struct ncfsm_test {
  pthread_mutex_t mu;
  char name[64];
  uint64_t seed;
  int quiet;
  int failures;
  char last[MSG_LEN];
  t_line *lines;
  size_t n, cap;
  t_comm *comms;
  int ncomms, ccap;
  t_work *works;
  int nworks, wcap;
  int oom; /* a record was lost for lack of memory (reported by every check) */
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static ncfsm_test *g_active;

/* ---- seed ---------------------------------------------------------------------------------- */

static uint64_t fresh_seed(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t z = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z ? z : 1;
}

void ncfsm_test_opts_init(ncfsm_test_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->name = "test";
  o->seed = 1;
  o->deterministic = 1;
  o->poll_jitter = 3;
}

ncfsm_result_t ncfsm_test_begin(const ncfsm_test_opts *opts, ncfsm_test **out) {
  if (!out) return NCFSM_ERR_INVALID_ARGUMENT;
  *out = NULL;
  ncfsm_test_opts o;
  if (opts) o = *opts;
  else ncfsm_test_opts_init(&o);
  uint64_t seed = o.seed ? o.seed : fresh_seed();
  ncfsm__setting_val env; /* NCFSM_TEST_SEED: a number, or "random" (core/settings.def) */
  char why[400];
  if (ncfsm__setting_get(&ncfsm__settings[NCFSM__SET_TEST_SEED], &env, why, sizeof why) != 0) {
    fprintf(stderr, "ncfsm testing: %s\n", why);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (env.word == 0) seed = fresh_seed();
  else if (env.s) seed = env.u;
  ncfsm_test *t = calloc(1, sizeof *t);
  if (!t) return NCFSM_ERR_NO_MEMORY;
  pthread_mutex_init(&t->mu, NULL);
  snprintf(t->name, sizeof t->name, "%s", o.name && *o.name ? o.name : "test");
  t->seed = seed;
  t->quiet = o.quiet;
  pthread_mutex_lock(&g_mu);
  int busy = g_active != NULL || ncfsm__sim_plan_begin(seed, o.deterministic, o.poll_jitter) != 0;
  if (!busy) g_active = t;
  pthread_mutex_unlock(&g_mu);
  if (busy) {
    fprintf(stderr, "ncfsm testing: %s: another test is active in this process (the sim's fault plan is "
            "process-wide): end it with ncfsm_test_end first\n", t->name);
    pthread_mutex_destroy(&t->mu);
    free(t);
    return NCFSM_ERR_BUSY;
  }
  *out = t;
  return NCFSM_OK;
}

static void trace_free(ncfsm_test *t) {
  for (size_t i = 0; i < t->n; i++) free(t->lines[i].text);
  free(t->lines);
  free(t->comms);
  free(t->works);
  t->lines = NULL;
  t->comms = NULL;
  t->works = NULL;
  t->n = t->cap = 0;
  t->ncomms = t->ccap = t->nworks = t->wcap = 0;
  t->oom = 0;
}

int ncfsm_test_end(ncfsm_test *t) {
  if (!t) return -1;
  pthread_mutex_lock(&g_mu);
  if (g_active == t) {
    g_active = NULL;
    ncfsm__sim_plan_end();
  }
  pthread_mutex_unlock(&g_mu);
  int f = t->failures;
  trace_free(t);
  pthread_mutex_destroy(&t->mu);
  free(t);
  return f;
}

uint64_t ncfsm_test_seed(const ncfsm_test *t) { return t ? t->seed : 0; }

int ncfsm_test_failures(const ncfsm_test *t) {
  if (!t) return -1;
  pthread_mutex_lock((pthread_mutex_t *)&t->mu);
  int f = t->failures;
  pthread_mutex_unlock((pthread_mutex_t *)&t->mu);
  return f;
}

const char *ncfsm_test_last_failure(const ncfsm_test *t) { return t ? t->last : ""; }

/* ---- failures ------------------------------------------------------------------------------ */

/* Count a failure (t->mu held): the message, the trace's tail and the seed. */
static int vfail(ncfsm_test *t, const char *fmt, va_list ap) {
  size_t len = 0, cap = sizeof t->last;
  int w = snprintf(t->last, cap, "ncfsm testing: %s: FAILED: ", t->name);
  len = w > 0 && (size_t)w < cap ? (size_t)w : cap - 1;
  w = vsnprintf(t->last + len, cap - len, fmt, ap);
  len += w > 0 ? (size_t)w : 0;
  if (len >= cap) len = cap - 1;
  if (t->n && len < cap) {
    size_t from = t->n > TAIL_LINES ? t->n - TAIL_LINES : 0;
    w = snprintf(t->last + len, cap - len, "\nncfsm testing: the trace's last %zu of %zu lines:", t->n - from,
                 t->n);
    len += w > 0 ? (size_t)w : 0;
    for (size_t i = from; i < t->n && len < cap; i++) {
      w = snprintf(t->last + len, cap - len, "\n  %5zu  %s", i, t->lines[i].text);
      len += w > 0 ? (size_t)w : 0;
    }
  }
  if (len < cap) {
    w = snprintf(t->last + len, cap - len, "%s\nncfsm testing: seed %" PRIu64 " (replay: NCFSM_TEST_SEED=%" PRIu64 ")",
                 t->oom ? "\nncfsm testing: the recorder lost records (out of memory)" : "", t->seed, t->seed);
  }
  if (len >= cap) { /* keep the seed line visible when the message was cut */
    char tail[128];
    snprintf(tail, sizeof tail, "\n...\nncfsm testing: seed %" PRIu64 " (replay: NCFSM_TEST_SEED=%" PRIu64 ")",
             t->seed, t->seed);
    memcpy(t->last + cap - strlen(tail) - 1, tail, strlen(tail) + 1);
  }
  t->failures++;
  if (!t->quiet) fprintf(stderr, "%s\n", t->last);
  return -1;
}

static int fail(ncfsm_test *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(ncfsm_test *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vfail(t, fmt, ap);
  va_end(ap);
  return rc;
}

int ncfsm_test_check(ncfsm_test *t, int cond, const char *fmt, ...) {
  if (!t) return -1;
  if (cond) return 0;
  pthread_mutex_lock(&t->mu);
  va_list ap;
  va_start(ap, fmt);
  int rc = vfail(t, fmt, ap);
  va_end(ap);
  pthread_mutex_unlock(&t->mu);
  return rc;
}

/* ---- faults -------------------------------------------------------------------------------- */

void ncfsm_fault_init(ncfsm_fault *f, ncfsm_fault_kind_t kind) {
  if (!f) return;
  memset(f, 0, sizeof *f);
  f->kind = kind;
  f->rank = -1;
  f->when = NCFSM_AT_OP;
  f->state = NCFSM_STATE_LAUNCH_IN_PROGRESS;
  f->polls = 10;
}

static const char *const kind_names[] = {"ASYNC_ERROR", "INIT_FAIL", "INIT_HANG", "SLOW",
                                         "NEVER_ARRIVE", "DEAD", "MISMATCH", "KILL"};

/* The sim's phase of a comm state: the NCCL call its table row polls
 * (fsm/comm.def, column poll), or SIM_PH_NONE. */
static sim_phase phase_of_state(ncfsm_state_t s) {
  static const sim_phase of_call[] = {[NCFSM__PC_NONE] = SIM_PH_NONE,         [NCFSM__PC_INIT] = SIM_PH_INIT,
                                      [NCFSM__PC_LAUNCH] = SIM_PH_LAUNCH,     [NCFSM__PC_FINALIZE] = SIM_PH_FINALIZE,
                                      [NCFSM__PC_XCOMM] = SIM_PH_XCOMM,       [NCFSM__PC_REVOKE] = SIM_PH_REVOKE};
  return (unsigned)s < NCFSM_STATE_COUNT ? of_call[ncfsm__comm_cols[s].poll] : SIM_PH_NONE;
}

static const char *polled_states(char *buf, size_t n) {
  size_t k = 0;
  buf[0] = 0;
  for (unsigned s = 0; s < NCFSM_STATE_COUNT && k < n; s++)
    if (phase_of_state((ncfsm_state_t)s) != SIM_PH_NONE)
      k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", ncfsm_state_name((ncfsm_state_t)s));
  return buf;
}

int ncfsm_test_add_fault(ncfsm_test *t, const ncfsm_fault *f) {
  if (!t) return -1;
  pthread_mutex_lock(&t->mu);
  int id = -1;
  if (!f) {
    fail(t, "ncfsm_test_add_fault: fault is NULL");
  } else if ((unsigned)f->kind >= NCFSM_FAULT_KIND_COUNT) {
    fail(t, "ncfsm_test_add_fault: kind %d is not an ncfsm_fault_kind_t", (int)f->kind);
  } else if ((unsigned)f->when > NCFSM_AT_MS) {
    fail(t, "ncfsm_test_add_fault: %s: when %d is not an ncfsm_fault_when_t", kind_names[f->kind], (int)f->when);
  } else if (f->when == NCFSM_AT_STATE && phase_of_state(f->state) == SIM_PH_NONE) {
    char polled[512];
    fail(t, "ncfsm_test_add_fault: %s: AT_STATE needs a polled state (%s), not %s", kind_names[f->kind],
         polled_states(polled, sizeof polled),
         (unsigned)f->state < NCFSM_STATE_COUNT ? ncfsm_state_name(f->state) : "?");
  } else if (f->rank < -1) {
    fail(t, "ncfsm_test_add_fault: %s: rank %d (a rank, or -1 for every rank)", kind_names[f->kind], f->rank);
  } else if ((f->kind == NCFSM_FAULT_ASYNC_ERROR || f->kind == NCFSM_FAULT_INIT_FAIL) &&
             (f->code < 0 || f->code == NCFSM__NCCL_IN_PROGRESS || f->code > 8)) {
    fail(t, "ncfsm_test_add_fault: %s: code %d is not an ncclResult_t error (1..6 or 8; 0: the default)",
         kind_names[f->kind], f->code);
  } else if (f->kind == NCFSM_FAULT_MISMATCH && (unsigned)f->field > NCFSM_MISMATCH_OP) {
    fail(t, "ncfsm_test_add_fault: MISMATCH: field %d is not an ncfsm_mismatch_field_t", (int)f->field);
  } else if (f->comm && strlen(f->comm) >= 64) {
    fail(t, "ncfsm_test_add_fault: %s: comm name \"%.20s...\" is longer than a comm's name (63)",
         kind_names[f->kind], f->comm);
  } else {
    id = ncfsm__sim_plan_add_fault(f, phase_of_state(f->state));
    if (id < 0) fail(t, "ncfsm_test_add_fault: %s: out of memory", kind_names[f->kind]);
  }
  pthread_mutex_unlock(&t->mu);
  return id;
}

uint64_t ncfsm_test_fault_fired(const ncfsm_test *t, int id) { return t ? ncfsm__sim_plan_fired(id) : 0; }

ncfsm_result_t ncfsm_test_set_sim_opts(ncfsm_test *t, const char *comm, int rank, const ncfsm_sim_opts *so) {
  if (!t || !so || rank < -1 || (comm && strlen(comm) >= 64)) return NCFSM_ERR_INVALID_ARGUMENT;
  return ncfsm__sim_plan_set_opts(comm, rank, so) ? NCFSM_ERR_NO_MEMORY : NCFSM_OK;
}

/* ---- the recorder -------------------------------------------------------------------------- */

/* Room for one more of n elements of size sz in *v (capacity *cap). */
static int grow_array(void **v, int *cap, int n, size_t sz) {
  if (n < *cap) return 0;
  int ncap = *cap ? *cap * 2 : 16;
  void *nv = realloc(*v, (size_t)ncap * sz);
  if (!nv) return -1;
  *v = nv;
  *cap = ncap;
  return 0;
}

static int comm_ident(ncfsm_test *t, const ncfsm_comm *c, int rank, int fresh) {
  if (!fresh)
    for (int i = t->ncomms - 1; i >= 0; i--)
      if (t->comms[i].live && t->comms[i].obj == c) return i;
  for (int i = 0; i < t->ncomms; i++)
    if (t->comms[i].obj == c) t->comms[i].live = 0; /* a new comm at a reused address */
  if (grow_array((void **)&t->comms, &t->ccap, t->ncomms, sizeof *t->comms)) return -1;
  t_comm *x = &t->comms[t->ncomms];
  memset(x, 0, sizeof *x);
  x->obj = c;
  x->live = 1;
  x->rank0 = rank;
  snprintf(x->name, sizeof x->name, "%s", c && c->name[0] ? c->name : "comm");
  int gen = 0;
  for (int i = 0; i < t->ncomms; i++)
    if (t->comms[i].rank0 == rank && !strcmp(t->comms[i].name, x->name)) gen++;
  if (gen) snprintf(x->label, sizeof x->label, "%s.%d", x->name, gen);
  else snprintf(x->label, sizeof x->label, "%s", x->name);
  return t->ncomms++;
}

static int work_ident(ncfsm_test *t, const void *w, int ci, int fresh) {
  if (!fresh)
    for (int i = t->nworks - 1; i >= 0; i--)
      if (t->works[i].live && t->works[i].obj == w) return i;
  for (int i = 0; i < t->nworks; i++)
    if (t->works[i].obj == w) t->works[i].live = 0;
  if (ci < 0) return -1;
  if (grow_array((void **)&t->works, &t->wcap, t->nworks, sizeof *t->works)) return -1;
  t_work *x = &t->works[t->nworks];
  memset(x, 0, sizeof *x);
  x->obj = w;
  x->live = 1;
  x->comm = ci;
  x->no = t->comms[ci].nworks++;
  return t->nworks++;
}

static int work_final(int s) {
  return s == NCFSM_WORK_COMPLETED || s == NCFSM_WORK_FAILED || s == NCFSM_WORK_TIMED_OUT ||
         s == NCFSM_WORK_ABORTED;
}

static void add_line(ncfsm_test *t, const char *text, int kind, int ci, int rank, int state, int next) {
  if (t->n == t->cap) {
    size_t ncap = t->cap ? t->cap * 2 : 256;
    t_line *nv = realloc(t->lines, ncap * sizeof *nv);
    if (!nv) {
      t->oom = 1;
      return;
    }
    t->lines = nv;
    t->cap = ncap;
  }
  char *s = strdup(text);
  if (!s) {
    t->oom = 1;
    return;
  }
  t->lines[t->n++] = (t_line){s, kind, ci, rank, state, next};
}

static const char *st_name(int s) {
  return (unsigned)s < NCFSM_STATE_COUNT ? ncfsm_state_name((ncfsm_state_t)s) : "?";
}
static const char *wst_name(int s) {
  return (unsigned)s < NCFSM_WORK_STATE_COUNT ? ncfsm_work_state_name((ncfsm_work_state_t)s) : "?";
}

static void on_trace(const ncfsm_trace_rec *r, void *arg) {
  ncfsm_test *t = arg;
  char buf[320];
  pthread_mutex_lock(&t->mu);
  if (r->kind == NCFSM_OBJ_COMM) {
    int ci = comm_ident(t, r->object, r->rank, r->state == NCFSM_STATE_NEW);
    if (ci < 0) {
      t->oom = 1;
    } else {
      snprintf(buf, sizeof buf, "%s r%d: %s -%s-> %s %s", t->comms[ci].label, r->rank, st_name(r->state),
               (unsigned)r->event < NCFSM_EVENT_COUNT ? ncfsm_event_name((ncfsm_event_t)r->event) : "?",
               st_name(r->next), ncfsm_err_name(r->result));
      add_line(t, buf, NCFSM_OBJ_COMM, ci, r->rank, r->state, r->next);
    }
  } else if (r->kind == NCFSM_OBJ_WORK) {
    const ncfsm_work *w = r->object;
    int submit = r->state < 0;
    int wi = -1;
    if (submit) {
      int ci = comm_ident(t, w->comm, r->rank, 0);
      wi = ci < 0 ? -1 : work_ident(t, w, ci, 1);
    } else {
      wi = work_ident(t, w, -1, 0);
      if (wi < 0) { /* submitted before recording began */
        int ci = comm_ident(t, w->comm, r->rank, 0);
        wi = ci < 0 ? -1 : work_ident(t, w, ci, 1);
      }
    }
    if (wi < 0) {
      t->oom = 1;
    } else {
      t_work *x = &t->works[wi];
      if (x->finals) x->after_final++;
      if (work_final(r->next)) x->finals++;
      char seq[24] = "-";
      if (r->seq != NCFSM_SEQ_NONE) snprintf(seq, sizeof seq, "%" PRIu64, r->seq);
      snprintf(buf, sizeof buf, "%s r%d w%" PRIu64 " seq %s: %s -> %s%s%s", t->comms[x->comm].label, r->rank,
               x->no, seq, submit ? "-" : wst_name(r->state), wst_name(r->next), work_final(r->next) ? " " : "",
               work_final(r->next) ? ncfsm_err_name(r->result) : "");
      add_line(t, buf, NCFSM_OBJ_WORK, x->comm, r->rank, r->state, r->next);
    }
  }
  pthread_mutex_unlock(&t->mu);
}

ncfsm_result_t ncfsm_test_record(ncfsm_test *t, ncfsm_loop *loop) {
  if (!t || !loop) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop_set_trace(loop, on_trace, t);
  return NCFSM_OK;
}

void ncfsm_test_unrecord(ncfsm_test *t, ncfsm_loop *loop) {
  if (t && loop) ncfsm_loop_set_trace(loop, NULL, NULL);
}

size_t ncfsm_test_trace_len(const ncfsm_test *t) {
  if (!t) return 0;
  pthread_mutex_lock((pthread_mutex_t *)&t->mu);
  size_t n = t->n;
  pthread_mutex_unlock((pthread_mutex_t *)&t->mu);
  return n;
}

const char *ncfsm_test_trace_line(const ncfsm_test *t, size_t i) {
  if (!t) return NULL;
  pthread_mutex_lock((pthread_mutex_t *)&t->mu);
  const char *s = i < t->n ? t->lines[i].text : NULL;
  pthread_mutex_unlock((pthread_mutex_t *)&t->mu);
  return s;
}

char *ncfsm_test_trace_text(const ncfsm_test *t) {
  if (!t) return NULL;
  pthread_mutex_lock((pthread_mutex_t *)&t->mu);
  size_t len = 1;
  for (size_t i = 0; i < t->n; i++) len += strlen(t->lines[i].text) + 1;
  char *s = malloc(len), *p = s;
  if (s) {
    for (size_t i = 0; i < t->n; i++) {
      size_t l = strlen(t->lines[i].text);
      memcpy(p, t->lines[i].text, l);
      p[l] = '\n';
      p += l + 1;
    }
    *p = '\0';
  }
  pthread_mutex_unlock((pthread_mutex_t *)&t->mu);
  return s;
}

ncfsm_result_t ncfsm_test_trace_save(const ncfsm_test *t, const char *path) {
  if (!t || !path) return NCFSM_ERR_INVALID_ARGUMENT;
  char *s = ncfsm_test_trace_text(t);
  if (!s) return NCFSM_ERR_NO_MEMORY;
  FILE *f = fopen(path, "w");
  int ok = f && fputs(s, f) >= 0;
  if (f && fclose(f)) ok = 0;
  free(s);
  return ok ? NCFSM_OK : NCFSM_ERR_SYSTEM;
}

void ncfsm_test_trace_clear(ncfsm_test *t) {
  if (!t) return;
  pthread_mutex_lock(&t->mu);
  for (size_t i = 0; i < t->n; i++) free(t->lines[i].text);
  t->n = 0;
  /* identities stay: a comm or work seen before keeps its label and number */
  pthread_mutex_unlock(&t->mu);
}

/* t->mu held. */
static int path_of(const ncfsm_test *t, const char *name, int rank, char *buf, size_t len) {
  int n = 0;
  size_t at = 0;
  if (len) buf[0] = '\0';
  for (size_t i = 0; i < t->n; i++) {
    const t_line *l = &t->lines[i];
    if (l->kind != NCFSM_OBJ_COMM || l->rank != rank || strcmp(t->comms[l->comm].label, name)) continue;
    const char *s[2] = {st_name(l->state), st_name(l->next)};
    for (int k = n ? 1 : 0; k < 2; k++) {
      int w = len > at ? snprintf(buf + at, len - at, "%s%s", n ? " " : "", s[k]) : 0;
      at += w > 0 ? (size_t)w : 0;
      n++;
    }
  }
  return n ? n : -1;
}

int ncfsm_test_comm_path(const ncfsm_test *t, const char *name, int rank, char *buf, size_t len) {
  if (!t || !name || (!buf && len)) return -1;
  pthread_mutex_lock((pthread_mutex_t *)&t->mu);
  int n = path_of(t, name, rank, buf, len);
  pthread_mutex_unlock((pthread_mutex_t *)&t->mu);
  return n;
}

/* ---- checks -------------------------------------------------------------------------------- */

int ncfsm_test_expect_lines(ncfsm_test *t, const char *const *patterns, size_t n) {
  if (!t) return -1;
  pthread_mutex_lock(&t->mu);
  int rc = 0;
  size_t pos = 0;
  for (size_t k = 0; k < n && !rc; k++) {
    const char *p = patterns ? patterns[k] : NULL;
    if (!p) {
      rc = fail(t, "ncfsm_test_expect_lines: pattern %zu is NULL", k + 1);
      break;
    }
    size_t i = pos;
    while (i < t->n && fnmatch(p, t->lines[i].text, 0) != 0) i++;
    if (i == t->n) {
      if (k == 0)
        rc = fail(t, "expected a trace line matching \"%s\" (pattern 1 of %zu); none of the %zu lines does", p, n,
                  t->n);
      else
        rc = fail(t, "expected a trace line matching \"%s\" (pattern %zu of %zu) after line %zu (\"%s\", which "
                  "matched \"%s\"); none of the %zu lines after it does",
                  p, k + 1, n, pos - 1, t->lines[pos - 1].text, patterns[k - 1], t->n - pos);
    }
    pos = i + 1;
  }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

int ncfsm_test_expect_count(ncfsm_test *t, const char *pattern, size_t min, size_t max) {
  if (!t) return -1;
  pthread_mutex_lock(&t->mu);
  int rc = 0;
  if (!pattern) {
    rc = fail(t, "ncfsm_test_expect_count: pattern is NULL");
  } else {
    size_t c = 0;
    for (size_t i = 0; i < t->n; i++) c += fnmatch(pattern, t->lines[i].text, 0) == 0;
    if (c < min || c > max) {
      char range[64];
      if (min == max) snprintf(range, sizeof range, "exactly %zu", min);
      else if (max == SIZE_MAX) snprintf(range, sizeof range, "at least %zu", min);
      else snprintf(range, sizeof range, "%zu to %zu", min, max);
      rc = fail(t, "expected %s trace line(s) matching \"%s\", found %zu", range, pattern, c);
    }
  }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

int ncfsm_test_expect_path(ncfsm_test *t, const char *name, int rank, const char *pattern) {
  if (!t) return -1;
  pthread_mutex_lock(&t->mu);
  int rc = 0;
  if (!name || !pattern) {
    rc = fail(t, "ncfsm_test_expect_path: name or pattern is NULL");
  } else {
    char path[4096];
    int n = path_of(t, name, rank, path, sizeof path);
    if (n < 0) rc = fail(t, "expected comm \"%s\" rank %d in the trace: no line names it", name, rank);
    else if (fnmatch(pattern, path, 0) != 0)
      rc = fail(t, "comm \"%s\" rank %d: its states \"%s\" do not match \"%s\"", name, rank, path, pattern);
  }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

int ncfsm_test_expect_work(ncfsm_test *t, const ncfsm_work *w, ncfsm_work_state_t st, ncfsm_result_t status) {
  if (!t) return -1;
  if (!w) return ncfsm_test_check(t, 0, "ncfsm_test_expect_work: work is NULL");
  ncfsm_work_state_t got = ncfsm_work_state(w);
  ncfsm_result_t gs = ncfsm_work_status(w);
  const ncfsm_fingerprint_t *fp = ncfsm_work_fingerprint(w);
  char seq[24] = "-";
  if (fp && fp->seq != NCFSM_SEQ_NONE) snprintf(seq, sizeof seq, "%" PRIu64, fp->seq);
  return ncfsm_test_check(t, got == st && gs == status, "work (seq %s) is %s with status %s, expected %s with %s",
                          seq, wst_name(got), ncfsm_err_name(gs), wst_name(st), ncfsm_err_name(status));
}

int ncfsm_test_expect_final_once(ncfsm_test *t) {
  if (!t) return -1;
  pthread_mutex_lock(&t->mu);
  int rc = 0;
  for (int i = 0; i < t->nworks && !rc; i++) {
    const t_work *x = &t->works[i];
    if (x->finals != 1 || x->after_final)
      rc = fail(t, "work %s w%" PRIu64 " reached %d final state(s) and made %d transition(s) after its first; "
                "expected exactly one final state and nothing after it (of %d works recorded)",
                t->comms[x->comm].label, x->no, x->finals, x->after_final, t->nworks);
  }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

int ncfsm_test_expect_once(ncfsm_test *t, const char *what, const unsigned *counts, size_t n) {
  if (!t) return -1;
  if (!counts && n) return ncfsm_test_check(t, 0, "ncfsm_test_expect_once: counts is NULL");
  for (size_t i = 0; i < n; i++)
    if (counts[i] != 1)
      return ncfsm_test_check(t, 0, "%s %zu ran %u time(s), expected exactly once (%zu counted)",
                              what ? what : "callback", i, counts[i], n);
  return 0;
}

int ncfsm_test_expect_fired(ncfsm_test *t, int id, uint64_t min, uint64_t max) {
  if (!t) return -1;
  uint64_t n = ncfsm_test_fault_fired(t, id);
  return ncfsm_test_check(t, n >= min && n <= max,
                          "fault %d fired %" PRIu64 " time(s), expected %" PRIu64 "..%" PRIu64
                          " (a fault fires for comms created after it was added, when its trigger is reached)",
                          id, n, min, max);
}
