"""A command's request: one frozen dataclass of its own options, validated once.

Each command declares its options once, as the fields of a :class:`Request` subclass made
with :func:`option` (default, flags, help). From that one declaration come the CLI's
options (cli/generate.py builds the Typer command), the Python API's keyword arguments
(``im.cam(..., methods=["gradcam"])`` builds the same request), validation (in
``__post_init__``, the one place), and the report's ``options`` and the ``--resume``
fingerprint (:meth:`Request.resolved`). Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from inspect_model.errors import UsageError


@dataclass(frozen=True)
class Flag:
    """How the command line spells one request field."""

    flags: tuple[str, ...]
    help: str | Callable[[], str]  # a callable is read when the CLI is built (a registry's current names)
    type: Any = None  # the CLI's type when the default does not say it (None defaults)
    complete: str | None = None  # a completion function's name in cli/completion.py
    multiple: bool = False  # a repeatable option (the field is a tuple)
    hidden: bool = False
    param: str | None = None  # the Click parameter (and config-file key) when not the field's name
    check: Callable[[Any], Any] | None = None  # value -> normalised value, or UsageError (run once)


def option(default: Any, *flags: str, help: str | Callable[[], str], type: Any = None, complete: str | None = None,
           multiple: bool = False, hidden: bool = False, param: str | None = None,
           check: Callable[[Any], Any] | None = None) -> Any:
    """A request field with its command-line spelling (``--alpha``, ``-a``), help and, for
    the options several commands share (run/option_groups.py), its ``check``."""
    meta = {"cli": Flag(tuple(flags), help, type, complete, multiple, hidden, param, check)}
    if isinstance(default, (list, dict, set)):
        raise TypeError("request defaults must be immutable (use a tuple)")
    return field(default=default, metadata=meta)


def flags_of(cls: type) -> list[tuple[str, Any, Flag]]:
    """(field name, default, Flag) of every CLI-visible field of a request class, in order."""
    return [(f.name, f.default, f.metadata["cli"]) for f in dataclasses.fields(cls) if "cli" in f.metadata]


@dataclass(frozen=True)
class Request:
    """Base of every command's request. Subclasses are frozen dataclasses whose fields are
    made with :func:`option`; they override :meth:`validate` (normalise with
    :meth:`_set`, raise :class:`UsageError` with the option's name) and, where the report
    names things differently, :meth:`resolved`."""

    command: ClassVar[str] = ""
    #: The option groups it takes (run/option_groups.py: Evaluate, Picture, Layers), each
    #: parsed once into ``self.<group.attr>`` before :meth:`validate`.
    groups: ClassVar[tuple[Any, ...]] = ()

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # lists from the CLI or the caller become tuples
            value = getattr(self, f.name)
            if isinstance(value, list):
                self._set(f.name, tuple(value))
            elif value is None and isinstance(f.default, tuple):  # None for a repeatable option: none given
                self._set(f.name, ())
        for f in dataclasses.fields(self):  # the shared options' checks, each declared with its option
            flag = f.metadata.get("cli")
            if flag is not None and flag.check is not None:
                self._set(f.name, flag.check(getattr(self, f.name)))
        for group in self.groups:
            self._set(group.attr, group.parse(self))
        self.validate()
        from inspect_model.loading.limits import check_option

        for f in dataclasses.fields(self):  # every count and number in its range (issue 41)
            flag = f.metadata.get("cli")
            if flag is not None and flag.flags:
                check_option(flag.flags[0], getattr(self, f.name))

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def validate(self) -> None:
        """Check and normalise the fields; raise UsageError naming the option."""

    def evaluation_boxes(self) -> Any:
        """The ``--boxes`` file the ``Evaluate`` group checks with ``--evaluate`` (None: none)."""
        return None

    def resolved(self) -> dict[str, Any]:
        """The request as the report's ``options`` record it (tuples as lists)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def build(cls, request: Request | None, options: Mapping[str, Any], *, call: str) -> Request:
        """The request of an API call: ``request`` as given, or one made from keyword
        ``options``; an unknown keyword is a TypeError naming it (as Python's own)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            from inspect_model.errors import suggest

            hint = suggest(unknown[0], sorted(names))
            raise TypeError(f"{call}() got an unexpected keyword argument '{unknown[0]}'{hint}")
        if request is not None:
            if not isinstance(request, cls):
                raise TypeError(f"{call}(): request= must be a {cls.__name__}, got {type(request).__name__}")
            return dataclasses.replace(request, **options) if options else request
        return cls(**options)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "__fspath__"):
        return str(value)
    return value


# ----------------------------------------------------------------------------- shared help texts
TARGET_HELP = ("predicted, a class index or name, or top:K (a detector: its detections; a segmenter: its classes "
               "by area; CLASS@all: the whole image) (API: also an int, one class per sample as a list or a 1-D "
               "tensor).")
SCORE_THRESHOLD_HELP = ("Detectors: explain every detection scoring at least this (sets the model's own threshold "
                        "for the run; default: the model's).")
MAX_DETECTIONS_HELP = "Detectors: at most this many detections per image, highest first."
OUTPUT_KEY_HELP = "Which output of a tuple/dict-returning model to use (name or index)."
COLORMAP_HELP = "Matplotlib colormap of the pictures."
SAVE_RAW_HELP = "Also save raw arrays as .npy files."
LAYERS_HELP = "Layer spec: name, glob (layer4.*), type:Conv2d, with [i] (repeatable)."
DEPTH_HELP = "Only modules down to this nesting depth."


# ----------------------------------------------------------------------------- shared checks
def positive(value: float | int | None, flag: str, *, zero: bool = False) -> None:
    """``value`` > 0 (``zero``: >= 0); None passes."""
    if value is None:
        return
    if value < 0 or (value == 0 and not zero):
        raise UsageError(f"{flag} must be {'0' if zero else '1'} or more, got {value}")


def one_of(value: str, choices: tuple[str, ...] | list[str], flag: str) -> None:
    if value not in choices:
        raise UsageError(f"{flag} '{value}' is not one of {', '.join(choices)}")


def check_target_value(value: Any, *, name: str = "target") -> Any:
    """A target as Python users pass it, checked for its type and normalised for the request.

    Accepted: ``None``, ``"predicted"``, ``"top:K"``, a class index (``int``) or name
    (``str``), a per-sample sequence of indices or names, or a 1-D integer tensor (one class
    per sample). Anything else is a TypeError naming the argument."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise TypeError(f"{name}= must be a class index, a class name, 'predicted', 'top:K' or one class per "
                        f"sample, got bool")
    if isinstance(value, int) or type(value).__name__ in ("int64", "int32", "int16", "int8"):
        return str(int(value))
    if hasattr(value, "tolist") and hasattr(value, "dim"):  # a tensor (no torch import needed)
        if value.dim() > 1 or value.is_floating_point() or value.is_complex():
            raise TypeError(f"{name}= as a tensor must be 1-D integer class indices (one per sample), got "
                            f"{tuple(value.shape)} {str(value.dtype).replace('torch.', '')}")
        items = value.tolist()
        return tuple(str(int(v)) for v in (items if isinstance(items, list) else [items]))
    if hasattr(value, "tolist") and hasattr(value, "ndim"):  # a numpy array
        return check_target_value(list(value.tolist()), name=name)
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            if isinstance(v, bool) or not isinstance(v, (int, str)) and not type(v).__name__.startswith("int"):
                raise TypeError(f"{name}= as a sequence holds one class index or name per sample, got "
                                f"{type(v).__name__}")
            out.append(str(int(v)) if not isinstance(v, str) else v)
        if not out:
            raise TypeError(f"{name}= is an empty sequence; give one class per sample")
        return tuple(out)
    raise TypeError(f"{name}= must be a class index, a class name, 'predicted', 'top:K', a per-sample list or a "
                    f"1-D tensor, got {type(value).__name__}")


