"""The command registry: one entry per command, from which everything else derives.

An entry names the command's request (its options), its API function, its renderer and
schema, and whether it hooks the model. The CLI's subcommands (cli/app.py builds them with
cli/generate.py), shell completion, ``HOOK_COMMANDS``, the lazy exports of
``inspect_model`` (``im.cam``), README's command table and the schema check all read
:data:`COMMANDS`. Adding a command is its request + session + renderer + one
:func:`register` call + tests. Entries refer to code by dotted path (``"module:attr"``), so
importing this module imports nothing heavy: ``--help`` stays instant.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CommandSpec:
    """One command (see the module docstring).

    ``request``: the request class (``"inspect_model.api.cam:CamRequest"``), whose fields are
    the command's own options; ``api``: the API function; ``cli``: a hand-written Typer
    function for the few commands whose options are not a request (``models``), else None
    (generated). ``images``: takes IMAGE... arguments and the shared input options;
    ``labels``: has ``--labels``; ``run``: the run options it has (None: all);
    ``streams``: runs through the pipeline (per-image items, ``--jsonl``, ``--resume``)."""

    name: str
    summary: str  # one line: the --help list and README's command table
    help: str  # the command's --help text (paragraphs); its example comes after
    example: str
    api: str
    request: str | None = None
    cli: str | None = None
    renderer: str | None = None  # "module:function(result, rich)": the report on stdout (built-ins: render.results)
    schema: str | None = None  # file name in inspect_model/schemas/
    hooks: bool = True  # registers hooks on the model (HOOK_COMMANDS: refuses models that cannot be hooked)
    images: bool = True
    labels: bool = True
    text: bool = False  # takes --text/--text-file/--tokenizer (Hugging Face text models; loading/text.py)
    run: tuple[str, ...] | None = None
    streams: bool = True
    usage: str = ""  # README table: the command's arguments as typed (``cam MODEL IMAGE...``)

    @property
    def api_name(self) -> str:
        """The Python name: ``guided-backprop`` -> ``guided_backprop``."""
        return self.name.replace("-", "_")

    def api_function(self) -> Any:
        return resolve(self.api)

    def request_class(self) -> Any:
        return None if self.request is None else resolve(self.request)


COMMANDS: dict[str, CommandSpec] = {}


def register(spec: CommandSpec, *, replace: bool = False) -> CommandSpec:
    """Add a command; ``replace`` to redefine one (tests). Order of registration is the
    order of ``--help``."""
    if spec.name in COMMANDS and not replace:
        raise ValueError(f"command '{spec.name}' is already registered")
    COMMANDS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    COMMANDS.pop(name, None)


def get(name: str) -> CommandSpec:
    return COMMANDS[name]


def names() -> tuple[str, ...]:
    return tuple(COMMANDS)


def hook_commands() -> frozenset[str]:
    """Commands that register hooks (a model that cannot be hooked is refused by these)."""
    return frozenset(n for n, s in COMMANDS.items() if s.hooks)


def resolve(dotted: str) -> Any:
    """``"package.module:attr"`` to the object."""
    module, _, attr = dotted.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def command_table() -> str:
    """README's command table (a Markdown table), from the registry."""
    rows = ["| command | what it does |", "| --- | --- |"]
    rows += [f"| `{s.usage or s.name}` | {s.summary} |" for s in COMMANDS.values()]
    return "\n".join(rows)


# ----------------------------------------------------------------------------- the commands
_EXIT_NOTE = ""

