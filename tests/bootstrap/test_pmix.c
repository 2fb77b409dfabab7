/*
 * pmix bootstrap.
 *   test_pmix mpirun     under `mpirun --oversubscribe -np 4`: rank, size,
 *                        local rank/size, allgather and broadcast contents;
 *                        channels (the suite of chan_suite.h, and the program's
 *                        own PMIx fences crossed with channel collectives in
 *                        both orders) and notices, with their latencies
 *   test_pmix noserver   without a launcher: NCFSM_BOOTSTRAP=pmix fails with
 *                        NCFSM_ERR_BOOTSTRAP and says how to launch
 */
#include <pmix.h>

#include "tests/bootstrap/chan_suite.h"

/* The program's own PMIx fence (with data collection, as MPI_Init's modex does), blocking. */
static void own_fence(int rank, int k) {
  pmix_proc_t me, wild;
  PMIX_LOAD_PROCID(&me, getenv("PMIX_NAMESPACE"), (pmix_rank_t)rank);
  PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
  char key[32];
  snprintf(key, sizeof key, "app.key.%d", k);
  pmix_value_t v;
  PMIX_VALUE_CONSTRUCT(&v);
  v.type = PMIX_INT;
  v.data.integer = rank * 10 + k;
  assert_int_equal(PMIX_SUCCESS, PMIx_Put(PMIX_GLOBAL, key, &v));
  assert_int_equal(PMIX_SUCCESS, PMIx_Commit());
  pmix_info_t info;
  bool yes = true;
  PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
  pmix_status_t rc = PMIx_Fence(&wild, 1, &info, 1);
  if (rc != PMIX_SUCCESS) fail_msg("rank %d: the program's own PMIx_Fence %d: %s", rank, k, PMIx_Error_string(rc));
}

/* Channels with the program's own fences: a channel allgather posted before the program's
 * PMIx_Fence on even ranks and after it on odd ranks (then the other way round); several
 * channel rounds outstanding across a fence. Neither waits for the other. */
static void own_fences_and_channels(struct event_base *base, ncfsm_boot *b) {
  int rank = ncfsm_boot_rank(b), size = ncfsm_boot_size(b);
  ncfsm_boot *ch = cs_open(b, "pmix.own-fences", NULL, 0);
  for (int k = 0; k < 4; k++) {
    unsigned char mine[20], all[20 * 8];
    bt_fill(mine, 20, rank, 700 + k);
    ncfsm_boot_req *q = NULL;
    if ((rank + k) % 2 == 0) {
      assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(ch, mine, all, 20, &q));
      own_fence(rank, k);
    } else {
      own_fence(rank, k);
      assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(ch, mine, all, 20, &q));
    }
    if (bt_wait(base, q, 20) != NCFSM_OK) fail_msg("round %d: %s", k, ncfsm_boot_last_error(ch));
    ncfsm_boot_req_free(q);
    bt_check(all, 20, size, 700 + k);
  }
  /* three rounds outstanding while the program fences twice */
  int v[3], out[3][8];
  ncfsm_boot_req *q[3];
  for (int j = 0; j < 3; j++) {
    v[j] = rank * 100 + j;
    assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(ch, &v[j], out[j], sizeof v[j], &q[j]));
  }
  own_fence(rank, 10);
  own_fence(rank, 11);
  bt_wait_all(base, q, 3);
  for (int j = 0; j < 3; j++) {
    if (ncfsm_boot_test(q[j]) != NCFSM_OK) fail_msg("outstanding %d: %s", j, ncfsm_boot_last_error(ch));
    ncfsm_boot_req_free(q[j]);
    for (int r = 0; r < size; r++) assert_int_equal(r * 100 + j, out[j][r]);
  }
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(ch));
}

static void pmix_channels(struct event_base *base, ncfsm_boot *b) {
  cs_interleave(base, &b, 1);
  cs_two_channels(base, &b, 1);
  cs_late_open(base, &b, 1);
  cs_subset(base, &b, 1);
  own_fences_and_channels(base, b);
  double lat[1];
  cs_notice_round(base, &b, 1, 2, 0x77, lat);
  int size = ncfsm_boot_size(b), rank = ncfsm_boot_rank(b), members[2] = {size - 1, 1};
  ncfsm_boot *ch = rank == size - 1 || rank == 1 ? cs_open(b, "pmix.notice", members, 2) : NULL;
  cs_notice_round(base, &ch, 1, 1, 0x5151, lat);
  if (ch) assert_int_equal(NCFSM_OK, ncfsm_boot_close(ch));
  cs_misuse(b);
  double worst;
  cs_notice_latency(base, &b, 1, 16, "pmix, mpirun -np 4 (one node)", &worst);
  ncfsm_boot *all = cs_open(b, "pmix.latency", NULL, 0);
  cs_notice_latency(base, &all, 1, 16, "pmix channel of the 4 ranks", &worst);
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(all));
}

