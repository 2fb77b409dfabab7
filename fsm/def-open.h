/* Included at the top of every fsm/NAME.def: the macros a consumer did not
 * define expand to nothing (fsm/machine.h describes the format). No include
 * guard: a .def is included once per expansion. */
#ifndef NCFSM_MACHINE
#define NCFSM_MACHINE(name, initial, desc)
#endif
#ifndef NCFSM_FLAG
#define NCFSM_FLAG(name, desc)
#endif
#ifndef NCFSM_STATE
#define NCFSM_STATE(name, flags, desc)
#endif
#ifndef NCFSM_EVENT
#define NCFSM_EVENT(name, source, desc)
#endif
#ifndef NCFSM_GUARD
#define NCFSM_GUARD(name, result, cond, hint)
#endif
#ifndef NCFSM_ACTION
#define NCFSM_ACTION(name, desc)
#endif
#ifndef NCFSM_TRANS
#define NCFSM_TRANS(state, event, guard, next, action, rule)
#endif
/* the comm's own tables (fsm/comm.def) */
#ifndef NCFSM_CALL
#define NCFSM_CALL(name, fn)
#endif
#ifndef NCFSM_RULE
#define NCFSM_RULE(state, call, decision, guards, rule, hint)
#endif
#ifndef NCFSM_STATE_HINT
#define NCFSM_STATE_HINT(state, rule, hint)
#endif
#ifndef NCFSM_POLL
#define NCFSM_POLL(state, call, ok, err)
#endif
#ifndef NCFSM_CONTROL
#define NCFSM_CONTROL(state, step, desc)
#endif
#ifndef NCFSM_CLOSE
#define NCFSM_CLOSE(state, step, why)
#endif
