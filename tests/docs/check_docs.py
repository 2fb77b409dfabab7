#!/usr/bin/env python3
"""The repository stands alone: every relative link resolves, every rule id
has a section, no file sends the reader outside the repository.

usage: check_docs.py [--root DIR]

Files: `git ls-files` of DIR when DIR is the top of a git checkout, else
every file under DIR (a tarball), skipping hidden directories and build
trees (a directory with a CMakeCache.txt). Findings, one per line, as
`file:line: what is wrong`; exit 1 when there is one, 0 when there is none,
2 on a usage error. Checks:

  links    in every *.md: a relative link (inline, reference definition, or
           an HTML href/src) whose file does not exist in the set above, or
           whose #anchor is not a heading of the target (GitHub's rules:
           lower case, punctuation but '-' and '_' dropped, each space a '-',
           a repeated heading gets -1, -2, ...; an HTML id or name counts
           too); an anchor into a file that is not Markdown must be a line
           anchor (#L12, #L12-L20). Code blocks and code spans are skipped.
  rules    in every *.c, *.h, *.def, *.md, *.sh, *.py, *.txt: a rule id
           (R followed by digits, as a word: "(R4)", "R7:", "R1, R2",
           "R1-R13") with no section "## R<n> ..." in docs/nccl-rules.md.
  outside  in every text file: a citation of the design documents that live
           outside the repository (the names in OUTSIDE below); the bare name
           of the rules document is allowed only under docs/results/, whose
           measured output keeps the words it was printed with.

Python 3 standard library only (tests/docs/CMakeLists.txt runs it as the
CTest docs.links; tests/docs/check_docs_selftest.py plants one finding of
each kind and checks that each is reported).
"""
import os
import re
import subprocess
import sys
import urllib.parse

RULES_DOC = "docs/nccl-rules.md"
RULE_EXTS = (".c", ".h", ".def", ".md", ".sh", ".py", ".txt")
# Names of documents that are not in the repository, written so that this
# file does not cite them itself.
OUTSIDE = [
    re.compile(re.escape(s))
    for s in ("shared" + "/design", "NCCL-RULES" + ".md", "ARCHITECTURE" + ".md", ".." + "/shared", "/work" + "/shared")
]
# The rules document's old name without its extension ("... as NCCL-RULES says").
OUTSIDE_BARE = re.compile(r"\bNCCL-RULES\b(?!\.md)")
MEASURED_DIR = "docs/results/"

RULE_ID = re.compile(r"(?<![A-Za-z0-9_])R([0-9]+)(?![A-Za-z0-9_])")
RULE_SECTION = re.compile(r"^## R([0-9]+)\b")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")
LINE_ANCHOR = re.compile(r"^L[0-9]+(-L[0-9]+)?$")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
INLINE_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)")
HTML_LINK = re.compile(r"<(?:a|img|source)\b[^>]*?\s(?:href|src)\s*=\s*[\"']([^\"']*)[\"']", re.I)
HTML_ID = re.compile(r"<[A-Za-z][^>]*?\s(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)


def tracked_files(root):
    """Relative paths of the files to check, sorted."""
    try:
        top = subprocess.run(["git", "-C", root, "rev-parse", "--show-toplevel"], capture_output=True, text=True)
        if top.returncode == 0 and os.path.realpath(top.stdout.strip()) == os.path.realpath(root):
            out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True).stdout
            names = [n.decode("utf-8", "surrogateescape") for n in out.split(b"\0") if n]
            return sorted(n for n in names if os.path.isfile(os.path.join(root, n)))
    except (OSError, subprocess.CalledProcessError):
        pass
    found = []
    for d, subdirs, files in os.walk(root):
        if d != root and "CMakeCache.txt" in files:
            subdirs[:] = []
            continue
        subdirs[:] = sorted(s for s in subdirs if not s.startswith("."))
        rel = os.path.relpath(d, root)
        found.extend(os.path.normpath(os.path.join(rel, f)) for f in files)
    return sorted(found)


def read_text(path):
    """The file's lines, or None for a binary file."""
    with open(path, "rb") as f:
        data = f.read()
    if b"\0" in data:
        return None
    return data.decode("utf-8", "replace").splitlines()


def blank_code_spans(line):
    """The line with the contents of its code spans replaced by spaces (columns kept)."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "`":
            j = i
            while j < len(line) and line[j] == "`":
                j += 1
            ticks = line[i:j]
            end = line.find(ticks, j)
            while end != -1 and end + len(ticks) < len(line) and line[end + len(ticks)] == "`":
                end = line.find(ticks, end + len(ticks) + 1)
            if end == -1:
                out.append(line[i:j])
                i = j
                continue
            out.append(" " * (end + len(ticks) - i))
            i = end + len(ticks)
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def markdown_lines(lines):
    """(line number, text with code spans blanked, text) of every line outside fenced code blocks."""
    fence = None
    for n, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if m:
            fence = m.group(1)
            continue
        yield n, blank_code_spans(line), line


def heading_text(raw):
    """What GitHub renders of a heading's inline Markdown, as plain text."""
    parts = re.split(r"(`+)(.*?)\1", raw)
    text = []
    for i, p in enumerate(parts):
        k = i % 3
        if k == 1:
            continue
        if k == 2:
            text.append(p)  # a code span: verbatim
            continue
        p = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", p)
        p = re.sub(r"!?\[([^\]]*)\]\[[^\]]*\]", r"\1", p)
        p = re.sub(r"<[^>]+>", "", p)
        p = re.sub(r"(?<![A-Za-z0-9])_{1,2}(?=\S)(.+?)(?<=\S)_{1,2}(?![A-Za-z0-9])", r"\1", p)
        text.append(p)
    return "".join(text)


