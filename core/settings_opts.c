/* The option structs from the settings table: ncfsm_comm_opts_init,
 * ncfsm_loop_opts_init, ncfsm_sim_opts_init and the bootstrap's fill, the
 * checks of options a user filled in, the checks of the rows that are read
 * where they are used (the backend choice, the sim's process-wide settings),
 * this thread's options error (ncfsm_opts_error), and the environment
 * helpers of code that does not read the table yet (ncfsm__env_ll,
 * ncfsm__env_str in core/log.h: the bootstrap and ncfsm-store). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/log.h"
#include "core/settings.h"

/* The enums' values are the indexes of their words in the table. */
_Static_assert(NCFSM_ON_ERROR_ABORT == 0 && NCFSM_ON_ERROR_STAY == 1 && NCFSM_ON_ERROR_EXIT == 2 &&
                   NCFSM_ON_ERROR_REVOKE == 3 && NCFSM_ON_ERROR_SHRINK == 4,
               "NCFSM_ON_ERROR words: abort|stay|exit|revoke|shrink");
_Static_assert(NCFSM_VERIFY_OFF == 0 && NCFSM_VERIFY_ASYNC == 1 && NCFSM_VERIFY_STRICT == 2,
               "NCFSM_VERIFY words: off|async|strict");
_Static_assert(NCFSM_VERIFY_CHANNEL_BOOTSTRAP == 0 && NCFSM_VERIFY_CHANNEL_NCCL == 1,
               "NCFSM_VERIFY_CHANNEL words: bootstrap|nccl");
_Static_assert(NCFSM_OVERLAP_REJECT == 0 && NCFSM_OVERLAP_WARN == 1 && NCFSM_OVERLAP_OFF == 2,
               "NCFSM_OVERLAP words: reject|warn|off");
_Static_assert(NCFSM_COMPLETION_POLL == 0 && NCFSM_COMPLETION_PUSH == 1 && NCFSM_COMPLETION_AUTO == 2,
               "NCFSM_COMPLETION words: poll|push|auto");
_Static_assert(NCFSM_BACKEND_AUTO == 0 && NCFSM_BACKEND_SIM == 1 && NCFSM_BACKEND_NCCL == 2,
               "ncfsm_comm_opts.backend words: auto|sim|nccl");
_Static_assert(NCFSM_BOOT_AUTO == 0 && NCFSM_BOOT_PMIX == 1 && NCFSM_BOOT_TCP == 2 && NCFSM_BOOT_LOCAL == 3,
               "NCFSM_BOOTSTRAP words: auto|pmix|tcp|local");

/* ---- this thread's options error ---------------------------------------------------------------- */

static _Thread_local char opts_err[512];

const char *ncfsm_opts_error(void) { return opts_err; }

void ncfsm__opts_error_clear(void) { opts_err[0] = '\0'; }

/* The first error of a call is the one kept. */
static void opts_error(const char *msg) {
  if (opts_err[0]) return;
  snprintf(opts_err, sizeof opts_err, "%s", msg);
  ncfsm__last_error_set(opts_err);
}

static unsigned log_subsys(ncfsm__subsys_id id) {
  switch (id) {
  case NCFSM__SS_COMM: return NCFSM__SUB_FSM;
  case NCFSM__SS_LOOP: return NCFSM__SUB_LOOP;
  case NCFSM__SS_BACKEND: return NCFSM__SUB_BACKEND;
  case NCFSM__SS_SIM: return NCFSM__SUB_SIM;
  case NCFSM__SS_BOOT:
  case NCFSM__SS_STORE: return NCFSM__SUB_BOOT;
  default: return NCFSM__SUB_ALL;
  }
}

static int get_warn(const ncfsm__setting *s, ncfsm__setting_val *v, char *err, size_t len) {
  if (ncfsm__setting_get(s, v, err, len) == 0) return 0;
  NCFSM_WARN(log_subsys(s->subsys), "%s", err);
  return -1;
}

ncfsm_result_t ncfsm__setting_env(ncfsm__setting_id id, ncfsm__setting_val *out) {
  char err[400];
  return get_warn(&ncfsm__settings[id], out, err, sizeof err) ? NCFSM_ERR_INVALID_ARGUMENT : NCFSM_OK;
}

/* ---- fields ---------------------------------------------------------------------------------------- */

static int is_text(ncfsm__setting_type t) {
  return t == NCFSM__T_STR || t == NCFSM__T_PATH || t == NCFSM__T_ADDR || t == NCFSM__T_SECRET;
}

static void field_store(const ncfsm__setting *s, void *base, const ncfsm__setting_val *v) {
  char *p = (char *)base + s->offset;
  if (is_text(s->type)) {
    const char *t = v->s;
    memcpy(p, &t, sizeof t);
  } else if (s->size == 4) {
    uint32_t x = s->type == NCFSM__T_INT ? (uint32_t)(int32_t)v->i : (uint32_t)v->u;
    memcpy(p, &x, sizeof x);
  } else {
    uint64_t x = s->type == NCFSM__T_INT ? (uint64_t)v->i : v->u;
    memcpy(p, &x, sizeof x);
  }
}

