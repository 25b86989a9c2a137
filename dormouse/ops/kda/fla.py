"""KDA on fla's kernels: `chunk_kda` (`kda_fla`, the CUDA path of the op) and the KDA layer's training path,
with q's and k's gradients handed back in fp32 (`chunk_kda_sunk`).

fla's `chunk_kda` Function rounds its fp32 dq and dk to q's and k's dtype (bf16 under autocast) before
it returns them (`dq.to(q)`): two [B, T, H, K] casts a layer application, ~0.4 ms a `small` step at
B 64 on an H200 (torch profiler). Autograd would cast any fp32 gradient a Function returns for a
bf16 input the same way. The layer's fused short conv, which made q and k, reads its output gradients
in either dtype. So `chunk_kda_sunk` runs fla's own forward and backward (`chunk_kda_fwd`,
`chunk_kda_bwd`: the kernels and options of `chunk_kda` with the decay gate and beta's sigmoid in the
kernel, q and k normalised by the conv) inside a dormouse Function that returns dq and dk unrounded as
the gradients of two fp32 *sinks*: zero-stride fp32 tensors shaped as q and k, which the conv's Function
hands out beside them and reads the gradients of (`ops.short_conv.convolve_packed(..., sinks=2)`). q and k
themselves get no gradient. The output is `chunk_kda`'s bit for bit; the projection's gradient differs
from the rounded path's by the rounding skipped (tests/gpu/test_kda_fla.py).
"""

from contextlib import nullcontext

import torch

from dormouse.config import SAFE_GATE_BOUNDS
from dormouse.errors import DormouseError
from dormouse.ops.fla import kernels as fla_kernels
from dormouse.ops.kda.reference import check_shapes


def kda_fla(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, fla_options):
    check_shapes(q, k, v, g, beta, initial_state)
    chunk_kda, _ = fla_kernels.chunk_kda()
    dtype = q.dtype
    # fla wants q, k, v, beta in one dtype and an fp32 initial state; the log-decay g stays fp32 (fla's
    # own tests pass it so) since the kernel accumulates it. q, k, g, beta are already activated unless
    # `fla_options` has fla apply them (`prep_in_kernel_options`); its in-kernel gate then reads g, the
    # gate's raw input, in the projection's dtype as it is (`gated`, ops/kda/__init__.py).
    return chunk_kda(
        q,
        k.to(dtype),
        v.to(dtype),
        g if fla_options.get("use_gate_in_kernel") else g.float(),
        beta.to(dtype),
        scale=scale,
        initial_state=None if initial_state is None else initial_state.float(),
        output_final_state=output_final_state,
        chunk_size=chunk_size,
        **fla_options,
    )


def fla_options(*, safe_gate: bool = False, lower_bound: float | None = None, recompute: bool = True) -> dict:
    """Keyword options of fla's chunk_kda: `safe_gate` (tensor-core intra-chunk kernels, for gates in
    [lower_bound, 0): the layer's bounded gate), and `recompute` off (its backward keeps the forward's
    intermediates: fla's `disable_recompute`). They choose among fla's kernels only; the chunked and
    recurrent forms compute the exact function either way."""
    options = {}
    if safe_gate:
        if lower_bound is None:
            raise ValueError("fla's safe_gate needs the gate's lower bound (gate_lower_bound)")
        if not SAFE_GATE_BOUNDS[0] <= lower_bound < SAFE_GATE_BOUNDS[1]:
            raise ValueError(f"fla's safe_gate needs gate_lower_bound in [-5, 0); got {lower_bound}")
        options |= {"safe_gate": True, "lower_bound": lower_bound}
    if not recompute:
        options["disable_recompute"] = True
    return options


