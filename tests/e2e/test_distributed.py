"""Past one process: torchrun (gloo, 2 ranks) against a single process, --resume after a
kill against an uninterrupted run, --workers against none, and the refusals."""

from __future__ import annotations

import inspect
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fixtures.processes import FAULTY as KILL_AFTER  # test-only faults
from fixtures.processes import close, image_folder, launch_torchrun
from fixtures.processes import env as _env

COMMON = ["--crop", "16", "--resize", "16", "--batch-size", "3", "--weights", "none"]

DRIVER = '''
import json, os, sys
from typing import Any
from inspect_model.api.activations import activations
from inspect_model.api.cam import cam
from inspect_model.api.grads import grads
from inspect_model.api.guided import guided_backprop
from inspect_model.run.options import InputOptions, ModelOptions
from inspect_model.run.world import is_secondary
model, images, out, labels = sys.argv[1:5]
def inputs():
    return InputOptions([images], batch_size=3, crop=16, resize=16)
a = activations(None, model_options=ModelOptions(model), inputs=inputs(), keep=False)
c = cam(None, model_options=ModelOptions(model), inputs=inputs(), output_dir=out + "/cam")
g = grads(None, model_options=ModelOptions(model, weights=None), inputs=inputs(), output_dir=out + "/grads", **GRADS)
open(out + f"/grads-failures-{os.environ['RANK']}.json", "w").write(json.dumps(g.failures))
guided_backprop(None, model_options=ModelOptions(model), inputs=inputs(), output_dir=out + "/guided")
if not is_secondary():
    open(out + "/activations.json", "w").write(json.dumps(a.to_dict()))
    open(out + "/grads-hists.json", "w").write(json.dumps(hists(g.record)))
'''
# grads under torchrun: labels of a shard start at its first image; the vanishing check
# fails on purpose (--fail-on must fail every rank).
GRADS = {"loss": "cross-entropy", "fail_on": "vanishing", "vanishing_below": 2.0, "clip_norm": 0.01}


def hists(rep: Any) -> dict[str, Any]:
    return {"layers": {r.key: [r.hist.counts, r.hist.zeros] for r in rep.layers},
            "params": {p.name: [p.hist.counts, p.hist.zeros] for p in rep.params}}


DRIVER = DRIVER.replace("def inputs():", f"GRADS = dict(labels_file=labels, **{GRADS!r})\n"
                        f"{inspect.getsource(hists)}def inputs():")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dist")
    # 4 batches of 3: rank 0 gets 6 images, rank 1 gets 4
    imgs, _spec = image_folder(root, 10, seed=0, size=lambda i: (20 + i % 3, 24), name="im{i:02d}.png")
    model = root / "models.py"
    labels = root / "labels.txt"
    labels.write_text("".join(f"{(i * 3) % 5}\n" for i in range(10)))
    return {"root": root, "imgs": imgs, "model": model, "labels": labels}


def _close(a: Any, b: Any, rel: float = 1e-9) -> None:
    """Equal, floats to ``rel`` relative (moments merged in another order; float32 gradients
    summed in another order for grads)."""
    close(a, b, rel=rel, abs_tol=1e-12)


def _grads_close(one: dict[str, Any], two: dict[str, Any]) -> None:
    """grads reports equal, floats to 1e-6 relative: float32 gradients summed in another
    order. A parameter's mean gradient can cancel to rounding noise (the last bias under
    cross-entropy: softmax minus one-hot sums to zero), so it is compared to 1e-6 of its
    largest |gradient| element instead."""
    one, two = _comparable(one), _comparable(two)
    for a, b in zip(one["params"], two["params"], strict=True):
        if a["has_grad"]:
            assert math.isclose(a["mean"], b["mean"], rel_tol=1e-6, abs_tol=1e-6 * a["max_abs"]), (a, b)
        a.pop("mean"), b.pop("mean")
    _close(one, two, rel=1e-6)


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    doc = {k: v for k, v in doc.items() if k not in ("throughput", "contact_sheets")}
    doc["files"] = [f for f in doc["files"] if not f.startswith("contact_sheet_")]
    return doc


