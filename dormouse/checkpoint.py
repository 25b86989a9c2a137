"""Checkpoint directories: written atomically, loaded only after every file is verified.

Layout of `RUN/ckpt/`:

    step-00000120/           one checkpoint: complete under this name, or absent
      model.safetensors      the model's state_dict; metadata {"step": "120", "kind": "model", "state": <seal>}
      optimizer.pt           torch.save({"step": 120, "state": optimizer.state_dict()})
      <stem>.safetensors     the caller's other tensor files (engram tables, ...); metadata {"step", "kind": stem};
                             optimizer state that travels with them is keyed "optimizer/<key>" there
      state.json             written last: format, run_id, step, best_bpb, best_step, sampler, stress,
                             extra, and files: {name: {sha256, size, step}} for every file above
    last                     pointer {"dir": "step-00000120", "step": 120, "bpb": ...}: the commit point
    best                     pointer to the best directory: weights and engram tables travel together

This module knows nothing of how the model is built: it takes and returns state dicts.

state.json is sealed: the model file's metadata holds the sha256 of its body (every key but `files`,
which the model file's own hash is in), so a hand edit of state.json (a lowered best_bpb, another
run_id) is refused at load, naming state.json. The `best` pointer and a checkpoint's best_bpb must
agree with the sealed state.json of the best directory.

A save writes everything into `.tmp-step-<N>-<random>/`, fsyncs each file and the directory, renames
it to `step-<N>`, then replaces `last` (and `best`) atomically, then prunes. A writer killed at any
point leaves the previous commit intact; the next save cleans up after it:
- `.tmp-*` entries are never loaded and are removed;
- a `step-*` directory newer than `last` was renamed but never committed: it is removed (counted,
  ledger `checkpoint.orphan_removed`), since the resumed run restarts from `last` and redoes that step;
- if `last`'s state.json says it is the best but `best` points elsewhere, the writer died between the
  two pointer writes: `best` is completed. Until then `best` is the previous best, itself complete.
One writer per run directory (rank 0).

What could otherwise be lost silently, and what refuses it:
- a resume overwriting a better best: a save whose state carries no best, or a worse one than `best`
  holds, is refused;
- `best` holding a different model than it names (a sidecar left behind): `best` is a whole directory;
- inf printed as a score: a non-finite best_bpb is never written;
- an absent sidecar read as freshly seeded rows, or a sidecar from another step loaded without
  complaint: a missing file, a hash or size mismatch and a step stamp that disagrees with state.json
  are LOUD ledger sites; an unlisted file in the directory is refused too.
"""

import hashlib
import json
import math
import os
import pickle
import re
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

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
ORPHAN_REMOVED = ledger.register(
    "checkpoint.orphan_removed",
    ledger.Kind.COUNTED,
    "a step directory newer than `last` (writer killed before the commit) was removed by the next save",
    __name__,
)

_STEP_DIR = re.compile(r"step-(\d{8,})")
_STEM = re.compile(r"[a-z][a-z0-9_]*")


def _no_hook(point: str) -> None:
    pass


# Test seam: called with the name of each point of a save, so that the kill test can stop a writer
# there (tests/ckpt_writer.py). It does nothing in normal use.
_at: Callable[[str], None] = _no_hook


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


