/* The rules of the conformance harness, on hand-made tables:
 *   - check.c refuses a varying outcome set on anything but raw rows on nccl,
 *     a known difference for an ncfsm row on nccl, a wildcard backend, a known
 *     difference on a varying row, an entry without evidence;
 *   - evaluate.c gives VARIES only to raw rows on nccl whose whole observation
 *     was listed, KNOWN only for the named backend, FAIL without expectation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "conformance.h"

static void fn_none(ctx_t *x, obs_t *o) {
  (void)x;
  (void)o;
}

/* ---- the tables evaluate.c reads (globals, as known.c and expect_ncfsm.c define them) ---- */

const known_t knowns[] = {
    {"s_known", "raw", "nccl", "data", "data-seen", "measured", {"docs/results/x.json"}},
};
const int nknowns = 1;

const ncfsm_expect_t ncfsm_expectations[] = {
    {"s_var", {"n-rc", "n-async", "n-data", "n-health"}, {0}, "dep"},
    {"s_known", {"n-rc", "n-async", "n-data", "n-health"}, {0}, "dep"},
    {"s_norev", {0}, {"u-rc", "u-async", "u-data", "u-health"}, "dep"},
};
const int ncfsm_nexpectations = 3;

static const outcome_t outcomes[] = {
    {{"o-rc", "o-async", "o-data", "o-health"}, "seen once", {"docs/results/x.json"}},
};
static const varies_t v_raw_nccl = {"raw", "nccl", outcomes, 1};
static const varies_t v_ncfsm_nccl = {"ncfsm", "nccl", outcomes, 1};
static const varies_t v_raw_sim = {"raw", "sim", outcomes, 1};
static const outcome_t outcome_no_evidence[] = {{{"o-rc", "o-async", "o-data", "o-health"}, "seen", {NULL}}};
static const varies_t v_no_evidence = {"raw", "nccl", outcome_no_evidence, 1};

#define EXP_RAW {"e-rc", "e-async", "e-data", "e-health"}

static const scen_t s_var = {
    .id = "s_var", .rule = "R1", .title = "varies", .fn = {fn_none, fn_none}, .raw = EXP_RAW, .varies = &v_raw_nccl};
static const scen_t s_known = {.id = "s_known", .rule = "R1", .title = "known", .fn = {fn_none, fn_none}, .raw = EXP_RAW};
static const scen_t s_norev = {.id = "s_norev",
                               .rule = "R1",
                               .title = "only without revoke",
                               .fn = {fn_none, fn_none},
                               .raw_norevoke = {"u-rc", "u-async", "u-data", "u-health"}};

static char err[512];

static int check(const scen_t *const *sc, int n, const known_t *k, int nk) {
  err[0] = '\0';
  return registry_check(sc, n, ncfsm_expectations, ncfsm_nexpectations, k, nk, NULL, err, sizeof err);
}

static void test_good_tables_pass(void **state) {
  (void)state;
  const scen_t *sc[] = {&s_var, &s_known, &s_norev};
  assert_int_equal(check(sc, 3, knowns, nknowns), 0);
}

static void test_varies_only_raw_on_nccl(void **state) {
  (void)state;
  scen_t a = s_var, b = s_var;
  a.varies = &v_ncfsm_nccl;
  b.varies = &v_raw_sim;
  const scen_t *sa[] = {&a, &s_known, &s_norev};
  const scen_t *sb[] = {&b, &s_known, &s_norev};
  assert_int_equal(check(sa, 3, knowns, nknowns), -1);
  assert_non_null(strstr(err, "only raw rows on real NCCL may vary"));
  assert_int_equal(check(sb, 3, knowns, nknowns), -1);
  assert_non_null(strstr(err, "raw on sim"));
}

static void test_varies_needs_evidence(void **state) {
  (void)state;
  scen_t a = s_var;
  a.varies = &v_no_evidence;
  const scen_t *sa[] = {&a, &s_known, &s_norev};
  assert_int_equal(check(sa, 3, knowns, nknowns), -1);
  assert_non_null(strstr(err, "no evidence"));
}

