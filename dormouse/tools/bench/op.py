"""`dormouse bench --op kda`: time one forward+backward of the KDA op alone, on synthetic inputs
(dormouse/tools/kda_op.py, the inputs the GPU gate checks), at the config's shape and backend."""

import datetime
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from dormouse import counters
from dormouse.config import Config
from dormouse.errors import ConfigError
from dormouse.model import precision
from dormouse.ops.fla import pin as fla_pin
from dormouse.tools.bench.device import (
    device_name,
    device_slug,
    fla_version,
    measure_peak,
    peak_memory,
    peak_tflops,
    sync,
)
from dormouse.tools.bench.flops import mixer_fwd_flops
from dormouse.tools.bench.provenance import git_commit, repo_root
from dormouse.tools.bench.rows import NOT_TRAINED, cell, free_name, shown_path, timing_columns
from dormouse.tools.kda_op import op_step


def bench_kda_op(cfg: Config, *, steps: int, warmup: int, note: str, log_dir: Path) -> tuple[dict[str, str], Path]:
    """Time one forward+backward of the KDA op alone at B=batch_size, T=seq_len, H=n_heads, K=V=head_dim of
    `cfg`, with its resolved kda_backend and dtype; the row's model is `kda-op`. FLOPs: 3·B·T·M with M
    the mixer's forward FLOPs per position (flops.py), MFU against the same peak."""
    m, t = cfg.model, cfg.train
    if m.mixer != "kda":
        raise ConfigError("--op kda times the KDA mixer: drop --no-kda / --mixer attention")
    device = torch.device(t.device)
    started = datetime.datetime.now(datetime.UTC)
    load_start = os.getloadavg()[0]
    shape = (t.batch_size, t.seq_len, m.n_heads, m.head_dim)
    dtype = torch.bfloat16 if t.dtype == "bf16" else torch.float32
    precision_note = precision.apply(t.dtype)
    measured, _ = measure_peak(device, t.dtype)
    peak, peak_source = peak_tflops(device, t.dtype, measured)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    step = op_step(shape, dtype, device, m.kda_backend, m.kda_chunk_size)
    counters.KDA.reset()
    times = []
    for _ in range(warmup + steps):
        sync(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    C, (B, T, H, K) = m.kda_chunk_size, shape
    flops = 3 * B * T * mixer_fwd_flops("kda", H, K, C, T)
    mem_gib, mem_source = peak_memory(device)
    commit = git_commit(repo_root())
    log_path = free_name(Path(log_dir), f"{started.strftime('%Y-%m-%d-%H%M%S')}-kda-op-{device_slug(device)}", ".log")
    row = {
        "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "device": device_name(device),
        "model": "kda-op",
        "preset": cfg.preset,
        "batch": str(B),
        "seq_len": str(T),
        "dtype": t.dtype,
        "compiled": "no",
        "arms": f"kda({m.kda_backend}),H={H},K={K},C={C}",
        "peak_mem_gib": f"{mem_gib:.4f}",
        "torch": torch.__version__,
        "fla": fla_version(),
        "log": shown_path(log_path),
        "note": note,
        **timing_columns(times, warmup, B * T, flops, peak),
        "peak_source": peak_source,
        "mem_source": mem_source,
        "kernels": f"kda={counters.KDA}",
        "params": "0",
        "loadavg": f"{load_start:.2f}/{os.getloadavg()[0]:.2f}",
        **NOT_TRAINED,
    }
    row = {k: cell(v) for k, v in row.items()}
    log = [
        f"dormouse bench --op kda {started.isoformat(timespec='seconds')}",
        "command: " + shlex.join(["dormouse", *sys.argv[1:]]),
        f"commit: {commit}",
        f"device: {device_name(device)}; torch {torch.__version__}; fla {fla_version()}; {precision_note}",
        *([fla_pin.pin_note()] if m.kda_backend == "fla" else []),
        f"op: kda forward+backward, backend {m.kda_backend}, B,T,H,K={shape}, {t.dtype}, chunk {C}",
        *(f"call {i} {'warmup' if i < warmup else 'timed'} ms={x * 1000:.3f}" for i, x in enumerate(times)),
        f"kernel choices not from the pin: {fla_pin.count_unpinned() if m.kda_backend == 'fla' else '-'}",
        f"peak used for MFU: {peak:.4g} TFLOP/s ({peak_source}); matmul measured {measured:.4g} TFLOP/s",
        "---- row",
        *(f"{k}\t{v}" for k, v in row.items()),
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("\n".join(log) + "\n")
    return row, log_path
