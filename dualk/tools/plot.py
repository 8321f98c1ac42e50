"""The speedup plot behind `--plot` (a PNG; needs the optional matplotlib, `dualk[plot]`).
matplotlib is imported only when a plot is drawn, so the CLI starts without it."""

from __future__ import annotations

import os

from .bench import Report
from .report import group_rows, measured_rows

PLOT_INSTALL_HINT = "plotting needs matplotlib: pip install 'dualk[plot]'"


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    """Raise PlotUnavailableError (with the install hint) when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailableError(PLOT_INSTALL_HINT) from None


def plot(report: Report, path: str | os.PathLike) -> None:
    """Speedup vs eager PyTorch: one panel per operator, one group of bars per (shape, dtype), one
    bar per dualk backend or PyTorch peer; failed rows hatched red and labelled FAIL. Raises
    ValueError when no row has a speedup (a CPU smoke check, say)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ops = group_rows(
        r for r in measured_rows(report) if r.speedup_vs_eager is not None or r.ok is False
    )
    if not ops:
        raise ValueError("nothing to plot: no row has a speedup vs eager")
    # One colour per implementation across all panels, so dualk:cuda looks the same everywhere.
    palette = plt.get_cmap("tab20")
    every_impl = list(
        dict.fromkeys(r.impl for groups in ops.values() for rs in groups.values() for r in rs)
    )
    colour = {impl: palette(i % 20) for i, impl in enumerate(every_impl)}
    fig, axes = plt.subplots(len(ops), 1, figsize=(11, 3.6 * len(ops)), squeeze=False)
    for ax, (op, groups) in zip(axes[:, 0], ops.items(), strict=True):
        impls = list(dict.fromkeys(r.impl for rows in groups.values() for r in rows))
        width = 0.8 / len(impls)
        for g, rows in enumerate(groups.values()):
            for r in rows:
                j = impls.index(r.impl)
                x = g + (j - (len(impls) - 1) / 2) * width
                failed = r.ok is False
                bar = ax.bar(
                    x,
                    r.speedup_vs_eager or 0.0,
                    width,
                    color=colour[r.impl],
                    hatch="xx" if failed else None,
                    edgecolor="red" if failed else None,
                )
                if failed:
                    ax.annotate(
                        "FAIL",
                        (x, bar[0].get_height()),
                        ha="center",
                        va="bottom",
                        color="red",
                        fontsize=7,
                    )
        handles = [Patch(color=colour[impl], label=impl) for impl in impls]
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(groups)), [f"{s}\n{d}" for s, d in groups], fontsize=8)
        ax.set_ylabel("speedup vs eager (x)")
        ax.set_title(op)
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    gpu = report.env.get("gpu") or "no GPU"
    fig.suptitle(f"dualk: speedup vs eager PyTorch, {gpu}, {report.env.get('date', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
