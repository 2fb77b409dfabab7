/* The coalescing cap (fsm/coalesce.h): the fit of a launch's cost to its op
 * count and the rule that picks the cap from it. */
#include "fsm/coalesce.h"

#include <math.h> /* isfinite */

void ncfsm__coalesce_init(ncfsm__coalesce *co, unsigned coalesce_max) {
  *co = (ncfsm__coalesce){.cap = coalesce_max ? coalesce_max : NCFSM__COALESCE_START, .adaptive = !coalesce_max};
}

unsigned ncfsm__coalesce_auto_begin(ncfsm__coalesce *co, unsigned step, bool *timed) {
  uint64_t i = co->launches++;
  *timed = i % NCFSM__COALESCE_EVERY == 0;
  if (!*timed || i / NCFSM__COALESCE_EVERY % NCFSM__COALESCE_PROBE != NCFSM__COALESCE_PROBE - 1) return co->cap;
  if (co->cap / 2 >= 2 * step) return co->cap / 2;
  return co->cap * 2 < NCFSM__COALESCE_HI ? co->cap * 2 : NCFSM__COALESCE_HI;
}

bool ncfsm__coalesce_fit(const ncfsm__coalesce_sums *s, double *fixed_ns, double *per_op_ns) {
  if (s->w < 4) return false;
  double mk = s->k / s->w, mt = s->t / s->w;
  double vk = s->kk / s->w - mk * mk, ckt = s->kt / s->w - mk * mt;
  /* sizes apart by less than about one op, or 5% of the mean: the slope is noise */
  if (vk < 0.25 || vk < 0.0025 * mk * mk) return false;
  double b = ckt / vk, a = mt - b * mk;
  if (!isfinite(a) || !isfinite(b)) return false;
  *fixed_ns = a;
  *per_op_ns = b;
  return true;
}

/* x rounded up (or down), within [NCFSM__COALESCE_LO, _HI] (NaN: LO). */
static unsigned clamp(double x, bool up) {
  if (!(x > NCFSM__COALESCE_LO)) return NCFSM__COALESCE_LO;
  if (x >= NCFSM__COALESCE_HI) return NCFSM__COALESCE_HI;
  unsigned k = (unsigned)x; /* x > 0: truncation rounds down */
  return up && k < x ? k + 1 : k;
}

unsigned ncfsm__coalesce_choose(double fixed_ns, double per_op_ns) {
  const double f = NCFSM__COALESCE_FIXED_SHARE;
  if (!(fixed_ns > 0)) return NCFSM__COALESCE_LO; /* nothing to amortise */
  if (!(per_op_ns > 0)) return NCFSM__COALESCE_HI; /* ops cost nothing measurable: no latency to bound */
  /* fixed / (fixed + per_op * k) <= f  <=>  k >= fixed * (1 - f) / (f * per_op) */
  unsigned amortised = clamp(fixed_ns * (1 - f) / (f * per_op_ns), true);
  unsigned bounded = clamp(NCFSM__COALESCE_LATENCY_NS / per_op_ns, false);
  return amortised < bounded ? amortised : bounded;
}

void ncfsm__coalesce_sample(ncfsm__coalesce *co, unsigned nops, uint64_t ns) {
  double k = nops, t = (double)ns;
  if (co->fitted) {
    double pred = co->fixed_ns + co->per_op_ns * k;
    if (pred > 0 && t > NCFSM__COALESCE_CLIP * pred) t = NCFSM__COALESCE_CLIP * pred;
  }
  ncfsm__coalesce_sums *s = &co->sums;
  const double keep = 1 - NCFSM__COALESCE_DECAY;
  s->w = s->w * keep + 1;
  s->k = s->k * keep + k;
  s->t = s->t * keep + t;
  s->kk = s->kk * keep + k * k;
  s->kt = s->kt * keep + k * t;
  co->samples++;
  double fixed, per_op;
  if (!ncfsm__coalesce_fit(s, &fixed, &per_op)) return;
  co->fitted = true;
  co->fixed_ns = fixed;
  co->per_op_ns = per_op;
  /* one noisy fit moves the cap by a factor of 2 at most */
  unsigned want = ncfsm__coalesce_choose(fixed, per_op);
  unsigned lo = co->cap / 2 > NCFSM__COALESCE_LO ? co->cap / 2 : NCFSM__COALESCE_LO;
  unsigned hi = co->cap * 2 < NCFSM__COALESCE_HI ? co->cap * 2 : NCFSM__COALESCE_HI;
  co->cap = want < lo ? lo : want > hi ? hi : want;
}
