"""RMSNorm, the op: `rms_norm`, `add_rms_norm` (the pre-norm of a residual stream, taking as a fused
input the branch output that joins it) and `gated_rms_norm` (`RMSNorm(x) * sigmoid(gate)`, the KDA layer's output norm).

Two backends compute each: `plain` (reference.py: torch's F.rms_norm in fp32, any device) and `fused`
(fla.py: fla's Triton RMSNorm, CUDA only, with its own backward; the add-and-norm's backward is
dormouse's kernel, triton.py). `--norm-backend` (auto, fused, plain) chooses, through ops/registry.py,
per call on the input's device, and every call counts once in counters.NORM (`norm=<fused>/<calls>`).

`for_matmul`: the output feeds one matmul and nothing else (the norms ops/passes.py flags: the block
layers' pre-norms of a KDA mixer and of a dense SwiGLU, the final norm for the head). On the fused path
under autocast it is written in autocast's dtype: the matmul would cast it to that dtype anyway (one
rounding of an fp32 value) and cast its gradient back to fp32 (exact), so the arithmetic is the same and
two [B, T, d] passes a call are saved (docs/performance.md). Not the same bits on an H200: fla's
autotuner keys its kernel choice on the dtypes, and another block shape sums a row's squares in another
order, so an output can differ by one bf16 rounding and the gradients by what follows from it
(tests/gpu/test_norm_fused.py measures it).

The gated norm's fused path (fla's rms_norm_gated) rounds once; the plain path rounds the norm and the
sigmoid to x's dtype before their product. On the H200 the fused path replaced a [B, T, d] sigmoid, its
backward and three products per KDA layer application (docs/performance.md).
"""

import torch

from dormouse import counters
from dormouse.ops import registry
from dormouse.ops.fla import kernels as fla_kernels
from dormouse.ops.norm import fla, reference

# the kernels' accessor is a lambda, looked up per call: the tests stand in for what it calls
NEEDS = "fla-core 0.6.0 (fla.modules.norm.layernorm.rms_norm)"
OP = registry.register(
    registry.Op("norm", "--norm-backend", fla.FUSED_UNAVAILABLE, lambda: fla_kernels.rms_norm(), NEEDS, counters.NORM)
)
# the gated norm: its own kernel, the norm's flag, site and counter
GATED_NEEDS = "fla-core 0.6.0 (fla.modules.norm.fused_norm_gate.rms_norm_gated)"
GATED = registry.register(
    registry.Op(
        "norm.gated",
        "--norm-backend",
        fla.FUSED_UNAVAILABLE,
        lambda: fla_kernels.rms_norm_gated(),
        GATED_NEEDS,
        counters.NORM,
    )
)


def _out_dtype(x: torch.Tensor, for_matmul: bool, otherwise: torch.dtype) -> torch.dtype:
    autocast = for_matmul and torch.is_autocast_enabled(x.device.type)
    return torch.get_autocast_dtype(x.device.type) if autocast else otherwise


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, backend: str = "auto", *, for_matmul: bool = False
) -> torch.Tensor:
    """RMSNorm of x [..., d] by `weight` [d], in x's dtype (autocast's, fused, for a matmul's input)."""
    if registry.choose("norm", backend, x.device) == "fused":
        if for_matmul and torch.is_autocast_enabled(x.device.type):
            return fla.rms_norm_to(x, None, weight, eps, _out_dtype(x, for_matmul, x.dtype))
        return fla.rms_norm(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    backend: str = "auto",
    *,
    for_matmul: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(residual + x), residual + x), the sum in residual's dtype (at least as wide as x's: the fp32
    stream and a bf16 branch): the norm taking the branch output x as a fused input. On the fused path
    one kernel each way (fla's forward, dormouse's backward) forms the sum and normalises it, and backward
    adds the sum's gradient to the norm's: no separate add, cast or gradient sum (docs/performance.md)."""
    if torch.promote_types(x.dtype, residual.dtype) != residual.dtype:
        narrower = f"{residual.dtype} is narrower than {x.dtype}"
        raise ValueError(f"add_and_norm sums into the residual's dtype: {narrower}")
    if registry.choose("norm", backend, x.device) == "fused":
        return fla.rms_norm_to(x, residual, weight, eps, _out_dtype(x, for_matmul, residual.dtype))
    return reference.add_rms_norm(x, residual, weight, eps)


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, backend: str = "auto"
) -> torch.Tensor:
    """`rms_norm(x) * sigmoid(gate)`, fla's FusedRMSNormGated with activation="sigmoid"; one call counts
    once in counters.NORM."""
    if registry.resolve("norm.gated", backend, x.device) == "fused":
        registry.record("norm.gated", fused=True)
        return fla.rms_norm_gated(x, gate, weight, eps)
    return reference.gate(rms_norm(x, weight, eps, backend), gate)
