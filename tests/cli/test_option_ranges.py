"""Counts and ranges checked where they are parsed (issue 41): options, config files and the
Python API give the same one-line usage error, before anything loops over the value or
hands it to torch; and every environment variable goes through one typed reader."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fixtures.videos import video_net_file
from inspect_model.errors import UsageError
from inspect_model.loading.limits import BOUNDS, check_option
from inspect_model.loading.video import ClipOptions, clip_indices

IN = ["--weights", "none", "--input-size", "3x16x16", "--quiet"]


def _usage(res) -> str:  # type: ignore[no-untyped-def]
    lines = [ln for ln in res.stderr.strip().splitlines() if not ln.startswith("note: ")]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (res.exit_code, res.stderr)
    assert "Traceback" not in res.stderr and "unexpected" not in lines[0]
    return lines[0]


def _both(cli, tmp_path: Path, command: list[str], key: str, value: object) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """The error of ``--key value`` on the command line and of ``key = value`` in a config file."""
    start = time.monotonic()
    line = _usage(cli([*command, f"--{key}", str(value)]))
    cfg = tmp_path / f"{key}.toml"
    cfg.write_text(f"{key} = {value}\n")
    from_config = _usage(cli([*command, "--config", str(cfg)]))
    assert time.monotonic() - start < 60
    return line, from_config


# ------------------------------------------------------------------ the issue's examples
def test_the_issue_example_two_billion_clips_fail_at_once(cli, tmp_path: Path) -> None:
    cmd = ["activations", f"{video_net_file(tmp_path)}:build", str(tmp_path / "v.mp4")]
    line, from_config = _both(cli, tmp_path, cmd, "clips", 2_000_000_000)
    assert line == from_config == "error: --clips must be a whole number from 1 to 10,000, got 2000000000"


@pytest.mark.parametrize("command", ["activations", "summary", "cam", "attributions"])
def test_the_issue_example_a_seed_of_2_to_the_64(command: str, cli, tmp_path: Path, models_py: Path) -> None:
    cmd = [command, f"{models_py}:TinyCNN", *IN]
    line, from_config = _both(cli, tmp_path, cmd, "seed", 2**64)
    assert line == from_config
    assert line == f"error: --seed must be a whole number from 0 to 4,294,967,295, got {2**64}"


def test_the_largest_seed_runs(cli, models_py: Path) -> None:
    r = cli(["grads", f"{models_py}:TinyCNN", *IN, "--seed", str(2**32 - 1), "--json"])
    assert r.exit_code == 0, r.stderr


# ------------------------------------------------------------------ neighbours: every count
@pytest.mark.parametrize("command,key,value,needle", [
    ("activations", "frames", 10**9, "--frames must be a whole number from 1 to 4,096"),
    ("activations", "stride", 10**12, "--stride must be a whole number from 1 to 100,000"),
    ("activations", "batch-size", 10**12, "--batch-size must be a whole number from 1 to 65,536"),
    ("attributions", "steps", 10**10, "--steps must be a whole number from 1 to 100,000"),
    ("attributions", "samples", 10**10, "--samples must be a whole number from 1 to 100,000"),
    ("cam", "eval-steps", 10**10, "--eval-steps must be a whole number from 1 to 100,000"),
    ("cam", "eval-batch", 10**10, "--eval-batch must be a whole number from 1 to 65,536"),
    ("cam", "scorecam-batch", 10**10, "--scorecam-batch must be a whole number from 1 to 65,536"),
    ("cam", "top", 10**10, "--top must be a whole number from 1 to 100,000"),
    ("summary", "batch-size", 10**10, "--batch-size must be a whole number from 1 to 65,536"),
    ("check", "max-seconds", "1e308", "--max-seconds must be a number from 0 to 1e+09"),
])
def test_every_count_has_a_range_on_the_line_and_in_config(command: str, key: str, value: object, needle: str,
                                                           cli, tmp_path: Path, models_py: Path) -> None:
    cmd = [command, f"{models_py}:TinyCNN", *IN]
    line, from_config = _both(cli, tmp_path, cmd, key, value)
    assert line == from_config and needle in line, (line, from_config)


@pytest.mark.parametrize("window", ["99999999999", "3,16,16,16,16,16,16,16,16", "16x1000000"])
def test_occlusion_windows_are_checked_where_parsed(window: str, cli, models_py: Path) -> None:
    r = cli(["attributions", f"{models_py}:TinyCNN", *IN, "--method", "occlusion", "--window", window])
    assert "--window" in _usage(r)


def test_the_api_checks_the_same_ranges() -> None:
    with pytest.raises(UsageError, match="--clips must be a whole number from 1 to 10,000"):
        ClipOptions(clips=2_000_000_000)
    from inspect_model.api.attributions import AttributionsRequest

    with pytest.raises(UsageError, match="--steps must be a whole number"):
        AttributionsRequest(steps=10**9)
    for flag, (low, high) in BOUNDS.items():
        assert check_option(flag, low) == low and check_option(flag, high) == high
        with pytest.raises(UsageError, match=flag):
            check_option(flag, high * 2 + 1)
        with pytest.raises(UsageError, match=flag):
            check_option(flag, float("nan"))


def test_a_clip_plan_never_loops_over_clips_it_cannot_place() -> None:
    start = time.monotonic()
    plans = clip_indices(100, 4, 1, 10_000)
    assert time.monotonic() - start < 1.0
    assert len(plans) == 97 and plans[0] == [0, 1, 2, 3] and plans[-1] == [96, 97, 98, 99]


# ------------------------------------------------------------------ the environment
@pytest.mark.parametrize("value,offline", [("off", False), ("0", False), ("no", False), ("FALSE", False),
                                           ("on", True), ("1", True), ("yes", True), ("True", True)])
def test_the_issue_example_offline_off_is_not_offline(value: str, offline: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from inspect_model.loading.hub_models import offline as hub_offline
    from inspect_model.settings import env_flag

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("INSPECT_MODEL_OFFLINE", value)
    assert env_flag("INSPECT_MODEL_OFFLINE") is offline
    assert (hub_offline() == "INSPECT_MODEL_OFFLINE") is offline


def test_torchvision_weights_honour_offline_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The torchvision source read the flag its own way ("off" meant offline): now the one reader."""
    import inspect

    from inspect_model.loading.sources import torchvision as tv

    assert 'os.environ.get("INSPECT_MODEL_OFFLINE"' not in inspect.getsource(tv)
    assert "env_flag(\"INSPECT_MODEL_OFFLINE\")" in inspect.getsource(tv)


