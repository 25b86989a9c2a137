"""RMSNorm modules: the weight and eps of the op ops/norm/ (which backend runs, plain or fused, is the op's
business: `backend` holds the requested `--norm-backend`, set by the model, `set_norm_backend`).

`add_and_norm` is the norm taking a fused input: the pre-norm of a residual stream a branch's output
joins inside the norm's kernel (the block layer's FFN pre-norm takes the mixer's output, the next
layer's mixer pre-norm and the final norm the FFN's: model/loop.py's Stream).

`feeds_one_matmul` and `sum_feeds_one_matmul` are output-layout hints, off as built: the kernel pass
(ops/passes.py) sets them on the norms whose output feeds one matmul and nothing else, which the op may
then write in autocast's dtype (ops/norm/__init__.py).
"""

import torch
from torch import nn

from dormouse.ops import norm as norm_op
from dormouse.ops import registry


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.backend = "auto"  # as asked for (registry.CHOICES); resolved per call on the input's device
        self.feeds_one_matmul = False  # every call's output feeds one matmul alone (ops/passes.py)
        self.sum_feeds_one_matmul = False  # add_and_norm's output does (ops/passes.py)
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return norm_op.rms_norm(x, self.weight, self.eps, self.backend, for_matmul=self.feeds_one_matmul)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x) (`norm_op.add_rms_norm`): x, a branch's output, is the fused
        input the kernel adds. One call counts once in counters.NORM."""
        for_matmul = self.feeds_one_matmul or self.sum_feeds_one_matmul
        return norm_op.add_rms_norm(x, residual, self.weight, self.eps, self.backend, for_matmul=for_matmul)


def set_norm_backend(module: nn.Module, backend: str) -> None:
    """Set the requested backend (one of registry.CHOICES) on every RMSNorm inside `module`."""
    registry.check_choice("norm", backend)
    for m in module.modules():
        if isinstance(m, RMSNorm):
            m.backend = backend


class GatedRMSNorm(nn.Module):
    """`RMSNorm(x) * sigmoid(gate)` (`norm_op.gated_rms_norm`), fla's FusedRMSNormGated with
    activation="sigmoid"."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.norm = RMSNorm(dim, eps)

    def reset_parameters(self) -> None:
        self.norm.reset_parameters()

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        norm = self.norm
        return norm_op.gated_rms_norm(x, gate, norm.weight, norm.eps, norm.backend)
