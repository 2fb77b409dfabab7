/*
 * The pmix bootstrap's notices (docs/bootstrap.md, "Notices"): PMIx_Notify_event of the code
 * NCFSM_PMIX_NOTICE (in PMIx's range for users, below PMIX_EXTERNAL_ERR_BASE) with one info,
 * "ncfsm.notice", a byte object: u32 instance, u64 id (0: the job's bootstrap, else the
 * channel's), then the notice's wire form. One handler per process (registered after
 * PMIx_Init) finds the bootstrap or channel of (instance, id) in a registry and queues the
 * notice for its loop thread (ncfsm__boot_notice_push), under the registry's mutex, which a
 * bootstrap's close takes to leave it.
 *
 * Range PMIX_RANGE_LOCAL: measured with Open MPI 4.1.4's mpirun (PMIx 4.2.2, one node),
 * PMIX_RANGE_NAMESPACE, SESSION and GLOBAL notices reached no other process (the server hands
 * them to ORTE, which delivered none, and passed only the first of a burst on), LOCAL reached
 * every process of the node, CUSTOM too but with an ORTE error logged per notice. So a notice
 * reaches the ranks of the poster's node (docs/bootstrap.md has the measurements).
 *
 * Latency: a notice that the PMIx server sends to a client soon after another reply to it
 * (a Get's, a fence's) waited about 43 ms: the server's socket sends small writes with
 * Nagle's algorithm, and the client's kernel delays its ACK of the reply (40 ms). The PMIx
 * client library sets neither; ncfsm__pmix_quickack finds the client's TCP connection to its
 * server (the address of PMIX_SERVER_URI*) and asks for the ACK at once (TCP_QUICKACK) after
 * each answer this bootstrap takes from PMIx: measured, the notices' worst case fell from
 * 43-45 ms to 1.5 ms (again for docs/results/bootstrap-channels-2026-12-02.md: 41.7-46.7 ms
 * without it, 0.85-2.7 ms with it).
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include "bootstrap/frame.h"
#include "bootstrap/pmix-internal.h"

#define NCFSM_PMIX_NOTICE (PMIX_EXTERNAL_ERR_BASE - 1021)
#define NOTICE_KEY "ncfsm.notice"
#define NOTICE_NINFO 2 /* the notice, PMIX_EVENT_NON_DEFAULT */

typedef struct preg {
  LIST_ENTRY(preg) link;
  ncfsm_boot *b;
  unsigned inst;
  uint64_t id;
  pmix_rank_t *ranks; /* [b->size] members' job ranks; NULL: the job's */
} preg;

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static LIST_HEAD(, preg) regs = LIST_HEAD_INITIALIZER(regs);
static size_t hdlr_id;
static int hdlr_on;

void ncfsm__pmix_reg_add(ncfsm_boot *b, unsigned inst, uint64_t id, const pmix_rank_t *ranks) {
  preg *r = calloc(1, sizeof *r);
  if (r && ranks && (r->ranks = malloc((size_t)b->size * sizeof *ranks)))
    memcpy(r->ranks, ranks, (size_t)b->size * sizeof *ranks);
  if (!r || (ranks && !r->ranks)) {
    NCFSM_WARN(NCFSM__SUB_BOOT, "pmix bootstrap rank %d: out of memory: it will not hear notices",
               b->rank);
    free(r);
    return;
  }
  r->b = b;
  r->inst = inst;
  r->id = id;
  pthread_mutex_lock(&reg_mu);
  LIST_INSERT_HEAD(&regs, r, link);
  pthread_mutex_unlock(&reg_mu);
}

void ncfsm__pmix_reg_del(ncfsm_boot *b) {
  pthread_mutex_lock(&reg_mu);
  preg *r;
  LIST_FOREACH(r, &regs, link) if (r->b == b) break;
  if (r) LIST_REMOVE(r, link);
  pthread_mutex_unlock(&reg_mu);
  if (r) free(r->ranks);
  free(r);
}

