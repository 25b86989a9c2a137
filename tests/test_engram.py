import copy
import json
import math
import subprocess
import sys

import pytest
import torch

from dormouse import rng
from dormouse.model import engram as engram_mod
from dormouse.model.engram import (
    PAD,
    Engram,
    EngramWindow,
    engram_keys,
    engram_keys_step,
    global_rows,
    hash_params,
    key_fingerprint,
    table_rows_touched,
)
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
from dormouse.model.engram import engram_keys
x = torch.tensor(json.loads(sys.argv[1]))
print(json.dumps(engram_keys(x, (1, 2, 3, 6), 3, 100003, 11).tolist()))
"""


def test_keys_are_the_same_in_another_process_and_ignore_the_global_rng():
    x = byte_ids(2, 33, seed=4)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(x.tolist())], capture_output=True, text=True, check=True
    )
    engram_mod._hash_params.cache_clear()
    engram_mod._hash_tensors.cache_clear()
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
    m = make(rows=13, d=8).double()
    m.key_norm.weight.copy_(1 + 0.3 * randn(8, seed=1, dtype=F64))
    m.hidden_norm.weight.copy_(1 + 0.3 * randn(8, seed=2, dtype=F64))
    m.table.weight.mul_(50)  # make the gate logits O(1) so σ is tested away from 1/2
    m.w_k.weight.mul_(20)
    x = byte_ids(2, 5, seed=3)
    h = randn(2, 5, 8, seed=4, dtype=F64)
    keys = m.keys(x)
    delta, stats = m(h, keys)
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
    assert stats.arms == 2 * 5 * 6 and int(stats.rows) == table_rows_touched(keys, 13).numel()


def test_gradients_reach_the_looked_up_rows_only_and_every_other_parameter():
    table_grads = {}
    for sparse_grad in (True, False):
        m = make(rows=40, sparse_grad=sparse_grad)
        x = byte_ids(2, 9, seed=5)
        h = randn(2, 9, 8, seed=6).requires_grad_()
        keys = m.keys(x)
        delta, _ = m(h, keys)
        (delta * randn(2, 9, 8, seed=7)).sum().backward()
        grad = m.table.weight.grad
        assert grad.is_sparse == sparse_grad
        dense = grad.to_dense() if sparse_grad else grad
        nonzero = dense.ne(0).any(1).nonzero().squeeze(1)
        assert torch.equal(nonzero, table_rows_touched(keys, 40))
        assert 0 < nonzero.numel() <= 2 * 9 * 6
        for name in ("w_k.weight", "w_v.weight", "key_norm.weight", "hidden_norm.weight"):
            g = m.get_parameter(name).grad
            assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, (sparse_grad, name)
        assert h.grad.abs().sum() > 0  # the gate reads the hidden state
        table_grads[sparse_grad] = dense
    assert torch.equal(table_grads[True], table_grads[False])  # the two gradient layouts agree


def test_a_decode_position_equals_the_full_forward():
    m = make(rows=64, d=8)
    x = byte_ids(3, 7, seed=8)
    h = randn(3, 7, 8, seed=9)
    with torch.no_grad():
        full, full_stats = m(h, m.keys(x))
        window = m.empty_window(3)
        for t in range(7):
            keys, window = m.step_keys(window, x[:, t])
            one, stats = m(h[:, t], keys)
            assert one.shape == (3, 8)
            torch.testing.assert_close(one, full[:, t], rtol=1e-6, atol=1e-7)
            assert stats.arms == 3 * 6 and 0 < int(stats.rows) <= 18
    assert full_stats.arms == 3 * 7 * 6


def test_stats_count_distinct_rows_and_lookups():
    m = make(rows=1000, orders=(1, 2), heads=1)
    x = torch.tensor([list(b"aaaaaa")])
    _, stats = m(torch.zeros(1, 6, 8), m.keys(x))
    # order 1: 'a' six times -> 1 row; order 2: (PAD,a) once and (a,a) five times -> 2 rows.
    assert (int(stats.rows), stats.arms, str(stats)) == (3, 12, "3/12")
    total = stats + stats
    assert str(total) == "6/24"
    _, empty = m(torch.zeros(1, 0, 8), m.keys(torch.zeros(1, 0, dtype=torch.int64)))
    assert str(empty) == "0/0"


def test_keys_must_match_the_module():
    m = make()
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
        assert sorted(groups["adamw_no_decay"]) == ["hidden_norm.weight", "key_norm.weight"]
