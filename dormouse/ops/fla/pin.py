"""fla's kernel configurations, pinned: which files of kernel choices fla reads on this card, set before
fla is first imported (ops/fla/kernels.py imports fla only after `pin_note`).

fla's kernels autotune: on first use of a shape, Triton times every candidate configuration and keeps
the fastest. A choice made by a timing race can differ between runs and machines, and different block
sizes sum in a different order, so losses would differ too. fla can read kernel choices from JSON
files instead (fla/ops/utils/cache.py: `FLA_CONFIG_DIR`, `FLA_CACHE_MODE`); dormouse commits those
files under `dormouse/ops/fla/configs/<GPU>/` and points fla at them before fla is first imported.
fla reads the card's user cache (~/.cache/dormouse/kernels/<GPU>/, `kernel_source`) with a pin merged in
first: the card's own, else one of a card of the same compute capability. A card's own pin is filled where
it lacks a kernel, dtype or key structure from the pin of a card of its capability (`fill_from_kin`), so
that a path its own runs never timed (an fp32 run, a test's shapes) does not autotune for minutes. The
choices Triton makes on that card for kernels the files lack are kept there at exit (`store_new_choices`):
timed once a machine.

A (kernel, key) the files do not cover is still autotuned by Triton (or read from Triton's own disk
cache). fla's fuzzy mode keeps new shapes of a known kernel pinned (see `_apply`). Anything else is
a path other than the pinned one, so `count_unpinned()` counts each such choice once on the ledger
site `fla.unpinned` (shown on the eval line as `fallbacks=`). `dump_choices()` writes the choices a
process made in fla's file format; with DORMOUSE_FLA_DUMP=<folder> set, every process that imports
fla (through ops/fla/kernels.py) writes them there at exit (benches/gpu_call.sh sets it).
"""

import atexit
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from dormouse import ledger
from dormouse.errors import DormouseError

UNPINNED = ledger.register(
    "fla.unpinned",
    ledger.Kind.COUNTED,
    "an fla kernel configuration was chosen by Triton (autotune timing or its disk cache) because the "
    "kernel choices fla reads (the committed pin, or this card's user cache) have no entry for that kernel and key",
    __name__,
)
BORROWED = ledger.register(
    "fla.borrowed_pin",
    ledger.Kind.COUNTED,
    "this card has no committed fla kernel pin: fla reads the pin of another card of the same compute "
    "capability (choices timed on that card), merged into this card's user cache",
    __name__,
)
BORROWED_ENTRY = ledger.register(
    "fla.borrowed_entry",
    ledger.Kind.COUNTED,
    "an fla kernel configuration came from the pin of another card of the same compute capability: this "
    "card's pin has no entry of that kernel, dtypes and key structure (`fill_from_kin`)",
    __name__,
)
CONFIG_ROOT = Path(__file__).with_name("configs")
# The compute capability of each committed pin's card (a folder of CONFIG_ROOT): a card without a pin of
# its own borrows one of its capability (`kernel_source`). tests/test_fla_pin.py keeps this and the folders equal.
PIN_CAPABILITY: dict[str, tuple[int, int]] = {"NVIDIA_H100_80GB_HBM3": (9, 0), "NVIDIA_H200": (9, 0)}
DUMP_ENV = "DORMOUSE_FLA_DUMP"
UNPINNED_FILE = "unpinned.json"  # beside the dumped choices: merge_fla_pin.py skips it
# (kernel, repr(key)) -> (key, the config Triton chose, the pinned entry fla's lookup found or None)
_counted: dict[tuple[str, str], tuple] = {}
BORROWED_FIELD = "borrowed_from"  # marks an entry `fill_from_kin` put in a user cache: the pin it came from
_borrowed: dict[str, set[str]] = {}  # kernel -> key classes (`key_class`) of the entries marked so
_counted_borrowed: set[tuple[str, str]] = set()  # (kernel, repr(key)) counted on BORROWED_ENTRY
_stored: set[tuple[str, str]] = set()  # (kernel, key hash) this process added to the user cache
_note: str | None = None  # pin_note's, once set
_source = None  # the KernelSource pin_note applied


def gpu_dir_name(device_name: str) -> str:
    """fla's folder name for a GPU (fla.ops.utils.cache.sanitize_gpu_name): 'NVIDIA H200' -> 'NVIDIA_H200'."""
    out = "".join(c if c.isalnum() else "_" for c in device_name)
    while "__" in out:
        out = out.replace("__", "_")
    return out.strip("_") or "unknown_gpu"


