"""methods package of inspect-model."""
