/* The tcp store's per-rank secrets: HMAC-SHA256 from libcrypto (OpenSSL). */
#ifndef NCFSM_BOOTSTRAP_SECRET_H
#define NCFSM_BOOTSTRAP_SECRET_H

#include <stddef.h>
#include <stdint.h>

/* HMAC-SHA256(key, msg) into out; 0 on success. */
int ncfsm__hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32]);

/* The secret of rank/size for a job token: lowercase hex of
 * HMAC-SHA256(token, "ncfsm-rank-secret/v1 <rank>/<size>"), 64 characters
 * and a NUL ("" if libcrypto failed). */
void ncfsm__rank_secret(const char *token, uint32_t rank, uint32_t size, char out[65]);

#endif
