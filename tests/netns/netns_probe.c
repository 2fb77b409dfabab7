/*
 * netns_probe: one rank of the "several hosts" harness (tests/netns/run_faults.sh).
 * It opens the bootstrap from the environment (tcp: NCFSM_STORE_ADDR,
 * NCFSM_STORE_TOKEN, NCFSM_RANK, NCFSM_WORLD_SIZE; pmix under mpirun), runs an allgather every
 * --period-ms whose every entry is checked (who sent it, which round, a
 * checksum), and prints what it sees, one line each, stamped with
 * CLOCK_REALTIME in ms (one clock for every namespace of the machine):
 *
 *   READY <t> rank <r>                       the first barrier passed
 *   LOST <t> rank <r> peer <p>: <why>        ncfsm_boot_on_peer_lost
 *   FAILED <t> rank <r>: <why>               ncfsm_boot_on_failed (the store lost, or an
 *                                            allgather refused for a lost rank)
 *   RECOVERED <t> rank <r> size <n> without <ranks>  agreement + survivors' bootstrap
 *   WRONG <t> rank <r> round <k> entry <i>   an entry that is not what was sent
 *   END <t> rank <r> rounds <k> wrong <w> <why>
 *
 * After a peer is lost, its allgathers fail by name; the survivors agree
 * (ncfsm_boot_agree_post) and go on over the survivors' bootstrap (the armed
 * recovery of the bootstrap's side). Exit 0 at --seconds or SIGTERM with no
 * wrong entry, 1 with one, 3 when the bootstrap failed (the store lost).
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "ncfsm/bootstrap.h"

static double real_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int g_rank, g_failed, g_lost;
static volatile sig_atomic_t g_stop;

static void on_term(int sig) {
  (void)sig;
  g_stop = 1;
}

static void on_lost(ncfsm_boot *b, int rank, const char *why, void *arg) {
  (void)b;
  (void)arg;
  g_lost++;
  printf("LOST %.3f rank %d peer %d: %s\n", real_ms(), g_rank, rank, why);
}

static void on_failed(ncfsm_boot *b, ncfsm_result_t st, const char *why, void *arg) {
  (void)b;
  (void)st;
  (void)arg;
  g_failed = 1;
  printf("FAILED %.3f rank %d: %s\n", real_ms(), g_rank, why);
}

typedef struct entry {
  uint32_t rank, round;
  uint64_t check;
} entry;

static uint64_t check_of(uint32_t rank, uint32_t round) {
  return ((uint64_t)rank * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)round * 0xc2b2ae3d27d4eb4full);
}

/* Run base until req is done, SIGTERM, or the process's end; its status (AGAIN: stopped). */
static ncfsm_result_t wait_req(struct event_base *base, ncfsm_boot_req *req, double end) {
  ncfsm_result_t r;
  while ((r = ncfsm_boot_test(req)) == NCFSM_ERR_AGAIN && !g_stop && real_ms() < end) {
    struct timeval tv = {0, 20000};
    event_base_loopexit(base, &tv);
    event_base_loop(base, EVLOOP_NO_EXIT_ON_EMPTY);
  }
  return r;
}

static void idle(struct event_base *base, int ms) {
  struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
  event_base_loopexit(base, &tv);
  event_base_loop(base, EVLOOP_NO_EXIT_ON_EMPTY);
}

