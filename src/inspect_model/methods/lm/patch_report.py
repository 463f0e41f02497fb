"""What a ``patch`` report says beside its numbers (issue 36): the sites' names, the modes,
the normalisation, the strongest cell. The records are in reports/patch.py."""

from __future__ import annotations

from typing import Any

from inspect_model.reports.patch import PatchTopCell

#: TransformerLens's names of the sites (what each grid writes).
HOOK_NAMES = {"resid": "blocks.{L}.hook_resid_post", "attn": "blocks.{L}.hook_attn_out",
              "mlp": "blocks.{L}.hook_mlp_out", "head": "blocks.{L}.attn.hook_z"}
MODES = {"denoise": "clean activations written into the corrupted run",
         "noise": "corrupted activations written into the clean run",
         "trace": "clean states restored into the run with noise on the subject's embeddings (causal tracing)"}


NORMALISATION = "(metric - corrupt) / (clean - corrupt): the clean run is 1 and the corrupted run 0 in every mode"


def top_cell(raw: list[list[float]], norm: list[list[float | None]], labels: list[str], lowest: bool
             ) -> PatchTopCell | None:
    cells = [(v, layer, i) for layer, row in enumerate(norm) for i, v in enumerate(row) if v is not None]
    if not cells:
        return None
    v, layer, i = (min if lowest else max)(cells)
    return PatchTopCell(layer=layer, index=i, label=labels[i], normalised=v, raw=raw[layer][i])

