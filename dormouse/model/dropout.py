"""Dropout whose masks come from the (seed, step, "dropout") stream, never torch's global RNG.

nanoGPT's places, which model.py applies: the embedded input (memory slots included) and each residual
branch's output, the mixer's and the FFN's, before it is added, in every loop iteration. The engram
memories' outputs have a probability of their own (`engram_dropout`): the tables memorise the training
split (docs/results.md), which the branches' dropout does not reach. Inverted: a kept
entry is scaled by 1 / (1 − p), so eval mode, which never drops, needs no rescale. F.dropout and
nn.Dropout draw from the global RNG, so they are not used.

Stochastic depth (`drop_path`, Huang et al. 2016) drops a residual branch's output for a whole sequence:
one mask entry per row, at the same places but the input's, after the branch's dropout, from the same
stream.
"""

from collections.abc import Callable
from functools import partial

import torch

from dormouse import rng
from dormouse.errors import DormouseError

RANK_STRIDE = 2**40  # rank r of a data-parallel run draws from step + r · 2^40: no real step gets there


def draws_masks(m) -> bool:
    """Whether a training forward of ModelConfig `m` draws masks (dropout, stochastic depth or the engram's
    dropout, which config_checks.validate refuses with the engram off): it needs a dropout generator then."""
    return m.dropout > 0 or m.drop_path > 0 or m.engram_dropout > 0


def step_seed(seed: int, step: int, rank: int = 0) -> int:
    """The masks' seed of training step `step` on data-parallel rank `rank`. One process (and rank 0)
    draws the (seed, step) stream; rank r > 0 the stream of step + r · RANK_STRIDE, so the ranks, which
    train different rows, draw different masks, each a pure function of (seed, step, rank)."""
    return rng.seed_of(seed, step + rank * RANK_STRIDE, "dropout")


def step_generator(seed: int, step: int, rank: int = 0, device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh generator seeded with `step_seed(seed, step, rank)`. A captured step (train/graphed.py)
    reseeds one registered generator with the same seed instead: the same masks, bit for bit."""
    return torch.Generator(device=device).manual_seed(step_seed(seed, step, rank))


def dropout(x: torch.Tensor, p: float, gen: torch.Generator) -> torch.Tensor:
    """x with each entry zeroed with probability p and the rest scaled by 1 / (1 − p); the mask from `gen`."""
    return _masked(x, x.shape, p, gen)


def drop_path(x: torch.Tensor, p: float, gen: torch.Generator) -> torch.Tensor:
    """x with each row (dim 0: a sequence) zeroed with probability p and the rest scaled by 1 / (1 − p)."""
    return _masked(x, (x.shape[0],) + (1,) * (x.dim() - 1), p, gen)


def _masked(x: torch.Tensor, shape: tuple[int, ...], p: float, gen: torch.Generator) -> torch.Tensor:
    """x times a keep-mask of `shape` (broadcast over x) drawn from `gen`, the kept scaled by 1 / (1 − p)."""
    keep = torch.rand(shape, generator=gen, device=x.device, dtype=torch.float32) >= p
    return x * keep / (1 - p)


def keep_all(x: torch.Tensor) -> torch.Tensor:
    return x


def dropout_of(p: float, training: bool, gen: torch.Generator | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """What one forward applies at each dropout place: `keep_all` (nothing drawn) in eval mode or with p
    0; otherwise dropout from `gen`, which a training forward must be given."""
    if not training or p == 0:
        return keep_all
    _check_gen(gen, f"dropout {p}")
    return partial(dropout, p=p, gen=gen)


def branch_drop_of(
    drop: Callable[[torch.Tensor], torch.Tensor], p_path: float, training: bool, gen: torch.Generator | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """What one forward applies to each residual branch's output: `drop` (dropout_of's), then stochastic
    depth with p_path in training mode."""
    if not training or p_path == 0:
        return drop
    _check_gen(gen, f"drop_path {p_path}")
    path = partial(drop_path, p=p_path, gen=gen)
    return path if drop is keep_all else lambda x: path(drop(x))


def _check_gen(gen: torch.Generator | None, what: str) -> None:
    if gen is None:
        raise DormouseError(
            f"{what} is on and the model is in training mode, but this forward got no dropout_gen: pass "
            "dropout.step_generator(seed, step) (masks never come from torch's global RNG), or call model.eval()"
        )
