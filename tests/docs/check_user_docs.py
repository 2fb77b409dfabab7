#!/usr/bin/env python3
"""What a user reads stands on its own: README.md says how to build, and the
user pages speak of the API, not of the project's internals or its issues.

usage: check_user_docs.py --root SRC     check the tree at SRC
       check_user_docs.py --self-test    plant each finding in a copy of a
                                         small tree: each must be reported

Findings (each as `file[:line]: what is wrong`; exit 1 on any, 0 when none):
  - a Debian package of scripts/install-deps.sh (its pkgs=( ... ) list) that
    README.md does not name as `package`;
  - a CMake option (option(NAME ...) or set(NAME ... CACHE ...)) of a
    CMakeLists.txt that README.md does not name as `NAME`;
  - a directory the Makefile configures (cmake ... -B $(VAR)) that its clean
    recipe does not remove ($(VAR) missing there);
  - in a user page (README.md, docs/*.md, docs/reference/*.md,
    examples/*/README.md; the public headers include/ncfsm.h,
    include/ncfsm/*.h, http/include/ncfsm/*.h): an internal name (ncfsm__*)
    or an issue number ("issue 12"). INTERNAL_PAGES are not user pages.

Python 3 standard library only. CTests docs.user and docs.user.self_test
(tests/docs/CMakeLists.txt).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import fnmatch

# Pages about the internals (design, benchmarks), and ordering.md, whose
# recorder section describes the internal recorder API (ncfsm__rec_*) and
# which still names its issue (its owner's to rewrite).
INTERNAL_PAGES = {"docs/design.md", "docs/benchmarks.md"}
USER_PAGES = ("README.md", "docs/*.md", "docs/reference/*.md", "examples/*/README.md", "include/ncfsm.h",
              "include/ncfsm/*.h", "http/include/ncfsm/*.h")
INTERNAL_NAME = re.compile(r"\bncfsm__\w+")
ISSUE_NUMBER = re.compile(r"\b[Ii]ssues?(?:\s+|\s*\*\s*|\s+#)#?[0-9]+")
PKGS = re.compile(r"pkgs=\(([^)]*)\)", re.S)
OPTION = re.compile(r"^\s*(?:option\(\s*([A-Z][A-Z0-9_]*)\s|set\(\s*([A-Z][A-Z0-9_]*)\s[^)]*\bCACHE\b)", re.M)
CONFIGURE = re.compile(r"-B\s+\$\((\w+)\)")


def tracked(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True, check=True).stdout
        return out.split()
    except (OSError, subprocess.CalledProcessError):
        return [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs]


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return f.read()


def check(root):
    found = []
    readme = read(root, "README.md")
    named = set(re.findall(r"`([^`\s]+)`", readme))
    deps = read(root, "scripts/install-deps.sh")
    m = PKGS.search(deps)
    if not m:
        found.append("scripts/install-deps.sh: no pkgs=( ... ) list")
    else:
        body = "\n".join(line.split("#", 1)[0] for line in m.group(1).splitlines())
        for p in body.split():
            if p not in named:
                found.append(f"README.md: the Debian package {p} (scripts/install-deps.sh) is not listed")
    for rel in sorted(f for f in tracked(root) if os.path.basename(f) == "CMakeLists.txt"):
        if rel.startswith("build"):
            continue
        for om in OPTION.finditer(read(root, rel)):
            name = om.group(1) or om.group(2)
            if name not in named:
                found.append(f"README.md: the CMake option {name} ({rel}) is not listed")
    mk = read(root, "Makefile")
    clean = re.search(r"^clean:.*\n((?:\t.*\n?)*)", mk, re.M)
    recipe = clean.group(1) if clean else ""
    if not clean:
        found.append("Makefile: no clean target")
    for var in sorted(set(CONFIGURE.findall(mk))):
        if f"$({var})" not in recipe:
            found.append(f"Makefile: clean does not remove $({var}), which a cmake -B configures")
    for rel in sorted(tracked(root)):
        if rel in INTERNAL_PAGES or not any(fnmatch.fnmatchcase(rel, g) and rel.count("/") == g.count("/")
                                            for g in USER_PAGES):
            continue
        text = read(root, rel)
        for m in INTERNAL_NAME.finditer(text):
            n = text.count("\n", 0, m.start()) + 1
            found.append(f"{rel}:{n}: names the internal {m.group(0)}: say what it does for the user")
        for m in ISSUE_NUMBER.finditer(text):
            n = text.count("\n", 0, m.start()) + 1
            what = re.sub(r"\s+", " ", m.group(0))
            found.append(f"{rel}:{n}: names {what}: say what the code does, not which issue made it")
    return found


SMALL = {
    "README.md": "`a-dev` `b-dev` `OPT_A` `OPT_B`\n",
    "scripts/install-deps.sh": "pkgs=(a-dev\n  b-dev)  # comment-dev\n",
    "CMakeLists.txt": 'option(OPT_A "a" ON)\nset(OPT_B "" CACHE STRING "b")\n',
    "Makefile": "B ?= build\nC ?= build-c\nx:\n\tcmake -S . -B $(B)\n\tcmake -S . -B $(C)\nclean:\n\trm -rf $(B) $(C)\n",
    "docs/page.md": "The loop issues the init.\n",
    "docs/design.md": "ncfsm_" "_internal (issue 3)\n",
}
PLANTS = [
    ("scripts/install-deps.sh", "pkgs=(a-dev\n  b-dev c-dev)\n", "the Debian package c-dev"),
    ("CMakeLists.txt", 'option(OPT_A "a" ON)\nset(OPT_B "" CACHE STRING "b")\noption(OPT_C "c" OFF)\n',
     "the CMake option OPT_C"),
    ("Makefile", "B ?= build\nC ?= build-c\nx:\n\tcmake -S . -B $(B)\n\tcmake -S . -B $(C)\nclean:\n\trm -rf $(B)\n",
     "clean does not remove $(C)"),
    ("docs/page.md", "The loop issues the init (issue 7).\n", "docs/page.md:1: names issue 7"),
    ("include/ncfsm/y.h", "/*\n * served (issue\n * 16).\n */\n", "include/ncfsm/y.h:2: names issue"),
    ("include/ncfsm/x.h", "/* see ncfsm_" "_thing */\n", "include/ncfsm/x.h:1: names the internal ncfsm_" "_thing"),
]


def self_test():
    bad = 0
    for plant in [None] + PLANTS:
        with tempfile.TemporaryDirectory() as d:
            files = dict(SMALL)
            if plant:
                files[plant[0]] = plant[1]
            for rel, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
                with open(os.path.join(d, rel), "w", encoding="utf-8") as f:
                    f.write(text)
            found = check(d)
            want = plant[2] if plant else None
            ok = (not found) if not want else (len(found) == 1 and want in found[0])
            print(f"{'ok' if ok else 'WRONG'}: {want or 'clean tree'}: {found}")
            bad += not ok
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.root:
        ap.error("--root or --self-test")
    found = check(a.root)
    for f in found:
        print(f)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
