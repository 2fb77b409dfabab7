#!/usr/bin/env python3
"""Tables of bench/run_engine_scale.sh (issue 22): callgrind instructions per op
(bench/callgrind_overhead.sh --csv) and wall-time ns/op (engine_overhead's
output) side by side, per family of modes, and issue 22's goals against them.

  engine_scale_table.py --cg CG.csv --wall WALL.txt [--wall MORE.txt] --list LIST.tsv
                        --csv OUT.csv --comms-csv COMMS.csv [--cpus N]  > tables.md

--cpus: the CPUs the wall times ran on (default: this process's). The foreign
submitter's goal needs a core per thread (the submitter, the loop's thread) and
one for the rest: on fewer than 4 its ratio is shown, its status says it was not
measurable there.

Standard library only. A mode that was not run shows as a dash.
"""
import argparse
import csv
import os
import re
import sys

ROW = re.compile(r"^(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)$")
RATIO = re.compile(r"^  ratio (\S+) ([\d.]+)")
MEMORY = re.compile(r"^  memory rss_kb base=(-?\d+) peak=(-?\d+) done=(-?\d+) idle=(-?\d+) "
                    r"heap_kb base=(-?\d+) peak=(-?\d+) done=(-?\d+) idle=(-?\d+) "
                    r"\(peak of (\d+) outstanding works, idle (\d+) ms\)")


def read_cg(path):
    cg = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            cg[r["mode"]] = (int(r["ops"]), float(r["per_op"]))
    return cg


def read_wall(paths):
    wall, ratio, memory = {}, {}, {}
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.rstrip("\n")
                m = ROW.match(line)
                if m:
                    wall[m.group(1)] = (float(m.group(2)), float(m.group(3)), float(m.group(4)), int(m.group(5)))
                    continue
                m = RATIO.match(line)
                if m:
                    ratio[m.group(1)] = float(m.group(2))
                    continue
                m = MEMORY.match(line)
                if m:
                    v = [int(x) for x in m.groups()]
                    memory = {"rss": v[0:4], "heap": v[4:8], "peak": v[8], "idle_ms": v[9]}
    return wall, ratio, memory


def fmt(v, nd=0):
    if v is None:
        return "—"
    return f"{v:,.{nd}f}"


def div(a, b):
    return a / b if a is not None and b else None


class Data:
    def __init__(self, cg, wall, ratio, memory, what, cpus):
        self.cg, self.wall, self.ratio, self.memory, self.what = cg, wall, ratio, memory, what
        self.cpus = cpus

    def instr(self, mode):
        return self.cg[mode][1] if mode in self.cg else None

    def ns(self, mode):
        return self.wall[mode][0] if mode in self.wall else None


def table(head, rows, left=1):
    """Markdown; the first `left` columns are text, the others numbers (right-aligned)."""
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if i < left else "---:" for i in range(len(head))) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def all_modes(d, order):
    rows = []
    for mode in order:
        if mode not in d.cg and mode not in d.wall:
            continue
        ops = d.cg[mode][0] if mode in d.cg else d.wall[mode][3]
        w = d.wall.get(mode)
        rows.append([f"`{mode}`", d.what.get(mode, ""), fmt(ops), fmt(d.instr(mode)),
                     fmt(w[0], 1) if w else "—", fmt(w[1], 1) if w else "—", fmt(w[2], 1) if w else "—"])
        ref = mode + ".self"
        if ref in d.wall:
            w = d.wall[ref]
            rows.append([f"`{ref}`", "the reference of the line above, same process, alternating runs", fmt(w[3]),
                         "—", fmt(w[0], 1), fmt(w[1], 1), fmt(w[2], 1)])
    return table(["mode", "what", "ops", "instructions/op", "ns/op median", "min", "max"], rows, left=2)


def family(d, fam, params):
    return [(p, f"{fam}-{p}") for p in params if f"{fam}-{p}" in d.cg or f"{fam}-{p}" in d.wall]


