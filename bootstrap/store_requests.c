/* The tcp store's requests after HELLO: SET, GET/WAIT, ADD, GATHER, BCAST, and
 * the dispatch of a frame to its handler (CHAN, CHAN_CLOSE, NOTICE: store_channels.c). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/store-internal.h"

/* ---- requests ---------------------------------------------------------------- */

const char *ncfsm__st_parked_why(struct sconn *c, char *buf, size_t n) {
  c->s->st.closed_parked++;
  snprintf(buf, n, "more than %u parked requests on one connection (raise --max-parked / "
                   "NCFSM_STORE_MAX_PARKED)",
           c->s->o.max_parked);
  return buf;
}

static void handle_set(struct sconn *c, const ncfsm__frame *f) {
  ncfsm__store *s = c->s;
  struct entry *e = ncfsm__st_table_get(s, f->key, f->klen, 1);
  if (!e) return ncfsm__st_reply_err(c, f->id, "store full (NCFSM store max bytes)");
  if (e->gather) return ncfsm__st_reply_err(c, f->id, "key is in use by a GATHER");
  struct blob *v = ncfsm__st_blob_new(s, f->vlen);
  if (!v) {
    ncfsm__st_reply_err(c, f->id, "store full (NCFSM store max bytes)");
    return ncfsm__st_entry_maybe_drop(s, e);
  }
  memcpy(v->data, f->value, f->vlen);
  if (e->val) ncfsm__st_blob_unref(e->val);
  e->val = v;
  ncfsm__st_reply(c, NCFSM__F_OK, f->id, NULL, 0);
  ncfsm__st_wake_waiters(s, e);
}

static const char *handle_get(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n) {
  struct entry *e = ncfsm__st_table_get(c->s, f->key, f->klen, 1);
  if (!e) return ncfsm__st_reply_err(c, f->id, "store full (NCFSM store max bytes)"), NULL;
  if (e->gather) return ncfsm__st_reply_err(c, f->id, "key is in use by a GATHER"), NULL;
  if (e->val) {
    if (f->type == NCFSM__F_GET) ncfsm__st_reply_blob(c, f->id, e->val);
    else ncfsm__st_reply(c, NCFSM__F_OK, f->id, NULL, 0);
    return NULL;
  }
  const char *why = ncfsm__st_park(c, e, f->type, f->id);
  if (!why) return NULL;
  ncfsm__st_entry_maybe_drop(c->s, e);
  if (!strcmp(why, "parked")) return ncfsm__st_parked_why(c, buf, n);
  ncfsm__st_reply_err(c, f->id, why);
  return NULL;
}

static void handle_add(struct sconn *c, const ncfsm__frame *f) {
  ncfsm__store *s = c->s;
  struct entry *e = ncfsm__st_table_get(s, f->key, f->klen, 1);
  if (!e) return ncfsm__st_reply_err(c, f->id, "store full (NCFSM store max bytes)");
  if (e->gather) return ncfsm__st_reply_err(c, f->id, "key is in use by a GATHER");
  if (e->val && e->val->len != 8) return ncfsm__st_reply_err(c, f->id, "ADD on a key that is not a counter");
  if (!e->val || e->val->refs > 1) { /* new, or copy on write: queued replies keep the old value */
    struct blob *v = ncfsm__st_blob_new(s, 8);
    if (!v) {
      ncfsm__st_reply_err(c, f->id, "store full (NCFSM store max bytes)");
      return ncfsm__st_entry_maybe_drop(s, e);
    }
    if (e->val) {
      memcpy(v->data, e->val->data, 8);
      ncfsm__st_blob_unref(e->val);
    } else memset(v->data, 0, 8);
    e->val = v;
  }
  uint64_t v = ncfsm__rd64(e->val->data) + ncfsm__rd64(f->value); /* wraps like int64 */
  ncfsm__wr64(e->val->data, v);
  ncfsm__st_reply(c, NCFSM__F_OK, f->id, e->val->data, 8);
  ncfsm__st_wake_waiters(s, e);
}

/* The group of a GATHER/BCAST frame by rank (key "<group>:..." for a survivors' group, else
 * the job's, *grp NULL): 0; -1 when the request was refused with an ERR; 1 when the
 * connection must be closed with buf (a rank claiming another's place). */
