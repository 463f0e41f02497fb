"""The attention family's methods and their properties: what ``--method`` parsing, ``all``,
help, completion and the schema's enum read. The maps themselves are computed together, in
one forward pass and one backward pass per gradient method (:mod:`.passes`, :mod:`.text`);
CAM-family methods an attention run adds come from :mod:`inspect_model.methods.cam.base`.
Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionMethod:
    name: str
    title: str
    paper: str
    needs_gradients: bool = False  # a backward pass of the target's score (or per layer)
    score_backward: bool = False  # the backward pass of the target's score, shared with gradient CAMs
    per_layer: bool = False  # reads --layers (raw, legrad)
    all_layers: bool = False  # folds every attention layer (rollout, grad-rollout)
    needs_head: bool = False  # scores each block's tokens through the model's head (legrad)
    class_independent: bool = False  # the same map for every target


REGISTRY: dict[str, AttentionMethod] = {}


def register(method: AttentionMethod) -> AttentionMethod:
    if method.name in REGISTRY and REGISTRY[method.name] != method:
        raise ValueError(f"attention method '{method.name}' is already registered")
    REGISTRY[method.name] = method
    return method


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def gradient_names() -> tuple[str, ...]:
    return tuple(n for n, m in REGISTRY.items() if m.needs_gradients)


def method_help() -> str:
    """``--method``'s help, from the attention and CAM registries."""
    from inspect_model.methods.cam.base import shared_pass_names

    return (f"{', '.join(REGISTRY)} or all; also CAM methods ({', '.join(shared_pass_names())}) from the same "
            "passes, at --cam-layer; repeat or comma-separate.")


register(AttentionMethod("raw", "raw attention", "the attention weights of chosen layers and heads",
                         per_layer=True, class_independent=True))
register(AttentionMethod("rollout", "attention rollout", "Abnar & Zuidema 2020", class_independent=True,
                         all_layers=True))
register(AttentionMethod("grad-rollout", "gradient rollout", "Chefer et al. 2021", needs_gradients=True,
                         score_backward=True, all_layers=True))
register(AttentionMethod("legrad", "LeGrad", "Bousselham et al. 2024", needs_gradients=True, per_layer=True,
                         needs_head=True))


def all_names() -> tuple[str, ...]:
    """Every ``--method`` an attention run takes: its own methods, then the CAM methods it adds."""
    from inspect_model.methods.cam.base import shared_pass_names

    return (*names(), *shared_pass_names())
