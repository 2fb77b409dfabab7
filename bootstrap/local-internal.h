/* The local bootstrap's internals, shared by its files (each one job):
 *   local.c        groups, members, allgathers, broadcasts, channels, notices
 *   local_agree.c  agreements and survivors' groups (recovery)
 * See local.c for the design. */
#ifndef NCFSM_BOOTSTRAP_LOCAL_INTERNAL_H
#define NCFSM_BOOTSTRAP_LOCAL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/queue.h>

#include "bootstrap/boot-internal.h"

struct lgroup;

typedef struct lnode {
  _Atomic(struct lnode *) next;
  uint64_t rp1; /* round + 1; the list's dummy head has 0 */
  size_t len;
  unsigned char data[];
} lnode;

struct lgroup;

typedef struct lreq {
  TAILQ_ENTRY(lreq) link;
  ncfsm_boot_req *req;
  uint64_t round;
} lreq;

/* A broadcast of a group (under the group's bc_mu): made by its first poster, root's bytes
 * copied in at root's post, freed when every other member took them. */
typedef struct lbcast {
  LIST_ENTRY(lbcast) link;
  uint64_t seq;
  int root;
  size_t len;
  int posted;     /* root's bytes are in data */
  int left;       /* members other than root that have not taken them */
  char failed[300];
  unsigned char *data;
} lbcast;

typedef struct lmember {
  struct lgroup *g;
  ncfsm_boot *b;
  int rank;
  struct event *wake;
  atomic_int closed, wakers;
  _Atomic uint64_t completed; /* rounds this member has finished */
  lnode *dummy;               /* set before the member is published */
  /* owner-thread only: */
  lnode *tail, *oldest;
  lnode **cursor; /* [size]: last node consumed from each member's list */
  uint64_t posted;
  TAILQ_HEAD(, lreq) pending;
  TAILQ_HEAD(, lreq) bpending; /* broadcasts not finished */
  uint8_t *lost_seen;         /* [size] */
  ncfsm_boot_req *agreq;      /* the agreement not finished */
  int ag_refused;             /* agreq was refused at its post: ag_err says why */
  char ag_err[700];
} lmember;

typedef struct lgroup {
  LIST_ENTRY(lgroup) link;
  char *name;
  int size, refs;
  _Atomic(lmember *) *members; /* [size] */
  /* agreements, under ag_mu */
  pthread_mutex_t ag_mu;
  uint64_t ag_open, ag_last, ag_done; /* open (0: none), last completed or failed, last completed */
  uint8_t *ag_posted, *ag_result;    /* [size] */
  int ag_nresult;
  char ag_fail[400];                 /* why the last failed one failed */
  /* broadcasts, under bc_mu */
  pthread_mutex_t bc_mu;
  LIST_HEAD(, lbcast) bcasts;
  /* a channel's group: its members as ranks of the parent group (the first joiner's list;
   * the others must join with the same), NULL for a group opened with ncfsm_boot_open or a
   * survivors' group */
  int *chan_members;
} lgroup;

/* How a member joins a group: its name, the member's rank and the group's size; a channel's
 * group also names its members as ranks of the parent group (chan_members[size]). */
typedef struct join_opts {
  const char *name;
  int rank, size;
  const int *chan_members;
} join_opts;

int ncfsm__local_member_closed(lgroup *g, int r);
void ncfsm__local_wake_others(lmember *me);
ncfsm_result_t ncfsm__local_join(ncfsm_boot *b, const join_opts *o);

/* local_agree.c */
int ncfsm__local_ag_eval_locked(lgroup *g);
void ncfsm__local_agree_progress(lmember *me);
ncfsm_result_t ncfsm__local_agree_post(ncfsm_boot *b, ncfsm_boot_req *req);
ncfsm_result_t ncfsm__local_agree_expire(ncfsm_boot_req *req, char *msg, size_t n);
ncfsm_result_t ncfsm__local_survivors(ncfsm_boot *parent, ncfsm_boot_req *agreed, ncfsm_boot *child);

#endif
