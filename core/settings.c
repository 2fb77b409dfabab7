/* The settings table and its strict parser (core/settings.h). The option
 * structs are filled and checked from the table in core/settings_opts.c. */
#include "core/settings.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define NCFSM__STYPE_COMM ncfsm_comm_opts
#define NCFSM__STYPE_LOOP ncfsm_loop_opts
#define NCFSM__STYPE_SIM ncfsm_sim_opts
#define NCFSM__STYPE_BOOT ncfsm_boot_opts
#define NCFSM__SNAME_COMM "ncfsm_comm_opts"
#define NCFSM__SNAME_LOOP "ncfsm_loop_opts"
#define NCFSM__SNAME_SIM "ncfsm_sim_opts"
#define NCFSM__SNAME_BOOT "ncfsm_boot_opts"

/* A field column expands to: struct, offset, size, name. */
#define NCFSM_FIELD(S, m) \
  NCFSM__ST_##S, offsetof(NCFSM__STYPE_##S, m), sizeof(((NCFSM__STYPE_##S *)0)->m), NCFSM__SNAME_##S "." #m
#define NCFSM_NOFIELD(text) NCFSM__ST_NONE, 0, 0, text
#define ENV_NAME_ENV(key) "NCFSM_" #key
#define ENV_NAME_RAW(key) #key
#define ENV_NAME_OPT(key) NULL

const ncfsm__setting ncfsm__settings[NCFSM__SET_COUNT] = {
#define NCFSM_SETTING(key, src, type, dflt, min, max, lowest, words, field, subsys, effect)                  \
  {ENV_NAME_##src(key), #key, NCFSM__SRC_##src, NCFSM__T_##type, dflt, (int64_t)(min), (uint64_t)(max), lowest, \
   words, field, NCFSM__SS_##subsys, effect},
#include "core/settings.def"
#undef NCFSM_SETTING
};

const ncfsm__subsys ncfsm__subsystems[NCFSM__SS_COUNT] = {
#define NCFSM_SUBSYS(id, title, reader) {#id, title, reader},
#include "core/settings.def"
#undef NCFSM_SUBSYS
};

const ncfsm__setting *ncfsm__setting_find(const char *env) {
  if (!env) return NULL;
  for (int i = 0; i < NCFSM__SET_COUNT; i++)
    if (ncfsm__settings[i].env && !strcmp(ncfsm__settings[i].env, env)) return &ncfsm__settings[i];
  return NULL;
}

const char *ncfsm__setting_type_name(ncfsm__setting_type t) {
  switch (t) {
  case NCFSM__T_BOOL: return "bool";
  case NCFSM__T_INT: return "integer";
  case NCFSM__T_UINT: return "count";
  case NCFSM__T_MS: return "duration, ms";
  case NCFSM__T_US: return "duration, us";
  case NCFSM__T_BYTES: return "size, bytes";
  case NCFSM__T_ENUM: return "word";
  case NCFSM__T_LIST: return "list of words";
  case NCFSM__T_STR: return "string";
  case NCFSM__T_PATH: return "path";
  case NCFSM__T_ADDR: return "HOST:PORT";
  case NCFSM__T_SECRET: return "secret";
  }
  return "?";
}

static int is_number(ncfsm__setting_type t) {
  return t == NCFSM__T_BOOL || t == NCFSM__T_INT || t == NCFSM__T_UINT || t == NCFSM__T_MS ||
         t == NCFSM__T_US || t == NCFSM__T_BYTES;
}

/* The i-th word of "a|b|c" into buf; 0 when there is none. */
static int word_at(const char *words, int i, char *buf, size_t len) {
  if (!words) return 0;
  const char *p = words;
  for (; i > 0; i--) {
    p = strchr(p, '|');
    if (!p) return 0;
    p++;
  }
  size_t n = strcspn(p, "|");
  if (n >= len) n = len - 1;
  memcpy(buf, p, n);
  buf[n] = '\0';
  return 1;
}

/* The index of the word text[0..n) in words (ignoring case), or -1. */
static int word_index(const char *words, const char *text, size_t n) {
  char w[64];
  for (int i = 0; word_at(words, i, w, sizeof w); i++)
    if (strlen(w) == n && !strncasecmp(w, text, n)) return i;
  return -1;
}

/* "a, b, c" (sep ", ") into buf at *off. */
static void words_list(const char *words, char *buf, size_t len, size_t *off) {
  char w[64];
  for (int i = 0; word_at(words, i, w, sizeof w); i++) {
    int n = snprintf(buf + *off, len - *off, "%s%s", i ? ", " : "", w);
    if (n < 0 || (size_t)n >= len - *off) return;
    *off += (size_t)n;
  }
}

static void append(char *buf, size_t len, size_t *off, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t len, size_t *off, const char *fmt, ...) {
  if (*off >= len) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *off, len - *off, fmt, ap);
  va_end(ap);
  if (n > 0) *off = *off + (size_t)n < len ? *off + (size_t)n : len - 1;
}

