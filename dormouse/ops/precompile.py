"""A cold start's Triton kernels compiled side by side, before the step that launches them.

From an empty Triton cache a process compiles each Triton kernel (fla's KDA, the fused norm, conv and
SwiGLU) when a step first launches it, one after another: most of a cold first step. `compile_ahead`
runs a dry pass (a training forward and backward, the eval's forwards) with every launch that would
compile recorded and skipped instead, so no kernel runs and the pass's values are meaningless; then it
compiles what it recorded on a pool of threads (Triton's passes release the GIL and ptxas is a process
of its own) into this process and Triton's disk cache. The real first step finds every kernel compiled.

An autotuned kernel with no stored choice for its key would be timed on launches that do nothing: the
dry pass stops there, and the step compiles and times its kernels as it goes (ledger
`precompile.skipped`). The dry pass itself puts back whatever it moved (Trainer.dry_pass).
"""

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from dormouse import ledger

SKIPPED = ledger.register(
    "precompile.skipped",
    ledger.Kind.COUNTED,
    "a Triton kernel of the dry pass has no stored autotuning choice for its key (or this Triton is too old "
    "to have jit_cache_hook, or the run is a torchrun job of several processes): the run's kernels compile "
    "one after another as the first step launches them, not side by side ahead of it",
    __name__,
)


class _WouldAutotune(Exception):
    """The dry pass reached an autotuned kernel with no choice for its key (Triton would time it)."""


def compile_ahead(dry_pass: Callable[[], None], threads: int | None = None) -> str:
    """Run `dry_pass` with Triton's compiling launches recorded and skipped, then compile the recorded
    kernels on `threads` threads (default: one per CPU). Returns the line for the run's log."""
    from triton import knobs
    from triton.runtime.autotuner import Autotuner

    if not hasattr(knobs.runtime, "jit_cache_hook"):  # Triton before 3.5
        return skipped("this Triton has no jit_cache_hook")
    from triton.runtime._async_compile import AsyncCompileMode

    started = time.monotonic()
    recorded: dict[str, object] = {}  # specialization data (JSON) -> its JITFunction; a kernel once

    def record(*, fn, compile, **_) -> bool:
        recorded[compile["specialization_data"]] = fn.jit_function
        return True  # Triton skips the compile, and then the launch

    def would_time(self, *args, **kwargs):
        raise _WouldAutotune(getattr(self.base_fn, "__name__", "a kernel"))

    hook, bench = knobs.runtime.jit_cache_hook, Autotuner._bench
    knobs.runtime.jit_cache_hook, Autotuner._bench = record, would_time
    untimed = None
    try:
        dry_pass()
    except _WouldAutotune as e:
        untimed = str(e)
    finally:
        knobs.runtime.jit_cache_hook, Autotuner._bench = hook, bench
    if untimed is not None:
        return skipped(f"{untimed} has no stored kernel choice for its key")
    threads = max(1, min(len(recorded), threads or os.cpu_count() or 1))
    with ThreadPoolExecutor(threads) as pool, AsyncCompileMode(pool):
        for data, kernel in recorded.items():
            kernel.preload(data)
    took = time.monotonic() - started
    return f"precompile: {len(recorded)} Triton kernels compiled on {threads} threads in {took:.1f} s"


def skipped(why: str) -> str:
    """Count the skip on the ledger; the line for the run's log."""
    ledger.count(SKIPPED)
    return f"precompile: skipped, {why}: the first step compiles and times its kernels one by one [ledger: {SKIPPED}]"
