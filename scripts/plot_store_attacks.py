#!/usr/bin/env python3
"""Figure of the tcp store under the attacks of issue 12, from
docs/results/store-attacks.txt (tests/bootstrap/test_store_attacks.c at the
issue's scale): the store's peak RSS and the correct job's worst allgather,
before and after the hardening, one pair of bars per attack.

    python3 scripts/plot_store_attacks.py docs/results/store-attacks.txt OUT.png

Needs matplotlib (the GPU machine has it; this repository's build machine
does not).
"""
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROW = re.compile(r"^(\S+)\s+\| idle\s+([\d.]+) MB \| peak\s+([\d.]+) MB \| job rounds\s+(\d+) p50\s+([\d.]+) ms max\s+([\d.]+) ms")


def parse(path):
    data, side = {"after": {}, "before": {}}, None
    for line in open(path, encoding="utf-8"):
        if line.startswith("== after"):
            side = "after"
        elif line.startswith("== before"):
            side = "before"
        m = ROW.match(line)
        if m and side:
            name, _idle, peak, rounds, _p50, mx = m.groups()
            data[side][name] = (float(peak), float(mx), int(rounds))
    return data


def main():
    src, out = sys.argv[1], sys.argv[2]
    d = parse(src)
    names = [n for n in d["after"] if n in d["before"]]
    if not names:
        sys.exit("no attack rows found in " + src)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    x = range(len(names))
    w = 0.38
    for ax, idx, title, unit in ((axes[0], 0, "store peak RSS", "MB"),
                                 (axes[1], 1, "correct job's worst allgather during the attack", "ms")):
        before = [d["before"][n][idx] for n in names]
        after = [d["after"][n][idx] for n in names]
        ax.bar([i - w / 2 for i in x], before, w, label="before (04a3d87)", color="#c0504d")
        ax.bar([i + w / 2 for i in x], after, w, label="after (issue 12)", color="#4f81bd")
        ax.set_xticks(list(x))
        ax.set_xticklabels(names, rotation=30, ha="right")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylabel(unit + " (symlog)")
        ax.set_title(title)
        for i, (b, a) in enumerate(zip(before, after)):
            ax.text(i - w / 2, b, "%g" % b, ha="center", va="bottom", fontsize=7)
            ax.text(i + w / 2, a, "%g" % a, ha="center", va="bottom", fontsize=7)
        ax.legend(fontsize=8)
    fig.suptitle("ncfsm-store under the attacks of issue 12 (loopback, default limits; "
                 "rank-killed/closed/impostor: no job rounds run)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print("wrote", out)


if __name__ == "__main__":
    main()
