"""Fixtures shared by test files."""

import os

import pytest
import torch


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
