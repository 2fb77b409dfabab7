/* Logging filtered by level and subsystem (NCFSM_DEBUG, NCFSM_DEBUG_SUBSYS),
 * in the manner of NCCL_DEBUG / NCCL_DEBUG_SUBSYS. */
#ifndef NCFSM_CORE_LOG_H
#define NCFSM_CORE_LOG_H

#include <stdint.h>

enum { NCFSM__LOG_NONE = 0, NCFSM__LOG_ERROR, NCFSM__LOG_WARN, NCFSM__LOG_INFO, NCFSM__LOG_TRACE };
enum {
  NCFSM__SUB_FSM = 1u << 0,
  NCFSM__SUB_LOOP = 1u << 1,
  NCFSM__SUB_BACKEND = 1u << 2,
  NCFSM__SUB_SIM = 1u << 3,
  NCFSM__SUB_BOOT = 1u << 4,
  NCFSM__SUB_ALL = 0xffffffffu
};

extern int ncfsm__log_level;
extern unsigned ncfsm__log_subsys;

void ncfsm__log_init(void); /* idempotent; reads the environment once */
void ncfsm__log_emit(int level, unsigned subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#define NCFSM_LOG(level, subsys, ...)                                                \
  do {                                                                               \
    if ((level) <= ncfsm__log_level && ((subsys)&ncfsm__log_subsys))                 \
      ncfsm__log_emit((level), (subsys), __FILE__, __LINE__, __VA_ARGS__);           \
  } while (0)
#define NCFSM_WARN(subsys, ...) NCFSM_LOG(NCFSM__LOG_WARN, subsys, __VA_ARGS__)
#define NCFSM_INFO(subsys, ...) NCFSM_LOG(NCFSM__LOG_INFO, subsys, __VA_ARGS__)
#define NCFSM_TRACE(subsys, ...) NCFSM_LOG(NCFSM__LOG_TRACE, subsys, __VA_ARGS__)

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t ncfsm__now_ns(void);

/* Environment helpers of the readers that do not use the settings table
 * (core/settings.h) yet: the value, or dflt when unset or empty. Every
 * variable read has a row in core/settings.def; a value the row refuses is
 * logged with the table's message, and a number then falls back to dflt while
 * text is passed on unchanged (defined in core/settings_opts.c). */
long long ncfsm__env_ll(const char *name, long long dflt);
const char *ncfsm__env_str(const char *name, const char *dflt);

#endif
