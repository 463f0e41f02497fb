"""Raw attention: the probabilities of chosen layers and heads (``--heads``: ``0,3`` or a
fusion ``mean|max|min``), read from one query (``--query``: ``cls``, a token index, or
``mean`` over queries) over the patch keys, on the patch grid. Its maps are per layer and
head (the result's ``raw``), heads picked at the end (:func:`..passes._raw_maps`)."""

from __future__ import annotations

from typing import Any

from inspect_model.methods.attention.base import AttentionMethod, register


@register
class Raw(AttentionMethod):
    name, title, paper, order = "raw", "raw attention", "the attention weights of chosen layers and heads", 10
    text = True
    per_layer = True
    keeps_raw = True
    default_layers = "-1"
    class_independent = True

    def forward(self, st: Any, call: Any) -> None:
        if call.name in st.raw_layers:
            st.raw[call.name] = st.query_rows(call)  # (B, h, Nk)

    def text_forward(self, st: Any, call: Any, probs: Any) -> None:
        if call.name in st.raw_layers:
            st.raw[call.name] = probs.float().cpu()  # (B, h, L, L): every query's row

    def forward_windowed(self, st: Any, call: Any) -> None:
        if call.name in st.raw_layers:  # what each token receives in its window, put back in place
            from inspect_model.methods.attention.windows import unpartition

            rows = call.probs().mean(dim=2)  # (B * windows, heads, N): mean over the window's queries
            st.raw[call.name] = unpartition(rows.float(), st.batch, st.owners[call.name]).cpu()
