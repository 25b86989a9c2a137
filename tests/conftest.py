"""Fixtures shared by test files."""

import os

import pytest
import torch

# dormouse's Triton kernels run under Triton's interpreter where there is no CUDA
# (tests/test_kernels_interpreted.py). Triton reads the switch when a kernel is defined: set before any
# test imports a kernel module.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from dormouse import rng  # noqa: E402
from dormouse.data.prepare import prepare  # noqa: E402


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread here and in subprocess workers (OMP_NUM_THREADS): on a 2-core machine that another
    process keeps busy, two OpenMP threads run tiny steps ~60x slower (oversubscription)."""
    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(threads)
    if env is None:
        del os.environ["OMP_NUM_THREADS"]
    else:
        os.environ["OMP_NUM_THREADS"] = env


@pytest.fixture(scope="session")
def random_corpus(tmp_path_factory):
    """A factory: `random_corpus(letters, repeats)` prepares `letters` random lowercase bytes (the `test`
    stream of seed 0) written `repeats` times, the last 10% held out, and returns the prepared folder."""

    def make(letters: int, repeats: int = 1):
        root = tmp_path_factory.mktemp("corpus")
        text = bytes(torch.randint(97, 123, (letters,), generator=rng.generator(0, 0, "test")).tolist())
        (root / "text.txt").write_bytes(text * repeats)
        prepare([root / "text.txt"], root / "prepared", heldout_tail=0.1)
        return root / "prepared"

    return make
