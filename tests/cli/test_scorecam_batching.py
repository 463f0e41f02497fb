"""Score-CAM's masked passes: batched across images and channels, run on an inference copy
of the model (BatchNorm folded, channels_last), the batch chosen by a memory budget. Checked
against Score-CAM's definition computed directly: one masked input at a time through the
unchanged model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fixtures.models import assert_unchanged, model_state
from inspect_model.methods.cam import maths as cm
from inspect_model.methods.cam import passes as cp
from inspect_model.methods.inference_copy import InferenceRunner, fused_copy


def bn_net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                        nn.Conv2d(6, 5, 3, padding=1), nn.BatchNorm2d(5), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(5, 4))
    for m in net.modules():  # running statistics that are not the identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return net.eval()


def reference_weights(model: nn.Module, x: torch.Tensor, A: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """Wang et al. 2020: the target's softmax probability on X * H_k, one input at a time."""
    out = torch.empty(A.shape[0], classes.shape[1], A.shape[1])
    with torch.no_grad():
        for i in range(A.shape[0]):
            masks = cm.scorecam_masks(A[i], tuple(x.shape[-2:]))
            for k in range(A.shape[1]):
                p = model(x[i:i + 1] * masks[k]).softmax(1)[0]
                out[i, :, k] = p[classes[i]]
    return out


