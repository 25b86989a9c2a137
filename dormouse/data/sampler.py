"""Batches of byte windows.

Training batches are a pure function of (seed, step, split): B window offsets drawn uniformly from
`rng.generator(seed, step, "batch")`, each window T + 1 bytes, inputs its first T, targets its last
T (the next byte of each input). No global RNG is read or advanced, so a resume at step s draws
exactly the batch the uninterrupted run drew. Under data parallelism rank r of W reads rows
`rank_rows(B, r, W)` of that same batch: a pure function of (seed, step, rank, W), and the ranks' rows,
in rank order, are the one-process batch. With `byte_noise` p > 0 each input byte of the batch is
replaced, with probability p, by a random byte, both drawn for the whole [B, T] batch from
`rng.generator(seed, step, "byte_noise")` (so the ranks' rows are still the one-process batch's);
the targets stay the text's bytes. The replacement is uniform over the 256 byte values, or with
`noise_source` "unigram" drawn from the training split's own byte frequencies (Xie et al. 2017's
unigram noising: a replaced byte looks like text, so the context around it must tell).

The held-out eval walks the held-out split in order instead of sampling it: window i has inputs
bytes [i·T, i·T + T) and targets [i·T + 1, i·T + T + 1), so every held-out byte after the first is
scored exactly once. `max_bytes` limits the scored bytes to the fixed prefix: targets are bytes
[1, 1 + max_bytes) of the held-out split. The count of scored bytes does not depend on T.
"""

from collections.abc import Iterator

import numpy as np
import torch

from dormouse import rng
from dormouse.config import BYTE_NOISE_SOURCES
from dormouse.data.shards import Corpus
from dormouse.errors import ConfigError, DataError

HISTOGRAM_CHUNK = 1 << 24  # bytes counted per read of the training split (one pass, at start-up)


class Sampler:
    def __init__(
        self, corpus: Corpus, batch_size: int, seq_len: int, byte_noise: float = 0.0, noise_source: str = "uniform"
    ):
        _check_positive("batch_size", batch_size)
        _check_positive("seq_len", seq_len)
        if not 0.0 <= byte_noise < 1.0:
            raise ConfigError(f"byte_noise must be in [0, 1), got {byte_noise!r}")
        if noise_source not in BYTE_NOISE_SOURCES:
            raise ConfigError(f"noise_source must be one of {list(BYTE_NOISE_SOURCES)}, got {noise_source!r}")
        self.corpus, self.batch_size, self.seq_len = corpus, batch_size, seq_len
        self.byte_noise = byte_noise
        self._check_split("train")  # refuse at start-up, not at the first step
        # unigram: the replacement's cumulative distribution over the 256 byte values
        self.noise_cdf = byte_cdf(corpus) if byte_noise and noise_source == "unigram" else None

    def offsets(self, seed: int, step: int, split: str = "train") -> torch.Tensor:
        """The B window start offsets of batch (seed, step) in `split`, int64."""
        size = self._check_split(split)
        gen = rng.generator(seed, step, "batch")
        return torch.randint(0, size - self.seq_len, (self.batch_size,), generator=gen)

    def batch(
        self, seed: int, step: int, split: str = "train", *, rank: int = 0, world_size: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, targets), int64 [B / world_size, T]: `rank`'s rows of batch (seed, step);
        targets[b, t] is the byte after input_ids[b, t]."""
        rows = rank_rows(self.batch_size, rank, world_size)
        windows = np.empty((len(rows), self.seq_len + 1), np.uint8)
        for row, offset in enumerate(self.offsets(seed, step, split)[rows.start : rows.stop].tolist()):
            windows[row] = self.corpus.read(split, offset, self.seq_len + 1)
        # In numpy: torch's copies here sit in 1.4-5.9 ms idle gaps a step on an H200 (`dormouse bench
        # --profile`'s idle gaps line), most likely its thread pool (ops of >= 32768 elements) waking after the
        # host's wait for the GPU; not measured apart.
        inputs = torch.from_numpy(windows[:, :-1].astype(np.int64))
        targets = torch.from_numpy(windows[:, 1:].astype(np.int64))
        if self.byte_noise:
            inputs = self._noised(inputs, seed, step, rows)
        return inputs, targets

    def _noised(self, inputs: torch.Tensor, seed: int, step: int, rows: range) -> torch.Tensor:
        """`inputs` (rows `rows` of batch (seed, step)) with each byte replaced by a random byte with
        probability byte_noise; the draws are the whole batch's, so they do not depend on the rank. The
        mask is the same draw for either source."""
        gen = rng.generator(seed, step, "byte_noise")
        shape = (self.batch_size, self.seq_len)
        hit = torch.rand(shape, generator=gen)[rows.start : rows.stop] < self.byte_noise
        if self.noise_cdf is None:
            noise = torch.randint(0, 256, shape, generator=gen)
        else:
            noise = inverse_cdf(self.noise_cdf, torch.rand(shape, generator=gen, dtype=torch.float64))
        return torch.where(hit, noise[rows.start : rows.stop], inputs)

    def _check_split(self, split: str) -> int:
        size = self.corpus.split_size(split)
        if size < self.seq_len + 1:
            raise DataError(
                f"the {split} split of corpus {self.corpus.root} has {size} bytes, fewer than "
                f"seq_len + 1 = {self.seq_len + 1}: no training window fits"
            )
        return size


def byte_cdf(corpus: Corpus) -> torch.Tensor:
    """The training split's byte frequencies as a cumulative distribution, float64 [256], last entry 1."""
    size, counts = corpus.split_size("train"), np.zeros(256, np.int64)
    for offset in range(0, size, HISTOGRAM_CHUNK):
        counts += np.bincount(corpus.read("train", offset, min(HISTOGRAM_CHUNK, size - offset)), minlength=256)
    cdf = torch.from_numpy(np.cumsum(counts) / counts.sum())
    cdf[-1] = 1.0  # the division may leave it a rounding below 1: u < 1 always finds a byte
    return cdf


