#!/usr/bin/env python3
"""Every step's seconds of a `make test` run, in a few lines (CI keeps only the end of its output).

    scripts/ci_times.py lab-results/ci-run.log [lab-results/lab-caches.log]

Reads what `make test` already prints: its tiers ("[test] ..."), the static tier's parts ("[static] NAME: N s"),
the lab caches ("[lab-caches] ..."), and each lab's step table (scripts/lab/step_times.py), closed by
scripts/lab/lab-test.sh's "[lab-test] scenario NAME: passed|FAILED". A step that never printed is simply absent.
"""
import re
import sys

ANSI = re.compile(r"\x1b\[[0-9;]*m")
TIER = re.compile(r"^\[test\] (.+?): (\d+) s(?:; all: (\d+) s)?")
PART = re.compile(r"^\[static\] ([a-z-]+): (\d+) s, rc=(\d+)")
CACHE = re.compile(r"^\[lab-caches\] (.+?): (\d+) s")
STEP = re.compile(r"^  ([a-z_]+(?:-[a-z0-9]+)*) +(\d+) s( +FAILED)?\s*$")
PEAK = re.compile(r"peak memory used on this machine: (\d+) MiB")
SCENARIO = re.compile(r"^\[lab-test\] scenario ([a-z0-9_-]+): (\w+)")


def summarize(lines, cache_lines=()):
    tiers, parts, caches, labs, steps, peak = [], [], [], [], [], None
    for raw in list(lines) + ["\n"] + list(cache_lines):
        line = ANSI.sub("", raw.rstrip("\n"))
        m = TIER.match(line)
        if m:
            tiers.append("%s %s" % (m.group(1), m.group(2)) + (" (all %s)" % m.group(3) if m.group(3) else ""))
            continue
        m = PART.match(line)
        if m:
            parts.append("%s %s%s" % (m.group(1), m.group(2), "" if m.group(3) == "0" else " rc=" + m.group(3)))
            continue
        m = CACHE.match(line)
        if m:
            caches.append("%s %s" % (m.group(1), m.group(2)))
            continue
        m = STEP.match(line)
        if m:
            steps.append("%s %s%s" % (m.group(1), m.group(2), " FAILED" if m.group(3) else ""))
            continue
        m = PEAK.search(line)
        if m:
            peak = m.group(1)
            continue
        m = SCENARIO.match(line)
        if m:
            labs.append("=== %s lab (%s): %s%s" % (m.group(1), m.group(2), ", ".join(steps) or "no step timed",
                                                   "; peak memory %s MiB" % peak if peak else ""))
            steps, peak = [], None
    out = ["=== CI times (s): " + ("; ".join(tiers) or "no tier finished")]
    if parts:
        out.append("=== static parts: " + ", ".join(parts))
    if caches:
        out.append("=== lab caches: " + ", ".join(caches))
    out += labs
    if steps:  # a lab that never reached its end line
        out.append("=== unfinished lab: " + ", ".join(steps))
    return out


def main(argv):
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    with open(argv[0], errors="replace") as fh:
        lines = fh.readlines()
    cache_lines = []
    if len(argv) > 1:
        try:
            with open(argv[1], errors="replace") as fh:
                cache_lines = fh.readlines()
        except OSError:
            pass
    print("\n".join(summarize(lines, cache_lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
