/* Backend selection: NCFSM_BACKEND=auto|sim|nccl|null (core/settings.def). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/backend.h"
#include "core/log.h"
#include "core/settings.h"

const char *ncfsm_backend_name(ncfsm_backend_kind_t b) {
  switch (b) {
    case NCFSM_BACKEND_AUTO: return "auto";
    case NCFSM_BACKEND_SIM: return "sim";
    case NCFSM_BACKEND_NCCL: return "nccl";
  }
  return "unknown";
}

static const ncfsm__backend *open_or_null(const ncfsm__backend *be, char *why, size_t why_len) {
  if (be->open(why, why_len) != 0) return NULL;
  return be;
}

const ncfsm__backend *ncfsm__backend_get(ncfsm_backend_kind_t kind, char *why, size_t why_len) {
  char dummy[8];
  if (!why) { why = dummy; why_len = sizeof dummy; }
  why[0] = '\0';
  if (kind == NCFSM_BACKEND_AUTO) {
    /* A refused value: NULL with the settings message (ncfsm_comm_new and
     * ncfsm_get_unique_id refuse it first: ncfsm__backend_env_check). */
    ncfsm__setting_val v;
    if (ncfsm__setting_get(&ncfsm__settings[NCFSM__SET_BACKEND], &v, why, why_len) != 0) return NULL;
    if (v.u == 3) return &ncfsm__backend_null; /* words auto|sim|nccl|null: the first three are the kinds */
    kind = (ncfsm_backend_kind_t)v.u;
  }
  switch (kind) {
    case NCFSM_BACKEND_SIM:
      return open_or_null(&ncfsm__backend_sim, why, why_len);
    case NCFSM_BACKEND_NCCL:
#ifdef NCFSM_HAVE_NCCL
      return open_or_null(&ncfsm__backend_nccl, why, why_len);
#else
      snprintf(why, why_len, "this build has no nccl backend (CUDA toolkit/NCCL not found at configure time)");
      return NULL;
#endif
    case NCFSM_BACKEND_AUTO:
    default: {
#ifdef NCFSM_HAVE_NCCL
      char tmp[256];
      if (ncfsm__backend_nccl.open(tmp, sizeof tmp) == 0 && ncfsm__backend_nccl.device_count() > 0)
        return &ncfsm__backend_nccl;
      NCFSM_INFO(NCFSM__SUB_BACKEND, "auto: no usable GPU (%s), using sim", tmp[0] ? tmp : "0 devices");
#endif
      return open_or_null(&ncfsm__backend_sim, why, why_len);
    }
  }
}

ncfsm_result_t ncfsm_backend_query(ncfsm_backend_kind_t kind, ncfsm_backend_info *out) {
  if (!out) return NCFSM_ERR_INVALID_ARGUMENT;
  memset(out, 0, sizeof *out);
  const ncfsm__backend *be = ncfsm__backend_get(kind, out->why, sizeof out->why);
  if (!be) return NCFSM_ERR_UNSUPPORTED;
  out->kind = be->kind;
  out->name = be->name;
  out->nccl_version = be->version();
  out->device_count = be->kind == NCFSM_BACKEND_NCCL ? be->device_count() : 0;
  out->has_revoke = (be->features() & NCFSM__HAS_REVOKE) != 0;
  return NCFSM_OK;
}

int ncfsm__thread_detached(void *(*fn)(void *), void *arg) {
  pthread_t t;
  pthread_attr_t at;
  int rc = pthread_attr_init(&at);
  if (rc) return rc;
  rc = pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (!rc) rc = pthread_create(&t, &at, fn, arg);
  pthread_attr_destroy(&at);
  return rc;
}
