"""Docs that match the code: every flag and config field named in README and docs/ exists, and every
CLI flag is named in docs/glossary.md."""

import argparse
import re
from dataclasses import fields
from pathlib import Path

from dormouse.cli import build_parser
from dormouse.config import SECTIONS

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
# Flags of other programs that the docs quote (pip, pytest, git, torchrun).
FOREIGN = {"--no-index", "--no-deps", "--target", "--durations", "--standalone", "--nproc-per-node"}


def cli_flags() -> set[str]:
    parser = build_parser()
    flags = {s for a in parser._actions for s in a.option_strings}
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for p in sub.choices.values():
        flags |= {s for a in p._actions for s in a.option_strings}
    return {f for f in flags if f.startswith("--")} - {"--help"}


def test_every_flag_named_in_docs_exists():
    known = cli_flags()
    for doc in DOCS:
        unknown = set(FLAG.findall(doc.read_text())) - known - FOREIGN
        assert not unknown, f"{doc.relative_to(ROOT)} names flags that do not exist: {sorted(unknown)}"


def test_every_cli_flag_is_in_the_glossary():
    text = (ROOT / "docs" / "glossary.md").read_text()
    missing = {f for f in cli_flags() if f not in FLAG.findall(text)}
    assert not missing, f"docs/glossary.md does not name: {sorted(missing)}"


def test_config_fields_in_glossary_are_exactly_the_code():
    text = (ROOT / "docs" / "glossary.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_0-9]+)` \|", text, re.M))
    code = {f.name for cls in SECTIONS.values() for f in fields(cls)}
    presets = {"nano", "small", "base"}
    assert documented - presets == code, f"glossary vs code: {sorted((documented - presets) ^ code)}"
