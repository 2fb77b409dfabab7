#include <stdio.h>

#include "core/backend.h"
#include "ncfsm.h"

const char *ncfsm_err_name(ncfsm_result_t r) {
  switch (r) {
#define X(name, value, msg) \
  case NCFSM_##name:        \
    return "NCFSM_" #name;
    NCFSM_RESULT_MAP(X)
#undef X
    default:
      return "NCFSM_UNKNOWN";
  }
}

const char *ncfsm_strerror(ncfsm_result_t r) {
  switch (r) {
#define X(name, value, msg) \
  case NCFSM_##name:        \
    return msg;
    NCFSM_RESULT_MAP(X)
#undef X
    default:
      return "unknown ncfsm result code";
  }
}

static _Thread_local char tls_last[1024];

const char *ncfsm_last_error(void) { return tls_last; }

void ncfsm__last_error_set(const char *msg) { snprintf(tls_last, sizeof tls_last, "%s", msg ? msg : ""); }

const char *ncfsm__nccl_result_name(int code) {
  static const char *names[] = {"ncclSuccess",        "ncclUnhandledCudaError", "ncclSystemError",
                                "ncclInternalError",  "ncclInvalidArgument",    "ncclInvalidUsage",
                                "ncclRemoteError",    "ncclInProgress",         "ncclTimeout"};
  static _Thread_local char buf[32];
  if (code >= 0 && code < (int)(sizeof names / sizeof names[0])) return names[code];
  snprintf(buf, sizeof buf, "ncclResult(%d)", code);
  return buf;
}

size_t ncfsm_dtype_size(ncfsm_dtype_t t) {
  switch (t) {
#define X(name, v, size) \
  case NCFSM_##name:     \
    return size;
    NCFSM_DTYPE_MAP(X)
#undef X
    default:
      return 0;
  }
}

const char *ncfsm_dtype_name(ncfsm_dtype_t t) {
  switch (t) {
#define X(name, v, size) \
  case NCFSM_##name:     \
    return #name;
    NCFSM_DTYPE_MAP(X)
#undef X
    default:
      return "UNKNOWN_DTYPE";
  }
}

const char *ncfsm_redop_name(ncfsm_redop_t op) {
  switch (op) {
#define X(name, v)      \
  case NCFSM_OP_##name: \
    return #name;
    NCFSM_REDOP_MAP(X)
#undef X
    default:
      return "UNKNOWN_REDOP";
  }
}

const char *ncfsm_opkind_name(ncfsm_opkind_t k) {
  switch (k) {
#define X(name)            \
  case NCFSM_KIND_##name: \
    return #name;
    NCFSM_OPKIND_MAP(X)
#undef X
    default:
      return "UNKNOWN_OP";
  }
}
