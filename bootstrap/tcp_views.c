/*
 * The tcp bootstrap's views of its connection besides the job's: peer loss, agreements (one
 * AGREE frame in the view's group) and survivors' views ("@/<epoch>..."), channels
 * ("@#<tag>": a CHAN frame opens one, CHAN_CLOSE closes it; their collectives are GATHERs and
 * BCASTs "<group>:ag/<n>" as a survivors' view's), and notices (NOTICE frames both ways,
 * keyed by the view's group).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "bootstrap/tcp-client.h"

#define SUB NCFSM__SUB_BOOT

/* The view of group path[0..n), or NULL. */
static tcp_view *view_of(tcp_impl *t, const uint8_t *path, uint32_t n) {
  if (n == 1 && path[0] == '@') return &t->root;
  tcp_view *v;
  LIST_FOREACH(v, &t->views, link)
    if (strlen(v->path) == n && !memcmp(v->path, path, n)) return v;
  return NULL;
}

/* The store says a job rank was lost: tell the job's view and the survivors' views it
 * belongs to (their channels hear it from them: boot_notify.c). A LOST keyed by a channel: a
 * member closed that channel (value = its index there). */
void ncfsm__tcp_on_lost(tcp_impl *t, const ncfsm__frame *f) {
  uint32_t rank = ncfsm__rd32(f->value);
  char why[600];
  snprintf(why, sizeof why, "%.*s", (int)(f->vlen - 4 > 500 ? 500 : f->vlen - 4),
           (const char *)f->value + 4);
  tcp_view *v;
  if (f->klen) {
    if ((v = view_of(t, f->key, f->klen)) && v->chan && rank < (uint32_t)v->b->size)
      ncfsm__boot_peer_lost(v->b, (int)rank, why);
    return;
  }
  if (rank >= (uint32_t)t->b->size) return;
  ncfsm__boot_peer_lost(t->b, (int)rank, why);
  LIST_FOREACH(v, &t->views, link)
    for (int i = 0; i < v->b->size && !v->chan; i++)
      if (v->ranks[i] == rank) {
        char w2[700];
        snprintf(w2, sizeof w2, "survivors' rank %d of %.100s is job %.500s", i, v->path, why);
        ncfsm__boot_peer_lost(v->b, i, w2);
      }
}

void ncfsm__tcp_on_agree_reply(tcp_impl *t, ncfsm_boot_req *req, const ncfsm__frame *f) {
  ncfsm_boot *b = req->b;
  tcp_view *v = b->impl;
  if (f->type == NCFSM__F_ERR) {
    ncfsm__boot_seterr(b, "store %s refused agreement epoch %" PRIu64 ": %.*s", t->addr, req->epoch,
                       (int)f->vlen, (const char *)f->value);
    return ncfsm__boot_req_finish(req, NCFSM_ERR_BOOTSTRAP);
  }
  if (f->vlen != (uint32_t)t->b->size) {
    ncfsm__boot_seterr(b, "store %s answered agreement epoch %" PRIu64 " with %u bytes, expected %d",
                       t->addr, req->epoch, f->vlen, t->b->size);
    return ncfsm__boot_req_finish(req, NCFSM_ERR_BOOTSTRAP);
  }
  req->nalive = 0;
  for (int i = 0; i < b->size; i++) {
    uint32_t r = v->ranks ? v->ranks[i] : (uint32_t)i;
    req->alive[i] = f->value[r] ? 1 : 0;
    req->nalive += req->alive[i];
  }
  ncfsm__boot_req_finish(req, NCFSM_OK);
}

/* ---- recovery ------------------------------------------------------------------ */
ncfsm_result_t ncfsm__tcp_agree_post(ncfsm_boot *b, ncfsm_boot_req *req) {
  tcp_view *view = b->impl;
  tcp_impl *t = view->t;
  if (t->dead) {
    ncfsm__boot_seterr(b, "agreement epoch %" PRIu64 ": the connection to store %s is lost: %s",
                       req->epoch, t->addr, t->b->err);
    return NCFSM_ERR_BOOTSTRAP;
  }
  tcp_op *op = ncfsm__tcp_op_new(t, req);
  if (!op) return NCFSM_ERR_NO_MEMORY;
  uint8_t v[12];
  ncfsm__wr64(v, req->epoch);
  ncfsm__wr32(v + 8, b->timeout_ms > UINT32_MAX ? UINT32_MAX : (uint32_t)b->timeout_ms);
  if (ncfsm__tcp_send(t, NCFSM__F_AGREE, op->id, view->path, strlen(view->path), v, sizeof v, NULL, 0)) {
    free(op);
    ncfsm__boot_seterr(b, "tcp agreement: out of memory");
    return NCFSM_ERR_NO_MEMORY;
  }
  TAILQ_INSERT_TAIL(&t->ops, op, link);
  req->impl = op;
  return NCFSM_OK;
}

