"""Run directories as the tools see them: their config, their corpus, a model from a checkpoint.

Eval and decode load models through here, without importing the trainer. A run's files are read
with one `error:` line for each way they can be missing or malformed, and a run's config.json is
checked against the config its checkpoint was trained with: an edit is refused naming the field.
"""

import json
import os
import secrets
from pathlib import Path

import torch

from dormouse import checkpoint
from dormouse.checkpoint_files import sealed_state
from dormouse.config import Config
from dormouse.config_flags import RESUMABLE, RESUMABLE_FLAGS
from dormouse.data.default_corpus import default_corpus_dir, describe_default_corpus
from dormouse.data.shards import Corpus, load_corpus
from dormouse.errors import ConfigError
from dormouse.model import precision
from dormouse.resolve import resolve
from dormouse.train.ema import EMA_FILE, load_average_


def open_corpus(data: str | Path | None) -> tuple[Corpus, str]:
    """The corpus at `data`, or the embedded default corpus; and a one-line description for headers."""
    if data is None:
        corpus = load_corpus(default_corpus_dir())
        return corpus, describe_default_corpus()
    corpus = load_corpus(data)
    note = (
        f"{corpus.root}: {corpus.split_size('train')} bytes train / {corpus.split_size('heldout')} bytes "
        f"held-out, fingerprint {corpus.fingerprint[:12]}"
    )
    return corpus, note


def make_run_dir(run: str | Path) -> Path:
    """Create the directory of a new run (`train --out`), refusing a path that cannot be one."""
    run = Path(run)
    if run.exists() and not run.is_dir():
        raise ConfigError(f"--out {run} is an existing file, not a directory: give a new directory")
    try:
        run.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {run}: cannot create the run directory ({e.strerror}): give a writable place") from e
    if not os.access(run, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {run}: the directory is not writable: give a writable place")
    return run


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step: a reader sees the old file or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path.parent} is not a run directory: {path} is missing ({what})") from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON ({e}): it holds {what}; restore it from a copy") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a JSON object: it holds {what}; restore it from a copy")
    return data


def run_config_dict(run: str | Path) -> dict:
    """RUN/config.json as written (resolved values), checked to be a JSON object."""
    return _read_json(Path(run) / "config.json", "the run's config")


def run_config(run: str | Path) -> Config:
    return Config.from_dict(run_config_dict(run))


def run_meta(run: str | Path) -> dict:
    """RUN/run.json: run_id, the corpus path and fingerprint; once a run has trained, its result too
    (best_step, best_bpb, best_checkpoint, last_eval_step, last_eval_bpb, early_stop_step)."""
    path = Path(run) / "run.json"
    meta = _read_json(path, "the run's id and corpus")
    for key in ("run_id", "corpus", "fingerprint"):
        if not isinstance(meta.get(key), str):
            raise ConfigError(f"{path}: {key} is {meta.get(key)!r}, expected a string; restore it from a copy")
    return meta


def result_line(run: str | Path, result: dict) -> str:
    """A run's result (run.json's best_step, best_bpb, best_checkpoint, last_eval_step, last_eval_bpb) as
    train's last line: `result: best held-out B bpb at step S (RUN/ckpt/step-S, --ckpt best); last eval L
    bpb at step T`."""
    if result.get("best_step") is None:
        return "result: no held-out eval yet"
    where = f"{Path(run) / result['best_checkpoint']}, --ckpt best"
    line = f"result: best held-out {result['best_bpb']:.4f} bpb at step {result['best_step']} ({where})"
    if result.get("last_eval_step") is not None:
        line += f"; last eval {result['last_eval_bpb']:.4f} bpb at step {result['last_eval_step']}"
    return line


def config_changes(config: dict, ck: checkpoint.Checkpoint, where: str) -> dict[str, list]:
    """{field: [checkpoint's value, `config`'s value]} of the RESUMABLE fields that differ between
    `config` (a Config.to_dict) and the config checkpoint `ck` was trained with; any other difference
    is refused naming the field: it shapes the model, its tables or its training."""
    return _config_changes(config, ck.state, ck.path, where)


def check_config_json(run: str | Path) -> None:
    """RUN/config.json against the config its `last` checkpoint was trained with (its sealed state.json,
    no tensors read), before a resume builds anything from it: an edit outside RESUMABLE is refused, a
    field or section removed included."""
    path = Path(run) / "ckpt" / checkpoint.step_dir_name(checkpoint.last_step(run))
    _config_changes(run_config_dict(run), sealed_state(path), path, f"{Path(run) / 'config.json'}")


def _config_changes(config: dict, state: dict, path: Path, where: str) -> dict[str, list]:
    saved = state["extra"].get("config") if isinstance(state.get("extra"), dict) else None
    if not isinstance(saved, dict):
        raise ConfigError(f"{path} records no config: it was not written by `dormouse train`")
    changed = {}
    for name, value, was in _differences(config, saved):
        if name not in RESUMABLE:
            raise ConfigError(
                f"{name} is {value!r} in {where}, but checkpoint {path} was trained with {was!r}: only "
                f"{RESUMABLE_FLAGS} may differ; restore {name}"
            )
        changed[name] = [was, value]
    return changed


def _differences(new: dict, old: dict, prefix: str = ""):
    for key in sorted(set(new) | set(old)):
        a, b = new.get(key), old.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            yield from _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            yield f"{prefix}{key}", a, b


def run_corpus(run: str | Path, data: str | Path | None) -> tuple[Corpus, str]:
    """The corpus a run trained on (from run.json), or `data` when given."""
    if data is not None:
        return open_corpus(data)
    meta = run_meta(run)
    corpus, note = open_corpus(meta["corpus"])
    if corpus.fingerprint != meta["fingerprint"]:
        raise ConfigError(f"the corpus at {meta['corpus']} changed since run {run} trained on it (fingerprint)")
    return corpus, note


def load_model(run: str | Path, which: str = "best", device: str = "cpu"):
    """(model in eval mode, resolved config, checkpoint) from a verified checkpoint of `run`."""
    from dormouse.model.model import DormouseLM
    from dormouse.ops import passes

    config = run_config_dict(run)
    cfg = Config.from_dict(config)
    ck = checkpoint.load(run, which)
    config_changes(config, ck, f"{Path(run) / 'config.json'}")
    # The KDA, norm, conv and SwiGLU backends compute one function (tests/test_kda.py, tests/gpu/): pick this
    # device's.
    m = cfg.model
    cfg.train.device, m.kda_backend, m.norm_backend, m.conv_backend, m.swiglu_backend = device, *["auto"] * 4
    if torch.device(device).type == "cpu":
        cfg.train.dtype = "fp32"  # eval and decode run without autocast; the CPU has no bf16/tf32 path
    cfg = resolve(cfg, cuda_available=torch.cuda.is_available())
    precision.apply(cfg.train.dtype)
    model = passes.schedule(DormouseLM(cfg.model, seed=cfg.train.seed))
    model.load_checkpoint_parts(ck.model_state, ck.tensors, ck.state["extra"])
    if cfg.train.ema_decay:  # the run scored its average: so do eval and decode
        load_average_(model, ck.tensors.get(EMA_FILE))
    return model.to(device).eval(), cfg, ck
