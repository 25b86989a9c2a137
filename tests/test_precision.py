"""`--dtype` sets torch's and Triton's float32 precision for the process (dormouse/model/precision.py)."""

import os
import sys
import types

import pytest
import torch

from dormouse import config, ledger
from dormouse.errors import ConfigError
from dormouse.model import precision
from dormouse.ops.fla import pin as fla_pin
from dormouse.resolve import resolve


@pytest.fixture(autouse=True)
def restore_precision(monkeypatch):
    # Each test starts as a process that has not imported Triton (this one may have:
    # tests/test_kernels_interpreted.py) and has not called apply().
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    monkeypatch.setattr(precision, "_triton_set", [])
    before, env = torch.get_float32_matmul_precision(), os.environ.get("TRITON_F32_DEFAULT")
    yield
    torch.set_float32_matmul_precision(before)
    if env is None:
        os.environ.pop("TRITON_F32_DEFAULT", None)
    else:
        os.environ["TRITON_F32_DEFAULT"] = env


@pytest.mark.parametrize(
    "dtype, torch_precision, triton", [("fp32", "highest", "ieee"), ("tf32", "high", "tf32"), ("bf16", "high", "tf32")]
)
def test_apply_sets_both_libraries(dtype, torch_precision, triton):
    note = precision.apply(dtype)
    assert torch.get_float32_matmul_precision() == torch_precision
    assert os.environ.get("TRITON_F32_DEFAULT") == (None if triton == "tf32" else triton)  # tf32: Triton's default
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == precision.CUBLAS_WORKSPACE  # the same GEMM bits on any stream
    want = (
        f"float32 precision: torch matmul {torch_precision}, Triton fp32 dot {triton}; cuBLAS workspace :4096:8; "
        "deterministic algorithms"
    )
    assert note == want


def test_apply_turns_on_torch_deterministic_mode():
    # The byte embedding's CUDA backward (atomic adds) parted two processes of one config at step 1 without it.
    precision.apply("bf16")
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.utils.deterministic.fill_uninitialized_memory  # a NaN fill per allocation costs ~10 %
    # An op with no deterministic implementation raises rather than run (put_ without accumulate: repeated
    # indices keep whichever write lands last).
    with pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
        torch.zeros(4).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))


def test_a_users_cublas_workspace_is_kept_and_shown(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert "; cuBLAS workspace :16:8;" in precision.apply("fp32")
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_unknown_dtype_and_cpu_only_fp32():
    with pytest.raises(ValueError, match="unknown dtype"):
        precision.apply("fp16")
    for dtype in ("tf32", "bf16"):
        with pytest.raises(ConfigError, match=f"dtype {dtype} is for CUDA"):
            resolve(config.build("nano", {"train": {"dtype": dtype, "device": "cpu"}}), cuda_available=False)


def test_fla_pin_folder_names_follow_fla():
    # fla.ops.utils.cache.sanitize_gpu_name: runs of non-alphanumerics become one underscore
    assert fla_pin.gpu_dir_name("NVIDIA H200") == "NVIDIA_H200"
    assert fla_pin.gpu_dir_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    assert fla_pin.gpu_dir_name("  --  ") == "unknown_gpu"


def test_committed_fla_pin_files_are_in_flas_format():
    """Each entry's hash is fla's AutotuneKey.key_hash: md5 of the key as compact sorted JSON."""
    import hashlib
    import json

    files = sorted(fla_pin.CONFIG_ROOT.glob("*/*.json"))
    assert files, "no committed pin"
    for path in files:
        data = json.loads(path.read_text())
        assert data["kernel_name"] == path.stem and data["triton_version"]
        for digest, entry in data["autotune_entries"].items():
            key = json.dumps(entry["autotune_key"], separators=(",", ":"), sort_keys=True)
            assert hashlib.md5(key.encode()).hexdigest() == digest, (path.name, digest)
            assert {"kwargs", "num_warps", "num_stages", "num_ctas"} <= set(entry["config"])


def test_triton_precision_cannot_change_once_triton_is_imported(monkeypatch):
    # A kernel compiled for one input dtype under one precision is reused under another in one process
    # (`--dtype fp32` would run fla's TF32 kernels after a TF32 run), so the change is refused.
    precision.apply("bf16")  # before Triton's import: any change is still free
    precision.apply("fp32")
    precision.apply("bf16")
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    precision.apply("tf32")  # the same Triton precision as bf16's (TF32)
    with pytest.raises(ledger.FallbackRefused, match="--dtype fp32 needs Triton fp32 dots in ieee"):
        precision.apply("fp32")
