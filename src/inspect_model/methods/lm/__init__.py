"""Language models read as decoders: anatomy (blocks, attention, MLP, final norm, unembedding) and the logit/tuned lens."""
