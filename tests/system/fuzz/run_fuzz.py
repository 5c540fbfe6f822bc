"""Runs cairn's libFuzzer targets and reports what they executed and found (used by scripts/fuzz).

    run_fuzz.py --bin build-fuzz/bin --work build-fuzz [--time S | --runs N] [--jobs J]
                [--timeout S] [--smoke] TARGET...

Each target fuzzes its corpus WORK/fuzz-corpus/<target>/ (what libFuzzer adds stays there for
later runs) seeded from WORK/fuzz-seeds/<target>/ (make_corpus.py), tests/system/fuzz/seeds/<target>/
and tests/system/fuzz/regressions/<target>/, with ASan + UBSan, -timeout=25 s per input (--timeout: a
soak that shares the machine with builds needs more, or starved inputs count as slow) and
-rss_limit_mb=2048 (also the malloc limit).

A finding is a crash, a sanitizer report, a violated property, a slow input or an out-of-memory;
its key is the report's SUMMARY line with the first frame in cairn's code. A soak continues after
a finding (a fresh libFuzzer process, with what is left of the budget; at most 20 findings per
target) and saves one reproducer per new key in tests/system/fuzz/regressions/<target>/; a smoke
(--smoke) stops a target at its first finding and leaves the reproducer in
WORK/fuzz-artifacts/<target>/. Exits 1 when anything was found.
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import time

FUZZ_DIR = os.path.dirname(os.path.abspath(__file__))  # tests/system/fuzz
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(FUZZ_DIR)))  # the repository
MAX_FINDINGS = 20
# libFuzzer's options; -timeout and -rss_limit_mb make slow and greedy inputs findings.
OPTIONS = ["-rss_limit_mb=2048", "-print_final_stats=1", "-reload=0"]


def first_cairn_frame(log):
    """`function file:line` of the first stack frame in cairn's headers or a fuzz target."""
    for m in re.finditer(r"#\d+ 0x[0-9a-f]+ in (.*?) (/\S*?((include/cairn|tests/fuzz)/[^:\s]+)"
                         r":(\d+))", log):
        if m.group(3) == "tests/system/fuzz/fuzz.hpp":
            continue
        func = m.group(1).replace("(anonymous namespace)::", "")
        func = (func.split("(")[0].split() or [func[:60]])[-1]
        return f"{func} {m.group(3)}:{m.group(5)}"
    return ""


def finding(log):
    """(key, one-line description) of the finding in `log`; the key is stable across inputs that
    hit the same bug: the report's kind and the first frame in cairn's code."""
    summary = next((l[len("SUMMARY: "):] for l in log.splitlines() if l.startswith("SUMMARY: ")),
                   "")
    kind = " ".join(summary.split()[:2]) if summary else "crash (no SUMMARY line)"
    frame = first_cairn_frame(log)
    prop = re.search(r"cairn fuzz: property violated: (.*)", log)
    thrown = re.search(r"terminate called after throwing an instance of '([^']*)'", log)
    ubsan = re.search(r"(?:include/cairn|tests/fuzz)/(\S+?): runtime error: (.*)", log)
    if prop:
        return f"property: {prop.group(1)}", f"property violated: {prop.group(1)}"
    if thrown:
        what = re.search(r"what\(\): +(.*)", log)
        detail = f": {what.group(1)[:120]}" if what else ""
        return f"throw {thrown.group(1)} {frame}", \
            f"uncaught {thrown.group(1)}{detail} (in {frame})"
    if "leaked in" in summary:  # one key per target: the byte counts and sites vary
        leaked = summary.split(": ", 1)[1].rstrip(".")
        return "leak", f"LeakSanitizer: memory leak ({leaked}; allocated in {frame})"
    if ubsan:
        return f"ubsan {ubsan.group(1).rsplit(':', 1)[0]}", \
            f"UndefinedBehaviorSanitizer: {ubsan.group(2)[:160]} (in {frame})"
    return f"{kind} {frame}", f"{kind} in {frame}" if frame else summary


def executed(log):
    m = re.findall(r"stat::number_of_executed_units: (\d+)", log)
    return int(m[-1]) if m else 0


