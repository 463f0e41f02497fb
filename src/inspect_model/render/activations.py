"""Render an :class:`ActivationReport`: table cells, the JSON payload, per-image JSON lines,
and the overview figure (mean, std and dead fractions along the depth of the network)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from inspect_model.render.table import Column, one_line, plain_table, warning_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from inspect_model.methods.activations.measure import ActivationStats
    from inspect_model.methods.activations.capture import (
        ActivationReport,
        ImageActivations,
        LayerActivation,
    )

FEW_POINTS = 12  # up to this many rows, the overview draws markers, not lines

COLUMNS = (
    Column("Layer"),
    Column("Type"),
    Column("Output shape"),
    Column("Mean", "right"),
    Column("Std", "right"),
    Column("Min", "right"),
    Column("Max", "right"),
    Column("Zero %", "right"),
    Column("Neg %", "right"),
    Column("Dead ch", "right"),
    Column("NaN/Inf", "right"),
)


QUANTIZED_DTYPES = ("quint8", "qint8", "qint32", "quint4x2", "quint2x4")


def _num(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    return f"{v:.4g}" if 1e-3 <= abs(v) < 1e5 else f"{v:.3e}"


def _pct(v: float) -> str:
    return f"{100.0 * v:.1f}"


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def row_cells(r: LayerActivation) -> list[str]:
    s = r.stats
    dead = f"{r.dead_channels}/{r.channels}" if r.channels else "--"
    bad = f"{s.nan_count}/{s.inf_count}" if (s.nan_count or s.inf_count) else "0"
    return [r.key, r.type, _shape(r.shape), _num(s.mean), _num(s.std), _num(s.min), _num(s.max),
            _pct(s.zero_fraction), _pct(s.negative_fraction), dead, bad]


def footer_lines(rep: ActivationReport, files: list[str] | None = None, drawn: list[str] | None = None) -> list[str]:
    n_layers = len({r.name for r in rep.layers})
    lines = [
        f"Texts: {rep.images} in {rep.batches} batch(es); statistics merged over their real tokens (padding left "
        "out)" if rep.real_tokens else
        f"Images: {rep.images} in {rep.batches} batch(es); statistics merged over all images",
        f"Layers: {n_layers} hooked, {len(rep.layers)} rows (one per call and output)",
        "Dead ch: channels exactly zero for every image; Zero %: exact zeros; moments over finite values",
    ]
    collapsed = [r.key for r in rep.layers if r.channels and r.dead_channels == r.channels]
    if collapsed:
        lines.append(f"Fully dead outputs: {', '.join(collapsed[:8])}" + (" ..." if len(collapsed) > 8 else ""))
    nonfinite = [r.key for r in rep.layers if r.stats.nan_count or r.stats.inf_count]
    if nonfinite:
        lines.append(f"Non-finite values first appear in: {nonfinite[0]}")
    drawn = rep.kept_layers if drawn is None else drawn
    if drawn:
        lines.append(f"Drawn layers: {', '.join(one_line(d) for d in drawn[:8])}" + (" ..." if len(drawn) > 8 else ""))
    quantized = [r for r in rep.layers if r.dtype in QUANTIZED_DTYPES]
    if quantized:  # the engine dequantizes them (engine/hooks.py)
        kinds = ", ".join(sorted({r.dtype for r in quantized}))
        lines.append(f"Quantized: {len(quantized)} row(s) output quantized tensors ({kinds}); their statistics "
                     "and pictures are of the dequantized values")
    if files:
        lines.append(f"Files written: {len(files)}")
    return lines


def render_text(rep: ActivationReport, files: list[str] | None = None,
                warnings: list[dict[str, Any]] | None = None, drawn: list[str] | None = None) -> str:
    body = plain_table(COLUMNS, [row_cells(r) for r in rep.layers])
    tail = footer_lines(rep, files, drawn) + warning_text({"warnings": warnings or []})
    return f"Model: {one_line(rep.model)}\n{body}\n\n" + "\n".join(tail) + "\n"


def render_rich(rep: ActivationReport, files: list[str] | None = None,
                warnings: list[dict[str, Any]] | None = None, drawn: list[str] | None = None) -> list[Any]:
    from inspect_model.render.table import rich_table

    t = rich_table(COLUMNS, [row_cells(r) for r in rep.layers], title=f"Model: {rep.model}")
    return [t, "\n".join(footer_lines(rep, files, drawn)), *warning_text({"warnings": warnings or []})]


def render_overview(rep: ActivationReport) -> Figure:
    """Mean +- std, and the zero / dead-channel fractions, of every row in forward order."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = rep.layers
    x = np.arange(len(rows))
    mean = np.array([r.stats.mean for r in rows], dtype=float)
    std = np.array([r.stats.std for r in rows], dtype=float)
    amax = np.array([max(abs(r.stats.min), abs(r.stats.max)) for r in rows], dtype=float)
    zero = np.array([r.stats.zero_fraction for r in rows], dtype=float)
    dead = np.array([r.dead_channel_fraction if r.channels else np.nan for r in rows], dtype=float)
    fig = Figure(figsize=(12.0, 8.0), dpi=100)
    FigureCanvasAgg(fig)
    ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True)
    # Few points: markers only (a line between two layers suggests a trend that is not there).
    few = len(rows) <= FEW_POINTS
    style: dict[str, Any] = {"linestyle": "none", "marker": "o", "markersize": 5} if few else {"linewidth": 1.0}
    if few:
        ax1.errorbar(x, mean, yerr=std, color="tab:blue", capsize=4, label="mean ± std", **style)
    else:
        ax1.plot(x, mean, color="tab:blue", label="mean", **style)
        ax1.fill_between(x, mean - std, mean + std, color="tab:blue", alpha=0.2, linewidth=0, label="mean ± std")
    ax1.set_ylabel("activation")
    ax1.legend(loc="upper right", fontsize=8)
    ax2.plot(x, std, color="tab:orange", label="std", **style)
    ax2.plot(x, amax, color="tab:red", label="max |value|",
             **({**style, "marker": "s"} if few else {"linewidth": 0.8, "linestyle": "--"}))
    positive = np.concatenate([std[np.isfinite(std) & (std > 0)], amax[np.isfinite(amax) & (amax > 0)]])
    if positive.size and positive.max() / max(positive.min(), 1e-300) > 100:
        ax2.set_yscale("log")  # explosions span decades
    ax2.set_ylabel("spread")
    ax2.legend(loc="upper right", fontsize=8)
    ax3.plot(x, zero, color="tab:gray", label="exact zeros", **style)
    ax3.plot(x, dead, color="tab:purple", label="dead channels",
             **({**style, "marker": "s"} if few else {"linewidth": 1.0, "marker": ".", "markersize": 3}))
    ax3.set_ylim(-0.02, 1.02)
    if few:
        ax3.set_xlim(-0.5, len(rows) - 0.5)
    ax3.set_ylabel("fraction")
    ax3.legend(loc="upper right", fontsize=8)
    for i, r in enumerate(rows):
        if r.stats.nan_count or r.stats.inf_count:
            for ax in (ax1, ax2, ax3):
                ax.axvline(i, color="red", alpha=0.3, linewidth=0.8)
    if len(rows) <= 40:
        ax3.set_xticks(x)
        ax3.set_xticklabels([one_line(r.key) for r in rows], rotation=0 if few else 90, fontsize=9 if few else 7)
    else:
        ax3.set_xlabel("layer (forward order; see the report for names)")
    for ax in (ax1, ax2, ax3):
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=7)
    fig.suptitle(f"{one_line(rep.model)}: activation statistics along depth ({rep.images} image(s))", fontsize=10)
    fig.subplots_adjust(left=0.07, right=0.98, top=0.94, bottom=0.08 if few else 0.22 if len(rows) <= 40 else 0.08, hspace=0.12)
    return fig