static int frame_group(struct sconn *c, const ncfsm__frame *f, uint32_t rank, const char *what,
                       struct group **grp, char *buf, size_t n) {
  ncfsm__store *s = c->s;
  if (f->key[0] != '@') {
    if (rank == c->rank) return 0;
    snprintf(buf, n, "%s as rank %u on the connection of rank %u", what, rank, c->rank);
    return 1;
  }
  const uint8_t *colon = memchr(f->key, ':', f->klen);
  struct group *g = colon ? ncfsm__st_group_find(s, f->key, (uint32_t)(colon - f->key)) : NULL;
  if (!g || !g->ranks) {
    snprintf(buf, n, "%s %.*s: no survivors' group or channel %.*s (no agreement or CHAN made it)",
             what, (int)(f->klen < 80 ? f->klen : 80), (const char *)f->key,
             (int)(colon ? colon - f->key : 0), (const char *)f->key);
    ncfsm__st_reply_err(c, f->id, buf);
    return -1;
  }
  int64_t idx = ncfsm__st_group_index(g, c->rank);
  if (g->chan && (idx < 0 || g->mstate[idx] != CM_OPEN)) { /* refused, not closed: a CHAN the
                                                              store refused is a channel error */
    snprintf(buf, n, "%s %.*s: job rank %u has %s channel '%s'", what,
             (int)(f->klen < 100 ? f->klen : 100), (const char *)f->key, c->rank,
             idx < 0 ? "no place in" : g->mstate[idx] == CM_NONE ? "not opened" : "left",
             g->path + 2);
    ncfsm__st_reply_err(c, f->id, buf);
    return -1;
  }
  if (idx < 0 || (uint32_t)idx != rank) {
    snprintf(buf, n, "%s in group %s as index %u by job rank %u, whose index there is %lld", what,
             g->path, rank, c->rank, (long long)idx);
    return 1;
  }
  *grp = g;
  return 0;
}

static const char *handle_gather(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n) {
  ncfsm__store *s = c->s;
  uint32_t rank = ncfsm__rd32(f->value), size = ncfsm__rd32(f->value + 4), len = f->vlen - 8;
  if (!c->ranked)
    return ncfsm__st_reply_err(c, f->id, "GATHER needs a ranked connection: HELLO with this rank and the "
                               "job size (size > 0)"),
           NULL;
  struct group *grp = NULL;
  int how = frame_group(c, f, rank, "GATHER", &grp, buf, n);
  if (how) return how < 0 ? NULL : buf;
  char k[48];
  struct entry *e = ncfsm__st_table_get(s, f->key, f->klen, 0);
  if (e && e->failed) return ncfsm__st_reply_err(c, f->id, e->failed), NULL;
  if (e && e->bcast) return ncfsm__st_reply_err(c, f->id, "key is in use by a BCAST"), NULL;
  if ((!e || !e->gather) && grp) {
    if (s->conflict) return ncfsm__st_reply_err(c, f->id, s->conflict), NULL;
    if (grp->gone) {
      char msg[600];
      snprintf(msg, sizeof msg, "allgather %.*s cannot complete: %s", (int)(f->klen < 80 ? f->klen : 80),
               (const char *)f->key, grp->gone);
      return ncfsm__st_reply_err(c, f->id, msg), NULL;
    }
    if (size != grp->n) {
      snprintf(buf, n, "GATHER of size %u in group %s of %u ranks", size, grp->path, grp->n);
      return ncfsm__st_reply_err(c, f->id, buf), NULL;
    }
  } else if (!e || !e->gather) {
    if (s->conflict) return ncfsm__st_reply_err(c, f->id, s->conflict), NULL;
    if (s->n_gone && !s->o.rejoin) {
      char msg[600];
      const struct rankslot *g = &s->ranks[s->first_gone];
      snprintf(msg, sizeof msg, "allgather %.*s cannot complete: %s; see rank %u's log",
               (int)(f->klen < 40 ? f->klen : 40), (const char *)f->key,
               g->why ? g->why : "a rank disconnected", s->first_gone);
      return ncfsm__st_reply_err(c, f->id, msg), NULL;
    }
    if (size != s->job_size) {
      snprintf(buf, n, "GATHER of size %u in a job of %u ranks", size, s->job_size);
      return ncfsm__st_reply_err(c, f->id, buf), NULL;
    }
  }
  if (!e) e = ncfsm__st_table_get(s, f->key, f->klen, 1);
  if (!e) return ncfsm__st_reply_err(c, f->id, "store full (NCFSM store max bytes)"), NULL;
  if (!e->gather) {
    if (e->val || !LIST_EMPTY(&e->waiters))
      return ncfsm__st_reply_err(c, f->id, "key is in use by SET/GET"), NULL;
    uint64_t total = (uint64_t)size * len;
    if (total > SIZE_MAX / 2 || ncfsm__st_charge(s, size) != 0) {
      ncfsm__st_reply_err(c, f->id, "GATHER larger than the store's max bytes");
      ncfsm__st_entry_maybe_drop(s, e);
      return NULL;
    }
    e->g_buf = ncfsm__st_blob_new(s, (size_t)total);
    e->g_have = calloc(size, 1);
    if (!e->g_buf || !e->g_have) {
      if (e->g_buf) ncfsm__st_blob_unref(e->g_buf);
      free(e->g_have);
      e->g_buf = NULL;
      e->g_have = NULL;
      ncfsm__st_uncharge(s, size);
      ncfsm__st_reply_err(c, f->id, "GATHER larger than the store's max bytes");
      ncfsm__st_entry_maybe_drop(s, e);
      return NULL;
    }
    e->gather = 1;
    e->grp = grp;
    e->g_size = size;
    e->g_len = len;
    LIST_INSERT_HEAD(&s->gathers, e, g_link);
  }
  if (e->g_size != size || e->g_len != len) {
    char msg[160];
    snprintf(msg, sizeof msg, "GATHER mismatch: rank %u posted size %u len %u, others size %u len %u",
             rank, size, len, e->g_size, e->g_len);
    return ncfsm__st_reply_err(c, f->id, msg), NULL;
  }
  if (e->g_have[rank]) return ncfsm__st_reply_err(c, f->id, "GATHER: this rank already contributed"), NULL;
  const char *why = ncfsm__st_park(c, e, NCFSM__F_GATHER, f->id);
  if (why) {
    if (!strcmp(why, "parked")) return ncfsm__st_parked_why(c, buf, n);
    return ncfsm__st_reply_err(c, f->id, why), NULL;
  }
  e->g_have[rank] = 1;
  memcpy(e->g_buf->data + (size_t)rank * len, f->value + 8, len);
  if (++e->g_count < e->g_size) return NULL;
  NCFSM_TRACE(SUB, "store: allgather %s complete (%u ranks x %u bytes)", ncfsm__st_key_str(e, k, sizeof k),
              size, len);
  struct waiter *w;
  while ((w = LIST_FIRST(&e->waiters)) != NULL) {
    ncfsm__st_reply_blob(w->c, w->id, e->g_buf);
    ncfsm__st_waiter_free(s, w);
  }
  ncfsm__st_entry_delete(s, e);
  return NULL;
}

