"""The KDA layer's short conv on the CPU: the plain path against a float64 loop, its carried state, the
backend policy (fused refused here, loudly), and the fused path's wiring with a stand-in for fla's kernel.

The fused kernel's own numbers (equal to plain, output and gradients) are tests/gpu/test_conv_fused.py.
"""

import pytest
import torch

from dormouse import config, counters, ledger
from dormouse.model import fla_kernels, short_conv
from dormouse.model.model import DormouseLM
from dormouse.model.short_conv import ShortConv, set_conv_backend


def loop_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """SiLU(y), y[b, t, c] = sum_j weight[c, j] · x[b, t - (W - 1) + j], zeros before the start: float64 loops.
    fla documents its causal_conv1d (x [B, T, D], weight [D, W]) as this function."""
    B, T, C = x.shape
    W = weight.shape[1]
    y = torch.zeros(B, T, C, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            for c in range(C):
                for j in range(W):
                    s = t - (W - 1) + j
                    if s >= 0:
                        y[b, t, c] += weight[c, j].double() * x[b, s, c].double()
    return y * torch.sigmoid(y)


def make_conv(channels=3, size=4, seed=0) -> ShortConv:
    conv = ShortConv(channels, size)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=torch.Generator().manual_seed(seed)))
    return conv


def test_plain_matches_the_loop_and_returns_the_last_inputs():
    conv = make_conv()
    x = torch.randn(2, 7, 3, generator=torch.Generator().manual_seed(1))
    y, tail = conv(x, None)
    assert torch.allclose(y.double(), loop_reference(x, conv.weight[:, 0]), rtol=0, atol=1e-6)
    assert torch.equal(tail, x[:, -3:])


def test_carried_state_continues_the_sequence():
    conv = make_conv()
    x = torch.randn(2, 9, 3, generator=torch.Generator().manual_seed(2))
    whole, _ = conv(x, None)
    first, tail = conv(x[:, :5], None)
    rest, _ = conv(x[:, 5:], tail)
    assert torch.allclose(torch.cat([first, rest], 1), whole, rtol=0, atol=1e-6)
    short, short_tail = conv(x[:, :2], None)  # shorter than the kernel: the tail starts with zeros
    assert torch.equal(short_tail, torch.cat([torch.zeros(2, 1, 3), x[:, :2]], 1))


def test_fused_on_cpu_is_refused_through_the_ledger():
    assert ledger.SITES["conv.fused_unavailable"].kind is ledger.Kind.LOUD
    conv = make_conv()
    conv.backend = "fused"
    with pytest.raises(ledger.FallbackRefused, match="--conv-backend plain") as err:
        conv(torch.ones(1, 5, 3), None)
    assert err.value.site == "conv.fused_unavailable"


def test_the_fused_path_hands_fla_its_layout_and_keeps_the_tail(monkeypatch):
    # A stand-in for fla's kernel (its documented function, computed by the float64 loop): the fused
    # branch must pass [B, T, C] and the weight as [C, W], ask for the SiLU, and return the plain tail.
    calls = []

    def stand_in(x, weight, activation=None):
        calls.append((tuple(x.shape), tuple(weight.shape), activation))
        return loop_reference(x, weight).to(x.dtype), None

    monkeypatch.setattr(fla_kernels, "causal_conv1d", lambda: (stand_in, ""))
    monkeypatch.setattr(short_conv, "resolve_conv_backend", lambda requested, device: "fused")
    conv = make_conv()
    x = torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(3))
    counters.CONV.reset()
    fused, fused_tail = conv(x, None)
    plain_conv = make_conv()
    plain_conv.backend = "plain"
    monkeypatch.undo()
    plain, plain_tail = plain_conv(x, None)
    assert calls == [((2, 6, 3), (3, 4), "silu")]
    assert torch.allclose(fused, plain, rtol=0, atol=1e-6) and torch.equal(fused_tail, plain_tail)
    assert (counters.CONV.fused, counters.CONV.calls) == (1, 2)


def test_a_decode_step_runs_plain_and_is_counted(monkeypatch):
    monkeypatch.setattr(short_conv, "resolve_conv_backend", lambda requested, device: "fused")
    conv = make_conv()
    counters.CONV.reset()
    conv(torch.ones(1, 1, 3), torch.zeros(1, 3, 3))  # a carried state: torch's conv, whatever the backend
    assert (counters.CONV.fused, counters.CONV.calls) == (0, 1)


def test_config_resolves_and_the_model_sets_every_conv():
    cfg = config.resolve(config.build("nano"), cuda_available=False)
    assert cfg.model.conv_backend == "plain"
    model = DormouseLM(cfg.model, seed=0)
    convs = [m for m in model.modules() if isinstance(m, ShortConv)]
    assert len(convs) == 3 * cfg.model.block_layers and {m.backend for m in convs} == {"plain"}
    set_conv_backend(model, "fused")
    assert {m.backend for m in convs} == {"fused"}
    set_conv_backend(model, "auto")
    counters.CONV.reset()
    model(torch.zeros(1, 8, dtype=torch.long))
    # every conv of every loop iteration ran, none fused
    assert (counters.CONV.fused, counters.CONV.calls) == (0, 3 * cfg.model.block_layers * cfg.model.depth)