class KernelSource(NamedTuple):
    """Where fla reads its kernel choices on this card (`kernel_source`), and where new ones are kept."""

    rule: str  # user (FLA_* set by the user), none (no CUDA), pin, borrowed, cache, autotune
    read: Path | None  # fla's FLA_CONFIG_DIR; None: left to the user, or nothing to read
    store: Path | None  # the user cache: choices fla's lookup did not make are added here at exit
    pin: Path | None  # rules pin and borrowed: the committed pin merged into `store` before fla reads it
    note: str  # one line for the run header
    fill: Path | None = None  # rule pin: the pin of the same capability that fills what `pin` lacks


def user_cache_dir(card: str, env) -> Path:
    """This card's folder of kernel choices: $XDG_CACHE_HOME (absolute, else ~/.cache)/dormouse/kernels/<GPU>."""
    xdg = env.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if Path(xdg).is_absolute() else Path(env.get("HOME") or Path.home()) / ".cache"
    return base / "dormouse" / "kernels" / gpu_dir_name(card)


def has_choices(folder: Path) -> bool:
    return any(p.name != UNPINNED_FILE for p in folder.glob("*.json"))


def nearest_pin(card: str, capability: tuple[int, int], pins: dict[str, tuple[int, int]]) -> str | None:
    """The committed pin of the same compute capability whose card name shares the longest start with
    `card`'s (an H100 PCIe takes an H100 SXM's pin before an H200's), ties by name; None: no such pin."""
    name = gpu_dir_name(card)
    same = [pin for pin, cc in pins.items() if tuple(cc) == tuple(capability)]
    return min(same, key=lambda pin: (-len(os.path.commonprefix([pin, name])), pin), default=None)


def kernel_source(
    card: str | None,
    capability: tuple[int, int] | None,
    env,
    pins: dict[str, tuple[int, int]] = PIN_CAPABILITY,
    cached: Callable[[Path], bool] = has_choices,
) -> KernelSource:
    """Where fla's kernel choices come from on card `card` (torch's device name) of compute `capability`,
    in order: FLA_CONFIG_DIR or FLA_CACHE_MODE set by the user in `env`; the committed pin of this card,
    through the user cache (a kernel or dtype the pin lacks is timed once and kept there); a committed
    pin of the same capability (`nearest_pin`), the same way; the user cache, if it holds choices
    (`cached`); else the user cache, empty: Triton times every kernel once."""
    if "FLA_CACHE_MODE" in env or "FLA_CONFIG_DIR" in env:
        mode, folder = env.get("FLA_CACHE_MODE", "-"), env.get("FLA_CONFIG_DIR", "-")
        return KernelSource(
            "user",
            None,
            None,
            None,
            f"fla kernel configs: FLA_CACHE_MODE={mode} FLA_CONFIG_DIR={folder} (set by the user)",
        )
    if card is None:
        return KernelSource("none", None, None, None, "fla kernel configs: no CUDA device, none read")
    name, cc = gpu_dir_name(card), ".".join(map(str, capability))
    cache = user_cache_dir(card, env)
    if name in pins:
        pin = CONFIG_ROOT / name
        note = f"fla kernel configs: pinned from {pin} through {cache}, which keeps what this card times beyond the pin"
        kin = nearest_pin(card, capability, {p: c for p, c in pins.items() if p != name})
        if kin is None:
            return KernelSource("pin", cache, cache, pin, note)
        note += f"; what the pin lacks comes from {kin}'s (same compute capability {cc}) [ledger: {BORROWED_ENTRY}]"
        return KernelSource("pin", cache, cache, pin, note, CONFIG_ROOT / kin)
    kin = nearest_pin(card, capability, pins)
    if kin is not None:
        note = (
            f"fla kernel configs: no pin for {card}; borrowed from {kin} (same compute capability {cc}) through "
            f"{cache}, which keeps this card's own choices [ledger: {BORROWED}]"
        )
        return KernelSource("borrowed", cache, cache, CONFIG_ROOT / kin, note)
    if cached(cache):
        note = (
            f"fla kernel configs: this card's own, from {cache} (no committed pin for {card}, compute capability {cc})"
        )
        return KernelSource("cache", cache, cache, None, note)
    note = (
        f"fla kernel configs: none yet for {card} (compute capability {cc}), no committed pin and nothing in "
        f"{cache}: Triton times each fla kernel on its first use, which may take minutes (5 to 10 for a "
        f"first training step and eval); the choices are written to {cache} at exit, so later runs on this "
        "card skip it (`dormouse tune` does this ahead of time)"
    )
    return KernelSource("autotune", cache, cache, None, note)