@pytest.mark.parametrize("name,value", [
    ("INSPECT_MODEL_DIST_TIMEOUT", "1e308"), ("INSPECT_MODEL_DIST_TIMEOUT", "inf"),
    ("INSPECT_MODEL_CHECKPOINT_SECONDS", "1e300"), ("INSPECT_MODEL_PROGRESS_SECONDS", "1e20"),
    ("INSPECT_MODEL_RENDER_THREADS", "99999999999999999999999"), ("INSPECT_MODEL_OFFLINE", "maybe"),
    ("INSPECT_MODEL_DIST_BACKEND", "mpi"),
])
def test_every_variable_is_read_by_the_typed_reader_with_bounds(name: str, value: str, cli, models_py: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    line = _usage(cli(["summary", f"{models_py}:TinyCNN", "--input-size", "3x16x16"]))
    assert line.startswith(f"error: environment variable {name}={value!r} is not"), line


def test_the_distributed_timeout_is_read_through_the_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from inspect_model.settings import SECONDS_MAX, VARIABLES, env_float, read

    assert set(VARIABLES) >= {"INSPECT_MODEL_DIST_TIMEOUT", "INSPECT_MODEL_OFFLINE", "INSPECT_MODEL_PROGRESS_SECONDS"}
    monkeypatch.setenv("INSPECT_MODEL_DIST_TIMEOUT", str(SECONDS_MAX))
    timedelta(seconds=env_float("INSPECT_MODEL_DIST_TIMEOUT", 1800.0, positive=True))  # the highest fits timedelta
    monkeypatch.setenv("INSPECT_MODEL_DIST_TIMEOUT", "1e308")
    with pytest.raises(UsageError, match="at most 1e"):
        read("INSPECT_MODEL_DIST_TIMEOUT")
