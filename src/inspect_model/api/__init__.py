"""The Python API: one function per command, each a request in and a :class:`Result` out.

``im.cam(model, images, methods=[...])``, ``im.activations``, ``im.grads``,
``im.guided_backprop``, ``im.summary`` and ``im.check`` take a model (a spec such as
``resnet18``, an ``nn.Module`` or a ``LoadedModel``) and images (paths, or a tensor
(N, C, H, W)). The result's ``to_dict()`` is exactly the CLI's ``--json`` document and
``save(dir)`` writes exactly the CLI's files; nothing is printed. The model is always
given back as it was (hooks, flags, weights).
"""

from __future__ import annotations

from inspect_model.api.activations import activations
from inspect_model.api.attention import attention
from inspect_model.api.cam import cam
from inspect_model.api.check import check
from inspect_model.api.grads import grads
from inspect_model.api.guided import guided_backprop
from inspect_model.api.options import InputOptions, ModelOptions
from inspect_model.api.pipeline import Result
from inspect_model.api.summary import summary

__all__ = ["InputOptions", "ModelOptions", "Result", "activations", "attention", "cam", "check", "grads", "guided_backprop",
           "summary"]
