/*
 * 04_failure_matrix: the seed chapter's failure matrix through ncfsm, with
 * every verification mode (issue 9; docs/ordering.md; the chapter:
 * docs/nccl-rules.md, "The seed chapter").
 *
 *   failure_matrix --list
 *   mpirun -np N failure_matrix --case NAME --out DIR [--deadline-ms 6000] [--stall-ms 1000] [--require-gpu]
 *   failure_matrix --report DIR [--check] [--np N]
 *
 * A case runs one rank per process (mpirun: PMIx; or the TCP store:
 * NCFSM_STORE_ADDR, NCFSM_RANK, NCFSM_WORLD_SIZE), all on one host: the
 * ranks meet through files in DIR when a case is over. Each case makes a
 * communicator with the case's verification mode, completes a valid
 * AllReduce, then injects its fault on rank 0 (the odd rank; every other
 * rank issues the correct collective):
 *
 *   ordered  Broadcast root 0, then AllReduce, on every rank (the seed's PASS case)
 *   op       rank 0 Broadcast root 0, the others AllReduce SUM (1 float)
 *   size     AllReduce of 4 floats on rank 0, 8 on the others
 *   dtype    AllReduce of 4 float32 on rank 0, 4 int32 on the others
 *   root     Broadcast of 4 floats, root 0 on rank 0, root 1 on the others
 *   redop    AllReduce of 4 floats, SUM on rank 0, MAX on the others
 *   skip     rank 0 skips the collective, the others issue an AllReduce
 *
 * each under verification off, strict and async (window 1, stall bound
 * --stall-ms), with the seed's 6 s deadline; and with no setting at all
 * (the "-default" cases: verification as it is by default, async with its
 * window and stall bound, the default watchdog), where every rank then
 * issues enough AllReduces to fill the first window, for the same kinds and:
 *
 *   p2p-count  rank 0 sends 4 floats to rank 1, which receives 8
 *   p2p-skip   rank 1 receives 4 floats from rank 0, which never sends them
 *   fail       rank 1's comm fails at the case's collective (the sim's async
 *              error at that op; on GPUs rank 1 aborts its comm with it in flight)
 *
 * Each rank writes DIR/rank<r>.json: what happened to the injected
 * collective, which layer caught it (strict, async, peer, watchdog, NCCL,
 * none), when, and the comm's final state; its flight recorder goes to
 * DIR/dumps for ncfsm-trace and fr_trace (run_matrix.sh runs them). --report
 * prints the tables from a directory of cases, and with --check compares
 * each case with what the design promises (exit 1 on a difference).
 *
 * Exit status of a case run: 0 when the case ran (whatever it found), 1 on a
 * harness error, 77 with --require-gpu and no GPU.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "ncfsm.h"
#include "ncfsm/bootstrap.h"
#include "launch.h"

enum kind { K_ORDERED, K_OP, K_SIZE, K_DTYPE, K_ROOT, K_REDOP, K_SKIP, K_P2P_COUNT, K_P2P_SKIP, K_FAIL };
static const char *const kind_names[] = {"ordered", "op",   "size",      "dtype",    "root",
                                         "redop",   "skip", "p2p-count", "p2p-skip", "fail"};
/* The field a report names for each kind. */
static const char *const kind_field[] = {"", "op", "count", "dtype", "root", "redop", "", "count", "", ""};
static const char *const mode_names[] = {"off", "async", "strict"}; /* ncfsm_verify_mode_t */
#define FAIL_RANK 1 /* the rank whose comm fails in the fail case */
#define DEFAULTS NCFSM_VERIFY_ASYNC, true

typedef struct mcase {
  const char *name;
  enum kind kind;
  ncfsm_verify_mode_t mode; /* the mode it sets; for a -default case the default it expects */
  bool defaults;            /* sets no verification option and no deadline: the library's defaults */
  const char *seed;         /* the seed chapter's result for this case, or NULL */
} mcase;

static const mcase cases[] = {
    {"ordered", K_ORDERED, NCFSM_VERIFY_OFF, false, "PASS (both ranks Broadcast -> AllReduce)"},
    {"op-strict", K_OP, NCFSM_VERIFY_STRICT, false,
     "TORCH_DISTRIBUTED_DEBUG=DETAIL: \"Detected mismatch between collectives on ranks\", SequenceNumber=2, Op type"},
    {"size-strict", K_SIZE, NCFSM_VERIFY_STRICT, false,
     "TORCH_DISTRIBUTED_DEBUG=DETAIL: mismatch at SequenceNumber=2, Tensor shapes [4] vs [8]"},
    {"dtype-strict", K_DTYPE, NCFSM_VERIFY_STRICT, false, NULL},
    {"root-strict", K_ROOT, NCFSM_VERIFY_STRICT, false, NULL},
    {"redop-strict", K_REDOP, NCFSM_VERIFY_STRICT, false, NULL},
    {"skip-strict", K_SKIP, NCFSM_VERIFY_STRICT, false, NULL},
    {"op-off", K_OP, NCFSM_VERIFY_OFF, false,
     "rank 0 returned value=10.0 (its own Broadcast input); rank 1 watchdog after 6009 ms"},
    {"size-off", K_SIZE, NCFSM_VERIFY_OFF, false, NULL},
    {"dtype-off", K_DTYPE, NCFSM_VERIFY_OFF, false, NULL},
    {"root-off", K_ROOT, NCFSM_VERIFY_OFF, false, NULL},
    {"redop-off", K_REDOP, NCFSM_VERIFY_OFF, false, NULL},
    {"skip-off", K_SKIP, NCFSM_VERIFY_OFF, false, "rank 0 skipped seq 1; rank 1 watchdog after 6008 ms"},
    {"op-async", K_OP, NCFSM_VERIFY_ASYNC, false, NULL},
    {"size-async", K_SIZE, NCFSM_VERIFY_ASYNC, false, NULL},
    {"dtype-async", K_DTYPE, NCFSM_VERIFY_ASYNC, false, NULL},
    {"root-async", K_ROOT, NCFSM_VERIFY_ASYNC, false, NULL},
    {"redop-async", K_REDOP, NCFSM_VERIFY_ASYNC, false, NULL},
    {"skip-async", K_SKIP, NCFSM_VERIFY_ASYNC, false, NULL},
    {"op-default", K_OP, DEFAULTS, NULL},
    {"size-default", K_SIZE, DEFAULTS, NULL},
    {"dtype-default", K_DTYPE, DEFAULTS, NULL},
    {"root-default", K_ROOT, DEFAULTS, NULL},
    {"redop-default", K_REDOP, DEFAULTS, NULL},
    {"skip-default", K_SKIP, DEFAULTS, NULL},
    {"p2p-count-default", K_P2P_COUNT, DEFAULTS, NULL},
    {"p2p-skip-default", K_P2P_SKIP, DEFAULTS, NULL},
    {"fail-default", K_FAIL, DEFAULTS, NULL},
};
#define NCASES (sizeof cases / sizeof *cases)

