import contextlib
import copy
import json
import math
import subprocess
import sys

import pytest
import torch

from dormouse import config, rng
from dormouse.data.prepare import prepare
from dormouse.data.shards import load_corpus
from dormouse.evaluation import heldout_score
from dormouse.model import engram_keys as keys_mod
from dormouse.model.engram import Engram, EngramConv, EngramStats, global_rows, table_rows_touched
from dormouse.model.engram_keys import PAD, EngramWindow, engram_keys, engram_keys_step, hash_params, key_fingerprint
from dormouse.model.model import DormouseLM
from dormouse.resolve import resolve
from dormouse.train.routing import route

F64 = torch.float64


def byte_ids(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=rng.generator(seed, 0, "test"), dtype=torch.int64)


def randn(*shape, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=rng.generator(seed, 0, "test"), dtype=dtype)


# ---- the documented hash, written out with Python ints and a loop over positions ----


def naive_is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))


def documented_keys(x: list[list[int]], orders, heads, rows, seed) -> list[list[list[int]]]:
    """The module docstring's formula, independently of the implementation's vectorisation."""
    arms, n_max = len(orders) * heads, max(orders)
    half = ((2**63 - 1) // 257) // 2
    r = torch.randint(0, half, (arms, n_max), dtype=torch.int64, generator=rng.generator(seed, 0, "engram_hash"))
    mult = [[2 * int(v) + 1 for v in row] for row in r.tolist()]
    primes, p = [], rows
    while len(primes) < arms:
        if naive_is_prime(p):
            primes.append(p)
        p += 1
    out = []
    for seq in x:
        rows_b = []
        for t in range(len(seq)):
            keys_t = []
            for i, n in enumerate(orders):
                for j in range(heads):
                    a = i * heads + j
                    mix = 0
                    for k in range(n):
                        byte = seq[t - k] if t - k >= 0 else 256
                        mix ^= byte * mult[a][k]
                    keys_t.append((mix % primes[a]) % rows)
            rows_b.append(keys_t)
        out.append(rows_b)
    return out


def test_keys_equal_the_documented_formula_on_a_tiny_sequence():
    x = [list(b"hello, world"), list(b"\x00\xff\x00abc\n\n\t zz")]
    for orders, heads, rows, seed in [((2, 3), 2, 16, 0), ((1, 2, 4), 3, 1009, 7), ((3,), 1, 1, 2)]:
        got = engram_keys(torch.tensor(x), orders, heads, rows, seed)
        assert got.dtype == torch.int64 and got.shape == (2, len(x[0]), len(orders) * heads)
        assert got.tolist() == documented_keys(x, orders, heads, rows, seed), (orders, heads, rows, seed)


def test_primes_and_keys_are_pinned():
    # Distinct primes per (order, head), the first ≥ rows.
    assert hash_params((2, 3), 2, 16, 0)[1] == (17, 19, 23, 29)
    assert hash_params([2, 3, 4], 1, 1000, 0)[1] == (1009, 1013, 1019)
    # Pinned literal keys: if torch's randint (or anything else) changed the keys, every checkpoint's
    # tables would be addressed by other rows. Stamp key_fingerprint into checkpoints to catch it.
    keys = engram_keys(torch.tensor([list(b"hello")]), (2, 3), 2, 16, 0)
    assert keys.tolist() == [[[0, 3, 3, 3], [14, 6, 5, 7], [13, 0, 5, 12], [6, 2, 5, 0], [5, 15, 9, 3]]]
    fp = key_fingerprint((2, 3), 2, 16, 0)
    assert len(fp) == 64 and fp == key_fingerprint([2, 3], 2, 16, 0) != key_fingerprint((2, 3), 2, 16, 1)


def test_multipliers_are_odd_and_products_cannot_overflow():
    mult, primes = hash_params((2, 3, 4, 5, 6, 7, 8), 4, 1 << 20, 3)
    flat = [m for row in mult for m in row]
    assert len(flat) == 28 * 8 and all(m % 2 == 1 for m in flat)
    assert max(flat) * PAD <= 2**63 - 1
    assert max(flat) > 2**52  # drawn from the whole range, not a float-limited one
    assert len(set(primes)) == 28 and all(p >= 1 << 20 for p in primes)


def test_keys_are_causal():
    x = byte_ids(2, 40)
    orders, heads, rows = (1, 2, 3, 5), 2, 1 << 16
    base = engram_keys(x, orders, heads, rows, 0)
    for t in (0, 1, 7, 20, 38):
        y = x.clone()
        y[:, t + 1 :] = (y[:, t + 1 :] + 1 + byte_ids(2, 39 - t, seed=t) % 255) % 256  # every later byte changes
        other = engram_keys(y, orders, heads, rows, 0)
        assert torch.equal(other[:, : t + 1], base[:, : t + 1]), t
        assert (other[:, t + 1] != base[:, t + 1]).float().mean() > 0.9, t  # the next position does see it


def test_pad_fills_the_start_and_aliases_no_byte():
    orders, heads, rows, seed = (1, 2, 3), 2, 2**31 - 1, 0
    x = torch.tensor([list(b"ab")])
    keys = engram_keys(x, orders, heads, rows, seed)
    # Position 0 of order 3 hashes (PAD, PAD, 'a'); any real byte in place of the pads gives other keys.
    prefixed = torch.tensor([[b, c, *b"ab"] for b in range(256) for c in (0, 255)])
    many = engram_keys(prefixed, orders, heads, rows, seed)
    o3 = slice(4, 6)  # arms of order 3
    assert not (many[:, 2, o3] == keys[0, 0, o3]).all(-1).any()
    assert not (many[:, 3, o3] == keys[0, 1, o3]).all(-1).any()
    # Order 1 ignores the history; order 2 at position 1 does not read the pad.
    assert (many[:, 2, :2] == keys[0, 0, :2]).all() and (many[:, 3, :4] == keys[0, 1, :4]).all()


def test_bytes_outside_the_byte_range_are_refused():
    with pytest.raises(ValueError, match=r"bytes in \[0, 256\)"):
        engram_keys(torch.tensor([[1, 256]]), (2,), 1, 8, 0)
    with pytest.raises(ValueError, match=r"bytes in \[0, 256\)"):
        engram_keys(torch.tensor([[-1]]), (2,), 1, 8, 0)
    with pytest.raises(TypeError, match="int64"):
        engram_keys(torch.tensor([[1]], dtype=torch.int32), (2,), 1, 8, 0)
    with pytest.raises(ValueError, match="distinct"):
        engram_keys(torch.tensor([[1]]), (2, 2), 1, 8, 0)
    with pytest.raises(ValueError, match="orders"):
        engram_keys(torch.tensor([[1]]), (0, 2), 1, 8, 0)


def test_bytes_checked_skips_the_range_check_only():
    # The trainer's batches are bytes by construction; its look-up skips the range check (a host sync on
    # CUDA), never the dtype's.
    x = torch.tensor([[1, 2, 3]])
    assert torch.equal(engram_keys(x, (2,), 1, 8, 0, bytes_checked=True), engram_keys(x, (2,), 1, 8, 0))
    engram_keys(torch.tensor([[1, 256]]), (2,), 1, 8, 0, bytes_checked=True)  # the caller's promise
    with pytest.raises(TypeError, match="int64"):
        engram_keys(torch.tensor([[1]], dtype=torch.int32), (2,), 1, 8, 0, bytes_checked=True)


@pytest.mark.parametrize("rows", [1, 7, 4096, 10**9 + 7])
def test_keys_lie_in_range_and_use_the_rows(rows):
    keys = engram_keys(byte_ids(4, 256), (1, 2, 3, 4), 2, rows, 0)
    assert keys.min() >= 0 and keys.max() < rows
    if rows == 1:
        assert (keys == 0).all()
    if rows == 4096:
        # 1024 n-grams of random bytes (orders 3, 4: all distinct) into 4096 rows: a uniform hash fills
        # 4096·(1 − e^(−1/4)) ≈ 906 rows, sd ≈ 9. A hash that ignored bits would fill far fewer.
        for a in range(4, 8):
            assert len(set(keys[..., a].reshape(-1).tolist())) > 870


def test_different_seeds_give_different_keys():
    x = byte_ids(2, 64)
    a = engram_keys(x, (2, 3), 2, 1 << 20, 0)
    b = engram_keys(x, (2, 3), 2, 1 << 20, 1)
    assert (a != b).float().mean() > 0.99
    # ... and the heads of one order are different hash functions.
    assert (a[..., 0] != a[..., 1]).float().mean() > 0.99


CHILD = """
import json, random, sys
import numpy as np
import torch
torch.manual_seed(987654); random.seed(5); np.random.seed(5); torch.rand(100)
from dormouse.model.engram_keys import engram_keys
x = torch.tensor(json.loads(sys.argv[1]))
print(json.dumps(engram_keys(x, (1, 2, 3, 6), 3, 100003, 11).tolist()))
"""


def test_keys_are_the_same_in_another_process_and_ignore_the_global_rng():
    x = byte_ids(2, 33, seed=4)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(x.tolist())], capture_output=True, text=True, check=True
    )
    keys_mod._hash_params.cache_clear()
    keys_mod._hash_tensors.cache_clear()
    torch.manual_seed(1)
    state = torch.random.get_rng_state()
    here = engram_keys(x, (1, 2, 3, 6), 3, 100003, 11)
    assert torch.equal(torch.random.get_rng_state(), state)  # drew nothing from the global RNG
    assert json.loads(out.stdout) == here.tolist()


