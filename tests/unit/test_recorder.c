/*
 * The flight recorder (fsm/recorder*.c): ring, JSON and PyTorch dumps, the
 * dump thread. Its files are included whole so that the file-local pickle
 * writer can be tested directly; nothing else of the library's recorder is
 * linked in (the static library's copy is not pulled: every symbol it would
 * provide is defined here).
 *
 * The PyTorch dumps are read back by Python's own pickle module
 * (tests/unit/check_fr_dump.py, next to this file); those tests are skipped
 * when python3 is not on PATH. NCFSM_REC_TEST_KEEP=1 keeps the dumps.
 */
#define _GNU_SOURCE /* strptime */
#include "fsm/recorder.c"
#include "fsm/recorder_json.c"
#include "fsm/recorder_thread.c"
#include "fsm/recorder_torch.c"
#include "fsm/recorder_write.c"

#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/wait.h>

#include <cmocka.h>

extern char **environ;

/* ---- fixtures ---------------------------------------------------------------- */

static char *make_dir(void) {
  char *d = strdup("/tmp/ncfsm_rec_XXXXXX");
  assert_non_null(d);
  assert_non_null(mkdtemp(d));
  return d;
}

/* NCFSM_REC_TEST_KEEP=1 keeps every dump directory (printed) to look at or to
 * feed to PyTorch's fr_trace. */
static void remove_dir(char *d) {
  if (getenv("NCFSM_REC_TEST_KEEP")) {
    printf("kept %s\n", d);
    free(d);
    return;
  }
  DIR *dp = opendir(d);
  assert_non_null(dp);
  struct dirent *de;
  char p[REC_PATH_MAX];
  while ((de = readdir(dp))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", d, de->d_name);
    unlink(p);
  }
  closedir(dp);
  rmdir(d);
  free(d);
}

/* Files in d whose name ends in suffix ("" = all, hidden ones included). */
static int count_files(const char *d, const char *suffix) {
  DIR *dp = opendir(d);
  assert_non_null(dp);
  struct dirent *de;
  int n = 0;
  size_t sl = strlen(suffix);
  while ((de = readdir(dp))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    size_t l = strlen(de->d_name);
    if (l >= sl && !strcmp(de->d_name + l - sl, suffix)) n++;
  }
  closedir(dp);
  return n;
}

static ncfsm__rec_entry mk_entry(int op, uint64_t seq, uint64_t count, int dtype, int state) {
  ncfsm__rec_entry e;
  memset(&e, 0, sizeof e);
  e.fp.seq = seq;
  e.fp.op = op;
  e.fp.dtype = dtype;
  e.fp.count = count;
  e.fp.root = (op == NCFSM_KIND_BROADCAST || op == NCFSM_KIND_REDUCE || op == NCFSM_KIND_GATHER ||
               op == NCFSM_KIND_SCATTER) ? 0 : -1;
  e.fp.redop = (op == NCFSM_KIND_ALLREDUCE || op == NCFSM_KIND_REDUCE ||
                op == NCFSM_KIND_REDUCESCATTER) ? NCFSM_OP_SUM : -1;
  e.fp.peer = -1;
  e.state = state;
  e.result = state == NCFSM_WORK_COMPLETED ? NCFSM_OK
             : state == NCFSM_WORK_FAILED  ? NCFSM_ERR_MISMATCH
             : state == NCFSM_WORK_TIMED_OUT ? NCFSM_ERR_TIMEOUT
             : state == NCFSM_WORK_ABORTED ? NCFSM_ERR_ABORTED
                                           : NCFSM_ERR_AGAIN;
  uint64_t base = ncfsm__now_ns() - 1000000;
  e.t_submit_ns = base;
  if (seq != NCFSM__REC_SEQ_NONE) e.t_launch_ns = base + 10, e.group = seq + 1;
  if (state == NCFSM_WORK_IN_FLIGHT || state == NCFSM_WORK_COMPLETED ||
      (state == NCFSM_WORK_TIMED_OUT && seq != NCFSM__REC_SEQ_NONE))
    e.t_final_ns = base + 20;
  if (state == NCFSM_WORK_COMPLETED || state == NCFSM_WORK_FAILED ||
      state == NCFSM_WORK_TIMED_OUT || state == NCFSM_WORK_ABORTED)
    e.t_complete_ns = base + 30;
  e.stream = 0x7f00dead0000ull;
  return e;
}

static ncfsm__rec_meta mk_meta(uint64_t comm_id, int rank, int nranks) {
  ncfsm__rec_meta m;
  memset(&m, 0, sizeof m);
  m.rank = rank;
  m.nranks = nranks;
  m.comm_name = "trainer";
  m.comm_id = comm_id;
  m.backend = "sim";
  m.nccl_version = 22809;
  m.reason = "error";
  m.state = "ERROR";
  m.failure = "seq 2: op differs";
  m.rolling_hash = 0x0123456789abcdefull;
  m.capacity = 64;
  m.time_ns = ncfsm__now_ns();
  m.timeout_ms = 6000;
  return m;
}

/* Runs python3 with args; its exit status, or -1 when python3 is not there. */
static int run_python(const char *const *args) {
  char *argv[16];
  int n = 0;
  argv[n++] = (char *)"python3";
  for (; args[n - 1] && n < 15; n++) argv[n] = (char *)args[n - 1];
  argv[n] = NULL;
  pid_t pid;
  if (posix_spawnp(&pid, "python3", NULL, NULL, argv, environ) != 0) return -1;
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  if (!WIFEXITED(st)) return 128 + WTERMSIG(st);
  return WEXITSTATUS(st) == 127 ? -1 : WEXITSTATUS(st);
}

static const char *script_path(void) {
  static char p[REC_PATH_MAX];
  snprintf(p, sizeof p, "%s", __FILE__);
  char *slash = strrchr(p, '/');
  assert_non_null(slash); /* CMake compiles with absolute source paths */
  snprintf(slash + 1, sizeof p - (size_t)(slash + 1 - p), "check_fr_dump.py");
  assert_int_equal(access(p, R_OK), 0);
  return p;
}

static void check_with_python(const char *const *args) {
  int rc = run_python(args);
  if (rc < 0) skip(); /* no python3 on this machine */
  assert_int_equal(rc, 0);
}

/* PyTorch's own fr_trace on dir, when torch is installed (e.g. the GPU
 * machine); expect is "match" or "SEQ:KIND" as in check_fr_dump.py. */
