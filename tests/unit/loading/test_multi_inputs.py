"""Every command on models that take more than one float image (issue 14): two inputs,
keyword (dict) inputs, integer token ids. Images (or the random input) feed the input named
by --image-input (default: the first); the others come from --input-size or --inputs-file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from fixtures.invariants import assert_same, register_model, snapshot


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.side = nn.Linear(5, 4)
        self.fc = nn.Linear(4, 3)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.conv(a)).mean((2, 3)) + self.side(b)
        return self.fc(h)


class KeywordInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(4, 3)

    def forward(self, *, pixels: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.relu(self.conv(pixels)) * scale[:, :, None, None]
        return {"logits": self.fc(h.mean((2, 3)))}


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(8, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.embed(input_ids)) * attention_mask[..., None]
        return self.fc(h.sum(1))


CASES = {
    "two-inputs": (TwoInputs, ["--input-size", "3x8x8", "--input-size", "5"]),
    "keywords": (KeywordInputs, ["--input-size", "pixels=3x8x8", "--input-size", "scale=4"]),
    "token-ids": (TokenModel, ["--input-size", "input_ids=6:int64:0-50",
                               "--input-size", "attention_mask=6:int64:0-2"]),
}
COMMANDS = {
    "summary": [], "activations": [], "grads": [], "check": [],
    "cam": ["--layer", "relu"], "guided-backprop": [],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(CASES))
def test_every_command_runs_on_models_with_several_inputs(case: str, command: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, cli) -> None:
    cls, sizes = CASES[case]
    model = cls()
    spec = register_model(monkeypatch, model)
    before = snapshot(model)
    extra = [] if command in ("summary", "check") else ["--quiet"]
    res = cli([command, spec, "--weights", "none", *sizes, *COMMANDS[command], *extra, "--json"])
    assert res.exit_code == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert_same(model, before)


def test_gradient_commands_say_which_input_and_other_inputs_come_from_a_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    model = TwoInputs()
    spec = register_model(monkeypatch, model)
    torch.save((torch.zeros(1, 3, 8, 8), torch.ones(1, 5)), tmp_path / "in.pt")
    res = cli(["grads", spec, "--weights", "none", "--input-size", "3x8x8", "--inputs-file",
               str(tmp_path / "in.pt"), "--json"])
    assert res.exit_code == 0, res.stderr
    assert "images feed input #0 (positional)" in res.stderr and "with respect to it" in res.stderr
    res = cli(["grads", spec, "--weights", "none", "--input-size", "3x8x8", "--input-size", "5",
               "--image-input", "c", "--json"])
    assert res.exit_code == 2 and "--image-input 'c' is not an input; inputs: 0, 1" in res.stderr, res.stderr
