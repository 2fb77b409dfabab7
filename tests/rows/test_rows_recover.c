/*
 * Every row of fsm/recover.def walked (tests/rows/rows.h): the recovery of
 * armed comms, 1 to 3 ranks on one loop driven by one thread, over the
 * in-process bootstrap (its agreement and survivors' bootstraps): shrink
 * after a lost rank (a member closes its bootstrap), re-init when every
 * rank is alive (ncfsm_comm_recover), and every way a recovery fails or is
 * cancelled: the old comm aborted under it, an agreement or a vote that
 * times out (the bootstrap's timeout_ms), a new comm that fails or hangs
 * (the kit's INIT_FAIL / INIT_HANG on the new comm's name), options the new
 * comm cannot be made with, and the loop closed while it runs. Each
 * scenario checks the report (status, how, why, the excluded ranks), the
 * old and new comms' states, or that a cancelled recovery reports nothing.
 *
 * The loop is embedded in a base of the test's own, so that the bootstraps
 * (opened on that base) can be closed after ncfsm_loop_close cancelled the
 * recoveries (which closes their survivors' bootstraps first).
 */
#include <stdio.h>
#include <string.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "fsm/objects.h"
#include "rows_world.h"

#define M "recover"

#define BOOT_SHORT_MS 50 /* a bootstrap whose requests fail soon when a rank never posts */

struct rank {
  ncfsm_comm *c;
  ncfsm_boot *b;
  int reports;
  ncfsm_result_t status;
  char how[16], why[400];
  ncfsm_comm *fresh;
  ncfsm_boot *sub;
  int nexcluded, excluded[4];
};

static struct {
  struct event_base *base;
  ncfsm_loop *loop;
  int n;
  struct rank r[3];
  ncfsm_comm_opts o, fo;
  ncfsm_sim_opts so, fso;
} W;

static void on_report(const ncfsm_recovery_report *rep, void *arg) {
  struct rank *x = arg;
  x->reports++;
  x->status = rep->status;
  snprintf(x->how, sizeof x->how, "%s", rep->how);
  snprintf(x->why, sizeof x->why, "%s", rep->why);
  x->fresh = rep->fresh;
  x->sub = rep->boot;
  x->nexcluded = rep->nexcluded;
  for (int k = 0; k < rep->nexcluded && k < 4; k++) x->excluded[k] = rep->excluded[k];
  assert_ptr_equal(rep->old, x->c);
}


/* n READY ranks over one bootstrap group (timeout boot_ms), armed with the
 * error policy SHRINK; the new comms are named "rec.fresh". */
static void up(int n, uint64_t boot_ms) {
  memset(&W, 0, sizeof W);
  W.n = n;
  assert_int_equal(evthread_use_pthreads(), 0);
  W.base = event_base_new();
  assert_non_null(W.base);
  assert_int_equal(ncfsm_loop_new_embedded(W.base, NULL, &W.loop), NCFSM_OK);
  opts_init(&W.o, &W.so, "rec");
  W.o.on_error = NCFSM_ON_ERROR_SHRINK;
  opts_init(&W.fo, &W.fso, "rec.fresh");
  ncfsm_comm *c[3];
  ncfsm_boot *b[3];
  comms_boot(W.loop, n, (const ncfsm_comm_opts *[]){&W.o, NULL, NULL}, c, b, boot_ms);
  for (int r = 0; r < n; r++) {
    W.r[r].c = c[r];
    W.r[r].b = b[r];
  }
  for (int r = 0; r < n; r++) {
    want_state(c[r], NCFSM_STATE_READY);
    ncfsm_recovery_opts ro = {b[r], &W.fo, on_report, &W.r[r]};
    assert_int_equal(ncfsm_comm_set_recovery(c[r], &ro), NCFSM_OK);
  }
}

