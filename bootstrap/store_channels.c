/*
 * The tcp store's channels and notices (issue 21; docs/bootstrap.md, "Channels", "Notices").
 *
 * A channel is a group "@#<tag>" whose members (job ranks, in the channel's order) the first
 * CHAN fixes; every other member's CHAN must name the same list. Its GATHERs and BCASTs
 * ("@#<tag>:ag/<n>") run as a survivors' group's do, from members that opened it only. A
 * member that closes it (CHAN_CLOSE) or whose connection ends has left: the open collectives
 * that need it fail naming it, later ones fail at once, and (a close) the other members get a
 * LOST keyed by the channel. Once every member left, the channel and its entries are freed.
 * Each rank may hold max_channels channels (counted from its CHAN until the channel is
 * freed), so no rank can make the store hold unbounded channel state.
 *
 * NOTICE: pushed, unchanged, to every other connected member of the group named by its key
 * (the job "@", a survivors' group, a channel: the members that opened it); a connection may
 * send notices_per_s a second (a token bucket, burst the same), more are dropped and counted.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/store-internal.h"

static const char *tag_of(const struct group *g) { return g->path + 2; }

/* Drop g's entries (open ones fail for whoever still waits), then g. */
static void chan_free(ncfsm__store *s, struct group *g) {
  struct entry *e, *next;
  char msg[200];
  snprintf(msg, sizeof msg, "channel '%.64s' closed by every member", tag_of(g));
  HASH_ITER(hh, s->tab, e, next) {
    if (e->grp != g) continue;
    if (!e->failed && e->gather) ncfsm__st_gather_fail(s, e, msg);
    ncfsm__st_entry_delete(s, e);
  }
  for (uint32_t i = 0; i < g->n; i++)
    if (g->opened[i] && s->ranks[g->ranks[i]].chans) s->ranks[g->ranks[i]].chans--;
  s->st.chans_held--;
  NCFSM_TRACE(SUB, "store: channel '%s' freed", tag_of(g));
  LIST_REMOVE(g, link);
  ncfsm__st_group_free(s, g);
}

/* Member i of channel g left (CM_CLOSED or CM_GONE); g may be freed. */
static void chan_left(ncfsm__store *s, struct group *g, uint32_t i, uint8_t state) {
  if (g->mstate[i] == CM_CLOSED || g->mstate[i] == CM_GONE) return;
  g->mstate[i] = state;
  if (++g->ndone == g->n) chan_free(s, g);
}

void ncfsm__st_chan_rank_gone(ncfsm__store *s, uint32_t rank) {
  for (struct group *g = LIST_FIRST(&s->groups), *next; g; g = next) {
    next = LIST_NEXT(g, link);
    if (!g->chan) continue;
    int64_t i = ncfsm__st_group_index(g, rank);
    if (i >= 0) chan_left(s, g, (uint32_t)i, CM_GONE);
  }
}

/* The job ranks of a CHAN value into a new array: NULL with the reason in buf when they are not
 * n distinct job ranks that include the sender. */
static uint32_t *chan_members(struct sconn *c, const ncfsm__frame *f, uint32_t *n, char *buf,
                              size_t len) {
  ncfsm__store *s = c->s;
  *n = ncfsm__rd32(f->value);
  if (*n > s->job_size) {
    snprintf(buf, len, "a channel of %u members in a job of %u ranks", *n, s->job_size);
    return NULL;
  }
  uint32_t *r = malloc((size_t)*n * sizeof *r);
  uint8_t *seen = calloc(s->job_size, 1);
  int me = 0;
  for (uint32_t i = 0; r && seen && i < *n; i++) {
    r[i] = ncfsm__rd32(f->value + 4 + 4 * (size_t)i);
    if (r[i] >= s->job_size || seen[r[i]]) {
      snprintf(buf, len, "channel member %u is job rank %u: %s", i, r[i],
               r[i] >= s->job_size ? "not a rank of the job" : "listed twice");
      free(r);
      free(seen);
      return NULL;
    }
    seen[r[i]] = 1;
    me |= r[i] == c->rank;
  }
  if (!r || !seen) snprintf(buf, len, "store out of memory");
  else if (!me) snprintf(buf, len, "job rank %u opened a channel it is not a member of", c->rank);
  free(seen);
  if (!r || !me) {
    free(r);
    return NULL;
  }
  return r;
}

static const char *tag_ok(const ncfsm__frame *f) {
  if (f->klen - 2 > 64) return "the tag is longer than 64 bytes";
  for (uint32_t i = 2; i < f->klen; i++) {
    uint8_t ch = f->key[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '.' || ch == '_' || ch == '-'))
      return "the tag has a byte that is not a letter, a digit or . _ -";
  }
  return NULL;
}