/* BCAST: key = "bc/<n>" or "<group>:bc/<n>"; value = u32 rank, u32 size, u32 root, u32 len,
 * then on root the len bytes. Root's bytes are one blob that every reply references (values
 * of COPY_MAX bytes or less are copied: a reference costs a chain of its own); a receiver that
 * posts before root is parked. The entry goes once root posted and every member posted or is
 * gone; root gone before posting fails it for every member, by name. */
static const char *handle_bcast(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n) {
  ncfsm__store *s = c->s;
  uint32_t rank = ncfsm__rd32(f->value), size = ncfsm__rd32(f->value + 4);
  uint32_t root = ncfsm__rd32(f->value + 8), len = ncfsm__rd32(f->value + 12);
  char k[48], msg[600];
  if (!c->ranked)
    return ncfsm__st_reply_err(c, f->id, "BCAST needs a ranked connection: HELLO with this rank and the "
                               "job size (size > 0)"),
           NULL;
  struct group *grp = NULL;
  int how = frame_group(c, f, rank, "BCAST", &grp, buf, n);
  if (how) return how < 0 ? NULL : buf;
  struct entry *e = ncfsm__st_table_get(s, f->key, f->klen, 0);
  if (e && e->failed) return ncfsm__st_reply_err(c, f->id, e->failed), NULL;
  if (e && e->gather && !e->bcast) return ncfsm__st_reply_err(c, f->id, "key is in use by a GATHER"), NULL;
  if (!e || !e->gather) {
    if (s->conflict) return ncfsm__st_reply_err(c, f->id, s->conflict), NULL;
    uint32_t members = grp ? grp->n : s->job_size;
    if (size != members) {
      snprintf(buf, n, "BCAST of size %u in %s of %u ranks", size, grp ? grp->path : "a job",
               members);
      return ncfsm__st_reply_err(c, f->id, buf), NULL;
    }
    const struct rankslot *rs = &s->ranks[grp ? grp->ranks[root] : root];
    if (rs->state == RS_GONE) {
      snprintf(msg, sizeof msg, "broadcast %.*s cannot complete: its root is gone: %s",
               (int)(f->klen < 80 ? f->klen : 80), (const char *)f->key,
               rs->why ? rs->why : "it disconnected");
      return ncfsm__st_reply_err(c, f->id, msg), NULL;
    }
    if (!e) e = ncfsm__st_table_get(s, f->key, f->klen, 1);
    if (!e) return ncfsm__st_reply_err(c, f->id, "store full (NCFSM store max bytes)"), NULL;
    if (e->val || !LIST_EMPTY(&e->waiters))
      return ncfsm__st_reply_err(c, f->id, "key is in use by SET/GET"), NULL;
    int charged = ncfsm__st_charge(s, size) == 0;
    if (!charged || !(e->g_have = calloc(size, 1))) {
      if (charged) ncfsm__st_uncharge(s, size);
      ncfsm__st_reply_err(c, f->id, "store full (NCFSM store max bytes)");
      ncfsm__st_entry_maybe_drop(s, e);
      return NULL;
    }
    e->gather = 1;
    e->bcast = 1;
    e->grp = grp;
    e->g_size = size;
    e->g_len = len;
    e->b_root = root;
    LIST_INSERT_HEAD(&s->gathers, e, g_link);
    for (uint32_t i = 0; i < size; i++) /* members gone already count as served */
      if (s->ranks[grp ? grp->ranks[i] : i].state == RS_GONE) {
        e->g_have[i] = 2;
        e->g_count++;
      }
  }
  if (e->g_size != size || e->g_len != len || e->b_root != root) {
    snprintf(msg, sizeof msg, "broadcast %s failed: rank %u posted it with root %u and %u bytes, "
                              "the ranks before it with root %u and %u bytes; every rank must make "
                              "the same broadcasts in the same order",
             ncfsm__st_key_str(e, k, sizeof k), rank, root, len, e->b_root, e->g_len);
    ncfsm__st_gather_fail(s, e, msg);
    return ncfsm__st_reply_err(c, f->id, msg), NULL;
  }
  if (e->g_have[rank]) return ncfsm__st_reply_err(c, f->id, "BCAST: this rank already posted it"), NULL;
  if (rank == root) {
    struct blob *v = ncfsm__st_blob_new(s, len);
    if (!v) {
      snprintf(msg, sizeof msg, "broadcast %s failed: store full (%u bytes from root %u; raise "
                                "--max-bytes)",
               ncfsm__st_key_str(e, k, sizeof k), len, root);
      ncfsm__st_gather_fail(s, e, msg);
      return ncfsm__st_reply_err(c, f->id, msg), NULL;
    }
    memcpy(v->data, f->value + 16, len);
    e->g_buf = v;
    e->g_have[rank] = 1;
    e->g_count++;
    ncfsm__st_reply(c, NCFSM__F_OK, f->id, NULL, 0);
    struct waiter *w;
    while ((w = LIST_FIRST(&e->waiters)) != NULL) {
      ncfsm__st_reply_blob(w->c, w->id, v);
      ncfsm__st_waiter_free(s, w);
    }
  } else if (e->g_buf) {
    ncfsm__st_reply_blob(c, f->id, e->g_buf);
    e->g_have[rank] = 1;
    e->g_count++;
  } else {
    const char *why = ncfsm__st_park(c, e, NCFSM__F_BCAST, f->id);
    if (why) {
      if (!strcmp(why, "parked")) return ncfsm__st_parked_why(c, buf, n);
      return ncfsm__st_reply_err(c, f->id, why), NULL;
    }
    e->g_have[rank] = 1;
    e->g_count++;
  }
  ncfsm__st_bcast_maybe_done(s, e);
  return NULL;
}

