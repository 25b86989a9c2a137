"""The short conv's fused path: dormouse's Triton kernels (triton.py) under one autograd Function, any
number of convs over adjacent channel slices of one packed projection in one launch each way."""

import torch

from dormouse.ops import registry


def fused_kernels() -> tuple[object | None, str]:
    """dormouse's Triton short-conv kernels (ops/short_conv/triton.py), or None and why not."""
    return registry.own_kernels("dormouse.ops.short_conv.triton")


@torch.compiler.disable  # Triton launches, called eagerly under torch.compile (as ops/fla/kernels.py's `_opaque`)
def fused_convs(
    packed: torch.Tensor,
    weights: tuple[torch.Tensor, ...],
    dilation: int = 1,
    rest: tuple[int, ...] = (),
    norm: int = 0,
    head: int = 0,
    sinks: int = 0,
) -> tuple[torch.Tensor, ...]:
    """The fused path of `convolve_packed`, weights [C, W] each, taps `dilation` apart: (each conv's
    output, then the channels after them split by the widths `rest`, views of `packed`, then `sinks`
    fp32 (at least) zeros shaped as the first `sinks` outputs, zero-stride: a gradient given to sink i
    is read, in its dtype, as output i's (added to any output i has). A consumer that computes an
    output's gradient in fp32 hands it over unrounded: fla's dq and dk, ops/kda/fla.py)."""
    return _FusedConvs.apply(packed, dilation, rest, norm, head, sinks, *weights)


class _FusedConvs(torch.autograd.Function):
    """SiLU(conv) of packed's first n·C channels, C at a time, in one kernel launch each way (the first
    `norm` outputs L2-normalised inside it), the rest of packed's channels as views (no copy) and the
    gradient sinks; the backward writes every gradient into one tensor shaped as packed (no cat of the
    rest's gradients)."""

    @staticmethod
    def forward(
        ctx,
        packed: torch.Tensor,
        dilation: int,
        rest: tuple[int, ...],
        norm: int,
        head: int,
        sinks: int,
        *weights: torch.Tensor,
    ):
        kernels, _ = fused_kernels()
        n = len(weights)
        weight = torch.cat(weights) if n > 1 else weights[0]  # [n·C, W]
        if weight.shape[0] + sum(rest) != packed.shape[-1] or sinks > n:
            raise ValueError(
                f"{n} convs of {weight.shape[0] // n}, the rest {rest} and {sinks} sinks for {packed.shape}"
            )
        y, rstd = kernels.forward(packed, weight, n, dilation, norm, head)
        ctx.save_for_backward(packed, weight, rstd)
        ctx.conv, ctx.rest = (n, dilation, norm, head), rest
        ctx.set_materialize_grads(False)  # an output without a gradient (q beside its sink) costs no zeros
        sunk = ()
        if sinks:
            zero = torch.zeros((), dtype=torch.promote_types(packed.dtype, torch.float32), device=packed.device)
            sunk = tuple(zero.expand(y.shape[1:]) for _ in range(sinks))
        return (*y.unbind(0), *packed[..., weight.shape[0] :].split(rest, dim=-1), *sunk)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):
        kernels, _ = fused_kernels()
        packed, weight, rstd = ctx.saved_tensors
        n, dilation, norm, head = ctx.conv
        C, rest = weight.shape[0] // n, ctx.rest
        outs, rest_grads, sunk = grads[:n], grads[n : n + len(rest)], grads[n + len(rest) :]
        dys = tuple(_output_grad(dy, sunk[i] if i < len(sunk) else None, packed, C) for i, dy in enumerate(outs))
        dpacked = torch.empty(packed.shape, dtype=packed.dtype, device=packed.device)
        dweight = kernels.backward(packed, weight, dys, dpacked, dilation, norm, head, rstd)
        start = n * C
        for width, grad in zip(rest, rest_grads, strict=True):
            target = dpacked[..., start : start + width]
            if grad is None:
                target.zero_()
            else:
                target.copy_(grad)
            start += width
        return (dpacked, None, None, None, None, None, *dweight.split(C))


def _output_grad(dy: torch.Tensor | None, sunk: torch.Tensor | None, packed: torch.Tensor, C: int) -> torch.Tensor:
    """A conv output's gradient for the kernel, contiguous: its own, its sink's (fp32), their sum, or
    zeros where it has neither."""
    if dy is None and sunk is None:
        return packed.new_zeros(*packed.shape[:-1], C)
    grad = dy if sunk is None else (sunk if dy is None else sunk + dy)
    return grad.contiguous()
