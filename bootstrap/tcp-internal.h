/* The key-value store server (tcp bootstrap), hosted in any event_base. */
#ifndef NCFSM_BOOTSTRAP_TCP_INTERNAL_H
#define NCFSM_BOOTSTRAP_TCP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "ncfsm/bootstrap.h"

struct event_base;
struct sockaddr;
typedef struct ncfsm__store ncfsm__store;

typedef struct ncfsm__store_opts {
  const char *listen;        /* "host:port"; port 0 picks one (ncfsm__store_port) */
  const char *token;         /* required, non-empty */
  uint32_t key_max;          /* default NCFSM__FRAME_KEY_MAX */
  uint32_t value_max;        /* default NCFSM__FRAME_VALUE_MAX */
  uint64_t max_bytes;        /* keys, values, gathers, parked requests, replies waiting to be
                                sent that reference values; default 1 GiB */
  uint64_t auth_timeout_ms;  /* a connection must HELLO within this of its accept; default 10 s */
  int allow_remote;          /* listen on a non-loopback address */
  /* Limits on what one client can make the store hold (0 = the default). */
  uint64_t frame_timeout_ms; /* once a frame's first byte arrived, all of it must within this; 10 s */
  uint64_t max_inflight;     /* unfinished frames of all connections together; 64 MiB (the oldest
                                unfinished frame's connection is closed past it) */
  uint64_t out_high;         /* stop reading a connection's requests while more than this of its
                                replies is queued; 4 MiB (resume below half) */
  uint64_t out_max;          /* close a connection whose queued replies would exceed this (a reply
                                into an empty queue is never refused for size); 256 MiB */
  uint64_t out_stall_ms;     /* close a connection that has not read any of its replies for this
                                long; 60 s */
  uint64_t max_out;          /* queued replies of all connections: past it, a connection with
                                replies queued is not read until they drain; 256 MiB */
  int max_conns;             /* refuse ("store busy") past this many; default the open-file limit
                                minus 64 */
  uint32_t max_parked;       /* parked GET/WAIT/GATHER requests per connection; 1024 */
  int rejoin;                /* a rank whose connection ended may HELLO again (default 0: no) */
  uint32_t auth_fail_burst;  /* failed HELLOs per peer address before throttling; 10 */
  uint32_t auth_fail_per_s;  /* then this many per second (refused: "throttled"); 2 */
  int rank_secrets;          /* a ranked HELLO must carry its rank's secret
                                (ncfsm_boot_rank_secret), not the job token */
  uint32_t world_size;       /* the job's size, fixed at open (0: rank 0's HELLO gives it; the
                                other ranks' HELLOs wait for it) */
  uint64_t heartbeat_ms;     /* PINGs to and from each rank's heartbeat connection this often;
                                1000 */
  uint64_t silence_ms;       /* a heartbeat connection silent this long: its rank is lost (and a
                                rank hears the same of the store); 4000; at least 2 x heartbeat */
  int heartbeat_off;         /* no heartbeats (ranks do not open heartbeat connections) */
  int hosted;                /* a rank's loop runs this store: its own silence is not a loss for
                                the ranks (it PINGs only while that loop runs) */
  const char *world_from;    /* who set world_size, for the refusals ("the store's --world-size") */
  /* bootstrap channels (issue 21) */
  uint32_t max_channels;     /* channels one rank may hold (opened, not yet closed by every
                                member); 1024 */
  uint32_t notices_per_s;    /* NOTICEs one connection may send per second (burst the same);
                                more are dropped; 1000 */
} ncfsm__store_opts;

