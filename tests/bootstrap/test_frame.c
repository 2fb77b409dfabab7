/* Store frame parser: every truncation of a valid frame asks for more; each
 * kind of corruption is an error with a reason. */
#include "tests/bootstrap/boot_test.h"
#include "bootstrap/frame.h"
#include "bootstrap/tcp-internal.h"

static const ncfsm__frame_limits LIM = {NCFSM__FRAME_KEY_MAX, NCFSM__FRAME_VALUE_MAX};

static size_t make(uint8_t *buf, uint8_t type, uint32_t id, const char *key, const void *val,
                   uint32_t vlen) {
  uint32_t kl = (uint32_t)strlen(key);
  ncfsm__frame_header(buf, type, id, kl, vlen);
  memcpy(buf + NCFSM__FRAME_HDR, key, kl);
  if (vlen) memcpy(buf + NCFSM__FRAME_HDR + kl, val, vlen);
  return NCFSM__FRAME_HDR + kl + vlen;
}

static void test_roundtrip_and_truncation(void **state) {
  (void)state;
  uint8_t buf[256];
  size_t n = make(buf, NCFSM__F_SET, 77, "ag/1/3", "hello", 5);
  ncfsm__frame f;
  size_t used;
  const char *why;
  assert_int_equal(NCFSM__PARSE_OK, ncfsm__frame_parse(buf, n, &LIM, &f, &used, &why));
  assert_int_equal(n, used);
  assert_int_equal(NCFSM__F_SET, f.type);
  assert_int_equal(77, f.id);
  assert_int_equal(6, f.klen);
  assert_memory_equal("ag/1/3", f.key, 6);
  assert_memory_equal("hello", f.value, 5);
  for (size_t cut = 0; cut < n; cut++) {
    assert_int_equal(NCFSM__PARSE_MORE, ncfsm__frame_parse(buf, cut, &LIM, &f, &used, &why));
    assert_true(used > cut);
  }
  /* two frames back to back: the first parses alone */
  size_t m = make(buf + n, NCFSM__F_GET, 78, "k", NULL, 0);
  assert_int_equal(NCFSM__PARSE_OK, ncfsm__frame_parse(buf, n + m, &LIM, &f, &used, &why));
  assert_int_equal(n, used);
}

static void expect_err(const uint8_t *buf, size_t n, const ncfsm__frame_limits *lim, const char *sub) {
  ncfsm__frame f;
  size_t used;
  const char *why = NULL;
  assert_int_equal(NCFSM__PARSE_ERR, ncfsm__frame_parse(buf, n, lim, &f, &used, &why));
  assert_non_null(why);
  assert_non_null(strstr(why, sub));
}

static void test_errors(void **state) {
  (void)state;
  uint8_t buf[2048];
  size_t n;
  expect_err((const uint8_t *)"GET / HTTP/1.1\r\n", 16, &LIM, "magic");
  expect_err((const uint8_t *)"NX", 2, &LIM, "magic"); /* seen from the 2nd byte */
  n = make(buf, NCFSM__F_SET, 1, "k", "v", 1);
  buf[4] = 9;
  expect_err(buf, n, &LIM, "version");
  n = make(buf, 0x33, 1, "k", "v", 1);
  expect_err(buf, 6, &LIM, "unknown frame type");
  n = make(buf, NCFSM__F_SET, 1, "k", "v", 1);
  buf[7] = 1;
  expect_err(buf, n, &LIM, "flags");
  ncfsm__frame_header(buf, NCFSM__F_SET, 1, 513, 0);
  expect_err(buf, NCFSM__FRAME_HDR, &LIM, "key longer");
  ncfsm__frame_header(buf, NCFSM__F_SET, 1, 1, (1u << 20) + 1);
  expect_err(buf, NCFSM__FRAME_HDR, &LIM, "value longer");
  ncfsm__frame_header(buf, NCFSM__F_SET, 1, 1, UINT32_MAX);
  expect_err(buf, NCFSM__FRAME_HDR, &LIM, "value longer");
  n = make(buf, NCFSM__F_HELLO, 0, "tok", "1234", 4);
  expect_err(buf, n, &LIM, "HELLO value");
  n = make(buf, NCFSM__F_GET, 0, "", NULL, 0);
  expect_err(buf, n, &LIM, "empty key");
  n = make(buf, NCFSM__F_ADD, 0, "c", "1234", 4);
  expect_err(buf, n, &LIM, "ADD value");
  uint8_t g[8];
  ncfsm__wr32(g, 4);
  ncfsm__wr32(g + 4, 4);
  n = make(buf, NCFSM__F_GATHER, 0, "ag/0", g, 8);
  expect_err(buf, n, &LIM, "rank not below size");
}

