/*
 * The store's environment, read strictly through the settings table (issue 23 item 5): a bad
 * value of NCFSM_STORE_* is refused by ncfsm_boot_open of a tcp rank that reads it (every rank
 * NCFSM_STORE_HEARTBEAT, the rank that hosts the store all of them), naming the variable, the
 * value and what is accepted (ncfsm_boot_open_error and ncfsm_last_error); the store's own
 * reader (ncfsm__store_opts_from_env) refuses each of its rows by name. ncfsm-store's refusals
 * are CTests of tests/bootstrap/CMakeLists.txt.
 */
#include <ncfsm/result.h>

#include "tests/bootstrap/raw_store.h"

#include "core/settings.h"

/* The variables these tests set, unset before and after each. */
static const char *const vars[] = {
    "NCFSM_BOOTSTRAP", "NCFSM_STORE_ADDR", "NCFSM_STORE_TOKEN", "NCFSM_STORE_HOST", "NCFSM_RANK",
    "NCFSM_WORLD_SIZE", "NCFSM_BOOTSTRAP_TIMEOUT_MS", "NCFSM_STORE_HEARTBEAT",
    "NCFSM_STORE_MAX_CONNS", "NCFSM_STORE_TIMEOUT_MS", "NCFSM_STORE_TOKN", "NCFSM_LOCAL_RANK",
    "PMIX_RANK", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
};

static void clean_env(void) {
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

static int env_setup(void **state) {
  clean_env();
  return bt_setup(state);
}
static int env_teardown(void **state) {
  clean_env();
  return bt_teardown(state);
}
#define ENV_TEST(f) cmocka_unit_test_setup_teardown(f, env_setup, env_teardown)

/* ncfsm_boot_open of o fails with want; the message is the open error and the last error and
 * has every needle. */
static void open_refused(const ncfsm_boot_opts *o, ncfsm_result_t want, const char *const *needles) {
  struct event_base *base = bt_base();
  ncfsm_boot *b = (ncfsm_boot *)1;
  ncfsm_result_t r = ncfsm_boot_open(base, o, &b);
  if (r != want)
    fail_msg("ncfsm_boot_open: %s, expected %s (open error: '%s')", ncfsm_err_name(r), ncfsm_err_name(want),
             ncfsm_boot_open_error());
  assert_null(b);
  const char *e = ncfsm_boot_open_error();
  assert_string_equal(e, ncfsm_last_error());
  for (const char *const *n = needles; *n; n++)
    if (!strstr(e, *n)) fail_msg("'%s' is not in the open error: %s", *n, e);
  event_base_free(base);
}

/* A rank 0 that hosts the store on a free port. */
static void opts_hosting(ncfsm_boot_opts *o) {
  ncfsm_boot_opts_init(o);
  o->kind = NCFSM_BOOT_TCP;
  o->store_addr = "127.0.0.1:0";
  o->token = TOKEN;
  o->host_store = 1;
  o->timeout_ms = 3000;
}

/* The cases of the issue, at ncfsm_boot_open of a tcp rank. */
static void test_store_values_refused(void **state) {
  (void)state;
  ncfsm_boot_opts o;
  setenv("NCFSM_STORE_HEARTBEAT", "maybe", 1);
  opts_hosting(&o);
  open_refused(&o, NCFSM_ERR_INVALID_ARGUMENT,
               (const char *[]){"NCFSM_STORE_HEARTBEAT=maybe: not 0 or 1 (accepted: 0 or 1)", NULL});
  /* every tcp rank reads it (its heartbeat connection), not only the one that hosts the store */
  o.host_store = 0;
  o.store_addr = "127.0.0.1:29500";
  open_refused(&o, NCFSM_ERR_INVALID_ARGUMENT, (const char *[]){"NCFSM_STORE_HEARTBEAT=maybe", NULL});
  unsetenv("NCFSM_STORE_HEARTBEAT");
  setenv("NCFSM_STORE_MAX_CONNS", "lots", 1);
  opts_hosting(&o);
  open_refused(&o, NCFSM_ERR_INVALID_ARGUMENT,
               (const char *[]){"rank 0 cannot host the store",
                                "NCFSM_STORE_MAX_CONNS=lots: not a whole number (accepted: 1..1073741824)", NULL});
  unsetenv("NCFSM_STORE_MAX_CONNS");
}

/* The store's reader: each of its rows, set to a value it does not accept, is refused by name;
 * unset rows leave the options as they were; good values are taken. */
static void test_store_reader(void **state) {
  (void)state;
  int n = 0;
  for (int k = 0; k < NCFSM__SET_COUNT; k++) {
    const ncfsm__setting *s = &ncfsm__settings[k];
    if (s->subsys != NCFSM__SS_STORE && k != NCFSM__SET_STORE_VALUE_MAX) continue;
    ncfsm__store_opts o, d;
    ncfsm__store_opts_init(&o);
    ncfsm__store_opts_init(&d);
    char err[512], want[128];
    assert_int_equal(0, ncfsm__store_opts_from_env(&o, err, sizeof err));
    assert_memory_equal(&o, &d, sizeof o);
    setenv(s->env, "lots", 1);
    assert_int_equal(-1, ncfsm__store_opts_from_env(&o, err, sizeof err));
    snprintf(want, sizeof want, "%s=lots: ", s->env);
    if (strncmp(err, want, strlen(want)) || !strstr(err, "(accepted: "))
      fail_msg("%s=lots: '%s'", s->env, err);
    setenv(s->env, s->type == NCFSM__T_BOOL ? "1" : "7", 1);
    assert_int_equal(0, ncfsm__store_opts_from_env(&o, err, sizeof err));
    unsetenv(s->env);
    n++;
  }
  assert_true(n >= 20);
  setenv("NCFSM_STORE_HEARTBEAT", "0", 1);
  setenv("NCFSM_STORE_MAX_CONNS", "99", 1);
  setenv("NCFSM_STORE_MAX_BYTES", "0x100000", 1);
  ncfsm__store_opts o;
  ncfsm__store_opts_init(&o);
  char err[512];
  assert_int_equal(0, ncfsm__store_opts_from_env(&o, err, sizeof err));
  assert_int_equal(1, o.heartbeat_off);
  assert_int_equal(99, o.max_conns);
  assert_true(o.max_bytes == 1u << 20);
  unsetenv("NCFSM_STORE_HEARTBEAT");
  unsetenv("NCFSM_STORE_MAX_CONNS");
  unsetenv("NCFSM_STORE_MAX_BYTES");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      ENV_TEST(test_store_values_refused), ENV_TEST(test_store_reader),
  };
  return cmocka_run_group_tests_name("bootstrap_env", tests, NULL, NULL);
}
