"""Every dormouse Triton kernel variant the `small` step launches compiles for Hopper (sm_90) with no
register spills: benches/compile_kernels.py (Triton's ahead-of-time compile and its bundled ptxas, no GPU)
in a process of its own (this one defines the kernels under Triton's interpreter). A kernel that fails
here would fail at a device call's first step; a spill is a speed regression to measure on the GPU
before it lands (docs/performance.md)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton (the dev extra) compiles the kernels")

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ("engram gate", "sinkhorn", "momentum", "row adam", "add-norm backward", "conv forward",
           "conv backward", "swiglu", "row sums")  # fmt: skip


def test_every_kernel_variant_compiles_for_sm90_without_spills(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compiled here, not found in a cache
    done = subprocess.run(
        [sys.executable, "benches/compile_kernels.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert all(": ok, " in line and line.endswith(", spills 0/0 bytes") for line in lines), done.stdout
    assert all(any(line.startswith(kernel) for line in lines) for kernel in KERNELS), done.stdout