/* Rank r's process ends: it disarms its comm and closes its bootstrap (a lost rank to the others). */
static void lose(int r) {
  assert_int_equal(ncfsm_comm_set_recovery(W.r[r].c, NULL), NCFSM_OK);
  assert_int_equal(ncfsm_boot_close(W.r[r].b), NCFSM_OK);
  W.r[r].b = NULL;
}

static int g_want_reports;
static bool reported(void *arg) {
  (void)arg;
  for (int r = 0; r < W.n; r++)
    if ((g_want_reports >> r & 1) && !W.r[r].reports) return false;
  return true;
}
/* The ranks of mask get their reports. */
static void until_reports(int mask) {
  g_want_reports = mask;
  run_until(W.loop, reported, NULL, "the recoveries' reports");
}

struct row_wait {
  const char *s, *e;
  unsigned n;
};
static bool row_reached(void *arg) {
  struct row_wait *x = arg;
  return rows_hits(M, x->s, x->e, "ANY") >= x->n;
}
/* Runs until row (s, e) fired n times in all. */
static void until_row(const char *s, const char *e, unsigned n) {
  struct row_wait x = {s, e, n};
  char what[96];
  snprintf(what, sizeof what, "recover row %s --%s-->", s, e);
  run_until(W.loop, row_reached, &x, what);
}

/* Abort and release every comm (without turning the loop: a recovery still
 * running is cancelled by ncfsm_loop_close), close the loop, the survivors'
 * bootstraps the reports handed over, the bootstraps, the base. */
static void down(void) {
  for (int r = 0; r < W.n; r++) {
    ncfsm_comm *cs[2] = {W.r[r].fresh, W.r[r].c};
    for (int k = 0; k < 2; k++) {
      if (!cs[k]) continue;
      ncfsm_state_t s = ncfsm_comm_state(cs[k]);
      if (s != NCFSM_STATE_CLOSED) assert_int_equal(ncfsm_comm_abort(cs[k]), NCFSM_OK);
      assert_int_equal(ncfsm_comm_state(cs[k]), NCFSM_STATE_CLOSED);
      assert_int_equal(ncfsm_comm_release(cs[k]), NCFSM_OK);
    }
    if (W.r[r].sub) assert_int_equal(ncfsm_boot_close(W.r[r].sub), NCFSM_OK);
  }
  ncfsm_result_t cr = ncfsm_loop_close(W.loop);
  if (cr != NCFSM_OK) fail_msg("ncfsm_loop_close: %s", ncfsm_loop_last_error(W.loop));
  for (int r = 0; r < W.n; r++)
    if (W.r[r].b) assert_int_equal(ncfsm_boot_close(W.r[r].b), NCFSM_OK);
  event_base_free(W.base);
}

static int32_t buf[3][8];

/* An AllReduce on the ranks' new comms: the sum over the survivors. */
static void fresh_allreduce(int n) {
  ncfsm_work *w[3];
  for (int r = 0; r < n; r++) {
    for (int i = 0; i < 8; i++) buf[r][i] = r + 1;
    assert_int_equal(ncfsm_allreduce(W.r[r].fresh, buf[r], buf[r], 8, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[r]),
                     NCFSM_OK);
  }
  for (int r = 0; r < n; r++) {
    assert_int_equal(work_final(w[r]), NCFSM_OK);
    assert_int_equal(buf[r][0], n * (n + 1) / 2);
    assert_int_equal(ncfsm_work_release(w[r]), NCFSM_OK);
  }
}

static void want_failed_report(int r, const char *why) {
  assert_int_equal(W.r[r].reports, 1);
  assert_int_not_equal(W.r[r].status, NCFSM_OK);
  assert_null(W.r[r].fresh);
  if (!strstr(W.r[r].why, why)) fail_msg("rank %d's report: \"%s\" lacks \"%s\"", r, W.r[r].why, why);
  assert_int_equal(ncfsm_comm_state(W.r[r].c), NCFSM_STATE_CLOSED); /* the old comm is aborted */
}

