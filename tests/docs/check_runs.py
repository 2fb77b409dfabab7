#!/usr/bin/env python3
"""What a Markdown page shows is what the code is and what it prints.

usage: check_runs.py --root SRC [--build BIN] [--static] [--runs PAGE=ID,...]
                     [--examples DIR] [--run ID ...] [--update] FILE.md ...

Every fenced code block of FILE.md (paths relative to SRC) carries a marker,
an HTML comment on the line right before its opening fence:

  <!-- code: PATH [REGION] -->   the block is the lines of PATH between the
        marker lines `[REGION]` and `[/REGION]` (a comment of its own:
        `/* [REGION] */`, `// [REGION]` or `# [REGION]`), less the marker
        lines of other regions, each line without the indentation of the
        opening marker.
  <!-- run: ID [rc=N] [timeout=S] [by=FILE] -->   the block is a command:
        run it with `sh -c`, in SRC, every word that begins with `build/`
        pointing into BIN instead, stdin empty, the NCFSM_* variables of the
        caller removed (those the command sets stay); its exit status must
        be N (default 0). by=FILE: not run by this checker's own CTests but
        by FILE, which must hold `--run ID`.
  <!-- stdout: ID [vary="REGEX"]... [order=rank] -->
  <!-- stderr: ID ... -->   the block is what run ID wrote there. Each vary
        regex (Python, multiline) marks a part that differs from run to
        run: its matches, on both sides, are not compared. order=rank:
        lines from several processes: the run's lines are sorted by their
        `rank N:` prefix (stably: each rank's own order is kept) and the
        block shows them so.
  <!-- shown: WHY -->   a block that is neither (a command the reader types
        once, such as a build); WHY says why it is not run.
  <!-- begin FILE: a copy, refreshed by scripts/update-expected.sh -->
        the block is FILE (next to the page), a committed expected output
        (cmake/check-readme-copy.cmake's marker; --update leaves it to
        scripts/update-expected.sh).

Checks (each finding as `file:line: what is wrong`; exit 1 on any, 0 when
there is none, 2 on a usage error):
  --static    every block has a marker; every code block equals its region;
              every output block names a run of its page; every run without
              by= is in --runs (the IDs the CTests run) and every ID of
              --runs is a run of the pages; a run with by= is named there.
              With --examples DIR: every folder of DIR has its README.md
              among the pages, with a run and an output block.
  --run ID    run ID (of every page that has it) and compare its output
              blocks; needs --build; an ID no page has is a finding.
  --update    write the current region into every code block and, for the
              runs of --run, the output into every output block, instead of
              comparing (order=rank sorted); read the diff before committing.

Python 3 standard library only. CTests: tests/docs/CMakeLists.txt;
tests/docs/check_runs_selftest.py plants one finding of each kind.
"""
import argparse
import difflib
import os
import re
import subprocess
import sys

from check_docs import FENCE

MARKER = re.compile(r"^<!--\s*(code|run|stdout|stderr|shown):\s*(.*?)\s*-->\s*$")
# cmake/check-readme-copy.cmake's marker: the block is a copy of an expected-output file
COPY = re.compile(r"^<!-- begin (\S+): a copy, refreshed by scripts/update-expected\.sh -->$")
ATTR = re.compile(r'(\w+)=(?:"([^"]*)"|(\S+))')
REGION = re.compile(r"^(\s*)(?:/\*|//|#)\s*\[(/?)([A-Za-z0-9_.-]+)\]\s*(?:\*/)?\s*$")
BUILD_WORD = re.compile(r"(?<![\w/.$-])build/")
RANK_PREFIX = re.compile(r"^rank ([0-9]+):")
VARY_MARK = "\x00~\x00"


class Block:
    def __init__(self, path, line, kind, args, start, end, body):
        self.path, self.line, self.kind = path, line, kind
        self.start, self.end, self.body = start, end, body  # body lines: start..end-1 of the page
        words = ATTR.sub("", args).split()
        self.words = words
        self.attrs = {}
        self.vary = []
        for m in ATTR.finditer(args):
            value = m.group(2) if m.group(2) is not None else m.group(3)
            if m.group(1) == "vary":
                self.vary.append(value)
            else:
                self.attrs[m.group(1)] = value
        self.ident = words[0] if words else ""

    def where(self):
        return "%s:%d" % (self.path, self.line)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def parse_page(root, rel, findings):
    """Every fenced block of the page with its marker."""
    lines = read(os.path.join(root, rel)).split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, open_line = m.group(1), i
        j = i + 1
        while j < len(lines):
            c = FENCE.match(lines[j])
            if c and c.group(1)[0] == fence[0] and len(c.group(1)) >= len(fence) and not lines[j].strip()[len(c.group(1)):]:
                break
            j += 1
        marker = MARKER.match(lines[open_line - 1]) if open_line > 0 else None
        copy = COPY.match(lines[open_line - 1]) if open_line > 0 else None
        if copy:
            blocks.append(Block(rel, open_line + 1, "copy", copy.group(1), open_line + 1, j, lines[open_line + 1:j]))
        elif not marker:
            findings.append("%s:%d: a code block without a marker (<!-- code|run|stdout|stderr|shown: ... --> "
                            "on the line before it)" % (rel, open_line + 1))
        else:
            blocks.append(Block(rel, open_line + 1, marker.group(1), marker.group(2), open_line + 1, j,
                                lines[open_line + 1:j]))
        i = j + 1
    return lines, blocks


