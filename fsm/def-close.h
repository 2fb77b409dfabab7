/* Included at the end of every fsm/NAME.def: the format's macros are
 * undefined, so that the next expansion starts clean. */
#undef NCFSM_MACHINE
#undef NCFSM_FLAG
#undef NCFSM_STATE
#undef NCFSM_EVENT
#undef NCFSM_GUARD
#undef NCFSM_ACTION
#undef NCFSM_TRANS
#undef NCFSM_CALL
#undef NCFSM_RULE
#undef NCFSM_STATE_HINT
#undef NCFSM_POLL
#undef NCFSM_CONTROL
#undef NCFSM_CLOSE
