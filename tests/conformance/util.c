/* Small helpers shared by every scenario: observation strings, the clock,
 * result names, and buffers moved through the backend (device memory on
 * nccl, host memory on the sim). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"
#include "core/log.h"

void ap(char *buf, size_t len, const char *fmt, ...) {
  size_t n = strlen(buf);
  if (n + 2 >= len) return;
  if (n) buf[n++] = ' ', buf[n] = '\0';
  va_list a;
  va_start(a, fmt);
  vsnprintf(buf + n, len - n, fmt, a);
  va_end(a);
}

double now_ms(void) { return (double)ncfsm__now_ns() / 1e6; }

/* "ncclInvalidArgument" -> "InvalidArgument" */
const char *rn(int code) {
  const char *s = ncfsm__nccl_result_name(code);
  return strncmp(s, "nccl", 4) ? s : s + 4;
}
/* "NCFSM_ERR_ILLEGAL_STATE" -> "ILLEGAL_STATE", "NCFSM_OK" -> "OK" */
const char *fn_(ncfsm_result_t r) {
  const char *s = ncfsm_err_name(r);
  if (!strncmp(s, "NCFSM_ERR_", 10)) return s + 10;
  if (!strncmp(s, "NCFSM_", 6)) return s + 6;
  return s;
}
const char *stn(ncfsm_comm *c) { return ncfsm_state_name(ncfsm_comm_state(c)); }

void *rmalloc(ctx_t *x, int dev, size_t bytes) {
  void *p = NULL;
  if (x->be->mem_alloc) {
    if (x->be->mem_alloc(dev, bytes, &p) != 0) return NULL;
  } else {
    p = calloc(1, bytes);
  }
  return p;
}
void rfree(ctx_t *x, int dev, void *p) {
  if (!p) return;
  if (x->be->mem_free) x->be->mem_free(dev, p);
  else free(p);
}
int rcopy(ctx_t *x, int dev, void *dst, const void *src, size_t bytes, int to_dev) {
  if (x->be->memcpy_sync) return x->be->memcpy_sync(dev, dst, src, bytes, to_dev);
  memcpy(dst, src, bytes);
  return 0;
}

/* Fill n int32 with v; check n int32 equal v (1 = all equal). */
int fill_i32(ctx_t *x, int dev, void *p, size_t n, int32_t v) {
  int32_t *h = malloc(n * sizeof *h);
  if (!h) return -1;
  for (size_t i = 0; i < n; i++) h[i] = v;
  int rc = rcopy(x, dev, p, h, n * sizeof *h, 1);
  free(h);
  return rc;
}
int check_i32(ctx_t *x, int dev, const void *p, size_t n, int32_t v, int32_t *first) {
  int32_t *h = malloc(n * sizeof *h);
  if (!h) return 0;
  int ok = rcopy(x, dev, h, p, n * sizeof *h, 0) == 0;
  if (first) *first = h[0];
  for (size_t i = 0; ok && i < n; i++) ok = h[i] == v;
  free(h);
  return ok;
}
int fill_f32(ctx_t *x, int dev, void *p, size_t n, float v) {
  float *h = malloc(n * sizeof *h);
  if (!h) return -1;
  for (size_t i = 0; i < n; i++) h[i] = v;
  int rc = rcopy(x, dev, p, h, n * sizeof *h, 1);
  free(h);
  return rc;
}
int check_f32(ctx_t *x, int dev, const void *p, size_t n, float v) {
  float *h = malloc(n * sizeof *h);
  if (!h) return 0;
  int ok = rcopy(x, dev, h, p, n * sizeof *h, 0) == 0;
  for (size_t i = 0; ok && i < n; i++) ok = h[i] == v;
  free(h);
  return ok;
}
