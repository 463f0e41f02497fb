"""``attention`` refuses what it cannot draw in one line with the unsupported-model exit code
(9), naming what works, never "the model failed while running" (6) (issue 42, item 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli

MODELS = '''
import torch
from torch import nn


class Cross(nn.Module):
    """Tokens attend to two learned queries' worth of keys: cross-attention."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(3, 8)
        self.memory = nn.Parameter(torch.randn(1, 2, 8))
        self.blocks = nn.ModuleList([nn.MultiheadAttention(8, 2, batch_first=True)])
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        t = self.proj(x.flatten(2).transpose(1, 2))  # (B, HW, 8)
        m = self.memory.expand(t.shape[0], -1, -1)
        t = self.blocks[0](t, m, m, need_weights=False)[0]
        return self.head(t.mean(1))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, t):
        return t + self.attn(t, t, t, need_weights=False)[0]


class Plain(nn.Module):
    """Self-attention in a list of blocks, a head no LeGrad family knows."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(3, 8)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        t = self.proj(x.flatten(2).transpose(1, 2))
        for b in self.blocks:
            t = b(t)
        return self.head(t.mean(1))


class Bare(Plain):
    """Attention modules that are the list items themselves (no block around them)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.MultiheadAttention(8, 2, batch_first=True) for _ in range(2)])

    def forward(self, x):
        t = self.proj(x.flatten(2).transpose(1, 2))
        for b in self.blocks:
            t = t + b(t, t, t, need_weights=False)[0]
        return self.head(t.mean(1))
'''


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("refusals") / "attn_models.py"
    p.write_text(MODELS)
    return p


def _refused(args: list[str]) -> str:
    r = run_cli(args + ["--input-size", "3x4x4", "-q"])
    assert r.exit_code == 9 and r.stderr.count("\n") == 1 and "unexpected" not in r.stderr, (r.exit_code, r.stderr)
    return r.stderr


def test_cross_attention_is_an_unsupported_model(models):
    err = _refused(["attention", f"{models}:Cross", "-m", "rollout"])
    assert err == ("error: attention in 'blocks.0' maps 16 queries to 2 keys: these methods need self-attention "
                   "over one token sequence (found cross- or reduced-key attention); cam and attributions take "
                   "this model\n")


def test_legrad_on_a_family_without_a_known_head_is_an_unsupported_model(models):
    err = _refused(["attention", f"{models}:Plain", "-m", "legrad"])
    assert err.startswith("error: legrad needs the model's head to score intermediate tokens, and Plain is not a "
                          "family it knows") and err.endswith("; -m rollout,grad-rollout work\n")
    ok = run_cli(["attention", f"{models}:Plain", "-m", "rollout,grad-rollout", "--input-size", "3x4x4", "-q"])
    assert ok.exit_code == 0, ok.stderr


def test_legrad_without_blocks_is_an_unsupported_model(models):
    err = _refused(["attention", f"{models}:Bare", "-m", "legrad"])
    assert err == ("error: attention module 'blocks.0' is not inside a list of transformer blocks; "
                   "-m raw,rollout,grad-rollout need none\n")
