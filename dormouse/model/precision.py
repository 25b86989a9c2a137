"""What `--dtype` means for float32 arithmetic, set once per process before any kernel compiles.

fp32  float32 matmuls in true fp32: torch's matmul precision "highest", and Triton's fp32 `tl.dot`
      (fla's kernels) in IEEE fp32 (TRITON_F32_DEFAULT=ieee). Triton's default on Hopper is TF32,
      which puts fla's KDA over the 1e-3 fp32 gate (tests/gpu/kda_fla_gate.py).
tf32  the same tensors in fp32 but matmuls on TF32 tensor cores: torch "high", Triton "tf32".
bf16  autocast to bfloat16 (CUDA only); float32 leftovers as tf32 (the fast path; bf16 dominates).

On the CPU none of this changes anything (no TF32 there), so the CPU is always fp32.

Whatever the dtype, torch runs in deterministic mode (`torch.use_deterministic_algorithms`): an op with a
non-deterministic CUDA kernel runs its deterministic one, and an op that has none raises. Without it the
byte embedding's gradient (atomic adds on CUDA) differs between two processes of one config from the
first step, and the runs part.
"""

import contextlib
import os
import sys

import torch

from dormouse import ledger

DTYPES = ("fp32", "tf32", "bf16")
# Triton's own default is TF32; for it the variable is left unset, because Triton hashes the variable
# into its cache keys and setting it to the default would throw away every cached kernel and tuning.
_FLOAT32 = {"fp32": ("highest", "ieee"), "tf32": ("high", None), "bf16": ("high", None)}


CUBLAS_WORKSPACE = ":4096:8"  # cuBLAS's documented setting for the same bits on every stream


def triton_fp32(dtype: str) -> str:
    """How Triton's fp32 dot products run under `dtype`: ieee or tf32."""
    return _FLOAT32[dtype][1] or "tf32"


TRITON_SWITCH = ledger.register(
    "precision.triton_switch",
    ledger.Kind.LOUD,
    "another --dtype's Triton fp32 precision asked for in a process that imported Triton: its kernels compiled "
    "under the first precision would run",
    __name__,
)
_triton_set: list[str] = []  # triton_fp32 of this process's last apply(), if any


def apply(dtype: str) -> str:
    """Set torch's and Triton's float32 precision for `dtype`; returns a line for the run header.

    Once Triton is imported, its fp32 precision is fixed for the process: a kernel compiled for one
    input dtype under one precision is reused under another (`--dtype fp32` after a TF32 run in the same
    process would run fla's TF32 kernels), so a change raises instead of running the old one."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {DTYPES}")
    torch_precision, triton_precision = _FLOAT32[dtype]
    if "triton" in sys.modules and _triton_set and _triton_set[0] != triton_fp32(dtype):
        raise ledger.refuse(
            TRITON_SWITCH,
            f"--dtype {dtype} needs Triton fp32 dots in {triton_fp32(dtype)}, but this process "
            f"imported Triton under {_triton_set[0]}: run it in a process of its own",
        )
    _triton_set[:] = [triton_fp32(dtype)]
    torch.set_float32_matmul_precision(torch_precision)
    if triton_precision is None:
        os.environ.pop("TRITON_F32_DEFAULT", None)
    else:
        os.environ["TRITON_F32_DEFAULT"] = triton_precision  # read by Triton when it compiles a kernel
    if "triton" in sys.modules:  # already imported: its knob may have cached the old value
        knobs = getattr(sys.modules["triton"], "knobs", None)
        if knobs is not None:
            knobs.language.fp32_default = triton_precision
    # cuBLAS is bitwise reproducible on one stream only, unless its workspace is fixed (cuBLAS docs,
    # "Results reproducibility"); a CUDA graph is captured on a side stream (train/graphed.py). Read when
    # the first cuBLAS handle is made, so set here, before any matmul; a user's own value is kept and shown.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    # That mode also fills every new tensor's memory with NaN by default, a kernel per allocation: 51 ->
    # 56.8 ms per T 256 B 64 step with it on. Off, no read of unwritten memory shows: two processes still
    # repeat every gradient and weight.
    torch.utils.deterministic.fill_uninitialized_memory = False
    return (
        f"float32 precision: torch matmul {torch_precision}, Triton fp32 dot {triton_fp32(dtype)}; "
        f"cuBLAS workspace {os.environ['CUBLAS_WORKSPACE_CONFIG']}; deterministic algorithms"
    )


def autocast(dtype: str, device_type: str):
    """The context a forward runs under for `dtype`: bf16 autocast (master weights stay fp32), else none.

    Autocast's cache of weight casts is off: with it, the looped block's uses of one weight share one
    bf16 copy, so their gradients are summed in bf16 before reaching the fp32 weight; without it each
    use's gradient is summed in fp32. It also keeps a CUDA graph capture (train/graphed.py) from holding
    casts made outside it, so a replayed step equals the eager one bitwise."""
    if dtype == "bf16":
        return torch.autocast(device_type, dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()
