"""Bad input never crashes and nothing is lost (issue 9): a corpus of bad inputs, each run
through the CLI on a model object the test holds, each giving one ``error: ...`` line that
names the problem (and the fix), the documented exit code, no traceback, no partial output
files and no hooks or other change left on the model.

Also here: the security cases (``file.py:name`` runs that file and the help says so; output
names built from layer and image names cannot escape ``--output-dir``). The checkpoint
payload test lives in tests/unit/loading/test_loading.py::test_malicious_pickle_does_not_run_without_trust.
"""

from __future__ import annotations

import errno
import io
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch import nn

from fixtures.invariants import assert_same, register_model, snapshot
from fixtures.models import Boom, DictOut, TinyCNN, TwoLayer
from inspect_model import errors

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

IN = ["--weights", "none", "--input-size", "3x8x8", "--quiet"]


# ------------------------------------------------------------------ models the corpus needs
class NaNOut(nn.Module):
    """A CNN whose features (and so outputs) are NaN: log of a negative number."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)) + torch.log(-torch.ones_like(x[:, :1]))
        return self.fc(torch.flatten(self.pool(h), 1))


class NoReLU(nn.Module):
    """conv, tanh, pool, linear: nothing for guided backprop to guide."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.Tanh()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.act(self.conv(x))), 1))


class ExitsInForward(nn.Module):
    """Calls sys.exit(0) in forward: a CI job must not pass on it (issue 13)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise SystemExit(0)


class IntOut(nn.Module):
    """A CNN that returns int64 scores (rounded logits): nothing to differentiate (issue 13)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.fc(torch.flatten(self.pool(torch.relu(self.conv(x))), 1)) * 100).long()


class OutOfMemory(nn.Module):
    """Raises MemoryError in forward, as an allocation the machine cannot hold would."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise MemoryError()


# ------------------------------------------------------------------ bad files
USER_FILE = """
import torch
from torch import nn

WIDTH = 3

class Net(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.fc = nn.Linear(width, 2)
    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))

def broken():
    raise ValueError("factory exploded")
"""


def _png(w: int, h: int, *, mode: int = 2, depth: int = 8, rows: bytes | None = None) -> bytes:
    """A PNG written by hand, so that a 20000x20000 header costs a few bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, depth, mode, 0, 0, 0)
    idat = zlib.compress(rows if rows is not None else b"\0" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _jpeg(size: tuple[int, int] = (16, 16), mode: str = "RGB") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, size, (10, 200, 30) if mode == "RGB" else (10, 200, 30, 5)).save(buf, "JPEG")
    return buf.getvalue()


@dataclass
class Env:
    tmp: Path
    spec: str  # package.module:ATTR of the model object under test
    out: Path  # a --output-dir that does not exist yet
    monkeypatch: pytest.MonkeyPatch

    def write(self, name: str, data: bytes | str) -> str:
        p = self.tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        return str(p)

    def user_file(self, extra: str = "") -> str:
        return self.write("zoo.py", USER_FILE + extra)

    def image(self, name: str = "ok.jpg") -> str:
        return self.write(name, _jpeg())


@dataclass
class Case:
    id: str
    argv: Callable[[Env], list[str]]
    code: int
    needles: tuple[str, ...]  # each must appear in the error line
    model: Callable[[], nn.Module] = TinyCNN
    stdin: str | None = None
    output_dir: bool = True  # append --output-dir (a new folder) and check it is not left behind
    skip: Callable[[], str | None] = field(default=lambda: None)


def _ckpt(env: Env, obj: object, name: str = "ck.pt") -> str:
    p = env.tmp / name
    torch.save(obj, p)
    return str(p)