def test_step_keys_equal_the_full_keys_at_every_position():
    x = byte_ids(3, 30, seed=2)
    for orders, heads in [((1, 2, 4), 3), ((1,), 2), ((5, 2), 1)]:
        full = engram_keys(x, orders, heads, 5003, 9)
        window = EngramWindow.empty(3, orders)
        assert window.history.shape == (3, max(orders) - 1) and (window.history == PAD).all()
        for t in range(x.shape[1]):
            keys, window = engram_keys_step(window, x[:, t], orders, heads, 5003, 9)
            assert torch.equal(keys, full[:, t]), (orders, t)
        # After a prefill of the first k bytes, stepping the rest continues the same keys.
        for k in (0, 1, 3, 17):
            window = EngramWindow.from_prefix(x[:, :k], orders)
            for t in range(k, x.shape[1]):
                keys, window = engram_keys_step(window, x[:, t], orders, heads, 5003, 9)
                assert torch.equal(keys, full[:, t]), (orders, k, t)
    with pytest.raises(ValueError, match="window"):
        engram_keys_step(EngramWindow.empty(3, (2,)), x[:, 0], (1, 3), 1, 7, 0)


# ---- the module ----


def make(rows=50, orders=(1, 2, 3), heads=2, dim=4, d=8, seed=0, **kw) -> Engram:
    return Engram(
        orders=orders,
        heads=heads,
        rows=rows,
        dim=dim,
        d_model=d,
        seed=seed,
        generator=rng.generator(0, 0, "init"),
        **kw,
    )


