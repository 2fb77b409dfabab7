/*
 * Expands one fsm/<name>.def into its ncfsm__machine descriptor (data only:
 * names, flags, rows) and an index built at load time. Define before
 * including (no include guard: included once per machine):
 *
 *   NCFSM_M_DEF     the .def, e.g. "fsm/work.def"
 *   NCFSM_M_ID      the machine's name: defines const ncfsm__machine ncfsm__m_<ID>
 *   NCFSM_M_S(n)    the enum constant of state n; NCFSM_M_E, _G, _A: event, guard, action
 *   NCFSM_M_F(n)    the enum constant of flag n (a bit)
 *
 * The machine's enums must be declared (fsm/tables.h). Guard results are
 * written as ncfsm_result_t names without the NCFSM_ prefix.
 */
#define NCFSM__MG_CAT(a, b) a##b
#define NCFSM__MG_XCAT(a, b) NCFSM__MG_CAT(a, b)
#define NCFSM__MG(x) NCFSM__MG_XCAT(NCFSM__MG_XCAT(ncfsm__mg_, NCFSM_M_ID), _##x)

static const ncfsm__mstate NCFSM__MG(states)[] = {
#define NCFSM_STATE(n, f, d) {#n, (f), d},
#include NCFSM_M_DEF
};
static const ncfsm__mevent NCFSM__MG(events)[] = {
#define CALL NCFSM__M_CALL
#define LOOP NCFSM__M_LOOP
#define NCFSM_EVENT(n, src, d) {#n, src, d},
#include NCFSM_M_DEF
#undef CALL
#undef LOOP
};
static const ncfsm__mguard NCFSM__MG(guards)[] = {
#define NCFSM_GUARD(n, res, c, h) {#n, NCFSM_##res, c, h},
#include NCFSM_M_DEF
};
static const ncfsm__maction NCFSM__MG(actions)[] = {
#define NCFSM_ACTION(n, d) {#n, d},
#include NCFSM_M_DEF
};
static const ncfsm__mflag NCFSM__MG(flags)[] = {
#define NCFSM_FLAG(n, d) {#n, d},
#include NCFSM_M_DEF
};
static const ncfsm__mrow NCFSM__MG(rows)[] = {
#define NCFSM_TRANS(s, e, g, n, a, r) {NCFSM_M_S(s), NCFSM_M_E(e), NCFSM_M_G(g), NCFSM_M_S(n), NCFSM_M_A(a), r},
#include NCFSM_M_DEF
};
#define NCFSM__MG_N(a) (sizeof a / sizeof a[0])
static unsigned short NCFSM__MG(first)[NCFSM__MG_N(NCFSM__MG(states)) * NCFSM__MG_N(NCFSM__MG(events))];
static unsigned char NCFSM__MG(count)[NCFSM__MG_N(NCFSM__MG(states)) * NCFSM__MG_N(NCFSM__MG(events))];
static unsigned NCFSM__MG(hits)[NCFSM__MG_N(NCFSM__MG(rows))];
static const ncfsm__mrow *NCFSM__MG(only)[NCFSM__MG_N(NCFSM__MG(states)) * NCFSM__MG_N(NCFSM__MG(events))];

const ncfsm__machine NCFSM__MG_XCAT(ncfsm__m_, NCFSM_M_ID) = {
#define NCFSM_MACHINE(n, i, d) #n, d, NCFSM_M_S(i),
#include NCFSM_M_DEF
    NCFSM__MG_N(NCFSM__MG(states)), NCFSM__MG_N(NCFSM__MG(events)), NCFSM__MG_N(NCFSM__MG(guards)),
    NCFSM__MG_N(NCFSM__MG(actions)), NCFSM__MG_N(NCFSM__MG(flags)), NCFSM__MG_N(NCFSM__MG(rows)),
    NCFSM__MG(states), NCFSM__MG(events), NCFSM__MG(guards), NCFSM__MG(actions), NCFSM__MG(flags),
    NCFSM__MG(rows), NCFSM__MG(first), NCFSM__MG(count), NCFSM__MG(only), NCFSM__MG(hits)};

/* The index is built before main (and before any engine call). */
__attribute__((constructor)) static void NCFSM__MG(index)(void) {
  ncfsm__m_index(&NCFSM__MG_XCAT(ncfsm__m_, NCFSM_M_ID));
}

#undef NCFSM__MG_N
#undef NCFSM__MG
#undef NCFSM__MG_XCAT
#undef NCFSM__MG_CAT
#undef NCFSM_M_DEF
#undef NCFSM_M_ID
#undef NCFSM_M_S
#undef NCFSM_M_E
#undef NCFSM_M_G
#undef NCFSM_M_A
#undef NCFSM_M_F
