"""`dormouse ab`: two configurations (arms A and B) trained on equal data, seeds and steps; is B better?

The protocol, and how to read ab.json, is docs/ab-protocol.md. In short:

- Each arm is the shared flags (`--preset`, `--config`, config flags given to `ab` itself) with the
  arm's own flags on top, parsed by the same flags as `dormouse train`. An arm may not set what the
  comparison holds equal (SHARED: seed, steps, budget, evals, device, checkpointing) nor the preset or
  a config file; unknown flags and two arms that resolve to one config are refused. An arm may change
  the batch's shape (`--seq-len`, `--batch-size`: a context-length A/B) only with batch_size · seq_len
  unchanged: the same bytes per step, and the eval scores the same held-out bytes whatever the window.
- Seed round i trains A and B with seed `--seed` + i: the same batches (a batch is a function of
  (seed, step), the corpus, batch_size and seq_len) and the same init streams. Runs go round-robin
  by whole runs, the order alternating per round (A B, B A, A B, ...), so a slow drift of the
  machine's speed loads both arms alike; every step is timed the same way in both.
- Equal steps: `--steps N` trains both arms N steps. `--minutes M` first prices each arm (a few
  timed steps in a temporary run) and sets N to the steps the slower arm fits in M minutes; both
  arms then train exactly N steps, with the learning-rate schedule over N. `--equal time` instead
  compares at equal wall-clock (a faster model trains more steps), as a model against a baseline of
  another speed is compared: each arm trains the steps it fits in M minutes itself, or, without
  `--minutes`, arm A trains its N steps and arm B the steps that fit in arm A's time.
- The score of a run is the held-out bpb of its final model on the full held-out walk; the paired
  difference B − A over seeds gets a 95% Student-t interval (tools/ab_stats.py).
- Before anything trains, the cost is priced from history rows of this device, preset, shape, arms
  and parameter count (tools/history.py; `--history`, default the checkout's evidence/history.tsv), or
  reported unknown.
- `--eval-depths` also scores each run's final model at every loop depth 1..depth (heldout_score's
  `depth`, as `dormouse eval --depth all`); `--record` appends one row per arm to `--history`, default
  OUT/history.tsv (bench's append_row), a row pricing can use.
- `--reuse-a DIR` takes arm A's runs from an earlier comparison instead of training them again, when
  they are this comparison's arm A: the same code (`code`: a hash of the package's sources and kernel
  pin, so a commit of logs in between does not matter), corpus, device, steps and resolved config, a run
  for every seed (an ablation table's rows share one baseline). Only arm B trains; its runs no longer
  alternate with A's, so A's timing comes from that comparison's machine state.
- `--b` given N times: N comparisons in one process (one start-up, not N), into OUT/b1 ... OUT/bN;
  b1 trains arm A (unless --reuse-a), b2 on reuse it as `--reuse-a OUT/b1` would.
"""

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import shlex
import statistics
import time
from pathlib import Path

import torch

from dormouse import run_lock
from dormouse.config import STEPS_AUTO, Config
from dormouse.config_flags import add_config_flags, config_from_args
from dormouse.data.shards import Corpus
from dormouse.errors import ConfigError
from dormouse.evaluation import eval_records, heldout_score
from dormouse.model import precision
from dormouse.model.model import DormouseLM
from dormouse.tools.ab_price import (
    PRICE_STEPS,
    PRICE_WARMUP,
    fitted_steps,
    measure_ms_per_step,
    one_or_per_arm,
    price,
)
from dormouse.tools.ab_report import depth_means, history_rows, report_lines, steps_text, summarise
from dormouse.tools.ab_table import table
from dormouse.tools.bench.device import device_name
from dormouse.tools.bench.provenance import code_fingerprint, git_commit, repo_root
from dormouse.tools.bench.rows import (
    COMMITTED,
    RECORD_FILE,
    append_row,
    history_header,
    shown_path,
)
from dormouse.train import budget
from dormouse.train.trainer import Trainer

