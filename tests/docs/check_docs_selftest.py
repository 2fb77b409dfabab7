#!/usr/bin/env python3
"""check_docs.py fails on what it is meant to catch (CTest docs.links.self_test).

Builds small trees in a temporary directory: a clean one (no finding, exit
0), then the same tree with one planted finding of each kind (a dead link, a
dead anchor, a link out of the tree, an unknown rule id, a citation of the
outside design documents), which must be reported exactly, each as
`file:line: ...`, with exit 1. Once as a plain directory (the tarball case)
and, where git is installed, once as a git checkout, where a file git does
not track is not read.

usage: check_docs_selftest.py PATH/TO/check_docs.py
"""
import os
import shutil
import subprocess
import sys
import tempfile

# Written in pieces so that this file holds none of what it plants.
UNKNOWN_RULE = "R" + "99"
OUTSIDE_DIR = "shared" + "/design"
OUTSIDE_DOC = "NCCL-" + "RULES" + ".md"
OUTSIDE_REF = OUTSIDE_DIR + "/" + OUTSIDE_DOC

CLEAN = {
    "docs/nccl-rules.md": "# Rules\n\n## The seed chapter\n\ntext\n\n## R1 First `rule_one`\n\n## R2 Second: groups, again\n\n"
    "## Repeated\n\n## Repeated\n",
    "README.md": "See [rule 1](docs/nccl-rules.md#r1-first-rule_one), [R2](docs/nccl-rules.md#r2-second-groups-again),\n"
    "[the seed](docs/nccl-rules.md#the-seed-chapter), [again](docs/nccl-rules.md#repeated-1),\n"
    "[web](https://example.com/x.md#nothing), [self](#readme), [src](src/a.c#L3), [dir](docs/).\n\n"
    "```\n[not a link](missing.md)\n```\n\n`[code](missing.md)` and R1, R2: (R1-R2).\n\n## README\n",
    "src/a.c": "/* R1 and (R2) */\nint R2_WARN;\nint x;\n",
}

PLANTED = {
    "README.md": CLEAN["README.md"]
    + "\n[gone](docs/missing.md) and [bad anchor](docs/nccl-rules.md#r3-third)\n[up](../elsewhere.md)\n",
    "src/b.c": "int y;\n/* see %s */\n" % UNKNOWN_RULE,
    "notes.txt": "line one\nthe rules: %s\n" % OUTSIDE_REF,
}

EXPECTED = [
    "README.md:13: link docs/missing.md: docs/missing.md does not exist",
    "README.md:13: link docs/nccl-rules.md#r3-third: no heading of docs/nccl-rules.md has the anchor #r3-third",
    "README.md:14: link ../elsewhere.md points outside the repository",
    "notes.txt:2: cites %s and %s, not in the repository: cite docs/nccl-rules.md "
    "(or the repository document that holds the point)" % (OUTSIDE_DIR, OUTSIDE_DOC),
    "src/b.c:2: rule id %s has no section in docs/nccl-rules.md (its sections: R1, R2)" % UNKNOWN_RULE,
]


def write(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def run(checker, root):
    p = subprocess.run([sys.executable, checker, "--root", root], capture_output=True, text=True)
    return p.returncode, p.stdout.splitlines()


def expect(what, got_rc, got, want_rc, want):
    if got_rc != want_rc or got != want:
        print("FAIL %s: exit %d, want %d" % (what, got_rc, want_rc))
        print("  got:\n    " + "\n    ".join(got))
        print("  want:\n    " + "\n    ".join(want))
        return 1
    print("ok   %s: exit %d, %d finding(s)" % (what, got_rc, len(got)))
    return 0


def main(argv):
    if len(argv) != 2:
        print("usage: check_docs_selftest.py PATH/TO/check_docs.py", file=sys.stderr)
        return 2
    checker = os.path.abspath(argv[1])
    bad = 0
    tmp = tempfile.mkdtemp(prefix="ncfsm-docs-selftest-")
    try:
        clean = os.path.join(tmp, "clean")
        write(clean, CLEAN)
        rc, out = run(checker, clean)
        bad += expect("clean tree", rc, out, 0, [])

        planted = os.path.join(tmp, "planted")
        write(planted, CLEAN)
        write(planted, PLANTED)
        rc, out = run(checker, planted)
        bad += expect("planted findings (directory walk)", rc, out, 1, EXPECTED)

        # A build tree inside the checkout is not read.
        write(planted, {"build/CMakeCache.txt": "", "build/x.md": "[gone](nowhere.md) %s\n" % UNKNOWN_RULE})
        rc, out = run(checker, planted)
        bad += expect("build tree skipped", rc, out, 1, EXPECTED)

        if shutil.which("git"):
            env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
                       GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
            subprocess.run(["git", "init", "-q", planted], check=True, env=env)
            tracked = sorted(set(CLEAN) | set(PLANTED))
            subprocess.run(["git", "-C", planted, "add", "--"] + tracked, check=True, env=env)
            write(planted, {"untracked.c": "/* %s */\n" % UNKNOWN_RULE, "build/y.c": "/* %s */\n" % UNKNOWN_RULE})
            rc, out = run(checker, planted)
            bad += expect("planted findings (git ls-files; untracked files not read)", rc, out, 1, EXPECTED)
            write(planted, {"README.md": PLANTED["README.md"] + "[untracked](untracked.c)\n"})
            rc, out = run(checker, planted)
            bad += expect("link to an untracked file", rc, out, 1,
                          EXPECTED[:3] + ["README.md:15: link untracked.c: untracked.c is not tracked"] + EXPECTED[3:])
        else:
            print("note: git not found: the git ls-files path is not tested")
    finally:
        shutil.rmtree(tmp)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
