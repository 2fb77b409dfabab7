/*
 * tools/fsm2dot: renders and lints every machine of the engine.
 *
 *   fsm2dot OUTDIR [--header FILE]   write OUTDIR/fsm-<machine>.dot (each
 *                                    machine of ncfsm__machines[]),
 *                                    OUTDIR/fsm-comm-happy.dot and
 *                                    OUTDIR/fsm-tables.md; with --header
 *                                    also FILE (include/ncfsm/states.h)
 *   fsm2dot --header FILE            write FILE only
 *   fsm2dot --check ...              the same, into a temporary directory,
 *                                    compared with the named files by
 *                                    `diff -u`; exit 1 on drift
 *
 * The tool links the descriptors (fsm/tables.c, fsm/machine.c). Before
 * writing anything it lints every machine (ncfsm__m_lint, with the guards
 * of the comm's legality cells; ncfsm__comm_lint) and checks what it needs
 * itself (machine names, column names); each defect is one line
 * "fsm2dot: defect: ..." on stderr. tests/golden/consistency_selftest.cmake
 * proves that each check fires, on small defective tables.
 *
 * Exit status: 0 written / up to date, 1 drift (--check), 2 usage, I/O or
 * a defect in the tables.
 */
#include <dirent.h>
#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/fsm2dot/fsm2dot.h"

extern char **environ;

/* ---- the lint ---------------------------------------------------------------- */
static void report(void *arg, const char *defect) {
  (void)arg;
  fprintf(stderr, "fsm2dot: defect: %s\n", defect);
}

/* What the tool itself relies on: machine names that make file names and
 * anchors, once each; names for the comm's column values. */
static int tool_checks(void) {
  int n = 0;
  for (const ncfsm__machine *const *mp = ncfsm__machines; *mp; mp++) {
    const char *name = (*mp)->name;
    bool ok = name[0] && strlen(name) <= 32 && strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789_") == strlen(name);
    if (!ok) {
      fprintf(stderr, "fsm2dot: defect: machine '%s': a name is 1 to 32 of [a-z0-9_] (it names fsm-<name>.dot)\n",
              name);
      n++;
    }
    for (const ncfsm__machine *const *p = ncfsm__machines; p < mp; p++)
      if (!strcmp((*p)->name, name)) {
        fprintf(stderr, "fsm2dot: defect: two machines are named %s\n", name);
        n++;
      }
  }
  const ncfsm__machine *c = fsm2dot_comm.m;
  for (unsigned s = 0; s < c->nstates; s++) {
    if (!fsm2dot_poll_name(fsm2dot_comm.cols[s].poll)) {
      fprintf(stderr, "fsm2dot: defect: comm: state %s polls call %u, which tools/fsm2dot/view.c does not name\n",
              c->states[s].name, (unsigned)fsm2dot_comm.cols[s].poll);
      n++;
    }
    if (!fsm2dot_control_name(fsm2dot_comm.cols[s].control)) {
      fprintf(stderr, "fsm2dot: defect: comm: state %s has control step %u, which tools/fsm2dot/view.c does not name\n",
              c->states[s].name, (unsigned)fsm2dot_comm.cols[s].control);
      n++;
    }
  }
  return n;
}

static int lint(void) {
  int n = tool_checks();
  for (const ncfsm__machine *const *mp = ncfsm__machines; *mp; mp++)
    n += *mp == fsm2dot_comm.m ? ncfsm__comm_lint(report, NULL) : ncfsm__m_lint(*mp, 0, report, NULL);
  if (n)
    fprintf(stderr, "fsm2dot: %d defect%s in the tables (fsm/*.def); nothing was written\n", n, n == 1 ? "" : "s");
  return n;
}

/* ---- the outputs ------------------------------------------------------------- */
struct output {
  char name[64];
  const ncfsm__machine *m; /* fsm2dot_dot's machine, or NULL */
  void (*gen)(FILE *);
};

