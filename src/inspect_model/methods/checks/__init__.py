"""Smoke checks for CI (check): one forward and one backward pass, and the checks of detector outputs."""
