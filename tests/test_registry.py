"""The backend policy of ops/registry.py on the CPU: auto is torch here, and a fast path that cannot run is
refused through the op's ledger site (RMSNorm, the short conv, the SwiGLU, KDA)."""

import pytest
import torch

from dormouse import ledger
from dormouse.ops import kda, norm, registry, short_conv, swiglu
from dormouse.ops.fla import kernels as fla_kernels
from dormouse.ops.short_conv import fused as conv_fused
from dormouse.ops.swiglu import fused as swiglu_fused

OPS = [  # (op, (the module, the name) of its kernels' accessor, flag, ledger site, the plain backend)
    (norm.OP.name, (fla_kernels, "rms_norm"), "--norm-backend", "norm.fused_unavailable", "plain"),
    (short_conv.OP.name, (conv_fused, "fused_kernels"), "--conv-backend", "conv.fused_unavailable", "plain"),
    (swiglu.OP.name, (swiglu_fused, "fused_kernels"), "--swiglu-backend", "swiglu.fused_unavailable", "plain"),
    (kda.OP.name, (fla_kernels, "chunk_kda"), "--kda-backend", "kda.fla_unavailable", "chunked"),
]
IDS = ["norm", "conv", "swiglu", "kda"]


@pytest.mark.parametrize("op, accessor, flag, site, plain", OPS, ids=IDS)
def test_policy_names(op, accessor, flag, site, plain):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert registry.resolve(op, "auto", cpu) == plain
    assert registry.resolve(op, plain, cuda) == plain
    with pytest.raises(ValueError, match=f"unknown {flag[2:].replace('-', ' ')} 'apex'"):
        registry.resolve(op, "apex", cpu)


@pytest.mark.parametrize("op, accessor, flag, site, plain", OPS, ids=IDS)
def test_fast_on_cpu_is_refused_through_the_ledger(op, accessor, flag, site, plain):
    assert ledger.SITES[site].kind is ledger.Kind.LOUD
    fast = registry.OPS[op].fast
    with pytest.raises(ledger.FallbackRefused, match=f"needs CUDA, got device cpu; pass {flag} {plain}") as err:
        registry.resolve(op, fast, torch.device("cpu"))
    assert err.value.site == site


@pytest.mark.parametrize("op, accessor, flag, site, plain", OPS, ids=IDS)
def test_auto_on_cuda_without_kernels_is_refused(op, accessor, flag, site, plain, monkeypatch):
    # Only the device type and the import are consulted, so this runs without a GPU.
    monkeypatch.setattr(*accessor, lambda: (None, "ModuleNotFoundError: No module named 'fla'"))
    for requested in ("auto", registry.OPS[op].fast):
        with pytest.raises(ledger.FallbackRefused, match="install the extra `gpu`") as err:
            registry.resolve(op, requested, torch.device("cuda"))
        assert err.value.site == site


def test_choose_counts_each_call_in_the_op_s_counter():
    counter = registry.OPS["norm"].counter
    before = (counter.fused, counter.calls)
    assert registry.choose("norm", "auto", torch.device("cpu")) == "plain"
    assert (counter.fused, counter.calls) == (before[0], before[1] + 1)