def comms(d, out_csv):
    ns_ = sorted({int(m.split("-")[1]) for m in list(d.cg) + list(d.wall) if re.match(r"^(rr|each)-\d+$", m)})
    rr1, each1 = d.instr("rr-1"), d.instr("each-1")
    rows = []
    with open(out_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["n_comms", "rr_instr_per_op", "each_instr_per_op", "rr_ns_per_op", "each_ns_per_op"])
        for n in ns_:
            r, e = d.instr(f"rr-{n}"), d.instr(f"each-{n}")
            rn, en = d.ns(f"rr-{n}"), d.ns(f"each-{n}")
            w.writerow([n] + ["" if v is None else f"{v:.1f}" for v in (r, e, rn, en)])
            rows.append([str(n), fmt(r), fmt(div(r, rr1), 2), fmt(e), fmt(div(e, each1), 2), fmt(rn, 1), fmt(en, 1)])
    return table(["comms N", "rr instr/op", "rr vs N=1", "each instr/op", "each vs N=1", "rr ns/op", "each ns/op"],
                 rows)


def r12(d):
    caps = sorted({int(m.rsplit("-", 1)[1]) for m in list(d.cg) + list(d.wall)
                   if re.match(r"^r12-(asc|desc|rand)-\d+$", m)})
    rows = []
    for c in caps:
        a, s, x = d.instr(f"r12-asc-{c}"), d.instr(f"r12-desc-{c}"), d.instr(f"r12-rand-{c}")
        an, sn = d.ns(f"r12-asc-{c}"), d.ns(f"r12-desc-{c}")
        rows.append([str(c), fmt(a), fmt(s), fmt(div(s, a), 2), fmt(x), fmt(div(x, a), 2), fmt(an, 1), fmt(sn, 1),
                     fmt(div(sn, an), 2)])
    return table(["coalesce_max", "ascending instr/op", "descending instr/op", "desc/asc", "scattered instr/op",
                  "scattered/asc", "asc ns/op", "desc ns/op", "desc/asc (wall)"], rows)


def groups(d):
    rows = []
    for g, mode in family(d, "group", [1, 8, 64, 512, 4096]):
        u = f"works-{g}"
        rows.append([str(g), fmt(d.instr(mode)), fmt(d.instr(u)), fmt(div(d.instr(mode), d.instr(u)), 2),
                     fmt(d.ns(mode), 1), fmt(d.ns(u), 1), fmt(div(d.ns(mode), d.ns(u)), 2)])
    return table(["ops per group G", "group-G instr/op", "ungrouped (works-G) instr/op", "grouped/ungrouped",
                  "group-G ns/op", "works-G ns/op", "ratio (wall)"], rows)


def works(d):
    ws = sorted({int(m.split("-")[1]) for m in list(d.cg) + list(d.wall) if re.match(r"^works-\d+$", m)})
    return table(["outstanding works W", "instr/op", "ns/op median"],
                 [[str(w), fmt(d.instr(f"works-{w}")), fmt(d.ns(f"works-{w}"), 1)] for w in ws])


def threads(d):
    rows = []
    ts = sorted({int(m.split("-")[1]) for m in list(d.cg) + list(d.wall) if re.match(r"^(threads|waiters)-\d+$", m)})
    for t in ts:
        for fam, ref in (("threads", "coalesce"), ("waiters", "selfdrive")):
            m = f"{fam}-{t}"
            if m not in d.cg and m not in d.wall:
                continue
            rows.append([f"`{m}`", fmt(d.ns(m), 1), fmt(d.ns(m + ".self"), 1), fmt(d.ratio.get(m), 2),
                         fmt(d.instr(m)), f"{fmt(d.instr(ref))} (`{ref}`)", fmt(div(d.instr(m), d.instr(ref)), 2)])
    return table(["mode", "ns/op, loop on its thread", "ns/op, self-driven (same run)", "wall ratio",
                  "instr/op (all threads)", "instr/op self-driven", "instr ratio"], rows)


def memory(d):
    if not d.memory:
        return "(mode memory not run)\n"
    m = d.memory
    rows = []
    for key, label in (("rss", "RSS (KiB, /proc/self/statm)"), ("heap", "heap in use (KiB, mallinfo2)")):
        b, p, dn, i = m[key]
        rows.append([label, fmt(b), fmt(p), fmt(dn), fmt(i), fmt(div(i, b), 2)])
    return (f"Peak: {m['peak']:,} outstanding works; idle: {m['idle_ms']} ms with the loop on its own thread.\n\n" +
            table(["", "baseline", "at the peak", "all completed", "after idle", "after idle / baseline"], rows))


