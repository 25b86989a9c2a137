"""The KDA layer's short convolution: causal, depthwise over time, then SiLU.

Two paths compute the same function: `plain` (torch's depthwise F.conv1d, any device) and `fused`
(dormouse's Triton kernels, model/short_conv_kernels.py: CUDA only, at most 4 taps, SiLU inside, the
pre-activation recomputed in the backward). `fused` works on the [B, T, C] layout the projections give,
where torch's conv needs [B, C, T]. `resolve_conv_backend` applies `fused_or_plain`'s policy (auto:
fused on CUDA, plain elsewhere); the model sets the configured name on every ShortConv
(`set_conv_backend`). A conv wider than the kernels' window is refused on the fused path
(`check_fused_width`), never run another way.

Under autograd the KDA layer convolves q, k and v as three slices of its one packed projection
(`convolve_packed`): on the fused path one autograd Function runs the three in one kernel launch each way
and writes their gradients, and the rest of the projection's, into one tensor shaped as the projection, so
its backward needs no cat of six gradients. The launch also L2-normalises q and k over each head (fla's
l2norm, which chunk_kda would otherwise run on them: the layer then tells fla not to), keeping each head's
1 / norm for the backward.

The fused path covers every forward that starts with no carried state: training, evaluation, a
prompt's prefill. A decode step, which starts from the state, runs the plain path whatever the backend
(as `KDALayer.step` runs the recurrent KDA whatever `kda_backend` says). Every call is counted in
counters.CONV, so the eval line's `conv=<fused>/<calls>` says which path ran.
"""

import torch
import torch.nn.functional as F
from torch import nn

from dormouse import counters, ledger
from dormouse.model import fused_or_plain
from dormouse.model.norm import l2norm

CONV_BACKENDS = fused_or_plain.CHOICES
MAX_FUSED_WIDTH = 4  # short_conv_kernels.TAPS (that module needs Triton to import)
FUSED_UNAVAILABLE = ledger.register(
    "conv.fused_unavailable",
    ledger.Kind.LOUD,
    "fused short conv asked for (or auto on CUDA), but dormouse's Triton conv kernels are not importable, the "
    f"tensors are not on CUDA, or conv_size is over {MAX_FUSED_WIDTH}",
    __name__,
)


def fused_kernels() -> tuple[object | None, str]:
    """dormouse's Triton short-conv kernels (model/short_conv_kernels.py), or None and why not."""
    return fused_or_plain.own_kernels("dormouse.model.short_conv_kernels")


def resolve_conv_backend(requested: str, device: torch.device | str) -> str:
    """The path ShortConv runs for `requested` on `device`: "fused" or "plain"."""
    return fused_or_plain.resolve(
        requested,
        device,
        flag="--conv-backend",
        site=FUSED_UNAVAILABLE,
        kernel=fused_kernels,  # looked up per call: the tests stand in for it
        needs="Triton (for dormouse/model/short_conv_kernels.py)",
    )


def check_fused_width(backend: str, width: int) -> None:
    """Refuse, through the ledger, the fused path for a conv of more taps than the kernels' window."""
    if backend == "fused" and width > MAX_FUSED_WIDTH:
        raise ledger.refuse(
            FUSED_UNAVAILABLE,
            f"conv backend 'fused' takes conv_size <= {MAX_FUSED_WIDTH} (dormouse's Triton kernels), got {width}; "
            "pass --conv-backend plain",
        )


def conv_tail(x: torch.Tensor, keep: int) -> torch.Tensor:
    """The last `keep` inputs of x [B, T, C], zeros before the sequence's start: what a cache carries."""
    T = x.shape[1]
    return x[:, T - keep :] if T >= keep else F.pad(x, (0, 0, keep - T, 0))


class FusableConv(nn.Module):
    """A causal depthwise conv whose calls without carried state can run the fused path: the subclass's
    `weight` [C, 1, size] and the backend asked for (`set_conv_backend`)."""

    weight: nn.Parameter

    def __init__(self):
        super().__init__()
        self.backend = "auto"  # as asked for (CONV_BACKENDS); resolved per call on the input's device

    def is_fused(self, device: torch.device) -> bool:
        """Whether a call without carried state runs the fused path on `device` (refused if it cannot)."""
        fused = resolve_conv_backend(self.backend, device) == "fused"
        check_fused_width("fused" if fused else "plain", self.weight.shape[-1])
        return fused


class ShortConv(FusableConv):
    """SiLU of a causal depthwise conv over time; returns the last `size - 1` inputs so decoding can go on."""

    def __init__(self, channels: int, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, size))

    def forward(self, x: torch.Tensor, state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B,T,C], state [B,size-1,C] (None: zeros) -> (SiLU(y) [B,T,C], new state)."""
        B, T, C = x.shape
        keep = self.weight.shape[-1] - 1
        fused = state is None and self.is_fused(x.device)
        counters.CONV.record(fused=fused)
        if fused:
            return fused_convs(x, (self.weight.view(C, -1),))[0], conv_tail(x, keep)
        if state is None:
            state = x.new_zeros(B, keep, C)
        xs = torch.cat([state.to(x.dtype), x], dim=1)
        y = F.conv1d(xs.transpose(1, 2), self.weight.to(x.dtype), groups=C).transpose(1, 2)
        return F.silu(y), xs[:, xs.shape[1] - keep :]


def convolve_packed(
    packed: torch.Tensor,
    convs: tuple[ShortConv, ...],
    rest: tuple[int, ...],
    norm: int = 0,
    head: int = 0,
    sinks: int = 0,
) -> tuple[torch.Tensor, ...]:
    """Each conv of `convs` (C channels each) on its slice of `packed` [B, T, N], in order from channel 0,
    from the sequence's start, the first `norm` outputs L2-normalised over each `head` channels (fla's
    form, `norm.l2norm`): (each conv's output, then the remaining N - n·C channels split by the widths
    `rest`, as views of `packed`, then `sinks` gradient sinks of the first outputs: see `fused_convs`,
    the only path that has them)."""
    C, n = convs[0].weight.shape[0], len(convs)
    if not all(conv.is_fused(packed.device) for conv in convs):  # each conv's call counts itself
        if sinks:
            raise ValueError("gradient sinks come with the fused conv kernels only (ShortConv.is_fused)")
        *parts, rest_parts = packed.split([C] * n + [packed.shape[-1] - n * C], dim=-1)
        outs = [conv(part, None)[0] for conv, part in zip(convs, parts, strict=True)]
        for i in range(norm):
            outs[i] = l2norm(outs[i].unflatten(-1, (-1, head))).flatten(-2).to(outs[i].dtype)
        return (*outs, *rest_parts.split(rest, dim=-1))
    for _ in convs:
        counters.CONV.record(fused=True)
    weights = tuple(conv.weight.view(C, -1) for conv in convs)
    return fused_convs(packed, weights, rest=rest, norm=norm, head=head, sinks=sinks)


@torch.compiler.disable  # Triton launches, called eagerly under torch.compile (as fla_kernels._opaque)
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
    output's gradient in fp32 hands it over unrounded: fla's dq and dk, kda_fla.py)."""
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


def set_conv_backend(module: nn.Module, backend: str) -> None:
    """Set the requested backend (one of CONV_BACKENDS) on every conv inside `module` that has a fused
    path (FusableConv: the KDA layers' ShortConvs, the engram's EngramConv)."""
    if backend not in CONV_BACKENDS:
        raise ValueError(f"unknown conv backend {backend!r}; choose one of {CONV_BACKENDS}")
    for m in module.modules():
        if isinstance(m, FusableConv):
            m.backend = backend
