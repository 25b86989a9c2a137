"""Kimi Delta Attention (KDA), the op (the mixer layer around it: model/kda_layer.py).

Three implementations of one function sit side by side, as in fla (reference sheet §1): the recurrence
(reference.py, the definition), the WY/UT-transform chunked form in plain PyTorch (chunked.py, the CPU
path) and fla's Triton `chunk_kda` (fla.py, the CUDA path). `kda` runs the one ops/registry.py chooses
from `--kda-backend` (auto, fla, chunked, recurrent) and the device; asking for fla where it cannot run
is refused through the ledger, never replaced. The layer's training step on fla with the fused short
convs runs fla's forward and backward under dormouse's own Function instead (`fla.chunk_kda_sunk`: the
same kernels, q's and k's gradients in fp32).

`gated` is the layer's entry: KDA taking its gate, beta and q's and k's L2 norms as fused inputs (the
decay gate's raw input, beta's logits, q and k as the convs give them), applied by fla's kernels where
the registry chooses fla and the layer asks for it (`prep_in_kernel`), by torch before `kda` elsewhere;
and fla's training path with the fused convs' gradient sinks (`fla_prepares`).
"""

import torch

from dormouse import counters, ledger
from dormouse.ops import registry
from dormouse.ops.fla import kernels as fla_kernels
from dormouse.ops.kda import chunked, fla, reference
from dormouse.ops.norm.reference import l2norm

FLA_UNAVAILABLE = ledger.register(
    "kda.fla_unavailable",
    ledger.Kind.LOUD,
    "KDA backend fla (or auto on CUDA) asked for, but fla's chunk_kda is not importable or the tensors are not on CUDA",
    __name__,
)


def _fla_kernels() -> tuple[object | None, str]:
    """fla's chunk_kda and the parts the layer's training path runs (fla.py), or None and why not."""
    chunk_kda, why = fla_kernels.chunk_kda()
    parts, why_parts = fla_kernels.chunk_kda_parts()
    return (chunk_kda, "") if chunk_kda is not None and parts is not None else (None, why or why_parts)


OP = registry.register(
    registry.Op(
        "kda",
        "--kda-backend",
        FLA_UNAVAILABLE,
        _fla_kernels,
        "fla-core 0.6.0 (fla.ops.kda's chunk_kda and its parts)",
        counters.KDA,
        choices=("auto", "fla", "chunked", "recurrent"),
        fast="fla",
        plain=("chunked", "recurrent"),
    )
)


def kda(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    backend="auto",
    chunk_size=64,
    fla_options: dict | None = None,
    lower_bound: float | None = None,
):
    """KDA by the backend ops/registry.py chooses for `backend` on q's device, counted in counters.KDA.
    `fla_options` (from `fla.fla_options()`) go to fla's kernel; `lower_bound` (g >= it) to the chunked
    form. Returns (o in q's dtype, the final state or None)."""
    impl = registry.choose("kda", backend, q.device)
    if impl == "fla":
        return fla.kda_fla(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, fla_options or {})
    if impl == "chunked":
        return chunked.kda_chunked(
            q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, lower_bound=lower_bound
        )
    return reference.kda_recurrent(q, k, v, g, beta, scale, initial_state, output_final_state)


def fla_prepares(backend: str, device: torch.device, prep_in_kernel: bool) -> bool:
    """Whether fla's kernels prepare `gated`'s fused inputs on `device`: fla chosen for `backend` and asked
    to (`prep_in_kernel`). Only then does `gated` take the fused convs' gradient sinks."""
    return prep_in_kernel and registry.resolve("kda", backend, device) == "fla"


def gated(
    q,
    k,
    v,
    f,
    b,
    A_log,
    dt_bias,
    *,
    lower_bound: float | None,
    qk_normed: bool = False,
    sinks: tuple | None = None,
    initial_state=None,
    output_final_state: bool = False,
    backend: str = "auto",
    chunk_size: int = 64,
    fla_options: dict | None = None,
    prep_in_kernel: bool = False,
):
    """KDA of q, k, v [B, T, H, K] with the decay gate from its raw input f [B, T, H, K] (`reference.decay`
    with A_log [H], dt_bias [H·K] and `lower_bound`), beta = sigmoid(b [B, T, H]), q and k L2-normalised
    over each head unless `qk_normed`. `sinks` (q's and k's fp32 gradient sinks from the fused convs,
    given where `fla_prepares` and no state is wanted): fla's forward and backward under `fla.chunk_kda_sunk`, no final
    state. Returns (o, the final state or None), counted in counters.KDA."""
    options = fla_options or {}
    if sinks is not None:
        registry.record("kda", fused=True)
        q_sink, k_sink = (t.view(q.shape) for t in sinks)
        options = options | {"lower_bound": lower_bound}
        o = fla.chunk_kda_sunk(q, k, v, f, b, A_log, dt_bias, q_sink, k_sink, chunk_size=chunk_size, options=options)
        return o, None
    on_fla = fla_prepares(backend, q.device, prep_in_kernel)
    if on_fla:
        options = options | fla.prep_in_kernel_options(A_log, dt_bias, lower_bound, qk_norm=not qk_normed)
        # The gate's input in the projection's dtype, uncast: fla's gate kernels load it as fp32 (exact
        # from bf16) and round its gradient once to its dtype, as the cast's backward would: the same
        # arithmetic without a [B, T, H, K] fp32 copy each way (the output and g's gradient bit for bit,
        # A_log's and dt_bias's sums to fp32 rounding: tests/gpu/test_kda_fla.py).
        q, k, g, beta = q.to(v.dtype), k.to(v.dtype), f, b
    else:
        # Autocast runs the norm's reduction in fp32; q, k go back to v's (the projections') dtype so
        # that fla runs its bf16 kernels under bf16 autocast, not fp32 ones.
        if not qk_normed:
            q, k = l2norm(q).to(v.dtype), l2norm(k).to(v.dtype)
        g, beta = reference.decay(f, A_log, dt_bias, lower_bound), torch.sigmoid(b.to(reference.compute_dtype(b)))
    return kda(
        q,
        k,
        v,
        g,
        beta,
        initial_state=initial_state,
        output_final_state=output_final_state,
        backend=backend,
        chunk_size=chunk_size,
        fla_options=options,
        lower_bound=None if on_fla else lower_bound,
    )
