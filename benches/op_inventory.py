"""Count first: the torch ops one training step of a preset runs around fla's kernels, on the CPU.

The CUDA step of `small` spends about a third of its GPU time in torch's elementwise and copy kernels
(docs/performance.md, the profile at batch 64), which a replayed CUDA graph does not attribute to ops.
This runs one forward and backward on the CPU under bf16 autocast with fla's kernels (chunk_kda,
rms_norm, rms_norm_gated and the layer-norm functions, the SwiGLU kernels) and dormouse's short-conv
kernels replaced by opaque stand-ins of the same signature, so the dormouse-side ops are the CUDA
path's (the in-kernel KDA prep, the fused conv, norms and SwiGLU, the bf16 matmuls of
ops/projections.py with their fp32 weight gradients, listed from meta operands), and lists every aten op the step
dispatches outside the stand-ins: its count, output shape and dtypes, and the bytes it moves (inputs read
plus output written), grouped by op, shapes and dtypes, largest first. It does not time anything: it
predicts which ops a GPU profile will show, and how many bytes each group moves.

    python benches/op_inventory.py --preset small --batch-size 64 --seq-len 512 [--rows 40] [--where]
"""

import argparse
import collections
import traceback
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dormouse import config
from dormouse.model import dropout
from dormouse.model.model import DormouseLM
from dormouse.ops import passes, projections, registry
from dormouse.ops.engram_gate import fused as engram_gate
from dormouse.ops.fla import kernels as fla_kernels
from dormouse.ops.norm import fla as norm
from dormouse.ops.short_conv import fused as short_conv
from dormouse.ops.swiglu import fused as swiglu
from dormouse.resolve import resolve


class Inventory(TorchDispatchMode):
    """Every aten op dispatched while no stand-in runs: (op, output shapes, dtypes in->out) -> [count, bytes].
    With `where`, the key also names the op's site: the autograd node that runs it in the backward, else the
    innermost dormouse source line that called it."""

    def __init__(self, where: bool = False):
        super().__init__()
        self.rows = collections.defaultdict(lambda: [0, 0])
        self.opaque = 0  # > 0 inside a stand-in of an fla kernel
        self.where = where

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.opaque:
            return out
        ins = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        outs = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        # A view (every output aliases an input, read-only: the schema says so) moves nothing.
        # `_unsafe_view` is a view whose schema does not say so (reshape's of a fresh tensor).
        returns = func._schema.returns
        is_view = func.overloadpacket.__name__ == "_unsafe_view" or (
            bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
        )
        allocates = func.overloadpacket.__name__ in ("empty", "empty_like", "empty_strided")  # writes nothing
        moved = 0 if is_view or allocates else sum(t.numel() * t.element_size() for t in ins + outs)
        key = (
            str(func.overloadpacket.__name__),
            " ".join(str(list(o.shape)) for o in outs),
            _dtypes(ins) + "->" + _dtypes(outs),
        ) + ((_site(),) if self.where else ())
        self.rows[key][0] += 1
        self.rows[key][1] += moved
        return out


def _site() -> str:
    """Where the op being dispatched comes from: `bwd <autograd node>` or `fwd <file>:<line>` (dormouse's)."""
    node = torch._C._current_autograd_node()
    if node is not None:
        return f"bwd {node.name()}"
    ours = [f for f in traceback.extract_stack() if "/dormouse/" in f.filename]
    return "fwd " + (f"{ours[-1].filename.split('/dormouse/')[-1]}:{ours[-1].lineno}" if ours else "?")


def _dtypes(tensors: list[torch.Tensor]) -> str:
    short = {"float32": "f32", "bfloat16": "bf16", "int64": "i64", "float64": "f64", "bool": "b"}
    names = (str(t.dtype).removeprefix("torch.") for t in tensors)
    return ",".join(short.get(n, n) for n in names)


def _opaque(mode: Inventory, fn):
    """fn as an fla kernel stand-in: its own ops are not listed (fla's Triton kernels run there)."""

    def run(*args, **kwargs):
        mode.opaque += 1
        try:
            return fn(*args, **kwargs)
        finally:
            mode.opaque -= 1

    return run