typedef struct ncfsm__store_stats {
  uint64_t accepted, authenticated, rejected_token, closed_bad_frame, closed_eof, frames;
  int open_conns;
  uint64_t refused_busy;     /* connections refused at the limit or out of descriptors */
  uint64_t throttled;        /* HELLOs refused unchecked: too many failures from that address */
  uint64_t closed_slow;      /* a frame not complete within frame_timeout_ms */
  uint64_t closed_unread;    /* replies not read (out_max or out_stall_ms) */
  uint64_t closed_budget;    /* the oldest unfinished frame, past max_inflight */
  uint64_t closed_parked;    /* more than max_parked parked requests */
  uint64_t ranks_gone;       /* ranked connections that ended */
  uint64_t rank_conflicts;   /* a rank claimed by a second live connection */
  uint64_t rejoin_refused;   /* HELLO for a rank whose connection ended, rejoin off */
  uint64_t gathers_failed;   /* GATHERs failed for every rank (a rank gone, a conflict) */
  uint64_t agreements_done;  /* AGREEs completed (survivors' groups made) */
  uint64_t agreements_failed; /* AGREEs failed (timeout, epochs differ, store full) */
  uint64_t lost_pushed;      /* LOST frames sent */
  int groups;                /* survivors' groups held */
  uint64_t bytes, peak_bytes;       /* held under max_bytes */
  uint64_t inflight, peak_inflight; /* held under max_inflight */
  uint64_t out_queued, peak_out;    /* queued replies (referenced bytes included) */
  uint64_t bcasts_done;      /* BCASTs served to every member (failed ones: gathers_failed) */
  uint64_t hellos_held;
  uint64_t hb_conns;         /* heartbeat connections accepted (not in accepted) */
  uint64_t closed_silent;    /* ranks lost for a silent heartbeat connection */
  uint64_t chans_opened;     /* CHAN frames accepted (a member opened a channel) */
  uint64_t chans_refused;    /* CHAN frames refused (limit, members differ, ...) */
  int chans_held;            /* channels the store holds now */
  uint64_t notices_in, notices_out, notices_dropped; /* NOTICEs received, pushed, dropped */
  uint64_t old_clients;      /* connections refused for speaking wire version 1 */
} ncfsm__store_stats;

void ncfsm__store_opts_init(ncfsm__store_opts *o);
/* Override o's limits from NCFSM_STORE_* (value max, max bytes,
 * timeouts, ...; docs/bootstrap.md lists them), each read strictly through the settings table:
 * 0, or -1 at the first value the table refuses, with its message (the variable, the value,
 * what is accepted, what to do) in err. Unset variables leave o as it is. */
int ncfsm__store_opts_from_env(ncfsm__store_opts *o, char *err, size_t errlen);
/* The same, a refused value logged (WARN) instead. */
void ncfsm__store_opts_env(ncfsm__store_opts *o);
/* ncfsm-store's flag of a store setting ("--max-conns", "--no-heartbeat", ...), or NULL. A
 * flag with a value (every row but the BOOL ones) takes it in the row's range; its error names
 * the flag, the value and the range. */
typedef struct ncfsm__store_flag ncfsm__store_flag;
const ncfsm__store_flag *ncfsm__store_flag_find(const char *flag);
int ncfsm__store_flag_takes_value(const ncfsm__store_flag *f);
int ncfsm__store_flag_set(ncfsm__store_opts *o, const ncfsm__store_flag *f, const char *value, char *err,
                          size_t errlen);
/* 0 on success; else -1 with the reason in err. */
int ncfsm__store_open(struct event_base *base, const ncfsm__store_opts *o, ncfsm__store **out,
                      char *err, size_t errlen);
int ncfsm__store_port(const ncfsm__store *s);
void ncfsm__store_stats_get(const ncfsm__store *s, ncfsm__store_stats *st);
/* The limits in force (defaults resolved). */
void ncfsm__store_limits_get(const ncfsm__store *s, ncfsm__store_opts *o);
void ncfsm__store_close(ncfsm__store *s);

/* "host:port" -> sockaddr (numeric first, then getaddrinfo). 0 or -1. */
int ncfsm__parse_addr(const char *addr, struct sockaddr *sa, int *salen, char *err, size_t errlen);
int ncfsm__addr_is_loopback(const struct sockaddr *sa);
/* Constant-time comparison over max(alen, blen) bytes: 1 when equal. */
int ncfsm__ct_equal(const void *a, size_t alen, const void *b, size_t blen);

/* tcp bootstrap, for tests and tools: the port of the store this rank hosts, or -1. */
int ncfsm__boot_tcp_hosted_port(const ncfsm_boot *b);

#endif
