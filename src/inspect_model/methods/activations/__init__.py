"""Activations: what flows out of each selected layer, captured and measured in the hook."""
