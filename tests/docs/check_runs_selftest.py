#!/usr/bin/env python3
"""check_runs.py fails on what it is meant to catch (CTest docs.pages.self_test).

Builds a small tree in a temporary directory: a source with regions, a page
whose code blocks are those regions and whose output blocks are what its
commands print (a vary= part, an order=rank block, a shown block, a run
with by=, a copy of an expected-output file), and an examples folder. The clean tree passes --static and every
--run; then each planted drift (a code block that differs, a missing region,
a block without a marker, output that differs, a wrong exit status, a run
without a CTest and a CTest without a run, output of an unknown run, a by=
file that does not run it, a copy of an expected file that differs, an
example without a README) must be reported as
`page:line: ...`, with exit 1; --update then writes the blocks back and
the tree passes again.

usage: check_runs_selftest.py PATH/TO/check_runs.py
"""
import os
import shutil
import subprocess
import sys
import tempfile

from check_docs_selftest import write

SOURCE = """int main(void) {
  /* [body] */
  int x = 1;
  /* [inner] */
  x++;
  /* [/inner] */
  return x - 2;
  /* [/body] */
}
"""

F = "```"
PAGE = """# Page

<!-- code: src/p.c body -->
%(F)sc
int x = 1;
x++;
return x - 2;
%(F)s

<!-- run: hello -->
%(F)ssh
printf 'took 12 ms\\nok\\n'; echo warn >&2
%(F)s

<!-- stdout: hello vary="[0-9]+ ms" -->
%(F)s
took 3 ms
ok
%(F)s

<!-- stderr: hello -->
%(F)s
warn
%(F)s

<!-- run: two rc=3 -->
%(F)ssh
printf 'rank 1: b\\nrank 0: a\\nrank 1: c\\n'; exit 3
%(F)s

<!-- stdout: two order=rank -->
%(F)s
rank 0: a
rank 1: b
rank 1: c
%(F)s

<!-- run: far by=ci.sh -->
%(F)ssh
true
%(F)s

<!-- shown: typed once -->
%(F)ssh
make
%(F)s

<!-- begin exp.txt: a copy, refreshed by scripts/update-expected.sh -->
%(F)s
line 1
%(F)s
<!-- end exp.txt -->
""" % {"F": F}

EXAMPLE = """# ex

<!-- run: ex -->
%(F)ssh
echo hi
%(F)s

<!-- stdout: ex -->
%(F)s
hi
%(F)s
""" % {"F": F}

CLEAN = {"src/p.c": SOURCE, "page.md": PAGE, "ci.sh": "check_runs.py --run far page.md\n", "exp.txt": "line 1\n",
         "examples/one/README.md": EXAMPLE, "examples/one/one.c": "int y;\n"}


def drifted_page():
    p = PAGE.replace("x++;\nreturn", "x += 2;\nreturn", 1)             # code drift
    return p.replace("ok\n%s\n\n<!-- stderr" % F, "fine\n%s\n\n<!-- stderr" % F)  # stdout drift


def planted_page():
    p = drifted_page().replace("run: two rc=3", "run: two rc=4")        # wrong exit status
    p += "\n<!-- code: src/p.c nowhere -->\n%sc\nx\n%s\n" % (F, F)     # missing region
    p += "\n%s\nunmarked\n%s\n" % (F, F)                               # no marker
    p += "\n<!-- stdout: ghost -->\n%s\nboo\n%s\n" % (F, F)           # output of no run
    p += "\n<!-- run: lonely -->\n%ssh\ntrue\n%s\n" % (F, F)           # a run without a CTest
    return p


def line_of(text, needle):
    return text[:text.index(needle)].count("\n") + 1


def run(checker, root, *args):
    p = subprocess.run([sys.executable, checker, "--root", root] + list(args), capture_output=True, text=True)
    return p.returncode, p.stdout


def finish(name, failures):
    """Print the failures and the verdict; the exit status."""
    for f in failures:
        print("FAIL: " + f)
    print("%s self-test: %s" % (name, "FAIL" if failures else "PASS"))
    return 1 if failures else 0


def main():
    checker = os.path.abspath(sys.argv[1])
    failures = []
    tmp = tempfile.mkdtemp(prefix="check_runs_selftest.")
    try:
        write(tmp, CLEAN)
        static = ["--static", "--runs", "page.md=hello,two", "--runs", "examples/one/README.md=ex",
                  "--examples", "examples", "page.md", "examples/one/README.md"]
        runs = ["--build", tmp, "--run", "hello", "--run", "two", "page.md"]
        for args in (static, runs):
            rc, out = run(checker, tmp, *args)
            if rc != 0:
                failures.append("clean tree, %s: exit %d, not 0:\n%s" % (" ".join(args), rc, out))

        page = planted_page()
        write(tmp, {"page.md": page, "ci.sh": "nothing here\n", "exp.txt": "line one\n"})
        os.remove(os.path.join(tmp, "examples/one/README.md"))
        os.makedirs(os.path.join(tmp, "examples/two"))
        expected = [
            "page.md:%d: the block differs from src/p.c body" % line_of(page, "```c\nint x"),
            "page.md:%d: the stdout of run hello differs" % line_of(page, "```\ntook"),
            "page.md:%d: run two exited 3, not 4" % line_of(page, "```sh\nprintf 'rank"),
            "page.md:%d: src/p.c has no region [nowhere]" % line_of(page, "```c\nx\n"),
            "page.md:%d: a code block without a marker" % line_of(page, "```\nunmarked"),
            "page.md:%d: stdout of run ghost, which this page does not define" % line_of(page, "```\nboo"),
            "page.md:%d: run lonely has no CTest" % (page[:page.rindex("```sh\ntrue")].count("\n") + 1),
            "page.md:%d: run far is said to be run by ci.sh" % line_of(page, "```sh\ntrue"),
            "page.md:%d: the block differs from exp.txt" % line_of(page, "```\nline 1"),
            "page.md: CTest runs stale, which is not a run of this page",
            "examples/one/README.md: every example needs a README.md",
            "examples/two/README.md: every example needs a README.md",
            "--run gone: no run of that ID on page.md",
        ]
        rc, out = run(checker, tmp, "--static", "--runs", "page.md=hello,two,stale", "--examples", "examples",
                      "page.md", "--build", tmp, "--run", "hello", "--run", "two", "--run", "gone")
        if rc != 1:
            failures.append("planted tree: exit %d, not 1" % rc)
        for e in expected:
            if not any(line.startswith(e) for line in out.split("\n")):
                failures.append("planted tree: no finding starts with %r; got:\n%s" % (e, out))

        # --update writes the code and output blocks back
        write(tmp, {"page.md": drifted_page()})
        with open(os.path.join(tmp, "page.md")) as f:
            before = f.read()
        rc, out = run(checker, tmp, "--update", "--build", tmp, "--run", "hello", "--run", "two", "page.md")
        with open(os.path.join(tmp, "page.md")) as f:
            after = f.read()
        if "x++;\nreturn" not in after or "took 12 ms\nok\n" not in after or after == before:
            failures.append("--update did not write the code and output blocks back:\n%s" % after)
        rc, out = run(checker, tmp, "--build", tmp, "--run", "hello", "--run", "two", "page.md")
        if rc != 0:
            failures.append("after --update, the runs still differ (exit %d):\n%s" % (rc, out))
    finally:
        shutil.rmtree(tmp)
    return finish("check_runs", failures)


if __name__ == "__main__":
    sys.exit(main())
