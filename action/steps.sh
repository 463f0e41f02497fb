#!/usr/bin/env bash
# The steps of action.yml (the GitHub Action at the repository root), as one script so that
# they can be run and tested outside GitHub (tests/e2e/test_ci_action.py):
#   steps.sh install   torch CPU-only from $IM_TORCH_INDEX, then the package at $IM_PACKAGE[$IM_EXTRAS]
#   steps.sh run       inspect-model $IM_COMMAND [$IM_MODEL] [--config $IM_CONFIG] [-o $IM_OUTPUT_DIR] $IM_ARGS;
#                      writes exit-code=N to $GITHUB_OUTPUT and exits 0 (the upload runs next)
#   steps.sh verdict   exits with $IM_EXIT_CODE: the job fails when the command did
set -euo pipefail

install() {
    python -m pip install --disable-pip-version-check torch torchvision --index-url "${IM_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
    local pkg="${IM_PACKAGE:?IM_PACKAGE: the inspect-model checkout}"
    if [ -n "${IM_EXTRAS:-}" ]; then pkg="${pkg}[${IM_EXTRAS}]"; fi
    python -m pip install --disable-pip-version-check "$pkg"
}

run() {
    local -a argv=("${IM_COMMAND:-check}")
    if [ -n "${IM_MODEL:-}" ]; then argv+=("$IM_MODEL"); fi
    if [ -n "${IM_CONFIG:-}" ]; then argv+=(--config "$IM_CONFIG"); fi
    if [ -n "${IM_OUTPUT_DIR:-}" ]; then argv+=(-o "$IM_OUTPUT_DIR"); fi
    if [ -n "${IM_ARGS:-}" ]; then
        # Split as a shell would (quotes kept together), without evaluating anything.
        local line
        while IFS= read -r -d '' line; do argv+=("$line"); done < <(
            python -c 'import shlex, sys; sys.stdout.write("".join(a + "\0" for a in shlex.split(sys.argv[1])))' "$IM_ARGS")
    fi
    echo "+ inspect-model ${argv[*]}" >&2
    local code=0
    inspect-model "${argv[@]}" || code=$?
    echo "exit-code=$code" >> "${GITHUB_OUTPUT:-/dev/null}"
    if [ "$code" -ne 0 ]; then
        echo "::error title=inspect-model ${IM_COMMAND:-check}::exit $code (1: a check failed; see the report above and the artifact)"
    fi
}

verdict() {
    local code="${IM_EXIT_CODE:-}"
    if [ -z "$code" ]; then
        echo "inspect-model did not run (an earlier step failed)" >&2
        exit 1
    fi
    exit "$code"
}

case "${1:-}" in
    install) install ;;
    run) run ;;
    verdict) verdict ;;
    *) echo "usage: steps.sh install|run|verdict" >&2; exit 2 ;;
esac
