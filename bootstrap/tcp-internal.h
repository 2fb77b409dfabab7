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
  uint64_t max_bytes;        /* all keys, values and gathers; default 1 GiB */
  uint64_t auth_timeout_ms;  /* a connection must HELLO within this; default 10 s */
  int allow_remote;          /* listen on a non-loopback address */
} ncfsm__store_opts;

typedef struct ncfsm__store_stats {
  uint64_t accepted, authenticated, rejected_token, closed_bad_frame, closed_eof, frames;
  int open_conns;
} ncfsm__store_stats;

void ncfsm__store_opts_init(ncfsm__store_opts *o);
/* 0 on success; else -1 with the reason in err. */
int ncfsm__store_open(struct event_base *base, const ncfsm__store_opts *o, ncfsm__store **out,
                      char *err, size_t errlen);
int ncfsm__store_port(const ncfsm__store *s);
void ncfsm__store_stats_get(const ncfsm__store *s, ncfsm__store_stats *st);
void ncfsm__store_close(ncfsm__store *s);

/* "host:port" -> sockaddr (numeric first, then getaddrinfo). 0 or -1. */
int ncfsm__parse_addr(const char *addr, struct sockaddr *sa, int *salen, char *err, size_t errlen);
int ncfsm__addr_is_loopback(const struct sockaddr *sa);
/* Constant-time comparison over max(alen, blen) bytes: 1 when equal. */
int ncfsm__ct_equal(const void *a, size_t alen, const void *b, size_t blen);

/* tcp bootstrap, for tests and tools: the port of the store this rank hosts, or -1. */
int ncfsm__boot_tcp_hosted_port(const ncfsm_boot *b);

#endif