static void check_with_fr_trace(const char *dir, const char *expect) {
  const char *args[] = {script_path(), "fr_trace", dir, expect, NULL};
  int rc = run_python(args);
  if (rc < 0 || rc == 77) return; /* no python3, or no torch: check_fr_dump.py said so */
  assert_int_equal(rc, 0);
}

/* ---- the ring ------------------------------------------------------------------ */

static void test_off_is_null(void **state) {
  (void)state;
  assert_null(ncfsm__rec_new(0));
  ncfsm__rec_entry e = mk_entry(NCFSM_KIND_ALLREDUCE, 0, 1, NCFSM_FLOAT32, NCFSM_WORK_QUEUED);
  assert_true(ncfsm__rec_add(NULL, &e) == NCFSM__REC_REF_NONE);
  assert_null(ncfsm__rec_get(NULL, 0));
  uint64_t total = 7;
  ncfsm__rec_entry out[2];
  assert_int_equal(ncfsm__rec_snapshot(NULL, out, 2, &total), 0);
  assert_int_equal(total, 0);
  assert_int_equal(ncfsm__rec_capacity(NULL), 0);
  assert_int_equal(ncfsm__rec_total(NULL), 0);
  ncfsm__rec_free(NULL);
  ncfsm__recorder *r = ncfsm__rec_new(2);
  assert_non_null(r);
  assert_true(ncfsm__rec_add(r, NULL) == NCFSM__REC_REF_NONE);
  assert_int_equal(ncfsm__rec_total(r), 0);
  ncfsm__rec_free(r);
}

static void test_ids_and_wrap(void **state) {
  (void)state;
  ncfsm__recorder *r = ncfsm__rec_new(4);
  assert_int_equal(ncfsm__rec_capacity(r), 4);
  for (uint64_t i = 0; i < 10; i++) {
    ncfsm__rec_entry e = mk_entry(NCFSM_KIND_ALLREDUCE, NCFSM__REC_SEQ_NONE, 100 + i,
                                  NCFSM_FLOAT32, NCFSM_WORK_QUEUED);
    e.id = 999; /* ignored */
    assert_int_equal(ncfsm__rec_add(r, &e), i);
    /* the newest is always there; the one capacity back is gone */
    ncfsm__rec_entry *g = ncfsm__rec_get(r, i);
    assert_non_null(g);
    assert_int_equal(g->id, i);
    assert_int_equal(g->fp.count, 100 + i);
    if (i >= 4) assert_null(ncfsm__rec_get(r, i - 4));
  }
  assert_int_equal(ncfsm__rec_total(r), 10);
  for (uint64_t i = 0; i < 6; i++) assert_null(ncfsm__rec_get(r, i));
  for (uint64_t i = 6; i < 10; i++) assert_int_equal(ncfsm__rec_get(r, i)->fp.count, 100 + i);
  assert_null(ncfsm__rec_get(r, 10)); /* never returned */
  assert_null(ncfsm__rec_get(r, NCFSM__REC_REF_NONE));
  /* updates through get() are what the snapshot sees */
  ncfsm__rec_entry *g = ncfsm__rec_get(r, 7);
  g->state = NCFSM_WORK_COMPLETED;
  g->fp.seq = 3;
  ncfsm__rec_entry out[4];
  assert_int_equal(ncfsm__rec_snapshot(r, out, 4, NULL), 4);
  assert_int_equal(out[1].id, 7);
  assert_int_equal(out[1].state, NCFSM_WORK_COMPLETED);
  assert_int_equal(out[1].fp.seq, 3);
  ncfsm__rec_free(r);
}

static void test_snapshot_order(void **state) {
  (void)state;
  ncfsm__recorder *r = ncfsm__rec_new(5);
  ncfsm__rec_entry out[8];
  uint64_t total = 0;
  assert_int_equal(ncfsm__rec_snapshot(r, out, 8, &total), 0);
  for (int i = 0; i < 3; i++) {
    ncfsm__rec_entry e = mk_entry(NCFSM_KIND_BROADCAST, (uint64_t)i, 1, NCFSM_INT8, NCFSM_WORK_IN_FLIGHT);
    ncfsm__rec_add(r, &e);
  }
  assert_int_equal(ncfsm__rec_snapshot(r, out, 8, &total), 3);
  assert_int_equal(total, 3);
  for (int i = 0; i < 3; i++) assert_int_equal(out[i].id, i);
  for (int i = 3; i < 7; i++) {
    ncfsm__rec_entry e = mk_entry(NCFSM_KIND_BROADCAST, (uint64_t)i, 1, NCFSM_INT8, NCFSM_WORK_IN_FLIGHT);
    ncfsm__rec_add(r, &e);
  }
  /* wrapped: the oldest held is 2, the slots start in the middle of the array */
  assert_int_equal(ncfsm__rec_snapshot(r, out, 8, &total), 5);
  assert_int_equal(total, 7);
  for (int i = 0; i < 5; i++) {
    assert_int_equal(out[i].id, 2 + i);
    assert_int_equal(out[i].fp.seq, 2 + i);
  }
  /* fewer than held: the newest ones, still oldest first */
  assert_int_equal(ncfsm__rec_snapshot(r, out, 3, NULL), 3);
  for (int i = 0; i < 3; i++) assert_int_equal(out[i].id, 4 + i);
  assert_int_equal(ncfsm__rec_snapshot(r, NULL, 3, &total), 0);
  ncfsm__rec_free(r);
}

/* ---- JSON ------------------------------------------------------------------------ */

