"""`dormouse replay`: run one training step in two fresh processes and compare the results bitwise.

The cheapest loud detector of a non-deterministic training stack. An autotuner that picks between
kernels that disagree numerically by a timing race picks differently in every process, and the
corrupted runs look like slow arms; a step replayed twice from the same state shows it at once.

The state at step N is checkpoint `step-N` of a run (`checkpoint.step_dir_name(N)`): the weights and
optimizer state after N updates, which train batch N next. Each of two fresh processes
(`python -m dormouse.tools.replay --worker ...`, one after the other) resumes a `Trainer` from it with
the run's recorded config and corpus, through the trainer's own resume path (a temporary run
directory whose `last` points at a link to the step directory: the checkpoint is verified and loaded
exactly as `dormouse train --resume` loads it), runs `Trainer.train_step(N)` once (the trainer's
own step: forward, backward, clip, routed optimizers) and writes a JSON with:

    loss       the step's training cross-entropy (what train_step returns), float.hex()
    grad_norm  the global gradient norm before clipping (StepRunner.grad_norm), float.hex()
    weights    sha256 over the model's state dict after the update, in state-dict order: for each entry
               its name, dtype and shape, then its raw bytes

The parent compares them in that order and prints `IDENTICAL step=N loss=… grad_norm=… weights=<sha
prefix>` (exit 0) or `DIFFERS at <field>: <a> != <b>` (exit 1). Floats are printed with repr(), which
round-trips, so equal text means equal bits. A worker that fails is an error (exit 2), never a
verdict. The run directory is only read: its train.log and metrics.jsonl are not touched.

Without RUN, the config flags describe a model that is first trained for N steps (default 1) in a
temporary run on the CPU or GPU the config resolves to, checkpointed, and replayed from there.

Test seam, read by the worker only and nowhere else in dormouse: with DORMOUSE_REPLAY_INJECT_NOISE=1
in its environment a worker multiplies the step's loss and ce by 1 + k·2⁻²³ (k drawn from os.urandom,
1 ≤ k < 2¹⁶) before backward: a non-deterministic op, which replay must report as DIFFERS (the two
workers draw the same k with probability 1/65535). The workers say when they injected noise, and the
parent prints it.
"""

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from dormouse import checkpoint, metrics
from dormouse.config import Config
from dormouse.config_checks import validate
from dormouse.errors import CheckpointError, ConfigError, DormouseError

INJECT_ENV = "DORMOUSE_REPLAY_INJECT_NOISE"
FIELDS = ("loss", "grad_norm", "weights")  # compared in this order
_TAIL = 4000  # characters of a failed worker's output shown


@dataclasses.dataclass
class Verdict:
    identical: bool
    line: str
    results: tuple[dict, dict]


# ---- the parent ------------------------------------------------------------------------------------------------


def replay_run(run: str | Path, step: int | None = None, data: str | Path | None = None) -> Verdict:
    """Replay the step after checkpoint `step` of `run` (default: its last checkpoint) in two processes."""
    from dormouse.runs import run_config

    run = Path(run)
    cfg = run_config(run)  # refuses a directory that is not a run
    if step is None:
        step = checkpoint.last_step(run)
        if step is None:
            raise CheckpointError(f"run {run} has no checkpoint yet: nothing to replay")
    _check_checkpoint(run, step)
    if cfg.train.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"run {run} trained on cuda and replays on its own config, but torch sees no CUDA device")
    with tempfile.TemporaryDirectory(prefix="dormouse-replay-") as tmp:
        results = _run_workers(run, step, data, Path(tmp))
    return compare(step, *results)


