"""loading package of inspect-model."""
