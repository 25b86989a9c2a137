"""StressMonitor: the spike rule by hand, the 201-loss window, p99.9 against numpy, and an exact resume."""

import json

import numpy as np
import pytest

from dormouse.errors import DormouseError
from dormouse.train.stress import StressMonitor

# 30 losses: 1.98, 1.99, 2.00, 2.01, 2.02 six times each, in a scrambled order
AROUND_TWO = [2.0 + 0.01 * ((i * 7) % 5 - 2) for i in range(30)]
# by hand: median 2.00; |x - 2.00| is 0 (6x), 0.01 (12x), 0.02 (12x), so its median is 0.01;
# threshold = 2.00 + 6 * 1.4826 * 0.01 = 2.088956
THRESHOLD = 2.088956


def test_the_spike_rule_by_hand():
    m = StressMonitor()
    assert [m.update(x) for x in AROUND_TWO] == [False] * 30
    assert m.threshold() == pytest.approx(THRESHOLD, abs=1e-12)
    assert m.update(9.0) is True
    # 9.0 is now in the window: the median (16th of 31) and the MAD stay 2.00 and 0.01
    assert m.threshold() == pytest.approx(THRESHOLD, abs=1e-12)
    assert m.update(2.01) is False
    assert m.spikes == 1 and m.updates == 32
    assert m.update(2.0889) is False  # just under 2.088956
    assert m.update(2.0890) is True  # just over
    assert m.spikes == 2


def test_no_spike_before_twenty_losses_and_a_flat_window():
    m = StressMonitor()
    assert [m.update(x) for x in [2.0] * 19] == [False] * 19
    assert m.threshold() is None
    assert m.update(100.0) is False  # only 19 losses before it
    # 20 losses: median 2.0, MAD 0 -> a strict comparison against 2.0 itself
    assert m.threshold() == 2.0
    assert m.update(2.0) is False
    assert m.update(2.0000001) is True
    assert m.spikes == 1


def test_k_scales_the_threshold():
    m = StressMonitor(k=3.0)
    for x in AROUND_TWO:
        m.update(x)
    assert m.threshold() == pytest.approx(2.0 + 3 * 1.4826 * 0.01, abs=1e-12)
    assert m.update(2.05) is True  # over 2.044478, under the k=6 threshold


def test_the_window_keeps_the_last_201_losses():
    m = StressMonitor()
    losses = [float(i) for i in range(250)]
    for x in losses:
        m.update(x)
    assert list(m.window) == losses[-201:]
    assert len(m.window) == 201 and m.updates == 250


def test_p999_is_numpys_linear_percentile():
    m = StressMonitor()
    assert m.p999() is None and m.summary() == "spikes=0 p999=none"
    for x in range(201):
        m.update(float(x))
    assert m.p999() == pytest.approx(199.8, abs=1e-9)  # index 0.999 * 200 = 199.8 between 199 and 200
    rng = np.random.default_rng(0)
    losses = rng.normal(2.0, 0.1, 300)
    m = StressMonitor()
    for x in losses:
        m.update(x)
    assert m.p999() == np.percentile(losses[-201:], 99.9)
    assert m.summary() == f"spikes={m.spikes} p999={np.percentile(losses[-201:], 99.9):.4g}"


def test_summary_format():
    m = StressMonitor()
    for x in AROUND_TWO + [9.0, 2.0, 12.0]:
        m.update(x)
    assert m.spikes == 2
    p = float(np.percentile(AROUND_TWO + [9.0, 2.0, 12.0], 99.9))
    assert p == pytest.approx(11.904, abs=1e-9)  # index 0.999 * 32 = 31.968: 9.0 + 0.968 * (12.0 - 9.0)
    assert m.summary() == "spikes=2 p999=11.9"


def losses_with_spikes(n: int = 300) -> list[float]:
    rng = np.random.default_rng(1)
    out = (2.0 + 0.05 * rng.standard_normal(n)).tolist()
    for i in (40, 149, 150, 220, 290):
        out[i] += 5.0
    return out


def test_a_resumed_monitor_continues_exactly():
    losses = losses_with_spikes()
    a = StressMonitor()
    flags_a = [a.update(x) for x in losses]
    b = StressMonitor()
    flags_b = [b.update(x) for x in losses[:150]]
    saved = json.loads(json.dumps(b.state_dict()))  # through state.json
    c = StressMonitor()
    c.load_state_dict(saved)
    flags_c = [c.update(x) for x in losses[150:]]
    assert flags_b + flags_c == flags_a
    assert c.state_dict() == a.state_dict()
    assert a.spikes == 5 and c.spikes == 5 and sum(flags_c) == 3
    assert c.p999() == a.p999() and c.summary() == a.summary()
    # the predecessor's resume, for contrast: an empty window cannot see the spike at 150 (no history)
    fresh = StressMonitor()
    assert sum(fresh.update(x) for x in losses[150:]) == 2 and fresh.spikes == 2


def test_a_state_with_another_rule_or_shape_is_refused():
    m = StressMonitor()
    for x in AROUND_TWO:
        m.update(x)
    state = m.state_dict()
    with pytest.raises(DormouseError, match="k=6.0, this monitor 3.0"):
        StressMonitor(k=3.0).load_state_dict(state)
    with pytest.raises(DormouseError, match="window_size=201, this monitor 101"):
        StressMonitor(window=101).load_state_dict(state)
    with pytest.raises(DormouseError, match="expected"):
        StressMonitor().load_state_dict({})
    with pytest.raises(DormouseError, match="non-finite loss"):
        m.update(float("nan"))
