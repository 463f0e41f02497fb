"""The CAM methods, one module each (imported by :func:`inspect_model.methods.cam.base.methods`)."""
