"""``compare``: where two models, or one model run two ways, part company, layer by layer.

``match`` pairs the layers of the two sides (qualified name, then order and shape, then a
``--map`` file); ``versions`` makes the other side of "one model run two ways" (a dtype, a
device, torch.compile, torch.export, TorchScript, dynamic quantization, train mode);
``exchange`` runs both forwards (B ahead of A within a byte budget) and hands each matched
pair of layer outputs to ``stats`` as A produces it; ``weights`` compares parameters and buffers; ``report`` holds the typed
report record (its JSON schema is generated from it).
"""