def test_global_rows_give_each_arm_its_own_slice():
    keys = torch.tensor([[[0, 4, 9], [3, 3, 3]]])
    assert global_rows(keys, 10).tolist() == [[[0, 14, 29], [3, 13, 23]]]
    assert table_rows_touched(keys, 10).tolist() == [0, 3, 13, 14, 23, 29]
    keys = engram_keys(byte_ids(2, 50), (1, 2), 3, 11, 0)
    g = global_rows(keys, 11)
    for a in range(6):
        assert (g[..., a] >= a * 11).all() and (g[..., a] < (a + 1) * 11).all()


@torch.no_grad()
def test_output_equals_the_float64_formula():
    m = make(rows=13, d=8, conv=False).double()
    m.key_norm.weight.copy_(1 + 0.3 * randn(8, seed=1, dtype=F64))
    m.hidden_norm.weight.copy_(1 + 0.3 * randn(8, seed=2, dtype=F64))
    m.table.weight.mul_(50)  # make the gate logits O(1) so σ is tested away from 1/2
    m.w_k.weight.mul_(20)
    x = byte_ids(2, 5, seed=3)
    h = randn(2, 5, 8, seed=4, dtype=F64)
    keys = m.keys(x)
    delta, stats, tail = m(h, keys)
    assert tail is None  # no conv, nothing to carry
    W, eps, d = m.table.weight, 1e-6, 8
    gates = []
    for b in range(2):
        for t in range(5):
            e = torch.cat([W[a * 13 + int(keys[b, t, a])] for a in range(6)])
            k, v = m.w_k.weight @ e, m.w_v.weight @ e
            kn = k / torch.sqrt((k * k).mean() + eps) * m.key_norm.weight
            hn = h[b, t] / torch.sqrt((h[b, t] ** 2).mean() + eps) * m.hidden_norm.weight
            s = float((kn * hn).sum()) / math.sqrt(d)
            alpha = 1 / (1 + math.exp(-s))
            gates.append(alpha)
            torch.testing.assert_close(delta[b, t], alpha * v, rtol=1e-12, atol=1e-14)
    assert max(gates) - min(gates) > 0.2  # the gate varies: not a constant 1/2
    assert stats.arms == 2 * 5 * 6 and stats.rows == table_rows_touched(keys, 13).numel()


