/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the tcp store's
 * per-rank secrets. Small and dependency-free; not constant-time beyond what
 * the algorithm is. */
#ifndef NCFSM_BOOTSTRAP_SHA256_H
#define NCFSM_BOOTSTRAP_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct ncfsm__sha256 {
  uint32_t h[8];
  uint64_t len; /* bytes hashed so far */
  uint8_t buf[64];
  size_t n; /* bytes in buf */
} ncfsm__sha256;

void ncfsm__sha256_init(ncfsm__sha256 *c);
void ncfsm__sha256_update(ncfsm__sha256 *c, const void *p, size_t n);
void ncfsm__sha256_final(ncfsm__sha256 *c, uint8_t out[32]);
void ncfsm__hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32]);

/* The secret of rank/size for a job token: lowercase hex of
 * HMAC-SHA256(token, "ncfsm-rank-secret/v1 <rank>/<size>"), 64 characters
 * and a NUL. */
void ncfsm__rank_secret(const char *token, uint32_t rank, uint32_t size, char out[65]);

#endif
