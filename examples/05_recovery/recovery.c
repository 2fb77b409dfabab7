/*
 * 05_recovery: a training-like loop of AllReduces that survives a rank's
 * SIGKILL without restarting (issue 10; docs/recovery.md).
 *
 *   examples/05_recovery/run_recovery.sh N OUTDIR [options]     the launcher (TCP store, N processes)
 *   05_recovery --iters I --victim R --kill-at K --kill-point P --out DIR [--require-gpu]
 *
 * One rank per process; the ranks meet through a standalone TCP store
 * (NCFSM_STORE_ADDR, NCFSM_RANK, NCFSM_WORLD_SIZE): a store hosted by a rank
 * would die with it. Every iteration i, each member contributes
 * value(original rank, i) to an AllReduce SUM and checks the result against
 * the sum over the current members. Rank R (the victim) kills itself with
 * SIGKILL at iteration K, at one point of the iteration:
 *
 *   before   before it submits iteration K (the others' AllReduce waits for it)
 *   inflight after it submitted iteration K, before it completes
 *   after    after iteration K completed on every rank (the next one waits)
 *   init     during the comm's init, once the unique id is exchanged (--kill-at is
 *            ignored: the others' init never completes)
 *
 * The survivors' comm is armed with ncfsm_comm_set_recovery and the error
 * policy NCFSM_ON_ERROR_SHRINK: the dead rank is seen (the bootstrap reports
 * the lost connection, or NCCL/the sim fails the AllReduce, or the watchdog),
 * the survivors revoke the comm where the runtime can, agree on who is alive,
 * shrink to themselves (or re-initialise), and go on with the iteration that
 * failed, on the new comm. Each survivor writes DIR/rank<r>.json: how the
 * comm was replaced, and the times from the kill (the victim's
 * CLOCK_REALTIME stamp in DIR/kill.txt) to detection, to the new comm READY
 * and to the first correct AllReduce on it. Exit 0 when every iteration of
 * this rank gave the right sum.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "ncfsm.h"
#include "ncfsm/bootstrap.h"

#define N_ELEM 1024

static double mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double real_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void die(const char *what, ncfsm_result_t r) {
  fprintf(stderr, "05_recovery: %s: %s\n", what, ncfsm_err_name(r));
  exit(1);
}

/* What original rank r contributes at iteration i (exact in float32). */
static float value(int r, int i) { return (float)((r + 1) * 1000 + i % 97); }

typedef struct state {
  ncfsm_loop *loop;
  ncfsm_comm *comm;
  ncfsm_boot *boot;        /* the current comm's bootstrap (the survivors' after a recovery) */
  int orig_rank, world;
  bool member[256];        /* original ranks still in the job */
  int recoveries;
  /* the last recovery */
  ncfsm_result_t rec_status;
  char how[16], why[384];
  int excluded[256], nexcluded;
  double t_fail_mono, t_ready_mono;
  double agreed_ms, ready_ms;
  ncfsm_comm *old;
} state;

static state S;

static void on_recovered(const ncfsm_recovery_report *r, void *arg) {
  state *s = arg;
  s->rec_status = r->status;
  snprintf(s->how, sizeof s->how, "%s", r->how);
  snprintf(s->why, sizeof s->why, "%s", r->why);
  s->old = r->old;
  s->agreed_ms = r->detect_to_agreed_ms;
  s->ready_ms = r->detect_to_ready_ms;
  s->t_fail_mono = (double)r->t_fail_ns / 1e6;
  s->t_ready_mono = mono_ms();
  /* the excluded ranks are ranks of the old comm: map them to original ranks */
  int idx = 0, map[256];
  for (int o = 0; o < s->world; o++)
    if (s->member[o]) map[idx++] = o;
  s->nexcluded = r->nexcluded;
  for (int k = 0; k < r->nexcluded; k++) {
    s->excluded[k] = map[r->excluded[k]];
    s->member[s->excluded[k]] = false;
  }
  if (r->status == NCFSM_OK) {
    s->comm = r->fresh;
    s->boot = r->boot;
  }
  s->recoveries++;
}

static float expected(const state *s, int i) {
  float sum = 0;
  for (int o = 0; o < s->world; o++)
    if (s->member[o]) sum += value(o, i);
  return sum;
}

