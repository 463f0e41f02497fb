"""``attention --text``: the text half of :class:`~inspect_model.api.attention.AttentionSession`
(issue 26). A batch of texts runs :func:`~inspect_model.methods.attention.text.compute_text_attention`;
each text's report entry carries its tokens (``text``) and, per map, the per-token
``values`` (raw: one row per head shown, the query token's attention)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inspect_model.errors import UsageError
from inspect_model.methods.attention.base import map_layer


@dataclass
class TextItem:
    """What the drawer needs of one text: the batch's result and the text's row in it."""

    result: Any
    index: int


def feed_text(session: Any, batch: Any) -> list[Any]:
    """Run one batch of texts; the session's entries and items as ``feed`` makes them."""
    from inspect_model.run.session import ImageItem
    from inspect_model.methods.attention.text import compute_text_attention

    if session.evaluator is not None:
        raise UsageError("--evaluate scores maps over images; drop it with --text")
    model = session.prep.loaded.model
    mask = batch.text.mask
    res = compute_text_attention(model, batch.tensor, mask, session.options, target=session.spec,
                                 forward=model)  # the text binding adds the mask (loading/text.py)
    if session.info is None:
        session.info = {"layers": res.layers, "heads": res.heads, "tokens": int(batch.tensor.shape[1]),
                        "prefix_tokens": 0, "grid": [], "windowed": False, "causal": res.causal, "text": True,
                        "passes_per_batch": dict(res.passes)}
    session.info["tokens"] = max(session.info["tokens"], int(batch.tensor.shape[1]))
    if session.keep_maps:
        session.text_maps.append(res)
    items = []
    for i in range(batch.tensor.shape[0]):
        entry = text_entry(session, session.index_base + len(session.entries), batch, res, i)
        session.entries.append(entry)
        items.append(ImageItem(entry, TextItem(res, i)))
    return items


def token_batch(batch: Any, model: Any) -> Any:
    """A batch of token ids given without texts (``--input-size input_ids=8:int64:0-100``) as a
    text batch whose every token is real and named by its id; None for any other batch
    (issue 42: such ids went down the image path, "only Tensors of floating point dtype can
    require gradients", or their flattened (position x vocabulary) argmax was the target)."""
    import dataclasses

    import torch

    from inspect_model.loading.text import TextBatch

    x = batch.tensor
    if getattr(batch, "text", None) is not None or not isinstance(x, torch.Tensor) or x.dim() != 2 \
            or x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        return None
    if not callable(getattr(model, "get_input_embeddings", None)) or model.get_input_embeddings() is None:
        return None
    tokens = [[str(int(t)) for t in row] for row in x.tolist()]
    return dataclasses.replace(batch, text=TextBatch(torch.ones_like(x), tokens, [" ".join(r) for r in tokens]))


def _target(res: Any, i: int, categories: Any) -> dict[str, Any] | None:
    from inspect_model.methods.objectives.targets import class_probabilities
    from inspect_model.methods.objectives.rows import target_fields

    if res.targets is None or res.scores is None:
        return None
    cls = int(res.targets[i])
    prob = float(class_probabilities(res.scores[i:i + 1])[0, cls])
    return {**target_fields(cls, categories), "probability": prob}


def text_entry(session: Any, index: int, batch: Any, res: Any, i: int) -> dict[str, Any]:
    """One text's report entry (module docstring)."""
    n, q = res.lengths[i], res.queries[i]
    target = _target(res, i, session.prep.categories)
    maps: list[dict[str, Any]] = []
    for method, v in res.values.items():
        row = v[i, :n]
        if float(row.max()) == float(row.min()):
            session.warnings.add(f"{method}: the values of {batch.names[i]} are constant ({float(row.max()):.3g}): "
                                 "nothing to show")
        layer = map_layer(method, session.options.layers, "all")
        rest = row.clone()
        if n > 1:
            rest[q] = float("-inf")  # the query's own share is the identity's in both rollouts
        maps.append({"method": method, "layer": layer, "target": target, "rank": 0, "peak_token": int(rest.argmax()),
                     "max": float(row.max()), "min": float(row.min()), "values": [float(x) for x in row],
                     "files": {}})
    for layer, a in res.raw.items():
        rows = a[i, :, q, :n]  # (heads shown, n): the query token's attention
        maps.append({"method": "raw", "layer": layer, "target": None, "heads": res.head_labels[layer],
                     "query": f"token {q}", "grid": [n, n], "max": float(a[i, :, :n, :n].max()),
                     "min": float(a[i, :, :n, :n].min()), "values": [[float(x) for x in r] for r in rows],
                     "files": {}})
    return {"index": index, "image": batch.names[i], "target": target, "maps": maps, "files": {},
            "text": {"text": batch.text.texts[i], "tokens": batch.text.tokens[i], "query": q, "causal": res.causal}}


class TextRecord:
    """What the API result adds for Python users of a text run: per text, its tokens and the
    per-token values and matrices (cropped to its real tokens)."""

    def __init__(self, parts: list[Any]) -> None:
        self.texts: list[dict[str, Any]] = []
        for res in parts:
            for i, n in enumerate(res.lengths):
                self.texts.append({"values": {k: v[i, :n] for k, v in res.values.items()},
                                   "matrices": {k: v[i, :n, :n] for k, v in res.matrices.items()},
                                   "raw": {k: v[i, :, :n, :n] for k, v in res.raw.items()},
                                   "query": res.queries[i], "target": None if res.targets is None
                                   else res.targets[i]})
        self.maps: dict[str, Any] = {}
        self.raw: dict[str, Any] = {}
        self.grid = None
