/* The settings table (core/settings.def) and its strict parser: every row
 * accepts its documented values and refuses malformed ones (driven by the
 * table itself), the option structs come from it and agree with the code
 * that does not read it yet, options from the caller are checked, the
 * misconfigurations measured in issue 23 are refused by name, and each row
 * of the sim and of the backend choice is refused at the calls that read it
 * and has its default when unset, where the sim and the backend use it. */
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/tcp-internal.h"
#include "core/log.h"
#include "core/settings.h"
#include "core/sim/sim-comm.h"
#include "helpers.h"
#include "ncfsm/bootstrap.h"

static const ncfsm__setting *row(ncfsm__setting_id id) { return &ncfsm__settings[id]; }

/* Every variable of the table unset: the tests see the defaults. */
static int clean_env(void **state) {
  (void)state;
  for (int i = 0; i < NCFSM__SET_COUNT; i++)
    if (ncfsm__settings[i].env) unsetenv(ncfsm__settings[i].env);
  return 0;
}

/* text through the environment (rows with a variable) or the parser. */
static int parse(const ncfsm__setting *s, const char *text, ncfsm__setting_val *v, char *err, size_t len) {
  if (!s->env) return ncfsm__setting_parse(s, text, v, err, len);
  setenv(s->env, text, 1);
  int rc = ncfsm__setting_get(s, v, err, len);
  unsetenv(s->env);
  return rc;
}

static void accepts(const ncfsm__setting *s, const char *text) {
  ncfsm__setting_val v;
  char err[512];
  if (parse(s, text, &v, err, sizeof err) != 0) fail_msg("%s=%s refused: %s", s->key, text, err);
}

/* Refused, and the message has the shape every setting's error has:
 * "NAME=VALUE: why (accepted: ...); unset it or set e.g. NAME=EXAMPLE", and
 * the example is accepted. */
static void refuses(const ncfsm__setting *s, const char *text) {
  ncfsm__setting_val v;
  char err[512], head[256], tail[128];
  if (parse(s, text, &v, err, sizeof err) == 0) fail_msg("%s=%s accepted", s->key, text);
  const char *name = s->env ? s->env : s->field;
  snprintf(head, sizeof head, "%s=%s: ", name, text);
  if (strncmp(err, head, strlen(head)) != 0) fail_msg("message does not start with '%s': %s", head, err);
  if (!strstr(err, " (accepted: ")) fail_msg("message names nothing accepted: %s", err);
  snprintf(tail, sizeof tail, "; unset it or set e.g. %s=", name);
  const char *ex = strstr(err, tail);
  if (!ex) fail_msg("message says nothing to do: %s", err);
  ex += strlen(tail);
  ncfsm__setting_val ev;
  char eerr[512];
  if (ncfsm__setting_parse(s, ex, &ev, eerr, sizeof eerr) != 0) fail_msg("the example %s is refused: %s", ex, eerr);
}

static int is_number(ncfsm__setting_type t) {
  return t == NCFSM__T_BOOL || t == NCFSM__T_INT || t == NCFSM__T_UINT || t == NCFSM__T_MS ||
         t == NCFSM__T_US || t == NCFSM__T_BYTES;
}

static int word(const char *words, int i, char *buf, size_t len) {
  const char *p = words;
  for (; p && i > 0; i--)
    if ((p = strchr(p, '|'))) p++;
  if (!p) return 0;
  size_t n = strcspn(p, "|");
  snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), p);
  return 1;
}

static void number_row(const ncfsm__setting *s) {
  char b[64];
  if (s->type == NCFSM__T_INT) {
    snprintf(b, sizeof b, "%" PRId64, s->min);
    accepts(s, b);
    snprintf(b, sizeof b, "%" PRId64, (int64_t)s->max);
    accepts(s, b);
    if (s->min > INT64_MIN) {
      snprintf(b, sizeof b, "%" PRId64, s->min - 1);
      refuses(s, b);
    }
    if ((int64_t)s->max < INT64_MAX) {
      snprintf(b, sizeof b, "%" PRId64, (int64_t)s->max + 1);
      refuses(s, b);
    } else {
      refuses(s, "9223372036854775808");
    }
  } else {
    snprintf(b, sizeof b, "%" PRIu64, (uint64_t)s->min);
    accepts(s, b);
    snprintf(b, sizeof b, "%" PRIu64, s->max);
    accepts(s, b);
    snprintf(b, sizeof b, "0x%" PRIx64, s->max);
    accepts(s, b);
    if (s->min > 0) {
      snprintf(b, sizeof b, "%" PRIu64, (uint64_t)s->min - 1);
      refuses(s, b);
    }
    if (s->max < UINT64_MAX) {
      snprintf(b, sizeof b, "%" PRIu64, s->max + 1);
      refuses(s, b);
    } else {
      refuses(s, "18446744073709551616"); /* 2^64 */
    }
    refuses(s, "-1");
    refuses(s, "-0");
  }
  snprintf(b, sizeof b, "%" PRIu64, (uint64_t)s->min + (s->max > (uint64_t)s->min));
  char sp[80];
  snprintf(sp, sizeof sp, " %s", b);
  refuses(s, sp); /* no spaces */
  snprintf(sp, sizeof sp, "%s ", b);
  refuses(s, sp);
  snprintf(sp, sizeof sp, "+%s", b);
  refuses(s, sp); /* no sign */
  snprintf(sp, sizeof sp, "%sx", b);
  refuses(s, sp); /* no trailing garbage */
  snprintf(sp, sizeof sp, "%ss", b);
  refuses(s, sp); /* no unit */
  refuses(s, "0x");
  refuses(s, "1.5");
  refuses(s, "abc");
  refuses(s, "lots");
  if (s->words) {
    char w[64];
    for (int i = 0; word(s->words, i, w, sizeof w); i++) accepts(s, w);
  }
}

