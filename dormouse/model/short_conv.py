"""The KDA layer's short convolution: causal, depthwise over time, then SiLU.

Two paths compute the same function: `plain` (torch's depthwise F.conv1d, any device) and `fused` (fla's
Triton causal_conv1d with the SiLU in its kernel, CUDA only, with its own backward). `fused` works on
the [B, T, C] layout the projections give, where torch's conv needs [B, C, T]: on the H200 the profile
of a T 256 B 64 step showed 5.5 ms of its 51 in torch's depthwise kernels, beside the transposes
(docs/performance.md). `resolve_conv_backend` applies `fused_or_plain`'s policy (auto: fused on
CUDA, plain elsewhere); the model sets the configured name on every ShortConv (`set_conv_backend`).

The fused path covers every forward that starts with no carried state: training, evaluation, a
prompt's prefill. A decode step, which starts from the state, runs the plain path whatever the backend
(as `KDALayer.step` runs the recurrent KDA whatever `kda_backend` says). Every call is counted in
counters.CONV, so the eval line's `conv=<fused>/<calls>` says which path ran.
"""

import torch
import torch.nn.functional as F
from torch import nn

from dormouse import counters, ledger
from dormouse.model import fla_kernels, fused_or_plain

CONV_BACKENDS = fused_or_plain.CHOICES
FUSED_UNAVAILABLE = ledger.register(
    "conv.fused_unavailable",
    ledger.Kind.LOUD,
    "fused short conv asked for (or auto on CUDA), but fla's causal_conv1d is not importable or the tensors "
    "are not on CUDA",
    __name__,
)


def resolve_conv_backend(requested: str, device: torch.device | str) -> str:
    """The path ShortConv runs for `requested` on `device`: "fused" or "plain"."""
    return fused_or_plain.resolve(
        requested,
        device,
        flag="--conv-backend",
        site=FUSED_UNAVAILABLE,
        kernel=fla_kernels.causal_conv1d,  # looked up per call: the tests stand in for it
        needs="fla.modules.causal_conv1d",
    )


class ShortConv(nn.Module):
    """SiLU of a causal depthwise conv over time; returns the last `size - 1` inputs so decoding can go on."""

    def __init__(self, channels: int, size: int):
        super().__init__()
        self.backend = "auto"  # as asked for (CONV_BACKENDS); resolved per call on the input's device
        self.weight = nn.Parameter(torch.empty(channels, 1, size))

    def forward(self, x: torch.Tensor, state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B,T,C], state [B,size-1,C] (None: zeros) -> (SiLU(y) [B,T,C], new state)."""
        B, T, C = x.shape
        keep = self.weight.shape[-1] - 1
        fused = state is None and resolve_conv_backend(self.backend, x.device) == "fused"
        counters.CONV.record(fused=fused)
        if fused:
            fn, _ = fla_kernels.causal_conv1d()
            y, _ = fn(x, self.weight[:, 0].to(x.dtype), activation="silu")
            # The tail a cache carries: the last `keep` inputs, zeros before the sequence's start.
            return y, x[:, T - keep :] if T >= keep else F.pad(x, (0, 0, keep - T, 0))
        if state is None:
            state = x.new_zeros(B, keep, C)
        xs = torch.cat([state.to(x.dtype), x], dim=1)
        y = F.conv1d(xs.transpose(1, 2), self.weight.to(x.dtype), groups=C).transpose(1, 2)
        return F.silu(y), xs[:, xs.shape[1] - keep :]


def set_conv_backend(module: nn.Module, backend: str) -> None:
    """Set the requested backend (one of CONV_BACKENDS) on every ShortConv inside `module`."""
    if backend not in CONV_BACKENDS:
        raise ValueError(f"unknown conv backend {backend!r}; choose one of {CONV_BACKENDS}")
    for m in module.modules():
        if isinstance(m, ShortConv):
            m.backend = backend
