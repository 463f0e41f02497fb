"""The head grid finds the induction head (issue 36): a 2-layer attention-only Llama (RoPE)
trained here on repeated random token sequences (random length and offset, so that no head can
solve it by position alone: an absolute-position GPT-2 found such shortcuts); the head whose patch restores the answer most must be a head that, by
its attention pattern alone, attends from the last token to the token after the previous
occurrence of that token (Olsson et al. 2022's induction pattern)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

VOCAB, FIRST = 66, 2  # <unk>, <eos>, then the words w0 .. w63


class NoMLP(nn.Module):
    """An attention-only block: the MLP adds nothing to the residual stream."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


def _batch(gen: torch.Generator, n: int, half: int, prefix: int) -> torch.Tensor:
    rows = torch.randint(FIRST, VOCAB, (n, prefix + half), generator=gen)
    return torch.cat([rows, rows[:, prefix:]], dim=1)  # a random prefix, R, then R again


def _trained():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=4, intermediate_size=32, max_position_embeddings=64,
                                   attn_implementation="eager", bos_token_id=1, eos_token_id=1, pad_token_id=0)
    model = transformers.LlamaForCausalLM(cfg)
    for block in model.model.layers:
        block.mlp = NoMLP()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    model.train()
    smooth = 4.0
    for _ in range(4000):
        half, prefix = (int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((4, 10), (0, 4)))
        ids = _batch(gen, 32, half, prefix)
        logits = model(input_ids=ids).logits
        # only the repeated half can be predicted: it predicts its own next token
        loss = nn.functional.cross_entropy(logits[:, prefix + half:-1].reshape(-1, VOCAB),
                                           ids[:, prefix + half + 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        smooth = 0.95 * smooth + 0.05 * float(loss.detach())
        if smooth < 0.4:  # ~0.25 is the floor: random tokens repeat inside a sequence
            break
    return model.eval(), smooth


def _tokenizer(folder):
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<unk>", "<eos>", *[f"w{i}" for i in range(VOCAB - FIRST)]])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    t = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    t.save_pretrained(folder)
    return t


def _attention(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack(model(input_ids=ids, output_attentions=True).attentions)  # (layers, B, H, T, T)


def _induction_scores(model, gen: torch.Generator) -> torch.Tensor:
    """(layers, heads): mean attention from the repeated half to the token after each token's
    previous occurrence, over sequences of random length and offset."""
    total = torch.zeros(2, 4)
    for _ in range(24):
        half, prefix = (int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((4, 10), (0, 4)))
        att = _attention(model, _batch(gen, 1, half, prefix))
        q = torch.arange(prefix + half, prefix + 2 * half - 1)
        total += att[:, 0, :, q, q - half + 1].mean(-1)
    return total / 24


@pytest.mark.slow  # trains for ~10-40 s of CPU time
def test_top_head_of_the_grid_is_an_induction_head(tmp_path) -> None:
    import inspect_model as im

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest on a shared machine
    try:
        model, loss = _trained()
    finally:
        torch.set_num_threads(threads)
    assert loss < 0.4, f"the model did not learn to repeat (loss {loss:.3f})"
    tok = _tokenizer(tmp_path / "tok")
    gen = torch.Generator().manual_seed(7)
    scores = _induction_scores(model, gen)
    assert float(scores.max()) > 0.3 and float(scores.min()) < 0.1, scores  # some heads do it, some do not
    words = tok.convert_ids_to_tokens
    for _ in range(3):
        half, prefix = 7, 2
        seq = _batch(gen, 2, half, prefix)
        clean = seq[0, :-1]  # ..., R, then R without its last token: the answer is R's last token
        corrupt = torch.cat([seq[1, :prefix + half], seq[0, prefix + half:-1]])  # another R first: nothing to copy
        res = im.patch(model, clean=" ".join(words(clean.tolist())), corrupt=" ".join(words(corrupt.tolist())),
                       metric=f"logprob:{words(int(seq[0, -1]))}", sites="head", tokenizer=str(tmp_path / "tok"))
        pair = res.record.pairs[0]
        assert pair.clean_value > pair.corrupt_value + 1.0  # the clean prompt predicts the answer, the corrupted not
        top = pair.sites[0].top
        # independently: on this prompt, from the last token to the token after its previous occurrence
        att = _attention(model, clean[None])[:, 0, :, -1, prefix + half - 1]  # (layers, heads)
        assert float(att[top.layer, top.index]) >= 0.5 * float(att.max()), (att, pair.sites[0].normalised)
        assert float(scores[top.layer, top.index]) > 0.3, (scores, pair.sites[0].normalised)
        assert top.normalised > 0.3
