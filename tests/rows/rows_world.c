#include "rows_world.h"

#include "fsm/objects.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- the kit ------------------------------------------------------------------------------ */

static ncfsm_test *g_kit;

ncfsm_test *kit_begin(const char *name) {
  assert_null(g_kit);
  ncfsm_test_opts to;
  ncfsm_test_opts_init(&to);
  to.name = name;
  to.seed = 1;
  assert_int_equal(ncfsm_test_begin(&to, &g_kit), NCFSM_OK);
  return g_kit;
}

void kit_end(void) {
  ncfsm_test *t = g_kit;
  g_kit = NULL;
  if (t) assert_int_equal(ncfsm_test_end(t), 0);
}

int kit_teardown(void **state) {
  (void)state;
  if (g_kit) ncfsm_test_end(g_kit);
  g_kit = NULL;
  rows_fail_calloc(0, 0, 0);
  return 0;
}

ncfsm_fault kit_fault_of(ncfsm_fault_kind_t kind, const char *name, int rank) {
  ncfsm_fault f;
  ncfsm_fault_init(&f, kind);
  f.comm = name;
  f.rank = rank;
  return f;
}

int kit_fault(ncfsm_fault *f) {
  assert_non_null(g_kit);
  int id = ncfsm_test_add_fault(g_kit, f);
  if (id < 0) fail_msg("ncfsm_test_add_fault: %s", ncfsm_test_last_failure(g_kit));
  return id;
}

/* ---- options and communicators ------------------------------------------------------------- */

void opts_init(ncfsm_comm_opts *o, ncfsm_sim_opts *so, const char *name) {
  test_sim_opts(so);
  test_comm_opts(o, so);
  o->name = name;
  o->timeout_ms = 0;
  o->on_error = NCFSM_ON_ERROR_STAY;
  /* the other machines' rows are walked without verification (its own rows:
   * test_rows_verify, which sets it per scenario): a peer's failure would
   * otherwise end the scenarios' other ranks, and a stall's question take
   * turns that some scenarios count */
  o->verify = NCFSM_VERIFY_OFF;
}

ncfsm_loop *loop_new(void) {
  ncfsm_loop *loop = NULL;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  return loop;
}