void ncfsm__setting_accepted(const ncfsm__setting *s, char *buf, size_t len) {
  size_t off = 0;
  buf[0] = '\0';
  switch (s->type) {
  case NCFSM__T_BOOL: append(buf, len, &off, "0 or 1"); break;
  case NCFSM__T_ENUM:
    append(buf, len, &off, "one of ");
    words_list(s->words, buf, len, &off);
    break;
  case NCFSM__T_LIST:
    append(buf, len, &off, "a comma-separated list of ");
    words_list(s->words, buf, len, &off);
    break;
  case NCFSM__T_ADDR: append(buf, len, &off, "HOST:PORT or [IPv6]:PORT, PORT 0..65535"); break;
  case NCFSM__T_STR:
  case NCFSM__T_PATH: append(buf, len, &off, "any text"); break;
  case NCFSM__T_SECRET: append(buf, len, &off, "any text (never printed)"); break;
  default:
    if (s->type == NCFSM__T_INT) {
      if (s->lowest) append(buf, len, &off, "%" PRId64 " = %s, or %" PRId64 "..", s->min, s->lowest, s->min + 1);
      else append(buf, len, &off, "%" PRId64 "..", s->min);
      append(buf, len, &off, "%" PRId64, (int64_t)s->max);
    } else {
      uint64_t lo = (uint64_t)s->min;
      if (s->lowest) append(buf, len, &off, "%" PRIu64 " = %s, or %" PRIu64 "..", lo, s->lowest, lo + 1);
      else append(buf, len, &off, "%" PRIu64 "..", lo);
      append(buf, len, &off, "%" PRIu64, s->max);
    }
    if (s->words) {
      append(buf, len, &off, ", or ");
      words_list(s->words, buf, len, &off);
    }
  }
}

/* A value to suggest: the default, else the lowest accepted one. */
static void example(const ncfsm__setting *s, char *buf, size_t len) {
  if (s->dflt) snprintf(buf, len, "%s", s->dflt);
  else if (s->type == NCFSM__T_ADDR) snprintf(buf, len, "127.0.0.1:29500");
  else if (s->type == NCFSM__T_ENUM || s->type == NCFSM__T_LIST) word_at(s->words, 0, buf, len);
  else if (s->type == NCFSM__T_INT) snprintf(buf, len, "%" PRId64, s->min);
  else snprintf(buf, len, "%" PRIu64, (uint64_t)s->min);
}

static int fail(const ncfsm__setting *s, const char *text, const char *why, char *err, size_t errlen) {
  char acc[256], ex[64];
  ncfsm__setting_accepted(s, acc, sizeof acc);
  example(s, ex, sizeof ex);
  const char *name = s->env ? s->env : s->field;
  snprintf(err, errlen, "%s=%s: %s (accepted: %s); unset it or set e.g. %s=%s", name, text, why, acc, name, ex);
  return -1;
}

static const char *not_a(ncfsm__setting_type t) {
  switch (t) {
  case NCFSM__T_BOOL: return "not 0 or 1";
  case NCFSM__T_INT: return "not an integer";
  case NCFSM__T_MS: return "not a duration in ms";
  case NCFSM__T_US: return "not a duration in us";
  case NCFSM__T_BYTES: return "not a size in bytes";
  default: return "not a whole number";
  }
}

/* Digits only (decimal, or 0x hex), no sign, no space: 0 and *v, or -1
 * (not a number) or -2 (more than 64 bits). */
static int parse_magnitude(const char *p, uint64_t *v) {
  unsigned base = 10;
  if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
    base = 16;
    p += 2;
  }
  if (!*p) return -1;
  uint64_t x = 0;
  int big = 0;
  for (; *p; p++) {
    unsigned d;
    if (*p >= '0' && *p <= '9') d = (unsigned)(*p - '0');
    else if (base == 16 && isxdigit((unsigned char)*p)) d = (unsigned)(tolower((unsigned char)*p) - 'a' + 10);
    else return -1;
    if (x > (UINT64_MAX - d) / base) big = 1;
    else x = x * base + d;
  }
  *v = x;
  return big ? -2 : 0;
}

static int parse_number(const ncfsm__setting *s, const char *text, ncfsm__setting_val *out, char *err,
                        size_t errlen) {
  if (s->words) {
    int w = word_index(s->words, text, strlen(text));
    if (w >= 0) {
      out->word = w;
      return 0;
    }
  }
  int neg = text[0] == '-' && s->type == NCFSM__T_INT; /* then the range decides */
  uint64_t mag = 0;
  int rc = parse_magnitude(text + neg, &mag);
  if (rc == -1) return fail(s, text, not_a(s->type), err, errlen);
  if (rc == -2) return fail(s, text, "out of range", err, errlen);
  if (s->type == NCFSM__T_INT) {
    if (neg ? mag > (uint64_t)INT64_MAX + 1 : mag > (uint64_t)INT64_MAX) return fail(s, text, "out of range", err, errlen);
    int64_t x = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    if (x < s->min || x > (int64_t)s->max) return fail(s, text, "out of range", err, errlen);
    out->i = x;
    out->u = (uint64_t)x;
    return 0;
  }
  if (mag < (uint64_t)s->min || mag > s->max)
    return fail(s, text, s->type == NCFSM__T_BOOL ? "not 0 or 1" : "out of range", err, errlen);
  out->u = mag;
  return 0;
}