static void expect_entry(json_t *o, const ncfsm__rec_entry *x) {
  assert_int_equal(json_object_size(o), 16);
  assert_int_equal(json_integer_value(json_object_get(o, "id")), x->id);
  if (x->fp.seq == NCFSM__REC_SEQ_NONE) assert_true(json_is_null(json_object_get(o, "seq")));
  else assert_int_equal(json_integer_value(json_object_get(o, "seq")), x->fp.seq);
  assert_string_equal(json_string_value(json_object_get(o, "op")),
                      ncfsm_opkind_name((ncfsm_opkind_t)x->fp.op));
  assert_int_equal(json_integer_value(json_object_get(o, "count")), x->fp.count);
  assert_string_equal(json_string_value(json_object_get(o, "dtype")),
                      ncfsm_dtype_name((ncfsm_dtype_t)x->fp.dtype));
  assert_int_equal(json_integer_value(json_object_get(o, "root")), x->fp.root);
  if (x->fp.redop < 0) assert_true(json_is_null(json_object_get(o, "redop")));
  else
    assert_string_equal(json_string_value(json_object_get(o, "redop")),
                        ncfsm_redop_name((ncfsm_redop_t)x->fp.redop));
  assert_int_equal(json_integer_value(json_object_get(o, "peer")), x->fp.peer);
  assert_int_equal(json_integer_value(json_object_get(o, "group")), x->group);
  assert_string_equal(json_string_value(json_object_get(o, "state")),
                      ncfsm_work_state_name((ncfsm_work_state_t)x->state));
  if (x->result == NCFSM_ERR_AGAIN) assert_true(json_is_null(json_object_get(o, "result")));
  else
    assert_string_equal(json_string_value(json_object_get(o, "result")),
                        ncfsm_err_name((ncfsm_result_t)x->result));
  char s[32];
  snprintf(s, sizeof s, "0x%" PRIx64, x->stream);
  assert_string_equal(json_string_value(json_object_get(o, "stream")), s);
  assert_int_equal(json_integer_value(json_object_get(o, "t_submit_ns")), x->t_submit_ns);
  assert_int_equal(json_integer_value(json_object_get(o, "t_launch_ns")), x->t_launch_ns);
  assert_int_equal(json_integer_value(json_object_get(o, "t_final_ns")), x->t_final_ns);
  assert_int_equal(json_integer_value(json_object_get(o, "t_complete_ns")), x->t_complete_ns);
}

static void test_json_round_trip(void **state) {
  (void)state;
  char *dir = make_dir();
  ncfsm__rec_entry e[5] = {
      mk_entry(NCFSM_KIND_ALLREDUCE, 0, 1024, NCFSM_FLOAT32, NCFSM_WORK_COMPLETED),
      mk_entry(NCFSM_KIND_BROADCAST, 1, 8, NCFSM_INT64, NCFSM_WORK_IN_FLIGHT),
      mk_entry(NCFSM_KIND_SEND, 0, 3, NCFSM_UINT8, NCFSM_WORK_LAUNCHING),
      mk_entry(NCFSM_KIND_ALLGATHER, NCFSM__REC_SEQ_NONE, 5, NCFSM_BFLOAT16, NCFSM_WORK_QUEUED),
      mk_entry(NCFSM_KIND_REDUCE, NCFSM__REC_SEQ_NONE, 2, NCFSM_FLOAT64, NCFSM_WORK_FAILED),
  };
  e[2].fp.peer = 1;
  e[4].fp.root = 1;
  e[4].fp.redop = NCFSM_OP_MAX;
  for (int i = 0; i < 5; i++) e[i].id = 40 + (uint64_t)i;
  ncfsm__rec_meta m = mk_meta(0x7f3a00000000beefull, 1, 2);
  m.next_seq = 2;
  m.total = 45;
  m.formats = NCFSM__REC_FMT_JSON;
  assert_int_equal(ncfsm__rec_write(dir, &m, e, 5), NCFSM_OK);

  char path[REC_PATH_MAX];
  assert_int_equal(ncfsm__rec_paths(dir, &m, path, sizeof path, NULL, 0), NCFSM_OK);
  char want[REC_PATH_MAX];
  snprintf(want, sizeof want, "%s/ncfsm_fr_7f3a00000000beef_r1.json", dir);
  assert_string_equal(path, want);
  json_error_t jerr;
  json_t *root = json_load_file(path, 0, &jerr);
  if (!root) fail_msg("%s: %s", path, jerr.text);
  assert_int_equal(json_object_size(root), 20);
  assert_string_equal(json_string_value(json_object_get(root, "format")), "ncfsm-flight-recorder");
  assert_int_equal(json_integer_value(json_object_get(root, "version")), 1);
  assert_string_equal(json_string_value(json_object_get(root, "comm_id")), "7f3a00000000beef");
  assert_string_equal(json_string_value(json_object_get(root, "comm_name")), "trainer");
  assert_int_equal(json_integer_value(json_object_get(root, "rank")), 1);
  assert_int_equal(json_integer_value(json_object_get(root, "nranks")), 2);
  assert_int_equal(json_integer_value(json_object_get(root, "pid")), getpid());
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  assert_string_equal(json_string_value(json_object_get(root, "host")), host);
  assert_string_equal(json_string_value(json_object_get(root, "backend")), "sim");
  assert_int_equal(json_integer_value(json_object_get(root, "nccl_version")), 22809);
  assert_string_equal(json_string_value(json_object_get(root, "reason")), "error");
  assert_int_equal(json_integer_value(json_object_get(root, "time_ns")), m.time_ns);
  const char *wall = json_string_value(json_object_get(root, "wall_time"));
  assert_non_null(wall);
  struct tm tm;
  memset(&tm, 0, sizeof tm);
  const char *end = strptime(wall, "%Y-%m-%dT%H:%M:%SZ", &tm);
  assert_true(end && *end == '\0');
  time_t now = time(NULL), at = timegm(&tm);
  assert_true(at <= now + 1 && at >= now - 60);
  assert_string_equal(json_string_value(json_object_get(root, "state")), "ERROR");
  assert_string_equal(json_string_value(json_object_get(root, "failure")), "seq 2: op differs");
  assert_int_equal(json_integer_value(json_object_get(root, "next_seq")), 2);
  assert_string_equal(json_string_value(json_object_get(root, "rolling_hash")), "0123456789abcdef");
  assert_int_equal(json_integer_value(json_object_get(root, "capacity")), 64);
  assert_int_equal(json_integer_value(json_object_get(root, "total")), 45);
  json_t *arr = json_object_get(root, "entries");
  assert_int_equal(json_array_size(arr), 5);
  for (int i = 0; i < 5; i++) expect_entry(json_array_get(arr, (size_t)i), &e[i]);
  /* key order is the documented one */
  const char *order[] = {"format", "version", "comm_id", "comm_name", "rank", "nranks", "pid",
                         "host", "backend", "nccl_version", "reason", "time_ns", "wall_time",
                         "state", "failure", "next_seq", "rolling_hash", "capacity", "total",
                         "entries"};
  size_t k = 0;
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    (void)val;
    assert_string_equal(key, order[k++]);
  }
  json_decref(root);

  /* a second dump replaces the first; no temp file stays; no PyTorch file */
  m.reason = "request";
  m.failure = NULL;
  m.comm_name = NULL;
  assert_int_equal(ncfsm__rec_write(dir, &m, e, 0), NCFSM_OK);
  root = json_load_file(path, 0, &jerr);
  assert_non_null(root);
  assert_string_equal(json_string_value(json_object_get(root, "reason")), "request");
  assert_string_equal(json_string_value(json_object_get(root, "failure")), "");
  assert_string_equal(json_string_value(json_object_get(root, "comm_name")), "");
  assert_int_equal(json_array_size(json_object_get(root, "entries")), 0);
  json_decref(root);
  assert_int_equal(count_files(dir, ".tmp"), 0);
  assert_int_equal(count_files(dir, ""), 1);
  remove_dir(dir);
}

