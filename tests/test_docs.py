"""Docs that match the code: every flag, config field and file named in README and docs/ exists, every
CLI flag is named in docs/glossary.md with each config field's default, range and group, the preset table
is the presets' resolved sizes and parameter counts, every parameter count in the docs is the built
model's, the glossary names every arm that blocks --cuda-graph, and the fallback ledger in
docs/reliability.md is the code's."""

import argparse
import dataclasses
import functools
import re
from dataclasses import fields
from pathlib import Path

from dormouse import config, ledger
from dormouse.cli import build_parser
from dormouse.config import SECTIONS
from dormouse.model.model import DormouseLM
from dormouse.resolve import resolve_values
from dormouse.train.routing import route

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
# Flags of other programs that the docs quote (pip, pytest, git, torchrun), and argparse's own.
FOREIGN = {"--no-index", "--no-deps", "--target", "--durations", "--standalone", "--nproc-per-node", "--help"}
# A path in the repository: a top-level folder, then names (placeholders such as <GPU> are not paths).
PATH = re.compile(r"(?<![\w./-])((?:dormouse|tests|configs|benches|evidence|docs)/[\w./-]*[\w/])")
FIELD_ROW = re.compile(r"^\| `([a-z_0-9]+)` \| (.*?) \| (.*?) \| (.*?) \| (.*?) \|$", re.M)
# A parameter count (14,336,800 parameters, 28 M params). Each must be written as PARAMETERS says, whole and
# naming its preset, so that a test can build the model and count.
COUNT = re.compile(r"\d[\d,.]* ?(?:[kM] |million )?(?:matrix )?param(?:eter)?s\b")
PARAMETERS = re.compile(
    r"`(?P<preset>\w+)`(?P<engram> with `--engram`)?(?: holds|'s) "
    r"(?P<n>\d{1,3}(?:,\d{3})+) (?P<matrix>matrix )?parameters"
)


def cli_flags() -> set[str]:
    parser = build_parser()
    flags = {s for a in parser._actions for s in a.option_strings}
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for p in sub.choices.values():
        flags |= {s for a in p._actions for s in a.option_strings}
    return {f for f in flags if f.startswith("--")} - {"--help"}


def code_fields() -> dict[str, object]:
    return {f.name: f for cls in SECTIONS.values() for f in fields(cls)}


@functools.cache
def preset_model(name: str, engram: bool = False) -> DormouseLM:
    return DormouseLM(resolve_values(config.build(name, {"model": {"engram": engram}}), cuda_available=False).model)


def shown(default) -> str:
    """A default as the glossary writes it."""
    if default is None:
        return "auto"  # a tri-state field: the code decides from the device and the arms
    if isinstance(default, bool):
        return "true" if default else "false"
    return "''" if default == "" else str(default)


def allowed(meta) -> str:
    """A field's range or choices as the glossary writes them: [lo, hi], an open end round, ∞ unbounded."""
    if meta["choices"]:
        return ", ".join(map(str, meta["choices"]))
    if meta["lo"] is None and meta["hi"] is None:
        return ""
    lo = "-∞" if meta["lo"] is None else meta["lo"]
    hi = "∞" if meta["hi"] is None else meta["hi"]
    return f"{'(' if meta['lo_open'] else '['}{lo}, {hi}{')' if meta['hi_open'] else ']'}"


def test_every_flag_named_in_docs_exists():
    known = cli_flags()
    for doc in DOCS:
        unknown = set(FLAG.findall(doc.read_text())) - known - FOREIGN
        assert not unknown, f"{doc.relative_to(ROOT)} names flags that do not exist: {sorted(unknown)}"


def test_every_file_named_in_docs_exists():
    for doc in DOCS:
        for path in PATH.findall(doc.read_text()):
            assert (ROOT / path).exists(), f"{doc.relative_to(ROOT)} names {path}, which does not exist"


def test_every_cli_flag_is_in_the_glossary():
    text = (ROOT / "docs" / "glossary.md").read_text()
    missing = {f for f in cli_flags() if f not in FLAG.findall(text)}
    assert not missing, f"docs/glossary.md does not name: {sorted(missing)}"


def test_config_fields_in_glossary_are_exactly_the_code():
    text = (ROOT / "docs" / "glossary.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_0-9]+)` \|", text, re.M))
    assert documented == set(code_fields()), f"glossary vs code: {sorted(documented ^ set(code_fields()))}"


def test_glossary_defaults_and_groups_are_the_codes():
    text = (ROOT / "docs" / "glossary.md").read_text()
    code = code_fields()
    group_of = {name: g for g, names in config.group_fields().items() for name in names}
    for section in re.split(r"^### ", text, flags=re.M)[1:]:
        heading = re.match(r"`\[([a-z]+)\]`", section)
        assert heading, f"a glossary subsection is not a config group: {section.splitlines()[0]}"
        rows = FIELD_ROW.findall(section)
        assert rows, f"a glossary subsection lists no fields: {section.splitlines()[0]}"
        for name, _flags, default, allows, _meaning in rows:
            assert default == shown(code[name].default), f"glossary: {name} defaults to {code[name].default!r}"
            assert allows == allowed(code[name].metadata), f"glossary: {name} allows {allowed(code[name].metadata)}"
            assert group_of[name] == heading.group(1), f"glossary: {name} is in [{group_of[name]}]"


