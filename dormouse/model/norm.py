"""Normalisation layers. One RMSNorm; the gated output norm of the KDA layer is built on it.

Two paths compute the same function: `plain` (torch's F.rms_norm in fp32, any device) and `fused`
(fla's Triton RMSNorm, CUDA only, with its own backward). `resolve_norm_backend` applies
`fused_or_plain`'s policy per call on the input's device (auto: fused on CUDA, plain elsewhere); the model sets the
configured name on every RMSNorm it owns (`set_norm_backend`), and every call is counted in
counters.NORM so the eval line's `norm=<fused>/<calls>` says which path ran.

A norm whose output feeds one matmul and nothing else (`feeds_one_matmul`: the block layers' pre-norms
of a KDA mixer and of a dense SwiGLU) writes it, on the fused path under autocast, in autocast's dtype:
the matmul would cast it to that dtype anyway (one rounding of an fp32 value) and cast its gradient
back to fp32 (exact), so the arithmetic is the same and two [B, T, d] passes a call are saved
(docs/performance.md). Not the same bits on an H200: fla's autotuner keys its kernel choice on the
dtypes, and another block shape sums a row's squares in another order, so an output can differ by one
bf16 rounding and the gradients by what follows from it (tests/gpu/test_norm_fused.py measures it).

`add_and_norm` is the pre-norm of a residual stream a branch's output has just joined: the block layer's
FFN pre-norm takes the mixer's output, the next layer's mixer pre-norm the FFN's (model/loop.py's Stream).
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
    "fused RMSNorm asked for (or auto on CUDA), but fla's rms_norm (rms_norm_gated for the gated norm; for "
    "add_and_norm's backward and the engram gate dormouse's Triton kernels) is not importable or the tensors "
    "are not on CUDA",
    __name__,
)


def resolve_norm_backend(requested: str, device: torch.device | str, *, gated: bool = False) -> str:
    """The path RMSNorm (GatedRMSNorm, `gated`) runs for `requested` on `device`: "fused" or "plain"."""
    kernel, name = (
        (fla_kernels.rms_norm_gated, "fused_norm_gate.rms_norm_gated")
        if gated
        else (fla_kernels.rms_norm, "layernorm.rms_norm")
    )
    return fused_or_plain.resolve(
        requested,
        device,
        flag="--norm-backend",
        site=FUSED_UNAVAILABLE,
        kernel=kernel,  # looked up per call: the tests stand in for it
        needs=f"fla-core 0.6.0 (fla.modules.norm.{name})",
    )


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x over its last dim divided by its L2 norm: fla's form (eps inside the sqrt, as
    short_conv_kernels.NORM_EPS), not F.normalize (which clamps the norm)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.backend = "auto"  # as asked for (NORM_BACKENDS); resolved per call on the input's device
        self.feeds_one_matmul = False  # set by the owner whose one matmul alone reads the output
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = resolve_norm_backend(self.backend, x.device) == "fused"
        counters.NORM.record(fused=fused)
        if fused:
            if self.feeds_one_matmul and torch.is_autocast_enabled(x.device.type):
                return _RMSNormTo.apply(x, None, self.weight, self.eps, torch.get_autocast_dtype(x.device.type))
            fn, _ = fla_kernels.rms_norm()
            # fla normalises in fp32 and returns the input dtype, as the plain path below does.
            return fn(x, self.weight, None, eps=self.eps)
        return self._plain(x)

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor, *, for_matmul: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x): the pre-norm of a residual stream `residual` that a branch's
        output `x` has just joined, the sum in residual's dtype (at least as wide as x's: the fp32 stream
        and a bf16 branch). On the fused path one kernel each way (fla's forward, dormouse's backward) forms
        the sum and normalises it, and backward adds the sum's gradient to the norm's: no separate add, cast
        or gradient sum (docs/performance.md). `for_matmul`: this call's output feeds one matmul
        alone, as `feeds_one_matmul` says of every call (the final norm's for the head; its other caller,
        JEPA's teacher, wants fp32). One call counts once in counters.NORM."""
        if torch.promote_types(x.dtype, residual.dtype) != residual.dtype:
            narrower = f"{residual.dtype} is narrower than {x.dtype}"
            raise ValueError(f"add_and_norm sums into the residual's dtype: {narrower}")
        fused = resolve_norm_backend(self.backend, x.device) == "fused"
        counters.NORM.record(fused=fused)
        if fused:
            autocast = (self.feeds_one_matmul or for_matmul) and torch.is_autocast_enabled(x.device.type)
            out_dtype = torch.get_autocast_dtype(x.device.type) if autocast else residual.dtype
            return _RMSNormTo.apply(x, residual, self.weight, self.eps, out_dtype)
        mixed = residual + x
        return self._plain(mixed), mixed

    def _plain(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 at least (as fla's fused kernels do), hand back the input dtype.
        dtype = torch.promote_types(x.dtype, torch.float32)
        y = F.rms_norm(x.to(dtype), (x.shape[-1],), self.weight.to(dtype), self.eps)
        return y.to(x.dtype)


class _RMSNormTo(torch.autograd.Function):
    """fla's RMSNorm kernels (fp32 inside) with the output written in `out_dtype` and the gradient read in
    whatever dtype it arrives; with a `residual`, the norm of residual + x, the sum formed in the kernel and
    returned too (in residual's dtype), its gradient added to the norm's in the backward kernel (dormouse's,
    model/norm_kernels.py). fla's own LayerNormFunction, less its groups, plus out_dtype."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps: float, out_dtype: torch.dtype):
        ops = fla_kernels.layer_norm_ops()[0]
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        res = None if residual is None else residual.reshape(rows.shape).contiguous()
        # `normed` is the sum with a residual, the rows themselves without one.
        y, _, rstd, normed = ops.layer_norm_fwd(
            rows, weight, None, eps, residual=res, out_dtype=out_dtype, is_rms_norm=True
        )
        ctx.save_for_backward(normed, weight, rstd)
        ctx.x_shape, ctx.x_dtype, ctx.has_residual = x.shape, x.dtype, residual is not None
        ctx.set_materialize_grads(False)  # a sum nobody reads (the head's hidden state) has no gradient
        y = y.view(x.shape)
        return y if residual is None else (y, normed.view(x.shape))

    @staticmethod
    def backward(ctx, dy: torch.Tensor, dsum: torch.Tensor | None = None):
        ops = fla_kernels.layer_norm_ops()[0]
        normed, weight, rstd = ctx.saved_tensors
        dy = torch.zeros_like(normed) if dy is None else dy.reshape(normed.shape).contiguous()
        if not ctx.has_residual:
            dx, dw, _, _ = ops.layer_norm_bwd(
                dy, normed, weight, None, rstd=rstd, is_rms_norm=True, x_dtype=ctx.x_dtype
            )
            return dx.view(ctx.x_shape), None, dw, None, None
        # dormouse's kernel, not fla's with `dres` (1.8 TB/s on the H200): the same arithmetic (norm_kernels.py).
        # the fused path runs where fla, hence Triton, is: the refusal is not reached in practice
        kernels = fused_or_plain.required(
            add_norm_kernels(), FUSED_UNAVAILABLE, "the fused add_and_norm's backward", "; pass --norm-backend plain"
        )
        dsum = None if dsum is None else dsum.reshape(normed.shape)
        dx, dresidual, dw = kernels.backward(dy, normed, weight, rstd, dsum, ctx.x_dtype)
        return dx.view(ctx.x_shape), dresidual.view(ctx.x_shape), dw, None, None


def add_norm_kernels() -> tuple[object | None, str]:
    """dormouse's Triton kernel for add_and_norm's backward (model/norm_kernels.py), or None and why not."""
    return fused_or_plain.own_kernels("dormouse.model.norm_kernels")


def set_norm_backend(module: nn.Module, backend: str) -> None:
    """Set the requested backend (one of NORM_BACKENDS) on every RMSNorm inside `module`."""
    if backend not in NORM_BACKENDS:
        raise ValueError(f"unknown norm backend {backend!r}; choose one of {NORM_BACKENDS}")
    for m in module.modules():
        if isinstance(m, RMSNorm):
            m.backend = backend


class GatedRMSNorm(nn.Module):
    """`RMSNorm(x) * sigmoid(gate)`, fla's FusedRMSNormGated with activation="sigmoid".

    The fused path is fla's rms_norm_gated: norm, sigmoid and product in one kernel each way, in fp32,
    rounded once to x's dtype. The plain path rounds the norm and the sigmoid to x's dtype before their
    product; in bf16 the two differ by roundings. On the H200 the fused path replaced a [B, T, d] sigmoid,
    its backward and three products per KDA layer application (docs/performance.md). One call of either
    counts once in counters.NORM.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.norm = RMSNorm(dim, eps)

    def reset_parameters(self) -> None:
        self.norm.reset_parameters()

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        norm = self.norm
        if resolve_norm_backend(norm.backend, x.device, gated=True) == "fused":
            counters.NORM.record(fused=True)
            fn, _ = fla_kernels.rms_norm_gated()
            return fn(x, gate, norm.weight, None, activation="sigmoid", eps=norm.eps)
        return norm(x) * torch.sigmoid(gate).to(x.dtype)