@pytest.fixture(scope="module")
def torchrun_out(data: dict[str, Path]) -> Path:
    """One torchrun (2 ranks, gloo) for every command compared below: it starts in seconds, not in a blink."""
    out = data["root"] / "torchrun"
    out.mkdir()
    driver = data["root"] / "driver.py"
    driver.write_text(DRIVER)
    launch_torchrun(driver, f"{data['model']}:TinyCNN", str(data["imgs"]), str(out), str(data["labels"]))
    return out


def _inputs(data: dict[str, Path]) -> Any:
    from inspect_model.run.options import InputOptions

    return InputOptions([str(data["imgs"])], batch_size=3, crop=16, resize=16)


def test_torchrun_two_ranks_match_one_process(data: dict[str, Path], torchrun_out: Path) -> None:
    from inspect_model.api.activations import activations
    from inspect_model.api.cam import cam
    from inspect_model.run.options import ModelOptions

    out = torchrun_out
    spec = f"{data['model']}:TinyCNN"
    single = activations(None, model_options=ModelOptions(spec), inputs=_inputs(data), keep=False).to_dict()
    merged = json.loads((out / "activations.json").read_text())
    assert merged["image_count"] == 10 and merged["batches"] == 4
    _close(_comparable(single), _comparable(merged))

    one = cam(None, model_options=ModelOptions(spec), inputs=_inputs(data), output_dir=data["root"] / "cam1").to_dict()
    two = json.loads((out / "cam" / "report.json").read_text())
    _close(_comparable(one), _comparable(two))
    assert sorted(p.name for p in (out / "cam").iterdir()) == ["contact_sheet_001.png", "contact_sheet_002.png",
                                                               "images", "report.html", "report.json", "report.txt"]
    assert two["contact_sheets"] == ["contact_sheet_001.png", "contact_sheet_002.png"]
    assert two["throughput"]["images"] == 10


@pytest.fixture(scope="module")
def grads_single(data: dict[str, Path]) -> Any:
    """grads in one process over every image with the torchrun driver's options (into
    ``grads1``; weights=None as ``--weights none`` gives)."""
    from inspect_model.api.grads import grads
    from inspect_model.run.options import ModelOptions

    return grads(None, model_options=ModelOptions(f"{data['model']}:TinyCNN", weights=None), inputs=_inputs(data),
                 output_dir=data["root"] / "grads1", labels_file=str(data["labels"]), **GRADS)


def test_torchrun_grads_match_one_process(data: dict[str, Path], torchrun_out: Path,
                                          grads_single: Any) -> None:
    """Layer statistics merged, parameter gradients summed on rank 0 (global norm, clipping,
    parameter statistics, histograms), checks run on the merged result, failing every rank."""
    single = grads_single
    one = json.loads((data["root"] / "grads1" / "report.json").read_text())
    two = json.loads((torchrun_out / "grads" / "report.json").read_text())
    assert two["image_count"] == 10 and [i["image"] for i in two["images"]] == [i["image"] for i in one["images"]]
    assert two["global_grad_norm"] > 0 and two["clip"]["clipped"] and all(p["has_grad"] for p in two["params"])
    _grads_close(one, two)
    assert sorted(p.name for p in (torchrun_out / "grads").iterdir()) == sorted(one["files"])
    _close(hists(single.record), json.loads((torchrun_out / "grads-hists.json").read_text()))
    assert single.failures and single.failures[0].startswith("gradient check 'vanishing' failed")
    for rank in (0, 1):  # the CLI exits 1 on each rank with these
        assert json.loads((torchrun_out / f"grads-failures-{rank}.json").read_text()) == single.failures


def test_torchrun_guided_backprop_matches_one_process(data: dict[str, Path], torchrun_out: Path) -> None:
    from inspect_model.api.guided import guided_backprop
    from inspect_model.run.options import ModelOptions

    one = guided_backprop(None, model_options=ModelOptions(f"{data['model']}:TinyCNN"), inputs=_inputs(data),
                          output_dir=data["root"] / "guided1").to_dict()
    two = json.loads((torchrun_out / "guided" / "report.json").read_text())
    assert two["throughput"]["images"] == 10
    _close(_comparable(one), _comparable(two))
    files = sorted(str(p.relative_to(torchrun_out / "guided")) for p in (torchrun_out / "guided").rglob("*"))
    assert files == sorted(str(p.relative_to(data["root"] / "guided1")) for p in (data["root"] / "guided1").rglob("*"))


