"""Attention maps: raw attention, rollout, gradient rollout, LeGrad, CAM in attention runs, windowed and text models."""