/* Version 2 (issue 21): CHAN, CHAN_CLOSE and NOTICE, their shapes; version 1 is refused. */
static void test_channel_frames(void **state) {
  (void)state;
  uint8_t buf[600], v[12];
  ncfsm__frame f;
  size_t used, n;
  const char *why;
  ncfsm__wr32(v, 2);
  ncfsm__wr32(v + 4, 3);
  ncfsm__wr32(v + 8, 0);
  n = make(buf, NCFSM__F_CHAN, 5, "@#ncfsm.verify.1f", v, 12);
  assert_int_equal(NCFSM__PARSE_OK, ncfsm__frame_parse(buf, n, &LIM, &f, &used, &why));
  assert_string_equal("CHAN", ncfsm__frame_type_name(f.type));
  n = make(buf, NCFSM__F_CHAN, 5, "@#t", v, 8);
  expect_err(buf, n, &LIM, "u32 n + n x u32 ranks");
  n = make(buf, NCFSM__F_CHAN, 5, "@/3", v, 12);
  expect_err(buf, n, &LIM, "CHAN key is not @#<tag>");
  n = make(buf, NCFSM__F_CHAN_CLOSE, 0, "@#t", NULL, 0);
  assert_int_equal(NCFSM__PARSE_OK, ncfsm__frame_parse(buf, n, &LIM, &f, &used, &why));
  n = make(buf, NCFSM__F_CHAN_CLOSE, 0, "@#t", v, 4);
  expect_err(buf, n, &LIM, "CHAN_CLOSE with a value");
  uint8_t nt[300] = {0};
  n = make(buf, NCFSM__F_NOTICE, 0, "@", nt, 24);
  assert_int_equal(NCFSM__PARSE_OK, ncfsm__frame_parse(buf, n, &LIM, &f, &used, &why));
  n = make(buf, NCFSM__F_NOTICE, 0, "@", nt, 23);
  expect_err(buf, n, &LIM, "NOTICE value");
  n = make(buf, NCFSM__F_NOTICE, 0, "@", nt, 280);
  expect_err(buf, n, &LIM, "NOTICE value");
  n = make(buf, NCFSM__F_NOTICE, 0, "x", nt, 24);
  expect_err(buf, n, &LIM, "NOTICE key");
  n = make(buf, NCFSM__F_SET, 1, "k", "v", 1);
  buf[4] = 1; /* a version-1 peer */
  expect_err(buf, n, &LIM, "version");
  ncfsm__frame_header_v(buf, 1, NCFSM__F_ERR, 0, 0, 0);
  assert_int_equal(1, buf[4]);
}

static void test_ct_equal(void **state) {
  (void)state;
  assert_true(ncfsm__ct_equal("abc", 3, "abc", 3));
  assert_false(ncfsm__ct_equal("abc", 3, "abd", 3));
  assert_false(ncfsm__ct_equal("abc", 3, "abcd", 4));
  assert_false(ncfsm__ct_equal("", 0, "a", 1));
  assert_true(ncfsm__ct_equal("", 0, "", 0));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      BT_TEST(test_roundtrip_and_truncation),
      BT_TEST(test_errors),
      BT_TEST(test_channel_frames),
      BT_TEST(test_ct_equal),
  };
  return cmocka_run_group_tests_name("bootstrap_frame", tests, NULL, NULL);
}