/* Every file of OUTDIR, in a fixed order: the diagrams, then the tables. */
static unsigned outputs(struct output *o, unsigned max) {
  unsigned n = 0;
  for (const ncfsm__machine *const *mp = ncfsm__machines; *mp && n + 2 < max; mp++) {
    o[n] = (struct output){.m = *mp};
    snprintf(o[n++].name, sizeof o->name, "fsm-%s.dot", (*mp)->name);
  }
  o[n] = (struct output){.gen = fsm2dot_happy};
  snprintf(o[n++].name, sizeof o->name, "fsm-%s-happy.dot", fsm2dot_comm.m->name);
  o[n] = (struct output){.gen = fsm2dot_md};
  snprintf(o[n++].name, sizeof o->name, "fsm-tables.md");
  return n;
}

static char *path_join(const char *dir, const char *name) {
  struct mstr s;
  fprintf(mstr_open(&s), "%s/%s", dir, name);
  return mstr_close(&s);
}

static const struct output header_output = {.name = "states.h", .gen = fsm2dot_header};

/* True when path holds exactly the n bytes of p. */
static bool same_file(const char *path, const char *p, size_t n) {
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  char buf[8192];
  size_t got, at = 0;
  bool same = true;
  while (same && (got = fread(buf, 1, sizeof buf, f)) > 0) {
    same = at + got <= n && !memcmp(buf, p + at, got);
    at += got;
  }
  same = same && !ferror(f) && at == n;
  fclose(f);
  return same;
}

/* Writes o's text to path, unless path holds it already (an unchanged
 * states.h keeps its time stamp: nothing is rebuilt). */
static int write_text(const char *path, const struct output *o) {
  struct mstr s;
  FILE *mf = mstr_open(&s);
  if (o->m)
    fsm2dot_dot(mf, o->m);
  else
    o->gen(mf);
  mstr_close(&s);
  bool ok = true;
  if (!same_file(path, s.p, s.n)) {
    FILE *f = fopen(path, "wb");
    ok = f && fwrite(s.p, 1, s.n, f) == s.n;
    if (f && fclose(f) != 0) ok = false;
    if (!ok) fprintf(stderr, "fsm2dot: cannot write %s: %s\n", path, strerror(errno));
  }
  free(s.p);
  return ok ? 0 : -1;
}

/* Writes the files of OUTDIR (dir NULL: none) and the header (NULL: none). */
static int generate(const char *dir, const char *header) {
  struct output o[64];
  unsigned n = dir ? outputs(o, 64) : 0;
  for (unsigned i = 0; i < n; i++) {
    char *p = path_join(dir, o[i].name);
    int rc = write_text(p, &o[i]);
    free(p);
    if (rc) return -1;
  }
  return header ? write_text(header, &header_output) : 0;
}

/* ---- --check ----------------------------------------------------------------- */
/* diff -u committed generated: 0 same, 1 different, -1 could not run. */
static int diff(const char *committed, const char *generated, const char *label) {
  char *argv[] = {"diff", "-u", "--label", (char *)committed, "--label", (char *)label,
                  (char *)committed, (char *)generated, NULL};
  pid_t pid;
  fflush(stdout);
  int err = posix_spawnp(&pid, "diff", NULL, NULL, argv, environ);
  if (err) {
    fprintf(stderr, "fsm2dot: cannot run diff: %s\n", strerror(err));
    return -1;
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  if (WIFEXITED(st) && WEXITSTATUS(st) <= 1) return WEXITSTATUS(st);
  fprintf(stderr, "fsm2dot: diff %s %s failed\n", committed, generated);
  return -1;
}

/* 0 same, 1 drift (reported), -1 trouble. */
static int compare(const char *committed, const char *generated, const char *name) {
  struct stat st;
  if (stat(committed, &st) != 0) {
    printf("fsm2dot: %s is missing (%s); it is generated from the tables\n", committed, strerror(errno));
    return 1;
  }
  struct mstr l;
  fprintf(mstr_open(&l), "%s (generated from the tables)", name);
  mstr_close(&l);
  int rc = diff(committed, generated, l.p);
  free(l.p);
  if (rc == 1) printf("fsm2dot: %s drifted from the tables\n", committed);
  return rc;
}

/* Diagrams in OUTDIR that no machine makes any more (fsm-*.dot, fsm-*.svg). */
static int stale(const char *dir, const struct output *o, unsigned n) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int found = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (strncmp(e->d_name, "fsm-", 4) || len < 8 || len > 60) continue;
    const char *ext = e->d_name + len - 4;
    if (strcmp(ext, ".dot") && strcmp(ext, ".svg")) continue;
    bool known = false;
    for (unsigned i = 0; i < n && !known; i++)
      known = strlen(o[i].name) == len && !strncmp(o[i].name, e->d_name, len - 4) && !strcmp(o[i].name + len - 4, ".dot");
    if (!known) {
      printf("fsm2dot: %s/%s is made by no machine of the tables: remove it\n", dir, e->d_name);
      found = 1;
    }
  }
  closedir(d);
  return found;
}