def save(
    run_dir: str | os.PathLike,
    step: int,
    *,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict,
    tensors: dict[str, dict[str, torch.Tensor]] | None = None,
    optimizer_tensors: dict[str, dict[str, torch.Tensor]] | None = None,
    state: dict,
    is_best: bool = False,
    keep_last: int = 3,
) -> Path:
    """Write checkpoint `step` of a run and commit it; return its directory `RUN/ckpt/step-<N>`.

    `tensors` {stem: tensors} are written to `<stem>.safetensors`; `optimizer_tensors` {stem: tensors}
    join the same file under `optimizer/<key>` (optimizer state that belongs with those tensors, such
    as the engram tables' row-wise moments); `load` hands them back apart.
    `state` holds exactly the keys run_id (str), best_bpb (finite float or None), best_step (int or
    None), sampler, stress, extra (JSON objects). `is_best` says this step's held-out bpb is the run's
    best: then best_step must equal `step`, and best_bpb must be finite and no worse than the bpb
    `best` holds. Any refusal happens before any file of this step is written. Afterwards the `keep_last` newest
    directories and the one `best` points to are kept, the others removed.
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"checkpoint step must be an int >= 0, got {step!r}")
    if not isinstance(keep_last, int) or keep_last < 1:
        raise CheckpointError(f"keep_last must be an int >= 1, got {keep_last!r}")
    body = _check_state(state, step, is_best)
    files_out = {MODEL: (_cpu_tensors(model_state, "model_state"), "model")}
    for stem, sd in _extra_files(tensors or {}, optimizer_tensors or {}).items():
        files_out[f"{stem}.safetensors"] = (_cpu_tensors(sd, f"tensors[{stem!r}]"), stem)
    _check_plain(optimizer_state, "optimizer_state")

    ckpt = Path(run_dir) / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    last = _recover(ckpt)
    _check_against_disk(ckpt, last, body, step, is_best)

    final = ckpt / step_dir_name(step)
    if final.exists():  # only a committed one can be here: _recover removed orphans
        raise CheckpointError(f"checkpoint {final} already exists: a step is saved once")
    tmp = ckpt / f".tmp-{final.name}-{secrets.token_hex(4)}"
    try:
        _write_step(tmp, final, step, files_out, optimizer_state, body, is_best)
    except (OSError, SafetensorError, RuntimeError) as e:  # disk full, quota, permissions: nothing committed
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(
            f"checkpoint step {step} not saved ({_cause(e)}); the last checkpoint, step {last_step(run_dir)}, "
            "is intact: free space (or pass a lower --keep-last with --resume) and --resume"
        ) from e
    _prune(ckpt, keep_last)
    return final


def _write_step(tmp: Path, final: Path, step: int, files_out: dict, optimizer_state: dict, body: dict, is_best):
    """Write checkpoint `step` into `tmp`, rename it to `final`, then commit it (`last`, `best`)."""
    ckpt = final.parent
    tmp.mkdir()
    _at("tmp_created")
    files = {}
    for name, (sd, kind) in files_out.items():
        meta = {"step": str(step), "kind": kind, **({"state": _state_seal(body)} if kind == "model" else {})}
        save_file(sd, str(tmp / name), metadata=meta)
        files[name] = _seal(tmp / name, step)
        _at(f"{kind}_written")
    with open(tmp / OPTIMIZER, "wb") as f:
        torch.save({"step": step, "state": optimizer_state}, f)
    files[OPTIMIZER] = _seal(tmp / OPTIMIZER, step)
    _at("optimizer_written")
    _write_durable(tmp / STATE, _dumps({"format": FORMAT, **body, "files": files}))
    _fsync_dir(tmp)
    _at("state_written")

    os.rename(tmp, final)
    _fsync_dir(ckpt)
    _at("renamed")
    bpb = body["best_bpb"] if is_best else None
    _write_pointer(ckpt, "last", step, bpb)
    _at("last_written")
    if is_best:
        _write_pointer(ckpt, "best", step, bpb)
        _at("best_written")


def _cause(e: Exception) -> str:
    if isinstance(e, OSError):
        return f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def load(run_dir: str | os.PathLike, which: str | os.PathLike = "last", *, device: str = "cpu") -> Checkpoint:
    """Load and verify checkpoint `which` of a run: "last", "best", "step-<N>", or a path to a step dir.

    Every file state.json lists must exist with its size, sha256 and step stamp, and no other file
    may be present; otherwise nothing is returned and the file is named in the error.
    """
    path, pointed = _resolve(Path(run_dir) / "ckpt", which)
    try:
        return _load_dir(path, pointed, which, device)
    except FileNotFoundError as e:  # checked present, then gone: a concurrent save pruned it
        raise ledger.refuse(FILE_MISSING, f"{e.filename} vanished while it was being loaded") from e


def best_bpb(run_dir: str | os.PathLike) -> float | None:
    """The held-out bpb `best` points to, or None when the run has no best yet."""
    ptr = _read_pointer(Path(run_dir) / "ckpt", "best")
    return None if ptr is None else ptr["bpb"]


def last_step(run_dir: str | os.PathLike) -> int | None:
    """The step `last` points to (the newest committed checkpoint), or None when there is none."""
    ptr = _read_pointer(Path(run_dir) / "ckpt", "last")
    return None if ptr is None else ptr["step"]


# --- save helpers ---


def _check_state(state: dict, step: int, is_best: bool) -> dict:
    """The body of state.json (without format and files), validated and JSON-checked."""
    if not isinstance(state, dict) or set(state) != set(STATE_KEYS):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"checkpoint state must have exactly the keys {list(STATE_KEYS)}, got {got}")
    if not isinstance(state["run_id"], str) or not state["run_id"]:
        raise CheckpointError(f"checkpoint state run_id must be a non-empty str, got {state['run_id']!r}")
    bpb, best_step = state["best_bpb"], state["best_step"]
    if bpb is not None:
        if isinstance(bpb, bool) or not isinstance(bpb, int | float) or not math.isfinite(bpb):
            raise CheckpointError(f"best_bpb={bpb!r} at step {step}: a non-finite or non-numeric bpb is never a best")
        bpb = float(bpb)
    if (bpb is None) != (best_step is None):
        raise CheckpointError(f"best_bpb={bpb!r} and best_step={best_step!r}: both are set or both are None")
    if best_step is not None and (not isinstance(best_step, int) or isinstance(best_step, bool) or best_step > step):
        raise CheckpointError(f"best_step={best_step!r} must be an int <= the checkpoint step {step}")
    if is_best and best_step != step:
        raise CheckpointError(f"is_best=True at step {step}, but state best_step={best_step!r}")
    if not is_best and best_step == step:
        raise CheckpointError(f"state best_step={step} is this step, but is_best=False: say which it is")
    for key in ("sampler", "stress", "extra"):
        if not isinstance(state[key], dict):
            raise CheckpointError(f"checkpoint state {key} must be a dict, got {type(state[key]).__name__}")
    body = {"run_id": state["run_id"], "step": step, "best_bpb": bpb, "best_step": best_step}
    body.update({k: state[k] for k in ("sampler", "stress", "extra")})
    _dumps(body)  # refuse non-JSON or non-finite values now, before anything is written
    return body


def _check_against_disk(ckpt: Path, last: dict | None, body: dict, step: int, is_best: bool) -> None:
    """Refuse a save that would go back in time, mix two runs, or lose a better best."""
    if last is not None:
        if step <= last["step"]:
            raise CheckpointError(
                f"step {step} is not after the last checkpoint {ckpt / last['dir']}: a run saves forward only"
            )
        prev = _sealed_state(ckpt / last["dir"])
        if prev.get("run_id") != body["run_id"]:
            raise CheckpointError(
                f"run_id {body['run_id']!r} differs from {prev.get('run_id')!r} in {ckpt / last['dir'] / STATE}: "
                "one run directory holds one run"
            )
    best = _read_pointer(ckpt, "best")
    if best is not None:
        _check_best_pointer(ckpt, best)
    if best is not None and (body["best_bpb"] is None or body["best_bpb"] > best["bpb"]):
        raise CheckpointError(
            f"state best_bpb={body['best_bpb']!r} at step {step} is worse than, or forgets, the best "
            f"{best['bpb']!r} at {ckpt / best['dir']}: a resumed run must restore its best"
            + (" (is_best=True would overwrite it)" if is_best else "")
        )
    if best is not None and body["best_step"] == best["step"] and body["best_bpb"] != best["bpb"]:
        raise CheckpointError(
            f"state best_bpb={body['best_bpb']!r} at step {step} names best_step {best['step']}, whose "
            f"checkpoint recorded {best['bpb']!r}: a best is the score its own checkpoint recorded"
        )


def _recover(ckpt: Path) -> dict | None:
    """Clean up after a writer killed mid-save (see the module docstring); return the `last` pointer."""
    for entry in ckpt.iterdir():
        if entry.name.startswith(".tmp-"):
            _remove(entry)
    last = _read_pointer(ckpt, "last")
    steps = _step_dirs(ckpt)
    if last is None:
        if steps:
            raise CheckpointError(
                f"{ckpt} holds {len(steps)} step directories but no `last` pointer: refusing to write into it "
                "(restore `last`, or move the directories away)"
            )
        return None
    for s, path in steps.items():
        if s > last["step"]:  # renamed but never committed
            _remove(path)
            ledger.count(ORPHAN_REMOVED)
    if (ckpt / last["dir"]).is_dir():
        prev = _sealed_state(ckpt / last["dir"])
        best = _read_pointer(ckpt, "best")
        if prev.get("best_step") == last["step"] and (best is None or best["step"] != last["step"]):
            _write_pointer(ckpt, "best", last["step"], prev["best_bpb"])  # killed between `last` and `best`
    return last


def _prune(ckpt: Path, keep_last: int) -> None:
    last, best = _read_pointer(ckpt, "last"), _read_pointer(ckpt, "best")
    committed = sorted(s for s in _step_dirs(ckpt) if s <= last["step"])
    keep = set(committed[-keep_last:]) | ({best["step"]} if best else set())
    for s in committed:
        if s not in keep:
            _remove(ckpt / step_dir_name(s))


def _remove(path: Path) -> None:
    """Remove a directory or file; a step directory is first renamed aside, so a final name is never partial."""
    if path.is_dir() and not path.is_symlink():
        if not path.name.startswith(".tmp-"):
            aside = path.with_name(f".tmp-del-{path.name}-{secrets.token_hex(4)}")
            os.rename(path, aside)
            _fsync_dir(path.parent)
            _at("pruning")
            path = aside
        shutil.rmtree(path)
    else:
        path.unlink()


def _step_dirs(ckpt: Path) -> dict[int, Path]:
    out = {}
    for entry in ckpt.iterdir():
        m = _STEP_DIR.fullmatch(entry.name)
        if m and entry.is_dir():
            out[int(m.group(1))] = entry
    return out


def _extra_files(tensors: dict, optimizer_tensors: dict) -> dict[str, dict]:
    """{stem: what its file holds}: the caller's tensors, then the optimizer's under OPTIMIZER_KEY."""
    files = {}
    for stem in [*tensors, *(s for s in optimizer_tensors if s not in tensors)]:
        if not isinstance(stem, str) or not _STEM.fullmatch(stem) or stem in ("model", "optimizer", "state"):
            raise CheckpointError(
                f"extra tensor file name {stem!r} is refused: use lower-case letters, digits and _ "
                "(not model/optimizer/state)"
            )
        own = _cpu_tensors(tensors.get(stem, {}), f"tensors[{stem!r}]")
        if any(k.startswith(OPTIMIZER_KEY) for k in own):
            raise CheckpointError(f"tensors[{stem!r}] has keys starting {OPTIMIZER_KEY!r}, the optimizer's prefix")
        opt = _cpu_tensors(optimizer_tensors.get(stem, {}), f"optimizer_tensors[{stem!r}]")
        files[stem] = {**own, **{OPTIMIZER_KEY + k: v for k, v in opt.items()}}
    return files


def _cpu_tensors(sd: dict, what: str) -> dict[str, torch.Tensor]:
    """CPU, contiguous, unshared copies where needed: safetensors refuses tensors that share memory (tied weights)."""
    if not isinstance(sd, dict):
        raise CheckpointError(f"{what} must be a dict of tensors, got {type(sd).__name__}")
    out, seen = {}, set()
    for key, value in sd.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{what}[{key!r}] is {type(value).__name__}: only str -> Tensor entries are saved")
        t = value.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen and t.numel():
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[key] = t
    return out


def _check_plain(obj, where: str) -> None:
    """The optimizer state must load with torch.load(weights_only=True): tensors and plain containers only."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            _check_plain(k, f"{where} key")
            _check_plain(v, f"{where}[{k!r}]")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            _check_plain(v, f"{where}[{i}]")
    elif not isinstance(obj, str | int | float | bool | type(None) | torch.Tensor | torch.dtype | torch.Size):
        raise CheckpointError(
            f"{where} is a {type(obj).__name__}: optimizer state must hold only tensors, numbers, strings and "
            "containers, so that it loads with weights_only=True"
        )


