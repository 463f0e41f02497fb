"""Which columns ``report.html`` shows first, per command: the columns of that command's
``report.txt`` (name, type, the key statistics), in its order (issue 29: the page showed the
first 14 JSON keys in alphabetical order, for ``grads`` without a layer name). Every other
value of a row is still on the page, behind the "all columns" toggle.

A table is ``(title, rows, columns)``: ``rows`` are the JSON records, ``columns`` are
``(header, getter)`` pairs; a getter takes a record and returns the cell's value (numbers
stay numbers, so the page sorts them as numbers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from inspect_model.render.labels import target_label

Getter = Callable[[dict[str, Any]], Any]
Columns = list[tuple[str, Getter]]


def _reads(get: Getter, *path: str) -> Getter:
    get.reads = ".".join(path)  # type: ignore[attr-defined]  # the JSON key shown: not repeated
    return get


def at(*path: str) -> Getter:
    """The value at ``path`` in a record (None where a step is missing)."""
    def get(rec: dict[str, Any]) -> Any:
        v: Any = rec
        for p in path:
            v = v.get(p) if isinstance(v, dict) else None
        return v
    return _reads(get, *path)


def pct(*path: str) -> Getter:
    def get(rec: dict[str, Any]) -> Any:
        v = at(*path)(rec)
        return None if not isinstance(v, (int, float)) or isinstance(v, bool) else round(100.0 * v, 1)
    return _reads(get, *path)


def shape(*path: str) -> Getter:
    def get(rec: dict[str, Any]) -> Any:
        v = at(*path)(rec)
        if isinstance(v, list) and v and all(isinstance(s, list) for s in v):
            return ", ".join("x".join(map(str, s)) for s in v)
        return "x".join(map(str, v)) if isinstance(v, list) else v
    return _reads(get, *path)


def _nonfinite(*stats: str) -> Getter:
    def get(rec: dict[str, Any]) -> Any:
        parts = [rec.get(s) for s in stats]
        return sum((p.get("nan_count") or 0) + (p.get("inf_count") or 0) for p in parts if isinstance(p, dict))
    return get


def _target(rec: dict[str, Any]) -> Any:
    t = rec.get("target") or {}
    return target_label(t) if t.get("label") else t.get("class")


def _layer_name(rec: dict[str, Any]) -> Any:
    name = rec.get("key", rec.get("name"))
    return "(model)" if name == "" else name


SUMMARY: Columns = [("Layer", _layer_name), ("Type", at("type")), ("Output shape", shape("output_shapes")),
                    ("Params", at("params")), ("Trainable", at("trainable")), ("MACs", at("macs"))]
ACTIVATIONS: Columns = [
    ("Layer", _layer_name), ("Type", at("type")), ("Output shape", shape("shape")), ("Mean", at("stats", "mean")),
    ("Std", at("stats", "std")), ("Min", at("stats", "min")), ("Max", at("stats", "max")),
    ("Zero %", pct("stats", "zero_fraction")), ("Neg %", pct("stats", "negative_fraction")),
    ("Dead ch", lambda r: f"{r.get('dead_channels')}/{r.get('channels')}" if r.get("channels") else None),
    ("NaN/Inf", lambda r: (at("stats", "nan_count")(r) or 0) + (at("stats", "inf_count")(r) or 0)),
]
GRAD_LAYERS: Columns = [
    ("layer", _layer_name), ("type", at("type")), ("output shape", shape("output_shape")),
    ("|grad wrt output|", at("grad_wrt_output", "norm")), ("mean |g| out", at("grad_wrt_output", "abs_mean")),
    ("max |g| out", at("grad_wrt_output", "max_abs")), ("rel. norm", at("relative_norm")),
    ("|grad wrt input|", at("grad_wrt_input", "norm")), ("non-finite", _nonfinite("grad_wrt_output", "grad_wrt_input")),
]
GRAD_PARAMS: Columns = [
    ("parameter", at("name")), ("shape", shape("shape")), ("grad norm", at("norm")), ("mean", at("mean")),
    ("std", at("std")), ("max |g|", at("max_abs")), ("zeros %", pct("zero_fraction")),
    ("neg %", pct("negative_fraction")), ("grad/weight", at("grad_to_weight_ratio")),
]
GRAD_CHECKS: Columns = [("check", at("name")), ("status", at("status")), ("value", at("value")),
                        ("threshold", at("threshold")), ("detail", at("detail"))]
CHECK: Columns = [("Check", at("name")), ("Status", at("status")), ("Value", at("value")),
                  ("Expected", at("expected_text")), ("Detail", at("detail"))]
CAM_MAPS: Columns = [
    ("Image", at("image")), ("Method", at("method")), ("Layer", at("layer")), ("Target", _target),
    ("Prob", at("target", "probability")), ("Raw min", at("raw_min")), ("Raw max", at("raw_max")),
    ("Note", lambda r: "; ".join(r.get("warnings") or []) or ("class-independent" if r.get("class_independent")
                                                              else "")),
]
GUIDED_MAPS: Columns = [("Image", at("image")), ("Target", _target), ("Score", at("target", "score")),
                        ("max|g|", at("max_abs")), ("mean|g|", at("mean_abs")), ("Nonzero %", pct("nonzero_fraction"))]
ATTENTION_MAPS: Columns = [
    ("Image", at("image")), ("Method", at("method")), ("Layer", at("layer")), ("Target", _target),
    ("Prob", at("target", "probability")), ("Min", at("min")), ("Max", at("max")),
    ("Peak", lambda r: r.get("peak_token", r.get("peak_cell"))),
]
ATTRIBUTION_MAPS: Columns = [
    ("Image", at("image")), ("Target", _target), ("Method", at("method")), ("Score", at("target", "score")),
    ("Prob", at("target", "probability")), ("Positive", at("positive_mass")), ("Negative", at("negative_mass")),
    ("Sum", at("sum")), ("Gap", at("completeness_gap")),
]
GENERATION_MAPS: Columns = [  # attributions --generate (issue 36): one row per generated token and method
    ("Text", at("image")), ("Step", lambda r: r.get("rank", 0) + 1), ("Token", at("target", "label")),
    ("Method", at("method")), ("p", at("target", "probability")), ("Score", at("target", "score")),
    ("Sum", at("sum")), ("Gap", at("completeness_gap")),
]
GENERIC: Columns = [("Name", lambda r: r.get("key", r.get("name", r.get("image")))),
                    ("Type", lambda r: r.get("type", r.get("kind")))]


def _maps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"image": i.get("image"), **m} for i in doc.get("images") or [] if isinstance(i, dict)
            for m in i.get("maps") or []]


def summary_tables(doc: dict[str, Any]) -> list[Any]:
    return [("Layers", doc.get("layers") or [], SUMMARY)]


def activations_tables(doc: dict[str, Any]) -> list[Any]:
    return [("Layers", doc.get("layers") or [], ACTIVATIONS)]


def grads_tables(doc: dict[str, Any]) -> list[Any]:
    if not doc.get("layers"):
        return []
    return [("Layers (gradient wrt the layer's output, and wrt its input through this layer only)",
             doc.get("layers") or [], GRAD_LAYERS),
            ("Parameters", doc.get("params") or [], GRAD_PARAMS), ("Checks", doc.get("checks") or [], GRAD_CHECKS)]


def check_tables(doc: dict[str, Any]) -> list[Any]:
    return [("Checks", doc.get("checks") or [], CHECK)]


def cam_tables(doc: dict[str, Any]) -> list[Any]:
    return [("Maps (one row per image, target, method and layer)", _maps(doc), CAM_MAPS)]


def attributions_tables(doc: dict[str, Any]) -> list[Any]:
    if any(isinstance(i, dict) and i.get("generation") for i in doc.get("images") or []):
        return [("Generated tokens (one row per token and method; score: what the row explains)", _maps(doc),
                 GENERATION_MAPS)]
    return [("Maps (one row per image, target and method)", _maps(doc), ATTRIBUTION_MAPS)]


def attention_tables(doc: dict[str, Any]) -> list[Any]:
    return [("Maps (one row per image or text, method and layer)", _maps(doc), ATTENTION_MAPS)]


def guided_tables(doc: dict[str, Any]) -> list[Any]:
    return [("Maps (one row per image and target)", _maps(doc), GUIDED_MAPS)]


def tables(doc: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]], Columns]]:
    """The tables of a document (its command's registry entry names them), the main one
    first; empty ones left out."""
    from inspect_model.registry import COMMANDS

    spec = COMMANDS.get(str(doc.get("command")))
    made = spec.tables(doc) if spec is not None and spec.tables is not None else []
    out: list[tuple[str, list[dict[str, Any]], Columns]] = [(t, rows, cols) for t, rows, cols in made if rows]
    if not out:  # another command, or another mode (grads --of/--wrt): the generic table
        maps = _maps(doc)
        if maps:
            out.append(("Maps (one row per image, target, method and layer)", maps, GENERIC))
        for key, title in (("layers", "Layers"), ("checks", "Checks"), ("params", "Parameters"),
                           ("jacobians", "Jacobians"), ("images", "Images"), ("models", "Models")):
            items = doc.get(key)
            if not maps and isinstance(items, list) and items and isinstance(items[0], dict):
                out.append((title, items, GENERIC))
                break
    return [(t, [r for r in rows if isinstance(r, dict)], cols) for t, rows, cols in out if rows]


def headline(doc: dict[str, Any]) -> list[str]:
    """The lines report.txt prints above its table (totals, the objective), as page text."""
    def num(v: Any, spec: str = ",") -> str:
        return "-" if v is None else format(v, spec)

    command = doc.get("command")
    if command == "summary" and doc.get("total_params") is not None:
        return [f"Total params: {num(doc.get('total_params'))} (trainable {num(doc.get('trainable_params'))}, "
                f"frozen {num(doc.get('frozen_params'))})", f"Total MACs: {num(doc.get('total_macs'))}"]
    if command == "grads" and doc.get("objective"):
        return [f"Gradients of: {doc['objective']}",
                f"global parameter gradient norm: {num(doc.get('global_grad_norm'), '.6g')}; "
                f"output gradient norm: {num(doc.get('output_grad_norm'), '.6g')}"]
    return []
