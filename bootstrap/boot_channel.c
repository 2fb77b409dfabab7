/*
 * The bootstraps made from a bootstrap: channels and survivors' bootstraps.
 *
 * Channels (docs/bootstrap.md, "Channels"): ncfsm_boot_channel_open checks the tag and the
 * members, makes the channel's handle (a bootstrap of its own whose rank i is members[i]) and
 * lets the implementation join it; the parent keeps a list of its open channels, closes them
 * with itself (ncfsm__boot_chan_orphan: refused while one has a request out), and passes its
 * peer-loss reports on to them (boot_notify.c).
 *
 * Survivors' bootstraps (docs/bootstrap.md, "Peer loss, agreement and the survivors'
 * bootstrap"): an agreement's result (its request is boot.c's), and the bootstrap over the
 * agreed ranks (ncfsm_boot_survivors).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/boot-internal.h"

#define BOOT_OK(b) ((b) && (b)->magic == NCFSM__BOOT_MAGIC)

const char *ncfsm_boot_channel_tag(const ncfsm_boot *b) { return BOOT_OK(b) ? b->chan_tag : NULL; }

int ncfsm__boot_chan_index(const ncfsm_boot *b, int r) {
  for (int i = 0; i < b->size; i++)
    if (b->chan_ranks[i] == r) return i;
  return -1;
}

/* What is left of a channel whose parent was closed: a handle that fails every call until
 * its owner closes it. */
static void orphan_close(ncfsm_boot *b) { (void)b; }
static ncfsm_result_t orphan_post(ncfsm_boot *b, ncfsm_boot_req *req) {
  (void)req;
  return b->failed;
}
static const ncfsm__boot_ops orphan_ops = {.name = "closed", .close = orphan_close, .post = orphan_post};

bool ncfsm__boot_chan_busy(const ncfsm_boot *b) {
  if (b->live_reqs > 0) return true;
  for (const ncfsm_boot *c = b->chans; c; c = c->chan_next)
    if (ncfsm__boot_chan_busy(c)) return true;
  return false;
}

void ncfsm__boot_chan_orphan(ncfsm_boot *c) {
  while (c->chans) ncfsm__boot_chan_orphan(c->chans); /* its own channels first */
  c->ops->close(c); /* its members see it leave, while the parent's transport is still there */
  ncfsm__boot_chan_unlink(c);
  c->parent = NULL;
  c->impl = NULL;
  c->ops = &orphan_ops;
  ncfsm__boot_fail(c, NCFSM_ERR_BOOTSTRAP,
                   "channel '%s': its parent bootstrap was closed (ncfsm_boot_close); close this handle too",
                   c->chan_tag);
}

void ncfsm__boot_chan_unlink(ncfsm_boot *b) {
  ncfsm_boot *p = b->parent;
  if (!p) return; /* orphaned: its parent was closed */
  for (ncfsm_boot **q = &p->chans; *q; q = &(*q)->chan_next)
    if (*q == b) {
      *q = b->chan_next;
      p->nchans--;
      return;
    }
}

/* NULL, or what is wrong with tag (into buf). */
static const char *tag_problem(const char *tag, char *buf, size_t n) {
  if (!tag || !*tag) return "the tag is empty";
  size_t len = strnlen(tag, NCFSM_BOOT_TAG_MAX + 1);
  if (len > NCFSM_BOOT_TAG_MAX) {
    snprintf(buf, n, "the tag '%.40s...' is longer than %d bytes", tag, NCFSM_BOOT_TAG_MAX);
    return buf;
  }
  for (size_t i = 0; i < len; i++) {
    char c = tag[i];
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
        c == '_' || c == '-')
      continue;
    snprintf(buf, n, "the tag '%s' has the byte 0x%02x at %zu (a tag is letters, digits and . _ -)",
             tag, (unsigned char)c, i);
    return buf;
  }
  return NULL;
}

