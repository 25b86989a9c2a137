"""`dormouse ab`: the statistics by hand, the pricing from history rows, real tiny A/Bs (keys, determinism,
the --minutes rule, --record and --eval-depths with the arms to be run) and every refusal of the protocol."""

import json
import math
import statistics
import sys
from pathlib import Path

import pytest
import torch

from dormouse import config
from dormouse.cli import main
from dormouse.data.shards import load_corpus
from dormouse.resolve import resolve
from dormouse.tools import ab, ab_merge, ab_table
from dormouse.tools.ab_price import fitted_steps, price
from dormouse.tools.ab_report import report_lines, steps_text
from dormouse.tools.ab_stats import NO_INTERVAL, paired_difference, t_critical, verdict
from dormouse.tools.bench.provenance import code_fingerprint
from dormouse.tools.bench.rows import ADDED_COLUMNS, COLUMNS, COMMITTED
from dormouse.tools.history import measured_rows, read_history, setting

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches"))
import ab_record  # noqa: E402

TINY = ["--d-model", "32", "--n-heads", "2", "--ffn-hidden", "64", "--kda-chunk-size", "16"]
TINY += ["--engram-rows", "256", "--engram-dim", "8", "--seq-len", "32", "--batch-size", "4", "--device", "cpu"]
TINY += ["--warmup-steps", "1", "--eval-every", "2", "--eval-bytes", "64"]
KEYS = {
    "commit",
    "code",
    "device",
    "torch",
    "preset",
    "data",
    "fingerprint",
    "seeds",
    "steps",
    "step_rule",
    "pricing_run",
}
KEYS |= {"order", "cost", "reused_a", "arms", "runs", "per_seed", "overall"}
OVERALL = {"a_bpb_mean", "b_bpb_mean", "diff_mean", "diff_sd", "dof", "t", "ci95", "a_ms_per_step", "b_ms_per_step"}
OVERALL |= {"verdict"}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus_dir(random_corpus):
    return random_corpus(3000, repeats=2)


# ---- statistics ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dof, table", [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (9, 2.2622), (30, 2.0423)])
def test_t_critical_matches_the_tables(dof, table):
    assert t_critical(dof) == pytest.approx(table, abs=1e-4)


def test_b_better_when_the_interval_is_below_zero():
    # differences -0.02, -0.03, -0.025: mean -0.025, sd 0.005, half-width 4.30265 · 0.005 / √3 = 0.0124207
    d = paired_difference([2.0, 2.0, 2.0], [1.98, 1.97, 1.975])
    assert (d.n, d.mean, d.sd, d.t) == (3, pytest.approx(-0.025), pytest.approx(0.005), pytest.approx(4.302653, 1e-6))
    assert d.ci95 == (pytest.approx(-0.0374207, abs=1e-6), pytest.approx(-0.0125793, abs=1e-6))
    assert d.verdict == "B better by 0.0250 bpb"


def test_a_better_when_the_interval_is_above_zero():
    # differences 0.04, 0.06, 0.05, 0.05: mean 0.05, sd √(0.0002/3) = 0.0081650, half 3.182446 · 0.008165 / 2
    d = paired_difference([1.0] * 4, [1.04, 1.06, 1.05, 1.05])
    assert d.ci95 == (pytest.approx(0.0370079, abs=1e-6), pytest.approx(0.0629921, abs=1e-6))
    assert d.verdict == "A better by 0.0500 bpb"


def test_no_difference_when_the_interval_spans_zero():
    # differences 0.01, -0.01, 0.03: mean 0.01, sd 0.02, half 4.302653 · 0.02 / √3 = 0.0496828
    d = paired_difference([3.0, 3.0, 3.0], [3.01, 2.99, 3.03])
    assert d.ci95 == (pytest.approx(-0.0396828, abs=1e-6), pytest.approx(0.0596828, abs=1e-6))
    assert d.verdict == "no difference detected"
    assert paired_difference([2.0, 2.5], [2.0, 2.5]).ci95 == (0.0, 0.0)  # equal arms: zero is in [0, 0]
    assert verdict((-0.1, 0.0), -0.05) == "no difference detected"  # touching zero is spanning it


def test_one_seed_has_no_interval():
    d = paired_difference([2.0], [1.5])
    assert (d.mean, d.sd, d.t, d.ci95, d.verdict) == (-0.5, None, None, None, NO_INTERVAL)


# ---- pricing -------------------------------------------------------------------------------------------------