def _apply(source: KernelSource, env, at_exit: Callable) -> str:
    """Point fla at `source` through `env` (before fla's import: fla reads FLA_CACHE_MODE then) and keep
    the choices it does not make in its user cache at exit; returns the header's note."""
    if source.pin is not None:
        merge_pin(source.pin, source.store)
    if source.fill is not None:
        _borrowed.clear()
        _borrowed.update(fill_from_kin(source.fill, source.store))
    if source.rule == "borrowed":
        ledger.count(BORROWED)
    if source.read is not None:
        # fuzzy: a shape the files have not seen takes the entry of the same kernel, dtypes and structure
        # (fla.ops.utils.cache.AutotuneKey.keys_fuzzy_match), so new batch or sequence sizes stay pinned.
        env["FLA_CONFIG_DIR"], env["FLA_CACHE_MODE"] = str(source.read), "fuzzy"
    if source.store is not None:
        at_exit(store_new_choices, source.store)
    return source.note


def _pin_environment() -> str:
    """Choose and apply this card's kernel source (`kernel_source`); a note for the run header."""
    global _source
    import torch

    card = capability = None
    if torch.cuda.is_available():
        card, capability = torch.cuda.get_device_name(), torch.cuda.get_device_capability()
    _source = kernel_source(card, capability, os.environ)
    return _apply(_source, os.environ, atexit.register)


def applied_source() -> KernelSource:
    """The kernel source this process applied (set by `pin_note`, which runs before fla's import)."""
    pin_note()
    return _source


# fla routes some ops to other backends whenever their packages import (fla/backends.py, fla 0.6.0):
# TileLang's KDA backward kernel (`tilelang`, with an nvcc) and the FlashKDA forward (`flash_kda`). A package
# installed for something else would switch the kernels, and their bits, unseen: off unless the user turns
# one on, and the run header says which were set.
BACKEND_SWITCHES = ("FLA_TILELANG", "FLA_FLASH_KDA")


def _backend_environment() -> str:
    """Turn fla's optional backends off where the user left them unset; a note for the run header."""
    notes = []
    for name in BACKEND_SWITCHES:
        by_user = name in os.environ
        os.environ.setdefault(name, "0")
        notes.append(f"{name}={os.environ[name]}" + (" (set by the user)" if by_user else ""))
    return "fla backends: " + ", ".join(notes)


def pin_note() -> str:
    """Set fla's kernel source and backends, once a process; the note for the run header. A module global,
    not functools.cache: dynamo, inlining this under torch.compile, sees the note set and skips the body
    (its atexit calls would break the graph)."""
    global _note
    if _note is None:
        note = f"{_pin_environment()}; {_backend_environment()}"
        if os.environ.get(DUMP_ENV):  # every choice made, at exit: how a pin is refreshed on a device
            atexit.register(dump_choices, Path(os.environ[DUMP_ENV]))
            note += f"; {DUMP_ENV}: this process's choices will be written to {os.environ[DUMP_ENV]} at exit"
        _note = note
    return _note


def pin_plain_autotuners() -> int:
    """Make every fla kernel read the pin; returns how many autotuners were changed.

    fla decorates most kernels with its own autotuner (fla_cache_autotune: CachedAutotuner, which looks
    the key up in the pin before Triton's run) but some with Triton's (fla 0.6.0: the layer norms of
    fla/modules/norm/layernorm.py), which never read the pin: every process chose their configs by
    timing, so two runs of one config could run different kernels. CachedAutotuner is a subclass that
    only adds that lookup, so such an autotuner becomes one in place (its class and kernel name)."""
    from fla.ops.utils.cache import CachedAutotuner

    changed = 0
    for kernel, tuner in _autotuners():
        if not isinstance(tuner, CachedAutotuner):
            tuner.__class__ = CachedAutotuner
            tuner.kernel_name = kernel
            changed += 1
    return changed


def _autotuners():
    """(kernel name, autotuner) for every Triton autotuner in the fla modules imported so far."""
    if "triton" not in sys.modules:
        return
    from triton.runtime.autotuner import Autotuner

    seen = set()
    for name, module in list(sys.modules.items()):
        if not name.startswith("fla.") or module is None:
            continue
        for value in list(vars(module).values()):
            obj = value
            for _ in range(3):  # @triton.heuristics wraps the autotuner: unwrap through .fn
                if isinstance(obj, Autotuner):
                    if id(obj) not in seen:
                        seen.add(id(obj))
                        yield getattr(obj, "kernel_name", None) or obj.base_fn.__name__, obj
                    break
                obj = getattr(obj, "fn", None)


