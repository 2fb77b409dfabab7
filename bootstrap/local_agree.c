/*
 * The local bootstrap's agreements and survivors' groups (recovery). The agreement state of a
 * group is under the group's agreement mutex (agreements are rare); whoever completes or
 * fails an agreement wakes every member, and each finishes its own request on its loop
 * thread. The survivors of epoch E of group "g" join the group "g/E".
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "bootstrap/local-internal.h"

/* "rank 1, rank 3" of the members not closed with ag_posted[r] == want. */
static const char *ag_list(lgroup *g, int want, char *buf, size_t n) {
  size_t k = 0;
  int named = 0;
  buf[0] = 0;
  for (int r = 0; r < g->size; r++) {
    if (ncfsm__local_member_closed(g, r) || (g->ag_posted[r] != 0) != (want != 0)) continue;
    int w = snprintf(buf + k, n - k, "%srank %d", named ? ", " : "", r);
    if (w < 0 || (size_t)w >= n - k) break;
    k += (size_t)w;
    named++;
  }
  if (!named) snprintf(buf, n, "none");
  return buf;
}

/* Under ag_mu: complete the open agreement if every member not closed has
 * posted. 1 if it did. */
int ncfsm__local_ag_eval_locked(lgroup *g) {
  if (!g->ag_open) return 0;
  for (int r = 0; r < g->size; r++)
    if (!g->ag_posted[r] && !ncfsm__local_member_closed(g, r)) return 0;
  int n = 0;
  for (int r = 0; r < g->size; r++) {
    g->ag_result[r] = g->ag_posted[r] && !ncfsm__local_member_closed(g, r);
    n += g->ag_result[r];
  }
  g->ag_nresult = n;
  g->ag_done = g->ag_last = g->ag_open;
  g->ag_open = 0;
  return 1;
}

/* Finish this member's agreement if it is decided (loop thread). */
void ncfsm__local_agree_progress(lmember *me) {
  ncfsm_boot_req *req = me->agreq;
  if (!req || req->status != NCFSM_ERR_AGAIN) return;
  lgroup *g = me->g;
  char msg[NCFSM__BOOT_ERRLEN - 64];
  ncfsm_result_t st;
  if (me->ag_refused) {
    snprintf(msg, sizeof msg, "%.440s", me->ag_err);
    st = NCFSM_ERR_BOOTSTRAP;
  } else {
    pthread_mutex_lock(&g->ag_mu);
    if (g->ag_open == req->epoch) {
      pthread_mutex_unlock(&g->ag_mu);
      return;
    }
    if (g->ag_done == req->epoch) {
      memcpy(req->alive, g->ag_result, (size_t)g->size);
      req->nalive = g->ag_nresult;
      st = NCFSM_OK;
    } else {
      snprintf(msg, sizeof msg, "local group '%.100s' agreement epoch %" PRIu64 " failed: %.300s",
               g->name, req->epoch, g->ag_fail[0] ? g->ag_fail : "superseded by a later epoch");
      st = NCFSM_ERR_BOOTSTRAP;
    }
    pthread_mutex_unlock(&g->ag_mu);
  }
  me->agreq = NULL;
  if (st != NCFSM_OK) ncfsm__boot_seterr(me->b, "%s", msg);
  ncfsm__boot_req_finish(req, st);
}

ncfsm_result_t ncfsm__local_agree_post(ncfsm_boot *b, ncfsm_boot_req *req) {
  lmember *me = b->impl;
  lgroup *g = me->g;
  uint64_t e = req->epoch;
  me->ag_refused = 0;
  pthread_mutex_lock(&g->ag_mu);
  if (e <= g->ag_last) {
    me->ag_refused = 1;
    snprintf(me->ag_err, sizeof me->ag_err, "local group '%.100s' agreement epoch %" PRIu64
                                            " posted by rank %d: not above the group's last "
                                            "agreement epoch %" PRIu64 "%s%.200s%s",
             g->name, e, me->rank, g->ag_last, g->ag_fail[0] ? " (which failed: " : "",
             g->ag_fail, g->ag_fail[0] ? ")" : "");
  } else if (g->ag_open && g->ag_open != e) {
    char posted[200];
    snprintf(g->ag_fail, sizeof g->ag_fail, "agreement epochs differ: rank %d posted epoch %" PRIu64
                                            " while %s posted epoch %" PRIu64 "; every live rank "
                                            "must post the same epoch",
             me->rank, e, ag_list(g, 1, posted, sizeof posted), g->ag_open);
    me->ag_refused = 1;
    snprintf(me->ag_err, sizeof me->ag_err, "local group '%.100s': %.400s", g->name, g->ag_fail);
    g->ag_last = e > g->ag_open ? e : g->ag_open;
    g->ag_open = 0;
  } else {
    if (!g->ag_open) {
      g->ag_open = e;
      memset(g->ag_posted, 0, (size_t)g->size);
    }
    g->ag_posted[me->rank] = 1;
    ncfsm__local_ag_eval_locked(g);
  }
  pthread_mutex_unlock(&g->ag_mu);
  me->agreq = req;
  ncfsm__local_wake_others(me);
  event_active(me->wake, 0, 0); /* finished from the wake, never inside post */
  return NCFSM_OK;
}

ncfsm_result_t ncfsm__local_agree_expire(ncfsm_boot_req *req, char *msg, size_t n) {
  lmember *me = req->b->impl;
  lgroup *g = me->g;
  ncfsm_result_t st = NCFSM_ERR_BOOTSTRAP;
  pthread_mutex_lock(&g->ag_mu);
  if (g->ag_done == req->epoch && !me->ag_refused) {
    memcpy(req->alive, g->ag_result, (size_t)g->size);
    req->nalive = g->ag_nresult;
    st = NCFSM_OK;
  } else if (g->ag_open == req->epoch) {
    char missing[200], posted[200];
    snprintf(g->ag_fail, sizeof g->ag_fail, "agreement epoch %" PRIu64 " not complete after %" PRIu64
                                            " ms: %s did not post it (posted: %s)",
             req->epoch, req->b->timeout_ms, ag_list(g, 0, missing, sizeof missing),
             ag_list(g, 1, posted, sizeof posted));
    g->ag_last = g->ag_open;
    g->ag_open = 0;
  }
  if (st != NCFSM_OK)
    snprintf(msg, n, "local group '%.100s' agreement epoch %" PRIu64 " failed: %s; every live rank "
                     "must post the same epoch, or raise NCFSM_BOOTSTRAP_TIMEOUT_MS",
             g->name, req->epoch, me->ag_refused ? me->ag_err : g->ag_fail);
  pthread_mutex_unlock(&g->ag_mu);
  me->agreq = NULL;
  ncfsm__local_wake_others(me); /* the other posters fail with it */
  return st;
}

ncfsm_result_t ncfsm__local_survivors(ncfsm_boot *parent, ncfsm_boot_req *agreed, ncfsm_boot *child) {
  lmember *pm = parent->impl;
  char name[512];
  int n = snprintf(name, sizeof name, "%s/%" PRIu64, pm->g->name, agreed->epoch);
  if (n < 0 || (size_t)n >= sizeof name) {
    ncfsm__boot_seterr(child, "ncfsm_boot_survivors: local group name '%.100s...' too long (nested "
                              "too deep)",
                       pm->g->name);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  join_opts j = {name, child->rank, child->size, NULL};
  return ncfsm__local_join(child, &j);
}
