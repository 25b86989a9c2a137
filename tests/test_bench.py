"""`dormouse bench`: a row with every column, self-consistent numbers, its log; FLOPs counted right."""

import csv
import math
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dormouse import config, ledger, rng
from dormouse.cli import main
from dormouse.errors import ConfigError
from dormouse.model.model import DormouseLM
from dormouse.ops.fla import pin as fla_pin
from dormouse.resolve import resolve
from dormouse.tools.bench import device, profiling, provenance
from dormouse.tools.bench import rows as history_rows
from dormouse.tools.bench.flops import count_flops

# The Engram arm is off in the timed tests: its 16384-row tables would dominate a
# 34k-parameter model's time, and it has its own tests. The FLOP count is checked with it on and off.
ENGRAM_OFF = {"engram": False}
TINY = ["--d-model", "32", "--n-heads", "2", "--ffn-hidden", "64", "--kda-chunk-size", "16"]
TINY += ["--no-engram"]
TINY += ["--seq-len", "32", "--batch-size", "4", "--device", "cpu"]
NUMBERS = ("ms_per_step", "tokens_per_s", "peak_mem_gib", "mfu", "first_step_s", "ms_min", "ms_max", "peak_tflops")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus_dir(random_corpus):
    return random_corpus(4000)


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_bench_appends_a_complete_row_and_writes_its_log(corpus_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(device, "CPU_PEAK_N", 256)  # the peak matmul, small for the test
    history, logs = tmp_path / "history.tsv", tmp_path / "logs"
    argv = ["bench", "--data", str(corpus_dir), *TINY, "--steps", "3", "--warmup", "1"]
    argv += ["--history", str(history), "--log-dir", str(logs), "--note", "a test\twith a tab"]
    assert main(argv) == 0
    second = ["bench", "--data", str(corpus_dir), *TINY, "--steps", "1", "--warmup", "1", "--attn-res"]
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")  # without --history and --log-dir: runs/bench/ of the working directory
    assert main(second) == 0
    header = history.read_text().splitlines()[0].split("\t")
    assert set(history_rows.REQUIRED_COLUMNS) <= set(header) and len(header) == len(set(header))
    rows = [*read_rows(history), *read_rows(tmp_path / "work" / "runs" / "bench" / "history.tsv")]
    assert len(rows) == 2  # one row per bench
    assert Path(rows[1]["log"]).parent == (tmp_path / "work" / "runs" / "bench" / "logs").resolve()
    row = rows[0]
    assert all(row[c] not in ("", None) for c in header)
    for c in NUMBERS:
        value = float(row[c])
        assert math.isfinite(value) and value > 0, (c, row[c])
    assert float(row["tokens_per_s"]) == pytest.approx(4 * 32 / (float(row["ms_per_step"]) / 1000), rel=1e-3)
    assert float(row["ms_min"]) <= float(row["ms_per_step"]) <= float(row["ms_max"])
    assert (row["model"], row["preset"], row["batch"], row["seq_len"]) == ("dormouse", "nano", "4", "32")
    assert (row["dtype"], row["compiled"], row["steps"], row["warmup"]) == ("fp32", "no", "3", "1")
    assert row["arms"].split(",")[0] == "kda(chunked)" and "attn_res" not in row["arms"]
    assert rows[1]["arms"].split(",")[:2] == ["kda(chunked)", "attn_res"] and rows[1]["note"] == "-"
    assert row["device"].startswith("cpu") and row["mem_source"].startswith("cpu ru_maxrss")
    assert row["peak_source"].startswith("measured this run") and row["fla"] == "-"
    assert row["torch"] == torch.__version__ and row["note"] == "a test with a tab"
    assert row["kernels"].startswith("kda=0/12 norm=0/")  # 3 timed steps x depth 2 x 2 layers, chunked on the CPU
    assert row["commit"] and row["date"].endswith("Z")
    assert (row["heldout_bpb"], row["seeds"]) == ("-", "-")  # bench trains nothing to score
    log = Path(row["log"])
    assert log.parent == logs.resolve() and log.name.endswith("-nano-cpu.log") and log.is_file()
    text = log.read_text()
    assert "step 0 warmup ms=" in text and "step 3 timed ms=" in text and f"ms_per_step\t{row['ms_per_step']}" in text
    assert Path(rows[1]["log"]) != log and Path(rows[1]["log"]).is_file()
    assert "appended a row" in capsys.readouterr().out


def test_a_history_with_other_columns_is_refused(tmp_path):
    history = tmp_path / "history.tsv"
    history.write_text("date\tcommit\n")
    row = dict.fromkeys(history_rows.COLUMNS, "x")
    with pytest.raises(ConfigError, match="migrate the file"):
        history_rows.append_row(history, row)
    history_rows.append_row(tmp_path / "new.tsv", row)
    history_rows.append_row(tmp_path / "new.tsv", row)
    assert len(read_rows(tmp_path / "new.tsv")) == 2


def test_bench_refuses_minutes_auto_steps_and_zero_warmup(capsys):
    assert main(["bench", "--minutes", "1"]) == 2
    assert main(["bench", "--warmup", "0"]) == 2
    assert main(["bench", "--steps", "auto"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 3 and "--steps auto has no meaning for bench" in err


ARMS = [{}, {"mixer": "attention"}, {"attention_layers": "1"}, {"n_experts": 4, "experts_top_k": 2}]
ARMS += [{"n_experts": 4, "experts_top_k": 2, "experts_dense": True}]
ARMS += [{"tie_embeddings": False}]
ARMS = [{**ENGRAM_OFF, **arm} for arm in ARMS] + [{"engram": True, "memory_slots": 8}]


@pytest.mark.parametrize("arm", ARMS, ids=lambda arm: ",".join(f"{k}={v}" for k, v in arm.items()) or "default")
def test_matmul_flops_equal_torchs_flop_counter(arm):
    """The 6·weights·positions part of the formula is exactly torch's count of the matmuls of a forward +
    backward (aten.mm/addmm); the mixer's own part is the documented formula."""
    model_cfg = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, "dropout": 0.0, **arm}
    if arm.get("memory_slots"):
        model_cfg["persistent_memory"] = "enabled"
    cfg = config.build("nano", {"model": model_cfg, "train": {"seq_len": 32, "batch_size": 4}})
    cfg = resolve(cfg, cuda_available=False)
    model = DormouseLM(cfg.model)
    x = torch.randint(0, 256, (4, 32), generator=rng.generator(0, 0, "test"))
    with FlopCounterMode(display=False) as counter:
        model(x, x).loss.backward()
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    flops = count_flops(model, cfg)
    assert flops.dense == counts["aten.mm"] + counts.get("aten.addmm", 0)
    H, K, C, S = 2, 16, 16, 32 + cfg.model.memory_slots
    kda, attention = H * (6 * K * K + 4 * C * K + 2 * C * K + C * 2 * K), H * K * 2 * (S + 1)
    kinds = {"": ["kda", "kda"], "attention": ["attention"] * 2, "1": ["kda", "attention"]}  # nano: 2 block layers
    layers = kinds["attention" if cfg.model.mixer == "attention" else cfg.model.attention_layers]
    per_layer = [kda if kind == "kda" else attention for kind in layers]
    assert flops.mixer == 3 * 4 * S * 2 * sum(per_layer)  # B·S·depth·Σ layers, fwd + bwd
    assert flops.per_step == flops.dense + flops.mixer


@pytest.mark.parametrize("bptt", [0, 1, 2])
def test_random_depth_flops_are_torchs_count_averaged_over_the_sampled_depths(bptt):
    """Under --rand-depth a step runs depth d uniform over [rand_depth_min, depth], backward through the
    last rand_depth_bptt iterations: the count is the mean of torch's counts at each d (engram on: its
    linears run in the first iteration only)."""
    model_cfg = {"d_model": 32, "n_heads": 2, "ffn_hidden": 64, "kda_chunk_size": 16, "depth": 3, "dropout": 0.0}
    train = {"seq_len": 32, "batch_size": 4, "rand_depth": True, "rand_depth_bptt": bptt}
    cfg = resolve(config.build("nano", {"model": model_cfg, "train": train}), cuda_available=False)
    model = DormouseLM(cfg.model)
    x = torch.randint(0, 256, (4, 32), generator=rng.generator(0, 0, "test"))
    counts = []
    for depth in (1, 2, 3):
        with FlopCounterMode(display=False) as counter:
            model(x, x, depth=depth, grad_iterations=bptt).loss.backward()
        ops = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
        counts.append(ops["aten.mm"] + ops.get("aten.addmm", 0))
    assert count_flops(model, cfg).dense == pytest.approx(sum(counts) / 3, rel=1e-12)


def test_the_nano_mixer_count_by_hand():
    cfg = resolve(config.build("nano", {"model": ENGRAM_OFF}), cuda_available=False)
    flops = count_flops(DormouseLM(cfg.model), cfg)
    # H=4, K=V=32, C=64: 4·(6·32·32 + 4·64·32 + 2·64·32 + 64·64) = 4·22528
    assert flops.mixer_fwd_per_position == 90112
    # 2 layers of q,k,v,o (4·128²), f_a, f_b, g_a, g_b (4·128·32), b_proj (128·4), SwiGLU (3·128·384), depth 2
    assert flops.block_weights == 2 * 2 * (4 * 128**2 + 4 * 128 * 32 + 128 * 4 + 3 * 128 * 384)
    assert flops.byte_weights == 256 * 128


def test_bench_op_kda_times_the_op_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "CPU_PEAK_N", 256)
    history, logs = tmp_path / "history.tsv", tmp_path / "logs"
    argv = ["bench", "--op", "kda", "--d-model", "32", "--n-heads", "2", "--kda-chunk-size", "16"]
    argv += ["--seq-len", "40", "--batch-size", "3", "--device", "cpu", "--steps", "2", "--warmup", "1"]
    assert main([*argv, "--history", str(history), "--log-dir", str(logs)]) == 0
    (row,) = read_rows(history)
    assert (row["model"], row["batch"], row["seq_len"]) == ("kda-op", "3", "40")
    assert row["arms"] == "kda(chunked),H=2,K=16,C=16" and row["kernels"] == "kda=0/3"
    # 3 · B · T · H · (6K² + 4CK + 2CK + 2CK) for K = V = 16, C = 16: the mixer formula of the docstring
    assert float(row["flops_per_step"]) == 3 * 3 * 40 * 2 * (6 * 256 + 4 * 256 + 2 * 256 + 2 * 256)
    # ms_per_step is written to 4 decimals: its rounding (±5e-5 ms) bounds the recomputed tokens/s.
    ms = float(row["ms_per_step"])
    assert float(row["tokens_per_s"]) == pytest.approx(3 * 40 / (ms / 1000), rel=6e-5 / ms + 1e-5)
    log = (Path(row["log"]) if Path(row["log"]).is_absolute() else provenance.repo_root() / row["log"]).read_text()
    assert "op: kda forward+backward, backend chunked" in log and log.count(" timed ms=") == 2


def test_bench_op_kda_refuses_what_does_not_apply(corpus_dir, capsys):
    assert main(["bench", "--op", "kda", "--data", str(corpus_dir), "--device", "cpu"]) == 2
    assert "--compile, --data and --profile do not apply" in capsys.readouterr().err
    assert main(["bench", "--op", "kda", "--no-kda", "--device", "cpu"]) == 2
    assert "drop --no-kda" in capsys.readouterr().err


def test_arms_name_the_loops_arms_so_rows_of_one_do_not_price_the_other():
    def arms_of(model=None, train=None):  # the recipe's regularisers off unless asked: each arm on its own
        model, train = {"dropout": 0.0, **(model or {})}, {"byte_noise": 0.0, "ema_decay": 0.0, **(train or {})}
        return history_rows.arms(resolve(config.build("nano", {"model": model, "train": train}), cuda_available=False))

    assert "experts" not in arms_of() and arms_of({"n_experts": 4}).endswith(",experts=4/top1")
    assert arms_of({"n_experts": 4, "experts_top_k": 2, "experts_dense": True}).endswith(",experts=4/top2/dense")
    assert "rand_depth" not in arms_of() and "mor" not in arms_of()
    assert arms_of(train={"rand_depth": True}).endswith(",rand_depth=1-2")
    assert arms_of({"depth": 3}, {"rand_depth": True, "rand_depth_bptt": 1}).endswith(",rand_depth=1-3/bptt1")
    assert arms_of({"mor": True, "mor_capacity": 0.25}).endswith(",mor=0.25")
    assert "dspark" not in arms_of() and "jepa" not in arms_of()
    assert arms_of({"dspark_weight": 0.1, "jepa_weight": 0.1}).endswith(",dspark=4/16,jepa=4x8")
    assert "dropout" not in arms_of() and arms_of({"dropout": 0.2}).endswith(",dropout=0.2")
    assert "drop_path" not in arms_of() and arms_of({"drop_path": 0.1}).endswith(",drop_path=0.1")
    assert "byte_noise" not in arms_of() and "ema" not in arms_of()
    assert arms_of(train={"byte_noise": 0.05, "ema_decay": 0.998}).endswith(",byte_noise=0.05,ema=0.998")
    assert arms_of(train={"byte_noise": 0.05, "byte_noise_source": "unigram"}).endswith(",byte_noise=0.05/unigram")


def test_arms_tell_a_graphed_step_from_one_with_an_eager_update():
    def graphed(**train):  # built, not resolved: resolving a CUDA graph needs CUDA
        return history_rows.arms(config.build("nano", {"train": {"cuda_graph": True, **train}}))

    assert graphed().endswith(",cuda_graph") and graphed(graph_update=False).endswith(",cuda_graph(eager_update)")


def test_profile_adds_the_op_table_to_the_log_only(corpus_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(device, "CPU_PEAK_N", 256)
    history, logs = tmp_path / "history.tsv", tmp_path / "logs"
    argv = ["bench", "--data", str(corpus_dir), *TINY, "--steps", "2", "--warmup", "1", "--profile", "1"]
    assert main([*argv, "--history", str(history), "--log-dir", str(logs)]) == 0
    (row,) = read_rows(history)
    assert row["steps"] == "2"  # the profiled step is not a timed step
    log = next(logs.iterdir()).read_text()
    assert "---- torch.profiler over 1 more step(s), not timed" in log and "Self CPU" in log
    by_shape = log.split("---- the same steps by op and input shapes\n")[1]
    assert "Input Shapes" in by_shape and "[4, 32, 32]" in by_shape  # a [B, T, d] input, by its shape
    assert log.count(" timed ms=") == 2


def test_busy_line_is_the_union_of_the_kernels_spans():
    # Two steps: spans (ms) 0-10 and 5-20 overlap (union 20, summed 25), 30-40 alone, 40-45 touches it.
    spans = [(30e3, 40e3), (0, 10e3), (5e3, 20e3), (40e3, 45e3)]
    assert profiling.busy_line(spans, steps=2, wall_us=100e3) == (
        "device busy 17.50 ms per step (union of its kernels; 20.00 ms summed) "
        "of 50.00 ms wall per step under the profiler"
    )
    line = profiling.busy_line([(0, 4000), (1000, 3000), (6000, 7000)], steps=1, wall_us=10_000)
    assert line.startswith("device busy 5.00 ms per step (union of its kernels; 7.00 ms summed) of 10.00 ms wall")


def test_idle_line_names_what_the_host_ran_while_the_device_waited():
    # One step, µs: busy 0-10, 12-20 (a 2 µs gap, under the 10 µs floor), 50-60, 100-110: gaps 20-50, 60-100.
    spans = [(12, 20), (0, 10), (50, 60), (100, 110), (52, 55)]
    host = [
        ("aten::_coalesce", 18, 40),  # 20 in the first gap
        ("cudaStreamSynchronize", 0, 19),  # none: the device was busy or in a short gap
        ("python step", 45, 105),  # 5 + 40
        ("aten::index_select", 61, 70),  # 9, inside python step's
    ]
    assert profiling.idle_line(spans, host, steps=1) == (
        "device idle 0.07 ms per step in 2 gaps of >= 10 us; host events overlapping them (ms per step): "
        "python step 0.04, aten::_coalesce 0.02, aten::index_select 0.01"
    )
    assert profiling.idle_line([(0, 10)], host, steps=2).endswith(
        "in 0 gaps of >= 10 us; host events overlapping them (ms per step): none recorded"
    )


def test_gaps_line_lists_the_longest_gaps_in_time_order_with_their_host_events():
    spans = [(12, 20), (0, 10), (50, 60), (100, 110), (52, 55)]  # gaps 10-12, 20-50, 60-100
    host = [("aten::_coalesce", 18, 40), ("python step", 45, 105), ("aten::index_select", 61, 70)]
    assert profiling.gaps_line(spans, host, top=2) == (
        "longest idle gaps in time order (us, host events overlapping most): "
        "30 [aten::_coalesce 20, python step 5]; 40 [python step 40, aten::index_select 9]"
    )
    assert profiling.gaps_line([(0, 10)], host).endswith("most): none")


def test_phase_lines_sum_each_phases_kernels_and_list_its_largest():
    # Two steps, µs. The update range holds a nested optimizer range: a kernel counts in the innermost.
    phases = [("dormouse.replay", 0, 100), ("dormouse.update", 100, 200), ("Optimizer.step", 150, 200)]
    phases += [("dormouse.replay", 300, 400), ("dormouse.update", 400, 500)]
    kernels = [("kda", 0, 60), ("mm", 60, 90), ("kda", 300, 360), ("mm", 360, 390), ("norm", 100, 110)]
    kernels += [("norm", 400, 410), ("adam", 150, 190), ("memset", 250, 254)]
    assert profiling.phase_lines(kernels, phases, steps=2) == [
        "device time by phase (ms per step): dormouse.replay 0.09, Optimizer.step 0.02, dormouse.update 0.01, "
        "(no phase) 0.00",
        "  dormouse.replay: kda 0.060 (1x); mm 0.030 (1x)",
        "  Optimizer.step: adam 0.020 (0.5x)",
        "  dormouse.update: norm 0.010 (1x)",
        "  (no phase): memset 0.002 (0.5x)",
    ]


def test_a_history_without_the_added_columns_is_extended_once(tmp_path):
    from dormouse.tools.history import read_history

    history = tmp_path / "history.tsv"
    old_columns = [c for c in history_rows.COLUMNS if c not in history_rows.ADDED_COLUMNS]
    old = [dict.fromkeys(old_columns, f"r{i}") for i in range(2)]
    history.write_text("\n".join(["\t".join(old_columns), *("\t".join(r.values()) for r in old)]) + "\n")
    new = dict.fromkeys(history_rows.COLUMNS, "x") | {"heldout_bpb": "1.5", "seeds": "3"}
    history_rows.append_row(history, new)
    history_rows.append_row(history, new)  # the header is rewritten once: now it is the current one
    assert history.read_text().splitlines()[0].split("\t") == old_columns + list(history_rows.ADDED_COLUMNS)
    rows = read_history(history)
    assert rows == [r | dict.fromkeys(history_rows.ADDED_COLUMNS, "-") for r in old] + [new, new]
    assert not list(tmp_path.glob("*.migrating"))
    with pytest.raises(ValueError, match="needs exactly the columns"):
        history_rows.append_row(history, {k: v for k, v in new.items() if k != "seeds"})


def test_compile_wraps_what_the_step_calls_and_refuses_an_eager_timing(corpus_dir, tmp_path, monkeypatch):
    # A bench once compiled `trainer.model` while the step called `trainer.replica`: a "compiled" row of
    # an eager step. The compiled object must be the replica, and a compile that yields no graph is refused.
    wrapped = []

    def spy_compile(module, *args, **kwargs):
        wrapped.append(module)
        return module  # compiles nothing: dynamo's graph counter stays at zero

    monkeypatch.setattr(torch, "compile", spy_compile)
    monkeypatch.setattr(device, "CPU_PEAK_N", 256)
    history = tmp_path / "history.tsv"
    argv = ["bench", "--data", str(corpus_dir), *TINY, "--steps", "1", "--warmup", "1", "--compile"]
    with pytest.raises(RuntimeError, match="compiled no graph"):
        main([*argv, "--history", str(history), "--log-dir", str(tmp_path / "logs")])
    assert len(wrapped) == 1 and type(wrapped[0]).__name__ == "DormouseLM"  # the replica: the model alone here
    assert not history.exists()


def test_fla_kernel_choices_not_from_the_pin_join_the_logs_fallbacks(corpus_dir, tmp_path, monkeypatch):
    """A bench with an empty fla config folder autotunes every kernel: its log must not say `fallbacks 0`.
    The bench counts those choices (on the CPU none are made: a stand-in counts one)."""
    monkeypatch.setattr(fla_pin, "count_unpinned", lambda: ledger.count(fla_pin.UNPINNED))
    history, logs = tmp_path / "history.tsv", tmp_path / "logs"
    argv = ["bench", "--data", str(corpus_dir), *TINY, "--steps", "1", "--warmup", "1"]
    assert main([*argv, "--history", str(history), "--log-dir", str(logs)]) == 0
    log = Path(read_rows(history)[0]["log"]).read_text()
    assert "fallbacks (COUNTED ledger sites, all steps): 1(fla.unpinned:1)" in log
