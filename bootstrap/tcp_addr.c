/* Addresses and the constant-time compare, shared by the tcp store and its client. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/util.h>

#include "bootstrap/tcp-internal.h"

int ncfsm__ct_equal(const void *a, size_t alen, const void *b, size_t blen) {
  const volatile uint8_t *x = a, *y = b;
  size_t n = alen > blen ? alen : blen;
  uint8_t d = (uint8_t)(alen != blen);
  for (size_t i = 0; i < n; i++) {
    uint8_t xi = i < alen ? x[i] : 0, yi = i < blen ? y[i] : 0;
    d |= (uint8_t)(xi ^ yi);
  }
  return d == 0;
}

/* The port of "host:port" / "[v6]:port": decimal digits, 0 to 65535. libevent and getaddrinfo
 * take an address without a port (port 0: a random one) and a port past 65535 (cut to 16 bits:
 * 99999 is 34463), so the port is checked here first. NULL, or the problem (into buf). */
static const char *port_problem(const char *addr, char *buf, size_t n) {
  const char *close = addr[0] == '[' ? strchr(addr, ']') : NULL;
  const char *colon = close ? (close[1] == ':' ? close + 1 : NULL) : strrchr(addr, ':');
  unsigned char ip[16];
  if (!colon || (!close && memchr(addr, ':', (size_t)(colon - addr)))) { /* none, or a bare IPv6 */
    if (!close && inet_pton(AF_INET, addr, ip) != 1 && inet_pton(AF_INET6, addr, ip) != 1)
      snprintf(buf, n, "store address '%s' is not host:port", addr);
    else
      snprintf(buf, n, "store address '%s' has no port: write HOST:PORT, or [IPv6]:PORT (port 0 "
                       "picks a free one)", addr);
  } else if (!colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1))
    snprintf(buf, n, "store address '%s': the port '%s' is not a number (HOST:PORT, PORT 0 to "
                     "65535; 0 picks a free one)", addr, colon + 1);
  else if (strlen(colon + 1) > 5 || atoi(colon + 1) > 65535)
    snprintf(buf, n, "store address '%s': the port %s is past 65535 (HOST:PORT, PORT 0 to 65535; "
                     "0 picks a free one)", addr, colon + 1);
  else return NULL;
  return buf;
}

int ncfsm__parse_addr(const char *addr, struct sockaddr *sa, int *salen, char *err, size_t errlen) {
  int len = *salen;
  if (!addr || !*addr) {
    snprintf(err, errlen, "empty store address: set NCFSM_STORE_ADDR=host:port");
    return -1;
  }
  if (port_problem(addr, err, errlen)) return -1;
  if (evutil_parse_sockaddr_port(addr, sa, &len) == 0) {
    *salen = len;
    return 0;
  }
  char host[256];
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host || !colon[1]) {
    snprintf(err, errlen, "store address '%s' is not host:port", addr);
    return -1;
  }
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = 0;
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host, colon + 1, &hints, &res);
  if (rc != 0 || !res) {
    snprintf(err, errlen, "store address '%s': %s", addr, gai_strerror(rc));
    return -1;
  }
  if ((int)res->ai_addrlen > *salen) {
    freeaddrinfo(res);
    snprintf(err, errlen, "store address '%s': address too long", addr);
    return -1;
  }
  memcpy(sa, res->ai_addr, res->ai_addrlen);
  *salen = (int)res->ai_addrlen;
  freeaddrinfo(res);
  return 0;
}

int ncfsm__addr_is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return 1;
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) return in6->sin6_addr.s6_addr[12] == 127;
  }
  return 0;
}