static void word_row(const ncfsm__setting *s) {
  char w[64], b[160], first[64];
  assert_true(word(s->words, 0, first, sizeof first));
  for (int i = 0; word(s->words, i, w, sizeof w); i++) {
    accepts(s, w);
    for (char *p = w; *p; p++) *p = (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
    accepts(s, w); /* case is ignored */
    word(s->words, i, w, sizeof w);
    snprintf(b, sizeof b, "%sx", w);
    refuses(s, b);
    snprintf(b, sizeof b, " %s", w);
    refuses(s, b);
    if (strlen(w) > 1) {
      snprintf(b, sizeof b, "%.*s", (int)strlen(w) - 1, w);
      refuses(s, b); /* no prefix */
    }
  }
  refuses(s, "maybe");
  refuses(s, "1");
  if (s->type == NCFSM__T_LIST) {
    char second[64];
    if (word(s->words, 1, second, sizeof second)) {
      snprintf(b, sizeof b, "%s,%s", first, second);
      accepts(s, b);
    }
    snprintf(b, sizeof b, "%s,", first);
    refuses(s, b);
    snprintf(b, sizeof b, ",%s", first);
    refuses(s, b);
    snprintf(b, sizeof b, "%s,,%s", first, first);
    refuses(s, b);
  } else {
    snprintf(b, sizeof b, "%s,%s", first, first);
    refuses(s, b);
  }
}

/* Every row: its default parses, its documented values are accepted and
 * malformed ones refused, with a message of the common shape. */
static void test_every_row(void **state) {
  (void)state;
  int rows = 0, envs = 0;
  for (int i = 0; i < NCFSM__SET_COUNT; i++) {
    const ncfsm__setting *s = &ncfsm__settings[i];
    rows++;
    envs += s->env != NULL;
    assert_non_null(s->effect);
    assert_true(strlen(s->effect) > 10);
    ncfsm__setting_val v;
    char err[512];
    if (ncfsm__setting_parse(s, s->dflt, &v, err, sizeof err) != 0) fail_msg("%s: default refused: %s", s->key, err);
    if (s->env) { /* empty is unset: the default */
      setenv(s->env, "", 1);
      assert_int_equal(ncfsm__setting_get(s, &v, err, sizeof err), 0);
      assert_int_equal(v.from_env, 0);
      unsetenv(s->env);
    }
    if (is_number(s->type)) {
      if (s->type == NCFSM__T_INT) assert_true(s->min <= (int64_t)s->max);
      else assert_true((uint64_t)s->min <= s->max);
      number_row(s);
    } else if (s->type == NCFSM__T_ENUM || s->type == NCFSM__T_LIST) {
      assert_non_null(s->words);
      word_row(s);
    } else if (s->type == NCFSM__T_ADDR) {
      accepts(s, "127.0.0.1:29500");
      accepts(s, "127.0.0.1:0");
      accepts(s, "store.example:65535");
      accepts(s, "[::1]:29500");
      refuses(s, "127.0.0.1:99999");
      refuses(s, "127.0.0.1:65536");
      refuses(s, "127.0.0.1");
      refuses(s, "127.0.0.1:");
      refuses(s, ":29500");
      refuses(s, "::1:29500");
      refuses(s, "127.0.0.1:-1");
      refuses(s, "127.0.0.1:29500x");
      refuses(s, "local host:1");
    } else {
      accepts(s, "anything at all, even 12x");
    }
  }
  print_message("settings: %d rows, %d environment variables\n", rows, envs);
  assert_true(envs >= 64); /* ncfsm-info listed 25 of about 64 before the table */
}

/* A field's range fits the field: a value the parser accepts is stored whole. */
static void test_fields_fit(void **state) {
  (void)state;
  for (int i = 0; i < NCFSM__SET_COUNT; i++) {
    const ncfsm__setting *s = &ncfsm__settings[i];
    if (s->st == NCFSM__ST_NONE) {
      assert_int_equal(s->size, 0);
      continue;
    }
    assert_non_null(s->field);
    if (s->type == NCFSM__T_STR || s->type == NCFSM__T_PATH || s->type == NCFSM__T_ADDR || s->type == NCFSM__T_SECRET) {
      assert_int_equal(s->size, sizeof(const char *));
    } else if (s->size == 4) {
      if (s->type == NCFSM__T_INT) assert_true(s->min >= INT32_MIN && s->max <= INT32_MAX);
      else assert_true(s->max <= UINT32_MAX);
    } else {
      assert_int_equal(s->size, 8);
    }
  }
}

/* The defaults of the table are those of the code: the public constant, the
 * sim's documented defaults (docs/sim.md), and the bootstrap's and the
 * store's own initialisers (which do not read the table yet). */
static void test_defaults_agree(void **state) {
  (void)state;
  char b[32];
  snprintf(b, sizeof b, "%u", NCFSM_DEFAULT_TIMEOUT_MS);
  assert_string_equal(row(NCFSM__SET_TIMEOUT_MS)->dflt, b);

  ncfsm_sim_opts a;
  assert_int_equal(ncfsm_sim_opts_init(&a), NCFSM_OK);
  assert_string_equal(ncfsm_opts_error(), "");
  const ncfsm_sim_opts doc = {.init_polls = 3, .launch_polls = 1, .finalize_polls = 2, .revoke_polls = 1,
                              .group_end_inprogress = 1, .fail_init = 0, .async_error_at_op = -1,
                              .async_error_code = 6, .never_arrive = 0, .shuffle_seed = 1, .has_revoke = 1,
                              .split_polls = 2, .has_grow = 0, .dead = 0};
  assert_memory_equal(&a, &doc, sizeof a);

  ncfsm_boot_opts ba, bt;
  ncfsm_boot_opts_init(&ba);
  assert_int_equal(ncfsm__boot_opts_fill(&bt), NCFSM_OK);
  for (int i = 0; i < NCFSM__SET_COUNT; i++) {
    const ncfsm__setting *s = &ncfsm__settings[i];
    if (s->st != NCFSM__ST_BOOT) continue;
    const char *pa = (const char *)&ba + s->offset, *pt = (const char *)&bt + s->offset;
    if (s->size == sizeof(const char *) && (s->type == NCFSM__T_STR || s->type == NCFSM__T_ADDR || s->type == NCFSM__T_SECRET)) {
      const char *x, *y;
      memcpy(&x, pa, sizeof x);
      memcpy(&y, pt, sizeof y);
      if (!x || !y) assert_ptr_equal(x, y);
      else assert_string_equal(x, y);
    } else if (memcmp(pa, pt, s->size)) {
      fail_msg("%s: ncfsm_boot_opts_init and the table disagree", s->field);
    }
  }

  ncfsm__store_opts so;
  ncfsm__store_opts_init(&so);
  ncfsm__store_opts_env(&so);
  const struct { ncfsm__setting_id id; uint64_t v; } store[] = {
      {NCFSM__SET_STORE_VALUE_MAX, so.value_max},
      {NCFSM__SET_STORE_MAX_BYTES, so.max_bytes},
      {NCFSM__SET_STORE_AUTH_TIMEOUT_MS, so.auth_timeout_ms},
      {NCFSM__SET_STORE_FRAME_TIMEOUT_MS, so.frame_timeout_ms},
      {NCFSM__SET_STORE_MAX_INFLIGHT, so.max_inflight},
      {NCFSM__SET_STORE_OUT_HIGH, so.out_high},
      {NCFSM__SET_STORE_OUT_MAX, so.out_max},
      {NCFSM__SET_STORE_OUT_STALL_MS, so.out_stall_ms},
      {NCFSM__SET_STORE_MAX_OUT, so.max_out},
      {NCFSM__SET_STORE_MAX_PARKED, so.max_parked},
      {NCFSM__SET_STORE_AUTH_FAIL_BURST, so.auth_fail_burst},
      {NCFSM__SET_STORE_AUTH_FAIL_PER_S, so.auth_fail_per_s},
      {NCFSM__SET_STORE_REJOIN, (uint64_t)so.rejoin},
      {NCFSM__SET_STORE_RANK_SECRETS, (uint64_t)so.rank_secrets},
      {NCFSM__SET_STORE_ALLOW_REMOTE, (uint64_t)so.allow_remote},
  };
  for (size_t i = 0; i < sizeof store / sizeof store[0]; i++) {
    snprintf(b, sizeof b, "%" PRIu64, store[i].v);
    if (strcmp(row(store[i].id)->dflt, b)) fail_msg("%s: the store's default %s, the table's %s", row(store[i].id)->env, b,
                                                    row(store[i].id)->dflt);
  }
  assert_null(row(NCFSM__SET_STORE_MAX_CONNS)->dflt); /* 0 in the store: the open-file limit minus 64 */
  assert_int_equal(so.max_conns, 0);
}

/* The measured cases of issue 23, by name: each refused with a message that
 * names the variable, the value and what is accepted; the field keeps its
 * default (NCFSM_COMPLETION=fast: auto, not poll). */
static void test_issue23_cases(void **state) {
  (void)state;
  ncfsm_comm_opts co;
  ncfsm_loop_opts lo;
  setenv("NCFSM_TIMEOUT_MS", "-5", 1);
  assert_int_equal(ncfsm_comm_opts_init(&co), NCFSM_ERR_INVALID_ARGUMENT);
  assert_string_equal(ncfsm_opts_error(), "NCFSM_TIMEOUT_MS=-5: not a duration in ms (accepted: 0 = off, or "
                                          "1..31536000000); unset it or set e.g. NCFSM_TIMEOUT_MS=600000");
  assert_int_equal(co.timeout_ms, NCFSM_DEFAULT_TIMEOUT_MS);
  static const char *const bad_timeouts[] = {"abc", "10s", "18446744073709551611", "1e3", "0600000x"};
  for (size_t i = 0; i < sizeof bad_timeouts / sizeof bad_timeouts[0]; i++) {
    setenv("NCFSM_TIMEOUT_MS", bad_timeouts[i], 1);
    assert_int_equal(ncfsm_comm_opts_init(&co), NCFSM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ncfsm_opts_error(), "NCFSM_TIMEOUT_MS="));
    assert_non_null(strstr(ncfsm_opts_error(), bad_timeouts[i]));
  }
  setenv("NCFSM_TIMEOUT_MS", "0", 1);
  assert_int_equal(ncfsm_comm_opts_init(&co), NCFSM_OK);
  assert_int_equal(co.timeout_ms, 0); /* 0 = off, on purpose */
  assert_string_equal(ncfsm_opts_error(), "");
  unsetenv("NCFSM_TIMEOUT_MS");

  setenv("NCFSM_ON_ERROR", "explode", 1);
  assert_int_equal(ncfsm_comm_opts_init(&co), NCFSM_ERR_INVALID_ARGUMENT);
  assert_string_equal(ncfsm_opts_error(), "NCFSM_ON_ERROR=explode: not an accepted word (accepted: one of abort, stay, "
                                          "exit, revoke, shrink); unset it or set e.g. NCFSM_ON_ERROR=abort");
  assert_int_equal(co.on_error, NCFSM_ON_ERROR_ABORT);
  setenv("NCFSM_ON_ERROR", "shrink", 1); /* ncfsm-info called it unknown before the table */
  assert_int_equal(ncfsm_comm_opts_init(&co), NCFSM_OK);
  assert_int_equal(co.on_error, NCFSM_ON_ERROR_SHRINK);
  unsetenv("NCFSM_ON_ERROR");

  setenv("NCFSM_TRACE_BUFFER", "lots", 1);
  assert_int_equal(ncfsm_comm_opts_init(&co), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_opts_error(), "NCFSM_TRACE_BUFFER=lots: not a whole number (accepted: 0 = off, or 1.."));
  assert_int_equal(co.trace_buffer, 2048);
  unsetenv("NCFSM_TRACE_BUFFER");

  setenv("NCFSM_OVERLAP", "maybe", 1);
  assert_int_equal(ncfsm_loop_opts_init(&lo), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_opts_error(), "NCFSM_OVERLAP=maybe: not an accepted word (accepted: one of reject, warn, off)"));
  assert_int_equal(lo.overlap, NCFSM_OVERLAP_REJECT);
  unsetenv("NCFSM_OVERLAP");

  setenv("NCFSM_COMPLETION", "fast", 1);
  assert_int_equal(ncfsm_loop_opts_init(&lo), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_opts_error(), "NCFSM_COMPLETION=fast: not an accepted word (accepted: one of poll, push, auto)"));
  assert_int_equal(lo.completion, NCFSM_COMPLETION_AUTO);
  unsetenv("NCFSM_COMPLETION");

  /* NCFSM_DEBUG is read once at load, by the same row. */
  ncfsm__setting_val v;
  char err[512];
  setenv("NCFSM_DEBUG", "LOUD", 1);
  assert_int_equal(ncfsm__setting_get(row(NCFSM__SET_DEBUG), &v, err, sizeof err), -1);
  assert_string_equal(err, "NCFSM_DEBUG=LOUD: not an accepted word (accepted: one of NONE, ERROR, WARN, INFO, TRACE); "
                           "unset it or set e.g. NCFSM_DEBUG=WARN");
  setenv("NCFSM_DEBUG", "info", 1);
  assert_int_equal(ncfsm__setting_get(row(NCFSM__SET_DEBUG), &v, err, sizeof err), 0);
  assert_int_equal((int)v.u, NCFSM__LOG_INFO);
  unsetenv("NCFSM_DEBUG");

  /* The first bad value is the one kept; every one is refused. */
  setenv("NCFSM_BLOCKING", "yes", 1);
  setenv("NCFSM_VERIFY", "sometimes", 1);
  assert_int_equal(ncfsm_comm_opts_init(&co), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_opts_error(), "NCFSM_BLOCKING=yes: not 0 or 1"));
  unsetenv("NCFSM_BLOCKING");
  assert_int_equal(ncfsm_comm_opts_init(&co), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_opts_error(), "NCFSM_VERIFY=sometimes"));
  unsetenv("NCFSM_VERIFY");
  assert_int_equal(ncfsm_comm_opts_init(&co), NCFSM_OK);
  assert_string_equal(ncfsm_opts_error(), "");
}

