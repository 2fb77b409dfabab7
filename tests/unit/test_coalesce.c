/* Adaptive coalescing (fsm/coalesce.c): the fit and the rule as pure
 * functions, the setting's parsing (NCFSM_COALESCE_MAX=auto), and the loop
 * choosing a larger cap when the null backend's group end is made expensive
 * (ncfsm__null_group_end_ns) than when it costs nothing. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/settings.h"
#include "fsm/coalesce.h"
#include "helpers.h"
#include "ncfsm/introspect.h"

/* ---- the fit and the rule --------------------------------------------------------------- */

static void add(ncfsm__coalesce_sums *s, double k, double t) {
  s->w += 1;
  s->k += k;
  s->t += t;
  s->kk += k * k;
  s->kt += k * t;
}

static void test_fit(void **state) {
  (void)state;
  ncfsm__coalesce_sums s = {0};
  double a = -1, b = -1;
  for (int i = 0; i < 3; i++) add(&s, i % 2 ? 16 : 8, 1000 + 50.0 * (i % 2 ? 16 : 8));
  assert_false(ncfsm__coalesce_fit(&s, &a, &b)); /* 3 samples: too few */
  add(&s, 16, 1000 + 50.0 * 16);
  assert_true(ncfsm__coalesce_fit(&s, &a, &b));
  assert_float_equal(a, 1000, 1e-6);
  assert_float_equal(b, 50, 1e-9);
  /* noise around the line: the least-squares line */
  ncfsm__coalesce_sums n = {0};
  const double ks[] = {4, 8, 12, 16}, dev[] = {10, -10, -10, 10};
  for (int i = 0; i < 4; i++) add(&n, ks[i], 200 + 20 * ks[i] + dev[i]);
  assert_true(ncfsm__coalesce_fit(&n, &a, &b));
  assert_float_equal(b, 20, 1e-9);
  assert_float_equal(a, 200, 1e-6);
  /* one size only: the two costs cannot be told apart */
  ncfsm__coalesce_sums one = {0};
  for (int i = 0; i < 64; i++) add(&one, 32, 5000 + i);
  assert_false(ncfsm__coalesce_fit(&one, &a, &b));
  /* sizes 2% apart: still too alike */
  ncfsm__coalesce_sums near = {0};
  for (int i = 0; i < 64; i++) add(&near, i % 2 ? 100 : 102, 5000);
  assert_false(ncfsm__coalesce_fit(&near, &a, &b));
}

static void test_choose(void **state) {
  (void)state;
  /* fixed share 10%: k >= 9 * fixed / per_op */
  assert_int_equal(ncfsm__coalesce_choose(1000, 50), 180);
  assert_int_equal(ncfsm__coalesce_choose(1000, 45), 200);
  assert_int_equal(ncfsm__coalesce_choose(100, 100), 9);
  /* the latency bound: 50 us of ops at most */
  assert_int_equal(ncfsm__coalesce_choose(100000, 500), 100);
  assert_int_equal(ncfsm__coalesce_choose(1e9, 1e6), NCFSM__COALESCE_LO);
  /* the bounds */
  assert_int_equal(ncfsm__coalesce_choose(10, 100), NCFSM__COALESCE_LO);
  assert_int_equal(ncfsm__coalesce_choose(0, 100), NCFSM__COALESCE_LO);
  assert_int_equal(ncfsm__coalesce_choose(-5, 100), NCFSM__COALESCE_LO);
  assert_int_equal(ncfsm__coalesce_choose(1e6, 1), NCFSM__COALESCE_HI);
  assert_int_equal(ncfsm__coalesce_choose(1000, 0), NCFSM__COALESCE_HI);
  assert_int_equal(ncfsm__coalesce_choose(1000, -3), NCFSM__COALESCE_HI);
}

/* The loop's side of it, with a model cost t = fixed + per_op * k: launches as
 * the launcher makes them (a deep queue: every launch fills its limit). */
static unsigned drive(ncfsm__coalesce *co, double fixed, double per_op, int launches, unsigned *max_step) {
  *max_step = 0;
  for (int i = 0; i < launches; i++) {
    bool timed;
    unsigned before = co->cap, k = ncfsm__coalesce_begin(co, 1, &timed);
    if (!timed) continue;
    ncfsm__coalesce_sample(co, k, (uint64_t)(fixed + per_op * k));
    unsigned step = co->cap > before ? co->cap / before : before / co->cap;
    if (step > *max_step) *max_step = step;
  }
  return co->cap;
}

