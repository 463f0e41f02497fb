"""The pre-commit hook (``.pre-commit-hooks.yaml``, issue 39): ``inspect-model check`` on each
changed model file, with the options in a config file.

``python -m inspect_model.cli.precommit --config ci/model-check.toml [--name build] FILE.py...``
(``--config`` defaults to ``.inspect-model.toml`` where the repository has one)
runs ``inspect-model check FILE.py:NAME --config CONFIG`` for each file, one process each
(a model file is imported fresh), and exits 0 when every check passed, else 1 when a check
failed, else the first other exit code (a file that does not load: 3). The model file
comes from the command line (pre-commit passes the changed files), so it may run code;
the config only sets options (README "Security"). Imports nothing heavy.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

DEFAULT_CONFIG = ".inspect-model.toml"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inspect-model-pre-commit",
                                description="inspect-model check on each changed model file.")
    p.add_argument("--config", help="TOML file with check's options (input size, expectations...); "
                   f"default: {DEFAULT_CONFIG} when the repository has one.")
    p.add_argument("--name", default="build",
                   help="The model in each file: a function, class or instance (FILE.py:NAME); default: build.")
    p.add_argument("--command", default="check", help="The command to run on each file (default: check).")
    p.add_argument("files", nargs="*", help="Model files (pre-commit passes the changed ones).")
    return p


def main(argv: list[str] | None = None) -> int:
    args, extra = _parser().parse_known_args(argv)
    if args.config is None and os.path.isfile(DEFAULT_CONFIG):
        args.config = DEFAULT_CONFIG
    codes: list[int] = []
    for path in args.files:
        spec = f"{path}:{args.name}" if args.name else path
        cmd = [sys.executable, "-m", "inspect_model", args.command, spec, *extra]
        if args.config:
            cmd += ["--config", args.config]
        print(f"== inspect-model {args.command} {spec}", flush=True)
        codes.append(subprocess.run(cmd, check=False).returncode)
    if 1 in codes:
        return 1
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main())