static int parse_list(const ncfsm__setting *s, const char *text, ncfsm__setting_val *out, char *err,
                      size_t errlen) {
  uint64_t mask = 0;
  for (const char *p = text;; p++) {
    size_t n = strcspn(p, ",");
    int w = word_index(s->words, p, n);
    if (w < 0) {
      char why[96];
      snprintf(why, sizeof why, "\"%.*s\" is not an accepted word", (int)(n < 32 ? n : 32), p);
      return fail(s, text, why, err, errlen);
    }
    mask |= 1ull << w;
    p += n;
    if (!*p) break;
  }
  out->u = mask;
  return 0;
}

/* HOST:PORT or [IPv6]:PORT, PORT decimal 0..65535. */
static int parse_addr(const ncfsm__setting *s, const char *text, char *err, size_t errlen) {
  const char *colon;
  if (text[0] == '[') {
    const char *close = strchr(text, ']');
    if (!close || close == text + 1 || close[1] != ':') return fail(s, text, "not HOST:PORT", err, errlen);
    colon = close + 1;
  } else {
    colon = strrchr(text, ':');
    if (!colon || colon == text || memchr(text, ':', (size_t)(colon - text)))
      return fail(s, text, "not HOST:PORT", err, errlen);
  }
  for (const char *p = text; p < colon; p++)
    if (isspace((unsigned char)*p)) return fail(s, text, "not HOST:PORT", err, errlen);
  const char *port = colon + 1;
  if (!*port || strlen(port) > 5 || strspn(port, "0123456789") != strlen(port))
    return fail(s, text, "the port is not a number", err, errlen);
  if (atoi(port) > 65535) return fail(s, text, "the port is past 65535", err, errlen);
  return 0;
}

int ncfsm__setting_parse(const ncfsm__setting *s, const char *text, ncfsm__setting_val *out, char *err,
                         size_t errlen) {
  memset(out, 0, sizeof *out);
  out->word = -1;
  out->s = text;
  if (err && errlen) err[0] = '\0';
  if (!text) return 0;
  if (is_number(s->type)) return parse_number(s, text, out, err, errlen);
  switch (s->type) {
  case NCFSM__T_ENUM: {
    int w = word_index(s->words, text, strlen(text));
    if (w < 0) return fail(s, text, "not an accepted word", err, errlen);
    out->word = w;
    out->u = (uint64_t)w;
    return 0;
  }
  case NCFSM__T_LIST: return parse_list(s, text, out, err, errlen);
  case NCFSM__T_ADDR: return parse_addr(s, text, err, errlen);
  default: return 0; /* STR, PATH, SECRET: any text */
  }
}

int ncfsm__setting_get(const ncfsm__setting *s, ncfsm__setting_val *out, char *err, size_t errlen) {
  const char *v = s->env ? getenv(s->env) : NULL;
  if (v && *v) {
    int rc = ncfsm__setting_parse(s, v, out, err, errlen);
    out->from_env = 1;
    if (rc == 0) return 0;
    char ignored[8];
    ncfsm__setting_parse(s, s->dflt, out, ignored, sizeof ignored);
    out->from_env = 1;
    return -1;
  }
  return ncfsm__setting_parse(s, s->dflt, out, err, errlen);
}

void ncfsm__setting_format(const ncfsm__setting *s, const ncfsm__setting_val *v, char *buf, size_t len) {
  char w[64];
  if (v->word >= 0 && word_at(s->words, v->word, w, sizeof w)) {
    snprintf(buf, len, "%s", w);
    return;
  }
  size_t off = 0;
  buf[0] = '\0';
  switch (s->type) {
  case NCFSM__T_LIST:
    for (int i = 0; word_at(s->words, i, w, sizeof w); i++)
      if (v->u & (1ull << i)) append(buf, len, &off, "%s%s", off ? "," : "", w);
    return;
  case NCFSM__T_SECRET: snprintf(buf, len, "%s", v->s ? "(set, not shown)" : "(unset)"); return;
  case NCFSM__T_STR:
  case NCFSM__T_PATH:
  case NCFSM__T_ADDR: snprintf(buf, len, "%s", v->s ? v->s : "(unset)"); return;
  default: break;
  }
  if (!v->s) {
    snprintf(buf, len, "(unset)");
    return;
  }
  if (s->type == NCFSM__T_INT) append(buf, len, &off, "%" PRId64, v->i);
  else append(buf, len, &off, "%" PRIu64, v->u);
  if (s->lowest && (s->type == NCFSM__T_INT ? v->i == s->min : v->u == (uint64_t)s->min))
    append(buf, len, &off, " (%s)", s->lowest);
}
