/*
 * tools/fsm2dot/boot-states.h: the public enums of include/ncfsm/states.h
 * taken from the .def files themselves, for fsm2dot only (its CMake target
 * forces this file first into each of its sources with -include; the
 * include guard then skips the committed states.h).
 *
 * fsm2dot writes include/ncfsm/states.h (--header), so it must build when
 * the committed file is stale: after an edit of fsm/comm.def or
 * fsm/work.def the library does not compile (fsm/tables.c's static
 * asserts) until `cmake --build <builddir> --target fsm-docs` regenerated
 * it. The constants are those of the generated header (same names, same
 * values); the types are plain ints instead of named enums. fsm/machine-
 * enums.h does the expansion, as for every internal enum of the tables.
 */
#ifndef NCFSM_STATES_H
#define NCFSM_STATES_H

/* comm: states, events and flags (guards and actions are fsm/tables.h's) */
#define NCFSM_M_DEF "fsm/comm.def"
#define NCFSM_M_S(n) NCFSM_STATE_##n
#define NCFSM_M_E(n) NCFSM_EV_##n
#define NCFSM_M_G(n) NCFSM__BOOT_CG_##n
#define NCFSM_M_A(n) NCFSM__BOOT_CA_##n
#define NCFSM_M_F(n) NCFSM_SF_##n
#define NCFSM_M_FB(n) NCFSM__BOOT_SFB_##n
#include "fsm/machine-enums.h"
enum { NCFSM_EVENT_COUNT = NCFSM_EV_COUNT };

/* comm: the calls of the legality table */
enum {
#define NCFSM_CALL(name, fn) NCFSM_CALL_##name,
#include "fsm/comm.def"
  NCFSM_CALL_COUNT
};

/* work: states */
#define NCFSM_M_DEF "fsm/work.def"
#define NCFSM_M_S(n) NCFSM_WORK_##n
#define NCFSM_M_G(n) NCFSM__BOOT_WG_##n
#define NCFSM_M_A(n) NCFSM__BOOT_WA_##n
#include "fsm/machine-enums.h"
enum { NCFSM_WORK_STATE_COUNT = NCFSM_WORK_COUNT };

typedef int ncfsm_state_t;
typedef int ncfsm_event_t;
typedef int ncfsm_call_t;
typedef int ncfsm_work_state_t;

#endif
