#!/usr/bin/env python3
"""Two builds of runloop-bench, before and after a change, alternating in one run.

    Benchmarks/compare-builds.py BEFORE AFTER [--rounds N] [--only W ...]

BEFORE and AFTER are runloop-bench executables (e.g. one built in a `git worktree` of the old
commit). Each round runs both once, the first of the two alternating (`--reps 1 --impl
runloopkit --json`), so that the machine's drift falls on both; the table gives each one's
median (min-max) over the rounds and after / before (> 1: the change is better). On a shared VM
one process of a binary can differ from the next by a third: read a ratio against the spread, and
prefer instruction counts (valgrind --tool=callgrind on `strip --strip-debug` copies) for a
verdict on a small change.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("before")
parser.add_argument("after")
parser.add_argument("--rounds", type=int, default=6)
parser.add_argument("--only", action="append", default=None)
args = parser.parse_args()
workloads = args.only or ["iterate", "tracecost", "pingpong", "port"]

samples = {"before": {}, "after": {}}
with tempfile.TemporaryDirectory() as directory:
    output = os.path.join(directory, "figures.json")
    for round in range(args.rounds):
        for which in (("before", "after") if round % 2 == 0 else ("after", "before")):
            command = [getattr(args, which)]
            for workload in workloads:
                command += ["--only", workload]
            command += ["--reps", "1", "--impl", "runloopkit", "--json", output]
            if subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
                sys.exit(f"error: {' '.join(command)} failed")
            for workload in json.load(open(output))["workloads"]:
                for metric in workload["metrics"]:
                    figure = metric["results"].get("RunLoopKit")
                    if figure:
                        key = (workload["name"], metric["key"], metric["unit"], metric["direction"])
                        samples[which].setdefault(key, []).extend(figure["samples"])


def show(value, unit):
    return f"{value / 1e6:.2f} M" if unit == "/s" and value > 1e5 else f"{value:.3g}"


print(f"{args.rounds} rounds, before and after alternating")
print("| workload | metric | before: median (min–max) | after: median (min–max) | after / before |")
print("|---|---|---|---|---|")
for key, before in samples["before"].items():
    after = samples["after"].get(key)
    if not after:
        continue
    name, metric, unit, direction = key
    b, a = statistics.median(before), statistics.median(after)
    if b == 0 or a == 0:
        ratio = "—"
    else:
        ratio = f"{a / b if direction == 'higherIsBetter' else b / a:.3f}"
    print(
        f"| {name} | {metric} ({unit}) | {show(b, unit)} ({show(min(before), unit)}–{show(max(before), unit)}) "
        f"| {show(a, unit)} ({show(min(after), unit)}–{show(max(after), unit)}) | {ratio} |"
    )
