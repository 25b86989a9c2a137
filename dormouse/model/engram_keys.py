"""Engram's keys: the hash of the byte n-grams ending at each position into table rows per arm
(`engram_keys`, THE key function), and decode's rolling window over the last bytes (`EngramWindow`).

Hash formula (the contract; tests/test_engram.py recomputes it with a loop over positions)
-------------------------------------------------------------------------------------------
Notation: `x[b, t]` the bytes (int64 in [0, 256)), `PAD = 256` (no byte has it), `N = max(orders)`,
arms `a = i·heads + j` for order `n_a = orders[i]` and head `j` (order-major, head-minor),
`A = len(orders)·heads`.

* Padded history: `x̃[b, s] = x[b, s]` for `s ≥ 0`, `PAD` for `s < 0` (before the sequence started).
* Multipliers: `r = torch.randint(0, HALF, (A, N), dtype=int64, generator=rng.generator(seed, 0,
  "engram_hash"))` drawn on the CPU, `m[a, k] = 2·r[a, k] + 1` (odd), with `M_MAX = (2**63 − 1) // 257`
  and `HALF = M_MAX // 2`, so `m ≤ M_MAX − 1` and `x̃ · m ≤ 256 · M_MAX ≤ 2**63 − 1`: no product
  overflows int64 (the demo's bound with |V'| = 257 symbols: 256 bytes + PAD). Every arm has its
  own multipliers: `heads` independent hash functions per order. Only `m[a, :n_a]` is used.
* Primes: `p_0` = the smallest prime ≥ `rows`, `p_a` = the smallest prime > `p_{a−1}`: distinct per
  (order, head), as in the demo.
* Key of arm `a` at position `t`:

      mix_a(t) = (x̃[t]·m[a,0]) XOR (x̃[t−1]·m[a,1]) XOR … XOR (x̃[t−n_a+1]·m[a,n_a−1])   (≥ 0, exact)
      key_a(t) = (mix_a(t) mod p_a) mod rows                                            ∈ [0, rows)

  The prime modulus folds all 63 bits of `mix` into the key (a power-of-two `rows` alone would keep
  only low bits, and the low bits of `x·m` depend only on the low bits of `x`). Since `p_a ≥ rows`,
  the final `mod rows` folds the `p_a − rows` top residues onto rows `[0, p_a − rows)`, which are
  therefore twice as likely; `p_a − rows` is of the order of `A · ln(rows)`, negligible for real
  table sizes.

The multipliers come from torch's CPU generator: stable across processes and machines for one torch
version. `key_fingerprint` hashes the multipliers and primes; stamp it into a checkpoint to detect a
torch upgrade that changed `randint` (the tables would then be addressed by different keys).

Keys are causal by construction: `key_a(t)` reads `x[t−n_a+1 .. t]` only.
"""

import functools
import hashlib
from dataclasses import dataclass

import torch

from dormouse import rng

PAD = 256  # the pre-sequence filler: outside the byte range, so it never aliases a real n-gram
N_SYMBOLS = 257  # 256 bytes + PAD
M_MAX = (2**63 - 1) // N_SYMBOLS
HALF = M_MAX // 2


# ---- hashing ---------------------------------------------------------------------------------------------


def _is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin; exact for every n < 3.3e24 (these bases)."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in small:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in small:
        y = pow(a, d, n)
        if y in (1, n - 1):
            continue
        for _ in range(s - 1):
            y = y * y % n
            if y == n - 1:
                break
        else:
            return False
    return True


def check_config(orders, heads: int, rows: int, seed: int) -> tuple[int, ...]:
    orders = tuple(int(n) for n in orders)
    if not orders:
        raise ValueError("engram orders must not be empty")
    if min(orders) < 1 or len(set(orders)) != len(orders):
        raise ValueError(f"engram orders must be distinct integers >= 1, got {orders}")
    if heads < 1:
        raise ValueError(f"engram heads must be >= 1, got {heads}")
    if rows < 1:
        raise ValueError(f"engram rows must be >= 1, got {rows}")
    if seed < 0:
        raise ValueError(f"engram seed must be >= 0, got {seed}")
    return orders


