"""Normalisation layers. One RMSNorm; the gated output norm of the KDA layer is built on it.

Two paths compute the same function: `plain` (torch's F.rms_norm in fp32, any device) and `fused`
(fla's Triton RMSNorm, CUDA only, with its own backward). `resolve_norm_backend` applies
`fused_or_plain`'s policy per call on the input's device (auto: fused on CUDA, plain elsewhere); the model sets the
configured name on every RMSNorm it owns (`set_norm_backend`), and every call is counted in
counters.NORM so the eval line's `norm=<fused>/<calls>` says which path ran.
"""

import torch
import torch.nn.functional as F
from torch import nn

from dormouse import counters, ledger
from dormouse.model import fla_kernels, fused_or_plain

NORM_BACKENDS = fused_or_plain.CHOICES
FUSED_UNAVAILABLE = ledger.register(
    "norm.fused_unavailable",
    ledger.Kind.LOUD,
    "fused RMSNorm asked for (or auto on CUDA), but fla's rms_norm is not importable or the tensors are not on CUDA",
    __name__,
)


def resolve_norm_backend(requested: str, device: torch.device | str) -> str:
    """The path RMSNorm runs for `requested` on `device`: "fused" or "plain"."""
    return fused_or_plain.resolve(
        requested,
        device,
        flag="--norm-backend",
        site=FUSED_UNAVAILABLE,
        kernel=fla_kernels.rms_norm,  # looked up per call: the tests stand in for it
        needs="fla.modules.norm.layernorm.rms_norm",
    )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.backend = "auto"  # as asked for (NORM_BACKENDS); resolved per call on the input's device
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = resolve_norm_backend(self.backend, x.device) == "fused"
        counters.NORM.record(fused=fused)
        if fused:
            fn, _ = fla_kernels.rms_norm()
            # fla normalises in fp32 and returns the input dtype, as the plain path below does.
            return fn(x, self.weight, None, eps=self.eps)
        # Normalise in fp32 at least (as fla's fused kernels do), hand back the input dtype.
        dtype = torch.promote_types(x.dtype, torch.float32)
        y = F.rms_norm(x.to(dtype), (x.shape[-1],), self.weight.to(dtype), self.eps)
        return y.to(x.dtype)


def set_norm_backend(module: nn.Module, backend: str) -> None:
    """Set the requested backend (one of NORM_BACKENDS) on every RMSNorm inside `module`."""
    if backend not in NORM_BACKENDS:
        raise ValueError(f"unknown norm backend {backend!r}; choose one of {NORM_BACKENDS}")
    for m in module.modules():
        if isinstance(m, RMSNorm):
            m.backend = backend


class GatedRMSNorm(nn.Module):
    """`RMSNorm(x) * sigmoid(gate)`: fla's FusedRMSNormGated with activation="sigmoid"."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.norm = RMSNorm(dim, eps)

    def reset_parameters(self) -> None:
        self.norm.reset_parameters()

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.norm(x) * torch.sigmoid(gate).to(x.dtype)
