/* Layer 5: a comm's set-up over a bootstrap (fsm/api_init.c), for the
 * protocols beside it (fsm/recover.c re-initialises over the survivors). */
#ifndef NCFSM_FSM_INIT_H
#define NCFSM_FSM_INIT_H

#include "fsm/api-int.h"

/* ncfsm_comm_init_boot with the loop's lock held. */
ncfsm_result_t ncfsm__comm_init_boot_locked(ncfsm_comm *c, struct ncfsm_boot *boot);

#endif
