/*
 * The process-wide dump thread: ncfsm__rec_dump_async copies a snapshot and
 * queues it; the thread writes it with ncfsm__rec_write (fsm/recorder_write.c);
 * ncfsm__rec_shutdown and the process's exit drain the queue.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "fsm/dump_write.h"

typedef struct rec_job {
  struct rec_job *next;
  char *dir;
  ncfsm__rec_meta m; /* strings point into the job's own allocation */
  ncfsm__rec_entry *e;
  unsigned n;
  ncfsm__rec_done_fn done;
  void *arg;
} rec_job;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;         /* the queue has a job, or stopping */
  pthread_cond_t stopped_cv; /* stopping went back to 0 */
  pthread_t th;
  int running;  /* the thread exists */
  int stopping; /* ncfsm__rec_shutdown asked it to drain and exit */
  int exiting;  /* the process is exiting: no new dumps */
  rec_job *head, *tail;
  unsigned queued;
  uint64_t dropped;
} g_dump = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
            .stopped_cv = PTHREAD_COND_INITIALIZER};

static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

static void atfork_prepare(void) { pthread_mutex_lock(&g_dump.mu); }
static void atfork_parent(void) { pthread_mutex_unlock(&g_dump.mu); }
/* The child has no dump thread: the parent writes the dumps it queued. */
static void atfork_child(void) {
  rec_job *j = g_dump.head;
  while (j) {
    rec_job *nx = j->next;
    free(j);
    j = nx;
  }
  g_dump.head = g_dump.tail = NULL;
  g_dump.queued = 0;
  g_dump.running = g_dump.stopping = 0;
  pthread_mutex_unlock(&g_dump.mu);
}
static void atfork_register(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

/* Writes each job's dump, calls its done and frees it. */
static void run_jobs(rec_job *j) {
  while (j) {
    rec_job *nx = j->next;
    ncfsm_result_t rc = ncfsm__rec_write(j->dir, &j->m, j->e, j->n);
    if (j->done) {
      unsigned fmt = ncfsm__rec_formats(&j->m);
      char jpath[REC_PATH_MAX];
      int have = (fmt & NCFSM__REC_FMT_JSON) &&
                 ncfsm__rec_paths(j->dir, &j->m, jpath, sizeof jpath, NULL, 0) == NCFSM_OK;
      j->done(j->arg, rc, have ? jpath : NULL);
    }
    free(j);
    j = nx;
  }
}

static void *dump_main(void *unused) {
  (void)unused;
  pthread_mutex_lock(&g_dump.mu);
  for (;;) {
    while (!g_dump.head && !g_dump.stopping) pthread_cond_wait(&g_dump.cv, &g_dump.mu);
    rec_job *j = g_dump.head;
    if (!j) break; /* stopping and drained */
    g_dump.head = j->next;
    if (!g_dump.head) g_dump.tail = NULL;
    g_dump.queued--;
    pthread_mutex_unlock(&g_dump.mu);

    j->next = NULL;
    run_jobs(j);
    pthread_mutex_lock(&g_dump.mu);
  }
  pthread_mutex_unlock(&g_dump.mu);
  return NULL;
}

/* One allocation: the job, the entries, the meta's peer seqs, dir and its strings. */
static rec_job *job_new(const char *dir, const ncfsm__rec_meta *m, const ncfsm__rec_entry *e,
                        unsigned n) {
  const char *strs[] = {dir, nz(m->comm_name), nz(m->backend), nz(m->reason), nz(m->state),
                        nz(m->failure)};
  size_t slen = 0;
  for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) slen += strlen(strs[i]) + 1;
  size_t esz = (size_t)n * sizeof(ncfsm__rec_entry);
  size_t psz = m->peer_next_seq ? (size_t)m->nranks * sizeof(uint64_t) : 0;
  rec_job *j = malloc(sizeof *j + esz + psz + slen);
  if (!j) return NULL;
  memset(j, 0, sizeof *j);
  j->e = (ncfsm__rec_entry *)(void *)(j + 1);
  if (n) memcpy(j->e, e, esz);
  j->n = n;
  uint64_t *peers = (uint64_t *)(void *)((char *)(j + 1) + esz);
  if (psz) memcpy(peers, m->peer_next_seq, psz);
  char *s = (char *)(j + 1) + esz + psz;
  char *copies[sizeof strs / sizeof strs[0]];
  for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
    size_t l = strlen(strs[i]) + 1;
    memcpy(s, strs[i], l);
    copies[i] = s;
    s += l;
  }
  j->m = *m;
  j->dir = copies[0];
  j->m.comm_name = copies[1];
  j->m.backend = copies[2];
  j->m.reason = copies[3];
  j->m.state = copies[4];
  j->m.failure = copies[5];
  j->m.peer_next_seq = psz ? peers : NULL;
  return j;
}

/* The d-th dropped dump: logged when d is a power of two (1, 2, 4, ...), so
 * that a flood of dumps does not flood the log too. */
