#include "core/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "ncfsm.h"

int ncfsm__log_level = NCFSM__LOG_WARN;
unsigned ncfsm__log_subsys = NCFSM__SUB_ALL;

static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_init_once(void) {
  const char *lvl = getenv("NCFSM_DEBUG");
  if (lvl) {
    if (!strcasecmp(lvl, "NONE")) ncfsm__log_level = NCFSM__LOG_NONE;
    else if (!strcasecmp(lvl, "ERROR")) ncfsm__log_level = NCFSM__LOG_ERROR;
    else if (!strcasecmp(lvl, "WARN")) ncfsm__log_level = NCFSM__LOG_WARN;
    else if (!strcasecmp(lvl, "INFO")) ncfsm__log_level = NCFSM__LOG_INFO;
    else if (!strcasecmp(lvl, "TRACE")) ncfsm__log_level = NCFSM__LOG_TRACE;
  }
  const char *sub = getenv("NCFSM_DEBUG_SUBSYS");
  if (sub) {
    static const struct { const char *name; unsigned bit; } names[] = {
        {"FSM", NCFSM__SUB_FSM}, {"LOOP", NCFSM__SUB_LOOP}, {"BACKEND", NCFSM__SUB_BACKEND},
        {"SIM", NCFSM__SUB_SIM}, {"BOOT", NCFSM__SUB_BOOT}, {"ALL", NCFSM__SUB_ALL}};
    unsigned mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", sub);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
      for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcasecmp(tok, names[i].name)) mask |= names[i].bit;
    if (mask) ncfsm__log_subsys = mask;
  }
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

long long ncfsm__env_ll(const char *name, long long dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end;
  long long x = strtoll(v, &end, 0);
  return *end ? dflt : x;
}

const char *ncfsm__env_str(const char *name, const char *dflt) {
  const char *v = getenv(name);
  return (v && *v) ? v : dflt;
}
