"""README's picture of ``attributions --generate`` (issue 36): a tiny GPT-2 (the test fixture's
config and word-level tokenizer) trained here for a few seconds on the fixture's sentences, so
that it continues "the cat sat" with "on the mat", then the real command on its folder.

Run from the repository root: ``python sample_images/readme/make_generation_picture.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from fixtures.text_models import SENTENCES, build_model, wordlevel_tokenizer  # noqa: E402


def trained_gpt2(folder: Path) -> Path:
    tok = wordlevel_tokenizer()
    model = build_model("gpt2", vocab=max(64, len(tok)))
    ids = [tok(s)["input_ids"] + [tok.eos_token_id] for s in SENTENCES]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):  # eval mode: no dropout, so that the few sentences are learnt exactly
        for row in ids:
            x = torch.tensor([row])
            opt.zero_grad()
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def main() -> None:
    out = ROOT / "sample_images" / "readme"
    with tempfile.TemporaryDirectory() as tmp:
        folder = trained_gpt2(Path(tmp) / "tiny-gpt2")
        run = Path(tmp) / "gen"
        subprocess.run(["inspect-model", "attributions", str(folder), "--weights", "default", "--text", "the cat sat",
                        "--generate", "4", "-m", "ig", "-m", "saliency", "-o", str(run), "-q"], check=True)
        shutil.copy(run / "images" / "0000-text-0" / "generation.integrated-gradients.png",
                    out / "generation_matrix.png")
        print((run / "report.txt").read_text())


if __name__ == "__main__":
    main()
