"""Issue 13's check on a `dualk bench` JSON: per (op, shape, dtype), "auto" against the best
PyTorch path timed in the same run (eager, cuBLAS, cuBLASLt's fused epilogue, CUDA-graph eager,
torch.compile when timed) and against the best dualk backend; a case fails when auto is more
than 5% slower than either. Times are medians of do_bench (L2 flushed).

    python3 bench/auto_table.py RUN.json [--markdown OUT.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def rows_by_case(report: dict) -> dict:
    cases = defaultdict(list)
    for row in report["rows"]:
        if row.get("us") and row.get("ok") and row["kind"] in ("dualk", "peer"):
            cases[(row["op"], row["case"], row["dtype"])].append(row)
    return cases


def table(report: dict, limit: float = 1.05) -> tuple[list[str], int]:
    lines = ["| op | shape | dtype | auto (us) | best PyTorch | ratio | best dualk backend | ratio | ok |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    misses = 0
    for (op, case, dtype), rows in rows_by_case(report).items():
        auto = next((r for r in rows if r["impl"] == "dualk:auto"), None)
        peers = [r for r in rows if r["kind"] == "peer"]
        kernels = [r for r in rows if r["kind"] == "dualk" and r["impl"] != "dualk:auto"]
        if auto is None or not peers:
            continue
        peer = min(peers, key=lambda r: r["us"])
        kernel = min(kernels, key=lambda r: r["us"]) if kernels else None
        r_peer = auto["us"] / peer["us"]
        r_kernel = auto["us"] / kernel["us"] if kernel else 1.0
        ok = r_peer <= limit and r_kernel <= limit
        misses += not ok
        lines.append(
            f"| {op} | {case} | {dtype} | {auto['us']:.2f} | {peer['impl']} {peer['us']:.2f} | "
            f"{r_peer:.3f} | {kernel['impl'] if kernel else '-'} {kernel['us'] if kernel else 0:.2f} | "
            f"{r_kernel:.3f} | {'yes' if ok else '**no**'} |"
        )
    return lines, misses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    report = json.loads(args.json_file.read_text())
    env = report["env"]
    head = [f"auto vs best, {env['gpu']}, torch {env['torch']}, triton {env['triton']}, {env['date']}",
            f"source: {args.json_file.name}", ""]  # fmt: skip
    lines, misses = table(report)
    lines.append(f"\n{misses} case(s) where auto is more than 5% slower than the best path")
    text = "\n".join(head + lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
