"""``python -m inspect_model`` runs the CLI."""

from inspect_model.cli.app import main

if __name__ == "__main__":
    main()
