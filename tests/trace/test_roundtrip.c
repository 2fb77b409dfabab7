/*
 * The dump schema, written once (fsm/dump.def), on both sides: a dump that
 * the recorder writes (ncfsm__rec_write, fsm/recorder_json.c) is read back by
 * ncfsm-trace's reader (load_dump, tools/trace/reader.c) member by member.
 * Every row of the schema has its expected value here (WANT_<key> for the
 * dump, WANT_ENT_<key> for an entry): a row added to fsm/dump.def does not
 * compile until the writer, the reader's model and this test all handle it.
 * Two ranks' dumps written this way then pass ncfsm-trace's analysis as
 * consistent.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fsm/recorder.h"
#include "tools/trace/check.h"

/* ---- what is written ------------------------------------------------------------------- */
#define N_ENTRIES 6

static ncfsm__rec_entry mk(int op, uint64_t seq, uint64_t count, int dtype, int root, int redop, int peer) {
  ncfsm__rec_entry e;
  memset(&e, 0, sizeof e);
  e.fp.op = op;
  e.fp.seq = seq;
  e.fp.count = count;
  e.fp.dtype = dtype;
  e.fp.root = root;
  e.fp.redop = redop;
  e.fp.peer = peer;
  return e;
}

/* A ring of 6 that holds the last 6 of 106 records: collectives seq 40..42,
 * a send and a receive, and a collective never launched. Every value differs
 * from its neighbours' so that a member read into the wrong field shows. */
static void make_entries(ncfsm__rec_entry *e) {
  e[0] = mk(NCFSM_KIND_ALLREDUCE, 40, 1024, NCFSM_FLOAT32, -1, NCFSM_OP_SUM, -1);
  e[1] = mk(NCFSM_KIND_BROADCAST, 41, 7, NCFSM_INT64, 1, -1, -1);
  e[2] = mk(NCFSM_KIND_SEND, 3, 9, NCFSM_UINT8, -1, -1, 1);
  e[3] = mk(NCFSM_KIND_REDUCE, 42, 11, NCFSM_BFLOAT16, 2, NCFSM_OP_MAX, -1);
  e[4] = mk(NCFSM_KIND_RECV, 5, 13, NCFSM_INT32, -1, -1, 2);
  e[5] = mk(NCFSM_KIND_ALLGATHER, NCFSM__REC_SEQ_NONE, 15, NCFSM_FLOAT16, -1, -1, -1);
  static const int32_t states[N_ENTRIES] = {NCFSM_WORK_COMPLETED, NCFSM_WORK_FAILED,   NCFSM_WORK_COMPLETED,
                                            NCFSM_WORK_IN_FLIGHT, NCFSM_WORK_TIMED_OUT, NCFSM_WORK_QUEUED};
  static const int32_t results[N_ENTRIES] = {NCFSM_OK,        NCFSM_ERR_ASYNC,   NCFSM_OK,
                                             NCFSM_ERR_AGAIN, NCFSM_ERR_TIMEOUT, NCFSM_ERR_AGAIN};
  for (int i = 0; i < N_ENTRIES; i++) {
    e[i].state = states[i];
    e[i].result = results[i];
    e[i].group = e[i].fp.seq == NCFSM__REC_SEQ_NONE ? 0 : 500 + (uint64_t)i;
    e[i].stream = 0x7f00dead0000ull + (uint64_t)i * 0x100;
    e[i].t_submit_ns = 1000000 + (uint64_t)i * 10;
    e[i].t_launch_ns = e[i].group ? e[i].t_submit_ns + 1 : 0;
    e[i].t_final_ns = e[i].group ? e[i].t_submit_ns + 2 : 0;
    e[i].t_complete_ns = states[i] == NCFSM_WORK_IN_FLIGHT || states[i] == NCFSM_WORK_QUEUED ? 0 : e[i].t_submit_ns + 3;
    e[i].id = 100 + (uint64_t)i;
  }
}

static const uint64_t peer_seqs[3] = {43, NCFSM__REC_SEQ_NONE, 41};

