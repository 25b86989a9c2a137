"""The causal depthwise convolutions with a fused path (the KDA layers' ShortConv, the engram's
EngramConv): their weights and the requested `--conv-backend` (`set_conv_backend`); the op and the
choice of its backend are ops/short_conv/'s."""

import torch
from torch import nn

from dormouse.ops import registry
from dormouse.ops import short_conv as conv_op


class FusableConv(nn.Module):
    """A causal depthwise conv of ops/short_conv/, which has a fused path: the subclass's `weight`
    [C, 1, size] and the backend asked for (`set_conv_backend`)."""

    weight: nn.Parameter

    def __init__(self):
        super().__init__()
        self.backend = "auto"  # as asked for (registry.CHOICES); resolved per call on the input's device


class ShortConv(FusableConv):
    """SiLU of a causal depthwise conv over time; returns the last `size - 1` inputs so decoding can go on."""

    def __init__(self, channels: int, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, size))

    def forward(self, x: torch.Tensor, state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B,T,C], state [B,size-1,C] (None: zeros) -> (SiLU(y) [B,T,C], new state)."""
        return conv_op.short_conv(x, self.weight, state, self.backend)


def set_conv_backend(module: nn.Module, backend: str) -> None:
    """Set the requested backend (one of registry.CHOICES) on every conv inside `module` that has a fused
    path (FusableConv: the KDA layers' ShortConvs, the engram's EngramConv)."""
    registry.check_choice("conv", backend)
    for m in module.modules():
        if isinstance(m, FusableConv):
            m.backend = backend
