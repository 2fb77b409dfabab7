/*
 * The null backend: every call succeeds at once and moves no data; events
 * are complete when recorded. It exists to measure the engine's own cost
 * per op (bench/engine_overhead) and is selected with NCFSM_BACKEND=null.
 * It is not a model of NCCL: use the sim for behaviour.
 */
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/log.h"

static int n_open(char *why, size_t len) { (void)why; (void)len; return 0; }
static int n_version(void) { return 22809; }
static unsigned n_features(void) { return NCFSM__HAS_REVOKE | NCFSM__HAS_ALLTOALL | NCFSM__HAS_GATHER | NCFSM__HAS_SCATTER; }
static int n_uid(ncfsm_unique_id *id) { memset(id, 0x4e, sizeof *id); return 0; }
static int n_init(void **bc, int nranks, const ncfsm_unique_id *id, int rank, const ncfsm__comm_config *cfg) {
  (void)nranks; (void)id; (void)rank; (void)cfg;
  *bc = malloc(1);
  return *bc ? NCFSM__NCCL_SUCCESS : NCFSM__NCCL_SYSTEM_ERROR;
}
static int n_async(void *bc, int *st) { (void)bc; *st = NCFSM__NCCL_SUCCESS; return 0; }
static int n_void(void) { return 0; }
uint64_t ncfsm__null_group_end_ns;
static int n_group_end(void) {
  uint64_t ns = ncfsm__null_group_end_ns;
  for (uint64_t t0 = ns ? ncfsm__now_ns() : 0; ns && ncfsm__now_ns() - t0 < ns;) {
  }
  return 0;
}
static int n_op(void *bc, const ncfsm__op *op) { (void)bc; (void)op; return 0; }
static int n_free(void *bc) { free(bc); return 0; }
static int n_revoke(void *bc, int flags) { (void)bc; (void)flags; return 0; }
static const char *n_last(void *bc) { (void)bc; return ""; }
static int n_screate(int dev, void **s) { int *d = malloc(sizeof *d); if (!d) return 1; *d = dev; *s = d; return 0; }
static int n_sfree(void *s) { free(s); return 0; }
static int n_sdev(void *s, int *dev) { *dev = *(int *)s; return 0; }
static int n_ecreate(int dev, void **e) { (void)dev; *e = malloc(1); return *e ? 0 : 1; }
static int n_erecord(void *e, void *s) { (void)e; (void)s; return 0; }
static int n_equery(void *e) { (void)e; return 0; }
static int n_elapsed(void *a, void *b, float *ms) { (void)a; (void)b; *ms = 0; return 0; }
static int n_efree(void *e) { free(e); return 0; }
static int n_devs(void) { return 0; }

const ncfsm__backend ncfsm__backend_null = {
    .name = "null", .kind = NCFSM_BACKEND_SIM, .open = n_open, .version = n_version,
    .features = n_features, .get_unique_id = n_uid, .comm_init = n_init, .get_async_error = n_async,
    .group_start = n_void, .group_end = n_group_end, .op = n_op, .finalize = n_free, .destroy = n_free,
    .abort = n_free, .revoke = n_revoke, .last_error = n_last, .stream_create = n_screate,
    .stream_destroy = n_sfree, .stream_device = n_sdev, .event_create = n_ecreate,
    .event_record = n_erecord, .event_query = n_equery, .event_elapsed_ms = n_elapsed,
    .event_destroy = n_efree, .device_count = n_devs};
