/* The pmix bootstrap's internals, shared by its files (each one job):
 *   pmix.c          PMIx_Init, the job's allgathers and broadcasts (fences)
 *   pmix_channel.c  channels: rounds of PMIx_Put/Commit and polled PMIx_Get_nb, no fence
 *   pmix_notice.c   notices: PMIx_Notify_event and the process's event handler
 * PMIx calls back on its own progress thread; those callbacks only hand results over (a
 * refcounted cell, event_active under the cell's mutex); the rest runs on the loop thread. */
#ifndef NCFSM_BOOTSTRAP_PMIX_INTERNAL_H
#define NCFSM_BOOTSTRAP_PMIX_INTERNAL_H

#include <pmix.h>

#include "bootstrap/boot-internal.h"

/* The parent bootstrap's impl (b->impl of a bootstrap opened with ncfsm_boot_open). */
typedef struct pmix_impl {
  pmix_proc_t me;
  unsigned inst; /* this process's n-th pmix bootstrap: its keys are its own */
} pmix_impl;

#define NCFSM__PMIX_NO_RECOVERY                                                                \
  "the pmix bootstrap does not support recovery from dead ranks (Open MPI's mpirun ends the "  \
  "whole job when a process dies); use the TCP store, NCFSM_BOOTSTRAP=tcp, for recovery"

/* pmix_channel.c */
extern const ncfsm__boot_ops ncfsm__boot_pmix_chan_ops;
ncfsm_result_t ncfsm__pmix_channel_open(ncfsm_boot *parent, ncfsm_boot *child);

/* pmix_notice.c: the handler is registered once per process, after PMIx_Init and before
 * PMIx_Finalize (under the init mutex of pmix.c). Every pmix bootstrap and channel that can
 * receive notices is in a registry (inst, id: 0 for the job's, the channel's id), with its
 * members' job ranks (NULL: the job's ranks). */
void ncfsm__pmix_notices_start(void);
void ncfsm__pmix_notices_stop(void);
void ncfsm__pmix_reg_add(ncfsm_boot *b, unsigned inst, uint64_t id, const pmix_rank_t *ranks);
void ncfsm__pmix_reg_del(ncfsm_boot *b);
ncfsm_result_t ncfsm__pmix_notice_send(ncfsm_boot *b, const pmix_proc_t *me, unsigned inst,
                                       uint64_t id, const ncfsm_boot_notice *n);
ncfsm_result_t ncfsm__pmix_notice_post(ncfsm_boot *b, const ncfsm_boot_notice *n);
/* Acknowledge what the PMIx server sent at once (TCP_QUICKACK on the client's connection to
 * it), so that its next small write (a reply, a notice) is not held for the delayed ACK: in
 * each PMIx callback of this bootstrap. Any thread. */
void ncfsm__pmix_quickack(void);

#endif
