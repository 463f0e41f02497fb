"""One registry for every method family (issue 35): CAM methods, attribution methods, ...

A family keeps its methods by name, one object per method class registered with the
family's ``register`` decorator beside its code (timm's ``@register_model``). The built-in
methods are the modules of the family's ``variants`` package, imported on first use, so a
new method is one module there (or anywhere that is imported) and its test. Help, ``all``,
completion, the schema's ``$defs.method`` enum and task support read the objects' properties.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Generic, TypeVar

M = TypeVar("M")


class Family(Generic[M]):
    """The methods of one family: ``register`` (a class decorator), ``methods()`` in their
    ``order``, ``get``, ``names``, ``aliases`` (alias -> name); ``what`` names a member in
    messages ("CAM method")."""

    def __init__(self, what: str, variants: str) -> None:
        self.what, self.variants = what, variants
        self.registry: dict[str, M] = {}
        self._loaded = False

    def register(self, cls: type[M]) -> type[M]:
        """Class decorator: add a method (its module must be imported; the built-ins under
        the family's ``variants`` package are)."""
        name = getattr(cls, "name")
        if name in self.registry and type(self.registry[name]) is not cls:
            raise ValueError(f"{self.what} '{name}' is already registered")
        self.registry[name] = cls()
        return cls

    def unregister(self, name: str) -> None:
        self.registry.pop(name, None)

    def methods(self) -> dict[str, M]:
        """Every registered method, in their ``order`` (the built-ins are imported once)."""
        if not self._loaded:
            package = importlib.import_module(self.variants)
            for info in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{self.variants}.{info.name}")
            self._loaded = True
        return dict(sorted(self.registry.items(), key=lambda kv: (getattr(kv[1], "order", 100), kv[0])))

    def get(self, name: str) -> M:
        return self.methods()[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self.methods())

    def aliases(self) -> dict[str, str]:
        return {a: n for n, m in self.methods().items() for a in getattr(m, "aliases", ())}

    def having(self, what: str) -> tuple[str, ...]:
        """The names of the methods whose property ``what`` is true."""
        return tuple(n for n, m in self.methods().items() if getattr(m, what))