def _seal(path: Path, step: int) -> dict:
    """fsync a written file; return its state.json entry."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"sha256": _sha256(path), "step": step, "size": path.stat().st_size}


def _write_durable(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _write_pointer(ckpt: Path, name: str, step: int, bpb: float | None) -> None:
    tmp = ckpt / f".tmp-{name}-{secrets.token_hex(4)}"
    _write_durable(tmp, _dumps({"dir": step_dir_name(step), "step": step, "bpb": bpb}))
    _at(f"{name}_tmp_written")
    os.replace(tmp, ckpt / name)
    _fsync_dir(ckpt)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _dumps(obj) -> str:
    try:
        return json.dumps(obj, allow_nan=False, indent=1) + "\n"
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint state is not finite JSON: {e}") from e


# --- load helpers ---


def _load_dir(path: Path, pointed: int | None, which, device: str) -> Checkpoint:
    state = _verify_files(path)
    step = state["step"]
    if pointed is not None and pointed != step:
        raise ledger.refuse(
            STEP_MISMATCH, f"pointer {which!r} says step {pointed}, but {path / STATE} says step {step}"
        )
    model_state, tensors, optimizer_tensors = {}, {}, {}
    for name in state["files"]:
        if name == MODEL:
            model_state = _load_safetensors(path / name, step, "model", device, seal=_state_seal(state))
        elif name != OPTIMIZER:
            stem = name.removesuffix(".safetensors")
            held = _load_safetensors(path / name, step, stem, device)
            tensors[stem] = {k: v for k, v in held.items() if not k.startswith(OPTIMIZER_KEY)}
            opt = {k.removeprefix(OPTIMIZER_KEY): v for k, v in held.items() if k.startswith(OPTIMIZER_KEY)}
            if opt:
                optimizer_tensors[stem] = opt
    optimizer_state = _load_optimizer(path / OPTIMIZER, step, device)
    _check_best(path.parent, state, path, pointed is not None and which == "best")
    return Checkpoint(path, step, state, model_state, optimizer_state, tensors, optimizer_tensors)


def _resolve(ckpt: Path, which: str | os.PathLike) -> tuple[Path, int | None]:
    """The step directory `which` names, and the step its pointer claims (None when not via a pointer)."""
    if isinstance(which, str) and which in ("last", "best"):
        ptr = _read_pointer(ckpt, which)
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


def _verify_files(path: Path) -> dict:
    """state.json of a step directory, after checking its listing, sizes and hashes (step stamps: at load)."""
    if path.name.startswith(".tmp-"):
        raise CheckpointError(f"{path} is an unfinished write (.tmp-*): never loaded")
    if not (path / STATE).is_file():
        raise ledger.refuse(FILE_MISSING, f"partial checkpoint {path}: {STATE} is missing (it is written last)")
    state = _read_json(path / STATE)
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path / STATE} has format {state.get('format')!r}, this code reads format {FORMAT}")
    missing = [k for k in (*STATE_KEYS, "step", "files") if k not in state]
    if missing:
        raise CheckpointError(f"{path / STATE} lacks {missing}")
    step, files = state["step"], state["files"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or not isinstance(files, dict):
        raise CheckpointError(f"{path / STATE} has step={step!r}, files of type {type(files).__name__}")
    m = _STEP_DIR.fullmatch(path.name)
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
        digest = _sha256(f)
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


def _state_seal(state: dict) -> str:
    """sha256 of state.json's body: every key but `format` and `files` (sorted, compact JSON)."""
    body = {k: state.get(k) for k in (*STATE_KEYS, "step")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _edited(path: Path, seal) -> CheckpointError:
    if seal is None:
        return CheckpointError(f"{path / MODEL} holds no seal of {STATE}: written by an older dormouse, not loaded")
    return ledger.refuse(
        HASH_MISMATCH, f"{path / STATE} was edited: its contents differ from the seal in {path / MODEL}"
    )


def _sealed_state(path: Path) -> dict:
    """A step directory's state.json, checked against its seal (the model file's metadata only: cheap)."""
    state = _read_json(path / STATE)
    try:
        with safe_open(str(path / MODEL), framework="pt") as f:
            seal = (f.metadata() or {}).get("state")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path / MODEL} is not a readable safetensors file: {e}") from e
    if seal != _state_seal(state):
        raise _edited(path, seal)
    return state


