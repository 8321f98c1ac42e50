"""Old run vs new run, behind `--compare` and the `--fail-if-slower` regression gate: rows matched
by (op, shape, dtype, impl), the time ratio of each, which dualk rows regressed, and whether
anything could be compared at all (a CPU smoke check has no timings; two runs may share no row)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .bench import Report, Row
from .render import align, fmt
from .report import is_smoke, status


def row_key(r: Row) -> tuple[str, str, str, str]:
    return (r.op, r.shape, r.dtype, r.impl)


def row_time(r: Row) -> float | None:
    """The time compared: device time, or host time for dispatch-overhead rows."""
    return r.host_us if r.kind == "overhead" else r.us


@dataclass
class Change:
    old: Row
    new: Row

    @property
    def ratio(self) -> float | None:
        """new time / old time (above 1: slower)."""
        a, b = row_time(self.old), row_time(self.new)
        return b / a if a and b is not None else None

    @property
    def timed_in_both(self) -> bool:
        return row_time(self.old) is not None and row_time(self.new) is not None

    def regressed(self, pct: float) -> str | None:
        """Why this dualk row fails a `--fail-if-slower pct` gate, or None."""
        if self.new.kind != "dualk" or row_time(self.old) is None:
            return None
        if self.new.ok is False:
            return "now fails the correctness check"
        if row_time(self.new) is None:
            return f"no longer timed ({status(self.new)})"
        if self.ratio is not None and self.ratio > 1.0 + pct / 100.0:
            return f"{(self.ratio - 1) * 100:.1f}% slower (limit {pct:g}%)"
        return None


@dataclass
class Comparison:
    changes: list[Change] = field(default_factory=list)
    only_old: list[Row] = field(default_factory=list)
    only_new: list[Row] = field(default_factory=list)
    untimed: list[str] = field(default_factory=list)  # "<label> has no timings (...)" per side

    def regressions(self, pct: float) -> list[tuple[Change, str]]:
        if self.untimed:  # "no longer timed" would blame every row for a run that timed nothing
            return []
        return [(c, why) for c in self.changes if (why := c.regressed(pct)) is not None]

    def gated(self) -> list[Change]:
        """The rows a regression gate actually compares: dualk rows timed in both runs."""
        return [c for c in self.changes if c.new.kind == "dualk" and c.timed_in_both]

    def why_not_compared(self) -> str | None:
        """Why there is nothing to compare (a side without timings), or None."""
        return "; ".join(self.untimed) or None

    def why_gate_cannot_compare(self) -> str | None:
        """Why a regression gate would have judged nothing, or None when it judges some row."""
        if self.untimed:
            return "; ".join(self.untimed)
        if not self.gated():
            return "no dualk row is timed in both runs" + (
                "" if self.changes else " (no rows in common)"
            )
        return None


def timings_missing(report: Report, label: str) -> str | None:
    """ "<label> has no timings (...)" when no row of `report` is timed, else None."""
    if any(row_time(r) is not None for r in report.rows):
        return None
    kind = "a CPU smoke check: correctness only" if is_smoke(report) else "no row was timed"
    return f"{label} has no timings ({kind})"


def compare(old: Report, new: Report, old_label: str = "old", new_label: str = "new") -> Comparison:
    """Match rows by (op, shape, dtype, impl); the labels name the runs in messages."""
    old_rows = {row_key(r): r for r in old.rows}
    new_keys = {row_key(r) for r in new.rows}
    out = Comparison()
    for r in new.rows:
        match = old_rows.get(row_key(r))
        if match is None:
            out.only_new.append(r)
        else:
            out.changes.append(Change(match, r))
    out.only_old = [r for r in old.rows if row_key(r) not in new_keys]
    out.untimed = [
        u for u in (timings_missing(old, old_label), timings_missing(new, new_label)) if u
    ]
    return out


def render_compare(cmp: Comparison, pct: float | None = None) -> str:
    """Old vs new time per matched row; with `pct`, dualk rows over the limit flagged `!!`. A run
    without timings is said to be one, not shown as a table of dashes."""
    why = cmp.why_not_compared()
    if why:
        return f"comparison: nothing to compare: {why}"
    header = ("op", "shape", "dtype", "impl", "old (us)", "new (us)", "new/old", "change", "")
    body = []
    reasons = {id(c): reason for c, reason in cmp.regressions(pct)} if pct is not None else {}
    for c in cmp.changes:
        ratio = c.ratio
        change = f"{(ratio - 1) * 100:+.1f}%" if ratio is not None else "-"
        flag = "!! " + reasons[id(c)] if id(c) in reasons else ""
        body.append(
            [
                c.new.op,
                c.new.shape,
                c.new.dtype,
                c.new.impl,
                fmt(row_time(c.old), ".2f"),
                fmt(row_time(c.new), ".2f"),
                fmt(ratio, ".3f"),
                change,
                flag,
            ]
        )
    lines = ["comparison: rows matched by (op, shape, dtype, impl); new/old above 1 is slower"]
    lines += align(header, body, [4, 5, 6, 7]) if body else ["(no rows in common)"]
    if cmp.only_old or cmp.only_new:
        lines.append(
            f"unmatched: {len(cmp.only_old)} row(s) only in the old file, "
            f"{len(cmp.only_new)} only in the new run"
        )
    return "\n".join(lines)