register(CommandSpec(
    name="summary", usage="summary MODEL",
    summary="layer table: qualified names, types, output shapes, parameters, MACs, memory",
    help="Show the layer table: names, types, output shapes, parameters, MACs and memory.\n\n"
         "Runs on the meta device by default, so a model of any size is summarised without allocating "
         "its weights.",
    example="inspect-model summary resnet34 --depth 2",
    api="inspect_model.api.summary:summary", cli="inspect_model.cli.summary:summary",
    schema="summary.json", hooks=True, images=False, streams=False,
))
register(CommandSpec(
    name="models", usage="models [PATTERN]",
    summary="list torchvision's model registry (or timm's)",
    help="List the models this tool can load by name.",
    example="inspect-model models 'resnet*'; inspect-model models --source timm 'convnext*'",
    api="inspect_model.api.models:models", request="inspect_model.api.models:ModelsRequest",
    cli="inspect_model.cli.models:models",
    schema="models.json", hooks=False, images=False, streams=False,
))
register(CommandSpec(
    name="activations", usage="activations MODEL [IMAGE...]",
    summary="per-layer activation statistics, feature-map grids",
    help="Activation statistics of every layer, and feature-map grids of the layers you name.\n\n"
         "Hooks the selected layers (every leaf by default) for one forward pass per batch and reports, per "
         "layer and per call: output shape, mean, std, min, max, exact zeros, negatives, NaN/Inf counts, and "
         "channels dead (zero) for every image, merged over all images. With --output-dir: an overview PNG "
         "along the depth of the network and, for the layers given with --layers, one feature-map grid PNG "
         "per layer and image.",
    example="inspect-model activations resnet34 cat.jpg --layer type:Conv2d[0] --output-dir acts",
    api="inspect_model.api.activations:activations", request="inspect_model.api.activations:ActivationsRequest",
    schema="activations.json", labels=False, text=True,
))
register(CommandSpec(
    name="grads", usage="grads MODEL [IMAGE...]",
    summary="per-layer and per-parameter gradients, gradient flow, NaN/vanishing/exploding checks for CI, "
            "gradients between layers",
    help="Gradient flow and gradient health: per layer the gradient wrt its output and wrt its input, per "
         "parameter its gradient statistics, the global norm, and checks for NaN, Inf, vanishing and "
         "exploding gradients (--fail-on exits 1 for CI).\n\n"
         "With --of A --wrt B: the gradient of one layer's output with respect to another's, and with "
         "--jacobian-norm an estimate of the Jacobian's Frobenius norm.",
    example="inspect-model grads resnet18 cat.jpg --weights none --fail-on nan,inf,exploding --output-dir g",
    api="inspect_model.api.grads:grads", request="inspect_model.api.grads:GradsRequest",
    schema="grads.json", text=True,
))
register(CommandSpec(
    name="guided-backprop", usage="guided-backprop MODEL IMAGE...",
    summary="guided backpropagation (Springenberg et al. 2015) for any ReLU network",
    help="Guided backpropagation (Springenberg et al. 2015) for any network.\n\n"
         "Every ReLU of the model (modules, in-place ones, reused ones, and functional F.relu / torch.relu "
         "calls) passes back only positive gradient where its input was positive. One map per image and "
         "target: a display PNG, a grayscale magnitude PNG, and with --save-raw the raw gradient (.npy).",
    example="inspect-model guided-backprop resnet50 cat.jpg --target top:3 --output-dir gb",
    api="inspect_model.api.guided:guided_backprop", request="inspect_model.api.guided:GuidedRequest",
    schema="guided-backprop.json", text=True,
))
register(CommandSpec(
    name="cam", usage="cam MODEL IMAGE...",
    summary="CAM, Grad-CAM, Grad-CAM++, XGrad-CAM, LayerCAM, HiResCAM, Score-CAM, Eigen-CAM",
    help="Class activation maps: CAM, Grad-CAM, Grad-CAM++, XGrad-CAM, Layer-CAM, HiResCAM, Score-CAM and "
         "Eigen-CAM.\n\n"
         "All gradient methods come from one forward pass and a backward pass that stops at the layer. With "
         "--output-dir: per image, target, method and layer a heat-map overlay on the original image, the "
         "bare map with a colour bar, --save-raw .npy maps, and contact sheets. --evaluate scores and ranks "
         "the maps (faithfulness) and plots deletion/insertion curves.",
    example="inspect-model cam resnet50 cat.jpg --method gradcam --method scorecam --target top:2 -o cams",
    api="inspect_model.api.cam:cam", request="inspect_model.api.cam:CamRequest",
    schema="cam.json", text=True,
))
register(CommandSpec(
    name="attributions", usage="attributions MODEL IMAGE...",
    summary="saliency, gradient, input x gradient, integrated gradients, SmoothGrad, VarGrad, occlusion, guided "
            "backprop (equal to captum's), batched and bounded in memory",
    help="Input attributions: saliency, gradient, input x gradient, integrated gradients, SmoothGrad, VarGrad, "
         "occlusion and guided backprop, equal to captum's.\n\n"
         "Integrated-gradients steps, SmoothGrad samples and occlusion windows run through the model in chunks of "
         "--batch-size rows (memory does not grow with --steps or --samples); saliency, gradient and input x "
         "gradient share one backward pass. Token ids are attributed at the output of the embedding layer that "
         "reads them. With --output-dir: per map a heat map (signed maps on a diverging colormap centred on 0) "
         "and an overlay, contact sheets of images x methods, and in the report each map's positive and negative "
         "mass and, for integrated gradients, the completeness gap. --evaluate ranks the methods by "
         "faithfulness; --sanity runs the weight-randomisation test for every method.",
    example="inspect-model attributions resnet50 cat.jpg --method saliency --method integrated-gradients "
            "--steps 64 -o attr",
    api="inspect_model.api.attributions:attributions", request="inspect_model.api.attributions:AttributionsRequest",
    renderer="inspect_model.render.attributions:render_result", schema="attributions.json", hooks=False, text=True,
))
register(CommandSpec(
    name="attention", usage="attention MODEL IMAGE...",
    summary="attention maps of transformers: raw, rollout, grad-rollout, LeGrad, for any attention kernel",
    help="Attention maps of vision transformers, for any attention kernel (fused SDPA, nn.MultiheadAttention, "
         "eager softmax), with no change to the model.\n\n"
         "Methods: raw attention of chosen layers and heads; rollout (Abnar & Zuidema 2020); grad-rollout "
         "(Chefer et al. 2021); legrad (Bousselham et al. 2024). Files per image: one overlay per method, one "
         "head grid per raw layer, with --mosaic every layer by every head. --evaluate scores the maps for "
         "faithfulness exactly as cam --evaluate does, and ranks the methods.",
    example="inspect-model attention vit_b_16 cat.jpg --method rollout,grad-rollout,legrad --output-dir attn",
    api="inspect_model.api.attention:attention", request="inspect_model.api.attention:AttentionRequest",
    renderer="inspect_model.render.attention:render_result", schema="attention.json", text=True,
))
register(CommandSpec(
    name="check", usage="check MODEL",
    summary="a one-line CI smoke check: output shape, parameter count, finite outputs and gradients, dead "
            "layers, determinism, time and memory budgets",
    help="Build the model, run a forward and a backward pass, and check what you ask; exit 1 if a check "
         "fails.",
    example="inspect-model check resnet50 --weights none --expect-output-shape 1x1000 --expect-params 25557032",
    api="inspect_model.api.check:check", request="inspect_model.api.check:CheckRequest",
    schema="check.json", hooks=True, labels=False, run=("output_dir", "force", "json_", "quiet"), streams=False, text=True,
))
