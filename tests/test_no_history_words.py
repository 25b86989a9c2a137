"""The source tree describes the system as it is: development history (work sessions, lent machines,
device calls, a predecessor's defects, run logs that live in git history) stays in git log."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What the product's text may not carry, each with the reason it is history rather than description.
HISTORY = {
    r"\bsessions?\b": "a work session is bookkeeping, not a property of the code",
    r"\blent\b": "which machine was lent is history",
    r"\bdevice calls?\b|\bcall \d+'s\b|\bsession \d+ call\b": "a device call is bookkeeping",
    r"\bthe predecessor\b": "the predecessor's defects are history; say what the code refuses",
    r"benches/(?:logs|sessions)/": "raw logs and dated scripts are in git history, not the tree (cite evidence/)",
}
PATTERN = re.compile("|".join(f"(?:{p})" for p in HISTORY), re.I)


def product_files() -> list[Path]:
    files = [ROOT / "README.md"]
    files += sorted((ROOT / "dormouse").rglob("*.py"))
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted(p for p in (ROOT / "configs").rglob("*") if p.is_file())
    return files


def lines_matching(paths: list[Path], pattern: re.Pattern) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()[:120]}"
        for path in paths
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]


def test_no_development_history_in_the_product():
    hits = lines_matching(product_files(), PATTERN)
    assert not hits, f"{len(hits)} lines carry development history:\n" + "\n".join(hits)


def test_evidence_rows_name_commits_not_sessions():
    # Evidence says which device call measured a figure, but a work session is not its provenance.
    hits = lines_matching(sorted((ROOT / "evidence").iterdir()), re.compile(r"\bsessions?\b", re.I))
    assert not hits, "evidence names work sessions (name the commit instead):\n" + "\n".join(hits)


def test_the_pattern_catches_what_it_names():
    for text in ("measured in session 14", "the lent H200", "device call 3", "(the predecessor read it)"):
        assert PATTERN.search(text), text
    for text in ("its predecessor's output", "a call to step()", "runs/ab-<time>", "the recall"):
        assert not PATTERN.search(text), text
