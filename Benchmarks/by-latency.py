#!/usr/bin/env python3
"""Groups the repetitions of runloop-bench's cross-thread workloads by the machine's cache-line
round trip taken just before each (line_round_trip_ns): under 200 ns (both virtual CPUs close)
and from 200 ns (far apart), and prints each group's median and worst over median.

    Benchmarks/by-latency.py headline.json

On a virtual machine the host moves the virtual CPUs, and a cross-thread figure moves with the
distance between them (BENCHMARKS.md, the headline's stability item).
"""
import json
import statistics
import sys

WORKLOADS = [("submit", "blocks_per_s"), ("port", "messages_per_s"), ("pingpong", "round_trip_us")]
SPLIT_NS = 200


def main(path):
    run = json.load(open(path))
    for name, key in WORKLOADS:
        workload = next((w for w in run["workloads"] if w["name"] == name), None)
        if workload is None:
            continue
        metrics = {m["key"]: m for m in workload["metrics"]}
        if key not in metrics or "line_round_trip_ns" not in metrics:
            continue
        figure, trips = metrics[key], metrics["line_round_trip_ns"]["results"]
        lower_is_better = figure["direction"] == "lowerIsBetter"
        for impl, result in figure["results"].items():
            cells = []
            for label, near in (("near", True), ("far", False)):
                group = [x for x, t in zip(result["samples"], trips[impl]["samples"]) if (t < SPLIT_NS) == near]
                if not group:
                    cells.append(f"{label}: none")
                    continue
                median = statistics.median(group)
                worst = max(group) if lower_is_better else min(group)
                ratio = median / worst if lower_is_better else worst / median
                cells.append(f"{label}: {len(group)} reps, median {median:.4g}, worst/median {ratio:.2f}")
            print(f"{name:8} {impl:22} " + " | ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1])
