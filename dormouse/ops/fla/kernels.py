"""fla's Triton kernels, imported in one place, after their kernel configurations are pinned
(ops/fla/pin.py: `pin_note` sets the files fla reads before fla's first import, and every fla autotuner
is made to read them). Each accessor returns the kernel, or None and why it could not be imported; fla's
re-exporting packages are registered as shells, so only the modules used are imported (`shell_packages`).
"""

import functools
import importlib
import importlib.metadata
import importlib.util
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

from dormouse.ops.fla.pin import pin_note, pin_plain_autotuners

# fla's packages whose __init__ only re-exports: `fla` imports every layer and model (fla.layers,
# fla.models), `fla.ops` every op, `fla.modules` every module. Their submodules import what they use by
# full path, so dormouse's kernels need none of them: skipping them took fla's import from 3.4 s to
# 1.6 s on a CPU (276 modules to 69); `import fla.ops.kda` took 16.8 s on a fresh H200.
SHELLED = ("fla", "fla.ops", "fla.modules")
import_s = 0.0  # seconds this process spent importing fla (the warm start's largest part on the H200)


@functools.cache
def _import(module: str, name: str) -> tuple[Callable | None, str]:
    """`module.name` from fla (the module itself for name ""), imported after the pin is set, or None and
    why it could not be imported."""
    global import_s
    pin_note()
    started = time.monotonic()
    try:
        shell_packages(SHELLED, version_of={"fla": "fla-core"})
        found = importlib.import_module(module)
        found = getattr(found, name) if name else found
    except (ImportError, AttributeError) as err:  # AttributeError: an fla release without that name
        return None, f"{type(err).__name__}: {err}"
    finally:
        import_s += time.monotonic() - started
    pin_plain_autotuners()
    return found, ""


def shell_packages(names: tuple[str, ...], version_of: dict[str, str]) -> None:
    """Register each package in `names` (parents first) as an empty package whose submodules import
    normally, without running its __init__; a package already imported is left as it is. `version_of`
    names the distribution whose version becomes a shell's __version__ (fla.utils reads fla.__version__).
    `complete_packages` runs the skipped __init__s, for code that needs the packages' own names."""
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError(f"No package named {name!r}", name=name)
        shell = importlib.util.module_from_spec(spec)
        shell.__dormouse_shell__ = True
        if name in version_of:
            try:
                shell.__version__ = importlib.metadata.version(version_of[name])
            except importlib.metadata.PackageNotFoundError as err:
                raise ImportError(f"{name}: its distribution {version_of[name]!r} is not installed", name=name) from err
        sys.modules[name] = shell
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, shell)


def complete_packages(names: tuple[str, ...]) -> None:
    """Run the __init__ that `shell_packages` skipped, in each of `names` still a shell: children first,
    since a parent's __init__ imports names from its subpackages (fla's layers: `from fla.modules import`)."""
    for name in reversed(names):
        shell = sys.modules.get(name)
        if getattr(shell, "__dormouse_shell__", False):
            del shell.__dormouse_shell__
            shell.__spec__.loader.exec_module(shell)


@functools.cache
def chunk_kda() -> tuple[Callable | None, str]:
    """fla's chunk_kda, or None and why not. Opaque to torch.compile (see `_opaque`)."""
    return _opaque(*_import("fla.ops.kda", "chunk_kda"))


class ChunkKDAParts(NamedTuple):
    """fla's forward and backward behind `chunk_kda` and the beta sigmoid's kernels (ops/kda/fla.py)."""

    fwd: Callable
    bwd: Callable
    beta_sigmoid_fwd: Callable
    beta_sigmoid_bwd: Callable


@functools.cache
def chunk_kda_parts() -> tuple[ChunkKDAParts | None, str]:
    """fla's `chunk_kda_fwd`, `chunk_kda_bwd`, `fused_beta_sigmoid_fwd` and `fused_beta_sigmoid_bwd` (fla-core
    0.6.0's functions under its `chunk_kda` Function), or None and why not."""
    found = [
        _import("fla.ops.kda.chunk_fwd", "chunk_kda_fwd"),
        _import("fla.ops.kda.chunk_bwd", "chunk_kda_bwd"),
        _import("fla.ops.common.gate", "fused_beta_sigmoid_fwd"),
        _import("fla.ops.common.gate", "fused_beta_sigmoid_bwd"),
    ]
    missing = [why for fn, why in found if fn is None]
    return (None, "; ".join(missing)) if missing else (ChunkKDAParts(*(fn for fn, _ in found)), "")


@functools.cache
def rms_norm() -> tuple[Callable | None, str]:
    """fla's fused RMSNorm (a Triton kernel with its own backward), or None and why not. Opaque to
    torch.compile (see `_opaque`)."""
    return _opaque(*_import("fla.modules.norm.layernorm", "rms_norm"))


@functools.cache
def layer_norm_ops() -> tuple[object | None, str]:
    """fla's layer-norm module (`layer_norm_fwd`, `layer_norm_bwd`: the kernels behind `rms_norm`, with the
    output dtype a parameter), or None and why not."""
    return _import("fla.modules.norm.layernorm", "")


@functools.cache
def rms_norm_gated() -> tuple[Callable | None, str]:
    """fla's RMSNorm times an activation of a gate (`rms_norm_gated(x, g, weight, bias, activation=...)`:
    one Triton kernel each way, fp32 inside), or None and why not. Opaque to torch.compile (see `_opaque`)."""
    return _opaque(*_import("fla.modules.norm.fused_norm_gate", "rms_norm_gated"))


@functools.cache
def swiglu() -> tuple[object | None, str]:
    """fla's activation kernels module (`swiglu_fwd_kernel`, `swiglu_fwdbwd_kernel`, `prepare_input`), or None
    and why not. The model runs dormouse's own SwiGLU kernels (ops/swiglu/triton.py, the same bits);
    benches/swiglu_probe.py times these beside them."""
    return _import("fla.modules.activations.ops", "")


def _opaque(fn: Callable | None, why: str) -> tuple[Callable | None, str]:
    """`fn` behind torch.compiler.disable: under torch.compile the graph breaks around fla's op and calls
    it eagerly, instead of dynamo tracing fla's autograd Function and its autotuned Triton launchers
    (compiled around on the H200 is not yet measured: docs/known-issues.md)."""
    import torch

    return (None if fn is None else torch.compiler.disable(fn)), why


def kda_causal_lm() -> tuple[Callable | None, str]:
    """fla's KDAForCausalLM (fla.models, which needs transformers), or None and why not. Its config
    class is `KDAForCausalLM.config_class` (fla's KDAConfig). fla's models import names from its packages
    (`from fla.modules import ...`), so the packages' skipped __init__s run first."""
    try:
        shell_packages(SHELLED, version_of={"fla": "fla-core"})
        complete_packages(SHELLED)
    except ImportError as err:
        return None, f"{type(err).__name__}: {err}"
    return _import("fla.models", "KDAForCausalLM")
