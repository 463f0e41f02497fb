"""The package version, kept apart so that importing it stays cheap."""

__version__ = "0.1.0"