def test_gradients_reach_the_looked_up_rows_only_and_every_other_parameter():
    table_grads = {}
    for sparse_grad in (True, False):
        m = make(rows=40, sparse_grad=sparse_grad)
        x = byte_ids(2, 9, seed=5)
        h = randn(2, 9, 8, seed=6).requires_grad_()
        keys = m.keys(x)
        delta, _, _ = m(h, keys)
        (delta * randn(2, 9, 8, seed=7)).sum().backward()
        grad = m.table.weight.grad
        assert grad.is_sparse == sparse_grad
        dense = grad.to_dense() if sparse_grad else grad
        nonzero = dense.ne(0).any(1).nonzero().squeeze(1)
        assert torch.equal(nonzero, table_rows_touched(keys, 40))
        assert 0 < nonzero.numel() <= 2 * 9 * 6
        for name in ("w_k.weight", "w_v.weight", "key_norm.weight", "hidden_norm.weight", "conv.weight"):
            g = m.get_parameter(name).grad
            assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, (sparse_grad, name)
        assert h.grad.abs().sum() > 0  # the gate reads the hidden state
        table_grads[sparse_grad] = dense
    assert torch.equal(table_grads[True], table_grads[False])  # the two gradient layouts agree


def test_a_decode_position_equals_the_full_forward():
    m = make(rows=64, d=8)
    with torch.no_grad():
        m.conv.weight.mul_(50)  # conv taps of O(1), so a wrong conv tail would show
    x = byte_ids(3, 13, seed=8)
    h = randn(3, 13, 8, seed=9)
    with torch.no_grad():
        full, full_stats, _ = m(h, m.keys(x))
        window, tail = m.empty_window(3), None
        for t in range(13):
            keys, window = m.step_keys(window, x[:, t])
            one, stats, tail = m(h[:, t], keys, tail)
            assert one.shape == (3, 8) and tail.shape == (3, 3 * 3, 8)  # (kernel − 1) · max(orders) values
            torch.testing.assert_close(one, full[:, t], rtol=0, atol=1e-6)
            assert stats.arms == 3 * 6 and 0 < stats.rows <= 18
        fresh, _, _ = m(h[:, 12], keys)  # the last position without its tail: the conv really carries state
        assert (fresh - full[:, 12]).abs().max() > 1e-2
    assert full_stats.arms == 3 * 13 * 6


def test_stats_count_distinct_rows_and_lookups():
    m = make(rows=1000, orders=(1, 2), heads=1)
    x = torch.tensor([list(b"aaaaaa")])
    _, stats, _ = m(torch.zeros(1, 6, 8), m.keys(x))
    # order 1: 'a' six times -> 1 row; order 2: (PAD,a) once and (a,a) five times -> 2 rows.
    assert (stats.rows, stats.arms, str(stats)) == (3, 12, "3/12")
    assert str(stats + stats) == "3/24"  # the same rows read twice are still 3 rows; 24 lookups
    _, other, _ = m(torch.zeros(1, 3, 8), m.keys(torch.tensor([list(b"bab")])))
    # 'b', 'a' (order 1: 'a' seen before), (PAD,b), (b,a), (a,b) (order 2: all new) -> 1 + 3 new rows
    assert str(stats + other) == "7/18"
    _, empty, _ = m(torch.zeros(1, 0, 8), m.keys(torch.zeros(1, 0, dtype=torch.int64)))
    assert str(empty) == "0/0"


