"""Shared test setup: seeded torch, tiny models, a CLI runner that calls main()."""

from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
SAMPLE_IMAGES = ROOT / "sample_images"

os.environ.setdefault("MPLBACKEND", "Agg")

try:  # Hypothesis profiles (tests/e2e/test_fuzz.py): `pytest --hypothesis-profile long` for longer runs
    from hypothesis import HealthCheck, Phase, settings

    _slow = [HealthCheck.too_slow, HealthCheck.data_too_large]
    # ci: fixed seed, bounded examples; the default.
    # No "explain" phase in CI: on a failure it re-runs every example under a tracer (minutes).
    settings.register_profile("ci", max_examples=40, derandomize=True, deadline=None, suppress_health_check=_slow,
                              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
    settings.register_profile("long", max_examples=600, deadline=None, suppress_health_check=_slow)
    settings.load_profile("ci")  # --hypothesis-profile NAME (the plugin) loads another after this
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    pass


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (README's ``-n 2``) each worker computes on one thread: two workers
    of torch's default thread count (one per core) would put 2N spinning threads on N cores.
    ``INSPECT_MODEL_TEST_THREADS`` overrides it."""
    threads = os.environ.get("INSPECT_MODEL_TEST_THREADS") or ("1" if os.environ.get("PYTEST_XDIST_WORKER") else "")
    if threads:
        import torch

        torch.set_num_threads(int(threads))
        os.environ.setdefault("OMP_NUM_THREADS", threads)  # processes the tests start


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files in tests/golden")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tiers (issue 35): every test under tests/e2e/ (README lines, registry sweeps,
    torchrun, benchmarks) is ``slow``, so ``-m "not slow"`` leaves the end-to-end tier out."""
    e2e = ROOT / "tests" / "e2e"
    for item in items:
        if Path(str(item.path)).is_relative_to(e2e):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(autouse=True)
def _seed() -> None:
    import torch

    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _shared_between_workers(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Under pytest-xdist, a folder the workers of this run share (their base temporary
    folders' parent): tests/fixtures/dense.py trains its models once per run there."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["INSPECT_MODEL_TEST_SHARED"] = str(tmp_path_factory.getbasetemp().parent / "shared")


@pytest.fixture(autouse=True)
def _offline_torch_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # Never touch the user's hub cache; tests that need cached weights write them here.
    home = tmp_path_factory.getbasetemp() / "torch_home"
    monkeypatch.setenv("TORCH_HOME", str(home))


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(args: list[str], stdin: str | None = None) -> CliResult:
    """Run ``inspect-model ARGS`` in-process; capture stdout/stderr and the exit code."""
    from inspect_model.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin, sys.stdout, sys.stderr
    sys.stdin = io.StringIO(stdin or "")
    sys.stdout, sys.stderr = out, err
    code = 0
    try:
        main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdin, sys.stdout, sys.stderr = old
    return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def models_py(tmp_path: Path) -> Path:
    """A user model file exposing the fixtures as FILE.py:NAME factories."""
    src = (ROOT / "tests" / "fixtures" / "models.py").read_text()
    p = tmp_path / "user_models.py"
    p.write_text(src)
    return p
