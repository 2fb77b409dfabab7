/* The tcp store's ranks: HELLO (the token or the rank's secret, the throttle
 * of failed HELLOs, the job's size, one live connection per rank, rejoining)
 * and a rank whose connection ended (its gathers fail, LOST is pushed). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/bufferevent.h>
#include <event2/event.h>

#include "bootstrap/secret.h"
#include "bootstrap/store-internal.h"

/* Tell every other ranked connection that rank was lost. */
void ncfsm__st_push_lost(ncfsm__store *s, uint32_t rank, const char *why) {
  size_t wl = strlen(why);
  if (wl > 1000) wl = 1000;
  uint8_t v[4 + 1000];
  ncfsm__wr32(v, rank);
  memcpy(v + 4, why, wl);
  struct sconn *o;
  LIST_FOREACH(o, &s->conns, link) {
    if (!o->ranked || o->released || o->closing || o->rank == rank) continue;
    ncfsm__st_reply(o, NCFSM__F_LOST, 0, v, (uint32_t)(4 + wl));
    s->st.lost_pushed++;
  }
}


/* A broadcast that root posted and every member posted or is gone: nothing more to send. */
void ncfsm__st_bcast_maybe_done(ncfsm__store *s, struct entry *e) {
  if (!e->bcast || e->failed || !e->g_buf || e->g_count < e->g_size || !LIST_EMPTY(&e->waiters))
    return;
  s->st.bcasts_done++;
  ncfsm__st_entry_delete(s, e);
}

/* A ranked connection ended (closed, died, or closed by the store): every
 * open gather it had not contributed to fails for the others at once. */
void ncfsm__st_rank_release(struct sconn *c, const char *reason) {
  ncfsm__store *s = c->s;
  if (!c->ranked || c->released) return;
  c->released = 1;
  struct rankslot *slot = &s->ranks[c->rank];
  if (slot->c != c) return;
  ncfsm__st_hb_unlink(c);
  char why[400];
  snprintf(why, sizeof why, "rank %u (%s) disconnected: %s", c->rank, c->peer, reason);
  slot->c = NULL;
  slot->state = RS_GONE;
  free(slot->why);
  slot->why = strdup(why);
  if (s->n_gone++ == 0) s->first_gone = c->rank;
  s->st.ranks_gone++;
  NCFSM_INFO(SUB, "store: %s", why);
  struct agwaiter *aw;
  while ((aw = LIST_FIRST(&c->agw)) != NULL) ncfsm__st_agwaiter_free(s, aw);
  ncfsm__st_push_lost(s, c->rank, why);
  char who[120], tail[40];
  snprintf(who, sizeof who, "rank %u (%s)", c->rank, c->peer);
  snprintf(tail, sizeof tail, "; see rank %u's log", c->rank);
  ncfsm__st_member_left(s, NULL, c->rank, who, "disconnected before", reason, tail);
  /* the survivors' groups it belonged to: later GATHERs fail, open agreements
   * go on without it (its loss may complete one) */
  struct group *g;
  LIST_FOREACH(g, &s->groups, link) {
    int64_t i = ncfsm__st_group_index(g, c->rank);
    if (i < 0) continue;
    if (g->ranks && !g->gone) ncfsm__st_set_msg(s, &g->gone, why);
    if (g->open_epoch) {
      g->posted[i] = 0;
      ncfsm__st_ag_eval(s, g); /* a group it makes is put at the head: not visited again */
    }
  }
  ncfsm__st_chan_rank_gone(s, c->rank);
}

void ncfsm__st_member_left(ncfsm__store *s, struct group *only, uint32_t job_rank, const char *who,
                           const char *event, const char *reason, const char *tail) {
  for (struct entry *e = LIST_FIRST(&s->gathers), *next; e; e = next) {
    next = LIST_NEXT(e, g_link);
    if (only && e->grp != only) continue;
    int64_t i = e->grp ? ncfsm__st_group_index(e->grp, job_rank) : (int64_t)job_rank;
    if (i < 0 || e->g_have[i]) continue;
    if (e->bcast && (uint32_t)i != e->b_root) { /* a receiver gone: the others still get it */
      e->g_have[i] = 2;
      e->g_count++;
      ncfsm__st_bcast_maybe_done(s, e);
      continue;
    }
    char k[100], in[120] = "", msg[700];
    if (e->grp && e->grp->chan)
      snprintf(in, sizeof in, " (rank %lld of channel '%.64s')", (long long)i, e->grp->path + 2);
    if (e->bcast)
      snprintf(msg, sizeof msg, "broadcast %s failed: its root, %s%s, %s posting it (%s)%s",
               ncfsm__st_key_str(e, k, sizeof k), who, in, event, reason, tail);
    else
      snprintf(msg, sizeof msg, "allgather %s failed: %s%s %s contributing (%s)%s",
               ncfsm__st_key_str(e, k, sizeof k), who, in, event, reason, tail);
    ncfsm__st_gather_fail(s, e, msg);
  }
}

