/* ncfsm result codes: one X-macro generates the enum, ncfsm_err_name and ncfsm_strerror. */
#ifndef NCFSM_RESULT_H
#define NCFSM_RESULT_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, message). Messages say what happened; the per-handle
 * last-error string (ncfsm_comm_last_error, ncfsm_loop_last_error) says
 * which state, which call and what to do. */
#define NCFSM_RESULT_MAP(X)                                                          \
  X(OK, 0, "success")                                                                \
  X(ERR_INVALID_ARGUMENT, 1, "invalid argument (rejected before the backend)")       \
  X(ERR_ILLEGAL_STATE, 2, "call not legal in the communicator's current state")      \
  X(ERR_INVALID_USAGE, 3, "invalid usage (e.g. group end without group start)")      \
  X(ERR_WRONG_THREAD, 4, "call made from a thread that does not own the group/loop") \
  X(ERR_BUSY, 5, "resource busy: handles are still open")                            \
  X(ERR_NO_MEMORY, 6, "out of memory")                                               \
  X(ERR_BACKEND, 7, "the backend (NCCL/CUDA or sim) returned an error")              \
  X(ERR_ASYNC, 8, "asynchronous communicator error; outputs are not trustworthy")    \
  X(ERR_TIMEOUT, 9, "watchdog timeout; outputs are not trustworthy")                 \
  X(ERR_ABORTED, 10, "aborted before completion; outputs are not trustworthy")       \
  X(ERR_GROUP, 11, "group failed because another call in it failed")                 \
  X(ERR_OVERLAP, 12, "operations of one group overlap where one writes (R12)")       \
  X(ERR_UNSUPPORTED, 13, "not supported by this backend or NCCL runtime")            \
  X(ERR_MISMATCH, 14, "collective fingerprints differ across ranks")                 \
  X(ERR_BOOTSTRAP, 15, "bootstrap (out-of-band exchange) failed")                    \
  X(ERR_SYSTEM, 16, "system call failed")                                            \
  X(ERR_AGAIN, 17, "not finished yet; try again")                                  \
  X(ERR_PEER, 18, "a peer rank's communicator failed first; outputs are not trustworthy")

typedef enum ncfsm_result {
#define NCFSM__RESULT_ENUM(name, value, msg) NCFSM_##name = value,
  NCFSM_RESULT_MAP(NCFSM__RESULT_ENUM)
#undef NCFSM__RESULT_ENUM
  NCFSM_RESULT_COUNT
} ncfsm_result_t;

/* "NCFSM_ERR_ILLEGAL_STATE"; "NCFSM_UNKNOWN" for values outside the map. */
const char *ncfsm_err_name(ncfsm_result_t r);
/* One-line description of the code; never NULL. */
const char *ncfsm_strerror(ncfsm_result_t r);
/* Nonblocking, any thread, changes no state. Why the last ncfsm call of
 * the calling thread that failed failed: the
 * state, the call and what to do (for a refused call), the variable and
 * the accepted values (for a setting), the peer (for a bootstrap). One
 * place for every object, kept per thread like errno: read it right after
 * the call that failed; other ncfsm work of this thread (a loop turn, a
 * later call) may replace it. "" when this thread saw no failure. The
 * objects keep their own records too: ncfsm_comm_last_error (the comm's
 * last refused call, readable from any thread), ncfsm_comm_failure (why it
 * failed), ncfsm_boot_last_error. */
const char *ncfsm_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
