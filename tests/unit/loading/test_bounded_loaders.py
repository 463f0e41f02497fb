"""The one bounded loader of torch files and the bounded reader of the resume manifest (issue 41).

Every torch file (checkpoint, inputs file, baseline, TorchScript, weights, resume state) is
a regular file, within a size, an inflated size and a pickle size before torch reads it; a
resume state holds no class whose unpickling allocates what the file declares, its tensors
hold their values, and its records fit their types and the session that resumes it.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from inspect_model.loading import archive_guard
from inspect_model.loading.torch_files import guard_torch_file, load_torch

ROOT = Path(__file__).resolve().parents[3]
FAULTY = [sys.executable, str(ROOT / "tests" / "fixtures" / "faulty_run.py")]
COMMON = ["--crop", "16", "--resize", "16", "--batch-size", "2", "--weights", "none", "--json", "-q"]
STAGING = ".inspect-model-staging-resume"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env.update(OMP_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")
    return env


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert "unexpected" not in lines[0], lines[0]
    return lines[0]


def _with_pickle(obj: Any, body: bytes) -> bytes:
    """A torch.save archive of ``obj`` whose data.pkl is replaced by ``body`` (stored, as torch writes)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            data = body if info.filename.endswith("data.pkl") else src.read(info)
            z.writestr(info.filename, data)
    return out.getvalue()


def _appends(n: int) -> bytes:
    """A protocol-2 pickle of a list built by ``n`` appends: cheap to write, slow to unpickle."""
    return b"\x80\x02]q\x00(" + b"K\x01" * n + b"e."


