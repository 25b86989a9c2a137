"""StressMonitor: loss-spike statistics over a rolling window of training losses.

The rule. Let W be the window of the last `window` (201) losses seen BEFORE the current one. If W holds
fewer than `min_history` (20) losses, nothing is a spike. Otherwise, with

    med = median(W),    mad = 1.4826 * median(|W - med|)

(the median absolute deviation, scaled so that it estimates the standard deviation of a normal sample),
the loss is a spike when  loss > med + k * mad  (k = 6). The comparison is strict, so a window of
identical losses (mad = 0) makes every larger loss a spike. The loss then enters the window whether or
not it was a spike, and the oldest loss leaves once the window is full.

`p999()` is the 99.9th percentile of the window (numpy's default linear interpolation). The window,
the spike count and the parameters are the whole state: `state_dict()` is plain JSON and a monitor
restored from it continues exactly as the uninterrupted one (a resume does not restart the window,
the count or p99.9 empty).
"""

import math
from collections import deque

import numpy as np

from dormouse.errors import DormouseError

MAD_TO_SIGMA = 1.4826


class StressMonitor:
    def __init__(self, window: int = 201, k: float = 6.0, min_history: int = 20):
        if window < 1 or min_history < 1 or not math.isfinite(k) or k <= 0:
            raise DormouseError(
                f"StressMonitor needs window >= 1, min_history >= 1, k > 0; got {window}, {min_history}, {k}"
            )
        self.window_size, self.k, self.min_history = window, float(k), min_history
        self.window: deque[float] = deque(maxlen=window)
        self.spikes = 0  # since the start of the run, across resumes
        self.updates = 0

    def threshold(self) -> float | None:
        """The value a loss must exceed to be a spike now, or None while the window is too short."""
        if len(self.window) < self.min_history:
            return None
        w = np.fromiter(self.window, np.float64, len(self.window))
        med = float(np.median(w))
        mad = MAD_TO_SIGMA * float(np.median(np.abs(w - med)))
        return med + self.k * mad

    def update(self, loss: float) -> bool:
        """Record one training loss; return whether it is a spike against the window before it."""
        loss = float(loss)
        if not math.isfinite(loss):
            raise DormouseError(f"training loss {loss} at update {self.updates}: a non-finite loss is not a statistic")
        limit = self.threshold()
        spike = limit is not None and loss > limit
        self.spikes += spike
        self.updates += 1
        self.window.append(loss)
        return spike

    def p999(self) -> float | None:
        """99.9th percentile of the window (linear interpolation), None while it is empty."""
        if not self.window:
            return None
        return float(np.percentile(np.fromiter(self.window, np.float64, len(self.window)), 99.9))

    def summary(self) -> str:
        """The eval line's fields, e.g. `spikes=3 p999=2.41`."""
        p = self.p999()
        return f"spikes={self.spikes} p999={'none' if p is None else f'{p:.4g}'}"

    def state_dict(self) -> dict:
        return {
            "window_size": self.window_size,
            "k": self.k,
            "min_history": self.min_history,
            "window": list(self.window),
            "spikes": self.spikes,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a saved state. Parameters that differ from this monitor's are refused, not adopted."""
        keys = {"window_size", "k", "min_history", "window", "spikes", "updates"}
        if set(state) != keys:
            raise DormouseError(f"StressMonitor state has keys {sorted(state)}, expected {sorted(keys)}")
        for key in ("window_size", "k", "min_history"):
            if state[key] != getattr(self, key):
                raise DormouseError(
                    f"StressMonitor state has {key}={state[key]!r}, this monitor {getattr(self, key)!r}: "
                    "a resumed run keeps its spike rule"
                )
        window = [float(x) for x in state["window"]]
        if len(window) > self.window_size or not all(map(math.isfinite, window)):
            raise DormouseError(f"StressMonitor state window has {len(window)} entries or a non-finite one")
        if not (0 <= state["spikes"] <= state["updates"]) or len(window) > state["updates"]:
            raise DormouseError(
                f"StressMonitor state is inconsistent: spikes={state['spikes']}, updates={state['updates']}, "
                f"window={len(window)}"
            )
        self.window = deque(window, maxlen=self.window_size)
        self.spikes, self.updates = int(state["spikes"]), int(state["updates"])
