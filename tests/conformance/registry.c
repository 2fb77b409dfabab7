/* The scenarios in run order (the order of every report and table). A new
 * scenario: its code and raw expectation in the scen_*.c of its rule family,
 * its ncfsm expectation in expect_ncfsm.c, and a line here. */
#include <stdio.h>

#include "conformance.h"

extern const scen_t scen_init, scen_groupend_inprogress, scen_call_during_inprogress, scen_event_after_inprogress;
extern const scen_t scen_groupend_without_start, scen_nested_groups, scen_argerr_nonblocking, scen_argerr_blocking,
    scen_two_streams, scen_mixed_blocking_nonblocking, scen_blocking_then_nonblocking_groups;
extern const scen_t scen_r12_same_buffer_group, scen_r12_separate_launches;
extern const scen_t scen_finalize_once, scen_finalize_twice, scen_destroy_after_finalize,
    scen_destroy_poisoned_cascade, scen_destroy_inprogress_cascade;
extern const scen_t scen_abort_in_flight;
extern const scen_t scen_revoke, scen_revoke_absent_sim, scen_revoke_absent_sim_knob;
extern const scen_t scen_split_child_handle, scen_shrink_default, scen_shrink_abort_stuck;

const scen_t *const scenarios[] = {
    &scen_init,
    &scen_groupend_inprogress,
    &scen_call_during_inprogress,
    &scen_groupend_without_start,
    &scen_nested_groups,
    &scen_argerr_nonblocking,
    &scen_argerr_blocking,
    &scen_r12_same_buffer_group,
    &scen_r12_separate_launches,
    &scen_finalize_once,
    &scen_finalize_twice,
    &scen_destroy_after_finalize,
    &scen_destroy_poisoned_cascade,
    &scen_destroy_inprogress_cascade,
    &scen_two_streams,
    &scen_event_after_inprogress,
    &scen_revoke,
    &scen_revoke_absent_sim,
    &scen_revoke_absent_sim_knob,
    &scen_mixed_blocking_nonblocking,
    &scen_blocking_then_nonblocking_groups,
    &scen_abort_in_flight,
    &scen_split_child_handle,
    &scen_shrink_default,
    &scen_shrink_abort_stuck,
};
const int nscenarios = (int)(sizeof scenarios / sizeof scenarios[0]);