const char *ncfsm__st_handle(struct sconn *c, const ncfsm__frame *f, char *buf, size_t n) {
  c->s->st.frames++;
  if (f->type == NCFSM__F_HELLO) return ncfsm__st_handle_hello(c, f, buf, n);
  if (c->held)
    return "a request before the store answered the HELLO (it answers once rank 0's HELLO gave "
           "the job's size)";
  if (!c->authed) return "first frame is not HELLO";
  if (f->type == NCFSM__F_PING) return NULL; /* heard: nothing to answer */
  if (c->hb) return "a request on a heartbeat connection (only PING)";
  switch (f->type) {
  case NCFSM__F_SET: handle_set(c, f); return NULL;
  case NCFSM__F_GET:
  case NCFSM__F_WAIT: return handle_get(c, f, buf, n);
  case NCFSM__F_ADD: handle_add(c, f); return NULL;
  case NCFSM__F_GATHER: return handle_gather(c, f, buf, n);
  case NCFSM__F_AGREE: return ncfsm__st_handle_agree(c, f, buf, n);
  case NCFSM__F_BCAST: return handle_bcast(c, f, buf, n);
  case NCFSM__F_CHAN: return ncfsm__st_handle_chan(c, f, buf, n);
  case NCFSM__F_CHAN_CLOSE: ncfsm__st_handle_chan_close(c, f); return NULL;
  case NCFSM__F_NOTICE: ncfsm__st_handle_notice(c, f); return NULL;
  default: return "reply frame (OK/ERR) sent to the server";
  }
}