/* PMIx's thread: a notice of another process. */
static void on_event(size_t id, pmix_status_t status, const pmix_proc_t *source, pmix_info_t info[],
                     size_t ninfo, pmix_info_t *results, size_t nresults,
                     pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata) {
  ncfsm__pmix_quickack();
  (void)id;
  (void)status;
  (void)results;
  (void)nresults;
  for (size_t i = 0; i < ninfo; i++) {
    if (strcmp(info[i].key, NOTICE_KEY) || info[i].value.type != PMIX_BYTE_OBJECT) continue;
    const uint8_t *p = (const uint8_t *)info[i].value.data.bo.bytes;
    size_t len = info[i].value.data.bo.size;
    ncfsm_boot_notice n;
    if (len < 12 || ncfsm__notice_decode(p + 12, len - 12, &n) != 0) break;
    unsigned inst = ncfsm__rd32(p);
    uint64_t cid = ncfsm__rd64(p + 4);
    pthread_mutex_lock(&reg_mu);
    preg *r;
    LIST_FOREACH(r, &regs, link) {
      if (r->inst != inst || r->id != cid) continue;
      ncfsm_boot *b = r->b; /* the sender must be the member it says it is, and not this rank */
      pmix_rank_t src = source ? source->rank : PMIX_RANK_UNDEF;
      if (n.origin < 0 || n.origin >= b->size || n.origin == b->rank ||
          (r->ranks ? r->ranks[n.origin] : (pmix_rank_t)n.origin) != src)
        continue;
      ncfsm__boot_notice_push(b, &n);
    }
    pthread_mutex_unlock(&reg_mu);
    break;
  }
  if (cbfunc) cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

typedef struct reg_wait {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  pmix_status_t st;
  size_t ref;
} reg_wait;

static void reg_cb(pmix_status_t st, size_t ref, void *cbdata) {
  reg_wait *w = cbdata;
  pthread_mutex_lock(&w->mu);
  w->st = st;
  w->ref = ref;
  w->done = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

/* ---- the client's connection to its PMIx server: acknowledge at once ------------------- */

static atomic_int srv_fd = -1;

/* "...;tcp4://127.0.0.1:49411": the server's address, or 0. */
static int server_addr(struct sockaddr_in *sa) {
  static const char *vars[] = {"PMIX_SERVER_URI41", "PMIX_SERVER_URI4", "PMIX_SERVER_URI3",
                               "PMIX_SERVER_URI21", "PMIX_SERVER_URI2"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *u = getenv(vars[i]), *t = u ? strstr(u, "tcp4://") : NULL, *colon;
    if (!t || !(colon = strrchr(t + 7, ':'))) continue;
    char host[64];
    size_t hl = (size_t)(colon - (t + 7));
    if (hl >= sizeof host) continue;
    memcpy(host, t + 7, hl);
    host[hl] = 0;
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &sa->sin_addr) == 1) return 1;
  }
  return 0;
}

/* Once, after PMIx_Init: the descriptor connected to the server (-1 when none is found, e.g.
 * a server reached otherwise than by tcp4). */
static void find_server_fd(void) {
  struct sockaddr_in want;
  struct rlimit rl;
  if (!server_addr(&want)) return;
  int maxfd = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536 ? (int)rl.rlim_cur : 65536;
  for (int fd = 0; fd < maxfd; fd++) {
    struct sockaddr_in peer;
    socklen_t pl = sizeof peer;
    if (getpeername(fd, (struct sockaddr *)&peer, &pl) != 0 || pl != sizeof peer ||
        peer.sin_family != AF_INET || peer.sin_port != want.sin_port ||
        peer.sin_addr.s_addr != want.sin_addr.s_addr)
      continue;
    atomic_store(&srv_fd, fd);
    return;
  }
}

void ncfsm__pmix_quickack(void) {
  int fd = atomic_load(&srv_fd), one = 1;
  if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
}

