/*
 * Writing a dump (ncfsm__rec_write): the checks of its metadata, the file
 * names, and each format written to a temp file renamed over the final name.
 * The formats are built by fsm/recorder_json.c and fsm/recorder_torch.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "fsm/dump.h"
#include "fsm/dump_write.h"

char *ncfsm__rec_utf8_clean(const char *s) {
  size_t len = strlen(s);
  char *out = malloc(len + 1);
  if (!out) return NULL;
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0, o = 0;
  while (i < len) {
    unsigned c = p[i];
    size_t need;
    unsigned cp, min;
    if (c < 0x80) {
      out[o++] = (char)c;
      i++;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      need = 1, cp = c & 0x1f, min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
      need = 2, cp = c & 0x0f, min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
      need = 3, cp = c & 0x07, min = 0x10000;
    } else {
      out[o++] = '?';
      i++;
      continue;
    }
    int ok = 1;
    for (size_t k = 1; ok && k <= need; k++) {
      if (i + k >= len || (p[i + k] & 0xc0) != 0x80) ok = 0;
      else cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if (ok && (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))) ok = 0;
    if (!ok) {
      out[o++] = '?';
      i++;
      continue;
    }
    memcpy(out + o, p + i, need + 1);
    o += need + 1;
    i += need + 1;
  }
  out[o] = '\0';
  return out;
}

/* The reasons of fsm/dump.def, and ", error, timeout, ..." for the message
 * (printed from its third character). */
static const char *const reasons[] = {
#define NCFSM_DUMP_REASON(name) #name,
#include "fsm/dump.def"
};
static const char reasons_text[] =
#define NCFSM_DUMP_REASON(name) ", " #name
#include "fsm/dump.def"
    ;

