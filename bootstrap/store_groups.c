/* The tcp store's groups ("@" is the job, "@/<epoch>..." the survivors of an
 * agreement) and agreements (AGREE): one open per group, epochs increasing, the
 * first poster's timeout; completed, they make the survivors' group. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "bootstrap/store-internal.h"

/* ---- groups and agreements (recovery) -------------------------------------------- */

uint32_t ncfsm__st_group_rank(const struct group *g, uint32_t i) { return g->ranks ? g->ranks[i] : i; }

/* rank's index in g, or -1 (a binary search, through g->order when ranks is not ascending). */
int64_t ncfsm__st_group_index(const struct group *g, uint32_t rank) {
  if (!g->ranks) return rank < g->n ? (int64_t)rank : -1;
  uint32_t lo = 0, hi = g->n;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2, i = g->order ? g->order[mid] : mid;
    if (g->ranks[i] == rank) return i;
    if (g->ranks[i] < rank) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

static const uint32_t *sort_ranks;
static int by_rank(const void *a, const void *b) {
  uint32_t x = sort_ranks[*(const uint32_t *)a], y = sort_ranks[*(const uint32_t *)b];
  return x < y ? -1 : x > y;
}

/* g->order for a ranks array that is not ascending: 0, or -1 when out of memory. */
static int group_order(struct group *g) {
  int sorted = 1;
  for (uint32_t i = 1; g->ranks && i < g->n && sorted; i++) sorted = g->ranks[i - 1] < g->ranks[i];
  if (sorted) return 0;
  if (!(g->order = malloc((size_t)g->n * sizeof *g->order))) return -1;
  for (uint32_t i = 0; i < g->n; i++) g->order[i] = i;
  sort_ranks = g->ranks; /* the store is single-threaded */
  qsort(g->order, g->n, sizeof *g->order, by_rank);
  return 0;
}

struct group *ncfsm__st_group_find(ncfsm__store *s, const void *path, uint32_t plen) {
  struct group *g = NULL;
  HASH_FIND(hh, s->gtab, path, plen, g);
  return g;
}

static void ag_timer_cb(evutil_socket_t fd, short what, void *arg);

/* A new group of n members (ranks: job ranks, distinct, taken over; NULL: every rank of the
 * job), or NULL when max_bytes has no room. */
struct group *ncfsm__st_group_new(ncfsm__store *s, const char *path, uint32_t plen, uint32_t n,
                               uint32_t *ranks) {
  uint64_t cost = sizeof(struct group) + plen + 1 + (uint64_t)n * (ranks ? 9 : 1) + 128;
  if (ncfsm__st_charge(s, cost) != 0) return NULL;
  struct group *g = calloc(1, sizeof *g);
  if (g) {
    g->path = malloc(plen + 1);
    g->posted = calloc(n ? n : 1, 1);
    g->timer = evtimer_new(s->base, ag_timer_cb, g);
  }
  if (g && ranks) {
    g->ranks = ranks;
    g->n = n;
  }
  if (!g || !g->path || !g->posted || !g->timer || group_order(g) != 0) {
    if (g) {
      free(g->order);
      free(g->path);
      free(g->posted);
      if (g->timer) event_free(g->timer);
      free(g);
    }
    ncfsm__st_uncharge(s, cost);
    return NULL;
  }
  g->s = s;
  memcpy(g->path, path, plen);
  g->path[plen] = 0;
  g->plen = plen;
  g->n = n;
  g->ranks = ranks;
  g->charged = cost;
  LIST_INIT(&g->waiters);
  HASH_ADD_KEYPTR(hh, s->gtab, g->path, plen, g);
  if (!g->hh.tbl) { /* uthash could not allocate its table (HASH_NONFATAL_OOM) */
    free(g->order);
    event_free(g->timer);
    free(g->posted);
    free(g->path);
    free(g);
    ncfsm__st_uncharge(s, cost);
    return NULL;
  }
  LIST_INSERT_HEAD(&s->groups, g, link);
  s->st.groups++;
  return g;
}

void ncfsm__st_agwaiter_free(ncfsm__store *s, struct agwaiter *w) {
  LIST_REMOVE(w, by_grp);
  LIST_REMOVE(w, by_conn);
  w->c->parked--;
  ncfsm__st_uncharge(s, sizeof *w);
  free(w);
}

void ncfsm__st_set_msg(ncfsm__store *s, char **slot, const char *msg) {
  if (*slot) {
    ncfsm__st_uncharge(s, strlen(*slot) + 1);
    free(*slot);
  }
  *slot = msg ? strdup(msg) : NULL;
  if (*slot) s->bytes += strlen(msg) + 1; /* bounded: one per group */
}

void ncfsm__st_group_free(ncfsm__store *s, struct group *g) {
  struct agwaiter *w;
  while ((w = LIST_FIRST(&g->waiters)) != NULL) ncfsm__st_agwaiter_free(s, w);
  ncfsm__st_set_msg(s, &g->gone, NULL);
  ncfsm__st_set_msg(s, &g->last_fail, NULL);
  HASH_DEL(s->gtab, g);
  event_free(g->timer);
  free(g->posted);
  free(g->ranks);
  free(g->order);
  free(g->mstate);
  free(g->opened);
  free(g->path);
  ncfsm__st_uncharge(s, g->charged);
  s->st.groups--;
  free(g);
}

/* "rank 3, rank 5 (job rank 7)" of the live members of g with posted[i] ==
 * want (at most 16 named). */
static const char *group_list(ncfsm__store *s, const struct group *g, int want, char *buf,
                              size_t n) {
  size_t k = 0;
  int named = 0, more = 0;
  buf[0] = 0;
  for (uint32_t i = 0; i < g->n; i++) {
    uint32_t r = ncfsm__st_group_rank(g, i);
    if (s->ranks[r].state == RS_GONE || (g->posted[i] != 0) != (want != 0)) continue;
    if (named == 16) {
      more++;
      continue;
    }
    int w = g->ranks ? snprintf(buf + k, n - k, "%srank %u (job rank %u)", named ? ", " : "", i, r)
                     : snprintf(buf + k, n - k, "%srank %u", named ? ", " : "", r);
    if (w < 0 || (size_t)w >= n - k) break;
    k += (size_t)w;
    named++;
  }
  if (more && k < n) snprintf(buf + k, n - k, " and %d more", more);
  if (!named) snprintf(buf, n, "none");
  return buf;
}

/* The open agreement of g fails: every poster gets msg; the epoch is used. */
static void ag_fail(ncfsm__store *s, struct group *g, const char *msg) {
  struct agwaiter *w;
  while ((w = LIST_FIRST(&g->waiters)) != NULL) {
    ncfsm__st_reply_err(w->c, w->id, msg);
    ncfsm__st_agwaiter_free(s, w);
  }
  if (g->open_epoch > g->last_epoch) g->last_epoch = g->open_epoch;
  g->open_epoch = 0;
  event_del(g->timer);
  ncfsm__st_set_msg(s, &g->last_fail, msg);
  s->st.agreements_failed++;
  NCFSM_INFO(SUB, "store: %s", msg);
}

static void ag_timer_cb(evutil_socket_t fd, short what, void *arg) {
  struct group *g = arg;
  (void)fd;
  (void)what;
  if (!g->open_epoch || LIST_EMPTY(&g->waiters)) return;
  ncfsm__store *s = g->s;
  char missing[300], posted[300], msg[800];
  snprintf(msg, sizeof msg, "agreement epoch %" PRIu64 " of group %s not complete after %" PRIu64
                            " ms: %s did not post it (posted: %s); every live rank must post the "
                            "same epoch, or raise NCFSM_BOOTSTRAP_TIMEOUT_MS",
           g->open_epoch, g->path, g->timeout_ms, group_list(s, g, 0, missing, sizeof missing),
           group_list(s, g, 1, posted, sizeof posted));
  ag_fail(s, g, msg);
}

/* Complete g's open agreement if every member not gone has posted. */
void ncfsm__st_ag_eval(ncfsm__store *s, struct group *g) {
  if (!g->open_epoch) return;
  uint32_t cnt = 0;
  for (uint32_t i = 0; i < g->n; i++) {
    if (s->ranks[ncfsm__st_group_rank(g, i)].state == RS_GONE) continue;
    if (!g->posted[i]) return;
    cnt++;
  }
  uint64_t epoch = g->open_epoch;
  if (cnt == 0 || LIST_EMPTY(&g->waiters)) { /* every poster is gone: nobody to answer */
    g->open_epoch = 0;
    g->last_epoch = epoch;
    event_del(g->timer);
    return;
  }
  char path[NCFSM__FRAME_KEY_MAX + 32], msg[300];
  int pl = snprintf(path, sizeof path, "%s/%" PRIu64, g->path, epoch);
  if (pl < 0 || (uint32_t)pl + 24 > s->o.key_max) {
    snprintf(msg, sizeof msg, "agreement epoch %" PRIu64 " of group %.64s: survivors' groups nested "
                              "too deep (the group name would pass the %u-byte key limit)",
             epoch, g->path, s->o.key_max);
    return ag_fail(s, g, msg);
  }
  uint32_t *ranks = malloc((size_t)cnt * sizeof *ranks);
  struct group *child = NULL;
  struct blob *res = NULL;
  if (ranks) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < g->n; i++) {
      uint32_t r = ncfsm__st_group_rank(g, i);
      if (g->posted[i] && s->ranks[r].state != RS_GONE) ranks[k++] = r;
    }
    child = ncfsm__st_group_new(s, path, (uint32_t)pl, cnt, ranks);
    if (!child) free(ranks);
  }
  if (child) res = ncfsm__st_blob_new(s, s->job_size);
  if (!res) {
    snprintf(msg, sizeof msg, "agreement epoch %" PRIu64 " of group %.64s: store full (no room for "
                              "the survivors' group; raise --max-bytes)",
             epoch, g->path);
    return ag_fail(s, g, msg);
  }
  memset(res->data, 0, res->len);
  for (uint32_t k = 0; k < cnt; k++) res->data[child->ranks[k]] = 1;
  struct agwaiter *w;
  while ((w = LIST_FIRST(&g->waiters)) != NULL) {
    ncfsm__st_reply_blob(w->c, w->id, res);
    ncfsm__st_agwaiter_free(s, w);
  }
  ncfsm__st_blob_unref(res);
  g->open_epoch = 0;
  g->last_epoch = epoch;
  event_del(g->timer);
  s->st.agreements_done++;
  NCFSM_INFO(SUB, "store: agreement epoch %" PRIu64 " of group %s complete: %u of %u ranks (group %s)",
             epoch, g->path, cnt, g->n, child->path);
}