/* "0, 2, 3" of n job ranks (at most 16, then "..."). */
static const char *list(const uint32_t *r, uint32_t n, char *buf, size_t len) {
  size_t k = 0;
  buf[0] = 0;
  for (uint32_t i = 0; i < n && i < 16 && k + 16 < len; i++)
    k += (size_t)snprintf(buf + k, len - k, "%s%u", i ? ", " : "", r[i]);
  if (n > 16) snprintf(buf + k, len - k, ", ... (%u)", n);
  return buf;
}

/* CHAN: key "@#<tag>", value u32 n + n job ranks. OK, or ERR with the reason (the client's
 * channel then fails); NULL (nothing makes the connection close). */
const char *ncfsm__st_handle_chan(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n) {
  ncfsm__store *s = c->s;
  (void)buf;
  (void)n;
  char msg[700], why[200];
  const char *bad = !c->ranked   ? "CHAN needs a ranked connection (HELLO with a rank and the job size)"
                    : s->conflict ? s->conflict
                                  : tag_ok(f);
  uint32_t nm = 0, *m = NULL;
  if (!bad && !(m = chan_members(c, f, &nm, why, sizeof why))) bad = why;
  struct group *g = bad ? NULL : ncfsm__st_group_find(s, f->key, f->klen);
  if (!bad && g && !g->chan) bad = "the key names a group that is not a channel";
  int64_t idx = -1;
  if (!bad && g && (g->n != nm || memcmp(g->ranks, m, (size_t)nm * sizeof *m))) {
    char a[200], b2[200];
    snprintf(msg, sizeof msg, "channel '%.*s' is open with the members (job ranks) [%s]; job rank "
                              "%u opened it with [%s]: every member opens a channel with the same "
                              "tag and members",
             (int)f->klen - 2, (const char *)f->key + 2, list(g->ranks, g->n, a, sizeof a), c->rank,
             list(m, nm, b2, sizeof b2));
    bad = msg;
  } else if (!bad && g) {
    idx = ncfsm__st_group_index(g, c->rank);
    if (g->mstate[idx] != CM_NONE) {
      snprintf(msg, sizeof msg, "channel '%.64s': job rank %u %s; a member opens a channel once, "
                                "until every member closed it",
               tag_of(g), c->rank,
               g->mstate[idx] == CM_OPEN ? "opened it already" : "left it already");
      bad = msg;
    }
  }
  if (!bad && s->ranks[c->rank].chans >= s->o.max_channels) {
    snprintf(msg, sizeof msg, "job rank %u holds %u channels, the store's limit (--max-channels / "
                              "NCFSM_STORE_MAX_CHANNELS): a channel counts until every member "
                              "closed it; close channels, or raise the limit",
             c->rank, s->ranks[c->rank].chans);
    bad = msg;
  }
  if (!bad && !g) {
    uint64_t extra = 2ull * nm;
    g = ncfsm__st_charge(s, extra) == 0 ? ncfsm__st_group_new(s, (const char *)f->key, f->klen, nm, m)
                                        : NULL;
    if (g) {
      m = NULL; /* the group owns it */
      g->charged += extra;
      g->chan = 1;
      g->mstate = calloc(nm, 1);
      g->opened = calloc(nm, 1);
      s->st.chans_held++;
    } else {
      ncfsm__st_uncharge(s, extra);
    }
    if (!g || !g->mstate || !g->opened) {
      if (g) {
        s->st.chans_held--;
        LIST_REMOVE(g, link);
        ncfsm__st_group_free(s, g);
      }
      bad = "store full (no room for the channel; raise --max-bytes)";
      g = NULL;
    } else {
      for (uint32_t i = 0; i < nm; i++) /* members gone already: its collectives fail by name */
        if (s->ranks[g->ranks[i]].state == RS_GONE) {
          g->mstate[i] = CM_GONE;
          g->ndone++;
          if (!g->gone) ncfsm__st_set_msg(s, &g->gone, s->ranks[g->ranks[i]].why);
        }
      idx = ncfsm__st_group_index(g, c->rank);
    }
  }
  free(m);
  if (bad) {
    s->st.chans_refused++;
    NCFSM_INFO(SUB, "store: refused CHAN %.*s of job rank %u: %s", (int)(f->klen < 80 ? f->klen : 80),
               (const char *)f->key, c->ranked ? c->rank : 0, bad);
    ncfsm__st_reply_err(c, f->id, bad);
    return NULL;
  }
  g->mstate[idx] = CM_OPEN;
  g->opened[idx] = 1;
  s->ranks[c->rank].chans++;
  s->st.chans_opened++;
  ncfsm__st_reply(c, NCFSM__F_OK, f->id, NULL, 0);
  return NULL;
}

