"""SR-Sinkhorn, NesterovSinkhorn's normalisation (train/optim.py), the op: torch's form (reference.py: the
CPU's path, and fp64's) or, on CUDA in fp32, dormouse's Triton kernels (triton.py: three launches an
iteration instead of ~40 small ones; the same arithmetic summed in another order). The kernels also
write the optimizer's step into the weights (`sinkhorn_step_`). No config value chooses: the device and
the dtype do (ops/registry.py's `on_kernel_device`), and kernels that cannot import are refused here.
"""

import torch

from dormouse import ledger
from dormouse.ops import registry
from dormouse.ops.sinkhorn import reference

SINKHORN_KERNELS_UNAVAILABLE = ledger.register(
    "optim.sinkhorn_kernels_unavailable",
    ledger.Kind.LOUD,
    "an fp32 SR-Sinkhorn (or NesterovSinkhorn's momentum) on CUDA runs dormouse's Triton kernels "
    "(ops/sinkhorn/triton.py, ops/momentum/triton.py), and they are not importable (no Triton)",
    __name__,
)


def kernels(device: torch.device, module: str = "dormouse.ops.sinkhorn.triton"):
    """dormouse's Triton kernels of NesterovSinkhorn (`module`: the SR-Sinkhorn's, or
    "dormouse.ops.momentum.triton") for stacks on `device` (CUDA); refused at
    `optim.sinkhorn_kernels_unavailable` where Triton is not importable."""
    found = registry.own_kernels(module)
    return registry.required(found, SINKHORN_KERNELS_UNAVAILABLE, f"NesterovSinkhorn's step on {device}")


def sr_sinkhorn(u: torch.Tensor, iters: int = 5, eps: float = 1e-12) -> torch.Tensor:
    """SR-Sinkhorn of a matrix `u` [m, n] (or a stack of them [N, m, n], each on its own): `iters`
    times, every row to ℓ2 norm √n, then every column to √m.

    Computed in fp32 at least (fp64 stays fp64); the result has that dtype. Norms are clamped below at
    `eps`, so an all-zero row or column (an unused embedding row, a zero-initialised branch) stays zero
    instead of becoming NaN.
    """
    if u.ndim not in (2, 3):
        raise ValueError(f"sr_sinkhorn takes a matrix [m, n] or a stack [N, m, n]; got shape {tuple(u.shape)}")
    if iters < 1:
        raise ValueError(f"sr_sinkhorn needs iters >= 1, got {iters}")
    x = u.to(torch.promote_types(u.dtype, torch.float32))
    if not (registry.on_kernel_device(x) and x.dtype == torch.float32):
        return reference.sr_sinkhorn(x, iters, eps)
    stack = x if x.ndim == 3 else x.unsqueeze(0)
    return kernels(x.device).sr_sinkhorn(stack, iters, eps).view(x.shape)


def steps_in_kernel(u: torch.Tensor, weight_dtype: torch.dtype) -> bool:
    """Whether `sinkhorn_step_` runs for look-aheads `u` of weights in `weight_dtype`: on CUDA in fp32."""
    return registry.on_kernel_device(u) and u.dtype == weight_dtype == torch.float32


def sinkhorn_step_(u: torch.Tensor, iters: int, eps: float, table: torch.Tensor, lr, decay) -> None:
    """W ← W · decay − lr · sr_sinkhorn(u) for the stack `u` [N, m, n], written into the weights whose
    int64 addresses are `table` (where `steps_in_kernel`)."""
    kernels(u.device).sinkhorn_step_(u, iters, eps, table, lr, decay)
