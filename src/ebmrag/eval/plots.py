"""PNG figures for the packing experiments (matplotlib, headless). One function per figure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ebmrag.errors import EbmragError


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise EbmragError("plots need matplotlib: pip install 'ebmrag[eval]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(rows: Sequence[dict[str, Any]], x: str, y: str, group: str) -> dict[str, tuple[list[Any], list[Any]]]:
    series: dict[str, tuple[list[Any], list[Any]]] = defaultdict(lambda: ([], []))
    for row in rows:
        if row.get(y) is None:
            continue
        xs, ys = series[str(row[group])]
        xs.append(row[x])
        ys.append(row[y])
    return dict(series)


def line_plot(rows: Sequence[dict[str, Any]], x: str, metrics: Sequence[str], group: str, title: str,
              path: Path, log_x: bool = False) -> None:
    """One panel per metric, one line per group value (e.g. strategy)."""
    plt = _pyplot()
    figure, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), squeeze=False)
    for axis, metric in zip(axes[0], metrics, strict=True):
        for name, (xs, ys) in sorted(_series(rows, x, metric, group).items()):
            axis.plot(xs, ys, marker="o", label=name)
        axis.set_xlabel(x)
        axis.set_ylabel(f"{metric} (%)")
        axis.set_ylim(-2, 102)
        axis.grid(alpha=0.3)
        if log_x:
            axis.set_xscale("log", base=2)
            axis.set_xticks(sorted({r[x] for r in rows}), labels=[str(v) for v in sorted({r[x] for r in rows})])
    axes[0][0].legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def bar_plot(rows: Sequence[dict[str, Any]], label: str, metrics: Sequence[str], title: str, path: Path) -> None:
    """Grouped bars: one group per row label, one bar per metric."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4))
    width = 0.8 / len(metrics)
    for offset, metric in enumerate(metrics):
        values = [row.get(metric) or 0.0 for row in rows]
        axis.bar([i + offset * width for i in range(len(rows))], values, width, label=metric)
    axis.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], labels=[str(r[label]) for r in rows],
                    rotation=20, ha="right", fontsize=8)
    axis.set_ylim(0, 105)
    axis.set_ylabel("%")
    axis.legend(fontsize=8)
    axis.set_title(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def heatmap(rows: Sequence[dict[str, Any]], x: str, y: str, metric: str, title: str, path: Path) -> None:
    plt = _pyplot()
    xs, ys = sorted({r[x] for r in rows}), sorted({r[y] for r in rows})
    grid = [[next((r[metric] for r in rows if r[x] == vx and r[y] == vy), float("nan")) for vx in xs] for vy in ys]
    figure, axis = plt.subplots(figsize=(6, 4))
    image = axis.imshow(grid, origin="lower", cmap="viridis", aspect="auto")
    axis.set_xticks(range(len(xs)), labels=[str(v) for v in xs])
    axis.set_yticks(range(len(ys)), labels=[str(v) for v in ys])
    axis.set_xlabel(x)
    axis.set_ylabel(y)
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            axis.text(j, i, f"{value:.1f}", ha="center", va="center", fontsize=7, color="white")
    figure.colorbar(image, label=f"{metric} (%)")
    axis.set_title(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
