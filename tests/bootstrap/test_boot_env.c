/*
 * The bootstrap's and the store's environment, read strictly through the settings table
 * (issue 23 item 5): a bad value of a variable the bootstrap reads is refused by
 * ncfsm_boot_open, naming the variable, the value and what is accepted (ncfsm_boot_open_error
 * and ncfsm_last_error); so is an unknown NCFSM_STORE_* / NCFSM_BOOTSTRAP_* / NCFSM_LOCAL_*
 * variable, a store address without a port or with a port past 65535, and, with
 * NCFSM_BOOTSTRAP=auto, a process launched as one of N > 1 tasks (SLURM_NTASKS,
 * OMPI_COMM_WORLD_SIZE, PMI_SIZE) that finds neither PMIx nor a store. The store's own reader
 * (ncfsm__store_opts_from_env) refuses each of its rows by name. ncfsm-store's refusals are
 * CTests of tests/bootstrap/CMakeLists.txt.
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

static void opts_local(ncfsm_boot_opts *o) {
  ncfsm_boot_opts_init(o);
  o->kind = NCFSM_BOOT_LOCAL;
  o->local_group = "boot-env";
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

/* The cases of the issue, at ncfsm_boot_open. */
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
  /* no such variable: named, with the ones that exist */
  setenv("NCFSM_STORE_TIMEOUT_MS", "-5", 1);
  opts_local(&o);
  open_refused(&o, NCFSM_ERR_INVALID_ARGUMENT,
               (const char *[]){"NCFSM_STORE_TIMEOUT_MS is set but is not a setting of ncfsm",
                                "NCFSM_BOOTSTRAP_TIMEOUT_MS", "NCFSM_STORE_AUTH_TIMEOUT_MS",
                                "NCFSM_STORE_FRAME_TIMEOUT_MS", "docs/settings.md", NULL});
  unsetenv("NCFSM_STORE_TIMEOUT_MS");
  setenv("NCFSM_STORE_TOKN", "hunter2", 1); /* a misspelt token: its value is not shown */
  open_refused(&o, NCFSM_ERR_INVALID_ARGUMENT, (const char *[]){"NCFSM_STORE_TOKN is set", NULL});
  assert_null(strstr(ncfsm_boot_open_error(), "hunter2"));
}

/* The variables of ncfsm_boot_opts_init: each bad value keeps its default there (a WARN) and
 * ncfsm_boot_open refuses it, whatever the kind. */
static void test_boot_values_refused(void **state) {
  (void)state;
  static const struct {
    const char *var, *value, *says;
  } bad[] = {
      {"NCFSM_BOOTSTRAP", "bogus", "NCFSM_BOOTSTRAP=bogus: not an accepted word (accepted: one of auto, pmix, tcp, local)"},
      {"NCFSM_BOOTSTRAP_TIMEOUT_MS", "-5", "NCFSM_BOOTSTRAP_TIMEOUT_MS=-5: not a duration in ms (accepted: 1..31536000000)"},
      {"NCFSM_BOOTSTRAP_TIMEOUT_MS", "10s", "NCFSM_BOOTSTRAP_TIMEOUT_MS=10s: not a duration in ms"},
      {"NCFSM_RANK", "abc", "NCFSM_RANK=abc: not an integer"},
      {"NCFSM_WORLD_SIZE", "0", "NCFSM_WORLD_SIZE=0: out of range (accepted: 1..2147483647)"},
      {"NCFSM_STORE_HOST", "yes", "NCFSM_STORE_HOST=yes: not 0 or 1"},
      {"NCFSM_STORE_ADDR", "127.0.0.1:99999", "NCFSM_STORE_ADDR=127.0.0.1:99999: the port is past 65535"},
      {"NCFSM_STORE_ADDR", "127.0.0.1", "NCFSM_STORE_ADDR=127.0.0.1: not HOST:PORT"},
      {"NCFSM_LOCAL_RANK", "-1", "NCFSM_LOCAL_RANK=-1: out of range"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv(bad[i].var, bad[i].value, 1);
    ncfsm_boot_opts o;
    opts_local(&o);
    open_refused(&o, NCFSM_ERR_INVALID_ARGUMENT, (const char *[]){bad[i].says, "unset it or set e.g.", NULL});
    open_refused(NULL, NCFSM_ERR_INVALID_ARGUMENT, (const char *[]){bad[i].says, NULL});
    unsetenv(bad[i].var);
  }
  /* and good values still open */
  setenv("NCFSM_BOOTSTRAP_TIMEOUT_MS", "0x2710", 1);
  setenv("NCFSM_STORE_HEARTBEAT", "0", 1);
  ncfsm_boot_opts o;
  opts_local(&o);
  assert_true(o.timeout_ms == 10000);
  struct event_base *base = bt_base();
  ncfsm_boot *b = NULL;
  assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, &o, &b));
  assert_string_equal("", ncfsm_boot_open_error());
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b));
  event_base_free(base);
}

