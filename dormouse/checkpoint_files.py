"""A checkpoint directory's files (dormouse/checkpoint.py writes them): their names, the ledger sites that
refuse a bad one, and reading them back verified: every file's size, sha256 and step stamp against
state.json, the state seal in the model file's metadata, and the `last` and `best` pointers.
"""

import hashlib
import json
import math
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from dormouse import ledger
from dormouse.errors import CheckpointError

FORMAT = 1
STATE = "state.json"
MODEL = "model.safetensors"
OPTIMIZER = "optimizer.pt"
OPTIMIZER_KEY = "optimizer/"  # prefix of the optimizer-state tensors inside a <stem>.safetensors file
STATE_KEYS = ("run_id", "best_bpb", "best_step", "sampler", "stress", "extra")

FILE_MISSING = ledger.register(
    "checkpoint.file_missing",
    ledger.Kind.LOUD,
    "a checkpoint file is missing: refused (an absent sidecar would read as freshly seeded rows)",
    __name__,
)
STEP_MISMATCH = ledger.register(
    "checkpoint.step_mismatch",
    ledger.Kind.LOUD,
    "checkpoint files stamped with different training steps are refused, not loaded as a pair",
    __name__,
)
HASH_MISMATCH = ledger.register(
    "checkpoint.hash_mismatch",
    ledger.Kind.LOUD,
    "a checkpoint file whose size or sha256 differs from state.json is refused, not loaded",
    __name__,
)

STEP_DIR = re.compile(r"step-(\d{8,})")


@dataclass
class Checkpoint:
    path: Path
    step: int
    state: dict
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict
    tensors: dict[str, dict[str, torch.Tensor]]
    optimizer_tensors: dict[str, dict[str, torch.Tensor]]  # by stem; only stems that hold any


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def load_dir(path: Path, pointed: int | None, which, device: str) -> Checkpoint:
    state = verify_files(path)
    step = state["step"]
    if pointed is not None and pointed != step:
        raise ledger.refuse(
            STEP_MISMATCH, f"pointer {which!r} says step {pointed}, but {path / STATE} says step {step}"
        )
    model_state, tensors, optimizer_tensors = {}, {}, {}
    for name in state["files"]:
        if name == MODEL:
            model_state = _load_safetensors(path / name, step, "model", device, seal=state_seal(state))
        elif name != OPTIMIZER:
            stem = name.removesuffix(".safetensors")
            held = _load_safetensors(path / name, step, stem, device)
            tensors[stem] = {k: v for k, v in held.items() if not k.startswith(OPTIMIZER_KEY)}
            opt = {k.removeprefix(OPTIMIZER_KEY): v for k, v in held.items() if k.startswith(OPTIMIZER_KEY)}
            if opt:
                optimizer_tensors[stem] = opt
    optimizer_state = _load_optimizer(path / OPTIMIZER, step, device)
    check_best(path.parent, state, path, pointed is not None and which == "best")
    return Checkpoint(path, step, state, model_state, optimizer_state, tensors, optimizer_tensors)


def resolve(ckpt: Path, which: str | os.PathLike) -> tuple[Path, int | None]:
    """The step directory `which` names, and the step its pointer claims (None when not via a pointer)."""
    if isinstance(which, str) and which in ("last", "best"):
        ptr = read_pointer(ckpt, which)
        if ptr is None:
            raise CheckpointError(f"no `{which}` checkpoint: {ckpt / which} does not exist")
        path = ckpt / ptr["dir"]
        if not path.is_dir():
            raise ledger.refuse(FILE_MISSING, f"pointer {ckpt / which} names {path}, which does not exist")
        return path, ptr["step"]
    m = re.fullmatch(r"step-(\d+)", which) if isinstance(which, str) else None
    path = ckpt / step_dir_name(int(m.group(1))) if m else Path(which)
    if not path.is_dir():
        raise ledger.refuse(FILE_MISSING, f"checkpoint directory {path} does not exist")
    return path, None