def replay_config(cfg: Config, step: int, data: str | Path | None = None) -> Verdict:
    """Train `cfg` for `step` steps in a temporary run, checkpoint it, then replay the next step."""
    from dormouse.runs import open_corpus
    from dormouse.train.trainer import Trainer

    if step < 0:
        raise ConfigError(f"--step {step}: a step is a number of completed updates (>= 0)")
    corpus, note = open_corpus(data)
    with tempfile.TemporaryDirectory(prefix="dormouse-replay-") as tmp:
        run = Path(tmp) / "run"
        trainer = Trainer(cfg, corpus, run, corpus_note=note)
        for s in range(step):
            trainer.train_step(s)
        trainer.step = step
        trainer.save(is_best=False)
        del trainer
        results = _run_workers(run, step, data, Path(tmp))
    return compare(step, *results)


def compare(step: int, a: dict, b: dict) -> Verdict:
    """Field by field, in FIELDS order; the first difference decides."""
    for name in FIELDS:
        if a[name] != b[name]:
            return Verdict(False, f"DIFFERS at {name}: {_show(name, a[name])} != {_show(name, b[name])}", (a, b))
    line = (
        f"IDENTICAL step={step} loss={_show('loss', a['loss'])} grad_norm={_show('grad_norm', a['grad_norm'])} "
        f"weights={a['weights'][:16]}"
    )
    return Verdict(True, line, (a, b))


def recorded_ce(run: Path, step: int) -> float | None:
    """The ce the run itself logged for train_step(step) (metrics.jsonl record step+1), if it is there."""
    for record in metrics.records(run):
        if record["kind"] == "train" and record["step"] == step + 1:
            return record["ce"]
    return None


def cli(args: argparse.Namespace) -> int:
    """`dormouse replay [RUN] [--step N] [--data DIR] [config flags]`: print the verdict, 0 identical / 1 differs."""
    from dormouse.config_flags import config_from_args

    given = _config_flags_given(args)
    if args.run is not None:
        if given:
            raise ConfigError(
                f"a run replays with its own recorded config: {', '.join(given)} cannot be given with RUN"
            )
        verdict = replay_run(args.run, args.step, args.data)
    else:
        cfg = config_from_args(args)
        step = 1 if args.step is None else args.step
        print(f"replay: no RUN given; training {step} step(s) of the {cfg.preset} config in a temporary run first")
        verdict = replay_config(cfg, step, args.data)
    for r in verdict.results:
        if r["injected_noise"] is not None:
            print(f"note: worker {r['pid']} injected noise (x{r['injected_noise']!r}, {INJECT_ENV}=1)")
    print(verdict.line)
    if args.run is not None:
        step = verdict.results[0]["step"]
        ce = recorded_ce(Path(args.run), step)
        if ce is not None:
            same = float.fromhex(verdict.results[0]["loss"]) == ce
            print(
                f"run record: train_step({step}) logged ce={ce!r} in metrics.jsonl "
                f"({'equal to' if same else 'NOT equal to'} worker a's; informational, not part of the verdict)"
            )
    return 0 if verdict.identical else 1


def _config_flags_given(args: argparse.Namespace) -> list[str]:
    given = [f"--{k}" for k in ("preset", "config") if getattr(args, k, None) is not None]
    for dest, value in vars(args).items():
        if "." in dest and value not in (None, False):
            given.append("--" + dest.split(".", 1)[1].replace("_", "-"))
    return given


def _show(name: str, value: str) -> str:
    return value if name == "weights" else repr(float.fromhex(value))


def _check_checkpoint(run: Path, step: int) -> None:
    if not isinstance(step, int) or step < 0:
        raise ConfigError(f"--step {step}: a step is a number of completed updates (>= 0)")
    ckpt = run / "ckpt"
    if (ckpt / checkpoint.step_dir_name(step)).is_dir():
        return
    have = sorted(p.name for p in ckpt.glob("step-*") if p.is_dir()) if ckpt.is_dir() else []
    raise CheckpointError(
        f"run {run} has no checkpoint after {step} updates ({ckpt / checkpoint.step_dir_name(step)} is missing); "
        f"it has: {', '.join(have) or 'none'} (a run keeps its last keep_last checkpoints and its best)"
    )