/* NULL options: the calls that fill them from the environment fail with the
 * message; ncfsm_comm_new also puts it in the loop's last error. */
static void test_calls_refuse_bad_env(void **state) {
  (void)state;
  ncfsm_loop *loop = NULL;
  setenv("NCFSM_COMPLETION", "fast", 1);
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_ERR_INVALID_ARGUMENT);
  assert_null(loop);
  assert_non_null(strstr(ncfsm_opts_error(), "NCFSM_COMPLETION=fast"));
  unsetenv("NCFSM_COMPLETION");
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);

  ncfsm_comm *c = NULL;
  setenv("NCFSM_TIMEOUT_MS", "-5", 1);
  assert_int_equal(ncfsm_comm_new(loop, NULL, &c), NCFSM_ERR_INVALID_ARGUMENT);
  assert_null(c);
  assert_non_null(strstr(ncfsm_loop_last_error(loop), "NCFSM_TIMEOUT_MS=-5: not a duration in ms"));
  assert_string_equal(ncfsm_loop_last_error(loop), ncfsm_opts_error());
  ncfsm_comm *cs[2] = {NULL, NULL};
  assert_int_equal(ncfsm_comm_init_all(loop, 2, NULL, NULL, cs), NCFSM_ERR_INVALID_ARGUMENT);
  assert_null(cs[0]);
  assert_non_null(strstr(ncfsm_loop_last_error(loop), "NCFSM_TIMEOUT_MS=-5"));
  unsetenv("NCFSM_TIMEOUT_MS");

  /* A bad sim variable fails a comm whose opts.sim is NULL. */
  ncfsm_comm_opts o;
  assert_int_equal(ncfsm_comm_opts_init(&o), NCFSM_OK);
  o.backend = NCFSM_BACKEND_SIM;
  setenv("NCFSM_SIM_INIT_POLLS", "-1", 1);
  assert_int_equal(ncfsm_comm_new(loop, &o, &c), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_opts_error(), "NCFSM_SIM_INIT_POLLS=-1: out of range (accepted: 0..2147483647)"));
  unsetenv("NCFSM_SIM_INIT_POLLS");
  assert_int_equal(ncfsm_comm_new(loop, &o, &c), NCFSM_OK);
  assert_string_equal(ncfsm_opts_error(), "");
  ncfsm_comm_release(c);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* Options from the caller: every field in its range, or refused by name. */