def same_config(a: dict, b: dict) -> bool:
    """Whether two configs in fla's file format (`config_entry`) are one: block sizes, warps and stages."""
    return (a["kwargs"], a["num_warps"], a["num_stages"]) == (b["kwargs"], b["num_warps"], b["num_stages"])


def _lookups():
    """(kernel, key, config, the config fla's lookup finds in the files or None) for each kernel choice
    of this process: fla's own lookup (fla.ops.utils.cache.load_cached_config, under the FLA_CACHE_MODE
    in force)."""
    for kernel, tuner in _autotuners():  # none where fla is not imported
        from fla.ops.utils.cache import AutotuneKey, load_cached_config

        for key, config in list(tuner.cache.items()):
            yield kernel, key, config, load_cached_config(kernel, AutotuneKey(key))


def unpinned_choices():
    """(kernel, key, config, the entry fla's lookup found or None) for each kernel choice of this process
    that the files fla reads did not make (`_lookups`): no entry for the key, or one the kernel rejected
    and Triton chose instead."""
    for kernel, key, config, pinned in _lookups():
        if pinned is None or not same_config(config_entry(config), pinned):
            yield kernel, key, config, pinned


def borrowed_choices():
    """(kernel, key) for each kernel choice of this process made by an entry `fill_from_kin` put in the
    files: the files' config, for a key of a class (`key_class`) only such entries hold."""
    if not _borrowed:  # no fill on this card: no lookups at each eval
        return
    for kernel, key, config, pinned in _lookups():
        if (
            pinned is not None
            and key_class(key) in _borrowed.get(kernel, ())
            and same_config(config_entry(config), pinned)
        ):
            yield kernel, key


def count_borrowed() -> int:
    """Count on the ledger, once each, the kernel choices of this process that came from another card's
    pin (`borrowed_choices`); returns how many were new."""
    new = 0
    for kernel, key in borrowed_choices():
        if (kernel, repr(key)) not in _counted_borrowed:
            _counted_borrowed.add((kernel, repr(key)))
            ledger.count(BORROWED_ENTRY)
            new += 1
    return new


def count_unpinned() -> int:
    """Count on the ledger, once each, the kernel choices of this process that the pin did not make
    (`unpinned_choices`); returns how many were new."""
    new = 0
    for kernel, key, config, pinned in unpinned_choices():
        if (kernel, repr(key)) not in _counted:
            _counted[kernel, repr(key)] = (key, config, pinned)
            ledger.count(UNPINNED)
            new += 1
    return new


def store_new_choices(folder: Path) -> dict[str, int]:
    """Add this process's `unpinned_choices` to the fla-format files in `folder` (the card's user cache),
    after the entries they hold; returns {file name: entries added}. At exit, and by `dormouse tune`."""
    choices = list(unpinned_choices())  # empty where no fla kernel ran: then fla is not imported here
    if not choices:
        return {}
    import triton
    from fla.ops.utils.cache import AutotuneKey

    new: dict[str, dict] = {}
    for kernel, key, config, _ in choices:
        digest = AutotuneKey.key_hash(key)
        if (kernel, digest) not in _stored:  # fla caches the files it read: what this process added is not in them
            entry = {"autotune_key": AutotuneKey.normalize_autotune_key(key), "config": config_entry(config)}
            new.setdefault(kernel, {})[digest] = entry
    for kernel, entries in new.items():
        path = folder / f"{kernel}.json"
        have = _read_json(path) or {"kernel_name": kernel, "autotune_entries": {}}
        _write_json(
            path,
            {**have, "triton_version": triton.__version__, "autotune_entries": {**have["autotune_entries"], **entries}},
        )
        _stored.update((kernel, digest) for digest in entries)
    return {f"{kernel}.json": len(entries) for kernel, entries in new.items()}


def merge_pin(pin: Path, cache: Path) -> None:
    """Put the entries of `pin`'s files into the same files of `cache`, before the card's own: fla's fuzzy
    lookup takes the first entry whose key matches, so the pin keeps deciding the shapes it covers. On one
    key the card's own entry wins (it was timed there: the pin's config was refused by the kernel)."""
    for src in sorted(pin.glob("*.json")):
        target = cache / src.name
        pinned, own = _read_json(src), _read_json(target) or {"autotune_entries": {}}
        entries = {**pinned["autotune_entries"], **own["autotune_entries"]}
        if list(entries.items()) != list(own["autotune_entries"].items()):
            _write_json(target, {**pinned, **own, "autotune_entries": entries})


