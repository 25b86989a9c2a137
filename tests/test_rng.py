"""The keyed streams of dormouse/rng.py. That no code draws from torch's, numpy's or Python's global stream is
held by a whole run: tests/test_trainer.py::test_a_run_with_every_random_arm_draws_nothing_from_the_global_rngs."""

import subprocess
import sys

import pytest
import torch

from dormouse import rng


def test_same_key_same_stream_and_keys_differ():
    a = torch.rand(5, generator=rng.generator(3, 7, "batch"))
    b = torch.rand(5, generator=rng.generator(3, 7, "batch"))
    assert torch.equal(a, b)
    for other in [(4, 7, "batch"), (3, 8, "batch"), (3, 7, "init")]:
        assert not torch.equal(a, torch.rand(5, generator=rng.generator(*other)))


def test_seed_is_stable_across_processes():
    # sha256-derived, not Python's salted hash(): a fresh interpreter computes the same seed.
    code = "from dormouse import rng; print(rng.seed_of(1, 2, 'batch'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == rng.seed_of(1, 2, "batch")


def test_pinned_value():
    # A change to the derivation would silently change every run's data order: pin one value.
    assert rng.seed_of(0, 0, "batch") == int.from_bytes(
        __import__("hashlib").sha256(b"dormouse:0:0:batch").digest()[:8], "little"
    ) & (2**63 - 1)


def test_unknown_purpose_and_negative_refused():
    with pytest.raises(ValueError, match="unknown RNG purpose 'bacth'"):
        rng.generator(0, 0, "bacth")
    with pytest.raises(ValueError, match="step must be >= 0"):
        rng.generator(0, -1, "batch")
