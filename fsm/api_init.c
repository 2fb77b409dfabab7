/* The calls that set a communicator up with the protocols it runs (layer
 * 5: above the calls of fsm/api_comm.c and beside verification, which
 * they attach): ncfsm_comm_init (the unique id given), ncfsm_comm_init_boot
 * (the unique id broadcast through a bootstrap, and cross-rank
 * verification over it) and ncfsm_comm_init_all (every rank of a clique in
 * this process). */
#include <stdlib.h>
#include <string.h>

#include "core/settings.h"
#include "fsm/init.h"
#include "fsm/verify.h"
#include "ncfsm/bootstrap.h"

ncfsm_result_t ncfsm_comm_init(ncfsm_comm *c, int nranks, int rank, const ncfsm_unique_id *id) {
  if (!ncfsm__comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_loop *loop = c->loop;
  NCFSM__LOCK(loop);
  ncfsm_result_t r;
  if (c->opts.verify == NCFSM_VERIFY_STRICT && nranks > 1) {
    ncfsm__set_error(c, "ncfsm_comm_init: opts.verify is strict (NCFSM_VERIFY), which exchanges every fingerprint "
                        "before its launch through a bootstrap: initialise with ncfsm_comm_init_boot, or use async "
                        "(the default: ranks in this process compare in memory)");
    r = NCFSM_ERR_INVALID_USAGE;
  } else {
    ncfsm__cev p = {.rank = rank, .nranks = nranks, .id = id, .nroots = 1, .from = c->state};
    r = ncfsm__comm_init_step(c, NCFSM_EV_INIT, &p);
    /* async: the ranks of this comm in this process compare in memory */
    if (r == NCFSM_OK && c->opts.verify == NCFSM_VERIFY_ASYNC && nranks > 1 && !c->vops &&
        ncfsm__verify_attach(c, NULL) != NCFSM_OK)
      NCFSM_WARN(NCFSM__SUB_FSM, "[%s rank %d] out of memory: this comm runs unverified", c->name, c->rank);
  }
  NCFSM__UNLOCK(loop);
  return r;
}

ncfsm_result_t ncfsm__comm_init_boot_locked(ncfsm_comm *c, struct ncfsm_boot *boot) {
  int rank = boot ? ncfsm_boot_rank(boot) : -1, size = boot ? ncfsm_boot_size(boot) : -1;
  ncfsm_result_t r;
  char *buf = NULL;
  if (ncfsm__check_legal(c, NCFSM_CALL_INIT, &r) == NCFSM_REJECT) goto out;
  r = NCFSM_ERR_INVALID_ARGUMENT;
  if (!boot || size < 1 || rank < 0 || rank >= size) {
    ncfsm__set_error(c, "ncfsm_comm_init_boot: %s (rank %d of %d); open the bootstrap with ncfsm_boot_open on this "
                        "loop's event_base first",
                     !boot ? "boot is NULL" : "the bootstrap reports an invalid rank or size", rank, size);
    goto out;
  }
  /* Only after the legality check: the roots (rank 0, or opts.init_roots
   * ranks spread over the job) make the ids the others receive by broadcast
   * (O(n) bytes through the bootstrap; docs/bootstrap.md). */
  int nroots = c->opts.init_roots < 1 ? 1 : c->opts.init_roots > size ? size : c->opts.init_roots;
  buf = calloc((size_t)nroots, NCFSM_UNIQUE_ID_BYTES);
  if (!buf) {
    r = NCFSM_ERR_NO_MEMORY;
    goto out;
  }
  for (int j = 0; j < nroots; j++)
    if (ncfsm_boot_root_of(size, nroots, j) == rank &&
        ncfsm_get_unique_id(c->opts.backend, (ncfsm_unique_id *)(buf + (size_t)j * NCFSM_UNIQUE_ID_BYTES)) != NCFSM_OK) {
      ncfsm__set_error(c, "ncfsm_comm_init_boot: the %s backend could not make a unique id", c->be->name);
      r = NCFSM_ERR_BACKEND;
      goto out;
    }
  if (c->opts.verify != NCFSM_VERIFY_OFF && size > 1 && (r = ncfsm__verify_attach(c, boot)) != NCFSM_OK) {
    ncfsm__set_error(c, "ncfsm_comm_init_boot: out of memory for the verification of this comm");
    goto out;
  }
  ncfsm_unique_id id;
  memcpy(&id, buf, sizeof id); /* rank 0's (root 0's) once the broadcast is done */
  /* INIT_BOOT and the pending exchange under one lock: the loop thread posts
   * the exchange at its next turn (the bootstrap is driven by its base's
   * thread). */
  ncfsm__cev p = {.rank = rank, .nranks = size, .id = &id, .boot = boot, .uid_buf = buf, .nroots = nroots,
                  .from = c->state};
  r = ncfsm__comm_init_step(c, NCFSM_EV_INIT_BOOT, &p);
  if (r == NCFSM_OK) buf = NULL; /* the comm's now */
  else if (c->vops) c->vops->free(c);
out:
  free(buf);
  return r;
}

ncfsm_result_t ncfsm_comm_init_boot(ncfsm_comm *c, struct ncfsm_boot *boot) {
  if (!ncfsm__comm_ok(c)) return NCFSM_ERR_INVALID_ARGUMENT;
  NCFSM__LOCK(c->loop);
  ncfsm_result_t r = ncfsm__comm_init_boot_locked(c, boot);
  NCFSM__UNLOCK(c->loop);
  return r;
}

ncfsm_result_t ncfsm_comm_init_all(ncfsm_loop *loop, int n, const ncfsm_comm_opts *opts, const int *devices,
                                   ncfsm_comm **comms) {
  if (!ncfsm__loop_ok(loop) || n < 1 || !comms) return NCFSM_ERR_INVALID_ARGUMENT;
  ncfsm_comm_opts o;
  ncfsm_result_t r;
  if (opts) o = *opts;
  else if ((r = ncfsm_comm_opts_init(&o)) != NCFSM_OK) {
    ncfsm__loop_error(loop, "%s", ncfsm_opts_error());
    return r;
  }
  ncfsm_unique_id id;
  r = ncfsm_get_unique_id(o.backend, &id);
  if (r != NCFSM_OK) {
    ncfsm__loop_error(loop, "ncfsm_comm_init_all: %s", ncfsm_last_error()); /* the cause and what to do */
    return r;
  }
  int i;
  for (i = 0; i < n; i++) {
    comms[i] = NULL;
    o.device = devices ? devices[i] : (opts ? opts->device : 0);
    if ((r = ncfsm_comm_new(loop, &o, &comms[i])) != NCFSM_OK) break;
    if ((r = ncfsm_comm_init(comms[i], n, i, &id)) != NCFSM_OK) break;
  }
  if (r != NCFSM_OK) {
    for (int j = 0; j <= i && j < n; j++)
      if (comms[j]) {
        ncfsm_comm_abort(comms[j]);
        ncfsm_comm_release(comms[j]);
        comms[j] = NULL;
      }
  }
  return r;
}
