#!/usr/bin/env python3
"""Figure of bench/allreduce_latency's size sweep (issue 11): back-to-back
busbw and ops/s, and the one-at-a-time round trip, against the message size,
one line per variant, one line style per run (NCCL version).

    python3 scripts/plot_sweep.py OUT.png LABEL=RUN [LABEL=RUN ...]
    python3 scripts/plot_sweep.py --check RUN [RUN ...]

A RUN is what `allreduce_latency --sweep-csv PATH` writes (rank 0), or the
program's printed output (its "KV sweep.*" lines and its header give the
same numbers). --check only reads and validates them (no matplotlib
needed): every variant at every size, every number positive and finite;
exit 1 otherwise. Plotting needs matplotlib (the GPU machine has it).
"""
import csv
import math
import re
import sys

B2B = ["raw_block", "raw_block_g64", "raw_nb", "ncfsm", "ncfsm_push", "ncfsm_auto"]
ONE = ["raw_block_sync", "raw_nb_yield", "ncfsm", "ncfsm_push", "ncfsm_auto"]
KV = re.compile(r"^KV sweep\.(b2b|one)\.([a-z0-9_]+)\.(\d+)\.(ops_per_s|median_us) (\S+)$")
RANKS = re.compile(r"^# allreduce_latency: (\d+) ranks")
FIELDS = ["mode", "variant", "bytes", "ops_per_s", "busbw_GBps", "median_us", "nranks"]


class BadSweep(Exception):
    pass


def rows_from_output(path):
    """The program's printed output as CSV rows (busbw: bytes x ops/s x 2(n-1)/n, 1 on one rank)."""
    nranks, kv = None, {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = RANKS.match(line)
            if m:
                nranks = int(m.group(1))
            m = KV.match(line.strip())
            if m:
                kv[(m.group(1), m.group(2), int(m.group(3)))] = float(m.group(5))
    if nranks is None:
        raise BadSweep(f"{path}: no '# allreduce_latency: N ranks' header")
    factor = 2.0 * (nranks - 1) / nranks if nranks > 1 else 1.0
    rows = []
    for (mode, name, size), v in sorted(kv.items()):
        if mode == "b2b":
            rows.append({"mode": mode, "variant": name, "bytes": str(size), "ops_per_s": str(v),
                         "busbw_GBps": str(v * size * factor / 1e9), "median_us": "", "nranks": str(nranks)})
        else:
            us = v
            rows.append({"mode": mode, "variant": name, "bytes": str(size), "ops_per_s": str(1e6 / us if us else 0),
                         "busbw_GBps": str(size / us / 1e3 * factor if us else 0), "median_us": str(us),
                         "nranks": str(nranks)})
    return rows


def load(path):
    """A CSV or the program's output, checked (see check)."""
    with open(path, encoding="utf-8", newline="") as f:
        is_csv = f.readline().startswith("mode,")
    if not is_csv:
        return check(path, rows_from_output(path), 2)
    with open(path, encoding="utf-8", newline="") as f:
        rd = csv.DictReader(f)
        if rd.fieldnames != FIELDS:
            raise BadSweep(f"{path}: header {rd.fieldnames}, expected {FIELDS}")
        return check(path, list(rd), 2)


def check(path, rows, first_line):
    """Validated {(mode, variant): {bytes: row}} and the rank count."""
    data, nranks = {}, None
    for i, r in enumerate(rows, start=first_line):
        try:
            size = int(r["bytes"])
            row = {"ops": float(r["ops_per_s"]), "busbw": float(r["busbw_GBps"]),
                   "us": float(r["median_us"]) if r["median_us"] else None}
            n = int(r["nranks"])
        except (TypeError, ValueError) as e:
            raise BadSweep(f"{path}:{i}: {e}") from e
        vals = [row["ops"], row["busbw"]] + ([row["us"]] if row["us"] is not None else [])
        if size <= 0 or any(not math.isfinite(v) or v <= 0 for v in vals):
            raise BadSweep(f"{path}:{i}: a size or value is not positive and finite: {dict(r)}")
        if r["mode"] not in ("b2b", "one"):
            raise BadSweep(f"{path}:{i}: mode {r['mode']!r}")
        if r["mode"] == "one" and row["us"] is None:
            raise BadSweep(f"{path}:{i}: a one-at-a-time row without median_us")
        if nranks is not None and n != nranks:
            raise BadSweep(f"{path}:{i}: nranks {n} after {nranks}")
        nranks = n
        data.setdefault((r["mode"], r["variant"]), {})[size] = row
    sizes = set()
    for v in data.values():
        sizes |= set(v)
    for mode, names in (("b2b", B2B), ("one", ONE)):
        for name in names:
            have = set(data.get((mode, name), {}))
            if have != sizes:
                raise BadSweep(f"{path}: {mode} {name} lacks sizes {sorted(sizes - have)}")
    if not sizes:
        raise BadSweep(f"{path}: no rows")
    return data, nranks


def human(n):
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):g} {unit}"
    return f"{n} B"


def plot(out, runs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = ["-", "--", ":", "-."]
    colors = {"raw_block": "tab:gray", "raw_block_g64": "black", "raw_nb": "tab:orange", "ncfsm": "tab:blue",
              "ncfsm_push": "tab:green", "ncfsm_auto": "tab:purple", "raw_block_sync": "tab:gray", "raw_nb_yield": "tab:orange"}
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.5))
    one_rank = all(n == 1 for _, (_, n) in runs)
    panels = [("b2b", B2B, "busbw", "back to back: " + ("algbw" if one_rank else "busbw") + " (GB/s)"),
              ("b2b", B2B, "ops", "back to back: ops/s"),
              ("one", ONE, "us", "one at a time: round trip (us)")]
    nranks = set()
    for ax, (mode, names, key, title) in zip(axes, panels):
        for k, (label, (data, n)) in enumerate(runs):
            nranks.add(n)
            for name in names:
                pts = sorted(data[(mode, name)].items())
                ax.plot([p[0] for p in pts], [p[1][key] for p in pts], styles[k % len(styles)], marker=".",
                        color=colors.get(name), label=f"{name} ({label})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("message size (bytes, float32 AllReduce)")
        ax.grid(True, which="both", alpha=0.3)
        ticks = sorted({s for _, (d, _) in runs for s in d[(mode, names[0])]})
        ax.set_xticks(ticks[::2])
        ax.set_xticklabels([human(t) for t in ticks[::2]], rotation=45, ha="right", fontsize=8)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"ncfsm size sweep, {'/'.join(str(n) for n in sorted(nranks))} rank(s), rank 0 medians "
                 "(bench/allreduce_latency)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv):
    if len(argv) >= 3 and argv[1] == "--check":
        for path in argv[2:]:
            data, n = load(path)
            print(f"{path}: ok, {n} rank(s), {len(data[('b2b', 'ncfsm')])} sizes")
        return 0
    if len(argv) < 3 or any("=" not in a for a in argv[2:]):
        print(__doc__, file=sys.stderr)
        return 2
    runs = []
    for a in argv[2:]:
        label, path = a.split("=", 1)
        runs.append((label, load(path)))
    plot(argv[1], runs)
    print(f"wrote {argv[1]}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except BadSweep as e:
        print(f"plot_sweep: {e}", file=sys.stderr)
        sys.exit(1)
