/* A comm's flight recorder dumps: the snapshot and what the dump says
 * about the comm (fsm/recorder.h writes it). */
#include <stdlib.h>
#include <string.h>

#include "fsm/objects.h"

ncfsm_result_t ncfsm__comm_dump(ncfsm_comm *c, const char *dir, const char *reason) {
  bool automatic = strcmp(reason, "request") != 0; /* error, timeout, signal: no complaint without a dir */
  if (!dir || !*dir) dir = c->dump_dir;
  if (!c->rec) {
    if (!automatic)
      ncfsm__set_error(c, "ncfsm_comm_dump: the flight recorder is off (opts.trace_buffer 0, "
                          "NCFSM_TRACE_BUFFER=0)");
    return NCFSM_ERR_UNSUPPORTED;
  }
  if (!*dir) {
    if (!automatic)
      ncfsm__set_error(c, "ncfsm_comm_dump: no directory: pass one, or set opts.dump_dir / NCFSM_DUMP_DIR");
    return NCFSM_ERR_INVALID_ARGUMENT;
  }
  unsigned cap = ncfsm__rec_capacity(c->rec);
  ncfsm__rec_entry *e = malloc((size_t)cap * sizeof *e);
  if (!e) return NCFSM_ERR_NO_MEMORY;
  uint64_t total = 0;
  unsigned n = ncfsm__rec_snapshot(c->rec, e, cap, &total);
  ncfsm__rec_meta m = {
      .rank = c->rank,
      .nranks = c->nranks,
      .comm_name = c->name,
      .comm_id = c->comm_id,
      .backend = c->be->name,
      .nccl_version = c->be->version(),
      .reason = reason,
      .state = ncfsm_state_name((ncfsm_state_t)c->state),
      .failure = c->failure,
      .next_seq = c->coll_seq,
      .rolling_hash = c->hash,
      .capacity = cap,
      .total = total,
      .time_ns = ncfsm__now_ns(),
      .timeout_ms = c->opts.timeout_ms,
  };
  ncfsm_result_t r = c->rank < 0 ? NCFSM_ERR_ILLEGAL_STATE : ncfsm__rec_dump_async(dir, &m, e, n, NULL, NULL);
  free(e);
  if (r != NCFSM_OK)
    NCFSM_WARN(NCFSM__SUB_FSM, "[%s rank %d] flight recorder dump (%s) into %s not queued: %s", c->name,
               c->rank, reason, dir, ncfsm_err_name(r));
  else
    NCFSM_INFO(NCFSM__SUB_FSM, "[%s rank %d] flight recorder dump (%s, %u entries) queued into %s", c->name,
               c->rank, reason, n, dir);
  return r;
}