ncfsm_result_t ncfsm__rec_validate(const char *dir, const ncfsm__rec_meta *m,
                                   const ncfsm__rec_entry *e, unsigned n) {
  if (!dir || !*dir || !m) {
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: dump without %s: nothing written",
               !m ? "metadata" : "a directory");
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (n > 0 && !e) {
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: dump of %u entries without the entries", n);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  int known = 0;
  for (size_t i = 0; i < sizeof reasons / sizeof reasons[0]; i++)
    if (m->reason && !strcmp(m->reason, reasons[i])) known = 1;
  if (!known) {
    NCFSM_WARN(NCFSM__SUB_FSM,
               "flight recorder: dump reason \"%s\" is not one of %s: nothing written", nz(m->reason),
               reasons_text + 2);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (m->nranks <= 0 || m->rank < 0 || m->rank >= m->nranks) {
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: rank %d of %d is not a rank: nothing written",
               m->rank, m->nranks);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (m->formats & ~(unsigned)(NCFSM__REC_FMT_JSON | NCFSM__REC_FMT_TORCH)) {
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: unknown dump formats 0x%x: nothing written",
               m->formats);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  return NCFSM_OK;
}

ncfsm_result_t ncfsm__rec_paths(const char *dir, const ncfsm__rec_meta *m, char *json_path,
                                size_t json_len, char *torch_path, size_t torch_len) {
  if (!dir || !*dir || !m) return NCFSM_ERR_INVALID_ARGUMENT;
  size_t dl = strlen(dir);
  const char *sep = dir[dl - 1] == '/' ? "" : "/";
  if (json_path) {
    int k = snprintf(json_path, json_len, "%s%s" NCFSM_DUMP_PREFIX "%016" PRIx64 "_r%d" NCFSM_DUMP_SUFFIX, dir, sep,
                     m->comm_id, m->rank);
    if (k < 0 || (size_t)k >= json_len) return NCFSM_ERR_INVALID_ARGUMENT;
  }
  if (torch_path) {
    int k = snprintf(torch_path, torch_len, "%s%s" NCFSM_DUMP_PREFIX "%016" PRIx64 NCFSM_DUMP_TORCH_INFIX "%d", dir,
                     sep, m->comm_id, m->rank);
    if (k < 0 || (size_t)k >= torch_len) return NCFSM_ERR_INVALID_ARGUMENT;
  }
  return NCFSM_OK;
}

/* Writes data to a temp file in dir, then renames it to path. */
static ncfsm_result_t write_atomic(const char *dir, const char *path, const void *data,
                                   size_t len) {
  char tmp[REC_PATH_MAX];
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t dl = strlen(dir);
  /* Hidden, and ending in ".tmp", so that fr_trace's file-name matching
   * (a rank number at the end) never takes a leftover temp file. */
  int k = snprintf(tmp, sizeof tmp, "%s%s.%s.XXXXXX.tmp", dir, dir[dl - 1] == '/' ? "" : "/", base);
  if (k < 0 || (size_t)k >= sizeof tmp) return NCFSM_ERR_INVALID_ARGUMENT;
  int fd = mkstemps(tmp, 4);
  if (fd < 0) {
    int err = errno;
    NCFSM_WARN(NCFSM__SUB_FSM,
               "flight recorder: cannot create a file in \"%s\": %s; the dump directory must "
               "exist and be writable: %s not written",
               dir, strerror(err), path);
    return NCFSM_ERR_SYSTEM;
  }
  const char *p = data;
  size_t left = len;
  int err = 0;
  while (left > 0) {
    ssize_t w = write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    p += w;
    left -= (size_t)w;
  }
  if (!err && fchmod(fd, 0644) != 0) err = errno;
  if (close(fd) != 0 && !err) err = errno;
  if (!err && rename(tmp, path) != 0) err = errno;
  if (err) {
    unlink(tmp);
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: writing %s failed: %s (disk full or read-only?)",
               path, strerror(err));
    return NCFSM_ERR_SYSTEM;
  }
  return NCFSM_OK;
}

/* CLOCK_REALTIME minus CLOCK_MONOTONIC, now: turns the recorder's monotonic
 * times into wall-clock times. */
static int64_t realtime_offset_ns(void) {
  struct timespec rt, mo;
  clock_gettime(CLOCK_REALTIME, &rt);
  clock_gettime(CLOCK_MONOTONIC, &mo);
  int64_t r = (int64_t)rt.tv_sec * 1000000000 + rt.tv_nsec;
  int64_t m = (int64_t)mo.tv_sec * 1000000000 + mo.tv_nsec;
  return r - m;
}

ncfsm_result_t ncfsm__rec_write(const char *dir, const ncfsm__rec_meta *m,
                                const ncfsm__rec_entry *e, unsigned n) {
  ncfsm_result_t rc = ncfsm__rec_validate(dir, m, e, n);
  if (rc != NCFSM_OK) return rc;
  unsigned fmt = ncfsm__rec_formats(m);
  char jpath[REC_PATH_MAX], tpath[REC_PATH_MAX];
  if (ncfsm__rec_paths(dir, m, jpath, sizeof jpath, tpath, sizeof tpath) != NCFSM_OK) {
    NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: dump directory path too long (%zu bytes): \"%.64s...\"", strlen(dir), dir);
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  int64_t rt_off = realtime_offset_ns();
  if (fmt & NCFSM__REC_FMT_JSON) {
    char *text = ncfsm__rec_json_text(m, e, n, rt_off);
    if (!text) {
      NCFSM_WARN(NCFSM__SUB_FSM,
                 "flight recorder: building the JSON dump %s failed (out of memory, or a "
                 "number above 2^63): not written",
                 jpath);
      rc = NCFSM_ERR_NO_MEMORY;
    } else {
      rc = write_atomic(dir, jpath, text, strlen(text));
      free(text);
    }
  }
  /* a directory that refused the JSON file refuses the other too: one message */
  if ((fmt & NCFSM__REC_FMT_TORCH) && rc != NCFSM_ERR_SYSTEM) {
    unsigned char *buf;
    size_t len;
    ncfsm_result_t trc;
    if (ncfsm__rec_torch_pickle(m, e, n, rt_off, &buf, &len) != 0) {
      NCFSM_WARN(NCFSM__SUB_FSM, "flight recorder: out of memory building %s: not written", tpath);
      trc = NCFSM_ERR_NO_MEMORY;
    } else {
      trc = write_atomic(dir, tpath, buf, len);
    }
    free(buf);
    if (rc == NCFSM_OK) rc = trc;
  }
  return rc;
}

