"""Compile dormouse's own Triton kernels for Hopper (sm_90: H100, H200) on a machine without a GPU.

Each kernel variant the `small` step launches at B 64 is compiled ahead of time by Triton for an sm_90
target, and its PTX assembled by Triton's bundled ptxas with `-v`: a kernel that does not compile fails
here rather than in a device call, and the registers a thread takes and any spills are printed (a
memory-bound kernel that spills, or whose registers leave few warps per SM, is a candidate for other
blocks). It does not run anything: the numbers are the GPU tests' and the interpreter's (docs/performance.md).

    python benches/compile_kernels.py [--only NAME]   # triton 3.6.0 (the dev extra) carries ptxas

tests/test_kernels_compile.py runs it in every CI run: every variant compiles, none spills.
"""

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.errors import CompilationError

TARGET = GPUTarget("cuda", 90, 32)  # Hopper: H100, H200


def _kernels() -> list[tuple[str, object, dict, dict, int]]:
    """(name, jit function, signature, constexprs, warps) of each variant `small` launches at B 64."""
    from dormouse.ops.engram_gate import triton as gate
    from dormouse.ops.momentum import triton as momentum_kernels
    from dormouse.ops.norm import triton as norm_kernels
    from dormouse.ops.row_adam import triton as row_adam_kernels
    from dormouse.ops.row_sum import triton as row_sum_kernels
    from dormouse.ops.short_conv import triton as conv
    from dormouse.ops.sinkhorn import triton as sk
    from dormouse.ops.swiglu import triton as swiglu_kernels

    out = []

    def add(name: str, fn, spec: str, constexprs: dict, warps: int = 4) -> None:
        out.append((name, fn, dict(item.split(":") for item in spec.split()), constexprs, warps))

    d = {"D": 512, "BD": 512}
    gate_io = "h:*fp32 v:*bf16 k:*bf16 w_h:*fp32 w_k:*fp32"
    add("engram gate forward", gate._fwd_kernel,
        f"{gate_io} out:*bf16 rstd_h:*fp32 rstd_k:*fp32 alpha:*fp32 N:i32 s_h:i32 s_v:i32 s_k:i32 eps_h:fp32 "
        "eps_k:fp32 scale:fp32", {**d, "BT": 4}, gate.WARPS)  # fmt: skip
    add("engram gate backward", gate._bwd_kernel,
        f"{gate_io} rstd_h:*fp32 rstd_k:*fp32 alpha:*fp32 g:*bf16 dh:*fp32 dv:*bf16 dk:*bf16 dwh_part:*fp32 "
        "dwk_part:*fp32 N:i32 s_h:i32 s_v:i32 s_k:i32 s_g:i32 s_dv:i32 s_dk:i32 scale:fp32",
        {**d, "BT": 4, "LOOPS": gate.LOOPS}, gate.WARPS)  # fmt: skip
    for first in (True, False):
        add(f"sinkhorn rows first={first}", sk._rows_kernel, "u:*fp32 r:*fp32 c:*fp32 m:i32 n:i32 target:fp32 eps:fp32",
            {"BLOCK": 2048, "WHOLE": True, "FIRST": first})  # fmt: skip
        add(f"sinkhorn columns first={first}", sk._columns_kernel,
            "part:*fp32 c:*fp32 n:i32 parts:i32 target:fp32 eps:fp32",
            {"PB": sk.PARTS_AT_ONCE, "BC": sk.COLUMN_BLOCK, "FIRST": first})  # fmt: skip
    add("sinkhorn column parts", sk._column_parts_kernel, "u:*fp32 r:*fp32 part:*fp32 m:i32 n:i32 parts:i32",
        {"RB": sk.ROWS_PER_PART, "BC": sk.COLUMN_BLOCK})  # fmt: skip
    for step, in_memory, x, s in ((False, False, "*fp32", "fp32"), (True, True, "*i64", "*fp32"),
                                  (True, False, "*i64", "fp32")):  # fmt: skip
        add(f"sinkhorn apply step={step} in_memory={in_memory}", sk._apply_kernel,
            f"u:*fp32 r:*fp32 c:*fp32 x:{x} lr:{s} decay:{s} m:i32 n:i32",
            {"BR": sk.TILE[0], "BC": sk.TILE[1], "STEP": step, "IN_MEMORY": in_memory})  # fmt: skip
    for skippable in (True, False):
        add(f"momentum skippable={skippable}", momentum_kernels._momentum_kernel,
            "g:*fp32 m:*fp32 found_inf:*fp32 n:i64 beta:fp32 one_minus_beta:fp32",
            {"SKIPPABLE": skippable, "BLOCK": momentum_kernels.BLOCK}, momentum_kernels.WARPS)  # fmt: skip
    for update_w in (True, False):
        add(f"row adam update_w={update_w}", row_adam_kernels._row_adam_kernel,
            "idx:*i64 g:*fp32 keep:*i1 step_size:*fp32 bc2:*fp32 m_all:*fp32 v_all:*fp32 w_all:*fp32 k:i32 "
            "beta1:fp32 one_minus_beta1:fp32 beta2:fp32 one_minus_beta2:fp32 eps:fp32",
            {"D": 64, "BR": row_adam_kernels.TILE // 64, "BD": 64, "UPDATE_W": update_w},
            row_adam_kernels.WARPS)  # fmt: skip
    for has_dsum in (True, False):
        add(f"add-norm backward has_dsum={has_dsum}", norm_kernels._add_norm_bwd_kernel,
            "s:*fp32 w:*fp32 rstd:*fp32 dy:*bf16 dsum:*fp32 dx:*bf16 dsum_in:*fp32 dw_part:*fp32 T:i32",
            {**d, "BT": 16, "HAS_DSUM": has_dsum}, norm_kernels.WARPS)  # fmt: skip
    # the KDA layers' q, k, v (bf16 projection; q and k normalised per head of 64, their gradients fp32
    # through the sinks, v's bf16: two backward launches) and the engram's conv (dilation 4)
    ints = "B:i32 T:i32 stride_x_b:i32 stride_x_t:i32"
    for (norm, dilation), (L, BD, warps, stages) in (((2, 1), conv.NORM_FWD_BLOCKS), ((0, 4), conv.FWD_BLOCKS)):
        G, HD = (BD // 64, 64) if norm else (1, BD)
        add(f"conv forward norm={norm} dilation={dilation}", conv._fwd_kernel,
            f"x:*bf16 w:*fp32 y:*bf16 rstd:*fp32 {ints}",
            {"C": 512, "NB": 512 // (G * HD), "G": G, "HD": HD, "L": L, "DIL": dilation, "NORM": norm,
             "EPS": conv.NORM_EPS, "NS": stages}, warps)  # fmt: skip
    for norm, dilation, dy, (L, BD, warps, stages) in ((2, 1, "fp32", conv.NORM_BWD_BLOCKS),
                                                       (2, 1, "bf16", conv.NORM_BWD_BLOCKS),
                                                       (0, 4, "bf16", conv.BWD_BLOCKS)):  # fmt: skip
        G, HD = (BD // 64, 64) if norm else (1, BD)
        add(f"conv backward norm={norm} dilation={dilation} dy={dy}", conv._bwd_kernel,
            f"x:*bf16 w:*fp32 rstd:*fp32 dy0:*{dy} dy1:*{dy} dy2:*{dy} dx:*bf16 dw:*fp32 {ints} stride_dx_b:i32 "
            "stride_dx_t:i32 N0:i32 N_ALL:i32",
            {"C": 512, "NB": 512 // (G * HD), "G": G, "HD": HD, "L": L, "DIL": dilation, "NORM": norm,
             "NS": stages}, warps)  # fmt: skip
    rows, cols, warps = swiglu_kernels._tile(1536)
    tile = {"H": 1536, "BR": rows, "BH": cols}
    add("swiglu forward", swiglu_kernels._fwd_kernel, "x:*bf16 y:*bf16 z:*bf16 N:i32 s_x:i32 s_y:i32", tile, warps)
    add(
        "swiglu backward",
        swiglu_kernels._bwd_kernel,
        "x:*bf16 y:*bf16 g:*bf16 dx:*bf16 dy:*bf16 N:i32 s_x:i32 s_y:i32 s_g:i32 s_dx:i32 s_dy:i32",
        tile,
        warps,
    )
    add("row sums", row_sum_kernels._row_sums_kernel, "values:*fp32 order:*i64 bounds:*i64 out:*fp32",
        {"D": 64, "BLOCK": 64}, row_sum_kernels._warps(64))  # fmt: skip
    return out


def ptxas_report(ptx: str) -> str:
    """ptxas -v's line for the kernel: registers, spills, shared memory."""
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        done = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True, check=True)  # fmt: skip
    regs = re.search(r"Used (\d+) registers", done.stderr)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    return f"{regs.group(1) if regs else '?'} registers, spills {spills.group(1)}/{spills.group(2)} bytes"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="compile the variants whose name contains this")
    args = ap.parse_args()
    failed = 0
    for name, fn, signature, constexprs, warps in _kernels():
        if args.only and args.only not in name:
            continue
        full = {**signature, **dict.fromkeys(constexprs, "constexpr")}
        try:
            kernel = triton.compile(ASTSource(fn, full, constexprs), target=TARGET, options={"num_warps": warps})
            print(f"{name}: ok, {warps} warps, {ptxas_report(kernel.asm['ptx'])}")
        except (CompilationError, subprocess.CalledProcessError, RuntimeError) as err:  # report it, go on
            failed += 1
            print(f"{name}: FAILED {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
