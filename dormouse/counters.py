"""Kernel-path counters shown on the eval line (`kda=<fused>/<calls>`, `norm=…`, `conv=…`,
`swiglu=…`).

Every call of a dispatched op records whether the fused path ran, so nobody can believe a kernel
runs when it does not. The trainer prints and resets them at each eval.
"""

from dataclasses import dataclass


@dataclass
class CallCounter:
    fused: int = 0
    calls: int = 0

    def record(self, fused: bool) -> None:
        self.calls += 1
        self.fused += int(fused)

    def reset(self) -> None:
        self.fused = self.calls = 0

    def __str__(self) -> str:
        return f"{self.fused}/{self.calls}"


KDA = CallCounter()
NORM = CallCounter()
CONV = CallCounter()
SWIGLU = CallCounter()
ALL = {"kda": KDA, "norm": NORM, "conv": CONV, "swiglu": SWIGLU}  # in eval-line order


def reset_all() -> None:
    for counter in ALL.values():
        counter.reset()


def line() -> str:
    """`kda=<fused>/<calls> norm=… conv=… swiglu=…`: what the bench's kernels column holds."""
    return " ".join(f"{name}={counter}" for name, counter in ALL.items())


def snapshot() -> dict[str, tuple[int, int]]:
    """Every counter's (fused, calls) now."""
    return {name: (c.fused, c.calls) for name, c in ALL.items()}


def restore(counts: dict[str, tuple[int, int]]) -> None:
    """Set every counter back to a `snapshot`."""
    for name, (fused, calls) in counts.items():
        ALL[name].fused, ALL[name].calls = fused, calls


def add(counts: dict[str, tuple[int, int]]) -> None:
    """Add (fused, calls) per counter: what a replayed CUDA graph's captured step counted."""
    for name, (fused, calls) in counts.items():
        ALL[name].fused += fused
        ALL[name].calls += calls
