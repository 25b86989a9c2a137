"""The engram's keys on CUDA equal the CPU's, bit for bit: the key function is exact int64 arithmetic
(model/engram.py), so every device must give the same rows, or a checkpoint trained on one device would
read other rows on another. Skipped without CUDA."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from dormouse import rng  # noqa: E402
from dormouse.model.engram_keys import EngramWindow, engram_keys, engram_keys_step  # noqa: E402

ORDERS, HEADS, ROWS, SEED = (2, 3, 4), 2, 65536, 10007  # the `small` preset's memory (rows), a layer's seed


def test_keys_of_random_bytes_are_the_cpus_on_cuda():
    x = torch.randint(0, 256, (64, 512), generator=rng.generator(0, 0, "test"))
    cpu = engram_keys(x, ORDERS, HEADS, ROWS, SEED)
    cuda = engram_keys(x.cuda(), ORDERS, HEADS, ROWS, SEED)
    assert cuda.device.type == "cuda" and torch.equal(cuda.cpu(), cpu)
    assert 0 <= int(cpu.min()) and int(cpu.max()) < ROWS


def test_decode_keys_step_by_step_are_the_cpus_on_cuda():
    x = torch.randint(0, 256, (4, 40), generator=rng.generator(0, 1, "test"))
    for device in ("cpu", "cuda"):
        window, keys = EngramWindow.empty(4, ORDERS, device), []
        for t in range(x.shape[1]):
            k, window = engram_keys_step(window, x[:, t].to(device), ORDERS, HEADS, ROWS, SEED)
            keys.append(k.cpu())
        if device == "cpu":
            cpu = torch.stack(keys, 1)
        else:
            assert torch.equal(torch.stack(keys, 1), cpu)
    assert torch.equal(cpu, engram_keys(x, ORDERS, HEADS, ROWS, SEED))  # steps = the whole sequence's keys