/* ---- authentication and ranks ---------------------------------------------- */

static struct throttle *throttle_get(ncfsm__store *s, const uint8_t akey[17], uint64_t now) {
  struct throttle *oldest = &s->thr[0];
  for (int i = 0; i < THROTTLE_SLOTS; i++) {
    struct throttle *t = &s->thr[i];
    if (t->used && !memcmp(t->akey, akey, sizeof t->akey)) return t;
    if (!t->used || (oldest->used && t->last_ns < oldest->last_ns)) oldest = t;
  }
  memset(oldest, 0, sizeof *oldest);
  memcpy(oldest->akey, akey, sizeof oldest->akey);
  oldest->used = 1;
  oldest->tokens = s->o.auth_fail_burst;
  oldest->last_ns = now;
  return oldest;
}

static void release_held(ncfsm__store *s);

/* Admit c as rank of size (size 0: a client without a rank): the job's size, one live
 * connection per rank, rejoining; then the OK and the ranks lost before it came. NULL, or why
 * c is refused. */
static const char *admit(struct sconn *c, uint32_t rank, uint32_t size, uint32_t id, char *buf,
                         size_t n) {
  ncfsm__store *s = c->s;
  int fixed_now = 0;
  if (size > 0) {
    if (!s->job_size) { /* rank 0 (the others wait for it) */
      char from[120];
      snprintf(from, sizeof from, "rank 0's HELLO from %s", c->peer);
      if (ncfsm__st_job_size_set(s, size, from) != 0) {
        snprintf(buf, n, "store full: no room for a job of %u ranks", size);
        return buf;
      }
      fixed_now = 1;
    } else if (size != s->job_size) {
      snprintf(buf, n, "HELLO of rank %u says the job has %u ranks, the store's job has %u (%s): "
                       "check NCFSM_WORLD_SIZE; one store (one token) per job",
               rank, size, s->job_size, s->job_from);
      return buf;
    }
    struct rankslot *slot = &s->ranks[rank];
    if (slot->state == RS_LIVE) {
      s->st.rank_conflicts++;
      char msg[400];
      snprintf(msg, sizeof msg, "rank %u claimed by two connections, %s (first) and %s: an "
                                "impostor or two processes with the same NCFSM_RANK; every "
                                "allgather of this job fails from now on",
               rank, slot->c->peer, c->peer);
      if (!s->conflict) s->conflict = strdup(msg);
      for (struct entry *e = LIST_FIRST(&s->gathers), *next; e; e = next) {
        next = LIST_NEXT(e, g_link);
        ncfsm__st_gather_fail(s, e, msg);
      }
      snprintf(buf, n, "%s", msg);
      return buf;
    }
    if (slot->state == RS_GONE) {
      if (!s->o.rejoin) {
        s->st.rejoin_refused++;
        snprintf(buf, n, "rank %u cannot rejoin (%s); rejoining is off: restart the job, or run "
                         "the store with --rejoin (NCFSM_STORE_REJOIN=1)",
                 rank, slot->why ? slot->why : "it disconnected");
        return buf;
      }
      free(slot->why);
      slot->why = NULL;
      /* the rejoined rank restarts at allgather #0: forget the failed ones */
      ncfsm__st_table_drop_failed(s);
      if (--s->n_gone && s->first_gone == rank)
        for (uint32_t r = 0; r < s->job_size; r++)
          if (s->ranks[r].state == RS_GONE) {
            s->first_gone = r;
            break;
          }
      NCFSM_INFO(SUB, "store: rank %u rejoined from %s", rank, c->peer);
    }
    slot->state = RS_LIVE;
    slot->c = c;
    c->ranked = 1;
    c->rank = rank;
  }
  c->authed = 1;
  s->st.authenticated++;
  if (c->timer_kind == T_AUTH) {
    event_del(c->timer);
    c->timer_kind = T_NONE;
  }
  bufferevent_setwatermark(c->bev, EV_READ, 0,
                           (size_t)NCFSM__FRAME_HDR + s->lim.key_max + s->lim.value_max);
  NCFSM_TRACE(SUB, "store: %s authenticated as rank %u of %u", c->peer, rank, size);
  uint8_t hv[12];
  ncfsm__st_hb_ok_value(s, hv);
  if (c->ranked && !s->o.heartbeat_off) ncfsm__st_reply(c, NCFSM__F_OK, id, hv, sizeof hv);
  else ncfsm__st_reply(c, NCFSM__F_OK, id, NULL, 0);
  if (c->ranked && s->n_gone) /* the ranks lost before it came */
    for (uint32_t r = 0; r < s->job_size; r++) {
      const struct rankslot *sl = &s->ranks[r];
      if (sl->state != RS_GONE || !sl->why) continue;
      size_t wl = strlen(sl->why);
      uint8_t v[4 + 400];
      if (wl > 400) wl = 400;
      ncfsm__wr32(v, r);
      memcpy(v + 4, sl->why, wl);
      ncfsm__st_reply(c, NCFSM__F_LOST, 0, v, (uint32_t)(4 + wl));
      s->st.lost_pushed++;
    }
  if (fixed_now) release_held(s);
  return NULL;
}

