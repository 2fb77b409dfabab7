/*
 * The launcher's coalescing cap: the most ops one coalesced launch (one
 * backend group holding several instances of every rank of a clique) may
 * hold. NCFSM_COALESCE_MAX pins it; auto (ncfsm_loop_opts.coalesce_max 0)
 * chooses it from what coalesced launches cost, measured as they happen:
 * the launcher reads the clock before and after each one (two reads per
 * launch, none per op), and a line t = fixed + per_op * ops is fitted to
 * those samples by decayed least squares. The rule and its constants:
 * docs/design.md "Adaptive coalescing".
 */
#ifndef NCFSM_FSM_COALESCE_H
#define NCFSM_FSM_COALESCE_H

#include <stdbool.h>
#include <stdint.h>

#define NCFSM__COALESCE_START 16u   /* auto: the cap until the costs are fitted */
#define NCFSM__COALESCE_LO 2u       /* auto's smallest cap */
#define NCFSM__COALESCE_HI 1024u    /* auto's largest (the launcher's R12 set is sized for it) */
#define NCFSM__COALESCE_FIXED_SHARE 0.10 /* a full launch: the fixed cost's share at most this */
#define NCFSM__COALESCE_LATENCY_NS 50000.0 /* ... and its ops' cost at most this (what the launch adds to its first op) */
#define NCFSM__COALESCE_DECAY (1.0 / 32) /* each sample's weight shrinks by this at every later one */
#define NCFSM__COALESCE_EVERY 4u    /* one launch in 4 is timed (two clock reads) */
#define NCFSM__COALESCE_PROBE 4u    /* one timed launch in 4 is a probe: two sizes to fit a line to */
#define NCFSM__COALESCE_CLIP 1.5    /* a sample counts as this many times the fit's prediction at most (a
                                       preemption moves the fit little; a real rise is followed in steps) */

/* Decayed sums over the samples (k ops, t ns): weight, k, t, k*k, k*t. */
typedef struct ncfsm__coalesce_sums {
  double w, k, t, kk, kt;
} ncfsm__coalesce_sums;

typedef struct ncfsm__coalesce {
  unsigned cap;       /* the cap now (pinned: the option) */
  bool adaptive;      /* auto: cap follows the fit */
  bool fitted;        /* fixed_ns, per_op_ns hold a fit */
  ncfsm__coalesce_sums sums;
  double fixed_ns, per_op_ns;
  uint64_t samples;   /* coalesced launches measured */
  uint64_t launches;  /* launches that could coalesce */
} ncfsm__coalesce;

/* coalesce_max: the option (0: auto). */
void ncfsm__coalesce_init(ncfsm__coalesce *co, unsigned coalesce_max);

/* A launch that may coalesce, of step ops per instance (the clique's
 * ranks), begins: the most ops it may hold, and whether to time it
 * (*timed: auto, one launch in NCFSM__COALESCE_EVERY). The cap; but every
 * NCFSM__COALESCE_PROBE-th timed launch is a probe of a second size: half
 * the cap, or twice it (at most NCFSM__COALESCE_HI) where half could not
 * hold two instances. */
unsigned ncfsm__coalesce_auto_begin(ncfsm__coalesce *co, unsigned step, bool *timed);
static inline unsigned ncfsm__coalesce_begin(ncfsm__coalesce *co, unsigned step, bool *timed) {
  if (co->adaptive) return ncfsm__coalesce_auto_begin(co, step, timed);
  *timed = false; /* pinned: a load and a branch */
  return co->cap;
}

/* A coalesced launch of nops ops took ns: folded into the sums, refitted,
 * and the cap moved toward the rule's choice (at most doubled or halved). */
void ncfsm__coalesce_sample(ncfsm__coalesce *co, unsigned nops, uint64_t ns);

/* The least-squares line through the sums: true with *fixed_ns and
 * *per_op_ns, or false while they hold less than 4 samples' weight or
 * launch sizes too alike to tell the two costs apart. */
bool ncfsm__coalesce_fit(const ncfsm__coalesce_sums *s, double *fixed_ns, double *per_op_ns);

/* The rule: the smallest cap whose launches' fixed share is at most
 * NCFSM__COALESCE_FIXED_SHARE, unless its ops would cost more than
 * NCFSM__COALESCE_LATENCY_NS, within [NCFSM__COALESCE_LO, _HI]. */
unsigned ncfsm__coalesce_choose(double fixed_ns, double per_op_ns);

#endif