/* CHAN_CLOSE: the member leaves; no reply. */
void ncfsm__st_handle_chan_close(struct sconn *c, const ncfsm__frame *f) {
  ncfsm__store *s = c->s;
  struct group *g = c->ranked ? ncfsm__st_group_find(s, f->key, f->klen) : NULL;
  int64_t i = g && g->chan ? ncfsm__st_group_index(g, c->rank) : -1;
  if (i < 0 || g->mstate[i] != CM_OPEN) {
    NCFSM_TRACE(SUB, "store: CHAN_CLOSE %.*s from %s: not open there", (int)(f->klen < 80 ? f->klen : 80),
                (const char *)f->key, c->peer);
    return;
  }
  char why[300], who[120];
  snprintf(why, sizeof why, "rank %lld of channel '%.64s' (job rank %u) closed the channel",
           (long long)i, tag_of(g), c->rank);
  if (!g->gone) ncfsm__st_set_msg(s, &g->gone, why);
  snprintf(who, sizeof who, "job rank %u (%s)", c->rank, c->peer);
  ncfsm__st_member_left(s, g, c->rank, who, "closed the channel before", "ncfsm_boot_close on that rank", "");
  uint8_t v[4 + 300];
  size_t wl = strlen(why);
  ncfsm__wr32(v, (uint32_t)i);
  memcpy(v + 4, why, wl);
  for (uint32_t k = 0; k < g->n; k++) {
    struct sconn *o = s->ranks[g->ranks[k]].c;
    if (k == (uint32_t)i || g->mstate[k] != CM_OPEN || !o || o->released || o->closing) continue;
    ncfsm__st_push_keyed(o, NCFSM__F_LOST, f->key, f->klen, v, (uint32_t)(4 + wl));
    s->st.lost_pushed++;
  }
  chan_left(s, g, (uint32_t)i, CM_CLOSED);
}

/* May c send one more notice now (its token bucket)? */
static int notice_allowed(struct sconn *c) {
  ncfsm__store *s = c->s;
  uint64_t now = ncfsm__now_ns();
  double cap = s->o.notices_per_s;
  if (!c->nt_last_ns) c->nt_tokens = cap;
  else c->nt_tokens += (double)(now - c->nt_last_ns) * 1e-9 * cap;
  if (c->nt_tokens > cap) c->nt_tokens = cap;
  c->nt_last_ns = now;
  if (c->nt_tokens < 1.0) return 0;
  c->nt_tokens -= 1.0;
  return 1;
}

static void push_notice(ncfsm__store *s, struct sconn *o, const ncfsm__frame *f) {
  if (!o || !o->ranked || o->released || o->closing) return;
  ncfsm__st_push_keyed(o, NCFSM__F_NOTICE, f->key, f->klen, f->value, f->vlen);
  s->st.notices_out++;
}

/* NOTICE: key = group, value = a notice whose origin is the sender's index in it. */
void ncfsm__st_handle_notice(struct sconn *c, const ncfsm__frame *f) {
  ncfsm__store *s = c->s;
  s->st.notices_in++;
  struct group *g = NULL;
  int whole = f->klen == 1; /* "@": the job */
  if (!whole && c->ranked) g = ncfsm__st_group_find(s, f->key, f->klen);
  int64_t idx = !c->ranked ? -1 : whole ? (int64_t)c->rank : g ? ncfsm__st_group_index(g, c->rank) : -1;
  const char *bad = idx < 0                                       ? "not a member of that group"
                    : g && g->chan && g->mstate[idx] != CM_OPEN   ? "it has not opened that channel"
                    : ncfsm__rd32(f->value + 8) != (uint32_t)idx  ? "its origin is not its rank there"
                    : !notice_allowed(c)                          ? "over its notices_per_s"
                                                                  : NULL;
  if (bad) {
    s->st.notices_dropped++;
    ncfsm__st_warn_limited(s, W_NOTICE, "store: dropped a NOTICE of %.*s from %s (rank %d): %s",
                           (int)(f->klen < 80 ? f->klen : 80), (const char *)f->key, c->peer,
                           c->ranked ? (int)c->rank : -1, bad);
    return;
  }
  if (whole) {
    struct sconn *o;
    LIST_FOREACH(o, &s->conns, link)
      if (o != c && !o->hb) push_notice(s, o, f);
    return;
  }
  for (uint32_t k = 0; k < g->n; k++)
    if (k != (uint32_t)idx && (!g->chan || g->mstate[k] == CM_OPEN))
      push_notice(s, s->ranks[g->ranks[k]].c, f);
}
