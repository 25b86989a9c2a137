"""`dormouse bench --model gpt|fla-kda` and `--baselines`: time a same-size baseline's step the way the
trainer's is timed (the models: baseline_models.py).

`--model gpt` (row model `gpt-sdpa`, a plain GPT with torch's SDPA) or `--model fla-kda` (fla's
KDAForCausalLM; CUDA and fla only, refused elsewhere) times that model instead of dormouse, at the
config's sizes with block_layers · depth real layers, on random bytes; `--baselines` times each
baseline the device can run after the dormouse row, in the same process and the same way (the others
are skipped with the reason printed), one row and one log each.
"""

import datetime
import json
import os
from pathlib import Path

from dormouse.ops.fla import pin as fla_pin
from dormouse.tools.bench.baseline_models import ROW_NAMES, baseline_step, n_layers
from dormouse.tools.bench.device import device_slug, peak_memory
from dormouse.tools.bench.flops import count_baseline_flops
from dormouse.tools.bench.profiling import profile_steps
from dormouse.tools.bench.rows import free_name, timing_columns
from dormouse.tools.bench.timing import BenchContext, dynamo_stats, make_row, tail_lines, time_steps, write_log

BASELINES = ("gpt", "fla-kda")


def bench_baseline(ctx: BenchContext, name: str) -> tuple[dict[str, str], Path]:
    """Time baseline `name`'s step (baseline_models.py) as the trainer's is timed; write the log; return
    (the TSV row, the log path)."""
    cfg, device, warmup, steps, profiled = ctx.cfg, ctx.device, ctx.warmup, ctx.steps, ctx.profiled
    m, t = cfg.model, cfg.train
    started = datetime.datetime.now(datetime.UTC)
    load_start = os.getloadavg()[0]
    model_name = ROW_NAMES[name]
    layers = f"L={n_layers(m)},d={m.d_model},H={m.n_heads},K={m.head_dim},ffn={m.ffn_hidden}"
    arms_cell = f"{model_name},{layers}" + (",short_conv" if name == "fla-kda" and m.short_conv else "")
    log = list(ctx.head)
    source = "dormouse/tools/bench/baseline_models.py"
    log.append(f"---- baseline {model_name} ({arms_cell}): {source}; random bytes, stream `bench`")
    if name == "fla-kda":
        log.append(fla_pin.pin_note())
    model, step = baseline_step(name, cfg, device, compiled=ctx.compiled)
    flops = count_baseline_flops(model, cfg, name)
    params = sum(p.numel() for p in model.parameters())
    log.append(f"model: {params:,} parameters, {n_layers(m)} layers; compiled: {ctx.compiled}")
    log.append(f"---- {warmup} warm-up step(s), then {steps} timed step(s)")
    times = time_steps(step, 0, warmup, "warmup", device, log)
    times += time_steps(step, warmup, steps, "timed", device, log)
    mem_gib, mem_source = peak_memory(device)
    unpinned = fla_pin.count_unpinned() if name == "fla-kda" else None
    dynamo = dynamo_stats() if ctx.compiled else None
    profile = profile_steps(step, warmup + steps, profiled, device) if profiled else None
    del model, step
    timing = timing_columns(times, warmup, t.batch_size * t.seq_len, flops.per_step, ctx.peak)
    stamp = started.strftime("%Y-%m-%d-%H%M%S")
    log_path = free_name(Path(ctx.log_dir), f"{stamp}-{cfg.preset}-{model_name}-{device_slug(device)}", ".log")
    row = make_row(
        ctx,
        started,
        model_name,
        arms_cell,
        timing,
        (mem_gib, mem_source),
        log_path,
        kernels="-",
        params=str(params),
        loadavg=f"{load_start:.2f}/{os.getloadavg()[0]:.2f}",
    )
    log += [
        "---- counts",
        *([f"fla kernel choices not from the pin (new in this process): {unpinned}"] if unpinned is not None else []),
        *([f"torch._dynamo counters: {dynamo}"] if dynamo is not None else []),
        *([f"---- torch.profiler over {profiled} more step(s), not timed", profile] if profile else []),
        *tail_lines(row, timing, flops, ctx.peak),
        "---- config (a baseline takes d_model, n_heads, head_dim, block_layers, depth, ffn_hidden, norm_eps, "
        "short_conv, conv_size, seed, batch_size, seq_len, lr, weight_decay, grad_clip, dtype and device)",
        json.dumps(cfg.to_dict(), sort_keys=True),
    ]
    write_log(log_path, log, row)
    return row, log_path