def _cam_resume_args(data: dict[str, Path]) -> list[str]:
    return ["cam", f"{data['model']}:TinyCNN", str(data["imgs"]), *COMMON, "-o", str(data["root"] / "resumed"),
            "--json", "-q", "--resume"]


def _grads_resume_args(data: dict[str, Path]) -> list[str]:
    return ["grads", f"{data['model']}:TinyCNN", str(data["imgs"]), *COMMON, "--loss", "cross-entropy",
            "--labels-file", str(data["labels"]), "--fail-on", "vanishing", "--vanishing-below", "2",
            "--clip-norm", "0.01", "-o", str(data["root"] / "grads-resumed"), "--json", "-q", "--resume"]


@pytest.fixture(scope="module")
def killed(data: dict[str, Path]) -> list[list[str]]:
    """The cam and grads --resume runs, each killed (SIGKILL) once 6 images are checkpointed:
    one faulty_run.py ``--each`` (torch and the CLI imported once, a forked child per run)."""
    runs = [_cam_resume_args(data), _grads_resume_args(data)]
    r = subprocess.run([*KILL_AFTER, "--each", json.dumps([["kill:6", *args] for args in runs])],
                       capture_output=True, text=True, env=_env(), check=False, timeout=240)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == [-9, -9], r.stderr
    return runs


def test_resume_after_kill_equals_uninterrupted_run(data: dict[str, Path], killed: list[list[str]], cli) -> None:
    spec = f"{data['model']}:TinyCNN"
    out = data["root"] / "resumed"
    args = _cam_resume_args(data)
    assert killed[0] == args  # SIGKILL once 6 images were checkpointed
    staging = out / ".inspect-model-staging-resume"
    manifest = json.loads((staging / "manifest-0.json").read_text())
    assert manifest["done"] == 6 and manifest["total"] == 10 and manifest["world_size"] == 1
    assert [p.name for p in out.iterdir()] == [staging.name]  # nothing committed

    # Other options, or another world size: refused, the state kept.
    bad = cli([*args, "--top", "2"])
    assert bad.exit_code == 2 and "other options" in bad.stderr and staging.is_dir()
    (staging / "manifest-0.json").write_text(json.dumps({**manifest, "world_size": 2}))
    bad = cli(args)
    assert bad.exit_code == 2 and "started with 2 process(es)" in bad.stderr
    (staging / "manifest-0.json").write_text(json.dumps(manifest))

    resumed = cli(args)
    assert resumed.exit_code == 0, resumed.stderr
    doc = json.loads(resumed.stdout)
    assert doc["throughput"]["images"] == 4  # only the rest was computed
    whole = cli(["cam", spec, str(data["imgs"]), *COMMON, "-o", str(data["root"] / "whole"), "--json", "-q"])
    _close(_comparable(json.loads(whole.stdout)), _comparable(doc))
    assert doc["contact_sheets"] == json.loads(whole.stdout)["contact_sheets"]
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert files == sorted(str(p.relative_to(data["root"] / "whole")) for p in (data["root"] / "whole").rglob("*"))


def test_grads_resume_after_kill_equals_uninterrupted_run(data: dict[str, Path], grads_single: Any,
                                                          killed: list[list[str]], cli) -> None:
    """The summed parameter gradients, layer statistics and per-image records of the killed
    run are picked up: the report is that of one uninterrupted run (checks and exit 1 included)."""
    out = data["root"] / "grads-resumed"
    args = _grads_resume_args(data)
    assert killed[1] == args  # SIGKILL once 6 images were checkpointed
    staging = out / ".inspect-model-staging-resume"
    assert json.loads((staging / "manifest-0.json").read_text())["done"] == 6

    resumed = cli(args)
    assert resumed.exit_code == 1, resumed.stderr  # --fail-on vanishing, as in one run
    assert "gradient check 'vanishing' failed" in resumed.stderr
    doc = json.loads(resumed.stdout)
    assert doc["throughput"]["images"] == 4  # only the rest was computed
    one = json.loads((data["root"] / "grads1" / "report.json").read_text())
    _grads_close(one, doc)
    assert sorted(p.name for p in out.iterdir()) == sorted(one["files"])


