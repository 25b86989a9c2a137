"""The one policy of the ops with a Triton kernel beside a torch path (RMSNorm, the short conv, SwiGLU).

`--norm-backend`, `--conv-backend` and `--swiglu-backend` each take auto, fused or plain: auto is the fused
kernel on CUDA (fla's, or dormouse's own for the conv) and torch elsewhere; a fused path that cannot run
(no CUDA, its kernels not importable) is refused at the op's ledger site, never replaced by the torch one.
"""

import functools
import importlib
from collections.abc import Callable
from types import ModuleType

import torch

from dormouse import ledger

CHOICES = ("auto", "fused", "plain")


def resolve(requested: str, device: torch.device | str, *, flag: str, site: str, kernel: Callable, needs: str) -> str:
    """ "fused" or "plain" for `requested` on `device`. `flag` names the option (`--norm-backend`), `site`
    the ledger site of its refusal, `kernel` the accessor of the op's kernels and `needs` what they need."""
    what = flag.removeprefix("--").replace("-", " ")  # "norm backend"
    if requested not in CHOICES:
        raise ValueError(f"unknown {what} {requested!r}; choose one of {CHOICES}")
    device = torch.device(device)
    if requested == "plain" or (requested == "auto" and device.type != "cuda"):
        return "plain"
    if device.type != "cuda":
        raise ledger.refuse(site, f"{what} 'fused' needs CUDA, got device {device}; pass {flag} plain")
    fn, why = kernel()
    if fn is None:
        raise ledger.refuse(
            site,
            f"{what} {requested!r} on {device} needs {needs}, which is not importable ({why}); "
            f"install the extra `gpu` or pass {flag} plain",
        )
    return "fused"


@functools.cache
def own_kernels(module: str) -> tuple[ModuleType | None, str]:
    """dormouse's own Triton kernel module `module` (model/short_conv_kernels.py, model/norm_kernels.py),
    or None and why not: they import only where Triton is (CUDA machines; the dev set-up, for its tests)."""
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
    the optimizers' and the tables' kernels (train/), so that tests/test_kernels_interpreted.py can run
    their kernel paths on CPU tensors under Triton's interpreter."""
    return t.is_cuda


def rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., H] as [N, H] rows with unit column stride, the layout dormouse's kernels take: a view where
    the leading dims flatten into one stride (a projection's column slices do), else a copy."""
    return x.reshape(-1, x.shape[-1]) if x.stride(-1) == 1 else x.contiguous().view(-1, x.shape[-1])