def prep_in_kernel_options(
    A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None, qk_norm: bool = True
) -> dict:
    """fla's chunk_kda options that have it apply what the layer would: the L2 norm of q and k (unless
    `qk_norm` is off: the fused short conv normalised them), the decay gate from its raw input
    (lower_bound · sigmoid(exp(A_log) · (g + dt_bias)), or −exp(A_log) · softplus(g + dt_bias) without a
    bound: the layer's `_decay`) and beta's sigmoid. Fewer kernels around each call; fla's kernels compute
    them in fp32 (another rounding than torch's)."""
    return {
        "use_qk_l2norm_in_kernel": qk_norm,
        "use_gate_in_kernel": True,
        "use_beta_sigmoid_in_kernel": True,
        "A_log": A_log,
        "dt_bias": dt_bias,
        "lower_bound": lower_bound,
    }


@torch.compiler.disable  # fla's autotuned Triton launches, eager under torch.compile (ops/fla/kernels.py `_opaque`)
def chunk_kda_sunk(q, k, v, g, beta, A_log, dt_bias, q_sink, k_sink, *, chunk_size, options: dict, scale=None):
    """fla's chunk_kda of (q, k, v, g, beta) with `use_gate_in_kernel` and `use_beta_sigmoid_in_kernel` on
    (g and beta raw, `A_log` and `dt_bias` the gate's) and `options` from `fla_options`; q's and k's
    gradients go to `q_sink` and `k_sink` (module docstring), in fp32. Returns o [B, T, H, V]. `scale`
    None: 1 / sqrt(K), fla's default."""
    if chunk_size not in (32, 64):  # fla's chunk_kda checks it; its parts do not
        raise ValueError(f"fla's KDA kernels take chunk_size 32 or 64, got {chunk_size}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _ChunkKDASunk.apply(q, k, v, g, beta, A_log, dt_bias, q_sink, k_sink, scale, chunk_size, options)


def _parts() -> fla_kernels.ChunkKDAParts:
    parts, why = fla_kernels.chunk_kda_parts()
    if parts is None:  # fla's chunk_kda imported (the backend resolved to fla), its own parts did not
        raise DormouseError(
            f"fla's chunk_kda_fwd / chunk_kda_bwd are not importable ({why}): dormouse pins fla-core 0.6.0"
        )
    return parts


def _on_device(t: torch.Tensor):
    """fla's kernels launch on the current CUDA device: make it t's (fla's own Functions do so too)."""
    return torch.cuda.device(t.device) if t.is_cuda else nullcontext()


class _ChunkKDASunk(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, q, k, v, g, beta, A_log, dt_bias, q_sink, k_sink, scale, chunk_size, options):
        parts = _parts()
        beta_raw = beta.contiguous()  # a view of the projection: fla's kernels index it densely
        with _on_device(q):
            beta = parts.beta_sigmoid_fwd(beta_raw)
            o, _, g_cumsum, Aqk, Akk, w, u, qg, kg, v_new, h, _ = parts.fwd(
                q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=None, output_final_state=False,
                chunk_size=chunk_size, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, **options,
            )  # fmt: skip
        ctx.save_for_backward(q, k, v, g, g_cumsum, beta_raw, beta, A_log, dt_bias, Aqk, Akk, w, u, qg, kg, v_new, h)
        ctx.scale, ctx.chunk_size, ctx.options = scale, chunk_size, options
        return o.to(q.dtype)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, do):
        q, k, v, g, g_cumsum, beta_raw, beta, A_log, dt_bias, Aqk, Akk, w, u, qg, kg, v_new, h = ctx.saved_tensors
        parts = _parts()
        with _on_device(q):
            dq, dk, dv, db, dg, _, dA, dbias = parts.bwd(
                q=q, k=k, v=v, beta=beta, Aqk=Aqk, Akk=Akk, scale=ctx.scale, initial_state=None,
                do=do.contiguous(), dht=None, g=g_cumsum, g_org=g, chunk_size=ctx.chunk_size,
                use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, w=w, u=u, qg=qg, kg=kg, v_new=v_new, h=h,
                **ctx.options,
            )  # fmt: skip
            db = parts.beta_sigmoid_bwd(beta_raw, db)
        grads = (None, None, dv.to(v.dtype), dg.to(g.dtype), db.to(beta_raw.dtype), dA, dbias, dq, dk)
        return (*grads, None, None, None)