static ncfsm__rec_meta make_meta(int rank) {
  ncfsm__rec_meta m = {
      .rank = rank,
      .nranks = 3,
      .comm_name = "round-trip",
      .comm_id = 0x00c0ffee0000abcdull,
      .backend = "sim",
      .nccl_version = 22809,
      .reason = "timeout",
      .state = "ERROR",
      .failure = "watchdog: seq 42 did not complete",
      .next_seq = 43,
      .rolling_hash = 0xfedcba9876543210ull,
      .capacity = N_ENTRIES,
      .total = 106,
      .time_ns = 2000000,
      .timeout_ms = 6000,
      .formats = NCFSM__REC_FMT_JSON,
      .peer_next_seq = peer_seqs,
  };
  return m;
}

/* ---- what must be read back ------------------------------------------------------------- */
/* The dump's members (m: the meta written). */
#define WANT_format "ncfsm-flight-recorder"
#define WANT_version 1
#define WANT_comm_id "00c0ffee0000abcd"
#define WANT_comm_name m->comm_name
#define WANT_rank m->rank
#define WANT_nranks m->nranks
#define WANT_pid (long long)getpid()
#define WANT_host host
#define WANT_backend m->backend
#define WANT_nccl_version m->nccl_version
#define WANT_reason m->reason
#define WANT_time_ns (long long)m->time_ns
#define WANT_wall_time iso_time(d->wall_time) /* the time of writing: its form is checked */
#define WANT_state m->state
#define WANT_failure m->failure
#define WANT_next_seq (long long)m->next_seq
#define WANT_rolling_hash "fedcba9876543210"
#define WANT_capacity (long long)m->capacity
#define WANT_total (long long)m->total
#define WANT_peer_next_seq m->peer_next_seq
#define WANT_entries N_ENTRIES
/* An entry's (x: the entry written). */
#define WANT_ENT_id (long long)x->id
#define WANT_ENT_seq (x->fp.seq == NCFSM__REC_SEQ_NONE ? NONE : (long long)x->fp.seq)
#define WANT_ENT_op ncfsm_opkind_name((ncfsm_opkind_t)x->fp.op)
#define WANT_ENT_count (long long)x->fp.count
#define WANT_ENT_dtype ncfsm_dtype_name((ncfsm_dtype_t)x->fp.dtype)
#define WANT_ENT_root x->fp.root
#define WANT_ENT_redop (x->fp.redop < 0 ? NULL : ncfsm_redop_name((ncfsm_redop_t)x->fp.redop))
#define WANT_ENT_peer x->fp.peer
#define WANT_ENT_group (long long)x->group
#define WANT_ENT_state ncfsm_work_state_name((ncfsm_work_state_t)x->state)
#define WANT_ENT_result (x->result == NCFSM_ERR_AGAIN ? NULL : ncfsm_err_name((ncfsm_result_t)x->result))
#define WANT_ENT_stream stream
#define WANT_ENT_t_submit_ns (long long)x->t_submit_ns
#define WANT_ENT_t_launch_ns (long long)x->t_launch_ns
#define WANT_ENT_t_final_ns (long long)x->t_final_ns
#define WANT_ENT_t_complete_ns (long long)x->t_complete_ns

static void expect_str(const char *what, const char *got, const char *want) {
  if (want && !got) fail_msg("%s: read as absent, written \"%s\"", what, want);
  if (!want && got) fail_msg("%s: read as \"%s\", written as absent", what, got);
  if (want && strcmp(got, want) != 0) fail_msg("%s: read as \"%s\", written \"%s\"", what, got, want);
}
static void expect_int(const char *what, long long got, long long want) {
  if (got != want) fail_msg("%s: read as %lld, written %lld", what, got, want);
}

static void expect_seqs(const char *what, const long long *got, size_t n, const uint64_t *want, int nranks) {
  if (!want || !got) {
    if (want || got) fail_msg("%s: read as %s, written %s", what, got ? "present" : "absent", want ? "present" : "absent");
    return;
  }
  expect_int(what, (long long)n, nranks);
  for (int i = 0; i < nranks; i++)
    expect_int(what, got[i], want[i] == NCFSM__REC_SEQ_NONE ? NONE : (long long)want[i]);
}

