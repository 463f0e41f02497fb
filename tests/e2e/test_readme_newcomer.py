"""What a newcomer reads first in README.md (issue 39, items 1, 2, 13 and 15): the Quick start
states size and time with the CPU-only line beside the command; the test section states the
full run's duration and a quick line; the offline form of each section's first example; the
attributions table's captum peer for SmoothGrad is the signed one; a CI section with both."""

from __future__ import annotations

import re

from conftest import ROOT

README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(title)
    nxt = re.search(r"^## ", README[start + len(title):], re.M)
    return README[start:start + len(title) + (nxt.start() if nxt else len(README))]


def test_quick_start_states_size_time_and_the_cpu_only_line() -> None:
    quick = _section("## Quick start")
    first = re.search(r"```bash\n(.*?)```", quick, re.S).group(1)
    assert "--index-url https://download.pytorch.org/whl/cpu" in first  # beside the command, not 20 lines later
    assert "inspect-model summary resnet34" in first
    assert re.search(r"about [\d.]+ GB installed", quick) and "5.6 GB" in quick and "minute" in quick


def test_test_section_states_durations_and_a_quick_line() -> None:
    quick = _section("## Quick start")
    assert re.search(r"minutes on an idle 2-core machine", quick)
    assert re.search(r"under [23] minutes", quick)  # the quick tier's bound, as README states it
    assert 'python -m pytest -q -p no:cacheprovider -m "not slow" -n 2' in quick


def test_each_commands_first_example_says_the_offline_form() -> None:
    for title in ("## `activations`", "## `grads`", "## `guided-backprop`", "## `cam`", "## `attributions`",
                  "## `attention`"):
        first = next(ln for ln in _section(title).splitlines() if ln.startswith("inspect-model "))
        assert "offline: add --weights none" in first, title


def test_smoothgrad_peer_is_the_signed_noise_tunnel() -> None:
    row = next(ln for ln in README.splitlines() if ln.startswith("| `smoothgrad`"))
    assert "NoiseTunnel(Saliency)" in row and "abs=False" in row


def test_ci_section_has_the_action_and_the_hook() -> None:
    ci = _section("## CI")
    assert "uses: OWNER/inspect-model@" in ci and "action.yml" in ci and "action/steps.sh" in ci
    assert ".pre-commit-hooks.yaml" in ci and "id: inspect-model-check" in ci
