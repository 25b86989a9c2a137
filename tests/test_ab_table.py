"""dormouse/tools/ab_table.py: the ablation table's rows say exactly what each ab.json's `overall` says."""

import json

from dormouse.tools import ab_table


def result(ci95, flags="--no-engram", seeds=(0, 1, 2)):
    overall = {
        "a_bpb_mean": 2.13471,
        "diff_mean": -0.01234,
        "ci95": ci95,
        "a_ms_per_step": 54.76,
        "b_ms_per_step": 58.21,
        "verdict": "B better",
    }
    arms = {"a": {"flags": ""}, "b": {"flags": flags}}
    return {"overall": overall, "arms": arms, "seeds": list(seeds), "steps": 1500}


def test_a_row_with_an_interval():
    got = ab_table.row("engram off", result([-0.02, -0.00468]))
    assert got == (
        "| engram off | `--no-engram` | 3 | 1500 | 2.1347 | -0.0123 | [-0.0200, -0.0047] | 54.8, 58.2 | B better |"
    )


def test_one_seed_has_no_interval_and_empty_flags_are_named():
    got = ab_table.row("same config", result(None, flags="", seeds=(0,)))
    assert "| `(none)` | 1 | 1500 |" in got and "| none (one seed) |" in got


def test_main_prints_the_header_and_one_row_per_argument(tmp_path, capsys):
    path = tmp_path / "ab.json"
    path.write_text(json.dumps(result([-0.02, -0.00468])))
    assert ab_table.main([f"a={path}", f"b={path}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ab_table.HEADER.splitlines() and len(lines) == 4
    assert ab_table.main([str(path)]) == 2
