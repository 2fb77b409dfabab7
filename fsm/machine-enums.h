/*
 * Declares the C enums of one fsm/<name>.def (no include guard: included
 * once per machine by fsm/tables.h). Define before including:
 *
 *   NCFSM_M_DEF          the .def
 *   NCFSM_M_S(n) ...     the enum constant of state n (omit NCFSM_M_S when
 *                        the states are public: include/ncfsm/states.h)
 *   NCFSM_M_E(n), NCFSM_M_G(n), NCFSM_M_A(n)   event, guard, action (omit
 *                        NCFSM_M_E when the events are public)
 *   NCFSM_M_F(n), NCFSM_M_FB(n)   flag n's bit and its index (omit both when
 *                        the flags are public)
 *
 * Each enum ends with a _COUNT constant: NCFSM_M_S(COUNT) and so on.
 */
#ifdef NCFSM_M_S
enum {
#define NCFSM_STATE(name, flags, desc) NCFSM_M_S(name),
#include NCFSM_M_DEF
  NCFSM_M_S(COUNT)
};
#endif
#ifdef NCFSM_M_E
enum {
#define NCFSM_EVENT(name, source, desc) NCFSM_M_E(name),
#include NCFSM_M_DEF
  NCFSM_M_E(COUNT)
};
#endif
enum {
#define NCFSM_GUARD(name, result, cond, hint) NCFSM_M_G(name),
#include NCFSM_M_DEF
  NCFSM_M_G(COUNT)
};
enum {
#define NCFSM_ACTION(name, desc) NCFSM_M_A(name),
#include NCFSM_M_DEF
  NCFSM_M_A(COUNT)
};
#ifdef NCFSM_M_F
enum {
#define NCFSM_FLAG(name, desc) NCFSM_M_FB(name),
#include NCFSM_M_DEF
  NCFSM_M_FB(COUNT)
};
enum {
#define NCFSM_FLAG(name, desc) NCFSM_M_F(name) = 1u << NCFSM_M_FB(name),
#include NCFSM_M_DEF
};
#endif
#undef NCFSM_M_DEF
#undef NCFSM_M_S
#undef NCFSM_M_E
#undef NCFSM_M_G
#undef NCFSM_M_A
#undef NCFSM_M_F
#undef NCFSM_M_FB