def region(root, spec, findings, where):
    """The lines of a code marker's region, or None (a finding is added)."""
    parts = spec.split()
    if len(parts) != 2:
        findings.append("%s: code marker wants `PATH REGION`, got %r" % (where, spec))
        return None
    path, name = parts
    full = os.path.join(root, path)
    if not os.path.isfile(full):
        findings.append("%s: %s does not exist" % (where, path))
        return None
    src = read(full).split("\n")
    start = end = None
    for n, line in enumerate(src):
        m = REGION.match(line)
        if m and m.group(3) == name:
            if m.group(2) == "" and start is None:
                start, indent = n, m.group(1)
            elif m.group(2) == "/" and start is not None:
                end = n
                break
    if start is None or end is None:
        findings.append("%s: %s has no region [%s] ... [/%s]" % (where, path, name, name))
        return None
    out = []
    for line in src[start + 1:end]:
        if REGION.match(line):
            continue
        if line.strip() and not line.startswith(indent):
            findings.append("%s: %s:%d is indented less than its region's marker [%s]" % (where, path, start + 1, name))
            return None
        out.append(line[len(indent):] if line.strip() else "")
    return out


def show_diff(shown, actual, label):
    return "".join(difflib.unified_diff([s + "\n" for s in shown], [a + "\n" for a in actual],
                                        "shown in " + label, "actual", n=2))


def masked(lines, vary):
    text = "\n".join(lines)
    for v in vary:
        text = re.sub(v, VARY_MARK, text, flags=re.M)
    return text