ARMS = ("a", "b")
# How ab.json's step_rule opens under `--equal time` (ab_merge tells such comparisons by it).
EQUAL_TIME_RULE = "--equal time"
# Held equal by construction: an arm that sets one of these is refused, `ab` itself takes them for both.
SHARED = {
    "train.seed": "seed round i trains both arms with seed --seed + i",
    "train.steps": "the comparison is at equal steps",
    "train.minutes": "the budget is per arm-run and the same for both",
    "train.eval_every": "the curves must be sampled at the same steps",
    "train.eval_bytes": "the curves must score the same held-out bytes",
    "train.device": "both arms run and are timed on one device",
    "train.ckpt_every": "checkpointing changes no number: an arm differing only there compares a config with itself",
    "train.keep_last": "checkpointing changes no number: an arm differing only there compares a config with itself",
    "train.patience": "the comparison is at equal steps: every run trains all of them (patience 0)",
}


# ---- the arms --------------------------------------------------------------------------------------------------


class _ArmParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ConfigError(message)


def attach_arm_values(argv: list[str]) -> list[str]:
    """`--b "--no-engram"` → `--b=--no-engram`: argparse reads a lone value that starts with '-' as an option,
    so an arm of one flag would be refused as a missing value."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("--a", "--b") and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def arm_configs(args: argparse.Namespace) -> dict[str, Config]:
    """Both arms' resolved configs; every refusal of the protocol happens here, before anything runs."""
    if getattr(args, "train.steps") is not None and getattr(args, "train.minutes"):
        raise ConfigError("--steps and --minutes are exclusive for ab: both arms train N steps, or the steps fit M")
    if args.seeds < 1:
        raise ConfigError(f"--seeds {args.seeds}: at least 1")
    if getattr(args, "train.patience"):
        raise ConfigError("--patience: an A/B compares at equal steps; every run trains all of them (patience 0)")
    parser = _ArmParser(prog="arm", add_help=False, allow_abbrev=False)
    add_config_flags(parser)
    cfgs = {}
    for arm in ARMS:
        text = getattr(args, arm)
        try:
            given = parser.parse_args(shlex.split(text))
            merged = argparse.Namespace(**vars(args))
            for dest, value in vars(given).items():
                if value is None or (dest.startswith("short.") and not value):
                    continue
                if dest in ("preset", "config"):
                    raise ConfigError(f"--{dest} is shared: give it to `dormouse ab` itself, or name the fields")
                if dest in SHARED:
                    flag = "--" + dest.split(".", 1)[1].replace("_", "-")
                    raise ConfigError(f"{flag} is held equal ({SHARED[dest]}): give it to `dormouse ab` itself")
                setattr(merged, dest, value)
            cfgs[arm] = config_from_args(merged)
        except (ConfigError, ValueError) as e:  # ValueError: shlex, on an unclosed quote
            raise ConfigError(f"--{arm} {text!r}: {e}") from e
    step_bytes = {arm: cfgs[arm].train.batch_size * cfgs[arm].train.seq_len for arm in ARMS}
    if step_bytes["a"] != step_bytes["b"]:
        raise ConfigError(
            f"arm A trains {step_bytes['a']} bytes per step and arm B {step_bytes['b']} (batch_size · seq_len): "
            "an arm may change the batch's shape, not how many bytes a step trains"
        )
    if cfgs["a"].to_dict() == cfgs["b"].to_dict():
        raise ConfigError(f"--a {args.a!r} and --b {args.b!r} resolve to the same config: nothing to compare")
    dots = {arm: precision.triton_fp32(cfgs[arm].train.dtype) for arm in ARMS}
    if cfgs["a"].train.device == "cuda" and dots["a"] != dots["b"]:
        raise ConfigError(
            f"arm A's dtype runs Triton's fp32 dots in {dots['a']} and arm B's in {dots['b']}; the arms train in "
            "one process, where that precision is fixed (precision.apply): compare them with two `dormouse train` runs"
        )
    return cfgs


