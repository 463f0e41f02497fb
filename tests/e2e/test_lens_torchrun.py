"""``lens`` over a text file under torchrun (gloo, 2 ranks) gives the one-process report:
the texts are sharded by the runner like images and merged in order on rank 0 (issue 36)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import math
from typing import Any

from e2e.test_distributed import _env

DRIVER = '''
import sys
from inspect_model.api.lens import lens
from inspect_model.run.options import InputOptions, ModelOptions
folder, texts, out = sys.argv[1:4]
lens(None, model_options=ModelOptions(folder), inputs=InputOptions(text_file=texts, batch_size=2),
     output_dir=out, sites="resid,mlp", top_k=3)
'''


def test_torchrun_two_ranks_match_one_process(tmp_path: Path) -> None:
    from fixtures.lm_models import save_lm
    from inspect_model.api.lens import lens
    from inspect_model.run.options import InputOptions, ModelOptions

    folder = save_lm("gpt2", tmp_path / "lm")
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat on the mat\na dog ran to the park\nthe movie was very good\ni liked it\n"
                     "the plot was dull but fun\n")
    (tmp_path / "driver.py").write_text(DRIVER)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                        str(tmp_path / "driver.py"), str(folder), str(texts), str(tmp_path / "two")],
                       capture_output=True, text=True, env=_env(), timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    one = lens(None, model_options=ModelOptions(str(folder)), inputs=InputOptions(text_file=str(texts), batch_size=2),
               output_dir=tmp_path / "one", sites="resid,mlp", top_k=3).to_dict()
    two = json.loads((tmp_path / "two" / "report.json").read_text())
    assert [t["image"] for t in two["images"]] == [f"text-{i}" for i in range(5)]
    assert [t["index"] for t in two["images"]] == list(range(5))
    drop = ("throughput", "files", "tool_version", "options")
    _near({k: v for k, v in one.items() if k not in drop}, {k: v for k, v in two.items() if k not in drop})
    assert sorted(p.name for p in (tmp_path / "two" / "images").iterdir()) == \
        sorted(p.name for p in (tmp_path / "one" / "images").iterdir())


def _near(a: Any, b: Any, path: str = "$") -> None:
    """Equal; floats to 1e-5 absolute (one process runs two threads, a rank one: matmuls sum
    in another order, and KL near 0 is a difference of numbers near |logits|)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _near(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _near(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5), (path, a, b)
    else:
        assert a == b, (path, a, b)