def goals(d):
    def ratio_row(goal, target, num, den, limit, how):
        v = div(num, den)
        met = "—" if v is None else ("met" if v <= limit else "not met")
        return [goal, target, f"{fmt(v, 2)}x ({how})", met]

    def abs_row(goal, target, v, limit):
        met = "—" if v is None else ("met" if v <= limit else "not met")
        return [goal, target, fmt(v), met]

    rows = [abs_row("pingpong", "<= 900 instr/op", d.instr("pingpong"), 900),
            abs_row("coalesced stream", "<= 400 instr/op", d.instr("coalesce"), 400),
            ratio_row("512 comms on one loop, round robin", "<= 1.25x one comm", d.instr("rr-512"),
                      d.instr("rr-1"), 1.25, f"rr-512 {fmt(d.instr('rr-512'))} / rr-1 {fmt(d.instr('rr-1'))}"),
            ratio_row("512 comms on one loop, one op each", "<= 1.25x one comm", d.instr("each-512"),
                      d.instr("each-1"), 1.25,
                      f"each-512 {fmt(d.instr('each-512'))} / each-1 {fmt(d.instr('each-1'))}"),
            ratio_row("R12, descending at cap 1,024", "<= 1.25x ascending", d.instr("r12-desc-1024"),
                      d.instr("r12-asc-1024"), 1.25,
                      f"{fmt(d.instr('r12-desc-1024'))} / {fmt(d.instr('r12-asc-1024'))}"),
            ratio_row("a one-op group", "<= 1.1x an ungrouped op", d.instr("group-1"), d.instr("works-1"), 1.1,
                      f"group-1 {fmt(d.instr('group-1'))} / works-1 {fmt(d.instr('works-1'))}")]
    if d.memory:
        for key, label in (("heap", "heap in use"), ("rss", "RSS")):
            b, _, _, i = d.memory[key]
            rows.append(ratio_row(f"memory after a peak of {d.memory['peak']:,} works, {label}",
                                  "< 2x baseline after the pools' idle bound", i, b, 2.0,
                                  f"{fmt(i)} KiB after {d.memory['idle_ms']} ms idle / {fmt(b)} KiB"))
    t = d.ratio.get("threads-1")
    if t is None:
        status = "—"
    elif d.cpus < 4:
        status = (f"not measurable on {d.cpus} CPUs (two threads and the system share them): "
                  "`engine_overhead --pin threads-1` on a host with a core per thread")
    else:
        status = "met" if t <= 1.2 else "not met"
    rows.append(["a foreign submitter thread (wall time)", "<= 1.2x driving the loop",
                 f"{fmt(t, 2)}x (threads-1 / threads-1.self, one run)" if t is not None else "—", status])
    return table(["goal (issue 22)", "target", "measured", "status"], rows, left=4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cg", required=True)
    ap.add_argument("--wall", action="append", default=[])
    ap.add_argument("--list", required=True)
    ap.add_argument("--csv", required=True)
    ap.add_argument("--comms-csv", required=True)
    ap.add_argument("--cpus", type=int, default=len(os.sched_getaffinity(0)))
    a = ap.parse_args()
    cg = read_cg(a.cg)
    wall, ratio, mem = read_wall(a.wall)
    what, order = {}, []
    with open(a.list) as f:
        for line in f:
            name, _, desc = line.rstrip("\n").partition("\t")
            what[name] = what[re.sub(r"-\d+$", "", name)] = desc
            order.append(name)
    for m in list(cg) + list(wall):  # modes run with parameters --list does not name
        if m not in order and not m.endswith(".self"):
            order.append(m)
            what.setdefault(m, what.get(re.sub(r"-\d+$", "", m), ""))
    d = Data(cg, wall, ratio, mem, what, a.cpus)
    with open(a.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mode", "ops", "instr_per_op", "ns_per_op_median", "ns_min", "ns_max"])
        for mode in order + sorted(m for m in wall if m.endswith(".self")):
            if mode in cg or mode in wall:
                ww = wall.get(mode)
                w.writerow([mode, cg[mode][0] if mode in cg else ww[3],
                            f"{cg[mode][1]:.1f}" if mode in cg else ""] +
                           ([f"{x:.1f}" for x in ww[:3]] if ww else ["", "", ""]))
    sections = [("Goals", goals(d)), ("Every mode", all_modes(d, order)),
                ("Cost against the number of comms on one loop", comms(d, a.comms_csv)),
                ("R12: buffer order within a launch", r12(d)), ("Explicit groups", groups(d)),
                ("Outstanding works", works(d)), ("Submitting threads", threads(d)),
                ("Memory around a peak", memory(d))]
    for title, body in sections:
        sys.stdout.write(f"### {title}\n\n{body}\n")


if __name__ == "__main__":
    main()
