"""Several bias-free Linears that read one input, run as one matmul.

A KDA layer projects its normalised input six ways (q, k, v, the two gates' low-rank halves, beta) and a
SwiGLU two ways. As separate Linears under bf16 autocast, each matmul casts the fp32 input again and
each gradient comes back through a cast of its own, to be summed in fp32: on the H200 these casts and
sums were a large part of the step's elementwise kernels (docs/performance.md). Concatenating the
weights (kept as separate parameters, so init, optimizers and checkpoints do not change) gives one cast
of the input, one matmul forward and one per gradient, and the input's gradient summed inside the
matmul in fp32. The outputs are views of one tensor, each with the row stride of the whole.

Without autograd (evals, decoding) there is no gradient to fuse and the concatenation would copy every
weight on every call: a decode step of `small` on the CPU spent 21 of its 35 ms copying weights. There
each Linear runs alone.
"""

import torch
import torch.nn.functional as F
from torch import nn


def packed(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> torch.Tensor:
    """x @ cat(weights).T: every Linear's output side by side in one tensor, in the order given."""
    return F.linear(x, torch.cat([lin.weight for lin in linears]))


def project(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, ...]:
    """(lin(x) for lin in linears): `packed` split by output width when autograd records."""
    if not torch.is_grad_enabled():
        return tuple(F.linear(x, lin.weight) for lin in linears)
    return packed(x, linears).split([lin.out_features for lin in linears], dim=-1)