/* ---- the paths that end in a new comm ------------------------------------------------------------- */

/* ARMED -COMM_FAILED-> STARTING -STEP-> AGREEING -AGREED-> PLANNING -VOTED_YES->
 * SHRINKING -FRESH_READY-> CONFIRMING -VOTED_YES-> DONE: rank 2 is lost; ranks 0
 * and 1 revoke, agree, shrink to themselves and use the new comm; the loop's
 * close then cancels the new comms' armed recoveries and finds the old ones DONE. */
static void test_shrink(void **state) {
  (void)state;
  const char *rows[][2] = {{"ARMED", "COMM_FAILED"}, {"STARTING", "STEP"},   {"AGREEING", "AGREED"},
                           {"PLANNING", "VOTED_YES"}, {"SHRINKING", "FRESH_READY"}, {"CONFIRMING", "VOTED_YES"},
                           {"ARMED", "CANCEL"},       {"DONE", "CANCEL"}};
  unsigned before[8];
  for (int i = 0; i < 8; i++) before[i] = rows_hits(M, rows[i][0], rows[i][1], "ANY");
  up(3, LIMIT_MS);
  lose(2);
  until_reports(3);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(W.r[r].status, NCFSM_OK);
    assert_string_equal(W.r[r].how, "shrink");
    assert_int_equal(W.r[r].nexcluded, 1);
    assert_int_equal(W.r[r].excluded[0], 2);
    assert_int_equal(ncfsm_comm_state(W.r[r].fresh), NCFSM_STATE_READY);
    assert_int_equal(ncfsm_comm_size(W.r[r].fresh), 2);
    assert_int_equal(ncfsm_comm_state(W.r[r].c), NCFSM_STATE_CLOSED); /* R7: aborted, never destroyed */
    want_text(W.r[r].c, true, "rank 2 lost (bootstrap:");
  }
  fresh_allreduce(2);
  assert_int_equal(ncfsm_comm_state(W.r[2].c), NCFSM_STATE_READY); /* the lost rank's comm is as it was */
  down();
  for (int i = 0; i < 8; i++) ROW_FIRED(M, rows[i][0], rows[i][1], "ANY", before[i]);
}

/* PLANNING -VOTED_NO-> REINIT -FRESH_READY-> DONE: every rank asks for a
 * recovery (ncfsm_comm_recover) and every one is alive: nobody to exclude,
 * so the survivors initialise a new comm over their bootstrap. */
static void test_reinit(void **state) {
  (void)state;
  unsigned n0 = rows_hits(M, "PLANNING", "VOTED_NO", "ANY"), f0 = rows_hits(M, "REINIT", "FRESH_READY", "ANY");
  up(2, LIMIT_MS);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_recover(W.r[r].c), NCFSM_OK);
  assert_int_equal(ncfsm_comm_recover(W.r[0].c), NCFSM_ERR_ILLEGAL_STATE); /* it started already */
  until_reports(3);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(W.r[r].status, NCFSM_OK);
    assert_string_equal(W.r[r].how, "reinit");
    assert_int_equal(W.r[r].nexcluded, 0);
    assert_int_equal(ncfsm_comm_size(W.r[r].fresh), 2);
  }
  fresh_allreduce(2);
  ROW_FIRED(M, "PLANNING", "VOTED_NO", "ANY", n0);
  ROW_FIRED(M, "REINIT", "FRESH_READY", "ANY", f0);
  down();
}

/* ---- the old comm aborted, and the loop closed, under a recovery ------------------------------------ */

/* STARTING -OLD_CLOSED-> FAILED (and FAILED -CANCEL-> FAILED at the close):
 * the program aborts the comm before the recovery's first step. */
