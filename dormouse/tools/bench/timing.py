"""What every model one `dormouse bench` times shares: the log's head, the peak, the per-step timer,
the row's common cells and the log's tail.

`--warmup W` steps run first (the first of them is `first_step_s`, the cold start with any compilation
or autotuning); then `--steps N` steps are timed one by one, with torch.cuda.synchronize() around each
on CUDA and perf_counter on both. `ms_per_step` is their median, `ms_min`/`ms_max` and `ms_iqr` their
spread. On a shared CPU the 1-minute load average at start and end is recorded (`loadavg`): a loaded
machine makes every CPU figure slower.
"""

import datetime
import json
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dormouse.config import Config
from dormouse.model import precision
from dormouse.tools.bench.device import PEAK_REPS, device_name, fla_version, measure_peak, peak_tflops, sync
from dormouse.tools.bench.flops import FlopCount
from dormouse.tools.bench.provenance import git_commit, repo_root
from dormouse.tools.bench.rows import NOT_TRAINED, cell, shown_path


@dataclass
class BenchContext:
    """What every row of one `dormouse bench` shares: the config, the device facts and the log's head."""

    cfg: Config
    device: torch.device
    commit: str
    head: list[str]  # the first lines of every log of this bench
    peak: float
    peak_source: str
    steps: int
    warmup: int
    compiled: bool
    profiled: int
    note: str
    log_dir: Path
    models_before: int = 0  # models this process benched already (their memory is in the CPU's ru_maxrss)


def bench_context(cfg: Config, *, steps: int, warmup: int, compiled: bool, profiled: int, note: str, log_dir: Path):
    """The shared facts of one bench: the log's head, then the precision applied and the peak measured
    (before any kernel compiles)."""
    t = cfg.train
    device = torch.device(t.device)
    commit = git_commit(repo_root())
    head = [
        f"dormouse bench {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}",
        "command: " + shlex.join(["dormouse", *sys.argv[1:]]),
        f"commit: {commit}",
        f"device: {device_name(device)}; torch {torch.__version__}; fla {fla_version()}; python "
        f"{platform.python_version()}; float32 matmul precision {torch.get_float32_matmul_precision()}",
        f"loadavg at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]
    head.append(precision.apply(t.dtype))  # before the peak matmul and any kernel compiles
    measured, n = measure_peak(device, t.dtype)
    peak, peak_source = peak_tflops(device, t.dtype, measured)
    head.append(f"matmul {t.dtype} {n}^3 measured this run, best of {PEAK_REPS}: {measured:.4g} TFLOP/s")
    head.append(f"peak used for MFU: {peak:.4g} TFLOP/s ({peak_source})")
    return BenchContext(cfg, device, commit, head, peak, peak_source, steps, warmup, compiled, profiled, note, log_dir)


def time_steps(step, first: int, n: int, phase: str, device: torch.device, log: list[str]) -> list[float]:
    """Run `step(s)` for s in first … first+n−1, each timed on its own (synchronised on CUDA); the log
    gets each step's time and returned cross-entropy."""
    times = []
    for s in range(first, first + n):
        sync(device)
        t0 = time.perf_counter()
        ce = step(s)
        sync(device)
        times.append(time.perf_counter() - t0)
        log.append(f"step {s} {phase} ms={times[-1] * 1000:.3f} ce={ce:.6f}")
    return times


def make_row(
    ctx: BenchContext, started, model: str, arms: str, timing: dict, mem: tuple, log_path: Path, **cols
) -> dict:
    """A TSV row: the bench's shared columns, this model's and `cols` (kernels, params, loadavg)."""
    t = ctx.cfg.train
    mem_gib, mem_source = mem
    if ctx.device.type != "cuda" and ctx.models_before:
        mem_source += f"; includes the {ctx.models_before} model(s) benched before it in this process"
    row = {
        "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": ctx.commit,
        "device": device_name(ctx.device),
        "model": model,
        "preset": ctx.cfg.preset,
        "batch": str(t.batch_size),
        "seq_len": str(t.seq_len),
        "dtype": t.dtype,
        "compiled": "yes" if ctx.compiled else "no",
        "arms": arms,
        "peak_mem_gib": f"{mem_gib:.4f}",
        "torch": torch.__version__,
        "fla": fla_version(),
        "log": shown_path(log_path),
        "note": ctx.note,
        **timing,
        "peak_source": ctx.peak_source,
        "mem_source": mem_source,
        **NOT_TRAINED,
        **cols,
    }
    return {k: cell(v) for k, v in row.items()}


def write_log(log_path: Path, log: list[str], row: dict[str, str]) -> None:
    log += ["---- row", *(f"{k}\t{v}" for k, v in row.items())]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("\n".join(log) + "\n")


def dynamo_stats() -> str:
    """torch._dynamo's own counters (graphs, graph breaks, recompiles) as one line."""
    import torch._dynamo.utils

    counts = getattr(torch._dynamo.utils, "counters", {})
    return json.dumps({k: dict(v) for k, v in counts.items() if k in ("stats", "graph_break", "recompiles")})


def tail_lines(row: dict, timing: dict, flops: FlopCount, peak: float) -> list[str]:
    """The log's peak memory, load and FLOPs lines, the same for dormouse and the baselines."""
    return [
        f"peak memory: {row['peak_mem_gib']} GiB ({row['mem_source']})",
        f"loadavg at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "---- FLOPs (formula: dormouse/tools/bench/flops.py, docs/glossary.md)",
        flops.describe(),
        f"achieved {timing['achieved_tflops']} TFLOP/s at the median step; MFU {timing['mfu']} of {peak:.4g} TFLOP/s",
    ]


def graphs_compiled() -> int:
    import torch._dynamo.utils

    return torch._dynamo.utils.counters["stats"]["unique_graphs"]
