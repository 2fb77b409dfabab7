/*
 * The JSON flight recorder dump's name, version and file names, shared by
 * the recorder (fsm/recorder_*.c) and ncfsm-trace (tools/trace/): its
 * members are listed in fsm/dump.def. Plain C: ncfsm-trace includes it
 * without linking libncfsm.
 */
#ifndef NCFSM_FSM_DUMP_H
#define NCFSM_FSM_DUMP_H

#define NCFSM_DUMP_FORMAT "ncfsm-flight-recorder"
#define NCFSM_DUMP_VERSION 1

/* DIR/ncfsm_fr_<comm_id as 16 hex digits>_r<rank>.json */
#define NCFSM_DUMP_PREFIX "ncfsm_fr_"
#define NCFSM_DUMP_SUFFIX ".json"
/* DIR/ncfsm_fr_<comm_id>_nccl_trace_rank_<rank>: the PyTorch pickle */
#define NCFSM_DUMP_TORCH_INFIX "_nccl_trace_rank_"

/* The most ranks a reader accepts in one dump. */
#define NCFSM_DUMP_MAX_NRANKS (1 << 24)

#endif
