"""Objectives: targets, tasks (classification, detection, segmentation) and the scalar scores a gradient command explains."""