def _differences(theirs, ours, prefix: str = "") -> list[str]:
    """The dotted keys where two nested dicts (configs as dicts) differ."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        keys = sorted(set(theirs) | set(ours))
        return [d for k in keys for d in _differences(theirs.get(k), ours.get(k), f"{prefix}{k}.")]
    return [] if theirs == ours else [prefix.rstrip(".")]


def reused_a_runs(
    prev_dir: Path,
    cfg_a: Config,
    seeds: list[int],
    steps: int,
    *,
    corpus: Corpus,
    code: str,
    device: str,
    eval_depths: bool,
) -> tuple[Path, list[dict]]:
    """Arm A's runs (one per seed, in `seeds`' order) of the comparison in `prev_dir`, refused unless they
    are this comparison's arm A: same code, corpus, device, steps and arm-A config."""
    path = prev_dir if prev_dir.suffix == ".json" else prev_dir / "ab.json"  # a folder, or a kept ab.json
    try:
        prev = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--reuse-a {prev_dir}: cannot read {path}: {e}") from e
    same = {
        "the code": (prev.get("code", "not recorded"), code),
        "the corpus fingerprint": (prev["fingerprint"], corpus.fingerprint),
        "the device": (prev["device"], device),
        "arm A's step count": (prev["steps"]["a"] if isinstance(prev["steps"], dict) else prev["steps"], steps),
    }
    for what, (theirs, ours) in same.items():
        if theirs != ours:
            raise ConfigError(f"--reuse-a {prev_dir}: {what} differs ({theirs} there, {ours} here)")
    differ = _differences(prev["arms"]["a"]["config"], for_round(cfg_a, seeds[0], steps).to_dict())
    if differ:
        raise ConfigError(f"--reuse-a {prev_dir}: its arm A is another config ({', '.join(differ)} differ)")
    by_seed = {r["seed"]: r for r in prev["runs"]["a"]}
    missing = [s for s in seeds if s not in by_seed]
    if missing:
        raise ConfigError(f"--reuse-a {prev_dir}: no arm-A run of seed(s) {missing} there (it ran {prev['seeds']})")
    runs = [by_seed[s] for s in seeds]
    if eval_depths and any("bpb_by_depth" not in r for r in runs):
        raise ConfigError(f"--reuse-a {prev_dir}: its runs were not scored by depth; --eval-depths needs them")
    return path, runs


def for_round(cfg: Config, seed: int, steps: int) -> Config:
    """An arm's config in one seed round: its seed, exactly `steps` steps, no wall-time or early stop."""
    train = dataclasses.replace(cfg.train, seed=seed, steps=steps, minutes=0.0, patience=0)
    return Config(model=dataclasses.replace(cfg.model), train=train, preset=cfg.preset)


# ---- the runs --------------------------------------------------------------------------------------------------


