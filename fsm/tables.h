/*
 * The engine's machines as C enums and descriptors (layer 0, with
 * fsm/machine.h): every fsm/<name>.def expanded once. The public part of
 * the comm and work machines (states, events, calls, state flags) is in
 * include/ncfsm/states.h, generated from the same .def files; fsm/tables.c
 * checks at compile time that the two agree.
 */
#ifndef NCFSM_FSM_TABLES_H
#define NCFSM_FSM_TABLES_H

#include "fsm/machine.h"
#include "ncfsm.h"

/* ---- comm (fsm/comm.def): guards and actions; the rest is public --------- */
#define NCFSM_M_DEF "fsm/comm.def"
#define NCFSM_M_G(n) NCFSM__CG_##n
#define NCFSM_M_A(n) NCFSM__CA_##n
#include "fsm/machine-enums.h"
typedef unsigned ncfsm__comm_guard_t;
typedef unsigned ncfsm__comm_action_t;

/* The NCCL call a POLL state waits for (column call of NCFSM_POLL). */
typedef enum ncfsm__poll_call {
  NCFSM__PC_NONE = 0,
  NCFSM__PC_INIT,
  NCFSM__PC_LAUNCH,
  NCFSM__PC_FINALIZE,
  NCFSM__PC_XCOMM, /* split, shrink or grow */
  NCFSM__PC_REVOKE
} ncfsm__poll_call_t;

/* What the loop does for a comm in a CONTROL state (column step). */
typedef enum ncfsm__control_step {
  NCFSM__CS_NONE = 0,
  NCFSM__CS_ID_POST,
  NCFSM__CS_ID_TEST,
  NCFSM__CS_INIT,
  NCFSM__CS_FINALIZE,
  NCFSM__CS_ABORT
} ncfsm__control_step_t;

typedef struct ncfsm__comm_state_cols {
  ncfsm__poll_call_t poll;  /* NCFSM__PC_NONE unless flag POLL */
  ncfsm_event_t poll_ok, poll_err;
  ncfsm__control_step_t control; /* NCFSM__CS_NONE unless flag CONTROL */
  /* column close: the call the loop makes for a comm whose close was
   * accepted (NCFSM_CALL_COUNT: it waits); close_why NULL: no NCFSM_CLOSE */
  ncfsm_call_t close;
  const char *close_why;
} ncfsm__comm_state_cols;

/* One legality cell. */
typedef struct ncfsm__cell {
  unsigned char listed, decision; /* decision: ncfsm_decision_t; unlisted = REJECT */
  unsigned long long guards;      /* mask of ncfsm__comm_guard_t that must hold too */
  const char *rule, *hint;
} ncfsm__cell;

extern const ncfsm__machine ncfsm__m_comm;
extern const ncfsm__comm_state_cols ncfsm__comm_cols[NCFSM_STATE_COUNT];
extern const ncfsm__cell ncfsm__comm_cells[NCFSM_STATE_COUNT][NCFSM_CALL_COUNT];

/* Legality's fast path (fsm/comm_fsm.c, from the same NCFSM_RULE lines as
 * the cells): 1 where the cell accepts the call (ALLOW or DEFER) and its
 * guards are among GROUP_THREAD and SIZED, which both hold when the comm has
 * no op in the open group and knows its size. */
extern const unsigned char ncfsm__comm_fast[NCFSM_STATE_COUNT][NCFSM_CALL_COUNT];

/* True only where the table accepts the call without a side effect: the
 * cell is fast and ngroup == 0 (GROUP_THREAD: ngroup == 0 || owner) and
 * nranks > 0 (SIZED). False says nothing: the caller asks the table
 * (ncfsm__check_legal), which names the rule and hint of a refusal.
 * tests/unit/test_hotpath.c checks it against the table in every state. */
static inline bool ncfsm__legal_fast(unsigned state, ncfsm_call_t call, int ngroup, int nranks) {
  return ncfsm__comm_fast[state][call] && ngroup == 0 && nranks > 0;
}
extern const struct ncfsm__state_hint { const char *rule, *hint; } ncfsm__comm_hints[NCFSM_STATE_COUNT];
extern const char *const ncfsm__comm_call_fns[NCFSM_CALL_COUNT];
extern const unsigned ncfsm__state_flag_tab[NCFSM_STATE_COUNT];

/* The comm-specific checks of comm.def: every POLL state has its poll
 * column and its events have rows there, every CONTROL state its step,
 * every state a hint, every state with works or a deadline a TIMEOUT row,
 * every legality guard a guard of the machine. Like ncfsm__m_lint. */
int ncfsm__comm_lint(void (*report)(void *arg, const char *defect), void *arg);
/* The guards the legality cells use (for ncfsm__m_lint). */
unsigned long long ncfsm__comm_cell_guards(void);

/* A data type's size in bytes, 0 for an unknown type: ncfsm_dtype_size inline (every
 * submission checks its size, every launch of several ops computes its ranges). */
