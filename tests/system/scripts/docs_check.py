#!/usr/bin/env python3
"""Checks the project's markdown against two kinds of rot a reader cannot see from the page.

1. Paths of a development machine. A doc that points at /work/..., /home/..., /root/... or
   ../shared/ sends the reader to files that are not in the repository: on their machine the
   path does not exist. Paths under /tmp, /usr, /dev/shm and URLs are fine.
2. Stale lists of the `cairn` tool's commands. The commands are what `cairn --help` prints
   (its "usage: cairn X" and "       cairn X" lines), so a command added to the tool and not to
   a doc that lists the tool's commands is found here. A command list is one line (a markdown
   table row is one line) that names at least 3 distinct commands, each as an exact backticked
   word (`X`; a mention of `cairn X` is prose about that command); such a line must name every
   command, so write the tool's
   command list on one line. Other words are not counted: prose that says "convert", or C++
   names such as `convert::unshard`. A line that names only commands `cairn --help` itself
   names together on one of its own lines (those that draw a progress bar, say) is about that
   feature, not a list of the tool, and passes. Fenced code blocks are not read for command
   lists (a shell line may chain commands); they are for paths.

Files read: every README.md of the repository (build trees and hidden folders skipped) and
every .md file under docs/ and examples/.

Usage: docs_check.py REPO_ROOT CAIRN_CLI. Exit 0: no finding; 1: findings, each printed as
file:line and what is wrong; 77 (ctest SKIP): the CLI binary does not exist.
"""

import os
import re
import subprocess
import sys

# Absolute paths of a development machine. The character before must not continue a word or a
# relative path (`dir/work/x`, `~/work`); URLs are removed before matching.
PATH_TAIL = r"""[^\s`'"()\[\],;]*"""
DEV_PATH = re.compile(
    r"(?<![\w.~-])/(?:work|home|root)/" + PATH_TAIL + r"|\.\./shared\b" + PATH_TAIL
)
URL = re.compile(r"\b(?:https?|ftp|s3|gs)://\S+")
FENCE = re.compile(r"^\s*(```|~~~)")


def cli_commands(cli):
    """The commands and the groups of commands that `cli --help` names together on a line."""
    try:
        p = subprocess.run([cli, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, None, f"{cli} --help did not run: {e}"
    if p.returncode != 0:
        return None, None, f"{cli} --help exited {p.returncode} (expected 0, usage on stdout)"
    # The usage block: "usage: cairn X ...", then "       cairn Y ..." lines and their
    # continuations ("            [--opt]"); the descriptions below it are read for groups.
    commands, rest, in_usage = [], [], False
    for line in p.stdout.splitlines():
        m = re.match(r"^(usage:\s+|\s+)cairn\s+([a-z][a-z0-9_-]*)\b", line)
        if m and (in_usage or m.group(1).startswith("usage:")):
            in_usage = True
            if m.group(2) not in commands:
                commands.append(m.group(2))
        elif not (in_usage and re.match(r"^\s+[\[-]", line)):
            in_usage = False
            rest.append(line)
    if len(commands) < 3:
        return None, None, f"{cli} --help on stdout names {len(commands)} commands: {p.stdout!r}"
    word = re.compile(r"\b(%s)\b" % "|".join(map(re.escape, commands)))
    groups = [g for g in (set(word.findall(line)) for line in rest) if len(g) >= 2]
    return commands, groups, None


def doc_files(root):
    """README.md files anywhere but build trees and hidden folders; .md under docs/, examples/."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(
            x
            for x in dirs
            if not x.startswith(".")
            and x not in ("node_modules", "__pycache__")
            and not os.path.exists(os.path.join(d, x, "CMakeCache.txt"))
        )
        rel = os.path.relpath(d, root)
        top = rel.split(os.sep)[0]
        for f in sorted(files):
            if f == "README.md" or (top in ("docs", "examples") and f.endswith(".md")):
                out.append(os.path.join(d, f))
    return out


def prose_lines(lines):
    """(line number, text) of the lines outside fenced code blocks."""
    out, fenced = [], False
    for n, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((n, line))
    return out


def check_file(path, rel, commands, groups, findings):
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        for m in DEV_PATH.finditer(URL.sub(" ", line)):
            findings.append(
                f"{rel}:{n}: path of a development machine {m.group(0).rstrip('.:')!r}, not in the "
                f"repository: name the document or project instead"
            )
    alt = "|".join(map(re.escape, commands))
    # A list names the commands as bare words in backticks (`inspect`, `verify`, ...); a line that
    # mentions what `cairn verify` and `cairn diff` did is prose about them, not a list.
    token = re.compile(r"`(%s)`" % alt)
    lists = 0
    for n, text in prose_lines(lines):
        named = set(token.findall(text))
        if len(named) < 3:
            continue
        lists += 1
        if named == set(commands) or any(named <= g for g in groups):
            continue
        missing = [c for c in commands if c not in named]
        findings.append(
            f"{rel}:{n}: a list of the cairn tool's commands names "
            f"{', '.join(c for c in commands if c in named)} but not {', '.join(missing)} "
            f"(cairn --help: {', '.join(commands)})"
        )
    return lists


def main(argv):
    if len(argv) != 3:
        print("usage: docs_check.py REPO_ROOT CAIRN_CLI")
        return 2
    root, cli = argv[1], argv[2]
    if not os.path.isfile(cli):
        print(f"SKIP: the cairn CLI {cli} does not exist (build the cairn-cli target)")
        return 77
    commands, groups, err = cli_commands(cli)
    if err:
        print(f"docs_check: {err}")
        return 1
    findings, files, lists = [], doc_files(root), 0
    for path in files:
        lists += check_file(path, os.path.relpath(path, root), commands, groups, findings)
    for f in findings:
        print(f)
    print(
        f"docs_check: {len(files)} files, {lists} command lists checked against cairn --help "
        f"({', '.join(commands)}): {len(findings)} findings"
    )
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
