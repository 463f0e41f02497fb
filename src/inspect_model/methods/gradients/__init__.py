"""Gradient flow and health for grads: statistics, checks, records, the objective and inner-layer Jacobians."""
