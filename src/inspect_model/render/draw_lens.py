"""The pictures of ``lens`` (issue 36). Per text (``images/NNNN-text-i/``):

- ``lens_<site>.png``: a layers x positions map (depth 0, the embeddings, at the bottom; the
  model's own readout at the top), coloured by the probability of the model's final
  prediction at that position (``--show rank``: its rank, log scale, rank 1 brightest), each
  cell titled with the top decoded token; the input tokens below, the model's predictions
  above;
- ``kl.png``: KL(model || lens) by depth, the mean over the text's positions per site and
  the last position dashed.

At the top, ``kl_by_depth.png``: the run's mean KL by depth per site (every text and position).
Drawn from the report's dicts (the drawer reads no method objects).
"""

from __future__ import annotations

import math
from typing import Any

from inspect_model.output.files import image_dir
from inspect_model.output.sink import Drawer, Sink
from inspect_model.render.lens import show_token

MAX_POSITIONS = 40  # positions drawn per map: the last ones (the JSON has every one)
COLOURS = {"resid": "#1f77b4", "attn": "#d62728", "mlp": "#2ca02c"}


def _figure(w: float, h: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def lens_map(text: dict[str, Any], site: str, show: str = "prob", lens: str = "logit") -> Any:
    """The layers x positions map of one text and site (module docstring)."""
    import numpy as np
    from matplotlib.colors import LogNorm, Normalize

    rows = sorted((r for r in text["rows"] if r["site"] == site), key=lambda r: r["depth"])
    n = len(text["tokens"])
    cols = list(range(max(0, n - MAX_POSITIONS), n))
    key = "prob" if show == "prob" else "rank"
    values = np.array([[r[key][c] for c in cols] for r in rows], dtype=float)
    # margins in inches: left (layer names), right (colour bar), bottom (input tokens), top (title, predictions)
    labels = [f"{r['depth']} {_short(r['layer'])}" for r in rows]
    left, right, bottom, top_m = 0.55 + 0.06 * max(map(len, labels), default=10), 1.3, 0.9, 1.25
    w, h = max(6.0, left + right + 0.75 * len(cols)), bottom + top_m + 0.4 * len(rows)
    w, h = min(w, 40.0), min(h, 30.0)
    fig = _figure(w, h)
    ax = fig.add_axes((left / w, bottom / h, 1 - (left + right) / w, 1 - (bottom + top_m) / h))
    if show == "prob":
        norm, cmap, label = Normalize(0.0, 1.0), "Blues", "probability of the model's prediction"
    else:
        top = max(float(values.max()), 2.0) if values.size else 2.0
        norm, cmap, label = LogNorm(1.0, top), "Blues_r", "rank of the model's prediction (1 = top, log scale)"
    im = ax.imshow(values, aspect="auto", origin="lower", cmap=cmap, norm=norm, interpolation="nearest")
    for y, r in enumerate(rows):
        for x, c in enumerate(cols):
            top = r["top"][c][0]["token"] if r["top"][c] else ""
            shade = norm(values[y, x])
            dark = shade > 0.55 if show == "prob" else shade < 0.45
            ax.text(x, y, show_token(top, 9), ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.set_xticks(range(len(cols)), [show_token(text["tokens"][c], 9) for c in cols], fontsize=7, rotation=45,
                  ha="right")
    ax.set_xlabel("input token (position)")
    ax.set_ylabel(f"depth ({site})")
    top_ax = ax.secondary_xaxis("top")
    top_ax.set_xticks(range(len(cols)), [show_token(text["predicted"][c], 9) for c in cols], fontsize=7,
                      rotation=45, ha="left")
    top_ax.set_xlabel("the model's prediction", fontsize=8)
    cut = f", last {len(cols)} of {n} positions" if len(cols) < n else ""
    fig.suptitle(f"{text['image']}: {lens} lens, {site}{cut}\ncells: top decoded token; colour: {label}", fontsize=9,
                 y=1 - 0.08 / h)
    cax = fig.add_axes((1 - (right - 0.15) / w, bottom / h, 0.15 / w, 1 - (bottom + top_m) / h))
    bar = fig.colorbar(im, cax=cax)
    if show != "prob":  # plain rank numbers, not 6 x 10^0
        ticks = [r for r in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10**4, 2 * 10**4, 5 * 10**4, 10**5,
                             2 * 10**5) if r <= norm.vmax] or [1]
        bar.ax.minorticks_off()
        bar.set_ticks(ticks, labels=[str(r) for r in ticks])
    bar.set_label(label, fontsize=7)
    bar.ax.tick_params(labelsize=7)
    return fig


def _short(name: str, width: int = 32) -> str:
    """A module name that keeps its block: ``decoder.block.0.….DenseReluDense``."""
    parts = name.split(".")
    num = next((i for i, p in enumerate(parts) if p.isdigit()), None)
    if num is not None and num < len(parts) - 2:
        name = ".".join([*parts[: num + 1], "…", parts[-1]])
    return name if len(name) <= width else "…" + name[-(width - 1):]


def kl_curve(series: dict[str, tuple[list[int], list[float]]], title: str,
             last: dict[str, tuple[list[int], list[float]]] | None = None) -> Any:
    """KL(model || lens) by depth, one line per site (``last``: the last position, dashed)."""
    fig = _figure(6.4, 4.0)
    ax = fig.add_axes((0.12, 0.14, 0.84, 0.72))
    for site, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", ms=3, color=COLOURS.get(site), label=f"{site}: mean over positions")
    for site, (xs, ys) in (last or {}).items():
        ax.plot(xs, ys, ls="--", color=COLOURS.get(site), alpha=0.7, label=f"{site}: last position")
    ys_all = [y for _, ys in [*series.values(), *(last or {}).values()] for y in ys if math.isfinite(y)]
    if ys_all and max(ys_all) > 0 and max(ys_all) / max(min(y for y in ys_all if y > 0) if any(
            y > 0 for y in ys_all) else 1.0, 1e-12) > 1e3:
        ax.set_yscale("symlog", linthresh=1e-3)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("depth (0: embeddings; i: block i-1's output)")
    ax.set_ylabel("KL(model || lens), nats")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    return fig


def _series(rows: list[dict[str, Any]], pick: Any) -> dict[str, tuple[list[int], list[float]]]:
    out: dict[str, tuple[list[int], list[float]]] = {}
    for r in sorted(rows, key=lambda r: r["depth"]):
        xs, ys = out.setdefault(r["site"], ([], []))
        xs.append(r["depth"])
        ys.append(float(pick(r)))
    return out


class LensDrawer(Drawer):
    """Draws the files of ``lens`` (module docstring)."""

    def __init__(self, *, show: str = "prob", lens: str = "logit") -> None:
        self.show, self.lens = show, lens

    def draw(self, item: Any, sink: Sink) -> dict[str, Any]:
        text = item.data
        if text is None:
            return dict(item.entry.get("files") or {})
        base = image_dir(text["index"], text["image"])
        files: dict[str, Any] = {}
        for site in sorted({r["site"] for r in text["rows"]}, key=list(COLOURS).index):
            files[f"lens_{site}"] = sink.figure(f"{base}/lens_{site}.png", lens_map(text, site, self.show, self.lens))
        mean = _series(text["rows"], lambda r: sum(r["kl"]) / max(len(r["kl"]), 1))
        last = _series(text["rows"], lambda r: r["kl"][-1] if r["kl"] else float("nan"))
        files["kl"] = sink.figure(f"{base}/kl.png", kl_curve(mean, f"{text['image']}: KL to the model's output by "
                                                             "depth", last))
        return {k: v for k, v in files.items() if v is not None}

    def draw_summary(self, sink: Sink, result: Any) -> None:
        layers = result.payload.get("layers") or []
        if layers:
            n = len(result.payload.get("images") or [])
            sink.figure("kl_by_depth.png", kl_curve(_series(layers, lambda r: r["kl"]),
                                                    f"KL to the model's output by depth, mean over {n} text(s)"))
