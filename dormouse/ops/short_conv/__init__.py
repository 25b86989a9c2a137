"""The short convolution, the op: causal, depthwise over time, then SiLU (the KDA layers' and the
engram's, model/short_conv.py and model/engram.py).

Two paths compute the same function: `plain` (reference.py: torch's depthwise F.conv1d, any device)
and `fused` (fused.py over dormouse's Triton kernels, triton.py: CUDA only, at most 4 taps, SiLU inside,
the pre-activation recomputed in the backward). `fused` works on the [B, T, C] layout the projections
give, where torch's conv needs [B, C, T]. `--conv-backend` (auto, fused, plain) chooses through
ops/registry.py (auto: fused on CUDA, plain elsewhere). A conv wider than the kernels' window is refused
on the fused path (`is_fused`), never run another way.

Under autograd the KDA layer convolves q, k and v as three slices of its one packed projection
(`convolve_packed`): on the fused path one autograd Function runs the three in one kernel launch each way
and writes their gradients, and the rest of the projection's, into one tensor shaped as the projection, so
its backward needs no cat of six gradients. The launch also L2-normalises q and k over each head (fla's
l2norm, which chunk_kda would otherwise run on them: `Convolved.normed` says so, and the KDA op then
tells fla not to), keeping each head's 1 / norm for the backward. The plain path runs the three as one
depthwise conv over a channels-last view of the [B, T, 3C] slice (`_plain_packed`), the same function.

The engram's conv (`dilated_short_conv`) spaces its taps `dilation` apart and takes its RMSNorm as a
fused input: the norm of the new positions alone, then the kernel, on the fused path.

The fused path covers every forward that starts with no carried state: training, evaluation, a
prompt's prefill. A decode step, which starts from the state, runs the plain path whatever the backend
(as `KDALayer.step` runs the recurrent KDA whatever `kda_backend` says). Every call is counted in
counters.CONV, so the eval line's `conv=<fused>/<calls>` says which path ran.
"""

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from dormouse import counters, ledger
from dormouse.ops import registry
from dormouse.ops.short_conv import fused, reference

MAX_FUSED_WIDTH = 4  # triton.TAPS (that module needs Triton to import)
FUSED_UNAVAILABLE = ledger.register(
    "conv.fused_unavailable",
    ledger.Kind.LOUD,
    "fused short conv asked for (or auto on CUDA), but dormouse's Triton conv kernels are not importable, the "
    f"tensors are not on CUDA, or conv_size is over {MAX_FUSED_WIDTH}",
    __name__,
)
# the kernels' accessor is a lambda, looked up per call: the tests stand in for what it calls
NEEDS = "Triton (for dormouse/ops/short_conv/triton.py)"
OP = registry.register(
    registry.Op("conv", "--conv-backend", FUSED_UNAVAILABLE, lambda: fused.fused_kernels(), NEEDS, counters.CONV)
)


def is_fused(backend: str, device: torch.device, width: int) -> bool:
    """Whether a call without carried state of a conv of `width` taps runs the fused path on `device`
    (refused, through the ledger, where it cannot, or for more taps than the kernels' window)."""
    chosen = registry.resolve("conv", backend, device) == "fused"
    if chosen and width > MAX_FUSED_WIDTH:
        raise ledger.refuse(
            FUSED_UNAVAILABLE,
            f"conv backend 'fused' takes conv_size <= {MAX_FUSED_WIDTH} (dormouse's Triton kernels), got {width}; "
            "pass --conv-backend plain",
        )
    return chosen


