/* A program built against an INSTALLED ncfsm (find_package or pkg-config). */
#include <ncfsm.h>
#include <ncfsm/testing.h> /* the testing kit is installed with the library */
#include <stdio.h>

int main(void) {
  ncfsm_set_log_level(NCFSM_LOG_WARN); /* the public log levels */
  ncfsm_loop *loop;
  if (ncfsm_loop_new(NULL, &loop) != NCFSM_OK) return 1;
  ncfsm_comm *c[2];
  ncfsm_comm_opts o;
  ncfsm_comm_opts_init(&o);
  o.backend = NCFSM_BACKEND_SIM;
  if (ncfsm_comm_init_all(loop, 2, &o, NULL, c) != NCFSM_OK) return 2;
  float a[2][4] = {{1, 1, 1, 1}, {2, 2, 2, 2}};
  ncfsm_group_start(loop);
  for (int r = 0; r < 2; r++) ncfsm_allreduce(c[r], a[r], a[r], 4, NCFSM_FLOAT32, NCFSM_OP_SUM, NULL, NULL, NULL, NULL);
  if (ncfsm_group_end(loop) != NCFSM_OK) return 3;
  ncfsm_loop_run(loop, NCFSM_RUN_DEFAULT);
  for (int r = 0; r < 2; r++) {
    if (a[r][3] != 3.0f) return 4;
    ncfsm_comm_abort(c[r]);
    ncfsm_comm_release(c[r]);
  }
  printf("consumer: %s, allreduce ok, comm name %s\n", ncfsm_state_name(NCFSM_STATE_CLOSED), ncfsm_comm_name(NULL)[0] ? "?" : "-");
  return ncfsm_loop_close(loop) == NCFSM_OK ? 0 : 5;
}
