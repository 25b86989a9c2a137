"""benches/history.tsv as data: only rows of the very setting count as measurements."""

from dormouse.tools.bench import COLUMNS
from dormouse.tools.history import measured_rows, read_history

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
