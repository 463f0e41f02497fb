"""render package of inspect-model."""