/* Text that is not UTF-8 is written with '?' in place of each bad byte. */
static void test_json_invalid_utf8(void **state) {
  (void)state;
  char *dir = make_dir();
  ncfsm__rec_meta m = mk_meta(1, 0, 1);
  m.comm_name = "bad\xffx\xc0";
  m.failure = "\xe4\xb8\xad ok \xed\xa0\x80";
  m.formats = NCFSM__REC_FMT_JSON;
  assert_int_equal(ncfsm__rec_write(dir, &m, NULL, 0), NCFSM_OK);
  char path[REC_PATH_MAX];
  ncfsm__rec_paths(dir, &m, path, sizeof path, NULL, 0);
  json_t *root = json_load_file(path, 0, NULL);
  assert_non_null(root);
  assert_string_equal(json_string_value(json_object_get(root, "comm_name")), "bad?x?");
  assert_string_equal(json_string_value(json_object_get(root, "failure")), "\xe4\xb8\xad ok ???");
  json_decref(root);
  remove_dir(dir);
}

/* ---- the pickle writer ------------------------------------------------------------- */

static void test_pickle_values(void **state) {
  (void)state;
  static const int64_t ints[] = {0, 1, 255, 256, 65535, 65536, -1, -255, -256, -65536,
                                 2147483647, -2147483647 - 1, 2147483648, -2147483649,
                                 INT64_MAX, INT64_MIN};
  static const uint64_t uints[] = {0, 255, (uint64_t)INT64_MAX, (uint64_t)INT64_MAX + 1, UINT64_MAX};
  static const double floats[] = {0.0, 0.5, -1.25, 0.1, 1e300, -2.5e-300};
  pk p;
  memset(&p, 0, sizeof p);
  pk_begin(&p);
  pk_dict_begin(&p);
  pk_str(&p, "ints");
  pk_list_begin(&p);
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) pk_int(&p, ints[i]);
  pk_list_end(&p);
  pk_str(&p, "uints");
  pk_list_begin(&p);
  for (size_t i = 0; i < sizeof uints / sizeof uints[0]; i++) pk_uint(&p, uints[i]);
  pk_list_end(&p);
  pk_str(&p, "floats");
  pk_list_begin(&p);
  for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) pk_float(&p, floats[i]);
  pk_list_end(&p);
  pk_str(&p, "strs");
  pk_list_begin(&p);
  pk_str(&p, NULL);
  pk_str(&p, "ascii");
  pk_str(&p, "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x99\x82");
  pk_str(&p, "bad\xffx\xc0");       /* stray bytes */
  pk_str(&p, "\xc0\xaf");           /* overlong '/' */
  pk_str(&p, "\xed\xa0\x80");       /* a surrogate */
  pk_str(&p, "\xe4\xb8");           /* cut short */
  pk_str(&p, "\xf4\x90\x80\x80");   /* above U+10FFFF */
  char *big = malloc(70001);
  assert_non_null(big);
  memset(big, 'x', 70000);
  big[70000] = '\0';
  pk_str(&p, big); /* longer than 65535: the 4-byte length */
  free(big);
  pk_list_end(&p);
  pk_str(&p, "bools");
  pk_list_begin(&p);
  pk_bool(&p, 1);
  pk_bool(&p, 0);
  pk_list_end(&p);
  pk_str(&p, "none");
  pk_none(&p);
  pk_str(&p, "tuple");
  pk_tuple_begin(&p);
  pk_int(&p, 1);
  pk_str(&p, "a");
  pk_none(&p);
  pk_tuple_end(&p);
  pk_str(&p, "empty");
  pk_list_begin(&p);
  pk_list_begin(&p);
  pk_list_end(&p);
  pk_dict_begin(&p);
  pk_dict_end(&p);
  pk_tuple_begin(&p);
  pk_tuple_end(&p);
  pk_list_end(&p);
  pk_str(&p, "nested");
  pk_dict_begin(&p);
  pk_str(&p, "k");
  pk_list_begin(&p);
  pk_dict_begin(&p);
  pk_str(&p, "x");
  pk_list_begin(&p);
  pk_int(&p, 1);
  pk_list_begin(&p);
  pk_int(&p, 2);
  pk_list_begin(&p);
  pk_int(&p, 3);
  pk_list_end(&p);
  pk_list_end(&p);
  pk_list_end(&p);
  pk_dict_end(&p);
  pk_list_end(&p);
  pk_dict_end(&p);
  pk_dict_end(&p);
  pk_end(&p);
  assert_false(p.oom);
  /* the stream starts with PROTO 2 and ends with STOP */
  assert_int_equal(p.b[0], 0x80);
  assert_int_equal(p.b[1], 2);
  assert_int_equal(p.b[p.len - 1], '.');

  char *dir = make_dir();
  char path[REC_PATH_MAX];
  snprintf(path, sizeof path, "%s/values.pkl", dir);
  assert_int_equal(write_atomic(dir, path, p.b, p.len), NCFSM_OK);
  free(p.b);
  const char *args[] = {script_path(), "values", path, NULL};
  check_with_python(args);
  remove_dir(dir);
}

/* ---- the PyTorch dump ------------------------------------------------------------- */

/* Two ranks that agree: every op kind, launched and not; rank 1 also has an
 * old refused collective (no seq) that must not show. */
