/*
 * What the recorder's dump files share (fsm/recorder_write.c, _json.c,
 * _torch.c, _thread.c); not part of the engine's interface, which is
 * fsm/recorder.h.
 */
#ifndef NCFSM_FSM_DUMP_WRITE_H
#define NCFSM_FSM_DUMP_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "fsm/recorder.h"

#define REC_PATH_MAX 4096

static inline const char *nz(const char *s) { return s ? s : ""; }

/* The formats a dump of m writes: m->formats, or both when 0. */
static inline unsigned ncfsm__rec_formats(const ncfsm__rec_meta *m) {
  return m->formats ? m->formats : (NCFSM__REC_FMT_JSON | NCFSM__REC_FMT_TORCH);
}

/* A copy of s with every byte that does not start a valid UTF-8 sequence
 * (overlong forms, surrogates and code points above U+10FFFF included)
 * replaced by '?': jansson and Python's pickle loader both reject invalid
 * UTF-8. NULL when out of memory. */
char *ncfsm__rec_utf8_clean(const char *s);

/* The checks of ncfsm__rec_write's arguments (fsm/recorder.h), each failure
 * logged: NCFSM_OK or NCFSM_ERR_INVALID_ARGUMENT. */
ncfsm_result_t ncfsm__rec_validate(const char *dir, const ncfsm__rec_meta *m,
                                   const ncfsm__rec_entry *e, unsigned n);

/* The JSON dump's text (malloc'd), or NULL when out of memory or a number
 * does not fit in an int64. rt_off: CLOCK_REALTIME - CLOCK_MONOTONIC. */
char *ncfsm__rec_json_text(const ncfsm__rec_meta *m, const ncfsm__rec_entry *e, unsigned n,
                           int64_t rt_off);

/* The PyTorch pickle in *buf (malloc'd, *len bytes); -1 when out of memory
 * (*buf is then NULL). */
int ncfsm__rec_torch_pickle(const ncfsm__rec_meta *m, const ncfsm__rec_entry *e, unsigned n,
                            int64_t rt_off, unsigned char **buf, size_t *len);

#endif