static void test_known_rules(void **state) {
  (void)state;
  const scen_t *sc[] = {&s_var, &s_known, &s_norev};
  const known_t ncfsm_nccl = {"s_known", "ncfsm", "nccl", "data", "x", "r", {"docs/results/x.json"}};
  const known_t ncfsm_sim = {"s_known", "ncfsm", "sim", "data", "x", "r", {"docs/results/x.json"}};
  const known_t wildcard = {"s_known", "raw", "*", "data", "x", "r", {"docs/results/x.json"}};
  const known_t on_varying = {"s_var", "raw", "nccl", "data", "x", "r", {"docs/results/x.json"}};
  const known_t no_evidence = {"s_known", "raw", "nccl", "data", "x", "r", {NULL}};
  const known_t outside_docs = {"s_known", "raw", "nccl", "data", "x", "r", {"/tmp/x.json"}};
  const known_t bad_field = {"s_known", "raw", "nccl", "info", "x", "r", {"docs/results/x.json"}};
  assert_int_equal(check(sc, 3, &ncfsm_nccl, 1), -1);
  assert_non_null(strstr(err, "ncfsm row on real NCCL cannot be a known difference"));
  assert_int_equal(check(sc, 3, &ncfsm_sim, 1), 0);
  assert_int_equal(check(sc, 3, &wildcard, 1), -1);
  assert_int_equal(check(sc, 3, &on_varying, 1), -1);
  assert_non_null(strstr(err, "varying outcome set"));
  assert_int_equal(check(sc, 3, &no_evidence, 1), -1);
  assert_int_equal(check(sc, 3, &outside_docs, 1), -1);
  assert_int_equal(check(sc, 3, &bad_field, 1), -1);
}

static void test_evidence_must_exist(void **state) {
  (void)state;
  const scen_t *sc[] = {&s_var, &s_known, &s_norev};
  assert_int_equal(registry_check(sc, 3, ncfsm_expectations, ncfsm_nexpectations, knowns, nknowns,
                                  "/nonexistent-source-dir", err, sizeof err),
                   -1);
  assert_non_null(strstr(err, "does not exist"));
}

static void test_expectations_complete(void **state) {
  (void)state;
  scen_t partial = s_known;
  partial.raw.health = NULL;
  const scen_t *sa[] = {&s_var, &partial, &s_norev};
  assert_int_equal(check(sa, 3, knowns, nknowns), -1);
  scen_t orphan = s_known;
  orphan.id = "s_orphan"; /* runs in ncfsm mode, no entry in ncfsm_expectations */
  const scen_t *sb[] = {&s_var, &s_known, &s_norev, &orphan};
  assert_int_equal(check(sb, 4, knowns, nknowns), -1);
  assert_non_null(strstr(err, "expect_ncfsm.c"));
  const scen_t *sc[] = {&s_var, &s_norev}; /* expect_ncfsm.c names s_known, which is gone */
  assert_int_equal(check(sc, 2, knowns, nknowns), -1);
}

static void set_obs(result_t *r, const scen_t *s, int m, const char *rc, const char *as, const char *da,
                    const char *he) {
  memset(r, 0, sizeof *r);
  r->s = s;
  r->mode = m;
  snprintf(r->o.rc, sizeof r->o.rc, "%s", rc);
  snprintf(r->o.async, sizeof r->o.async, "%s", as);
  snprintf(r->o.data, sizeof r->o.data, "%s", da);
  snprintf(r->o.health, sizeof r->o.health, "%s", he);
}

static const unsigned REVOKE = NCFSM__HAS_REVOKE;

