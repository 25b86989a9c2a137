"""Compile fla's largest KDA backward kernels for the H200 (sm_90) on a machine without a GPU, in the
configs the pin holds and a few others, and print each one's registers and spills (as
benches/compile_kernels.py does for dormouse's own). Session 23 found with it that the wy_dqkg backward
spills ~4 KB a thread in its pinned 4-warp config and ~0.3 KB with 8 warps, which fla does not offer on
Hopper (`benches/logs/2026-12-04-cpu-compile-kernels/fla-kda-bwd-spills.txt`). No time is measured.

    pip install einops; unzip fla-core's wheel (fla imports without a GPU); triton 3.6.0 is the dev extra's
    python benches/compile_fla_kernels.py

The signatures are the KDA layer's (`small`: H 8, K = V 64, chunk 64; bf16 under autocast, the decay
gate and gradients of q, k and g in fp32), written out from fla 0.6.0's kernels.
"""

import triton
from compile_kernels import TARGET, ptxas_report
from triton.compiler import ASTSource

SHAPE = {"H": 8, "HV": 8, "K": 64, "BT": 64}


def _jit(fn) -> triton.runtime.jit.JITFunction:
    """The JIT function under fla's autotune and heuristics decorators."""
    while not isinstance(fn, triton.runtime.jit.JITFunction):
        fn = fn.fn
    return fn


def _variants() -> list[tuple[str, object, dict, dict, list[tuple[dict, int, int]]]]:
    """(name, jit function, signature, constexprs, [(block constexprs, warps, stages)])."""
    from fla.ops.common import chunk_delta_h
    from fla.ops.kda import chunk_bwd, chunk_intra

    tensors = "q k v v_new g beta A h do dh dq dk dv dv2 dg db dA".split()
    dtypes = "bf16 bf16 bf16 bf16 fp32 fp32 bf16 bf16 bf16 bf16 fp32 fp32 bf16 bf16 fp32 fp32 fp32".split()
    wy = {n: f"*{d}" for n, d in zip(tensors, dtypes, strict=True)}
    wy |= {"cu_seqlens": "*i32", "chunk_indices": "*i32", "scale": "fp32", "T": "i32"}
    intra = dict.fromkeys("g beta dAqk dAkk dq dq2 dk dk2 dg dg2 db".split(), "*fp32") | {"q": "*bf16", "k": "*bf16"}
    intra |= {"cu_seqlens": "*i32", "chunk_indices": "*i32", "B": "i32", "T": "i32"}
    dhu = dict.fromkeys("q k w do dh dv dv2".split(), "*bf16") | dict.fromkeys("g gk dht dh0".split(), "*fp32")
    dhu |= {"cu_seqlens": "*i32", "chunk_offsets": "*i32", "scale": "fp32", "T": "i32"}
    fixed = {"IS_VARLEN": False}
    return [
        ("chunk_kda_bwd_kernel_wy_dqkg_fused", chunk_bwd.chunk_kda_bwd_kernel_wy_dqkg_fused, wy,
         {**SHAPE, "V": 64, "STATE_V_FIRST": False, "USE_GRAPH": False, **fixed},
         [({"BK": bk, "BV": bv}, w, s) for bk, bv, w, s in
          [(64, 64, 4, 4), (64, 64, 4, 3), (32, 64, 4, 2), (64, 64, 8, 3), (64, 64, 8, 2), (64, 64, 8, 1),
           (32, 64, 8, 2), (64, 128, 8, 2), (64, 32, 4, 2), (64, 32, 8, 2), (32, 32, 8, 2), (64, 64, 16, 2)]]),
        ("chunk_kda_bwd_kernel_intra", chunk_intra.chunk_kda_bwd_kernel_intra, intra,
         {**SHAPE, "BC": 16, "BK": 32, "NC": 4, "SAFE_GATE": True, "GATE_SHIFT": 5.0 * 1.4426950408889634,
          "USE_GATHER": False, "USE_GRAPH": False, **fixed},
         [({}, w, s) for w, s in [(1, 2), (1, 3), (2, 2), (4, 2), (8, 2)]]),
        ("chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64",
         chunk_delta_h.chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64, dhu,
         {**SHAPE, "V": 64, "USE_G": False, "USE_GK": True, "USE_INITIAL_STATE": False,
          "USE_FINAL_STATE_GRADIENT": False, "STATE_V_FIRST": False, **fixed},
         [({"BV": bv}, w, s) for bv, w, s in [(32, 4, 3), (64, 4, 2), (32, 8, 3), (64, 8, 2)]]),
    ]  # fmt: skip


def main() -> None:
    for name, fn, signature, constexprs, configs in _variants():
        for blocks, warps, stages in configs:
            cx = {**constexprs, **blocks}
            full = {**signature, **dict.fromkeys(cx, "constexpr")}
            kernel = triton.compile(
                ASTSource(_jit(fn), full, cx), target=TARGET, options={"num_warps": warps, "num_stages": stages}
            )
            print(f"{name} {blocks} warps {warps} stages {stages}: {ptxas_report(kernel.asm['ptx'])}")


if __name__ == "__main__":
    main()
