"""Where a profiled step's device time goes: XLA's ops of a trace, summed by name and kind.

    python bench/tpu.py --only podkit --profile /tmp/prof     # on a TPU host
    python bench/tpu_profile.py /tmp/prof [--top 40]

Reads the newest `*.trace.json.gz` under the directory (written by `jax.profiler.trace`) and,
for each device's "XLA Ops" line, prints the ops that took the most time: their share of the
device's busy time, their count, and the start of the HLO instruction (its shape and kind:
fusion, convolution, custom-call...). Also the device's busy share of the traced window (what
is not busy is idle: waiting for the host, the input or a compile).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path


def load(directory: Path) -> list[dict]:
    traces = sorted(directory.rglob("*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not traces:
        raise SystemExit(f"no *.trace.json.gz under {directory}")
    data = json.load(gzip.open(traces[-1]))
    return data["traceEvents"] if isinstance(data, dict) else data


def kind_of(event: dict) -> str:
    """The op's kind from its HLO text (`%fusion.3 = bf16[...] fusion(...), kind=kOutput`)."""
    text = str(event.get("args", {}).get("long_name", ""))
    if "custom-call" in text or "custom_call_target" in text:
        return "custom-call"
    head = text.split("=", 1)[1].strip() if "=" in text else text
    words = head.split("(", 1)[0].split()
    op = words[-1] if "(" in head and words else event["name"]
    if op == "fusion" and "kind=" in text:
        return "fusion:" + text.split("kind=", 1)[1].split(",")[0].split()[0]
    return op


def _leaves(ops: list[dict]) -> list[dict]:
    """The ops that contain no other op of their line (a while loop's event spans the ops of
    its body: counting both would count that time twice)."""
    ops = sorted(ops, key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    out = []
    for i, e in enumerate(ops):
        nxt = ops[i + 1] if i + 1 < len(ops) else None
        inside = (nxt is not None and nxt["tid"] == e["tid"]
                  and nxt["ts"] < e["ts"] + e["dur"])
        if not inside:
            out.append(e)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    events = load(args.directory)
    pids = {e["pid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name"}
    tids = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "thread_name"}
    lines = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "XLA Ops" in tids.get((e["pid"], e.get("tid")), ""):
            lines[pids.get(e["pid"], e["pid"])].append(e)
    if not lines:
        raise SystemExit("no device 'XLA Ops' line in the trace (a CPU trace has none)")
    for device, ops in lines.items():
        ops = _leaves(ops)
        busy = sum(e["dur"] for e in ops)
        window = max(e["ts"] + e["dur"] for e in ops) - min(e["ts"] for e in ops)
        print(f"{device}: {len(ops)} ops, busy {busy / 1e3:.1f} ms of a {window / 1e3:.1f} ms "
              f"window ({busy / window:.1%})")
        by_kind: collections.Counter = collections.Counter()
        by_name: collections.Counter = collections.Counter()
        count: collections.Counter = collections.Counter()
        text = {}
        for e in ops:
            by_kind[kind_of(e)] += e["dur"]
            by_name[e["name"]] += e["dur"]
            count[e["name"]] += 1
            text.setdefault(e["name"], str(e.get("args", {}).get("long_name", ""))[:110])
        print("  by kind:")
        for kind, dur in by_kind.most_common(12):
            print(f"    {dur / busy:6.1%} {dur / 1e3:9.1f} ms  {kind}")
        print(f"  top {args.top} ops:")
        for name, dur in by_name.most_common(args.top):
            print(f"    {dur / busy:6.1%} {dur / 1e3:8.1f} ms x{count[name]:<4} {name:<28} "
                  f"{text[name]}")


if __name__ == "__main__":
    main()
