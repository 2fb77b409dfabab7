/*
 * Probe behind the GPU benchmark finding (docs/results/benchmarks-gpu-section.md):
 * how long one event_base_loop(EVLOOP_ONCE) turn takes with a timer of N us,
 * with and without EVENT_BASE_FLAG_PRECISE_TIMER. Not part of the build.
 *
 *   cc -O2 docs/results/bench-gpu-epoll-timer.c -o /tmp/evt -levent_core && /tmp/evt
 *
 * Output on the development VM (2026-11-30):
 *   precise=0 timer    0 us -> 0.4 us per loop turn (epoll)
 *   precise=0 timer    1 us -> 4002.6 us per loop turn (epoll)
 *   precise=0 timer   10 us -> 4003.9 us per loop turn (epoll)
 *   precise=0 timer  100 us -> 3996.4 us per loop turn (epoll)
 *   precise=0 timer  500 us -> 4001.9 us per loop turn (epoll)
 *   precise=1 timer    0 us -> 0.9 us per loop turn (epoll)
 *   precise=1 timer    1 us -> 18.9 us per loop turn (epoll)
 *   precise=1 timer   10 us -> 34.9 us per loop turn (epoll)
 *   precise=1 timer  100 us -> 127.6 us per loop turn (epoll)
 *   precise=1 timer  500 us -> 540.5 us per loop turn (epoll)
 */
#include <event2/event.h>
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static void cb(evutil_socket_t f, short w, void *a){(void)f;(void)w;(void)a;}
int main(void){
  for (int precise=0; precise<2; precise++){
    struct event_config *cfg=event_config_new(); if(precise) event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
    struct event_base *b=event_base_new_with_config(cfg); struct event *e=evtimer_new(b,cb,NULL);
    long us[]={0,1,10,100,500};
    for(int i=0;i<5;i++){ double t0=now(); for(int k=0;k<100;k++){struct timeval tv={0,us[i]}; evtimer_add(e,&tv); event_base_loop(b,EVLOOP_ONCE);} printf("precise=%d timer %4ld us -> %.1f us per loop turn (%s)\n",precise,us[i],(now()-t0)/100, event_base_get_method(b)); }
    event_free(e); event_base_free(b); event_config_free(cfg);
  }
}
