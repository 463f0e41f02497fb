"""Benchmark the attention methods on a text model against its own passes, in one process.

    python benchmarks/bench_attention_text.py [--model gpt2|bert] [--batch 4] [--tokens 128] [--repeats 3]

A GPT-2 (or BERT) of 6 layers, width 384, 6 heads, random weights, on ``sdpa`` (the
default), over a batch of random token ids with the last quarter of every other text padded.
Baselines: forward (``model(ids, mask)`` under ``torch.no_grad()``) and forward+backward (the
gradient of the explained score at the input embeddings' output). Measured: ``raw`` (last
layer) and ``rollout`` against the forward, ``grad-rollout`` and ``legrad`` against the
forward+backward; CPU time of the process, best of ``--repeats``, runs interleaved.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import best


def build(kind: str, tokens: int) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "bert":
        cfg = transformers.BertConfig(vocab_size=1000, hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                                      intermediate_size=1536, max_position_embeddings=max(tokens, 128))
        return transformers.BertForSequenceClassification(cfg).eval()
    cfg = transformers.GPT2Config(vocab_size=1000, n_embd=384, n_layer=6, n_head=6, n_positions=max(tokens, 128))
    return transformers.GPT2LMHeadModel(cfg).eval()


def main() -> None:
    import torch

    from inspect_model.methods.attention.maps import AttentionOptions
    from inspect_model.methods.attention.text import compute_text_attention

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2", choices=("gpt2", "bert"))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave it)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build(args.model, args.tokens)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (args.batch, args.tokens), generator=g)
    mask = torch.ones_like(ids)
    mask[1::2, args.tokens * 3 // 4:] = 0
    last = mask.sum(1) - 1

    def forward() -> None:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)

    def forward_backward() -> None:
        flags = [p.requires_grad for p in model.parameters()]
        for p in model.parameters():
            p.requires_grad_(False)
        leaf: list[Any] = []
        emb = model.get_input_embeddings()
        h = emb.register_forward_hook(lambda _m, _a, out: leaf.append(out.detach().requires_grad_(True)) or leaf[-1])
        try:
            y = model(input_ids=ids, attention_mask=mask).logits
            y = y[torch.arange(y.shape[0]), last] if y.dim() == 3 else y
            torch.autograd.grad(y.gather(1, y.argmax(1, keepdim=True)).sum(), leaf[0])
        finally:
            h.remove()
            for p, f in zip(model.parameters(), flags, strict=True):
                p.requires_grad_(f)

    def method(name: str) -> Any:
        opts = AttentionOptions(methods=(name,))
        return lambda: compute_text_attention(model, ids, mask, opts)

    fns = {"forward": forward, "raw": method("raw"), "rollout": method("rollout"),
           "forward+backward": forward_backward, "grad-rollout": method("grad-rollout"), "legrad": method("legrad")}
    times = best(fns, args.repeats)
    print(f"{args.model} (6 layers, width 384), sdpa, batch {args.batch} x {args.tokens} tokens (half padded to 3/4), "
          f"{torch.get_num_threads()} thread(s), best of {args.repeats}")
    for name, t in times.items():
        base = "forward" if name in ("forward", "raw", "rollout") else "forward+backward"
        print(f"  {name:<18} {t:8.3f} s  {t / times[base]:5.2f}x {base}")


if __name__ == "__main__":
    main()
