"""Weight initialisation shared by every model module: nothing draws from the global RNG."""

import torch
from torch import nn
from torch.nn.utils import skip_init


def normal_init_(weight: torch.Tensor, gen: torch.Generator, std: float = 0.02) -> None:
    """Fill `weight` with N(0, std) drawn from `gen`.

    Drawn in fp32 on the CPU and copied, so the same (seed, purpose) gives the same weights on every
    device and dtype (a CPU generator cannot fill a CUDA tensor anyway).
    """
    draw = torch.empty(weight.shape, dtype=torch.float32).normal_(0.0, std, generator=gen)
    with torch.no_grad():
        weight.copy_(draw)


def linear(d_in: int, d_out: int) -> nn.Linear:
    """A bias-free Linear whose constructor draws nothing; the owner's reset_parameters fills it."""
    return skip_init(nn.Linear, d_in, d_out, bias=False)