static void test_starting_old_closed(void **state) {
  (void)state;
  unsigned o0 = rows_hits(M, "STARTING", "OLD_CLOSED", "ANY"), c0 = rows_hits(M, "FAILED", "CANCEL", "ANY");
  up(1, LIMIT_MS);
  assert_int_equal(ncfsm_comm_recover(W.r[0].c), NCFSM_OK);
  assert_int_equal(ncfsm_comm_abort(W.r[0].c), NCFSM_OK);
  until_reports(1);
  want_failed_report(0, "recovery requested");
  ROW_FIRED(M, "STARTING", "OLD_CLOSED", "ANY", o0);
  down();
  ROW_FIRED(M, "FAILED", "CANCEL", "ANY", c0);
}

/* STARTING -CANCEL-> CANCELLED: the comm is aborted and released, and the
 * loop closed, before the recovery's first step: no report. */
static void test_starting_cancel(void **state) {
  (void)state;
  unsigned c0 = rows_hits(M, "STARTING", "CANCEL", "ANY");
  up(1, LIMIT_MS);
  assert_int_equal(ncfsm_comm_recover(W.r[0].c), NCFSM_OK);
  down();
  assert_int_equal(W.r[0].reports, 0);
  ROW_FIRED(M, "STARTING", "CANCEL", "ANY", c0);
}

enum { END_OLD_CLOSED, END_STEP_FAILED, END_CANCEL };

/* AGREEING: rank 0 asks for a recovery, rank 1 (alive) never joins the
 * agreement; ended by an abort of rank 0's comm, the agreement's timeout, or
 * the loop's close. */
static void test_agreeing(void **state) {
  (void)state;
  static const char *const ev[] = {"OLD_CLOSED", "STEP_FAILED", "CANCEL"};
  for (int how = 0; how < 3; how++) {
    unsigned h0 = rows_hits(M, "AGREEING", ev[how], "ANY");
    up(2, how == END_STEP_FAILED ? BOOT_SHORT_MS : LIMIT_MS);
    unsigned s0 = rows_hits(M, "STARTING", "STEP", "ANY");
    assert_int_equal(ncfsm_comm_recover(W.r[0].c), NCFSM_OK);
    until_row("STARTING", "STEP", s0 + 1);
    run_turns(W.loop, 5);
    assert_int_equal(W.r[0].reports, 0);
    assert_int_equal(ncfsm_comm_state(W.r[0].c), NCFSM_STATE_REVOKED); /* R6 first, where the runtime has it */
    if (how == END_OLD_CLOSED) {
      assert_int_equal(ncfsm_comm_abort(W.r[0].c), NCFSM_OK);
      until_reports(1);
      want_failed_report(0, "recovery requested");
    } else if (how == END_STEP_FAILED) {
      until_reports(1);
      want_failed_report(0, "the survivors' agreement failed");
    }
    down();
    if (how == END_CANCEL) assert_int_equal(W.r[0].reports, 0);
    ROW_FIRED(M, "AGREEING", ev[how], "ANY", h0);
  }
}

/* PLANNING: both ranks recover, but rank 1's revoke never becomes quiescent
 * (the kit's SLOW fault on REVOKING), so it stays AGREEING and never votes;
 * rank 0 waits in PLANNING. Ended by aborting both comms (rank 1's recovery
 * leaves AGREEING too), the vote's timeout, or the loop's close. */