static void write_agreeing(const char *dir, uint64_t comm) {
  for (int r = 0; r < 2; r++) {
    ncfsm__rec_entry e[16];
    int n = 0;
    uint64_t s = 0;
    if (r == 1) e[n++] = mk_entry(NCFSM_KIND_ALLREDUCE, NCFSM__REC_SEQ_NONE, 9, NCFSM_INT8, NCFSM_WORK_FAILED);
    e[n++] = mk_entry(NCFSM_KIND_ALLREDUCE, s++, 1024, NCFSM_FLOAT32, NCFSM_WORK_COMPLETED);
    e[n++] = mk_entry(NCFSM_KIND_BROADCAST, s++, 7, NCFSM_INT64, NCFSM_WORK_COMPLETED);
    e[n++] = mk_entry(NCFSM_KIND_REDUCE, s++, 3, NCFSM_FLOAT16, NCFSM_WORK_COMPLETED);
    e[n++] = mk_entry(NCFSM_KIND_ALLGATHER, s++, 4, NCFSM_BFLOAT16, NCFSM_WORK_COMPLETED);
    ncfsm__rec_entry snd = mk_entry(r == 0 ? NCFSM_KIND_SEND : NCFSM_KIND_RECV, 0, 5, NCFSM_UINT32,
                                    NCFSM_WORK_COMPLETED);
    snd.fp.peer = 1 - r;
    e[n++] = snd;
    e[n++] = mk_entry(NCFSM_KIND_REDUCESCATTER, s++, 6, NCFSM_UINT64, NCFSM_WORK_COMPLETED);
    e[n++] = mk_entry(NCFSM_KIND_ALLTOALL, s++, 2, NCFSM_INT32, NCFSM_WORK_COMPLETED);
    e[n++] = mk_entry(NCFSM_KIND_GATHER, s++, 2, NCFSM_UINT8, NCFSM_WORK_COMPLETED);
    e[n++] = mk_entry(NCFSM_KIND_SCATTER, s++, 2, NCFSM_FLOAT64, NCFSM_WORK_TIMED_OUT);
    e[n++] = mk_entry(NCFSM_KIND_ALLREDUCE, s++, 1, NCFSM_INT8, NCFSM_WORK_IN_FLIGHT);
    e[n++] = mk_entry(NCFSM_KIND_ALLREDUCE, s++, 1, NCFSM_INT8, NCFSM_WORK_LAUNCHING);
    /* not launched yet: provisional seqs s, s+1 */
    e[n++] = mk_entry(NCFSM_KIND_BROADCAST, NCFSM__REC_SEQ_NONE, 1, NCFSM_INT8, NCFSM_WORK_QUEUED);
    e[n++] = mk_entry(NCFSM_KIND_ALLREDUCE, NCFSM__REC_SEQ_NONE, 1, NCFSM_INT8, NCFSM_WORK_QUEUED);
    for (int i = 0; i < n; i++) e[i].id = (uint64_t)i + 100;
    ncfsm__rec_meta m = mk_meta(comm, r, 2);
    m.next_seq = s;
    m.total = (uint64_t)n + 100;
    assert_int_equal(ncfsm__rec_write(dir, &m, e, (unsigned)n), NCFSM_OK);
  }
}

static void test_torch_dump_agreeing(void **state) {
  (void)state;
  char *dir = make_dir();
  write_agreeing(dir, 0xabcdef0012345678ull);
  char p[REC_PATH_MAX];
  snprintf(p, sizeof p, "%s/ncfsm_fr_abcdef0012345678_nccl_trace_rank_1", dir);
  assert_int_equal(access(p, R_OK), 0);
  const char *args[] = {script_path(), "dump", dir, "--timeout-ms", "6000", "--expect-match", NULL};
  check_with_python(args);
  check_with_fr_trace(dir, "match");
  remove_dir(dir);
}

/* Collectives at seq 0, 1 agree; seq 2 differs as kind says: launched
 * (verification off) or refused before launch (strict: no seq, so the
 * provisional one). */
static void write_mismatch(const char *dir, uint64_t comm, const char *kind, int launched) {
  for (int r = 0; r < 2; r++) {
    ncfsm__rec_entry e[4];
    e[0] = mk_entry(NCFSM_KIND_ALLREDUCE, 0, 16, NCFSM_FLOAT32, NCFSM_WORK_COMPLETED);
    e[1] = mk_entry(NCFSM_KIND_ALLREDUCE, 1, 16, NCFSM_FLOAT32, NCFSM_WORK_COMPLETED);
    int op = NCFSM_KIND_ALLREDUCE, dt = NCFSM_FLOAT32;
    uint64_t count = 16;
    if (r == 1 && !strcmp(kind, "type")) op = NCFSM_KIND_BROADCAST;
    if (r == 1 && !strcmp(kind, "size")) count = 17;
    if (r == 1 && !strcmp(kind, "dtype")) dt = NCFSM_INT32;
    e[2] = mk_entry(op, launched ? 2 : NCFSM__REC_SEQ_NONE, count, dt,
                    launched ? NCFSM_WORK_TIMED_OUT : NCFSM_WORK_FAILED);
    for (int i = 0; i < 3; i++) e[i].id = (uint64_t)i;
    ncfsm__rec_meta m = mk_meta(comm, r, 2);
    m.next_seq = launched ? 3 : 2;
    m.total = 3;
    m.reason = launched ? "timeout" : "verify";
    assert_int_equal(ncfsm__rec_write(dir, &m, e, 3), NCFSM_OK);
  }
}

static void test_torch_dump_mismatch(void **state) {
  (void)state;
  static const char *kinds[] = {"type", "size", "dtype"};
  for (int launched = 0; launched < 2; launched++)
    for (int k = 0; k < 3; k++) {
      char *dir = make_dir();
      write_mismatch(dir, 0x1111u + (uint64_t)k, kinds[k], launched);
      char expect[16];
      snprintf(expect, sizeof expect, "2:%s", kinds[k]);
      const char *args[] = {script_path(), "dump", dir, "--expect-mismatch", expect, NULL};
      check_with_python(args);
      check_with_fr_trace(dir, expect);
      remove_dir(dir);
    }
}