static inline size_t ncfsm__dtype_bytes(ncfsm_dtype_t t) {
  static const unsigned char size[NCFSM_DTYPE_COUNT] = {
#define NCFSM__DTB(name, v, bytes) [v] = bytes,
      NCFSM_DTYPE_MAP(NCFSM__DTB)
#undef NCFSM__DTB
  };
  return (unsigned)t < NCFSM_DTYPE_COUNT ? size[t] : 0;
}

/* ---- work (fsm/work.def): states are public (ncfsm_work_state_t) ------------- */
#define NCFSM_M_DEF "fsm/work.def"
#define NCFSM_M_E(n) NCFSM__WE_##n
#define NCFSM_M_G(n) NCFSM__WG_##n
#define NCFSM_M_A(n) NCFSM__WA_##n
#define NCFSM_M_F(n) NCFSM__WF_##n
#define NCFSM_M_FB(n) NCFSM__WFB_##n
#include "fsm/machine-enums.h"
typedef unsigned ncfsm__work_event_t;
extern const ncfsm__machine ncfsm__m_work;

/* The final states as a bit set, from the rows' flags (a constant: the
 * test is one shift and a mask, no load of the machine's state table). */
enum {
  NCFSM__WORK_FINAL_SET = 0u
#define NCFSM_STATE(name, flags, desc) | (((flags) & NCFSM__WF_FINAL) ? 1u << NCFSM_WORK_##name : 0u)
#include "fsm/work.def"
};
_Static_assert(NCFSM_WORK_STATE_COUNT <= 32, "the work's states fit a bit set");

static inline bool ncfsm__work_state_final(ncfsm_work_state_t s) {
  return (unsigned)s < NCFSM_WORK_STATE_COUNT && ((NCFSM__WORK_FINAL_SET >> (unsigned)s) & 1u);
}

/* ---- group (fsm/group.def): all internal ---- */
#define NCFSM_M_DEF "fsm/group.def"
#define NCFSM_M_S(n) NCFSM__GS_##n
#define NCFSM_M_E(n) NCFSM__GE_##n
#define NCFSM_M_G(n) NCFSM__GG_##n
#define NCFSM_M_A(n) NCFSM__GA_##n
#define NCFSM_M_F(n) NCFSM__GF_##n
#define NCFSM_M_FB(n) NCFSM__GFB_##n
#include "fsm/machine-enums.h"
typedef unsigned ncfsm__group_event_t;
extern const ncfsm__machine ncfsm__m_group;

/* ---- held (fsm/held.def): a thread's group held back from its loop, all internal ---- */
#define NCFSM_M_DEF "fsm/held.def"
#define NCFSM_M_S(n) NCFSM__HS_##n
#define NCFSM_M_E(n) NCFSM__HE_##n
#define NCFSM_M_G(n) NCFSM__HG_##n
#define NCFSM_M_A(n) NCFSM__HA_##n
#define NCFSM_M_F(n) NCFSM__HF_##n
#define NCFSM_M_FB(n) NCFSM__HFB_##n
#include "fsm/machine-enums.h"
typedef unsigned ncfsm__held_event_t;
extern const ncfsm__machine ncfsm__m_held;

/* ---- timer (fsm/timer.def): a loop's progress timer, all internal ---- */
#define NCFSM_M_DEF "fsm/timer.def"
#define NCFSM_M_S(n) NCFSM__TS_##n
#define NCFSM_M_E(n) NCFSM__TE_##n
#define NCFSM_M_G(n) NCFSM__TG_##n
#define NCFSM_M_A(n) NCFSM__TA_##n
#define NCFSM_M_F(n) NCFSM__TF_##n
#define NCFSM_M_FB(n) NCFSM__TFB_##n
#include "fsm/machine-enums.h"
typedef unsigned ncfsm__timer_event_t;
extern const ncfsm__machine ncfsm__m_timer;

/* ---- verify (fsm/verify.def): a comm's verification, all internal ---- */
#define NCFSM_M_DEF "fsm/verify.def"
#define NCFSM_M_S(n) NCFSM__VS_##n
#define NCFSM_M_E(n) NCFSM__VE_##n
#define NCFSM_M_G(n) NCFSM__VG_##n
#define NCFSM_M_A(n) NCFSM__VA_##n
#define NCFSM_M_F(n) NCFSM__VF_##n
#define NCFSM_M_FB(n) NCFSM__VFB_##n
#include "fsm/machine-enums.h"
typedef unsigned ncfsm__verify_event_t;
extern const ncfsm__machine ncfsm__m_verify;

/* ---- recover (fsm/recover.def): a comm's recovery, all internal ---- */
#define NCFSM_M_DEF "fsm/recover.def"
#define NCFSM_M_S(n) NCFSM__RS_##n
#define NCFSM_M_E(n) NCFSM__RE_##n
#define NCFSM_M_G(n) NCFSM__RG_##n
#define NCFSM_M_A(n) NCFSM__RA_##n
#define NCFSM_M_F(n) NCFSM__RF_##n
#define NCFSM_M_FB(n) NCFSM__RFB_##n
#include "fsm/machine-enums.h"
typedef unsigned ncfsm__recover_event_t;
extern const ncfsm__machine ncfsm__m_recover;

#endif
