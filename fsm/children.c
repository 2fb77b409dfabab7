/* Children of split, shrink and grow on the parent's side: the hand-off of
 * the handle NCCL wrote (R8), a child orphaned by its parent's failure, and
 * a split child's rank and size once its init is done. The calls
 * themselves are public API (fsm/api_split.c). */
#include <stdio.h>
#include <stdlib.h>

#include "fsm/engine.h"

/* The parent's call is final (SPLIT_DONE): the child it made gets the
 * handle NCCL wrote (HANDED). A child aborted meanwhile has no use for it:
 * NCCL made the communicator all the same, so it is aborted. */
void ncfsm__children_hand(ncfsm_comm *p) {
  ncfsm_comm *c = p->split_child;
  p->split_child = NULL;
  if (!c) return; /* NOCOLOR */
  if (c->state == NCFSM_STATE_CHILD_QUEUED) {
    ncfsm__comm_fire(c, NCFSM_EV_HANDED, NULL);
  } else {
    c->split_parent = NULL;
    if (c->split_bcomm) ncfsm__abort_stray(c->loop, c->be, c->split_bcomm, NULL, NULL);
    c->split_bcomm = NULL;
  }
  ncfsm__comm_unref(c);
}

bool ncfsm__child_geometry(ncfsm_comm *c) {
  int r = -1, n = 0;
  int rc = c->be->comm_rank_size ? c->be->comm_rank_size(c->bcomm, &r, &n) : NCFSM__NCCL_INVALID_USAGE;
  if (rc == NCFSM__NCCL_SUCCESS && n > 0 && r >= 0 && r < n) {
    c->p2p_send_seq = calloc((size_t)n, sizeof *c->p2p_send_seq);
    c->p2p_recv_seq = calloc((size_t)n, sizeof *c->p2p_recv_seq);
    if (c->p2p_send_seq && c->p2p_recv_seq) {
      c->rank = r;
      c->nranks = n;
      return true;
    }
    ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_NO_MEMORY, NCFSM__NCCL_SYSTEM_ERROR,
                     "split child (out of memory)");
    return false;
  }
  ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_BACKEND, NCFSM__IS_ERR(rc) ? rc : NCFSM__NCCL_INTERNAL_ERROR,
                   "ncclCommUserRank/ncclCommCount of the split child");
  return false;
}

void ncfsm__children_orphan(ncfsm_comm *p, const char *why) {
  ncfsm_comm *c = p->split_child;
  if (!c) return;
  p->split_child = NULL;
  c->split_parent = NULL;
  char what[600];
  snprintf(what, sizeof what, "the parent %s (rank %d) failed before its split/shrink/grow was final (%s)", p->name,
           p->rank, why);
  ncfsm__comm_fail(c, NCFSM_EV_ASYNC_ERROR, NCFSM_ERR_ABORTED, NCFSM__NCCL_SUCCESS, what);
  ncfsm__comm_unref(c);
}
