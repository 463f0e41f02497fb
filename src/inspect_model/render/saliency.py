"""Saliency maps as images, and the guided-backprop report as text or rich table (formatted
from its typed records, :class:`~inspect_model.reports.guided_backprop.GuidedBackpropReport`).

Pure functions: tensors or records in, numpy arrays / PIL images / figures / strings
out; nothing is written here. Display follows the usual recipe for gradient images
(standardise, scale the std to 0.1, shift by 0.5, clip to [0, 1]); the grayscale magnitude
is the channel sum of |g| scaled by its 99th percentile (SmoothGrad's clipping, Smilkov et
al. 2017), so a few extreme pixels do not wash the rest out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from inspect_model.render.labels import target_label
from inspect_model.render.table import Column, one_line, plain_table, rich_table, warning_text
from inspect_model.reports.base import ABSENT
from inspect_model.reports.guided_backprop import GuidedBackpropReport

if TYPE_CHECKING:
    import numpy as np
    import torch
    from PIL import Image


def is_image_map(grad: torch.Tensor) -> bool:
    """True for (C, H, W) gradients that can be shown as a picture."""
    return grad.dim() == 3 and grad.shape[-1] > 1 and grad.shape[-2] > 1


def normalise_for_display(grad: torch.Tensor) -> np.ndarray:
    """(C, H, W) gradient to an (H, W, C) float array in [0, 1]:
    ``clip((g - mean) / (std + 1e-5) * 0.1 + 0.5, 0, 1)`` over the whole map."""
    import numpy as np

    g = grad.detach().double().cpu().numpy()
    g = (g - g.mean()) / (g.std() + 1e-5) * 0.1 + 0.5
    return np.clip(g, 0.0, 1.0).transpose(1, 2, 0)


def magnitude(grad: torch.Tensor) -> np.ndarray:
    """(C, H, W) gradient to an (H, W) array in [0, 1]: sum over channels of |g| divided by
    its 99th percentile (by the maximum when that is 0), clipped."""
    import numpy as np

    m = grad.detach().double().abs().sum(0).cpu().numpy()
    scale = float(np.percentile(m, 99))
    if scale <= 0:
        scale = float(m.max())
    return np.clip(m / scale, 0.0, 1.0) if scale > 0 else np.zeros_like(m)


def _to_uint8(a: np.ndarray) -> np.ndarray:
    import numpy as np

    return np.round(a * 255.0).astype(np.uint8)


def display_image(grad: torch.Tensor) -> Image.Image:
    """The display-normalised gradient as a PIL image at the input's resolution: RGB for 3
    channels, grayscale for 1 (other channel counts: their mean, grayscale)."""
    from PIL import Image

    arr = normalise_for_display(grad)
    if arr.shape[2] == 3:
        return Image.fromarray(_to_uint8(arr), mode="RGB")
    return Image.fromarray(_to_uint8(arr.mean(2)), mode="L")


def magnitude_image(grad: torch.Tensor) -> Image.Image:
    from PIL import Image

    return Image.fromarray(_to_uint8(magnitude(grad)), mode="L")


def input_image(x: torch.Tensor, mean: Any = None, std: Any = None) -> Image.Image:
    """An input (C, H, W) as the model saw it: normalisation undone when ``mean``/``std``
    are known, else min-max scaled."""
    import numpy as np
    from PIL import Image

    a = x.detach().double().cpu().numpy()
    c = a.shape[0]
    if mean is not None and std is not None and len(mean) in (1, c) and len(std) in (1, c):
        a = a * np.asarray(std, dtype=np.float64).reshape(-1, 1, 1) + np.asarray(mean).reshape(-1, 1, 1)
    else:
        lo, hi = a.min(), a.max()
        a = (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)
    a = np.clip(a, 0.0, 1.0).transpose(1, 2, 0)
    if c == 3:
        return Image.fromarray(_to_uint8(a), mode="RGB")
    return Image.fromarray(_to_uint8(a.mean(2)), mode="L")


def overview_figure(input_img: Image.Image | None, rows: list[tuple[str, list[tuple[str, Image.Image]]]]) -> Any:
    """One figure per image: the input, then one row per target with its maps, titled.
    ``rows``: ``[(target label, [(panel title, image), ...]), ...]``. Fixed size per panel."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    ncols = 1 + max(len(panels) for _, panels in rows)
    fig = Figure(figsize=(2.4 * ncols, 2.6 * len(rows)), dpi=100)
    axes = fig.subplots(len(rows), ncols, squeeze=False)
    for r, (label, panels) in enumerate(rows):
        ax = axes[r][0]
        if input_img is not None and r == 0:
            ax.imshow(input_img, cmap="gray" if input_img.mode == "L" else None)
            ax.set_title("input (model view)", fontsize=8)
        ax.set_ylabel(one_line(label), fontsize=8)  # names escaped: matplotlib fails on a lone surrogate
        for c in range(1, ncols):
            axc = axes[r][c]
            if c - 1 < len(panels):
                title, img = panels[c - 1]
                axc.imshow(img, cmap="gray" if img.mode == "L" else None, vmin=0, vmax=255)
                axc.set_title(one_line(title), fontsize=8)
        for a in axes[r]:
            a.set_xticks([])
            a.set_yticks([])
            for s in a.spines.values():
                s.set_visible(a.has_data())
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ the report
MAP_COLUMNS = (
    Column("Image"),
    Column("Target"),
    Column("Prob", "right"),
    Column("Score", "right"),
    Column("max|g|", "right"),
    Column("mean|g|", "right"),
    Column("Nonzero", "right"),
)
SANITY_COLUMNS = (
    Column("Randomised"),
    Column("Down to"),
    Column("rho", "right"),
    Column("rho |g|", "right"),
)


