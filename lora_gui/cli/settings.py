"""``lora-gui settings [NAME]``: every run setting with what it accepts, its default and its help.

Everything shown is read from :class:`lora_gui.config.RunConfig`'s field declarations
(:func:`lora_gui.options.option`), the same declarations the form, presets and ``--set`` use, so
a setting added there is listed here without an edit. Imports nothing heavy: it answers at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import shutil
import sys
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

from lora_gui.config import ConfigError, RunConfig, load_yaml_overrides
from lora_gui.objective import PREFERENCE
from lora_gui.presets import list_presets

KIND_WORDS = {bool: "true or false", int: "whole number", float: "number", str: "free text"}
TASK_WORDS = {"text": "text runs (plain, chat and preference data)", "image": "image runs"}
MAX_WIDTH = 100  # characters: wider lines are hard to read even on a wide terminal


def program() -> str:
    """How the user started the CLI: ``lora-gui`` (the console script) or ``python -m lora_gui``."""
    return "lora-gui" if os.path.basename(sys.argv[0]).startswith("lora-gui") else "python -m lora_gui"


@dataclass(frozen=True)
class Setting:
    """One RunConfig field as a user reads it."""

    name: str
    kind: type  # bool, int, float or str
    default: Any
    help: str
    group: str
    low: float | None
    high: float | None
    choices: tuple[str, ...] | None
    tasks: tuple[str, ...] | None  # None: every task
    kinds: tuple[str, ...] | None  # image pipelines it applies to; None: all

    def allowed(self) -> str:
        """What the setting accepts: its choices, its range, or its type."""
        if self.choices:
            return " | ".join(self.choices)
        if self.kind in (int, float) and (self.low is not None or self.high is not None):
            integer = self.kind is int
            if self.high is None:
                return f"{KIND_WORDS[self.kind]} at least {_number(self.low, integer)}"
            if self.low is None:
                return f"{KIND_WORDS[self.kind]} at most {_number(self.high, integer)}"
            return f"{_number(self.low, integer)} to {_number(self.high, integer)}"
        return KIND_WORDS[self.kind]

    def default_text(self) -> str:
        if self.kind is bool:
            return "true" if self.default else "false"
        if self.kind in (int, float):
            return _number(self.default, self.kind is int)
        return self.default if self.default != "" else '"" (empty)'

    def applies_to(self) -> str:
        """The runs the setting matters for, in words ('' when it matters for all)."""
        if self.tasks is None:
            return ""
        words = " and ".join(TASK_WORDS.get(t, f"{t} runs") for t in self.tasks)
        if self.kinds:
            words += f" with a {' / '.join(k.upper() for k in self.kinds)} pipeline"
        return words

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.kind.__name__, "default": self.default,
                "allowed": self.allowed(), "low": self.low, "high": self.high,
                "choices": list(self.choices) if self.choices else None,
                "tasks": list(self.tasks) if self.tasks else None,
                "pipelines": list(self.kinds) if self.kinds else None,
                "group": self.group, "help": self.help}


def _number(value: float, integer: bool) -> str:
    """A value as people read it: 4194304 -> 4,194,304; 1e-07 -> 0.0000001; 0.5 -> 0.5."""
    if integer or float(value).is_integer():
        return f"{int(value):,}" if integer else f"{value:g}"
    return f"{value:.12f}".rstrip("0")


def _fields() -> list[dataclasses.Field]:
    """RunConfig's fields in their order, the objective's preference settings last: they come
    after the task, training and memory settings, as on the form."""
    fields = dataclasses.fields(RunConfig)
    last = [f for f in fields if f.metadata["group"] == PREFERENCE]
    return [f for f in fields if f not in last] + last


def settings() -> list[Setting]:
    """Every setting, in RunConfig's declaration order."""
    hints = typing.get_type_hints(RunConfig)
    found = []
    for f in _fields():
        meta = f.metadata
        found.append(Setting(f.name, hints[f.name], f.default, meta["help"], meta["group"], meta["low"],
                             meta["high"], meta["choices"], meta["tasks"], meta["kinds"]))
    return found


