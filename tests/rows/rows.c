#include "rows.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

int rows_setup(void **state) {
  (void)state;
  ncfsm__m_count_rows(true);
  return 0;
}

const ncfsm__machine *rows_machine(const char *name) {
  for (const ncfsm__machine *const *mp = ncfsm__machines; *mp; mp++)
    if (!strcmp((*mp)->name, name)) return *mp;
  fail_msg("no machine named %s in ncfsm__machines", name);
  return NULL;
}

int rows_find(const ncfsm__machine *m, const char *state, const char *event, const char *guard) {
  for (unsigned i = 0; i < m->nrows; i++) {
    const ncfsm__mrow *r = &m->rows[i];
    if (!strcmp(m->states[r->s].name, state) && !strcmp(m->events[r->e].name, event) &&
        !strcmp(m->guards[r->guard].name, guard))
      return (int)i;
  }
  return -1;
}

unsigned rows_hits(const char *machine, const char *state, const char *event, const char *guard) {
  const ncfsm__machine *m = rows_machine(machine);
  int i = rows_find(m, state, event, guard);
  if (i < 0) fail_msg("%s: no row %s --%s [%s]-->", machine, state, event, guard);
  return __atomic_load_n(&m->hits[i], __ATOMIC_RELAXED);
}

void rows_expect_begin(rows_expect *e, const char *machine, const char *const (*rows)[3], int n) {
  assert_true(n <= (int)(sizeof e->idx / sizeof e->idx[0]));
  e->m = rows_machine(machine);
  e->n = n;
  for (int k = 0; k < n; k++) {
    e->idx[k] = rows_find(e->m, rows[k][0], rows[k][1], rows[k][2] ? rows[k][2] : "ANY");
    if (e->idx[k] < 0) fail_msg("%s: no row %s --%s [%s]-->", machine, rows[k][0], rows[k][1], rows[k][2] ? rows[k][2] : "ANY");
    e->before[k] = __atomic_load_n(&e->m->hits[e->idx[k]], __ATOMIC_RELAXED);
  }
}

static void print_row(const ncfsm__machine *m, unsigned i, const char *note);

void rows_expect_end(const rows_expect *e) {
  int bad = 0;
  for (int k = 0; k < e->n; k++)
    if (__atomic_load_n(&e->m->hits[e->idx[k]], __ATOMIC_RELAXED) <= e->before[k]) {
      print_row(e->m, (unsigned)e->idx[k], "   <- did not fire in this scenario");
      bad++;
    }
  if (bad) fail_msg("%s: %d row(s) this scenario walks did not fire (listed above)", e->m->name, bad);
}

static void print_row(const ncfsm__machine *m, unsigned i, const char *note) {
  const ncfsm__mrow *r = &m->rows[i];
  fprintf(stderr, "%s: row %u: %s --%s [%s]--> %s / %s (%s)%s\n", m->name, i, m->states[r->s].name,
          m->events[r->e].name, m->guards[r->guard].name, m->states[r->next].name, m->actions[r->action].name, r->rule,
          note);
}

void rows_check_all(const char *machine, const rows_allow *allow, size_t nallow) {
  const ncfsm__machine *m = rows_machine(machine);
  unsigned char *allowed = calloc(m->nrows, 1); /* 1: dead, 2: a defect that fires */
  assert_non_null(allowed);
  int bad = 0;
  for (size_t k = 0; k < nallow; k++) {
    int i = rows_find(m, allow[k].state, allow[k].event, allow[k].guard);
    if (i < 0) {
      fprintf(stderr, "%s: allow-list entry %s --%s [%s]--> names no row of the machine\n", machine, allow[k].state,
              allow[k].event, allow[k].guard);
      bad++;
      continue;
    }
    allowed[i] = allow[k].walked ? 2 : 1;
  }
  unsigned walked = 0, missing = 0;
  for (unsigned i = 0; i < m->nrows; i++) {
    unsigned h = __atomic_load_n(&m->hits[i], __ATOMIC_RELAXED);
    if (h) walked++;
    if (allowed[i] == 1 && h) {
      print_row(m, i, "   <- allow-listed as dead, but it fired: remove its entry");
      bad++;
    } else if (allowed[i] != 1 && !h) {
      print_row(m, i, "   <- not walked");
      missing++;
    }
  }
  for (size_t k = 0; k < nallow; k++) {
    int i = rows_find(m, allow[k].state, allow[k].event, allow[k].guard);
    if (i >= 0) {
      char note[600];
      snprintf(note, sizeof note, "   <- %s: %s", allow[k].walked ? "defect" : "dead", allow[k].why);
      print_row(m, (unsigned)i, note);
    }
  }
  size_t ndead = 0;
  for (size_t k = 0; k < nallow; k++) ndead += !allow[k].walked;
  printf("%s: %u of %u rows walked, %zu dead (allow-listed), %zu walked with a defect, %u not walked\n", machine,
         walked, m->nrows, ndead, nallow - ndead, missing);
  free(allowed);
  if (missing || bad) fail_msg("%s: %u row(s) not walked, %d allow-list problem(s) (listed above)", machine, missing, bad);
}