def slug(text):
    s = text.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors_of(lines):
    """Every anchor a Markdown file defines: its headings' slugs and its HTML ids."""
    seen, anchors = {}, set()
    prev = None
    for n, line, raw in markdown_lines(lines):
        for m in HTML_ID.finditer(line):
            anchors.add(m.group(1))
        title = None
        m = ATX.match(raw)
        if m:
            title = m.group(2) or ""
        elif prev and prev.strip() and SETEXT.match(raw) and not ATX.match(prev) and "|" not in prev:
            title = prev.strip()
        prev = raw if not m else None
        if title is None:
            continue
        base = slug(heading_text(title))
        k = seen.get(base, 0)
        seen[base] = k + 1
        anchors.add(base if k == 0 else "%s-%d" % (base, k))
    return anchors


def links_of(lines):
    """(line number, target) of every link in a Markdown file."""
    for n, line, _ in markdown_lines(lines):
        m = REF_DEF.match(line)
        if m:
            yield n, m.group(2)
            continue
        for m in INLINE_LINK.finditer(line):
            yield n, m.group(2)
        for m in HTML_LINK.finditer(line):
            yield n, m.group(1)


class Checker:
    def __init__(self, root):
        self.root = root
        self.files = tracked_files(root)
        self.fileset = set(self.files)
        self.dirs = set()
        for f in self.files:
            d = os.path.dirname(f)
            while d:
                self.dirs.add(d)
                d = os.path.dirname(d)
        self.findings = []
        self.text = {}
        self.anchor_cache = {}

    def lines(self, rel):
        if rel not in self.text:
            self.text[rel] = read_text(os.path.join(self.root, rel))
        return self.text[rel]

    def find(self, rel, n, what):
        self.findings.append((rel, n, what))

    def anchors(self, rel):
        if rel not in self.anchor_cache:
            self.anchor_cache[rel] = anchors_of(self.lines(rel) or [])
        return self.anchor_cache[rel]

    def check_link(self, rel, n, target):
        if target.startswith("<") and target.endswith(">"):
            target = target[1:-1]
        if not target or SCHEME.match(target):
            return
        path, _, anchor = target.partition("#")
        path = urllib.parse.unquote(path.split("?", 1)[0])
        anchor = urllib.parse.unquote(anchor)
        if path:
            base = "" if path.startswith("/") else os.path.dirname(rel)
            dest = os.path.normpath(os.path.join(base, path.lstrip("/")))
            if dest == ".." or dest.startswith("../") or os.path.isabs(dest):
                self.find(rel, n, "link %s points outside the repository" % target)
                return
            if dest == ".":
                dest = ""
            if dest not in self.fileset and dest not in self.dirs and dest != "":
                why = "is not tracked" if os.path.exists(os.path.join(self.root, dest)) else "does not exist"
                self.find(rel, n, "link %s: %s %s" % (target, dest, why))
                return
        else:
            dest = rel
        if not anchor:
            return
        if dest.endswith(".md") and dest in self.fileset:
            if anchor not in self.anchors(dest):
                self.find(rel, n, "link %s: no heading of %s has the anchor #%s" % (target, dest, anchor))
        elif not LINE_ANCHOR.match(anchor):
            self.find(rel, n, "link %s: #%s is not a line anchor (#L<n>) and %s is not Markdown" % (target, anchor, dest or "."))

    def rule_sections(self):
        lines = self.lines(RULES_DOC) if RULES_DOC in self.fileset else None
        if lines is None:
            self.find(RULES_DOC, 0, "missing: every rule id (R<n>) needs a section there")
            return set()
        ids = {}
        for n, _, line in markdown_lines(lines):
            m = RULE_SECTION.match(line)
            if m:
                if m.group(1) in ids:
                    self.find(RULES_DOC, n, "a second section for R%s (the first is on line %d)" % (m.group(1), ids[m.group(1)]))
                ids.setdefault(m.group(1), n)
        return set(ids)

    def run(self):
        sections = self.rule_sections()
        known = ", ".join("R" + s for s in sorted(sections, key=int)) or "none"
        for rel in self.files:
            lines = self.lines(rel)
            if lines is None:
                continue
            if rel.endswith(".md"):
                for n, target in links_of(lines):
                    self.check_link(rel, n, target)
            if rel.endswith(RULE_EXTS):
                for n, line in enumerate(lines, 1):
                    for m in RULE_ID.finditer(line):
                        if m.group(1) not in sections:
                            self.find(rel, n, "rule id R%s has no section in %s (its sections: %s)" % (m.group(1), RULES_DOC, known))
            if rel == "tests/docs/check_docs.py":
                continue
            for n, line in enumerate(lines, 1):
                names = [pat.pattern.replace("\\", "") for pat in OUTSIDE if pat.search(line)]
                if not rel.startswith(MEASURED_DIR) and OUTSIDE_BARE.search(line):
                    names.append("NCCL-RULES")
                if names:
                    self.find(rel, n, "cites %s, not in the repository: cite %s (or the repository document that holds the point)" % (" and ".join(names), RULES_DOC))
        return self.findings


def main(argv):
    root = "."
    args = argv[1:]
    while args:
        a = args.pop(0)
        if a == "--root" and args:
            root = args.pop(0)
        else:
            print("usage: check_docs.py [--root DIR]", file=sys.stderr)
            return 2
    if not os.path.isdir(root):
        print("check_docs.py: %s is not a directory" % root, file=sys.stderr)
        return 2
    findings = Checker(root).run()
    for rel, n, what in sorted(set(findings)):
        print("%s:%d: %s" % (rel, n, what))
    if findings:
        print("check_docs.py: %d finding(s) in %s" % (len(set(findings)), os.path.abspath(root)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