/* A number field: its value as signed (INT) or unsigned. */
static void field_load(const ncfsm__setting *s, const void *base, int64_t *i, uint64_t *u) {
  const char *p = (const char *)base + s->offset;
  if (s->size == 4) {
    uint32_t x;
    memcpy(&x, p, sizeof x);
    *i = (int32_t)x;
    *u = x;
  } else {
    uint64_t x;
    memcpy(&x, p, sizeof x);
    *i = (int64_t)x;
    *u = x;
  }
}

static ncfsm_result_t fill(ncfsm__opts_struct st, void *base) {
  ncfsm_result_t r = NCFSM_OK;
  for (int k = 0; k < NCFSM__SET_COUNT; k++) {
    const ncfsm__setting *s = &ncfsm__settings[k];
    if (s->st != st) continue;
    ncfsm__setting_val v;
    char err[400];
    if (get_warn(s, &v, err, sizeof err) != 0) {
      opts_error(err);
      r = NCFSM_ERR_INVALID_ARGUMENT;
    }
    field_store(s, base, &v);
  }
  return r;
}

static int word_count(const char *words) {
  int n = 1;
  for (const char *p = words; (p = strchr(p, '|')); p++) n++;
  return n;
}

static ncfsm_result_t check(ncfsm__opts_struct st, const void *base, const char *call, const char *init) {
  ncfsm__opts_error_clear();
  for (int k = 0; k < NCFSM__SET_COUNT; k++) {
    const ncfsm__setting *s = &ncfsm__settings[k];
    if (s->st != st || is_text(s->type) || s->type == NCFSM__T_BOOL) continue; /* a bool field: 0 or not */
    int64_t i;
    uint64_t u;
    field_load(s, base, &i, &u);
    char acc[256], msg[512], val[32];
    const char *why = "out of range";
    if (s->type == NCFSM__T_ENUM) {
      if (u < (uint64_t)word_count(s->words)) continue;
      char words[200];
      ncfsm__setting_accepted(s, words, sizeof words);
      snprintf(acc, sizeof acc, "0..%d, %s", word_count(s->words) - 1, words + strlen("one of "));
      snprintf(val, sizeof val, "%" PRId64, i);
      why = "not an accepted value";
    } else if (s->type == NCFSM__T_INT) {
      if (i >= s->min && i <= (int64_t)s->max) continue;
      ncfsm__setting_accepted(s, acc, sizeof acc);
      snprintf(val, sizeof val, "%" PRId64, i);
    } else {
      if (u >= (uint64_t)s->min && u <= s->max) continue;
      if (u == 0 && s->words) continue; /* the row's word (core/settings.def) */
      ncfsm__setting_accepted(s, acc, sizeof acc);
      snprintf(val, sizeof val, "%" PRIu64, u);
    }
    snprintf(msg, sizeof msg, "%s: %s = %s: %s (accepted: %s%s%s); start from %s", call, s->field, val, why, acc,
             s->env ? ", as " : "", s->env ? s->env : "", init);
    NCFSM_WARN(log_subsys(s->subsys), "%s", msg);
    opts_error(msg);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  return NCFSM_OK;
}

/* ---- rows read where they are used ------------------------------------------------------------- */

int ncfsm__settings_env_check(ncfsm__subsys_id ss, char *err, size_t len) {
  for (int k = 0; k < NCFSM__SET_COUNT; k++) {
    const ncfsm__setting *s = &ncfsm__settings[k];
    if (s->subsys != ss || !s->env || s->st != NCFSM__ST_NONE) continue;
    ncfsm__setting_val v;
    if (ncfsm__setting_get(s, &v, err, len) != 0) return -1;
  }
  return 0;
}

/* The first refused value of a call: logged, kept as its options error. */
static ncfsm_result_t refused(ncfsm__subsys_id ss, const char *err) {
  NCFSM_WARN(log_subsys(ss), "%s", err);
  opts_error(err);
  return NCFSM_ERR_INVALID_ARGUMENT;
}

static ncfsm_result_t env_rows(ncfsm__subsys_id ss) {
  char err[400];
  return ncfsm__settings_env_check(ss, err, sizeof err) ? refused(ss, err) : NCFSM_OK;
}

/* Both results: the first failure. */
static ncfsm_result_t first(ncfsm_result_t a, ncfsm_result_t b) { return a != NCFSM_OK ? a : b; }

static ncfsm_result_t check_row(ncfsm__setting_id id) {
  ncfsm__setting_val v;
  char err[400];
  return ncfsm__setting_get(&ncfsm__settings[id], &v, err, sizeof err) ? refused(ncfsm__settings[id].subsys, err)
                                                                       : NCFSM_OK;
}

/* NCFSM_BACKEND picks the backend of a comm whose backend is auto; the nccl
 * backend (auto may pick it) reads NCFSM_PUSH_WAKE. */
static ncfsm_result_t backend_rows(ncfsm_backend_kind_t kind) {
  ncfsm_result_t r = kind == NCFSM_BACKEND_AUTO ? check_row(NCFSM__SET_BACKEND) : NCFSM_OK;
  return kind == NCFSM_BACKEND_SIM ? r : first(r, check_row(NCFSM__SET_PUSH_WAKE));
}

ncfsm_result_t ncfsm__backend_env_check(ncfsm_backend_kind_t kind) {
  ncfsm__opts_error_clear();
  return backend_rows(kind);
}

/* ---- the option structs --------------------------------------------------------------------------- */

/* The body of every *_opts_init: this thread's error cleared, the struct
 * zeroed, then every field from the table. */
static ncfsm_result_t init(ncfsm__opts_struct st, void *o, size_t size, const char *fn) {
  ncfsm__log_init();
  ncfsm__opts_error_clear();
  if (!o) {
    char msg[96];
    snprintf(msg, sizeof msg, "%s: o is NULL", fn);
    opts_error(msg);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  memset(o, 0, size);
  return fill(st, o);
}

ncfsm_result_t ncfsm_comm_opts_init(ncfsm_comm_opts *o) {
  ncfsm_result_t r = init(NCFSM__ST_COMM, o, sizeof *o, "ncfsm_comm_opts_init");
  return o ? first(r, backend_rows(o->backend)) : r;
}

ncfsm_result_t ncfsm_loop_opts_init(ncfsm_loop_opts *o) {
  return init(NCFSM__ST_LOOP, o, sizeof *o, "ncfsm_loop_opts_init");
}

ncfsm_result_t ncfsm__boot_opts_fill(ncfsm_boot_opts *o) {
  return init(NCFSM__ST_BOOT, o, sizeof *o, "ncfsm_boot_opts_init");
}

ncfsm_result_t ncfsm_sim_opts_init(ncfsm_sim_opts *o) {
  ncfsm_result_t r = init(NCFSM__ST_SIM, o, sizeof *o, "ncfsm_sim_opts_init");
  if (!o) return r;
  ncfsm__setting_val v; /* refused: the default, and env_rows reports it */
  char err[400];
  ncfsm__setting_get(&ncfsm__settings[NCFSM__SET_SIM_NCCL_VERSION], &v, err, sizeof err);
  if (v.u >= 22900) o->has_grow = 1; /* ncclCommGrow: 2.29 */
  return first(r, env_rows(NCFSM__SS_SIM));
}

ncfsm_result_t ncfsm__comm_opts_check(const ncfsm_comm_opts *o, const char *call) {
  ncfsm_result_t r = check(NCFSM__ST_COMM, o, call, "ncfsm_comm_opts_init");
  return r != NCFSM_OK ? r : backend_rows(o->backend);
}

ncfsm_result_t ncfsm__loop_opts_check(const ncfsm_loop_opts *o, const char *call) {
  return check(NCFSM__ST_LOOP, o, call, "ncfsm_loop_opts_init");
}

ncfsm_result_t ncfsm__sim_opts_check(const ncfsm_sim_opts *o, const char *call) {
  ncfsm_result_t r = check(NCFSM__ST_SIM, o, call, "ncfsm_sim_opts_init");
  return r != NCFSM_OK ? r : env_rows(NCFSM__SS_SIM);
}

/* ---- helpers of readers not on the table yet ------------------------------------------------------ */

/* Unset or empty: dflt. A variable with a row: parsed by the table; a bad
 * value is logged (the table's message) and a number falls back to dflt,
 * text is passed on (the reader's own check refuses it, as before). */
static const ncfsm__setting *env_row(const char *name, const char **v) {
  *v = getenv(name);
  if (!*v || !**v) return NULL;
  const ncfsm__setting *s = ncfsm__setting_find(name);
  if (!s) NCFSM_WARN(NCFSM__SUB_ALL, "internal: %s is read but has no row in core/settings.def", name);
  return s;
}

long long ncfsm__env_ll(const char *name, long long dflt) {
  const char *v;
  const ncfsm__setting *s = env_row(name, &v);
  if (!s) {
    if (!v || !*v) return dflt;
    char *end;
    long long x = strtoll(v, &end, 0);
    return *end ? dflt : x;
  }
  ncfsm__setting_val x;
  char err[400];
  if (ncfsm__setting_parse(s, v, &x, err, sizeof err) != 0) {
    NCFSM_WARN(log_subsys(s->subsys), "%s; using %lld", err, dflt);
    return dflt;
  }
  return s->type == NCFSM__T_INT ? (long long)x.i : (long long)x.u;
}

const char *ncfsm__env_str(const char *name, const char *dflt) {
  const char *v;
  const ncfsm__setting *s = env_row(name, &v);
  if (!v || !*v) return dflt;
  ncfsm__setting_val x;
  char err[400];
  if (s && ncfsm__setting_parse(s, v, &x, err, sizeof err) != 0) NCFSM_WARN(log_subsys(s->subsys), "%s", err);
  return v;
}
