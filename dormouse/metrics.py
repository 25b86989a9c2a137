"""RUN/metrics.jsonl, one JSON record a line (`train`, `eval`, `resume`, `early_stop`): read back checked,
and held against the checkpoints of the run. A line that is not such a record, or eval records that
disagree with a checkpoint's sealed best, are refused naming the file: the curves, `--record` rows and
the `ab` comparisons read their scores from here.
"""

import json
import math
from pathlib import Path

from dormouse.errors import CheckpointError

METRICS = "metrics.jsonl"
NUMBERS = {"eval": "bpb", "train": "ce"}  # the score each kind of record must hold, a finite number


def records(run: str | Path) -> list[dict]:
    """Every record of `run`'s metrics.jsonl, in order; [] when the run has none."""
    path = Path(run) / METRICS
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path} is not UTF-8 text ({e}); restore it from a copy") from None
    return [_record(path, n, line) for n, line in enumerate(lines, 1)]


def _record(path: Path, n: int, line: str) -> dict:
    try:
        record = json.loads(line)
    except ValueError as e:
        raise CheckpointError(f"{path} line {n} is not JSON ({e}); restore it from a copy") from None
    if not isinstance(record, dict):
        raise CheckpointError(f"{path} line {n} is not a JSON object; restore it from a copy")
    step, kind = record.get("step"), record.get("kind")
    if not isinstance(kind, str) or not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{path} line {n} has kind={kind!r} step={step!r}; restore it from a copy")
    score = record.get(NUMBERS.get(kind), 0.0)
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        raise CheckpointError(f"{path} line {n}: {NUMBERS[kind]} is {score!r}; restore it from a copy")
    return record


def check_best(run: str | Path, state: dict, path: Path) -> None:
    """The eval records up to checkpoint `path`'s step agree with its sealed state.json: their lowest bpb is
    its best_bpb, scored at its best_step. Nothing to check in a run without metrics.jsonl."""
    if not (Path(run) / METRICS).is_file():
        return
    evals = [r for r in records(run) if r["kind"] == "eval" and r["step"] <= state["step"]]
    best_bpb, best_step = state["best_bpb"], state["best_step"]
    lowest = min((r["bpb"] for r in evals), default=None)
    scored = sorted({r["bpb"] for r in evals if r["step"] == best_step})
    if lowest == best_bpb and (best_step is None or scored == [best_bpb]):
        return
    found = f"lowest eval bpb {lowest!r} up to step {state['step']}"
    if best_step is not None:
        found += f" and bpb {scored or 'none'} at step {best_step}"
    raise CheckpointError(
        f"{Path(run) / METRICS} records {found}, but {path / 'state.json'} (sealed) says best_bpb {best_bpb!r} at "
        f"step {best_step}: {METRICS} was edited; restore it from a copy"
    )
