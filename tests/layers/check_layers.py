#!/usr/bin/env python3
"""The engine's layering, checked (docs/design.md "Layers").

    check_layers.py SRC_ROOT NM OBJECT...

Reads the layers from SRC_ROOT/fsm/CMakeLists.txt (a "# N: name" line starts
layer N; the files listed after it are in it) and fails on:
  - an fsm/ file (source or header) that includes an fsm/ header of a
    higher layer, or an fsm/ file that no layer lists;
  - an fsm/ object file that calls (an undefined symbol of its own) a
    function or uses a variable that an fsm/ object of a higher layer
    defines;
  - a core/ or bootstrap/ object that uses a symbol an fsm/ object defines
    (they are below the engine).
Every finding is printed as "file:line: what" (line 0 for a symbol); the
exit status is 1 when there is one. The objects are the library's
($<TARGET_OBJECTS:ncfsm_obj>); NM is the nm to read them with.
"""
import os
import re
import subprocess
import sys


def layers_of(root):
    path = os.path.join(root, "fsm", "CMakeLists.txt")
    layer, names, of = None, {}, {}
    with open(path) as f:
        for line in f:
            m = re.match(r"\s*#\s*(\d+):\s*(.*)", line)
            if m:
                layer = int(m.group(1))
                names[layer] = m.group(2).strip()
                continue
            m = re.search(r"\$\{CMAKE_CURRENT_SOURCE_DIR\}/([\w.-]+)", line)
            if m and layer is not None:
                of[m.group(1)] = layer
    return of, names


def includes(path):
    with open(path, errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = re.match(r'\s*#\s*include\s+"fsm/([\w.-]+)"', line)
            if m:
                yield n, m.group(1)


def symbols(nm, obj):
    """(defined, undefined) global symbols of one object file."""
    out = subprocess.run([nm, "-P", obj], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        sym, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(sym)
        elif kind.isupper() and kind not in "N":  # global definitions (T, D, B, R, C, ...)
            defined.add(sym)
    return defined, undefined


def source_of(obj):
    """fsm/x.c for .../fsm/x.c.o (CMake's object naming)."""
    m = re.search(r"(fsm|core|bootstrap|testkit)/(.+)\.c\.o(bj)?$", obj.replace(os.sep, "/"))
    return (m.group(1), m.group(2) + ".c") if m else (None, None)


def main(argv):
    if len(argv) < 4:
        print(__doc__)
        return 2
    root, nm, objs = argv[1], argv[2], argv[3:]
    of, names = layers_of(root)
    findings = []
    fsm_dir = os.path.join(root, "fsm")
    # includes
    for name in sorted(os.listdir(fsm_dir)):
        if not name.endswith((".c", ".h")):
            continue
        if name not in of:
            findings.append(f"fsm/{name}:0: in no layer of fsm/CMakeLists.txt (list it under its layer)")
            continue
        for n, inc in includes(os.path.join(fsm_dir, name)):
            if inc.endswith(".def"):
                continue  # the tables: data every layer may expand
            if inc not in of:
                findings.append(f"fsm/{name}:{n}: includes fsm/{inc}, which no layer lists")
            elif of[inc] > of[name]:
                findings.append(
                    f"fsm/{name}:{n}: layer {of[name]} ({names[of[name]]}) includes fsm/{inc} of layer "
                    f"{of[inc]} ({names[of[inc]]})")
    # calls
    fsm_defs, per_obj = {}, []
    for obj in objs:
        top, src = source_of(obj)
        if not top:
            continue
        d, u = symbols(nm, obj)
        per_obj.append((top, src, d, u))
        if top == "fsm":
            for sym in d:
                fsm_defs[sym] = src
    for top, src, d, u in per_obj:
        for sym in sorted(u):
            owner = fsm_defs.get(sym)
            if not owner:
                continue
            if top in ("core", "bootstrap"):
                findings.append(f"{top}/{src}:0: uses {sym} of fsm/{owner}: {top}/ is below the engine")
            elif top == "fsm" and src in of and owner in of and of[owner] > of[src]:
                findings.append(
                    f"fsm/{src}:0: layer {of[src]} ({names[of[src]]}) calls {sym} of fsm/{owner}, layer "
                    f"{of[owner]} ({names[of[owner]]}): reach it through a hook of the layer below")
    for f in findings:
        print(f)
    nfsm = sum(1 for t, *_ in per_obj if t == "fsm")
    print(f"layers: {len(of)} fsm/ files in {len(names)} layers; {nfsm} fsm/ objects and "
          f"{len(per_obj) - nfsm} core/bootstrap/testkit objects read; {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
