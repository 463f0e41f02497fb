"""The ``cam --evaluate`` report: faithfulness tables (per image, ranked; and on average)
and the deletion / insertion curve plots. Records (the report's dicts) in, text and
matplotlib figures out; nothing is printed or written here.
"""

from __future__ import annotations

import math
from typing import Any

from inspect_model.render.table import Column
from inspect_model.render.labels import target_label

# (score key, column title): ^ higher is better, v lower is better.
SCORE_COLUMNS = (
    ("deletion", "Del v"), ("insertion", "Ins ^"), ("road_morf", "MoRF v"), ("road_lerf", "LeRF ^"),
    ("road", "ROAD ^"), ("drop", "Drop% v"), ("increase", "Incr% ^"), ("pointing", "Point ^"),
    ("energy", "Energy ^"),
)


def _num(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}f}"


def _keys(scores: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(k, t) for k, t in SCORE_COLUMNS if any(k in s for s in scores)]


def image_tables(rec: dict[str, Any]) -> list[tuple[str, list[Column], list[list[str]]]]:
    """Per target rank of one image: (title, columns, rows), best mean rank first."""
    out = []
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for m in rec["maps"]:
        if "evaluation" in m:
            by_rank.setdefault(m["rank"], []).append(m)
    for rank, maps in sorted(by_rank.items()):
        keys = _keys([m["evaluation"]["scores"] for m in maps])
        cols = [Column("#", "right"), Column("Method"), Column("Layer"), Column("Rank", "right")]
        cols += [Column(t, "right") for _, t in keys]
        maps = sorted(maps, key=lambda m: (m["evaluation"]["rank"] is None, m["evaluation"]["rank"] or 0.0))
        rows = []
        for place, m in enumerate(maps, start=1):
            ev = m["evaluation"]
            rows.append([str(place), m["method"], m["layer"], _num(ev["rank"], 2)]
                        + [_num(ev["scores"].get(k), 1 if k in ("drop", "increase") else 3) for k, _ in keys])
        t = maps[0]["target"]
        target = target_label(t)
        out.append((f"faithfulness, target {target}", cols, rows))
    return out


def average_table(evaluation: dict[str, Any]) -> tuple[list[Column], list[list[str]]]:
    """The methods ranked on their scores averaged over every image."""
    rows_in = evaluation["average"]
    keys = _keys([r["scores"] for r in rows_in])
    cols = [Column("#", "right"), Column("Method"), Column("Layer"), Column("Maps", "right"),
            Column("Rank", "right")] + [Column(t, "right") for _, t in keys]
    rows = []
    for place, r in enumerate(rows_in, start=1):
        rows.append([str(place), r["method"], r["layer"], str(r["maps"]), _num(r["rank"], 2)]
                    + [_num(r["scores"].get(k), 1 if k in ("drop", "increase") else 3) for k, _ in keys])
    return cols, rows


def header(evaluation: dict[str, Any]) -> str:
    return (f"faithfulness: {', '.join(evaluation['metrics'])}; {evaluation['steps']} steps, "
            f"{evaluation['inputs']} perturbed inputs in {evaluation['passes']} forward passes; "
            "^ higher is better, v lower; Rank = mean rank over Del, Ins, ROAD, Drop, Incr, Point, Energy "
            "(1 = best)")


def curves_figure(series: list[dict[str, Any]], title: str) -> Any:
    """Deletion (left) and insertion (right) curves, one line per method @ layer.

    ``series``: dicts with ``label``, ``curves`` (``deletion`` / ``insertion`` lists) and
    ``scores`` (their AUCs, shown in the legend)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), dpi=100)
    axes = fig.subplots(1, 2, sharey=True)
    cmap = matplotlib.colormaps["tab10"]
    styles = ("-", "--", ":", "-.")  # methods that agree draw over each other: keep them apart
    for ax, name, better in ((axes[0], "deletion", "lower is better"), (axes[1], "insertion", "higher is better")):
        for i, s in enumerate(series):
            ys = s["curves"].get(name)
            if not ys:
                continue
            xs = [k / (len(ys) - 1) for k in range(len(ys))]
            auc = s["scores"].get(name)
            ax.plot(xs, ys, color=cmap(i % 10), ls=styles[i % len(styles)], lw=1.6, label=f"{s['label']} (AUC {_num(auc)})")
        ax.set_title(f"{name}: pixels {'removed' if name == 'deletion' else 'inserted'}, most relevant first "
                     f"\n(AUC {better})", fontsize=9)
        ax.set_xlabel(f"fraction of pixels {'removed' if name == 'deletion' else 'inserted'}")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    axes[0].set_ylabel("target class probability")
    from inspect_model.render.table import one_line

    fig.suptitle(one_line(title), fontsize=10)  # names escaped: matplotlib fails on a lone surrogate
    fig.tight_layout()
    return fig


def image_series(rec: dict[str, Any], rank: int = 0) -> list[dict[str, Any]]:
    """The curve series of one image's maps for target ``rank``."""
    return [{"label": f"{m['method']} @ {m['layer']}", "curves": m["evaluation"]["curves"],
             "scores": m["evaluation"]["scores"]}
            for m in rec["maps"] if m["rank"] == rank and "evaluation" in m]


def average_series(evaluation: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"label": f"{r['method']} @ {r['layer']}", "curves": r["curves"], "scores": r["scores"]}
            for r in evaluation["average"]]


def curve_plot_name(entry: dict[str, Any]) -> str:
    """The file of one image's deletion and insertion curves."""
    from inspect_model.output.files import image_dir

    return f"{image_dir(entry['index'], entry['image'])}/evaluation_curves.png"


def draw_average_curves(sink: Any, result: Any) -> None:
    """``evaluation_curves.png``: the run's mean deletion and insertion curves (cam and
    attributions with --evaluate), named in the report's ``evaluation.plots``."""
    ev = result.payload.get("evaluation")
    if ev is None or sink.out is None or not ev["average"]:
        return
    n = result.payload["image_count"]
    name = sink.figure("evaluation_curves.png",
                       curves_figure(average_series(ev), f"deletion and insertion curves, mean over {n} image(s)"))
    ev["plots"] = [name] if name else []