/* ---- fork ---------------------------------------------------------------------------------- */

static int child_fd = -1;

static void child_report(void) {
  if (child_fd < 0) return;
  for (const ncfsm__machine *const *mp = ncfsm__machines; *mp; mp++) {
    const char *p = (const char *)(*mp)->hits;
    size_t left = (*mp)->nrows * sizeof *(*mp)->hits;
    while (left) {
      ssize_t w = write(child_fd, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      p += w;
      left -= (size_t)w;
    }
  }
  close(child_fd);
  child_fd = -1;
}

static int parent_fd = -1;

pid_t rows_fork(void) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    child_fd = fds[1];
    ncfsm__m_count_rows(true); /* the child's own rows only */
    atexit(child_report);
    return 0;
  }
  close(fds[1]);
  parent_fd = fds[0];
  return pid;
}

void rows_child_exit(int code) {
  child_report();
  _exit(code);
}

int rows_wait_child(pid_t pid) {
  size_t total = 0;
  for (const ncfsm__machine *const *mp = ncfsm__machines; *mp; mp++) total += (*mp)->nrows * sizeof(unsigned);
  unsigned char *buf = malloc(total);
  assert_non_null(buf);
  size_t got = 0;
  while (got < total) {
    ssize_t r = read(parent_fd, buf + got, total - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(parent_fd);
  parent_fd = -1;
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  if (got != total) {
    free(buf);
    fail_msg("the forked child sent %zu of %zu bytes of row counts (wait status 0x%x)", got, total, st);
  }
  const unsigned char *p = buf;
  for (const ncfsm__machine *const *mp = ncfsm__machines; *mp; mp++)
    for (unsigned i = 0; i < (*mp)->nrows; i++, p += sizeof(unsigned)) {
      unsigned v;
      memcpy(&v, p, sizeof v);
      __atomic_fetch_add(&(*mp)->hits[i], v, __ATOMIC_RELAXED);
    }
  free(buf);
  return st;
}

/* ---- calloc failures ------------------------------------------------------------------------ */

void *__real_calloc(size_t nmemb, size_t size);
void *__wrap_calloc(size_t nmemb, size_t size);

static _Atomic size_t fail_nmemb, fail_size;
static atomic_uint fail_left, fail_done;

void rows_fail_calloc(size_t nmemb, size_t size, unsigned count) {
  atomic_store(&fail_left, 0);
  atomic_store(&fail_nmemb, nmemb);
  atomic_store(&fail_size, size);
  atomic_store(&fail_done, 0);
  atomic_store(&fail_left, count);
}

unsigned rows_calloc_failed(void) { return atomic_load(&fail_done); }

/* An armed failure matched: true while one is left (and it counts as done). */
static bool take_failure(void) {
  unsigned left = atomic_load(&fail_left);
  while (left && !atomic_compare_exchange_weak(&fail_left, &left, left - 1)) {
  }
  if (left) atomic_fetch_add(&fail_done, 1);
  return left != 0;
}

void *__wrap_calloc(size_t nmemb, size_t size) {
  if (atomic_load_explicit(&fail_left, memory_order_relaxed) && nmemb == atomic_load(&fail_nmemb) &&
      size == atomic_load(&fail_size) && take_failure())
    return NULL;
  return __real_calloc(nmemb, size);
}

/* A comm or a loop comes zeroed on a line boundary (ncfsm__calloc_line, fsm/objects.h):
 * rows_fail_calloc(1, sizeof(ncfsm_comm), n) fails that allocation too (its size, rounded up). */
void *__real_aligned_alloc(size_t align, size_t size);
void *__wrap_aligned_alloc(size_t align, size_t size);
void *__wrap_aligned_alloc(size_t align, size_t size) {
  size_t want = atomic_load(&fail_size);
  if (atomic_load_explicit(&fail_left, memory_order_relaxed) && atomic_load(&fail_nmemb) == 1 && want && align &&
      (want + align - 1) / align * align == size && take_failure())
    return NULL;
  return __real_aligned_alloc(align, size);
}
