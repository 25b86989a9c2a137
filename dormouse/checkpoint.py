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

This module knows nothing of how the model is built: it takes and returns state dicts. Reading a
directory back and verifying it is dormouse/checkpoint_files.py's.

state.json is sealed: the model file's metadata holds the sha256 of its body (every key but `files`,
which the model file's own hash is in), so a hand edit of state.json (a lowered best_bpb, another
run_id) is refused at load, naming state.json. The `best` pointer and a checkpoint's best_bpb must
agree with the sealed state.json of the best directory, and with the run's metrics.jsonl: its eval
records up to the checkpoint's step score their lowest bpb at best_step (dormouse/metrics.py).

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

import json
import math
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from dormouse import ledger, metrics
from dormouse.checkpoint_files import (
    FILE_MISSING,
    FORMAT,
    MODEL,
    OPTIMIZER,
    OPTIMIZER_KEY,
    STATE,
    STATE_KEYS,
    STEP_DIR,
    Checkpoint,
    check_best_pointer,
    load_dir,
    read_pointer,
    resolve,
    sealed_state,
    sha256,
    state_seal,
    step_dir_name,
)
from dormouse.errors import CheckpointError

ORPHAN_REMOVED = ledger.register(
    "checkpoint.orphan_removed",
    ledger.Kind.COUNTED,
    "a step directory newer than `last` (writer killed before the commit) was removed by the next save",
    __name__,
)
_STEM = re.compile(r"[a-z][a-z0-9_]*")


def _no_hook(point: str) -> None:
    pass


# Test seam: called with the name of each point of a save, so that the kill test can stop a writer
# there (tests/ckpt_writer.py). It does nothing in normal use.
_at: Callable[[str], None] = _no_hook


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
        meta = {"step": str(step), "kind": kind, **({"state": state_seal(body)} if kind == "model" else {})}
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
    path, pointed = resolve(Path(run_dir) / "ckpt", which)
    try:
        ck = load_dir(path, pointed, which, device)
    except FileNotFoundError as e:  # checked present, then gone: a concurrent save pruned it
        raise ledger.refuse(FILE_MISSING, f"{e.filename} vanished while it was being loaded") from e
    metrics.check_best(run_dir, ck.state, path)
    return ck


def best_bpb(run_dir: str | os.PathLike) -> float | None:
    """The held-out bpb `best` points to, or None when the run has no best yet."""
    ptr = read_pointer(Path(run_dir) / "ckpt", "best")
    return None if ptr is None else ptr["bpb"]


def last_step(run_dir: str | os.PathLike) -> int | None:
    """The step `last` points to (the newest committed checkpoint), or None when there is none."""
    ptr = read_pointer(Path(run_dir) / "ckpt", "last")
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
        prev = sealed_state(ckpt / last["dir"])
        if prev.get("run_id") != body["run_id"]:
            raise CheckpointError(
                f"run_id {body['run_id']!r} differs from {prev.get('run_id')!r} in {ckpt / last['dir'] / STATE}: "
                "one run directory holds one run"
            )
    best = read_pointer(ckpt, "best")
    if best is not None:
        check_best_pointer(ckpt, best)
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
    last = read_pointer(ckpt, "last")
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
        prev = sealed_state(ckpt / last["dir"])
        best = read_pointer(ckpt, "best")
        if prev.get("best_step") == last["step"] and (best is None or best["step"] != last["step"]):
            _write_pointer(ckpt, "best", last["step"], prev["best_bpb"])  # killed between `last` and `best`
    return last


def _prune(ckpt: Path, keep_last: int) -> None:
    last, best = read_pointer(ckpt, "last"), read_pointer(ckpt, "best")
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
        m = STEP_DIR.fullmatch(entry.name)
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
    return {"sha256": sha256(path), "step": step, "size": path.stat().st_size}


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