def tiny_configs(**b_model) -> dict[str, config.Config]:
    model = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, "engram_rows": 256, "engram_dim": 8}
    train = {"seq_len": 32, "batch_size": 4, "eval_every": 2, "eval_bytes": 64, "device": "cpu"}
    build = lambda extra: resolve(config.build("nano", {"model": {**model, **extra}, "train": train}))  # noqa: E731
    return {"a": build({}), "b": build(b_model)}


def history_row(cfg, ms: str, **cells) -> str:
    values = dict.fromkeys(COLUMNS, "-")
    values.update(model="dormouse", compiled="no", ms_per_step=ms, date="2026-12-02T00:00:00Z", commit="abc")
    values.update(setting(cfg), **cells)
    return "\t".join(values[c] for c in COLUMNS)


def test_price_uses_only_rows_of_this_device_and_setting(corpus_dir, tmp_path):
    cfgs = tiny_configs(mixer="attention")
    history = tmp_path / "history.tsv"
    rows = [history_row(cfgs["a"], "1", device="NVIDIA H200"), history_row(cfgs["a"], "1", preset="small")]
    history.write_text("\n".join(["\t".join(COLUMNS), *rows, history_row(cfgs["a"], "100")]) + "\n")
    corpus = load_corpus(corpus_dir)
    unknown = price(history, cfgs, corpus, steps=10, minutes=0.0, seeds=3)  # arm B (attention) has no row
    device = setting(cfgs["a"])["device"]
    assert not unknown["known"] and unknown["text"].startswith(f"cost unknown: no bench row for {device} nano (")
    assert "arms attention" in unknown["text"] and "ms/step" not in unknown["text"]

    history.write_text(history.read_text() + history_row(cfgs["b"], "50") + "\n")
    known = price(history, cfgs, corpus, steps=10, minutes=0.0, seeds=3)
    assert known["known"] and known["steps"] == 10
    assert known["train_s"] == pytest.approx((100 + 50) * 10 * 3 / 1000)
    assert "A 100 ms/step" in known["text"] and "B 50 ms/step" in known["text"]
    # per run: 5 evals of the 64-byte prefix (2 windows of 32: 1 batch) and the full walk (599 bytes: 18
    # windows of 32 in 5 batches of 4, then the last 23 bytes: 6 batches); a forward is a third of a step
    assert known["eval_s"] == pytest.approx((100 + 50) / 3 * (5 * 1 + 6) * 3 / 1000)
    by_minutes = price(history, cfgs, corpus, steps=None, minutes=0.01, seeds=1)
    assert by_minutes["steps"] == 6  # 600 ms / the slower arm's 100 ms
    by_time = price(history, cfgs, corpus, steps=None, minutes=0.01, seeds=1, equal="time")
    assert by_time["steps"] == {"a": 6, "b": 12}  # 600 ms / each arm's own 100 and 50 ms
    assert by_time["train_s"] == pytest.approx((100 * 6 + 50 * 12) / 1000)


def test_fitted_steps_by_hand():
    ms = {"a": 7.0, "b": 3.0}  # a budget of 0.001 min = 60 ms
    assert fitted_steps(ms, "steps", minutes=0.001) == {"a": 8, "b": 8}  # ⌊60 / 7⌋ for both
    assert fitted_steps(ms, "time", minutes=0.001) == {"a": 8, "b": 20}  # ⌊60 / 7⌋, ⌊60 / 3⌋
    assert fitted_steps({"a": 90.0, "b": 3.0}, "time", minutes=0.001) == {"a": 1, "b": 20}  # at least one step
    assert fitted_steps(ms, "steps", steps=10) == {"a": 10, "b": 10}
    assert fitted_steps(ms, "time", steps=10) == {"a": 10, "b": 23}  # B in A's 70 ms: 70 / 3 = 23.3
    assert fitted_steps(ms, "time", steps=20) == {"a": 20, "b": 47}  # 140 / 3 = 46.7, rounded


# ---- real runs -----------------------------------------------------------------------------------------------


def run_ab(corpus_dir, tmp_path, out: str, *argv: str) -> dict:
    history = tmp_path / "no-history.tsv"
    args = ["ab", *argv, "--data", str(corpus_dir), "--out", str(tmp_path / out), "--history", str(history), *TINY]
    assert main(args) == 0
    return json.loads((tmp_path / out / "ab.json").read_text())


