"""``python -m inspect_model`` runs the CLI (signal handlers first: :mod:`inspect_model.cli.launch`)."""

from inspect_model.cli.launch import main

if __name__ == "__main__":
    main()