def _check_best_pointer(ckpt: Path, best: dict) -> None:
    """`best`'s bpb is the one its directory's sealed state.json records as the best."""
    state = _sealed_state(ckpt / best["dir"])
    if state.get("best_step") != best["step"] or state.get("best_bpb") != best["bpb"]:
        raise CheckpointError(
            f"pointer {ckpt / 'best'} says bpb {best['bpb']!r} at step {best['step']}, but "
            f"{ckpt / best['dir'] / STATE} records best_bpb {state.get('best_bpb')!r} at step "
            f"{state.get('best_step')!r}: the pointer was edited; restore it"
        )


def _check_best(ckpt: Path, state: dict, path: Path, via_best: bool) -> None:
    """A loaded checkpoint's best_bpb equals the one its best directory recorded, where that is still on disk."""
    best = _read_pointer(ckpt, "best")
    if best is not None and (via_best or best["step"] == state["best_step"]):
        _check_best_pointer(ckpt, best)
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
        recorded = _sealed_state(best_dir)
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


def _read_pointer(ckpt: Path, name: str) -> dict | None:
    path = ckpt / name
    if not path.exists():
        return None
    ptr = _read_json(path)
    step, bpb = ptr.get("step"), ptr.get("bpb")
    if not isinstance(step, int) or isinstance(step, bool) or ptr.get("dir") != step_dir_name(step):
        raise CheckpointError(f"pointer {path} is malformed: {ptr!r}")
    if bpb is not None and (not isinstance(bpb, int | float) or not math.isfinite(bpb)):
        raise CheckpointError(f"pointer {path} holds bpb={bpb!r}: not a finite score")
    if name == "best" and bpb is None:
        raise CheckpointError(f"pointer {path} holds no bpb: a best has a score")
    return ptr


def _read_json(path: Path) -> dict:
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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