def test_preset_table_is_the_resolved_presets():
    text = (ROOT / "docs" / "training.md").read_text()
    rows = re.findall(
        r"^\| `(\w+)`[^|]* \| (\d+) \| (\d+) × (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| ([\d,]+) \|",
        text,
        re.M,
    )
    assert {r[0] for r in rows} == set(config.PRESETS), "docs/training.md's preset table misses a preset"
    for name, *sizes, params in rows:
        cfg = resolve_values(config.build(name), cuda_available=False)
        m, t = cfg.model, cfg.train
        want = [m.d_model, m.n_heads, m.head_dim, m.block_layers, m.depth, m.ffn_hidden, t.seq_len, t.batch_size]
        assert [int(s) for s in sizes] == want, f"docs/training.md: preset {name} is {want}"
        assert params == f"{preset_model(name).num_params():,}", f"docs/training.md: preset {name}'s parameters"


def test_the_defaults_and_the_recipe_training_md_states_are_the_code_s():
    text = " ".join((ROOT / "docs" / "training.md").read_text().split())
    defaults = re.search(
        r"AdamW, weight decay ([\d.]+), no dropout and no input byte noise, a cosine schedule ending at half "
        r"the peak learning rate, an exponential weight average \(decay ([\d.]+)\) .*? once (\d+) evals",
        text,
    )
    c = config.build()
    assert (c.train.opt, c.train.lr_decay, c.train.lr_floor, c.model.dropout, c.train.byte_noise) == (
        "adamw",
        "cosine",
        0.5,
        0.0,
        0.0,
    )
    assert [float(defaults[1]), float(defaults[2]), int(defaults[3])] == [
        c.train.weight_decay,
        c.train.ema_decay,
        c.train.patience,
    ]
    recipe = re.search(
        r"`configs/tinyshakespeare.toml` is the recipe [^:]*: `(\w+)`, (\d+) steps of (\d+) windows of (\d+) bytes "
        r"\(([\d.]+) M bytes\), evals every (\d+) steps",
        text,
    )
    values = config.load_toml(ROOT / "configs" / "tinyshakespeare.toml")
    t = config.build(values["preset"], config.toml_overrides(values, "recipe")).train
    assert recipe[1] == values["preset"]
    assert [int(recipe[i]) for i in (2, 3, 4, 6)] == [t.steps, t.batch_size, t.seq_len, t.eval_every]
    assert recipe[5] == f"{t.steps * t.batch_size * t.seq_len / 1e6:.1f}"
    regularisers = re.search(
        r"The tiny-shakespeare recipe, [^:]*: `--dropout ([\d.]+) --byte-noise ([\d.]+) --weight-decay ([\d.]+)`", text
    )
    r = config.build(values["preset"], config.toml_overrides(values, "recipe"))
    assert [float(regularisers[i]) for i in (1, 2, 3)] == [r.model.dropout, r.train.byte_noise, r.train.weight_decay]


def test_every_parameter_count_in_the_docs_is_the_built_model_s():
    checked = 0
    for doc in DOCS:
        text = " ".join(doc.read_text().split())  # a phrase may wrap
        phrases = list(PARAMETERS.finditer(text))
        where = doc.relative_to(ROOT)
        assert len(phrases) == len(COUNT.findall(text)), f"{where}: a count is not `PRESET`'s N parameters"
        for p in phrases:
            model = preset_model(p["preset"], engram=bool(p["engram"]))
            if p["matrix"]:  # NesterovSinkhorn's matrices (--opt sinkhorn)
                (count,) = [g.numel for g in route(model, "sinkhorn") if g.name == "matrices"]
            else:
                count = model.num_params()
            assert p["n"] == f"{count:,}", f"{where}: {p[0]!r}; the code's count is {count:,}"
            checked += 1
    assert checked, "no doc writes a parameter count"


def test_the_glossary_names_every_arm_that_blocks_a_captured_step():
    base = resolve_values(config.build("nano"), cuda_available=False)
    m = dataclasses.replace(base.model, mor=True, n_experts=2, engram=True, depth=3)
    t = dataclasses.replace(base.train, engram_shard=True, rand_depth=True, rand_depth_min=1, rand_depth_bptt=1)
    blockers = config.graph_blockers(m, t)
    assert set(blockers) == {"mor", "n_experts", "engram_shard", "rand_depth_bptt"}
    (row,) = re.findall(r"^\| `cuda_graph` .*$", (ROOT / "docs" / "glossary.md").read_text(), re.M)
    named = set(FLAG.findall(row.split("auto is off where an arm blocks it")[1]))
    for name in blockers:
        assert "--" + name.replace("_", "-") in named, f"docs/glossary.md's cuda_graph row does not name {name}"


def test_reliability_lists_the_ledger_as_the_code_has_it():
    text = (ROOT / "docs" / "reliability.md").read_text()
    code_rows = [line for line in ledger.markdown().splitlines() if line.startswith("| `")]
    doc_rows = [line for line in text.splitlines() if re.match(r"^\| `[a-z_]+\.[a-z_.]+` \|", line)]
    assert doc_rows == code_rows, "docs/reliability.md's ledger table differs from `dormouse ledger --markdown`"