static void test_evaluate_varies(void **state) {
  (void)state;
  result_t r;
  set_obs(&r, &s_var, M_RAW, "e-rc", "e-async", "e-data", "e-health");
  assert_int_equal(evaluate("nccl", REVOKE, &s_var, M_RAW, &r), 0);
  assert_string_equal(r.verdict, "PASS");
  set_obs(&r, &s_var, M_RAW, "o-rc", "o-async", "o-data", "o-health");
  assert_int_equal(evaluate("nccl", REVOKE, &s_var, M_RAW, &r), 2);
  assert_string_equal(r.verdict, "VARIES");
  assert_non_null(strstr(r.why, "docs/results/x.json"));
  /* the same observation on the sim is a deviation */
  assert_int_equal(evaluate("sim", REVOKE, &s_var, M_RAW, &r), 3);
  assert_string_equal(r.verdict, "FAIL");
  /* a mix of the outcome and the expectation was never observed as a whole */
  set_obs(&r, &s_var, M_RAW, "o-rc", "e-async", "e-data", "e-health");
  assert_int_equal(evaluate("nccl", REVOKE, &s_var, M_RAW, &r), 3);
  assert_non_null(strstr(r.why, "none of the 1 outcomes"));
  /* ncfsm rows never vary, even with a varies_t that names ncfsm */
  scen_t bad = s_var;
  bad.varies = &v_ncfsm_nccl;
  set_obs(&r, &bad, M_NCFSM, "o-rc", "o-async", "o-data", "o-health");
  assert_int_equal(evaluate("nccl", REVOKE, &bad, M_NCFSM, &r), 3);
  set_obs(&r, &s_var, M_NCFSM, "n-rc", "n-async", "n-data", "n-health");
  assert_int_equal(evaluate("nccl", REVOKE, &s_var, M_NCFSM, &r), 0);
}

static void test_evaluate_known(void **state) {
  (void)state;
  result_t r;
  set_obs(&r, &s_known, M_RAW, "e-rc", "e-async", "data-seen", "e-health");
  assert_int_equal(evaluate("nccl", REVOKE, &s_known, M_RAW, &r), 1);
  assert_string_equal(r.verdict, "KNOWN");
  assert_int_equal(evaluate("sim", REVOKE, &s_known, M_RAW, &r), 3);
  set_obs(&r, &s_known, M_RAW, "e-rc", "e-async", "data-other", "e-health");
  assert_int_equal(evaluate("nccl", REVOKE, &s_known, M_RAW, &r), 3);
  set_obs(&r, &s_known, M_NCFSM, "n-rc", "n-async", "data-seen", "n-health");
  assert_int_equal(evaluate("nccl", REVOKE, &s_known, M_NCFSM, &r), 3);
}

static void test_evaluate_without_expectation(void **state) {
  (void)state;
  result_t r;
  set_obs(&r, &s_norev, M_RAW, "u-rc", "u-async", "u-data", "u-health");
  assert_int_equal(evaluate("sim", 0, &s_norev, M_RAW, &r), 0);
  /* with Revoke present the scenario has no expectation: FAIL, not a silent PASS */
  assert_int_equal(evaluate("sim", REVOKE, &s_norev, M_RAW, &r), 3);
  assert_non_null(strstr(r.why, "no raw expectation"));
  set_obs(&r, &s_norev, M_NCFSM, "u-rc", "u-async", "u-data", "u-health");
  assert_int_equal(evaluate("sim", 0, &s_norev, M_NCFSM, &r), 0);
  assert_int_equal(evaluate("sim", REVOKE, &s_norev, M_NCFSM, &r), 3);
}

static void test_features_fallback(void **state) {
  (void)state;
  const unsigned all = NCFSM__HAS_REVOKE | NCFSM__HAS_SHRINK;
  scen_t s = s_known;
  s.sim_has_revoke = -1;
  assert_int_equal(scen_features_fallback(&s, 1, all), all);
  s.sim_has_revoke = 0; /* the sim's per-comm knob */
  assert_int_equal(scen_features_fallback(&s, 1, all), NCFSM__HAS_SHRINK);
  assert_int_equal(scen_features_fallback(&s, 0, all), all); /* a sim knob says nothing about NCCL */
  s.sim_has_revoke = -1;
  s.sim_version = 22803;
  assert_int_equal(scen_features_fallback(&s, 1, all), NCFSM__HAS_SHRINK);
  s.sim_version = 22809;
  assert_int_equal(scen_features_fallback(&s, 1, all), all);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good_tables_pass),
      cmocka_unit_test(test_varies_only_raw_on_nccl),
      cmocka_unit_test(test_varies_needs_evidence),
      cmocka_unit_test(test_known_rules),
      cmocka_unit_test(test_evidence_must_exist),
      cmocka_unit_test(test_expectations_complete),
      cmocka_unit_test(test_evaluate_varies),
      cmocka_unit_test(test_evaluate_known),
      cmocka_unit_test(test_evaluate_without_expectation),
      cmocka_unit_test(test_features_fallback),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