def run_arm(cfg: Config, corpus: Corpus, note: str, run_dir: Path, *, eval_depths: bool = False) -> dict:
    """Train one arm in one seed round; score its final model on the full held-out walk (with `eval_depths`
    also at every loop depth: `bpb_by_depth`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with run_lock.held(run_dir, "ab"):  # as `train` holds its run: a `train --resume` of it meanwhile is refused
        return _train_and_score(cfg, corpus, note, run_dir, eval_depths)


def _train_and_score(cfg: Config, corpus: Corpus, note: str, run_dir: Path, eval_depths: bool) -> dict:
    load_start = os.getloadavg()[0]
    trainer = Trainer(cfg, corpus, run_dir, corpus_note=note)
    last = trainer.run_loop()
    t = cfg.train
    if t.eval_bytes:  # the run's evals scored a prefix; the comparison scores every held-out byte
        held = full_heldout(trainer, corpus)
        bpb, scored = held.bpb, held.bytes
    else:
        bpb, scored = last["bpb"], last["heldout_bytes"]
    by_depth = {"bpb_by_depth": bpb_by_depth(trainer, corpus)} if eval_depths else {}
    return {
        "seed": t.seed,
        "run": str(run_dir),
        "steps": trainer.step,
        "bpb": bpb,
        "heldout_bytes": scored,
        "ms_per_step": statistics.median(trainer.step_ms),
        "step_ms": trainer.step_ms,
        "loadavg": [load_start, os.getloadavg()[0]],  # 1-minute load before and after: was the machine shared?
        "curve": [[r["step"], r["bpb"]] for r in eval_records(run_dir)],
        **by_depth,
    }


def bpb_by_depth(trainer: Trainer, corpus: Corpus) -> dict[str, float]:
    """{"d": held-out bpb of the final model run with d loop iterations} for d in 1..depth: the score of
    `dormouse eval --depth all` (heldout_score's `depth`), on the full held-out walk under the run's own
    autocast, as the run's score is; at the full depth it is that score again (bitwise on the CPU)."""
    return {str(depth): full_heldout(trainer, corpus, depth).bpb for depth in range(1, trainer.cfg.model.depth + 1)}


def full_heldout(trainer: Trainer, corpus: Corpus, depth: int | None = None):
    """The final model's score on every held-out byte under the run's own autocast (`depth` loop
    iterations; None: the model's)."""
    t = trainer.cfg.train
    with trainer.evaluator.scored_weights():  # the run's weight average under ema_decay, as its evals scored
        return heldout_score(
            trainer.model,
            corpus,
            seq_len=t.seq_len,
            batch_size=t.batch_size,
            eval_bytes=0,
            device=trainer.device,
            autocast=trainer.step_runner.autocast,
            depth=depth,
        )


def cli(args: argparse.Namespace) -> int:
    """`dormouse ab`: see the module docstring and docs/ab-protocol.md. Several `--b`: one comparison each
    against one arm A, in one process, into OUT/b1 ... OUT/bN; b2 on reuse b1's arm A (or --reuse-a's);
    then their rows as ab_table's table, printed and in OUT/table.md."""
    out = Path(args.out or f"runs/ab-{time.strftime('%Y%m%d-%H%M%S')}")
    _check_empty(out)
    created = not out.exists()
    try:
        with contextlib.ExitStack() as hold:
            hold.enter_context(run_lock.held_for(args.history if args.record else None, "ab --record"))
            out.mkdir(parents=True, exist_ok=True)
            hold.enter_context(run_lock.held(out, "ab"))  # one A/B per folder: a second one is refused by name
            _check_empty(out)  # another A/B may have written it between the check above and the lock
            return _compare_each(args, out)
    finally:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # a refused A/B leaves no folder behind


def _check_empty(out: Path) -> None:
    if out.exists() and any(p.name != run_lock.LOCK for p in out.iterdir()):
        raise ConfigError(f"--out {out} is not empty: an A/B writes into a new or empty folder")


def _compare_each(args: argparse.Namespace, out: Path) -> int:
    if len(args.b) == 1:
        compare(argparse.Namespace(**{**vars(args), "b": args.b[0], "out": out}))
        return 0
    rows = [argparse.Namespace(**{**vars(args), "b": b, "out": out / f"b{i}"}) for i, b in enumerate(args.b, 1)]
    cfgs = [arm_configs(row) for row in rows]  # every arm refused now, not after hours of the rows before it
    if cfgs[0]["a"].train.minutes:
        raise ConfigError("several --b need --steps: their comparisons share arm A's runs, of a fixed number of steps")
    results = []
    for i, row in enumerate(rows):
        row.reuse_a = args.reuse_a if i == 0 else args.reuse_a or str(rows[0].out)
        print(f"ab: comparison b{i + 1} of {len(rows)}, arm B: {row.b}")
        results.append((row.out.name, compare(row)))
    done = table(results)
    (out / "table.md").write_text(done + "\n")
    print(done)
    return 0


@dataclasses.dataclass
class Plan:
    """What one comparison runs, fixed before anything trains."""

    cfgs: dict[str, Config]
    out: Path
    history: Path  # the rows the cost is priced from
    record_to: Path  # the TSV --record appends to
    commit: str
    code: str
    started: datetime.datetime
    seeds: list[int]
    steps: dict[str, int] | None  # each arm's steps; None until the pricing run sets them (--minutes, --equal time)
    a_steps: int  # arm A's steps, the budget without --minutes
    minutes: float
    equal: str  # "steps": both arms train the same steps; "time": each what fits in the same time
    corpus: Corpus
    note: str
    device: torch.device
    reused: tuple[Path, list[dict]] | None


def plan(args: argparse.Namespace) -> Plan:
    """The comparison's arms, seeds, paths and provenance; every refusal before anything trains."""
    from dormouse.runs import open_corpus

    cfgs = arm_configs(args)
    out = args.out
    history = Path(args.history) if args.history else COMMITTED
    record_to = Path(args.history) if args.history else out / RECORD_FILE
    if args.record:
        history_header(record_to)  # a header the rows cannot go under is refused now, not after the runs
    commit = git_commit(repo_root())  # the code that trains, before hours in which the tree may change
    code = code_fingerprint()
    started = datetime.datetime.now(datetime.UTC)
    first_seed, minutes = cfgs["a"].train.seed, cfgs["a"].train.minutes
    seeds = [first_seed + i for i in range(args.seeds)]
    if args.reuse_a and minutes:
        raise ConfigError("--reuse-a needs --steps: reused runs trained a fixed number of steps")
    corpus, note = open_corpus(args.data)
    a_steps = auto_steps_of(cfgs["a"], corpus)
    steps = None if minutes or args.equal == "time" else dict.fromkeys(ARMS, a_steps)
    device = torch.device(cfgs["a"].train.device)
    reused = None
    if args.reuse_a:
        reused = reused_a_runs(
            Path(args.reuse_a),
            cfgs["a"],
            seeds,
            a_steps,
            corpus=corpus,
            code=code,
            device=device_name(device),
            eval_depths=args.eval_depths,
        )
    return Plan(
        cfgs,
        out,
        history,
        record_to,
        commit,
        code,
        started,
        seeds,
        steps,
        a_steps,
        minutes,
        args.equal,
        corpus,
        note,
        device,
        reused,
    )


def auto_steps_of(cfg: Config, corpus: Corpus) -> int:
    """Arm A's steps: the config's, or under `--steps auto` the ones its run would fit (train/budget.py)."""
    params = DormouseLM(cfg.model).num_params() if cfg.train.steps == STEPS_AUTO else 0
    cfg, note = budget.resolved(cfg, corpus.split_size("train"), params)
    if note:
        print(f"arm A: {note}")
    return cfg.train.steps


def pricing_run(p: Plan) -> dict:
    """`--minutes` or `--equal time`: time each arm here and now, and set each arm's steps to what fits in
    the budget (--minutes, else arm A's steps): the slower arm's (equal steps) or its own (equal time)."""
    ms = {
        arm: measure_ms_per_step(for_round(cfg, p.seeds[0], PRICE_WARMUP + PRICE_STEPS), p.corpus, p.note)
        for arm, cfg in p.cfgs.items()
    }
    p.steps = fitted_steps(ms, p.equal, minutes=p.minutes, steps=p.a_steps)
    print(f"pricing run: ms/step A {ms['a']:.4g}, B {ms['b']:.4g}; steps {steps_text(p.steps)}")
    return {"warmup": PRICE_WARMUP, "steps": PRICE_STEPS, "ms_per_step": ms}


def train_rounds(p: Plan, eval_depths: bool) -> tuple[dict[str, list[dict]], list[str]]:
    """Every seed round of both arms (a reused arm A's runs taken as they are), alternating the order; the
    runs per arm and the order they ran in."""
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    if p.reused is not None:
        runs["a"] = p.reused[1]
        print(f"arm A: the runs of {p.reused[0]} (reused: trained and timed in that comparison)")
    order = []
    for i, seed in enumerate(p.seeds):
        for arm in ARMS if i % 2 == 0 else ARMS[::-1]:  # A B, B A, ...: drift in machine speed hits both arms
            if arm == "a" and p.reused is not None:
                continue
            order.append(f"{arm}/{seed}")
            cfg = for_round(p.cfgs[arm], seed, p.steps[arm])
            runs[arm].append(run_arm(cfg, p.corpus, p.note, p.out / arm / f"seed-{seed}", eval_depths=eval_depths))
    return runs, order


def compare(args: argparse.Namespace) -> dict:
    """One comparison of arm A (`args.a`) and arm B (`args.b`, one string) into the new folder `args.out`;
    returns what it wrote to ab.json."""
    from dormouse.plots import plot_ab

    p = plan(args)
    fixed = None if p.minutes else p.a_steps
    cost = price(p.history, p.cfgs, p.corpus, steps=fixed, minutes=p.minutes, seeds=len(p.seeds), equal=p.equal)
    print(cost["text"])
    pricing = pricing_run(p) if p.steps is None else None
    if p.equal == "time":
        span = f"--minutes {p.minutes:g}" if p.minutes else f"arm A's {p.a_steps} steps"
        step_rule = f"{EQUAL_TIME_RULE}: the steps each arm fits in {span} at its pricing-run ms/step"
    elif p.minutes:
        step_rule = f"--minutes {p.minutes:g}: the steps the slower arm fits in the budget at its pricing-run ms/step"
    else:
        step_rule = f"--steps {fixed}"
    assert p.steps is not None
    runs, order = train_rounds(p, args.eval_depths)
    per_seed, overall = summarise(runs)
    if args.eval_depths:
        overall["bpb_by_depth"] = {arm: depth_means(runs[arm]) for arm in ARMS}
    result = {
        "commit": p.commit,
        "code": p.code,
        "device": device_name(p.device),
        "torch": torch.__version__,
        "preset": p.cfgs["a"].preset,
        "data": p.note,
        "fingerprint": p.corpus.fingerprint,
        "seeds": p.seeds,
        "steps": one_or_per_arm(p.steps),
        "step_rule": step_rule,
        "pricing_run": pricing,
        "order": order,
        "cost": cost,
        "reused_a": None if p.reused is None else shown_path(p.reused[0]),
        "arms": {
            arm: {"flags": getattr(args, arm), "config": for_round(p.cfgs[arm], p.seeds[0], p.steps[arm]).to_dict()}
            for arm in ARMS
        },
        "runs": runs,
        "per_seed": per_seed,
        "overall": overall,
    }
    (p.out / "ab.json").write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    plot_ab(result, p.out / "ab.png")
    for line in report_lines(per_seed, overall):
        print(line)
    print(f"ab: {p.out / 'ab.json'}, {p.out / 'ab.png'}")
    if args.record:
        record(p, result)
    return result


def record(p: Plan, result: dict) -> None:
    """`--record`: one row per arm trained here (a reused arm A has its row already, from the comparison
    that trained it)."""
    rows = dict(zip(ARMS, history_rows(result, p.cfgs, p.out, p.started), strict=True))
    recorded = ARMS[1:] if p.reused is not None else ARMS
    for arm in recorded:
        append_row(p.record_to, rows[arm])
    print(f"ab: appended {len(recorded)} row(s) (arm {' and '.join(a.upper() for a in recorded)}) to {p.record_to}")
