/* The public calls of groups (R3): the loop's group machine decides
 * (fsm/group.def, fsm/group.c). */
#include "fsm/api-int.h"

ncfsm_result_t ncfsm_group_start(ncfsm_loop *loop) {
  if (!ncfsm__loop_ok(loop)) return NCFSM_ERR_INVALID_ARGUMENT;
  NCFSM__LOCK(loop);
  ncfsm_result_t r = ncfsm__group_start(loop);
  NCFSM__UNLOCK(loop);
  return r;
}

ncfsm_result_t ncfsm_group_end(ncfsm_loop *loop) {
  if (!ncfsm__loop_ok(loop)) return NCFSM_ERR_INVALID_ARGUMENT;
  NCFSM__LOCK(loop);
  ncfsm_result_t r = ncfsm__group_end(loop);
  NCFSM__UNLOCK(loop);
  return r;
}

int ncfsm_group_depth(ncfsm_loop *loop) {
  if (!ncfsm__loop_ok(loop)) return -1;
  NCFSM__LOCK(loop);
  int d = ncfsm__group_open(loop) ? loop->group_depth : 0;
  NCFSM__UNLOCK(loop);
  return d;
}