def _truncated(env: Env) -> str:
    p = _ckpt(env, TinyCNN().state_dict(), "cut.pt")
    data = Path(p).read_bytes()
    Path(p).write_bytes(data[: len(data) // 2])
    return p


def _keys_off(env: Env) -> str:
    sd = TinyCNN().state_dict()
    sd.pop("fc.bias")
    sd["head.weight"] = torch.zeros(2)
    return _ckpt(env, sd, "keys.pt")


def _config(env: Env, text: str) -> str:
    return env.write("cfg.toml", text)


def _not_writable(env: Env) -> list[str]:
    d = env.tmp / "ro"
    d.mkdir()
    d.chmod(0o500)
    if os.geteuid() == 0:  # root writes anywhere: show the check as an unprivileged user sees it
        real = os.access
        env.monkeypatch.setattr(os, "access", lambda p, m, *a, **k: False if Path(p) == d and m & os.W_OK else real(p, m, *a, **k))
    return ["activations", env.spec, *IN, "-o", str(d)]


def _disk_full(env: Env) -> list[str]:
    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    env.monkeypatch.setattr(os, "fsync", no_space)
    return ["cam", env.spec, *IN]


def _no_cuda() -> str | None:
    return "this machine has CUDA" if torch.cuda.is_available() else None


E = errors
CASES = [
    # ---- the model
    Case("unknown-model", lambda e: ["cam", "resnet5O", *IN], E.EXIT_MODEL_LOAD, ("resnet5O", "resnet50")),
    Case("model-file-missing", lambda e: ["summary", f"{e.tmp}/nope.py:Net", "--input-size", "3x8x8"],
         E.EXIT_MODEL_LOAD, ("nope.py", "does not exist")),
    Case("model-name-missing", lambda e: ["grads", f"{e.user_file()}:Nte", *IN], E.EXIT_MODEL_LOAD,
         ("'Nte'", "'Net'")),
    Case("name-not-a-model", lambda e: ["activations", f"{e.user_file()}:WIDTH", *IN], E.EXIT_MODEL_LOAD,
         ("WIDTH", "not an nn.Module")),
    Case("file-raises-on-import", lambda e: ["cam", f"{e.write('bad.py', 'import torch' + chr(10) + '1/0')}:Net", *IN],
         E.EXIT_MODEL_LOAD, ("bad.py", "raised on import", "line 2", "ZeroDivisionError")),
    Case("file-exits-on-import", lambda e: ["guided-backprop", f"{e.write('ex.py', 'import sys; sys.exit(3)')}:Net", *IN],
         E.EXIT_MODEL_LOAD, ("ex.py", "sys.exit(3)", "__main__")),
    Case("factory-raises", lambda e: ["check", f"{e.user_file()}:broken", *IN[:-1]], E.EXIT_MODEL_LOAD,
         ("broken", "factory exploded"), output_dir=False),
    Case("model-arg-unknown", lambda e: ["summary", f"{e.user_file()}:Net", "--model-arg", "widht=3",
                                         "--input-size", "3x8x8"], E.EXIT_MODEL_LOAD, ("widht", "width")),
    Case("model-is-directory", lambda e: ["cam", str(e.tmp), *IN], E.EXIT_MODEL_LOAD, ("is a directory",)),
    Case("checkpoint-not-torch", lambda e: ["cam", e.spec, "--checkpoint", e.write("ck.pt", "hello, I am text\n"), *IN],
         E.EXIT_MODEL_LOAD, ("ck.pt",)),
    Case("checkpoint-truncated", lambda e: ["grads", e.spec, "--checkpoint", _truncated(e), *IN], E.EXIT_MODEL_LOAD,
         ("cut.pt",)),
    Case("checkpoint-missing-unexpected", lambda e: ["activations", e.spec, "--checkpoint", _keys_off(e), *IN],
         E.EXIT_MODEL_LOAD, ("fc.bias", "head.weight", "--non-strict")),
    Case("checkpoint-pickled-model", lambda e: ["guided-backprop", e.spec, "--checkpoint", _ckpt(e, TinyCNN()), *IN],
         E.EXIT_MODEL_LOAD, ("ck.pt", "--trust-checkpoint")),
    Case("model-file-pickled-model", lambda e: ["summary", _ckpt(e, TinyCNN(), "whole.pt"), "--input-size", "3x8x8"],
         E.EXIT_MODEL_LOAD, ("whole.pt", "--trust-checkpoint")),
    Case("checkpoint-does-not-exist", lambda e: ["cam", e.spec, "--checkpoint", str(e.tmp / "gone.pt"), *IN],
         E.EXIT_MODEL_LOAD, ("gone.pt",)),
    # ---- shapes and sizes
    Case("input-size-wrong-rank", lambda e: ["activations", e.spec, "--weights", "none", "--input-size", "8x8"],
         E.EXIT_INPUT, ("'features.0'", "3 input channels", "4-D")),
    Case("input-size-wrong-channels", lambda e: ["cam", e.spec, "--weights", "none", "--input-size", "1x8x8"],
         E.EXIT_INPUT, ("'features.0'", "3 input channels")),
    Case("input-size-zero", lambda e: ["grads", e.spec, "--weights", "none", "--input-size", "3x0x8"],
         E.EXIT_INPUT, ("3x0x8",)),
    Case("input-size-garbage", lambda e: ["guided-backprop", e.spec, "--weights", "none", "--input-size", "3xbig"],
         E.EXIT_USAGE, ("3xbig", "3x224x224")),
    Case("batch-size-zero", lambda e: ["cam", e.spec, *IN, "--batch-size", "0"], E.EXIT_USAGE, ("--batch-size", "0")),
    # ---- images
    Case("image-empty", lambda e: ["cam", e.spec, "--weights", "none", e.write("empty.jpg", b"")], E.EXIT_INPUT,
         ("empty.jpg", "empty")),
    Case("image-truncated-jpeg", lambda e: ["activations", e.spec, "--weights", "none",
                                           e.write("cut.jpg", _jpeg((64, 64))[:300])], E.EXIT_INPUT,
         ("cut.jpg", "truncated")),
    Case("image-text-named-jpg", lambda e: ["grads", e.spec, "--weights", "none", e.write("notes.jpg", "just text\n")],
         E.EXIT_INPUT, ("notes.jpg", "not an image")),
    Case("image-1x1", lambda e: ["guided-backprop", e.spec, "--weights", "none", e.write("dot.png", _png(1, 1, rows=b"\0\0\0\0"))],
         E.EXIT_INPUT, ("dot.png", "1x1")),
    Case("image-decompression-bomb", lambda e: ["cam", e.spec, "--weights", "none", e.write("bomb.png", _png(20000, 20000))],
         E.EXIT_INPUT, ("bomb.png", "20000x20000", "decompression")),
    Case("image-dir-without-images", lambda e: ["cam", e.spec, "--weights", "none",
                                               str(Path(e.write("nothing/readme.txt", "hi")).parent)],
         E.EXIT_INPUT, ("nothing", "no images")),
    Case("image-stdin-empty", lambda e: ["activations", e.spec, "--weights", "none", "-"], E.EXIT_INPUT, ("stdin",),
         stdin=""),
    Case("image-missing", lambda e: ["grads", e.spec, "--weights", "none", str(e.tmp / "ghost.jpg")], E.EXIT_INPUT,
         ("ghost.jpg", "does not exist")),
    Case("image-glob-matches-nothing", lambda e: ["cam", e.spec, "--weights", "none", str(e.tmp / "*.webp")],
         E.EXIT_INPUT, ("*.webp", "matches no file")),
    # ---- outputs
    Case("output-dir-is-a-file", lambda e: ["cam", e.spec, *IN, "-o", e.write("taken", "keep me")], E.EXIT_OUTPUT,
         ("taken", "is a file"), output_dir=False),
    Case("output-dir-not-writable", _not_writable, E.EXIT_OUTPUT, ("ro", "not writable"), output_dir=False),
    Case("output-dir-not-empty", lambda e: ["guided-backprop", e.spec, *IN, "-o",
                                           str(Path(e.write("full/old.txt", "old")).parent)],
         E.EXIT_OUTPUT, ("full", "not empty", "--force"), output_dir=False),
    Case("output-disk-full", _disk_full, E.EXIT_OUTPUT, ("No space left",)),
    # ---- targets, layers, outputs
    Case("target-out-of-range", lambda e: ["cam", e.spec, *IN, "--target", "99"], E.EXIT_INPUT, ("99", "5")),
    Case("target-unknown-name", lambda e: ["guided-backprop", e.spec, *IN, "--target", "zebra"], E.EXIT_INPUT,
         ("zebra",)),
    Case("layer-misspelt", lambda e: ["activations", e.spec, *IN, "--layers", "featurs.0"], E.EXIT_LAYER,
         ("featurs.0", "features.0")),
    Case("layer-spec-selects-nothing", lambda e: ["grads", e.spec, *IN, "--layers", "type:LSTM"], E.EXIT_LAYER,
         ("type:LSTM",)),
    Case("cam-layer-misspelt", lambda e: ["cam", e.spec, *IN, "--layer", "featurez"], E.EXIT_LAYER,
         ("featurez", "features")),
    Case("grads-of-unknown-layer", lambda e: ["grads", e.spec, *IN, "--of", "fc", "--wrt", "feat.0"], E.EXIT_LAYER,
         ("feat.0",)),
    Case("output-key-unknown", lambda e: ["grads", e.spec, "--weights", "none", "--input-size", "4", "--quiet",
                                         "--output-key", "logitz"], E.EXIT_USAGE, ("logitz", "logits"), model=DictOut),
    Case("labels-file-missing", lambda e: ["cam", e.spec, *IN, "--labels", str(e.tmp / "labels.txt")], E.EXIT_INPUT,
         ("labels.txt",)),
    # ---- the model at run time
    Case("forward-raises", lambda e: ["activations", e.spec, "--weights", "none", "--input-size", "4", "--quiet"],
         E.EXIT_RUNTIME, ("'c'", "boom"), model=Boom),
    Case("forward-raises-in-grads", lambda e: ["grads", e.spec, "--weights", "none", "--input-size", "4", "--quiet"],
         E.EXIT_RUNTIME, ("'c'", "boom"), model=Boom),
    Case("nan-output-check", lambda e: ["check", e.spec, *IN], E.EXIT_CHECK_FAILED, ("finite",), model=NaNOut,
         output_dir=False),
    Case("nan-output-fail-on", lambda e: ["grads", e.spec, *IN, "--fail-on", "nan"], E.EXIT_CHECK_FAILED, ("nan",),
         model=NaNOut),
    Case("cam-no-spatial-layer", lambda e: ["cam", e.spec, "--weights", "none", "--input-size", "3", "--quiet"],
         E.EXIT_LAYER, ("spatial",), model=TwoLayer),
    # ---- options
    Case("cuda-unavailable", lambda e: ["activations", e.spec, *IN, "--device", "cuda"], E.EXIT_USAGE,
         ("cuda", "--device cpu"), skip=_no_cuda),
    Case("device-unknown", lambda e: ["cam", e.spec, *IN, "--device", "tpu"], E.EXIT_USAGE, ("tpu",)),
    Case("dtype-unknown", lambda e: ["grads", e.spec, *IN, "--dtype", "float8"], E.EXIT_USAGE, ("float8",)),
    Case("scorecam-batch-zero", lambda e: ["cam", e.spec, *IN, "--method", "scorecam", "--scorecam-batch", "0"],
         E.EXIT_USAGE, ("--scorecam-batch",)),
    Case("cam-method-unknown", lambda e: ["cam", e.spec, *IN, "--method", "gradcamm"], E.EXIT_USAGE,
         ("gradcamm", "gradcam")),
    Case("config-unknown-key", lambda e: ["cam", e.spec, *IN, "--config", _config(e, "colourmap = 'jet'\n")],
         E.EXIT_USAGE, ("colourmap", "colormap")),
    Case("config-wrong-type", lambda e: ["grads", e.spec, *IN, "--config", _config(e, "batch_size = 'eight'\n")],
         E.EXIT_USAGE, ("batch_size", "eight")),
    # ---- issue 13: hostile config files, bad values that were accepted silently, resources
    Case("config-sets-trust-checkpoint", lambda e: ["cam", e.spec, *IN, "--config",
                                                    _config(e, "trust-checkpoint = true\n")],
         E.EXIT_USAGE, ("trust-checkpoint", "command line")),
    Case("config-sets-force", lambda e: ["grads", e.spec, *IN, "--config", _config(e, "[grads]\nforce = true\n")],
         E.EXIT_USAGE, ("'force'", "command line")),
    Case("target-negative", lambda e: ["cam", e.spec, *IN, "--target", "-1"], E.EXIT_USAGE, ("-1", "start at 0")),
    Case("target-top-zero", lambda e: ["grads", e.spec, *IN, "--target", "top:0"], E.EXIT_USAGE, ("top:0",)),
    Case("mean-wrong-length", lambda e: ["cam", e.spec, "--weights", "none", e.image(), "--mean", "0.5,0.5"],
         E.EXIT_INPUT, ("--mean", "2 values", "3 channels")),
    Case("input-size-needs-too-much-memory", lambda e: ["activations", e.spec, "--weights", "none",
                                                        "--input-size", "3x100000x100000"],
         E.EXIT_INPUT, ("3x100000x100000", "GiB", "--input-size")),
    # within --batch-size's range (1 to 65,536), and still far past any memory
    Case("batch-size-needs-too-much-memory", lambda e: ["grads", e.spec, "--input-size", "3x1024x1024",
                                                        "--batch-size", "65536"],
         E.EXIT_INPUT, ("65536x3x1024x1024", "GiB", "--batch-size")),
    Case("image-strip-grows-on-resize", lambda e: ["cam", e.spec, "--weights", "none",
                                                   e.write("strip.png", _png(16, 400000))],
         E.EXIT_INPUT, ("strip.png", "16x400000", "resize")),
    Case("checkpoint-empty-dict", lambda e: ["cam", e.spec, "--checkpoint", _ckpt(e, {}, "empty.pt"), *IN],
         E.EXIT_MODEL_LOAD, ("empty.pt", "empty dict")),
    Case("forward-calls-sys-exit", lambda e: ["check", e.spec, "--weights", "none", "--input-size", "4"],
         E.EXIT_RUNTIME, ("sys.exit(0)",), model=lambda: ExitsInForward(), output_dir=False),
    Case("labels-file-too-few-names", lambda e: ["cam", e.spec, *IN, "--labels", e.write("two.txt", "cat\ndog\n")],
         E.EXIT_INPUT, ("two.txt", "2 names", "5 classes")),
    Case("labels-file-too-many-names", lambda e: ["guided-backprop", e.spec, *IN, "--labels",
                                                  e.write("seven.json", '["a","b","c","d","e","f","g"]')],
         E.EXIT_INPUT, ("seven.json", "7 names", "5 classes")),
    Case("labels-file-count-with-loss", lambda e: ["grads", e.spec, *IN, "--loss", "cross-entropy", "--label", "0",
                                                   "--labels", e.write("two.txt", "cat\ndog\n")],
         E.EXIT_INPUT, ("2 names", "5 classes")),
    Case("int-output-cam", lambda e: ["cam", e.spec, *IN], E.EXIT_RUNTIME, ("int64", "not floating point"),
         model=IntOut),
    Case("int-output-guided-backprop", lambda e: ["guided-backprop", e.spec, *IN], E.EXIT_RUNTIME,
         ("int64", "not floating point"), model=IntOut),
    Case("int-output-grads", lambda e: ["grads", e.spec, *IN], E.EXIT_RUNTIME, ("int64", "not floating point"),
         model=IntOut),
    Case("forward-raises-memory-error", lambda e: ["activations", e.spec, "--weights", "none", "--input-size", "4",
                                                   "--quiet"],
         E.EXIT_RUNTIME, ("out of CPU memory", "--batch-size"), model=OutOfMemory),
    Case("config-not-toml", lambda e: ["activations", e.spec, *IN, "--config", _config(e, "this is = = not toml\n")],
         E.EXIT_USAGE, ("cfg.toml",)),
]


def _run(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> tuple[object, Env, nn.Module, dict]:
    model = case.model()
    spec = register_model(monkeypatch, model)
    env = Env(tmp=tmp_path, spec=spec, out=tmp_path / "out" / "run", monkeypatch=monkeypatch)
    argv = case.argv(env)
    if case.output_dir:
        argv = [*argv, "--output-dir", str(env.out)]
    before = snapshot(model)
    listing = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    res = cli(argv, stdin=case.stdin)
    monkeypatch.undo()  # os.access / os.fsync back before the checks below touch files
    return res, env, model, {"before": before, "listing": listing}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    reason = case.skip()
    if reason:
        pytest.skip(reason)
    res, env, model, saved = _run(case, tmp_path, monkeypatch, cli)
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    errs = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errs) == 1 and lines[-1] == errs[0], f"expected one error line, got:\n{res.stderr}"
    line = errs[0]
    assert not line.startswith("error: unexpected "), f"an unforeseen exception reached the edge: {line}"
    assert res.exit_code == case.code, (res.exit_code, line)
    for needle in case.needles:
        assert needle.lower() in line.lower(), f"{needle!r} not in {line!r}"
    if case.code != E.EXIT_CHECK_FAILED:  # a failed check still prints its report
        assert res.stdout.strip() == "", f"a failed run printed a report: {res.stdout[:200]}"
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert not [p for p in after if ".inspect-model-staging-" in p], "staging files left behind"
    if case.code == E.EXIT_CHECK_FAILED and env.out.exists():
        # A failed check is a verdict on a finished run: its report is complete, for CI to read.
        import json

        reports = list(env.out.glob("*.json"))
        assert reports and all(json.loads(r.read_text())["command"] for r in reports)
    else:
        # Nothing lost, nothing half-written: the tree under tmp_path is as before.
        assert after == saved["listing"], f"files left behind: {sorted(set(after) - set(saved['listing']))}"
        assert not env.out.exists()
    assert_same(model, saved["before"])


def test_corpus_is_large_and_covers_every_code() -> None:
    assert len(CASES) >= 30
    codes = {c.code for c in CASES}
    assert codes == {E.EXIT_CHECK_FAILED, E.EXIT_USAGE, E.EXIT_MODEL_LOAD, E.EXIT_INPUT, E.EXIT_LAYER,
                     E.EXIT_RUNTIME, E.EXIT_OUTPUT}
    assert len(set(errors.EXIT_CODES)) == len(errors.EXIT_CODES)  # one code, one meaning
    assert len({c.id for c in CASES}) == len(CASES)


# ------------------------------------------------------------------ handled, with a warning
def _img(env: Env, name: str, make: Callable[[], object], **save: object) -> str:
    buf = io.BytesIO()
    make().save(buf, **save)  # type: ignore[attr-defined]
    return env.write(name, buf.getvalue())


def _gif(env: Env) -> str:
    from PIL import Image

    frames = [Image.new("RGB", (16, 16), (i * 80, 0, 0)) for i in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=50)
    return env.write("anim.gif", buf.getvalue())


def _png16(env: Env) -> str:
    import numpy as np
    from PIL import Image

    arr = (np.arange(16 * 16, dtype=np.uint16).reshape(16, 16) * 250)
    return _img(env, "deep.png", lambda: Image.fromarray(arr), format="PNG")  # mode I;16


def _cmyk(env: Env) -> str:
    from PIL import Image

    return _img(env, "print.jpg", lambda: Image.new("CMYK", (16, 16), (0, 128, 255, 10)), format="JPEG")


HANDLED = [  # (id, argv, model, warning expected on stderr or None)
    ("image-16-bit-png", lambda e: ["cam", e.spec, "--weights", "none", _png16(e)], TinyCNN, None),
    ("image-cmyk-jpeg", lambda e: ["guided-backprop", e.spec, "--weights", "none", _cmyk(e)], TinyCNN, None),
    ("image-animated-gif", lambda e: ["activations", e.spec, "--weights", "none", _gif(e)], TinyCNN,
     ("anim.gif", "3 frames", "first")),
    ("guided-no-relu", lambda e: ["guided-backprop", e.spec, "--weights", "none", "--input-size", "3x8x8"], NoReLU,
     ("relu",)),
    ("cam-nan-map", lambda e: ["cam", e.spec, "--weights", "none", "--input-size", "3x8x8"], NaNOut, ("nan",)),
]


@pytest.mark.parametrize(("argv", "model_cls", "warning"), [h[1:] for h in HANDLED], ids=[h[0] for h in HANDLED])
def test_handled_input(argv, model_cls, warning, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    """Odd but valid inputs are converted (16-bit, CMYK) or used with a warning (the first
    frame of a GIF; a model guided backprop or CAM cannot really explain): exit 0, files
    written, the model untouched."""
    model = model_cls()
    env = Env(tmp=tmp_path, spec=register_model(monkeypatch, model), out=tmp_path / "out", monkeypatch=monkeypatch)
    before = snapshot(model)
    res = cli([*argv(env), "--output-dir", str(env.out)])
    assert res.exit_code == 0, res.stderr
    assert "Traceback" not in res.stderr and "error:" not in res.stderr
    assert any(p.suffix == ".png" for p in env.out.rglob("*")), "no image written"
    if warning:
        warn = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: ")]
        assert any(all(w.lower() in ln.lower() for w in warning) for ln in warn), res.stderr
    assert_same(model, before)


# ------------------------------------------------------------------ security
def test_model_file_is_run_and_help_says_so(tmp_path: Path, cli) -> None:
    """`file.py:name` executes the file (as `python file.py` would, but not its __main__
    block); every model-taking subcommand's help says so plainly."""
    marker = tmp_path / "ran.txt"
    src = USER_FILE + f"\nopen({str(marker)!r}, 'w').write('top level ran')\n" \
        + f"if __name__ == '__main__':\n    open({str(marker)!r}, 'w').write('main ran')\n"
    p = tmp_path / "side_effect.py"
    p.write_text(src)
    res = cli(["summary", f"{p}:Net", "--input-size", "3x8x8", "--quiet"])
    assert res.exit_code == 0, res.stderr
    assert marker.read_text() == "top level ran"
    for command in ("summary", "activations", "grads", "guided-backprop", "cam", "check"):
        text = " ".join(cli([command, "--help"]).stdout.split())
        assert "this runs that code" in text, command
        assert "FILE.py:FACTORY" in text, command


class Escaper(nn.Module):
    """Layer names that try to climb out of the output directory. torch's add_module refuses
    names with a dot, so '../../etc' goes straight into ``_modules`` (as a loaded pickle or
    hand-written container could); '/etc' (absolute) passes add_module as it is."""

    def __init__(self) -> None:
        super().__init__()
        with pytest.raises(KeyError):
            self.add_module("../../etc", nn.Identity())
        self._modules["../../etc"] = nn.Conv2d(3, 4, 3, padding=1)
        self.add_module("/etc", nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self._modules["/etc"](self._modules["../../etc"](x))
        return self.fc(torch.flatten(self.pool(h), 1))


ESCAPE_RUNS = {
    "activations": ["--layers", "../../etc", "--layers", "/etc", "--save-raw"],
    "cam": ["--layer", "../../etc", "--layer", "/etc", "--fuse", "--save-raw"],
    "grads": ["--of", "/etc", "--wrt", "../../etc"],
    "guided-backprop": ["--guided-gradcam", "--layer", "../../etc", "--save-raw"],
}


@pytest.mark.parametrize("command", list(ESCAPE_RUNS))
def test_output_names_cannot_escape(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli) -> None:
    model = Escaper()
    spec = register_model(monkeypatch, model)
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    imgs = tmp_path / "imgs"
    (imgs / "sub").mkdir(parents=True)
    names = ["..jpg", "...jpg", "~root.jpg", "sub/-rf .jpg", "%2e%2e%2fx.jpg"]
    for n in names:
        (imgs / n).write_bytes(_jpeg())
    out = deep / "out"
    stdin = "\n".join(str(imgs / "sub" / ".." / n) for n in names) + "\n"  # '..' components in the paths
    before = snapshot(model)
    res = cli([command, spec, "--weights", "none", "--input-size", "3x8x8", "-", "-o", str(out),
               *ESCAPE_RUNS[command]], stdin=stdin)
    assert res.exit_code == 0, res.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file() and imgs not in p.parents]
    assert written and all(out in p.parents for p in written), [str(p) for p in written if out not in p.parents]
    assert not (tmp_path / "etc").exists() and not Path("/etc/x.png").exists()
    if command != "grads":  # grads --of/--wrt writes one figure per batch, not per image
        assert len(list(out.rglob("*.png"))) >= len(names)  # a picture per image at least: none overwritten
    assert_same(model, before)


def test_checkpoint_payload_test_exists() -> None:
    """Checkpoints load with weights_only=True unless --trust-checkpoint; the payload test
    (a pickle whose payload must not run) is tests/unit/loading/test_loading.py, not repeated here."""
    import unit.loading.test_loading as test_loading

    assert callable(test_loading.test_malicious_pickle_does_not_run_without_trust)
