/* The guards of fsm/comm.def: predicates over a communicator's data, named
 * in the table's transition rows and legality cells. A guard reads; it never
 * changes anything. */
#include "fsm/internal.h"

static bool no_inflight(const ncfsm_comm *c) {
  for (int i = 0; i < c->nsq; i++)
    if (c->sq[i].head) return false;
  return true;
}

static bool caller_owns_group(const ncfsm_comm *c) {
  const ncfsm_loop *loop = c->loop;
  return loop->group_depth > 0 && pthread_equal(loop->group_owner, pthread_self());
}

bool ncfsm__guard(const ncfsm_comm *c, ncfsm_guard_t g) {
  switch (g) {
    case NCFSM_GUARD_ANY: return true;
    case NCFSM_GUARD_GROUP_OPS: return c->ngroup > 0;
    case NCFSM_GUARD_NO_GROUP_OPS: return c->ngroup == 0;
    case NCFSM_GUARD_GROUP_THREAD: return c->ngroup == 0 || caller_owns_group(c);
    case NCFSM_GUARD_DRAINED: return c->ngroup == 0 && !c->bq_head && !c->launching;
    case NCFSM_GUARD_WAS_REVOKED: return c->was_revoked;
    case NCFSM_GUARD_IDLE: return c->ngroup == 0 && !c->bq_head && !c->launching && no_inflight(c);
    case NCFSM_GUARD_COUNT: break;
  }
  return false;
}