def test_two_seeds_write_every_number_and_repeat_bitwise(corpus_dir, tmp_path):
    argv = ("--a", "", "--b", "--lr 0.01", "--seeds", "2", "--steps", "4")
    first = run_ab(corpus_dir, tmp_path, "one", *argv)
    assert set(first) == KEYS and set(first["overall"]) == OVERALL
    assert first["order"] == ["a/0", "b/0", "b/1", "a/1"] and first["seeds"] == [0, 1] and first["steps"] == 4
    assert first["cost"]["text"].startswith("cost unknown: no bench row for cpu")
    a, b = first["arms"]["a"]["config"], first["arms"]["b"]["config"]
    assert (a["train"]["lr"], b["train"]["lr"]) == (0.003, 0.01) and a["model"] == b["model"]
    assert a["train"]["patience"] == b["train"]["patience"] == 0  # no early stop: every run trains all steps
    for arm in ("a", "b"):
        for seed, run in zip((0, 1), first["runs"][arm], strict=True):
            assert (run["seed"], run["steps"], len(run["step_ms"])) == (seed, 4, 4)
            assert math.isfinite(run["bpb"]) and 0 < run["bpb"] < 9 and run["heldout_bytes"] == 599
            assert [s for s, _ in run["curve"]] == [2, 4] and run["ms_per_step"] > 0
    for row, a_run, b_run in zip(first["per_seed"], first["runs"]["a"], first["runs"]["b"], strict=True):
        assert row["diff"] == row["b_bpb"] - row["a_bpb"]
        for lowest, run in ((row["a_lowest"], a_run), (row["b_lowest"], b_run)):  # [step, bpb] of the curve's min
            assert lowest in run["curve"] and lowest[1] == min(bpb for _, bpb in run["curve"])
    overall = first["overall"]
    lines = report_lines(first["per_seed"], overall)
    (a_step, a_bpb), (b_step, b_bpb) = first["per_seed"][0]["a_lowest"], first["per_seed"][0]["b_lowest"]
    assert lines[0].endswith(f"; lowest eval A {a_bpb:.4f}@{a_step}, B {b_bpb:.4f}@{b_step}")
    before = {k: v for k, v in first["per_seed"][0].items() if not k.endswith("_lowest")}  # an older ab.json
    assert "lowest" not in report_lines([before], overall)[0]
    assert overall["dof"] == 1 and overall["t"] == pytest.approx(12.7062, abs=1e-4) and len(overall["ci95"]) == 2
    assert (tmp_path / "one" / "ab.png").stat().st_size > 0

    second = run_ab(corpus_dir, tmp_path, "two", *argv)
    for arm in ("a", "b"):
        assert [r["bpb"] for r in second["runs"][arm]] == [r["bpb"] for r in first["runs"][arm]]
        assert [r["curve"] for r in second["runs"][arm]] == [r["curve"] for r in first["runs"][arm]]

    rec = ab_record.record(first, "a figure", "a command", "a source")  # its evidence record
    assert set(rec) == {"figure", "value", "unit", "row", "command", "card", "commit", "date", "source"}
    assert (rec["value"], rec["card"], rec["commit"]) == (
        round(overall["a_bpb_mean"], 4),
        first["device"],
        first["commit"],
    )
    assert (rec["row"]["b_minus_a"], rec["row"]["ci95"]) == (
        round(overall["diff_mean"], 4),
        [round(x, 4) for x in overall["ci95"]],
    )
    pairs = [(round(r["a_bpb"], 4), round(r["b_bpb"], 4)) for r in first["per_seed"]]
    assert [(s["a"], s["b"]) for s in rec["row"]["per_seed"]] == pairs and rec["row"]["b_flags"] == "--lr 0.01"


