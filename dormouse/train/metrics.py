"""What a run directory holds besides its checkpoints: train.log's lines, metrics.jsonl's records (one per
training step, eval, resume and early stop), config.json and run.json (where it came from, and its result).
"""

import json
from pathlib import Path

from tqdm import tqdm

from dormouse import run_lock, runs
from dormouse.config import Config
from dormouse.data.shards import Corpus
from dormouse.errors import ConfigError
from dormouse.evaluation import append_jsonl


class MetricsWriter:
    """Writes run directory `run`'s logs and records. Under torchrun rank 0 alone writes (`is_main`); on the
    other ranks every method does nothing."""

    def __init__(self, run: Path, is_main: bool):
        self.run, self.is_main = run, is_main
        self.metrics = run / "metrics.jsonl"

    def create(self, cfg: Config, corpus: Corpus, run_id: str, corpus_note: str) -> None:
        """A new run's directory: its config and where its data came from."""
        if not self.is_main:
            return
        if self.run.exists() and any(p.name != run_lock.LOCK for p in self.run.iterdir()):
            raise ConfigError(f"run directory {self.run} is not empty: pass --resume {self.run} or a new --out")
        self.run.mkdir(parents=True, exist_ok=True)
        runs.write_atomic(self.run / "config.json", cfg.to_json() + "\n")
        meta = {"run_id": run_id, "corpus": str(corpus.root), "fingerprint": corpus.fingerprint}
        runs.write_atomic(self.run / "run.json", json.dumps({**meta, "corpus_note": corpus_note}, indent=2) + "\n")

    def resumed(self, step: int, cfg: Config, changed: dict) -> tuple[int, float] | None:
        """A resume from the checkpoint of `step` with config `cfg` (`changed`: what differs from the
        checkpoint's); returns the (step, held-out bpb) of the latest eval kept, None if none."""
        if not self.is_main:
            return None
        last_eval = None
        # Records the interrupted run wrote after its last checkpoint are replayed now: drop them.
        if self.metrics.exists():
            kept = [line for line in self.metrics.read_text().splitlines() if json.loads(line)["step"] <= step]
            runs.write_atomic(self.metrics, "".join(line + "\n" for line in kept))
            scored = [r for r in map(json.loads, kept) if r["kind"] == "eval"]
            last_eval = (scored[-1]["step"], scored[-1]["bpb"]) if scored else None
        # What this resume changed, kept: a later plain --resume goes on with it.
        runs.write_atomic(self.run / "config.json", cfg.to_json() + "\n")
        append_jsonl(self.metrics, {"kind": "resume", "step": step, "changed": changed})
        return last_eval

    def log(self, text: str) -> None:
        """A line on the terminal (above the progress bar) and in train.log."""
        if not self.is_main:
            return
        tqdm.write(text)
        with open(self.run / "train.log", "a") as f:
            f.write(text + "\n")

    def append(self, record: dict) -> None:
        """One record of metrics.jsonl."""
        if self.is_main:
            append_jsonl(self.metrics, record)

    def write_result(self, result: dict) -> None:
        """run.json gets the run's result (its other keys kept); train.log its line."""
        if not self.is_main:
            return
        meta = json.loads((self.run / "run.json").read_text())
        runs.write_atomic(self.run / "run.json", json.dumps({**meta, **result}, indent=2) + "\n")
        with open(self.run / "train.log", "a") as f:
            f.write(runs.result_line(self.run, result) + "\n")
