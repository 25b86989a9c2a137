"""Figures in README.md and docs/ match their evidence records (evidence/README.md).

The convention: a line that publishes a measured figure names its record on the same line,
`1.9808 bpb (evidence/recipe-h100.json)`. Every decimal number on that line (outside backticks) must be
one of the record's numbers, written to its last digit; a line with a measured unit or a signed difference and
no record fails, and so does a table row with a decimal figure and no record (a config field's row aside).
"""

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "evidence"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
KEYS = {"figure", "value", "unit", "row", "command", "card", "commit", "date", "source"}
CITE = re.compile(r"evidence/([A-Za-z0-9._-]+\.json)")
# A decimal figure: 1.9808, 36.80, 8.90e5, 1e6 (not a part of a version such as 2.13.0 or a name).
NUMBER = re.compile(r"(?<![\w.])(\d+\.\d+(?:e[+-]?\d+)?|\d+e[+-]?\d+)(?![\w.]*\d)")
# A measured figure: a decimal number followed by one of these units, or a signed difference (+0.0180, −0.0046).
MEASURED = re.compile(r"\d\.\d+(?:e[+-]?\d+)?\s*(?:bpb|ms|tokens/s|tok/s|bytes/s|s)(?![\w])|(?<![\w.])[+−]\d+\.\d+")
# A glossary row of a config field: its figures are the code's default and range (tests/test_docs.py).
FIELD_ROW = re.compile(r"^\| `[a-z_0-9]+` \| `--")
MAX_BYTES = 2 * 1024 * 1024


def prose(line: str) -> str:
    """The line without its code spans and record paths (flags, commands, file names)."""
    return CITE.sub("", re.sub(r"`[^`]*`", "", line))


def numbers_in(obj) -> list[Decimal]:
    """Every number a record holds, in its values and inside its strings."""
    if isinstance(obj, bool):
        return []
    if isinstance(obj, int | float):
        return [Decimal(repr(obj))]
    if isinstance(obj, str):
        return [Decimal(m) for m in re.findall(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?", obj)]
    if isinstance(obj, dict):
        return [n for v in obj.values() for n in numbers_in(v)]
    if isinstance(obj, list):
        return [n for v in obj for n in numbers_in(v)]
    return []


def holds(figure: str, record_numbers: list[Decimal]) -> bool:
    """The figure is a record number rounded to the figure's last digit (sign aside: docs say 'lower by')."""
    x = Decimal(figure)
    half_unit = Decimal(1).scaleb(x.as_tuple().exponent) / 2
    return any(abs(abs(n) - x) <= half_unit for n in record_numbers)


def cited_lines() -> list[tuple[str, int, str, list[str]]]:
    out = []
    for doc in DOCS:
        for i, line in enumerate(doc.read_text().splitlines(), 1):
            names = CITE.findall(line)
            if names:
                out.append((str(doc.relative_to(ROOT)), i, line, names))
    return out


def load(name: str) -> dict:
    return json.loads((EVIDENCE / name).read_text())


def test_every_record_has_the_keys_and_the_folder_stays_small():
    records = sorted(EVIDENCE.glob("*.json"))
    assert records, "evidence/ holds no records"
    for path in records:
        rec = json.loads(path.read_text())
        assert KEYS <= set(rec), f"{path.name} lacks {sorted(KEYS - set(rec))}"
        assert isinstance(rec["value"], int | float), f"{path.name}: value is not a number"
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", rec["date"]), f"{path.name}: date {rec['date']!r}"
    total = sum(p.stat().st_size for p in EVIDENCE.rglob("*") if p.is_file())
    assert total < MAX_BYTES, f"evidence/ is {total} bytes"


def test_every_cited_record_exists():
    for recipe in sorted((ROOT / "configs").rglob("*.toml")):
        for name in CITE.findall(recipe.read_text()):
            assert (EVIDENCE / name).is_file(), (
                f"{recipe.relative_to(ROOT)} cites evidence/{name}, which does not exist"
            )
    for doc, i, _, names in cited_lines():
        for name in names:
            assert (EVIDENCE / name).is_file(), f"{doc}:{i} cites evidence/{name}, which does not exist"


def test_every_figure_beside_a_record_is_in_that_record():
    lines = cited_lines()
    assert lines, "no doc cites an evidence record"
    for doc, i, line, names in lines:
        record_numbers = [n for name in names if (EVIDENCE / name).is_file() for n in numbers_in(load(name))]
        for figure in NUMBER.findall(prose(line)):
            assert holds(figure, record_numbers), f"{doc}:{i}: {figure} is not in {', '.join(names)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_measured_figure_names_its_record(doc):
    for i, line in enumerate(doc.read_text().splitlines(), 1):
        if MEASURED.search(prose(line)) and not CITE.search(line):
            raise AssertionError(f"{doc.relative_to(ROOT)}:{i} publishes a measurement without its record: {line}")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_decimal_figure_in_a_table_names_its_record(doc):
    for i, line in enumerate(doc.read_text().splitlines(), 1):
        table_row = line.startswith("|") and not FIELD_ROW.match(line)
        if table_row and NUMBER.findall(prose(line)) and not CITE.search(line):
            raise AssertionError(f"{doc.relative_to(ROOT)}:{i}: a table row with a figure and no record: {line}")


def test_the_checks_catch_a_changed_figure():
    rec = [Decimal("1.9808"), Decimal("36.80"), Decimal("890000.0")]
    assert holds("1.9808", rec) and holds("1.98", rec) and holds("8.90e5", rec) and holds("36.8", rec)
    assert not holds("1.9818", rec) and not holds("36.90", rec) and not holds("8.80e5", rec)
    assert NUMBER.findall(prose("torch 2.13.0 and `--lr 3e-3`: 1.9808 bpb (evidence/x.json)")) == ["1.9808"]
    assert MEASURED.search("depth 3 costs +0.0180 [+0.0056, +0.0304]") and MEASURED.search("ends −0.0046 from")
    assert not MEASURED.search("version 2.13.0, `x+1.5`, 1e+5 rows")
