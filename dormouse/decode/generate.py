"""Decoding: prefill the prompt with the full forward, then one byte at a time through `step()`.

Every layer's recurrent state (KDA state and conv tail, or the attention KV cache) and the
persistent memory are carried in the model's cache, so each new byte costs one position, and the
logits equal those of the full forward over the same bytes (tests/test_model.py).
Sampling: temperature 0 is greedy (argmax); otherwise softmax(logits / temperature), restricted to
the `top_k` most likely bytes when top_k > 0, drawn from the `decode` stream of (seed, position).
"""

import time
from dataclasses import dataclass

import torch

from dormouse import rng
from dormouse.errors import DormouseError


@dataclass
class Generation:
    bytes: bytes  # the generated continuation, without the prompt
    seconds: float

    @property
    def bytes_per_s(self) -> float:
        return len(self.bytes) / self.seconds if self.seconds > 0 else float("inf")


def sample(logits: torch.Tensor, temperature: float, top_k: int, gen: torch.Generator) -> torch.Tensor:
    """logits [B, 256] -> bytes [B] int64."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(-1).to(logits.device)


@torch.no_grad()
def generate(model, prompt: bytes, *, max_bytes: int, temperature: float = 1.0, top_k: int = 0, seed: int = 0):
    """Continue `prompt` by `max_bytes` bytes."""
    if not prompt:
        raise DormouseError("the prompt is empty: decoding needs at least one byte to condition on")
    if max_bytes < 1:
        raise DormouseError(f"max_bytes must be >= 1, got {max_bytes}")
    if temperature < 0 or not 0 <= top_k <= 256:
        raise DormouseError(f"temperature must be >= 0 and top_k in [0, 256]; got {temperature}, {top_k}")
    device = next(model.parameters()).device
    started = time.perf_counter()
    ids = torch.tensor([list(prompt)], dtype=torch.int64, device=device)
    out = model(ids, cache=model.new_cache(1, device), return_cache=True)
    logits, cache = out.logits[:, -1], out.cache
    produced = []
    for i in range(max_bytes):
        byte = sample(logits, temperature, top_k, rng.generator(seed, len(prompt) + i, "decode"))
        produced.append(int(byte.item()))
        if i + 1 < max_bytes:
            logits, cache = model.step(byte, cache)
    return Generation(bytes(produced), time.perf_counter() - started)