@pytest.mark.parametrize("batch", [1, 4, 7, None])
def test_masked_passes_across_images_equal_the_definition(batch: int | None) -> None:
    model = bn_net()
    torch.manual_seed(1)
    x = torch.randn(3, 3, 12, 12)
    A = torch.relu(torch.randn(3, 5, 4, 4))
    classes = torch.tensor([[0, 2], [1, 3], [3, 0]])
    before = model_state(model)
    calls: list[tuple[int, int, str]] = []
    weights, passes = cp.scorecam(model, x, A, classes, None, batch, lambda d, t, lab: calls.append((d, t, lab)))
    assert_unchanged(model, before)
    assert passes == -(-15 // (batch or 15)) and [c[:2] for c in calls] == [(i, passes) for i in range(1, passes + 1)]
    torch.testing.assert_close(weights, reference_weights(model, x, A, classes), atol=2e-5, rtol=1e-4)


def test_inference_copy_folds_batchnorm_and_leaves_the_model_alone() -> None:
    model = bn_net()
    before = model_state(model)
    fast = fused_copy(model)
    assert fast is not None and not any(isinstance(m, nn.BatchNorm2d) for m in fast.modules())
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        torch.testing.assert_close(fast(x.contiguous(memory_format=torch.channels_last)), model(x),
                                   atol=1e-5, rtol=1e-5)
    assert_unchanged(model, before)
    runner = InferenceRunner(model, model, lambda out: out, inputs=1000)
    for _ in range(2):
        with torch.no_grad():
            torch.testing.assert_close(runner.probs(x), model(x).softmax(1), atol=1e-5, rtol=1e-5)
    assert runner.used_copy


class Branchy(nn.Module):
    """Control flow on a tensor's value: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if y.mean() > 100:  # never true; fx refuses to trace it
            y = -y
        return self.fc(y.mean(dim=(2, 3)))


def test_models_without_a_faithful_copy_run_as_they_are() -> None:
    x = torch.randn(2, 3, 8, 8)
    model = Branchy().eval()
    assert fused_copy(model) is None
    runner = InferenceRunner(model, model, lambda out: out, inputs=1000)
    torch.testing.assert_close(runner.probs(x), model(x).softmax(1).detach())
    assert not runner.used_copy
    hooked = bn_net()
    seen: list[int] = []
    handle = hooked[2].register_forward_hook(lambda m, i, o: seen.append(1))
    try:
        assert fused_copy(hooked) is None  # the user's hook would not run on a copy
        runner = InferenceRunner(hooked, hooked, lambda out: out, inputs=1000)
        runner.probs(torch.randn(1, 3, 8, 8))
        runner.probs(torch.randn(1, 3, 8, 8))
        assert len(seen) == 2
    finally:
        handle.remove()
    assert fused_copy(bn_net().train()) is None
    few = InferenceRunner(bn_net(), bn_net(), lambda out: out, inputs=20)  # too few inputs to pay for a copy
    few.probs(x)
    assert not few.used_copy


def test_batch_size_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.zeros(2, 3, 224, 224)  # one input: 602,112 bytes; x 24 = 14.45 MB
    assert cp.scorecam_batch_size(x, 4096, 5) == 5
    # A CPU takes at most 64 a pass, and at most 4 MiB of input: 6 inputs of 3x224x224, 27 of
    # 3x112x112, 64 (not 85) of 3x64x64; the 1 GiB memory budget (24 bytes an input byte) allows more.
    assert (1 << 30) // (24 * 3 * 224 * 224 * 4) == 74
    assert cp.scorecam_batch_size(x, 4096, None) == (4 << 20) // (3 * 224 * 224 * 4) == 6
    assert cp.scorecam_batch_size(torch.zeros(1, 3, 112, 112), 4096, None) == 27
    assert cp.scorecam_batch_size(torch.zeros(1, 3, 64, 64), 4096, None) == cp.CPU_MAX_BATCH == 64
    assert cp.scorecam_batch_size(torch.zeros(1, 3, 64, 64), 10, None) == 10  # never more than there are inputs
    assert cp.scorecam_batch_size(torch.zeros(1, 3, 4096, 4096), 100, None) == 1
    # The accelerator branch, run on the CPU: half of the free memory reported by CUDA.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 << 30, 80 << 30))
    assert cp.memory_budget(torch.device("cuda")) == 4 << 30
    assert cp.memory_budget(torch.device("cpu")) == cp.CPU_BUDGET
    # Off the CPU the cap is SCORECAM_MAX_BATCH (a meta tensor stands for an accelerator's here).
    assert cp.scorecam_batch_size(torch.zeros(2, 3, 64, 64, device="meta"), 4096, None) == cp.SCORECAM_MAX_BATCH
    assert cp.scorecam_batch_size(torch.zeros(1, 3, 448, 448, device="meta"), 4096, None) == (1 << 30) // (
        24 * 3 * 448 * 448 * 4) == 18  # the memory budget (a meta device's: 1 GiB) binds before the cap


def test_equal_masks_run_once_and_constant_channels_share_the_zero_input() -> None:
    """Channels whose maps differ only in scale and offset give the same mask, and constant
    channels the all-zero input: each distinct input runs once, and every channel's weight
    still equals the definition."""
    model = bn_net()
    torch.manual_seed(2)
    x = torch.randn(2, 3, 12, 12)
    A = torch.relu(torch.randn(2, 6, 4, 4))
    A[0, 1] = 3.0 * A[0, 0] + 0.5  # the same pattern as channel 0
    A[0, 2] = 0.0  # constant
    A[1, 4] = 7.0  # constant, another image
    A[1, 5] = 2.0 * A[1, 3]
    reps, inverse = cp.distinct_masks(A)
    assert len(reps) == 1 + 4 + 4  # the zero input, 4 distinct patterns in each image
    assert int(inverse[0]) == int(inverse[1]) and int(inverse[9]) == int(inverse[11])
    assert int(inverse[2]) == int(inverse[10]) == 0 and int(reps[0]) == -1
    classes = torch.tensor([[1, 3], [2, 0]])
    weights, passes = cp.scorecam(model, x, A, classes, None, 4, None)
    assert passes == 3  # 9 distinct inputs in passes of 4, not 12
    torch.testing.assert_close(weights, reference_weights(model, x, A, classes), atol=2e-5, rtol=1e-4)


def test_the_traced_copy_is_used_when_it_is_faithful_and_refused_when_tracing_warns() -> None:
    from inspect_model.methods.inference_copy import traced_copy

    model = bn_net()
    x = torch.randn(3, 3, 12, 12)
    fast = traced_copy(model, x)
    assert isinstance(fast, torch.jit.ScriptModule)
    assert not any("BatchNorm" in n.kind() for n in fast.graph.nodes())  # folded into the convolutions
    with torch.no_grad():
        torch.testing.assert_close(fast(x[:2]), model(x[:2]), atol=1e-5, rtol=1e-5)  # another batch size
    assert traced_copy(Branchy().eval(), x) is None  # `if y.mean() > 100`: a trace would bake it in
