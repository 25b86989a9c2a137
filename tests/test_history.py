"""History TSVs as data: only rows of the very setting count as measurements; the committed one's rows
are complete and name only logs that exist; `--record` writes into the run directory unless told."""

import json
from pathlib import Path

import pytest

from dormouse import config
from dormouse.cli import main
from dormouse.resolve import resolve
from dormouse.tools.bench.rows import COLUMNS, COMMITTED
from dormouse.tools.history import measured_rows, read_history, setting
from dormouse.tools.train_row import train_row

WANTED = {
    "device": "cpu (AMD EPYC, 1 threads)",
    "preset": "nano",
    "batch": "8",
    "seq_len": "256",
    "dtype": "fp32",
    "arms": "kda(chunked),engram=2-3-4x2",
    "params": "3691976",
}


def row(note: str, ms: str = "2500", **cells) -> dict[str, str]:
    out = dict.fromkeys(COLUMNS, "-")
    out.update(model="dormouse", compiled="no", ms_per_step=ms, note=note, **WANTED)
    out.update(cells)
    return out


def write_tsv(path, rows) -> None:
    lines = ["\t".join(COLUMNS)] + ["\t".join(r[c] for c in COLUMNS) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def test_only_rows_of_the_same_setting_are_measurements(tmp_path):
    rows = [
        row("old", "2600"),
        row("other device", "5", device="NVIDIA H200"),
        row("other threads", "1300", device="cpu (AMD EPYC, 2 threads)"),
        row("other preset", "9000", preset="small"),
        row("other shape", "700", batch="4"),
        row("other dtype", "2500", dtype="bf16"),
        row("other arms", "900", arms="attention"),
        row("other size", "4000", params="9000000"),
        row("compiled", "1000", compiled="yes"),
        row("a baseline", "1000", model="fla-kda"),
        row("no number", "-"),
        row('quoted "note"', "2550"),
        row("ab --record", "2450", heldout_bpb="2.345678", seeds="3", warmup="0", mfu="-"),
        row("new", "2400"),
    ]
    write_tsv(tmp_path / "history.tsv", rows)
    read = read_history(tmp_path / "history.tsv")
    assert read == rows  # file order; a quote in a cell is a plain character
    found = measured_rows(read, WANTED)
    # oldest first: the newest is last; an ab row times the same Trainer.train_step, so it prices too
    assert [r["note"] for r in found] == ["old", 'quoted "note"', "ab --record", "new"]


def test_no_file_and_no_match_are_no_rows(tmp_path):
    assert read_history(tmp_path / "absent.tsv") == []
    write_tsv(tmp_path / "history.tsv", [row("h200", device="NVIDIA H200")])
    assert measured_rows(read_history(tmp_path / "history.tsv"), WANTED) == []


def test_train_record_appends_the_run_as_one_priceable_row(random_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    history = run / "history.tsv"  # no --history: the run directory's own
    tiny = ["--d-model", "32", "--n-heads", "2", "--ffn-hidden", "64", "--kda-chunk-size", "16", "--no-engram"]
    tiny += ["--seq-len", "32", "--batch-size", "4", "--device", "cpu", "--eval-bytes", "64", "--ema-decay", "0.9"]
    argv = [
        "train",
        "--data",
        str(random_corpus(3000, repeats=2)),
        "--out",
        str(run),
        "--steps",
        "4",
        "--eval-every",
        "2",
        *tiny,
    ]
    committed = COMMITTED.read_bytes()
    assert main([*argv, "--record"]) == 0
    assert COMMITTED.read_bytes() == committed
    evals = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]
    (got,) = read_history(history)
    assert f"held-out {got['heldout_bpb']} bpb" in capsys.readouterr().out
    best = min(evals, key=lambda e: e["bpb"])
    assert [e["step"] for e in evals] == [2, 4] and (got["heldout_bpb"], got["seeds"]) == (f"{best['bpb']:.6f}", "1")
    assert got["note"] == (
        f"train {run}: best at step {best['step']}; held-out bpb (ema0.9 weights) by step "
        f"2:{evals[0]['bpb']:.4f} 4:{evals[1]['bpb']:.4f}; wall {evals[-1]['wall_s']:.1f} s since import"
    )
    assert (got["model"], got["preset"], got["batch"], got["seq_len"], got["warmup"], got["steps"]) == (
        "dormouse",
        "nano",
        "4",
        "32",
        "0",
        "4",
    )
    assert "ema=0.9" in got["arms"] and got["log"] == str(run / "metrics.jsonl")
    assert float(got["ms_min"]) <= float(got["ms_per_step"]) <= float(got["ms_max"])
    # first_step_s is in seconds to 4 decimals: within 0.05 ms of a step time
    assert float(got["ms_min"]) - 0.05 <= float(got["first_step_s"]) * 1000 <= float(got["ms_max"]) + 0.05
    # the row prices the run's setting, as an A/B arm's recorded row does
    cfg = config.Config.from_dict(json.loads((run / "config.json").read_text()))
    assert measured_rows(read_history(history), setting(cfg)) == [got]


@pytest.mark.parametrize("command", [["train", "--steps", "1"], ["generate", "RUN", "--prompt", "x"]])
def test_history_without_record_is_refused_before_anything_runs(command, tmp_path, capsys):
    assert main([*command, "--history", str(tmp_path / "h.tsv"), "--out", str(tmp_path / "r")]) == 2
    assert "add --record" in capsys.readouterr().err and not (tmp_path / "r").exists()
    assert not (tmp_path / "h.tsv").exists()


def test_a_run_rows_timing_is_every_steps_median_with_the_first_step_apart():
    cfg = resolve(config.build("nano", {"train": {"batch_size": 2, "seq_len": 64}}), cuda_available=False)
    # the last eval is worse than the one before: the row's score is the best, the run's result
    evals = [{"step": 2, "bpb": 3.5, "wall_s": 1.0}, {"step": 4, "bpb": 3.25, "wall_s": 1.5}]
    evals.append({"step": 6, "bpb": 3.3, "wall_s": 2.04})
    got = train_row(cfg, [100.0, 10.0, 20.0, 30.0], evals, run=Path("/r"), commit="abc", torch_version="2.13")
    # median of 100, 10, 20, 30 = 25 ms; 128 positions per step / 0.025 s = 5120 per s;
    # inclusive quartiles 17.5 and 47.5 (30 + 0.25 * 70): IQR 30
    assert (got["ms_per_step"], got["tokens_per_s"], got["first_step_s"]) == ("25.0000", "5120", "0.1000")
    assert (got["ms_min"], got["ms_max"], got["ms_iqr"], got["steps"]) == ("10.0000", "100.0000", "30.0000", "4")
    assert (got["heldout_bpb"], got["seeds"], got["commit"]) == ("3.250000", "1", "abc")
    assert got["log"] == "/r/metrics.jsonl"
    curve = "2:3.5000 4:3.2500 6:3.3000"
    assert got["note"] == f"train /r: best at step 4; held-out bpb by step {curve}; wall 2.0 s since import"


def test_every_committed_row_is_complete_and_names_a_log_that_exists_or_none():
    header = COMMITTED.read_text(encoding="utf-8").splitlines()[0].split("\t")
    rows = read_history(COMMITTED)
    assert header == list(COLUMNS) and len(rows) >= 300
    root = COMMITTED.parents[1]
    for i, r in enumerate(rows, 2):  # line numbers of the file
        assert None not in r and all(r[c] for c in COLUMNS), f"line {i}: a cell missing or empty"
        assert r["log"] == "-" or (root / r["log"]).is_file(), f"line {i}: log {r['log']} does not exist"