static void test_user_opts_checked(void **state) {
  (void)state;
  ncfsm_loop *loop = NULL;
  ncfsm_loop_opts lo;
  assert_int_equal(ncfsm_loop_opts_init(&lo), NCFSM_OK);
  lo.completion = 7;
  assert_int_equal(ncfsm_loop_new(&lo, &loop), NCFSM_ERR_INVALID_ARGUMENT);
  assert_null(loop);
  assert_string_equal(ncfsm_opts_error(), "ncfsm_loop_new: ncfsm_loop_opts.completion = 7: not an accepted value "
                                          "(accepted: 0..2, poll, push, auto, as NCFSM_COMPLETION); start from "
                                          "ncfsm_loop_opts_init");
  assert_int_equal(ncfsm_loop_opts_init(&lo), NCFSM_OK);
  lo.poll_max_us = 0;
  assert_int_equal(ncfsm_loop_new(&lo, &loop), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_opts_error(), "ncfsm_loop_opts.poll_max_us = 0: out of range (accepted: 1..60000000"));
  assert_int_equal(ncfsm_loop_opts_init(&lo), NCFSM_OK);
  lo.overlap = (ncfsm_overlap_policy_t)-1;
  struct event_base *base = event_base_new();
  assert_non_null(base);
  assert_int_equal(ncfsm_loop_new_embedded(base, &lo, &loop), NCFSM_ERR_INVALID_ARGUMENT);
  event_base_free(base);
  assert_non_null(strstr(ncfsm_opts_error(), "ncfsm_loop_opts.overlap = -1: not an accepted value"));
  assert_int_equal(ncfsm_loop_opts_init(&lo), NCFSM_OK);
  assert_int_equal(ncfsm_loop_new(&lo, &loop), NCFSM_OK);
  assert_string_equal(ncfsm_opts_error(), "");

  ncfsm_comm_opts o;
  ncfsm_comm *c = NULL;
  const struct { const char *field; size_t off; uint64_t bad; int eight; } cases[] = {
      {"ncfsm_comm_opts.on_error = 9", offsetof(ncfsm_comm_opts, on_error), 9, 0},
      {"ncfsm_comm_opts.backend = 5", offsetof(ncfsm_comm_opts, backend), 5, 0},
      {"ncfsm_comm_opts.verify = 3", offsetof(ncfsm_comm_opts, verify), 3, 0},
      {"ncfsm_comm_opts.verify_window = 0", offsetof(ncfsm_comm_opts, verify_window), 0, 0},
      {"ncfsm_comm_opts.trace_buffer = 2000000", offsetof(ncfsm_comm_opts, trace_buffer), 2000000, 0},
      {"ncfsm_comm_opts.device = -1", offsetof(ncfsm_comm_opts, device), (uint32_t)-1, 0},
      {"ncfsm_comm_opts.timeout_ms = 18446744073709551611", offsetof(ncfsm_comm_opts, timeout_ms), (uint64_t)-5, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_int_equal(ncfsm_comm_opts_init(&o), NCFSM_OK);
    if (cases[i].eight) memcpy((char *)&o + cases[i].off, &cases[i].bad, 8);
    else {
      uint32_t x = (uint32_t)cases[i].bad;
      memcpy((char *)&o + cases[i].off, &x, 4);
    }
    assert_int_equal(ncfsm_comm_new(loop, &o, &c), NCFSM_ERR_INVALID_ARGUMENT);
    assert_null(c);
    if (!strstr(ncfsm_opts_error(), cases[i].field)) fail_msg("'%s' does not name %s", ncfsm_opts_error(), cases[i].field);
    assert_non_null(strstr(ncfsm_opts_error(), "ncfsm_comm_new: "));
    assert_non_null(strstr(ncfsm_opts_error(), "start from ncfsm_comm_opts_init"));
    assert_string_equal(ncfsm_loop_last_error(loop), ncfsm_opts_error());
  }
  ncfsm_sim_opts so;
  assert_int_equal(ncfsm_sim_opts_init(&so), NCFSM_OK);
  so.launch_polls = -2;
  assert_int_equal(ncfsm_comm_opts_init(&o), NCFSM_OK);
  o.backend = NCFSM_BACKEND_SIM;
  o.sim = &so;
  assert_int_equal(ncfsm_comm_new(loop, &o, &c), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_opts_error(), "ncfsm_sim_opts.launch_polls = -2: out of range"));
  so.launch_polls = NEVER;
  o.blocking = 2; /* a bool field: true */
  o.name = "checked";
  assert_int_equal(ncfsm_comm_new(loop, &o, &c), NCFSM_OK);
  ncfsm_comm_release(c);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* ncfsm_sim_opts_init: NCFSM_SIM_* and the version's has_grow. */