/* A rank that never reached seq 2: fr_trace's "not all ranks joining". */
static void test_torch_dump_missing_rank(void **state) {
  (void)state;
  char *dir = make_dir();
  for (int r = 0; r < 2; r++) {
    ncfsm__rec_entry e[3];
    unsigned n = r == 0 ? 3 : 2;
    for (unsigned i = 0; i < n; i++) {
      e[i] = mk_entry(NCFSM_KIND_ALLREDUCE, i, 4, NCFSM_FLOAT32,
                      i == 2 ? NCFSM_WORK_IN_FLIGHT : NCFSM_WORK_COMPLETED);
      e[i].id = i;
    }
    ncfsm__rec_meta m = mk_meta(0x22, r, 2);
    m.next_seq = n;
    m.total = n;
    assert_int_equal(ncfsm__rec_write(dir, &m, e, n), NCFSM_OK);
  }
  const char *args[] = {script_path(), "dump", dir, "--expect-mismatch", "2:missing", NULL};
  check_with_python(args);
  check_with_fr_trace(dir, "2:missing");
  remove_dir(dir);
}

/* ---- errors ------------------------------------------------------------------------ */

static void test_bad_arguments_and_dirs(void **state) {
  (void)state;
  ncfsm__rec_entry e = mk_entry(NCFSM_KIND_ALLREDUCE, 0, 1, NCFSM_FLOAT32, NCFSM_WORK_COMPLETED);
  ncfsm__rec_meta m = mk_meta(5, 0, 2);
  assert_int_equal(ncfsm__rec_write("/nonexistent/ncfsm/dir", &m, &e, 1), NCFSM_ERR_SYSTEM);
  char *dir = make_dir();
  char file[REC_PATH_MAX];
  snprintf(file, sizeof file, "%s/plain", dir);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fclose(f);
  assert_int_equal(ncfsm__rec_write(file, &m, &e, 1), NCFSM_ERR_SYSTEM); /* not a directory */
  assert_int_equal(ncfsm__rec_write(NULL, &m, &e, 1), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm__rec_write("", &m, &e, 1), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm__rec_write(dir, NULL, &e, 1), NCFSM_ERR_INVALID_ARGUMENT);
  assert_int_equal(ncfsm__rec_write(dir, &m, NULL, 1), NCFSM_ERR_INVALID_ARGUMENT);
  ncfsm__rec_meta b = m;
  b.reason = "because";
  assert_int_equal(ncfsm__rec_write(dir, &b, &e, 1), NCFSM_ERR_INVALID_ARGUMENT);
  b.reason = NULL;
  assert_int_equal(ncfsm__rec_write(dir, &b, &e, 1), NCFSM_ERR_INVALID_ARGUMENT);
  b = m;
  b.rank = 2;
  assert_int_equal(ncfsm__rec_write(dir, &b, &e, 1), NCFSM_ERR_INVALID_ARGUMENT);
  b.rank = -1;
  assert_int_equal(ncfsm__rec_write(dir, &b, &e, 1), NCFSM_ERR_INVALID_ARGUMENT);
  b = m;
  b.formats = 4;
  assert_int_equal(ncfsm__rec_write(dir, &b, &e, 1), NCFSM_ERR_INVALID_ARGUMENT);
  char *longdir = malloc(REC_PATH_MAX + 10);
  memset(longdir, 'a', REC_PATH_MAX + 9);
  longdir[REC_PATH_MAX + 9] = '\0';
  assert_int_equal(ncfsm__rec_write(longdir, &m, &e, 1), NCFSM_ERR_INVALID_ARGUMENT);
  char small[8];
  assert_int_equal(ncfsm__rec_paths(dir, &m, small, sizeof small, NULL, 0), NCFSM_ERR_INVALID_ARGUMENT);
  free(longdir);
  /* the asynchronous path refuses the same arguments at once */
  assert_int_equal(ncfsm__rec_dump_async(NULL, &m, &e, 1, NULL, NULL), NCFSM_ERR_INVALID_ARGUMENT);
  b.reason = "nope";
  b.formats = 0;
  assert_int_equal(ncfsm__rec_dump_async(dir, &b, &e, 1, NULL, NULL), NCFSM_ERR_INVALID_ARGUMENT);
  /* nothing but the plain file was created */
  assert_int_equal(count_files(dir, ""), 1);
  remove_dir(dir);
}

/* ---- the dump thread ---------------------------------------------------------------- */

typedef struct done_rec {
  atomic_int calls;
  atomic_int rc;
  char path[REC_PATH_MAX];
  atomic_int had_path;
  pthread_t thread; /* where done ran */
} done_rec;

static void on_done(void *arg, ncfsm_result_t rc, const char *json_path) {
  done_rec *d = arg;
  d->thread = pthread_self();
  if (json_path) {
    snprintf(d->path, sizeof d->path, "%s", json_path);
    atomic_store(&d->had_path, 1);
  }
  atomic_store(&d->rc, rc);
  atomic_fetch_add(&d->calls, 1);
}

static void test_async_done_once(void **state) {
  (void)state;
  char *dir = make_dir();
  enum { N = 12 };
  static done_rec d[N];
  memset(d, 0, sizeof d);
  ncfsm__rec_entry e[3];
  for (int i = 0; i < 3; i++) {
    e[i] = mk_entry(NCFSM_KIND_ALLREDUCE, (uint64_t)i, 8, NCFSM_FLOAT32, NCFSM_WORK_COMPLETED);
    e[i].id = (uint64_t)i;
  }
  for (int i = 0; i < N; i++) {
    ncfsm__rec_meta m = mk_meta(0x1000 + (uint64_t)i, 0, 1);
    m.next_seq = 3;
    m.total = 3;
    m.formats = i == N - 1 ? NCFSM__REC_FMT_TORCH : 0;
    /* the caller's buffers are reusable at once: the dump has its own copy */
    char name[32];
    snprintf(name, sizeof name, "comm-%d", i);
    m.comm_name = name;
    assert_int_equal(ncfsm__rec_dump_async(dir, &m, e, 3, on_done, &d[i]), NCFSM_OK);
    memset(name, 'Z', sizeof name - 1);
  }
  memset(e, 0xff, sizeof e);
  ncfsm__rec_shutdown(); /* writes everything queued, then returns */
  for (int i = 0; i < N; i++) {
    assert_int_equal(atomic_load(&d[i].calls), 1);
    assert_int_equal(atomic_load(&d[i].rc), NCFSM_OK);
    ncfsm__rec_meta m = mk_meta(0x1000 + (uint64_t)i, 0, 1);
    char jp[REC_PATH_MAX], tp[REC_PATH_MAX];
    ncfsm__rec_paths(dir, &m, jp, sizeof jp, tp, sizeof tp);
    assert_int_equal(access(tp, R_OK), 0);
    if (i == N - 1) {
      assert_false(atomic_load(&d[i].had_path)); /* PyTorch only: no JSON path */
      assert_int_equal(access(jp, F_OK), -1);
      continue;
    }
    assert_string_equal(d[i].path, jp);
    json_t *root = json_load_file(jp, 0, NULL);
    assert_non_null(root);
    char want[32];
    snprintf(want, sizeof want, "comm-%d", i);
    assert_string_equal(json_string_value(json_object_get(root, "comm_name")), want);
    assert_int_equal(json_array_size(json_object_get(root, "entries")), 3);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(root, "entries"), 2), "seq")), 2);
    json_decref(root);
  }
  /* the dumps are valid for the PyTorch reader too */
  const char *args[] = {script_path(), "dump", dir, "--timeout-ms", "6000", NULL};
  int rc = run_python(args);
  /* the PyTorch-only dump has no JSON beside it, which the checker allows
   * (it looks at JSON dumps and their partner files) */
  if (rc >= 0) assert_int_equal(rc, 0);
  /* a dump after shutdown starts the thread again */
  done_rec again;
  memset(&again, 0, sizeof again);
  ncfsm__rec_meta m = mk_meta(0x2000, 0, 1);
  assert_int_equal(ncfsm__rec_dump_async(dir, &m, NULL, 0, on_done, &again), NCFSM_OK);
  ncfsm__rec_shutdown();
  assert_int_equal(atomic_load(&again.calls), 1);
  remove_dir(dir);
}

