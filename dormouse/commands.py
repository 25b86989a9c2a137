"""What each `dormouse` subcommand does, given its parsed arguments (dormouse/cli.py parses them): one
`cmd_<name>` per subcommand, returning the exit status. Each imports what it needs when it runs, so that
`dormouse --help` stays fast.
"""

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

from dormouse.errors import ConfigError, DormouseError


def cmd_prepare(args: argparse.Namespace) -> int:
    from dormouse.data.prepare import prepare
    from dormouse.data.shards import inspect_corpus

    prepare(
        args.inputs,
        args.out,
        heldout_fraction=args.heldout_fraction,
        heldout_tail=args.heldout_tail,
        validation_tail=args.validation_tail,
    )
    print(inspect_corpus(args.out))
    return 0


def _four_digits(value):
    """A float as the eval line prints it (bits per byte to 4 decimals); anything else as it is."""
    return f"{value:.4f}" if isinstance(value, float) else value


def _inspect_run(run: Path, plot: bool) -> int:
    from dormouse import run_lock

    with run_lock.held(run, "inspect --plot") if plot else contextlib.nullcontext():  # --plot writes curves.png
        return _summarise_run(run, plot)


def _summarise_run(run: Path, plot: bool) -> int:
    from dormouse import checkpoint
    from dormouse.plots import plot_curves

    print(f"run: {run}")
    for key, value in json.loads((run / "run.json").read_text()).items():
        print(f"{key}: {_four_digits(value)}")
    for which in ("last", "best"):
        ck = checkpoint.load(run, which)  # verified: a damaged checkpoint is reported, not summarised
        best = _four_digits(ck.state["best_bpb"])
        print(f"{which}: step {ck.step}, best bpb {best} at step {ck.state['best_step']}")
    evals = [line for line in (run / "train.log").read_text().splitlines() if line.startswith("eval ")]
    print(evals[-1] if evals else "no eval yet")
    if plot:
        print(f"curves: {plot_curves(run)}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from dormouse.config_flags import config_from_args

    if args.path is not None and (Path(args.path) / "config.json").is_file():
        return _inspect_run(Path(args.path), args.plot)
    if args.plot:
        raise DormouseError("--plot needs a run directory (one written by `dormouse train`)")
    cfg = config_from_args(args)  # refuse a bad config before touching any corpus
    from dormouse.data.default_corpus import default_corpus_dir, describe_default_corpus
    from dormouse.data.shards import inspect_corpus

    if args.path is None:
        corpus = default_corpus_dir()
        print(describe_default_corpus())
    else:
        corpus = args.path
    print(inspect_corpus(corpus))
    print("resolved config:")
    print(cfg.to_json())
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from dormouse import checkpoint, run_lock
    from dormouse.config_flags import config_from_args, resume_config
    from dormouse.parallel.world import joined
    from dormouse.plots import plot_curves
    from dormouse.runs import (
        check_config_json,
        make_run_dir,
        open_corpus,
        result_line,
        run_config,
        run_corpus,
        run_meta,
    )
    from dormouse.train.trainer import Trainer

    history = _history(args)
    writer = int(os.environ.get("RANK", "0")) == 0  # rank 0 alone writes the run directory
    if args.resume:
        run = args.resume
        done = checkpoint.last_step(run)
        if done is not None:
            check_config_json(run)  # before anything is built from it
        cfg = resume_config(run_config(run), args)
        if done is not None and done >= cfg.train.steps:  # Lightning's max_steps: a finished fit, not an error
            print(f"{run} is at step {done} and --steps is {cfg.train.steps}: nothing left to train")
            meta = run_meta(run)
            if "best_step" in meta:  # the result it trained to
                print(result_line(run, meta))
            return 0
        corpus, note = run_corpus(run, args.data)
    else:
        cfg = config_from_args(args)
        run = args.out or f"runs/{cfg.preset}-{time.strftime('%Y%m%d-%H%M%S')}"
        corpus, note = open_corpus(args.data)
        if writer:
            make_run_dir(run)
    with contextlib.ExitStack() as hold:
        if writer:  # one writer per run directory: a second `train` on it is refused (dormouse/run_lock.py)
            hold.enter_context(run_lock.held(run, "train"))
            if history is not None and history.resolve().parent != Path(run).resolve():  # another run's TSV
                hold.enter_context(run_lock.held_for(history, "train --record"))
        with joined(cfg.train) as world:  # one process alone, or this rank of a torchrun job (ddp, fsdp)
            trainer = Trainer(cfg, corpus, run, corpus_note=note, resume=bool(args.resume), world=world)
            try:
                trainer.run_loop()
            except KeyboardInterrupt:
                return 130
        if world.is_main:
            print(f"curves: {plot_curves(trainer.run)}")
            if args.record:
                _record_run(trainer, history)
            print(trainer.result_line())  # the last line: the run's result is its best held-out eval
    return 0


def _history(args: argparse.Namespace) -> Path | None:
    """The TSV `--record` appends to: `--history`, or None for the run directory's own history.tsv;
    `--history` alone is refused."""
    if args.history and not args.record:
        raise ConfigError("--history names the TSV --record appends to; add --record")
    return Path(args.history) if args.history else None


def _record_run(trainer, history: Path | None) -> None:
    """`train --record`: the run as one history row (tools/train_row.py), in the run directory by default."""
    import torch

    from dormouse.evaluation import eval_records
    from dormouse.tools.bench.provenance import git_commit, repo_root
    from dormouse.tools.bench.rows import RECORD_FILE, append_row
    from dormouse.tools.train_row import train_row

    history = history or Path(trainer.run) / RECORD_FILE

    row = train_row(
        trainer.cfg,
        trainer.step_ms,
        eval_records(trainer.run),
        run=trainer.run,
        commit=git_commit(repo_root()),
        torch_version=torch.__version__,
    )
    append_row(history, row)
    print(f"train: appended a row (held-out {row['heldout_bpb']} bpb) to {history}")


def cmd_eval(args: argparse.Namespace) -> int:
    from dormouse.evaluation import depth_field, eval_line, eval_record, heldout_score
    from dormouse.model import precision
    from dormouse.runs import load_model, run_corpus
    from dormouse.train.stress import StressMonitor

    device = args.device or ("cuda" if torch_cuda() else "cpu")
    model, cfg, ck = load_model(args.run, args.ckpt, device)
    corpus, note = run_corpus(args.run, args.data)
    t = cfg.train
    stress = StressMonitor()
    stress.load_state_dict(ck.state["stress"])
    depths = _eval_depths(args.depth, cfg.model.depth)
    # A window longer than training's gives each byte more context: a different measurement, named on each line.
    windows = [t.seq_len] if args.seq_len is None else _eval_windows(args.seq_len)
    batch_size = t.batch_size if args.batch_size is None else args.batch_size
    print(f"checkpoint {ck.path} (step {ck.step}); corpus {note}; kda backend {cfg.model.kda_backend}")
    for seq_len in windows:
        for depth in depths:
            held = heldout_score(
                model,
                corpus,
                seq_len=seq_len,
                batch_size=batch_size,
                eval_bytes=t.eval_bytes,
                device=device,
                # the run's precision (bf16: autocast), as its training evals scored: the same number
                autocast=lambda: precision.autocast(t.dtype, device),
                depth=depth,
                progress=True,
            )
            record = eval_record(
                ck.step,
                held,
                train_ce=None,
                tokens=ck.step * t.batch_size * t.seq_len,
                ms_per_step=None,
                depth=depth_field(cfg) if depth is None else f"eval{depth}/{cfg.model.depth}",
                stress=stress.summary(),
            )
            record["window"] = seq_len
            if t.ema_decay:  # load_model put the run's weight average in the model
                record["weights"] = f"ema{t.ema_decay:g}"
            print(eval_line(record))
    return 0


def _eval_windows(asked: str) -> list[int]:
    """`--seq-len`: one window length or several, comma-separated (one eval line each)."""
    try:
        return [int(w) for w in asked.split(",")]
    except ValueError:
        raise ConfigError(f"--seq-len {asked!r}: window lengths in bytes, e.g. 256 or 256,1024,4096") from None


def _eval_depths(asked: str | None, model_depth: int) -> list[int | None]:
    """`--depth`: None (the full depth, one line), D in 1..depth, or `all` (1..depth, one line each)."""
    if asked is None:
        return [None]
    if asked == "all":
        return list(range(1, model_depth + 1))
    if not asked.isdigit() or not 1 <= int(asked) <= model_depth:
        raise ConfigError(f"--depth {asked!r}: a loop depth in 1..{model_depth} (the run's depth) or 'all'")
    return [int(asked)]


def cmd_generate(args: argparse.Namespace) -> int:
    from dormouse import run_lock
    from dormouse.tools.bench.rows import RECORD_FILE

    history = _history(args)
    record_to = (history or Path(args.run) / RECORD_FILE) if args.record else None
    written = {Path(p).resolve().parent: p for p in (record_to, args.out) if p}  # one lock per run directory
    with contextlib.ExitStack() as hold:  # held from the start: a refusal loses no work
        for path in written.values():
            hold.enter_context(run_lock.held_for(path, "generate"))
        return _generate(args, record_to)


def _generate(args: argparse.Namespace, record_to: Path | None) -> int:
    from dormouse.decode.generate import generate
    from dormouse.runs import load_model

    if args.out:
        _check_writable(Path(args.out))
    device = args.device or ("cuda" if torch_cuda() else "cpu")
    model, cfg, ck = load_model(args.run, args.ckpt, device)
    result = generate(
        model,
        args.prompt.encode(),
        max_bytes=args.max_bytes,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
        max_iter=args.gen_max_iter,
        exit_threshold=args.exit_threshold,
        speculative=args.speculative,
        cuda_graph=args.cuda_graph,
    )
    if args.out:
        with open(args.out, "wb") as f:
            f.write(result.bytes)
    else:
        sys.stdout.write(args.prompt + result.bytes.decode("utf-8", errors="replace") + "\n")
    rate = f"{result.seconds:.2f} s ({result.bytes_per_s:.3f} bytes/s)"
    print(f"generated {len(result.bytes)} bytes from {ck.path} in {rate}", file=sys.stderr)
    histogram = " ".join(f"{iters}:{n}" for iters, n in result.histogram().items())
    mean = sum(result.iterations) / len(result.iterations)
    print(f"loop iterations per byte (iterations:bytes): {histogram}; mean {mean:.2f}", file=sys.stderr)
    if result.acceptance is not None:
        print(result.acceptance, file=sys.stderr)
    if record_to is not None:
        from dormouse.tools.bench.provenance import git_commit, repo_root
        from dormouse.tools.bench.rows import append_row
        from dormouse.tools.decode_row import decode_row

        flags = {"--speculative": args.speculative, f"--gen-max-iter {args.gen_max_iter}": args.gen_max_iter}
        flags["--cuda-graph"] = args.cuda_graph
        flags[f"--exit-threshold {args.exit_threshold:g}"] = args.exit_threshold < 1
        flags[f"--temperature {args.temperature:g}"] = True
        options = " ".join(flag for flag, on in flags.items() if on)
        row = decode_row(
            cfg,
            result,
            options=options,
            graphed=args.cuda_graph,
            prompt_bytes=len(args.prompt.encode()),
            commit=git_commit(repo_root()),
            log=str(ck.path),
        )
        append_row(record_to, row)
        print(f"generate: appended a row (dormouse-decode) to {record_to}", file=sys.stderr)
    return 0


def _check_writable(path: Path) -> None:
    """Refuse an `--out` file that cannot be written before the work whose result it would hold: opened
    for appending (nothing in it changes), and removed again when it did not exist."""
    existed = path.exists()
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        raise ConfigError(f"--out {path}: cannot write it ({e.strerror}); give a writable file") from e
    if not existed:
        path.unlink()


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def cmd_bench(args: argparse.Namespace) -> int:
    from dormouse.tools.bench.command import cli

    return cli(args)


def cmd_replay(args: argparse.Namespace) -> int:
    from dormouse.tools.replay import cli

    return cli(args)


def cmd_ab(args: argparse.Namespace) -> int:
    from dormouse.tools.ab import cli

    try:
        return cli(args)
    except KeyboardInterrupt:
        return 130


def cmd_ledger(args: argparse.Namespace) -> int:
    from dormouse import ledger

    if args.markdown:
        print(ledger.markdown(), end="")
        return 0
    sites = ledger.all_sites()
    width = max(len(s.name) for s in sites)
    for s in sites:
        print(f"{s.name:<{width}}  {s.kind.value:<7}  {s.module}  {s.reason}")
    return 0