static void test_sim_fill(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  setenv("NCFSM_SIM_NCCL_VERSION", "22900", 1);
  setenv("NCFSM_SIM_SEED", "0xffffffffffffffff", 1);
  assert_int_equal(ncfsm_sim_opts_init(&so), NCFSM_OK);
  assert_int_equal(so.has_grow, 1);
  assert_true(so.shuffle_seed == UINT64_MAX);
  setenv("NCFSM_SIM_NCCL_VERSION", "2.29.0", 1);
  assert_int_equal(ncfsm_sim_opts_init(&so), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_opts_error(), "NCFSM_SIM_NCCL_VERSION=2.29.0: not a whole number (accepted: 21400..23299)"));
  assert_int_equal(so.has_grow, 0);
  unsetenv("NCFSM_SIM_NCCL_VERSION");
  unsetenv("NCFSM_SIM_SEED");
  assert_int_equal(ncfsm_sim_opts_init(NULL), NCFSM_ERR_INVALID_ARGUMENT);
  assert_string_equal(ncfsm_opts_error(), "ncfsm_sim_opts_init: o is NULL");
}

/* ---- each row of the sim and of the backend choice -------------------------------------------- */

typedef struct bad_case {
  ncfsm__setting_id id;
  const char *bad, *msg; /* a malformed value and its whole message */
} bad_case;

#define MSG(var, val, why, acc, ex) var "=" val ": " why " (accepted: " acc "); unset it or set e.g. " var "=" ex

static const bad_case sim_bad[] = {
    {NCFSM__SET_SIM_INIT_POLLS, "abc", MSG("NCFSM_SIM_INIT_POLLS", "abc", "not an integer", "0..2147483647", "3")},
    {NCFSM__SET_SIM_INIT_POLLS, "-1", MSG("NCFSM_SIM_INIT_POLLS", "-1", "out of range", "0..2147483647", "3")},
    {NCFSM__SET_SIM_LAUNCH_POLLS, "-3", MSG("NCFSM_SIM_LAUNCH_POLLS", "-3", "out of range", "0..2147483647", "1")},
    {NCFSM__SET_SIM_FINALIZE_POLLS, "2x", MSG("NCFSM_SIM_FINALIZE_POLLS", "2x", "not an integer", "0..2147483647", "2")},
    {NCFSM__SET_SIM_GROUP_END_INPROGRESS, "yes",
     MSG("NCFSM_SIM_GROUP_END_INPROGRESS", "yes", "not 0 or 1", "0 or 1", "1")},
    {NCFSM__SET_SIM_SEED, "-1", MSG("NCFSM_SIM_SEED", "-1", "not a whole number", "0..18446744073709551615", "1")},
    {NCFSM__SET_SIM_SPLIT_POLLS, "-2", MSG("NCFSM_SIM_SPLIT_POLLS", "-2", "out of range", "0..2147483647", "2")},
    {NCFSM__SET_SIM_NCCL_VERSION, "2.28.9",
     MSG("NCFSM_SIM_NCCL_VERSION", "2.28.9", "not a whole number", "21400..23299", "22809")},
    {NCFSM__SET_SIM_NCCL_VERSION, "21399", MSG("NCFSM_SIM_NCCL_VERSION", "21399", "out of range", "21400..23299", "22809")},
    {NCFSM__SET_SIM_NCCL_VERSION, "23300", MSG("NCFSM_SIM_NCCL_VERSION", "23300", "out of range", "21400..23299", "22809")},
    {NCFSM__SET_SIM_WAIT_MS, "0", MSG("NCFSM_SIM_WAIT_MS", "0", "out of range", "1..86400000", "30000")},
    {NCFSM__SET_SIM_WAIT_MS, "30s", MSG("NCFSM_SIM_WAIT_MS", "30s", "not a duration in ms", "1..86400000", "30000")},
    {NCFSM__SET_SIM_DRIFT_LIMIT, "-1",
     MSG("NCFSM_SIM_DRIFT_LIMIT", "-1", "out of range", "0 = off, or 1..2147483647", "1022")},
    {NCFSM__SET_SIM_SHM_BYTES, "1000",
     MSG("NCFSM_SIM_SHM_BYTES", "1000", "out of range", "65536..68719476736", "268435456")},
    {NCFSM__SET_SIM_SHM_BYTES, "256M",
     MSG("NCFSM_SIM_SHM_BYTES", "256M", "not a size in bytes", "65536..68719476736", "268435456")},
    {NCFSM__SET_SIM_MISMATCH, "crash",
     MSG("NCFSM_SIM_MISMATCH", "crash", "not an accepted word", "one of nccl, hang", "nccl")},
};

