"""Presets tab handlers: read a preset's YAML, validate and save one (never a bad file)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from lora_gui import presets
from lora_gui.config import ConfigError, RunConfig, apply_overrides
from lora_gui.engine.core.checkpoint import write_atomic

PRESET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def read_preset(name: str) -> str:
    """The preset's YAML text, or a starting point for a new preset."""
    path = presets.PRESET_DIR / f"{Path(str(name)).stem}.yaml"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    return "# What this preset is for.\nmax_steps: 100\n"


def save_preset(name: str, text: str) -> str:
    """Validates the YAML (known keys, ranges) and writes presets/NAME.yaml; never a bad file."""
    stem = str(name or "").strip()
    if not PRESET_NAME.fullmatch(stem) or ".." in stem:
        return f"Error: name {stem!r}: use letters, digits, '.', '_' or '-'"
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        return f"Error: {stem}.yaml is not valid YAML: {err}"
    if not isinstance(data, dict) or not data:
        return f"Error: {stem}.yaml must be a mapping of setting: value with at least one setting"
    if not text.lstrip().startswith("#"):
        return f"Error: {stem}.yaml must start with a comment that says what the preset is for"
    try:
        apply_overrides(RunConfig(), data, where=f"{stem}.yaml")
    except ConfigError as err:
        return f"Error: {err}"
    write_atomic(presets.PRESET_DIR / f"{stem}.yaml", text if text.endswith("\n") else text + "\n")
    return f"Saved presets/{stem}.yaml"
