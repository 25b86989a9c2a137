"""Kernel-path counters shown on the eval line (`kda=<fused>/<calls>`, `norm=<fused>/<calls>`).

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