def key_class(key) -> str:
    """fla's fuzzy key match as one string: two keys match (fla.ops.utils.cache.AutotuneKey.keys_fuzzy_match)
    exactly when their classes are equal: the same structure and strings, any numbers."""

    def shape(value):
        if isinstance(value, (list, tuple)):
            return [shape(v) for v in value]
        if isinstance(value, dict):
            return {k: shape(v) for k, v in value.items()}
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return {"<number>": None}
        return value

    return json.dumps(shape(key), sort_keys=True)


def fill_from_kin(kin: Path, cache: Path) -> dict[str, set[str]]:
    """Add to `cache`'s files each entry of the pin `kin` whose key class (`key_class`) no entry of this
    card's own holds, marked with the kin's name; marked entries of earlier runs are replaced. A key fla
    finds in this card's own entries, exactly or fuzzily, is found there as before: the classes do not
    overlap. Returns {kernel: the classes of the marked entries}."""
    borrowed: dict[str, set[str]] = {}
    names = {p.name for p in kin.glob("*.json")} | {p.name for p in cache.glob("*.json") if p.name != UNPINNED_FILE}
    for name in sorted(names):
        kin_file, target = _read_json(kin / name), cache / name
        have = _read_json(target)
        own = {h: e for h, e in (have or {}).get("autotune_entries", {}).items() if BORROWED_FIELD not in e}
        covered = {key_class(e["autotune_key"]) for e in own.values()}
        from_kin = {
            h: {**e, BORROWED_FIELD: kin.name}
            for h, e in (kin_file or {}).get("autotune_entries", {}).items()
            if key_class(e["autotune_key"]) not in covered
        }
        if from_kin:
            borrowed[name.removesuffix(".json")] = {key_class(e["autotune_key"]) for e in from_kin.values()}
        entries = {**own, **from_kin}
        if have is None and not from_kin:
            continue
        if have is None or list(entries.items()) != list(have["autotune_entries"].items()):
            _write_json(target, {**(kin_file or {}), **(have or {}), "autotune_entries": entries})
    return borrowed


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DormouseError(
            f"{path} is not a file of fla kernel choices ({err}): delete it, and Triton times them again"
        ) from err


def _write_json(path: Path, data: dict) -> None:
    """Whole or not at all: the ranks of one job write the same user cache at exit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{os.getpid()}")
    part.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(part, path)


def config_entry(config) -> dict:
    """A triton.Config as fla's config files hold it (fla.ops.utils.cache.maybe_load_cached_config)."""
    return {
        "kwargs": dict(config.kwargs),
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
        "num_ctas": getattr(config, "num_ctas", 1),
        "maxnreg": getattr(config, "maxnreg", None),
        "ir_override": getattr(config, "ir_override", None),
    }


def dump_choices(folder: Path, kernels: set[str] | None = None) -> list[str]:
    """Merge this process's kernel choices (of `kernels` only, when named; none that another card's pin
    made) into fla-format files in `folder`; returns the files written."""
    import triton
    from fla.ops.utils.cache import AutotuneKey

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    borrowed = set(borrowed_choices())  # another card's timing: not this card's to pin
    for kernel, tuner in _autotuners():
        if not tuner.cache or (kernels is not None and kernel not in kernels):
            continue
        path = folder / f"{kernel}.json"
        data = json.loads(path.read_text()) if path.is_file() else {}
        entries = data.get("autotune_entries", {})
        for key, config in tuner.cache.items():
            if (kernel, key) in borrowed:
                continue
            entries[AutotuneKey.key_hash(key)] = {
                "autotune_key": AutotuneKey.normalize_autotune_key(key),
                "config": config_entry(config),
            }
        data = {"kernel_name": kernel, "triton_version": triton.__version__, "autotune_entries": entries}
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        written.append(str(path))
    # which choices were not the pin's, and what the pin had: why `fallbacks=` counted them
    if _counted and kernels is None:
        path = folder / UNPINNED_FILE
        seen = json.loads(path.read_text()) if path.is_file() else []
        for (kernel, _), (key, config, pinned) in sorted(_counted.items()):
            seen.append(
                {
                    "kernel": kernel,
                    "autotune_key": AutotuneKey.normalize_autotune_key(key),
                    "chosen": config_entry(config),
                    "pinned": pinned,  # None: the pin has no entry; else the entry the kernel did not run
                }
            )
        path.write_text(json.dumps(seen, indent=1, sort_keys=True) + "\n")
        written.append(str(path))
    return written