static void test_sample_and_probe(void **state) {
  (void)state;
  ncfsm__coalesce co;
  unsigned step;
  ncfsm__coalesce_init(&co, 0);
  assert_true(co.adaptive);
  assert_int_equal(co.cap, NCFSM__COALESCE_START);
  /* every 4th launch timed; every 4th timed one a probe at half the cap */
  int timed_n = 0, probes = 0;
  for (int i = 0; i < 64; i++) {
    bool timed;
    unsigned k = ncfsm__coalesce_begin(&co, 1, &timed);
    timed_n += timed;
    probes += k != co.cap;
    if (k != co.cap) assert_int_equal(k, co.cap / 2);
    if (!timed) assert_int_equal(k, co.cap);
  }
  assert_int_equal(timed_n, 16);
  assert_int_equal(probes, 4);
  /* expensive launches: up to the rule's choice, doubling at most */
  ncfsm__coalesce_init(&co, 0);
  assert_int_equal(ncfsm__coalesce_choose(20000, 100), 500); /* the latency bound */
  assert_in_range(drive(&co, 20000, 100, 400, &step), 499, 500); /* (the fit of times in whole ns) */
  assert_true(step <= 2);
  assert_true(co.fitted);
  assert_float_equal(co.fixed_ns, 20000, 1e-3);
  assert_float_equal(co.per_op_ns, 100, 1e-6);
  /* then cheap ones: down again (halving at most) */
  assert_int_equal(drive(&co, 50, 100, 4000, &step), 5); /* 9 * 50 / 100, rounded up */
  assert_true(step <= 2);
  assert_int_equal(drive(&co, 10, 100, 4000, &step), NCFSM__COALESCE_LO);
  assert_true(step <= 2);
  /* a preemption: counted as 1.5x the prediction, it moves the cap less than
   * a factor of 2, and the later samples undo it */
  ncfsm__coalesce_init(&co, 0);
  drive(&co, 2050, 100, 400, &step);
  assert_int_equal(co.cap, 185); /* 184.5 rounded up */
  ncfsm__coalesce_sample(&co, 185, 50000000); /* 50 ms */
  assert_in_range(co.cap, 93, 184);
  assert_int_equal(drive(&co, 2050, 100, 1600, &step), 185);
  /* a clique of 4 ranks at a cap of 6: half could not hold two instances, the probe doubles */
  ncfsm__coalesce_init(&co, 0);
  co.cap = 6;
  co.launches = 4 * 3;
  bool timed;
  assert_int_equal(ncfsm__coalesce_begin(&co, 4, &timed), 12);
  assert_true(timed);
  /* a number pins the cap: nothing timed, nothing probed */
  ncfsm__coalesce_init(&co, 64);
  assert_false(co.adaptive);
  for (int i = 0; i < 64; i++) {
    assert_int_equal(ncfsm__coalesce_begin(&co, 1, &timed), 64);
    assert_false(timed);
  }
}

/* ---- the setting ---------------------------------------------------------------------- */