def fuzz_target(name, args):
    """Fuzzes one target within the budget; returns (name, execs, seconds, findings)."""
    binary = os.path.join(args.bin, f"fuzz_{name}")
    corpus = os.path.join(args.work, "fuzz-corpus", name)
    artifacts = os.path.join(args.work, "fuzz-artifacts", name)
    regressions = os.path.join(FUZZ_DIR, "regressions", name)
    os.makedirs(corpus, exist_ok=True)
    os.makedirs(artifacts, exist_ok=True)
    seeds = [d for d in (os.path.join(args.work, "fuzz-seeds", name),
                         os.path.join(FUZZ_DIR, "seeds", name), regressions)
             if os.path.isdir(d)]
    logs = os.path.join(args.work, "fuzz-logs")
    os.makedirs(logs, exist_ok=True)
    execs, findings, start, attempt = 0, {}, time.monotonic(), 0
    while len(findings) < MAX_FINDINGS:
        budget = []
        if args.runs:
            if execs >= args.runs:
                break
            budget = [f"-runs={args.runs - execs}"]
        else:
            left = int(args.time - (time.monotonic() - start))
            if left <= 0:
                break
            budget = [f"-max_total_time={left}"]
        attempt += 1
        log_path = os.path.join(logs, f"{name}.{attempt}.log")
        for f in os.listdir(artifacts):
            os.remove(os.path.join(artifacts, f))
        # After a finding, the seeds that reproduce it are left out so fuzzing can go on.
        dirs = [corpus] + (seeds if attempt == 1 else [d for d in seeds if d != regressions])
        cmd = [binary, f"-timeout={args.timeout}", *OPTIONS, *budget,
               f"-artifact_prefix={artifacts}/", *dirs]
        with open(log_path, "w") as log_file:
            rc = subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT).returncode
        with open(log_path, errors="replace") as f:
            log = f.read()
        execs += executed(log)
        crashes = [f for f in os.listdir(artifacts) if re.match(r"(crash|leak|timeout|oom)-", f)]
        if rc == 0 and not crashes:
            break
        key, line = finding(log)
        path = os.path.join(artifacts, crashes[0]) if crashes else None
        if key not in findings:
            findings[key] = (line, path, log_path)
            if path and not args.smoke:
                os.makedirs(regressions, exist_ok=True)
                saved = os.path.join(regressions, os.path.basename(path))
                shutil.copyfile(path, saved)
                findings[key] = (line, saved, log_path)
            elif path:
                kept = os.path.join(args.work, "fuzz-artifacts",
                                    f"{os.path.basename(path)}.{name}")
                shutil.copyfile(path, kept)
                findings[key] = (line, kept, log_path)
        if args.smoke or not path:  # no reproducer: libFuzzer itself failed
            break
    return name, execs, time.monotonic() - start, findings


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--time", type=int, default=60)
    ap.add_argument("--runs", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=int, default=25)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("targets", nargs="+")
    args = ap.parse_args()
    # UBSan stops at the first report (the targets are built with -fno-sanitize-recover=all)
    # and prints the stack the key of a finding is taken from.
    os.environ.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    if "ASAN_SYMBOLIZER_PATH" not in os.environ and shutil.which("llvm-symbolizer-16"):
        os.environ["ASAN_SYMBOLIZER_PATH"] = shutil.which("llvm-symbolizer-16")
    budget = f"{args.runs} inputs" if args.runs else f"{args.time} s"
    print(f"fuzz: {len(args.targets)} target(s), {budget} each, {args.jobs} at a time"
          + (" (smoke)" if args.smoke else ""), flush=True)
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for r in pool.map(lambda t: fuzz_target(t, args), args.targets):
            name, execs, secs, findings = r
            print(f"fuzz: {name:18} {execs:>10} execs in {secs:6.0f} s "
                  f"({execs / max(secs, 1e-9):8.0f}/s), {len(findings)} finding(s)", flush=True)
            for line, path, log in findings.values():
                shown = os.path.relpath(path, ROOT) if path else "(no reproducer)"
                print(f"fuzz:   {line}\n"
                      f"          reproducer {shown}; log {os.path.relpath(log, ROOT)}", flush=True)
            results.append(r)
    total = sum(len(r[3]) for r in results)
    print(f"fuzz: {sum(r[1] for r in results)} execs in total, {total} finding(s)")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
