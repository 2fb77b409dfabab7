/* Errors: a comm's last error, the calling thread's last error of
 * loop-level calls, and the cause a backend code stands for. */
#include <stdarg.h>
#include <stdio.h>

#include "fsm/objects.h"

void ncfsm__set_error(ncfsm_comm *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(c->last_error, sizeof c->last_error, "[%s rank %d] ", c->name, c->rank);
  if (n < 0 || (size_t)n >= sizeof c->last_error) n = 0;
  vsnprintf(c->last_error + n, sizeof c->last_error - (size_t)n, fmt, ap);
  va_end(ap);
  ncfsm__last_error_set(c->last_error);
  NCFSM_INFO(NCFSM__SUB_FSM, "%s", c->last_error);
}

/* Loop-level errors are per thread (ncfsm_loop_last_error); the loop's id
 * tells a new loop at a freed one's address from it. */
static _Thread_local uint64_t tls_err_loop;
static _Thread_local char tls_err[1024];

void ncfsm__loop_error(ncfsm_loop *loop, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_err, sizeof tls_err, fmt, ap);
  va_end(ap);
  tls_err_loop = loop->id;
  ncfsm__last_error_set(tls_err);
  NCFSM_INFO(NCFSM__SUB_FSM, "%s", tls_err);
}

const char *ncfsm__loop_error_of(const ncfsm_loop *loop) { return tls_err_loop == loop->id ? tls_err : ""; }

ncfsm_result_t ncfsm__cause_of(int code) {
  switch (code) {
    case NCFSM__NCCL_INVALID_ARGUMENT:
    case NCFSM__NCCL_INVALID_USAGE:
      return NCFSM_ERR_BACKEND; /* NCCL refused a call */
    default:
      /* remote, system, internal, CUDA, timeout: the comm failed, whether a
       * group end or a later poll saw it first (a dead peer is one cause) */
      return NCFSM_ERR_ASYNC;
  }
}