def test_workers_give_the_same_batches(data: dict[str, Path]) -> None:
    from inspect_model.api.activations import activations
    from inspect_model.run.options import InputOptions, ModelOptions
    from inspect_model.run.world import scaled

    spec = f"{data['model']}:TinyCNN"
    docs = []
    for workers in (0, 2):
        with scaled(workers=workers):
            res = activations(None, model_options=ModelOptions(spec),
                              inputs=InputOptions([str(data["imgs"])], batch_size=4, crop=16, resize=16), keep=False)
        docs.append(res.to_dict())
    assert docs[1]["throughput"]["images"] == 10 and docs[1]["throughput"]["images_per_second"] > 0
    assert _comparable(docs[0]) == _comparable(docs[1])


def test_bad_options(data: dict[str, Path], cli) -> None:
    spec = f"{data['model']}:TinyCNN"
    r = cli(["cam", spec, str(data["imgs"]), "--resume"])
    assert r.exit_code == 2 and r.stderr.strip() == "error: --resume needs --output-dir DIR"
    r = cli(["cam", spec, str(data["imgs"]), "--workers", "-1"])
    assert r.exit_code == 2 and "--workers must be 0 or more" in r.stderr
    out = data["root"] / "jacobian"
    r = cli(["grads", spec, str(data["imgs"]), *COMMON, "--of", "fc", "--wrt", "pool", "-o", str(out), "--resume"])
    assert r.exit_code == 2 and "grads --of/--wrt does not support --resume" in r.stderr and not out.exists()


def test_shards_are_whole_batches() -> None:
    from inspect_model.run.world import shard

    assert [shard(10, 3, 2, r) for r in range(2)] == [(0, 6, 0), (6, 10, 2)]
    assert [shard(2, 8, 3, r) for r in range(3)] == [(0, 2, 0), (2, 2, 1), (2, 2, 1)]
    blocks = [shard(257, 8, 4, r) for r in range(4)]
    assert blocks[0][0] == 0 and blocks[-1][1] == 257 and all(a[1] == b[0] for a, b in itertools.pairwise(blocks))


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # unpickling this runs code: writes the marker file
        return (open, (self.marker, "w"))


def test_a_planted_resume_state_never_runs_code(tmp_path: Path) -> None:
    """The resume state lives in the output directory, which nobody marked as trusted: it is
    read with weights_only=True and our own record classes only (issue 13's rule)."""
    import io

    import torch

    from inspect_model.run.resume import load_state as _load_state
    from inspect_model.errors import OutputError

    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    torch.save({"rows": _Payload(str(marker))}, buf)
    state = tmp_path / "state-0.pt"
    state.write_bytes(buf.getvalue())
    with pytest.raises(OutputError, match="cannot read the resume state"):
        _load_state(state)
    assert not marker.exists()


