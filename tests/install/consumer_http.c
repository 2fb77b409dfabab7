/* A program built against an INSTALLED ncfsm_http (find_package's ncfsm::http,
 * or pkg-config ncfsm_http): serves /status on a free port of the loopback,
 * then stops. */
#include <ncfsm.h>
#include <ncfsm/http.h>
#include <stdio.h>

int main(void) {
  ncfsm_loop *loop;
  if (ncfsm_loop_new(NULL, &loop) != NCFSM_OK) return 1;
  ncfsm_http_opts o;
  ncfsm_http_opts_init(&o);
  ncfsm_http *h;
  if (ncfsm_http_start(ncfsm_loop_base(loop), loop, &o, &h) != NCFSM_OK) {
    fprintf(stderr, "consumer_http: %s\n", ncfsm_http_start_error());
    return 2;
  }
  int port = ncfsm_http_port(h);
  ncfsm_http_stop(h);
  printf("consumer_http: served on a free port: %s\n", port > 0 ? "yes" : "no");
  return port > 0 && ncfsm_loop_close(loop) == NCFSM_OK ? 0 : 3;
}
