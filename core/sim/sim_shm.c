/*
 * The sim's shared cliques: one POSIX shared-memory segment per unique id,
 * so that ranks in separate processes of one host (and ranks of one process
 * alike) form one clique. docs/sim.md, "Processes", describes the model.
 *
 * This file: the segments (creation, attachment, stale ones, detachment),
 * their robust mutex and the liveness of peer processes. The arena inside a
 * segment (its allocator, posted ops, the commit record of an executing
 * instance) is sim_shm_arena.c; the repair after a lock holder died and the
 * invariant check are sim_shm_repair.c.
 *
 * Segment: a header (shm_hdr: clique membership, a process-shared robust
 * mutex, the allocator), one shm_rank per rank, then the arena
 * (NCFSM_SIM_SHM_BYTES, default 256 MiB) that holds posted op descriptors,
 * deposited send data and results. The file is sparse: arena pages are
 * reserved with posix_fallocate as the allocator's high-water mark grows, so
 * a full /dev/shm is an allocation failure (ncclSystemError), never SIGBUS.
 *
 * Lifetime: created by whichever process arrives first (O_CREAT|O_EXCL; the
 * others open it and wait for `ready`); unlinked by the last live rank.
 * Crashes: a holder of the mutex that dies makes the next lock return
 * EOWNERDEAD: the next holder repairs whatever the dead one left half-done
 * (ncfsm__sim_shm_recover: op lists, references, the commit record of an
 * executing instance, counters, and the allocator rebuilt from the blocks
 * still referenced) and marks the dead process's ranks dead. Dead peer
 * processes are found by pid (kill 0, and /proc/<pid>/stat for zombies); a
 * segment whose processes are all gone is unlinked by the next process that
 * creates any sim clique (ncfsm__sim_shm_sweep) or tries to open the same name.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/sim/sim-internal.h"

#define E_SYSTEM NCFSM__NCCL_SYSTEM_ERROR
#define ALIGN SHM_ALIGN                 /* block and payload alignment */
#define CHECK_NS (20ull * 1000 * 1000)  /* peer liveness check interval */

void ncfsm__sim_shm_name(const unsigned char *key, char *buf, size_t len) {
  char hex[2 * SIM_ID_KEY_LEN + 1];
  for (int i = 0; i < SIM_ID_KEY_LEN; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
  snprintf(buf, len, "/" SIM_SHM_PREFIX "%s", hex);
}

/* NCFSM_SIM_SHM_BYTES and NCFSM_SIM_MISMATCH, read by the process that
 * creates a clique (the init refused a bad value first: ncfsm__sim_call_opts). */
static uint64_t arena_bytes(void) { return shm_round_up(ncfsm__sim_setting(NCFSM__SET_SIM_SHM_BYTES).u, 4096); }

static uint32_t mismatch_mode(void) {
  return ncfsm__sim_setting(NCFSM__SET_SIM_MISMATCH).u ? SIM_MISMATCH_HANG : SIM_MISMATCH_NCCL; /* nccl|hang */
}

/* A process that is gone (or a zombie: killed but not reaped). */
static int pid_dead(int pid) {
  if (pid <= 0) return 1;
  if (pid == (int)getpid()) return 0;
  if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0; /* no /proc: trust kill() */
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')');
  return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* ---- the robust mutex --------------------------------------------------------- */

/* pid is stopped: SIGSTOP (or the terminal's), or a tracer's stop. */
static int pid_stopped(int pid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')');
  return p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

/* The lock was taken (rc 0), or its holder died (EOWNERDEAD), or it failed. */
static int lock_taken(sim_clique *q, int rc) {
  shm_hdr *h = q->h;
  if (q->stalled_pid) {
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: the lock of %s is free again (process %d resumed or died)", q->name,
               q->stalled_pid);
    q->stalled_pid = 0;
  }
  if (rc == EOWNERDEAD) {
    int dead = __atomic_load_n(&h->owner_pid, __ATOMIC_RELAXED);
    pthread_mutex_consistent(&h->mu);
    __atomic_store_n(&h->owner_pid, (int)getpid(), __ATOMIC_RELAXED);
    /* the dead holder may have left anything half-updated: repair first */
    int fixes = ncfsm__sim_shm_recover(q);
    if (fixes < 0) {
      ncfsm__sim_shm_unlock(q);
      return -1;
    }
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: process %d died holding the lock of %s; %d repair(s)", dead, q->name,
               fixes);
    if (dead != (int)getpid())
      for (int r = 0; r < h->nranks; r++)
        if (h->rank[r].used && h->rank[r].pid == dead)
          ncfsm__sim_shm_rank_dead(q, r, "its process died holding the clique's lock");
    return 0;
  }
  if (rc) {
    ncfsm__sim_warn("sim: the shared clique's lock is unusable: %s", strerror(rc));
    return -1;
  }
  __atomic_store_n(&h->owner_pid, (int)getpid(), __ATOMIC_RELAXED);
  return 0;
}

