"""The SwiGLU activation `silu(gate) * up`, the FFN's elementwise middle.

Two paths compute the same function: `plain` (torch's silu and mul, any device) and `fused` (fla's
Triton SwiGLU kernels, CUDA only). Under bf16 autocast the plain path rounds the SiLU to bf16 before
the product and runs three elementwise kernels forward and three backward over [B, T, hidden]; on the
H200 they were 5.1 ms of `small`'s 54 ms step at batch 64 (docs/performance.md). fla's kernels compute
`silu(gate) * up` and both gradients in fp32 in one pass each and round once.

When autograd records, the fused path takes the gate and up projections as the two halves of one
matmul's output `h` [..., 2·hidden] and writes their gradients into one [..., 2·hidden] tensor, so
the projection's backward needs no `cat` of two gradients. Without autograd (evals, decoding) it runs
fla's forward kernel on the two separate projections.

`resolve_swiglu_backend` applies `fused_or_plain`'s policy (auto: fused on CUDA, plain elsewhere); the
model sets the configured name on every SwiGLU (`ffn.set_swiglu_backend`), and every call is counted in
counters.SWIGLU, so the eval line's `swiglu=<fused>/<calls>` says which path ran.
"""

import torch
import torch.nn.functional as F

from dormouse import counters, ledger
from dormouse.model import fla_kernels, fused_or_plain

SWIGLU_BACKENDS = fused_or_plain.CHOICES
FUSED_UNAVAILABLE = ledger.register(
    "swiglu.fused_unavailable",
    ledger.Kind.LOUD,
    "fused SwiGLU asked for (or auto on CUDA), but fla's SwiGLU kernels are not importable or the tensors "
    "are not on CUDA",
    __name__,
)


def resolve_swiglu_backend(requested: str, device: torch.device | str) -> str:
    """The path the SwiGLU activation runs for `requested` on `device`: "fused" or "plain"."""
    return fused_or_plain.resolve(
        requested,
        device,
        flag="--swiglu-backend",
        site=FUSED_UNAVAILABLE,
        kernel=fla_kernels.swiglu,  # looked up per call: the tests stand in for it
        needs="fla-core 0.6.0 (fla.modules.activations.ops)",
    )


def is_fused(backend: str, device: torch.device) -> bool:
    """Whether this call runs the fused path (resolved for `device`); counted in counters.SWIGLU."""
    fused = resolve_swiglu_backend(backend, device) == "fused"
    counters.SWIGLU.record(fused=fused)
    return fused


def plain(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


@torch.compiler.disable  # fla's Triton launches, called eagerly under torch.compile (fla_kernels._opaque)
def fused_packed(h: torch.Tensor) -> torch.Tensor:
    """`silu(h[..., :H]) * h[..., H:]` for `h` [..., 2H], with its gradient into one [..., 2H] tensor."""
    return _PackedSwiGLU.apply(h)


@torch.compiler.disable
def fused_pair(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` by fla's forward kernel, no gradient (evals and decoding)."""
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        raise RuntimeError("fused_pair has no backward: under autograd use fused_packed on the packed projection")
    return _forward(gate, up)


def _ops():
    """fla's activation module (its kernels address `row·stride + col`; `prepare_input` gives a tensor and
    that row stride, copying only a layout whose leading dims do not flatten into one stride)."""
    return fla_kernels.swiglu()[0]


def _forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    ops = _ops()
    gate, gate_stride = ops.prepare_input(gate)
    up, up_stride = ops.prepare_input(up)
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    n, d = gate.numel(), gate.shape[-1]
    ops.swiglu_fwd_kernel[lambda meta: (-(-n // meta["B"]),)](
        x=gate, y=up, z=out, stride_x_row=gate_stride, stride_y_row=up_stride, stride_z_row=d, T=n, D=d
    )
    return out


class _PackedSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h)
        gate, up = h.chunk(2, dim=-1)
        return _forward(gate, up)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (h,) = ctx.saved_tensors
        ops = _ops()
        gate, up = h.chunk(2, dim=-1)
        gate, gate_stride = ops.prepare_input(gate)
        up, up_stride = ops.prepare_input(up)
        grad, grad_stride = ops.prepare_input(grad)
        dh = torch.empty(h.shape, dtype=h.dtype, device=h.device)
        d_gate, d_up = dh.chunk(2, dim=-1)  # views: the kernel writes both halves of one tensor
        n, d = gate.numel(), gate.shape[-1]
        ops.swiglu_fwdbwd_kernel[lambda meta: (-(-n // meta["B"]),)](
            x=gate,
            y=up,
            g=grad,
            dx=d_gate,
            dy=d_up,
            z=None,
            stride_x_row=gate_stride,
            stride_y_row=up_stride,
            stride_g_row=grad_stride,
            stride_dx_row=2 * d,
            stride_dy_row=2 * d,
            stride_z_row=0,
            T=n,
            D=d,
        )
        return dh
