"""`lora-gui settings [NAME]`: every RunConfig setting with what it accepts, its default and its
help, read from the field declarations; --set and train --help point to it."""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass

import pytest

from lora_gui.cli import build_parser, main
from lora_gui.cli import settings as cli_settings
from lora_gui.config import RunConfig
from lora_gui.options import option


def _words(text: str) -> str:
    return " ".join(text.split())


def _entries(text: str) -> dict[str, str]:
    """The listing's entries by setting name: its head line and help, joined into one line."""
    entries: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("  ") and not line.startswith("   ") and ":" in line:
            name = line.split(":", 1)[0].strip()
            entries[name] = line
        elif name and line.startswith("      "):
            entries[name] += " " + line.strip()
        else:
            name = None
    return {k: _words(v) for k, v in entries.items()}


def test_the_list_holds_every_setting_with_what_it_accepts_its_default_and_its_whole_help(capsys):
    assert main(["settings"]) == 0
    entries = _entries(capsys.readouterr().out)
    fields = dataclasses.fields(RunConfig)
    assert set(entries) == {f.name for f in fields}
    hints = typing.get_type_hints(RunConfig)
    for f in fields:
        entry, meta = entries[f.name], f.metadata
        assert _words(meta["help"]) in entry, f.name
        for choice in meta["choices"] or ():
            assert choice in entry, (f.name, choice)
        if hints[f.name] is int and meta["high"] is not None:
            assert f"{meta['low']:,} to {meta['high']:,}" in entry, entry
        if hints[f.name] is bool:
            assert f"true or false; default {str(f.default).lower()}" in entry, entry
    assert "lr: 0.0000001 to 1; default 0.001" in entries["lr"]
    assert "lora_rank: 1 to" in entries["lora_rank"] and "default 8" in entries["lora_rank"]
    assert "text runs only" in entries["window"] and "image and video runs only" in entries["resolution"]
    assert "image runs only (SD / SDXL)" in entries["train_text_encoder"]


def test_a_setting_declared_on_runconfig_is_listed_without_an_edit_here(monkeypatch):
    @dataclass
    class Wider(RunConfig):
        fresh_knob: int = option(3, "A knob declared only here.", "train", low=1, high=9)

    monkeypatch.setattr(cli_settings, "RunConfig", Wider)
    text = "\n".join(cli_settings.list_lines(width=100))
    assert "  fresh_knob: 1 to 9; default 3" in text and "A knob declared only here." in text
    assert f"{len(dataclasses.fields(RunConfig)) + 1} settings" in text


def test_one_setting_in_full_with_the_presets_that_change_it(capsys):
    assert main(["settings", "lr"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("lr\n")
    assert "accepts: 0.0000001 to 1" in text and "default: 0.001" in text
    assert "applies to: every run" in text and "--set lr=VALUE" in text
    assert "text-demo (0.005)" in _words(text)  # presets/text-demo.yaml sets lr: 0.005
    assert _words(RunConfig.__dataclass_fields__["lr"].metadata["help"]) in _words(text)
    assert main(["settings", "guidance_scale"]) == 0
    assert "applies to: image runs with a FLUX pipeline" in capsys.readouterr().out


@pytest.mark.parametrize(("typed", "first"), [("lora_rnk", "lora_rank"), ("rank", "lora_rank"),
                                               ("Lora-Rank", None)])
def test_a_name_is_forgiven_its_case_or_answered_with_close_ones(typed, first, capsys):
    code = main(["settings", typed])
    out, err = capsys.readouterr()
    if first is None:  # case and dashes are forgiven
        assert code == 0 and out.startswith("lora_rank\n")
        return
    assert code == 2 and not out
    assert f"no setting is called '{typed}'; close: {first}" in err
    assert "settings' lists them all" in err


def test_json_lists_every_setting_with_its_default(capsys):
    assert main(["settings", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == sorted((f.name for f in dataclasses.fields(RunConfig)),
                                               key=[r["name"] for r in rows].index)
    defaults = RunConfig().to_dict()
    assert {r["name"]: r["default"] for r in rows} == defaults
    assert main(["settings", "adapter", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["choices"] == ["lora", "dora", "loha", "lokr", "oft"] and one["default"] == "lora"


@pytest.mark.parametrize("command", ["train", "plan", "compare"])
def test_set_help_points_to_the_settings_command(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = _words(capsys.readouterr().out)
    assert "--set KEY=VALUE override one setting" in text
    assert "settings' lists every setting with what it accepts, its default and its help" in text
    if command == "train":
        assert "settings NAME' shows one in full" in text
