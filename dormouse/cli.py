"""The `dormouse` command. A subcommand is registered only once it works (no stubs)."""

# The parser, one subcommand at a time, and `main`; what each subcommand does is dormouse/commands.py's.

import argparse
import errno
import sys

from dormouse import __version__
from dormouse.commands import (
    cmd_ab,
    cmd_bench,
    cmd_eval,
    cmd_generate,
    cmd_inspect,
    cmd_ledger,
    cmd_prepare,
    cmd_replay,
    cmd_train,
)
from dormouse.config_flags import add_config_flags, config_groups
from dormouse.errors import DormouseError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dormouse", description=__doc__)
    parser.add_argument("--version", action="version", version=f"dormouse {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_prepare(sub)
    _add_inspect(sub)
    _add_train(sub)
    _add_eval(sub)
    _add_generate(sub)
    _add_bench(sub)
    _add_replay(sub)
    _add_ab(sub)
    _add_ledger(sub)
    _add_tune(sub)
    return parser


def _add_prepare(sub) -> None:
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
    p.set_defaults(func=cmd_prepare)


def _add_inspect(sub) -> None:
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
    p.set_defaults(func=cmd_inspect)


def _add_train(sub) -> None:
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
    p.set_defaults(func=cmd_train)


def _add_eval(sub) -> None:
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
    p.set_defaults(func=cmd_eval)


def _add_generate(sub) -> None:
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
    p.set_defaults(func=cmd_generate)


def _add_bench(sub) -> None:
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
    p.set_defaults(func=cmd_bench)


def _add_replay(sub) -> None:
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
    p.set_defaults(func=cmd_replay)


def _add_ab(sub) -> None:
    p = sub.add_parser(
        "ab", help="compare two configs over seeds at equal steps or time: bpb difference B-A, its 95%% interval"
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
        "--equal",
        choices=("steps", "time"),
        default="steps",
        help="with --minutes M: both arms train the steps the slower arm fits in M (steps, the default), or each "
        "arm the steps it fits itself (time: equal wall-clock, for a model against a baseline of another speed)",
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
    p.set_defaults(func=cmd_ab)


def _add_ledger(sub) -> None:
    p = sub.add_parser("ledger", help="print the fallback ledger (every site: LOUD or COUNTED)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/reliability.md's)")
    p.set_defaults(func=cmd_ledger)


def _add_tune(sub) -> None:
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
        "on this card; a card's pin is such a folder, committed under dormouse/ops/fla/configs/)",
    )
    add_config_flags(p)
    p.set_defaults(func=tune.cli)


def _add_record_flags(p: argparse.ArgumentParser, row: str) -> None:
    """`--record` (append `row` to the history) and its `--history` (train, generate)."""
    p.add_argument("--record", action="store_true", help=f"append {row} to RUN/history.tsv (or --history)")
    p.add_argument("--history", metavar="TSV", default=None, help="with --record: the TSV to append to instead")


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