/* Check members[0..n) against b (NULL/0: every rank); the list in *out (malloc'd). */
static ncfsm_result_t members_take(ncfsm_boot *b, const char *tag, const int *members, int n,
                                   int **out, int *nout) {
  if (!members || n == 0) n = b->size;
  if (n < 1 || n > b->size) {
    ncfsm__boot_seterr(b, "ncfsm_boot_channel_open('%s'): %d members; a channel has 1 to %d (the "
                          "bootstrap's size)",
                       tag, n, b->size);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  int *m = malloc((size_t)n * sizeof *m);
  unsigned char *seen = calloc((size_t)b->size, 1);
  if (!m || !seen) {
    free(m);
    free(seen);
    return NCFSM_ERR_NO_MEMORY;
  }
  int me = 0;
  for (int i = 0; i < n; i++) {
    int r = members ? members[i] : i;
    const char *bad = r < 0 || r >= b->size ? "is not a rank of the bootstrap"
                      : seen[r]             ? "is listed twice"
                                            : NULL;
    if (bad) {
      ncfsm__boot_seterr(b, "ncfsm_boot_channel_open('%s'): member %d (rank %d) %s (ranks 0 to %d, "
                            "each once)",
                         tag, i, r, bad, b->size - 1);
      free(m);
      free(seen);
      return NCFSM_ERR_INVALID_ARGUMENT;
    }
    seen[r] = 1;
    m[i] = r;
    me |= r == b->rank;
  }
  free(seen);
  if (!me) {
    ncfsm__boot_seterr(b, "ncfsm_boot_channel_open('%s'): rank %d (this rank) is not among the %d "
                          "members; only members open a channel",
                       tag, b->rank, n);
    free(m);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  *out = m;
  *nout = n;
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_boot_channel_open(ncfsm_boot *b, const char *tag, const int *members, int n,
                                       ncfsm_boot **out) {
  if (out) *out = NULL;
  if (!BOOT_OK(b) || !out) return NCFSM_ERR_INVALID_ARGUMENT;
  char buf[160];
  const char *bad = tag_problem(tag, buf, sizeof buf);
  if (bad) {
    ncfsm__boot_seterr(b, "ncfsm_boot_channel_open: %s", bad);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (!b->ops->channel_open) {
    ncfsm__boot_seterr(b, "ncfsm_boot_channel_open('%s'): the %s bootstrap has no channels", tag,
                       b->ops->name);
    return NCFSM_ERR_UNSUPPORTED;
  }
  for (ncfsm_boot *c = b->chans; c; c = c->chan_next)
    if (!strcmp(c->chan_tag, tag)) {
      ncfsm__boot_seterr(b, "ncfsm_boot_channel_open('%s'): a channel of that tag is already open on "
                            "this bootstrap; close it first (one channel per tag)",
                         tag);
      return NCFSM_ERR_BUSY;
    }
  if (b->failed != NCFSM_OK) return b->failed; /* b->err says why */
  int *m = NULL;
  ncfsm_result_t r = members_take(b, tag, members, n, &m, &n);
  if (r != NCFSM_OK) return r;
  ncfsm_boot *c = ncfsm__boot_shell_new(b->base, b->ops, b->kind);
  if (!c || !(c->chan_tag = strdup(tag))) {
    if (c) ncfsm__boot_shell_free(c);
    free(m);
    return NCFSM_ERR_NO_MEMORY;
  }
  c->chan_ranks = m;
  c->size = n;
  for (int i = 0; i < n; i++)
    if (m[i] == b->rank) c->rank = i;
  c->local_rank = b->local_rank;
  c->local_size = b->local_size;
  c->timeout_ms = b->timeout_ms;
  c->parent = b;
  if ((r = b->ops->channel_open(b, c)) != NCFSM_OK) {
    ncfsm__boot_seterr(b, "%s", c->err[0] ? c->err : ncfsm_strerror(r));
    ncfsm__boot_shell_free(c);
    return r;
  }
  c->chan_next = b->chans;
  b->chans = c;
  b->nchans++;
  for (int i = 0; i < n; i++) { /* members lost before it was opened */
    const char *why = ncfsm__boot_lost_why(b, m[i]);
    if (!why) continue;
    char w2[700];
    snprintf(w2, sizeof w2, "rank %d of channel '%s' is rank %d of its parent: %.600s", i, tag, m[i],
             why);
    ncfsm__boot_peer_lost(c, i, w2);
  }
  NCFSM_INFO(NCFSM__SUB_BOOT, "bootstrap %s: channel '%s' open: rank %d of %d (rank %d of %d of its "
                              "parent)",
             b->ops->name, tag, c->rank, c->size, b->rank, b->size);
  *out = c;
  return NCFSM_OK;
}

/* ---- survivors' bootstraps ------------------------------------------------------------- */

ncfsm_result_t ncfsm__boot_unsupported(ncfsm_boot *b, const char *call) {
  ncfsm__boot_seterr(b, "%s: %s", call,
                     b->ops->no_recovery ? b->ops->no_recovery
                                         : "not supported by this bootstrap");
  return NCFSM_ERR_UNSUPPORTED;
}

ncfsm_result_t ncfsm__boot_on_channel(ncfsm_boot *b, const char *call) {
  ncfsm__boot_seterr(b, "%s on channel '%s': a channel has no agreements or survivors' bootstraps of "
                        "its own; make them on the bootstrap it was opened from",
                     call, b->chan_tag);
  return NCFSM_ERR_UNSUPPORTED;
}

ncfsm_result_t ncfsm_boot_agree_result(ncfsm_boot_req *req, uint8_t *alive, int *nalive) {
  if (!req || req->magic != NCFSM__BOOT_REQ_MAGIC || req->kind != NCFSM__REQ_AGREE)
    return NCFSM_ERR_INVALID_ARGUMENT;
  if (req->status != NCFSM_OK) return req->status;
  if (alive) memcpy(alive, req->alive, (size_t)req->b->size);
  if (nalive) *nalive = req->nalive;
  return NCFSM_OK;
}

ncfsm_result_t ncfsm_boot_survivors(ncfsm_boot *b, ncfsm_boot_req *agreed, ncfsm_boot **out) {
  if (out) *out = NULL;
  if (!BOOT_OK(b) || !out) return NCFSM_ERR_INVALID_ARGUMENT;
  if (!b->ops->survivors) return ncfsm__boot_unsupported(b, "ncfsm_boot_survivors");
  if (b->chan_tag) return ncfsm__boot_on_channel(b, "ncfsm_boot_survivors");
  if (!agreed || agreed->magic != NCFSM__BOOT_REQ_MAGIC || agreed->kind != NCFSM__REQ_AGREE ||
      agreed->b != b) {
    ncfsm__boot_seterr(b, "ncfsm_boot_survivors: the request is not an agreement of this bootstrap "
                          "(pass the request of ncfsm_boot_agree_post on it)");
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (agreed->status != NCFSM_OK) {
    ncfsm__boot_seterr(b, "ncfsm_boot_survivors: agreement epoch %" PRIu64 " %s; wait until it "
                          "completes with NCFSM_OK",
                       agreed->epoch, agreed->status == NCFSM_ERR_AGAIN ? "has not finished"
                                                                        : "failed");
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (agreed->child_made) {
    ncfsm__boot_seterr(b, "ncfsm_boot_survivors: the survivors' bootstrap of agreement epoch %" PRIu64
                          " was made already (one per agreement)",
                       agreed->epoch);
    return NCFSM_ERR_BUSY;
  }
  if (!agreed->alive[b->rank]) {
    ncfsm__boot_seterr(b, "ncfsm_boot_survivors: rank %d is not in agreement epoch %" PRIu64
                          " (the store counted it as lost)",
                       b->rank, agreed->epoch);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  ncfsm_boot *c = ncfsm__boot_shell_new(b->base, b->ops, b->kind);
  if (!c) return NCFSM_ERR_NO_MEMORY;
  c->rank = 0;
  for (int r = 0; r < b->rank; r++) c->rank += agreed->alive[r] ? 1 : 0;
  c->size = agreed->nalive;
  c->local_rank = b->local_rank;
  c->local_size = b->local_size;
  c->timeout_ms = b->timeout_ms;
  c->parent = b;
  ncfsm_result_t r = b->ops->survivors(b, agreed, c);
  if (r != NCFSM_OK) {
    ncfsm__boot_seterr(b, "%s", c->err);
    ncfsm__boot_shell_free(c);
    return r;
  }
  agreed->child_made = 1;
  b->children++;
  NCFSM_INFO(NCFSM__SUB_BOOT, "bootstrap %s: survivors of epoch %" PRIu64 ": rank %d of %d "
                              "(was %d of %d)",
             b->ops->name, agreed->epoch, c->rank, c->size, b->rank, b->size);
  *out = c;
  return NCFSM_OK;
}
