/*
 * 02_group_semantics: the seed chapter's nine native group/async variants
 * (the chapter: docs/nccl-rules.md, "The seed chapter"), run through ncfsm. One CSV row per variant and rank; every row is a full
 * tensor check plus return-code and state checks.
 *
 *   mpirun -np 4 build/examples/02_group_semantics     one rank per process (PMIx)
 *   build/examples/02_group_semantics [--ranks N]       one thread drives N ranks
 *
 * Backend: NCFSM_BACKEND=auto|sim|nccl (auto: nccl when a GPU is visible).
 * In one-process mode on GPUs rank r uses GPU r; under mpirun the device is
 * the local rank. Exit 0 when every row passes, 1 otherwise, 77 with
 * --require-gpu when no GPU is visible.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ncfsm.h"
#include "ncfsm/bootstrap.h"
#include "ncfsm/sim.h"
#include "launch.h"

#define MAXR 64
#define DETAIL 480
#define WAIT_MS 120000

#define CHECK(call)                                                                       \
  do {                                                                                    \
    ncfsm_result_t r_ = (call);                                                           \
    if (r_ != NCFSM_OK) {                                                                 \
      fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #call, ncfsm_err_name(r_)); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

/* ---- the variants, in the seed's order ------------------------------------ */
enum {
  V_GROUP_END_WITHOUT_START,
  V_NESTED_DEPTH_TWO,
  V_TWO_USER_STREAMS,
  V_ASYNC_ERROR_AFTER_SUCCESS,
  V_INVALID_ROOT_GROUP_CLEANUP,
  V_VALID_OP_AFTER_GROUP_ERROR,
  V_NONBLOCKING_INIT_POLL,
  V_NONBLOCKING_GROUP_POLL,
  V_NONBLOCKING_FINALIZE_POLL,
  NV
};
static const char *vname[NV] = {
    "group-end-without-start",    "nested-depth-two",           "two-user-streams",
    "async-error-after-success",  "invalid-root-group-cleanup", "valid-op-after-group-error",
    "nonblocking-init-poll",      "nonblocking-group-poll",     "nonblocking-finalize-poll"};

/* What a PASS of each variant shows (the summary's last column); raw NCCL's
 * behaviour in the same place is in the README's table. */
static const char *vshows[NV] = {
    "a group end outside a group is refused (R3) before NCCL sees it; the comm stays READY",
    "an inner group end launches nothing; the outer one launches all 3 AllReduces, all correct",
    "one group over two user streams: both AllReduces correct",
    "a blocking comm stays READY with no async error after a correct AllReduce",
    "a bad root fails its group (R3) before NCCL: the group's AllReduce fails, its data untouched",
    "the comm works after that group error (raw NCCL 2.28 stays poisoned: R3)",
    "the loop polls a nonblocking init to READY (INIT_QUEUED, INIT_IN_PROGRESS)",
    "the loop polls an in-progress group end (R1) to final; data correct",
    "the loop polls finalize to FINALIZED (R4), then destroy reaches CLOSED"};

/* One row's outcome; exchanged between processes as is. */
typedef struct row {
  int32_t pass; /* 1 PASS, 0 FAIL, -1 not run */
  char detail[DETAIL];
} row;

/* ---- the job: which ranks this process drives ---------------------------- */
typedef struct job {
  int mpi;                    /* 1: one rank per process through a bootstrap */
  int nranks, nlocal, rank0;  /* world size; ranks here are rank0 .. rank0+nlocal-1 */
  size_t count;               /* int32 elements per buffer */
  ncfsm_loop *loop;
  ncfsm_boot *boot;
  ncfsm_comm_opts opts;
  ncfsm_backend_info bi;
  char backend[16], nccl_version[48];
  ncfsm_comm *comm[MAXR];     /* the nonblocking communicators */
  void *buf[MAXR][3];
  row rows[NV][MAXR];         /* [variant][local slot] */
} job;

static job J;
static int32_t *host;

/* ---- the trace: every transition, kept for the checks --------------------- */
#define LOGMAX 16384
typedef struct logent {
  ncfsm_object_kind_t kind;
  const void *object;
  int state, event, next;
  uint64_t t;
} logent;
static logent tlog[LOGMAX];
static int nlog, nlog_dropped;

static void trace(const ncfsm_trace_rec *r, void *arg) {
  (void)arg;
  if (nlog == LOGMAX) {
    nlog_dropped++;
    return;
  }
  tlog[nlog++] = (logent){r->kind, r->object, r->state, r->event, r->next, r->time_ns};
}

/* Index of the first transition of comm c at or after index from with event
 * ev, or -1. */