/* --report: the survivors' records as a table; --check: every survivor
 * finished with the right sums after one recovery, the victim died by
 * SIGKILL (exit 137 from the launcher's view). */
static int report(const char *dir, int np, int victim, const char *exits, bool check) {
  int fail = 0, rc[256];
  const char *p = exits;
  for (int r = 0; r < np && r < 256; r++) {
    char *end;
    rc[r] = p ? (int)strtol(p, &end, 10) : -1;
    p = p && end != p ? end : NULL;
  }
  printf("| rank | exit | recovered by | kill -> detected (ms) | kill -> new comm READY (ms) | kill -> first correct "
         "AllReduce (ms) | detected -> agreed (ms) | final size | wrong results |\n");
  printf("|---|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (int r = 0; r < np && r < 256; r++) {
    if (r == victim) {
      printf("| %d | %d (victim, SIGKILL) | | | | | | | |\n", r, rc[r]);
      if (rc[r] != 137) printf("CHECK: the victim rank %d exited %d, want 137 (SIGKILL)\n", r, rc[r]), fail = 1;
      continue;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.json", dir, r);
    json_t *j = json_load_file(path, 0, NULL);
    if (!j) {
      printf("| %d | %d | (no record) | | | | | | |\n", r, rc[r]);
      fail = 1;
      continue;
    }
    char v[6][32];
    const char *keys[6] = {"kill_to_detect_ms", "kill_to_ready_ms", "kill_to_first_ok_ms", "detect_to_agreed_ms",
                           "final_size", "wrong_results"};
    for (int k = 0; k < 6; k++) {
      json_t *x = json_object_get(j, keys[k]);
      if (json_is_real(x)) snprintf(v[k], sizeof v[k], "%.1f", json_real_value(x));
      else if (json_is_integer(x)) snprintf(v[k], sizeof v[k], "%lld", (long long)json_integer_value(x));
      else snprintf(v[k], sizeof v[k], "-");
    }
    printf("| %d | %d | %s | %s | %s | %s | %s | %s | %s |\n", r, rc[r],
           json_string_value(json_object_get(j, "how")) ? json_string_value(json_object_get(j, "how")) : "?", v[0], v[1],
           v[2], v[3], v[4], v[5]);
    if (rc[r] != 0 || json_integer_value(json_object_get(j, "wrong_results")) != 0 ||
        json_integer_value(json_object_get(j, "recoveries")) != 1 ||
        json_integer_value(json_object_get(j, "final_size")) != np - 1) {
      printf("CHECK: rank %d: exit %d, %lld wrong, %lld recoveries, final size %lld (want 0, 0, 1, %d)\n", r, rc[r],
             (long long)json_integer_value(json_object_get(j, "wrong_results")),
             (long long)json_integer_value(json_object_get(j, "recoveries")),
             (long long)json_integer_value(json_object_get(j, "final_size")), np - 1);
      fail = 1;
    }
    json_decref(j);
  }
  if (check) printf("%s\n", fail ? "CHECK FAILED" : "CHECK PASS");
  return check && fail ? 1 : 0;
}

/* The application's commit point, after every recovery: the survivors may
 * have seen different last iterations (the dead rank may have finished one
 * with some of them only; some may still have been in the init), so they
 * agree over the survivors' bootstrap to go on from the earliest iteration
 * any of them did not see complete. */
static int agree_step(int mine) {
  int32_t me = mine, all[256];
  ncfsm_result_t r = ncfsm_boot_allgather(S.boot, &me, all, sizeof me);
  if (r != NCFSM_OK) die("the survivors' step agreement", r);
  int from = mine;
  for (int k = 0; k < ncfsm_boot_size(S.boot); k++)
    if (all[k] < from) from = all[k];
  if (from != mine)
    printf("rank %d: the survivors go on from iteration %d (this rank stopped at %d)\n", S.orig_rank, from, mine);
  return from;
}

int main(int argc, char **argv) {
  int iters = 40, victim = -1, kill_at = -1, np = 0;
  const char *report_dir = NULL, *exits = NULL;
  bool check = false;
  const char *kill_point = "inflight", *out = NULL;
  bool require_gpu = false;
  uint64_t deadline_ms = 5000;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--victim") && i + 1 < argc) victim = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--kill-at") && i + 1 < argc) kill_at = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--kill-point") && i + 1 < argc) kill_point = argv[++i];
    else if (!strcmp(argv[i], "--deadline-ms") && i + 1 < argc) deadline_ms = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
    else if (!strcmp(argv[i], "--require-gpu")) require_gpu = true;
    else if (!strcmp(argv[i], "--report") && i + 1 < argc) report_dir = argv[++i];
    else if (!strcmp(argv[i], "--np") && i + 1 < argc) np = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--exits") && i + 1 < argc) exits = argv[++i];
    else if (!strcmp(argv[i], "--check")) check = true;
    else {
      fprintf(stderr, "usage: %s --iters I --victim R --kill-at K --kill-point before|inflight|after --out DIR "
                      "[--deadline-ms MS] [--require-gpu]\n", argv[0]);
      return 2;
    }
  }
  if (report_dir) return report(report_dir, np, victim, exits, check);
  if (!out || iters < 1 ||
      (strcmp(kill_point, "init") && strcmp(kill_point, "before") && strcmp(kill_point, "inflight") &&
       strcmp(kill_point, "after"))) {
    fprintf(stderr, "05_recovery: --out is required; --kill-point is init, before, inflight or after\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  ncfsm_backend_info bi;
  ncfsm_backend_kind_t bk = require_gpu ? NCFSM_BACKEND_NCCL : NCFSM_BACKEND_AUTO;
  if (ncfsm_backend_query(bk, &bi) != NCFSM_OK || (require_gpu && bi.device_count <= 0)) {
    printf("SKIP: no GPU (%s)\n", bi.why);
    return require_gpu ? 77 : 1;
  }
  ncfsm_result_t r;
  if ((r = ncfsm_loop_new(NULL, &S.loop)) != NCFSM_OK) die("loop", r);
  ncfsm_boot_opts bo;
  ncfsm_boot_opts_init(&bo);
  if (ncfsm_boot_open(ncfsm_loop_base(S.loop), &bo, &S.boot) != NCFSM_OK) {
    fprintf(stderr, "05_recovery: bootstrap: %s (a standalone TCP store: run_recovery.sh)\n", ncfsm_boot_open_error());
    return 1;
  }
  ncfsm_boot *first_boot = S.boot; /* a survivors' bootstrap shares its connection: closed last */
  S.orig_rank = ncfsm_boot_rank(S.boot);
  S.world = ncfsm_boot_size(S.boot);
  if (S.world > 256) die("more than 256 ranks", NCFSM_ERR_INVALID_ARGUMENT);
  for (int o = 0; o < S.world; o++) S.member[o] = true;

  ncfsm_comm_opts o;
  if ((r = ncfsm_comm_opts_init(&o)) != NCFSM_OK) die(ncfsm_opts_error(), r); /* a refused NCFSM_* value */
  o.backend = bk;
  o.name = "train";
  o.device = bi.kind == NCFSM_BACKEND_NCCL ? ncfsm_boot_local_rank(S.boot) % bi.device_count : 0;
  o.timeout_ms = deadline_ms;            /* the watchdog: the last resort */
  o.on_error = NCFSM_ON_ERROR_SHRINK;    /* a failure starts the armed recovery */
  o.dump_dir = "";
  if ((r = ncfsm_comm_new(S.loop, &o, &S.comm)) != NCFSM_OK) die("comm_new", r);
  if ((r = ncfsm_comm_init_boot(S.comm, S.boot)) != NCFSM_OK) die("init_boot", r);
  /* armed before the init is done: a rank lost during it is recovered too */
  ncfsm_recovery_opts ro = {S.boot, &o, on_recovered, &S};
  if ((r = ncfsm_comm_set_recovery(S.comm, &ro)) != NCFSM_OK) die("set_recovery", r);
  if (S.orig_rank == victim && !strcmp(kill_point, "init")) {
    /* once the unique id is exchanged (so the store knows this rank), while NCCL's init waits for it */
    double until = mono_ms() + 30000;
    for (ncfsm_state_t st; (st = ncfsm_comm_state(S.comm)) == NCFSM_STATE_ID_QUEUED || st == NCFSM_STATE_ID_EXCHANGE ||
                           st == NCFSM_STATE_INIT_QUEUED;)
      if (mono_ms() < until) ncfsm_loop_run(S.loop, NCFSM_RUN_NOWAIT);
      else break;
    kill_at = 0;
    goto kill_me;
  }
  if (ncfsm_comm_wait_state(S.comm, NCFSM_STATE_READY, 60000) != NCFSM_OK) {
    /* the init failed (a rank died during it): the recovery replaces the comm */
    double until = mono_ms() + 60000;
    while (S.recoveries == 0 && mono_ms() < until) ncfsm_loop_run(S.loop, NCFSM_RUN_ONCE);
    if (S.recoveries == 0 || S.rec_status != NCFSM_OK) {
      fprintf(stderr, "rank %d: the init failed and no recovery replaced the comm: %s\n", S.orig_rank,
              S.recoveries ? S.why : ncfsm_comm_failure(S.comm));
      return 1;
    }
    printf("rank %d: the init failed; recovered by %s; the new comm has %d rank(s)\n", S.orig_rank, S.how,
           ncfsm_comm_size(S.comm));
    ncfsm_comm_release(S.old);
    agree_step(0); /* the others may have failed at iteration 0 instead: they take part too */
  }

  float host[N_ELEM];
  void *buf = NULL;
  ncfsm_comm *buf_comm = S.comm;
  if ((r = ncfsm_mem_alloc(S.comm, sizeof host, &buf)) != NCFSM_OK) die("mem_alloc", r);
  char path[4096];
  double kill_real = 0, first_ok_after_mono = 0;
  int bad = 0, retries = 0;
  for (int i = 0; i < iters; i++) {
    bool me_victim = S.orig_rank == victim && i == kill_at;
    if (me_victim && !strcmp(kill_point, "before")) goto kill_me;
    for (int k = 0; k < N_ELEM; k++) host[k] = value(S.orig_rank, i);
    if ((r = ncfsm_memcpy(buf_comm, buf, host, sizeof host, 1)) != NCFSM_OK) die("memcpy", r);
    int seen = S.recoveries;
    ncfsm_work *w = NULL;
    r = ncfsm_allreduce(S.comm, buf, buf, N_ELEM, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, &w);
    if (me_victim && !strcmp(kill_point, "inflight")) goto kill_me;
    ncfsm_result_t st = r == NCFSM_OK ? ncfsm_work_wait(w, 0) : r;
    if (w) ncfsm_work_release(w);
    if (st == NCFSM_OK) {
      if ((r = ncfsm_memcpy(buf_comm, host, buf, sizeof host, 0)) != NCFSM_OK) die("memcpy", r);
      if (host[0] != expected(&S, i) || host[N_ELEM - 1] != expected(&S, i)) {
        fprintf(stderr, "rank %d: iteration %d: %g, want %g\n", S.orig_rank, i, (double)host[0], (double)expected(&S, i));
        bad++;
      } else if (S.recoveries && !first_ok_after_mono) {
        first_ok_after_mono = mono_ms();
      }
      if (me_victim && !strcmp(kill_point, "after")) goto kill_me;
      continue;
    }
    /* the iteration failed: wait for the recovery (it runs on this loop), then redo it */
    if (++retries > 3) die("too many failed iterations", st);
    double until = mono_ms() + 60000;
    while (S.recoveries == seen && mono_ms() < until) ncfsm_loop_run(S.loop, NCFSM_RUN_ONCE);
    if (S.recoveries == seen || S.rec_status != NCFSM_OK) {
      fprintf(stderr, "rank %d: recovery %s: %s\n", S.orig_rank, S.recoveries == seen ? "did not end" : "failed", S.why);
      return 1;
    }
    printf("rank %d: iteration %d failed (%s); recovered by %s without rank(s)", S.orig_rank, i, ncfsm_err_name(st), S.how);
    for (int k = 0; k < S.nexcluded; k++) printf(" %d", S.excluded[k]);
    printf("; the new comm has %d rank(s), this is rank %d\n", ncfsm_comm_size(S.comm), ncfsm_comm_rank(S.comm));
    /* the old comm's buffer goes with it; a new one on the new comm */
    ncfsm_mem_free(buf_comm, buf);
    ncfsm_comm_release(S.old);
    buf_comm = S.comm;
    if ((r = ncfsm_mem_alloc(S.comm, sizeof host, &buf)) != NCFSM_OK) die("mem_alloc", r);
    i = agree_step(i) - 1; /* redo it (the loop's i++) */
  }
  /* the report */
  snprintf(path, sizeof path, "%s/kill.txt", out);
  FILE *kf = fopen(path, "r");
  if (kf) {
    if (fscanf(kf, "%lf", &kill_real) != 1) kill_real = 0;
    fclose(kf);
  }
  double offset = real_ms() - mono_ms(); /* CLOCK_REALTIME - CLOCK_MONOTONIC, for the kill stamp */
  double k_mono = kill_real ? kill_real - offset : 0;
  json_t *j = json_pack("{s:i, s:i, s:i, s:s, s:i, s:s, s:s}", "rank", S.orig_rank, "world", S.world, "iterations",
                        iters, "backend", bi.name, "recoveries", S.recoveries, "how", S.recoveries ? S.how : "-",
                        "kill_point", kill_point);
  json_object_set_new(j, "wrong_results", json_integer(bad));
  json_object_set_new(j, "final_size", json_integer(ncfsm_comm_size(S.comm)));
  json_object_set_new(j, "kill_to_detect_ms", S.recoveries && k_mono ? json_real(S.t_fail_mono - k_mono) : json_null());
  json_object_set_new(j, "kill_to_ready_ms", S.recoveries && k_mono ? json_real(S.t_ready_mono - k_mono) : json_null());
  json_object_set_new(j, "kill_to_first_ok_ms",
                      first_ok_after_mono && k_mono ? json_real(first_ok_after_mono - k_mono) : json_null());
  json_object_set_new(j, "detect_to_agreed_ms", S.recoveries ? json_real(S.agreed_ms) : json_null());
  json_object_set_new(j, "detect_to_ready_ms", S.recoveries ? json_real(S.ready_ms) : json_null());
  json_object_set_new(j, "why", json_string(S.why));
  snprintf(path, sizeof path, "%s/rank%d.json", out, S.orig_rank);
  json_dump_file(j, path, JSON_INDENT(1));
  json_decref(j);
  ncfsm_mem_free(buf_comm, buf);
  int final_size = ncfsm_comm_size(S.comm);
  /* the job ends: the other ranks close their bootstraps one by one, which
   * must not start a recovery now: every rank disarms, then a barrier */
  ncfsm_comm_set_recovery(S.comm, NULL);
  if ((r = ncfsm_boot_allgather(S.boot, NULL, NULL, 0)) != NCFSM_OK)
    fprintf(stderr, "rank %d: the closing barrier failed: %s\n", S.orig_rank, ncfsm_boot_last_error(S.boot));
  if (ncfsm_comm_state(S.comm) == NCFSM_STATE_READY && ncfsm_comm_finalize(S.comm) == NCFSM_OK &&
      ncfsm_comm_wait_state(S.comm, NCFSM_STATE_FINALIZED, 30000) == NCFSM_OK)
    ncfsm_comm_destroy(S.comm);
  else
    ncfsm_comm_abort(S.comm);
  ncfsm_comm_release(S.comm);
  if (S.boot != first_boot) ncfsm_boot_close(S.boot);
  ncfsm_boot_close(first_boot);
  ncfsm_loop_close(S.loop);
  printf("rank %d: %d iterations, %d wrong, %d recovery(ies), final comm of %d rank(s)\n", S.orig_rank, iters, bad,
         S.recoveries, final_size);
  return bad ? 1 : 0;

kill_me:
  snprintf(path, sizeof path, "%s/kill.txt", out);
  FILE *f = fopen(path, "w");
  if (f) {
    fprintf(f, "%.3f\n", real_ms());
    fclose(f);
  }
  printf("rank %d: SIGKILL at iteration %d (%s)\n", S.orig_rank, kill_at, kill_point);
  raise(SIGKILL);
  return 99;
}
