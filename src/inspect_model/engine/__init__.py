"""engine package of inspect-model."""
