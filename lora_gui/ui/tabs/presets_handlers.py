"""Presets tab handlers: read a preset's YAML, validate and save one (never a bad file).

The bundled presets (presets/) are read-only from the dashboard: a preset is saved under a new
name in the user's presets folder (runs/presets/), through the same path check as the Train form."""

from __future__ import annotations

import re

import yaml

from lora_gui import presets
from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine.core.checkpoint import write_atomic
from lora_gui.errors import clip
from lora_gui.ui import common, paths

PRESET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def read_preset(name: str) -> str:
    """The preset's YAML text (a bundled or user preset by name), or a starting point for a new
    preset."""
    try:
        return common.preset_file(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, *common.USER_ERRORS):
        return "# What this preset is for.\nmax_steps: 100\n"


def save_preset(name: str, text: str) -> str:
    """Validates the YAML (known keys, ranges) and writes presets/NAME.yaml; never a bad file."""
    stem = str(name or "").strip()
    if not PRESET_NAME.fullmatch(stem) or ".." in stem:
        return f"Error: name {clip(stem)}: use letters, digits, '.', '_' or '-' (at most 64)"
    if any(p.stem == stem for p in presets.list_presets()):
        return (f"Error: {stem} is a bundled preset and stays as shipped; save your changes under "
                "a new name")
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        return f"Error: {stem}.yaml is not valid YAML: {err}"
    if not isinstance(data, dict) or not data:
        return f"Error: {stem}.yaml must be a mapping of setting: value with at least one setting"
    if not text.lstrip().startswith("#"):
        return f"Error: {stem}.yaml must start with a comment that says what the preset is for"
    try:
        paths.check_config(apply_overrides(RunConfig(), data, where=f"{stem}.yaml"))
    except ConfigError as err:
        return f"Error: {err}"
    except common.USER_ERRORS as err:
        return f"Error: {stem}.yaml: {err}"
    folder = common.user_presets_dir()
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / f"{stem}.yaml", text if text.endswith("\n") else text + "\n")
    return f"Saved {stem} (your presets: {folder / (stem + '.yaml')})"