/* The store names the ranks that did not post when the first poster's
 * timeout passes; this runs agree_grace_ms later, when it did not answer. */
ncfsm_result_t ncfsm__tcp_agree_expire(ncfsm_boot_req *req, char *msg, size_t n) {
  tcp_view *v = req->b->impl;
  ncfsm__tcp_cancel(req);
  char what[256] = "";
  ncfsm__tcp_describe(req->b, what, sizeof what);
  snprintf(msg, n, "tcp agreement epoch %" PRIu64 " of group %s: no answer after %" PRIu64
                   " ms (%s): the store should have failed it naming the ranks that did not post",
           req->epoch, v->path, req->b->timeout_ms + ncfsm__boot_tcp_ops.agree_grace_ms, what);
  return NCFSM_ERR_BOOTSTRAP;
}

ncfsm_result_t ncfsm__tcp_survivors(ncfsm_boot *parent, ncfsm_boot_req *agreed, ncfsm_boot *child) {
  tcp_view *pv = parent->impl;
  tcp_impl *t = pv->t;
  tcp_view *v = calloc(1, sizeof *v);
  uint32_t *ranks = calloc((size_t)child->size, sizeof *ranks);
  int pl = v ? snprintf(v->path, sizeof v->path, "%s/%" PRIu64, pv->path, agreed->epoch) : 0;
  if (!v || !ranks) {
    free(v);
    free(ranks);
    ncfsm__boot_seterr(child, "ncfsm_boot_survivors: out of memory");
    return NCFSM_ERR_NO_MEMORY;
  }
  if (pl + 24 > (int)NCFSM__FRAME_KEY_MAX) {
    free(v);
    free(ranks);
    ncfsm__boot_seterr(child, "ncfsm_boot_survivors: survivors' bootstraps nested too deep (the "
                              "group name would pass the store's %u-byte key limit)",
                       NCFSM__FRAME_KEY_MAX);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  int k = 0;
  for (int i = 0; i < parent->size; i++)
    if (agreed->alive[i]) ranks[k++] = pv->ranks ? pv->ranks[i] : (uint32_t)i;
  v->t = t;
  v->b = child;
  v->ranks = ranks;
  LIST_INSERT_HEAD(&t->views, v, link);
  child->impl = v;
  if (t->dead) {
    snprintf(child->err, sizeof child->err, "%s", t->b->err);
    ncfsm__boot_set_failed(child, NCFSM_ERR_BOOTSTRAP);
  }
  for (int i = 0; i < child->size; i++) { /* members lost since the agreement */
    const char *why = ncfsm__boot_lost_why(t->b, (int)ranks[i]);
    if (why) {
      char w2[700];
      snprintf(w2, sizeof w2, "survivors' rank %d of %.100s is job %.500s", i, v->path, why);
      ncfsm__boot_peer_lost(child, i, w2);
    }
  }
  return NCFSM_OK;
}

/* ---- channels --------------------------------------------------------------------- */

/* Finish every request of view v (the channel was refused: they cannot complete). */
static void fail_view_ops(tcp_impl *t, tcp_view *v) {
  for (tcp_op *op = TAILQ_FIRST(&t->ops), *next; op; op = next) {
    next = TAILQ_NEXT(op, link);
    if (op->view != v && (!op->req || op->req->b != v->b)) continue;
    TAILQ_REMOVE(&t->ops, op, link);
    if (op->req) {
      op->req->impl = NULL;
      ncfsm__boot_req_finish(op->req, NCFSM_ERR_BOOTSTRAP);
    }
    free(op);
  }
}

void ncfsm__tcp_on_chan_reply(tcp_impl *t, tcp_view *v, const ncfsm__frame *f) {
  if (f->type != NCFSM__F_ERR) return;
  ncfsm__boot_fail(v->b, NCFSM_ERR_BOOTSTRAP, "store %s refused channel '%s': %.*s", t->addr,
                   v->b->chan_tag, (int)(f->vlen > 400 ? 400 : f->vlen), (const char *)f->value);
  fail_view_ops(t, v);
}

/* CHAN "@#<tag>": u32 n, then the members as job ranks in the channel's order. */
ncfsm_result_t ncfsm__tcp_channel_open(ncfsm_boot *parent, ncfsm_boot *child) {
  tcp_view *pv = parent->impl;
  tcp_impl *t = pv->t;
  tcp_view *v = calloc(1, sizeof *v);
  uint32_t *ranks = calloc((size_t)child->size, sizeof *ranks);
  uint8_t *val = malloc(4 + 4 * (size_t)child->size);
  tcp_op *op = ncfsm__tcp_op_new(t, NULL);
  if (!v || !ranks || !val || !op) {
    free(v);
    free(ranks);
    free(val);
    free(op);
    ncfsm__boot_seterr(child, "ncfsm_boot_channel_open: out of memory");
    return NCFSM_ERR_NO_MEMORY;
  }
  int pl = snprintf(v->path, sizeof v->path, "@#%s", child->chan_tag);
  ncfsm__wr32(val, (uint32_t)child->size);
  for (int i = 0; i < child->size; i++) {
    int pr = child->chan_ranks[i];
    ranks[i] = pv->ranks ? pv->ranks[pr] : (uint32_t)pr;
    ncfsm__wr32(val + 4 + 4 * (size_t)i, ranks[i]);
  }
  v->t = t;
  v->b = child;
  v->ranks = ranks;
  v->chan = 1;
  op->view = v;
  int err = !t->dead && ncfsm__tcp_send(t, NCFSM__F_CHAN, op->id, v->path, (size_t)pl, val,
                                        4 + 4 * (size_t)child->size, NULL, 0);
  free(val);
  if (err) {
    free(v);
    free(ranks);
    free(op);
    ncfsm__boot_seterr(child, "ncfsm_boot_channel_open: out of memory");
    return NCFSM_ERR_NO_MEMORY;
  }
  if (t->dead) {
    free(op);
    snprintf(child->err, sizeof child->err, "%s", t->b->err);
    ncfsm__boot_set_failed(child, NCFSM_ERR_BOOTSTRAP);
  } else {
    TAILQ_INSERT_TAIL(&t->ops, op, link);
  }
  LIST_INSERT_HEAD(&t->views, v, link);
  child->impl = v;
  return NCFSM_OK;
}

void ncfsm__tcp_view_close(tcp_view *v) {
  tcp_impl *t = v->t;
  if (v->chan) {
    if (!t->dead) ncfsm__tcp_send(t, NCFSM__F_CHAN_CLOSE, 0, v->path, strlen(v->path), NULL, 0, NULL, 0);
    fail_view_ops(t, v); /* its CHAN, if not answered yet */
  }
  LIST_REMOVE(v, link);
  free(v->ranks);
  free(v);
}

/* ---- notices ---------------------------------------------------------------------- */

ncfsm_result_t ncfsm__tcp_notice_post(ncfsm_boot *b, const ncfsm_boot_notice *n) {
  tcp_view *v = b->impl;
  tcp_impl *t = v->t;
  if (t->dead || b->failed != NCFSM_OK) return b->failed != NCFSM_OK ? b->failed : NCFSM_ERR_BOOTSTRAP;
  uint8_t w[NCFSM__NOTICE_WIRE_MAX];
  size_t len = ncfsm__notice_encode(n, w);
  if (ncfsm__tcp_send(t, NCFSM__F_NOTICE, 0, v->path, strlen(v->path), w, len, NULL, 0))
    return NCFSM_ERR_NO_MEMORY;
  return NCFSM_OK;
}

/* A NOTICE pushed by the store: for the view of its group. */
void ncfsm__tcp_on_notice(tcp_impl *t, const ncfsm__frame *f) {
  tcp_view *v = view_of(t, f->key, f->klen);
  ncfsm_boot_notice n;
  if (!v || ncfsm__notice_decode(f->value, f->vlen, &n) != 0) return;
  if (n.origin < 0 || n.origin >= v->b->size || n.origin == v->b->rank) return;
  ncfsm__boot_notice_push(v->b, &n);
}
