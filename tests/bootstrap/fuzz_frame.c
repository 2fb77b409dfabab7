/*
 * libFuzzer target for the store's frame parser (bootstrap/frame.c).
 *   clang -fsanitize=fuzzer,address,undefined -I. tests/bootstrap/fuzz_frame.c bootstrap/frame.c
 * Checks, for any input: no out-of-bounds read; OK means the frame lies
 * inside the input and matches its header; MORE asks for more than was given;
 * and parsing a prefix never disagrees with parsing the whole (a server that
 * receives the bytes in pieces decides the same).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const uint8_t *data, size_t size, const ncfsm__frame_limits *lim) {
  ncfsm__frame f;
  size_t used = 0;
  const char *why = NULL;
  ncfsm__parse_t r = ncfsm__frame_parse(data, size, lim, &f, &used, &why);
  switch (r) {
  case NCFSM__PARSE_OK:
    if (used > size || used != NCFSM__FRAME_HDR + (size_t)f.klen + f.vlen) abort();
    if (f.key != data + NCFSM__FRAME_HDR || f.value != f.key + f.klen) abort();
    if (f.klen > lim->key_max || f.vlen > lim->value_max) abort();
    if (why) abort();
    /* touch every byte the frame claims */
    {
      volatile uint8_t x = 0;
      for (uint32_t i = 0; i < f.klen; i++) x ^= f.key[i];
      for (uint32_t i = 0; i < f.vlen; i++) x ^= f.value[i];
      (void)x;
    }
    break;
  case NCFSM__PARSE_MORE:
    if (used <= size) abort();
    break;
  case NCFSM__PARSE_ERR:
    if (!why) abort();
    break;
  default: abort();
  }
  /* prefix consistency: a prefix is MORE, or the same error */
  size_t cut = size / 2;
  ncfsm__frame g;
  size_t used2 = 0;
  const char *why2 = NULL;
  ncfsm__parse_t r2 = ncfsm__frame_parse(data, cut, lim, &g, &used2, &why2);
  if (r == NCFSM__PARSE_MORE && r2 == NCFSM__PARSE_OK) abort();
  if (r == NCFSM__PARSE_OK && r2 == NCFSM__PARSE_OK && used2 != used) abort();
  if (r2 == NCFSM__PARSE_ERR && r == NCFSM__PARSE_MORE) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* a private copy of exactly size bytes so ASan catches any overread */
  uint8_t *buf = malloc(size ? size : 1);
  if (!buf) return 0;
  memcpy(buf, data, size);
  const ncfsm__frame_limits dflt = {NCFSM__FRAME_KEY_MAX, NCFSM__FRAME_VALUE_MAX};
  const ncfsm__frame_limits tiny = {8, 64};
  check(buf, size, &dflt);
  check(buf, size, &tiny);
  /* and with a valid magic/version prefix so the fuzzer reaches the lengths */
  if (size >= 2) {
    uint8_t *v = malloc(size + 5);
    if (v) {
      memcpy(v, "NCFS\x01", 5);
      memcpy(v + 5, buf, size);
      check(v, size + 5, &tiny);
      check(v, size + 5, &dflt);
      free(v);
    }
  }
  free(buf);
  return 0;
}
