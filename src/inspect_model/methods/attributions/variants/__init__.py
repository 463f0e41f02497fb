"""The attribution methods, one module each (imported by :func:`inspect_model.methods.attributions.base.methods`)."""