static void test_async_bad_dir(void **state) {
  (void)state;
  done_rec d;
  memset(&d, 0, sizeof d);
  ncfsm__rec_meta m = mk_meta(0x3000, 0, 1);
  ncfsm__rec_entry e = mk_entry(NCFSM_KIND_ALLREDUCE, 0, 1, NCFSM_FLOAT32, NCFSM_WORK_COMPLETED);
  assert_int_equal(ncfsm__rec_dump_async("/nonexistent/ncfsm", &m, &e, 1, on_done, &d), NCFSM_OK);
  ncfsm__rec_shutdown();
  assert_int_equal(atomic_load(&d.calls), 1);
  assert_int_equal(atomic_load(&d.rc), NCFSM_ERR_SYSTEM);
}

/* A done callback that holds the dump thread until released. */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_entered, gate_open;
static void on_done_gate(void *arg, ncfsm_result_t rc, const char *json_path) {
  on_done(arg, rc, json_path);
  pthread_mutex_lock(&gate_mu);
  gate_entered = 1;
  pthread_cond_broadcast(&gate_cv);
  while (!gate_open) pthread_cond_wait(&gate_cv, &gate_mu);
  pthread_mutex_unlock(&gate_mu);
}

static void test_async_queue_full_drops(void **state) {
  (void)state;
  char *dir = make_dir();
  static done_rec d[NCFSM__REC_QUEUE_MAX + 2];
  memset(d, 0, sizeof d);
  gate_entered = gate_open = 0;
  uint64_t dropped0 = ncfsm__rec_dumps_dropped();
  ncfsm__rec_meta m = mk_meta(0x4000, 0, 1);
  m.formats = NCFSM__REC_FMT_JSON;
  assert_int_equal(ncfsm__rec_dump_async(dir, &m, NULL, 0, on_done_gate, &d[0]), NCFSM_OK);
  pthread_mutex_lock(&gate_mu);
  while (!gate_entered) pthread_cond_wait(&gate_cv, &gate_mu);
  pthread_mutex_unlock(&gate_mu);
  /* the thread is held in the first done: the queue takes QUEUE_MAX more */
  for (unsigned i = 1; i <= NCFSM__REC_QUEUE_MAX; i++) {
    m.comm_id = 0x4000 + i;
    assert_int_equal(ncfsm__rec_dump_async(dir, &m, NULL, 0, on_done, &d[i]), NCFSM_OK);
  }
  m.comm_id = 0x5000;
  assert_int_equal(ncfsm__rec_dump_async(dir, &m, NULL, 0, on_done, &d[NCFSM__REC_QUEUE_MAX + 1]),
                   NCFSM_ERR_BUSY);
  assert_int_equal(ncfsm__rec_dumps_dropped(), dropped0 + 1);
  pthread_mutex_lock(&gate_mu);
  gate_open = 1;
  pthread_cond_broadcast(&gate_cv);
  pthread_mutex_unlock(&gate_mu);
  ncfsm__rec_shutdown();
  for (unsigned i = 0; i <= NCFSM__REC_QUEUE_MAX; i++) assert_int_equal(atomic_load(&d[i].calls), 1);
  assert_int_equal(atomic_load(&d[NCFSM__REC_QUEUE_MAX + 1].calls), 0);
  assert_int_equal(count_files(dir, ".json"), NCFSM__REC_QUEUE_MAX + 1);
  remove_dir(dir);
}

/* Many producers at once: each accepted dump is written and its done called
 * once; each refused one (queue full) is counted as dropped. */
enum { PRODUCERS = 8, PER_PRODUCER = 24 };
static done_rec many_done[PRODUCERS][PER_PRODUCER];
static atomic_int many_busy;
static const char *many_dir;

static void *producer(void *arg) {
  int t = (int)(intptr_t)arg;
  ncfsm__rec_entry e[8];
  for (int i = 0; i < 8; i++) {
    e[i] = mk_entry(i % 2 ? NCFSM_KIND_BROADCAST : NCFSM_KIND_ALLREDUCE, (uint64_t)i, 32,
                    NCFSM_FLOAT32, NCFSM_WORK_COMPLETED);
    e[i].id = (uint64_t)i;
  }
  for (int i = 0; i < PER_PRODUCER; i++) {
    ncfsm__rec_meta m = mk_meta(((uint64_t)t << 32) | (uint64_t)i, t % 4, 4);
    m.next_seq = 8;
    m.total = 8;
    ncfsm_result_t rc = ncfsm__rec_dump_async(many_dir, &m, e, 8, on_done, &many_done[t][i]);
    if (rc == NCFSM_ERR_BUSY) atomic_fetch_add(&many_busy, 1);
    else assert_int_equal(rc, NCFSM_OK);
  }
  return NULL;
}

