"""Top SASS instructions by warp-stall samples from `ncu --page source --csv --print-source sass`.

    python3 ncu_top.py source.csv [N]
Prints the column names once, then the N instructions with the most samples and, for each, its
largest stall-reason columns."""

import csv
import sys

with open(sys.argv[1], newline="") as f:
    rows = list(csv.reader(f))
top_n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
head_at = next(i for i, r in enumerate(rows) if any(c == "Source" or "Address" in c for c in r))
header, body = rows[head_at], rows[head_at + 1 :]
print("columns:", " | ".join(header))
total_col = next(i for i, c in enumerate(header) if "Warp Stall Sampling (All" in c)
src_col = next(i for i, c in enumerate(header) if c == "Source")
stall_cols = [
    i for i, c in enumerate(header) if c.startswith("stall_") or "Stall" in c and i != total_col
]


def num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


total = sum(num(r[total_col]) for r in body if len(r) > total_col)
print(f"total samples {total:.0f}")
ranked = sorted((r for r in body if len(r) > total_col), key=lambda r: -num(r[total_col]))
for r in ranked[:top_n]:
    reasons = sorted(((num(r[i]), header[i]) for i in stall_cols if num(r[i]) > 0), reverse=True)[
        :3
    ]
    why = ", ".join(f"{name.replace('stall_', '')} {v:.0f}" for v, name in reasons)
    print(
        f"{num(r[total_col]):6.0f} {100 * num(r[total_col]) / max(total, 1):5.1f}%  {r[src_col][:70]:70s} {why}"
    )
