#!/usr/bin/env python3
"""Every public function and type has an entry in docs/reference/.

usage: check_reference.py --root SRC

The public headers are include/ncfsm.h, include/ncfsm/*.h and
http/include/ncfsm/*.h. Their declarations (comments and preprocessor lines
left out) give the functions (every `ncfsm_*` declared with a parameter
list) and the types (every `ncfsm_*` name a typedef makes). An entry is a
heading `### \\`NAME\\`` of a page docs/reference/*.md; it ends at the next
heading of level 3 or less. Findings, one per line (`file:line: what is
wrong`); exit 1 when there is one, 0 when there is none:

  - a function or type without an entry, an entry for a name that is not
    declared (a stale entry), a name with two entries;
  - a type entry with a ```c block that is not the header's typedef, a
    function entry whose ```c block is not the header's declaration
    (white space and comments aside), or that lacks one of the items
    `- **Thread:**`, `- **Blocks:**`, `- **Errors:**`; and `- **States:**`
    for the calls that may change a communicator (a first parameter
    `ncfsm_comm *`, not const) and for those of MUST_STATES;
  - a page of docs/reference/ that docs/reference/README.md does not link.

Python 3 standard library only; CTests docs.reference and
docs.reference.self_test (tests/docs/CMakeLists.txt).
"""
import argparse
import glob
import os
import re
import sys

HEADERS = ["include/ncfsm.h", "include/ncfsm/*.h", "http/include/ncfsm/*.h"]
PAGES = "docs/reference"
# Calls whose entry must give the states before and after even where their
# first parameter does not say so (issue 23: how a program ends).
MUST_STATES = {"ncfsm_last_error", "ncfsm_loop_close", "ncfsm_loop_shutdown", "ncfsm_work_release",
               "ncfsm_work_wait"}
ITEMS = ("Thread", "Blocks", "Errors")
ENTRY = re.compile(r"^###\s+`(ncfsm_\w+)`\s*$")
HEADING = re.compile(r"^(#{1,3})\s")
FENCE = re.compile(r"^```")


def strip_c(text):
    """The header without comments, preprocessor lines and extern "C" braces."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    lines, cont = [], False
    for line in text.split("\n"):
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            lines.append("")
            continue
        lines.append(line)
    text = "\n".join(lines)
    return re.sub(r'extern\s+"C"\s*\{', " ", text)


def statements(text):
    """Top-level statements ending in ';' (brace contents kept, stray '}' dropped)."""
    out, cur, depth = [], [], 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            if depth == 0:
                continue
            depth -= 1
        cur.append(ch)
        if ch == ";" and depth == 0:
            out.append("".join(cur).strip())
            cur = []
    return out


def norm(s):
    s = re.sub(r"\s+", " ", s).strip()
    return re.sub(r"\s*([(),;*])\s*", r"\1", s)


def declarations(root):
    """{name: (kind, declaration text, header)} of every public function and type."""
    found = {}
    for pattern in HEADERS:
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8") as f:
                text = strip_c(f.read())
            for st in statements(text):
                flat = re.sub(r"\s+", " ", st)
                if flat.startswith("typedef"):
                    m = re.search(r"\(\s*\*\s*(ncfsm_\w+)\s*\)\s*\(", flat) or re.search(r"(ncfsm_\w+)\s*;$", flat)
                    if m:
                        found[m.group(1)] = ("type", flat, rel)
                    continue
                m = re.search(r"\b(ncfsm_\w+)\s*\(", flat)
                if m and "{" not in flat:
                    found[m.group(1)] = ("function", flat, rel)
    return found


def entries(root):
    """{name: [(page, line, body lines)]} of every entry of the reference."""
    out = {}
    for path in sorted(glob.glob(os.path.join(root, PAGES, "*.md"))):
        rel = os.path.relpath(path, root)
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        cur, fence = None, False
        for n, line in enumerate(lines, 1):
            if FENCE.match(line):
                fence = not fence
            if fence:
                if cur:
                    cur[2].append(line)
                continue
            m = ENTRY.match(line)
            if m:
                cur = (rel, n, [])
                out.setdefault(m.group(1), []).append(cur)
                continue
            if HEADING.match(line):
                cur = None
            elif cur:
                cur[2].append(line)
    return out


def c_blocks(body):
    blocks, cur = [], None
    for line in body:
        if cur is None and line.startswith("```c"):
            cur = []
        elif cur is not None and line.startswith("```"):
            blocks.append("\n".join(cur))
            cur = None
        elif cur is not None:
            cur.append(line)
    return blocks


def needs_states(name, decl):
    if name in MUST_STATES:
        return True
    m = re.search(r"\b" + name + r"\s*\(\s*([^,)]*)", decl)
    first = m.group(1) if m else ""
    return bool(re.match(r"ncfsm_comm\s*\*", first))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True)
    args = ap.parse_args()
    decls = declarations(args.root)
    ents = entries(args.root)
    findings = []
    if not decls:
        findings.append("%s: no public declaration found" % ", ".join(HEADERS))
    for name, (kind, decl, header) in sorted(decls.items()):
        if name not in ents:
            findings.append("%s: %s %s has no entry in %s/ (a heading ### `%s`)" % (header, kind, name, PAGES, name))
            continue
        page, line, body = ents[name][0]
        where = "%s:%d" % (page, line)
        if kind != "function":
            for b in c_blocks(body):
                if norm(b) != norm(decl):
                    findings.append("%s: %s: a ```c block that is not the header's typedef (%s):\n    %s"
                                    % (where, name, header, decl))
            continue
        blocks = [b for b in c_blocks(body) if norm(b) == norm(decl)]
        if not blocks:
            findings.append("%s: %s: no ```c block holds the declaration of %s:\n    %s" % (where, name, header, decl))
        want = ITEMS + (("States",) if needs_states(name, decl) else ())
        text = "\n".join(body)
        for item in want:
            if not re.search(r"^- \*\*%s:\*\*" % item, text, flags=re.M):
                findings.append("%s: %s: no item `- **%s:**`" % (where, name, item))
    for name, places in sorted(ents.items()):
        if name not in decls:
            for page, line, _ in places:
                findings.append("%s:%d: entry %s: no public header declares it (stale?)" % (page, line, name))
        for page, line, _ in places[1:]:
            findings.append("%s:%d: a second entry for %s (first: %s:%d)" % (page, line, name, places[0][0],
                                                                          places[0][1]))
    index = os.path.join(args.root, PAGES, "README.md")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            links = set(re.findall(r"\]\(([^)#]+)", f.read()))
        for path in sorted(glob.glob(os.path.join(args.root, PAGES, "*.md"))):
            base = os.path.basename(path)
            if base != "README.md" and base not in links:
                findings.append("%s/README.md: does not link %s" % (PAGES, base))
    else:
        findings.append("%s/README.md: missing (the reference's index)" % PAGES)
    for f in findings:
        print(f)
    nf = sum(1 for k in decls.values() if k[0] == "function")
    print("reference: %d functions and %d types declared, %d entries, %d finding(s)"
          % (nf, len(decls) - nf, len(ents), len(findings)), file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
