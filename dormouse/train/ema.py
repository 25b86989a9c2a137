"""Weight averaging (`ema_decay`): what a run's evals score is an exponential moving average of its weights.

The optimizers update the trained weights as always; beside them, one tensor per parameter holds

    average ← d·average + (1 − d)·weights,   d = min(ema_decay, (1 + s) / (10 + s))

after update s (0-based), TF's `num_updates` form, so that the early average is not mostly the initial
weights. Evals swap the average into the model and back (`in_model`), in place: a captured CUDA graph's
parameter addresses stay valid. Each checkpoint saves the average as `ema.safetensors` beside the
trained weights, so a resumed run continues the same average, and `dormouse eval` / `generate` load the
average (`runs.load_model`): the model whose score the run reported.
"""

import contextlib

import torch

from dormouse.errors import CheckpointError

EMA_FILE = "ema"  # the checkpoint stem of the average: ema.safetensors


class WeightAverage:
    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.names = [name for name, _ in model.named_parameters()]
        self.params = [p for _, p in model.named_parameters()]
        self.average = [p.detach().clone() for p in self.params]

    def decay_at(self, step: int) -> float:
        """The decay of update `step` (0-based)."""
        return min(self.decay, (1 + step) / (10 + step))

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Fold in the weights as they stand after update `step`."""
        torch._foreach_lerp_(self.average, [p.detach() for p in self.params], 1.0 - self.decay_at(step))

    @contextlib.contextmanager
    def in_model(self):
        """The average in the model's parameters for the block, the trained weights back after it."""
        with torch.no_grad():
            trained = [p.detach().clone() for p in self.params]
            torch._foreach_copy_([p.detach() for p in self.params], self.average)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_([p.detach() for p in self.params], trained)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.average, strict=True))

    def load_state_dict(self, tensors: dict[str, torch.Tensor] | None) -> None:
        _copy_named_(self.average, self.names, tensors)


def load_average_(model: torch.nn.Module, tensors: dict[str, torch.Tensor] | None) -> None:
    """Put a checkpoint's average into `model`'s parameters (eval and decode score what the run scored)."""
    names, params = zip(*model.named_parameters(), strict=True)
    _copy_named_(list(params), list(names), tensors)


def _copy_named_(dsts: list[torch.Tensor], names: list[str], tensors: dict[str, torch.Tensor] | None) -> None:
    """Copy `tensors[name]` into each of `dsts` (named `names`); refuses a missing file or other names."""
    if tensors is None:
        raise CheckpointError(
            f"the run averages its weights (ema_decay) but the checkpoint has no {EMA_FILE}.safetensors"
        )
    if sorted(tensors) != sorted(names):
        differ = sorted(set(tensors) ^ set(names))
        raise CheckpointError(f"{EMA_FILE}.safetensors holds other parameters than the model's: {differ[:5]}")
    with torch.no_grad():
        for dst, name in zip(dsts, names, strict=True):
            dst.copy_(tensors[name])