/* Each sim row with a variable is in the cases above. */
static void test_sim_rows_covered(void **state) {
  (void)state;
  for (int i = 0; i < NCFSM__SET_COUNT; i++) {
    const ncfsm__setting *s = &ncfsm__settings[i];
    if (s->subsys != NCFSM__SS_SIM || s->src != NCFSM__SRC_ENV) continue;
    int found = 0;
    for (size_t k = 0; k < sizeof sim_bad / sizeof sim_bad[0]; k++) found |= sim_bad[k].id == (ncfsm__setting_id)i;
    if (!found) fail_msg("%s has no case in sim_bad", s->env);
  }
}

/* A malformed value: ncfsm_sim_opts_init refuses it with the message and
 * every field keeps its default; ncfsm_comm_new refuses it (the loop's last
 * error is the message), and so does the sim's own init (ncclInvalidArgument,
 * the message as its WARN), with no sim options, and for the rows read where
 * the sim uses them also with the caller's (which hold the fields); unset
 * again, everything is accepted. */
static void test_sim_rows_refused(void **state) {
  (void)state;
  ncfsm_sim_opts dflt, so, user;
  assert_int_equal(ncfsm_sim_opts_init(&dflt), NCFSM_OK);
  assert_int_equal(ncfsm_sim_opts_init(&user), NCFSM_OK);
  ncfsm_loop *loop = NULL;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_comm_opts o;
  assert_int_equal(ncfsm_comm_opts_init(&o), NCFSM_OK);
  o.backend = NCFSM_BACKEND_SIM;
  for (size_t k = 0; k < sizeof sim_bad / sizeof sim_bad[0]; k++) {
    const bad_case *b = &sim_bad[k];
    const char *var = ncfsm__settings[b->id].env;
    int process_wide = ncfsm__settings[b->id].st == NCFSM__ST_NONE;
    setenv(var, b->bad, 1);
    memset(&so, 0x5a, sizeof so);
    assert_int_equal(ncfsm_sim_opts_init(&so), NCFSM_ERR_INVALID_ARGUMENT);
    assert_string_equal(ncfsm_opts_error(), b->msg);
    if (memcmp(&so, &dflt, sizeof so)) fail_msg("%s=%s: a field lost its default", var, b->bad);
    for (int with_sim = 0; with_sim <= process_wide; with_sim++) {
      ncfsm_comm *c = NULL;
      o.sim = with_sim ? &user : NULL;
      if (ncfsm_comm_new(loop, &o, &c) != NCFSM_ERR_INVALID_ARGUMENT)
        fail_msg("%s=%s: ncfsm_comm_new with opts.sim %s accepted it", var, b->bad, with_sim ? "set" : "NULL");
      assert_null(c);
      assert_string_equal(ncfsm_opts_error(), b->msg);
      assert_string_equal(ncfsm_loop_last_error(loop), b->msg);

      ncfsm_unique_id id;
      assert_int_equal(ncfsm__backend_sim.get_unique_id(&id), OK);
      ncfsm__comm_config cfg = {1, 0, with_sim ? &user : NULL, "bad"};
      void *bc = (void *)&cfg;
      assert_int_equal(ncfsm__backend_sim.comm_init(&bc, 1, &id, 0, &cfg), E_ARG);
      assert_null(bc);
      char want[600];
      snprintf(want, sizeof want, "ncclCommInitRank: %s", b->msg);
      assert_string_equal(ncfsm__backend_sim.last_error(NULL), want);
    }
    if (!process_wide) { /* the caller's fields: the variable is not read */
      ncfsm_comm *c = NULL;
      o.sim = &user;
      assert_int_equal(ncfsm_comm_new(loop, &o, &c), NCFSM_OK);
      ncfsm_comm_release(c);
    }
    unsetenv(var);
    assert_int_equal(ncfsm_sim_opts_init(&so), NCFSM_OK);
    assert_memory_equal(&so, &dflt, sizeof so);
  }
  ncfsm_comm *c = NULL;
  o.sim = NULL;
  assert_int_equal(ncfsm_comm_new(loop, &o, &c), NCFSM_OK);
  assert_string_equal(ncfsm_opts_error(), "");
  ncfsm_comm_release(c);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* A blocking one-rank raw sim comm. */
static void *raw_comm(ncfsm__comm_config *cfg) {
  ncfsm_unique_id id;
  assert_int_equal(ncfsm__backend_sim.get_unique_id(&id), OK);
  void *bc = NULL;
  assert_int_equal(ncfsm__backend_sim.comm_init(&bc, 1, &id, 0, cfg), OK);
  assert_non_null(bc);
  return bc;
}

/* The process-wide rows where the sim uses them: unset, their defaults;
 * set, their values; refused there (the environment changed after the
 * calls above checked it), the default; and a split made after the change
 * is refused. */
static void test_sim_process_rows(void **state) {
  (void)state;
  ncfsm_sim_opts so;
  assert_int_equal(ncfsm_sim_opts_init(&so), NCFSM_OK);
  ncfsm__comm_config cfg = {1, 0, &so, "rows"};
  assert_int_equal(ncfsm__sim_wait_ms(), 30000);
  assert_int_equal(ncfsm__sim_version(), 22809);
  assert_int_equal(ncfsm__backend_sim.version(), 22809);
  assert_true(ncfsm__backend_sim.features() & NCFSM__HAS_REVOKE);
  sim_comm *c = raw_comm(&cfg);
  assert_int_equal(c->drift_limit, 1022);
  assert_int_equal(c->q->h->arena_len, 268435456);
  assert_int_equal(c->q->h->mismatch, SIM_MISMATCH_NCCL);

  setenv("NCFSM_SIM_WAIT_MS", "200", 1);
  setenv("NCFSM_SIM_NCCL_VERSION", "22803", 1);
  setenv("NCFSM_SIM_DRIFT_LIMIT", "0", 1);
  setenv("NCFSM_SIM_SHM_BYTES", "65537", 1);
  setenv("NCFSM_SIM_MISMATCH", "HANG", 1);
  assert_int_equal(ncfsm__sim_wait_ms(), 200);
  assert_int_equal(ncfsm__backend_sim.version(), 22803);
  assert_false(ncfsm__backend_sim.features() & NCFSM__HAS_REVOKE);
  sim_comm *d = raw_comm(&cfg);
  assert_int_equal(d->drift_limit, 0);
  assert_int_equal(d->q->h->arena_len, 69632); /* rounded up to 4096 */
  assert_int_equal(d->q->h->mismatch, SIM_MISMATCH_HANG);
  assert_int_equal(ncfsm__backend_sim.abort(d), OK);

  setenv("NCFSM_SIM_WAIT_MS", "-1", 1);
  setenv("NCFSM_SIM_NCCL_VERSION", "lots", 1);
  assert_int_equal(ncfsm__sim_wait_ms(), 30000);
  assert_int_equal(ncfsm__backend_sim.version(), 22809);
  void *child = &cfg;
  assert_int_equal(ncfsm__backend_sim.comm_split(c, 0, 0, &child, &cfg), E_ARG);
  assert_null(child);
  assert_string_equal(ncfsm__backend_sim.last_error(NULL), /* the first refused row of the table */
                      "ncclCommSplit: " MSG("NCFSM_SIM_NCCL_VERSION", "lots", "not a whole number", "21400..23299", "22809"));
  for (int i = 0; i < NCFSM__SET_COUNT; i++)
    if (ncfsm__settings[i].subsys == NCFSM__SS_SIM && ncfsm__settings[i].env) unsetenv(ncfsm__settings[i].env);
  assert_int_equal(ncfsm__backend_sim.comm_split(c, 0, 0, &child, &cfg), OK);
  assert_non_null(child);
  assert_int_equal(ncfsm__backend_sim.abort(child), OK);
  assert_int_equal(ncfsm__backend_sim.abort(c), OK);
}

#define BACKEND_MSG                                                                                          \
  MSG("NCFSM_BACKEND", "bogus", "not an accepted word", "one of auto, sim, nccl, null", "auto")
#define PUSH_WAKE_MSG MSG("NCFSM_PUSH_WAKE", "poll", "not an accepted word", "one of hostfn, event", "hostfn")

/* NCFSM_BACKEND: unset, auto; each word picks its backend; a malformed value
 * is refused by the calls that choose a backend of kind auto, and by none
 * that names its backend. */
static void test_backend_row(void **state) {
  (void)state;
  char why[256];
  const ncfsm__backend *dflt = ncfsm__backend_get(NCFSM_BACKEND_AUTO, why, sizeof why);
  assert_non_null(dflt);
  setenv("NCFSM_BACKEND", "auto", 1);
  assert_ptr_equal(ncfsm__backend_get(NCFSM_BACKEND_AUTO, why, sizeof why), dflt);
  setenv("NCFSM_BACKEND", "Sim", 1);
  assert_ptr_equal(ncfsm__backend_get(NCFSM_BACKEND_AUTO, why, sizeof why), &ncfsm__backend_sim);
  setenv("NCFSM_BACKEND", "null", 1);
  assert_ptr_equal(ncfsm__backend_get(NCFSM_BACKEND_AUTO, why, sizeof why), &ncfsm__backend_null);

  setenv("NCFSM_BACKEND", "bogus", 1);
  assert_null(ncfsm__backend_get(NCFSM_BACKEND_AUTO, why, sizeof why));
  assert_string_equal(why, BACKEND_MSG);
  assert_ptr_equal(ncfsm__backend_get(NCFSM_BACKEND_SIM, why, sizeof why), &ncfsm__backend_sim);
  ncfsm_backend_info bi;
  assert_int_equal(ncfsm_backend_query(NCFSM_BACKEND_AUTO, &bi), NCFSM_ERR_UNSUPPORTED);
  assert_string_equal(bi.why, BACKEND_MSG);
  ncfsm_comm_opts o;
  assert_int_equal(ncfsm_comm_opts_init(&o), NCFSM_ERR_INVALID_ARGUMENT);
  assert_string_equal(ncfsm_opts_error(), BACKEND_MSG);
  assert_int_equal(o.backend, NCFSM_BACKEND_AUTO);
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_AUTO, &id), NCFSM_ERR_INVALID_ARGUMENT);
  assert_string_equal(ncfsm_opts_error(), BACKEND_MSG);
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
  ncfsm_loop *loop = NULL;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_comm *c = NULL;
  assert_int_equal(ncfsm_comm_new(loop, NULL, &c), NCFSM_ERR_INVALID_ARGUMENT);
  assert_null(c);
  assert_string_equal(ncfsm_loop_last_error(loop), BACKEND_MSG);
  assert_int_equal(ncfsm_comm_new(loop, &o, &c), NCFSM_ERR_INVALID_ARGUMENT);
  assert_string_equal(ncfsm_opts_error(), BACKEND_MSG);
  assert_string_equal(ncfsm_loop_last_error(loop), BACKEND_MSG);
  o.backend = NCFSM_BACKEND_SIM; /* named: NCFSM_BACKEND is not read */
  assert_int_equal(ncfsm_comm_new(loop, &o, &c), NCFSM_OK);
  assert_string_equal(ncfsm_opts_error(), "");
  ncfsm_comm_release(c);
  unsetenv("NCFSM_BACKEND");
  o.backend = NCFSM_BACKEND_AUTO;
  assert_int_equal(ncfsm_comm_new(loop, &o, &c), NCFSM_OK);
  ncfsm_comm_release(c);
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_AUTO, &id), NCFSM_OK);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* NCFSM_PUSH_WAKE: unset, hostfn (the nccl backend's value); a malformed
 * value is refused by the calls that may choose the nccl backend, and gives
 * hostfn where the backend reads it. */
static void test_push_wake_row(void **state) {
  (void)state;
  ncfsm__setting_val v;
  assert_int_equal(ncfsm__setting_env(NCFSM__SET_PUSH_WAKE, &v), NCFSM_OK);
  assert_int_equal(v.u, 0); /* hostfn */
  setenv("NCFSM_PUSH_WAKE", "EVENT", 1);
  assert_int_equal(ncfsm__setting_env(NCFSM__SET_PUSH_WAKE, &v), NCFSM_OK);
  assert_int_equal(v.u, 1);
  setenv("NCFSM_PUSH_WAKE", "poll", 1);
  assert_int_equal(ncfsm__setting_env(NCFSM__SET_PUSH_WAKE, &v), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(v.u, 0);
  ncfsm_comm_opts o;
  assert_int_equal(ncfsm_comm_opts_init(&o), NCFSM_ERR_INVALID_ARGUMENT);
  assert_string_equal(ncfsm_opts_error(), PUSH_WAKE_MSG);
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_AUTO, &id), NCFSM_ERR_INVALID_ARGUMENT);
  assert_string_equal(ncfsm_opts_error(), PUSH_WAKE_MSG);
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_NCCL, &id), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
  ncfsm_loop *loop = NULL;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  ncfsm_comm *c = NULL;
  assert_int_equal(ncfsm_comm_new(loop, &o, &c), NCFSM_ERR_INVALID_ARGUMENT);
  assert_string_equal(ncfsm_loop_last_error(loop), PUSH_WAKE_MSG);
  o.backend = NCFSM_BACKEND_SIM;
  assert_int_equal(ncfsm_comm_new(loop, &o, &c), NCFSM_OK);
  ncfsm_comm_release(c);
  unsetenv("NCFSM_PUSH_WAKE");
  assert_int_equal(ncfsm_comm_opts_init(&o), NCFSM_OK);
  assert_int_equal(ncfsm_loop_close(loop), NCFSM_OK);
}