/* The holder, process pid, has been stopped for SIM_STALL_MS: named once. */
static int stalled(sim_clique *q, int pid, uint64_t now) {
  if (q->stalled_pid != pid) {
    int rank = -1;
    for (int r = 0; r < q->h->nranks && rank < 0; r++)
      if (q->h->rank[r].used && q->h->rank[r].pid == pid) rank = r;
    ncfsm__sim_warn("sim: the lock of the shared clique %s is held by process %d (rank %d), which is stopped "
                    "(SIGSTOP or a debugger): this process goes on without the clique's shared state; its "
                    "launches on the clique hang (the watchdog or an abort ends them) until that process "
                    "resumes or dies", q->name, pid, rank);
    q->stalled_pid = pid;
  }
  q->stall_check_ns = now + CHECK_NS;
  return SIM_LOCK_STALLED;
}

/* Taken at once, or waited for in slices; between two slices the holder is
 * looked at: a process stopped (state T or t) for SIM_STALL_MS stalls the
 * lock, and this caller returns without it (a host call of NCCL does not
 * wait for a stopped peer's host). Once stalled, a busy lock with the same
 * holder fails at once, the holder looked at again every CHECK_NS. */
int ncfsm__sim_shm_lock(sim_clique *q) {
  shm_hdr *h = q->h;
  int rc = pthread_mutex_trylock(&h->mu);
  if (rc != EBUSY) return lock_taken(q, rc);
  int self = (int)getpid(), seen = 0;
  uint64_t now = ncfsm__now_ns(), since = 0;
  if (q->stalled_pid && __atomic_load_n(&h->owner_pid, __ATOMIC_RELAXED) == q->stalled_pid &&
      (now < q->stall_check_ns || pid_stopped(q->stalled_pid)))
    return stalled(q, q->stalled_pid, now);
  for (;;) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* timedlock's clock: a jump only moves one slice */
    ts.tv_nsec += 10 * 1000 * 1000;     /* a slice: 10 ms */
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    rc = pthread_mutex_timedlock(&h->mu, &ts);
    if (rc != ETIMEDOUT) return lock_taken(q, rc);
    int owner = __atomic_load_n(&h->owner_pid, __ATOMIC_RELAXED);
    if (owner <= 0 || owner == self || !pid_stopped(owner)) {
      seen = 0;
      continue;
    }
    now = ncfsm__now_ns();
    if (owner != seen) { /* the same holder, stopped, at both ends of SIM_STALL_MS */
      seen = owner;
      since = now;
    } else if (now - since >= SIM_STALL_MS * 1000000ull) {
      return stalled(q, owner, now);
    }
  }
}

void ncfsm__sim_shm_unlock(sim_clique *q) {
  __atomic_store_n(&q->h->owner_pid, 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&q->h->mu);
}

void ncfsm__sim_shm_check_peers(sim_clique *q) {
  uint64_t now = ncfsm__now_ns();
  if (now < q->next_check_ns) return;
  q->next_check_ns = now + CHECK_NS;
  shm_hdr *h = q->h;
  for (int r = 0; r < h->nranks; r++) {
    shm_rank *rk = &h->rank[r];
    if (rk->used && rk->live && !rk->dead && pid_dead(rk->pid))
      ncfsm__sim_shm_rank_dead(q, r, "its process exited or was killed");
  }
}

/* ---- segments ---------------------------------------------------------------------- */