/* AGREE: key = group, value = u64 epoch, u32 timeout ms. */
const char *ncfsm__st_handle_agree(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n) {
  ncfsm__store *s = c->s;
  if (!c->ranked)
    return ncfsm__st_reply_err(c, f->id, "AGREE needs a ranked connection: HELLO with this rank and the job "
                               "size (size > 0)"),
           NULL;
  if (s->conflict) return ncfsm__st_reply_err(c, f->id, s->conflict), NULL;
  uint64_t epoch = ncfsm__rd64(f->value);
  uint32_t tmo = ncfsm__rd32(f->value + 8);
  struct group *g = ncfsm__st_group_find(s, f->key, f->klen);
  if (!g && f->klen == 1 && f->key[0] == '@') {
    g = ncfsm__st_group_new(s, "@", 1, s->job_size, NULL);
    if (!g) return ncfsm__st_reply_err(c, f->id, "store full (NCFSM store max bytes)"), NULL;
  }
  char msg[800];
  if (!g) {
    snprintf(msg, sizeof msg, "AGREE in group %.*s: no such group (no agreement made it)",
             (int)(f->klen < 80 ? f->klen : 80), (const char *)f->key);
    return ncfsm__st_reply_err(c, f->id, msg), NULL;
  }
  int64_t idx = ncfsm__st_group_index(g, c->rank);
  if (idx < 0) {
    snprintf(msg, sizeof msg, "AGREE in group %s by job rank %u, which is not in it", g->path, c->rank);
    return ncfsm__st_reply_err(c, f->id, msg), NULL;
  }
  char who[60];
  if (g->ranks) snprintf(who, sizeof who, "rank %lld (job rank %u)", (long long)idx, c->rank);
  else snprintf(who, sizeof who, "rank %u", c->rank);
  if (epoch == 0 || epoch <= g->last_epoch) {
    snprintf(msg, sizeof msg, "agreement epoch %" PRIu64 " of group %s posted by %s: not above the "
                              "group's last agreement epoch %" PRIu64 "%s%s%s; every live rank posts "
                              "the same increasing epoch",
             epoch, g->path, who, g->last_epoch, g->last_fail ? " (which failed: " : "",
             g->last_fail ? g->last_fail : "", g->last_fail ? ")" : "");
    return ncfsm__st_reply_err(c, f->id, msg), NULL;
  }
  if (g->open_epoch && g->open_epoch != epoch) {
    char posted[300];
    snprintf(msg, sizeof msg, "agreement epochs differ in group %s: %s posted epoch %" PRIu64
                              " while %s posted epoch %" PRIu64 "; every live rank must post the "
                              "same epoch (both fail; post a higher one on every rank)",
             g->path, who, epoch, group_list(s, g, 1, posted, sizeof posted), g->open_epoch);
    uint64_t hi = epoch > g->open_epoch ? epoch : g->open_epoch;
    ag_fail(s, g, msg);
    g->last_epoch = hi;
    return ncfsm__st_reply_err(c, f->id, msg), NULL;
  }
  if (g->open_epoch && g->posted[idx]) {
    snprintf(msg, sizeof msg, "agreement epoch %" PRIu64 " of group %s: %s posted it twice", epoch,
             g->path, who);
    return ncfsm__st_reply_err(c, f->id, msg), NULL;
  }
  if (c->parked >= s->o.max_parked) return ncfsm__st_parked_why(c, buf, n);
  struct agwaiter *w = NULL;
  if (ncfsm__st_charge(s, sizeof *w) != 0) return ncfsm__st_reply_err(c, f->id, "store full (NCFSM store max bytes)"), NULL;
  if (!(w = calloc(1, sizeof *w))) {
    ncfsm__st_uncharge(s, sizeof *w);
    return ncfsm__st_reply_err(c, f->id, "store out of memory"), NULL;
  }
  uint64_t dl = ncfsm__now_ns() + (uint64_t)tmo * 1000000ull;
  if (!g->open_epoch) {
    g->open_epoch = epoch;
    memset(g->posted, 0, g->n);
    g->deadline_ns = 0;
  }
  if (!g->deadline_ns || dl < g->deadline_ns) { /* the first poster's timeout (or a shorter one) */
    g->deadline_ns = dl;
    g->timeout_ms = tmo;
    struct timeval tv = ncfsm__st_ms_tv(tmo);
    evtimer_add(g->timer, &tv);
  }
  w->c = c;
  w->g = g;
  w->id = f->id;
  c->parked++;
  LIST_INSERT_HEAD(&g->waiters, w, by_grp);
  LIST_INSERT_HEAD(&c->agw, w, by_conn);
  g->posted[idx] = 1;
  ncfsm__st_ag_eval(s, g);
  return NULL;
}