static void test_setting(void **state) {
  (void)state;
  const ncfsm__setting *s = &ncfsm__settings[NCFSM__SET_COALESCE_MAX];
  ncfsm__setting_val v;
  char err[512];
  assert_int_equal(ncfsm__setting_parse(s, "auto", &v, err, sizeof err), 0);
  assert_int_equal(v.word, 0);
  assert_int_equal(v.u, 0);
  assert_int_equal(ncfsm__setting_parse(s, "AUTO", &v, err, sizeof err), 0);
  assert_int_equal(ncfsm__setting_parse(s, "128", &v, err, sizeof err), 0);
  assert_int_equal(v.word, -1);
  assert_int_equal(v.u, 128);
  assert_int_equal(ncfsm__setting_parse(s, "0", &v, err, sizeof err), -1);
  assert_string_equal(err, "NCFSM_COALESCE_MAX=0: out of range (accepted: 1 = off, or 2..65536, or auto); unset it "
                           "or set e.g. NCFSM_COALESCE_MAX=64");
  assert_int_equal(ncfsm__setting_parse(s, "automatic", &v, err, sizeof err), -1);
  assert_non_null(strstr(err, "NCFSM_COALESCE_MAX=automatic: not a whole number (accepted: 1 = off, or 2..65536, or auto)"));
  ncfsm__setting_format(s, &(ncfsm__setting_val){.word = 0, .s = "auto"}, err, sizeof err);
  assert_string_equal(err, "auto");

  /* the environment fills the option: auto is 0 */
  ncfsm_loop_opts lo;
  setenv("NCFSM_COALESCE_MAX", "auto", 1);
  assert_int_equal(ncfsm_loop_opts_init(&lo), NCFSM_OK);
  assert_int_equal(lo.coalesce_max, 0);
  setenv("NCFSM_COALESCE_MAX", "32", 1);
  assert_int_equal(ncfsm_loop_opts_init(&lo), NCFSM_OK);
  assert_int_equal(lo.coalesce_max, 32);
  setenv("NCFSM_COALESCE_MAX", "fast", 1);
  assert_int_equal(ncfsm_loop_opts_init(&lo), NCFSM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(ncfsm_opts_error(), "NCFSM_COALESCE_MAX=fast: not a whole number"));
  unsetenv("NCFSM_COALESCE_MAX");

  /* user options: 0 (auto) is accepted, past the range refused with the field named */
  ncfsm_loop *loop = NULL;
  assert_int_equal(ncfsm_loop_opts_init(&lo), NCFSM_OK);
  lo.coalesce_max = 0;
  assert_int_equal(ncfsm_loop_new(&lo, &loop), NCFSM_OK);
  ncfsm_loop_close(loop);
  loop = NULL;
  lo.coalesce_max = 70000;
  assert_int_equal(ncfsm_loop_new(&lo, &loop), NCFSM_ERR_INVALID_ARGUMENT);
  assert_null(loop);
  assert_string_equal(ncfsm_opts_error(), "ncfsm_loop_new: ncfsm_loop_opts.coalesce_max = 70000: out of range "
                                          "(accepted: 1 = off, or 2..65536, or auto, as NCFSM_COALESCE_MAX); start "
                                          "from ncfsm_loop_opts_init");
}

/* ---- the engine ----------------------------------------------------------------------- */

typedef struct coalesce_seen {
  const char *mode;
  long long cap, measured;
  double fixed_ns, per_op_ns; /* -1: null (no fit) */
} coalesce_seen;

/* The loop's /status member loop.coalesce, and its /metrics line agrees. */
static coalesce_seen seen(ncfsm_loop *loop) {
  json_t *st = NULL;
  assert_int_equal(ncfsm_loop_status(loop, NULL, &st), NCFSM_OK);
  json_t *co = json_object_get(json_object_get(st, "loop"), "coalesce");
  assert_non_null(co);
  static char mode[16];
  snprintf(mode, sizeof mode, "%s", json_string_value(json_object_get(co, "mode")));
  json_t *fx = json_object_get(co, "fixed_ns"), *po = json_object_get(co, "per_op_ns");
  coalesce_seen s = {mode, json_integer_value(json_object_get(co, "cap")),
                     json_integer_value(json_object_get(co, "measured")), json_is_number(fx) ? json_number_value(fx) : -1,
                     json_is_number(po) ? json_number_value(po) : -1};
  json_decref(st);
  char *text = NULL, line[96];
  assert_int_equal(ncfsm_loop_metrics(loop, &text, NULL), NCFSM_OK);
  snprintf(line, sizeof line, "\nncfsm_coalesce_cap{mode=\"%s\"} %lld\n", mode, s.cap);
  assert_non_null(strstr(text, line));
  assert_non_null(strstr(text, "\nncfsm_coalesce_launch_cost_seconds{part=\"per_op\"} "));
  free(text);
  return s;
}

static float bufs[64][4];

/* coalesce_max (0: auto) on the null backend, one comm, rounds of 2048 ops
 * over 64 buffers in place (independent: they coalesce up to the cap), each
 * group end spinning spin_ns. */