def _num(v: Any, fmt: str = ".4g") -> str:
    return "nan" if v is None else format(v, fmt)


def report_of(payload: Mapping[str, Any] | GuidedBackpropReport) -> GuidedBackpropReport:
    """The report's typed records (a ``--json`` document or a result's payload is read into them)."""
    return payload if isinstance(payload, GuidedBackpropReport) else GuidedBackpropReport.from_dict(payload)


def map_rows(report: GuidedBackpropReport) -> list[list[str]]:
    rows = []
    for img in report.images:
        for m in img.maps:
            t = m.target
            prob = None if t.probability is ABSENT else t.probability  # absent or null: "--"
            rows.append([img.image, target_label(t), "--" if prob is None else f"{prob:.3f}", _num(t.score),
                         _num(m.max_abs), _num(m.mean_abs), f"{100.0 * m.nonzero_fraction:.1f}%"])
    return rows


def sanity_rows(report: GuidedBackpropReport) -> list[list[str]]:
    san = report.sanity
    if not san:
        return []
    return [[f"top {s.randomized} of {len(san.layers)}", s.down_to, _num(s.spearman_mean, ".3f"),
             _num(s.spearman_abs_mean, ".3f")] for s in san.steps]


def sites_line(report: GuidedBackpropReport) -> str:
    sites = report.sites
    text = ", ".join(f"{k} x{v}" for k, v in sites.items()) if sites else "none"
    line = f"Guided activation sites (one backward pass): {text}"
    if report.unguided_sites:
        line += "; not guided: " + ", ".join(f"{k} x{v}" for k, v in report.unguided_sites.items())
    return line


def render_text(payload: Mapping[str, Any] | GuidedBackpropReport) -> str:
    report = report_of(payload)
    parts = [f"guided-backprop: {one_line(report.model)}", sites_line(report)]
    if report.guided_gradcam:
        parts.append(f"Guided Grad-CAM layer: {report.guided_gradcam.layer}")
    parts += ["", plain_table(MAP_COLUMNS, map_rows(report))]
    if report.sanity:
        title = ("Sanity check: cascading weight randomisation from the top; Spearman rank correlation "
                 "with the original maps (mean over maps; near 1 = the map ignores the weights)")
        parts += ["", title, plain_table(SANITY_COLUMNS, sanity_rows(report))]
    parts += ["", *(f"note: {n}" for n in report.notes), *warning_text(report)]
    return "\n".join(parts) + "\n"


def render_rich(payload: Mapping[str, Any] | GuidedBackpropReport) -> list[Any]:
    report = report_of(payload)
    out: list[Any] = [sites_line(report)]
    if report.guided_gradcam:
        out.append(f"Guided Grad-CAM layer: {report.guided_gradcam.layer}")
    out.append(rich_table(MAP_COLUMNS, map_rows(report), title=f"guided-backprop: {report.model}"))
    if report.sanity:
        out.append(rich_table(SANITY_COLUMNS, sanity_rows(report),
                              title="Sanity check: Spearman rank correlation with the original maps"))
    out.extend(f"note: {n}" for n in report.notes)
    out.extend(warning_text(report))
    return out