int main(int argc, char **argv) {
  double seconds = 30;
  int period_ms = 100;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--period-ms")) period_ms = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "usage: netns_probe [--seconds S] [--period-ms MS]\n");
      return 2;
    }
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGTERM, on_term);
  evthread_use_pthreads();
  struct event_base *base = event_base_new();
  ncfsm_boot_opts o;
  ncfsm_boot_opts_init(&o); /* auto: tcp with NCFSM_STORE_ADDR, pmix under a launcher */
  ncfsm_boot *job, *b;
  if (ncfsm_boot_open(base, &o, &job) != NCFSM_OK) {
    printf("END %.3f rank %d rounds 0 wrong 0 open failed: %s\n", real_ms(), o.rank, ncfsm_boot_open_error());
    return 3;
  }
  b = job;
  g_rank = ncfsm_boot_rank(job);
  int world = ncfsm_boot_size(job);
  ncfsm_boot_on_peer_lost(job, on_lost, NULL);
  ncfsm_boot_on_failed(job, on_failed, NULL);
  double end = real_ms() + seconds * 1e3;
  ncfsm_boot_req *req;
  if (ncfsm_boot_barrier_post(job, &req) != NCFSM_OK || wait_req(base, req, end) != NCFSM_OK) {
    printf("END %.3f rank %d rounds 0 wrong 0 first barrier: %s\n", real_ms(), g_rank, ncfsm_boot_last_error(job));
    return 3;
  }
  ncfsm_boot_req_free(req);
  printf("READY %.3f rank %d\n", real_ms(), g_rank);
  int *member = calloc((size_t)world, sizeof *member); /* member[i]: job rank of index i */
  entry *all = calloc((size_t)world, sizeof *all);
  for (int i = 0; i < world; i++) member[i] = i;
  uint32_t k = 0;
  int wrong = 0, n = world, rc = 0;
  uint64_t epoch = 0;
  const char *why = "done";
  while (!g_stop && real_ms() < end) {
    entry me = {(uint32_t)g_rank, k, check_of((uint32_t)g_rank, k)};
    ncfsm_result_t r = ncfsm_boot_allgather_post(b, &me, all, sizeof me, &req);
    if (r == NCFSM_OK) {
      r = wait_req(base, req, end);
      ncfsm_boot_req_free(req);
    }
    if (r == NCFSM_ERR_AGAIN) break; /* stopped or out of time while waiting */
    if (r == NCFSM_OK) {
      for (int i = 0; i < n; i++)
        if (all[i].rank != (uint32_t)member[i] || all[i].round != k || all[i].check != check_of(all[i].rank, k)) {
          printf("WRONG %.3f rank %d round %u entry %d\n", real_ms(), g_rank, k, i);
          wrong++;
        }
      k++;
      idle(base, period_ms);
      continue;
    }
    if (!g_lost) { /* the store is lost (or an error without a lost rank): the end */
      why = "the bootstrap failed";
      rc = 3;
      break;
    }
    /* a rank was lost: agree with the others that are left, go on over the survivors */
    ncfsm_boot_req *ag;
    if (ncfsm_boot_agree_post(job, ++epoch, &ag) != NCFSM_OK || wait_req(base, ag, end) != NCFSM_OK) {
      printf("END %.3f rank %d rounds %u wrong %d agreement failed: %s\n", real_ms(), g_rank, k, wrong,
             ncfsm_boot_last_error(job));
      return 3;
    }
    uint8_t *alive = calloc((size_t)world, 1);
    int nalive = 0;
    ncfsm_boot_agree_result(ag, alive, &nalive);
    if (b != job) ncfsm_boot_close(b);
    if (ncfsm_boot_survivors(job, ag, &b) != NCFSM_OK) {
      printf("END %.3f rank %d rounds %u wrong %d survivors: %s\n", real_ms(), g_rank, k, wrong,
             ncfsm_boot_last_error(job));
      return 3;
    }
    ncfsm_boot_req_free(ag);
    char without[256] = "";
    n = 0;
    for (int i = 0; i < world; i++) {
      if (alive[i]) member[n++] = i;
      else snprintf(without + strlen(without), sizeof without - strlen(without), "%s%d", without[0] ? "," : "", i);
    }
    free(alive);
    printf("RECOVERED %.3f rank %d size %d without %s\n", real_ms(), g_rank, n, without);
    g_lost = 0;
  }
  printf("END %.3f rank %d rounds %u wrong %d %s: %s\n", real_ms(), g_rank, k, wrong, why,
         rc ? ncfsm_boot_last_error(b) : "ok");
  ncfsm_boot_on_peer_lost(job, NULL, NULL);
  if (b != job) ncfsm_boot_close(b);
  ncfsm_boot_close(job);
  event_base_free(base);
  free(member);
  free(all);
  return wrong ? 1 : rc;
}
