"""--help lists only flags that exist: walk every flag that help prints and parse it."""

import argparse
import os
import re
import subprocess
import sys

import pytest

from dormouse.cli import build_parser, main
from dormouse.config_flags import int_or_auto, show_advanced

REQUIRED = {
    "prepare": ["in.txt", "--out", "X"],
    "inspect": [],
    "ledger": [],
    "train": [],
    "eval": ["RUN"],
    "generate": ["RUN", "--prompt", "x"],
    "bench": [],
    "replay": ["RUN"],
    "ab": ["--a", "", "--b", "--lr 0.01"],
    "tune": [],
}


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def sample_value(action: argparse.Action) -> list[str]:
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(list(action.choices)[-1])]
    return {int: ["3"], float: ["0.5"], int_or_auto: ["auto"]}.get(action.type, ["value"])


def test_registered_subcommands_are_exactly_the_working_ones():
    assert set(subparsers()) == set(REQUIRED)


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_flag_in_help_parses(name):
    sub = subparsers()[name]
    show_advanced(sub)  # what --help-all prints
    printed = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", sub.format_help())) - {"--help", "--help-all"}
    declared = {s for a in sub._actions for s in a.option_strings if s.startswith("--")} - {"--help", "--help-all"}
    assert printed == declared, f"help and parser disagree: {printed ^ declared}"
    for flag in sorted(printed):
        action = sub._option_string_actions[flag]
        argv = [name, *REQUIRED[name], flag, *sample_value(action)]
        ns = build_parser().parse_args(argv)
        assert ns.command == name
        if action.nargs != 0:
            assert getattr(ns, action.dest) is not None, flag


def test_train_help_is_short_grouped_and_free_of_measurements():
    env = {**os.environ, "COLUMNS": "80"}
    run = [sys.executable, "-m", "dormouse", "train"]
    short = subprocess.run([*run, "--help"], capture_output=True, text=True, check=True, env=env).stdout
    full = subprocess.run([*run, "--help-all"], capture_output=True, text=True, check=True, env=env).stdout
    assert len(short.splitlines()) <= 150 and len(full.splitlines()) > len(short.splitlines())
    headings = [line.split(":")[0] for line in short.splitlines() if line and not line.startswith(" ")]
    groups = ["data", "model", "arms", "optimizer", "schedule", "run", "performance", "parallel"]
    assert headings == ["usage", "options", *groups]
    assert "--engram" in short and "--kda-chunk-size" not in short and "--kda-chunk-size" in full
    # help states what a flag does, not what it measured: no timings, bpb or speed-ups
    assert not re.search(r"\d\s*(ms|bpb|tokens/s|x faster)|H200|H100|session", full)


def test_module_entry_point_and_version():
    out = subprocess.run([sys.executable, "-m", "dormouse", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("dormouse ")


def test_user_errors_are_one_line_exit_2(capsys):
    assert main(["inspect", "--seq-len", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: seq_len 0 is out of range") and err.count("\n") == 1
