"""The `dormouse` command. A subcommand is registered only once it works (no stubs)."""

import argparse
import contextlib
import errno
import os
import sys
import time
from pathlib import Path

from dormouse import __version__
from dormouse.errors import ConfigError, DormouseError


def _cmd_prepare(args: argparse.Namespace) -> int:
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


def _inspect_run(run: Path, plot: bool) -> int:
    from dormouse import checkpoint
    from dormouse.plots import plot_curves

    print(f"run: {run}")
    print((run / "run.json").read_text().strip())
    for which in ("last", "best"):
        ck = checkpoint.load(run, which)  # verified: a damaged checkpoint is reported, not summarised
        print(f"{which}: step {ck.step}, best bpb {ck.state['best_bpb']} at step {ck.state['best_step']}")
    evals = [line for line in (run / "train.log").read_text().splitlines() if line.startswith("eval ")]
    print(evals[-1] if evals else "no eval yet")
    if plot:
        print(f"curves: {plot_curves(run)}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
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


def _cmd_train(args: argparse.Namespace) -> int:
    from dormouse import checkpoint, run_lock
    from dormouse.config_flags import config_from_args, resume_config
    from dormouse.parallel.world import joined
    from dormouse.plots import plot_curves
    from dormouse.runs import make_run_dir, open_corpus, result_line, run_config, run_corpus, run_meta
    from dormouse.train.trainer import Trainer

    history = _history(args)
    writer = int(os.environ.get("RANK", "0")) == 0  # rank 0 alone writes the run directory
    if args.resume:
        cfg = resume_config(run_config(args.resume), args)
        run = args.resume
        done = checkpoint.last_step(run)
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


def _add_record_flags(p: argparse.ArgumentParser, row: str) -> None:
    """`--record` (append `row` to the history) and its `--history` (train, generate)."""
    p.add_argument("--record", action="store_true", help=f"append {row} to RUN/history.tsv (or --history)")
    p.add_argument("--history", metavar="TSV", default=None, help="with --record: the TSV to append to instead")


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


def _cmd_eval(args: argparse.Namespace) -> int:
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


def _cmd_generate(args: argparse.Namespace) -> int:
    from dormouse.decode.generate import generate
    from dormouse.runs import load_model

    history = _history(args)

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
    if args.record:
        from dormouse import run_lock
        from dormouse.tools.bench.provenance import git_commit, repo_root
        from dormouse.tools.bench.rows import RECORD_FILE, append_row
        from dormouse.tools.decode_row import decode_row

        history = history or Path(args.run) / RECORD_FILE

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
        in_run = history.resolve().parent == Path(args.run).resolve()
        with run_lock.held(args.run, "generate --record") if in_run else contextlib.nullcontext():
            append_row(history, row)
        print(f"generate: appended a row (dormouse-decode) to {history}", file=sys.stderr)
    return 0


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _cmd_bench(args: argparse.Namespace) -> int:
    from dormouse.tools.bench.command import cli

    return cli(args)


def _cmd_replay(args: argparse.Namespace) -> int:
    from dormouse.tools.replay import cli

    return cli(args)


def _cmd_ab(args: argparse.Namespace) -> int:
    from dormouse.tools.ab import cli

    try:
        return cli(args)
    except KeyboardInterrupt:
        return 130


def _cmd_ledger(args: argparse.Namespace) -> int:
    from dormouse import ledger

    if args.markdown:
        print(ledger.markdown(), end="")
        return 0
    sites = ledger.all_sites()
    width = max(len(s.name) for s in sites)
    for s in sites:
        print(f"{s.name:<{width}}  {s.kind.value:<7}  {s.module}  {s.reason}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from dormouse.config_flags import add_config_flags, config_groups

    parser = argparse.ArgumentParser(prog="dormouse", description=__doc__)
    parser.add_argument("--version", action="version", version=f"dormouse {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("prepare", help="turn files, folders and .gz files into uint8 shards + manifest.json")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files, folders (recursive, sorted) or .gz files")
    p.add_argument("--out", required=True, metavar="DIR", help="corpus directory to create (must not exist)")
    split = p.add_mutually_exclusive_group()
    split.add_argument(
        "--heldout-fraction",
        type=float,
        default=0.1,
        metavar="F",
        help="fraction of documents held out, chosen by a hash of their names (default 0.1)",
    )
    split.add_argument(
        "--heldout-tail",
        type=float,
        default=None,
        metavar="F",
        help="hold out the last fraction F of a single file (nanoGPT's tiny-shakespeare split)",
    )
    p.add_argument(
        "--validation-tail",
        type=float,
        default=None,
        metavar="V",
        help="with --heldout-tail F: a tuning corpus without the held-out tail; the last fraction V of "
        "the rest is its held-out split (a validation slice)",
    )
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser(
        "inspect",
        help="summarise a run, or a prepared corpus (default: the embedded one) and the resolved config",
    )
    p.add_argument(
        "path",
        nargs="?",
        default=None,
        metavar="CORPUS|RUN",
        help="a run directory, or a corpus written by `dormouse prepare`; omitted: the default corpus",
    )
    p.add_argument("--plot", action="store_true", help="for a run directory: write RUN/curves.png")
    add_config_flags(p)
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser(
        "train",
        help="train a model; evals, checkpoints and metrics go to the run directory",
        usage="%(prog)s [--data DIR] [--out RUN | --resume RUN] [--preset P] [--config FILE] [flags]",
    )
    groups = config_groups(p)
    groups["data"].add_argument(
        "--data", metavar="DIR", default=None, help="a prepared corpus (default: the embedded default corpus)"
    )
    runs = groups["run"].add_mutually_exclusive_group()
    runs.add_argument("--out", metavar="RUN", default=None, help="new run directory (default runs/<preset>-<time>)")
    runs.add_argument(
        "--resume", metavar="RUN", default=None, help="continue RUN from its last checkpoint (--steps may change)"
    )
    _add_record_flags(groups["run"], "the finished run as a row")
    add_config_flags(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="held-out bits per byte of a run's checkpoint, as an eval line")
    p.add_argument("run", metavar="RUN", help="a run directory")
    p.add_argument("--ckpt", default="best", help="best, last or step-N (default best)")
    p.add_argument("--data", metavar="DIR", default=None, help="another prepared corpus (default: the run's own)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    p.add_argument(
        "--depth",
        default=None,
        metavar="D",
        help="score with D loop iterations (1..the run's depth), or 'all': one eval line per depth (default: full)",
    )
    p.add_argument(
        "--seq-len",
        default=None,
        metavar="N[,N...]",
        help="walk the held-out split in windows of N bytes (more context per byte than training's when "
        "longer); several, comma-separated, give one eval line each (default: the run's seq_len)",
    )
    p.add_argument("--batch-size", type=int, default=None, metavar="B", help="windows per forward (default: the run's)")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("generate", help="continue a prompt with a run's checkpoint, one byte at a time")
    p.add_argument("run", metavar="RUN", help="a run directory")
    p.add_argument("--ckpt", default="best", help="best, last or step-N (default best)")
    p.add_argument("--prompt", required=True, help="text to continue (UTF-8)")
    p.add_argument("--max-bytes", type=int, default=256, help="bytes to generate (default 256)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely bytes; 0 = all (default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling stream (default 0)")
    p.add_argument(
        "--gen-max-iter",
        type=int,
        default=None,
        metavar="N",
        help="at most N loop iterations per generated byte, 1..depth (default: the model's depth)",
    )
    p.add_argument(
        "--exit-threshold",
        type=float,
        default=1.0,
        metavar="P",
        help="CALM-lite: stop a byte's loop once the head's top-1 probability is >= P, in (0, 1] (default 1.0: never)",
    )
    p.add_argument(
        "--speculative",
        action="store_true",
        help="draft with the DSpark head and verify every draft (greedy output is plain greedy decoding's; "
        "sampling uses the rejection rule); the report adds the acceptance rate",
    )
    p.add_argument(
        "--cuda-graph",
        action="store_true",
        help="CUDA only: each step after the first replayed from one captured CUDA graph (the same bytes; "
        "refused with attention layers, sparse experts, MoR, an exit threshold below 1 and --speculative)",
    )
    p.add_argument("--out", metavar="FILE", default=None, help="write the raw generated bytes here")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    _add_record_flags(p, "the decode speed as a row (model dormouse-decode)")
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser(
        "bench",
        help="time the trainer's step (or a same-size baseline: --model, --baselines): one row per model in "
        "a history TSV, the full log beside it",
    )
    p.add_argument(
        "--data", metavar="DIR", default=None, help="a prepared corpus (default: the embedded default corpus)"
    )
    p.add_argument(
        "--warmup", type=int, default=3, metavar="W", help="untimed steps first; the first is first_step_s (default 3)"
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the model before the first step")
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the timed steps, N more under torch.profiler; its op tables go in the log, on CUDA after "
        "a device-busy line, an idle line (what the host ran while the device waited) and the longest idle "
        "gaps with the step's phase the host was in (default 0)",
    )
    p.add_argument(
        "--op",
        choices=("step", "kda"),
        default="step",
        help="step = the trainer's training step (default); kda = the KDA op alone, forward+backward",
    )
    p.add_argument(
        "--model",
        choices=("dormouse", "gpt", "fla-kda"),
        default="dormouse",
        help="what --op step times: dormouse (default), or a baseline at the config's sizes with "
        "block_layers*depth layers on random bytes: gpt (a plain GPT with torch SDPA, row model gpt-sdpa) or "
        "fla-kda (fla's KDAForCausalLM; CUDA with fla only, refused elsewhere)",
    )
    p.add_argument(
        "--baselines",
        action="store_true",
        help="after the dormouse row, time every baseline this device can run (gpt; fla-kda on CUDA with fla, "
        "else skipped with the reason) in the same process: one row and one log each",
    )
    p.add_argument("--note", default="", metavar="TEXT", help="free text for the row's note column")
    p.add_argument("--history", default=None, metavar="FILE", help="TSV to append to (default runs/bench/history.tsv)")
    p.add_argument("--log-dir", default=None, metavar="DIR", help="folder for the logs (default runs/bench/logs)")
    add_config_flags(p)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser(
        "replay", help="run one training step in two fresh processes; IDENTICAL (exit 0) or DIFFERS (exit 1)"
    )
    p.add_argument(
        "run",
        nargs="?",
        default=None,
        metavar="RUN",
        help="a run directory; omitted: train the config flags' model for --step steps in a temporary run",
    )
    p.add_argument(
        "--step",
        type=int,
        default=None,
        metavar="N",
        help="replay from the checkpoint after N updates (default: RUN's last; without RUN 1)",
    )
    p.add_argument(
        "--data", metavar="DIR", default=None, help="the run's corpus at another path (its fingerprint must match)"
    )
    add_config_flags(p)
    p.set_defaults(func=_cmd_replay)

    p = sub.add_parser(
        "ab", help="compare two configs over seeds at equal steps: bpb difference B-A with a 95%% interval, ms/step"
    )
    p.add_argument(
        "--a", required=True, metavar="FLAGS", help='arm A: config flags as one string ("" = the shared config)'
    )
    p.add_argument(
        "--b",
        required=True,
        action="append",
        metavar="FLAGS",
        help='arm B: config flags as one string, e.g. "--lr 0.01"; given N times, N comparisons against one arm A '
        "in one process, into OUT/b1 ... OUT/bN (b2 on reuse b1's arm A, as --reuse-a does; needs --steps)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=3,
        metavar="N",
        help="seed rounds; round i trains both arms with seed --seed + i (default 3)",
    )
    p.add_argument(
        "--data", metavar="DIR", default=None, help="a prepared corpus (default: the embedded default corpus)"
    )
    p.add_argument("--out", metavar="DIR", default=None, help="new or empty folder (default runs/ab-<time>)")
    p.add_argument(
        "--history",
        default=None,
        metavar="FILE",
        help="the TSV the cost is priced from and --record appends to (default: priced from the checkout's "
        "evidence/history.tsv, recorded in OUT/history.tsv)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="when the comparison finishes, append one row per arm to --history (model dormouse; ms_per_step the "
        "median of every step over all seeds; heldout_bpb the mean over seeds; the difference B-A, its interval "
        "and the verdict in the note); such a row prices that arm like a bench row",
    )
    p.add_argument(
        "--eval-depths",
        action="store_true",
        help="after each run, also score its final model at every loop depth 1..depth (as `dormouse eval --depth "
        "all`, on the full held-out walk): bpb_by_depth in ab.json, per-arm means per depth in the report and, "
        "with --record, in the note",
    )
    p.add_argument(
        "--reuse-a",
        metavar="DIR",
        default=None,
        help="take arm A's runs from the earlier comparison in DIR (its ab.json; or an ab.json file itself) "
        "instead of training them (refused unless it ran this arm A: same code fingerprint, corpus, device, "
        "steps and config, every seed); only B trains",
    )
    add_config_flags(p)
    p.set_defaults(func=_cmd_ab)

    p = sub.add_parser("ledger", help="print the fallback ledger (every site: LOUD or COUNTED)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/reliability.md's)")
    p.set_defaults(func=_cmd_ledger)

    from dormouse.tools import tune

    p = sub.add_parser(
        "tune",
        help="choose fla's kernel configurations on this CUDA card ahead of a run: two training steps and an eval "
        "of the config; the choices are kept in ~/.cache/dormouse/kernels/<card>/",
    )
    p.add_argument(
        "--data", metavar="DIR", default=None, help="a prepared corpus (default: the embedded default corpus)"
    )
    p.add_argument(
        "--into",
        metavar="DIR",
        default=None,
        help="read the choices of DIR and add the new ones there instead (an empty DIR: every kernel is timed "
        "on this card; a card's pin is such a folder, committed under dormouse/model/fla_configs/)",
    )
    add_config_flags(p)
    p.set_defaults(func=tune.cli)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["ab"]:
        from dormouse.tools.ab import attach_arm_values

        argv = attach_arm_values(argv)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except DormouseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the environment (disk full, permissions, a file gone): one line, no traceback
        print(f"error: {_os_error(e)}", file=sys.stderr)
        return 2


def _os_error(e: OSError) -> str:
    where = f": {e.filename}" if e.filename else ""
    hint = {errno.ENOSPC: "free space", errno.EDQUOT: "free space", errno.EACCES: "check its permissions"}
    hint[errno.EROFS] = "write somewhere else"
    then = f"; {hint[e.errno]} and run again" if e.errno in hint else ""
    return f"{e.strerror or e}{where}{then}"