def test_stats_unite_rows_over_batches_and_add_memories():
    # Two batches of the memory at layer 0 read rows {1, 2, 3} and {2, 3, 4} (with repeats); the
    # memory at layer 1 has its own table, so its row 2 is another row.
    first = EngramStats({0: torch.tensor([3, 1, 2, 3, 3])}, 5)
    second = EngramStats({0: torch.tensor([4, 2, 2, 3])}, 4)
    other_memory = EngramStats({1: torch.tensor([2, 2])}, 2)
    assert (first.rows, second.rows, other_memory.rows) == (3, 3, 1)
    total = first + second + other_memory
    assert (total.rows, total.arms, str(total)) == (4 + 1, 11, "5/11")  # not 3 + 3 + 1 = 7
    assert torch.equal(total.reads[0], torch.tensor([1, 2, 3, 4]))  # the union is kept, not every read


# ---- the short conv ----


def conv_reference(v, weight, gain, dilation, eps=1e-6):
    """Y_t = v_t + SiLU(Σ_i w_i · RMSNorm(v)_{t − (k−1−i)·dilation}), zero before the start; one t at a time."""
    n = v / torch.sqrt((v * v).mean(-1, keepdim=True) + eps) * gain
    k = weight.shape[-1]
    out = torch.empty_like(v)
    for t in range(v.shape[1]):
        acc = torch.zeros_like(v[:, 0])
        for i in range(k):
            s = t - (k - 1 - i) * dilation
            if s >= 0:
                acc = acc + weight[:, 0, i] * n[:, s]
        out[:, t] = v[:, t] + acc * torch.sigmoid(acc)
    return out


@torch.no_grad()
def test_conv_equals_the_reference_loop_and_continues_from_its_tail():
    conv = EngramConv(6, 4, 3, 1e-6).double()
    conv.weight.copy_(randn(6, 1, 4, seed=11, dtype=F64))
    conv.norm.weight.copy_(1 + 0.3 * randn(6, seed=12, dtype=F64))
    v = randn(2, 17, 6, seed=13, dtype=F64)
    want = conv_reference(v, conv.weight, conv.norm.weight, 3)
    got, tail = conv(v, None)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(tail, v[:, -9:])  # the last (4 − 1) · 3 gated values
    # Two calls (10 positions, then 7 from the tail) equal one call over all 17.
    a, tail = conv(v[:, :10], None)
    b, _ = conv(v[:, 10:], tail)
    torch.testing.assert_close(torch.cat([a, b], 1), want, rtol=1e-12, atol=1e-12)
    empty, same = conv(v[:, :0], tail)  # no positions (a decode prefill of memory slots): the tail is kept
    assert empty.shape == (2, 0, 6) and torch.equal(same, tail)


@torch.no_grad()
def test_conv_output_at_t_reads_t_and_t_minus_multiples_of_the_dilation_only():
    dilation, t_len = 3, 20
    conv = EngramConv(4, 4, dilation, 1e-6).double()
    conv.weight.copy_(randn(4, 1, 4, seed=14, dtype=F64))
    v = randn(1, t_len, 4, seed=15, dtype=F64)
    base, _ = conv(v, None)
    for s in range(t_len):
        moved = v.clone()
        moved[:, s] += 1.0
        out, _ = conv(moved, None)
        changed = {t for t in range(t_len) if not torch.equal(out[:, t], base[:, t])}
        assert changed == {t for t in (s, s + 3, s + 6, s + 9) if t < t_len}, s


def test_the_module_applies_the_conv_to_the_gated_value():
    m = make(rows=31, d=8)
    plain = make(rows=31, d=8, conv=False)
    plain.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("conv.")})
    with torch.no_grad():
        m.conv.weight.mul_(30)
        x, h = byte_ids(2, 11, seed=16), randn(2, 11, 8, seed=17)
        gated, _, _ = plain(h, plain.keys(x))
        delta, _, _ = m(h, m.keys(x))
    assert m.conv.dilation == 3 and m.conv.weight.shape[-1] == 4  # dilation = max(orders) = 3
    want = conv_reference(gated.double(), m.conv.weight.double(), m.conv.norm.weight.double(), 3)
    torch.testing.assert_close(delta.double(), want, rtol=1e-5, atol=1e-6)
    assert (delta - gated).abs().max() > 1e-3