/* The helpers of readers not on the table yet: a refused number falls back
 * to the caller's default, refused text is passed on, both logged. */
static void test_legacy_helpers(void **state) {
  (void)state;
  setenv("NCFSM_BOOTSTRAP_TIMEOUT_MS", "-5", 1); /* was (uint64_t)-5 ms */
  assert_int_equal(ncfsm__env_ll("NCFSM_BOOTSTRAP_TIMEOUT_MS", 60000), 60000);
  setenv("NCFSM_BOOTSTRAP_TIMEOUT_MS", "010", 1); /* decimal, not octal */
  assert_int_equal(ncfsm__env_ll("NCFSM_BOOTSTRAP_TIMEOUT_MS", 60000), 10);
  unsetenv("NCFSM_BOOTSTRAP_TIMEOUT_MS");
  assert_int_equal(ncfsm__env_ll("NCFSM_BOOTSTRAP_TIMEOUT_MS", 60000), 60000);
  setenv("NCFSM_STORE_ADDR", "127.0.0.1:99999", 1);
  assert_string_equal(ncfsm__env_str("NCFSM_STORE_ADDR", NULL), "127.0.0.1:99999");
  setenv("NCFSM_STORE_ADDR", "", 1);
  assert_null(ncfsm__env_str("NCFSM_STORE_ADDR", NULL));
  unsetenv("NCFSM_STORE_ADDR");
  setenv("NCFSM_STORE_MAX_BYTES", "0xffffffffffffffff", 1);
  assert_true((uint64_t)ncfsm__env_ll("NCFSM_STORE_MAX_BYTES", 1) == UINT64_MAX);
  unsetenv("NCFSM_STORE_MAX_BYTES");
}