def verify_files(path: Path) -> dict:
    """state.json of a step directory, after checking its listing, sizes and hashes (step stamps: at load)."""
    if path.name.startswith(".tmp-"):
        raise CheckpointError(f"{path} is an unfinished write (.tmp-*): never loaded")
    if not (path / STATE).is_file():
        raise ledger.refuse(FILE_MISSING, f"partial checkpoint {path}: {STATE} is missing (it is written last)")
    state = read_json(path / STATE)
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path / STATE} has format {state.get('format')!r}, this code reads format {FORMAT}")
    missing = [k for k in (*STATE_KEYS, "step", "files") if k not in state]
    if missing:
        raise CheckpointError(f"{path / STATE} lacks {missing}")
    step, files = state["step"], state["files"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or not isinstance(files, dict):
        raise CheckpointError(f"{path / STATE} has step={step!r}, files of type {type(files).__name__}")
    m = STEP_DIR.fullmatch(path.name)
    if m and int(m.group(1)) != step:
        raise ledger.refuse(
            STEP_MISMATCH, f"{path / STATE} says step {step}, its directory name says {int(m.group(1))}"
        )
    for need in (MODEL, OPTIMIZER):
        if need not in files:
            raise ledger.refuse(FILE_MISSING, f"partial checkpoint {path}: {STATE} does not list {need}")
    for name in sorted(os.listdir(path)):
        if name != STATE and name not in files:
            raise CheckpointError(
                f"{path / name} is not listed in {path / STATE}: refusing a directory it does not describe"
            )
    for name, entry in files.items():
        f = path / name
        if name in (STATE, ".", "..") or Path(name).name != name or not isinstance(entry, dict):
            raise CheckpointError(f"{path / STATE} lists a bad file entry {name!r}: {entry!r}")
        if not f.is_file():
            raise ledger.refuse(FILE_MISSING, f"partial checkpoint {path}: {name} is missing")
        if entry.get("step") != step:
            raise ledger.refuse(STEP_MISMATCH, f"{f} is listed with step {entry.get('step')!r}, state.json says {step}")
        size = f.stat().st_size
        if size != entry.get("size"):
            raise ledger.refuse(HASH_MISMATCH, f"{f} has {size} bytes, state.json says {entry.get('size')!r}")
        digest = sha256(f)
        if digest != entry.get("sha256"):
            raise ledger.refuse(HASH_MISMATCH, f"{f} has sha256 {digest}, state.json says {entry.get('sha256')!r}")
    return state


def _load_safetensors(path: Path, step: int, kind: str, device: str, seal: str | None = None) -> dict:
    try:
        with safe_open(str(path), framework="pt", device=device) as f:
            meta = f.metadata() or {}
            out = {k: f.get_tensor(k) for k in f.keys()}
    except SafetensorError as e:
        raise CheckpointError(f"{path} is not a readable safetensors file: {e}") from e
    if meta.get("step") != str(step):
        raise ledger.refuse(STEP_MISMATCH, f"{path} is stamped step {meta.get('step')!r}, state.json says {step}")
    if meta.get("kind") != kind:
        raise CheckpointError(f"{path} holds kind {meta.get('kind')!r}, expected {kind!r}")
    if seal is not None and meta.get("state") != seal:
        raise _edited(path.parent, meta.get("state"))
    return out


def state_seal(state: dict) -> str:
    """sha256 of state.json's body: every key but `format` and `files` (sorted, compact JSON)."""
    body = {k: state.get(k) for k in (*STATE_KEYS, "step")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _edited(path: Path, seal) -> CheckpointError:
    if seal is None:
        return CheckpointError(f"{path / MODEL} holds no seal of {STATE}: written by an older dormouse, not loaded")
    return ledger.refuse(
        HASH_MISMATCH, f"{path / STATE} was edited: its contents differ from the seal in {path / MODEL}"
    )


def sealed_state(path: Path) -> dict:
    """A step directory's state.json, checked against its seal (the model file's metadata only: cheap)."""
    state = read_json(path / STATE)
    try:
        with safe_open(str(path / MODEL), framework="pt") as f:
            seal = (f.metadata() or {}).get("state")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path / MODEL} is not a readable safetensors file: {e}") from e
    if seal != state_seal(state):
        raise _edited(path, seal)
    return state


def check_best_pointer(ckpt: Path, best: dict) -> None:
    """`best`'s bpb is the one its directory's sealed state.json records as the best."""
    state = sealed_state(ckpt / best["dir"])
    if state.get("best_step") != best["step"] or state.get("best_bpb") != best["bpb"]:
        raise CheckpointError(
            f"pointer {ckpt / 'best'} says bpb {best['bpb']!r} at step {best['step']}, but "
            f"{ckpt / best['dir'] / STATE} records best_bpb {state.get('best_bpb')!r} at step "
            f"{state.get('best_step')!r}: the pointer was edited; restore it"
        )


def check_best(ckpt: Path, state: dict, path: Path, via_best: bool) -> None:
    """A loaded checkpoint's best_bpb equals the one its best directory recorded, where that is still on disk."""
    best = read_pointer(ckpt, "best")
    if best is not None and (via_best or best["step"] == state["best_step"]):
        check_best_pointer(ckpt, best)
        if best["step"] == state["best_step"] and best["bpb"] != state["best_bpb"]:
            raise CheckpointError(
                f"{path / STATE} says best_bpb {state['best_bpb']!r} at step {state['best_step']}, but "
                f"{ckpt / best['dir'] / STATE} recorded {best['bpb']!r}"
            )
    if state["best_step"] is None or state["best_step"] == state["step"]:
        return
    best_dir = ckpt / step_dir_name(state["best_step"])
    if best_dir.is_dir() and not (best_dir / STATE).is_file():
        return  # being pruned by a concurrent save: nothing to compare against
    if best_dir.is_dir():
        recorded = sealed_state(best_dir)
        if recorded.get("best_bpb") != state["best_bpb"]:
            raise CheckpointError(
                f"{path / STATE} says best_bpb {state['best_bpb']!r} at step {state['best_step']}, but "
                f"{best_dir / STATE} recorded {recorded.get('best_bpb')!r}"
            )


def _load_optimizer(path: Path, step: int, device: str) -> dict:
    try:
        blob = torch.load(path, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
        raise CheckpointError(f"{path} does not load with weights_only=True: {e}") from e
    if not isinstance(blob, dict) or set(blob) != {"step", "state"}:
        raise CheckpointError(f"{path} is not a dormouse optimizer file (expected keys step, state)")
    if blob["step"] != step:
        raise ledger.refuse(STEP_MISMATCH, f"{path} is stamped step {blob['step']!r}, state.json says {step}")
    return blob["state"]


def read_pointer(ckpt: Path, name: str) -> dict | None:
    path = ckpt / name
    if not path.exists():
        return None
    ptr = read_json(path)
    step, bpb = ptr.get("step"), ptr.get("bpb")
    if not isinstance(step, int) or isinstance(step, bool) or ptr.get("dir") != step_dir_name(step):
        raise CheckpointError(f"pointer {path} is malformed: {ptr!r}")
    if bpb is not None and (not isinstance(bpb, int | float) or not math.isfinite(bpb)):
        raise CheckpointError(f"pointer {path} holds bpb={bpb!r}: not a finite score")
    if name == "best" and bpb is None:
        raise CheckpointError(f"pointer {path} holds no bpb: a best has a score")
    return ptr


def read_json(path: Path) -> dict:
    def refuse_constant(name: str):
        raise ValueError(f"non-finite number {name}")

    try:
        data = json.loads(path.read_text(), parse_constant=refuse_constant)
    except FileNotFoundError as e:
        raise ledger.refuse(FILE_MISSING, f"{path} is missing") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} does not hold a JSON object")
    return data


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