static int seen(const ncfsm_comm *c, int from, ncfsm_event_t ev) {
  for (int i = from; i < nlog; i++)
    if (tlog[i].kind == NCFSM_OBJ_COMM && tlog[i].object == c && tlog[i].event == (int)ev) return i;
  return -1;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- rows ------------------------------------------------------------------ */
/* Appends "; " and the note to the row's detail; a note that does not fit is
 * cut after its last whole word, and " ..." says so. */
static void note(int v, int s, const char *fmt, ...) {
  row *r = &J.rows[v][s];
  if (r->pass < 0) r->pass = 1;
  size_t len = strlen(r->detail);
  if (len + 8 >= DETAIL) return;
  if (len) {
    strcpy(r->detail + len, "; ");
    len += 2;
  }
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(r->detail + len, DETAIL - len, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < DETAIL - len) return;
  char *cut = strrchr(r->detail + len, ' ');
  size_t at = cut && (size_t)(cut - r->detail) + 5 < DETAIL ? (size_t)(cut - r->detail) + 1 : DETAIL - 4;
  strcpy(r->detail + at, "...");
}

#define FAIL(v, s, ...)       \
  do {                        \
    note(v, s, __VA_ARGS__);  \
    J.rows[v][s].pass = 0;    \
  } while (0)

/* Expect cond, else fail the row with what was found. */
#define EXPECT(v, s, cond, ...)              \
  do {                                       \
    if (!(cond)) FAIL(v, s, __VA_ARGS__);    \
  } while (0)

/* ---- buffers and full-tensor checks --------------------------------------- */
static int32_t pattern(int rank, int k, size_t i) { return (int32_t)((rank + 1) * (k + 1) + (int)(i % 1024)); }

/* Element i after a SUM AllReduce of pattern k over all ranks (uint32: wraps as NCCL does). */
static int32_t summed(int k, size_t i) {
  uint32_t n = (uint32_t)J.nranks;
  return (int32_t)((uint32_t)(k + 1) * (n * (n + 1) / 2) + n * (uint32_t)(i % 1024));
}

static void fill(int s, void *buf, int k) {
  for (size_t i = 0; i < J.count; i++) host[i] = pattern(J.rank0 + s, k, i);
  CHECK(ncfsm_memcpy(J.comm[s], buf, host, J.count * sizeof *host, 1));
}

/* 1 when every element of buf equals want(k, i) (summed) or pattern (own). */
static int check_tensor(int v, int s, ncfsm_comm *c, void *buf, int k, int reduced, const char *what) {
  CHECK(ncfsm_memcpy(c, host, buf, J.count * sizeof *host, 0));
  for (size_t i = 0; i < J.count; i++) {
    int32_t want = reduced ? summed(k, i) : pattern(J.rank0 + s, k, i);
    if (host[i] != want) {
      FAIL(v, s, "%s: element %zu is %" PRId32 ", expected %" PRId32, what, i, host[i], want);
      return 0;
    }
  }
  return 1;
}

static ncfsm_result_t wait_work(ncfsm_work *w) { return ncfsm_work_wait(w, WAIT_MS); }

/* ---- 1. group-end-without-start (R3) ------------------------------------- */
static void v_group_end_without_start(void) {
  const int v = V_GROUP_END_WITHOUT_START;
  uint64_t seq[MAXR], hash[MAXR];
  ncfsm_sim_stats st0[MAXR], st1;
  int sim[MAXR];
  for (int s = 0; s < J.nlocal; s++) {
    ncfsm_comm_position(J.comm[s], &seq[s], &hash[s]);
    sim[s] = ncfsm_sim_get_stats(J.comm[s], &st0[s]) == NCFSM_OK;
  }
  int depth0 = ncfsm_group_depth(J.loop);
  ncfsm_result_t r = ncfsm_group_end(J.loop);
  const char *msg = ncfsm_loop_last_error(J.loop);
  for (int s = 0; s < J.nlocal; s++) {
    EXPECT(v, s, depth0 == 0, "group depth was %d before the call", depth0);
    EXPECT(v, s, r == NCFSM_ERR_INVALID_USAGE, "ncfsm_group_end returned %s", ncfsm_err_name(r));
    EXPECT(v, s, strstr(msg, "R3") != NULL, "message does not name R3: %s", msg);
    EXPECT(v, s, ncfsm_group_depth(J.loop) == 0, "depth is %d after", ncfsm_group_depth(J.loop));
    EXPECT(v, s, ncfsm_comm_state(J.comm[s]) == NCFSM_STATE_READY, "comm state %s",
           ncfsm_state_name(ncfsm_comm_state(J.comm[s])));
    uint64_t seq1 = 0, hash1 = 0;
    ncfsm_comm_position(J.comm[s], &seq1, &hash1);
    EXPECT(v, s, seq1 == seq[s] && hash1 == hash[s], "sequence or fingerprint hash changed");
    note(v, s, "ncfsm_group_end at depth 0 -> %s (\"%s\")", ncfsm_err_name(r), msg);
    if (sim[s] && ncfsm_sim_get_stats(J.comm[s], &st1) == NCFSM_OK) {
      EXPECT(v, s, st1.group_ends == st0[s].group_ends && st1.ops == st0[s].ops,
             "the backend was reached");
      note(v, s, "backend not reached (sim counters)");
    }
    note(v, s, "comm READY; seq and hash unchanged");
  }
}

/* ---- 2. nested-depth-two (R3; distinct buffers because of R12) ------------- */
static void v_nested_depth_two(void) {
  const int v = V_NESTED_DEPTH_TWO;
  ncfsm_work *w[MAXR][3];
  for (int s = 0; s < J.nlocal; s++)
    for (int k = 0; k < 3; k++) fill(s, J.buf[s][k], k);
  CHECK(ncfsm_group_start(J.loop)); /* outer */
  for (int s = 0; s < J.nlocal; s++)
    CHECK(ncfsm_allreduce(J.comm[s], J.buf[s][0], J.buf[s][0], J.count, NCFSM_INT32, NCFSM_OP_SUM, NULL,
                          NULL, NULL, &w[s][0]));
  CHECK(ncfsm_group_start(J.loop)); /* inner */
  for (int s = 0; s < J.nlocal; s++)
    for (int k = 1; k < 3; k++)
      CHECK(ncfsm_allreduce(J.comm[s], J.buf[s][k], J.buf[s][k], J.count, NCFSM_INT32, NCFSM_OP_SUM,
                            NULL, NULL, NULL, &w[s][k]));
  int depth_inner = ncfsm_group_depth(J.loop);
  ncfsm_result_t r_inner = ncfsm_group_end(J.loop);
  /* The loop may turn: the inner end must still have launched nothing. */
  CHECK(ncfsm_loop_run(J.loop, NCFSM_RUN_NOWAIT));
  int depth_after = ncfsm_group_depth(J.loop);
  for (int s = 0; s < J.nlocal; s++) {
    int queued = 0;
    for (int k = 0; k < 3; k++) queued += ncfsm_work_state(w[s][k]) == NCFSM_WORK_QUEUED;
    EXPECT(v, s, depth_inner == 2 && r_inner == NCFSM_OK && depth_after == 1,
           "inner end: depth %d -> %d; returned %s", depth_inner, depth_after, ncfsm_err_name(r_inner));
    EXPECT(v, s, queued == 3, "after the inner end only %d/3 works are QUEUED", queued);
    EXPECT(v, s, ncfsm_comm_state(J.comm[s]) == NCFSM_STATE_GROUP_OPEN, "comm state %s after inner end",
           ncfsm_state_name(ncfsm_comm_state(J.comm[s])));
    note(v, s, "inner end (depth 2->1) launched nothing: %d/3 works QUEUED; comm GROUP_OPEN", queued);
  }
  ncfsm_result_t r_outer = ncfsm_group_end(J.loop);
  for (int s = 0; s < J.nlocal; s++) {
    EXPECT(v, s, r_outer == NCFSM_OK, "outer end returned %s", ncfsm_err_name(r_outer));
    uint64_t launch[3] = {0, 0, 0};
    int ok = 1;
    for (int k = 0; k < 3; k++) {
      ncfsm_result_t st = wait_work(w[s][k]);
      EXPECT(v, s, st == NCFSM_OK, "AllReduce %d ended %s", k, ncfsm_err_name(st));
      ncfsm_work_times t;
      CHECK(ncfsm_work_get_times(w[s][k], &t));
      launch[k] = t.launch_ns;
      ncfsm_work_release(w[s][k]);
      ok &= st == NCFSM_OK && check_tensor(v, s, J.comm[s], J.buf[s][k], k, 1, "nested AllReduce");
    }
    EXPECT(v, s, launch[0] && launch[0] == launch[1] && launch[1] == launch[2],
           "the three AllReduces were not one launch");
    if (ok) note(v, s, "outer end: 3 AllReduces in one launch; all %zu elements x3 correct", J.count);
  }
}

/* ---- 3. two-user-streams ---------------------------------------------------- */
static void v_two_user_streams(void) {
  const int v = V_TWO_USER_STREAMS;
  void *st[MAXR][2];
  ncfsm_work *w[MAXR][2];
  for (int s = 0; s < J.nlocal; s++) {
    for (int k = 0; k < 2; k++) {
      CHECK(ncfsm_stream_create(J.comm[s], &st[s][k]));
      fill(s, J.buf[s][k], k + 3);
    }
  }
  CHECK(ncfsm_group_start(J.loop));
  for (int s = 0; s < J.nlocal; s++)
    for (int k = 0; k < 2; k++)
      CHECK(ncfsm_allreduce(J.comm[s], J.buf[s][k], J.buf[s][k], J.count, NCFSM_INT32, NCFSM_OP_SUM,
                            st[s][k], NULL, NULL, &w[s][k]));
  ncfsm_result_t r = ncfsm_group_end(J.loop);
  for (int s = 0; s < J.nlocal; s++) {
    EXPECT(v, s, r == NCFSM_OK, "group end returned %s", ncfsm_err_name(r));
    int ok = 1;
    for (int k = 0; k < 2; k++) {
      ncfsm_result_t res = wait_work(w[s][k]);
      EXPECT(v, s, res == NCFSM_OK, "AllReduce on stream %d ended %s", k, ncfsm_err_name(res));
      ncfsm_work_release(w[s][k]);
      ok &= res == NCFSM_OK && check_tensor(v, s, J.comm[s], J.buf[s][k], k + 3, 1, "stream tensor");
    }
    for (int k = 0; k < 2; k++) CHECK(ncfsm_stream_destroy(J.comm[s], st[s][k]));
    if (ok) note(v, s, "one group; AllReduce on each of 2 user streams; both tensors correct");
  }
}

/* ---- 4. async-error-after-success (a BLOCKING comm) ----------------------- */
static ncfsm_result_t init_comms(ncfsm_comm_opts *o, ncfsm_comm **out);

static void v_async_error_after_success(void) {
  const int v = V_ASYNC_ERROR_AFTER_SUCCESS;
  ncfsm_comm_opts o = J.opts;
  o.blocking = 1;
  o.name = "group_semantics.blocking";
  ncfsm_comm *b[MAXR];
  void *bb[MAXR];
  ncfsm_work *w[MAXR];
  int i0 = nlog;
  CHECK(init_comms(&o, b));
  for (int s = 0; s < J.nlocal; s++) {
    CHECK(ncfsm_comm_wait_state(b[s], NCFSM_STATE_READY, WAIT_MS));
    CHECK(ncfsm_mem_alloc(b[s], J.count * sizeof(int32_t), &bb[s]));
    for (size_t i = 0; i < J.count; i++) host[i] = pattern(J.rank0 + s, 5, i);
    CHECK(ncfsm_memcpy(b[s], bb[s], host, J.count * sizeof *host, 1));
  }
  for (int s = 0; s < J.nlocal; s++)
    CHECK(ncfsm_allreduce(b[s], bb[s], bb[s], J.count, NCFSM_INT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w[s]));
  for (int s = 0; s < J.nlocal; s++) {
    ncfsm_result_t st = wait_work(w[s]);
    ncfsm_work_release(w[s]);
    EXPECT(v, s, st == NCFSM_OK, "AllReduce ended %s", ncfsm_err_name(st));
    int ok = st == NCFSM_OK && check_tensor(v, s, b[s], bb[s], 5, 1, "blocking AllReduce");
    ncfsm_state_t cs = ncfsm_comm_state(b[s]);
    int be = ncfsm_comm_backend_error(b[s]);
    EXPECT(v, s, cs == NCFSM_STATE_READY, "state %s after the op", ncfsm_state_name(cs));
    EXPECT(v, s, be == 0, "backend error %d", be);
    if (ok && cs == NCFSM_STATE_READY && be == 0)
      note(v, s, "blocking comm: AllReduce correct; then state READY and backend error 0");
    note(v, s, "LAUNCH_IN_PROGRESS %s on the blocking comm",
         seen(b[s], i0, NCFSM_EV_LAUNCH_PENDING) >= 0 ? "seen" : "never seen");
  }
  for (int s = 0; s < J.nlocal; s++) {
    CHECK(ncfsm_mem_free(b[s], bb[s]));
    CHECK(ncfsm_comm_finalize(b[s]));
  }
  for (int s = 0; s < J.nlocal; s++) CHECK(ncfsm_comm_wait_state(b[s], NCFSM_STATE_FINALIZED, WAIT_MS));
  for (int s = 0; s < J.nlocal; s++) {
    CHECK(ncfsm_comm_destroy(b[s]));
    CHECK(ncfsm_comm_release(b[s]));
  }
}

/* ---- 5. invalid-root-group-cleanup (R3: caught before NCCL) ---------------- */
static void v_invalid_root_group_cleanup(void) {
  const int v = V_INVALID_ROOT_GROUP_CLEANUP;
  ncfsm_work *w[MAXR];
  ncfsm_result_t rb[MAXR];
  char bmsg[MAXR][DETAIL];
  uint64_t seq[MAXR];
  ncfsm_sim_stats st0[MAXR], st1;
  int sim[MAXR];
  for (int s = 0; s < J.nlocal; s++) {
    fill(s, J.buf[s][0], 6);
    fill(s, J.buf[s][1], 7);
    ncfsm_comm_position(J.comm[s], &seq[s], NULL);
    sim[s] = ncfsm_sim_get_stats(J.comm[s], &st0[s]) == NCFSM_OK;
  }
  CHECK(ncfsm_group_start(J.loop));
  /* A valid AllReduce first: the group's failure must take it down too. */
  for (int s = 0; s < J.nlocal; s++)
    CHECK(ncfsm_allreduce(J.comm[s], J.buf[s][1], J.buf[s][1], J.count, NCFSM_INT32, NCFSM_OP_SUM, NULL,
                          NULL, NULL, &w[s]));
  for (int s = 0; s < J.nlocal; s++) {
    rb[s] = ncfsm_broadcast(J.comm[s], J.buf[s][0], J.buf[s][0], J.count, NCFSM_INT32, J.nranks, NULL,
                            NULL, NULL, NULL);
    const char *m = ncfsm_comm_last_error(J.comm[s]), *b = strstr(m, "] "); /* drop "[name rank r] " */
    snprintf(bmsg[s], sizeof bmsg[s], "%s", b ? b + 2 : m);
  }
  int depth = ncfsm_group_depth(J.loop);
  ncfsm_result_t re = ncfsm_group_end(J.loop);
  for (int s = 0; s < J.nlocal; s++) {
    EXPECT(v, s, rb[s] == NCFSM_ERR_INVALID_ARGUMENT, "Broadcast root=%d returned %s", J.nranks,
           ncfsm_err_name(rb[s]));
    EXPECT(v, s, depth == 1, "group depth %d after the failed call (the group must stay open)", depth);
    EXPECT(v, s, re == NCFSM_ERR_INVALID_ARGUMENT, "group end returned %s", ncfsm_err_name(re));
    note(v, s, "Broadcast root=%d -> %s (\"%s\"); group end -> %s", J.nranks, ncfsm_err_name(rb[s]),
         bmsg[s], ncfsm_err_name(re));
    ncfsm_result_t st = wait_work(w[s]);
    ncfsm_work_release(w[s]);
    EXPECT(v, s, st == NCFSM_ERR_GROUP, "the group's AllReduce ended %s, expected NCFSM_ERR_GROUP",
           ncfsm_err_name(st));
    int ok = check_tensor(v, s, J.comm[s], J.buf[s][1], 7, 0, "AllReduce buffer of the failed group") &&
             check_tensor(v, s, J.comm[s], J.buf[s][0], 6, 0, "Broadcast buffer");
    if (ok && st == NCFSM_ERR_GROUP) note(v, s, "the group's AllReduce failed with NCFSM_ERR_GROUP, its tensor untouched");
    uint64_t seq1 = 0;
    ncfsm_comm_position(J.comm[s], &seq1, NULL);
    EXPECT(v, s, seq1 == seq[s], "seq %" PRIu64 " -> %" PRIu64
           " (neither the rejected Broadcast nor the failed group's AllReduce was launched: no number)",
           seq[s], seq1);
    EXPECT(v, s, ncfsm_comm_state(J.comm[s]) == NCFSM_STATE_READY, "comm state %s",
           ncfsm_state_name(ncfsm_comm_state(J.comm[s])));
    if (sim[s] && ncfsm_sim_get_stats(J.comm[s], &st1) == NCFSM_OK) {
      EXPECT(v, s, st1.ops == st0[s].ops && st1.group_ends == st0[s].group_ends && st1.rejected == st0[s].rejected,
             "the backend was reached (ops %" PRIu64 "->%" PRIu64 ")", st0[s].ops, st1.ops);
      note(v, s, "NCCL never reached (sim counters unchanged)");
    }
  }
}

/* ---- 6. valid-op-after-group-error (same NONBLOCKING comm) ------------------ */
static void v_valid_op_after_group_error(void) {
  const int v = V_VALID_OP_AFTER_GROUP_ERROR;
  ncfsm_work *w[MAXR];
  for (int s = 0; s < J.nlocal; s++) fill(s, J.buf[s][0], 8);
  for (int s = 0; s < J.nlocal; s++) /* ungrouped: the loop puts one turn's ops in one NCCL group */
    CHECK(ncfsm_allreduce(J.comm[s], J.buf[s][0], J.buf[s][0], J.count, NCFSM_INT32, NCFSM_OP_SUM, NULL,
                          NULL, NULL, &w[s]));
  for (int s = 0; s < J.nlocal; s++) {
    ncfsm_result_t st = wait_work(w[s]);
    ncfsm_work_release(w[s]);
    EXPECT(v, s, st == NCFSM_OK, "AllReduce ended %s", ncfsm_err_name(st));
    int ok = st == NCFSM_OK && check_tensor(v, s, J.comm[s], J.buf[s][0], 8, 1, "AllReduce after the error");
    ncfsm_state_t cs = ncfsm_comm_state(J.comm[s]);
    int be = ncfsm_comm_backend_error(J.comm[s]);
    EXPECT(v, s, cs == NCFSM_STATE_READY && be == 0, "state %s, backend error %d", ncfsm_state_name(cs), be);
    if (ok) note(v, s, "nonblocking comm still healthy: AllReduce correct (raw NCCL 2.28 is poisoned here, R3)");
  }
}

/* ---- 7. nonblocking-init-poll (R1), observed while creating the comms ------- */
static void v_nonblocking_init_poll(int i0, uint64_t t_call) {
  const int v = V_NONBLOCKING_INIT_POLL;
  for (int s = 0; s < J.nlocal; s++) {
    /* one process: INIT with the id; under a launcher: INIT_BOOT, the id's
     * broadcast (ID_QUEUED, ID_EXCHANGE), then INIT_QUEUED */
    int q = J.mpi ? seen(J.comm[s], i0, NCFSM_EV_INIT_BOOT) : seen(J.comm[s], i0, NCFSM_EV_INIT);
    if (J.mpi) {
      EXPECT(v, s, q >= 0 && tlog[q].next == NCFSM_STATE_ID_QUEUED, "ID_QUEUED not observed");
      q = q < 0 ? -1 : seen(J.comm[s], q, NCFSM_EV_ID_KNOWN);
    }
    int a = q < 0 ? -1 : seen(J.comm[s], q, NCFSM_EV_INIT_ISSUED);
    int b = a < 0 ? -1 : seen(J.comm[s], a, NCFSM_EV_INIT_DONE);
    EXPECT(v, s, q >= 0 && tlog[q].next == NCFSM_STATE_INIT_QUEUED, "INIT_QUEUED not observed");
    EXPECT(v, s, a >= 0 && tlog[a].next == NCFSM_STATE_INIT_IN_PROGRESS, "INIT_IN_PROGRESS not observed");
    EXPECT(v, s, b >= 0 && tlog[b].next == NCFSM_STATE_READY, "READY not reached from INIT_IN_PROGRESS");
    EXPECT(v, s, ncfsm_comm_state(J.comm[s]) == NCFSM_STATE_READY, "state %s",
           ncfsm_state_name(ncfsm_comm_state(J.comm[s])));
    if (a >= 0 && b >= 0)
      note(v, s, "NEW->%sINIT_QUEUED->INIT_IN_PROGRESS->READY; %.3f ms in progress (%.3f ms from the init call)%s",
           J.mpi ? "ID_QUEUED->ID_EXCHANGE->" : "", (double)(tlog[b].t - tlog[a].t) / 1e6, (double)(tlog[b].t - t_call) / 1e6,
           J.mpi ? "; includes the unique-id exchange" : "");
    ncfsm_sim_stats st;
    if (ncfsm_sim_get_stats(J.comm[s], &st) == NCFSM_OK)
      note(v, s, "%" PRIu64 " async-state polls (sim)", st.polls);
  }
}

/* ---- 8. nonblocking-group-poll (R1/R2) ----------------------------------- */
static void v_nonblocking_group_poll(void) {
  const int v = V_NONBLOCKING_GROUP_POLL;
  ncfsm_work *w[MAXR];
  for (int s = 0; s < J.nlocal; s++) fill(s, J.buf[s][2], 9);
  int i0 = nlog;
  CHECK(ncfsm_group_start(J.loop));
  for (int s = 0; s < J.nlocal; s++)
    CHECK(ncfsm_allreduce(J.comm[s], J.buf[s][2], J.buf[s][2], J.count, NCFSM_INT32, NCFSM_OP_SUM, NULL,
                          NULL, NULL, &w[s]));
  CHECK(ncfsm_group_end(J.loop));
  for (int s = 0; s < J.nlocal; s++) {
    ncfsm_result_t st = wait_work(w[s]);
    ncfsm_work_times t;
    CHECK(ncfsm_work_get_times(w[s], &t));
    ncfsm_work_release(w[s]);
    EXPECT(v, s, st == NCFSM_OK, "AllReduce ended %s", ncfsm_err_name(st));
    int ok = st == NCFSM_OK && check_tensor(v, s, J.comm[s], J.buf[s][2], 9, 1, "AllReduce");
    int a = seen(J.comm[s], i0, NCFSM_EV_LAUNCH_PENDING), b = seen(J.comm[s], i0, NCFSM_EV_LAUNCH_FINAL);
    EXPECT(v, s, b >= 0, "LAUNCH_FINAL not observed");
    if (a >= 0) {
      EXPECT(v, s, tlog[a].next == NCFSM_STATE_LAUNCH_IN_PROGRESS && b > a && tlog[b].state == NCFSM_STATE_LAUNCH_IN_PROGRESS &&
                       tlog[b].next == NCFSM_STATE_READY,
             "transitions out of order");
      note(v, s, "group end in progress: READY->LAUNCH_IN_PROGRESS->READY observed, %.1f us in progress",
           b > a ? (double)(tlog[b].t - tlog[a].t) / 1e3 : -1.0);
    } else if (b >= 0) {
      note(v, s, "group end returned success directly: LAUNCH_IN_PROGRESS not observed");
    }
    EXPECT(v, s, ncfsm_comm_state(J.comm[s]) == NCFSM_STATE_READY, "state %s",
           ncfsm_state_name(ncfsm_comm_state(J.comm[s])));
    if (ok) note(v, s, "submit->final %.1f us; data correct", (double)(t.final_ns - t.submit_ns) / 1e3);
  }
}

/* ---- 9. nonblocking-finalize-poll (R4) ------------------------------------- */
static void v_nonblocking_finalize_poll(void) {
  const int v = V_NONBLOCKING_FINALIZE_POLL;
  int i0 = nlog;
  ncfsm_result_t rf[MAXR], rw[MAXR];
  for (int s = 0; s < J.nlocal; s++) rf[s] = ncfsm_comm_finalize(J.comm[s]);
  for (int s = 0; s < J.nlocal; s++) rw[s] = ncfsm_comm_wait_state(J.comm[s], NCFSM_STATE_FINALIZED, WAIT_MS);
  for (int s = 0; s < J.nlocal; s++) {
    EXPECT(v, s, rf[s] == NCFSM_OK && rw[s] == NCFSM_OK, "finalize %s, wait FINALIZED %s (%s)",
           ncfsm_err_name(rf[s]), ncfsm_err_name(rw[s]), ncfsm_comm_last_error(J.comm[s]));
    int d = seen(J.comm[s], i0, NCFSM_EV_FINALIZE);
    int a = seen(J.comm[s], i0, NCFSM_EV_FINALIZE_ISSUED), b = seen(J.comm[s], i0, NCFSM_EV_FINALIZE_DONE);
    EXPECT(v, s, d >= 0 && tlog[d].next == NCFSM_STATE_DRAINING, "DRAINING not observed");
    EXPECT(v, s, a > d && tlog[a].next == NCFSM_STATE_FINALIZING, "FINALIZING not observed");
    EXPECT(v, s, b > a && tlog[b].next == NCFSM_STATE_FINALIZED, "FINALIZED not reached from FINALIZING");
    if (a >= 0 && b > a)
      note(v, s, "READY->DRAINING->FINALIZING->FINALIZED; %.3f ms in progress", (double)(tlog[b].t - tlog[a].t) / 1e6);
    ncfsm_sim_stats st;
    if (ncfsm_sim_get_stats(J.comm[s], &st) == NCFSM_OK)
      note(v, s, "%" PRIu64 " finalize call(s) reached the sim", st.finalizes);
  }
  for (int s = 0; s < J.nlocal; s++) {
    ncfsm_result_t r = ncfsm_comm_destroy(J.comm[s]);
    EXPECT(v, s, r == NCFSM_OK && ncfsm_comm_state(J.comm[s]) == NCFSM_STATE_CLOSED, "destroy %s",
           ncfsm_err_name(r));
    CHECK(ncfsm_comm_release(J.comm[s]));
  }
}

/* ---- set-up ---------------------------------------------------------------- */
static ncfsm_result_t init_comms(ncfsm_comm_opts *o, ncfsm_comm **out) {
  if (!J.mpi) {
    int devices[MAXR];
    for (int s = 0; s < J.nlocal; s++) devices[s] = s;
    return ncfsm_comm_init_all(J.loop, J.nlocal, o, devices, out);
  }
  o->device = ncfsm_boot_local_rank(J.boot);
  ncfsm_result_t r = ncfsm_comm_new(J.loop, o, &out[0]);
  if (r == NCFSM_OK) r = ncfsm_comm_init_boot(out[0], J.boot);
  return r;
}

static void usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [--ranks N] [--count ELEMENTS] [--csv FILE] [--require-gpu]\n"
          "  under mpirun, srun --mpi=pmix or with NCFSM_STORE_ADDR (NCFSM_BOOTSTRAP=auto): one rank\n"
          "  per process, device = local rank\n"
          "  alone, or with --ranks: one thread drives N ranks (default 4 on the sim,\n"
          "  one per GPU on nccl) through ncfsm_comm_init_all\n"
          "  --require-gpu: use nccl; exit 77 (skip) when no GPU is visible\n",
          argv0);
  exit(2);
}

