"""Options whose value may be left out: ``--offload`` alone, or ``--offload DIR`` (issue 37).

Click 8 spells such an option ``is_flag=False, flag_value=...``; the Click that Typer vendors
(``typer._click``) has no optional values, so every option of that kind takes a value, and
:class:`OptionalValueCommand` gives it one where the command line leaves it out: before
parsing, ``--offload`` followed by nothing, by another option or by ``--`` becomes
``--offload=`` plus its stand-in value (:data:`~inspect_model.cli.options.OPTIONAL_VALUES`).
As in Click, a word that follows is the value: ``--offload DIR`` (so put MODEL before
``--offload``, or write ``--offload=DIR``). Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any

import typer.core

from inspect_model.cli.options import OPTIONAL_VALUES


def fill_optional_values(args: list[str], optional: dict[str, str] = OPTIONAL_VALUES) -> list[str]:
    """``args`` with each valueless optional-value option given its stand-in value."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        following = args[i + 1] if i + 1 < len(args) else None
        if arg in optional and (following is None or (following.startswith("-") and following != "-")):
            out.append(f"{arg}={optional[arg]}")
        else:
            out.append(arg)
    return out


class OptionalValueCommand(typer.core.TyperCommand):
    """A Typer command whose optional-value options may stand alone."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, fill_optional_values(list(args)))