static const mcase *find_case(const char *name) {
  for (size_t i = 0; i < NCASES; i++)
    if (!strcmp(cases[i].name, name)) return &cases[i];
  return NULL;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "failure_matrix: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

#define CHECK(call)                                                                             \
  do {                                                                                          \
    ncfsm_result_t r_ = (call);                                                                 \
    if (r_ != NCFSM_OK) die("%s:%d %s -> %s", __FILE__, __LINE__, #call, ncfsm_err_name(r_)); \
  } while (0)

/* ---- one rank of one case ---------------------------------------------------- */

typedef struct op_res {
  bool submitted, resolved;
  ncfsm_result_t status;
  double t_submit, t_done;
} op_res;

static double t_error; /* when the comm entered ERROR (0: never) */

static void on_state(ncfsm_comm *c, ncfsm_state_t from, ncfsm_state_t to, ncfsm_event_t ev, void *arg) {
  (void)c;
  (void)from;
  (void)ev;
  (void)arg;
  if (to == NCFSM_STATE_ERROR && t_error == 0) t_error = now_ms();
}

static void on_done(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  op_res *r = arg;
  r->resolved = true;
  r->status = st;
  r->t_done = now_ms();
}

static bool file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* Run the loop until every rank's file NAME exists in dir or until the
 * time limit (ms since the epoch of now_ms). */
static void wait_files(ncfsm_loop *loop, const char *dir, const char *suffix, int nranks, double limit) {
  char path[4096];
  for (;;) {
    int n = 0;
    for (int r = 0; r < nranks; r++) {
      snprintf(path, sizeof path, "%s/rank%d.%s", dir, r, suffix);
      n += file_exists(path);
    }
    if (n == nranks || now_ms() > limit) return;
    ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
    usleep(2000);
  }
}

static void touch(const char *dir, int rank, const char *suffix) {
  char path[4096];
  snprintf(path, sizeof path, "%s/rank%d.%s", dir, rank, suffix);
  FILE *f = fopen(path, "w");
  if (!f) die("cannot write %s: %s", path, strerror(errno));
  fclose(f);
}

/* Run the loop until the work resolved, the comm failed, or the limit. */
static void wait_op(ncfsm_loop *loop, ncfsm_comm *c, const op_res *r, double limit) {
  while (!r->resolved && ncfsm_comm_state(c) != NCFSM_STATE_ERROR && now_ms() < limit) {
    ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
    usleep(200);
  }
}

/* Which layer caught the fault: the comm's failure names it; else the op's status. */
static const char *layer_of(const op_res *r, const char *failure, bool failed) {
  if (failed) {
    if (strstr(failure, "comm failed first")) return "peer"; /* NCFSM_ERR_PEER: another rank's failure */
    if (strstr(failure, "strict verification")) return "strict";
    if (strstr(failure, "verification")) return "async";
    if (strstr(failure, "watchdog")) return "watchdog";
    return "NCCL";
  }
  if (!r->submitted) return "-";
  if (!r->resolved) return "unresolved";
  if (r->status == NCFSM_ERR_MISMATCH) return "strict";
  if (r->status != NCFSM_OK) return "NCCL";
  return "none";
}

static void submit(op_res *r) {
  r->submitted = true;
  r->t_submit = now_ms();
}

/* The case's collective (or send or receive) on this rank; false: it issues none. */
static bool inject(const mcase *mc, ncfsm_comm *c, void **buf, int rank, op_res *bad) {
  bool odd = rank == 0, p2p = mc->kind == K_P2P_COUNT || mc->kind == K_P2P_SKIP;
  if ((mc->kind == K_SKIP && odd) || (p2p && (rank > 1 || (odd && mc->kind == K_P2P_SKIP)))) return false;
  void *in = buf[0], *res = buf[1];
  ncfsm_dtype_t f32 = NCFSM_FLOAT32;
  ncfsm_result_t r;
  submit(bad);
  switch (mc->kind) {
    case K_OP: /* rank 0 Broadcast, the others AllReduce */
      r = odd ? ncfsm_broadcast(c, in, res, 1, f32, 0, NULL, on_done, bad, NULL)
              : ncfsm_allreduce(c, in, res, 1, f32, NCFSM_OP_SUM, NULL, on_done, bad, NULL);
      break;
    case K_SIZE: r = ncfsm_allreduce(c, in, res, odd ? 4 : 8, f32, NCFSM_OP_SUM, NULL, on_done, bad, NULL); break;
    case K_DTYPE:
      r = ncfsm_allreduce(c, in, res, 4, odd ? f32 : NCFSM_INT32, NCFSM_OP_SUM, NULL, on_done, bad, NULL);
      break;
    case K_ROOT: r = ncfsm_broadcast(c, in, res, 4, f32, odd ? 0 : 1, NULL, on_done, bad, NULL); break;
    case K_REDOP:
      r = ncfsm_allreduce(c, in, res, 4, f32, odd ? NCFSM_OP_SUM : NCFSM_OP_MAX, NULL, on_done, bad, NULL);
      break;
    case K_P2P_COUNT: /* rank 0 sends 4, rank 1 receives 8 */
    case K_P2P_SKIP:  /* rank 1 receives 4, rank 0 sends nothing */
      r = odd ? ncfsm_send(c, in, 4, f32, 1, NULL, on_done, bad, NULL)
              : ncfsm_recv(c, res, mc->kind == K_P2P_COUNT ? 8 : 4, f32, 0, NULL, on_done, bad, NULL);
      break;
    default: /* ordered, skip, fail: the AllReduce every rank issues */
      r = ncfsm_allreduce(c, in, res, 1, f32, NCFSM_OP_SUM, NULL, on_done, bad, NULL);
  }
  if (r == NCFSM_ERR_ILLEGAL_STATE && ncfsm_comm_state(c) != NCFSM_STATE_READY && ncfsm_comm_failure(c)[0]) {
    /* another rank's failure reached this comm before its op (fail-default): recorded as refused */
    bad->resolved = true;
    bad->status = r;
    bad->t_done = now_ms();
    return true;
  }
  if (r != NCFSM_OK) die("rank %d: the case's op -> %s: %s", rank, ncfsm_err_name(r), ncfsm_comm_last_error(c));
  return true;
}

static int run_case(const mcase *mc, const char *out, uint64_t deadline_ms, uint64_t stall_ms, bool require_gpu) {
  ncfsm_backend_info bi;
  ncfsm_backend_kind_t bk = require_gpu ? NCFSM_BACKEND_NCCL : NCFSM_BACKEND_AUTO;
  bool have = ncfsm_backend_query(bk, &bi) == NCFSM_OK;
  if (require_gpu && (!have || bi.device_count <= 0)) {
    printf("SKIP: --require-gpu and no GPU is visible (%s)\n", bi.why[0] ? bi.why : "0 CUDA devices");
    return 77;
  }
  if (!have) die("no backend: %s", bi.why);
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo); /* NCFSM_BOOTSTRAP, NCFSM_STORE_ADDR, NCFSM_RANK, ...: docs/settings.md */
  ncfsm_loop *loop;
  CHECK(ncfsm_loop_new(NULL, &loop));
  ncfsm_boot *boot;
  int launched = ex_launch(ncfsm_loop_base(loop), &bo, &boot, "failure_matrix");
  if (launched < 0) exit(1);
  if (!launched)
    die("a case runs one rank per process: launch it with mpirun (or srun --mpi=pmix), or set NCFSM_STORE_ADDR, "
        "NCFSM_RANK and NCFSM_WORLD_SIZE");
  int rank = ncfsm_boot_rank(boot), nranks = ncfsm_boot_size(boot);
  if (nranks < 2) die("a case needs at least 2 ranks (got %d)", nranks);
  if (bi.kind == NCFSM_BACKEND_NCCL && ncfsm_boot_local_rank(boot) >= bi.device_count)
    die("rank %d: local rank %d but %d GPU(s)", rank, ncfsm_boot_local_rank(boot), bi.device_count);

  char dumps[4096];
  snprintf(dumps, sizeof dumps, "%s/dumps", out);
  if (rank == 0) {
    mkdir(out, 0755);
    mkdir(dumps, 0755);
  }
  ncfsm_comm_opts o;
  CHECK(ncfsm_comm_opts_init(&o));
  o.backend = bk;
  o.name = mc->name;
  o.device = bi.kind == NCFSM_BACKEND_NCCL ? ncfsm_boot_local_rank(boot) : 0;
  o.on_error = NCFSM_ON_ERROR_STAY;   /* keep a failed comm for the report; aborted at the end */
  o.dump_dir = dumps;
  o.on_state = on_state;
  if (!mc->defaults) {
    o.timeout_ms = deadline_ms; /* the seed's watchdog: 6 s */
    o.verify = mc->mode;
    o.verify_window = 1;
    o.verify_stall_ms = stall_ms;
  }
  ncfsm_sim_opts so; /* the fail case: rank FAIL_RANK's comm fails at the case's collective, seq 1 */
  bool sim_fault = mc->kind == K_FAIL && rank == FAIL_RANK && bi.kind == NCFSM_BACKEND_SIM;
  if (sim_fault) {
    CHECK(ncfsm_sim_opts_init(&so));
    so.async_error_at_op = 1;
    o.sim = &so;
  }
  /* what the -default cases run with (the bound after which a case "hangs") */
  unsigned win = o.verify_window ? o.verify_window : 1;
  double bound = mc->defaults ? (double)o.verify_stall_ms + 10000 : (double)deadline_ms + 5000;
  ncfsm_comm *c;
  CHECK(ncfsm_comm_new(loop, &o, &c));
  CHECK(ncfsm_comm_init_boot(c, boot));
  if (ncfsm_comm_wait_state(c, NCFSM_STATE_READY, 60000) != NCFSM_OK)
    die("rank %d: init did not reach READY: %s", rank, ncfsm_comm_last_error(c));

  enum { CNT = 8 };
  float host[CNT];
  void *buf[3];
  for (int k = 0; k < 3; k++) CHECK(ncfsm_mem_alloc(c, CNT * sizeof(float), &buf[k]));
  float mine = 10.0f * (float)(rank + 1), sum = 0;
  for (int r = 0; r < nranks; r++) sum += 10.0f * (float)(r + 1);
  for (int i = 0; i < CNT; i++) host[i] = mine;
  CHECK(ncfsm_memcpy(c, buf[0], host, sizeof host, 1));

  /* 1. a valid AllReduce: init and the basic path are not the fault */
  op_res warm = {0};
  submit(&warm);
  CHECK(ncfsm_allreduce(c, buf[0], buf[1], 1, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_done, &warm, NULL));
  wait_op(loop, c, &warm, now_ms() + bound);
  if (!warm.resolved || warm.status != NCFSM_OK)
    die("rank %d: the warm-up AllReduce did not complete: %s", rank, ncfsm_comm_failure(c));
  CHECK(ncfsm_memcpy(c, host, buf[1], sizeof(float), 0));
  if (host[0] != sum) die("rank %d: warm-up AllReduce gave %g, want %g", rank, (double)host[0], (double)sum);
  if (mc->kind == K_FAIL) { /* every rank's verification channel open (on the TCP store: at the store,
                               which gets each rank's frames in order) before the failure */
    int *ranks = calloc((size_t)nranks, sizeof *ranks);
    if (!ranks || ncfsm_boot_allgather(boot, &rank, ranks, sizeof rank) != NCFSM_OK)
      die("rank %d: the allgather after the warm-up failed: %s", rank, ncfsm_boot_last_error(boot));
    free(ranks);
  }

  /* 2. the case */
  op_res pre = {0}, bad = {0}, after = {0};
  if (mc->kind == K_ORDERED) { /* the seed's ordered case: Broadcast, then the AllReduce below */
    submit(&pre);
    CHECK(ncfsm_broadcast(c, buf[0], buf[2], 1, NCFSM_FLOAT32, 0, NULL, on_done, &pre, NULL));
  }
  double t0 = now_ms();
  if (inject(mc, c, buf, rank, &bad)) t0 = bad.t_submit;
  if (mc->kind == K_FAIL && rank == FAIL_RANK && !sim_fault) CHECK(ncfsm_comm_abort(c)); /* GPUs: a failure too */
  /* -default: every rank goes on to its first window's exchange (win collectives: the skipping rank is one short) */
  int nfollow = 0;
  if (mc->defaults && mc->kind != K_FAIL)
    nfollow = (int)win - (mc->kind == K_P2P_COUNT || mc->kind == K_P2P_SKIP ? 1 : 2);
  op_res *follow = calloc(nfollow > 0 ? (size_t)nfollow : 1, sizeof *follow);
  if (!follow) die("out of memory");
  for (int k = 0; k < nfollow && ncfsm_comm_state(c) == NCFSM_STATE_READY; k++) {
    submit(&follow[k]);
    CHECK(ncfsm_allreduce(c, buf[0], buf[2], 1, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_done, &follow[k], NULL));
  }
  double hard = t0 + bound; /* past it, a rank "hangs past its deadline" */
  if (pre.submitted) wait_op(loop, c, &pre, hard);
  if (bad.submitted) wait_op(loop, c, &bad, hard);
  touch(out, rank, "done");
  /* Every rank resolved its op (or the bound passed); async exchanges settle. */
  wait_files(loop, out, "done", nranks, hard);
  /* Async: this rank's exchange of the last window completes once every rank
   * posted it, which under load can take a while; wait for the verdict (the
   * comm failing) up to the stall bound and some, not for a fixed time. */
  bool async = mc->mode == NCFSM_VERIFY_ASYNC;
  double settle = async ? (double)stall_ms + 2000 : 300; /* -default: up to the case's bound */
  for (double until = mc->defaults ? hard : now_ms() + settle; now_ms() < until;) {
    if (async && ncfsm_comm_failure(c)[0]) break;
    ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT);
    usleep(1000);
  }
  float value = 0;
  bool have_value = bad.resolved && bad.status == NCFSM_OK && mc->kind != K_P2P_COUNT && mc->kind != K_P2P_SKIP;
  if (have_value) {
    CHECK(ncfsm_memcpy(c, host, buf[1], sizeof(float), 0));
    value = host[0];
  }
  /* 3. strict: the comm is still usable; every rank shows it with a valid AllReduce */
  bool after_wrong = false;
  bool followup = (mc->mode == NCFSM_VERIFY_STRICT && mc->kind != K_SKIP) || mc->kind == K_ORDERED;
  if (followup && ncfsm_comm_state(c) == NCFSM_STATE_READY) {
    submit(&after);
    CHECK(ncfsm_allreduce(c, buf[0], buf[2], 1, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, on_done, &after, NULL));
    wait_op(loop, c, &after, now_ms() + bound);
    if (after.resolved && after.status == NCFSM_OK) {
      CHECK(ncfsm_memcpy(c, host, buf[2], sizeof(float), 0));
      after_wrong = host[0] != sum;
    }
  }

  /* 4. the rank's record */
  char failure[1024], last[1024];
  snprintf(failure, sizeof failure, "%s", ncfsm_comm_failure(c));
  snprintf(last, sizeof last, "%s", ncfsm_comm_last_error(c));
  ncfsm_state_t state = ncfsm_comm_state(c);
  bool failed = failure[0] != 0;
  double detect = -1;
  if (bad.submitted && bad.resolved && bad.status != NCFSM_OK) detect = bad.t_done - t0;
  if (t_error > 0 && (detect < 0 || t_error - t0 < detect)) detect = t_error - t0;
  int ver = bi.nccl_version, nfollowed = 0;
  for (int k = 0; k < nfollow; k++) nfollowed += follow[k].submitted;
  char verstr[48];
  snprintf(verstr, sizeof verstr, "%d.%d.%d%s", ver / 10000, ver / 100 % 100, ver % 100,
           bi.kind == NCFSM_BACKEND_SIM ? " (modelled)" : "");
  json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:s, s:s, s:b, s:b, s:s, s:s, s:f, s:s, s:s, s:s}",
                        "case", mc->name, "kind", kind_names[mc->kind], "verify", mode_names[o.verify],
                        "seed", mc->seed ? mc->seed : "", "rank", rank, "nranks", nranks, "backend", bi.name,
                        "nccl_version", verstr, "submitted", bad.submitted, "resolved", bad.resolved,
                        "status", bad.submitted && bad.resolved ? ncfsm_err_name(bad.status) : "-", "layer",
                        layer_of(&bad, failure, failed), "detect_ms", detect, "state", ncfsm_state_name(state),
                        "failure", failure, "last_error", last);
  if (!j) die("json_pack");
  json_object_set_new(j, "defaults", json_boolean(mc->defaults));
  json_object_set_new(j, "deadline_ms", json_integer((json_int_t)o.timeout_ms));
  json_object_set_new(j, "stall_ms", json_integer((json_int_t)o.verify_stall_ms));
  json_object_set_new(j, "window", json_integer((json_int_t)win));
  json_object_set_new(j, "followups", json_integer(nfollowed));
  json_object_set_new(j, "t_error_ms", json_real(t_error)); /* CLOCK_MONOTONIC: one clock for the host's ranks */
  json_object_set_new(j, "value", have_value ? json_real(value) : json_null());
  json_object_set_new(j, "pre", pre.submitted ? json_string(pre.resolved ? ncfsm_err_name(pre.status) : "-")
                                              : json_null());
  json_object_set_new(j, "after", !after.submitted ? json_null()
                                  : after_wrong    ? json_string("WRONG RESULT")
                                                   : json_string(after.resolved ? ncfsm_err_name(after.status)
                                                                                : "unresolved"));
  json_object_set_new(j, "hung", json_boolean(bad.submitted && !bad.resolved && !failed));
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/rank%d.json", out, rank);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  if (json_dump_file(j, tmp, JSON_INDENT(1)) != 0 || rename(tmp, path) != 0) die("cannot write %s", path);
  json_decref(j);
  printf("[%s] rank %d: %s %s, caught by %s, state %s%s%s\n", mc->name, rank,
         bad.submitted ? "op" : "skipped", bad.submitted && bad.resolved ? ncfsm_err_name(bad.status) : "",
         layer_of(&bad, failure, failed), ncfsm_state_name(state), failed ? ": " : "", failure);

  /* 5. the recorder, for the analyzers; then every rank's record is in, and the comm goes */
  ncfsm_result_t dr = ncfsm_comm_dump(c, dumps);
  if (dr != NCFSM_OK) fprintf(stderr, "rank %d: dump: %s\n", rank, ncfsm_err_name(dr));
  wait_files(loop, out, "json", nranks, now_ms() + bound);
  bool healthy = state == NCFSM_STATE_READY && !failed && (!bad.submitted || bad.status == NCFSM_OK) &&
                 mc->kind == K_ORDERED;
  if (healthy) {
    CHECK(ncfsm_comm_finalize(c));
    if (ncfsm_comm_wait_state(c, NCFSM_STATE_FINALIZED, deadline_ms) == NCFSM_OK) CHECK(ncfsm_comm_destroy(c));
    else CHECK(ncfsm_comm_abort(c));
  } else if (state != NCFSM_STATE_CLOSING && state != NCFSM_STATE_CLOSED) {
    CHECK(ncfsm_comm_abort(c));
  }
  ncfsm_comm_wait_state(c, NCFSM_STATE_CLOSED, 60000);
  for (int k = 0; k < 3; k++) ncfsm_mem_free(c, buf[k]); /* whatever became of the comm (LSan: a failed one's leaked) */
  ncfsm_comm_release(c);
  ncfsm_boot_close(boot);
  CHECK(ncfsm_loop_close(loop));
  free(follow); /* the works' callbacks may run until the loop is closed */
  return 0;
}