def hash_params(orders, heads: int, rows: int, seed: int) -> tuple[tuple, tuple]:
    """(multipliers, primes) of the documented formula as Python ints: `m[a][k]` for k < N, `p[a]`."""
    return _hash_params(check_config(orders, heads, rows, seed), int(heads), int(rows), int(seed))


@functools.lru_cache(maxsize=64)
def _hash_params(orders: tuple[int, ...], heads: int, rows: int, seed: int) -> tuple[tuple, tuple]:
    # Cached per configuration: a pure function, and the draw and the prime search are its only cost.
    arms, n_max = len(orders) * heads, max(orders)
    r = torch.randint(0, HALF, (arms, n_max), dtype=torch.int64, generator=rng.generator(seed, 0, "engram_hash"))
    mult = tuple(tuple(2 * int(v) + 1 for v in row) for row in r.tolist())
    assert all(PAD * m <= 2**63 - 1 for row in mult for m in row)  # the overflow bound, by construction
    primes, p = [], rows
    while len(primes) < arms:
        if _is_prime(p):
            primes.append(p)
        p += 1
    return mult, tuple(primes)


@functools.lru_cache(maxsize=64)
def _hash_tensors(orders: tuple[int, ...], heads: int, rows: int, seed: int, device: torch.device):
    """The multipliers as an int64 tensor [arms, N] with zeros past each arm's order, and primes [arms]."""
    mult, primes = hash_params(orders, heads, rows, seed)
    n_max = max(orders)
    masked = [
        [m if k < orders[a // heads] else 0 for k, m in enumerate(row)]  # x·0 = 0 and v XOR 0 = v
        for a, row in enumerate(mult)
    ]
    m = torch.tensor(masked, dtype=torch.int64).reshape(len(mult), n_max).to(device)
    return m, torch.tensor(primes, dtype=torch.int64).to(device)


def key_fingerprint(orders, heads: int, rows: int, seed: int) -> str:
    """sha256 (hex) of everything the keys depend on besides the bytes: stamp it next to the tables."""
    orders = check_config(orders, heads, rows, seed)
    mult, primes = hash_params(orders, heads, rows, seed)
    text = f"engram-keys-v1 pad={PAD} orders={orders} heads={heads} rows={rows} mult={mult} primes={primes}"
    return hashlib.sha256(text.encode()).hexdigest()


def _keys_from_context(ctx: torch.Tensor, orders, heads: int, rows: int, seed: int) -> torch.Tensor:
    """Keys [B, T, arms] for the last T positions of `ctx` [B, N−1+T] (the first N−1 entries are history).

    The only place the formula is computed: `engram_keys` passes PAD history, decode passes its window.
    """
    n_max = max(orders)
    batch, width = ctx.shape
    t_len = width - (n_max - 1)
    mult, primes = _hash_tensors(orders, heads, rows, seed, ctx.device)
    mix = torch.zeros(batch, t_len, mult.shape[0], dtype=torch.int64, device=ctx.device)
    for k in range(n_max):  # x̃[t − k] for every t, as a view
        back = ctx[:, n_max - 1 - k : n_max - 1 - k + t_len]
        mix.bitwise_xor_(back.unsqueeze(-1) * mult[:, k])
    return torch.remainder(torch.remainder(mix, primes), rows)


def check_byte_dtype(x: torch.Tensor, name: str) -> None:
    """Bytes are int64 everywhere (the model's inputs and targets too); anything else is refused."""
    if x.dtype != torch.int64:
        raise TypeError(f"{name} must be int64 byte values, got {x.dtype}")


def _check_bytes(x: torch.Tensor, name: str) -> None:
    """int64 and in [0, 256): the hash needs real bytes."""
    check_byte_dtype(x, name)
    # One host sync, which a CUDA graph capture cannot hold: a captured step's bytes are the sampler's,
    # bytes by construction (train/graphed.py's look-up passes bytes_checked).
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
    if x.numel() and not capturing and bool(((x < 0) | (x > 255)).any()):
        # A value ≥ 256 would alias PAD (or be hashed as a non-byte): refuse rather than hash it.
        raise ValueError(f"{name} must hold bytes in [0, 256); got values in [{int(x.min())}, {int(x.max())}]")


def engram_keys(
    input_ids: torch.Tensor, orders, heads: int, rows: int, seed: int, *, bytes_checked: bool = False
) -> torch.Tensor:
    """THE key function: input_ids [B, T] int64 bytes -> per-arm row ids [B, T, arms] int64 in [0, rows).

    Arms are ordered order-major, head-minor (`a = orders.index(n)·heads + head`). Each arm has its own
    table slice; `global_rows` adds the offsets. See the module docstring for the exact formula.
    Computed on input_ids' device with exact int64 arithmetic only, so every device gives the same keys
    (tests/gpu/test_engram_keys_cuda.py compares CUDA's with the CPU's; not run on a GPU yet).
    `bytes_checked`: the caller vouches that the values are in [0, 256) (the trainer's batches, bytes by
    construction), so the range check, a host sync on CUDA, is skipped; the dtype is checked still.
    """
    orders = check_config(orders, heads, rows, seed)
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
    if bytes_checked:
        check_byte_dtype(input_ids, "input_ids")
    else:
        _check_bytes(input_ids, "input_ids")
    pad = input_ids.new_full((input_ids.shape[0], max(orders) - 1), PAD)
    return _keys_from_context(torch.cat([pad, input_ids], dim=1), orders, heads, rows, seed)


# ---- decode: the rolling window --------------------------------------------------------------------------


@dataclass(frozen=True)
class EngramWindow:
    """The last `max(orders) − 1` bytes of each batch row, oldest first; PAD where the sequence had not begun."""

    history: torch.Tensor  # [B, max(orders) − 1] int64

    @classmethod
    def empty(cls, batch_size: int, orders, device: torch.device | str = "cpu") -> "EngramWindow":
        """The window at the start of a sequence (all PAD)."""
        return cls(torch.full((batch_size, max(orders) - 1), PAD, dtype=torch.int64, device=device))

    @classmethod
    def from_prefix(cls, input_ids: torch.Tensor, orders) -> "EngramWindow":
        """The window after a prefill of input_ids [B, T] from the start of the sequence."""
        _check_bytes(input_ids, "input_ids")
        n = max(orders) - 1
        pad = input_ids.new_full((input_ids.shape[0], n), PAD)
        return cls(torch.cat([pad, input_ids], dim=1)[:, input_ids.shape[1] :].clone())


def engram_keys_step(
    window: EngramWindow, byte: torch.Tensor, orders, heads: int, rows: int, seed: int
) -> tuple[torch.Tensor, EngramWindow]:
    """One decode position: byte [B] int64 -> (keys [B, arms] for that byte, the advanced window).

    Equal to `engram_keys(whole sequence)[:, t]` at every position t (the same `_keys_from_context`).
    """
    if byte.ndim != 1:
        raise ValueError(f"byte must be [B], got shape {tuple(byte.shape)}")
    keys, window = engram_keys_continue(window, byte.unsqueeze(1), orders, heads, rows, seed)
    return keys[:, 0], window


def engram_keys_continue(
    window: EngramWindow, input_ids: torch.Tensor, orders, heads: int, rows: int, seed: int
) -> tuple[torch.Tensor, EngramWindow]:
    """Keys [B, T, arms] of input_ids [B, T] that continue the sequence whose last bytes `window`
    holds, and the advanced window (a prefill after earlier bytes, or T = 1 in `engram_keys_step`)."""
    orders = check_config(orders, heads, rows, seed)
    _check_bytes(input_ids, "input_ids")
    hist = window.history
    if input_ids.ndim != 2 or hist.shape != (input_ids.shape[0], max(orders) - 1):
        raise ValueError(
            f"engram window is {tuple(hist.shape)}; orders {orders} with input {tuple(input_ids.shape)} need "
            f"{(input_ids.shape[0], max(orders) - 1)}"
        )
    ctx = torch.cat([hist, input_ids], dim=1)
    keys = _keys_from_context(ctx, orders, heads, rows, seed)
    return keys, EngramWindow(ctx[:, ctx.shape[1] - hist.shape[1] :].clone())