/* One comparison per type of fsm/dump.def; names: the row's name list. */
#define SAME_STR(what, s, key, names, want) expect_str(what, (s)->key, want)
#define SAME_INT(what, s, key, names, want) expect_int(what, (s)->key, want)
#define SAME_RANK(what, s, key, names, want) expect_int(what, (s)->key, want)
#define SAME_TIME(what, s, key, names, want) expect_int(what, (s)->key, want)
#define SAME_HEX(what, s, key, names, want) expect_str(what, (s)->key, want)
#define SAME_NAME(what, s, key, names, want) expect_str(what, opt_name(TRACE_NAMES_##names, (s)->key), want)
#define SAME_SEQS(what, s, key, names, want) expect_seqs(what, (s)->key, (s)->n_##key, want, (s)->nranks)
#define SAME_ENTRIES(what, s, key, names, want) expect_int(what, (long long)(s)->n_##key, want)

/* s when it is a UTC time of the form 2026-12-01T22:47:34Z. */
static const char *iso_time(const char *s) {
  assert_non_null(s);
  static const char form[] = "dddd-dd-ddTdd:dd:ddZ";
  assert_int_equal(strlen(s), strlen(form));
  for (size_t i = 0; form[i]; i++)
    if (form[i] == 'd' ? (s[i] < '0' || s[i] > '9') : s[i] != form[i]) fail_msg("wall_time \"%s\" is not UTC ISO 8601", s);
  return s;
}