/* ---- the report ----------------------------------------------------------------- */

static char *read_text(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  char *s = calloc(1, 65536);
  if (s) {
    size_t n = fread(s, 1, 65535, f);
    s[n] = 0;
  }
  fclose(f);
  return s;
}

static const char *jstr(json_t *o, const char *k) {
  const char *s = json_string_value(json_object_get(o, k));
  return s ? s : "";
}

/* The first line of text, with | escaped for a markdown table cell. */
static void md_cell(const char *s, char *out, size_t n) {
  size_t k = 0;
  for (const char *p = s; *p && *p != '\n' && k + 2 < n; p++) {
    if (*p == '|') out[k++] = '\\';
    out[k++] = *p;
  }
  out[k] = 0;
}

/* The first line of a file (the analyzer's verdict), as a markdown cell. */
static void first_line(const char *path, char *out, size_t n) {
  char *s = read_text(path);
  out[0] = 0;
  if (!s) return;
  md_cell(s, out, n);
  free(s);
}

static int check_fail(const char *cname, int rank, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static FILE *check_out; /* the differences, printed after the tables (stdout when NULL) */

static int check_fail(const char *cname, int rank, const char *fmt, ...) {
  FILE *o = check_out ? check_out : stdout;
  va_list ap;
  va_start(ap, fmt);
  fprintf(o, "CHECK %s rank %d: FAIL: ", cname, rank);
  vfprintf(o, fmt, ap);
  fprintf(o, "\n");
  va_end(ap);
  return 1;
}

/* What a -default case promises on rank r (docs/ordering.md, "The failure
 * matrix"): every rank's comm fails, naming the fault with its seq, field
 * and each rank's value, or for a skip the rank behind and where it is, or
 * for a failure the rank it started on. */
static int check_default(const mcase *mc, json_t *j, int r) {
  const char *layer = jstr(j, "layer"), *state = jstr(j, "state"), *failure = jstr(j, "failure");
  int np = (int)json_integer_value(json_object_get(j, "nranks"));
  long long win = json_integer_value(json_object_get(j, "window"));
  char want[400] = "", want2[160] = "";
  bool own = true, peer = true; /* may it find it itself; may it learn it from another rank (NCFSM_ERR_PEER) */
  switch (mc->kind) {
    case K_OP:
    case K_SIZE:
    case K_DTYPE:
    case K_ROOT:
    case K_REDOP: { /* every rank finds a divergence itself (it is not passed on) */
      static const char *const v0[] = {"", "", "4", "", "0", ""}, *const v1[] = {"", "", "8", "", "1", ""};
      const char *f = kind_field[mc->kind], *a = v0[mc->kind], *b = v1[mc->kind];
      if (mc->kind == K_OP) a = ncfsm_opkind_name(NCFSM_KIND_BROADCAST), b = ncfsm_opkind_name(NCFSM_KIND_ALLREDUCE);
      if (mc->kind == K_DTYPE) a = ncfsm_dtype_name(NCFSM_FLOAT32), b = ncfsm_dtype_name(NCFSM_INT32);
      if (mc->kind == K_REDOP) a = ncfsm_redop_name(NCFSM_OP_SUM), b = ncfsm_redop_name(NCFSM_OP_MAX);
      int n = snprintf(want, sizeof want, "seq 1: %s mismatch: rank 0 %s %s, rank%s ", f, f, a, np > 2 ? "s" : "");
      for (int k = 1; k < np && n > 0 && (size_t)n < sizeof want; k++)
        n += snprintf(want + n, sizeof want - (size_t)n, "%s%d", k > 1 ? "," : "", k);
      if (n > 0 && (size_t)n < sizeof want) snprintf(want + n, sizeof want - (size_t)n, " %s %s", f, b);
      snprintf(want2, sizeof want2, "NCFSM_ERR_MISMATCH");
      peer = false;
      break;
    }
    case K_SKIP: /* the others stall at the window's exchange; rank 0 learns it from them */
      snprintf(want, sizeof want, "behind: rank 0 at seq %lld (", win - 1);
      snprintf(want2, sizeof want2, "not every rank reached collective seq %lld", win);
      own = r != 0;
      break;
    case K_P2P_COUNT: /* the pair's two ranks compare it; the others learn it */
      snprintf(want, sizeof want, "send/recv seq 0 from rank 0 to rank 1: count mismatch: rank 0 sends 4, rank 1 "
               "receives 8");
      peer = r > 1;
      break;
    case K_P2P_SKIP: /* rank 1's receive waits for a send rank 0 never posted */
      snprintf(want, sizeof want, "receive seq 0 from rank 0 was launched here");
      snprintf(want2, sizeof want2, "rank 0 never posted the matching send");
      own = r == 1;
      peer = r != 1;
      break;
    case K_FAIL: /* rank FAIL_RANK's comm fails; every other rank's fails with NCFSM_ERR_PEER naming it */
      if (r == FAIL_RANK) {
        if (!failure[0] || !strcmp(layer, "peer"))
          return check_fail(mc->name, r, "its comm must fail by itself; got layer %s, state %s: %s", layer, state, failure);
        return 0;
      }
      snprintf(want, sizeof want, "rank %d's comm failed first, ", FAIL_RANK);
      /* the cause: the sim's async error (on GPUs its comm is aborted with the op in flight) */
      snprintf(want2, sizeof want2, "%s", strcmp(jstr(j, "backend"), "sim") ? "NCFSM_ERR_PEER" : "(NCFSM_ERR_ASYNC)");
      if (!strstr(failure, "NCFSM_ERR_PEER")) return check_fail(mc->name, r, "its failure must be NCFSM_ERR_PEER: %s", failure);
      own = false;
      break;
    default: return check_fail(mc->name, r, "no promise for this kind");
  }
  bool by_self = !strcmp(layer, "async"), by_peer = !strcmp(layer, "peer");
  int bad = 0;
  if (strcmp(state, "ERROR") || !((own && by_self) || (peer && by_peer)))
    bad |= check_fail(mc->name, r, "want the comm failed by %s%s%s; got layer %s, state %s", own ? "its verification" : "",
                      own && peer ? " or " : "", peer ? "another rank's failure (NCFSM_ERR_PEER)" : "", layer, state);
  if (!strstr(failure, want) || !strstr(failure, want2))
    bad |= check_fail(mc->name, r, "its failure must say '%s'%s%s%s: %s", want, want2[0] ? " and '" : "", want2,
                      want2[0] ? "'" : "", failure[0] ? failure : "(none)");
  return bad;
}

/* What the design promises for rank r of case mc (docs/ordering.md, "The
 * failure matrix"); the analyzer's exit code and verdict line too. */
static int check_rank(const mcase *mc, json_t *j, int r, int trace_rc, const char *verdict) {
  const char *layer = jstr(j, "layer"), *status = jstr(j, "status"), *state = jstr(j, "state");
  const char *after = json_string_value(json_object_get(j, "after"));
  bool odd = r == 0;
  int bad = 0;
  if (json_is_true(json_object_get(j, "hung")))
    bad |= check_fail(mc->name, r, "the injected op neither finished nor failed within %s", mc->defaults
                      ? "the stall bound + 10 s" : "its deadline + 5 s");
  if (mc->defaults) {
    bad |= check_default(mc, j, r);
  } else if (mc->kind == K_SKIP && odd && mc->mode != NCFSM_VERIFY_OFF) {
    /* the others' stall reaches it (a failure reaches every rank); strict over the companion
     * (channel nccl) names no rank behind: its stall is the companion's AllGather's */
    bool named = strstr(jstr(j, "failure"), "behind: rank 0 ") || strstr(jstr(j, "failure"), "(channel nccl)");
    if (strcmp(layer, "peer") || !named)
      bad |= check_fail(mc->name, r, "rank 0 skips: want the others' stall to fail its comm with NCFSM_ERR_PEER "
                        "naming it behind; got layer %s, state %s: %s", layer, state, jstr(j, "failure"));
  } else if (mc->kind == K_SKIP && odd) {
    if (strcmp(layer, "-")) bad |= check_fail(mc->name, r, "rank 0 skips, but its layer is %s", layer);
  } else if (mc->kind == K_ORDERED) {
    if (strcmp(status, "NCFSM_OK") || strcmp(state, "READY") || !after || strcmp(after, "NCFSM_OK"))
      bad |= check_fail(mc->name, r, "want every op OK and READY; got %s, %s, after %s", status, state,
                        after ? after : "-");
  } else if (mc->mode != NCFSM_VERIFY_OFF && mc->kind == K_SKIP) {
    bool self = !strcmp(layer, mc->mode == NCFSM_VERIFY_STRICT ? "strict" : "async"), peer = !strcmp(layer, "peer");
    bool named = strstr(jstr(j, "failure"), "behind: rank 0 ") || strstr(jstr(j, "failure"), "(channel nccl)");
    if (!(self || peer) || strcmp(state, "ERROR") || !named)
      bad |= check_fail(mc->name, r, "want the stall bound to fail the comm naming rank 0 behind; got layer %s, state "
                        "%s: %s", layer, state, jstr(j, "failure"));
  } else if (mc->mode == NCFSM_VERIFY_STRICT) {
    char want[64];
    snprintf(want, sizeof want, "differs across ranks in %s", kind_field[mc->kind]);
    if (strcmp(status, "NCFSM_ERR_MISMATCH") || strcmp(layer, "strict") || strcmp(state, "READY"))
      bad |= check_fail(mc->name, r, "want MISMATCH by strict, comm READY; got %s by %s, %s", status, layer, state);
    if (!strstr(jstr(j, "last_error"), want))
      bad |= check_fail(mc->name, r, "the report does not say '%s': %s", want, jstr(j, "last_error"));
    if (!after || strcmp(after, "NCFSM_OK"))
      bad |= check_fail(mc->name, r, "the comm must stay usable: the next AllReduce gave %s", after ? after : "-");
  } else if (mc->mode == NCFSM_VERIFY_ASYNC) {
    if (strcmp(layer, "async") || strcmp(state, "ERROR"))
      bad |= check_fail(mc->name, r, "want async verification to fail the comm; got layer %s, state %s", layer, state);
  } else { /* off: what NCCL does, measured (docs/sim.md, R11) */
    bool silent = mc->kind == K_DTYPE || mc->kind == K_ROOT || mc->kind == K_REDOP;
    if (silent || odd) {
      if (strcmp(layer, "none") || strcmp(status, "NCFSM_OK"))
        bad |= check_fail(mc->name, r, "NCCL completes this side with no error; got %s by %s", status, layer);
    } else if (strcmp(layer, "watchdog") || strcmp(state, "ERROR")) {
      bad |= check_fail(mc->name, r, "NCCL never completes this side: the watchdog must end it; got %s by %s, %s",
                        status, layer, state);
    }
  }
  if (r == 0) { /* the analyzer, once per case */
    static const char *const verdict_word[] = {"",               "op mismatch",    "count mismatch", "dtype mismatch",
                                               "root mismatch",  "redop mismatch", "never launched", "count mismatch",
                                               "has no matching SEND", "failed"};
    bool launched_bad = mc->kind != K_ORDERED && (mc->mode != NCFSM_VERIFY_STRICT || mc->kind == K_SKIP);
    if (!launched_bad && trace_rc != 0)
      bad |= check_fail(mc->name, r, "nothing mismatched was launched, but ncfsm-trace exits %d: %s", trace_rc, verdict);
    /* fail-default: rank 1's failure may reach rank 0 before it launched the collective (its
     * op refused): then the trace names the collective rank 0 never launched */
    bool named = strstr(verdict, verdict_word[mc->kind]) || (mc->kind == K_FAIL && strstr(verdict, "never launched"));
    if (launched_bad && (trace_rc != 1 || !named))
      bad |= check_fail(mc->name, r, "ncfsm-trace must name the %s (exit 1); exit %d: %s", verdict_word[mc->kind],
                        trace_rc, verdict);
  }
  return bad;
}

static int report(const char *dir, bool check, int want_np) {
  int failures = 0, ncases = 0;
  if (check) check_out = tmpfile(); /* NULL: printed where found */
  FILE *texts = tmpfile();          /* the -default cases' failure texts, printed after the tables */
  char path[4096];
  printf("| case | verify | rank | injected op | status | caught by | detection (ms) | final state | next AllReduce | ncfsm-trace verdict |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|\n");
  json_t *first = NULL, *dflt = NULL; /* a case of each kind of settings, for the footer */
  for (size_t i = 0; i < NCASES; i++) {
    const mcase *mc = &cases[i];
    snprintf(path, sizeof path, "%s/%s/rank0.json", dir, mc->name);
    json_t *j0 = json_load_file(path, 0, NULL);
    if (!j0) {
      if (check) failures += check_fail(mc->name, 0, "no %s (the case did not run or crashed)", path);
      continue;
    }
    int np = (int)json_integer_value(json_object_get(j0, "nranks"));
    if (!mc->defaults && !first) first = json_incref(j0);
    if (mc->defaults && !dflt) dflt = json_incref(j0);
    if (want_np && np != want_np && check) failures += check_fail(mc->name, 0, "%d ranks, want %d", np, want_np);
    char verdict[600] = "", rcs[32] = "";
    snprintf(path, sizeof path, "%s/%s/trace.txt", dir, mc->name);
    first_line(path, verdict, sizeof verdict);
    snprintf(path, sizeof path, "%s/%s/trace.rc", dir, mc->name);
    first_line(path, rcs, sizeof rcs);
    int trace_rc = rcs[0] ? atoi(rcs) : -1;
    ncases++;
    for (int r = 0; r < np; r++) {
      snprintf(path, sizeof path, "%s/%s/rank%d.json", dir, mc->name, r);
      json_t *j = r ? json_load_file(path, 0, NULL) : json_incref(j0);
      if (!j) {
        if (check) failures += check_fail(mc->name, r, "no %s", path);
        continue;
      }
      double det = json_real_value(json_object_get(j, "detect_ms"));
      char dets[32] = "-";
      if (det >= 0) snprintf(dets, sizeof dets, "%.1f", det);
      const char *after = json_string_value(json_object_get(j, "after"));
      json_t *val = json_object_get(j, "value");
      char vals[64] = "";
      if (json_is_real(val)) snprintf(vals, sizeof vals, " (value %.1f)", json_real_value(val));
      char cell[700] = "";
      if (r == 0 && rcs[0]) snprintf(cell, sizeof cell, "%s (exit %d)", verdict, trace_rc);
      printf("| %s | %s%s | %d | %s | %s%s | %s | %s | %s | %s | %s |\n", mc->name, mc->defaults ? "(default) " : "",
             jstr(j, "verify"), r,
             json_is_true(json_object_get(j, "submitted")) ? jstr(j, "kind")
             : r > 1 && (mc->kind == K_P2P_COUNT || mc->kind == K_P2P_SKIP) ? "(not in the pair)"
                                                                             : "skipped",
             jstr(j, "status"), vals,
             jstr(j, "layer"), dets, jstr(j, "state"), after ? after : "-", cell);
      if (check) failures += check_rank(mc, j, r, trace_rc, verdict);
      if (mc->defaults && texts) {
        char ft[1100];
        md_cell(jstr(j, "failure")[0] ? jstr(j, "failure") : "(none: the comm did not fail)", ft, sizeof ft);
        fprintf(texts, "| %s | %d | %s |\n", mc->name, r, ft);
      }
      json_decref(j);
    }
    json_decref(j0);
  }
  if (texts && ftell(texts) > 0) {
    printf("\nThe comm's failure on each rank of the -default cases (ncfsm_comm_failure):\n\n| case | rank | failure |\n"
           "|---|---|---|\n");
    rewind(texts);
    for (int ch; (ch = fgetc(texts)) != EOF;) putchar(ch);
  }
  if (texts) fclose(texts);
  if (first) {
    printf("\nbackend %s, NCCL %s, %d ranks; the -off, -strict, -async cases: deadline %" JSON_INTEGER_FORMAT
           " ms, stall bound %" JSON_INTEGER_FORMAT " ms, verify window 1\n",
           jstr(first, "backend"), jstr(first, "nccl_version"), (int)json_integer_value(json_object_get(first, "nranks")),
           json_integer_value(json_object_get(first, "deadline_ms")), json_integer_value(json_object_get(first, "stall_ms")));
    json_decref(first);
  }
  if (dflt) {
    printf("\nthe -default cases set nothing: verification %s, window %" JSON_INTEGER_FORMAT ", stall bound %"
           JSON_INTEGER_FORMAT " ms, deadline %" JSON_INTEGER_FORMAT " ms; each rank issues the window's collectives\n",
           jstr(dflt, "verify"), json_integer_value(json_object_get(dflt, "window")),
           json_integer_value(json_object_get(dflt, "stall_ms")), json_integer_value(json_object_get(dflt, "deadline_ms")));
    json_decref(dflt);
  }
  printf("\nThe seed's results (PyTorch ProcessGroup, 2 ranks, 6 s watchdog):\n\n| case | seed |\n|---|---|\n");
  for (size_t i = 0; i < NCASES; i++)
    if (cases[i].seed) printf("| %s | %s |\n", cases[i].name, cases[i].seed);
  if (check) {
    if (check_out && ftell(check_out) > 0) {
      printf("\nWhat differs from docs/ordering.md (\"The failure matrix\"):\n\n```\n");
      rewind(check_out);
      for (int ch; (ch = fgetc(check_out)) != EOF;) putchar(ch);
      printf("```\n");
    }
    if (check_out) fclose(check_out);
    printf("\n%d case(s) read; %s\n", ncases, failures ? "CHECK FAILED" : "CHECK PASS");
    if (!ncases) return 1;
  }
  return failures ? 1 : 0;
}

static void usage(const char *p) {
  fprintf(stderr,
          "usage: %s --list\n"
          "       mpirun -np N %s --case NAME --out DIR [--deadline-ms MS] [--stall-ms MS] [--require-gpu]\n"
          "       %s --report DIR [--check] [--np N]\n",
          p, p, p);
  exit(2);
}

int main(int argc, char **argv) {
  const char *cname = NULL, *out = NULL, *rdir = NULL;
  uint64_t deadline_ms = 6000, stall_ms = 1000;
  bool require_gpu = false, check = false, list = false;
  int np = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--case") && i + 1 < argc) cname = argv[++i];
    else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
    else if (!strcmp(argv[i], "--report") && i + 1 < argc) rdir = argv[++i];
    else if (!strcmp(argv[i], "--deadline-ms") && i + 1 < argc) deadline_ms = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--stall-ms") && i + 1 < argc) stall_ms = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--np") && i + 1 < argc) np = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--require-gpu")) require_gpu = true;
    else if (!strcmp(argv[i], "--check")) check = true;
    else if (!strcmp(argv[i], "--list")) list = true;
    else usage(argv[0]);
  }
  if (list) {
    for (size_t i = 0; i < NCASES; i++) printf("%s\n", cases[i].name);
    return 0;
  }
  if (rdir) return report(rdir, check, np);
  if (!cname || !out || !deadline_ms) usage(argv[0]);
  const mcase *mc = find_case(cname);
  if (!mc) {
    fprintf(stderr, "failure_matrix: unknown case '%s' (--list names them)\n", cname);
    return 2;
  }
  return run_case(mc, out, deadline_ms, stall_ms, require_gpu);
}
