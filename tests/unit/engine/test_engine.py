"""The hook engine and the layer spec language."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fixtures.models import (
    Boom,
    DictOut,
    Nested,
    ReusedReLU,
    TinyCNN,
    assert_unchanged,
    model_state,
)
from inspect_model.engine.hooks import CaptureOptions, HookEngine, flatten_tensors, run_forward
from inspect_model.engine.selection import select_layers
from inspect_model.errors import LayerSelectionError, ModelRuntimeError
from inspect_model.methods.stats import tensor_stats


# ------------------------------------------------------------------ selection
def test_default_selection_is_leaves_in_module_order() -> None:
    assert select_layers(TinyCNN()) == [
        "features.0", "features.1", "features.2", "features.3", "features.4", "pool", "fc"
    ]
    assert select_layers(Nested()) == ["block.0.0", "block.0.1", "block.1"]


def test_spec_forms() -> None:
    m = TinyCNN()
    assert select_layers(m, ["type:Conv2d"]) == ["features.0", "features.3"]
    assert select_layers(m, ["type:Conv2d[-1]"]) == ["features.3"]
    assert select_layers(m, ["type:Conv2d|Linear[1:]"]) == ["features.3", "fc"]
    assert select_layers(m, ["features.*"]) == ["features.0", "features.1", "features.2", "features.3", "features.4"]
    assert select_layers(m, ["features"]) == ["features"]  # an exact name selects the container
    assert select_layers(m, ["fc", "features.0"]) == ["features.0", "fc"]  # union, model order
    assert select_layers(m, depth=1) == ["features", "pool", "fc"]
    assert select_layers(m, ["type:nn.ReLU"]) == ["features.2", "features.4"]


def test_resnet34_has_36_convs() -> None:
    import torchvision

    with torch.device("meta"):
        m = torchvision.models.resnet34()
    assert len(select_layers(m, ["type:Conv2d"])) == 36
    assert select_layers(m, ["layer4.1.conv2"]) == ["layer4.1.conv2"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("featurez.0", "layer 'featurez.0' not found; did you mean 'features.0'"),
        ("type:Conv3d", "layer spec 'type:Conv3d' selects no layer; did you mean 'Conv2d'?"),
        ("type:Conv2d[5]", "position [5] is out of range; it selects 2 layer(s), positions 0..1"),
        ("nothing.*", "layer spec 'nothing.*' selects no layer"),
        ("", "empty layer spec"),
    ],
)
def test_bad_specs_explain_themselves(spec: str, message: str) -> None:
    with pytest.raises(LayerSelectionError) as exc:
        select_layers(TinyCNN(), [spec])
    assert message in str(exc.value)


# ------------------------------------------------------------------ engine
def test_reused_module_gives_one_record_per_call() -> None:
    m = ReusedReLU()
    with HookEngine(m, select_layers(m)) as eng:
        m(torch.randn(2, 4))
    assert [r.key for r in eng.finalize()] == ["fc1", "relu#0", "fc2", "relu#1"]
    assert [r.outputs[0].shape for r in eng.records] == [(2, 6), (2, 6), (2, 3), (2, 3)]


def test_kept_output_is_not_overwritten_by_later_inplace_relu() -> None:
    m = TinyCNN().eval()
    x = torch.randn(2, 3, 8, 8)
    with HookEngine(m, ["features.0"], CaptureOptions(keep=True)) as eng:
        m(x)
    expected = m.features[0](x)  # computed directly, no in-place op after it
    got = eng.records[0].outputs[0].tensor
    assert (got < 0).any() and torch.allclose(got, expected)


def test_streaming_stats_equal_direct_computation() -> None:
    m = TinyCNN()
    x = torch.randn(2, 3, 8, 8)
    with HookEngine(m, ["features.3"], CaptureOptions(stats_fn=tensor_stats)) as eng:
        m(x)
    m.eval()  # the engine runs the model in eval mode by default
    with torch.no_grad():
        t = m.features[3](torch.relu(m.features[1](m.features[0](x))))
    s = eng.records[0].outputs[0].stats
    assert eng.records[0].outputs[0].tensor is None  # streamed: nothing kept
    assert s.mean == pytest.approx(float(t.mean()), rel=1e-5)
    assert s.std == pytest.approx(float(t.std()), rel=1e-5)
    assert s.min == pytest.approx(float(t.min())) and s.max == pytest.approx(float(t.max()))
    assert s.negative_fraction == pytest.approx(float((t < 0).float().mean()))


def test_output_and_input_gradients_through_inplace_modules() -> None:
    m = TinyCNN()
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    m.eval()
    before = model_state(m)
    opts = CaptureOptions(output_grads=True, input_grads=True, keep_grads=True, grad_enabled=True)
    with HookEngine(m, ["features.0", "features.2", "features.3"], opts) as eng:
        out = m(x)
        out[:, 1].sum().backward()
    recs = {r.key: r for r in eng.finalize()}
    # Independent computation with autograd on named intermediates.
    x2 = x.detach().clone().requires_grad_()
    a = m.features[0](x2)
    b = m.features[1](a)
    c = torch.relu(b)
    d = m.features[3](c)
    y = m.fc(torch.flatten(m.pool(torch.relu(d)), 1))
    ga, gb, gc, gx = torch.autograd.grad(y[:, 1].sum(), [a, b, c, x2])
    assert torch.allclose(recs["features.0"].outputs[0].grad, ga, atol=1e-6)
    assert torch.allclose(recs["features.0"].inputs[0].grad, gx, atol=1e-6)
    assert torch.allclose(recs["features.2"].inputs[0].grad, gb, atol=1e-6)  # in-place ReLU's input
    assert torch.allclose(recs["features.3"].inputs[0].grad, gc, atol=1e-6)
    assert m.features[2].inplace is True
    assert_unchanged(m, before)


def test_graph_roots_stop_the_graph_and_give_layer_gradients() -> None:
    m = TinyCNN().eval()
    x = torch.randn(2, 3, 8, 8)
    before = model_state(m)
    opts = CaptureOptions(keep=True, keep_grads=True, output_grads=True, graph_roots={"features.3"},
                          freeze_params=True, grad_enabled=True)
    with HookEngine(m, ["features.0", "features.3"], opts) as eng:
        y = m(x)
        y[:, 0].sum().backward()
    recs = {r.key: r for r in eng.finalize()}
    conv0 = recs["features.0"].outputs[0]
    assert not conv0.requires_grad and conv0.grad is None  # below the root: no graph at all
    d = m.features[3](torch.relu(m.features[1](m.features[0](x))))
    d = d.detach().requires_grad_()
    y2 = m.fc(torch.flatten(m.pool(torch.relu(d)), 1))
    (g2,) = torch.autograd.grad(y2[:, 0].sum(), [d])
    act = recs["features.3"].outputs[0]
    assert torch.allclose(act.grad, g2, atol=1e-6) and torch.allclose(act.tensor, d)
    assert_unchanged(m, before)


def test_engine_restores_everything_when_forward_raises() -> None:
    m = Boom()
    m.train()
    m.a.weight.grad = torch.ones_like(m.a.weight)
    before = model_state(m)
    opts = CaptureOptions(freeze_params=True, output_grads=True, grad_enabled=False, eval_mode=True)
    with pytest.raises(ModelRuntimeError, match="forward pass failed in layer 'c': RuntimeError: boom"):
        with HookEngine(m, select_layers(m), opts) as eng:
            run_forward(eng, lambda: m(torch.randn(1, 4)))
    assert eng.failed_in == ["c"]
    assert_unchanged(m, before)
    assert m.training


def test_close_is_idempotent_and_patches_are_undone() -> None:
    m = TinyCNN()
    eng = HookEngine(m, ["fc"])
    eng.__enter__()
    eng.patch(m.features[2], "inplace", False)
    eng.close()
    eng.close()
    assert m.features[2].inplace is True
    assert not m.fc._forward_hooks


def test_flatten_nested_outputs() -> None:
    out = DictOut()(torch.randn(2, 4))
    keys = [k for k, _ in flatten_tensors(out)]
    assert keys == ["logits", "extra/0", "extra/1"]


def test_existing_user_hooks_survive() -> None:
    m = TinyCNN()
    seen = []
    h = m.fc.register_forward_hook(lambda mod, i, o: seen.append(o.shape))
    with HookEngine(m, ["fc"]):
        m(torch.randn(1, 3, 8, 8))
    m(torch.randn(1, 3, 8, 8))
    assert len(seen) == 2 and len(m.fc._forward_hooks) == 1
    h.remove()


def test_stats_of_nonfinite_and_empty() -> None:
    s = tensor_stats(torch.tensor([1.0, float("nan"), float("inf"), -1.0, 0.0]))
    assert (s.nan_count, s.inf_count) == (1, 1)
    assert s.mean == 0.0 and s.zero_fraction == pytest.approx(0.2)
    assert tensor_stats(torch.empty(0)).numel == 0


def test_device_is_restored() -> None:
    m = nn.Linear(2, 2)
    w = m.weight.detach().clone()
    with HookEngine(m, [""], device="cpu"):
        assert m.weight.device.type == "cpu"
    assert torch.equal(m.weight, w) and m.weight.device.type == "cpu"