static uint32_t jrn_cap(int nranks) { return nranks > 2 ? (uint32_t)nranks : 2u; }
static size_t jrn_off(int nranks) {
  return (size_t)shm_round_up(sizeof(shm_hdr) + (size_t)nranks * sizeof(shm_rank), ALIGN);
}
/* Header, ranks and the commit record (3 words per op), in whole pages. */
static size_t hdr_bytes(int nranks) {
  return (size_t)shm_round_up(jrn_off(nranks) + sizeof(shm_journal) + 3 * sizeof(uint64_t) * jrn_cap(nranks),
                          4096);
}

/* Stale: every process that used it is gone (see the file comment). */
static int segment_stale(const shm_hdr *h, size_t mapped, time_t mtime) {
  if (mapped < sizeof *h || h->magic != SIM_SHM_MAGIC || h->version != SIM_SHM_VERSION ||
      !__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE))
    return time(NULL) - mtime > 10; /* a creator that died before it was ready */
  if (mapped < sizeof *h + (size_t)h->nranks * sizeof(shm_rank)) return 0;
  if (h->unlinked) return 1;
  if (!h->joined) return pid_dead(h->creator_pid);
  for (int r = 0; r < h->nranks; r++)
    if (h->rank[r].used && h->rank[r].live && !pid_dead(h->rank[r].pid)) return 0;
  return 1;
}

/* 1 when the named segment was stale and is now unlinked. */
static int unlink_if_stale(const char *name) {
  int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0) return 0;
  struct stat st;
  int stale = 0;
  if (fstat(fd, &st) == 0) {
    size_t len = st.st_size > (off_t)(64 << 10) ? (size_t)(64 << 10) : (size_t)st.st_size;
    if (len < sizeof(shm_hdr)) {
      stale = time(NULL) - st.st_mtime > 10;
    } else {
      /* only the reserved part may be read (the rest can be unbacked) */
      void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        const shm_hdr *h = p;
        size_t ok = len;
        if (h->magic == SIM_SHM_MAGIC && h->backed < ok) ok = (size_t)h->backed;
        stale = segment_stale(h, ok, st.st_mtime);
        munmap(p, len);
      }
    }
  }
  close(fd);
  if (stale && shm_unlink(name) == 0) {
    NCFSM_INFO(NCFSM__SUB_SIM, "sim: removed stale shared clique %s", name);
    return 1;
  }
  return 0;
}

void ncfsm__sim_shm_sweep(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, SIM_SHM_PREFIX, strlen(SIM_SHM_PREFIX))) continue;
    char name[sizeof e->d_name + 2];
    name[0] = '/';
    memcpy(name + 1, e->d_name, strnlen(e->d_name, sizeof e->d_name - 1) + 1);
    unlink_if_stale(name);
  }
  closedir(d);
}

static int init_segment(sim_clique *q, int nranks, uint64_t seed, uint64_t arena) {
  shm_hdr *h = q->h;
  size_t hb = hdr_bytes(nranks);
  memset(h, 0, hb);
  h->magic = SIM_SHM_MAGIC;
  h->version = SIM_SHM_VERSION;
  h->creator_pid = (int)getpid();
  h->nranks = nranks;
  h->rng = seed;
  h->size = q->size;
  h->arena_off = hb;
  h->arena_len = arena;
  h->backed = hb;
  h->jrn_off = jrn_off(nranks);
  h->jcap = jrn_cap(nranks);
  h->mismatch = mismatch_mode();
  pthread_mutexattr_t ma;
  if (pthread_mutexattr_init(&ma) || pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED) ||
      pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST) || pthread_mutex_init(&h->mu, &ma))
    return -1;
  pthread_mutexattr_destroy(&ma);
  if (ncfsm__sim_shm_back(q, hb + ALIGN)) return -1;
  shm_blk *b = SHM_PTR(q, hb);
  b->size = arena;
  b->next = 0;
  h->free_head = hb;
  __atomic_store_n(&h->ready, 1, __ATOMIC_RELEASE);
  return 0;
}

static void sleep_ms(int ms) {
  struct timespec ts = {0, (long)ms * 1000000L};
  nanosleep(&ts, NULL);
}

/* Open an existing segment and wait until its creator finished. 1: retry
 * (it vanished or was stale), 0: attached, -1: error (errno / WARN). */