def run_command(root, build, block, env):
    cmd = "\n".join(block.body)
    cmd = BUILD_WORD.sub(os.path.join(os.path.abspath(build), ""), cmd)
    timeout = int(block.attrs.get("timeout", "300"))
    try:
        p = subprocess.run(["sh", "-c", cmd], cwd=root, env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode("utf-8", "replace"), (e.stderr or b"").decode("utf-8", "replace")
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def rank_sorted(lines):
    def key(item):
        m = RANK_PREFIX.match(item[1])
        return (int(m.group(1)) if m else 1 << 30, item[0])
    return [line for _, line in sorted(enumerate(lines), key=key)]


def check_page(args, rel, findings, edits):
    lines, blocks = parse_page(args.root, rel, findings)
    runs = {}
    for b in blocks:
        if b.kind == "run":
            if not b.ident:
                findings.append("%s: a run marker without an ID" % b.where())
            elif b.ident in runs:
                findings.append("%s: run %s is defined twice (also %s)" % (b.where(), b.ident, runs[b.ident].where()))
            else:
                runs[b.ident] = b
    for b in blocks:
        if b.kind == "code" and (args.static or args.update):
            want = region(args.root, " ".join(b.words), findings, b.where())
            if want is None:
                continue
            if args.update:
                edits.append((b, want))
            elif b.body != want:
                findings.append("%s: the block differs from %s:\n%s" % (b.where(), " ".join(b.words),
                                                                         show_diff(b.body, want, rel)))
        elif b.kind in ("stdout", "stderr"):
            if b.ident not in runs:
                findings.append("%s: %s of run %s, which this page does not define" % (b.where(), b.kind, b.ident))
            if b.attrs.get("order", "rank") != "rank":
                findings.append("%s: order=%s: only order=rank is known" % (b.where(), b.attrs["order"]))
            for v in b.vary:
                try:
                    re.compile(v)
                except re.error as e:
                    findings.append("%s: vary=%r is not a regular expression: %s" % (b.where(), v, e))
        elif b.kind == "copy" and args.static:
            src = os.path.join(os.path.dirname(rel), b.ident)
            full = os.path.join(args.root, src)
            if not os.path.isfile(full):
                findings.append("%s: the block is a copy of %s, which does not exist" % (b.where(), src))
            elif b.body != read(full).split("\n")[:-1]:
                findings.append("%s: the block differs from %s (scripts/update-expected.sh refreshes it):\n%s"
                                % (b.where(), src, show_diff(b.body, read(full).split("\n")[:-1], rel)))
        elif b.kind == "shown" and not b.ident:
            findings.append("%s: a shown marker must say why the block is not run" % b.where())
    if args.static:
        local = set(r for r, b in runs.items() if "by" not in b.attrs)
        for r, b in sorted(runs.items()):
            if "by" in b.attrs:
                by = os.path.join(args.root, b.attrs["by"])
                if not os.path.isfile(by) or ("--run " + r) not in read(by):
                    findings.append("%s: run %s is said to be run by %s, which does not hold `--run %s`"
                                    % (b.where(), r, b.attrs["by"], r))
            elif r not in args.local_runs:
                findings.append("%s: run %s has no CTest (add it to the runs of this page in "
                                "tests/docs/CMakeLists.txt)" % (b.where(), r))
        for r in sorted(args.runs_of.get(rel, set()) - local):
            findings.append("%s: CTest runs %s, which is not a run of this page" % (rel, r))
    for r in args.run:
        if r not in runs:
            continue
        args.runs_seen.add(r)
        b = runs[r]
        env = {k: v for k, v in os.environ.items() if not k.startswith("NCFSM_")}
        rc, out, err = run_command(args.root, args.build, b, env)
        want_rc = int(b.attrs.get("rc", "0"))
        write = args.update and rc == want_rc  # a failed run never becomes the page's output
        if rc != want_rc:
            findings.append("%s: run %s exited %s, not %d\n--- stdout\n%s--- stderr\n%s" % (
                b.where(), r, "by its timeout" if rc is None else rc, want_rc, out, err))
        streams = {"stdout": out.split("\n"), "stderr": err.split("\n")}
        for k in streams:
            if streams[k] and streams[k][-1] == "":
                streams[k].pop()
        for o in blocks:
            if o.kind not in streams or o.ident != r:
                continue
            actual = streams[o.kind]
            if o.attrs.get("order") == "rank":
                actual = rank_sorted(actual)
            if write:
                edits.append((o, actual))
            elif args.update:
                continue
            elif masked(o.body, o.vary) != masked(actual, o.vary):
                findings.append("%s: the %s of run %s differs from the block (parts matching vary= are not "
                                "compared):\n%s" % (o.where(), o.kind, r, show_diff(o.body, actual, rel)))
    return lines, blocks


def check_examples(args, pages, findings):
    """Every example folder has a README among the pages, with a command and its output."""
    top = os.path.join(args.root, args.examples)
    for d in sorted(os.listdir(top)):
        if not os.path.isdir(os.path.join(top, d)):
            continue
        rel = os.path.join(args.examples, d, "README.md")
        if rel not in pages:
            findings.append("%s: every example needs a README.md with its command and its output, checked "
                            "here (add the page to tests/docs/CMakeLists.txt)" % rel)
            continue
        kinds = set(b.kind for b in pages[rel])
        if "run" not in kinds or not kinds & {"stdout", "stderr", "copy"}:
            findings.append("%s: shows no command run with its output (a run block and a stdout or stderr "
                            "block)" % rel)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--build")
    ap.add_argument("--static", action="store_true")
    ap.add_argument("--runs", action="append", default=[], help="PAGE=ID,ID: the runs of PAGE that CTests run")
    ap.add_argument("--examples", help="a folder whose every subfolder must have a README.md among the pages, "
                    "with a run and its output")
    ap.add_argument("--run", action="append", default=[])
    ap.add_argument("--update", action="store_true")
    ap.add_argument("pages", nargs="+")
    args = ap.parse_args()
    if args.run and not args.build:
        ap.error("--run needs --build")
    args.runs_of = {}
    for part in args.runs:
        page, _, ids = part.partition("=")
        args.runs_of.setdefault(page, set()).update(filter(None, ids.split(",")))
    findings, pages = [], {}
    args.runs_seen = set()
    for rel in args.pages:
        if not os.path.isfile(os.path.join(args.root, rel)):
            findings.append("%s: no such page" % rel)
            continue
        args.local_runs = args.runs_of.get(rel, set())
        edits = []
        lines, pages[rel] = check_page(args, rel, findings, edits)
        if args.update and edits:
            for b, new in sorted(edits, key=lambda e: -e[0].start):
                lines[b.start:b.end] = new
            with open(os.path.join(args.root, rel), "w", encoding="utf-8") as f:
                f.write("\n".join(lines))
            print("%s: %d block(s) written" % (rel, len(edits)))
    if args.examples and args.static:
        check_examples(args, pages, findings)
    for r in args.run:
        if r not in args.runs_seen:
            findings.append("--run %s: no run of that ID on %s (renamed or removed?)" % (r, ", ".join(args.pages)))
    for f in findings:
        print(f)
    if findings:
        print("update the blocks with: tests/docs/check_runs.py --root . --build build --update "
              "[--run ID ...] PAGE.md", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
