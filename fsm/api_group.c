/* The public calls of groups (R3): the thread's machine holds a group back
 * from the loop while it can (fsm/held.def), the loop's group machine
 * decides the rest (fsm/group.def, fsm/group.c). ncfsm_group_depth takes
 * the lock: a group held back becomes the loop's first. */
#include "fsm/api-int.h"

ncfsm_result_t ncfsm_group_start(ncfsm_loop *loop) {
  if (!ncfsm__loop_ok(loop)) return NCFSM_ERR_INVALID_ARGUMENT;
  if (ncfsm__held_start(loop)) return NCFSM_OK; /* the thread holds it (fsm/held.def) */
  NCFSM__LOCK(loop);
  ncfsm_result_t r = ncfsm__group_start(loop);
  NCFSM__UNLOCK(loop);
  return r;
}

ncfsm_result_t ncfsm_group_end(ncfsm_loop *loop) {
  if (!ncfsm__loop_ok(loop)) return NCFSM_ERR_INVALID_ARGUMENT;
  if (ncfsm__held_loop == loop) return ncfsm__held_end(loop);
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
