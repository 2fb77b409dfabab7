/*
 * The pmix bootstrap's channels (docs/bootstrap.md, "Channels", "pmix: what was measured").
 * No fence: a channel's collectives must not meet the program's own fences (crossed, Open MPI
 * fails them), and fences over the same member list cannot tell two channels apart. A
 * channel's collectives (allgathers, barriers, broadcasts: one sequence of rounds, in the
 * order posted) are rounds r:
 *   - a member that has bytes for round r (every member of an allgather or barrier, a
 *     broadcast's root) PMIx_Put(GLOBAL, "<kbase>.<r>", {u64 r, u8 kind, u32 root, u32 len,
 *     its bytes}) and PMIx_Commit;
 *   - a member PMIx_Get_nb's the others' keys (an allgather: every other member's; a
 *     broadcast: its root's, nothing on the root) until it has them all. A Get of a key not
 *     committed yet answers NOT-FOUND at once once a fence with data collection has run, so
 *     the missing ones are asked again after 1 ms, doubling to 16 ms (PMIX_GET_REFRESH_CACHE),
 *     until the request's timeout. On an error (NOT-FOUND) libpmix 4.2.2 hands the callback a
 *     value it frees itself (releasing it too was a double free, ASan): only a found value is
 *     the callback's.
 * One key per round and member, never overwritten: measured with Open MPI 4.1.4 / PMIx 4.2.2,
 * a key overwritten after the program's fence with data collection read back stale in 5 to 10
 * of 12 reads, whatever the scope or PMIX_GET_REFRESH_CACHE, and PMIx 4.2 cannot delete a
 * committed key; PMIx_Publish/Lookup/Unpublish (deletable) answered only some of the keys
 * looked up and crashed mpirun at its end. So PMIx keeps every round's values until the job
 * ends (docs/bootstrap.md gives the cost). Rounds of one channel go on the wire one at a time
 * (the next once this one completed here); posts queue. kbase is "ncfsm.c.<id>", id a hash of
 * the tag, the members' job ranks, the bootstrap's instance and how many times this process
 * opened that (tag, members) before: the k-th opening on every member meets the k-th on the
 * others, and other channels never share a key.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/event.h>
#include <xxhash.h>

#include "bootstrap/frame.h"
#include "bootstrap/pmix-internal.h"

#define HDR 21 /* u64 round, u8 kind, u32 root, u32 len */
#define POLL_FIRST_MS 1
#define POLL_MAX_MS 16

/* One round's Gets: the PMIx thread writes member i's slot of a batch, the last answer of the
 * batch wakes the channel (under mu, if it still holds the cell). */
typedef struct pcell {
  pthread_mutex_t mu;
  atomic_int refs, left;
  struct event *wake; /* under mu; NULL once the channel let go */
  int n;
  pmix_status_t *rc;
  unsigned char **val;
  size_t *vlen;
} pcell;

/* One Get: PMIx keeps the key and the info until it answers. */
typedef struct pget {
  pcell *cell;
  int i;
  char key[64];
  pmix_info_t info;
} pget;

typedef struct creq {
  TAILQ_ENTRY(creq) link;
  ncfsm_boot_req *req;
  uint64_t round;
} creq;

typedef struct pchan {
  ncfsm_boot *b;
  pmix_impl *p;       /* the job bootstrap's */
  pmix_rank_t *ranks; /* [n] the members' job ranks */
  uint64_t id, next_round;
  char kbase[40];
  TAILQ_HEAD(, creq) q; /* posted, head on the wire */
  pcell *cell;          /* the head's, while it is on the wire */
  uint8_t *have;        /* [n] the head's value of member i is taken */
  struct event *wake, *poll;
  int poll_ms;
} pchan;

