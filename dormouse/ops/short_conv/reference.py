"""The short conv in plain torch, the definition: SiLU of a causal depthwise conv over time (torch's
F.conv1d, any device), continuing from a carried state."""

import torch
import torch.nn.functional as F


def short_conv(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B,T,C], weight [C,1,size], state [B,size-1,C] (None: zeros) -> (SiLU(conv) [B,T,C], new state)."""
    B, _, C = x.shape
    keep = weight.shape[-1] - 1
    if state is None:
        state = x.new_zeros(B, keep, C)
    xs = torch.cat([state.to(x.dtype), x], dim=1)
    y = F.conv1d(xs.transpose(1, 2), weight.to(x.dtype), groups=C).transpose(1, 2)
    return F.silu(y), xs[:, xs.shape[1] - keep :]


def conv_tail(x: torch.Tensor, keep: int) -> torch.Tensor:
    """The last `keep` inputs of x [B, T, C], zeros before the sequence's start: what a cache carries."""
    T = x.shape[1]
    return x[:, T - keep :] if T >= keep else F.pad(x, (0, 0, keep - T, 0))


def dilated_short_conv(x: torch.Tensor, weight: torch.Tensor, dilation: int, t_len: int) -> torch.Tensor:
    """SiLU of the causal depthwise conv, taps `dilation` apart, at the last `t_len` positions of x [B, (size−1)
    ·dilation + t_len, C] (its first positions the history): the taps as shifted views, so t_len 0 needs no
    special case."""
    w = weight.to(x.dtype)
    y = sum(x[:, i * dilation : i * dilation + t_len] * w[:, 0, i] for i in range(weight.shape[-1]))
    return F.silu(y)
