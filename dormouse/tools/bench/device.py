"""The device's facts for a bench row: its name, the peak MFU is taken against, peak memory, versions.

The peak (`peak_tflops`, `peak_source`):

- NVIDIA H200, bf16: 680 TFLOP/s, a dense bf16 matmul measured at 8192³ on an H200 (the datasheet's
  989 dense is not reached);
- NVIDIA H200, fp32 with torch's default float32 matmul precision "highest": 67 TFLOP/s (H200
  datasheet, FP32 without tensor cores); with precision "high"/"medium" (TF32): 494.5 TFLOP/s (the
  datasheet's 989 TF32 is with sparsity, halved for dense);
- any other device, CPU included: a large matmul in the bench's dtype (fp32 2048³ on the CPU, 8192³
  on CUDA), measured at bench start in the same process, best of 5. The log also records this
  measured figure on the H200, beside the constant.

Peak memory: on CUDA torch.cuda.max_memory_allocated (reset before each model is built); on the CPU
resource.getrusage(RUSAGE_SELF).ru_maxrss, the whole process's peak resident set (Python, torch and
the model together, and under `--baselines` the models benched before it). `mem_source` says which.
"""

import importlib.metadata
import math
import platform
import re
import sys
import time
from pathlib import Path

import torch

# (substring of torch.cuda.get_device_name(), precision) -> (TFLOP/s, where the number comes from)
PEAKS = {
    ("H200", "bf16"): (680.0, "H200 bf16 dense matmul measured at 8192^3"),
    ("H200", "fp32"): (67.0, "H200 datasheet FP32 (no tensor cores; float32 matmul precision highest)"),
    ("H200", "tf32"): (494.5, "H200 datasheet TF32 tensor core 989 with sparsity, halved for dense"),
}
CPU_PEAK_N, CUDA_PEAK_N, PEAK_REPS = 2048, 8192, 5


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_matmul_tflops(device: torch.device, dtype: torch.dtype, n: int, reps: int = PEAK_REPS) -> float:
    """Best of `reps` timed n×n @ n×n matmuls (after two untimed), in TFLOP/s. No RNG: constant inputs."""
    a = torch.full((n, n), 0.5, device=device, dtype=dtype)
    b = torch.full((n, n), 0.25, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    best = math.inf
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(errors="replace"), re.M)
        model = found.group(1).strip() if found else model
    return f"cpu ({model}, {torch.get_num_threads()} threads)"


def device_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower().replace("nvidia", "")
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "cuda"


def peak_tflops(device: torch.device, dtype: str, measured: float) -> tuple[float, str]:
    """The peak MFU is taken against, and where it comes from (module docstring)."""
    if device.type == "cuda":
        tf32 = dtype == "tf32" or (dtype == "fp32" and torch.get_float32_matmul_precision() != "highest")
        wanted = "tf32" if tf32 else dtype
        name = torch.cuda.get_device_name(device)
        for (key, prec), (value, source) in PEAKS.items():
            if key in name and prec == wanted:
                return value, f"constant: {source}"
        n = CUDA_PEAK_N
    else:
        n = CPU_PEAK_N
    return measured, f"measured this run: {dtype} matmul {n}^3 best of {PEAK_REPS}"


def peak_memory(device: torch.device) -> tuple[float, str]:
    """(GiB, source)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30, "cuda max_memory_allocated"
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss * (1 if sys.platform == "darwin" else 1024) / 2**30, "cpu ru_maxrss (whole process)"


def fla_version() -> str:
    for dist in ("fla-core", "flash-linear-attention"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "-"


def measure_peak(device: torch.device, dtype: str) -> tuple[float, int]:
    """(TFLOP/s, n): the best n×n matmul in the bench's dtype on `device` (n = CPU_PEAK_N or CUDA_PEAK_N)."""
    n = CUDA_PEAK_N if device.type == "cuda" else CPU_PEAK_N
    return measure_matmul_tflops(device, torch.bfloat16 if dtype == "bf16" else torch.float32, n), n
