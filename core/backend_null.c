/*
 * The null backend: every call succeeds at once and moves no data; events
 * are complete when recorded. It exists to measure the engine's own cost
 * per op (bench/engine_overhead) and is selected with NCFSM_BACKEND=null.
 * It is not a model of NCCL: use the sim for behaviour.
 */
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"

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
    "null", NCFSM_BACKEND_SIM, n_open, n_version, n_features, n_uid, n_init, n_async, n_void, n_void,
    n_op, n_free, n_free, n_free, n_revoke, n_last, n_screate, n_sfree, n_sdev, n_ecreate, n_erecord,
    n_equery, n_elapsed, n_efree, n_devs};