static int open_existing(sim_clique *q) {
  int fd = shm_open(q->name, O_RDWR, 0);
  if (fd < 0) return errno == ENOENT ? 1 : -1;
  struct stat st;
  for (int i = 0;; i++) {
    if (fstat(fd, &st)) {
      close(fd);
      return -1;
    }
    if (st.st_size >= (off_t)sizeof(shm_hdr)) break;
    if (i >= 2000) { /* a creator that died between create and resize */
      close(fd);
      return unlink_if_stale(q->name) ? 1 : -1;
    }
    sleep_ms(1);
  }
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return -1;
  }
  shm_hdr *h = p;
  for (int i = 0; !__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE); i++) {
    if (i >= 2000) {
      munmap(p, (size_t)st.st_size);
      close(fd);
      return unlink_if_stale(q->name) ? 1 : -1;
    }
    sleep_ms(1);
  }
  if (h->magic != SIM_SHM_MAGIC || h->version != SIM_SHM_VERSION || h->size != (uint64_t)st.st_size) {
    munmap(p, (size_t)st.st_size);
    close(fd);
    errno = EPROTO;
    return -1;
  }
  q->fd = fd;
  q->h = h;
  q->size = (size_t)st.st_size;
  return 0;
}

int ncfsm__sim_shm_attach(const unsigned char *key, int nranks, uint64_t seed, sim_clique **out) {
  *out = NULL;
  sim_clique *q = calloc(1, sizeof *q);
  if (q) q->slot = calloc((size_t)nranks, sizeof *q->slot);
  if (!q || !q->slot) {
    if (q) free(q->slot);
    free(q);
    ncfsm__sim_warn("ncclCommInitRank: out of memory");
    return E_SYSTEM;
  }
  memcpy(q->key, key, SIM_ID_KEY_LEN);
  q->nranks = nranks;
  q->fd = -1;
  ncfsm__sim_shm_name(key, q->name, sizeof q->name);
  const char *what = "shm_open";
  for (int attempt = 0; attempt < 8; attempt++) {
    int fd = shm_open(q->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) { /* we create it */
      ncfsm__sim_shm_sweep(); /* and clean up after crashed cliques */
      uint64_t arena = arena_bytes();
      q->size = hdr_bytes(nranks) + (size_t)arena;
      q->fd = fd;
      what = "ftruncate";
      if (ftruncate(fd, (off_t)q->size) == 0) {
        what = "mmap";
        void *p = mmap(NULL, q->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) {
          q->h = p;
          what = "initialisation (posix_fallocate or mutex)";
          if (init_segment(q, nranks, seed, arena) == 0) goto attached;
          munmap(p, q->size);
          q->h = NULL;
        }
      }
      int err = errno;
      close(fd);
      shm_unlink(q->name);
      errno = err;
      break;
    }
    if (errno != EEXIST) break;
    int rc = open_existing(q);
    if (rc == 0) goto attached;
    what = "open of the existing segment";
    if (rc < 0) break;
    /* rc == 1: it vanished (its last rank left) or was stale: create it */
  }
  ncfsm__sim_warn("ncclCommInitRank: sim shared clique %s: %s failed: %s (NCFSM_SIM_SHM_BYTES, "
                  "/dev/shm space)", q->name, what, strerror(errno));
  free(q->slot);
  free(q);
  return E_SYSTEM;
attached:
  q->next = ncfsm__sim_cliques;
  ncfsm__sim_cliques = q;
  *out = q;
  NCFSM_INFO(NCFSM__SUB_SIM, "sim: attached shared clique %s (%d ranks, %zu bytes)", q->name,
             q->h->nranks, q->size);
  return NCFSM__NCCL_SUCCESS;
}

void ncfsm__sim_shm_detach(sim_clique *q) {
  sim_clique **lists[] = {&ncfsm__sim_cliques, &ncfsm__sim_inherited};
  for (int i = 0; i < 2; i++)
    for (sim_clique **pp = lists[i]; *pp; pp = &(*pp)->next)
      if (*pp == q) {
        *pp = q->next;
        i = 2;
        break;
      }
  if (q->h) munmap(q->h, q->size);
  if (q->fd >= 0) close(q->fd);
  free(q->slot);
  free(q);
}
