#!/usr/bin/env python3
"""Plot of engine cost per op against the number of comms on one loop, from the
CSV bench/run_engine_scale.sh writes (n_comms, rr_instr_per_op,
each_instr_per_op, rr_ns_per_op, each_ns_per_op; where the CSV has them, also
pairs_instr_per_op and pairs_ns_per_op: N 2-rank verified cliques, n_comms
counting the cliques). Needs matplotlib.

  plot_engine_scale.py COMMS.csv OUT.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_engine_scale.py COMMS.csv OUT.png")
    with open(sys.argv[1]) as f:
        rows = list(csv.DictReader(f))
    n = [int(r["n_comms"]) for r in rows]
    fig, (ax_i, ax_t) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = [("rr", "round robin (pingpong across the comms)"), ("each", "one op on each, then run")]
    if rows and "pairs_instr_per_op" in rows[0]:
        series.append(("pairs", "N 2-rank cliques verified in memory, round robin"))
    for key, label in series:
        pts = [(x, float(r[f"{key}_instr_per_op"])) for x, r in zip(n, rows) if r[f"{key}_instr_per_op"]]
        if pts:
            ax_i.plot(*zip(*pts), marker="o", label=label)
            ax_i.axhline(pts[0][1] * 1.25, linestyle=":", linewidth=1, color=ax_i.lines[-1].get_color())
        pts = [(x, float(r[f"{key}_ns_per_op"])) for x, r in zip(n, rows) if r[f"{key}_ns_per_op"]]
        if pts:
            ax_t.plot(*zip(*pts), marker="o", label=label)
    for ax, what in ((ax_i, "instructions per op (callgrind)"), (ax_t, "ns per op (median, wall time)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("comms (pairs: cliques) on one loop")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    ax_i.set_title("dotted: issue 22's goal, 1.25x one comm", fontsize=9)
    ax_i.legend(fontsize=8)
    fig.suptitle("ncfsm engine cost per op, null backend")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
