"""cli package of inspect-model."""
