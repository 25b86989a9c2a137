"""The fused-or-plain policy of RMSNorm, the short conv and the SwiGLU (`--norm-backend`, `--conv-backend`,
`--swiglu-backend`) on the CPU: auto is torch here, and a fused path that cannot run is refused through
the op's ledger site."""

import pytest
import torch

from dormouse import ledger
from dormouse.model import fla_kernels, short_conv, swiglu
from dormouse.model.norm import resolve_norm_backend
from dormouse.model.short_conv import resolve_conv_backend
from dormouse.model.swiglu import resolve_swiglu_backend

OPS = [  # (resolve, (the module, the name) of its kernels' accessor, flag, ledger site)
    (resolve_norm_backend, (fla_kernels, "rms_norm"), "--norm-backend", "norm.fused_unavailable"),
    (resolve_conv_backend, (short_conv, "fused_kernels"), "--conv-backend", "conv.fused_unavailable"),
    (resolve_swiglu_backend, (swiglu, "fused_kernels"), "--swiglu-backend", "swiglu.fused_unavailable"),
]
IDS = ["norm", "conv", "swiglu"]


@pytest.mark.parametrize("resolve, accessor, flag, site", OPS, ids=IDS)
def test_policy_names(resolve, accessor, flag, site):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve("auto", cpu) == "plain"
    assert resolve("plain", cuda) == "plain"
    with pytest.raises(ValueError, match=f"unknown {flag[2:].replace('-', ' ')} 'apex'"):
        resolve("apex", cpu)


@pytest.mark.parametrize("resolve, accessor, flag, site", OPS, ids=IDS)
def test_fused_on_cpu_is_refused_through_the_ledger(resolve, accessor, flag, site):
    assert ledger.SITES[site].kind is ledger.Kind.LOUD
    with pytest.raises(ledger.FallbackRefused, match=f"needs CUDA, got device cpu; pass {flag} plain") as err:
        resolve("fused", torch.device("cpu"))
    assert err.value.site == site


@pytest.mark.parametrize("resolve, accessor, flag, site", OPS, ids=IDS)
def test_auto_on_cuda_without_fla_is_refused(resolve, accessor, flag, site, monkeypatch):
    # Only the device type and the import are consulted, so this runs without a GPU.
    monkeypatch.setattr(*accessor, lambda: (None, "ModuleNotFoundError: No module named 'fla'"))
    for requested in ("auto", "fused"):
        with pytest.raises(ledger.FallbackRefused, match="install the extra `gpu`") as err:
            resolve(requested, torch.device("cuda"))
        assert err.value.site == site
