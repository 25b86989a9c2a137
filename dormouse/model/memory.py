"""Persistent memory: learned slots that every sequence sees first.

`persistent_memory` (docs/glossary.md):
- `disabled`: no slots (`memory_slots` must be 0).
- `enabled`: `memory_slots` learned vectors are prepended to the embedded sequence before the looped
  block, in training, eval and decode (decode runs them through the block when its cache is made).
  Their outputs are dropped before the LM head: they are never scored. A forward that asks to skip
  them (`use_memory=False`) runs, and is counted on the eval line (ledger `memory.skipped`).
- `size-match`: as `enabled`, with the slot count rounded up by `resolve()` so that slots + seq_len
  fill whole KDA chunks (no padded chunk in training).
- `enforced`: as `enabled`, but a forward that would skip the slots raises (ledger `memory.enforced`).
"""

import torch
from torch import nn

from dormouse import ledger
from dormouse.model.init import normal_init_

SKIPPED = ledger.register(
    "memory.skipped",
    ledger.Kind.COUNTED,
    "a forward with use_memory=False ran without the persistent memory slots",
    __name__,
)
ENFORCED = ledger.register(
    "memory.enforced",
    ledger.Kind.LOUD,
    "persistent_memory=enforced and a forward asked to run without the memory slots",
    __name__,
)


class PersistentMemory(nn.Module):
    def __init__(self, n_slots: int, d_model: int, mode: str, *, generator: torch.Generator):
        super().__init__()
        self.mode = mode
        self.slots = nn.Parameter(torch.empty(n_slots, d_model))
        self._dormouse_route = {"slots": "adamw_decay"}  # an embedding table of its own
        self.reset_parameters(generator)

    def reset_parameters(self, gen: torch.Generator) -> None:
        normal_init_(self.slots, gen)

    @property
    def n_slots(self) -> int:
        return self.slots.shape[0]

    def prepend(self, x: torch.Tensor, use_memory: bool) -> torch.Tensor:
        """[B, T, d] -> [B, slots + T, d]; or x itself when skipping is allowed and asked for."""
        if use_memory:
            return torch.cat([self.slots.to(x.dtype).expand(x.shape[0], -1, -1), x], dim=1)
        if self.mode == "enforced":
            raise ledger.refuse(ENFORCED, "persistent_memory is enforced: this path would drop the memory slots")
        ledger.count(SKIPPED)
        return x