static void test_async_many_threads(void **state) {
  (void)state;
  char *dir = make_dir();
  many_dir = dir;
  memset(many_done, 0, sizeof many_done);
  atomic_store(&many_busy, 0);
  uint64_t dropped0 = ncfsm__rec_dumps_dropped();
  pthread_t th[PRODUCERS];
  for (int t = 0; t < PRODUCERS; t++)
    assert_int_equal(pthread_create(&th[t], NULL, producer, (void *)(intptr_t)t), 0);
  for (int t = 0; t < PRODUCERS; t++) pthread_join(th[t], NULL);
  ncfsm__rec_shutdown();
  int accepted = 0;
  for (int t = 0; t < PRODUCERS; t++)
    for (int i = 0; i < PER_PRODUCER; i++) {
      int c = atomic_load(&many_done[t][i].calls);
      assert_true(c == 0 || c == 1);
      if (!c) continue;
      accepted++;
      assert_int_equal(atomic_load(&many_done[t][i].rc), NCFSM_OK);
      assert_int_equal(access(many_done[t][i].path, R_OK), 0);
    }
  int busy = atomic_load(&many_busy);
  assert_int_equal(accepted + busy, PRODUCERS * PER_PRODUCER);
  assert_int_equal(ncfsm__rec_dumps_dropped() - dropped0, (uint64_t)busy);
  assert_int_equal(count_files(dir, ".json"), accepted);
  assert_int_equal(count_files(dir, ".tmp"), 0);
  remove_dir(dir);
}

/* shutdown from several threads at once while dumps are queued: each returns
 * only after every queued dump was written and its done called */
enum { SHUT_DUMPS = 16 };
static done_rec shut_done[SHUT_DUMPS];
static void on_done_slow(void *arg, ncfsm_result_t rc, const char *json_path) {
  struct timespec ts = {0, 3 * 1000 * 1000};
  nanosleep(&ts, NULL);
  on_done(arg, rc, json_path);
}
static void *shutter(void *arg) {
  ncfsm__rec_shutdown();
  int seen = 0;
  for (int i = 0; i < SHUT_DUMPS; i++) seen += atomic_load(&shut_done[i].calls);
  *(int *)arg = seen;
  return NULL;
}

static void test_concurrent_shutdown(void **state) {
  (void)state;
  char *dir = make_dir();
  memset(shut_done, 0, sizeof shut_done);
  for (int i = 0; i < SHUT_DUMPS; i++) {
    ncfsm__rec_meta m = mk_meta(0x6000 + (uint64_t)i, 0, 1);
    assert_int_equal(ncfsm__rec_dump_async(dir, &m, NULL, 0, on_done_slow, &shut_done[i]), NCFSM_OK);
  }
  pthread_t th[3];
  int seen[3] = {0, 0, 0};
  for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&th[i], NULL, shutter, &seen[i]), 0);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 3; i++) assert_int_equal(seen[i], SHUT_DUMPS);
  for (int i = 0; i < SHUT_DUMPS; i++) assert_int_equal(atomic_load(&shut_done[i].calls), 1);
  remove_dir(dir);
}

/* A child forked while dumps are queued has no dump thread and none of its
 * parent's dumps; its own dumps start a thread of its own. (Not under TSan,
 * which does not support threads started after a multithreaded fork.) */
static void test_fork_child(void **state) {
  (void)state;
#ifdef __SANITIZE_THREAD__
  skip();
#else
  char *dir = make_dir();
  static done_rec d[4];
  memset(d, 0, sizeof d);
  gate_entered = gate_open = 0;
  ncfsm__rec_meta m = mk_meta(0x7000, 0, 1);
  m.formats = NCFSM__REC_FMT_JSON;
  assert_int_equal(ncfsm__rec_dump_async(dir, &m, NULL, 0, on_done_gate, &d[0]), NCFSM_OK);
  pthread_mutex_lock(&gate_mu);
  while (!gate_entered) pthread_cond_wait(&gate_cv, &gate_mu);
  pthread_mutex_unlock(&gate_mu);
  for (int i = 1; i < 3; i++) {
    m.comm_id = 0x7000 + (uint64_t)i;
    assert_int_equal(ncfsm__rec_dump_async(dir, &m, NULL, 0, on_done, &d[i]), NCFSM_OK);
  }
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* the child: its parent's two queued dumps are not its own */
    done_rec mine;
    memset(&mine, 0, sizeof mine);
    ncfsm__rec_meta cm = mk_meta(0x7100, 0, 1);
    cm.formats = NCFSM__REC_FMT_JSON;
    int ok = ncfsm__rec_dump_async(dir, &cm, NULL, 0, on_done, &mine) == NCFSM_OK;
    ncfsm__rec_shutdown();
    ok = ok && atomic_load(&mine.calls) == 1 && atomic_load(&mine.rc) == NCFSM_OK &&
         !pthread_equal(mine.thread, pthread_self()) && /* on a dump thread of its own */
         atomic_load(&d[1].calls) == 0 && atomic_load(&d[2].calls) == 0;
    _exit(ok ? 0 : 1);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  pthread_mutex_lock(&gate_mu);
  gate_open = 1;
  pthread_cond_broadcast(&gate_cv);
  pthread_mutex_unlock(&gate_mu);
  ncfsm__rec_shutdown();
  for (int i = 0; i < 3; i++) assert_int_equal(atomic_load(&d[i].calls), 1);
  assert_int_equal(count_files(dir, ".json"), 4); /* three from the parent, one from the child */
  remove_dir(dir);
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_off_is_null),
      cmocka_unit_test(test_ids_and_wrap),
      cmocka_unit_test(test_snapshot_order),
      cmocka_unit_test(test_json_round_trip),
      cmocka_unit_test(test_json_invalid_utf8),
      cmocka_unit_test(test_pickle_values),
      cmocka_unit_test(test_torch_dump_agreeing),
      cmocka_unit_test(test_torch_dump_mismatch),
      cmocka_unit_test(test_torch_dump_missing_rank),
      cmocka_unit_test(test_bad_arguments_and_dirs),
      cmocka_unit_test(test_async_done_once),
      cmocka_unit_test(test_async_bad_dir),
      cmocka_unit_test(test_async_queue_full_drops),
      cmocka_unit_test(test_async_many_threads),
      cmocka_unit_test(test_concurrent_shutdown),
      cmocka_unit_test(test_fork_child),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