static void test_under_mpirun(void **state) {
  (void)state;
  assert_non_null(getenv("PMIX_RANK"));
  unsetenv("NCFSM_BOOTSTRAP");
  struct event_base *base = bt_base();
  ncfsm_boot_opts o;
  ncfsm_boot_opts_init(&o); /* AUTO: PMIX_RANK is set */
  o.timeout_ms = 30000;
  ncfsm_boot *b;
  ncfsm_result_t r = ncfsm_boot_open(base, &o, &b);
  if (r != NCFSM_OK) fail_msg("open: %s", ncfsm_boot_open_error());
  assert_int_equal(NCFSM_BOOT_PMIX, ncfsm_boot_kind(b));
  int rank = ncfsm_boot_rank(b), size = ncfsm_boot_size(b);
  assert_int_equal(4, size);
  assert_int_equal(atoi(getenv("PMIX_RANK")), rank);
  assert_int_equal(4, ncfsm_boot_local_size(b)); /* one node */
  assert_int_equal(rank, ncfsm_boot_local_rank(b));
  for (int k = 0; k < 4; k++) {
    size_t len = 64 + (size_t)k * 1000;
    unsigned char *send = malloc(len), *recv = malloc(len * (size_t)size);
    bt_fill(send, len, rank, k);
    r = ncfsm_boot_allgather(b, send, recv, len);
    if (r != NCFSM_OK) fail_msg("allgather %d: %s", k, ncfsm_boot_last_error(b));
    bt_check(recv, len, size, k);
    free(send);
    free(recv);
  }
  /* two outstanding at once plus a barrier, completed through the loop */
  int v1 = rank * 10, v2 = rank * 10 + 1, o1[4], o2[4];
  ncfsm_boot_req *q[3];
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(b, &v1, o1, sizeof v1, &q[0]));
  assert_int_equal(NCFSM_OK, ncfsm_boot_allgather_post(b, &v2, o2, sizeof v2, &q[1]));
  assert_int_equal(NCFSM_OK, ncfsm_boot_barrier_post(b, &q[2]));
  bt_wait_all(base, q, 3);
  for (int i = 0; i < 3; i++) {
    if (ncfsm_boot_test(q[i]) != NCFSM_OK) fail_msg("req %d: %s", i, ncfsm_boot_last_error(b));
    ncfsm_boot_req_free(q[i]);
  }
  for (int i = 0; i < 4; i++) {
    assert_int_equal(i * 10, o1[i]);
    assert_int_equal(i * 10 + 1, o2[i]);
  }
  /* broadcasts: sizes and roots, with an allgather outstanding (same order), several roots */
  bt_bcast_suite(base, &b, 1, 0);
  /* root_of spreads the roots evenly, root 0 = rank 0 */
  assert_int_equal(0, ncfsm_boot_root_of(size, 2, 0));
  assert_int_equal(2, ncfsm_boot_root_of(size, 2, 1));
  assert_int_equal(-1, ncfsm_boot_root_of(size, 5, 0));
  pmix_channels(base, b);
  /* recovery from dead ranks: not with pmix (mpirun ends the job), said so */
  ncfsm_boot_req *ar = (ncfsm_boot_req *)1;
  ncfsm_boot *sv = (ncfsm_boot *)1;
  assert_int_equal(NCFSM_ERR_UNSUPPORTED, ncfsm_boot_on_peer_lost(b, NULL, NULL));
  assert_non_null(strstr(ncfsm_boot_last_error(b), "mpirun ends the whole job"));
  assert_non_null(strstr(ncfsm_boot_last_error(b), "NCFSM_BOOTSTRAP=tcp"));
  assert_int_equal(NCFSM_ERR_UNSUPPORTED, ncfsm_boot_agree_post(b, 1, &ar));
  assert_null(ar);
  assert_non_null(strstr(ncfsm_boot_last_error(b), "ncfsm_boot_agree_post"));
  assert_int_equal(NCFSM_ERR_UNSUPPORTED, ncfsm_boot_survivors(b, NULL, &sv));
  assert_null(sv);
  assert_non_null(strstr(ncfsm_boot_last_error(b), "NCFSM_BOOTSTRAP=tcp"));
  assert_int_equal(NCFSM_OK, ncfsm_boot_close(b));
  event_base_free(base);
}

static void test_no_server(void **state) {
  (void)state;
  /* as if run outside any launcher */
  unsetenv("PMIX_RANK");
  unsetenv("PMIX_NAMESPACE");
  unsetenv("PMIX_SERVER_URI41");
  unsetenv("PMIX_SERVER_URI4");
  unsetenv("PMIX_SERVER_URI3");
  unsetenv("PMIX_SERVER_URI21");
  unsetenv("PMIX_SERVER_URI2");
  setenv("NCFSM_BOOTSTRAP", "pmix", 1);
  struct event_base *base = bt_base();
  ncfsm_boot_opts o;
  ncfsm_boot_opts_init(&o);
  assert_int_equal(NCFSM_BOOT_PMIX, o.kind);
  ncfsm_boot *b = (ncfsm_boot *)1;
  assert_int_equal(NCFSM_ERR_BOOTSTRAP, ncfsm_boot_open(base, &o, &b));
  assert_null(b);
  assert_non_null(strstr(ncfsm_boot_open_error(), "no PMIx server reachable"));
  assert_non_null(strstr(ncfsm_boot_open_error(), "NCFSM_BOOTSTRAP=tcp"));
  event_base_free(base);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "mpirun")) {
    const struct CMUnitTest tests[] = {BT_TEST(test_under_mpirun)};
    return cmocka_run_group_tests_name("bootstrap_pmix_mpirun", tests, NULL, NULL);
  }
  const struct CMUnitTest tests[] = {BT_TEST(test_no_server)};
  return cmocka_run_group_tests_name("bootstrap_pmix_noserver", tests, NULL, NULL);
}
