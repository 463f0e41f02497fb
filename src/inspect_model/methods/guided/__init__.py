"""Guided backpropagation, for classifiers and for dense (detection, segmentation) targets."""