def find(name: str) -> Setting:
    """The setting called ``name``; an unknown name raises ConfigError with the close ones."""
    by_name = {s.name: s for s in settings()}
    key = name.strip().lower().replace("-", "_")
    if key in by_name:
        return by_name[key]
    close = difflib.get_close_matches(key, list(by_name), n=5, cutoff=0.6)
    close += [n for n in by_name if key and key in n and n not in close][:8 - len(close)]
    hint = f"; close: {', '.join(close)}" if close else ""
    raise ConfigError(f"no setting is called '{name}'{hint} ('{program()} settings' lists them all)")


def _width() -> int:
    return min(MAX_WIDTH, shutil.get_terminal_size((MAX_WIDTH, 24)).columns)


def _wrapped(text: str, indent: str, width: int, first: str | None = None) -> list[str]:
    """``text`` wrapped to ``width`` (40 at least), its first line indented by ``first`` (default:
    ``indent``) and the others by ``indent``."""
    return textwrap.wrap(text, width=max(40, width), initial_indent=indent if first is None else first,
                         subsequent_indent=indent, break_on_hyphens=False)


def list_lines(width: int | None = None) -> list[str]:
    """Every setting by group: name, what it accepts, default, the runs it is for, its help."""
    width = width or _width()
    groups: dict[str, list[Setting]] = {}
    for s in settings():
        groups.setdefault(s.group, []).append(s)
    lines = _wrapped(f"{len(settings())} settings. Set one with --set NAME=VALUE (train, plan, compare) "
                     f"or as 'NAME: VALUE' in a preset file; '{program()} settings NAME' shows one in "
                     "full.", "", width) + [""]
    for group, members in groups.items():
        lines.append(f"[{group}]")
        for s in members:
            head = f"{s.name}: {s.allowed()}; default {s.default_text()}"
            if s.tasks:  # the short form; 'settings NAME' says it in full
                head += f"; {' and '.join(s.tasks)} runs only"
                head += f" ({' / '.join(k.upper() for k in s.kinds)})" if s.kinds else ""
            lines += _wrapped(head, "      ", width, first="  ")
            lines += _wrapped(s.help, "      ", width)
        lines.append("")
    return lines[:-1]


def presets_setting(name: str) -> list[tuple[str, Any]]:
    """(preset name, value) for each bundled preset that sets ``name``."""
    found = []
    for path in list_presets():
        try:
            values = load_yaml_overrides(path)
        except ConfigError:
            continue  # a broken preset is reported where it is loaded, not here
        if name in values:
            found.append((path.stem, values[name]))
    return found


def one_lines(name: str, width: int | None = None) -> list[str]:
    """One setting in full: type, what it accepts, default, the runs it is for, group, how to set
    it, the bundled presets that change it, and its whole help text."""
    width = width or _width()
    s = find(name)
    lines = [s.name, f"  type: {KIND_WORDS[s.kind]}", f"  accepts: {s.allowed()}",
             f"  default: {s.default_text()}", f"  applies to: {s.applies_to() or 'every run'}",
             f"  group: {s.group}",
             f"  set it: --set {s.name}=VALUE on the command line, or '{s.name}: VALUE' in a preset file"]
    presets = presets_setting(s.name)
    if presets:
        lines += _wrapped("presets that change it: " + ", ".join(f"{p} ({v})" for p, v in presets),
                          "    ", width, first="  ")
    return lines + [""] + _wrapped(s.help, "  ", width)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``settings`` subcommand on ``sub`` (the CLI's subparsers)."""
    parser = sub.add_parser("settings", help="list every run setting with its range, default and help",
                            description="Every setting a run accepts (train / plan / compare --set "
                                        "NAME=VALUE, or a preset file), with what it accepts, its "
                                        "default and its help.")
    parser.add_argument("name", nargs="?", metavar="NAME", help="one setting, shown in full")
    parser.add_argument("--json", action="store_true", help="print them as JSON")
    parser.set_defaults(func=cmd_settings)
    return parser


def cmd_settings(args: argparse.Namespace) -> int:
    if args.json:
        shown = find(args.name).as_json() if args.name else [s.as_json() for s in settings()]
        print(json.dumps(shown, indent=1))
        return 0
    print("\n".join(one_lines(args.name) if args.name else list_lines()))
    return 0


SET_HELP = ("override one setting (repeatable); '{prog} settings' lists every setting with what it "
            "accepts, its default and its help")


def set_help() -> str:
    """The help of every --set KEY=VALUE option."""
    return SET_HELP.format(prog=program())
