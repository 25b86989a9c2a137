"""Which implementation of an op runs: the one place that policy lives.

Every op with a fast path (dormouse/ops/<op>/) registers an `Op` here: the config values it takes, its
fast backend and its torch ones, the accessor of its kernels, its ledger site and its counter. `resolve`
turns a requested value and a device into the backend that runs; `choose` does so and counts the call
on the eval line (counters.py). auto is the fast path on CUDA and torch elsewhere; a fast path asked for
where it cannot run (no CUDA, its kernels not importable) is refused at the op's ledger site, never
replaced by a torch one.

The optimizers' and the tables' kernels (sinkhorn, momentum, row_sum, row_adam) take no config value:
they run on CUDA in fp32 (`on_kernel_device`), and `required` refuses them at their site where Triton
is not importable.
"""

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from dormouse import ledger
from dormouse.counters import CallCounter

CHOICES = ("auto", "fused", "plain")


@dataclass(frozen=True)
class Op:
    """An op's backends: `choices` (what the config takes), `fast` (what auto runs on CUDA), `plain` (the
    torch backends, the first auto's choice elsewhere), `kernels` (the fast path's accessor: (kernel,
    "") or (None, why not), looked up per call), `needs` (what the kernels need, for the refusal), the
    ledger `site` of that refusal and the `counter` that counts each call (fused/calls)."""

    name: str
    flag: str
    site: str
    kernels: Callable[[], tuple[object | None, str]]
    needs: str
    counter: CallCounter
    choices: tuple[str, ...] = CHOICES
    fast: str = "fused"
    plain: tuple[str, ...] = ("plain",)


OPS: dict[str, Op] = {}


def register(op: Op) -> Op:
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} registered twice")
    OPS[op.name] = op
    return op


def resolve(name: str, requested: str, device: torch.device | str) -> str:
    """The backend op `name` runs for `requested` on `device` (one of its choices less auto)."""
    check_choice(name, requested)
    op = OPS[name]
    what = _what(op)
    if requested in op.plain:
        return requested
    device = torch.device(device)
    if device.type != "cuda":
        if requested == "auto":
            return op.plain[0]
        message = f"{what} {requested!r} needs CUDA, got device {device}; pass {op.flag} {op.plain[0]}"
        raise ledger.refuse(op.site, message)
    fn, why = op.kernels()
    if fn is None:
        raise ledger.refuse(
            op.site,
            f"{what} {requested!r} on {device} needs {op.needs}, which is not importable ({why}); "
            f"install the extra `gpu` (pip install -e '.[gpu]') or pass {op.flag} {op.plain[0]}",
        )
    return op.fast


def choose(name: str, requested: str, device: torch.device | str) -> str:
    """`resolve`, the call counted in the op's counter."""
    backend = resolve(name, requested, device)
    record(name, backend == OPS[name].fast)
    return backend


def record(name: str, fused: bool) -> None:
    """Count one call of op `name` (fused or not) on the eval line."""
    OPS[name].counter.record(fused=fused)


def check_choice(name: str, requested: str) -> None:
    """Refuse a value op `name` does not take (before it is set on a module)."""
    op = OPS[name]
    if requested not in op.choices:
        raise ValueError(f"unknown {_what(op)} {requested!r}; choose one of {op.choices}")


def _what(op: Op) -> str:
    return op.flag.removeprefix("--").replace("-", " ")  # "norm backend"


@functools.cache
def own_kernels(module: str) -> tuple[ModuleType | None, str]:
    """dormouse's own Triton kernel module `module` (dormouse.ops.<op>.triton), or None and why not: they
    import only where Triton is (CUDA machines; the dev set-up, for its tests)."""
    try:
        return importlib.import_module(module), ""
    except ImportError as err:  # no Triton: the CPU set-up without the dev extra
        return None, f"{type(err).__name__}: {err}"


def required(found: tuple[ModuleType | None, str], site: str, what: str, hint: str = "") -> ModuleType:
    """The kernels of an `own_kernels` lookup `found` ((module, why not)), or refused at ledger `site`:
    "`what` needs Triton (why)`hint`"."""
    kernels, why = found
    if kernels is None:
        raise ledger.refuse(site, f"{what} needs Triton ({why}){hint}")
    return kernels


def on_kernel_device(t: torch.Tensor) -> bool:
    """Whether dormouse's own Triton kernels take `t` where its op has them: on CUDA. The one test of it for
    the optimizers' and the tables' kernels, so that tests/test_kernels_interpreted.py can run their
    kernel paths on CPU tensors under Triton's interpreter."""
    return t.is_cuda


def rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., H] as [N, H] rows with unit column stride, the layout dormouse's kernels take: a view where
    the leading dims flatten into one stride (a projection's column slices do), else a copy."""
    return x.reshape(-1, x.shape[-1]) if x.stride(-1) == 1 else x.contiguous().view(-1, x.shape[-1])