static void cell_unref(pcell *c) {
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  for (int i = 0; i < c->n; i++) free(c->val[i]);
  free(c->val);
  free(c->vlen);
  free(c->rc);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static pcell *cell_new(int n, struct event *wake) {
  pcell *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->rc = calloc((size_t)n, sizeof *c->rc);
  c->val = calloc((size_t)n, sizeof *c->val);
  c->vlen = calloc((size_t)n, sizeof *c->vlen);
  pthread_mutex_init(&c->mu, NULL);
  atomic_init(&c->refs, 1);
  c->n = n;
  c->wake = wake;
  if (!c->rc || !c->val || !c->vlen) {
    cell_unref(c);
    return NULL;
  }
  return c;
}

/* The channel lets go of its cell (late answers then only free themselves). */
static void cell_drop(pchan *pc) {
  if (!pc->cell) return;
  pthread_mutex_lock(&pc->cell->mu);
  pc->cell->wake = NULL;
  pthread_mutex_unlock(&pc->cell->mu);
  cell_unref(pc->cell);
  pc->cell = NULL;
  evtimer_del(pc->poll);
}

/* The last answer of a batch hands the cell to the loop thread. */
static void batch_done(pcell *c) {
  if (atomic_fetch_sub(&c->left, 1) != 1) return;
  pthread_mutex_lock(&c->mu);
  if (c->wake) event_active(c->wake, 0, 0);
  pthread_mutex_unlock(&c->mu);
}

/* PMIx's thread. */
static void get_cb(pmix_status_t status, pmix_value_t *kv, void *cbdata) {
  pget *g = cbdata;
  pcell *c = g->cell;
  ncfsm__pmix_quickack();
  free(c->val[g->i]);
  c->val[g->i] = NULL;
  int ours = status == PMIX_SUCCESS && kv; /* an error's kv is not handed over */
  if (status == PMIX_SUCCESS && (!kv || kv->type != PMIX_BYTE_OBJECT)) status = PMIX_ERR_TYPE_MISMATCH;
  if (status == PMIX_SUCCESS && (c->val[g->i] = malloc(kv->data.bo.size + 1))) {
    memcpy(c->val[g->i], kv->data.bo.bytes, kv->data.bo.size);
    c->vlen[g->i] = kv->data.bo.size;
  } else if (status == PMIX_SUCCESS) {
    status = PMIX_ERR_NOMEM;
  }
  c->rc[g->i] = status;
  if (ours) PMIX_VALUE_RELEASE(kv);
  PMIX_INFO_DESTRUCT(&g->info);
  free(g);
  batch_done(c);
  cell_unref(c);
}

static int me_of(const pchan *pc) { return pc->b->rank; }

/* Ask every member whose value of the head round is missing (loop thread); again
 * (refresh) with PMIX_GET_REFRESH_CACHE, so that a server that holds the member's data from a
 * fence asks the member's server again (across nodes; on one node it makes no difference). */
static void ask(pchan *pc, int refresh) {
  pcell *c = pc->cell;
  creq *h = TAILQ_FIRST(&pc->q);
  int n = pc->b->size, missing = 0;
  for (int i = 0; i < n; i++) missing += !pc->have[i];
  atomic_store(&c->left, missing + 1); /* + 1: this loop's, released at its end */
  bool yes = true;
  for (int i = 0; i < n; i++) {
    if (pc->have[i]) continue;
    pget *g = malloc(sizeof *g);
    pmix_status_t rc = PMIX_ERR_NOMEM;
    if (g) {
      g->cell = c;
      g->i = i;
      snprintf(g->key, sizeof g->key, "%s.%" PRIu64, pc->kbase, h->round);
      PMIX_INFO_LOAD(&g->info, PMIX_GET_REFRESH_CACHE, &yes, PMIX_BOOL);
      pmix_proc_t proc;
      PMIX_LOAD_PROCID(&proc, pc->p->me.nspace, pc->ranks[i]);
      atomic_fetch_add(&c->refs, 1);
      rc = PMIx_Get_nb(&proc, g->key, refresh ? &g->info : NULL, refresh ? 1 : 0, get_cb, g);
      if (rc == PMIX_SUCCESS) continue;
      atomic_fetch_sub(&c->refs, 1);
      PMIX_INFO_DESTRUCT(&g->info);
      free(g);
    }
    c->rc[i] = rc; /* no callback will come for it */
    batch_done(c);
  }
  batch_done(c);
}

static void start(pchan *pc);

/* Finish the head with st (and the message, on an error), start the next round. */
static void head_done(pchan *pc, ncfsm_result_t st, const char *msg) {
  creq *h = TAILQ_FIRST(&pc->q);
  cell_drop(pc);
  TAILQ_REMOVE(&pc->q, h, link);
  h->req->impl = NULL;
  if (st != NCFSM_OK) ncfsm__boot_fail(pc->b, st, "%s", msg);
  ncfsm__boot_req_finish(h->req, st);
  free(h);
  if (st != NCFSM_OK) { /* out of step: the queued ones cannot complete either */
    while ((h = TAILQ_FIRST(&pc->q)) != NULL) {
      TAILQ_REMOVE(&pc->q, h, link);
      h->req->impl = NULL;
      ncfsm__boot_req_finish(h->req, st);
      free(h);
    }
    return;
  }
  start(pc);
}

/* The head round's value of member i (one of its hdr fields, then its bytes) is v[0..len). */
static const char *take(pchan *pc, int i, const unsigned char *v, size_t len, char *msg, size_t n) {
  ncfsm_boot_req *req = TAILQ_FIRST(&pc->q)->req;
  uint64_t round = TAILQ_FIRST(&pc->q)->round;
  if (len < HDR) return "stale"; /* not ours */
  uint64_t r = ncfsm__rd64(v);
  if (r < round) return "stale";
  int kind = v[8];
  uint32_t root = ncfsm__rd32(v + 9), vl = ncfsm__rd32(v + 13);
  int mine = req->kind == NCFSM__REQ_BCAST;
  if (r > round || kind != mine || vl != req->len || (mine && root != (uint32_t)req->root)) {
    snprintf(msg, n, "PMIx channel '%s' round %" PRIu64 ": channel rank %d (job rank %u) posted %s "
                     "(%s, %u bytes%s), this rank %s (%zu bytes%s); every member makes the same "
                     "channel collectives in the same order",
             pc->b->chan_tag, round, i, pc->ranks[i], r > round ? "a later round" : "another collective",
             kind ? "a broadcast" : "an allgather", vl, kind ? ", a root" : "",
             mine ? "a broadcast" : "an allgather", req->len, mine ? ", a root" : "");
    return msg;
  }
  size_t have = len - HDR;
  if (!mine && have == req->len && req->len) memcpy((unsigned char *)req->recv + (size_t)i * req->len, v + HDR, req->len);
  if (mine && i == req->root && req->len) {
    if (have != req->len) return "stale";
    memcpy(req->recv, v + HDR, req->len);
  }
  return NULL;
}

/* Loop thread: a batch of answers is in. */
static void wake_cb(evutil_socket_t fd, short what, void *arg) {
  pchan *pc = arg;
  (void)fd;
  (void)what;
  pcell *c = pc->cell;
  if (!c || atomic_load(&c->left) != 0 || TAILQ_EMPTY(&pc->q)) return;
  char msg[600];
  int missing = 0;
  for (int i = 0; i < pc->b->size; i++) {
    if (pc->have[i]) continue;
    pmix_status_t rc = c->rc[i];
    if (rc == PMIX_SUCCESS) {
      const char *bad = take(pc, i, c->val[i], c->vlen[i], msg, sizeof msg);
      if (!bad) {
        pc->have[i] = 1;
        continue;
      }
      if (strcmp(bad, "stale")) return head_done(pc, NCFSM_ERR_BOOTSTRAP, bad);
    } else if (rc != PMIX_ERR_NOT_FOUND && rc != PMIX_ERR_TIMEOUT) {
      snprintf(msg, sizeof msg, "PMIx channel '%s': PMIx_Get_nb of channel rank %d (job rank %u): %s",
               pc->b->chan_tag, i, pc->ranks[i], PMIx_Error_string(rc));
      return head_done(pc, NCFSM_ERR_BOOTSTRAP, msg);
    }
    missing++;
  }
  if (!missing) return head_done(pc, NCFSM_OK, NULL);
  struct timeval tv = {0, pc->poll_ms * 1000};
  evtimer_add(pc->poll, &tv);
  if (pc->poll_ms < POLL_MAX_MS) pc->poll_ms *= 2;
}

static void poll_cb(evutil_socket_t fd, short what, void *arg) {
  pchan *pc = arg;
  (void)fd;
  (void)what;
  if (pc->cell) ask(pc, 1);
}

/* Put the head round's value, commit it and ask the others (loop thread). */
static void start(pchan *pc) {
  creq *h = TAILQ_FIRST(&pc->q);
  if (!h || pc->cell) return;
  ncfsm_boot_req *req = h->req;
  int me = me_of(pc), bc = req->kind == NCFSM__REQ_BCAST, put = !bc || req->root == me;
  size_t dl = put ? req->len : 0;
  unsigned char *v = malloc(HDR + dl + 1);
  char msg[300], key[64];
  if (!v || !(pc->cell = cell_new(pc->b->size, pc->wake))) {
    free(v);
    snprintf(msg, sizeof msg, "PMIx channel '%s': out of memory", pc->b->chan_tag);
    return head_done(pc, NCFSM_ERR_NO_MEMORY, msg);
  }
  pmix_status_t rc = PMIX_SUCCESS;
  if (put) {
    ncfsm__wr64(v, h->round);
    v[8] = (unsigned char)bc;
    ncfsm__wr32(v + 9, bc ? (uint32_t)req->root : 0);
    ncfsm__wr32(v + 13, (uint32_t)req->len);
    if (dl) memcpy(v + HDR, req->send, dl);
    snprintf(key, sizeof key, "%s.%" PRIu64, pc->kbase, h->round);
    pmix_value_t val;
    PMIX_VALUE_CONSTRUCT(&val);
    val.type = PMIX_BYTE_OBJECT;
    val.data.bo.bytes = (char *)v;
    val.data.bo.size = HDR + dl;
    rc = PMIx_Put(PMIX_GLOBAL, key, &val); /* copies */
    if (rc == PMIX_SUCCESS) rc = PMIx_Commit();
  }
  free(v);
  if (rc != PMIX_SUCCESS) {
    snprintf(msg, sizeof msg, "PMIx channel '%s' round %" PRIu64 ": PMIx_Put/PMIx_Commit: %s",
             pc->b->chan_tag, h->round, PMIx_Error_string(rc));
    return head_done(pc, NCFSM_ERR_BOOTSTRAP, msg);
  }
  /* what to get: an allgather every other member's value, a broadcast's receiver the root's */
  for (int i = 0; i < pc->b->size; i++) pc->have[i] = bc ? i != req->root || req->root == me : i == me;
  if (!bc && req->len) memcpy((unsigned char *)req->recv + (size_t)me * req->len, req->send, req->len);
  pc->poll_ms = POLL_FIRST_MS;
  ask(pc, 0);
}

/* An allgather or a broadcast: the next round, queued behind the ones on the wire. */
static ncfsm_result_t chan_post(ncfsm_boot *b, ncfsm_boot_req *req) {
  pchan *pc = b->impl;
  if (req->len > UINT32_MAX - HDR) {
    ncfsm__boot_seterr(b, "PMIx channel '%s': %zu bytes is too large for one PMIx value", b->chan_tag,
                       req->len);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  creq *h = calloc(1, sizeof *h);
  if (!h) return ncfsm__boot_fail(b, NCFSM_ERR_NO_MEMORY, "PMIx channel: out of memory");
  h->req = req;
  h->round = pc->next_round++;
  req->impl = h;
  TAILQ_INSERT_TAIL(&pc->q, h, link);
  start(pc); /* if none is on the wire; finished from the wake, never inside post */
  return NCFSM_OK;
}

static void chan_cancel(ncfsm_boot_req *req) {
  pchan *pc = req->b->impl;
  creq *h = req->impl;
  if (!pc || !h) return;
  int head = h == TAILQ_FIRST(&pc->q);
  if (head) cell_drop(pc);
  TAILQ_REMOVE(&pc->q, h, link);
  free(h);
  req->impl = NULL;
  /* The rounds were numbered at their posts: with one gone (freed, or timed out on the wire)
   * the channel is out of step (the dispatch fails it) and the queued ones cannot complete. */
  while ((h = TAILQ_FIRST(&pc->q)) != NULL) {
    TAILQ_REMOVE(&pc->q, h, link);
    h->req->impl = NULL;
    ncfsm__boot_req_finish(h->req, NCFSM_ERR_BOOTSTRAP);
    free(h);
  }
}

static void chan_describe(ncfsm_boot *b, char *buf, size_t n) {
  pchan *pc = b->impl;
  creq *h = TAILQ_FIRST(&pc->q);
  size_t k = (size_t)snprintf(buf, n, "PMIx channel '%s' round %" PRIu64 " has no value yet from",
                              b->chan_tag, h ? h->round : pc->next_round);
  int named = 0;
  for (int i = 0; i < b->size && k + 40 < n && pc->cell; i++)
    if (!pc->have[i]) {
      k += (size_t)snprintf(buf + k, n - k, "%s channel rank %d (job rank %u)", named++ ? "," : "",
                            i, pc->ranks[i]);
    }
  snprintf(buf + k, n - k, "; it did not open the channel with the same tag and members, or did "
                           "not post it");
}

static void chan_close(ncfsm_boot *b) {
  pchan *pc = b->impl;
  if (!pc) return;
  ncfsm__pmix_reg_del(b);
  cell_drop(pc);
  creq *h;
  while ((h = TAILQ_FIRST(&pc->q)) != NULL) {
    TAILQ_REMOVE(&pc->q, h, link);
    free(h);
  }
  event_free(pc->wake);
  event_free(pc->poll);
  free(pc->ranks);
  free(pc->have);
  free(pc);
  b->impl = NULL;
}

static ncfsm_result_t chan_notice_post(ncfsm_boot *b, const ncfsm_boot_notice *n) {
  pchan *pc = b->impl;
  return ncfsm__pmix_notice_send(b, &pc->p->me, pc->p->inst, pc->id, n);
}

/* How many times this process opened each (tag, members, instance) before. */
static pthread_mutex_t gen_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *gen_key;
static unsigned *gen_count;
static size_t gen_n;

static unsigned generation(uint64_t h) {
  pthread_mutex_lock(&gen_mu);
  size_t i = 0;
  while (i < gen_n && gen_key[i] != h) i++;
  if (i == gen_n) {
    uint64_t *k = realloc(gen_key, (gen_n + 1) * sizeof *k);
    if (k) gen_key = k;
    unsigned *c = k ? realloc(gen_count, (gen_n + 1) * sizeof *c) : NULL;
    if (c) {
      gen_count = c;
      gen_key[gen_n] = h;
      gen_count[gen_n] = 0;
      gen_n++;
    }
  }
  unsigned g = i < gen_n ? gen_count[i]++ : 0;
  pthread_mutex_unlock(&gen_mu);
  return g;
}

ncfsm_result_t ncfsm__pmix_channel_open(ncfsm_boot *parent, ncfsm_boot *child) {
  pmix_impl *p = parent->ops == &ncfsm__boot_pmix_chan_ops ? ((pchan *)parent->impl)->p : parent->impl;
  const pmix_rank_t *pr = parent->ops == &ncfsm__boot_pmix_chan_ops ? ((pchan *)parent->impl)->ranks : NULL;
  pchan *pc = calloc(1, sizeof *pc);
  if (!pc || !(pc->ranks = calloc((size_t)child->size, sizeof *pc->ranks)) ||
      !(pc->have = calloc((size_t)child->size, 1)) ||
      !(pc->wake = event_new(child->base, -1, 0, wake_cb, pc)) ||
      !(pc->poll = evtimer_new(child->base, poll_cb, pc))) {
    if (pc) {
      if (pc->wake) event_free(pc->wake);
      free(pc->ranks);
      free(pc->have);
    }
    free(pc);
    ncfsm__boot_seterr(child, "ncfsm_boot_channel_open: out of memory");
    return NCFSM_ERR_NO_MEMORY;
  }
  XXH64_state_t *st = XXH64_createState();
  if (!st) {
    event_free(pc->wake);
    event_free(pc->poll);
    free(pc->ranks);
    free(pc->have);
    free(pc);
    return NCFSM_ERR_NO_MEMORY;
  }
  XXH64_reset(st, 0x6e6366736d63686eull);
  XXH64_update(st, child->chan_tag, strlen(child->chan_tag) + 1);
  for (int i = 0; i < child->size; i++) {
    int m = child->chan_ranks[i];
    pc->ranks[i] = pr ? pr[m] : (pmix_rank_t)m;
    uint8_t w[4];
    ncfsm__wr32(w, pc->ranks[i]);
    XXH64_update(st, w, 4);
  }
  uint8_t w[4];
  ncfsm__wr32(w, p->inst);
  XXH64_update(st, w, 4);
  uint64_t h = XXH64_digest(st);
  ncfsm__wr32(w, generation(h));
  XXH64_update(st, w, 4);
  pc->id = XXH64_digest(st) | 1; /* never 0, the job's id for notices */
  XXH64_freeState(st);
  snprintf(pc->kbase, sizeof pc->kbase, "ncfsm.c.%016" PRIx64, pc->id);
  pc->b = child;
  pc->p = p;
  TAILQ_INIT(&pc->q);
  child->ops = &ncfsm__boot_pmix_chan_ops;
  child->impl = pc;
  ncfsm__pmix_reg_add(child, p->inst, pc->id, pc->ranks);
  return NCFSM_OK;
}

const ncfsm__boot_ops ncfsm__boot_pmix_chan_ops = {
    .name = "pmix",
    .close = chan_close,
    .post = chan_post,
    .cancel = chan_cancel,
    .describe = chan_describe,
    .bcast_post = chan_post,
    .channel_open = ncfsm__pmix_channel_open,
    .notice_post = chan_notice_post,
    .no_recovery = NCFSM__PMIX_NO_RECOVERY,
};
