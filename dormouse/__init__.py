"""dormouse: a byte-level language-model research trainer on PyTorch."""

import time

__version__ = "0.1.0"
# A run's wall clock (the eval line's wall_s, the first-step line) counts from here, so that start-up,
# compiling and graph capture are inside the time a run reports.
IMPORTED = time.monotonic()
