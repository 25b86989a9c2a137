"""The SwiGLU activation in plain torch, the definition."""

import torch
import torch.nn.functional as F


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up`."""
    return F.silu(gate) * up