static void test_planning(void **state) {
  (void)state;
  static const char *const ev[] = {"OLD_CLOSED", "STEP_FAILED", "CANCEL"};
  for (int how = 0; how < 3; how++) {
    unsigned h0 = rows_hits(M, "PLANNING", ev[how], "ANY"), a0 = rows_hits(M, "AGREEING", ev[how], "ANY");
    kit_begin("recover.planning");
    ncfsm_fault f = kit_fault_of(NCFSM_FAULT_SLOW, "rec", 1);
    f.when = NCFSM_AT_STATE;
    f.state = NCFSM_STATE_REVOKING;
    f.polls = -1;
    kit_fault(&f);
    up(2, how == END_STEP_FAILED ? BOOT_SHORT_MS : LIMIT_MS);
    unsigned g0 = rows_hits(M, "AGREEING", "AGREED", "ANY");
    for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_recover(W.r[r].c), NCFSM_OK);
    until_row("AGREEING", "AGREED", g0 + 1); /* rank 0's */
    run_turns(W.loop, 5);
    assert_int_equal(ncfsm_comm_state(W.r[1].c), NCFSM_STATE_REVOKING);
    if (how == END_OLD_CLOSED) {
      int n = 2; /* rank 1 is AGREEING */
      for (int r = 0; r < n; r++) assert_int_equal(ncfsm_comm_abort(W.r[r].c), NCFSM_OK);
      until_reports(n == 2 ? 3 : 1);
      for (int r = 0; r < n; r++) want_failed_report(r, "recovery requested");
      ROW_FIRED(M, "AGREEING", "OLD_CLOSED", "ANY", a0);
    } else if (how == END_STEP_FAILED) {
      until_reports(1);
      want_failed_report(0, "the survivors' vote failed");
    }
    down();
    if (how == END_CANCEL) {
      for (int r = 0; r < 2; r++) assert_int_equal(W.r[r].reports, 0);
      ROW_FIRED(M, "AGREEING", "CANCEL", "ANY", a0);
    }
    ROW_FIRED(M, "PLANNING", ev[how], "ANY", h0);
    kit_end();
  }
}

/* ---- a new comm that fails, hangs, or cannot be made ------------------------------------------------ */

/* SHRINKING -FRESH_FAILED-> CONFIRMING -VOTED_NO-> REINIT -FRESH_FAILED-> FAILED:
 * rank 2 is lost, but every new comm's init fails (the kit's INIT_FAIL on
 * "rec.fresh"): the shrunk one, then the re-initialised one. */
static void test_fresh_fails(void **state) {
  (void)state;
  unsigned s0 = rows_hits(M, "SHRINKING", "FRESH_FAILED", "ANY"), n0 = rows_hits(M, "CONFIRMING", "VOTED_NO", "ANY"),
           f0 = rows_hits(M, "REINIT", "FRESH_FAILED", "ANY");
  kit_begin("recover.fresh_fails");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_INIT_FAIL, "rec.fresh", -1);
  kit_fault(&f);
  up(3, LIMIT_MS);
  lose(2);
  until_reports(3);
  for (int r = 0; r < 2; r++) {
    want_failed_report(r, "the new communicator over the survivors failed");
    assert_string_equal(W.r[r].how, "reinit");
  }
  ROW_FIRED(M, "SHRINKING", "FRESH_FAILED", "ANY", s0);
  ROW_FIRED(M, "CONFIRMING", "VOTED_NO", "ANY", n0);
  ROW_FIRED(M, "REINIT", "FRESH_FAILED", "ANY", f0);
  down();
  kit_end();
}

/* CONFIRMING and SHRINKING: rank 2 is lost; rank 1's shrunk comm never gets
 * READY (the kit's INIT_HANG), so rank 1 stays SHRINKING and never votes,
 * and rank 0 (READY) waits in CONFIRMING. Ended by the vote's timeout or the
 * loop's close. */
