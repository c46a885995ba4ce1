#!/usr/bin/env python3
"""Checks MonitorProbe's `stall` output (JSON lines): a busy stall and a blocked stall, each with
a began and an ended report naming the function it was stuck in, with durations and CPU that fit.
CI runs it on the probe built in release (-O: Swift omits frame pointers there, so this checks
the glibc-backtrace unwinder). Usage: check-monitor-probe.py OUTPUT"""
import json
import sys

events = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
problems = []
if [e["event"] for e in events] != ["began", "ended", "began", "ended"]:
    problems.append(f"events: {[e['event'] for e in events]}")
else:
    def names(report):
        return [f.get("symbol", "") for s in report["stacks"][:1] for f in s["frames"]]
    busy, blocked = events[1]["report"], events[3]["report"]
    for report, function in ((events[0]["report"], "probeCrunchNumbers"), (busy, "probeCrunchNumbers"),
                             (events[2]["report"], "probeBlockingRead"), (blocked, "probeBlockingRead")):
        if not any(function in name for name in names(report)):
            problems.append(f"{function} not in the top stack: {names(report)}")
    for report in (busy, blocked):
        if not 0.3e9 <= report["durationNs"] <= 1.5e9:  # 400 ms, timed to a 20 ms sample interval
            problems.append(f"ended duration {report['durationNs'] / 1e6} ms, expected about 400")
        if report.get("endReason") != "movedOn":
            problems.append(f"end reason {report.get('endReason')}")
    if events[0]["report"]["durationNs"] < 100e6:
        problems.append("began before the 100 ms threshold")
    blocked_ratio = blocked["threadCPUTimeNs"] / max(1, blocked["cpuMeasuredOverNs"])
    if blocked_ratio > 0.1:
        problems.append(f"blocked stall used {blocked_ratio:.0%} CPU")
if problems:
    print("MonitorProbe stall output is wrong:\n  " + "\n  ".join(problems))
    sys.exit(1)
print(f"ok: busy stall in {events[1]['report']['stacks'][0]['frames'][0].get('symbol')} "
      f"({events[1]['report']['durationNs'] / 1e6:.0f} ms, {len(events[1]['report']['stacks'])} stacks), "
      f"blocked stall in probeBlockingRead ({events[3]['report']['durationNs'] / 1e6:.0f} ms)")
