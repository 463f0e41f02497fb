"""The built-in attention methods, one module each (methods/attention/base.py)."""