def _bomb(obj: Any, inflated: int) -> bytes:
    """A torch.save archive of ``obj`` plus a deflated record of ``inflated`` zero bytes."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            z.writestr(info.filename, src.read(info))
        root = src.namelist()[0].split("/")[0]
        with z.open(f"{root}/data/99", "w", force_zip64=True) as fh:
            block = bytes(2**24)
            for _ in range(inflated // len(block)):
                fh.write(block)
    return out.getvalue()


# ------------------------------------------------------------------ the loader itself
def test_the_issue_example_a_huge_pickle_of_appends_is_refused_at_once(tmp_path: Path) -> None:
    """40 MB of list appends in data.pkl (the issue's was 600 MB): refused from the zip's
    directory in well under a second, before the weights-only unpickler spends minutes on it."""
    p = tmp_path / "ckpt.pt"
    p.write_bytes(_with_pickle({"w": torch.ones(2)}, _appends(20_000_000)))
    start = time.monotonic()
    with pytest.raises(Exception) as info:
        load_torch(p, "checkpoint")
    assert time.monotonic() - start < 2.0
    assert "pickle" in str(info.value) and "refusing to unpickle" in str(info.value)
    assert getattr(info.value, "exit_code", None) == 4


def test_a_legacy_pickle_over_the_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "legacy.pt"
    torch.save({"w": list(range(5000))}, p, _use_new_zipfile_serialization=False)
    assert load_torch(p, "checkpoint")["w"][-1] == 4999  # under the limit: read
    monkeypatch.setattr(archive_guard, "MAX_PICKLE_BYTES", 4096)
    with pytest.raises(Exception, match="its pickles run past"):
        load_torch(p, "checkpoint")


def test_a_real_state_dict_passes(tmp_path: Path) -> None:
    from fixtures.models import TinyCNN

    p = tmp_path / "sd.pt"
    sd = TinyCNN().state_dict()
    torch.save(sd, p)
    got = load_torch(p, "checkpoint")
    assert set(got) == set(sd) and all(torch.equal(got[k], sd[k]) for k in sd)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero link", "directory"])
def test_no_regular_file_is_refused_without_opening_it(kind: str, tmp_path: Path) -> None:
    p = tmp_path / "x.pt"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
    else:
        p.symlink_to("/dev/zero")
    with pytest.raises(Exception) as info:
        guard_torch_file(p, "checkpoint")
    assert "regular file" in str(info.value) or "directory" in str(info.value)


def test_a_file_over_its_size_limit_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "big.pt"
    torch.save({"w": torch.zeros(1000)}, p)
    with pytest.raises(Exception, match="over the"):
        guard_torch_file(p, "checkpoint", max_bytes=1000)


# ------------------------------------------------------------------ every caller goes through it
def _ckpt_over_pickle_limit(path: Path) -> None:
    path.write_bytes(_with_pickle({"w": torch.ones(2)}, _appends(100_000)))


@pytest.mark.parametrize("where", ["--checkpoint", "--inputs-file", "torchscript model"])
def test_every_torch_file_option_goes_through_the_loader(where: str, tmp_path: Path, models_py: Path,
                                                         monkeypatch: pytest.MonkeyPatch, cli) -> None:
    monkeypatch.setattr(archive_guard, "MAX_PICKLE_BYTES", 64 * 1024)
    p = tmp_path / "f.pt"
    _ckpt_over_pickle_limit(p)
    if where == "torchscript model":
        args = ["summary", str(p), "--input-size", "3x16x16"]
        p.write_bytes(_with_pickle({"w": torch.ones(2)}, _appends(100_000)).replace(b"data.pkl", b"data.pkl"))
    else:
        args = ["summary" if where == "--checkpoint" else "activations", f"{models_py}:TinyCNN",
                "--input-size", "3x16x16", where, str(p)]
    r = cli(args)
    line = _one_line(r.stderr)
    if where != "torchscript model":
        assert r.exit_code == 4 and "pickle" in line, line
    else:
        assert r.exit_code in (3, 4), line


def test_a_baseline_npy_declaring_more_than_it_holds_is_refused(tmp_path: Path) -> None:
    from inspect_model.errors import InputError
    from inspect_model.methods.attributions.passes import _load_baseline_file

    p = tmp_path / "b.npy"
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }"
    header += " " * (118 - len(header)) + "\n"
    p.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(64))
    with pytest.raises(InputError, match="declares a 100000x100000 array"):
        _load_baseline_file(p)
    q = tmp_path / "b.pt"
    _ckpt_over_pickle_limit(q)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(archive_guard, "MAX_PICKLE_BYTES", 64 * 1024)
        with pytest.raises(InputError, match="pickle"):
            _load_baseline_file(q)


# ------------------------------------------------------------------ resume states
@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A cam --resume run killed after 2 of 5 images (its state holds contact-sheet pictures)."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("bounded")
    imgs = root / "imgs"
    imgs.mkdir()
    rng = np.random.default_rng(3)
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(imgs / f"im{i}.png")
    model = root / "models.py"
    model.write_text((ROOT / "tests" / "fixtures" / "models.py").read_text())
    out = root / "out"
    args = ["cam", f"{model}:TinyCNN", str(imgs), *COMMON, "-o", str(out), "--resume"]
    r = subprocess.run([*FAULTY, "kill:2", *args], capture_output=True, text=True, env=_env(), timeout=300,
                       check=False)
    assert r.returncode == -9, r.stderr
    return {"out": out, "args": args}


def _copy(killed: dict[str, Any], tmp_path: Path) -> Path:
    """A copy of the killed run's directory, its state's paths moved to the copy."""
    out = tmp_path / "out"
    shutil.copytree(killed["out"], out, symlinks=True)
    state = _state(out)
    old = str(killed["out"])
    state["pending"] = [(a.replace(old, str(out)), b.replace(old, str(out))) for a, b in state["pending"]]
    state["written"] = [w.replace(old, str(out)) for w in state["written"]]
    torch.save(state, out / STAGING / "state-0.pt")
    return out


def _resume(killed: dict[str, Any], out: Path, cli) -> str:  # type: ignore[no-untyped-def]
    r = cli([*killed["args"][:-3], "-o", str(out), "--resume"])
    assert r.exit_code == 7, r.stderr
    assert r.stdout == ""
    return _one_line(r.stderr)


def _state(out: Path) -> dict[str, Any]:
    import inspect_model.methods.cam.maps  # noqa: F401 - its record classes
    from inspect_model.run.resume import load_state

    return load_state(out / STAGING / "state-0.pt")


@pytest.mark.slow  # over 3 s: kept out of the quick tier
def test_a_state_keeps_its_pictures_as_tensors_not_pil_images(killed: dict[str, Any], tmp_path: Path) -> None:
    from inspect_model.render.stored_pictures import StoredPicture

    state = _state(_copy(killed, tmp_path))
    rows = state["session"]["drawer"]["sheet_rows"]
    cells = [c for _label, row in rows for c in row if c is not None]
    assert cells and all(isinstance(c[0], StoredPicture) and c[0].pixels.dtype == torch.uint8 for c in cells)


def test_the_issue_example_a_zip_bomb_state_is_refused(killed: dict[str, Any], tmp_path: Path, cli) -> None:
    out = _copy(killed, tmp_path)
    state = _state(out)
    (out / STAGING / "state-0.pt").write_bytes(_bomb(state, 2**30))  # 1 GiB of zeros in ~1 MB
    line = _resume(killed, out, cli)
    assert "resume state" in line and "zip bomb" in line and "remove that folder" in line, line


def test_a_pil_image_in_a_state_is_refused_unread(killed: dict[str, Any], tmp_path: Path, cli) -> None:
    """PIL's unpickling allocates the size the file declares: the class is not allowed at all."""
    from PIL import Image

    out = _copy(killed, tmp_path)
    state = _state(out)
    state["session"]["drawer"]["sheet_rows"] = [("x", [(Image.new("L", (8, 8)), "cell")])]
    torch.save(state, out / STAGING / "state-0.pt")
    line = _resume(killed, out, cli)
    assert "resume state" in line and "PIL" in line or "UnpicklingError" in line, line


@pytest.mark.parametrize("shape", [(60000, 60000, 3), (9000, 12000)], ids=["60000x60000", "over-limit-L"])
def test_a_stored_picture_declaring_a_huge_size_is_refused(shape: tuple[int, ...], killed: dict[str, Any],
                                                           tmp_path: Path, cli) -> None:
    """A stride-0 tensor claims 60000x60000 pixels over one stored byte: refused before a copy."""
    from inspect_model.render.stored_pictures import StoredPicture

    out = _copy(killed, tmp_path)
    state = _state(out)
    px = torch.zeros(1, dtype=torch.uint8).expand(*shape)
    state["session"]["drawer"]["sheet_rows"] = [("x", [(StoredPicture("RGB" if len(shape) == 3 else "L", px),
                                                        "cell")])]
    torch.save(state, out / STAGING / "state-0.pt")
    line = _resume(killed, out, cli)
    assert "not valid" in line and "stored bytes" in line, line


@pytest.mark.parametrize("case", ["a float where a count is", "a record field of the wrong type",
                                  "a missing key", "a list where a dict is"])
def test_a_state_that_does_not_fit_the_session_is_refused_on_load(case: str, killed: dict[str, Any],
                                                                  tmp_path: Path, cli) -> None:
    out = _copy(killed, tmp_path)
    state = _state(out)
    session = state["session"]
    if case == "a float where a count is":
        session["columns"] = 3.5
    elif case == "a record field of the wrong type":
        entries = session["entries"]
        first = entries[0]
        first["maps"] = "not a list" if isinstance(first, dict) else first
        session["warnings"].items = {"a": 1}
    elif case == "a missing key":
        del session["drawer"]
    else:
        session["drawer"] = [1, 2]
    torch.save(state, out / STAGING / "state-0.pt")
    line = _resume(killed, out, cli)
    assert "resume state" in line and "not valid" in line, line


@pytest.mark.parametrize("kind", ["fifo", "dev-zero link"])
def test_the_issue_example_a_manifest_that_is_no_file_does_not_hang(kind: str, killed: dict[str, Any],
                                                                    tmp_path: Path) -> None:
    out = _copy(killed, tmp_path)
    manifest = out / STAGING / "manifest-0.json"
    manifest.unlink()
    if kind == "fifo":
        os.mkfifo(manifest)
    else:
        manifest.symlink_to("/dev/zero")
    args = [*killed["args"][:-3], "-o", str(out), "--resume"]
    r = subprocess.run([sys.executable, "-m", "inspect_model", *args], capture_output=True, text=True,
                       env=_env(), timeout=120, check=False)
    assert r.returncode == 7, r.stderr
    line = _one_line(r.stderr)
    assert "manifest" in line and "regular file" in line, line


@pytest.fixture(scope="module")
def killed_grads(tmp_path_factory: pytest.TempPathFactory, killed: dict[str, Any]) -> dict[str, Any]:
    """A grads --resume run killed after 2 of 5 images: its state holds summed parameter gradients."""
    root = tmp_path_factory.mktemp("grads")
    cam_args = killed["args"]
    out = root / "out"
    args = ["grads", *cam_args[1:3], *COMMON, "-o", str(out), "--resume"]
    r = subprocess.run([*FAULTY, "kill:2", *args], capture_output=True, text=True, env=_env(), timeout=300,
                       check=False)
    assert r.returncode == -9, r.stderr
    return {"out": out, "args": args}


@pytest.mark.parametrize("case", ["wrong shape", "unknown parameter", "not a tensor"])
def test_the_issue_example_gradients_of_the_wrong_shape_are_refused_on_load(case: str, killed_grads: dict[str, Any],
                                                                           tmp_path: Path, cli) -> None:
    import inspect_model.methods.gradients.flow  # noqa: F401 - its record classes

    out = _copy(killed_grads, tmp_path)
    state = _state(out)
    grads = state["session"]["partial"].grads
    name = sorted(grads)[0]
    if case == "wrong shape":
        grads[name] = torch.zeros(3, 3)
    elif case == "unknown parameter":
        grads["nowhere.weight"] = torch.zeros(1)
    else:
        grads[name] = [1.0, 2.0]
    torch.save(state, out / STAGING / "state-0.pt")
    line = _resume(killed_grads, out, cli)
    assert "not valid" in line and "remove that folder" in line, line
    assert ("the model's is" in line) if case == "wrong shape" else True, line