def _run_workers(run: Path, step: int, data, tmp: Path) -> tuple[dict, dict]:
    """Run worker a, then worker b (one after the other: two CPU workers at once would oversubscribe the
    cores, and OpenMP slows down by an order of magnitude then); each writes its JSON and output to `tmp`."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the directory that holds the dormouse package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    results = []
    for name in ("a", "b"):
        cmd = [sys.executable, "-m", "dormouse.tools.replay", "--worker", "--run", str(run), "--step", str(step)]
        cmd += ["--out", str(tmp / f"{name}.json")] + (["--data", str(data)] if data is not None else [])
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, check=False)
        if proc.returncode != 0:
            out = proc.stdout.decode(errors="replace")[-_TAIL:]
            raise DormouseError(f"replay worker {name} exited with status {proc.returncode}; its output ends:\n{out}")
        results.append(json.loads((tmp / f"{name}.json").read_text()))
    return results[0], results[1]


# ---- the worker ------------------------------------------------------------------------------------------------


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 over every state-dict entry in order: name, dtype, shape, then the raw bytes (on the CPU)."""
    h = hashlib.sha256()
    for name, value in model.state_dict().items():
        t = value.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def replay_step(run: Path, step: int, data: str | Path | None) -> dict:
    """Resume a Trainer from checkpoint `step` of `run` (the trainer's own resume path), run train_step(step) once."""
    from dormouse.runs import run_config, run_corpus
    from dormouse.train.trainer import Trainer

    cfg = run_config(run)
    validate(cfg)
    corpus, note = run_corpus(run, data)
    noise = _noise_factor() if os.environ.get(INJECT_ENV) == "1" else None
    with tempfile.TemporaryDirectory(prefix="dormouse-replay-worker-") as tmp:
        view = _run_view(Path(run), step, Path(tmp) / "run")
        trainer = Trainer(cfg, corpus, view, corpus_note=note, resume=True)
        if trainer.step != step:
            raise CheckpointError(f"checkpoint {step} of {run} restored step {trainer.step}")
        if noise is not None:
            _inject(trainer.model, noise)
        ce = trainer.train_step(step)
        return {
            "step": step,
            "loss": float(ce).hex(),
            "grad_norm": float(trainer.step_runner.grad_norm).hex(),
            "weights": weights_sha256(trainer.model),
            "device": cfg.train.device,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "pid": os.getpid(),
            "injected_noise": noise,
        }


def _run_view(run: Path, step: int, view: Path) -> Path:
    """A run directory whose `last` is checkpoint `step` of `run`, for Trainer(resume=True): run.json is
    copied and the step directory linked, so the checkpoint is loaded (and verified) exactly as a resume
    loads it, and nothing is ever written into `run`."""
    name = checkpoint.step_dir_name(step)
    (view / "ckpt").mkdir(parents=True)
    shutil.copyfile(run / "run.json", view / "run.json")
    (view / "ckpt" / name).symlink_to((run / "ckpt" / name).resolve(), target_is_directory=True)
    checkpoint._write_pointer(view / "ckpt", "last", step, None)  # the pointer format is checkpoint.py's
    return view


def _noise_factor() -> float:
    k = 1 + int.from_bytes(os.urandom(2), "little") % 0xFFFF
    return 1.0 + k * 2.0**-23  # exact in fp32 and bf16-autocast losses (the ce is computed in fp32)


def _inject(model: torch.nn.Module, factor: float) -> None:
    """Scale the loss and ce of every forward by `factor` (an instance attribute shadows the method)."""
    forward = model.forward

    def noisy(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.loss = out.loss * factor
        out.ce = out.ce * factor
        return out

    model.forward = noisy


def _worker_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dormouse.tools.replay", description="one replay worker")
    p.add_argument("--worker", action="store_true", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--data", default=None)
    args = p.parse_args(argv)
    try:
        result = replay_step(Path(args.run), args.step, args.data)
    except DormouseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
