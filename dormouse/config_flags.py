"""Config from the command line: one flag per config field, under its group's heading.

`--help` lists the everyday flags; `--help-all` adds the advanced ones (kernel paths, arms' fine
settings). Precedence: preset < --config file < flags.
"""

import argparse
import dataclasses
from dataclasses import fields

from dormouse.config import (
    DEFAULT_PRESET,
    GROUPS,
    PRESETS,
    SECTIONS,
    STEPS_AUTO,
    Config,
    build,
    field_group,
    load_toml,
    resolve_parallel,
    toml_overrides,
    value_type,
)
from dormouse.config_checks import validate
from dormouse.errors import ConfigError

SHORT_ARMS = {"no_kda": ("model", "mixer", "attention", "short for --mixer attention")}
GROUP_TITLES = {
    "data": "data: what each step reads",
    "model": "model: sizes and layers",
    "arms": "arms: research options, off by default (docs/arms.md)",
    "optimizer": "optimizer",
    "schedule": "schedule",
    "run": "run: evals, checkpoints, seed",
    "performance": "performance: precision and kernel paths",
    "parallel": "parallel: torchrun jobs (docs/distributed.md)",
}


class _HelpAll(argparse.Action):
    """--help-all: the help with the advanced flags shown too."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        show_advanced(parser)
        parser.print_help()
        parser.exit()


def show_advanced(parser: argparse.ArgumentParser) -> None:
    """List the advanced flags in `parser`'s help too."""
    for action in parser._actions:
        action.help = getattr(action, "full_help", action.help)


def config_groups(parser: argparse.ArgumentParser) -> dict[str, argparse._ArgumentGroup]:
    """The parser's argument group of each config group, created in GROUPS order on first use."""
    found = getattr(parser, "_dormouse_groups", None)
    if found is None:
        found = {g: parser.add_argument_group(GROUP_TITLES[g]) for g in GROUPS}
        parser._dormouse_groups = found
    return found


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """--preset, --config, --help-all and one flag per config field (default None: only given flags
    override), each under its group. A command's own flags go in `config_groups(parser)` first."""
    groups = config_groups(parser)
    parser.add_argument("--help-all", action=_HelpAll, help="show the advanced flags too")
    model = groups["model"]
    model.add_argument("--preset", choices=sorted(PRESETS), default=None, help=f"sizes (default {DEFAULT_PRESET})")
    model.add_argument("--config", metavar="FILE", default=None, help="TOML file whose tables name the groups below")
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            _add_field_flag(groups[field_group(f)], section, f)
    for name, (section, key, _, text) in SHORT_ARMS.items():
        groups[field_group(_field(section, key))].add_argument(
            "--" + name.replace("_", "-"), dest=f"short.{name}", action="store_true", help=text
        )
    if parser.usage is None:
        positional = " ".join(a.metavar or a.dest.upper() for a in parser._actions if not a.option_strings)
        parser.usage = f"%(prog)s {positional} [flags]".replace("  ", " ")


def int_or_auto(text: str) -> int:
    """A flag value of an auto=True field (`--steps`): an int, or "auto" (held as STEPS_AUTO)."""
    if text == "auto":
        return STEPS_AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or auto, got {text!r}") from None


def _field(section: str, name: str) -> dataclasses.Field:
    return {f.name: f for f in fields(SECTIONS[section])}[name]


def _add_field_flag(group: argparse._ArgumentGroup, section: str, f: dataclasses.Field) -> None:
    meta = f.metadata
    default = "auto" if f.default is None else f.default
    text = f"{meta['help']} (default {default})"
    flag, dest = "--" + f.name.replace("_", "-"), f"{section}.{f.name}"
    if value_type(f) is bool:
        action = group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=text)
    else:
        action = group.add_argument(
            flag,
            dest=dest,
            type=int_or_auto if meta["auto"] else f.type,
            default=None,
            choices=meta["choices"],
            metavar=None if meta["choices"] else "X",
            help=text,
        )
    if meta["advanced"]:
        action.full_help, action.help = text, argparse.SUPPRESS


def config_from_args(args: argparse.Namespace) -> Config:
    """Preset < --config file < flags, then resolved."""
    from dormouse.resolve import resolve  # imports the model: not needed to print --help

    file_values = load_toml(args.config) if args.config else {}
    overrides = toml_overrides(file_values, args.config) if file_values else {"model": {}, "train": {}}
    preset = args.preset or file_values.get("preset", DEFAULT_PRESET)
    for dest, value in vars(args).items():
        if value is None or "." not in dest:
            continue
        section, key = dest.split(".", 1)
        if section == "short":
            if value:
                s, k, v, _ = SHORT_ARMS[key]
                given = getattr(args, f"{s}.{k}")
                if given is not None and given != v:
                    raise ConfigError(f"--{key.replace('_', '-')} contradicts --{k.replace('_', '-')} {given}")
                overrides.setdefault(s, {})[k] = v
        else:
            overrides.setdefault(section, {})[key] = value
    return resolve(build(preset, overrides))


# What a resumed run may change: its length (and when it stops early), its eval and checkpoint cadence, how
# it runs (the world size may change). Anything else shapes the model, its tables or its training, and is
# refused.
RESUMABLE = (
    "train.steps",
    "train.minutes",
    "train.patience",
    "train.eval_every",
    "train.ckpt_every",
    "train.keep_last",
    "train.parallel",
    "train.dist_timeout",
    "train.engram_shard",
)
RESUMABLE_FLAGS = ", ".join("--" + name.split(".", 1)[1].replace("_", "-") for name in RESUMABLE)


def resume_config(saved: Config, args: argparse.Namespace) -> Config:
    """A resumed run keeps its config; only the RESUMABLE fields may change (docs/reliability.md, Resume)."""
    if args.preset or args.config:
        raise ConfigError("a resumed run keeps its own config: --preset and --config are refused with --resume")
    out = Config(model=dataclasses.replace(saved.model), train=dataclasses.replace(saved.train), preset=saved.preset)
    for dest, value in vars(args).items():
        if "." not in dest or value is None or (value is False and dest not in RESUMABLE):
            continue
        if dest not in RESUMABLE:
            flag = "--" + dest.split(".", 1)[1].replace("_", "-")
            raise ConfigError(f"{flag} cannot change on --resume: only {RESUMABLE_FLAGS} may")
        section, key = dest.split(".", 1)
        setattr(getattr(out, section), key, value)
    if out.train.steps == STEPS_AUTO:
        raise ConfigError("--steps auto on --resume: give the run's new length in steps")
    if vars(args).get("train.parallel") is None:
        out.train.parallel = "auto"  # decided by this launch, not the saved one's
    out.train.parallel = resolve_parallel(out.train.parallel)
    validate(out)
    return out