const char *ncfsm__st_handle_hello(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n) {
  ncfsm__store *s = c->s;
  if (c->authed || c->held) return "second HELLO on one connection";
  uint64_t now = ncfsm__now_ns();
  struct throttle *t = throttle_get(s, c->akey, now);
  t->tokens += (double)(now - t->last_ns) * 1e-9 * s->o.auth_fail_per_s;
  if (t->tokens > s->o.auth_fail_burst) t->tokens = s->o.auth_fail_burst;
  t->last_ns = now;
  if (t->tokens < 1.0) {
    s->st.throttled++;
    unsigned wait_ms = (unsigned)((1.0 - t->tokens) * 1000.0 / s->o.auth_fail_per_s) + 1;
    ncfsm__st_warn_limited(s, W_THROTTLE, "store: throttling HELLOs from %s: %" PRIu64 " failed HELLOs",
                 c->peer, t->fails);
    snprintf(buf, n, "throttled: %" PRIu64 " failed HELLOs from this address; retry in %u ms "
                     "(a wrong NCFSM_STORE_TOKEN on this host?)",
             t->fails, wait_ms);
    return buf;
  }
  uint32_t rank = ncfsm__rd32(f->value), size = ncfsm__rd32(f->value + 4);
  uint32_t flags = f->vlen == 12 ? ncfsm__rd32(f->value + 8) : 0;
  if (s->o.rank_secrets && size > 0 && rank < size) { /* the rank's own secret, not the token */
    char secret[65];
    ncfsm__rank_secret((const char *)s->token, rank, size, secret);
    int ok = ncfsm__ct_equal(f->key, f->klen, secret, 64);
    memset(secret, 0, sizeof secret);
    if (!ok) {
      s->st.rejected_token++;
      t->tokens -= 1.0;
      t->fails++;
      snprintf(buf, n, "bad token: this store takes per-rank secrets and the HELLO of rank %u of "
                       "%u did not carry that rank's (NCFSM_STORE_RANK_SECRET; `ncfsm-store "
                       "--print-rank-secret %u/%u` prints it from the job token)",
               rank, size, rank, size);
      return buf;
    }
  } else if (!ncfsm__ct_equal(f->key, f->klen, s->token, s->toklen)) {
    s->st.rejected_token++;
    t->tokens -= 1.0;
    t->fails++;
    return "bad token: HELLO did not carry this job's NCFSM_STORE_TOKEN";
  }
  if (size > 0) {
    if (rank >= size) {
      snprintf(buf, n, "HELLO rank %u is not below its size %u", rank, size);
      return buf;
    }
    if (size > (1u << 22)) {
      snprintf(buf, n, "HELLO size %u: the store serves jobs of at most %u ranks", size, 1u << 22);
      return buf;
    }
    if (flags & NCFSM__HELLO_HEARTBEAT) return ncfsm__st_hb_hello(c, rank, size, f->id, buf, n);
    if (!s->job_size && rank != 0) { /* the job's size is rank 0's: wait for it */
      c->held = 1;
      c->held_rank = rank;
      c->held_size = size;
      c->held_id = f->id;
      LIST_INSERT_HEAD(&s->held, c, hlink);
      s->st.hellos_held++;
      if (c->timer_kind == T_AUTH) {
        event_del(c->timer);
        c->timer_kind = T_NONE;
      }
      NCFSM_TRACE(SUB, "store: %s's HELLO as rank %u of %u waits for rank 0's", c->peer, rank, size);
      return NULL;
    }
  }
  if (flags & NCFSM__HELLO_HEARTBEAT) return "a heartbeat connection's HELLO without a rank";
  return admit(c, rank, size, f->id, buf, n);
}

/* Fix the job's size (rank 0's HELLO, the store's world_size option, or rank 0 hosting it). */
int ncfsm__st_job_size_set(ncfsm__store *s, uint32_t size, const char *from) {
  if (ncfsm__st_charge(s, (uint64_t)size * sizeof *s->ranks) != 0) return -1;
  if (!(s->ranks = calloc(size, sizeof *s->ranks))) {
    ncfsm__st_uncharge(s, (uint64_t)size * sizeof *s->ranks);
    return -1;
  }
  s->job_size = size;
  snprintf(s->job_from, sizeof s->job_from, "%s", from);
  return 0;
}

/* The HELLOs that waited for rank 0's: admitted now, or closed with the reason (a size other
 * than rank 0's, a rank claimed twice, ...). */
static void release_held(ncfsm__store *s) {
  struct sconn *c;
  while ((c = LIST_FIRST(&s->held)) != NULL) {
    LIST_REMOVE(c, hlink);
    c->held = 0;
    char buf[512];
    const char *why = admit(c, c->held_rank, c->held_size, c->held_id, buf, sizeof buf);
    if (why) ncfsm__st_conn_fail(c, c->held_id, why, 0);
  }
}
