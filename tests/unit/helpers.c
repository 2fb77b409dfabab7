#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

#include "fsm/objects.h"

void trace_record(const ncfsm_trace_rec *r, void *arg) {
  trace_log *t = arg;
  if (t->n >= (int)(sizeof t->rec / sizeof t->rec[0])) return;
  t->rec[t->n].obj = r->object;
  t->rec[t->n].rank = r->rank;
  t->rec[t->n].kind = r->kind;
  t->rec[t->n].state = r->state;
  t->rec[t->n].event = r->event;
  t->rec[t->n].next = r->next;
  t->rec[t->n].result = r->result;
  t->n++;
}

void test_sim_opts(ncfsm_sim_opts *so) {
  assert_int_equal(ncfsm_sim_opts_init(so), NCFSM_OK);
  so->init_polls = 1;
  so->launch_polls = 1;
  so->finalize_polls = 1;
  so->revoke_polls = 1;
}

void test_comm_opts(ncfsm_comm_opts *o, ncfsm_sim_opts *so) {
  ncfsm_comm_opts_init(o);
  o->backend = NCFSM_BACKEND_SIM;
  o->sim = so;
  o->name = "test";
}

void make_comms(ncfsm_loop *loop, int n, ncfsm_comm_opts *o, ncfsm_comm **c, int only_rank0) {
  ncfsm_unique_id id;
  assert_int_equal(ncfsm_get_unique_id(NCFSM_BACKEND_SIM, &id), NCFSM_OK);
  for (int r = 0; r < n; r++) {
    assert_int_equal(ncfsm_comm_new(loop, o, &c[r]), NCFSM_OK);
    if (!only_rank0 || r == 0) assert_int_equal(ncfsm_comm_init(c[r], n, r, &id), NCFSM_OK);
  }
}

ncfsm_loop *ready_comms_with(int n, ncfsm_comm **c, ncfsm_comm_opts *o) {
  ncfsm_loop *loop;
  assert_int_equal(ncfsm_loop_new(NULL, &loop), NCFSM_OK);
  make_comms(loop, n, o, c, 0);
  for (int r = 0; r < n; r++) run_until_state(loop, c[r], NCFSM_STATE_READY);
  return loop;
}

ncfsm_loop *ready_comms(int n, ncfsm_comm **c) {
  ncfsm_sim_opts so;
  ncfsm_comm_opts o;
  test_sim_opts(&so);
  test_comm_opts(&o, &so);
  return ready_comms_with(n, c, &o);
}

int cb_count[64];
ncfsm_result_t cb_status[64];

void count_cb(ncfsm_work *w, ncfsm_result_t st, void *arg) {
  (void)w;
  int i = (int)(intptr_t)arg;
  cb_count[i]++;
  cb_status[i] = st;
}

void reset_cbs(void) {
  memset(cb_count, 0, sizeof cb_count);
  for (int i = 0; i < 64; i++) cb_status[i] = NCFSM_ERR_AGAIN;
}

void run_turns(ncfsm_loop *loop, int n) {
  for (int i = 0; i < n; i++) assert_int_equal(ncfsm_loop_run(loop, NCFSM_RUN_NOWAIT), NCFSM_OK);
}

void run_until_state(ncfsm_loop *loop, ncfsm_comm *c, ncfsm_state_t s) {
  for (int i = 0; i < 10000 && ncfsm_comm_state(c) != s; i++) run_turns(loop, 1);
  if (ncfsm_comm_state(c) != s)
    fail_msg("comm stuck in %s waiting for %s: %s", ncfsm_state_name(ncfsm_comm_state(c)),
             ncfsm_state_name(s), ncfsm_comm_last_error(c));
}

void teardown_all(ncfsm_loop *loop, ncfsm_comm **c, int n) {
  for (int r = 0; r < n; r++) {
    if (!c[r]) continue;
    if (ncfsm_comm_state(c[r]) != NCFSM_STATE_CLOSED && ncfsm_comm_state(c[r]) != NCFSM_STATE_NEW)
      assert_int_equal(ncfsm_comm_abort(c[r]), NCFSM_OK);
    assert_int_equal(ncfsm_comm_release(c[r]), NCFSM_OK);
  }
  run_turns(loop, 2);
  ncfsm_result_t r = ncfsm_loop_close(loop);
  if (r != NCFSM_OK) fail_msg("ncfsm_loop_close: %s: %s", ncfsm_err_name(r), ncfsm_loop_last_error(loop));
}

uint64_t backend_calls(ncfsm_comm *c) { return ncfsm__comm_backend_calls(c); }

bool has_backend_comm(ncfsm_comm *c) {
  pthread_mutex_lock(&c->loop->mu);
  bool b = c->bcomm != NULL;
  pthread_mutex_unlock(&c->loop->mu);
  return b;
}

int test_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

int test_run_tcp_ranks(int n, const char *token, int (*rank_main)(int rank, void *arg), void *arg) {
  int port = test_free_port();
  if (port < 0) return n;
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  pid_t pid[64];
  if (n > 64) return n;
  fflush(stdout);
  for (int r = 0; r < n; r++) {
    pid[r] = fork();
    if (pid[r] < 0) return n;
    if (pid[r] == 0) {
      char rs[16], ns[16];
      snprintf(rs, sizeof rs, "%d", r);
      snprintf(ns, sizeof ns, "%d", n);
      setenv("NCFSM_STORE_ADDR", addr, 1);
      setenv("NCFSM_STORE_TOKEN", token, 1);
      setenv("NCFSM_RANK", rs, 1);
      setenv("NCFSM_WORLD_SIZE", ns, 1);
      setenv("NCFSM_STORE_HOST", r == 0 ? "1" : "0", 1);
      unsetenv("PMIX_RANK");
      unsetenv("NCFSM_BOOTSTRAP");
      alarm(90);
      int rc = rank_main(r, arg);
      fflush(stdout);
      _exit(rc);
    }
  }
  int failed = 0;
  for (int r = 0; r < n; r++) {
    int st = 0;
    if (waitpid(pid[r], &st, 0) != pid[r] || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d failed: %s %d\n", r, WIFEXITED(st) ? "exit" : "signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      failed++;
    }
  }
  return failed;
}

void test_stuck_opts(ncfsm_sim_opts *so, ncfsm_comm_opts *o, ncfsm_sim_opts *so1, ncfsm_comm_opts *o1,
                     uint64_t timeout_ms) {
  test_sim_opts(so);
  test_comm_opts(o, so);
  o->timeout_ms = timeout_ms;
  o->on_error = NCFSM_ON_ERROR_STAY;
  *so1 = *so;
  so1->never_arrive = 1;
  *o1 = *o;
  o1->sim = so1;
}

void test_sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}
