/*
 * ncfsm-trace's reporter (report.c).
 */
#ifndef NCFSM_TOOLS_TRACE_REPORT_H
#define NCFSM_TOOLS_TRACE_REPORT_H

#include "tools/trace/check.h"

/* Prints the report of the analysed comms (sorted by id) that files held:
 * text, or one JSON object when as_json. Returns the exit status: 0 when
 * every comm is consistent, 1 when one diverged. */
int report(const comm *comms, size_t ncomms, const strlist *files, int as_json);

#endif
