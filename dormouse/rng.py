"""Every random draw in dormouse comes from a generator keyed by (seed, step, purpose).

Library code never touches torch's, numpy's or Python's global RNG: determinism is a property of
this one file. A purpose is a registered name, so two streams cannot collide by a typo.
"""

import hashlib

import torch

PURPOSES = frozenset(
    {
        "batch",  # training batch offsets
        "byte_noise",  # which training input bytes are replaced, and by what (step: the batch's)
        "init",  # parameter initialisation (step is 0)
        "engram_hash",  # engram hash multipliers (step is 0)
        "depth",  # random depth per step
        "jepa_mask",  # JEPA span starts of a training step
        "jepa_eval",  # JEPA span starts of a held-out eval batch (seed 0: the same for every run)
        "dropout",  # dropout masks
        "decode",  # sampling at decode time
        "draft",  # speculative decoding's draft samples (step: the drafted byte's position)
        "bench",  # random byte batches of the bench's baseline models (step: the bench step)
        "test",  # tests only
    }
)


def seed_of(seed: int, step: int, purpose: str) -> int:
    """A 63-bit seed derived from (seed, step, purpose) by sha256: stable across processes and machines."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown RNG purpose {purpose!r}; registered: {sorted(PURPOSES)}")
    if seed < 0 or step < 0:
        raise ValueError(f"seed and step must be >= 0, got seed={seed} step={step}")
    digest = hashlib.sha256(f"dormouse:{seed}:{step}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def generator(seed: int, step: int, purpose: str, device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh torch.Generator for one (seed, step, purpose) stream."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed_of(seed, step, purpose))
    return gen