# ----------------------------------------------------------------------------- API functions
#: The arguments every API function takes beside its request's options.
CALL_ARGUMENTS = ("model_options", "inputs", "output_dir", "force", "tensorboard", "keep", "on_item", "notes",
                  "progress", "on_stuck")


def api_command(request_cls: type[Request], *, positional: tuple[str, ...] = (), images: bool = True,
                takes: tuple[str, ...] | None = None) -> Any:
    """Make ``fn(model, images, request, **call_arguments)`` the API function of a command:
    its keyword options build ``request_cls`` (validated once; an unknown keyword is a
    TypeError), ``positional`` request fields may follow ``images`` positionally, and the
    caller's random state (torch's and numpy's global generators) is the same after the
    call as before it, whatever the command seeded or drew. A function with a ``call``
    parameter gets its call arguments as one :class:`~inspect_model.run.call.Call` (those of
    ``takes``, default an image command's, :data:`~inspect_model.run.call.IMAGE_CALL`);
    otherwise those of :data:`CALL_ARGUMENTS` it names, as keywords."""
    import functools
    import inspect

    from inspect_model.run.call import IMAGE_CALL, Call

    def decorate(fn: Any) -> Any:
        own = inspect.signature(fn).parameters
        bundled = "call" in own
        accepted = list(takes or IMAGE_CALL) if bundled else [n for n in CALL_ARGUMENTS if n in own]

        lead = 2 if images else 1

        @functools.wraps(fn)
        def call(model: Any = None, *args: Any, request: Request | None = None, **kwargs: Any) -> Any:
            given = list(args[:lead - 1])
            if "images" in kwargs and images:
                if given:
                    raise TypeError(f"{fn.__name__}() got multiple values for argument 'images'")
                given = [kwargs.pop("images")]
            args = args[lead - 1:]
            if len(args) > len(positional):
                raise TypeError(f"{fn.__name__}() takes at most {lead + len(positional)} positional arguments "
                                f"({lead + len(args)} given)")
            for name, value in zip(positional, args):
                if name in kwargs:
                    raise TypeError(f"{fn.__name__}() got multiple values for argument '{name}'")
                kwargs[name] = value
            call_args = {k: kwargs.pop(k) for k in list(kwargs) if k in accepted}
            req = request_cls.build(request, kwargs, call=fn.__name__)
            if bundled:
                call_args = {"call": Call(**call_args)}
            with preserved_rng():
                if images:
                    return fn(model, given[0] if given else None, req, **call_args)
                return fn(model, req, **call_args)

        params = [inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)]
        if images:
            params.append(inspect.Parameter("images", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None))
        import dataclasses

        fields = {f.name: f for f in dataclasses.fields(request_cls)}
        for name in positional:
            params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            default=fields[name].default))
        params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default)
                   for f in fields.values() if f.name not in positional]
        params.append(inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY, default=None))
        params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=False if n == "force" else None)
                   for n in accepted]
        call.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        call.request_class = request_cls  # type: ignore[attr-defined]
        return call

    return decorate


class preserved_rng:  # noqa: N801 - used as a context manager, like contextlib's
    """The caller's global random state, put back on exit: torch's CPU generator (and
    CUDA's where it was initialised), numpy's legacy global generator and Python's
    ``random``. Commands seed torch for their own reproducible draws inside."""

    def __enter__(self) -> preserved_rng:
        import random
        import sys

        self._py = random.getstate()
        self._np = sys.modules["numpy"].random.get_state() if "numpy" in sys.modules else None
        torch = sys.modules.get("torch")
        self._torch = torch.random.get_rng_state() if torch is not None else None
        self._cuda = (torch.cuda.get_rng_state_all()
                      if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized() else None)
        return self

    def __exit__(self, *exc: object) -> None:
        import random
        import sys

        random.setstate(self._py)
        if self._np is not None:
            sys.modules["numpy"].random.set_state(self._np)
        torch = sys.modules.get("torch")
        if torch is None:
            return
        if self._torch is not None:  # (torch first imported inside: the caller had no state to keep)
            torch.random.set_rng_state(self._torch)
        if self._cuda is not None:
            torch.cuda.set_rng_state_all(self._cuda)