def test_reuse_a_takes_arm_as_runs_and_trains_only_b(corpus_dir, tmp_path, capsys):
    base = ("--seeds", "2", "--steps", "4")
    first = run_ab(corpus_dir, tmp_path, "one", "--a", "", "--b", "--lr 0.01", *base)
    reuse = ("--reuse-a", str(tmp_path / "one"))
    second = run_ab(corpus_dir, tmp_path, "two", "--a", "", "--b", "--no-short-conv", *base, *reuse, "--record")
    (recorded,) = (tmp_path / "no-history.tsv").read_text().splitlines()[1:]  # arm B's row alone
    assert "arm B: --no-short-conv" in recorded
    assert second["runs"]["a"] == first["runs"]["a"] and second["order"] == ["b/0", "b/1"]
    assert second["reused_a"].endswith("one/ab.json") and "arm A: the runs of" in capsys.readouterr().out
    assert second["arms"]["b"]["config"]["model"]["short_conv"] is False
    assert [r["diff"] for r in second["per_seed"]] == [
        b["bpb"] - a["bpb"] for a, b in zip(first["runs"]["a"], second["runs"]["b"], strict=True)
    ]
    fresh = run_ab(corpus_dir, tmp_path, "fresh", "--a", "", "--b", "--no-short-conv", *base)
    assert [r["bpb"] for r in fresh["runs"]["b"]] == [r["bpb"] for r in second["runs"]["b"]]
    assert not (tmp_path / "two" / "a").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--a", "", "--seeds", "2", "--steps", "3"], "arm A's step count differs (4 there, 3 here)"),
        (["--a", "--lr 0.02", "--seeds", "2", "--steps", "4"], "its arm A is another config (train.lr differ)"),
        (["--a", "", "--seeds", "3", "--steps", "4"], "no arm-A run of seed(s) [2] there"),
        (["--a", "", "--seeds", "2", "--minutes", "1"], "--reuse-a needs --steps"),
    ],
)
def test_reuse_a_refuses_runs_that_are_not_this_arm_a(argv, message, corpus_dir, tmp_path, capsys):
    run_ab(corpus_dir, tmp_path, "one", "--a", "", "--b", "--lr 0.01", "--seeds", "2", "--steps", "4")
    reuse = ["--reuse-a", str(tmp_path / "one"), "--data", str(corpus_dir), "--out", str(tmp_path / "two")]
    assert main(["ab", *argv, "--b", "--no-short-conv", *reuse, *TINY]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "two").exists()


def test_reuse_a_of_a_folder_without_a_comparison_is_refused(corpus_dir, tmp_path, capsys):
    argv = ["ab", "--a", "", "--b", "--lr 0.01", "--steps", "4", "--reuse-a", str(tmp_path), *TINY]
    assert main([*argv, "--data", str(corpus_dir), "--out", str(tmp_path / "out")]) == 2
    assert f"--reuse-a {tmp_path}: cannot read {tmp_path}/ab.json" in capsys.readouterr().err