static void warn_dropped(const ncfsm__rec_meta *m, uint64_t d) {
  if (d & (d - 1)) return;
  NCFSM_WARN(NCFSM__SUB_FSM,
             "flight recorder: %u dumps already pending: dump of comm %016" PRIx64
             " rank %d (%s) dropped, %" PRIu64 " dropped so far (logged at 1, 2, 4, ...); the "
             "dump directory may be slow, or dumps are requested too often",
             NCFSM__REC_QUEUE_MAX, m->comm_id, m->rank, m->reason, d);
}

ncfsm_result_t ncfsm__rec_dump_async(const char *dir, const ncfsm__rec_meta *m,
                                     const ncfsm__rec_entry *e, unsigned n,
                                     ncfsm__rec_done_fn done, void *arg) {
  ncfsm_result_t rc = ncfsm__rec_validate(dir, m, e, n);
  if (rc != NCFSM_OK) return rc;
  pthread_once(&g_atfork_once, atfork_register);
  pthread_mutex_lock(&g_dump.mu);
  if (g_dump.exiting) {
    pthread_mutex_unlock(&g_dump.mu);
    NCFSM_WARN(NCFSM__SUB_FSM,
               "flight recorder: dump of comm %016" PRIx64 " rank %d (%s) requested while the "
               "process exits: not written",
               m->comm_id, m->rank, m->reason);
    return NCFSM_ERR_ILLEGAL_STATE;
  }
  if (g_dump.queued >= NCFSM__REC_QUEUE_MAX) {
    uint64_t d = ++g_dump.dropped;
    pthread_mutex_unlock(&g_dump.mu);
    warn_dropped(m, d);
    return NCFSM_ERR_BUSY;
  }
  pthread_mutex_unlock(&g_dump.mu);

  /* copy outside the lock: the dump thread is never held up by it */
  rec_job *j = job_new(dir, m, e, n);
  if (!j) {
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: no memory to copy a dump of %u entries", n);
    return NCFSM_ERR_NO_MEMORY;
  }
  j->done = done;
  j->arg = arg;

  pthread_mutex_lock(&g_dump.mu);
  if (g_dump.exiting || g_dump.queued >= NCFSM__REC_QUEUE_MAX) {
    /* lost a race with exit or with other producers filling the queue */
    int ex = g_dump.exiting;
    uint64_t d = ex ? g_dump.dropped : ++g_dump.dropped;
    pthread_mutex_unlock(&g_dump.mu);
    free(j);
    if (!ex) warn_dropped(m, d);
    return ex ? NCFSM_ERR_ILLEGAL_STATE : NCFSM_ERR_BUSY;
  }
  if (!g_dump.running) {
    /* a previous thread that was told to stop has been joined by
     * ncfsm__rec_shutdown before running went to 0 */
    g_dump.stopping = 0;
    int err = pthread_create(&g_dump.th, NULL, dump_main, NULL);
    if (err) {
      pthread_mutex_unlock(&g_dump.mu);
      free(j);
      NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: cannot start the dump thread: %s",
                 strerror(err));
      return NCFSM_ERR_SYSTEM;
    }
    g_dump.running = 1;
  }
  if (g_dump.tail) g_dump.tail->next = j;
  else g_dump.head = j;
  g_dump.tail = j;
  g_dump.queued++;
  pthread_cond_signal(&g_dump.cv);
  pthread_mutex_unlock(&g_dump.mu);
  return NCFSM_OK;
}

static void shutdown_thread(int exiting) {
  pthread_mutex_lock(&g_dump.mu);
  if (exiting) g_dump.exiting = 1;
  if (g_dump.running && pthread_equal(pthread_self(), g_dump.th)) {
    /* called from a done callback: the thread cannot join itself */
    pthread_mutex_unlock(&g_dump.mu);
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: shutdown called from the dump thread: ignored");
    return;
  }
  /* another caller is stopping the thread: wait until it is done */
  while (g_dump.stopping) pthread_cond_wait(&g_dump.stopped_cv, &g_dump.mu);
  if (!g_dump.running) {
    pthread_mutex_unlock(&g_dump.mu);
    return;
  }
  g_dump.stopping = 1;
  pthread_t th = g_dump.th;
  pthread_cond_signal(&g_dump.cv);
  pthread_mutex_unlock(&g_dump.mu);
  pthread_join(th, NULL);
  pthread_mutex_lock(&g_dump.mu);
  /* Dumps queued after the thread saw an empty queue are written here; so are
   * those queued meanwhile (running is still 1: no new thread starts) */
  for (;;) {
    rec_job *late = g_dump.head;
    if (!late) break;
    g_dump.head = g_dump.tail = NULL;
    g_dump.queued = 0;
    pthread_mutex_unlock(&g_dump.mu);
    run_jobs(late);
    pthread_mutex_lock(&g_dump.mu);
  }
  g_dump.running = 0;
  g_dump.stopping = 0;
  pthread_cond_broadcast(&g_dump.stopped_cv);
  pthread_mutex_unlock(&g_dump.mu);
}

void ncfsm__rec_shutdown(void) { shutdown_thread(0); }

/* At exit: write what is queued, then stop. */
__attribute__((destructor)) static void rec_at_exit(void) { shutdown_thread(1); }

uint64_t ncfsm__rec_dumps_dropped(void) {
  pthread_mutex_lock(&g_dump.mu);
  uint64_t d = g_dump.dropped;
  pthread_mutex_unlock(&g_dump.mu);
  return d;
}