def short_conv(
    x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B,T,C], weight [C,1,size], state [B,size-1,C] (None: zeros) -> (SiLU(conv) [B,T,C], new state)."""
    C, keep = x.shape[-1], weight.shape[-1] - 1
    chosen = state is None and is_fused(backend, x.device, weight.shape[-1])
    registry.record("conv", chosen)
    if chosen:
        return fused.fused_convs(x, (weight.view(C, -1),))[0], reference.conv_tail(x, keep)
    return reference.short_conv(x, weight, state)


class Convolved(NamedTuple):
    """`convolve_packed`'s result: each conv's output, then the rest of the channels (views), whether the
    first outputs asked for are L2-normalised already, and their gradient sinks (None unless asked for
    and normalised)."""

    outs: tuple[torch.Tensor, ...]
    normed: bool
    sinks: tuple[torch.Tensor, ...] | None


def convolve_packed(
    packed: torch.Tensor,
    weights: tuple[torch.Tensor, ...],
    backend: str,
    rest: tuple[int, ...],
    norm: int = 0,
    head: int = 0,
    sinks: bool = False,
) -> Convolved:
    """Each conv of `weights` ([C, 1, size] each) on its slice of `packed` [B, T, N], in order from channel
    0, from the sequence's start, then the remaining N - n·C channels split by the widths `rest`, as views
    of `packed`. On the fused path with `head` a power of two the first `norm` outputs come L2-normalised
    over each `head` channels (fla's form, inside the kernels' launch; `normed`), with their gradient
    sinks where `sinks` asks (see `fused.fused_convs`); elsewhere the caller normalises them. Each conv
    counts once in counters.CONV."""
    C, n = weights[0].shape[0], len(weights)
    if not is_fused(backend, packed.device, weights[0].shape[-1]):
        for _ in weights:
            registry.record("conv", False)
        # one split: autograd joins the pieces' gradients with one cat, where slices would each take a
        # zero-filled [B, T, N] gradient and a sum
        convolved, *others = packed.split((n * C, *rest), dim=-1)
        return Convolved((*_plain_packed(convolved, weights), *others), False, None)
    for _ in weights:
        registry.record("conv", True)
    normed = norm > 0 and _is_power_of_two(head)
    flat = tuple(weight.view(C, -1) for weight in weights)
    n_sinks = norm if normed and sinks else 0
    outs = fused.fused_convs(packed, flat, rest=rest, norm=norm if normed else 0, head=head, sinks=n_sinks)
    kept = n + len(rest)
    return Convolved(outs[:kept], normed, outs[kept:] or None)


def _plain_packed(x: torch.Tensor, weights: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """`reference.short_conv` of each [C, 1, size] weight on its slice of x [B, T, n·C], from the sequence's
    start, as one depthwise conv: a [B, n·C, 1, T] view of [B, T, n·C] is channels-last, which torch's conv
    runs as it lies (the [B, C, T] layout of conv1d costs transposing copies each way on the CPU), and the
    SiLU then runs on contiguous memory."""
    keep, C = weights[0].shape[-1] - 1, weights[0].shape[0]
    x = F.pad(x, (0, 0, keep, 0))  # the zeros before the start
    w = torch.cat(weights).to(x.dtype).unsqueeze(2)  # [n·C, 1, 1, size]
    y = F.conv2d(x.transpose(1, 2).unsqueeze(2), w, groups=w.shape[0]).squeeze(2).transpose(1, 2)
    return F.silu(y).split(C, dim=-1)


def dilated_short_conv(
    x: torch.Tensor,
    tail: torch.Tensor | None,
    weight: torch.Tensor,
    dilation: int,
    prenorm: Callable[[torch.Tensor], torch.Tensor],
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU of the causal depthwise conv of prenorm(inputs), taps `dilation` apart (the engram's), at the
    positions of x [B, T, C] -> (that [B, T, C], the new tail: the last (size−1)·dilation inputs). `tail`
    holds the inputs before x (None: the sequence's start, zeros before it; `prenorm` takes zero to zero,
    as an RMSNorm does). The norm is the op's fused input: a call from the start with positions runs the
    fused path where `backend` chooses it on x's device (the norm of x alone, then one kernel). Counted in
    counters.CONV."""
    keep = (weight.shape[-1] - 1) * dilation
    chosen = tail is None and x.shape[1] > 0 and is_fused(backend, x.device, weight.shape[-1])
    registry.record("conv", chosen)
    if chosen:
        y = fused.fused_convs(prenorm(x), (weight.view(x.shape[-1], -1),), dilation)[0]
        return y, reference.conv_tail(x, keep)
    if tail is None:
        tail = x.new_zeros(x.shape[0], keep, x.shape[-1])
    inputs = torch.cat([tail.to(x.dtype), x], dim=1)
    y = reference.dilated_short_conv(prenorm(inputs), weight.to(x.dtype), dilation, x.shape[1])
    return y, inputs[:, inputs.shape[1] - keep :]


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
