"""Kimi Delta Attention (KDA), the op (the mixer layer around it: model/kda_layer.py).

Three implementations of one function sit side by side, as in fla (reference sheet §1): the recurrence
(reference.py, the definition), the WY/UT-transform chunked form in plain PyTorch (chunked.py, the CPU
path) and fla's Triton `chunk_kda` (fla.py, the CUDA path). `kda` runs the one ops/registry.py chooses
from `--kda-backend` (auto, fla, chunked, recurrent) and the device; asking for fla where it cannot run
is refused through the ledger, never replaced. The layer's training step on fla with the fused short
convs runs fla's forward and backward under dormouse's own Function instead (`fla.chunk_kda_sunk`: the
same kernels, q's and k's gradients in fp32).
"""

from dormouse import counters, ledger
from dormouse.ops import registry
from dormouse.ops.fla import kernels as fla_kernels
from dormouse.ops.kda import chunked, fla, reference

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