static void test_confirming(void **state) {
  (void)state;
  for (int how = END_STEP_FAILED; how <= END_CANCEL; how++) {
    const char *ev = how == END_CANCEL ? "CANCEL" : "STEP_FAILED";
    unsigned c0 = rows_hits(M, "CONFIRMING", ev, "ANY"), s0 = rows_hits(M, "SHRINKING", "CANCEL", "ANY");
    kit_begin("recover.confirming");
    ncfsm_fault f = kit_fault_of(NCFSM_FAULT_INIT_HANG, "rec.fresh", 1);
    kit_fault(&f);
    up(3, how == END_STEP_FAILED ? BOOT_SHORT_MS : LIMIT_MS);
    unsigned r0 = rows_hits(M, "SHRINKING", "FRESH_READY", "ANY");
    lose(2);
    until_row("SHRINKING", "FRESH_READY", r0 + 1); /* rank 0's */
    run_turns(W.loop, 5);
    if (how == END_STEP_FAILED) {
      until_reports(1);
      want_failed_report(0, "the survivors' vote failed");
    }
    down();
    if (how == END_CANCEL) {
      for (int r = 0; r < 2; r++) assert_int_equal(W.r[r].reports, 0);
      ROW_FIRED(M, "SHRINKING", "CANCEL", "ANY", s0);
    }
    ROW_FIRED(M, "CONFIRMING", ev, "ANY", c0);
    kit_end();
  }
}

/* REINIT -CANCEL-> CANCELLED: every rank asks for a recovery; the new comm's
 * init never ends (the kit's INIT_HANG) and the loop closes. */
static void test_reinit_cancel(void **state) {
  (void)state;
  unsigned c0 = rows_hits(M, "REINIT", "CANCEL", "ANY");
  kit_begin("recover.reinit_hang");
  ncfsm_fault f = kit_fault_of(NCFSM_FAULT_INIT_HANG, "rec.fresh", -1);
  kit_fault(&f);
  up(2, LIMIT_MS);
  unsigned v0 = rows_hits(M, "PLANNING", "VOTED_NO", "ANY");
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_recover(W.r[r].c), NCFSM_OK);
  until_row("PLANNING", "VOTED_NO", v0 + 2);
  run_turns(W.loop, 5);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_state(W.r[r].c), NCFSM_STATE_CLOSED); /* aborted for the re-init */
  down();
  for (int r = 0; r < 2; r++) assert_int_equal(W.r[r].reports, 0);
  ROW_FIRED(M, "REINIT", "CANCEL", "ANY", c0);
  kit_end();
}

/* REINIT -STEP_FAILED-> FAILED: the new comm cannot be made (its options,
 * opts.fresh_opts, are refused). */
static void test_reinit_step_failed(void **state) {
  (void)state;
  unsigned f0 = rows_hits(M, "REINIT", "STEP_FAILED", "ANY");
  up(2, LIMIT_MS);
  /* the new comms cannot be made (out of memory): the shrink's, then the reinit's */
  rows_fail_calloc(1, sizeof(ncfsm_comm), 4);
  for (int r = 0; r < 2; r++) assert_int_equal(ncfsm_comm_recover(W.r[r].c), NCFSM_OK);
  until_reports(3);
  for (int r = 0; r < 2; r++)
    want_failed_report(r, "a new communicator over the survivors' bootstrap could not be initialised: out of memory");
  rows_fail_calloc(0, 0, 0);
  ROW_FIRED(M, "REINIT", "STEP_FAILED", "ANY", f0);
  down();
}

static void test_every_row_walked(void **state) {
  (void)state;
  rows_check_all(M, NULL, 0); /* SHRINKING --STEP_FAILED, which nothing fired, left fsm/recover.def */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_shrink, kit_teardown),
      cmocka_unit_test_teardown(test_reinit, kit_teardown),
      cmocka_unit_test_teardown(test_starting_old_closed, kit_teardown),
      cmocka_unit_test_teardown(test_starting_cancel, kit_teardown),
      cmocka_unit_test_teardown(test_agreeing, kit_teardown),
      cmocka_unit_test_teardown(test_planning, kit_teardown),
      cmocka_unit_test_teardown(test_fresh_fails, kit_teardown),
      cmocka_unit_test_teardown(test_confirming, kit_teardown),
      cmocka_unit_test_teardown(test_reinit_cancel, kit_teardown),
      cmocka_unit_test_teardown(test_reinit_step_failed, kit_teardown),
      cmocka_unit_test(test_every_row_walked),
  };
  return cmocka_run_group_tests(tests, rows_setup, NULL);
}
