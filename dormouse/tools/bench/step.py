"""`dormouse bench` (`--op step`, `--model dormouse`): time the trainer's own training step.

A step is `Trainer.train_step`: batch (seed, step) from the sampler, forward, backward, grad clip and
the routed optimizers' step, exactly what `dormouse train` runs (there is no second training step).
The model trains on the default corpus (or `--data`) in a temporary run directory. The kernel counters
(counters.ALL) over the timed steps go in the `kernels` column and the log; under `--compile` they are
Python side effects that dynamo replays, breaks on or recompiles for, so the log adds torch._dynamo's
counters.
"""

import datetime
import json
import os
import tempfile
from pathlib import Path

import torch

from dormouse import counters, ledger
from dormouse.ops.fla import pin as fla_pin
from dormouse.tools.bench.device import device_slug, peak_memory
from dormouse.tools.bench.flops import count_flops
from dormouse.tools.bench.profiling import profile_steps
from dormouse.tools.bench.rows import arms, free_name, timing_columns
from dormouse.tools.bench.timing import (
    BenchContext,
    dynamo_stats,
    graphs_compiled,
    make_row,
    tail_lines,
    time_steps,
    write_log,
)


def bench_step(ctx: BenchContext, data) -> tuple[dict[str, str], Path]:
    """Time the trainer's own step; write the log; return (the TSV row, the log path)."""
    from dormouse.runs import open_corpus
    from dormouse.train.trainer import Trainer

    cfg, device, warmup, steps, profiled = ctx.cfg, ctx.device, ctx.warmup, ctx.steps, ctx.profiled
    t = cfg.train
    started = datetime.datetime.now(datetime.UTC)
    load_start = os.getloadavg()[0]
    log = list(ctx.head)
    corpus, corpus_note = open_corpus(data)
    with tempfile.TemporaryDirectory(prefix="dormouse-bench-") as tmp:
        run = Path(tmp) / "run"
        trainer = Trainer(cfg, corpus, run, corpus_note=corpus_note)
        log.append("---- trainer header")
        log.extend((run / "train.log").read_text().splitlines())
        flops = count_flops(trainer.model, cfg)
        params = trainer.model.num_params()
        if ctx.compiled:  # the step calls the replica (the model itself, or its DDP wrapper)
            trainer.step_runner.replica = torch.compile(trainer.step_runner.replica)
            log.append(
                "torch.compile: on (the kernel counters are Python side effects: under dynamo they may be "
                "replayed, break the graph or force recompiles; see the step times and the dynamo stats below)"
            )
        log.append(f"---- {warmup} warm-up step(s), then {steps} timed step(s)")
        counters.reset_all()
        ledger.COUNTS.clear()
        times = time_steps(trainer.train_step, 0, warmup, "warmup", device, log)
        counts = {"warmup": counters.line()}
        counters.reset_all()
        times += time_steps(trainer.train_step, warmup, steps, "timed", device, log)
        counts["timed"] = counters.line()
        fla_pin.count_unpinned()  # fla kernel choices the pin did not make join the fallbacks line
        fla_pin.count_borrowed()  # and those another card's pin made
        fallbacks = ledger.counted_summary()
        dynamo = dynamo_stats() if ctx.compiled else None
        if ctx.compiled and not graphs_compiled():
            raise RuntimeError(f"--compile: dynamo compiled no graph of the step, it would time eager ({dynamo})")
        mem_gib, mem_source = peak_memory(device)
        profile = profile_steps(trainer.train_step, warmup + steps, profiled, device) if profiled else None
        del trainer
    load_end = os.getloadavg()[0]

    timing = timing_columns(times, warmup, t.batch_size * t.seq_len, flops.per_step, ctx.peak)
    stamp = started.strftime("%Y-%m-%d-%H%M%S")
    log_path = free_name(Path(ctx.log_dir), f"{stamp}-{cfg.preset}-{device_slug(device)}", ".log")
    row = make_row(
        ctx,
        started,
        "dormouse",
        arms(cfg),
        timing,
        (mem_gib, mem_source),
        log_path,
        kernels=counts["timed"],
        params=str(params),
        loadavg=f"{load_start:.2f}/{load_end:.2f}",
    )
    log += [
        "---- counts",
        f"kernel counters, warm-up: {counts['warmup']}",
        f"kernel counters, timed steps: {counts['timed']}",
        f"fallbacks (COUNTED ledger sites, all steps): {fallbacks}",
        *([f"torch._dynamo counters: {dynamo}"] if dynamo is not None else []),
        *([f"---- torch.profiler over {profiled} more step(s), not timed", profile] if profile else []),
        *tail_lines(row, timing, flops, ctx.peak),
        "---- config",
        json.dumps(cfg.to_dict(), sort_keys=True),
    ]
    write_log(log_path, log, row)
    return row, log_path
