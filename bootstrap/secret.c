/* Per-rank secrets (see secret.h): HMAC-SHA256 is libcrypto's. */
#include "bootstrap/secret.h"

#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

int ncfsm__hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32]) {
  unsigned int n = 0;
  static const uint8_t none;
  if (!HMAC(EVP_sha256(), klen ? key : &none, (int)klen, msg, mlen, out, &n) || n != 32) return -1;
  return 0;
}

void ncfsm__rank_secret(const char *token, uint32_t rank, uint32_t size, char out[65]) {
  char msg[64];
  int n = snprintf(msg, sizeof msg, "ncfsm-rank-secret/v1 %u/%u", rank, size);
  uint8_t mac[32];
  out[0] = 0;
  if (n < 0 || ncfsm__hmac_sha256(token, strlen(token), msg, (size_t)n, mac) != 0) return;
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    out[2 * i] = hex[mac[i] >> 4];
    out[2 * i + 1] = hex[mac[i] & 15];
  }
  out[64] = 0;
}
