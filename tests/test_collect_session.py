"""benches/collect_session.py: a device call's rows, logs, kernel choices and compiled kernels land in
the repo's places, the A/B rows pointing at the JSONs it commits."""

import importlib.util
import json
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("collect_session", ROOT / "benches/collect_session.py")
collect_session = importlib.util.module_from_spec(spec)
spec.loader.exec_module(collect_session)

HEADER = (ROOT / "benches/history.tsv").read_text().splitlines()[0]


def row(log: str, note: str) -> str:
    cells = dict.fromkeys(HEADER.split("\t"), "-")
    cells.update(log=log, note=note)
    return "\t".join(cells.values())


def pin_file(key: str) -> str:  # each key its own structure (a string), so no fuzzy match between them
    config = {"kwargs": {}, "num_warps": 4, "num_stages": 2}
    return json.dumps({"autotune_entries": {key: {"autotune_key": [key], "config": config}}})


@pytest.fixture
def places(tmp_path):
    old = row("benches/logs/old.log", "old")
    history = tmp_path / "repo/history.tsv"
    history.parent.mkdir()
    # the repo's copy of an earlier A/B row already names its committed JSON; the call's copy does not
    history.write_text(f"{HEADER}\n{old}\n{row('benches/logs/s/ab-w.json', 'ab w')}\n")
    results = tmp_path / "results"
    (results / "bench-logs").mkdir(parents=True)
    (results / "fla-pin").mkdir()
    rows = [
        old,
        row("/tmp/ab-w/ab.json", "ab w"),
        row("/tmp/ab-x/ab.json", "ab arm A"),
        row("/tmp/r-rows/b2/ab.json", "ab row 2 of several --b"),
        row("benches/logs/new.log", "bench"),
        row("/tmp/recipe/metrics.jsonl", "train /tmp/recipe"),
        row("/root/repo/benches/logs/base.log", "bench from .base-tree/<commit>"),
    ]
    (results / "history.tsv").write_text("\n".join([HEADER, *rows]) + "\n")
    (results / "ab-x.json").write_text("{}")
    (results / "r-rows-b2.json").write_text("{}")
    (results / "recipe.metrics.jsonl").write_text('{"kind": "eval"}\n')
    (results / "r-rows-table.md").write_text("| row |\n")
    (results / "pick.txt").write_text("picked c1\n")
    (results / "ab-x.log").write_text("run x\n  5%|#  | 1/20\r 10%|## | 2/20\r      \reval step=2 bpb=2.5\n")
    (results / "bench-logs/new.log").write_text("bench")
    (results / "bench-logs/base.log").write_text("base")
    (results / "fla-pin/k.json").write_text(pin_file("new"))
    (results / "tc.tgz.part_aa").write_bytes(b"kernels")
    pin, cache, logs = tmp_path / "pin", tmp_path / "cache", tmp_path / "logs"
    pin.mkdir(), cache.mkdir(), logs.mkdir()
    (pin / "k.json").write_text(pin_file("old"))
    (cache / "tc.tgz.part_zz").write_bytes(b"stale")
    return results, history, logs, pin, cache


def test_a_call_is_collected_into_the_repos_places(places, tmp_path):
    results, history, logs, pin, cache = places
    log_dir = tmp_path / "logs/session"
    done = collect_session.collect(results, log_dir, history, logs, pin, cache)
    lines = history.read_text().splitlines()
    log_col = HEADER.split("\t").index("log")
    assert [line.split("\t")[log_col] for line in lines[1:]] == [
        "benches/logs/old.log",
        "benches/logs/s/ab-w.json",
        str(log_dir / "ab-x.json"),
        str(log_dir / "r-rows-b2.json"),
        "benches/logs/new.log",
        str(log_dir / "recipe.metrics.jsonl"),
        "benches/logs/base.log",
    ]
    assert (log_dir / "recipe.metrics.jsonl").read_text() == '{"kind": "eval"}\n'
    assert (log_dir / "r-rows-table.md").read_text() == "| row |\n"  # several --b's table, a pick's choice
    assert (log_dir / "pick.txt").read_text() == "picked c1\n"
    assert (log_dir / "ab-x.log").read_text() == "run x\neval step=2 bpb=2.5\n"
    assert (log_dir / "ab-x.json").read_text() == "{}" and (logs / "new.log").read_text() == "bench"
    assert sorted(json.loads((pin / "k.json").read_text())["autotune_entries"]) == ["new", "old"]
    assert [p.name for p in cache.iterdir()] == ["tc.tgz.part_aa"]
    assert "appended 5 row(s) to history.tsv" in done and "1 kernel choice(s) added to the pin" in done


def test_a_row_whose_ab_json_did_not_come_back_is_refused_before_anything_is_written(places, tmp_path):
    results, history, logs, pin, cache = places
    (results / "ab-x.json").unlink()
    before = history.read_text()
    with pytest.raises(SystemExit, match="names /tmp/ab-x/ab.json, but ab-x.json did not come back"):
        collect_session.collect(results, tmp_path / "logs/session", history, logs, pin, cache)
    assert history.read_text() == before and not (tmp_path / "logs/session").exists()


def test_a_recorded_runs_row_whose_metrics_did_not_come_back_is_refused(places, tmp_path):
    results, history, logs, pin, cache = places
    (results / "recipe.metrics.jsonl").unlink()
    with pytest.raises(SystemExit, match="names /tmp/recipe/metrics.jsonl, but recipe.metrics.jsonl did not"):
        collect_session.collect(results, tmp_path / "logs/session", history, logs, pin, cache)


def test_unpack_extracts_results_tgz_and_takes_the_cache_parts_beside_it(places, tmp_path):
    results = places[0]
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    with tarfile.open(fetched / "results.tgz", "w:gz") as tar:
        tar.add(results / "history.tsv", arcname="history.tsv")
    (results / "tc.tgz.part_aa").rename(fetched / "tc.tgz.part_aa")
    into = tmp_path / "into"
    into.mkdir()
    assert collect_session.unpack(fetched, into) == into
    assert sorted(p.name for p in into.iterdir()) == ["history.tsv", "tc.tgz.part_aa"]
    assert collect_session.unpack(results, into) == results  # already extracted: taken as it is