static void csv_field(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"') fputc('"', f);
    fputc(*s == '\n' ? ' ' : *s, f);
  }
  fputc('"', f);
}

int main(int argc, char **argv) {
  int ranks_opt = 0, require_gpu = 0;
  const char *csv = NULL;
  J.count = 1u << 18;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--ranks") && i + 1 < argc) ranks_opt = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--count") && i + 1 < argc) J.count = (size_t)strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
    else if (!strcmp(argv[i], "--require-gpu")) require_gpu = 1;
    else usage(argv[0]);
  }
  if (J.count == 0 || ranks_opt < 0 || ranks_opt > MAXR) usage(argv[0]);
  CHECK(ncfsm_comm_opts_init(&J.opts));
  J.opts.name = "group_semantics";
  J.opts.timeout_ms = WAIT_MS;
  J.opts.on_error = NCFSM_ON_ERROR_STAY; /* keep a failed comm for the report */
  char why[256] = "";
  if (require_gpu) J.opts.backend = NCFSM_BACKEND_NCCL;
  int have_be = ncfsm_backend_query(J.opts.backend, &J.bi) == NCFSM_OK;
  snprintf(why, sizeof why, "%s", J.bi.why);
  int ngpu = have_be && J.bi.kind == NCFSM_BACKEND_NCCL ? J.bi.device_count : 0;
  if (require_gpu && ngpu <= 0) {
    printf("SKIP: --require-gpu and no GPU is visible (%s)\n", why[0] ? why : "0 CUDA devices");
    return 77;
  }
  if (!have_be) {
    fprintf(stderr, "no backend: %s\n", why);
    return 1;
  }
  snprintf(J.backend, sizeof J.backend, "%s", J.bi.name);
  int ver = J.bi.nccl_version;
  snprintf(J.nccl_version, sizeof J.nccl_version, "%d.%d.%d%s", ver / 10000, ver / 100 % 100, ver % 100,
           J.bi.kind == NCFSM_BACKEND_SIM ? " (modelled)" : "");

  CHECK(ncfsm_loop_new(NULL, &J.loop));
  ncfsm_loop_set_trace(J.loop, trace, NULL);
  /* One rank per process, or one process for every rank (--ranks, or alone): the
   * bootstrap's settings decide (NCFSM_BOOTSTRAP, docs/settings.md; examples/launch.h). */
  if (!ranks_opt) {
    ncfsm_boot_opts bo;
    ncfsm_boot_opts_init(&bo);
    if ((J.mpi = ex_launch(ncfsm_loop_base(J.loop), &bo, &J.boot, "02_group_semantics")) < 0) {
      ncfsm_loop_close(J.loop);
      return 1;
    }
  }
  if (J.mpi) {
    J.nranks = ncfsm_boot_size(J.boot);
    J.rank0 = ncfsm_boot_rank(J.boot);
    J.nlocal = 1;
    if (ngpu > 0 && ncfsm_boot_local_rank(J.boot) >= ngpu) {
      fprintf(stderr, "rank %d: local rank %d but only %d GPU(s) visible\n", J.rank0,
              ncfsm_boot_local_rank(J.boot), ngpu);
      return 1;
    }
  } else {
    J.nranks = J.nlocal = ranks_opt ? ranks_opt : ngpu > 0 ? (ngpu < MAXR ? ngpu : MAXR) : 4;
    if (ngpu > 0 && J.nlocal > ngpu) {
      fprintf(stderr, "--ranks %d in one process needs %d GPUs; %d visible\n", J.nlocal, J.nlocal, ngpu);
      return 1;
    }
  }
  if (!(host = malloc(J.count * sizeof *host))) return 1;
  for (int v = 0; v < NV; v++)
    for (int s = 0; s < J.nlocal; s++) J.rows[v][s].pass = -1;

  /* Nonblocking communicators (default opts.blocking = 0): variant 7 watches the init. */
  int i0 = nlog;
  uint64_t t_call = now_ns();
  CHECK(init_comms(&J.opts, J.comm));
  for (int s = 0; s < J.nlocal; s++) {
    ncfsm_result_t r = ncfsm_comm_wait_state(J.comm[s], NCFSM_STATE_READY, WAIT_MS);
    if (r != NCFSM_OK) {
      fprintf(stderr, "rank %d: init did not reach READY: %s (%s)\n", J.rank0 + s, ncfsm_err_name(r),
              ncfsm_comm_last_error(J.comm[s]));
      return 1;
    }
  }
  v_nonblocking_init_poll(i0, t_call);
  for (int s = 0; s < J.nlocal; s++)
    for (int k = 0; k < 3; k++) CHECK(ncfsm_mem_alloc(J.comm[s], J.count * sizeof(int32_t), &J.buf[s][k]));

  v_group_end_without_start();
  v_nested_depth_two();
  v_two_user_streams();
  v_invalid_root_group_cleanup();
  v_valid_op_after_group_error();
  v_nonblocking_group_poll();
  v_async_error_after_success();
  for (int s = 0; s < J.nlocal; s++)
    for (int k = 0; k < 3; k++) CHECK(ncfsm_mem_free(J.comm[s], J.buf[s][k]));
  v_nonblocking_finalize_poll();

  /* Gather every rank's rows (mpirun mode: through the bootstrap). */
  size_t mine = sizeof(row) * NV * (size_t)J.nlocal;
  row *all = calloc((size_t)J.nranks, sizeof(row) * NV);
  row *local = malloc(mine);
  if (!all || !local) return 1;
  for (int s = 0; s < J.nlocal; s++)
    for (int v = 0; v < NV; v++) local[s * NV + v] = J.rows[v][s];
  if (J.mpi) {
    CHECK(ncfsm_boot_allgather(J.boot, local, all, mine));
    CHECK(ncfsm_boot_close(J.boot));
  } else {
    memcpy(all, local, mine);
  }
  CHECK(ncfsm_loop_close(J.loop));

  int npass = 0, nrows = NV * J.nranks;
  for (int r = 0; r < J.nranks; r++)
    for (int v = 0; v < NV; v++) npass += all[r * NV + v].pass == 1;
  if (J.rank0 == 0) {
    FILE *out[2] = {stdout, csv ? fopen(csv, "w") : NULL};
    if (csv && !out[1]) perror(csv);
    for (int f = 0; f < 2; f++) {
      if (!out[f]) continue;
      fprintf(out[f], "variant,rank,nranks,backend,nccl_version,mode,result,detail\n");
      for (int v = 0; v < NV; v++)
        for (int r = 0; r < J.nranks; r++) {
          const row *x = &all[r * NV + v];
          fprintf(out[f], "%s,%d,%d,%s,%s,%s,%s,", vname[v], r, J.nranks, J.backend, J.nccl_version,
                  J.mpi ? "mpirun" : "one-process", x->pass == 1 ? "PASS" : "FAIL");
          csv_field(out[f], x->pass < 0 ? "not run" : x->detail);
          fputc('\n', out[f]);
        }
    }
    if (out[1]) fclose(out[1]);
    printf("\nA row is PASS when its rank's full-tensor check, return codes and states all held.\n");
    printf("%-28s %9s  %-6s %s\n", "variant", "rank rows", "result", "a PASS shows");
    for (int v = 0; v < NV; v++) {
      int p = 0;
      for (int r = 0; r < J.nranks; r++) p += all[r * NV + v].pass == 1;
      printf("%-28s %9d  %-6s %s\n", vname[v], J.nranks, p == J.nranks ? "PASS" : "FAIL", vshows[v]);
    }
    printf("%d/%d PASS (%s, NCCL %s, %d ranks, %s%s)\n", npass, nrows, J.backend, J.nccl_version, J.nranks,
           J.mpi ? "one rank per process" : "one process",
           J.bi.kind == NCFSM_BACKEND_SIM ? "; sim: a model of NCCL 2.28, not NCCL" : "");
  }
  if (nlog_dropped) fprintf(stderr, "trace log full: %d records dropped\n", nlog_dropped);
  free(all);
  free(local);
  free(host);
  return npass == nrows ? 0 : 1;
}
