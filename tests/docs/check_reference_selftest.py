#!/usr/bin/env python3
"""check_reference.py fails on what it is meant to catch (CTest docs.reference.self_test).

Builds a small tree in a temporary directory: a header with a function on
a comm, a query, a type and a function-pointer type, and a reference whose
entries cover them (the clean tree: no finding, exit 0). Then each planted
fault must be reported, with exit 1: a function without an entry, an entry
for a name no header declares, a second entry, a declaration that differs
from the header's, a missing item, a call on a comm without its States
item, a type block that is not the typedef, and a page the index does not
link.

usage: check_reference_selftest.py PATH/TO/check_reference.py
"""
import os
import shutil
import sys
import tempfile

from check_docs_selftest import write
from check_runs_selftest import finish, run

HEADER = """/* a header */
#ifndef X_H
#define X_H
#ifdef __cplusplus
extern "C" {
#endif
typedef struct ncfsm_comm ncfsm_comm;
typedef void (*ncfsm_done_fn)(ncfsm_comm *c, void *arg);
/* Starts it. */
int ncfsm_comm_go(ncfsm_comm *comm,
                  int how);
int ncfsm_comm_ask(const ncfsm_comm *comm);
#ifdef __cplusplus
}
#endif
#endif
"""

F = "```"


def fn(name, decl, items):
    return "### `%s`\n\n%sc\n%s\n%s\n\nIt does.\n\n%s\n" % (name, F, decl, F, "".join("- **%s:** x.\n" % i for i in items))


GO = fn("ncfsm_comm_go", "int ncfsm_comm_go(ncfsm_comm *comm, int how);", ["Thread", "Blocks", "States", "Errors"])
ASK = fn("ncfsm_comm_ask", "int ncfsm_comm_ask(const ncfsm_comm *comm);", ["Thread", "Blocks", "Errors"])
TYPES = "### `ncfsm_comm`\n\nA comm.\n\n### `ncfsm_done_fn`\n\n%sc\ntypedef void (*ncfsm_done_fn)(ncfsm_comm *c, void *arg);\n%s\n" % (F, F)
CLEAN = {
    "include/ncfsm.h": HEADER,
    "docs/reference/README.md": "# Reference\n\n[a](a.md), [b](b.md)\n",
    "docs/reference/a.md": "# A\n\n" + GO + "\n" + TYPES,
    "docs/reference/b.md": "# B\n\n" + ASK,
}


def main():
    checker = os.path.abspath(sys.argv[1])
    failures = []
    tmp = tempfile.mkdtemp(prefix="check_reference_selftest.")
    try:
        write(tmp, CLEAN)
        rc, out = run(checker, tmp)
        if rc != 0:
            failures.append("clean tree: exit %d, not 0:\n%s" % (rc, out))
        planted = [
            ("a function without an entry", {"docs/reference/b.md": "# B\n"},
             "include/ncfsm.h: function ncfsm_comm_ask has no entry"),
            ("a stale entry", {"docs/reference/b.md": "# B\n\n" + ASK + "\n### `ncfsm_gone`\n\nOld.\n"},
             "docs/reference/b.md:16: entry ncfsm_gone: no public header declares it"),
            ("a second entry", {"docs/reference/b.md": "# B\n\n" + ASK + "\n" + GO},
             "docs/reference/b.md:16: a second entry for ncfsm_comm_go (first: docs/reference/a.md:3)"),
            ("a declaration that differs", {"docs/reference/b.md": "# B\n\n" + ASK.replace("const ", "")},
             "docs/reference/b.md:3: ncfsm_comm_ask: no ```c block holds the declaration"),
            ("a missing item", {"docs/reference/b.md": "# B\n\n" + ASK.replace("- **Blocks:** x.\n", "")},
             "docs/reference/b.md:3: ncfsm_comm_ask: no item `- **Blocks:**`"),
            ("no States on a comm call", {"docs/reference/a.md": "# A\n\n" + GO.replace("- **States:** x.\n", "") + "\n" + TYPES},
             "docs/reference/a.md:3: ncfsm_comm_go: no item `- **States:**`"),
            ("a type block that differs", {"docs/reference/a.md": "# A\n\n" + GO + "\n" + TYPES.replace("void *arg", "int arg")},
             "docs/reference/a.md:"),
            ("a page the index does not link", {"docs/reference/README.md": "# Reference\n\n[a](a.md)\n"},
             "docs/reference/README.md: does not link b.md"),
        ]
        for what, change, want in planted:
            write(tmp, CLEAN)
            write(tmp, change)
            rc, out = run(checker, tmp)
            if rc != 1 or not any(line.startswith(want) for line in out.split("\n")):
                failures.append("%s: exit %d, and no finding starts with %r; got:\n%s" % (what, rc, want, out))
    finally:
        shutil.rmtree(tmp)
    return finish("check_reference", failures)


if __name__ == "__main__":
    sys.exit(main())
