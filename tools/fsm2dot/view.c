/* The comm's own tables (fsm/tables.c) as fsm2dot reads them: the one file
 * of the tool compiled against their sizes, so that the rest of it builds
 * once whatever the .def files hold (tests/golden links the rest with
 * small defective tables). */
#include "tools/fsm2dot/fsm2dot.h"

const struct fsm2dot_comm fsm2dot_comm = {
    .m = &ncfsm__m_comm,
    .work = &ncfsm__m_work,
    .ncalls = NCFSM_CALL_COUNT,
    .call_fns = ncfsm__comm_call_fns,
    .cells = &ncfsm__comm_cells[0][0],
    .cols = ncfsm__comm_cols,
    .hints = ncfsm__comm_hints,
    .flag_failed = NCFSM_SF_FAILED,
    .flag_end = NCFSM_SF_END,
};

const char *fsm2dot_call_name(unsigned c) { return ncfsm_call_name((ncfsm_call_t)c); }

/* The values of fsm/tables.h's column enums (not in any descriptor). */
static const char *const poll_names[] = {
    [NCFSM__PC_NONE] = "-",         [NCFSM__PC_INIT] = "INIT",   [NCFSM__PC_LAUNCH] = "LAUNCH",
    [NCFSM__PC_FINALIZE] = "FINALIZE", [NCFSM__PC_XCOMM] = "XCOMM", [NCFSM__PC_REVOKE] = "REVOKE",
};
static const char *const control_names[] = {
    [NCFSM__CS_NONE] = "-",    [NCFSM__CS_ID_POST] = "ID_POST",   [NCFSM__CS_ID_TEST] = "ID_TEST",
    [NCFSM__CS_INIT] = "INIT", [NCFSM__CS_FINALIZE] = "FINALIZE", [NCFSM__CS_ABORT] = "ABORT",
};

const char *fsm2dot_poll_name(unsigned pc) {
  return pc < sizeof poll_names / sizeof poll_names[0] ? poll_names[pc] : NULL;
}
const char *fsm2dot_control_name(unsigned cs) {
  return cs < sizeof control_names / sizeof control_names[0] ? control_names[cs] : NULL;
}