/* What ncfsm-info and the docs show. */
static void test_format_and_accepted(void **state) {
  (void)state;
  char b[256];
  ncfsm__setting_val v;
  ncfsm__setting_accepted(row(NCFSM__SET_TIMEOUT_MS), b, sizeof b);
  assert_string_equal(b, "0 = off, or 1..31536000000");
  ncfsm__setting_accepted(row(NCFSM__SET_COALESCE_MAX), b, sizeof b);
  assert_string_equal(b, "1 = off, or 2..65536, or auto");
  ncfsm__setting_accepted(row(NCFSM__SET_TEST_SEED), b, sizeof b);
  assert_string_equal(b, "0..18446744073709551615, or random");
  assert_int_equal(ncfsm__setting_parse(row(NCFSM__SET_TIMEOUT_MS), "0", &v, b, sizeof b), 0);
  ncfsm__setting_format(row(NCFSM__SET_TIMEOUT_MS), &v, b, sizeof b);
  assert_string_equal(b, "0 (off)");
  assert_int_equal(ncfsm__setting_parse(row(NCFSM__SET_DEBUG_SUBSYS), "sim,Fsm", &v, b, sizeof b), 0);
  assert_int_equal(v.u, (1u << 0) | (1u << 3));
  ncfsm__setting_format(row(NCFSM__SET_DEBUG_SUBSYS), &v, b, sizeof b);
  assert_string_equal(b, "FSM,SIM");
  assert_int_equal(ncfsm__setting_parse(row(NCFSM__SET_STORE_TOKEN), "hunter2", &v, b, sizeof b), 0);
  ncfsm__setting_format(row(NCFSM__SET_STORE_TOKEN), &v, b, sizeof b);
  assert_null(strstr(b, "hunter2"));
  assert_int_equal(ncfsm__setting_parse(row(NCFSM__SET_TEST_SEED), "RANDOM", &v, b, sizeof b), 0);
  assert_int_equal(v.word, 0);
  assert_ptr_equal(ncfsm__setting_find("NCFSM_TIMEOUT_MS"), row(NCFSM__SET_TIMEOUT_MS));
  assert_ptr_equal(ncfsm__setting_find("PMIX_RANK"), row(NCFSM__SET_PMIX_RANK));
  assert_null(ncfsm__setting_find("NCFSM_NOT_A_SETTING"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_every_row, clean_env),
      cmocka_unit_test_setup(test_fields_fit, clean_env),
      cmocka_unit_test_setup(test_defaults_agree, clean_env),
      cmocka_unit_test_setup(test_issue23_cases, clean_env),
      cmocka_unit_test_setup(test_calls_refuse_bad_env, clean_env),
      cmocka_unit_test_setup(test_user_opts_checked, clean_env),
      cmocka_unit_test_setup(test_sim_fill, clean_env),
      cmocka_unit_test_setup(test_sim_rows_covered, clean_env),
      cmocka_unit_test_setup(test_sim_rows_refused, clean_env),
      cmocka_unit_test_setup(test_sim_process_rows, clean_env),
      cmocka_unit_test_setup(test_backend_row, clean_env),
      cmocka_unit_test_setup(test_push_wake_row, clean_env),
      cmocka_unit_test_setup(test_legacy_helpers, clean_env),
      cmocka_unit_test_setup(test_format_and_accepted, clean_env),
  };
  ncfsm_set_log_level(NCFSM__LOG_ERROR); /* the WARNs of the refused values are the point */
  return cmocka_run_group_tests(tests, NULL, NULL);
}
