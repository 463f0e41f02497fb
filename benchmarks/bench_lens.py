"""``lens`` on a resident model against what it cannot avoid (issue 36): one forward pass plus
the unembedding (final norm + lm_head) of every layer's states, measured in the same process.

    python benchmarks/bench_lens.py [--batch 4] [--tokens 64] [--layers 6] [--vocab 8192] [--repeats 3] [--threads 1]

A GPT-2 of width 384 (random weights) over a batch of random token ids. Floor:
``model(ids, output_hidden_states=True)`` and ``lm_head(ln_f(h))`` for each of the L+1
hidden states, under ``torch.no_grad()``. Ours: ``LensSession.feed`` on the same batch, the
whole per-batch work of the command (the hook engine's capture, the readout of every depth,
softmax, probability and rank of the prediction, entropy, KL to the model, top-k, and the
per-text records), without tokenising, drawing or writing. Target: <= 1.3x. On the shared
2-core machine run it as ``benchmarks/run.py --only lens --clock cpu --threads 1`` (CPU time
of the process, one torch thread: other people's jobs do not count).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

TITLE = "lens"
SIZES = {"full": (4, 64, 6, 8192), "quick": (2, 64, 6, 8192), "smoke": (1, 8, 2, 256)}  # batch, tokens, layers, vocab


class _Tokenizer:
    """Token names without a tokenizer file (``t<id>``): what LensSession asks of one."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def __len__(self) -> int:
        return self.vocab

    def batch_decode(self, ids: list[list[int]]) -> list[str]:
        return [f"t{i[0]}" for i in ids]

    def convert_ids_to_tokens(self, i: int) -> str:
        return f"t{i}"


def setup(batch: int, tokens: int, layers: int, vocab: int) -> tuple[Any, Any, Any, Any]:
    """(model, the floor, ours, the session) for one batch."""
    import torch
    import transformers

    from inspect_model.api.lens import LensRequest, LensSession
    from inspect_model.loading.text import TextBatch

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=vocab, n_embd=384, n_layer=layers, n_head=6, n_positions=max(tokens, 64))
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(0))
    texts = [f"text {i}" for i in range(batch)]
    prep = SimpleNamespace(loaded=SimpleNamespace(model=model), binding=None,
                           plan=SimpleNamespace(texts=texts, tokenizer=_Tokenizer(vocab), skipped=[], warnings=[]))
    session = LensSession(prep, None, LensRequest(top_k=5))  # type: ignore[arg-type]
    batch_ = SimpleNamespace(tensor=ids, names=[f"text-{i}" for i in range(batch)],
                             text=TextBatch(torch.ones_like(ids), [["t"] * tokens] * batch, texts))

    def floor() -> None:
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
            for h in out.hidden_states:
                model.lm_head(model.transformer.ln_f(h))

    def ours() -> None:
        session.entries.clear()
        session.feed(batch_)

    return model, floor, ours, session


def measure(ctx):  # type: ignore[no-untyped-def]
    from common import Row, Target

    batch, tokens, layers, vocab = SIZES[ctx.mode]
    _, floor, ours, session = setup(batch, tokens, layers, vocab)
    with session:
        t = ctx.time({"floor": floor, "ours": ours})
    return [Row(TITLE, f"lens, GPT-2 {layers}x384, vocab {vocab}, {batch}x{tokens} tokens, resid, top-5", t["ours"],
                t["floor"], Target("ratio", 1.3, "<= 1.3x forward + unembedding of every layer"),
                floor_what=f"forward + {layers + 1} unembeddings")]


def main() -> None:
    import time

    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    _, floor, ours, session = setup(args.batch, args.tokens, args.layers, args.vocab)
    runs: dict[str, list[float]] = {"floor": [], "ours": []}
    with session:
        floor(), ours()  # warm-up
        for _ in range(args.repeats):
            for name, fn in (("floor", floor), ("ours", ours)):
                t0 = time.process_time()
                fn()
                runs[name].append(time.process_time() - t0)
    f, o = min(runs["floor"]), min(runs["ours"])
    print(f"floor (forward + {args.layers + 1} unembeddings): {f * 1e3:.1f} ms CPU; lens: {o * 1e3:.1f} ms CPU; "
          f"ratio {o / f:.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    main()
