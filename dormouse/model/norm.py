"""Normalisation layers. One RMSNorm; the gated output norm of the KDA layer is built on it."""

import torch
import torch.nn.functional as F
from torch import nn

from dormouse import counters


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        counters.NORM.record(fused=False)
        # Normalise in fp32 at least (as fla's fused kernels do), hand back the input dtype.
        dtype = torch.promote_types(x.dtype, torch.float32)
        y = F.rms_norm(x.to(dtype), (x.shape[-1],), self.weight.to(dtype), self.eps)
        return y.to(x.dtype)


class GatedRMSNorm(nn.Module):
    """`RMSNorm(x) * sigmoid(gate)`: fla's FusedRMSNormGated with activation="sigmoid"."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.norm = RMSNorm(dim, eps)

    def reset_parameters(self) -> None:
        self.norm.reset_parameters()

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.norm(x) * torch.sigmoid(gate).to(x.dtype)
