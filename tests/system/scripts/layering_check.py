#!/usr/bin/env python3
"""The folder rules of docs/architecture.md ("Rules the folders keep"), checked on the include
graph of include/cairn/: for each rule, no header of a folder reaches (directly or through other
cairn headers, -inl.hpp bodies included) a header the rule forbids.

Usage: layering_check.py SOURCE_DIR

Before checking SOURCE_DIR it checks itself on two altered copies of include/cairn/ (a
forbidden include added to plan/box.hpp; the pending include removed): both must fail, so the
check cannot pass by finding nothing.

A known breach that is being worked off is listed in PENDING with the issue that removes it; the
check fails on any other breach, and on a PENDING entry that no longer breaches (so the list
only shrinks). Standard library only (Debian's python3).
"""
import os
import re
import sys

# (folder or file the rule is about, forbidden prefixes, why)
RULES = [
    ("plan/", ["format/", "comm/", "storage/", "options.hpp", "pipeline/", "convert/", "manager/",
               "async/", "tree/"],
     "planning is pure: boxes, descriptions and indices, no I/O, no collectives, no options"),
    ("format/", ["pipeline/", "convert/", "manager/", "async/", "save.hpp", "load.hpp"],
     "formats sit below the save and load pipelines and the converter"),
    ("core/", ["plan/", "format/", "comm/", "storage/", "pipeline/", "convert/", "manager/",
               "async/", "tree/", "options.hpp", "cuda/"],
     "core values depend on nothing above them"),
    ("storage/", ["plan/", "format/", "comm/", "pipeline/", "convert/", "manager/", "async/",
                  "tree/"],
     "storage backends know bytes and names only"),
    ("comm/", ["plan/", "format/", "storage/", "pipeline/", "convert/", "manager/", "async/"],
     "communicators know bytes and ranks only"),
    ("cuda/", ["tree/"], "staging knows memory, not state trees"),
    ("load.hpp", ["save.hpp", "pipeline/save.hpp", "plan/save_plan.hpp", "format/writers.hpp"],
     "a load compiles without the save side"),
]

# (header, without ".hpp" or "-inl.hpp"; prefix of what it includes): include edges that breach a
# rule and are being worked off, with the issue that removes them. They are left out of the graph.
PENDING = {}

INCLUDE = re.compile(r'^\s*#\s*include\s+"cairn/([^"]+)"', re.M)


def check(root):
    """The failures of the rules on the headers under `root` (include/cairn), as lines."""
    headers = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".hpp"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                with open(path, encoding="utf-8") as fh:
                    headers[rel] = INCLUDE.findall(fh.read())
    used_pending = set()
    for h, deps in headers.items():
        stem = h[: -len("-inl.hpp")] if h.endswith("-inl.hpp") else h[: -len(".hpp")]
        kept = []
        for d in deps:
            edge = [p for p in PENDING if p[0] == stem and d.startswith(p[1])]
            used_pending.update(edge)
            if not edge:
                kept.append(d)
        headers[h] = kept
    reach = {}

    def reachable(h, stack=()):
        if h in reach:
            return reach[h]
        out = set()
        for d in headers.get(h, []):
            if d in stack:
                continue
            out.add(d)
            out |= reachable(d, stack + (h,))
        reach[h] = out
        return out

    failures = []
    for rule, forbidden, why in RULES:
        for h in sorted(headers):
            if not (h.startswith(rule) if rule.endswith("/") else h == rule):
                continue
            for d in sorted(reachable(h)):
                for f in forbidden:
                    if d == f or (f.endswith("/") and d.startswith(f)):
                        failures.append(f"{h} reaches {d} ({rule} must not reach {f}: {why})")
    for p, issue in PENDING.items():
        if p not in used_pending:
            failures.append(f"PENDING entry {p} ({issue}) is no longer an include: remove it")
    return failures, len(headers)


def self_test(root):
    """Whether the check fails on two broken copies of `root`; prints what it finds."""
    import shutil
    import tempfile
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name, alter in (("a forbidden include", "add"), ("a pending include gone", "drop")):
            copy = os.path.join(tmp, alter)
            shutil.copytree(root, copy)
            if alter == "add":
                with open(os.path.join(copy, "plan", "box.hpp"), "a", encoding="utf-8") as fh:
                    fh.write('\n#include "cairn/options.hpp"\n')
            else:
                for stem, prefix in PENDING:
                    for suffix in (".hpp", "-inl.hpp"):
                        path = os.path.join(copy, stem + suffix)
                        if not os.path.exists(path):
                            continue
                        with open(path, encoding="utf-8") as fh:
                            text = fh.read()
                        text = re.sub(r'^\s*#\s*include\s+"cairn/' + re.escape(prefix) + r'[^"]*"\s*$',
                                      "", text, flags=re.M)
                        with open(path, "w", encoding="utf-8") as fh:
                            fh.write(text)
            failures, _ = check(copy)
            if not failures and (alter == "add" or PENDING):
                print(f"layering: self-test: {name} was not found")
                ok = False
    return ok


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = os.path.join(sys.argv[1], "include", "cairn")
    if not self_test(root):
        return 1
    failures, count = check(root)
    for f in failures:
        print("layering:", f)
    if failures:
        return 1
    found = "both breaches found" if PENDING else "the forbidden include found"
    print(f"layering: {count} headers, {len(RULES)} rules kept (self-test: {found})"
          + (f"; pending: {', '.join(PENDING.values())}" if PENDING else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