def test_minutes_trains_both_arms_the_steps_the_slower_arm_fits(corpus_dir, tmp_path, capsys):
    argv = ("--a", "", "--b", "--no-short-conv", "--seeds", "1", "--minutes", "0.004")
    result = run_ab(corpus_dir, tmp_path, "m", *argv)
    ms = result["pricing_run"]["ms_per_step"]
    assert result["steps"] == max(1, int(0.004 * 60_000 // max(ms.values())))
    assert [r["steps"] for arm in ("a", "b") for r in result["runs"][arm]] == [result["steps"]] * 2
    assert result["arms"]["b"]["config"]["model"]["short_conv"] is False  # a lone flag is an arm, not an option
    assert result["arms"]["a"]["config"]["train"]["minutes"] == 0.0  # the schedule runs over the fixed steps
    assert result["overall"]["ci95"] is None and result["overall"]["verdict"] == NO_INTERVAL
    assert "95% CI unknown (one seed)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "budget, steps, rule",
    [
        (("--minutes", "0.002"), {"a": 10, "b": 24}, "--equal time: the steps each arm fits in --minutes 0.002"),
        (("--steps", "6"), {"a": 6, "b": 14}, "--equal time: the steps each arm fits in arm A's 6 steps"),
    ],
)
def test_equal_time_trains_each_arm_the_steps_it_fits(budget, steps, rule, corpus_dir, tmp_path, monkeypatch):
    # The pricing run's clock replaced by fixed prices: KDA 12 ms, attention 5 ms a step. 0.002 min = 120 ms:
    # 10 and 24 steps; arm A's 6 steps take 72 ms, where B fits 14.4.
    monkeypatch.setattr(ab, "measure_ms_per_step", lambda cfg, *_: 12.0 if cfg.model.mixer == "kda" else 5.0)
    argv = ("--a", "", "--b", "--no-kda", "--seeds", "2", *budget, "--equal", "time")
    result = run_ab(corpus_dir, tmp_path, "t", *argv)
    assert result["steps"] == steps and result["step_rule"].startswith(rule)
    assert [[r["steps"] for r in result["runs"][arm]] for arm in ("a", "b")] == [[steps["a"]] * 2, [steps["b"]] * 2]
    assert [result["arms"][arm]["config"]["train"]["steps"] for arm in ("a", "b")] == [steps["a"], steps["b"]]
    assert ab_table.row("gpt", result).split(" | ")[3] == f"A {steps['a']}, B {steps['b']}"


def test_a_context_length_arm_trains_the_same_bytes_per_step_and_scores_the_same_bytes(corpus_dir, tmp_path):
    # TINY's batch is 4 × 32 bytes; arm B's 2 × 64 is the same 128 bytes per step with twice the context.
    argv = ("--a", "", "--b", "--seq-len 64 --batch-size 2", "--seeds", "1", "--steps", "2")
    result = run_ab(corpus_dir, tmp_path, "ctx", *argv)
    shapes = {arm: result["arms"][arm]["config"]["train"] for arm in ("a", "b")}
    assert [(shapes[arm]["batch_size"], shapes[arm]["seq_len"]) for arm in ("a", "b")] == [(4, 32), (2, 64)]
    a, b = (result["runs"][arm][0] for arm in ("a", "b"))
    every_target = load_corpus(corpus_dir).split_size("heldout") - 1  # the score walks the whole split
    assert a["heldout_bytes"] == b["heldout_bytes"] == every_target
    assert a["bpb"] != b["bpb"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--a", "", "--b", "--lr 0.003"], "resolve to the same config"),
        (["--a", "", "--b", "--no-such-flag 1"], "unrecognized arguments: --no-such-flag"),
        (["--a", "", "--b", "--lr 0.01", "--steps", "4", "--minutes", "1"], "--steps and --minutes are exclusive"),
        (["--a", "", "--b", "--batch-size 16"], "arm A trains 2048 bytes per step and arm B 4096"),
        (["--a", "--seq-len 64", "--b", ""], "arm A trains 512 bytes per step and arm B 2048"),
        (["--a", "", "--b", "--seed 1"], "--seed is held equal"),
        (["--a", "", "--b", "--steps 9"], "--steps is held equal"),
        (["--a", "", "--b", "--patience 2"], "--patience is held equal"),
        (["--a", "", "--b", "--lr 0.01", "--patience", "2"], "--patience: an A/B compares at equal steps"),
        (["--a", "", "--b", "--preset small"], "--preset is shared"),
        (["--a", "", "--b", "--lr '0.01"], "No closing quotation"),
        (["--a", "", "--b", "--lr 0.01", "--seeds", "0"], "--seeds 0: at least 1"),
    ],
)
def test_refusals_before_anything_runs(argv, message, tmp_path, capsys):
    assert main(["ab", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_arms_with_different_triton_precisions_are_refused_on_cuda(tmp_path, capsys, monkeypatch):
    # Both arms train in one process, where Triton's fp32 precision is fixed (precision.apply): fp32's
    # IEEE dots against bf16's TF32 ones would run one arm's kernels for both.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # for the config's resolve; nothing runs
    argv = ["ab", "--a", "--dtype fp32", "--b", "--dtype bf16", "--device", "cuda", "--kda-backend", "chunked"]
    argv += ["--norm-backend", "plain", "--conv-backend", "plain", "--swiglu-backend", "plain"]  # not fla's
    argv += ["--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert "arm A's dtype runs Triton's fp32 dots in ieee and arm B's in tf32" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_non_empty_out_is_refused(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ab.json").write_text("{}")
    assert main(["ab", "--a", "", "--b", "--lr 0.01", "--out", str(tmp_path / "out"), "--device", "cpu"]) == 2
    assert "is not empty" in capsys.readouterr().err


# ---- --record and --eval-depths ------------------------------------------------------------------------------


def test_record_and_eval_depths_append_one_priceable_row_per_arm(corpus_dir, tmp_path, capsys):
    # a history from before heldout_bpb and seeds: its header is extended once, its row gets '-' there
    old_columns = [c for c in COLUMNS if c not in ADDED_COLUMNS]
    old = dict.fromkeys(old_columns, "-") | {"model": "gpt-sdpa", "note": "an old row"}
    history = tmp_path / "history.tsv"
    history.write_text("\t".join(old_columns) + "\n" + "\t".join(old[c] for c in old_columns) + "\n")
    out = tmp_path / "rec"
    argv = ["ab", "--a", "", "--b", "--rand-depth", "--seeds", "2", "--steps", "2", "--data", str(corpus_dir)]
    argv += ["--out", str(out), "--history", str(history), "--record", "--eval-depths", *TINY, "--batch-size", "2"]
    assert main(argv) == 0
    result = json.loads((out / "ab.json").read_text())
    report = capsys.readouterr().out
    assert "held-out bpb by loop depth (depth:bpb, means over seeds): A 1:" in report

    for arm in ("a", "b"):
        for run in result["runs"][arm]:
            assert list(run["bpb_by_depth"]) == ["1", "2"]  # nano: depth 2
            # the same heldout_score on the same walk and weights, depth 2 given instead of None: bitwise
            assert run["bpb_by_depth"]["2"] == run["bpb"]
            assert math.isfinite(run["bpb_by_depth"]["1"])
        r0, r1 = result["runs"][arm]
        means = {d: statistics.fmean([r0["bpb_by_depth"][d], r1["bpb_by_depth"][d]]) for d in ("1", "2")}
        assert result["overall"]["bpb_by_depth"][arm] == means

    rows = read_history(history)
    assert history.read_text().splitlines()[0].split("\t") == list(COLUMNS)
    assert (
        len(rows) == 3 and rows[0]["note"] == "an old row" and (rows[0]["heldout_bpb"], rows[0]["seeds"]) == ("-", "-")
    )
    overall = result["overall"]
    for arm, row in zip(("a", "b"), rows[1:], strict=True):
        assert (row["model"], row["preset"], row["batch"], row["seq_len"], row["compiled"]) == (
            "dormouse",
            "nano",
            "2",
            "32",
            "no",
        )
        assert float(row["heldout_bpb"]) == round(overall[f"{arm}_bpb_mean"], 6) and row["seeds"] == "2"
        assert float(row["ms_per_step"]) == pytest.approx(overall[f"{arm}_ms_per_step"], abs=1e-4)
        assert (row["warmup"], row["steps"], row["mfu"], row["first_step_s"]) == ("0", "4", "-", "-")
        assert row["log"] == str(out / "ab.json") and row["commit"] == result["commit"]
        assert row["note"].startswith(f"ab {out} arm {arm.upper()}: ") and "; 2 steps per run; Δ(B−A) = " in row["note"]
        assert row["note"].endswith(
            f"{overall['verdict']}; depth bpb 1:{overall['bpb_by_depth'][arm]['1']:.4f} "
            f"2:{overall['bpb_by_depth'][arm]['2']:.4f}"
        )
    assert "rand_depth=1-2" in rows[2]["arms"] and "rand_depth" not in rows[1]["arms"]

    # a recorded row is a measurement of its arm's setting: pricing finds and uses it
    cfgs = {arm: config.Config.from_dict(result["arms"][arm]["config"]) for arm in ("a", "b")}
    for arm, row in zip(("a", "b"), rows[1:], strict=True):
        assert measured_rows(rows, setting(cfgs[arm])) == [row]
    cost = price(history, cfgs, load_corpus(corpus_dir), steps=2, minutes=0.0, seeds=2)
    assert cost["known"] and str(out / "ab.json") in cost["text"]


@pytest.mark.parametrize(
    "b", ["--mor", "--engram", "--dspark-weight 0.1", "--jepa-weight 0.1", "--ema-decay 0.5", "--byte-noise 0.05"]
)
def test_the_arms_to_be_run_record_with_depths(b, corpus_dir, tmp_path):
    # No --history: priced from the checkout's evidence/history.tsv, recorded in the comparison's folder.
    argv = ["ab", "--a", "", "--b", b, "--seeds", "1", "--steps", "2", "--data", str(corpus_dir), "--record"]
    argv += ["--eval-depths", "--out", str(tmp_path / "o"), *TINY]
    argv += ["--batch-size", "2", "--eval-bytes", "0"]  # the run's last eval is its score: the full walk
    committed = COMMITTED.read_bytes()
    assert main(argv) == 0
    result = json.loads((tmp_path / "o" / "ab.json").read_text())
    assert f" {COMMITTED}" in result["cost"]["text"] and COMMITTED.read_bytes() == committed
    rows = read_history(tmp_path / "o" / "history.tsv")
    assert [r["model"] for r in rows] == ["dormouse", "dormouse"] and rows[1]["note"].split(": ")[1].startswith(b)
    for arm, row in zip(("a", "b"), rows, strict=True):
        (run,) = result["runs"][arm]
        assert run["bpb_by_depth"]["2"] == run["bpb"] and float(row["heldout_bpb"]) == round(run["bpb"], 6)
        assert "[no interval]" in row["note"]


def test_record_refuses_a_foreign_history_before_anything_runs(tmp_path, capsys):
    history = tmp_path / "h.tsv"
    history.write_text("date\tcommit\n")
    argv = ["ab", "--a", "", "--b", "--lr 0.01", "--record", "--history", str(history), "--out", str(tmp_path / "o")]
    assert main([*argv, "--device", "cpu"]) == 2
    assert "migrate the file" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_reuse_a_holds_the_code_equal_not_the_commit(corpus_dir, tmp_path, capsys):
    run_ab(corpus_dir, tmp_path, "one", "--a", "", "--b", "--lr 0.01", "--seeds", "1", "--steps", "2")
    saved = tmp_path / "one" / "ab.json"
    result = json.loads(saved.read_text())
    assert result["code"] == code_fingerprint() and len(result["code"]) == 12
    saved.write_text(json.dumps({**result, "commit": "0123abc"}))  # docs committed between two comparisons
    argv = ("--a", "", "--b", "--no-short-conv", "--seeds", "1", "--steps", "2", "--reuse-a", str(tmp_path / "one"))
    assert run_ab(corpus_dir, tmp_path, "two", *argv)["runs"]["a"] == result["runs"]["a"]
    kept = tmp_path / "kept-ab.json"  # the file itself, copied out of its comparison's folder
    kept.write_text(saved.read_text())
    argv_file = (*argv[:-1], str(kept))
    assert run_ab(corpus_dir, tmp_path, "two-file", *argv_file)["runs"]["a"] == result["runs"]["a"]
    saved.write_text(json.dumps({**result, "code": "another-code"}))
    assert main(["ab", *argv, "--data", str(corpus_dir), "--out", str(tmp_path / "three"), *TINY]) == 2
    assert f"the code differs (another-code there, {result['code']} here)" in capsys.readouterr().err


def test_merged_seed_rounds_equal_one_two_seed_comparison(corpus_dir, tmp_path, capsys):
    argv = ("--a", "", "--b", "--lr 0.01", "--steps", "3")
    both = run_ab(corpus_dir, tmp_path, "both", *argv, "--seeds", "2")
    for seed in (0, 1):
        run_ab(corpus_dir, tmp_path, f"s{seed}", *argv, "--seeds", "1", "--seed", str(seed))
    inputs = [str(tmp_path / f"s{seed}" / "ab.json") for seed in (1, 0)]  # any order: runs sort by seed
    assert ab_merge.main([*inputs, "--out", str(tmp_path / "merged")]) == 0
    merged = json.loads((tmp_path / "merged" / "ab.json").read_text())
    assert merged["seeds"] == [0, 1] and merged["merged_from"] == inputs
    assert [r["bpb"] for arm in "ab" for r in merged["runs"][arm]] == [
        r["bpb"] for arm in "ab" for r in both["runs"][arm]
    ]
    same = ("a_bpb_mean", "b_bpb_mean", "diff_mean", "diff_sd", "dof", "t", "ci95", "verdict")
    assert {k: merged["overall"][k] for k in same} == {k: both["overall"][k] for k in same}
    assert (tmp_path / "merged" / "ab.png").is_file() and "verdict:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "second, message",
    [
        (("--a", "", "--b", "--lr 0.01", "--steps", "2", "--seed", "1"), "steps differs"),
        (("--a", "", "--b", "--lr 0.02", "--steps", "3", "--seed", "1"), "arm B is another config"),
        (("--a", "", "--b", "--lr 0.01", "--steps", "3", "--seed", "0"), "a seed appears twice"),
    ],
)
def test_merge_refuses_inputs_of_other_comparisons(second, message, corpus_dir, tmp_path, capsys):
    run_ab(corpus_dir, tmp_path, "one", "--a", "", "--b", "--lr 0.01", "--steps", "3", "--seeds", "1")
    run_ab(corpus_dir, tmp_path, "two", *second, "--seeds", "1")
    inputs = [str(tmp_path / name / "ab.json") for name in ("one", "two")]
    assert ab_merge.main([*inputs, "--out", str(tmp_path / "merged")]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "merged").exists()


def test_merge_of_equal_time_jobs_keeps_each_jobs_priced_steps(corpus_dir, tmp_path, capsys):
    # Under --equal time each job prices its arms' steps itself: B's may differ from job to job.
    rule = "--equal time: the steps each arm fits in arm A's 3 steps at its pricing-run ms/step"
    inputs = []
    for seed, b_steps in ((0, 5), (1, 6)):
        result = run_ab(
            corpus_dir,
            tmp_path,
            f"s{seed}",
            "--a",
            "",
            "--b",
            "--lr 0.01",
            "--steps",
            "3",
            "--seeds",
            "1",
            "--seed",
            str(seed),
        )
        result["step_rule"], result["steps"] = rule, {"a": 3, "b": b_steps}
        result["arms"]["b"]["config"]["train"]["steps"] = b_steps
        result["runs"]["b"][0]["steps"] = b_steps
        path = tmp_path / f"s{seed}" / "ab.json"
        path.write_text(json.dumps(result))
        inputs.append(str(path))
    assert ab_merge.main([*inputs, "--out", str(tmp_path / "merged")]) == 0
    merged = json.loads((tmp_path / "merged" / "ab.json").read_text())
    assert merged["steps"] == {"a": 3, "b": [5, 6]} and steps_text(merged["steps"]) == "A 3, B 5/6"
    fixed = json.loads(Path(inputs[1]).read_text()) | {"step_rule": "--steps 3"}
    Path(inputs[1]).write_text(json.dumps(fixed))  # the same steps under a fixed rule: refused
    assert ab_merge.main([*inputs, "--out", str(tmp_path / "m2")]) == 2
    assert "step_rule differs" in capsys.readouterr().err


def test_merge_refuses_a_comparison_without_a_code_fingerprint(corpus_dir, tmp_path, capsys):
    for seed in (0, 1):
        argv = ("--a", "", "--b", "--lr 0.01", "--steps", "2", "--seeds", "1", "--seed", str(seed))
        run_ab(corpus_dir, tmp_path, f"s{seed}", *argv)
    old = tmp_path / "s0" / "ab.json"
    old.write_text(json.dumps({k: v for k, v in json.loads(old.read_text()).items() if k != "code"}))
    assert ab_merge.main([str(old), str(tmp_path / "s1" / "ab.json"), "--out", str(tmp_path / "m")]) == 2
    assert "has no code fingerprint" in capsys.readouterr().err


def test_several_b_are_comparisons_against_one_arm_a_in_one_process(corpus_dir, tmp_path, capsys):
    base = ("--a", "", "--seeds", "2", "--steps", "4", "--data", str(corpus_dir), *TINY)
    argv = ["ab", *base, "--b", "--lr 0.01", "--b", "--no-short-conv", "--out", str(tmp_path / "rows")]
    argv += ["--history", str(tmp_path / "no-history.tsv")]
    assert main(argv) == 0
    one, two = (json.loads((tmp_path / "rows" / b / "ab.json").read_text()) for b in ("b1", "b2"))
    assert one["reused_a"] is None and two["reused_a"].endswith("rows/b1/ab.json")
    assert two["runs"]["a"] == one["runs"]["a"] and two["order"] == ["b/0", "b/1"]
    assert (one["arms"]["b"]["flags"], two["arms"]["b"]["flags"]) == ("--lr 0.01", "--no-short-conv")
    rows = (tmp_path / "rows" / "table.md").read_text().splitlines()[2:]
    assert [r.split(" | ")[:2] for r in rows] == [["| b1", "`--lr 0.01`"], ["| b2", "`--no-short-conv`"]]
    # each row is the comparison it would be alone, bit for bit
    alone = run_ab(corpus_dir, tmp_path, "alone", "--a", "", "--b", "--no-short-conv", "--seeds", "2", "--steps", "4")
    assert [r["bpb"] for r in alone["runs"]["b"]] == [r["bpb"] for r in two["runs"]["b"]]
    assert [r["bpb"] for r in alone["runs"]["a"]] == [r["bpb"] for r in two["runs"]["a"]]


def test_several_b_at_equal_time_share_arm_as_runs(corpus_dir, tmp_path, monkeypatch):
    # fixed prices (KDA 12 ms, attention 5 ms, KDA without the short conv 8 ms a step): arm A's 5 steps
    # take 60 ms, in which the attention arm fits 12 steps and the other 7.5 -> 8
    prices = lambda cfg, *_: 5.0 if cfg.model.mixer == "attention" else 12.0 if cfg.model.short_conv else 8.0  # noqa: E731
    monkeypatch.setattr(ab, "measure_ms_per_step", prices)
    argv = ["ab", "--a", "", "--seeds", "1", "--steps", "5", "--equal", "time", "--data", str(corpus_dir), *TINY]
    argv += ["--b", "--no-kda", "--b", "--no-short-conv", "--out", str(tmp_path / "rows")]
    assert main([*argv, "--history", str(tmp_path / "no-history.tsv")]) == 0
    one, two = (json.loads((tmp_path / "rows" / b / "ab.json").read_text()) for b in ("b1", "b2"))
    assert (one["steps"], two["steps"]) == ({"a": 5, "b": 12}, {"a": 5, "b": 8})
    assert two["reused_a"].endswith("rows/b1/ab.json") and two["runs"]["a"] == one["runs"]["a"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--b", "--lr 0.01", "--b", ""], "resolve to the same config"),
        (["--b", "--lr 0.01", "--b", "--lr 0.02", "--minutes", "1"], "several --b need --steps"),
    ],
)
def test_several_b_are_all_checked_before_anything_trains(extra, message, tmp_path, capsys):
    argv = ["ab", "--a", "", *extra, "--out", str(tmp_path / "rows"), *TINY]
    assert main(argv) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "rows").exists()
