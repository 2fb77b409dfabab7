#include "core/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/settings.h"
#include "ncfsm.h"

/* The public levels (ncfsm_log_level_t) are these. */
_Static_assert((int)NCFSM_LOG_NONE == (int)NCFSM__LOG_NONE && (int)NCFSM_LOG_ERROR == (int)NCFSM__LOG_ERROR &&
                   (int)NCFSM_LOG_WARN == (int)NCFSM__LOG_WARN && (int)NCFSM_LOG_INFO == (int)NCFSM__LOG_INFO &&
                   (int)NCFSM_LOG_TRACE == (int)NCFSM__LOG_TRACE,
               "ncfsm_log_level_t (include/ncfsm.h) and core/log.h's levels differ");

int ncfsm__log_level = NCFSM__LOG_WARN;
unsigned ncfsm__log_subsys = NCFSM__SUB_ALL;

static pthread_once_t log_once = PTHREAD_ONCE_INIT;

/* NCFSM_DEBUG and NCFSM_DEBUG_SUBSYS through the settings table: their
 * words are the levels and the subsystem bits in order. A bad value keeps
 * the default and is printed (the level is still WARN then). */
static void log_init_once(void) {
  ncfsm__setting_val v;
  char err[400];
  if (ncfsm__setting_get(&ncfsm__settings[NCFSM__SET_DEBUG], &v, err, sizeof err) == 0)
    ncfsm__log_level = (int)v.u;
  else
    NCFSM_WARN(NCFSM__SUB_ALL, "%s", err);
  if (ncfsm__setting_get(&ncfsm__settings[NCFSM__SET_DEBUG_SUBSYS], &v, err, sizeof err) == 0)
    ncfsm__log_subsys = (v.u & (1u << 5)) ? NCFSM__SUB_ALL : (unsigned)v.u; /* word 5: ALL */
  else
    NCFSM_WARN(NCFSM__SUB_ALL, "%s", err);
}

void ncfsm__log_init(void) { pthread_once(&log_once, log_init_once); }

void ncfsm_set_log_level(int level) {
  ncfsm__log_init();
  ncfsm__log_level = level;
}

__attribute__((constructor)) static void log_ctor(void) { ncfsm__log_init(); }

void ncfsm__log_emit(int level, unsigned subsys, const char *file, int line, const char *fmt, ...) {
  static const char *lv[] = {"NONE", "ERROR", "WARN", "INFO", "TRACE"};
  (void)subsys;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *base = strrchr(file, '/');
  fprintf(stderr, "ncfsm %d %s %s:%d %s\n", (int)getpid(), lv[level], base ? base + 1 : file, line,
          msg);
}

uint64_t ncfsm__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