@contextmanager
def fla_standins(mode: Inventory):
    """fla's kernels as opaque stand-ins with fla's signatures and output shapes, the fused paths chosen."""

    class Stand(torch.autograd.Function):
        """One output like `like` from `inputs`, every input a gradient of zeros: the op's shape, no maths."""

        @staticmethod
        def forward(ctx, like, *inputs):
            ctx.shapes = [(i.shape, i.dtype) if isinstance(i, torch.Tensor) else None for i in inputs]
            return torch.zeros_like(like)

        @staticmethod
        def backward(ctx, grad):
            zeros = _opaque(mode, lambda s: None if s is None else torch.zeros(s[0], dtype=s[1]))
            return (None, *map(zeros, ctx.shapes))

    def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **options):
        extras = [options[n] for n in ("A_log", "dt_bias") if n in options]
        return Stand.apply(v, q, k, v, g, beta, *extras), None

    class ChunkKDAParts:  # fla_kernels.chunk_kda_parts(): fla's forward and backward under ops/kda/fla.py's Function
        beta_sigmoid_fwd = staticmethod(_opaque(mode, lambda x: torch.zeros(x.shape)))
        beta_sigmoid_bwd = staticmethod(_opaque(mode, lambda x, dy: torch.zeros_like(x)))
        fwd = staticmethod(_opaque(mode, lambda q, k, v, *args, **kw: (torch.zeros_like(v), *(None,) * 11)))

        @staticmethod
        def _bwd(q, k, v, beta, *args, g_org, A_log, dt_bias, **kw):
            # dq, dk, db, dA, dbias in fp32; dg in g_org's dtype (fla's kda_gate_bwd: empty_like(g))
            fp32 = [torch.zeros(t.shape) for t in (q, k, beta, A_log, dt_bias)]
            return fp32[0], fp32[1], torch.zeros_like(v), fp32[2], torch.zeros_like(g_org), None, fp32[3], fp32[4]

        bwd = staticmethod(_opaque(mode, _bwd))

    def rms_norm(x, weight, bias, eps=1e-6):
        return Stand.apply(x, x, weight)

    def rms_norm_gated(x, g, weight, bias, activation="swish", eps=1e-6):
        return Stand.apply(x, x, g, weight)

    class LayerNormOps:  # fla's layer_norm_fwd (no bias) / layer_norm_bwd (no residual): shapes, no maths
        @staticmethod
        def layer_norm_fwd(x, weight, bias, eps, residual=None, out_dtype=None, is_rms_norm=False):
            rstd = torch.zeros(x.shape[0])
            normed = x if residual is None else torch.zeros_like(residual)
            return torch.zeros(x.shape, dtype=out_dtype or x.dtype), None, rstd, normed

        @staticmethod
        def layer_norm_bwd(dy, x, weight, bias, rstd=None, is_rms_norm=False, x_dtype=None):
            return torch.zeros(x.shape, dtype=x_dtype), torch.zeros_like(weight), None, None

    def conv_forward(x, weight, n=1, dilation=1, norm=0, head=0):
        C = weight.shape[0] // n
        rstd = torch.zeros(norm, *x.shape[:2], C // head) if norm else None
        return torch.zeros(n, *x.shape[:2], C, dtype=x.dtype), rstd

    class ConvKernels:  # ops/short_conv/triton.py: y contiguous [n, B, T, C], dx written in place
        forward = staticmethod(_opaque(mode, conv_forward))
        backward = staticmethod(_opaque(mode, lambda x, weight, dys, dx, *args: torch.zeros_like(weight)))

    class SwigluKernels:  # ops/swiglu/triton.py: z contiguous [N, H]; the gradients written in place
        forward = staticmethod(_opaque(mode, lambda gate, up: torch.zeros(gate.shape, dtype=gate.dtype)))
        backward = staticmethod(_opaque(mode, lambda gate, up, g, d_gate, d_up: None))

    def gate_forward(h, v, k, *args):  # out [N, D] in v's dtype; rstd_h, rstd_k, alpha [N] fp32
        return torch.zeros(v.shape, dtype=v.dtype), *torch.zeros(3, h.shape[0])

    class GateKernels:  # ops/engram_gate/triton.py: v's and k's gradients written in place
        forward = staticmethod(_opaque(mode, gate_forward))
        backward = staticmethod(
            _opaque(mode, lambda h, v, k, w_h, w_k, *args: tuple(map(torch.zeros_like, (h, w_h, w_k))))
        )

    def add_norm_backward(dy, normed, weight, rstd, dsum, x_dtype):
        return torch.zeros(normed.shape, dtype=x_dtype), torch.zeros_like(normed), torch.zeros_like(weight)

    class AddNormKernels:  # ops/norm/triton.py: dx, the residual's gradient (fp32), dw
        backward = staticmethod(_opaque(mode, add_norm_backward))

    def mm_fp32(a, b):  # projections' CUDA-only bf16 x bf16 -> fp32 product: listed from meta operands
        am, bm = _opaque(mode, lambda: (a.to("meta"), b.to("meta")))()
        product = torch.mm(am, bm, out_dtype=torch.float32)
        return _opaque(mode, lambda: torch.zeros(product.shape, dtype=product.dtype))()

    norm_ops = LayerNormOps()
    for name in ("layer_norm_fwd", "layer_norm_bwd"):
        setattr(norm_ops, name, _opaque(mode, getattr(LayerNormOps, name)))
    accessors = {
        "chunk_kda": lambda: (_opaque(mode, chunk_kda), ""),
        "chunk_kda_parts": lambda: (ChunkKDAParts, ""),
        "rms_norm": lambda: (_opaque(mode, rms_norm), ""),
        "rms_norm_gated": lambda: (_opaque(mode, rms_norm_gated), ""),
        "layer_norm_ops": lambda: (norm_ops, ""),
    }
    saved = {name: getattr(fla_kernels, name) for name in accessors}
    saved_resolve, saved_conv = registry.resolve, short_conv.fused_kernels
    saved_add_norm, saved_swiglu, saved_gate = norm.add_norm_kernels, swiglu.fused_kernels, engram_gate.fused_kernels
    saved_matmul = projections.bf16_matmul, projections._mm_fp32
    for name, accessor in accessors.items():
        setattr(fla_kernels, name, accessor)
    registry.resolve = lambda name, requested, device: registry.OPS[name].fast  # fla for KDA, fused elsewhere
    short_conv.fused_kernels = lambda: (ConvKernels, "")
    norm.add_norm_kernels = lambda: (AddNormKernels, "")
    swiglu.fused_kernels = lambda: (SwigluKernels, "")
    engram_gate.fused_kernels = lambda: (GateKernels, "")
    projections.bf16_matmul, projections._mm_fp32 = lambda x: True, mm_fp32  # the CUDA bf16 matmul path
    try:
        yield
    finally:
        for name, accessor in saved.items():
            setattr(fla_kernels, name, accessor)
        registry.resolve = saved_resolve
        short_conv.fused_kernels = saved_conv
        norm.add_norm_kernels, swiglu.fused_kernels = saved_add_norm, saved_swiglu
        engram_gate.fused_kernels = saved_gate
        projections.bf16_matmul, projections._mm_fp32 = saved_matmul


def inventory(preset: str, batch: int, seq_len: int, overrides: dict | None = None, where: bool = False) -> Inventory:
    """The ops of one forward and backward of `preset` at [batch, seq_len] under bf16 autocast (CPU);
    `where`: each op's site too (Inventory)."""
    cfg = resolve(config.build(preset, {"train": {"device": "cpu"}, **(overrides or {})}))
    model = passes.schedule(DormouseLM(cfg.model, seed=0))
    ids = torch.randint(256, (batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    mode = Inventory(where)
    with fla_standins(mode), mode, torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        out = model(ids[:, :-1], ids[:, 1:], dropout_gen=dropout.step_generator(0, 0))  # the trainer's masks
        out.loss.backward()
    return mode


def table(mode: Inventory, rows: int) -> str:
    ranked = sorted(((k, v) for k, v in mode.rows.items() if v[1]), key=lambda kv: -kv[1][1])
    total = sum(b for _, b in mode.rows.values())
    site = "  site" if mode.where else ""
    lines = [f"{'op':<34} {'calls':>5} {'GB':>7} {'share':>6}  {'dtypes in->out':<24} {'output shapes':<40}{site}"]
    for (op, shapes, dtypes, *where), (n, moved) in ranked[:rows]:
        row = f"{op:<34} {n:>5} {moved / 1e9:>7.3f} {moved / total:>6.1%}  {dtypes[:24]:<24} {shapes[:40]:<40}"
        lines.append(row + "".join(f"  {w}" for w in where))
    calls = sum(n for n, moved in mode.rows.values() if moved)
    views = sum(n for n, moved in mode.rows.values() if not moved)
    moved = f"{total / 1e9:.3f} GB (inputs read + outputs written)"
    lines.append(f"all: {calls} ops that move bytes ({views} views besides), {moved}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--rows", type=int, default=40)
    p.add_argument("--no-engram", action="store_true")
    p.add_argument("--where", action="store_true", help="one row per op site (autograd node or dormouse line)")
    a = p.parse_args()
    overrides = {"model": {"engram": False}} if a.no_engram else None
    print(table(inventory(a.preset, a.batch_size, a.seq_len, overrides, a.where), a.rows))


if __name__ == "__main__":
    main()