/* A store address in the options (not the environment) without a port, or with one past
 * 65535, is refused at open: it used to listen on a port of its own choosing (99999 is
 * 34463 mod 65536; no port: a random one). */
static void test_addr_ports(void **state) {
  (void)state;
  ncfsm_boot_opts o;
  opts_hosting(&o);
  o.store_addr = "127.0.0.1:99999";
  open_refused(&o, NCFSM_ERR_INVALID_ARGUMENT,
               (const char *[]){"store address '127.0.0.1:99999': the port 99999 is past 65535", NULL});
  o.store_addr = "127.0.0.1";
  open_refused(&o, NCFSM_ERR_INVALID_ARGUMENT,
               (const char *[]){"store address '127.0.0.1' has no port", "HOST:PORT", NULL});
  o.store_addr = "[::1]:65536";
  open_refused(&o, NCFSM_ERR_INVALID_ARGUMENT, (const char *[]){"the port 65536 is past 65535", NULL});
  o.store_addr = "127.0.0.1:+80";
  open_refused(&o, NCFSM_ERR_INVALID_ARGUMENT, (const char *[]){"the port '+80' is not a number", NULL});
  o.host_store = 0; /* a rank that connects: the same */
  o.store_addr = "localhost:70000";
  open_refused(&o, NCFSM_ERR_INVALID_ARGUMENT, (const char *[]){"the port 70000 is past 65535", NULL});
}

/* NCFSM_BOOTSTRAP=auto in one of N > 1 tasks with no PMIx (PMIX_RANK unset) and no store
 * (NCFSM_STORE_ADDR unset): an error naming the launcher's variables, not a one-rank run. */
static void test_launched_without_pmix(void **state) {
  (void)state;
  static const char *const launch[] = {"SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
  for (size_t i = 0; i < sizeof launch / sizeof launch[0]; i++) {
    setenv(launch[i], "4", 1);
    char says[64];
    snprintf(says, sizeof says, "launched as 4 tasks (%s=4)", launch[i]);
    open_refused(NULL, NCFSM_ERR_BOOTSTRAP,
                 (const char *[]){says, "PMIX_RANK is not set", "NCFSM_STORE_ADDR", "--mpi=pmix",
                                  "NCFSM_BOOTSTRAP=tcp", "NCFSM_BOOTSTRAP=local", NULL});
    unsetenv(launch[i]);
  }
  setenv("SLURM_NTASKS", "2", 1); /* all of them named */
  setenv("PMI_SIZE", "2", 1);
  open_refused(NULL, NCFSM_ERR_BOOTSTRAP, (const char *[]){"SLURM_NTASKS=2", "PMI_SIZE=2", NULL});
  setenv("SLURM_NTASKS", "many", 1);
  open_refused(NULL, NCFSM_ERR_INVALID_ARGUMENT, (const char *[]){"SLURM_NTASKS=many: not a whole number", NULL});
  unsetenv("PMI_SIZE");
  /* one task, or a choice made: opens */
  setenv("SLURM_NTASKS", "1", 1);
  struct event_base *base = bt_base();
  ncfsm_boot *b = NULL;
  assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, NULL, &b));
  assert_int_equal(NCFSM_BOOT_LOCAL, ncfsm_boot_kind(b));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b));
  setenv("SLURM_NTASKS", "4", 1);
  setenv("NCFSM_BOOTSTRAP", "local", 1);
  assert_int_equal(NCFSM_OK, ncfsm_boot_open(base, NULL, &b));
  assert_int_equal(1, ncfsm_boot_size(b));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b));
  event_base_free(base);
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
      ENV_TEST(test_store_values_refused), ENV_TEST(test_boot_values_refused), ENV_TEST(test_addr_ports),
      ENV_TEST(test_launched_without_pmix), ENV_TEST(test_store_reader),
  };
  return cmocka_run_group_tests_name("bootstrap_env", tests, NULL, NULL);
}
