"""RMSNorm, its add-and-norm and its sigmoid-gated form, and the L2 norm, in plain torch: the definitions."""

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x over its last dim divided by its root mean square (+ eps inside), times `weight`: normalised in
    fp32 at least (as fla's fused kernels do), handed back in x's dtype."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    y = F.rms_norm(x.to(dtype), (x.shape[-1],), weight.to(dtype), eps)
    return y.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(residual + x), residual + x), the sum in residual's dtype."""
    mixed = residual + x
    return rms_norm(mixed, weight, eps), mixed


def gate(normed: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The gated norm's product of a norm's output and its gate: `normed * sigmoid(gate)`, the sigmoid
    rounded to normed's dtype."""
    return normed * torch.sigmoid(gate).to(normed.dtype)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x over its last dim divided by its L2 norm: fla's form (eps inside the sqrt, as
    ops/short_conv/triton.py's NORM_EPS), not F.normalize (which clamps the norm)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)
