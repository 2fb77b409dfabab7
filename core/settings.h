/* The settings table (core/settings.def) and its strict parser: every
 * environment variable ncfsm reads goes through here. A value is parsed
 * whole: numbers are decimal (or 0x hex) with no sign unless the range has
 * negative values, no spaces or trailing characters, inside the row's range;
 * words match one of the row's words exactly, ignoring case; an empty value
 * is the same as unset. An error names the variable, the value, what is
 * accepted and what to do. */
#ifndef NCFSM_CORE_SETTINGS_H
#define NCFSM_CORE_SETTINGS_H

#include <stddef.h>
#include <stdint.h>

#include "ncfsm.h"
#include "ncfsm/bootstrap.h"

typedef enum ncfsm__setting_id {
#define NCFSM_SETTING(key, ...) NCFSM__SET_##key,
#include "core/settings.def"
#undef NCFSM_SETTING
  NCFSM__SET_COUNT
} ncfsm__setting_id;

typedef enum ncfsm__subsys_id {
#define NCFSM_SUBSYS(id, title, reader) NCFSM__SS_##id,
#include "core/settings.def"
#undef NCFSM_SUBSYS
  NCFSM__SS_COUNT
} ncfsm__subsys_id;

typedef enum { NCFSM__SRC_ENV, NCFSM__SRC_RAW, NCFSM__SRC_OPT } ncfsm__setting_src;
typedef enum {
  NCFSM__T_BOOL, NCFSM__T_INT, NCFSM__T_UINT, NCFSM__T_MS, NCFSM__T_US, NCFSM__T_BYTES,
  NCFSM__T_ENUM, NCFSM__T_LIST, NCFSM__T_STR, NCFSM__T_PATH, NCFSM__T_ADDR, NCFSM__T_SECRET
} ncfsm__setting_type;
/* The option structs a row's field may be in. */
typedef enum { NCFSM__ST_NONE, NCFSM__ST_COMM, NCFSM__ST_LOOP, NCFSM__ST_SIM, NCFSM__ST_BOOT } ncfsm__opts_struct;

typedef struct ncfsm__setting {
  const char *env;       /* the variable, NULL for an option field without one */
  const char *key;       /* the row's key */
  ncfsm__setting_src src;
  ncfsm__setting_type type;
  const char *dflt;      /* NULL: unset means what effect says */
  int64_t min;
  uint64_t max;
  const char *lowest;    /* what min means, or NULL */
  const char *words;     /* "a|b|c" or NULL */
  ncfsm__opts_struct st; /* the struct of field (NONE: no field) */
  size_t offset, size;   /* of the field in st */
  const char *field;     /* "ncfsm_comm_opts.timeout_ms", or what it feeds, or NULL */
  ncfsm__subsys_id subsys;
  const char *effect;
} ncfsm__setting;

extern const ncfsm__setting ncfsm__settings[NCFSM__SET_COUNT];

typedef struct ncfsm__subsys {
  const char *id, *title, *reader;
} ncfsm__subsys;
extern const ncfsm__subsys ncfsm__subsystems[NCFSM__SS_COUNT];

/* A parsed value. */
typedef struct ncfsm__setting_val {
  uint64_t u;    /* BOOL, UINT, MS, US, BYTES: the number; ENUM: the word's index; LIST: bit i
                    for word i */
  int64_t i;     /* INT: the number */
  int word;      /* ENUM, or a number's extra word: its index; -1 otherwise */
  const char *s; /* the text parsed (the environment's or the default), NULL when unset with no
                    default */
  int from_env;  /* 1: the environment's value */
} ncfsm__setting_val;

/* The row of an environment variable, or NULL. */
const ncfsm__setting *ncfsm__setting_find(const char *env);
/* Parses text as s's value: 0, or -1 with the message in err. */
int ncfsm__setting_parse(const ncfsm__setting *s, const char *text, ncfsm__setting_val *out, char *err,
                         size_t errlen);
/* The value of s from the environment, or its default when unset or empty:
 * 0, or -1 with the message in err (*out then holds the default). */
int ncfsm__setting_get(const ncfsm__setting *s, ncfsm__setting_val *out, char *err, size_t errlen);
/* The same by id, for a reader that cannot fail (the sim's and the nccl
 * backend's reads where they use a value; the calls that make their comms
 * refused a bad value first): a bad value is logged (WARN) and *out holds
 * the default; NCFSM_ERR_INVALID_ARGUMENT then. */
ncfsm_result_t ncfsm__setting_env(ncfsm__setting_id id, ncfsm__setting_val *out);

/* "0 = off, or 1..600000", "one of abort, stay, ...": what s accepts. */
void ncfsm__setting_accepted(const ncfsm__setting *s, char *buf, size_t len);
/* The value as the table writes it: "600000", "abort", "FSM,LOOP", ... */
void ncfsm__setting_format(const ncfsm__setting *s, const ncfsm__setting_val *v, char *buf, size_t len);
/* "duration, ms", "one of", ...: the type in words. */
const char *ncfsm__setting_type_name(ncfsm__setting_type t);

/* Fill every field of the struct from the table: the environment's value,
 * else the default (option fields without a variable: the default). Each
 * bad value is logged and its default kept; the first one's message is this
 * thread's options error and the result NCFSM_ERR_INVALID_ARGUMENT. The
 * public *_opts_init do the same for their structs, and check the rows read
 * where they are used as ncfsm__comm_opts_check and ncfsm__sim_opts_check
 * do. */
ncfsm_result_t ncfsm__boot_opts_fill(ncfsm_boot_opts *o);

/* Check every field of user options against the table: NCFSM_OK, or
 * NCFSM_ERR_INVALID_ARGUMENT with "<call>: ncfsm_comm_opts.on_error = 9: ..."
 * as this thread's options error. Then the rows without a field that the
 * options lead to, from the environment, refused as the fills refuse them:
 * for comm options ncfsm__backend_env_check's rows; for sim options every
 * process-wide sim row (ncfsm__settings_env_check(NCFSM__SS_SIM)). */
ncfsm_result_t ncfsm__comm_opts_check(const ncfsm_comm_opts *o, const char *call);
ncfsm_result_t ncfsm__loop_opts_check(const ncfsm_loop_opts *o, const char *call);
ncfsm_result_t ncfsm__sim_opts_check(const ncfsm_sim_opts *o, const char *call);

/* The rows of subsystem ss that have a variable and fill no field (read
 * where they are used: NCFSM__SS_SIM's NCFSM_SIM_NCCL_VERSION, _WAIT_MS,
 * _DRIFT_LIMIT, _SHM_BYTES, _MISMATCH) all parse: 0, or -1 with the first
 * refused one's message in err. Nothing is logged. */
int ncfsm__settings_env_check(ncfsm__subsys_id ss, char *err, size_t len);

/* The settings the choice of a backend of this kind reads: NCFSM_BACKEND
 * when kind is auto, NCFSM_PUSH_WAKE unless it is sim. NCFSM_OK, or
 * NCFSM_ERR_INVALID_ARGUMENT with the message logged and as this thread's
 * options error (cleared first). ncfsm_get_unique_id calls it; ncfsm_comm_new
 * through its options (ncfsm_comm_opts_init, ncfsm__comm_opts_check). */
ncfsm_result_t ncfsm__backend_env_check(ncfsm_backend_kind_t kind);

/* Clear this thread's options error (the start of every call that sets it). */
void ncfsm__opts_error_clear(void);

#endif