static int check(const char *argv0, const char *dir, const char *header) {
  const char *tmpdir = getenv("TMPDIR");
  char *tmp = path_join(tmpdir && *tmpdir ? tmpdir : "/tmp", "fsm2dot.XXXXXX");
  if (!mkdtemp(tmp)) {
    fprintf(stderr, "fsm2dot: mkdtemp %s: %s\n", tmp, strerror(errno));
    free(tmp);
    return 2;
  }
  struct output o[64];
  unsigned n = dir ? outputs(o, 64) : 0;
  char *theader = path_join(tmp, header_output.name);
  int rc = generate(dir ? tmp : NULL, header ? theader : NULL) ? 2 : 0, drift = 0;
  for (unsigned i = 0; rc == 0 && i <= n; i++) {
    if (i == n && !header) break;
    const char *name = i < n ? o[i].name : header_output.name;
    char *c = i < n ? path_join(dir, name) : strdup(header), *g = path_join(tmp, name);
    if (!c) fsm2dot_oom();
    int r = compare(c, g, name);
    if (r < 0) rc = 2;
    drift |= r > 0;
    free(c);
    free(g);
  }
  if (rc == 0 && dir) drift |= stale(dir, o, n);
  for (unsigned i = 0; i < n; i++) {
    char *g = path_join(tmp, o[i].name);
    unlink(g);
    free(g);
  }
  unlink(theader);
  free(theader);
  rmdir(tmp);
  free(tmp);
  if (rc) return rc;
  if (drift) {
    printf("fsm2dot: the committed files do not match the tables (fsm/*.def). Regenerate them with\n"
           "    make docs    (or: cmake --build <builddir> --target fsm-docs)\n"
           "or\n"
           "    %s%s%s%s%s\n"
           "and commit them with the .def files: docs/fsm-*.dot, docs/fsm-*.svg, docs/fsm-tables.md,\n"
           "include/ncfsm/states.h.\n",
           argv0, dir ? " " : "", dir ? dir : "", header ? " --header " : "", header ? header : "");
    return 1;
  }
  if (dir) printf("fsm2dot: %s: the %u files match the tables\n", dir, n);
  if (header) printf("fsm2dot: %s matches the tables\n", header);
  return 0;
}

/* ---- main -------------------------------------------------------------------- */
static void usage(FILE *f) {
  fputs("usage: fsm2dot OUTDIR [--header FILE]   write OUTDIR/fsm-<machine>.dot, fsm-comm-happy.dot,\n"
        "                                        fsm-tables.md (and FILE: include/ncfsm/states.h)\n"
        "       fsm2dot --header FILE            write FILE only\n"
        "       fsm2dot --check [OUTDIR] [--header FILE]\n"
        "                                        exit 1 when they differ from the tables (diff -u)\n",
        f);
}

int main(int argc, char **argv) {
  bool do_check = false;
  const char *dir = NULL, *header = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--check")) {
      do_check = true;
    } else if (!strcmp(argv[i], "--header")) {
      if (++i == argc) {
        fputs("fsm2dot: --header needs a FILE\n", stderr);
        usage(stderr);
        return 2;
      }
      header = argv[i];
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else if (argv[i][0] == '-' || dir) {
      usage(stderr);
      return 2;
    } else {
      dir = argv[i];
    }
  }
  if (!dir && !header) {
    usage(stderr);
    return 2;
  }
  struct stat st;
  if (dir && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
    fprintf(stderr, "fsm2dot: %s is not a directory\n", dir);
    return 2;
  }
  if (lint()) return 2;
  if (do_check) return check(argv[0], dir, header);
  return generate(dir, header) ? 2 : 0;
}