def test_grads_parts_merge_into_one_run(tmp_path: Path) -> None:
    """GradRun over blocks of batches (one empty, as a rank with no image), each saved and read
    back as --resume does, merged: the report of one run over every batch (labels of a block
    start at its first image; first non-finite gradient in backward order over the whole run)."""
    import torch
    from torch import nn

    from inspect_model.run.resume import load_state as _load_state
    from inspect_model.run.resume import save_state as _save_state
    from inspect_model.methods.gradients.flow import GradRun, gradients, merge_partials

    class Sqrt(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sqrt(x.abs())  # NaN gradient at an exact zero

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    bad = nn.Sequential(nn.Linear(4, 4), Sqrt(), nn.Linear(4, 2))
    xs = [torch.randn(3, 4) for _ in range(4)]
    labels = [i % 3 for i in range(12)]
    bad_xs = [x.clone() for x in xs]
    bad_xs[2][1, 0] = 0.0
    with torch.no_grad():
        bad[0].weight[:] = torch.eye(4)
        bad[0].bias.zero_()

    for model, batches, kw in ((mlp, xs, {"loss": "cross-entropy", "labels": labels, "clip_norm": 0.1}),
                               (bad, bad_xs, {"target": "0"})):
        one = gradients(model, batches, histograms=True, **kw)
        parts = []
        for k, block in enumerate((batches[:2], batches[2:], [])):
            run = GradRun(model, histograms=True, label_base=6 * k, **kw)
            run.run(block)
            _save_state(tmp_path / "state.pt", {"partial": run.snapshot()})
            parts.append(_load_state(tmp_path / "state.pt")["partial"])
        merged = run.report(merge_partials(parts))
        assert merged.images == one.images == 12 and merged.first_nonfinite == one.first_nonfinite
        assert [(r.key, r.first_nonfinite_seq, r.hist) for r in merged.layers] == \
            [(r.key, r.first_nonfinite_seq, r.hist) for r in one.layers]
        assert [s.name for s in merged.samples] == [s.name for s in one.samples]
        assert [c.status for c in merged.checks] == [c.status for c in one.checks]
        if model is mlp:
            assert merged.global_norm == pytest.approx(one.global_norm, rel=1e-6)
            assert merged.clip.scale == pytest.approx(one.clip.scale, rel=1e-6)
            for a, b in zip(merged.params, one.params, strict=True):
                assert a.norm == pytest.approx(b.norm, rel=1e-6) and a.hist.counts == b.hist.counts
            for a, b in zip(merged.layers, one.layers, strict=True):
                assert a.grad_output.norm == pytest.approx(b.grad_output.norm, rel=1e-9)
                assert a.grad_input.std == pytest.approx(b.grad_input.std, rel=1e-9)
        else:
            assert one.first_nonfinite == "1 (gradient wrt its input)"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_rendezvous_failure_is_one_line(data: dict[str, Path]) -> None:
    """A rank whose master never answers: one line on stderr (c10d's C++ log of every failed
    connection attempt is held back), the distributed exit code, no output directory."""
    port = _free_port()
    out = data["root"] / "no-rendezvous"
    env = {**_env(), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "INSPECT_MODEL_DIST_TIMEOUT": "2", "INSPECT_MODEL_DIST_BACKEND": "gloo"}
    r = subprocess.run([sys.executable, "-m", "inspect_model", "cam", f"{data['model']}:TinyCNN", str(data["imgs"]),
                        *COMMON, "-o", str(out), "--json"], capture_output=True, text=True, env=env, timeout=120,
                       check=False)
    assert r.returncode == 8, r.stderr
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: rank 1: rendezvous failed (gloo at 127.0.0.1:{port}): ")
    assert not out.exists()


def test_ranks_that_see_other_inputs_fail_together(data: dict[str, Path]) -> None:
    """Under torchrun, rank 1 given a folder with other images: every rank stops with the same
    one-line error and the distributed exit code before computing anything; nothing is written."""
    other = data["root"] / "other-imgs"
    other.mkdir()
    for p in sorted(data["imgs"].iterdir())[:3]:
        (other / p.name).write_bytes(p.read_bytes())
    out = data["root"] / "mismatched"
    cmd = (f'if [ "$RANK" = 1 ]; then d="{other}"; else d="{data["imgs"]}"; fi; '
           f'"{sys.executable}" -m inspect_model cam "{data["model"]}:TinyCNN" "$d" {" ".join(COMMON)} -o "{out}" '
           f'--json -q; rc=$?; echo $rc > "{data["root"]}/mismatched-rc-$RANK"; exit $rc')
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                        "--monitor-interval", "5", "--no-python", "bash", "-c", cmd],
                       capture_output=True, text=True, env=_env(), timeout=300, check=False)
    assert r.returncode != 0
    line = "error: rank 1 sees 3 input image(s), rank 0 sees 10 (or other files)"
    assert r.stderr.count(line) == 2, r.stderr[-3000:]
    for rank in (0, 1):
        assert (data["root"] / f"mismatched-rc-{rank}").read_text().strip() == "8"
    assert not out.exists()
