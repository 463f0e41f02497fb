"""Input attributions (saliency, IG, SmoothGrad, occlusion): options, passes, sweeps and the sanity check."""