void ncfsm__pmix_notices_start(void) {
  find_server_fd();
  pmix_status_t code = NCFSM_PMIX_NOTICE;
  pmix_info_t name;
  PMIX_INFO_LOAD(&name, PMIX_EVENT_HDLR_NAME, "ncfsm.notices", PMIX_STRING);
  reg_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, PMIX_SUCCESS, 0};
  pmix_status_t rc = PMIx_Register_event_handler(&code, 1, &name, 1, on_event, reg_cb, &w);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  pthread_mutex_lock(&w.mu);
  while (rc == PMIX_SUCCESS && !w.done)
    if (pthread_cond_timedwait(&w.cv, &w.mu, &until) != 0) break;
  int ok = rc == PMIX_SUCCESS && w.done && w.st == PMIX_SUCCESS;
  int pending = rc == PMIX_SUCCESS && !w.done;
  pthread_mutex_unlock(&w.mu);
  PMIX_INFO_DESTRUCT(&name);
  if (ok) {
    hdlr_id = w.ref;
    hdlr_on = 1;
    return;
  }
  NCFSM_WARN(NCFSM__SUB_BOOT, "PMIx_Register_event_handler for notices: %s; this process will not "
                              "hear other ranks' notices",
             pending ? "no answer within 10 s" : PMIx_Error_string(rc != PMIX_SUCCESS ? rc : w.st));
  if (pending) { /* its callback may still come: w must not go away */
    for (;;) {
      pthread_mutex_lock(&w.mu);
      int d = w.done;
      pthread_mutex_unlock(&w.mu);
      if (d) break;
      struct timespec ms = {0, 1000000};
      nanosleep(&ms, NULL);
    }
  }
}

void ncfsm__pmix_notices_stop(void) {
  atomic_store(&srv_fd, -1);
  if (!hdlr_on) return;
  PMIx_Deregister_event_handler(hdlr_id, NULL, NULL);
  hdlr_on = 0;
}

/* What PMIx keeps until the notice is sent. */
typedef struct psend {
  pmix_proc_t me;
  pmix_info_t *info;
} psend;

static void sent_cb(pmix_status_t st, void *cbdata) {
  psend *ps = cbdata;
  (void)st;
  ncfsm__pmix_quickack();
  PMIX_INFO_FREE(ps->info, NOTICE_NINFO);
  free(ps);
}

/* PMIX_EVENT_NON_DEFAULT: a notice goes only to the handlers registered for its code (this
 * file's), never to default ones. Slurm's PMIx server has a default handler that takes any
 * event a client notifies for an error of the job step and cancels the step (measured: Slurm
 * 22.05, mpi/pmix_v4, "_errhandler: ... Error handler invoked: status = -4021", then "STEP ...
 * CANCELLED"); with the flag it does not see them, and they reach the step's other processes of
 * the node (measured there: docs/bootstrap.md, "Notices"). */
ncfsm_result_t ncfsm__pmix_notice_send(ncfsm_boot *b, const pmix_proc_t *me, unsigned inst,
                                       uint64_t id, const ncfsm_boot_notice *n) {
  uint8_t w[12 + NCFSM__NOTICE_WIRE_MAX];
  ncfsm__wr32(w, inst);
  ncfsm__wr64(w + 4, id);
  size_t len = 12 + ncfsm__notice_encode(n, w + 12);
  psend *ps = calloc(1, sizeof *ps);
  if (ps) PMIX_INFO_CREATE(ps->info, NOTICE_NINFO);
  if (!ps || !ps->info) {
    free(ps);
    return NCFSM_ERR_NO_MEMORY;
  }
  ps->me = *me;
  pmix_byte_object_t bo = {(char *)w, len};
  PMIX_INFO_LOAD(&ps->info[0], NOTICE_KEY, &bo, PMIX_BYTE_OBJECT); /* copies the bytes */
  bool nondef = true;
  PMIX_INFO_LOAD(&ps->info[1], PMIX_EVENT_NON_DEFAULT, &nondef, PMIX_BOOL);
  pmix_status_t rc = PMIx_Notify_event(NCFSM_PMIX_NOTICE, &ps->me, PMIX_RANGE_LOCAL, ps->info, NOTICE_NINFO,
                                       sent_cb, ps);
  if (rc == PMIX_SUCCESS) return NCFSM_OK;
  PMIX_INFO_FREE(ps->info, NOTICE_NINFO);
  free(ps);
  if (rc == PMIX_OPERATION_SUCCEEDED) return NCFSM_OK;
  ncfsm__boot_seterr(b, "PMIx_Notify_event: %s (the notice was not sent)", PMIx_Error_string(rc));
  return NCFSM_ERR_BOOTSTRAP;
}

ncfsm_result_t ncfsm__pmix_notice_post(ncfsm_boot *b, const ncfsm_boot_notice *n) {
  pmix_impl *p = b->impl;
  return ncfsm__pmix_notice_send(b, &p->me, p->inst, 0, n);
}