void comms_init(ncfsm_loop *loop, int n, const ncfsm_comm_opts *const *o, ncfsm_comm **c) {
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
  for (int r = 0; r < n; r++) {
    assert_int_equal(ncfsm_comm_new(loop, o[r] ? o[r] : o[0], &c[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_init(c[r], n, r, &id), NCFSM_OK);
  }
}

const char *boot_group(const char *what) {
  static char buf[96];
  static int k;
  snprintf(buf, sizeof buf, "rows-%s-%d-%d", what, (int)getpid(), k++);
  return buf;
}

ncfsm_boot *boot_open(ncfsm_loop *loop, const char *group, int rank, int size, uint64_t timeout_ms) {
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  bo.kind = NCFSM_BOOT_LOCAL;
  bo.local_group = group;
  bo.rank = rank;
  bo.size = size;
  bo.timeout_ms = timeout_ms;
  ncfsm_boot *b = NULL;
  assert_int_equal(ncfsm_boot_open(ncfsm_loop_base(loop), &bo, &b), NCFSM_OK);
  return b;
}

void comms_boot(ncfsm_loop *loop, int n, const ncfsm_comm_opts *const *o, ncfsm_comm **c, ncfsm_boot **b,
                uint64_t boot_timeout_ms) {
  char group[96];
  snprintf(group, sizeof group, "%s", boot_group("boot"));
  for (int r = 0; r < n; r++) {
    b[r] = boot_open(loop, group, r, n, boot_timeout_ms);
    assert_int_equal(ncfsm_comm_new(loop, o[r] ? o[r] : o[0], &c[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_init_boot(c[r], b[r]), NCFSM_OK);
  }
}

/* ---- waits -------------------------------------------------------------------------------- */

void want_state(ncfsm_comm *c, ncfsm_state_t s) {
  ncfsm_result_t r = ncfsm_comm_wait_state(c, s, LIMIT_MS);
  if (r != NCFSM_OK)
    fail_msg("%s rank %d: waiting for %s: %s: %s", ncfsm_comm_name(c), ncfsm_comm_rank(c), ncfsm_state_name(s),
             ncfsm_err_name(r), ncfsm_comm_last_error(c));
}

ncfsm_result_t work_final(ncfsm_work *w) {
  ncfsm_result_t r = ncfsm_work_wait(w, LIMIT_MS);
  if (r == NCFSM_ERR_AGAIN) fail_msg("a work did not become final within %d ms", LIMIT_MS);
  return r;
}

void want_work(ncfsm_work *w, ncfsm_work_state_t st, ncfsm_result_t status, int i) {
  ncfsm_result_t r = work_final(w);
  if (ncfsm_work_state(w) != st || r != status)
    fail_msg("work: %s %s, expected %s %s", ncfsm_work_state_name(ncfsm_work_state(w)), ncfsm_err_name(r),
             ncfsm_work_state_name(st), ncfsm_err_name(status));
  if (i >= 0) {
    /* the callback runs with the delivery of the turn that made it final */
    ncfsm_comm *c = ncfsm_work_comm(w);
    for (int k = 0; k < 100 && cb_count[i] == 0 && c; k++) ncfsm_loop_run(c->loop, NCFSM_RUN_NOWAIT);
    assert_int_equal(cb_count[i], 1);
    assert_int_equal(cb_status[i], status);
  }
}

void want_text(ncfsm_comm *c, bool failure, const char *text) {
  const char *m = failure ? ncfsm_comm_failure(c) : ncfsm_comm_last_error(c);
  if (!strstr(m, text)) fail_msg("%s of %s rank %d: \"%s\" lacks \"%s\"", failure ? "failure" : "last error",
                                 ncfsm_comm_name(c), ncfsm_comm_rank(c), m, text);
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void run_until(ncfsm_loop *loop, bool (*pred)(void *), void *arg, const char *what) {
  uint64_t end = now_ms() + LIMIT_MS;
  while (!pred(arg)) {
    if (now_ms() > end) fail_msg("not reached within %d ms: %s", LIMIT_MS, what);
    assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT), NCFSM_OK);
  }
}

struct is_wait {
  unsigned (*get)(void *);
  void *arg;
  unsigned want;
};
static bool is_reached(void *arg) {
  struct is_wait *x = arg;
  return x->get(x->arg) == x->want;
}
void run_until_is(ncfsm_loop *loop, unsigned (*get)(void *), void *arg, unsigned want, const char *what) {
  struct is_wait x = {get, arg, want};
  run_until(loop, is_reached, &x, what);
}

/* ---- teardown ------------------------------------------------------------------------------ */

/* No turn here: a recovery still running is cancelled by ncfsm_loop_close
 * (which delivers what is left), never stepped on an aborted comm. */

void world_down(ncfsm_loop *loop, ncfsm_comm **c, int n, ncfsm_boot **b, int nb) {
  for (int r = 0; r < n; r++) {
    if (!c[r]) continue;
    ncfsm_state_t s = ncfsm_comm_state(c[r]);
    if (s != NCFSM_STATE_CLOSED && s != NCFSM_STATE_NEW) {
      ncfsm_result_t ar = ncfsm_comm_abort(c[r]);
      if (ar != NCFSM_OK) fail_msg("abort of %s rank %d in %s: %s", ncfsm_comm_name(c[r]), r, ncfsm_state_name(s),
                                   ncfsm_comm_last_error(c[r]));
    }
  }
  for (int r = 0; r < n; r++)
    if (c[r]) {
      want_state(c[r], ncfsm_comm_state(c[r]) == NCFSM_STATE_NEW ? NCFSM_STATE_NEW : NCFSM_STATE_CLOSED);
      assert_int_equal(ncfsm_comm_release(c[r]), NCFSM_OK);
      c[r] = NULL;
    }
  for (int i = 0; i < nb; i++)
    if (b[i]) {
      assert_int_equal(ncfsm_boot_close(b[i]), NCFSM_OK);
      b[i] = NULL;
    }
  ncfsm_result_t r = ncfsm_loop_close(loop);
  if (r != NCFSM_OK) fail_msg("ncfsm_loop_close: %s: %s", ncfsm_err_name(r), ncfsm_loop_last_error(loop));
}
