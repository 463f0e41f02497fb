"""Eigen-CAM (Muhammad & Yeasin 2020): the activations' first principal component; no
gradients, the same map for every target."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inspect_model.methods.cam.base import ALL_TASKS, CamMethod, MapInputs, register
from inspect_model.methods.cam.maths import eigen_map

if TYPE_CHECKING:
    import torch


@register
class EigenCam(CamMethod):
    name, title, paper, order = "eigencam", "Eigen-CAM", "Muhammad & Yeasin 2020", 70
    class_independent = True
    tasks = ALL_TASKS

    def maps(self, inp: MapInputs) -> torch.Tensor:
        import torch

        n, sp = inp.A.shape[0], inp.A.shape[2:]
        ok = torch.isfinite(inp.A.reshape(n, -1)).all(1)  # (N,)
        if bool(ok.all()):
            return eigen_map(inp.A)[None].expand(inp.k, *[-1] * (1 + len(sp)))
        # No SVD of NaN/Inf (LinAlgError): those images get a NaN map, reported like any other
        # NaN map; the images with finite activations keep theirs (issue 14).
        out = torch.full((n, *sp), float("nan"), dtype=inp.A.dtype, device=inp.A.device)
        if bool(ok.any()):
            out[ok] = eigen_map(inp.A[ok]).to(out.dtype)
        return out[None].expand(inp.k, *[-1] * (1 + len(sp)))

    def row_map(self, A: torch.Tensor, G: torch.Tensor | None) -> torch.Tensor:
        return eigen_map(A) if bool(A.isfinite().all()) else A[:, 0] * float("nan")
