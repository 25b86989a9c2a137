"""benches/speed_record.py: the medians and ratio of a side-by-side call, on hand-made history rows."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches"))
from speed_record import summary  # noqa: E402


def row(model, ms, compiled="no", device="NVIDIA H200", commit="abc1234"):
    return {
        "model": model,
        "ms_per_step": str(ms),
        "ms_iqr": "0.1",
        "compiled": compiled,
        "device": device,
        "commit": commit,
        "batch": "64",
        "seq_len": "512",
        "dtype": "bf16",
        "arms": "kda(fla),cuda_graph",
        "date": "2026-12-07T00:00:00Z",
    }


def test_medians_and_ratio_of_the_rounds():
    rows = [row("dormouse", 30), row("gpt-sdpa", 40, "yes"), row("dormouse", 32), row("gpt-sdpa", 38, "yes")]
    rows += [row("dormouse", 31), row("gpt-sdpa", 39, "yes"), row("gpt-sdpa", 20)]  # an eager GPT row: not counted
    s = summary(rows)
    assert (s["ms_per_step"], s["gpt_compiled_ms"]) == (31, 39)
    assert s["ratio_vs_compiled_gpt"] == 1.258  # 39 / 31
    assert s["tokens_per_s"] == 1057032  # 64 * 512 / 31 ms
    assert len(s["rounds"]) == 6


@pytest.mark.parametrize("column", ["device", "commit"])
def test_rows_of_two_cards_or_commits_are_refused(column):
    other = row("gpt-sdpa", 40, "yes", **{column: "other"})
    with pytest.raises(SystemExit, match=f"differ in {column}"):
        summary([row("dormouse", 30), other])