# ---- one memory per insertion layer ----


def test_each_layer_hashes_with_seed_plus_10007_times_the_layer():
    x = byte_ids(2, 20, seed=18)
    at0, at2 = make(seed=5, layer=0), make(seed=5, layer=2)
    assert (at0.hash_seed, at2.hash_seed) == (5, 5 + 2 * 10007)
    assert torch.equal(at0.keys(x), engram_keys(x, (1, 2, 3), 2, 50, 5))
    assert torch.equal(at2.keys(x), engram_keys(x, (1, 2, 3), 2, 50, 20019))
    assert hash_params((1, 2, 3), 2, 50, 20019)[0] != hash_params((1, 2, 3), 2, 50, 5)[0]
    assert (at0.keys(x)[..., 2:] != at2.keys(x)[..., 2:]).float().mean() > 0.9  # orders ≥ 2: other rows
    assert at0.fingerprint() != at2.fingerprint()
    _, stats, _ = at2(randn(2, 20, 8), at2.keys(x))
    assert set(stats.reads) == {2}  # stats name the memory by its layer


def test_keys_must_match_the_module():
    m = make()
    with pytest.raises(ValueError, match="must be >= 0"):
        make(layer=-1)
    with pytest.raises(ValueError, match="6 arms"):
        m(torch.zeros(1, 3, 8), torch.zeros(1, 3, 5, dtype=torch.int64))
    with pytest.raises(TypeError, match="int64"):
        m(torch.zeros(1, 3, 8), torch.zeros(1, 3, 6, dtype=torch.int32))


def test_construction_is_reproducible_and_draws_nothing_from_the_global_rng():
    state = torch.random.get_rng_state()
    a, b = make(), make()
    assert torch.equal(torch.random.get_rng_state(), state)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert 0.015 < a.table.weight.std().item() < 0.025 and 0.015 < a.w_v.weight.std().item() < 0.025


def test_the_table_routes_to_the_sparse_group_even_after_a_copy():
    for model in (make(), copy.deepcopy(make())):
        groups = {g.name: [n for n, _ in g.params] for g in route(model)}
        assert groups["sparse"] == ["table.weight"]
        assert sorted(groups["matrices"]) == ["w_k.weight", "w_v.weight"]
        no_decay = ["conv.norm.weight", "conv.weight", "hidden_norm.weight", "key_norm.weight"]
        assert sorted(groups["adamw_no_decay"]) == no_decay


# ---- the eval line's engram=<rows>/<arms> ----


def test_the_eval_counts_rows_distinct_over_the_whole_pass(tmp_path):
    (tmp_path / "text.txt").write_bytes(b"ab" * 64)
    prepare([tmp_path / "text.txt"], tmp_path / "corpus", heldout_tail=0.5)  # held out: "abab…", 64 bytes
    model_cfg = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, "engram": True}
    engram_cfg = {"engram_orders": "1,2", "engram_heads": 1, "engram_rows": 1009, "engram_layers": "0,1"}
    cfg = resolve(config.build("nano", {"model": {**model_cfg, **engram_cfg}}), cuda_available=False)
    held = heldout_score(
        DormouseLM(cfg.model),
        load_corpus(tmp_path / "corpus"),
        seq_len=8,
        batch_size=1,
        eval_bytes=16,
        device="cpu",
        autocast=contextlib.nullcontext,
    )
    # Two batches, each the window "abababab". Per memory, order 1 reads 'a', 'b' and order 2 reads
    # (PAD,a), (a,b), (b,a): 5 rows, the same 5 in both batches. Two memories (layers 0 and 1), each
    # with its own table: 10 rows over the pass (a sum over batches would say 20). Lookups: 16 scored
    # positions × 2 arms × 2 memories = 64.
    assert held.bytes == 16 and held.engram == "10/64"