static coalesce_seen run_stream(unsigned coalesce_max, uint64_t spin_ns, int rounds) {
  setenv("NCFSM_BACKEND", "null", 1);
  ncfsm_loop_opts lo;
  assert_int_equal(ncfsm_loop_opts_init(&lo), NCFSM_OK);
  lo.coalesce_max = coalesce_max;
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(&lo, &loop), NCFSM_OK);
  ncfsm_comm_opts o;
  assert_int_equal(ncfsm_comm_opts_init(&o), NCFSM_OK);
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_get_unique_id(o.backend, &id), NCFSM_OK);
  ncfsm_comm *c;
  assert_int_equal(ncfsm_comm_new(loop, &o, &c), NCFSM_OK);
  assert_int_equal(ncfsm_comm_init(c, 1, 0, &id), NCFSM_OK);
  assert_int_equal(ncfsm_comm_wait_state(c, NCFSM_STATE_READY, 10000), NCFSM_OK);
  coalesce_seen before = seen(loop);
  assert_int_equal(before.measured, 0);
  assert_true(before.fixed_ns < 0);
  ncfsm__null_group_end_ns = spin_ns;
  for (int r = 0; r < rounds; r++) {
    for (int i = 0; i < 2048; i++)
      assert_int_equal(ncfsm_allreduce(c, bufs[i & 63], bufs[i & 63], 4, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL,
                                       NULL, NULL),
                       NCFSM_OK);
    assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT), NCFSM_OK);
  }
  ncfsm__null_group_end_ns = 0;
  coalesce_seen s = seen(loop);
  ncfsm_comm_abort(c);
  ncfsm_comm_release(c);
  ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
  ncfsm_loop_close(loop);
  unsetenv("NCFSM_BACKEND");
  print_message("coalesce_max %u, group end +%llu ns: %s cap %lld, fixed %.0f ns, per op %.1f ns, %lld timed\n",
                coalesce_max, (unsigned long long)spin_ns, s.mode, s.cap, s.fixed_ns, s.per_op_ns, s.measured);
  return s;
}

static void test_engine_expensive_grows(void **state) {
  (void)state;
  coalesce_seen s = run_stream(0, 200000, 16); /* 200 us per group end */
  assert_string_equal(s.mode, "auto");
  assert_true(s.measured > 0);
  assert_true(s.fixed_ns > 100000); /* the spin, seen as the fixed cost */
  /* The fixed cost is amortised (its share bound allows hundreds of ops), so
   * the latency bound, 50 us / per_op, decides how far the cap grows from the
   * start: well past it in a release build (per op 0.2-0.3 us: caps 150-250),
   * but under ASan+UBSan on a slow machine per op is 2-4 us (caps 11-22), at
   * or below the start. Where the measured per-op cost leaves room for twice
   * the start, the cap must have grown past it; elsewhere it must follow the
   * fit (a factor of 2 per sample at most). */
  unsigned want = ncfsm__coalesce_choose(s.fixed_ns, s.per_op_ns);
  assert_true(want == (unsigned)(NCFSM__COALESCE_LATENCY_NS / s.per_op_ns)); /* the latency bound decides */
  if (NCFSM__COALESCE_LATENCY_NS / s.per_op_ns >= 2.0 * NCFSM__COALESCE_START) assert_true(s.cap > NCFSM__COALESCE_START);
  else assert_true(s.cap * 2 >= want && s.cap <= want * 2);
}

static void test_engine_cheap_stays_small(void **state) {
  (void)state;
  coalesce_seen s = run_stream(0, 0, 12); /* (the first rounds fill the pools: their mallocs are fixed costs too) */
  assert_true(s.measured > 0);
  assert_true(s.fixed_ns < 100000);
  /* the null backend's group costs next to nothing: a cap below the fixed default's 64 */
  assert_true(s.cap < 64);
}

static void test_engine_pinned(void **state) {
  (void)state;
  coalesce_seen s = run_stream(64, 200000, 1);
  assert_string_equal(s.mode, "fixed");
  assert_int_equal(s.cap, 64);
  assert_int_equal(s.measured, 0); /* a pinned cap times nothing */
  assert_true(s.fixed_ns < 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fit),
      cmocka_unit_test(test_choose),
      cmocka_unit_test(test_sample_and_probe),
      cmocka_unit_test(test_setting),
      cmocka_unit_test(test_engine_expensive_grows),
      cmocka_unit_test(test_engine_cheap_stays_small),
      cmocka_unit_test(test_engine_pinned),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
