"""`dormouse bench`: check the flags, time each model asked for, append one row per model to the
history TSV as soon as that model is done (its full log beside it, in the log folder)."""

import gc
from collections.abc import Iterator
from pathlib import Path

import torch

from dormouse import run_lock
from dormouse.config import STEPS_AUTO, Config
from dormouse.errors import ConfigError
from dormouse.tools.bench.baseline_models import unavailable
from dormouse.tools.bench.baselines import BASELINES, bench_baseline
from dormouse.tools.bench.op import bench_kda_op
from dormouse.tools.bench.rows import RECORD_FILE, append_row
from dormouse.tools.bench.step import bench_step
from dormouse.tools.bench.timing import bench_context

DEFAULT_STEPS = 20
DEFAULT_DIR = Path("runs") / "bench"  # under the working directory, as `train`'s runs/<preset>-<time>


def _given(args, dest: str):
    return getattr(args, dest, None)


def cli(args) -> int:
    """`dormouse bench`: see the package docstring and docs/glossary.md."""
    from dormouse.config_flags import config_from_args

    cfg = config_from_args(args)
    steps = _given(args, "train.steps")
    if steps == STEPS_AUTO:
        raise ConfigError("--steps auto has no meaning for bench: it times a given number of steps")
    steps = steps or DEFAULT_STEPS
    if cfg.train.minutes:
        raise ConfigError("--minutes has no meaning for bench: it times --steps steps after --warmup")
    if args.warmup < 1:
        raise ConfigError(f"--warmup {args.warmup}: at least 1 (the first step is the cold start, never timed)")
    history = Path(args.history) if args.history else DEFAULT_DIR / RECORD_FILE
    log_dir = Path(args.log_dir) if args.log_dir else DEFAULT_DIR / "logs"
    if args.profile < 0:
        raise ConfigError(f"--profile {args.profile}: a number of steps, 0 or more")
    _check_models(args, cfg)
    with run_lock.held_for(history, "bench"):  # a --history in a run directory: from the start, no work lost
        _bench_and_record(args, cfg, steps, history, log_dir)
    return 0


def _check_models(args, cfg: Config) -> None:
    """Refuse what `--op`, `--model` and `--baselines` cannot time together, before anything runs."""
    if args.op == "kda":
        if args.compile or args.data or args.profile:
            raise ConfigError(
                "--op kda times the KDA op alone on synthetic inputs: --compile, --data and --profile do not apply"
            )
        if args.model != "dormouse" or args.baselines:
            raise ConfigError("--op kda times the KDA op alone: --model and --baselines do not apply")
    elif args.model != "dormouse":
        if args.baselines:
            raise ConfigError(
                f"--baselines runs every baseline after the dormouse row: drop --model {args.model}, "
                "or drop --baselines to bench it alone"
            )
        if args.data:
            raise ConfigError(f"--model {args.model} trains on random bytes: --data feeds dormouse's trainer only")
        why = unavailable(args.model, cfg.train.device)
        if why:
            raise ConfigError(f"--model {args.model}: {why}")


def _bench_and_record(args, cfg: Config, steps: int, history: Path, log_dir: Path) -> None:
    if args.op == "kda":
        results = [bench_kda_op(cfg, steps=steps, warmup=args.warmup, note=args.note, log_dir=log_dir)]
    else:
        results = bench(
            cfg,
            steps=steps,
            warmup=args.warmup,
            compiled=args.compile,
            data=args.data,
            note=args.note,
            log_dir=log_dir,
            profiled=args.profile,
            model=args.model,
            baselines=args.baselines,
        )
    for row, log_path in results:  # each row is appended as soon as its model is done
        append_row(history, row)
        print(f"bench: appended a row ({row['model']}) to {history}; log {log_path}")
        for key in ("ms_per_step", "tokens_per_s", "peak_mem_gib", "mfu", "first_step_s", "kernels"):
            print(f"  {key} = {row[key]}")


def bench(
    cfg: Config,
    *,
    steps: int,
    warmup: int,
    compiled: bool,
    data,
    note: str,
    profiled: int = 0,
    log_dir: Path,
    model: str = "dormouse",
    baselines: bool = False,
) -> Iterator[tuple[dict[str, str], Path]]:
    """Bench `model` (dormouse, gpt or fla-kda), then with `baselines` every baseline this device can run
    (the others are skipped with the reason printed); yield (the TSV row, the log path) of each model as
    soon as it is done, its log written."""
    ctx = bench_context(
        cfg, steps=steps, warmup=warmup, compiled=compiled, profiled=profiled, note=note, log_dir=log_dir
    )
    for name in (model, *(BASELINES if baselines else ())):
        why = "" if name == "dormouse" else unavailable(name, ctx.device)
        if why:
            print(f"bench: skipping baseline {name}: {why}")
            continue
        if ctx.device.type == "cuda":  # each model's peak memory is its own
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(ctx.device)
        yield bench_step(ctx, data) if name == "dormouse" else bench_baseline(ctx, name)
        ctx.models_before += 1