static void expect_dump(const dump *d, const ncfsm__rec_meta *m, const ncfsm__rec_entry *written) {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
#define NCFSM_DUMP_TOP(key, type, names, need, lo, hi) SAME_##type(#key, d, key, names, WANT_##key);
#include "fsm/dump.def"
  for (size_t i = 0; i < d->n_entries; i++) {
    const ncfsm__rec_entry *x = &written[i];
    const entry *e = &d->entries[i];
    char stream[32], what[64];
    snprintf(stream, sizeof stream, "0x%llx", (unsigned long long)x->stream);
#define NCFSM_DUMP_ENTRY(key, type, names, need, lo, hi) \
  snprintf(what, sizeof what, "entries[%zu].%s", i, #key); \
  SAME_##type(what, e, key, names, WANT_ENT_##key);
#include "fsm/dump.def"
  }
}

/* ---- the tests ----------------------------------------------------------------------------- */
static char *make_dir(void) {
  char *d = strdup("/tmp/ncfsm_roundtrip_XXXXXX");
  assert_non_null(d);
  assert_non_null(mkdtemp(d));
  return d;
}
static void remove_dump_dir(char *dir, const ncfsm__rec_meta *m, int nranks) {
  for (int r = 0; r < nranks; r++) {
    ncfsm__rec_meta x = *m;
    x.rank = r;
    char path[4096];
    if (ncfsm__rec_paths(dir, &x, path, sizeof path, NULL, 0) == NCFSM_OK) unlink(path);
  }
  rmdir(dir);
  free(dir);
}

/* Written, then read: every member equal. */
static void test_every_member(void **state) {
  (void)state;
  char *dir = make_dir();
  ncfsm__rec_entry e[N_ENTRIES];
  make_entries(e);
  ncfsm__rec_meta m = make_meta(1);
  assert_int_equal(ncfsm__rec_write(dir, &m, e, N_ENTRIES), NCFSM_OK);
  char path[4096];
  assert_int_equal(ncfsm__rec_paths(dir, &m, path, sizeof path, NULL, 0), NCFSM_OK);
  dump d;
  assert_int_equal(load_dump(path, &d), 0);
  expect_dump(&d, &m, e);
  /* and what the reader derives from them */
  assert_true(d.wrapped);
  assert_int_equal(d.ncoll, 3);
  assert_int_equal(d.lo, 40);
  assert_int_equal(d.nchans, 2);
  dump_free(&d);
  remove_dump_dir(dir, &m, 3);
}

/* Members the writer leaves empty read back as empty, not as something else. */
static void test_empty_members(void **state) {
  (void)state;
  char *dir = make_dir();
  ncfsm__rec_meta m = make_meta(0);
  m.comm_name = NULL;
  m.failure = NULL;
  m.capacity = 4;
  m.total = 0;
  m.next_seq = 0;
  m.peer_next_seq = NULL;
  assert_int_equal(ncfsm__rec_write(dir, &m, NULL, 0), NCFSM_OK);
  char path[4096];
  assert_int_equal(ncfsm__rec_paths(dir, &m, path, sizeof path, NULL, 0), NCFSM_OK);
  dump d;
  assert_int_equal(load_dump(path, &d), 0);
  assert_string_equal(d.comm_name, "");
  assert_string_equal(d.failure, "");
  assert_int_equal(d.n_entries, 0);
  assert_int_equal(d.next_seq, 0);
  assert_null(d.peer_next_seq); /* left out, not written as null */
  dump_free(&d);
  remove_dump_dir(dir, &m, 1);
}

/* The dump thread writes its own copy of the meta's peer seqs: the
 * caller's array may change as soon as ncfsm__rec_dump_async returns. */
static void test_async_copies_peer_seqs(void **state) {
  (void)state;
  char *dir = make_dir();
  ncfsm__rec_entry e[N_ENTRIES];
  make_entries(e);
  uint64_t peers[3] = {43, 40, NCFSM__REC_SEQ_NONE};
  ncfsm__rec_meta m = make_meta(2);
  m.peer_next_seq = peers;
  assert_int_equal(ncfsm__rec_dump_async(dir, &m, e, N_ENTRIES, NULL, NULL), NCFSM_OK);
  peers[0] = peers[1] = peers[2] = 7;
  ncfsm__rec_shutdown();
  char path[4096];
  assert_int_equal(ncfsm__rec_paths(dir, &m, path, sizeof path, NULL, 0), NCFSM_OK);
  dump d;
  assert_int_equal(load_dump(path, &d), 0);
  assert_int_equal(d.n_peer_next_seq, 3);
  assert_int_equal(d.peer_next_seq[0], 43);
  assert_int_equal(d.peer_next_seq[1], 40);
  assert_true(d.peer_next_seq[2] == NONE);
  dump_free(&d);
  remove_dump_dir(dir, &m, 3);
}

/* Three ranks with the same history: ncfsm-trace finds them consistent. */
static void test_analysed_consistent(void **state) {
  (void)state;
  char *dir = make_dir();
  ncfsm__rec_entry e[N_ENTRIES];
  make_entries(e);
  /* the same ops on every rank, each finished; no send/recv (their pairs
   * differ per rank) */
  e[1].state = e[3].state = NCFSM_WORK_COMPLETED;
  e[1].result = e[3].result = NCFSM_OK;
  e[2] = e[0], e[2].fp.seq = 41, e[2].id = 102;
  e[1] = e[0], e[1].fp.seq = 40, e[1].id = 101;
  e[0].fp.seq = 39;
  e[3].fp.seq = 42;
  e[4] = e[5], e[4].id = 104;
  dump d[3];
  comm c;
  memset(&c, 0, sizeof c);
  c.d = (dump *[3]){&d[0], &d[1], &d[2]};
  c.nd = 3;
  ncfsm__rec_meta m = make_meta(0);
  m.state = "READY";
  m.reason = "request";
  m.failure = "";
  for (int r = 0; r < 3; r++) {
    m.rank = r;
    assert_int_equal(ncfsm__rec_write(dir, &m, e, N_ENTRIES), NCFSM_OK);
    char path[4096];
    assert_int_equal(ncfsm__rec_paths(dir, &m, path, sizeof path, NULL, 0), NCFSM_OK);
    assert_int_equal(load_dump(path, &d[r]), 0);
  }
  memcpy(c.id, d[0].comm_id, sizeof c.id);
  analyse(&c);
  for (size_t i = 0; i < c.nf; i++) printf("finding: %s\n%s", c.f[i].text, c.f[i].detail);
  assert_int_equal(c.nf, 0);
  assert_int_equal(c.cmp_lo, 39);
  assert_int_equal(c.cmp_hi, 42);
  assert_true(c.hash_checked);
  c.d = NULL; /* not malloc'd here */
  comm_free(&c);
  for (int r = 0; r < 3; r++) dump_free(&d[r]);
  remove_dump_dir(dir, &m, 3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_member),
      cmocka_unit_test(test_empty_members),
      cmocka_unit_test(test_async_copies_peer_seqs),
      cmocka_unit_test(test_analysed_consistent),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
