"""RMSNorm's backend policy on the CPU: plain torch here; asking for the fused kernel is refused, loudly.

The fused path's numbers (output and gradients equal to plain) are tests/gpu/test_norm_fused.py.
"""

import pytest
import torch

from dormouse import config, counters, ledger
from dormouse.model.model import DormouseLM
from dormouse.model.norm import RMSNorm, set_norm_backend


def test_plain_matches_the_formula_in_float64():
    x = torch.tensor([[3.0, -4.0], [1.0, 1.0]], dtype=torch.float64)
    norm = RMSNorm(2, eps=0.0).double()
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([2.0, 0.5]))
    # rms of (3, -4) is sqrt(12.5); of (1, 1) is 1
    expected = torch.tensor([[2 * 3 / 12.5**0.5, 0.5 * -4 / 12.5**0.5], [2.0, 0.5]], dtype=torch.float64)
    assert torch.allclose(norm(x), expected, rtol=0, atol=1e-15)


def test_fused_on_cpu_is_refused_through_the_ledger():
    assert ledger.SITES["norm.fused_unavailable"].kind is ledger.Kind.LOUD
    norm = RMSNorm(4)
    norm.backend = "fused"
    with pytest.raises(ledger.FallbackRefused, match="--norm-backend plain") as err:
        norm(torch.ones(2, 4))
    assert err.value.site == "norm.fused_unavailable"


def test_config_resolves_and_the_model_sets_every_norm():
    cfg = config.resolve(config.build("nano", {"model": {"attn_res": True}}), cuda_available=False)
    assert cfg.model.norm_backend == "plain"
    model = DormouseLM(cfg.model, seed=0)
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert len(norms) > 3 and {m.backend for m in norms} == {"plain"}
    set_norm_backend(model, "fused")
    assert {m.backend for m in norms} == {"fused"}
    counters.NORM.reset()
    set_norm_backend(model, "auto")
    model(torch.zeros(1, 8, dtype=torch.long))
    assert counters.NORM.fused == 0 and counters.NORM.calls >= len(norms)  # each norm ran, none fused