def inverse_cdf(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The byte values, int64, whose cumulative distribution `cdf` first exceeds each u in [0, 1): byte b
    for cdf[b - 1] <= u < cdf[b], so a byte of frequency 0 is never drawn."""
    return torch.searchsorted(cdf, u, right=True)


def rank_rows(batch_size: int, rank: int, world_size: int) -> range:
    """The rows of a batch that `rank` of `world_size` reads: the block [rank·B/W, (rank+1)·B/W).

    Every rank gets B/W rows of T targets, so the mean of the ranks' mean losses is the batch's mean.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    if batch_size % world_size:
        raise ConfigError(
            f"batch_size {batch_size} is not divisible by the world size {world_size} (torchrun --nproc-per-node): "
            "each rank trains batch_size / world_size rows of every batch"
        )
    per_rank = batch_size // world_size
    return range(rank * per_rank, (rank + 1) * per_rank)


def count_heldout_targets(corpus: Corpus, max_bytes: int | None = None) -> int:
    """How many held-out bytes `heldout_windows` scores: min(heldout bytes - 1, max_bytes)."""
    size = corpus.split_size("heldout")
    if size < 2:
        raise DataError(f"the heldout split of corpus {corpus.root} has {size} bytes: nothing to score")
    if max_bytes is None:
        return size - 1
    _check_positive("max_bytes", max_bytes)
    return min(size - 1, max_bytes)


def heldout_windows(
    corpus: Corpus, seq_len: int, batch_size: int, max_bytes: int | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (input_ids, targets) int64 batches walking the held-out split in order, no overlap.

    Full windows come in batches of up to `batch_size` rows of `seq_len`; a final shorter window,
    if any, comes last as its own [1, r] batch (never dropped).
    """
    full, rest = _heldout_walk(corpus, seq_len, batch_size, max_bytes)
    for first in range(0, full, batch_size):
        rows = min(batch_size, full - first)
        yield _shifted(corpus, first * seq_len, rows, seq_len)
    if rest:
        yield _shifted(corpus, full * seq_len, 1, rest)


def heldout_shapes(
    corpus: Corpus, seq_len: int, batch_size: int, max_bytes: int | None = None
) -> list[tuple[int, int]]:
    """The distinct (rows, length) shapes of the batches `heldout_windows` yields, in its order."""
    full, rest = _heldout_walk(corpus, seq_len, batch_size, max_bytes)
    rows = [min(batch_size, full)] + ([full % batch_size] if full > batch_size and full % batch_size else [])
    return [(r, seq_len) for r in rows if r] + ([(1, rest)] if rest else [])


def count_heldout_batches(corpus: Corpus, seq_len: int, batch_size: int, max_bytes: int | None = None) -> int:
    """How many batches `heldout_windows` yields."""
    full, rest = _heldout_walk(corpus, seq_len, batch_size, max_bytes)
    return -(-full // batch_size) + (rest > 0)


def _heldout_walk(corpus: Corpus, seq_len: int, batch_size: int, max_bytes: int | None) -> tuple[int, int]:
    """The held-out walk's full windows of `seq_len` and the length of its shorter last one (0: none)."""
    _check_positive("seq_len", seq_len)
    _check_positive("batch_size", batch_size)
    return divmod(count_heldout_targets(corpus, max_bytes), seq_len)


def _shifted(corpus: Corpus, offset: int, rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` consecutive windows of `length` from one read of rows·length + 1 bytes."""
    data = torch.from_numpy(corpus.read("heldout", offset, rows * length + 1).astype(np.int64))
    return data[:-1].reshape(rows, length), data[1:].reshape(rows, length)


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise DataError(f"{name} must be a positive integer, got {value!r}")
