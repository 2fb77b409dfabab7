/*
 * ncfsm-trace: every send of one communicator paired with its receive
 * (check.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/trace/check.h"

const dump *rank_dump(const comm *c, int rank) {
  for (size_t i = 0; i < c->nd; i++)
    if (c->d[i]->rank == rank) return c->d[i];
  return NULL;
}
static const chan *find_chan(const dump *d, int peer, int dir) {
  for (size_t i = 0; d && i < d->nchans; i++)
    if (d->chans[i].peer == peer && d->chans[i].dir == dir) return &d->chans[i];
  return NULL;
}

typedef enum side_kind { SIDE_ENTRY, SIDE_LOST, SIDE_ABSENT } side_kind;
static side_kind side_at(const dump *d, const chan *ch, long long s, const entry **e) {
  *e = NULL;
  if (ch && ch->n && s >= ch->e[0]->seq && s <= ch->e[ch->n - 1]->seq) {
    *e = ch->e[s - ch->e[0]->seq];
    return SIDE_ENTRY;
  }
  if (d->wrapped && (!ch || !ch->n || s < ch->e[0]->seq)) return SIDE_LOST;
  return SIDE_ABSENT;
}

static json_t *side_json(const dump *d, const entry *e) {
  json_t *o = json_pack("{s:i}", "rank", d->rank);
  check_json(o);
  json_object_set_new(o, "entry", e ? entry_json(d, e) : json_null());
  return o;
}

static void sb_side(sbuf *b, const dump *d, const entry *e) {
  sb_printf(b, "%s on rank %d ", op_name(e->op), d->rank);
  sb_state(b, d, e);
}

/* Pairs the sends src->dst with the receives on dst from src; adds a finding
 * at the first problem. */
static void check_channel(comm *c, const dump *src, const dump *dst) {
  const chan *S = find_chan(src, dst->rank, NCFSM_KIND_SEND), *R = find_chan(dst, src->rank, NCFSM_KIND_RECV);
  long long from = NONE, to = NONE;
  const chan *both[2] = {S, R};
  for (int i = 0; i < 2; i++) {
    if (!both[i] || !both[i]->n) continue;
    long long lo = both[i]->e[0]->seq, hi = both[i]->e[both[i]->n - 1]->seq;
    if (from == NONE || lo < from) from = lo;
    if (to == NONE || hi > to) to = hi;
  }
  if (from == NONE) return;
  for (long long s = from; s <= to; s++) {
    const entry *se, *re;
    side_kind sk = side_at(src, S, s, &se), rk = side_at(dst, R, s, &re);
    sbuf t = {0}, det = {0};
    fkind k;
    const char *field = NULL;
    if (sk == SIDE_ENTRY && rk == SIDE_ENTRY) {
      c->p2p_pairs++;
      if (se->count != re->count || se->dtype != re->dtype) {
        k = F_P2P_MISMATCH;
        field = se->count != re->count ? "count" : "dtype";
        sb_printf(&t, "send %d->%d seq %lld: %s mismatch: SEND on rank %d ", src->rank, dst->rank, s, field, src->rank);
        if (se->count != re->count)
          sb_printf(&t, "count %lld", se->count);
        else
          sb_printf(&t, "%s", dtype_name(se->dtype));
        sb_printf(&t, ", RECV on rank %d ", dst->rank);
        if (se->count != re->count)
          sb_printf(&t, "count %lld", re->count);
        else
          sb_printf(&t, "%s", dtype_name(re->dtype));
        if (se->count != re->count && se->dtype != re->dtype)
          sb_printf(&det, "    also differ: dtype (SEND %s, RECV %s)\n", dtype_name(se->dtype), dtype_name(re->dtype));
      } else if (is_failed(se) || is_failed(re)) {
        k = F_P2P_FAILED;
        sb_printf(&t, "send %d->%d seq %lld: failed: ", src->rank, dst->rank, s);
        if (is_failed(se)) sb_side(&t, src, se);
        if (is_failed(se) && is_failed(re)) sb_printf(&t, ", ");
        if (is_failed(re)) sb_side(&t, dst, re);
        if (!is_failed(se)) sb_printf(&t, " (SEND on rank %d %s)", src->rank, work_state_name(se->state));
        if (!is_failed(re)) sb_printf(&t, " (RECV on rank %d %s)", dst->rank, work_state_name(re->state));
        const dump *dd[2] = {src, dst};
        const entry *ee[2] = {se, re};
        for (int i = 0; i < 2; i++)
          if (is_failed(ee[i]) && dd[i]->failure && *dd[i]->failure)
            sb_printf(&det, "    cause on rank %d: \"%s\"\n", dd[i]->rank, dd[i]->failure);
      } else if (is_completed(se) != is_completed(re)) {
        k = F_P2P_PARTIAL;
        sb_printf(&t, "send %d->%d seq %lld: partial progress: ", src->rank, dst->rank, s);
        sb_side(&t, src, se);
        sb_printf(&t, ", ");
        sb_side(&t, dst, re);
      } else {
        continue;
      }
    } else if ((sk == SIDE_ENTRY && rk == SIDE_ABSENT) || (sk == SIDE_ABSENT && rk == SIDE_ENTRY)) {
      k = F_P2P_UNMATCHED;
      int send_side = sk == SIDE_ENTRY;
      const dump *have = send_side ? src : dst, *lack = send_side ? dst : src;
      const chan *lc = send_side ? R : S;
      const entry *e = send_side ? se : re;
      sb_printf(&t, "send %d->%d seq %lld: %s on rank %d (", src->rank, dst->rank, s, op_name(e->op), have->rank);
      sb_fingerprint(&t, e);
      sb_printf(&t, ", ");
      sb_state(&t, have, e);
      sb_printf(&t, ") has no matching %s on rank %d (", send_side ? "RECV" : "SEND", lack->rank);
      if (lc && lc->n)
        sb_printf(&t, "its last %s %s rank %d: seq %lld)", send_side ? "RECV" : "SEND", send_side ? "from" : "to",
                  have->rank, lc->e[lc->n - 1]->seq);
      else
        sb_printf(&t, "it posted no %s %s rank %d)", send_side ? "RECV" : "SEND", send_side ? "from" : "to",
                  have->rank);
    } else {
      continue;
    }
    json_t *x = json_pack("{s:I, s:i, s:i, s:o, s:o}", "seq", (json_int_t)s, "src", src->rank, "dst", dst->rank, "send",
                          side_json(src, se), "recv", side_json(dst, re));
    check_json(x);
    if (field) json_object_set_new(x, "field", json_string(field));
    add_finding(c, k, sb_take(&t), sb_take(&det), x);
    free(t.p);
    free(det.p);
    return;
  }
}

void walk_p2p(comm *c) {
  for (size_t i = 0; i < c->nd; i++) {
    const dump *a = c->d[i];
    for (size_t j = 0; j < a->nchans; j++) {
      const chan *ch = &a->chans[j];
      const dump *b = rank_dump(c, ch->peer);
      if (!b) continue; /* the peer's dump is missing: reported as missing_dump */
      if (ch->dir == NCFSM_KIND_SEND)
        check_channel(c, a, b);
      else if (!find_chan(b, a->rank, NCFSM_KIND_SEND))
        check_channel(c, b, a); /* receives with no send at all */
    }
  }
}

