"""Ctrl-C (SIGINT) and SIGTERM during training, and what the run says when one stops it."""

import signal
import threading
from pathlib import Path


class DeferredInterrupt:
    """Ctrl-C (SIGINT) or SIGTERM (a scheduler's preemption; what torchrun forwards to its workers when it
    is itself stopped) ends the run at the next step boundary, after a checkpoint, never inside
    an update: a state saved between two optimizers' steps would be half-updated. A second signal stops
    at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested = False
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def stopped_note(run: Path, step: int) -> str:
    """What a stop at the step boundary says: the run is checkpointed and resumable."""
    return f"interrupted: stopped after step {step} with a checkpoint; --resume {run} goes on"


def lost_note(run: Path, step: int, saved: int | None) -> str:
    """What a stop at once after `step` updates loses: the steps after `saved`, the last committed
    checkpoint (None: there is none)."""
    if saved is None:
        return f"interrupted again: steps 1-{step} not saved; no checkpoint yet"
    if step <= saved:
        return f"interrupted again: nothing lost; last checkpoint step {saved}; --resume {run} goes on"
    lost = f"step {step}" if step == saved + 1 else f"steps {saved + 1}-{step}"
    return f"interrupted again: {lost} not saved; last checkpoint step {saved}; --resume {run} goes on"
